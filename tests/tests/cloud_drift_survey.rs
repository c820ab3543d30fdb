//! The batched drift survey, end to end: `provisioning dev` with real kubectl and the upcloud
//! provider against the UpCloud API 1.3 test double (the one provider here without machine
//! events whose list call must not turn into one call per machine).
//!
//! What must hold, with `survey_secs = 2` and a one-hour resync (so nothing but the survey
//! can notice drift within the test):
//! - at steady state with three Ready Servers, the account is observed with list calls
//!   (`GET /1.3/server`) only: no per-server details call (`GET /1.3/server/{uuid}`) in a
//!   ten-second window, and at least three list calls (one per interval, not one per server);
//! - a server deleted behind the controller's back at the double (as in UpCloud's console) is
//!   noticed within seconds: a `MachineMissing` Warning event, a new machine, the Server Ready
//!   again with `Drifted=False` (`Remediated`);
//! - deleting the Servers leaves no server or storage at the double.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::cloud::{Upcloud, condition, get_json, unique_secret, write_yaml_docs};
use serde_json::{Value, json};

const NAMESPACE: &str = "survey-upcloud";
const ACCOUNT: &str = "upcloud-hel";
const USER: &str = "e2e-survey-user";
const SERVERS: [&str; 3] = ["a", "b", "c"];

fn manifest(dir: &Path, endpoint: &str, password: &str) -> Result<String> {
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {"provisioning.dev/workspace": NAMESPACE}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "upcloud-credentials", "namespace": NAMESPACE},
            "type": "Opaque", "stringData": {"UPCLOUD_USERNAME": USER, "UPCLOUD_PASSWORD": password}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NAMESPACE},
        "spec": {
            "namespace": NAMESPACE,
            "defaults": {"provider": ACCOUNT, "plan": "small", "image": "debian-12"},
            "providers": [{"name": ACCOUNT, "type": "upcloud", "zone": "fi-hel1", "endpoint": endpoint,
                "credentialsSecretRef": {"name": "upcloud-credentials"}}],
        }}),
    ];
    for name in SERVERS {
        docs.push(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"plan": "small"}}));
    }
    Ok(write_yaml_docs(dir, "survey.yaml", &docs)?.display().to_string())
}

fn server(dev: &Dev, name: &str) -> Result<Value> {
    get_json(dev, &["srv", name, "-n", NAMESPACE])
}

fn provider_id(server: &Value) -> Option<String> {
    server["status"]["providerID"].as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

fn ready(server: &Value) -> bool {
    condition(server, "Ready").is_some_and(|c| c["status"] == "True")
}

/// Requests by `METHOD kind` over a window: `list` for `GET /1.3/server`, `details` for
/// `GET /1.3/server/{uuid}`.
fn list_and_details(upcloud: &Upcloud, uuids: &[String]) -> (u64, u64) {
    let list = upcloud.double.requests_to("GET", "/1.3/server");
    let details = uuids.iter().map(|u| upcloud.double.requests_to("GET", &format!("/1.3/server/{u}"))).sum();
    (list, details)
}

#[test]
fn cloud_machines_are_surveyed_in_one_list_call_per_account_and_drift_is_remediated() -> Result<()> {
    let password = unique_secret("upcloud-survey-password");
    let upcloud = Upcloud::start(USER, &password)?;
    let tmp = tempfile::tempdir()?;
    let config = tmp.path().join("controller.toml");
    std::fs::write(&config, "survey_secs = 2\nresync_secs = 3600\nleader_election = false\n")?;
    let path = manifest(tmp.path(), upcloud.endpoint(), &password)?;
    let data = tmp.path().join("data");
    let mut dev = Dev::start_in_with(&data, &[], &[], &["--allow-insecure-endpoints", "--config", &config.display().to_string()])?;
    dev.kubectl_ok(&["apply", "-f", &path])?;

    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    dev.wait_until(Duration::from_secs(180), "three Servers Ready at the double", |d| {
        ids.clear();
        for name in SERVERS {
            let s = server(d, name)?;
            if let (true, Some(id)) = (ready(&s), provider_id(&s)) {
                ids.insert(name.to_string(), id);
            }
        }
        Ok(ids.len() == SERVERS.len())
    })?;
    let uuids: Vec<String> = ids.values().map(|id| id.trim_start_matches("upcloud://").to_string()).collect();

    // Steady state: a window of list calls only. Reconciles that were still running when the
    // Servers turned Ready (status writes, the Workspace's count) settle first.
    std::thread::sleep(Duration::from_secs(4));
    let (list_before, details_before) = list_and_details(&upcloud, &uuids);
    std::thread::sleep(Duration::from_secs(10));
    let (list_after, details_after) = list_and_details(&upcloud, &uuids);
    let (lists, details) = (list_after - list_before, details_after - details_before);
    eprintln!("steady state, 10 s, 3 Servers: {lists} list call(s), {details} details call(s)");
    ensure!(details == 0, "per-server details calls at steady state: {details} (the survey should confirm the machines)");
    ensure!((3..=7).contains(&lists), "list calls in 10 s at a 2 s survey interval: {lists} (expected about one per interval)");

    // A machine deleted behind the controller's back.
    let victim = ids["b"].clone();
    let uuid = victim.trim_start_matches("upcloud://").to_string();
    ensure!(upcloud.double.remove_server(&uuid), "the double had server {uuid}");
    let removed_at = Instant::now();
    let mut last = Value::Null;
    dev.wait_until(Duration::from_secs(120), "Server b re-created and Ready", |d| {
        last = server(d, "b")?;
        Ok(ready(&last) && provider_id(&last).is_some_and(|id| id != victim))
    })
    .with_context(|| format!("last status: {}", last["status"]))?;
    eprintln!("machine {victim} removed → Server b Ready on a new machine in {:?}", removed_at.elapsed());
    let drifted = condition(&last, "Drifted").context("Drifted condition")?;
    ensure!(drifted["status"] == "False" && drifted["reason"] == "Remediated", "{drifted}");
    ensure!(drifted["message"].as_str().is_some_and(|m| m.contains(&victim)), "{drifted}");
    let events = get_json(&dev, &["events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=b,reason=MachineMissing"])?;
    let event = events["items"].as_array().and_then(|items| items.first()).context("a MachineMissing event for Server b")?;
    ensure!(event["type"] == "Warning", "{event}");
    for name in ["a", "c"] {
        ensure!(provider_id(&server(&dev, name)?) == ids.get(name).cloned(), "Server {name} kept its machine");
    }

    dev.kubectl_ok(&["delete", "srv", "--all", "-n", NAMESPACE, "--timeout=120s"])?;
    let mut left = (usize::MAX, usize::MAX);
    dev.wait_until(Duration::from_secs(60), "no server or storage left at the double", |_| {
        left = (upcloud.double.server_count(), upcloud.double.storage_count());
        Ok(left == (0, 0))
    })
    .with_context(|| format!("left at the double: {left:?}"))?;
    ensure!(!dev.log().contains(&password), "the account password appears in the dev log");
    Ok(())
}
