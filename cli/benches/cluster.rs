//! Cluster benchmarks (harness = false), against a real `provisioning dev` process:
//!
//! 1. `etcd`: the 3-member etcd cluster of `examples/local/etcd-cluster.yaml` on the local
//!    Docker provider, from apply to `Ready` (node image already built). Target < 60 s.
//! 2. `wide`: 50 single-service Servers in one Cluster with parallelLimit 10, against 5
//!    sequential waves of 10 (five 10-server Clusters, one after the other), on the simulated
//!    provider with 1 s per provider call (create, install exec, check exec). Target: the
//!    50-server Cluster within 1.5 × the 5 waves.
//! 3. `drift`: a standalone local Server whose container is removed (`docker rm -f`) and then
//!    stopped (`docker stop`) behind the controller's back, 5 times each: how long until the
//!    Server says Drifted=True, and until it is Ready again on a running container. Polled
//!    with kubectl every ~100 ms (each poll is a kubectl process: the figures include up to
//!    one poll of delay).
//!
//! Run: `cargo build --bin provisioning && cargo bench -p provisioning-cli --bench cluster [etcd|wide|drift]`
//! (needs Docker and the node image for `etcd`; see scripts/setup.sh).

use std::time::{Duration, Instant};

use anyhow::Result;
use provisioning_e2e::Dev;

fn main() -> Result<()> {
    let which: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let all = which.is_empty();
    if all || which.iter().any(|w| w == "etcd") {
        etcd()?;
    }
    if all || which.iter().any(|w| w == "wide") {
        wide()?;
    }
    if all || which.iter().any(|w| w == "drift") {
        drift()?;
    }
    Ok(())
}

const DRIFT_SERVER: &str = r#"apiVersion: provisioning.dev/v1alpha1
kind: Server
metadata: {name: bench-drift, namespace: default}
spec: {provider: local, plan: small}
"#;

/// `status` of the Drifted condition and Ready, in one kubectl call.
fn drift_state(dev: &Dev) -> Result<(String, String)> {
    let out = dev.kubectl_ok(&[
        "get",
        "server",
        "bench-drift",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Drifted\")].status} {.status.conditions[?(@.type==\"Ready\")].status}",
    ])?;
    let mut parts = out.split_whitespace();
    Ok((parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default().to_string()))
}

fn drift() -> Result<()> {
    use provisioning_e2e::docker::{docker, docker_ok, server_container};
    provisioning_e2e::docker::require_node_image()?;
    let dir = tempfile::tempdir()?;
    let manifest = dir.path().join("drift.yaml");
    std::fs::write(&manifest, DRIFT_SERVER)?;
    let manifest = manifest.to_string_lossy().into_owned();
    let mut dev = Dev::start(&[&manifest])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "server/bench-drift", "--timeout=300s"])?;
    for (what, action) in [("docker rm -f", "rm"), ("docker stop", "stop")] {
        let (mut noticed, mut recovered) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let container = server_container("default", "bench-drift")?;
            let t = Instant::now();
            match action {
                "rm" => docker_ok(&["rm", "-f", &container])?,
                _ => docker_ok(&["stop", "-t", "0", &container])?,
            };
            dev.wait_until(Duration::from_secs(60), "Drifted=True", |d| Ok(drift_state(d)?.0 == "True"))?;
            noticed.push(t.elapsed());
            dev.wait_until(Duration::from_secs(120), "Ready again", |d| {
                let running = server_container("default", "bench-drift")
                    .and_then(|c| docker_ok(&["inspect", "-f", "{{.State.Running}}", &c]))
                    .is_ok_and(|r| r.trim() == "true");
                Ok(running && drift_state(d)? == ("False".to_string(), "True".to_string()))
            })?;
            recovered.push(t.elapsed());
        }
        noticed.sort();
        recovered.sort();
        println!(
            "drift: {what} → Drifted=True median {:.2} s (max {:.2} s); → Ready on a running container median {:.2} s (max {:.2} s) [5 rounds]",
            noticed[2].as_secs_f64(),
            noticed[4].as_secs_f64(),
            recovered[2].as_secs_f64(),
            recovered[4].as_secs_f64()
        );
    }
    dev.kubectl_ok(&["delete", "server", "bench-drift", "--timeout=120s"])?;
    for id in docker_ok(&["ps", "-aq", "--filter", "label=provisioning.dev/server=bench-drift"])?.split_whitespace() {
        let _ = docker(&["rm", "-f", id]);
    }
    dev.stop();
    Ok(())
}

