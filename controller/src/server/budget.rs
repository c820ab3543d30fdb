//! Budget: a Server's cost, and whether its machine may be created under the Workspace's
//! `spec.limits.monthlyBudget`.
//!
//! The check runs before any provider call and only for a Server without a machine: existing
//! machines are never deleted or stopped for budget reasons. It adds this Server's monthly
//! list price to what the namespace already spends — the Servers with a machine, plus older
//! Servers about to get one (not Stalled) — so that of two new Servers racing for the last
//! of the budget, the older one wins. A refused Server is re-checked when the Workspace
//! changes (a raised budget) and when the namespace's total drops (Servers deleted).

use std::sync::Arc;

use kube::ResourceExt;
use provisioning_crds::{MonthlyBudget, Server, ServerCost, UnknownCostPolicy, condition};
use provisioning_providers::SharedProvider;
use provisioning_providers::prices;

use super::dereference::has_machine;
use super::validate::{Invalid, ValidServer};
use crate::cost;
use crate::effective_workspace::EffectiveWorkspace;
use crate::reconcile::Note;

/// Condition reason of a Server refused because of the budget.
pub const BUDGET_EXCEEDED: &str = "BudgetExceeded";
/// Reason of a Server whose cost could not be checked against the budget.
pub const BUDGET_UNCHECKED: &str = "BudgetUnchecked";

/// The outcome of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No budget applies (none set, or the Server already has a machine).
    NotApplicable,
    /// Within the budget.
    Within,
    /// Allowed although the budget could not be checked; the note says why.
    Unchecked(String),
    /// Refused.
    Refused(Invalid),
}

/// Whether `other` counts against the budget when `server` is checked: it has a machine, or
/// it is older and about to get one.
fn counts_against(server: &Server, other: &Server) -> bool {
    if other.uid() == server.uid() || other.metadata.namespace != server.metadata.namespace {
        return false;
    }
    if has_machine(other) {
        return true;
    }
    let key = |s: &Server| (s.metadata.creation_timestamp.as_ref().map(|t| t.0), s.name_any());
    let stalled = other.status.as_ref().is_some_and(|s| crate::conditions::is_true(&s.conditions, condition::STALLED));
    other.metadata.deletion_timestamp.is_none() && !stalled && key(other) < key(server)
}

/// Checks a Server without a machine against the budget (pure). `others`: the namespace's
/// Servers (from the cache; `server` itself is skipped).
pub fn check(server: &Server, own: &ServerCost, budget: Option<&MonthlyBudget>, others: &[Arc<Server>], ws: &str) -> Verdict {
    let Some(budget) = budget else { return Verdict::NotApplicable };
    if has_machine(server) {
        return Verdict::NotApplicable;
    }
    judge(own, budget, others.iter().filter(|o| counts_against(server, o)), ws, "this Server adds", "No machine was created")
}

/// Checks a planned change of an existing machine (a resize or a replacement) against the
/// budget (pure): `now` is what the machine costs, `after` what it would cost. Only a change
/// that raises the price in the same currency is judged — the namespace's other Servers plus
/// `after` — so an existing machine is never refused for what it already costs.
pub fn check_change(
    server: &Server,
    now: &ServerCost,
    after: &ServerCost,
    budget: Option<&MonthlyBudget>,
    others: impl FnOnce() -> Vec<Arc<Server>>,
    ws: &str,
) -> Verdict {
    let Some(budget) = budget else { return Verdict::NotApplicable };
    if let (Some((was, _, before)), Some((will, _, then))) = (cost::amounts(now), cost::amounts(after))
        && was == will
        && then <= before
    {
        return Verdict::NotApplicable;
    }
    let others = others();
    let others = others.iter().filter(|o| o.uid() != server.uid() && o.metadata.namespace == server.metadata.namespace && has_machine(o));
    judge(after, budget, others, ws, "the changed machine costs", "The machine was not changed")
}

/// The budget's verdict on `own` on top of what `others` cost. `adds` and `left` word the
/// refusal ("this Server adds", "No machine was created").
fn judge<'a>(
    own: &ServerCost,
    budget: &MonthlyBudget,
    others: impl Iterator<Item = &'a Arc<Server>>,
    ws: &str,
    adds: &str,
    left: &str,
) -> Verdict {
    let Some(limit) = prices::parse_amount(&budget.amount) else {
        // The schema refuses this; an object stored before the schema did still gets a clear answer.
        return refuse_or_note(budget, format!("spec.limits.monthlyBudget.amount {:?} of {ws} is not a decimal amount", budget.amount));
    };
    let currency = budget.currency.as_str();
    let mut spent = 0u64;
    let mut unknown = Vec::new();
    for other in others {
        match other.status.as_ref().and_then(|s| s.cost.as_ref()).and_then(cost::amounts) {
            Some((c, _, monthly)) if c == currency || monthly == 0 => spent = spent.saturating_add(monthly),
            _ => unknown.push(other.name_any()),
        }
    }
    let own_monthly = match cost::amounts(own) {
        Some((c, _, monthly)) if c == currency || monthly == 0 => monthly,
        Some((c, _, _)) => {
            return refuse_or_note(budget, format!("this Server is priced in {c}, the budget of {ws} is in {currency} (no conversion)"));
        }
        None => return refuse_or_note(budget, format!("this Server's {}", own.message)),
    };
    let would_be = spent.saturating_add(own_monthly);
    let show = |m| prices::display(currency, m);
    if would_be > limit {
        return Verdict::Refused(Invalid {
            reason: BUDGET_EXCEEDED,
            message: format!(
                "monthly cost would be {} (budget {}): {adds} {}/mo on top of the {} the namespace already spends or is about to{}; raise spec.limits.monthlyBudget of {ws} or delete Servers. {left}",
                show(would_be),
                show(limit),
                show(own_monthly),
                show(spent),
                if unknown.is_empty() { String::new() } else { format!(" (not counting {} of unknown cost)", unknown.join(", ")) },
            ),
        });
    }
    if !unknown.is_empty() {
        return refuse_or_note(budget, format!("the cost of {} is unknown", unknown.join(", ")));
    }
    Verdict::Within
}

