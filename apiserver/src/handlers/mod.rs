//! Verb semantics (create, update, patch, delete, get, list) independent of HTTP: the
//! [`Core`] shared by the HTTP layer ([`crate::server`]), watches, the garbage collector and
//! the RBAC bootstrap (through [`ObjectWriter`]).
//!
//! By concern, each an `impl Core` block:
//! - [`read`]: get, list (pages, continue tokens), list bodies, version conversion;
//! - [`admission`]: what every write passes: type, metadata, size, kind-specific
//!   normalisation (Secrets, Namespaces, CRDs), schema and CEL rules;
//! - [`create`]: POST; [`update`]: PUT and PATCH (main resource and the status subresource)
//!   and their shared tail; [`delete`]: DELETE, finalizer-driven removal, internal writes.

mod admission;
mod create;
mod defaults;
mod delete;
mod read;
mod update;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use provisioning_yaml::bounded::{self, DecodeBudget, DecodeError, Meter};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ApiResult};
use crate::registry::{Registry, ResourceType};
use crate::storage::{Entry, ObjKey, Store, StoreError};

pub use crate::objects::{FieldValidation, ObjectWriter, Output, WriteOptions, Written};
pub use crate::registry::{CRDS, NAMESPACES};

/// Deletion propagation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Dependents are deleted after the owner, in the background.
    Background,
    /// The owner waits (finalizer `foregroundDeletion`) until dependents are gone.
    Foreground,
    /// Dependents lose their ownerReference (finalizer `orphan`).
    Orphan,
}

/// Options of a delete.
#[derive(Debug, Clone)]
pub struct DeleteOptions {
    /// Propagation policy.
    pub propagation: Propagation,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// Precondition on uid.
    pub uid: Option<String>,
    /// Precondition on resourceVersion.
    pub resource_version: Option<String>,
}

/// The server's limits, with kube-apiserver's defaults where it has one.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Events expire this long after they were last written (kube-apiserver `--event-ttl`, 1 h).
    pub event_ttl: Duration,
    /// Open connections at most; when full, the longest-idle connection is closed for a new one.
    pub max_connections: usize,
    /// Open connections from one peer address at most (connections come before
    /// authentication, so the address is all there is); when full, that peer's longest-idle
    /// connection is closed for its new one, and when all of them are busy the new one is refused.
    pub max_connections_per_peer: usize,
    /// A client must send a request's headers within this (Go's `ReadHeaderTimeout` in kube: 32 s).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (kube: 90 s).
    pub idle_timeout: Duration,
    /// Open watches at most, over all non-exempt users (429 beyond).
    pub max_watches: usize,
    /// Open watches of one user at most (429 beyond, as APF answers; others go on).
    pub max_watches_per_user: usize,
    /// Requests in flight (not watches) over all non-exempt users at most (kube-apiserver's
    /// `--max-requests-inflight`: 400).
    pub max_requests_in_flight: usize,
    /// Requests in flight (not watches) of one user at most.
    pub max_requests_in_flight_per_user: usize,
    /// Users never refused by the per-user and shared caps (by default the controller's
    /// ServiceAccount).
    pub exempt_users: Vec<String>,
    /// Groups whose members are never refused (by default `system:masters`, APF's `exempt`).
    pub exempt_groups: Vec<String>,
    /// A watch without `timeoutSeconds` ends after a random 1x–2x of this, and a client's
    /// larger `timeoutSeconds` is cut to 2x (kube-apiserver's `--min-request-timeout`: 1800 s).
    pub min_request_timeout: Duration,
    /// Open watches at most on one connection (one client; 429 beyond).
    pub max_watches_per_connection: usize,
    /// A watcher whose buffer stays full this long is dropped (the client re-lists).
    pub slow_reader_timeout: Duration,
    /// Bytes of watch events buffered for one watcher before it counts as not reading.
    pub watch_buffer_bytes: usize,
    /// The longest lifetime of a token from the TokenRequest API (kube-apiserver
    /// `--service-account-max-token-expiration`; 48 h here); longer requests are shortened.
    pub max_token_expiration: Duration,
    /// A request's body must arrive within this once its headers have (kube-apiserver's
    /// request timeout: 60 s); 408 after it.
    pub body_read_timeout: Duration,
    /// Memory (estimated) all requests together may spend on decoding their bodies at once;
    /// a request's first 256 KiB are its own, beyond that a body that finds the budget spent is
    /// refused with 429 ([`provisioning_yaml::bounded`]).
    pub decode_memory: usize,
    /// Bytes all watchers together may hold queued for their clients (each at most
    /// `watch_buffer_bytes`), shared fairly by flow; exempt identities' watches are not counted.
    /// A watcher that cannot queue an event within `slow_reader_timeout` is dropped (its client
    /// re-lists).
    pub watch_memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            event_ttl: Duration::from_secs(3600),
            max_connections: 8192,
            max_connections_per_peer: 1024,
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            max_watches: 10_000,
            max_watches_per_user: 500,
            max_requests_in_flight: 400,
            max_requests_in_flight_per_user: 100,
            exempt_users: vec![crate::auth::identity::CONTROLLER_SERVICE_ACCOUNT.to_string()],
            exempt_groups: vec![crate::auth::identity::MASTERS.to_string()],
            min_request_timeout: Duration::from_secs(1800),
            max_watches_per_connection: 1_000,
            slow_reader_timeout: Duration::from_secs(5),
            watch_buffer_bytes: 16 * 1024 * 1024,
            max_token_expiration: Duration::from_secs(48 * 3600),
            body_read_timeout: Duration::from_secs(60),
            decode_memory: 512 * 1024 * 1024,
            watch_memory: 1024 * 1024 * 1024,
        }
    }
}

