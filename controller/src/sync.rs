//! The cache-sync gate: no reconcile acts before every watch cache holds its initial list.
//!
//! kube-runtime starts a Controller's reconciles once *its own* cache is ready, but our
//! reconcilers also read the other kinds' caches: a Server resolves its Workspace (which
//! names the provider accounts), ranks itself against the namespace's other Servers for
//! `maxServers`, a Workspace counts Servers, TaskServs and Clusters. Read from a cache that
//! has not synced yet, a restarted controller would resolve a Server to the controller's
//! default workspace and create its machine at the wrong provider, or let a namespace
//! exceed `maxServers`. So each cache's watch stream marks it synced on its first
//! `InitDone`, and every reconcile waits for all of them first.
//!
//! One unreadable object must not stop every reconcile (a list that kube-rs cannot decode
//! fails the whole cache): every cache is filled through [`crate::decode::watch`], which
//! decodes items one by one within a depth and size budget and reports (and leaves out) an
//! object that does not decode. A cache whose list still fails (a missing CRD or RBAC rule)
//! is reported by name every 30 s (see `CacheSync::pending`).
//!
//! (`Store::wait_until_ready` is not used for this: in kube-runtime 5.0.0 only one of two
//! tasks awaiting it concurrently is woken, and the Controllers already await it.)
//!
//! The tracked caches themselves are built here too: [`tracked_reflector`] for a kind's
//! controller, [`metadata_store`] for the metadata-only caches, named by [`cache`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::watch;

use crate::decode;
use crate::error::Error;

/// How long one reconcile waits for the caches before it is requeued (as `InProgress`).
const WAIT: Duration = Duration::from_secs(10);

/// The watch caches that have not seen their initial list yet.
#[derive(Clone, Debug)]
pub struct CacheSync {
    pending: Arc<watch::Sender<BTreeSet<&'static str>>>,
}

impl CacheSync {
    /// A gate waiting for the caches named `names`.
    pub fn new(names: &[&'static str]) -> Self {
        let (tx, _) = watch::channel(names.iter().copied().collect());
        CacheSync { pending: Arc::new(tx) }
    }

    /// Marks the cache `name` synced.
    pub fn mark(&self, name: &'static str) {
        self.pending.send_if_modified(|pending| pending.remove(name));
    }

    /// The caches still waiting for their initial list.
    pub fn pending(&self) -> Vec<&'static str> {
        self.pending.borrow().iter().copied().collect()
    }

    /// True once every cache has synced.
    pub fn is_synced(&self) -> bool {
        self.pending.borrow().is_empty()
    }

    /// Waits (up to 10 s) until every cache holds its initial list; after that an
    /// `InProgress` error naming the caches still syncing (the object is retried shortly).
    pub async fn wait(&self) -> Result<(), Error> {
        self.wait_at_most(WAIT).await
    }

    /// [`CacheSync::wait`] with another limit.
    pub async fn wait_at_most(&self, limit: Duration) -> Result<(), Error> {
        if self.is_synced() {
            return Ok(());
        }
        let mut rx = self.pending.subscribe();
        match tokio::time::timeout(limit, rx.wait_for(BTreeSet::is_empty)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::InProgress(format!("waiting for the watch caches to sync: {}", self.pending().join(", ")))),
        }
    }

    /// Passes a watch stream through, marking `name` synced at its first `InitDone` (put it
    /// after `reflector(..)`, which has applied the event to the store by then).
    pub fn track<K, S>(&self, name: &'static str, stream: S) -> impl Stream<Item = S::Item> + Send + use<K, S>
    where
        S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
        K: Send,
    {
        let gate = self.clone();
        stream.inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                gate.mark(name);
            }
        })
    }
}

/// Names of the watch caches (in "waiting for the watch caches to sync: …" messages).
pub mod cache {
    /// The Workspace controller's cache.
    pub const WORKSPACES: &str = "Workspace";
    /// The Server controller's cache.
    pub const SERVERS: &str = "Server";
    /// The TaskServ controller's cache.
    pub const TASKSERVS: &str = "TaskServ";
    /// The Cluster controller's cache.
    pub const CLUSTERS: &str = "Cluster";
    /// TaskServ metadata (Workspace counts).
    pub const TASKSERV_META: &str = "TaskServ metadata";
    /// Cluster metadata (Workspace counts).
    pub const CLUSTER_META: &str = "Cluster metadata";
    /// Every cache the gate waits for.
    pub const ALL: &[&str] = &[WORKSPACES, SERVERS, TASKSERVS, CLUSTERS, TASKSERV_META, CLUSTER_META];
}

/// A cache of every `K` and the stream of its applied objects for `Controller::for_stream`,
/// marked synced in `synced` as `name` at its first initial list.
pub fn tracked_reflector<K>(
    synced: &CacheSync,
    name: &'static str,
    client: &Client,
    config: watcher::Config,
) -> (reflector::Store<K>, impl Stream<Item = Result<K, watcher::Error>> + Send + use<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = synced.track(name, reflector::reflector(writer, decode::watch::<K>(client, config))).applied_objects();
    (reader, stream)
}

/// A metadata-only cache of `K` (for counts), filled by a background watch.
pub fn metadata_store<K>(
    client: Client,
    synced: &CacheSync,
    name: &'static str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> reflector::Store<PartialObjectMeta<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    metadata_store_in(client, synced, name, watcher::Config::default(), shutdown)
}

/// [`metadata_store`] of the objects `config` selects (a shard's label, [`crate::shard::Scope`]).
pub fn metadata_store_in<K>(
    client: Client,
    synced: &CacheSync,
    name: &'static str,
    config: watcher::Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> reflector::Store<PartialObjectMeta<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = synced
        .track(name, reflector::reflector(writer, decode::watch::<PartialObjectMeta<K>>(&client, config.any_semantic())))
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
    // Stops with the controller: a watch left running past shutdown logs connect errors
    // once the API server is gone (`provisioning dev` stops both on Ctrl-C).
    tokio::spawn(async move {
        tokio::select! {
            () = stream => {}
            () = shutdown => {}
        }
    });
    reader
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_every_cache_and_wakes_every_waiter() {
        let gate = CacheSync::new(&["Workspace", "Server"]);
        assert!(!gate.is_synced());
        // Several reconciles waiting at once all wake (unlike Store::wait_until_ready).
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                tokio::spawn({
                    let g = gate.clone();
                    async move { g.wait().await }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.mark("Workspace");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "must wait for the Server cache too");
        assert_eq!(gate.pending(), vec!["Server"]);
        gate.mark("Server");
        for w in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(2), w).await.expect("woken in time").expect("waiter task");
            assert!(woke.is_ok());
        }
        assert!(gate.is_synced());
    }

    #[tokio::test]
    async fn a_cache_that_never_syncs_is_an_in_progress_error_naming_it() {
        let gate = CacheSync::new(&["Workspace"]);
        let err = gate.wait_at_most(Duration::from_millis(50)).await.expect_err("never synced");
        assert!(matches!(err, Error::InProgress(_)));
        assert!(err.to_string().contains("Workspace"), "{err}");
    }

    #[tokio::test]
    async fn init_done_marks_the_cache() {
        let gate = CacheSync::new(&["Workspace"]);
        let events: Vec<watcher::Result<watcher::Event<()>>> =
            vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitApply(())), Ok(watcher::Event::InitDone)];
        let mut stream = Box::pin(gate.track("Workspace", futures::stream::iter(events)));
        stream.next().await;
        stream.next().await;
        assert!(!gate.is_synced(), "not before InitDone");
        stream.next().await;
        assert!(gate.is_synced());
    }
}
