//! Step 5: where the TaskServ stands — conditions (kstatus through
//! [`Summary`](crate::conditions::Summary), plus DependenciesReady, Installed, Healthy),
//! phase, transition events, the status to write and when to look again.

use std::collections::BTreeSet;
use std::time::Duration;

use provisioning_crds::{TaskServStatus, condition};
use provisioning_providers::simulated::SCRIPTS_NOT_RUN;

use super::model::{
    Blocker, CONFIG_INPUTS_REQUEUE, Observed, Phase, Plan, PlannedEvent, REASON_CONFIG_CHANGED, REASON_REMEDIATED, REASON_SIMULATED,
    REASON_UPGRADE_FAILED, STALLED_REQUEUE, ServerPhase, WAIT_REQUEUE, Work,
};
use crate::conditions::{self, DesiredCondition, Status, Summary, Wording};
use crate::planning::REASON_DEPENDENCY_MISSING;
use crate::taskserv::validate::InvalidTaskServ;

/// The TaskServ's words on the quiet side of Ready/Reconciling/Stalled.
const WORDING: Wording = Wording {
    idle: ("Idle", "no work in flight"),
    idle_when_stalled: ("Idle", "no work in flight"),
    not_stalled: ("Progressing", "not stalled"),
    progressing_reason: Some("Progressing"),
};

/// What the earlier steps found.
pub(super) struct Facts {
    /// Servers the TaskServ selects.
    pub selected: BTreeSet<String>,
    /// Dependencies in the way.
    pub blocking: Vec<Blocker>,
    /// Selected servers not ready to run scripts.
    pub waiting_servers: Vec<String>,
    /// The version being converged to (the last good one after a rolled-back upgrade).
    pub effective_version: Option<String>,
    /// The config inputs version to record.
    pub inputs_hash: Option<String>,
    /// The install inputs to record.
    pub install_inputs: std::collections::BTreeMap<String, String>,
}

/// An upgrade that failed and was rolled back stays rolled back for this generation.
pub(super) fn upgrade_failure(o: &Observed<'_>) -> Option<String> {
    conditions::find(&o.status.conditions, condition::STALLED)
        .filter(|c| c.status == "True" && c.reason == REASON_UPGRADE_FAILED && c.observed_generation == o.generation)
        .map(|c| c.message.clone())
}

/// Counts over the selected servers.
struct Progress<'f> {
    total: usize,
    installed: usize,
    /// Installed at the requested version and healthy (the UPDATED column).
    updated: usize,
    unhealthy: Vec<&'f String>,
    in_flight: bool,
    all_installed: bool,
}

fn progress<'f>(o: &Observed<'_>, work: &Work, f: &'f Facts) -> Progress<'f> {
    let total = f.selected.len();
    let installed = f
        .selected
        .iter()
        .filter(|n| {
            work.entries.get(*n).is_some_and(|e| ServerPhase::Installed.is(e) && e.version.is_some() && e.version == f.effective_version)
        })
        .count();
    let unhealthy = f.selected.iter().filter(|n| work.entries.get(*n).is_some_and(|e| e.healthy == Some(false))).collect();
    let updated = f
        .selected
        .iter()
        .filter(|n| {
            work.entries.get(*n).is_some_and(|e| {
                ServerPhase::Installed.is(e) && e.version.is_some() && e.version == f.effective_version && e.healthy != Some(false)
            })
        })
        .count();
    let in_flight = o.in_flight.keys().any(|k| f.selected.contains(k) || work.entries.contains_key(k)) || !work.launch.is_empty();
    Progress { total, installed, updated, unhealthy, in_flight, all_installed: total > 0 && installed == total }
}

