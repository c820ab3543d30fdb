//! What the simulated provider's machines print for the scripts whose results the
//! controller acts on, so that those paths run end to end without machines.
//!
//! Only the `kubernetes` service so far:
//! - its first control plane (the first server by name of the `controlPlanePool`, as the
//!   scripts' `role` says) reports a stand-in admin kubeconfig on a `PROVISIONING_SECRET`
//!   line, as the real `install.nu`/`check.nu` do with `/etc/kubernetes/admin.conf`. Its CA is
//!   derived from the config's `caKey` (a new caKey, a new CA, as on a real machine) and its
//!   server is the machine's own view of the endpoint; no key in it is real.
//! - kubeadm's bootstrap token, as far as joining needs it: `kubeadm init` (the first control
//!   plane's install) creates it for [`JOIN_TOKEN_TTL`] (the init configuration's `ttl`;
//!   `PROVISIONING_SIMULATED_JOIN_TOKEN_TTL_SECS` shortens it, for tests of a late joiner);
//!   a joining member's install waits up to [`JOIN_WAIT`] for a valid token (the real one
//!   waits for the API port) and fails without one; the first control plane's check renews
//!   it while a server of the Cluster is not a node (`ensure-join-token`). The state is the
//!   process's (a restart forgets it; a node re-installing finds itself joined only until then).

use std::collections::{BTreeSet, HashMap};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// How long a bootstrap token lives (the catalog's kubeadm-init.yaml `ttl`).
pub const JOIN_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// How long a joining member's install waits for a valid token before failing.
pub const JOIN_WAIT: Duration = Duration::from_secs(10);
/// Environment variable that shortens [`JOIN_TOKEN_TTL`] (seconds).
pub const JOIN_TOKEN_TTL_ENV: &str = "PROVISIONING_SIMULATED_JOIN_TOKEN_TTL_SECS";

/// One simulated Kubernetes cluster: its token's expiry and its nodes.
#[derive(Default)]
struct SimKube {
    token_until: Option<Instant>,
    nodes: BTreeSet<String>,
}

static CLUSTERS: LazyLock<Mutex<HashMap<String, SimKube>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn with_cluster<T>(key: &str, f: impl FnOnce(&mut SimKube) -> T) -> T {
    let mut all = CLUSTERS.lock().unwrap_or_else(|p| p.into_inner());
    f(all.entry(key.to_string()).or_default())
}

fn token_ttl() -> Duration {
    std::env::var(JOIN_TOKEN_TTL_ENV).ok().and_then(|v| v.parse().ok()).map_or(JOIN_TOKEN_TTL, Duration::from_secs)
}

/// What a simulated run prints after the "not run" line, and how it exits.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Simulated {
    /// Lines of stdout.
    pub lines: Vec<String>,
    /// Exit code.
    pub exit_code: i64,
}

/// Simulates `script` (its path) of a service whose results the controller acts on.
pub async fn simulate(script: &str, stdin: Option<&[u8]>) -> Simulated {
    simulate_timed(script, stdin, token_ttl(), JOIN_WAIT).await
}

