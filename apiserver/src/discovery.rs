//! Aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`) on `/api` and
//! `/apis`: every group, version and resource in one answer each, which client-go (kubectl,
//! k9s, Argo CD) asks for first and prefers over one request per group/version.
//!
//! Content negotiation follows client-go's `discovery/discovery_client.go`: it sends
//! `Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json`
//! and decides by the answer's Content-Type which format it got, so a request that does not
//! name the aggregated type gets the legacy `APIVersions` / `APIGroupList` unchanged.
//!
//! The documents are derived from the legacy discovery of [`Registry`] (one source of truth:
//! a resource listed in one format is listed in the other, with the same verbs).

use serde_json::{Map, Value, json};

use crate::registry::Registry;

/// Content-Type of an aggregated discovery answer (the parameters in client-go's order).
pub const AGGREGATED_CONTENT_TYPE: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether the `Accept` header asks for aggregated discovery before any format this server
/// also serves (legacy JSON). Media ranges are taken in the order sent, as kube-apiserver's
/// negotiation does; parameter order and spaces do not matter (`profile=nopeer` is allowed:
/// one server has no peers).
pub fn wants_aggregated(accept: &str) -> bool {
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let base = parts.next().unwrap_or_default().to_ascii_lowercase();
        let mut params = Map::new();
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                params.insert(k.trim().to_ascii_lowercase(), json!(v.trim().trim_matches('"')));
            }
        }
        let json_like = matches!(base.as_str(), "application/json" | "application/*" | "*/*");
        if !json_like {
            continue;
        }
        if params.get("as").is_none() && params.get("g").is_none() {
            // Plain JSON first: the client prefers legacy discovery.
            return false;
        }
        if base == "application/json"
            && params.get("g") == Some(&json!("apidiscovery.k8s.io"))
            && params.get("v") == Some(&json!("v2"))
            && params.get("as") == Some(&json!("APIGroupDiscoveryList"))
        {
            return true;
        }
        // Another typed form (v2beta1, Table, ...): not served here, try the next range.
    }
    false
}

/// `APIGroupDiscoveryList` for `/api` (the core group, named "").
pub fn core(reg: &Registry) -> Value {
    list(reg, |g| g.is_empty())
}

/// `APIGroupDiscoveryList` for `/apis` (every named group, in legacy discovery's order).
pub fn apis(reg: &Registry) -> Value {
    list(reg, |g| !g.is_empty())
}

fn list(reg: &Registry, include: impl Fn(&str) -> bool) -> Value {
    let items: Vec<Value> = reg
        .groups
        .iter()
        .filter(|(g, _)| include(g))
        .map(|(g, versions)| {
            // Versions in preference order: client-go takes the first as preferred.
            let versions: Vec<Value> = versions.iter().filter_map(|v| version_doc(reg, g, v)).collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// One `APIVersionDiscovery`: the legacy `APIResourceList` of that group/version regrouped,
/// subresources (`servers/status`) under their resource.
fn version_doc(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let legacy = reg.api_resource_list(group, version)?;
    let entries = legacy["resources"].as_array().cloned().unwrap_or_default();
    let mut resources: Vec<Value> = vec![];
    for r in entries.iter().filter(|r| !r["name"].as_str().unwrap_or_default().contains('/')) {
        let name = r["name"].as_str().unwrap_or_default();
        let kind = r["kind"].as_str().unwrap_or_default();
        let mut doc = json!({
            "resource": name,
            "responseKind": {"group": group, "version": version, "kind": kind},
            "scope": if r["namespaced"].as_bool() == Some(true) { "Namespaced" } else { "Cluster" },
            "singularResource": r["singularName"].as_str().filter(|s| !s.is_empty()).map(str::to_string)
                .unwrap_or_else(|| kind.to_lowercase()),
            "verbs": r["verbs"].clone(),
        });
        for field in ["shortNames", "categories"] {
            if r.get(field).is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
                doc[field] = r[field].clone();
            }
        }
        let prefix = format!("{name}/");
        let subresources: Vec<Value> = entries
            .iter()
            .filter_map(|s| {
                let sub = s["name"].as_str()?.strip_prefix(&prefix)?;
                Some(json!({
                    "subresource": sub,
                    "responseKind": {"group": s["group"].as_str().unwrap_or(group), "version": s["version"].as_str().unwrap_or(version),
                        "kind": s["kind"].as_str().unwrap_or(kind)},
                    "verbs": s["verbs"].clone(),
                }))
            })
            .collect();
        if !subresources.is_empty() {
            doc["subresources"] = json!(subresources);
        }
        resources.push(doc);
    }
    Some(json!({"version": version, "resources": resources, "freshness": "Current"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_the_order_sent() {
        // client-go discovery_client.go: acceptDiscoveryFormats = AcceptV2 + "," + AcceptV1.
        assert!(wants_aggregated("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"));
        // AcceptV2NoPeer first (newer client-go).
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(wants_aggregated("application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io"));
        assert!(!wants_aggregated("application/json"));
        assert!(!wants_aggregated(""));
        assert!(!wants_aggregated("application/json,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"));
        // v2beta1 is no longer served: fall through to legacy JSON.
        assert!(!wants_aggregated("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"));
    }

    #[test]
    fn aggregated_matches_legacy() {
        let reg = Registry::build(&[]);
        let core = core(&reg);
        assert_eq!(core["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(core["items"][0]["metadata"]["name"], "");
        let v1 = &core["items"][0]["versions"][0];
        assert_eq!(v1["version"], "v1");
        let ns = v1["resources"].as_array().into_iter().flatten().find(|r| r["resource"] == "namespaces").cloned().unwrap_or_default();
        assert_eq!(ns["scope"], "Cluster");
        assert_eq!(ns["responseKind"], json!({"group": "", "version": "v1", "kind": "Namespace"}));
        assert_eq!(ns["subresources"][0]["subresource"], "status");
        // A subresource of another kind (Scale) names its own group and version.
        let apps = apis(&reg);
        let deploy = apps["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["metadata"]["name"] == "apps")
            .flat_map(|g| g["versions"][0]["resources"].as_array().cloned().unwrap_or_default())
            .find(|r| r["resource"] == "deployments")
            .unwrap_or_default();
        let scale =
            deploy["subresources"].as_array().into_iter().flatten().find(|s| s["subresource"] == "scale").cloned().unwrap_or_default();
        assert_eq!(scale["responseKind"], json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}), "{deploy}");
        assert_eq!(scale["verbs"], json!(["get", "patch", "update"]));
        let apis = apis(&reg);
        let names: Vec<&str> = apis["items"].as_array().into_iter().flatten().filter_map(|i| i["metadata"]["name"].as_str()).collect();
        let legacy: Vec<String> = reg.api_group_list()["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["name"].as_str().map(str::to_string))
            .collect();
        assert_eq!(names, legacy);
    }
}
