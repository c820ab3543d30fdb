//! HTTPS listener, authentication and request routing.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ApiResult};
use crate::handlers::{Core, DeleteOptions, FieldValidation, Output, Propagation, WriteOptions, parse_body};
use crate::limits::{IdentityCaps, IdentityLimits};
use crate::patch::PatchType;
use crate::registry::ResourceType;
use crate::selectors::{FieldLabels, FieldSelector, LabelSelector};
use crate::storage::Entry;
use crate::urlpath::percent_decode;
use crate::{list_body, openapi, table, watch};
use provisioning_yaml::bounded::Meter;

/// Request bodies above this are refused with 413.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

fn json_response(code: u16, body: Bytes) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn value_response(code: u16, v: &Value) -> Response<Body> {
    json_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

fn error_response(e: &ApiError) -> Response<Body> {
    value_response(e.code, &e.to_status())
}

/// One open connection as the accept loop sees it: requests in flight, since when it has been
/// idle, and a token that closes it (idle timeout, eviction at the connection cap, shutdown).
struct ConnState {
    id: u64,
    peer: std::net::IpAddr,
    in_flight: AtomicUsize,
    watches: AtomicUsize,
    idle_since_ms: AtomicU64,
    close: CancellationToken,
}

/// Counters shared by every connection.
struct ServeState {
    started: tokio::time::Instant,
    conns: std::sync::Mutex<HashMap<u64, Arc<ConnState>>>,
    /// Requests in flight and watches per flow (authenticated identity).
    identities: Arc<IdentityLimits>,
    all_closed: tokio::sync::Notify,
}

impl ServeState {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        match self.conns.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Room for a new connection from `peer`: at the peer's cap its own longest-idle
    /// connection is closed, at the overall cap anyone's; false when the connections that
    /// would have to go are all busy.
    fn make_room(&self, peer: std::net::IpAddr, per_peer: usize, cap: usize) -> bool {
        let conns = self.conns();
        let open = |c: &&Arc<ConnState>| !c.close.is_cancelled();
        let idle = |c: &&Arc<ConnState>| c.in_flight.load(Ordering::SeqCst) == 0;
        let longest_idle = |of_peer: bool| {
            conns
                .values()
                .filter(open)
                .filter(idle)
                .filter(|c| !of_peer || c.peer == peer)
                .min_by_key(|c| c.idle_since_ms.load(Ordering::SeqCst))
                .cloned()
        };
        // Connections already closing are on their way out and do not count.
        if conns.values().filter(open).filter(|c| c.peer == peer).count() >= per_peer {
            let Some(v) = longest_idle(true) else { return false };
            v.close.cancel();
        }
        if conns.values().filter(open).count() >= cap {
            let Some(v) = longest_idle(false) else { return false };
            v.close.cancel();
        }
        true
    }
}

/// Ends a request's bookkeeping when its response body is dropped (finished, or the client
/// went away): a watch counts as in flight for as long as it streams.
struct RequestGuard {
    conn: Arc<ConnState>,
    serve: Arc<ServeState>,
    watch: bool,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if self.watch {
            self.conn.watches.fetch_sub(1, Ordering::SeqCst);
        }
        self.conn.idle_since_ms.store(self.serve.now_ms(), Ordering::SeqCst);
        self.conn.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that carries what its request holds (its connection's bookkeeping, its
/// user's place) until the body is dropped.
struct Holding<G> {
    inner: Body,
    _held: G,
}

impl<G: Unpin> hyper::body::Body for Holding<G> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

fn is_watch_request(req: &Request<Incoming>) -> bool {
    if req.method() != Method::GET {
        return false;
    }
    let path = req.uri().path();
    let q = Query::parse(req.uri().query());
    q.flag("watch") || path.starts_with("/api/v1/watch/") || path.split('/').nth(4) == Some("watch")
}

/// Serves HTTPS on `listener` until `core.shutdown` is cancelled, holding the connection and
/// watch limits of `core.limits`.
pub async fn serve(core: Arc<Core>, listener: TcpListener, tls: Arc<rustls::ServerConfig>, token: Arc<crate::auth::Auth>) {
    let acceptor = TlsAcceptor::from(tls);
    let state = Arc::new(ServeState {
        started: tokio::time::Instant::now(),
        conns: std::sync::Mutex::new(HashMap::new()),
        identities: IdentityLimits::new(IdentityCaps::of(&core.limits)),
        all_closed: tokio::sync::Notify::new(),
    });
    let mut next_id = 0u64;
    let mut backoff = Duration::ZERO;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = core.shutdown.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok((tcp, peer)) => {
                backoff = Duration::ZERO;
                (tcp, peer.ip())
            }
            Err(e) => {
                // Out of file descriptors and the like: back off as Go's http.Server does
                // (5 ms doubling to 1 s) instead of spinning on the error.
                backoff = if backoff.is_zero() { Duration::from_millis(5) } else { (backoff * 2).min(Duration::from_secs(1)) };
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "accepting a connection failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = core.shutdown.cancelled() => break,
                }
                continue;
            }
        };
        if !state.make_room(peer, core.limits.max_connections_per_peer, core.limits.max_connections) {
            tracing::warn!(
                %peer,
                per_peer = core.limits.max_connections_per_peer,
                cap = core.limits.max_connections,
                "connection cap reached with every connection that could go busy; refusing one"
            );
            drop(tcp);
            continue;
        }
        let _ = tcp.set_nodelay(true);
        next_id += 1;
        let conn_state = Arc::new(ConnState {
            id: next_id,
            peer,
            in_flight: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(state.now_ms()),
            close: core.shutdown.child_token(),
        });
        state.conns().insert(next_id, conn_state.clone());
        tokio::spawn(serve_connection(core.clone(), state.clone(), conn_state, acceptor.clone(), tcp, token.clone()));
    }
    // Shutdown: every connection token is a child of `core.shutdown`, so all are closing now.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let notified = state.all_closed.notified();
            if state.conns().is_empty() {
                return;
            }
            notified.await;
        }
    })
    .await;
}

