//! A rolling config change of the 3-member etcd Cluster of `examples/local/etcd-cluster.yaml`
//! (its pool has `rollout: {maxUnavailable: 1}`): real `provisioning dev`, kubectl, Docker, nu
//! and etcd. The change goes member by member — never two members re-installing at once —
//! and the cluster keeps quorum throughout: a write through any member succeeds at every
//! sample (retried for at most 5 s while a leader election runs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker, docker_ok, leftovers, server_container};

const NS: &str = "etcd-demo";
const CLUSTER: &str = "etcd";
const MEMBERS: [&str; 3] = ["etcd-members-0", "etcd-members-1", "etcd-members-2"];

/// Removes what this test made in Docker when it ends, also when it fails (the next run, and
/// local_etcd, start by refusing leftovers of the `etcd` cluster).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        provisioning_e2e::docker::remove_leftovers(NS, CLUSTER);
    }
}

fn etcdctl<'a>(container: &'a str, endpoints: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "exec",
        container,
        "etcdctl",
        endpoints,
        "--command-timeout=2s",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
    ];
    all.extend_from_slice(args);
    all
}

fn installing(dev: &Dev) -> Result<Vec<String>> {
    let phases = dev.kubectl_ok(&["get", "ts", "etcd-etcd", "-o", "jsonpath={range .status.servers[*]}{.name}={.phase} {end}"])?;
    Ok(phases.split_whitespace().filter(|p| p.ends_with("=Installing")).map(|p| p.trim_end_matches("=Installing").to_string()).collect())
}

#[test]
fn a_config_change_rolls_member_by_member_and_keeps_quorum() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let _cleanup = Cleanup;
    let mut dev = Dev::start(&["examples/local/etcd-cluster.yaml"])?;
    // The example ships its own Namespace: kubectl works in it.
    dev.kubectl_ok(&["config", "set-context", "--current", "--namespace", NS])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "--timeout=300s"])?;
    assert_eq!(dev.kubectl_ok(&["get", "ts", "etcd-etcd", "-o", "jsonpath={.status.updated}"])?, "3/3");
    assert_eq!(dev.kubectl_ok(&["get", "ts", "etcd-etcd", "-o", "jsonpath={.spec.rollout.maxUnavailable}"])?, "1");

    // Clients use every member's address, as an etcd client would.
    let mut addresses = Vec::new();
    for m in MEMBERS {
        addresses.push(dev.kubectl_ok(&["get", "srv", m, "-o", "jsonpath={.status.addresses[0].address}"])?);
    }
    let endpoints = format!("--endpoints={}", addresses.iter().map(|a| format!("https://{a}:2379")).collect::<Vec<_>>().join(","));
    let client = server_container(NS, MEMBERS[0])?;

    // Writer: one put per ~300 ms through all endpoints for the whole rollout.
    let stop = Arc::new(AtomicBool::new(false));
    let outages: Arc<Mutex<Vec<String>>> = Arc::default();
    let writes = Arc::new(Mutex::new(0usize));
    let writer = {
        let (stop, outages, writes, client, endpoints) = (stop.clone(), outages.clone(), writes.clone(), client.clone(), endpoints.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let value = format!("v{i}");
                let started = Instant::now();
                loop {
                    let ok = docker(&etcdctl(&client, &endpoints, &["put", "rolling", &value])).is_ok_and(|o| o.status.success());
                    if ok {
                        *writes.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                        break;
                    }
                    if started.elapsed() > Duration::from_secs(5) {
                        outages.lock().unwrap_or_else(|p| p.into_inner()).push(format!("write {i} failed for 5 s"));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };

    // The change: a different heartbeat interval (rendered into every member's config).
    dev.kubectl_ok(&[
        "patch",
        "pcl",
        "etcd",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/spec/taskservs/0/config","value":{"heartbeatIntervalMs":150}}]"#,
    ])?;
    let generation = |d: &Dev| d.kubectl_ok(&["get", "ts", "etcd-etcd", "-o", "jsonpath={.metadata.generation}"]);
    dev.wait_until(Duration::from_secs(30), "the TaskServ has the new config", |d| Ok(generation(d)? == "2"))?;
    let mut most_at_once = 0;
    let mut seen: Vec<String> = Vec::new();
    dev.wait_until(Duration::from_secs(300), "every member re-installed and the TaskServ Ready", |d| {
        let now = installing(d)?;
        most_at_once = most_at_once.max(now.len());
        for m in now {
            if !seen.contains(&m) {
                seen.push(m);
            }
        }
        let state = d.kubectl_ok(&[
            "get",
            "ts",
            "etcd-etcd",
            "-o",
            "jsonpath={.status.observedGeneration} {.status.updated} {.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        Ok(state == "2 3/3 True")
    })?;
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    assert_eq!(most_at_once, 1, "at most one member re-installed at a time");
    assert!(seen.len() >= 2, "the rollout was observed member by member: {seen:?}");
    let outages = outages.lock().map(|o| o.clone()).unwrap_or_default();
    let writes = *writes.lock().unwrap_or_else(|p| p.into_inner());
    assert!(outages.is_empty(), "quorum was lost: {outages:?} ({writes} writes succeeded)");
    // The writer really ran through the rollout (a fast rollout takes ~4 s: ~2 writes a second).
    assert!(writes >= 3, "only {writes} writes during the rollout");

    // Every member runs the new config, and all three are members.
    for m in MEMBERS {
        let c = server_container(NS, m)?;
        let conf = docker_ok(&["exec", &c, "cat", "/etc/etcd/provisioning.yml"])?;
        assert!(conf.contains("heartbeat-interval: 150"), "{m}: {conf}");
    }
    let members = docker_ok(&etcdctl(&client, &endpoints, &["member", "list"]))?;
    assert_eq!(members.lines().filter(|l| l.contains("started")).count(), 3, "{members}");
    let events = dev.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=etcd-etcd",
        "-o",
        "jsonpath={range .items[*]}{.reason} {end}",
    ])?;
    assert!(!events.contains("InstallFailed"), "{events}");

    dev.kubectl_ok(&["delete", "cluster", "etcd", "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "no container, network or volume left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    dev.stop();
    Ok(())
}
