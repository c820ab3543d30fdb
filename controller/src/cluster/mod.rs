//! The Cluster reconciler: pools of Servers plus the TaskServs to install on them.
//!
//! Pipeline per visit: paused check → first-visit status → finalizer (Apply / Cleanup) →
//! [`dereference`] (children by label, other Clusters) → [`validate`] (pure: services,
//! versions, configs, dependency closure) → [`plan`] (pure: desired children, step plan,
//! parallelLimit window, scale down, rollback, teardown) → [`act`] (children by server-side
//! apply, deletes) → one status patch, skipped when unchanged → events → requeue.
//!
//! A Cluster does no long work itself: Servers and TaskServs do, and their status changes
//! come back here through `owns` watches.

pub mod act;
pub mod dereference;
pub mod plan;
pub mod validate;

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::{Action, Config as ControllerSettings, Controller};
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use provisioning_crds::{Cluster, ClusterStatus, FINALIZER, Server, TaskServ, condition};
use provisioning_taskservs::Catalog;

use crate::conditions::{self, DesiredCondition, Status};
use crate::context::{Context, is_paused};
use crate::error::Error;
use crate::taskserv::now_seconds;
use plan::Observed;

/// Kind name used in metrics and logs.
pub const KIND: &str = "Cluster";

/// What the Cluster reconciler shares between reconciles.
pub struct ClusterContext {
    /// The controller core's context.
    pub ctx: Arc<Context>,
    /// The taskserv catalog.
    pub catalog: Arc<Catalog>,
    /// All Clusters (the controller's own cache, for `dependsOn`).
    pub clusters: Store<Cluster>,
}

/// Runs the Cluster controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    catalog: Arc<Catalog>,
    settings: ControllerSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (reader, stream) = crate::run::tracked_reflector(&ctx.stores.synced, crate::run::cache::CLUSTERS, Api::<Cluster>::all(client.clone()), watcher::Config::default());
    let controller = Controller::for_stream(stream, reader);
    let clusters = controller.store();
    let cctx = Arc::new(ClusterContext { ctx, catalog, clusters });
    controller
        .owns(Api::<Server>::all(client.clone()), watcher::Config::default())
        .owns(Api::<TaskServ>::all(client), watcher::Config::default())
        .with_config(settings)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, cctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Reconciles one Cluster.
pub async fn reconcile(cluster: Arc<Cluster>, cctx: Arc<ClusterContext>) -> Result<Action, Error> {
    let ctx = &cctx.ctx;
    let _timer = ctx.metrics.reconcile_timer(KIND);
    let namespace = cluster.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let now = now_seconds();
    // Nothing acts on a cache that has not synced (a restarted controller would
    // otherwise resolve a Server to the default workspace: see crate::sync).
    ctx.caches_synced().await?;
    if ctx.is_stale(cluster.as_ref()) {
        // An older copy than our own last write: its status would redo recorded work (and
        // re-run recorded script runs); the watch event of the newer version follows.
        return Ok(Action::await_change());
    }
    if is_paused(cluster.as_ref()) && cluster.metadata.deletion_timestamp.is_none() {
        let mut status = cluster.status.clone().unwrap_or_default();
        status.conditions = conditions::paused(&status.conditions, cluster.metadata.generation, now);
        ctx.apply_status(cluster.as_ref(), cluster.status.as_ref(), &status).await?;
        ctx.reset_backoff(KIND, cluster.as_ref());
        return Ok(Action::await_change());
    }
    if cluster.metadata.deletion_timestamp.is_none() && cluster.status.as_ref().is_none_or(|s| s.conditions.is_empty()) {
        let desired = [
            DesiredCondition::new(condition::READY, Status::Unknown, "Initializing", "reconciliation started"),
            DesiredCondition::new(condition::RECONCILING, Status::True, "Initializing", "reconciliation started"),
            DesiredCondition::new(condition::STALLED, Status::False, "NotStalled", ""),
            DesiredCondition::new(condition::SERVERS_READY, Status::Unknown, "Initializing", ""),
            DesiredCondition::new(condition::TASKSERVS_READY, Status::Unknown, "Initializing", ""),
        ];
        let status = ClusterStatus {
            phase: Some("Pending".into()),
            observed_generation: cluster.metadata.generation,
            conditions: conditions::merge(&[], &desired, cluster.metadata.generation, now),
            ..cluster.status.clone().unwrap_or_default()
        };
        ctx.apply_status(cluster.as_ref(), cluster.status.as_ref(), &status).await?;
    }
    let api: Api<Cluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let action = finalizer(&api, FINALIZER, cluster.clone(), |event| async {
        match event {
            Finalizer::Apply(c) => apply(c, &namespace, &cctx, false).await,
            Finalizer::Cleanup(c) => apply(c, &namespace, &cctx, true).await,
        }
    })
    .await?;
    ctx.reset_backoff(KIND, cluster.as_ref());
    Ok(action)
}

