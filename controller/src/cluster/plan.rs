//! Plan (pure): a Cluster's desired children, the step plan and the next actions.
//!
//! Pools become Servers named `<cluster>-<pool>-<index>`; services (with their dependency
//! closure) become TaskServs named `<cluster>-<service>`; both carry the cluster and pool
//! labels and a controller ownerReference. The rollout is a list of steps — one per pool
//! (`servers/<pool>`), then one per service in install order (`taskserv/<service>`) — whose
//! state and times live in `status.steps`: that list is the checkpoint a restarted controller
//! resumes from (everything in it is re-derived from the children it finds, so resuming never
//! repeats a finished step). `parallelLimit` bounds how many of the cluster's Servers are
//! being brought up at once. Deleting the Cluster tears down in reverse dependency order.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{
    API_VERSION, ClusterServerCounts, ClusterSpec, ClusterStatus, ClusterStep, ClusterTaskServStatus, FailurePolicy,
    LABEL_CLUSTER, LABEL_POOL, Server, ServerSelection, ServerSpec, TaskServ, TaskServSpec, condition,
};

use super::validate::{InvalidCluster, ServicePlan};
use crate::conditions::{self, DesiredCondition, Status};

/// Step kinds.
pub mod kind {
    /// Bring a pool's Servers up.
    pub const SERVERS: &str = "Servers";
    /// Install a service.
    pub const TASKSERV: &str = "TaskServ";
    /// Take something down (on delete or scale down).
    pub const TEARDOWN: &str = "Teardown";
}

/// Step states.
pub mod state {
    /// Not started: waits for earlier steps.
    pub const PENDING: &str = "Pending";
    /// In progress.
    pub const RUNNING: &str = "Running";
    /// Done.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Failed; the message says why.
    pub const FAILED: &str = "Failed";
}

/// How long a member's machine may stay starting before it is replaced (Cluster API's
/// MachineHealthCheck `nodeStartupTimeout`): a machine whose start was interrupted never
/// comes up by itself.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(150);

/// Reason of `Stalled` after `failurePolicy: Rollback` undid a failed rollout.
pub const REASON_ROLLED_BACK: &str = "RolledBack";

/// A Server of the cluster as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildServer {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Spec.
    pub spec: ServerSpec,
    /// Whether this Cluster is its controller owner.
    pub owned: bool,
    /// Ready=True.
    pub ready: bool,
    /// Stalled=True, with its message.
    pub stalled: Option<String>,
    /// Being deleted.
    pub deleting: bool,
    /// Its machine stopped or vanished at the provider (killed): it gets replaced.
    pub machine_failed: bool,
    /// Since when its machine has been starting (provider state pending), if it is.
    pub pending_since: Option<Timestamp>,
}

/// A TaskServ of the cluster as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildTaskServ {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Spec.
    pub spec: TaskServSpec,
    /// Whether this Cluster is its controller owner.
    pub owned: bool,
    /// Ready=True.
    pub ready: bool,
    /// Stalled=True, with its message.
    pub stalled: Option<String>,
    /// status.phase.
    pub phase: String,
    /// The Ready condition's message.
    pub message: String,
    /// Servers listed in its status (installed, installing or being drained).
    pub servers_in_status: BTreeSet<String>,
    /// It has been Ready before (status.lastGoodVersion is set).
    pub was_ever_ready: bool,
    /// Being deleted.
    pub deleting: bool,
}

/// Another Cluster of the namespace (for `dependsOn`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherCluster {
    /// Name.
    pub name: String,
    /// Ready=True.
    pub ready: bool,
}

/// Everything the planner looks at.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// Cluster name.
    pub name: &'a str,
    /// Cluster uid (for ownerReferences).
    pub uid: &'a str,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// Spec.
    pub spec: &'a ClusterSpec,
    /// Current status.
    pub status: &'a ClusterStatus,
    /// Validation result: services in install order.
    pub services: &'a Result<Vec<ServicePlan>, InvalidCluster>,
    /// Servers labelled with this cluster.
    pub servers: &'a [ChildServer],
    /// TaskServs labelled with this cluster.
    pub taskservs: &'a [ChildTaskServ],
    /// Other Clusters of the namespace.
    pub clusters: &'a [OtherCluster],
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
    /// For humans.
    pub note: String,
}

