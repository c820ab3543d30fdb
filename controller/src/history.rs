//! History: one `ChangeRecord` per spec generation of a Server, TaskServ or Cluster that the
//! controller carries out — who changed the spec (managedFields), which fields changed, when
//! it started and ended, and how it ended — owned by the object, the last `history_limit`
//! kept per object.
//!
//! Driven from the status write ([`crate::Context::apply_status`], through the
//! [`ChangeHistory`] handle the context holds, whose background writers do the API calls off
//! the reconcile's path, and remember each object's records instead of listing them on every
//! generation): the status is the
//! checkpoint, so its transitions are the change's (a new `observedGeneration` starts a
//! change; `Ready=True` at that generation ends it Succeeded, `Stalled=True` Failed). Record
//! names are deterministic (kind, name, generation, uid), so a restarted controller finds the
//! record it had begun. Records are best effort: a failure to write one is logged and never
//! fails the reconcile.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ManagedFieldsEntry, OwnerReference, Time};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{ChangeRecord, ChangeRecordSpec, ChangeRecordStatus, ChangedObject, LABEL_CHANGE_OF, SpecWriter};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// Kinds whose changes are recorded.
pub const RECORDED_KINDS: &[&str] = &["Server", "TaskServ", "Cluster"];
/// Most spec fields digested per record; a larger spec is digested by subtree beyond this.
const MAX_FIELDS: usize = 256;

/// How a change ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Ready at its generation.
    Succeeded,
    /// Stalled: it cannot be carried out as written (the Stalled message).
    Failed(String),
}

/// What one status write means for the history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transition {
    /// A generation seen for the first time: its change starts.
    pub started: Option<i64>,
    /// The change of this generation ended.
    pub finished: Option<(i64, Outcome)>,
}

fn condition_status<'a>(status: &'a Value, kind: &str) -> Option<&'a str> {
    status.get("conditions")?.as_array()?.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(kind))?.get("status")?.as_str()
}

fn condition_message(status: &Value, kind: &str) -> String {
    let found = status
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(kind)));
    found.and_then(|c| c.get("message")).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// The history transition from the status `before` to `after` (pure).
pub fn transition(before: Option<&Value>, after: &Value) -> Transition {
    let generation = |s: Option<&Value>| s.and_then(|s| s.get("observedGeneration")).and_then(Value::as_i64);
    let Some(now) = generation(Some(after)) else { return Transition::default() };
    let started = generation(before) != Some(now);
    let was = |kind: &str| before.and_then(|b| condition_status(b, kind)) == Some("True");
    let finished = if condition_status(after, "Ready") == Some("True") && (started || !was("Ready")) {
        Some((now, Outcome::Succeeded))
    } else if condition_status(after, "Stalled") == Some("True") && (started || !was("Stalled")) {
        Some((now, Outcome::Failed(condition_message(after, "Stalled"))))
    } else {
        None
    };
    Transition { started: started.then_some(now), finished }
}

/// Longest map key (or list-entry name) written into a path as it is; a longer one is cut and
/// followed by a digest of the whole key (a tenant's free-form config may hold any keys).
const MAX_KEY: usize = 64;
/// Paths this long are not descended further (their subtree is one leaf).
const MAX_PATH: usize = 512;

/// `key` as a path segment: itself when short, else its start and a digest of it.
pub fn path_key(key: &str) -> std::borrow::Cow<'_, str> {
    if key.len() <= MAX_KEY {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut cut = 40;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest: String = Sha256::digest(key.as_bytes()).iter().take(4).map(|b| format!("{b:02x}")).collect();
    std::borrow::Cow::Owned(format!("{}…{digest}", &key[..cut]))
}

/// Salted digests of every leaf of `spec` (path → 16 hex digits). The salt (the object's uid)
/// keeps equal values of different objects apart; values themselves are never stored. At most
/// [`MAX_FIELDS`] leaves: the entries of a map or list past that are one leaf (`path.…`); long
/// keys are shortened ([`path_key`]) and paths stop at [`MAX_PATH`] bytes, so the digests
/// cost a bounded amount whatever the spec holds.
pub fn field_digests(spec: &Value, salt: &str) -> BTreeMap<String, String> {
    let digest = |path: &str, write: &mut dyn FnMut(&mut Sha256)| -> String {
        let mut hasher = Sha256::new();
        hasher.update(salt.as_bytes());
        hasher.update([0]);
        hasher.update(path.as_bytes());
        hasher.update([0]);
        write(&mut hasher);
        hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
    };
    let mut out = BTreeMap::new();
    walk_digests("spec", spec, 0, &mut out, &digest);
    out
}

