//! Rolling machine updates of a Cluster pool (`pools[].rollout`) on the local provider, through
//! `provisioning dev`, kubectl, Docker and nu (tests/tests/local_pool_rolling.yaml: 2 members
//! running nginx). An image change can only be carried out by a new container per member.
//! - `maxUnavailable: 1`: members are replaced one after the other, each only once nginx
//!   serves again on the new container of the one before; at every sample at least one
//!   container answers nginx's /healthz.
//! - `maxUnavailable: 0, maxSurge: 1`: a third (surge) Server of the new image comes up with
//!   nginx first; then the members are replaced one at a time; at every sample at least two
//!   containers answer, never more than three exist, and the surge Server is gone at the end.
//!
//! Serving is probed in the containers themselves (`curl /healthz` inside each running
//! container of the namespace), not read from the controller's status.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker, docker_ok};
use serde_json::Value;

const NS: &str = "pool-rolling-e2e";
const CLUSTER: &str = "roll";
const MEMBERS: [&str; 2] = ["roll-web-0", "roll-web-1"];
const SURGE: &str = "roll-web-surge-0";
/// Two more tags of the node image: changing between them needs a new container.
const IMAGE_A: &str = "provisioning-node:pool-rolling-a";
const IMAGE_B: &str = "provisioning-node:pool-rolling-b";

/// Removes what this test left in Docker (also when it fails).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        provisioning_e2e::docker::remove_namespace(NS);
        let _ = docker(&["rmi", IMAGE_A, IMAGE_B]);
    }
}

#[derive(Clone, Debug)]
struct Container {
    id: String,
    image: String,
    server: String,
}

fn all_ids() -> Result<Vec<String>> {
    provisioning_e2e::docker::namespace_containers(NS)
}

/// Running containers of the namespace.
fn running() -> Result<Vec<Container>> {
    let ns = format!("label=provisioning.dev/namespace={NS}");
    let out = docker_ok(&["ps", "--filter", &ns, "--format", "{{.ID}} {{.Image}} {{.Label \"provisioning.dev/server\"}}"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some(Container { id: parts.next()?.into(), image: parts.next()?.into(), server: parts.next().unwrap_or_default().into() })
        })
        .collect())
}

/// nginx answers /healthz inside the container.
fn serves(c: &Container) -> bool {
    docker(&["exec", &c.id, "curl", "-sf", "--max-time", "2", "http://127.0.0.1/healthz"]).is_ok_and(|o| o.status.success())
}

/// What the samples of one rollout saw.
#[derive(Debug, Default)]
struct Samples {
    count: usize,
    fewest_serving: usize,
    most_containers: usize,
    servers_seen: Vec<String>,
}

fn cluster(dev: &Dev) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(&["get", "cluster", CLUSTER, "-n", NS, "-o", "json"])?)?)
}