// Over 80 lines on purpose: one connection's life (TLS handshake with its timeout, HTTP/1 or
// HTTP/2, limits, idle eviction) kept together so the timeouts can be read side by side.
async fn serve_connection(
    core: Arc<Core>,
    state: Arc<ServeState>,
    conn_state: Arc<ConnState>,
    acceptor: TlsAcceptor,
    tcp: tokio::net::TcpStream,
    token: Arc<crate::auth::Auth>,
) {
    let limits = core.limits.clone();
    let handshake = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)) => r.ok().and_then(Result::ok),
        _ = conn_state.close.cancelled() => None,
    };
    if let Some(tls) = handshake {
        let svc = {
            let (core, state, conn) = (core.clone(), state.clone(), conn_state.clone());
            hyper::service::service_fn(move |req: Request<Incoming>| {
                let (core, state, conn, token) = (core.clone(), state.clone(), conn.clone(), token.clone());
                async move {
                    conn.in_flight.fetch_add(1, Ordering::SeqCst);
                    let watch = is_watch_request(&req);
                    // Per connection (before authentication: one client's HTTP/2 connection);
                    // per user and in total after it, in `handle`.
                    let over = watch && conn.watches.fetch_add(1, Ordering::SeqCst) >= core.limits.max_watches_per_connection;
                    let identities = state.identities.clone();
                    let guard = RequestGuard { conn, serve: state, watch };
                    let resp = if over {
                        too_many(format!(
                            "too many watches open on this connection (limit {}); try again later",
                            core.limits.max_watches_per_connection
                        ))
                    } else {
                        handle(core, &token, &identities, watch, req).await
                    };
                    Ok::<_, Infallible>(resp.map(|inner| Holding { inner, _held: guard }))
                }
            })
        };
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        let conn = builder.serve_connection(TokioIo::new(tls), svc).into_owned();
        tokio::pin!(conn);
        let check = (limits.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut ticker = tokio::time::interval(check);
        let mut closing_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = conn.as_mut() => break,
                _ = conn_state.close.cancelled(), if closing_since.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    closing_since = Some(tokio::time::Instant::now());
                }
                _ = ticker.tick() => {
                    if let Some(t) = closing_since {
                        // A client that ignores the close gets dropped after a grace period.
                        if t.elapsed() > Duration::from_secs(5) {
                            break;
                        }
                        continue;
                    }
                    let idle_ms = state.now_ms().saturating_sub(conn_state.idle_since_ms.load(Ordering::SeqCst));
                    if conn_state.in_flight.load(Ordering::SeqCst) == 0 && idle_ms >= limits.idle_timeout.as_millis() as u64 {
                        conn_state.close.cancel();
                    }
                }
            }
        }
    }
    let empty = {
        let mut conns = state.conns();
        conns.remove(&conn_state.id);
        conns.is_empty()
    };
    if empty {
        state.all_closed.notify_waiters();
    }
}

/// Parsed query parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(p), String::new()),
                })
                .collect(),
        )
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str())
    }
    /// Read as the authorizer reads it ([`crate::auth::attributes::query_bool`]).
    fn flag(&self, k: &str) -> bool {
        crate::auth::attributes::query_bool(self.get(k))
    }
}

/// 429 with `Retry-After: 1`, as kube-apiserver's APF answers a request it has no place for.
fn too_many(message: String) -> Response<Body> {
    let mut r = error_response(&ApiError::too_many_requests(message));
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

async fn handle(
    core: Arc<Core>,
    auth: &crate::auth::Auth,
    identities: &Arc<IdentityLimits>,
    watch: bool,
    req: Request<Incoming>,
) -> Response<Body> {
    use crate::auth::Attributes;
    let path = req.uri().path().to_string();
    if path == "/readyz" && !core.store.is_ready() {
        // Not ready while storage cannot commit: load balancers and kubectl see it at once.
        let mut r = Response::new(full("[-]storage failed: writes cannot be committed\nreadyz check failed"));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        let mut r = Response::new(full("ok"));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    let attrs = Attributes::from_request(req.method(), &path, req.uri().query());
    let user = match auth.authenticate(&core.store, req.headers()) {
        Ok(u) => u,
        Err(e) => {
            // The reason names what was wrong with the credential, never the credential.
            tracing::warn!(reason = %e, verb = %attrs.verb, path = %path, "unauthorized");
            return error_response(&ApiError::unauthorized());
        }
    };
    // The flow comes from the authenticated identity: impersonation never moves a request to
    // another flow (crate::limits).
    let flow = identities.flow(&user);
    let authenticated = crate::auth::identity::Authenticated(user.clone());
    let user = match auth.impersonate(&core.store, user, req.headers()) {
        Ok(u) => u,
        Err(e) => return error_response(&e),
    };
    // The flow's place, held until the response body is dropped (a watch's as long as it streams).
    let permit = match identities.admit(&flow, watch) {
        Ok(p) => p,
        Err(refused) => {
            tracing::debug!(user = %user.name, %flow, %refused, "request refused at a per-flow limit");
            return too_many(refused.to_string());
        }
    };
    let mut req = req;
    // Exempt identities (the controller, system:masters) decode outside the shared budget, as
    // they are outside the flow caps: a tenant spending it never makes the controller's
    // writes wait (each body is still bounded by its own limit).
    if identities.is_exempt(&authenticated.0) {
        req.extensions_mut().insert(DecodeExempt);
    } else {
        req.extensions_mut().insert(DecodeFlow(flow.to_string()));
    }
    req.extensions_mut().insert(authenticated);
    authorized(core, auth, user, attrs, req).await.map(|inner| Holding { inner, _held: permit }.boxed_unsync())
}

/// The rest of [`handle`] for an authenticated user with a place: authorization, the
/// discovery documents of the signer, reviews, then the resource routes.
async fn authorized(
    core: Arc<Core>,
    auth: &crate::auth::Auth,
    user: crate::auth::identity::UserInfo,
    attrs: crate::auth::Attributes,
    req: Request<Incoming>,
) -> Response<Body> {
    use crate::auth::reviews;
    let path = req.uri().path().to_string();
    let decision = auth.authorize(&core.store, &user, &attrs);
    if !decision.allowed {
        crate::auth::warn_forbidden(&user, &attrs);
        return error_response(&attrs.forbidden(&user, &decision.reason));
    }
    match path.trim_end_matches('/') {
        "/.well-known/openid-configuration" => return value_response(200, &auth.signer().openid_configuration()),
        "/openid/v1/jwks" => {
            let mut r = value_response(200, &auth.signer().jwks());
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/jwk-set+json"));
            return r;
        }
        _ => {}
    }
    if let Some(review) = reviews::Review::of(&attrs) {
        if req.method() != Method::POST {
            return error_response(&ApiError::method_not_allowed(format!("method {} is not supported on this path", req.method())));
        }
        let ct = content_type(&req);
        let meter = request_meter(&core, &req);
        let result = async {
            let body = read_body(req, core.limits.body_read_timeout).await?;
            // Protobuf review kinds reach auth::proto through the same metered path.
            let obj = decode_body(body, &ct, &meter).await?;
            reviews::create(auth, &core.store, &user, &attrs, review, obj)
        }
        .await;
        return match result {
            Ok((v, warnings)) => with_warnings(value_response(201, &v), &warnings),
            Err(e) => error_response(&e),
        };
    }
    let mut req = req;
    if let Some(guard) = crate::auth::escalation::Guard::for_request(&user, &attrs, || auth.policy(&core.store)) {
        req.extensions_mut().insert(guard);
    }
    req.extensions_mut().insert(user.clone());
    match route(core, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// The request's body, at most [`MAX_BODY`] bytes and all of it within `timeout` (a client
/// trickling a body would otherwise hold a request slot forever; 408 naming the limit).
async fn read_body(req: Request<Incoming>, timeout: std::time::Duration) -> ApiResult<Bytes> {
    match tokio::time::timeout(timeout, read_body_unbounded_in_time(req)).await {
        Ok(body) => body,
        Err(_) => Err(ApiError::request_timeout(format!("the request body was not received within {} s", timeout.as_secs()))),
    }
}

async fn read_body_unbounded_in_time(req: Request<Incoming>) -> ApiResult<Bytes> {
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok())
        && len > MAX_BODY
    {
        return Err(ApiError::too_large());
    }
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                Err(ApiError::too_large())
            } else {
                Err(ApiError::bad_request(format!("reading request body: {e}")))
            }
        }
    }
}

