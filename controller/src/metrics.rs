//! Prometheus metrics and the /metrics, /healthz, /readyz endpoint.
//!
//! Labels are bounded: kind, error category, provider type, operation, outcome — never
//! object names. TaskServ/Cluster reconcilers use [`Metrics::reconcile_timer`] with their
//! kind and [`Metrics::record_error`]; script runs can go through [`Metrics::script_runs`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label: the kind reconciled.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Workspace, Server, TaskServ, Cluster.
    pub kind: String,
}

/// Labels: kind and error category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The kind reconciled.
    pub kind: String,
    /// `Error::category()` (bounded set of CamelCase words).
    pub category: String,
    /// `ErrorClass::label()`.
    pub class: String,
}

/// Labels of a provider call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderCallLabels {
    /// Provider type (local, aws, upcloud, simulated).
    pub provider: String,
    /// Operation (ensure_server, observe_server…).
    pub operation: String,
    /// `ok` or the error category.
    pub outcome: String,
}

/// Labels of a script run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScriptLabels {
    /// Catalog service.
    pub service: String,
    /// `ok` or `failed`.
    pub outcome: String,
}

/// Labels of a shard's owned objects.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    /// The replica's shard identity (one per replica).
    pub shard: String,
    /// Workspace, Server, TaskServ, Cluster.
    pub kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}
fn provider_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// All metrics of the controller.
pub struct Metrics {
    registry: Registry,
    /// Reconciles started, by kind.
    pub reconciles: Family<KindLabels, Counter>,
    /// Failed reconciles, by kind and category.
    pub errors: Family<ErrorLabels, Counter>,
    /// Reconcile duration in seconds, by kind.
    pub reconcile_duration: HistogramFamily<KindLabels>,
    /// Reconciles running now, by kind.
    pub in_flight: Family<KindLabels, Gauge>,
    /// Provider call latency in seconds.
    pub provider_calls: HistogramFamily<ProviderCallLabels>,
    /// Operations waiting for a workspace's parallelLimit permit (the provider work queue).
    pub queue_depth: Gauge,
    /// Status/metadata writes the reconcilers made, by kind.
    pub api_writes: Family<KindLabels, Counter>,
    /// Script runs, by service and outcome.
    pub script_runs: Family<ScriptLabels, Counter>,
    /// 1 while this replica holds the leader Lease.
    pub leader: Gauge,
    /// Objects carrying this replica's shard label, by kind (`sharding = true`).
    pub shard_objects: Family<ShardLabels, Gauge>,
    /// Namespaces (Workspaces) this replica holds (`sharding = true`).
    pub shard_namespaces: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("provisioning");
        let reconciles = Family::<KindLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = HistogramFamily::<KindLabels>::new_with_constructor(reconcile_histogram as fn() -> Histogram);
        let in_flight = Family::<KindLabels, Gauge>::default();
        let provider_calls = HistogramFamily::<ProviderCallLabels>::new_with_constructor(provider_histogram as fn() -> Histogram);
        let queue_depth = Gauge::default();
        let api_writes = Family::<KindLabels, Counter>::default();
        let script_runs = Family::<ScriptLabels, Counter>::default();
        let leader = Gauge::default();
        let shard_objects = Family::<ShardLabels, Gauge>::default();
        let shard_namespaces = Gauge::default();
        registry.register("reconciles", "Reconciles started", reconciles.clone());
        registry.register("reconcile_errors", "Failed reconciles by category", errors.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", reconcile_duration.clone());
        registry.register("reconciles_in_flight", "Reconciles running now", in_flight.clone());
        registry.register("provider_call_duration_seconds", "Provider call latency", provider_calls.clone());
        registry.register("provider_queue_depth", "Provider operations waiting for a parallelLimit permit", queue_depth.clone());
        registry.register("api_writes", "Writes to the API server by reconcilers", api_writes.clone());
        registry.register("script_runs", "Task script runs", script_runs.clone());
        registry.register("leader", "1 while this replica is the leader", leader.clone());
        registry.register("shard_objects", "Objects carrying this replica's shard label", shard_objects.clone());
        registry.register("shard_namespaces", "Namespaces this replica holds", shard_namespaces.clone());
        Metrics {
            registry,
            reconciles,
            errors,
            reconcile_duration,
            in_flight,
            provider_calls,
            queue_depth,
            api_writes,
            script_runs,
            leader,
            shard_objects,
            shard_namespaces,
        }
    }
}

/// Measures one reconcile; records its duration when dropped.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    labels: KindLabels,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics.reconcile_duration.get_or_create(&self.labels).observe(self.start.elapsed().as_secs_f64());
        self.metrics.in_flight.get_or_create(&self.labels).dec();
    }
}

