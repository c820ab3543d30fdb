//! Deletion: TaskServs in reverse install order (one goes only when nothing that depends on
//! it is left), then Servers once no TaskServ is left.

use std::collections::BTreeMap;
use std::time::Duration;

use provisioning_crds::{ClusterStatus, LABEL_POOL};

use super::model::{ChildServer, ChildTaskServ, Observed, Phase, Plan, Planned, StepKind, StepState, empty_plan, step_events};
use super::summary::WORDING;
use crate::conditions::{self, Summary};

/// Plans one pass of teardown: TaskServs in reverse install order (one goes only when nothing
/// that depends on it is left), then Servers once no TaskServ is left. Done when the cluster
/// has no children.
pub fn plan_teardown(o: &Observed<'_>, install_order: &[String]) -> Plan {
    let now = crate::taskserv::plan::rfc3339(o.now);
    let mut plan = empty_plan(o, Some(Duration::from_secs(2)));
    let mut steps = Vec::new();
    // Order: the known install order reversed, then anything else by name.
    let mut order: Vec<&ChildTaskServ> = Vec::new();
    for svc in install_order.iter().rev() {
        order.extend(o.taskservs.iter().filter(|t| &t.spec.service == svc));
    }
    let mut rest: Vec<&ChildTaskServ> = o.taskservs.iter().filter(|t| !install_order.contains(&t.spec.service)).collect();
    rest.sort_by_key(|t| t.name.clone());
    order.splice(0..0, rest);
    for t in &order {
        let dependents: Vec<&str> =
            o.taskservs.iter().filter(|u| u.name != t.name && (u.spec.depends_on.contains(&t.name))).map(|u| u.name.as_str()).collect();
        let msg = if dependents.is_empty() {
            if !t.deleting {
                plan.delete_taskservs.push(t.name.clone());
            }
            format!("removing {} from {}", t.spec.service, crate::text::count(t.servers_in_status.len(), "server"))
        } else {
            format!("waiting for {} to be removed first", dependents.join(", "))
        };
        let state = if dependents.is_empty() { StepState::Running } else { StepState::Pending };
        let id = format!("teardown/taskserv/{}", t.spec.service);
        steps.push(Planned::new(id, StepKind::Teardown, format!("TaskServ {}", t.name), state, msg).into_step(&o.status.steps, &now));
    }
    let mut pools: BTreeMap<String, Vec<&ChildServer>> = BTreeMap::new();
    for s in o.servers {
        pools.entry(s.labels.get(LABEL_POOL).cloned().unwrap_or_default()).or_default().push(s);
    }
    for (pool, servers) in &pools {
        let st = if o.taskservs.is_empty() {
            for s in servers {
                if !s.deleting {
                    plan.delete_servers.push(s.name.clone());
                }
            }
            StepState::Running
        } else {
            StepState::Pending
        };
        let msg = format!("{} left", crate::text::count(servers.len(), "server"));
        let step = Planned::new(format!("teardown/servers/{pool}"), StepKind::Teardown, format!("pool {pool}"), st, msg);
        steps.push(step.into_step(&o.status.steps, &now));
    }
    plan.teardown_done = o.taskservs.is_empty() && o.servers.is_empty();
    let msg = format!("deleting: {} TaskServs and {} Servers left", o.taskservs.len(), o.servers.len());
    let conds = Summary::progressing("Deleting", msg).worded(&WORDING);
    let mut merged = conditions::merge(&o.status.conditions, &conds, o.generation, o.now);
    for c in &o.status.conditions {
        if !merged.iter().any(|m| m.type_ == c.type_) {
            merged.push(c.clone());
        }
    }
    step_events(&o.status.steps, &steps, false, &mut plan.events);
    plan.status = ClusterStatus {
        phase: Some(Phase::Deleting.as_str().into()),
        observed_generation: o.generation,
        conditions: merged,
        steps,
        ..o.status.clone()
    };
    plan
}
