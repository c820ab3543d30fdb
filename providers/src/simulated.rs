//! The simulated provider: machines that exist only in a file-backed store.
//!
//! It exists for scale and failure tests (Cluster API keeps an in-memory provider for the
//! same reason). Machines outlive a controller restart because every change is appended to
//! a log file under the state directory; the log is replayed, and followed, on every call,
//! so a second process (a standby controller taking over) sees the same machines.
//! Latency, jitter and a transient failure rate are set per account. Half of the injected
//! failures of `ensure_server` happen *after* the machine was created — a lost response,
//! which is exactly what the create-pending leak guard must survive.
//!
//! `exec` runs nothing: it reports success with "simulated: scripts not run (install.nu)"
//! ([`SCRIPTS_NOT_RUN`]) as its output and `{"simulated":true}` on stdout, so that taskserv
//! rollouts can be exercised at scale without machines — and nobody mistakes them for runs.
//! The few results the controller acts on (a Kubernetes cluster's kubeconfig) are printed
//! as the real scripts would ([`crate::simulated_scripts`]).

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use async_trait::async_trait;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::{
    Address, DeleteOutcome, EndpointIdentity, EndpointKind, EndpointObservation, EndpointRequest, ExecRequest, ExecResult, MachineState,
    Provider, ProviderConfig, ProviderError, ProviderId, ProviderResult, ServerIdentity, ServerObservation, ServerRequest,
    SimulationConfig, plans,
};

const PLANS: [(&str, &str); 4] =
    [("small", "sim-1cpu-1gb"), ("medium", "sim-2cpu-4gb"), ("large", "sim-4cpu-8gb"), ("xlarge", "sim-8cpu-16gb")];

/// A machine in the store.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SimMachine {
    id: String,
    plan: String,
    zone: String,
    image: String,
    address: String,
    tags: BTreeMap<String, String>,
    /// Extra disks made with the machine (absent in logs written before disks existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    disks: Vec<crate::DiskRequest>,
}

/// A disk of a machine in the store: (machine id, the disk).
pub type AttachedDisk = (String, crate::DiskRequest);

/// A disk that outlived its machine (deletionPolicy Retain): kept in the store, detached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimVolume {
    /// `<machine id>-<disk name>`.
    pub id: String,
    /// The disk's name.
    pub name: String,
    /// Size in GiB.
    pub size_gib: u64,
    /// The machine's identity tags, plus `provisioning.dev/disk` and `provisioning.dev/retained`.
    pub tags: BTreeMap<String, String>,
}

/// A control-plane endpoint in the store (a load balancer or a floating IP).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SimEndpoint {
    id: String,
    kind: EndpointKind,
    address: String,
    port: u16,
    /// Machine ids it points at (a floating IP: at most one).
    targets: Vec<String>,
    tags: BTreeMap<String, String>,
}

/// The journal: one line per change. Tests read it as the oracle of what exists.
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum LogEntry {
    Create {
        machine: SimMachine,
    },
    Delete {
        id: String,
    },
    /// An endpoint created or changed (its whole new state).
    Endpoint {
        endpoint: SimEndpoint,
    },
    /// An endpoint deleted.
    EndpointDelete {
        id: String,
    },
}

/// The machines of one account, backed by an append-only log file.
struct Store {
    path: PathBuf,
    inner: Mutex<StoreState>,
}

struct StoreState {
    machines: BTreeMap<String, SimMachine>,
    /// Server uid tag → machine id (a real cloud filters by tag server-side; a scan of every
    /// machine per call made a rollout of n Servers cost n² tag comparisons here).
    by_uid: HashMap<String, std::collections::BTreeSet<String>>,
    /// Retained disks of deleted machines (derived from the log: a delete keeps them).
    volumes: BTreeMap<String, SimVolume>,
    endpoints: BTreeMap<String, SimEndpoint>,
    /// Bytes of the log already applied.
    offset: u64,
    next_serial: u64,
}

impl StoreState {
    /// The machine tagged with this Server uid; of several (never made by the controller,
    /// which finds before it creates), the first by id, as the scan over `machines` found.
    fn machine_of(&self, uid: &str) -> Option<&SimMachine> {
        self.by_uid.get(uid).and_then(|ids| ids.first()).and_then(|id| self.machines.get(id))
    }
}

