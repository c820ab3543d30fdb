//! Drift: a Server's machine changed outside the controller.
//!
//! Two halves:
//! - [`follow`] runs beside the Server controller. For every provider instance that can follow
//!   its machines ([`provisioning_providers::Provider::machine_events`], today the local Docker
//!   provider) it keeps one follower per event source, reconnecting with backoff. A machine
//!   event of the machine a Server records (not one being deleted) forgets the Server's last
//!   observation and queues it for reconcile through an in-process [`Trigger`], so drift is
//!   noticed within moments instead of at the next resync.
//! - [`detect`] (pure) is what a reconcile concludes from its observation: the recorded
//!   machine is missing (MachineMissing: re-created), or a standalone Server's machine is
//!   stopped and the provider can start it (MachineStopped: started). The Server reconciler
//!   writes `Drifted=True` and a Warning event (reason = the drift reason) before it
//!   remediates, and `Drifted=False` (Remediated) once the machine runs again; see
//!   [`record`]. Servers owned by a Cluster keep a stopped machine as it is (the Server
//!   waits for it to start).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use provisioning_crds::{LABEL_CLUSTER, Server, ServerStatus, condition};
use provisioning_providers::{MachineEvent, MachineState, Provider, ProviderId, ServerObservation, SharedProvider, tags};
use tokio::task::JoinSet;

use crate::context::Context;
use crate::reconcile::Trigger;

/// Reason of a missing machine.
pub const MACHINE_MISSING: &str = "MachineMissing";
/// Reason of a stopped machine.
pub const MACHINE_STOPPED: &str = "MachineStopped";
/// Reason of a spec change the machine does not match yet (plan, zone or image).
pub const SPEC_CHANGED: &str = "SpecChanged";
/// Reason of `Drifted=False` when the spec was changed back to match the machine.
pub const SPEC_REVERTED: &str = "SpecReverted";
/// Reason of `Drifted=False` after a remediation.
pub const REMEDIATED: &str = "Remediated";

/// How often new provider instances are looked for.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);
/// Events of one machine arriving together (a forced remove dies, then is destroyed) are
/// looked at once, this long after the first.
const SETTLE: Duration = Duration::from_millis(300);
/// Reconnect backoff bounds.
const RECONNECT_MIN: Duration = Duration::from_secs(1);
const RECONNECT_MAX: Duration = Duration::from_secs(60);

/// Drift found by a reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// [`MACHINE_MISSING`], [`MACHINE_STOPPED`] or [`SPEC_CHANGED`].
    pub reason: &'static str,
    /// The machine.
    pub machine: ProviderId,
    /// Says which machine and what happened to it.
    pub message: String,
}

impl Drift {
    /// The machine as the drift left it, for status while it is remediated: `missing` (no
    /// address) or `stopped`.
    pub fn observation(&self) -> ServerObservation {
        let state = if self.reason == MACHINE_STOPPED { MachineState::Stopped } else { MachineState::Other("missing".into()) };
        ServerObservation { provider_id: self.machine.clone(), state, addresses: vec![], plan: String::new(), tags: Default::default() }
    }
}

/// What a reconcile learns from observing the recorded machine `id` (`observed`: `None` when
/// it does not exist): drift, or nothing. Adopted machines (`spec.externalID`) never drift
/// here: a missing one is ExternalNotFound.
pub fn detect(server: &Server, id: &ProviderId, observed: Option<&ServerObservation>, can_start: bool) -> Option<Drift> {
    if !server.spec.external_id.is_empty() {
        return None;
    }
    let who = format!("{}/{}", server.namespace().unwrap_or_default(), server.name_any());
    match observed {
        None => Some(Drift {
            reason: MACHINE_MISSING,
            machine: id.clone(),
            message: format!("machine {id} of Server {who} is missing (removed outside the controller); re-creating it"),
        }),
        Some(obs) if obs.state == MachineState::Stopped && can_start && !server.labels().contains_key(LABEL_CLUSTER) => Some(Drift {
            reason: MACHINE_STOPPED,
            machine: obs.provider_id.clone(),
            message: format!("machine {} of Server {who} is stopped (stopped outside the controller); starting it", obs.provider_id),
        }),
        Some(_) => None,
    }
}

/// Where a reconcile stands with drift, for [`record`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Found, not remediated yet: `Drifted=True`.
    Drifted(Drift),
    /// Found and remediated in this reconcile; the machine now observed.
    Remediated(Drift, ProviderId),
}

