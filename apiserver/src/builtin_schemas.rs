//! OpenAPI schemas of the built-in kinds, generated from the k8s-openapi types (schemars,
//! OpenAPI 3 settings) under their upstream definition names (`io.k8s.api.apps.v1.Deployment`).
//!
//! k8s-openapi's schemas carry neither `x-kubernetes-group-version-kind` nor the list and
//! patch extensions, so both are added here: the list ones from a table copied from the
//! upstream type tags (`+listType`, `+listMapKey`, `patchStrategy`, `patchMergeKey`) for the
//! fields the served kinds use. Server-side apply merges lists per key from these, and
//! kubectl's strategic merge patch reads the patch extensions.
//!
//! Validation needs one self-contained schema per kind: [`structural`] inlines every `$ref`
//! (a recursive reference becomes an object that keeps unknown fields).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// Where definitions live in an OpenAPI v3 document.
pub const REF_PREFIX: &str = "#/components/schemas/";

/// Every definition plus the definition name of each built-in kind.
#[derive(Debug)]
pub struct BuiltinSchemas {
    /// Definition name -> schema (with `$ref`s into this same map).
    pub definitions: Map<String, Value>,
    /// (group, version, kind) -> definition name.
    pub kinds: BTreeMap<(String, String, String), String>,
    structural: BTreeMap<String, Value>,
}

static SCHEMAS: OnceLock<BuiltinSchemas> = OnceLock::new();

/// The schemas, generated once per process.
pub fn get() -> &'static BuiltinSchemas {
    SCHEMAS.get_or_init(generate)
}

/// The definition name of a built-in kind.
pub fn definition_name(group: &str, version: &str, kind: &str) -> Option<&'static str> {
    get().kinds.get(&(group.to_string(), version.to_string(), kind.to_string())).map(String::as_str)
}

/// The self-contained (inlined) schema of a built-in kind, used for validation and
/// server-side apply.
pub fn structural(group: &str, version: &str, kind: &str) -> Option<Value> {
    let name = definition_name(group, version, kind)?;
    get().structural.get(name).cloned()
}

/// `name` and every definition it reaches through `$ref`, into `out`.
pub fn closure(name: &str, out: &mut Map<String, Value>) {
    let defs = &get().definitions;
    let mut todo = vec![name.to_string()];
    while let Some(n) = todo.pop() {
        if out.contains_key(&n) {
            continue;
        }
        let Some(s) = defs.get(&n) else { continue };
        collect_refs(s, &mut todo);
        out.insert(n, s.clone());
    }
}

fn collect_refs(v: &Value, todo: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    if let Some(n) = x.as_str().and_then(|r| r.strip_prefix(REF_PREFIX)) {
                        todo.push(n.to_string());
                    }
                } else {
                    collect_refs(x, todo);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, todo)),
        _ => {}
    }
}

struct Kind {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    add: fn(&mut schemars::SchemaGenerator) -> String,
}

fn add<T: JsonSchema>(g: &mut schemars::SchemaGenerator) -> String {
    // subschema_for registers T under its schema name and returns a reference to it.
    let _ = g.subschema_for::<T>();
    T::schema_name().into_owned()
}

