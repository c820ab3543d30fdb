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
    merge_value(target, patch, schema);
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
                let gone: Vec<&Value> = pv.as_array().into_iter().flatten().collect();
                arr.retain(|x| !gone.contains(&x));
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
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        tm.retain(|k, _| keep.contains(&k.as_str()));
    }
}

fn merges(schema: Option<&Value>) -> bool {
    schema.and_then(|s| s.get("x-kubernetes-patch-strategy")).and_then(Value::as_str).is_some_and(|s| s.split(',').any(|p| p == "merge"))
}

fn merge_key(schema: Option<&Value>) -> Option<String> {
    schema?.get("x-kubernetes-patch-merge-key")?.as_str().map(str::to_string)
}

fn merge_list(target: &mut Value, patch: &[Value], schema: Option<&Value>) {
    let key = merge_key(schema);
    let item_schema = schema.and_then(|s| s.get("items"));
    let Some(arr) = target.as_array_mut() else { return };
    for pi in patch {
        match (&key, pi) {
            (Some(key), Value::Object(pm)) => {
                let kv = pm.get(key);
                let pos = kv.and_then(|kv| arr.iter().position(|ti| ti.get(key) == Some(kv)));
                match (pm.get("$patch").and_then(Value::as_str), pos) {
                    (Some("delete"), Some(i)) => {
                        arr.remove(i);
                    }
                    (Some("delete"), None) => {}
                    (Some("replace"), Some(i)) => arr[i] = clean(pi),
                    (_, Some(i)) => merge_value(&mut arr[i], pi, item_schema),
                    (_, None) => arr.push(clean(pi)),
                }
            }
            // Primitive items of a merge list form a set.
            _ => {
                let v = clean(pi);
                if !arr.contains(&v) {
                    arr.push(v);
                }
            }
        }
    }
}

/// Puts the items named in `order` first, in that order; the others keep their order after them.
fn reorder(arr: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let ident = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let wanted: Vec<Value> = order.iter().map(ident).collect();
    let mut items = std::mem::take(arr);
    for w in &wanted {
        if let Some(i) = items.iter().position(|x| &ident(x) == w) {
            arr.push(items.remove(i));
        }
    }
    arr.append(&mut items);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
