//! An approval leaves a trail (issue 25, item 5): one `provisioning.dev/approve` on a Manual
//! Cluster of 2 Servers and a service, on the simulated provider, yields exactly ONE
//! `Approved` Event — on the Cluster, not one per member it is passed down to — naming the
//! plan id and who set the annotation — the authenticated user, which the embedded API server
//! records in the server-owned `provisioning.dev/approved-by` (a client cannot write it) — and
//! one `approval` entry in the audit log.
//! A standalone Manual Server approved with `kubectl annotate` gets its own one Event, and its
//! ChangeRecord lists the approval.

use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use serde_json::Value;

const NS: &str = "approval-trail";

fn cluster(dev: &Dev, path: &str) -> Result<String> {
    dev.kubectl_ok(&["get", "cluster", "trail", "-n", NS, "-o", &format!("jsonpath={path}")])
}

fn lone(dev: &Dev, path: &str) -> Result<String> {
    dev.kubectl_ok(&["get", "server", "lone", "-n", NS, "-o", &format!("jsonpath={path}")])
}

#[test]
fn one_approval_of_a_cluster_is_one_approved_event_naming_the_plan_and_the_user() -> Result<()> {
    let mut dev = Dev::start(&["tests/tests/approval_trail_simulated.yaml"])?;
    dev.wait_until(Duration::from_secs(120), "the Cluster awaiting approval", |d| {
        Ok(cluster(d, "{.status.conditions[?(@.type==\"Ready\")].reason}")? == "AwaitingApproval"
            && !cluster(d, "{.status.plan.id}")?.is_empty())
    })?;
    let id = cluster(&dev, "{.status.plan.id}")?;
    dev.kubectl_ok(&["annotate", "cluster", "trail", "-n", NS, "--overwrite", &format!("provisioning.dev/approve={id}")])?;
    dev.wait_until(Duration::from_secs(180), "the Cluster Ready", |d| {
        Ok(cluster(d, "{.status.conditions[?(@.type==\"Ready\")].status}")? == "True")
    })?;
    dev.wait_until(
        Duration::from_secs(60),
        "the lone Server awaiting approval",
        |d| Ok(lone(d, "{.status.phase}")? == "AwaitingApproval"),
    )?;
    let lone_id = lone(&dev, "{.status.plan.id}")?;
    dev.kubectl_ok(&["annotate", "server", "lone", "-n", NS, "--overwrite", &format!("provisioning.dev/approve={lone_id}")])?;
    dev.wait_until(Duration::from_secs(60), "the lone Server Ready", |d| {
        Ok(lone(d, "{.status.conditions[?(@.type==\"Ready\")].status}")? == "True")
    })?;

    let events: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "events", "-n", NS, "-o", "json"])?)?;
    let approved: Vec<&Value> = events["items"].as_array().into_iter().flatten().filter(|e| e["reason"] == "Approved").collect();
    ensure!(
        approved.len() == 2,
        "one Approved Event per approval (the Cluster's, the lone Server's), got {}: {approved:#?}",
        approved.len()
    );
    let lone_event = approved.iter().find(|e| e["involvedObject"]["name"] == "lone").expect("the lone Server's Approved Event");
    let lone_message = lone_event["message"].as_str().unwrap_or_default();
    ensure!(
        lone_message.contains(&format!("plan {lone_id} approved")) && lone_message.contains("user \"provisioning-admin\""),
        "{lone_message}"
    );
    let event = approved.iter().find(|e| e["involvedObject"]["kind"] == "Cluster").expect("the Cluster's Approved Event");
    ensure!(event["involvedObject"]["kind"] == "Cluster" && event["count"] == 1, "{event:#}");
    let message = event["message"].as_str().unwrap_or_default();
    ensure!(message.contains(&format!("plan {id} approved")), "{message}");
    ensure!(message.contains("approved by user \"provisioning-admin\" (authenticated"), "{message}");
    ensure!(cluster(&dev, "{.metadata.annotations.provisioning\\.dev/approved-by}")? == "provisioning-admin");
    // A client cannot write who approved.
    let forged = dev.kubectl(&["annotate", "cluster", "trail", "-n", NS, "--overwrite", "provisioning.dev/approved-by=mallory"])?;
    let refusal = String::from_utf8_lossy(&forged.stderr);
    ensure!(!forged.status.success() && refusal.contains("set by the API server only"), "{refusal}");

    let audit = provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &dev.data_dir.display().to_string(), "-o", "json"])?;
    let approvals: Vec<&str> = audit.lines().filter(|l| l.contains(r#""type":"approval""#)).collect();
    ensure!(approvals.len() == 2, "one approval each in the audit log, got:\n{audit}");
    ensure!(
        approvals
            .iter()
            .any(|a| a.contains(&id) && a.contains(r#""user":"provisioning-admin""#) && a.contains(r#""fieldManager":"kubectl-annotate""#)),
        "{approvals:#?}"
    );
    ensure!(approvals.iter().any(|a| a.contains(&lone_id) && a.contains(r#""name":"lone""#)), "{approvals:#?}");

    // The lone Server's ChangeRecord of its generation names the approval too.
    let records: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "changerecords", "-n", NS, "-o", "json"])?)?;
    let recorded: Vec<&Value> = records["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["spec"]["object"]["name"] == "lone")
        .flat_map(|r| r["spec"]["approvals"].as_array().into_iter().flatten())
        .collect();
    ensure!(
        recorded.len() == 1
            && recorded[0]["plan"] == lone_id.as_str()
            && recorded[0]["user"] == "provisioning-admin"
            && recorded[0]["fieldManager"] == "kubectl-annotate",
        "{recorded:#?}"
    );
    Ok(())
}
