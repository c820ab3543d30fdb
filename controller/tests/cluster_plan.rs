//! Cluster validation and planning (pure) from YAML fixtures and a fixture catalog.

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use provisioning_controller::cluster::approval;
use provisioning_controller::cluster::plan::{self, ChildServer, ChildTaskServ, Observed, OtherCluster, Plan};
use provisioning_controller::cluster::validate::{self, InvalidCluster, ServicePlan};
use provisioning_controller::taskserv::approval::Gate;
use provisioning_crds::{Approval, ChangeAction, Cluster, ClusterStatus, Server, TaskServ};
use provisioning_taskservs::Catalog;

fn catalog() -> Catalog {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/taskserv_fixtures/catalog");
    Catalog::load(&dir).expect("fixture catalog loads")
}

fn cluster(yaml: &str) -> Cluster {
    serde_yaml_ng::from_str(yaml).expect("fixture parses")
}

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

const ETCD: &str = r#"
apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {name: etcd, namespace: dev, uid: c-1, generation: 1}
spec:
  provider: local
  pools: [{name: members, replicas: 3, plan: small, labels: {tier: data}}]
  taskservs: [{service: store, config: {port: 2379}}]
"#;

const K8S: &str = r#"
apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {name: k8s, namespace: dev, uid: c-2, generation: 1}
spec:
  pools:
  - {name: cp, replicas: 1}
  - {name: workers, replicas: 2}
  taskservs: [{service: orchestrator, pools: [cp, workers]}]
"#;

/// The world as one planning pass sees it; `step` applies a plan's actions to it and lets
/// children become ready, as the other reconcilers would.
struct World {
    cluster: Cluster,
    status: ClusterStatus,
    services: Result<Vec<ServicePlan>, InvalidCluster>,
    servers: Vec<ChildServer>,
    taskservs: Vec<ChildTaskServ>,
    clusters: Vec<OtherCluster>,
    now: Timestamp,
}

impl World {
    fn new(yaml: &str) -> World {
        World::with_catalog(yaml, &catalog())
    }

    fn with_catalog(yaml: &str, catalog: &Catalog) -> World {
        let cluster = cluster(yaml);
        let services = validate::validate(&cluster.metadata.name.clone().unwrap_or_default(), &cluster.spec, catalog);
        World {
            status: cluster.status.clone().unwrap_or_default(),
            cluster,
            services,
            servers: vec![],
            taskservs: vec![],
            clusters: vec![],
            now: t("2025-01-01T00:00:00Z"),
        }
    }

    fn observed(&self) -> Observed<'_> {
        Observed {
            name: self.cluster.metadata.name.as_deref().unwrap_or_default(),
            uid: self.cluster.metadata.uid.as_deref().unwrap_or_default(),
            generation: self.cluster.metadata.generation,
            spec: &self.cluster.spec,
            status: &self.status,
            services: &self.services,
            servers: &self.servers,
            taskservs: &self.taskservs,
            clusters: &self.clusters,
            now: self.now,
            endpoint: provisioning_controller::cluster::plan::EndpointGate::of(
                &self.cluster.spec,
                self.status.control_plane_endpoint.as_ref(),
            ),
        }
    }

    fn plan(&self) -> Plan {
        plan::plan(&self.observed())
    }

    /// One reconcile pass: plan, then commit what it says.
    fn pass(&mut self) -> Plan {
        let plan = self.plan();
        self.commit(&plan);
        plan
    }

    /// `yaml`'s first pass committed and its Servers ready; returns the world and the next
    /// plan (not committed), the one that starts the TaskServs.
    fn with_servers_up(yaml: &str) -> (World, Plan) {
        let mut w = World::new(yaml);
        w.pass();
        w.servers_ready();
        let next = w.plan();
        (w, next)
    }

    /// `status.plan` of the Cluster as it stands (services must be valid).
    fn cluster_plan(&self) -> provisioning_crds::Plan {
        plan::cluster_plan(&self.observed(), "dev", self.services.as_ref().expect("valid"))
    }

    /// The Manual approval decision for `shown` under the annotation `annotation`.
    fn decide(&self, annotation: &str, shown: &provisioning_crds::Plan) -> approval::Decision {
        let o = self.observed();
        approval::decide(Approval::Manual, Some(annotation), shown, &self.status, &approval::members(&o, "dev"))
    }

    /// Writes the plan's status and performs its applies and deletes (children start not ready).
    fn commit(&mut self, plan: &Plan) {
        self.status = plan.status.clone();
        for s in &plan.apply_servers {
            let child = server_child(s);
            match self.servers.iter_mut().find(|c| c.name == child.name) {
                Some(c) => {
                    c.spec = child.spec;
                    c.labels = child.labels;
                }
                None => self.servers.push(child),
            }
        }
        for ts in &plan.apply_taskservs {
            let child = taskserv_child(ts);
            match self.taskservs.iter_mut().find(|c| c.name == child.name) {
                Some(c) => {
                    c.spec = child.spec;
                    c.ready = false;
                }
                None => self.taskservs.push(child),
            }
        }
        for name in &plan.delete_servers {
            self.servers.retain(|s| &s.name != name);
        }
        for name in &plan.delete_taskservs {
            self.taskservs.retain(|s| &s.name != name);
        }
    }

    fn servers_ready(&mut self) {
        for s in &mut self.servers {
            s.ready = true;
        }
    }

    fn taskserv_ready(&mut self, name: &str) {
        let ts = self.taskservs.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("no TaskServ {name}"));
        ts.ready = true;
        ts.phase = "Ready".into();
        ts.was_ever_ready = true;
        ts.servers_in_status = ts.spec.servers.names.iter().cloned().collect();
        ts.serving = ts.spec.servers.names.iter().map(|n| (n.clone(), None)).collect();
    }

    /// Drives the rollout to Ready: each pass makes existing children ready.
    fn converge(&mut self) -> Plan {
        for _ in 0..20 {
            let plan = self.plan();
            self.commit(&plan);
            if self.status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True") {
                return plan;
            }
            self.servers_ready();
            let names: Vec<String> = self.taskservs.iter().map(|t| t.name.clone()).collect();
            for n in names {
                self.taskserv_ready(&n);
            }
        }
        panic!("did not converge: {:#?}", self.status);
    }
}

fn server_child(s: &Server) -> ChildServer {
    ChildServer {
        name: s.metadata.name.clone().unwrap_or_default(),
        labels: s.metadata.labels.clone().unwrap_or_default(),
        spec: s.spec.clone(),
        owned: true,
        ready: false,
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

fn taskserv_child(ts: &TaskServ) -> ChildTaskServ {
    ChildTaskServ {
        name: ts.metadata.name.clone().unwrap_or_default(),
        labels: ts.metadata.labels.clone().unwrap_or_default(),
        spec: ts.spec.clone(),
        owned: true,
        ready: false,
        stalled: None,
        phase: "Installing".into(),
        message: "installing".into(),
        servers_in_status: BTreeSet::new(),
        was_ever_ready: false,
        deleting: false,
        serving: Default::default(),
        pending_plan: None,
        approve: None,
        settled: true,
    }
}

/// One planned change, as a member's own plan lists it.
fn change(resource: String, field: &str, action: ChangeAction, from: &str, to: &str, reason: &str) -> provisioning_crds::PlannedChange {
    provisioning_crds::PlannedChange { resource, field: field.into(), action, from: from.into(), to: to.into(), reason: reason.into() }
}

/// A member's pending plan with one change.
fn pending(id: &str, summary: &str, change: provisioning_crds::PlannedChange) -> provisioning_crds::Plan {
    provisioning_crds::Plan { id: id.into(), summary: summary.into(), changes: vec![change], ..Default::default() }
}

/// The etcd-store TaskServ a plan applies.
fn store_in(plan: &Plan) -> &TaskServ {
    plan.apply_taskservs.iter().find(|t| t.metadata.name.as_deref() == Some("etcd-store")).expect("TaskServ etcd-store applied")
}

/// Names of the TaskServs a plan applies.
fn applied_taskservs(plan: &Plan) -> Vec<String> {
    plan.apply_taskservs.iter().filter_map(|t| t.metadata.name.clone()).collect()
}

fn cond<'a>(status: &'a ClusterStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("condition {type_} missing"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn step<'a>(status: &'a ClusterStatus, id: &str) -> &'a provisioning_crds::ClusterStep {
    status.steps.iter().find(|s| s.id == id).unwrap_or_else(|| panic!("step {id} missing: {:#?}", status.steps))
}

#[test]
fn pools_become_owned_labelled_servers() {
    let w = World::new(ETCD);
    let plan = w.plan();
    assert_eq!(World::applied(&plan), ["etcd-members-0", "etcd-members-1", "etcd-members-2"]);
    let s = &plan.apply_servers[0];
    let labels = s.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("provisioning.dev/cluster").map(String::as_str), Some("etcd"));
    assert_eq!(labels.get("provisioning.dev/pool").map(String::as_str), Some("members"));
    assert_eq!(labels.get("tier").map(String::as_str), Some("data"));
    let owner = &s.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Cluster", "etcd", "c-1"));
    assert_eq!(owner.controller, Some(true));
    assert_eq!(s.spec.provider, "local");
    assert_eq!(s.spec.plan, "small");
    // No TaskServ before its servers are up.
    assert!(plan.apply_taskservs.is_empty());
    assert_eq!(step(&plan.status, "servers/members").state, "Running");
    assert_eq!(step(&plan.status, "taskserv/store").state, "Pending");
    assert_eq!(cond(&plan.status, "Reconciling").0, "True");
    assert_eq!(plan.status.phase.as_deref(), Some("Provisioning"));
}

