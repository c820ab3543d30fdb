//! An HTTP proxy on 127.0.0.1 between providers and their API double (moto, the UpCloud
//! double) that tells accounts apart by the principal each request authenticates as (the
//! AWS access key id in the SigV4 `Credential=`, the UpCloud API user in basic auth), counts
//! requests and the most in flight at once per principal, records arrival times, answers
//! one principal's requests with a throttling response (429 / 503 RequestLimitExceeded with
//! Retry-After), and can hold requests until a number of them are in flight at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// A throttling answer for one principal.
#[derive(Clone, Debug)]
pub struct Throttle {
    /// The principal throttled.
    pub principal: String,
    /// Status sent (429, or 503 as EC2 sends RequestLimitExceeded).
    pub status: u16,
    /// Retry-After sent, if any.
    pub retry_after: Option<String>,
    /// Body sent.
    pub body: String,
    /// Throttle only this many of the principal's first requests (`None`: all of them).
    pub first: Option<u64>,
}

/// See [`ProxyConfig::hold`].
#[derive(Clone, Copy, Debug)]
pub struct Hold {
    /// Requests of the principal in flight that release the held ones.
    pub target: u64,
    /// Requests the principal makes in all (the last ones are released without the target).
    pub total: u64,
    /// Longest hold.
    pub patience: Duration,
}

/// What the proxy does.
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    /// Throttle one principal.
    pub throttle: Option<Throttle>,
    /// Hold each request until its principal has `target` requests in flight or has made
    /// `total` requests (the last ones), or `patience` passed (a safety net only): makes a
    /// concurrency cap observable without timing assumptions.
    pub hold: Option<Hold>,
    /// Forward with these basic-auth credentials (the UpCloud double knows one user only).
    pub upstream_basic_auth: Option<(String, String)>,
}

/// What one principal did.
#[derive(Clone, Debug, Default)]
pub struct PrincipalStats {
    /// Requests received.
    pub requests: u64,
    /// Requests answered with the throttling response.
    pub throttled: u64,
    /// In flight now.
    pub in_flight: u64,
    /// Most in flight at once.
    pub max_in_flight: u64,
    /// When each request arrived.
    pub arrivals: Vec<Instant>,
}

/// A running proxy; stops when dropped.
pub struct LimitProxy {
    /// `http://127.0.0.1:<port>/`.
    pub endpoint: String,
    stats: Arc<Mutex<HashMap<String, PrincipalStats>>>,
    changed: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LimitProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// EC2's throttling error document.
pub const EC2_THROTTLED: &str = "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>limit</RequestID></Response>";

/// The principal a request authenticates as: the SigV4 access key id or the basic-auth user.
pub fn principal(authorization: &str) -> String {
    if let Some(basic) = authorization.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(basic.trim()).unwrap_or_default();
        let text = String::from_utf8_lossy(&decoded).to_string();
        return text.split(':').next().unwrap_or_default().to_string();
    }
    authorization.split("Credential=").nth(1).and_then(|rest| rest.split('/').next()).unwrap_or_default().to_string()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LimitProxy {
    /// Starts a proxy in front of `upstream` (e.g. `http://127.0.0.1:5000`).
    pub async fn start(upstream: &str, config: ProxyConfig) -> std::io::Result<LimitProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let stats: Arc<Mutex<HashMap<String, PrincipalStats>>> = Arc::default();
        let changed = Arc::new(tokio::sync::Notify::new());
        let upstream = upstream.trim_end_matches('/').to_string();
        // No idle upstream connections kept: a connection the double closed while idle would
        // fail the next forward (a proxy artefact, not something the provider under test did).
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().map_err(std::io::Error::other)?;
        let shared = Arc::new((stats.clone(), changed.clone(), upstream, client, config));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let shared = shared.clone();
                        async move {
                            let (stats, changed, upstream, client, config) = &*shared;
                            handle(req, stats, changed, upstream, client, config).await
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(LimitProxy { endpoint: format!("http://127.0.0.1:{port}/"), stats, changed, task })
    }

    /// What `principal` did so far.
    pub fn stats(&self, principal: &str) -> PrincipalStats {
        lock(&self.stats).get(principal).cloned().unwrap_or_default()
    }

    /// Waits until `principal` made at least `n` requests; false when `deadline` passed first.
    pub async fn wait_for_requests(&self, principal: &str, n: u64, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.changed.notified();
            if self.stats(principal).requests >= n {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return self.stats(principal).requests >= n;
            }
        }
    }
}

#[derive(Debug)]
struct Dropped;
impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the limit proxy could not forward the request")
    }
}
impl std::error::Error for Dropped {}

fn response(status: u16, retry_after: Option<&str>, body: &str) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(status);
    if let Some(value) = retry_after {
        builder = builder.header("retry-after", value);
    }
    builder.body(Full::new(Bytes::from(body.to_string()))).unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Counts the request out of flight when dropped (also when the client hangs up).
struct InFlight<'a> {
    stats: &'a Mutex<HashMap<String, PrincipalStats>>,
    changed: &'a tokio::sync::Notify,
    principal: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(s) = lock(self.stats).get_mut(&self.principal) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
        self.changed.notify_waiters();
    }
}

async fn handle(
    req: Request<Incoming>,
    stats: &Mutex<HashMap<String, PrincipalStats>>,
    changed: &tokio::sync::Notify,
    upstream: &str,
    client: &reqwest::Client,
    config: &ProxyConfig,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let who = principal(req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default());
    let throttle = {
        let mut all = lock(stats);
        let s = all.entry(who.clone()).or_default();
        s.requests += 1;
        s.in_flight += 1;
        s.max_in_flight = s.max_in_flight.max(s.in_flight);
        s.arrivals.push(Instant::now());
        let throttle = config.throttle.as_ref().filter(|t| t.principal == who && t.first.is_none_or(|n| s.requests <= n)).cloned();
        if throttle.is_some() {
            s.throttled += 1;
        }
        throttle
    };
    let _in_flight = InFlight { stats, changed, principal: who.clone() };
    changed.notify_waiters();
    if let Some(t) = throttle {
        return Ok(response(t.status, t.retry_after.as_deref(), &t.body));
    }
    if let Some(hold) = config.hold {
        let until = tokio::time::Instant::now() + hold.patience;
        loop {
            let notified = changed.notified();
            let (in_flight, requests) = lock(stats).get(&who).map_or((0, 0), |s| (s.in_flight, s.requests));
            if in_flight >= hold.target || requests >= hold.total || tokio::time::timeout_at(until, notified).await.is_err() {
                break;
            }
        }
    }
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
    let path = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let mut forward = client.request(parts.method.clone(), format!("{upstream}{path}")).body(body.to_vec());
    for (name, value) in &parts.headers {
        let replaced = name == "authorization" && config.upstream_basic_auth.is_some();
        if name != "content-length" && name != "host" && !replaced {
            forward = forward.header(name, value);
        }
    }
    if let Some((user, password)) = &config.upstream_basic_auth {
        forward = forward.basic_auth(user, Some(password));
    }
    let upstream_response = forward.send().await.map_err(|e| {
        eprintln!("limit proxy: forwarding to {upstream} failed: {e}");
        Dropped
    })?;
    let status = upstream_response.status();
    let headers = upstream_response.headers().clone();
    let bytes = upstream_response.bytes().await.map_err(|_| Dropped)?;
    let mut builder = Response::builder().status(status.as_u16());
    for (name, value) in &headers {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            builder = builder.header(name, value);
        }
    }
    Ok(builder.body(Full::new(bytes)).unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}
