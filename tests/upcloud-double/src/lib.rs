//! A local test double of UpCloud's REST API v1.3, built from UpCloud's published API
//! documentation (developers.upcloud.com/1.3: "Servers", "Errors", labels; field names as in
//! UpCloud's own Go SDK, upcloud-go-api). No UpCloud emulator exists, so this is what the
//! upcloud provider's contract tests and the end-to-end test of `examples/upcloud` run
//! against (in process via [`UpcloudDouble::start`], or as the `upcloud-double` binary).
//!
//! Faithful in what the provider relies on:
//! - HTTP basic auth; a wrong user or password is `401 AUTHENTICATION_FAILED`.
//! - Every list is wrapped the UpCloud way (`{"servers": {"server": [...]}}`), numbers the
//!   API sends as strings (`core_number`, `memory_amount`) are strings.
//! - `POST /1.3/server` is validated: zone, title, hostname, plan, storage devices (clone of a
//!   public template, size, tier, title), labels (key charset and length, duplicates),
//!   networking, login user, unknown attributes. Errors come back as
//!   `{"error": {"error_code": …, "error_message": …}}` with UpCloud's codes and statuses.
//! - States advance over time: a new server is `maintenance` while it is created, then
//!   `started`; `stop` (`200`, the server as it was) takes it through `maintenance` to
//!   `stopped`; `start` brings a stopped one back; delete needs `stopped`
//!   (`409 SERVER_STATE_ILLEGAL` otherwise) and removes the storages only with `?storages=1`.
//!   A malformed server UUID in any `/server/{uuid}…` path is `400 SERVER_INVALID`.
//! - Storages: a create's `storage_devices` may add empty disks (`action: create`, size
//!   10..=4096 GiB, tier `maxiops`/`hdd`/`standard`, title); `POST
//!   /1.3/server/{uuid}/storage/detach` (`{"storage_device": {"address": "virtio:1"}}`, the
//!   server stopped, else `409 SERVER_STATE_ILLEGAL`) detaches one, which then outlives a
//!   `DELETE ?storages=1` of the server; the other devices keep their addresses.
//! - `GET /1.3/server?label=key=value` filters by label (several filters are ANDed; `label=key`
//!   matches the key alone).
//! - Server firewall ("Firewall" in the API docs): `firewall` is `on` or `off` at create
//!   (`400 FIREWALL_INVALID` otherwise) and in the details; `GET`/`POST
//!   /1.3/server/{uuid}/firewall_rule` lists rules (`{"firewall_rules": {"firewall_rule":
//!   [...]}}`, every value a string, unset ones empty) and adds one (`201`, `{"firewall_rule":
//!   {…}}`, at `position` or last; direction and action required, a family whenever a
//!   protocol, address or port is given); `DELETE …/firewall_rule/{position}` removes one
//!   (`204`) and renumbers the rest; `GET …/firewall_rule/{position}` shows one and `PUT
//!   …/firewall_rule` replaces them all (`204`).
//! - Floating IPs (`/1.3/ip_address`, see the `ip_address` module) and `PUT
//!   /1.3/server/{uuid}` changing a server's title and labels.
//! - Checked against real traffic: `providers/tests/upcloud_recorded.rs` replays the requests
//!   UpCloud's Go SDK recorded against the real API (`providers/tests/fixtures/upcloud-vcr/`)
//!   and compares status codes, body shapes and error codes; every request received is kept
//!   in [`UpcloudDouble::journal`] so that a client's requests can be compared too.
#![allow(clippy::too_many_lines, reason = "a test double: each handler answers one UpCloud API route as its document describes it")]
// Handlers return ready-made error responses through `Result`'s error side.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

mod ip_address;

/// UpCloud's public zones.
pub const ZONES: [&str; 15] = [
    "fi-hel1", "fi-hel2", "de-fra1", "nl-ams1", "uk-lon1", "es-mad1", "pl-waw1", "se-sto1", "dk-cph1", "no-svg1", "us-chi1", "us-nyc1",
    "us-sjo1", "sg-sin1", "au-syd1",
];

/// General Purpose plans: name, cores, memory MiB, storage GiB.
pub const PLANS: [(&str, u32, u32, u32); 8] = [
    ("1xCPU-1GB", 1, 1024, 25),
    ("1xCPU-2GB", 1, 2048, 50),
    ("2xCPU-4GB", 2, 4096, 80),
    ("4xCPU-8GB", 4, 8192, 160),
    ("6xCPU-16GB", 6, 16384, 320),
    ("8xCPU-32GB", 8, 32768, 640),
    ("12xCPU-48GB", 12, 49152, 960),
    ("16xCPU-64GB", 16, 65536, 1280),
];

/// Public templates: UUID, title, and whether it is a cloud-init template (those need
/// `metadata: yes`). Debian 11 is the classic template UpCloud's own recorded traffic clones
/// (with `metadata: no`, see `providers/tests/fixtures/upcloud-vcr/`).
pub const TEMPLATES: [(&str, &str, bool); 4] = [
    ("01000000-0000-4000-8000-000020060100", "Debian GNU/Linux 11 (Bullseye)", false),
    ("01000000-0000-4000-8000-000020070100", "Debian GNU/Linux 12 (Bookworm)", true),
    ("01000000-0000-4000-8000-000030220200", "Ubuntu Server 22.04 LTS (Jammy Jellyfish)", true),
    ("01000000-0000-4000-8000-000030240200", "Ubuntu Server 24.04 LTS (Noble Numbat)", true),
];

/// Timing and account of the double.
#[derive(Clone, Debug)]
pub struct DoubleConfig {
    /// API user.
    pub username: String,
    /// Its password.
    pub password: String,
    /// How long a new server stays in `maintenance`.
    pub create_time: Duration,
    /// How long a stop takes.
    pub stop_time: Duration,
}

impl Default for DoubleConfig {
    fn default() -> Self {
        DoubleConfig {
            username: "api-user".into(),
            password: "api-password".into(),
            create_time: Duration::from_millis(400),
            stop_time: Duration::from_millis(200),
        }
    }
}

#[derive(Clone, Debug)]
enum Phase {
    Creating { until: Instant },
    Started,
    Stopping { until: Instant },
    Stopped,
}