#[test]
fn a_pools_instance_profile_reaches_its_servers() {
    let yaml = K8S.replace("{name: workers, replicas: 2}", "{name: workers, replicas: 2, instanceProfile: eks-node}");
    let plan = World::new(&yaml).plan();
    let profiles: Vec<(&str, &str)> =
        plan.apply_servers.iter().map(|s| (s.metadata.name.as_deref().unwrap_or_default(), s.spec.instance_profile.as_str())).collect();
    assert_eq!(profiles, [("k8s-cp-0", ""), ("k8s-workers-0", "eks-node"), ("k8s-workers-1", "eks-node")]);
}

#[test]
fn a_pool_spread_over_zones_puts_one_member_in_each_and_falls_back_to_the_others() {
    let yaml = ETCD.replace(
        "plan: small, labels: {tier: data}}",
        "plan: small, zones: [eu-north-1a, eu-north-1b, eu-north-1c], fallbackZones: [eu-north-1b, eu-north-1c, eu-north-1a], publicIp: false, labels: {tier: data}}",
    );
    let plan = World::new(&yaml).plan();
    let placed: Vec<(String, String, Vec<String>, Option<bool>)> = plan
        .apply_servers
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.spec.zone.clone(), s.spec.fallback_zones.clone(), s.spec.public_ip))
        .collect();
    let z = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        placed,
        [
            ("etcd-members-0".into(), "eu-north-1a".into(), z(&["eu-north-1b", "eu-north-1c"]), Some(false)),
            ("etcd-members-1".into(), "eu-north-1b".into(), z(&["eu-north-1c", "eu-north-1a"]), Some(false)),
            ("etcd-members-2".into(), "eu-north-1c".into(), z(&["eu-north-1b", "eu-north-1a"]), Some(false)),
        ]
    );
    // zone and zones together, or a zone twice: refused.
    let both = ETCD.replace("plan: small,", "plan: small, zone: eu-north-1a, zones: [eu-north-1b],");
    let refused = validate::validate("etcd", &cluster(&both).spec, &catalog()).expect_err("zone and zones");
    assert!(refused.reason == "InvalidPool" && refused.message.contains("zones"), "{refused:?}");
    let twice = ETCD.replace("plan: small,", "plan: small, zones: [eu-north-1a, eu-north-1a],");
    assert_eq!(validate::validate("etcd", &cluster(&twice).spec, &catalog()).map_err(|e| e.reason), Err("InvalidPool"));
}

#[test]
fn a_pools_disks_are_each_members_and_bad_ones_are_refused_naming_the_pool() {
    let yaml = ETCD.replace(
        "plan: small, labels: {tier: data}}",
        "plan: small, disks: [{name: osd, size: 100Gi}, {name: wal, size: 10Gi, deletionPolicy: Retain}], labels: {tier: data}}",
    );
    let plan = World::new(&yaml).plan();
    assert!(!plan.apply_servers.is_empty());
    for s in &plan.apply_servers {
        let disks: Vec<(&str, &str, provisioning_crds::DiskDeletionPolicy)> =
            s.spec.disks.iter().map(|d| (d.name.as_str(), d.size.as_str(), d.deletion_policy)).collect();
        assert_eq!(
            disks,
            [
                ("osd", "100Gi", provisioning_crds::DiskDeletionPolicy::Delete),
                ("wal", "10Gi", provisioning_crds::DiskDeletionPolicy::Retain)
            ],
            "{:?}",
            s.metadata.name
        );
    }
    let bad = ETCD.replace("plan: small,", "plan: small, disks: [{name: osd, size: 100G}],");
    let refused = validate::validate("etcd", &cluster(&bad).spec, &catalog()).expect_err("size without Gi");
    assert!(refused.reason == "InvalidPool" && refused.message.contains("spec.pools[\"members\"].disks[0].size"), "{refused:?}");
}

#[test]
fn a_converged_spread_pool_with_max_surge_is_not_rolling() {
    // Each member is compared with its own zone's spec: none differs, so no surge Server.
    let yaml = ETCD.replace(
        "labels: {tier: data}}]",
        "zones: [eu-north-1a, eu-north-1b, eu-north-1c], labels: {tier: data}, rollout: {maxUnavailable: 0, maxSurge: 1}}]",
    );
    let mut w = World::new(&yaml);
    w.converge();
    let p = w.plan();
    assert!(World::applied(&p).is_empty(), "{:?}", World::applied(&p));
    assert!(!p.apply_servers.iter().any(|s| s.metadata.name.as_deref().is_some_and(|n| n.contains("surge"))));
}

#[test]
fn taskservs_follow_their_servers_with_the_right_spec() {
    let (_, second) = World::with_servers_up(ETCD);
    assert_eq!(step(&second.status, "servers/members").state, "Succeeded");
    assert_eq!(second.apply_taskservs.len(), 1);
    let ts = &second.apply_taskservs[0];
    assert_eq!(ts.metadata.name.as_deref(), Some("etcd-store"));
    assert_eq!(ts.spec.service, "store");
    assert_eq!(ts.spec.servers.names, ["etcd-members-0", "etcd-members-1", "etcd-members-2"]);
    assert_eq!(ts.spec.config, Some(serde_json::json!({"port": 2379})));
    assert!(ts.spec.rollback_on_failure);
    assert_eq!(ts.metadata.owner_references.clone().unwrap_or_default()[0].controller, Some(true));
    assert_eq!(step(&second.status, "taskserv/store").state, "Running");
}

#[test]
fn converges_to_ready_and_a_resync_writes_nothing() {
    let mut w = World::new(ETCD);
    let last = w.converge();
    assert_eq!(w.status.phase.as_deref(), Some("Ready"));
    assert_eq!(cond(&w.status, "ServersReady").0, "True");
    assert_eq!(cond(&w.status, "TaskServsReady").0, "True");
    assert_eq!(cond(&w.status, "Stalled").0, "False");
    assert_eq!(w.status.servers.as_ref().map(|s| s.summary.as_str()), Some("3/3"));
    assert!(w.status.steps.iter().all(|s| s.state == "Succeeded" && s.started_at.is_some() && s.finished_at.is_some()));
    assert!(last.events.iter().any(|e| e.reason == "Ready"));
    // Later resync: identical status, nothing to apply.
    w.now = t("2025-01-01T02:00:00Z");
    let resync = w.plan();
    assert_eq!(resync.status, w.status);
    assert!(resync.apply_servers.is_empty() && resync.apply_taskservs.is_empty());
    assert!(resync.delete_servers.is_empty() && resync.delete_taskservs.is_empty());
    assert!(resync.events.is_empty());
}

#[test]
fn step_times_are_kept_across_passes() {
    let mut w = World::new(ETCD);
    w.pass();
    let started = step(&w.status, "servers/members").started_at.clone();
    assert_eq!(started.as_deref(), Some("2025-01-01T00:00:00Z"));
    w.now = t("2025-01-01T00:00:30Z");
    let second = w.plan();
    assert_eq!(step(&second.status, "servers/members").started_at, started);
    w.commit(&second);
    w.servers_ready();
    w.now = t("2025-01-01T00:01:00Z");
    let third = w.plan();
    let s = step(&third.status, "servers/members");
    assert_eq!((s.state.as_str(), s.started_at.clone(), s.finished_at.as_deref()), ("Succeeded", started, Some("2025-01-01T00:01:00Z")));
    assert!(third.events.iter().any(|e| e.reason == "StepSucceeded" && e.note.starts_with("servers/members")));
}

#[test]
fn parallel_limit_bounds_servers_in_flight() {
    let mut w = World::new(
        r#"
apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {name: wide, namespace: dev, uid: c-3, generation: 1}
spec:
  pools: [{name: web, replicas: 5}]
  parallelLimit: 2
"#,
    );
    assert_eq!(w.pass().apply_servers.len(), 2);
    // Still two in flight: nothing more.
    assert!(w.plan().apply_servers.is_empty());
    // One becomes ready: one more starts.
    w.servers[0].ready = true;
    assert_eq!(World::applied(&w.plan()), ["wide-web-2"]);
}

#[test]
fn dependency_closure_is_added_in_install_order() {
    let w = World::new(K8S);
    let services = w.services.clone().expect("valid");
    let order: Vec<&str> = services.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(order, ["runtime", "orchestrator"]);
    assert_eq!(services[0].pools, ["cp", "workers"], "the dependency goes where its dependents are");
    assert!(!services[0].explicit);
    assert_eq!(services[1].after, ["runtime"]);
}