type LeafDigest<'a> = dyn Fn(&str, &mut dyn FnMut(&mut Sha256)) -> String + 'a;

fn walk_digests(path: &str, value: &Value, depth: usize, out: &mut BTreeMap<String, String>, digest: &LeafDigest<'_>) {
    let deeper = depth < 6 && path.len() < MAX_PATH && out.len() < MAX_FIELDS;
    // The entries from the one that would pass MAX_FIELDS on: one leaf.
    let rest = |out: &mut BTreeMap<String, String>, entries: &mut dyn Iterator<Item = (String, &Value)>| {
        let path = format!("{path}.…");
        let d = digest(&path, &mut |h| {
            for (label, v) in &mut *entries {
                h.update(label.as_bytes());
                h.update([0]);
                h.update(v.to_string().as_bytes());
                h.update([0]);
            }
        });
        out.insert(path, d);
    };
    match value {
        Value::Object(map) if deeper && !map.is_empty() => {
            let mut entries = map.iter().map(|(k, v)| (k.clone(), v));
            while let Some((k, v)) = entries.next() {
                if out.len() + 1 >= MAX_FIELDS {
                    rest(out, &mut std::iter::once((k, v)).chain(entries.by_ref()));
                    return;
                }
                walk_digests(&format!("{path}.{}", path_key(&k)), v, depth + 1, out, digest);
            }
        }
        Value::Array(items) if deeper && !items.is_empty() => {
            // List-map entries are named by their key, so a reorder is not a change.
            let label = |i: usize, v: &Value| {
                ["name", "service", "kind"]
                    .iter()
                    .find_map(|k| v.get(*k).and_then(Value::as_str))
                    .map(|k| path_key(k).into_owned())
                    .unwrap_or_else(|| i.to_string())
            };
            let mut entries = items.iter().enumerate().map(|(i, v)| (label(i, v), v));
            while let Some((l, v)) = entries.next() {
                if out.len() + 1 >= MAX_FIELDS {
                    rest(out, &mut std::iter::once((l, v)).chain(entries.by_ref()));
                    return;
                }
                walk_digests(&format!("{path}[{l}]"), v, depth + 1, out, digest);
            }
        }
        leaf => {
            let d = digest(path, &mut |h| h.update(leaf.to_string().as_bytes()));
            out.insert(path.to_string(), d);
        }
    }
}

/// Paths added, removed or changed between two digest maps, sorted.
pub fn changed_fields(previous: &BTreeMap<String, String>, current: &BTreeMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> = current.iter().filter(|(p, d)| previous.get(*p) != Some(*d)).map(|(p, _)| p.clone()).collect();
    out.extend(previous.keys().filter(|p| !current.contains_key(*p)).cloned());
    out.sort();
    out.dedup();
    out
}

/// The one-line summary of a record.
pub fn summary(previous: Option<i64>, generation: i64, fields: &[String]) -> String {
    match previous {
        None if generation == 1 => "created".into(),
        None => format!("generation {generation} (no earlier record)"),
        Some(_) if fields.is_empty() => "no spec field changed".into(),
        Some(_) => {
            let shown: Vec<&str> = fields.iter().take(4).map(String::as_str).collect();
            let more = fields.len().saturating_sub(shown.len());
            if more > 0 { format!("changed {} (+{more} more)", shown.join(", ")) } else { format!("changed {}", shown.join(", ")) }
        }
    }
}

