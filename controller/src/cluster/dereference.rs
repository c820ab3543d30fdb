//! Dereference: a Cluster's children (found by the cluster label) and the other Clusters of
//! its namespace, as planner facts.

use std::collections::BTreeSet;

use kube::api::ListParams;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use provisioning_crds::{ANNOTATION_APPROVE, Cluster, LABEL_CLUSTER, Server, TaskServ, condition};

use super::plan::{ChildServer, ChildTaskServ, OtherCluster};
use crate::conditions;
use crate::context::Context;
use crate::error::Error;

/// The children of a Cluster.
pub struct Children {
    /// Servers labelled with the cluster.
    pub servers: Vec<ChildServer>,
    /// TaskServs labelled with the cluster.
    pub taskservs: Vec<ChildTaskServ>,
}

fn owned_by(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, uid: &str) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.uid == uid)
}

fn stalled_message(conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> Option<String> {
    conditions::find(conds, condition::STALLED).filter(|c| c.status == "True").map(|c| c.message.clone())
}

/// A TaskServ serves on a server: a version is there, the entry is not failed or being
/// removed, and its last check did not fail. A re-install of what runs there still serves.
fn serving(e: &provisioning_crds::TaskServServerStatus) -> bool {
    e.version.is_some() && !matches!(e.phase.as_str(), "Failed" | "Removing") && e.healthy != Some(false)
}

/// A Server of the cluster as the planner sees it (`uid`: the Cluster's).
pub fn child_server(s: &Server, uid: &str) -> ChildServer {
    let conds = s.status.as_ref().map(|st| st.conditions.clone()).unwrap_or_default();
    ChildServer {
        name: s.name_any(),
        labels: s.labels().clone(),
        spec: s.spec.clone(),
        owned: owned_by(s.meta(), uid),
        ready: crate::taskserv::dereference::server_ready(s),
        stalled: stalled_message(&conds),
        deleting: s.metadata.deletion_timestamp.is_some(),
        machine_failed: s
            .status
            .as_ref()
            .and_then(|st| st.provider_state.as_deref())
            .is_some_and(|state| matches!(state, "stopped" | "terminated" | "exited" | "dead")),
        pending_plan: s.status.as_ref().and_then(|st| st.plan.clone()),
        provider_id: s.status.as_ref().and_then(|st| st.provider_id.clone()),
        observed_current: s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation,
        approve: s.annotations().get(ANNOTATION_APPROVE).cloned(),
        pending_since: s
            .status
            .as_ref()
            .filter(|st| st.provider_state.as_deref() == Some("pending"))
            .and_then(|st| conditions::find(&st.conditions, condition::READY))
            .map(|c| c.last_transition_time.0),
    }
}

/// A TaskServ of the cluster as the planner sees it (`uid`: the Cluster's).
pub fn child_taskserv(t: &TaskServ, uid: &str) -> ChildTaskServ {
    let status = t.status.clone().unwrap_or_default();
    ChildTaskServ {
        name: t.name_any(),
        labels: t.labels().clone(),
        spec: t.spec.clone(),
        owned: owned_by(t.meta(), uid),
        ready: conditions::is_true(&status.conditions, condition::READY),
        stalled: stalled_message(&status.conditions),
        phase: status.phase.clone().unwrap_or_default(),
        message: conditions::find(&status.conditions, condition::READY).map(|c| c.message.clone()).unwrap_or_default(),
        servers_in_status: status.servers.iter().map(|s| s.name.clone()).collect::<BTreeSet<_>>(),
        was_ever_ready: status.last_good_version.is_some(),
        deleting: t.metadata.deletion_timestamp.is_some(),
        serving: status.servers.iter().filter(|e| serving(e)).map(|e| (e.name.clone(), e.provider_id.clone())).collect(),
        settled: status.plan.is_some() && status.observed_generation == t.metadata.generation,
        pending_plan: status.plan,
        approve: t.annotations().get(ANNOTATION_APPROVE).cloned(),
    }
}

/// Reads the Servers and TaskServs of `cluster` (one labelled list each, from the API).
///
/// Not from the Server controller's cache: the `owns` watch that triggers this pass is
/// another watch than the one filling that cache, and may deliver a member's change (its
/// machine stopped) first. A pass reading the cache then plans on the member's old state,
/// and nothing triggers another one (the Cluster is Ready: its next resync is minutes away).
pub async fn children(cluster: &Cluster, namespace: &str, ctx: &Context) -> Result<Children, Error> {
    let name = cluster.name_any();
    let uid = cluster.uid().unwrap_or_default();
    let selector = ListParams::default().labels(&format!("{LABEL_CLUSTER}={name}"));
    // Decoded one by one: a member that does not decode is reported, not fatal to the pass.
    let servers = crate::decode::list::<Server>(&ctx.client, namespace, &selector).await?;
    let mut servers: Vec<ChildServer> = servers.iter().map(|s| child_server(s, &uid)).collect();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    let list = crate::decode::list::<TaskServ>(&ctx.client, namespace, &selector).await?;
    let mut taskservs: Vec<ChildTaskServ> = list.iter().map(|t| child_taskserv(t, &uid)).collect();
    taskservs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Children { servers, taskservs })
}

/// The other Clusters of `namespace`.
pub fn other_clusters(store: &Store<Cluster>, namespace: &str, own: &str) -> Vec<OtherCluster> {
    store
        .state()
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(namespace) && c.name_any() != own)
        .map(|c| OtherCluster {
            name: c.name_any(),
            ready: c.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, condition::READY)),
        })
        .collect()
}

/// Every Cluster of `own`'s namespace with the names its `dependsOn` lists (`own` as
/// reconciled, the others as cached): the graph
/// [`plan::check_depends_on`](super::plan::check_depends_on) looks for cycles in.
pub fn depends_on_graph(store: &Store<Cluster>, own: &Cluster) -> std::collections::BTreeMap<String, Vec<String>> {
    let namespace = own.namespace();
    let mut graph: std::collections::BTreeMap<String, Vec<String>> =
        store.state().iter().filter(|c| c.namespace() == namespace).map(|c| (c.name_any(), c.spec.depends_on.clone())).collect();
    graph.insert(own.name_any(), own.spec.depends_on.clone());
    graph
}
