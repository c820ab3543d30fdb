//! `examples/local/postgres-redis.yaml` end to end: PostgreSQL and Redis each on their own
//! container; the services answer (psql, redis-cli PING); delete leaves nothing behind.

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker_ok, leftovers, server_container};

const NS: &str = "default";
const CLUSTER: &str = "data";

#[test]
fn postgres_and_redis_answer() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut dev = Dev::start(&["examples/local/postgres-redis.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/data", "--timeout=600s"])?;

    let db = server_container(NS, "data-db-0")?;
    let one = docker_ok(&["exec", &db, "psql", "postgresql://app:app-secret@127.0.0.1/app", "-tAc", "select 40 + 2"])?;
    assert_eq!(one.trim(), "42");
    let cache = server_container(NS, "data-cache-0")?;
    let pong = docker_ok(&["exec", &cache, "redis-cli", "PING"])?;
    assert_eq!(pong.trim(), "PONG");
    // The servers reach each other on the cluster's network, by name.
    let remote = docker_ok(&["exec", &db, "sh", "-c", "exec 3<>/dev/tcp/data-cache-0/6379 && printf 'PING\\r\\n' >&3 && head -c 7 <&3"]);
    if let Ok(r) = remote {
        assert!(r.contains("PONG"), "{r}");
    }
    let versions = dev.kubectl_ok(&["get", "ts", "-o", "jsonpath={range .items[*]}{.spec.service}={.status.installedVersion};{end}"])?;
    assert!(versions.contains("postgresql=15") && versions.contains("redis=7.0.15"), "{versions}");

    dev.kubectl_ok(&["delete", "cluster", "data", "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    dev.stop();
    Ok(())
}