static STORES: LazyLock<Mutex<HashMap<PathBuf, Arc<Store>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (every mutation is one insert).
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Store {
    fn open(path: &Path) -> ProviderResult<Arc<Store>> {
        let mut stores = lock(&STORES);
        if let Some(store) = stores.get(path) {
            return Ok(store.clone());
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ProviderError::Permanent(format!("cannot create {}: {e}", parent.display())))?;
        }
        let store = Arc::new(Store {
            path: path.to_path_buf(),
            inner: Mutex::new(StoreState {
                machines: BTreeMap::new(),
                by_uid: HashMap::new(),
                volumes: BTreeMap::new(),
                endpoints: BTreeMap::new(),
                offset: 0,
                next_serial: 0,
            }),
        });
        store.with_state(|_| Ok(((), vec![])))?;
        stores.insert(path.to_path_buf(), store.clone());
        Ok(store)
    }

    /// Runs `f` on the state after catching up with the log; entries `f` returns are appended.
    fn with_state<T>(&self, f: impl FnOnce(&mut StoreState) -> ProviderResult<(T, Vec<LogEntry>)>) -> ProviderResult<T> {
        let io = |e: std::io::Error| ProviderError::Transient(format!("simulated store {}: {e}", self.path.display()));
        let mut state = lock(&self.inner);
        let mut file = OpenOptions::new().create(true).read(true).append(true).open(&self.path).map_err(io)?;
        catch_up(&mut file, &mut state).map_err(io)?;
        let (value, entries) = f(&mut state)?;
        if !entries.is_empty() {
            let mut buf = Vec::new();
            for entry in &entries {
                serde_json::to_writer(&mut buf, entry).map_err(|e| ProviderError::Permanent(e.to_string()))?;
                buf.push(b'\n');
            }
            // A writer killed mid-write (SIGKILL can cut a write at a page boundary) leaves a
            // torn last line; start on a fresh line so this entry is not glued to it (the
            // fragment is then skipped as unreadable, like a create the cloud never finished).
            if ends_without_newline(&mut file).map_err(io)? {
                buf.insert(0, b'\n');
            }
            // One write of whole lines: appends from two processes never interleave mid-line.
            file.write_all(&buf).map_err(io)?;
            catch_up(&mut file, &mut state).map_err(io)?;
        }
        Ok(value)
    }
}

fn ends_without_newline(file: &mut File) -> std::io::Result<bool> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    std::io::Read::read_exact(file, &mut last)?;
    Ok(last[0] != b'\n')
}

fn catch_up(file: &mut File, state: &mut StoreState) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len <= state.offset {
        return Ok(());
    }
    file.seek(SeekFrom::Start(state.offset))?;
    let mut reader = BufReader::new(file);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line)?;
        if n == 0 || !line.ends_with('\n') {
            break; // a torn last line (killed mid-write) is ignored until completed
        }
        state.offset += n as u64;
        match serde_json::from_str::<LogEntry>(line.trim_end()) {
            Ok(LogEntry::Create { machine }) => {
                state.next_serial += 1;
                if let Some(uid) = machine.tags.get(crate::tags::SERVER_UID) {
                    state.by_uid.entry(uid.clone()).or_default().insert(machine.id.clone());
                }
                state.machines.insert(machine.id.clone(), machine);
            }
            Ok(LogEntry::Delete { id }) => {
                if let Some(uid) = state.machines.get(&id).and_then(|m| m.tags.get(crate::tags::SERVER_UID)).cloned()
                    && let Some(ids) = state.by_uid.get_mut(&uid)
                {
                    ids.remove(&id);
                    if ids.is_empty() {
                        state.by_uid.remove(&uid);
                    }
                }
                // Disks with deletionPolicy Retain stay, detached; the others go with it.
                if let Some(machine) = state.machines.remove(&id) {
                    for disk in machine.disks.iter().filter(|d| d.retain) {
                        let mut tags = machine.tags.clone();
                        tags.insert(crate::tags::DISK.to_string(), disk.name.clone());
                        tags.insert(crate::tags::RETAINED.to_string(), "true".to_string());
                        let volume_id = format!("{id}-{}", disk.name);
                        let volume = SimVolume { id: volume_id.clone(), name: disk.name.clone(), size_gib: disk.size_gib, tags };
                        state.volumes.insert(volume_id, volume);
                    }
                }
            }
            Ok(LogEntry::Endpoint { endpoint }) => {
                state.next_serial += 1;
                state.endpoints.insert(endpoint.id.clone(), endpoint);
            }
            Ok(LogEntry::EndpointDelete { id }) => {
                state.endpoints.remove(&id);
            }
            Err(e) => tracing::warn!(error = %e, "skipping unreadable simulated store entry"),
        }
    }
    Ok(())
}

