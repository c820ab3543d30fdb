//! The Server reconciler: one machine at one provider.
//!
//! Pipeline per visit (after the shared opening of [`crate::reconcile`]: cache gate, stale
//! check, paused check, first finalizer and status) → finalizer (Apply / Cleanup) →
//! [`dereference`] (workspace, maxServers rank) → [`validate`] (pure: account, plan, limit)
//! → [`budget`] (cost from the price table; monthly budget before a create) → [`plan`] (pure: observe / adopt / find-then-create / create; `status.plan`) → approval gate
//! ([`spec`]: under Manual a create, a drift remediation or a spec change waits for
//! `provisioning.dev/approve`) → [`act`] (provider calls
//! under the workspace's parallelLimit) → [`drift`] when the observed machine is missing or
//! stopped (Drifted=True and a Warning written first, then remediated) → [`status`] (pure)
//! → one status patch, skipped when unchanged → requeue (poll while starting, long and
//! jittered when Ready).
//!
//! Concurrency choice: provider calls run inline in the reconcile, and the Controller runs
//! with unbounded concurrency (one reconcile per object at a time is still guaranteed by
//! kube-runtime). A reconcile waiting for a parallelLimit permit is a parked task, not a
//! blocked worker, so other objects and workspaces keep progressing; the semaphore, not the
//! worker count, bounds provider calls in flight.

pub mod act;
pub mod budget;
pub mod deleting;
pub mod dereference;
pub mod drift;
pub mod plan;
pub mod spec;
pub mod ssh;
pub mod status;
pub mod survey;
pub mod validate;

