//! The visit value of a Server reconcile: what the steps of one visit share (the Server, the
//! clock, the events to publish) and how a visit ends ([`End`]).
//!
//! Steps never write status or publish events themselves: they return the next value or an
//! [`End`], and [`Visit::conclude`] turns the end into the one status write and the events
//! ([`crate::reconcile::report`]). The only other writes are the crash-safety checkpoints
//! ([`Visit::checkpoint`]), each marked where it is taken: a record that must be on the API
//! server before a machine is touched.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use provisioning_crds::{ANNOTATION_CREATE_PENDING, Plan, Server, ServerCost, ServerStatus, condition};

use super::status::{self, Machine, StatusInput};
use crate::conditions::{self, Summary};
use crate::context::Context;
use crate::error::{AtStep, Error, ErrorClass, Step};
use crate::reconcile::{Note, report};

/// One visit of one Server.
pub struct Visit<'a> {
    /// The Server as this visit found it.
    pub server: &'a Server,
    /// The visit's clock.
    pub now: Timestamp,
    /// Events to publish once the status is written, in order.
    pub events: Vec<Note>,
    /// The status this visit's checkpoint wrote (what later statuses build on and are
    /// compared with); `None` before any.
    written: Option<ServerStatus>,
    /// Whether this visit wrote the `create-pending` annotation ([`Visit::guard`]), so the
    /// status recording the machine clears it.
    pending_written: bool,
    /// A create with `spec.fallbackZones` is asked in this visit: (the zone asked, the zones
    /// allowed in order), so a capacity failure records the zone in `status.zoneFallback`.
    pub zone_asked: Option<(String, Vec<String>)>,
}

/// How a visit ends.
#[derive(Debug)]
pub enum End {
    /// Carried out: the final status (Ready announced on the flip, the create-pending guard
    /// cleared once it records a machine).
    Done(Box<ServerStatus>),
    /// A plan waits for approval: this status (phase AwaitingApproval), looked at again at
    /// the next resync (the approve annotation's watch event comes first).
    Waiting(Box<ServerStatus>),
    /// Cannot progress without a change: Stalled with the reason and message (a Warning on
    /// the flip), the error that makes `error_policy` back off. `plan` and `cost` are
    /// recorded with it when known.
    Stalled {
        /// The failing step.
        step: Step,
        /// Condition and event reason.
        reason: &'static str,
        /// For humans, naming what is wrong.
        message: String,
        /// The plan that was refused.
        plan: Option<Box<Plan>>,
        /// The machine's cost.
        cost: Option<Box<ServerCost>>,
    },
    /// A step failed: Stalled for permanent errors, Reconciling otherwise, with a Warning;
    /// queued behind the workspace's parallelLimit (InProgress) records nothing.
    Failed {
        /// The failing step.
        step: Step,
        /// What failed.
        error: Error,
        /// The provider account, when resolved.
        account: Option<String>,
    },
    /// Nothing to record now: look again after this action.
    Requeue(Action),
    /// A checkpoint could not be written: nothing more is written or published.
    Broken(Error),
}

impl End {
    /// Stalled at `step`.
    pub fn stalled(step: Step, reason: &'static str, message: String) -> End {
        End::Stalled { step, reason, message, plan: None, cost: None }
    }

    /// Failed at `step` with the account `account`.
    pub fn failed(step: Step, error: Error, account: Option<&str>) -> End {
        End::Failed { step, error, account: account.map(str::to_string) }
    }
}

/// How long a visit's end waits before the next look: `resync` (jittered) when Ready or
/// waiting for approval, `poll` while the machine starts.
#[derive(Clone, Copy, Debug)]
pub struct Requeue {
    /// Long requeue.
    pub resync: Duration,
    /// Short requeue.
    pub poll: Duration,
}

impl<'a> Visit<'a> {
    /// A visit of `server`, now.
    pub fn new(server: &'a Server) -> Self {
        Visit { server, now: Timestamp::now(), events: Vec::new(), written: None, pending_written: false, zone_asked: None }
    }

    /// The status on record: what this visit's checkpoint wrote, else the Server's.
    pub fn recorded(&self) -> Option<&ServerStatus> {
        self.written.as_ref().or(self.server.status.as_ref())
    }

