//! Table cells of built-in kinds that no JSONPath expresses (`1/2`, `80/TCP`, `app=x`), written
//! as kubectl's server-side printers do (kubernetes pkg/printers/internalversion/printers.go).

use serde_json::{Value, json};

/// The value of the computed column `name` (the part after `#builtin:`) for `obj`.
pub fn cell(name: &str, obj: &Value) -> Value {
    let spec = &obj["spec"];
    let status = &obj["status"];
    match name {
        "sa-secrets" => json!(obj["secrets"].as_array().map(Vec::len).unwrap_or(0).to_string()),
        "svc-cluster-ip" => json!(non_empty(spec["clusterIP"].as_str()).unwrap_or("<none>")),
        "svc-external-ip" => json!(service_external_ip(obj)),
        "svc-ports" => json!(service_ports(spec)),
        "selector-map" => json!(format_map(&spec["selector"])),
        "deploy-ready" => {
            let want = spec["replicas"].as_i64().unwrap_or(1);
            json!(format!("{}/{want}", status["readyReplicas"].as_i64().unwrap_or(0)))
        }
        "deploy-updated" => json!(status["updatedReplicas"].as_i64().unwrap_or(0)),
        "deploy-available" => json!(status["availableReplicas"].as_i64().unwrap_or(0)),
        "containers" => json!(join_field(&spec["template"]["spec"]["containers"], "name")),
        "images" => json!(join_field(&spec["template"]["spec"]["containers"], "image")),
        "selector" => json!(format_label_selector(&spec["selector"])),
        "netpol-selector" => json!(format_label_selector(&spec["podSelector"])),
        "binding-role" => {
            let r = &obj["roleRef"];
            json!(format!("{}/{}", r["kind"].as_str().unwrap_or_default(), r["name"].as_str().unwrap_or_default()))
        }
        "binding-users" => json!(subjects(obj, "User")),
        "binding-groups" => json!(subjects(obj, "Group")),
        "binding-sas" => json!(subjects(obj, "ServiceAccount")),
        "pdb-min" => json!(int_or_string(&spec["minAvailable"])),
        "pdb-max" => json!(int_or_string(&spec["maxUnavailable"])),
        "pod-ready" => {
            let containers = spec["containers"].as_array().map(Vec::len).unwrap_or(0);
            let ready = statuses(status).filter(|c| c["ready"].as_bool() == Some(true)).count();
            json!(format!("{ready}/{containers}"))
        }
        "pod-status" => json!(pod_status(obj)),
        "pod-restarts" => json!(statuses(status).map(|c| c["restartCount"].as_i64().unwrap_or(0)).sum::<i64>().to_string()),
        "node-status" => {
            let ready = status["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Ready");
            let word = match ready.and_then(|c| c["status"].as_str()) {
                Some("True") => "Ready",
                _ => "NotReady",
            };
            json!(if spec["unschedulable"].as_bool() == Some(true) { format!("{word},SchedulingDisabled") } else { word.to_string() })
        }
        "node-roles" => json!(node_roles(obj)),
        "job-completions" => {
            let want = spec["completions"].as_i64().map_or_else(|| "1".to_string(), |n| n.to_string());
            json!(format!("{}/{want}", status["succeeded"].as_i64().unwrap_or(0)))
        }
        "cronjob-active" => json!(status["active"].as_array().map(Vec::len).unwrap_or(0)),
        "slice-endpoints" => json!(slice_endpoints(obj)),
        _ => Value::Null,
    }
}

/// A Pod's container statuses.
fn statuses(status: &Value) -> impl Iterator<Item = &Value> {
    status["containerStatuses"].as_array().into_iter().flatten()
}

/// A Pod's STATUS column: its reason, a waiting container's reason, else its phase (as
/// kubectl's printPod, without the init-container detail).
fn pod_status(obj: &Value) -> String {
    if obj["metadata"]["deletionTimestamp"].is_string() {
        return "Terminating".into();
    }
    let status = &obj["status"];
    if let Some(reason) = non_empty(status["reason"].as_str()) {
        return reason.to_string();
    }
    if let Some(waiting) = statuses(status).find_map(|c| non_empty(c["state"]["waiting"]["reason"].as_str())) {
        return waiting.to_string();
    }
    non_empty(status["phase"].as_str()).unwrap_or("Pending").to_string()
}

