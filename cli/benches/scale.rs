//! Scale benchmark of the Server reconciler on the simulated provider.
//!
//! `cargo bench -p provisioning-cli --bench scale [-- SCENARIO...]`
//! Scenarios: `burst` (1,000 Servers, no latency: time to Ready, API writes per Server,
//! writes on resync; `SCALE_SERVERS=5000` changes the count, `SCALE_EXTRA='history_limit = 0'`
//! adds a line to the controller's config), `latency` (1,000 Servers, 2 s ± 20 % latency, parallelLimit 50: time
//! vs the 40 s floor), `memory` (controller RSS holding 10,000 Servers), `survey` (1,000 Ready
//! Servers: provider calls per survey interval, and how long a machine deleted behind the
//! controller's back takes to be noticed and re-created). Default: all.
//! The API server runs in this process; the controller is the `provisioning controller`
//! binary in its own process (so its RSS is its own).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use provisioning_controller::testing::{TestEnv, is_ready, server, wait_for};
use provisioning_crds::{Server, Workspace};
use serde_json::json;

#[derive(Default)]
struct Tracker {
    versions: HashMap<String, Vec<String>>,
    ready_at: HashMap<String, Instant>,
    events: u64,
}

fn track(client: &Client, namespace: &str) -> Arc<Mutex<Tracker>> {
    let tracker: Arc<Mutex<Tracker>> = Arc::default();
    let sink = tracker.clone();
    let api: Api<Server> = Api::namespaced(client.clone(), namespace);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(item) = stream.next().await {
            let Ok(s) = item else { continue };
            let mut t = sink.lock().unwrap_or_else(|p| p.into_inner());
            t.events += 1;
            let rv = s.resource_version().unwrap_or_default();
            let name = s.name_any();
            let vs = t.versions.entry(name.clone()).or_default();
            if !vs.contains(&rv) {
                vs.push(rv);
            }
            if is_ready(&s) && !t.ready_at.contains_key(&name) {
                t.ready_at.insert(name, Instant::now());
            }
        }
    });
    tracker
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn spawn_controller(env: &TestEnv, resync_secs: u64, metrics: SocketAddr) -> anyhow::Result<Child> {
    spawn_controller_with(env, resync_secs, metrics, "")
}

fn spawn_controller_with(env: &TestEnv, resync_secs: u64, metrics: SocketAddr, extra: &str) -> anyhow::Result<Child> {
    let config = env.dir.path().join("bench.toml");
    std::fs::write(
        &config,
        format!("state_dir = {:?}\nleader_election = false\nresync_secs = {resync_secs}\n{extra}", env.state_dir.display().to_string()),
    )?;
    // SCALE_CONTROLLER_BIN: another build's binary (a baseline) against this run's API server.
    let bin = std::env::var("SCALE_CONTROLLER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_provisioning").to_string());
    Ok(Command::new(bin)
        .args(["controller", "--kubeconfig"])
        .arg(&env.kubeconfig)
        .arg("--config")
        .arg(&config)
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("RUST_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
        .spawn()?)
}

async fn scrape_metric(addr: SocketAddr, prefix: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum())
}

/// CPU seconds (user + system) a process used so far; "self" for this one.
fn cpu_secs(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command's closing parenthesis: state is 3rd, utime 14th, stime 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

async fn setup(env: &TestEnv, name: &str, latency_ms: u64, jitter: u32, parallel: u32, max: u32) -> anyhow::Result<()> {
    let ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
        "spec": {
            "providers": [{"name": "sim", "type": "simulated", "simulation": {"latencyMs": latency_ms, "jitterPercent": jitter}}],
            "defaults": {"provider": "sim"},
            "limits": {"maxServers": max, "parallelLimit": parallel}
        }
    }))?;
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &ws).await?;
    let client = env.client.clone();
    let ns = name.to_string();
    wait_for("workspace namespace", Duration::from_secs(60), || {
        let client = client.clone();
        let ns = ns.clone();
        async move { Api::<k8s_openapi::api::core::v1::Namespace>::all(client).get_opt(&ns).await.ok().flatten() }
    })
    .await?;
    Ok(())
}

