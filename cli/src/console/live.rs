//! Live updates: a server-sent event stream per open page. The console watches what the page
//! shows with the visitor's token and, when something changed, re-renders the page's live part
//! at most once per [`BATCH`] (a rollout's burst of events is one repaint, not hundreds).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hyper::body::{Body, Frame};
use kube::api::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use provisioning_controller::decode::Notice;
use serde_json::json;
use tokio::sync::mpsc;

use super::ConsoleState;
use super::api::{ApiFailure, Kind};
use super::pages::{self, Page};
use super::session::Session;

/// The shortest time between two updates of one page.
pub const BATCH: Duration = Duration::from_millis(300);
/// Re-render this often even without events (ages, the chart's time axis).
pub const REFRESH: Duration = Duration::from_secs(10);
/// A comment this often keeps proxies from closing the stream and notices a closed tab.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// Live streams one session may hold open at once (a few tabs).
pub const MAX_STREAMS_PER_SESSION: usize = 6;
/// Live streams the console holds open at once, over all sessions.
pub const MAX_STREAMS: usize = 200;

/// Why a live stream was refused (the answer is a 429 whose body is this error's text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The session holds its limit already.
    #[error("too many live streams: at most {0} per session; close another tab of this console")]
    Session(usize),
    /// The console holds its limit already.
    #[error("too many live streams: at most {0} for the whole console; try again later")]
    Total(usize),
}

/// Counts the open live streams, per session and in total: each one watches the API server
/// with its visitor's token, so without a cap a visitor could open them until the console
/// (and the API server) gives out.
pub struct StreamLimits {
    per_session: usize,
    total: usize,
    open: Mutex<usize>,
    /// Set by the first refusal of a burst (logged), cleared by the next stream let in.
    refusing: AtomicBool,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits::new(MAX_STREAMS_PER_SESSION, MAX_STREAMS)
    }
}

impl StreamLimits {
    /// Limits of `per_session` streams per session and `total` in all.
    pub fn new(per_session: usize, total: usize) -> StreamLimits {
        StreamLimits { per_session, total, open: Mutex::new(0), refusing: AtomicBool::new(false) }
    }

    /// A slot for one more stream of `session` (whose own count is `session_open`), freed
    /// when the slot is dropped; refused when either limit is reached.
    pub fn acquire(self: &Arc<Self>, session_open: &Arc<AtomicUsize>, user: &str) -> Result<StreamSlot, Refused> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Both counters change under this one lock, so a check and its increment cannot race.
        let refused = if session_open.load(Ordering::SeqCst) >= self.per_session {
            Some(Refused::Session(self.per_session))
        } else if *open >= self.total {
            Some(Refused::Total(self.total))
        } else {
            None
        };
        if let Some(r) = refused {
            drop(open);
            if !self.refusing.swap(true, Ordering::SeqCst) {
                tracing::warn!(%user, reason = %r, "console refusing live streams (logged once per burst)");
            }
            return Err(r);
        }
        *open += 1;
        session_open.fetch_add(1, Ordering::SeqCst);
        self.refusing.store(false, Ordering::SeqCst);
        Ok(StreamSlot { limits: self.clone(), session_open: session_open.clone() })
    }

    /// Streams open now, in total.
    pub fn open(&self) -> usize {
        *self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One open live stream's place in [`StreamLimits`]; dropping it frees the place.
pub struct StreamSlot {
    limits: Arc<StreamLimits>,
    session_open: Arc<AtomicUsize>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *open = open.saturating_sub(1);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self.session_open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_sub(1)));
    }
}

/// A response body fed by a channel: each message is one SSE frame.
pub struct SseBody(mpsc::Receiver<Bytes>);

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}

