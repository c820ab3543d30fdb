//! The end of a pass: `failurePolicy` on failed steps, then where the Cluster stands —
//! conditions (kstatus through [`Summary`], plus ServersReady and TaskServsReady), phase,
//! events, the status to write and when to look again. Also the refusal of an invalid spec.

use std::collections::BTreeSet;
use std::time::Duration;

use provisioning_crds::{ClusterServerCounts, ClusterStatus, FailurePolicy, condition};

use super::model::{ChildTaskServ, Observed, Phase, Plan, PlannedEvent, REASON_ROLLED_BACK, StepState, empty_plan, step_events};
use super::steps::Rollout;
use crate::cluster::validate::{InvalidCluster, ServicePlan};
use crate::conditions::{self, DesiredCondition, Status, Summary, Wording};
use crate::planning::{REASON_DEPENDENCY_CYCLE, REASON_DEPENDENCY_MISSING};

/// The Cluster's words on the quiet side of Ready/Reconciling/Stalled.
pub(super) const WORDING: Wording =
    Wording { idle: ("Idle", ""), idle_when_stalled: ("Stalled", ""), not_stalled: ("NotStalled", ""), progressing_reason: None };

/// Requeue of a Ready or Stalled Cluster: children's changes trigger it anyway.
const SETTLED_REQUEUE: Duration = Duration::from_secs(300);
/// Requeue while rolling out (or waiting for other Clusters, which do not trigger it).
const ROLLOUT_REQUEUE: Duration = Duration::from_secs(10);

/// A refused spec: Stalled with the validation's reason and message, nothing planned.
pub(super) fn invalid(o: &Observed<'_>, e: &InvalidCluster) -> Plan {
    let mut conds = Summary::stalled(e.reason, e.message.clone()).worded(&WORDING);
    conds.push(DesiredCondition::new(condition::SERVERS_READY, Status::Unknown, "NotPlanned", "the spec is invalid"));
    conds.push(DesiredCondition::new(condition::TASKSERVS_READY, Status::Unknown, "NotPlanned", "the spec is invalid"));
    // A dependsOn cycle may be broken on another Cluster, which does not trigger this one.
    let requeue = if e.reason == REASON_DEPENDENCY_CYCLE { ROLLOUT_REQUEUE } else { SETTLED_REQUEUE };
    let mut plan = empty_plan(o, Some(requeue));
    if !conditions::find(&o.status.conditions, condition::STALLED).is_some_and(|c| c.status == "True" && c.message == e.message) {
        plan.events.push(PlannedEvent::warning(e.reason, e.message.clone()));
    }
    plan.status = ClusterStatus {
        phase: Some(Phase::Failed.as_str().into()),
        observed_generation: o.generation,
        conditions: conditions::merge(&o.status.conditions, &conds, o.generation, o.now),
        ..o.status.clone()
    };
    plan
}

/// `failurePolicy` on the failed steps: the `(reason, message)` the Cluster is Stalled with.
fn apply_failure_policy(o: &Observed<'_>, r: &mut Rollout, plan: &mut Plan) -> Option<(String, String)> {
    if let Some(msg) = &r.rolled_back {
        super::model::rollback_machines(o, &mut plan.apply_servers);
        rollback_children(o, plan);
        return Some((REASON_ROLLED_BACK.to_string(), msg.clone()));
    }
    let failed: Vec<_> = r.steps.iter().filter(|s| StepState::of(s) == Some(StepState::Failed)).collect();
    if failed.is_empty() {
        return None;
    }
    let msg = failed.iter().map(|s| format!("step {} failed: {}", s.id, s.message)).collect::<Vec<_>>().join("; ");
    if o.spec.failure_policy == FailurePolicy::Rollback {
        plan.apply_servers.clear();
        plan.apply_taskservs.clear();
        let stuck = super::model::rollback_machines(o, &mut plan.apply_servers);
        let msg = if stuck.is_empty() {
            format!("{msg}; rolled back (failurePolicy Rollback)")
        } else {
            format!(
                "{msg}; rolled back (failurePolicy Rollback) except the machines of pool {}: every member already had the new spec, none is left on the old one to go back to",
                stuck.join(", ")
            )
        };
        r.events.push(PlannedEvent::warning("RollingBack", msg.clone()));
        rollback_children(o, plan);
        return Some((REASON_ROLLED_BACK.to_string(), msg));
    }
    // Stalled when a failure will not heal by itself: a Stalled child.
    let stalled_child = failed.iter().any(|s| r.stalled_steps.contains(&s.id)) || o.servers.iter().any(|sv| sv.stalled.is_some());
    stalled_child.then(|| ("StepFailed".to_string(), msg))
}