#[test]
fn taskservs_start_in_dependency_order() {
    let (mut w, second) = World::with_servers_up(K8S);
    assert_eq!(applied_taskservs(&second), ["k8s-runtime"], "orchestrator waits for runtime");
    w.commit(&second);
    w.taskserv_ready("k8s-runtime");
    let third = w.plan();
    assert_eq!(applied_taskservs(&third), ["k8s-orchestrator"]);
    assert_eq!(third.apply_taskservs[0].spec.depends_on, ["k8s-runtime"]);
    let ids: Vec<&str> = third.status.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["servers/cp", "servers/workers", "taskserv/runtime", "taskserv/orchestrator"]);
}

#[test]
fn depends_on_clusters_must_be_ready_first() {
    let mut w = World::new(
        r#"
apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {name: app, namespace: dev, uid: c-4, generation: 1}
spec:
  pools: [{name: web, replicas: 1}]
  dependsOn: [db]
"#,
    );
    let plan = w.plan();
    assert!(plan.apply_servers.is_empty());
    assert_eq!(cond(&plan.status, "Ready").2, "waiting for Cluster db (not found)");
    assert_eq!(plan.status.phase.as_deref(), Some("Pending"));
    w.clusters = vec![OtherCluster { name: "db".into(), ready: false }];
    assert!(w.plan().apply_servers.is_empty());
    w.clusters[0].ready = true;
    assert_eq!(w.plan().apply_servers.len(), 1);
}

#[test]
fn scale_up_adds_members_and_joins_them() {
    let mut w = World::new(ETCD);
    w.converge();
    w.cluster.metadata.generation = Some(2);
    w.cluster.spec.pools[0].replicas = 4;
    let plan = w.plan();
    assert_eq!(World::applied(&plan), ["etcd-members-3"]);
    assert_eq!(store_in(&plan).spec.servers.names.len(), 4);
    w.commit(&plan);
    w.converge();
    assert_eq!(w.status.servers.as_ref().map(|s| s.summary.as_str()), Some("4/4"));
}

#[test]
fn a_planned_scale_up_starts_the_step_again_without_a_warning() {
    let mut w = World::new(ETCD);
    w.converge();
    w.cluster.metadata.generation = Some(2);
    w.cluster.spec.pools[0].replicas = 4;
    let plan = w.plan();
    assert_eq!(step(&plan.status, "servers/members").state, "Running");
    // The user scaled on purpose: not a regression, not a Warning.
    assert!(!plan.events.iter().any(|e| e.reason == "StepRegressed" || (e.warning && e.reason.starts_with("Step"))), "{:?}", plan.events);
    assert!(plan.events.iter().any(|e| e.reason == "StepStarted" && !e.warning), "{:?}", plan.events);
}

#[test]
fn scale_down_drains_before_deleting() {
    let mut w = World::new(ETCD);
    w.converge();
    w.cluster.metadata.generation = Some(2);
    w.cluster.spec.pools[0].replicas = 2;
    let plan = w.plan();
    // The TaskServ lets go of the member first; the Server stays while it is drained.
    assert_eq!(store_in(&plan).spec.servers.names, ["etcd-members-0", "etcd-members-1"]);
    assert!(plan.delete_servers.is_empty(), "not before remove.nu ran");
    assert_eq!(step(&plan.status, "teardown/server/etcd-members-2").message, "draining services from etcd-members-2");
    w.commit(&plan);
    // The TaskServ reports the member drained.
    w.taskservs[0].servers_in_status.remove("etcd-members-2");
    let next = w.plan();
    assert_eq!(next.delete_servers, ["etcd-members-2"]);
    w.commit(&next);
    w.converge();
    assert_eq!(w.status.servers.as_ref().map(|s| s.summary.as_str()), Some("2/2"));
    assert!(w.status.steps.iter().all(|s| !s.id.starts_with("teardown/")));
}

#[test]
fn a_member_dying_regresses_the_step_and_recovers() {
    let mut w = World::new(ETCD);
    w.converge();
    w.servers[1].ready = false;
    w.now = t("2025-01-01T03:00:00Z");
    let plan = w.plan();
    assert_eq!(step(&plan.status, "servers/members").state, "Running");
    assert_eq!(cond(&plan.status, "Ready").0, "False");
    assert_eq!(plan.status.phase.as_deref(), Some("Degraded"));
    assert!(plan.events.iter().any(|e| e.reason == "StepRegressed"));
    assert!(plan.apply_servers.is_empty(), "no duplicate server");
    w.commit(&plan);
    w.converge();
    assert_eq!(w.status.phase.as_deref(), Some("Ready"));
}

#[test]
fn rollback_policy_removes_what_a_failed_rollout_added() {
    let (mut w, second) = World::with_servers_up(&ETCD.replace("taskservs:", "failurePolicy: Rollback\n  taskservs:"));
    w.commit(&second);
    w.taskservs[0].stalled = Some("invalid config for store".into());
    w.taskservs[0].servers_in_status = ["etcd-members-0".to_string()].into();
    let failed = w.plan();
    assert_eq!(failed.delete_taskservs, ["etcd-store"]);
    let (status, reason, msg) = cond(&failed.status, "Stalled");
    assert_eq!((status, reason), ("True", "RolledBack"));
    assert!(msg.contains("step taskserv/store failed"), "{msg}");
    assert!(failed.events.iter().any(|e| e.warning && e.reason == "RollingBack"));
    w.commit(&failed);
    // Nothing is re-created for this generation.
    let again = w.plan();
    assert!(again.apply_taskservs.is_empty() && again.apply_servers.is_empty(), "{again:#?}");
    assert_eq!(cond(&again.status, "Stalled").1, "RolledBack");
}

#[test]
fn retain_policy_keeps_a_stalled_rollout_for_inspection() {
    let (mut w, second) = World::with_servers_up(ETCD);
    w.commit(&second);
    w.taskservs[0].stalled = Some("invalid config for store".into());
    let failed = w.plan();
    assert!(failed.delete_taskservs.is_empty() && failed.delete_servers.is_empty());
    assert_eq!(step(&failed.status, "taskserv/store").state, "Failed");
    assert_eq!(cond(&failed.status, "Stalled").0, "True");
}

#[test]
fn invalid_spec_is_stalled_and_creates_nothing() {
    for (service, reason, text) in [
        ("{service: nosuch}", "UnknownService", "unknown service \"nosuch\""),
        ("{service: store, version: \"9\"}", "UnknownVersion", "has no version \"9\""),
        ("{service: store, config: {port: 0}}", "InvalidConfig", "invalid config for store"),
        ("{service: loopa}", "DependencyCycle", "loopa -> loopb -> loopa"),
    ] {
        let w = World::new(&format!(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: bad, namespace: dev, uid: c-9, generation: 1}}\nspec:\n  pools: [{{name: p, replicas: 1}}]\n  taskservs: [{service}]\n"
        ));
        let plan = w.plan();
        assert!(plan.apply_servers.is_empty() && plan.apply_taskservs.is_empty(), "{service}");
        let (status, r, msg) = cond(&plan.status, "Stalled");
        assert_eq!((status, r), ("True", reason), "{service}");
        assert!(msg.contains(text), "{service}: {msg}");
    }
}

#[test]
fn teardown_goes_in_reverse_dependency_order() {
    let mut w = World::new(K8S);
    w.converge();
    let order: Vec<String> = w.services.clone().expect("valid").iter().map(|s| s.service.clone()).collect();
    let first = plan::plan_teardown(&w.observed(), &order);
    assert_eq!(first.delete_taskservs, ["k8s-orchestrator"], "dependents go first");
    assert!(first.delete_servers.is_empty(), "servers wait for their services");
    assert_eq!(first.status.phase.as_deref(), Some("Deleting"));
    assert!(!first.teardown_done);
    w.commit(&first);
    let second = plan::plan_teardown(&w.observed(), &order);
    assert_eq!(second.delete_taskservs, ["k8s-runtime"]);
    w.commit(&second);
    let third = plan::plan_teardown(&w.observed(), &order);
    assert_eq!(third.delete_servers.len(), 3);
    w.commit(&third);
    let last = plan::plan_teardown(&w.observed(), &order);
    assert!(last.teardown_done);
}

#[test]
fn a_member_whose_machine_died_is_replaced() {
    let mut w = World::new(ETCD);
    w.converge();
    w.servers[1].ready = false;
    w.servers[1].machine_failed = true;
    let plan = w.plan();
    assert_eq!(plan.delete_servers, ["etcd-members-1"]);
    assert!(plan.events.iter().any(|e| e.warning && e.reason == "Remediating"));
    w.commit(&plan);
    // Gone: it comes back under the same name.
    assert_eq!(World::applied(&w.pass()), ["etcd-members-1"]);
    w.converge();
    assert_eq!(w.status.phase.as_deref(), Some("Ready"));
}