impl Metrics {
    /// Counts a reconcile of `kind` and times it until the guard drops.
    pub fn reconcile_timer(&self, kind: &str) -> ReconcileTimer<'_> {
        let labels = KindLabels { kind: kind.to_string() };
        self.reconciles.get_or_create(&labels).inc();
        self.in_flight.get_or_create(&labels).inc();
        ReconcileTimer { metrics: self, labels, start: Instant::now() }
    }

    /// Counts a failed reconcile.
    pub fn record_error(&self, kind: &str, error: &crate::Error) {
        let labels =
            ErrorLabels { kind: kind.to_string(), category: error.category().to_string(), class: error.class().label().to_string() };
        self.errors.get_or_create(&labels).inc();
    }

    /// Records a provider call.
    pub fn record_provider_call(&self, provider: &str, operation: &str, outcome: &str, seconds: f64) {
        let labels = ProviderCallLabels { provider: provider.into(), operation: operation.into(), outcome: outcome.into() };
        self.provider_calls.get_or_create(&labels).observe(seconds);
    }

    /// Counts a write to the API server.
    pub fn record_write(&self, kind: &str) {
        self.api_writes.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Readiness of the process, flipped by `run` once caches are filled.
#[derive(Clone, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
}

impl Health {
    /// Marks the process ready (or not) as far as its own work goes (caches synced, or a
    /// standby whose last Lease check succeeded).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
    /// Ready: its own work is ready and the API server answered its last request without
    /// rejecting its credentials ([`api_access`]).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && api_access() == ApiAccess::Ok
    }
    /// Why not ready, for the /readyz body.
    pub fn reason(&self) -> &'static str {
        match api_access() {
            ApiAccess::Unauthorized => "the API server rejects this controller's credentials (401)",
            ApiAccess::Unreachable => "the API server is unreachable",
            ApiAccess::Ok if !self.ready.load(Ordering::SeqCst) => "watch caches not synced or leader Lease not checked yet",
            ApiAccess::Ok => "ok",
        }
    }
}

/// What the last answer (or failure) from the API server says about this process's access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiAccess {
    /// It answered, and accepted the credentials.
    Ok,
    /// It answered 401: no valid token (expired, revoked, empty).
    Unauthorized,
    /// The request never got an answer (connection refused, TLS, timeout).
    Unreachable,
}

/// Process-wide: every client built by `client::client_from_config` reports here through
/// [`ApiAccessLayer`]; clients without the layer leave it `Ok`.
static API_ACCESS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The API server access seen last.
pub fn api_access() -> ApiAccess {
    match API_ACCESS.load(Ordering::SeqCst) {
        1 => ApiAccess::Unauthorized,
        2 => ApiAccess::Unreachable,
        _ => ApiAccess::Ok,
    }
}

fn set_api_access(access: ApiAccess) {
    let value = match access {
        ApiAccess::Ok => 0,
        ApiAccess::Unauthorized => 1,
        ApiAccess::Unreachable => 2,
    };
    API_ACCESS.store(value, Ordering::SeqCst);
}

/// The verb, resource (with subresource) and namespace of an API request, as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestAttributes {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// `group/resource[/subresource]` (`secrets`, `provisioning.dev/servers/status`).
    pub resource: String,
    /// Empty for cluster-scoped requests.
    pub namespace: String,
    /// The object's name, empty for collections.
    pub name: String,
}

impl RequestAttributes {
    /// Reads the attributes from a request's method and URI (`/api/v1/...`, `/apis/G/V/...`).
    pub fn of(method: &http::Method, uri: &http::Uri) -> Self {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest): (&str, &[&str]) = match segments.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (group, rest),
            _ => ("", &[][..]),
        };
        let mut watch = uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let rest = match rest {
            ["watch", tail @ ..] => {
                watch = true;
                tail
            }
            _ => rest,
        };
        let (namespace, resource, name, sub) = match rest {
            ["namespaces", ns, resource, tail @ ..] => (*ns, *resource, tail.first().copied(), tail.get(1).copied()),
            ["namespaces", name] => ("", "namespaces", Some(*name), None),
            [resource, tail @ ..] => ("", *resource, tail.first().copied(), tail.get(1).copied()),
            [] => ("", "", None, None),
        };
        let collection = name.is_none();
        let verb = match *method {
            http::Method::GET if watch => "watch",
            http::Method::GET | http::Method::HEAD if collection => "list",
            http::Method::GET | http::Method::HEAD => "get",
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE if collection => "deletecollection",
            http::Method::DELETE => "delete",
            _ => method.as_str(),
        };
        let mut resource = if group.is_empty() { resource.to_string() } else { format!("{group}/{resource}") };
        if let Some(sub) = sub {
            resource = format!("{resource}/{sub}");
        }
        RequestAttributes { verb: verb.to_string(), resource, namespace: namespace.to_string(), name: name.unwrap_or_default().to_string() }
    }
}

/// A client layer that logs every request the API server refuses (401/403) with its verb,
/// resource and namespace — once a minute per distinct request, since watches retry — and
/// records the access state /readyz reports.
#[derive(Clone, Default)]
pub struct ApiAccessLayer {
    last_logged: Arc<std::sync::Mutex<std::collections::HashMap<(u16, RequestAttributes), Instant>>>,
}