/// Finishes the plan: failure policy, conditions, phase, events, status and requeue.
pub(super) fn summarize(o: &Observed<'_>, services: &[ServicePlan], mut r: Rollout, mut plan: Plan) -> Plan {
    let stalled = apply_failure_policy(o, &mut r, &mut plan);
    let desired_count = r.members;
    let ready_count = r.ready_count;
    let servers_ready = ready_count == desired_count && r.extra_servers == 0 && !r.rolling;
    let ts_ready_count = services.iter().filter(|s| r.succeeded(&format!("taskserv/{}", s.service))).count();
    let ts_ready = ts_ready_count == services.len() && r.drained_taskservs == 0;
    let ready = stalled.is_none() && r.waiting_for.is_empty() && servers_ready && ts_ready;

    let mut conds = if ready {
        let msg =
            format!("{} and {} ready", crate::text::count(desired_count as usize, "server"), crate::text::count(services.len(), "service"));
        Summary::ready("Ready", msg).worded(&WORDING)
    } else if let Some((reason, msg)) = &stalled {
        Summary::stalled(reason, msg.clone()).worded(&WORDING)
    } else {
        let reason = match (r.waiting_for.is_empty(), r.dependency_missing) {
            (true, _) => "Progressing",
            (false, true) => REASON_DEPENDENCY_MISSING,
            (false, false) => "WaitingForClusters",
        };
        Summary::progressing(reason, progress_message(&r)).worded(&WORDING)
    };
    conds.push(DesiredCondition::new(
        condition::SERVERS_READY,
        Status::from_bool(servers_ready),
        if servers_ready {
            "ServersReady"
        } else if r.rolling {
            "RollingUpdate"
        } else {
            "ServersNotReady"
        },
        if r.rolling {
            format!("{ready_count}/{desired_count} servers ready, {}/{desired_count} updated", r.updated_count)
        } else {
            format!("{ready_count}/{desired_count} servers ready")
        },
    ));
    conds.push(DesiredCondition::new(
        condition::TASKSERVS_READY,
        Status::from_bool(ts_ready),
        if ts_ready { "TaskServsReady" } else { "TaskServsNotReady" },
        format!("{ts_ready_count}/{} services ready", services.len()),
    ));

    let phase = if ready {
        Phase::Ready
    } else if stalled.is_some() {
        Phase::Failed
    } else if !r.waiting_for.is_empty() {
        Phase::Pending
    } else if r.rolling {
        Phase::Provisioning
    } else if !servers_ready && o.status.phase.as_deref() == Some(Phase::Ready.as_str()) {
        Phase::Degraded
    } else if !servers_ready {
        Phase::Provisioning
    } else {
        Phase::Installing
    };

    let mut events = std::mem::take(&mut r.events);
    step_events(&o.status.steps, &r.steps, o.status.observed_generation != o.generation, &mut events);
    if ready && !conditions::is_true(&o.status.conditions, condition::READY) {
        events.push(PlannedEvent::normal("Ready", conds[0].message.clone()));
    }
    plan.status = ClusterStatus {
        phase: Some(phase.as_str().to_string()),
        observed_generation: o.generation,
        conditions: conditions::merge(&o.status.conditions, &conds, o.generation, o.now),
        servers: Some(ClusterServerCounts {
            desired: desired_count,
            ready: ready_count,
            summary: format!("{ready_count}/{desired_count}"),
            updated: format!("{}/{desired_count}", r.updated_count),
        }),
        taskservs: r.taskserv_statuses,
        steps: r.steps,
        cost: o.status.cost.clone(),
        // Set by the reconciler over the children it observed (see super::model::cluster_plan), and
        // the approval in force (crate::cluster::approval).
        plan: o.status.plan.clone(),
        approved_plan: o.status.approved_plan.clone(),
        control_plane_endpoint: o.status.control_plane_endpoint.clone(),
    };
    plan.events = events;
    // Ready or Stalled: children's changes trigger us anyway; else poll while rolling out.
    plan.requeue = Some(if ready || stalled.is_some() { SETTLED_REQUEUE } else { ROLLOUT_REQUEUE });
    plan
}

/// What the Cluster waits for: other Clusters, else the first running (or failed) step, else
/// the first pending one.
fn progress_message(r: &Rollout) -> String {
    let running = r.steps.iter().find(|s| matches!(StepState::of(s), Some(StepState::Running | StepState::Failed)));
    if !r.waiting_for.is_empty() {
        format!("waiting for {}", r.waiting_for.join(", "))
    } else if let Some(s) = running.or_else(|| r.steps.iter().find(|s| StepState::of(s) == Some(StepState::Pending))) {
        format!("{}: {}", s.id, s.message)
    } else {
        String::new()
    }
}

/// Children a failed rollout added and that never worked are removed: TaskServs never Ready
/// and Servers not Ready. TaskServs that were Ready before roll their own version back
/// (`rollbackOnFailure`).
fn rollback_children(o: &Observed<'_>, plan: &mut Plan) {
    let doomed_ts: Vec<&ChildTaskServ> = o.taskservs.iter().filter(|t| t.owned && !t.was_ever_ready && !t.deleting).collect();
    for t in &doomed_ts {
        if !plan.delete_taskservs.contains(&t.name) {
            plan.delete_taskservs.push(t.name.clone());
        }
    }
    let doomed: BTreeSet<&str> = doomed_ts.iter().map(|t| t.name.as_str()).collect();
    // Members put back on their old machine spec existed before the rollout: they stay.
    let desired = super::model::desired_servers(o);
    let rolled_back = |s: &super::model::ChildServer| {
        plan.apply_servers.iter().any(|a| a.metadata.name.as_deref() == Some(s.name.as_str()))
            || desired
                .iter()
                .any(|d| d.metadata.name.as_deref() == Some(s.name.as_str()) && super::model::machine_differs(&s.spec, &d.spec))
    };
    let keep: BTreeSet<String> = o.servers.iter().filter(|s| rolled_back(s)).map(|s| s.name.clone()).collect();
    for s in o.servers.iter().filter(|s| s.owned && !s.ready && !s.deleting && !keep.contains(&s.name)) {
        let used = o.taskservs.iter().any(|t| t.servers_in_status.contains(&s.name) && !doomed.contains(t.name.as_str()));
        if !used && !plan.delete_servers.contains(&s.name) {
            plan.delete_servers.push(s.name.clone());
        }
    }
}
