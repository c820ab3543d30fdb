//! The approval gate of every kind (`approval: Manual`): a plan waits until the annotation
//! `provisioning.dev/approve` names its `status.plan.id`. Pure: the
//! PlanStale Warning is returned as a [`Note`] for the kind's one report of the visit
//! ([`crate::reconcile::report`]).
//!
//! Two shapes of plan go through it:
//! - one carried out at once (a Server's machine: [`gate_once`]) — the approval of the plan
//!   carried out last is not stale, the next plan just waits;
//! - one that shrinks while it is carried out (a TaskServ's servers one by one, a Cluster's
//!   members: [`gate`] / [`gate_with`]) — the approved plan is kept in `status.approvedPlan`
//!   and every later plan of the same spec whose changes it already covers goes on under it.
//!
//! A stale annotation (naming neither the current plan nor the approval in force) is
//! ignored, with one PlanStale Warning naming the current plan id ([`stale`]).
//!
//! An approval leaves a trail ([`approved`]): once the approval of a plan comes into force,
//! one Normal `Approved` Event, one audit log entry and the ChangeRecord name the plan id and
//! who set the annotation ([`Approver`]). Who: the authenticated user, when the API server
//! recorded it in the server-owned `provisioning.dev/approved-by` (the embedded one does; on
//! another API server only an admission webhook could, and a value some client wrote is owned
//! by its field manager and not trusted); else the field manager that owns
//! `provisioning.dev/approve` in managedFields ([`annotation_manager`]) — the name the client
//! chose, and said so in the text. An approval the controller itself passed down (a Cluster
//! approving its members) is not announced again by each member: the Cluster's own Event is
//! the one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use provisioning_crds::{ANNOTATION_APPROVE, Approval, ChangeAction, Plan, PlannedChange};

use crate::reconcile::Note;

pub mod authorize;

/// Reason of `Ready=False` (and the phase) while a plan waits for approval.
pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
/// Event reason of an approval that names another plan than the current one.
pub const PLAN_STALE: &str = "PlanStale";

/// Event reason of an approval coming into force.
pub const APPROVED: &str = "Approved";

/// The `Approved` Event of the approval of `plan_id` coming into force, published with the
/// visit's report; the report names who set the annotation ([`approved_note`]) and records
/// it in the audit log.
pub fn approved(plan_id: &str) -> Note {
    let mut note = Note::normal(APPROVED, "Approve", format!("plan {plan_id} approved"));
    note.approved_plan = Some(plan_id.to_string());
    note
}

/// The plan id whose approval comes into force between the approval in force before a pass
/// (`before`, `status.approvedPlan`) and after it: a new approved id. An approval kept while
/// it is carried out (the same id) is not announced again.
pub fn newly_approved<'a>(before: Option<&Plan>, after: Option<&'a Plan>) -> Option<&'a str> {
    after.map(|a| a.id.as_str()).filter(|id| before.is_none_or(|b| b.id != *id))
}

/// The field manager that last wrote the `provisioning.dev/approve` annotation, from the
/// object's managedFields (the newest entry owning it): the name the client chose, not an
/// authenticated identity. `None` when no entry owns it (managedFields cleared or absent).
pub fn annotation_manager(managed_fields: &[ManagedFieldsEntry]) -> Option<String> {
    let key = format!("f:{ANNOTATION_APPROVE}");
    let owns = |m: &&ManagedFieldsEntry| {
        m.subresource.is_none() && m.fields_v1.as_ref().and_then(|f| f.0.get("f:metadata")?.get("f:annotations")?.get(&key)).is_some()
    };
    managed_fields.iter().filter(owns).max_by_key(|m| m.time.as_ref().map(|t| t.0)).and_then(|m| m.manager.clone())
}

/// The server-owned annotation naming the authenticated user that set
/// `provisioning.dev/approve` (the embedded API server writes it; clients cannot).
pub const ANNOTATION_APPROVED_BY: &str = "provisioning.dev/approved-by";