struct Target {
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    watch: bool,
}

// Over 80 lines on purpose: the URL table (discovery, openapi, version, health, resources) as
// one match, like kube-apiserver's mux.
/// `GET /backup`: one consistent snapshot of the store (see [`crate::backup`]). Authorized as
/// the non-resource URL `/backup` (cluster-admin's `nonResourceURLs: ["*"]` by default): the
/// snapshot holds every Secret. The server logs who took it and at which revision.
async fn backup_response(core: &Arc<Core>, req: &Request<Incoming>) -> ApiResult<Response<Body>> {
    let user = req.extensions().get::<crate::auth::identity::UserInfo>().map(|u| u.name.clone()).unwrap_or_default();
    let store = core.store.clone();
    let encoded = tokio::task::spawn_blocking(move || {
        let (revision, objects) = store.snapshot();
        let count = objects.len();
        crate::backup::encode(&crate::backup::Backup { revision, objects, files: vec![] }).map(|b| (b, revision, count))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(e.to_string()))?;
    let (body, revision, objects) = encoded;
    tracing::info!(%user, revision, objects, "backup snapshot taken");
    let mut r = Response::new(full(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

async fn route(core: Arc<Core>, req: Request<Incoming>) -> ApiResult<Response<Body>> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(percent_decode).collect();
    let get = req.method() == Method::GET;
    let reg = core.registry();
    match segs.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["version"] if get => {
            return Ok(value_response(
                200,
                &json!({
                    "major": "1", "minor": "37", "emulationMajor": "1", "emulationMinor": "37",
                    "gitVersion": "v1.37.0+provisioning", "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                    "compiler": "rustc", "platform": "linux/amd64",
                }),
            ));
        }
        ["api" | "apis"] if get && crate::discovery::wants_aggregated(&accept_header(&req)) => {
            let doc = if segs[0] == "api" { crate::discovery::core(&reg) } else { crate::discovery::apis(&reg) };
            let mut r = value_response(200, &doc);
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::discovery::AGGREGATED_CONTENT_TYPE));
            r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
            return Ok(r);
        }
        ["api"] if get => {
            return Ok(value_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}),
            ));
        }
        ["apis"] if get => return Ok(value_response(200, &reg.api_group_list())),
        ["api", "v1"] if get => {
            return reg.api_resource_list("", "v1").map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found);
        }
        ["apis", g] if get => return reg.api_group(g).map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found),
        ["apis", g, v] if get => {
            return reg.api_resource_list(g, v).map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found);
        }
        ["openapi", "v2"] if get => {
            let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
            return Ok(match openapi::v2_for(&reg, accept) {
                Some((content_type, body)) => {
                    let mut r = Response::new(full(body));
                    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                    r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
                    r
                }
                None => {
                    // What kube-openapi answers when no offered type is acceptable.
                    let mut r = Response::new(full("406 - Not Acceptable\n"));
                    *r.status_mut() = StatusCode::NOT_ACCEPTABLE;
                    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                    r
                }
            });
        }
        ["backup"] if get => return backup_response(&core, &req).await,
        ["openapi", "v3"] if get => return Ok(value_response(200, &openapi::index(&reg))),
        ["openapi", "v3", rest @ ..] if get => {
            let gv = rest.join("/");
            return openapi::document(&reg, &gv).map(|v| value_response(200, &v)).ok_or_else(ApiError::path_not_found);
        }
        _ => {}
    }
    let (group, version, rest): (&str, &str, &[String]) = match segs.first().map(String::as_str) {
        Some("api") if segs.len() >= 3 => ("", segs[1].as_str(), &segs[2..]),
        Some("apis") if segs.len() >= 4 => (segs[1].as_str(), segs[2].as_str(), &segs[3..]),
        _ => return Err(ApiError::path_not_found()),
    };
    let (watch_prefix, rest) = if rest.first().map(String::as_str) == Some("watch") { (true, &rest[1..]) } else { (false, rest) };
    let target = if rest.len() >= 3 && rest[0] == "namespaces" && reg.get(group, version, &rest[2]).is_some_and(|r| r.namespaced) {
        let rt = reg.get(group, version, &rest[2]).ok_or_else(ApiError::path_not_found)?;
        if rest.len() > 5 {
            return Err(ApiError::path_not_found());
        }
        Target { rt, namespace: Some(rest[1].clone()), name: rest.get(3).cloned(), subresource: rest.get(4).cloned(), watch: watch_prefix }
    } else {
        let Some(first) = rest.first() else { return Err(ApiError::path_not_found()) };
        let rt = reg.get(group, version, first).ok_or_else(ApiError::path_not_found)?;
        if rest.len() > 3 {
            return Err(ApiError::path_not_found());
        }
        Target { rt, namespace: None, name: rest.get(1).cloned(), subresource: rest.get(2).cloned(), watch: watch_prefix }
    };
    if let Some(sub) = &target.subresource
        && !(sub == "status" && target.rt.has_status)
        && !(sub == "scale" && target.rt.scale.is_some() && target.name.is_some())
        && !(sub == "finalize" && target.rt.storage == crate::handlers::NAMESPACES)
    {
        return Err(ApiError::path_not_found());
    }
    if target.rt.namespaced && target.namespace.is_none() && target.name.is_some() {
        return Err(ApiError::path_not_found());
    }
    resource(core, req, target).await
}