fn ready_at(c: &Value, generation: i64) -> bool {
    c["status"]["observedGeneration"] == generation
        && c["status"]["servers"]["updated"] == "2/2"
        && c["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|x| x["type"] == "Ready" && x["status"] == "True"))
}

/// Samples the containers until the Cluster is Ready at `generation` with every member updated.
fn sample_until_ready(dev: &mut Dev, generation: i64) -> Result<Samples> {
    let mut s = Samples { fewest_serving: usize::MAX, ..Default::default() };
    dev.wait_until(Duration::from_secs(300), "the rolling update to finish", |d| {
        let now = running()?;
        let serving = now.iter().filter(|c| serves(c)).count();
        s.count += 1;
        s.fewest_serving = s.fewest_serving.min(serving);
        s.most_containers = s.most_containers.max(now.len());
        for c in &now {
            if !s.servers_seen.contains(&c.server) {
                s.servers_seen.push(c.server.clone());
            }
        }
        Ok(ready_at(&cluster(d)?, generation))
    })?;
    Ok(s)
}

fn patch_pool(dev: &Dev, patch: &str) -> Result<()> {
    dev.kubectl_ok(&["patch", "cluster", CLUSTER, "-n", NS, "--type", "json", "-p", patch]).map(drop)
}

fn provider_ids(dev: &Dev) -> Result<Vec<String>> {
    MEMBERS.iter().map(|m| dev.kubectl_ok(&["get", "srv", m, "-n", NS, "-o", "jsonpath={.status.providerID}"])).collect()
}

// Over 80 lines on purpose: one story on one control plane (create, roll one by one, roll
// with a surge), each phase starting from the state the one before left.
#[test]
fn a_pool_image_change_rolls_member_by_member_and_with_a_surge() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    ensure!(all_ids()?.is_empty(), "leftovers of an earlier run in namespace {NS}: {:?}", all_ids()?);
    let _cleanup = Cleanup;
    docker_ok(&["tag", "provisioning-node:latest", IMAGE_A])?;
    docker_ok(&["tag", "provisioning-node:latest", IMAGE_B])?;
    let mut dev = Dev::start(&["tests/tests/local_pool_rolling.yaml"])?;
    dev.wait_until(Duration::from_secs(240), "the Cluster Ready", |d| Ok(ready_at(&cluster(d)?, 1)))?;
    let table = dev.kubectl_ok(&["get", "cluster", CLUSTER, "-n", NS])?;
    ensure!(table.contains("UPDATED") && table.contains("2/2"), "the UPDATED column:\n{table}");
    let before = provider_ids(&dev)?;
    ensure!(running()?.iter().filter(|c| serves(c)).count() == 2, "both members serve nginx");

    // maxUnavailable 1: one member at a time.
    let t0 = Instant::now();
    patch_pool(&dev, &format!(r#"[{{"op":"add","path":"/spec/pools/0/image","value":"{IMAGE_A}"}}]"#))?;
    let one = sample_until_ready(&mut dev, 2)?;
    eprintln!("maxUnavailable 1: {:?} in {:?}", one, t0.elapsed());
    ensure!(one.fewest_serving >= 1, "a member kept serving throughout: {one:?}");
    ensure!(one.most_containers <= 2, "no extra machine without maxSurge: {one:?}");
    ensure!(one.count >= 5, "the rollout was sampled: {one:?}");
    let after = provider_ids(&dev)?;
    ensure!(before.iter().zip(&after).all(|(b, a)| b != a), "both members got a new machine: {before:?} → {after:?}");
    let now = running()?;
    ensure!(now.len() == 2 && now.iter().all(|c| c.image == IMAGE_A && serves(c)), "{now:?}");
    let events = dev.kubectl_ok(&["get", "events", "-n", NS, "-o", "jsonpath={range .items[*]}{.reason} {end}"])?;
    ensure!(events.contains("RollingUpdate"), "a RollingUpdate event: {events}");

    // maxUnavailable 0, maxSurge 1: a surge Server first, never fewer than two serving.
    let t0 = Instant::now();
    patch_pool(
        &dev,
        &format!(
            r#"[{{"op":"replace","path":"/spec/pools/0/image","value":"{IMAGE_B}"}},{{"op":"replace","path":"/spec/pools/0/rollout","value":{{"maxUnavailable":0,"maxSurge":1}}}}]"#
        ),
    )?;
    let surge = sample_until_ready(&mut dev, 3)?;
    eprintln!("maxSurge 1: {:?} in {:?}", surge, t0.elapsed());
    ensure!(surge.servers_seen.iter().any(|s| s == SURGE), "the surge Server ran: {surge:?}");
    ensure!(surge.fewest_serving >= 2, "two containers served throughout: {surge:?}");
    ensure!(surge.most_containers <= 3, "at most one extra machine: {surge:?}");
    dev.wait_until(Duration::from_secs(120), "the surge Server gone", |d| {
        let gone = d.kubectl(&["get", "srv", SURGE, "-n", NS])?.status.code() == Some(1);
        Ok(gone && running()?.iter().all(|c| c.server != SURGE))
    })?;
    let now = running()?;
    ensure!(now.len() == 2 && now.iter().all(|c| c.image == IMAGE_B && serves(c)), "{now:?}");
    let ts = dev.kubectl_ok(&["get", "ts", "roll-nginx", "-n", NS, "-o", "jsonpath={.spec.servers.names}"])?;
    ensure!(!ts.contains("surge"), "the surge Server left the TaskServ: {ts}");

    dev.kubectl_ok(&["delete", "cluster", CLUSTER, "-n", NS, "--timeout=180s"])?;
    dev.wait_until(Duration::from_secs(120), "no container left", |_| Ok(all_ids()?.is_empty()))?;
    dev.stop();
    Ok(())
}
