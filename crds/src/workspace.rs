//! Workspace: an isolated environment (cluster-scoped).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::*;

/// An isolated environment: its namespace, environment profile, defaults, provider accounts
/// and limits. Namespaced resources in `spec.namespace` belong to it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "provisioning.dev",
    version = "v1alpha1",
    kind = "Workspace",
    status = "WorkspaceStatus",
    shortname = "ws",
    category = "provisioning",
    doc = "An isolated environment: namespace, environment profile, defaults, provider accounts and limits.",
    printcolumn(name = "Namespace", type_ = "string", json_path = ".status.namespace"),
    printcolumn(name = "Environment", type_ = "string", json_path = ".spec.environment"),
    printcolumn(name = "Servers", type_ = "integer", json_path = ".status.counts.servers"),
    printcolumn(name = "Resources", type_ = "string", json_path = ".status.counts.summary"),
    printcolumn(name = "Cost", type_ = "string", json_path = ".status.cost.summary"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.providers) || self.providers.all(p, self.providers.exists_one(q, q.name == p.name))",
     "message": "provider account names must be unique"},
    {"rule": "!has(self.providers) || !has(self.defaults) || !has(self.defaults.provider) || self.defaults.provider == 'local' || self.providers.exists(p, p.name == self.defaults.provider)",
     "message": "defaults.provider must name one of spec.providers"},
    {"rule": "has(self.namespace) == has(oldSelf.namespace) && (!has(self.namespace) || self.namespace == oldSelf.namespace)",
     "message": "spec.namespace is immutable: moving a Workspace to another namespace would hand the old one's objects to another Workspace's (or the default) approval and accounts; create a new Workspace instead"}
]))]
pub struct WorkspaceSpec {
    /// Namespace whose Servers, TaskServs and Clusters belong to this workspace. Defaults to
    /// the workspace's name; created if absent. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_dns1123_label")]
    pub namespace: Option<String>,
    /// Environment profile: dev, test or prod.
    #[serde(default)]
    pub environment: Environment,
    /// Defaults for resources of this workspace that leave a field empty.
    #[serde(default)]
    pub defaults: WorkspaceDefaults,
    /// Free values, visible to taskserv templates as `workspace.config.*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub config: Option<serde_json::Value>,
    /// Provider accounts usable by resources of this workspace. Without any, the controller's
    /// default account `local` is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub providers: Vec<ProviderAccount>,
    /// Limits for this workspace.
    #[serde(default)]
    pub limits: WorkspaceLimits,
    /// Approval of the namespace's Servers, TaskServs and Clusters: Automatic (plans are
    /// carried out at once, unless an object asks for Manual itself) or Manual (every plan
    /// waits for `provisioning.dev/approve: <plan id>`, set by a user who may `approve` the
    /// object; an object's own `approval: Automatic` does not loosen it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::Approval>,
    /// Under Manual approval, refuse an approval by the user who last changed the object's
    /// spec (four eyes: whoever writes a change cannot also approve it). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_distinct_approver: bool,
}

/// Environment profile of a workspace.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    /// Development.
    #[default]
    Dev,
    /// Testing.
    Test,
    /// Production.
    Prod,
}

impl Environment {
    /// Lower-case name as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Environment::Dev => "dev",
            Environment::Test => "test",
            Environment::Prod => "prod",
        }
    }
}

/// Defaults applied to resources of the workspace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceDefaults {
    /// Provider account used when a resource names none.
    #[serde(default = "default_provider")]
    #[schemars(schema_with = "dns1123_label")]
    pub provider: String,
    /// Plan (small, medium, large, xlarge or a provider-native plan) used when a Server names none.
    #[serde(default = "default_plan")]
    pub plan: String,
    /// Provider region or zone used when a Server names none.
    #[serde(default)]
    pub zone: String,
    /// Image (abstract like debian-12, or provider-native) used when a Server names none.
    #[serde(default = "default_image")]
    pub image: String,
}

impl Default for WorkspaceDefaults {
    fn default() -> Self {
        Self { provider: default_provider(), plan: default_plan(), zone: String::new(), image: default_image() }
    }
}

fn default_provider() -> String {
    "local".into()
}
fn default_plan() -> String {
    "small".into()
}
fn default_image() -> String {
    "debian-12".into()
}

/// Kind of provider behind an account.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderType {
    /// Docker containers on the controller's machine.
    Local,
    /// Amazon EC2.
    Aws,
    /// UpCloud.
    Upcloud,
    /// In-memory machines backed by a file, for scale and failure tests.
    Simulated,
}

impl ProviderType {
    /// Lower-case name as written in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderType::Local => "local",
            ProviderType::Aws => "aws",
            ProviderType::Upcloud => "upcloud",
            ProviderType::Simulated => "simulated",
        }
    }
}