fn kinds() -> Vec<Kind> {
    let k = |group, version, kind, add| Kind { group, version, kind, add };
    vec![
        k("", "v1", "Namespace", add::<api::core::v1::Namespace>),
        k("", "v1", "Secret", add::<api::core::v1::Secret>),
        k("", "v1", "ConfigMap", add::<api::core::v1::ConfigMap>),
        k("", "v1", "Event", add::<api::core::v1::Event>),
        k("", "v1", "ServiceAccount", add::<api::core::v1::ServiceAccount>),
        k("", "v1", "Service", add::<api::core::v1::Service>),
        k("events.k8s.io", "v1", "Event", add::<api::events::v1::Event>),
        k("coordination.k8s.io", "v1", "Lease", add::<api::coordination::v1::Lease>),
        k("apiextensions.k8s.io", "v1", "CustomResourceDefinition", add::<apiext::CustomResourceDefinition>),
        k("apps", "v1", "Deployment", add::<api::apps::v1::Deployment>),
        k("rbac.authorization.k8s.io", "v1", "Role", add::<api::rbac::v1::Role>),
        k("rbac.authorization.k8s.io", "v1", "ClusterRole", add::<api::rbac::v1::ClusterRole>),
        k("rbac.authorization.k8s.io", "v1", "RoleBinding", add::<api::rbac::v1::RoleBinding>),
        k("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", add::<api::rbac::v1::ClusterRoleBinding>),
        k("policy", "v1", "PodDisruptionBudget", add::<api::policy::v1::PodDisruptionBudget>),
        k("networking.k8s.io", "v1", "NetworkPolicy", add::<api::networking::v1::NetworkPolicy>),
        k("", "v1", "Pod", add::<api::core::v1::Pod>),
        k("", "v1", "Node", add::<api::core::v1::Node>),
        k("", "v1", "PersistentVolumeClaim", add::<api::core::v1::PersistentVolumeClaim>),
        k("", "v1", "PersistentVolume", add::<api::core::v1::PersistentVolume>),
        k("", "v1", "Endpoints", add::<api::core::v1::Endpoints>),
        k("", "v1", "ResourceQuota", add::<api::core::v1::ResourceQuota>),
        k("", "v1", "LimitRange", add::<api::core::v1::LimitRange>),
        k("apps", "v1", "ReplicaSet", add::<api::apps::v1::ReplicaSet>),
        k("apps", "v1", "StatefulSet", add::<api::apps::v1::StatefulSet>),
        k("apps", "v1", "DaemonSet", add::<api::apps::v1::DaemonSet>),
        k("batch", "v1", "Job", add::<api::batch::v1::Job>),
        k("batch", "v1", "CronJob", add::<api::batch::v1::CronJob>),
        k("discovery.k8s.io", "v1", "EndpointSlice", add::<api::discovery::v1::EndpointSlice>),
    ]
}

