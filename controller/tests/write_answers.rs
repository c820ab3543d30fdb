//! A write answers with the whole live object, and its live version is the tenant's to make:
//! as large as the API server stores, nested as deep as a real API server keeps under a field
//! that preserves unknown fields (issue 26, thirteenth re-review N2). The controller's status
//! patches, annotations and finalizers decode those answers slim: a 130-deep answer is not an
//! error after the write succeeded, and eight writes at once answered by an object of ~1 MiB
//! of tiny maps (~100 MiB decoded as a `DynamicObject`) raise the process's peak by less than
//! 24 MiB. Likewise a tenant's Secret the controller reads (~1 MiB of tiny keys and bloated
//! managedFields, ~40 MiB decoded typed): only the keys read are decoded.
//!
//! A tiny fake API server (plain HTTP on 127.0.0.1) answers every PATCH with the prepared
//! object, so that only the controller's side is measured. One test per binary: the process's
//! peak memory (VmHWM, reset before each phase) is the measurement.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::runtime::reflector;
use kube::{Client, Config};
use provisioning_controller::context::{Context, Stores};
use provisioning_controller::host::HostPaths;
use provisioning_controller::metrics::Metrics;
use provisioning_controller::sync::CacheSync;
use provisioning_crds::{TaskServ, TaskServStatus};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const NS: &str = "write-answers";

/// The object every PATCH is answered with (swapped between phases), and the Secret every
/// Secret GET is answered with.
struct Fake {
    answer: Mutex<Bytes>,
    secret: Mutex<Bytes>,
    patches: Mutex<usize>,
}

async fn handle(fake: Arc<Fake>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let json = |status: u16, body: Bytes| {
        Response::builder().status(status).header("content-type", "application/json").body(Full::new(body)).unwrap_or_default()
    };
    if req.method() == Method::PATCH && req.uri().path().starts_with(&format!("/apis/provisioning.dev/v1alpha1/namespaces/{NS}/taskservs/"))
    {
        *fake.patches.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let answer = fake.answer.lock().unwrap_or_else(|p| p.into_inner()).clone();
        return Ok(json(200, answer));
    }
    if req.method() == Method::GET && req.uri().path().starts_with(&format!("/api/v1/namespaces/{NS}/secrets/")) {
        let secret = fake.secret.lock().unwrap_or_else(|p| p.into_inner()).clone();
        return Ok(json(200, secret));
    }
    // History writes and lists, events: not what is measured.
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
    Ok(json(404, Bytes::from(status.to_string())))
}

async fn serve(fake: Arc<Fake>) -> Result<SocketAddr, std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let fake = fake.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(fake.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The live TaskServ as the API server answers: `config` spliced in as text.
fn live(resource_version: &str, config: &str) -> Result<Bytes, serde_json::Error> {
    let shell = serde_json::to_string(&json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "TaskServ",
        "metadata": {"name": "big", "namespace": NS, "uid": "uid-big", "resourceVersion": resource_version, "generation": 2,
            "finalizers": ["provisioning.dev/finalizer"]},
        "spec": {"service": "haproxy", "servers": {"names": ["s1"]}, "config": "CONFIG"},
        "status": {"observedGeneration": 2}
    }))?;
    Ok(Bytes::from(shell.replace("\"CONFIG\"", config)))
}

/// The small copy the controller's cache holds (an older version).
fn cached() -> Result<TaskServ, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "TaskServ",
        "metadata": {"name": "big", "namespace": NS, "uid": "uid-big", "resourceVersion": "5", "generation": 1},
        "spec": {"service": "haproxy", "servers": {"names": ["s1"]}, "config": {"small": true}}
    }))
}

fn status(generation: i64, message: &str) -> Result<TaskServStatus, serde_json::Error> {
    serde_json::from_value(json!({"observedGeneration": generation, "phase": "Pending", "message": message}))
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .unwrap_or(0)
}

/// Resets the peak to the current RSS and returns it (MiB).
fn reset_peak() -> Result<u64, std::io::Error> {
    std::fs::write("/proc/self/clear_refs", "5")?;
    Ok(status_kib("VmRSS:") / 1024)
}