#[derive(Clone, Debug)]
struct Server {
    uuid: String,
    zone: String,
    title: String,
    hostname: String,
    plan: String,
    cores: u32,
    memory: u32,
    labels: Vec<(String, String)>,
    phase: Phase,
    storages: Vec<String>,
    /// Network interfaces in order: type (`public`, `utility`, `private`) and addresses
    /// (address, family).
    interfaces: Vec<(String, Vec<(String, String)>)>,
    firewall: String,
    firewall_rules: Vec<Value>,
    metadata: String,
    /// `remote_access_enabled`: `yes` or `no`.
    remote_access: String,
    /// Seconds since the epoch.
    created: u64,
    serial: u32,
}

impl Server {
    fn state(&mut self) -> &'static str {
        let now = Instant::now();
        match self.phase {
            Phase::Creating { until } if now >= until => self.phase = Phase::Started,
            Phase::Stopping { until } if now >= until => self.phase = Phase::Stopped,
            _ => {}
        }
        match self.phase {
            Phase::Creating { .. } | Phase::Stopping { .. } => "maintenance",
            Phase::Started => "started",
            Phase::Stopped => "stopped",
        }
    }

    fn labels_json(&self) -> Value {
        json!({ "label": self.labels.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>() })
    }

    /// A server as `GET /1.3/server` lists it (the fields of UpCloud's recorded list).
    fn summary(&mut self) -> Value {
        let state = self.state();
        json!({
            "core_number": self.cores.to_string(),
            "created": self.created,
            "host": 7_653_311_107u64,
            "hostname": self.hostname,
            "labels": self.labels_json(),
            "license": 0,
            "memory_amount": self.memory.to_string(),
            "plan": self.plan,
            "plan_ipv4_bytes": "0",
            "plan_ipv6_bytes": "0",
            "server_group": null,
            "simple_backup": "no",
            "state": state,
            "tags": {"tag": []},
            "title": self.title,
            "uuid": self.uuid,
            "zone": self.zone,
        })
    }

    /// The MAC of interface `i` (0-based) of this server.
    fn mac(&self, i: usize) -> String {
        format!("da:45:c4:{:02x}:{:02x}:{:02x}", self.serial / 256 % 256, self.serial % 256, i)
    }

    /// A server as `GET /1.3/server/{uuid}` (and stop, start) shows it; `floating`: the
    /// account's floating IPs (those attached here show on their interface).
    fn details(&mut self, storages: &HashMap<String, Storage>, floating: &BTreeMap<String, ip_address::FloatingIp>) -> Value {
        let mut v = self.summary();
        v["boot_order"] = json!("disk");
        v["firewall"] = json!(self.firewall);
        v["metadata"] = json!(self.metadata);
        v["nic_model"] = json!("virtio");
        v["timezone"] = json!("UTC");
        v["video_model"] = json!("vga");
        v["remote_access_enabled"] = json!(self.remote_access);
        v["remote_access_password"] = json!(format!("rap{:05x}", self.serial));
        v["remote_access_type"] = json!("vnc");
        // Floating IPs attached here, by interface index (UpCloud lists them after the
        // interface's own address, as recorded in attachmodifyreleasefloatingipaddress).
        let attached = ip_address::attached_to(floating, &self.uuid);
        let mut all: Vec<Value> = self
            .interfaces
            .iter()
            .flat_map(|(access, ips)| {
                ips.iter().map(move |(address, family)| json!({"access": access, "address": address, "family": family}))
            })
            .collect();
        all.extend(attached.iter().map(|(address, _)| json!({"access": "public", "address": address, "family": "IPv4"})));
        v["ip_addresses"] = json!({ "ip_address": all });
        v["networking"] = json!({ "interfaces": { "interface": self.interfaces.iter().enumerate().map(|(i, (kind, ips))| json!({
            "bootable": "no",
            "index": i + 1,
            "ip_addresses": { "ip_address": ips.iter().map(|(address, family)| json!({
                "address": address, "dhcp_provided": "yes", "family": family, "floating": "no", "release_policy": "release"
            })).chain(attached.iter().filter(|(_, at)| *at == i).map(|(address, _)| json!({
                "address": address, "family": "IPv4", "floating": "yes"
            }))).collect::<Vec<_>>() },
            "mac": self.mac(i),
            "network": match kind.as_str() {
                "public" => format!("03000000-0000-4000-80{}-000000000000", if ips.first().is_some_and(|(_, f)| f == "IPv6") { "46" } else { "44" }),
                _ => format!("03{:06x}-0000-4000-8000-{:012x}", self.serial, i),
            },
            "source_ip_filtering": "yes",
            "type": kind,
        })).collect::<Vec<_>>() } });
        v["storage_devices"] = json!({ "storage_device": self.storages.iter().enumerate().filter_map(|(i, uuid)| storages.get(uuid).map(|s| json!({
            "address": format!("virtio:{i}"), "storage": uuid, "storage_size": s.size,
            "storage_tier": s.tier, "storage_title": s.title, "type": "disk", "boot_disk": if i == 0 { "1" } else { "0" },
            "labels": [], "storage_encrypted": "no"
        }))).collect::<Vec<_>>() });
        v
    }
}

#[derive(Clone, Debug)]
struct Storage {
    title: String,
    size: u32,
    tier: String,
}

#[derive(Default)]
struct State {
    servers: BTreeMap<String, Server>,
    storages: HashMap<String, Storage>,
    /// Floating IPs by address.
    floating: BTreeMap<String, ip_address::FloatingIp>,
    serial: u32,
    /// Floating IPs made so far (their addresses).
    floating_serial: u32,
    /// `METHOD /path` whose next answer is lost (see [`UpcloudDouble::lose_next_answer`]).
    lose_next: Option<String>,
}

/// One request as the double received it (see [`UpcloudDouble::journal`]).
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    /// `GET`, `POST`…
    pub method: String,
    /// The path as sent, e.g. `/1.3/server/{uuid}/stop`.
    pub path: String,
    /// The query string as sent (empty when none), e.g. `label=a%3Db`.
    pub query: String,
    /// The `Accept` header (empty when none).
    pub accept: String,
    /// The `Content-Type` header (empty when none).
    pub content_type: String,
    /// The body as text (empty when none).
    pub body: String,
}

