//! The Argo CD resource customizations in Argo's own layout
//! (`deploy/argocd/resource_customizations/<group>/<Kind>/...`), their test files, and the
//! `argocd-cm` patch.
//!
//! Every kind shares the same scripts: their one source is `deploy/argocd/src/` (`health.lua`,
//! `actions/discovery.lua`, `actions/<action>.lua`). [`generated_files`] writes the per-kind
//! copies and `argocd-cm-patch.yaml` from it (`scripts/gen-argocd.sh`), and a test fails when
//! a committed copy differs ([`drifted`]). Test files (`health_test.yaml`, `testdata/`,
//! `actions/action_test.yaml`, `actions/testdata/`) are per kind and written by hand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::lua::{HealthStatus, ResourceAction};

/// The API group whose customizations live here.
pub const GROUP: &str = "provisioning.dev";

/// The environment variable that makes the drift test rewrite the generated files (the
/// per-kind script copies and `argocd-cm-patch.yaml`).
pub const UPDATE_ENV: &str = "UPDATE_ARGOCD";

/// How to regenerate the generated files (named in every drift message).
pub const REGENERATE: &str = "scripts/gen-argocd.sh";

/// `deploy/argocd`.
pub fn argocd_dir() -> PathBuf {
    crate::deploy_dir().join("argocd")
}

/// `deploy/argocd/src`: the one source of the scripts every kind shares.
pub fn source_dir() -> PathBuf {
    argocd_dir().join("src")
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
    let kind = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let health_lua = read(&dir.join("health.lua"))?;
    let actions_dir = dir.join("actions");
    let discovery_lua = read(&actions_dir.join("discovery.lua"))?;
    let mut actions = BTreeMap::new();
    let entries = std::fs::read_dir(&actions_dir).map_err(|e| format!("{}: {e}", actions_dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", actions_dir.display()))?;
        let script = entry.path().join("action.lua");
        if script.is_file() {
            actions.insert(entry.file_name().to_string_lossy().into_owned(), read(&script)?);
        }
    }
    Ok(KindCustomization { kind, dir: dir.to_path_buf(), health_lua, discovery_lua, actions })
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
        "# Generated from deploy/argocd/src: do not edit by hand.\n\
         # Regenerate: scripts/gen-argocd.sh\n\
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
        out.push_str(&format!("  resource.customizations.health.{GROUP}_{}: ", kind.kind));
        out.push_str(&block_scalar(&kind.health_lua, 4));
        out.push_str(&format!("  resource.customizations.actions.{GROUP}_{}: ", kind.kind));
        out.push_str(&block_scalar(&actions_document(kind), 4));
    }
    out
}

/// The scripts every kind shares, read from [`source_dir`].
#[derive(Debug)]
pub struct SharedScripts {
    pub health_lua: String,
    pub discovery_lua: String,
    /// Action name (file stem of `actions/<name>.lua`) to script, sorted by name.
    pub actions: BTreeMap<String, String>,
}

