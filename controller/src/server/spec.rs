//! Spec changes and approval: how a Server's plan ([`super::plan::spec_plan`]) is recorded
//! (`status.plan`, `Drifted=True` SpecChanged with one Warning per plan), gated
//! (`approval: Manual` waits for `provisioning.dev/approve: <plan id>`; a stale approval is
//! ignored with a PlanStale Warning) and settled once carried out or reverted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use provisioning_crds::{ANNOTATION_APPROVE, Approval, Plan, Server, ServerStatus, condition};

use super::drift::{REMEDIATED, SPEC_CHANGED, SPEC_REVERTED};
use super::plan::{Gate, gate};
use crate::conditions::{self, Summary};
use crate::context::Context;

/// Phase of a Server whose plan waits for approval.
pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
/// Event reason of an approval that names another plan than the current one.
pub const PLAN_STALE: &str = "PlanStale";

/// The message of a plan waiting for approval.
pub fn waiting_message(plan: &Plan) -> String {
    format!("waiting for approval of plan {}: {} (annotate {ANNOTATION_APPROVE}={} to carry it out)", plan.id, plan.summary, plan.id)
}

/// One line describing a plan's field changes: "spec.plan cpu1-mem1g → cpu2-mem2g (update)".
pub fn describe(plan: &Plan) -> String {
    let fields: Vec<String> = plan
        .changes
        .iter()
        .filter(|c| !c.field.is_empty())
        .map(|c| format!("{} {} → {} ({})", c.field, if c.from.is_empty() { "\"\"" } else { &c.from }, c.to, c.action.verb()))
        .collect();
    format!("{}: {}", fields.join(", "), plan.summary)
}

/// Records `plan` in `status` and sets `Drifted` from it: True (SpecChanged) while the spec
/// asks for changes to an existing machine, False once carried out (`applied`) or when the
/// spec was changed back. `lastTransitionTime` moves only on a flip.
pub fn record(
    mut status: ServerStatus,
    previous: Option<&ServerStatus>,
    plan: &Plan,
    applied: Option<&Plan>,
    now: Timestamp,
) -> ServerStatus {
    status.plan = Some(plan.clone());
    if let Some(applied) = applied {
        status.last_applied_plan = Some(applied.id.clone());
    }
    let before = previous.and_then(|p| conditions::find(&p.conditions, condition::DRIFTED));
    let spec_drift = before.is_some_and(|c| c.status == "True" && c.reason == SPEC_CHANGED);
    let machine_change = plan.changes.iter().any(|c| !c.field.is_empty());
    let (value, reason, message) = if machine_change {
        ("True", SPEC_CHANGED, format!("the machine does not match the spec: {}", describe(plan)))
    } else if let Some(applied) = applied.filter(|a| a.changes.iter().any(|c| !c.field.is_empty())) {
        ("False", REMEDIATED, format!("plan {} carried out: {}", applied.id, describe(applied)))
    } else if spec_drift {
        ("False", SPEC_REVERTED, "the spec matches the machine again".to_string())
    } else {
        return status;
    };
    let last = before.filter(|c| c.status == value).map(|c| c.last_transition_time.clone()).unwrap_or(Time(now));
    let drifted = Condition {
        type_: condition::DRIFTED.to_string(),
        status: value.to_string(),
        reason: reason.to_string(),
        message: conditions::truncate(&message, 1024),
        observed_generation: status.observed_generation,
        last_transition_time: last,
    };
    match status.conditions.iter_mut().find(|c| c.type_ == condition::DRIFTED) {
        Some(c) => *c = drifted,
        None => status.conditions.push(drifted),
    }
    status
}

/// Whether the SpecChanged Warning for `plan` is due: once per plan id.
pub fn warning_due(server: &Server, plan: &Plan) -> bool {
    server.status.as_ref().and_then(|s| s.plan.as_ref()).is_none_or(|p| p.id != plan.id || !p.has_changes())
}

/// Whether `plan` may be carried out now under `approval`: `false` while it waits (Manual,
/// not approved; the caller writes [`waiting_summary`]). A stale approval is reported with
/// a PlanStale Warning naming the current plan id, and ignored.
pub async fn check(server: &Server, approval: Approval, plan: &Plan, ctx: &Context) -> bool {
    match gate(server, approval, plan) {
        Gate::Go => true,
        Gate::Wait => false,
        Gate::Stale(id) => {
            let note = format!(
                "approval {id} ({ANNOTATION_APPROVE}) does not match the current plan {}: {}; it is ignored, approve {} to carry out the current plan",
                plan.id, plan.summary, plan.id
            );
            ctx.publish(server, EventType::Warning, PLAN_STALE, "Approve", Some(note)).await;
            false
        }
    }
}

/// The summary of a Server waiting for approval of `plan`: Ready=False, reason
/// AwaitingApproval, the message naming the plan.
pub fn waiting_summary(plan: &Plan) -> Summary {
    Summary::progressing(AWAITING_APPROVAL, waiting_message(plan))
}

/// Marks `status` as waiting (phase AwaitingApproval).
pub fn waiting(mut status: ServerStatus) -> ServerStatus {
    status.phase = Some(AWAITING_APPROVAL.to_string());
    status
}
