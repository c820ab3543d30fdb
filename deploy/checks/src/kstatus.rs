//! A kstatus-style judge: what Flux's `wait`, `kubectl wait`-style tooling and other
//! kstatus consumers conclude from the status our controller writes.
//!
//! Rules, first match wins:
//! 1. `metadata.deletionTimestamp` set → `Terminating`;
//! 2. `status.observedGeneration` missing or behind `metadata.generation` → `InProgress`
//!    (kstatus itself skips the check when the field is missing; our controller always writes
//!    it, so a missing one means the controller has not looked yet);
//! 3. condition `Reconciling=True` → `InProgress`;
//! 4. condition `Stalled=True` → `Failed`;
//! 5. otherwise → `Current`.
//!
//! Rule 5 is why the controller must set `Reconciling=True` from the first visit until the
//! work is done: without it, a dependent would be applied too early.

use serde_json::Value;

/// The judge's verdict (kstatus' status names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum KStatus {
    InProgress,
    Failed,
    Current,
    Terminating,
}

/// The verdict and the condition message that explains it, when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub status: KStatus,
    pub message: String,
}

/// The condition of type `condition_type` in `status.conditions`, if any.
pub fn condition<'a>(obj: &'a Value, condition_type: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?.as_array()?.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(condition_type))
}

fn condition_is_true(obj: &Value, condition_type: &str) -> bool {
    condition(obj, condition_type).and_then(|c| c.get("status")).and_then(Value::as_str) == Some("True")
}

