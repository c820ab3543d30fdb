//! kstatus-compliant condition helpers (pure).
//!
//! A reconciler describes where its object stands with a [`Summary`] (plus kind-specific
//! conditions such as `Provisioned`), and [`merge`] turns that into the `status.conditions`
//! list: `lastTransitionTime` is kept from the previous list unless the status flipped, so a
//! no-op reconcile yields an identical list and therefore no write.
//!
//! TaskServ/Cluster planners: build `Vec<DesiredCondition>` with [`Summary::worded`] (their
//! own [`Wording`] of the quiet Reconciling/Stalled conditions, kept as they were on the wire)
//! plus `DesiredCondition::new(condition::INSTALLED, ..)` etc., then call [`merge`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use provisioning_crds::condition;

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// As written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
    /// `True` when `b`, else `False`.
    pub fn from_bool(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// A condition as a reconciler wants it, before timestamps are merged in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type (see `provisioning_crds::condition`).
    pub type_: String,
    /// Its status.
    pub status: Status,
    /// CamelCase, stable reason.
    pub reason: String,
    /// Human message naming the blocking thing.
    pub message: String,
}

impl DesiredCondition {
    /// A condition.
    pub fn new(type_: &str, status: Status, reason: &str, message: impl Into<String>) -> Self {
        DesiredCondition { type_: type_.to_string(), status, reason: reason.to_string(), message: message.into() }
    }
}

/// Where an object stands, in kstatus terms. Produces `Ready`, `Reconciling` and `Stalled`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Summary {
    /// Nothing known yet (first visit before any work).
    Unknown {
        /// Reason, e.g. `Initializing`.
        reason: String,
        /// Message.
        message: String,
    },
    /// Work in flight: Ready=False, Reconciling=True, Stalled=False.
    Progressing {
        /// Reason, e.g. `Provisioning`.
        reason: String,
        /// What is being waited for.
        message: String,
    },
    /// Done: Ready=True, Reconciling=False, Stalled=False.
    Ready {
        /// Reason, e.g. `Running`.
        reason: String,
        /// Confirmation for humans.
        message: String,
    },
    /// Blocked until spec/environment changes: Ready=False, Reconciling=False, Stalled=True.
    Stalled {
        /// Reason, e.g. `UnknownProvider`.
        reason: String,
        /// Exactly what is wrong.
        message: String,
    },
}

impl Summary {
    /// Work in flight.
    pub fn progressing(reason: &str, message: impl Into<String>) -> Self {
        Summary::Progressing { reason: reason.into(), message: message.into() }
    }
    /// Done.
    pub fn ready(reason: &str, message: impl Into<String>) -> Self {
        Summary::Ready { reason: reason.into(), message: message.into() }
    }
    /// Blocked.
    pub fn stalled(reason: &str, message: impl Into<String>) -> Self {
        Summary::Stalled { reason: reason.into(), message: message.into() }
    }
    /// Whether this is [`Summary::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Summary::Ready { .. })
    }

    /// The three kstatus conditions, Ready first.
    pub fn conditions(&self) -> Vec<DesiredCondition> {
        self.worded(&Wording::KSTATUS)
    }

    /// The three kstatus conditions, Ready first, with a kind's own words on the quiet side.
    pub fn worded(&self, w: &Wording) -> Vec<DesiredCondition> {
        use Status::*;
        let (ready, reconciling, stalled, reason, message) = match self {
            Summary::Unknown { reason, message } => (Unknown, True, False, reason, message),
            Summary::Progressing { reason, message } => (False, True, False, reason, message),
            Summary::Ready { reason, message } => (True, False, False, reason, message),
            Summary::Stalled { reason, message } => (False, False, True, reason, message),
        };
        let (rec_reason, rec_message) = match (reconciling, stalled) {
            (True, _) => (w.progressing_reason.unwrap_or(reason.as_str()), message.as_str()),
            (_, True) => w.idle_when_stalled,
            _ => w.idle,
        };
        let (st_reason, st_message) = if stalled == True { (reason.as_str(), message.as_str()) } else { w.not_stalled };
        vec![
            DesiredCondition::new(condition::READY, ready, reason, message.clone()),
            DesiredCondition::new(condition::RECONCILING, reconciling, rec_reason, rec_message),
            DesiredCondition::new(condition::STALLED, stalled, st_reason, st_message),
        ]
    }

    /// Ready=False with nothing in flight and nothing stalled: waiting for the outside world
    /// (no Server selected yet). Reconciling and Stalled are both quiet.
    pub fn waiting(reason: &str, message: impl Into<String>, w: &Wording) -> Vec<DesiredCondition> {
        vec![
            DesiredCondition::new(condition::READY, Status::False, reason, message),
            DesiredCondition::new(condition::RECONCILING, Status::False, w.idle.0, w.idle.1),
            DesiredCondition::new(condition::STALLED, Status::False, w.not_stalled.0, w.not_stalled.1),
        ]
    }
}

/// How a kind words the conditions of a [`Summary`] that are not the point: `(reason,
/// message)` of Reconciling=False and Stalled=False, and the reason of Reconciling=True. Kinds
/// keep the words they have always written, so nothing changes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wording {
    /// Reconciling=False while Ready (or waiting).
    pub idle: (&'static str, &'static str),
    /// Reconciling=False while Stalled.
    pub idle_when_stalled: (&'static str, &'static str),
    /// Stalled=False.
    pub not_stalled: (&'static str, &'static str),
    /// Reason of Reconciling=True; `None`: the summary's own reason.
    pub progressing_reason: Option<&'static str>,
}

