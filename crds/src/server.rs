//! Server: one machine at one provider.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::*;

/// One machine at one provider.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "provisioning.dev",
    version = "v1alpha1",
    kind = "Server",
    namespaced,
    status = "ServerStatus",
    shortname = "srv",
    category = "provisioning",
    doc = "One machine at one provider.",
    printcolumn(name = "Provider", type_ = "string", json_path = ".status.provider"),
    printcolumn(name = "Size", type_ = "string", json_path = ".status.resolvedPlan", priority = 1),
    printcolumn(name = "Address", type_ = "string", json_path = ".status.addresses[0].address"),
    printcolumn(name = "Cost", type_ = "string", json_path = ".status.cost.summary"),
    printcolumn(name = "Plan", type_ = "string", json_path = ".status.plan.summary"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    /// Provider account (a name from the Workspace's spec.providers). Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(schema_with = "optional_dns1123_label")]
    pub provider: String,
    /// Size: small, medium, large, xlarge, or a provider-native plan. Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub plan: String,
    /// Provider region or zone. Empty: the account's or workspace's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub zone: String,
    /// Image: abstract (debian-12) or provider-native id. Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub image: String,
    /// Secret with the SSH private key (key `ssh-privatekey`) used to run task scripts on
    /// cloud machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_secret_ref: Option<SecretReference>,
    /// aws: the IAM instance profile the machine gets (what its cloud-controller-manager,
    /// EBS CSI driver… run as): an IAM name or `arn:aws:iam::<12 digits>:instance-profile/<name>`.
    /// Empty: none. Applied when the machine is created. Other providers refuse it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(schema_with = "optional_instance_profile")]
    pub instance_profile: String,
    /// Zones tried, in order, after `zone` answered a create with insufficient capacity (not
    /// a quota: those are the account's, in every zone). Needs `zone`; with an aws account's
    /// `zoneSubnets` each must be listed there. The zone the machine was made in is
    /// `status.zone`; a machine in any of these zones matches the spec (no replacement).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "fallback_zones")]
    pub fallback_zones: Vec<String>,
    /// Whether the machine gets a public IPv4 address (aws: the primary interface's
    /// `AssociatePublicIpAddress`; upcloud: the public interface). Unset: the provider's
    /// default (aws: the subnet's auto-assign setting; upcloud: a public interface). Applied
    /// when the machine is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<bool>,
    /// Extra disks made with the machine (the root disk's size comes from the plan): at most
    /// 16, each `{name, size, type, mountPath, deletionPolicy}`. Applied when the machine is
    /// created; see the README's "Disks" for what each provider does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::disks_schema")]
    pub disks: Vec<crate::Disk>,
    /// What deleting the Server does to the machine: Delete it, or Orphan it (leave it running).
    /// Unset: Delete for a machine the Server created, Orphan for an adopted one
    /// (`externalID`), so deleting the Server never destroys a machine it did not make unless
    /// `Delete` is written explicitly. (No schema default: it would hide which one was meant.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// Adopt an existing machine with this provider id instead of creating one. The machine
    /// must carry this Server's identity tags (`provisioning.dev/server-uid`) or the tag
    /// `provisioning.dev/adoptable: "true"` (kept while adopted); otherwise the Server stalls
    /// with `AdoptionRefused` and nothing is changed or deleted.
    #[serde(default, rename = "externalID", skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub external_id: String,
    /// How a change of plan, zone or image after the machine exists is carried out: Replace
    /// (default: in place where the provider can, else a new machine), InPlace (refuse what
    /// needs a new machine) or Never (refuse any change; Stalled, UpdateRefused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<crate::UpdatePolicy>,
    /// Automatic or Manual. Unset: the owning Cluster's, else the Workspace's (Automatic by
    /// default). Manual waits for the annotation `provisioning.dev/approve: <status.plan.id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::Approval>,
}

impl ServerSpec {
    /// The deletion policy in force: the one written, else Orphan for an adopted machine
    /// (`externalID` set) and Delete for one the Server creates.
    pub fn effective_deletion_policy(&self) -> DeletionPolicy {
        self.deletion_policy.unwrap_or(if self.external_id.is_empty() { DeletionPolicy::Delete } else { DeletionPolicy::Orphan })
    }
}

/// What deleting a resource does to what it manages at the provider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete the machine.
    #[default]
    Delete,
    /// Leave the machine running; only the Kubernetes object goes.
    Orphan,
}

/// Observed state of a Server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerStatus {
    /// Summary for humans: Pending, Provisioning, Running, Failed, Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: Ready, Reconciling, Stalled, Provisioned, Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Provider account the server runs at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The machine's id at the provider (`<type>://<id>`).
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Addresses of the machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// The provider-native plan the abstract plan resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_plan: Option<String>,
    /// The machine's state as the provider reports it (pending, running, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_state: Option<String>,
    /// SSH host key of the machine (cloud providers): the key the controller generated and
    /// injected at create time, else the one pinned on first contact. Informational: the
    /// controller never trusts it over a key it generated itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key: Option<String>,
    /// What the machine costs at list prices (or would cost, before it is created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::ServerCost>,
    /// The zone the machine was created in ("" for the account default), recorded at create
    /// time: a later spec change is planned against it (a machine in one of
    /// `spec.fallbackZones` matches the spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// While no machine exists and creates find no capacity (`InsufficientCapacity`), with
    /// `spec.fallbackZones`: the zones tried in this round. The next create tries the first
    /// zone not tried; once all were, the next round starts five minutes after this one.
    /// Cleared when a machine is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_fallback: Option<ZoneFallback>,
    /// The extra disks the machine was created with (`spec.disks` then), recorded at create
    /// time: a later change of `spec.disks` is planned against them (and refused for now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::disks_schema")]
    pub disks: Option<Vec<crate::Disk>>,
    /// The image the machine was created from, recorded at create time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// What applying the spec would do to the machine (the PLAN column is its summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::Plan>,
    /// The id of the plan carried out last (an approval naming it is not stale, only used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_plan: Option<String>,
}

/// The zones a Server's creates found without capacity in one round (see
/// [`ServerStatus::zone_fallback`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneFallback {
    /// Zones tried without capacity, in the order tried (the zone, then fallback zones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 9))]
    pub tried: Vec<String>,
    /// When the round's first create found no capacity.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}