use std::collections::HashMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{Action, Config as ControllerSettings, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{ANNOTATION_CREATE_PENDING, Server, ServerStatus, Workspace, condition};
use provisioning_providers::{ProviderId, SharedProvider};

use crate::conditions::{self, Summary};
use crate::context::Context;
use crate::error::{AtStep, Error, ErrorClass, Step};
use crate::reconcile::{Reconciled, error_policy, reconcile};
use crate::sync::{CacheSync, cache};
use status::{Machine, StatusInput};

/// Kind name used in metrics and logs.
pub const KIND: &str = "Server";

impl Reconciled for Server {
    const KIND: &'static str = KIND;
    // Cleanup deletes the machine: a paused Server keeps it until resumed.
    const PAUSE_HOLDS_DELETION: bool = true;
    type Ctx = Context;

    fn core(ctx: &Context) -> &Context {
        ctx
    }

    fn api(&self, ctx: &Context) -> Api<Server> {
        api(self, ctx)
    }

    fn first_visit(&self) -> bool {
        self.status.as_ref().is_none_or(|s| s.conditions.is_empty())
    }

    async fn write_paused(&self, ctx: &Context) -> Result<(), Error> {
        let desired = status::desired(StatusInput {
            previous: self.status.as_ref(),
            generation: self.metadata.generation,
            provider: None,
            resolved_plan: None,
            machine: Machine::Unchanged,
            summary: None,
            paused: true,
            now: Timestamp::now(),
        });
        write_status(self, desired, ctx).await.map(drop)
    }

    async fn write_first_status(&self, ctx: &Context) -> Result<(), Error> {
        let desired = status::desired(StatusInput {
            previous: None,
            generation: self.metadata.generation,
            provider: None,
            resolved_plan: None,
            machine: Machine::None,
            summary: Some(Summary::Unknown { reason: "Initializing".into(), message: "reconciliation started".into() }),
            paused: false,
            now: Timestamp::now(),
        });
        write_status(self, desired, ctx).await.map(drop)
    }

    async fn apply(self: Arc<Self>, ctx: &Context) -> Result<Action, Error> {
        let namespace = self.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
        apply(self, &namespace, ctx).await
    }

    async fn cleanup(self: Arc<Self>, ctx: &Context) -> Result<Action, Error> {
        let namespace = self.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
        cleanup(self, &namespace, ctx).await
    }
}

/// The Server controller over its cache (managedFields dropped: at 10,000 Servers they are
/// most of its memory), marked synced in `synced` as [`cache::SERVERS`]. Its store is the
/// Server cache of [`crate::context::Stores`]; [`run`] runs it.
pub fn controller(client: &Client, synced: &CacheSync) -> Controller<Server> {
    let (reader, writer) = reflector::store::<Server>();
    let watch =
        watcher(Api::<Server>::all(client.clone()), watcher::Config::default().any_semantic()).modify(|s| s.managed_fields_mut().clear());
    let stream = synced.track(cache::SERVERS, reflector::reflector(writer, watch)).applied_objects();
    Controller::for_stream(stream, reader)
}

/// Runs the Server controller until `shutdown` resolves. Servers re-check when their
/// Workspace's spec or readiness changes (not on its count updates), and when `triggers`
/// names them (a credentials Secret changed, a TaskServ saw a script fail on the machine),
/// and when their machine changes outside the controller ([`drift::follow`] for providers with
/// machine events, the batched [`survey`] for the others).
pub async fn run(
    controller: Controller<Server>,
    ctx: Arc<Context>,
    triggers: UnboundedReceiver<ObjectRef<Server>>,
    settings: ControllerSettings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let server_store = ctx.stores.servers.clone();
    // Workspace name → (generation, Ready) last seen.
    let seen_workspaces: Mutex<HashMap<String, (Option<i64>, bool)>> = Mutex::default();
    // Workspace name → its cost total last seen: a change re-checks the Servers waiting for
    // budget (Servers deleted), and only those.
    let seen_costs: Mutex<HashMap<String, Option<String>>> = Mutex::default();
    // Machine events (drift) queue Servers beside the other kinds' triggers.
    let (drift_trigger, drift_triggers) = crate::reconcile::Trigger::<Server>::new();
    let follower = tokio::spawn(drift::follow(ctx.clone(), drift_trigger.clone()));
    let surveyor = tokio::spawn(survey::run(ctx.clone(), drift_trigger));
    controller
        .with_config(settings)
        .reconcile_on(futures::stream::select(triggers, drift_triggers))
        .watches(Api::<Workspace>::all(ctx.client.clone()), watcher::Config::default().any_semantic(), move |ws: Workspace| {
            let ready = ws.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, condition::READY));
            let fingerprint = (ws.metadata.generation, ready);
            let changed = {
                let mut seen = seen_workspaces.lock().unwrap_or_else(|p| p.into_inner());
                seen.insert(ws.name_any(), fingerprint) != Some(fingerprint)
            };
            let cost = ws.status.as_ref().and_then(|s| s.cost.as_ref()).map(|c| c.summary.clone());
            let cost_changed = {
                let mut seen = seen_costs.lock().unwrap_or_else(|p| p.into_inner());
                seen.insert(ws.name_any(), cost.clone()).is_some_and(|before| before != cost)
            };
            if !changed && !cost_changed {
                return vec![];
            }
            let namespace = crate::effective_workspace::claimed_namespace(&ws);
            server_store
                .state()
                .iter()
                .filter(|s| s.metadata.namespace.as_deref() == Some(namespace.as_str()))
                .filter(|s| changed || budget::waiting_for_budget(s))
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<Server>, error_policy::<Server>, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
    follower.abort();
    surveyor.abort();
}

/// One linear pipeline: dereference → validate and gates ([`prepare`]) → plan and approval →
/// act (and drift remediation, [`remediate_drift`]) → spec changes → host key → status
/// ([`finish`]). Each early exit records its step.
async fn apply(server: Arc<Server>, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let refs = dereference::dereference(&server, namespace, ctx);
    if dereference::workspace_cache_behind(&server, &refs, ctx).await.at(Step::Dereference)? {
        tracing::debug!("a Workspace claims the namespace but the cache has not seen it yet; waiting before any create");
        return Ok(Action::requeue(std::time::Duration::from_secs(1)));
    }
    let ws = &refs.workspace;
    let base = |summary: Option<Summary>, provider: Option<String>, plan: Option<String>, machine: Machine| {
        status::desired(StatusInput {
            previous: server.status.as_ref(),
            generation: server.metadata.generation,
            provider,
            resolved_plan: plan,
            machine,
            summary,
            paused: false,
            now: Timestamp::now(),
        })
    };
    let Prepared { provider, valid, cost, login_key } = match prepare(&server, &refs, &base, ctx).await {
        ControlFlow::Continue(prepared) => prepared,
        ControlFlow::Break(result) => return result,
    };
    let approval = plan::approval(&server, ws.spec.approval);
    let step = plan::next_step(&server);
    // A machine to make is a plan too: under Manual approval it waits like any other.
    let mut applied: Option<provisioning_crds::Plan> = None;
    if matches!(step, plan::Step::Create | plan::Step::FindThenCreate) {
        let planned = server_plan(&server, &valid, None, &provider).plan;
        if !spec::check(&server, approval, &planned, ctx).await {
            let waiting = base(Some(spec::waiting_summary(&planned)), Some(valid.account.name.clone()), None, Machine::Unchanged);
            return wait_for_approval(&server, waiting, &planned, &cost, ctx).await;
        }
        applied = Some(planned);
    }
    let acted = match act::act(&server, step, &valid, login_key.as_deref(), ws, &provider, ctx).await {
        Ok(a) => a,
        Err(e) => return fail(&server, Step::Act, e, Some(valid.account.name.clone()), base, ctx).await,
    };
    // Drift: recorded (Drifted=True, one Warning per drift) before it is remediated.
    let (acted, drift) = match acted {
        act::Acted::Drifted(drift) => {
            let gates = Gates { approval, cost: &cost, login_key: login_key.as_deref(), ws, provider: &provider };
            match remediate_drift(&server, drift, &valid, &gates, &base, ctx).await {
                ControlFlow::Continue((acted, drift, remedy)) => {
                    applied = Some(remedy);
                    (acted, Some(drift))
                }
                ControlFlow::Break(result) => return result,
            }
        }
        acted => (acted, None),
    };
    let machine = match acted {
        act::Acted::Drifted(_) | act::Acted::Unchanged => Machine::Unchanged,
        act::Acted::Machine(obs) => Machine::Observed(obs),
        act::Acted::ExternalMissing(id) => {
            let message = format!("machine {id} named by spec.externalID does not exist at provider account {:?}", valid.account.name);
            return stall(&server, Step::Act, "ExternalNotFound", message, base, ctx).await;
        }
        act::Acted::AdoptionRefused(refused) => {
            return stall(&server, Step::Act, refused.reason, refused.message, base, ctx).await;
        }
    };
    // Spec changes (plan, zone, image) planned against the machine just observed; carried
    // out in place or by replacement, refused by updatePolicy, or waiting for approval.
    let (machine, spec_applied) =
        match spec_change(&server, &valid, approval, machine, login_key.as_deref(), ws, &provider, &cost, &base, ctx).await {
            Ok(SpecChange::Proceed(proceed)) => *proceed,
            Ok(SpecChange::Done(action)) => return Ok(action),
            Err(SpecError::Refused(refused)) => {
                let (plan, reason, message, cost) = *refused;
                let with_plan = |s, a, p, m| {
                    status::record_cost(spec::record(base(s, a, p, m), server.status.as_ref(), &plan, None, Timestamp::now()), &cost)
                };
                return stall(&server, Step::Act, reason, message, with_plan, ctx).await;
            }
            Err(SpecError::Failed(e)) => return fail(&server, Step::Act, e, Some(valid.account.name.clone()), base, ctx).await,
        };
    let applied = spec_applied.or(applied);
    let host_key = match host_key(&server, &machine, &valid, &provider, &base, ctx).await {
        ControlFlow::Continue(key) => key,
        ControlFlow::Break(result) => return result,
    };
    let desired = status::record_host_key(
        base(None, Some(valid.account.name.clone()), Some(valid.resolved_plan.clone()), machine),
        host_key.as_deref(),
    );
    finish(&server, desired, Outcome { valid: &valid, provider: &provider, cost, applied, drift }, ctx).await
}

/// What validation and the gates before any action established.
struct Prepared {
    provider: SharedProvider,
    valid: validate::ValidServer,
    cost: provisioning_crds::ServerCost,
    login_key: Option<String>,
}

/// Validate (pure) → the account's provider → limits → cost and the monthly budget → the
/// Server's own SSH key: a failure stalls (or fails) before any machine is made.
async fn prepare<F>(server: &Server, refs: &dereference::Refs, base: &F, ctx: &Context) -> ControlFlow<Result<Action, Error>, Prepared>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    let ws = &refs.workspace;
    // Validate (pure) — failures stall without any provider call.
    let account = match validate::account(
        &server.spec,
        ws,
        server.status.as_ref().filter(|s| s.provider_id.is_some()).and_then(|s| s.provider.as_deref()),
    ) {
        Ok(a) => a,
        Err(invalid) => return ControlFlow::Break(stall(server, Step::Validate, invalid.reason, invalid.message, base, ctx).await),
    };
    let provider = match ctx.provider_for(ws, &account).await {
        Ok(p) => p,
        Err(e) => return ControlFlow::Break(fail(server, Step::Dereference, e, Some(account.name.clone()), base, ctx).await),
    };
    let valid = match validate::validate(&server.spec, ws, account, |plan| {
        provider.resolve_plan(plan).map_err(|e| match e {
            provisioning_providers::ProviderError::InvalidRequest(m) => m,
            other => other.to_string(),
        })
    }) {
        Ok(v) => v,
        Err(invalid) => return ControlFlow::Break(stall(server, Step::Validate, invalid.reason, invalid.message, base, ctx).await),
    };
    if let Err(invalid) = validate::within_limit(refs.rank, ws) {
        return ControlFlow::Break(stall(server, Step::Validate, invalid.reason, invalid.message, base, ctx).await);
    }
    // Cost, and the monthly budget before any machine is made (see budget).
    let cost = match budget::gate(server, ws, &valid, &provider, ctx).await {
        Ok(cost) => cost,
        Err((invalid, cost)) => {
            let with_cost = |s, a, p, m| status::record_cost(base(s, a, p, m), &cost);
            return ControlFlow::Break(stall(server, Step::Validate, invalid.reason, invalid.message, with_cost, ctx).await);
        }
    };
    // Dereference the Server's own SSH key (spec.sshKeySecretRef): a missing Secret or key
    // stalls, naming both, before any machine is made with the wrong key.
    let login_key = if ssh::uses_ssh(&valid.account) {
        match ssh::server_key(&ctx.client, server).await {
            Ok(key) => key.map(|k| k.public),
            Err(Error::Stalled { reason, message }) => {
                return ControlFlow::Break(stall(server, Step::Dereference, reason, message, base, ctx).await);
            }
            Err(e) => return ControlFlow::Break(fail(server, Step::Dereference, e, Some(valid.account.name.clone()), base, ctx).await),
        }
    } else {
        None
    };
    ControlFlow::Continue(Prepared { provider, valid, cost, login_key })
}

