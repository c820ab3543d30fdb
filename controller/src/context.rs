//! The shared reconcile context: API client, caches, provider registry, per-workspace
//! semaphores, backoff, metrics and event recording.
//!
//! How a TaskServ or Cluster reconciler uses it (see `server/mod.rs` for a full example):
//! - `ctx.workspace_for(namespace)` → [`EffectiveWorkspace`] (settings, accounts, limits);
//! - `ctx.provider_for(&ws, account)` → a cached provider built with the Secret's credentials
//!   (the registry and how an account becomes a provider live in [`crate::accounts`]);
//! - `ctx.provider_call(&ws, &provider, account, "exec", fut)` → runs one provider call under
//!   the workspace's `parallelLimit` semaphore, timed in metrics, errors classified;
//!   `ctx.permit(key, limit)` gives a raw permit for other bounded work (per Cluster);
//! - `ctx.apply_status(&obj, obj.status.as_ref(), &new_status)` → one server-side-apply
//!   status patch, skipped when nothing changed (zero writes on a no-op resync);
//! - `ctx.set_annotation(&obj, key, Some(v) | None)` → metadata merge patch;
//! - `ctx.publish(&obj, EventType::Warning, "Reason", "Action", note)` → a core/v1 Event;
//! - `error_policy` of each kind calls `ctx.backoff(kind, &obj, &err)`.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use provisioning_crds::{Cluster, ProviderAccount, Server, TaskServ, Workspace};
use provisioning_providers::{ProviderResult, SharedProvider};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::accounts::{AccountChecks, ProviderRegistry};
use crate::config::ControllerConfig;
use crate::effective_workspace::{self, EffectiveWorkspace};
use crate::error::{Backoffs, Error};
use crate::history::ChangeHistory;
use crate::host::HostPaths;
use crate::metrics::Metrics;

/// Longest a cloud provider read may take, retries included.
const CLOUD_CALL_DEADLINE: Duration = Duration::from_secs(600);
/// The provider calls [`CLOUD_CALL_DEADLINE`] applies to: reads, which start nothing.
const DEADLINED: &[&str] = &["find_server", "observe_server", "survey", "validate_credentials"];

/// Field manager of every write the controller makes.
pub use crate::events::FIELD_MANAGER;

/// Caches the controller reads from (filled by watches in `run`).
#[derive(Clone)]
pub struct Stores {
    /// All Workspaces.
    pub workspaces: Store<Workspace>,
    /// All Servers.
    pub servers: Store<Server>,
    /// TaskServ metadata (for counts).
    pub taskservs: Store<PartialObjectMeta<TaskServ>>,
    /// Cluster metadata (for counts).
    pub clusters: Store<PartialObjectMeta<Cluster>>,
    /// Which of the caches (these and the TaskServ/Cluster controllers' own) have synced.
    pub synced: crate::sync::CacheSync,
}

/// Shared state of all reconcilers.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Configuration.
    pub config: ControllerConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event publisher (core/v1 Events, counts for repeats).
    pub recorder: crate::events::Publisher,
    /// Per-object retry counters.
    pub backoffs: Backoffs,
    /// Provider instances per account.
    pub providers: ProviderRegistry,
    /// Watch caches.
    pub stores: Stores,
    semaphores: Mutex<HashMap<String, (u32, Arc<Semaphore>)>>,
    waiters: Mutex<HashMap<String, usize>>,
    observations: Mutex<HashMap<String, Observed>>,
    /// Workspace provider-account checks (see [`AccountChecks`]).
    pub account_checks: AccountChecks,
    /// The resourceVersion of our last write per object uid (see [`Context::is_stale`]).
    written: Mutex<HashMap<String, u64>>,
    /// Provider calls and script runs, appended to `<state dir>/audit/`.
    pub audit: crate::audit::AuditLog,
    /// ChangeRecords, written after status writes ([`Context::apply_status`]).
    pub history: ChangeHistory,
    /// This controller's user name, asked once ([`crate::approval::authorize::controller_user`]).
    pub identity: tokio::sync::OnceCell<Option<String>>,
    /// This replica's shard (`sharding = true`): reconciles pass its gate ([`crate::shard`]).
    pub shard: Option<Arc<crate::shard::Shard>>,
}

/// When an object's external state was last observed, and under which trigger.
#[derive(Clone, Debug)]
struct Observed {
    at: Instant,
    fingerprint: String,
}