/// A running double; stops when dropped.
pub struct UpcloudDouble {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Requests served (including rejected ones).
    pub requests: Arc<AtomicU64>,
    /// Requests served per `METHOD /path` (query strings dropped).
    log: Arc<Mutex<HashMap<String, u64>>>,
    journal: Arc<Mutex<Vec<ReceivedRequest>>>,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for UpcloudDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UpcloudDouble {
    /// Starts the double on a free port of 127.0.0.1 (panics if it cannot bind: tests only).
    pub async fn start(config: DoubleConfig) -> UpcloudDouble {
        #[allow(clippy::expect_used)]
        Self::start_on("127.0.0.1:0", config).await.expect("bind the UpCloud double on 127.0.0.1")
    }

    /// Starts the double on `addr` (`127.0.0.1:0` for a free port). Must run inside a Tokio
    /// runtime; the server lives until the returned value is dropped.
    pub async fn start_on(addr: &str, config: DoubleConfig) -> std::io::Result<UpcloudDouble> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let requests = Arc::new(AtomicU64::new(0));
        let log: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let journal: Arc<Mutex<Vec<ReceivedRequest>>> = Arc::default();
        let task = {
            let (state, requests, log, journal) = (state.clone(), requests.clone(), log.clone(), journal.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    let (state, requests, log, journal, config) =
                        (state.clone(), requests.clone(), log.clone(), journal.clone(), config.clone());
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<Incoming>| {
                            let (state, requests, log, journal, config) =
                                (state.clone(), requests.clone(), log.clone(), journal.clone(), config.clone());
                            async move {
                                requests.fetch_add(1, Ordering::SeqCst);
                                {
                                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                                    *log.entry(format!("{} {}", req.method(), req.uri().path().trim_end_matches('/'))).or_insert(0) += 1;
                                }
                                let (parts, body) = req.into_parts();
                                let Ok(body) = body.collect().await.map(http_body_util::Collected::to_bytes) else {
                                    return Ok(error(400, "REQUEST_INVALID", "The request body could not be read."));
                                };
                                let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                                journal.lock().unwrap_or_else(|p| p.into_inner()).push(ReceivedRequest {
                                    method: parts.method.to_string(),
                                    path: parts.uri.path().to_string(),
                                    query: parts.uri.query().unwrap_or("").to_string(),
                                    accept: header("accept"),
                                    content_type: header("content-type"),
                                    body: String::from_utf8_lossy(&body).into_owned(),
                                });
                                Ok::<_, std::convert::Infallible>(handle(Request::from_parts(parts, body), &state, &config))
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    });
                }
            })
        };
        Ok(UpcloudDouble { endpoint: format!("http://{local}"), requests, log, journal, state, task })
    }

    /// Servers that exist, in any state.
    pub fn server_count(&self) -> usize {
        self.state.lock().map(|s| s.servers.len()).unwrap_or(0)
    }

    /// Storages that exist (attached or not).
    pub fn storage_count(&self) -> usize {
        self.state.lock().map(|s| s.storages.len()).unwrap_or(0)
    }

    /// Every storage that exists, attached or not: (title, size GiB, tier), sorted.
    pub fn storages(&self) -> Vec<(String, u32, String)> {
        let Ok(state) = self.state.lock() else { return Vec::new() };
        let mut all: Vec<(String, u32, String)> = state.storages.values().map(|s| (s.title.clone(), s.size, s.tier.clone())).collect();
        all.sort();
        all
    }

    /// Every server with its current state (`maintenance`, `started`, `stopped`), by UUID.
    pub fn server_states(&self) -> BTreeMap<String, String> {
        let Ok(mut state) = self.state.lock() else { return BTreeMap::new() };
        state.servers.values_mut().map(|s| (s.uuid.clone(), s.state().to_string())).collect()
    }

    /// The zone of every server, by UUID.
    pub fn server_zones(&self) -> BTreeMap<String, String> {
        let Ok(state) = self.state.lock() else { return BTreeMap::new() };
        state.servers.values().map(|s| (s.uuid.clone(), s.zone.clone())).collect()
    }

    /// The firewall setting (`on`/`off`) and rules of every server, by uuid.
    pub fn firewalls(&self) -> BTreeMap<String, (String, Vec<Value>)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.servers.values().map(|s| (s.uuid.clone(), (s.firewall.clone(), s.firewall_rules.clone()))).collect()
    }

    /// The next request of `method` on `path` (e.g. `POST /1.3/ip_address`) is carried out,
    /// but its answer is lost: the client gets `502` with no body (fault injection).
    pub fn lose_next_answer(&self, method: &str, path: &str) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).lose_next = Some(format!("{method} {path}"));
    }

    /// Every floating IP by address, with the UUID of the server it is attached to (None:
    /// detached).
    pub fn floating_ips(&self) -> BTreeMap<String, Option<String>> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        ip_address::holders(&state.floating)
    }

    /// The labels of server `uuid` (empty when it does not exist).
    pub fn server_labels(&self, uuid: &str) -> Vec<(String, String)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.servers.get(uuid).map(|s| s.labels.clone()).unwrap_or_default()
    }

    /// Deletes a server and its storages behind the client's back, whatever its state (as
    /// someone using UpCloud's own console would, for drift tests). Whether it existed.
    pub fn remove_server(&self, uuid: &str) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(server) = state.servers.remove(uuid) else { return false };
        ip_address::server_deleted(&mut state.floating, uuid);
        for storage in server.storages {
            state.storages.remove(&storage);
        }
        true
    }

    /// Every request served so far, in the order received (including rejected ones).
    pub fn journal(&self) -> Vec<ReceivedRequest> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many requests of `method` on exactly `path` (e.g. `GET /1.3/server`) were served.
    pub fn requests_to(&self, method: &str, path: &str) -> u64 {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.get(&format!("{method} {path}")).copied().unwrap_or(0)
    }

    /// Servers carrying the label `key=value`, with their current state
    /// (`maintenance`, `started`, `stopped`), by UUID.
    pub fn servers_labelled(&self, key: &str, value: &str) -> BTreeMap<String, String> {
        let Ok(mut state) = self.state.lock() else { return BTreeMap::new() };
        state
            .servers
            .values_mut()
            .filter(|s| s.labels.iter().any(|(k, v)| k.eq_ignore_ascii_case(key) && v == value))
            .map(|s| (s.uuid.clone(), s.state().to_string()))
            .collect()
    }
}

