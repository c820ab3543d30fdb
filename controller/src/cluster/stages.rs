//! Stages of a Kubernetes install you can watch: the Cluster conditions
//! ControlPlaneInitialized, ControlPlaneAvailable ("n/m members"), WorkersJoined ("n/m
//! members"), CNIReady and StorageReady, for a Cluster with the `kubernetes` service.
//!
//! Derived only from which members' TaskServs are done (a member is done when its
//! `kubernetes` entry in the TaskServ's status serves: a version installed, not failed, its
//! check passing) and from the roles the controller assigns (the first server by name of the
//! control-plane pool runs `kubeadm init`, as the scripts' `role` does), never from what a
//! script printed: a machine can only make its own member look done or not.

use provisioning_crds::{LABEL_POOL, kubernetes_condition as kc};
use provisioning_taskservs::Catalog;

use super::plan::{ChildServer, ChildTaskServ};
use crate::conditions::{DesiredCondition, Status};

/// The Kubernetes service of the catalog.
pub const KUBERNETES: &str = provisioning_crds::KUBERNETES_SERVICE;
/// Services that are a cluster's CNI.
pub const CNI_SERVICES: &[&str] = &["cilium"];
/// Services that are a cluster's storage.
pub const STORAGE_SERVICES: &[&str] = &["rook-ceph"];
/// The control-plane pool when the kubernetes config does not name one.
const DEFAULT_CONTROL_PLANE_POOL: &str = "control-plane";

/// Who is what in a Kubernetes Cluster, as the controller assigns it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roles {
    /// The control-plane servers, by name; the first runs `kubeadm init`.
    pub control_planes: Vec<String>,
    /// The other servers the kubernetes TaskServ targets.
    pub workers: Vec<String>,
}

impl Roles {
    /// The server that runs `kubeadm init` (and alone exports the admin kubeconfig).
    pub fn init(&self) -> Option<&str> {
        self.control_planes.first().map(String::as_str)
    }
}

/// The Cluster's `kubernetes` TaskServ (owned, not being deleted), if it has one.
pub fn kubernetes_taskserv(taskservs: &[ChildTaskServ]) -> Option<&ChildTaskServ> {
    taskservs.iter().find(|t| t.spec.service == KUBERNETES && t.owned && !t.deleting)
}

/// A string of the kubernetes TaskServ's config (what its scripts get), if set.
pub fn config_str<'a>(ts: &'a ChildTaskServ, key: &str) -> Option<&'a str> {
    ts.spec.config.as_ref()?.get(key)?.as_str()
}

/// The roles of the servers `k8s` targets (its `servers.names`, else every live member).
pub fn roles(k8s: &ChildTaskServ, servers: &[ChildServer]) -> Roles {
    let pool = config_str(k8s, "controlPlanePool").unwrap_or(DEFAULT_CONTROL_PLANE_POOL);
    let mut targets: Vec<&ChildServer> = if k8s.spec.servers.names.is_empty() {
        servers.iter().filter(|s| !s.deleting).collect()
    } else {
        servers.iter().filter(|s| k8s.spec.servers.names.contains(&s.name)).collect()
    };
    targets.sort_by(|a, b| a.name.cmp(&b.name));
    let is_cp = |s: &ChildServer| pool.is_empty() || s.labels.get(LABEL_POOL).map(String::as_str) == Some(pool);
    Roles {
        control_planes: targets.iter().filter(|s| is_cp(s)).map(|s| s.name.clone()).collect(),
        workers: targets.iter().filter(|s| !is_cp(s)).map(|s| s.name.clone()).collect(),
    }
}

fn joined(k8s: &ChildTaskServ, members: &[String]) -> usize {
    members.iter().filter(|m| k8s.serving.contains_key(*m)).count()
}

