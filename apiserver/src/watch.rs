//! Watch streams: initial state, history replay from a resourceVersion, live events,
//! bookmarks, timeouts and 410 Expired.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use crate::handlers::Core;
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::storage::{Entry, EventType};
use crate::{list_body, table};
use provisioning_yaml::bounded::{DecodeBudget, LIMIT_PER_BYTE, Meter};

/// Objects larger than this are shaped (Table row, partial metadata) on a blocking thread.
const BLOCKING_ABOVE: usize = 64 * 1024;

/// How often a bookmark is sent to watchers that allow them.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// Parameters of one watch request.
pub struct WatchParams {
    /// `resourceVersion` (None or "0": start with the current state).
    pub resource_version: Option<String>,
    /// Namespace to watch, None for all.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// `sendInitialEvents`.
    pub send_initial_events: bool,
    /// Table output with this includeObject policy.
    pub table: Option<String>,
    /// `PartialObjectMetadata` output (metadata-only watches: kube-rs `Api<PartialObjectMeta<K>>`).
    pub partial: bool,
    /// The flow of the watching identity (None: exempt): its events' queued bytes and the
    /// decoding of large objects it needs shaped are charged to that flow's shares.
    pub flow: Option<String>,
}

/// Bytes queued for one watcher and not yet taken by its connection, with a wake-up for the
/// producer when the reader catches up.
struct Backlog {
    bytes: AtomicUsize,
    drained: Notify,
    /// The shared budget the queued bytes are charged to, and the flow (None: not charged).
    charged: Option<(Arc<DecodeBudget>, String)>,
}

impl Backlog {
    fn taken(&self, len: usize) {
        self.bytes.fetch_sub(len, Ordering::SeqCst);
        if let Some((budget, flow)) = &self.charged {
            budget.release(len, Some(flow));
        }
        self.drained.notify_one();
    }
}

impl Drop for Backlog {
    fn drop(&mut self) {
        // Lines queued but never taken (the client went away): given back.
        if let Some((budget, flow)) = &self.charged {
            budget.release(*self.bytes.get_mut(), Some(flow));
        }
    }
}

/// The receiving end of a watch: JSON lines until the watch ends.
pub struct WatchStream {
    rx: mpsc::Receiver<Bytes>,
    backlog: Arc<Backlog>,
}

impl WatchStream {
    /// The next line, None when the watch ended.
    pub async fn next(&mut self) -> Option<Bytes> {
        let b = self.rx.recv().await?;
        self.backlog.taken(b.len());
        Some(b)
    }
}

struct Emitter {
    core: Arc<Core>,
    rt: Arc<ResourceType>,
    tx: mpsc::Sender<Bytes>,
    backlog: Arc<Backlog>,
    table: Option<String>,
    partial: bool,
    sent_headers: bool,
    flow: Option<String>,
}

impl Emitter {
    /// Queues a line; false when the watch must end: the client went away, or it stopped
    /// reading (its backlog stayed over the byte bound or the queue stayed full for the
    /// slow-reader timeout), in which case it is dropped like kube-apiserver drops a watcher
    /// whose buffer is full, and the client re-lists.
    async fn send_raw(&self, line: Vec<u8>) -> bool {
        let deadline = tokio::time::Instant::now() + self.core.limits.slow_reader_timeout;
        let len = line.len();
        self.room(len, deadline).await && self.push(vec![Bytes::from(line)], len, deadline).await
    }

    /// Waits until `len` more bytes fit this watcher's buffer and its flow's share of all
    /// watchers' buffers, and counts them queued; false (the watch ends) when they did not fit
    /// by `deadline`.
    async fn room(&self, len: usize, deadline: tokio::time::Instant) -> bool {
        let limits = &self.core.limits;
        loop {
            let queued = self.backlog.bytes.load(Ordering::SeqCst);
            // Within this watcher's buffer, and the flow's share of all watchers' buffers.
            let fits = queued == 0 || queued + len <= limits.watch_buffer_bytes;
            if fits && self.backlog.charged.as_ref().is_none_or(|(budget, flow)| budget.reserve(len, Some(flow))) {
                self.backlog.bytes.fetch_add(len, Ordering::SeqCst);
                return true;
            }
            // Another watcher's reader may free the shared budget: look again shortly.
            let drained = self.backlog.drained.notified();
            let retry = (tokio::time::Instant::now() + Duration::from_millis(100)).min(deadline);
            if tokio::time::timeout_at(retry, drained).await.is_err() && tokio::time::Instant::now() >= deadline {
                tracing::info!(resource = %self.rt.plural, queued, "dropping a watch whose client stopped reading (or whose flow's watch buffers are full)");
                return false;
            }
        }
    }

