//! Passwords only from Secrets, end to end on the local Docker provider with real `nu`:
//! a Cluster with postgresql and redis whose passwords come from Secrets through `configFrom`.
//!
//! - before the Secrets exist the TaskServs wait (Stalled, naming the Secret and key) and go
//!   on when they appear;
//! - clients log in with the passwords (psql and redis-cli inside the containers, the
//!   password in the environment); a hostile postgres password (quotes, `$(...)`, backticks,
//!   newline, backslash) works;
//! - the Secrets are rotated: the installs re-run and clients log in with the new values,
//!   the status' inputs hash changes;
//! - no password appears in the controller's log, any status, any event, or the argv of any
//!   process inside the machines sampled during the installs;
//! - a secret field that breaks its schema is refused without echoing the value.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker, docker_ok, leftovers, server_container};
use serde_json::json;

const NS: &str = "default";
const CLUSTER: &str = "vault";
const MACHINES: [&str; 2] = ["vault-db-0", "vault-cache-0"];

// Hostile on purpose: quotes, command substitution, backticks, a backslash and a newline.
const PG_PASSWORD_1: &str = "it's \"q\" $(touch /tmp/pwned) `id` back\\slash\nsecond-line;DROP";
const PG_PASSWORD_2: &str = "rotated 'pg' \\ `uname` $(reboot)\nline-two-rotated";
const REDIS_PASSWORD_1: &str = "redis-first-Kq8pX2mZ";
const REDIS_PASSWORD_2: &str = "redis-rotated-Vb7nW4tY";
const BAD_VALUE: &str = "bad\"quote-NEVER-ECHOED-7731";

fn secret(name: &str, key: &str, value: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "type": "Opaque",
           "stringData": {key: value}})
}

fn apply(dev: &Dev, dir: &std::path::Path, file: &str, doc: &serde_json::Value) -> Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, serde_json::to_vec_pretty(doc)?)?;
    dev.kubectl_ok(&["apply", "-f", path.to_str().unwrap_or_default()])?;
    Ok(())
}

fn cluster() -> serde_json::Value {
    json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NS},
        "spec": {
            "provider": "local",
            "pools": [{"name": "db", "replicas": 1, "plan": "medium"}, {"name": "cache", "replicas": 1, "plan": "small"}],
            "taskservs": [
                {"service": "postgresql", "pools": ["db"], "config": {"user": "app", "database": "app"},
                 "configFrom": [{"kind": "Secret", "name": "db-creds", "key": "password", "targetPath": "password"}]},
                {"service": "redis", "pools": ["cache"],
                 "configFrom": [{"kind": "Secret", "name": "cache-creds", "key": "values.yaml"}]}
            ],
            "parallelLimit": 4
        }
    })
}

fn psql_login(container: &str, password: &str) -> Result<bool> {
    let env = format!("PGPASSWORD={password}");
    let out = docker(&["exec", "-e", &env, container, "psql", "-h", "127.0.0.1", "-U", "app", "-d", "app", "-tAc", "select 40 + 2"])?;
    Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "42")
}

fn redis_login(container: &str, password: &str) -> Result<bool> {
    let env = format!("REDISCLI_AUTH={password}");
    let out = docker(&["exec", "-e", &env, container, "redis-cli", "-h", "127.0.0.1", "PING"])?;
    Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "PONG")
}

