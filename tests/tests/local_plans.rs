//! Plans and approval on the local provider, through `provisioning dev`, kubectl and Docker:
//! - a Server under `approval: Manual` waits (AwaitingApproval, `status.plan` "1 to create",
//!   no container) until `provisioning.dev/approve` names its plan id;
//! - a plan change is planned as "1 to update" (Drifted=True SpecChanged, a Normal Event), nothing
//!   changes at Docker until approved; a stale approval is ignored with a PlanStale Warning;
//!   once approved the same container gets the new CPU and memory limits (`docker update`);
//! - an image change is "1 to replace": once approved the old container is gone and exactly
//!   one new one runs;
//! - a container removed behind the controller's back is a plan too under Manual: it is
//!   re-created only once approved;
//! - `updatePolicy: Never`: a plan change makes the Server Stalled (UpdateRefused) and the
//!   container is left exactly as it was.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use provisioning_e2e::docker::{docker, docker_ok, server_container};
use provisioning_e2e::{Dev, kubectl_bin, workspace_root};
use serde_json::Value;

const NS: &str = "plans-e2e";
/// A second tag of the node image: an image change the local provider can only carry out by
/// replacing the container.
const OTHER_IMAGE: &str = "provisioning-node:plans-e2e";

/// Removes what this test left in Docker (also when it fails).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        provisioning_e2e::docker::remove_namespace(NS);
        let _ = docker(&["rmi", OTHER_IMAGE]);
    }
}

/// Every container (running or not) of this test's namespace.
fn ours() -> Result<Vec<String>> {
    provisioning_e2e::docker::namespace_containers(NS)
}

/// Containers of one Server (running or not).
fn containers_of(name: &str) -> Result<Vec<String>> {
    let ns = format!("label=provisioning.dev/namespace={NS}");
    let srv = format!("label=provisioning.dev/server={name}");
    Ok(docker_ok(&["ps", "-aq", "--filter", &ns, "--filter", &srv])?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// (NanoCpus, Memory) of a container as the engine enforces them.
fn limits(container: &str) -> Result<(i64, i64)> {
    let out = docker_ok(&["inspect", "-f", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", container])?;
    let mut parts = out.split_whitespace().map(|p| p.parse::<i64>().unwrap_or(-1));
    Ok((parts.next().unwrap_or(-1), parts.next().unwrap_or(-1)))
}

fn get(dev: &Dev, name: &str) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(&["get", "server", name, "-n", NS, "-o", "json"])?)?)
}

fn condition(server: &Value, type_: &str) -> Option<(String, String, String)> {
    server["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).map(|c| {
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        (s("status"), s("reason"), s("message"))
    })
}

fn plan_of(server: &Value) -> (String, String) {
    let p = &server["status"]["plan"];
    (p["id"].as_str().unwrap_or_default().to_string(), p["summary"].as_str().unwrap_or_default().to_string())
}

fn warned(dev: &Dev, name: &str, reason: &str) -> Result<Option<String>> {
    event(dev, "Warning", name, reason)
}

fn event(dev: &Dev, type_: &str, name: &str, reason: &str) -> Result<Option<String>> {
    let events: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "events.events.k8s.io", "-n", NS, "-o", "json"])?)?;
    Ok(events["items"].as_array().and_then(|items| {
        items
            .iter()
            .find(|e| e["type"] == type_ && e["reason"] == reason && e["regarding"]["name"] == name)
            .map(|e| e["note"].as_str().unwrap_or_default().to_string())
    }))
}

/// Waits until the Server's plan has `summary` and it waits for approval; returns the plan id.
fn wait_awaiting(dev: &mut Dev, name: &str, summary: &str) -> Result<String> {
    dev.wait_until(Duration::from_secs(60), &format!("{name}: plan \"{summary}\" awaiting approval"), |d| {
        let s = get(d, name)?;
        let ready = condition(&s, "Ready");
        Ok(plan_of(&s).1 == summary && ready.is_some_and(|(st, r, _)| st == "False" && r == "AwaitingApproval"))
    })?;
    let s = get(dev, name)?;
    let (id, _) = plan_of(&s);
    let (_, _, message) = condition(&s, "Ready").unwrap_or_default();
    ensure!(message.contains(&id) && message.contains(summary), "the Ready message names the plan: {message}");
    ensure!(s["status"]["phase"] == "AwaitingApproval", "phase: {}", s["status"]["phase"]);
    Ok(id)
}

fn approve(dev: &Dev, name: &str, id: &str) -> Result<()> {
    dev.kubectl_ok(&["annotate", "--overwrite", "server", name, "-n", NS, &format!("provisioning.dev/approve={id}")])?;
    Ok(())
}