/// A provider account.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.zoneSubnets) || self.type == 'aws'", "message": "zoneSubnets: only aws accounts map zones to subnets"}
]))]
pub struct ProviderAccount {
    /// Name resources use in `spec.provider`.
    #[schemars(schema_with = "dns1123_label")]
    pub name: String,
    /// Kind of provider: local, aws, upcloud or simulated.
    #[serde(rename = "type")]
    pub provider_type: ProviderType,
    /// AWS region (e.g. eu-west-1): lower-case words joined by `-` ending in a number. It
    /// names the regional endpoints (`ec2.<region>.amazonaws.com`), so nothing else is accepted.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^([a-z]{2,4}(-[a-z]{1,16}){1,3}-[0-9]{1,2})?$"), length(max = 32))]
    pub region: String,
    /// UpCloud zone (e.g. fi-hel1) or default zone for the account.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    /// API endpoint override (emulators, other partitions). Empty: the provider's public endpoint.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// Secret holding the account's credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// optional AWS_SESSION_TOKEN; or UPCLOUD_USERNAME, UPCLOUD_PASSWORD). It must live in
    /// the workspace's own namespace (a `namespace` naming another one is refused). The
    /// endpoint must be https unless the controller allows insecure endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretReference>,
    /// Image overrides: abstract image name → provider-native id (e.g. AWS AMI ids).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub images: std::collections::BTreeMap<String, String>,
    /// Simulated provider only: behaviour of the fake cloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulation: Option<SimulationSettings>,
    /// Most provider API calls per second for this account (0: the provider's default).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 10000))]
    pub rate_limit: u32,
    /// aws and upcloud: how task scripts reach the machines over SSH. The login key is
    /// `SSH_PRIVATE_KEY` in the credentials Secret, or a Server's own `spec.sshKeySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshAccess>,
    /// aws: security groups new instances join (`sg-…`). Empty: a group the controller
    /// manages for the account (`provisioning-<account>`, tagged `provisioning.dev/account`)
    /// allowing SSH from `sshSourceCidrs` and all traffic between its members, nothing else;
    /// deleted when no machine uses it any more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub security_group_ids: Vec<String>,
    /// aws: subnet new instances start in (`subnet-…`). Empty: the region's default subnet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64))]
    pub subnet_id: String,
    /// aws: the subnet of each availability zone (`eu-north-1a: subnet-…`), at most 16, all in
    /// one VPC (checked with DescribeSubnets before the first machine is made, like each
    /// subnet's zone). A Server or pool whose zone is listed starts in that zone's subnet; a
    /// zone not listed is refused before anything is created (`InvalidZone`). Empty: every
    /// machine starts in `subnetId` (or the region's default subnet).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(schema_with = "zone_subnets")]
    pub zone_subnets: std::collections::BTreeMap<String, String>,
    /// Source networks (CIDR, e.g. the controller's egress address `203.0.113.7/32`) allowed
    /// to reach SSH (22/tcp): in the aws managed group, and as the first upcloud firewall
    /// rules when `firewallRules` is set. Required there: empty stalls Servers
    /// (`SshSourcesMissing`) before anything is created; any source only when written
    /// (`0.0.0.0/0`, `::/0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ssh_source_cidrs: Vec<String>,
    /// upcloud: server firewall rules (UpCloud API 1.3 `firewall_rule`). Set: every new
    /// server gets `firewall: on` with the SSH rules of `sshSourceCidrs`, these rules in
    /// order, and a final rule dropping all other inbound traffic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub firewall_rules: Vec<FirewallRule>,
}

/// One UpCloud firewall rule (the fields of API 1.3 `firewall_rule`, camelCase).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirewallRule {
    /// `in` or `out`.
    #[schemars(regex(pattern = r"^(in|out)$"))]
    pub direction: String,
    /// `accept`, `reject` or `drop`.
    #[schemars(regex(pattern = r"^(accept|reject|drop)$"))]
    pub action: String,
    /// `IPv4` or `IPv6`. Empty: IPv4.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^(IPv4|IPv6)?$"))]
    pub family: String,
    /// `tcp`, `udp` or `icmp`. Empty: any protocol.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^(tcp|udp|icmp)?$"))]
    pub protocol: String,
    /// Source network (CIDR or single address). Empty: any source.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64))]
    pub source: String,
    /// Destination port or range (`5432`, `8000-8080`). Empty: any port.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^([0-9]{1,5}(-[0-9]{1,5})?)?$"))]
    pub destination_port: String,
    /// Free text shown in UpCloud's console.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 250))]
    pub comment: String,
}