/// Reads `deploy/argocd/src`.
pub fn load_source() -> Result<SharedScripts, String> {
    let dir = source_dir();
    let actions_dir = dir.join("actions");
    let mut actions = BTreeMap::new();
    let entries = std::fs::read_dir(&actions_dir).map_err(|e| format!("{}: {e}", actions_dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", actions_dir.display()))?.path();
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        match stem {
            Some(name) if path.extension().is_some_and(|e| e == "lua") && name != "discovery" => {
                actions.insert(name, read(&path)?);
            }
            _ => {}
        }
    }
    Ok(SharedScripts { health_lua: read(&dir.join("health.lua"))?, discovery_lua: read(&actions_dir.join("discovery.lua"))?, actions })
}

/// The first line of every generated copy: where to edit instead.
fn copy_header(source: &str) -> String {
    format!("-- Generated from deploy/argocd/src/{source} by {REGENERATE}: edit that file, not this copy.\n")
}

/// What each kind's directory holds once generated (the scripts only; tests are per kind).
pub fn kind_from_source(kind: &str, src: &SharedScripts) -> KindCustomization {
    KindCustomization {
        kind: kind.to_string(),
        dir: group_dir().join(kind),
        health_lua: copy_header("health.lua") + &src.health_lua,
        discovery_lua: copy_header("actions/discovery.lua") + &src.discovery_lua,
        actions: src.actions.iter().map(|(name, script)| (name.clone(), copy_header(&format!("actions/{name}.lua")) + script)).collect(),
    }
}

/// Every generated file as (path, content): each kind's `health.lua`,
/// `actions/discovery.lua` and `actions/<action>/action.lua`, then `argocd-cm-patch.yaml`.
pub fn generated_files(kinds: &[String], src: &SharedScripts) -> Vec<(PathBuf, String)> {
    let mut sorted = kinds.to_vec();
    sorted.sort();
    let customizations: Vec<KindCustomization> = sorted.iter().map(|k| kind_from_source(k, src)).collect();
    let mut files = Vec::new();
    for kind in &customizations {
        files.push((kind.dir.join("health.lua"), kind.health_lua.clone()));
        files.push((kind.dir.join("actions/discovery.lua"), kind.discovery_lua.clone()));
        for (name, script) in &kind.actions {
            files.push((kind.dir.join("actions").join(name).join("action.lua"), script.clone()));
        }
    }
    files.push((cm_patch_path(), generate_cm_patch(&customizations)));
    files
}

/// Writes every generated file (creating directories).
pub fn write_generated(files: &[(PathBuf, String)]) -> Result<(), String> {
    for (path, content) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(path, content).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The generated files whose committed content differs from `files` (or is missing), one
/// message each.
pub fn drifted(files: &[(PathBuf, String)]) -> Vec<String> {
    files
        .iter()
        .filter_map(|(path, expected)| match std::fs::read_to_string(path) {
            Ok(committed) if committed == *expected => None,
            Ok(_) => Some(format!("{} differs from what {REGENERATE} writes", path.display())),
            Err(e) => Some(format!("{}: {e}", path.display())),
        })
        .collect()
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
        let parsed: BTreeMap<String, String> = serde_yaml_ng::from_str(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert_eq!(parsed.get("key").map(String::as_str), Some(text));
    }

    #[test]
    fn drift_is_reported_per_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let same = dir.path().join("same.lua");
        let changed = dir.path().join("changed.lua");
        let missing = dir.path().join("missing.lua");
        let files = vec![
            (same.clone(), "return 1\n".to_string()),
            (changed.clone(), "return 2\n".to_string()),
            (missing.clone(), "return 3\n".to_string()),
        ];
        write_generated(&files[..2]).unwrap_or_else(|e| panic!("{e}"));
        assert!(drifted(&files[..2]).is_empty());
        std::fs::write(&changed, "return 2 -- edited by hand\n").unwrap_or_else(|e| panic!("{e}"));
        let drift = drifted(&files);
        assert_eq!(drift.len(), 2, "{drift:?}");
        assert!(drift[0].starts_with(&changed.display().to_string()) && drift[0].contains(REGENERATE));
        assert!(drift[1].starts_with(&missing.display().to_string()));
    }

    #[test]
    fn copies_carry_the_source_after_a_header_naming_it() {
        let src = SharedScripts {
            health_lua: "return {}\n".into(),
            discovery_lua: "return {}\n".into(),
            actions: BTreeMap::from([("pause".to_string(), "return obj\n".to_string())]),
        };
        let files = generated_files(&["Server".into(), "Cluster".into()], &src);
        let names: Vec<String> = files.iter().map(|(p, _)| p.strip_prefix(argocd_dir()).unwrap_or(p).display().to_string()).collect();
        let prefix = "resource_customizations/provisioning.dev";
        assert_eq!(
            names,
            [
                format!("{prefix}/Cluster/health.lua"),
                format!("{prefix}/Cluster/actions/discovery.lua"),
                format!("{prefix}/Cluster/actions/pause/action.lua"),
                format!("{prefix}/Server/health.lua"),
                format!("{prefix}/Server/actions/discovery.lua"),
                format!("{prefix}/Server/actions/pause/action.lua"),
                "argocd-cm-patch.yaml".to_string(),
            ]
        );
        let (_, pause) = &files[2];
        assert_eq!(
            pause,
            &format!("-- Generated from deploy/argocd/src/actions/pause.lua by {REGENERATE}: edit that file, not this copy.\nreturn obj\n")
        );
    }
}