/// List semantics as upstream tags them: (definition, property, list type, map keys,
/// patch strategy, patch merge key).
type ListTag = (&'static str, &'static str, &'static str, &'static [&'static str], Option<&'static str>, Option<&'static str>);

const LIST_TAGS: &[ListTag] = &[
    ("io.k8s.api.core.v1.PodSpec", "containers", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "initContainers", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "ephemeralContainers", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "volumes", "map", &["name"], Some("merge,retainKeys"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "imagePullSecrets", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", "map", &["ip"], Some("merge"), Some("ip")),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        "map",
        &["topologyKey", "whenUnsatisfiable"],
        Some("merge"),
        Some("topologyKey"),
    ),
    ("io.k8s.api.core.v1.PodSpec", "resourceClaims", "map", &["name"], Some("merge,retainKeys"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "schedulingGates", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.PodSpec", "tolerations", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.PodSpec", "readinessGates", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.Container", "ports", "map", &["containerPort", "protocol"], Some("merge"), Some("containerPort")),
    ("io.k8s.api.core.v1.Container", "env", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.Container", "volumeMounts", "map", &["mountPath"], Some("merge"), Some("mountPath")),
    ("io.k8s.api.core.v1.Container", "volumeDevices", "map", &["devicePath"], Some("merge"), Some("devicePath")),
    ("io.k8s.api.core.v1.Container", "args", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.Container", "command", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.Container", "envFrom", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.Container", "resizePolicy", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.Capabilities", "add", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.Capabilities", "drop", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.PodSecurityContext", "supplementalGroups", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.PodSecurityContext", "sysctls", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.ServiceSpec", "ports", "map", &["port", "protocol"], Some("merge"), Some("port")),
    ("io.k8s.api.core.v1.ServiceSpec", "externalIPs", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.ServiceSpec", "clusterIPs", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.ServiceSpec", "ipFamilies", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.ServiceSpec", "loadBalancerSourceRanges", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.ServiceAccount", "secrets", "map", &["name"], Some("merge"), Some("name")),
    ("io.k8s.api.core.v1.ServiceAccount", "imagePullSecrets", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.NamespaceStatus", "conditions", "map", &["type"], Some("merge"), Some("type")),
    ("io.k8s.api.core.v1.NamespaceSpec", "finalizers", "atomic", &[], None, None),
    ("io.k8s.api.core.v1.ServiceStatus", "conditions", "map", &["type"], Some("merge"), Some("type")),
    ("io.k8s.api.apps.v1.DeploymentStatus", "conditions", "map", &["type"], Some("merge"), Some("type")),
    ("io.k8s.api.policy.v1.PodDisruptionBudgetStatus", "conditions", "map", &["type"], Some("merge"), Some("type")),
    ("io.k8s.api.rbac.v1.Role", "rules", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.ClusterRole", "rules", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.RoleBinding", "subjects", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.ClusterRoleBinding", "subjects", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.AggregationRule", "clusterRoleSelectors", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.PolicyRule", "verbs", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.PolicyRule", "apiGroups", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.PolicyRule", "resources", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.PolicyRule", "resourceNames", "atomic", &[], None, None),
    ("io.k8s.api.rbac.v1.PolicyRule", "nonResourceURLs", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicySpec", "ingress", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicySpec", "egress", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicySpec", "policyTypes", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicyIngressRule", "ports", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicyIngressRule", "from", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicyEgressRule", "ports", "atomic", &[], None, None),
    ("io.k8s.api.networking.v1.NetworkPolicyEgressRule", "to", "atomic", &[], None, None),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector", "matchExpressions", "atomic", &[], None, None),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement", "values", "atomic", &[], None, None),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers", "set", &[], Some("merge"), None),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "ownerReferences", "map", &["uid"], Some("merge"), Some("uid")),
];

/// Defaults upstream publishes in its OpenAPI (`+default` markers) that matter here: list-map
/// keys, so that server-side apply of a port without `protocol` finds the stored one.
const DEFAULTS: &[(&str, &str, &str)] =
    &[("io.k8s.api.core.v1.ContainerPort", "protocol", "TCP"), ("io.k8s.api.core.v1.ServicePort", "protocol", "TCP")];

/// Definitions upstream marks `x-kubernetes-map-type: atomic` (replaced whole by apply).
const ATOMIC_STRUCTS: &[&str] = &[
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "io.k8s.api.core.v1.NodeSelector",
    "io.k8s.api.core.v1.NodeSelectorTerm",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.ResourceFieldSelector",
    "io.k8s.api.core.v1.TypedLocalObjectReference",
    "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
    "io.k8s.api.rbac.v1.RoleRef",
];

fn generate() -> BuiltinSchemas {
    let mut g = SchemaSettings::openapi3().into_generator();
    let mut kinds = BTreeMap::new();
    for k in self::kinds() {
        let name = (k.add)(&mut g);
        kinds.insert((k.group.to_string(), k.version.to_string(), k.kind.to_string()), name);
    }
    let mut definitions = g.take_definitions(true);
    for ((group, version, kind), name) in &kinds {
        if let Some(m) = definitions.get_mut(name).and_then(Value::as_object_mut) {
            m.insert("x-kubernetes-group-version-kind".into(), json!([{"group": group, "version": version, "kind": kind}]));
        }
    }
    for (def, prop, list_type, keys, strategy, merge_key) in LIST_TAGS {
        let Some(p) =
            definitions.get_mut(*def).and_then(|d| d.get_mut("properties")).and_then(|p| p.get_mut(*prop)).and_then(Value::as_object_mut)
        else {
            continue;
        };
        p.insert("x-kubernetes-list-type".into(), json!(list_type));
        if !keys.is_empty() {
            p.insert("x-kubernetes-list-map-keys".into(), json!(keys));
        }
        if let Some(s) = strategy {
            p.insert("x-kubernetes-patch-strategy".into(), json!(s));
        }
        if let Some(k) = merge_key {
            p.insert("x-kubernetes-patch-merge-key".into(), json!(k));
        }
    }
    for (def, prop, value) in DEFAULTS {
        if let Some(p) =
            definitions.get_mut(*def).and_then(|d| d.get_mut("properties")).and_then(|p| p.get_mut(*prop)).and_then(Value::as_object_mut)
        {
            p.insert("default".into(), json!(value));
        }
    }
    for def in ATOMIC_STRUCTS {
        if let Some(m) = definitions.get_mut(*def).and_then(Value::as_object_mut) {
            m.insert("x-kubernetes-map-type".into(), json!("atomic"));
        }
    }
    let mut structural = BTreeMap::new();
    for name in kinds.values() {
        if let Some(s) = definitions.get(name) {
            let mut stack = vec![name.clone()];
            structural.insert(name.clone(), inline(s, &definitions, &mut stack));
        }
    }
    BuiltinSchemas { definitions, kinds, structural }
}

/// Resolves every `$ref` (directly or as a one-element `allOf`), keeping the referring
/// schema's own keywords, except a `default` next to a `$ref` (upstream writes `default: {}`
/// there, which would make every optional struct appear); marks schemas that say nothing about their
/// fields as keeping unknown fields (free-form JSON such as RawExtension).
fn inline(s: &Value, defs: &Map<String, Value>, stack: &mut Vec<String>) -> Value {
    let Some(m) = s.as_object() else {
        return s.clone();
    };
    let target = m.get("$ref").and_then(Value::as_str).or_else(|| {
        m.get("allOf").and_then(Value::as_array).filter(|a| a.len() == 1).and_then(|a| a[0].get("$ref")).and_then(Value::as_str)
    });
    if let Some(r) = target {
        let name = r.strip_prefix(REF_PREFIX).unwrap_or(r).to_string();
        let mut resolved = if stack.contains(&name) {
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
        } else if let Some(d) = defs.get(&name) {
            stack.push(name);
            let v = inline(d, defs, stack);
            stack.pop();
            v
        } else {
            json!({"x-kubernetes-preserve-unknown-fields": true})
        };
        if let Some(rm) = resolved.as_object_mut() {
            for (k, v) in m {
                if !matches!(k.as_str(), "$ref" | "allOf" | "default") {
                    rm.insert(k.clone(), inline(v, defs, stack));
                }
            }
        }
        return resolved;
    }
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "properties" => {
                let props: Map<String, Value> =
                    v.as_object().into_iter().flatten().map(|(pk, pv)| (pk.clone(), inline(pv, defs, stack))).collect();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" | "additionalProperties" if v.is_object() => {
                out.insert(k.clone(), inline(v, defs, stack));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    let free_form = !out.contains_key("properties")
        && !out.contains_key("additionalProperties")
        && !out.contains_key("x-kubernetes-int-or-string")
        && matches!(out.get("type").and_then(Value::as_str), Some("object") | None);
    if free_form {
        out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_schema_has_upstream_names_and_list_tags() {
        assert_eq!(definition_name("apps", "v1", "Deployment"), Some("io.k8s.api.apps.v1.Deployment"));
        assert_eq!(definition_name("rbac.authorization.k8s.io", "v1", "Role"), Some("io.k8s.api.rbac.v1.Role"));
        let mut defs = Map::new();
        closure("io.k8s.api.apps.v1.Deployment", &mut defs);
        assert!(defs.contains_key("io.k8s.api.core.v1.PodTemplateSpec"));
        assert!(defs.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
        let pod = &defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(pod["x-kubernetes-list-type"], "map");
        assert_eq!(pod["x-kubernetes-patch-merge-key"], "name");
        let s = structural("apps", "v1", "Deployment").unwrap_or_default();
        let containers = &s["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]["containers"];
        assert_eq!(containers["type"], "array");
        assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
        assert_eq!(containers["items"]["properties"]["image"]["type"], "string");
        assert!(!s.to_string().contains("$ref"));
    }
}