impl Context {
    /// Builds the context. `host` is resolved once at start-up ([`HostPaths::resolve`]) and
    /// handed to every provider built.
    pub fn new(client: Client, config: ControllerConfig, metrics: Arc<Metrics>, stores: Stores, instance: String, host: HostPaths) -> Self {
        let recorder = crate::events::Publisher::new(client.clone(), FIELD_MANAGER, &instance);
        let mut providers = ProviderRegistry::new(client.clone(), config.state_dir.clone(), host);
        providers.allow_insecure_endpoints = config.allow_insecure_endpoints;
        providers.aws_web_identity = config.aws_web_identity.clone();
        let audit_dir = crate::audit::dir_for_state_dir(&config.state_dir);
        let stream = config.audit_stdout.then(|| Box::new(std::io::stdout()) as crate::audit::Stream);
        let audit = crate::audit::AuditLog::open_with(&audit_dir, crate::audit::DEFAULT_MAX_BYTES, crate::audit::DEFAULT_KEEP, stream)
            .unwrap_or_else(|e| {
                tracing::warn!(dir = %audit_dir.display(), error = %format!("{e:#}"), "the audit log file is off: its directory cannot be written (set state_dir to a writable directory)");
                crate::audit::AuditLog::stream_only(config.audit_stdout.then(|| Box::new(std::io::stdout()) as crate::audit::Stream))
            });
        let history = ChangeHistory::new(client.clone(), FIELD_MANAGER, config.history_limit);
        Context {
            client,
            config,
            metrics,
            recorder,
            backoffs: Backoffs::default(),
            providers,
            stores,
            semaphores: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            observations: Mutex::new(HashMap::new()),
            account_checks: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            audit,
            history,
            identity: tokio::sync::OnceCell::new(),
            shard: None,
        }
    }

    /// What this replica's watches select: everything, or (sharded) its shard label.
    pub fn scope(&self) -> crate::shard::Scope {
        match &self.shard {
            Some(shard) => crate::shard::Scope::of(&shard.identity),
            None => crate::shard::Scope::all(),
        }
    }

    /// Waits until every watch cache holds its initial list (see [`crate::sync`]). Every
    /// reconcile calls this first: before it, the Workspace cache may be empty and a Server
    /// would resolve to the controller's default workspace.
    pub async fn caches_synced(&self) -> Result<(), Error> {
        self.stores.synced.wait().await
    }

    /// The effective workspace of a namespace (from the Workspace cache).
    pub fn workspace_for(&self, namespace: &str) -> EffectiveWorkspace {
        let all = self.stores.workspaces.state();
        effective_workspace::resolve(namespace, all.iter(), &self.config.default_workspace)
    }

    /// The provider of `account` in `ws`, built with its credentials.
    /// The Workspace holds its finalizer first ([`use_workspace`]).
    pub async fn provider_for(&self, ws: &EffectiveWorkspace, account: &ProviderAccount) -> Result<SharedProvider, Error> {
        use_workspace(self, ws).await?;
        self.providers.get(ws, account).await
    }

