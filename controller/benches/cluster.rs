//! Cluster benchmarks (harness = false), against a real `provisioning dev` process:
//!
//! 1. `etcd`: the 3-member etcd cluster of `examples/local/etcd-cluster.yaml` on the local
//!    Docker provider, from apply to `Ready` (node image already built). Target < 60 s.
//! 2. `wide`: 50 single-service Servers in one Cluster with parallelLimit 10, against 5
//!    sequential waves of 10 (five 10-server Clusters, one after the other), on the simulated
//!    provider with 1 s per provider call (create, install exec, check exec). Target: the
//!    50-server Cluster within 1.5 × the 5 waves.
//!
//! Run: `cargo build --bin provisioning && cargo bench -p provisioning-controller --bench cluster [etcd|wide]`
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
    Ok(())
}

fn etcd() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    let start = Instant::now();
    let mut dev = Dev::start(&["examples/local/etcd-cluster.yaml"])?;
    let up = start.elapsed();
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
        Ok(provisioning_e2e::docker::leftovers("default", "etcd")?.is_empty())
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