impl<S> tower::Layer<S> for ApiAccessLayer {
    type Service = ApiAccessService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiAccessService { inner, layer: self.clone() }
    }
}

/// The service [`ApiAccessLayer`] wraps around a client's stack.
#[derive(Clone)]
pub struct ApiAccessService<S> {
    inner: S,
    layer: ApiAccessLayer,
}

impl ApiAccessLayer {
    fn should_log(&self, code: u16, attributes: &RequestAttributes) -> bool {
        let mut seen = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match seen.get(&(code, attributes.clone())) {
            Some(at) if now.duration_since(*at) < std::time::Duration::from_secs(60) => false,
            _ => {
                seen.insert((code, attributes.clone()), now);
                true
            }
        }
    }
}

impl<S, B, RB> tower::Service<http::Request<B>> for ApiAccessService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let attributes = RequestAttributes::of(request.method(), request.uri());
        let answer = self.inner.call(request);
        let layer = self.layer.clone();
        Box::pin(async move {
            let outcome = answer.await;
            match &outcome {
                Ok(response) => {
                    let code = response.status().as_u16();
                    set_api_access(if code == 401 { ApiAccess::Unauthorized } else { ApiAccess::Ok });
                    // A refused Event is reported by the publisher, which sees the reason: in a
                    // namespace being deleted every create is refused with 403, and that is no
                    // missing permission ([`crate::context::Context::publish`]).
                    let event = code == 403 && attributes.resource == "events";
                    if (code == 401 || code == 403) && !event && layer.should_log(code, &attributes) {
                        let RequestAttributes { verb, resource, namespace, name } = &attributes;
                        let why = if code == 401 { "unauthorized: the API server rejects the credentials" } else { "forbidden by RBAC" };
                        tracing::warn!(code, %verb, %resource, %namespace, %name, "API request refused ({why})");
                    }
                }
                Err(_) => set_api_access(ApiAccess::Unreachable),
            }
            outcome
        })
    }
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// Serves /metrics, /healthz and /readyz on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, health: Health) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let metrics = metrics.clone();
                let health = health.clone();
                async move {
                    let response = match req.uri().path() {
                        "/metrics" => {
                            respond(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.encode())
                        }
                        "/healthz" | "/livez" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
                        "/readyz" if health.is_ready() => respond(StatusCode::OK, "text/plain", "ok\n".into()),
                        "/readyz" => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("not ready: {}\n", health.reason())),
                        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let _ =
                hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// Binds `addr` and serves the endpoints in a background task; returns the bound address.
pub async fn spawn_server(addr: SocketAddr, metrics: Arc<Metrics>, health: Health) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve(listener, metrics, health));
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_attributes_as_rbac_sees_them() {
        let of = |m: &str, u: &str| {
            let a = RequestAttributes::of(&m.parse().expect("method"), &u.parse().expect("uri"));
            (a.verb, a.resource, a.namespace, a.name)
        };
        let t = |v: &str, r: &str, ns: &str, n: &str| (v.to_string(), r.to_string(), ns.to_string(), n.to_string());
        assert_eq!(of("GET", "/api/v1/namespaces/kube-system/secrets/x"), t("get", "secrets", "kube-system", "x"));
        assert_eq!(of("GET", "/api/v1/secrets?watch=true&resourceVersion=1"), t("watch", "secrets", "", ""));
        assert_eq!(of("GET", "/apis/provisioning.dev/v1alpha1/servers?limit=500"), t("list", "provisioning.dev/servers", "", ""));
        assert_eq!(
            of("PATCH", "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers/web/status"),
            t("patch", "provisioning.dev/servers/status", "demo", "web")
        );
        assert_eq!(of("PUT", "/apis/coordination.k8s.io/v1/namespaces/p/leases/l"), t("update", "coordination.k8s.io/leases", "p", "l"));
        assert_eq!(of("POST", "/api/v1/namespaces"), t("create", "namespaces", "", ""));
        assert_eq!(of("GET", "/api/v1/namespaces/demo"), t("get", "namespaces", "", "demo"));
        assert_eq!(
            of("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
            t("deletecollection", "apiextensions.k8s.io/customresourcedefinitions", "", "")
        );
    }

    #[test]
    fn encodes_without_object_names() {
        let m = Metrics::default();
        drop(m.reconcile_timer("Server"));
        m.record_provider_call("simulated", "ensure_server", "ok", 0.01);
        m.record_error("Server", &crate::Error::Stalled { reason: "UnknownProvider", message: "x".into() });
        let text = m.encode();
        assert!(text.contains("provisioning_reconciles_total{kind=\"Server\"} 1"), "{text}");
        assert!(text.contains("category=\"UnknownProvider\""), "{text}");
        assert!(text.contains("provisioning_provider_call_duration_seconds_bucket"), "{text}");
    }
}