/// One SSE message.
pub fn sse(event: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// A stream that tells the browser to sign in again, then ends.
pub fn auth_required() -> SseBody {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(sse("auth", &json!({})));
    SseBody(rx)
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Change notifications for what `page` shows (watches with the visitor's client; a watch
/// the visitor may not open just never fires).
fn changes(client: &Client, page: &Page, namespace: Option<String>) -> futures::stream::BoxStream<'static, ()> {
    let g = provisioning_crds::GROUP;
    let v = provisioning_crds::VERSION;
    // Change notifications only: metadata-only requests, each object decoded to what names it
    // (spec, status and managedFields are skipped unread), in pages of 10.
    let mut apis: Vec<(Api<Notice>, watcher::Config)> = vec![];
    let all = watcher::Config::default().page_size(10);
    if matches!(page, Page::Workspaces | Page::Object { kind: Kind::Workspace, .. }) {
        apis.push((Api::all_with(client.clone(), &resource(g, v, "Workspace", "workspaces")), all.clone()));
    }
    if let Some(ns) = namespace {
        for (kind, plural) in [("Cluster", "clusters"), ("Server", "servers"), ("TaskServ", "taskservs")] {
            apis.push((Api::namespaced_with(client.clone(), &ns, &resource(g, v, kind, plural)), all.clone()));
        }
        // Only the events the page lists (about its object) wake it up.
        if let Page::Object { kind: kind @ (Kind::Cluster | Kind::Server | Kind::TaskServ), name, .. } = page {
            let about = watcher::Config::default().page_size(10).fields(&super::api::event_selector(*kind, name));
            apis.push((Api::namespaced_with(client.clone(), &ns, &resource("events.k8s.io", "v1", "Event", "events")), about));
        }
    }
    let streams = apis
        .into_iter()
        .map(|(api, config)| watcher(api, config).default_backoff().filter_map(|r| async move { r.ok().map(|_| ()) }).boxed());
    futures::stream::select_all(streams).boxed()
}

/// What one render of a page's live part gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendered {
    /// The live part's HTML.
    Html(String),
    /// Why it could not be read (shown on the page, the stream goes on).
    Problem(String),
    /// The token is no longer accepted: the browser signs in again and the stream ends.
    Unauthorized,
}

/// Feeds `tx` from `changes`: a change marks the page dirty and a dirty page is re-rendered
/// with `render` at most once per [`BATCH`] (and every [`REFRESH`] anyway); an unchanged
/// rendering is not sent. Ends when the browser goes away, the changes end or the token fails.
pub async fn pump<C, R, F>(mut changes: C, mut render: R, tx: mpsc::Sender<Bytes>)
where
    C: futures::Stream<Item = ()> + Unpin,
    R: FnMut() -> F,
    F: std::future::Future<Output = Rendered>,
{
    let mut batch = tokio::time::interval(BATCH);
    // After a quiet spell the first change renders at once; the next waits out the batch.
    batch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refresh = tokio::time::interval(REFRESH);
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    let (mut dirty, mut last) = (false, String::new());
    loop {
        tokio::select! {
            ev = changes.next() => match ev {
                Some(()) => dirty = true,
                None => break,
            },
            _ = batch.tick(), if dirty => {
                dirty = false;
                let rendered = render().await;
                // The next batch is counted from this render, not from a fixed schedule: a render
                // that started late (a loaded machine) is never followed by one less than BATCH later.
                batch.reset();
                let message = match rendered {
                    Rendered::Html(html) if html == last => continue,
                    Rendered::Html(html) => {
                        let m = sse("update", &json!({"html": html, "at": chrono::Utc::now().format("%H:%M:%S").to_string()}));
                        last = html;
                        m
                    }
                    Rendered::Unauthorized => {
                        let _ = tx.send(sse("auth", &json!({}))).await;
                        break;
                    }
                    Rendered::Problem(message) => sse("problem", &json!({"message": message})),
                };
                if tx.send(message).await.is_err() {
                    break;
                }
            }
            _ = refresh.tick() => dirty = true,
            _ = keepalive.tick() => {
                if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                    break;
                }
            }
            _ = tx.closed() => break,
        }
    }
}

