//! The rollout steps of one pass: pools (`servers/<pool>`), services in install order
//! (`taskserv/<service>`), scale-down and removed services (`teardown/…`), and the
//! replacement of members whose machine died.

use std::collections::{BTreeMap, BTreeSet};

use provisioning_crds::{ClusterStep, ClusterTaskServStatus, LABEL_POOL, Server};

use super::model::{
    ChildServer, ChildTaskServ, EndpointGate, LABEL_SURGE, Observed, Plan, Planned, PlannedEvent, ROLLING, StepKind, StepState, available,
    desired_taskserv, desired_with_surge, index_of, labels_cover, machine_differs, settled, taskserv_name,
};
use crate::cluster::validate::ServicePlan;

/// What the steps of one pass build up and the summary reads.
pub(super) struct Rollout {
    /// `now` in RFC 3339 seconds (step times).
    pub now: String,
    /// Clusters of `dependsOn` that are not Ready, each named (`Cluster db (not found)`).
    pub waiting_for: Vec<String>,
    /// Some of them do not exist.
    pub dependency_missing: bool,
    /// The message of a rollout rolled back under failurePolicy Rollback (this generation).
    pub rolled_back: Option<String>,
    /// The desired Servers: the pools' members, then surge Servers of rolling updates.
    pub desired: Vec<Server>,
    /// How many of them are members (the rest are surge Servers).
    pub members: u32,
    /// Members updated: on their pool's machine spec and available.
    pub updated_count: u32,
    /// A pool's machines are being rolled (members on an old spec, or surge Servers up).
    pub rolling: bool,
    /// Their names.
    pub desired_names: BTreeSet<String>,
    /// Steps of this pass, in order.
    pub steps: Vec<ClusterStep>,
    /// State of each step by id.
    pub state: BTreeMap<String, StepState>,
    /// Failed steps whose failure is a Stalled child (nothing changes until its spec does).
    pub stalled_steps: BTreeSet<String>,
    /// Ready desired Servers.
    pub ready_count: u32,
    /// Owned Servers no longer desired (scale down).
    pub extra_servers: usize,
    /// Owned TaskServs no longer desired.
    pub drained_taskservs: usize,
    /// The services' entries of `status.taskservs`.
    pub taskserv_statuses: Vec<ClusterTaskServStatus>,
    /// Events so far.
    pub events: Vec<PlannedEvent>,
    /// Desired Servers being brought up (bounded by `parallelLimit`).
    in_progress: usize,
}

impl Rollout {
    /// Observes what gates the rollout: other Clusters, a rollback, the desired Servers.
    pub fn start(o: &Observed<'_>) -> Rollout {
        // Clusters this one depends on must be Ready before anything starts.
        let mut dependency_missing = false;
        let waiting_for: Vec<String> = o
            .spec
            .depends_on
            .iter()
            .filter_map(|d| match o.clusters.iter().find(|c| &c.name == d) {
                None => {
                    dependency_missing = true;
                    Some(format!("Cluster {d} (not found)"))
                }
                Some(c) if !c.ready => Some(format!("Cluster {d}")),
                Some(_) => None,
            })
            .collect();
        // A rollout rolled back under failurePolicy Rollback stays so until the spec changes.
        let rolled_back = super::model::rolled_back(o);
        let desired = desired_with_surge(o);
        let members = o.spec.pools.iter().map(|p| p.replicas).sum();
        let desired_names: BTreeSet<String> = desired.iter().filter_map(|s| s.metadata.name.clone()).collect();
        let in_progress = desired_names.iter().filter(|n| o.servers.iter().any(|s| &s.name == *n && !s.ready)).count();
        Rollout {
            now: crate::taskserv::plan::rfc3339(o.now),
            waiting_for,
            dependency_missing,
            rolled_back,
            desired,
            members,
            updated_count: 0,
            rolling: false,
            desired_names,
            steps: Vec::new(),
            state: BTreeMap::new(),
            stalled_steps: BTreeSet::new(),
            ready_count: 0,
            extra_servers: 0,
            drained_taskservs: 0,
            taskserv_statuses: Vec::new(),
            events: Vec::new(),
            in_progress,
        }
    }

