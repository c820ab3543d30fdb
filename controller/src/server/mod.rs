//! The Server reconciler: one machine at one provider.
//!
//! Pipeline per visit: paused check → first-visit status → finalizer (Apply / Cleanup) →
//! [`dereference`] (workspace, maxServers rank) → [`validate`] (pure: account, plan, limit)
//! → [`budget`] (cost from the price table; monthly budget before a create) → [`plan`] (pure: observe / adopt / find-then-create / create) → [`act`] (provider calls
//! under the workspace's parallelLimit) → [`status`] (pure) → one status patch, skipped
//! when unchanged → requeue (poll while starting, long and jittered when Ready).
//!
//! Concurrency choice: provider calls run inline in the reconcile, and the Controller runs
//! with unbounded concurrency (one reconcile per object at a time is still guaranteed by
//! kube-runtime). A reconcile waiting for a parallelLimit permit is a parked task, not a
//! blocked worker, so other objects and workspaces keep progressing; the semaphore, not the
//! worker count, bounds provider calls in flight.

pub mod act;
pub mod budget;
pub mod dereference;
pub mod plan;
pub mod ssh;
pub mod status;
pub mod validate;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, ResourceExt};
use provisioning_crds::{ANNOTATION_CREATE_PENDING, FINALIZER, Server, ServerStatus, condition};
use provisioning_providers::ProviderId;

use crate::conditions::{self, Summary};
use crate::context::{Context, is_paused};
use crate::error::{Error, ErrorClass};
use status::{Machine, StatusInput};

/// Kind name used in metrics and logs.
pub const KIND: &str = "Server";

/// Reconciles one Server.
pub async fn reconcile(server: Arc<Server>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer(KIND);
    // Nothing acts on a cache that has not synced (a restarted controller would
    // otherwise resolve a Server to the default workspace: see crate::sync).
    ctx.caches_synced().await?;
    if ctx.is_stale(server.as_ref()) {
        // The cache has not caught up with our last write; its watch event brings us back.
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    }
    let namespace = server.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    if is_paused(server.as_ref()) {
        let desired = status::desired(StatusInput {
            previous: server.status.as_ref(),
            generation: server.metadata.generation,
            provider: None,
            resolved_plan: None,
            machine: Machine::Unchanged,
            summary: None,
            paused: true,
            now: Timestamp::now(),
        });
        write_status(&server, desired, &ctx).await?;
        ctx.reset_backoff(KIND, server.as_ref());
        return Ok(Action::await_change());
    }
    let api: Api<Server> = Api::namespaced(ctx.client.clone(), &namespace);
    // Finalizer first (its patch is guarded by resourceVersion), then the first status.
    let added = ctx.add_first_finalizer(server.as_ref()).await?;
    if server.metadata.deletion_timestamp.is_none() && server.status.as_ref().is_none_or(|s| s.conditions.is_empty()) {
        // First visit: conditions start as Unknown, never absent.
        let desired = status::desired(StatusInput {
            previous: None,
            generation: server.metadata.generation,
            provider: None,
            resolved_plan: None,
            machine: Machine::None,
            summary: Some(Summary::Unknown { reason: "Initializing".into(), message: "reconciliation started".into() }),
            paused: false,
            now: Timestamp::now(),
        });
        write_status(&server, desired, &ctx).await?;
    }
    if added {
        return Ok(Action::await_change());
    }
    let action = finalizer(&api, FINALIZER, server.clone(), |event| async {
        match event {
            Finalizer::Apply(server) => apply(server, &namespace, &ctx).await,
            Finalizer::Cleanup(server) => cleanup(server, &namespace, &ctx).await,
        }
    })
    .await?;
    ctx.reset_backoff(KIND, server.as_ref());
    Ok(action)
}

/// `error_policy` of the Server controller: per-object jittered backoff by error class.
pub fn error_policy(server: Arc<Server>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.backoff(KIND, server.as_ref(), error)
}