/// How the controller reaches an account's machines over SSH.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshAccess {
    /// Login user. Empty: the provider's default (aws: admin, upcloud: root).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64), regex(pattern = r"^([a-z_][a-z0-9_.-]*)?$"))]
    pub user: String,
    /// SSH port. 0: 22.
    #[serde(default, skip_serializing_if = "is_zero_u16")]
    pub port: u16,
    /// Connect to this host instead of the machine's address (a bastion's port forward, a
    /// test sshd). The host key is still pinned per machine.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253))]
    pub address_override: String,
    /// Absolute directory on the machine that receives `nu` (`bin/nu`), the taskserv catalog
    /// (`catalog/`) and the copy marker, for login users that cannot write the default
    /// places. Empty: `/usr/local/bin/nu` and `/opt/provisioning/catalog` (needs root).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024), regex(pattern = r"^(/\S*)?$"))]
    pub remote_dir: String,
    /// Run the asset copy and every task script as root through `sudo -n`, as cloud images
    /// with a non-root login user (Debian AMIs: `admin`) expect. Unset: true when the login
    /// user is not root. The user needs passwordless sudo (`NOPASSWD`); a password prompt or a
    /// missing sudo fails the script run with a message saying so, never waits. `false` runs
    /// scripts as the login user (set `remoteDir` to a place it can write).
    #[serde(default, rename = "become", skip_serializing_if = "Option::is_none")]
    pub become_root: Option<bool>,
    /// How the controller knows a machine's SSH host key. `Generated` (default): it makes an
    /// ed25519 host key per machine (kept in the Secret `<server>-ssh-host-key`, owned by the
    /// Server), injects it through cloud-init and pins it before the first connection; a
    /// machine offering another key is refused. `FirstUse`: trust the key offered at first
    /// contact (machines whose image ignores cloud-init's `ssh_keys`, test sshds).
    #[serde(default, skip_serializing_if = "HostKeyPolicy::is_default")]
    pub host_keys: HostKeyPolicy,
}

/// How a machine's SSH host key becomes known (see [`SshAccess::host_keys`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HostKeyPolicy {
    /// Generated by the controller and injected through cloud-init.
    #[default]
    Generated,
    /// Trusted on first use.
    FirstUse,
}

impl HostKeyPolicy {
    fn is_default(&self) -> bool {
        *self == HostKeyPolicy::Generated
    }
}

fn is_zero_u16(v: &u16) -> bool {
    *v == 0
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Behaviour of the simulated provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SimulationSettings {
    /// Latency of each provider operation, in milliseconds.
    #[serde(default)]
    #[schemars(range(min = 0, max = 600000))]
    pub latency_ms: u64,
    /// Random variation of the latency, in percent of it (20 means ±20 %).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub jitter_percent: u32,
    /// Share of calls that fail with a transient error, from 0.0 to 1.0.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub failure_rate: f64,
    /// Credentials the simulated account accepts; when set, the Workspace's Secret must hold
    /// `SIMULATED_TOKEN` with this value (to exercise credential handling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_token: Option<String>,
}

/// Limits of a workspace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceLimits {
    /// Most Servers the workspace may hold.
    #[serde(default = "default_max_servers")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_servers: u32,
    /// Most provider operations in flight at once for the workspace.
    #[serde(default = "default_parallel_limit")]
    #[schemars(range(min = 1, max = 1000))]
    pub parallel_limit: u32,
    /// Monthly budget at list prices: a new Server whose machine would take the namespace's
    /// monthly total over it is refused before any provider call (Stalled, BudgetExceeded).
    /// Unset: no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly_budget: Option<crate::MonthlyBudget>,
}

impl Default for WorkspaceLimits {
    fn default() -> Self {
        Self { max_servers: default_max_servers(), parallel_limit: default_parallel_limit(), monthly_budget: None }
    }
}

fn default_max_servers() -> u32 {
    50
}
fn default_parallel_limit() -> u32 {
    5
}

/// Observed state of a Workspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// Summary for humans: Pending, Ready, Degraded (a resource of the namespace failed),
    /// Failed, Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The namespace the workspace owns (resolved from spec.namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Conditions: Ready, Reconciling, Stalled, ProvidersReady, ResourcesReady (the roll-up of
    /// the namespace's Servers, Clusters and TaskServs, naming the worst one), InUse (while
    /// deleting: the resources that still use its accounts hold it), Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// State of each provider account.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub providers: Vec<ProviderAccountStatus>,
    /// How many resources the workspace holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<WorkspaceCounts>,
    /// What the namespace's Servers with a machine cost at list prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::CostTotal>,
}

/// State of one provider account.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccountStatus {
    /// Account name.
    pub name: String,
    /// Whether the account's credentials were accepted.
    pub ready: bool,
    /// Why the account is not ready, or a short confirmation.
    #[serde(default)]
    pub message: String,
}

/// Resource counts of a workspace, and their roll-up (as `clusterctl describe` shows it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceCounts {
    /// Servers in the workspace's namespace.
    pub servers: u32,
    /// Clusters in the workspace's namespace.
    pub clusters: u32,
    /// TaskServs in the workspace's namespace.
    pub taskservs: u32,
    /// Of those, how many are Ready.
    #[serde(default)]
    pub ready: u32,
    /// How many are neither Ready nor failed (work in flight, waiting, deleting).
    #[serde(default)]
    pub progressing: u32,
    /// How many failed (Stalled, or phase Failed).
    #[serde(default)]
    pub failed: u32,
    /// For humans: `5/7 ready, 2 failed`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
}
