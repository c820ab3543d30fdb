//! Cost and the monthly budget, end to end: `provisioning dev` with real kubectl and the aws
//! provider against the moto EC2 emulator (region eu-north-1, t3.small for plan `small`).
//!
//! What must hold:
//! - each Server's `status.cost` is the t3.small list price of eu-north-1 (USD 0.0216/h,
//!   15.77/mo) with its source and date, and `kubectl get srv` shows it in the COST column;
//! - the Workspace's `status.cost` sums its two Servers (31.54) and `kubectl get ws` shows it;
//! - a budget given as a negative or malformed amount is refused by the CRD schema;
//! - a third Server that would take the month to 47.31 under a 40.00 budget is Stalled with
//!   BudgetExceeded naming both figures, gets a Warning event, and NO instance is created at
//!   moto; raising the budget lets it proceed (the Workspace change re-checks it at once);
//! - lowering the budget again deletes nothing; a fourth Server refused by it proceeds once
//!   another Server is deleted (the namespace's total dropped);
//! - deleting everything leaves no instance at moto.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::cloud::{Moto, condition, get_json, write_yaml_docs};
use serde_json::{Value, json};

const NAMESPACE: &str = "cost-e2e";
const ACCOUNT: &str = "aws-cost";
/// An AMI id from moto's default set (moto boots nothing).
const MOTO_AMI: &str = "ami-1e749f67";
const REGION: &str = "eu-north-1";

fn server_doc(name: &str) -> Value {
    json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"plan": "small"}})
}

fn manifest(dir: &Path, moto: &Moto) -> Result<String> {
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {"provisioning.dev/workspace": NAMESPACE}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-creds", "namespace": NAMESPACE}, "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": "AKIAE2ECOSTBUDGET001", "AWS_SECRET_ACCESS_KEY": "e2e-cost-budget"}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NAMESPACE},
        "spec": {
            "defaults": {"provider": ACCOUNT, "plan": "small", "image": "debian-12"},
            "providers": [{
                "name": ACCOUNT, "type": "aws", "region": REGION, "endpoint": moto.endpoint,
                "credentialsSecretRef": {"name": "aws-creds"},
                "images": {"debian-12": MOTO_AMI},
                "sshSourceCidrs": ["127.0.0.1/32"],
            }],
            "limits": {"monthlyBudget": {"amount": "40", "currency": "USD"}},
        }}),
        server_doc("a"),
        server_doc("b"),
    ];
    Ok(write_yaml_docs(dir, "cost.yaml", &docs)?.display().to_string())
}

fn apply_server(dev: &Dev, dir: &Path, name: &str) -> Result<()> {
    let path = write_yaml_docs(dir, &format!("{name}.yaml"), &[server_doc(name)])?;
    dev.kubectl_ok(&["apply", "-f", &path.display().to_string()])?;
    Ok(())
}

fn server(dev: &Dev, name: &str) -> Result<Value> {
    get_json(dev, &["srv", name, "-n", NAMESPACE])
}

fn is_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

fn wait_ready(dev: &mut Dev, name: &str) -> Result<Value> {
    let mut last = Value::Null;
    dev.wait_until(Duration::from_secs(120), &format!("Server {name} Ready"), |d| {
        last = server(d, name)?;
        Ok(is_true(&last, "Ready"))
    })?;
    Ok(last)
}

fn workspace_monthly(dev: &Dev) -> Result<String> {
    let ws = get_json(dev, &["ws", NAMESPACE])?;
    Ok(ws["status"]["cost"]["monthly"].as_str().unwrap_or_default().to_string())
}

fn wait_workspace_monthly(dev: &mut Dev, want: &str) -> Result<()> {
    let mut last = String::new();
    dev.wait_until(Duration::from_secs(60), &format!("Workspace monthly cost {want}"), |d| {
        last = workspace_monthly(d)?;
        Ok(last == want)
    })
    .map_err(|e| e.context(format!("last Workspace monthly cost: {last:?}")))
}

/// Waits for `name` to stall on the budget and checks that it says why, with both figures,
/// and that no machine was made for it.
fn wait_budget_exceeded(dev: &mut Dev, name: &str, would_be: &str, budget: &str) -> Result<()> {
    let mut last = Value::Null;
    dev.wait_until(Duration::from_secs(60), &format!("Server {name} Stalled by the budget"), |d| {
        last = server(d, name)?;
        Ok(condition(&last, "Stalled").is_some_and(|c| c["status"] == "True" && c["reason"] == "BudgetExceeded"))
    })?;
    let message = condition(&last, "Stalled").and_then(|c| c["message"].as_str()).unwrap_or_default().to_string();
    let figures = format!("monthly cost would be {would_be} (budget {budget})");
    ensure!(message.contains(&figures), "Stalled message of {name} should say {figures:?}: {message}");
    ensure!(last["status"]["providerID"].is_null(), "Server {name} got a machine over budget: {}", last["status"]);
    ensure!(last["status"]["cost"]["monthly"] == "15.77", "a refused Server still shows what it would cost: {}", last["status"]);
    Ok(())
}

fn live_count(moto: &Moto) -> Result<usize> {
    Ok(moto.live_instances(REGION)?.len())
}