/// Records drift as the `Drifted` condition of `status`: `lastTransitionTime` is kept from
/// `previous` unless the status flips. Without drift in this reconcile, [`super::status::desired`]
/// keeps the condition (and sets it False once the machine runs).
pub fn record(status: ServerStatus, previous: Option<&ServerStatus>, found: &Found, now: Timestamp) -> ServerStatus {
    let (value, reason, message) = match found {
        Found::Drifted(d) => ("True", d.reason, d.message.clone()),
        Found::Remediated(d, now_id) => {
            let done = match d.reason {
                MACHINE_MISSING => format!("machine {} was missing and was re-created as {now_id}", d.machine),
                SPEC_CHANGED => format!("{}; carried out (machine {now_id})", d.message),
                _ => format!("machine {} was stopped and was started again", d.machine),
            };
            ("False", REMEDIATED, done)
        }
    };
    set_drifted(status, previous, (value, reason, &message), now)
}

/// Sets the `Drifted` condition of `status` to `(status, reason, message)`, keeping
/// `lastTransitionTime` from `previous` unless the value flips (drift and spec changes share it).
pub fn set_drifted(mut status: ServerStatus, previous: Option<&ServerStatus>, to: (&str, &str, &str), now: Timestamp) -> ServerStatus {
    let (value, reason, message) = to;
    let before = previous.and_then(|p| crate::conditions::find(&p.conditions, condition::DRIFTED));
    let last = before.filter(|c| c.status == value).map(|c| c.last_transition_time.clone()).unwrap_or(Time(now));
    let drifted = Condition {
        type_: condition::DRIFTED.to_string(),
        status: value.to_string(),
        reason: reason.to_string(),
        message: crate::conditions::truncate(message, 1024),
        observed_generation: status.observed_generation,
        last_transition_time: last,
    };
    match status.conditions.iter_mut().find(|c| c.type_ == condition::DRIFTED) {
        Some(c) => *c = drifted,
        None => status.conditions.push(drifted),
    }
    status
}

/// Whether a Warning for `drift` is due: not when the Server already says `Drifted=True` for
/// the same reason (one event per drift).
pub fn warning_due(server: &Server, drift: &Drift) -> bool {
    let current = server.status.as_ref().and_then(|s| crate::conditions::find(&s.conditions, condition::DRIFTED));
    !current.is_some_and(|c| c.status == "True" && c.reason == drift.reason)
}

/// Follows the machine events of every provider instance the controller builds, one follower
/// per event source, and queues the Servers concerned through `trigger`. Runs until dropped
/// (its followers go with it).
pub async fn follow(ctx: Arc<Context>, trigger: Trigger<Server>) {
    let mut following: HashSet<String> = HashSet::new();
    let mut followers = JoinSet::new();
    loop {
        for provider in ctx.providers.cached() {
            if let Some(source) = provider.machine_event_source()
                && following.insert(source.clone())
            {
                tracing::info!(%source, "following machine events");
                followers.spawn(follow_source(ctx.clone(), provider, source, trigger.clone()));
            }
        }
        tokio::time::sleep(DISCOVER_EVERY).await;
    }
}

/// One event source of `provider`, feeding [`on_event`]; after each connect every Server on a
/// machine of that provider type is looked at (events may have been missed meanwhile).
async fn follow_source(ctx: Arc<Context>, provider: SharedProvider, source: String, trigger: Trigger<Server>) {
    let provider_type = provider.provider_type();
    follow_stream(provider.as_ref(), &source, |event| on_event(&ctx, &trigger, event), || look_at_all(&ctx, &trigger, provider_type)).await
}

