//! The Argo CD resource customizations in Argo's own layout
//! (`deploy/argocd/resource_customizations/<group>/<Kind>/...`), their test files, and the
//! `argocd-cm` patch generated from them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::lua::{HealthStatus, ResourceAction};

/// The API group whose customizations live here.
pub const GROUP: &str = "provisioning.dev";

/// The environment variable that makes the drift test rewrite `argocd-cm-patch.yaml`.
pub const UPDATE_ENV: &str = "UPDATE_ARGOCD_CM";

/// `deploy/argocd`.
pub fn argocd_dir() -> PathBuf {
    crate::deploy_dir().join("argocd")
}

/// `deploy/argocd/resource_customizations/provisioning.dev`.
pub fn group_dir() -> PathBuf {
    argocd_dir().join("resource_customizations").join(GROUP)
}

/// `deploy/argocd/argocd-cm-patch.yaml`.
pub fn cm_patch_path() -> PathBuf {
    argocd_dir().join("argocd-cm-patch.yaml")
}

/// `health_test.yaml`, as in Argo CD's repository.
#[derive(Debug, Deserialize)]
pub struct HealthTests {
    pub tests: Vec<HealthTest>,
}

/// One health test: an input fixture and the expected status and message.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthTest {
    pub health_status: HealthStatus,
    pub input_path: String,
}

/// `actions/action_test.yaml`, as in Argo CD's repository.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionTests {
    #[serde(default)]
    pub discovery_tests: Vec<DiscoveryTest>,
    #[serde(default)]
    pub action_tests: Vec<ActionTest>,
}

/// A discovery test: the actions offered for an input.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryTest {
    pub input_path: String,
    pub result: Vec<ResourceAction>,
}

/// An action test: the object an action returns for an input.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionTest {
    pub action: String,
    pub input_path: String,
    pub expected_output_path: String,
}

/// One kind's customization directory, read from disk.
#[derive(Debug)]
pub struct KindCustomization {
    pub kind: String,
    pub dir: PathBuf,
    pub health_lua: String,
    pub discovery_lua: String,
    /// Action name to `action.lua`, sorted by name.
    pub actions: BTreeMap<String, String>,
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every kind directory under the group directory, sorted by kind.
pub fn load_customizations() -> Result<Vec<KindCustomization>, String> {
    let dir = group_dir();
    let mut kinds = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        if !entry.path().is_dir() {
            continue;
        }
        kinds.push(load_kind(&entry.path())?);
    }
    kinds.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(kinds)
}

fn load_kind(dir: &Path) -> Result<KindCustomization, String> {
    let kind = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let health_lua = read(&dir.join("health.lua"))?;
    let actions_dir = dir.join("actions");
    let discovery_lua = read(&actions_dir.join("discovery.lua"))?;
    let mut actions = BTreeMap::new();
    let entries =
        std::fs::read_dir(&actions_dir).map_err(|e| format!("{}: {e}", actions_dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", actions_dir.display()))?;
        let script = entry.path().join("action.lua");
        if script.is_file() {
            actions.insert(
                entry.file_name().to_string_lossy().into_owned(),
                read(&script)?,
            );
        }
    }
    Ok(KindCustomization {
        kind,
        dir: dir.to_path_buf(),
        health_lua,
        discovery_lua,
        actions,
    })
}

/// A YAML literal block scalar (`|`) holding `text`, its lines indented by `indent` spaces.
fn block_scalar(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::from("|\n");
    for line in text.trim_end_matches('\n').split('\n') {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str(&pad);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The value of `resource.customizations.actions.<group>_<Kind>`: Argo's actions document.
pub fn actions_document(kind: &KindCustomization) -> String {
    let mut doc = String::from("discovery.lua: ");
    doc.push_str(&block_scalar(&kind.discovery_lua, 2));
    doc.push_str("definitions:\n");
    for (name, script) in &kind.actions {
        doc.push_str(&format!("- name: {name}\n  action.lua: "));
        doc.push_str(&block_scalar(script, 4));
    }
    doc
}

/// The `argocd-cm` patch carrying every health check and action, generated from the files.
pub fn generate_cm_patch(kinds: &[KindCustomization]) -> String {
    let mut out = String::new();
    out.push_str(
        "# Generated from deploy/argocd/resource_customizations: do not edit by hand.\n\
         # Regenerate: UPDATE_ARGOCD_CM=1 cargo test -p provisioning-deploy-checks --test argocd\n\
         # Apply: kubectl -n argocd patch configmap argocd-cm --patch-file deploy/argocd/argocd-cm-patch.yaml\n\
         apiVersion: v1\n\
         kind: ConfigMap\n\
         metadata:\n  \
           name: argocd-cm\n  \
           labels:\n    \
             app.kubernetes.io/name: argocd-cm\n    \
             app.kubernetes.io/part-of: argocd\n\
         data:\n",
    );
    for kind in kinds {
        out.push_str(&format!(
            "  resource.customizations.health.{GROUP}_{}: ",
            kind.kind
        ));
        out.push_str(&block_scalar(&kind.health_lua, 4));
        out.push_str(&format!(
            "  resource.customizations.actions.{GROUP}_{}: ",
            kind.kind
        ));
        out.push_str(&block_scalar(&actions_document(kind), 4));
    }
    out
}

/// Reads a fixture referenced from a test file (relative to that file's directory).
pub fn read_fixture(base: &Path, relative: &str) -> Result<serde_json::Value, String> {
    crate::read_yaml(&base.join(relative))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_scalars_round_trip_through_yaml() {
        let text = "local a = 1\n\n  indented: \"quoted\" # not a comment\nreturn a\n";
        let doc = format!("key: {}", block_scalar(text, 2));
        let parsed: BTreeMap<String, String> =
            serde_yaml_ng::from_str(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert_eq!(parsed.get("key").map(String::as_str), Some(text));
    }
}
