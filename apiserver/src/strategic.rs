//! Strategic merge patch for built-in kinds (what `kubectl apply`, `edit` and `patch` send
//! for them), driven by the schema's `x-kubernetes-patch-strategy` and
//! `x-kubernetes-patch-merge-key`, as apimachinery's strategicpatch does with Go struct tags:
//! lists marked `merge` are merged per merge key (or as a set for primitives), others replaced;
//! `null` deletes; the directives `$patch` (replace/delete), `$retainKeys`,
//! `$setElementOrder/FIELD` and `$deleteFromPrimitiveList/FIELD` are honoured and never stored.

use serde_json::{Map, Value};

const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies `patch` to `target`; `schema` is the kind's self-contained schema (none: plain
/// merge semantics, directives removed).
pub fn patch(target: &mut Value, patch: &Value, schema: Option<&Value>) {
    let large =
        crate::apply::larger_than(target, crate::apply::OFFLOAD_NODES) || crate::apply::larger_than(patch, crate::apply::OFFLOAD_NODES);
    crate::apply::off_the_workers(large, || merge_value(target, patch, schema));
}

fn child<'a>(schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties").and_then(|p| p.get(key)).or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

fn is_directive(k: &str) -> bool {
    k == "$patch" || k == "$retainKeys" || k.starts_with(SET_ORDER) || k.starts_with(DELETE_PRIMITIVE)
}

/// A patch value with every directive removed (for values that replace or are added whole).
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().filter(|(k, _)| !is_directive(k)).map(|(k, x)| (k.clone(), clean(x))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(clean).collect()),
        other => other.clone(),
    }
}

