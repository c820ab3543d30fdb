//! Machine drift on the local provider, through `provisioning dev` and kubectl: the controller
//! follows Docker's container events, so a standalone Server's container that is
//! - removed (`docker rm -f`) is noticed within seconds (Drifted=True MachineMissing and a
//!   Warning event), re-created, and the Server is Ready again with Drifted=False;
//! - stopped (`docker stop`) is noticed (Drifted=True MachineStopped, Warning), started again
//!   (the same container), and the Server is Ready again.
//!
//! Every status version is seen through a `kubectl get -w` watch (the Drifted=True version
//! lives only until the remediation finishes). Detection times are measured and printed.

use std::io::BufReader;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use provisioning_e2e::docker::{docker, docker_ok, server_container};
use provisioning_e2e::{Dev, kubectl_command};
use serde_json::Value;

const NS: &str = "default";
const SERVER: &str = "drift-web";

/// One watched version of the Server: when it arrived, Drifted's (status, reason), Ready.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    drifted: Option<(String, String)>,
    ready: bool,
}

fn condition(server: &Value, type_: &str) -> Option<(String, String)> {
    server["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| (c["status"].as_str().unwrap_or_default().to_string(), c["reason"].as_str().unwrap_or_default().to_string()))
}

/// Every version of Server `SERVER` as a watch delivers it.
struct Watch {
    child: Child,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Watch {
    fn start(dev: &Dev) -> Result<Watch> {
        let mut child = kubectl_command(&dev.kubeconfig())
            .args(["get", "servers", "-n", NS, "-w", "-o", "json", "--output-watch-events"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let Some(stdout) = child.stdout.take() else { bail!("no stdout of kubectl -w") };
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sink = seen.clone();
        std::thread::spawn(move || {
            for value in serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>() {
                let Ok(value) = value else { break };
                let object = if value.get("object").is_some() { &value["object"] } else { &value };
                if object["metadata"]["name"] != SERVER {
                    continue;
                }
                let ready = condition(object, "Ready").is_some_and(|(s, _)| s == "True");
                let drifted = condition(object, "Drifted");
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(Seen { at: Instant::now(), drifted, ready });
            }
        });
        Ok(Watch { child, seen })
    }

    /// When a version with Drifted=True and `reason` arrived after `since`.
    fn drifted_since(&self, since: Instant, reason: &str) -> Option<Instant> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().filter(|s| s.at >= since).find(|s| s.drifted.as_ref().is_some_and(|(st, r)| st == "True" && r == reason)).map(|s| s.at)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes whatever this test's Server left in Docker (also when the test fails).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        for id in ours().unwrap_or_default() {
            let _ = docker(&["rm", "-f", "-v", &id]);
        }
        // The namespace's network goes once nothing uses it (docker refuses otherwise).
        let _ = docker(&["network", "rm", &format!("prov_{NS}")]);
    }
}

/// Ids of the containers (running or not) of this test's Server.
fn ours() -> Result<Vec<String>> {
    let ns = format!("label=provisioning.dev/namespace={NS}");
    let srv = format!("label=provisioning.dev/server={SERVER}");
    Ok(docker_ok(&["ps", "-aq", "--filter", &ns, "--filter", &srv])?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

fn server(dev: &Dev) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(&["get", "server", SERVER, "-n", NS, "-o", "json"])?)?)
}

fn warned(dev: &Dev, reason: &str) -> Result<bool> {
    let events: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "events.events.k8s.io", "-n", NS, "-o", "json"])?)?;
    Ok(events["items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|e| e["type"] == "Warning" && e["reason"] == reason && e["regarding"]["name"] == SERVER)))
}

/// Waits for the Server to be Ready with Drifted=False (Remediated) on a running container.
fn wait_remediated(dev: &mut Dev) -> Result<Value> {
    dev.wait_until(Duration::from_secs(120), "the Server Ready again, Drifted=False", |d| {
        let s = server(d)?;
        let ready = condition(&s, "Ready").is_some_and(|(st, _)| st == "True");
        let drifted = condition(&s, "Drifted");
        Ok(ready && drifted.is_some_and(|(st, r)| st == "False" && r == "Remediated") && server_container(NS, SERVER).is_ok())
    })?;
    server(dev)
}

#[test]
fn removed_and_stopped_containers_are_noticed_and_remediated() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    ensure!(ours()?.is_empty(), "leftovers of an earlier run: {:?}", ours()?);
    let _cleanup = Cleanup;
    let mut dev = Dev::start(&["tests/tests/local_drift.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("server/{SERVER}"), "-n", NS, "--timeout=300s"])?;
    ensure!(condition(&server(&dev)?, "Drifted").is_none(), "no Drifted condition before any drift");
    let watch = Watch::start(&dev)?;
    dev.wait_until(Duration::from_secs(20), "the watch to deliver the Server", |_| {
        Ok(!watch.seen.lock().unwrap_or_else(|p| p.into_inner()).is_empty())
    })?;

    // docker rm -f: missing → Drifted=True MachineMissing, Warning, a new container, Ready.
    let before = server(&dev)?["status"]["providerID"].as_str().unwrap_or_default().to_string();
    let removed = server_container(NS, SERVER)?;
    let t0 = Instant::now();
    docker_ok(&["rm", "-f", &removed])?;
    dev.wait_until(Duration::from_secs(30), "Drifted=True MachineMissing", |_| Ok(watch.drifted_since(t0, "MachineMissing").is_some()))?;
    let missing_after = watch.drifted_since(t0, "MachineMissing").map(|at| at - t0).unwrap_or_default();
    let after = wait_remediated(&mut dev)?;
    let recreated_after = t0.elapsed();
    ensure!(warned(&dev, "MachineMissing")?, "a Warning event MachineMissing for {SERVER}");
    let now = after["status"]["providerID"].as_str().unwrap_or_default();
    ensure!(!now.is_empty() && now != before, "a new machine: {before} → {now}");
    ensure!(ours()?.len() == 1, "exactly one container: {:?}", ours()?);
    eprintln!("docker rm -f: Drifted=True after {missing_after:?}, Ready on a new container after {recreated_after:?}");
    ensure!(missing_after < Duration::from_secs(10), "removal noticed within 10 s (took {missing_after:?})");

    // docker stop: stopped → Drifted=True MachineStopped, Warning, the same container running.
    let stopped = server_container(NS, SERVER)?;
    let t1 = Instant::now();
    docker_ok(&["stop", "-t", "2", &stopped])?;
    dev.wait_until(Duration::from_secs(30), "Drifted=True MachineStopped", |_| Ok(watch.drifted_since(t1, "MachineStopped").is_some()))?;
    let stopped_after = watch.drifted_since(t1, "MachineStopped").map(|at| at - t1).unwrap_or_default();
    let after = wait_remediated(&mut dev)?;
    let started_after = t1.elapsed();
    ensure!(warned(&dev, "MachineStopped")?, "a Warning event MachineStopped for {SERVER}");
    ensure!(server_container(NS, SERVER)? == stopped, "the stopped container itself runs again");
    ensure!(after["status"]["providerID"].as_str() == Some(now), "the same machine");
    eprintln!("docker stop: Drifted=True after {stopped_after:?} (docker stop returned first), Ready again after {started_after:?}");
    ensure!(stopped_after < Duration::from_secs(10), "stop noticed within 10 s (took {stopped_after:?})");
    let drifts = watch.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ensure!(drifts.last().is_some_and(|s| s.ready), "the last watched version is Ready: {drifts:?}");

    // Deleting the Server removes its container: nothing left behind.
    dev.kubectl_ok(&["delete", "server", SERVER, "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "no container left", |_| Ok(ours()?.is_empty()))?;
    drop(watch);
    dev.stop();
    Ok(())
}
