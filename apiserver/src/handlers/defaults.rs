//! Defaulting of the built-in workload kinds and Services, as upstream's `SetDefaults_*`
//! functions and registry strategies do on every write: clients read these fields back and rely
//! on them (a Deployment's `strategy`, a Job's `backoffLimit` and generated selector, a
//! Service's `clusterIP`, `type` and `targetPort`, a container's `imagePullPolicy`). Only fields
//! that are absent are set; what a client sent is kept.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

/// The Service ClusterIP range (kube-apiserver's default `--service-cluster-ip-range`,
/// 10.96.0.0/12): 10.96.0.0 .. 10.111.255.255.
const SERVICE_NET: u32 = 0x0A60_0000;
const SERVICE_NET_SIZE: u32 = 1 << 20;
/// The NodePort range (`--service-node-port-range`).
const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// Addresses and node ports already held by other Services (asked for only when one is needed).
pub(super) struct Taken {
    pub ips: HashSet<String>,
    pub node_ports: HashSet<u64>,
}

/// Sets `key` in `m` to `v` when it is absent or null.
fn fill(m: &mut Map<String, Value>, key: &str, v: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.into(), v);
    }
}

/// The object at `key` in `m`, created empty when absent or null (None when it is not an object).
fn child<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    fill(m, key, json!({}));
    m.get_mut(key).and_then(Value::as_object_mut)
}

/// Defaults of the built-in kind stored under `storage` (None when it has none here).
/// `taken` is asked for only when a Service needs a new address or node port.
pub(super) fn apply(storage: &str, obj: &mut Value, old: Option<&Value>, taken: impl FnOnce() -> Taken) {
    let Some(m) = obj.as_object_mut() else { return };
    match storage {
        "/pods" => {
            if let Some(spec) = child(m, "spec") {
                pod_spec(spec);
                fill(spec, "enableServiceLinks", json!(true));
            }
        }
        "/replicationcontrollers" | "apps/replicasets" => {
            if let Some(spec) = child(m, "spec") {
                fill(spec, "replicas", json!(1));
                template(spec);
            }
        }
        "apps/deployments" => {
            if let Some(spec) = child(m, "spec") {
                deployment(spec);
            }
        }
        "apps/statefulsets" => {
            if let Some(spec) = child(m, "spec") {
                stateful_set(spec);
            }
        }
        "apps/daemonsets" => {
            if let Some(spec) = child(m, "spec") {
                if let Some(s) = child(spec, "updateStrategy") {
                    fill(s, "type", json!("RollingUpdate"));
                    if s["type"] == "RollingUpdate"
                        && let Some(r) = child(s, "rollingUpdate")
                    {
                        fill(r, "maxUnavailable", json!(1));
                        fill(r, "maxSurge", json!(0));
                    }
                }
                fill(spec, "revisionHistoryLimit", json!(10));
                template(spec);
            }
        }
        "batch/jobs" => job(m, old),
        "batch/cronjobs" => {
            if let Some(spec) = child(m, "spec") {
                fill(spec, "concurrencyPolicy", json!("Allow"));
                fill(spec, "suspend", json!(false));
                fill(spec, "successfulJobsHistoryLimit", json!(3));
                fill(spec, "failedJobsHistoryLimit", json!(1));
                if let Some(js) = child(spec, "jobTemplate").and_then(|jt| child(jt, "spec")) {
                    template(js);
                }
            }
        }
        "/services" => {
            if let Some(spec) = child(m, "spec") {
                service(spec, old.map(|o| &o["spec"]), taken);
            }
        }
        _ => {}
    }
}

fn deployment(spec: &mut Map<String, Value>) {
    fill(spec, "replicas", json!(1));
    if let Some(s) = child(spec, "strategy") {
        fill(s, "type", json!("RollingUpdate"));
        if s["type"] == "RollingUpdate"
            && let Some(r) = child(s, "rollingUpdate")
        {
            fill(r, "maxUnavailable", json!("25%"));
            fill(r, "maxSurge", json!("25%"));
        }
    }
    fill(spec, "revisionHistoryLimit", json!(10));
    fill(spec, "progressDeadlineSeconds", json!(600));
    template(spec);
}

fn stateful_set(spec: &mut Map<String, Value>) {
    fill(spec, "replicas", json!(1));
    fill(spec, "podManagementPolicy", json!("OrderedReady"));
    if let Some(s) = child(spec, "updateStrategy") {
        fill(s, "type", json!("RollingUpdate"));
        if s["type"] == "RollingUpdate"
            && let Some(r) = child(s, "rollingUpdate")
        {
            fill(r, "partition", json!(0));
        }
    }
    fill(spec, "revisionHistoryLimit", json!(10));
    if let Some(p) = child(spec, "persistentVolumeClaimRetentionPolicy") {
        fill(p, "whenDeleted", json!("Retain"));
        fill(p, "whenScaled", json!("Retain"));
    }
    template(spec);
}

