//! Who approved a plan, and who changed the spec: on objects of the `provisioning.dev` group,
//! the API server records the authenticated user that set `provisioning.dev/approve` in the
//! server-owned annotation `provisioning.dev/approved-by` (the controller names it in its
//! Approved Event, the audit log and the ChangeRecord), and the user whose write made the
//! current generation in `provisioning.dev/changed-by` (the ChangeRecord's `changedByUser`). Clients cannot write that annotation: a value they set is refused,
//! one they drop is kept. It is stamped after managedFields are computed, so no field manager
//! owns it (the controller trusts it only then: on an API server that does not stamp it, a
//! client that wrote it owns it). Both name the identity that authenticated the request: a
//! user impersonating another (a ServiceAccount that may approve, say) is recorded as
//! itself, so impersonation never makes one person the changer and the approver.

use serde_json::Value;

/// The annotation naming the approved plan.
pub const APPROVE: &str = "provisioning.dev/approve";
/// The server-owned annotation naming the user that set [`APPROVE`].
pub const APPROVED_BY: &str = "provisioning.dev/approved-by";
/// The server-owned annotation naming the groups of the user that set [`APPROVE`] (comma
/// separated): what the controller's SubjectAccessReview of the approver needs besides the name.
pub const APPROVED_BY_GROUPS: &str = "provisioning.dev/approved-by-groups";
/// The server-owned annotation naming the user whose write made the current spec generation
/// (the ChangeRecord's `changedByUser`; field managers are names clients choose).
pub const CHANGED_BY: &str = "provisioning.dev/changed-by";
/// The server-owned annotations.
const SERVER_OWNED: [&str; 3] = [APPROVED_BY, APPROVED_BY_GROUPS, CHANGED_BY];
const GROUP: &str = "provisioning.dev";

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"][key].as_str()
}

/// Storage keys of the kinds a TaskServ reads through `configFrom`: the writer of their data
/// is recorded in [`CHANGED_BY`] too (a configFrom edit changes a plan as a spec edit does, so
/// under `requireDistinctApprover` its writer may not approve that plan either).
const CONFIG_SOURCES: [&str; 2] = ["/configmaps", "/secrets"];

/// The server-owned annotations of objects stored under `storage` (none for other kinds).
fn server_owned(storage: &str) -> &'static [&'static str] {
    if storage.split('/').next() == Some(GROUP) {
        &SERVER_OWNED
    } else if CONFIG_SOURCES.contains(&storage) {
        &SERVER_OWNED[2..]
    } else {
        &[]
    }
}

/// Refuses a client's own value of a server-owned annotation (`provisioning.dev` objects, and
/// [`CHANGED_BY`] of ConfigMaps and Secrets; `storage`: the kind's storage key, `old`: the
/// stored object, `None` on create) and restores the stored one a client dropped. `Err`
/// carries the message of the refusal.
pub fn keep(storage: &str, old: Option<&Value>, new: &mut Value) -> Result<(), String> {
    for &key in server_owned(storage) {
        let before = old.and_then(|o| annotation(o, key)).map(str::to_string);
        match (annotation(new, key), before) {
            (Some(now), before) if Some(now) != before.as_deref() => {
                let what = match key {
                    APPROVED_BY => format!("the user who set {APPROVE}"),
                    APPROVED_BY_GROUPS => format!("the groups of the user who set {APPROVE}"),
                    _ => "the user who changed the spec".into(),
                };
                return Err(format!("metadata.annotations[{key}]: set by the API server only ({what}); remove it from the request"));
            }
            (None, Some(before)) => set(new, key, Some(&before)),
            _ => {}
        }
    }
    Ok(())
}

/// Stamps [`APPROVED_BY`] with `user` (and [`APPROVED_BY_GROUPS`] with its `groups`) when the
/// write changes [`APPROVE`] (removes them when the approval is removed, or when the writer
/// has no user: the server's own writes), and [`CHANGED_BY`] when the write creates the
/// object or makes a new generation.
pub fn stamp(storage: &str, old: Option<&Value>, new: &mut Value, user: Option<&str>, groups: &[String]) {
    let user = user.filter(|u| !u.is_empty());
    if CONFIG_SOURCES.contains(&storage) {
        // A ConfigMap's or Secret's data written (or the object created): who wrote it.
        let data = |v: &Value| (v.get("data").cloned(), v.get("binaryData").cloned());
        if old.is_none_or(|o| data(o) != data(new)) {
            set(new, CHANGED_BY, user);
        }
        return;
    }
    if storage.split('/').next() != Some(GROUP) {
        return;
    }
    // A create, or a write that made a new generation (a spec change): who made it.
    let generation = |v: &Value| v["metadata"]["generation"].as_i64();
    if old.is_none_or(|o| generation(o) != generation(new)) {
        set(new, CHANGED_BY, user);
    }
    let before = old.and_then(|o| annotation(o, APPROVE));
    let now = annotation(new, APPROVE).map(str::trim).filter(|a| !a.is_empty());
    if before.map(str::trim).filter(|a| !a.is_empty()) == now {
        return;
    }
    let by = now.and(user).map(str::to_string);
    let by_groups = by.as_ref().map(|_| groups.join(","));
    set(new, APPROVED_BY, by.as_deref());
    set(new, APPROVED_BY_GROUPS, by_groups.as_deref());
}