/// The stage conditions of a Cluster (empty without the kubernetes service).
pub fn conditions(servers: &[ChildServer], taskservs: &[ChildTaskServ], catalog: &Catalog) -> Vec<DesiredCondition> {
    let Some(k8s) = kubernetes_taskserv(taskservs) else { return Vec::new() };
    let roles = roles(k8s, servers);
    let mut out = Vec::new();
    let initialized = roles.init().is_some_and(|i| k8s.serving.contains_key(i));
    out.push(match roles.init() {
        None => DesiredCondition::new(kc::CONTROL_PLANE_INITIALIZED, Status::False, "NoControlPlane", "no control-plane server yet"),
        Some(init) if initialized => {
            DesiredCondition::new(kc::CONTROL_PLANE_INITIALIZED, Status::True, "Initialized", format!("kubeadm init done on {init}"))
        }
        Some(init) => DesiredCondition::new(
            kc::CONTROL_PLANE_INITIALIZED,
            Status::False,
            "WaitingForInit",
            format!("kubeadm init on {init} not done yet"),
        ),
    });
    let (n, m) = (joined(k8s, &roles.control_planes), roles.control_planes.len());
    out.push(if n == m && m > 0 {
        DesiredCondition::new(kc::CONTROL_PLANE_AVAILABLE, Status::True, "MembersJoined", format!("{n}/{m} members"))
    } else {
        DesiredCondition::new(kc::CONTROL_PLANE_AVAILABLE, Status::False, "MembersJoining", format!("{n}/{m} members"))
    });
    let (n, m) = (joined(k8s, &roles.workers), roles.workers.len());
    out.push(if n == m {
        DesiredCondition::new(kc::WORKERS_JOINED, Status::True, "MembersJoined", format!("{n}/{m} members"))
    } else if !initialized {
        DesiredCondition::new(kc::WORKERS_JOINED, Status::False, "WaitingForControlPlane", format!("{n}/{m} members"))
    } else {
        DesiredCondition::new(kc::WORKERS_JOINED, Status::False, "MembersJoining", format!("{n}/{m} members"))
    });
    if let Some(c) = service_condition(kc::CNI_READY, CNI_SERVICES, taskservs, catalog) {
        out.push(c);
    }
    if let Some(c) = service_condition(kc::STORAGE_READY, STORAGE_SERVICES, taskservs, catalog) {
        out.push(c);
    }
    out
}