/// What acting on a machine needs besides the Server and its validated spec.
struct Gates<'a> {
    approval: provisioning_crds::Approval,
    cost: &'a provisioning_crds::ServerCost,
    login_key: Option<&'a str>,
    ws: &'a crate::effective_workspace::EffectiveWorkspace,
    provider: &'a SharedProvider,
}

/// A drifted machine: under Manual approval its remediation is a plan that waits like any
/// other; otherwise the drift is written first (the checkpoint: Drifted=True is on record
/// before the remediation starts), its Warning published, and the machine remediated.
/// Continues with the result, the drift and the plan carried out.
async fn remediate_drift<F>(
    server: &Arc<Server>,
    drift: drift::Drift,
    valid: &validate::ValidServer,
    gates: &Gates<'_>,
    base: &F,
    ctx: &Context,
) -> ControlFlow<Result<Action, Error>, (act::Acted, drift::Drift, provisioning_crds::Plan)>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    // Under Manual approval, remediation is a plan that waits like any other.
    let stopped = drift.reason == drift::MACHINE_STOPPED;
    let remedy = plan::drift_plan(server, &drift.machine, stopped, &drift.message, valid).plan;
    if !spec::check(server, gates.approval, &remedy, ctx).await {
        if drift::warning_due(server, &drift) {
            ctx.publish(server.as_ref(), EventType::Warning, drift.reason, "Remediate", Some(drift.message.clone())).await;
        }
        let waiting = base(Some(spec::waiting_summary(&remedy)), None, None, Machine::Observed(drift.observation()));
        let waiting = drift::record(waiting, server.status.as_ref(), &drift::Found::Drifted(drift.clone()), Timestamp::now());
        return ControlFlow::Break(wait_for_approval(server, waiting, &remedy, gates.cost, ctx).await);
    }
    let machine = Machine::Observed(drift.observation());
    let drifted = base(Some(Summary::progressing(drift.reason, drift.message.clone())), None, None, machine);
    let drifted = drift::record(drifted, server.status.as_ref(), &drift::Found::Drifted(drift.clone()), Timestamp::now());
    if let Err(e) = write_status(server, drifted, ctx).await.at(Step::Status) {
        return ControlFlow::Break(Err(e));
    }
    if drift::warning_due(server, &drift) {
        ctx.publish(server.as_ref(), EventType::Warning, drift.reason, "Remediate", Some(drift.message.clone())).await;
    }
    match act::remediate(server, &drift, valid, gates.login_key, gates.ws, gates.provider, ctx).await {
        Ok(acted) => ControlFlow::Continue((acted, drift, remedy)),
        Err(e) => ControlFlow::Break(fail(server, Step::Act, e, Some(valid.account.name.clone()), base, ctx).await),
    }
}

