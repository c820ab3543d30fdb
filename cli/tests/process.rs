//! The `provisioning controller` binary as a separate process: kill -9 mid-way through 200
//! Servers, and two replicas with Lease leader election.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use provisioning_controller::testing::{self, TestEnv, is_ready, server, wait_for};
use provisioning_crds::{Server, Workspace};
use serde_json::json;

fn free_addr() -> SocketAddr {
    #[allow(clippy::unwrap_used)]
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn spawn_controller(env: &TestEnv, config: &Path, metrics: SocketAddr) -> anyhow::Result<Child> {
    let verbose = std::env::var_os("RUST_LOG").is_some();
    Ok(Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .arg("controller")
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .arg("--config")
        .arg(config)
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .stdout(Stdio::null())
        .stderr(if verbose { Stdio::inherit() } else { Stdio::null() })
        .spawn()?)
}

fn write_config(env: &TestEnv) -> anyhow::Result<std::path::PathBuf> {
    let path = env.dir.path().join("controller.toml");
    std::fs::write(
        &path,
        format!(
            "state_dir = {:?}\nleader_election = true\nlease_duration_secs = 10\nlease_renew_secs = 2\n",
            env.state_dir.display().to_string()
        ),
    )?;
    Ok(path)
}

/// GET `path` from the controller's metrics server: the whole HTTP response.
async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

async fn scrape(addr: SocketAddr) -> Option<String> {
    get(addr, "/metrics").await
}

/// The status code of GET /readyz.
async fn readyz(addr: SocketAddr) -> Option<String> {
    get(addr, "/readyz").await?.split_whitespace().nth(1).map(str::to_string)
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())).sum()
}

async fn workspace(env: &TestEnv, name: &str, latency_ms: u64, failure_rate: f64, parallel: u32) -> anyhow::Result<()> {
    let ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
        "spec": {
            "providers": [{"name": "sim", "type": "simulated",
                           "simulation": {"latencyMs": latency_ms, "jitterPercent": 20, "failureRate": failure_rate}}],
            "defaults": {"provider": "sim"},
            "limits": {"maxServers": 1000, "parallelLimit": parallel}
        }
    }))?;
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &ws).await?;
    Ok(())
}

async fn create_servers(api: &Api<Server>, namespace: &str, names: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let names: Vec<String> = names.collect();
    for chunk in names.chunks(25) {
        futures::future::try_join_all(chunk.iter().map(|n| {
            let s = server(namespace, n, json!({}));
            async move { api.create(&PostParams::default(), &s).await }
        }))
        .await?;
    }
    Ok(())
}

/// Every Server Ready with exactly one machine each, tagged with its uid.
async fn assert_one_machine_each(env: &TestEnv, api: &Api<Server>, namespace: &str, expected: usize) -> anyhow::Result<()> {
    let servers = api.list(&ListParams::default()).await?.items;
    assert_eq!(servers.len(), expected);
    let machines = testing::machines_in(&env.simulated("sim")?, namespace).await?;
    let mut per_uid: BTreeMap<String, usize> = BTreeMap::new();
    for m in &machines {
        *per_uid.entry(m.tags.get(provisioning_providers::tags::SERVER_UID).cloned().unwrap_or_default()).or_default() += 1;
    }
    if machines.len() != expected {
        // Diagnose: what does the log file itself say (a fresh reader), and which are missing?
        let log = std::fs::read_to_string(env.state_dir.join("simulated-sim.jsonl")).unwrap_or_default();
        let creates = log.lines().filter(|l| l.contains("\"op\":\"create\"")).count();
        let unreadable: Vec<&str> = log.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err()).collect();
        let missing: Vec<String> = servers
            .iter()
            .filter(|s| !per_uid.contains_key(&s.uid().unwrap_or_default()))
            .map(|s| {
                format!(
                    "{} {:?} in-log:{}",
                    s.name_any(),
                    s.status.as_ref().and_then(|st| st.provider_id.clone()),
                    s.status
                        .as_ref()
                        .and_then(|st| st.provider_id.clone())
                        .is_some_and(|id| log.contains(id.trim_start_matches("simulated://")))
                )
            })
            .collect();
        eprintln!("log: {creates} creates, unreadable lines: {unreadable:?}\nmissing: {missing:#?}");
    }
    assert_eq!(machines.len(), expected, "one machine per server, no leaks");
    for s in &servers {
        assert!(is_ready(s), "{} Ready", s.name_any());
        assert_eq!(per_uid.get(&s.uid().unwrap_or_default()), Some(&1), "{} has exactly one machine", s.name_any());
        let id = s.status.as_ref().and_then(|st| st.provider_id.clone()).unwrap_or_default();
        assert!(machines.iter().any(|m| m.provider_id.0 == id), "{} providerID is its machine", s.name_any());
    }
    Ok(())
}