fn reply(status: u16, body: Option<Value>) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(status);
    let bytes = match body {
        Some(v) => {
            builder = builder.header("content-type", "application/json; charset=UTF-8");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    builder.body(Full::new(bytes)).unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn error(status: u16, code: &str, message: &str) -> Response<Full<Bytes>> {
    reply(status, Some(json!({"error": {"error_code": code, "error_message": message}})))
}

fn authorized(req: &Request<Bytes>, config: &DoubleConfig) -> bool {
    let expected = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", config.username, config.password));
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .is_some_and(|v| v.trim() == expected)
}

fn handle(req: Request<Bytes>, state: &Mutex<State>, config: &DoubleConfig) -> Response<Full<Bytes>> {
    let call = format!("{} {}", req.method(), req.uri().path().trim_end_matches('/'));
    let response = handle_request(req, state, config);
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    if state.lose_next.as_deref() == Some(call.as_str()) {
        state.lose_next = None;
        // Done, but the answer never arrives: what a proxy says when its upstream dropped it.
        return reply(502, None);
    }
    response
}

fn handle_request(req: Request<Bytes>, state: &Mutex<State>, config: &DoubleConfig) -> Response<Full<Bytes>> {
    if !authorized(&req, config) {
        return error(401, "AUTHENTICATION_FAILED", "Authentication failed using the given username and password.");
    }
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query: Vec<(String, String)> =
        req.uri().query().map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default();
    let content_type = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let body = req.into_body();
    let Some(rest) = path.strip_prefix("/1.3") else {
        return error(404, "NOT_FOUND", "The requested API version does not exist.");
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    // A malformed server UUID is refused before anything else (UpCloud's recorded
    // `POST /1.3/server/invalid/start`: 400 SERVER_INVALID).
    if let ["server", uuid, ..] = segments.as_slice()
        && uuid::Uuid::parse_str(uuid).is_err()
    {
        return error(400, "SERVER_INVALID", "The server UUID is invalid.");
    }
    if let ["ip_address", ip, ..] = segments.as_slice()
        && ip.parse::<std::net::IpAddr>().is_err()
    {
        return error(400, "IP_ADDRESS_INVALID", "The IP address is invalid.");
    }
    let mut state = match state.lock() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    };
    let parse_body = || -> Result<Value, Response<Full<Bytes>>> {
        if !content_type.starts_with("application/json") {
            return Err(error(400, "CONTENT_TYPE_INVALID", "The Content-Type header must be application/json."));
        }
        serde_json::from_slice(&body).map_err(|_| error(400, "REQUEST_INVALID", "The request body is not valid JSON."))
    };
    match (method.clone(), segments.as_slice()) {
        (Method::GET, ["account"]) => reply(
            200,
            Some(
                json!({"account": {"credits": 10000, "username": config.username, "resource_limits": {"cores": 200, "memory": 1_048_576}}}),
            ),
        ),
        (Method::GET, ["zone"]) => reply(
            200,
            Some(json!({"zones": {"zone": ZONES.iter().map(|z| json!({"id": z, "description": z, "public": "yes"})).collect::<Vec<_>>()}})),
        ),
        (Method::GET, ["plan"]) => reply(
            200,
            Some(json!({"plans": {"plan": PLANS.iter().map(|(name, cores, mem, storage)| json!({
                "core_number": cores, "memory_amount": mem, "name": name, "public_traffic_out": 1024,
                "storage_size": storage, "storage_tier": "maxiops"
            })).collect::<Vec<_>>()}})),
        ),
        (Method::GET, ["server"]) => {
            let filters: Vec<(String, Option<String>)> = query
                .iter()
                .filter(|(k, _)| k == "label")
                .map(|(_, v)| match v.split_once('=') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string())),
                    None => (v.clone(), None),
                })
                .collect();
            let servers: Vec<Value> = state
                .servers
                .values_mut()
                .filter(|s| {
                    filters
                        .iter()
                        .all(|(fk, fv)| s.labels.iter().any(|(k, v)| k.eq_ignore_ascii_case(fk) && fv.as_ref().is_none_or(|fv| fv == v)))
                })
                .map(Server::summary)
                .collect();
            reply(200, Some(json!({"servers": {"server": servers}})))
        }
        (Method::POST, ["server"]) => match parse_body() {
            Err(response) => response,
            Ok(body) => create_server(&mut state, &body, config),
        },
        (Method::GET, ["server", uuid]) => {
            let State { servers, storages, floating, .. } = &mut *state;
            match servers.get_mut(*uuid) {
                Some(server) => reply(200, Some(json!({"server": server.details(storages, floating)}))),
                None => not_found(uuid),
            }
        }
        (Method::POST, ["server", uuid, "stop"]) => {
            let body = match parse_body() {
                Ok(b) => b,
                Err(response) => return response,
            };
            let stop_type = body.pointer("/stop_server/stop_type").and_then(Value::as_str).unwrap_or("soft");
            if !matches!(stop_type, "soft" | "hard") {
                return error(400, "STOP_TYPE_INVALID", "The stop type is invalid.");
            }
            // UpCloud's recorded stops (upcloud-go-api) send `"timeout": "900"`: a string of
            // seconds, over the 600 once assumed here.
            if let Some(timeout) = body.pointer("/stop_server/timeout")
                && timeout.as_str().is_none_or(|t| t.parse::<u32>().map_or(true, |t| !(1..=3600).contains(&t)))
            {
                return error(400, "TIMEOUT_INVALID", "The timeout is invalid.");
            }
            if let Some(action) = body.pointer("/stop_server/timeout_action")
                && !matches!(action.as_str(), Some("ignore" | "destroy"))
            {
                return error(400, "TIMEOUT_ACTION_INVALID", "The timeout_action is invalid.");
            }
            let State { servers, storages, floating, .. } = &mut *state;
            let Some(server) = servers.get_mut(*uuid) else { return not_found(uuid) };
            if server.state() != "started" {
                return error(409, "SERVER_STATE_ILLEGAL", &format!("The server {uuid} is not in a state in which it can be stopped."));
            }
            // UpCloud answers 200 with the server as it was when the stop was accepted.
            let details = server.details(storages, floating);
            server.phase = Phase::Stopping { until: Instant::now() + config.stop_time };
            reply(200, Some(json!({"server": details})))
        }
        (Method::POST, ["server", uuid, "start"]) => {
            if let Err(response) = parse_body() {
                return response;
            }
            let State { servers, storages, floating, .. } = &mut *state;
            let Some(server) = servers.get_mut(*uuid) else { return not_found(uuid) };
            if server.state() != "stopped" {
                return error(409, "SERVER_STATE_ILLEGAL", &format!("The server {uuid} is not in a state in which it can be started."));
            }
            server.phase = Phase::Started;
            reply(200, Some(json!({"server": server.details(storages, floating)})))
        }
        (Method::DELETE, ["server", uuid]) => {
            let Some(server) = state.servers.get_mut(*uuid) else { return not_found(uuid) };
            if server.state() != "stopped" {
                return error(409, "SERVER_STATE_ILLEGAL", &format!("The server {uuid} is not stopped."));
            }
            let delete_storages = query.iter().any(|(k, v)| k == "storages" && (v == "1" || v == "true"));
            ip_address::server_deleted(&mut state.floating, uuid);
            if let Some(server) = state.servers.remove(*uuid)
                && delete_storages
            {
                for storage in server.storages {
                    state.storages.remove(&storage);
                }
            }
            reply(204, None)
        }
        (Method::POST, ["server", uuid, "storage", "detach"]) => {
            let body = match parse_body() {
                Ok(b) => b,
                Err(response) => return response,
            };
            let Some(address) = body.pointer("/storage_device/address").and_then(Value::as_str).map(str::to_string) else {
                return error(400, "STORAGE_DEVICE_INVALID", "The storage device address is missing.");
            };
            let State { servers, storages, floating, .. } = &mut *state;
            let Some(server) = servers.get_mut(*uuid) else { return not_found(uuid) };
            if server.state() != "stopped" {
                return error(409, "SERVER_STATE_ILLEGAL", &format!("The server {uuid} is not stopped."));
            }
            let index = address.strip_prefix("virtio:").and_then(|i| i.parse::<usize>().ok());
            match index.filter(|i| server.storages.get(*i).is_some_and(|s| storages.contains_key(s))) {
                // A hole keeps the devices after it at their addresses.
                Some(i) => server.storages[i] = String::new(),
                None => return error(404, "STORAGE_DEVICE_NOT_FOUND", &format!("No storage device at address {address}.")),
            }
            reply(200, Some(json!({"server": server.details(storages, floating)})))
        }
        (Method::GET, ["server", uuid, "firewall_rule"]) => match state.servers.get(*uuid) {
            Some(server) => reply(200, Some(json!({"firewall_rules": {"firewall_rule": server.firewall_rules}}))),
            None => not_found(uuid),
        },
        (Method::POST, ["server", uuid, "firewall_rule"]) => {
            let body = match parse_body() {
                Ok(b) => b,
                Err(response) => return response,
            };
            let Some(server) = state.servers.get_mut(*uuid) else { return not_found(uuid) };
            match firewall_rule(&body, server.firewall_rules.len()) {
                Err(response) => response,
                Ok((position, rule)) => {
                    server.firewall_rules.insert(position - 1, rule);
                    renumber(&mut server.firewall_rules);
                    reply(201, Some(json!({"firewall_rule": server.firewall_rules[position - 1]})))
                }
            }
        }
        (Method::GET, ["server", uuid, "firewall_rule", position]) => {
            let Some(server) = state.servers.get(*uuid) else { return not_found(uuid) };
            match position.parse::<usize>().ok().filter(|p| (1..=server.firewall_rules.len()).contains(p)) {
                None => error(404, "FIREWALL_RULE_NOT_FOUND", &format!("The firewall rule {position} does not exist.")),
                Some(p) => reply(200, Some(json!({"firewall_rule": server.firewall_rules[p - 1]}))),
            }
        }
        (Method::PUT, ["server", uuid, "firewall_rule"]) => {
            // Replaces every rule at once: `{"firewall_rules": {"firewall_rule": [...]}}`.
            let body = match parse_body() {
                Ok(b) => b,
                Err(response) => return response,
            };
            let Some(server) = state.servers.get_mut(*uuid) else { return not_found(uuid) };
            let Some(items) = body.pointer("/firewall_rules/firewall_rule").and_then(Value::as_array) else {
                return error(400, "FIREWALL_RULES_INVALID", "The request must contain {\"firewall_rules\": {\"firewall_rule\": [...]}}.");
            };
            let mut rules: Vec<Value> = Vec::new();
            for item in items {
                match firewall_rule(&json!({ "firewall_rule": item }), rules.len()) {
                    Err(response) => return response,
                    Ok((position, rule)) => rules.insert(position - 1, rule),
                }
            }
            renumber(&mut rules);
            server.firewall_rules = rules;
            reply(204, None)
        }
        (Method::DELETE, ["server", uuid, "firewall_rule", position]) => {
            let Some(server) = state.servers.get_mut(*uuid) else { return not_found(uuid) };
            match position.parse::<usize>().ok().filter(|p| (1..=server.firewall_rules.len()).contains(p)) {
                None => error(404, "FIREWALL_RULE_NOT_FOUND", &format!("The firewall rule {position} does not exist.")),
                Some(p) => {
                    server.firewall_rules.remove(p - 1);
                    renumber(&mut server.firewall_rules);
                    reply(204, None)
                }
            }
        }
        (Method::PUT, ["server", uuid]) => match parse_body() {
            Err(response) => response,
            Ok(body) => modify_server(&mut state, uuid, &body),
        },
        (Method::GET, ["ip_address"]) => ip_address::list(&state.servers, &state.floating),
        (Method::POST, ["ip_address"]) => match parse_body() {
            Err(response) => response,
            Ok(body) => {
                let State { servers, floating, floating_serial, .. } = &mut *state;
                ip_address::create(servers, floating, floating_serial, &body)
            }
        },
        (Method::GET, ["ip_address", ip]) => ip_address::get(&state.servers, &state.floating, ip),
        (Method::PATCH, ["ip_address", ip]) => match parse_body() {
            Err(response) => response,
            Ok(body) => {
                let State { servers, floating, .. } = &mut *state;
                ip_address::modify(servers, floating, ip, &body)
            }
        },
        (Method::DELETE, ["ip_address", ip]) => {
            let State { servers, floating, .. } = &mut *state;
            ip_address::delete(servers, floating, ip)
        }
        (_, ["ip_address"] | ["ip_address", _]) => error(405, "METHOD_NOT_ALLOWED", &format!("The method {method} is not allowed here.")),
        (_, ["server", _, "firewall_rule"] | ["server", _, "firewall_rule", _]) => {
            error(405, "METHOD_NOT_ALLOWED", &format!("The method {method} is not allowed here."))
        }
        (_, ["account" | "zone" | "plan" | "server"] | ["server", _] | ["server", _, "stop" | "start"]) => {
            error(405, "METHOD_NOT_ALLOWED", &format!("The method {method} is not allowed here."))
        }
        _ => error(404, "NOT_FOUND", "The requested resource does not exist."),
    }
}

