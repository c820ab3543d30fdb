//! The TaskServ reconciler: one catalog service installed on a set of Servers.
//!
//! Pipeline per visit (after the shared opening of [`crate::reconcile`]: cache gate, stale
//! check, paused check, first finalizer and status) → finalizer (Apply / Cleanup) →
//! [`dereference`] (Servers and other TaskServs from the caches) → [`validate`] (pure:
//! service, version, config schema, dependency cycle) → [`plan`] (pure: per-server state
//! machine, dependencies, health, upgrades and rollback) → [`act`] (script runs as tracked
//! background tasks) → one status patch, skipped when unchanged → events → requeue.
//!
//! Script runs never block a reconcile: they are spawned, bounded by the owning Cluster's
//! `parallelLimit` (or the workspace's for a standalone TaskServ), and their results come
//! back through [`act::ScriptRuns`] plus a reconcile trigger.

pub mod act;
pub mod approval;
pub mod dereference;
pub mod inputs;
pub mod plan;
pub mod validate;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerSettings, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use provisioning_crds::{Cluster, ConfigSourceKind, LABEL_CLUSTER, LocalSecretReference, Server, TaskServ, TaskServStatus, condition};
use provisioning_providers::ProviderId;
use provisioning_taskservs::{Catalog, ScriptContext, ScriptPaths};

use crate::conditions::{self, DesiredCondition, Status};
use crate::context::Context;
use crate::decode;
use crate::error::{Error, ErrorClass, Step};
use crate::permissions::may_watch_all_secrets;
use crate::reconcile::{Note, Reconciled, Trigger, error_policy, reconcile, report};
use crate::sync::{cache, tracked_reflector};
use crate::time::now_seconds;
use act::{ProviderExecutor, RunRequest, ScriptRuns, TaskServKey};
use plan::{Observed, Operation, Plan, ServerFacts};
use validate::ValidTaskServ;

/// Kind name used in metrics and logs.
pub const KIND: &str = "TaskServ";

/// What the TaskServ reconciler shares between reconciles.
pub struct TaskServContext {
    /// The controller core's context.
    pub ctx: Arc<Context>,
    /// The taskserv catalog.
    pub catalog: Arc<Catalog>,
    /// Script runs in flight and finished.
    pub runs: Arc<ScriptRuns>,
    /// Queues a TaskServ for reconcile (finished runs).
    pub trigger: Trigger<TaskServ>,
    /// Queues a Server for reconcile (its machine is to be looked at now).
    pub servers: Trigger<Server>,
    /// All TaskServs (the controller's own cache).
    pub taskservs: Store<TaskServ>,
}

