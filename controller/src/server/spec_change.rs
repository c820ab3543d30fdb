//! Spec changes: how a Server's plan ([`super::plan::spec_plan`]) against the machine just
//! observed is recorded (`status.plan`, `Drifted=True` SpecChanged with one Normal Event per plan),
//! carried out ([`carry`]: refused by updatePolicy or the budget, waiting for approval
//! ([`super::approval`]), or applied in place or by replacement) and settled once carried out
//! or reverted.

use provisioning_crds::{Approval, Plan, Server};
use provisioning_providers::ProviderId;

use super::drift::SPEC_CHANGED;
use super::prepare::Prepared;
use super::status::{self, Machine};
use super::visit::{End, Visit};
use super::{act, approval, budget, plan};
use crate::conditions::Summary;
use crate::context::Context;
use crate::effective_workspace::EffectiveWorkspace;
use crate::error::Step;

/// Condition reason: spec.updatePolicy forbids what a spec change needs.
pub const UPDATE_REFUSED: &str = "UpdateRefused";

/// Plans plan/zone/image changes against the machine just observed and carries them out;
/// continues with the machine and the plan carried out, if any. The SpecChanged Event is
/// due once per plan; a change is refused (updatePolicy, the budget: Stalled), kept waiting
/// (Manual approval), or applied in place or by replacement.
pub async fn carry(
    visit: &mut Visit<'_>,
    p: &Prepared,
    approval: Approval,
    machine: Machine,
    ws: &EffectiveWorkspace,
    ctx: &Context,
) -> Result<(Machine, Option<Plan>), End> {
    let server = visit.server;
    let valid = &p.valid;
    let observed = visit.status(None, Some(valid.account.name.clone()), Some(valid.resolved_plan.clone()), machine.clone());
    let observed = status::record_machine_spec(observed, server.status.as_ref(), &valid.zone, &valid.image, &valid.disks);
    let Some(id) = observed.provider_id.clone().map(ProviderId) else { return Ok((machine, None)) };
    let planned = p.plan(server, Some(&observed));
    let carry = planned.carry.clone();
    if matches!(carry, plan::Carry::Nothing | plan::Carry::Create) {
        return Ok((machine, None));
    }
    let plan = planned.plan;
    // Until the change is carried out the machine costs what its observed plan costs.
    let cost = p.machine_cost(&observed);
    if warning_due(server, &plan) {
        visit.events.push(spec_changed(&plan));
    }
    let refused = |reason, message| End::Stalled {
        step: Step::Act,
        reason,
        message,
        plan: Some(Box::new(plan.clone())),
        cost: Some(Box::new(cost.clone())),
    };
    if let plan::Carry::Refused(message) = carry {
        return Err(refused(UPDATE_REFUSED, message));
    }
    // A change that raises the price is held to the monthly budget, as a new machine is.
    let after = crate::cost::server_cost(&crate::cost::machine_price(p.provider.as_ref(), &valid.resolved_plan, &valid.zone, &valid.disks));
    let others = || ctx.stores.servers.state().into_iter().filter(|s| s.metadata.namespace == server.metadata.namespace).collect();
    if let budget::Verdict::Refused(invalid) =
        budget::check_change(server, &cost, &after, ws.spec.limits.monthly_budget.as_ref(), others, &ws.display())
    {
        return Err(refused(invalid.reason, invalid.message));
    }
    if !approval::check(visit, approval, &plan) {
        let spec = |s| status::record_machine_spec(s, server.status.as_ref(), &valid.zone, &valid.image, &valid.disks);
        return Err(approval::wait(visit, &plan, &cost, (Some(valid.account.name.clone()), machine), spec));
    }
    // Checkpoint: Drifted=True (SpecChanged) and status.plan are written before the machine
    // is touched, so a crash mid-change leaves the change on record.
    let changing = visit.status(Some(Summary::progressing(SPEC_CHANGED, status::describe_plan(&plan))), None, None, machine);
    let changing = status::record_machine_spec(changing, server.status.as_ref(), &valid.zone, &valid.image, &valid.disks);
    visit.checkpoint(status::record_plan(changing, server.status.as_ref(), &plan, None, visit.now), ctx).await?;
    let account = Some(valid.account.name.as_str());
    let obs = match carry {
        plan::Carry::Update => {
            act::update(server, &id, p, ws, ctx, &mut visit.events).await.map_err(|e| End::failed(Step::Act, e, account))?
        }
        _ => match act::replace(server, &id, p, ws, ctx, &mut visit.events).await {
            Ok(act::Acted::Machine(obs)) => obs,
            Ok(other) => {
                let e = crate::error::Error::InProgress(format!("replacing machine {id}: {other:?}"));
                return Err(End::failed(Step::Act, e, account));
            }
            Err(e) => return Err(End::failed(Step::Act, e, account)),
        },
    };
    Ok((Machine::Observed(obs), Some(plan)))
}

/// The SpecChanged Event of `plan`: Normal (the user changed the spec on purpose; what fails
/// carrying it out has its own Warning), about the Server itself, so its note does not name it.
pub fn spec_changed(plan: &Plan) -> crate::reconcile::Note {
    crate::reconcile::Note::normal(SPEC_CHANGED, "Plan", status::describe_plan(plan))
}

/// Whether the SpecChanged Event for `plan` is due: once per plan id.
pub fn warning_due(server: &Server, plan: &Plan) -> bool {
    server.status.as_ref().and_then(|s| s.plan.as_ref()).is_none_or(|p| p.id != plan.id || !p.has_changes())
}

#[cfg(test)]
mod tests {
    use provisioning_crds::{ChangeAction, PlannedChange};

    use super::*;

    #[test]
    fn a_spec_change_is_a_normal_event_that_does_not_repeat_the_kind() {
        let plan = Plan {
            id: "abc".into(),
            summary: "1 to update".into(),
            changes: vec![PlannedChange {
                resource: "Server/demo/web-0".into(),
                field: "spec.plan".into(),
                action: ChangeAction::Update,
                from: "small".into(),
                to: "medium".into(),
                reason: String::new(),
            }],
            ..Default::default()
        };
        let note = spec_changed(&plan);
        assert!(!note.warning, "a change the user made on purpose is not a Warning");
        assert_eq!(note.reason, SPEC_CHANGED);
        assert!(!note.note.contains("Server Server/"), "{}", note.note);
        assert!(note.note.starts_with("spec.plan small → medium (update)"), "{}", note.note);
    }
}