fn refuse_or_note(budget: &MonthlyBudget, why: String) -> Verdict {
    let message = format!("monthly budget {} {} could not be checked: {why}", budget.amount, budget.currency);
    match budget.unknown_cost {
        UnknownCostPolicy::Allow => Verdict::Unchecked(format!("{message} (allowed: unknownCost is Allow)")),
        UnknownCostPolicy::Refuse => {
            Verdict::Refused(Invalid { reason: BUDGET_UNCHECKED, message: format!("{message} (refused: unknownCost is Refuse)") })
        }
    }
}

/// The Server's cost for `plan` (its provider's price table), and the budget's verdict on
/// creating its machine (pure; `others`: the Servers of its namespace). A refusal carries the
/// cost too, for the status it is recorded in. An allowed unchecked Server gets a note in its
/// cost and, once, a Warning (added to the visit's `events`).
pub fn gate(
    server: &Server,
    ws: &EffectiveWorkspace,
    valid: &ValidServer,
    provider: &SharedProvider,
    others: impl FnOnce() -> Vec<Arc<Server>>,
    events: &mut Vec<Note>,
) -> Result<ServerCost, Box<(Invalid, ServerCost)>> {
    let mut own = cost::server_cost(&cost::machine_price(provider.as_ref(), &valid.resolved_plan, &valid.zone, &valid.disks));
    let budget = ws.spec.limits.monthly_budget.as_ref();
    if budget.is_none() || has_machine(server) {
        return Ok(own);
    }
    // The namespace's other Servers only when a budget is to be checked: collecting them on
    // every visit made each visit O(Servers) and a rollout of n Servers O(n²) (issue 31).
    match check(server, &own, budget, &others(), &ws.display()) {
        Verdict::NotApplicable | Verdict::Within => Ok(own),
        Verdict::Refused(invalid) => Err(Box::new((invalid, own))),
        Verdict::Unchecked(note) => {
            let noted_before = server.status.as_ref().and_then(|s| s.cost.as_ref()).is_some_and(|c| c.message.contains(&note));
            if !noted_before {
                events.push(Note::warning(BUDGET_UNCHECKED, "Validate", note.clone()));
            }
            own.message = if own.message.is_empty() { note } else { format!("{}; {note}", own.message) };
            Ok(own)
        }
    }
}

