//! The reconcile skeleton every kind (Workspace, Server, TaskServ, Cluster) runs through.
//!
//! One visit of one object:
//! 1. a tracing span `reconcile{kind, object, generation}` around everything below (as
//!    kube-rs's controller-rs example does), and the reconcile timer of [`crate::metrics`];
//! 2. the cache gate: nothing acts before every watch cache holds its initial list
//!    ([`crate::sync`]);
//! 3. the stale check: a cached copy older than our own last write is not acted on; it is
//!    looked at again after [`STALE_REQUEUE`] (its watch event usually comes first);
//! 4. the paused check: a paused object gets its Paused status and nothing else;
//! 5. the first finalizer (a guarded merge patch, see [`Context::add_first_finalizer`]) and
//!    the first-visit status (conditions start Unknown, never absent; a kind whose visit
//!    writes its own, [`Reconciled::VISIT_WRITES_FIRST_STATUS`], skips it); after adding the
//!    finalizer the visit ends and the watch event of the patch brings the object back;
//!    (a kind that writes its finalizer itself before its first provider step,
//!    [`Reconciled::FINALIZER_BEFORE_FIRST_ACTION`], skips this and runs `apply` directly
//!    until its finalizer is there);
//! 6. `kube::runtime::finalizer` with the kind's `apply` / `cleanup`;
//! 7. the per-object backoff is reset after a successful visit.
//!
//! A failure carries the pipeline step it happened in ([`Step`], via [`Error::At`]), which
//! [`error_policy`] logs; the error's message (what conditions and events show) is unchanged.
//!
//! Kinds implement [`Reconciled`] and hand [`reconcile`] and [`error_policy`] to their
//! `Controller`. [`Trigger`] queues objects for reconcile from inside the process (no API
//! write), e.g. a TaskServ asking the Server reconciler to look at a machine now.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::Error as FinalizerError;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource};
use provisioning_crds::{ClusterStatus, FINALIZER, ServerStatus, TaskServStatus, WorkspaceStatus};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::context::{Context, is_paused};
use crate::error::{AtStep, Error, Step};
pub use crate::time::STALE_REQUEUE;

/// When an object its replica may not act on now (sharded: being handed over) is looked at again.
pub const SHARD_REQUEUE: std::time::Duration = std::time::Duration::from_secs(5);
pub use note::Note;

mod note;

/// The status of a kind reconciled through the skeleton: what the skeleton's default hooks
/// need of it (its conditions).
pub trait Conditioned: Serialize + PartialEq + Clone + Default + Send + Sync {
    /// The status conditions.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// The status conditions.
    fn conditions(&self) -> &[Condition];
}

macro_rules! conditioned {
    ($($status:ty),*) => {$(
        impl Conditioned for $status {
            fn conditions_mut(&mut self) -> &mut Vec<Condition> {
                &mut self.conditions
            }
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }
        }
    )*};
}
conditioned!(ServerStatus, TaskServStatus, ClusterStatus, WorkspaceStatus);

