//! Verb semantics (create, update, patch, delete, get, list) independent of HTTP.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::apply::{self, ApplyRequest, Scope};
use crate::error::{ApiError, ApiResult, Cause};
use crate::patch::{self, PatchType};
use crate::registry::{Registry, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::storage::{Entry, ObjKey, Precondition, Store, StoreError};
use crate::validation;

pub use crate::registry::{CRDS, NAMESPACES};

/// How unknown fields are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop silently.
    Ignore,
    /// Drop and return a Warning header (server default).
    #[default]
    Warn,
    /// Reject with 400.
    Strict,
}

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    /// `fieldManager` (or one derived from the User-Agent).
    pub field_manager: String,
    /// Whether the manager came from the request explicitly.
    pub explicit_manager: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `force` for server-side apply.
    pub force: bool,
}

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

/// What a write produced.
pub enum Output {
    /// The stored object.
    Stored(Arc<Entry>),
    /// An object that was not stored (dry run, or a deletion summary).
    Transient(Value),
}

impl Output {
    /// Serialized body.
    pub fn bytes(&self) -> Bytes {
        match self {
            Output::Stored(e) => e.bytes.clone(),
            Output::Transient(v) => Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
        }
    }
    /// Parsed value.
    pub fn value(&self) -> Value {
        match self {
            Output::Stored(e) => e.value(),
            Output::Transient(v) => v.clone(),
        }
    }
}

/// A write result with warnings for the client.
pub struct Written {
    /// The object.
    pub output: Output,
    /// Warning headers.
    pub warnings: Vec<String>,
}

/// The server's limits, with kube-apiserver's defaults where it has one.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Events expire this long after they were last written (kube-apiserver `--event-ttl`, 1 h).
    pub event_ttl: Duration,
    /// Open connections at most; when full, the longest-idle connection is closed for a new one.
    pub max_connections: usize,
    /// A client must send a request's headers within this (Go's `ReadHeaderTimeout` in kube: 32 s).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (kube: 90 s).
    pub idle_timeout: Duration,
    /// Open watches at most, over all clients (429 beyond).
    pub max_watches: usize,
    /// Open watches at most on one connection (one client; 429 beyond).
    pub max_watches_per_connection: usize,
    /// A watcher whose buffer stays full this long is dropped (the client re-lists).
    pub slow_reader_timeout: Duration,
    /// Bytes of watch events buffered for one watcher before it counts as not reading.
    pub watch_buffer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            event_ttl: Duration::from_secs(3600),
            max_connections: 8192,
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            max_watches: 10_000,
            max_watches_per_connection: 1_000,
            slow_reader_timeout: Duration::from_secs(5),
            watch_buffer_bytes: 16 * 1024 * 1024,
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
}

/// RFC 3339 timestamp of now with second precision, as Kubernetes writes them.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn qualified(rt: &ResourceType) -> String {
    if rt.group.is_empty() { rt.plural.clone() } else { format!("{}.{}", rt.plural, rt.group) }
}

fn map_store(rt: &ResourceType, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::AlreadyExists => ApiError::already_exists(&rt.group, &rt.plural, name),
        StoreError::Conflict => ApiError::conflict(&rt.group, &rt.plural, name),
        StoreError::NotFound => ApiError::not_found(&rt.group, &rt.plural, name),
        StoreError::Internal(m) => ApiError::internal(m),
        StoreError::Unavailable(m) => ApiError::unavailable(format!("storage cannot commit writes ({m}); restart the server")),
    }
}

/// Parses a request body as JSON or YAML; 400 when it is neither.
pub fn parse_body(body: &[u8], content_type: &str) -> ApiResult<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if content_type.contains("protobuf") {
        return crate::protobuf::decode(body);
    }
    let yaml = content_type.contains("yaml");
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) if !yaml => Err(ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}"))),
        Err(_) => {
            let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
            serde_yaml_ng::from_str::<Value>(text).map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))
        }
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect()
}

/// Converts an Event between core/v1 and events.k8s.io/v1 field names.
pub fn convert_event(mut v: Value, to_events_group: bool) -> Value {
    let Some(m) = v.as_object_mut() else { return v };
    let pairs: [(&str, &str); 5] = [
        ("involvedObject", "regarding"),
        ("message", "note"),
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
        ("count", "deprecatedCount"),
    ];
    for (core, ev) in pairs {
        let (from, to) = if to_events_group { (core, ev) } else { (ev, core) };
        if let Some(x) = m.remove(from) {
            m.insert(to.into(), x);
        }
    }
    if to_events_group {
        if let Some(src) = m.remove("source") {
            if !m.contains_key("reportingController")
                && let Some(c) = src.get("component")
            {
                m.insert("reportingController".into(), c.clone());
            }
            m.insert("deprecatedSource".into(), src);
        }
        if let Some(rc) = m.remove("reportingComponent") {
            m.entry("reportingController").or_insert(rc);
        }
        m.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    } else {
        if let Some(src) = m.remove("deprecatedSource") {
            m.insert("source".into(), src);
        }
        if let Some(rc) = m.remove("reportingController") {
            if !m.contains_key("source") {
                m.insert("source".into(), json!({"component": rc}));
            }
            m.insert("reportingComponent".into(), rc);
        }
        m.insert("apiVersion".into(), json!("v1"));
    }
    v
}

