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
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("provisioning");
        let reconciles = Family::<KindLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = HistogramFamily::<KindLabels>::new_with_constructor(reconcile_histogram as fn() -> Histogram);
        let in_flight = Family::<KindLabels, Gauge>::default();
        let provider_calls =
            HistogramFamily::<ProviderCallLabels>::new_with_constructor(provider_histogram as fn() -> Histogram);
        let queue_depth = Gauge::default();
        let api_writes = Family::<KindLabels, Counter>::default();
        let script_runs = Family::<ScriptLabels, Counter>::default();
        let leader = Gauge::default();
        registry.register("reconciles", "Reconciles started", reconciles.clone());
        registry.register("reconcile_errors", "Failed reconciles by category", errors.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", reconcile_duration.clone());
        registry.register("reconciles_in_flight", "Reconciles running now", in_flight.clone());
        registry.register("provider_call_duration_seconds", "Provider call latency", provider_calls.clone());
        registry.register("provider_queue_depth", "Provider operations waiting for a parallelLimit permit", queue_depth.clone());
        registry.register("api_writes", "Writes to the API server by reconcilers", api_writes.clone());
        registry.register("script_runs", "Task script runs", script_runs.clone());
        registry.register("leader", "1 while this replica is the leader", leader.clone());
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
        let labels = ErrorLabels {
            kind: kind.to_string(),
            category: error.category().to_string(),
            class: error.class().label().to_string(),
        };
        self.errors.get_or_create(&labels).inc();
    }

    /// Records a provider call.
    pub fn record_provider_call(&self, provider: &str, operation: &str, outcome: &str, seconds: f64) {
        let labels =
            ProviderCallLabels { provider: provider.into(), operation: operation.into(), outcome: outcome.into() };
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
    /// Marks the process ready (or not).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
    /// Whether ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
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
                        "/metrics" => respond(
                            StatusCode::OK,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            metrics.encode(),
                        ),
                        "/healthz" | "/livez" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
                        "/readyz" if health.is_ready() => respond(StatusCode::OK, "text/plain", "ok\n".into()),
                        "/readyz" => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".into()),
                        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
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
