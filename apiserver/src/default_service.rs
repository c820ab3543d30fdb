//! The `default/kubernetes` Service every real API server keeps, with its Endpoints and
//! EndpointSlice, pointing at the address this server serves on (clients that find the API
//! server through the Service, and `kubectl get svc -A`, see it as on a real cluster).

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::handlers::Core;
use crate::objects::WriteOptions;

/// The three objects for a server listening on `listen`: (group, version, plural, object).
pub fn objects(listen: SocketAddr) -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let host = crate::tls::client_host(listen);
    let (ip, port) = host.rsplit_once(':').map_or((host.as_str(), "0"), |(h, p)| (h, p));
    let ip = ip.trim_start_matches('[').trim_end_matches(']').to_string();
    let port: u16 = port.parse().unwrap_or(443);
    let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
    let labels = json!({"component": "apiserver", "provider": "kubernetes"});
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": labels},
        "spec": {
            "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": [family],
            "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
            "ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": port}],
        },
    });
    let endpoints = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": family,
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    vec![("", "v1", "services", service), ("", "v1", "endpoints", endpoints), ("discovery.k8s.io", "v1", "endpointslices", slice)]
}

/// Creates the objects, or brings them back to the serving address when it changed (a new
/// port after a restart); leaves them alone when they already say the same.
pub async fn ensure(core: &Core, listen: SocketAddr) -> anyhow::Result<()> {
    let opts = WriteOptions { field_manager: "provisioning-apiserver".into(), ..Default::default() };
    let reg = core.registry();
    for (group, version, plural, obj) in objects(listen) {
        let Some(rt) = reg.get(group, version, plural) else { continue };
        match core.get(&rt, Some("default"), "kubernetes") {
            Ok(cur) => {
                let cur = cur.value();
                let same = ["spec", "subsets", "endpoints", "ports"].iter().all(|k| obj.get(*k).is_none_or(|v| cur.get(*k) == Some(v)));
                if !same {
                    let mut new = obj.clone();
                    new["metadata"] = cur["metadata"].clone();
                    core.update(&rt, Some("default"), "kubernetes", new, false, &opts)
                        .await
                        .map_err(|e| anyhow::anyhow!("updating {plural} default/kubernetes: {e}"))?;
                }
            }
            Err(_) => match core.create(&rt, Some("default"), obj, &opts).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => anyhow::bail!("creating {plural} default/kubernetes: {e}"),
            },
        }
    }
    Ok(())
}
