//! The typed states and the desired children the cluster planner's steps share: what each
//! step reads ([`Observed`]) and builds ([`Plan`]), and the pure helpers over them. The steps
//! and [`super::plan`], which composes them, import from here; nothing here imports a step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{
    API_VERSION, ClusterSpec, ClusterStatus, ClusterStep, LABEL_CLUSTER, LABEL_POOL, Server, ServerPool, ServerSelection, ServerSpec,
    TaskServ, TaskServSpec,
};

use crate::cluster::validate::{InvalidCluster, ServicePlan};
pub use crate::planning::PlannedEvent;
use crate::planning::{REASON_DEPENDENCY_CYCLE, cycle_message, depends_on_cycle};

/// Kind of a rollout step (`status.steps[].kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Bring a pool's Servers up.
    Servers,
    /// Install a service.
    TaskServ,
    /// Take something down (on delete or scale down).
    Teardown,
}

impl StepKind {
    /// As written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Servers => "Servers",
            StepKind::TaskServ => "TaskServ",
            StepKind::Teardown => "Teardown",
        }
    }
}

/// State of a rollout step (`status.steps[].state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepState {
    /// Not started: waits for earlier steps.
    Pending,
    /// In progress.
    Running,
    /// Done.
    Succeeded,
    /// Failed; the message says why.
    Failed,
}

impl StepState {
    /// As written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Pending => "Pending",
            StepState::Running => "Running",
            StepState::Succeeded => "Succeeded",
            StepState::Failed => "Failed",
        }
    }
    /// The state of a recorded step (`None` for a string this version does not write).
    pub fn of(step: &ClusterStep) -> Option<StepState> {
        [StepState::Pending, StepState::Running, StepState::Succeeded, StepState::Failed].into_iter().find(|s| s.as_str() == step.state)
    }
}

/// The Cluster's phase (`status.phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the Clusters it depends on.
    Pending,
    /// Servers coming up.
    Provisioning,
    /// Services installing.
    Installing,
    /// Everything Ready.
    Ready,
    /// Was Ready, a member is not.
    Degraded,
    /// Invalid spec, failed or rolled-back rollout.
    Failed,
    /// Being torn down.
    Deleting,
}

impl Phase {
    /// As written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Installing => "Installing",
            Phase::Ready => "Ready",
            Phase::Degraded => "Degraded",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
        }
    }
}

/// How long a member's machine may stay starting before it is replaced (Cluster API's
/// MachineHealthCheck `nodeStartupTimeout`): a machine whose start was interrupted never
/// comes up by itself.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(150);

/// Reason of `Stalled` after `failurePolicy: Rollback` undid a failed rollout.
pub const REASON_ROLLED_BACK: &str = "RolledBack";

/// Prefix of a pool step's message during a rolling update of its machines.
pub(super) const ROLLING: &str = "rolling update";

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
    /// Its own `status.plan` (what it would still do to its machine).
    pub pending_plan: Option<provisioning_crds::Plan>,
    /// Its machine (status.providerID).
    pub provider_id: Option<String>,
    /// Its status describes its current spec (observedGeneration = generation): its plan and
    /// readiness are about the spec it has now, not an earlier one.
    pub observed_current: bool,
    /// Its `provisioning.dev/approve` annotation.
    pub approve: Option<String>,
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
    /// Servers where it serves now (installed, not failed, not unhealthy), each with the
    /// machine it was installed on (None: recorded before machines were).
    pub serving: BTreeMap<String, Option<String>>,
    /// Its own `status.plan` (what its scripts would still do, per server).
    pub pending_plan: Option<provisioning_crds::Plan>,
    /// Its `provisioning.dev/approve` annotation.
    pub approve: Option<String>,
    /// Its status describes its current generation (so its plan is current).
    pub settled: bool,
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
    /// Where the control-plane endpoint stands (the kubernetes service waits for it).
    pub endpoint: EndpointGate,
}

/// Where a Cluster's managed control-plane endpoint (spec.controlPlaneEndpoint) stands, for
/// the planner: the kubernetes service is created only once its address is known, and gets
/// it as its `controlPlaneEndpoint` (so `kubeadm init` and the kubeconfig Secret use it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum EndpointGate {
    /// No managed endpoint (type None or unset).
    #[default]
    Unmanaged,
    /// Managed, not usable yet: the message says why.
    Waiting(String),
    /// Managed, at `host:port`.
    At(String),
}

