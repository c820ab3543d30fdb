//! No-op edits do nothing (issue 25, item 2), on the simulated provider, with the audit log's
//! script runs as the oracle (the controller does not compute it): labels, annotations,
//! `spec.approval` set to its effective value and switched to Manual and back, pause and
//! resume, re-applying the same manifest → no install or remove run, and the plans say "no
//! changes". A scale-up 3 → 4 then installs on the new member only.

use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;

const NS: &str = "noop-edits";
const MANIFEST: &str = "tests/tests/noop_edits_simulated.yaml";

fn get(dev: &Dev, what: &str, path: &str) -> Result<String> {
    dev.kubectl_ok(&["get", what, "-n", NS, "-o", &format!("jsonpath={path}")])
}

/// install/remove runs of the etcd TaskServ in the audit log, as `server:script`, sorted.
fn script_runs(dev: &Dev) -> Result<Vec<String>> {
    let data_dir = dev.data_dir.display().to_string();
    let out = provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &data_dir, "-o", "json", "--object", "ts/noop-edits/etcd-etcd"])?;
    let mut runs = Vec::new();
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let script = v["script"].as_str().unwrap_or_default();
        if v["type"] == "scriptRun" && script != "check" {
            runs.push(format!("{}:{script}", v["server"].as_str().unwrap_or_default()));
        }
    }
    runs.sort();
    Ok(runs)
}

/// Provider calls that change something (anything but observing and surveying), as
/// `operation object`, in the order made.
fn provider_changes(dev: &Dev) -> Result<Vec<String>> {
    let data_dir = dev.data_dir.display().to_string();
    let out = provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &data_dir, "-o", "json"])?;
    let mut calls = Vec::new();
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let op = v["operation"].as_str().unwrap_or_default();
        if v["type"] == "providerCall" && !op.starts_with("observe") && !op.starts_with("survey") && !op.starts_with("list") {
            calls.push(format!("{op} {}", v["object"]["name"].as_str().unwrap_or_default()));
        }
    }
    Ok(calls)
}

/// The Cluster and its TaskServ have caught up with their specs and are Ready with nothing
/// planned: whatever an edit caused has run (a run is audited before its result is recorded).
fn settled(dev: &Dev) -> Result<bool> {
    let c = get(
        dev,
        "pcl/etcd",
        "{.metadata.generation}/{.status.observedGeneration}/{.status.conditions[?(@.type==\"Ready\")].status}/{.status.plan.summary}",
    )?;
    let t = get(
        dev,
        "ts/etcd-etcd",
        "{.metadata.generation}/{.status.observedGeneration}/{.status.conditions[?(@.type==\"Ready\")].status}/{.status.plan.summary}",
    )?;
    let ok = |s: &str| {
        let parts: Vec<&str> = s.split('/').collect();
        parts.len() == 4 && parts[0] == parts[1] && parts[2] == "True" && parts[3] == "no changes"
    };
    Ok(ok(&c) && ok(&t))
}

fn edit_and_settle(dev: &mut Dev, what: &str, args: &[&str]) -> Result<()> {
    dev.kubectl_ok(args)?;
    dev.wait_until(Duration::from_secs(60), &format!("settled after {what}"), settled)
}

#[test]
fn no_op_edits_run_no_script_and_a_scale_up_installs_only_on_the_new_member() -> Result<()> {
    let mut dev = Dev::start(&[MANIFEST])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "pcl/etcd", "ts/etcd-etcd", "-n", NS, "--timeout=120s"])?;
    // The Workspace too: its account check (validate_credentials) belongs to the first rollout,
    // not to the edits, however soon the Servers are Ready.
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("workspace/{NS}"), "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "settled after the first rollout", settled)?;
    let first = script_runs(&dev)?;
    let members = ["etcd-members-0", "etcd-members-1", "etcd-members-2"];
    ensure!(first == members.map(|m| format!("{m}:install")), "one install per member: {first:?}");
    let machines = provider_changes(&dev)?;
    ensure!(machines.iter().filter(|c| c.starts_with("ensure_server")).count() == 3, "one create per member: {machines:?}");

    let merge = |patch: &'static str| ["patch", "pcl", "etcd", "-n", NS, "--type=merge", "-p", patch];
    edit_and_settle(&mut dev, "a label", &["label", "pcl", "etcd", "-n", NS, "team=db"])?;
    edit_and_settle(&mut dev, "an annotation", &["annotate", "pcl", "etcd", "-n", NS, "note=hello"])?;
    edit_and_settle(&mut dev, "a TaskServ annotation", &["annotate", "ts", "etcd-etcd", "-n", NS, "note=hello"])?;
    edit_and_settle(&mut dev, "approval: Automatic (its effective value)", &merge(r#"{"spec":{"approval":"Automatic"}}"#))?;
    ensure!(get(&dev, "ts/etcd-etcd", "{.spec.approval}")? == "Automatic", "the Cluster wrote its approval into the member");
    edit_and_settle(&mut dev, "approval: Manual", &merge(r#"{"spec":{"approval":"Manual"}}"#))?;
    edit_and_settle(&mut dev, "approval: Automatic again", &merge(r#"{"spec":{"approval":"Automatic"}}"#))?;

    // Pause and resume, each waited for through the Paused condition.
    for what in ["pcl/etcd", "ts/etcd-etcd"] {
        dev.kubectl_ok(&["annotate", what, "-n", NS, "--overwrite", "provisioning.dev/paused=true"])?;
    }
    dev.wait_until(Duration::from_secs(60), "both paused", |d| {
        let paused = |w: &str| get(d, w, "{.status.conditions[?(@.type==\"Paused\")].status}");
        Ok(paused("pcl/etcd")? == "True" && paused("ts/etcd-etcd")? == "True")
    })?;
    for what in ["pcl/etcd", "ts/etcd-etcd"] {
        dev.kubectl_ok(&["annotate", what, "-n", NS, "provisioning.dev/paused-"])?;
    }
    dev.wait_until(Duration::from_secs(60), "both resumed", |d| {
        let paused = |w: &str| get(d, w, "{.status.conditions[?(@.type==\"Paused\")].status}");
        Ok(paused("pcl/etcd")? != "True" && paused("ts/etcd-etcd")? != "True" && settled(d)?)
    })?;
    let manifest = provisioning_e2e::workspace_root().join(MANIFEST).display().to_string();
    edit_and_settle(&mut dev, "the same manifest re-applied", &["apply", "-f", &manifest])?;

    let after = script_runs(&dev)?;
    ensure!(after == first, "no-op edits ran scripts: {after:?} (before: {first:?})\n{}", dev.log_tail(40));
    let calls = provider_changes(&dev)?;
    ensure!(calls == machines, "no-op edits called the provider: {calls:?} (before: {machines:?})");

    // A scale-up installs on the new member only.
    dev.kubectl_ok(&[
        "patch",
        "pcl",
        "etcd",
        "-n",
        NS,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/pools/0/replicas","value":4}]"#,
    ])?;
    dev.wait_until(Duration::from_secs(120), "Ready on 4 members", |d| {
        Ok(settled(d)? && get(d, "ts/etcd-etcd", "{.status.updated}")? == "4/4")
    })?;
    let scaled = script_runs(&dev)?;
    let mut expected = first.clone();
    expected.push("etcd-members-3:install".into());
    expected.sort();
    ensure!(scaled == expected, "the scale-up ran {scaled:?}, expected {expected:?}\n{}", dev.log_tail(40));
    Ok(())
}
