//! Live updates: a server-sent event stream per open page. The console watches what the page
//! shows with the visitor's token and, when something changed, re-renders the page's live part
//! at most once per [`BATCH`] (a rollout's burst of events is one repaint, not hundreds).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hyper::body::{Body, Frame};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
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
    let mut apis: Vec<Api<DynamicObject>> = vec![];
    if matches!(page, Page::Workspaces | Page::Object { kind: Kind::Workspace, .. }) {
        apis.push(Api::all_with(client.clone(), &resource(g, v, "Workspace", "workspaces")));
    }
    if let Some(ns) = namespace {
        for (kind, plural) in [("Cluster", "clusters"), ("Server", "servers"), ("TaskServ", "taskservs")] {
            apis.push(Api::namespaced_with(client.clone(), &ns, &resource(g, v, kind, plural)));
        }
        if matches!(page, Page::Object { kind: Kind::Cluster | Kind::Server | Kind::TaskServ, .. }) {
            apis.push(Api::namespaced_with(client.clone(), &ns, &resource("events.k8s.io", "v1", "Event", "events")));
        }
    }
    let streams = apis
        .into_iter()
        .map(|api| watcher(api, watcher::Config::default()).default_backoff().filter_map(|r| async move { r.ok().map(|_| ()) }).boxed());
    futures::stream::select_all(streams).boxed()
}

/// Streams updates of `page` to the browser until it goes away or the token stops working.
pub fn stream(state: Arc<ConsoleState>, session_id: String, session: Arc<Session>, page: Page) -> SseBody {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        // The namespace to watch: a Workspace's own, read once (it does not move).
        let namespace = match &page {
            Page::Workspaces => None,
            Page::Object { kind: Kind::Workspace, name, .. } => {
                super::api::get(&session.client, Kind::Workspace, None, name).await.ok().map(|ws| pages::workspace_namespace(&ws))
            }
            Page::Object { namespace, .. } => namespace.clone(),
        };
        let mut changes = changes(&session.client, &page, namespace);
        let mut batch = tokio::time::interval(BATCH);
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
                    let message = match pages::live_fragment(&session, &page).await {
                        Ok(html) if html == last => continue,
                        Ok(html) => {
                            let m = sse("update", &json!({"html": html, "at": chrono::Utc::now().format("%H:%M:%S").to_string()}));
                            last = html;
                            m
                        }
                        Err(ApiFailure::Unauthorized) => {
                            state.sessions.remove(&session_id);
                            let _ = tx.send(sse("auth", &json!({}))).await;
                            break;
                        }
                        Err(e) => sse("problem", &json!({"message": e.to_string()})),
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
    });
    SseBody(rx)
}