/// What a simulated script run reports: it succeeded without running.
pub const SCRIPTS_NOT_RUN: &str = "simulated: scripts not run";

/// The simulated provider of one account.
pub struct SimulatedProvider {
    account: String,
    settings: SimulationConfig,
    token: Option<String>,
    store: Arc<Store>,
}

impl SimulatedProvider {
    /// Opens (or creates) the account's store under `config.state_dir`.
    pub fn open(config: &ProviderConfig) -> ProviderResult<Self> {
        if config.name.is_empty() || !config.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(ProviderError::InvalidRequest(format!("invalid account name {:?}", config.name)));
        }
        let path = config.state_dir.join(format!("simulated-{}.jsonl", config.name));
        Ok(SimulatedProvider {
            account: config.name.clone(),
            settings: config.simulation.clone(),
            token: config.credentials.get("SIMULATED_TOKEN").map(str::to_string),
            store: Store::open(&path)?,
        })
    }

    /// Waits the configured latency, then fails with the configured probability.
    async fn call(&self, operation: &str) -> ProviderResult<()> {
        self.delay().await;
        self.maybe_fail(operation)
    }

    async fn delay(&self) {
        let base = self.settings.latency;
        if base.is_zero() {
            return;
        }
        let jitter = f64::from(self.settings.jitter_percent.min(100)) / 100.0;
        let factor = if jitter > 0.0 { rand::rng().random_range(1.0 - jitter..=1.0 + jitter) } else { 1.0 };
        tokio::time::sleep(base.mul_f64(factor)).await;
    }

    fn maybe_fail(&self, operation: &str) -> ProviderResult<()> {
        let rate = self.settings.failure_rate;
        if rate > 0.0 && rand::rng().random_bool(rate.clamp(0.0, 1.0)) {
            return Err(ProviderError::Transient(format!("simulated failure of {operation}")));
        }
        Ok(())
    }

    fn check_auth(&self) -> ProviderResult<()> {
        match &self.settings.required_token {
            Some(required) if self.token.as_deref() != Some(required.as_str()) => Err(ProviderError::Auth(format!(
                "simulated account {:?} rejected the credentials (SIMULATED_TOKEN missing or wrong)",
                self.account
            ))),
            _ => Ok(()),
        }
    }

    /// The disks of the account's machines as (machine id, disk), and the retained volumes of
    /// deleted machines: what a test checks is left at the "provider" after a delete.
    pub fn disks(&self) -> ProviderResult<(Vec<AttachedDisk>, Vec<SimVolume>)> {
        self.store.with_state(|state| {
            let attached = state.machines.values().flat_map(|m| m.disks.iter().map(|d| (m.id.clone(), d.clone()))).collect();
            Ok(((attached, state.volumes.values().cloned().collect()), vec![]))
        })
    }

    fn observe(machine: &SimMachine) -> ServerObservation {
        ServerObservation {
            provider_id: ProviderId::new("simulated", &machine.id),
            state: MachineState::Running,
            addresses: vec![Address { kind: "InternalIP".into(), address: machine.address.clone() }],
            plan: machine.plan.clone(),
            tags: machine.tags.clone(),
        }
    }

    fn observe_endpoint(endpoint: &SimEndpoint) -> EndpointObservation {
        EndpointObservation {
            kind: endpoint.kind,
            id: endpoint.id.clone(),
            address: endpoint.address.clone(),
            port: endpoint.port,
            targets: endpoint.targets.iter().map(|t| ProviderId::new("simulated", t)).collect(),
        }
    }

    fn endpoint_of<'a>(state: &'a StoreState, kind: EndpointKind, identity: &EndpointIdentity) -> Option<&'a SimEndpoint> {
        state.endpoints.values().find(|e| e.kind == kind && e.tags.get(crate::tags::CLUSTER_UID) == Some(&identity.cluster_uid))
    }

    fn find(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        self.store.with_state(|state| {
            let found = state.machine_of(&identity.uid).map(Self::observe);
            Ok((found, vec![]))
        })
    }
}

