//! `examples/local/postgres-redis.yaml` end to end: PostgreSQL and Redis each on their own
//! container, their passwords generated into Secrets the TaskServs own; the services answer
//! with those passwords (psql, redis-cli PING); `kubectl delete namespace` of the example's
//! namespace leaves nothing behind.

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker_ok, leftovers, server_container};

const NS: &str = "data-demo";
const CLUSTER: &str = "data";

#[test]
fn postgres_and_redis_answer() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let mut dev = Dev::start(&["examples/local/postgres-redis.yaml"])?;
    // The example ships its own Namespace: kubectl works in it.
    dev.kubectl_ok(&["config", "set-context", "--current", "--namespace", NS])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/data", "--timeout=600s"])?;

    // The generated passwords, from the Secrets named in status (passed to the clients
    // through their environment, never argv).
    let generated = |ts: &str| -> Result<String> {
        let name = dev.kubectl_ok(&["get", "ts", ts, "-o", "jsonpath={.status.generatedSecretRef.name}"])?;
        assert_eq!(name, format!("{ts}-generated"));
        let b64 = dev.kubectl_ok(&["get", "secret", &name, "-o", "jsonpath={.data.password}"])?;
        let out = std::process::Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(b64.as_bytes())?;
                }
                child.wait_with_output()
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let pg_password = generated("data-postgresql")?;
    let redis_password = generated("data-redis")?;
    assert_eq!(pg_password.len(), 32, "a generated password has 32 characters");

    let db = server_container(NS, "data-db-0")?;
    let pg_env = format!("PGPASSWORD={pg_password}");
    let one = docker_ok(&["exec", "-e", &pg_env, &db, "psql", "-h", "127.0.0.1", "-U", "app", "-d", "app", "-tAc", "select 40 + 2"])?;
    assert_eq!(one.trim(), "42");
    let cache = server_container(NS, "data-cache-0")?;
    let redis_env = format!("REDISCLI_AUTH={redis_password}");
    let pong = docker_ok(&["exec", "-e", &redis_env, &cache, "redis-cli", "-h", "127.0.0.1", "PING"])?;
    assert_eq!(pong.trim(), "PONG");
    // The generated passwords appear nowhere in the controller's log or the objects' status.
    assert!(!dev.log().contains(&pg_password) && !dev.log().contains(&redis_password), "a generated password is in the log");
    let objects = dev.kubectl_ok(&["get", "clusters,servers,taskservs", "-A", "-o", "json"])?;
    assert!(!objects.contains(&pg_password) && !objects.contains(&redis_password), "a generated password is in an object");
    // The servers reach each other on the cluster's network, by name.
    let remote = docker_ok(&["exec", &db, "sh", "-c", "exec 3<>/dev/tcp/data-cache-0/6379 && printf 'PING\\r\\n' >&3 && head -c 7 <&3"]);
    if let Ok(r) = remote {
        // Redis requires its password: reaching it is enough here.
        assert!(r.contains("NOAUTH") || r.contains("PONG"), "{r}");
    }
    let versions = dev.kubectl_ok(&["get", "ts", "-o", "jsonpath={range .items[*]}{.spec.service}={.status.installedVersion};{end}"])?;
    assert!(versions.contains("postgresql=15") && versions.contains("redis=7.0.15"), "{versions}");

    // The example goes as a namespace does (`kubectl delete namespace`): its contents are
    // deleted, the Cluster tears its containers and network down, then the namespace is gone.
    dev.kubectl_ok(&["delete", "namespace", NS, "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(120), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    let left = dev.kubectl_ok(&["get", "clusters,servers,taskservs", "-A", "-o", "name"])?;
    assert!(left.trim().is_empty(), "objects left after the namespace's deletion: {left}");
    dev.stop();
    Ok(())
}