/// Finishes the plan: conditions, phase, events, status and requeue.
pub(super) fn summarize(o: &Observed<'_>, mut work: Work, f: Facts) -> Plan {
    let p = progress(o, &work, &f);
    let stalled: Option<(String, String)> = match (o.validated, &work.upgrade_failure) {
        (Err(e), _) => Some((e.reason().to_string(), e.to_string())),
        (Ok(_), Some(msg)) => Some((REASON_UPGRADE_FAILED.to_string(), msg.clone())),
        _ => None,
    };
    let valid = o.validated.is_ok();
    let deps_cond = dependencies_condition(valid, &f.blocking);
    let installed_cond = installed_condition(o, &work, &f, &p);
    let healthy_cond = healthy_condition(&p);
    let ready = stalled.is_none() && f.blocking.is_empty() && p.all_installed && p.unhealthy.is_empty();
    let mut conds = if ready {
        Summary::ready("Ready", installed_cond.message.clone()).worded(&WORDING)
    } else if let Some((reason, msg)) = &stalled {
        Summary::stalled(reason, msg.clone()).worded(&WORDING)
    } else {
        let (reason, msg) = if !f.blocking.is_empty() {
            let missing = f.blocking.iter().any(|b| matches!(b, Blocker::Missing(_)));
            (if missing { REASON_DEPENDENCY_MISSING } else { "WaitingForDependencies" }, deps_cond.message.clone())
        } else if !p.unhealthy.is_empty() {
            ("HealthCheckFailed", healthy_cond.message.clone())
        } else {
            (installed_cond.reason.as_str(), installed_cond.message.clone())
        };
        // Nothing selected and nothing running: waiting for Servers, not reconciling.
        if p.in_flight || p.total > 0 {
            Summary::progressing(reason, msg).worded(&WORDING)
        } else {
            Summary::waiting(reason, msg, &WORDING)
        }
    };
    transition_events(o, ready, &stalled, &conds[0].message, &mut work.events);
    conds.extend([deps_cond, installed_cond, healthy_cond]);
    conds.extend(drifted_condition(o, &work, &f));

    let phase = phase(o, &work, &p, ready, valid);
    let installed_version = match &f.effective_version {
        Some(v) if p.all_installed => Some(v.clone()),
        _ => o.status.installed_version.clone(),
    };
    let last_good_version = if ready { f.effective_version.clone() } else { o.status.last_good_version.clone() };
    let status = TaskServStatus {
        phase: Some(phase.as_str().to_string()),
        observed_generation: o.generation,
        conditions: conditions::merge(&o.status.conditions, &conds, o.generation, o.now),
        installed_version,
        updated: (p.total > 0).then(|| format!("{}/{}", p.updated, p.total)),
        last_good_version,
        resolved_dependencies: o.validated.as_ref().map(|v| v.dependencies.clone()).unwrap_or_default(),
        servers: work.entries.into_values().collect(),
        config_inputs_hash: f.inputs_hash.clone(),
        install_inputs: f.install_inputs.clone(),
        generated_secret_ref: o.status.generated_secret_ref.clone(),
        plan: o.status.plan.clone(),
        approved_plan: o.status.approved_plan.clone(),
    };
    let requeue = requeue(o, p.in_flight, stalled.is_some(), ready);
    Plan { status, launch: work.launch, events: work.events, requeue, version: f.effective_version.clone() }
}

/// `Drifted` (config drift found by the checks): True naming the servers and files while a
/// re-install is due; False `Remediated` once rendered again; absent if never drifted.
fn drifted_condition(o: &Observed<'_>, work: &Work, f: &Facts) -> Option<DesiredCondition> {
    let drifted: Vec<String> = f
        .selected
        .iter()
        .filter_map(|n| {
            work.entries.get(n).filter(|e| !e.drifted_files.is_empty()).map(|e| format!("{n} ({})", e.drifted_files.join(", ")))
        })
        .collect();
    let type_ = condition::DRIFTED;
    if !drifted.is_empty() {
        let msg = format!("config of {} changed since install on {}; re-installing", o.spec.service, drifted.join("; "));
        return Some(DesiredCondition::new(type_, Status::True, REASON_CONFIG_CHANGED, msg));
    }
    conditions::find(&o.status.conditions, type_)
        .map(|_| DesiredCondition::new(type_, Status::False, REASON_REMEDIATED, "config files match what install rendered"))
}

fn dependencies_condition(valid: bool, blocking: &[Blocker]) -> DesiredCondition {
    let type_ = condition::DEPENDENCIES_READY;
    match (valid, blocking.is_empty()) {
        (false, _) => DesiredCondition::new(type_, Status::Unknown, "NotResolved", "the request is invalid"),
        (true, true) => DesiredCondition::new(type_, Status::True, "DependenciesReady", "all dependencies are Ready"),
        (true, false) => DesiredCondition::new(
            type_,
            Status::False,
            "WaitingForDependencies",
            blocking.iter().map(Blocker::message).collect::<Vec<_>>().join("; "),
        ),
    }
}

