//! The Server's side of the approval gate ([`crate::approval`]): under `approval: Manual` a
//! machine to create, a drift remediation or a spec change waits until
//! `provisioning.dev/approve` names its plan id (a plan carried out at once:
//! [`crate::approval::gate_once`], see [`super::plan::gate`]); a stale approval is ignored
//! with a PlanStale Warning in the visit's report.

use provisioning_crds::{Approval, Plan, ServerCost, ServerStatus};

use super::status::{self, Machine};
use super::visit::{End, Visit};
pub use crate::approval::{AWAITING_APPROVAL, PLAN_STALE};
use crate::conditions::Summary;

/// Whether `plan` may be carried out now under `approval`: `false` while it waits (Manual,
/// not approved; the caller ends the visit with [`wait`]). A stale approval adds a PlanStale
/// Warning naming the current plan id to the visit's events, and is ignored. An approval
/// coming into force adds the `Approved` Event ([`newly_approved`]).
pub fn check(visit: &mut Visit<'_>, approval: Approval, plan: &Plan) -> bool {
    let gate = super::plan::gate(visit.server, approval, plan);
    visit.events.extend(crate::approval::stale(&gate, plan));
    visit.events.extend(newly_approved(&gate, visit.server.status.as_ref()).map(crate::approval::approved));
    gate.goes()
}

/// The plan id whose approval comes into force with `gate`: the Server was waiting for it
/// (phase AwaitingApproval). A visit that retries the approved plan after a failure finds
/// another phase, so an approval is announced once.
pub fn newly_approved<'a>(gate: &'a crate::approval::Gate, status: Option<&ServerStatus>) -> Option<&'a str> {
    let crate::approval::Gate::Go { approved: Some(plan) } = gate else { return None };
    let waiting = status.and_then(|s| s.phase.as_deref()) == Some(AWAITING_APPROVAL);
    waiting.then_some(plan.id.as_str())
}

/// Ends the visit waiting for approval of `plan`: the status as the visit learned it
/// (`account`, `machine`) with what `record` adds to it (the machine spec, a drift), Ready=False
/// with reason AwaitingApproval naming the plan, phase AwaitingApproval, the plan and the cost.
pub fn wait(
    visit: &Visit<'_>,
    plan: &Plan,
    cost: &ServerCost,
    (account, machine): (Option<String>, Machine),
    record: impl FnOnce(ServerStatus) -> ServerStatus,
) -> End {
    let summary = Summary::progressing(AWAITING_APPROVAL, crate::approval::waiting_message(plan));
    let status = status::record_cost(record(visit.status(Some(summary), account, None, machine)), cost);
    let mut status = status::record_plan(status, visit.server.status.as_ref(), plan, None, visit.now);
    status.phase = Some(AWAITING_APPROVAL.to_string());
    End::Waiting(Box::new(status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::Gate;

    #[test]
    fn an_approval_is_announced_once_when_the_server_was_waiting_for_it() {
        let plan = Plan { id: "abc".into(), ..Default::default() };
        let go = Gate::Go { approved: Some(plan) };
        let with_phase = |phase: &str| ServerStatus { phase: Some(phase.into()), ..Default::default() };
        assert_eq!(newly_approved(&go, Some(&with_phase(AWAITING_APPROVAL))), Some("abc"));
        // A retry after the approved change failed half-way: already announced.
        assert_eq!(newly_approved(&go, Some(&with_phase("Failed"))), None);
        assert_eq!(newly_approved(&Gate::Go { approved: None }, Some(&with_phase(AWAITING_APPROVAL))), None, "Automatic");
        assert_eq!(newly_approved(&Gate::Wait, Some(&with_phase(AWAITING_APPROVAL))), None);
    }
}
