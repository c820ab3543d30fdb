//! The Workspace reconciler: namespace, provider accounts, counts, cost.
//!
//! Pipeline (after the shared opening of [`crate::reconcile`]: cache gate, stale check, paused
//! check, first finalizer and status) → finalizer (Apply / Cleanup) → validate
//! (pure: namespace ownership) → act (ensure the namespace) → dereference (provider accounts,
//! counts and cost from caches) → status (pure) → one status patch when changed.

pub mod dereference;
pub mod hold;
pub mod rollup;
pub mod secrets;
pub mod status;
pub mod validate;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{PartialObjectMeta, PostParams};
use kube::runtime::controller::{Action, Config as ControllerSettings, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{Cluster, Server, TaskServ, Workspace, condition};

use crate::conditions;
use crate::context::Context;
use crate::decode;
use crate::error::{AtStep, Error, Step};
use crate::permissions::may_watch_all_secrets;
use crate::reconcile::{Reconciled, Trigger, error_policy, reconcile};
use crate::sync::{CacheSync, cache, tracked_reflector};
use status::{AccountCheck, StatusInput};

/// Kind name used in metrics and logs.
pub const KIND: &str = "Workspace";

pub use crate::effective_workspace::LABEL_WORKSPACE;

impl Reconciled for Workspace {
    fn shard_namespace(&self) -> String {
        crate::effective_workspace::claimed_namespace(self)
    }

    const KIND: &'static str = KIND;
    const PAUSE_HOLDS_DELETION: bool = true;
    type Status = provisioning_crds::WorkspaceStatus;
    type Ctx = Context;

    fn core(ctx: &Context) -> &Context {
        ctx
    }

    fn api(&self, ctx: &Context) -> Api<Workspace> {
        Api::all(ctx.client.clone())
    }

    fn status(&self) -> Option<&provisioning_crds::WorkspaceStatus> {
        self.status.as_ref()
    }

    async fn write_paused(&self, ctx: &Context) -> Result<(), Error> {
        let desired = status::desired(idle_input(self, true));
        ctx.apply_status(self, self.status.as_ref(), &desired).await.map(drop)
    }

    async fn write_first_status(&self, ctx: &Context) -> Result<(), Error> {
        // First visit: Unknown conditions.
        let mut desired = status::desired(idle_input(self, false));
        desired.phase = Some("Pending".into());
        desired.conditions = conditions::merge(
            &[],
            &conditions::Summary::Unknown { reason: "Initializing".into(), message: "reconciliation started".into() }.conditions(),
            self.metadata.generation,
            Timestamp::now(),
        );
        ctx.apply_status(self, self.status.as_ref(), &desired).await.map(drop)
    }

    async fn apply(self: Arc<Self>, ctx: &Context) -> Result<Action, Error> {
        apply(self, ctx).await
    }

    async fn cleanup(self: Arc<Self>, ctx: &Context) -> Result<Action, Error> {
        cleanup(self, ctx).await
    }
}

/// Status input of a Workspace before anything is known (paused, or its first visit).
fn idle_input(ws: &Workspace, paused: bool) -> StatusInput<'_> {
    StatusInput {
        previous: ws.status.as_ref(),
        generation: ws.metadata.generation,
        namespace: None,
        conflict: None,
        accounts: vec![],
        counts: None,
        worst: None,
        namespace_terminating: false,
        paused,
        now: Timestamp::now(),
    }
}

/// The Workspace controller over its cache, marked synced in `synced` as
/// [`cache::WORKSPACES`]. Its store is the Workspace cache of [`crate::context::Stores`];
/// [`run`] runs it.
pub fn controller(client: &Client, synced: &CacheSync) -> Controller<Workspace> {
    let (reader, stream) = tracked_reflector::<Workspace>(synced, cache::WORKSPACES, client, watcher::Config::default().any_semantic());
    Controller::for_stream(stream, reader)
}