/// A kind reconciled through the skeleton: the hooks that differ between kinds, with
/// defaults for what most kinds share (the first-visit check, the paused status).
pub trait Reconciled: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Kind name used in metrics, logs and backoff keys.
    const KIND: &'static str;
    /// Whether a paused object that is being deleted stays paused (its cleanup waits for the
    /// resume: Server, whose cleanup deletes a machine, and Workspace) or is cleaned up anyway
    /// (TaskServ, Cluster).
    const PAUSE_HOLDS_DELETION: bool;
    /// Whether the kind's own visit writes its first status (Server: its create checkpoint
    /// or whatever the visit comes to, one write instead of two), so the skeleton does not
    /// write it beside the first finalizer.
    const VISIT_WRITES_FIRST_STATUS: bool = false;
    /// Whether the kind writes its finalizer itself, right before the first step that can
    /// leave something behind at a provider (Server: in one patch with the create-pending
    /// annotation before its first create call, or before it records an adoption). Until then
    /// its visits run without the finalizer, and deleting it has nothing to clean up.
    const FINALIZER_BEFORE_FIRST_ACTION: bool = false;
    /// What the kind's reconciles share (the controller's context).
    type Ctx: Send + Sync + 'static;
    /// The kind's status.
    type Status: Conditioned;

    /// The controller core inside the kind's context.
    fn core(ctx: &Self::Ctx) -> &Context;

    /// The namespace this object is sharded by ([`crate::shard`]): its own by default (a
    /// Workspace: the one it claims).
    fn shard_namespace(&self) -> String {
        self.meta().namespace.clone().unwrap_or_default()
    }

    /// The API of this object (namespaced or cluster-wide), for the finalizer.
    fn api(&self, ctx: &Context) -> Api<Self>;

    /// The object's status (`None` before its first write).
    fn status(&self) -> Option<&Self::Status>;

    /// Whether the object has no status conditions yet (its first visit).
    fn first_visit(&self) -> bool {
        self.status().is_none_or(|s| s.conditions().is_empty())
    }

    /// Writes the status of a paused object: by default the conditions as they are, with
    /// Reconciling=False and Paused=True ([`crate::conditions::paused`]).
    fn write_paused(&self, ctx: &Self::Ctx) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            let mut status = self.status().cloned().unwrap_or_default();
            let paused = crate::conditions::paused(status.conditions(), self.meta().generation, crate::time::now_seconds());
            *status.conditions_mut() = paused;
            Self::core(ctx).apply_status(self, self.status(), &status).await.map(drop)
        }
    }

    /// Writes the first-visit status (conditions Unknown, reason Initializing).
    fn write_first_status(&self, ctx: &Self::Ctx) -> impl Future<Output = Result<(), Error>> + Send;

    /// Reconciles an object that is not being deleted (the finalizer is in place).
    fn apply(self: Arc<Self>, ctx: &Self::Ctx) -> impl Future<Output = Result<Action, Error>> + Send;

    /// Cleans up an object being deleted; the finalizer is removed once this returns `Ok`.
    fn cleanup(self: Arc<Self>, ctx: &Self::Ctx) -> impl Future<Output = Result<Action, Error>> + Send;
}

/// Reconciles one object of kind `K` (the `reconcile` of its `Controller`).
pub async fn reconcile<K: Reconciled>(obj: Arc<K>, ctx: Arc<K::Ctx>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = K::KIND,
        object = %ObjectRef::from_obj(obj.as_ref()),
        generation = obj.meta().generation,
    );
    // Provider calls made during this visit are attributed to the object in the audit log.
    let audited = crate::audit::AuditObject {
        kind: K::KIND.to_string(),
        namespace: obj.meta().namespace.clone().unwrap_or_default(),
        name: obj.meta().name.clone().unwrap_or_default(),
        generation: obj.meta().generation,
    };
    crate::audit::CURRENT.scope(audited, visit(obj, &ctx).instrument(span)).await
}

/// `error_policy` of every kind: per-object jittered backoff by error class, logged with the
/// failing step.
pub fn error_policy<K: Reconciled>(obj: Arc<K>, error: &Error, ctx: Arc<K::Ctx>) -> Action {
    K::core(&ctx).backoff(K::KIND, obj.as_ref(), error)
}