/// Ready when the Cluster's TaskServ of one of `services` is Ready and its downloads are
/// pinned ([`super::pins`]); none when it has no such service.
fn service_condition(type_: &str, services: &[&str], taskservs: &[ChildTaskServ], catalog: &Catalog) -> Option<DesiredCondition> {
    let ts = taskservs.iter().find(|t| services.contains(&t.spec.service.as_str()) && t.owned && !t.deleting)?;
    let service = &ts.spec.service;
    Some(if let Some(missing) = super::pins::missing(ts, catalog) {
        DesiredCondition::new(type_, Status::False, "PinMissing", missing)
    } else if ts.ready {
        DesiredCondition::new(type_, Status::True, "Ready", format!("{service} ready on {} servers", ts.serving.len()))
    } else if let Some(stalled) = &ts.stalled {
        DesiredCondition::new(type_, Status::False, "Stalled", format!("{service}: {stalled}"))
    } else {
        let why = if ts.message.is_empty() { ts.phase.clone() } else { ts.message.clone() };
        DesiredCondition::new(type_, Status::False, "Installing", format!("{service}: {why}").trim_end_matches(": ").to_string())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use provisioning_crds::{ServerSelection, TaskServSpec};

    use super::*;

    fn server(name: &str, pool: &str) -> ChildServer {
        ChildServer {
            name: name.into(),
            labels: BTreeMap::from([(LABEL_POOL.to_string(), pool.to_string())]),
            spec: Default::default(),
            owned: true,
            ready: true,
            stalled: None,
            deleting: false,
            machine_failed: false,
            pending_since: None,
            pending_plan: None,
            provider_id: None,
            observed_current: true,
            approve: None,
        }
    }

    fn taskserv(service: &str, serving: &[&str], ready: bool) -> ChildTaskServ {
        ChildTaskServ {
            name: format!("k8s-{service}"),
            labels: BTreeMap::new(),
            spec: TaskServSpec { service: service.into(), servers: ServerSelection::default(), ..Default::default() },
            owned: true,
            ready,
            stalled: None,
            phase: "Installing".into(),
            message: String::new(),
            servers_in_status: Default::default(),
            was_ever_ready: false,
            deleting: false,
            serving: serving.iter().map(|s| (s.to_string(), None)).collect(),
            pending_plan: None,
            approve: None,
            settled: true,
        }
    }

    fn get<'a>(conds: &'a [DesiredCondition], t: &str) -> Option<(&'a str, &'a str, &'a str)> {
        conds.iter().find(|c| c.type_ == t).map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
    }

    fn catalog() -> Catalog {
        Catalog::load(&Catalog::default_dir()).unwrap_or_else(|e| unreachable!("the catalog loads: {e}"))
    }

    #[test]
    fn stages_follow_which_members_are_done() {
        let catalog = catalog();
        let servers = [server("k8s-cp-1", "control-plane"), server("k8s-cp-0", "control-plane"), server("k8s-w-0", "workers")];
        // Nothing done yet: the first control plane by name is the one kubeadm init waits for.
        let conds = conditions(&servers, &[taskserv("kubernetes", &[], false)], &catalog);
        assert_eq!(get(&conds, kc::CONTROL_PLANE_INITIALIZED), Some(("False", "WaitingForInit", "kubeadm init on k8s-cp-0 not done yet")));
        assert_eq!(get(&conds, kc::CONTROL_PLANE_AVAILABLE), Some(("False", "MembersJoining", "0/2 members")));
        assert_eq!(get(&conds, kc::WORKERS_JOINED), Some(("False", "WaitingForControlPlane", "0/1 members")));
        assert_eq!(get(&conds, kc::CNI_READY), None, "no CNI service, no condition");
        // A worker done before init (a forged or early success) does not initialise anything.
        let conds = conditions(&servers, &[taskserv("kubernetes", &["k8s-w-0", "k8s-cp-1"], false)], &catalog);
        assert_eq!(get(&conds, kc::CONTROL_PLANE_INITIALIZED).map(|c| c.0), Some("False"));
        assert_eq!(get(&conds, kc::CONTROL_PLANE_AVAILABLE).map(|c| c.2), Some("1/2 members"));
        // Init done, one of two control planes.
        let conds = conditions(&servers, &[taskserv("kubernetes", &["k8s-cp-0"], false), taskserv("cilium", &[], false)], &catalog);
        assert_eq!(get(&conds, kc::CONTROL_PLANE_INITIALIZED), Some(("True", "Initialized", "kubeadm init done on k8s-cp-0")));
        assert_eq!(get(&conds, kc::CONTROL_PLANE_AVAILABLE), Some(("False", "MembersJoining", "1/2 members")));
        assert_eq!(get(&conds, kc::WORKERS_JOINED), Some(("False", "MembersJoining", "0/1 members")));
        assert_eq!(get(&conds, kc::CNI_READY).map(|c| (c.0, c.1)), Some(("False", "Installing")), "the catalog pins the default CLI");
        let mut unpinned = taskserv("cilium", &[], false);
        unpinned.spec.config = Some(serde_json::json!({"cliVersion": "v0.16.21"}));
        let conds = conditions(&servers, &[taskserv("kubernetes", &["k8s-cp-0"], false), unpinned], &catalog);
        assert_eq!(get(&conds, kc::CNI_READY).map(|c| (c.0, c.1)), Some(("False", "PinMissing")), "no pin for v0.16.21");
        // All done.
        let all = ["k8s-cp-0", "k8s-cp-1", "k8s-w-0"];
        let pin = "0".repeat(64);
        let mut cilium = taskserv("cilium", &["k8s-cp-0"], false);
        cilium.spec.config = Some(serde_json::json!({"cliSha256": {"v0.16.22": pin}}));
        let conds = conditions(&servers, &[taskserv("kubernetes", &all, true), cilium.clone()], &catalog);
        assert_eq!(get(&conds, kc::CNI_READY).map(|c| (c.0, c.1)), Some(("False", "Installing")));
        cilium.ready = true;
        let mut rook = taskserv("rook-ceph", &all, true);
        let keys = ["v1.15.6/crds.yaml", "v1.15.6/common.yaml", "v1.15.6/operator.yaml"];
        rook.spec.config = Some(
            serde_json::json!({"manifestSha256": keys.iter().map(|k| (k.to_string(), serde_json::json!(pin))).collect::<serde_json::Map<_, _>>()}),
        );
        let ts = [taskserv("kubernetes", &all, true), cilium, rook];
        let conds = conditions(&servers, &ts, &catalog);
        assert_eq!(get(&conds, kc::CONTROL_PLANE_AVAILABLE), Some(("True", "MembersJoined", "2/2 members")));
        assert_eq!(get(&conds, kc::WORKERS_JOINED), Some(("True", "MembersJoined", "1/1 members")));
        assert_eq!(get(&conds, kc::CNI_READY), Some(("True", "Ready", "cilium ready on 1 servers")));
        assert_eq!(get(&conds, kc::STORAGE_READY), Some(("True", "Ready", "rook-ceph ready on 3 servers")));
        // No kubernetes service: no stage conditions at all.
        assert!(conditions(&servers, &[taskserv("etcd", &all, true)], &catalog).is_empty());
    }

    #[test]
    fn roles_follow_the_configured_pool_and_the_selected_servers() {
        let servers = [server("a", "masters"), server("b", "masters"), server("c", "control-plane"), server("d", "other")];
        let mut k8s = taskserv("kubernetes", &[], false);
        k8s.spec.config = Some(serde_json::json!({"controlPlanePool": "masters"}));
        let roles = roles(&k8s, &servers);
        assert_eq!((roles.init(), roles.control_planes.len(), roles.workers.len()), (Some("a"), 2, 2));
        k8s.spec.servers.names = vec!["b".into(), "d".into()];
        let roles = super::roles(&k8s, &servers);
        assert_eq!((roles.init(), roles.workers.as_slice()), (Some("b"), ["d".to_string()].as_slice()));
        // An empty pool: every server is a control plane (the scripts' standalone rule).
        k8s.spec.config = Some(serde_json::json!({"controlPlanePool": ""}));
        assert!(super::roles(&k8s, &servers).workers.is_empty());
    }
}
