//! The Server reconciler: one machine at one provider.
//!
//! Pipeline per visit (after the shared opening of [`crate::reconcile`]: cache gate, stale
//! check, paused check, first finalizer and status) → finalizer (Apply / Cleanup) →
//! [`dereference`] (workspace, maxServers rank) → named steps over one [`visit::Visit`]:
//! [`prepare`] (validate (pure: account, plan, limit), provider, [`budget`], the Server's SSH
//! key) → [`plan`] (pure: observe / adopt / find-then-create / create; `status.plan`) →
//! [`approval`] (the shared gate, [`crate::approval`]: under Manual a create, a drift
//! remediation or a spec change waits for `provisioning.dev/approve`) → [`act`] (provider
//! calls under the workspace's parallelLimit) → [`steps::remediate_drift`] when the observed
//! machine is missing or stopped → [`spec_change::carry`] → [`steps::host_key`] →
//! [`steps::finish`] (pure) → [`visit::Visit::conclude`]: one status patch (skipped when
//! unchanged), then the visit's events ([`crate::reconcile::report`]) → requeue (poll while
//! starting, long and jittered when Ready).
//!
//! Each step returns the next value or a [`visit::End`] (Stalled, Failed, Waiting, Done…);
//! no step writes status or publishes events itself (provider steps add their events to the
//! visit's, published with its report), except at the crash-safety checkpoints
//! ([`visit::Visit::checkpoint`] and [`visit::Visit::guard`], each commented where taken: the
//! finalizer with the `create-pending` annotation in one write before a first create — the
//! leak guard of DESIGN §1, so a create to Ready is three writes: finalizer and annotation,
//! the status recording the machine, the annotation cleared —, Drifted=True before a
//! remediation, the spec change before the machine is touched) and the create-pending
//! annotation set before a re-create (remediation, replacement; [`act`]) and cleared only after
//! the status records the machine. Until its first provider step a Server has no finalizer
//! ([`Reconciled::FINALIZER_BEFORE_FIRST_ACTION`]): deleting one that waits for approval,
//! quota or a valid spec has nothing to clean up.
//!
//! Concurrency choice: provider calls run inline in the reconcile, and the Controller runs
//! with unbounded concurrency (one reconcile per object at a time is still guaranteed by
//! kube-runtime). A reconcile waiting for a parallelLimit permit is a parked task, not a
//! blocked worker, so other objects and workspaces keep progressing; the semaphore, not the
//! worker count, bounds provider calls in flight.

pub mod act;
pub mod approval;
pub mod budget;
pub mod deleting;
pub mod dereference;
pub mod drift;
pub mod plan;
pub mod prepare;
pub mod spec_change;
pub mod ssh;
pub mod status;
pub mod steps;
pub mod survey;
pub mod validate;
pub mod visit;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{Action, Config as ControllerSettings, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{Server, ServerStatus, Workspace, condition};

use crate::conditions;
use crate::context::Context;
use crate::error::{AtStep, Error, ErrorClass, Step};
use crate::reconcile::{Note, Reconciled, error_policy, reconcile, report};
use crate::sync::{CacheSync, cache};
use status::{Machine, StatusInput};
use visit::{End, Visit};

/// Kind name used in metrics and logs.
pub const KIND: &str = "Server";

impl Reconciled for Server {
    const KIND: &'static str = KIND;
    // Cleanup deletes the machine: a paused Server keeps it until resumed.
    const PAUSE_HOLDS_DELETION: bool = true;
    // The visit writes the first status itself: whatever the visit comes to (Visit::conclude).
    const VISIT_WRITES_FIRST_STATUS: bool = true;
    // The finalizer goes on with create-pending right before the first create (Visit::guard).
    const FINALIZER_BEFORE_FIRST_ACTION: bool = true;
    type Status = ServerStatus;
    type Ctx = Context;

    fn core(ctx: &Context) -> &Context {
        ctx
    }

    fn api(&self, ctx: &Context) -> Api<Server> {
        api(self, ctx)
    }

