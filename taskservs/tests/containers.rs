//! The runnable catalog services for real, in local node containers (Debian bookworm, no
//! systemd): install → check → remove through `run_script`, with `docker exec` as the
//! executor — the shape of the controller's adapter over the local provider's exec.
//!
//! Needs Docker and the node image `provisioning-node:latest` (`provisioning image build`,
//! which scripts/test.sh runs first), and nu (scripts/setup.sh). It fails, never skips.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;
#[path = "common/lab.rs"]
mod lab;

use std::process::Command;
use std::time::Duration;

use lab::{Lab, assert_ok, docker, docker_out, exec_in, node_info, step};
use provisioning_taskservs::{Catalog, PeerInfo, ScriptContext, ScriptStep};
use serde_json::{Value, json};

/// The context of `service` on `me` with `peers` (no Cluster servers, default version).
fn context(catalog: &Catalog, service: &str, me: &PeerInfo, peers: Vec<PeerInfo>, config: Value) -> ScriptContext {
    lab::context(catalog, service, None, me, &peers, &[], config)
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_three_member_cluster_lifecycle() {
    let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog");
    let mut lab = Lab::new("etcd");
    let nodes: Vec<(String, PeerInfo)> = (0..3)
        .map(|i| {
            let name = format!("etcd-{i}");
            let (container, ip) = lab.node(&name, &[]);
            (container, node_info(&name, &ip, ""))
        })
        .collect();
    // The cluster CA key the controller would generate (x-provisioning-generate: ec-p256-pem).
    let ca_key = ca_key(&nodes[0].0);
    let etcd_config = json!({"caKey": ca_key});
    let ctx_of = |i: usize| {
        let peers = nodes.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, (_, p))| p.clone()).collect();
        context(&catalog, "etcd", &nodes[i].1, peers, etcd_config.clone())
    };
    let contexts: Vec<ScriptContext> = (0..3).map(ctx_of).collect();

    // All members install at once, as a rollout with parallelLimit >= 3 would.
    let installs = futures_join((0..3).map(|i| {
        let container = nodes[i].0.clone();
        let ctx = contexts[i].clone();
        async move { step(&container, ScriptStep::Install, &ctx).await }
    }))
    .await;
    for outcome in &installs {
        assert_ok("containers", outcome);
        assert_eq!(outcome.reported_version(), Some("3.4.23"));
    }
    for (i, (container, _)) in nodes.iter().enumerate() {
        let mut healthy = step(container, ScriptStep::Check, &contexts[i]).await;
        for _ in 0..20 {
            if healthy.succeeded() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            healthy = step(container, ScriptStep::Check, &contexts[i]).await;
        }
        assert_ok("containers", &healthy);
    }
    // Written through one member, read from another.
    exec_in(&nodes[0].0, &etcdctl_tls(&["put", "greeting", "hello from etcd-0"]));
    let got = exec_in(&nodes[2].0, &etcdctl_tls(&["get", "--print-value-only", "greeting"]));
    assert_eq!(got, "hello from etcd-0");

    // TLS only, with client certificates: plain http gets nothing, TLS without a client
    // certificate is refused, and members listen on their private address, not 0.0.0.0.
    let ip1 = nodes[1].1.addresses[0].address.clone();
    let plain = Command::new(docker())
        .args(["exec", &nodes[0].0, "curl", "-sS", "--max-time", "5", &format!("http://{ip1}:2379/version")])
        .output()
        .expect("curl");
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("etcdserver"), "plain http answered");
    let no_cert = Command::new(docker())
        .args([
            "exec",
            &nodes[0].0,
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--cacert",
            "/etc/etcd/pki/ca.crt",
            &format!("https://{ip1}:2379/version"),
        ])
        .output()
        .expect("curl");
    assert!(!no_cert.status.success(), "TLS without a client certificate was accepted: {}", String::from_utf8_lossy(&no_cert.stdout));
    let with_cert = exec_in(
        &nodes[0].0,
        &[
            "curl",
            "-fsS",
            "--max-time",
            "5",
            "--cacert",
            "/etc/etcd/pki/ca.crt",
            "--cert",
            "/etc/etcd/pki/member.crt",
            "--key",
            "/etc/etcd/pki/member.key",
            &format!("https://{ip1}:2379/version"),
        ],
    );
    assert!(with_cert.contains("etcdserver"), "{with_cert}");
    let listeners = exec_in(&nodes[1].0, &["cat", "/proc/net/tcp"]);
    assert!(
        !listeners.lines().any(|l| l.split_whitespace().nth(1).is_some_and(|a| a == "00000000:094B" || a == "00000000:094C")),
        "etcd listens on 0.0.0.0:\n{listeners}"
    );

    // Re-running install is a no-op.
    let again = step(&nodes[1].0, ScriptStep::Install, &contexts[1]).await;
    assert_ok("containers", &again);
    assert!(again.output_tail.contains("configuration unchanged"), "{}", again.output_tail);

    // A member lost with its data (container gone) comes back on a new machine with a new
    // address: its install replaces the stale member entry and it catches up.
    let lost = nodes[1].0.clone();
    docker_out(&["rm", "-f", &lost]).expect("rm member");
    let (container, ip) = lab.node("etcd-1-rebuilt", &[]);
    let mut nodes = nodes;
    nodes[1] = (container, node_info("etcd-1", &ip, ""));
    let contexts: Vec<ScriptContext> = (0..3)
        .map(|i| {
            let peers = nodes.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, (_, p))| p.clone()).collect();
            context(&catalog, "etcd", &nodes[i].1, peers, etcd_config.clone())
        })
        .collect();
    let rejoin = step(&nodes[1].0, ScriptStep::Install, &contexts[1]).await;
    assert_ok("containers", &rejoin);
    assert!(rejoin.output_tail.contains("removing stale member entry etcd-1"), "{}", rejoin.output_tail);
    for (i, (container, _)) in nodes.iter().enumerate() {
        let mut healthy = step(container, ScriptStep::Check, &contexts[i]).await;
        for _ in 0..20 {
            if healthy.succeeded() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            healthy = step(container, ScriptStep::Check, &contexts[i]).await;
        }
        assert_ok("containers", &healthy);
    }
    let got = exec_in(&nodes[1].0, &etcdctl_tls(&["get", "--print-value-only", "greeting"]));
    assert_eq!(got, "hello from etcd-0");

    // Removing a member makes it leave the cluster; the other two stay healthy.
    let removed = step(&nodes[2].0, ScriptStep::Remove, &contexts[2]).await;
    assert_ok("containers", &removed);
    let members = exec_in(&nodes[0].0, &etcdctl_tls(&["member", "list"]));
    assert_eq!(members.lines().count(), 2, "{members}\nremove output:\n{}", removed.output_tail);
    assert!(!members.contains("etcd-2"), "{members}");
    let two: Vec<PeerInfo> = vec![nodes[1].1.clone()];
    let ctx0 = context(&catalog, "etcd", &nodes[0].1, two, etcd_config.clone());
    assert_ok("containers", &step(&nodes[0].0, ScriptStep::Check, &ctx0).await);
}

