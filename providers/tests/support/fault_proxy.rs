//! An HTTP proxy on 127.0.0.1 between a provider and its API that injects failures:
//! HTTP 500, 503 and 429 (with Retry-After), connections dropped before the request is
//! forwarded, and responses lost after it was forwarded (the request took effect, the
//! client never hears of it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rand::Rng;

/// What the proxy does.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Share of requests that fail, 0.0..=1.0 (spread evenly over the five kinds).
    pub failure_rate: f64,
    /// Retry-After sent with 429 and 503.
    pub retry_after: String,
    /// Forward the first request whose body or path contains this, then drop its response.
    pub lose_first_response_of: Option<String>,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig { failure_rate: 0.0, retry_after: "1".into(), lose_first_response_of: None }
    }
}

/// Counters of what passed through.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests received.
    pub requests: AtomicU64,
    /// Requests forwarded upstream.
    pub forwarded: AtomicU64,
    /// Injected 500s.
    pub injected_500: AtomicU64,
    /// Injected 503s.
    pub injected_503: AtomicU64,
    /// Injected 429s.
    pub injected_429: AtomicU64,
    /// Connections dropped before forwarding.
    pub dropped_before: AtomicU64,
    /// Responses lost after forwarding.
    pub dropped_after: AtomicU64,
    /// Requests per action (EC2 `Action=`, else `METHOD /path`).
    pub actions: Mutex<HashMap<String, u64>>,
}

impl Stats {
    /// Requests seen for one action.
    pub fn action(&self, name: &str) -> u64 {
        self.actions.lock().map(|a| a.get(name).copied().unwrap_or(0)).unwrap_or(0)
    }
    /// Failures injected in total.
    pub fn injected(&self) -> u64 {
        [&self.injected_500, &self.injected_503, &self.injected_429, &self.dropped_before, &self.dropped_after]
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>/`.
    pub endpoint: String,
    /// Counters.
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn response(status: u16, retry_after: Option<&str>, body: &str) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(status).header("content-type", "text/xml");
    if let Some(value) = retry_after {
        builder = builder.header("retry-after", value);
    }
    builder.body(Full::new(Bytes::from(body.to_string()))).unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

const INTERNAL_ERROR: &str = "<Response><Errors><Error><Code>InternalError</Code><Message>injected</Message></Error></Errors><RequestID>fault</RequestID></Response>";
const UNAVAILABLE: &str =
    "<Response><Errors><Error><Code>Unavailable</Code><Message>injected</Message></Error></Errors><RequestID>fault</RequestID></Response>";
const THROTTLED: &str = "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>fault</RequestID></Response>";

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (e.g. `http://127.0.0.1:5000`).
    pub async fn start(upstream: &str, config: FaultConfig) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let stats = Arc::new(Stats::default());
        let upstream = upstream.trim_end_matches('/').to_string();
        let client = reqwest::Client::new();
        let lost_once = Arc::new(AtomicBool::new(false));
        let task = {
            let stats = stats.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    let (stats, upstream, client, config, lost_once) =
                        (stats.clone(), upstream.clone(), client.clone(), config.clone(), lost_once.clone());
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<Incoming>| {
                            let (stats, upstream, client, config, lost_once) =
                                (stats.clone(), upstream.clone(), client.clone(), config.clone(), lost_once.clone());
                            async move { handle(req, &stats, &upstream, &client, &config, &lost_once).await }
                        });
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    });
                }
            })
        };
        FaultProxy { endpoint: format!("http://127.0.0.1:{port}/"), stats, task }
    }
}

#[derive(Debug)]
struct Dropped;
impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by the fault proxy")
    }
}
impl std::error::Error for Dropped {}

async fn handle(
    req: Request<Incoming>,
    stats: &Stats,
    upstream: &str,
    client: &reqwest::Client,
    config: &FaultConfig,
    lost_once: &AtomicBool,
) -> Result<Response<Full<Bytes>>, Dropped> {
    stats.requests.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
    let path = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let action = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v.to_string())
        .unwrap_or_else(|| format!("{} {}", parts.method, parts.uri.path()));
    if let Ok(mut actions) = stats.actions.lock() {
        *actions.entry(action.clone()).or_default() += 1;
    }
    let lose_this = config.lose_first_response_of.as_ref().is_some_and(|needle| {
        (String::from_utf8_lossy(&body).contains(needle.as_str()) || path.contains(needle.as_str()))
            && !lost_once.swap(true, Ordering::SeqCst)
    });
    let fault = if lose_this {
        Some(4)
    } else if config.failure_rate > 0.0 && rand::rng().random_bool(config.failure_rate.clamp(0.0, 1.0)) {
        Some(rand::rng().random_range(0..5))
    } else {
        None
    };
    match fault {
        Some(0) => {
            stats.injected_500.fetch_add(1, Ordering::SeqCst);
            return Ok(response(500, None, INTERNAL_ERROR));
        }
        Some(1) => {
            stats.injected_503.fetch_add(1, Ordering::SeqCst);
            return Ok(response(503, Some(&config.retry_after), UNAVAILABLE));
        }
        Some(2) => {
            stats.injected_429.fetch_add(1, Ordering::SeqCst);
            return Ok(response(429, Some(&config.retry_after), THROTTLED));
        }
        Some(3) => {
            stats.dropped_before.fetch_add(1, Ordering::SeqCst);
            return Err(Dropped);
        }
        _ => {}
    }
    let mut forward = client.request(parts.method.clone(), format!("{upstream}{path}")).body(body.to_vec());
    for (name, value) in &parts.headers {
        if name != "content-length" {
            forward = forward.header(name, value);
        }
    }
    let upstream_response = forward.send().await.map_err(|_| Dropped)?;
    stats.forwarded.fetch_add(1, Ordering::SeqCst);
    let status = upstream_response.status();
    let headers = upstream_response.headers().clone();
    let bytes = upstream_response.bytes().await.map_err(|_| Dropped)?;
    if fault == Some(4) {
        // The request took effect upstream; the client never hears of it.
        stats.dropped_after.fetch_add(1, Ordering::SeqCst);
        return Err(Dropped);
    }
    let mut builder = Response::builder().status(status.as_u16());
    for (name, value) in &headers {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            builder = builder.header(name, value);
        }
    }
    Ok(builder.body(Full::new(bytes)).unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}