fn condition(dev: &Dev, object: &str, type_: &str, field: &str) -> String {
    let path = format!("jsonpath={{.status.conditions[?(@.type==\"{type_}\")].{field}}}");
    dev.kubectl(&["get", object, "-o", &path]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

/// Every form in which a secret could leak: whole, and each of its lines.
fn forms(secrets: &[&str]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for s in secrets {
        out.insert(s.to_string());
        for line in s.lines() {
            out.insert(line.to_string());
        }
        if let Ok(json) = serde_json::to_string(s) {
            out.insert(json.trim_matches('"').to_string());
        }
    }
    out.into_iter().collect()
}

fn assert_absent(what: &str, text: &str, secrets: &[String]) {
    for s in secrets {
        assert!(!text.contains(s.as_str()), "a secret value appears in {what}");
    }
}

/// Samples `ps -eo args` in the cluster's machines until stopped.
fn sample_argv(stop: Arc<AtomicBool>, samples: Arc<Mutex<Vec<String>>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for machine in MACHINES {
                if let Ok(container) = server_container(NS, machine)
                    && let Ok(out) = docker(&["exec", &container, "ps", "-eo", "args"])
                {
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    if let Ok(mut s) = samples.lock() {
                        s.push(text);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

#[test]
fn passwords_from_secrets_log_in_rotate_and_never_leak() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let tmp = tempfile::tempdir()?;
    let mut dev = Dev::start(&[])?;
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = sample_argv(stop.clone(), samples.clone());

    // 1. The Cluster before its Secrets: the TaskServ waits, naming the Secret and the key.
    apply(&dev, tmp.path(), "cluster.json", &cluster())?;
    dev.wait_until(Duration::from_secs(300), "postgresql waiting for Secret db-creds", |d| {
        let msg = condition(d, "taskserv/vault-postgresql", "Stalled", "message");
        Ok(msg.contains("Secret default/db-creds") && msg.contains("\"password\""))
    })?;
    assert_eq!(condition(&dev, "taskserv/vault-postgresql", "Stalled", "reason"), "ConfigFromMissing");

    // 2. The Secrets appear: everything goes on.
    apply(&dev, tmp.path(), "db-creds.json", &secret("db-creds", "password", PG_PASSWORD_1))?;
    let redis_values = format!("password: {REDIS_PASSWORD_1}\n");
    apply(&dev, tmp.path(), "cache-creds.json", &secret("cache-creds", "values.yaml", &redis_values))?;
    // At once: the Secret watch, not the 300 s requeue of a Stalled object.
    let appeared = std::time::Instant::now();
    dev.wait_until(Duration::from_secs(60), "postgresql no longer Stalled once its Secret exists", |d| {
        Ok(condition(d, "taskserv/vault-postgresql", "Stalled", "status") == "False")
    })?;
    eprintln!("measured: Stalled cleared {:?} after the Secret appeared", appeared.elapsed());
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/vault", "--timeout=900s"])?;

    let db = server_container(NS, "vault-db-0")?;
    let cache = server_container(NS, "vault-cache-0")?;
    assert!(psql_login(&db, PG_PASSWORD_1)?, "psql does not log in with the hostile password");
    assert!(!psql_login(&db, "wrong")?, "psql logs in with a wrong password");
    assert!(redis_login(&cache, REDIS_PASSWORD_1)?, "redis-cli does not log in with the password");
    let noauth = docker_ok(&["exec", &cache, "redis-cli", "-h", "127.0.0.1", "PING"])?;
    assert!(noauth.contains("NOAUTH"), "redis answers without a password: {noauth}");
    let pwned = docker(&["exec", &db, "test", "-e", "/tmp/pwned"])?;
    assert!(!pwned.status.success(), "the password's $(...) was executed");
    let hash_1 = dev.kubectl_ok(&["get", "ts", "vault-postgresql", "-o", "jsonpath={.status.configInputsHash}"])?;
    assert!(hash_1.starts_with("sha256:"), "{hash_1:?}");

    // 3. Rotation: new values in the Secrets re-run the installs; clients log in with them.
    apply(&dev, tmp.path(), "db-creds.json", &secret("db-creds", "password", PG_PASSWORD_2))?;
    let redis_values = format!("password: {REDIS_PASSWORD_2}\n");
    apply(&dev, tmp.path(), "cache-creds.json", &secret("cache-creds", "values.yaml", &redis_values))?;
    let rotated = std::time::Instant::now();
    dev.wait_until(Duration::from_secs(600), "postgres accepting the rotated password", |_| psql_login(&db, PG_PASSWORD_2))?;
    dev.wait_until(Duration::from_secs(600), "redis accepting the rotated password", |_| redis_login(&cache, REDIS_PASSWORD_2))?;
    eprintln!("measured: rotated passwords accepted {:?} after the Secrets changed", rotated.elapsed());
    assert!(!psql_login(&db, PG_PASSWORD_1)?, "the old postgres password still works");
    assert!(!redis_login(&cache, REDIS_PASSWORD_1)?, "the old redis password still works");
    let hash_2 = dev.kubectl_ok(&["get", "ts", "vault-postgresql", "-o", "jsonpath={.status.configInputsHash}"])?;
    assert!(hash_2.starts_with("sha256:") && hash_2 != hash_1, "{hash_1} -> {hash_2}");
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/vault", "--timeout=600s"])?;

    // 4. A secret field breaking its schema is refused, not echoed (redis takes any characters
    // in its password, escaped in redis.conf: the violation is the type — a list where a
    // string belongs — merged from the Secret's YAML).
    let bad_yaml = serde_json::to_string(&json!({"password": [BAD_VALUE]}))?;
    apply(&dev, tmp.path(), "bad-creds.json", &secret("bad-creds", "values.yaml", &bad_yaml))?;
    let bad = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "bad-redis", "namespace": NS},
        "spec": {"service": "redis", "configFrom": [{"kind": "Secret", "name": "bad-creds", "key": "values.yaml"}]}});
    apply(&dev, tmp.path(), "bad.json", &bad)?;
    dev.wait_until(Duration::from_secs(120), "bad-redis refused", |d| {
        Ok(condition(d, "taskserv/bad-redis", "Stalled", "reason") == "InvalidConfig")
    })?;
    let msg = condition(&dev, "taskserv/bad-redis", "Stalled", "message");
    assert!(msg.contains("/password"), "{msg}");

    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();

    // 5. No secret anywhere: controller log, statuses, events, argv inside the machines.
    let secrets = forms(&[PG_PASSWORD_1, PG_PASSWORD_2, REDIS_PASSWORD_1, REDIS_PASSWORD_2, BAD_VALUE]);
    assert_absent("the controller's log", &dev.log(), &secrets);
    // The audit log holds the script runs (a failed one carries its redacted message).
    let audit = provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &dev.data_dir.display().to_string(), "-o", "json"])?;
    assert!(
        audit.contains(r#""type":"scriptRun""#) && audit.contains(r#""service":"redis""#),
        "no redis script run in the audit log:\n{audit}"
    );
    assert_absent("the audit log", &audit, &secrets);
    let objects = dev.kubectl_ok(&["get", "clusters,servers,taskservs,workspaces", "-A", "-o", "json"])?;
    assert_absent("the provisioning objects", &objects, &secrets);
    let mut events_seen = false;
    for kind in ["events", "events.events.k8s.io"] {
        if let Ok(out) = dev.kubectl(&["get", kind, "-A", "-o", "json"])
            && out.status.success()
        {
            events_seen = true;
            assert_absent("events", &String::from_utf8_lossy(&out.stdout), &secrets);
        }
    }
    assert!(events_seen, "no events could be listed");
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    if samples.len() < 10 {
        bail!("only {} argv samples were taken inside the machines", samples.len());
    }
    assert_absent("the argv of processes inside the machines", &samples.join("\n"), &secrets);
    eprintln!("measured: {} argv samples inside the machines, none with a secret", samples.len());

    dev.kubectl_ok(&["delete", "taskserv", "bad-redis", "--timeout=120s"])?;
    dev.kubectl_ok(&["delete", "cluster", CLUSTER, "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(180), "nothing left", |_| Ok(leftovers(NS, CLUSTER)?.is_empty()))?;
    dev.stop();
    Ok(())
}
