//! Cluster: pools of servers plus the taskservs to install on them.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::*;

/// The Cluster conditions of a Kubernetes install (a Cluster with the `kubernetes` service),
/// derived from which members' TaskServs are done, and of its exported kubeconfig.
pub mod kubernetes_condition {
    /// `kubeadm init` is done on the first control-plane server.
    pub const CONTROL_PLANE_INITIALIZED: &str = "ControlPlaneInitialized";
    /// Every control-plane server has joined (message "n/m members").
    pub const CONTROL_PLANE_AVAILABLE: &str = "ControlPlaneAvailable";
    /// Every worker has joined (message "n/m members").
    pub const WORKERS_JOINED: &str = "WorkersJoined";
    /// The CNI service (cilium) is Ready; only when the Cluster has one.
    pub const CNI_READY: &str = "CNIReady";
    /// The storage service (rook-ceph) is Ready; only when the Cluster has one.
    pub const STORAGE_READY: &str = "StorageReady";
    /// The admin kubeconfig is in the Secret `<cluster>-kubeconfig` (Cluster API's format).
    pub const KUBECONFIG_READY: &str = "KubeconfigReady";
    /// Every condition above, in the order they are reached.
    pub const ALL: [&str; 6] =
        [CONTROL_PLANE_INITIALIZED, CONTROL_PLANE_AVAILABLE, WORKERS_JOINED, CNI_READY, STORAGE_READY, KUBECONFIG_READY];
}

/// The catalog service that makes a Cluster a Kubernetes cluster (its control-plane endpoint,
/// stages and kubeconfig Secret are about it).
pub const KUBERNETES_SERVICE: &str = "kubernetes";

/// The Cluster condition of its control-plane endpoint (spec.controlPlaneEndpoint), with
/// reasons Created, Waiting, Unsupported, Failed, Deleting; absent for type None.
pub const ENDPOINT_READY: &str = "EndpointReady";

/// Suffix of the Secret holding a Kubernetes Cluster's admin kubeconfig (`<cluster>-kubeconfig`,
/// as Cluster API names it).
pub const KUBECONFIG_SECRET_SUFFIX: &str = "-kubeconfig";
/// The type of that Secret (Cluster API's).
pub const KUBECONFIG_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The label naming the Cluster on that Secret (Cluster API's).
pub const LABEL_CAPI_CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";

/// Pools of Servers plus the TaskServs to install on them, in dependency order.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "provisioning.dev",
    version = "v1alpha1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    shortname = "pcl",
    category = "provisioning",
    doc = "Pools of Servers plus the TaskServs to install on them, in dependency order.",
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "Servers", type_ = "string", json_path = ".status.servers.summary"),
    printcolumn(name = "Updated", type_ = "string", json_path = ".status.servers.updated"),
    printcolumn(name = "Cost", type_ = "string", json_path = ".status.cost.summary"),
    printcolumn(name = "Plan", type_ = "string", json_path = ".status.plan.summary"),
    printcolumn(name = "Endpoint", type_ = "string", priority = 1, json_path = ".status.controlPlaneEndpoint.address"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.pools.all(p, self.pools.exists_one(q, q.name == p.name))",
     "message": "pool names must be unique"},
    {"rule": "!has(self.taskservs) || self.taskservs.all(t, !has(t.pools) || t.pools.all(n, self.pools.exists(p, p.name == n)))",
     "message": "taskservs[].pools must name pools of spec.pools"}
]))]
pub struct ClusterSpec {
    /// Provider account for the cluster's servers. Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(schema_with = "optional_dns1123_label")]
    pub provider: String,
    /// Pools of identical servers.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pools: Vec<ServerPool>,
    /// Services to install, with the pools they go on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["service"]))]
    pub taskservs: Vec<ClusterTaskServ>,
    /// Operations in flight at once for this cluster.
    #[serde(default = "default_parallel_limit")]
    #[schemars(range(min = 1, max = 1000))]
    pub parallel_limit: u32,
    /// What a failed rollout leaves behind: Retain it, or Rollback what it changed.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Other Clusters (same namespace) that must be Ready first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "dns1123_label_set")]
    pub depends_on: Vec<String>,
    /// Approval of the Cluster's plan and of its Servers and TaskServs (written into their
    /// `spec.approval`): Automatic, or Manual (each member's plan waits for
    /// `provisioning.dev/approve`; the annotation on the Cluster naming its `status.plan.id`
    /// approves, for every member, what that plan covers). Unset: the Workspace's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::Approval>,
    /// A stable address for the Kubernetes API that outlives any one control-plane server: a
    /// cloud load balancer, a floating IP, or a keepalived VIP. Created before `kubeadm init`
    /// (the kubernetes service's `controlPlaneEndpoint` is set to it), kept pointing at the
    /// control-plane members, deleted with the Cluster. Unset: type None.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ControlPlaneEndpoint>,
}

