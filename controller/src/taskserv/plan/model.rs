//! The typed states and the desired children the taskserv planner's steps share: what each
//! step reads ([`Observed`]) and builds ([`Plan`]), and the pure helpers over them. The steps
//! and [`super::plan`], which composes them, import from here; nothing here imports a step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{MachineAddress, ScriptRun, TaskServServerStatus, TaskServSpec, TaskServStatus};

pub use crate::planning::PlannedEvent;
use crate::planning::{cycle_message, depends_on_cycle};
use crate::taskserv::validate::{InvalidTaskServ, ValidTaskServ};

/// Pause before a failed install is tried again.
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(20);
/// Requeue while waiting for something outside this object (servers, dependencies).
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// Requeue of a Stalled object (a spec change triggers a reconcile anyway).
pub const STALLED_REQUEUE: Duration = Duration::from_secs(300);
/// Requeue while waiting for a Secret/ConfigMap of `configFrom`: the Secret watch triggers at
/// once (cluster-wide, or per workspace namespace where RBAC grants Secrets only per namespace,
/// deploy/rbac/secrets.yaml, see [`crate::secret_watch`]); this poll covers namespaces where
/// neither is allowed (no RoleBinding, or no Workspace).
pub const CONFIG_INPUTS_REQUEUE: Duration = Duration::from_secs(30);

/// Reason of the `Stalled` condition after a failed upgrade was rolled back.
pub const REASON_UPGRADE_FAILED: &str = "UpgradeFailed";
/// Reason of `Drifted=True` (and its Warning) when a check finds a service's config files
/// changed on a machine since install.
pub const REASON_CONFIG_CHANGED: &str = "ConfigChanged";
/// Reason of `Drifted=False` once the drifted files were rendered again.
pub const REASON_REMEDIATED: &str = "Remediated";

/// Reason of `Installed=True` when every server is on the simulated provider: the scripts
/// "succeeded" without running (the message says "simulated: scripts not run").
pub const REASON_SIMULATED: &str = "Simulated";

/// Ends the `reinstallReason` of an install that was running when an input changed: once it
/// has finished, the install runs again with the new inputs.
pub const WHILE_INSTALLING: &str = " while it was installing";

/// The state of the service on one server (`status.servers[].phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerPhase {
    /// Nothing run yet, or to be run again (spec or inputs changed, machine came back).
    Pending,
    /// `install.nu` started.
    Installing,
    /// Installed and checked.
    Installed,
    /// The last install or remove failed (retried after [`RETRY_FAILED_AFTER`]).
    Failed,
    /// `remove.nu` started (the server left the selection, or the TaskServ is deleted).
    Removing,
}

impl ServerPhase {
    /// As written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerPhase::Pending => "Pending",
            ServerPhase::Installing => "Installing",
            ServerPhase::Installed => "Installed",
            ServerPhase::Failed => "Failed",
            ServerPhase::Removing => "Removing",
        }
    }
    /// The phase of an entry (`None` for a string this version does not write).
    pub fn of(entry: &TaskServServerStatus) -> Option<ServerPhase> {
        [ServerPhase::Pending, ServerPhase::Installing, ServerPhase::Installed, ServerPhase::Failed, ServerPhase::Removing]
            .into_iter()
            .find(|p| p.as_str() == entry.phase)
    }
    /// Whether `entry` is in this phase.
    pub fn is(self, entry: &TaskServServerStatus) -> bool {
        entry.phase == self.as_str()
    }
    /// Puts `entry` in this phase.
    pub fn set(self, entry: &mut TaskServServerStatus) {
        entry.phase = self.as_str().to_string();
    }
    /// A new entry for `server` in this phase.
    pub(super) fn entry(self, server: &str) -> TaskServServerStatus {
        TaskServServerStatus { name: server.to_string(), phase: self.as_str().to_string(), ..Default::default() }
    }
}

/// The TaskServ's phase (`status.phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting (servers, dependencies) with nothing running.
    Pending,
    /// Scripts running.
    Installing,
    /// Installed and healthy everywhere.
    Ready,
    /// Rolled back after a failed upgrade, or unhealthy after having been Ready.
    Degraded,
    /// Invalid request, or failed installs.
    Failed,
    /// Being deleted.
    Removing,
}

