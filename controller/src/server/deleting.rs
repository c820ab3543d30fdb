//! Status (pure) of a Server being deleted: never `Ready=True`/`Running` while its machine
//! is being deleted (kubectl shows `Deleting`, `kubectl wait --for=condition=Ready` does not
//! pass, a parent's roll-up counts it as in progress).

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{ServerStatus, condition};

use crate::conditions::{self, DesiredCondition, Status, Summary};

/// The status of a Server whose machine is being deleted: phase `Deleting`, Ready=False and
/// Reconciling=True with reason `Deleting`; other conditions are kept as they are.
pub fn deleting(previous: Option<&ServerStatus>, generation: Option<i64>, message: String, now: Timestamp) -> ServerStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.phase = Some(super::status::phase::DELETING.to_string());
    let summary_types = [condition::READY, condition::RECONCILING, condition::STALLED];
    let mut wanted = Summary::progressing("Deleting", message).conditions();
    wanted.extend(status.conditions.iter().filter(|c| !summary_types.contains(&c.type_.as_str())).map(|c| {
        let s = match c.status.as_str() {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        };
        DesiredCondition::new(&c.type_, s, &c.reason, c.message.clone())
    }));
    status.conditions = conditions::merge(&status.conditions, &wanted, generation, now);
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_server_being_deleted_is_not_ready() {
        let running: ServerStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "providerID": "sim://m-1",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Running", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Reconciling", "status": "False", "reason": "Idle", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Stalled", "status": "False", "reason": "NotStalled", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Provisioned", "status": "True", "reason": "Running", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }))
        .expect("fixture");
        let status = deleting(Some(&running), Some(1), "deleting machine sim://m-1".into(), Timestamp::now());
        assert_eq!(status.phase.as_deref(), Some("Deleting"));
        assert_eq!(conditions::status_of(&status.conditions, condition::READY), Some("False"));
        assert_eq!(conditions::find(&status.conditions, condition::READY).map(|c| c.reason.as_str()), Some("Deleting"));
        assert_eq!(conditions::status_of(&status.conditions, condition::RECONCILING), Some("True"));
        assert_eq!(conditions::status_of(&status.conditions, condition::PROVISIONED), Some("True"));
        assert_eq!(status.provider_id.as_deref(), Some("sim://m-1"));
    }
}
