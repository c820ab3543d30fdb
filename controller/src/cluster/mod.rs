//! The Cluster reconciler: pools of Servers plus the TaskServs to install on them.
//!
//! Pipeline per visit (after the shared opening of [`crate::reconcile`]: cache gate, stale
//! check, paused check, first finalizer and status) → finalizer (Apply / Cleanup) →
//! [`dereference`] (children by label, other Clusters) → [`validate`] (pure: services,
//! versions, configs, dependency closure) → [`plan`] (pure: desired children, step plan,
//! parallelLimit window, scale down, rollback, teardown) → [`approval`] (pure: where the
//! Cluster's plan stands under Manual approval; the deletes it lists wait for it) → [`act`]
//! (children by server-side apply, deletes) → approval carried out (covered members approved,
//! or the conditions held) → one status patch, skipped when unchanged → events → requeue.
//!
//! A Cluster does no long work itself: Servers and TaskServs do, and their status changes
//! come back here through `owns` watches.

pub mod act;
pub mod approval;
pub mod dereference;
pub mod endpoint;
pub mod kubeconfig;
pub mod pins;
pub mod plan;
pub mod stages;
pub mod validate;

use std::sync::Arc;

use futures::StreamExt;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerSettings, Controller};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use provisioning_crds::{Cluster, ClusterStatus, Server, TaskServ, condition};
use provisioning_taskservs::Catalog;

use crate::conditions::{self, DesiredCondition, Status};
use crate::context::Context;
use crate::decode;
use crate::error::{AtStep, Error, Step};
use crate::reconcile::{Note, Reconciled, error_policy, reconcile, report};
use crate::sync::{cache, tracked_reflector};
use crate::time::now_seconds;
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
    let (reader, stream) = tracked_reflector::<Cluster>(&ctx.stores.synced, cache::CLUSTERS, &client, ctx.scope().config());
    let controller = Controller::for_stream(stream, reader);
    let clusters = controller.store();
    let scope = ctx.scope();
    let cctx = Arc::new(ClusterContext { ctx, catalog, clusters });
    controller
        .owns_stream(decode::touched::<PartialObjectMeta<Server>>(&client, scope.config()))
        .owns_stream(decode::touched::<PartialObjectMeta<TaskServ>>(&client, scope.config()))
        .with_config(settings)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<Cluster>, error_policy::<Cluster>, cctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

impl Reconciled for Cluster {
    const KIND: &'static str = KIND;
    // Teardown goes on while paused: it only deletes the Cluster's own children.
    const PAUSE_HOLDS_DELETION: bool = false;
    type Status = ClusterStatus;
    type Ctx = ClusterContext;

    fn core(cctx: &ClusterContext) -> &Context {
        &cctx.ctx
    }

    fn api(&self, ctx: &Context) -> Api<Cluster> {
        Api::namespaced(ctx.client.clone(), self.metadata.namespace.as_deref().unwrap_or_default())
    }

    fn status(&self) -> Option<&ClusterStatus> {
        self.status.as_ref()
    }

    async fn write_first_status(&self, cctx: &ClusterContext) -> Result<(), Error> {
        let desired = [
            DesiredCondition::new(condition::READY, Status::Unknown, "Initializing", "reconciliation started"),
            DesiredCondition::new(condition::RECONCILING, Status::True, "Initializing", "reconciliation started"),
            DesiredCondition::new(condition::STALLED, Status::False, "NotStalled", ""),
            DesiredCondition::new(condition::SERVERS_READY, Status::Unknown, "Initializing", ""),
            DesiredCondition::new(condition::TASKSERVS_READY, Status::Unknown, "Initializing", ""),
        ];
        let status = ClusterStatus {
            phase: Some("Pending".into()),
            observed_generation: self.metadata.generation,
            conditions: conditions::merge(&[], &desired, self.metadata.generation, now_seconds()),
            ..self.status.clone().unwrap_or_default()
        };
        cctx.ctx.apply_status(self, self.status.as_ref(), &status).await.map(drop)
    }