impl Core {
    /// A core over an opened store with default limits; the registry is built from stored CRDs.
    pub fn new(store: Arc<Store>) -> Arc<Core> {
        Self::with_limits(store, Limits::default())
    }

    /// A core over an opened store with these limits.
    pub fn with_limits(store: Arc<Store>, limits: Limits) -> Arc<Core> {
        let core = Arc::new(Core {
            limits,
            store,
            registry: RwLock::new(Arc::new(Registry::default())),
            shutdown: CancellationToken::new(),
            gc_wakeup: Notify::new(),
            rebuild: tokio::sync::Mutex::new(()),
        });
        core.rebuild_registry_now();
        core
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

    async fn rebuild_registry(&self) {
        let _g = self.rebuild.lock().await;
        self.rebuild_registry_now();
    }

    /// Renders a stored entry for a served type (version conversion where needed).
    pub fn render(&self, rt: &ResourceType, e: &Entry) -> Bytes {
        let want = rt.api_version();
        if e.api_version == want {
            return e.bytes.clone();
        }
        let v = e.value();
        Bytes::from(serde_json::to_vec(&self.convert(rt, v)).unwrap_or_default())
    }

    /// Converts an object to the version of `rt`.
    pub fn convert(&self, rt: &ResourceType, mut v: Value) -> Value {
        let want = rt.api_version();
        if v["apiVersion"].as_str() == Some(want.as_str()) {
            return v;
        }
        if rt.storage == "/events" {
            return convert_event(v, rt.group == "events.k8s.io");
        }
        v["apiVersion"] = json!(want);
        v
    }

    /// Whether a namespace exists; Err when it is terminating (for creates).
    fn check_namespace(&self, ns: &str) -> ApiResult<()> {
        let key = ObjKey { storage: Arc::from(NAMESPACES), namespace: String::new(), name: ns.to_string() };
        match self.store.get(&key) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(e) if e.deleting => {
                Err(ApiError::forbidden(format!("unable to create new content in namespace {ns} because it is being terminated")))
            }
            Some(_) => Ok(()),
        }
    }

    fn key(rt: &ResourceType, ns: Option<&str>, name: &str) -> ObjKey {
        ObjKey {
            storage: Arc::from(rt.storage.as_str()),
            namespace: if rt.namespaced { ns.unwrap_or_default().to_string() } else { String::new() },
            name: name.to_string(),
        }
    }

    /// GET of one object.
    pub fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> ApiResult<Arc<Entry>> {
        self.store.get(&Self::key(rt, ns, name)).ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    /// Waits (up to [`FRESHNESS_WAIT`]) until the store reached `want`; a 504 like
    /// kube-apiserver's "Too large resource version" otherwise.
    pub async fn wait_fresh(&self, want: u64) -> ApiResult<()> {
        let mut rx = self.store.subscribe();
        let reached = tokio::time::timeout(FRESHNESS_WAIT, async {
            loop {
                if *rx.borrow_and_update() >= want {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        let current = self.store.current_rv();
        if reached.is_ok() && current >= want {
            return Ok(());
        }
        Err(ApiError::too_large_resource_version(want, current))
    }

    /// Admission checks every stored object passes, whatever wrote it (create, update, each
    /// kind of patch): size, nesting depth and metadata (labels and annotations).
    fn admit(rt: &ResourceType, obj: &Value) -> ApiResult<()> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let depth = validation::depth(obj);
        if depth > validation::MAX_DEPTH {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "",
                    format!(
                        "Invalid value: the object nests {depth} levels deep, more than the limit of {} (deeper objects cannot be read by every Kubernetes client)",
                        validation::MAX_DEPTH
                    ),
                )],
            ));
        }
        let causes = validation::validate_metadata(&obj["metadata"]);
        if !causes.is_empty() {
            return Err(ApiError::invalid(&rt.kind, &rt.group, name, causes));
        }
        let size = serde_json::to_vec(obj).map(|b| b.len()).unwrap_or(usize::MAX);
        if size > validation::MAX_OBJECT_BYTES {
            return Err(ApiError::too_large_with(format!(
                "the object {name} would be {size} bytes, more than the limit of {} bytes",
                validation::MAX_OBJECT_BYTES
            )));
        }
        Ok(())
    }