fn peak_growth(base: u64) -> u64 {
    (status_kib("VmHWM:") / 1024).saturating_sub(base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_answers_of_oversized_live_objects_cost_their_text_not_their_decode() -> TestResult {
    provisioning_controller::install_crypto_provider();
    let deep = format!("{}1{}", "{\"a\":".repeat(130), "}".repeat(130));
    let fake = Arc::new(Fake { answer: Mutex::new(live("900", &deep)?), secret: Mutex::new(Bytes::new()), patches: Mutex::new(0) });
    let addr = serve(fake.clone()).await?;
    let client = Client::try_from(Config::new(format!("http://{addr}").parse()?))?;
    let stores = Stores {
        workspaces: reflector::store().0,
        servers: reflector::store().0,
        taskservs: reflector::store().0,
        clusters: reflector::store().0,
        synced: CacheSync::new(&[]),
    };
    let config = provisioning_controller::config::ControllerConfig { leader_election: false, ..Default::default() };
    let ctx = Context::new(client.clone(), config, Arc::new(Metrics::default()), stores, "test".into(), HostPaths::default());
    let obj = cached()?;

    // 1. A 130-deep live object (a real API server stores it): each write succeeds and says
    //    which version it wrote (the cached copy is now older than our write).
    assert!(ctx.apply_status(&obj, None, &status(1, "deep")?).await?, "the status was written");
    assert!(ctx.is_stale(&obj), "the answer's resourceVersion (900) was recorded");
    ctx.set_annotation(&obj, "provisioning.dev/test", Some("x")).await?;
    ctx.finalizer_with_annotation(&obj, Some(("provisioning.dev/test", "y"))).await?;
    assert_eq!(*fake.patches.lock().unwrap_or_else(|p| p.into_inner()), 3);

    // 2. ~1 MiB of tiny maps: eight status writes at once (the old way, one decode as a whole
    //    object costs ~100 MiB: measured at the end).
    let wide = format!("[{}]", vec!["{\"a\":{}}"; 110_000].join(","));
    let answer = live("901", &wide)?;
    eprintln!("answer: {} KiB", answer.len() / 1024);
    *fake.answer.lock().unwrap_or_else(|p| p.into_inner()) = answer.clone();
    let base = reset_peak()?;
    let writes = (0..8).map(|i| {
        let (ctx, obj) = (&ctx, &obj);
        async move {
            ctx.apply_status(obj, None, &status(1, &format!("wide {i}"))?)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        }
    });
    for written in futures::future::join_all(writes).await {
        assert!(written?, "each status was written");
    }
    let writes_grew = peak_growth(base);
    eprintln!("eight status writes answered by it at once: peak +{writes_grew} MiB");
    assert!(writes_grew < 24, "eight slim answers of ~1 MiB cost +{writes_grew} MiB");

    // 3. A tenant's Secret the controller reads (a Server's SSH key, a TaskServ's configFrom)
    //    with ~1 MiB of tiny keys beside the one read, and managedFields as bloated: eight
    //    reads at once cost less than one typed decode of it.
    let secret = bloated_secret()?;
    *fake.secret.lock().unwrap_or_else(|p| p.into_inner()) = secret.clone();
    let server = provisioning_controller::testing::server(NS, "keyed", json!({"plan": "small", "sshKeySecretRef": {"name": "tenant"}}));
    let ts: TaskServ = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ",
        "metadata": {"name": "configured", "namespace": NS, "uid": "uid-configured"},
        "spec": {"service": "haproxy", "servers": {"names": ["s1"]}, "configFrom": [{"kind": "Secret", "name": "tenant", "key": "wanted"}]}
    }))?;
    let catalog = provisioning_taskservs::Catalog::load(&provisioning_taskservs::Catalog::default_dir())?;
    let base = reset_peak()?;
    let reads = (0..4).map(|_| {
        let (client, server, ts, catalog) = (&client, &server, &ts, &catalog);
        async move {
            let key = provisioning_controller::server::ssh::server_key(client, server).await;
            let inputs = provisioning_controller::taskserv::inputs::resolve(client, ts, catalog, false).await;
            (key.map(|k| k.is_some()).map_err(|e| e.to_string()), inputs.map(|i| i.config).map_err(|e| e.to_string()))
        }
    });
    for (key, inputs) in futures::future::join_all(reads).await {
        assert_eq!(key, Ok(true), "the SSH key was read");
        let config = inputs?;
        assert_eq!(config.get("greeting").and_then(|v| v.as_str()), Some("hi"), "{config}");
    }
    let reads_grew = peak_growth(base);
    eprintln!("eight reads of a bloated Secret ({} KiB): peak +{reads_grew} MiB", secret.len() / 1024);
    assert!(reads_grew < 16, "eight slim reads of a ~1 MiB Secret cost +{reads_grew} MiB");

    // What the same answers cost decoded whole (the old way), measured last: memory an
    // earlier phase freed is reused without raising the peak, so a baseline measured first
    // would hide the phases' own cost. The first of these is exact, the second a lower bound.
    let base = reset_peak()?;
    let typed: k8s_openapi::api::core::v1::Secret = serde_json::from_slice(&secret)?;
    let one_typed = peak_growth(base);
    drop(typed);
    let base = reset_peak()?;
    let decoded: kube::api::DynamicObject = serde_json::from_slice(&answer)?;
    let one_dynamic = peak_growth(base);
    drop(decoded);
    eprintln!("one typed decode of the Secret: +{one_typed} MiB; one DynamicObject decode of the answer: at least +{one_dynamic} MiB");
    assert!(one_typed >= 32 && one_dynamic >= 40, "the workloads should amplify (+{one_typed} MiB, +{one_dynamic} MiB)");
    Ok(())
}

/// A Secret holding `ssh-privatekey` and `wanted` (`greeting: hi`) beside 60,000 tiny keys, and
/// a managedFields entry whose field set holds 60,000 one-entry maps.
fn bloated_secret() -> Result<Bytes, Box<dyn std::error::Error + Send + Sync>> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let tiny: Vec<String> = (0..60_000).map(|i| format!("\"k{i}\":\"\"")).collect();
    let wide = format!("[{}]", vec!["{\"a\":{}}"; 60_000].join(","));
    let managed =
        format!(r#"[{{"manager":"bloat","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{{"f:data":{{"f:x":{wide}}}}}}}]"#);
    let (key, _) = provisioning_providers::ssh::generate_host_key()?;
    let key = key.0;
    let shell = serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "tenant", "namespace": NS, "uid": "uid-tenant", "resourceVersion": "3", "managedFields": "MANAGED"},
        "data": {"ssh-privatekey": b64(&key), "wanted": b64("greeting: hi\n"), "TINY": ""},
        "type": "Opaque"
    }))?;
    let text = shell.replace("\"MANAGED\"", &managed).replace("\"TINY\":\"\"", &tiny.join(","));
    Ok(Bytes::from(text))
}