/// Runs the TaskServ controller until `shutdown` resolves. `servers` asks the Server
/// reconciler to look at a Server now (a script failed on its machine, or its host key is
/// to be recorded).
pub async fn run(
    ctx: Arc<Context>,
    catalog: Arc<Catalog>,
    servers: Trigger<Server>,
    settings: ControllerSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ctx_client = client.clone();
    let (trigger, triggered) = Trigger::new();
    let (reader, stream) = tracked_reflector::<TaskServ>(&ctx.stores.synced, cache::TASKSERVS, &client, ctx.scope().config());
    let controller = Controller::for_stream(stream, reader);
    let store = controller.store();
    let tctx =
        Arc::new(TaskServContext { ctx, catalog, runs: Arc::new(ScriptRuns::default()), trigger, servers, taskservs: store.clone() });
    let selecting = store.clone();
    let (by_secret, by_config_map) = (store.clone(), store.clone());
    // Secrets are granted per namespace by deploy/ (no cluster-wide watch allowed there): then
    // they are watched per workspace namespace ([`crate::secret_watch`]).
    let watch_secrets = may_watch_all_secrets(&ctx_client).await;
    let controller = controller
        // A Server coming, going or changing readiness re-plans the TaskServs that select it.
        .watches_stream(decode::touched::<Server>(&client, tctx.ctx.scope().config()), move |server: Server| {
            let namespace = server.namespace().unwrap_or_default();
            let name = server.name_any();
            let labels = server.labels().clone();
            selecting
                .state()
                .iter()
                .filter(|t| t.namespace().as_deref() == Some(namespace.as_str()))
                .filter(|t| {
                    t.spec.servers.names.contains(&name)
                        || t.status.as_ref().is_some_and(|s| s.servers.iter().any(|e| e.name == name))
                        || t.spec.servers.selector.as_ref().is_some_and(|sel| {
                            !sel.match_labels.is_empty() && sel.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
                        })
                })
                .map(|t| ObjectRef::from_obj(t.as_ref()))
                .collect::<Vec<_>>()
        })
        // A referenced Secret or ConfigMap changing (metadata-only watches: values are read by
        // the reconcile, never by the watch) re-resolves the config: a rotated password
        // re-runs the install, an awaited Secret that appears lets the TaskServ go on.
        .watches_stream(
            decode::touched::<PartialObjectMeta<ConfigMap>>(&ctx_client, watcher::Config::default().any_semantic()),
            move |c| referrers(&by_config_map, ConfigSourceKind::ConfigMap, c.namespace(), &c.name_any()),
        );
    let mut _per_namespace = None;
    let controller = if watch_secrets {
        controller.watches_stream(
            decode::touched::<PartialObjectMeta<Secret>>(&ctx_client, watcher::Config::default().any_semantic()),
            move |s| referrers(&by_secret, ConfigSourceKind::Secret, s.namespace(), &s.name_any()),
        )
    } else {
        // Only per namespace (deploy/rbac): one watch per workspace namespace that allows it.
        let trigger = tctx.trigger.clone();
        _per_namespace = Some(crate::secret_watch::spawn(ctx_client, tctx.ctx.stores.workspaces.clone(), move |s| {
            for ts in referrers(&by_secret, ConfigSourceKind::Secret, s.namespace(), &s.name_any()) {
                trigger.send(ts);
            }
        }));
        controller
    };
    controller
        .reconcile_on(triggered)
        .with_config(settings)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<TaskServ>, error_policy::<TaskServ>, tctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The TaskServs of `namespace` that read the Secret/ConfigMap `name` through `configFrom`,
/// or own it as their generated Secret.
fn referrers(store: &Store<TaskServ>, kind: ConfigSourceKind, namespace: Option<String>, name: &str) -> Vec<ObjectRef<TaskServ>> {
    let Some(namespace) = namespace else { return vec![] };
    store
        .state()
        .iter()
        .filter(|t| t.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|t| {
            t.spec.config_from.iter().any(|c| c.kind == kind && c.name == name)
                || (kind == ConfigSourceKind::Secret
                    && t.status.as_ref().and_then(|s| s.generated_secret_ref.as_ref()).is_some_and(|r| r.name == name))
        })
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

/// Tracker key of a TaskServ.
pub fn key(ts: &TaskServ) -> TaskServKey {
    format!("{}/{}/{}", ts.namespace().unwrap_or_default(), ts.name_any(), ts.uid().unwrap_or_default())
}

impl Reconciled for TaskServ {
    const KIND: &'static str = KIND;
    // Removal goes on while paused: the scripts it runs are the object's own cleanup.
    const PAUSE_HOLDS_DELETION: bool = false;
    type Status = TaskServStatus;
    type Ctx = TaskServContext;

    fn core(tctx: &TaskServContext) -> &Context {
        &tctx.ctx
    }

    fn api(&self, ctx: &Context) -> Api<TaskServ> {
        Api::namespaced(ctx.client.clone(), self.metadata.namespace.as_deref().unwrap_or_default())
    }

    fn status(&self) -> Option<&TaskServStatus> {
        self.status.as_ref()
    }

    async fn write_first_status(&self, tctx: &TaskServContext) -> Result<(), Error> {
        // Conditions start as Unknown, never absent.
        let desired = [
            DesiredCondition::new(condition::READY, Status::Unknown, "Initializing", "reconciliation started"),
            DesiredCondition::new(condition::RECONCILING, Status::True, "Initializing", "reconciliation started"),
            DesiredCondition::new(condition::STALLED, Status::False, "NotStalled", ""),
            DesiredCondition::new(condition::DEPENDENCIES_READY, Status::Unknown, "Initializing", ""),
            DesiredCondition::new(condition::INSTALLED, Status::Unknown, "Initializing", ""),
            DesiredCondition::new(condition::HEALTHY, Status::Unknown, "Initializing", ""),
        ];
        let status = TaskServStatus {
            phase: Some("Pending".into()),
            observed_generation: self.metadata.generation,
            conditions: conditions::merge(&[], &desired, self.metadata.generation, now_seconds()),
            ..self.status.clone().unwrap_or_default()
        };
        tctx.ctx.apply_status(self, self.status.as_ref(), &status).await.map(drop)
    }

    async fn apply(self: Arc<Self>, tctx: &TaskServContext) -> Result<Action, Error> {
        let namespace = self.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
        apply(self, &namespace, tctx, false).await
    }

    async fn cleanup(self: Arc<Self>, tctx: &TaskServContext) -> Result<Action, Error> {
        let namespace = self.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
        apply(self, &namespace, tctx, true).await
    }
}

async fn apply(ts: Arc<TaskServ>, namespace: &str, tctx: &TaskServContext, deleting: bool) -> Result<Action, Error> {
    let ctx = &tctx.ctx;
    // An approval that does not count (crate::approval::authorize) is not seen by the gate.
    let ws = ctx.workspace_for(namespace).spec;
    let approval = crate::approval::approval_of(ts.spec.approval, ws.approval);
    // Under four eyes, the writers of the configFrom sources may not approve either.
    let sources: Vec<(&str, String)> = ts.spec.config_from.iter().map(|c| (c.kind.as_str(), c.name.clone())).collect();
    let sources: Vec<(&str, &str)> = sources.iter().map(|(k, n)| (*k, n.as_str())).collect();
    let (ts, refused) = crate::approval::authorize::screen(ts.clone(), "taskservs", approval, ws.require_distinct_approver, &sources, ctx)
        .await
        .map_err(|e| e.at(Step::Dereference))?;
    let servers = dereference::servers(&ctx.stores.servers, namespace);
    let peers = dereference::peers(&tctx.taskservs, namespace, &ts.name_any());
    // Dereference the config inputs (configFrom, generated secrets). Waiting on the user
    // (a missing Secret) is a Stalled condition; an API failure is retried with backoff.
    let mut generated_secret = None;
    let validated = match inputs::resolve(&ctx.client, &ts, &tctx.catalog, !deleting).await {
        Ok(resolved) => {
            generated_secret = resolved.generated_secret.clone();
            validate::validate_resolved(&ts.spec, resolved.config, resolved.hash, resolved.redactor, &tctx.catalog)
        }
        Err(inputs::InputsError::Kube(e)) if !deleting => return Err(Error::Kube(e).at(Step::Dereference)),
        Err(e) => Err(validate::InvalidTaskServ::ConfigInputs(e.reason(), e.to_string())),
    };
    let graph = dereference::depends_on_graph(&tctx.taskservs, &ts);
    let validated = validated.and_then(|v| plan::check_depends_on(&ts.name_any(), &graph).map(|()| v));
    // The controller config may shorten health intervals (`provisioning test` re-checks soon).
    let validated = validated.map(|mut v| {
        v.health_interval = ctx.config.health_interval(v.health_interval);
        v
    });
    let key = key(&ts);
    let in_flight = tctx.runs.in_flight(&key);
    let results = tctx.runs.results(&key);
    let status = ts.status.clone().unwrap_or_default();
    let health_interval = validated.as_ref().map(|v| v.health_interval).unwrap_or(Duration::from_secs(60));
    let installed: Vec<String> =
        status.servers.iter().filter(|s| s.phase == "Installed" && s.healthy != Some(false)).map(|s| s.name.clone()).collect();
    let checks_due = tctx.runs.checks_due(&key, installed, health_interval);
    let name = ts.name_any();
    let observed = Observed {
        name: &name,
        generation: ts.metadata.generation,
        spec: &ts.spec,
        status: &status,
        validated: &validated,
        servers: &servers,
        taskservs: &peers,
        in_flight: &in_flight,
        results: &results,
        checks_due: &checks_due,
        now: now_seconds(),
    };
    let (plan, done) = if deleting { plan::plan_removal(&observed) } else { (plan::plan(&observed), false) };
    let Plan { status: mut desired, mut launch, events, requeue, version } = plan;
    if let Some(name) = generated_secret {
        desired.generated_secret_ref = Some(LocalSecretReference { name });
    }
    let mut stale = Vec::new();
    if !deleting {
        let resource = format!("TaskServ/{namespace}/{}", ts.name_any());
        let taskserv_plan = plan::taskserv_plan(&resource, ts.metadata.generation, &desired, version.as_deref());
        stale = gate_on_approval(&ts, namespace, ctx, &status, &mut desired, &mut launch, &taskserv_plan);
        desired.plan = Some(taskserv_plan);
    }

    if !launch.is_empty() {
        let selected = plan::selected_servers(&ts.spec, &servers);
        let limit = bound(&ts, namespace, ctx).await;
        // One copy of the Servers' facts for all the runs started now (a Server's labels are
        // the tenant's: never copied per run).
        let shared: Arc<[ServerFacts]> = servers.clone().into();
        for (server, operation) in launch {
            start_run(&ts, &server, operation, &shared, &selected, validated.as_ref().ok(), &limit, tctx);
        }
    }
    // The stale approval's Warning first, then the plan's events, once the status is written.
    let notes = refused.into_iter().chain(stale).chain(events.into_iter().map(|e| Note::planned(e, "Reconcile")));
    report(ts.as_ref(), ts.status.as_ref(), Some(&desired), notes.collect(), ctx).await?;
    // Checkpoint: the results are acknowledged only once the status recording them is written.
    tctx.runs.acknowledge(&key, results.len());
    // A failed run may mean the machine died under the service: have the Server look at its
    // machine now rather than at its next resync (it reports a stopped machine, and a Cluster
    // replaces it). In process: no write to the Server.
    for r in results.iter().filter(|r| !r.succeeded) {
        if let Some(server) = ctx.stores.servers.get(&ObjectRef::new(&r.server).within(namespace)) {
            look_at_machine(ctx, &tctx.servers, &server);
        }
    }
    if deleting {
        if done {
            tctx.runs.forget(&key);
            return Ok(Action::await_change());
        }
        return Err(Error::InProgress(format!(
            "removing {} from {}",
            ts.spec.service,
            crate::text::count(desired.servers.len(), "server")
        ))
        .at(Step::Cleanup));
    }
    Ok(match requeue {
        Some(d) => Action::requeue(crate::time::jittered(d)),
        None => Action::await_change(),
    })
}

/// Under Manual approval (the TaskServ's own, else its Workspace's), holds the plan's install
/// and remove runs until approved ([`approval`]); a stale approval is ignored with a
/// PlanStale Warning, an approval coming into force with an `Approved` Event (both returned,
/// for the visit's report). Records the approval in force in `status.approvedPlan`.
fn gate_on_approval(
    ts: &TaskServ,
    namespace: &str,
    ctx: &Context,
    previous: &TaskServStatus,
    desired: &mut TaskServStatus,
    launch: &mut Vec<(String, plan::Operation)>,
    taskserv_plan: &provisioning_crds::Plan,
) -> Vec<Note> {
    let approval = crate::approval::approval_of(ts.spec.approval, ctx.workspace_for(namespace).spec.approval);
    let annotation = ts.annotations().get(provisioning_crds::ANNOTATION_APPROVE).map(String::as_str);
    let (gate, kept) = approval::gate_kept(approval, annotation, taskserv_plan, previous.approved_plan.as_ref());
    desired.approved_plan = kept;
    if !gate.goes() {
        approval::hold(desired, previous, launch, taskserv_plan);
    }
    let approved = crate::approval::newly_approved(previous.approved_plan.as_ref(), desired.approved_plan.as_ref());
    crate::approval::stale(&gate, taskserv_plan).into_iter().chain(approved.map(crate::approval::approved)).collect()
}

/// Script runs in flight in the whole controller. Each holds at most about 2.4 MiB of what
/// its machine printed: two 128 KiB captures (up to 3x once decoded lossily), 256 KiB of
/// streamed lines (up to about 4x once secrets are redacted) and two results (an install's is
/// kept while its check runs) of at most 1024 values (about 640 bytes each at worst) — so this, not anything a tenant sets (Clusters'
/// `parallelLimit`), bounds that memory.
const MAX_SCRIPT_RUNS: u32 = 64;
/// Script runs in flight per namespace: a tenant whose scripts sleep until their timeout
/// holds at most a quarter of the controller's runs.
const MAX_SCRIPT_RUNS_PER_NAMESPACE: u32 = 16;
// Checked when built: the runs' output together stays well inside the controller's 512 MiB,
// and one namespace takes at most a quarter of the runs.
const _: () = {
    use provisioning_providers::output::{CAPTURE_CAP, RUN_STREAM_CAP};
    let per_run = 2 * 3 * CAPTURE_CAP as u64 + 4 * RUN_STREAM_CAP + 2 * 640 * provisioning_taskservs::RESULT_NODES as u64;
    assert!(MAX_SCRIPT_RUNS as u64 * per_run <= 192 << 20);
    assert!(MAX_SCRIPT_RUNS_PER_NAMESPACE * 4 <= MAX_SCRIPT_RUNS);
};

/// The semaphore bounding this TaskServ's script runs: its Cluster's `parallelLimit`, or the
/// workspace's for a standalone TaskServ.
#[derive(Clone, Debug)]
struct Bound {
    key: String,
    limit: u32,
}

async fn bound(ts: &TaskServ, namespace: &str, ctx: &Context) -> Bound {
    if let Some(cluster) = ts.labels().get(LABEL_CLUSTER) {
        // Read through the bounded decoder, as the watches are: a Cluster too large to decode
        // is not held here either (it is reported Undecodable by its own watch).
        let api: Api<crate::decode::Tolerant<Cluster>> = Api::namespaced(ctx.client.clone(), namespace);
        if let Ok(Some(crate::decode::Tolerant::Decoded(c))) = api.get_opt(cluster).await {
            return Bound { key: format!("cluster/{namespace}/{cluster}"), limit: c.spec.parallel_limit };
        }
    }
    let ws = ctx.workspace_for(namespace);
    Bound { key: format!("{}/scripts", ws.key()), limit: ws.spec.limits.parallel_limit }
}

#[allow(clippy::too_many_arguments)]
fn start_run(
    ts: &Arc<TaskServ>,
    server: &str,
    operation: Operation,
    servers: &Arc<[ServerFacts]>,
    selected: &BTreeSet<String>,
    valid: Option<&ValidTaskServ>,
    limit: &Bound,
    tctx: &TaskServContext,
) {
    let key = key(ts);
    if !tctx.runs.start(&key, server, &operation) {
        return;
    }
    let ts = ts.clone();
    let servers = servers.clone();
    let selected = selected.clone();
    // One copy per TaskServ pass, shared by its runs (the config itself is shared).
    let valid = valid.cloned().map(std::sync::Arc::new);
    let ctx = tctx.ctx.clone();
    let catalog = tctx.catalog.clone();
    let runs = tctx.runs.clone();
    let limit = limit.clone();
    let trigger = tctx.trigger.clone();
    let server_trigger = tctx.servers.clone();
    let server = server.to_string();
    // Sharded: the run counts as in flight in its namespace, so a hand-over waits for it.
    let held = ctx.shard.as_ref().map(|shard| shard.hold(ts.namespace().as_deref().unwrap_or_default()));
    tokio::spawn(async move {
        let _held = held;
        let object = ObjectRef::from_obj(ts.as_ref());
        // A template error may quote a rendered value: filter it like script output.
        let redact = |message: String| valid.as_ref().map(|v| v.redactor.redact(&message)).unwrap_or(message);
        let backoff_key = format!("{key}/{server}/prepare");
        // The permits come before the run is prepared (its context, rendered templates and
        // stdin are copies of the config): the TaskServ's (Cluster or workspace) share, then
        // the namespace's and the controller's (always in this order, so no run waits for one
        // while holding a later one). They are given back before any backoff.
        let namespace = ts.namespace().unwrap_or_default();
        let permit = ctx.permit(&limit.key, limit.limit).await;
        let namespace_permit = ctx.permit(&format!("scripts-of-namespace/{namespace}"), MAX_SCRIPT_RUNS_PER_NAMESPACE).await;
        let global_permit = ctx.permit("scripts-of-controller", MAX_SCRIPT_RUNS).await;
        let permits = (permit, namespace_permit, global_permit);
        let prepared = prepare(&ts, &server, &operation, &servers, &selected, valid.as_deref(), &ctx, &catalog).await;
        let result = match prepared.map_err(|e| (e.retry(), e)) {
            Ok(request) => {
                ctx.backoffs.reset(&backoff_key);
                let _permits = permits;
                let result = act::run_operation(&request).await;
                request_host_key_record(&ctx, &server_trigger, &request.executor, &server, ts.namespace().as_deref().unwrap_or_default());
                result
            }
            Err((Retry::Transient(class), error)) => {
                drop(permits);
                // Not a failed install: hold the server's slot for the backoff (so no reconcile
                // starts the run again sooner), then free it and reconcile, which starts the run
                // again with the inputs of that moment.
                let delay = ctx.backoffs.next_delay(&backoff_key, class);
                tracing::warn!(
                    taskserv = %object,
                    server = %server,
                    script = operation.script(),
                    retry_in_ms = delay.as_millis() as u64,
                    error = %redact(error.to_string()),
                    "could not prepare the script run; retrying"
                );
                tokio::time::sleep(delay).await;
                runs.release(&key, &server);
                trigger.send(object);
                return;
            }
            Err((Retry::Wait, error)) => {
                drop(permits);
                // A peer still being created (no address yet): nothing ran, nothing failed.
                // Hold the slot briefly, then reconcile with the Servers of that moment.
                tracing::info!(taskserv = %object, server = %server, script = operation.script(), "{error}");
                ctx.backoffs.reset(&backoff_key);
                tokio::time::sleep(WAIT_FOR_ADDRESS).await;
                runs.release(&key, &server);
                trigger.send(object);
                return;
            }
            Err((Retry::Permanent, error)) => {
                ctx.backoffs.reset(&backoff_key);
                act::failed_to_start(&server, &operation, redact(error.to_string()))
            }
        };
        audit_run(&ctx, &ts, &result);
        finished(&ctx, &object, &ts.spec.service, &runs, &key, result);
        trigger.send(object);
    });
}

/// Appends a finished run to the audit log (identities, script, exit code, duration, outcome;
/// the message is already redacted).
fn audit_run(ctx: &Context, ts: &TaskServ, result: &plan::OperationResult) {
    let at = |t: &Option<String>| t.as_deref().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    let duration = match (at(&result.run.started_at), at(&result.run.finished_at)) {
        (Some(start), Some(end)) => (end - start).to_std().unwrap_or_default(),
        _ => std::time::Duration::ZERO,
    };
    let action = crate::audit::Action::ScriptRun {
        service: ts.spec.service.clone(),
        server: result.server.clone(),
        script: result.operation.script().to_string(),
        exit_code: result.run.exit_code,
    };
    let (outcome, message) = if result.succeeded { ("ok", None) } else { ("failed", Some(result.message.clone())) };
    let object = crate::audit::AuditObject {
        kind: KIND.to_string(),
        namespace: ts.namespace().unwrap_or_default(),
        name: ts.name_any(),
        generation: ts.metadata.generation,
    };
    ctx.audit.record(crate::audit::Entry::now(action, duration, outcome, message).about(object));
}

/// Logs and counts a finished run and parks its result for the next reconcile.
fn finished(ctx: &Context, object: &ObjectRef<TaskServ>, service: &str, runs: &ScriptRuns, key: &str, result: plan::OperationResult) {
    tracing::info!(taskserv = %object, server = %result.server, script = result.operation.script(), succeeded = result.succeeded, "{}", result.message);
    let outcome = if result.succeeded { "ok" } else { "failed" };
    ctx.metrics.script_runs.get_or_create(&crate::metrics::ScriptLabels { service: service.to_string(), outcome: outcome.into() }).inc();
    runs.finish(key, result);
}

/// After a script ran over SSH, the provider holds the machine's host key (pinned on first
/// contact): have the Server reconcile now, so that its status records the key.
fn request_host_key_record(ctx: &Context, servers: &Trigger<Server>, executor: &ProviderExecutor, server: &str, namespace: &str) {
    let Some(server_obj) = ctx.stores.servers.get(&ObjectRef::new(server).within(namespace)) else { return };
    let status = server_obj.status.clone().unwrap_or_default();
    let unrecorded = status.host_key.is_none() && status.provider_id.as_deref() == Some(executor.id.0.as_str());
    if unrecorded && executor.provider.pinned_host_key(&executor.id).is_some() {
        servers.send(ObjectRef::from_obj(server_obj.as_ref()));
    }
}

/// Has the Server reconciler look at `server`'s machine now: its last observation is
/// forgotten (else a recent one would be reused) and the Server is queued in process. No API
/// write: the user's `reconcile-requested-at` annotation is left to the user.
fn look_at_machine(ctx: &Context, servers: &Trigger<Server>, server: &Server) {
    ctx.forget_observed(&server.uid().unwrap_or_default());
    servers.send(ObjectRef::from_obj(server));
}

/// Why a script run could not be prepared (before any script ran).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The Server the run is for is not in the cache.
    #[error("Server {0} not found")]
    ServerNotFound(String),
    /// The Server has no machine yet.
    #[error("Server {0} has no providerID yet")]
    NoMachine(String),
    /// An input is wrong: an unknown provider account, a changed host key, a template that
    /// does not render. The message says which.
    #[error("{0}")]
    Invalid(String),
    /// The templates do not render because a selected peer that is still being created has
    /// no address yet (etcd's member list): waited for, not a failed install.
    #[error("waiting for the address of {}", crate::text::named("Server", .0))]
    WaitingForAddress(Vec<String>),
    /// A call failed: the API (reading the credentials or the SSH key Secret), or building
    /// the provider. Retried or not by the error's class.
    #[error("{0}")]
    Call(#[from] Error),
}

/// How a failed preparation is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// May pass by itself (an API 5xx or timeout, throttling): retried after the backoff of
    /// the class; nothing is recorded as failed.
    Transient(ErrorClass),
    /// Needs a change (missing input, wrong spec or environment): recorded as a failed run
    /// whose message is the clear condition the user sees.
    Permanent,
    /// Waiting for another object to get somewhere (a peer's address): tried again after
    /// [`WAIT_FOR_ADDRESS`], with no backoff growth and nothing recorded as failed.
    Wait,
}

/// Pause before a run that waits for a peer's address is prepared again.
pub const WAIT_FOR_ADDRESS: Duration = Duration::from_secs(2);

impl PrepareError {
    /// How this failure is handled.
    pub fn retry(&self) -> Retry {
        match self {
            PrepareError::ServerNotFound(_) | PrepareError::NoMachine(_) | PrepareError::Invalid(_) => Retry::Permanent,
            PrepareError::WaitingForAddress(_) => Retry::Wait,
            PrepareError::Call(e) => match e.class() {
                ErrorClass::Permanent | ErrorClass::NotFound | ErrorClass::Capacity => Retry::Permanent,
                class @ (ErrorClass::Transient | ErrorClass::Throttled { .. } | ErrorClass::InProgress) => Retry::Transient(class),
            },
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn prepare(
    ts: &TaskServ,
    server: &str,
    operation: &Operation,
    servers: &[ServerFacts],
    selected: &BTreeSet<String>,
    valid: Option<&ValidTaskServ>,
    ctx: &Context,
    catalog: &Catalog,
) -> Result<RunRequest, PrepareError> {
    let namespace = ts.namespace().unwrap_or_default();
    let missing = || PrepareError::ServerNotFound(server.to_string());
    let server_facts = servers.iter().find(|s| s.name == server).ok_or_else(missing)?;
    let server_obj = ctx.stores.servers.get(&ObjectRef::new(server).within(&namespace)).ok_or_else(missing)?;
    let server_status = server_obj.status.clone().unwrap_or_default();
    let provider_id = server_status.provider_id.clone().ok_or_else(|| PrepareError::NoMachine(server.to_string()))?;
    let ws = ctx.workspace_for(&namespace);
    let account_name = server_status.provider.clone().unwrap_or_else(|| server_obj.spec.provider.clone());
    let account = ws.account(&account_name).cloned().map_err(PrepareError::Invalid)?;
    // Reads the credentials Secret: an API failure there is a Call error, retried.
    let provider = ctx.provider_for(&ws, &account).await?;
    let provider_id = ProviderId(provider_id);
    let (ssh_key, paths) = if crate::server::ssh::uses_ssh(&account) {
        // Status is the host key checkpoint: a controller that lost its known-hosts file pins
        // the recorded key again before connecting (a changed key is refused, not re-pinned).
        let recorded = server_status.host_key.as_deref();
        crate::server::ssh::restore_pin(&provider, &provider_id, recorded).map_err(PrepareError::Invalid)?;
        let key = crate::server::ssh::server_key(&ctx.client, &server_obj).await?;
        let (nu, catalog_dir, _) = crate::server::ssh::remote_layout(&account);
        (key.map(|k| k.private), ScriptPaths { nu, catalog_dir })
    } else {
        (None, ScriptPaths::container())
    };
    let (version, previous, config, timeout) = match (operation, valid) {
        (Operation::Install { version, previous }, Some(v)) => (version.clone(), previous.clone(), v.config.clone(), v.timeout),
        (_, Some(v)) => (v.version.clone(), None, v.config.clone(), v.timeout),
        (_, None) => {
            // Removing an invalid TaskServ still runs remove.nu with what status says.
            let version = ts.status.as_ref().and_then(|s| s.installed_version.clone()).unwrap_or_default();
            (version, None, std::sync::Arc::new(ts.spec.config.clone().unwrap_or_default()), Duration::from_secs(600))
        }
    };
    // A removal never waits for an address: a peer with none that is not Ready has no machine
    // to be a member on (one awaiting approval, or going with its Cluster, may never get one),
    // so it is left out of the context instead of holding the removal (and the Cluster's
    // deletion) forever.
    let present: Vec<ServerFacts>;
    let servers = if *operation == Operation::Remove {
        present = servers.iter().filter(|s| s.name == server || s.ready || !s.addresses.is_empty()).cloned().collect();
        present.as_slice()
    } else {
        servers
    };
    let parts = dereference::context_parts(ts, server_facts, selected, servers, &ws, &version, previous);
    let context = ScriptContext {
        server: parts.server,
        peers: parts.peers,
        cluster: parts.cluster,
        workspace: parts.workspace,
        taskserv: parts.taskserv,
        // The run's own copy (rendered into templates and stdin), made after its permits.
        config: config.as_ref().clone(),
        templates: Default::default(),
    };
    let unaddressed = unaddressed_peers(&context, servers);
    let context = context.with_templates(catalog).map_err(|e| match unaddressed.is_empty() {
        true => PrepareError::Invalid(e.to_string()),
        false => PrepareError::WaitingForAddress(unaddressed),
    })?;
    let lock_file = match operation {
        Operation::Check => None,
        _ => Some(format!("/tmp/provisioning-{}.lock", ts.spec.service)),
    };
    Ok(RunRequest {
        redactor: valid.map(|v| v.redactor.clone()).unwrap_or_default(),
        inputs_hash: valid.and_then(|v| v.inputs_hash.clone()),
        object: ObjectRef::from_obj(ts),
        key: key(ts),
        server: server.to_string(),
        operation: operation.clone(),
        context,
        executor: ProviderExecutor {
            provider,
            id: provider_id,
            server_uid: server_obj.uid().unwrap_or_default(),
            lock_file,
            ssh_key,
            paths,
        },
        timeout,
    })
}

/// The servers of `context` (peers and the Cluster's servers) that have no address yet and
/// are not Ready: still being created. A template that fails to render while one exists
/// failed for want of its address (a member list of IPs): the run waits for it. A Ready
/// server without an address is not waited for (its provider reports none): the render
/// error is shown.
fn unaddressed_peers(context: &ScriptContext, servers: &[ServerFacts]) -> Vec<String> {
    let ready = |name: &str| servers.iter().any(|s| s.name == name && s.ready);
    let mut names: Vec<String> = context
        .peers
        .iter()
        .chain(&context.cluster.servers)
        .filter(|p| p.addresses.is_empty() && !ready(&p.name))
        .map(|p| p.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use provisioning_taskservs::{AddressInfo, PeerInfo};

    use super::*;

    fn api_error(code: u16) -> Error {
        Error::Kube(kube::Error::Api(kube::core::Status::failure("boom", "InternalError").with_code(code).boxed()))
    }

    #[test]
    fn a_transient_credentials_read_is_retried_not_a_failed_install() {
        // The credentials Secret read failing with a 5xx, a timeout, or being throttled.
        for e in [api_error(503), api_error(500), api_error(429)] {
            assert!(matches!(PrepareError::Call(e).retry(), Retry::Transient(_)));
        }
        let timeout = Error::Kube(kube::Error::Service(Box::new(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))));
        assert_eq!(PrepareError::Call(timeout).retry(), Retry::Transient(ErrorClass::Transient));
        let busy = Error::InProgress("waiting for a parallelLimit slot".into());
        assert_eq!(PrepareError::Call(busy).retry(), Retry::Transient(ErrorClass::InProgress));
    }

    #[test]
    fn missing_or_wrong_inputs_are_recorded_with_their_message() {
        let missing = Error::Stalled { reason: "CredentialsNotFound", message: "Secret team-a/creds does not exist".into() };
        let e = PrepareError::Call(missing);
        assert_eq!(e.retry(), Retry::Permanent);
        assert_eq!(e.to_string(), "Secret team-a/creds does not exist", "the message users saw before");
        assert_eq!(PrepareError::Call(api_error(403)).retry(), Retry::Permanent);
        assert_eq!(PrepareError::ServerNotFound("web-0".into()).retry(), Retry::Permanent);
        assert_eq!(PrepareError::ServerNotFound("web-0".into()).to_string(), "Server web-0 not found");
        assert_eq!(PrepareError::NoMachine("web-0".into()).to_string(), "Server web-0 has no providerID yet");
        assert_eq!(PrepareError::Invalid("host key changed".into()).retry(), Retry::Permanent);
    }

    fn peer(name: &str, address: Option<&str>) -> PeerInfo {
        let addresses = address.map(|a| vec![AddressInfo { kind: "InternalIP".into(), address: a.into() }]).unwrap_or_default();
        PeerInfo { name: name.into(), addresses, pool: "members".into() }
    }

    fn etcd_context(peers: Vec<PeerInfo>) -> ScriptContext {
        let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog loads");
        let config = catalog.validate_request("etcd", None, &serde_json::json!({})).expect("valid").config;
        ScriptContext {
            server: provisioning_taskservs::ServerInfo {
                name: "etcd-members-0".into(),
                addresses: vec![AddressInfo { kind: "InternalIP".into(), address: "10.0.0.10".into() }],
                ..Default::default()
            },
            peers,
            taskserv: provisioning_taskservs::TaskServInfo { name: "etcd".into(), service: "etcd".into(), ..Default::default() },
            config,
            ..Default::default()
        }
    }

    #[test]
    fn a_peer_being_created_without_an_address_is_waited_for_not_a_failed_install() {
        // Scaling 3 → 4: the new member exists, not Ready, no address yet.
        let peers = vec![peer("etcd-members-1", Some("10.0.0.11")), peer("etcd-members-3", None)];
        let context = etcd_context(peers);
        let servers = vec![ServerFacts { name: "etcd-members-3".into(), ready: false, ..Default::default() }];
        let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog loads");
        assert!(context.clone().with_templates(&catalog).is_err(), "etcd's member list needs every peer's IP");
        let waiting = unaddressed_peers(&context, &servers);
        assert_eq!(waiting, ["etcd-members-3"]);
        let e = PrepareError::WaitingForAddress(waiting);
        assert_eq!(e.retry(), Retry::Wait);
        assert_eq!(e.to_string(), "waiting for the address of Server etcd-members-3");
        // Once it has its address the templates render.
        let context = etcd_context(vec![peer("etcd-members-1", Some("10.0.0.11")), peer("etcd-members-3", Some("10.0.0.13"))]);
        assert!(unaddressed_peers(&context, &servers).is_empty());
        assert!(context.with_templates(&catalog).is_ok());
    }

    #[test]
    fn a_ready_peer_without_an_address_is_not_waited_for() {
        // Its provider reports no address: waiting would be forever; the render error shows.
        let context = etcd_context(vec![peer("etcd-members-3", None)]);
        let servers = vec![ServerFacts { name: "etcd-members-3".into(), ready: true, ..Default::default() }];
        assert!(unaddressed_peers(&context, &servers).is_empty());
    }
}