impl Phase {
    /// As written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Installing => "Installing",
            Phase::Ready => "Ready",
            Phase::Degraded => "Degraded",
            Phase::Failed => "Failed",
            Phase::Removing => "Removing",
        }
    }
}

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
    /// Its machine is on the simulated provider: scripts "succeed" without running.
    pub simulated: bool,
    /// Its machine (status.providerID).
    pub provider_id: Option<String>,
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
    /// Check: config files changed on the machine since install (config drift).
    pub drifted_files: Vec<String>,
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
    /// The version the servers converge to (the last good one during a rollback), for
    /// [`super::taskserv_plan`]; `None` when the spec is invalid or the TaskServ is being removed.
    pub version: Option<String>,
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

/// A dependency that keeps the TaskServ from installing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// Nothing provides it (no TaskServ of the service, or no TaskServ of the name): waiting,
    /// it may still be created.
    Missing(String),
    /// It exists but is not Ready (on the selected servers).
    NotReady(String),
}

impl Blocker {
    /// The message naming the dependency.
    pub fn message(&self) -> &str {
        match self {
            Blocker::Missing(m) | Blocker::NotReady(m) => m,
        }
    }
}

/// Dependencies that are not ready yet, each with a message naming it.
pub fn blocking_dependencies(
    own_name: &str,
    spec: &TaskServSpec,
    dependencies: &[String],
    selected: &BTreeSet<String>,
    taskservs: &[PeerTaskServ],
) -> Vec<String> {
    blockers(own_name, spec, dependencies, selected, taskservs).iter().map(|b| b.message().to_string()).collect()
}

/// Dependencies that are not ready yet: hard catalog dependencies (on the same servers), then
/// `dependsOn`.
pub fn blockers(
    own_name: &str,
    spec: &TaskServSpec,
    dependencies: &[String],
    selected: &BTreeSet<String>,
    taskservs: &[PeerTaskServ],
) -> Vec<Blocker> {
    let mut blocking = Vec::new();
    for service in dependencies {
        let providers: Vec<&PeerTaskServ> = taskservs.iter().filter(|t| &t.service == service && t.name != own_name).collect();
        if providers.is_empty() {
            blocking.push(Blocker::Missing(format!("missing dependency {service}: no TaskServ installs it in this namespace")));
            continue;
        }
        // A hard dependency lives on the same machines (containerd under kubernetes).
        let covered = providers.iter().any(|p| p.ready && selected.iter().all(|s| p.installed_on.contains(s)));
        if !covered {
            let best = providers.iter().max_by_key(|p| selected.intersection(&p.installed_on).count()).copied();
            if let Some(p) = best {
                let done = selected.intersection(&p.installed_on).count();
                blocking.push(Blocker::NotReady(format!(
                    "waiting for TaskServ {} ({service}: {done}/{} servers installed)",
                    p.name,
                    selected.len()
                )));
            }
        }
    }
    for name in &spec.depends_on {
        match taskservs.iter().find(|t| &t.name == name) {
            None => blocking.push(Blocker::Missing(format!("missing dependency: TaskServ {name} not found"))),
            Some(t) if !t.ready => blocking.push(Blocker::NotReady(format!("waiting for TaskServ {name} to be Ready"))),
            Some(_) => {}
        }
    }
    blocking
}

/// Refuses a TaskServ whose `dependsOn` closes a cycle through it. `graph` holds every
/// TaskServ of the namespace (this one included) with its `dependsOn`. The reconciler folds
/// the error into the validation result, so the planner reports it as `Stalled` with reason
/// `DependencyCycle` (and one Warning event) naming the cycle, e.g. `dependsOn cycle:
/// TaskServ a → b → a`, instead of both waiting for each other forever.
pub fn check_depends_on(own_name: &str, graph: &BTreeMap<String, Vec<String>>) -> Result<(), InvalidTaskServ> {
    match depends_on_cycle(own_name, graph) {
        Some(cycle) => Err(InvalidTaskServ::DependsOnCycle(cycle_message("TaskServ", &cycle))),
        None => Ok(()),
    }
}

/// RFC 3339 text, whole seconds (the API stores seconds; finer would differ on every pass).
pub fn rfc3339(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

pub(super) fn parse_time(s: &Option<String>) -> Option<Timestamp> {
    s.as_deref().and_then(|s| s.parse::<Timestamp>().ok())
}

pub(super) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What planning builds up as its steps run.
pub(super) struct Work {
    /// Per-server status entries, by server.
    pub(super) entries: BTreeMap<String, TaskServServerStatus>,
    /// Events so far.
    pub(super) events: Vec<PlannedEvent>,
    /// Operations to start now.
    pub(super) launch: Vec<(String, Operation)>,
    /// The rolled-back upgrade's message (this generation stays rolled back).
    pub(super) upgrade_failure: Option<String>,
    /// A rollback starts at once, without the pause between failed attempts.
    pub(super) rollback_now: bool,
}
