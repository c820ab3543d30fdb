//! Status (pure): the Server's desired status from what this reconcile learned.

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{MachineAddress, Plan, ServerCost, ServerStatus, condition};
use provisioning_providers::ServerObservation;

use super::drift::{self, REMEDIATED, SPEC_CHANGED, SPEC_REVERTED};
use crate::conditions::{self, DesiredCondition, Status, Summary};

/// Phases shown to humans.
pub mod phase {
    /// Nothing done yet.
    pub const PENDING: &str = "Pending";
    /// Machine being created or booting.
    pub const PROVISIONING: &str = "Provisioning";
    /// Machine up.
    pub const RUNNING: &str = "Running";
    /// Cannot progress without a change.
    pub const FAILED: &str = "Failed";
    /// Machine being deleted.
    pub const DELETING: &str = "Deleting";
}

/// What the reconcile learned about the machine.
#[derive(Clone, Debug, PartialEq)]
pub enum Machine {
    /// Not asked this time (recent observation reused): keep what the status says.
    Unchanged,
    /// Observed now.
    Observed(ServerObservation),
    /// Nothing known yet.
    None,
    /// A create is about to be called: nothing known yet, but from here on a machine may
    /// exist unrecorded (Provisioned reason [`CREATING`], the leak guard of [`create_started`]).
    Creating,
}

/// Provisioned's reason after a create-pending write until a machine is recorded: a create
/// call may have been made, so the machine is looked up by owner tag before any other create
/// and on deletion (what the `create-pending` annotation says; earlier versions wrote this
/// status instead of the annotation before a first create, so it is still honoured).
pub const CREATING: &str = "Creating";

/// Whether `status` records a create started without its machine recorded (the leak guard
/// written by the create checkpoint, kept by every later status until a machine is recorded).
pub fn create_started(status: Option<&ServerStatus>) -> bool {
    status.is_some_and(|s| {
        s.provider_id.is_none() && conditions::find(&s.conditions, condition::PROVISIONED).is_some_and(|c| c.reason == CREATING)
    })
}

/// Inputs of [`desired`].
#[derive(Clone, Debug)]
pub struct StatusInput<'a> {
    /// The status as it is.
    pub previous: Option<&'a ServerStatus>,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// Provider account name, when resolved.
    pub provider: Option<String>,
    /// Native plan, when resolved.
    pub resolved_plan: Option<String>,
    /// What was learned about the machine.
    pub machine: Machine,
    /// Overrides the summary derived from the machine (stalled, errors, initial visit).
    pub summary: Option<Summary>,
    /// Paused annotation set.
    pub paused: bool,
    /// Clock.
    pub now: Timestamp,
}

/// The first visit's summary when it has nothing else to record: Unknown, reason
/// `Initializing`.
pub fn initializing() -> Summary {
    Summary::Unknown { reason: "Initializing".into(), message: "reconciliation started".into() }
}

