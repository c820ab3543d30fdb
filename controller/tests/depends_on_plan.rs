//! User-made `dependsOn` cycles and missing dependencies (pure, from YAML fixtures): a cycle
//! between TaskServs or between Clusters is `Stalled` with reason `DependencyCycle` naming the
//! cycle (one Warning event), a missing dependency is `Ready=False` with reason
//! `DependencyMissing` naming kind and name (waiting, not stalled), and breaking the cycle
//! lets the objects go on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use provisioning_controller::cluster::plan as cluster_plan;
use provisioning_controller::cluster::validate as cluster_validate;
use provisioning_controller::taskserv::plan::{self, Observed, PeerTaskServ, ServerFacts};
use provisioning_controller::taskserv::validate;
use provisioning_crds::{Cluster, ClusterStatus, TaskServ, TaskServStatus};
use provisioning_taskservs::Catalog;

fn catalog() -> Catalog {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/taskserv_fixtures/catalog");
    Catalog::load(&dir).expect("fixture catalog loads")
}

fn now() -> Timestamp {
    "2025-01-01T00:00:00Z".parse().expect("timestamp")
}

fn cond<'a>(conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("condition {type_} missing"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

/// TaskServs `a`, `b` (and `c`) of one namespace, each on server s0, from YAML.
fn taskservs(yaml: &str) -> Vec<TaskServ> {
    yaml.split("\n---\n").map(|doc| serde_yaml_ng::from_str(doc).expect("fixture parses")).collect()
}

fn graph_of(all: &[TaskServ]) -> BTreeMap<String, Vec<String>> {
    all.iter().map(|t| (t.metadata.name.clone().unwrap_or_default(), t.spec.depends_on.clone())).collect()
}

/// One planning pass of `name` among `all`, as the reconciler runs it (validation, then the
/// dependsOn check folded in), with `status` as the current status.
fn plan_taskserv(all: &[TaskServ], name: &str, status: &TaskServStatus) -> plan::Plan {
    let ts = all.iter().find(|t| t.metadata.name.as_deref() == Some(name)).expect("fixture has it");
    let validated = validate::validate(&ts.spec, &catalog()).and_then(|v| plan::check_depends_on(name, &graph_of(all)).map(|()| v));
    let peers: Vec<PeerTaskServ> = all
        .iter()
        .filter(|t| t.metadata.name.as_deref() != Some(name))
        .map(|t| PeerTaskServ {
            name: t.metadata.name.clone().unwrap_or_default(),
            service: t.spec.service.clone(),
            ready: false,
            installed_on: BTreeSet::new(),
        })
        .collect();
    let servers = vec![ServerFacts { name: "s0".into(), ready: true, ..Default::default() }];
    plan::plan(&Observed {
        name,
        generation: ts.metadata.generation,
        spec: &ts.spec,
        status,
        validated: &validated,
        servers: &servers,
        taskservs: &peers,
        in_flight: &BTreeMap::new(),
        results: &[],
        checks_due: &BTreeSet::new(),
        now: now(),
    })
}

const TWO_CYCLE: &str = r#"apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: a, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [b]}
---
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: b, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [a]}"#;

#[test]
fn taskserv_cycle_is_stalled_naming_it_with_one_warning() {
    let all = taskservs(TWO_CYCLE);
    let first = plan_taskserv(&all, "a", &TaskServStatus::default());
    assert!(first.launch.is_empty(), "nothing runs on a cycle: {:?}", first.launch);
    let s = &first.status.conditions;
    assert_eq!(cond(s, "Stalled"), ("True", "DependencyCycle", "dependsOn cycle: TaskServ a → b → a"));
    assert_eq!(cond(s, "Ready"), ("False", "DependencyCycle", "dependsOn cycle: TaskServ a → b → a"));
    assert_eq!(cond(s, "Reconciling").0, "False");
    assert_eq!(first.status.phase.as_deref(), Some("Failed"));
    let warnings: Vec<_> = first.events.iter().filter(|e| e.warning && e.reason == "DependencyCycle").collect();
    assert_eq!(warnings.len(), 1, "{:?}", first.events);
    // Polled (the cycle may be broken on the other object), and the event is not repeated.
    assert_eq!(first.requeue, Some(plan::WAIT_REQUEUE));
    let again = plan_taskserv(&all, "a", &first.status);
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(again.status, first.status);
    // The other side names the same cycle from its end.
    let b = plan_taskserv(&all, "b", &TaskServStatus::default());
    assert_eq!(cond(&b.status.conditions, "Stalled").2, "dependsOn cycle: TaskServ b → a → b");
}

#[test]
fn breaking_the_cycle_lets_both_go_on() {
    let mut all = taskservs(TWO_CYCLE);
    let stalled_b = plan_taskserv(&all, "b", &TaskServStatus::default()).status;
    all[0].spec.depends_on.clear();
    all[0].metadata.generation = Some(2);
    let a = plan_taskserv(&all, "a", &TaskServStatus::default());
    assert_eq!(cond(&a.status.conditions, "Stalled").0, "False");
    assert_eq!(a.launch.len(), 1, "a installs once nothing loops");
    let b = plan_taskserv(&all, "b", &stalled_b);
    let s = &b.status.conditions;
    assert_eq!(cond(s, "Stalled").0, "False");
    assert_eq!(cond(s, "Ready"), ("False", "WaitingForDependencies", "waiting for TaskServ a to be Ready"));
    assert!(b.launch.is_empty());
}