#[test]
fn a_member_stuck_starting_is_replaced_after_the_startup_timeout() {
    let mut w = World::new(ETCD);
    w.pass();
    w.servers[0].ready = true;
    w.servers[1].ready = true;
    w.servers[2].pending_since = Some(t("2025-01-01T00:00:00Z"));
    w.now = t("2025-01-01T00:01:00Z");
    assert!(w.plan().delete_servers.is_empty(), "still within the startup timeout");
    w.now = t("2025-01-01T00:05:00Z");
    let plan = w.plan();
    assert_eq!(plan.delete_servers, ["etcd-members-2"]);
    let e = plan.events.iter().find(|e| e.reason == "Remediating").expect("event");
    assert!(e.note.contains("did not start within the startup timeout"), "{}", e.note);
}

#[test]
fn config_from_is_passed_through_to_the_taskserv_never_resolved() {
    let yaml = ETCD.replace(
        "taskservs: [{service: store, config: {port: 2379}}]",
        "taskservs: [{service: store, config: {port: 2379}, configFrom: [{kind: Secret, name: creds, key: pw, targetPath: password}]}]",
    );
    let (w, second) = World::with_servers_up(&yaml);
    let ts = &second.apply_taskservs[0];
    assert_eq!(ts.spec.config, Some(serde_json::json!({"port": 2379})));
    assert_eq!(ts.spec.config_from, w.cluster.spec.taskservs[0].config_from);
    assert_eq!(ts.spec.config_from[0].name, "creds");
}

/// `status.plan` of a Cluster: children to create before the rollout, nothing once converged,
/// a pool's plan change as Server updates plus what the members' own plans say, a scale-down
/// as deletes; config values never shown.
#[test]
fn the_cluster_plan_lists_children_to_create_change_and_delete() {
    let mut w = World::new(ETCD);
    let fresh = w.cluster_plan();
    assert_eq!(fresh.summary, "4 to create", "3 Servers and the etcd TaskServ: {:#?}", fresh.changes);
    assert!(fresh.changes.iter().any(|c| c.resource == "TaskServ/dev/etcd-store" && c.action == provisioning_crds::ChangeAction::Create));
    w.converge();
    let settled = w.cluster_plan();
    assert_eq!((settled.summary.as_str(), settled.changes.len()), ("no changes", 0));
    assert_eq!(settled.id, w.cluster_plan().id, "stable id");
    // A pool resized: each member Server's spec changes, and a member's own plan (a
    // Replace on a cloud) is part of the Cluster's plan.
    w.cluster.spec.pools[0].plan = "medium".into();
    let resize = change(
        format!("Server/dev/{}", w.servers[0].name),
        "spec.plan",
        ChangeAction::Replace,
        "sim-1cpu-1gb",
        "sim-2cpu-4gb",
        "resize needs a stop",
    );
    w.servers[0].pending_plan = Some(pending("aaaaaaaaaa", "1 to replace", resize));
    let resized = w.cluster_plan();
    assert_eq!(resized.summary, "2 to update, 1 to replace", "{:#?}", resized.changes);
    assert_ne!(resized.id, settled.id);
    // A member TaskServ's own plan (a re-install per server) is part of it too, so the
    // Cluster's id covers what approving it approves.
    let ts = w.taskservs[0].name.clone();
    w.taskservs[0].pending_plan = Some(pending("bbbbbbbbbb", "1 to update", run_on(&ts, &w.servers[0].name, "3.5.0", "3.5.0")));
    let with_member = w.cluster_plan();
    assert!(with_member.changes.iter().any(|c| c.resource.starts_with(&format!("TaskServ/dev/{ts} on "))), "{:#?}", with_member.changes);
    assert_ne!(with_member.id, resized.id);
    w.taskservs[0].pending_plan = None;
    // Scale down: the last member goes; a config change names the field, never the values.
    w.cluster.spec.pools[0].plan = w.servers[1].spec.plan.clone();
    w.servers[0].pending_plan = None;
    w.cluster.spec.pools[0].replicas = 2;
    w.cluster.spec.taskservs[0].config = Some(serde_json::json!({"port": 23791}));
    let w2 = World { services: validate::validate("etcd", &w.cluster.spec, &catalog()), ..w };
    let shrunk = w2.cluster_plan();
    assert!(
        shrunk.changes.iter().any(|c| c.action == provisioning_crds::ChangeAction::Delete && c.resource.ends_with("-2")),
        "{:#?}",
        shrunk.changes
    );
    let config = shrunk.changes.iter().find(|c| c.field == "spec.config").expect("config change listed");
    assert!(config.from.is_empty() && config.to.is_empty());
    assert!(!serde_json::to_string(&shrunk).expect("serialises").contains("23791"), "no config value in the plan");
}

/// ETCD with a rolling update policy on its pool.
fn rolling(max_unavailable: u32, max_surge: u32) -> World {
    let yaml = ETCD.replace(
        "labels: {tier: data}}]",
        &format!("labels: {{tier: data}}, rollout: {{maxUnavailable: {max_unavailable}, maxSurge: {max_surge}}}}}]"),
    );
    World::new(&yaml)
}

impl World {
    /// Changes the pool's image (a new machine for every member) as a new generation.
    fn change_image(&mut self, image: &str) {
        self.cluster.spec.pools[0].image = image.into();
        self.cluster.metadata.generation = self.cluster.metadata.generation.map(|g| g + 1);
    }

    /// Names of the Servers a plan applies.
    fn applied(plan: &Plan) -> Vec<String> {
        plan.apply_servers.iter().filter_map(|s| s.metadata.name.clone()).collect()
    }

    /// A Server whose spec was just applied is being replaced: not Ready, its plan not empty.
    fn replacing(&mut self, name: &str) {
        let s = self.servers.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no Server {name}"));
        s.ready = false;
        let new_image = change(
            format!("Server/dev/{name}"),
            "spec.image",
            ChangeAction::Replace,
            "debian-12",
            "debian-13",
            "a new image needs a new machine",
        );
        s.pending_plan = Some(pending(&format!("p-{name}"), "1 to replace", new_image));
    }

    /// A Server's new machine is up and every service listing it serves there again.
    fn back(&mut self, name: &str, machine: &str) {
        let s = self.servers.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no Server {name}"));
        s.ready = true;
        s.pending_plan = None;
        s.provider_id = Some(machine.into());
        for t in self.taskservs.iter_mut().filter(|t| t.spec.servers.names.contains(&name.to_string())) {
            t.serving.insert(name.to_string(), Some(machine.into()));
        }
    }

    /// Members whose spec has `image`.
    fn on_image(&self, image: &str) -> Vec<String> {
        self.servers.iter().filter(|s| s.spec.image == image && !s.name.contains("surge")).map(|s| s.name.clone()).collect()
    }
}

#[test]
fn a_pool_image_change_rolls_member_by_member_under_max_unavailable() {
    let mut w = rolling(1, 0);
    w.converge();
    w.change_image("debian-13");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-0"], "one member at a time");
    assert!(p.apply_taskservs.is_empty(), "the services' server list is unchanged");
    assert_eq!(step(&p.status, "servers/members").state, "Running");
    assert!(step(&p.status, "servers/members").message.starts_with("rolling update: 0/3"), "{:?}", step(&p.status, "servers/members"));
    assert_eq!(cond(&p.status, "Ready").0, "False");
    assert_eq!(cond(&p.status, "ServersReady").1, "RollingUpdate");
    assert!(p.events.iter().any(|e| e.reason == "RollingUpdate" && !e.warning), "{:?}", p.events);
    assert!(!p.events.iter().any(|e| e.reason == "StepRegressed"), "{:?}", p.events);
    assert_eq!(p.status.phase.as_deref(), Some("Provisioning"), "a rolling update is not Degraded");
    w.commit(&p);
    w.replacing("etcd-members-0");
    // Member 0 is down: nothing else is taken, whatever the number of passes.
    for _ in 0..3 {
        let p = w.plan();
        assert!(World::applied(&p).is_empty(), "{:?}", World::applied(&p));
        w.commit(&p);
    }
    // Its machine is back but the service is not re-installed there yet: still waits.
    w.back("etcd-members-0", "m0-new");
    let t = w.taskservs.iter_mut().find(|t| t.name == "etcd-store").expect("TaskServ");
    t.serving.remove("etcd-members-0");
    let p = w.plan();
    assert!(World::applied(&p).is_empty(), "waits for the service on the new machine");
    // Serving on an older machine (recorded before the replacement) is not serving either.
    w.taskservs[0].serving.insert("etcd-members-0".into(), Some("m0-old".into()));
    assert!(World::applied(&w.plan()).is_empty());
    w.back("etcd-members-0", "m0-new");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-1"]);
    assert_eq!(p.status.servers.as_ref().map(|s| s.updated.as_str()), Some("1/3"));
    w.commit(&p);
    w.replacing("etcd-members-1");
    w.back("etcd-members-1", "m1-new");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-2"]);
    w.commit(&p);
    w.back("etcd-members-2", "m2-new");
    w.pass();
    assert_eq!(w.on_image("debian-13").len(), 3);
    assert_eq!(w.status.servers.as_ref().map(|s| s.updated.as_str()), Some("3/3"));
    assert_eq!(step(&w.status, "servers/members").state, "Succeeded");
    assert_eq!(cond(&w.status, "Ready").0, "True", "{:#?}", w.status.conditions);
}