#[test]
fn server_cost_workspace_total_and_monthly_budget_at_moto() -> Result<()> {
    let moto = Moto::start(&[])?;
    let tmp = tempfile::tempdir()?;
    let path = manifest(tmp.path(), &moto)?;
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[&path], &[], &["--allow-insecure-endpoints"])?;
    let result = scenario(&mut dev, &moto, tmp.path());
    // Clean up whatever happened: no instance may stay at moto.
    let _ = dev.kubectl(&["delete", "srv", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=120s"]);
    let left = live_count(&moto);
    dev.stop();
    result?;
    ensure!(left? == 0, "instances left at moto after deleting every Server");
    Ok(())
}

fn scenario(dev: &mut Dev, moto: &Moto, dir: &Path) -> Result<()> {
    dev.wait_until(Duration::from_secs(60), "Server b created", |d| {
        Ok(d.kubectl(&["get", "srv", "b", "-n", NAMESPACE]).map(|o| o.status.success()).unwrap_or(false))
    })?;
    // Two Servers: 2 × 15.77 = 31.54 ≤ 40.
    for name in ["a", "b"] {
        let srv = wait_ready(dev, name)?;
        let cost = &srv["status"]["cost"];
        ensure!(cost["currency"] == "USD" && cost["hourly"] == "0.0216" && cost["monthly"] == "15.77", "cost of {name}: {cost}");
        ensure!(cost["summary"] == "$15.77/mo", "cost summary of {name}: {cost}");
        ensure!(cost["pricesAsOf"].as_str().is_some_and(|d| d.len() == 10), "cost of {name} says when the price was taken: {cost}");
        ensure!(cost["source"].as_str().is_some_and(|s| s.contains("t3.small") && s.contains(REGION)), "cost source of {name}: {cost}");
    }
    wait_workspace_monthly(dev, "31.54")?;
    let table = dev.kubectl_ok(&["get", "srv", "-n", NAMESPACE])?;
    ensure!(table.lines().next().is_some_and(|h| h.contains("COST")), "kubectl get srv has a COST column:\n{table}");
    ensure!(table.lines().filter(|l| l.contains("$15.77/mo")).count() == 2, "each Server shows $15.77/mo:\n{table}");
    let ws_table = dev.kubectl_ok(&["get", "ws", NAMESPACE])?;
    ensure!(ws_table.contains("COST") && ws_table.contains("$31.54/mo"), "kubectl get ws shows the total:\n{ws_table}");
    ensure!(live_count(moto)? == 2, "two instances at moto");

    // Malformed budgets never reach the controller.
    for bad in ["-5", "12,50", "1e3", "ten"] {
        let patch = json!({"spec": {"limits": {"monthlyBudget": {"amount": bad}}}}).to_string();
        let out = dev.kubectl(&["patch", "ws", NAMESPACE, "--type=merge", "-p", &patch])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && stderr.contains("amount"), "budget {bad:?} should be refused by the schema: {stderr}");
    }

    // A third Server would make 47.31 > 40: refused before any provider call.
    apply_server(dev, dir, "c")?;
    wait_budget_exceeded(dev, "c", "$47.31", "$40.00")?;
    let events = dev.kubectl_ok(&[
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        "involvedObject.name=c,reason=BudgetExceeded,type=Warning",
        "-o",
        "name",
    ])?;
    ensure!(!events.trim().is_empty(), "a Warning event BudgetExceeded for Server c");
    ensure!(live_count(moto)? == 2, "no instance was created for the refused Server");

    // Raising the budget lets it proceed.
    dev.kubectl_ok(&["patch", "ws", NAMESPACE, "--type=merge", "-p", r#"{"spec":{"limits":{"monthlyBudget":{"amount":"50"}}}}"#])?;
    wait_ready(dev, "c")?;
    wait_workspace_monthly(dev, "47.31")?;
    ensure!(live_count(moto)? == 3, "three instances at moto");

    // Lowering it deletes nothing; a new Server is refused until another is deleted.
    dev.kubectl_ok(&["patch", "ws", NAMESPACE, "--type=merge", "-p", r#"{"spec":{"limits":{"monthlyBudget":{"amount":"48"}}}}"#])?;
    apply_server(dev, dir, "d")?;
    wait_budget_exceeded(dev, "d", "$63.08", "$48.00")?;
    for name in ["a", "b", "c"] {
        ensure!(is_true(&server(dev, name)?, "Ready"), "Server {name} stays Ready under a lower budget");
    }
    ensure!(live_count(moto)? == 3, "nothing created or deleted by lowering the budget");
    dev.kubectl_ok(&["delete", "srv", "a", "-n", NAMESPACE, "--wait=true", "--timeout=120s"])?;
    // 47.31 − 15.77 + 15.77 ≤ 48: d goes on without waiting for its error backoff (30 s,
    // then 60 s): the drop of the namespace's total re-checks it.
    let deleted = std::time::Instant::now();
    wait_ready(dev, "d")?;
    ensure!(deleted.elapsed() < Duration::from_secs(25), "Server d waited {:?} after a was deleted", deleted.elapsed());
    wait_workspace_monthly(dev, "47.31")?;
    ensure!(live_count(moto)? == 3, "three instances at moto after the swap");
    Ok(())
}