/// The outcome of planning.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Servers to create or update (server-side apply).
    pub apply_servers: Vec<Server>,
    /// Servers to delete, by name.
    pub delete_servers: Vec<String>,
    /// TaskServs to create or update (server-side apply).
    pub apply_taskservs: Vec<TaskServ>,
    /// TaskServs to delete, by name.
    pub delete_taskservs: Vec<String>,
    /// Status to write (equal to the old one on a no-op pass).
    pub status: ClusterStatus,
    /// Events.
    pub events: Vec<PlannedEvent>,
    /// When to look again.
    pub requeue: Option<Duration>,
    /// Deleting: everything is gone, the finalizer may go.
    pub teardown_done: bool,
}

/// Name of the `index`-th Server of `pool`.
pub fn server_name(cluster: &str, pool: &str, index: u32) -> String {
    format!("{cluster}-{pool}-{index}")
}

/// Name of the TaskServ of `service`.
pub fn taskserv_name(cluster: &str, service: &str) -> String {
    format!("{cluster}-{service}")
}

fn owner_reference(o: &Observed<'_>) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_string(),
        kind: "Cluster".to_string(),
        name: o.name.to_string(),
        uid: o.uid.to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The desired Servers of every pool, in pool order then index order.
pub fn desired_servers(o: &Observed<'_>) -> Vec<Server> {
    let mut out = Vec::new();
    for pool in &o.spec.pools {
        for i in 0..pool.replicas {
            let mut labels = pool.labels.clone();
            labels.insert(LABEL_CLUSTER.to_string(), o.name.to_string());
            labels.insert(LABEL_POOL.to_string(), pool.name.clone());
            let spec = ServerSpec {
                provider: o.spec.provider.clone(),
                plan: pool.plan.clone(),
                zone: pool.zone.clone(),
                image: pool.image.clone(),
                ..Default::default()
            };
            let mut server = Server::new(&server_name(o.name, &pool.name, i), spec);
            server.metadata = ObjectMeta {
                name: server.metadata.name.clone(),
                labels: Some(labels),
                owner_references: Some(vec![owner_reference(o)]),
                ..Default::default()
            };
            out.push(server);
        }
    }
    out
}

/// The desired TaskServ of one service.
pub fn desired_taskserv(o: &Observed<'_>, service: &ServicePlan, desired_servers: &[Server]) -> TaskServ {
    let names: Vec<String> = desired_servers
        .iter()
        .filter(|s| {
            s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_POOL)).is_some_and(|p| service.pools.contains(p))
        })
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    let spec = TaskServSpec {
        service: service.service.clone(),
        version: service.version.clone(),
        servers: ServerSelection { names, selector: None },
        config: service.config.clone(),
        config_from: service.config_from.clone(),
        depends_on: service.after.iter().map(|d| taskserv_name(o.name, d)).collect(),
        rollback_on_failure: true,
    };
    let mut ts = TaskServ::new(&taskserv_name(o.name, &service.service), spec);
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_CLUSTER.to_string(), o.name.to_string());
    ts.metadata = ObjectMeta {
        name: ts.metadata.name.clone(),
        labels: Some(labels),
        owner_references: Some(vec![owner_reference(o)]),
        ..Default::default()
    };
    ts
}

fn labels_cover(want: &Option<BTreeMap<String, String>>, have: &BTreeMap<String, String>) -> bool {
    want.iter().flatten().all(|(k, v)| have.get(k) == Some(v))
}

fn index_of(name: &str) -> u32 {
    name.rsplit('-').next().and_then(|i| i.parse().ok()).unwrap_or(u32::MAX)
}

/// Keeps a step's times across passes: set `startedAt` when it starts, `finishedAt` when it
/// ends, and restart both when a finished step regresses (a member died).
fn step(previous: &[ClusterStep], id: String, kind: &str, target: String, state: &str, message: String, now: &str) -> ClusterStep {
    let old = previous.iter().find(|s| s.id == id);
    let started_at = match (state, old) {
        (state::PENDING, _) => None,
        (_, Some(o)) if o.started_at.is_some() && !(o.state == state::SUCCEEDED && state == state::RUNNING) => {
            o.started_at.clone()
        }
        _ => Some(now.to_string()),
    };
    let finished_at = match (state, old) {
        (state::SUCCEEDED | state::FAILED, Some(o)) if o.state == state && o.finished_at.is_some() => o.finished_at.clone(),
        (state::SUCCEEDED | state::FAILED, _) => Some(now.to_string()),
        _ => None,
    };
    ClusterStep { id, kind: kind.to_string(), target, state: state.to_string(), started_at, finished_at, message }
}