fn accept_header(req: &Request<Incoming>) -> String {
    req.headers().get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or_default().to_string()
}

fn accept_info(req: &Request<Incoming>) -> (Option<String>, bool) {
    let accept = req.headers().get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    let table = accept.split(',').next().is_some_and(|first| first.contains("as=Table")) || accept.contains("as=Table");
    let partial = accept.contains("as=PartialObjectMetadata");
    (if table { Some("Metadata".to_string()) } else { None }, partial && !table)
}

/// Decodes a request body within the request's decode meter (see [`parse_body`]); a large
/// body is decoded on a blocking thread, off the async workers.
async fn decode_body(body: Bytes, ct: &str, meter: &Option<Arc<Meter>>) -> ApiResult<Value> {
    let meter = meter.clone().unwrap_or_default();
    if body.len() <= 64 * 1024 {
        return parse_body(&body, ct, &meter);
    }
    let ct = ct.to_string();
    tokio::task::spawn_blocking(move || parse_body(&body, &ct, &meter))
        .await
        .map_err(|e| ApiError::internal(format!("decoding the request body: {e}")))?
}

/// Marks a request of an exempt identity: its bodies are decoded outside the shared budget.
#[derive(Clone, Copy)]
struct DecodeExempt;

/// The flow whose fair share of the decode budget a request's bodies draw on.
#[derive(Clone)]
struct DecodeFlow(String);

/// The decode meter of a request: outside the shared budget for an exempt identity, else
/// within its flow's share of it.
fn request_meter(core: &Core, req: &Request<Incoming>) -> Option<Arc<Meter>> {
    if req.extensions().get::<DecodeExempt>().is_some() {
        return Some(Arc::default());
    }
    core.meter(req.extensions().get::<DecodeFlow>().map(|f| f.0.clone()))
}

/// The identity a write is recorded under: the one that authenticated, else the request's user.
fn recorded_identity(req: &Request<Incoming>) -> Option<&crate::auth::identity::UserInfo> {
    req.extensions()
        .get::<crate::auth::identity::Authenticated>()
        .map(|a| &a.0)
        .or_else(|| req.extensions().get::<crate::auth::identity::UserInfo>())
}

fn write_options(core: &Core, req: &Request<Incoming>, q: &Query) -> ApiResult<WriteOptions> {
    let ua_manager = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|h| h.to_str().ok())
        .map(|ua| ua.split('/').next().unwrap_or(ua).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let explicit = q.get("fieldManager").filter(|s| !s.is_empty());
    let field_validation = match q.get("fieldValidation") {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => return Err(ApiError::bad_request(format!("fieldValidation parameter unsupported: {other}"))),
    };
    let dry_run = match q.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => return Err(ApiError::bad_request(format!("Invalid dry run value: {other}"))),
    };
    Ok(WriteOptions {
        dry_run,
        field_manager: explicit.map(str::to_string).unwrap_or(ua_manager),
        explicit_manager: explicit.is_some(),
        field_validation,
        force: q.flag("force") && q.get("force") != Some(""),
        escalation: req.extensions().get::<std::sync::Arc<crate::auth::escalation::Guard>>().cloned(),
        // Who approved or changed the spec: the identity that authenticated (an impersonator
        // itself, not the user it impersonates; crate::auth::approver).
        user: recorded_identity(req).map(|u| u.name.clone()),
        groups: recorded_identity(req).map(|u| u.groups.clone()).unwrap_or_default(),
        decode: request_meter(core, req),
    })
}

/// Most bytes of Warning headers one reply carries, and the length each is cut to when they
/// would carry more (upstream's warning recorder: 4 Ki runes in total, 256 per warning).
const MAX_WARNING_BYTES: usize = 4 * 1024;
const MAX_WARNING_ITEM: usize = 256;
/// Most Warning headers one reply carries (clients cap a reply's headers: hyper at 100).
const MAX_WARNINGS: usize = 50;

/// The warnings a reply carries: each once, cut to [`MAX_WARNING_ITEM`] characters when all of
/// them would be more than [`MAX_WARNING_BYTES`], no more than fit in that and
/// [`MAX_WARNINGS`], and then one saying how many more there were.
fn capped_warnings(warnings: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&String> = warnings.iter().filter(|w| seen.insert(w.as_str())).collect();
    let total: usize = unique.iter().map(|w| w.len()).sum();
    let cut = |w: &String| -> String {
        if total > MAX_WARNING_BYTES && w.chars().count() > MAX_WARNING_ITEM {
            w.chars().take(MAX_WARNING_ITEM).collect()
        } else {
            w.clone()
        }
    };
    let mut out = Vec::new();
    let mut used = 0usize;
    for (i, w) in unique.iter().enumerate() {
        let w = cut(w);
        let last = i + 1 == unique.len();
        // Room for the summary line unless this is the last warning.
        let (count_room, byte_room) = if last { (MAX_WARNINGS, MAX_WARNING_BYTES) } else { (MAX_WARNINGS - 1, MAX_WARNING_BYTES - 64) };
        if out.len() + 1 > count_room || used + w.len() > byte_room {
            out.push(format!("... and {} more warnings", unique.len() - i));
            break;
        }
        used += w.len();
        out.push(w);
    }
    out
}

