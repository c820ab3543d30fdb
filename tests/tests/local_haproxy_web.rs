//! `examples/local/haproxy-web.yaml` end to end: HAProxy on the `lb` pool balances the `app`
//! pool; requests through it reach both application servers; delete leaves nothing behind.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker_ok, leftovers, server_container};

const NS: &str = "web-demo";
const CLUSTER: &str = "web";

#[test]
fn requests_through_haproxy_reach_every_app_server() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut dev = Dev::start(&["examples/local/haproxy-web.yaml"])?;
    // The example ships its own Namespace: kubectl works in it.
    dev.kubectl_ok(&["config", "set-context", "--current", "--namespace", NS])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/web", "ts/web-app", "--timeout=600s"])?;

    let lb = server_container(NS, "web-lb-0")?;
    // Round robin: successive requests land on both app servers, as the balancer's own
    // statistics (CSV: pxname, svname, …, stot at 7, …, status at 17) show.
    let stats = |lb: &str| docker_ok(&["exec", lb, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1:8404/stats;csv"]);
    // Health checks need two passes (rise 2) before a backend takes traffic.
    dev.wait_until(Duration::from_secs(60), "both app servers UP at the balancer", |_| {
        let csv = stats(&lb)?;
        Ok(csv.lines().filter(|l| l.starts_with("servers,web-app-") && l.split(',').nth(17) == Some("UP")).count() == 2)
    })?;
    for _ in 0..6 {
        let ok = docker_ok(&["exec", &lb, "curl", "-fsS", "--max-time", "5", "http://127.0.0.1/healthz"])?;
        assert_eq!(ok.trim(), "ok");
    }
    let csv = stats(&lb)?;
    let mut served = BTreeSet::new();
    for row in csv.lines().filter(|l| l.starts_with("servers,web-app-")) {
        let cols: Vec<&str> = row.split(',').collect();
        let sessions: u64 = cols.get(7).and_then(|c| c.parse().ok()).unwrap_or(0);
        assert_eq!(cols.get(17).copied(), Some("UP"), "{row}");
        if sessions >= 2 {
            served.insert(cols[1].to_string());
        }
    }
    assert_eq!(served.len(), 2, "both app servers answer through the balancer:\n{csv}");

    let manifest = provisioning_e2e::workspace_root().join("examples/local/haproxy-web.yaml");
    dev.kubectl_ok(&["delete", "-f", &manifest.to_string_lossy(), "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    dev.stop();
    Ok(())
}