fn step_events(previous: &[ClusterStep], steps: &[ClusterStep], events: &mut Vec<PlannedEvent>) {
    for s in steps {
        let before = previous.iter().find(|p| p.id == s.id).map(|p| p.state.as_str());
        if before == Some(s.state.as_str()) {
            continue;
        }
        match s.state.as_str() {
            state::RUNNING if before != Some(state::SUCCEEDED) => events.push(PlannedEvent {
                warning: false,
                reason: "StepStarted".into(),
                note: format!("{}: {}", s.id, s.message),
            }),
            state::RUNNING => events.push(PlannedEvent {
                warning: true,
                reason: "StepRegressed".into(),
                note: format!("{}: {}", s.id, s.message),
            }),
            state::SUCCEEDED => events.push(PlannedEvent {
                warning: false,
                reason: "StepSucceeded".into(),
                note: format!("{}: {}", s.id, s.message),
            }),
            state::FAILED => events.push(PlannedEvent {
                warning: true,
                reason: "StepFailed".into(),
                note: format!("{}: {}", s.id, s.message),
            }),
            _ => {}
        }
    }
}

/// Plans one reconcile of a Cluster that is not being deleted.
pub fn plan(o: &Observed<'_>) -> Plan {
    let now = crate::taskserv::plan::rfc3339(o.now);
    let mut events = Vec::new();
    let mut plan = Plan {
        apply_servers: Vec::new(),
        delete_servers: Vec::new(),
        apply_taskservs: Vec::new(),
        delete_taskservs: Vec::new(),
        status: o.status.clone(),
        events: Vec::new(),
        requeue: None,
        teardown_done: false,
    };

    let services = match o.services {
        Ok(s) => s,
        Err(e) => {
            let conds = vec![
                DesiredCondition::new(condition::READY, Status::False, e.reason, e.message.clone()),
                DesiredCondition::new(condition::RECONCILING, Status::False, "Stalled", ""),
                DesiredCondition::new(condition::STALLED, Status::True, e.reason, e.message.clone()),
                DesiredCondition::new(condition::SERVERS_READY, Status::Unknown, "NotPlanned", "the spec is invalid"),
                DesiredCondition::new(condition::TASKSERVS_READY, Status::Unknown, "NotPlanned", "the spec is invalid"),
            ];
            if !crate::conditions::find(&o.status.conditions, condition::STALLED)
                .is_some_and(|c| c.status == "True" && c.message == e.message)
            {
                events.push(PlannedEvent { warning: true, reason: e.reason.to_string(), note: e.message.clone() });
            }
            plan.status = ClusterStatus {
                phase: Some("Failed".into()),
                observed_generation: o.generation,
                conditions: conditions::merge(&o.status.conditions, &conds, o.generation, o.now),
                ..o.status.clone()
            };
            plan.events = events;
            plan.requeue = Some(Duration::from_secs(300));
            return plan;
        }
    };

    // Clusters this one depends on must be Ready before anything starts.
    let waiting_for: Vec<String> = o
        .spec
        .depends_on
        .iter()
        .filter_map(|d| match o.clusters.iter().find(|c| &c.name == d) {
            None => Some(format!("Cluster {d} (not found)")),
            Some(c) if !c.ready => Some(format!("Cluster {d}")),
            Some(_) => None,
        })
        .collect();

    // A rollout rolled back under failurePolicy Rollback stays so until the spec changes.
    let rolled_back = crate::conditions::find(&o.status.conditions, condition::STALLED)
        .filter(|c| c.status == "True" && c.reason == REASON_ROLLED_BACK && c.observed_generation == o.generation)
        .map(|c| c.message.clone());

    let desired = desired_servers(o);
    let desired_names: BTreeSet<String> = desired.iter().filter_map(|s| s.metadata.name.clone()).collect();
    let servers_by_name: BTreeMap<&str, &ChildServer> = o.servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let ts_by_name: BTreeMap<&str, &ChildTaskServ> = o.taskservs.iter().map(|t| (t.name.as_str(), t)).collect();

    let mut steps: Vec<ClusterStep> = Vec::new();
    let mut step_state: BTreeMap<String, &'static str> = BTreeMap::new();
    let limit = o.spec.parallel_limit.max(1) as usize;
    let mut in_progress = desired
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .filter(|n| servers_by_name.get(n).is_some_and(|s| !s.ready))
        .count();
    let blocked = !waiting_for.is_empty() || rolled_back.is_some();

    // Servers, pool by pool.
    let mut ready_count = 0u32;
    for pool in &o.spec.pools {
        let pool_servers: Vec<&Server> = desired
            .iter()
            .filter(|s| s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_POOL)) == Some(&pool.name))
            .collect();
        let mut ready = 0u32;
        let mut failed: Vec<String> = Vec::new();
        for want in &pool_servers {
            let name = want.metadata.name.clone().unwrap_or_default();
            match servers_by_name.get(name.as_str()) {
                Some(have) => {
                    if have.ready {
                        ready += 1;
                    }
                    if let Some(msg) = &have.stalled {
                        failed.push(format!("Server {name}: {msg}"));
                    }
                    let drifted = have.spec != want.spec || !labels_cover(&want.metadata.labels, &have.labels);
                    if drifted && !have.deleting && !blocked {
                        plan.apply_servers.push((*want).clone());
                    }
                }
                None if !blocked && in_progress < limit => {
                    plan.apply_servers.push((*want).clone());
                    in_progress += 1;
                }
                None => {}
            }
        }
        ready_count += ready;
        let total = pool_servers.len() as u32;
        let (st, msg) = if !failed.is_empty() {
            (state::FAILED, failed.join("; "))
        } else if ready == total {
            (state::SUCCEEDED, format!("{ready}/{total} servers ready"))
        } else if blocked && ready == 0 && !pool_servers.iter().any(|s| servers_by_name.contains_key(s.metadata.name.as_deref().unwrap_or_default())) {
            (state::PENDING, match &rolled_back {
                Some(m) => m.clone(),
                None => format!("waiting for {}", waiting_for.join(", ")),
            })
        } else {
            (state::RUNNING, format!("{ready}/{total} servers ready"))
        };
        let id = format!("servers/{}", pool.name);
        step_state.insert(id.clone(), st);
        steps.push(step(&o.status.steps, id, kind::SERVERS, format!("pool {}", pool.name), st, msg, &now));
    }

    // Services, in install order.
    let mut ts_statuses = Vec::new();
    for svc in services {
        let id = format!("taskserv/{}", svc.service);
        let name = taskserv_name(o.name, &svc.service);
        let prereqs_done = svc.pools.iter().all(|p| step_state.get(&format!("servers/{p}")) == Some(&state::SUCCEEDED))
            && svc.after.iter().all(|d| step_state.get(&format!("taskserv/{d}")) == Some(&state::SUCCEEDED));
        let want = desired_taskserv(o, svc, &desired);
        let have = ts_by_name.get(name.as_str()).copied();
        match have {
            Some(h) => {
                let drifted = h.spec != want.spec || !labels_cover(&want.metadata.labels, &h.labels);
                if drifted && !h.deleting && !blocked {
                    plan.apply_taskservs.push(want.clone());
                }
            }
            None if prereqs_done && !blocked => plan.apply_taskservs.push(want.clone()),
            None => {}
        }
        let (st, msg) = match have {
            None if prereqs_done && !blocked => (state::RUNNING, format!("creating TaskServ {name}")),
            None => (state::PENDING, if blocked {
                rolled_back.clone().unwrap_or_else(|| format!("waiting for {}", waiting_for.join(", ")))
            } else {
                "waiting for earlier steps".to_string()
            }),
            Some(h) if h.stalled.is_some() => (state::FAILED, format!("TaskServ {name}: {}", h.stalled.clone().unwrap_or_default())),
            Some(h) if h.phase == "Failed" => (state::FAILED, format!("TaskServ {name}: {}", h.message)),
            Some(h) if h.ready && h.spec == want.spec => (state::SUCCEEDED, format!("TaskServ {name} Ready")),
            Some(h) => (state::RUNNING, format!("TaskServ {name}: {}", h.message)),
        };
        ts_statuses.push(ClusterTaskServStatus {
            service: svc.service.clone(),
            phase: have.map(|h| h.phase.clone()).filter(|p| !p.is_empty()).unwrap_or_else(|| "Pending".into()),
        });
        step_state.insert(id.clone(), st);
        steps.push(step(&o.status.steps, id, kind::TASKSERV, format!("TaskServ {name}"), st, msg, &now));
    }

    // Scale down and removed services: drain, then delete.
    let wanted_ts: BTreeSet<String> = services.iter().map(|s| taskserv_name(o.name, &s.service)).collect();
    let mut drained_ts: Vec<&ChildTaskServ> = o.taskservs.iter().filter(|t| t.owned && !wanted_ts.contains(&t.name)).collect();
    drained_ts.sort_by_key(|t| t.name.clone());
    for t in &drained_ts {
        // Nothing may still depend on it.
        let needed = o.taskservs.iter().any(|u| u.name != t.name && wanted_ts.contains(&u.name) && u.spec.depends_on.contains(&t.name));
        if !needed && !t.deleting {
            plan.delete_taskservs.push(t.name.clone());
        }
        steps.push(step(
            &o.status.steps,
            format!("teardown/taskserv/{}", t.spec.service),
            kind::TEARDOWN,
            format!("TaskServ {}", t.name),
            state::RUNNING,
            format!("removing TaskServ {} (no longer in spec)", t.name),
            &now,
        ));
    }
    let mut extra: Vec<&ChildServer> = o.servers.iter().filter(|s| s.owned && !desired_names.contains(&s.name)).collect();
    extra.sort_by_key(|s| (s.labels.get(LABEL_POOL).cloned(), std::cmp::Reverse(index_of(&s.name))));
    for s in &extra {
        // Drained once no TaskServ lists it any more (their remove.nu has run).
        let still_used = o.taskservs.iter().any(|t| t.servers_in_status.contains(&s.name) || t.spec.servers.names.contains(&s.name));
        let in_new_spec = plan.apply_taskservs.iter().any(|t| t.spec.servers.names.contains(&s.name));
        let draining = still_used && !in_new_spec;
        if !still_used && !s.deleting {
            plan.delete_servers.push(s.name.clone());
        }
        steps.push(step(
            &o.status.steps,
            format!("teardown/server/{}", s.name),
            kind::TEARDOWN,
            format!("Server {}", s.name),
            state::RUNNING,
            if draining { format!("draining services from {}", s.name) } else { format!("deleting Server {}", s.name) },
            &now,
        ));
    }

    // A member whose machine died is replaced (Cluster API's MachineHealthCheck remediation):
    // the Server goes (its machine with it) and comes back under the same name, and its
    // TaskServs re-install there.
    for s in o.servers.iter().filter(|s| s.owned && !s.ready && !s.deleting && desired_names.contains(&s.name)) {
        let stuck = s.pending_since.is_some_and(|t| o.now.duration_since(t).unsigned_abs() > STARTUP_TIMEOUT);
        let why = if s.machine_failed {
            "stopped"
        } else if stuck {
            "did not start within the startup timeout"
        } else {
            continue;
        };
        if !plan.delete_servers.contains(&s.name) {
            plan.delete_servers.push(s.name.clone());
            events.push(PlannedEvent {
                warning: true,
                reason: "Remediating".into(),
                note: format!("the machine of Server {} {why}: replacing the Server", s.name),
            });
        }
    }

    // failurePolicy: Rollback undoes what a failed rollout added.
    let failed_steps: Vec<&ClusterStep> = steps.iter().filter(|s| s.state == state::FAILED).collect();
    let mut stalled: Option<(String, String)> = None;
    if let Some(msg) = &rolled_back {
        stalled = Some((REASON_ROLLED_BACK.to_string(), msg.clone()));
        rollback_children(o, &desired_names, &mut plan);
    } else if !failed_steps.is_empty() {
        let msg = failed_steps.iter().map(|s| format!("step {} failed: {}", s.id, s.message)).collect::<Vec<_>>().join("; ");
        if o.spec.failure_policy == FailurePolicy::Rollback {
            let msg = format!("{msg}; rolled back (failurePolicy Rollback)");
            events.push(PlannedEvent { warning: true, reason: "RollingBack".into(), note: msg.clone() });
            plan.apply_servers.clear();
            plan.apply_taskservs.clear();
            rollback_children(o, &desired_names, &mut plan);
            stalled = Some((REASON_ROLLED_BACK.to_string(), msg));
        } else if failed_steps.iter().any(|s| s.message.contains("Stalled") || o.taskservs.iter().any(|t| t.stalled.is_some() && s.target == format!("TaskServ {}", t.name)) || o.servers.iter().any(|sv| sv.stalled.is_some())) {
            stalled = Some(("StepFailed".to_string(), msg));
        }
    }

    // Summary.
    let desired_count = desired.len() as u32;
    let servers_ready = ready_count == desired_count && extra.is_empty();
    let ts_ready = services.iter().all(|s| step_state.get(&format!("taskserv/{}", s.service)) == Some(&state::SUCCEEDED))
        && drained_ts.is_empty();
    let ready = stalled.is_none() && waiting_for.is_empty() && servers_ready && ts_ready;
    let running: Vec<&ClusterStep> = steps.iter().filter(|s| s.state == state::RUNNING || s.state == state::FAILED).collect();
    let progress_msg = if !waiting_for.is_empty() {
        format!("waiting for {}", waiting_for.join(", "))
    } else if let Some(s) = running.first() {
        format!("{}: {}", s.id, s.message)
    } else if let Some(s) = steps.iter().find(|s| s.state == state::PENDING) {
        format!("{}: {}", s.id, s.message)
    } else {
        String::new()
    };
    let mut conds = Vec::new();
    if ready {
        conds.push(DesiredCondition::new(condition::READY, Status::True, "Ready", format!("{desired_count} servers and {} services ready", services.len())));
        conds.push(DesiredCondition::new(condition::RECONCILING, Status::False, "Idle", ""));
        conds.push(DesiredCondition::new(condition::STALLED, Status::False, "NotStalled", ""));
    } else if let Some((reason, msg)) = &stalled {
        conds.push(DesiredCondition::new(condition::READY, Status::False, reason, msg.clone()));
        conds.push(DesiredCondition::new(condition::RECONCILING, Status::False, "Stalled", ""));
        conds.push(DesiredCondition::new(condition::STALLED, Status::True, reason, msg.clone()));
    } else {
        let reason = if waiting_for.is_empty() { "Progressing" } else { "WaitingForClusters" };
        conds.push(DesiredCondition::new(condition::READY, Status::False, reason, progress_msg.clone()));
        conds.push(DesiredCondition::new(condition::RECONCILING, Status::True, reason, progress_msg.clone()));
        conds.push(DesiredCondition::new(condition::STALLED, Status::False, "NotStalled", ""));
    }
    conds.push(DesiredCondition::new(
        condition::SERVERS_READY,
        Status::from_bool(servers_ready),
        if servers_ready { "ServersReady" } else { "ServersNotReady" },
        format!("{ready_count}/{desired_count} servers ready"),
    ));
    let ts_ready_count = services.iter().filter(|s| step_state.get(&format!("taskserv/{}", s.service)) == Some(&state::SUCCEEDED)).count();
    conds.push(DesiredCondition::new(
        condition::TASKSERVS_READY,
        Status::from_bool(ts_ready),
        if ts_ready { "TaskServsReady" } else { "TaskServsNotReady" },
        format!("{ts_ready_count}/{} services ready", services.len()),
    ));

    let phase = if ready {
        "Ready"
    } else if stalled.is_some() {
        "Failed"
    } else if !waiting_for.is_empty() {
        "Pending"
    } else if !servers_ready && o.status.phase.as_deref() == Some("Ready") {
        "Degraded"
    } else if !servers_ready {
        "Provisioning"
    } else {
        "Installing"
    };

    step_events(&o.status.steps, &steps, &mut events);
    if ready && !conditions::is_true(&o.status.conditions, condition::READY) {
        events.push(PlannedEvent { warning: false, reason: "Ready".into(), note: conds[0].message.clone() });
    }

    plan.status = ClusterStatus {
        phase: Some(phase.to_string()),
        observed_generation: o.generation,
        conditions: conditions::merge(&o.status.conditions, &conds, o.generation, o.now),
        servers: Some(ClusterServerCounts {
            desired: desired_count,
            ready: ready_count,
            summary: format!("{ready_count}/{desired_count}"),
        }),
        taskservs: ts_statuses,
        steps,
        cost: o.status.cost.clone(),
    };
    plan.events = events;
    // Ready or Stalled: children's changes trigger us anyway; else poll while rolling out.
    plan.requeue = Some(if ready || stalled.is_some() { Duration::from_secs(300) } else { Duration::from_secs(10) });
    plan
}

