//! A real upgrade and a real rollback through the controller: `provisioning dev`, a 3-member
//! local Cluster (tests/tests/local_nginx_upgrade.yaml) running nginx 1.22.1-9+deb12u9
//! (bookworm), rolled out one member at a time (`rollout: {maxUnavailable: 1}`). Its version
//! is changed to 1.22.1-9+deb12u11 (bookworm-security) while the last member's apt sources
//! lack bookworm-security: the members before it upgrade, its install fails ("not offered"),
//! rollbackOnFailure re-installs the last good version everywhere (the members that had
//! upgraded are really downgraded), the TaskServ is Stalled with UpgradeFailed and a
//! RollingBack Warning. With the mirror restored, a new generation upgrades every member,
//! never two at once, the others serving meanwhile.

use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker_ok, leftovers, server_container};
use serde_json::Value;

const NS: &str = "default";
const CLUSTER: &str = "nginxup";
const TASKSERV: &str = "nginxup-nginx";
const OLD: &str = "1.22.1-9+deb12u9";
const NEW: &str = "1.22.1-9+deb12u11";
const SOURCES: &str = "/etc/apt/sources.list.d/provisioning.sources";

fn members() -> Result<Vec<String>> {
    (0..3).map(|i| server_container(NS, &format!("{CLUSTER}-web-{i}"))).collect()
}

fn dpkg_version(container: &str) -> Result<String> {
    docker_ok(&["exec", container, "dpkg-query", "-W", "-f", "${Version}", "nginx"])
}

fn taskserv(dev: &Dev) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(&["get", "ts", TASKSERV, "-n", NS, "-o", "json"])?)?)
}

fn condition(object: &Value, type_: &str) -> Option<(String, String)> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| (c["status"].as_str().unwrap_or_default().to_string(), c["reason"].as_str().unwrap_or_default().to_string()))
}

fn warned(dev: &Dev, reason: &str) -> Result<bool> {
    let events: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "events.events.k8s.io", "-n", NS, "-o", "json"])?)?;
    Ok(events["items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|e| e["type"] == "Warning" && e["reason"] == reason && e["regarding"]["name"] == TASKSERV)))
}

fn event_says(dev: &Dev, reason: &str, text: &str) -> Result<bool> {
    let events: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "events.events.k8s.io", "-n", NS, "-o", "json"])?)?;
    Ok(events["items"].as_array().is_some_and(|items| {
        items
            .iter()
            .any(|e| e["reason"] == reason && e["regarding"]["name"] == TASKSERV && e["note"].as_str().is_some_and(|n| n.contains(text)))
    }))
}