async fn visit<K: Reconciled>(obj: Arc<K>, ctx: &K::Ctx) -> Result<Action, Error> {
    let core = K::core(ctx);
    let _timer = core.metrics.reconcile_timer(K::KIND);
    // Nothing acts on a cache that has not synced (a restarted controller would
    // otherwise resolve a Server to the default workspace: see crate::sync).
    core.caches_synced().await.at(Step::CacheSync)?;
    // Sharded: only an object carrying this replica's label, in a namespace it is not
    // handing over; the guard counts the visit in flight until it ends (crate::shard).
    let _in_flight = match &core.shard {
        None => None,
        Some(shard) => {
            match shard.enter(obj.meta().labels.as_ref().unwrap_or(&std::collections::BTreeMap::new()), &obj.shard_namespace()) {
                Ok(guard) => Some(guard),
                // Another replica's (a Workspace: that cache is not per shard); a relabel to
                // this replica is a watch event that brings it back.
                Err(crate::shard::Refused::NotMine) => return Ok(Action::await_change()),
                // Handed over (or about to be): its relabel makes it leave this replica's
                // watch; if the namespace comes back instead, this looks again.
                Err(crate::shard::Refused::Draining) => return Ok(Action::requeue(SHARD_REQUEUE)),
            }
        }
    };
    if core.is_stale(obj.as_ref()) {
        // An older copy than our own last write: acting on it would redo recorded work (and
        // re-run recorded script runs). The watch event of the newer version usually brings
        // the object back first; the requeue is the safety net.
        tracing::debug!("cached copy older than our last write; looking again shortly");
        return Ok(Action::requeue(STALE_REQUEUE));
    }
    if crate::decode::superseded_by_undecodable(obj.as_ref()) {
        // A newer version exists that the watch could not decode (reported on the object once
        // per version): this copy's spec is no longer the object's. Acting on it would carry
        // out what was replaced, and its writes would answer with the oversized live version.
        // The watch event of a decodable version brings the object back.
        tracing::debug!("a newer version of this object cannot be decoded; not acting on the cached copy");
        return Ok(Action::await_change());
    }
    let deleting = obj.meta().deletion_timestamp.is_some();
    if is_paused(obj.as_ref()) && (K::PAUSE_HOLDS_DELETION || !deleting) {
        obj.write_paused(ctx).await.at(Step::Paused)?;
        core.reset_backoff(K::KIND, obj.as_ref());
        return Ok(Action::await_change());
    }
    if K::FINALIZER_BEFORE_FIRST_ACTION && !obj.meta().finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == FINALIZER)) {
        // Nothing was done at a provider yet (that write comes first), so a deletion has
        // nothing to clean up; otherwise the kind's visit runs and writes the finalizer itself.
        if deleting {
            return Ok(Action::await_change());
        }
        let action = obj.clone().apply(ctx).await?;
        core.reset_backoff(K::KIND, obj.as_ref());
        return Ok(action);
    }
    // Finalizer first (its patch is guarded by resourceVersion), then the first status.
    let added = core.add_first_finalizer(obj.as_ref()).await.at(Step::Finalizer)?;
    if !deleting && !K::VISIT_WRITES_FIRST_STATUS && obj.first_visit() {
        obj.write_first_status(ctx).await.at(Step::FirstStatus)?;
    }
    if added {
        return Ok(Action::await_change());
    }
    let action = finalize(core, obj.clone(), ctx).await?;
    core.reset_backoff(K::KIND, obj.as_ref());
    Ok(action)
}

/// kube-runtime's `finalizer` step with its patches' answers decoded slim ([`crate::slim`]):
/// with our finalizer, `apply` (or `cleanup` once deleting, then the finalizer is removed by a
/// JSON patch that tests its index, so a concurrent change of the list fails instead of
/// removing another's); without it, it is added first (a JSON patch testing the list).
async fn finalize<K: Reconciled>(core: &Context, obj: Arc<K>, ctx: &K::Ctx) -> Result<Action, FinalizerError<Error>> {
    use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
    let name = obj.meta().name.clone().ok_or(FinalizerError::UnnamedObject)?;
    let finalizers = obj.meta().finalizers.clone().unwrap_or_default();
    let index = finalizers.iter().position(|f| f == FINALIZER);
    let deleting = obj.meta().deletion_timestamp.is_some();
    let pointer = |path: &str| json_patch::jsonptr::PointerBuf::parse(path).map_err(|_| FinalizerError::InvalidFinalizer);
    let params = kube::api::PatchParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() };
    let api = core.slim_api(obj.as_ref());
    match (index, deleting) {
        (Some(_), false) => obj.apply(ctx).await.map_err(FinalizerError::ApplyFailed),
        (Some(i), true) => {
            let action = obj.clone().cleanup(ctx).await.map_err(FinalizerError::CleanupFailed)?;
            let path = format!("/metadata/finalizers/{i}");
            let patch = json_patch::Patch(vec![
                PatchOperation::Test(TestOperation { path: pointer(&path)?, value: FINALIZER.into() }),
                PatchOperation::Remove(RemoveOperation { path: pointer(&path)? }),
            ]);
            api.patch(&name, &params, &kube::api::Patch::Json::<()>(patch)).await.map_err(FinalizerError::RemoveFinalizer)?;
            Ok(action)
        }
        (None, false) => {
            let patch = json_patch::Patch(if finalizers.is_empty() {
                vec![
                    PatchOperation::Test(TestOperation { path: pointer("/metadata/finalizers")?, value: serde_json::Value::Null }),
                    PatchOperation::Add(AddOperation { path: pointer("/metadata/finalizers")?, value: vec![FINALIZER].into() }),
                ]
            } else {
                vec![
                    PatchOperation::Test(TestOperation { path: pointer("/metadata/finalizers")?, value: finalizers.clone().into() }),
                    PatchOperation::Add(AddOperation { path: pointer("/metadata/finalizers/-")?, value: FINALIZER.into() }),
                ]
            });
            api.patch(&name, &params, &kube::api::Patch::Json::<()>(patch)).await.map_err(FinalizerError::AddFinalizer)?;
            Ok(Action::await_change())
        }
        (None, true) => Ok(Action::await_change()),
    }
}

