//! Plan (pure): a Cluster's desired children, the step plan and the next actions.
//!
//! Pools become Servers named `<cluster>-<pool>-<index>`; services (with their dependency
//! closure) become TaskServs named `<cluster>-<service>`; both carry the cluster and pool
//! labels and a controller ownerReference. The rollout is a list of steps — one per pool
//! (`servers/<pool>`), then one per service in install order (`taskserv/<service>`) — whose
//! state and times live in `status.steps`: that list is the checkpoint a restarted controller
//! resumes from (everything in it is re-derived from the children it finds, so resuming never
//! repeats a finished step). `parallelLimit` bounds how many of the cluster's Servers are
//! being brought up at once. Deleting the Cluster tears down in reverse dependency order.
//!
//! [`plan`] runs named pure steps over typed states ([`StepState`], [`StepKind`], [`Phase`];
//! the same strings on the wire as ever): [`steps`] plans the pools, the services, scale-down
//! and the remediation of dead members; [`summary`] applies `failurePolicy` and derives
//! conditions (through [`crate::conditions::Summary`]), phase, events and requeue. [`plan_teardown`]
//! (in [`teardown`]) plans deletion.

mod changes;
mod model;
mod steps;
mod summary;
mod teardown;

pub use changes::{DEFAULT_SHOWN, cluster_plan, with_endpoint};
pub use model::*;
pub use teardown::plan_teardown;

/// Plans one reconcile of a Cluster that is not being deleted.
pub fn plan(o: &Observed<'_>) -> Plan {
    let services = match o.services {
        Ok(s) => s,
        Err(e) => return summary::invalid(o, e),
    };
    let mut plan = empty_plan(o, None);
    let mut r = steps::Rollout::start(o);
    r.pools(o, &mut plan);
    r.services(o, services, &mut plan);
    r.scale_down(o, services, &mut plan);
    r.remediate(o, &mut plan);
    summary::summarize(o, services, r, plan)
}