fn merge_value(target: &mut Value, patch: &Value, schema: Option<&Value>) {
    let Some(pm) = patch.as_object() else {
        *target = clean(patch);
        return;
    };
    match pm.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = clean(patch);
            return;
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(tm) = target.as_object_mut() else { return };
    for (k, pv) in pm {
        if let Some(field) = k.strip_prefix(DELETE_PRIMITIVE) {
            if let Some(arr) = tm.get_mut(field).and_then(Value::as_array_mut) {
                let gone: std::collections::HashSet<String> = pv.as_array().into_iter().flatten().map(Value::to_string).collect();
                arr.retain(|x| !gone.contains(&x.to_string()));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        if pv.is_null() {
            tm.remove(k);
            continue;
        }
        let cs = child(schema, k);
        match (tm.get_mut(k), pv) {
            (Some(tv), Value::Object(_)) if tv.is_object() => merge_value(tv, pv, cs),
            (Some(tv), Value::Array(pa)) if tv.is_array() && merges(cs) => merge_list(tv, pa, cs),
            _ => {
                tm.insert(k.clone(), clean(pv));
            }
        }
    }
    // Order after the merge, as the client listed it.
    for (k, order) in pm {
        let Some(field) = k.strip_prefix(SET_ORDER) else { continue };
        let key = merge_key(child(schema, field));
        if let (Some(arr), Some(order)) = (tm.get_mut(field).and_then(Value::as_array_mut), order.as_array()) {
            reorder(arr, order, key.as_deref());
        }
    }
    if let Some(keep) = pm.get("$retainKeys").and_then(Value::as_array) {
        // A set: a patch may list half a million keys for an object of 150k (a list scanned per
        // key took minutes).
        let keep: std::collections::HashSet<&str> = keep.iter().filter_map(Value::as_str).collect();
        tm.retain(|k, _| keep.contains(k.as_str()));
    }
}

fn merges(schema: Option<&Value>) -> bool {
    schema.and_then(|s| s.get("x-kubernetes-patch-strategy")).and_then(Value::as_str).is_some_and(|s| s.split(',').any(|p| p == "merge"))
}

fn merge_key(schema: Option<&Value>) -> Option<String> {
    schema?.get("x-kubernetes-patch-merge-key")?.as_str().map(str::to_string)
}

/// Merges `patch` items into the list by merge key (primitives as a set). Items are found
/// through a hash of their keys built once, so a patch of n items on a list of m costs
/// O(n + m), not O(n·m) (lists run to thousands of items in a 3 MiB body).
fn merge_list(target: &mut Value, patch: &[Value], schema: Option<&Value>) {
    let key = merge_key(schema);
    let item_schema = schema.and_then(|s| s.get("items"));
    let Some(arr) = target.as_array_mut() else { return };
    let ident = |v: &Value| key.as_ref().and_then(|k| v.get(k)).map(Value::to_string);
    // Positions of the live items by key, first first (a scan finds the first).
    let mut by_key: std::collections::HashMap<String, std::collections::VecDeque<usize>> = std::collections::HashMap::new();
    let mut members: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in arr.iter().enumerate() {
        if let Some(k) = ident(item) {
            by_key.entry(k).or_default().push_back(i);
        }
        members.insert(item.to_string());
    }
    // Deleted items are dropped at the end, so positions stay valid meanwhile.
    let mut deleted = vec![false; arr.len()];
    for pi in patch {
        match (&key, pi) {
            (Some(key), Value::Object(pm)) => {
                let kv = pm.get(key).map(Value::to_string);
                let pos = kv.as_ref().and_then(|kv| by_key.get(kv)).and_then(|q| q.front().copied());
                match (pm.get("$patch").and_then(Value::as_str), pos) {
                    (Some("delete"), Some(i)) => {
                        deleted[i] = true;
                        // A later item with the same key is found next, as a scan would.
                        if let Some(q) = kv.as_ref().and_then(|kv| by_key.get_mut(kv)) {
                            q.pop_front();
                        }
                    }
                    (Some("delete"), None) => {}
                    (Some("replace"), Some(i)) => arr[i] = clean(pi),
                    (_, Some(i)) => merge_value(&mut arr[i], pi, item_schema),
                    (_, None) => {
                        arr.push(clean(pi));
                        deleted.push(false);
                        if let Some(kv) = kv {
                            by_key.entry(kv).or_default().push_back(arr.len() - 1);
                        }
                    }
                }
            }
            // Primitive items of a merge list form a set.
            _ => {
                let v = clean(pi);
                if members.insert(v.to_string()) {
                    arr.push(v);
                    deleted.push(false);
                }
            }
        }
    }
    if deleted.iter().any(|d| *d) {
        let mut i = 0;
        arr.retain(|_| {
            i += 1;
            !deleted[i - 1]
        });
    }
}

/// Puts the items named in `order` first, in that order; the others keep their order after them.
fn reorder(arr: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let mut positions: std::collections::HashMap<String, std::collections::VecDeque<usize>> = std::collections::HashMap::new();
    for (i, item) in arr.iter().enumerate() {
        positions.entry(ident_of(item, key)).or_default().push_back(i);
    }
    let mut items: Vec<Option<Value>> = std::mem::take(arr).into_iter().map(Some).collect();
    for w in order {
        if let Some(i) = positions.get_mut(&ident_of(w, key)).and_then(std::collections::VecDeque::pop_front)
            && let Some(item) = items[i].take()
        {
            arr.push(item);
        }
    }
    arr.extend(items.into_iter().flatten());
}

/// The identity `reorder` matches list items and `$setElementOrder` entries by.
fn ident_of(w: &Value, key: Option<&str>) -> String {
    match key {
        Some(k) => w.get(k).cloned().unwrap_or(Value::Null).to_string(),
        None => w.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn many_retain_keys_on_a_large_map_are_linear() {
        // The review's case: 157k keys stored, 520k `$retainKeys` (3 MiB of patch), none of them
        // kept. A list scanned per key made 8·10^10 comparisons (265 s measured); a set takes
        // well under a second, so 10 s is a wide margin.
        let data: Map<String, Value> = (0..157_000).map(|i| (format!("k{i}"), json!(""))).collect();
        let target = json!({"data": data});
        let patch_body = json!({"data": {"$retainKeys": vec![json!("___"); 520_000]}});
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut target = target;
            merge_value(&mut target, &patch_body, None);
            let _ = tx.send(target["data"].as_object().map(Map::len));
        });
        let left = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(left, Ok(Some(0)), "the patch did not finish within 10 s");
    }

    #[test]
    fn merges_containers_by_name_and_honours_directives() {
        let schema = crate::builtin_schemas::structural("apps", "v1", "Deployment");
        let mut d = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "ports": [{"containerPort": 80, "protocol": "TCP"}]},
            {"name": "b", "image": "b:1"}]}}}});
        let p = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "a", "image": "a:2"}, {"name": "c", "$patch": "delete"}]}}}});
        patch(&mut d, &p, schema.as_ref());
        let cs = &d["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0]["name"], "b");
        assert_eq!(cs[1]["image"], "a:2");
        assert_eq!(cs[1]["ports"][0]["containerPort"], 80, "merge kept the untouched fields");
        let p = json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}}});
        patch(&mut d, &p, schema.as_ref());
        assert_eq!(d["spec"]["template"]["spec"]["containers"].as_array().map(Vec::len), Some(1));
        // A list without a merge strategy (args) is replaced; null removes.
        let p = json!({"spec": {"replicas": null, "template": {"spec": {"containers": [{"name": "a", "args": ["x"]}]}}}});
        patch(&mut d, &p, schema.as_ref());
        assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["args"], json!(["x"]));
        assert!(!d.to_string().contains('$'));
    }

    /// A patch of 20,000 keyed items (and as many set members and ordered entries) on lists
    /// as long: hashed once, it takes well under the deadline; a scan per item took minutes.
    #[test]
    fn long_lists_merge_in_linear_time() {
        let schema = json!({"type": "object", "properties": {
            "items": {"type": "array", "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": "name",
                "items": {"type": "object"}},
            "tags": {"type": "array", "x-kubernetes-patch-strategy": "merge", "items": {"type": "string"}}}});
        let n = 20_000;
        let mut d = json!({
            "items": (0..n).map(|i| json!({"name": format!("i{i}"), "v": 0})).collect::<Vec<_>>(),
            "tags": (0..n).map(|i| json!(format!("t{i}"))).collect::<Vec<_>>()});
        let mut changes: Vec<Value> = (0..n).map(|i| json!({"name": format!("i{i}"), "v": 1})).collect();
        changes.push(json!({"name": "i0", "$patch": "delete"}));
        changes.push(json!({"name": "new", "v": 2}));
        let p = json!({
            "items": changes,
            "$setElementOrder/items": (0..n).rev().map(|i| json!({"name": format!("i{i}")})).collect::<Vec<_>>(),
            "tags": (0..n).map(|i| json!(format!("t{}", i + n / 2))).collect::<Vec<_>>(),
            "$deleteFromPrimitiveList/tags": (0..n / 2).map(|i| json!(format!("t{i}"))).collect::<Vec<_>>()});
        let started = std::time::Instant::now();
        patch(&mut d, &p, Some(&schema));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
        let items = d["items"].as_array().map(Vec::len);
        assert_eq!(items, Some(n), "one deleted, one added");
        assert_eq!(d["items"][0], json!({"name": format!("i{}", n - 1), "v": 1}), "in $setElementOrder's order");
        assert_eq!(d["items"][n - 1], json!({"name": "new", "v": 2}), "unordered items after");
        assert_eq!(d["tags"].as_array().map(Vec::len), Some(n), "half deleted, half added");
        assert_eq!(d["tags"][0], "t10000");
    }
}
