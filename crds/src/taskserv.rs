//! TaskServ: one catalog service installed on a set of servers.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::*;

/// One catalog service (etcd, containerd, kubernetes, redis…) installed on a set of Servers.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "provisioning.dev",
    version = "v1alpha1",
    kind = "TaskServ",
    namespaced,
    status = "TaskServStatus",
    shortname = "ts",
    category = "provisioning",
    doc = "One catalog service installed on a set of Servers.",
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.service"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.installedVersion"),
    printcolumn(name = "Plan", type_ = "string", json_path = ".status.plan.summary"),
    printcolumn(name = "Updated", type_ = "string", json_path = ".status.updated"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.dependsOn) || !self.dependsOn.exists(d, d == self.service)",
     "message": "a TaskServ cannot depend on its own service"}
]))]
pub struct TaskServSpec {
    /// Catalog name of the service (see `provisioning catalog list`).
    #[schemars(schema_with = "dns1123_label")]
    pub service: String,
    /// Version to install. Empty: the catalog's default version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64))]
    pub version: String,
    /// Which Servers (in the same namespace) to install on.
    #[serde(default)]
    pub servers: ServerSelection,
    /// Service configuration, validated against the service's config schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub config: Option<serde_json::Value>,
    /// Values merged into `config`, in order, from Secrets and ConfigMaps of the same
    /// namespace (Flux HelmRelease `valuesFrom` style). Later entries win; `config` is the base.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_from: Vec<ConfigFromSource>,
    /// Other TaskServs (by name, same namespace) that must be Ready first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "dns1123_label_set")]
    pub depends_on: Vec<String>,
    /// A failed upgrade re-installs the last good version.
    #[serde(default = "default_true")]
    pub rollback_on_failure: bool,
    /// Automatic or Manual. Unset: the Workspace's (a Cluster writes its own into its
    /// TaskServs). Manual: install, upgrade, re-install and remove runs wait until the
    /// annotation `provisioning.dev/approve` names the current `status.plan.id`; health checks
    /// go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::Approval>,
    /// Rolling updates: servers that already run the service get a new version or config
    /// `maxUnavailable` at a time, each batch gated on the health of the ones before. Unset:
    /// all at once (bounded by the workspace's `parallelLimit`). First installs are not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

fn default_true() -> bool {
    true
}

/// Kind of object a [`ConfigFromSource`] reads.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConfigSourceKind {
    /// A core/v1 Secret: its values are secret (redacted from output, hashed in status).
    #[default]
    Secret,
    /// A core/v1 ConfigMap.
    ConfigMap,
}

impl ConfigSourceKind {
    /// `Secret` or `ConfigMap`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigSourceKind::Secret => "Secret",
            ConfigSourceKind::ConfigMap => "ConfigMap",
        }
    }
}

/// One entry of `configFrom`: a key of a Secret or ConfigMap in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFromSource {
    /// `Secret` or `ConfigMap`.
    pub kind: ConfigSourceKind,
    /// Name of the Secret or ConfigMap (same namespace; there is no namespace field on purpose).
    #[schemars(schema_with = "dns1123_subdomain")]
    pub name: String,
    /// Key to read. Default `values.yaml`.
    #[serde(default = "default_values_key")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
    /// Dotted path in `config` the key's value is set at, as a string (`auth.password`).
    /// Empty: the key holds YAML (a mapping) merged into `config`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253), regex(pattern = r"^([A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)?$"))]
    pub target_path: String,
    /// A missing object or key is skipped instead of waited for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

fn default_values_key() -> String {
    "values.yaml".to_string()
}

/// A reference to a Secret of the object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalSecretReference {
    /// The Secret's name.
    pub name: String,
}

/// Which Servers a TaskServ is installed on: by name, by labels, or both (union).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerSelection {
    /// Server names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "dns1123_label_set")]
    pub names: Vec<String>,
    /// Servers whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelMatch>,
}

/// Observed state of a TaskServ.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskServStatus {
    /// Summary for humans: Pending, Installing, Ready, Degraded, Failed, Removing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: Ready, Reconciling, Stalled, DependenciesReady, Installed, Healthy, Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Version installed on every selected server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_version: Option<String>,
    /// Selected servers at the requested version and config, installed and healthy, of all
    /// selected ("2/3"): the UPDATED column, the progress of a rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// Last version that installed and passed its health check everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_version: Option<String>,
    /// Services this one needs, in install order (dependency closure).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved_dependencies: Vec<String>,
    /// Per-server state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub servers: Vec<TaskServServerStatus>,
    /// Version of the config inputs in use: a salted hash of the values read through
    /// `configFrom` and of generated secrets (never the values). A change re-runs the install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_inputs_hash: Option<String>,
    /// The inputs of an install as last rolled out, each by name (`service`, `config.port`,
    /// `config.auth.password`…) with a salted hash of its value (never the value). An install
    /// runs again on servers that have the service only when one of these changes; the plan's
    /// reason names it. Everything else in the spec (labels, approval, rollout, the server
    /// list, list order) is not an input.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub install_inputs: std::collections::BTreeMap<String, String>,
    /// The Secret (owned by this TaskServ) holding the secret config fields it generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_secret_ref: Option<LocalSecretReference>,
    /// What the scripts still have to do, per server: install (Create), upgrade or
    /// re-install (Update), remove (Delete). The PLAN column is its summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::Plan>,
    /// The plan last approved under Manual approval. What remains of it goes on without a
    /// new approval (the plan shrinks as servers finish); anything beyond it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_plan: Option<crate::Plan>,
}

/// State of a TaskServ on one server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskServServerStatus {
    /// Server name.
    pub name: String,
    /// Pending, Installing, Installed, Failed, Removing.
    #[serde(default)]
    pub phase: String,
    /// Version installed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Result of the last health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// The machine (the Server's providerID) the service was last installed on: a Server
    /// whose machine was replaced under the same name gets the service installed again.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The last script run on this server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<ScriptRun>,
    /// The last failed script run on this server (an install, its check, a health check or a
    /// remove), kept while a retry runs so that why it failed stays visible; cleared by a
    /// successful install or health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<ScriptRun>,
    /// Config files the health check found changed on the machine since install (config
    /// drift); cleared once a re-install has rendered them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub drifted_files: Vec<String>,
    /// Why the service is to be installed again on a server that has it (`config.port
    /// changed`); cleared by the install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reinstall_reason: Option<String>,
}

/// One task script run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptRun {
    /// Which script: install, check or remove.
    #[serde(default)]
    pub script: String,
    /// When it started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Exit code; absent when it was killed by a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Last lines of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
}