/// A Job: counts, backoff, completion mode, and (unless `manualSelector`) the selector and
/// template labels upstream generates from the uid on create and keeps after.
fn job(m: &mut Map<String, Value>, old: Option<&Value>) {
    let uid = m.get("metadata").and_then(|md| md["uid"].as_str()).unwrap_or_default().to_string();
    let name = m.get("metadata").and_then(|md| md["name"].as_str()).unwrap_or_default().to_string();
    let Some(spec) = child(m, "spec") else { return };
    if spec.get("completions").is_none_or(Value::is_null) && spec.get("parallelism").is_none_or(Value::is_null) {
        spec.insert("completions".into(), json!(1));
    }
    fill(spec, "parallelism", json!(1));
    if spec.get("backoffLimitPerIndex").is_none_or(Value::is_null) {
        fill(spec, "backoffLimit", json!(6));
    }
    fill(spec, "completionMode", json!("NonIndexed"));
    fill(spec, "suspend", json!(false));
    if spec.get("podFailurePolicy").is_none_or(Value::is_null) {
        fill(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    }
    if spec.get("manualSelector") != Some(&json!(true)) {
        match old.map(|o| &o["spec"]["selector"]).filter(|s| !s.is_null()) {
            Some(s) => {
                spec.insert("selector".into(), s.clone());
            }
            None if !uid.is_empty() => {
                spec.insert("selector".into(), json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}));
            }
            None => {}
        }
        let uid = spec["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"].as_str().map(str::to_string);
        if let (Some(uid), Some(labels)) =
            (uid, child(spec, "template").and_then(|t| child(t, "metadata")).and_then(|md| child(md, "labels")))
        {
            fill(labels, "batch.kubernetes.io/controller-uid", json!(uid));
            fill(labels, "batch.kubernetes.io/job-name", json!(name));
            fill(labels, "controller-uid", json!(uid));
            fill(labels, "job-name", json!(name));
        }
    }
    template(spec);
}

/// The pod template's spec under `spec.template`, when there is one.
fn template(spec: &mut Map<String, Value>) {
    if let Some(ps) = spec.get_mut("template").and_then(Value::as_object_mut).and_then(|t| child(t, "spec")) {
        pod_spec(ps);
    }
}

fn pod_spec(ps: &mut Map<String, Value>) {
    fill(ps, "restartPolicy", json!("Always"));
    fill(ps, "terminationGracePeriodSeconds", json!(30));
    fill(ps, "dnsPolicy", json!("ClusterFirst"));
    fill(ps, "securityContext", json!({}));
    fill(ps, "schedulerName", json!("default-scheduler"));
    for list in ["initContainers", "containers"] {
        for c in ps.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut) {
            fill(c, "terminationMessagePath", json!("/dev/termination-log"));
            fill(c, "terminationMessagePolicy", json!("File"));
            let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
            fill(c, "imagePullPolicy", json!(pull_policy(image)));
        }
    }
}