/// etcdctl (API v3) on a member, over TLS with the member's certificate.
fn etcdctl_tls<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "env",
        "ETCDCTL_API=3",
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/etcd/pki/ca.crt",
        "--cert=/etc/etcd/pki/member.crt",
        "--key=/etc/etcd/pki/member.key",
    ];
    all.extend_from_slice(args);
    all
}

/// A fresh P-256 private key (PKCS#8 PEM), made by openssl in `container`.
fn ca_key(container: &str) -> String {
    exec_in(container, &["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]) + "\n"
}

/// Runs futures concurrently and returns their outputs in order.
async fn futures_join<F: std::future::Future<Output = T> + Send + 'static, T: Send + 'static>(futures: impl Iterator<Item = F>) -> Vec<T> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_postgresql_haproxy_containerd_lifecycles() {
    let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog");
    let mut lab = Lab::new("svc");
    let (redis_c, redis_ip) = lab.node("redis-0", &[]);
    let (pg_c, pg_ip) = lab.node("pg-0", &[]);
    let (lb_c, lb_ip) = lab.node("lb-0", &[]);
    let (ctr_c, ctr_ip) = lab.node("ctr-0", &[]);

    let hostile = "p$(reboot); rm -rf / '\"`x`\nline2";
    let redis = context(&catalog, "redis", &node_info("redis-0", &redis_ip, ""), vec![], json!({"maxmemory": "64mb", "password": hostile}));
    let pg = context(
        &catalog,
        "postgresql",
        &node_info("pg-0", &pg_ip, ""),
        vec![],
        json!({"user": "app", "password": hostile, "database": "appdb"}),
    );
    let lb = context(
        &catalog,
        "haproxy",
        &node_info("lb-0", &lb_ip, ""),
        vec![],
        json!({"mode": "tcp", "backendPort": 6379, "backends": [{"name": "redis-0", "address": redis_ip}]}),
    );
    let ctr = context(&catalog, "containerd", &node_info("ctr-0", &ctr_ip, ""), vec![], json!({}));

    let installs = futures_join(
        [(redis_c.clone(), redis.clone()), (pg_c.clone(), pg.clone()), (ctr_c.clone(), ctr.clone())]
            .into_iter()
            .map(|(c, ctx)| async move { step(&c, ScriptStep::Install, &ctx).await }),
    )
    .await;
    for outcome in &installs {
        assert_ok("containers", outcome);
    }
    assert_eq!(installs[0].reported_version(), Some("7.0.15"));
    assert_eq!(installs[1].reported_version(), Some("15"));
    assert_eq!(installs[2].reported_version(), Some("1.6.20"));
    let lb_install = step(&lb_c, ScriptStep::Install, &lb).await;
    assert_ok("containers", &lb_install);
    assert_eq!(lb_install.reported_version(), Some("2.6"));

    for (c, ctx) in [(&redis_c, &redis), (&pg_c, &pg), (&lb_c, &lb), (&ctr_c, &ctr)] {
        assert_ok("containers", &step(c, ScriptStep::Check, ctx).await);
    }
    // Through haproxy to redis, with the (hostile) password; without it redis refuses.
    let redis_cli = |host: &str, port: &str, auth: Option<&str>| {
        let mut args = vec!["exec".to_string()];
        if let Some(auth) = auth {
            args.extend(["-e".to_string(), format!("REDISCLI_AUTH={auth}")]);
        }
        args.extend([redis_c.clone(), "redis-cli".into(), "-h".into(), host.into(), "-p".into(), port.into(), "ping".into()]);
        let out = Command::new(docker()).args(&args).output().expect("redis-cli");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    assert_eq!(redis_cli(&lb_ip, "80", Some(hostile)).trim(), "PONG");
    let unauthenticated = redis_cli(&redis_ip, "6379", None);
    assert!(unauthenticated.contains("NOAUTH"), "redis answered without a password: {unauthenticated}");
    assert!(redis_cli(&redis_ip, "6379", Some("wrong")).contains("WRONGPASS"), "a wrong password was accepted");
    assert_eq!(redis_cli(&redis_ip, "6379", Some(hostile)).trim(), "PONG");
    // It binds the private address and loopback only, with protected-mode on.
    let conf = exec_in(&redis_c, &["grep", "-E", "^(bind|protected-mode) ", "/etc/redis/redis.conf"]);
    assert_eq!(conf, format!("bind {redis_ip} 127.0.0.1\nprotected-mode yes"));
    let listeners = exec_in(&redis_c, &["cat", "/proc/net/tcp"]);
    assert!(!listeners.lines().any(|l| l.split_whitespace().nth(1) == Some("00000000:18EB")), "redis listens on 0.0.0.0:\n{listeners}");
    // haproxy's stats page answers on the balancer's loopback, not on its address.
    let stats_local = exec_in(&lb_c, &["curl", "-fsS", "--max-time", "5", "http://127.0.0.1:8404/stats;csv"]);
    assert!(stats_local.contains("servers"), "{stats_local}");
    let stats_remote = Command::new(docker())
        .args(["exec", &redis_c, "curl", "-fsS", "--max-time", "5", &format!("http://{lb_ip}:8404/stats;csv")])
        .output()
        .expect("curl");
    assert!(!stats_remote.status.success(), "stats reachable on {lb_ip}: {}", String::from_utf8_lossy(&stats_remote.stdout));
    // The hostile password arrived literally: it logs in over TCP, a wrong one does not.
    let login = Command::new(docker())
        .args([
            "exec",
            "-e",
            &format!("PGPASSWORD={hostile}"),
            &pg_c,
            "psql",
            "-h",
            &pg_ip,
            "-U",
            "app",
            "-d",
            "appdb",
            "-Atc",
            "select current_user",
        ])
        .output()
        .expect("psql");
    assert_eq!(String::from_utf8_lossy(&login.stdout).trim(), "app", "{}", String::from_utf8_lossy(&login.stderr));

    // A killed daemon is unhealthy; install brings it back.
    exec_in(&redis_c, &["sh", "-c", "kill $(cat /run/provisioning/redis.pid)"]);
    let mut check = step(&redis_c, ScriptStep::Check, &redis).await;
    for _ in 0..20 {
        if !check.succeeded() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        check = step(&redis_c, ScriptStep::Check, &redis).await;
    }
    assert!(!check.succeeded(), "check passed with redis killed");
    assert_ok("containers", &step(&redis_c, ScriptStep::Install, &redis).await);
    assert_ok("containers", &step(&redis_c, ScriptStep::Check, &redis).await);

    for (c, ctx) in [(&lb_c, &lb), (&redis_c, &redis), (&pg_c, &pg), (&ctr_c, &ctr)] {
        assert_ok("containers", &step(c, ScriptStep::Remove, ctx).await);
        assert!(!step(c, ScriptStep::Check, ctx).await.succeeded(), "{} healthy after remove", ctx.taskserv.service);
        // Remove is idempotent.
        assert_ok("containers", &step(c, ScriptStep::Remove, ctx).await);
    }
}