    async fn apply(self: Arc<Self>, cctx: &ClusterContext) -> Result<Action, Error> {
        let namespace = self.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
        apply(self, &namespace, cctx, false).await
    }

    async fn cleanup(self: Arc<Self>, cctx: &ClusterContext) -> Result<Action, Error> {
        let namespace = self.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
        apply(self, &namespace, cctx, true).await
    }
}

/// The status with the cost of the Cluster's Servers (from the Server cache: their
/// `status.cost`).
fn with_cost(mut status: ClusterStatus, children: &[plan::ChildServer], namespace: &str, ctx: &Context) -> ClusterStatus {
    let servers = ctx.stores.servers.state();
    let mine = servers
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
        .filter(|s| children.iter().any(|c| Some(&c.name) == s.metadata.name.as_ref()));
    let billed =
        |s: &&std::sync::Arc<Server>| s.status.as_ref().is_some_and(|st| st.provider_id.as_deref().is_some_and(|id| !id.is_empty()));
    let machines =
        mine.filter(billed).map(|s| (s.metadata.name.clone().unwrap_or_default(), s.status.as_ref().and_then(|st| st.cost.as_ref())));
    // The control-plane endpoint at the provider (a load balancer, a floating IP) is billed too.
    let endpoint =
        status.control_plane_endpoint.as_ref().filter(|e| !e.id.is_empty()).map(|e| ("controlPlaneEndpoint".to_string(), e.cost.as_ref()));
    status.cost = Some(crate::cost::total_of(machines.chain(endpoint)));
    status
}

/// Adds the conditions of a Kubernetes install ([`stages`]) and of its exported kubeconfig
/// ([`kubeconfig::export`]) to `status`; nothing for a Cluster without the kubernetes service.
async fn kubernetes_conditions(
    cluster: &Cluster,
    namespace: &str,
    children: &dereference::Children,
    status: &mut ClusterStatus,
    cctx: &ClusterContext,
) {
    let mut desired = stages::conditions(&children.servers, &children.taskservs, &cctx.catalog);
    match kubeconfig::export(cluster, namespace, &children.servers, &children.taskservs, &cctx.ctx).await {
        Ok(c) => desired.extend(c),
        Err(e) => desired.push(DesiredCondition::new(
            provisioning_crds::kubernetes_condition::KUBECONFIG_READY,
            Status::False,
            "ExportFailed",
            format!("exporting the kubeconfig to Secret {}: {e}", kubeconfig::secret_name(&cluster.name_any())),
        )),
    }
    if desired.is_empty() {
        return;
    }
    let previous = cluster.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    status.conditions.retain(|c| !desired.iter().any(|d| d.type_ == c.type_));
    status.conditions.extend(conditions::merge(previous, &desired, cluster.metadata.generation, now_seconds()));
}