fn with_warnings(mut r: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in capped_warnings(warnings) {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(h) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

fn single(core: &Core, rt: &ResourceType, out: &Output, code: u16, table: &Option<String>) -> Response<Body> {
    match (table, out) {
        (Some(inc), _) => {
            let v = core.convert(rt, out.value());
            if v["kind"] == "Status" {
                return value_response(code, &v);
            }
            let rv = v["metadata"]["resourceVersion"].as_str().map(str::to_string);
            value_response(code, &table::table(rt, vec![v], rv, None, inc, true))
        }
        (None, Output::Stored(e)) => json_response(code, core.render(rt, e)),
        (None, Output::Transient(v)) => value_response(code, &core.convert(rt, v.clone())),
    }
}

/// One object in the shape asked for ([`single`]). An object over 64 KiB that must be decoded to
/// answer (a Table, or a stored object served in another version, as an Event read as
/// events.k8s.io) is made on a blocking thread, its decoding charged to the request's flow first
/// (429 when the budget cannot cover it); otherwise the stored bytes are sent as they are.
async fn shaped(core: &Arc<Core>, rt: &Arc<ResourceType>, out: Output, code: u16, shape: &Shape) -> ApiResult<Response<Body>> {
    let (len, converted) = match &out {
        Output::Stored(e) => (e.bytes.len(), e.api_version != rt.api_version()),
        Output::Transient(_) => (0, false),
    };
    if (shape.table.is_none() && !converted) || len <= LARGE_WRITE {
        return Ok(single(core, rt, &out, code, &shape.table));
    }
    let charged = match &shape.meter {
        Some(m) => {
            m.reserve(len.saturating_mul(provisioning_yaml::bounded::LIMIT_PER_BYTE)).map_err(crate::handlers::decode_refusal)?;
            Some(m.clone())
        }
        None => None,
    };
    let (c, r, table) = (core.clone(), rt.clone(), shape.table.clone());
    // The reservation goes with the work (held until it ends, even if the client resets).
    tokio::task::spawn_blocking(move || {
        let _charged = charged;
        single(&c, &r, &out, code, &table)
    })
    .await
    .map_err(|e| ApiError::internal(format!("making the table: {e}")))
}

/// The response shape a client asked for: a Table (`includeObject` policy), partial object
/// metadata, or the objects themselves.
struct Shape {
    table: Option<String>,
    partial: bool,
    /// The request's decode meter: decoding stored objects to shape them is charged to it.
    meter: Option<Arc<Meter>>,
    /// The request's flow (None: an exempt identity), for a watch's shares.
    flow: Option<String>,
}

/// One resource request: a match over the verbs (get, list, watch, create, update, patch,
/// delete, deletecollection), each handled with its content negotiation.
async fn resource(core: Arc<Core>, req: Request<Incoming>, t: Target) -> ApiResult<Response<Body>> {
    let q = Query::parse(req.uri().query());
    let (mut table, partial) = accept_info(&req);
    if let (Some(tb), Some(inc)) = (table.as_mut(), q.get("includeObject")) {
        *tb = inc.to_string();
    }
    let shape =
        Shape { table, partial, meter: request_meter(&core, &req), flow: req.extensions().get::<DecodeFlow>().map(|f| f.0.clone()) };
    let rt = t.rt.clone();
    let ns = t.namespace.as_deref();
    let status = t.subresource.as_deref() == Some("status");
    let method = req.method().clone();
    core.stats.request(request_verb(&method, t.name.is_some(), t.watch || q.flag("watch")), &rt.plural, t.subresource.as_deref());
    if let (Some("scale"), Some(name)) = (t.subresource.as_deref(), &t.name) {
        return scale(&core, req, &q, &rt, ns, name).await;
    }
    match (method, &t.name) {
        (Method::GET, Some(name)) if !t.watch => {
            let e = core.get(&rt, ns, name)?;
            shaped(&core, &rt, Output::Stored(e), 200, &shape).await
        }
        (Method::GET, name) => list_or_watch(&core, &q, &t, name.as_deref(), shape).await,
        (Method::POST, None) => {
            let opts = write_options(&core, &req, &q)?;
            let ct = content_type(&req);
            let body = read_body(req, core.limits.body_read_timeout).await?;
            let heavy = body.len() > LARGE_WRITE;
            let obj = decode_body(body, &ct, &opts.decode).await?;
            let heavy = heavy || decoded_large(&opts.decode);
            let (c, r, n) = (core.clone(), rt.clone(), t.namespace.clone());
            let w = off_workers(heavy, shape.flow.clone(), async move { c.create(&r, n.as_deref(), obj, &opts).await }).await?;
            Ok(with_warnings(shaped(&core, &rt, w.output, 201, &shape).await?, &w.warnings))
        }
        (Method::PUT, Some(name)) => {
            let opts = write_options(&core, &req, &q)?;
            let ct = content_type(&req);
            let body = read_body(req, core.limits.body_read_timeout).await?;
            let heavy = body.len() > LARGE_WRITE || stored_size(&core, &rt, ns, name) > LARGE_WRITE;
            let obj = decode_body(body, &ct, &opts.decode).await?;
            let heavy = heavy || decoded_large(&opts.decode);
            let (c, r, n, name) = (core.clone(), rt.clone(), t.namespace.clone(), name.clone());
            let w =
                off_workers(heavy, shape.flow.clone(), async move { c.update(&r, n.as_deref(), &name, obj, status, &opts).await }).await?;
            Ok(with_warnings(shaped(&core, &rt, w.output, 200, &shape).await?, &w.warnings))
        }
        (Method::PATCH, Some(name)) => {
            let opts = write_options(&core, &req, &q)?;
            let ct = content_type(&req);
            let kind = PatchType::from_content_type(&ct)?;
            let body = read_body(req, core.limits.body_read_timeout).await?;
            let existed = core.get(&rt, ns, name).is_ok();
            let heavy = body.len() > LARGE_WRITE || stored_size(&core, &rt, ns, name) > LARGE_WRITE || may_expand(kind, &body);
            let (c, r, n, nm) = (core.clone(), rt.clone(), t.namespace.clone(), name.clone());
            let w = off_workers(
                heavy,
                shape.flow.clone(),
                async move { c.patch(&r, n.as_deref(), &nm, kind, &body, &ct, status, &opts).await },
            )
            .await?;
            let code = if existed || kind != PatchType::Apply { 200 } else { 201 };
            Ok(with_warnings(shaped(&core, &rt, w.output, code, &shape).await?, &w.warnings))
        }
        (Method::DELETE, _) => delete(&core, req, &q, &t).await,
        (m, _) => Err(ApiError::method_not_allowed(format!("method {m} is not supported on this path"))),
    }
}

/// A write whose body or stored object is larger than this is a large write ([`off_workers`]).
const LARGE_WRITE: usize = 64 * 1024;

/// Whether a small patch body may make a large object: JSON patch `copy`/`move` operations
/// (each may duplicate a subtree), or YAML aliases in an apply body.
fn may_expand(kind: PatchType, body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Op {
        #[serde(default)]
        op: String,
    }
    match kind {
        // The operations decoded (an escaped `\u0063opy` is a copy too); undecodable: the patch
        // fails anyway, as a large write.
        PatchType::Json => serde_json::from_slice::<Vec<Op>>(body).map_or(true, |ops| ops.iter().any(|o| o.op == "copy" || o.op == "move")),
        PatchType::Apply => body.contains(&b'*'),
        PatchType::Merge | PatchType::Strategic => false,
    }
}

/// A decoded body estimated ([`Meter::charged`]) above this makes its write a large one.
const LARGE_DECODED: usize = 1024 * 1024;

/// Whether a decoded body made its write a large one (YAML aliases expand a small text).
fn decoded_large(meter: &Option<Arc<Meter>>) -> bool {
    meter.as_ref().is_some_and(|m| m.charged() > LARGE_DECODED)
}

/// The stored size of an object (0 when there is none).
fn stored_size(core: &Core, rt: &ResourceType, ns: Option<&str>, name: &str) -> usize {
    core.get(rt, ns, name).map_or(0, |e| e.bytes.len())
}

/// Runs a write; a large one ([`LARGE_WRITE`]) on a blocking thread, [`LARGE_WRITE_SLOTS`] at a time: its
/// CPU-heavy parts (decoding a patch, merging, managedFields, validation, serialisation) then
/// never hold an async worker, which keeps answering health checks, watches and small requests.
/// A flow has at most [`LARGE_WRITES_PER_FLOW`] large writes queued or running (429 beyond),
/// so one identity cannot fill the queue everyone's large writes wait in; exempt identities
/// (`flow` None: the controller) have two turns of their own.
async fn off_workers<T: Send + 'static>(
    heavy: bool,
    flow: Option<String>,
    write: impl Future<Output = ApiResult<T>> + Send + 'static,
) -> ApiResult<T> {
    static LARGE_WRITES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LARGE_WRITE_SLOTS);
    static EXEMPT_LARGE_WRITES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
    static PER_FLOW: std::sync::Mutex<Option<HashMap<String, usize>>> = std::sync::Mutex::new(None);
    if !heavy {
        return write.await;
    }
    // The flow's place in the queue, given back when the write ends (or its request is dropped).
    struct Place(String);
    impl Drop for Place {
        fn drop(&mut self) {
            let mut flows = PER_FLOW.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = flows.get_or_insert_with(HashMap::new).get_mut(&self.0) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    flows.as_mut().map(|f| f.remove(&self.0));
                }
            }
        }
    }
    let (place, queue) = match flow {
        Some(f) => {
            let mut flows = PER_FLOW.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = flows.get_or_insert_with(HashMap::new).entry(f.clone()).or_default();
            if *n >= LARGE_WRITES_PER_FLOW {
                return Err(ApiError::too_many_requests(format!(
                    "{f} has {LARGE_WRITES_PER_FLOW} writes of large objects (over {} KiB) in progress; try again shortly",
                    LARGE_WRITE / 1024
                )));
            }
            *n += 1;
            (Some(Place(f)), &LARGE_WRITES)
        }
        None => (None, &EXEMPT_LARGE_WRITES),
    };
    let turn = queue.acquire().await.map_err(|e| ApiError::internal(format!("waiting for a large write's turn: {e}")))?;
    let runtime = tokio::runtime::Handle::current();
    // The turn and the flow's place go with the work: a client that resets its request stops
    // waiting for the answer, not the write, and must not free its place while it runs.
    tokio::task::spawn_blocking(move || {
        let _held = (turn, place);
        runtime.block_on(write)
    })
    .await
    .map_err(|e| ApiError::internal(format!("a large write failed: {e}")))?
}