/// A Node's ROLES column: the `node-role.kubernetes.io/<role>` labels.
fn node_roles(obj: &Value) -> String {
    let roles: Vec<&str> = obj["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
        .filter(|r| !r.is_empty())
        .collect();
    if roles.is_empty() { "<none>".into() } else { roles.join(",") }
}

/// An EndpointSlice's ENDPOINTS column: up to three addresses, then `+ N more...`.
fn slice_endpoints(obj: &Value) -> String {
    let all: Vec<&str> = obj["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    match all.len() {
        0 => "<unset>".into(),
        n if n <= 3 => all.join(","),
        n => format!("{} + {} more...", all[..3].join(","), n - 3),
    }
}

/// Subjects of a (Cluster)RoleBinding of one kind, comma-joined; ServiceAccounts as `ns/name`.
fn subjects(obj: &Value, kind: &str) -> String {
    let parts: Vec<String> = obj["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"].as_str() == Some(kind))
        .map(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["namespace"].as_str() {
                Some(ns) if kind == "ServiceAccount" => format!("{ns}/{name}"),
                _ => name.to_string(),
            }
        })
        .collect();
    parts.join(", ")
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

fn int_or_string(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => "N/A".into(),
    }
}

fn join_field(list: &Value, field: &str) -> String {
    let parts: Vec<&str> = list.as_array().into_iter().flatten().filter_map(|c| c[field].as_str()).collect();
    parts.join(",")
}

/// `k=v,k2=v2` sorted by key (labels.Set.String), `<none>` when empty.
fn format_map(m: &Value) -> String {
    let Some(map) = m.as_object().filter(|m| !m.is_empty()) else {
        return "<none>".into();
    };
    let mut parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
    parts.sort();
    parts.join(",")
}

/// metav1.FormatLabelSelector: matchLabels then matchExpressions; `<none>` when empty.
fn format_label_selector(sel: &Value) -> String {
    let mut parts: Vec<String> = vec![];
    if let Some(ml) = sel["matchLabels"].as_object() {
        let mut v: Vec<String> = ml.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
        v.sort();
        parts.extend(v);
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let s = match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other} ({})", values.join(",")),
        };
        parts.push(s);
    }
    if parts.is_empty() { "<none>".into() } else { parts.join(",") }
}

fn service_external_ip(obj: &Value) -> String {
    let spec = &obj["spec"];
    let external: Vec<&str> = spec["externalIPs"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    match spec["type"].as_str().unwrap_or("ClusterIP") {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".into()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let mut ips: Vec<String> = obj["status"]["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| non_empty(i["ip"].as_str()).or_else(|| non_empty(i["hostname"].as_str())).map(str::to_string))
                .collect();
            ips.extend(external.iter().map(|s| s.to_string()));
            if ips.is_empty() { "<pending>".into() } else { ips.join(",") }
        }
        "ExternalName" => spec["externalName"].as_str().unwrap_or_default().to_string(),
        _ => "<unknown>".into(),
    }
}

fn service_ports(spec: &Value) -> String {
    let parts: Vec<String> = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let port = p["port"].as_i64().unwrap_or(0);
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64().filter(|n| *n != 0) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    if parts.is_empty() { "<none>".into() } else { parts.join(",") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_and_service_cells() {
        let d = json!({"spec": {"replicas": 2, "selector": {"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [{"key": "t", "operator": "In", "values": ["x", "y"]}]},
            "template": {"spec": {"containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]}}}, "status": {"readyReplicas": 1}});
        assert_eq!(cell("deploy-ready", &d), json!("1/2"));
        assert_eq!(cell("containers", &d), json!("c1,c2"));
        assert_eq!(cell("selector", &d), json!("a=1,b=2,t in (x,y)"));
        let s = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]}});
        assert_eq!(cell("svc-ports", &s), json!("80:30080/TCP,53/UDP"));
        assert_eq!(cell("svc-external-ip", &s), json!("<none>"));
        assert_eq!(cell("svc-cluster-ip", &s), json!("<none>"));
        assert_eq!(cell("pdb-min", &json!({"spec": {"minAvailable": 1}})), json!("1"));
        assert_eq!(cell("pdb-max", &json!({"spec": {"minAvailable": 1}})), json!("N/A"));
    }
}
