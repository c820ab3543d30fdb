//! Dereference: read what a Server refers to (workspace, its rank for maxServers).

use kube::ResourceExt;
use kube::api::ListParams;
use provisioning_crds::{Server, Workspace};

use crate::context::Context;
use crate::effective_workspace::EffectiveWorkspace;

/// What a Server's reconcile needs from elsewhere.
#[derive(Clone, Debug)]
pub struct Refs {
    /// The workspace of the Server's namespace.
    pub workspace: EffectiveWorkspace,
    /// Older Servers in the namespace (for maxServers); `None` when the Server already has,
    /// or may have, a machine and so already counts.
    pub rank: Option<usize>,
}

/// Whether the Server has, or may have, a machine (recorded id, adoption, create in flight).
pub fn has_machine(server: &Server) -> bool {
    server.status.as_ref().is_some_and(|s| s.provider_id.is_some())
        || !server.spec.external_id.is_empty()
        || super::plan::create_pending(server)
}

/// Reads the workspace and, for a Server without a machine, its rank among the namespace's
/// Servers (oldest first; deleted ones do not count).
pub fn dereference(server: &Server, namespace: &str, ctx: &Context) -> Refs {
    let workspace = ctx.workspace_for(namespace);
    let all = ctx.stores.servers.len();
    let rank = if has_machine(server) {
        None
    } else if all <= workspace.spec.limits.max_servers as usize {
        // Fewer Servers in the whole cache than the limit: no need to rank.
        Some(0)
    } else {
        let max = workspace.spec.limits.max_servers as usize;
        let key = |s: &Server| (s.metadata.creation_timestamp.as_ref().map(|t| t.0), s.name_any());
        let mine = key(server);
        let mut in_namespace = 0usize;
        let mut older = 0usize;
        for other in ctx.stores.servers.state() {
            if other.metadata.namespace.as_deref() != Some(namespace) || other.metadata.deletion_timestamp.is_some() {
                continue;
            }
            in_namespace += 1;
            if other.uid() != server.uid() && key(&other) < mine {
                older += 1;
            }
        }
        // Below the limit whatever the order: skip ranking.
        if in_namespace <= max { Some(0) } else { Some(older) }
    };
    Refs { workspace, rank }
}

/// Whether the Workspace cache is behind for a Server about to get its first machine under the
/// controller's default settings: a Workspace claiming the namespace exists in the API but the
/// cache has not seen it yet (its create raced the Server's, as one `kubectl apply -f DIR` of
/// an example does). Creating then would make the machine at the wrong provider account, so
/// the API is asked (one list, only before a default-workspace machine exists).
pub async fn workspace_cache_behind(server: &Server, refs: &Refs, ctx: &Context) -> Result<bool, crate::error::Error> {
    if refs.workspace.name.is_some() || has_machine(server) {
        return Ok(false);
    }
    // Decoded one by one: a Workspace our decoder cannot read must not stall every Server.
    let live = crate::decode::list_cluster::<Workspace>(&ctx.client, &ListParams::default()).await?;
    let live: Vec<std::sync::Arc<Workspace>> = live.into_iter().map(std::sync::Arc::new).collect();
    Ok(crate::effective_workspace::owner_of(&refs.workspace.namespace, live.iter()).is_some())
}
