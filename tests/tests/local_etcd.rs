//! The 3-member etcd cluster of `examples/local/etcd-cluster.yaml`, end to end: real
//! `provisioning dev`, real kubectl, real Docker containers from the node image, real `nu`
//! and real etcd. One test function: its phases share one (expensive) cluster.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{containers, docker, docker_ok, leftovers, server_container};

const NS: &str = "etcd-demo";
const CLUSTER: &str = "etcd";

#[test]
fn etcd_cluster_converges_replicates_heals_and_deletes_cleanly() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut dev = Dev::start(&["examples/local/etcd-cluster.yaml"])?;
    // The example ships its own Namespace: kubectl works in it.
    dev.kubectl_ok(&["config", "set-context", "--current", "--namespace", NS])?;

    // Apply → Ready, through kubectl wait (kstatus conditions).
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "--timeout=300s"])?;
    let servers = dev.kubectl_ok(&["get", "srv", "-l", "provisioning.dev/cluster=etcd", "-o", "name"])?;
    assert_eq!(servers.lines().count(), 3, "{servers}");
    assert_eq!(containers(NS, CLUSTER)?.len(), 3, "one container per Server");
    let ts = dev.kubectl_ok(&[
        "get",
        "ts",
        "etcd-etcd",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Healthy\")].status} {.status.installedVersion}",
    ])?;
    assert_eq!(ts, "True 3.4.23");
    let steps = dev.kubectl_ok(&["get", "pcl", "etcd", "-o", "jsonpath={range .status.steps[*]}{.id}={.state};{end}"])?;
    assert_eq!(steps, "servers/members=Succeeded;taskserv/etcd=Succeeded;");

    // A key written through one member is read from another.
    let m0 = server_container(NS, "etcd-members-0")?;
    let m2 = server_container(NS, "etcd-members-2")?;
    docker_ok(&[
        "exec",
        &m0,
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
        "put",
        "greeting",
        "hello from member 0",
    ])?;
    let value = docker_ok(&[
        "exec",
        &m2,
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
        "get",
        "greeting",
        "--print-value-only",
    ])?;
    assert_eq!(value.trim(), "hello from member 0");

    // A Ready cluster is quiet: over a health-check interval (30 s for etcd; checks run and
    // pass) no status is written — resourceVersions stay put.
    let versions = |d: &Dev| {
        d.kubectl_ok(&["get", "pcl,ts,srv", "-o", "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}"])
    };
    let before = versions(&dev)?;
    std::thread::sleep(Duration::from_secs(40));
    assert_eq!(versions(&dev)?, before, "no writes on a no-op resync");

    // Kill one member: the TaskServ goes Healthy=False, the Server is recreated and rejoins,
    // the Cluster is Ready again.
    let victim = server_container(NS, "etcd-members-1")?;
    docker_ok(&["kill", &victim])?;
    dev.wait_until(Duration::from_secs(180), "TaskServ etcd-etcd Healthy=False", |d| {
        let s = d.kubectl_ok(&["get", "ts", "etcd-etcd", "-o", "jsonpath={.status.conditions[?(@.type==\"Healthy\")].status}"])?;
        Ok(s == "False")
    })?;
    dev.wait_until(Duration::from_secs(300), "member 1 back in a running container", |_| {
        Ok(server_container(NS, "etcd-members-1").is_ok_and(|c| c != victim && running(&c)))
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "--timeout=300s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Healthy", "ts/etcd-etcd", "--timeout=120s"])?;
    let m1 = server_container(NS, "etcd-members-1")?;
    // `endpoint health` exits non-zero (docker_ok fails) unless the member is healthy.
    docker_ok(&[
        "exec",
        &m1,
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
        "endpoint",
        "health",
    ])?;
    let members = docker_ok(&[
        "exec",
        &m1,
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
        "member",
        "list",
    ])?;
    assert_eq!(members.lines().filter(|l| l.contains("started")).count(), 3, "{members}");
    let value = docker_ok(&[
        "exec",
        &m1,
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
        "get",
        "greeting",
        "--print-value-only",
    ])?;
    assert_eq!(value.trim(), "hello from member 0", "the rejoined member has the data");
    assert_eq!(containers(NS, CLUSTER)?.len(), 3, "no extra container");

    // Events tell the story. The killed container is noticed from Docker's events within
    // moments, so the Cluster replaces the member (Remediating), usually before the etcd
    // health check (every 30 s) had a chance to report it Unhealthy.
    let events = dev.kubectl_ok(&["get", "events", "-o", "jsonpath={range .items[*]}{.reason} {end}"])?;
    for reason in ["Installed", "Ready", "Remediating"] {
        assert!(events.contains(reason), "event {reason} missing: {events}");
    }

    // Delete: nothing with the cluster's labels remains.
    dev.kubectl_ok(&["delete", "cluster", "etcd", "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "no container, network or volume left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    let left = dev.kubectl_ok(&["get", "srv,ts", "-l", "provisioning.dev/cluster=etcd", "-o", "name"])?;
    assert!(left.trim().is_empty(), "{left}");
    dev.stop();
    Ok(())
}

fn running(container: &str) -> bool {
    docker(&["inspect", "-f", "{{.State.Running}}", container])
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
}
