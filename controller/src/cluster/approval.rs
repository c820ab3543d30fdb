//! Approval of a whole Cluster (`approval: Manual`): one annotation
//! `provisioning.dev/approve: <status.plan.id>` on the Cluster approves, for each member
//! Server and TaskServ, what the Cluster's plan covers.
//!
//! The Cluster itself goes on creating and respecifying its members (they inherit its
//! approval and wait at their own gates); what it gates is the approval it passes down. Its
//! plan ([`super::plan::cluster_plan`]) holds its own changes and every member's pending
//! plan, so its id covers everything the members would do. Once approved, each member whose
//! own plan is covered gets its own `provisioning.dev/approve` set to its current plan id (a
//! metadata-only merge patch) and goes on through its usual gate. Like a TaskServ's, the
//! Cluster's plan shrinks while carried out (and turns into the members' plans), so the
//! approved plan is kept in `status.approvedPlan`. The Cluster's own deletes of members its
//! plan lists (a scale-down, a service removed, a dead member replaced) wait for the approval
//! too ([`hold_deletes`]).
//!
//! What an approval covers while observed state is still moving (members plan one after the
//! other, a TaskServ notices a dead machine after the Cluster did):
//! - The approved plan's changes stay approved while they are carried out and while later
//!   plans of the same spec only shrink or restate them ([`covered`]): the same change; for a
//!   member the plan creates or respecifies, what that member then does for it; for a member
//!   replaced as a whole (its machine died), its delete, its replacement of the same name and
//!   pool with its machine, and the pool's services installed on the replacement again at the
//!   version that ran there (an install, or a re-install from and to the same version).
//! - An annotation naming the plan the Cluster showed last (`status.plan`) approves that plan,
//!   also when the current plan has meanwhile restated it (the user approved what they read).
//! - Approving a new plan while an earlier approval of the same spec is still being carried
//!   out keeps the earlier one's changes approved too ([`keep_earlier`]).
//! - Anything else — another member, a spec change (a new generation), another service,
//!   version or config, a rollback — waits for its own approval, and the AwaitingApproval
//!   message names the changes beyond the approved plan ([`Decision::waiting_message`]).
//! - An approval is carried out once the plan is empty, every member's plan is current and
//!   every member Server serves its services from its current machine: then its changes are
//!   cleared (the id stays, so the annotation naming it is not stale), and later drift needs
//!   a new approval.
//!
//! The decisions are pure ([`decide`], [`covered`], [`hold`], [`hold_deletes`]);
//! [`record`] puts one into the status and [`pass_down`], after the status is written, patches
//! the members.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use provisioning_crds::{
    ANNOTATION_APPROVE, Approval, ChangeAction, Cluster, ClusterStatus, Plan, PlannedChange, Server, TaskServ, condition,
};

use super::plan::{Observed, PlannedEvent};
pub use crate::approval::approval_of;
use crate::approval::{AWAITING_APPROVAL, Gate, gate_with, same_change};
use crate::conditions::{self, DesiredCondition, Status, Summary};
use crate::context::{Context, FIELD_MANAGER};
use crate::error::Error;
use crate::reconcile::Note;

/// The object a planned change is about: `TaskServ/ns/name on <server>` is about
/// `TaskServ/ns/name` (names hold no spaces).
fn object_of(resource: &str) -> &str {
    resource.split(" on ").next().unwrap_or(resource)
}

/// Whether `approved` creates or respecifies the member object `object`: creating or
/// respecifying a member approves what the member then has to do for it.
fn approves_member(approved: &PlannedChange, object: &str) -> bool {
    (object.starts_with("Server/") || object.starts_with("TaskServ/"))
        && approved.resource == object
        && (approved.action == ChangeAction::Create
            || approved.field.starts_with("spec.")
            // The member replaced as a whole: its new machine comes with it.
            || (approved.action == ChangeAction::Replace && approved.field.is_empty()))
}

/// Whether the approved Cluster plan covers `change` (one of the Cluster's own changes or of a
/// member's plan): it holds the same change (resource, action, target), or a Create of the
/// member the change is about, or a change of one of that member's spec fields.
/// An approved version change covers installs of that version only: the rollback of a
/// failed upgrade (back to the last good version) is a plan of its own, as on a standalone
/// TaskServ.
pub fn covered(change: &PlannedChange, approved: &Plan) -> bool {
    let object = object_of(&change.resource);
    let approved_version = approved
        .changes
        .iter()
        .find(|a| a.resource == object && a.field == "spec.version" && !a.to.is_empty() && a.to != super::plan::DEFAULT_SHOWN)
        .map(|a| a.to.as_str());
    let elsewhere = change.field == "version" && approved_version.is_some_and(|v| change.to != v);
    approved.changes.iter().any(|a| {
        same_change(a, change)
            || (!elsewhere && (approves_member(a, object) || returns_to_replacement(a, change)))
            || surge_leaves(a, change)
    })
}

/// A member replaced as a whole gets its pool's services back: the approved Replace of
/// `Server/ns/X` (its machine died) covers `TaskServ/ns/* on X` installing there again — an
/// install, or a re-install of the version that ran there. An upgrade (another version), a
/// remove, or another server is not part of the replacement.
fn returns_to_replacement(approved: &PlannedChange, change: &PlannedChange) -> bool {
    let Some((object, server)) = change.resource.split_once(" on ") else { return false };
    let namespace = object.split('/').nth(1).unwrap_or_default();
    let restores = match change.action {
        ChangeAction::Create => true,
        ChangeAction::Update => change.from == change.to,
        _ => false,
    };
    object.starts_with("TaskServ/")
        && change.field == "version"
        && restores
        && approved.action == ChangeAction::Replace
        && approved.field.is_empty()
        && approved.resource == format!("Server/{namespace}/{server}")
}