/// Approves the current plan the way k9s would: the `provisioning-approve` plugin of
/// deploy/k9s/plugins.yaml, run as k9s runs it (its variables in the environment).
fn approve_with_k9s_plugin(dev: &Dev, name: &str) -> Result<()> {
    let file: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(workspace_root().join("deploy/k9s/plugins.yaml"))?)?;
    let plugin = &file["plugins"]["provisioning-approve"];
    let command = plugin["command"].as_str().unwrap_or_default();
    let args: Vec<&str> = plugin["args"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    ensure!(command == "sh" && args.len() == 2, "plugin shape: {plugin}");
    let context = dev.kubectl_ok(&["config", "current-context"])?.trim().to_string();
    let kubectl_dir = kubectl_bin().parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let path = format!("{}:{}", kubectl_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new(command)
        .args(&args)
        .env("PATH", path)
        .env("KUBECONFIG", dev.kubeconfig())
        .env("NAME", name)
        .env("NAMESPACE", NS)
        .env("CONTEXT", context)
        .env("RESOURCE_NAME", "servers")
        .env("RESOURCE_GROUP", "provisioning.dev")
        .output()?;
    ensure!(
        out.status.success(),
        "the k9s plugin failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn wait_ready_with_no_changes(dev: &mut Dev, name: &str) -> Result<Value> {
    dev.wait_until(Duration::from_secs(120), &format!("{name} Ready with no changes planned"), |d| {
        let s = get(d, name)?;
        Ok(condition(&s, "Ready").is_some_and(|(st, _, _)| st == "True") && plan_of(&s).1 == "no changes")
    })?;
    get(dev, name)
}

/// Checks that nothing happens for `wait` (Docker state stays `expected`).
fn unchanged_for(wait: Duration, name: &str, expected: &[String], expected_limits: Option<(i64, i64)>) -> Result<()> {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        ensure!(
            containers_of(name)? == expected,
            "containers of {name} changed without approval: {:?} (expected {expected:?})",
            containers_of(name)?
        );
        if let (Some(want), Some(id)) = (expected_limits, expected.first()) {
            ensure!(limits(id)? == want, "limits of {name} changed without approval: {:?}", limits(id)?);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

// Over 80 lines on purpose: one story (create → update → replace → refusal) on one control
// plane; each step needs the state the one before left.
#[test]
fn manual_plans_wait_for_approval_and_are_carried_out() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    ensure!(ours()?.is_empty(), "leftovers of an earlier run in namespace {NS}: {:?}", ours()?);
    let _cleanup = Cleanup;
    docker_ok(&["tag", "provisioning-node:latest", OTHER_IMAGE])?;
    let mut dev = Dev::start(&["tests/tests/local_plans.yaml"])?;

    // Create under Manual: a plan that waits; no container until approved.
    let create = wait_awaiting(&mut dev, "plan-web", "1 to create")?;
    let s = get(&dev, "plan-web")?;
    ensure!(s["status"]["plan"]["changes"][0]["action"] == "Create", "{}", s["status"]["plan"]);
    unchanged_for(Duration::from_secs(2), "plan-web", &[], None)?;
    let table = dev.kubectl_ok(&["get", "srv", "plan-web", "-n", NS])?;
    ensure!(table.contains("PLAN") && table.contains("1 to create"), "the PLAN column shows the summary:\n{table}");
    let t0 = Instant::now();
    approve(&dev, "plan-web", &create)?;
    let s = wait_ready_with_no_changes(&mut dev, "plan-web")?;
    eprintln!("approved create → Ready in {:?}", t0.elapsed());
    ensure!(s["status"]["lastAppliedPlan"] == create.as_str(), "lastAppliedPlan: {}", s["status"]["lastAppliedPlan"]);
    let first = server_container(NS, "plan-web")?;
    ensure!(limits(&first)? == (1_000_000_000, 1 << 30), "small = 1 CPU, 1 GiB: {:?}", limits(&first)?);

    // A plan change: planned as an in-place update, waits; a stale approval is ignored.
    dev.kubectl_ok(&["patch", "server", "plan-web", "-n", NS, "--type=merge", "-p", r#"{"spec":{"plan":"medium"}}"#])?;
    let update = wait_awaiting(&mut dev, "plan-web", "1 to update")?;
    let s = get(&dev, "plan-web")?;
    let change = &s["status"]["plan"]["changes"][0];
    ensure!(
        change["field"] == "spec.plan" && change["action"] == "Update" && change["from"] == "cpu1-mem1g" && change["to"] == "cpu2-mem2g",
        "{change}"
    );
    ensure!(
        condition(&s, "Drifted").is_some_and(|(st, r, _)| st == "True" && r == "SpecChanged"),
        "Drifted: {:?}",
        condition(&s, "Drifted")
    );
    // The user changed the spec on purpose: a Normal Event, not a Warning.
    ensure!(event(&dev, "Normal", "plan-web", "SpecChanged")?.is_some(), "a SpecChanged Event");
    ensure!(warned(&dev, "plan-web", "SpecChanged")?.is_none(), "SpecChanged is not a Warning");
    approve(&dev, "plan-web", "0123456789")?;
    dev.wait_until(Duration::from_secs(30), "a PlanStale Warning", |d| Ok(warned(d, "plan-web", "PlanStale")?.is_some()))?;
    let note = warned(&dev, "plan-web", "PlanStale")?.unwrap_or_default();
    ensure!(note.contains("0123456789") && note.contains(&update), "the PlanStale note names both ids: {note}");
    unchanged_for(Duration::from_secs(3), "plan-web", std::slice::from_ref(&first), Some((1_000_000_000, 1 << 30)))?;
    approve(&dev, "plan-web", &update)?;
    let s = wait_ready_with_no_changes(&mut dev, "plan-web")?;
    ensure!(containers_of("plan-web")? == [first.clone()], "in place: the same container {first}: {:?}", containers_of("plan-web")?);
    ensure!(limits(&first)? == (2_000_000_000, 2 << 30), "medium = 2 CPUs, 2 GiB: {:?}", limits(&first)?);
    ensure!(s["status"]["resolvedPlan"] == "cpu2-mem2g", "observed plan: {}", s["status"]["resolvedPlan"]);
    ensure!(condition(&s, "Drifted").is_some_and(|(st, r, _)| st == "False" && r == "Remediated"), "{:?}", condition(&s, "Drifted"));

    // An image change: planned as a replacement with the reason; carried out once approved.
    let old_id = s["status"]["providerID"].as_str().unwrap_or_default().to_string();
    dev.kubectl_ok(&[
        "patch",
        "server",
        "plan-web",
        "-n",
        NS,
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"image":"{OTHER_IMAGE}"}}}}"#),
    ])?;
    let replace = wait_awaiting(&mut dev, "plan-web", "1 to replace")?;
    let s = get(&dev, "plan-web")?;
    let change = &s["status"]["plan"]["changes"][0];
    ensure!(change["field"] == "spec.image" && change["action"] == "Replace", "{change}");
    ensure!(change["reason"].as_str().is_some_and(|r| r.contains("cannot change the image")), "{change}");
    unchanged_for(Duration::from_secs(2), "plan-web", std::slice::from_ref(&first), None)?;
    let t1 = Instant::now();
    approve_with_k9s_plugin(&dev, "plan-web")?;
    let annotated = get(&dev, "plan-web")?;
    ensure!(annotated["metadata"]["annotations"]["provisioning.dev/approve"] == replace.as_str(), "the plugin approved plan {replace}");
    let s = wait_ready_with_no_changes(&mut dev, "plan-web")?;
    eprintln!("approved replace → Ready on a new container in {:?}", t1.elapsed());
    let now = containers_of("plan-web")?;
    ensure!(now.len() == 1 && now[0] != first, "exactly one new container: {now:?} (old {first})");
    let image = docker_ok(&["inspect", "-f", "{{.Config.Image}}", &now[0]])?;
    ensure!(image.trim() == OTHER_IMAGE, "the new container runs {OTHER_IMAGE}: {image}");
    ensure!(s["status"]["providerID"] != old_id.as_str() && s["status"]["image"] == OTHER_IMAGE, "{}", s["status"]);
    ensure!(limits(&now[0])? == (2_000_000_000, 2 << 30), "the replacement keeps the plan: {:?}", limits(&now[0])?);

    // Drift under Manual approval: a removed container is a plan ("1 to create") that waits.
    docker_ok(&["rm", "-f", &now[0]])?;
    let recreate = wait_awaiting(&mut dev, "plan-web", "1 to create")?;
    let s = get(&dev, "plan-web")?;
    ensure!(condition(&s, "Drifted").is_some_and(|(st, r, _)| st == "True" && r == "MachineMissing"), "{:?}", condition(&s, "Drifted"));
    unchanged_for(Duration::from_secs(3), "plan-web", &[], None)?;
    approve(&dev, "plan-web", &recreate)?;
    wait_ready_with_no_changes(&mut dev, "plan-web")?;
    let again = containers_of("plan-web")?;
    ensure!(again.len() == 1 && again[0] != now[0], "re-created once approved: {again:?}");

    // updatePolicy Never (Automatic approval): refused, the machine untouched.
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "server/plan-frozen", "-n", NS, "--timeout=120s"])?;
    let frozen = server_container(NS, "plan-frozen")?;
    dev.kubectl_ok(&["patch", "server", "plan-frozen", "-n", NS, "--type=merge", "-p", r#"{"spec":{"plan":"medium"}}"#])?;
    dev.wait_until(Duration::from_secs(60), "plan-frozen Stalled UpdateRefused", |d| {
        Ok(condition(&get(d, "plan-frozen")?, "Stalled").is_some_and(|(st, r, _)| st == "True" && r == "UpdateRefused"))
    })?;
    let (_, _, message) = condition(&get(&dev, "plan-frozen")?, "Stalled").unwrap_or_default();
    ensure!(message.contains("spec.plan") && message.contains("Never"), "the message names the field and the policy: {message}");
    unchanged_for(Duration::from_secs(3), "plan-frozen", std::slice::from_ref(&frozen), Some((1_000_000_000, 1 << 30)))?;

    // Deleting the Servers removes their containers: nothing left behind.
    dev.kubectl_ok(&["delete", "servers", "--all", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "no container left", |_| Ok(ours()?.is_empty()))?;
    dev.stop();
    Ok(())
}
