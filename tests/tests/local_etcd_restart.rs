//! kill -9 of `provisioning dev` in the middle of the etcd rollout: restarted on the same data
//! dir, the controller resumes from status (the step plan is the checkpoint) and the rollout
//! finishes with exactly one container per Server.

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{containers, docker_ok, leftovers, server_container};

const NS: &str = "etcd-demo";
const CLUSTER: &str = "etcd";

#[test]
fn killed_mid_rollout_the_rollout_finishes_without_duplicates() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut first = Dev::start(&["examples/local/etcd-cluster.yaml"])?;
    // The example ships its own Namespace: kubectl works in it.
    first.kubectl_ok(&["config", "set-context", "--current", "--namespace", NS])?;
    // Mid-rollout: servers are being created or etcd is being installed.
    first.wait_until(Duration::from_secs(180), "the rollout to be under way", |d| {
        let phases = d.kubectl_ok(&["get", "ts", "-o", "jsonpath={.items[*].status.servers[*].phase}"])?;
        let servers = d.kubectl_ok(&["get", "srv", "-o", "name"])?;
        Ok(phases.contains("Installing") || servers.lines().count() >= 2)
    })?;
    first.kill9();

    let mut second = Dev::start_in(&first.data_dir, &[])?;
    // The example ships its own Namespace: kubectl works in it.
    second.kubectl_ok(&["config", "set-context", "--current", "--namespace", NS])?;
    second.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "--timeout=300s"])?;
    let steps = second.kubectl_ok(&["get", "pcl", "etcd", "-o", "jsonpath={range .status.steps[*]}{.id}={.state};{end}"])?;
    assert_eq!(steps, "servers/members=Succeeded;taskserv/etcd=Succeeded;");
    // Exactly one container per Server, none left over from the first process.
    assert_eq!(containers(NS, CLUSTER)?.len(), 3, "no duplicate container");
    for i in 0..3 {
        server_container(NS, &format!("etcd-members-{i}"))?;
    }
    let m0 = server_container(NS, "etcd-members-0")?;
    let members = docker_ok(&[
        "exec",
        &m0,
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
        "member",
        "list",
    ])?;
    assert_eq!(members.lines().filter(|l| l.contains("started")).count(), 3, "{members}");

    second.kubectl_ok(&["delete", "cluster", "etcd", "--timeout=300s"])?;
    second.wait_until(Duration::from_secs(120), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    second.stop();
    drop(first);
    Ok(())
}