/// Who set the approval, as far as the API server tells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Approver {
    /// The authenticated user, recorded by the API server in `provisioning.dev/approved-by`.
    pub user: Option<String>,
    /// The field manager owning the annotation (managedFields): the client's chosen name.
    pub field_manager: Option<String>,
}

/// Who approved, from the object's annotations and managedFields: `approved-by` counts only
/// when no field manager owns it (the API server stamped it; a client that wrote it owns it).
pub fn approver(annotations: Option<&std::collections::BTreeMap<String, String>>, managed_fields: &[ManagedFieldsEntry]) -> Approver {
    Approver {
        user: server_stamped(annotations, managed_fields, ANNOTATION_APPROVED_BY),
        field_manager: annotation_manager(managed_fields),
    }
}

/// The server-owned annotation naming the authenticated user whose write made the current
/// spec generation (the embedded API server writes it; clients cannot).
pub const ANNOTATION_CHANGED_BY: &str = "provisioning.dev/changed-by";

/// Whether the API server the controller talks to records who set an approval and who changed
/// a spec (`approved-by`, `approved-by-groups`, `changed-by`) and refuses clients that write
/// them: decided once at start-up ([`set_writers_recorded`]). Until then, and whenever it is
/// not known, nothing a client could have written is trusted.
static WRITERS_RECORDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets whether the API server records writers (see [`WRITERS_RECORDED`]): the embedded
/// control plane does; another API server only with an admission webhook that stamps the
/// annotations (config `api_server_records_writers = true`).
pub fn set_writers_recorded(recorded: bool) {
    WRITERS_RECORDED.store(recorded, std::sync::atomic::Ordering::SeqCst);
}

/// Whether an API server whose `/version` says `git_version` is the embedded control plane
/// (which stamps the annotations and refuses clients that write them).
pub fn version_records_writers(git_version: &str) -> bool {
    git_version.ends_with("+provisioning")
}

/// The value of the server-owned annotation `key` (`approved-by`, `changed-by`): counted only
/// when the API server records it ([`set_writers_recorded`]) and no field manager owns it (a
/// client that wrote it owns it). On another API server a client can write the annotation and
/// then reset managedFields, so there nothing is trusted.
pub fn server_stamped(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    managed_fields: &[ManagedFieldsEntry],
    key: &str,
) -> Option<String> {
    stamped_if(WRITERS_RECORDED.load(std::sync::atomic::Ordering::SeqCst) || cfg!(test), annotations, managed_fields, key)
}

fn stamped_if(
    recorded: bool,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    managed_fields: &[ManagedFieldsEntry],
    key: &str,
) -> Option<String> {
    if !recorded {
        return None;
    }
    let field = format!("f:{key}");
    let owned = managed_fields
        .iter()
        .any(|m| m.fields_v1.as_ref().and_then(|f| f.0.get("f:metadata")?.get("f:annotations")?.get(&field)).is_some());
    annotations.and_then(|a| a.get(key)).filter(|u| !owned && !u.is_empty()).cloned()
}

/// The text of the `Approved` Event of `plan_id` approved by `who`; `None` when the
/// controller itself (field manager `controller_manager`) set it, passing down the approval
/// of a Cluster, whose own Event is the one.
pub fn approved_note(plan_id: &str, who: &Approver, controller_manager: &str) -> Option<String> {
    match (&who.user, &who.field_manager) {
        (_, Some(m)) if m == controller_manager => None,
        (Some(user), _) => Some(format!("plan {plan_id} approved by user {user:?} (authenticated; recorded by the API server)")),
        (None, Some(m)) => Some(format!(
            "plan {plan_id} approved ({ANNOTATION_APPROVE} set by field manager {m:?}: the name the client gave, not an authenticated user)"
        )),
        (None, None) => {
            Some(format!("plan {plan_id} approved ({ANNOTATION_APPROVE} set by an unknown client: no managedFields entry owns it)"))
        }
    }
}

