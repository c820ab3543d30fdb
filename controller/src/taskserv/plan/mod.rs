//! Plan (pure): desired vs observed → the next script runs and the new status.
//!
//! Per server the state machine is `Pending → Installing → Installed` (or `Failed`, retried
//! after a pause), `Installed + unhealthy → Installing` (re-install), and for a server that
//! left the selection `→ Removing → (entry dropped)`. Script runs happen in background tasks;
//! their results come back here as [`OperationResult`]s. Status is the checkpoint: an entry in
//! `Installing` with no run in flight (the controller restarted) is simply run again — the
//! scripts are idempotent and the runner holds a per-service lock on the server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{MachineAddress, ScriptRun, TaskServSpec, TaskServServerStatus, TaskServStatus, condition};

use crate::conditions::{self, DesiredCondition, Status};
use super::validate::{InvalidTaskServ, ValidTaskServ};

/// Pause before a failed install is tried again.
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(20);
/// Requeue while waiting for something outside this object (servers, dependencies).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// Requeue of a Stalled object (a spec change triggers a reconcile anyway).
pub const STALLED_REQUEUE: Duration = Duration::from_secs(300);
/// Requeue while waiting for a Secret/ConfigMap of `configFrom`: the Secret watch triggers at
/// once where the controller may watch Secrets cluster-wide; where RBAC grants Secrets only
/// per namespace (deploy/rbac/secrets.yaml) that watch is refused and this poll takes over.
pub const CONFIG_INPUTS_REQUEUE: Duration = Duration::from_secs(30);

/// Reason of the `Stalled` condition after a failed upgrade was rolled back.
pub const REASON_UPGRADE_FAILED: &str = "UpgradeFailed";

/// What the planner knows about one Server of the namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFacts {
    /// Server name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Ready=True and a provider id: scripts can run there.
    pub ready: bool,
    /// Being deleted.
    pub deleting: bool,
    /// Addresses from its status.
    pub addresses: Vec<MachineAddress>,
}

/// Another TaskServ of the namespace (a dependency candidate).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerTaskServ {
    /// TaskServ name.
    pub name: String,
    /// Its catalog service.
    pub service: String,
    /// Ready=True.
    pub ready: bool,
    /// Servers it reports Installed on.
    pub installed_on: BTreeSet<String>,
}

/// A script operation on one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `install.nu` for `version`, then `check.nu`.
    Install {
        /// Version to converge to.
        version: String,
        /// What was there before (upgrade, rollback).
        previous: Option<String>,
    },
    /// `check.nu` alone (health on resync).
    Check,
    /// `remove.nu`.
    Remove,
}

impl Operation {
    /// The script's short name, for status and events.
    pub fn script(&self) -> &'static str {
        match self {
            Operation::Install { .. } => "install",
            Operation::Check => "check",
            Operation::Remove => "remove",
        }
    }
}

/// A finished operation, not yet recorded in status.
#[derive(Clone, Debug, PartialEq)]
pub struct OperationResult {
    /// Server it ran on.
    pub server: String,
    /// What ran.
    pub operation: Operation,
    /// The run as it goes into status (`lastRun`).
    pub run: ScriptRun,
    /// Install/remove: the script exited 0 (and, for install, the check after it passed).
    pub succeeded: bool,
    /// Health as the check saw it, when a check ran.
    pub healthy: Option<bool>,
    /// Why it failed (exit code, timeout, executor error), for events.
    pub message: String,
    /// The config inputs version (`ValidTaskServ::inputs_hash`) the run was given.
    pub inputs_hash: Option<String>,
}

/// Everything the planner looks at.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The TaskServ's name.
    pub name: &'a str,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// The spec.
    pub spec: &'a TaskServSpec,
    /// The current status (default when absent).
    pub status: &'a TaskServStatus,
    /// The validation result.
    pub validated: &'a Result<ValidTaskServ, InvalidTaskServ>,
    /// Every Server of the namespace.
    pub servers: &'a [ServerFacts],
    /// Every other TaskServ of the namespace.
    pub taskservs: &'a [PeerTaskServ],
    /// Operations running now, by server.
    pub in_flight: &'a BTreeMap<String, Operation>,
    /// Finished operations not yet recorded.
    pub results: &'a [OperationResult],
    /// Servers whose periodic health check is due.
    pub checks_due: &'a BTreeSet<String>,
    /// Now.
    pub now: Timestamp,
}

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    /// Warning or Normal.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// For humans (may carry a script's output tail; never secrets).
    pub note: String,
}

