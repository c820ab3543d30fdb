//! The Workspace reconciler: namespace, provider accounts, counts, cost.
//!
//! Pipeline: paused check → first-visit status → finalizer (Apply / Cleanup) → validate
//! (pure: namespace ownership) → act (ensure the namespace) → dereference (provider accounts,
//! counts and cost from caches) → status (pure) → one status patch when changed.

pub mod dereference;
pub mod secrets;
pub mod status;
pub mod validate;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, ResourceExt};
use provisioning_crds::{FINALIZER, Workspace, condition};

use crate::conditions;
use crate::context::{Context, is_paused};
use crate::error::Error;
use status::{AccountCheck, StatusInput};

/// Kind name used in metrics and logs.
pub const KIND: &str = "Workspace";

/// Label put on namespaces a Workspace created.
pub const LABEL_WORKSPACE: &str = "provisioning.dev/workspace";

/// Reconciles one Workspace.
pub async fn reconcile(ws: Arc<Workspace>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer(KIND);
    // Nothing acts on a cache that has not synced (a restarted controller would
    // otherwise resolve a Server to the default workspace: see crate::sync).
    ctx.caches_synced().await?;
    if ctx.is_stale(ws.as_ref()) {
        // The cache has not caught up with our last write; its watch event brings us back.
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    }
    let paused = is_paused(ws.as_ref());
    let added = if paused { false } else { ctx.add_first_finalizer(ws.as_ref()).await? };
    if paused || (ws.metadata.deletion_timestamp.is_none() && ws.status.as_ref().is_none_or(|s| s.conditions.is_empty())) {
        let desired = status::desired(StatusInput {
            previous: ws.status.as_ref(),
            generation: ws.metadata.generation,
            namespace: None,
            conflict: None,
            accounts: vec![],
            counts: None,
            paused,
            now: Timestamp::now(),
        });
        let desired = if paused {
            desired
        } else {
            // First visit: Unknown conditions.
            let mut d = desired;
            d.phase = Some("Pending".into());
            d.conditions = conditions::merge(
                &[],
                &conditions::Summary::Unknown { reason: "Initializing".into(), message: "reconciliation started".into() }.conditions(),
                ws.metadata.generation,
                Timestamp::now(),
            );
            d
        };
        ctx.apply_status(ws.as_ref(), ws.status.as_ref(), &desired).await?;
        if paused {
            return Ok(Action::await_change());
        }
    }
    if added {
        return Ok(Action::await_change());
    }
    let api: Api<Workspace> = Api::all(ctx.client.clone());
    let action = finalizer(&api, FINALIZER, ws.clone(), |event| async {
        match event {
            Finalizer::Apply(ws) => apply(ws, &ctx).await,
            Finalizer::Cleanup(ws) => {
                ctx.publish(ws.as_ref(), EventType::Normal, "Deleted", "Delete", Some("workspace released; its namespace is kept".into())).await;
                Ok(Action::await_change())
            }
        }
    })
    .await?;
    ctx.reset_backoff(KIND, ws.as_ref());
    Ok(action)
}

/// `error_policy` of the Workspace controller.
pub fn error_policy(ws: Arc<Workspace>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.backoff(KIND, ws.as_ref(), error)
}

async fn apply(ws: Arc<Workspace>, ctx: &Context) -> Result<Action, Error> {
    let all = ctx.stores.workspaces.state();
    let (namespace, conflict) = match validate::check_namespace(&ws, all.iter()) {
        Ok(ns) => (Some(ns), None),
        Err(conflict) => (None, Some(conflict.message())),
    };
    let (accounts, counts) = match &namespace {
        Some(ns) => {
            ensure_namespace(ns, &ws, ctx).await?;
            let effective = dereference::effective(&ws, ns, ctx);
            (dereference::check_accounts(&effective, ctx).await, Some(dereference::counts(ns, ctx)))
        }
        None => (vec![], None),
    };
    let retrying = accounts.iter().any(|(_, c)| matches!(c, AccountCheck::Retrying(_)));
    let cost = namespace.as_deref().map(|ns| crate::cost::namespace_total(ns, &ctx.stores.servers.state()));
    let desired = status::desired(StatusInput {
        previous: ws.status.as_ref(),
        generation: ws.metadata.generation,
        namespace,
        conflict: conflict.clone(),
        accounts,
        counts,
        paused: false,
        now: Timestamp::now(),
    });
    let desired = status::record_cost(desired, cost);
    let was = |t: &str| ws.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, t));
    let (was_ready, was_stalled) = (was(condition::READY), was(condition::STALLED));
    let ready = conditions::is_true(&desired.conditions, condition::READY);
    let stalled = conditions::find(&desired.conditions, condition::STALLED).filter(|c| c.status == "True").cloned();
    ctx.apply_status(ws.as_ref(), ws.status.as_ref(), &desired).await?;
    if ready && !was_ready {
        ctx.publish(ws.as_ref(), EventType::Normal, "Ready", "Reconcile", Some("workspace ready".into())).await;
    }
    if let Some(stalled) = stalled {
        if !was_stalled {
            ctx.publish(ws.as_ref(), EventType::Warning, &stalled.reason, "Reconcile", Some(stalled.message.clone())).await;
        }
        // Waits for a change of spec or Secret; backs off like any permanent error.
        return Err(Error::Stalled { reason: "WorkspaceStalled", message: stalled.message });
    }
    Ok(if retrying { Action::requeue(ctx.config.poll()) } else { Action::requeue(crate::error::jittered(ctx.config.resync())) })
}

async fn ensure_namespace(namespace: &str, ws: &Workspace, ctx: &Context) -> Result<(), Error> {
    // Checked once per resync interval, not on every count change.
    let memo_key = format!("namespace/{namespace}");
    if ctx.observed_recently(&memo_key, &ws.name_any(), ctx.config.resync()) {
        return Ok(());
    }
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    if api.get_opt(namespace).await?.is_some() {
        ctx.mark_observed(&memo_key, &ws.name_any());
        return Ok(());
    }
    let mut ns = Namespace::default();
    ns.metadata.name = Some(namespace.to_string());
    ns.metadata.labels = Some([(LABEL_WORKSPACE.to_string(), ws.name_any())].into());
    match api.create(&PostParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() }, &ns).await {
        Ok(_) => {
            ctx.metrics.record_write(KIND);
            ctx.publish(ws, EventType::Normal, "NamespaceCreated", "EnsureNamespace", Some(format!("created namespace {namespace}"))).await;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
