//! Field ownership with the real kubectl against `provisioning dev`: after
//! `provisioning dev --apply examples/simulated`, `kubectl apply --server-side` of the same
//! files succeeds (spec lists are list-maps, not atomic); two managers own different entries
//! of one list without conflict; every write of the project is recorded under a named field
//! manager (never "unknown"); and a server-side dry-run apply answers the managedFields a
//! real apply would record, without storing anything (Argo CD's server-side diff).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use provisioning_e2e::{Dev, workspace_root};
use serde_json::Value;

fn managed_fields(obj: &Value) -> Vec<Value> {
    obj["metadata"]["managedFields"].as_array().cloned().unwrap_or_default()
}

/// The managers whose FieldsV1 hold `path` (a list of FieldsV1 keys).
fn owners(obj: &Value, path: &[&str]) -> Vec<String> {
    managed_fields(obj)
        .iter()
        .filter(|e| {
            let mut cur = &e["fieldsV1"];
            path.iter().all(|k| {
                cur = &cur[*k];
                !cur.is_null()
            })
        })
        .filter_map(|e| e["manager"].as_str().map(str::to_string))
        .collect()
}

fn get_json(dev: &Dev, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json", "--show-managed-fields"]);
    let out = dev.kubectl_ok(&all)?;
    serde_json::from_str(&out).with_context(|| format!("kubectl {args:?} printed no JSON: {out}"))
}

fn write_manifest(dir: &Path, name: &str, text: &str) -> Result<String> {
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    Ok(p.to_string_lossy().into_owned())
}

#[test]
fn kubectl_server_side_apply_after_dev_apply() -> Result<()> {
    let mut dev = Dev::start(&["examples/simulated"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/demo", "--timeout=180s"])?;
    dev.wait_until(Duration::from_secs(120), "finalizers on every Server", |d| {
        let out = d.kubectl_ok(&["get", "srv", "-n", "demo", "-o", "jsonpath={.items[*].metadata.finalizers}"])?;
        Ok(out.matches("provisioning.dev/cleanup").count() == 3)
    })?;

    // The same files, now applied by kubectl: no conflict with provisioning-dev.
    let examples = workspace_root().join("examples/simulated");
    for file in ["10-workspace.yaml", "20-servers.yaml"] {
        let path = examples.join(file);
        dev.kubectl_ok(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
    }

    // Every write carries a named manager; the finalizer is the controller's.
    let ws = get_json(&dev, &["get", "workspace", "demo"])?;
    let srv = get_json(&dev, &["get", "srv", "web-1", "-n", "demo"])?;
    for obj in [&ws, &srv] {
        let managers: Vec<String> = managed_fields(obj).iter().filter_map(|e| e["manager"].as_str().map(str::to_string)).collect();
        assert!(!managers.iter().any(|m| m == "unknown" || m.is_empty()), "unnamed field manager: {managers:?}");
        assert_eq!(owners(obj, &["f:metadata", "f:finalizers"]), ["provisioning-controller"], "{:#}", obj["metadata"]["managedFields"]);
        assert!(owners(obj, &["f:status"]).iter().all(|m| m == "provisioning-controller"), "{:#}", obj["metadata"]["managedFields"]);
    }
    // The provider entry is owned by both appliers, per key.
    let sim = r#"k:{"name":"sim"}"#;
    let mut sim_owners = owners(&ws, &["f:spec", "f:providers", sim, "f:type"]);
    sim_owners.sort();
    assert_eq!(sim_owners, ["kubectl", "provisioning-dev"], "{:#}", ws["metadata"]["managedFields"]);

    // A second manager adds its own provider account to the same list: no conflict, both stay.
    let tmp = tempfile::tempdir()?;
    let extra = write_manifest(
        tmp.path(),
        "extra.yaml",
        "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: demo\nspec:\n  providers:\n  - name: extra\n    type: simulated\n",
    )?;
    dev.kubectl_ok(&["apply", "--server-side", "--field-manager=team-b", "-f", &extra])?;
    // kubectl re-applies its file (which does not name `extra`): team-b's entry stays.
    dev.kubectl_ok(&["apply", "--server-side", "-f", &examples.join("10-workspace.yaml").to_string_lossy()])?;
    let names = dev.kubectl_ok(&["get", "workspace", "demo", "-o", "jsonpath={.spec.providers[*].name}"])?;
    assert_eq!(names.split_whitespace().collect::<Vec<_>>(), ["sim", "extra"], "{names}");

    // A field of an entry another manager owns, set to another value, still conflicts, and
    // the message names the entry the way kube-apiserver does.
    let clash = write_manifest(
        tmp.path(),
        "clash.yaml",
        "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: demo\nspec:\n  providers:\n  - name: sim\n    type: simulated\n    simulation:\n      latencyMs: 7\n",
    )?;
    let out = dev.kubectl(&["apply", "--server-side", "--field-manager=team-b", "-f", &clash])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a conflicting apply succeeded");
    assert!(stderr.contains(r#".spec.providers[name="sim"].simulation.latencyMs"#), "{stderr}");

    // Server-side dry run: the answer carries the managedFields a real apply would record.
    let change = write_manifest(
        tmp.path(),
        "argocd.yaml",
        "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: demo\nspec:\n  limits:\n    parallelLimit: 3\n",
    )?;
    let dry = dev.kubectl_ok(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=argocd-controller",
        "--force-conflicts",
        "-f",
        &change,
        "-o",
        "json",
        "--show-managed-fields",
    ])?;
    let dry: Value = serde_json::from_str(&dry)?;
    assert_eq!(dry["spec"]["limits"]["parallelLimit"], 3);
    assert_eq!(owners(&dry, &["f:spec", "f:limits", "f:parallelLimit"]), ["argocd-controller"], "{:#}", dry["metadata"]["managedFields"]);
    let entry = managed_fields(&dry).into_iter().find(|e| e["manager"] == "argocd-controller").unwrap_or_default();
    assert_eq!(entry["operation"], "Apply");
    // Nothing was stored.
    let after = get_json(&dev, &["get", "workspace", "demo"])?;
    assert_eq!(after["spec"]["limits"]["parallelLimit"], 5);
    assert!(owners(&after, &["f:spec"]).iter().all(|m| m != "argocd-controller"));
    // The real apply records exactly what the dry run showed.
    let real = dev.kubectl_ok(&[
        "apply",
        "--server-side",
        "--field-manager=argocd-controller",
        "--force-conflicts",
        "-f",
        &change,
        "-o",
        "json",
        "--show-managed-fields",
    ])?;
    let real: Value = serde_json::from_str(&real)?;
    let real_entry = managed_fields(&real).into_iter().find(|e| e["manager"] == "argocd-controller").unwrap_or_default();
    assert_eq!(real_entry["fieldsV1"], entry["fieldsV1"]);
    dev.stop();
    Ok(())
}