impl EndpointGate {
    /// The gate from the spec and the endpoint's status (pure): a VIP is at its address at
    /// once; a load balancer once it has an address; a floating IP once it is also on a
    /// machine (the first control plane's `kubeadm init` reaches its API through it).
    pub fn of(spec: &ClusterSpec, endpoint: Option<&provisioning_crds::ControlPlaneEndpointStatus>) -> EndpointGate {
        use provisioning_crds::EndpointType;
        let Some(want) = spec.control_plane_endpoint.as_ref().filter(|e| e.endpoint_type != EndpointType::None) else {
            return EndpointGate::Unmanaged;
        };
        if want.endpoint_type == EndpointType::Vip {
            return EndpointGate::At(host_port(&want.address, want.port));
        }
        let kind = want.endpoint_type.as_str();
        match endpoint.filter(|e| e.endpoint_type == kind) {
            // Status is written by whoever may write Cluster status and the address comes from
            // a cloud API: what goes into kubeadm's config and the kubeconfig must be a host.
            Some(e) if !e.address.is_empty() && !endpoint_host_ok(&e.address) => {
                EndpointGate::Waiting(format!("the {kind}'s address in status is not an IP address or DNS name; not used"))
            }
            Some(e) if !e.address.is_empty() && (want.endpoint_type != EndpointType::FloatingIp || !e.targets.is_empty()) => {
                EndpointGate::At(host_port(&e.address, e.port))
            }
            Some(e) if !e.address.is_empty() => {
                EndpointGate::Waiting(format!("waiting for the {kind} {} to be on a control-plane machine", e.address))
            }
            _ => EndpointGate::Waiting(format!("waiting for the control-plane endpoint ({kind}) to be created")),
        }
    }
}

/// `HOST:PORT`, an IPv6 address in brackets.
pub fn host_port(address: &str, port: u16) -> String {
    match address.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{address}]:{port}"),
        Err(_) => format!("{address}:{port}"),
    }
}

