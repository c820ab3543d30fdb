//! HTTPS listener and routing. Nothing but the sign-in page and the static assets is served
//! without a session; actions are POSTs that carry the session's CSRF token, are checked with a
//! SelfSubjectAccessReview and then made with the visitor's own token.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use secrecy::SecretString;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::api::{self, ApiFailure, Kind};
use super::pages::{self, Page};
use super::render::{self, APPROVE, Layout, PAUSED, RECONCILE};
use super::session::{self, Session};
use super::{ConsoleState, limits, live};

type Body = BoxBody<Bytes, Infallible>;

const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");
/// Largest form accepted (a token is a few KB).
const MAX_FORM: usize = 64 * 1024;

/// Accepts connections until `shutdown` is cancelled, within the connection caps of
/// [`ConsoleState::limits`].
pub async fn serve(state: Arc<ConsoleState>, listener: TcpListener, tls: Arc<rustls::ServerConfig>, shutdown: CancellationToken) {
    let acceptor = TlsAcceptor::from(tls);
    let mut refusing = false;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => return,
        };
        let Ok((tcp, peer)) = accepted else {
            // Out of file descriptors and the like: wait instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Some(conn) = state.connections.open(peer.ip(), shutdown.child_token()) else {
            // Logged once per burst of refusals.
            if !refusing {
                tracing::warn!(peer = %peer.ip(), "console connection cap reached with every connection busy; refusing connections");
            }
            refusing = true;
            continue;
        };
        refusing = false;
        tokio::spawn(serve_connection(state.clone(), acceptor.clone(), tcp, peer.ip(), conn));
    }
}

/// A response body that marks its connection busy until it is dropped (a live stream's for
/// as long as it streams).
struct Busy {
    inner: Body,
    _request: limits::RequestGuard,
}

impl hyper::body::Body for Busy {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// One connection: the TLS handshake (10 s), then HTTP/1.1 until the client closes it, it is
/// idle for [`limits::ConsoleLimits::idle_timeout`], it is evicted at a cap or the console stops.
async fn serve_connection(
    state: Arc<ConsoleState>,
    acceptor: TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: std::net::IpAddr,
    conn: limits::ConnGuard,
) {
    let close = conn.0.close.clone();
    let handshake = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)) => r.ok().and_then(Result::ok),
        _ = close.cancelled() => None,
    };
    let Some(tls) = handshake else { return };
    let lim = state.limits.clone();
    let tracked = conn.0.clone();
    let svc = hyper::service::service_fn(move |req| {
        let (state, request) = (state.clone(), tracked.request());
        async move {
            let resp = secure_headers(handle(state, peer, req).await);
            Ok::<_, Infallible>(resp.map(|inner| Busy { inner, _request: request }.boxed()))
        }
    });
    let http = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(lim.header_read_timeout)
        .serve_connection(TokioIo::new(tls), svc);
    tokio::pin!(http);
    let mut ticker = tokio::time::interval((lim.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5)));
    let mut closing_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = http.as_mut() => break,
            _ = close.cancelled(), if closing_since.is_none() => {
                http.as_mut().graceful_shutdown();
                closing_since = Some(tokio::time::Instant::now());
            }
            _ = ticker.tick() => match closing_since {
                // A client that ignores the close is dropped after a grace period.
                Some(t) if t.elapsed() > Duration::from_secs(5) => break,
                Some(_) => {}
                None if conn.0.idle_for(lim.idle_timeout) => close.cancel(),
                None => {}
            },
        }
    }
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

fn html(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    r
}