/// How long a list or watch from a resourceVersion ahead of the store waits for it (as
/// kube-apiserver's watch cache does) before answering 504 "Too large resource version".
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// One page of a list: entries, the list revision, the continue token, remaining items.
pub type ListPage = (Vec<Arc<Entry>>, u64, Option<String>, Option<u64>);

/// Shared server state: storage, served types, lifecycle.
pub struct Core {
    /// Limits in force.
    pub limits: Limits,
    /// Durable store.
    pub store: Arc<Store>,
    /// Current registry snapshot.
    pub registry: RwLock<Arc<Registry>>,
    /// Cancelled on shutdown (ends watches).
    pub shutdown: CancellationToken,
    /// Wakes the garbage collector.
    pub gc_wakeup: Notify,
    /// Serialises registry rebuilds.
    rebuild: tokio::sync::Mutex<()>,
    /// Requests by verb and resource, entries scanned per list and watch start.
    pub stats: Arc<crate::stats::Stats>,
    /// Memory all requests together may spend decoding their bodies ([`Limits::decode_memory`]).
    pub decode: Arc<DecodeBudget>,
    /// Bytes all watchers may hold queued ([`Limits::watch_memory`]).
    pub watch_buffers: Arc<DecodeBudget>,
    /// Each stored Service's cluster IPs and node ports by (namespace, name), as of a revision
    /// (admission's `services_taken`).
    service_allocations: std::sync::Mutex<std::collections::HashMap<(String, String), defaults::Allocation>>,
}

/// RFC 3339 timestamp of now with second precision, as Kubernetes writes them.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn qualified(rt: &ResourceType) -> String {
    if rt.group.is_empty() { rt.plural.clone() } else { format!("{}.{}", rt.plural, rt.group) }
}

pub(super) fn map_store(rt: &ResourceType, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::AlreadyExists => ApiError::already_exists(&rt.group, &rt.plural, name),
        StoreError::Conflict => ApiError::conflict(&rt.group, &rt.plural, name),
        StoreError::NotFound => ApiError::not_found(&rt.group, &rt.plural, name),
        StoreError::Internal(m) => ApiError::internal(m),
        StoreError::Unavailable(m) => ApiError::unavailable(format!("storage cannot commit writes ({m}); restart the server")),
    }
}

/// The answer to a decode the budget or the size limit refused: 413 or 429.
pub fn decode_refusal(e: DecodeError) -> ApiError {
    match e {
        DecodeError::Syntax(e) => ApiError::bad_request(e),
        e @ DecodeError::TooLarge { .. } => ApiError::too_large_with(e.to_string()),
        e @ DecodeError::Busy { .. } => ApiError::too_many_requests(e.to_string()),
    }
}