/// Builds the desired status. Identical inputs give an identical status (no write).
// Over 80 lines on purpose: a field-by-field copy of the observation into the status followed
// by the condition table; splitting it would scatter which input sets which field.
pub fn desired(input: StatusInput<'_>) -> ServerStatus {
    let previous = input.previous.cloned().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = input.generation;
    if let Some(provider) = input.provider {
        status.provider = Some(provider);
    }
    // Once a machine exists, its observed plan is what status reports (adopted machines may
    // differ from the spec); the spec's resolved plan only fills in before that.
    if let Some(plan) = input.resolved_plan
        && (status.provider_id.is_none() || status.resolved_plan.is_none())
    {
        status.resolved_plan = Some(plan);
    }
    match &input.machine {
        Machine::Observed(obs) => {
            if previous.provider_id.as_deref() != Some(obs.provider_id.0.as_str()) {
                // Another machine (re-created after it vanished) has a key of its own.
                status.host_key = None;
            }
            status.provider_id = Some(obs.provider_id.0.clone());
            status.provider_state = Some(obs.state.as_str().to_string());
            status.addresses =
                obs.addresses.iter().map(|a| MachineAddress { address_type: a.kind.clone(), address: a.address.clone() }).collect();
            if !obs.plan.is_empty() {
                status.resolved_plan = Some(obs.plan.clone());
            }
        }
        Machine::Unchanged | Machine::None | Machine::Creating => {}
    }
    // The leak guard stays until a machine is recorded, whatever ends this visit.
    let creating = matches!(input.machine, Machine::Creating) || create_started(Some(&previous));
    let running = status.provider_state.as_deref() == Some("running") && status.provider_id.is_some();
    let summary = input.summary.clone().unwrap_or_else(|| match (&status.provider_id, running) {
        (Some(id), true) => Summary::ready("Running", format!("machine {id} is running")),
        (Some(id), false) => Summary::progressing(
            "Provisioning",
            format!("waiting for machine {id} to start (state: {})", status.provider_state.as_deref().unwrap_or("unknown")),
        ),
        (None, _) => Summary::progressing("Provisioning", "creating the machine"),
    });
    let provisioned = match (&status.provider_id, running) {
        (Some(id), true) => DesiredCondition::new(condition::PROVISIONED, Status::True, "Running", format!("machine {id} is running")),
        (Some(_), false) => DesiredCondition::new(condition::PROVISIONED, Status::False, "Starting", "the machine is not running yet"),
        (None, _) if creating => DesiredCondition::new(
            condition::PROVISIONED,
            Status::False,
            CREATING,
            "a create was started at the provider; no machine recorded yet",
        ),
        (None, _) if matches!(summary, Summary::Unknown { .. }) => {
            DesiredCondition::new(condition::PROVISIONED, Status::Unknown, "Initializing", "")
        }
        (None, _) => DesiredCondition::new(condition::PROVISIONED, Status::False, "NotCreated", "no machine yet"),
    };
    status.phase = Some(
        match &summary {
            Summary::Ready { .. } => phase::RUNNING,
            Summary::Stalled { .. } => phase::FAILED,
            Summary::Unknown { .. } => phase::PENDING,
            Summary::Progressing { .. } if status.provider_id.is_some() || running => phase::PROVISIONING,
            Summary::Progressing { .. } => phase::PROVISIONING,
        }
        .to_string(),
    );
    let mut wanted = summary.conditions();
    wanted.push(provisioned);
    if let Some(drifted) = conditions::find(&previous.conditions, condition::DRIFTED) {
        // Drift stays recorded (see super::drift); True turns False once the machine runs.
        // SpecChanged is settled by the plan (see super::spec), not by the machine running.
        wanted.push(if drifted.status == "True" && running && drifted.reason != super::drift::SPEC_CHANGED {
            DesiredCondition::new(condition::DRIFTED, Status::False, super::drift::REMEDIATED, "the machine is running again")
        } else {
            DesiredCondition::new(condition::DRIFTED, status_word(&drifted.status), &drifted.reason, drifted.message.clone())
        });
    }
    if !input.paused && conditions::find(&previous.conditions, condition::PAUSED).is_some() {
        // Once paused, the condition stays (False) rather than vanishing from the list.
        wanted.push(DesiredCondition::new(condition::PAUSED, Status::False, "Resumed", ""));
    }
    if input.paused {
        // Paused keeps whatever Ready/Provisioned said; only Reconciling and Paused change.
        let keep = |t: &str| conditions::find(&previous.conditions, t).cloned();
        let mut out = Vec::new();
        for c in [condition::READY, condition::STALLED, condition::PROVISIONED] {
            if let Some(c) = keep(c) {
                out.push(DesiredCondition::new(&c.type_, status_word(&c.status), &c.reason, c.message.clone()));
            } else {
                out.push(DesiredCondition::new(c, Status::Unknown, "Paused", ""));
            }
        }
        if let Some(c) = keep(condition::DRIFTED) {
            out.push(DesiredCondition::new(&c.type_, status_word(&c.status), &c.reason, c.message.clone()));
        }
        out.insert(1, DesiredCondition::new(condition::RECONCILING, Status::False, "Paused", "reconciliation is paused"));
        out.push(DesiredCondition::new(
            condition::PAUSED,
            Status::True,
            "Paused",
            format!("annotation {}=true stops reconciliation", provisioning_crds::ANNOTATION_PAUSED),
        ));
        wanted = out;
        status.phase = previous.phase.clone().or(Some(phase::PENDING.to_string()));
    }
    status.conditions = conditions::merge(&previous.conditions, &wanted, input.generation, input.now);
    status
}

/// Records the SSH host key the provider pinned for the machine (first contact happens when a
/// task script runs there). Recorded once per machine: a key that differs later is refused
/// before it gets here (see `super::ssh::restore_pin`), never written over the recorded one.
pub fn record_host_key(mut status: ServerStatus, pinned: Option<&str>) -> ServerStatus {
    if status.host_key.is_none()
        && status.provider_id.is_some()
        && let Some(key) = pinned.map(str::trim).filter(|k| !k.is_empty())
    {
        status.host_key = Some(key.to_string());
    }
    status
}