/// Large writes of non-exempt flows running at once ([`off_workers`]).
const LARGE_WRITE_SLOTS: usize = 2;

/// Large writes a flow may have queued or running at once ([`off_workers`]): fewer than the
/// slots, so that one flow never holds all of them (a slow write, e.g. a dry-run patch repeated,
/// would otherwise stop every other tenant's large writes).
const LARGE_WRITES_PER_FLOW: usize = LARGE_WRITE_SLOTS - 1;

/// GET, PUT and PATCH of `.../NAME/scale` (see [`crate::scale`]).
// A large object's scale is read and written like any large object: GET decodes it on a
// blocking thread with the decode charged to the request's flow; PUT and PATCH are large writes
// (off_workers: two at a time, one per flow).
async fn scale(
    core: &Arc<Core>,
    req: Request<Incoming>,
    q: &Query,
    rt: &Arc<ResourceType>,
    ns: Option<&str>,
    name: &str,
) -> ApiResult<Response<Body>> {
    let method = req.method().clone();
    let large = stored_size(core, rt, ns, name) > LARGE_WRITE;
    let flow = req.extensions().get::<DecodeFlow>().map(|f| f.0.clone());
    let (c, r, n, nm) = (core.clone(), rt.clone(), ns.map(str::to_string), name.to_string());
    if method == Method::GET {
        if !large {
            return core.get_scale(rt, ns, name).map(|s| value_response(200, &s));
        }
        let charged = match request_meter(core, &req) {
            Some(m) => {
                m.reserve(stored_size(core, rt, ns, name).saturating_mul(provisioning_yaml::bounded::LIMIT_PER_BYTE))
                    .map_err(crate::handlers::decode_refusal)?;
                Some(m)
            }
            None => None,
        };
        return tokio::task::spawn_blocking(move || {
            let _charged = charged;
            c.get_scale(&r, n.as_deref(), &nm).map(|s| value_response(200, &s))
        })
        .await
        .map_err(|e| ApiError::internal(format!("reading the scale: {e}")))?;
    }
    if method != Method::PUT && method != Method::PATCH {
        return Err(ApiError::method_not_allowed(format!("method {method} is not supported on this path")));
    }
    let opts = write_options(core, &req, q)?;
    let ct = content_type(&req);
    let kind = if method == Method::PATCH { Some(PatchType::from_content_type(&ct)?) } else { None };
    let body = read_body(req, core.limits.body_read_timeout).await?;
    let doc = decode_body(body, if kind.is_some() { "application/json" } else { &ct }, &opts.decode).await?;
    let heavy = large || decoded_large(&opts.decode);
    let s = off_workers(heavy, flow, async move {
        match kind {
            Some(k) => c.patch_scale(&r, n.as_deref(), &nm, k, &doc, &opts).await,
            None => c.update_scale(&r, n.as_deref(), &nm, &doc, &opts).await,
        }
    })
    .await?;
    Ok(value_response(200, &s))
}