    /// Nothing new starts: waiting for other Clusters, or rolled back.
    fn blocked(&self) -> bool {
        !self.waiting_for.is_empty() || self.rolled_back.is_some()
    }

    /// Why a step that cannot start waits.
    fn blocked_message(&self) -> String {
        self.rolled_back.clone().unwrap_or_else(|| format!("waiting for {}", self.waiting_for.join(", ")))
    }

    fn push(&mut self, o: &Observed<'_>, step: Planned) {
        self.state.insert(step.id.clone(), step.state);
        self.steps.push(step.into_step(&o.status.steps, &self.now));
    }

    /// A step has succeeded this pass.
    pub fn succeeded(&self, id: &str) -> bool {
        self.state.get(id) == Some(&StepState::Succeeded)
    }

    /// Servers, pool by pool: create missing ones (within `parallelLimit`), update drifted
    /// ones, one step per pool. A member's machine change (plan, zone, image) waits for its
    /// turn under the pool's `rollout`; anything else is applied at once.
    // Over 80 lines on purpose: one pass over a pool's members gathers what the rolling budget,
    // the step's state and the counts all need; split, each part would walk them again.
    pub fn pools(&mut self, o: &Observed<'_>, plan: &mut Plan) {
        let limit = o.spec.parallel_limit.max(1) as usize;
        let blocked = self.blocked();
        let by_name: BTreeMap<&str, &ChildServer> = o.servers.iter().map(|s| (s.name.as_str(), s)).collect();
        for pool in &o.spec.pools {
            let (members, surge): (Vec<Server>, Vec<Server>) = self
                .desired
                .iter()
                .filter(|s| s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_POOL)) == Some(&pool.name))
                .cloned()
                .partition(|s| s.metadata.labels.as_ref().is_none_or(|l| !l.contains_key(LABEL_SURGE)));
            let (mut ready, mut failed, mut any_exists) = (0u32, Vec::new(), false);
            // Members taken (being updated, or not available) and members on an old machine spec.
            let (mut taken, mut updated) = (0usize, 0u32);
            let mut outdated: Vec<(&Server, bool)> = Vec::new();
            for (want, is_member) in members.iter().map(|s| (s, true)).chain(surge.iter().map(|s| (s, false))) {
                let name = want.metadata.name.clone().unwrap_or_default();
                match by_name.get(name.as_str()) {
                    Some(have) => {
                        any_exists = true;
                        if let Some(msg) = &have.stalled {
                            failed.push(format!("Server {name}: {msg}"));
                        }
                        let drifted = have.spec != want.spec || !labels_cover(&want.metadata.labels, &have.labels);
                        if is_member {
                            ready += u32::from(have.ready);
                            let up = available(o, have);
                            let done = settled(o, have, &want.spec);
                            updated += u32::from(done);
                            if machine_differs(&have.spec, &want.spec) {
                                taken += usize::from(!up);
                                if !have.deleting && !blocked {
                                    outdated.push((want, up));
                                }
                                continue;
                            }
                            taken += usize::from(!done);
                        }
                        if drifted && !have.deleting && !blocked {
                            plan.apply_servers.push(want.clone());
                        }
                    }
                    None => {
                        taken += usize::from(is_member);
                        if !blocked && self.in_progress < limit {
                            plan.apply_servers.push(want.clone());
                            self.in_progress += 1;
                        }
                    }
                }
            }
            // Rolling: members on an old spec are taken down while the budget allows —
            // `maxUnavailable` plus the surge Servers serving, minus members already taken.
            // One that is down anyway costs nothing. No rollout: all at once.
            let surge_up =
                surge.iter().filter_map(|s| s.metadata.name.as_deref()).filter(|n| by_name.get(n).is_some_and(|h| available(o, h))).count();
            let mut budget = match &pool.rollout {
                Some(r) => (r.max_unavailable as usize + surge_up).saturating_sub(taken),
                None => usize::MAX,
            };
            let old = outdated.len();
            for (want, up) in outdated {
                if up {
                    if budget == 0 {
                        continue;
                    }
                    budget -= 1;
                }
                plan.apply_servers.push(want.clone());
            }
            self.ready_count += ready;
            self.updated_count += updated;
            let total = members.len() as u32;
            let id = format!("servers/{}", pool.name);
            // A rolling update lasts until every member is updated (the step's message is the
            // checkpoint that one started).
            let was_rolling = o.status.steps.iter().any(|s| s.id == id && s.message.starts_with(ROLLING));
            let rolling = old > 0 || !surge.is_empty() || (was_rolling && updated < total);
            self.rolling |= rolling;
            let (state, msg) = if !failed.is_empty() {
                // Only a Stalled Server fails a pool.
                self.stalled_steps.insert(id.clone());
                (StepState::Failed, failed.join("; "))
            } else if rolling {
                (StepState::Running, rolling_message(pool, updated, total, surge.len()))
            } else if ready == total {
                (StepState::Succeeded, format!("{ready}/{total} servers ready"))
            } else if blocked && ready == 0 && !any_exists {
                (StepState::Pending, self.blocked_message())
            } else {
                (StepState::Running, format!("{ready}/{total} servers ready"))
            };
            self.push(o, Planned::new(id, StepKind::Servers, format!("pool {}", pool.name), state, msg));
        }
    }

    /// Services in install order: each TaskServ is created once its pools and the services it
    /// comes after have succeeded, and kept as desired.
    pub fn services(&mut self, o: &Observed<'_>, services: &[ServicePlan], plan: &mut Plan) {
        let blocked = self.blocked();
        for svc in services {
            let id = format!("taskserv/{}", svc.service);
            let name = taskserv_name(o.name, &svc.service);
            let others_done = svc.pools.iter().all(|p| self.succeeded(&format!("servers/{p}")))
                && svc.after.iter().all(|d| self.succeeded(&format!("taskserv/{d}")));
            // The kubernetes service waits for the control-plane endpoint (kubeadm init uses it).
            let endpoint_wait = match &o.endpoint {
                EndpointGate::Waiting(why) if svc.service == provisioning_crds::KUBERNETES_SERVICE => Some(why.clone()),
                _ => None,
            };
            let prereqs_done = others_done && endpoint_wait.is_none();
            let want = desired_taskserv(o, svc, &self.desired);
            let have = o.taskservs.iter().find(|t| t.name == name);
            match have {
                Some(h) => {
                    let drifted = h.spec != want.spec || !labels_cover(&want.metadata.labels, &h.labels);
                    if drifted && !h.deleting && !blocked {
                        plan.apply_taskservs.push(want.clone());
                    } else if drifted && !h.deleting && self.rolled_back.is_some() {
                        // Rolled back: nothing new goes out, but Servers no longer wanted (the
                        // surge Servers of the failed rollout) leave the service, so they drain
                        // and go instead of serving the failed spec until the next spec change.
                        let mut leave = want.clone();
                        leave.spec = h.spec.clone();
                        leave.spec.servers.names.retain(|n| self.desired_names.contains(n));
                        if leave.spec != h.spec {
                            plan.apply_taskservs.push(leave);
                        }
                    }
                }
                None if prereqs_done && !blocked => plan.apply_taskservs.push(want.clone()),
                None => {}
            }
            let (state, msg) = match have {
                None if prereqs_done && !blocked => (StepState::Running, format!("creating TaskServ {name}")),
                None if blocked => (StepState::Pending, self.blocked_message()),
                None => {
                    (StepState::Pending, endpoint_wait.filter(|_| others_done).unwrap_or_else(|| "waiting for earlier steps".to_string()))
                }
                Some(h) if h.stalled.is_some() => {
                    self.stalled_steps.insert(id.clone());
                    (StepState::Failed, format!("TaskServ {name}: {}", h.stalled.clone().unwrap_or_default()))
                }
                Some(h) if h.phase == "Failed" => (StepState::Failed, format!("TaskServ {name}: {}", h.message)),
                Some(h) if h.ready && h.spec == want.spec => (StepState::Succeeded, format!("TaskServ {name} Ready")),
                Some(h) => (StepState::Running, format!("TaskServ {name}: {}", h.message)),
            };
            self.taskserv_statuses.push(ClusterTaskServStatus {
                service: svc.service.clone(),
                phase: have.map(|h| h.phase.clone()).filter(|p| !p.is_empty()).unwrap_or_else(|| "Pending".into()),
            });
            self.push(o, Planned::new(id, StepKind::TaskServ, format!("TaskServ {name}"), state, msg));
        }
    }

    /// Scale down and removed services: drain, then delete.
    pub fn scale_down(&mut self, o: &Observed<'_>, services: &[ServicePlan], plan: &mut Plan) {
        let wanted_ts: BTreeSet<String> = services.iter().map(|s| taskserv_name(o.name, &s.service)).collect();
        let mut drained_ts: Vec<&ChildTaskServ> = o.taskservs.iter().filter(|t| t.owned && !wanted_ts.contains(&t.name)).collect();
        drained_ts.sort_by_key(|t| t.name.clone());
        self.drained_taskservs = drained_ts.len();
        for t in &drained_ts {
            // Nothing may still depend on it.
            let needed = o.taskservs.iter().any(|u| u.name != t.name && wanted_ts.contains(&u.name) && u.spec.depends_on.contains(&t.name));
            if !needed && !t.deleting {
                plan.delete_taskservs.push(t.name.clone());
            }
            let id = format!("teardown/taskserv/{}", t.spec.service);
            let msg = format!("removing TaskServ {} (no longer in spec)", t.name);
            self.push(o, Planned::new(id, StepKind::Teardown, format!("TaskServ {}", t.name), StepState::Running, msg));
        }
        let mut extra: Vec<&ChildServer> = o.servers.iter().filter(|s| s.owned && !self.desired_names.contains(&s.name)).collect();
        extra.sort_by_key(|s| (s.labels.get(LABEL_POOL).cloned(), std::cmp::Reverse(index_of(&s.name))));
        self.extra_servers = extra.len();
        for s in &extra {
            // Drained once no TaskServ lists it any more (their remove.nu has run).
            let still_used = o.taskservs.iter().any(|t| t.servers_in_status.contains(&s.name) || t.spec.servers.names.contains(&s.name));
            let in_new_spec = plan.apply_taskservs.iter().any(|t| t.spec.servers.names.contains(&s.name));
            let draining = still_used && !in_new_spec;
            if !still_used && !s.deleting {
                plan.delete_servers.push(s.name.clone());
            }
            let msg = if draining { format!("draining services from {}", s.name) } else { format!("deleting Server {}", s.name) };
            let id = format!("teardown/server/{}", s.name);
            self.push(o, Planned::new(id, StepKind::Teardown, format!("Server {}", s.name), StepState::Running, msg));
        }
    }

    /// A member whose machine died is replaced (Cluster API's MachineHealthCheck
    /// remediation): the Server goes (its machine with it) and comes back under the same
    /// name, and its TaskServs re-install there.
    pub fn remediate(&mut self, o: &Observed<'_>, plan: &mut Plan) {
        for s in o.servers.iter().filter(|s| self.desired_names.contains(&s.name)) {
            let Some(why) = super::model::remediation(o, s) else { continue };
            if !plan.delete_servers.contains(&s.name) {
                plan.delete_servers.push(s.name.clone());
                self.events
                    .push(PlannedEvent::warning("Remediating", format!("the machine of Server {} {why}: replacing the Server", s.name)));
            }
        }
    }
}

fn rolling_message(pool: &provisioning_crds::ServerPool, updated: u32, total: u32, surge: usize) -> String {
    let r = pool.rollout.clone().unwrap_or_default();
    let how = match &pool.rollout {
        Some(_) => format!("maxUnavailable {}, maxSurge {}", r.max_unavailable, r.max_surge),
        None => "all at once".to_string(),
    };
    format!("{ROLLING}: {updated}/{total} servers updated, {surge} surge ({how})")
}
