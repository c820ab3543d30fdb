//! The quick start, end to end: `provisioning dev`, one `kubectl apply -f examples/simulated/`
//! and the real kubectl. Servers on the simulated provider become Ready; deleting them leaves the provider
//! with no machine.

use std::time::Duration;

use provisioning_e2e::Dev;

#[test]
fn quickstart_servers_become_ready_and_delete_cleanly() -> anyhow::Result<()> {
    let mut dev = Dev::start(&[])?;
    // One plain apply of the directory, as a GitOps tool does it on a fresh cluster: the
    // Namespace ships with the example, so every Server is accepted the first time.
    let example = provisioning_e2e::workspace_root().join("examples/simulated");
    dev.kubectl_ok(&["apply", "-f", &example.display().to_string()])?;
    dev.wait_until(Duration::from_secs(120), "3 servers exist", |d| {
        let out = d.kubectl_ok(&["get", "srv", "-n", "demo", "-o", "name"])?;
        Ok(out.lines().count() == 3)
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "srv", "--all", "-n", "demo", "--timeout=120s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/demo", "--timeout=60s"])?;

    // The built-in roles cover our kinds as on a cluster where deploy/rbac was applied: `edit`
    // in a namespace may change Servers there (and may not approve: that is `admin`'s).
    dev.kubectl_ok(&["create", "serviceaccount", "editor", "-n", "demo"])?;
    dev.kubectl_ok(&["create", "rolebinding", "editor", "--clusterrole=edit", "--serviceaccount=demo:editor", "-n", "demo"])?;
    let as_editor = ["--as=system:serviceaccount:demo:editor", "-n", "demo"];
    dev.wait_until(Duration::from_secs(30), "edit covers servers", |d| {
        let out = d.kubectl(&[&["auth", "can-i", "patch", "servers.provisioning.dev"][..], &as_editor[..]].concat())?;
        Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
    })?;
    let get = dev.kubectl_ok(&[&["get", "srv", "-o", "name"][..], &as_editor[..]].concat())?;
    assert_eq!(get.lines().count(), 3, "{get}");

    // Printer columns through the Table API.
    let table = dev.kubectl_ok(&["get", "srv", "-n", "demo"])?;
    for col in ["NAME", "PROVIDER", "ADDRESS", "PHASE", "READY", "AGE"] {
        assert!(table.contains(col), "column {col} missing:\n{table}");
    }
    // The category lists every kind.
    let all = dev.kubectl_ok(&["get", "provisioning", "-A"])?;
    assert!(all.contains("web-1") && all.contains("demo"), "{all}");

    // Each Server has a providerID; the simulated store holds exactly 3 machines.
    let ids = dev.kubectl_ok(&["get", "srv", "-n", "demo", "-o", "jsonpath={.items[*].status.providerID}"])?;
    assert_eq!(ids.split_whitespace().count(), 3, "{ids}");
    // Every machine is at the Workspace's account, none at the controller's default (a Server
    // reconciled before the Workspace reached the cache once got a local Docker container).
    let accounts = dev.kubectl_ok(&["get", "srv", "-n", "demo", "-o", "jsonpath={.items[*].status.provider}"])?;
    assert_eq!(accounts.split_whitespace().collect::<Vec<_>>(), ["sim", "sim", "sim"], "{accounts}");
    let store = machines_in_store(&dev)?;
    assert_eq!(store, 3, "one machine per Server at the provider");

    // The audit log names every create, attributed to its Server and generation.
    let data_dir = dev.data_dir.display().to_string();
    let created = audit_lines(&data_dir, &["--object", "srv/demo/web-1"])?;
    let ensure = created
        .iter()
        .find(|e| e["operation"] == "ensure_server")
        .ok_or_else(|| anyhow::anyhow!("no ensure_server for web-1: {created:?}"))?;
    assert_eq!(ensure["object"]["kind"], "Server");
    assert_eq!(ensure["object"]["generation"], 1);
    assert_eq!(
        (ensure["provider"].as_str(), ensure["account"].as_str(), ensure["outcome"].as_str()),
        (Some("simulated"), Some("sim"), Some("ok"))
    );
    assert!(created.iter().all(|e| e["object"]["name"] == "web-1"), "{created:?}");
    let table = provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &data_dir, "--since", "10m"])?;
    assert!(table.starts_with("TIME") && table.contains("ensure_server at simulated/sim"), "{table}");
    let bad = provisioning_e2e::provisioning(&["audit", "--data-dir", &data_dir, "--object", "pod/demo/x"])?;
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("unknown kind"), "{bad:?}");

    dev.kubectl_ok(&["delete", "srv", "--all", "-n", "demo", "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "provider holds no machine", |d| Ok(machines_in_store(d)? == 0))?;
    dev.wait_until(Duration::from_secs(10), "the deletes are in the audit log", |_| {
        let lines = audit_lines(&data_dir, &[])?;
        Ok(lines.iter().filter(|e| e["operation"] == "delete_server" && e["outcome"] == "ok").count() >= 3)
    })?;
    Ok(())
}

/// `provisioning audit -o json` entries.
fn audit_lines(data_dir: &str, filter: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut args = vec!["audit", "--data-dir", data_dir, "-o", "json"];
    args.extend_from_slice(filter);
    let out = provisioning_e2e::provisioning_ok(&args)?;
    out.lines().map(|l| Ok(serde_json::from_str(l)?)).collect()
}

/// Machines alive in the simulated provider's journals under the data dir.
fn machines_in_store(dev: &Dev) -> anyhow::Result<usize> {
    provisioning_e2e::simulated_machines_alive(&dev.data_dir)
}