async fn create_servers(client: &Client, namespace: &str, count: usize) -> anyhow::Result<()> {
    let api: Api<Server> = Api::namespaced(client.clone(), namespace);
    let results: Vec<Result<Server, kube::Error>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let s = server(namespace, &format!("srv-{i:05}"), json!({}));
            async move { api.create(&PostParams::default(), &s).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for r in results {
        r?;
    }
    Ok(())
}

async fn wait_all_ready(tracker: &Arc<Mutex<Tracker>>, count: usize, deadline: Duration) -> anyhow::Result<()> {
    wait_for(&format!("{count} Servers Ready"), deadline, || async {
        let t = tracker.lock().unwrap_or_else(|p| p.into_inner());
        (t.ready_at.len() >= count).then_some(())
    })
    .await
}

struct Figures(Vec<(String, String)>);

impl Figures {
    fn add(&mut self, what: &str, value: String) {
        println!("  {what}: {value}");
        self.0.push((what.to_string(), value));
    }
}

async fn burst(figures: &mut Figures) -> anyhow::Result<()> {
    let count: usize = std::env::var("SCALE_SERVERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let extra = std::env::var("SCALE_EXTRA").map(|e| format!("{e}\n")).unwrap_or_default();
    println!("burst: {count} Servers, simulated provider without latency {extra}");
    let env = TestEnv::start().await?;
    let metrics = free_addr()?;
    let resync = if count > 1000 { 600 } else { 20 };
    let mut controller = spawn_controller_with(&env, resync, metrics, &extra)?;
    setup(&env, "burst", 0, 0, 50, 20000).await?;
    let tracker = track(&env.client, "burst");
    let start = Instant::now();
    let cpu_start = (cpu_secs("self"), cpu_secs(&controller.id().to_string()));
    create_servers(&env.client, "burst", count).await?;
    let created = start.elapsed();
    wait_all_ready(&tracker, count, Duration::from_secs(1800)).await?;
    let ready = start.elapsed();
    let cpu = (cpu_secs("self") - cpu_start.0, cpu_secs(&controller.id().to_string()) - cpu_start.1);
    // Let trailing writes (create-pending removal) land: wait for a quiet second.
    let mut last = tracker.lock().unwrap_or_else(|p| p.into_inner()).events;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = tracker.lock().unwrap_or_else(|p| p.into_inner()).events;
        if now == last {
            break;
        }
        last = now;
    }
    let (writes, max_writes) = {
        let t = tracker.lock().unwrap_or_else(|p| p.into_inner());
        let per: Vec<usize> = t.versions.values().map(|v| v.len().saturating_sub(1)).collect();
        (per.iter().sum::<usize>() as f64 / per.len().max(1) as f64, per.iter().copied().max().unwrap_or(0))
    };
    figures.add("burst: create calls finished", format!("{:.1} s", created.as_secs_f64()));
    figures.add(&format!("burst: all {count} Ready"), format!("{:.1} s (target < 30 s)", ready.as_secs_f64()));
    figures.add(
        "burst: CPU until all Ready (API server + bench clients / controller)",
        format!("{:.1} s / {:.1} s (load average {})", cpu.0, cpu.1, std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()),
    );
    figures.add("burst: API writes per Server, create→Ready", format!("{writes:.2} mean, {max_writes} max (target ≤ 6)"));
    if count > 1000 {
        let rss = rss_kib(controller.id()).unwrap_or(0);
        figures.add("burst: controller RSS", format!("{:.1} MiB", rss as f64 / 1024.0));
        controller.kill()?;
        controller.wait()?;
        env.shutdown().await;
        return Ok(());
    }
    // Resync: every Server reconciles again (resync 20 s) and nothing may be written.
    let before_events = tracker.lock().unwrap_or_else(|p| p.into_inner()).events;
    let before = scrape_metric(metrics, "provisioning_reconciles_total{kind=\"Server\"}").await.unwrap_or(0.0);
    wait_for("a full resync round", Duration::from_secs(120), || async {
        let now = scrape_metric(metrics, "provisioning_reconciles_total{kind=\"Server\"}").await?;
        (now >= before + 1000.0).then_some(())
    })
    .await?;
    let after_events = tracker.lock().unwrap_or_else(|p| p.into_inner()).events;
    let after = scrape_metric(metrics, "provisioning_reconciles_total{kind=\"Server\"}").await.unwrap_or(0.0);
    figures.add(
        "burst: writes during resync",
        format!("{} over {} resync reconciles (target 0)", after_events - before_events, after - before),
    );
    controller.kill()?;
    controller.wait()?;
    env.shutdown().await;
    Ok(())
}

async fn latency(figures: &mut Figures) -> anyhow::Result<()> {
    println!("latency: 1,000 Servers, 2 s ± 20 % provider latency, parallelLimit 50");
    let env = TestEnv::start().await?;
    let metrics = free_addr()?;
    let mut controller = spawn_controller(&env, 600, metrics)?;
    setup(&env, "latency", 2000, 20, 50, 20000).await?;
    // The workspace's own credential check takes one 2 s call; let it pass first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tracker = track(&env.client, "latency");
    let start = Instant::now();
    create_servers(&env.client, "latency", 1000).await?;
    wait_all_ready(&tracker, 1000, Duration::from_secs(300)).await?;
    let took = start.elapsed().as_secs_f64();
    figures.add("latency: all 1,000 Ready", format!("{took:.1} s = {:.2} × the 40 s floor (target ≤ 1.25 ×)", took / 40.0));
    controller.kill()?;
    controller.wait()?;
    env.shutdown().await;
    Ok(())
}

async fn memory(figures: &mut Figures) -> anyhow::Result<()> {
    println!("memory: controller RSS holding 10,000 Servers");
    let env = TestEnv::start().await?;
    let metrics = free_addr()?;
    let mut controller = spawn_controller(&env, 600, metrics)?;
    setup(&env, "memory", 0, 0, 100, 20000).await?;
    let tracker = track(&env.client, "memory");
    let start = Instant::now();
    create_servers(&env.client, "memory", 10_000).await?;
    wait_all_ready(&tracker, 10_000, Duration::from_secs(1200)).await?;
    let took = start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = rss_kib(controller.id()).unwrap_or(0);
    figures.add("memory: 10,000 Ready", format!("{took:.1} s"));
    figures.add("memory: controller RSS", format!("{:.1} MiB (target < 150 MB)", rss as f64 / 1024.0));
    controller.kill()?;
    controller.wait()?;
    env.shutdown().await;
    Ok(())
}

/// Provider calls of `operation` at the simulated provider so far (the histogram's count).
async fn calls(metrics: SocketAddr, operation: &str) -> f64 {
    let prefix = format!("provisioning_provider_call_duration_seconds_count{{provider=\"simulated\",operation=\"{operation}\"");
    scrape_metric(metrics, &prefix).await.unwrap_or(0.0)
}

async fn survey(figures: &mut Figures) -> anyhow::Result<()> {
    const INTERVAL: u64 = 5;
    println!("survey: 1,000 Ready simulated Servers, survey every {INTERVAL} s, resync 600 s");
    let env = TestEnv::start().await?;
    let metrics = free_addr()?;
    let mut controller = spawn_controller_with(&env, 600, metrics, &format!("survey_secs = {INTERVAL}\n"))?;
    setup(&env, "survey", 0, 0, 50, 20000).await?;
    let tracker = track(&env.client, "survey");
    create_servers(&env.client, "survey", 1000).await?;
    wait_all_ready(&tracker, 1000, Duration::from_secs(300)).await?;
    // Three whole intervals after the creates' own observations have settled.
    tokio::time::sleep(Duration::from_secs(INTERVAL * 2)).await;
    let (surveys, observes) = (calls(metrics, "survey").await, calls(metrics, "observe_server").await);
    tokio::time::sleep(Duration::from_secs(INTERVAL * 3)).await;
    let surveys = calls(metrics, "survey").await - surveys;
    let observes = calls(metrics, "observe_server").await - observes;
    figures.add(
        "survey: provider calls per interval, 1,000 machines in one account",
        format!("{:.1} list + {:.1} per-machine observe (target: 1 + 0)", surveys / 3.0, observes / 3.0),
    );
    // A machine deleted behind the controller's back, through the same store file.
    let sim = provisioning_providers::build_provider(&provisioning_providers::ProviderConfig {
        name: "sim".into(),
        provider_type: "simulated".into(),
        state_dir: env.state_dir.clone(),
        ..Default::default()
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "survey");
    let victim = api.get("srv-00500").await?;
    let id = victim.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    let deleted = Instant::now();
    sim.delete_server(&provisioning_providers::ProviderId(id.clone())).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let again = wait_for("the deleted machine re-created", Duration::from_secs(120), || {
        let api = api.clone();
        let id = id.clone();
        async move {
            let s = api.get("srv-00500").await.ok()?;
            let now = s.status.as_ref().and_then(|st| st.provider_id.clone()).unwrap_or_default();
            (is_ready(&s) && !now.is_empty() && now != id).then_some(())
        }
    })
    .await;
    again?;
    figures.add(
        "survey: machine deleted out of band → Server Ready on a new machine",
        format!("{:.1} s (survey interval {INTERVAL} s: expected ≤ {INTERVAL} s + one reconcile)", deleted.elapsed().as_secs_f64()),
    );
    controller.kill()?;
    controller.wait()?;
    env.shutdown().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let run = |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut figures = Figures(Vec::new());
    runtime.block_on(async {
        if run("burst") {
            burst(&mut figures).await?;
        }
        if run("latency") {
            latency(&mut figures).await?;
        }
        if run("memory") {
            memory(&mut figures).await?;
        }
        if run("survey") {
            survey(&mut figures).await?;
        }
        anyhow::Ok(())
    })?;
    println!("\n| figure | value |\n|---|---|");
    for (what, value) in &figures.0 {
        println!("| {what} | {value} |");
    }
    Ok(())
}