/// The SSH host key: restored into the provider from status when it lost it (a new
/// controller pod), recorded into status after the first contact. Never re-pinned.
async fn host_key<F>(
    server: &Server,
    machine: &Machine,
    valid: &validate::ValidServer,
    provider: &SharedProvider,
    base: &F,
    ctx: &Context,
) -> ControlFlow<Result<Action, Error>, Option<String>>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    let machine_id = match machine {
        Machine::Observed(obs) => Some(obs.provider_id.clone()),
        _ => server.status.as_ref().and_then(|s| s.provider_id.clone()).map(ProviderId),
    };
    match &machine_id {
        Some(id) if ssh::uses_ssh(&valid.account) => {
            // A generated key (the Server's own Secret) wins over status, which any status
            // writer could have set.
            let generated = match ssh::generated_host_key(&ctx.client, server).await {
                Ok(key) => key.map(|k| k.public),
                Err(Error::Stalled { reason, message }) => {
                    return ControlFlow::Break(stall(server, Step::Act, reason, message, base, ctx).await);
                }
                Err(e) => return ControlFlow::Break(fail(server, Step::Act, e, Some(valid.account.name.clone()), base, ctx).await),
            };
            match act::host_key(server, id, provider, generated.as_deref()) {
                Ok(key) => ControlFlow::Continue(key),
                Err(message) => ControlFlow::Break(stall(server, Step::Act, "HostKeyMismatch", message, base, ctx).await),
            }
        }
        _ => ControlFlow::Continue(None),
    }
}