/// A surge Server created under an approval leaves its services under the same approval:
/// the remove of a service from it is covered by the approved Create of that surge Server.
fn surge_leaves(approved: &PlannedChange, change: &PlannedChange) -> bool {
    let Some((object, server)) = change.resource.split_once(" on ") else { return false };
    let namespace = object.split('/').nth(1).unwrap_or_default();
    change.action == ChangeAction::Delete
        && approved.action == ChangeAction::Create
        && approved.reason == super::plan::SURGE_REASON
        && approved.resource == format!("Server/{namespace}/{server}")
}

/// Kind of a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberKind {
    /// A Server of a pool.
    Server,
    /// A TaskServ of a service.
    TaskServ,
}

impl MemberKind {
    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberKind::Server => "Server",
            MemberKind::TaskServ => "TaskServ",
        }
    }
}

/// A member as approval sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member<'a> {
    /// Server or TaskServ.
    pub kind: MemberKind,
    /// Its name.
    pub name: &'a str,
    /// `Kind/namespace/name`, the resource its plan's changes are about.
    pub resource: String,
    /// Its own `status.plan`.
    pub plan: Option<&'a Plan>,
    /// Its `provisioning.dev/approve` annotation.
    pub approve: Option<&'a str>,
    /// Its status describes its current generation.
    pub settled: bool,
    /// Being deleted.
    pub deleting: bool,
    /// Nothing is left for it beyond its plan: a Server serves (Ready, every service listing
    /// it runs there from its current machine: [`super::plan::available`]), or is being
    /// deleted and no longer wanted (a scale-down; one still wanted is being replaced). Always
    /// true for a TaskServ (its plan says what it still has to do).
    pub done: bool,
}

/// The members of the observed Cluster.
pub fn members<'a>(o: &Observed<'a>, namespace: &str) -> Vec<Member<'a>> {
    let wanted: Vec<String> = super::plan::desired_with_surge(o).into_iter().filter_map(|s| s.metadata.name).collect();
    let servers = o.servers.iter().map(move |s| Member {
        kind: MemberKind::Server,
        name: &s.name,
        resource: format!("Server/{namespace}/{}", s.name),
        plan: s.pending_plan.as_ref(),
        approve: s.approve.as_deref(),
        settled: s.observed_current && s.pending_plan.is_some(),
        deleting: s.deleting,
        done: if s.deleting { !wanted.contains(&s.name) } else { super::plan::available(o, s) },
    });
    let taskservs = o.taskservs.iter().map(|t| Member {
        kind: MemberKind::TaskServ,
        name: &t.name,
        resource: format!("TaskServ/{namespace}/{}", t.name),
        plan: t.pending_plan.as_ref(),
        approve: t.approve.as_deref(),
        settled: t.settled,
        deleting: t.deleting,
        done: true,
    });
    servers.chain(taskservs).collect()
}

/// An approval to pass down: set the member's annotation to its plan id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassDown {
    /// Server or TaskServ.
    pub kind: MemberKind,
    /// Its name.
    pub name: String,
    /// Its current plan id.
    pub id: String,
}

/// What approval decides for one pass of a Cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The approval in force.
    pub approval: Approval,
    /// Go, wait, or wait with a stale annotation.
    pub gate: Gate,
    /// `status.approvedPlan` afterwards.
    pub approved: Option<Plan>,
    /// Members to approve.
    pub pass_down: Vec<PassDown>,
    /// While the plan waits although an approval of the same spec is in force (the
    /// annotation names it): the plan's changes that approval does not cover.
    pub beyond: Vec<PlannedChange>,
}

impl Decision {
    /// The AwaitingApproval message: the plan to approve and, when an approval is in force,
    /// what is new beyond it.
    pub fn waiting_message(&self, plan: &Plan) -> String {
        let waiting = crate::approval::waiting_message(plan);
        let Some(approved) = self.approved.as_ref().filter(|_| !self.beyond.is_empty()) else {
            return waiting;
        };
        const SHOWN: usize = 5;
        let mut new: Vec<String> = self.beyond.iter().take(SHOWN).map(describe).collect();
        if self.beyond.len() > SHOWN {
            new.push(format!("{} more", self.beyond.len() - SHOWN));
        }
        format!("{waiting}; not covered by the approved plan {}: {}", approved.id, new.join(", "))
    }
}

/// One change as the waiting message names it: "replace Server/ns/c-pool-2 → a new Server and
/// machine", "update TaskServ/ns/c-redis on c-pool-0 version 7.0 → 7.2".
fn describe(c: &PlannedChange) -> String {
    let mut text = format!("{} {}", c.action.verb(), c.resource);
    if !c.field.is_empty() {
        text.push(' ');
        text.push_str(&c.field);
    }
    match (c.from.is_empty(), c.to.is_empty()) {
        (_, true) => {}
        (true, false) => text.push_str(&format!(" → {}", c.to)),
        (false, false) => text.push_str(&format!(" {} → {}", c.from, c.to)),
    }
    text
}