/// What carries a Cluster's control-plane endpoint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum EndpointType {
    /// A cloud load balancer (TCP, health-checked) with the control-plane machines as targets.
    LoadBalancer,
    /// A floating (elastic) IP assigned to one live control-plane machine, moved when it goes.
    #[serde(rename = "FloatingIP")]
    FloatingIp,
    /// A virtual IP in the machines' subnet held by keepalived on the control-plane servers,
    /// with haproxy in front of the API servers (installed by the template; nothing is
    /// created at the provider).
    #[serde(rename = "VIP")]
    Vip,
    /// No managed endpoint: the first control plane's address (or the kubernetes service's
    /// own `controlPlaneEndpoint`).
    #[default]
    None,
}

impl EndpointType {
    /// As written in spec and status.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointType::LoadBalancer => "LoadBalancer",
            EndpointType::FloatingIp => "FloatingIP",
            EndpointType::Vip => "VIP",
            EndpointType::None => "None",
        }
    }
}

/// The API server's port behind a control-plane endpoint unless set.
pub const DEFAULT_API_PORT: u16 = 6443;

fn default_api_port() -> u16 {
    DEFAULT_API_PORT
}

/// A Cluster's control-plane endpoint (spec).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.type != 'VIP' || (has(self.address) && self.address != '')",
     "message": "controlPlaneEndpoint.address is required for type VIP (a free IPv4 address in the machines' subnet)"},
    {"rule": "self.type == 'VIP' || !has(self.address) || self.address == ''",
     "message": "controlPlaneEndpoint.address is only for type VIP (the provider assigns the address of a LoadBalancer or FloatingIP)"}
]))]
pub struct ControlPlaneEndpoint {
    /// LoadBalancer, FloatingIP, VIP or None.
    #[serde(rename = "type", default)]
    pub endpoint_type: EndpointType,
    /// TCP port clients connect to (the API servers listen on 6443).
    #[serde(default = "default_api_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// VIP only: the virtual IPv4 address (free, in the control-plane machines' subnet).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 15), regex(pattern = r"^(([0-9]{1,3}\.){3}[0-9]{1,3})?$"))]
    pub address: String,
}

impl Default for ControlPlaneEndpoint {
    fn default() -> Self {
        ControlPlaneEndpoint { endpoint_type: EndpointType::None, port: DEFAULT_API_PORT, address: String::new() }
    }
}

/// A Cluster's control-plane endpoint as it is (status).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneEndpointStatus {
    /// LoadBalancer, FloatingIP or VIP.
    #[serde(rename = "type")]
    pub endpoint_type: String,
    /// The address clients use (a DNS name or an IP); empty while the provider assigns it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// The TCP port.
    pub port: u16,
    /// The provider's id of the load balancer or IP (empty for a VIP).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The machines it points at (provider ids): a load balancer's targets, the one machine
    /// holding a floating IP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub targets: Vec<String>,
    /// Its list price (from the provider's price table, with the source), counted in the
    /// Cluster's `status.cost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::ServerCost>,
}

fn default_parallel_limit() -> u32 {
    5
}

/// A pool of identical servers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.zones) || size(self.zones) == 0 || !has(self.zone) || self.zone == ''",
     "message": "set zone or zones (the zones the pool's members are spread over), not both"}
]))]
pub struct ServerPool {
    /// Pool name; servers are named `<cluster>-<pool>-<index>`.
    #[schemars(schema_with = "dns1123_label")]
    pub name: String,
    /// Number of servers.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: u32,
    /// Plan of the pool's servers. Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plan: String,
    /// Zone of the pool's servers. Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    /// Zones the pool's servers are spread over, in order: member `i` is in `zones[i % n]`
    /// (three zones, three replicas: one per zone). Instead of `zone` (not both). A member's
    /// fallback zones are the pool's `fallbackZones` other than its own zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "pool_zones")]
    pub zones: Vec<String>,
    /// Image of the pool's servers. Empty: the workspace default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// aws: the IAM instance profile of the pool's servers (an IAM name or
    /// `arn:aws:iam::<12 digits>:instance-profile/<name>`; see Server `instanceProfile`).
    /// Empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(schema_with = "optional_instance_profile")]
    pub instance_profile: String,
    /// Zones tried, in order, when `zone` has no capacity for a member (see Server
    /// `fallbackZones`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "fallback_zones")]
    pub fallback_zones: Vec<String>,
    /// Whether the pool's servers get a public IPv4 address (see Server `publicIp`). Unset:
    /// the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<bool>,
    /// Extra disks of each of the pool's servers (see Server `disks`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::disks_schema")]
    pub disks: Vec<crate::Disk>,
    /// Labels put on the pool's Servers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Rolling updates of this pool: of its machines (a plan, zone or image change) and of the
    /// services on its servers (a version or config change), gated on health. Unset: all at
    /// once. A service on several pools uses the smallest `maxUnavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<PoolRollout>,
}