    /// The status as this visit learned it: [`status::desired`] over the status on record.
    pub fn status(&self, summary: Option<Summary>, provider: Option<String>, plan: Option<String>, machine: Machine) -> ServerStatus {
        // After this visit's create-pending write, a status that records no machine says a
        // create was started (Provisioned=False, reason Creating) like the annotation does.
        let machine = match machine {
            Machine::Unchanged | Machine::None if self.pending_written => Machine::Creating,
            machine => machine,
        };
        status::desired(StatusInput {
            previous: self.recorded(),
            generation: self.server.metadata.generation,
            provider,
            resolved_plan: plan,
            machine,
            summary,
            paused: false,
            now: self.now,
        })
    }

    /// A Warning to publish with this visit's report.
    pub fn warn(&mut self, reason: &str, action: &'static str, note: String) {
        self.events.push(Note::warning(reason, action, note));
    }

    /// Checkpoint (the leak guard of DESIGN §1): the finalizer and, before a create call, the
    /// `create-pending` annotation, in one metadata write guarded by resourceVersion, so a
    /// crash mid-call leads to a lookup by owner tag, not a second machine, and a deletion
    /// waits for that machine. Nothing happens when there is nothing to write. A stale copy
    /// (409) ends the visit with a short requeue; nothing after it runs.
    pub async fn guard(&mut self, create_pending: bool, ctx: &Context) -> Result<(), End> {
        let has_finalizer = self.server.finalizers().iter().any(|f| f == provisioning_crds::FINALIZER);
        if has_finalizer && !create_pending {
            return Ok(());
        }
        let now = self.now.to_string();
        let annotation = create_pending.then_some((ANNOTATION_CREATE_PENDING, now.as_str()));
        match ctx.finalizer_with_annotation(self.server, annotation).await {
            Ok(()) => {
                self.pending_written |= create_pending;
                Ok(())
            }
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => Err(End::Requeue(Action::requeue(std::time::Duration::from_secs(1)))),
            Err(e) => Err(End::Broken(e.at(Step::Finalizer))),
        }
    }

    /// Checkpoint: writes `status` now (and publishes the events so far), before the step
    /// that follows touches a machine. A failed write ends the visit ([`End::Broken`]).
    pub async fn checkpoint(&mut self, status: ServerStatus, ctx: &Context) -> Result<(), End> {
        let events = std::mem::take(&mut self.events);
        report(self.server, self.recorded(), Some(&status), events, ctx).await.map_err(End::Broken)?;
        self.written = Some(status);
        Ok(())
    }