/// Spec writers from managedFields: those that own one of the `changed` fields (paths such as
/// `spec.plan`) first — managedFields times have whole seconds, so two writers in the same
/// second are told apart by what they own — then the most recent.
pub fn spec_writers(managed_fields: &[ManagedFieldsEntry], changed: &[String]) -> Vec<SpecWriter> {
    // The top-level spec field of each changed path: `spec.pools[a].replicas` → `f:pools`.
    let tops: Vec<String> = changed
        .iter()
        .filter_map(|p| p.strip_prefix("spec."))
        .map(|p| format!("f:{}", p.split(['.', '[']).next().unwrap_or_default()))
        .collect();
    let mut writers: Vec<(bool, SpecWriter)> = managed_fields
        .iter()
        .filter(|m| m.subresource.is_none())
        .filter_map(|m| Some((m, m.fields_v1.as_ref()?.0.get("f:spec")?)))
        .map(|(m, spec)| {
            let owns = tops.iter().any(|t| spec.get(t).is_some());
            let writer = SpecWriter {
                manager: m.manager.clone().unwrap_or_default(),
                operation: m.operation.clone().unwrap_or_default(),
                time: m.time.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
            };
            (owns, writer)
        })
        .collect();
    // RFC 3339 in UTC sorts as text.
    writers.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.time.cmp(&a.1.time)));
    writers.into_iter().map(|(_, w)| w).collect()
}

/// The record name of `kind`/`name` at `generation` (deterministic; the uid's start tells a
/// re-created object's records apart).
pub fn record_name(kind: &str, name: &str, uid: &str, generation: i64) -> String {
    let name: String = name.chars().take(200).collect();
    let uid: String = uid.chars().filter(char::is_ascii_alphanumeric).take(5).collect();
    format!("{}-{name}-g{generation}-{uid}", kind.to_ascii_lowercase())
}

fn record_status(phase: &str, message: Option<String>, now: &str) -> ChangeRecordStatus {
    let (status, reason) = match phase {
        "Succeeded" => ("True", "Succeeded"),
        "InProgress" => ("Unknown", "InProgress"),
        "Superseded" => ("False", "Superseded"),
        _ => ("False", "Failed"),
    };
    let time = k8s_openapi::jiff::Timestamp::now();
    ChangeRecordStatus {
        phase: Some(phase.into()),
        finished_at: (phase != "InProgress").then(|| now.to_string()),
        message: message.clone(),
        observed_generation: Some(1),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.unwrap_or_else(|| phase.to_ascii_lowercase()),
            last_transition_time: Time(time),
            observed_generation: Some(1),
        }],
    }
}

/// The history's handle, held by the context (so history never reaches back into it). A
/// status write hands its transition to a background writer and returns at once: the records
/// are written off the reconcile's path, in order per object (one queue per shard of uids).
#[derive(Clone)]
pub struct ChangeHistory {
    client: Client,
    field_manager: &'static str,
    /// Records kept per object; 0 turns the history off.
    limit: usize,
    /// The writers' queues, started by the first record (they need the runtime).
    queues: Arc<OnceLock<Vec<mpsc::Sender<Job>>>>,
    /// Bytes the queued jobs hold (about), against [`QUEUE_BYTES`].
    queued: Arc<AtomicUsize>,
}

/// Background writers; one object's records always go through the same one.
const WRITERS: usize = 16;
/// Transitions waiting per writer; past this they are dropped (history only).
const QUEUE: usize = 4096;
/// What queued jobs may hold together, all writers (about; digests, writers, plans).
const QUEUE_BYTES: usize = 32 << 20;
/// What one writer may remember of records (about) before it forgets them all.
const KNOWN_BYTES: usize = 4 << 20;
/// Spec writers a record names at most (the newest).
const SPEC_WRITERS: usize = 16;
/// Objects whose records a writer remembers; past this it forgets them all (an object it no
/// longer knows costs one label-selected list, answered from the API server's label index).
const REMEMBERED: usize = 100_000;

/// One status write whose transition is to be recorded: what the record needs, taken when the
/// write was made (never the object itself, whose live version a tenant can make large).
struct Job {
    kind: String,
    name: String,
    namespace: String,
    uid: String,
    /// Digests of the spec the status was written for (the cached copy's).
    digests: BTreeMap<String, String>,
    /// The object's managedFields as the write answered them, slim ([`crate::slim`]).
    managed_fields: Vec<ManagedFieldsEntry>,
    /// Who made the spec generation (the server-owned annotation), if recorded.
    changed_by_user: Option<String>,
    /// The status's plan, if any, as its JSON text (what it holds is counted exactly).
    plan: Option<String>,
    transition: Transition,
    /// Whether the object had a status before this write (else it can have no records yet).
    had_status: bool,
}