/// What the reconcile carried out, for the final status.
struct Outcome<'a> {
    valid: &'a validate::ValidServer,
    provider: &'a SharedProvider,
    cost: provisioning_crds::ServerCost,
    applied: Option<provisioning_crds::Plan>,
    drift: Option<drift::Drift>,
}

/// The final status (cost of the machine as observed, what the spec would still change, a
/// remediated drift), written once; then the create-pending guard goes and Ready is announced.
async fn finish(server: &Server, desired: ServerStatus, done: Outcome<'_>, ctx: &Context) -> Result<Action, Error> {
    let Outcome { valid, provider, cost, applied, drift } = done;
    // An adopted or observed machine may run another plan than the spec's: price that one.
    let cost = match desired.resolved_plan.as_deref() {
        Some(plan) if plan != valid.resolved_plan => crate::cost::server_cost(&provider.price(plan, &valid.zone)),
        _ => cost,
    };
    let desired = status::record_cost(desired, &cost);
    let desired = status::record_machine_spec(desired, server.status.as_ref(), &valid.zone, &valid.image);
    // What the spec would still change (normally nothing, once carried out).
    let remaining = server_plan(server, valid, Some(&desired), provider);
    let desired = spec::record(desired, server.status.as_ref(), &remaining.plan, applied.as_ref(), Timestamp::now());
    let desired = match (drift, &desired.provider_id) {
        (Some(drift), Some(now_id)) => {
            let found = drift::Found::Remediated(drift, ProviderId(now_id.clone()));
            drift::record(desired.clone(), server.status.as_ref(), &found, Timestamp::now())
        }
        _ => desired,
    };
    let ready = conditions::is_true(&desired.conditions, condition::READY);
    let was_ready = server.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, condition::READY));
    let message = conditions::find(&desired.conditions, condition::READY).map(|c| c.message.clone());
    let has_id = desired.provider_id.is_some();
    write_status(server, desired, ctx).await.at(Step::Status)?;
    if has_id && server.annotations().contains_key(ANNOTATION_CREATE_PENDING) {
        // The result is recorded: the guard can go.
        ctx.set_annotation(server, ANNOTATION_CREATE_PENDING, None).await.at(Step::Status)?;
    }
    if ready && !was_ready {
        ctx.publish(server, EventType::Normal, "Ready", "Provision", message).await;
    }
    Ok(if ready { Action::requeue(crate::time::jittered(ctx.config.resync())) } else { Action::requeue(ctx.config.poll()) })
}