impl Wording {
    /// Server and Workspace: `Idle`, `NotStalled`, empty messages.
    pub const KSTATUS: Wording =
        Wording { idle: ("Idle", ""), idle_when_stalled: ("Idle", ""), not_stalled: ("NotStalled", ""), progressing_reason: None };
}

/// Merges desired conditions into the previous list: the result holds exactly the desired
/// types, in the desired order; `lastTransitionTime` is the previous one unless the status
/// changed (then `now`); `observedGeneration` is set on each.
pub fn merge(previous: &[Condition], desired: &[DesiredCondition], generation: Option<i64>, now: Timestamp) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let last = previous
                .iter()
                .find(|c| c.type_ == d.type_)
                .filter(|c| c.status == d.status.as_str())
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: d.type_.clone(),
                status: d.status.as_str().to_string(),
                reason: d.reason.clone(),
                message: truncate(&d.message, 1024),
                observed_generation: generation,
                last_transition_time: last,
            }
        })
        .collect()
}

/// The conditions of a paused object: every current condition kept as it is, plus
/// `Paused=True` (used by kinds whose reconcile stops before any planning).
pub fn paused(previous: &[Condition], generation: Option<i64>, now: Timestamp) -> Vec<Condition> {
    let mut desired: Vec<DesiredCondition> = previous
        .iter()
        .filter(|c| c.type_ != provisioning_crds::condition::PAUSED)
        .map(|c| {
            let status = match c.status.as_str() {
                "True" => Status::True,
                "False" => Status::False,
                _ => Status::Unknown,
            };
            DesiredCondition::new(&c.type_, status, &c.reason, c.message.clone())
        })
        .collect();
    desired.push(DesiredCondition::new(
        provisioning_crds::condition::PAUSED,
        Status::True,
        "Paused",
        "provisioning.dev/paused is \"true\"",
    ));
    merge(previous, &desired, generation, now)
}

/// The status of condition `type_` in a list.
pub fn status_of<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    conditions.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

/// Whether condition `type_` is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    status_of(conditions, type_) == Some("True")
}

/// A condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Cuts a message to at most `max` bytes on a char boundary (API limit is 32 KiB; events 1 KiB).
pub fn truncate(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn paused_keeps_conditions_and_adds_paused_true() {
        let t0 = ts("2024-01-01T00:00:00Z");
        let t1 = ts("2024-01-01T00:05:00Z");
        let ready = merge(&[], &Summary::ready("Ready", "all good").conditions(), Some(2), t0);
        let paused = paused(&ready, Some(2), t1);
        assert_eq!(paused.len(), ready.len() + 1);
        for c in &ready {
            let kept = find(&paused, &c.type_).expect("kept");
            assert_eq!((kept.status.as_str(), kept.last_transition_time.0), (c.status.as_str(), t0), "{}", c.type_);
        }
        let p = find(&paused, "Paused").expect("Paused");
        assert_eq!((p.status.as_str(), p.reason.as_str(), p.last_transition_time.0), ("True", "Paused", t1));
        // Idempotent: pausing again changes nothing.
        assert_eq!(super::paused(&paused, Some(2), ts("2024-01-01T00:09:00Z")), paused);
    }

    #[test]
    fn transition_time_moves_only_on_flip() {
        let t0 = ts("2024-01-01T00:00:00Z");
        let t1 = ts("2024-01-01T00:05:00Z");
        let first = merge(&[], &Summary::progressing("Provisioning", "creating").conditions(), Some(1), t0);
        assert!(first.iter().all(|c| c.last_transition_time.0 == t0));
        // Same statuses, new message: times kept.
        let second = merge(&first, &Summary::progressing("Provisioning", "still creating").conditions(), Some(1), t1);
        assert!(second.iter().all(|c| c.last_transition_time.0 == t0));
        // Ready flips: Ready and Reconciling move, Stalled does not.
        let third = merge(&second, &Summary::ready("Running", "up").conditions(), Some(1), t1);
        assert_eq!(find(&third, "Ready").map(|c| c.last_transition_time.0), Some(t1));
        assert_eq!(find(&third, "Reconciling").map(|c| c.last_transition_time.0), Some(t1));
        assert_eq!(find(&third, "Stalled").map(|c| c.last_transition_time.0), Some(t0));
    }

    #[test]
    fn identical_input_gives_identical_output() {
        let t0 = ts("2024-01-01T00:00:00Z");
        let desired = Summary::stalled("UnknownProvider", "provider \"x\" is not defined").conditions();
        let a = merge(&[], &desired, Some(3), t0);
        let b = merge(&a, &desired, Some(3), ts("2025-01-01T00:00:00Z"));
        assert_eq!(a, b);
    }

    #[test]
    fn summaries_follow_kstatus() {
        let s = Summary::stalled("BadPlan", "no such plan").conditions();
        assert_eq!(s[0].status, Status::False);
        assert_eq!(s[1].status, Status::False);
        assert_eq!(s[2].status, Status::True);
        assert_eq!(s[2].message, "no such plan");
        let u = Summary::Unknown { reason: "Initializing".into(), message: String::new() }.conditions();
        assert_eq!(u[0].status, Status::Unknown);
    }

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate("ééé", 3), "é…");
    }
}