    /// LIST: matching entries, the list revision and a continue token.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> ApiResult<ListPage> {
        let (start, token_rv) = match cont {
            Some(c) if !c.is_empty() => {
                let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(c)
                    .map_err(|_| ApiError::bad_request("invalid continue token"))?;
                let v: Value = serde_json::from_slice(&raw).map_err(|_| ApiError::bad_request("invalid continue token"))?;
                let ns = v["ns"].as_str().unwrap_or_default().to_string();
                let name = v["name"].as_str().unwrap_or_default().to_string();
                (Some((ns, name)), v["rv"].as_u64())
            }
            _ => (None, None),
        };
        let st = self.store.read();
        let rv = token_rv.unwrap_or(st.rv);
        let mut out = vec![];
        let mut more = None;
        let mut remaining = 0u64;
        if let Some(map) = st.objects.get(rt.storage.as_str()) {
            use std::ops::Bound;
            let lower = match &start {
                Some(k) => Bound::Excluded(k.clone()),
                None => match (rt.namespaced, ns) {
                    (true, Some(n)) => Bound::Included((n.to_string(), String::new())),
                    _ => Bound::Unbounded,
                },
            };
            for ((ons, oname), e) in map.range((lower, Bound::Unbounded)) {
                if let (true, Some(n)) = (rt.namespaced, ns)
                    && ons != n
                {
                    if ons.as_str() > n {
                        break;
                    }
                    continue;
                }
                if !fields.matches(ons, oname, &e.fields) || !labels.matches(&e.labels) {
                    continue;
                }
                if let Some(l) = limit
                    && out.len() >= l
                {
                    if more.is_none() {
                        let last: &Arc<Entry> = &out[out.len() - 1];
                        more = Some(json!({"rv": rv, "ns": last.key.namespace, "name": last.key.name}));
                    }
                    remaining += 1;
                    continue;
                }
                out.push(e.clone());
            }
        }
        let token = more.map(|m| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(m.to_string()));
        Ok((out, rv, token, if remaining > 0 { Some(remaining) } else { None }))
    }

    /// Checks apiVersion/kind of a body and fills them in.
    fn check_type(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
        let Some(m) = obj.as_object_mut() else {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        };
        let want = rt.api_version();
        if let Some(av) = m.get("apiVersion").and_then(Value::as_str) {
            let same_group =
                av == want || (rt.group.is_empty() && av == rt.version) || av.split_once('/').is_some_and(|(g, _)| g == rt.group);
            if !same_group {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want})"
                )));
            }
        }
        if let Some(k) = m.get("kind").and_then(Value::as_str)
            && k != rt.kind
        {
            return Err(ApiError::bad_request(format!("the kind in the data ({k}) does not match the expected kind ({})", rt.kind)));
        }
        m.insert("apiVersion".into(), json!(want));
        m.insert("kind".into(), json!(rt.kind));
        match m.get("metadata") {
            None | Some(Value::Null) => {
                m.insert("metadata".into(), json!({}));
            }
            Some(Value::Object(_)) => {}
            Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
        }
        Ok(())
    }

    /// Kind-specific normalisation done on every write.
    fn normalize(&self, rt: &ResourceType, obj: &mut Value, old: Option<&Value>) -> ApiResult<()> {
        match rt.storage.as_str() {
            "/secrets" => {
                if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                    let data = obj
                        .as_object_mut()
                        .map(|m| m.entry("data").or_insert_with(|| json!({})))
                        .ok_or_else(|| ApiError::bad_request("bad secret"))?;
                    if data.is_null() {
                        *data = json!({});
                    }
                    for (k, v) in sd {
                        let s = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
                        data[k] = json!(base64::engine::general_purpose::STANDARD.encode(s));
                    }
                }
                if obj.get("type").is_none_or(Value::is_null) {
                    obj["type"] = json!("Opaque");
                }
            }
            NAMESPACES => {
                if obj["spec"]["finalizers"].is_null() {
                    obj["spec"] = json!({"finalizers": ["kubernetes"]});
                }
                let deleting = obj["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null());
                obj["status"] = json!({"phase": if deleting { "Terminating" } else { "Active" }});
                if let Some(o) = old
                    && o["status"]["phase"] == "Terminating"
                {
                    obj["status"] = o["status"].clone();
                }
            }
            CRDS => self.normalize_crd(obj)?,
            _ => {}
        }
        Ok(())
    }

    // Over 80 lines on purpose: the CRD checks and defaults kube-apiserver applies, in its order
    // (names, scope, versions, schemas, conditions), each a few lines.
    fn normalize_crd(&self, obj: &mut Value) -> ApiResult<()> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let group = obj["spec"]["group"].as_str().unwrap_or_default().to_string();
        let plural = obj["spec"]["names"]["plural"].as_str().unwrap_or_default().to_string();
        let kind = obj["spec"]["names"]["kind"].as_str().unwrap_or_default().to_string();
        let mut causes = vec![];
        if group.is_empty() {
            causes.push(Cause::new("FieldValueRequired", "spec.group", "Required value"));
        }
        if plural.is_empty() {
            causes.push(Cause::new("FieldValueRequired", "spec.names.plural", "Required value"));
        }
        if kind.is_empty() {
            causes.push(Cause::new("FieldValueRequired", "spec.names.kind", "Required value"));
        }
        if causes.is_empty() && name != format!("{plural}.{group}") {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "metadata.name",
                format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
            ));
        }
        let versions = obj["spec"]["versions"].as_array().cloned().unwrap_or_default();
        if versions.is_empty() {
            causes.push(Cause::new(
                "FieldValueRequired",
                "spec.versions",
                "Required value: must have exactly one version marked as storage version",
            ));
        }
        let storage: Vec<String> = versions
            .iter()
            .filter(|v| v["storage"].as_bool() == Some(true))
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        if !versions.is_empty() && storage.len() != 1 {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            ));
        }
        match obj["spec"]["scope"].as_str() {
            Some("Namespaced") | Some("Cluster") => {}
            other => causes.push(Cause::new(
                "FieldValueNotSupported",
                "spec.scope",
                format!(
                    "Unsupported value: {}: supported values: \"Cluster\", \"Namespaced\"",
                    other.map(|s| format!("\"{s}\"")).unwrap_or("\"\"".into())
                ),
            )),
        }
        for (i, v) in versions.iter().enumerate() {
            if let Some(schema) = v["schema"].get("openAPIV3Schema") {
                let rules = crate::celrules::Rules::from_schema(schema);
                causes.extend(rules.compile_errors(&format!("spec.versions[{i}].schema.openAPIV3Schema")));
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid("CustomResourceDefinition", "apiextensions.k8s.io", &name, causes));
        }
        let names = &mut obj["spec"]["names"];
        if names["singular"].as_str().is_none_or(str::is_empty) {
            names["singular"] = json!(kind.to_lowercase());
        }
        if names["listKind"].as_str().is_none_or(str::is_empty) {
            names["listKind"] = json!(format!("{kind}List"));
        }
        if obj["spec"]["conversion"].is_null() {
            obj["spec"]["conversion"] = json!({"strategy": "None"});
        }
        let now = now_rfc3339();
        let mut stored = strs(&obj["status"]["storedVersions"]);
        for s in storage {
            if !stored.contains(&s) {
                stored.push(s);
            }
        }
        let names = obj["spec"]["names"].clone();
        let keep_time = |t: &str| -> String {
            obj["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
                .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string))
                .unwrap_or_else(|| now.clone())
        };
        let t1 = keep_time("NamesAccepted");
        let t2 = keep_time("Established");
        obj["status"] = json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t1},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t2},
            ],
            "acceptedNames": names,
            "storedVersions": stored,
        });
        Ok(())
    }

    /// Prunes, defaults and validates a custom resource; collects warnings. Duplicate entries
    /// of list-maps and sets come back instead of failing: as in kube-apiserver they do not
    /// block the CEL rules, and the 422 lists both.
    fn validate_schema(
        &self,
        rt: &ResourceType,
        obj: &mut Value,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> ApiResult<Vec<Cause>> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let mut causes = vec![];
        if let Some(schema) = &rt.schema {
            let out = validation::process(obj, schema);
            if !out.unknown.is_empty() {
                match opts.field_validation {
                    FieldValidation::Strict => {
                        let list: Vec<String> = out.unknown.iter().map(|u| format!("unknown field \"{u}\"")).collect();
                        return Err(ApiError::bad_request(format!(
                            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                            rt.kind,
                            rt.api_version(),
                            rt.kind,
                            list.join(", ")
                        )));
                    }
                    FieldValidation::Warn => warnings.extend(out.unknown.iter().map(|u| format!("unknown field \"{u}\""))),
                    FieldValidation::Ignore => {}
                }
            }
            causes.extend(out.causes);
        }
        if causes.iter().any(|c| c.reason != "FieldValueDuplicate") {
            return Err(ApiError::invalid(&rt.kind, &rt.group, &name, causes));
        }
        Ok(causes)
    }

    /// Evaluates the CRD's `x-kubernetes-validations` (CEL) rules on the defaulted, pruned and
    /// schema-valid object; `old` is the stored object on update (for `oldSelf`). Big objects
    /// are evaluated on the blocking pool so that a long evaluation never stalls the runtime.
    async fn validate_rules(rt: &ResourceType, obj: &Value, old: Option<&Value>, mut causes: Vec<Cause>) -> ApiResult<()> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let Some(rules) = rt.rules.clone() else {
            return if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid(&rt.kind, &rt.group, name, causes)) };
        };
        let rule_causes = if crate::celrules::weight(obj) > 20_000 {
            let (o, old) = (obj.clone(), old.cloned());
            tokio::task::spawn_blocking(move || rules.validate(&o, old.as_ref()))
                .await
                .map_err(|_| ApiError::internal("evaluating validation rules failed"))?
        } else {
            rules.validate(obj, old)
        };
        causes.extend(rule_causes);
        if causes.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(&rt.kind, &rt.group, name, causes))
    }

    fn scope_for(rt: &ResourceType, status: bool) -> Scope {
        if status {
            Scope::Status
        } else if rt.has_status {
            Scope::Main
        } else {
            Scope::All
        }
    }

    /// POST: creates an object.
    pub async fn create(&self, rt: &ResourceType, ns: Option<&str>, mut obj: Value, opts: &WriteOptions) -> ApiResult<Written> {
        self.create_inner(rt, ns, &mut obj, opts, false).await
    }

    // Over 80 lines on purpose: the create pipeline in upstream's order (metadata, namespace,
    // admission, schema, rules, managedFields, store); each step is a call.
    async fn create_inner(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        obj: &mut Value,
        opts: &WriteOptions,
        applied: bool,
    ) -> ApiResult<Written> {
        Self::check_type(rt, obj)?;
        let mut warnings = vec![];
        let md = obj["metadata"].as_object_mut().ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
        // Namespace.
        let namespace = if rt.namespaced {
            let body_ns = md.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
            let ns = match (ns, body_ns) {
                (Some(p), Some(b)) if p != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(p), _) => p.to_string(),
                (None, Some(b)) => b,
                (None, None) => return Err(ApiError::bad_request("namespace is required for a namespaced resource")),
            };
            md.insert("namespace".into(), json!(ns));
            Some(ns)
        } else {
            md.remove("namespace");
            None
        };
        // Name.
        let mut name = md.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        if name.is_empty()
            && let Some(g) = md.get("generateName").and_then(Value::as_str).filter(|s| !s.is_empty())
        {
            name = format!("{g}{}", random_suffix());
            md.insert("name".into(), json!(name));
        }
        let label_name = rt.storage == NAMESPACES;
        // RBAC objects may have any path-segment name (`system:discovery`), as upstream.
        let invalid_name = if rt.group == crate::auth::rbac::GROUP {
            crate::auth::rbac::validate_name(&name)
        } else {
            validation::validate_name(&name, label_name)
        };
        if let Some(c) = invalid_name {
            return Err(ApiError::invalid(&rt.kind, &rt.group, &name, vec![c]));
        }
        // Server-owned metadata.
        for k in
            ["uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "generation"]
        {
            md.remove(k);
        }
        if !applied {
            md.remove("managedFields");
        }
        let now = now_rfc3339();
        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        md.insert("creationTimestamp".into(), json!(now));
        md.insert("generation".into(), json!(1));
        if let Some(n) = &namespace {
            self.check_namespace(n)?;
        }
        // A create never sets status (upstream's PrepareForCreate clears it for built-ins too;
        // Namespace and CRD status is then derived in normalize).
        if rt.has_status
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        self.normalize(rt, obj, None)?;
        Self::admit(rt, obj)?;
        let list_causes = self.validate_schema(rt, obj, opts, &mut warnings)?;
        Self::validate_rules(rt, obj, None, list_causes).await?;
        if !applied {
            apply::record_update(None, obj, &opts.field_manager, &rt.api_version(), rt.schema.as_ref(), Self::scope_for(rt, false), &now);
        }
        if opts.dry_run {
            return Ok(Written { output: Output::Transient(obj.clone()), warnings });
        }
        let key = Self::key(rt, namespace.as_deref(), &name);
        let entry = self.store.put(key, Precondition::MustNotExist, obj.clone()).await.map_err(|e| map_store(rt, &name, e))?;
        if rt.storage == CRDS {
            self.rebuild_registry().await;
        }
        Ok(Written { output: Output::Stored(entry), warnings })
    }

    /// PUT: replaces an object (main resource or status).
    pub async fn update(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        mut obj: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        Self::check_type(rt, &mut obj)?;
        let body_name = obj["metadata"]["name"].as_str().unwrap_or_default();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!("the name of the object ({body_name}) does not match the name on the URL ({name})")));
        }
        let want_rv = obj["metadata"]["resourceVersion"].as_str().filter(|s| !s.is_empty()).map(str::to_string);
        for _ in 0..16 {
            let cur = self.get(rt, ns, name)?;
            if let Some(w) = &want_rv
                && w.parse::<u64>().ok() != Some(cur.rv)
            {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            match self.finish_update(rt, &cur, obj.clone(), status, opts, false).await {
                Err(e) if e.code == 409 && e.reason == "Conflict" && want_rv.is_none() => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// PATCH (merge, JSON, strategic-as-merge, apply).
    // Over 80 lines on purpose: one branch per patch type (merge, JSON, strategic, apply) with
    // the shared retry on conflict around them.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        kind: PatchType,
        body: &[u8],
        content_type: &str,
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        if kind == PatchType::Strategic && rt.custom {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let patch_doc = parse_body(body, if kind == PatchType::Apply { "application/yaml" } else { content_type })?;
        if kind == PatchType::Apply && (!opts.explicit_manager || opts.field_manager.is_empty()) {
            return Err(ApiError::bad_request("PATCH, field manager is required for apply requests"));
        }
        if kind != PatchType::Json && !patch_doc.is_object() {
            return Err(ApiError::bad_request("the patch must be a JSON object"));
        }
        let mut applied = patch_doc.clone();
        if kind == PatchType::Apply {
            Self::check_type(rt, &mut applied)?;
            let an = applied["metadata"]["name"].as_str().unwrap_or_default();
            if an != name {
                return Err(ApiError::bad_request(format!("the name of the object ({an}) does not match the name on the URL ({name})")));
            }
        }
        let want_rv = if kind == PatchType::Json { None } else { patch_doc["metadata"]["resourceVersion"].as_str().map(str::to_string) };
        for _ in 0..32 {
            let cur = match self.get(rt, ns, name) {
                Ok(c) => c,
                Err(e) if e.code == 404 && kind == PatchType::Apply && !status => {
                    let now = now_rfc3339();
                    let mut live = json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": {"name": name}});
                    if let Some(n) = ns {
                        live["metadata"]["namespace"] = json!(n);
                    }
                    let req = ApplyRequest {
                        manager: &opts.field_manager,
                        force: opts.force,
                        scope: Self::scope_for(rt, false),
                        api_version: &rt.api_version(),
                        schema: rt.schema.as_ref(),
                        now: &now,
                    };
                    let mut obj = apply::apply(&live, &applied, &req)?;
                    for k in ["apiVersion", "kind"] {
                        obj[k] = applied[k].clone();
                    }
                    match self.create_inner(rt, ns, &mut obj, opts, true).await {
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        other => return other,
                    }
                }
                Err(e) => return Err(e),
            };
            let old = self.convert(rt, cur.value());
            if let Some(w) = &want_rv
                && w.parse::<u64>().ok() != Some(cur.rv)
            {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            let mut candidate = old.clone();
            match kind {
                PatchType::Merge => patch::merge_patch(&mut candidate, &patch_doc),
                // Only built-in kinds get here (custom resources were refused above).
                PatchType::Strategic => crate::strategic::patch(&mut candidate, &patch_doc, rt.schema.as_ref()),
                PatchType::Json => patch::json_patch(&mut candidate, &patch_doc)?,
                PatchType::Apply => {
                    let now = now_rfc3339();
                    let req = ApplyRequest {
                        manager: &opts.field_manager,
                        force: opts.force,
                        scope: Self::scope_for(rt, status),
                        api_version: &rt.api_version(),
                        schema: rt.schema.as_ref(),
                        now: &now,
                    };
                    candidate = apply::apply(&old, &applied, &req)?;
                }
            }
            match self.finish_update(rt, &cur, candidate, status, opts, kind == PatchType::Apply).await {
                Err(e)
                    if e.code == 409
                        && e.reason == "Conflict"
                        && want_rv.is_none()
                        && e.details.as_ref().is_some_and(|d| d.get("causes").is_none()) =>
                {
                    continue;
                }
                other => return other,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// Shared tail of update and patch: status/spec separation, immutable metadata,
    /// generation, validation, managedFields, finalizer-driven removal, no-op detection.
    // Over 80 lines on purpose: the update tail in upstream's order (see the list above); its
    // steps share the old/new pair and early exits. A candidate for splitting.
    async fn finish_update(
        &self,
        rt: &ResourceType,
        cur: &Arc<Entry>,
        mut new: Value,
        status: bool,
        opts: &WriteOptions,
        applied: bool,
    ) -> ApiResult<Written> {
        let old = self.convert(rt, cur.value());
        let name = cur.key.name.clone();
        Self::check_type(rt, &mut new)?;
        let mut warnings = vec![];
        if status {
            let mut merged = old.clone();
            match new.get("status") {
                Some(s) => merged["status"] = s.clone(),
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            if applied {
                merged["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
            }
            new = merged;
        } else if rt.has_status {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        // Immutable and server-owned metadata.
        {
            let om = &old["metadata"];
            let nm = new["metadata"].as_object_mut().ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
            if let Some(bn) = nm.get("namespace").and_then(Value::as_str)
                && rt.namespaced
                && !bn.is_empty()
                && Some(bn) != om["namespace"].as_str()
            {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
            }
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match om.get(k) {
                    Some(v) if !v.is_null() => {
                        nm.insert(k.into(), v.clone());
                    }
                    _ => {
                        nm.remove(k);
                    }
                }
            }
            if !applied {
                match om.get("managedFields") {
                    Some(v) => nm.insert("managedFields".into(), v.clone()),
                    None => nm.remove("managedFields"),
                };
            }
            for k in ["labels", "annotations", "ownerReferences", "finalizers"] {
                if nm.get(k).is_some_and(Value::is_null) {
                    nm.remove(k);
                }
            }
        }
        if old["metadata"].get("deletionTimestamp").is_some() {
            let of = strs(&old["metadata"]["finalizers"]);
            let added = strs(&new["metadata"]["finalizers"]).into_iter().any(|f| !of.contains(&f));
            if added {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    &name,
                    vec![Cause::new(
                        "FieldValueForbidden",
                        "metadata.finalizers",
                        "Forbidden: no new finalizers can be added if the object is being deleted",
                    )],
                ));
            }
        }
        self.normalize(rt, &mut new, Some(&old))?;
        if rt.storage == CRDS && status {
            // The server owns CRD conditions; keep them established.
        }
        Self::admit(rt, &new)?;
        let list_causes = self.validate_schema(rt, &mut new, opts, &mut warnings)?;
        Self::validate_rules(rt, &new, Some(&old), list_causes).await?;
        // Generation moves when anything but metadata (and status, if separate) changes.
        let strip = |v: &Value| -> Value {
            let mut c = v.clone();
            if let Some(m) = c.as_object_mut() {
                m.remove("metadata");
                if rt.has_status {
                    m.remove("status");
                }
            }
            c
        };
        if strip(&old) != strip(&new) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            new["metadata"]["generation"] = json!(g);
        }
        if !applied {
            let now = now_rfc3339();
            apply::record_update(
                Some(&old),
                &mut new,
                &opts.field_manager,
                &rt.api_version(),
                rt.schema.as_ref(),
                Self::scope_for(rt, status),
                &now,
            );
        }
        // No-op writes keep the revision (controllers must not trigger themselves).
        let without_times = |v: &Value| -> Value {
            let mut c = v.clone();
            if let Some(arr) = c["metadata"]["managedFields"].as_array_mut() {
                for e in arr {
                    if let Some(m) = e.as_object_mut() {
                        m.remove("time");
                    }
                }
            }
            c
        };
        if without_times(&old) == without_times(&new) {
            return Ok(Written { output: Output::Stored(cur.clone()), warnings });
        }
        let deleting = new["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null());
        let no_finalizers = strs(&new["metadata"]["finalizers"]).is_empty();
        if opts.dry_run {
            return Ok(Written { output: Output::Transient(new), warnings });
        }
        let key = cur.key.clone();
        if deleting && no_finalizers && rt.storage != NAMESPACES {
            let e = self.store.delete(key, Precondition::Revision(cur.rv)).await.map_err(|e| map_store(rt, &name, e))?;
            self.gc_wakeup.notify_one();
            if rt.storage == CRDS {
                self.after_crd_delete(&e).await;
            }
            return Ok(Written { output: Output::Stored(e), warnings });
        }
        let entry = self.store.put(key, Precondition::Revision(cur.rv), new).await.map_err(|e| map_store(rt, &name, e))?;
        if rt.storage == CRDS {
            self.rebuild_registry().await;
        }
        Ok(Written { output: Output::Stored(entry), warnings })
    }

    /// DELETE of one object. Returns the object (deferred deletion) or a success Status.
    pub async fn delete(&self, rt: &ResourceType, ns: Option<&str>, name: &str, opts: &DeleteOptions) -> ApiResult<Output> {
        for _ in 0..16 {
            let cur = self.get(rt, ns, name)?;
            let mut obj = cur.value();
            if let Some(u) = &opts.uid
                && obj["metadata"]["uid"].as_str() != Some(u.as_str())
            {
                return Err(ApiError::conflict_with(
                    format!(
                        "Precondition failed: UID in precondition: {u}, UID in object meta: {}",
                        obj["metadata"]["uid"].as_str().unwrap_or_default()
                    ),
                    json!({"name": name, "group": rt.group, "kind": rt.plural}),
                ));
            }
            if let Some(r) = &opts.resource_version
                && r.parse::<u64>().ok() != Some(cur.rv)
            {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            let mut finalizers = strs(&obj["metadata"]["finalizers"]);
            let already = cur.deleting;
            match opts.propagation {
                Propagation::Foreground if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
                    finalizers.push("foregroundDeletion".into())
                }
                Propagation::Orphan if !finalizers.iter().any(|f| f == "orphan") => finalizers.push("orphan".into()),
                _ => {}
            }
            let is_ns = rt.storage == NAMESPACES;
            if finalizers.is_empty() && !is_ns {
                if opts.dry_run {
                    return Ok(Output::Transient(obj));
                }
                match self.store.delete(cur.key.clone(), Precondition::Revision(cur.rv)).await {
                    Err(StoreError::Conflict) => continue,
                    Err(e) => return Err(map_store(rt, name, e)),
                    Ok(e) => {
                        self.gc_wakeup.notify_one();
                        if rt.storage == CRDS {
                            self.after_crd_delete(&e).await;
                        }
                        return Ok(Output::Transient(json!({
                            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": e.uid},
                        })));
                    }
                }
            }
            if already && strs(&obj["metadata"]["finalizers"]) == finalizers {
                return Ok(Output::Stored(cur));
            }
            if !already {
                obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            if finalizers.is_empty() {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("finalizers");
                }
            } else {
                obj["metadata"]["finalizers"] = json!(finalizers);
            }
            if is_ns {
                obj["status"] = json!({"phase": "Terminating"});
            }
            if opts.dry_run {
                return Ok(Output::Transient(obj));
            }
            match self.store.put(cur.key.clone(), Precondition::Revision(cur.rv), obj).await {
                Err(StoreError::Conflict) => continue,
                Err(e) => return Err(map_store(rt, name, e)),
                Ok(e) => {
                    self.gc_wakeup.notify_one();
                    return Ok(Output::Stored(e));
                }
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// Removes every object of a deleted CRD.
    async fn after_crd_delete(&self, crd: &Entry) {
        self.rebuild_registry().await;
        let v = crd.value();
        let storage =
            format!("{}/{}", v["spec"]["group"].as_str().unwrap_or_default(), v["spec"]["names"]["plural"].as_str().unwrap_or_default());
        let keys: Vec<(ObjKey, u64)> = {
            let st = self.store.read();
            st.objects.get(storage.as_str()).map(|m| m.values().map(|e| (e.key.clone(), e.rv)).collect()).unwrap_or_default()
        };
        for (k, rv) in keys {
            let _ = self.store.delete(k, Precondition::Revision(rv)).await;
        }
    }

    /// Writes that bypass request handling (garbage collector): store an updated object if unchanged since `cur`.
    pub async fn put_internal(&self, cur: &Arc<Entry>, new: Value) -> Result<Arc<Entry>, StoreError> {
        let deleting = new["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null());
        if deleting && strs(&new["metadata"]["finalizers"]).is_empty() {
            let r = self.store.delete(cur.key.clone(), Precondition::Revision(cur.rv)).await;
            if r.is_ok()
                && &*cur.key.storage == CRDS
                && let Ok(e) = &r
            {
                self.after_crd_delete(e).await;
            }
            return r;
        }
        self.store.put(cur.key.clone(), Precondition::Revision(cur.rv), new).await
    }

    /// Renders a list response body from entries without re-parsing them.
    pub fn list_body(&self, rt: &ResourceType, entries: &[Arc<Entry>], rv: u64, cont: Option<&str>, remaining: Option<u64>) -> Bytes {
        let mut meta = Map::new();
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if let Some(c) = cont {
            meta.insert("continue".into(), json!(c));
        }
        if let Some(r) = remaining {
            meta.insert("remainingItemCount".into(), json!(r));
        }
        let head = format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            rt.list_kind,
            rt.api_version(),
            Value::Object(meta)
        );
        let size: usize = entries.iter().map(|e| e.bytes.len() + 1).sum::<usize>() + head.len() + 2;
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(head.as_bytes());
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&self.render(rt, e));
        }
        out.extend_from_slice(b"]}");
        Bytes::from(out)
    }

    /// Name of the resource as used in messages (`servers.provisioning.dev`).
    pub fn qualified_name(rt: &ResourceType) -> String {
        qualified(rt)
    }
}