/// The attributes of a firewall rule; the API sends every one back, unset ones as "".
const FIREWALL_RULE_ATTRIBUTES: [&str; 15] = [
    "action",
    "comment",
    "destination_address_end",
    "destination_address_start",
    "destination_port_end",
    "destination_port_start",
    "direction",
    "family",
    "icmp_type",
    "position",
    "protocol",
    "source_address_end",
    "source_address_start",
    "source_port_end",
    "source_port_start",
];

/// Validates the body of `POST …/firewall_rule`: the position to insert at (1-based) and the
/// rule as the API stores it.
fn firewall_rule(body: &Value, existing: usize) -> Result<(usize, Value), Response<Full<Bytes>>> {
    let Some(rule) = body.get("firewall_rule").and_then(Value::as_object) else {
        return Err(error(400, "FIREWALL_RULE_INVALID", "The request must contain a firewall_rule object."));
    };
    if let Some(unknown) = rule.keys().find(|k| !FIREWALL_RULE_ATTRIBUTES.contains(&k.as_str())) {
        return Err(error(400, "UNKNOWN_ATTRIBUTE", &format!("The attribute {unknown} is unknown.")));
    }
    let text = |k: &str| rule.get(k).and_then(Value::as_str).unwrap_or("");
    if rule.values().any(|v| !v.is_string()) {
        return Err(error(400, "FIREWALL_RULE_INVALID", "Every firewall rule attribute is a string."));
    }
    if !matches!(text("direction"), "in" | "out") {
        return Err(error(400, "DIRECTION_INVALID", "The direction is missing or invalid."));
    }
    if !matches!(text("action"), "accept" | "reject" | "drop") {
        return Err(error(400, "ACTION_INVALID", "The action is missing or invalid."));
    }
    if !matches!(text("protocol"), "" | "tcp" | "udp" | "icmp") {
        return Err(error(400, "PROTOCOL_INVALID", "The protocol is invalid."));
    }
    let family = text("family");
    if !matches!(family, "" | "IPv4" | "IPv6") {
        return Err(error(400, "FAMILY_INVALID", "The address family is invalid."));
    }
    let needs_family = [
        "protocol",
        "source_address_start",
        "source_address_end",
        "destination_address_start",
        "destination_address_end",
        "destination_port_start",
        "destination_port_end",
    ]
    .iter()
    .any(|k| !text(k).is_empty());
    if needs_family && family.is_empty() {
        return Err(error(400, "FAMILY_MISSING", "The address family is missing."));
    }
    for key in ["source_address_start", "source_address_end", "destination_address_start", "destination_address_end"] {
        let value = text(key);
        let ok = match family {
            "IPv4" => value.is_empty() || value.parse::<std::net::Ipv4Addr>().is_ok(),
            _ => value.is_empty() || value.parse::<std::net::Ipv6Addr>().is_ok(),
        };
        if !ok {
            return Err(error(400, "ADDRESS_INVALID", &format!("The {key} {value} is invalid.")));
        }
    }
    for key in ["source_port_start", "source_port_end", "destination_port_start", "destination_port_end"] {
        let value = text(key);
        if !value.is_empty() && value.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(error(400, "PORT_INVALID", &format!("The {key} {value} is invalid.")));
        }
    }
    if existing >= 1000 {
        return Err(error(409, "FIREWALL_RULE_LIMIT_REACHED", "A server can have at most 1000 firewall rules."));
    }
    let position = match text("position") {
        "" => existing + 1,
        p => match p.parse::<usize>().ok().filter(|p| (1..=existing + 1).contains(p)) {
            Some(p) => p,
            None => return Err(error(400, "POSITION_INVALID", "The position is invalid.")),
        },
    };
    let stored: serde_json::Map<String, Value> = FIREWALL_RULE_ATTRIBUTES.iter().map(|k| (k.to_string(), json!(text(k)))).collect();
    Ok((position, Value::Object(stored)))
}

