//! What the simulated provider's machines print for the scripts whose results the
//! controller acts on, so that those paths run end to end without machines.
//!
//! Only the `kubernetes` service so far: its first control plane (the first server by name
//! of the `controlPlanePool`, as the scripts' `role` says) reports a stand-in admin
//! kubeconfig on a `PROVISIONING_SECRET` line, as the real `install.nu`/`check.nu` do with
//! `/etc/kubernetes/admin.conf`. Its CA is derived from the config's `caKey` (a new caKey, a
//! new CA, as on a real machine) and its server is the machine's own view of the endpoint;
//! no key in it is real.

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The lines a simulated run of `script` (its path) prints after the "not run" line, if any.
pub fn simulated_lines(script: &str, stdin: Option<&[u8]>) -> Vec<String> {
    let mut parts = script.rsplit('/');
    let (file, service) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if service != "kubernetes" || !matches!(file, "install.nu" | "check.nu") {
        return Vec::new();
    }
    let Some(ctx) = stdin.and_then(|s| serde_json::from_slice::<Value>(s).ok()) else { return Vec::new() };
    kubernetes_init_kubeconfig(&ctx).map(|k| vec![format!("PROVISIONING_SECRET {}", json!({"kubeconfig": k}))]).unwrap_or_default()
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
    let pool = ctx["config"]["controlPlanePool"].as_str().unwrap_or("control-plane");
    let me = str_at(ctx, &["server", "name"]);
    let mut cps: Vec<&Value> =
        ctx["cluster"]["servers"].as_array().into_iter().flatten().filter(|s| pool.is_empty() || s["pool"] == pool).collect();
    cps.sort_by_key(|s| str_at(s, &["name"]).to_string());
    let first = cps.first().map_or(me, |s| str_at(s, &["name"]));
    if first != me || me.is_empty() {
        return None;
    }
    let endpoint = match ctx["config"]["controlPlaneEndpoint"].as_str().filter(|e| !e.is_empty()) {
        Some(e) => e.to_string(),
        None => format!("{}:6443", address_of(&ctx["server"])),
    };
    let ca_key = ctx["config"]["caKey"].as_str().unwrap_or_default();
    let ca = format!("simulated CA {:x}", Sha256::digest(ca_key.as_bytes()));
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let name = match str_at(ctx, &["cluster", "name"]) {
        "" => str_at(ctx, &["taskserv", "name"]),
        n => n,
    };
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

    fn ctx(me: &str) -> Vec<u8> {
        json!({
            "server": {"name": me, "addresses": [{"type": "InternalIP", "address": "192.0.2.7"}]},
            "cluster": {"name": "k8s", "servers": [
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

    #[test]
    fn only_the_first_control_plane_reports_a_kubeconfig() -> Result<(), serde_json::Error> {
        let lines = simulated_lines("/opt/catalog/kubernetes/check.nu", Some(&ctx("k8s-control-plane-0")));
        assert_eq!(lines.len(), 1, "{lines:?}");
        let secret: Value = serde_json::from_str(lines[0].trim_start_matches("PROVISIONING_SECRET "))?;
        let kubeconfig: Value = serde_json::from_str(secret["kubeconfig"].as_str().unwrap_or_default())?;
        assert_eq!(kubeconfig["clusters"][0]["cluster"]["server"], "https://192.0.2.7:6443");
        assert!(simulated_lines("/opt/catalog/kubernetes/install.nu", Some(&ctx("k8s-control-plane-1"))).is_empty());
        assert!(simulated_lines("/opt/catalog/kubernetes/install.nu", Some(&ctx("k8s-workers-0"))).is_empty());
        assert!(simulated_lines("/opt/catalog/kubernetes/remove.nu", Some(&ctx("k8s-control-plane-0"))).is_empty());
        assert!(simulated_lines("/opt/catalog/etcd/install.nu", Some(&ctx("k8s-control-plane-0"))).is_empty());
        assert!(simulated_lines("/opt/catalog/kubernetes/install.nu", Some(b"not json")).is_empty());
        Ok(())
    }
}
