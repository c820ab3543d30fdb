//! Status snapshots (YAML fixtures) with the verdicts the kstatus judge and Flux must reach.

use serde::Deserialize;

/// One snapshot: a path under `deploy/` and the expected verdicts.
#[derive(Debug, Clone, Deserialize)]
pub struct Snapshot {
    pub path: String,
    pub stage: String,
    pub kstatus: crate::kstatus::KStatus,
    /// `InProgress`, `Failed`, `Current` or `Unknown` (an evaluation error).
    pub flux: String,
}

#[derive(Deserialize)]
struct SnapshotFile {
    snapshots: Vec<Snapshot>,
}

/// Reads `deploy/checks/fixtures/status_snapshots.yaml`.
pub fn load() -> Result<Vec<Snapshot>, String> {
    let path = crate::deploy_dir().join("checks/fixtures/status_snapshots.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file: SnapshotFile = serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(file.snapshots)
}

/// Reads one snapshot's object.
pub fn object(snapshot: &Snapshot) -> Result<serde_json::Value, String> {
    crate::read_yaml(&crate::deploy_dir().join(&snapshot.path))
}