/// `PUT /1.3/server/{uuid}` ("Modify server"): the double changes the title, the labels
/// (replaced as a whole, validated as at create), `metadata` and `remote_access_enabled`
/// (`yes`/`no`); other attributes are not served (`501`).
/// `202` with the details, as UpCloud's recorded modify (createmodifydeleteserver) answers.
fn modify_server(state: &mut State, uuid: &str, body: &Value) -> Response<Full<Bytes>> {
    let Some(change) = body.get("server").and_then(Value::as_object) else {
        return error(400, "SERVER_INVALID", "The request must contain a server object.");
    };
    if let Some(unknown) = change.keys().find(|k| !SERVER_ATTRIBUTES.contains(&k.as_str())) {
        return error(400, "UNKNOWN_ATTRIBUTE", &format!("The attribute {unknown} is unknown."));
    }
    if let Some(other) = change.keys().find(|k| !matches!(k.as_str(), "labels" | "title" | "metadata" | "remote_access_enabled")) {
        return error(501, "NOT_IMPLEMENTED", &format!("The double does not change {other}."));
    }
    let yes_no = |k: &str| -> Result<Option<String>, ()> {
        match change.get(k) {
            None => Ok(None),
            Some(v) => v.as_str().filter(|v| matches!(*v, "yes" | "no")).map(|v| Some(v.to_string())).ok_or(()),
        }
    };
    let (Ok(metadata), Ok(remote_access)) = (yes_no("metadata"), yes_no("remote_access_enabled")) else {
        return error(400, "SERVER_INVALID", "metadata and remote_access_enabled must be yes or no.");
    };
    let labels = match change.get("labels").map(parse_labels) {
        None => None,
        Some(Ok(labels)) => Some(labels),
        Some(Err(response)) => return response,
    };
    let title = match change.get("title").map(Value::as_str) {
        None => None,
        Some(Some(t)) if !t.is_empty() && t.len() <= 255 => Some(t.to_string()),
        Some(_) => return error(400, "SERVER_TITLE_INVALID", "The server title is invalid."),
    };
    let State { servers, storages, floating, .. } = state;
    let Some(server) = servers.get_mut(uuid) else { return not_found(uuid) };
    if let Some(labels) = labels {
        server.labels = labels;
    }
    if let Some(title) = title {
        server.title = title;
    }
    if let Some(metadata) = metadata {
        server.metadata = metadata;
    }
    if let Some(remote_access) = remote_access {
        server.remote_access = remote_access;
    }
    reply(202, Some(json!({"server": server.details(storages, floating)})))
}