/// Decides where the Cluster's `plan` stands with approval and which members to approve.
/// `status` holds the approval in force before this pass and the plan shown last.
pub fn decide(approval: Approval, annotation: Option<&str>, plan: &Plan, status: &ClusterStatus, members: &[Member<'_>]) -> Decision {
    let kept = status.approved_plan.as_ref();
    let before = shown_and_approved(annotation, plan, status).or_else(|| kept.cloned());
    let gate = gate_with(approval, annotation, plan, before.as_ref(), covered);
    let mut decision = Decision { approval, gate: gate.clone(), approved: before.clone(), pass_down: Vec::new(), beyond: Vec::new() };
    let Gate::Go { approved } = gate else {
        if decision.gate == Gate::Wait && approval == Approval::Manual {
            decision.beyond = beyond(annotation, plan, before.as_ref());
        }
        return decision;
    };
    decision.approved = approved.map(|a| keep_earlier(a, kept));
    if approval == Approval::Automatic {
        decision.approved = None;
        return decision;
    }
    // Carried out: nothing left, every member's plan is current (a member just created or
    // respecified has not planned yet: its work is still to come under this approval) and
    // every member Server serves from its current machine (one being replaced is not there
    // yet; a TaskServ that has not looked at a replaced member yet still has to install
    // there, under this approval).
    if !plan.has_changes() && members.iter().all(|m| m.done && (m.deleting || m.settled)) {
        decision.approved = decision.approved.map(carried_out);
        return decision;
    }
    if let Some(approved) = &decision.approved {
        decision.pass_down = members
            .iter()
            .filter(|m| eligible(m, approved, plan))
            .filter_map(|m| m.plan.map(|p| PassDown { kind: m.kind, name: m.name.to_string(), id: p.id.clone() }))
            .collect();
    }
    decision
}

/// The plan the Cluster showed last (`status.plan`) when the annotation names it and the
/// current plan differs (observed state moved since the user read it): the user approved
/// that plan, together with what an approval of the same spec still in force covers. The
/// gate then judges the current plan against it like any kept approval.
fn shown_and_approved(annotation: Option<&str>, plan: &Plan, status: &ClusterStatus) -> Option<Plan> {
    let annotation = annotation.map(str::trim)?;
    let shown = status.plan.as_ref()?;
    let kept = status.approved_plan.as_ref();
    let named = shown.id == annotation && shown.id != plan.id && kept.is_none_or(|k| k.id != shown.id);
    (named && shown.has_changes() && shown.generation == plan.generation).then(|| keep_earlier(shown.clone(), kept))
}

/// At most this many changes in a plan (`Plan.changes`' schema limit): a kept approval's
/// changes beyond it are dropped, and what they covered waits for a new approval.
const MAX_CHANGES: usize = 256;

/// A newly approved plan keeps the changes of an approval of the same spec that is still
/// being carried out: approving more does not take back what was approved before.
fn keep_earlier(mut approved: Plan, kept: Option<&Plan>) -> Plan {
    let Some(kept) = kept.filter(|k| k.id != approved.id && k.generation == approved.generation) else {
        return approved;
    };
    let room = MAX_CHANGES.saturating_sub(approved.changes.len());
    let earlier: Vec<PlannedChange> =
        kept.changes.iter().filter(|k| !approved.changes.iter().any(|a| same_change(a, k))).take(room).cloned().collect();
    approved.changes.extend(earlier);
    approved
}

/// The changes of `plan` that the approval in force (`before`, of the same spec, named by the
/// annotation) does not cover: what the waiting message names as new.
fn beyond(annotation: Option<&str>, plan: &Plan, before: Option<&Plan>) -> Vec<PlannedChange> {
    let Some(before) = before.filter(|b| annotation.map(str::trim) == Some(b.id.as_str()) && b.generation == plan.generation) else {
        return Vec::new();
    };
    plan.changes.iter().filter(|c| c.action != ChangeAction::NoOp && !covered(c, before)).cloned().collect()
}

/// Under Manual approval, holds the Cluster's own deletes of members that its plan lists
/// (a scale-down, a service removed, a member whose machine died replaced) until approved: a delete goes ahead
/// only when the gate is Go and the approved plan covers it ([`covered`], as the gate does).
/// Teardown of a deleted Cluster is not planned here.
pub fn hold_deletes(decision: &Decision, namespace: &str, plan: &Plan, act: &mut super::plan::Plan) {
    if decision.approval == Approval::Automatic {
        return;
    }
    let approved = decision.approved.as_ref().filter(|_| matches!(decision.gate, Gate::Go { .. }));
    let keep = |kind: &str, name: &String| {
        let resource = format!("{kind}/{namespace}/{name}");
        // A delete the plan lists: a scale-down, a removed service, or a member replaced
        // because its machine died (a Replace of the whole object).
        let planned = plan.changes.iter().find(|c| {
            c.resource == resource && (c.action == ChangeAction::Delete || (c.action == ChangeAction::Replace && c.field.is_empty()))
        });
        planned.is_none_or(|c| approved.is_some_and(|a| covered(c, a)))
    };
    act.delete_servers.retain(|n| keep("Server", n));
    act.delete_taskservs.retain(|n| keep("TaskServ", n));
}

/// An approval carried out in full: its id and summary, no changes (it covers nothing more).
fn carried_out(plan: Plan) -> Plan {
    Plan { id: plan.id, summary: plan.summary, generation: plan.generation, ..Default::default() }
}

/// Whether `m`'s own plan is due for approval under `approved`: it is current (settled, and
/// not being respecified by the Cluster this pass), has changes, all covered, and its
/// annotation does not name it yet.
fn eligible(m: &Member<'_>, approved: &Plan, plan: &Plan) -> bool {
    let Some(own) = m.plan.filter(|p| p.has_changes()) else {
        return false;
    };
    if m.deleting || !m.settled || m.approve.map(str::trim) == Some(own.id.as_str()) {
        return false;
    }
    // The Cluster's own change of this member (not one of the member's): its plan is about
    // to change, approve the next one.
    let respecified = plan.changes.iter().any(|c| c.resource == m.resource && !own.changes.iter().any(|o| same_change(o, c)));
    !respecified && own.changes.iter().filter(|c| c.action != ChangeAction::NoOp).all(|c| covered(c, approved))
}

fn status_of(value: &str) -> Status {
    match value {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    }
}

/// Holds a Cluster whose plan waits: Ready=False and Reconciling=True with reason
/// AwaitingApproval and `message` (naming the plan id, the annotation to set and what is new:
/// [`Decision::waiting_message`]), phase AwaitingApproval, no Ready event. A Stalled Cluster
/// stays Stalled (that is the news). `previous` are the conditions before this pass
/// (`lastTransitionTime` moves only on flips).
pub fn hold(status: &mut ClusterStatus, events: &mut Vec<PlannedEvent>, previous: &[Condition], message: String, now: Timestamp) {
    if conditions::is_true(&status.conditions, condition::STALLED) {
        return;
    }
    let kstatus = [condition::READY, condition::RECONCILING, condition::STALLED];
    let mut desired = Summary::progressing(AWAITING_APPROVAL, message).conditions();
    for c in status.conditions.iter().filter(|c| !kstatus.contains(&c.type_.as_str())) {
        desired.push(DesiredCondition::new(&c.type_, status_of(&c.status), &c.reason, c.message.clone()));
    }
    status.conditions = conditions::merge(previous, &desired, status.observed_generation, now);
    status.phase = Some(AWAITING_APPROVAL.to_string());
    events.retain(|e| e.reason != "Ready");
}

/// Where the Cluster's `plan` stands with its approval (the Cluster's own, else its
/// Workspace's) this pass: [`decide`] over the observed members.
pub fn decision(cluster: &Cluster, namespace: &str, o: &Observed<'_>, plan: &Plan, ctx: &Context) -> Decision {
    let approval = approval_of(cluster.spec.approval, ctx.workspace_for(namespace).spec.approval);
    let annotation = cluster.annotations().get(ANNOTATION_APPROVE).map(String::as_str);
    let previous = cluster.status.clone().unwrap_or_default();
    decide(approval, annotation, plan, &previous, &members(o, namespace))
}

/// Records a [`Decision`] in `status` before anything is passed down: the approval in force
/// (`status.approvedPlan`) and the conditions held while the plan waits; returns the
/// PlanStale Warning of a stale annotation, or the one `Approved` Event of an approval coming
/// into force (not one per member it is passed down to), for the visit's report. [`pass_down`] runs only
/// after this status is written, so a controller stopped in between finds the approval
/// recorded (members already approved work on, their plans shrink, and the kept approval
/// still covers what is left) instead of a changed plan id that would make the user's
/// annotation look stale.
pub fn record(
    cluster: &Cluster,
    plan: &Plan,
    decision: &Decision,
    status: &mut ClusterStatus,
    events: &mut Vec<PlannedEvent>,
    now: Timestamp,
) -> Vec<Note> {
    let previous = cluster.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    status.approved_plan = decision.approved.clone();
    if !decision.gate.goes() {
        hold(status, events, previous, decision.waiting_message(plan), now);
    }
    let before = cluster.status.as_ref().and_then(|s| s.approved_plan.as_ref());
    let approved = crate::approval::newly_approved(before, status.approved_plan.as_ref()).filter(|_| decision.gate.goes());
    crate::approval::stale(&decision.gate, plan).into_iter().chain(approved.map(crate::approval::approved)).collect()
}

/// Keeps in `decision.pass_down` only the members the Cluster's approver may approve itself
/// (a SubjectAccessReview per member, [`crate::approval::authorize`]): the controller passes
/// an approval down no further than its approver could approve each member. Returns the
/// `ApprovalRefused` Warning naming the members left waiting and what is missing.
/// Under `requireDistinctApprover` a member whose spec the approver wrote itself (or whose
/// writer is not recorded) is not passed the approval either: the members are the
/// controller's to write, and an edit of one by hand is a change of its own.
pub async fn screen_pass_down(cluster: &Cluster, decision: &mut Decision, distinct: bool, ctx: &Context) -> Result<Option<Note>, Error> {
    use crate::approval::authorize::{self, APPROVAL_REFUSED, Target};
    if decision.pass_down.is_empty() {
        return Ok(None);
    }
    let namespace = cluster.metadata.namespace.as_deref().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = cluster.name_any();
    // Metadata decoded slim (crate::slim): the tenant can bloat managedFields.
    let api = crate::slim::SlimApi::of::<Cluster>(ctx.client.clone(), Some(namespace));
    let fresh = api.get_opt(&name).await?.map(|f| f.meta());
    let rec = fresh.map(|f| authorize::recorded(&f.annotations.unwrap_or_default(), f.managed_fields.as_deref().unwrap_or_default()));
    let controller = authorize::controller_user(ctx).await;
    let Some((user, groups)) = rec.and_then(|r| Some((r.approver?, r.groups))) else {
        decision.pass_down.clear();
        return Ok(None);
    };
    if controller.as_deref() == Some(user.as_str()) {
        return Ok(None);
    }
    let mut refused = Vec::new();
    let mut kept = Vec::new();
    for p in std::mem::take(&mut decision.pass_down) {
        let plural = match p.kind {
            MemberKind::Server => "servers",
            MemberKind::TaskServ => "taskservs",
        };
        if distinct && member_changed_by(ctx, p.kind, namespace, &p.name).await?.is_none_or(|c| c == user) {
            refused.push(format!("{} {} (its spec was last written by the approver, or by someone not recorded)", p.kind.as_str(), p.name));
            continue;
        }
        match authorize::may_approve(ctx, &user, &groups, Target { plural, namespace, name: &p.name }).await {
            Ok(true) => kept.push(p),
            Ok(false) => refused.push(format!("{} {}", p.kind.as_str(), p.name)),
            // The controller may not ask (deploy/rbac grants it): refused, not retried for ever.
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 403 => refused.push(format!("{} {}", p.kind.as_str(), p.name)),
            Err(e) => return Err(e),
        }
    }
    decision.pass_down = kept;
    if refused.is_empty() {
        return Ok(None);
    }
    let note = format!(
        "the approval of Cluster {namespace}/{name} is not passed down to {}: user {user:?} may not approve them: grant the approve \
         verb on servers and taskservs.provisioning.dev in namespace {namespace}, or under requireDistinctApprover have another \
         user approve (they wait for their own approval meanwhile)",
        refused.join(", ")
    );
    Ok(Some(Note::warning(APPROVAL_REFUSED, "Approve", note)))
}

/// Approves the covered members of a recorded [`Decision`] (a merge patch of each one's
/// annotation). The approval's one `Approved` Event is the Cluster's ([`record`]): members
/// approved here, over several passes as they plan, announce nothing of their own. A member
/// deleted meanwhile is skipped; any other failure is retried with the next pass, which
/// decides again.
pub async fn pass_down(cluster: &Cluster, decision: &Decision, ctx: &Context) -> Result<(), Error> {
    if decision.pass_down.is_empty() {
        return Ok(());
    }
    let namespace = cluster.metadata.namespace.as_deref().ok_or(Error::MissingField("metadata.namespace"))?;
    let approved = approve_members(namespace, &decision.pass_down, ctx).await?;
    tracing::debug!(members = approved.len(), "approval passed down");
    Ok(())
}

/// Sets each member's `provisioning.dev/approve` to its plan id: metadata only, the member's
/// spec and status are left alone. Returns those approved (a member already gone is not).
async fn approve_members<'a>(namespace: &str, pass_down: &'a [PassDown], ctx: &Context) -> Result<Vec<&'a PassDown>, Error> {
    // The answers are the live members, decoded slim (crate::slim): a tenant can make them large.
    let servers = crate::slim::SlimApi::of::<Server>(ctx.client.clone(), Some(namespace));
    let taskservs = crate::slim::SlimApi::of::<TaskServ>(ctx.client.clone(), Some(namespace));
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..Default::default() };
    let mut approved = Vec::new();
    for p in pass_down {
        let patch = Patch::Merge(serde_json::json!({ "metadata": { "annotations": { ANNOTATION_APPROVE: p.id } } }));
        let result = match p.kind {
            MemberKind::Server => servers.patch(&p.name, &params, &patch).await.map(drop),
            MemberKind::TaskServ => taskservs.patch(&p.name, &params, &patch).await.map(drop),
        };
        match result {
            Ok(()) => approved.push(p),
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
        ctx.metrics.record_write(p.kind.as_str());
    }
    Ok(approved)
}

