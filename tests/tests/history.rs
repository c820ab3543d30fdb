//! History end to end: `provisioning dev` + real kubectl. Every spec generation of a Server
//! the controller carries out leaves a ChangeRecord owned by the Server — who changed it (the
//! field manager from managedFields), which fields, when, the result — the last
//! `history_limit` are kept, and deleting the Server deletes its history.

use std::time::Duration;

use provisioning_e2e::Dev;
use serde_json::Value;

fn records(dev: &Dev, server: &str) -> anyhow::Result<Vec<Value>> {
    let out = dev.kubectl_ok(&["get", "changerecords", "-n", "demo", "-o", "json"])?;
    let list: Value = serde_json::from_str(&out)?;
    let mut items: Vec<Value> =
        list["items"].as_array().cloned().unwrap_or_default().into_iter().filter(|r| r["spec"]["object"]["name"] == server).collect();
    items.sort_by_key(|r| r["spec"]["generation"].as_i64().unwrap_or_default());
    Ok(items)
}

fn phases(items: &[Value]) -> Vec<(i64, String)> {
    items
        .iter()
        .map(|r| (r["spec"]["generation"].as_i64().unwrap_or_default(), r["status"]["phase"].as_str().unwrap_or_default().to_string()))
        .collect()
}

#[test]
fn every_carried_out_generation_leaves_a_change_record() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let config = tmp.path().join("controller.toml");
    std::fs::write(&config, "history_limit = 3\n")?;
    let config_arg = config.display().to_string();
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[], &[], &["--config", &config_arg])?;
    let example = provisioning_e2e::workspace_root().join("examples/simulated");
    dev.kubectl_ok(&["apply", "-f", &example.display().to_string()])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "srv", "--all", "-n", "demo", "--timeout=120s"])?;

    // Creation: generation 1, created by kubectl's apply, Succeeded once Ready.
    dev.wait_until(Duration::from_secs(30), "web-1's creation is recorded as Succeeded", |d| {
        Ok(phases(&records(d, "web-1")?) == vec![(1, "Succeeded".to_string())])
    })?;
    let created = &records(&dev, "web-1")?[0];
    assert_eq!(created["spec"]["summary"], "created", "{created}");
    assert_eq!(created["spec"]["changedBy"][0]["manager"], "kubectl-client-side-apply", "{created}");
    let owner = &created["metadata"]["ownerReferences"][0];
    assert_eq!((owner["kind"].as_str(), owner["name"].as_str()), (Some("Server"), Some("web-1")), "{created}");
    assert!(created["status"]["finishedAt"].is_string() && created["spec"]["startedAt"].is_string(), "{created}");
    // Printer columns through the Table API.
    let table = dev.kubectl_ok(&["get", "chg", "-n", "demo"])?;
    for col in ["KIND", "OBJECT", "GEN", "BY", "SUMMARY", "PHASE"] {
        assert!(table.contains(col), "column {col} missing:\n{table}");
    }

    // A spec change by another field manager: which field, who, and the result.
    dev.kubectl_ok(&["patch", "srv", "web-1", "-n", "demo", "--type", "merge", "-p", r#"{"spec":{"deletionPolicy":"Orphan"}}"#])?;
    dev.wait_until(Duration::from_secs(30), "generation 2 recorded as Succeeded", |d| {
        Ok(phases(&records(d, "web-1")?).last() == Some(&(2, "Succeeded".to_string())))
    })?;
    let changed = records(&dev, "web-1")?.pop().ok_or_else(|| anyhow::anyhow!("no record"))?;
    assert_eq!(changed["spec"]["changedFields"], serde_json::json!(["spec.deletionPolicy"]), "{changed}");
    assert_eq!(changed["spec"]["changedBy"][0]["manager"], "kubectl-patch", "{changed}");
    assert_eq!(changed["spec"]["previousGeneration"], 1, "{changed}");
    // Values are never copied into the record (only salted digests).
    let raw = changed.to_string();
    assert!(!raw.contains("Orphan"), "a spec value leaked into the record: {raw}");

    // Two more changes: only the newest three records are kept.
    for policy in ["Delete", "Orphan"] {
        let patch = format!(r#"{{"spec":{{"deletionPolicy":"{policy}"}}}}"#);
        dev.kubectl_ok(&["patch", "srv", "web-1", "-n", "demo", "--type", "merge", "-p", &patch])?;
    }
    dev.wait_until(Duration::from_secs(30), "history pruned to the newest three", |d| {
        let gens: Vec<i64> = phases(&records(d, "web-1")?).into_iter().map(|(g, _)| g).collect();
        Ok(gens == vec![2, 3, 4])
    })?;
    // Other Servers keep their own history.
    assert_eq!(phases(&records(&dev, "web-2")?), vec![(1, "Succeeded".to_string())]);

    // Deleting the Server deletes its history (owner references).
    dev.kubectl_ok(&["delete", "srv", "web-1", "-n", "demo", "--timeout=60s"])?;
    dev.wait_until(Duration::from_secs(30), "web-1's records are gone", |d| Ok(records(d, "web-1")?.is_empty()))?;
    Ok(())
}
