//! The runnable catalog services for real, in local node containers (Debian bookworm, no
//! systemd): install → check → remove through `run_script`, with `docker exec` as the
//! executor — the shape of the controller's adapter over the local provider's exec.
//!
//! Needs Docker and the node image `provisioning-node:latest` (`provisioning image build`,
//! which scripts/test.sh runs first), and nu (scripts/setup.sh). It fails, never skips.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{crate_dir, nu};
use provisioning_taskservs::{
    AddressInfo, Catalog, ClusterInfo, ExecOutput, LocalProcessExecutor, PeerInfo, RunError, ScriptContext, ScriptExecutor, ScriptOutcome,
    ScriptPaths, ScriptStep, ServerInfo, TaskServInfo, WorkspaceInfo, run_script,
};
use serde_json::{Value, json};

const IMAGE: &str = "provisioning-node:latest";
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

fn docker() -> String {
    std::env::var("PROVISIONING_DOCKER").ok().filter(|d| !d.is_empty()).unwrap_or_else(|| "docker".into())
}

fn docker_out(args: &[&str]) -> Result<String, String> {
    let out = Command::new(docker()).args(args).output().map_err(|e| format!("docker {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("docker {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Containers and a network for one test, removed on drop (by the names this test chose).
struct Lab {
    network: String,
    containers: Vec<String>,
}

static LABS: AtomicUsize = AtomicUsize::new(0);

impl Lab {
    fn new(tag: &str) -> Lab {
        docker_out(&["info", "--format", "{{.ServerVersion}}"]).expect("Docker must run: run scripts/setup.sh");
        docker_out(&["image", "inspect", "--format", "{{.Id}}", IMAGE])
            .unwrap_or_else(|e| panic!("node image {IMAGE} missing (run `provisioning image build`): {e}"));
        let network = format!("tstest-{}-{}-{tag}", std::process::id(), LABS.fetch_add(1, Ordering::SeqCst));
        docker_out(&["network", "create", "--label", "provisioning.dev/test=taskservs", &network]).expect("network");
        Lab { network, containers: Vec::new() }
    }

    /// Starts a node container; returns (name, IP).
    fn node(&mut self, name: &str) -> (String, String) {
        let container = format!("{}-{name}", self.network);
        let nu_mount = format!("{}:{}:ro", nu().display(), ScriptPaths::CONTAINER_NU);
        let catalog_mount = format!("{}:{}:ro", crate_dir().join("catalog").display(), ScriptPaths::CONTAINER_CATALOG);
        docker_out(&[
            "run",
            "-d",
            "--init",
            "--name",
            &container,
            "--hostname",
            name,
            "--network",
            &self.network,
            "--label",
            "provisioning.dev/test=taskservs",
            "-v",
            &nu_mount,
            "-v",
            &catalog_mount,
            IMAGE,
            "sleep",
            "infinity",
        ])
        .expect("container starts");
        self.containers.push(container.clone());
        let ip = docker_out(&["inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", &container]).expect("inspect");
        (container, ip)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = docker_out(&["rm", "-f", c]);
        }
        let _ = docker_out(&["network", "rm", &self.network]);
    }
}

/// `docker exec -i <container> <argv>` through a local process.
struct DockerExec {
    container: String,
    local: LocalProcessExecutor,
}

impl DockerExec {
    fn new(container: &str) -> Self {
        DockerExec { container: container.into(), local: LocalProcessExecutor::new("unused", "unused") }
    }
}

#[async_trait::async_trait]
impl ScriptExecutor for DockerExec {
    async fn exec(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
        timeout: Duration,
        output: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<ExecOutput, RunError> {
        let mut full = vec![docker(), "exec".into(), "-i".into(), self.container.clone()];
        full.extend(argv);
        self.local.exec(full, stdin, timeout, output).await
    }
    // script_paths(): the default, the container layout.
}

fn node_info(name: &str, ip: &str) -> PeerInfo {
    PeerInfo { name: name.into(), addresses: vec![AddressInfo { kind: "InternalIP".into(), address: ip.into() }], pool: String::new() }
}

fn context(catalog: &Catalog, service: &str, me: &PeerInfo, peers: Vec<PeerInfo>, config: Value) -> ScriptContext {
    let resolved = catalog.validate_request(service, None, &config).expect("valid request");
    ScriptContext {
        server: ServerInfo {
            name: me.name.clone(),
            namespace: "test".into(),
            addresses: me.addresses.clone(),
            hostname: me.name.clone(),
            pool: me.pool.clone(),
        },
        peers,
        cluster: ClusterInfo { name: "lab".into(), servers: vec![] },
        workspace: WorkspaceInfo { name: "test".into(), environment: "test".into(), config: json!({}) },
        taskserv: TaskServInfo { name: service.into(), service: service.into(), version: resolved.version, previous_version: None },
        config: resolved.config,
        templates: Default::default(),
    }
    .with_templates(catalog)
    .expect("templates render")
}

async fn step(container: &str, step: ScriptStep, ctx: &ScriptContext) -> ScriptOutcome {
    run_script(&DockerExec::new(container), step, &ctx.taskserv.service, ctx, STEP_TIMEOUT, None).await.expect("script runs")
}

fn assert_ok(outcome: &ScriptOutcome) {
    assert!(outcome.succeeded(), "{}:\n{}", outcome.summary(), outcome.output_tail);
}

fn exec_in(container: &str, args: &[&str]) -> String {
    let mut all = vec!["exec", container];
    all.extend_from_slice(args);
    docker_out(&all).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_three_member_cluster_lifecycle() {
    let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog");
    let mut lab = Lab::new("etcd");
    let nodes: Vec<(String, PeerInfo)> = (0..3)
        .map(|i| {
            let name = format!("etcd-{i}");
            let (container, ip) = lab.node(&name);
            (container, node_info(&name, &ip))
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
        assert_ok(outcome);
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
        assert_ok(&healthy);
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
    assert_ok(&again);
    assert!(again.output_tail.contains("configuration unchanged"), "{}", again.output_tail);

    // A member lost with its data (container gone) comes back on a new machine with a new
    // address: its install replaces the stale member entry and it catches up.
    let lost = nodes[1].0.clone();
    docker_out(&["rm", "-f", &lost]).expect("rm member");
    let (container, ip) = lab.node("etcd-1-rebuilt");
    let mut nodes = nodes;
    nodes[1] = (container, node_info("etcd-1", &ip));
    let contexts: Vec<ScriptContext> = (0..3)
        .map(|i| {
            let peers = nodes.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, (_, p))| p.clone()).collect();
            context(&catalog, "etcd", &nodes[i].1, peers, etcd_config.clone())
        })
        .collect();
    let rejoin = step(&nodes[1].0, ScriptStep::Install, &contexts[1]).await;
    assert_ok(&rejoin);
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
        assert_ok(&healthy);
    }
    let got = exec_in(&nodes[1].0, &etcdctl_tls(&["get", "--print-value-only", "greeting"]));
    assert_eq!(got, "hello from etcd-0");

    // Removing a member makes it leave the cluster; the other two stay healthy.
    let removed = step(&nodes[2].0, ScriptStep::Remove, &contexts[2]).await;
    assert_ok(&removed);
    let members = exec_in(&nodes[0].0, &etcdctl_tls(&["member", "list"]));
    assert_eq!(members.lines().count(), 2, "{members}\nremove output:\n{}", removed.output_tail);
    assert!(!members.contains("etcd-2"), "{members}");
    let two: Vec<PeerInfo> = vec![nodes[1].1.clone()];
    let ctx0 = context(&catalog, "etcd", &nodes[0].1, two, etcd_config.clone());
    assert_ok(&step(&nodes[0].0, ScriptStep::Check, &ctx0).await);
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
    let (redis_c, redis_ip) = lab.node("redis-0");
    let (pg_c, pg_ip) = lab.node("pg-0");
    let (lb_c, lb_ip) = lab.node("lb-0");
    let (ctr_c, ctr_ip) = lab.node("ctr-0");

    let hostile = "p$(reboot); rm -rf / '\"`x`\nline2";
    let redis = context(&catalog, "redis", &node_info("redis-0", &redis_ip), vec![], json!({"maxmemory": "64mb", "password": hostile}));
    let pg = context(
        &catalog,
        "postgresql",
        &node_info("pg-0", &pg_ip),
        vec![],
        json!({"user": "app", "password": hostile, "database": "appdb"}),
    );
    let lb = context(
        &catalog,
        "haproxy",
        &node_info("lb-0", &lb_ip),
        vec![],
        json!({"mode": "tcp", "backendPort": 6379, "backends": [{"name": "redis-0", "address": redis_ip}]}),
    );
    let ctr = context(&catalog, "containerd", &node_info("ctr-0", &ctr_ip), vec![], json!({}));

    let installs = futures_join(
        [(redis_c.clone(), redis.clone()), (pg_c.clone(), pg.clone()), (ctr_c.clone(), ctr.clone())]
            .into_iter()
            .map(|(c, ctx)| async move { step(&c, ScriptStep::Install, &ctx).await }),
    )
    .await;
    for outcome in &installs {
        assert_ok(outcome);
    }
    assert_eq!(installs[0].reported_version(), Some("7.0.15"));
    assert_eq!(installs[1].reported_version(), Some("15"));
    assert_eq!(installs[2].reported_version(), Some("1.6.20"));
    let lb_install = step(&lb_c, ScriptStep::Install, &lb).await;
    assert_ok(&lb_install);
    assert_eq!(lb_install.reported_version(), Some("2.6"));

    for (c, ctx) in [(&redis_c, &redis), (&pg_c, &pg), (&lb_c, &lb), (&ctr_c, &ctr)] {
        assert_ok(&step(c, ScriptStep::Check, ctx).await);
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
    assert_ok(&step(&redis_c, ScriptStep::Install, &redis).await);
    assert_ok(&step(&redis_c, ScriptStep::Check, &redis).await);

    for (c, ctx) in [(&lb_c, &lb), (&redis_c, &redis), (&pg_c, &pg), (&ctr_c, &ctr)] {
        assert_ok(&step(c, ScriptStep::Remove, ctx).await);
        assert!(!step(c, ScriptStep::Check, ctx).await.succeeded(), "{} healthy after remove", ctx.taskserv.service);
        // Remove is idempotent.
        assert_ok(&step(c, ScriptStep::Remove, ctx).await);
    }
}