/// Whether `address` (a control-plane endpoint's, from a provider or from status) is usable
/// as a host in `https://HOST:PORT`: an IP address, or a DNS name of at most 253 characters
/// whose labels are 1-63 letters, digits and inner hyphens. Anything else (a URL, a path, a
/// user-info part, spaces, quotes) is refused before it reaches kubeadm's config, the
/// kubernetes TaskServ or the kubeconfig Secret.
pub fn endpoint_host_ok(address: &str) -> bool {
    if address.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = address.strip_suffix('.').unwrap_or(address);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
        // An all-numeric dotted name is an IPv4 address that did not parse (e.g. 999.1.1.1).
        && !name.split('.').all(|l| l.bytes().all(|b| b.is_ascii_digit()))
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

pub(super) fn owner_reference(o: &Observed<'_>) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_string(),
        kind: "Cluster".to_string(),
        name: o.name.to_string(),
        uid: o.uid.to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Label on the extra Servers a pool's rolling update brings up first (`maxSurge`).
pub const LABEL_SURGE: &str = "provisioning.dev/surge";
/// The reason on the Cluster plan's Create of a surge Server.
pub const SURGE_REASON: &str = "surge Server of a rolling update (maxSurge)";

/// Name of the `index`-th surge Server of `pool`.
pub fn surge_name(cluster: &str, pool: &str, index: u32) -> String {
    format!("{cluster}-{pool}-surge-{index}")
}

/// The zone of a pool's `index`-th member (or surge Server): spread over `zones` in order
/// when the pool lists them, else the pool's `zone`.
pub fn member_zone(pool: &ServerPool, index: u32) -> String {
    match pool.zones.len() {
        0 => pool.zone.clone(),
        n => pool.zones[index as usize % n].clone(),
    }
}

/// The Server a pool wants under `name` (a member, or a surge server), the pool's `index`-th.
pub(super) fn pool_server(o: &Observed<'_>, pool: &ServerPool, name: &str, surge: bool, index: u32) -> Server {
    let mut labels = pool.labels.clone();
    labels.insert(LABEL_CLUSTER.to_string(), o.name.to_string());
    labels.insert(LABEL_POOL.to_string(), pool.name.clone());
    if surge {
        labels.insert(LABEL_SURGE.to_string(), "true".to_string());
    }
    let zone = member_zone(pool, index);
    let spec = ServerSpec {
        provider: o.spec.provider.clone(),
        plan: pool.plan.clone(),
        zone: zone.clone(),
        image: pool.image.clone(),
        instance_profile: pool.instance_profile.clone(),
        // A member's own zone is where it starts, not where it falls back to.
        fallback_zones: pool.fallback_zones.iter().filter(|z| **z != zone).cloned().collect(),
        public_ip: pool.public_ip,
        disks: pool.disks.clone(),
        approval: o.spec.approval,
        ..Default::default()
    };
    let mut server = Server::new(name, spec);
    server.metadata = ObjectMeta {
        name: server.metadata.name.clone(),
        labels: Some(labels),
        owner_references: Some(vec![owner_reference(o)]),
        ..Default::default()
    };
    server
}

/// The desired members of every pool, in pool order then index order.
pub fn desired_servers(o: &Observed<'_>) -> Vec<Server> {
    o.spec
        .pools
        .iter()
        .flat_map(|pool| (0..pool.replicas).map(|i| pool_server(o, pool, &server_name(o.name, &pool.name, i), false, i)))
        .collect()
}

/// The desired members plus the surge Servers of pools in a rolling update with `maxSurge`.
pub fn desired_with_surge(o: &Observed<'_>) -> Vec<Server> {
    let mut out = desired_servers(o);
    for pool in o.spec.pools.iter().filter(|p| surging(o, p)) {
        let count = pool.rollout.as_ref().map_or(0, |r| r.max_surge).min(pool.replicas);
        out.extend((0..count).map(|i| pool_server(o, pool, &surge_name(o.name, &pool.name, i), true, i)));
    }
    out
}

/// The fields that change a machine (the rest of a Server's spec changes nothing there).
pub fn machine_differs(have: &ServerSpec, want: &ServerSpec) -> bool {
    have.provider != want.provider || have.plan != want.plan || have.zone != want.zone || have.image != want.image
}

/// A Server is available: Ready, and every service of the cluster that lists it serves there
/// from its current machine.
pub fn available(o: &Observed<'_>, s: &ChildServer) -> bool {
    s.ready
        && !s.deleting
        && o.taskservs.iter().filter(|t| !t.deleting && t.spec.servers.names.contains(&s.name)).all(|t| match t.serving.get(&s.name) {
            Some(Some(machine)) => s.provider_id.as_ref() == Some(machine),
            Some(None) => true,
            None => false,
        })
}

/// A member is updated: its machine has the pool's spec, its own plan is carried out, and it
/// is available again.
pub fn settled(o: &Observed<'_>, s: &ChildServer, want: &ServerSpec) -> bool {
    !machine_differs(&s.spec, want) && s.observed_current && !s.pending_plan.as_ref().is_some_and(|p| p.has_changes()) && available(o, s)
}

/// Why an owned member must be replaced (Cluster API's MachineHealthCheck remediation): its
/// machine stopped or vanished, or did not start within [`STARTUP_TIMEOUT`]. `None`: healthy
/// enough, or not ours to replace.
pub fn remediation(o: &Observed<'_>, s: &ChildServer) -> Option<&'static str> {
    if !s.owned || s.ready || s.deleting {
        return None;
    }
    let stuck = s.pending_since.is_some_and(|t| o.now.duration_since(t).unsigned_abs() > STARTUP_TIMEOUT);
    if s.machine_failed {
        Some("stopped")
    } else if stuck {
        Some("did not start within the startup timeout")
    } else {
        None
    }
}

/// The message of a rollout rolled back under failurePolicy Rollback: it stays so until the
/// spec changes (a new generation).
pub fn rolled_back(o: &Observed<'_>) -> Option<String> {
    crate::conditions::find(&o.status.conditions, provisioning_crds::condition::STALLED)
        .filter(|c| c.status == "True" && c.reason == REASON_ROLLED_BACK && c.observed_generation == o.generation)
        .map(|c| c.message.clone())
}

/// Under failurePolicy Rollback: the members of pools in a rolling update that already got
/// the new machine spec go back to the spec the members not yet updated still have (their
/// machines are replaced or resized back, as their own plans say). Returns the pools that
/// could not be rolled back because no member was left on the old spec.
pub fn rollback_machines(o: &Observed<'_>, apply: &mut Vec<Server>) -> Vec<String> {
    let mut stuck = Vec::new();
    for pool in &o.spec.pools {
        let members: Vec<(Server, &ChildServer)> = (0..pool.replicas)
            .map(|i| (i, server_name(o.name, &pool.name, i)))
            .filter_map(|(i, n)| o.servers.iter().find(|s| s.name == n && !s.deleting).map(|s| (pool_server(o, pool, &n, false, i), s)))
            .collect();
        let updated: Vec<&(Server, &ChildServer)> = members.iter().filter(|(w, h)| !machine_differs(&h.spec, &w.spec)).collect();
        if updated.len() == members.len() {
            // No rolling update here, or every member already on the new spec.
            let was_rolling = o.status.steps.iter().any(|s| s.id == format!("servers/{}", pool.name) && s.message.starts_with(ROLLING));
            if was_rolling && members.iter().any(|(_, h)| h.stalled.is_some()) {
                stuck.push(pool.name.clone());
            }
            continue;
        }
        let Some((_, old)) = members.iter().find(|(w, h)| machine_differs(&h.spec, &w.spec)) else { continue };
        for (want, _) in updated {
            let mut back = want.clone();
            back.spec.provider = old.spec.provider.clone();
            back.spec.plan = old.spec.plan.clone();
            // A pool spread over `zones` keeps each member in its own zone.
            if pool.zones.is_empty() {
                back.spec.zone = old.spec.zone.clone();
            }
            back.spec.image = old.spec.image.clone();
            apply.push(back);
        }
    }
    stuck
}

/// A pool with `maxSurge` is in a rolling update of its machines: a member has an old machine
/// spec, or (surge servers up) a member is not updated and available yet.
pub(super) fn surging(o: &Observed<'_>, pool: &ServerPool) -> bool {
    if pool.rollout.as_ref().is_none_or(|r| r.max_surge == 0) || rolled_back(o).is_some() {
        return false;
    }
    // Each member against its own wanted spec (a pool spread over zones wants one per zone).
    let members: Vec<(ServerSpec, Option<&ChildServer>)> = (0..pool.replicas)
        .map(|i| (pool_server(o, pool, "", false, i).spec, server_name(o.name, &pool.name, i)))
        .map(|(want, n)| (want, o.servers.iter().find(|s| s.name == n)))
        .collect();
    let outdated = members.iter().any(|(want, s)| s.is_some_and(|s| !s.deleting && machine_differs(&s.spec, want)));
    let surge_up = o
        .servers
        .iter()
        .any(|s| s.owned && !s.deleting && s.labels.contains_key(LABEL_SURGE) && s.labels.get(LABEL_POOL) == Some(&pool.name));
    outdated || (surge_up && members.iter().any(|(want, m)| m.is_none_or(|s| !settled(o, s, want))))
}

/// The rollout of a service on `pools`: the smallest `maxUnavailable` among them, or none when
/// none of them declares one.
pub fn rollout_of(o: &Observed<'_>, pools: &[String]) -> Option<provisioning_crds::Rollout> {
    let max_unavailable =
        o.spec.pools.iter().filter(|p| pools.contains(&p.name)).filter_map(|p| p.rollout.as_ref()).map(|r| r.max_unavailable).min()?;
    Some(provisioning_crds::Rollout { max_unavailable: max_unavailable.max(1) })
}

/// The desired TaskServ of one service.
pub fn desired_taskserv(o: &Observed<'_>, service: &ServicePlan, desired_servers: &[Server]) -> TaskServ {
    let names: Vec<String> = desired_servers
        .iter()
        .filter(|s| s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_POOL)).is_some_and(|p| service.pools.contains(p)))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    let mut config = service.config.clone();
    if let (EndpointGate::At(endpoint), true) = (&o.endpoint, service.service == provisioning_crds::KUBERNETES_SERVICE) {
        let mut c = config.take().filter(serde_json::Value::is_object).unwrap_or_else(|| serde_json::json!({}));
        if let Some(map) = c.as_object_mut() {
            map.insert("controlPlaneEndpoint".into(), serde_json::Value::String(endpoint.clone()));
        }
        config = Some(c);
    }
    let spec = TaskServSpec {
        service: service.service.clone(),
        version: service.version.clone(),
        servers: ServerSelection { names, selector: None },
        config,
        config_from: service.config_from.clone(),
        depends_on: service.after.iter().map(|d| taskserv_name(o.name, d)).collect(),
        rollback_on_failure: true,
        rollout: rollout_of(o, &service.pools),
        approval: o.spec.approval,
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

pub(super) fn labels_cover(want: &Option<BTreeMap<String, String>>, have: &BTreeMap<String, String>) -> bool {
    want.iter().flatten().all(|(k, v)| have.get(k) == Some(v))
}

pub(super) fn index_of(name: &str) -> u32 {
    name.rsplit('-').next().and_then(|i| i.parse().ok()).unwrap_or(u32::MAX)
}

/// A step as planned this pass, before its times are merged in ([`Planned::into_step`]).
#[derive(Clone, Debug)]
pub(super) struct Planned {
    pub(super) id: String,
    pub(super) kind: StepKind,
    pub(super) target: String,
    pub(super) state: StepState,
    pub(super) message: String,
}

impl Planned {
    pub(super) fn new(id: String, kind: StepKind, target: String, state: StepState, message: String) -> Self {
        Planned { id, kind, target, state, message }
    }

    /// Keeps a step's times across passes: set `startedAt` when it starts, `finishedAt` when
    /// it ends, and restart both when a finished step regresses (a member died).
    pub(super) fn into_step(self, previous: &[ClusterStep], now: &str) -> ClusterStep {
        let old = previous.iter().find(|s| s.id == self.id);
        let old_state = old.and_then(StepState::of);
        let started_at = match (self.state, old) {
            (StepState::Pending, _) => None,
            (state, Some(o)) if o.started_at.is_some() && !(old_state == Some(StepState::Succeeded) && state == StepState::Running) => {
                o.started_at.clone()
            }
            _ => Some(now.to_string()),
        };
        let finished_at = match (self.state, old) {
            (StepState::Succeeded | StepState::Failed, Some(o)) if old_state == Some(self.state) && o.finished_at.is_some() => {
                o.finished_at.clone()
            }
            (StepState::Succeeded | StepState::Failed, _) => Some(now.to_string()),
            _ => None,
        };
        ClusterStep {
            id: self.id,
            kind: self.kind.as_str().to_string(),
            target: self.target,
            state: self.state.as_str().to_string(),
            started_at,
            finished_at,
            message: self.message,
        }
    }
}

/// Events for steps whose state changed since the previous pass. A done step that runs again
/// because the spec changed (`spec_changed`: a planned scale) starts again (Normal); one that
/// runs again under the same spec regressed (a member died: Warning).
pub(super) fn step_events(previous: &[ClusterStep], steps: &[ClusterStep], spec_changed: bool, events: &mut Vec<PlannedEvent>) {
    for s in steps {
        let before = previous.iter().find(|p| p.id == s.id);
        if before.is_some_and(|p| p.state == s.state) {
            continue;
        }
        let before = before.and_then(StepState::of);
        let note = format!("{}: {}", s.id, s.message);
        match StepState::of(s) {
            Some(StepState::Running) if before != Some(StepState::Succeeded) => events.push(PlannedEvent::normal("StepStarted", note)),
            // A new rolling update of a pool that was done: not a regression.
            Some(StepState::Running) if s.message.starts_with(ROLLING) => events.push(PlannedEvent::normal("RollingUpdate", note)),
            Some(StepState::Running) if spec_changed => events.push(PlannedEvent::normal("StepStarted", note)),
            Some(StepState::Running) => events.push(PlannedEvent::warning("StepRegressed", note)),
            Some(StepState::Succeeded) => events.push(PlannedEvent::normal("StepSucceeded", note)),
            Some(StepState::Failed) => events.push(PlannedEvent::warning("StepFailed", note)),
            _ => {}
        }
    }
}

/// Refuses a Cluster whose `dependsOn` closes a cycle through it. `graph` holds every Cluster
/// of the namespace (this one included) with its `dependsOn`. The reconciler folds the error
/// into the validation result, so the planner reports it as `Stalled` with reason
/// `DependencyCycle` (and one Warning event) naming the cycle, e.g. `dependsOn cycle: Cluster
/// a → b → a`, instead of both waiting for each other forever.
pub fn check_depends_on(own_name: &str, graph: &BTreeMap<String, Vec<String>>) -> Result<(), InvalidCluster> {
    match depends_on_cycle(own_name, graph) {
        Some(cycle) => Err(InvalidCluster { reason: REASON_DEPENDENCY_CYCLE, message: cycle_message("Cluster", &cycle) }),
        None => Ok(()),
    }
}

/// An empty plan whose status is the current one.
pub(super) fn empty_plan(o: &Observed<'_>, requeue: Option<Duration>) -> Plan {
    Plan {
        apply_servers: Vec::new(),
        delete_servers: Vec::new(),
        apply_taskservs: Vec::new(),
        delete_taskservs: Vec::new(),
        status: o.status.clone(),
        events: Vec::new(),
        requeue,
        teardown_done: false,
    }
}