#[test]
fn a_member_that_fails_holds_the_rolling_update() {
    let mut w = rolling(1, 0);
    w.converge();
    w.change_image("debian-13");
    w.pass();
    w.replacing("etcd-members-0");
    w.servers[0].stalled = Some("UpdateRefused: updatePolicy Never".into());
    let p = w.plan();
    assert!(World::applied(&p).is_empty(), "no other member is taken");
    assert_eq!(step(&p.status, "servers/members").state, "Failed");
    assert_eq!(w.on_image("debian-13"), ["etcd-members-0"]);
}

#[test]
fn max_unavailable_two_takes_two_and_a_dead_member_is_free() {
    let mut w = rolling(2, 0);
    w.converge();
    w.change_image("debian-13");
    assert_eq!(World::applied(&w.plan()), ["etcd-members-0", "etcd-members-1"]);
    // A member that is down anyway is updated at once and leaves the budget to the others.
    w.servers[2].ready = false;
    assert_eq!(World::applied(&w.plan()), ["etcd-members-0", "etcd-members-2"]);
}

#[test]
fn max_surge_brings_up_new_servers_first_and_removes_them_at_the_end() {
    let mut w = rolling(0, 1);
    w.converge();
    w.change_image("debian-13");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-surge-0"], "the surge Server first, no member taken");
    let surge = &p.apply_servers[0];
    assert_eq!(surge.spec.image, "debian-13");
    let labels = surge.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("provisioning.dev/surge").map(String::as_str), Some("true"));
    assert_eq!(labels.get("provisioning.dev/pool").map(String::as_str), Some("members"));
    let ts = store_in(&p);
    assert!(ts.spec.servers.names.contains(&"etcd-members-surge-0".to_string()), "{:?}", ts.spec.servers.names);
    assert_eq!(p.status.servers.as_ref().map(|s| s.desired), Some(3), "surge Servers are not members");
    let changes = w.cluster_plan();
    assert!(
        changes.changes.iter().any(|c| c.resource.ends_with("surge-0")
            && c.action == provisioning_crds::ChangeAction::Create
            && c.reason == plan::SURGE_REASON)
    );
    w.commit(&p);
    // The surge Server is up but its service is not: still nothing taken.
    w.servers.iter_mut().filter(|s| s.name.contains("surge")).for_each(|s| s.ready = true);
    assert!(World::applied(&w.plan()).is_empty());
    for (i, member) in ["etcd-members-0", "etcd-members-1", "etcd-members-2"].into_iter().enumerate() {
        w.back("etcd-members-surge-0", "surge-m");
        let p = w.plan();
        assert_eq!(World::applied(&p), [member], "pass {i}");
        w.commit(&p);
        w.replacing(member);
        assert!(World::applied(&w.plan()).is_empty(), "one at a time while {member} is down");
        w.back(member, &format!("{member}-new"));
    }
    // Every member updated: the surge Server leaves the services, is drained, then deleted.
    w.pass();
    let ts = w.taskservs.iter().find(|t| t.name == "etcd-store").expect("TaskServ");
    assert!(!ts.spec.servers.names.iter().any(|n| n.contains("surge")), "{:?}", ts.spec.servers.names);
    w.taskservs[0].servers_in_status.remove("etcd-members-surge-0");
    let p = w.plan();
    assert_eq!(p.delete_servers, ["etcd-members-surge-0"]);
    w.commit(&p);
    w.taskserv_ready("etcd-store");
    w.pass();
    assert_eq!(cond(&w.status, "Ready").0, "True", "{:#?}", w.status);
    assert_eq!(w.on_image("debian-13").len(), 3);
}

#[test]
fn a_rollout_that_could_never_update_is_refused() {
    let w = rolling(0, 0);
    let err = w.services.expect_err("refused");
    assert_eq!(err.reason, "InvalidRollout");
    assert!(err.message.contains("members"), "{}", err.message);
    let clash = ETCD.replace(
        "pools: [{name: members, replicas: 3, plan: small, labels: {tier: data}}]",
        "pools: [{name: members, replicas: 3, rollout: {maxSurge: 1}}, {name: members-surge, replicas: 1}]",
    );
    let err = World::new(&clash).services.expect_err("refused");
    assert!(err.message.contains("members-surge"), "{}", err.message);
}

/// The first pass after a pool's image changes takes as many members as its rollout allows.
#[test]
fn an_image_change_first_takes_what_the_rollout_allows() {
    struct Case {
        name: &'static str,
        /// `(maxUnavailable, maxSurge)`, or no rollout at all.
        rollout: Option<(u32, u32)>,
        first: &'static [&'static str],
    }
    let cases = [
        Case { name: "no rollout: every member at once", rollout: None, first: &["etcd-members-0", "etcd-members-1", "etcd-members-2"] },
        Case { name: "maxUnavailable 1: one member", rollout: Some((1, 0)), first: &["etcd-members-0"] },
        Case { name: "maxUnavailable 2: two members", rollout: Some((2, 0)), first: &["etcd-members-0", "etcd-members-1"] },
        Case { name: "maxSurge 1: the surge Server, no member", rollout: Some((0, 1)), first: &["etcd-members-surge-0"] },
    ];
    for case in cases {
        let mut w = match case.rollout {
            None => World::new(ETCD),
            Some((max_unavailable, max_surge)) => rolling(max_unavailable, max_surge),
        };
        w.converge();
        w.change_image("debian-13");
        assert_eq!(World::applied(&w.plan()), case.first, "{}", case.name);
    }
}

impl World {
    /// The new image does not boot: `name` is being replaced and its Server is Stalled.
    fn fail_new_machine(&mut self, name: &str) {
        self.replacing(name);
        let s = self.servers.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no Server {name}"));
        s.stalled = Some("image debian-13 not found".into());
    }
}

/// ETCD under `failurePolicy: Rollback` with `rollout`, converged, then given a new image.
fn rolling_back_on_failure(rollout: &str) -> World {
    let yaml =
        ETCD.replace("labels: {tier: data}}]", &format!("labels: {{tier: data}}, rollout: {{{rollout}}}}}]\n  failurePolicy: Rollback"));
    let mut w = World::new(&yaml);
    w.converge();
    w.change_image("debian-13");
    w
}

#[test]
fn under_failure_policy_rollback_a_failed_member_goes_back_to_the_old_machine_spec() {
    let mut w = rolling_back_on_failure("maxUnavailable: 1");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-0"]);
    w.commit(&p);
    w.fail_new_machine("etcd-members-0");
    let p = w.plan();
    let back: Vec<(String, String)> =
        p.apply_servers.iter().map(|s| (s.metadata.name.clone().unwrap_or_default(), s.spec.image.clone())).collect();
    assert_eq!(back, [("etcd-members-0".to_string(), String::new())], "member 0 goes back to the old (default) image");
    assert!(p.delete_servers.is_empty(), "a member that existed before is kept: {:?}", p.delete_servers);
    assert_eq!(cond(&p.status, "Stalled").1, "RolledBack");
    assert!(p.events.iter().any(|e| e.reason == "RollingBack" && e.warning), "{:?}", p.events);
    w.commit(&p);
    w.servers[0].stalled = None;
    w.back("etcd-members-0", "m0-old-again");
    // Rolled back: nothing more until the spec changes; the new image is not applied again.
    for _ in 0..2 {
        let p = w.plan();
        assert!(p.apply_servers.iter().all(|s| s.spec.image.is_empty()), "{:?}", World::applied(&p));
        assert_eq!(cond(&p.status, "Stalled").1, "RolledBack");
        w.commit(&p);
    }
    assert!(w.on_image("debian-13").is_empty());
}

