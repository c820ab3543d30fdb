//! Benchmark of the embedded API server, run as a separate process (the release
//! `apiserver-standalone` binary) and driven over TLS by kube-rs clients:
//! durable creates/s from 16 concurrent clients, watch delivery latency with 100 watchers,
//! list of 10,000 objects, and the server's resident memory holding them.
//!
//! `cargo bench -p provisioning-apiserver`

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
    let result = run(dir.path(), pid).await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

async fn run(dir: &std::path::Path, pid: u32) -> BoxResult<()> {
    let kubeconfig = dir.join("kubeconfig");
    let admin = client(&kubeconfig).await?;
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml_ng::from_str(include_str!("../tests/fixtures/server-crd.yaml"))?;
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(admin.clone())
        .create(&PostParams::default(), &crd)
        .await?;
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
    Ok(())
}