/// Who last wrote a member's spec, as the API server recorded it (None: not recorded, or the
/// member is gone).
async fn member_changed_by(ctx: &Context, kind: MemberKind, namespace: &str, name: &str) -> Result<Option<String>, Error> {
    // Metadata decoded slim (crate::slim): the tenant can bloat managedFields.
    let api = match kind {
        MemberKind::Server => crate::slim::SlimApi::of::<provisioning_crds::Server>(ctx.client.clone(), Some(namespace)),
        MemberKind::TaskServ => crate::slim::SlimApi::of::<provisioning_crds::TaskServ>(ctx.client.clone(), Some(namespace)),
    };
    let meta = api.get_opt(name).await?.map(|m| m.meta());
    Ok(meta.and_then(|m| {
        crate::approval::authorize::recorded(&m.annotations.unwrap_or_default(), m.managed_fields.as_deref().unwrap_or_default()).changed_by
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(resource: &str, field: &str, action: ChangeAction, to: &str) -> PlannedChange {
        PlannedChange { resource: resource.into(), field: field.into(), action, from: String::new(), to: to.into(), reason: String::new() }
    }

    fn plan(id: &str, changes: Vec<PlannedChange>) -> Plan {
        Plan { id: id.into(), summary: format!("{} changes", changes.len()), changes, ..Default::default() }
    }

    fn member<'a>(kind: MemberKind, name: &'a str, own: Option<&'a Plan>) -> Member<'a> {
        Member {
            kind,
            name,
            resource: format!("{}/ns/{name}", kind.as_str()),
            plan: own,
            approve: None,
            settled: true,
            deleting: false,
            done: true,
        }
    }

    fn install(server: &str) -> PlannedChange {
        change(&format!("TaskServ/ns/c-redis on {server}"), "version", ChangeAction::Create, "7.2")
    }

    /// A Cluster pass that would delete these Servers and TaskServs and do nothing else.
    fn deleting(servers: &[&str], taskservs: &[&str]) -> super::super::plan::Plan {
        super::super::plan::Plan {
            apply_servers: Vec::new(),
            delete_servers: servers.iter().map(|s| s.to_string()).collect(),
            apply_taskservs: Vec::new(),
            delete_taskservs: taskservs.iter().map(|s| s.to_string()).collect(),
            status: ClusterStatus::default(),
            events: Vec::new(),
            requeue: None,
            teardown_done: false,
        }
    }

    fn machine(server: &str) -> PlannedChange {
        change(&format!("Server/ns/{server}"), "", ChangeAction::Create, "small machine")
    }

    #[test]
    fn coverage_is_the_same_change_or_a_create_or_respec_of_the_member() {
        let approved = plan(
            "aaa",
            vec![
                machine("c-pool-0"),
                change("TaskServ/ns/c-redis", "", ChangeAction::Create, "redis on 2 servers"),
                change("TaskServ/ns/c-web", "spec.config", ChangeAction::Update, ""),
                change("Server/ns/c-pool-1", "", ChangeAction::Delete, ""),
            ],
        );
        // The same change.
        assert!(covered(&machine("c-pool-0"), &approved));
        // A TaskServ created installs on its servers; a respecified one re-installs.
        assert!(covered(&install("c-pool-0"), &approved));
        assert!(covered(&change("TaskServ/ns/c-web on c-pool-0", "version", ChangeAction::Update, "1.0"), &approved));
        // A Server created makes its machine (another target than the Cluster's own Create).
        assert!(covered(&change("Server/ns/c-pool-0", "", ChangeAction::Create, "other words"), &approved));
        // A Delete of a member approves nothing else for it; other members are not covered.
        assert!(!covered(&change("Server/ns/c-pool-1", "spec.plan", ChangeAction::Replace, "big"), &approved));
        assert!(!covered(&machine("c-pool-2"), &approved));
        assert!(!covered(&change("TaskServ/ns/c-redis-2 on c-pool-0", "version", ChangeAction::Create, "7.2"), &approved));
    }

    #[test]
    fn manual_waits_until_the_cluster_names_its_plan() {
        let p = plan("aaa", vec![machine("c-pool-0")]);
        let status = ClusterStatus::default();
        assert_eq!(decide(Approval::Manual, None, &p, &status, &[]).gate, Gate::Wait);
        assert_eq!(decide(Approval::Manual, Some("zzz"), &p, &status, &[]).gate, Gate::Stale("zzz".into()));
        let long = "x".repeat(200);
        assert_eq!(decide(Approval::Manual, Some(&long), &p, &status, &[]).gate, Gate::Stale("x".repeat(64)));
        let go = decide(Approval::Automatic, Some("zzz"), &p, &status, &[]);
        assert_eq!((go.gate, go.approved, go.pass_down.len()), (Gate::Go { approved: None }, None, 0));
        assert_eq!(approval_of(None, Some(Approval::Manual)), Approval::Manual);
        assert_eq!(approval_of(Some(Approval::Automatic), Some(Approval::Manual)), Approval::Manual, "never loosened");
        assert_eq!(approval_of(Some(Approval::Manual), Some(Approval::Automatic)), Approval::Manual, "tightened");
        assert_eq!(approval_of(None, None), Approval::Automatic);
    }

    #[test]
    fn an_approval_is_passed_down_to_covered_current_members_only() {
        let s0 = plan("s0plan", vec![machine("c-pool-0")]);
        let s1 = plan("s1plan", vec![machine("c-pool-1")]);
        let extra = plan("s2plan", vec![machine("c-pool-2")]);
        let cluster =
            plan("ccc", vec![machine("c-pool-0"), machine("c-pool-1"), change("TaskServ/ns/c-redis", "", ChangeAction::Create, "x")]);
        let mut unsettled = member(MemberKind::Server, "c-pool-1", Some(&s1));
        unsettled.settled = false;
        let mut done = member(MemberKind::Server, "c-pool-3", Some(&s0));
        done.approve = Some("s0plan");
        let members =
            [member(MemberKind::Server, "c-pool-0", Some(&s0)), unsettled, member(MemberKind::Server, "c-pool-2", Some(&extra)), done];
        let d = decide(Approval::Manual, Some("ccc"), &cluster, &ClusterStatus::default(), &members);
        assert_eq!(d.approved.as_ref().map(|p| p.id.as_str()), Some("ccc"));
        // c-pool-1 has not planned its current generation yet, c-pool-2's plan is not in the
        // approved one, c-pool-3 already names its plan.
        assert_eq!(d.pass_down, vec![PassDown { kind: MemberKind::Server, name: "c-pool-0".into(), id: "s0plan".into() }]);
        // Without the Cluster's approval nothing is passed down.
        assert!(decide(Approval::Manual, None, &cluster, &ClusterStatus::default(), &members).pass_down.is_empty());
    }

    #[test]
    fn the_approval_carries_the_plan_as_it_turns_into_member_plans_and_ends_when_done() {
        let approved =
            plan("ccc", vec![machine("c-pool-0"), change("TaskServ/ns/c-redis", "", ChangeAction::Create, "redis on 1 servers")]);
        let status = ClusterStatus { approved_plan: Some(approved.clone()), ..Default::default() };
        // The TaskServ now exists and plans its install: a new Cluster plan id, still covered.
        let ts = plan("tsplan", vec![install("c-pool-0")]);
        let now = plan("ddd", vec![install("c-pool-0")]);
        let members = [member(MemberKind::TaskServ, "c-redis", Some(&ts))];
        let d = decide(Approval::Manual, Some("ccc"), &now, &status, &members);
        assert_eq!(d.gate, Gate::Go { approved: Some(approved.clone()) });
        assert_eq!(d.pass_down, vec![PassDown { kind: MemberKind::TaskServ, name: "c-redis".into(), id: "tsplan".into() }]);
        // Something beyond it (drift on another member) waits; the old annotation is not stale.
        let beyond = plan("eee", vec![install("c-pool-0"), machine("c-pool-5")]);
        let d = decide(Approval::Manual, Some("ccc"), &beyond, &status, &members);
        assert_eq!((d.gate, d.pass_down.len(), d.approved), (Gate::Wait, 0, Some(approved.clone())));
        // Empty while a member has not planned yet: the approval stays.
        let empty = plan("fff", vec![]);
        let mut fresh = member(MemberKind::TaskServ, "c-redis", None);
        fresh.settled = false;
        assert_eq!(decide(Approval::Manual, Some("ccc"), &empty, &status, &[fresh]).approved, Some(approved.clone()));
        // Empty and every member current: its changes are cleared, its id kept.
        let settled = [member(MemberKind::TaskServ, "c-redis", Some(&empty))];
        let d = decide(Approval::Manual, Some("ccc"), &empty, &status, &settled);
        let done = d.approved.expect("kept");
        assert_eq!((done.id.as_str(), done.changes.len()), ("ccc", 0));
        // Later drift needs a new approval, and the annotation naming the done plan is not stale.
        let after = ClusterStatus { approved_plan: Some(done), ..Default::default() };
        let d = decide(Approval::Manual, Some("ccc"), &now, &after, &members);
        assert_eq!((d.gate, d.pass_down.len()), (Gate::Wait, 0));
        assert_eq!(decide(Approval::Manual, Some("zzz"), &now, &after, &members).gate, Gate::Stale("zzz".into()));
    }

    #[test]
    fn a_member_the_cluster_respecifies_this_pass_waits_for_its_next_plan() {
        // The Cluster rewrites the TaskServ's config: the member's current plan is about the
        // old spec, so it is approved on the next pass, once it planned the new one.
        let old = plan("oldplan", vec![install("c-pool-0")]);
        let cluster = plan("ccc", vec![change("TaskServ/ns/c-redis", "spec.config", ChangeAction::Update, ""), install("c-pool-0")]);
        let members = [member(MemberKind::TaskServ, "c-redis", Some(&old))];
        let d = decide(Approval::Manual, Some("ccc"), &cluster, &ClusterStatus::default(), &members);
        assert!(matches!(d.gate, Gate::Go { .. }));
        assert!(d.pass_down.is_empty(), "{:?}", d.pass_down);
    }

    #[test]
    fn a_manual_scale_down_deletes_only_what_was_approved() {
        let gone = change("Server/ns/c-pool-2", "", ChangeAction::Delete, "");
        let removed = change("TaskServ/ns/c-web", "", ChangeAction::Delete, "");
        let p = plan("ddd", vec![gone.clone(), removed.clone()]);
        // c-pool-9 is not in the plan: not held here.
        let act = || deleting(&["c-pool-2", "c-pool-9"], &["c-web"]);
        let status = ClusterStatus::default();
        let mut held = act();
        hold_deletes(&decide(Approval::Manual, None, &p, &status, &[]), "ns", &p, &mut held);
        assert_eq!((held.delete_servers, held.delete_taskservs.len()), (vec!["c-pool-9".to_string()], 0));
        let mut approved = act();
        hold_deletes(&decide(Approval::Manual, Some("ddd"), &p, &status, &[]), "ns", &p, &mut approved);
        assert_eq!((approved.delete_servers.len(), approved.delete_taskservs.len()), (2, 1));
        // An approved respec of the member covers its delete (a rolling replacement), as in the gate.
        let respec = plan("eee", vec![change("Server/ns/c-pool-2", "spec.plan", ChangeAction::Update, "big"), removed.clone()]);
        let before = ClusterStatus { approved_plan: Some(respec), ..Default::default() };
        let mut replaced = act();
        hold_deletes(&decide(Approval::Manual, Some("eee"), &p, &before, &[]), "ns", &p, &mut replaced);
        assert_eq!((replaced.delete_servers.len(), replaced.delete_taskservs.len()), (2, 1));
        let mut automatic = act();
        hold_deletes(&decide(Approval::Automatic, None, &p, &status, &[]), "ns", &p, &mut automatic);
        assert_eq!((automatic.delete_servers.len(), automatic.delete_taskservs.len()), (2, 1));
    }

    #[test]
    fn an_approved_upgrade_does_not_cover_its_rollback() {
        let approved = plan("up", vec![change("TaskServ/ns/c-redis", "spec.version", ChangeAction::Update, "7.2")]);
        let upgrade = change("TaskServ/ns/c-redis on s0", "version", ChangeAction::Update, "7.2");
        let rollback = change("TaskServ/ns/c-redis on s0", "version", ChangeAction::Update, "7.0");
        assert!(covered(&upgrade, &approved));
        assert!(!covered(&rollback, &approved), "a rollback waits for its own approval");
        // With a config change approved too, the rollback is still not covered.
        let both = plan("both", vec![approved.changes[0].clone(), change("TaskServ/ns/c-redis", "spec.config", ChangeAction::Update, "")]);
        assert!(!covered(&rollback, &both));
        // A config change alone covers the re-installs it causes.
        let config = plan("cfg", vec![change("TaskServ/ns/c-redis", "spec.config", ChangeAction::Update, "")]);
        assert!(covered(&change("TaskServ/ns/c-redis on s0", "version", ChangeAction::Update, "7.0"), &config));
    }

    #[test]
    fn one_approval_covers_a_whole_rolling_update() {
        // At approval the Cluster's plan lists the surge Server to create, member 0's own
        // Replace (already respecified) and member 1's respec (held for its turn).
        let mut replace0 = change("Server/ns/c-pool-0", "spec.image", ChangeAction::Replace, "debian-13");
        replace0.reason = "a new image needs a new machine".into();
        let approved = plan(
            "roll",
            vec![
                PlannedChange {
                    reason: super::super::plan::SURGE_REASON.into(),
                    ..change("Server/ns/c-pool-surge-0", "", ChangeAction::Create, "pool pool, plan small")
                },
                replace0.clone(),
                change("Server/ns/c-pool-1", "spec.image", ChangeAction::Update, "debian-13"),
            ],
        );
        // Later, member 1 gets its turn: its own plan is a Replace; the surge Server's machine.
        let mut replace1 = replace0.clone();
        replace1.resource = "Server/ns/c-pool-1".into();
        assert!(covered(&replace1, &approved));
        assert!(covered(&machine("c-pool-surge-0"), &approved));
        // The surge Server leaving its service at the end is covered by its approved Create.
        let leave = change("TaskServ/ns/c-web on c-pool-surge-0", "version", ChangeAction::Delete, "");
        assert!(covered(&leave, &approved));
        let mut other_leave = leave.clone();
        other_leave.resource = "TaskServ/ns/c-web on c-pool-1".into();
        assert!(!covered(&other_leave, &approved), "only the surge Server's");
        let member = plan("m", vec![change("Server/ns/c-pool-3", "", ChangeAction::Create, "pool pool, plan small")]);
        let member_leave = change("TaskServ/ns/c-web on c-pool-3", "version", ChangeAction::Delete, "");
        assert!(!covered(&member_leave, &member), "a member's Create does not cover a service leaving it");
        // Another member, or another image, is not covered.
        let mut other = replace1.clone();
        other.resource = "Server/ns/c-pool-2".into();
        assert!(!covered(&other, &approved));
    }

    #[test]
    fn a_dead_member_is_replaced_under_manual_only_once_approved() {
        let mut dead = change("Server/ns/c-pool-1", "", ChangeAction::Replace, "a new Server and machine");
        dead.from = "machine stopped".into();
        let p = plan("fff", vec![dead]);
        let act = || deleting(&["c-pool-1"], &[]);
        let status = ClusterStatus::default();
        let mut held = act();
        hold_deletes(&decide(Approval::Manual, None, &p, &status, &[]), "ns", &p, &mut held);
        assert!(held.delete_servers.is_empty(), "waits for approval");
        let mut approved = act();
        hold_deletes(&decide(Approval::Manual, Some("fff"), &p, &status, &[]), "ns", &p, &mut approved);
        assert_eq!(approved.delete_servers, ["c-pool-1"]);
        // The approval covers the new member's machine (its own plan: a Create).
        let approved_plan = plan("fff", p.changes.clone());
        assert!(covered(&machine("c-pool-1"), &approved_plan));
        assert!(!covered(&machine("c-pool-2"), &approved_plan));
        // And its pool's services back on it: an install, or a re-install of the version that
        // ran there; an upgrade, a remove or another member is new.
        let on = |server: &str, action, from: &str, to: &str| PlannedChange {
            from: from.into(),
            ..change(&format!("TaskServ/ns/c-redis on {server}"), "version", action, to)
        };
        assert!(covered(&on("c-pool-1", ChangeAction::Create, "", "7.2"), &approved_plan));
        assert!(covered(&on("c-pool-1", ChangeAction::Update, "7.2", "7.2"), &approved_plan));
        assert!(!covered(&on("c-pool-1", ChangeAction::Update, "7.0", "7.2"), &approved_plan), "an upgrade is new");
        assert!(!covered(&on("c-pool-1", ChangeAction::Delete, "7.2", ""), &approved_plan));
        assert!(!covered(&on("c-pool-2", ChangeAction::Update, "7.2", "7.2"), &approved_plan), "another member");
    }

    #[test]
    fn a_held_cluster_says_what_to_approve_and_keeps_its_other_conditions() {
        let t0 = Timestamp::UNIX_EPOCH;
        let cond = |type_: &str, status: &str, reason: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t0),
        };
        let previous = vec![cond("Ready", "False", "Progressing"), cond("ServersReady", "False", "ServersNotReady")];
        let mut status = ClusterStatus {
            observed_generation: Some(1),
            conditions: vec![
                cond("Ready", "True", "Ready"),
                cond("Reconciling", "False", "Idle"),
                cond("Stalled", "False", "NotStalled"),
                cond("ServersReady", "False", "ServersNotReady"),
            ],
            ..Default::default()
        };
        let mut events = vec![PlannedEvent::normal("Ready", "ready"), PlannedEvent::normal("StepStarted", "x")];
        let p = plan("abc123", vec![machine("c-pool-0")]);
        let later = Timestamp::from_second(1_000_000).expect("valid");
        hold(&mut status, &mut events, &previous, crate::approval::waiting_message(&p), later);
        let ready = conditions::find(&status.conditions, condition::READY).expect("Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "AwaitingApproval"));
        assert!(ready.message.contains("provisioning.dev/approve=abc123"), "{}", ready.message);
        assert_eq!(ready.last_transition_time.0, t0, "Ready stayed False: no transition");
        let reconciling = conditions::find(&status.conditions, condition::RECONCILING).expect("Reconciling");
        assert_eq!((reconciling.status.as_str(), reconciling.reason.as_str()), ("True", "AwaitingApproval"));
        assert!(conditions::find(&status.conditions, "ServersReady").is_some());
        assert_eq!(status.phase.as_deref(), Some("AwaitingApproval"));
        assert_eq!(events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), vec!["StepStarted"]);
    }
}
