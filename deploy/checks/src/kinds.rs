//! Our kinds' names, read from the generated CRDs (`deploy/crds/`), so checks follow the
//! real API rather than a copy of it.

use serde::Deserialize;

/// The names a CRD declares (`spec.names`) and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdNames {
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub group: String,
    pub namespaced: bool,
}

impl CrdNames {
    /// Every name a user (or k9s) may call the resource by.
    pub fn all_names(&self) -> Vec<String> {
        let mut names = vec![self.plural.clone(), self.singular.clone()];
        names.extend(self.short_names.iter().cloned());
        names.push(format!("{}.{}", self.plural, self.group));
        names
    }
}

#[derive(Deserialize)]
struct Crd {
    kind: String,
    spec: CrdSpec,
}

#[derive(Deserialize)]
struct CrdSpec {
    group: String,
    scope: String,
    names: Names,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Names {
    kind: String,
    plural: String,
    #[serde(default)]
    singular: String,
    #[serde(default)]
    short_names: Vec<String>,
    #[serde(default)]
    categories: Vec<String>,
}

/// Reads every CustomResourceDefinition in `deploy/crds/*.yaml`, sorted by kind.
/// The kinds users declare and GitOps tools sync (every CRD kind but the controller-written
/// history, ChangeRecord: Argo CD shows records in an object's tree without a health check,
/// and pause/reconcile actions mean nothing on them).
pub fn declared_kinds() -> Result<Vec<CrdNames>, String> {
    Ok(crd_names()?.into_iter().filter(|n| n.kind != "ChangeRecord").collect())
}

pub fn crd_names() -> Result<Vec<CrdNames>, String> {
    let dir = crate::deploy_dir().join("crds");
    let mut names = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.extension().is_none_or(|ext| ext != "yaml" && ext != "yml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = serde_yaml_ng::Value::deserialize(document).map_err(|e| format!("{}: {e}", path.display()))?;
            if value.get("kind").and_then(|k| k.as_str()) != Some("CustomResourceDefinition") {
                continue;
            }
            let crd: Crd = serde_yaml_ng::from_value(value).map_err(|e| format!("{}: {e}", path.display()))?;
            debug_assert_eq!(crd.kind, "CustomResourceDefinition");
            let singular = if crd.spec.names.singular.is_empty() { crd.spec.names.kind.to_lowercase() } else { crd.spec.names.singular };
            names.push(CrdNames {
                kind: crd.spec.names.kind,
                plural: crd.spec.names.plural,
                singular,
                short_names: crd.spec.names.short_names,
                categories: crd.spec.names.categories,
                group: crd.spec.group,
                namespaced: crd.spec.scope == "Namespaced",
            });
        }
    }
    if names.is_empty() {
        return Err(format!("no CustomResourceDefinition in {}", dir.display()));
    }
    names.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(names)
}

/// The `openAPIV3Schema` of a kind's first served version, from `deploy/crds/`.
pub fn crd_schema(kind: &str) -> Result<serde_json::Value, String> {
    let dir = crate::deploy_dir().join("crds");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.extension().is_none_or(|ext| ext != "yaml" && ext != "yml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document).map_err(|e| format!("{}: {e}", path.display()))?;
            if value.pointer("/spec/names/kind").and_then(|k| k.as_str()) == Some(kind) {
                return value
                    .pointer("/spec/versions/0/schema/openAPIV3Schema")
                    .cloned()
                    .ok_or_else(|| format!("{kind}: no schema in {}", path.display()));
            }
        }
    }
    Err(format!("no CRD for kind {kind} in {}", dir.display()))
}
