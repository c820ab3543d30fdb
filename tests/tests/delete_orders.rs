//! Deletion in the orders users and GitOps tools produce (issue 25, item 1), on the simulated
//! provider: `kubectl delete -f examples/simulated/` (Namespace, then Workspace, then
//! Servers), `kubectl delete namespace`, and the Workspace first. Each checks the simulated
//! provider's own journal (not the controller's status): no machine is left, and every
//! deletion finishes within a deadline. Plus the Workspace's roll-up of its Servers (item 3).

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use serde_json::Value;

const EXAMPLE: &str = "examples/simulated";

/// `provisioning dev` with examples/simulated applied and its 3 Servers Ready, each with a
/// machine at the simulated account.
fn example_ready() -> Result<Dev> {
    let mut dev = Dev::start(&[])?;
    dev.kubectl_ok(&["apply", "-f", &example_dir()])?;
    dev.wait_until(Duration::from_secs(60), "3 servers exist", |d| {
        Ok(d.kubectl_ok(&["get", "srv", "-n", "demo", "-o", "name"])?.lines().count() == 3)
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "srv", "--all", "-n", "demo", "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(30), "3 machines at the provider", |d| Ok(machines_in_store(d)? == 3))?;
    // As a user would: the Workspace too has been reconciled (and holds its finalizer).
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/demo", "--timeout=60s"])?;
    Ok(dev)
}

fn example_dir() -> String {
    provisioning_e2e::workspace_root().join(EXAMPLE).display().to_string()
}

#[test]
fn folder_order_delete_of_the_simulated_example_finishes_and_leaves_no_machine() -> Result<()> {
    let mut dev = example_ready()?;
    // kubectl deletes in file order: the Namespace, the Workspace, then the Servers; it waits
    // for each object to be gone (--wait is the default).
    let started = std::time::Instant::now();
    dev.kubectl_ok(&["delete", "-f", &example_dir(), "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(30), "provider holds no machine", |d| Ok(machines_in_store(d)? == 0))?;
    for (what, args) in [
        ("servers", vec!["get", "srv", "-n", "demo", "-o", "name"]),
        ("workspaces", vec!["get", "ws", "-o", "name"]),
        ("namespace", vec!["get", "namespace", "demo", "--ignore-not-found", "-o", "name"]),
    ] {
        let left = dev.kubectl_ok(&args)?;
        assert!(left.trim().is_empty(), "{what} left after the delete: {left}");
    }
    assert!(started.elapsed() < Duration::from_secs(120), "delete took {:?}", started.elapsed());
    assert!(!dev.log().contains("is not defined in the controller's default workspace"), "{}", dev.log_tail(40));
    Ok(())
}

#[test]
fn kubectl_delete_namespace_deletes_every_machine_and_finishes() -> Result<()> {
    let mut dev = example_ready()?;
    let uid = dev.kubectl_ok(&["get", "namespace", "demo", "-o", "jsonpath={.metadata.uid}"])?;
    // Someone else's finalizer holds one Server after its machine is gone, so the Terminating
    // namespace can be looked at.
    dev.kubectl_ok(&[
        "patch",
        "srv",
        "web-1",
        "-n",
        "demo",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["provisioning.dev/cleanup","example.com/hold"]}}"#,
    ])?;
    dev.kubectl_ok(&["delete", "namespace", "demo", "--wait=false"])?;
    dev.wait_until(Duration::from_secs(60), "every machine deleted at the provider", |d| Ok(machines_in_store(d)? == 0))?;
    dev.wait_until(Duration::from_secs(30), "the namespace names the finalizer it waits for", |d| {
        let ns = get_json(d, &["get", "namespace", "demo"])?;
        Ok(condition(&ns, "NamespaceFinalizersRemaining").is_some_and(|c| {
            c["status"] == "True"
                && c["message"] == "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
        }) && condition(&ns, "NamespaceContentRemaining").is_some_and(|c| c["status"] == "True"))
    })?;
    // A Server being deleted is never Ready/Running.
    let held = get_json(&dev, &["get", "srv", "web-1", "-n", "demo"])?;
    assert_eq!(held["status"]["phase"], "Deleting", "{held}");
    assert!(condition(&held, "Ready").is_some_and(|c| c["status"] == "False" && c["reason"] == "Deleting"), "{held}");
    // Its Workspace says its namespace is going, and is not Ready meanwhile.
    dev.wait_until(Duration::from_secs(30), "the Workspace reports the Terminating namespace", |d| {
        let ws = get_json(d, &["get", "workspace", "demo"])?;
        Ok(condition(&ws, "Ready").is_some_and(|c| c["status"] == "False" && c["reason"] == "NamespaceTerminating"))
    })?;
    dev.kubectl_ok(&["patch", "srv", "web-1", "-n", "demo", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#])?;
    dev.wait_until(Duration::from_secs(60), "namespace gone (or made again by its Workspace)", |d| {
        let now = d.kubectl_ok(&["get", "namespace", "demo", "--ignore-not-found", "-o", "jsonpath={.metadata.uid}"])?;
        Ok(now.trim() != uid.trim())
    })?;
    let left = dev.kubectl_ok(&["get", "srv", "-n", "demo", "-o", "name"])?;
    assert!(left.trim().is_empty(), "servers left: {left}");
    assert_eq!(machines_in_store(&dev)?, 0);
    // The Workspace outlives its namespace's deletion and is Ready again once it made it anew.
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/demo", "--timeout=60s"])?;
    Ok(())
}

#[test]
fn workspace_deleted_first_waits_for_its_servers_and_they_delete_with_its_account() -> Result<()> {
    let mut dev = example_ready()?;
    dev.kubectl_ok(&["delete", "workspace", "demo", "--wait=false"])?;
    dev.wait_until(Duration::from_secs(30), "the Workspace says what holds it", |d| {
        let ws = get_json(d, &["get", "workspace", "demo"])?;
        Ok(condition(&ws, "InUse").is_some_and(|c| {
            c["status"] == "True"
                && c["reason"] == "InUseByResources"
                && c["message"].as_str().is_some_and(|m| m.contains("3 resources") && m.contains("Server web-1"))
        }) && ws["status"]["phase"] == "Terminating")
    })?;
    // The Servers still resolve to it: nothing failed, nothing left the provider.
    assert_eq!(machines_in_store(&dev)?, 3);
    dev.kubectl_ok(&["delete", "srv", "--all", "-n", "demo", "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(30), "the Workspace is gone", |d| {
        Ok(d.kubectl_ok(&["get", "ws", "-o", "name"])?.trim().is_empty())
    })?;
    assert_eq!(machines_in_store(&dev)?, 0, "every machine deleted at its provider");
    assert!(!dev.log().contains("is not defined in the controller's default workspace"), "{}", dev.log_tail(40));
    Ok(())
}

#[test]
fn a_workspace_with_a_failed_server_is_not_ready_and_names_it() -> Result<()> {
    let mut dev = example_ready()?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/demo", "--timeout=60s"])?;
    let bad = r#"{"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "broken", "namespace": "demo"}, "spec": {"provider": "nowhere"}}"#;
    let path = dev.data_dir.join("broken.json");
    std::fs::write(&path, bad)?;
    dev.kubectl_ok(&["apply", "-f", &path.display().to_string()])?;
    dev.wait_until(Duration::from_secs(60), "the Workspace rolls the failure up", |d| {
        let ws = get_json(d, &["get", "workspace", "demo"])?;
        Ok(condition(&ws, "Ready").is_some_and(|c| c["status"] == "False" && c["reason"] == "ResourcesFailed")
            && ws["status"]["counts"]["summary"] == "3/4 ready, 1 failed")
    })?;
    let ws = get_json(&dev, &["get", "workspace", "demo"])?;
    assert_eq!(ws["status"]["phase"], "Degraded");
    let rollup = condition(&ws, "ResourcesReady").cloned().unwrap_or_default();
    assert_eq!(rollup["status"], "False", "{rollup}");
    assert_eq!(rollup["reason"], "UnknownProvider", "{rollup}");
    assert!(rollup["message"].as_str().is_some_and(|m| m.contains("Server broken: ") && m.contains("nowhere")), "{rollup}");
    let table = dev.kubectl_ok(&["get", "ws"])?;
    assert!(table.contains("RESOURCES") && table.contains("3/4 ready, 1 failed"), "{table}");
    // Fixed: Ready again.
    dev.kubectl_ok(&["delete", "srv", "broken", "-n", "demo", "--timeout=60s"])?;
    dev.wait_until(Duration::from_secs(60), "the Workspace is Ready again", |d| {
        let ws = get_json(d, &["get", "workspace", "demo"])?;
        Ok(condition(&ws, "Ready").is_some_and(|c| c["status"] == "True") && ws["status"]["counts"]["summary"] == "3/3 ready")
    })?;
    Ok(())
}

/// A namespace, a Workspace on the simulated account and a 3-member etcd Cluster (scripts are
/// not run by the simulated provider; the steps and machines are real).
const CLUSTER_MANIFEST: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: order}
---
apiVersion: provisioning.dev/v1alpha1
kind: Workspace
metadata: {name: order}
spec:
  defaults: {provider: sim}
  providers:
  - {name: sim, type: simulated}
---
apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {name: etcd, namespace: order}
spec:
  pools:
  - {name: members, replicas: 3, plan: small}
  taskservs:
  - {service: etcd, pools: [members]}
"#;

fn cluster_ready() -> Result<(Dev, String)> {
    let mut dev = Dev::start(&[])?;
    let path = dev.data_dir.join("cluster.yaml");
    std::fs::write(&path, CLUSTER_MANIFEST)?;
    let path = path.display().to_string();
    dev.kubectl_ok(&["apply", "-f", &path])?;
    dev.wait_until(Duration::from_secs(60), "the Cluster exists", |d| {
        Ok(!d.kubectl_ok(&["get", "pcl", "-n", "order", "-o", "name"])?.trim().is_empty())
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "pcl/etcd", "-n", "order", "--timeout=180s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/order", "--timeout=60s"])?;
    assert_eq!(machines_in_store(&dev)?, 3);
    Ok((dev, path))
}

fn assert_all_gone(dev: &mut Dev) -> Result<()> {
    dev.wait_until(Duration::from_secs(60), "provider holds no machine", |d| Ok(machines_in_store(d)? == 0))?;
    dev.wait_until(Duration::from_secs(60), "every object gone", |d| {
        Ok(d.kubectl_ok(&["get", "srv,ts,pcl", "-n", "order", "-o", "name"])?.trim().is_empty())
    })?;
    Ok(())
}

#[test]
fn cluster_deleted_before_its_taskservs_finishes_and_leaves_no_machine() -> Result<()> {
    let (mut dev, path) = cluster_ready()?;
    dev.kubectl_ok(&["delete", "pcl", "etcd", "-n", "order", "--wait=false"])?;
    dev.kubectl_ok(&["delete", "ts", "--all", "-n", "order", "--timeout=120s"])?;
    dev.kubectl_ok(&["wait", "--for=delete", "pcl/etcd", "-n", "order", "--timeout=120s"])?;
    assert_all_gone(&mut dev)?;
    // Then the rest in folder order.
    dev.kubectl_ok(&["delete", "-f", &path, "--ignore-not-found", "--timeout=120s"])?;
    Ok(())
}

#[test]
fn taskservs_deleted_before_their_cluster_finishes_and_leaves_no_machine() -> Result<()> {
    let (mut dev, path) = cluster_ready()?;
    dev.kubectl_ok(&["delete", "ts", "--all", "-n", "order", "--wait=false"])?;
    dev.kubectl_ok(&["delete", "pcl", "etcd", "-n", "order", "--timeout=120s"])?;
    assert_all_gone(&mut dev)?;
    dev.kubectl_ok(&["delete", "-f", &path, "--ignore-not-found", "--timeout=120s"])?;
    Ok(())
}

#[test]
fn folder_order_delete_of_a_cluster_finishes_and_leaves_no_machine() -> Result<()> {
    let (mut dev, path) = cluster_ready()?;
    dev.kubectl_ok(&["delete", "-f", &path, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(30), "provider holds no machine", |d| Ok(machines_in_store(d)? == 0))?;
    let left = dev.kubectl_ok(&["get", "ws", "-o", "name"])?;
    assert!(left.trim().is_empty(), "{left}");
    Ok(())
}

fn get_json(dev: &Dev, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    Ok(serde_json::from_str(&dev.kubectl_ok(&all)?)?)
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Machines alive in the simulated provider's journals under the data dir.
fn machines_in_store(dev: &Dev) -> anyhow::Result<usize> {
    provisioning_e2e::simulated_machines_alive(&dev.data_dir)
}