async fn apply(cluster: Arc<Cluster>, namespace: &str, cctx: &ClusterContext, deleting: bool) -> Result<Action, Error> {
    let ctx = &cctx.ctx;
    // An approval that does not count (crate::approval::authorize) is not seen by the gate.
    let ws = ctx.workspace_for(namespace).spec;
    let approval = approval::approval_of(cluster.spec.approval, ws.approval);
    // Under four eyes, the writers of the services' configFrom sources may not approve either.
    let sources: Vec<(&str, &str)> =
        cluster.spec.taskservs.iter().flat_map(|t| t.config_from.iter()).map(|c| (c.kind.as_str(), c.name.as_str())).collect();
    let (cluster, refused) =
        crate::approval::authorize::screen(cluster.clone(), "clusters", approval, ws.require_distinct_approver, &sources, ctx)
            .await
            .at(Step::Dereference)?;
    let name = cluster.name_any();
    let uid = cluster.uid().unwrap_or_default();
    let children = dereference::children(&cluster, namespace, ctx).await.at(Step::Dereference)?;
    let others = dereference::other_clusters(&cctx.clusters, namespace, &name);
    let graph = dereference::depends_on_graph(&cctx.clusters, &cluster);
    let services = validate::validate(&name, &cluster.spec, &cctx.catalog).and_then(|s| plan::check_depends_on(&name, &graph).map(|()| s));
    let status = cluster.status.clone().unwrap_or_default();
    // The control-plane endpoint before the plan: the kubernetes service waits for its address.
    let mut endpoint_outcome =
        if deleting { None } else { Some(ensure_endpoint(&cluster, namespace, &children.servers, approval, ctx).await) };
    let endpoint_gate = match &endpoint_outcome {
        Some(e) => plan::EndpointGate::of(&cluster.spec, e.status.as_ref()),
        None => plan::EndpointGate::Unmanaged,
    };
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
        endpoint: endpoint_gate,
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
    let mut plan = plan;
    // The Cluster's plan (over the children as observed, before acting) and its approval.
    let mut gated = match (deleting, &services) {
        (false, Ok(services)) => {
            let cluster_plan = cluster_plan(&cluster, namespace, &observed, services, ctx).await;
            let decision = approval::decision(&cluster, namespace, &observed, &cluster_plan, ctx);
            approval::hold_deletes(&decision, namespace, &cluster_plan, &mut plan);
            Some((cluster_plan, decision))
        }
        _ => None,
    };
    let mut refused: Vec<Note> = refused.into_iter().collect();
    if let Some((_, decision)) = &mut gated {
        refused.extend(approval::screen_pass_down(&cluster, decision, ws.require_distinct_approver, ctx).await.at(Step::Dereference)?);
    }
    if gated.as_ref().is_some_and(|(_, d)| d.gate.goes()) && endpoint_outcome.as_ref().is_some_and(|e| e.awaiting_approval) {
        endpoint_outcome = Some(endpoint::ensure(&cluster, namespace, &children.servers, endpoint::Changes::Allowed, ctx).await);
    }
    act::act(&plan, namespace, ctx).await.at(Step::Act)?;
    let mut status = plan.status.clone();
    if let Some(e) = &endpoint_outcome {
        endpoint_status(&cluster, e, &mut status);
    }
    let mut status = with_cost(status, &children.servers, namespace, ctx);
    let mut events = plan.events.clone();
    if !deleting {
        kubernetes_conditions(&cluster, namespace, &children, &mut status, cctx).await;
    }
    let mut stale = Vec::new();
    if let Some((cluster_plan, decision)) = &gated {
        stale = approval::record(&cluster, cluster_plan, decision, &mut status, &mut events, observed.now);
        status.plan = Some(cluster_plan.clone());
    }
    let notes = refused.into_iter().chain(stale).chain(events.into_iter().map(|e| Note::planned(e, "Rollout")));
    report(cluster.as_ref(), cluster.status.as_ref(), Some(&status), notes.collect(), ctx).await?;
    // Checkpoint: only once the approval in force is recorded (see approval::record).
    if let Some((_, decision)) = &gated {
        approval::pass_down(&cluster, decision, ctx).await.at(Step::Act)?;
    }
    if deleting {
        if plan.teardown_done {
            // The machines are gone; the endpoint goes last (nothing is left at the provider).
            if !endpoint::delete(&cluster, namespace, ctx).await.at(Step::Cleanup)? {
                return Err(Error::InProgress("tearing down: deleting the control-plane endpoint".into()).at(Step::Cleanup));
            }
            return Ok(Action::await_change());
        }
        let (taskservs, servers) = (children.taskservs.len(), children.servers.len());
        let left = format!("{} and {}", crate::text::count(taskservs, "TaskServ"), crate::text::count(servers, "Server"));
        return Err(Error::InProgress(format!("tearing down: {left} left")).at(Step::Cleanup));
    }
    Ok(next_visit(plan.requeue, endpoint_outcome.as_ref().is_some_and(|e| e.retry)))
}

/// When to look again: as the plan says, and soon when the endpoint asks to (`retry`).
fn next_visit(requeue: Option<std::time::Duration>, retry: bool) -> Action {
    let requeue = match (requeue, retry) {
        (Some(d), true) => Some(d.min(ENDPOINT_RETRY)),
        (None, true) => Some(ENDPOINT_RETRY),
        (d, false) => d,
    };
    match requeue {
        Some(d) => Action::requeue(crate::time::jittered(d)),
        None => Action::await_change(),
    }
}

