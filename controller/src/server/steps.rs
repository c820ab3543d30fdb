//! The acting steps of a Server visit, in pipeline order, each over the [`Visit`]: the
//! approval gate of a machine to make ([`gate_create`]), drift remediation
//! ([`remediate_drift`]), the SSH host key ([`host_key`]) and the final status ([`finish`],
//! pure).

use provisioning_crds::{Approval, Plan, ServerStatus};
use provisioning_providers::ProviderId;

use super::prepare::Prepared;
use super::status::{self, Machine};
use super::visit::{End, Visit};
use super::{act, approval, drift, plan, ssh};
use crate::conditions::Summary;
use crate::context::Context;
use crate::effective_workspace::EffectiveWorkspace;
use crate::error::{Error, Step};

/// A machine to make is a plan too: under Manual approval it waits like any other. Continues
/// with the plan carried out (`None`: the step makes no machine).
pub fn gate_create(visit: &mut Visit<'_>, p: &Prepared, step: &plan::Step, approval: Approval) -> Result<Option<Plan>, End> {
    if !matches!(step, plan::Step::Create | plan::Step::FindThenCreate) {
        return Ok(None);
    }
    if let Some(wait) = capacity_cooldown(visit.server, &p.valid, visit.now) {
        // Our own writes of the failed attempt bring the Server back at once: the provider is
        // asked again on the slow schedule only (nothing to record meanwhile).
        return Err(End::Requeue(kube::runtime::controller::Action::requeue(wait)));
    }
    let planned = p.plan(visit.server, None).plan;
    if !approval::check(visit, approval, &planned) {
        return Err(approval::wait(visit, &planned, &p.cost, (Some(p.valid.account.name.clone()), Machine::Unchanged), |s| s));
    }
    Ok(Some(planned))
}