    /// Sends the parts of one line (`len` bytes in all, already counted by [`Emitter::room`]).
    async fn push(&self, parts: Vec<Bytes>, len: usize, deadline: tokio::time::Instant) -> bool {
        let mut left = len;
        for part in parts {
            let n = part.len();
            match tokio::time::timeout_at(deadline, self.tx.send(part)).await {
                Ok(Ok(())) => left -= n,
                failed => {
                    self.backlog.taken(left);
                    if failed.is_err() {
                        tracing::info!(resource = %self.rt.plural, "dropping a watch whose client stopped reading");
                    }
                    return false;
                }
            }
        }
        true
    }

    /// One event. The object is sent as stored (shared, never copied per watcher), or shaped
    /// (Table row, partial metadata, another version) after room for it was counted.
    async fn send(&mut self, kind: &str, e: &Entry) -> bool {
        let deadline = tokio::time::Instant::now() + self.core.limits.slow_reader_timeout;
        let prefix = Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":"));
        let suffix = Bytes::from_static(b"}\n");
        if self.table.is_none() && !self.partial && e.api_version == self.rt.api_version() {
            let object = e.bytes.clone();
            let len = prefix.len() + object.len() + suffix.len();
            return self.room(len, deadline).await && self.push(vec![prefix, object, suffix], len, deadline).await;
        }
        // Room for about the stored size first (nothing is built before it is counted), then
        // the difference once the shape's size is known.
        let estimate = prefix.len() + e.bytes.len() + suffix.len() + 4096;
        if !self.room(estimate, deadline).await {
            return false;
        }
        let headers = !self.sent_headers;
        self.sent_headers |= self.table.is_some();
        let (core, rt, table, partial, bytes, rv) =
            (self.core.clone(), self.rt.clone(), self.table.clone(), self.partial, e.bytes.clone(), e.rv);
        // A Table row, partial metadata, or the object converted to the watched version.
        let shaped = move || match table {
            Some(inc) => {
                let obj = core.convert(&rt, serde_json::from_slice(&bytes).unwrap_or_default());
                serde_json::to_vec(&table::table(&rt, vec![obj], Some(rv.to_string()), None, &inc, headers)).unwrap_or_default()
            }
            None if partial => serde_json::to_vec(&list_body::partial_object(&bytes)).unwrap_or_default(),
            None => serde_json::to_vec(&core.convert(&rt, serde_json::from_slice(&bytes).unwrap_or_default())).unwrap_or_default(),
        };
        // A large object is decoded on a blocking thread, not on the async worker that
        // serves every other request, and its decoding is charged to the watcher's flow
        // (the watch waits for room, and is dropped like a slow reader without it).
        let out = if e.bytes.len() > BLOCKING_ABOVE {
            let Some(charged) = self.decode_room(e.bytes.len()).await else {
                self.backlog.taken(estimate);
                return false;
            };
            match tokio::task::spawn_blocking(move || {
                let _charged = charged;
                shaped()
            })
            .await
            {
                Ok(out) => out,
                Err(_) => {
                    self.backlog.taken(estimate);
                    return false;
                }
            }
        } else {
            shaped()
        };
        let len = prefix.len() + out.len() + suffix.len();
        if len > estimate {
            if !self.room(len - estimate, deadline).await {
                self.backlog.taken(estimate);
                return false;
            }
        } else {
            self.backlog.taken(estimate - len);
        }
        self.push(vec![prefix, Bytes::from(out), suffix], len, deadline).await
    }

    /// A meter holding room to decode an object of `len` stored bytes, from the flow's share
    /// of the decode budget (an unshared one for an exempt watcher); None when no room came
    /// within the slow-reader timeout.
    async fn decode_room(&self, len: usize) -> Option<Arc<Meter>> {
        let Some(flow) = &self.flow else { return Some(Arc::default()) };
        let deadline = tokio::time::Instant::now() + self.core.limits.slow_reader_timeout;
        loop {
            let meter = self.core.meter(Some(flow.clone()))?;
            if meter.reserve(len.saturating_mul(LIMIT_PER_BYTE)).is_ok() {
                return Some(meter);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(resource = %self.rt.plural, %flow, "dropping a watch: no decode budget to shape a large object for it");
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn bookmark(&self, rv: u64, initial_end: bool) -> bool {
        let mut md = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": md});
        let ev = json!({"type": "BOOKMARK", "object": obj});
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        self.send_raw(line).await
    }

    async fn expired(&self, rv: &str) -> bool {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv}"), "reason": "Expired", "code": 410});
        let mut line = serde_json::to_vec(&json!({"type": "ERROR", "object": status})).unwrap_or_default();
        line.push(b'\n');
        self.send_raw(line).await
    }
}

/// One change replayed to a watcher: type, the object after, the object before.
type Change = (EventType, Arc<Entry>, Option<Arc<Entry>>);

fn matches(p: &WatchParams, e: &Entry) -> bool {
    if let Some(ns) = &p.namespace
        && &e.key.namespace != ns
    {
        return false;
    }
    p.fields.matches(&e.key.namespace, &e.key.name, &e.fields) && p.labels.matches(&e.labels)
}

/// Starts a watch; lines of JSON arrive on the returned receiver until it ends.
pub fn start(core: Arc<Core>, rt: Arc<ResourceType>, p: WatchParams) -> WatchStream {
    let (tx, rx) = mpsc::channel(256);
    let charged = p.flow.clone().map(|f| (core.watch_buffers.clone(), f));
    let backlog = Arc::new(Backlog { bytes: AtomicUsize::new(0), drained: Notify::new(), charged });
    let em_backlog = backlog.clone();
    tokio::spawn(async move {
        let mut em = Emitter {
            core: core.clone(),
            rt: rt.clone(),
            tx,
            backlog: em_backlog,
            table: p.table.clone(),
            partial: p.partial,
            sent_headers: false,
            flow: p.flow.clone(),
        };
        run(&mut em, p).await;
    });
    WatchStream { rx, backlog }
}

/// The watch loop: the initial events, then a select over its sources — new revisions in the
/// store, bookmarks, the timeout, shutdown and a reader gone away.
async fn run(em: &mut Emitter, p: WatchParams) {
    let mut rv_rx = em.core.store.subscribe();
    let Some(mut last) = initial_events(em, &p).await else { return };
    let deadline = p.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut next_bookmark = tokio::time::Instant::now() + BOOKMARK_INTERVAL;
    loop {
        // Replay everything after `last`.
        let Some((events, head)) = changes_after(em, last) else {
            em.expired(&last.to_string()).await;
            return;
        };
        for (kind, e, prev) in events {
            if let Some(k) = event_type(&p, kind, &e, prev.as_deref())
                && !em.send(k, &e).await
            {
                return;
            }
        }
        last = head.max(last);
        let sleep_until = match deadline {
            Some(d) if p.bookmarks => d.min(next_bookmark),
            Some(d) => d,
            None if p.bookmarks => next_bookmark,
            None => tokio::time::Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            changed = rv_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(sleep_until) => {
                let now = tokio::time::Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return;
                }
                if p.bookmarks && now >= next_bookmark {
                    if !em.bookmark(last, false).await {
                        return;
                    }
                    next_bookmark = now + BOOKMARK_INTERVAL;
                }
            }
            _ = em.core.shutdown.cancelled() => return,
            _ = em.tx.closed() => return,
        }
    }
}