/// Records the zone, image and disks a machine was made with (`valid`'s), once per machine: a new
/// machine (another providerID than `previous` recorded), or one recorded before these
/// fields existed. Later spec changes are planned against what is recorded here.
pub fn record_machine_spec(
    mut status: ServerStatus,
    previous: Option<&ServerStatus>,
    zone: &str,
    image: &str,
    disks: &[provisioning_crds::Disk],
) -> ServerStatus {
    let Some(id) = status.provider_id.clone() else { return status };
    // A machine was made: the zones tried without capacity no longer matter.
    status.zone_fallback = None;
    let same_machine = previous.and_then(|p| p.provider_id.as_deref()) == Some(id.as_str());
    if !same_machine || status.zone.is_none() {
        status.zone = Some(zone.to_string());
    }
    if !same_machine || status.image.is_none() {
        status.image = Some(image.to_string());
    }
    // A machine recorded before disks existed was made without any.
    if !same_machine {
        status.disks = Some(disks.to_vec());
    } else if status.disks.is_none() {
        status.disks = previous.and_then(|p| p.disks.clone()).or_else(|| Some(Vec::new()));
    }
    status
}

/// The round of zones tried without capacity after a create in `zone` found none (pure):
/// `round` (the current one, if any) with `zone` added, or a new round from `now` when there
/// is none, `zone` was already tried in it, or every `allowed` zone was (the round is over).
pub fn no_capacity_in(
    round: Option<&provisioning_crds::ZoneFallback>,
    zone: &str,
    allowed: &[String],
    now: k8s_openapi::jiff::Timestamp,
) -> provisioning_crds::ZoneFallback {
    match round {
        Some(r) if !r.tried.iter().any(|t| t == zone) && allowed.iter().any(|a| !r.tried.contains(a)) => {
            let mut next = r.clone();
            next.tried.push(zone.to_string());
            next
        }
        _ => provisioning_crds::ZoneFallback {
            tried: vec![zone.to_string()],
            since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        },
    }
}

/// One line describing a plan's field changes: "spec.plan cpu1-mem1g → cpu2-mem2g (update)".
pub fn describe_plan(plan: &Plan) -> String {
    let fields: Vec<String> = plan
        .changes
        .iter()
        .filter(|c| !c.field.is_empty())
        .map(|c| format!("{} {} → {} ({})", c.field, if c.from.is_empty() { "\"\"" } else { &c.from }, c.to, c.action.verb()))
        .collect();
    format!("{}: {}", fields.join(", "), plan.summary)
}

/// Records `plan` in `status` and sets `Drifted` from it: True (SpecChanged) while the spec
/// asks for changes to an existing machine, False once carried out (`applied`) or when the
/// spec was changed back. `lastTransitionTime` moves only on a flip.
pub fn record_plan(
    mut status: ServerStatus,
    previous: Option<&ServerStatus>,
    plan: &Plan,
    applied: Option<&Plan>,
    now: Timestamp,
) -> ServerStatus {
    status.plan = Some(plan.clone());
    if let Some(applied) = applied {
        status.last_applied_plan = Some(applied.id.clone());
    }
    let before = previous.and_then(|p| conditions::find(&p.conditions, condition::DRIFTED));
    let spec_drift = before.is_some_and(|c| c.status == "True" && c.reason == SPEC_CHANGED);
    let machine_change = plan.changes.iter().any(|c| !c.field.is_empty());
    let (value, reason, message) = if machine_change {
        ("True", SPEC_CHANGED, format!("the machine does not match the spec: {}", describe_plan(plan)))
    } else if let Some(applied) = applied.filter(|a| a.changes.iter().any(|c| !c.field.is_empty())) {
        ("False", REMEDIATED, format!("plan {} carried out: {}", applied.id, describe_plan(applied)))
    } else if spec_drift {
        ("False", SPEC_REVERTED, "the spec matches the machine again".to_string())
    } else {
        return status;
    };
    drift::set_drifted(status, previous, (value, reason, &message), now)
}

/// Records the machine's cost (what it would cost, before it exists).
pub fn record_cost(mut status: ServerStatus, cost: &ServerCost) -> ServerStatus {
    status.cost = Some(cost.clone());
    status
}

