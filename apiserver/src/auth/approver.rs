//! Who approved a plan: on objects of the `provisioning.dev` group, the API server records
//! the authenticated user that set `provisioning.dev/approve` in the server-owned annotation
//! `provisioning.dev/approved-by` (the controller names it in its Approved Event, the audit log
//! and the ChangeRecord). Clients cannot write that annotation: a value they set is refused,
//! one they drop is kept. It is stamped after managedFields are computed, so no field manager
//! owns it (the controller trusts it only then: on an API server that does not stamp it, a
//! client that wrote it owns it).

use serde_json::Value;

/// The annotation naming the approved plan.
pub const APPROVE: &str = "provisioning.dev/approve";
/// The server-owned annotation naming the user that set [`APPROVE`].
pub const APPROVED_BY: &str = "provisioning.dev/approved-by";
const GROUP: &str = "provisioning.dev";

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][key].as_str()
}

/// Refuses a client's own value of [`APPROVED_BY`] on a `provisioning.dev` object (`old`:
/// the stored object, `None` on create) and restores the stored one a client dropped.
/// `Err` carries the message of the refusal.
pub fn keep(group: &str, old: Option<&Value>, new: &mut Value) -> Result<(), String> {
    if group != GROUP {
        return Ok(());
    }
    let before = old.and_then(|o| annotation(o, APPROVED_BY)).map(str::to_string);
    match (annotation(new, APPROVED_BY), before) {
        (Some(now), before) if Some(now) != before.as_deref() => Err(format!(
            "metadata.annotations[{APPROVED_BY}]: set by the API server only (the user who set {APPROVE}); remove it from the request"
        )),
        (None, Some(before)) => {
            set(new, Some(&before));
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Stamps [`APPROVED_BY`] with `user` when the write changes [`APPROVE`] (removes it when
/// the approval is removed, or when the writer has no user: the server's own writes).
pub fn stamp(group: &str, old: Option<&Value>, new: &mut Value, user: Option<&str>) {
    if group != GROUP {
        return;
    }
    let before = old.and_then(|o| annotation(o, APPROVE));
    let now = annotation(new, APPROVE).map(str::trim).filter(|a| !a.is_empty());
    if before.map(str::trim).filter(|a| !a.is_empty()) == now {
        return;
    }
    let by = now.and(user).filter(|u| !u.is_empty()).map(str::to_string);
    set(new, by.as_deref());
}

fn set(obj: &mut Value, by: Option<&str>) {
    let Some(metadata) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    match by {
        Some(by) => {
            let annotations = metadata.entry("annotations").or_insert_with(|| Value::Object(Default::default()));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(APPROVED_BY.into(), Value::String(by.into()));
            }
        }
        None => {
            if let Some(a) = metadata.get_mut("annotations").and_then(Value::as_object_mut) {
                a.remove(APPROVED_BY);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(annotations: Value) -> Value {
        json!({"metadata": {"name": "x", "annotations": annotations}})
    }

    #[test]
    fn the_approver_is_the_user_of_the_request_that_set_the_approval() {
        let old = obj(json!({}));
        let mut new = obj(json!({APPROVE: "abc"}));
        stamp(GROUP, Some(&old), &mut new, Some("alice"));
        assert_eq!(annotation(&new, APPROVED_BY), Some("alice"));
        // Another write that leaves the approval alone keeps who approved it.
        let mut later = new.clone();
        stamp(GROUP, Some(&new), &mut later, Some("controller"));
        assert_eq!(annotation(&later, APPROVED_BY), Some("alice"));
        // A new approval by someone else; then the approval removed.
        let mut again = obj(json!({APPROVE: "def", APPROVED_BY: "alice"}));
        stamp(GROUP, Some(&later), &mut again, Some("bob"));
        assert_eq!(annotation(&again, APPROVED_BY), Some("bob"));
        let mut removed = obj(json!({APPROVED_BY: "bob"}));
        stamp(GROUP, Some(&again), &mut removed, Some("bob"));
        assert_eq!(annotation(&removed, APPROVED_BY), None);
        // Other groups are left alone.
        let mut core = obj(json!({APPROVE: "abc"}));
        stamp("", Some(&old), &mut core, Some("alice"));
        assert_eq!(annotation(&core, APPROVED_BY), None);
    }

    #[test]
    fn clients_cannot_write_the_approver() {
        let stored = obj(json!({APPROVE: "abc", APPROVED_BY: "alice"}));
        let mut forged = obj(json!({APPROVE: "abc", APPROVED_BY: "mallory"}));
        let refused = keep(GROUP, Some(&stored), &mut forged).expect_err("refused");
        assert!(refused.contains(APPROVED_BY) && refused.contains("API server only"), "{refused}");
        assert!(keep(GROUP, None, &mut obj(json!({APPROVED_BY: "mallory"}))).is_err(), "not on create either");
        // A client that drops it (kubectl replace of a manifest) keeps the stored value.
        let mut dropped = obj(json!({APPROVE: "abc"}));
        keep(GROUP, Some(&stored), &mut dropped).expect("kept");
        assert_eq!(annotation(&dropped, APPROVED_BY), Some("alice"));
        let mut same = stored.clone();
        assert!(keep(GROUP, Some(&stored), &mut same).is_ok());
    }
}
