//! Scale benchmark of the Server reconciler on the simulated provider.
//!
//! `cargo bench -p provisioning-cli --bench scale [-- SCENARIO...]`
//! Scenarios: `burst` (1,000 Servers, no latency: time to Ready, API writes per Server,
//! writes on resync; `SCALE_SERVERS=5000` changes the count, `SCALE_EXTRA='history_limit = 0'`
//! adds a line to the controller's config), `latency` (1,000 Servers, 2 s ± 20 % latency, parallelLimit 50: time
//! vs the 40 s floor), `memory` (controller RSS holding 10,000 Servers), `survey` (1,000 Ready
//! Servers: provider calls per survey interval, and how long a machine deleted behind the
//! controller's back takes to be noticed and re-created), `replicas` (1, 2 and 4 sharded
//! replicas, 1,000 Servers over 20 Workspaces at 1 s per call; `SCALE_REPLICAS`,
//! `SCALE_WORKSPACES`, `SCALE_PER_WORKSPACE`, `SCALE_LATENCY_MS`; only when named),
//! `rebalance` (3 replicas, 5,000 Servers over 20 Workspaces, one killed mid-rollout; the
//! simulated journal must show one machine per Server; only when named).
//! Default: all but `replicas` and `rebalance`.
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
    track_in(Api::namespaced(client.clone(), namespace))
}