async fn simulate_timed(script: &str, stdin: Option<&[u8]>, ttl: Duration, wait: Duration) -> Simulated {
    let mut parts = script.rsplit('/');
    let (file, service) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if service != "kubernetes" {
        return Simulated::default();
    }
    let Some(ctx) = stdin.and_then(|s| serde_json::from_slice::<Value>(s).ok()) else { return Simulated::default() };
    let me = str_at(&ctx, &["server", "name"]).to_string();
    let key = format!("{}/{}", str_at(&ctx, &["server", "namespace"]), cluster_name(&ctx));
    let init = is_init(&ctx);
    let mut out = Simulated::default();
    match (file, init) {
        ("install.nu", true) => with_cluster(&key, |k| {
            k.nodes.insert(me.clone());
            k.token_until.get_or_insert_with(|| Instant::now() + ttl);
        }),
        ("install.nu", false) => {
            if let Err(line) = join(&key, &me, wait).await {
                out.lines.push(line);
                out.exit_code = 1;
                return out;
            }
        }
        ("check.nu", true) => {
            let members: Vec<String> =
                ctx["cluster"]["servers"].as_array().into_iter().flatten().map(|s| str_at(s, &["name"]).to_string()).collect();
            let renewed = with_cluster(&key, |k| {
                let pending: Vec<String> = members.iter().filter(|m| !k.nodes.contains(*m)).cloned().collect();
                let valid = k.token_until.is_some_and(|t| t > Instant::now());
                if !pending.is_empty() && !valid {
                    k.token_until = Some(Instant::now() + ttl);
                }
                (!pending.is_empty() && !valid).then(|| pending.join(", "))
            });
            if let Some(pending) = renewed {
                out.lines.push(format!("simulated: join token renewed for {pending}"));
            }
        }
        ("remove.nu", _) => with_cluster(&key, |k| {
            k.nodes.remove(&me);
        }),
        _ => {}
    }
    if matches!(file, "install.nu" | "check.nu")
        && let Some(k) = kubernetes_init_kubeconfig(&ctx)
    {
        out.lines.push(format!("PROVISIONING_SECRET {}", json!({"kubeconfig": k})));
    }
    out
}