fn installed_condition(o: &Observed<'_>, work: &Work, f: &Facts, p: &Progress<'_>) -> DesiredCondition {
    let total = p.total;
    if o.validated.is_err() {
        return DesiredCondition::new(condition::INSTALLED, Status::Unknown, "NotResolved", "nothing is run for an invalid request");
    }
    if total == 0 {
        return DesiredCondition::new(condition::INSTALLED, Status::False, "NoServersSelected", "no Server matches spec.servers");
    }
    if p.all_installed {
        let version = f.effective_version.clone().unwrap_or_default();
        let mut msg = format!("{} {version} installed on {total}/{total} servers", o.spec.service);
        // Honesty: on the simulated provider nothing ran (Ready stays True: the rollout
        // itself was exercised), and the reason says so.
        let simulated: Vec<&str> =
            o.servers.iter().filter(|s| s.simulated && f.selected.contains(&s.name)).map(|s| s.name.as_str()).collect();
        if simulated.len() == total {
            msg.push_str(&format!(" ({SCRIPTS_NOT_RUN})"));
            return DesiredCondition::new(condition::INSTALLED, Status::True, REASON_SIMULATED, msg);
        }
        if !simulated.is_empty() {
            msg.push_str(&format!(" ({SCRIPTS_NOT_RUN} on {})", simulated.join(", ")));
        }
        return DesiredCondition::new(condition::INSTALLED, Status::True, "Installed", msg);
    }
    let mut msg = format!("{}/{total} servers installed", p.installed);
    if !f.waiting_servers.is_empty() {
        msg.push_str(&format!("; waiting for {}", crate::text::named("Server", &f.waiting_servers)));
    }
    // Why the last install failed, on the object itself (a machine where sudo wants a
    // password, an unreachable host…), not only in per-server status and events.
    let failures: Vec<String> = f
        .selected
        .iter()
        .filter_map(|n| work.entries.get(n).filter(|e| ServerPhase::Failed.is(e)).map(|e| (n, e)))
        .map(|(n, e)| {
            let tail = e.last_run.as_ref().and_then(|r| r.output_tail.as_deref()).unwrap_or_default();
            let why: String = tail.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("no output").chars().take(400).collect();
            format!("install failed on {n}: {why}")
        })
        .collect();
    let reason = if failures.is_empty() { "Installing" } else { "InstallFailed" };
    for failure in failures {
        msg.push_str("; ");
        msg.push_str(&failure);
    }
    DesiredCondition::new(condition::INSTALLED, Status::False, reason, msg)
}

fn healthy_condition(p: &Progress<'_>) -> DesiredCondition {
    if !p.unhealthy.is_empty() {
        let on = p.unhealthy.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
        DesiredCondition::new(condition::HEALTHY, Status::False, "HealthCheckFailed", format!("unhealthy on {on}"))
    } else if p.all_installed {
        DesiredCondition::new(condition::HEALTHY, Status::True, "HealthCheckPassed", "health checks pass on every server")
    } else {
        DesiredCondition::new(condition::HEALTHY, Status::Unknown, "NotInstalled", "not installed everywhere yet")
    }
}

fn phase(o: &Observed<'_>, work: &Work, p: &Progress<'_>, ready: bool, valid: bool) -> Phase {
    if ready {
        Phase::Ready
    } else if !valid {
        Phase::Failed
    } else if work.upgrade_failure.is_some() || (!p.unhealthy.is_empty() && o.status.last_good_version.is_some()) {
        Phase::Degraded
    } else if p.in_flight {
        Phase::Installing
    } else if work.entries.values().any(|e| ServerPhase::Failed.is(e)) {
        Phase::Failed
    } else {
        Phase::Pending
    }
}

/// `Ready` when it becomes Ready; a Warning when it stalls (again only if the message changed).
fn transition_events(
    o: &Observed<'_>,
    ready: bool,
    stalled: &Option<(String, String)>,
    ready_message: &str,
    events: &mut Vec<PlannedEvent>,
) {
    let was_ready = conditions::is_true(&o.status.conditions, condition::READY);
    let was_stalled_msg =
        conditions::find(&o.status.conditions, condition::STALLED).filter(|c| c.status == "True").map(|c| c.message.clone());
    if ready && !was_ready {
        events.push(PlannedEvent::normal("Ready", ready_message));
    }
    if let Some((reason, msg)) = stalled
        && was_stalled_msg.as_ref() != Some(msg)
    {
        events.push(PlannedEvent::warning(reason, msg.clone()));
    }
}

fn requeue(o: &Observed<'_>, in_flight: bool, stalled: bool, ready: bool) -> Option<Duration> {
    if matches!(o.validated, Err(InvalidTaskServ::ConfigInputs(..))) && !in_flight {
        Some(CONFIG_INPUTS_REQUEUE)
    } else if matches!(o.validated, Err(InvalidTaskServ::DependsOnCycle(..))) && !in_flight {
        // The cycle may be broken on another TaskServ, which does not trigger this one.
        Some(WAIT_REQUEUE)
    } else if stalled && !in_flight {
        Some(STALLED_REQUEUE)
    } else if in_flight {
        // Results trigger the next reconcile; this is only a safety net.
        Some(Duration::from_secs(30))
    } else if ready {
        o.validated.as_ref().ok().map(|v| v.health_interval)
    } else {
        Some(WAIT_REQUEUE)
    }
}