#[test]
fn longer_taskserv_cycle_is_named_and_a_bystander_waits() {
    let all = taskservs(
        r#"apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: a, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [b]}
---
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: b, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [c]}
---
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: c, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [a]}
---
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: d, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [a]}"#,
    );
    let c = plan_taskserv(&all, "c", &TaskServStatus::default());
    assert_eq!(cond(&c.status.conditions, "Stalled"), ("True", "DependencyCycle", "dependsOn cycle: TaskServ c → a → b → c"));
    let d = plan_taskserv(&all, "d", &TaskServStatus::default());
    assert_eq!(cond(&d.status.conditions, "Stalled").0, "False", "d is not on the cycle");
    assert_eq!(cond(&d.status.conditions, "Ready").1, "WaitingForDependencies");
}

#[test]
fn missing_taskserv_dependency_waits_naming_it() {
    let all = taskservs(
        r#"apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: a, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [ghost]}"#,
    );
    let p = plan_taskserv(&all, "a", &TaskServStatus::default());
    let s = &p.status.conditions;
    assert_eq!(cond(s, "Ready"), ("False", "DependencyMissing", "missing dependency: TaskServ ghost not found"));
    assert_eq!(cond(s, "Stalled").0, "False", "waiting, not stalled: it may still be created");
    assert_eq!(cond(s, "Reconciling").0, "True");
    assert!(p.launch.is_empty());
    assert_eq!(p.requeue, Some(plan::WAIT_REQUEUE));
}

fn cluster(yaml: &str) -> Cluster {
    serde_yaml_ng::from_str(yaml).expect("fixture parses")
}

/// One planning pass of Cluster `own` among `all`, as the reconciler runs it.
fn plan_cluster(all: &[Cluster], own: &str, ready: &[&str], status: &ClusterStatus) -> cluster_plan::Plan {
    let c = all.iter().find(|c| c.metadata.name.as_deref() == Some(own)).expect("fixture has it");
    let graph: BTreeMap<String, Vec<String>> =
        all.iter().map(|c| (c.metadata.name.clone().unwrap_or_default(), c.spec.depends_on.clone())).collect();
    let services =
        cluster_validate::validate(own, &c.spec, &catalog()).and_then(|s| cluster_plan::check_depends_on(own, &graph).map(|()| s));
    let others: Vec<cluster_plan::OtherCluster> = all
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .filter(|n| n != own)
        .map(|n| cluster_plan::OtherCluster { ready: ready.contains(&n.as_str()), name: n })
        .collect();
    cluster_plan::plan(&cluster_plan::Observed {
        name: own,
        uid: "uid",
        generation: c.metadata.generation,
        spec: &c.spec,
        status,
        services: &services,
        servers: &[],
        taskservs: &[],
        clusters: &others,
        now: now(),
        endpoint: Default::default(),
    })
}

const APP: &str = "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {name: app, namespace: dev, generation: 1}\nspec: {pools: [{name: web, replicas: 1}], dependsOn: [db]}";
const DB_ON_APP: &str = "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {name: db, namespace: dev, generation: 1}\nspec: {pools: [{name: data, replicas: 1}], dependsOn: [app]}";

#[test]
fn cluster_cycle_is_stalled_naming_it_and_creates_nothing() {
    let all = [cluster(APP), cluster(DB_ON_APP)];
    let p = plan_cluster(&all, "app", &[], &ClusterStatus::default());
    assert!(p.apply_servers.is_empty() && p.apply_taskservs.is_empty());
    let s = &p.status.conditions;
    assert_eq!(cond(s, "Stalled"), ("True", "DependencyCycle", "dependsOn cycle: Cluster app → db → app"));
    assert_eq!(cond(s, "Ready").1, "DependencyCycle");
    assert_eq!(p.status.phase.as_deref(), Some("Failed"));
    assert_eq!(p.events.iter().filter(|e| e.warning && e.reason == "DependencyCycle").count(), 1);
    let again = plan_cluster(&all, "app", &[], &p.status);
    assert!(again.events.is_empty(), "{:?}", again.events);
    // Breaking it on db lets app wait for db, then roll out.
    let mut fixed = all.clone();
    fixed[1].spec.depends_on.clear();
    let waiting = plan_cluster(&fixed, "app", &[], &p.status);
    assert_eq!(cond(&waiting.status.conditions, "Stalled").0, "False");
    assert_eq!(cond(&waiting.status.conditions, "Ready"), ("False", "WaitingForClusters", "waiting for Cluster db"));
    assert_eq!(plan_cluster(&fixed, "app", &["db"], &waiting.status).apply_servers.len(), 1);
}

#[test]
fn missing_cluster_dependency_waits_naming_it() {
    let all = [cluster(APP)];
    let p = plan_cluster(&all, "app", &[], &ClusterStatus::default());
    let s = &p.status.conditions;
    assert_eq!(cond(s, "Ready"), ("False", "DependencyMissing", "waiting for Cluster db (not found)"));
    assert_eq!(cond(s, "Stalled").0, "False");
    assert_eq!(cond(s, "Reconciling").0, "True");
    assert!(p.apply_servers.is_empty());
}
