//! Bootstrap RBAC policy (created on start when missing, as kube-apiserver's
//! `rbac/bootstrap-roles` post-start hook does) and the ClusterRole aggregation loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::access::CLUSTERROLES;
use super::identity::{AUTHENTICATED, MASTERS};
use super::rbac::{GROUP, PolicyRule};
use crate::objects::{ObjectWriter, WriteOptions};

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
}

fn rw() -> Vec<&'static str> {
    READ.iter().chain(WRITE).copied().collect()
}

fn meta(name: &str, labels: &[(&str, &str)]) -> Value {
    let mut l: BTreeMap<&str, &str> = labels.iter().copied().collect();
    l.insert("kubernetes.io/bootstrapping", "rbac-defaults");
    json!({"name": name, "labels": l, "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
}

fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({"apiVersion": format!("{GROUP}/v1"), "kind": "ClusterRole", "metadata": meta(name, labels), "rules": rules})
}

fn aggregated(name: &str, labels: &[(&str, &str)], selector_label: &str) -> Value {
    let mut v = cluster_role(name, labels, vec![]);
    v["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {selector_label: "true"}}]});
    v
}

fn binding(name: &str, role: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups.iter().map(|g| json!({"kind": "Group", "apiGroup": GROUP, "name": g})).collect();
    json!({
        "apiVersion": format!("{GROUP}/v1"), "kind": "ClusterRoleBinding", "metadata": meta(name, &[]),
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role}, "subjects": subjects,
    })
}

/// The bootstrap ClusterRoles, as upstream's bootstrappolicy (the kinds this server may serve,
/// plus upstream's entries for kinds it does not, so roles read the same as on a cluster).
#[allow(clippy::too_many_lines, reason = "a data table: one entry per bootstrap role, as upstream lists them")]
pub fn cluster_roles() -> Vec<Value> {
    let to_admin = ("rbac.authorization.k8s.io/aggregate-to-admin", "true");
    let to_edit = ("rbac.authorization.k8s.io/aggregate-to-edit", "true");
    let to_view = ("rbac.authorization.k8s.io/aggregate-to-view", "true");
    vec![
        cluster_role("cluster-admin", &[], vec![rule(&["*"], &["*"], &["*"]), json!({"verbs": ["*"], "nonResourceURLs": ["*"]})]),
        aggregated("admin", &[], to_admin.0),
        aggregated("edit", &[to_admin], to_edit.0),
        aggregated("view", &[to_edit], to_view.0),
        cluster_role(
            "system:aggregate-to-admin",
            &[to_admin],
            vec![
                rule(&["create"], &["authorization.k8s.io"], &["localsubjectaccessreviews"]),
                rule(&rw(), &[GROUP], &["rolebindings", "roles"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[to_edit],
            vec![
                rule(READ, &[""], &["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"]),
                rule(&["impersonate"], &[""], &["serviceaccounts"]),
                rule(WRITE, &[""], &["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"]),
                rule(&["create"], &[""], &["pods/eviction"]),
                rule(
                    WRITE,
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                ),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
                rule(
                    WRITE,
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                ),
                rule(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                rule(WRITE, &["batch"], &["cronjobs", "jobs"]),
                rule(WRITE, &["policy"], &["poddisruptionbudgets"]),
                rule(WRITE, &["networking.k8s.io"], &["ingresses", "networkpolicies"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[to_view],
            vec![
                rule(
                    READ,
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                ),
                rule(
                    READ,
                    &[""],
                    &[
                        "bindings",
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                ),
                rule(READ, &[""], &["namespaces"]),
                rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
                rule(
                    READ,
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                ),
                rule(READ, &["autoscaling"], &["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
                rule(READ, &["batch"], &["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
                rule(READ, &["policy"], &["poddisruptionbudgets", "poddisruptionbudgets/status"]),
                rule(READ, &["networking.k8s.io"], &["ingresses", "ingresses/status", "networkpolicies"]),
                rule(READ, &["events.k8s.io"], &["events"]),
            ],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![
                json!({"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"]}),
            ],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(&["create"], &["authorization.k8s.io"], &["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
                rule(&["create"], &["authentication.k8s.io"], &["selfsubjectreviews"]),
            ],
        ),
        cluster_role(
            "system:service-account-issuer-discovery",
            &[],
            vec![
                json!({"verbs": ["get"], "nonResourceURLs": ["/.well-known/openid-configuration", "/.well-known/openid-configuration/", "/openid/v1/jwks", "/openid/v1/jwks/"]}),
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]})],
        ),
    ]
}

/// The bootstrap ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<Value> {
    vec![
        binding("cluster-admin", "cluster-admin", &[MASTERS]),
        binding("system:discovery", "system:discovery", &[AUTHENTICATED]),
        binding("system:basic-user", "system:basic-user", &[AUTHENTICATED]),
        binding("system:service-account-issuer-discovery", "system:service-account-issuer-discovery", &["system:serviceaccounts"]),
        binding("system:public-info-viewer", "system:public-info-viewer", &[AUTHENTICATED, "system:unauthenticated"]),
    ]
}

/// What an existing bootstrap object lacks of its default, as upstream's reconciliation on start
/// does for objects annotated `rbac.authorization.kubernetes.io/autoupdate: "true"`: missing
/// rules (roles) or subjects (bindings) are added, nothing a user added is removed. None when
/// nothing is missing or the user turned autoupdate off.
pub fn reconciled(existing: &Value, default: &Value) -> Option<Value> {
    if existing["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"].as_str() == Some("false") {
        return None;
    }
    let field = if default.get("subjects").is_some() { "subjects" } else { "rules" };
    // Aggregated roles get their rules from the aggregation loop.
    if field == "rules" && default.get("aggregationRule").is_some() {
        return None;
    }
    let have: Vec<Value> = existing[field].as_array().cloned().unwrap_or_default();
    let missing: Vec<Value> = default[field]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| {
            if field == "rules" {
                let d = PolicyRule::from_value(d);
                !have.iter().any(|h| PolicyRule::from_value(h) == d)
            } else {
                !have.iter().any(|h| h["kind"] == d["kind"] && h["name"] == d["name"])
            }
        })
        .cloned()
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut out = existing.clone();
    out[field] = Value::Array(have.into_iter().chain(missing).collect());
    Some(out)
}

/// Creates every bootstrap object that does not exist and adds what upstream's reconciliation
/// would add to existing ones ([`reconciled`]). A no-op while the RBAC kinds are not served.
pub async fn ensure(objects: &impl ObjectWriter) -> anyhow::Result<()> {
    let reg = objects.registry();
    let opts = WriteOptions { field_manager: "provisioning-apiserver".into(), ..Default::default() };
    for (plural, objs) in [("clusterroles", cluster_roles()), ("clusterrolebindings", cluster_role_bindings())] {
        let Some(rt) = reg.get(GROUP, "v1", plural) else { return Ok(()) };
        for obj in objs {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if let Ok(cur) = objects.get(&rt, None, &name) {
                if let Some(new) = reconciled(&cur.value(), &obj)
                    && let Err(e) = objects.update(&rt, None, &name, new, false, &opts).await
                {
                    tracing::warn!(%name, error = %e, "could not add the default rules to bootstrap {plural}");
                }
                continue;
            }
            if let Err(e) = objects.create(&rt, None, obj, &opts).await
                && e.code != 409
            {
                anyhow::bail!("creating bootstrap {plural} {name}: {e}");
            }
        }
    }
    Ok(())
}

/// Whether `labels` satisfy a metav1 LabelSelector given as JSON. An empty selector matches
/// everything; an unknown operator matches nothing (as a selector that fails to parse).
pub fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    if let Some(m) = selector["matchLabels"].as_object() {
        for (k, v) in m {
            if labels.get(k).map(String::as_str) != v.as_str() {
                return false;
            }
        }
    }
    for e in selector["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let have = labels.get(key).map(String::as_str);
        let ok = match e["operator"].as_str() {
            Some("In") => have.is_some_and(|h| values.contains(&h)),
            Some("NotIn") => !have.is_some_and(|h| values.contains(&h)),
            Some("Exists") => have.is_some(),
            Some("DoesNotExist") => have.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// The rules an aggregated ClusterRole should have: the union, in name order, of the rules of
/// every other ClusterRole selected by its `aggregationRule` (kube's aggregation controller).
pub fn aggregate_rules(role: &Value, all: &[(String, BTreeMap<String, String>, Value)]) -> Option<Vec<Value>> {
    let selectors = role["aggregationRule"]["clusterRoleSelectors"].as_array()?;
    let own = role["metadata"]["name"].as_str().unwrap_or_default();
    let mut rules: Vec<PolicyRule> = vec![];
    for (name, labels, obj) in all {
        if name == own || !selectors.iter().any(|s| selector_matches(s, labels)) {
            continue;
        }
        for r in obj["rules"].as_array().into_iter().flatten() {
            let r = PolicyRule::from_value(r);
            if !rules.contains(&r) {
                rules.push(r);
            }
        }
    }
    Some(rules.iter().map(PolicyRule::to_value).collect())
}

/// One pass of the aggregation controller; returns how many ClusterRoles it updated.
pub async fn aggregate_once(objects: &impl ObjectWriter) -> usize {
    let reg = objects.registry();
    let Some(rt) = reg.get(GROUP, "v1", "clusterroles") else { return 0 };
    let all: Vec<(String, BTreeMap<String, String>, Value)> = {
        let st = objects.store().read();
        st.objects
            .get(rt.storage.as_str())
            .map(|m| m.values().map(|e| (e.key.name.clone(), e.labels.clone(), e.value())).collect())
            .unwrap_or_default()
    };
    let opts = WriteOptions { field_manager: "clusterrole-aggregation-controller".into(), ..Default::default() };
    let mut updated = 0;
    for (name, _, obj) in &all {
        let Some(rules) = aggregate_rules(obj, &all) else { continue };
        let current: Vec<Value> = obj["rules"].as_array().cloned().unwrap_or_default();
        let same = current.len() == rules.len()
            && current.iter().map(PolicyRule::from_value).zip(rules.iter().map(PolicyRule::from_value)).all(|(a, b)| a == b);
        if same {
            continue;
        }
        let mut new = obj.clone();
        new["rules"] = json!(rules);
        match objects.update(&rt, None, name, new, false, &opts).await {
            Ok(_) => updated += 1,
            // A concurrent write: the next pass sees it and tries again.
            Err(e) => tracing::debug!(clusterrole = %name, error = %e, "aggregation update deferred"),
        }
    }
    updated
}

/// Keeps aggregated ClusterRoles up to date until shutdown: a pass after every change to the
/// store (debounced), and one every 30 s in case a pass lost a race.
pub async fn run_aggregation(objects: Arc<impl ObjectWriter>, shutdown: CancellationToken) {
    let mut changes = objects.store().subscribe();
    let mut last: Option<(usize, u64)> = None;
    loop {
        // Only ClusterRole changes matter: skip the pass when their count and newest revision
        // are what the last pass saw (cheap, so heavy write load elsewhere costs nothing).
        let fp = {
            let st = objects.store().read();
            st.objects.get(CLUSTERROLES).map(|m| (m.len(), m.values().map(|e| e.rv).max().unwrap_or(0)))
        };
        if fp != last || fp.is_none() {
            aggregate_once(&*objects).await;
            last = fp;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        // Coalesce bursts of writes into one pass.
        tokio::time::sleep(Duration::from_millis(50)).await;
        changes.borrow_and_update();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(v: &Value) -> BTreeMap<String, String> {
        v["metadata"]["labels"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
            .unwrap_or_default()
    }

    #[test]
    fn view_edit_admin_aggregate_like_upstream() {
        let mut roles = cluster_roles();
        roles.push(json!({"metadata": {"name": "provisioning-view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [{"verbs": ["get", "list", "watch"], "apiGroups": ["provisioning.dev"], "resources": ["servers"]}]}));
        let all: Vec<(String, BTreeMap<String, String>, Value)> =
            roles.iter().map(|r| (r["metadata"]["name"].as_str().unwrap_or_default().to_string(), labels(r), r.clone())).collect();
        let find = |n: &str| all.iter().find(|(name, _, _)| name == n).map(|(_, _, v)| v.clone()).unwrap_or_default();
        let view = aggregate_rules(&find("view"), &all).unwrap_or_default();
        assert!(view.iter().any(|r| r["apiGroups"] == json!(["provisioning.dev"])), "{view:?}");
        // edit aggregates view's source roles only through labels: view itself carries
        // aggregate-to-edit, so edit picks up view's (stored, aggregated) rules once view has them.
        let edit = aggregate_rules(&find("edit"), &all).unwrap_or_default();
        assert!(edit.iter().any(|r| r["resources"] == json!(["serviceaccounts/token"])));
        assert!(aggregate_rules(&find("cluster-admin"), &all).is_none());
    }

    #[test]
    fn reconciliation_adds_missing_defaults_only() {
        let default = cluster_roles().into_iter().find(|r| r["metadata"]["name"] == "system:basic-user").unwrap_or_default();
        let mut existing = default.clone();
        existing["rules"] = json!([{"verbs": ["get"], "nonResourceURLs": ["/custom"]}]);
        let new = reconciled(&existing, &default).unwrap_or_default();
        assert_eq!(new["rules"].as_array().map(Vec::len), Some(3), "user rule kept, two defaults added");
        assert!(reconciled(&new, &default).is_none());
        existing["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] = json!("false");
        assert!(reconciled(&existing, &default).is_none());
        let b = cluster_role_bindings().into_iter().next().unwrap_or_default();
        let mut eb = b.clone();
        eb["subjects"] = json!([]);
        assert_eq!(reconciled(&eb, &b).map(|v| v["subjects"].clone()), Some(b["subjects"].clone()));
    }

    #[test]
    fn selectors() {
        let l: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into_iter().collect();
        assert!(selector_matches(&json!({}), &l));
        assert!(selector_matches(&json!({"matchLabels": {"a": "1"}}), &l));
        assert!(!selector_matches(&json!({"matchLabels": {"a": "2"}}), &l));
        assert!(selector_matches(&json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}), &l));
        assert!(selector_matches(&json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}), &l));
        assert!(!selector_matches(&json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}), &l));
    }
}