    /// A permit of the semaphore `key` sized `limit` (resized when `limit` changes; permits of
    /// the old size drain naturally). Waiting shows in the `provider_queue_depth` gauge.
    pub async fn permit(&self, key: &str, limit: u32) -> OwnedSemaphorePermit {
        let semaphore = {
            let mut map = self.semaphores.lock().unwrap_or_else(|p| p.into_inner());
            let limit = limit.max(1);
            let entry = map.entry(key.to_string()).or_insert_with(|| (limit, Arc::new(Semaphore::new(limit as usize))));
            if entry.0 != limit {
                *entry = (limit, Arc::new(Semaphore::new(limit as usize)));
            }
            entry.1.clone()
        };
        self.metrics.queue_depth.inc();
        *self.waiters.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_string()).or_insert(0) += 1;
        // Counted out when the wait ends, also when the waiting future is dropped (a caller's
        // timeout): a count left behind would turn every later create of the Workspace away.
        struct Waiting<'a> {
            ctx: &'a Context,
            key: &'a str,
        }
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let Some(n) = self.ctx.waiters.lock().unwrap_or_else(|p| p.into_inner()).get_mut(self.key) {
                    *n = n.saturating_sub(1);
                }
                self.ctx.metrics.queue_depth.dec();
            }
        }
        let waiting = Waiting { ctx: self, key };
        let permit = semaphore.acquire_owned().await;
        drop(waiting);
        // The semaphore is never closed, so acquiring cannot fail; fall back to a fresh one.
        match permit {
            Ok(p) => p,
            Err(_) => {
                let fresh = Arc::new(Semaphore::new(1));
                #[allow(clippy::expect_used)]
                fresh.acquire_owned().await.expect("fresh semaphore is open")
            }
        }
    }

    /// Admission to a workspace's provider queue: at most `parallelLimit` reconciles may wait
    /// for a permit while `parallelLimit` hold one; the rest are turned away with
    /// `Error::InProgress` (retried in ~2 s) so that one busy workspace never ties up all
    /// reconcile workers. Call before any provider step that writes first (create-pending).
    pub fn admit(&self, ws: &EffectiveWorkspace) -> Result<(), Error> {
        let limit = ws.spec.limits.parallel_limit.max(1) as usize;
        let map = self.semaphores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, semaphore)) = map.get(&ws.key()) {
            let waiting = self.waiting(&ws.key());
            if semaphore.available_permits() == 0 && waiting >= limit {
                return Err(Error::InProgress(format!("waiting for a provider slot ({} allows {limit} operations at once)", ws.display())));
            }
        }
        Ok(())
    }

    fn waiting(&self, key: &str) -> usize {
        let map = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).copied().unwrap_or(0)
    }

    /// Runs one provider call under the workspace's parallelLimit, timed and classified.
    pub async fn provider_call<T, F>(
        &self,
        ws: &EffectiveWorkspace,
        provider: &SharedProvider,
        account: &str,
        operation: &'static str,
        call: F,
    ) -> Result<T, Error>
    where
        F: Future<Output = ProviderResult<T>>,
    {
        let _permit = self.permit(&ws.key(), ws.spec.limits.parallel_limit).await;
        let start = Instant::now();
        // A cloud API read ends within a deadline, whatever its endpoint does (answers
        // trickling in, pages without end): it holds a reconcile slot and the Workspace's
        // permit meanwhile. Not creates, updates or deletes: cancelled half-way they would
        // start over (an UpCloud create with a thousand firewall rules at one call per second
        // would never finish); their calls are bounded one by one. Local calls may build images.
        let result = if matches!(provider.provider_type(), "aws" | "upcloud") && DEADLINED.contains(&operation) {
            tokio::time::timeout(CLOUD_CALL_DEADLINE, call).await.unwrap_or_else(|_| {
                Err(provisioning_providers::ProviderError::Transient(format!(
                    "{operation} did not finish within {} s; cancelled",
                    CLOUD_CALL_DEADLINE.as_secs()
                )))
            })
        } else {
            call.await
        };
        let elapsed = start.elapsed();
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.category(),
        };
        self.metrics.record_provider_call(provider.provider_type(), operation, outcome, elapsed.as_secs_f64());
        let result = result.map_err(|e| Error::provider(account, e));
        let action = crate::audit::Action::ProviderCall {
            provider: provider.provider_type().to_string(),
            account: account.to_string(),
            operation: operation.to_string(),
        };
        self.audit.record(crate::audit::Entry::now(action, elapsed, outcome, result.as_ref().err().map(ToString::to_string)));
        result
    }

    /// Writes `desired` as the object's status by server-side apply (field manager
    /// [`FIELD_MANAGER`]) unless it equals `current`. Returns whether it wrote.
    pub async fn apply_status<K, S>(&self, obj: &K, current: Option<&S>, desired: &S) -> Result<bool, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Serialize,
        S: Serialize + PartialEq,
    {
        if current == Some(desired) {
            return Ok(false);
        }
        let name = obj.meta().name.clone().ok_or(Error::MissingField("metadata.name"))?;
        let mut metadata = serde_json::json!({ "name": name });
        if let Some(ns) = obj.meta().namespace.as_deref() {
            metadata["namespace"] = ns.into();
        }
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": metadata,
            "status": desired,
        });
        let written = self.slim_api(obj).patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
        self.record_written(&written);
        self.metrics.record_write(&K::kind(&()));
        let kind = K::kind(&());
        if self.history.recorded(&kind) {
            let before = current.and_then(|c| serde_json::to_value(c).ok());
            // The record describes the spec this status was made for: the cached copy's (the
            // answer's spec may be a newer generation's, and is not decoded).
            let spec =
                || serde_json::to_value(obj).ok().and_then(|mut v| v.get_mut("spec").map(serde_json::Value::take)).unwrap_or_default();
            self.history.after_status_write(&kind, spec, &written, before.as_ref(), &patch["status"]);
        }
        Ok(true)
    }

    /// Sets (`Some`) or removes (`None`) one annotation with a merge patch.
    pub async fn set_annotation<K>(&self, obj: &K, key: &str, value: Option<&str>) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let name = obj.meta().name.clone().ok_or(Error::MissingField("metadata.name"))?;
        let patch = serde_json::json!({ "metadata": { "annotations": { key: value } } });
        let written = self
            .slim_api(obj)
            .patch(&name, &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &Patch::Merge(&patch))
            .await?;
        self.record_written(&written);
        self.metrics.record_write(&K::kind(&()));
        Ok(())
    }

    /// Reads and writes of `obj`'s kind in its namespace whose answers are decoded slim
    /// ([`crate::slim`]): the live object a write answers with is a tenant's to make large.
    pub fn slim_api<K>(&self, obj: &K) -> crate::slim::SlimApi
    where
        K: Resource<DynamicType = ()>,
    {
        crate::slim::SlimApi::of::<K>(self.client.clone(), obj.meta().namespace.as_deref())
    }

    /// Whether `obj` (from the watch cache) is older than our own last write to it. The
    /// API server's resourceVersions are opaque in general; when both parse as integers (etcd
    /// and the embedded server) a smaller one is an older copy. Reconciling a stale copy
    /// would redo work already recorded, so reconcilers return early and wait for the watch
    /// event of the newer version.
    pub fn is_stale<K: Resource>(&self, obj: &K) -> bool {
        let (Some(uid), Some(rv)) = (obj.meta().uid.as_deref(), obj.meta().resource_version.as_deref()) else {
            return false;
        };
        let Ok(rv) = rv.parse::<u64>() else { return false };
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.get(uid).is_some_and(|last| rv < *last)
    }

    /// Forgets what we wrote to an object (it is gone).
    pub fn forget_written<K: Resource>(&self, obj: &K) {
        if let Some(uid) = obj.meta().uid.as_deref() {
            self.written.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
        }
    }

    fn record_written(&self, obj: &crate::slim::Slim) {
        let (Some(uid), Some(rv)) = (obj.uid(), obj.resource_version()) else {
            return;
        };
        if let Ok(rv) = rv.parse::<u64>() {
            self.note_written_version(uid, rv);
        }
    }

    /// Records a write of ours (resourceVersion `rv`) to the object `uid` that did not go
    /// through [`Self::apply_status`]: cached copies older than it are stale (a shard
    /// hand-over's relabel, [`crate::shard`]).
    pub fn note_written_version(&self, uid: &str, rv: u64) {
        if uid.is_empty() {
            return;
        }
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let slot = written.entry(uid.to_string()).or_insert(0);
        *slot = (*slot).max(rv);
    }

    /// Adds [`provisioning_crds::FINALIZER`] to an object that has no finalizers at all, with a
    /// merge patch guarded by resourceVersion (409 on a race). Returns whether it wrote.
    /// Call before `kube::runtime::finalizer`, which handles every other case; this avoids
    /// its JSON-patch `test` of a missing path, which some API servers reject.
    pub async fn add_first_finalizer<K>(&self, obj: &K) -> Result<bool, Error>
    where
        K: Resource<DynamicType = ()>,
    {
        if !obj.meta().finalizers.as_ref().is_none_or(|f| f.is_empty()) || obj.meta().deletion_timestamp.is_some() {
            return Ok(false);
        }
        self.add_finalizer_with(obj, None).await
    }

    /// Adds [`provisioning_crds::FINALIZER`] (kept beside any finalizers others hold) and, when
    /// given, one annotation, in one merge patch guarded by resourceVersion. Returns whether
    /// it wrote; `Ok(true)` also on a 409 (our copy is stale; the newer version's watch event
    /// brings the object back), so a caller that must not go on without the write checks
    /// the result of [`Self::finalizer_with_annotation`] instead.
    async fn add_finalizer_with<K>(&self, obj: &K, annotation: Option<(&str, &str)>) -> Result<bool, Error>
    where
        K: Resource<DynamicType = ()>,
    {
        match self.finalizer_with_annotation(obj, annotation).await {
            Ok(()) => Ok(true),
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Writes [`provisioning_crds::FINALIZER`] (appended to the finalizers already there) and,
    /// when given, one annotation, in one merge patch guarded by resourceVersion: a 409 is
    /// an error here, so nothing that must come after this write runs on a stale copy.
    pub async fn finalizer_with_annotation<K>(&self, obj: &K, annotation: Option<(&str, &str)>) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()>,
    {
        let name = obj.meta().name.clone().ok_or(Error::MissingField("metadata.name"))?;
        let mut finalizers = obj.meta().finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == provisioning_crds::FINALIZER) {
            finalizers.push(provisioning_crds::FINALIZER.to_string());
        }
        let mut patch = serde_json::json!({ "metadata": {
            "finalizers": finalizers,
            "resourceVersion": obj.meta().resource_version,
        }});
        if let Some((key, value)) = annotation {
            patch["metadata"]["annotations"] = serde_json::json!({ key: value });
        }
        match self
            .slim_api(obj)
            .patch(&name, &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                self.record_written(&written);
                self.metrics.record_write(&K::kind(&()));
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes an event about `obj`. Failures are logged, never fatal: events are best-effort.
    pub async fn publish<K>(&self, obj: &K, type_: EventType, reason: &str, action: &str, note: Option<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        let note = note.map(|n| crate::conditions::truncate(&n, 1000));
        let what = crate::events::Occurrence { type_, reason, action, note: note.as_deref() };
        // Named at the kind's preferred version (v1beta1 for the served-twice kinds): that is
        // what `kubectl events --for KIND/NAME` selects on (involvedObject.apiVersion).
        let mut regarding = obj.object_ref(&());
        if regarding.api_version.as_deref() == Some(provisioning_crds::API_VERSION) {
            regarding.api_version =
                Some(provisioning_crds::preferred_api_version(regarding.kind.as_deref().unwrap_or_default()).to_string());
        }
        match self.recorder.publish(&what, &regarding).await {
            Ok(()) => {}
            // Upstream's NamespaceLifecycle refuses new content in a namespace being deleted.
            Err(kube::Error::Api(s)) if s.code == 403 && !s.message.contains("is being terminated") => {
                let namespace = obj.meta().namespace.clone().unwrap_or_default();
                let key = format!("events-refused/{namespace}");
                if !self.observed_recently(&key, "", Duration::from_secs(3600)) {
                    self.mark_observed(&key, "");
                    tracing::warn!(
                        namespace,
                        message = %s.message,
                        "may not publish Events here: grant create and patch on events (deploy/rbac/cluster-role.yaml does)"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, reason, "could not publish event"),
        }
    }

    /// `error_policy` body shared by every kind: counts the error, logs it with the object's
    /// reference and the failing pipeline step, and returns the jittered per-object backoff.
    pub fn backoff<K>(&self, kind: &str, obj: &K, error: &Error) -> Action
    where
        K: Resource,
    {
        let key = object_key(kind, obj);
        let class = error.class();
        let delay = self.backoffs.next_delay(&key, class);
        self.metrics.record_error(kind, error);
        let root = error.root();
        let step = error.step().map(|s| s.as_str()).unwrap_or("reconcile");
        match class {
            crate::error::ErrorClass::InProgress => {
                tracing::debug!(kind, namespace = obj.meta().namespace.as_deref(), name = obj.meta().name.as_deref(), step, message = %root, "waiting")
            }
            // Logged once, by the access layer (crate::metrics), naming the verb and resource.
            _ if error.refused_by_api() => {
                tracing::debug!(kind, name = obj.meta().name.as_deref(), step, error = %root, "reconcile refused")
            }
            _ => tracing::warn!(
                kind,
                namespace = obj.meta().namespace.as_deref(),
                name = obj.meta().name.as_deref(),
                step,
                category = error.category(),
                retry_in_ms = delay.as_millis() as u64,
                error = %root,
                "reconcile failed"
            ),
        }
        Action::requeue(delay)
    }

    /// Forgets an object's failures (after a successful reconcile).
    pub fn reset_backoff<K: Resource>(&self, kind: &str, obj: &K) {
        self.backoffs.reset(&object_key(kind, obj));
    }

    /// Whether `key`'s external state was observed within `max_age` under the same
    /// `fingerprint` (e.g. providerID + reconcile-requested-at); lets a reconcile triggered
    /// by its own status write skip a provider round trip.
    pub fn observed_recently(&self, key: &str, fingerprint: &str, max_age: Duration) -> bool {
        let map = self.observations.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).is_some_and(|o| o.fingerprint == fingerprint && o.at.elapsed() < max_age)
    }

    /// Records an observation of `key` (see [`Context::observed_recently`]).
    pub fn mark_observed(&self, key: &str, fingerprint: &str) {
        let mut map = self.observations.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(key.to_string(), Observed { at: Instant::now(), fingerprint: fingerprint.to_string() });
    }

    /// Forgets the observation of `key`.
    pub fn forget_observed(&self, key: &str) {
        let mut map = self.observations.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(key);
    }
}

/// Makes sure the Workspace named by `ws` holds its finalizer before a resource of its
/// namespace uses one of its accounts (Crossplane's ProviderConfigUsage): a Workspace deleted
/// before the controller's first visit had none, vanished at once, and left the machines made
/// with its accounts without a provider to delete them. A Workspace being deleted without it
/// lends its accounts to nothing.
async fn use_workspace(ctx: &Context, ws: &EffectiveWorkspace) -> Result<(), Error> {
    let Some(name) = &ws.name else { return Ok(()) };
    let holds = |w: &provisioning_crds::Workspace| w.finalizers().iter().any(|f| f == provisioning_crds::FINALIZER);
    let api = crate::slim::SlimApi::of::<provisioning_crds::Workspace>(ctx.client.clone(), None);
    let cached = ctx.stores.workspaces.state().into_iter().find(|w| &w.name_any() == name);
    let current = match cached {
        Some(w) if holds(&w) => return Ok(()),
        Some(w) => w.metadata.clone(),
        None => match api.get_opt(name).await? {
            Some(w) => w.meta(),
            None => return Ok(()),
        },
    };
    let deleting = |meta: &kube::api::ObjectMeta| Error::Stalled {
        reason: "WorkspaceDeleting",
        message: format!(
            "workspace {name:?} is being deleted{}: its accounts are not used for anything new",
            if meta.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == provisioning_crds::FINALIZER)) {
                ""
            } else {
                " before the controller saw it"
            }
        ),
    };
    if current.deletion_timestamp.is_some() {
        return Err(deleting(&current));
    }
    let finalizers: Vec<String> = current.finalizers.iter().flatten().cloned().chain([provisioning_crds::FINALIZER.to_string()]).collect();
    match patch_finalizers(&api, name, current.resource_version.as_deref(), finalizers).await {
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => {
            // Changed meanwhile (often: its own reconciler just added the finalizer). Look again.
            match api.get_opt(name).await?.map(|w| w.meta()) {
                Some(w) if w.finalizers.iter().flatten().any(|f| f == provisioning_crds::FINALIZER) => Ok(()),
                Some(w) if w.deletion_timestamp.is_some() => Err(deleting(&w)),
                _ => Err(Error::InProgress(format!("workspace {name:?} changed while its finalizer was added; trying again"))),
            }
        }
        other => other,
    }
}

/// A merge patch of the finalizers, guarded by the resourceVersion they were read at (a
/// concurrent change is a conflict, retried by the next pass, never a lost finalizer).
pub(crate) async fn patch_finalizers(
    api: &crate::slim::SlimApi,
    name: &str,
    resource_version: Option<&str>,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let patch = serde_json::json!({"metadata": {"resourceVersion": resource_version, "finalizers": finalizers}});
    let params = PatchParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() };
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        // Gone meanwhile: nothing to hold or release.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `kind/namespace/name` of an object.
pub fn object_key<K: Resource>(kind: &str, obj: &K) -> String {
    format!("{kind}/{}/{}", obj.meta().namespace.as_deref().unwrap_or(""), obj.meta().name.as_deref().unwrap_or(""))
}

/// Whether the paused annotation is `"true"`.
pub fn is_paused<K: Resource>(obj: &K) -> bool {
    obj.annotations().get(provisioning_crds::ANNOTATION_PAUSED).is_some_and(|v| v == "true")
}