/// Writes `waiting` (the status of a plan waiting for approval) with the plan and cost, and
/// looks again at the next resync (the approve annotation's watch event comes first).
async fn wait_for_approval(
    server: &Server,
    waiting: ServerStatus,
    plan: &provisioning_crds::Plan,
    cost: &provisioning_crds::ServerCost,
    ctx: &Context,
) -> Result<Action, Error> {
    let waiting = spec::waiting(spec::record(status::record_cost(waiting, cost), server.status.as_ref(), plan, None, Timestamp::now()));
    write_status(server, waiting, ctx).await.at(Step::Status)?;
    Ok(Action::requeue(crate::time::jittered(ctx.config.resync())))
}

/// The cost of the machine as `observed` (its native plan may differ from the spec's).
fn machine_cost(
    observed: &ServerStatus,
    valid: &validate::ValidServer,
    provider: &SharedProvider,
    spec_cost: &provisioning_crds::ServerCost,
) -> provisioning_crds::ServerCost {
    match observed.resolved_plan.as_deref() {
        Some(plan) if plan != valid.resolved_plan => crate::cost::server_cost(&provider.price(plan, &valid.zone)),
        _ => spec_cost.clone(),
    }
}

/// Condition reason: spec.updatePolicy forbids what a spec change needs.
pub const UPDATE_REFUSED: &str = "UpdateRefused";

/// The Server's plan against `observed` (None: before any machine), from the provider's
/// capabilities and price table (no API call).
fn server_plan(
    server: &Server,
    valid: &validate::ValidServer,
    observed: Option<&ServerStatus>,
    provider: &SharedProvider,
) -> plan::ServerPlan {
    plan::spec_plan(server, valid, observed, |f| provider.in_place(f), |a, b| provider.same_plan(a, b), |p, z| provider.price(p, z))
}

/// How a spec change ended for the rest of the reconcile.
enum SpecChange {
    /// Go on with this machine; the plan carried out, if any.
    Proceed(Box<(Machine, Option<provisioning_crds::Plan>)>),
    /// The reconcile ends here (waiting for approval).
    Done(Action),
}

