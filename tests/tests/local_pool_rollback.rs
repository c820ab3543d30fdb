//! A pool image change that cannot be carried out, under `failurePolicy: Rollback`, on the
//! local provider (`provisioning dev`, kubectl, Docker): the pool's image is changed to a tag
//! that does not exist. The first member gets the new spec and its update fails (Stalled: the
//! image is missing); the second is never touched; the Cluster puts the first member back on
//! the old image — Ready again on a container of the old image — and stays Stalled
//! `RolledBack` until its spec changes (the missing image is not tried again).

use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker, docker_ok, server_container};
use serde_json::Value;

const NS: &str = "pool-rollback-e2e";
const MISSING: &str = "provisioning-node:no-such-tag-e2e";

struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        provisioning_e2e::docker::remove_namespace(NS);
    }
}

fn ours() -> Result<Vec<String>> {
    provisioning_e2e::docker::namespace_containers(NS)
}

fn get(dev: &Dev, kind: &str, name: &str) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(&["get", kind, name, "-n", NS, "-o", "json"])?)?)
}

fn condition(object: &Value, type_: &str) -> (String, String) {
    let c = object["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).cloned().unwrap_or_default();
    (c["status"].as_str().unwrap_or_default().to_string(), c["reason"].as_str().unwrap_or_default().to_string())
}

#[test]
fn a_failed_machine_update_is_rolled_back_and_the_rest_untouched() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    ensure!(ours()?.is_empty(), "leftovers of an earlier run in namespace {NS}: {:?}", ours()?);
    ensure!(!docker(&["image", "inspect", MISSING])?.status.success(), "{MISSING} must not exist");
    let _cleanup = Cleanup;
    let mut dev = Dev::start(&["tests/tests/local_pool_rollback.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/rb", "-n", NS, "--timeout=180s"])?;
    let untouched = server_container(NS, "rb-web-1")?;
    let old_image = docker_ok(&["inspect", "-f", "{{.Config.Image}}", &untouched])?.trim().to_string();

    dev.kubectl_ok(&[
        "patch",
        "cluster",
        "rb",
        "-n",
        NS,
        "--type=json",
        "-p",
        &format!(r#"[{{"op":"add","path":"/spec/pools/0/image","value":"{MISSING}"}}]"#),
    ])?;
    dev.wait_until(Duration::from_secs(120), "the Cluster Stalled RolledBack", |d| {
        Ok(condition(&get(d, "cluster", "rb")?, "Stalled") == ("True".into(), "RolledBack".into()))
    })?;
    let c = get(&dev, "cluster", "rb")?;
    let msg = c["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|x| x["type"] == "Stalled"))
        .map(|x| x["message"].to_string())
        .unwrap_or_default();
    ensure!(msg.contains("rb-web-0") && msg.contains("rolled back"), "the message names the failed member: {msg}");
    // Member 0 is back on the old image and runs; member 1 was never touched.
    dev.wait_until(Duration::from_secs(120), "rb-web-0 Ready on the old image", |d| {
        let s = get(d, "server", "rb-web-0")?;
        Ok(s["spec"]["image"].as_str().unwrap_or_default().is_empty() && condition(&s, "Ready").0 == "True")
    })?;
    let back = server_container(NS, "rb-web-0")?;
    ensure!(docker_ok(&["inspect", "-f", "{{.Config.Image}}", &back])?.trim() == old_image, "rb-web-0 runs {old_image} again");
    ensure!(server_container(NS, "rb-web-1")? == untouched, "rb-web-1 kept its container");
    ensure!(get(&dev, "server", "rb-web-1")?["spec"]["image"].as_str().unwrap_or_default().is_empty(), "rb-web-1 never got the new spec");
    let events = dev.kubectl_ok(&["get", "events", "-n", NS, "-o", "jsonpath={range .items[*]}{.reason} {end}"])?;
    ensure!(events.contains("RollingBack"), "{events}");
    // Stays rolled back: the missing image is not tried again.
    std::thread::sleep(Duration::from_secs(3));
    ensure!(get(&dev, "server", "rb-web-0")?["spec"]["image"].as_str().unwrap_or_default().is_empty());

    dev.kubectl_ok(&["delete", "cluster", "rb", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(120), "no container left", |_| Ok(ours()?.is_empty()))?;
    dev.stop();
    Ok(())
}
