//! Benchmark of the embedded API server, run as a separate process (the release
//! `apiserver-standalone` binary) and driven over TLS by kube-rs clients:
//! durable creates/s from 16 concurrent clients, watch delivery latency with 100 watchers,
//! list of 10,000 objects, and the server's resident memory holding them; then the
//! limits: RSS and p99 latency of a get while 1,000 watchers are open and 2,000 idle TLS
//! connections are held; and the Event store after 24 h of simulated controller activity
//! with the 1 h TTL on (in-process, on a simulated clock: `gc::expire_events` takes "now").
//!
//! `cargo bench -p provisioning-apiserver`
#![allow(clippy::too_many_lines, reason = "a benchmark: each scenario reads as one script")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::json;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const OBJECTS: usize = 10_000;
const CLIENTS: usize = 16;
const WATCHERS: usize = 100;
const WATCH_WRITES: usize = 1_000;

fn server_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", "Server"), "servers")
}

fn server_like(name: &str, i: usize) -> BoxResult<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "bench", "provisioning.dev/cluster": format!("c{}", i % 50),
            "provisioning.dev/pool": "members"},
            "annotations": {"provisioning.dev/note": "benchmark object with a realistic amount of metadata"}},
        "spec": {"provider": "aws-main", "plan": "medium", "zone": "eu-west-1a", "image": "debian-12",
            "tags": ["bench", "server"], "config": {"cpu": 2, "memoryMiB": 4096, "disks": [{"size": 40, "type": "gp3"}]}},
    }))?)
}

async fn client(kubeconfig: &std::path::Path) -> BoxResult<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(Client::try_from(cfg)?)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    provisioning_apiserver::install_crypto_provider();
    // `BENCH_ONLY=events cargo bench -p provisioning-apiserver` runs only the Event simulation.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only == "events" {
        return simulated_event_day().await;
    }
    // `BENCH_ONLY=store`: the storage layer alone (16 in-process writers, no HTTP or TLS).
    if only == "store" {
        return store_writes().await;
    }
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_apiserver-standalone"))
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut listening = String::new();
    for line in lines.by_ref() {
        let line = line?;
        if line.starts_with("kubeconfig:") {
            break;
        }
        listening = line;
    }
    println!("{listening} (pid {pid})");
    // `BENCH_ONLY=creates`: part 1 alone (durable creates from 16 clients), with CPU seconds.
    let result = if only == "creates" { creates_only(dir.path(), pid).await } else { run(dir.path(), pid).await };
    let _ = child.kill();
    let _ = child.wait();
    result?;
    if only == "creates" {
        return Ok(());
    }
    simulated_event_day().await
}

/// CPU seconds (user + system) a process used so far, from `/proc/PID/stat`.
fn cpu_seconds(pid: &str) -> f64 {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    ticks as f64 / 100.0
}

async fn create_crd(admin: &Client) -> BoxResult<()> {
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml_ng::from_str(include_str!("../tests/fixtures/server-crd.yaml"))?;
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(admin.clone())
        .create(&PostParams::default(), &crd)
        .await?;
    Ok(())
}

