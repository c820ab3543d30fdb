//! Config drift end to end: redis on a local Server, its rendered config file edited inside the
//! container (as a person with a shell on the machine would). The next health check notices
//! the digest no longer matches what install wrote: the TaskServ says `Drifted=True`
//! (ConfigChanged, naming server and file) with a Warning, the install runs again and renders
//! the file anew, then `Drifted=False` (Remediated) and Ready. Real `provisioning dev`,
//! kubectl, Docker, nu and redis.

use std::time::{Duration, Instant};

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker_ok, server_container};

const NS: &str = "drift-cfg";

fn drifted(dev: &Dev) -> Result<String> {
    dev.kubectl_ok(&[
        "get",
        "ts",
        "redis",
        "-n",
        NS,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Drifted\")].status}/{.status.conditions[?(@.type==\"Drifted\")].reason}",
    ])
}

#[test]
fn an_edited_config_file_is_drift_and_is_rendered_again() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    let mut dev = Dev::start(&["tests/tests/local_config_drift.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "ts/redis", "-n", NS, "--timeout=300s"])?;
    assert_eq!(drifted(&dev)?, "/", "no Drifted condition before any drift");
    let container = server_container(NS, "cache")?;
    let original = docker_ok(&["exec", &container, "cat", "/etc/redis/redis.conf"])?;

    docker_ok(&["exec", &container, "sh", "-c", "echo '# tampered by hand' >> /etc/redis/redis.conf"])?;
    let edited = Instant::now();
    // Redis's check runs every 30 s.
    dev.wait_until(Duration::from_secs(90), "Drifted=True ConfigChanged", |d| Ok(drifted(d)? == "True/ConfigChanged"))?;
    let noticed = edited.elapsed();
    let message =
        dev.kubectl_ok(&["get", "ts", "redis", "-n", NS, "-o", "jsonpath={.status.conditions[?(@.type==\"Drifted\")].message}"])?;
    assert!(message.contains("cache") && message.contains("/etc/redis/redis.conf"), "{message}");
    dev.wait_until(Duration::from_secs(120), "Drifted=False Remediated and Ready", |d| {
        let ready = d.kubectl_ok(&["get", "ts", "redis", "-n", NS, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])?;
        Ok(drifted(d)? == "False/Remediated" && ready == "True")
    })?;
    let remediated = edited.elapsed();
    let now = docker_ok(&["exec", &container, "cat", "/etc/redis/redis.conf"])?;
    assert!(!now.contains("tampered"), "the file was rendered again:\n{now}");
    assert_eq!(now, original, "the same content as install rendered");
    assert_eq!(server_container(NS, "cache")?, container, "remediated in place, not by a new machine");
    let events = dev.kubectl_ok(&[
        "get",
        "events",
        "-n",
        NS,
        "--field-selector",
        "type=Warning",
        "-o",
        "jsonpath={range .items[*]}{.reason}={.message}{\"\\n\"}{end}",
    ])?;
    assert!(events.lines().any(|l| l.starts_with("ConfigChanged=") && l.contains("/etc/redis/redis.conf")), "{events}");
    println!("config drift noticed after {noticed:.1?}, remediated after {remediated:.1?}");

    dev.kubectl_ok(&["delete", "ts,srv", "--all", "-n", NS, "--timeout=120s"])?;
    dev.stop();
    Ok(())
}
