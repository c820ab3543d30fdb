//! Steps 2–4: entries to re-run after a spec or inputs change, the runs to start on the
//! selected servers, and the draining of servers that left the selection.

use std::collections::{BTreeMap, BTreeSet};

use provisioning_crds::{ScriptRun, TaskServServerStatus};

use crate::taskserv::inputs;

use super::model::{Observed, Operation, RETRY_FAILED_AFTER, ServerFacts, ServerPhase, WHILE_INSTALLING, Work, parse_time, rfc3339};

/// The inputs of an install ([`inputs::install_inputs`], the module doc there says which they
/// are) changed since the servers got the service: install runs again on each server that has
/// it, and its entry names the inputs that changed (`config.port changed`). Anything else in
/// the spec (labels, approval, rollout, the server list, list order) re-runs nothing. Marking
/// entries Pending makes that survive a restart. Returns the configFrom inputs version and the
/// install inputs to record.
pub(super) fn mark_changed_for_reinstall(
    o: &Observed<'_>,
    entries: &mut BTreeMap<String, TaskServServerStatus>,
) -> (Option<String>, BTreeMap<String, String>) {
    let Ok(valid) = o.validated else {
        return (o.status.config_inputs_hash.clone(), o.status.install_inputs.clone());
    };
    let current = inputs::install_inputs(o.name, &valid.service, &valid.config);
    let recorded = &o.status.install_inputs;
    let reason = if recorded.is_empty() {
        // A status written before the inputs were recorded: a spec or configFrom change since
        // then is all that is known.
        let spec_changed = o.status.observed_generation.is_some() && o.status.observed_generation != o.generation;
        let inputs_changed = o.status.config_inputs_hash.is_some() && o.status.config_inputs_hash != valid.inputs_hash;
        (spec_changed || inputs_changed).then(|| "spec or config inputs changed".to_string())
    } else {
        let changed = inputs::changed_inputs(recorded, &current);
        (!changed.is_empty()).then(|| inputs::describe_changed(&changed))
    };
    if let Some(reason) = reason {
        for e in entries.values_mut() {
            if ServerPhase::Installed.is(e) {
                ServerPhase::Pending.set(e);
                e.reinstall_reason = Some(reason.clone());
            } else if ServerPhase::Installing.is(e) && o.in_flight.contains_key(&e.name) {
                // It runs with the old inputs: once it finishes, it runs again.
                e.reinstall_reason = Some(format!("{reason}{WHILE_INSTALLING}"));
            }
        }
    }
    (valid.inputs_hash.clone(), current)
}

/// Decides the run on each selected server (install, re-install, periodic check) and returns
/// the servers that are not ready to run scripts. Nothing is planned for an invalid request
/// (`version` is `None`); nothing installs while a dependency blocks (`deps_clear` false).
pub(super) fn plan_selected(
    o: &Observed<'_>,
    work: &mut Work,
    selected: &BTreeSet<String>,
    deps_clear: bool,
    version: Option<&str>,
) -> Vec<String> {
    let by_name: BTreeMap<&str, &ServerFacts> = o.servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut waiting_servers = Vec::new();
    // An invalid request gets no per-server entries: nothing is planned there.
    let Some(version) = version else { return waiting_servers };
    let mut rollout_budget = rollout_budget(o, work, selected);
    for name in selected.iter().filter(|n| !o.in_flight.contains_key(*n)) {
        let entry = work.entries.entry(name.clone()).or_insert_with(|| ServerPhase::Pending.entry(name));
        let server_ready = by_name.get(name.as_str()).is_some_and(|s| s.ready && !s.deleting);
        if !server_ready {
            waiting_servers.push(name.clone());
            if ServerPhase::Installed.is(entry) {
                // The machine went away under the service (killed, recreated): re-install.
                ServerPhase::Pending.set(entry);
                entry.healthy = Some(false);
                entry.reinstall_reason = Some("the machine went away".into());
            } else if ServerPhase::Installing.is(entry) {
                ServerPhase::Pending.set(entry);
            }
            continue;
        }
        let machine = by_name.get(name.as_str()).and_then(|s| s.provider_id.clone());
        if ServerPhase::Installed.is(entry) && entry.provider_id.is_some() && machine.is_some() && entry.provider_id != machine {
            // Its machine was replaced under the same Server name (a plan or image change, a
            // remediation): the service is not on the new one.
            ServerPhase::Pending.set(entry);
            entry.healthy = Some(false);
            entry.reinstall_reason = Some("the machine was replaced".into());
        }
        if !deps_clear {
            continue;
        }
        let needs_install = !ServerPhase::Installed.is(entry) || entry.version.as_deref() != Some(version) || entry.healthy == Some(false);
        if needs_install {
            if !work.rollback_now && failed_recently(entry, o) {
                continue;
            }
            // A server that runs the service and is not already down waits for its turn.
            if let Some(budget) = rollout_budget.as_mut()
                && entry.version.is_some()
                && !disrupted(entry)
            {
                if *budget == 0 {
                    continue;
                }
                *budget -= 1;
            }
            let previous = entry.version.clone().filter(|v| v != version);
            ServerPhase::Installing.set(entry);
            entry.provider_id = machine;
            entry.last_run = Some(started("install", o));
            work.launch.push((name.clone(), Operation::Install { version: version.to_string(), previous }));
        } else if o.checks_due.contains(name) {
            work.launch.push((name.clone(), Operation::Check));
        }
    }
    waiting_servers
}