fn status_word(s: &str) -> Status {
    match s {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use provisioning_providers::{MachineState, ProviderId};

    use super::*;

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA3f0Y9v7tXb1cQm5r8HkS3y0x3oQeU1dN6q7YV1b2c3";
    const OTHER: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxq1n3ZzJ0m7c8o2V4r6t8y0u2w4e6q8s0d2f4h6j8k";

    fn observed(id: &str) -> Machine {
        Machine::Observed(ServerObservation {
            provider_id: ProviderId(id.into()),
            state: MachineState::Running,
            addresses: vec![],
            plan: "t3.small".into(),
            tags: Default::default(),
        })
    }

    fn after(previous: Option<&ServerStatus>, machine: Machine) -> ServerStatus {
        desired(StatusInput {
            previous,
            generation: Some(1),
            provider: Some("aws".into()),
            resolved_plan: Some("t3.small".into()),
            machine,
            summary: None,
            paused: false,
            now: Timestamp::from_second(1_700_000_000).unwrap_or_default(),
        })
    }

    #[test]
    fn host_key_is_recorded_once_per_machine() {
        // Before first contact nothing is recorded, and no key without a machine.
        let first = record_host_key(after(None, observed("aws://i-1")), None);
        assert_eq!(first.host_key, None);
        assert_eq!(record_host_key(after(None, Machine::None), Some(KEY)).host_key, None);
        // First contact: recorded.
        let pinned = record_host_key(after(Some(&first), observed("aws://i-1")), Some(KEY));
        assert_eq!(pinned.host_key.as_deref(), Some(KEY));
        // Kept when nothing new is known, and a recorded key is never written over.
        assert_eq!(record_host_key(after(Some(&pinned), Machine::Unchanged), None).host_key.as_deref(), Some(KEY));
        assert_eq!(record_host_key(after(Some(&pinned), observed("aws://i-1")), Some(OTHER)).host_key.as_deref(), Some(KEY));
        // No-op reconcile: identical status (no write).
        assert_eq!(record_host_key(after(Some(&pinned), observed("aws://i-1")), Some(KEY)), pinned);
        // A re-created machine has a key of its own: the old one goes, the new one is recorded.
        let recreated = after(Some(&pinned), observed("aws://i-2"));
        assert_eq!(recreated.host_key, None);
        assert_eq!(record_host_key(recreated, Some(OTHER)).host_key.as_deref(), Some(OTHER));
    }

    fn with_summary(previous: Option<&ServerStatus>, summary: Summary, paused: bool) -> ServerStatus {
        desired(StatusInput { summary: Some(summary), paused, ..input(previous) })
    }

    fn input(previous: Option<&ServerStatus>) -> StatusInput<'_> {
        StatusInput {
            previous,
            generation: Some(1),
            provider: None,
            resolved_plan: None,
            machine: Machine::Unchanged,
            summary: None,
            paused: false,
            now: Timestamp::from_second(1_700_000_000).unwrap_or_default(),
        }
    }

    #[test]
    fn the_create_checkpoint_is_the_leak_guard_until_a_machine_is_recorded() {
        let fresh = after(None, Machine::None);
        assert!(!create_started(Some(&fresh)) && !create_started(None), "no create started before the checkpoint");
        let creating = after(None, Machine::Creating);
        assert!(create_started(Some(&creating)));
        assert_eq!(creating.phase.as_deref(), Some(phase::PROVISIONING));
        assert_eq!(conditions::status_of(&creating.conditions, condition::RECONCILING), Some("True"), "kstatus: in progress");
        // Whatever a later status records (a failed call, a stall, a pause, a deletion), the
        // guard stays while no machine is recorded.
        let failed = with_summary(Some(&creating), Summary::progressing("Transient", "timeout"), false);
        let stalled = with_summary(Some(&failed), Summary::stalled("QuotaExceeded", "no quota"), false);
        let paused = with_summary(Some(&stalled), Summary::progressing("x", "y"), true);
        let deleting = super::super::deleting::deleting(Some(&paused), Some(1), "deleting".into(), Timestamp::now());
        for s in [&failed, &stalled, &paused, &deleting] {
            assert!(create_started(Some(s)), "guard lost in {:?}", s.conditions);
        }
        // The Server's next steps look the machine up by owner tag.
        let mut server = crate::testing::server("team-a", "web-0", serde_json::json!({"provider": "sim"}));
        server.status = Some(stalled.clone());
        assert_eq!(super::super::plan::next_step(&server), super::super::plan::Step::FindThenCreate);
        assert_eq!(super::super::plan::cleanup_step(&server), super::super::plan::CleanupStep::FindThenDelete);
        assert!(super::super::dereference::has_machine(&server), "a machine maybe made counts against maxServers");
        server.status = Some(fresh);
        assert_eq!(super::super::plan::next_step(&server), super::super::plan::Step::Create);
        assert_eq!(super::super::plan::cleanup_step(&server), super::super::plan::CleanupStep::Nothing);
        // Recorded: the guard is gone.
        let recorded = after(Some(&stalled), observed("aws://i-1"));
        assert!(!create_started(Some(&recorded)));
        assert_eq!(conditions::find(&recorded.conditions, condition::PROVISIONED).map(|c| c.reason.as_str()), Some("Running"));
    }
}