/// Streams updates of `page` to the browser until it goes away or the token stops working.
/// The stream holds `slot` until it ends: when the browser goes away the body is dropped,
/// `tx.closed()` fires and the slot is freed.
pub fn stream(state: Arc<ConsoleState>, session_id: String, session: Arc<Session>, page: Page, slot: StreamSlot) -> SseBody {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let _slot = slot;
        // The namespace to watch: a Workspace's own, read once (it does not move).
        let namespace = match &page {
            Page::Workspaces => None,
            Page::Object { kind: Kind::Workspace, name, .. } => {
                super::api::get(&session.client, Kind::Workspace, None, name).await.ok().map(|ws| pages::workspace_namespace(&ws))
            }
            Page::Object { namespace, .. } => namespace.clone(),
        };
        let changes = changes(&session.client, &page, namespace);
        let render = || {
            let (state, session, session_id, page) = (state.clone(), session.clone(), session_id.clone(), page.clone());
            async move {
                // Signed out meanwhile (logout, or evicted at a session limit): the stream ends.
                if !state.sessions.contains(&session_id) {
                    return Rendered::Unauthorized;
                }
                match pages::live_fragment(&session, &page).await {
                    Ok(html) => Rendered::Html(html),
                    Err(ApiFailure::Unauthorized) => {
                        state.sessions.remove(&session_id);
                        Rendered::Unauthorized
                    }
                    Err(e) => Rendered::Problem(e.to_string()),
                }
            }
        };
        pump(changes, render, tx).await;
    });
    SseBody(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_capped_per_session_and_in_total_and_freed_on_drop() {
        let limits = Arc::new(StreamLimits::new(2, 3));
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let a1 = limits.acquire(&a, "alice").ok();
        let a2 = limits.acquire(&a, "alice").ok();
        assert!(a1.is_some() && a2.is_some());
        assert_eq!(limits.acquire(&a, "alice").err(), Some(Refused::Session(2)), "a third stream of one session");
        let b1 = limits.acquire(&b, "bob").ok();
        assert!(b1.is_some(), "another session still gets one");
        assert_eq!(limits.acquire(&b, "bob").err(), Some(Refused::Total(3)), "the console is full");
        assert_eq!((limits.open(), a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (3, 2, 1));
        drop(a1);
        assert_eq!((limits.open(), a.load(Ordering::SeqCst)), (2, 1), "a dropped slot is freed at once");
        let a3 = limits.acquire(&a, "alice").ok();
        assert!(a3.is_some(), "the freed place is usable again");
        drop((a2, a3, b1));
        assert_eq!((limits.open(), a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (0, 0, 0));
        assert!(Refused::Session(6).to_string().contains("at most 6 per session"));
        assert!(Refused::Total(200).to_string().contains("at most 200 for the whole console"));
    }

    /// The updates pushed to `rx` until the stream ends, as (time since `t0`, event name).
    async fn drain(mut rx: mpsc::Receiver<Bytes>, t0: tokio::time::Instant) -> Vec<(Duration, String)> {
        let mut out = vec![];
        while let Some(m) = rx.recv().await {
            let text = String::from_utf8_lossy(&m).to_string();
            if let Some(ev) = text.strip_prefix("event: ").and_then(|t| t.lines().next()) {
                out.push((t0.elapsed(), ev.to_string()));
            }
        }
        out
    }

    // Real time (the workspace's tokio has no test clock): a 1 s burst and a quiet spell take
    // about 2.5 s; the bounds hold on a loaded machine, where sleeps only get longer.
    #[tokio::test]
    async fn a_burst_of_changes_is_at_most_one_update_per_batch() {
        let t0 = tokio::time::Instant::now();
        let (changes_tx, changes_rx) = futures::channel::mpsc::unbounded::<()>();
        let renders = Arc::new(Mutex::new(Vec::<Duration>::new()));
        let render = {
            let renders = renders.clone();
            move || {
                let renders = renders.clone();
                async move {
                    let mut r = renders.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    r.push(t0.elapsed());
                    Rendered::Html(format!("v{}", r.len()))
                }
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let pumping = tokio::spawn(pump(changes_rx, render, tx));
        let collecting = tokio::spawn(drain(rx, t0));
        // 100 changes, one every 10 ms (a rollout's burst), then quiet, then one more.
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = changes_tx.unbounded_send(());
        }
        let burst_end = t0.elapsed();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let late = t0.elapsed();
        let _ = changes_tx.unbounded_send(());
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(changes_tx);
        let _ = pumping.await;
        let updates = collecting.await.unwrap_or_default();
        let renders = renders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();

        // At most one render per BATCH over the burst (plus the first and the late one).
        let most = usize::try_from(burst_end.as_millis() / BATCH.as_millis()).unwrap_or(usize::MAX) + 3;
        assert!(renders.len() <= most, "{} renders for a {burst_end:?} burst (at most {most}): not batched: {renders:?}", renders.len());
        for pair in renders.windows(2) {
            // Tokio's timer works in whole milliseconds.
            assert!(
                pair[1] - pair[0] + Duration::from_millis(2) >= BATCH,
                "two renders {:?} apart, under {BATCH:?}: {renders:?}",
                pair[1] - pair[0]
            );
        }
        // Every render differs here, so each one was pushed.
        assert_eq!(updates.len(), renders.len(), "{updates:?}");
        assert!(updates.iter().all(|(_, ev)| ev == "update"), "{updates:?}");
        // The burst's last change is shown, not lost.
        assert!(renders.iter().any(|t| *t >= burst_end && *t < late), "the end of the burst was not rendered: {renders:?}");
        // A change after a quiet spell is shown at once, not a batch later.
        assert!(
            renders.iter().any(|t| *t >= late && *t < late + BATCH / 2),
            "a change after quiet at {late:?} was not rendered at once: {renders:?}"
        );
    }

    #[tokio::test]
    async fn an_unchanged_render_is_not_sent_and_a_refused_token_ends_the_stream() {
        let (changes_tx, changes_rx) = futures::channel::mpsc::unbounded::<()>();
        let calls = Arc::new(AtomicUsize::new(0));
        let render = {
            let calls = calls.clone();
            move || {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move { if n < 3 { Rendered::Html("same".into()) } else { Rendered::Unauthorized } }
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let pumping = tokio::spawn(pump(changes_rx, render, tx));
        let collecting = tokio::spawn(drain(rx, tokio::time::Instant::now()));
        for _ in 0..4 {
            let _ = changes_tx.unbounded_send(());
            tokio::time::sleep(BATCH * 2).await;
        }
        let _ = pumping.await;
        let events: Vec<String> = collecting.await.unwrap_or_default().into_iter().map(|(_, e)| e).collect();
        assert_eq!(events, ["update", "auth"], "one update for three identical renders, then auth");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }
}