/// Runs the Workspace controller until `shutdown` resolves. Workspaces recount when
/// resources of their namespace change, debounced so that a burst of Server updates costs
/// one recount, not one per update; a credentials Secret's change reconciles the Workspaces
/// using it and re-triggers their Stalled Servers through `servers`.
pub async fn run(
    controller: Controller<Workspace>,
    ctx: Arc<Context>,
    servers: Trigger<Server>,
    settings: ControllerSettings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    // Sharded: the namespace's objects that this replica holds (the Workspace cache itself
    // stays whole, crate::shard).
    let scope = ctx.scope();
    let ws_store = ctx.stores.workspaces.clone();
    let to_workspace = move |namespace: Option<String>| -> Vec<ObjectRef<Workspace>> {
        let Some(namespace) = namespace else { return vec![] };
        crate::effective_workspace::owner_of(&namespace, ws_store.state().iter())
            .map(|ws| ObjectRef::from_obj(ws.as_ref()))
            .into_iter()
            .collect()
    };
    let (m1, m2, m3, m4) = (to_workspace.clone(), to_workspace.clone(), to_workspace.clone(), to_workspace);
    let memo = ctx.clone();
    // A change of a Workspace's namespace (a deletion, above all) is looked at afresh, not
    // through the once-per-resync memo: a namespace deleted after its last Server went would
    // otherwise be made anew only at the next resync.
    // A namespace that opts in (or out) changes what its Servers stalled on the opt-in may do:
    // they are looked at again at once, not at their next backoff.
    let opt_in_servers = servers.clone();
    let on_namespace = move |ns: PartialObjectMeta<Namespace>| {
        memo.forget_observed(&format!("namespace/{}", ns.name_any()));
        let name = ns.name_any();
        for server in memo.stores.servers.state().iter().filter(|s| {
            s.metadata.namespace.as_deref() == Some(name.as_str())
                && s.status.as_ref().is_some_and(|st| {
                    st.conditions.iter().any(|c| c.type_ == "Stalled" && c.status == "True" && c.reason == "NamespaceNotOptedIn")
                })
        }) {
            opt_in_servers.send(ObjectRef::from_obj(server.as_ref()));
        }
        m4(Some(name))
    };
    let mut controller = controller
        .with_config(settings.debounce(Duration::from_secs(1)))
        .watches_stream(decode::touched::<Server>(&client, scope.config().any_semantic()), move |s: Server| m1(s.namespace()))
        .watches_stream(decode::touched::<TaskServ>(&client, scope.config().any_semantic()), move |s: TaskServ| m2(s.namespace()))
        .watches_stream(decode::touched::<Cluster>(&client, scope.config().any_semantic()), move |s: Cluster| m3(s.namespace()))
        // Metadata only (no spec to nest): bounded as it is.
        .watches(Api::<PartialObjectMeta<Namespace>>::all(client.clone()), watcher::Config::default().any_semantic(), on_namespace);
    // deploy/ grants Secrets per namespace only (deploy/rbac/secrets.yaml), so a cluster-wide
    // Secret watch would be refused forever: watch cluster-wide where allowed, else one watch
    // per workspace namespace that allows it, feeding the same mapping through a trigger.
    let on_secret = on_secret_change(ctx.clone(), servers);
    let (trigger, triggered) = Trigger::<Workspace>::new();
    let mut _per_namespace = None;
    if may_watch_all_secrets(&client).await {
        controller = controller
            .watches_stream(decode::touched::<PartialObjectMeta<Secret>>(&client, watcher::Config::default().any_semantic()), on_secret);
    } else {
        tracing::info!("no cluster-wide list/watch on Secrets (least privilege): watching them per workspace namespace");
        let workspaces = ctx.stores.workspaces.clone();
        _per_namespace = Some(crate::secret_watch::spawn(client.clone(), workspaces, move |secret| {
            for ws in on_secret(secret) {
                trigger.send(ws);
            }
        }));
    }
    controller
        .reconcile_on(triggered)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<Workspace>, error_policy::<Workspace>, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Maps a Secret change (metadata only: values are never read by the watch) to the
/// Workspaces using it: marks the providers built from it stale, and re-triggers the Servers
/// it concerns (see [`secrets`]) instead of leaving them to the error backoff.
fn on_secret_change(ctx: Arc<Context>, servers: Trigger<Server>) -> impl Fn(PartialObjectMeta<Secret>) -> Vec<ObjectRef<Workspace>> {
    move |secret: PartialObjectMeta<Secret>| {
        let Some(namespace) = secret.namespace() else { return vec![] };
        let name = secret.name_any();
        // Its finalizers may have changed (or it was re-created): look again.
        hold::forget(&ctx, &namespace);
        let all = ctx.stores.workspaces.state();
        let (using, namespaces) = secrets::referrers(&all, &ctx.config.default_workspace.providers, &namespace, &name);
        let affected: Vec<ObjectRef<Server>> = ctx
            .stores
            .servers
            .state()
            .iter()
            .filter(|s| secrets::server_affected(s, &namespaces, &namespace, &name))
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect();
        if using.is_empty() && affected.is_empty() && namespaces.is_empty() {
            return vec![];
        }
        let version = if secret.metadata.deletion_timestamp.is_some() { None } else { secret.metadata.resource_version.as_deref() };
        if !ctx.providers.note_secret(&namespace, &name, version) {
            return vec![];
        }
        tracing::debug!(secret = %format!("{namespace}/{name}"), workspaces = using.len(), servers = affected.len(), "credentials Secret changed");
        for server in affected {
            servers.send(server);
        }
        using.into_iter().map(|ws| ObjectRef::from_obj(ws.as_ref())).collect()
    }
}

async fn apply(ws: Arc<Workspace>, ctx: &Context) -> Result<Action, Error> {
    let all = ctx.stores.workspaces.state();
    let (namespace, conflict) = match validate::check_namespace(&ws, all.iter()) {
        Ok(ns) => (Some(ns), None),
        Err(conflict) => (None, Some(conflict.message())),
    };
    let (accounts, children, namespace_terminating) = match &namespace {
        Some(ns) => {
            // Resources being deleted may mean the namespace is: look at it afresh then.
            let fresh = ctx
                .stores
                .servers
                .state()
                .iter()
                .any(|s| s.metadata.namespace.as_deref() == Some(ns.as_str()) && s.metadata.deletion_timestamp.is_some());
            let terminating = ensure_namespace(ns, &ws, fresh, ctx).await.at(Step::Act)? == NamespaceState::Terminating;
            let effective = dereference::effective(&ws, ns, ctx);
            hold_credentials(ns, &effective, ctx).await.at(Step::Act)?;
            (
                dereference::check_accounts(&effective, ctx).await,
                Some(dereference::children(ns, ctx).await.at(Step::Dereference)?),
                terminating,
            )
        }
        None => (vec![], None, false),
    };
    let counts = children.as_deref().map(rollup::counts);
    let worst = children.as_deref().and_then(rollup::worst).cloned();
    let retrying = namespace_terminating || accounts.iter().any(|(_, c)| matches!(c, AccountCheck::Retrying(_)));
    let cost = namespace.as_deref().map(|ns| crate::cost::namespace_total(ns, &ctx.stores.servers.state()));
    let desired = status::desired(StatusInput {
        previous: ws.status.as_ref(),
        generation: ws.metadata.generation,
        namespace,
        conflict: conflict.clone(),
        accounts,
        counts,
        worst,
        namespace_terminating,
        paused: false,
        now: Timestamp::now(),
    });
    let desired = status::record_cost(desired, cost);
    let was = |t: &str| ws.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, t));
    let (was_ready, was_stalled) = (was(condition::READY), was(condition::STALLED));
    let ready = conditions::is_true(&desired.conditions, condition::READY);
    let stalled = conditions::find(&desired.conditions, condition::STALLED).filter(|c| c.status == "True").cloned();
    ctx.apply_status(ws.as_ref(), ws.status.as_ref(), &desired).await.at(Step::Status)?;
    if ready && !was_ready {
        ctx.publish(ws.as_ref(), EventType::Normal, "Ready", "Reconcile", Some("workspace ready".into())).await;
    }
    if let Some(stalled) = stalled {
        if !was_stalled {
            ctx.publish(ws.as_ref(), EventType::Warning, &stalled.reason, "Reconcile", Some(stalled.message.clone())).await;
        }
        // Waits for a change of spec or Secret; backs off like any permanent error.
        return Err(Error::Stalled { reason: "WorkspaceStalled", message: stalled.message }.at(Step::Validate));
    }
    Ok(if retrying { Action::requeue(ctx.config.poll()) } else { Action::requeue(crate::time::jittered(ctx.config.resync())) })
}