    /// What `end` comes to (pure): the status to write (`None`: none), and the visit's result.
    /// Adds the end's own event (Ready on the flip, the Warning of a stall or failure).
    pub fn settle(&mut self, end: End, requeue: Requeue) -> (Option<ServerStatus>, Result<Action, Error>) {
        let server = self.server;
        let was = |c: &str| server.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, c));
        match end {
            End::Done(status) => {
                let ready = conditions::is_true(&status.conditions, condition::READY);
                if ready && !was(condition::READY) {
                    let message = conditions::find(&status.conditions, condition::READY).map(|c| c.message.clone());
                    self.events.push(Note::normal("Ready", "Provision", message.unwrap_or_default()));
                }
                let action = if ready { Action::requeue(crate::time::jittered(requeue.resync)) } else { Action::requeue(requeue.poll) };
                (Some(*status), Ok(action))
            }
            End::Waiting(status) => (Some(*status), Ok(Action::requeue(crate::time::jittered(requeue.resync)))),
            End::Stalled { step, reason, message, plan, cost } => {
                let mut status = self.status(Some(Summary::stalled(reason, message.clone())), None, None, Machine::Unchanged);
                if let Some(plan) = plan {
                    status = status::record_plan(status, server.status.as_ref(), &plan, None, self.now);
                }
                if let Some(cost) = cost {
                    status = status::record_cost(status, &cost);
                }
                if !was(condition::STALLED) {
                    self.warn(reason, "Validate", message.clone());
                }
                (Some(status), Err(Error::Stalled { reason, message }.at(step)))
            }
            // Queued behind the workspace's parallelLimit: not a failure, nothing to record.
            End::Failed { step, error, .. } if error.class() == ErrorClass::InProgress => (None, Err(error.at(step))),
            End::Failed { step, error, account } => {
                let message = error.to_string();
                let summary = match error.class() {
                    // A quota or a zone without capacity: Stalled, naming the limit and what
                    // was asked, looked at again on the slow schedule of ErrorClass::Capacity.
                    ErrorClass::Permanent | ErrorClass::Capacity => Summary::stalled(error.category(), message.clone()),
                    _ => Summary::progressing(error.category(), message.clone()),
                };
                let mut status = self.status(Some(summary), account, None, Machine::Unchanged);
                if error.category() == "InsufficientCapacity"
                    && status.provider_id.is_none()
                    && let Some((zone, allowed)) = &self.zone_asked
                {
                    // The next create tries the next allowed zone (validate::placement).
                    let round = super::validate::tried_zones(server).and(status.zone_fallback.as_ref());
                    status.zone_fallback = Some(status::no_capacity_in(round, zone, allowed, self.now));
                }
                self.warn(error.category(), "Provision", message);
                (Some(status), Err(error.at(step)))
            }
            End::Requeue(action) => (None, Ok(action)),
            End::Broken(error) => {
                self.events.clear();
                (None, Err(error))
            }
        }
    }

    /// The end of the visit: the one status write of what it came to, then its events
    /// ([`report`]); then the create-pending guard goes once a machine is recorded.
    pub async fn conclude(mut self, end: End, ctx: &Context) -> Result<Action, Error> {
        let done = matches!(&end, End::Done(s) if s.provider_id.is_some());
        let broken = matches!(&end, End::Broken(_));
        let requeue = Requeue { resync: ctx.config.resync(), poll: ctx.config.poll() };
        let (mut status, result) = self.settle(end, requeue);
        if status.is_none() && self.recorded().is_none() && !broken {
            // The first visit writes its status whatever it comes to (the skeleton leaves a
            // Server's first status to the visit): conditions start Unknown, never absent.
            status = Some(self.status(Some(status::initializing()), None, None, Machine::None));
        }
        if status.is_none() && self.events.is_empty() {
            return result;
        }
        let events = std::mem::take(&mut self.events);
        report(self.server, self.recorded(), status.as_ref(), events, ctx).await?;
        if done && (self.pending_written || self.server.annotations().contains_key(ANNOTATION_CREATE_PENDING)) {
            // Checkpoint order: the machine is recorded in status first, so the guard can go.
            ctx.set_annotation(self.server, ANNOTATION_CREATE_PENDING, None).await.at(Step::Status)?;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use provisioning_crds::{ChangeAction, PlannedChange};

    use super::*;

    const REQUEUE: Requeue = Requeue { resync: Duration::from_secs(600), poll: Duration::from_secs(5) };

    fn server() -> Server {
        crate::testing::server("team-a", "web-0", serde_json::json!({"provider": "sim", "plan": "small"}))
    }

    fn reasons(visit: &Visit<'_>) -> Vec<(bool, String)> {
        visit.events.iter().map(|e| (e.warning, e.reason.clone())).collect()
    }

    #[test]
    fn a_stall_records_its_plan_and_cost_and_warns_only_on_the_flip() {
        let s = server();
        let mut visit = Visit::new(&s);
        let plan = Plan {
            id: "abc".into(),
            summary: "1 to update".into(),
            changes: vec![PlannedChange {
                resource: "Server/team-a/web-0".into(),
                field: "spec.plan".into(),
                action: ChangeAction::Update,
                from: "small".into(),
                to: "large".into(),
                reason: String::new(),
            }],
            ..Default::default()
        };
        let cost = ServerCost { monthly: "10.00".into(), ..Default::default() };
        let end = End::Stalled {
            step: Step::Act,
            reason: "UpdateRefused",
            message: "updatePolicy forbids spec.plan".into(),
            plan: Some(Box::new(plan)),
            cost: Some(Box::new(cost.clone())),
        };
        let (status, result) = visit.settle(end, REQUEUE);
        let status = status.expect("a status to write");
        assert!(conditions::is_true(&status.conditions, condition::STALLED));
        assert_eq!((status.plan.as_ref().map(|p| p.id.as_str()), status.cost.as_ref()), (Some("abc"), Some(&cost)));
        let e = result.expect_err("stalled visits back off");
        assert_eq!((e.step(), e.to_string()), (Some(Step::Act), "updatePolicy forbids spec.plan".to_string()));
        assert_eq!(reasons(&visit), vec![(true, "UpdateRefused".to_string())]);
        // Already Stalled: the same status again, no second Warning.
        let mut stalled = server();
        stalled.status = Some(status);
        let mut again = Visit::new(&stalled);
        let _ = again.settle(End::stalled(Step::Validate, "UnknownPlan", "no plan".into()), REQUEUE);
        assert!(again.events.is_empty());
    }

    #[test]
    fn a_queued_step_records_nothing_and_a_broken_checkpoint_publishes_nothing() {
        let s = server();
        let mut visit = Visit::new(&s);
        visit.warn("SpecChanged", "Plan", "spec.plan small → large".into());
        let (status, result) = visit.settle(End::failed(Step::Act, Error::InProgress("queued".into()), Some("sim")), REQUEUE);
        assert!(status.is_none() && result.is_err());
        // Events found before the queue still go out with the report.
        assert_eq!(reasons(&visit), vec![(true, "SpecChanged".to_string())]);
        let (status, _) = visit.settle(End::Broken(Error::MissingField("metadata.name")), REQUEUE);
        assert!(status.is_none() && visit.events.is_empty(), "a failed checkpoint publishes nothing");
        let (status, _) = visit.settle(End::failed(Step::Act, Error::MissingField("metadata.uid"), Some("sim")), REQUEUE);
        assert_eq!(status.and_then(|s| s.provider), Some("sim".to_string()));
        assert_eq!(reasons(&visit), vec![(true, "MissingField".to_string())]);
    }

    #[test]
    fn a_quota_or_capacity_error_stalls_naming_the_limit_and_what_was_asked() {
        let s = server();
        let mut visit = Visit::new(&s);
        let capacity = |kind| {
            Error::provider(
                "aws-main",
                provisioning_providers::ProviderError::Capacity(Box::new(provisioning_providers::CapacityError {
                    kind,
                    quota: "VcpuLimitExceeded".into(),
                    asked: "1 instance of type t3.large, 2 vCPUs in zone eu-north-1a".into(),
                    message: "EC2 RunInstances: You have requested more vCPU capacity than your current vCPU limit of 32 allows".into(),
                })),
            )
        };
        let end = End::failed(Step::Act, capacity(provisioning_providers::CapacityKind::Quota), Some("aws-main"));
        let (status, result) = visit.settle(end, REQUEUE);
        let status = status.expect("a status to write");
        let stalled = conditions::find(&status.conditions, condition::STALLED).expect("Stalled");
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "QuotaExceeded"));
        for part in ["VcpuLimitExceeded", "t3.large", "2 vCPUs", "eu-north-1a", "aws-main"] {
            assert!(stalled.message.contains(part), "{part}: {}", stalled.message);
        }
        assert!(!conditions::is_true(&status.conditions, condition::RECONCILING));
        assert_eq!(reasons(&visit), vec![(true, "QuotaExceeded".to_string())]);
        // The slow schedule, not the backoff of permanent errors.
        let error = result.expect_err("retried later");
        assert_eq!(error.class(), ErrorClass::Capacity);
        let mut visit = Visit::new(&s);
        let end = End::failed(Step::Act, capacity(provisioning_providers::CapacityKind::Insufficient), Some("aws-main"));
        let (status, _) = visit.settle(end, REQUEUE);
        let stalled = status.and_then(|s| conditions::find(&s.conditions, condition::STALLED).cloned()).expect("Stalled");
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "InsufficientCapacity"));
    }

    #[test]
    fn ready_is_announced_once_and_waiting_looks_again_at_resync() {
        let s = server();
        let mut visit = Visit::new(&s);
        let running = ServerStatus { provider_id: Some("sim://1".into()), provider_state: Some("running".into()), ..Default::default() };
        let mut ready = server();
        ready.status = Some(running.clone());
        let status = Visit::new(&ready).status(None, None, None, Machine::Unchanged);
        assert!(conditions::is_true(&status.conditions, condition::READY));
        let (_, result) = visit.settle(End::Done(Box::new(status.clone())), REQUEUE);
        assert!(result.is_ok());
        assert_eq!(reasons(&visit), vec![(false, "Ready".to_string())]);
        ready.status = Some(status.clone());
        let mut again = Visit::new(&ready);
        let _ = again.settle(End::Done(Box::new(status)), REQUEUE);
        assert!(again.events.is_empty(), "Ready only on the flip");
        let (waiting, result) = again.settle(End::Waiting(Box::new(running)), REQUEUE);
        assert!(waiting.is_some() && result.is_ok() && again.events.is_empty());
    }
}