/// Children a failed rollout added and that never worked are removed: TaskServs never Ready
/// and Servers not Ready. TaskServs that were Ready before roll their own version back
/// (`rollbackOnFailure`).
fn rollback_children(o: &Observed<'_>, desired_names: &BTreeSet<String>, plan: &mut Plan) {
    let _ = desired_names;
    let doomed_ts: Vec<&ChildTaskServ> = o.taskservs.iter().filter(|t| t.owned && !t.was_ever_ready && !t.deleting).collect();
    for t in &doomed_ts {
        if !plan.delete_taskservs.contains(&t.name) {
            plan.delete_taskservs.push(t.name.clone());
        }
    }
    for s in o.servers.iter().filter(|s| s.owned && !s.ready && !s.deleting) {
        let used = o.taskservs.iter().any(|t| t.servers_in_status.contains(&s.name) && !doomed_ts.iter().any(|d| d.name == t.name));
        if !used && !plan.delete_servers.contains(&s.name) {
            plan.delete_servers.push(s.name.clone());
        }
    }
}

/// Plans one pass of teardown: TaskServs in reverse install order (one goes only when nothing
/// that depends on it is left), then Servers once no TaskServ is left. Done when the cluster
/// has no children.
pub fn plan_teardown(o: &Observed<'_>, install_order: &[String]) -> Plan {
    let now = crate::taskserv::plan::rfc3339(o.now);
    let mut plan = Plan {
        apply_servers: Vec::new(),
        delete_servers: Vec::new(),
        apply_taskservs: Vec::new(),
        delete_taskservs: Vec::new(),
        status: o.status.clone(),
        events: Vec::new(),
        requeue: Some(Duration::from_secs(2)),
        teardown_done: false,
    };
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
        let dependents: Vec<&str> = o
            .taskservs
            .iter()
            .filter(|u| u.name != t.name && (u.spec.depends_on.contains(&t.name)))
            .map(|u| u.name.as_str())
            .collect();
        let msg = if dependents.is_empty() {
            if !t.deleting {
                plan.delete_taskservs.push(t.name.clone());
            }
            format!("removing {} from {} servers", t.spec.service, t.servers_in_status.len())
        } else {
            format!("waiting for {} to be removed first", dependents.join(", "))
        };
        steps.push(step(
            &o.status.steps,
            format!("teardown/taskserv/{}", t.spec.service),
            kind::TEARDOWN,
            format!("TaskServ {}", t.name),
            if dependents.is_empty() { state::RUNNING } else { state::PENDING },
            msg,
            &now,
        ));
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
            state::RUNNING
        } else {
            state::PENDING
        };
        steps.push(step(
            &o.status.steps,
            format!("teardown/servers/{pool}"),
            kind::TEARDOWN,
            format!("pool {pool}"),
            st,
            format!("{} servers left", servers.len()),
            &now,
        ));
    }
    plan.teardown_done = o.taskservs.is_empty() && o.servers.is_empty();
    let msg = format!("deleting: {} TaskServs and {} Servers left", o.taskservs.len(), o.servers.len());
    let conds = [
        DesiredCondition::new(condition::READY, Status::False, "Deleting", msg.clone()),
        DesiredCondition::new(condition::RECONCILING, Status::True, "Deleting", msg),
        DesiredCondition::new(condition::STALLED, Status::False, "NotStalled", ""),
    ];
    let mut merged = conditions::merge(&o.status.conditions, &conds, o.generation, o.now);
    for c in &o.status.conditions {
        if !merged.iter().any(|m| m.type_ == c.type_) {
            merged.push(c.clone());
        }
    }
    step_events(&o.status.steps, &steps, &mut plan.events);
    plan.status = ClusterStatus {
        phase: Some("Deleting".into()),
        observed_generation: o.generation,
        conditions: merged,
        steps,
        ..o.status.clone()
    };
    plan
}