/// A Workspace being deleted keeps its finalizer while Servers, Clusters or TaskServs of its
/// namespace exist: they are deleted at their provider with its accounts (Crossplane's
/// ProviderConfigUsage), whatever order `kubectl delete -f DIR`, a namespace deletion or a
/// GitOps prune deletes things in. Its status names what it waits for.
async fn cleanup(ws: Arc<Workspace>, ctx: &Context) -> Result<Action, Error> {
    let namespace = crate::effective_workspace::claimed_namespace(&ws);
    // Only the owner of the namespace holds: a Workspace that lost it to an older one
    // never served its resources.
    let owner = crate::effective_workspace::owner_of(&namespace, ctx.stores.workspaces.state().iter());
    let owner = owner.as_ref();
    let users = if owner.is_some_and(|o| o.uid() == ws.uid()) { dereference::users(&namespace, ctx) } else { vec![] };
    let desired = status::terminating(ws.status.as_ref(), ws.metadata.generation, &users, Timestamp::now());
    if !users.is_empty() {
        ctx.apply_status(ws.as_ref(), ws.status.as_ref(), &desired).await.at(Step::Status)?;
        let message = conditions::find(&desired.conditions, condition::IN_USE).map(|c| c.message.clone()).unwrap_or_default();
        return Err(Error::InProgress(message).at(Step::Finalizer));
    }
    if owner.is_some_and(|o| o.uid() == ws.uid()) {
        // Nothing needs the credentials any more: a deleted Secret or RoleBinding may go.
        hold::sync(ctx, &namespace, &Default::default(), false).await.at(Step::Finalizer)?;
    }
    ctx.publish(ws.as_ref(), EventType::Normal, "Deleted", "Delete", Some("workspace released; its namespace is kept".into())).await;
    Ok(Action::await_change())
}