/// Only the newest record's digests are ever compared (with the next generation's): the
/// others' are dropped.
fn forget_older_digests(history: &mut [Known]) {
    if let Some((_, older)) = history.split_last_mut() {
        for k in older {
            k.digests = BTreeMap::new();
        }
    }
}

impl Known {
    fn bytes(&self) -> usize {
        self.name.len() + 64 + self.digests.iter().map(|(p, d)| p.len() + d.len() + 64).sum::<usize>()
    }
}

impl Job {
    /// About what the job holds, for the queues' byte budget.
    fn bytes(&self) -> usize {
        let digests: usize = self.digests.iter().map(|(p, d)| p.len() + d.len() + 64).sum();
        let writers: usize = self.managed_fields.iter().map(|m| 256 + m.fields_v1.as_ref().map_or(0, |f| f.0.to_string().len())).sum();
        let plan = self.plan.as_ref().map_or(0, String::len);
        1024 + self.name.len() + digests + writers + plan
    }
}

/// What a writer knows of one record it wrote or listed.
#[derive(Clone, Debug)]
struct Known {
    name: String,
    generation: i64,
    phase: Option<String>,
    digests: BTreeMap<String, String>,
}

impl ChangeHistory {
    /// A history writing with `client` under `field_manager`, keeping `limit` records per
    /// object (0: off).
    pub fn new(client: Client, field_manager: &'static str, limit: usize) -> Self {
        ChangeHistory { client, field_manager, limit, queues: Arc::default(), queued: Arc::default() }
    }

    /// Whether changes of `kind` are recorded (history on, a recorded kind): the caller skips
    /// preparing the previous status otherwise.
    pub fn recorded(&self, kind: &str) -> bool {
        self.limit > 0 && RECORDED_KINDS.contains(&kind)
    }

