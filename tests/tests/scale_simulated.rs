//! Scaling an etcd Cluster 3 → 4 on the simulated provider: while the new member has no
//! address yet, the existing members' re-install waits for it ("waiting for the address of
//! Server …") instead of failing to render etcd.conf.yml. The TaskServ never shows a Failed
//! server phase or "install failed", and ends Ready on 4 servers — saying that on the
//! simulated provider no script ran (Installed reason `Simulated`, per-server output tail).

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use provisioning_e2e::Dev;
use serde_json::Value;

fn taskserv(dev: &Dev) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(&["get", "ts", "etcd-etcd", "-n", "scaling", "-o", "json"])?)?)
}

fn condition_message(ts: &Value, type_: &str) -> String {
    let conditions = ts["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.iter().find(|c| c["type"] == type_).and_then(|c| c["message"].as_str()).unwrap_or_default().to_string()
}

fn ready(ts: &Value) -> bool {
    let conditions = ts["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

#[test]
fn scaling_etcd_up_waits_for_the_new_members_address_instead_of_failing() -> Result<()> {
    let dev = Dev::start(&["tests/tests/scale_simulated.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "-n", "scaling", "--timeout=120s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "ts/etcd-etcd", "-n", "scaling", "--timeout=120s"])?;

    // Every version of the TaskServ during the scale-up, from a watch started before it
    // (polling can miss the whole scale-up: on the simulated provider it takes well under the
    // time of one kubectl call).
    let watch_out = dev.data_dir.join("scale-watch.json");
    let mut watch = provisioning_e2e::kubectl_command(&dev.kubeconfig())
        .args(["get", "ts", "etcd-etcd", "-n", "scaling", "-w", "-o", "json"])
        .stdout(std::fs::File::create(&watch_out)?)
        .stderr(std::process::Stdio::null())
        .spawn()?;
    // The watch's first output is the current version: wait for it before patching.
    let start = Instant::now();
    while std::fs::metadata(&watch_out)?.len() == 0 {
        ensure!(start.elapsed() < Duration::from_secs(30), "kubectl get -w printed nothing");
        std::thread::sleep(Duration::from_millis(50));
    }

    let patch = r#"[{"op":"replace","path":"/spec/pools/0/replicas","value":4}]"#;
    dev.kubectl_ok(&["patch", "cluster", "etcd", "-n", "scaling", "--type=json", "-p", patch])?;

    let start = Instant::now();
    loop {
        let ts = taskserv(&dev)?;
        let servers = ts["status"]["servers"].as_array().cloned().unwrap_or_default();
        let installed = servers.iter().filter(|s| s["phase"] == "Installed").count();
        if ready(&ts) && servers.len() == 4 && installed == 4 {
            break;
        }
        if start.elapsed() > Duration::from_secs(180) {
            bail!("not Ready on 4 servers after 180 s: {}\n{}", ts["status"], dev.log_tail(60));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let the watch print the last version, then read every version it saw.
    let last = taskserv(&dev)?["metadata"]["resourceVersion"].clone();
    let versions = |path: &std::path::Path| -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(path)?;
        Ok(serde_json::Deserializer::from_str(&text).into_iter::<Value>().filter_map(Result::ok).collect())
    };
    let start = Instant::now();
    while !versions(&watch_out)?.iter().any(|v| v["metadata"]["resourceVersion"] == last) {
        ensure!(start.elapsed() < Duration::from_secs(30), "the watch never showed resourceVersion {last}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = versions(&watch_out)?;
    let mut seen_not_ready = false;
    for ts in &seen {
        for s in ts["status"]["servers"].as_array().cloned().unwrap_or_default() {
            ensure!(s["phase"] != "Failed", "a server failed during the scale-up: {s}\n{}", dev.log_tail(40));
        }
        for type_ in ["Ready", "Installed"] {
            let message = condition_message(ts, type_);
            ensure!(!message.contains("install failed"), "{type_}: {message}\n{}", dev.log_tail(40));
        }
        seen_not_ready |= !ready(ts);
    }
    ensure!(seen_not_ready, "the scale-up was observed (the TaskServ left Ready while adding the member) in {} version(s)", seen.len());

    // Honesty on the simulated provider: nothing ran, and the TaskServ says so.
    let ts = taskserv(&dev)?;
    let conditions = ts["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let installed = conditions.iter().find(|c| c["type"] == "Installed").cloned().unwrap_or_default();
    ensure!(installed["status"] == "True" && installed["reason"] == "Simulated", "{installed}");
    ensure!(condition_message(&ts, "Ready").contains("simulated: scripts not run"), "{}", condition_message(&ts, "Ready"));
    for s in ts["status"]["servers"].as_array().cloned().unwrap_or_default() {
        let tail = s["lastRun"]["outputTail"].as_str().unwrap_or_default();
        ensure!(tail.contains("simulated: scripts not run ("), "{s}");
    }
    Ok(())
}
