//! Spec changes: how a Server's plan ([`super::plan::spec_plan`]) against the machine just
//! observed is recorded (`status.plan`, `Drifted=True` SpecChanged with one Normal Event per plan),
//! carried out ([`carry`]: refused by updatePolicy or the budget, waiting for approval
//! ([`super::approval`]), or applied in place or by replacement) and settled once carried out
//! or reverted.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{Approval, Plan, Server, ServerStatus, condition};
use provisioning_providers::ProviderId;

use super::drift::{REMEDIATED, SPEC_CHANGED, SPEC_REVERTED};
use super::prepare::Prepared;
use super::status::{self, Machine};
use super::visit::{End, Visit};
use super::{act, approval, budget, plan};
use crate::conditions::{self, Summary};
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
    let observed = status::record_machine_spec(observed, server.status.as_ref(), &valid.zone, &valid.image);
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
    let after = crate::cost::server_cost(&p.provider.price(&valid.resolved_plan, &valid.zone));
    let others: Vec<Arc<Server>> =
        ctx.stores.servers.state().into_iter().filter(|s| s.metadata.namespace == server.metadata.namespace).collect();
    if let budget::Verdict::Refused(invalid) =
        budget::check_change(server, &cost, &after, ws.spec.limits.monthly_budget.as_ref(), &others, &ws.display())
    {
        return Err(refused(invalid.reason, invalid.message));
    }
    if !approval::check(visit, approval, &plan) {
        let waiting = visit.status(Some(approval::waiting_summary(&plan)), Some(valid.account.name.clone()), None, machine);
        let waiting = status::record_machine_spec(waiting, server.status.as_ref(), &valid.zone, &valid.image);
        return Err(approval::wait(visit, waiting, &plan, &cost));
    }
    // Checkpoint: Drifted=True (SpecChanged) and status.plan are written before the machine
    // is touched, so a crash mid-change leaves the change on record.
    let changing = visit.status(Some(Summary::progressing(SPEC_CHANGED, describe(&plan))), None, None, machine);
    let changing = status::record_machine_spec(changing, server.status.as_ref(), &valid.zone, &valid.image);
    visit.checkpoint(record(changing, server.status.as_ref(), &plan, None, visit.now), ctx).await?;
    let account = Some(valid.account.name.as_str());
    let obs = match carry {
        plan::Carry::Update => {
            act::update(server, &id, valid, ws, &p.provider, ctx).await.map_err(|e| End::failed(Step::Act, e, account))?
        }
        _ => match act::replace(server, &id, valid, p.login_key.as_deref(), ws, &p.provider, ctx).await {
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
    crate::reconcile::Note::normal(SPEC_CHANGED, "Plan", describe(plan))
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
    super::drift::set_drifted(status, previous, (value, reason, &message), now)
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