/// The one place a visit reports: its status patch (`desired`; skipped when `None` or
/// unchanged), then — only once that is written — its events, in order. A failed write
/// publishes nothing (the next visit plans the same events again from the unchanged status).
pub async fn report<K, S>(obj: &K, current: Option<&S>, desired: Option<&S>, events: Vec<Note>, ctx: &Context) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Serialize,
    S: Serialize + PartialEq,
{
    if let Some(desired) = desired {
        ctx.apply_status(obj, current, desired).await.at(Step::Status)?;
    }
    for mut e in events {
        if let Some(plan_id) = e.approved_plan.take() {
            let Some(note) = approval_trail(obj, &plan_id, ctx).await else { continue };
            e.note = note;
        }
        let type_ = if e.warning { EventType::Warning } else { EventType::Normal };
        ctx.publish(obj, type_, &e.reason, e.action, Some(e.note)).await;
    }
    Ok(())
}

/// The trail of the approval of `plan_id` on `obj`: reads who set the annotation (the watch
/// caches drop managedFields), records it in the audit log and returns the Event's text;
/// `None` for an approval the controller passed down (its Cluster's Event is the one).
async fn approval_trail<K>(obj: &K, plan_id: &str, ctx: &Context) -> Option<String>
where
    K: Resource<DynamicType = ()>,
{
    let namespace = obj.meta().namespace.as_deref().unwrap_or_default();
    // The live object decoded slim (crate::slim): a tenant can make it large.
    let api = crate::slim::SlimApi::of::<K>(ctx.client.clone(), Some(namespace));
    let name = obj.meta().name.as_deref().unwrap_or_default();
    let who = match api.get(name).await.map(|found| found.meta()) {
        Ok(found) => crate::approval::approver(found.annotations.as_ref(), found.managed_fields.as_deref().unwrap_or_default()),
        Err(e) => {
            tracing::debug!(error = %e, "could not read who approved the plan");
            crate::approval::Approver::default()
        }
    };
    let note = crate::approval::approved_note(plan_id, &who, crate::context::FIELD_MANAGER)?;
    let object = crate::audit::AuditObject {
        kind: K::kind(&()).to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        generation: obj.meta().generation,
    };
    let action =
        crate::audit::Action::Approval { plan: plan_id.to_string(), user: who.user.clone(), field_manager: who.field_manager.clone() };
    ctx.audit.record(crate::audit::Entry::now(action, std::time::Duration::ZERO, "ok", None).about(object.clone()));
    let approval = provisioning_crds::RecordedApproval {
        plan: plan_id.to_string(),
        user: who.user.unwrap_or_default(),
        field_manager: who.field_manager.unwrap_or_default(),
        time: crate::time::now_seconds().to_string(),
    };
    if let Err(e) = record_approval(obj, &object, approval, ctx).await {
        tracing::debug!(error = %e, "could not add the approval to the ChangeRecord (history only)");
    }
    Some(note)
}

/// Adds `approval` to the ChangeRecord of `obj`'s current generation, if history keeps one
/// (history off, or a record not begun yet: nothing to add to).
async fn record_approval<K>(
    obj: &K,
    object: &crate::audit::AuditObject,
    approval: provisioning_crds::RecordedApproval,
    ctx: &Context,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let (Some(uid), Some(generation)) = (obj.meta().uid.as_deref(), obj.meta().generation) else { return Ok(()) };
    if !ctx.history.recorded(&object.kind) {
        return Ok(());
    }
    let api: Api<provisioning_crds::ChangeRecord> = Api::namespaced(ctx.client.clone(), &object.namespace);
    let name = crate::history::record_name(&object.kind, &object.name, uid, generation);
    let Some(record) = api.get_opt(&name).await? else { return Ok(()) };
    let approvals = approvals_with(record.spec.approvals, approval);
    let patch = serde_json::json!({ "spec": { "approvals": approvals } });
    let params = kube::api::PatchParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() };
    let slim = crate::slim::SlimApi::of::<provisioning_crds::ChangeRecord>(ctx.client.clone(), Some(&object.namespace));
    slim.patch(&name, &params, &kube::api::Patch::Merge(&patch)).await.map(drop)
}

