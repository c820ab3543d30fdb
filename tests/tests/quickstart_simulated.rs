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

    dev.kubectl_ok(&["delete", "srv", "--all", "-n", "demo", "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "provider holds no machine", |d| Ok(machines_in_store(d)? == 0))?;
    Ok(())
}

/// Machines alive in the simulated provider's log files under the data dir.
fn machines_in_store(dev: &Dev) -> anyhow::Result<usize> {
    let mut alive = std::collections::BTreeSet::new();
    for entry in walk(&dev.data_dir) {
        if entry.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("simulated-") && n.ends_with(".jsonl")) {
            for line in std::fs::read_to_string(&entry)?.lines() {
                let v: serde_json::Value = serde_json::from_str(line)?;
                match v["op"].as_str() {
                    Some("create") => {
                        alive.insert(v["machine"]["id"].as_str().unwrap_or_default().to_string());
                    }
                    Some("delete") => {
                        alive.remove(v["id"].as_str().unwrap_or_default());
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(alive.len())
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