/// Parses a request body as JSON or YAML within the request's decode `meter` (its memory is
/// charged to the process-wide [`DecodeBudget`]); 400 when it is neither, 413 when it decodes
/// to more than its size allows, 429 when the budget is spent.
pub fn parse_body(body: &[u8], content_type: &str, meter: &Meter) -> ApiResult<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    // The media type itself, not its parameters (`application/merge-patch+json; x=yaml` is JSON).
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if media.contains("protobuf") {
        return crate::protobuf::decode(body, meter);
    }
    let yaml = media.contains("yaml");
    let decode_error = |e: DecodeError, what: &str| match e {
        DecodeError::Syntax(e) => ApiError::bad_request(format!("{what}: {e}")),
        e => decode_refusal(e),
    };
    match bounded::json_value(body, meter) {
        Ok(v) => Ok(v),
        Err(e) if !yaml || !matches!(e, DecodeError::Syntax(_)) => {
            Err(decode_error(e, "the body of the request could not be decoded as JSON"))
        }
        Err(_) => {
            let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
            // As go-yaml in kube-apiserver: an expansion beyond the limit is a 400.
            bounded::yaml_value(text, meter).map_err(|e| match e {
                DecodeError::TooLarge { .. } => {
                    ApiError::bad_request(format!("error converting YAML to JSON: document contains excessive aliasing: {e}"))
                }
                e => decode_error(e, "error converting YAML to JSON"),
            })
        }
    }
}

pub(super) fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

impl Core {
    /// A core over an opened store with default limits; the registry is built from stored CRDs.
    pub fn new(store: Arc<Store>) -> Arc<Core> {
        Self::with_limits(store, Limits::default())
    }

    /// A core over an opened store with these limits.
    pub fn with_limits(store: Arc<Store>, limits: Limits) -> Arc<Core> {
        let decode = DecodeBudget::new(limits.decode_memory);
        let watch_buffers = DecodeBudget::new(limits.watch_memory);
        let core = Arc::new(Core {
            limits,
            store,
            registry: RwLock::new(Arc::new(Registry::default())),
            shutdown: CancellationToken::new(),
            gc_wakeup: Notify::new(),
            rebuild: tokio::sync::Mutex::new(()),
            stats: Arc::default(),
            decode,
            watch_buffers,
            service_allocations: Default::default(),
        });
        core.rebuild_registry_now();
        core
    }

    /// Whether the writer of `opts` may write the controller's shard label: the server's own
    /// writes and the exempt identities (the controller, `system:masters`).
    pub fn may_write_shard_label(&self, opts: &WriteOptions) -> bool {
        match &opts.user {
            None => true,
            Some(user) => self.limits.exempt_users.contains(user) || opts.groups.iter().any(|g| self.limits.exempt_groups.contains(g)),
        }
    }

    /// A decode meter for one request, charged to the process-wide budget (within the fair
    /// share of `flow`, when given).
    pub fn meter(&self, flow: Option<String>) -> Option<Arc<Meter>> {
        Some(Arc::new(match flow {
            Some(f) => Meter::for_flow(self.decode.clone(), f),
            None => Meter::new(self.decode.clone()),
        }))
    }

    /// The current registry.
    pub fn registry(&self) -> Arc<Registry> {
        match self.registry.read() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn rebuild_registry_now(&self) {
        let crds: Vec<Value> = {
            let st = self.store.read();
            st.objects.get(CRDS).map(|m| m.values().map(|e| e.value()).collect()).unwrap_or_default()
        };
        let reg = Arc::new(Registry::build(&crds));
        match self.registry.write() {
            Ok(mut r) => *r = reg,
            Err(p) => *p.into_inner() = reg,
        }
    }

    pub(super) async fn rebuild_registry(&self) {
        let _g = self.rebuild.lock().await;
        self.rebuild_registry_now();
    }

    pub(super) fn key(rt: &ResourceType, ns: Option<&str>, name: &str) -> ObjKey {
        ObjKey {
            storage: Arc::from(rt.storage.as_str()),
            namespace: if rt.namespaced { ns.unwrap_or_default().to_string() } else { String::new() },
            name: name.to_string(),
        }
    }

    /// Name of the resource as used in messages (`servers.provisioning.dev`).
    pub fn qualified_name(rt: &ResourceType) -> String {
        qualified(rt)
    }
}

impl ObjectWriter for Core {
    fn store(&self) -> &Store {
        &self.store
    }

    fn registry(&self) -> Arc<Registry> {
        Core::registry(self)
    }

    fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> ApiResult<Arc<Entry>> {
        Core::get(self, rt, ns, name)
    }

    fn create(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> impl std::future::Future<Output = ApiResult<Written>> + Send {
        Core::create(self, rt, ns, obj, opts)
    }

    fn update(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> impl std::future::Future<Output = ApiResult<Written>> + Send {
        Core::update(self, rt, ns, name, obj, status, opts)
    }
}