#[test]
fn under_failure_policy_rollback_surge_servers_leave_the_services_and_go() {
    let mut w = rolling_back_on_failure("maxUnavailable: 0, maxSurge: 1");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-surge-0"]);
    w.commit(&p);
    // The surge Server serves the new image; member 0 is taken and its new machine fails.
    w.servers.iter_mut().filter(|s| s.name.contains("surge")).for_each(|s| s.ready = true);
    w.back("etcd-members-surge-0", "surge-m");
    let p = w.plan();
    assert_eq!(World::applied(&p), ["etcd-members-0"]);
    w.commit(&p);
    w.fail_new_machine("etcd-members-0");
    let p = w.plan();
    assert_eq!(cond(&p.status, "Stalled").1, "RolledBack");
    w.commit(&p);
    w.servers[0].stalled = None;
    w.back("etcd-members-0", "m0-old-again");
    // Rolled back: the surge Server leaves the service (nothing else of the TaskServ changes),
    // is drained, then deleted; the members stay on the old image.
    let store_before = w.taskservs.iter().find(|t| t.name == "etcd-store").expect("TaskServ").spec.clone();
    let p = w.plan();
    let ts = store_in(&p);
    assert!(!ts.spec.servers.names.iter().any(|n| n.contains("surge")), "{:?}", ts.spec.servers.names);
    let mut same = ts.spec.clone();
    same.servers.names = store_before.servers.names.clone();
    assert_eq!(same, store_before, "only the server list changes");
    assert!(p.delete_servers.is_empty(), "drained first: {:?}", p.delete_servers);
    w.commit(&p);
    w.taskservs[0].servers_in_status.remove("etcd-members-surge-0");
    let p = w.plan();
    assert_eq!(p.delete_servers, ["etcd-members-surge-0"]);
    assert_eq!(cond(&p.status, "Stalled").1, "RolledBack");
    w.commit(&p);
    let p = w.plan();
    assert!(p.apply_taskservs.is_empty() && p.delete_servers.is_empty(), "settled: {:?} {:?}", World::applied(&p), p.delete_servers);
    assert!(w.on_image("debian-13").is_empty());
    assert!(!w.servers.iter().any(|s| s.name.contains("surge")));
}

/// One pass of a Manual Cluster as the reconciler runs it: plan, the Cluster's plan and its
/// approval (the annotation naming `annotation`), held deletes, then the status written with
/// the plan shown and the approval in force.
fn manual_pass(w: &mut World, annotation: &str) -> (provisioning_crds::Plan, approval::Decision) {
    let mut pass = w.plan();
    let shown = w.cluster_plan();
    let decision = w.decide(annotation, &shown);
    approval::hold_deletes(&decision, "dev", &shown, &mut pass);
    w.commit(&pass);
    w.status.plan = Some(shown.clone());
    w.status.approved_plan = decision.approved.clone();
    (shown, decision)
}

/// A member's own plan (`status.plan`).
fn own_plan(id: &str, changes: Vec<provisioning_crds::PlannedChange>) -> provisioning_crds::Plan {
    provisioning_crds::Plan { id: id.into(), summary: format!("{} changes", changes.len()), changes, ..Default::default() }
}

/// A TaskServ's per-server run: `from` → `to` on `server` (an empty `from` is an install).
fn run_on(ts: &str, server: &str, from: &str, to: &str) -> provisioning_crds::PlannedChange {
    let action = if from.is_empty() { ChangeAction::Create } else { ChangeAction::Update };
    change(format!("TaskServ/dev/{ts} on {server}"), "version", action, from, to, "re-install (inputs changed, unhealthy or interrupted)")
}

/// Every member with an empty own plan and a machine `m<i>` it serves from.
fn members_on_their_machines(w: &mut World) {
    for (i, s) in w.servers.iter_mut().enumerate() {
        s.pending_plan = Some(own_plan(&format!("s{i}"), vec![]));
        s.provider_id = Some(format!("m{i}"));
    }
    let names: Vec<String> = w.servers.iter().map(|s| s.name.clone()).collect();
    for (i, n) in names.iter().enumerate() {
        w.taskservs[0].serving.insert(n.clone(), Some(format!("m{i}")));
    }
    w.taskservs[0].pending_plan = Some(own_plan("t0", vec![]));
}

fn is_go(d: &approval::Decision) -> bool {
    matches!(d.gate, Gate::Go { .. })
}

/// Issue 32: a dead member's approved "1 to replace" stays approved while the Cluster's plan
/// restates it as "1 to create, 1 to update" (the replacement Server, the service re-installing
/// on it: the TaskServ noticed the dead machine only after the approval) and until the
/// replacement serves from its new machine; another member dying meanwhile is new: it waits
/// for its own approval and the waiting message names it.
#[test]
fn an_approved_replacement_covers_its_restatements_and_nothing_new() {
    let mut w = World::new(ETCD);
    w.converge();
    let ts = w.taskservs[0].name.clone();
    let dead = w.servers[1].name.clone();
    let other = w.servers[2].name.clone();
    members_on_their_machines(&mut w);

    // The machine stops; the TaskServ has not looked yet. The user approves "1 to replace".
    w.servers[1].ready = false;
    w.servers[1].machine_failed = true;
    let replace = w.cluster_plan();
    assert_eq!(replace.summary, "1 to replace", "{:#?}", replace.changes);
    let (_, d) = manual_pass(&mut w, &replace.id);
    assert!(is_go(&d), "{:?}", d.gate);
    assert!(!w.servers.iter().any(|s| s.name == dead), "the approved delete went ahead");

    // Now the TaskServ notices (a re-install due on the member) while the Cluster makes the
    // replacement: the plan restates the approved one and goes on under it.
    w.taskservs[0].serving.remove(&dead);
    w.taskservs[0].pending_plan = Some(own_plan("t1", vec![run_on(&ts, &dead, "3.5.0", "3.5.0")]));
    let (restated, d) = manual_pass(&mut w, &replace.id);
    assert_eq!(restated.summary, "1 to create, 1 to update", "{:#?}", restated.changes);
    assert_ne!(restated.id, replace.id);
    assert!(is_go(&d), "a restatement of the approved plan waits for nothing: {:?}", d.gate);
    assert_eq!(d.approved.as_ref().map(|p| p.id.as_str()), Some(replace.id.as_str()));
    assert_eq!(d.pass_down.iter().map(|p| (p.name.as_str(), p.id.as_str())).collect::<Vec<_>>(), [(ts.as_str(), "t1")]);

    // The replacement Server plans its machine: approved for it too.
    let machine = change(format!("Server/dev/{dead}"), "", ChangeAction::Create, "", "a sim-1cpu-1gb machine from debian-12", "");
    let new = w.servers.iter_mut().find(|s| s.name == dead).expect("the replacement Server");
    new.pending_plan = Some(own_plan("s1-new", vec![machine]));
    let (_, d) = manual_pass(&mut w, &replace.id);
    assert!(is_go(&d), "{:?}", d.gate);
    assert!(d.pass_down.iter().any(|p| p.name == dead && p.id == "s1-new"), "{:?}", d.pass_down);

    // Another member's machine stops meanwhile: new, it waits, and the message names it;
    // its delete is held, and the approval in force is kept (the annotation is not stale).
    w.servers.iter_mut().filter(|s| s.name == other).for_each(|s| {
        s.ready = false;
        s.machine_failed = true;
    });
    let (beyond, d) = manual_pass(&mut w, &replace.id);
    assert_eq!(d.gate, Gate::Wait);
    assert!(w.servers.iter().any(|s| s.name == other), "not deleted before its own approval");
    assert_eq!(d.approved.as_ref().map(|p| p.id.as_str()), Some(replace.id.as_str()));
    assert_eq!(d.beyond.iter().map(|c| c.resource.as_str()).collect::<Vec<_>>(), [format!("Server/dev/{other}")]);
    let message = d.waiting_message(&beyond);
    assert!(message.contains(&format!("provisioning.dev/approve={}", beyond.id)), "{message}");
    assert!(message.contains(&format!("not covered by the approved plan {}: replace Server/dev/{other}", replace.id)), "{message}");
    assert!(!message.contains(&dead), "what the approval covers is not named as new: {message}");
    // Approving that plan too keeps the first approval's changes approved.
    let (_, d) = manual_pass(&mut w, &beyond.id);
    assert!(is_go(&d), "{:?}", d.gate);
    let both = d.approved.expect("approved");
    assert_eq!(both.id, beyond.id);
    assert!(both.changes.iter().any(|c| c.resource == format!("Server/dev/{dead}") && c.action == ChangeAction::Replace));
    assert!(!w.servers.iter().any(|s| s.name == other), "its delete went ahead once approved");
    let d = w.decide(&beyond.id, &restated);
    assert!(is_go(&d), "the first approval's restatement is still covered: {:?}", d.gate);
}