/// `Always` for `:latest` or an untagged image, `IfNotPresent` otherwise (a digest counts as a tag).
fn pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn service(spec: &mut Map<String, Value>, old: Option<&Value>, taken: impl FnOnce() -> Taken) {
    fill(spec, "type", json!("ClusterIP"));
    fill(spec, "sessionAffinity", json!("None"));
    let ty = spec["type"].as_str().unwrap_or_default().to_string();
    let external_name = ty == "ExternalName";
    let node_ports = ty == "NodePort" || ty == "LoadBalancer";
    // What the stored object had keeps (upstream retains allocated values a client omits).
    if let Some(old) = old.filter(|o| o["type"] != "ExternalName" && !external_name) {
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            // Empty counts as omitted (upstream's patchAllocatedValues).
            let omitted = spec.get(k).is_none_or(|v| v.is_null() || v == "" || v.as_array().is_some_and(Vec::is_empty));
            if omitted && let Some(v) = old.get(k).filter(|v| !v.is_null()) {
                spec.insert(k.into(), v.clone());
            }
        }
    }
    let mut lazy = Lazy { f: Some(taken), v: None };
    if !external_name {
        if spec.get("clusterIP").is_none_or(|v| v.is_null() || v == "") {
            let ip = free_ip(&lazy.get().ips);
            spec.insert("clusterIP".into(), json!(ip));
        }
        let ip = spec["clusterIP"].clone();
        fill(spec, "clusterIPs", json!([ip]));
        fill(spec, "ipFamilies", json!(["IPv4"]));
        fill(spec, "ipFamilyPolicy", json!("SingleStack"));
        fill(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if node_ports {
        fill(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        fill(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    let old_ports: Vec<Value> = old.and_then(|o| o["ports"].as_array().cloned()).unwrap_or_default();
    let mut used: HashSet<u64> = HashSet::new();
    for p in spec.get_mut("ports").and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut) {
        fill(p, "protocol", json!("TCP"));
        if let Some(port) = p.get("port").cloned() {
            fill(p, "targetPort", port);
        }
        if !node_ports {
            continue;
        }
        if p.get("nodePort").is_none_or(Value::is_null) {
            let kept =
                old_ports.iter().find(|o| o["port"] == p["port"] && o["protocol"] == p["protocol"]).and_then(|o| o["nodePort"].as_u64());
            let port = kept.unwrap_or_else(|| free_node_port(&lazy.get().node_ports, &used));
            p.insert("nodePort".into(), json!(port));
        }
        if let Some(n) = p["nodePort"].as_u64() {
            used.insert(n);
        }
    }
}

/// `Taken`, asked for once, when first needed.
struct Lazy<F> {
    f: Option<F>,
    v: Option<Taken>,
}

impl<F: FnOnce() -> Taken> Lazy<F> {
    fn get(&mut self) -> &Taken {
        let f = &mut self.f;
        self.v.get_or_insert_with(|| f.take().map_or_else(|| Taken { ips: HashSet::new(), node_ports: HashSet::new() }, |f| f()))
    }
}

fn free_ip(taken: &HashSet<String>) -> String {
    for _ in 0..64 {
        // Skip the network address, .1 (upstream's kubernetes Service) and .10 (cluster DNS).
        let n = SERVICE_NET + 11 + rand::random::<u32>() % (SERVICE_NET_SIZE - 12);
        let ip = std::net::Ipv4Addr::from(n).to_string();
        if !taken.contains(&ip) {
            return ip;
        }
    }
    (SERVICE_NET + 11..SERVICE_NET + SERVICE_NET_SIZE - 1)
        .map(|n| std::net::Ipv4Addr::from(n).to_string())
        .find(|ip| !taken.contains(ip))
        .unwrap_or_else(|| std::net::Ipv4Addr::from(SERVICE_NET + 11).to_string())
}

fn free_node_port(taken: &HashSet<u64>, used: &HashSet<u64>) -> u64 {
    let (lo, hi) = (u64::from(*NODE_PORTS.start()), u64::from(*NODE_PORTS.end()));
    let start = lo + rand::random::<u64>() % (hi - lo + 1);
    (start..=hi).chain(lo..start).find(|p| !taken.contains(p) && !used.contains(p)).unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> Taken {
        Taken { ips: HashSet::new(), node_ports: HashSet::new() }
    }

    #[test]
    fn pull_policy_follows_the_tag() {
        assert_eq!(pull_policy("nginx"), "Always");
        assert_eq!(pull_policy("nginx:latest"), "Always");
        assert_eq!(pull_policy("nginx:1.27"), "IfNotPresent");
        assert_eq!(pull_policy("registry:5000/nginx"), "Always");
        assert_eq!(pull_policy("nginx@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn service_keeps_its_address_and_node_ports_on_update() {
        let mut first = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        apply("/services", &mut first, None, none);
        let ip = first["spec"]["clusterIP"].as_str().unwrap_or_default().to_string();
        assert!(ip.starts_with("10."), "{first}");
        let np = first["spec"]["ports"][0]["nodePort"].as_u64().unwrap_or_default();
        assert!(NODE_PORTS.contains(&u16::try_from(np).unwrap_or_default()), "{first}");
        assert_eq!(first["spec"]["ports"][0]["targetPort"], 80);
        let mut second = json!({"spec": {"type": "NodePort", "clusterIP": "", "ports": [{"port": 80}]}});
        apply("/services", &mut second, Some(&first), none);
        assert_eq!(second["spec"]["clusterIP"], json!(ip));
        assert_eq!(second["spec"]["ports"][0]["nodePort"], json!(np));
    }

    #[test]
    fn headless_and_external_name_services_get_no_address() {
        let mut headless = json!({"spec": {"clusterIP": "None"}});
        apply("/services", &mut headless, None, none);
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
        let mut ext = json!({"spec": {"type": "ExternalName", "externalName": "example.com"}});
        apply("/services", &mut ext, None, none);
        assert!(ext["spec"].get("clusterIP").is_none(), "{ext}");
    }
}