/// `OBJECTS` durable creates from `CLIENTS` kube-rs clients (one connection each), as many
/// in flight as clients; returns creates/s.
async fn durable_creates(kubeconfig: &std::path::Path, clients: usize, objects: usize) -> BoxResult<f64> {
    let mut cls = vec![];
    for _ in 0..clients {
        cls.push(client(kubeconfig).await?);
    }
    let start = Instant::now();
    let mut tasks = vec![];
    for (c, cl) in cls.iter().enumerate() {
        let api: Api<DynamicObject> = Api::namespaced_with(cl.clone(), "default", &server_resource());
        tasks.push(tokio::spawn(async move {
            for i in (c..objects).step_by(clients) {
                let obj = server_like(&format!("srv-{i:05}"), i)?;
                api.create(&PostParams::default(), &obj).await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(objects as f64 / start.elapsed().as_secs_f64())
}

/// Part 1 alone, with the CPU seconds of the server and of this (client) process.
async fn creates_only(dir: &std::path::Path, pid: u32) -> BoxResult<()> {
    let kubeconfig = dir.join("kubeconfig");
    let admin = client(&kubeconfig).await?;
    create_crd(&admin).await?;
    let objects = std::env::var("BENCH_OBJECTS").ok().and_then(|s| s.parse().ok()).unwrap_or(OBJECTS);
    let clients = std::env::var("BENCH_CLIENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(CLIENTS);
    let (server0, client0) = (cpu_seconds(&pid.to_string()), cpu_seconds("self"));
    let t = Instant::now();
    let rate = durable_creates(&kubeconfig, clients, objects).await?;
    let wall = t.elapsed().as_secs_f64();
    let (server_cpu, client_cpu) = (cpu_seconds(&pid.to_string()) - server0, cpu_seconds("self") - client0);
    println!(
        "creates: {objects} durable creates from {clients} clients in {wall:.2} s = {rate:.0}/s; CPU: server {server_cpu:.2} s ({:.0} µs/create), clients {client_cpu:.2} s ({:.0} µs/create); load average {}",
        server_cpu * 1e6 / objects as f64,
        client_cpu * 1e6 / objects as f64,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().next().unwrap_or("?")
    );
    Ok(())
}

/// The storage layer alone: 16 tasks each writing their share of 10,000 Server-like objects
/// through `Store::put` (durable, one fsync per commit), then updating each once with its
/// revision as precondition; writes/s and writes per commit.
async fn store_writes() -> BoxResult<()> {
    use provisioning_apiserver::storage::{ObjKey, Precondition, Store};
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("state.redb"))?;
    let clients = std::env::var("BENCH_CLIENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(CLIENTS);
    for phase in ["create", "update"] {
        let commits0 = store.commits();
        let t = Instant::now();
        let mut tasks = vec![];
        for c in 0..clients {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in (c..OBJECTS).step_by(clients) {
                    let name = format!("srv-{i:05}");
                    let key = ObjKey { storage: Arc::from("provisioning.dev/servers"), namespace: "default".into(), name: name.clone() };
                    let mut obj = serde_json::to_value(server_like(&name, i)?)?;
                    obj["metadata"]["uid"] = json!(format!("uid-{i}"));
                    let pre = match store.get(&key) {
                        Some(e) => {
                            obj["spec"]["plan"] = json!("large");
                            Precondition::Revision(e.rv)
                        }
                        None => Precondition::MustNotExist,
                    };
                    store.put(key, pre, obj).await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        let wall = t.elapsed().as_secs_f64();
        let commits = store.commits() - commits0;
        println!(
            "store {phase}s: {OBJECTS} durable writes from {clients} tasks in {wall:.2} s = {:.0}/s, {commits} commits ({:.1} writes per commit)",
            OBJECTS as f64 / wall,
            OBJECTS as f64 / commits.max(1) as f64
        );
    }
    store.close();
    Ok(())
}

async fn run(dir: &std::path::Path, pid: u32) -> BoxResult<()> {
    let kubeconfig = dir.join("kubeconfig");
    let admin = client(&kubeconfig).await?;
    create_crd(&admin).await?;
    let rss_empty = rss_kib(pid);

    // 1. Durable creates from 16 concurrent clients.
    let mut clients = vec![];
    for _ in 0..CLIENTS {
        clients.push(client(&kubeconfig).await?);
    }
    let start = Instant::now();
    let mut tasks = vec![];
    for (c, cl) in clients.iter().enumerate() {
        let api: Api<DynamicObject> = Api::namespaced_with(cl.clone(), "default", &server_resource());
        tasks.push(tokio::spawn(async move {
            for i in (c..OBJECTS).step_by(CLIENTS) {
                let obj = server_like(&format!("srv-{i:05}"), i)?;
                api.create(&PostParams::default(), &obj).await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = start.elapsed();
    let creates_per_sec = OBJECTS as f64 / elapsed.as_secs_f64();
    println!("creates: {OBJECTS} durable creates from {CLIENTS} clients in {:.2?} = {creates_per_sec:.0}/s", elapsed);

    // 2. List of 10,000 objects (kube-rs, including deserialization), best of 5.
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &server_resource());
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let l = api.list(&ListParams::default()).await?;
        let d = t.elapsed();
        assert_eq!(l.items.len(), OBJECTS);
        best = best.min(d);
    }
    println!("list: {OBJECTS} objects in {best:.2?} (best of 5, kube-rs incl. decoding)");

    // 3. Memory of the server holding them.
    let rss = rss_kib(pid);
    println!("rss: {:.1} MiB holding {OBJECTS} Server objects (empty: {:.1} MiB)", rss as f64 / 1024.0, rss_empty as f64 / 1024.0);

    // 4. Watch delivery with 100 watchers (their own namespace so they start empty).
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "watched"}}))?).await?;
    let acks: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let arrivals: Arc<Mutex<Vec<(String, Instant)>>> = Arc::new(Mutex::new(Vec::with_capacity(WATCHERS * WATCH_WRITES)));
    let watch_client = client(&kubeconfig).await?;
    let wapi: Api<DynamicObject> = Api::namespaced_with(watch_client.clone(), "watched", &server_resource());
    let rv = wapi.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut watchers = vec![];
    for w in 0..WATCHERS {
        // Spread watchers over a few connections like separate controllers would.
        let cl = if w % 4 == 0 { watch_client.clone() } else { clients[w % CLIENTS].clone() };
        let api: Api<DynamicObject> = Api::namespaced_with(cl, "watched", &server_resource());
        let mut stream = api.watch(&WatchParams::default().timeout(120), &rv).await?.boxed();
        let arrivals = arrivals.clone();
        watchers.push(tokio::spawn(async move {
            let mut got = 0;
            while got < WATCH_WRITES {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(o))) => {
                        let now = Instant::now();
                        got += 1;
                        if let Ok(mut a) = arrivals.lock() {
                            a.push((o.metadata.name.unwrap_or_default(), now));
                        }
                    }
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
        }));
    }
    let writer = client(&kubeconfig).await?;
    let wr: Api<DynamicObject> = Api::namespaced_with(writer, "watched", &server_resource());
    let t = Instant::now();
    for i in 0..WATCH_WRITES {
        let name = format!("w-{i:05}");
        wr.create(&PostParams::default(), &server_like(&name, i)?).await?;
        if let Ok(mut a) = acks.lock() {
            a.insert(name, Instant::now());
        }
        // A steady stream rather than a burst: about 200 writes/s.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for w in watchers {
        let _ = tokio::time::timeout(Duration::from_secs(60), w).await;
    }
    let write_time = t.elapsed();
    let acks = acks.lock().map(|a| a.clone()).unwrap_or_default();
    let mut lat: Vec<Duration> = arrivals
        .lock()
        .map(|a| a.iter().filter_map(|(n, at)| acks.get(n).map(|ack| at.saturating_duration_since(*ack))).collect())
        .unwrap_or_default();
    lat.sort();
    println!(
        "watch: {} events to {WATCHERS} watchers for {WATCH_WRITES} writes in {write_time:.2?}; ack->event p50 {:.2?} p99 {:.2?} max {:.2?}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or_default()
    );
    let rss_after = rss_kib(pid);
    println!("rss after watch test: {:.1} MiB", rss_after as f64 / 1024.0);

    held_connections(dir, &admin, pid).await?;
    Ok(())
}

fn tls_config(dir: &std::path::Path) -> BoxResult<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(dir.join("ca.crt"))?)?;
    Ok(Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()))
}

async fn tls_connect(addr: &str, config: Arc<rustls::ClientConfig>) -> BoxResult<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    Ok(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?)
}

async fn get_latencies(api: &Api<DynamicObject>, n: usize) -> BoxResult<Vec<Duration>> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        api.get(&format!("srv-{:05}", (i * 37) % OBJECTS)).await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    Ok(lat)
}