fn etcd() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    let start = Instant::now();
    let mut dev = Dev::start(&["examples/local/etcd-cluster.yaml"])?;
    let up = start.elapsed();
    // The example ships its own Namespace.
    dev.kubectl_ok(&["config", "set-context", "--current", "--namespace", "etcd-demo"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "--timeout=600s"])?;
    let ready = start.elapsed();
    println!(
        "etcd: 3-member cluster apply -> Ready in {:.1} s (control plane up in {:.1} s) [target < 60 s]",
        ready.as_secs_f64(),
        up.as_secs_f64()
    );
    let steps =
        dev.kubectl_ok(&["get", "pcl", "etcd", "-o", "jsonpath={range .status.steps[*]}{.id} {.startedAt} {.finishedAt}{\"\\n\"}{end}"])?;
    println!("etcd: steps\n{steps}");
    dev.kubectl_ok(&["delete", "cluster", "etcd", "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "etcd leftovers gone", |_| {
        Ok(provisioning_e2e::docker::leftovers("etcd-demo", "etcd")?.is_empty())
    })?;
    dev.stop();
    Ok(())
}

const LATENCY_MS: u64 = 1000;

fn workspace() -> String {
    format!(
        r#"apiVersion: provisioning.dev/v1alpha1
kind: Workspace
metadata: {{name: bench}}
spec:
  namespace: bench
  defaults: {{provider: sim}}
  providers:
  - name: sim
    type: simulated
    simulation: {{latencyMs: {LATENCY_MS}, jitterPercent: 0}}
  limits: {{maxServers: 200, parallelLimit: 100}}
"#
    )
}

fn cluster(name: &str, replicas: u32, parallel_limit: u32) -> String {
    format!(
        r#"apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {{name: {name}, namespace: bench}}
spec:
  provider: sim
  pools: [{{name: node, replicas: {replicas}}}]
  taskservs: [{{service: redis}}]
  parallelLimit: {parallel_limit}
"#
    )
}

fn apply_and_wait(dev: &mut Dev, dir: &std::path::Path, name: &str, replicas: u32, limit: u32) -> Result<Duration> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, cluster(name, replicas, limit))?;
    let path = path.to_string_lossy().into_owned();
    let start = Instant::now();
    dev.kubectl_ok(&["apply", "-f", &path])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("cluster/{name}"), "-n", "bench", "--timeout=900s"])?;
    Ok(start.elapsed())
}

fn wide() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path().join("workspace.yaml");
    std::fs::write(&ws, workspace())?;
    let ws = ws.to_string_lossy().into_owned();
    let mut dev = Dev::start(&[ws.as_str()])?;
    dev.wait_until(Duration::from_secs(60), "workspace bench Ready", |d| {
        Ok(d.kubectl_ok(&["get", "ws", "bench", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])? == "True")
    })?;
    let mut waves = Duration::ZERO;
    for i in 0..5 {
        let t = apply_and_wait(&mut dev, tmp.path(), &format!("wave-{i}"), 10, 10)?;
        println!("wide: wave {i}: 10 servers Ready in {:.1} s", t.as_secs_f64());
        waves += t;
    }
    let fifty = apply_and_wait(&mut dev, tmp.path(), "fifty", 50, 10)?;
    let ratio = fifty.as_secs_f64() / waves.as_secs_f64();
    println!(
        "wide: 50 servers, parallelLimit 10: {:.1} s; 5 sequential waves of 10: {:.1} s; ratio {:.2} [target <= 1.5]",
        fifty.as_secs_f64(),
        waves.as_secs_f64(),
        ratio
    );
    dev.stop();
    Ok(())
}