/// A record's approvals with `approval` added: once per plan id, the newest 16 kept.
fn approvals_with(
    mut approvals: Vec<provisioning_crds::RecordedApproval>,
    approval: provisioning_crds::RecordedApproval,
) -> Vec<provisioning_crds::RecordedApproval> {
    if !approvals.iter().any(|a| a.plan == approval.plan) {
        approvals.push(approval);
    }
    let excess = approvals.len().saturating_sub(16);
    approvals.drain(..excess);
    approvals
}

/// Queues objects of kind `K` for reconcile from inside the process: no API write, and no
/// watch event needed. Sending never blocks; a closed channel only means the controller is
/// shutting down.
pub struct Trigger<K: Resource> {
    tx: UnboundedSender<ObjectRef<K>>,
}

impl<K: Resource> Clone for Trigger<K> {
    fn clone(&self) -> Self {
        Trigger { tx: self.tx.clone() }
    }
}

impl<K: Resource> Debug for Trigger<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trigger").finish_non_exhaustive()
    }
}

impl<K: Resource> Trigger<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// A trigger and the stream its `Controller` takes with `reconcile_on`.
    pub fn new() -> (Self, UnboundedReceiver<ObjectRef<K>>) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        (Trigger { tx }, rx)
    }

    /// Queues `object` for reconcile.
    pub fn send(&self, object: ObjectRef<K>) {
        let _ = self.tx.unbounded_send(object);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use provisioning_crds::Server;

    #[tokio::test]
    async fn a_trigger_queues_the_object_and_survives_a_closed_controller() {
        let (trigger, mut triggered) = Trigger::<Server>::new();
        trigger.clone().send(ObjectRef::new("web-0").within("team-a"));
        let got = triggered.next().await.expect("one trigger");
        assert_eq!(got, ObjectRef::new("web-0").within("team-a"));
        drop(triggered);
        trigger.send(ObjectRef::new("web-1").within("team-a"));
    }

    #[test]
    fn the_failing_step_is_kept_and_the_message_unchanged() {
        let inner = Error::Stalled { reason: "UnknownProvider", message: "no account \"x\"".into() };
        let e = inner.at(Step::Validate).at(Step::Act);
        assert_eq!(e.step(), Some(Step::Validate), "the innermost step wins");
        assert_eq!(e.to_string(), "no account \"x\"");
        assert_eq!(e.category(), "UnknownProvider");
        assert_eq!(e.class(), crate::error::ErrorClass::Permanent);
        assert!(matches!(e.root(), Error::Stalled { .. }));
        let wrapped: Error = kube::runtime::finalizer::Error::ApplyFailed(e).into();
        assert_eq!(wrapped.step(), Some(Step::Validate));
        let plain: Error = kube::runtime::finalizer::Error::<Error>::CleanupFailed(Error::InProgress("x".into())).into();
        assert_eq!(plain.step(), Some(Step::Cleanup));
        assert_eq!(Error::MissingField("metadata.uid").step(), None);
    }

    #[test]
    fn a_record_keeps_each_approved_plan_once() {
        let approval = |plan: &str| provisioning_crds::RecordedApproval {
            plan: plan.into(),
            user: String::new(),
            field_manager: "k".into(),
            time: "t".into(),
        };
        let one = approvals_with(Vec::new(), approval("a"));
        assert_eq!(one, vec![approval("a")]);
        assert_eq!(approvals_with(one.clone(), approval("a")), one, "the same plan again: once");
        let many = (0..20).fold(Vec::new(), |all, i| approvals_with(all, approval(&i.to_string())));
        assert_eq!((many.len(), many[0].plan.as_str()), (16, "4"), "the newest 16");
    }
}