/// Part 5: RSS and get latency while 1,000 watchers (each on its own HTTP/1.1 connection, as
/// kube-rs clients open them) and 2,000 idle TLS connections are held.
async fn held_connections(dir: &std::path::Path, admin: &Client, pid: u32) -> BoxResult<()> {
    use tokio::io::AsyncWriteExt;
    const HELD_WATCHERS: usize = 1_000;
    const IDLE: usize = 2_000;
    const GETS: usize = 1_000;
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &server_resource());
    let before = get_latencies(&api, GETS).await?;
    let rss_before = rss_kib(pid);
    let server = std::fs::read_to_string(dir.join("kubeconfig"))?;
    let host = server
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .ok_or("no server in kubeconfig")?
        .trim()
        .replace("localhost", "127.0.0.1");
    let tls = tls_config(dir)?;
    let token = std::fs::read_to_string(dir.join("token"))?.trim().to_string();
    let t = Instant::now();
    let mut held = Vec::with_capacity(HELD_WATCHERS + IDLE);
    for i in 0..HELD_WATCHERS {
        let mut c = tls_connect(&host, tls.clone()).await?;
        let ns = if i % 2 == 0 { "watched" } else { "default" };
        let req = format!(
            "GET /apis/provisioning.dev/v1alpha1/namespaces/{ns}/servers?watch=true&resourceVersion=0&allowWatchBookmarks=true HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n"
        );
        c.write_all(req.as_bytes()).await?;
        held.push(c);
    }
    for _ in 0..IDLE {
        held.push(tls_connect(&host, tls.clone()).await?);
    }
    let opened = t.elapsed();
    // Let the watchers' initial state (5,000 Servers each for half of them) stream out; the
    // clients do not read, so this is also 500 slow readers being dropped.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_held = rss_kib(pid);
    let during = get_latencies(&api, GETS).await?;
    println!(
        "held: {HELD_WATCHERS} watch connections + {IDLE} idle TLS connections opened in {opened:.2?}; server RSS {:.1} MiB (before {:.1} MiB)",
        rss_held as f64 / 1024.0,
        rss_before as f64 / 1024.0
    );
    println!(
        "get latency: before p50 {:.2?} p99 {:.2?}; while held p50 {:.2?} p99 {:.2?} (n={GETS})",
        percentile(&before, 0.5),
        percentile(&before, 0.99),
        percentile(&during, 0.5),
        percentile(&during, 0.99)
    );
    drop(held);
    Ok(())
}