    /// Called after a status write (`written`, the write's slim answer) for the object whose
    /// spec is `spec` (the copy the status was made for): queues what the transition from
    /// `before` to `after` means for the background writer. Never fails and never waits for
    /// the API; a writer far behind (its queue full) drops the transition with a warning
    /// (history only).
    pub fn after_status_write(
        &self,
        kind: &str,
        spec: impl FnOnce() -> Value,
        written: &crate::slim::Slim,
        before: Option<&Value>,
        after: &Value,
    ) {
        if !self.recorded(kind) {
            return;
        }
        let Some(job) = job_of(kind, spec, written, before, after) else { return };
        let queues = self.queues.get_or_init(|| {
            (0..WRITERS)
                .map(|_| {
                    let (tx, rx) = mpsc::channel(QUEUE);
                    tokio::spawn(self.clone().write_loop(rx));
                    tx
                })
                .collect()
        });
        let shard = job.uid.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize)) % queues.len().max(1);
        // Queued jobs together hold at most QUEUE_BYTES (a tenant's spec shapes their digests).
        let bytes = job.bytes();
        if self.queued.fetch_add(bytes, Ordering::SeqCst) + bytes > QUEUE_BYTES {
            self.queued.fetch_sub(bytes, Ordering::SeqCst);
            tracing::warn!(kind, object = %job.name, "the ChangeRecord writers are behind; this transition is not recorded (history only; the object is unaffected)");
            return;
        }
        if let Some(q) = queues.get(shard) {
            match q.try_send(job) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(job)) => {
                    self.queued.fetch_sub(bytes, Ordering::SeqCst);
                    tracing::warn!(kind, object = %job.name, "the ChangeRecord writer is behind; this transition is not recorded (history only; the object is unaffected)");
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.queued.fetch_sub(bytes, Ordering::SeqCst);
                    tracing::warn!(kind, "the ChangeRecord writer has stopped (history only; the object is unaffected)");
                }
            }
        }
    }

    /// One writer: takes jobs in order and writes their records, remembering per object uid
    /// the records it knows so that only an object it never saw costs a list.
    async fn write_loop(self, mut rx: mpsc::Receiver<Job>) {
        let mut known: HashMap<String, Vec<Known>> = HashMap::new();
        // An upper bound of what `known` holds (each job adds its object's records again).
        let mut known_bytes = 0usize;
        while let Some(job) = rx.recv().await {
            if known.len() >= REMEMBERED || known_bytes > KNOWN_BYTES {
                known.clear();
                known_bytes = 0;
            }
            if let Err(e) = self.record(&job, &mut known).await {
                // The next transition lists again rather than trust what may be half written.
                known.remove(&job.uid);
                tracing::warn!(kind = %job.kind, object = %job.name, error = %e, "could not write the ChangeRecord (history only; the object is unaffected)");
            }
            known_bytes += known.get(&job.uid).map_or(0, |h| h.iter().map(Known::bytes).sum());
            self.queued.fetch_sub(job.bytes(), Ordering::SeqCst);
        }
    }

    async fn record(&self, job: &Job, known: &mut HashMap<String, Vec<Known>>) -> Result<(), kube::Error> {
        let api: Api<ChangeRecord> = Api::namespaced(self.client.clone(), &job.namespace);
        let now = crate::time::now_seconds().to_string();
        let change = Change { job, now: &now };
        let finished = job.transition.finished.as_ref().map(|(generation, outcome)| {
            let status = match outcome {
                Outcome::Succeeded => record_status("Succeeded", None, &now),
                Outcome::Failed(message) => record_status("Failed", Some(message.clone()), &now),
            };
            (*generation, status)
        });
        let mut history = match known.remove(&job.uid) {
            Some(h) => h,
            // No status before this write: the object cannot have records yet.
            None if !job.had_status => vec![],
            None => self.list(&api, &job.uid).await?,
        };
        if let Some(generation) = job.transition.started {
            // A change that starts and ends in one write is created with its end status.
            let end = finished.as_ref().filter(|(g, _)| *g == generation).map(|(_, s)| s);
            self.start(&api, &change, generation, &mut history, end).await?;
        }
        if let Some((generation, status)) = &finished {
            let name = record_name(&job.kind, &job.name, &job.uid, *generation);
            let done = history.iter().any(|k| k.generation == *generation && k.phase.as_deref() == status.phase.as_deref());
            if !done {
                match self.patch_status(&api, &name, status).await {
                    // The record of a generation whose start this controller never saw
                    // (history turned on later): begin it now, ended.
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        history = self.list(&api, &job.uid).await?;
                        self.start(&api, &change, *generation, &mut history, Some(status)).await?;
                    }
                    other => other?,
                }
                for k in history.iter_mut().filter(|k| k.generation == *generation) {
                    k.phase.clone_from(&status.phase);
                }
            }
        }
        forget_older_digests(&mut history);
        known.insert(job.uid.clone(), history);
        Ok(())
    }

    /// The records of object `uid`, oldest generation first (a label-selected list).
    async fn list(&self, api: &Api<ChangeRecord>, uid: &str) -> Result<Vec<Known>, kube::Error> {
        let mut records: Vec<Known> = api
            .list(&ListParams::default().labels(&format!("{LABEL_CHANGE_OF}={uid}")))
            .await?
            .items
            .into_iter()
            .map(|r| Known {
                name: r.name_any(),
                generation: r.spec.generation,
                phase: r.status.and_then(|s| s.phase),
                digests: r.spec.field_digests,
            })
            .collect();
        records.sort_by_key(|r| r.generation);
        forget_older_digests(&mut records);
        Ok(records)
    }

    async fn patch_status(&self, api: &Api<ChangeRecord>, name: &str, status: &ChangeRecordStatus) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "apiVersion": "provisioning.dev/v1alpha1",
            "kind": "ChangeRecord",
            "metadata": {"name": name},
            "status": status,
        });
        api.patch_status(name, &PatchParams::apply(self.field_manager).force(), &Patch::Apply(&patch)).await.map(drop)
    }

    /// Begins the record of `generation` (unless it exists) with the status `end` (or
    /// InProgress), supersedes older records still in progress and keeps the newest `limit`;
    /// `history` (the object's records, oldest first) follows what was written.
    async fn start(
        &self,
        api: &Api<ChangeRecord>,
        change: &Change<'_>,
        generation: i64,
        history: &mut Vec<Known>,
        end: Option<&ChangeRecordStatus>,
    ) -> Result<(), kube::Error> {
        let Change { job, now } = *change;
        let (kind, uid) = (job.kind.as_str(), job.uid.as_str());
        let name = record_name(kind, &job.name, uid, generation);
        if history.iter().any(|r| r.generation == generation) {
            return Ok(());
        }
        let previous = history.iter().rev().find(|r| r.generation < generation);
        let record = new_record(change, &name, generation, previous.map(|p| (p.generation, &p.digests)));
        let digests = record.spec.field_digests.clone();
        match api.create(&PostParams { field_manager: Some(self.field_manager.into()), ..Default::default() }, &record).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Written before (by an earlier run of this controller): read what is there.
                *history = self.list(api, uid).await?;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let status = end.cloned().unwrap_or_else(|| record_status("InProgress", None, now));
        self.patch_status(api, &name, &status).await?;
        // Older changes still in progress never finished: a newer generation took over.
        for older in history.iter_mut().filter(|r| r.phase.as_deref() == Some("InProgress")) {
            let message = format!("superseded by generation {generation} before it finished");
            self.patch_status(api, &older.name, &record_status("Superseded", Some(message), now)).await?;
            older.phase = Some("Superseded".into());
        }
        // Keep the newest `limit` (this one included).
        let keep = self.limit.saturating_sub(1);
        let excess = history.len().saturating_sub(keep);
        for old in history.drain(..excess) {
            match api.delete(&old.name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        history.push(Known { name, generation, phase: status.phase.clone(), digests });
        Ok(())
    }
}

/// The job of one status write (pure): `None` when the transition means nothing for the history.
fn job_of(kind: &str, spec: impl FnOnce() -> Value, written: &crate::slim::Slim, before: Option<&Value>, after: &Value) -> Option<Job> {
    let transition = transition(before, after);
    if transition == Transition::default() {
        return None;
    }
    let meta = written.meta();
    let (Some(namespace), Some(uid), Some(name)) = (meta.namespace, meta.uid, meta.name) else { return None };
    let had_status = before.and_then(|b| b.get("observedGeneration")).is_some_and(|g| !g.is_null());
    let mut managed_fields = meta.managed_fields.unwrap_or_default();
    let changed_by_user =
        crate::approval::server_stamped(meta.annotations.as_ref(), &managed_fields, crate::approval::ANNOTATION_CHANGED_BY);
    // Only spec writers matter to the record, the newest SPEC_WRITERS of them (a client can
    // write managedFields: their number is not bounded otherwise).
    managed_fields.retain(|m| m.subresource.is_none() && m.fields_v1.as_ref().is_some_and(|f| f.0.get("f:spec").is_some()));
    managed_fields.sort_by(|a, b| b.time.as_ref().map(|t| t.0).cmp(&a.time.as_ref().map(|t| t.0)));
    managed_fields.truncate(SPEC_WRITERS);
    // Of each, only the spec's own top-level fields (a client-written entry may name others).
    let spec = spec();
    let tops: std::collections::BTreeSet<String> =
        spec.as_object().map(|m| m.keys().map(|k| format!("f:{k}")).collect()).unwrap_or_default();
    for entry in &mut managed_fields {
        if let Some(owned) = entry.fields_v1.as_mut().and_then(|f| f.0.get_mut("f:spec")).and_then(Value::as_object_mut) {
            owned.retain(|k, _| tops.contains(k));
        }
        entry.manager = entry.manager.take().map(|m| m.chars().take(128).collect());
    }
    Some(Job {
        kind: kind.to_string(),
        digests: field_digests(&spec, &uid),
        name,
        namespace,
        uid,
        managed_fields,
        changed_by_user,
        plan: after.get("plan").filter(|p| !p.is_null()).map(Value::to_string),
        transition,
        had_status,
    })
}

/// The object whose change is being recorded, as one status write saw it.
#[derive(Clone, Copy)]
struct Change<'a> {
    job: &'a Job,
    now: &'a str,
}