/// An empty plan is not the end of an approval while a member is being replaced (its
/// Server deleted, still wanted) or does not serve from its current machine (a TaskServ that
/// has not looked at the replaced member yet still has to install there); once every member
/// serves, the approval's changes are cleared.
#[test]
fn an_approval_is_carried_out_only_once_every_member_serves_from_its_machine() {
    let mut w = World::new(ETCD);
    w.converge();
    let names: Vec<String> = w.servers.iter().map(|s| s.name.clone()).collect();
    members_on_their_machines(&mut w);
    let mut replace = w.cluster_plan();
    replace.id = "aaaaaaaaaa".into();
    replace.changes = vec![change(
        format!("Server/dev/{}", names[1]),
        "",
        ChangeAction::Replace,
        "machine stopped",
        "a new Server and machine",
        "the machine stopped: the Cluster replaces the member",
    )];
    w.status.approved_plan = Some(replace);
    let decide = |w: &World| {
        let now = w.cluster_plan();
        assert_eq!(now.summary, "no changes", "{:#?}", now.changes);
        w.decide("aaaaaaaaaa", &now).approved.expect("kept")
    };
    // Member 1's Server is being deleted to be replaced; nothing else shows in the plan.
    w.servers[1].deleting = true;
    w.servers[1].ready = false;
    assert!(decide(&w).has_changes(), "carried out while the member is being replaced");
    // Its replacement has a new machine; the TaskServ's status still says it serves from the old one.
    w.servers[1].deleting = false;
    w.servers[1].ready = true;
    w.servers[1].provider_id = Some("m1-new".into());
    assert!(decide(&w).has_changes(), "carried out before the service runs on the new machine");
    // It serves there: carried out, the id kept.
    w.taskservs[0].serving.insert(names[1].clone(), Some("m1-new".into()));
    let done = decide(&w);
    assert_eq!((done.id.as_str(), done.changes.len()), ("aaaaaaaaaa", 0));
    // A member being deleted that is no longer wanted (a scale-down) does not hold it.
    w.cluster.spec.pools[0].replicas = 2;
    w.servers[2].deleting = true;
    w.taskservs[0].spec.servers.names.retain(|n| n != &names[2]);
    let w2 = World { services: validate::validate("etcd", &w.cluster.spec, &catalog()), ..w };
    let now = w2.cluster_plan();
    assert_eq!(now.summary, "no changes", "{:#?}", now.changes);
    let d = w2.decide("aaaaaaaaaa", &now);
    assert_eq!(d.approved.map(|p| p.changes.len()), Some(0));
}

/// The annotation names the plan the Cluster showed ("1 to replace"); by the time the Cluster
/// looks, the TaskServ has added its re-install on that member: the approval of what the user
/// read covers it. A plan beyond what was shown waits, without a PlanStale.
#[test]
fn an_approval_of_the_plan_shown_covers_what_restates_it_since() {
    let mut w = World::new(ETCD);
    w.converge();
    let ts = w.taskservs[0].name.clone();
    let dead = w.servers[1].name.clone();
    w.servers[1].ready = false;
    w.servers[1].machine_failed = true;
    let shown = w.cluster_plan();
    w.status.plan = Some(shown.clone());
    w.taskservs[0].pending_plan = Some(own_plan("t1", vec![run_on(&ts, &dead, "3.5.0", "3.5.0")]));
    let now = w.cluster_plan();
    assert_ne!(now.id, shown.id);
    let d = w.decide(&shown.id, &now);
    assert!(is_go(&d), "{:?}", d.gate);
    assert_eq!(d.approved.as_ref().map(|p| p.id.as_str()), Some(shown.id.as_str()));
    // An upgrade there instead is not what was shown: it waits (not stale) and is named.
    w.taskservs[0].pending_plan = Some(own_plan("t2", vec![run_on(&ts, &dead, "3.5.0", "3.6.0")]));
    let upgrade = w.cluster_plan();
    let d = w.decide(&shown.id, &upgrade);
    assert_eq!(d.gate, Gate::Wait);
    assert_eq!(d.beyond.len(), 1, "{:?}", d.beyond);
    // A spec change since: the approval of the old spec's plan is stale.
    w.cluster.metadata.generation = Some(2);
    let respec = w.cluster_plan();
    let d = w.decide(&shown.id, &respec);
    assert_eq!(d.gate, Gate::Stale(shown.id.clone()));
}

