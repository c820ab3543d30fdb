//! The catalog services added for issue 16, for real in local node containers (Debian
//! bookworm, no systemd, unprivileged unless said): for every service install → check →
//! a rendered config file edited → check reports config drift (exit 3, `configDrift: true`
//! naming the file) → install again → check clean → remove → check fails → remove again.
//! Between install and remove, the services' dependencies are exercised: nginx fronts the
//! registry by pool name, prometheus scrapes the node-exporters of the Cluster and knows
//! the alertmanager, two keepalived servers elect one MASTER.
//!
//! Needs Docker, the node image `provisioning-node:latest` and nu; it fails, never skips.
//! The three groups run as separate tests (in parallel); within a group, the servers of
//! one container install one after the other (one dpkg lock per machine).
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;
#[path = "common/lab.rs"]
mod lab;

use std::time::{Duration, Instant};

use lab::{
    Lab, assert_ok, check_until_ok, context, drift_roundtrip, exec_in, exec_status, install_and_check, node_info, remove_twice, step,
};
use provisioning_taskservs::{Catalog, PeerInfo, ScriptStep};
use serde_json::{Value, json};

fn catalog() -> Catalog {
    Catalog::load(&Catalog::default_dir()).expect("the shipped catalog loads")
}

/// GET `url` with curl inside `container`, the credentials (if any) in a curl config on
/// stdin rather than argv; returns (HTTP status, body).
fn http_get(container: &str, url: &str, user_password: Option<&str>) -> (u16, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(lab::docker())
        .args(["exec", "-i", container, "curl", "-s", "--max-time", "5", "-w", "\n%{http_code}", "-K", "-", url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("docker exec curl");
    let config = user_password.map(|up| format!("user = \"{up}\"\n")).unwrap_or_default();
    child.stdin.take().expect("stdin").write_all(config.as_bytes()).expect("write curl config");
    let out = child.wait_with_output().expect("curl output");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

fn http_status(container: &str, url: &str, user_password: Option<&str>) -> u16 {
    http_get(container, url, user_password).0
}

/// Asserts nothing in `container` listens on the wildcard address at `port`.
fn assert_no_wildcard_listener(container: &str, port: u16) {
    let tcp = exec_in(container, &["cat", "/proc/net/tcp", "/proc/net/tcp6"]);
    let v4 = format!("00000000:{port:04X}");
    let v6 = format!("{}:{port:04X}", "0".repeat(32));
    assert!(
        !tcp.lines().any(|l| l.split_whitespace().nth(1).is_some_and(|a| a == v4 || a == v6)),
        "{container} listens on the wildcard address, port {port}:\n{tcp}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn web_group_registry_webhook_nginx() {
    let catalog = catalog();
    let mut lab = Lab::new("web");
    let (reg_c, reg_ip) = lab.node("reg-0", &[]);
    let (lb_c, lb_ip) = lab.node("lb-0", &[]);
    let reg = node_info("reg-0", &reg_ip, "registry");
    let lb = node_info("lb-0", &lb_ip, "edge");
    let cluster = vec![lb.clone(), reg.clone()];

    let registry = context(&catalog, "docker-registry", None, &reg, &[], &cluster, json!({"password": "registry-pass-1"}));
    let secret = "0123456789abcdef-hook-secret";
    let webhook = context(
        &catalog,
        "webhook",
        None,
        &reg,
        &[],
        &cluster,
        json!({"secret": secret, "hooks": [{"id": "deploy", "command": "/bin/echo", "includeCommandOutput": true}]}),
    );
    // nginx fronts the registry by the pool's name (the Cluster's servers of pool "registry").
    let nginx = context(&catalog, "nginx", None, &lb, &[], &cluster, json!({"upstreamPool": "registry", "upstreamPort": 5000}));

    // The two machines install in parallel; each installs its services one after the other.
    let (reg_times, lb_time) = tokio::join!(
        async {
            let a = install_and_check(&reg_c, &registry).await;
            let b = install_and_check(&reg_c, &webhook).await;
            (a, b)
        },
        install_and_check(&lb_c, &nginx)
    );
    eprintln!("web group installs: docker-registry {:?}, webhook {:?}, nginx {lb_time:?}", reg_times.0, reg_times.1);

    // Auth is on: the registry answers 401 without credentials, 200 with them — directly
    // and through nginx (which proxies the Authorization header).
    let direct = format!("http://{reg_ip}:5000/v2/");
    assert_eq!(http_status(&lb_c, &direct, None), 401);
    assert_eq!(http_status(&lb_c, &direct, Some("registry:registry-pass-1")), 200);
    assert_eq!(http_status(&lb_c, &direct, Some("registry:wrong")), 401);
    let fronted = format!("http://{lb_ip}:80/v2/");
    assert_eq!(http_status(&reg_c, &fronted, Some("registry:registry-pass-1")), 200, "nginx does not front the registry");
    assert_eq!(http_status(&reg_c, &fronted, None), 401);
    // The registry keeps only a bcrypt hash of the password.
    let htpasswd = exec_in(&reg_c, &["cat", "/etc/docker/registry/htpasswd"]);
    assert!(htpasswd.starts_with("registry:$2y$") && !htpasswd.contains("registry-pass-1"), "{htpasswd}");
    // The webhook runs a hook only with the secret.
    let hook = format!("http://{reg_ip}:9000/hooks/deploy");
    let post = |headers: &[&str]| {
        let mut args = vec!["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"];
        args.extend_from_slice(headers);
        args.push(&hook);
        exec_status(&lb_c, &args).1
    };
    let secret_header = format!("X-Webhook-Secret: {secret}");
    assert_eq!(post(&["-H", &secret_header]), "200", "hook with the secret");
    assert_eq!(post(&[]), "403", "hook without the secret");
    assert_eq!(post(&["-H", "X-Webhook-Secret: wrong"]), "403", "hook with a wrong secret");
    // Private binds only: nothing of these listens on the wildcard address.
    assert_no_wildcard_listener(&reg_c, 5000);
    assert_no_wildcard_listener(&reg_c, 9000);
    assert_no_wildcard_listener(&lb_c, 80);

    tokio::join!(
        async {
            drift_roundtrip(&reg_c, &registry).await;
            drift_roundtrip(&reg_c, &webhook).await;
        },
        drift_roundtrip(&lb_c, &nginx)
    );
    tokio::join!(
        async {
            remove_twice(&reg_c, &webhook).await;
            remove_twice(&reg_c, &registry).await;
        },
        remove_twice(&lb_c, &nginx)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn observability_group_prometheus_node_exporter_alertmanager_keepalived() {
    let catalog = catalog();
    let mut lab = Lab::new("obs");
    let (c0, ip0) = lab.node("obs-0", &[]);
    let (c1, ip1) = lab.node("obs-1", &[]);
    let n0 = node_info("obs-0", &ip0, "control");
    let n1 = node_info("obs-1", &ip1, "workers");
    let cluster = vec![n0.clone(), n1.clone()];

    let exporter =
        |me: &PeerInfo, peer: &PeerInfo| context(&catalog, "node-exporter", None, me, std::slice::from_ref(peer), &cluster, json!({}));
    let exp0 = exporter(&n0, &n1);
    let exp1 = exporter(&n1, &n0);
    let am_password = "alertmanager-pass-1";
    let alertmanager = context(&catalog, "alertmanager", None, &n0, &[], &cluster, json!({"webPassword": am_password}));
    // prometheus scrapes every server of the Cluster (nodeExporterPool empty) and sends to
    // the alertmanagers of pool "control", with their password.
    let prometheus = context(
        &catalog,
        "prometheus",
        None,
        &n0,
        &[],
        &cluster,
        json!({"webPassword": "prometheus-pass-1", "scrapeInterval": "2s", "alertmanagerPool": "control", "alertmanagerPassword": am_password}),
    );
    let vip = json!({"virtualAddress": "10.254.254.254/32", "authPassword": "vrrpsecret"});
    let keep0 = context(&catalog, "keepalived", None, &n0, std::slice::from_ref(&n1), &cluster, vip.clone());
    let keep1 = context(&catalog, "keepalived", None, &n1, std::slice::from_ref(&n0), &cluster, vip);

    let mut times = Vec::new();
    let (a, b) = tokio::join!(
        async {
            let mut t = Vec::new();
            for ctx in [&exp0, &alertmanager, &prometheus, &keep0] {
                t.push((ctx.taskserv.service.clone(), install_and_check(&c0, ctx).await));
            }
            t
        },
        async {
            let mut t = Vec::new();
            for ctx in [&exp1, &keep1] {
                t.push((ctx.taskserv.service.clone(), install_and_check(&c1, ctx).await));
            }
            t
        }
    );
    times.extend(a);
    times.extend(b);
    eprintln!("observability group installs: {times:?}");

    // prometheus scrapes both node-exporters: both targets up within the deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    let check = loop {
        let check = step(&c0, ScriptStep::Check, &prometheus).await;
        assert_ok("prometheus check", &check);
        let up = check.result.as_ref().and_then(|r| r.get("targetsUp")).and_then(Value::as_u64).unwrap_or(0);
        if up == 2 || Instant::now() > deadline {
            break check;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(check.result.as_ref().and_then(|r| r.get("targetsUp")), Some(&json!(2)), "{:?}", check.result);
    let (_, query) =
        http_get(&c0, &format!("http://{ip0}:9090/api/v1/query?query=up%7Bjob%3D%22node%22%7D"), Some("admin:prometheus-pass-1"));
    assert!(query.contains(&format!("{ip1}:9100")) && query.contains("\"server\":\"obs-1\""), "{query}");
    // ... and knows the alertmanager (authenticated).
    let (_, ams) = http_get(&c0, &format!("http://{ip0}:9090/api/v1/alertmanagers"), Some("admin:prometheus-pass-1"));
    for port in [9090, 9093, 9100] {
        assert_no_wildcard_listener(&c0, port);
    }
    assert!(ams.contains(&format!("http://{ip0}:9093/api/v2/alerts")), "{ams}");
    assert_eq!(http_status(&c1, &format!("http://{ip0}:9090/-/healthy"), None), 401);
    assert_eq!(http_status(&c1, &format!("http://{ip0}:9093/-/healthy"), None), 401);
    assert_eq!(http_status(&c1, &format!("http://{ip0}:9093/-/healthy"), Some(&format!("admin:{am_password}"))), 200);

    // A prometheus whose alertmanagerPassword is not the alertmanager's is unhealthy, naming it.
    let mismatched = context(
        &catalog,
        "prometheus",
        None,
        &n0,
        &[],
        &cluster,
        json!({"webPassword": "prometheus-pass-1", "scrapeInterval": "2s", "alertmanagerPool": "control", "alertmanagerPassword": "not-the-one"}),
    );
    let refused = step(&c0, ScriptStep::Check, &mismatched).await;
    assert_eq!(refused.exit_code, Some(2), "{}", refused.output_tail);
    assert!(refused.output_tail.contains(&format!("alertmanager {ip0}:9093 refuses")), "{}", refused.output_tail);

    // keepalived: the first server (priority 150) becomes MASTER, the other stays BACKUP;
    // without CAP_NET_ADMIN the address cannot be added, and the check says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (s0, s1) = loop {
        let k0 = step(&c0, ScriptStep::Check, &keep0).await;
        let k1 = step(&c1, ScriptStep::Check, &keep1).await;
        assert_ok("keepalived check obs-0", &k0);
        assert_ok("keepalived check obs-1", &k1);
        let states = (lab::result_str(&k0, "state").unwrap_or("").to_string(), lab::result_str(&k1, "state").unwrap_or("").to_string());
        if states.0 == "MASTER" || Instant::now() > deadline {
            assert_eq!(k0.result.as_ref().and_then(|r| r.get("vipAssigned")), Some(&json!(false)));
            assert!(lab::result_str(&k0, "limitation").is_some_and(|l| l.contains("CAP_NET_ADMIN")), "{:?}", k0.result);
            break states;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!((s0.as_str(), s1.as_str()), ("MASTER", "BACKUP"));

    tokio::join!(
        async {
            for ctx in [&exp0, &alertmanager, &prometheus, &keep0] {
                drift_roundtrip(&c0, ctx).await;
            }
        },
        async {
            for ctx in [&exp1, &keep1] {
                drift_roundtrip(&c1, ctx).await;
            }
        }
    );
    tokio::join!(
        async {
            for ctx in [&prometheus, &alertmanager, &exp0, &keep0] {
                remove_twice(&c0, ctx).await;
            }
        },
        async {
            for ctx in [&exp1, &keep1] {
                remove_twice(&c1, ctx).await;
            }
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn container_engines_group_docker_crun_podman_buildah() {
    let catalog = catalog();
    let mut lab = Lab::new("eng");
    // As the local provider runs machines: unprivileged.
    let (plain_c, plain_ip) = lab.node("eng-0", &[]);
    // What podman and buildah need at least: CAP_SYS_ADMIN and unshare (seccomp).
    let (admin_c, admin_ip) = lab.node("eng-1", &["--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined"]);
    let plain = node_info("eng-0", &plain_ip, "");
    let admin = node_info("eng-1", &admin_ip, "");

    // Unprivileged, podman refuses before installing anything, naming the reason.
    let podman_plain = context(&catalog, "podman", None, &plain, &[], &[], json!({}));
    let refused = step(&plain_c, ScriptStep::Install, &podman_plain).await;
    assert!(!refused.succeeded() && refused.output_tail.contains("lacks CAP_SYS_ADMIN"), "{}", refused.output_tail);
    let (code, _) = exec_status(&plain_c, &["dpkg-query", "-W", "podman"]);
    assert_ne!(code, 0, "podman was installed although the machine cannot run it");

    let docker = context(&catalog, "docker", None, &plain, &[], &[], json!({}));
    let crun_plain = context(&catalog, "crun", None, &plain, &[], &[], json!({}));
    let crun = context(&catalog, "crun", None, &admin, &[], &[], json!({}));
    let podman = context(&catalog, "podman", None, &admin, &[], &[], json!({}));
    let buildah = context(&catalog, "buildah", None, &admin, &[], &[], json!({}));

    let (a, b) =
        tokio::join!(async { (install_and_check(&plain_c, &docker).await, install_and_check(&plain_c, &crun_plain).await) }, async {
            (
                install_and_check(&admin_c, &crun).await,
                install_and_check(&admin_c, &podman).await,
                install_and_check(&admin_c, &buildah).await,
            )
        });
    eprintln!("engines group installs: docker {:?}, crun {:?}; crun {:?}, podman {:?}, buildah {:?}", a.0, a.1, b.0, b.1, b.2);

    // dockerd answers on its root-only unix socket, not on TCP.
    let version = exec_in(&plain_c, &["docker", "version", "--format", "{{.Server.Version}}"]);
    assert!(version.starts_with("20.10.24"), "{version}");
    let tcp = exec_in(&plain_c, &["cat", "/proc/net/tcp", "/proc/net/tcp6"]);
    assert!(!tcp.lines().any(|l| l.contains(":0944 ") || l.contains(":0945 ")), "dockerd listens on TCP:\n{tcp}");
    // podman and buildah share the store: an image buildah commits, podman lists.
    let container = exec_in(&admin_c, &["buildah", "from", "--quiet", "scratch"]);
    exec_in(&admin_c, &["buildah", "commit", "--quiet", "--rm", &container, "localhost/shared-store-probe"]);
    let images = exec_in(&admin_c, &["podman", "images", "--format", "{{.Repository}}"]);
    assert!(images.contains("localhost/shared-store-probe"), "{images}");
    exec_in(&admin_c, &["podman", "rmi", "localhost/shared-store-probe"]);

    tokio::join!(
        async {
            drift_roundtrip(&plain_c, &docker).await;
            drift_roundtrip(&plain_c, &crun_plain).await;
        },
        async {
            drift_roundtrip(&admin_c, &crun).await;
            drift_roundtrip(&admin_c, &podman).await;
            drift_roundtrip(&admin_c, &buildah).await;
        }
    );
    tokio::join!(
        async {
            remove_twice(&plain_c, &docker).await;
            remove_twice(&plain_c, &crun_plain).await;
        },
        async {
            remove_twice(&admin_c, &buildah).await;
            remove_twice(&admin_c, &podman).await;
            remove_twice(&admin_c, &crun).await;
        }
    );
    // A re-install after remove works (nothing left half-removed).
    assert_ok("docker re-install", &step(&plain_c, ScriptStep::Install, &docker).await);
    assert_ok("docker check", &check_until_ok(&plain_c, &docker, Duration::from_secs(30)).await);
}
