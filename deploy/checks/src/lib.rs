//! Checks for the GitOps and k9s integration files under `deploy/`: Argo CD health checks and
//! actions run in a real Lua 5.1 sandbox, Flux health expressions evaluated with a CEL
//! interpreter, the k9s plugin file's shape, and a kstatus-style judge of our status.

pub mod argocd;
pub mod flux;
pub mod k9s;
pub mod kinds;
pub mod kstatus;
pub mod lua;
pub mod snapshots;

use std::path::PathBuf;

/// The cargo workspace root (this crate lives in `deploy/checks`).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.ancestors().nth(2).map(PathBuf::from).unwrap_or(manifest_dir)
}

/// The `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy")
}

/// Reads a YAML file into JSON.
pub fn read_yaml(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