/// A server that runs (or ran) the service and is not serving it now: being updated, failed,
/// or unhealthy.
fn disrupted(entry: &TaskServServerStatus) -> bool {
    entry.version.is_some() && (ServerPhase::Installing.is(entry) || ServerPhase::Failed.is(entry) || entry.healthy == Some(false))
}

/// Rolling updates (`spec.rollout`): how many more servers that run the service may be taken
/// for an update now — `maxUnavailable` minus those already disrupted, so a failed or
/// unhealthy update holds the rollout where it is. `None`: no rollout, all at once.
fn rollout_budget(o: &Observed<'_>, work: &Work, selected: &BTreeSet<String>) -> Option<usize> {
    let rollout = o.spec.rollout.as_ref()?;
    let disrupted = selected.iter().filter(|n| work.entries.get(*n).is_some_and(disrupted)).count();
    Some((rollout.max_unavailable.max(1) as usize).saturating_sub(disrupted))
}

/// Servers that left the selection: drained with remove.nu where the machine is up; entries
/// of machines that are gone (or where nothing was ever installed) are dropped.
pub(super) fn drain_leaving(o: &Observed<'_>, work: &mut Work, selected: &BTreeSet<String>) {
    let leaving: Vec<String> = work.entries.keys().filter(|n| !selected.contains(*n)).cloned().collect();
    for name in leaving.into_iter().filter(|n| !o.in_flight.contains_key(n)) {
        let server_ready = o.servers.iter().any(|s| s.name == name && s.ready);
        if !server_ready {
            // Nothing to drain on a machine that is gone.
            work.entries.remove(&name);
            continue;
        }
        if let Some(entry) = work.entries.get_mut(&name) {
            if ServerPhase::Pending.is(entry) && entry.version.is_none() {
                work.entries.remove(&name);
                continue;
            }
            ServerPhase::Removing.set(entry);
            entry.last_run = Some(started("remove", o));
        }
        work.launch.push((name, Operation::Remove));
    }
}

/// The entry failed less than [`RETRY_FAILED_AFTER`] ago: wait before trying again.
pub(super) fn failed_recently(entry: &TaskServServerStatus, o: &Observed<'_>) -> bool {
    ServerPhase::Failed.is(entry)
        && entry
            .last_run
            .as_ref()
            .and_then(|r| parse_time(&r.finished_at))
            .is_some_and(|t| o.now.duration_since(t).unsigned_abs() < RETRY_FAILED_AFTER)
}

/// The `lastRun` of a script started now.
pub(super) fn started(script: &str, o: &Observed<'_>) -> ScriptRun {
    ScriptRun { script: script.into(), started_at: Some(rfc3339(o.now)), ..Default::default() }
}