async fn apply(server: Arc<Server>, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let refs = dereference::dereference(&server, namespace, ctx);
    if dereference::workspace_cache_behind(&server, &refs, ctx).await? {
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
    // Validate (pure) — failures stall without any provider call.
    let account = match validate::account(
        &server.spec,
        ws,
        server.status.as_ref().filter(|s| s.provider_id.is_some()).and_then(|s| s.provider.as_deref()),
    ) {
        Ok(a) => a,
        Err(invalid) => return stall(&server, invalid.reason, invalid.message, base, ctx).await,
    };
    let provider = match ctx.provider_for(ws, &account).await {
        Ok(p) => p,
        Err(e) => return fail(&server, e, Some(account.name.clone()), base, ctx).await,
    };
    let valid = match validate::validate(&server.spec, ws, account, |plan| {
        provider.resolve_plan(plan).map_err(|e| match e {
            provisioning_providers::ProviderError::InvalidRequest(m) => m,
            other => other.to_string(),
        })
    }) {
        Ok(v) => v,
        Err(invalid) => return stall(&server, invalid.reason, invalid.message, base, ctx).await,
    };
    if let Err(invalid) = validate::within_limit(refs.rank, ws) {
        return stall(&server, invalid.reason, invalid.message, base, ctx).await;
    }
    // Cost, and the monthly budget before any machine is made (see budget).
    let cost = match budget::gate(&server, ws, &valid, &provider, ctx).await {
        Ok(cost) => cost,
        Err((invalid, cost)) => {
            let with_cost = |s, a, p, m| status::record_cost(base(s, a, p, m), &cost);
            return stall(&server, invalid.reason, invalid.message, with_cost, ctx).await;
        }
    };
    // Dereference the Server's own SSH key (spec.sshKeySecretRef): a missing Secret or key
    // stalls, naming both, before any machine is made with the wrong key.
    let login_key = if ssh::uses_ssh(&valid.account) {
        match ssh::server_key(&ctx.client, &server).await {
            Ok(key) => key.map(|k| k.public),
            Err(Error::Stalled { reason, message }) => return stall(&server, reason, message, base, ctx).await,
            Err(e) => return fail(&server, e, Some(valid.account.name.clone()), base, ctx).await,
        }
    } else {
        None
    };
    let step = plan::next_step(&server);
    let acted = match act::act(&server, step, &valid, login_key.as_deref(), ws, &provider, ctx).await {
        Ok(a) => a,
        Err(e) => return fail(&server, e, Some(valid.account.name.clone()), base, ctx).await,
    };
    let machine = match acted {
        act::Acted::Unchanged => Machine::Unchanged,
        act::Acted::Machine(obs) => Machine::Observed(obs),
        act::Acted::ExternalMissing(id) => {
            let message = format!("machine {id} named by spec.externalID does not exist at provider account {:?}", valid.account.name);
            return stall(&server, "ExternalNotFound", message, base, ctx).await;
        }
        act::Acted::AdoptionRefused(refused) => return stall(&server, refused.reason, refused.message, base, ctx).await,
    };
    // The SSH host key: restored into the provider from status when it lost it (a new
    // controller pod), recorded into status after the first contact. Never re-pinned.
    let machine_id = match &machine {
        Machine::Observed(obs) => Some(obs.provider_id.clone()),
        _ => server.status.as_ref().and_then(|s| s.provider_id.clone()).map(ProviderId),
    };
    let host_key = match &machine_id {
        Some(id) if ssh::uses_ssh(&valid.account) => {
            // A generated key (the Server's own Secret) wins over status, which any status
            // writer could have set.
            let generated = match ssh::generated_host_key(&ctx.client, &server).await {
                Ok(key) => key.map(|k| k.public),
                Err(Error::Stalled { reason, message }) => return stall(&server, reason, message, base, ctx).await,
                Err(e) => return fail(&server, e, Some(valid.account.name.clone()), base, ctx).await,
            };
            match act::host_key(&server, id, &provider, generated.as_deref()) {
                Ok(key) => key,
                Err(message) => return stall(&server, "HostKeyMismatch", message, base, ctx).await,
            }
        }
        _ => None,
    };
    let desired = status::record_host_key(
        base(None, Some(valid.account.name.clone()), Some(valid.resolved_plan.clone()), machine),
        host_key.as_deref(),
    );
    // An adopted or observed machine may run another plan than the spec's: price that one.
    let cost = match desired.resolved_plan.as_deref() {
        Some(plan) if plan != valid.resolved_plan => crate::cost::server_cost(&provider.price(plan, &valid.zone)),
        _ => cost,
    };
    let desired = status::record_cost(desired, &cost);
    let ready = conditions::is_true(&desired.conditions, condition::READY);
    let was_ready = server.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, condition::READY));
    let message = conditions::find(&desired.conditions, condition::READY).map(|c| c.message.clone());
    let has_id = desired.provider_id.is_some();
    write_status(&server, desired, ctx).await?;
    if has_id && server.annotations().contains_key(ANNOTATION_CREATE_PENDING) {
        // The result is recorded: the guard can go.
        ctx.set_annotation(server.as_ref(), ANNOTATION_CREATE_PENDING, None).await?;
    }
    if ready && !was_ready {
        ctx.publish(server.as_ref(), EventType::Normal, "Ready", "Provision", message).await;
    }
    Ok(if ready { Action::requeue(crate::error::jittered(ctx.config.resync())) } else { Action::requeue(ctx.config.poll()) })
}

