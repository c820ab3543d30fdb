//! Defaulting of the built-in workload kinds and Services, as upstream's `SetDefaults_*`
//! functions and registry strategies do on every write: clients read these fields back and rely
//! on them (a Deployment's `strategy`, a Job's `backoffLimit` and generated selector, a
//! Service's `clusterIP`, `type` and `targetPort`, a container's `imagePullPolicy`). Only fields
//! that are absent are set; what a client sent is kept.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::error::{Cause, Causes};

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

/// What one stored Service holds (at revision `rv`): its cluster IPs and node ports.
pub(super) struct Allocation {
    pub rv: u64,
    pub ips: Vec<String>,
    pub node_ports: Vec<u64>,
}

impl Allocation {
    /// Reads a stored Service's allocation, decoding only the fields that hold one (serde skips
    /// the rest of the object without building it).
    pub fn of(rv: u64, bytes: &[u8]) -> Self {
        #[derive(serde::Deserialize, Default)]
        #[serde(default, rename_all = "camelCase")]
        struct Port {
            node_port: Option<u64>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(default, rename_all = "camelCase")]
        struct Spec {
            #[serde(rename = "clusterIP")]
            cluster_ip: Option<String>,
            #[serde(rename = "clusterIPs")]
            cluster_ips: Option<Vec<String>>,
            ports: Option<Vec<Port>>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Service {
            spec: Option<Spec>,
        }
        let spec = serde_json::from_slice::<Service>(bytes).ok().and_then(|s| s.spec).unwrap_or_default();
        let mut ips: Vec<String> = spec.cluster_ip.into_iter().chain(spec.cluster_ips.into_iter().flatten()).collect();
        ips.retain(|ip| !ip.is_empty() && ip != "None");
        ips.dedup();
        let node_ports = spec.ports.into_iter().flatten().filter_map(|p| p.node_port).collect();
        Self { rv, ips, node_ports }
    }
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
/// `taken` is asked for only when a Service needs a new address or node port, or names one it
/// did not hold before; a Service asking for one that is taken, outside the range, or when the
/// range is full, is refused with the causes (as upstream's allocators).
pub(super) fn apply(storage: &str, obj: &mut Value, old: Option<&Value>, taken: impl FnOnce() -> Taken) -> Result<(), Vec<Cause>> {
    let Some(m) = obj.as_object_mut() else { return Ok(()) };
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
            // default/kubernetes points at the address this server serves on (default_service).
            let own = m.get("metadata").is_some_and(|md| md["namespace"] == "default" && md["name"] == "kubernetes");
            if let Some(spec) = child(m, "spec") {
                return service(spec, old.map(|o| &o["spec"]), taken, own);
            }
        }
        _ => {}
    }
    Ok(())
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

fn service(spec: &mut Map<String, Value>, old: Option<&Value>, taken: impl FnOnce() -> Taken, any_address: bool) -> Result<(), Vec<Cause>> {
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
    let mut causes = Causes::default();
    if !external_name {
        if spec.get("clusterIP").is_none_or(|v| v.is_null() || v == "") {
            let ip = free_ip(&lazy.get().ips).ok_or_else(|| {
                vec![Cause::new("FieldValueInvalid", "spec.clusterIPs", "failed to allocate a service IP: range is full")]
            })?;
            spec.insert("clusterIP".into(), json!(ip));
        } else if &spec["clusterIP"] != old.map_or(&Value::Null, |o| &o["clusterIP"]) {
            chosen_ip(&spec["clusterIP"], any_address, &mut lazy, &mut causes);
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
    let held: HashSet<u64> = old_ports.iter().filter_map(|o| o["nodePort"].as_u64()).collect();
    // The old node port of each (port, protocol), looked up once per port (not a scan per port).
    let mut kept_ports: std::collections::HashMap<(String, String), u64> = std::collections::HashMap::new();
    for o in &old_ports {
        if let Some(n) = o["nodePort"].as_u64() {
            kept_ports.entry((o["port"].to_string(), o["protocol"].to_string())).or_insert(n);
        }
    }
    let mut used: HashSet<(u64, String)> = HashSet::new();
    // The node ports this Service holds so far, kept as it grows (not rebuilt per port).
    let mut ours: HashSet<u64> = HashSet::new();
    for (i, p) in spec.get_mut("ports").and_then(Value::as_array_mut).into_iter().flatten().enumerate() {
        if causes.overflowed() {
            break;
        }
        let Some(p) = p.as_object_mut() else { continue };
        fill(p, "protocol", json!("TCP"));
        if let Some(port) = p.get("port").cloned() {
            fill(p, "targetPort", port);
        }
        if !node_ports {
            continue;
        }
        let field = format!("spec.ports[{i}].nodePort");
        if p.get("nodePort").is_none_or(Value::is_null) {
            let key = (p.get("port").unwrap_or(&Value::Null).to_string(), p.get("protocol").unwrap_or(&Value::Null).to_string());
            let kept = kept_ports.get(&key).copied();
            let Some(port) = kept.or_else(|| free_node_port(&lazy.get().node_ports, &ours)) else {
                // One cause: every later port would find the range as full.
                causes.push(Cause::new("FieldValueInvalid", field, "failed to allocate a node port: range of valid ports is full"));
                break;
            };
            p.insert("nodePort".into(), json!(port));
        } else if let Some(n) = p["nodePort"].as_u64().filter(|n| !held.contains(n)) {
            chosen_node_port(n, &field, &mut lazy, &mut causes);
        }
        let protocol = p["protocol"].as_str().unwrap_or_default().to_string();
        if let Some(n) = p["nodePort"].as_u64() {
            ours.insert(n);
            if !used.insert((n, protocol)) {
                causes.push(Cause::new("FieldValueDuplicate", field, format!("Duplicate value: {n}")));
            }
        }
    }
    if causes.is_empty() { Ok(()) } else { Err(causes.into_vec()) }
}

/// Checks a cluster IP the client chose: "None" (headless), or a free address in the range.
fn chosen_ip<F: FnOnce() -> Taken>(ip: &Value, any_address: bool, lazy: &mut Lazy<F>, causes: &mut Causes) {
    let text = ip.as_str().unwrap_or_default();
    if text == "None" || any_address {
        return;
    }
    let field = "spec.clusterIPs";
    match text.parse::<std::net::Ipv4Addr>() {
        Ok(addr) if (SERVICE_NET..SERVICE_NET + SERVICE_NET_SIZE).contains(&u32::from(addr)) => {
            if lazy.get().ips.contains(text) {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    field,
                    format!("Invalid value: [\"{text}\"]: failed to allocate IP {text}: provided IP is already allocated"),
                ));
            }
        }
        Ok(_) => causes.push(Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: [\"{text}\"]: failed to allocate IP {text}: the provided IP ({text}) is not in the valid range. The range of valid IPs is 10.96.0.0/12"),
        )),
        Err(_) => causes.push(Cause::new("FieldValueInvalid", field, format!("Invalid value: {ip}: must be a valid IP address"))),
    }
}

