//! Plan (pure): desired vs observed → the next script runs and the new status.
//!
//! Per server the state machine is `Pending → Installing → Installed` (or `Failed`, retried
//! after a pause), `Installed + unhealthy → Installing` (re-install), and for a server that
//! left the selection `→ Removing → (entry dropped)`. Script runs happen in background tasks;
//! their results come back here as [`OperationResult`]s. Status is the checkpoint: an entry in
//! `Installing` with no run in flight (the controller restarted) is simply run again — the
//! scripts are idempotent and the runner holds a per-service lock on the server.
//!
//! [`plan`] runs named pure steps over typed states ([`ServerPhase`] per server, [`Phase`] for
//! the object; the same strings on the wire as ever): [`record`] folds finished runs into
//! status, [`servers`] decides the runs per selected server and drains deselected ones, and
//! [`summary`] derives conditions (through [`crate::conditions::Summary`]), phase, events and requeue.
//! [`plan_removal`] (in [`removal`]) plans deletion.

mod changes;
mod model;
mod record;
mod removal;
mod servers;
mod summary;

pub use changes::taskserv_plan;
pub use model::*;
pub use removal::plan_removal;

/// Plans one reconcile of a TaskServ that is not being deleted.
pub fn plan(o: &Observed<'_>) -> Plan {
    let mut work = Work {
        entries: o.status.servers.iter().map(|s| (s.name.clone(), s.clone())).collect(),
        events: Vec::new(),
        launch: Vec::new(),
        upgrade_failure: summary::upgrade_failure(o),
        rollback_now: false,
    };
    record::record_results(o, &mut work);
    let (inputs_hash, install_inputs) = servers::mark_changed_for_reinstall(o, &mut work.entries);
    let selected = selected_servers(o.spec, o.servers);
    let valid = o.validated.as_ref().ok();
    let blocking = match valid {
        Some(v) => blockers(o.name, o.spec, &v.dependencies, &selected, o.taskservs),
        None => Vec::new(),
    };
    let effective_version: Option<String> = match (valid, &work.upgrade_failure) {
        (Some(_), Some(_)) if o.status.last_good_version.is_some() => o.status.last_good_version.clone(),
        (Some(v), _) => Some(v.version.clone()),
        (None, _) => None,
    };
    let waiting_servers = servers::plan_selected(o, &mut work, &selected, blocking.is_empty(), effective_version.as_deref());
    servers::drain_leaving(o, &mut work, &selected);
    summary::summarize(o, work, summary::Facts { selected, blocking, waiting_servers, effective_version, inputs_hash, install_inputs })
}
