//! API types of Provisioning: `provisioning.dev/v1alpha1` Workspace, Server, TaskServ,
//! Cluster, and ChangeRecord (the history the controller writes). Types only (serde + schemars + kube derive); the CRD YAML in `deploy/crds/` is
//! generated from them by `provisioning crds`.
//!
//! Workspace, Server, TaskServ and Cluster are also served as `v1beta1` with the same schema
//! (docs/upgrade.md): the CRDs list both versions, `v1alpha1` stays the storage version and
//! conversion is `None` (only `apiVersion` changes between them).

// kube's `#[kube(printcolumn(name = .., type_ = .., json_path = ..))]` repeats the same keys per
// column by design; clippy reads each repetition as a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

mod changerecord;
mod cluster;
mod common;
mod cost;
mod disk;
mod plan;
mod server;
mod taskserv;
mod workspace;

pub use changerecord::*;
pub use cluster::*;
pub use common::*;
pub use cost::*;
pub use disk::*;
pub use plan::*;
pub use server::*;
pub use taskserv::*;
pub use workspace::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of every kind.
pub const GROUP: &str = "provisioning.dev";
/// API version of every kind, and the storage version of every CRD.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "provisioning.dev/v1alpha1";
/// The second served version of Workspace, Server, TaskServ and Cluster: the same schema as
/// [`VERSION`] (conversion strategy `None`); not the storage version yet, so that a rollback to
/// a release without it finds every object stored at a version it serves (docs/upgrade.md).
pub const BETA_VERSION: &str = "v1beta1";
/// Kinds served at [`BETA_VERSION`] as well (ChangeRecord, written only by the controller,
/// stays `v1alpha1` only).
pub const BETA_KINDS: [&str; 4] = ["Workspace", "Server", "TaskServ", "Cluster"];

/// The `apiVersion` a client resolves `kind` to by default: discovery's preferred version,
/// [`BETA_VERSION`] for the [`BETA_KINDS`] (the API server lists a CRD's versions by priority,
/// beta before alpha), else [`API_VERSION`]. Events name their object at it, because
/// `kubectl events --for server/NAME` selects `involvedObject.apiVersion` at that version.
pub fn preferred_api_version(kind: &str) -> &'static str {
    if BETA_KINDS.contains(&kind) { "provisioning.dev/v1beta1" } else { API_VERSION }
}

/// All CustomResourceDefinitions, in a stable order.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![Workspace::crd(), Server::crd(), TaskServ::crd(), Cluster::crd(), ChangeRecord::crd()]
        .into_iter()
        .map(|crd| {
            // Fall back to the CRD as derived if the round trip ever failed (it cannot: same type).
            let Ok(mut v) = serde_json::to_value(&crd) else { return crd };
            unwrap_descriptions(&mut v);
            add_beta_version(&mut v);
            serde_json::from_value(v).unwrap_or(crd)
        })
        .collect()
}

/// Serves a [`BETA_KINDS`] CRD at [`BETA_VERSION`] too: a copy of its `v1alpha1` entry (schema,
/// printer columns, subresources), served and not stored, listed after it; conversion `None`
/// (written out, as upstream defaults it): identical schemas need no webhook.
fn add_beta_version(crd: &mut serde_json::Value) {
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
    if !BETA_KINDS.contains(&kind) {
        return;
    }
    let Some(versions) = crd["spec"]["versions"].as_array_mut() else { return };
    let Some(mut beta) = versions.iter().find(|v| v["name"] == VERSION).cloned() else { return };
    beta["name"] = serde_json::json!(BETA_VERSION);
    beta["storage"] = serde_json::json!(false);
    beta["served"] = serde_json::json!(true);
    versions.push(beta);
    crd["spec"]["conversion"] = serde_json::json!({"strategy": "None"});
}

/// Doc comments are wrapped at the source's line width; `kubectl explain` wraps descriptions
/// itself, so a line break inside a paragraph shows up as a broken line. Joins the lines of a
/// paragraph; keeps blank lines and list items (`- `, `* `).
fn unwrap_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match x {
                    serde_json::Value::String(s) if k == "description" => *s = unwrap_paragraphs(s),
                    _ => unwrap_descriptions(x),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

fn unwrap_paragraphs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split('\n') {
        let item = line.trim_start().starts_with("- ") || line.trim_start().starts_with("* ");
        if !out.is_empty() {
            let breaks = line.trim().is_empty() || out.ends_with('\n') || item;
            out.push(if breaks { '\n' } else { ' ' });
        }
        out.push_str(if line.trim().is_empty() { "" } else { line.trim_end() });
    }
    out
}

