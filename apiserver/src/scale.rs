//! The `/scale` subresource (`autoscaling/v1` Scale) of CRDs that declare
//! `subresources.scale` and of the built-in Deployments, ReplicaSets and StatefulSets.
//!
//! GET shows the object's replica counts as a Scale; PUT and PATCH of the Scale set only the
//! desired count at the spec path and go through the object's own update (validation,
//! admission, managedFields, watch events), with the Scale's resourceVersion as precondition.

use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, Cause};
use crate::handlers::{Core, WriteOptions};
use crate::patch::{self, PatchType};
use crate::registry::{ResourceType, ScalePaths};

/// Tries of a write without a resourceVersion precondition before a 409.
const RETRIES: usize = 16;

impl Core {
    /// GET `.../NAME/scale`.
    pub fn get_scale(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> ApiResult<Value> {
        let paths = paths(rt)?;
        let obj = self.convert(rt, self.get(rt, ns, name)?.value());
        Ok(scale_of(paths, &obj))
    }

    /// PUT `.../NAME/scale`: the body is a Scale; its `spec.replicas` is written.
    pub async fn update_scale(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        body: &Value,
        opts: &WriteOptions,
    ) -> ApiResult<Value> {
        check_scale_body(body, name)?;
        let want_rv = match body["metadata"]["resourceVersion"].as_str().filter(|s| !s.is_empty()) {
            Some(s) => Some(s.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?),
            None => None,
        };
        let replicas = replicas_of(body, name)?;
        for _ in 0..RETRIES {
            match self.write_replicas(rt, ns, name, replicas, want_rv, opts).await {
                Err(e) if e.code == 409 && e.reason == "Conflict" && want_rv.is_none() => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// PATCH `.../NAME/scale` (merge, JSON patch; strategic for built-in kinds, where it is
    /// the same as merge since a Scale has no lists).
    pub async fn patch_scale(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        kind: PatchType,
        patch_doc: &Value,
        opts: &WriteOptions,
    ) -> ApiResult<Value> {
        if kind == PatchType::Apply || (kind == PatchType::Strategic && rt.custom) {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json",
            ));
        }
        if kind != PatchType::Json && !patch_doc.is_object() {
            return Err(ApiError::bad_request("the patch must be a JSON object"));
        }
        let explicit_rv = kind != PatchType::Json && patch_doc["metadata"].get("resourceVersion").is_some_and(|v| !v.is_null());
        for _ in 0..RETRIES {
            let mut scale = self.get_scale(rt, ns, name)?;
            let read_rv = scale["metadata"]["resourceVersion"].clone();
            match kind {
                PatchType::Json => patch::json_patch(&mut scale, patch_doc)?,
                _ => patch::merge_patch(&mut scale, patch_doc),
            }
            // A JSON patch may test or replace the resourceVersion: it is a precondition then.
            let rv_changed = scale["metadata"]["resourceVersion"] != read_rv;
            match self.update_scale(rt, ns, name, &scale, opts).await {
                Err(e) if e.code == 409 && e.reason == "Conflict" && !explicit_rv && !rv_changed => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// One attempt: the stored object with `replicas` at the spec path, written as an update
    /// with the stored (or requested) resourceVersion as precondition.
    async fn write_replicas(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        replicas: i64,
        want_rv: Option<u64>,
        opts: &WriteOptions,
    ) -> ApiResult<Value> {
        let paths = paths(rt)?;
        let cur = self.get(rt, ns, name)?;
        if want_rv.is_some_and(|w| w != cur.rv) {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name));
        }
        let mut obj = self.convert(rt, cur.value());
        set_path(&mut obj, &paths.spec_replicas, json!(replicas))
            .ok_or_else(|| ApiError::internal(format!("specReplicasPath {} does not lead to an object field", paths.spec_replicas)))?;
        obj["metadata"]["resourceVersion"] = json!(cur.rv.to_string());
        let w = self.update(rt, ns, name, obj, false, opts).await?;
        Ok(scale_of(paths, &self.convert(rt, w.output.value())))
    }
}

fn paths(rt: &ResourceType) -> ApiResult<&ScalePaths> {
    rt.scale.as_ref().ok_or_else(ApiError::path_not_found)
}

/// The Scale an object shows.
pub fn scale_of(paths: &ScalePaths, obj: &Value) -> Value {
    let md = &obj["metadata"];
    let mut meta = json!({});
    for k in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = md.get(k).filter(|v| !v.is_null()) {
            meta[k] = v.clone();
        }
    }
    let spec_replicas = get_path(obj, &paths.spec_replicas).and_then(Value::as_i64).unwrap_or(0);
    let status_replicas = get_path(obj, &paths.status_replicas).and_then(Value::as_i64).unwrap_or(0);
    let mut status = json!({"replicas": status_replicas});
    if let Some(sel) = paths.label_selector.as_deref().and_then(|p| get_path(obj, p)).and_then(selector_string) {
        status["selector"] = json!(sel);
    }
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta, "spec": {"replicas": spec_replicas}, "status": status})
}