fn condition_message(obj: &Value, condition_type: &str) -> String {
    condition(obj, condition_type).and_then(|c| c.get("message")).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// An integer that may have been serialized as a number or a numeric string.
fn as_integer(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

/// Judges one object snapshot.
pub fn judge(obj: &Value) -> Judgement {
    if obj.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null()) {
        return Judgement { status: KStatus::Terminating, message: "being deleted".into() };
    }
    let generation = obj.pointer("/metadata/generation").and_then(as_integer);
    let observed = obj.pointer("/status/observedGeneration").and_then(as_integer);
    match (generation, observed) {
        (_, None) => {
            return Judgement { status: KStatus::InProgress, message: "status.observedGeneration not written yet".into() };
        }
        (Some(generation), Some(observed)) if observed < generation => {
            return Judgement {
                status: KStatus::InProgress,
                message: format!("observedGeneration {observed} behind generation {generation}"),
            };
        }
        _ => {}
    }
    if condition_is_true(obj, "Reconciling") {
        return Judgement { status: KStatus::InProgress, message: condition_message(obj, "Reconciling") };
    }
    if condition_is_true(obj, "Stalled") {
        return Judgement { status: KStatus::Failed, message: condition_message(obj, "Stalled") };
    }
    Judgement { status: KStatus::Current, message: condition_message(obj, "Ready") }
}

/// Whether the controller says the work is done: `Ready=True` for the current generation.
pub fn is_done(obj: &Value) -> bool {
    let generation = obj.pointer("/metadata/generation").and_then(as_integer);
    let observed = obj.pointer("/status/observedGeneration").and_then(as_integer);
    condition_is_true(obj, "Ready") && generation.is_some() && generation == observed
}

/// Checks a recorded life (status snapshots in the order they were written): every snapshot
/// before the first one that [`is_done`] must be judged `InProgress` — `Current` there is a
/// dependent applied too early. Returns the verdicts, in order.
pub fn check_in_progress_until_done(life: &[Value]) -> Result<Vec<KStatus>, String> {
    let mut verdicts = Vec::new();
    for (i, obj) in life.iter().enumerate() {
        let judgement = judge(obj);
        verdicts.push(judgement.status);
        if is_done(obj) {
            break;
        }
        if judgement.status != KStatus::InProgress {
            return Err(format!(
                "snapshot {i} is not done yet but judged {:?} ({}): {}",
                judgement.status, judgement.message, obj["status"]
            ));
        }
    }
    Ok(verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with_status(generation: i64, status: Value) -> Value {
        json!({"metadata": {"name": "web-1", "generation": generation}, "status": status})
    }

    fn cond(t: &str, s: &str, message: &str) -> Value {
        json!({"type": t, "status": s, "reason": "Test", "message": message})
    }

    #[test]
    fn deletion_wins_over_everything() {
        let mut obj = with_status(1, json!({"observedGeneration": 1, "conditions": [cond("Ready", "True", "")]}));
        obj["metadata"]["deletionTimestamp"] = json!("2024-05-01T12:00:00Z");
        assert_eq!(judge(&obj).status, KStatus::Terminating);
    }

    #[test]
    fn no_status_is_in_progress_not_current() {
        let obj = json!({"metadata": {"name": "web-1", "generation": 1}});
        assert_eq!(judge(&obj).status, KStatus::InProgress);
    }

    #[test]
    fn observed_generation_behind_is_in_progress_even_when_ready() {
        let obj = with_status(2, json!({"observedGeneration": 1, "conditions": [cond("Ready", "True", "ok")]}));
        assert_eq!(judge(&obj).status, KStatus::InProgress);
        let obj = with_status(2, json!({"observedGeneration": "1", "conditions": [cond("Ready", "True", "ok")]}));
        assert_eq!(judge(&obj).status, KStatus::InProgress);
    }

    #[test]
    fn reconciling_is_in_progress_and_wins_over_stalled() {
        let obj = with_status(
            1,
            json!({"observedGeneration": 1, "conditions": [
            cond("Reconciling", "True", "booting"), cond("Stalled", "True", "bad plan")]}),
        );
        assert_eq!(judge(&obj), Judgement { status: KStatus::InProgress, message: "booting".into() });
    }

    #[test]
    fn stalled_is_failed_with_its_message() {
        let obj = with_status(
            1,
            json!({"observedGeneration": 1, "conditions": [
            cond("Reconciling", "False", ""), cond("Stalled", "True", "bad plan")]}),
        );
        assert_eq!(judge(&obj), Judgement { status: KStatus::Failed, message: "bad plan".into() });
    }

    #[test]
    fn otherwise_current() {
        let obj = with_status(
            1,
            json!({"observedGeneration": 1, "conditions": [
            cond("Ready", "True", "running"), cond("Reconciling", "False", ""), cond("Stalled", "False", "")]}),
        );
        assert_eq!(judge(&obj), Judgement { status: KStatus::Current, message: "running".into() });
    }

    #[test]
    fn a_life_is_in_progress_until_done() {
        let new = json!({"metadata": {"generation": 1}});
        let first = with_status(
            1,
            json!({"observedGeneration": 1, "conditions": [
            cond("Ready", "Unknown", ""), cond("Reconciling", "True", "first")]}),
        );
        let ready = with_status(
            1,
            json!({"observedGeneration": 1, "conditions": [
            cond("Ready", "True", "up"), cond("Reconciling", "False", "")]}),
        );
        let verdicts = check_in_progress_until_done(&[new.clone(), first.clone(), ready.clone()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(verdicts, [KStatus::InProgress, KStatus::InProgress, KStatus::Current]);
        // A controller that forgets Reconciling=True while working would be caught.
        let sloppy = with_status(1, json!({"observedGeneration": 1, "conditions": [cond("Ready", "False", "booting")]}));
        assert!(check_in_progress_until_done(&[new, sloppy, ready]).is_err());
    }

    #[test]
    fn malformed_conditions_do_not_panic() {
        let obj = with_status(1, json!({"observedGeneration": 1, "conditions": [{"type": "Ready"}, {"status": "True"}, 3, null]}));
        assert_eq!(judge(&obj).status, KStatus::Current);
        let obj = with_status(1, json!({"observedGeneration": 1, "conditions": "broken"}));
        assert_eq!(judge(&obj).status, KStatus::Current);
    }
}