    fn status(&self) -> Option<&ServerStatus> {
        self.status.as_ref()
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
            summary: Some(status::initializing()),
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
/// Sharded, only the Servers of `scope` (selected server-side by the shard label).
pub fn controller(client: &Client, synced: &CacheSync, scope: &crate::shard::Scope) -> Controller<Server> {
    let (reader, writer) = reflector::store::<Server>();
    let watch = crate::decode::watch::<Server>(client, scope.config().any_semantic()).modify(|s| s.managed_fields_mut().clear());
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
    // Decoded one by one (crate::decode): one undecodable Workspace is reported, not fatal.
    let workspaces = crate::decode::touched::<Workspace>(&ctx.client, watcher::Config::default().any_semantic());
    controller
        .with_config(settings)
        .reconcile_on(futures::stream::select(triggers, drift_triggers))
        .watches_stream(workspaces, move |ws: Workspace| {
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

/// One visit: dereference → the named steps ([`steps`]) over the visit value → one status
/// write and the events ([`Visit::conclude`]).
async fn apply(server: Arc<Server>, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let refs = dereference::dereference(&server, namespace, ctx);
    // An approval that does not count (crate::approval::authorize) is not seen by the gate.
    let ws = &refs.workspace.spec;
    let approval = plan::approval(&server, ws.approval);
    let (server, refused) = crate::approval::authorize::screen(server, "servers", approval, ws.require_distinct_approver, &[], ctx)
        .await
        .map_err(|e| e.at(Step::Dereference))?;
    let mut visit = Visit::new(&server);
    visit.events.extend(refused);
    let end = match run_steps(&mut visit, &refs, ctx).await {
        Ok(end) | Err(end) => end,
    };
    visit.conclude(end, ctx).await
}

/// Whether another Server (by uid, in any namespace: the controller's cache sees them all)
/// records machine `id` in its status. Its name is not told: it may be another tenant's.
fn adopted_elsewhere(server: &Server, id: &provisioning_providers::ProviderId, ctx: &Context) -> bool {
    let uid = server.uid().unwrap_or_default();
    ctx.stores.servers.state().iter().any(|other| {
        other.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(id.0.as_str()) && other.uid().unwrap_or_default() != uid
    })
}

/// observe → plan (pure) → decide (approval) → act, each step ending the visit early with an
/// [`End`]: prepare ([`prepare`]) → approval of a machine to make → act → drift remediation
/// → spec changes ([`spec_change::carry`]) → host key → the final status.
async fn run_steps(visit: &mut Visit<'_>, refs: &dereference::Refs, ctx: &Context) -> Result<End, End> {
    let server = visit.server;
    if dereference::workspace_cache_behind(server, refs, ctx).await.map_err(|e| End::Broken(e.at(Step::Dereference)))? {
        tracing::debug!("a Workspace claims the namespace but the cache has not seen it yet; waiting before any create");
        return Ok(End::Requeue(Action::requeue(std::time::Duration::from_secs(1))));
    }
    let ws = &refs.workspace;
    let p = prepare::prepare(visit, refs, ctx).await?;
    let account = Some(p.valid.account.name.as_str());
    let approval = plan::approval(server, ws.spec.approval);
    let step = plan::next_step(server);
    if let plan::Step::Adopt(id) = &step
        && adopted_elsewhere(server, id, ctx)
    {
        // One Server per machine: `adoptable` lets the machine's owner hand it over once, not
        // every tenant sharing the account (or the Docker engine) take it over again.
        let message =
            format!("refusing to adopt machine {id} (spec.externalID): another Server already records it. Nothing was changed or deleted");
        return Err(End::stalled(Step::Act, "AdoptionRefused", message));
    }
    let mut applied = steps::gate_create(visit, &p, &step, approval)?;
    if matches!(step, plan::Step::Create | plan::Step::FindThenCreate) && !p.valid.fallback_zones.is_empty() {
        visit.zone_asked = Some((p.valid.zone.clone(), p.valid.allowed_zones()));
    }
    if step == plan::Step::Create {
        ctx.admit(ws).map_err(|e| End::failed(Step::Act, e, account))?;
        // Checkpoint (leak guard, DESIGN §1): the finalizer and `create-pending` in one write
        // before the create call, so a crash mid-call leads to a lookup by owner tag, not a
        // second machine, and a deletion waits for (and finds) the machine.
        visit.guard(true, ctx).await?;
    } else {
        // Checkpoint: the finalizer before a machine is adopted or observed (only missing on
        // a Server whose visits never reached a create; no-op otherwise).
        visit.guard(false, ctx).await?;
    }
    let acted = act::act(server, step, &p, ws, ctx, &mut visit.events).await.map_err(|e| End::failed(Step::Act, e, account))?;
    let (acted, drift) = match acted {
        act::Acted::Drifted(drift) => {
            let (acted, remedy) = steps::remediate_drift(visit, &drift, &p, approval, ws, ctx).await?;
            applied = Some(remedy);
            (acted, Some(drift))
        }
        acted => (acted, None),
    };
    // What acting learned: an adopted machine that is missing or may not be adopted stalls.
    let machine = match acted {
        act::Acted::Drifted(_) | act::Acted::Unchanged => Machine::Unchanged,
        act::Acted::Machine(obs) => Machine::Observed(obs),
        act::Acted::ExternalMissing(id) => {
            let message = format!("machine {id} named by spec.externalID does not exist at provider account {:?}", p.valid.account.name);
            return Err(End::stalled(Step::Act, "ExternalNotFound", message));
        }
        act::Acted::AdoptionRefused(refused) => return Err(End::stalled(Step::Act, refused.reason, refused.message)),
    };
    let (machine, spec_applied) = spec_change::carry(visit, &p, approval, machine, ws, ctx).await?;
    let host_key = steps::host_key(visit, &machine, &p, ctx).await?;
    let outcome = steps::Outcome { machine, host_key, applied: spec_applied.or(applied), drift };
    Ok(End::Done(Box::new(steps::finish(visit, &p, outcome))))
}

/// Deleting: the machine goes (or is left, deletionPolicy Orphan), then one report: the
/// Deleting status when the Server outlives this pass, then the events.
async fn cleanup(server: Arc<Server>, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let step = plan::cleanup_step(&server);
    let mut events = Vec::new();
    let id = server.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    // An adopted machine another Server also records (two adoptions raced past the check in
    // `run_steps`) is left alone: deleting it would destroy the other Server's machine.
    let shared = !server.spec.external_id.is_empty()
        && !id.is_empty()
        && adopted_elsewhere(&server, &provisioning_providers::ProviderId(id.clone()), ctx);
    let deleted = if shared {
        events.push(Note::warning(
            "MachineShared",
            "DeleteMachine",
            format!("machine {id} is also recorded by another Server: left running"),
        ));
        Ok(false)
    } else if step == plan::CleanupStep::Nothing {
        if server.spec.effective_deletion_policy() == provisioning_crds::DeletionPolicy::Orphan {
            events.push(Note::normal("Orphaned", "DeleteMachine", format!("deletionPolicy Orphan: machine {id} left running")));
        }
        Ok(false)
    } else {
        delete_machine(&server, step, namespace, &mut events, ctx).await.map(|()| true)
    };
    // Never Ready/Running while the machine is being deleted (issue 25): written whenever the
    // Server outlives this pass (in progress, failed, or held by someone else's finalizer); not
    // before a delete that finishes at once (that write would bring the object back for a
    // second cleanup).
    let outlives = match &deleted {
        Ok(deleting) => *deleting && server.finalizers().iter().any(|f| f != provisioning_crds::FINALIZER),
        Err(e) => {
            if e.class() != ErrorClass::InProgress {
                events.push(Note::warning(e.category(), "DeleteMachine", e.to_string()));
            }
            true
        }
    };
    let marked = outlives.then(|| {
        let message = format!("deleting machine {id} at its provider");
        deleting::deleting(server.status.as_ref(), server.metadata.generation, message, Timestamp::now())
    });
    report(server.as_ref(), server.status.as_ref(), marked.as_ref(), events, ctx).await?;
    deleted?;
    ctx.forget_observed(&server.uid().unwrap_or_default());
    ctx.forget_written(server.as_ref());
    Ok(Action::await_change())
}

/// Deletes the Server's machine with the account it was made with.
async fn delete_machine(
    server: &Server,
    step: plan::CleanupStep,
    namespace: &str,
    events: &mut Vec<Note>,
    ctx: &Context,
) -> Result<(), Error> {
    let ws = ctx.workspace_for(namespace);
    // The account the machine was made with (status), else what the spec names now.
    let account_name = server.status.as_ref().and_then(|s| s.provider.clone()).unwrap_or_else(|| server.spec.provider.clone());
    let account = ws.account(&account_name).cloned().map_err(|message| Error::Stalled { reason: "UnknownProvider", message })?;
    let provider = ctx.provider_for(&ws, &account).await.at(Step::Dereference)?;
    act::cleanup(server, step, &account.name, &ws, &provider, ctx, events).await
}

/// The Server API of the object's namespace.
pub fn api(server: &Server, ctx: &Context) -> Api<Server> {
    Api::namespaced(ctx.client.clone(), server.metadata.namespace.as_deref().unwrap_or("default"))
}

async fn write_status(server: &Server, desired: ServerStatus, ctx: &Context) -> Result<bool, Error> {
    ctx.apply_status(server, server.status.as_ref(), &desired).await
}