async fn delete_all_and_check_provider_empty(env: &TestEnv, api: &Api<Server>, namespace: &str) -> anyhow::Result<()> {
    api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    wait_for("all servers gone", Duration::from_secs(180), || async {
        api.list(&ListParams::default()).await.ok().filter(|l| l.items.is_empty()).map(|_| ())
    })
    .await?;
    assert!(testing::machines_in(&env.simulated("sim")?, namespace).await?.is_empty(), "the provider holds no machine");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_way_through_200_servers_leaks_nothing() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let config = write_config(&env)?;
    let mut first = spawn_controller(&env, &config, free_addr())?;
    // Lost responses (failure injected after the create) exercise the create-pending guard too.
    workspace(&env, "crash", 200, 0.05, 10).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "crash");
    wait_for("namespace crash", Duration::from_secs(60), || async {
        Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone()).get_opt("crash").await.ok().flatten()
    })
    .await?;
    create_servers(&api, "crash", (0..200).map(|i| format!("srv-{i:03}"))).await?;
    wait_for("some machines being created", Duration::from_secs(120), || async {
        let n = testing::machines_in(&env.simulated("sim").ok()?, "crash").await.ok()?.len();
        (n >= 40).then_some(n)
    })
    .await?;
    first.kill()?; // SIGKILL
    first.wait()?;
    let ready_at_kill = api.list(&ListParams::default()).await?.items.iter().filter(|s| is_ready(s)).count();
    eprintln!("killed the controller with {ready_at_kill}/200 Ready");
    assert!(ready_at_kill < 200, "the kill came mid-way");

    let mut second = spawn_controller(&env, &config, free_addr())?;
    wait_for("all 200 Ready", Duration::from_secs(300), || async {
        let items = api.list(&ListParams::default()).await.ok()?.items;
        (items.len() == 200 && items.iter().all(is_ready)).then_some(())
    })
    .await?;
    assert_one_machine_each(&env, &api, "crash", 200).await?;
    // Nothing at any other provider either: before the cache-sync gate, a restarted
    // controller resolved some Servers to its default workspace (account `local`) and made
    // Docker containers for them.
    let elsewhere = testing::machines_in(&testing::local(&env.state_dir)?, "crash").await?;
    assert!(
        elsewhere.is_empty(),
        "machines created at the default (local) provider: {:?}",
        elsewhere.iter().map(|m| &m.provider_id.0).collect::<Vec<_>>()
    );
    delete_all_and_check_provider_empty(&env, &api, "crash").await?;
    second.kill()?;
    second.wait()?;
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_never_both_act_and_the_standby_takes_over() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let config = write_config(&env)?;
    let addrs = [free_addr(), free_addr()];
    let mut children = [spawn_controller(&env, &config, addrs[0])?, spawn_controller(&env, &config, addrs[1])?];

    // Sample both replicas' leader gauges and reconcile counters throughout.
    // Per sample: (leader gauge, reconciles) of each replica.
    type Samples = std::sync::Mutex<Vec<[(f64, f64); 2]>>;
    let samples: std::sync::Arc<Samples> = Default::default();
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                let mut row = [(0.0, 0.0); 2];
                for (i, addr) in addrs.iter().enumerate() {
                    if let Some(text) = scrape(*addr).await {
                        row[i] = (metric(&text, "provisioning_leader "), metric(&text, "provisioning_reconciles_total"));
                    }
                }
                samples.lock().unwrap_or_else(|p| p.into_inner()).push(row);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let leader = wait_for("one leader", Duration::from_secs(60), || async {
        let a = metric(&scrape(addrs[0]).await?, "provisioning_leader ");
        let b = metric(&scrape(addrs[1]).await?, "provisioning_leader ");
        match (a, b) {
            (1.0, 0.0) => Some(0usize),
            (0.0, 1.0) => Some(1usize),
            _ => None,
        }
    })
    .await?;
    let standby = 1 - leader;

    workspace(&env, "ha", 0, 0.0, 10).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "ha");
    wait_for("namespace ha", Duration::from_secs(60), || async {
        Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone()).get_opt("ha").await.ok().flatten()
    })
    .await?;
    create_servers(&api, "ha", (0..20).map(|i| format!("before-{i:02}"))).await?;
    wait_for("20 Ready", Duration::from_secs(120), || async {
        let items = api.list(&ListParams::default()).await.ok()?.items;
        (items.len() == 20 && items.iter().all(is_ready)).then_some(())
    })
    .await?;
    let standby_text = scrape(addrs[standby]).await.unwrap_or_default();
    assert_eq!(metric(&standby_text, "provisioning_reconciles_total"), 0.0, "the standby never reconciled");
    // Both replicas are ready (a Deployment of two must finish rolling out).
    for addr in &addrs {
        assert_eq!(readyz(*addr).await.as_deref(), Some("200"), "/readyz of {addr}");
    }

    children[leader].kill()?;
    children[leader].wait()?;
    let killed = Instant::now();
    create_servers(&api, "ha", (0..10).map(|i| format!("after-{i:02}"))).await?;
    wait_for("standby becomes leader", Duration::from_secs(20), || async {
        (metric(&scrape(addrs[standby]).await?, "provisioning_leader ") == 1.0).then_some(())
    })
    .await?;
    let takeover = killed.elapsed();
    eprintln!("takeover after {takeover:?}");
    assert!(takeover <= Duration::from_secs(15), "took over within 15 s ({takeover:?})");
    wait_for("30 Ready", Duration::from_secs(120), || async {
        let items = api.list(&ListParams::default()).await.ok()?.items;
        (items.len() == 30 && items.iter().all(is_ready)).then_some(())
    })
    .await?;
    assert_one_machine_each(&env, &api, "ha", 30).await?;

    sampler.abort();
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(samples.iter().all(|row| !(row[0].0 == 1.0 && row[1].0 == 1.0)), "two leaders at once");
    // Before the kill, only the leader reconciled.
    let acted: BTreeSet<usize> = samples.iter().flat_map(|row| (0..2).filter(move |i| row[*i].1 > 0.0)).collect();
    assert!(acted.contains(&leader));
    children[standby].kill()?;
    children[standby].wait()?;
    env.shutdown().await;
    Ok(())
}