/// The Kubernetes verb of a resource request (as RBAC and the request counters name it).
fn request_verb(method: &Method, named: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// GET of a collection (or of one name through a watch): selectors, the freshness wait, then
/// a watch stream or a list page.
async fn list_or_watch(core: &Arc<Core>, q: &Query, t: &Target, name: Option<&str>, shape: Shape) -> ApiResult<Response<Body>> {
    let rt = &t.rt;
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
    let mut field_str = q.get("fieldSelector").unwrap_or_default().to_string();
    if let Some(n) = name {
        field_str = if field_str.is_empty() { format!("metadata.name={n}") } else { format!("{field_str},metadata.name={n}") };
    }
    let fields = FieldSelector::parse(&field_str, FieldLabels::for_resource(&rt.storage, &rt.group))?;
    let watching = t.watch || q.flag("watch");
    watch::validate_list_options(watching, |k| q.get(k))?;
    // A list or watch from a revision the store has not reached waits briefly, then
    // is a 504 as in kube-apiserver: never an answer from a state older than asked for.
    if let Some(want) = q.get("resourceVersion").filter(|s| !s.is_empty() && *s != "0").and_then(|s| s.parse::<u64>().ok())
        && q.get("continue").is_none_or(str::is_empty)
    {
        core.wait_fresh(want).await?;
    }
    if watching {
        return Ok(watch_response(core, q, t, labels, fields, shape));
    }
    let limit = q.get("limit").and_then(|s| s.parse::<usize>().ok()).filter(|l| *l > 0);
    let (entries, rv, cont, remaining) = core.list(rt, t.namespace.as_deref(), &labels, &fields, limit, q.get("continue"))?;
    list_response(core, rt, entries, rv, cont, remaining, &shape)
}

/// A list page, streamed a chunk at a time ([`crate::list_body`]): as a Table (rows made one
/// object at a time on a blocking thread), as partial object metadata, or the objects as
/// stored. No shape holds the page twice, nor a decoded copy of every object.
fn list_response(
    core: &Arc<Core>,
    rt: &ResourceType,
    entries: Vec<Arc<Entry>>,
    rv: u64,
    cont: Option<String>,
    remaining: Option<u64>,
    shape: &Shape,
) -> ApiResult<Response<Body>> {
    // Shaping decodes each stored object (one at a time), charged to the request's flow: whether
    // the budget has room for the largest one is asked before the answer starts (429 when it
    // has not); then each chunk is charged while it is made, never while the client reads.
    let converting = entries.iter().any(|e| e.api_version != rt.api_version());
    let charge: Option<list_body::Charge> = match (&shape.meter, shape.flow.clone()) {
        (Some(_), Some(flow)) if shape.table.is_some() || shape.partial || converting => {
            let largest = entries.iter().map(|e| e.bytes.len()).max().unwrap_or_default();
            let per_byte = provisioning_yaml::bounded::LIMIT_PER_BYTE;
            core.meter(Some(flow.clone()))
                .map(|m| m.reserve(largest.saturating_mul(per_byte)))
                .transpose()
                .map_err(crate::handlers::decode_refusal)?;
            let c = core.clone();
            Some(Arc::new(move |largest: usize| {
                let meter = c.meter(Some(flow.clone()))?;
                meter.reserve(largest.saturating_mul(per_byte)).ok()?;
                Some(Box::new(meter) as Box<dyn Send>)
            }))
        }
        _ => None,
    };
    let (head, render, blocking): (Vec<u8>, list_body::Render, bool) = if let Some(inc) = &shape.table {
        let (c, rtype, inc) = (core.clone(), rt.clone(), inc.clone());
        let head = table::table_head(rt, Some(rv.to_string()), cont);
        (
            head,
            Arc::new(move |e: &Entry| serde_json::to_vec(&table::row(&rtype, c.convert(&rtype, e.value()), &inc)).unwrap_or_default()),
            true,
        )
    } else if shape.partial {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(c) = cont {
            meta["continue"] = json!(c);
        }
        let head = format!("{{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{meta},\"items\":[")
            .into_bytes();
        (head, Arc::new(|e: &Entry| serde_json::to_vec(&list_body::partial_object(&e.bytes)).unwrap_or_default()), true)
    } else {
        let (c, rtype) = (core.clone(), rt.clone());
        // Items are the stored bytes (a version conversion parses one object at a time).
        (Core::list_head(rt, rv, cont.as_deref(), remaining), Arc::new(move |e: &Entry| c.render(&rtype, e).to_vec()), converting)
    };
    let mut r = Response::new(list_body::streamed(head, b"]}", entries, render, blocking, charge));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(r)
}

/// A watch: events streamed as they come, from the requested revision.
fn watch_response(core: &Arc<Core>, q: &Query, t: &Target, labels: LabelSelector, fields: FieldSelector, shape: Shape) -> Response<Body> {
    let mut resource_version = q.get("resourceVersion").map(str::to_string);
    // sendInitialEvents=false without a resourceVersion starts at "most recent":
    // no synthetic ADDED events (reflector.go watchList case 1 with the flag off).
    if q.get("sendInitialEvents").is_some() && !q.flag("sendInitialEvents") && resource_version.as_deref().unwrap_or_default().is_empty() {
        resource_version = Some(core.store.read().rv.to_string());
    }
    let params = watch::WatchParams {
        resource_version,
        namespace: t.namespace.clone(),
        labels,
        fields,
        bookmarks: q.flag("allowWatchBookmarks"),
        timeout: Some(watch_timeout(q.get("timeoutSeconds"), core.limits.min_request_timeout)),
        send_initial_events: q.flag("sendInitialEvents"),
        partial: shape.partial && shape.table.is_none(),
        table: shape.table,
        flow: shape.flow,
    };
    let rx = watch::start(core.clone(), t.rt.clone(), params);
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.next().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx)) });
    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    r
}

/// How long a watch lasts: without `timeoutSeconds` (or with 0) a random 1x–2x of
/// `min_request_timeout`, spreading re-lists as kube-apiserver does (30–60 min); a client's
/// own value at most 2x, so no client keeps a watch (and its place) open for as long as it
/// likes.
fn watch_timeout(requested: Option<&str>, min_request_timeout: Duration) -> Duration {
    let min = min_request_timeout.max(Duration::from_secs(1));
    let max = min * 2;
    match requested.and_then(|s| s.parse::<u64>().ok()).filter(|s| *s > 0) {
        Some(secs) => Duration::from_secs(secs).min(max),
        None => min + Duration::from_millis(rand::random_range(0..min.as_millis() as u64)),
    }
}