/// The label naming the controller replica that owns an object in sharded mode.
pub const SHARD_LABEL: &str = "provisioning.dev/shard";

/// Keeps [`SHARD_LABEL`] on `provisioning.dev` objects the controller's: a writer that may not
/// write it (`may_write`: the exempt identities — the controller, `system:masters`) cannot set,
/// change or remove it (a value it drops is restored), so a tenant cannot move its objects
/// between replicas and have two act on one.
pub fn keep_shard_label(storage: &str, old: Option<&Value>, new: &mut Value, may_write: bool) -> Result<(), String> {
    if may_write || storage.split('/').next() != Some(GROUP) {
        return Ok(());
    }
    let label = |v: &Value| v["metadata"]["labels"][SHARD_LABEL].as_str().map(str::to_string);
    let before = old.and_then(label);
    match (label(new), before) {
        (Some(now), before) if Some(&now) != before.as_ref() => Err(format!(
            "metadata.labels[{SHARD_LABEL}]: set by the controller only (the replica that owns the object); remove it from the request"
        )),
        (None, Some(before)) => {
            if let Some(md) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = md.entry("labels").or_insert_with(|| Value::Object(Default::default()));
                if let Some(l) = labels.as_object_mut() {
                    l.insert(SHARD_LABEL.into(), Value::String(before));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn set(obj: &mut Value, key: &str, by: Option<&str>) {
    let Some(metadata) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    match by {
        Some(by) => {
            let annotations = metadata.entry("annotations").or_insert_with(|| Value::Object(Default::default()));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(key.into(), Value::String(by.into()));
            }
        }
        None => {
            if let Some(a) = metadata.get_mut("annotations").and_then(Value::as_object_mut) {
                a.remove(key);
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
        stamp(GROUP, Some(&old), &mut new, Some("alice"), &["team-a".into(), "system:authenticated".into()]);
        assert_eq!(annotation(&new, APPROVED_BY), Some("alice"));
        assert_eq!(annotation(&new, APPROVED_BY_GROUPS), Some("team-a,system:authenticated"));
        // Another write that leaves the approval alone keeps who approved it.
        let mut later = new.clone();
        stamp(GROUP, Some(&new), &mut later, Some("controller"), &[]);
        assert_eq!(annotation(&later, APPROVED_BY), Some("alice"));
        // A new approval by someone else; then the approval removed.
        let mut again = obj(json!({APPROVE: "def", APPROVED_BY: "alice"}));
        stamp(GROUP, Some(&later), &mut again, Some("bob"), &[]);
        assert_eq!(annotation(&again, APPROVED_BY), Some("bob"));
        let mut removed = obj(json!({APPROVED_BY: "bob"}));
        stamp(GROUP, Some(&again), &mut removed, Some("bob"), &[]);
        assert_eq!(annotation(&removed, APPROVED_BY), None);
        assert_eq!(annotation(&removed, APPROVED_BY_GROUPS), None);
        // Other groups are left alone.
        let mut core = obj(json!({APPROVE: "abc"}));
        stamp("", Some(&old), &mut core, Some("alice"), &[]);
        assert_eq!(annotation(&core, APPROVED_BY), None);
    }

    #[test]
    fn the_spec_changer_is_the_user_of_the_write_that_made_the_generation() {
        let at = |g: i64, annotations: Value| json!({"metadata": {"name": "x", "generation": g, "annotations": annotations}});
        let mut created = at(1, json!({}));
        stamp(GROUP, None, &mut created, Some("alice"), &[]);
        assert_eq!(annotation(&created, CHANGED_BY), Some("alice"));
        // A metadata-only write (same generation) by someone else keeps it; a spec change does not.
        let mut labelled = at(1, json!({CHANGED_BY: "alice"}));
        stamp(GROUP, Some(&created), &mut labelled, Some("bob"), &[]);
        assert_eq!(annotation(&labelled, CHANGED_BY), Some("alice"));
        let mut changed = at(2, json!({CHANGED_BY: "alice"}));
        stamp(GROUP, Some(&labelled), &mut changed, Some("bob"), &[]);
        assert_eq!(annotation(&changed, CHANGED_BY), Some("bob"));
        // Clients cannot write it.
        let mut forged = at(2, json!({CHANGED_BY: "mallory"}));
        assert!(keep(GROUP, Some(&changed), &mut forged).is_err_and(|e| e.contains(CHANGED_BY)));
    }

    #[test]
    fn clients_cannot_write_the_approver() {
        let stored = obj(json!({APPROVE: "abc", APPROVED_BY: "alice"}));
        let mut forged = obj(json!({APPROVE: "abc", APPROVED_BY: "mallory"}));
        let refused = keep(GROUP, Some(&stored), &mut forged).expect_err("refused");
        assert!(refused.contains(APPROVED_BY) && refused.contains("API server only"), "{refused}");
        assert!(keep(GROUP, None, &mut obj(json!({APPROVED_BY: "mallory"}))).is_err(), "not on create either");
        let mut groups = obj(json!({APPROVE: "abc", APPROVED_BY: "alice", APPROVED_BY_GROUPS: "system:masters"}));
        assert!(keep(GROUP, Some(&stored), &mut groups).is_err_and(|e| e.contains(APPROVED_BY_GROUPS)), "nor the groups");
        // A client that drops it (kubectl replace of a manifest) keeps the stored value.
        let mut dropped = obj(json!({APPROVE: "abc"}));
        keep(GROUP, Some(&stored), &mut dropped).expect("kept");
        assert_eq!(annotation(&dropped, APPROVED_BY), Some("alice"));
        let mut same = stored.clone();
        assert!(keep(GROUP, Some(&stored), &mut same).is_ok());
    }
    #[test]
    fn the_writer_of_a_configmaps_or_secrets_data_is_recorded() {
        let mut created = json!({"metadata": {"name": "cfg"}, "data": {"a": "1"}});
        stamp("/configmaps", None, &mut created, Some("alice"), &[]);
        assert_eq!(annotation(&created, CHANGED_BY), Some("alice"));
        let mut labelled = created.clone();
        labelled["metadata"]["labels"] = json!({"x": "y"});
        stamp("/configmaps", Some(&created), &mut labelled, Some("bob"), &[]);
        assert_eq!(annotation(&labelled, CHANGED_BY), Some("alice"), "a label is not the data");
        let mut changed = labelled.clone();
        changed["data"]["a"] = json!("2");
        stamp("/configmaps", Some(&labelled), &mut changed, Some("bob"), &[]);
        assert_eq!(annotation(&changed, CHANGED_BY), Some("bob"));
        let mut secret = json!({"metadata": {"name": "s"}, "data": {"p": "eA=="}});
        stamp("/secrets", None, &mut secret, Some("carol"), &[]);
        assert_eq!(annotation(&secret, CHANGED_BY), Some("carol"));
        let mut forged = changed.clone();
        forged["metadata"]["annotations"][CHANGED_BY] = json!("mallory");
        assert!(keep("/configmaps", Some(&changed), &mut forged).is_err_and(|e| e.contains(CHANGED_BY)));
        // Other kinds: nothing recorded, nothing refused; approved-by means nothing on a ConfigMap.
        let mut other = json!({"metadata": {"name": "p", "annotations": {CHANGED_BY: "x", APPROVED_BY: "y"}}});
        assert!(
            keep("/pods", None, &mut other).is_ok()
                && keep("/configmaps", None, &mut json!({"metadata": {"annotations": {APPROVED_BY: "y"}}})).is_ok()
        );
    }
    #[test]
    fn only_the_controller_writes_the_shard_label() {
        let stored = json!({"metadata": {"name": "web", "labels": {SHARD_LABEL: "r1"}}});
        let mut moved = json!({"metadata": {"name": "web", "labels": {SHARD_LABEL: "r2"}}});
        assert!(keep_shard_label(GROUP, Some(&stored), &mut moved, false).is_err_and(|e| e.contains(SHARD_LABEL)));
        assert!(keep_shard_label(GROUP, None, &mut moved.clone(), false).is_err(), "not on create either");
        let mut dropped = json!({"metadata": {"name": "web"}});
        keep_shard_label(GROUP, Some(&stored), &mut dropped, false).expect("restored");
        assert_eq!(dropped["metadata"]["labels"][SHARD_LABEL], "r1");
        assert!(keep_shard_label(GROUP, Some(&stored), &mut moved, true).is_ok(), "the controller moves it");
        assert!(keep_shard_label("/configmaps", None, &mut moved, false).is_ok(), "other kinds are not ours");
    }
}