/// How a pool is updated (Kubernetes Deployment's RollingUpdate, with whole machines).
///
/// Machines: a member whose plan, zone or image changed is updated (in place or by a new
/// machine, as its own plan says) only while no more than `maxUnavailable` members are
/// unavailable, counting members being updated; `maxSurge` extra servers of the new spec
/// (named `<cluster>-<pool>-surge-<n>`, with the pool's services) come up first and go once
/// every member is updated, so `maxUnavailable: 0, maxSurge: 1` never has fewer than
/// `replicas` servers serving. A member is available when it is Ready and every service of
/// the cluster on it is installed and healthy on its current machine. A member that fails
/// holds the rollout there.
///
/// Services: a version or config change re-installs at most `maxUnavailable` (at least 1)
/// servers at a time. A surge server joins the services' server lists, so services whose
/// configuration names their peers re-render on every member twice (when it joins and when
/// it leaves): for such pools (etcd) use `maxSurge: 0`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRollout {
    /// Members updated (taken down) at once. 0 only together with a `maxSurge` above 0.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_unavailable: u32,
    /// Extra servers of the new spec brought up before members are taken down.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 100))]
    pub max_surge: u32,
}

impl Default for PoolRollout {
    fn default() -> Self {
        PoolRollout { max_unavailable: default_max_unavailable(), max_surge: 0 }
    }
}

fn default_max_unavailable() -> u32 {
    1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A service of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTaskServ {
    /// Catalog name of the service.
    #[schemars(schema_with = "dns1123_label")]
    pub service: String,
    /// Pools whose servers get the service. Empty: every pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "dns1123_label_set")]
    pub pools: Vec<String>,
    /// Version. Empty: the catalog default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Service configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub config: Option<serde_json::Value>,
    /// Values merged into `config` from Secrets and ConfigMaps of the Cluster's namespace,
    /// passed as they are to the TaskServ (resolved there; no value is copied).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_from: Vec<crate::taskserv::ConfigFromSource>,
}

/// What a failed rollout leaves behind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FailurePolicy {
    /// Keep what was created, for inspection.
    #[default]
    Retain,
    /// Undo the failed step: reinstall the last good versions, remove what the rollout added.
    Rollback,
}

/// Observed state of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Summary for humans: Pending, Provisioning, Installing, Ready, Degraded, Failed, Deleting,
    /// AwaitingApproval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: Ready, Reconciling, Stalled, ServersReady, TaskServsReady, Paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Server counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub servers: Option<ClusterServerCounts>,
    /// Phase of each service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["service"]))]
    pub taskservs: Vec<ClusterTaskServStatus>,
    /// The rollout plan and each step's progress (the checkpoint a restarted controller resumes from).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"]))]
    pub steps: Vec<ClusterStep>,
    /// What the cluster's Servers with a machine cost at list prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::CostTotal>,
    /// What applying the spec would still change: Servers and TaskServs to create, update or
    /// delete, and what member Servers' and TaskServs' own plans would do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::Plan>,
    /// The plan approved under Manual approval (`provisioning.dev/approve` on the Cluster):
    /// what it covers goes on (approved for each member) while the plan shrinks; anything
    /// beyond it waits for a new approval. Once carried out in full its changes are cleared:
    /// an annotation still naming its id is not stale, but it covers nothing any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_plan: Option<crate::Plan>,
    /// The control-plane endpoint (spec.controlPlaneEndpoint) as created at the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ControlPlaneEndpointStatus>,
}

/// Server counts of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterServerCounts {
    /// Servers the pools ask for.
    pub desired: u32,
    /// Servers that are Ready.
    pub ready: u32,
    /// `updated/desired`: members whose machine matches their pool's spec and that are
    /// available again (a rolling update's progress), for the printer column.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub updated: String,
    /// `ready/desired`, for the printer column.
    #[serde(default)]
    pub summary: String,
}

/// Phase of one service of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTaskServStatus {
    /// Catalog name.
    pub service: String,
    /// Phase of its TaskServ.
    #[serde(default)]
    pub phase: String,
}

/// One step of a cluster rollout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStep {
    /// Stable id, e.g. `servers/members` or `taskserv/etcd`.
    pub id: String,
    /// Kind of step: Servers, TaskServ, Teardown.
    pub kind: String,
    /// What the step acts on.
    #[serde(default)]
    pub target: String,
    /// Pending, Running, Succeeded, Failed.
    pub state: String,
    /// When it started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Progress or error for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