/// Holds the credentials the namespace's resources need while any exists ([`hold`]).
async fn hold_credentials(namespace: &str, effective: &crate::effective_workspace::EffectiveWorkspace, ctx: &Context) -> Result<(), Error> {
    let servers = ctx.stores.servers.state();
    let secrets = hold::needed(namespace, &effective.spec.providers, servers.iter());
    let in_use = !dereference::users(namespace, ctx).is_empty();
    hold::sync(ctx, namespace, &secrets, in_use).await
}

/// What [`ensure_namespace`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NamespaceState {
    /// It exists (or was just created).
    Active,
    /// It is being deleted: created again once gone.
    Terminating,
}

async fn ensure_namespace(namespace: &str, ws: &Workspace, fresh: bool, ctx: &Context) -> Result<NamespaceState, Error> {
    // Checked once per resync interval, not on every count change (unless `fresh`).
    let memo_key = format!("namespace/{namespace}");
    if !fresh && ctx.observed_recently(&memo_key, &ws.name_any(), ctx.config.resync()) {
        return Ok(NamespaceState::Active);
    }
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    if let Some(found) = api.get_opt(namespace).await? {
        if found.metadata.deletion_timestamp.is_some() {
            // Not memoised, and an earlier "Active" forgotten: looked at again on the next
            // pass until it is gone (then made anew), even once no Server is being deleted.
            ctx.forget_observed(&memo_key);
            return Ok(NamespaceState::Terminating);
        }
        ctx.mark_observed(&memo_key, &ws.name_any());
        return Ok(NamespaceState::Active);
    }
    let mut ns = Namespace::default();
    ns.metadata.name = Some(namespace.to_string());
    ns.metadata.labels = Some([(LABEL_WORKSPACE.to_string(), ws.name_any())].into());
    match api.create(&PostParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() }, &ns).await {
        Ok(_) => {
            ctx.metrics.record_write(KIND);
            ctx.publish(ws, EventType::Normal, "NamespaceCreated", "EnsureNamespace", Some(format!("created namespace {namespace}"))).await;
            Ok(NamespaceState::Active)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(NamespaceState::Active),
        Err(e) => Err(e.into()),
    }
}
