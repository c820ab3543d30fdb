//! The `taskserv.yaml` manifest: what a catalog service declares about itself.

use serde::{Deserialize, Serialize};

/// Provider types a service may declare support for.
pub const KNOWN_PROVIDERS: &[&str] = &["local", "aws", "upcloud", "simulated"];

/// The three scripts every service ships.
pub const REQUIRED_SCRIPTS: &[&str] = &["install.nu", "check.nu", "remove.nu"];

/// One `taskservs/catalog/<name>/taskserv.yaml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskServManifest {
    /// Catalog name; must equal the directory name.
    pub name: String,
    /// What the service is, and what is real about its versions.
    pub description: String,
    /// Installable versions, as `install.nu` understands them.
    pub versions: Vec<String>,
    /// Version used when a request names none; one of `versions`.
    pub default_version: String,
    /// Hard dependencies: installed first, brought in by resolution.
    #[serde(default)]
    pub requires: Vec<String>,
    /// Soft ordering: installed after these only when they are part of the same plan.
    #[serde(default)]
    pub after: Vec<String>,
    /// Provider types the scripts support (local, aws, upcloud, simulated).
    pub providers: Vec<String>,
    /// Cloud only: the scripts need real cloud machines (systemd, kubeadm, raw disks), so CI
    /// never executes them (no `local` provider; on `simulated` no script runs). `catalog
    /// list` marks such services.
    #[serde(default)]
    pub cloud_only: bool,
    /// JSON schema of the service's `config`.
    #[serde(default = "empty_object_schema")]
    pub config_schema: serde_json::Value,
    /// Health check settings.
    #[serde(default)]
    pub health: HealthSpec,
    /// Time limit of one script run, in seconds.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
}

/// How health is checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthSpec {
    /// The health script; the runner's `check` step runs `check.nu`, so this must name it.
    #[serde(default = "default_health_script")]
    pub script: String,
    /// How often the controller re-checks health on resync.
    #[serde(default = "default_interval_seconds")]
    pub interval_seconds: u64,
}

impl Default for HealthSpec {
    fn default() -> Self {
        HealthSpec { script: default_health_script(), interval_seconds: default_interval_seconds() }
    }
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}
fn default_timeout_seconds() -> u64 {
    600
}
fn default_health_script() -> String {
    "check.nu".to_string()
}
fn default_interval_seconds() -> u64 {
    60
}

/// Catalog names are used as directory names and in argv: keep them to a safe alphabet.
pub fn is_valid_service_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}