/// DELETE of one object, or of the collection (deletecollection) matching the selectors.
async fn delete(core: &Arc<Core>, req: Request<Incoming>, q: &Query, t: &Target) -> ApiResult<Response<Body>> {
    let rt = &t.rt;
    let ns = t.namespace.as_deref();
    let ct = content_type(&req);
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default(), FieldLabels::for_resource(&rt.storage, &rt.group))?;
    let meter = request_meter(core, &req);
    let req_flow = req.extensions().get::<DecodeFlow>().map(|f| f.0.clone());
    let body = read_body(req, core.limits.body_read_timeout).await?;
    let dopts: Value = if body.iter().all(u8::is_ascii_whitespace) { json!({}) } else { decode_body(body, &ct, &meter).await? };
    let opts = delete_options(q, &dopts)?;
    match &t.name {
        Some(name) => {
            // Deleting a large object decodes and may rewrite it: a large write.
            let heavy = stored_size(core, rt, ns, name) > LARGE_WRITE;
            let flow = req_flow.clone();
            let (c, r, n, nm) = (core.clone(), rt.clone(), t.namespace.clone(), name.clone());
            let out = off_workers(heavy, flow, async move {
                let out = c.delete(&r, n.as_deref(), &nm, &opts).await?;
                Ok(single(&c, &r, &out, 200, &None))
            })
            .await?;
            Ok(out)
        }
        None => {
            let (entries, rv, _, _) = core.list(rt, ns, &labels, &fields, None, None)?;
            // Each object's delete decodes it: a large one is a large write of its own (the
            // flow's turns, not an async worker). The answer lists the deleted objects while they
            // are small together; beyond that it is a Status (as upstream answers a collection
            // delete that returns no list), so a slow reader holds no copy of what was deleted.
            let mut deleted = vec![];
            let (mut total, mut listed) = (0usize, true);
            for e in entries {
                let ens = if rt.namespaced { Some(e.key.namespace.clone()) } else { None };
                let (c, r, nm, o) = (core.clone(), rt.clone(), e.key.name.clone(), opts.clone());
                let heavy = e.bytes.len() > LARGE_WRITE;
                match off_workers(heavy, req_flow.clone(), async move { c.delete(&r, ens.as_deref(), &nm, &o).await.map(|_| ()) }).await {
                    Ok(()) => {
                        total = total.saturating_add(e.bytes.len());
                        listed = listed && total <= LARGE_WRITE;
                        if listed {
                            deleted.push(e);
                        } else {
                            deleted.clear();
                        }
                    }
                    Err(err) if err.code == 404 => {}
                    Err(err) => return Err(err),
                }
            }
            if !listed {
                let details = json!({"group": rt.group, "kind": rt.plural});
                return Ok(value_response(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200, "details": details}),
                ));
            }
            Ok(json_response(200, core.list_body(rt, &deleted, rv, None, None)))
        }
    }
}

/// DeleteOptions from the body (`dopts`) and the query: propagation, dry run, preconditions.
fn delete_options(q: &Query, dopts: &Value) -> ApiResult<DeleteOptions> {
    let dry_q = q.get("dryRun") == Some("All");
    let prop_q = q.get("propagationPolicy").map(str::to_string);
    let policy = dopts["propagationPolicy"].as_str().map(str::to_string).or(prop_q);
    let propagation = match policy.as_deref() {
        None | Some("") | Some("Background") => {
            if dopts["orphanDependents"].as_bool() == Some(true) {
                Propagation::Orphan
            } else {
                Propagation::Background
            }
        }
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => return Err(ApiError::bad_request(format!("unsupported propagationPolicy: {other}"))),
    };
    let dry_run = dry_q || dopts["dryRun"].as_array().is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok(DeleteOptions {
        propagation,
        dry_run,
        uid: dopts["preconditions"]["uid"].as_str().map(str::to_string),
        resource_version: dopts["preconditions"]["resourceVersion"].as_str().map(str::to_string),
    })
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers().get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("application/json").to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_flow_never_holds_every_large_write_slot() {
        const { assert!(super::LARGE_WRITES_PER_FLOW < super::LARGE_WRITE_SLOTS) };
        assert_eq!(super::LARGE_WRITES_PER_FLOW, 1);
    }

    #[test]
    fn warnings_are_capped_by_count_and_bytes() {
        let many: Vec<String> = (0..20_000).map(|i| format!("unknown field \"spec.u{i}\"")).collect();
        let out = super::capped_warnings(&many);
        assert_eq!(out.len(), super::MAX_WARNINGS);
        assert_eq!(out[super::MAX_WARNINGS - 1], format!("... and {} more warnings", 20_000 - (super::MAX_WARNINGS - 1)));
        let long: Vec<String> = (0..40).map(|i| format!("{i}{}", "x".repeat(1000))).collect();
        let out = super::capped_warnings(&long);
        assert!(out.iter().map(String::len).sum::<usize>() <= super::MAX_WARNING_BYTES + 64, "{out:?}");
        assert!(out.iter().all(|w| w.len() <= 256 || w.starts_with("...")), "cut to 256 characters");
        assert!(out.last().is_some_and(|w| w.contains("more warnings")), "{out:?}");
        // A few short ones: each once, as they were.
        let few = vec!["a".to_string(), "b".to_string(), "a".to_string()];
        assert_eq!(super::capped_warnings(&few), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn a_media_type_parameter_does_not_make_a_body_yaml() {
        use provisioning_yaml::bounded::Meter;
        let meter = Meter::unshared();
        let yaml_only = b"a: &x [1]\nb: *x\n";
        assert!(crate::handlers::parse_body(yaml_only, "application/merge-patch+json; x=yaml", &meter).is_err(), "JSON only");
        assert!(crate::handlers::parse_body(yaml_only, "application/yaml; charset=utf-8", &meter).is_ok());
        assert!(crate::handlers::parse_body(br#"{"a":1}"#, "application/json; x=yaml", &meter).is_ok());
    }

    #[test]
    fn a_patch_that_may_make_a_large_object_is_a_large_write() {
        use super::{PatchType, may_expand};
        assert!(may_expand(PatchType::Json, br#"[{"op":"copy","from":"/a","path":"/b"}]"#));
        assert!(may_expand(PatchType::Json, br#"[{"op":"\u0063opy","from":"/a","path":"/b"}]"#), "escaped");
        assert!(!may_expand(PatchType::Json, br#"[{"op":"replace","path":"/a","value":"copy"}]"#));
        assert!(may_expand(PatchType::Apply, b"a: &x [1]\nb: *x\n"));
        assert!(!may_expand(PatchType::Merge, b"{}"));
    }

    use super::*;

    #[test]
    fn a_watch_lasts_one_to_two_minimum_request_timeouts_and_a_client_cannot_ask_for_more() {
        let min = Duration::from_secs(1800);
        for _ in 0..100 {
            let t = watch_timeout(None, min);
            assert!(t >= min && t < min * 2, "{t:?}");
            let t = watch_timeout(Some("0"), min);
            assert!(t >= min && t < min * 2, "0 is no timeout of the client's: {t:?}");
        }
        assert_eq!(watch_timeout(Some("60"), min), Duration::from_secs(60));
        assert_eq!(watch_timeout(Some("86400"), min), min * 2);
        assert_eq!(watch_timeout(Some(&u64::MAX.to_string()), min), min * 2);
        assert!(watch_timeout(Some("junk"), min) >= min);
    }
}
