//! Dereference: read what a TaskServ refers to from the caches — the Servers of its namespace
//! and the other TaskServs (dependency candidates) — and turn them into planner facts.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use provisioning_crds::{LABEL_CLUSTER, LABEL_POOL, Server, TaskServ, condition};
use provisioning_taskservs::{AddressInfo, ClusterInfo, PeerInfo, ServerInfo, TaskServInfo, WorkspaceInfo};

use super::plan::{PeerTaskServ, ServerFacts};
use crate::conditions;
use crate::effective_workspace::EffectiveWorkspace;

/// Whether a Server can run scripts: Ready and with a provider id.
pub fn server_ready(server: &Server) -> bool {
    server.status.as_ref().is_some_and(|s| s.provider_id.is_some() && conditions::is_true(&s.conditions, condition::READY))
}

/// Facts about every Server of `namespace`.
pub fn servers(store: &Store<Server>, namespace: &str) -> Vec<ServerFacts> {
    let mut out: Vec<ServerFacts> = store
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace))
        .map(|s| ServerFacts {
            name: s.name_any(),
            labels: s.labels().clone(),
            ready: server_ready(s),
            deleting: s.metadata.deletion_timestamp.is_some(),
            addresses: s.status.as_ref().map(|st| st.addresses.clone()).unwrap_or_default(),
            simulated: s.status.as_ref().and_then(|st| st.provider_id.as_deref()).is_some_and(|id| id.starts_with("simulated://")),
            provider_id: s.status.as_ref().and_then(|st| st.provider_id.clone()),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Facts about every TaskServ of `namespace` but `own_name`.
pub fn peers(store: &Store<TaskServ>, namespace: &str, own_name: &str) -> Vec<PeerTaskServ> {
    store
        .state()
        .iter()
        .filter(|t| t.namespace().as_deref() == Some(namespace) && t.name_any() != own_name)
        .map(|t| {
            let status = t.status.clone().unwrap_or_default();
            PeerTaskServ {
                name: t.name_any(),
                service: t.spec.service.clone(),
                ready: t.metadata.deletion_timestamp.is_none() && conditions::is_true(&status.conditions, condition::READY),
                installed_on: status.servers.iter().filter(|s| s.phase == "Installed").map(|s| s.name.clone()).collect(),
            }
        })
        .collect()
}

/// Every TaskServ of `own`'s namespace with the names its `dependsOn` lists (`own` as
/// reconciled, the others as cached): the graph
/// [`plan::check_depends_on`](super::plan::check_depends_on) looks for cycles in.
pub fn depends_on_graph(store: &Store<TaskServ>, own: &TaskServ) -> BTreeMap<String, Vec<String>> {
    let namespace = own.namespace();
    let mut graph: BTreeMap<String, Vec<String>> =
        store.state().iter().filter(|t| t.namespace() == namespace).map(|t| (t.name_any(), t.spec.depends_on.clone())).collect();
    graph.insert(own.name_any(), own.spec.depends_on.clone());
    graph
}

fn addresses(server: &ServerFacts) -> Vec<AddressInfo> {
    let mut out: Vec<AddressInfo> =
        server.addresses.iter().map(|a| AddressInfo { kind: a.address_type.clone(), address: a.address.clone() }).collect();
    // The preferred (internal) address first.
    out.sort_by_key(|a| if a.kind == "InternalIP" { 0 } else { 1 });
    out
}

fn peer_info(server: &ServerFacts) -> PeerInfo {
    PeerInfo { name: server.name.clone(), addresses: addresses(server), pool: server.labels.get(LABEL_POOL).cloned().unwrap_or_default() }
}

/// The parts of a script context that come from the cluster's objects.
pub struct ContextParts {
    /// The server the script runs on.
    pub server: ServerInfo,
    /// The other selected servers.
    pub peers: Vec<PeerInfo>,
    /// The owning cluster and all its servers.
    pub cluster: ClusterInfo,
    /// The workspace.
    pub workspace: WorkspaceInfo,
    /// The TaskServ.
    pub taskserv: TaskServInfo,
}

/// Builds the context parts for running a step of `ts` on `server`.
pub fn context_parts(
    ts: &TaskServ,
    server: &ServerFacts,
    selected: &BTreeSet<String>,
    all_servers: &[ServerFacts],
    ws: &EffectiveWorkspace,
    version: &str,
    previous_version: Option<String>,
) -> ContextParts {
    let cluster_name = ts.labels().get(LABEL_CLUSTER).cloned().unwrap_or_default();
    let peers = all_servers.iter().filter(|s| selected.contains(&s.name) && s.name != server.name).map(peer_info).collect();
    let cluster_servers = if cluster_name.is_empty() {
        Vec::new()
    } else {
        all_servers.iter().filter(|s| s.labels.get(LABEL_CLUSTER) == Some(&cluster_name)).map(peer_info).collect()
    };
    ContextParts {
        server: ServerInfo {
            name: server.name.clone(),
            namespace: ts.namespace().unwrap_or_default(),
            addresses: addresses(server),
            hostname: server.name.clone(),
            pool: server.labels.get(LABEL_POOL).cloned().unwrap_or_default(),
        },
        peers,
        cluster: ClusterInfo { name: cluster_name, servers: cluster_servers },
        workspace: WorkspaceInfo {
            name: ws.name.clone().unwrap_or_default(),
            environment: ws.spec.environment.as_str().to_string(),
            config: ws.spec.config.clone().unwrap_or(serde_json::Value::Object(Default::default())),
        },
        taskserv: TaskServInfo { name: ts.name_any(), service: ts.spec.service.clone(), version: version.to_string(), previous_version },
    }
}
