//! Deletion: `remove.nu` on every server where the service is (or may be) installed.

use std::collections::BTreeMap;
use std::time::Duration;

use provisioning_crds::{TaskServServerStatus, TaskServStatus};

use super::model::{Observed, Operation, Phase, Plan, PlannedEvent, ServerFacts, ServerPhase, tail_lines};
use super::servers::{failed_recently, started};
use crate::conditions::{self, Summary, Wording};

/// The words of a TaskServ being deleted on the quiet side of its conditions.
const DELETING: Wording = Wording {
    idle: ("Idle", "no work in flight"),
    idle_when_stalled: ("Idle", "no work in flight"),
    not_stalled: ("Deleting", "not stalled"),
    progressing_reason: None,
};

/// Plans one pass of deletion: `remove.nu` on every server where the service is (or may be)
/// installed; entries of servers that are gone are dropped. Done when `status.servers` is empty
/// and nothing is in flight.
pub fn plan_removal(o: &Observed<'_>) -> (Plan, bool) {
    let mut events = Vec::new();
    let mut entries: BTreeMap<String, TaskServServerStatus> = o.status.servers.iter().map(|s| (s.name.clone(), s.clone())).collect();
    for r in o.results {
        if r.operation == Operation::Remove {
            if r.succeeded {
                entries.remove(&r.server);
                events.push(PlannedEvent::normal("Removed", format!("{} removed from {}", o.spec.service, r.server)));
            } else if entries.get(&r.server).is_some_and(|e| e.version.is_none()) {
                // Never installed there (its install failed too): the cleanup was best effort
                // and must not block deletion forever (e.g. an unreachable machine).
                entries.remove(&r.server);
                events.push(PlannedEvent::warning(
                    "RemoveFailed",
                    format!("{} remove failed on {}, where it was never installed; giving up: {}", o.spec.service, r.server, r.message),
                ));
            } else if let Some(e) = entries.get_mut(&r.server) {
                ServerPhase::Failed.set(e);
                e.last_run = Some(r.run.clone());
                events.push(PlannedEvent::warning(
                    "RemoveFailed",
                    format!(
                        "{} remove failed on {}: {}\n{}",
                        o.spec.service,
                        r.server,
                        r.message,
                        tail_lines(r.run.output_tail.as_deref().unwrap_or_default(), 10)
                    ),
                ));
            }
        }
    }
    let by_name: BTreeMap<&str, &ServerFacts> = o.servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut launch = Vec::new();
    let names: Vec<String> = entries.keys().cloned().collect();
    for name in names {
        if o.in_flight.contains_key(&name) {
            continue;
        }
        let Some(entry) = entries.get_mut(&name) else { continue };
        let never_installed = entry.version.is_none() && ServerPhase::Pending.is(entry);
        match by_name.get(name.as_str()) {
            Some(s) if s.ready && !never_installed => {
                if failed_recently(entry, o) {
                    continue;
                }
                ServerPhase::Removing.set(entry);
                entry.last_run = Some(started("remove", o));
                launch.push((name.clone(), Operation::Remove));
            }
            // No machine (or nothing ever installed): nothing to drain.
            _ => {
                entries.remove(&name);
            }
        }
    }
    let done = entries.is_empty() && launch.is_empty() && o.in_flight.is_empty();
    let msg = format!("removing {} from {}", o.spec.service, crate::text::count(entries.len(), "server"));
    let conds = Summary::progressing("Deleting", msg).worded(&DELETING);
    let mut kept = conditions::merge(&o.status.conditions, &conds, o.generation, o.now);
    // Keep the kind-specific conditions as they were.
    for c in &o.status.conditions {
        if !kept.iter().any(|k| k.type_ == c.type_) {
            kept.push(c.clone());
        }
    }
    let status = TaskServStatus {
        phase: Some(Phase::Removing.as_str().into()),
        observed_generation: o.generation,
        conditions: kept,
        servers: entries.into_values().collect(),
        ..o.status.clone()
    };
    (Plan { status, launch, events, requeue: Some(Duration::from_secs(5)), version: None }, done)
}
