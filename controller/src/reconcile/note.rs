//! The events a visit publishes with its report ([`super::report`]), kept apart from the
//! skeleton so that what builds them (the approval gate, the kinds' steps) does not depend on
//! the skeleton that publishes them.

/// An event a visit publishes once its status is written ([`super::report`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Warning (else Normal).
    pub warning: bool,
    /// The event's reason.
    pub reason: String,
    /// The event's action.
    pub action: &'static str,
    /// The event's note.
    pub note: String,
    /// An approval coming into force (the plan id): [`super::report`] names who approved it and
    /// records it in the audit log ([`crate::approval::approved`]).
    pub approved_plan: Option<String>,
}

impl Note {
    /// A Warning event.
    pub fn warning(reason: &str, action: &'static str, note: impl Into<String>) -> Self {
        Note { warning: true, reason: reason.to_string(), action, note: note.into(), approved_plan: None }
    }

    /// A Normal event.
    pub fn normal(reason: &str, action: &'static str, note: impl Into<String>) -> Self {
        Note { warning: false, reason: reason.to_string(), action, note: note.into(), approved_plan: None }
    }

    /// A planner's event, published under `action`.
    pub fn planned(e: crate::planning::PlannedEvent, action: &'static str) -> Self {
        Note { warning: e.warning, reason: e.reason, action, note: e.note, approved_plan: None }
    }
}
