//! Wiring: watches, caches, controllers, metrics endpoint and leader election.
//!
//! To add the TaskServ/Cluster reconcilers: build their `Controller`s next to the Server
//! one in [`run`] (same `Context`, same `ctx.backoff` in their `error_policy`), and join
//! their futures into `controllers`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::runtime::controller::Config as ControllerSettings;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{Cluster, Server, TaskServ, Workspace};

use crate::config::ControllerConfig;
use crate::context::{Context, Stores};
use crate::sync::CacheSync;
use crate::leader::{LeaderElector, LeaseSettings};
use crate::metrics::{Health, Metrics};
use crate::{server, workspace, workspaces};

/// A unique identity for this replica (Lease holder, event reporting instance).
pub fn replica_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "provisioning".into());
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// Runs the controller until `shutdown` resolves (Ok) or leadership is lost (Err).
pub async fn run(client: Client, config: ControllerConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let health = Health::default();
    if let Some(addr) = config.metrics_addr {
        let bound = crate::metrics::spawn_server(addr, metrics.clone(), health.clone()).await?;
        tracing::info!(%bound, "serving /metrics, /healthz, /readyz");
    }
    let identity = replica_identity();
    let shutdown = shutdown.shared();
    let elector = if config.leader_election {
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
    // A broken catalog is a start-up error naming the file.
    let catalog = Arc::new(provisioning_taskservs::Catalog::load(&provisioning_taskservs::Catalog::default_dir())?);
    let settings_for_kinds = settings.clone();
    // No reconcile acts before all of these caches hold their initial list (crate::sync).
    let synced = CacheSync::new(&[cache::WORKSPACES, cache::SERVERS, cache::TASKSERVS, cache::CLUSTERS, cache::TASKSERV_META, cache::CLUSTER_META]);
    // The Server cache drops managedFields: at 10,000 Servers they are most of its memory.
    let (server_reader, server_writer) = reflector::store::<Server>();
    let server_stream = synced
        .track(
            cache::SERVERS,
            reflector::reflector(
                server_writer,
                watcher(Api::<Server>::all(client.clone()), watcher::Config::default().any_semantic())
                    .modify(|s| s.managed_fields_mut().clear()),
            ),
        )
        .applied_objects();
    let server_controller = Controller::for_stream(server_stream, server_reader);
    let (workspace_reader, workspace_stream) =
        tracked_reflector(&synced, cache::WORKSPACES, Api::<Workspace>::all(client.clone()), watcher::Config::default().any_semantic());
    let workspace_controller = Controller::for_stream(workspace_stream, workspace_reader);
    let taskservs = metadata_store::<TaskServ>(client.clone(), &synced, cache::TASKSERV_META);
    let clusters = metadata_store::<Cluster>(client.clone(), &synced, cache::CLUSTER_META);
    let stores = Stores {
        workspaces: workspace_controller.store(),
        servers: server_controller.store(),
        taskservs,
        clusters,
        synced,
    };
    let ctx = Arc::new(Context::new(client.clone(), config.clone(), metrics.clone(), stores.clone(), identity));

    {
        let stores = stores.clone();
        let health = health.clone();
        tokio::spawn(async move {
            // Ready once every watch cache holds its initial list (before that nothing is
            // reconciled). A cache that never syncs is almost always a missing CRD or RBAC
            // rule: say which, every 30 s, instead of idling silently.
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
        });
    }

    // Servers re-check when their Workspace's spec or readiness changes (not on count updates).
    let server_store = stores.servers.clone();
    // Workspace name → (generation, Ready) last seen.
    type Seen = Mutex<HashMap<String, (Option<i64>, bool)>>;
    let seen_workspaces: Arc<Seen> = Arc::default();
    // Workspace name → its cost total last seen: a change re-checks the Servers waiting for
    // budget (Servers deleted), and only those.
    let seen_costs: Arc<Mutex<HashMap<String, Option<String>>>> = Arc::default();
    // Secret changes re-trigger Servers directly (see the Workspace controller's Secret watch).
    let (server_trigger, server_triggers) = futures::channel::mpsc::unbounded::<ObjectRef<Server>>();
    let servers = server_controller
        .with_config(settings.clone())
        .reconcile_on(server_triggers)
        .watches(Api::<Workspace>::all(client.clone()), watcher::Config::default().any_semantic(), move |ws: Workspace| {
            let ready = ws.status.as_ref().is_some_and(|s| crate::conditions::is_true(&s.conditions, "Ready"));
            let fingerprint = (ws.metadata.generation, ready);
            let changed = {
                let mut seen = seen_workspaces.lock().unwrap_or_else(|p| p.into_inner());
                seen.insert(ws.name_any(), fingerprint) != Some(fingerprint)
            };
            let namespace = workspaces::claimed_namespace(&ws);
            let cost = ws.status.as_ref().and_then(|s| s.cost.as_ref()).map(|c| c.summary.clone());
            let cost_changed = {
                let mut seen = seen_costs.lock().unwrap_or_else(|p| p.into_inner());
                seen.insert(ws.name_any(), cost.clone()).is_some_and(|before| before != cost)
            };
            let refs: Vec<ObjectRef<Server>> = if changed || cost_changed {
                server_store
                    .state()
                    .iter()
                    .filter(|s| s.metadata.namespace.as_deref() == Some(namespace.as_str()))
                    .filter(|s| changed || server::budget::waiting_for_budget(s))
                    .map(|s| ObjectRef::from_obj(s.as_ref()))
                    .collect()
            } else {
                vec![]
            };
            refs
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(server::reconcile, server::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));

    // Workspaces recount when resources of their namespace change; debounced so that a burst
    // of Server updates costs one recount, not one per update.
    let ws_store = stores.workspaces.clone();
    let to_workspace = move |namespace: Option<String>| -> Vec<ObjectRef<Workspace>> {
        let Some(namespace) = namespace else { return vec![] };
        workspaces::owner_of(&namespace, ws_store.state().iter()).map(|ws| ObjectRef::from_obj(ws.as_ref())).into_iter().collect()
    };
    let (m1, m2, m3) = (to_workspace.clone(), to_workspace.clone(), to_workspace);
    // Secrets (metadata only: values are never read by the watch): a credentials Secret's
    // change marks the providers built from it stale and reconciles the Workspaces using it
    // at once, instead of after the error backoff; their Stalled Servers are re-triggered.
    let secret_to_workspaces = {
        let ws_store = stores.workspaces.clone();
        let server_store = stores.servers.clone();
        let ctx = ctx.clone();
        move |secret: PartialObjectMeta<Secret>| -> Vec<ObjectRef<Workspace>> {
            let Some(namespace) = secret.namespace() else { return vec![] };
            let name = secret.name_any();
            let all = ws_store.state();
            let (using, namespaces) =
                workspace::secrets::referrers(&all, &ctx.config.default_workspace.providers, &namespace, &name);
            let servers: Vec<ObjectRef<Server>> = server_store
                .state()
                .iter()
                .filter(|s| workspace::secrets::server_affected(s, &namespaces, &namespace, &name))
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect();
            if using.is_empty() && servers.is_empty() && namespaces.is_empty() {
                return vec![];
            }
            let version = if secret.metadata.deletion_timestamp.is_some() { None } else { secret.metadata.resource_version.as_deref() };
            if !ctx.providers.note_secret(&namespace, &name, version) {
                return vec![];
            }
            tracing::debug!(secret = %format!("{namespace}/{name}"), workspaces = using.len(), servers = servers.len(), "credentials Secret changed");
            for server in servers {
                let _ = server_trigger.unbounded_send(server);
            }
            using.into_iter().map(|ws| ObjectRef::from_obj(ws.as_ref())).collect()
        }
    };
    let mut workspace_controller = workspace_controller
        .with_config(settings.debounce(Duration::from_secs(1)))
        .watches(Api::<Server>::all(client.clone()), watcher::Config::default().any_semantic(), move |s: Server| m1(s.namespace()))
        .watches(Api::<TaskServ>::all(client.clone()), watcher::Config::default().any_semantic(), move |s: TaskServ| m2(s.namespace()))
        .watches(Api::<Cluster>::all(client.clone()), watcher::Config::default().any_semantic(), move |s: Cluster| m3(s.namespace()));
    // deploy/ grants Secrets per namespace only (deploy/rbac/secrets.yaml), so a cluster-wide
    // Secret watch would be refused forever: watch only where it is allowed everywhere.
    if may_watch_all_secrets(&client).await {
        workspace_controller = workspace_controller.watches(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            watcher::Config::default().any_semantic(),
            secret_to_workspaces,
        );
    } else {
        tracing::info!(
            "no cluster-wide list/watch on Secrets (least privilege): a changed credentials Secret is picked up at the \
             next retry or resync of the objects using it, not at once"
        );
    }
    let workspaces = workspace_controller
        .graceful_shutdown_on(shutdown.clone())
        .run(workspace::reconcile, workspace::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));

    let taskservs = crate::taskserv::run(ctx.clone(), catalog.clone(), settings_for_kinds.clone(), shutdown.clone());
    let clusters = crate::cluster::run(ctx.clone(), catalog, settings_for_kinds, shutdown.clone());
    let controllers = futures::future::join4(servers, workspaces, taskservs, clusters);
    match &elector {
        Some(elector) => {
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
        None => {
            controllers.await;
            Ok(())
        }
    }
}

/// Whether this identity may list and watch Secrets in every namespace (a
/// SelfSubjectAccessReview). An API server without the authorization API is taken to allow it
/// (it has no RBAC to refuse the watch either).
pub(crate) async fn may_watch_all_secrets(client: &Client) -> bool {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for verb in ["list", "watch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("secrets".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&kube::api::PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => return false,
            Err(e) => {
                tracing::debug!(error = %e, "no SelfSubjectAccessReview; assuming Secrets may be watched");
                return true;
            }
        }
    }
    true
}

/// Names of the watch caches (in "waiting for the watch caches to sync: …" messages).
pub mod cache {
    /// The Workspace controller's cache.
    pub const WORKSPACES: &str = "Workspace";
    /// The Server controller's cache.
    pub const SERVERS: &str = "Server";
    /// The TaskServ controller's cache.
    pub const TASKSERVS: &str = "TaskServ";
    /// The Cluster controller's cache.
    pub const CLUSTERS: &str = "Cluster";
    /// TaskServ metadata (Workspace counts).
    pub const TASKSERV_META: &str = "TaskServ metadata";
    /// Cluster metadata (Workspace counts).
    pub const CLUSTER_META: &str = "Cluster metadata";
}

/// A cache of `K` and the stream of its applied objects for `Controller::for_stream`, marked
/// synced in `synced` as `name` at its first initial list.
pub fn tracked_reflector<K>(
    synced: &CacheSync,
    name: &'static str,
    api: Api<K>,
    config: watcher::Config,
) -> (reflector::Store<K>, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = synced.track(name, reflector::reflector(writer, watcher(api, config))).applied_objects();
    (reader, stream)
}

/// A metadata-only cache of `K` (for counts), filled by a background watch.
fn metadata_store<K>(client: Client, synced: &CacheSync, name: &'static str) -> reflector::Store<kube::api::PartialObjectMeta<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = synced
        .track(name, reflector::reflector(writer, watcher(Api::<kube::api::PartialObjectMeta<K>>::all(client), watcher::Config::default().any_semantic())))
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
    tokio::spawn(stream);
    reader
}