/// All CRDs as one multi-document YAML stream (what `provisioning crds` prints).
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_have_names_categories_and_status() {
        for crd in all_crds() {
            let names = &crd.spec.names;
            assert!(names.short_names.as_ref().is_some_and(|s| !s.is_empty()), "{} has a short name", names.kind);
            assert_eq!(names.categories.as_deref(), Some(&["provisioning".to_string()][..]));
            let version = &crd.spec.versions[0];
            assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
            let cols: Vec<_> =
                version.additional_printer_columns.as_ref().map(|c| c.iter().map(|c| c.name.clone()).collect()).unwrap_or_default();
            for required in ["Phase", "Ready", "Age"] {
                assert!(cols.iter().any(|c| c == required), "{} lacks column {required}: {cols:?}", names.kind);
            }
        }
    }

    #[test]
    fn descriptions_have_no_line_breaks_inside_a_paragraph() {
        assert_eq!(unwrap_paragraphs("one\ntwo.\n\nthree\n- a\n- b"), "one two.\n\nthree\n- a\n- b");
        let docs: Vec<serde_json::Value> = all_crds().iter().map(|c| serde_json::to_value(c).expect("crds serialise")).collect();
        fn check(v: &serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| {
                    if let (true, Some(s)) = (k == "description", x.as_str()) {
                        for (i, line) in s.split('\n').enumerate().skip(1) {
                            let prev = s.split('\n').nth(i - 1).unwrap_or_default();
                            assert!(line.is_empty() || prev.is_empty() || line.starts_with("- ") || line.starts_with("* "), "{s:?}");
                        }
                    } else {
                        check(x)
                    }
                }),
                serde_json::Value::Array(a) => a.iter().for_each(check),
                _ => {}
            }
        }
        docs.iter().for_each(check);
    }

    #[test]
    fn every_spec_field_has_a_description() {
        fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
            if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
                for (name, sub) in props {
                    let p = format!("{path}.{name}");
                    if sub.get("description").is_none() {
                        missing.push(p.clone());
                    }
                    walk(&p, sub, missing);
                }
            }
            if let Some(items) = schema.get("items") {
                walk(&format!("{path}[]"), items, missing);
            }
        }
        let mut missing = Vec::new();
        for crd in all_crds() {
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serialises");
            let root = &schema["openAPIV3Schema"]["properties"];
            for part in ["spec", "status"] {
                walk(&format!("{}.{part}", crd.spec.names.kind), &root[part], &mut missing);
            }
        }
        // metav1.Condition's own fields are documented by k8s-openapi.
        missing.retain(|m| !m.contains("conditions[]"));
        assert!(missing.is_empty(), "fields without doc comments: {missing:#?}");
    }

    /// Server-side apply merges a list per entry only when the schema says how; every list
    /// of the API says it, except the few whose order or duplicates carry meaning.
    #[test]
    fn lists_declare_their_merge_semantics() {
        fn walk(path: &str, schema: &serde_json::Value, found: &mut Vec<(String, String)>) {
            if schema.get("type").and_then(|t| t.as_str()) == Some("array") {
                let list_type = schema.get("x-kubernetes-list-type").and_then(|t| t.as_str()).unwrap_or("atomic");
                let keys = schema.get("x-kubernetes-list-map-keys").map(|k| k.to_string()).unwrap_or_default();
                found.push((path.to_string(), format!("{list_type}{keys}")));
            }
            if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
                for (name, sub) in props {
                    walk(&format!("{path}.{name}"), sub, found);
                }
            }
            if let Some(items) = schema.get("items") {
                walk(&format!("{path}[]"), items, found);
            }
        }
        let mut found = Vec::new();
        for crd in all_crds() {
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serialises");
            walk(&crd.spec.names.kind, &schema["openAPIV3Schema"], &mut found);
        }
        found.sort();
        let expected = [
            // Most recent writer first: the order is the content.
            ("ChangeRecord.spec.approvals", "atomic"),
            ("ChangeRecord.spec.changedBy", "atomic"),
            ("ChangeRecord.spec.changedFields", "set"),
            ("ChangeRecord.status.conditions", "map[\"type\"]"),
            ("Cluster.spec.dependsOn", "set"),
            ("Cluster.spec.pools", "map[\"name\"]"),
            ("Cluster.spec.pools[].disks", "map[\"name\"]"),
            // Tried in order: the order is the content.
            ("Cluster.spec.pools[].fallbackZones", "atomic"),
            // Members are spread in this order: the order is the content.
            ("Cluster.spec.pools[].zones", "atomic"),
            ("Cluster.spec.taskservs", "map[\"service\"]"),
            // configFrom merges in order: the order is the content.
            ("Cluster.spec.taskservs[].configFrom", "atomic"),
            ("Cluster.spec.taskservs[].pools", "set"),
            ("Cluster.status.approvedPlan.changes", "atomic"),
            ("Cluster.status.conditions", "map[\"type\"]"),
            // Written whole by the controller from what the provider reports.
            ("Cluster.status.controlPlaneEndpoint.targets", "atomic"),
            ("Cluster.status.cost.otherCurrencies", "map[\"currency\"]"),
            ("Cluster.status.plan.changes", "atomic"),
            ("Cluster.status.steps", "map[\"id\"]"),
            ("Cluster.status.taskservs", "map[\"service\"]"),
            // Addresses may repeat a type (two InternalIPs), as on a Node: atomic.
            ("Server.spec.disks", "map[\"name\"]"),
            ("Server.spec.fallbackZones", "atomic"),
            ("Server.status.addresses", "atomic"),
            ("Server.status.conditions", "map[\"type\"]"),
            ("Server.status.disks", "map[\"name\"]"),
            // A plan's changes are listed in the order they are carried out.
            ("Server.status.plan.changes", "atomic"),
            // The order tried is the content.
            ("Server.status.zoneFallback.tried", "atomic"),
            ("TaskServ.spec.configFrom", "atomic"),
            ("TaskServ.spec.dependsOn", "set"),
            ("TaskServ.spec.servers.names", "set"),
            ("TaskServ.status.approvedPlan.changes", "atomic"),
            ("TaskServ.status.conditions", "map[\"type\"]"),
            ("TaskServ.status.plan.changes", "atomic"),
            // Install order: the order is the content.
            ("TaskServ.status.resolvedDependencies", "atomic"),
            ("TaskServ.status.servers", "map[\"name\"]"),
            // Replaced whole by each check: atomic.
            ("TaskServ.status.servers[].driftedFiles", "atomic"),
            ("Workspace.spec.providers", "map[\"name\"]"),
            // Evaluation order is the content (firewall rules); the others are short lists.
            ("Workspace.spec.providers[].firewallRules", "atomic"),
            ("Workspace.spec.providers[].securityGroupIds", "atomic"),
            ("Workspace.spec.providers[].sshSourceCidrs", "atomic"),
            ("Workspace.status.conditions", "map[\"type\"]"),
            ("Workspace.status.cost.otherCurrencies", "map[\"currency\"]"),
            ("Workspace.status.providers", "map[\"name\"]"),
        ];
        let expected: Vec<(String, String)> = expected.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
        assert_eq!(found, expected);
    }

    /// The four kinds list v1alpha1 (storage) then v1beta1 (served) with the same schema,
    /// columns and subresources, conversion None; ChangeRecord stays v1alpha1 only.
    #[test]
    fn beta_versions_are_served_copies_of_the_storage_version() {
        for crd in all_crds() {
            let kind = crd.spec.names.kind.clone();
            let names: Vec<(&str, bool, bool)> = crd.spec.versions.iter().map(|v| (v.name.as_str(), v.served, v.storage)).collect();
            if !BETA_KINDS.contains(&kind.as_str()) {
                assert_eq!(names, [(VERSION, true, true)], "{kind}");
                continue;
            }
            assert_eq!(names, [(VERSION, true, true), (BETA_VERSION, true, false)], "{kind}");
            assert_eq!(preferred_api_version(&kind), format!("{GROUP}/{BETA_VERSION}"));
            let [alpha, beta] = [&crd.spec.versions[0], &crd.spec.versions[1]].map(|v| {
                let mut v = serde_json::to_value(v).expect("version serialises");
                v["name"] = serde_json::Value::Null;
                v["storage"] = serde_json::Value::Null;
                v
            });
            assert_eq!(alpha, beta, "{kind}: v1beta1 differs from v1alpha1");
            let conversion = serde_json::to_value(&crd.spec.conversion).expect("conversion serialises");
            assert_eq!(conversion, serde_json::json!({"strategy": "None"}), "{kind}");
        }
    }

    #[test]
    fn deploy_crds_match_generated() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds/crds.yaml");
        let generated = crds_yaml().expect("crds serialise");
        if std::env::var_os("UPDATE_CRDS").is_some() {
            std::fs::write(path, &generated).expect("write deploy/crds/crds.yaml");
        }
        let on_disk = std::fs::read_to_string(path).expect("deploy/crds/crds.yaml exists");
        assert!(
            on_disk == generated,
            "deploy/crds/crds.yaml differs from `provisioning crds`; regenerate with `UPDATE_CRDS=1 cargo test -p provisioning-crds`"
        );
    }
}