fn write_manifest(dir: &Path, plan: &str) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join(format!("manifest-{plan}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {{name: demo}}\nspec:\n  providers: [{{name: sim, type: simulated}}]\n  defaults: {{provider: sim}}\n---\napiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {{name: web-1, namespace: demo}}\nspec: {{plan: {plan}}}\n---\napiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {{name: web-2, namespace: demo}}\nspec: {{}}\n"
        ),
    )?;
    Ok(path)
}

#[test]
fn dev_applies_manifests_and_exits_when_ready() -> anyhow::Result<()> {
    let dir = provisioning_controller::testing::tempfile_dir::Dir::new("dev-test")?;
    let manifest = write_manifest(dir.path(), "small")?;
    let out = Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .args(["dev", "--listen", "127.0.0.1:0", "--exit-when-ready", "--timeout", "120", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--apply")
        .arg(&manifest)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("export KUBECONFIG={}", dir.path().join("data").join("kubeconfig").display())), "{stdout}");
    assert!(stdout.contains("Server/demo/web-1") && stdout.contains("Running"), "{stdout}");
    assert!(stdout.contains("all 3 resource(s) Ready"), "{stdout}");
    // Stopping stops the controller's watches before the API server: nothing to report.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("ERROR"), "{stderr}");
    Ok(())
}

#[test]
fn dev_exits_non_zero_naming_what_is_not_ready() -> anyhow::Result<()> {
    let dir = provisioning_controller::testing::tempfile_dir::Dir::new("dev-test-bad")?;
    let manifest = write_manifest(dir.path(), "gigantic")?;
    let out = Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .args(["dev", "--listen", "127.0.0.1:0", "--exit-when-ready", "--timeout", "8", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--apply")
        .arg(&manifest)
        .output()?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Server/demo/web-1") && stderr.contains("plan \"gigantic\" is not offered"), "{stderr}");
    // A log read from a pipe or a file carries no colour codes.
    assert!(stderr.contains(" INFO ") && !stderr.contains('\u{1b}'), "{stderr}");
    Ok(())
}