/// The `labels` of a create or modify request, validated.
fn parse_labels(list: &Value) -> Result<Vec<(String, String)>, Response<Full<Bytes>>> {
    let mut labels = Vec::new();
    let Some(items) = list.get("label").and_then(Value::as_array) else {
        return Err(error(400, "LABELS_INVALID", "The labels must be given as {\"label\": [...]}."));
    };
    for item in items {
        let (Some(k), Some(v)) = (item.get("key").and_then(Value::as_str), item.get("value").and_then(Value::as_str)) else {
            return Err(error(400, "LABELS_INVALID", "Each label needs a key and a value."));
        };
        if !valid_label_key(k) {
            return Err(error(400, "INVALID_LABEL_KEY", &format!("The label key {k} is invalid.")));
        }
        if v.len() > 255 {
            return Err(error(400, "INVALID_LABEL_VALUE", &format!("The value of label {k} is too long.")));
        }
        if labels.iter().any(|(existing, _): &(String, String)| existing.eq_ignore_ascii_case(k)) {
            return Err(error(400, "DUPLICATE_LABEL_KEYS", &format!("The label key {k} is given twice.")));
        }
        labels.push((k.to_string(), v.to_string()));
    }
    Ok(labels)
}

fn renumber(rules: &mut [Value]) {
    for (i, rule) in rules.iter_mut().enumerate() {
        rule["position"] = json!((i + 1).to_string());
    }
}

fn not_found(uuid: &str) -> Response<Full<Bytes>> {
    error(404, "SERVER_NOT_FOUND", &format!("The server {uuid} does not exist."))
}