/// A member joins: at once when it is a node already, else once a valid token exists
/// (waiting up to `wait`, [`JOIN_WAIT`]); the error is the line kubeadm's failure would leave.
async fn join(key: &str, me: &str, wait: Duration) -> Result<(), String> {
    let deadline = Instant::now() + wait;
    loop {
        let joined = with_cluster(key, |k| {
            if k.nodes.contains(me) || k.token_until.is_some_and(|t| t > Instant::now()) {
                k.nodes.insert(me.to_string());
                true
            } else {
                false
            }
        });
        if joined {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err("simulated: kubeadm join failed: no valid bootstrap token (expired, and not renewed yet)".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn cluster_name(ctx: &Value) -> &str {
    match str_at(ctx, &["cluster", "name"]) {
        "" => str_at(ctx, &["taskserv", "name"]),
        n => n,
    }
}

/// Whether this server runs `kubeadm init`: the first control plane by name.
fn is_init(ctx: &Value) -> bool {
    let pool = ctx["config"]["controlPlanePool"].as_str().unwrap_or("control-plane");
    let me = str_at(ctx, &["server", "name"]);
    let mut cps: Vec<&str> = ctx["cluster"]["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| pool.is_empty() || s["pool"] == pool)
        .map(|s| str_at(s, &["name"]))
        .collect();
    cps.sort_unstable();
    !me.is_empty() && cps.first().is_none_or(|first| *first == me)
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter().fold(v, |cur, p| &cur[*p]).as_str().unwrap_or_default()
}

fn address_of(node: &Value) -> String {
    let addresses = node["addresses"].as_array().cloned().unwrap_or_default();
    let internal = addresses.iter().find(|a| a["type"] == "InternalIP").or(addresses.first());
    internal.and_then(|a| a["address"].as_str()).unwrap_or(str_at(node, &["name"])).to_string()
}

/// The kubeconfig the first control plane reports, or none on any other server.
fn kubernetes_init_kubeconfig(ctx: &Value) -> Option<String> {
    if !is_init(ctx) {
        return None;
    }
    let endpoint = match ctx["config"]["controlPlaneEndpoint"].as_str().filter(|e| !e.is_empty()) {
        Some(e) => e.to_string(),
        None => match address_of(&ctx["server"]) {
            // An IPv6 host in brackets, as kubeadm and the controller write it.
            a if a.parse::<std::net::Ipv6Addr>().is_ok() => format!("[{a}]:6443"),
            a => format!("{a}:6443"),
        },
    };
    let ca_key = ctx["config"]["caKey"].as_str().unwrap_or_default();
    let ca = format!("simulated CA {:x}", Sha256::digest(ca_key.as_bytes()));
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let name = cluster_name(ctx);
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"certificate-authority-data": b64(&ca), "server": format!("https://{endpoint}")}}],
        "contexts": [{"name": format!("kubernetes-admin@{name}"), "context": {"cluster": name, "user": "kubernetes-admin"}}],
        "current-context": format!("kubernetes-admin@{name}"),
        "users": [{"name": "kubernetes-admin", "user": {
            "client-certificate-data": b64("simulated client certificate"),
            "client-key-data": b64("simulated client key"),
        }}],
    });
    Some(config.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(cluster: &str, me: &str) -> Vec<u8> {
        json!({
            "server": {"name": me, "namespace": "ns", "addresses": [{"type": "InternalIP", "address": "192.0.2.7"}]},
            "cluster": {"name": cluster, "servers": [
                {"name": "k8s-control-plane-1", "pool": "control-plane"},
                {"name": "k8s-control-plane-0", "pool": "control-plane"},
                {"name": "k8s-workers-0", "pool": "workers"},
            ]},
            "taskserv": {"name": "k8s-kubernetes", "service": "kubernetes", "version": "1.31.4"},
            "config": {"caKey": "-----BEGIN PRIVATE KEY-----x", "controlPlaneEndpoint": ""},
        })
        .to_string()
        .into_bytes()
    }

    #[tokio::test]
    async fn only_the_first_control_plane_reports_a_kubeconfig() -> Result<(), serde_json::Error> {
        let run = |script: &'static str, me: &'static str| async move { simulate(script, Some(&ctx("kc", me))).await.lines };
        let lines = run("/opt/catalog/kubernetes/install.nu", "k8s-control-plane-0").await;
        assert_eq!(lines.len(), 1, "{lines:?}");
        let secret: Value = serde_json::from_str(lines[0].trim_start_matches("PROVISIONING_SECRET "))?;
        let kubeconfig: Value = serde_json::from_str(secret["kubeconfig"].as_str().unwrap_or_default())?;
        assert_eq!(kubeconfig["clusters"][0]["cluster"]["server"], "https://192.0.2.7:6443");
        assert_eq!(run("/opt/catalog/kubernetes/check.nu", "k8s-control-plane-0").await.len(), 1);
        assert!(run("/opt/catalog/kubernetes/install.nu", "k8s-control-plane-1").await.is_empty());
        assert!(run("/opt/catalog/kubernetes/install.nu", "k8s-workers-0").await.is_empty());
        assert!(run("/opt/catalog/kubernetes/remove.nu", "k8s-control-plane-0").await.is_empty());
        assert!(run("/opt/catalog/etcd/install.nu", "k8s-control-plane-0").await.is_empty());
        assert_eq!(simulate("/opt/catalog/kubernetes/install.nu", Some(b"not json")).await, Simulated::default());
        Ok(())
    }

    #[tokio::test]
    async fn a_late_joiner_needs_the_token_the_first_control_plane_renews() {
        let (ttl, no_wait) = (Duration::from_millis(300), Duration::ZERO);
        let run = |script: &'static str, me: &'static str| async move {
            simulate_timed(&format!("/opt/catalog/kubernetes/{script}"), Some(&ctx("late", me)), ttl, no_wait).await
        };
        assert_eq!(run("install.nu", "k8s-control-plane-0").await.exit_code, 0, "kubeadm init");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Days later: init's token has expired and nobody renewed it.
        let late = run("install.nu", "k8s-workers-0").await;
        assert_eq!(late.exit_code, 1);
        assert!(late.lines[0].contains("no valid bootstrap token"), "{late:?}");
        // The first control plane's check sees servers that are not nodes: the token again.
        let check = run("check.nu", "k8s-control-plane-0").await;
        assert!(check.lines.iter().any(|l| l == "simulated: join token renewed for k8s-control-plane-1, k8s-workers-0"), "{check:?}");
        assert_eq!(run("install.nu", "k8s-workers-0").await.exit_code, 0, "the retried join succeeds");
        // Still valid: not renewed again; a joined node re-installing needs no token.
        assert!(!run("check.nu", "k8s-control-plane-0").await.lines.iter().any(|l| l.contains("renewed")));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(run("install.nu", "k8s-workers-0").await.exit_code, 0);
    }
}