fn redirect(to: &str) -> Response<Body> {
    let mut r = Response::new(full(""));
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn with_cookie(mut r: Response<Body>, cookie: &str) -> Response<Body> {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

/// Headers on every answer: no framing, no sniffing, scripts and styles only from the console,
/// no referrer to other sites ("no-referrer" would also make browsers send `Origin: null`).
fn secure_headers(mut r: Response<Body>) -> Response<Body> {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::STRICT_TRANSPORT_SECURITY, HeaderValue::from_static("max-age=31536000"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    r
}

fn asset(content_type: &'static str, body: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn query_param(req: &Request<Incoming>, key: &str) -> Option<String> {
    form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
}

/// The form of a POST: at most [`MAX_FORM`] bytes, all of them within `timeout` (a client
/// trickling a body would hold its connection and a task forever; 408 after it).
async fn read_form(req: Request<Incoming>, timeout: Duration) -> Result<HashMap<String, String>, Response<Body>> {
    read_form_body(req.into_body(), timeout).await
}

async fn read_form_body<B>(body: B, timeout: Duration) -> Result<HashMap<String, String>, Response<Body>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let body = match tokio::time::timeout(timeout, Limited::new(body, MAX_FORM).collect()).await {
        Err(_) => {
            let m = format!("The form did not arrive within {} s.", timeout.as_secs());
            return Err(html(StatusCode::REQUEST_TIMEOUT, render::message_page("Request timeout", &m)));
        }
        Ok(Err(_)) => {
            return Err(html(
                StatusCode::PAYLOAD_TOO_LARGE,
                render::message_page("Form too large", "The form is larger than the console accepts."),
            ));
        }
        Ok(Ok(b)) => b.to_bytes(),
    };
    Ok(form_urlencoded::parse(&body).into_owned().collect())
}

/// A POST whose Origin is another site is refused (with SameSite=Strict and the CSRF token,
/// a third line of defence; it also covers the sign-in form, which has no session yet).
fn foreign_origin(req: &Request<Incoming>) -> bool {
    let (Some(origin), Some(host)) = (req.headers().get(header::ORIGIN), req.headers().get(header::HOST)) else { return false };
    origin.to_str().ok() != host.to_str().ok().map(|h| format!("https://{h}")).as_deref()
}

fn forbidden(message: &str) -> Response<Body> {
    html(StatusCode::FORBIDDEN, render::message_page("Forbidden", message))
}

/// The session named by the request's cookie.
fn session_of(state: &ConsoleState, req: &Request<Incoming>) -> Option<(String, Arc<Session>)> {
    let cookies = req.headers().get_all(header::COOKIE);
    let id = cookies.iter().filter_map(|v| v.to_str().ok()).find_map(session::cookie_value)?.to_string();
    let s = state.sessions.get(&id)?;
    Some((id, s))
}

/// Back to the sign-in page, forgetting the session (its token is no longer accepted).
fn sign_in_again(state: &ConsoleState, id: &str) -> Response<Body> {
    state.sessions.remove(id);
    with_cookie(redirect("/login"), &session::clear_cookie())
}

/// The answer to a failed API call on a page or action.
fn failure(state: &ConsoleState, id: &str, e: ApiFailure) -> Response<Body> {
    match e {
        ApiFailure::Unauthorized => sign_in_again(state, id),
        ApiFailure::Forbidden(m) => forbidden(&format!("Your token may not do this: {m}")),
        ApiFailure::NotFound(m) => html(StatusCode::NOT_FOUND, render::message_page("Not found", &m)),
        ApiFailure::Other(m) => html(StatusCode::BAD_GATEWAY, render::message_page("API server error", &m)),
    }
}

async fn handle(state: Arc<ConsoleState>, peer: std::net::IpAddr, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let attempt = (path == "/login" && (req.method() == Method::POST || req.uri().query().is_some_and(|q| q.contains("code="))))
        .then(|| state.sign_in.attempt(peer));
    if let Some(Err(wait)) = attempt {
        return sign_in_limited(&state, peer, wait);
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/static/console.js") => return asset("text/javascript; charset=utf-8", CONSOLE_JS),
        (Method::GET, "/static/console.css") => return asset("text/css; charset=utf-8", CONSOLE_CSS),
        (Method::GET, "/login") => return login_get(&state, &req).await,
        (Method::POST, "/login") => return login_post(&state, req).await,
        _ => {}
    }
    let Some((id, session)) = session_of(&state, &req) else {
        return match (req.method(), path.strip_prefix("/live")) {
            (&Method::GET, Some(_)) => sse_response(live::auth_required()),
            (&Method::GET, None) => redirect("/login"),
            _ => forbidden("Sign in first."),
        };
    };
    match (req.method().clone(), path.as_str()) {
        (Method::POST, "/logout") => {
            let form = match read_form(req, state.limits.body_read_timeout).await {
                Ok(f) => f,
                Err(r) => return r,
            };
            if !form.get("csrf").is_some_and(|c| session::constant_time_eq(c, &session.csrf)) {
                return forbidden("The form is stale or forged (CSRF token mismatch).");
            }
            sign_in_again(&state, &id)
        }
        (Method::POST, "/actions") => {
            if foreign_origin(&req) {
                return forbidden("Cross-site request refused.");
            }
            match read_form(req, state.limits.body_read_timeout).await {
                Ok(form) => action(&state, &id, &session, form).await,
                Err(r) => r,
            }
        }
        (Method::GET, p) if p.starts_with("/live/") || p == "/live" => match Page::parse(p.strip_prefix("/live").unwrap_or("/")) {
            Some(page) => match state.streams.acquire(&session.streams, &session.user) {
                Ok(slot) => sse_response(live::stream(state.clone(), id, session, page, slot)),
                Err(refused) => too_many(&refused),
            },
            None => html(StatusCode::NOT_FOUND, render::message_page("Not found", "No such page.")),
        },
        (Method::GET, p) if p.ends_with("/delete") => match Page::parse(p.trim_end_matches("/delete")) {
            Some(Page::Object { kind, namespace, name }) => {
                let (title, crumbs) = Page::Object { kind, namespace: namespace.clone(), name: name.clone() }.title();
                let layout = Layout {
                    title: &format!("Delete {title}?"),
                    user: &session.user,
                    csrf: &session.csrf,
                    crumbs,
                    path: p,
                    now: Utc::now(),
                };
                let body = render::delete_confirm(kind, namespace.as_deref(), &name, &session.csrf);
                // No live stream on a confirmation page.
                html(StatusCode::OK, render::page(&layout, &body).replace(" data-live=\"", " data-static=\""))
            }
            _ => html(StatusCode::NOT_FOUND, render::message_page("Not found", "No such page.")),
        },
        (Method::GET, p) => match Page::parse(p) {
            Some(page) => match pages::live_fragment(&session, &page).await {
                Ok(fragment) => {
                    let (title, crumbs) = page.title();
                    let path = page.path();
                    let layout = Layout { title: &title, user: &session.user, csrf: &session.csrf, crumbs, path: &path, now: Utc::now() };
                    html(StatusCode::OK, render::page(&layout, &fragment))
                }
                Err(e) => failure(&state, &id, e),
            },
            None => html(StatusCode::NOT_FOUND, render::message_page("Not found", "No such page.")),
        },
        _ => html(StatusCode::METHOD_NOT_ALLOWED, render::message_page("Method not allowed", "Use the page's buttons.")),
    }
}

/// 429 with a plain-text body naming the limit (an EventSource gives up on it, as it should).
fn too_many(refused: &live::Refused) -> Response<Body> {
    let mut r = Response::new(full(format!("{refused}\n")));
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
    r
}

fn sse_response(body: live::SseBody) -> Response<Body> {
    let mut r = Response::new(body.boxed());
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r
}

/// The data directory of `provisioning dev`, named on the sign-in page.
fn dev_dir(state: &ConsoleState) -> Option<&std::path::Path> {
    state.dev.as_ref().map(|d| d.data_dir.as_path())
}

/// `GET /login`: the form, or with `?code=` a one-time code exchanged for a session.
async fn login_get(state: &ConsoleState, req: &Request<Incoming>) -> Response<Body> {
    let hint = dev_dir(state);
    let Some(code) = query_param(req, "code") else {
        return html(StatusCode::OK, render::login_page(None, hint));
    };
    let from_file = || state.dev.as_ref().filter(|d| super::login_codes::redeem(&d.data_dir, &code)).map(|d| d.admin.clone());
    match state.sessions.redeem(&code).or_else(from_file) {
        Some(token) => open_session(state, token).await,
        None => html(
            StatusCode::UNAUTHORIZED,
            render::login_page(Some("This sign-in link was used already or is unknown: sign in with a token."), hint),
        ),
    }
}

/// `POST /login`: a pasted token.
async fn login_post(state: &ConsoleState, req: Request<Incoming>) -> Response<Body> {
    if foreign_origin(&req) {
        return forbidden("Cross-site request refused.");
    }
    let form = match read_form(req, state.limits.body_read_timeout).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let token = form.get("token").map(|t| t.trim().to_string()).unwrap_or_default();
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return html(StatusCode::BAD_REQUEST, render::login_page(Some("Paste a bearer token: one line, no spaces."), dev_dir(state)));
    }
    open_session(state, SecretString::from(token)).await
}

/// 429 for a peer out of sign-in attempts, saying when to try again.
fn sign_in_limited(state: &ConsoleState, peer: std::net::IpAddr, wait: Duration) -> Response<Body> {
    let secs = wait.as_secs().max(1);
    tracing::debug!(%peer, retry_after = secs, "console sign-in attempts limited");
    let m = format!("Too many sign-in attempts from your address: try again in {secs} s.");
    let mut r = html(StatusCode::TOO_MANY_REQUESTS, render::login_page(Some(&m), dev_dir(state)));
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// Checks the token with the API server (SelfSubjectReview, through the one shared sign-in
/// client) and opens a session for it with a client of its own.
async fn open_session(state: &ConsoleState, token: SecretString) -> Response<Body> {
    let user = match api::whoami(&state.sign_in_client, &token).await {
        Ok(user) => user,
        // Authenticated, only not allowed to ask who it is.
        Err(ApiFailure::Forbidden(_)) => "unknown user".into(),
        Err(ApiFailure::Unauthorized) => {
            return html(
                StatusCode::UNAUTHORIZED,
                render::login_page(Some("The API server did not accept this token (401)."), dev_dir(state)),
            );
        }
        Err(e) => {
            return html(StatusCode::BAD_GATEWAY, render::login_page(Some(&format!("Cannot reach the API server: {e}")), dev_dir(state)));
        }
    };
    let client = match api::visitor_client(&state.api, token.clone()) {
        Ok(c) => c,
        Err(e) => return html(StatusCode::BAD_GATEWAY, render::login_page(Some(&e.to_string()), dev_dir(state))),
    };
    tracing::info!(%user, "console sign-in");
    match state.sessions.insert(Session::new(token, client, user)) {
        Ok(id) => with_cookie(redirect("/"), &session::set_cookie(&id)),
        Err(full) => {
            let mut r = html(StatusCode::SERVICE_UNAVAILABLE, render::login_page(Some(&full.to_string()), dev_dir(state)));
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            r
        }
    }
}

/// What an action does to the object.
enum Change {
    Annotate(&'static str, Option<String>),
    Delete,
}

/// `POST /actions`: CSRF check, SelfSubjectAccessReview, then the change with the visitor's token.
async fn action(state: &ConsoleState, id: &str, session: &Session, form: HashMap<String, String>) -> Response<Body> {
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();
    if !session::constant_time_eq(field("csrf"), &session.csrf) {
        return forbidden("The form is stale or forged (CSRF token mismatch).");
    }
    let Some(kind) = Kind::from_plural(field("kind")) else {
        return html(StatusCode::BAD_REQUEST, render::message_page("Bad request", &format!("unknown kind {:?}", field("kind"))));
    };
    let name = field("name");
    let namespace = (kind != Kind::Workspace).then(|| field("namespace"));
    if !pages::valid_name(name) || namespace.is_some_and(|ns| !pages::valid_name(ns)) {
        return html(StatusCode::BAD_REQUEST, render::message_page("Bad request", "name or namespace missing or invalid"));
    }
    // Each verb the action needs, asked with a SelfSubjectAccessReview.
    let (verbs, change): (&[&str], Change) = match field("action") {
        "approve" => {
            let plan = field("plan");
            let current = match api::get(&session.client, kind, namespace, name).await {
                Ok(o) => o["status"]["plan"]["id"].as_str().unwrap_or_default().to_string(),
                Err(e) => return failure(state, id, e),
            };
            if plan.is_empty() || plan != current {
                let m = format!(
                    "The plan changed since the page was drawn (you approved {plan:?}, the current one is {current:?}): review it again."
                );
                return html(StatusCode::CONFLICT, render::message_page("Plan changed", &m));
            }
            (&["patch", api::APPROVE_VERB], Change::Annotate(APPROVE, Some(plan.to_string())))
        }
        "pause" => (&["patch"], Change::Annotate(PAUSED, Some("true".into()))),
        "resume" => (&["patch"], Change::Annotate(PAUSED, None)),
        "reconcile" => (&["patch"], Change::Annotate(RECONCILE, Some(Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))),
        "delete" if field("confirm") == name => (&["delete"], Change::Delete),
        "delete" => return html(StatusCode::BAD_REQUEST, render::message_page("Not confirmed", "Deleting needs the confirmation page.")),
        other => return html(StatusCode::BAD_REQUEST, render::message_page("Bad request", &format!("unknown action {other:?}"))),
    };
    for verb in verbs {
        match api::may(&session.client, verb, kind, namespace, name).await {
            Ok(true) => {}
            Ok(false) => {
                let scope = namespace.map(|ns| format!(" in namespace {ns}")).unwrap_or_default();
                return forbidden(&format!("{} may not {verb} {} {name}{scope}.", session.user, kind.plural()));
            }
            Err(e) => return failure(state, id, e),
        }
    }
    let done = match &change {
        Change::Annotate(key, value) => api::annotate(&session.client, kind, namespace, name, key, value.as_deref()).await,
        Change::Delete => api::delete(&session.client, kind, namespace, name).await,
    };
    match done {
        Ok(()) => {
            tracing::info!(user = %session.user, action = field("action"), kind = kind.name(), namespace = namespace.unwrap_or_default(), name, "console action");
            match change {
                Change::Delete => redirect("/"),
                Change::Annotate(..) => redirect(&render::object_path(kind, namespace, name)),
            }
        }
        Err(e) => failure(state, id, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_form_that_never_ends_is_408_and_a_large_one_413() -> anyhow::Result<()> {
        // A body that sends a few bytes and then nothing, as a slowloris client does.
        let first = futures::stream::iter([Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from_static(b"token=ab")))]);
        let trickle = http_body_util::StreamBody::new(futures::StreamExt::chain(first, futures::stream::pending()));
        let started = std::time::Instant::now();
        // The outer timeout turns a read that never ends into a failure instead of a hang.
        let refused = tokio::time::timeout(Duration::from_secs(5), read_form_body(trickle, Duration::from_millis(200)))
            .await
            .map_err(|_| anyhow::anyhow!("reading a form that never ends did not stop within 5 s"))?
            .err()
            .ok_or_else(|| anyhow::anyhow!("a form that never ended was read"))?;
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        let large = Full::new(Bytes::from(vec![b'a'; MAX_FORM + 1]));
        let refused = read_form_body(large, Duration::from_secs(5)).await.err().ok_or_else(|| anyhow::anyhow!("a large form was read"))?;
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let form = read_form_body(Full::new(Bytes::from_static(b"token=abc&csrf=x")), Duration::from_secs(5))
            .await
            .map_err(|r| anyhow::anyhow!("{}", r.status()))?;
        assert_eq!(form.get("token").map(String::as_str), Some("abc"));
        Ok(())
    }
}