/// The member TaskServ's own planner, run on the spec the Cluster gives it: installs on its
/// servers until Ready, then returns the status (with the install inputs recorded).
fn member_installed(spec: &provisioning_crds::TaskServSpec, servers: &[String]) -> provisioning_crds::TaskServStatus {
    use provisioning_controller::taskserv::{plan as ts_plan, validate as ts_validate};
    let validated = ts_validate::validate(spec, &catalog());
    let facts: Vec<ts_plan::ServerFacts> =
        servers.iter().map(|n| ts_plan::ServerFacts { name: n.clone(), ready: true, ..Default::default() }).collect();
    let mut status = provisioning_crds::TaskServStatus::default();
    let mut results = Vec::new();
    for _ in 0..3 {
        let p = member_pass(spec, &status, &validated, &facts, &results, 1);
        results = p.launch.iter().map(|(server, op)| succeeded(server, op)).collect();
        status = p.status;
    }
    assert!(status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"), "{status:#?}");
    status
}

fn member_pass(
    spec: &provisioning_crds::TaskServSpec,
    status: &provisioning_crds::TaskServStatus,
    validated: &Result<
        provisioning_controller::taskserv::validate::ValidTaskServ,
        provisioning_controller::taskserv::validate::InvalidTaskServ,
    >,
    servers: &[provisioning_controller::taskserv::plan::ServerFacts],
    results: &[provisioning_controller::taskserv::plan::OperationResult],
    generation: i64,
) -> provisioning_controller::taskserv::plan::Plan {
    use provisioning_controller::taskserv::plan as ts_plan;
    ts_plan::plan(&ts_plan::Observed {
        name: "etcd-store",
        generation: Some(generation),
        spec,
        status,
        validated,
        servers,
        taskservs: &[],
        in_flight: &Default::default(),
        results,
        checks_due: &Default::default(),
        now: t("2025-01-01T00:00:00Z"),
    })
}

fn succeeded(
    server: &str,
    op: &provisioning_controller::taskserv::plan::Operation,
) -> provisioning_controller::taskserv::plan::OperationResult {
    provisioning_controller::taskserv::plan::OperationResult {
        server: server.into(),
        operation: op.clone(),
        run: provisioning_crds::ScriptRun { script: op.script().into(), ..Default::default() },
        succeeded: true,
        healthy: Some(true),
        message: String::new(),
        inputs_hash: None,
        drifted_files: Vec::new(),
    }
}

/// No-op edits of a Cluster (approval set to its effective value, switched to Manual, a label,
/// an annotation, the taskservs' pools listed in another order) reach the member TaskServ as
/// at most a new spec that its planner runs nothing for: the Cluster's plan and the member's
/// own plan have no changes. A scale-up installs on the new member only.
#[test]
fn no_op_cluster_edits_run_no_member_script_and_a_scale_up_installs_only_on_the_new_member() {
    use provisioning_controller::taskserv::{plan as ts_plan, validate as ts_validate};
    type Edit = fn(&mut Cluster);
    let cases: &[(&str, Edit)] = &[
        ("approval: Automatic", |c| c.spec.approval = Some(Approval::Automatic)),
        ("approval: Manual", |c| c.spec.approval = Some(Approval::Manual)),
        ("a label", |c| {
            c.metadata.labels.get_or_insert_default().insert("team".into(), "db".into());
        }),
        ("an annotation", |c| {
            c.metadata.annotations.get_or_insert_default().insert("note".into(), "x".into());
        }),
        ("scale 3 → 4", |c| c.spec.pools[0].replicas = 4),
    ];
    for (what, edit) in cases {
        let mut w = World::new(ETCD);
        w.converge();
        let member = w.taskservs.iter().find(|t| t.name == "etcd-store").expect("member").spec.clone();
        let names = member.servers.names.clone();
        let status = member_installed(&member, &names);
        w.cluster.metadata.generation = Some(2);
        edit(&mut w.cluster);
        w.services = validate::validate("etcd", &w.cluster.spec, &catalog());
        let plan = w.plan();
        let new_spec = plan.apply_taskservs.iter().find(|t| t.metadata.name.as_deref() == Some("etcd-store")).map(|t| t.spec.clone());
        // A changed spec is a new generation of the member.
        let generation = if new_spec.as_ref().is_some_and(|s| *s != member) { 2 } else { 1 };
        let new_spec = new_spec.unwrap_or(member);
        let mut servers = names.clone();
        for s in &plan.apply_servers {
            servers.extend(s.metadata.name.clone().filter(|n| !servers.contains(n)));
        }
        let facts: Vec<ts_plan::ServerFacts> =
            servers.iter().map(|n| ts_plan::ServerFacts { name: n.clone(), ready: true, ..Default::default() }).collect();
        let validated = ts_validate::validate(&new_spec, &catalog());
        let next = member_pass(&new_spec, &status, &validated, &facts, &[], generation);
        let launched: Vec<&str> = next.launch.iter().map(|(s, _)| s.as_str()).collect();
        let member_plan = ts_plan::taskserv_plan("TaskServ/dev/etcd-store", Some(2), &next.status, next.version.as_deref());
        if what.starts_with("scale") {
            assert_eq!(launched, ["etcd-members-3"], "{what}: only the new member");
            assert_eq!(member_plan.summary, "1 to create", "{what}: {:#?}", member_plan.changes);
        } else {
            assert!(launched.is_empty(), "{what}: {launched:?}");
            assert_eq!(member_plan.summary, "no changes", "{what}: {:#?}", member_plan.changes);
            assert_eq!(w.cluster_plan().summary, "no changes", "{what}");
        }
    }
}

/// A Kubernetes Cluster with a managed control-plane endpoint (the shipped catalog).
const K8S_LB: &str = r#"
apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata: {name: kube, namespace: dev, uid: c-9, generation: 1}
spec:
  controlPlaneEndpoint: {type: LoadBalancer}
  pools:
  - {name: control-plane, replicas: 1}
  taskservs: [{service: containerd}, {service: kubernetes}]
"#;

#[test]
fn the_kubernetes_service_waits_for_the_endpoint_and_gets_it_as_its_control_plane_endpoint() {
    let shipped = Catalog::load(&Catalog::default_dir()).expect("catalog loads");
    let mut w = World::with_catalog(K8S_LB, &shipped);
    w.pass();
    w.servers_ready();
    w.pass();
    w.taskserv_ready("kube-containerd");
    let plan = w.pass();
    assert!(!applied_taskservs(&plan).contains(&"kube-kubernetes".to_string()), "no kubeadm init before the endpoint");
    let s = step(&plan.status, "taskserv/kubernetes");
    assert_eq!((s.state.as_str(), s.message.as_str()), ("Pending", "waiting for the control-plane endpoint (LoadBalancer) to be created"));
    // The reconciler recorded the load balancer: kubernetes goes out, pointed at it.
    w.status.control_plane_endpoint = Some(provisioning_crds::ControlPlaneEndpointStatus {
        endpoint_type: "LoadBalancer".into(),
        address: "lb.example".into(),
        port: 6443,
        id: "lb-1".into(),
        targets: vec!["simulated://m-0".into()],
        cost: None,
    });
    let plan = w.pass();
    let k8s = plan.apply_taskservs.iter().find(|t| t.metadata.name.as_deref() == Some("kube-kubernetes")).expect("kubernetes created");
    assert_eq!(k8s.spec.config.as_ref().and_then(|c| c["controlPlaneEndpoint"].as_str()), Some("lb.example:6443"));
    // A floating IP not on a machine yet is not usable for kubeadm init.
    let fip = K8S_LB.replace("type: LoadBalancer", "type: FloatingIP");
    let mut status = w.status.clone();
    status.control_plane_endpoint = Some(provisioning_crds::ControlPlaneEndpointStatus {
        endpoint_type: "FloatingIP".into(),
        address: "198.51.100.7".into(),
        port: 6443,
        id: "fip-1".into(),
        targets: vec![],
        cost: None,
    });
    let gate = plan::EndpointGate::of(&cluster(&fip).spec, status.control_plane_endpoint.as_ref());
    assert_eq!(gate, plan::EndpointGate::Waiting("waiting for the FloatingIP 198.51.100.7 to be on a control-plane machine".into()));
    // A VIP is not made at the provider: its address is there from the start.
    let vip = K8S_LB.replace("{type: LoadBalancer}", "{type: VIP, address: 10.0.0.100, port: 8443}");
    assert_eq!(plan::EndpointGate::of(&cluster(&vip).spec, None), plan::EndpointGate::At("10.0.0.100:8443".into()));
    assert_eq!(
        plan::EndpointGate::of(&cluster(&K8S_LB.replace("{type: LoadBalancer}", "{type: None}")).spec, None),
        plan::EndpointGate::Unmanaged
    );
}

#[test]
fn a_bad_control_plane_endpoint_is_refused_naming_the_field() {
    let shipped = Catalog::load(&Catalog::default_dir()).expect("catalog loads");
    let refused = |yaml: &str| validate::validate("kube", &cluster(yaml).spec, &shipped).expect_err("refused");
    let e = refused(&K8S_LB.replace("{type: LoadBalancer}", "{type: VIP, port: 8443}"));
    assert_eq!(e.reason, "InvalidEndpoint");
    assert!(e.message.contains("spec.controlPlaneEndpoint.address"), "{e}");
    let e = refused(&K8S_LB.replace("{type: LoadBalancer}", "{type: VIP, address: 10.0.0.300, port: 8443}"));
    assert!(e.message.contains("\"10.0.0.300\" is not an IPv4 address"), "{e}");
    let e = refused(&K8S_LB.replace("{type: LoadBalancer}", "{type: VIP, address: 10.0.0.100}"));
    assert!(e.message.contains("spec.controlPlaneEndpoint.port") && e.message.contains("8443"), "{e}");
    let e = refused(&K8S_LB.replace("{type: LoadBalancer}", "{type: FloatingIP, port: 443}"));
    assert!(e.message.contains("spec.controlPlaneEndpoint.port"), "{e}");
    let e = refused(&K8S_LB.replace("{type: LoadBalancer}", "{type: LoadBalancer, address: 10.0.0.1}"));
    assert!(e.message.contains("address is only for type VIP"), "{e}");
    let e = refused(&K8S_LB.replace("{service: kubernetes}", "{service: kubernetes, config: {controlPlaneEndpoint: \"x:6443\"}}"));
    assert!(e.message.contains("both set"), "{e}");
    let e = refused(&K8S_LB.replace("[{service: containerd}, {service: kubernetes}]", "[{service: containerd}]"));
    assert!(e.message.contains("needs the kubernetes service"), "{e}");
    assert!(
        validate::validate(
            "kube",
            &cluster(&K8S_LB.replace("{type: LoadBalancer}", "{type: VIP, address: 10.0.0.100, port: 8443}")).spec,
            &shipped
        )
        .is_ok()
    );
}

/// The endpoint's monthly price in the Cluster's plan: a Create of `spec.controlPlaneEndpoint`
/// with its price while status shows no endpoint, counted in `monthlyCostDelta` when nothing
/// else in the plan is billed; a Delete (its recorded cost taken off) when the spec drops it.
#[test]
fn the_endpoint_and_its_monthly_price_are_in_the_clusters_plan_until_it_is_made() {
    let shipped = Catalog::load(&Catalog::default_dir()).expect("catalog loads");
    let fip = K8S_LB.replace("type: LoadBalancer", "type: FloatingIP");
    let price = Ok(provisioning_providers::prices::upcloud_floating_ip("de-fra1", &["de-fra1"]).expect("priced"));
    let mut w = World::with_catalog(&fip, &shipped);
    let with_endpoint = |w: &World, price: Option<&Result<_, _>>| plan::with_endpoint(w.cluster_plan(), &w.observed(), "dev", price);
    let endpoint_change = |p: &provisioning_crds::Plan| {
        p.changes.iter().find(|c| c.field == "spec.controlPlaneEndpoint").cloned().expect("the endpoint's change")
    };

    // A new Cluster: its Servers are not priced in the Cluster's plan, so the total is unknown;
    // the endpoint's own price shows on its change.
    let fresh = with_endpoint(&w, Some(&price));
    let c = endpoint_change(&fresh);
    assert_eq!((c.resource.as_str(), c.action, c.to.as_str()), ("Cluster/dev/kube", ChangeAction::Create, "FloatingIP (€3.15/mo)"));
    assert!(fresh.monthly_cost_delta.is_empty(), "servers are created too: the total is not known: {fresh:?}");
    assert_ne!(fresh.id, w.cluster_plan().id, "the endpoint is part of what an approval approves");
    assert_eq!(
        (w.cluster_plan().summary.as_str(), fresh.summary.as_str()),
        ("3 to create", "4 to create"),
        "a Server, two TaskServs, the endpoint"
    );

    // The machines made, only services left to install: the plan's cost is the endpoint's.
    w.pass();
    w.servers_ready();
    let services_only = with_endpoint(&w, Some(&price));
    assert!(
        services_only.changes.iter().all(|c| c.resource.starts_with("TaskServ/") || c.resource.starts_with("Cluster/")),
        "{services_only:?}"
    );
    assert_eq!((services_only.monthly_cost_delta.as_str(), services_only.currency.as_str()), ("+3.15", "EUR"));
    let unknown = with_endpoint(&w, Some(&Err("no price table".to_string())));
    assert!(unknown.monthly_cost_delta.is_empty() && endpoint_change(&unknown).to.contains("cost unknown: no price table"), "{unknown:?}");

    // Made (status shows it): nothing about it in the plan.
    let cost =
        provisioning_crds::ServerCost { currency: "EUR".into(), hourly: "0.0047".into(), monthly: "3.15".into(), ..Default::default() };
    w.status.control_plane_endpoint = Some(provisioning_crds::ControlPlaneEndpointStatus {
        endpoint_type: "FloatingIP".into(),
        address: "192.0.2.3".into(),
        port: 6443,
        id: "192.0.2.3".into(),
        targets: vec!["upcloud://00000001-0000-4000-8000-000000000000".into()],
        cost: Some(cost),
    });
    assert_eq!(with_endpoint(&w, None), w.cluster_plan(), "made: the plan is the members' only");

    // The spec drops it: its Delete, and its recorded cost comes off.
    let mut dropped = World::with_catalog(&K8S_LB.replace("{type: LoadBalancer}", "{type: None}"), &shipped);
    dropped.pass();
    dropped.servers_ready();
    dropped.status.control_plane_endpoint = w.status.control_plane_endpoint.clone();
    let plan = with_endpoint(&dropped, None);
    let c = endpoint_change(&plan);
    assert_eq!((c.action, c.from.as_str()), (ChangeAction::Delete, "FloatingIP"));
    assert_eq!((plan.monthly_cost_delta.as_str(), plan.currency.as_str()), ("-3.15", "EUR"));
}