/// The endpoint's pass before the plan. Under Manual approval nothing is created or deleted
/// at the provider before the plan (which lists the endpoint's Create or Delete with its
/// price) is approved: [`apply`] ensures again once the decision lets the plan go.
async fn ensure_endpoint(
    cluster: &Cluster,
    namespace: &str,
    servers: &[plan::ChildServer],
    approval: provisioning_crds::Approval,
    ctx: &Context,
) -> endpoint::Outcome {
    let changes =
        if approval == provisioning_crds::Approval::Manual { endpoint::Changes::AwaitApproval } else { endpoint::Changes::Allowed };
    endpoint::ensure(cluster, namespace, servers, changes, ctx).await
}

/// The Cluster's plan (its members' changes, then its endpoint's with the endpoint's price).
async fn cluster_plan(
    cluster: &Cluster,
    namespace: &str,
    observed: &Observed<'_>,
    services: &[validate::ServicePlan],
    ctx: &Context,
) -> provisioning_crds::Plan {
    let price = endpoint_price(cluster, namespace, ctx).await;
    plan::with_endpoint(plan::cluster_plan(observed, namespace, services), observed, namespace, price.as_ref())
}

/// The list price of the control-plane endpoint the spec wants at the provider (a load
/// balancer or floating IP; no API call), for the Cluster's plan; None for other types and
/// once it is made.
async fn endpoint_price(
    cluster: &Cluster,
    namespace: &str,
    ctx: &Context,
) -> Option<Result<provisioning_providers::prices::Price, provisioning_providers::prices::NoPrice>> {
    let want = cluster.spec.control_plane_endpoint.as_ref()?;
    let kind = endpoint::kind_of(want.endpoint_type)?;
    // Made already: the plan has no Create to price.
    let recorded = cluster.status.as_ref().and_then(|s| s.control_plane_endpoint.as_ref());
    if recorded.is_some_and(|r| !r.id.is_empty() && r.endpoint_type == want.endpoint_type.as_str()) {
        return None;
    }
    let ws = ctx.workspace_for(namespace);
    let priced = match ws.account(&cluster.spec.provider) {
        Ok(account) => match ctx.provider_for(&ws, &account.clone()).await {
            Ok(provider) => {
                let zone = cluster.spec.pools.iter().find(|p| p.name == "control-plane").map(|p| p.zone.clone()).unwrap_or_default();
                provider.endpoint_price(kind, &zone)
            }
            Err(e) => Err(format!("the provider account is not ready: {e}")),
        },
        Err(message) => Err(message),
    };
    Some(priced)
}

/// How soon a pass whose endpoint call failed (or whose address is being assigned) looks again.
const ENDPOINT_RETRY: std::time::Duration = std::time::Duration::from_secs(15);

/// Puts the endpoint into `status`: `controlPlaneEndpoint` and the `EndpointReady` condition
/// (dropped for type None). The Cluster is not Ready while its endpoint is not.
fn endpoint_status(cluster: &Cluster, outcome: &endpoint::Outcome, status: &mut ClusterStatus) {
    status.control_plane_endpoint = outcome.status.clone();
    status.conditions.retain(|c| c.type_ != provisioning_crds::ENDPOINT_READY);
    let Some(desired) = &outcome.condition else { return };
    let previous = cluster.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let mut desired = vec![desired.clone()];
    let ready = status.conditions.iter().find(|c| c.type_ == condition::READY);
    if desired[0].status != Status::True && ready.is_some_and(|r| r.status == "True") {
        desired.push(DesiredCondition::new(
            condition::READY,
            Status::False,
            "EndpointNotReady",
            format!("control-plane endpoint: {}", desired[0].message),
        ));
        status.conditions.retain(|c| c.type_ != condition::READY);
    }
    status.conditions.extend(conditions::merge(previous, &desired, cluster.metadata.generation, now_seconds()));
}