fn set_version(dev: &Dev, version: &str) -> Result<()> {
    let patch = format!(r#"[{{"op":"replace","path":"/spec/taskservs/0/version","value":"{version}"}}]"#);
    dev.kubectl_ok(&["patch", "pcl", CLUSTER, "-n", NS, "--type=json", "-p", &patch])?;
    Ok(())
}

#[test]
fn nginx_upgrade_fails_on_one_member_rolls_back_then_upgrades() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    ensure!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut dev = Dev::start(&["tests/tests/local_nginx_upgrade.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("cluster/{CLUSTER}"), "--timeout=600s"])?;
    let ts = taskserv(&dev)?;
    assert_eq!(ts["status"]["installedVersion"], OLD, "{ts}");
    assert_eq!(ts["status"]["lastGoodVersion"], OLD, "{ts}");
    let nodes = members()?;
    for c in &nodes {
        assert_eq!(dpkg_version(c)?, OLD);
        assert_eq!(docker_ok(&["exec", c, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1/healthz"])?.trim(), "ok");
    }

    // The last member's mirror loses bookworm-security (where the new version lives).
    let broken = &nodes[2];
    let original = docker_ok(&["exec", broken, "cat", SOURCES])?;
    docker_ok(&[
        "exec",
        broken,
        "sh",
        "-c",
        "awk -v RS= -v ORS='\\n\\n' '!/debian-security/' \"$1\" > /tmp/s && cp /tmp/s \"$1\" && rm -f /var/lib/apt/lists/*security* && apt-get update -q >/dev/null",
        "sh",
        SOURCES,
    ])?;

    // The upgrade: web-0 and web-1 upgrade, web-2 fails, the TaskServ rolls back to the last
    // good version.
    set_version(&dev, NEW)?;
    // Members that upgraded before the failure was seen are rolled back too (a real
    // downgrade): every member Installed at the old version, none still installing.
    dev.wait_until(Duration::from_secs(300), "the failed upgrade rolled back on every member (Stalled UpgradeFailed)", |d| {
        let ts = taskserv(d)?;
        let stalled = condition(&ts, "Stalled").is_some_and(|(s, r)| s == "True" && r == "UpgradeFailed");
        let settled = ts["status"]["servers"].as_array().is_some_and(|servers| {
            servers.len() == 3 && servers.iter().all(|s| s["phase"] == "Installed" && s["version"] == OLD && s["healthy"] == true)
        });
        let olds = nodes.iter().filter(|c| dpkg_version(c).is_ok_and(|v| v == OLD)).count();
        Ok(stalled && settled && olds == 3 && ts["status"]["installedVersion"] == OLD)
    })?;
    assert!(warned(&dev, "RollingBack")?, "no RollingBack Warning event");
    // Members that had upgraded were really downgraded: dpkg's log has both steps.
    let round_trips = nodes
        .iter()
        .filter(|c| {
            let log = docker_ok(&["exec", c, "cat", "/var/log/dpkg.log"]).unwrap_or_default();
            let up = log.find(&format!("upgrade nginx:amd64 {OLD} {NEW}"));
            let down = log.rfind(&format!("nginx:amd64 {NEW} {OLD}"));
            matches!((up, down), (Some(u), Some(d)) if d > u)
        })
        .count();
    // One at a time in name order: web-0 and web-1 upgraded before web-2 failed.
    assert_eq!(round_trips, 2, "members that went to {NEW} and back to {OLD}");
    eprintln!("{round_trips} member(s) upgraded and rolled back (downgraded)");
    let ts = taskserv(&dev)?;
    assert_eq!(ts["status"]["lastGoodVersion"], OLD, "{ts}");
    let stalled =
        ts["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Stalled")).cloned().unwrap_or_default();
    assert!(stalled["message"].as_str().is_some_and(|m| m.contains(&format!("{CLUSTER}-web-2"))), "{stalled}");
    // The cause, from install.nu's output, is in the InstallFailed Warning.
    assert!(event_says(&dev, "InstallFailed", "is not offered by the apt sources")?, "no InstallFailed event naming the cause");
    for c in &nodes {
        assert_eq!(docker_ok(&["exec", c, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1/healthz"])?.trim(), "ok");
    }

    // Mirror restored; a new generation (the default version, which is the new one) upgrades.
    docker_ok(&["exec", broken, "sh", "-c", "printf '%s\\n' \"$2\" > \"$1\" && apt-get update -q >/dev/null", "sh", SOURCES, &original])?;
    set_version(&dev, "")?;
    let mut most_at_once = 0;
    let mut fewest_serving = nodes.len();
    dev.wait_until(Duration::from_secs(300), "every member upgraded, the TaskServ Ready", |d| {
        let ts = taskserv(d)?;
        let installing = ts["status"]["servers"].as_array().map_or(0, |s| s.iter().filter(|s| s["phase"] == "Installing").count());
        most_at_once = most_at_once.max(installing);
        let serving = nodes
            .iter()
            .filter(|c| {
                docker_ok(&["exec", c, "curl", "-fsS", "--max-time", "2", "http://127.0.0.1/healthz"]).is_ok_and(|b| b.trim() == "ok")
            })
            .count();
        fewest_serving = fewest_serving.min(serving);
        let ready = condition(&ts, "Ready").is_some_and(|(s, _)| s == "True");
        let news = nodes.iter().filter(|c| dpkg_version(c).is_ok_and(|v| v == NEW)).count();
        Ok(ready && news == 3 && ts["status"]["installedVersion"] == NEW)
    })?;
    assert_eq!(taskserv(&dev)?["status"]["lastGoodVersion"], NEW);
    assert!(most_at_once <= 1, "{most_at_once} members were installing at once (maxUnavailable 1)");
    assert!(fewest_serving >= 2, "only {fewest_serving} members answered /healthz at one point of the rolling upgrade");
    eprintln!("rolling upgrade: at most {most_at_once} member installing, at least {fewest_serving} serving");

    let manifest = provisioning_e2e::workspace_root().join("tests/tests/local_nginx_upgrade.yaml");
    dev.kubectl_ok(&["delete", "-f", &manifest.to_string_lossy(), "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    dev.stop();
    Ok(())
}