/// Where a plan stands with approval.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Carry it out; `approved` is the approval in force afterwards (`None`: Automatic).
    Go {
        /// The approval in force afterwards.
        approved: Option<Plan>,
    },
    /// Manual approval and no approval covers this plan.
    Wait,
    /// Manual approval and the annotation names neither this plan nor the approval in
    /// force: ignored, with a PlanStale Warning ([`stale`]).
    Stale(String),
}

impl Gate {
    /// Whether the plan goes ahead.
    pub fn goes(&self) -> bool {
        matches!(self, Gate::Go { .. })
    }
}

/// The approval in force: Manual when the Workspace or the object asks for it, else
/// Automatic. An object may tighten its Workspace's approval, never loosen it: its own
/// `approval: Automatic` under a Manual Workspace still waits.
pub fn approval_of(own: Option<Approval>, workspace_default: Option<Approval>) -> Approval {
    if own == Some(Approval::Manual) || workspace_default == Some(Approval::Manual) { Approval::Manual } else { Approval::Automatic }
}

/// Whether two planned changes are the same: resource, action and target.
pub fn same_change(a: &PlannedChange, b: &PlannedChange) -> bool {
    a.resource == b.resource && a.action == b.action && a.to == b.to
}

/// The annotation's value as an approval: trimmed, empty is none.
fn named(annotation: Option<&str>) -> Option<&str> {
    annotation.map(str::trim).filter(|a| !a.is_empty())
}

/// The annotation is the user's text: at most 64 characters of it reach the Warning.
fn stale_id(annotation: &str) -> Gate {
    Gate::Stale(annotation.chars().take(64).collect())
}

/// Whether a plan carried out at once may go under `approval`: Go when Automatic or when the
/// annotation names it; an annotation naming the plan carried out last (`last_applied`) is
/// not stale (the next plan just waits).
pub fn gate_once(approval: Approval, annotation: Option<&str>, plan: &Plan, last_applied: Option<&str>) -> Gate {
    if approval == Approval::Automatic {
        return Gate::Go { approved: None };
    }
    match named(annotation) {
        Some(id) if id == plan.id => Gate::Go { approved: Some(plan.clone()) },
        Some(id) if Some(id) != last_applied => stale_id(id),
        _ => Gate::Wait,
    }
}

/// Whether a plan that shrinks while carried out may go under `approval`, given the
/// annotation's value and the plan approved before (covered: the same change).
pub fn gate(approval: Approval, annotation: Option<&str>, plan: &Plan, approved: Option<&Plan>) -> Gate {
    gate_with(approval, annotation, plan, approved, |c, before| before.changes.iter().any(|b| same_change(b, c)))
}

/// [`gate`] with the kind's own idea of what an approved plan covers (`covered(change,
/// approved)`).
pub fn gate_with(
    approval: Approval,
    annotation: Option<&str>,
    plan: &Plan,
    approved: Option<&Plan>,
    covered: impl Fn(&PlannedChange, &Plan) -> bool,
) -> Gate {
    let annotation = named(annotation);
    if approval == Approval::Automatic {
        return Gate::Go { approved: None };
    }
    if !plan.has_changes() {
        return Gate::Go { approved: approved.cloned() };
    }
    if annotation == Some(plan.id.as_str()) {
        return Gate::Go { approved: Some(plan.clone()) };
    }
    // An approval covers the spec and the inputs it was given for: after a spec change (a new
    // generation) or a change of what the plan reads from other objects (a configFrom Secret)
    // only an approval of the new plan goes.
    let same_generation = |before: &Plan| before.generation.is_none() || before.generation == plan.generation;
    let same_spec = |before: &Plan| same_generation(before) && before.inputs == plan.inputs;
    if let Some(before) = approved.filter(|b| same_spec(b))
        && annotation == Some(before.id.as_str())
        && plan.changes.iter().filter(|c| c.action != ChangeAction::NoOp).all(|c| covered(c, before))
    {
        return Gate::Go { approved: Some(before.clone()) };
    }
    match annotation {
        // Naming the approval kept for this spec is not stale (its plan was approved; the
        // current one waits for its own).
        Some(a) if Some(a) != approved.filter(|b| same_generation(b)).map(|p| p.id.as_str()) => stale_id(a),
        _ => Gate::Wait,
    }
}