async fn cleanup(server: Arc<Server>, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let step = plan::cleanup_step(&server);
    if step == plan::CleanupStep::Nothing {
        if server.spec.effective_deletion_policy() == provisioning_crds::DeletionPolicy::Orphan {
            let id = server.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
            ctx.publish(server.as_ref(), EventType::Normal, "Orphaned", "DeleteMachine", Some(format!("deletionPolicy Orphan: machine {id} left running"))).await;
        }
        ctx.forget_observed(&server.uid().unwrap_or_default());
        ctx.forget_written(server.as_ref());
        return Ok(Action::await_change());
    }
    let ws = ctx.workspace_for(namespace);
    // The account the machine was made with (status), else what the spec names now.
    let account_name = server.status.as_ref().and_then(|s| s.provider.clone()).unwrap_or_else(|| server.spec.provider.clone());
    let account = ws.account(&account_name).cloned().map_err(|message| Error::Stalled { reason: "UnknownProvider", message })?;
    let provider = ctx.provider_for(&ws, &account).await?;
    match act::cleanup(&server, step, &account.name, &ws, &provider, ctx).await {
        Ok(()) => {
            ctx.forget_observed(&server.uid().unwrap_or_default());
            ctx.forget_written(server.as_ref());
            Ok(Action::await_change())
        }
        Err(e) => {
            if e.class() != ErrorClass::InProgress {
                ctx.publish(server.as_ref(), EventType::Warning, e.category(), "DeleteMachine", Some(e.to_string())).await;
            } else if server.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(status::phase::DELETING) {
                let mut desired = server.status.clone().unwrap_or_default();
                desired.phase = Some(status::phase::DELETING.to_string());
                write_status(&server, desired, ctx).await?;
            }
            Err(e)
        }
    }
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
async fn stall<F>(server: &Server, reason: &'static str, message: String, base: F, ctx: &Context) -> Result<Action, Error>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    let desired = base(Some(Summary::stalled(reason, message.clone())), None, None, Machine::Unchanged);
    let was_stalled = server.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, condition::STALLED));
    write_status(server, desired, ctx).await?;
    if !was_stalled {
        ctx.publish(server, EventType::Warning, reason, "Validate", Some(message.clone())).await;
    }
    Err(Error::Stalled { reason, message })
}

/// Records a failed step in status (Stalled for permanent errors, Reconciling otherwise),
/// emits a Warning event carrying the error, and returns it for backoff.
async fn fail<F>(server: &Server, error: Error, account: Option<String>, base: F, ctx: &Context) -> Result<Action, Error>
where
    F: Fn(Option<Summary>, Option<String>, Option<String>, Machine) -> ServerStatus,
{
    if error.class() == ErrorClass::InProgress {
        // Queued behind the workspace's parallelLimit: not a failure, nothing to record.
        return Err(error);
    }
    let message = error.to_string();
    let summary = match error.class() {
        ErrorClass::Permanent => Summary::stalled(error.category(), message.clone()),
        _ => Summary::progressing(error.category(), message.clone()),
    };
    let desired = base(Some(summary), account, None, Machine::Unchanged);
    write_status(server, desired, ctx).await?;
    ctx.publish(server, EventType::Warning, error.category(), "Provision", Some(message)).await;
    Err(error)
}
