//! Composition: metrics endpoint, leader election, the shared caches and [`Context`], and
//! the four kinds' controllers joined.
//!
//! Each kind wires its own controller (its watches and mappers) in its module
//! (`server::run`, `workspace::run`, `taskserv::run`, `cluster::run`) and reconciles through
//! [`crate::reconcile`]; the tracked caches are built by [`crate::sync`]. This module only
//! composes them; no kind module imports it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use kube::Client;
use kube::runtime::controller::Config as ControllerSettings;
use provisioning_crds::{Cluster, Server, TaskServ};

use crate::config::ControllerConfig;
use crate::context::{Context, Stores};
use crate::leader::{LeaderElector, LeaseSettings};
use crate::metrics::{Health, Metrics};
use crate::reconcile::Trigger;
use crate::shard::assign::Membership;
use crate::shard::{Scope, Shard};
use crate::sync::{CacheSync, cache, metadata_store_in};
use crate::{cluster, server, taskserv, workspace};

/// A unique identity for this replica (Lease holder, event reporting instance).
pub fn replica_identity() -> String {
    let host = std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_else(|_| "provisioning".into());
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// Runs the controller until `shutdown` resolves (Ok) or leadership is lost (Err).
// Over 80 lines on purpose: the start-up sequence (metrics, identity, caches, context, leader
// election, the four controllers) in the order it happens; each part is a call.
pub async fn run(client: Client, config: ControllerConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    run_with_metrics(client, config, Arc::new(Metrics::default()), shutdown).await
}

/// [`run`] recording into `metrics` (`provisioning test` reads its script-run counters).
// Over 80 lines on purpose: see `run`.
pub async fn run_with_metrics(
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let health = Health::default();
    if let Some(addr) = config.metrics_addr {
        let bound = crate::metrics::spawn_server(addr, metrics.clone(), health.clone()).await?;
        tracing::info!(%bound, "serving /metrics, /healthz, /readyz");
    }
    let identity = replica_identity();
    let shutdown = shutdown.shared();
    // Sharded (crate::shard): no single leader; this replica acts on the objects labelled
    // with its identity, which its watches select.
    let shard = config.sharding.then(|| Shard::new(&crate::shard::label_value(&identity)));
    let scope = shard.as_ref().map_or_else(Scope::all, |s| Scope::of(&s.identity));
    let elector = if config.leader_election && shard.is_none() {
        let elector = LeaderElector::new(
            client.clone(),
            LeaseSettings {
                namespace: config.lease_namespace.clone(),
                name: config.lease_name.clone(),
                identity: identity.clone(),
                duration: config.lease_duration(),
                renew: config.lease_renew(),
            },
        );
        // A standby replica is ready while its Lease checks succeed: healthy and waiting
        // (otherwise a two-replica Deployment never finishes rolling out). The leader is
        // ready again once its watch caches have synced.
        tokio::select! {
            _ = elector.acquire(&health) => {}
            _ = shutdown.clone() => return Ok(()),
        }
        health.set_ready(false);
        metrics.leader.set(1);
        Some(elector)
    } else {
        None
    };

    let settings = ControllerSettings::default().concurrency(config.concurrency);
    // A broken catalog (built-in or a user's) is a start-up error naming the file.
    let catalog = Arc::new(config.load_catalog()?);
    // No reconcile acts before all of these caches hold their initial list (crate::sync).
    let synced = CacheSync::new(cache::ALL);
    let server_controller = server::controller(&client, &synced, &scope);
    let workspace_controller = workspace::controller(&client, &synced);
    let stores = Stores {
        workspaces: workspace_controller.store(),
        servers: server_controller.store(),
        taskservs: metadata_store_in::<TaskServ>(client.clone(), &synced, cache::TASKSERV_META, scope.config(), shutdown.clone()),
        clusters: metadata_store_in::<Cluster>(client.clone(), &synced, cache::CLUSTER_META, scope.config(), shutdown.clone()),
        synced,
    };
    // Host paths handed to providers: resolved (and a missing one reported) once, here.
    let mut host = crate::host::HostPaths::resolve();
    if !config.catalogs.is_empty() {
        // Scripts see one catalog tree: the merged one, materialized under the state dir.
        host.catalog = Some(crate::host::materialize_catalog(&catalog, &config.state_dir)?);
    }
    host.log_problems();
    crate::approval::set_writers_recorded(match config.api_server_records_writers {
        Some(set) => set,
        None => api_server_records_writers(&client).await,
    });
    let mut ctx = Context::new(client.clone(), config.clone(), metrics.clone(), stores.clone(), identity, host);
    ctx.shard = shard.clone();
    let ctx = Arc::new(ctx);
    tokio::spawn(report_cache_sync(stores, health.clone()));

    // Other kinds' reconcilers ask the Server reconciler to look now through this (no API write).
    let (server_trigger, server_triggers) = Trigger::<Server>::new();
    let controllers = futures::future::join4(
        server::run(server_controller, ctx.clone(), server_triggers, settings.clone(), shutdown.clone()),
        workspace::run(workspace_controller, ctx.clone(), server_trigger.clone(), settings.clone(), shutdown.clone()),
        taskserv::run(ctx.clone(), catalog.clone(), server_trigger, settings.clone(), shutdown.clone()),
        cluster::run(ctx.clone(), catalog, settings, shutdown.clone()),
    );
    match (elector, shard) {
        (_, Some(shard)) => run_sharded(ctx, shard, controllers).await,
        (Some(elector), None) => {
            tokio::select! {
                _ = controllers => {
                    elector.release().await;
                    metrics.leader.set(0);
                    Ok(())
                }
                lost = elector.hold() => {
                    metrics.leader.set(0);
                    Err(lost.into())
                }
            }
        }
        (None, None) => {
            controllers.await;
            Ok(())
        }
    }
}

/// Runs the controllers beside this replica's shard membership and assignment
/// ([`crate::shard::assign::run`]) until shutdown (its member Lease is then deleted, so the others
/// take its Workspaces over at once) or until the Lease cannot be renewed (an error: the
/// process stops acting before the others treat it as dead).
async fn run_sharded(ctx: Arc<Context>, shard: Arc<Shard>, controllers: impl Future<Output = ((), (), (), ())>) -> anyhow::Result<()> {
    let membership = Membership {
        namespace: ctx.config.lease_namespace.clone(),
        duration: ctx.config.lease_duration(),
        renew: ctx.config.lease_renew(),
    };
    tracing::info!(identity = %shard.identity, lease_namespace = %membership.namespace, "sharding: acting on the Workspaces assigned to this replica");
    let identity = shard.identity.clone();
    tokio::select! {
        _ = controllers => {
            crate::shard::assign::leave(ctx.client.clone(), &membership, &identity).await;
            Ok(())
        }
        lost = crate::shard::assign::run(ctx.clone(), shard, membership.clone()) => Err(lost.into()),
    }
}

/// Marks the replica ready once every watch cache holds its initial list (before that
/// nothing is reconciled). A cache that never syncs is almost always a missing CRD or RBAC
/// rule: says which, every 30 s, instead of idling silently.
async fn report_cache_sync(stores: Stores, health: Health) {
    let started = std::time::Instant::now();
    while stores.synced.wait_at_most(Duration::from_secs(30)).await.is_err() {
        tracing::warn!(
            pending = %stores.synced.pending().join(", "),
            waited_s = started.elapsed().as_secs(),
            "watch caches not synced yet, nothing is reconciled until they are; are the CRDs installed \
             (`provisioning crds | kubectl apply -f -`) and may this controller list and watch them?"
        );
    }
    tracing::info!(took_ms = started.elapsed().as_millis() as u64, "watch caches synced");
    health.set_ready(true);
}

/// Whether the API server records who approves and who changes objects (the embedded control
/// plane, by its `/version`); logged once when it does not.
async fn api_server_records_writers(client: &Client) -> bool {
    match client.apiserver_version().await {
        Ok(v) if crate::approval::version_records_writers(&v.git_version) => true,
        Ok(v) => {
            tracing::info!(
                version = %v.git_version,
                "this API server does not record who approves or changes objects: Manual approvals are refused (ApprovalRefused) unless an admission webhook stamps provisioning.dev/approved-by and the controller's config says api_server_records_writers = true"
            );
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the API server's version: approvals it may not have recorded are not trusted");
            false
        }
    }
}
