//! `examples/local/haproxy-web.yaml` end to end: HAProxy on the `lb` pool balances the `app`
//! pool; requests through it reach both application servers; delete leaves nothing behind.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker_ok, leftovers, server_container};

const NS: &str = "default";
const CLUSTER: &str = "web";

#[test]
fn requests_through_haproxy_reach_every_app_server() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut dev = Dev::start(&["examples/local/haproxy-web.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/web", "ts/web-app", "--timeout=600s"])?;

    let lb = server_container(NS, "web-lb-0")?;
    let ok = docker_ok(&["exec", &lb, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1/healthz"])?;
    assert_eq!(ok.trim(), "ok");
    // Round robin: successive requests land on both app servers (their stats pages name them).
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let page = docker_ok(&["exec", &lb, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1/stats"])?;
        for name in ["web-app-0", "web-app-1"] {
            if page.contains(name) {
                seen.insert(name);
            }
        }
    }
    assert_eq!(seen.len(), 2, "both app servers answer through the balancer: {seen:?}");

    let manifest = provisioning_e2e::workspace_root().join("examples/local/haproxy-web.yaml");
    dev.kubectl_ok(&["delete", "-f", &manifest.to_string_lossy(), "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    dev.stop();
    Ok(())
}