/// Servers of every namespace, keyed `namespace/name`.
fn track_in(api: Api<Server>) -> Arc<Mutex<Tracker>> {
    let tracker: Arc<Mutex<Tracker>> = Arc::default();
    let sink = tracker.clone();
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(item) = stream.next().await {
            let Ok(s) = item else { continue };
            let mut t = sink.lock().unwrap_or_else(|p| p.into_inner());
            t.events += 1;
            let rv = s.resource_version().unwrap_or_default();
            let name = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
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

/// One sharded replica (`sharding = true`, identity starting with `name`) sharing the bench's
/// simulated provider state.
fn spawn_replica(env: &TestEnv, name: &str) -> anyhow::Result<Child> {
    let config = env.dir.path().join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\nsharding = true\nlease_namespace = \"default\"\nresync_secs = 600\nmetrics_addr = \"{}\"\n",
            env.state_dir.display().to_string(),
            free_addr()?
        ),
    )?;
    let bin = std::env::var("SCALE_CONTROLLER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_provisioning").to_string());
    Ok(Command::new(bin)
        .env("POD_NAME", name)
        .args(["controller", "--kubeconfig"])
        .arg(&env.kubeconfig)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("RUST_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
        .spawn()?)
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Throughput of 1, 2 and 4 sharded replicas when provider latency dominates (issue 31
/// item 6): the same Servers over the same Workspaces, each replica count on a fresh API
/// server, timed from the first create to all Ready once every Workspace has a stable owner.
/// What one replica can do is bounded by its reconciles in flight (`concurrency`, 128), each
/// waiting on the provider; N replicas hold N times as many. Reported as a ratio to one
/// replica, measured in the same run.
async fn replicas(figures: &mut Figures) -> anyhow::Result<()> {
    let latency = env_number("SCALE_LATENCY_MS", 1000);
    let workspaces = env_number("SCALE_WORKSPACES", 20) as usize;
    let per = env_number("SCALE_PER_WORKSPACE", 50) as usize;
    let counts: Vec<usize> = std::env::var("SCALE_REPLICAS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .filter(|&c| c > 0)
        .collect();
    println!("replicas: {} Servers over {workspaces} Workspaces, {latency} ms per provider call, replicas {counts:?}", workspaces * per);
    let mut one: Option<f64> = None;
    for n in counts {
        let (took, split) = replicas_once(n, workspaces, per, latency).await?;
        // Objects are split by Workspace: the replica holding the most bounds the speed-up
        // at workspaces / its share, whatever the replicas' speed.
        let bound = workspaces as f64 / split.first().copied().unwrap_or(workspaces).max(1) as f64;
        let ratio = one
            .map(|b| format!(", {:.2} × one replica (Workspaces per replica {split:?}: at most {bound:.2} ×)", b / took))
            .unwrap_or_default();
        if n == 1 {
            one = Some(took);
        }
        figures.add(
            &format!(
                "replicas: {n} replica(s), {} Servers over {workspaces} Workspaces, {latency} ms per call, all Ready",
                workspaces * per
            ),
            format!("{took:.1} s{ratio} (load average {})", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()),
        );
    }
    Ok(())
}

/// Seconds to all Ready, and the Workspaces each replica owned (largest first).
async fn replicas_once(n: usize, workspaces: usize, per: usize, latency: u64) -> anyhow::Result<(f64, Vec<usize>)> {
    let env = TestEnv::start().await?;
    let mut children = Vec::new();
    for i in 0..n {
        children.push(spawn_replica(&env, &format!("rep{i}"))?);
    }
    let names: Vec<String> = (0..workspaces).map(|w| format!("rep-{w:02}")).collect();
    for name in &names {
        setup(&env, name, latency, 0, per as u32, 20000).await?;
    }
    // Every Workspace owned by a replica, every replica owning some, unchanged for 3 s.
    let api: Api<Workspace> = Api::all(env.client.clone());
    let label = provisioning_controller::shard::LABEL;
    let mut last: Option<Vec<String>> = None;
    let mut stable = 0;
    let settled = Instant::now();
    while stable < 3 {
        anyhow::ensure!(settled.elapsed() < Duration::from_secs(180), "Workspaces never settled on {n} replicas: {last:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let list = api.list(&Default::default()).await?;
        let owners: Vec<String> = list
            .items
            .iter()
            .filter(|w| names.contains(&w.name_any()))
            .map(|w| w.labels().get(label).cloned().unwrap_or_default())
            .collect();
        let distinct: std::collections::BTreeSet<&String> = owners.iter().filter(|o| !o.is_empty()).collect();
        let complete = owners.len() == workspaces && owners.iter().all(|o| !o.is_empty()) && distinct.len() == n.min(workspaces);
        stable = if complete && last.as_ref() == Some(&owners) { stable + 1 } else { 0 };
        last = Some(owners);
    }
    let mut split: Vec<usize> = {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for o in last.iter().flatten() {
            *counts.entry(o.as_str()).or_default() += 1;
        }
        counts.into_values().collect()
    };
    split.sort_unstable_by(|a, b| b.cmp(a));
    let tracker = track_in(Api::all(env.client.clone()));
    let start = Instant::now();
    let creates: Vec<anyhow::Result<()>> =
        futures::stream::iter(names.iter()).map(|ns| create_servers(&env.client, ns, per)).buffer_unordered(4).collect().await;
    for c in creates {
        c?;
    }
    wait_all_ready(&tracker, workspaces * per, Duration::from_secs(1800)).await?;
    let took = start.elapsed().as_secs_f64();
    for mut child in children {
        child.kill()?;
        child.wait()?;
    }
    env.shutdown().await;
    Ok((took, split))
}

/// Workspace name → owning replica (the shard label; empty when none).
async fn owners(client: &Client, names: &[String]) -> anyhow::Result<Vec<String>> {
    let list = Api::<Workspace>::all(client.clone()).list(&Default::default()).await?;
    let label = provisioning_controller::shard::LABEL;
    let mut out: Vec<(String, String)> = list
        .items
        .iter()
        .filter(|w| names.contains(&w.name_any()))
        .map(|w| (w.name_any(), w.labels().get(label).cloned().unwrap_or_default()))
        .collect();
    out.sort();
    Ok(out.into_iter().map(|(_, o)| o).collect())
}

/// Machines created per Server uid, from the simulated provider's journals under `dir` (every
/// `create` entry, deleted or not): the oracle of "no machine created twice".
fn creates_per_server(dir: &std::path::Path) -> anyhow::Result<HashMap<String, usize>> {
    let mut out = HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)?.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if p.is_dir() {
                stack.push(p);
            } else if name.starts_with("simulated-") && name.ends_with(".jsonl") {
                for line in std::fs::read_to_string(&p)?.lines() {
                    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
                    if v["op"] == "create"
                        && let Some(uid) = v["machine"]["tags"]["provisioning.dev/server-uid"].as_str()
                    {
                        *out.entry(uid.to_string()).or_default() += 1;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A replica killed (SIGKILL) mid-rollout (issue 31 item 6): 3 sharded replicas, 5,000
/// Servers over 20 Workspaces, 100 ms per provider call; once a third are Ready one replica
/// is killed. Reports how long until its Workspaces carry a live owner, the rollout's time,
/// and machines created per Server from the simulated account's journal (the oracle: exactly
/// one each).
async fn rebalance(figures: &mut Figures) -> anyhow::Result<()> {
    let latency = env_number("SCALE_LATENCY_MS", 100);
    let workspaces = env_number("SCALE_WORKSPACES", 20) as usize;
    let per = env_number("SCALE_PER_WORKSPACE", 250) as usize;
    let total = workspaces * per;
    println!(
        "rebalance: 3 replicas, {total} Servers over {workspaces} Workspaces, {latency} ms per call, one replica killed at a third Ready"
    );
    let env = TestEnv::start().await?;
    let mut children = Vec::new();
    for i in 0..3 {
        children.push(Some(spawn_replica(&env, &format!("rep{i}"))?));
    }
    let names: Vec<String> = (0..workspaces).map(|w| format!("reb-{w:02}")).collect();
    for name in &names {
        setup(&env, name, latency, 0, per as u32, 20000).await?;
    }
    let settled = Instant::now();
    loop {
        anyhow::ensure!(settled.elapsed() < Duration::from_secs(180), "Workspaces never settled on 3 replicas");
        let o = owners(&env.client, &names).await?;
        let distinct: std::collections::BTreeSet<&String> = o.iter().collect();
        if o.len() == workspaces && o.iter().all(|x| !x.is_empty()) && distinct.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let tracker = track_in(Api::all(env.client.clone()));
    let start = Instant::now();
    let client = env.client.clone();
    let creating = {
        let names = names.clone();
        tokio::spawn(async move {
            let results: Vec<anyhow::Result<()>> = futures::stream::iter(names)
                .map(|ns| {
                    let client = client.clone();
                    async move { create_servers(&client, &ns, per).await }
                })
                .buffer_unordered(4)
                .collect()
                .await;
            results.into_iter().collect::<anyhow::Result<Vec<()>>>()
        })
    };
    wait_all_ready(&tracker, total / 3, Duration::from_secs(1800)).await?;
    let victim_owned: Vec<String> = owners(&env.client, &names).await?.into_iter().filter(|o| o.starts_with("rep1")).collect();
    let ready_at_kill = tracker.lock().unwrap_or_else(|p| p.into_inner()).ready_at.len();
    if let Some(mut victim) = children[1].take() {
        victim.kill()?;
        victim.wait()?;
    }
    let killed = Instant::now();
    let moved = wait_for("the killed replica's Workspaces owned by a live replica", Duration::from_secs(120), || {
        let client = env.client.clone();
        let names = names.clone();
        async move {
            let o = owners(&client, &names).await.ok()?;
            o.iter().all(|x| !x.is_empty() && !x.starts_with("rep1")).then_some(())
        }
    })
    .await;
    moved?;
    let moved_after = killed.elapsed().as_secs_f64();
    creating.await??;
    wait_all_ready(&tracker, total, Duration::from_secs(1800)).await?;
    let took = start.elapsed().as_secs_f64();
    let uids: Vec<String> = {
        let mut uids = Vec::new();
        for ns in &names {
            let list = Api::<Server>::namespaced(env.client.clone(), ns).list(&Default::default()).await?;
            uids.extend(list.items.iter().filter_map(|s| s.uid()));
        }
        uids
    };
    let creates = creates_per_server(&env.state_dir)?;
    let twice = uids.iter().filter(|u| creates.get(*u).copied().unwrap_or(0) > 1).count();
    let none = uids.iter().filter(|u| creates.get(*u).copied().unwrap_or(0) == 0).count();
    figures.add(
        "rebalance: replica killed mid-rollout",
        format!(
            "at {ready_at_kill} of {total} Ready, it owned {} of {workspaces} Workspaces; all owned by live replicas {moved_after:.1} s after the kill (target ≤ 15 s); all Ready {took:.1} s after the first create",
            victim_owned.len()
        ),
    );
    figures.add(
        "rebalance: machines per Server (simulated journal)",
        format!("{} Servers: {twice} with more than one machine created, {none} with none (target 0 and 0)", uids.len()),
    );
    for child in children.iter_mut().flatten() {
        child.kill()?;
        child.wait()?;
    }
    env.shutdown().await;
    anyhow::ensure!(twice == 0 && none == 0, "machines created twice: {twice}, Servers without a machine: {none}");
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
        // Not in the default set: it starts seven controllers and takes minutes.
        if wanted.iter().any(|w| w == "replicas") {
            replicas(&mut figures).await?;
        }
        if wanted.iter().any(|w| w == "rebalance") {
            rebalance(&mut figures).await?;
        }
        anyhow::Ok(())
    })?;
    println!("\n| figure | value |\n|---|---|");
    for (what, value) in &figures.0 {
        println!("| {what} | {value} |");
    }
    Ok(())
}
