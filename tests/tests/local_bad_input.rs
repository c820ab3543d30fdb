//! Bad input end to end: an unknown service, a config that breaks the service's schema and a
//! version the catalog does not have → `Stalled` with that message, and nothing runs (no
//! script run in status, no container for the Cluster).

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::leftovers;

fn stalled(dev: &Dev, kind: &str, name: &str) -> Result<(String, String, String)> {
    let out = dev.kubectl_ok(&[
        "get",
        kind,
        name,
        "-n",
        "bad-input",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Stalled\")].status}|{.status.conditions[?(@.type==\"Stalled\")].reason}|{.status.conditions[?(@.type==\"Stalled\")].message}",
    ])?;
    let mut parts = out.splitn(3, '|').map(str::to_string);
    Ok((parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default()))
}

#[test]
fn bad_input_is_stalled_with_its_message_and_nothing_runs() -> Result<()> {
    let mut dev = Dev::start(&["tests/tests/local_bad_input.yaml"])?;
    let cases = [
        ("ts", "unknown-service", "UnknownService", "unknown service \"nosuchservice\""),
        ("ts", "bad-config", "InvalidConfig", "invalid config for redis: at /port"),
        ("ts", "unknown-version", "UnknownVersion", "service etcd has no version \"9.9.9\" (available: 3.4.23)"),
        ("pcl", "bad-cluster", "UnknownVersion", "service redis has no version \"1.0\""),
    ];
    for (kind, name, reason, message) in cases {
        dev.wait_until(Duration::from_secs(120), &format!("{kind}/{name} Stalled"), |d| {
            // The namespace appears once the Workspace made it; until then the get fails.
            Ok(stalled(d, kind, name).is_ok_and(|s| s.0 == "True"))
        })?;
        let (_, r, m) = stalled(&dev, kind, name)?;
        assert_eq!(r, reason, "{kind}/{name}: {m}");
        assert!(m.contains(message), "{kind}/{name}: {m}");
        let ready =
            dev.kubectl_ok(&["get", kind, name, "-n", "bad-input", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])?;
        assert_eq!(ready, "False");
    }
    // kubectl wait understands it too.
    dev.kubectl_ok(&["wait", "--for=condition=Stalled", "ts", "--all", "-n", "bad-input", "--timeout=30s"])?;
    // Nothing ran: no script run recorded, no server entry, no Server or container for the Cluster.
    let runs = dev.kubectl_ok(&["get", "ts", "-n", "bad-input", "-o", "jsonpath={.items[*].status.servers}"])?;
    assert!(runs.trim().is_empty(), "no script may run: {runs}");
    let servers = dev.kubectl_ok(&["get", "srv", "-n", "bad-input", "-l", "provisioning.dev/cluster=bad-cluster", "-o", "name"])?;
    assert!(servers.trim().is_empty(), "{servers}");
    assert!(leftovers("bad-input", "bad-cluster")?.is_empty());
    // The stall is quiet: no retry storm, one Warning per object.
    std::thread::sleep(Duration::from_secs(3));
    let warnings = dev.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "bad-input",
        "-o",
        "jsonpath={range .items[?(@.type==\"Warning\")]}{.involvedObject.name}{.regarding.name}/{.reason}{\"\\n\"}{end}",
    ])?;
    for (_, name, reason, _) in cases {
        assert!(warnings.contains(&format!("{name}/{reason}")), "warning for {name} missing:\n{warnings}");
    }
    dev.stop();
    Ok(())
}