/// The message of a plan waiting for approval (Ready's, on every kind).
pub fn waiting_message(plan: &Plan) -> String {
    format!("waiting for approval of plan {}: {} (annotate {ANNOTATION_APPROVE}={} to carry it out)", plan.id, plan.summary, plan.id)
}

/// The PlanStale Warning of a gate: `Some` only for [`Gate::Stale`], naming the approval
/// given and the current plan id.
pub fn stale(gate: &Gate, plan: &Plan) -> Option<Note> {
    let Gate::Stale(id) = gate else { return None };
    let note = format!(
        "approval {id} ({ANNOTATION_APPROVE}) does not match the current plan {}: {}; it is ignored, approve {} to carry out the current plan",
        plan.id, plan.summary, plan.id
    );
    Some(Note::warning(PLAN_STALE, "Approve", note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_count_only_where_the_api_server_records_them() {
        let annotations: std::collections::BTreeMap<String, String> =
            [("provisioning.dev/approved-by".to_string(), "system:admin".to_string())].into();
        // No manager owns it (managedFields reset): trusted on the embedded control plane only.
        assert_eq!(stamped_if(true, Some(&annotations), &[], "provisioning.dev/approved-by").as_deref(), Some("system:admin"));
        assert_eq!(stamped_if(false, Some(&annotations), &[], "provisioning.dev/approved-by"), None);
        assert!(version_records_writers("v1.37.0+provisioning"));
        for other in ["v1.31.2", "v1.30.4-eks-a737599", "v1.29.1+k3s1", "v1.37.0+provisioning-fork", ""] {
            assert!(!version_records_writers(other), "{other}");
        }
    }

    fn plan(id: &str) -> Plan {
        Plan {
            id: id.into(),
            summary: "1 to create".into(),
            changes: vec![PlannedChange {
                resource: "Server/ns/web-0".into(),
                field: String::new(),
                action: ChangeAction::Create,
                from: String::new(),
                to: "small".into(),
                reason: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_plan_carried_out_at_once_goes_when_named_and_the_last_one_is_not_stale() {
        let p = plan("aaa");
        assert_eq!(gate_once(Approval::Automatic, Some("zzz"), &p, None), Gate::Go { approved: None });
        assert_eq!(gate_once(Approval::Manual, Some(" aaa "), &p, None), Gate::Go { approved: Some(p.clone()) });
        assert_eq!(gate_once(Approval::Manual, None, &p, None), Gate::Wait);
        assert_eq!(gate_once(Approval::Manual, Some(""), &p, None), Gate::Wait);
        assert_eq!(gate_once(Approval::Manual, Some("old"), &p, Some("old")), Gate::Wait);
        assert_eq!(gate_once(Approval::Manual, Some(&"x".repeat(100)), &p, None), Gate::Stale("x".repeat(64)));
    }

    fn managed(manager: &str, fields: serde_json::Value, time: i64) -> ManagedFieldsEntry {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            time: Some(Time(k8s_openapi::jiff::Timestamp::from_second(time).expect("time"))),
            ..Default::default()
        }
    }

    #[test]
    fn the_approver_is_the_field_manager_owning_the_annotation_and_is_labelled_so() {
        let approve = serde_json::json!({"f:metadata": {"f:annotations": {"f:provisioning.dev/approve": {}}}});
        let other = serde_json::json!({"f:metadata": {"f:annotations": {"f:note": {}}}, "f:spec": {"f:plan": {}}});
        let fields = [managed("kubectl-client-side-apply", other, 300), managed("kubectl-annotate", approve.clone(), 200)];
        assert_eq!(annotation_manager(&fields).as_deref(), Some("kubectl-annotate"));
        // The newest owner wins; no owner: unknown.
        let both = [managed("kubectl-annotate", approve.clone(), 200), managed("console", approve, 250)];
        assert_eq!(annotation_manager(&both).as_deref(), Some("console"));
        assert_eq!(annotation_manager(&fields[..1]), None);
        let by_manager = |m: &str| Approver { user: None, field_manager: Some(m.into()) };
        let note = approved_note("abc", &by_manager("kubectl-annotate"), "provisioning-controller").expect("a note");
        assert!(note.contains("plan abc approved") && note.contains("field manager \"kubectl-annotate\""), "{note}");
        assert!(note.contains("not an authenticated user"), "{note}");
        assert!(approved_note("abc", &Approver::default(), "provisioning-controller").expect("a note").contains("unknown client"));
        // Passed down by the controller (a Cluster approving its members): no Event of its own.
        assert_eq!(approved_note("abc", &by_manager("provisioning-controller"), "provisioning-controller"), None);
        // The user the API server recorded comes first.
        let user = Approver { user: Some("alice".into()), field_manager: Some("kubectl-annotate".into()) };
        let note = approved_note("abc", &user, "provisioning-controller").expect("a note");
        assert!(note.contains("approved by user \"alice\" (authenticated"), "{note}");
        let event = approved("abc");
        assert_eq!((event.warning, event.reason.as_str(), event.approved_plan.as_deref()), (false, APPROVED, Some("abc")));
    }

    #[test]
    fn approved_by_counts_only_when_no_client_owns_it() {
        let approve = serde_json::json!({"f:metadata": {"f:annotations": {"f:provisioning.dev/approve": {}}}});
        let annotations: std::collections::BTreeMap<String, String> =
            [(ANNOTATION_APPROVE.to_string(), "abc".to_string()), (ANNOTATION_APPROVED_BY.to_string(), "alice".to_string())].into();
        let stamped = [managed("kubectl-annotate", approve.clone(), 200)];
        assert_eq!(
            approver(Some(&annotations), &stamped),
            Approver { user: Some("alice".into()), field_manager: Some("kubectl-annotate".into()) }
        );
        // Written by a client (an API server that does not stamp it): not trusted.
        let forged =
            serde_json::json!({"f:metadata": {"f:annotations": {"f:provisioning.dev/approve": {}, "f:provisioning.dev/approved-by": {}}}});
        let written = [managed("mallory", forged, 200)];
        assert_eq!(approver(Some(&annotations), &written), Approver { user: None, field_manager: Some("mallory".into()) });
    }

    #[test]
    fn an_approval_kept_while_carried_out_is_announced_once() {
        let (a, b) = (plan("aaa"), plan("bbb"));
        assert_eq!(newly_approved(None, Some(&a)), Some("aaa"));
        assert_eq!(newly_approved(Some(&a), Some(&a)), None, "kept: already announced");
        assert_eq!(newly_approved(Some(&a), Some(&b)), Some("bbb"));
        assert_eq!(newly_approved(Some(&a), None), None);
    }

    #[test]
    fn only_a_stale_gate_has_a_warning_and_it_names_both_ids() {
        let p = plan("aaa");
        assert!(stale(&Gate::Wait, &p).is_none());
        assert!(stale(&Gate::Go { approved: None }, &p).is_none());
        let note = stale(&Gate::Stale("zzz".into()), &p).expect("a Warning");
        assert_eq!((note.warning, note.reason.as_str(), note.action), (true, PLAN_STALE, "Approve"));
        assert!(note.note.contains("approval zzz") && note.note.contains("current plan aaa"), "{}", note.note);
        assert!(waiting_message(&p).contains("provisioning.dev/approve=aaa"));
    }
}
