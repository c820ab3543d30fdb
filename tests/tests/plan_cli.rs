//! `provisioning plan -f FILE...` against a running `provisioning dev`: exit 0 when the
//! manifests match the cluster, 2 when applying them would change something (with the
//! Server's plan as the controller computes it: a resize on the simulated cloud is a
//! Replace, a new Server a Create, a Cluster's pool change its members' Replaces and Creates,
//! surge Servers included), 1 on
//! a bad file or an unreachable API server. Nothing is
//! changed by planning.

use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::{Dev, provisioning_bin, workspace_root};
use serde_json::Value;

const NS: &str = "plan-cli";

fn plan(kubeconfig: &std::path::Path, args: &[&str]) -> Result<Output> {
    Ok(Command::new(provisioning_bin())
        .current_dir(workspace_root())
        .arg("plan")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()?)
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn plan_exit_codes_follow_what_would_change() -> Result<()> {
    let mut dev = Dev::start(&["tests/tests/plan_cli.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "server/web", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(30), "the Server's plan recorded", |d| {
        let s: Value = serde_json::from_str(&d.kubectl_ok(&["get", "server", "web", "-n", NS, "-o", "json"])?)?;
        Ok(s["status"]["plan"]["summary"] == "no changes")
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/pool", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(30), "the Cluster's plan settled", |d| {
        let c: Value = serde_json::from_str(&d.kubectl_ok(&["get", "cluster", "pool", "-n", NS, "-o", "json"])?)?;
        Ok(c["status"]["plan"]["summary"] == "no changes")
    })?;
    let kubeconfig = dev.kubeconfig();

    // The manifests as applied: nothing to do, exit 0.
    let same = plan(&kubeconfig, &["-f", "tests/tests/plan_cli.yaml"])?;
    ensure!(same.status.code() == Some(0), "unchanged manifests exit 0: {}", text(&same));
    ensure!(String::from_utf8_lossy(&same.stdout).contains("No changes"), "{}", text(&same));

    // A resize and a new Server: exit 2, the plan says what and why.
    let dir = tempfile::tempdir()?;
    let changed = std::fs::read_to_string(workspace_root().join("tests/tests/plan_cli.yaml"))?
        .replacen("plan: small", "plan: medium", 1)
        // The pool: one more member, a bigger plan, rolled with a surge.
        .replace("replicas: 2\n    plan: small", "replicas: 3\n    plan: medium\n    rollout: {maxUnavailable: 1, maxSurge: 1}")
        .replace("  pools:\n", "  approval: Manual\n  pools:\n")
        + "---\napiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {name: api, namespace: plan-cli}\nspec: {plan: small}\n"
        // A new namespace with its Workspace in the same manifests: planned with that
        // Workspace's account although neither exists yet.
        + "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: plan-cli-new}\n"
        + "---\napiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: plan-cli-new}\n\
           spec: {defaults: {provider: other}, providers: [{name: other, type: simulated}]}\n"
        + "---\napiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {name: fresh, namespace: plan-cli-new}\nspec: {plan: small}\n";
    std::fs::write(dir.path().join("changed.yaml"), changed)?;
    let path = dir.path().to_string_lossy().to_string();
    let out = plan(&kubeconfig, &["-f", &path])?;
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(out.status.code() == Some(2), "changes exit 2: {}", text(&out));
    ensure!(shown.contains("Server/plan-cli/web: 1 to replace"), "{shown}");
    ensure!(shown.contains("-/+ spec.plan") && shown.contains("forces replacement"), "{shown}");
    ensure!(shown.contains("Server/plan-cli/api: 1 to create"), "{shown}");
    // The Cluster: its members planned by the Server planner (a resize on the simulated cloud
    // replaces), the new member and the surge Server created, and how the pool rolls.
    ensure!(shown.contains("Cluster/plan-cli/pool: 2 to create, 2 to replace"), "{shown}");
    ensure!(shown.contains("+ Server/plan-cli/pool-members-2") && shown.contains("+ Server/plan-cli/pool-members-surge-0"), "{shown}");
    for member in ["pool-members-0", "pool-members-1"] {
        ensure!(shown.contains(&format!("-/+ Server/plan-cli/{member} spec.plan")), "{member} is replaced: {shown}");
    }
    ensure!(shown.contains("pool members: members are replaced 1 at a time, after 1 surge Server(s) of the new spec serve"), "{shown}");
    ensure!(shown.contains("waits for approval: once applied, annotate provisioning.dev/approve with its status.plan.id"), "{shown}");
    ensure!(shown.contains("Server/plan-cli-new/fresh: 1 to create") && shown.contains("at account other"), "{shown}");
    ensure!(shown.contains("Workspace/plan-cli-new: 1 to create"), "{shown}");
    ensure!(shown.contains("Plan: 5 to create, 3 to replace."), "{shown}");
    eprintln!("{shown}");
    let json = plan(&kubeconfig, &["-f", &path, "-o", "json"])?;
    ensure!(json.status.code() == Some(2), "{}", text(&json));
    let report: Value = serde_json::from_slice(&json.stdout)?;
    let web =
        report["objects"].as_array().and_then(|o| o.iter().find(|o| o["resource"] == "Server/plan-cli/web")).cloned().unwrap_or_default();
    ensure!(web["plan"]["changes"][0]["action"] == "Replace" && web["plan"]["changes"][0]["field"] == "spec.plan", "{web}");
    // The controller's own plan id for the same change: the approval a user would write.
    ensure!(web["plan"]["id"].as_str().is_some_and(|id| id.len() == 10), "{web}");

    // Planning changed nothing.
    let s: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "server", "web", "-n", NS, "-o", "json"])?)?;
    ensure!(s["spec"]["plan"] == "small" && s["metadata"]["generation"] == 1, "untouched: {}", s["spec"]);
    ensure!(dev.kubectl(&["get", "server", "api", "-n", NS])?.status.code() != Some(0), "no Server api was created");

    // Errors exit 1 with a message naming the problem.
    std::fs::write(dir.path().join("bad.yaml"), "kind: [unclosed\n")?;
    let bad = plan(&kubeconfig, &["-f", &dir.path().join("bad.yaml").to_string_lossy()])?;
    ensure!(bad.status.code() == Some(1), "a bad file exits 1: {}", text(&bad));
    ensure!(String::from_utf8_lossy(&bad.stderr).contains("bad.yaml"), "{}", text(&bad));
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let unreachable = std::fs::read_to_string(&kubeconfig)?;
    let server_line = unreachable.lines().find(|l| l.trim_start().starts_with("server:")).unwrap_or_default().to_string();
    std::fs::write(dir.path().join("kubeconfig"), unreachable.replace(&server_line, &format!("    server: https://127.0.0.1:{closed}")))?;
    let down = plan(&dir.path().join("kubeconfig"), &["-f", "tests/tests/plan_cli.yaml"])?;
    ensure!(down.status.code() == Some(1), "an unreachable API exits 1: {}", text(&down));
    ensure!(String::from_utf8_lossy(&down.stderr).contains("error:"), "{}", text(&down));
    dev.stop();
    Ok(())
}