impl PlannedEvent {
    fn normal(reason: &str, note: impl Into<String>) -> Self {
        PlannedEvent { warning: false, reason: reason.into(), note: note.into() }
    }
    fn warning(reason: &str, note: impl Into<String>) -> Self {
        PlannedEvent { warning: true, reason: reason.into(), note: note.into() }
    }
}

/// The outcome of planning.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Status to write (equal to the old one on a no-op pass).
    pub status: TaskServStatus,
    /// Operations to start now, by server.
    pub launch: Vec<(String, Operation)>,
    /// Events to publish.
    pub events: Vec<PlannedEvent>,
    /// When to look again if nothing triggers earlier.
    pub requeue: Option<Duration>,
}

/// Servers a TaskServ selects: its `names` plus those whose labels match its selector.
pub fn selected_servers(spec: &TaskServSpec, servers: &[ServerFacts]) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = spec.servers.names.iter().cloned().collect();
    if let Some(selector) = &spec.servers.selector
        && !selector.match_labels.is_empty()
    {
        for s in servers {
            if selector.match_labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)) {
                out.insert(s.name.clone());
            }
        }
    }
    out
}

/// Dependencies that are not ready yet, each with a message naming it.
pub fn blocking_dependencies(
    own_name: &str,
    spec: &TaskServSpec,
    dependencies: &[String],
    selected: &BTreeSet<String>,
    taskservs: &[PeerTaskServ],
) -> Vec<String> {
    let mut blocking = Vec::new();
    for service in dependencies {
        let providers: Vec<&PeerTaskServ> =
            taskservs.iter().filter(|t| &t.service == service && t.name != own_name).collect();
        if providers.is_empty() {
            blocking.push(format!("missing dependency {service}: no TaskServ installs it in this namespace"));
            continue;
        }
        // A hard dependency lives on the same machines (containerd under kubernetes).
        let covered = providers.iter().any(|p| p.ready && selected.iter().all(|s| p.installed_on.contains(s)));
        if !covered {
            let best = providers.iter().max_by_key(|p| selected.intersection(&p.installed_on).count()).copied();
            if let Some(p) = best {
                let done = selected.intersection(&p.installed_on).count();
                blocking.push(format!(
                    "waiting for TaskServ {} ({service}: {done}/{} servers installed)",
                    p.name,
                    selected.len()
                ));
            }
        }
    }
    for name in &spec.depends_on {
        match taskservs.iter().find(|t| &t.name == name) {
            None => blocking.push(format!("missing dependency: TaskServ {name} not found")),
            Some(t) if !t.ready => blocking.push(format!("waiting for TaskServ {name} to be Ready")),
            Some(_) => {}
        }
    }
    blocking
}

