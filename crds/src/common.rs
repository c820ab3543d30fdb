//! Pieces shared by every kind: well-known names, references and schema helpers.

use std::collections::BTreeMap;

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Annotation: `"true"` stops reconciliation; a `Paused` condition says so.
pub const ANNOTATION_PAUSED: &str = "provisioning.dev/paused";
/// Annotation: any new value forces a reconcile now.
pub const ANNOTATION_RECONCILE_REQUESTED_AT: &str = "provisioning.dev/reconcile-requested-at";
/// Annotation: written before a provider create call, cleared once its result is recorded.
pub const ANNOTATION_CREATE_PENDING: &str = "provisioning.dev/create-pending";

/// Provider tag / label and Kubernetes label: the owning Cluster's name.
pub const LABEL_CLUSTER: &str = "provisioning.dev/cluster";
/// Kubernetes label on Servers a Cluster creates: the pool name.
pub const LABEL_POOL: &str = "provisioning.dev/pool";

/// Finalizer every reconciler puts on its objects.
pub const FINALIZER: &str = "provisioning.dev/cleanup";

/// Condition types.
pub mod condition {
    /// Summary: the object is as declared.
    pub const READY: &str = "Ready";
    /// Work is in flight.
    pub const RECONCILING: &str = "Reconciling";
    /// No progress without a change of spec or environment.
    pub const STALLED: &str = "Stalled";
    /// The paused annotation is set.
    pub const PAUSED: &str = "Paused";
    /// Server: the machine exists at the provider and is running.
    pub const PROVISIONED: &str = "Provisioned";
    /// Server: the machine was changed outside the controller (missing, stopped).
    pub const DRIFTED: &str = "Drifted";
    /// TaskServ: required services are installed.
    pub const DEPENDENCIES_READY: &str = "DependenciesReady";
    /// TaskServ: installed on every selected server.
    pub const INSTALLED: &str = "Installed";
    /// TaskServ: health checks pass.
    pub const HEALTHY: &str = "Healthy";
    /// Cluster: every pool server is Ready.
    pub const SERVERS_READY: &str = "ServersReady";
    /// Cluster: every taskserv is Ready.
    pub const TASKSERVS_READY: &str = "TaskServsReady";
    /// Workspace: every provider account is usable.
    pub const PROVIDERS_READY: &str = "ProvidersReady";
    /// Workspace: the roll-up of its namespace's Servers, Clusters and TaskServs.
    pub const RESOURCES_READY: &str = "ResourcesReady";
    /// Workspace being deleted: resources of its namespace still use its accounts.
    pub const IN_USE: &str = "InUse";
}

/// Reference to a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret.
    #[schemars(schema_with = "dns1123_subdomain")]
    pub name: String,
    /// Namespace of the Secret; defaults to the namespace of the referring object (for a
    /// Workspace: its `spec.namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A label selector limited to exact matches.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelMatch {
    /// Labels an object must carry, all of them, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

/// A status address of a machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// Kind of address: InternalIP, ExternalIP, InternalDNS, ExternalDNS or Hostname.
    #[serde(rename = "type")]
    pub address_type: String,
    /// The address.
    pub address: String,
}

/// Schema of a free-form object (kept as sent, not pruned).
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of a DNS-1123 label (names of Kubernetes objects and of provider accounts).
pub fn dns1123_label(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 63,
        "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    })
}

/// Schema of a DNS-1123 subdomain (Secret names).
pub fn dns1123_subdomain(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 253,
        "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    })
}

/// Schema of an optional DNS-1123 label: empty means "use the default".
pub fn optional_dns1123_label(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 63,
        "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"
    })
}

/// Schema of an (optional) aws instance profile: an IAM name, or an instance-profile ARN.
pub fn optional_instance_profile(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 512,
        "pattern": "^([A-Za-z0-9_+=,.@-]{1,128}|arn:aws[a-z-]*:iam::[0-9]{12}:instance-profile/([A-Za-z0-9_+=,.@-]+/)*[A-Za-z0-9_+=,.@-]{1,128})?$"
    })
}

/// Most zones an aws account maps to subnets (`zoneSubnets`).
pub const MAX_ZONE_SUBNETS: usize = 16;
/// Most fallback zones of a Server or pool (`fallbackZones`).
pub const MAX_FALLBACK_ZONES: usize = 8;

/// Schema of an account's `zoneSubnets`: zone name → `subnet-` and 8 or 17 hex digits.
pub fn zone_subnets(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_ZONE_SUBNETS,
        "additionalProperties": {
            "type": "string",
            "maxLength": 24,
            "pattern": "^subnet-([0-9a-f]{8}|[0-9a-f]{17})$"
        }
    })
}

/// Schema of `fallbackZones`: zone names, in the order they are tried (atomic: the order is
/// the content).
pub fn fallback_zones(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_FALLBACK_ZONES,
        "items": {
            "type": "string",
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        }
    })
}

/// Schema of a pool's `zones`: at most 16 zone names, in the order members are spread
/// (atomic: the order is the content).
pub fn pool_zones(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_ZONE_SUBNETS,
        "items": {
            "type": "string",
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        }
    })
}

/// Schema of a list of DNS-1123 labels.
pub fn dns1123_label_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "type": "string",
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        }
    })
}

/// A set of DNS-1123 labels (`x-kubernetes-list-type: set`): server-side apply merges entries
/// from several managers instead of replacing the whole list, and duplicates are refused.
pub fn dns1123_label_set(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = dns1123_label_list(generator);
    schema.insert("x-kubernetes-list-type".into(), "set".into());
    schema
}

/// The `conditions` list of a status, merged by type.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

/// How servers that already run a service are updated (a version or config change): at
/// most `maxUnavailable` at a time, in name order, each batch only after the servers updated
/// before it are installed and healthy. A failed batch stops the rollout there (and, with
/// `rollbackOnFailure`, the failed servers go back to the last good version).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Servers updated at once (at least 1). For a 3-member etcd, 1 keeps quorum throughout.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_unavailable: u32,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout { max_unavailable: default_max_unavailable() }
    }
}

fn default_max_unavailable() -> u32 {
    1
}