/// Where the watch starts: the current objects as ADDED events (when no revision was asked
/// for, or with sendInitialEvents, then a bookmark saying so), else nothing from the requested
/// revision. Returns the revision to replay after; None when the watch ended (a revision that
/// is malformed or older than the history: 410 Expired; or the reader gone).
async fn initial_events(em: &mut Emitter, p: &WatchParams) -> Option<u64> {
    let storage = em.rt.storage.clone();
    let requested: Option<u64> = p.resource_version.as_deref().filter(|s| !s.is_empty() && *s != "0").and_then(|s| s.parse().ok());
    let bad_rv = p.resource_version.as_deref().is_some_and(|s| !s.is_empty() && s != "0" && s.parse::<u64>().is_err());
    if bad_rv {
        em.expired(p.resource_version.as_deref().unwrap_or_default()).await;
        return None;
    }
    let initial_state = requested.is_none() || p.send_initial_events;
    let start: Result<(Vec<Arc<Entry>>, u64), u64> = {
        let st = em.core.store.read();
        match requested {
            Some(r) if !p.send_initial_events && r < st.history_floor => Err(r),
            _ if initial_state => {
                let mut scanned = 0u64;
                let items: Vec<Arc<Entry>> = st
                    .candidates(storage.as_str(), p.namespace.as_deref(), &p.labels, None)
                    .inspect(|_| scanned += 1)
                    .filter(|e| matches(p, e))
                    .cloned()
                    .collect();
                em.core.stats.scan("watch", &em.rt.plural, !p.labels.is_empty(), scanned, items.len() as u64);
                Ok((items, st.rv))
            }
            _ => Ok((vec![], requested.unwrap_or(st.rv))),
        }
    };
    let (initial, last) = match start {
        Ok(x) => x,
        Err(r) => {
            em.expired(&r.to_string()).await;
            return None;
        }
    };
    for e in &initial {
        if !em.send("ADDED", e).await {
            return None;
        }
    }
    drop(initial);
    if p.send_initial_events && p.bookmarks && !em.bookmark(last, true).await {
        return None;
    }
    Some(last)
}