/// RFC 3339 text, whole seconds (the API stores seconds; finer would differ on every pass).
pub fn rfc3339(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

fn parse_time(s: &Option<String>) -> Option<Timestamp> {
    s.as_deref().and_then(|s| s.parse::<Timestamp>().ok())
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Plans one reconcile of a TaskServ that is not being deleted.
pub fn plan(o: &Observed<'_>) -> Plan {
    let now = o.now;
    let mut events = Vec::new();
    let mut entries: BTreeMap<String, TaskServServerStatus> =
        o.status.servers.iter().map(|s| (s.name.clone(), s.clone())).collect();
    let last_good = o.status.last_good_version.clone();

    // An upgrade that failed and was rolled back stays rolled back for this generation.
    let mut upgrade_failure: Option<String> = conditions::find(&o.status.conditions, condition::STALLED)
        .filter(|c| c.status == "True" && c.reason == REASON_UPGRADE_FAILED && c.observed_generation == o.generation)
        .map(|c| c.message.clone());

    let desired_version = o.validated.as_ref().ok().map(|v| v.version.clone());
    // A rollback starts at once, without the pause between failed attempts.
    let mut rollback_now = false;

    // 1. Record finished operations.
    for r in o.results {
        let entry = entries.entry(r.server.clone()).or_insert_with(|| TaskServServerStatus {
            name: r.server.clone(),
            phase: "Pending".into(),
            ..Default::default()
        });
        let tail = r.run.output_tail.clone().unwrap_or_default();
        match &r.operation {
            Operation::Install { version, .. } => {
                entry.last_run = Some(r.run.clone());
                if r.succeeded {
                    entry.phase = "Installed".into();
                    entry.version = Some(version.clone());
                    entry.healthy = Some(true);
                    // A Secret rotated while this install ran: it used the old values.
                    let current = o.validated.as_ref().ok().and_then(|v| v.inputs_hash.as_ref());
                    if current.is_some() && r.inputs_hash.as_ref() != current {
                        entry.phase = "Pending".into();
                    }
                    events.push(PlannedEvent::normal(
                        "Installed",
                        format!("{} {version} installed on {}", o.spec.service, r.server),
                    ));
                } else {
                    entry.phase = "Failed".into();
                    entry.healthy = r.healthy.map(|_| false);
                    if r.healthy.is_some() {
                        // install.nu succeeded but the check after it failed.
                        entry.version = Some(version.clone());
                    }
                    events.push(PlannedEvent::warning(
                        "InstallFailed",
                        format!(
                            "{} {version} failed on {}: {}\n{}",
                            o.spec.service,
                            r.server,
                            r.message,
                            tail_lines(&tail, 10)
                        ),
                    ));
                    let is_upgrade = last_good.as_ref().is_some_and(|g| g != version);
                    if o.spec.rollback_on_failure
                        && is_upgrade
                        && desired_version.as_ref() == Some(version)
                        && upgrade_failure.is_none()
                    {
                        let good = last_good.clone().unwrap_or_default();
                        let msg = format!(
                            "upgrade of {} to {version} failed on {}: {}; rolling back to {good}",
                            o.spec.service, r.server, r.message
                        );
                        events.push(PlannedEvent::warning("RollingBack", msg.clone()));
                        upgrade_failure = Some(msg);
                        rollback_now = true;
                    }
                }
            }
            Operation::Check => {
                let healthy = r.healthy.unwrap_or(false);
                if !healthy {
                    entry.last_run = Some(r.run.clone());
                    if entry.healthy != Some(false) {
                        events.push(PlannedEvent::warning(
                            "Unhealthy",
                            format!(
                                "{} health check failed on {}: {}\n{}",
                                o.spec.service,
                                r.server,
                                r.message,
                                tail_lines(&tail, 10)
                            ),
                        ));
                    }
                }
                entry.healthy = Some(healthy);
            }
            Operation::Remove => {
                if r.succeeded {
                    events.push(PlannedEvent::normal("Removed", format!("{} removed from {}", o.spec.service, r.server)));
                    entries.remove(&r.server);
                } else {
                    entry.phase = "Failed".into();
                    entry.last_run = Some(r.run.clone());
                    events.push(PlannedEvent::warning(
                        "RemoveFailed",
                        format!("{} remove failed on {}: {}\n{}", o.spec.service, r.server, r.message, tail_lines(&tail, 10)),
                    ));
                }
            }
        }
    }

    // A spec change (config, version, servers) re-runs install everywhere: scripts converge
    // config and peers idempotently. Marking entries Pending makes that survive a restart.
    let spec_changed = o.validated.is_ok()
        && o.status.observed_generation.is_some()
        && o.status.observed_generation != o.generation;
    // New values behind configFrom (a rotated Secret) or generated secrets: the same.
    let inputs_hash = match o.validated {
        Ok(v) => v.inputs_hash.clone(),
        Err(_) => o.status.config_inputs_hash.clone(),
    };
    let inputs_changed = o.validated.is_ok() && o.status.config_inputs_hash.is_some() && o.status.config_inputs_hash != inputs_hash;
    if spec_changed || inputs_changed {
        for e in entries.values_mut() {
            if e.phase == "Installed" {
                e.phase = "Pending".into();
            }
        }
    }

    let selected = selected_servers(o.spec, o.servers);
    let by_name: BTreeMap<&str, &ServerFacts> = o.servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut launch: Vec<(String, Operation)> = Vec::new();
    let mut waiting_servers: Vec<String> = Vec::new();

    // 2. Validation: a refused request runs nothing.
    let valid = o.validated.as_ref().ok();
    let blocking = match valid {
        Some(v) => blocking_dependencies(o.name, o.spec, &v.dependencies, &selected, o.taskservs),
        None => Vec::new(),
    };
    let effective_version: Option<String> = match (valid, &upgrade_failure) {
        (Some(_), Some(_)) if last_good.is_some() => last_good.clone(),
        (Some(v), _) => Some(v.version.clone()),
        (None, _) => None,
    };

    // 3. Selected servers.
    for name in &selected {
        if o.in_flight.contains_key(name) {
            continue;
        }
        // An invalid request gets no per-server entries: nothing is planned there.
        let Some(version) = &effective_version else { continue };
        let server = by_name.get(name.as_str()).copied();
        let entry = entries.entry(name.clone()).or_insert_with(|| TaskServServerStatus {
            name: name.clone(),
            phase: "Pending".into(),
            ..Default::default()
        });
        let server_ready = server.is_some_and(|s| s.ready && !s.deleting);
        if !server_ready {
            waiting_servers.push(name.clone());
            if entry.phase == "Installed" {
                // The machine went away under the service (killed, recreated): re-install.
                entry.phase = "Pending".into();
                entry.healthy = Some(false);
            } else if entry.phase == "Installing" {
                entry.phase = "Pending".into();
            }
            continue;
        }
        if !blocking.is_empty() {
            continue;
        }
        let failed_recently = !rollback_now
            && entry.phase == "Failed"
            && entry
                .last_run
                .as_ref()
                .and_then(|r| parse_time(&r.finished_at))
                .is_some_and(|t| now.duration_since(t).unsigned_abs() < RETRY_FAILED_AFTER);
        let needs_install = entry.phase != "Installed"
            || entry.version.as_ref() != Some(version)
            || entry.healthy == Some(false);
        if needs_install {
            if failed_recently {
                continue;
            }
            let previous = entry.version.clone().filter(|v| v != version);
            entry.phase = "Installing".into();
            entry.last_run = Some(ScriptRun {
                script: "install".into(),
                started_at: Some(rfc3339(now)),
                ..Default::default()
            });
            launch.push((name.clone(), Operation::Install { version: version.clone(), previous }));
        } else if o.checks_due.contains(name) {
            launch.push((name.clone(), Operation::Check));
        }
    }

    // 4. Servers that left the selection: drain them with remove.nu.
    let leaving: Vec<String> = entries.keys().filter(|n| !selected.contains(*n)).cloned().collect();
    for name in leaving {
        if o.in_flight.contains_key(&name) {
            continue;
        }
        let server = by_name.get(name.as_str()).copied();
        match server {
            Some(s) if s.ready => {
                if let Some(entry) = entries.get_mut(&name) {
                    if entry.phase == "Pending" && entry.version.is_none() {
                        entries.remove(&name);
                        continue;
                    }
                    entry.phase = "Removing".into();
                    entry.last_run =
                        Some(ScriptRun { script: "remove".into(), started_at: Some(rfc3339(now)), ..Default::default() });
                }
                launch.push((name, Operation::Remove));
            }
            // Nothing to drain on a machine that is gone.
            _ => {
                entries.remove(&name);
            }
        }
    }

    // 5. Summaries and conditions.
    let total = selected.len();
    let entry_of = |n: &String| entries.get(n);
    let installed: Vec<&String> = selected
        .iter()
        .filter(|n| {
            entry_of(n).is_some_and(|e| e.phase == "Installed" && e.version.is_some() && e.version == effective_version)
        })
        .collect();
    let unhealthy: Vec<&String> =
        selected.iter().filter(|n| entry_of(n).is_some_and(|e| e.healthy == Some(false))).collect();
    let in_flight_now = o.in_flight.keys().any(|k| selected.contains(k) || entries.contains_key(k)) || !launch.is_empty();
    let all_installed = total > 0 && installed.len() == total;
    let healthy = all_installed && unhealthy.is_empty();

    let mut conds = Vec::new();
    let stalled: Option<(String, String)> = match (o.validated, &upgrade_failure) {
        (Err(e), _) => Some((e.reason().to_string(), e.to_string())),
        (Ok(_), Some(msg)) => Some((REASON_UPGRADE_FAILED.to_string(), msg.clone())),
        _ => None,
    };
    let deps_cond = match (valid, blocking.is_empty()) {
        (None, _) => DesiredCondition::new(condition::DEPENDENCIES_READY, Status::Unknown, "NotResolved", "the request is invalid"),
        (Some(_), true) => DesiredCondition::new(condition::DEPENDENCIES_READY, Status::True, "DependenciesReady", "all dependencies are Ready"),
        (Some(_), false) => DesiredCondition::new(
            condition::DEPENDENCIES_READY,
            Status::False,
            "WaitingForDependencies",
            blocking.join("; "),
        ),
    };
    let installed_cond = if valid.is_none() {
        DesiredCondition::new(condition::INSTALLED, Status::Unknown, "NotResolved", "nothing is run for an invalid request")
    } else if total == 0 {
        DesiredCondition::new(condition::INSTALLED, Status::False, "NoServersSelected", "no Server matches spec.servers")
    } else if all_installed {
        DesiredCondition::new(
            condition::INSTALLED,
            Status::True,
            "Installed",
            format!("{} {} installed on {total}/{total} servers", o.spec.service, effective_version.clone().unwrap_or_default()),
        )
    } else {
        let mut msg = format!("{}/{total} servers installed", installed.len());
        if !waiting_servers.is_empty() {
            msg.push_str(&format!("; waiting for Server {}", waiting_servers.join(", ")));
        }
        // Why the last install failed, on the object itself (a machine where sudo wants a
        // password, an unreachable host…), not only in per-server status and events.
        let failures: Vec<String> = selected
            .iter()
            .filter_map(|n| entry_of(n).filter(|e| e.phase == "Failed").map(|e| (n, e)))
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
    };
    let healthy_cond = if !unhealthy.is_empty() {
        DesiredCondition::new(
            condition::HEALTHY,
            Status::False,
            "HealthCheckFailed",
            format!("unhealthy on {}", unhealthy.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
        )
    } else if all_installed {
        DesiredCondition::new(condition::HEALTHY, Status::True, "HealthCheckPassed", "health checks pass on every server")
    } else {
        DesiredCondition::new(condition::HEALTHY, Status::Unknown, "NotInstalled", "not installed everywhere yet")
    };
    let ready = stalled.is_none() && blocking.is_empty() && all_installed && healthy;
    let reconciling = stalled.is_none() && !ready && (in_flight_now || total > 0);
    let ready_cond = if ready {
        DesiredCondition::new(condition::READY, Status::True, "Ready", installed_cond.message.clone())
    } else if let Some((reason, msg)) = &stalled {
        DesiredCondition::new(condition::READY, Status::False, reason, msg.clone())
    } else if !blocking.is_empty() {
        DesiredCondition::new(condition::READY, Status::False, "WaitingForDependencies", deps_cond.message.clone())
    } else if !unhealthy.is_empty() {
        DesiredCondition::new(condition::READY, Status::False, "HealthCheckFailed", healthy_cond.message.clone())
    } else {
        DesiredCondition::new(condition::READY, Status::False, &installed_cond.reason, installed_cond.message.clone())
    };
    conds.push(ready_cond);
    conds.push(if reconciling {
        DesiredCondition::new(condition::RECONCILING, Status::True, "Progressing", conds[0].message.clone())
    } else {
        DesiredCondition::new(condition::RECONCILING, Status::False, "Idle", "no work in flight")
    });
    conds.push(match &stalled {
        Some((reason, msg)) => DesiredCondition::new(condition::STALLED, Status::True, reason, msg.clone()),
        None => DesiredCondition::new(condition::STALLED, Status::False, "Progressing", "not stalled"),
    });
    conds.push(deps_cond);
    conds.push(installed_cond);
    conds.push(healthy_cond);

    let phase = if ready {
        "Ready"
    } else if valid.is_none() {
        "Failed"
    } else if upgrade_failure.is_some() || (!unhealthy.is_empty() && o.status.last_good_version.is_some()) {
        "Degraded"
    } else if in_flight_now {
        "Installing"
    } else if entries.values().any(|e| e.phase == "Failed") {
        "Failed"
    } else {
        "Pending"
    };

    // Events on summary transitions.
    let was_ready = conditions::is_true(&o.status.conditions, condition::READY);
    let was_stalled_msg = conditions::find(&o.status.conditions, condition::STALLED)
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone());
    if ready && !was_ready {
        events.push(PlannedEvent::normal("Ready", conds[0].message.clone()));
    }
    if let Some((reason, msg)) = &stalled
        && was_stalled_msg.as_ref() != Some(msg)
    {
        events.push(PlannedEvent::warning(reason, msg.clone()));
    }

    let installed_version = match &effective_version {
        Some(v) if all_installed => Some(v.clone()),
        _ => o.status.installed_version.clone(),
    };
    let last_good_version = if ready { effective_version.clone() } else { o.status.last_good_version.clone() };

    let status = TaskServStatus {
        phase: Some(phase.to_string()),
        observed_generation: o.generation,
        conditions: conditions::merge(&o.status.conditions, &conds, o.generation, now),
        installed_version,
        last_good_version,
        resolved_dependencies: valid.map(|v| v.dependencies.clone()).unwrap_or_default(),
        servers: entries.into_values().collect(),
        config_inputs_hash: inputs_hash,
        generated_secret_ref: o.status.generated_secret_ref.clone(),
    };

    let requeue = if matches!(o.validated, Err(InvalidTaskServ::ConfigInputs(..))) && !in_flight_now {
        Some(CONFIG_INPUTS_REQUEUE)
    } else if stalled.is_some() && !in_flight_now {
        Some(STALLED_REQUEUE)
    } else if in_flight_now {
        // Results trigger the next reconcile; this is only a safety net.
        Some(Duration::from_secs(30))
    } else if ready {
        valid.map(|v| v.health_interval)
    } else {
        Some(WAIT_REQUEUE)
    };

    Plan { status, launch, events, requeue }
}

/// Plans one pass of deletion: `remove.nu` on every server where the service is (or may be)
/// installed; entries of servers that are gone are dropped. Done when `status.servers` is empty
/// and nothing is in flight.
pub fn plan_removal(o: &Observed<'_>) -> (Plan, bool) {
    let now = o.now;
    let mut events = Vec::new();
    let mut entries: BTreeMap<String, TaskServServerStatus> =
        o.status.servers.iter().map(|s| (s.name.clone(), s.clone())).collect();
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
                e.phase = "Failed".into();
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
        let never_installed = entry.version.is_none() && entry.phase == "Pending";
        match by_name.get(name.as_str()) {
            Some(s) if s.ready && !never_installed => {
                let failed_recently = entry.phase == "Failed"
                    && entry
                        .last_run
                        .as_ref()
                        .and_then(|r| parse_time(&r.finished_at))
                        .is_some_and(|t| now.duration_since(t).unsigned_abs() < RETRY_FAILED_AFTER);
                if failed_recently {
                    continue;
                }
                entry.phase = "Removing".into();
                entry.last_run =
                    Some(ScriptRun { script: "remove".into(), started_at: Some(rfc3339(now)), ..Default::default() });
                launch.push((name.clone(), Operation::Remove));
            }
            // No machine (or nothing ever installed): nothing to drain.
            _ => {
                entries.remove(&name);
            }
        }
    }
    let done = entries.is_empty() && launch.is_empty() && o.in_flight.is_empty();
    let msg = format!("removing {} from {} servers", o.spec.service, entries.len());
    let conds = [
        DesiredCondition::new(condition::READY, Status::False, "Deleting", msg.clone()),
        DesiredCondition::new(condition::RECONCILING, Status::True, "Deleting", msg),
        DesiredCondition::new(condition::STALLED, Status::False, "Deleting", "not stalled"),
    ];
    let mut kept = conditions::merge(&o.status.conditions, &conds, o.generation, now);
    // Keep the kind-specific conditions as they were.
    for c in &o.status.conditions {
        if !kept.iter().any(|k| k.type_ == c.type_) {
            kept.push(c.clone());
        }
    }
    let status = TaskServStatus {
        phase: Some("Removing".into()),
        observed_generation: o.generation,
        conditions: kept,
        servers: entries.into_values().collect(),
        ..o.status.clone()
    };
    (Plan { status, launch, events, requeue: Some(Duration::from_secs(5)) }, done)
}