/// Part 6: the Event store after 24 h of simulated controller activity, TTL 1 h: 200 objects,
/// each emitting a new Event every 2 minutes and bumping the count of its last one every
/// minute, on a simulated clock advanced a minute at a time; `gc::expire_events` runs every
/// 6 simulated minutes, as the server's sweep runs every TTL/10.
async fn simulated_event_day() -> BoxResult<()> {
    use provisioning_apiserver::storage::{ObjKey, Precondition, Store};
    const OBJS: usize = 200;
    const MINUTES: i64 = 24 * 60;
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("state.redb"))?;
    let limits = provisioning_apiserver::Limits { event_ttl: Duration::from_secs(3600), ..Default::default() };
    let core = provisioning_apiserver::handlers::Core::with_limits(store.clone(), limits.clone());
    let start = chrono::Utc::now() - chrono::Duration::minutes(MINUTES);
    let mut written = 0usize;
    let mut peak = (0usize, 0usize);
    let wall = Instant::now();
    for minute in 0..MINUTES {
        let now = start + chrono::Duration::minutes(minute);
        let ts = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut writes = vec![];
        for o in 0..OBJS {
            // Minute 2k: a new Event; minute 2k+1: the same Event seen again (count 2).
            let seq = minute / 2;
            let name = format!("srv-{o:03}.{seq:06x}");
            let count = 1 + minute % 2;
            let ev = json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": "default", "creationTimestamp": ts},
                "involvedObject": {"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "name": format!("srv-{o:03}"), "namespace": "default"},
                "reason": "Reconciled", "type": "Normal", "message": format!("server srv-{o:03} reconciled: 3 steps, 0 changes (pass {seq})"),
                "source": {"component": "provisioning-controller"}, "reportingComponent": "provisioning-controller", "reportingInstance": "ctl-0",
                "firstTimestamp": ts, "lastTimestamp": ts, "count": count});
            let key = ObjKey { storage: Arc::from("/events"), namespace: "default".into(), name };
            let pre = match store.get(&key) {
                Some(e) => Precondition::Revision(e.rv),
                None => Precondition::MustNotExist,
            };
            let store = store.clone();
            writes.push(tokio::spawn(async move { store.put(key, pre, ev).await }));
        }
        for w in writes {
            w.await??;
            written += 1;
        }
        // The server sweeps every TTL/10 (6 min for 1 h); so does the simulation.
        if minute % 6 == 5 {
            provisioning_apiserver::gc::expire_events(&core, now, limits.event_ttl).await;
        }
        let (n, bytes) = {
            let st = store.read();
            st.objects.get("/events").map(|m| (m.len(), m.values().map(|e| e.bytes.len()).sum())).unwrap_or((0, 0))
        };
        peak = peak.max((n, bytes));
    }
    let (n, bytes) = {
        let st = store.read();
        st.objects.get("/events").map(|m| (m.len(), m.values().map(|e| e.bytes.len()).sum::<usize>())).unwrap_or((0, 0))
    };
    let (hist, hist_bytes) = {
        let st = store.read();
        (st.history.len(), st.history_bytes)
    };
    store.close();
    let file = std::fs::metadata(dir.path().join("state.redb"))?.len();
    println!(
        "events: 24 h simulated in {:.1?}: {written} event writes ({} distinct Events); live at the end {n} Events, {:.1} MiB JSON (peak {} / {:.1} MiB); history {hist} events / {:.1} MiB; redb file {:.1} MiB",
        wall.elapsed(),
        OBJS as i64 * MINUTES / 2,
        bytes as f64 / 1048576.0,
        peak.0,
        peak.1 as f64 / 1048576.0,
        hist_bytes as f64 / 1048576.0,
        file as f64 / 1048576.0
    );
    Ok(())
}