/// A selector as a string: as stored (a CRD's labelSelectorPath), or a LabelSelector object
/// written in label-selector syntax (`app=d1,tier in (a,b)`).
fn selector_string(v: &Value) -> Option<String> {
    if let Some(s) = v.as_str() {
        return Some(s.to_string());
    }
    let obj = v.as_object()?;
    let mut parts: Vec<String> = vec![];
    if let Some(ml) = obj.get("matchLabels").and_then(Value::as_object) {
        parts.extend(ml.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())));
    }
    for e in obj.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other} ({})", values.join(",")),
        });
    }
    Some(parts.join(","))
}

/// A Scale body's kind, apiVersion and name must be the Scale's and the URL's.
fn check_scale_body(body: &Value, name: &str) -> ApiResult<()> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be an autoscaling/v1 Scale object"));
    }
    for (field, want) in [("kind", "Scale"), ("apiVersion", "autoscaling/v1")] {
        if let Some(got) = body.get(field).and_then(Value::as_str).filter(|s| !s.is_empty())
            && got != want
        {
            return Err(ApiError::bad_request(format!("the {field} of a scale update must be {want}, not {got}")));
        }
    }
    let body_name = body["metadata"]["name"].as_str().unwrap_or_default();
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!("the name of the object ({body_name}) does not match the name on the URL ({name})")));
    }
    Ok(())
}

/// `spec.replicas` of a Scale: a whole number from 0 to 2^31-1 (absent is 0, as upstream's
/// omitempty int32); anything else is a 422 naming the value.
fn replicas_of(body: &Value, name: &str) -> ApiResult<i64> {
    let v = &body["spec"]["replicas"];
    let invalid =
        |msg: String| ApiError::invalid("Scale", "autoscaling", name, vec![Cause::new("FieldValueInvalid", "spec.replicas", msg)]);
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => match n.as_i64() {
            Some(r) if r < 0 => Err(invalid(format!("Invalid value: {r}: must be greater than or equal to 0"))),
            Some(r) if r > i64::from(i32::MAX) => Err(invalid(format!("Invalid value: {r}: must be at most {}", i32::MAX))),
            Some(r) => Ok(r),
            None => Err(invalid(format!("Invalid value: {n}: must be a whole number"))),
        },
        other => Err(invalid(format!("Invalid value: {other}: must be a whole number"))),
    }
}

/// The value at a `.a.b.c` path.
fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.').split('.').try_fold(obj, |v, seg| v.get(seg)).filter(|v| !v.is_null())
}

/// Sets the value at a `.a.b.c` path, making missing objects on the way; `None` when a
/// step is not an object.
fn set_path(obj: &mut Value, path: &str, value: Value) -> Option<()> {
    let segs: Vec<&str> = path.trim_start_matches('.').split('.').filter(|s| !s.is_empty()).collect();
    let (last, init) = segs.split_last()?;
    let mut cur = obj;
    for seg in init {
        let m = cur.as_object_mut()?;
        let next = m.entry((*seg).to_string()).or_insert_with(|| json!({}));
        if next.is_null() {
            *next = json!({});
        }
        cur = next;
    }
    cur.as_object_mut()?.insert((*last).to_string(), value);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_and_write() {
        let mut o = json!({"spec": {}});
        assert_eq!(set_path(&mut o, ".spec.size.count", json!(3)), Some(()));
        assert_eq!(get_path(&o, ".spec.size.count"), Some(&json!(3)));
        assert_eq!(get_path(&o, ".status.replicas"), None);
        let mut s = json!({"spec": "x"});
        assert_eq!(set_path(&mut s, ".spec.replicas", json!(1)), None);
    }

    #[test]
    fn label_selectors_render_as_upstream_writes_them() {
        let sel = json!({"matchLabels": {"app": "d1"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]});
        assert_eq!(selector_string(&sel).as_deref(), Some("app=d1,tier in (a,b)"));
        assert_eq!(selector_string(&json!("app=x")).as_deref(), Some("app=x"));
    }

    #[test]
    fn replicas_are_checked() {
        assert_eq!(replicas_of(&json!({"spec": {"replicas": 4}}), "t").ok(), Some(4));
        assert_eq!(replicas_of(&json!({"spec": {"replicas": -1}}), "t").map_err(|e| e.code).err(), Some(422));
        assert_eq!(replicas_of(&json!({"spec": {"replicas": "3"}}), "t").map_err(|e| e.code).err(), Some(422));
        assert_eq!(replicas_of(&json!({"spec": {"replicas": 1.5}}), "t").map_err(|e| e.code).err(), Some(422));
    }
}