/// Follows `provider`'s machine events for ever, reconnecting with jittered exponential
/// backoff ([`RECONNECT_MIN`] doubling to [`RECONNECT_MAX`]) after an error or the end of the
/// stream; `on_connect` runs on every connect, the first included: what happened before the
/// subscription (the provider is followed only once it was built, up to [`DISCOVER_EVERY`]
/// after its first machine) or while disconnected has no event.
async fn follow_stream(provider: &dyn Provider, source: &str, mut on_event: impl FnMut(MachineEvent), mut on_connect: impl FnMut()) {
    let mut delay = RECONNECT_MIN;
    loop {
        let connected = Instant::now();
        let mut events = provider.machine_events();
        on_connect();
        let ended = loop {
            match events.next().await {
                Some(Ok(event)) => on_event(event),
                Some(Err(e)) => break e.to_string(),
                None => break "the event stream ended".to_string(),
            }
        };
        if connected.elapsed() > RECONNECT_MAX {
            delay = RECONNECT_MIN;
        }
        tracing::warn!(%source, error = %ended, retry_in_ms = delay.as_millis() as u64, "machine events interrupted; reconnecting");
        tokio::time::sleep(crate::time::jittered(delay)).await;
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}

/// Queues every Server whose recorded machine is of `provider_type`.
fn look_at_all(ctx: &Context, trigger: &Trigger<Server>, provider_type: &str) {
    let prefix = format!("{provider_type}://");
    for server in ctx.stores.servers.state() {
        if server.status.as_ref().and_then(|s| s.provider_id.as_deref()).is_some_and(|id| id.starts_with(&prefix)) {
            ctx.forget_observed(&server.uid().unwrap_or_default());
            trigger.send(ObjectRef::from_obj(server.as_ref()));
        }
    }
}

/// The Server `event` concerns: the one in the cache with the machine's identity, recording
/// that machine, not being deleted (the controller's own deletes and replacements are no drift).
fn concerned(ctx: &Context, event: &MachineEvent) -> Option<Arc<Server>> {
    let namespace = event.tags.get(tags::NAMESPACE)?;
    let name = event.tags.get(tags::SERVER)?;
    let uid = event.tags.get(tags::SERVER_UID)?;
    let server = ctx.stores.servers.get(&ObjectRef::new(name).within(namespace))?;
    let recorded = server.status.as_ref().and_then(|s| s.provider_id.as_deref());
    (server.metadata.uid.as_ref() == Some(uid)
        && server.metadata.deletion_timestamp.is_none()
        && recorded == Some(event.provider_id.0.as_str()))
    .then_some(server)
}

fn on_event(ctx: &Arc<Context>, trigger: &Trigger<Server>, event: MachineEvent) {
    let Some(server) = concerned(ctx, &event) else {
        tracing::debug!(machine = %event.provider_id, kind = ?event.kind, "machine event of no current Server machine");
        return;
    };
    tracing::info!(
        namespace = server.namespace().as_deref(),
        name = %server.name_any(),
        machine = %event.provider_id,
        kind = ?event.kind,
        "machine changed outside the controller; checking the Server"
    );
    let (ctx, trigger) = (ctx.clone(), trigger.clone());
    let uid = server.uid().unwrap_or_default();
    let object = ObjectRef::from_obj(server.as_ref());
    tokio::spawn(async move {
        tokio::time::sleep(SETTLE).await;
        // The next reconcile observes the machine instead of trusting its last observation.
        ctx.forget_observed(&uid);
        trigger.send(object);
    });
}

#[cfg(test)]
mod tests {
    use provisioning_crds::ServerSpec;
    use provisioning_providers::{
        DeleteOutcome, ExecRequest, ExecResult, MachineEventKind, MachineEvents, ProviderError, ProviderResult, ServerIdentity,
        ServerRequest,
    };

    use super::*;

    fn server(cluster: Option<&str>, external: &str) -> Server {
        let mut s = Server::new("web", ServerSpec { external_id: external.into(), ..Default::default() });
        s.metadata.namespace = Some("default".into());
        if let Some(c) = cluster {
            s.metadata.labels = Some([(LABEL_CLUSTER.to_string(), c.to_string())].into());
        }
        s
    }

    fn observed(state: MachineState) -> ServerObservation {
        ServerObservation {
            provider_id: ProviderId("local://abc".into()),
            state,
            addresses: vec![],
            plan: String::new(),
            tags: Default::default(),
        }
    }

    #[test]
    fn missing_and_stopped_machines_are_drift() {
        let id = ProviderId("local://abc".into());
        let missing = detect(&server(None, ""), &id, None, true).expect("drift");
        assert_eq!(missing.reason, MACHINE_MISSING);
        assert!(missing.message.contains("local://abc") && missing.message.contains("default/web"), "{}", missing.message);
        let stopped = detect(&server(None, ""), &id, Some(&observed(MachineState::Stopped)), true).expect("drift");
        assert_eq!(stopped.reason, MACHINE_STOPPED);
        // While remediated, status says so (never "terminated": a Cluster would replace the member).
        assert_eq!(missing.observation().state.as_str(), "missing");
        assert_eq!(stopped.observation().state, MachineState::Stopped);
        // Running, or stopped where nothing restarts it, is no drift; nor are adopted machines.
        assert_eq!(detect(&server(None, ""), &id, Some(&observed(MachineState::Running)), true), None);
        assert_eq!(detect(&server(None, ""), &id, Some(&observed(MachineState::Stopped)), false), None);
        assert_eq!(detect(&server(Some("etcd"), ""), &id, Some(&observed(MachineState::Stopped)), true), None);
        assert_eq!(detect(&server(None, "local://abc"), &id, None, true), None);
        // A Cluster member's missing machine is re-created as before.
        assert_eq!(detect(&server(Some("etcd"), ""), &id, None, true).map(|d| d.reason), Some(MACHINE_MISSING));
    }

    /// Its first event stream fails, the second yields one event and then stays open.
    struct Flaky {
        connects: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Provider for Flaky {
        fn provider_type(&self) -> &'static str {
            "local"
        }
        fn resolve_plan(&self, plan: &str) -> ProviderResult<String> {
            Ok(plan.to_string())
        }
        async fn validate_credentials(&self) -> ProviderResult<()> {
            Ok(())
        }
        async fn ensure_server(&self, _: &ServerRequest) -> ProviderResult<ServerObservation> {
            Err(ProviderError::Permanent("not here".into()))
        }
        async fn find_server(&self, _: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
            Ok(None)
        }
        async fn observe_server(&self, _: &ProviderId) -> ProviderResult<Option<ServerObservation>> {
            Ok(None)
        }
        async fn delete_server(&self, _: &ProviderId) -> ProviderResult<DeleteOutcome> {
            Ok(DeleteOutcome::Gone)
        }
        async fn exec(&self, _: &ProviderId, _: ExecRequest) -> ProviderResult<ExecResult> {
            Err(ProviderError::Permanent("not here".into()))
        }
        async fn list_servers(&self, _: &[(String, String)]) -> ProviderResult<Vec<ServerObservation>> {
            Ok(vec![])
        }
        fn machine_events(&self) -> MachineEvents {
            let n = self.connects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n == 0 {
                return Box::pin(futures::stream::iter([Err(ProviderError::Transient("engine went away".into()))]));
            }
            let event =
                MachineEvent { provider_id: ProviderId("local://abc".into()), kind: MachineEventKind::Removed, tags: Default::default() };
            Box::pin(futures::stream::iter([Ok(event)]).chain(futures::stream::pending()))
        }
    }

    #[tokio::test]
    async fn a_broken_event_stream_is_reconnected_and_its_events_delivered() {
        let provider = Flaky { connects: Default::default() };
        let events = std::sync::Mutex::new(Vec::new());
        let reconnects = std::sync::atomic::AtomicUsize::new(0);
        let follow = follow_stream(
            &provider,
            "docker:test",
            |e| events.lock().unwrap_or_else(|p| p.into_inner()).push(e),
            || {
                reconnects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            },
        );
        // Never ends by itself: followed until the event arrived (after one backoff, ~1 s).
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::pin!(follow);
            loop {
                tokio::select! {
                    _ = &mut follow => unreachable!("the follower never returns"),
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {
                        if !events.lock().unwrap_or_else(|p| p.into_inner()).is_empty() { break; }
                    }
                }
            }
        })
        .await;
        let got = events.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(
            got.iter().map(|e| (e.provider_id.0.as_str(), e.kind)).collect::<Vec<_>>(),
            [("local://abc", MachineEventKind::Removed)]
        );
        assert_eq!(provider.connects.load(std::sync::atomic::Ordering::SeqCst), 2, "connected again after the error");
        assert_eq!(
            reconnects.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "each connect (the first and the reconnect) looks at every Server once"
        );
    }

    #[test]
    fn the_condition_flips_true_then_false_and_one_warning_per_drift() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap_or_default();
        let t1 = Timestamp::from_second(1_700_000_060).unwrap_or_default();
        let id = ProviderId("local://abc".into());
        let drift = detect(&server(None, ""), &id, None, true).expect("drift");
        let drifted = record(ServerStatus::default(), None, &Found::Drifted(drift.clone()), t0);
        let c = crate::conditions::find(&drifted.conditions, condition::DRIFTED).expect("Drifted");
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.last_transition_time.0), ("True", MACHINE_MISSING, t0));
        let mut seen = server(None, "");
        assert!(warning_due(&seen, &drift));
        seen.status = Some(drifted.clone());
        assert!(!warning_due(&seen, &drift), "the same drift warns once");
        let fixed = record(drifted.clone(), Some(&drifted), &Found::Remediated(drift, ProviderId("local://def".into())), t1);
        let c = crate::conditions::find(&fixed.conditions, condition::DRIFTED).expect("Drifted");
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.last_transition_time.0), ("False", REMEDIATED, t1));
        assert!(c.message.contains("local://abc") && c.message.contains("local://def"), "{}", c.message);
        assert_eq!(fixed.conditions.iter().filter(|c| c.type_ == condition::DRIFTED).count(), 1);
    }
}