/// Whether a Server waits for budget (Stalled with BudgetExceeded or BudgetUnchecked): what a
/// drop of its namespace's total re-triggers.
pub fn waiting_for_budget(server: &Server) -> bool {
    server.status.as_ref().is_some_and(|s| {
        crate::conditions::find(&s.conditions, condition::STALLED)
            .is_some_and(|c| c.status == "True" && (c.reason == BUDGET_EXCEEDED || c.reason == BUDGET_UNCHECKED))
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use provisioning_crds::{ServerSpec, ServerStatus};

    use super::*;

    fn server(name: &str, age: i64, machine: bool, plan: &str) -> Arc<Server> {
        let mut s = Server::new(name, ServerSpec::default());
        s.metadata.namespace = Some("team".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_700_000_000 + age).unwrap_or_default()));
        s.status = Some(ServerStatus {
            provider_id: machine.then(|| format!("aws://i-{name}")),
            cost: Some(cost::server_cost(&prices::aws("eu-north-1", plan))),
            ..Default::default()
        });
        Arc::new(s)
    }

    fn budget(amount: &str, unknown_cost: UnknownCostPolicy) -> MonthlyBudget {
        MonthlyBudget { amount: amount.into(), currency: "USD".into(), unknown_cost }
    }

    fn own(s: &Server) -> ServerCost {
        s.status.as_ref().and_then(|s| s.cost.clone()).unwrap_or_default()
    }

    #[test]
    fn refuses_a_machine_that_would_take_the_total_over_the_budget() {
        let running = [server("a", 0, true, "t3.small"), server("b", 1, true, "t3.small")];
        let next = server("c", 2, false, "t3.small");
        // 3 × 15.77 = 47.31 > 40.
        let Verdict::Refused(refused) = check(&next, &own(&next), Some(&budget("40", UnknownCostPolicy::Allow)), &running, "ws") else {
            panic!("not refused")
        };
        assert_eq!(refused.reason, BUDGET_EXCEEDED);
        assert!(refused.message.contains("monthly cost would be $47.31 (budget $40.00)"), "{}", refused.message);
        assert!(
            refused.message.contains("this Server adds $15.77/mo") && refused.message.ends_with("No machine was created"),
            "{}",
            refused.message
        );
        assert_eq!(check(&next, &own(&next), Some(&budget("47.31", UnknownCostPolicy::Allow)), &running, "ws"), Verdict::Within);
        assert_eq!(check(&next, &own(&next), None, &running, "ws"), Verdict::NotApplicable);
        // Machines that exist are never judged.
        assert_eq!(
            check(&running[0], &own(&running[0]), Some(&budget("1", UnknownCostPolicy::Refuse)), &running, "ws"),
            Verdict::NotApplicable
        );
    }

    #[test]
    fn a_change_that_raises_the_price_over_the_budget_is_refused() {
        let running = [server("a", 0, true, "t3.small"), server("b", 1, true, "t3.small")];
        let medium = cost::server_cost(&prices::aws("eu-north-1", "t3.medium"));
        let limit = budget("40", UnknownCostPolicy::Allow);
        // b resized to t3.medium: 15.77 + 31.54 = 47.31 > 40.
        let Verdict::Refused(refused) = check_change(&running[1], &own(&running[1]), &medium, Some(&limit), || running.to_vec(), "ws")
        else {
            panic!("not refused")
        };
        assert_eq!(refused.reason, BUDGET_EXCEEDED);
        assert!(refused.message.contains("$47.31") && refused.message.ends_with("The machine was not changed"), "{}", refused.message);
        assert_eq!(
            check_change(&running[1], &own(&running[1]), &medium, Some(&budget("50", UnknownCostPolicy::Allow)), || running.to_vec(), "ws"),
            Verdict::Within
        );
        // Not more expensive (or no budget): never judged, even over the budget.
        let tiny = budget("1", UnknownCostPolicy::Refuse);
        assert_eq!(check_change(&running[1], &medium, &own(&running[1]), Some(&tiny), || running.to_vec(), "ws"), Verdict::NotApplicable);
        assert_eq!(check_change(&running[1], &own(&running[1]), &medium, None, || running.to_vec(), "ws"), Verdict::NotApplicable);
    }

    #[test]
    fn older_pending_servers_count_and_younger_or_stalled_ones_do_not() {
        let me = server("me", 5, false, "t3.small");
        let older = server("older", 1, false, "t3.small");
        let younger = server("younger", 9, false, "t3.small");
        let limit = budget("20", UnknownCostPolicy::Allow);
        assert!(matches!(check(&me, &own(&me), Some(&limit), std::slice::from_ref(&older), "ws"), Verdict::Refused(_)));
        assert_eq!(check(&me, &own(&me), Some(&limit), &[younger, me.clone()], "ws"), Verdict::Within);
        let mut stalled = (*older).clone();
        if let Some(s) = stalled.status.as_mut() {
            s.conditions = vec![provisioning_crds::Condition {
                type_: "Stalled".into(),
                status: "True".into(),
                reason: BUDGET_EXCEEDED.into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::from_second(1_700_000_000).unwrap_or_default()),
                observed_generation: None,
            }];
        }
        assert!(waiting_for_budget(&stalled));
        assert_eq!(check(&me, &own(&me), Some(&limit), &[Arc::new(stalled)], "ws"), Verdict::Within);
    }

    #[test]
    fn unknown_costs_are_allowed_with_a_note_or_refused_when_configured() {
        let me = server("me", 5, false, "m7i.large");
        let Verdict::Unchecked(note) = check(&me, &own(&me), Some(&budget("100", UnknownCostPolicy::Allow)), &[], "ws") else {
            panic!("not unchecked")
        };
        assert!(note.contains("could not be checked") && note.contains("m7i.large"), "{note}");
        let Verdict::Refused(refused) = check(&me, &own(&me), Some(&budget("100", UnknownCostPolicy::Refuse)), &[], "ws") else {
            panic!("not refused")
        };
        assert_eq!(refused.reason, BUDGET_UNCHECKED);
        // Another currency is never converted: unchecked.
        let eur = MonthlyBudget { currency: "EUR".into(), ..budget("100", UnknownCostPolicy::Allow) };
        let me = server("me", 5, false, "t3.small");
        assert!(matches!(check(&me, &own(&me), Some(&eur), &[], "ws"), Verdict::Unchecked(n) if n.contains("USD")));
        // A known excess is refused even when other costs are unknown.
        let odd = server("odd", 0, true, "m7i.large");
        let big = server("big", 1, true, "t3.xlarge");
        let Verdict::Refused(r) = check(&me, &own(&me), Some(&budget("50", UnknownCostPolicy::Allow)), &[odd, big], "ws") else {
            panic!("not refused")
        };
        assert!(r.message.contains("odd"), "{}", r.message);
    }
}
