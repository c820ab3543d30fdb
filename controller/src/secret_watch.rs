//! Per-namespace Secret watches, for identities that may not watch Secrets cluster-wide
//! (deploy/rbac grants them per workspace namespace only).
//!
//! [`spawn`] starts a supervisor that keeps one metadata-only Secret watch (values are never
//! read by a watch) per namespace claimed by a Workspace, where a SelfSubjectAccessReview
//! allows list/watch of Secrets there. Watches start when a Workspace appears (or its
//! RoleBinding is added: refused namespaces are asked again every [`RECHECK_REFUSED`]) and
//! stop when it goes. Every Secret seen goes to the caller's function — the same mapping the
//! cluster-wide watch feeds. Dropping the returned [`SecretWatches`] stops it all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use provisioning_crds::Workspace;
use tokio::task::JoinHandle;

use crate::effective_workspace::claimed_namespace;
use crate::permissions::may_watch_secrets_in;

/// How often the supervisor looks at the Workspace cache.
const POLL: Duration = Duration::from_secs(1);
/// How long a namespace whose Secrets may not be watched waits before it is asked again.
pub const RECHECK_REFUSED: Duration = Duration::from_secs(30);

/// A task aborted when dropped.
struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running supervisor and its watches; dropping it stops them.
pub struct SecretWatches {
    _supervisor: Aborting,
}

/// The namespaces claimed by the Workspaces of `workspaces` (not being deleted).
pub fn workspace_namespaces(workspaces: &Store<Workspace>) -> BTreeSet<String> {
    workspaces.state().iter().filter(|ws| ws.metadata.deletion_timestamp.is_none()).map(|ws| claimed_namespace(ws)).collect()
}

/// Starts the per-namespace watches; `on_secret` is called for every Secret seen (added,
/// changed or deleted).
pub fn spawn(
    client: Client,
    workspaces: Store<Workspace>,
    on_secret: impl Fn(PartialObjectMeta<Secret>) + Send + Sync + 'static,
) -> SecretWatches {
    let on_secret: Arc<dyn Fn(PartialObjectMeta<Secret>) + Send + Sync> = Arc::new(on_secret);
    let supervisor = tokio::spawn(async move {
        let mut watches: BTreeMap<String, Aborting> = BTreeMap::new();
        let mut refused: BTreeMap<String, Instant> = BTreeMap::new();
        loop {
            let wanted = workspace_namespaces(&workspaces);
            watches.retain(|ns, _| wanted.contains(ns));
            refused.retain(|ns, _| wanted.contains(ns));
            let missing: Vec<String> = wanted.iter().filter(|ns| !watches.contains_key(*ns)).cloned().collect();
            for ns in &missing {
                if refused.get(ns).is_some_and(|at| at.elapsed() < RECHECK_REFUSED) {
                    continue;
                }
                if may_watch_secrets_in(&client, ns).await {
                    refused.remove(ns);
                    tracing::debug!(namespace = %ns, "watching Secrets of the namespace");
                    watches.insert(ns.clone(), Aborting(tokio::spawn(watch(client.clone(), ns.clone(), on_secret.clone()))));
                } else if refused.insert(ns.clone(), Instant::now()).is_none() {
                    tracing::info!(
                        namespace = %ns,
                        "may not list/watch Secrets in this namespace (no RoleBinding to provisioning-controller-secrets?): \
                         a changed Secret there is picked up at the next retry or resync"
                    );
                }
            }
            tokio::time::sleep(POLL).await;
        }
    });
    SecretWatches { _supervisor: Aborting(supervisor) }
}

async fn watch(client: Client, namespace: String, on_secret: Arc<dyn Fn(PartialObjectMeta<Secret>) + Send + Sync>) {
    // Each Secret's metadata decoded on its own, within the decoder's bounds (a tenant's labels
    // are not bounded in number), in small pages.
    let api: Api<crate::decode::Tolerant<PartialObjectMeta<Secret>>> = Api::namespaced(client.clone(), &namespace);
    let config = watcher::Config::default().any_semantic().page_size(50);
    let mut stream = crate::decode::watch_in(&client, api, config).default_backoff().touched_objects().boxed();
    while let Some(item) = stream.next().await {
        match item {
            Ok(secret) => on_secret(secret),
            Err(e) => tracing::debug!(namespace = %namespace, error = %e, "Secret watch error; retrying with backoff"),
        }
    }
}