/// The record of `change` at `generation`, its fields compared with the `previous` record's
/// (generation, field digests) (pure).
fn new_record(change: &Change<'_>, name: &str, generation: i64, previous: Option<(i64, &BTreeMap<String, String>)>) -> ChangeRecord {
    let Change { job, now } = *change;
    let (kind, uid) = (job.kind.as_str(), job.uid.as_str());
    let object_name = job.name.clone();
    let digests = job.digests.clone();
    let fields = previous.map(|(_, p)| changed_fields(p, &digests)).unwrap_or_default();
    let mut record = ChangeRecord::new(
        name,
        ChangeRecordSpec {
            object: ChangedObject { kind: kind.into(), name: object_name.clone(), uid: uid.into() },
            generation,
            previous_generation: previous.map(|(g, _)| g),
            changed_by: spec_writers(&job.managed_fields, &fields),
            changed_by_user: job.changed_by_user.clone(),
            summary: summary(previous.map(|(g, _)| g), generation, &fields),
            changed_fields: fields,
            field_digests: digests,
            plan: job.plan.as_deref().and_then(|p| serde_json::from_str(p).ok()),
            started_at: now.into(),
            approvals: Vec::new(),
        },
    );
    record.metadata.namespace = Some(job.namespace.clone());
    record.metadata.labels = Some([(LABEL_CHANGE_OF.to_string(), uid.to_string())].into());
    record.metadata.owner_references = Some(vec![OwnerReference {
        api_version: provisioning_crds::API_VERSION.into(),
        kind: kind.into(),
        name: object_name,
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(generation: i64, ready: &str, stalled: &str) -> Value {
        json!({"observedGeneration": generation, "conditions": [
            {"type": "Ready", "status": ready}, {"type": "Stalled", "status": stalled, "message": "bad plan"}]})
    }

    #[test]
    fn transitions_follow_observed_generation_and_ready() {
        // First visit: generation 1 seen, conditions Unknown.
        let t = transition(None, &status(1, "Unknown", "Unknown"));
        assert_eq!(t, Transition { started: Some(1), finished: None });
        // Work goes on: nothing new.
        assert_eq!(transition(Some(&status(1, "Unknown", "Unknown")), &status(1, "False", "False")), Transition::default());
        // Ready at that generation: it ends, once.
        let t = transition(Some(&status(1, "False", "False")), &status(1, "True", "False"));
        assert_eq!(t.finished, Some((1, Outcome::Succeeded)));
        assert_eq!(transition(Some(&status(1, "True", "False")), &status(1, "True", "False")), Transition::default());
        // A no-op spec change: starts and ends in one write.
        let t = transition(Some(&status(1, "True", "False")), &status(2, "True", "False"));
        assert_eq!(t, Transition { started: Some(2), finished: Some((2, Outcome::Succeeded)) });
        // A spec change that cannot be carried out.
        let t = transition(Some(&status(2, "True", "False")), &status(3, "False", "True"));
        assert_eq!(t, Transition { started: Some(3), finished: Some((3, Outcome::Failed("bad plan".into()))) });
        // No observedGeneration: nothing to record.
        assert_eq!(transition(None, &json!({"phase": "Pending"})), Transition::default());
    }

    #[test]
    fn digests_cost_a_bounded_amount_whatever_the_spec_holds() {
        // A 512 KiB key over 5,000 leaves: each path would repeat the key.
        let long = "k".repeat(512 << 10);
        let wide: serde_json::Map<String, Value> = (0..5000).map(|i| (format!("a{i}"), json!(0))).collect();
        let spec = json!({"config": {long.clone(): Value::Object(wide)}});
        let digests = field_digests(&spec, "u");
        assert!(digests.len() <= MAX_FIELDS, "{}", digests.len());
        let bytes: usize = digests.keys().map(String::len).sum();
        assert!(bytes < MAX_FIELDS * (MAX_PATH + 64), "{bytes} bytes of paths");
        assert!(digests.keys().all(|p| !p.contains(&long[..100])), "the long key is shortened");
        // A change past the limit still shows (in the leaf that holds the rest).
        let mut changed = spec.clone();
        changed["config"][&long]["a4999"] = json!(1);
        assert_eq!(changed_fields(&digests, &field_digests(&changed, "u")).len(), 1);
        // An ordinary spec: one digest per leaf, as before.
        assert_eq!(field_digests(&json!({"plan": "small", "image": "debian-12"}), "u").len(), 2);
    }

    #[test]
    fn changed_fields_name_paths_never_values() {
        let before = field_digests(&json!({"plan": "small", "image": "debian-12", "config": {"password": "hunter2"}}), "uid-1");
        let after = field_digests(&json!({"plan": "medium", "image": "debian-12", "config": {"password": "s3cret!"}}), "uid-1");
        assert_eq!(changed_fields(&before, &after), vec!["spec.config.password", "spec.plan"]);
        let text = serde_json::to_string(&after).expect("json");
        assert!(!text.contains("s3cret") && !text.contains("medium"), "{text}");
        // Another object with the same spec gets other digests (salted by uid).
        assert_ne!(field_digests(&json!({"plan": "medium"}), "uid-2")["spec.plan"], after["spec.plan"]);
        // List-map entries are keyed by name: a reorder is not a change, a replica count is.
        let a = field_digests(&json!({"pools": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 2}]}), "u");
        let b = field_digests(&json!({"pools": [{"name": "b", "replicas": 2}, {"name": "a", "replicas": 3}]}), "u");
        assert_eq!(changed_fields(&a, &b), vec!["spec.pools[a].replicas"]);
        // Removed fields count too.
        let c = field_digests(&json!({"plan": "small"}), "u");
        let d = field_digests(&json!({"plan": "small", "zone": "fi-hel1"}), "u");
        assert_eq!(changed_fields(&d, &c), vec!["spec.zone"]);
    }

    #[test]
    fn summaries_and_names() {
        assert_eq!(summary(None, 1, &[]), "created");
        assert_eq!(summary(None, 4, &[]), "generation 4 (no earlier record)");
        let many: Vec<String> = (0..6).map(|i| format!("spec.f{i}")).collect();
        assert_eq!(summary(Some(1), 2, &many), "changed spec.f0, spec.f1, spec.f2, spec.f3 (+2 more)");
        assert_eq!(record_name("TaskServ", "redis", "3f2a9c1e-0000", 7), "taskserv-redis-g7-3f2a9");
    }

    #[test]
    fn spec_writers_come_from_managed_fields_newest_first() {
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "web-0", "managedFields": [
            {"manager": "kubectl-client-side-apply", "operation": "Update", "time": "2026-11-25T06:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:plan": {}}}},
            {"manager": "provisioning-controller", "operation": "Apply", "time": "2026-11-25T07:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}, "subresource": "status"},
            {"manager": "kubectl-edit", "operation": "Update", "time": "2026-11-25T06:30:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:image": {}}}}
        ]}}))
        .expect("object");
        let managers = |changed: &[&str]| -> Vec<String> {
            let changed: Vec<String> = changed.iter().map(|c| c.to_string()).collect();
            spec_writers(obj.metadata.managed_fields.as_deref().unwrap_or_default(), &changed).into_iter().map(|w| w.manager).collect()
        };
        assert_eq!(managers(&[]), vec!["kubectl-edit", "kubectl-client-side-apply"], "newest first");
        // The owner of the changed field comes first, whatever the times say.
        assert_eq!(managers(&["spec.plan"]), vec!["kubectl-client-side-apply", "kubectl-edit"]);
        assert_eq!(managers(&["spec.image"]), vec!["kubectl-edit", "kubectl-client-side-apply"]);
    }

    #[test]
    fn the_record_names_the_authenticated_user_the_api_server_recorded() -> Result<(), serde_json::Error> {
        let object = |managed: Value| -> Result<crate::slim::Slim, serde_json::Error> {
            serde_json::from_value(json!({
                "apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
                "metadata": {"name": "web-0", "namespace": "a", "uid": "u1", "generation": 2,
                    "annotations": {"provisioning.dev/changed-by": "system:serviceaccount:a:alice"},
                    "managedFields": managed},
                "spec": {"plan": "small"}}))
        };
        let record = |obj: &crate::slim::Slim| {
            let after = json!({"observedGeneration": 2});
            let job = job_of("Server", || json!({"plan": "small"}), obj, None, &after)?;
            let change = Change { job: &job, now: "2026-11-26T00:00:00Z" };
            new_record(&change, "server-web-0-g2-u1", 2, None).spec.changed_by_user
        };
        // Stamped by the API server (no field manager owns it): the user of the write.
        let stamped = object(json!([{"manager": "kubectl-edit", "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:plan": {}}}}]))?;
        assert_eq!(record(&stamped).as_deref(), Some("system:serviceaccount:a:alice"));
        // Written by a client (an API server that does not stamp it): not trusted.
        let forged = object(json!([{"manager": "mallory", "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:provisioning.dev/changed-by": {}}}}}]))?;
        assert_eq!(record(&forged), None);
        Ok(())
    }
}