/// At most 128 characters in all (the API document); no limit per label: UpCloud accepted a
/// 64-character first label in a recorded create (attachmodifyreleasefloatingipaddress).
fn valid_hostname(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 128
        && h.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn valid_label_key(k: &str) -> bool {
    (2..=32).contains(&k.len())
        && k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

const SERVER_ATTRIBUTES: [&str; 25] = [
    "avoid_host",
    "host",
    "boot_order",
    "core_number",
    "firewall",
    "hostname",
    "labels",
    "login_user",
    "memory_amount",
    "metadata",
    "networking",
    "password_delivery",
    "plan",
    "server_group",
    "simple_backup",
    "storage_devices",
    "timezone",
    "title",
    "user_data",
    "video_model",
    "nic_model",
    "remote_access_enabled",
    "remote_access_type",
    "remote_access_password",
    "zone",
];

fn create_server(state: &mut State, body: &Value, config: &DoubleConfig) -> Response<Full<Bytes>> {
    let Some(server) = body.get("server").and_then(Value::as_object) else {
        return error(400, "SERVER_INVALID", "The request must contain a server object.");
    };
    if let Some(unknown) = server.keys().find(|k| !SERVER_ATTRIBUTES.contains(&k.as_str())) {
        return error(400, "UNKNOWN_ATTRIBUTE", &format!("The attribute {unknown} is unknown."));
    }
    let text = |k: &str| server.get(k).and_then(Value::as_str);
    let Some(zone) = text("zone") else { return error(400, "ZONE_MISSING", "The zone is missing.") };
    if !ZONES.contains(&zone) {
        return error(404, "ZONE_NOT_FOUND", &format!("The zone {zone} does not exist."));
    }
    let Some(title) = text("title") else { return error(400, "SERVER_TITLE_MISSING", "The server title is missing.") };
    if title.is_empty() || title.len() > 255 {
        return error(400, "SERVER_TITLE_INVALID", "The server title is invalid.");
    }
    let Some(hostname) = text("hostname") else { return error(400, "HOSTNAME_MISSING", "The hostname is missing.") };
    if !valid_hostname(hostname) {
        return error(400, "HOSTNAME_INVALID", &format!("The hostname {hostname} is invalid."));
    }
    // No plan (or `custom`): `core_number` and `memory_amount` (strings), 1 core and 1 GiB
    // by default, as UpCloud's recorded create without a plan answers.
    let plan = text("plan").unwrap_or("custom");
    let (cores, memory) = if plan == "custom" {
        let number = |k: &str, default: u32| match server.get(k) {
            None => Some(default),
            Some(v) => v.as_str().and_then(|v| v.parse::<u32>().ok()).or_else(|| v.as_u64().and_then(|v| u32::try_from(v).ok())),
        };
        let Some(cores) = number("core_number", 1).filter(|c| (1..=80).contains(c)) else {
            return error(400, "CORE_NUMBER_INVALID", "The core_number is invalid.");
        };
        let Some(memory) = number("memory_amount", 1024).filter(|m| *m >= 1024 && m % 1024 == 0) else {
            return error(400, "MEMORY_AMOUNT_INVALID", "The memory_amount is invalid.");
        };
        (cores, memory)
    } else {
        let Some((_, cores, memory, _)) = PLANS.iter().find(|(name, ..)| *name == plan) else {
            return error(400, "PLAN_INVALID", &format!("The plan {plan} does not exist."));
        };
        (*cores, *memory)
    };
    let metadata = text("metadata").unwrap_or("no");
    if !matches!(metadata, "yes" | "no") {
        return error(400, "METADATA_INVALID", "The metadata attribute must be yes or no.");
    }
    let password_delivery = text("password_delivery").unwrap_or("none");
    if !matches!(password_delivery, "none" | "email" | "sms") {
        return error(400, "PASSWORD_DELIVERY_INVALID", "The password_delivery attribute must be none, email or sms.");
    }
    // Labels.
    let labels = match server.get("labels").map(parse_labels) {
        None => Vec::new(),
        Some(Ok(labels)) => labels,
        Some(Err(response)) => return response,
    };
    // Storage devices: a clone of a public template; cloud-init templates need metadata.
    let Some(devices) = server.get("storage_devices").and_then(|d| d.get("storage_device")).and_then(Value::as_array) else {
        return error(400, "STORAGE_DEVICES_MISSING", "The storage devices are missing.");
    };
    if devices.is_empty() {
        return error(400, "STORAGE_DEVICES_MISSING", "The storage devices are missing.");
    }
    let mut new_storages = Vec::new();
    for device in devices {
        let action = device.get("action").and_then(Value::as_str);
        if !matches!(action, Some("create" | "clone" | "attach")) {
            return error(400, "ACTION_INVALID", "The storage action is invalid.");
        }
        let Some(storage_title) = device.get("title").and_then(Value::as_str) else {
            return error(400, "STORAGE_TITLE_MISSING", "The storage title is missing.");
        };
        let size = device.get("size").and_then(|s| s.as_u64().or_else(|| s.as_str().and_then(|s| s.parse().ok())));
        let Some(size) = size.filter(|s| (10..=4096).contains(s)) else {
            return error(400, "SIZE_INVALID", "The storage size is invalid.");
        };
        let tier = device.get("tier").and_then(Value::as_str).unwrap_or("maxiops");
        if !matches!(tier, "maxiops" | "hdd" | "standard") {
            return error(400, "TIER_INVALID", "The storage tier is invalid.");
        }
        if action == Some("clone") {
            let template = device.get("storage").and_then(Value::as_str).unwrap_or("");
            let Some((_, _, cloud_init)) = TEMPLATES.iter().find(|(uuid, ..)| *uuid == template) else {
                return error(404, "STORAGE_NOT_FOUND", &format!("The storage {template} does not exist."));
            };
            if *cloud_init && metadata != "yes" {
                return error(400, "METADATA_DISABLED_ON_CLOUD-INIT", "The metadata service must be enabled for cloud-init templates.");
            }
        }
        new_storages.push(Storage { title: storage_title.to_string(), size: size as u32, tier: tier.to_string() });
    }
    // Networking: interfaces in order, each with its address families.
    let mut ip_kinds: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(networking) = server.get("networking") {
        let Some(interfaces) = networking.pointer("/interfaces/interface").and_then(Value::as_array) else {
            return error(400, "NETWORKING_INVALID", "The interfaces must be given as {\"interfaces\": {\"interface\": [...]}}.");
        };
        for interface in interfaces {
            let kind = interface.get("type").and_then(Value::as_str).unwrap_or("");
            if !matches!(kind, "public" | "utility" | "private") {
                return error(400, "NETWORK_TYPE_INVALID", "The interface type is invalid.");
            }
            let families: Vec<&str> = interface
                .pointer("/ip_addresses/ip_address")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|ip| ip.get("family").and_then(Value::as_str)).collect())
                .unwrap_or_default();
            if families.iter().any(|family| !matches!(*family, "IPv4" | "IPv6")) {
                return error(400, "IP_ADDRESS_INVALID", "The address family is invalid.");
            }
            ip_kinds.push((kind.to_string(), families.iter().map(|f| f.to_string()).collect()));
        }
    } else {
        ip_kinds = vec![("public".into(), vec!["IPv4".into()]), ("utility".into(), vec!["IPv4".into()])];
    }
    if let Some(login) = server.get("login_user") {
        let keys = login.pointer("/ssh_keys/ssh_key").and_then(Value::as_array).cloned().unwrap_or_default();
        if keys.iter().any(|k| !k.as_str().is_some_and(|k| k.starts_with("ssh-") || k.starts_with("ecdsa-"))) {
            return error(400, "SSH_KEY_INVALID", "An SSH key is invalid.");
        }
    }
    let firewall = text("firewall").unwrap_or("off");
    if !matches!(firewall, "on" | "off") {
        return error(400, "FIREWALL_INVALID", "The firewall attribute must be on or off.");
    }
    state.serial += 1;
    let serial = state.serial;
    let uuid = format!("00{:06x}-{}", serial, &uuid::Uuid::new_v4().to_string()[9..]);
    let mut storage_ids = Vec::new();
    for storage in new_storages {
        let id = format!("01{:06x}-{}", serial, &uuid::Uuid::new_v4().to_string()[9..]);
        state.storages.insert(id.clone(), storage);
        storage_ids.push(id);
    }
    let interfaces = ip_kinds
        .into_iter()
        .enumerate()
        .map(|(i, (access, families))| {
            let ips = families
                .into_iter()
                .map(|family| {
                    let address = match (access.as_str(), family.as_str()) {
                        // Documentation ranges: clearly fake, never routed.
                        ("public", "IPv4") => format!("198.51.{}.{}", serial / 250 % 250, serial % 250 + 1),
                        ("public", _) => format!("2001:db8::{serial:x}:{i}"),
                        (_, "IPv4") => format!("10.{}.{}.{}", i + 1, serial / 250 % 250, serial % 250 + 1),
                        _ => format!("fd00::{serial:x}:{i}"),
                    };
                    (address, family)
                })
                .collect();
            (access, ips)
        })
        .collect();
    let mut created = Server {
        uuid: uuid.clone(),
        zone: zone.to_string(),
        title: title.to_string(),
        hostname: hostname.to_string(),
        plan: plan.to_string(),
        cores,
        memory,
        labels,
        phase: Phase::Creating { until: Instant::now() + config.create_time },
        storages: storage_ids,
        interfaces,
        firewall: firewall.to_string(),
        firewall_rules: Vec::new(),
        metadata: metadata.to_string(),
        remote_access: "no".into(),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        serial,
    };
    // The create answer is the details with the creation progress; a server without
    // password delivery gets its root password here.
    let mut details = created.details(&state.storages, &state.floating);
    if let Some(object) = details.as_object_mut() {
        object.insert("progress".into(), json!("0"));
        if password_delivery == "none" {
            let username = server.get("login_user").and_then(|l| l.get("username")).and_then(Value::as_str).unwrap_or("root");
            object.insert("username".into(), json!(username));
            let with_password = server.get("login_user").and_then(|l| l.get("create_password")).and_then(Value::as_str) != Some("no");
            if with_password {
                object.insert("password".into(), json!(format!("pw{:014x}", u64::from(serial) * 0x9e37_79b9)));
            }
        }
    }
    state.servers.insert(uuid, created);
    reply(202, Some(json!({"server": details})))
}