/// The store's changes of this watch's resource after `last`, and the store's revision; None
/// when `last` is older than the history kept (the watcher must re-list).
fn changes_after(em: &Emitter, last: u64) -> Option<(Vec<Change>, u64)> {
    let storage = em.rt.storage.as_str();
    let st = em.core.store.read();
    let it = st.events_after(last)?;
    let out = it.filter(|ev| &*ev.entry.key.storage == storage).map(|ev| (ev.kind, ev.entry.clone(), ev.prev.clone())).collect();
    Some((out, st.rv))
}

/// What a change is to this watcher, given its selectors: an object that starts matching is
/// ADDED, one that stops matching DELETED; None when the watcher does not see it.
fn event_type(p: &WatchParams, kind: EventType, e: &Entry, prev: Option<&Entry>) -> Option<&'static str> {
    let now_match = matches(p, e);
    let was_match = prev.is_some_and(|pe| matches(p, pe));
    match kind {
        EventType::Deleted if now_match => Some("DELETED"),
        EventType::Deleted => None,
        EventType::Added if now_match => Some("ADDED"),
        EventType::Added => None,
        EventType::Modified => match (was_match || prev.is_none(), now_match) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) if prev.is_some() => Some("DELETED"),
            _ => None,
        },
    }
}

/// Serializes a value as a single watch line (used for errors before the stream starts).
pub fn line(kind: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// kube-apiserver's `ValidateListOptions` (apimachinery `pkg/apis/meta/internalversion/validation`):
/// the watch-list parameters (`sendInitialEvents`, `resourceVersionMatch`) in a combination
/// it refuses get the same 422, so a client never mistakes an ignored parameter for support.
pub fn validate_list_options<'a>(watch: bool, get: impl Fn(&str) -> Option<&'a str>) -> crate::error::ApiResult<()> {
    use crate::error::{ApiError, Cause};
    let rv = get("resourceVersion").unwrap_or_default();
    let matching = get("resourceVersionMatch").unwrap_or_default();
    let send_initial = get("sendInitialEvents").is_some();
    let cont = get("continue").is_some_and(|c| !c.is_empty());
    let forbidden = |detail: &str| Cause::new("FieldValueForbidden", "resourceVersionMatch", format!("Forbidden: {detail}"));
    let not_supported = |supported: &str| {
        Cause::new(
            "FieldValueNotSupported",
            "resourceVersionMatch",
            format!("Unsupported value: \"{matching}\": supported values: {supported}"),
        )
    };
    let mut causes = vec![];
    if watch {
        if send_initial && matching != "NotOlderThan" {
            causes.push(forbidden("sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"));
        }
        if !matching.is_empty() {
            if !send_initial {
                causes.push(forbidden("resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"));
            }
            if matching != "NotOlderThan" {
                causes.push(not_supported("\"NotOlderThan\""));
            }
            if cont {
                causes.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
        }
    } else {
        if !matching.is_empty() {
            if rv.is_empty() {
                causes.push(forbidden("resourceVersionMatch is forbidden unless resourceVersion is provided"));
            }
            if cont {
                causes.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
            if matching != "Exact" && matching != "NotOlderThan" {
                causes.push(not_supported("\"Exact\", \"NotOlderThan\", \"\""));
            }
            if matching == "Exact" && rv == "0" {
                causes.push(forbidden("resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""));
            }
        }
        if send_initial {
            causes.push(Cause::new("FieldValueForbidden", "sendInitialEvents", "Forbidden: sendInitialEvents is forbidden for list"));
        }
    }
    if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid("ListOptions", "meta.k8s.io", "", causes)) }
}