/// How long a Server whose last create ran into a quota or a zone without capacity
/// (Stalled `QuotaExceeded`/`InsufficientCapacity` for its current generation) waits before
/// the provider is asked again ([`crate::error::CAPACITY_RETRY`] after the stall began);
/// `None` when it may ask now (another stall, a changed spec, the time is up). With
/// `spec.fallbackZones` a zone not tried in this round is asked at once, and once every
/// zone was tried the wait counts from the round's start (`status.zoneFallback.since`).
pub fn capacity_cooldown(
    server: &provisioning_crds::Server,
    valid: &super::validate::ValidServer,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<std::time::Duration> {
    let status = server.status.as_ref()?;
    let stalled = crate::conditions::find(&status.conditions, provisioning_crds::condition::STALLED)?;
    let capacity = stalled.status == "True" && matches!(stalled.reason.as_str(), "QuotaExceeded" | "InsufficientCapacity");
    if !capacity || stalled.observed_generation != server.metadata.generation {
        return None;
    }
    let mut since = stalled.last_transition_time.0;
    if let (Some(tried), Some(round)) = (super::validate::tried_zones(server), status.zone_fallback.as_ref())
        && !valid.fallback_zones.is_empty()
    {
        if valid.allowed_zones().iter().any(|z| !tried.contains(z)) {
            return None;
        }
        since = round.since.0;
    }
    let elapsed = now.as_second().saturating_sub(since.as_second());
    let left = i64::try_from(crate::error::CAPACITY_RETRY.as_secs()).ok()?.saturating_sub(elapsed);
    (left > 0).then(|| std::time::Duration::from_secs(left.unsigned_abs()))
}

/// A drifted machine: under Manual approval its remediation is a plan that waits like any
/// other; otherwise the drift is recorded first and the machine remediated. Continues with
/// what remediating found and the plan carried out. One Warning per drift.
pub async fn remediate_drift(
    visit: &mut Visit<'_>,
    drift: &drift::Drift,
    p: &Prepared,
    approval: Approval,
    ws: &EffectiveWorkspace,
    ctx: &Context,
) -> Result<(act::Acted, Plan), End> {
    let server = visit.server;
    let stopped = drift.reason == drift::MACHINE_STOPPED;
    let remedy = plan::drift_plan(server, &drift.machine, stopped, &drift.message, &p.valid).plan;
    let go = approval::check(visit, approval, &remedy);
    if drift::warning_due(server, drift) {
        visit.warn(drift.reason, "Remediate", drift.message.clone());
    }
    let found = drift::Found::Drifted(drift.clone());
    let machine = Machine::Observed(drift.observation());
    if !go {
        let now = visit.now;
        return Err(approval::wait(visit, &remedy, &p.cost, (None, machine), |s| drift::record(s, server.status.as_ref(), &found, now)));
    }
    // Checkpoint: Drifted=True is on record (and its Warning out) before the remediation
    // starts, so a crash mid-remediation still shows the drift.
    let drifted = visit.status(Some(Summary::progressing(drift.reason, drift.message.clone())), None, None, machine);
    visit.checkpoint(drift::record(drifted, server.status.as_ref(), &found, visit.now), ctx).await?;
    match act::remediate(server, drift, p, ws, ctx, &mut visit.events).await {
        Ok(acted) => Ok((acted, remedy)),
        Err(e) => Err(End::failed(Step::Act, e, Some(&p.valid.account.name))),
    }
}

/// The SSH host key: restored into the provider from status when it lost it (a new
/// controller pod), recorded into status after the first contact. Never re-pinned.
pub async fn host_key(visit: &Visit<'_>, machine: &Machine, p: &Prepared, ctx: &Context) -> Result<Option<String>, End> {
    let server = visit.server;
    let machine_id = match machine {
        Machine::Observed(obs) => Some(obs.provider_id.clone()),
        _ => server.status.as_ref().and_then(|s| s.provider_id.clone()).map(ProviderId),
    };
    let Some(id) = machine_id.filter(|_| ssh::uses_ssh(&p.valid.account)) else { return Ok(None) };
    // A generated key (the Server's own Secret) wins over status, which any status writer
    // could have set.
    let generated = match ssh::generated_host_key(&ctx.client, server).await {
        Ok(key) => key.map(|k| k.public),
        Err(Error::Stalled { reason, message }) => return Err(End::stalled(Step::Act, reason, message)),
        Err(e) => return Err(End::failed(Step::Act, e, Some(&p.valid.account.name))),
    };
    act::host_key(server, &id, &p.provider, generated.as_deref()).map_err(|message| End::stalled(Step::Act, "HostKeyMismatch", message))
}

/// What the visit carried out, for the final status.
pub struct Outcome {
    /// What the machine is now.
    pub machine: Machine,
    /// The host key to record.
    pub host_key: Option<String>,
    /// The plan carried out, if any.
    pub applied: Option<Plan>,
    /// A drift remediated in this visit.
    pub drift: Option<drift::Drift>,
}

/// The final status (pure): the machine as observed with its cost (an adopted or observed
/// machine may run another plan than the spec's), what the spec would still change, a
/// remediated drift.
pub fn finish(visit: &Visit<'_>, p: &Prepared, done: Outcome) -> ServerStatus {
    let server = visit.server;
    let valid = &p.valid;
    let Outcome { machine, host_key, applied, drift } = done;
    let desired = visit.status(None, Some(valid.account.name.clone()), Some(valid.resolved_plan.clone()), machine);
    let desired = status::record_host_key(desired, host_key.as_deref());
    let cost = p.machine_cost(&desired);
    let desired = status::record_cost(desired, &cost);
    let desired = status::record_machine_spec(desired, server.status.as_ref(), &valid.zone, &valid.image, &valid.disks);
    // What the spec would still change (normally nothing, once carried out).
    let remaining = p.plan(server, Some(&desired));
    let desired = status::record_plan(desired, server.status.as_ref(), &remaining.plan, applied.as_ref(), visit.now);
    match (drift, &desired.provider_id) {
        (Some(drift), Some(now_id)) => {
            let found = drift::Found::Remediated(drift, ProviderId(now_id.clone()));
            drift::record(desired.clone(), server.status.as_ref(), &found, visit.now)
        }
        _ => desired,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn stalled(reason: &str, generation: i64, since: Timestamp) -> provisioning_crds::Server {
        let mut s = crate::testing::server("team-a", "web-0", serde_json::json!({"provider": "aws", "plan": "small"}));
        s.metadata.generation = Some(2);
        s.status = Some(ServerStatus {
            conditions: vec![Condition {
                type_: "Stalled".into(),
                status: "True".into(),
                reason: reason.into(),
                message: "m".into(),
                observed_generation: Some(generation),
                last_transition_time: Time(since),
            }],
            ..Default::default()
        });
        s
    }

    fn valid(zone: &str, fallback: &[&str]) -> super::super::validate::ValidServer {
        super::super::validate::ValidServer {
            account: serde_json::from_value(serde_json::json!({"name": "aws", "type": "aws"})).unwrap_or_else(|e| panic!("{e}")),
            plan: "small".into(),
            resolved_plan: "t3.small".into(),
            zone: zone.into(),
            spec_zone: zone.into(),
            image: "debian-12".into(),
            fallback_zones: fallback.iter().map(|z| z.to_string()).collect(),
            public_ip: None,
            disks: Vec::new(),
        }
    }

    #[test]
    fn a_capacity_stall_asks_the_provider_again_only_after_five_minutes() -> Result<(), Box<dyn std::error::Error>> {
        let t0 = Timestamp::from_second(1_800_000_000)?;
        let at = |secs: i64| Timestamp::from_second(1_800_000_000 + secs);
        let quota = stalled("QuotaExceeded", 2, t0);
        let v = valid("", &[]);
        assert_eq!(capacity_cooldown(&quota, &v, at(1)?), Some(std::time::Duration::from_secs(299)));
        assert_eq!(capacity_cooldown(&stalled("InsufficientCapacity", 2, t0), &v, at(240)?), Some(std::time::Duration::from_secs(60)));
        assert_eq!(capacity_cooldown(&quota, &v, at(300)?), None, "time is up");
        assert_eq!(capacity_cooldown(&stalled("QuotaExceeded", 1, t0), &v, at(1)?), None, "the spec changed since");
        assert_eq!(capacity_cooldown(&stalled("UnknownPlan", 2, t0), &v, at(1)?), None, "another stall");
        Ok(())
    }

    #[test]
    fn no_capacity_moves_the_next_create_to_the_next_fallback_zone_then_waits_a_round() -> Result<(), Box<dyn std::error::Error>> {
        use super::super::validate::placement;
        let t0 = Timestamp::from_second(1_800_000_000)?;
        let at = |secs: i64| Timestamp::from_second(1_800_000_000 + secs);
        let v = valid("eu-north-1a", &["eu-north-1b", "eu-north-1c"]);
        let allowed = v.allowed_zones();
        let with_round = |round: Option<provisioning_crds::ZoneFallback>, reason: &str, generation: i64| {
            let mut s = stalled(reason, generation, t0);
            if let Some(st) = s.status.as_mut() {
                st.zone_fallback = round;
            }
            s
        };
        // Nothing tried yet: the spec's zone.
        assert_eq!(placement(&v, &crate::testing::server("team-a", "web-0", serde_json::json!({}))), "eu-north-1a");
        // 1a had no capacity: 1b at once, no wait.
        let round = status::no_capacity_in(None, "eu-north-1a", &allowed, t0);
        let s = with_round(Some(round.clone()), "InsufficientCapacity", 2);
        assert_eq!(placement(&v, &s), "eu-north-1b");
        assert_eq!(capacity_cooldown(&s, &v, at(1)?), None, "an untried zone is asked at once");
        // 1b neither: 1c at once.
        let round = status::no_capacity_in(Some(&round), "eu-north-1b", &allowed, at(2)?);
        assert_eq!(round.tried, ["eu-north-1a", "eu-north-1b"]);
        assert_eq!(round.since, Time(t0), "one round");
        let s = with_round(Some(round.clone()), "InsufficientCapacity", 2);
        assert_eq!((placement(&v, &s).as_str(), capacity_cooldown(&s, &v, at(3)?)), ("eu-north-1c", None));
        // Every zone tried: back to 1a, after the round's five minutes.
        let round = status::no_capacity_in(Some(&round), "eu-north-1c", &allowed, at(4)?);
        let s = with_round(Some(round.clone()), "InsufficientCapacity", 2);
        assert_eq!(placement(&v, &s), "eu-north-1a");
        assert_eq!(capacity_cooldown(&s, &v, at(10)?), Some(std::time::Duration::from_secs(290)));
        assert_eq!(capacity_cooldown(&s, &v, at(300)?), None);
        // 1a fails again: a new round from then (so each round waits its five minutes).
        let next = status::no_capacity_in(Some(&round), "eu-north-1a", &allowed, at(301)?);
        assert_eq!((next.tried.as_slice(), next.since.clone()), (["eu-north-1a".to_string()].as_slice(), Time(at(301)?)));
        // A quota (the account's, every zone) or an older generation's stall: the spec's zone.
        assert_eq!(placement(&v, &with_round(Some(round.clone()), "QuotaExceeded", 2)), "eu-north-1a");
        assert_eq!(placement(&v, &with_round(Some(round), "InsufficientCapacity", 1)), "eu-north-1a");
        // A machine made in a fallback zone stays there; one outside the allowed zones does not.
        let mut made = crate::testing::server("team-a", "web-0", serde_json::json!({}));
        made.status = Some(ServerStatus { provider_id: Some("aws://i-0a".into()), zone: Some("eu-north-1c".into()), ..Default::default() });
        assert_eq!(placement(&v, &made), "eu-north-1c");
        made.status = Some(ServerStatus { provider_id: Some("aws://i-0a".into()), zone: Some("eu-west-1a".into()), ..Default::default() });
        assert_eq!(placement(&v, &made), "eu-north-1a");
        // No fallback zones: the spec's zone, whatever status says.
        assert_eq!(placement(&valid("eu-north-1a", &[]), &made), "eu-north-1a");
        Ok(())
    }
}