/// The status with the cost of the Cluster's Servers (from the Server cache: their
/// `status.cost`).
fn with_cost(mut status: ClusterStatus, children: &[plan::ChildServer], namespace: &str, ctx: &Context) -> ClusterStatus {
    let servers = ctx.stores.servers.state();
    let mine = servers
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
        .filter(|s| children.iter().any(|c| Some(&c.name) == s.metadata.name.as_ref()));
    status.cost = Some(crate::cost::total(mine.map(|s| s.as_ref())));
    status
}

/// `error_policy` of the Cluster controller.
pub fn error_policy(cluster: Arc<Cluster>, error: &Error, cctx: Arc<ClusterContext>) -> Action {
    cctx.ctx.backoff(KIND, cluster.as_ref(), error)
}

async fn apply(cluster: Arc<Cluster>, namespace: &str, cctx: &ClusterContext, deleting: bool) -> Result<Action, Error> {
    let ctx = &cctx.ctx;
    let name = cluster.name_any();
    let uid = cluster.uid().unwrap_or_default();
    let children = dereference::children(&cluster, namespace, ctx).await?;
    let others = dereference::other_clusters(&cctx.clusters, namespace, &name);
    let services = validate::validate(&name, &cluster.spec, &cctx.catalog);
    let status = cluster.status.clone().unwrap_or_default();
    let observed = Observed {
        name: &name,
        uid: &uid,
        generation: cluster.metadata.generation,
        spec: &cluster.spec,
        status: &status,
        services: &services,
        servers: &children.servers,
        taskservs: &children.taskservs,
        clusters: &others,
        now: now_seconds(),
    };
    let plan = if deleting {
        let order: Vec<String> = match &services {
            Ok(s) => s.iter().map(|p| p.service.clone()).collect(),
            Err(_) => status.taskservs.iter().map(|t| t.service.clone()).collect(),
        };
        plan::plan_teardown(&observed, &order)
    } else {
        plan::plan(&observed)
    };
    act::act(&plan, namespace, ctx).await?;
    let status = with_cost(plan.status.clone(), &children.servers, namespace, ctx);
    ctx.apply_status(cluster.as_ref(), cluster.status.as_ref(), &status).await?;
    for e in &plan.events {
        let type_ = if e.warning { EventType::Warning } else { EventType::Normal };
        ctx.publish(cluster.as_ref(), type_, &e.reason, "Rollout", Some(e.note.clone())).await;
    }
    if deleting {
        if plan.teardown_done {
            return Ok(Action::await_change());
        }
        return Err(Error::InProgress(format!(
            "tearing down: {} TaskServs and {} Servers left",
            children.taskservs.len(),
            children.servers.len()
        )));
    }
    Ok(match plan.requeue {
        Some(d) => Action::requeue(crate::error::jittered(d)),
        None => Action::await_change(),
    })
}