/// Checks a node port the client chose: in the range and held by no other Service.
fn chosen_node_port<F: FnOnce() -> Taken>(n: u64, field: &str, lazy: &mut Lazy<F>, causes: &mut Causes) {
    let (lo, hi) = (u64::from(*NODE_PORTS.start()), u64::from(*NODE_PORTS.end()));
    if !(lo..=hi).contains(&n) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {n}: provided port is not in the valid range. The range of valid ports is {lo}-{hi}"),
        ));
    } else if lazy.get().node_ports.contains(&n) {
        causes.push(Cause::new("FieldValueInvalid", field, format!("Invalid value: {n}: provided port is already allocated")));
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

fn free_ip(taken: &HashSet<String>) -> Option<String> {
    for _ in 0..64 {
        // Skip the network address, .1 (upstream's kubernetes Service) and .10 (cluster DNS).
        let n = SERVICE_NET + 11 + rand::random::<u32>() % (SERVICE_NET_SIZE - 12);
        let ip = std::net::Ipv4Addr::from(n).to_string();
        if !taken.contains(&ip) {
            return Some(ip);
        }
    }
    (SERVICE_NET + 11..SERVICE_NET + SERVICE_NET_SIZE - 1).map(|n| std::net::Ipv4Addr::from(n).to_string()).find(|ip| !taken.contains(ip))
}

fn free_node_port(taken: &HashSet<u64>, used: &HashSet<u64>) -> Option<u64> {
    let (lo, hi) = (u64::from(*NODE_PORTS.start()), u64::from(*NODE_PORTS.end()));
    let start = lo + rand::random::<u64>() % (hi - lo + 1);
    (start..=hi).chain(lo..start).find(|p| !taken.contains(p) && !used.contains(p))
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
        assert!(apply("/services", &mut first, None, none).is_ok());
        let ip = first["spec"]["clusterIP"].as_str().unwrap_or_default().to_string();
        assert!(ip.starts_with("10."), "{first}");
        let np = first["spec"]["ports"][0]["nodePort"].as_u64().unwrap_or_default();
        assert!(NODE_PORTS.contains(&u16::try_from(np).unwrap_or_default()), "{first}");
        assert_eq!(first["spec"]["ports"][0]["targetPort"], 80);
        let mut second = json!({"spec": {"type": "NodePort", "clusterIP": "", "ports": [{"port": 80}]}});
        assert!(apply("/services", &mut second, Some(&first), none).is_ok());
        assert_eq!(second["spec"]["clusterIP"], json!(ip));
        assert_eq!(second["spec"]["ports"][0]["nodePort"], json!(np));
    }

    #[test]
    fn headless_and_external_name_services_get_no_address() {
        let mut headless = json!({"spec": {"clusterIP": "None"}});
        assert!(apply("/services", &mut headless, None, none).is_ok());
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
        let mut ext = json!({"spec": {"type": "ExternalName", "externalName": "example.com"}});
        assert!(apply("/services", &mut ext, None, none).is_ok());
        assert!(ext["spec"].get("clusterIP").is_none(), "{ext}");
    }

    fn holding(ips: &[&str], ports: &[u64]) -> impl FnOnce() -> Taken {
        let t = Taken { ips: ips.iter().map(|s| (*s).to_string()).collect(), node_ports: ports.iter().copied().collect() };
        move || t
    }

    fn messages(r: Result<(), Vec<Cause>>) -> String {
        r.err().unwrap_or_default().iter().map(|c| format!("{}: {}", c.field, c.message)).collect::<Vec<_>>().join("; ")
    }

    #[test]
    fn a_chosen_address_or_node_port_must_be_free_and_in_range() {
        let mut taken_ip = json!({"spec": {"clusterIP": "10.96.0.50", "ports": [{"port": 80}]}});
        let m = messages(apply("/services", &mut taken_ip, None, holding(&["10.96.0.50"], &[])));
        assert!(m.contains("spec.clusterIPs") && m.contains("provided IP is already allocated"), "{m}");
        let mut outside = json!({"spec": {"clusterIP": "192.168.1.1"}});
        let m = messages(apply("/services", &mut outside, None, none));
        assert!(m.contains("not in the valid range"), "{m}");
        let mut port = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}});
        let m = messages(apply("/services", &mut port, None, holding(&[], &[30080])));
        assert!(m.contains("spec.ports[0].nodePort") && m.contains("provided port is already allocated"), "{m}");
        let mut low = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}});
        let m = messages(apply("/services", &mut low, None, none));
        assert!(m.contains("not in the valid range"), "{m}");
        let mut twice = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}, {"port": 81, "nodePort": 30001}]}});
        let m = messages(apply("/services", &mut twice, None, none));
        assert!(m.contains("spec.ports[1].nodePort") && m.contains("Duplicate"), "{m}");
        // What a Service already holds stays its own on update (no collision with itself).
        let old = json!({"clusterIP": "10.96.0.50", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]});
        let mut same = json!({"spec": {"clusterIP": "10.96.0.50", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}});
        let r = apply("/services", &mut same, Some(&json!({"spec": old})), holding(&["10.96.0.50"], &[30080]));
        assert!(r.is_ok(), "{}", messages(r));
    }

    #[test]
    fn a_full_node_port_range_is_refused_not_handed_out_twice() {
        let all: Vec<u64> = (30000..=32767).collect();
        let mut svc = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let m = messages(apply("/services", &mut svc, None, holding(&[], &all)));
        assert!(m.contains("range of valid ports is full"), "{m}");
        let mut almost: Vec<u64> = (30000..=32767).collect();
        almost.retain(|p| *p != 31000);
        let mut one = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        assert!(apply("/services", &mut one, None, holding(&[], &almost)).is_ok());
        assert_eq!(one["spec"]["ports"][0]["nodePort"], 31000);
    }

    #[test]
    fn a_full_range_is_one_cause_however_many_ports_ask() {
        let ports: Vec<Value> = (0..10_000).map(|i| json!({"port": i + 1})).collect();
        let mut svc = json!({"spec": {"type": "NodePort", "ports": ports}});
        let causes = apply("/services", &mut svc, None, none).err().unwrap_or_default();
        assert_eq!(causes.len(), 1, "{:?}", causes.iter().take(3).collect::<Vec<_>>());
        assert!(causes[0].message.contains("range of valid ports is full"), "{:?}", causes[0]);
        // The ports before the range filled got distinct node ports.
        let given: HashSet<u64> = svc["spec"]["ports"].as_array().into_iter().flatten().filter_map(|p| p["nodePort"].as_u64()).collect();
        assert_eq!(given.len(), 2768);
    }

    #[test]
    fn an_allocation_is_read_from_the_stored_bytes() {
        let bytes = br#"{"metadata":{"name":"a","annotations":{"big":"xxxx"}},"spec":{"clusterIP":"10.96.1.2","clusterIPs":["10.96.1.2"],"ports":[{"port":80,"nodePort":30001},{"port":81}]}}"#;
        let a = Allocation::of(7, bytes);
        assert_eq!((a.rv, a.ips, a.node_ports), (7, vec!["10.96.1.2".to_string()], vec![30001]));
        let headless = Allocation::of(1, br#"{"spec":{"clusterIP":"None","clusterIPs":["None"]}}"#);
        assert!(headless.ips.is_empty());
        let junk = Allocation::of(1, br#"{"spec":{"clusterIP":5,"ports":"x"}}"#);
        assert!(junk.ips.is_empty() && junk.node_ports.is_empty());
    }
}