/// Why a spec change could not go on.
enum SpecError {
    /// updatePolicy or the budget forbids it: the plan, the reason (UpdateRefused,
    /// BudgetExceeded…), the message naming the field or figures, the machine's cost.
    Refused(Box<(provisioning_crds::Plan, &'static str, String, provisioning_crds::ServerCost)>),
    /// A provider or API call failed.
    Failed(Error),
}

impl From<Error> for SpecError {
    fn from(e: Error) -> Self {
        SpecError::Failed(e)
    }
}

/// Plans plan/zone/image changes against the machine just observed and carries them out:
/// `Drifted=True` (SpecChanged) and `status.plan` written first, with one Warning per plan;
/// then refused (updatePolicy), kept waiting (Manual approval), or applied in place or by
/// replacement.
#[allow(clippy::too_many_arguments)]
async fn spec_change<F>(
    server: &Server,
    valid: &validate::ValidServer,
    approval: provisioning_crds::Approval,
    machine: Machine,
    login_key: Option<&str>,
    ws: &crate::effective_workspace::EffectiveWorkspace,
    provider: &SharedProvider,
    cost: &provisioning_crds::ServerCost,
    base: &F,
    ctx: &Context,
) -> Result<SpecChange, SpecError>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    let observed = base(None, Some(valid.account.name.clone()), Some(valid.resolved_plan.clone()), machine.clone());
    let observed = status::record_machine_spec(observed, server.status.as_ref(), &valid.zone, &valid.image);
    let Some(id) = observed.provider_id.clone().map(ProviderId) else { return Ok(SpecChange::Proceed(Box::new((machine, None)))) };
    let planned = server_plan(server, valid, Some(&observed), provider);
    let carry = planned.carry.clone();
    if matches!(carry, plan::Carry::Nothing | plan::Carry::Create) {
        return Ok(SpecChange::Proceed(Box::new((machine, None))));
    }
    let plan = planned.plan;
    // Until the change is carried out the machine costs what its observed plan costs.
    let cost = &machine_cost(&observed, valid, provider, cost);
    if spec::warning_due(server, &plan) {
        let note = format!("Server {}: {}", plan::resource(server), spec::describe(&plan));
        ctx.publish(server, EventType::Warning, drift::SPEC_CHANGED, "Plan", Some(note)).await;
    }
    if let plan::Carry::Refused(message) = carry {
        return Err(SpecError::Refused(Box::new((plan, UPDATE_REFUSED, message, cost.clone()))));
    }
    // A change that raises the price is held to the monthly budget, as a new machine is.
    let after = crate::cost::server_cost(&provider.price(&valid.resolved_plan, &valid.zone));
    let others: Vec<Arc<Server>> =
        ctx.stores.servers.state().into_iter().filter(|s| s.metadata.namespace == server.metadata.namespace).collect();
    if let budget::Verdict::Refused(invalid) =
        budget::check_change(server, cost, &after, ws.spec.limits.monthly_budget.as_ref(), &others, &ws.display())
    {
        return Err(SpecError::Refused(Box::new((plan, invalid.reason, invalid.message, cost.clone()))));
    }
    if !spec::check(server, approval, &plan, ctx).await {
        let waiting = base(Some(spec::waiting_summary(&plan)), Some(valid.account.name.clone()), None, machine);
        let waiting = status::record_machine_spec(waiting, server.status.as_ref(), &valid.zone, &valid.image);
        let waiting =
            spec::waiting(spec::record(status::record_cost(waiting, cost), server.status.as_ref(), &plan, None, Timestamp::now()));
        write_status(server, waiting, ctx).await.at(Step::Status)?;
        return Ok(SpecChange::Done(Action::requeue(crate::time::jittered(ctx.config.resync()))));
    }
    // Recorded before the machine is touched: a crash mid-change leaves Drifted=True.
    let changing = base(Some(Summary::progressing(drift::SPEC_CHANGED, spec::describe(&plan))), None, None, machine);
    let changing = status::record_machine_spec(changing, server.status.as_ref(), &valid.zone, &valid.image);
    write_status(server, spec::record(changing, server.status.as_ref(), &plan, None, Timestamp::now()), ctx).await.at(Step::Status)?;
    let obs = match carry {
        plan::Carry::Update => act::update(server, &id, valid, ws, provider, ctx).await?,
        _ => match act::replace(server, &id, valid, login_key, ws, provider, ctx).await? {
            act::Acted::Machine(obs) => obs,
            other => return Err(SpecError::Failed(Error::InProgress(format!("replacing machine {id}: {other:?}")))),
        },
    };
    Ok(SpecChange::Proceed(Box::new((Machine::Observed(obs), Some(plan)))))
}

async fn cleanup(server: Arc<Server>, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let step = plan::cleanup_step(&server);
    if step == plan::CleanupStep::Nothing {
        if server.spec.effective_deletion_policy() == provisioning_crds::DeletionPolicy::Orphan {
            let id = server.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
            ctx.publish(
                server.as_ref(),
                EventType::Normal,
                "Orphaned",
                "DeleteMachine",
                Some(format!("deletionPolicy Orphan: machine {id} left running")),
            )
            .await;
        }
        ctx.forget_observed(&server.uid().unwrap_or_default());
        ctx.forget_written(server.as_ref());
        return Ok(Action::await_change());
    }
    // Never Ready/Running while the machine is being deleted (issue 25): written whenever the
    // Server outlives this pass (in progress, failed, or held by someone else's finalizer); not
    // before a delete that finishes at once (that write would bring the object back for a
    // second cleanup).
    let id = server.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    let marked = deleting::deleting(
        server.status.as_ref(),
        server.metadata.generation,
        format!("deleting machine {id} at its provider"),
        Timestamp::now(),
    );
    match delete_machine(&server, step, namespace, ctx).await {
        Ok(()) => {
            let held_by_others = server.finalizers().iter().any(|f| f != provisioning_crds::FINALIZER);
            if held_by_others {
                write_status(&server, marked, ctx).await?;
            }
            ctx.forget_observed(&server.uid().unwrap_or_default());
            ctx.forget_written(server.as_ref());
            Ok(Action::await_change())
        }
        Err(e) => {
            if e.class() != ErrorClass::InProgress {
                ctx.publish(server.as_ref(), EventType::Warning, e.category(), "DeleteMachine", Some(e.to_string())).await;
            }
            write_status(&server, marked, ctx).await?;
            Err(e)
        }
    }
}

/// Deletes the Server's machine with the account it was made with.
async fn delete_machine(server: &Server, step: plan::CleanupStep, namespace: &str, ctx: &Context) -> Result<(), Error> {
    let ws = ctx.workspace_for(namespace);
    // The account the machine was made with (status), else what the spec names now.
    let account_name = server.status.as_ref().and_then(|s| s.provider.clone()).unwrap_or_else(|| server.spec.provider.clone());
    let account = ws.account(&account_name).cloned().map_err(|message| Error::Stalled { reason: "UnknownProvider", message })?;
    let provider = ctx.provider_for(&ws, &account).await.at(Step::Dereference)?;
    act::cleanup(server, step, &account.name, &ws, &provider, ctx).await
}

/// The Server API of the object's namespace.
pub fn api(server: &Server, ctx: &Context) -> Api<Server> {
    Api::namespaced(ctx.client.clone(), server.metadata.namespace.as_deref().unwrap_or("default"))
}

async fn write_status(server: &Server, desired: ServerStatus, ctx: &Context) -> Result<bool, Error> {
    ctx.apply_status(server, server.status.as_ref(), &desired).await
}

/// Writes Stalled with `message`, emits a Warning on the flip, and returns the error that
/// makes `error_policy` back off (30 s doubling to 10 min): no retry storm.
async fn stall<F>(server: &Server, step: Step, reason: &'static str, message: String, base: F, ctx: &Context) -> Result<Action, Error>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    let desired = base(Some(Summary::stalled(reason, message.clone())), None, None, Machine::Unchanged);
    let was_stalled = server.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, condition::STALLED));
    write_status(server, desired, ctx).await.at(Step::Status)?;
    if !was_stalled {
        ctx.publish(server, EventType::Warning, reason, "Validate", Some(message.clone())).await;
    }
    Err(Error::Stalled { reason, message }.at(step))
}

/// Records a failed step in status (Stalled for permanent errors, Reconciling otherwise),
/// emits a Warning event carrying the error, and returns it for backoff.
async fn fail<F>(server: &Server, step: Step, error: Error, account: Option<String>, base: F, ctx: &Context) -> Result<Action, Error>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    if error.class() == ErrorClass::InProgress {
        // Queued behind the workspace's parallelLimit: not a failure, nothing to record.
        return Err(error.at(step));
    }
    let message = error.to_string();
    let summary = match error.class() {
        ErrorClass::Permanent => Summary::stalled(error.category(), message.clone()),
        _ => Summary::progressing(error.category(), message.clone()),
    };
    let desired = base(Some(summary), account, None, Machine::Unchanged);
    write_status(server, desired, ctx).await.at(Step::Status)?;
    ctx.publish(server, EventType::Warning, error.category(), "Provision", Some(message)).await;
    Err(error.at(step))
}