#[async_trait]
impl Provider for SimulatedProvider {
    fn provider_type(&self) -> &'static str {
        "simulated"
    }

    fn price(&self, _plan: &str, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        Ok(crate::prices::simulated())
    }

    fn disk_price(&self, _disk_type: &str, _size_gib: u64, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        Ok(crate::prices::simulated())
    }

    fn resolve_plan(&self, plan: &str) -> ProviderResult<String> {
        plans::resolve("simulated", plan, &PLANS, |p| PLANS.iter().any(|(_, native)| *native == p))
    }

    async fn validate_credentials(&self) -> ProviderResult<()> {
        self.check_auth()
    }

    async fn ensure_server(&self, request: &ServerRequest) -> ProviderResult<ServerObservation> {
        self.check_auth()?;
        let plan = self.resolve_plan(&request.plan)?;
        self.delay().await;
        self.maybe_fail("ensure_server")?;
        let lose_response = self.settings.failure_rate > 0.0 && rand::rng().random_bool((self.settings.failure_rate / 2.0).clamp(0.0, 1.0));
        let observation = self.store.with_state(|state| {
            if let Some(existing) = state.machine_of(&request.identity.uid) {
                return Ok((Self::observe(existing), vec![]));
            }
            let serial = state.next_serial + 1;
            let mut tags: BTreeMap<String, String> = request.extra_tags.clone();
            tags.extend(request.identity.tags());
            let machine = SimMachine {
                id: format!("sim-{:08x}-{serial}", rand::rng().random::<u32>()),
                plan: plan.clone(),
                zone: request.zone.clone(),
                image: request.image.clone(),
                // TEST-NET-1 documentation range: clearly fake, never routed.
                address: format!("192.0.2.{}", serial % 250 + 1),
                tags,
                disks: request.disks.clone(),
            };
            let observation = Self::observe(&machine);
            Ok((observation, vec![LogEntry::Create { machine }]))
        })?;
        if lose_response {
            return Err(ProviderError::Transient("simulated lost response after create".into()));
        }
        Ok(observation)
    }

    async fn find_server(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        self.check_auth()?;
        self.call("find_server").await?;
        self.find(identity)
    }

    async fn observe_server(&self, id: &ProviderId) -> ProviderResult<Option<ServerObservation>> {
        self.check_auth()?;
        self.call("observe_server").await?;
        self.store.with_state(|state| Ok((state.machines.get(id.native_id()).map(Self::observe), vec![])))
    }

    async fn delete_server(&self, id: &ProviderId) -> ProviderResult<DeleteOutcome> {
        self.check_auth()?;
        self.call("delete_server").await?;
        self.store.with_state(|state| {
            let entries = if state.machines.contains_key(id.native_id()) {
                vec![LogEntry::Delete { id: id.native_id().to_string() }]
            } else {
                vec![]
            };
            Ok((DeleteOutcome::Gone, entries))
        })
    }

    async fn exec(&self, id: &ProviderId, request: ExecRequest) -> ProviderResult<ExecResult> {
        self.check_auth()?;
        self.call("exec").await?;
        let exists = self.store.with_state(|state| Ok((state.machines.contains_key(id.native_id()), vec![])))?;
        if !exists {
            return Err(ProviderError::NotFound(format!("machine {id}")));
        }
        // Said where users look (the run's output tail in TaskServ status, the logs): the
        // script did not run. Named by its file (install.nu …), not the whole command line.
        let script = request.argv.iter().rev().find(|a| a.ends_with(".nu")).or(request.argv.first());
        let script = script.map(|a| a.rsplit('/').next().unwrap_or(a)).unwrap_or_default();
        let line = format!("{SCRIPTS_NOT_RUN} ({script})");
        let path = request.argv.iter().rev().find(|a| a.ends_with(".nu")).map(String::as_str).unwrap_or_default();
        let simulated = crate::simulated_scripts::simulate(path, request.stdin.as_deref()).await;
        let mut stdout = format!("{line}\n");
        for l in &simulated.lines {
            stdout.push_str(l);
            stdout.push('\n');
        }
        stdout.push_str("{\"simulated\":true}\n");
        if let Some(sink) = &request.output {
            sink.send(&line);
            for l in &simulated.lines {
                sink.send(l);
            }
        }
        Ok(ExecResult { exit_code: Some(simulated.exit_code), timed_out: false, stdout, stderr: String::new() })
    }

    fn supports_endpoint(&self, _kind: EndpointKind) -> Result<(), String> {
        Ok(())
    }

    fn endpoint_price(&self, _kind: EndpointKind, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        Ok(crate::prices::simulated())
    }

    async fn ensure_endpoint(&self, request: &EndpointRequest) -> ProviderResult<EndpointObservation> {
        self.check_auth()?;
        self.call("ensure_endpoint").await?;
        self.store.with_state(|state| {
            // Only machines that exist are targeted (a cloud refuses an unknown instance too).
            let live: Vec<String> =
                request.targets.iter().map(|t| t.native_id().to_string()).filter(|t| state.machines.contains_key(t)).collect();
            let existing = Self::endpoint_of(state, request.kind, &request.identity).cloned();
            let mut endpoint = match existing.clone() {
                Some(e) => e,
                None => {
                    let serial = state.next_serial + 1;
                    let (prefix, address) = match request.kind {
                        EndpointKind::LoadBalancer => ("lb", format!("{}.lb.simulated.test", request.identity.resource_name())),
                        // TEST-NET-2: clearly fake, never routed, apart from the machines' TEST-NET-1.
                        EndpointKind::FloatingIp => ("fip", format!("198.51.100.{}", serial % 250 + 1)),
                    };
                    let mut tags: BTreeMap<String, String> = request.identity.tags().into_iter().collect();
                    tags.insert("name".into(), request.identity.resource_name());
                    SimEndpoint {
                        id: format!("sim-{prefix}-{:08x}-{serial}", rand::rng().random::<u32>()),
                        kind: request.kind,
                        address,
                        port: request.port,
                        targets: Vec::new(),
                        tags,
                    }
                }
            };
            endpoint.port = request.port;
            endpoint.targets = match request.kind {
                EndpointKind::LoadBalancer => live.clone(),
                EndpointKind::FloatingIp => {
                    let ids: Vec<ProviderId> = live.iter().map(|t| ProviderId::new("simulated", t)).collect();
                    let current = endpoint.targets.first().map(|t| ProviderId::new("simulated", t));
                    crate::floating_ip_holder(current.as_ref(), &ids).map(|h| h.native_id().to_string()).into_iter().collect()
                }
            };
            let observation = Self::observe_endpoint(&endpoint);
            let entries = if existing.as_ref() == Some(&endpoint) { vec![] } else { vec![LogEntry::Endpoint { endpoint }] };
            Ok((observation, entries))
        })
    }

    async fn find_endpoint(&self, kind: EndpointKind, identity: &EndpointIdentity) -> ProviderResult<Option<EndpointObservation>> {
        self.check_auth()?;
        self.call("find_endpoint").await?;
        self.store.with_state(|state| Ok((Self::endpoint_of(state, kind, identity).map(Self::observe_endpoint), vec![])))
    }

    async fn delete_endpoint(&self, kind: EndpointKind, identity: &EndpointIdentity) -> ProviderResult<DeleteOutcome> {
        self.check_auth()?;
        self.call("delete_endpoint").await?;
        self.store.with_state(|state| {
            let entries = match Self::endpoint_of(state, kind, identity) {
                Some(e) => vec![LogEntry::EndpointDelete { id: e.id.clone() }],
                None => vec![],
            };
            Ok((DeleteOutcome::Gone, entries))
        })
    }

    async fn list_servers(&self, tags: &[(String, String)]) -> ProviderResult<Vec<ServerObservation>> {
        self.check_auth()?;
        self.store.with_state(|state| {
            let found = state.machines.values().filter(|m| tags.iter().all(|(k, v)| m.tags.get(k) == Some(v))).map(Self::observe).collect();
            Ok((found, vec![]))
        })
    }
}
