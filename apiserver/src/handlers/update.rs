//! PUT and PATCH of an object or its status subresource, and the tail they share (status and
//! spec separation, immutable metadata, generation, validation, managedFields, no-op writes,
//! finalizer-driven removal).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{CRDS, Core, NAMESPACES, Output, WriteOptions, Written, map_store, now_rfc3339, parse_body, strs};
use crate::apply::{self, ApplyRequest};
use crate::error::{ApiError, ApiResult, Cause};
use crate::patch::{self, PatchType};
use crate::registry::ResourceType;
use crate::storage::{Entry, Precondition};

impl Core {
    /// PUT: replaces an object (main resource or status).
    pub async fn update(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        mut obj: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        Self::check_type(rt, &mut obj)?;
        let body_name = obj["metadata"]["name"].as_str().unwrap_or_default();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!("the name of the object ({body_name}) does not match the name on the URL ({name})")));
        }
        let want_rv = obj["metadata"]["resourceVersion"].as_str().filter(|s| !s.is_empty()).map(str::to_string);
        for _ in 0..16 {
            let cur = self.get(rt, ns, name)?;
            if let Some(w) = &want_rv
                && w.parse::<u64>().ok() != Some(cur.rv)
            {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            match self.finish_update(rt, &cur, obj.clone(), status, opts, false).await {
                Err(e) if e.code == 409 && e.reason == "Conflict" && want_rv.is_none() => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// PATCH (merge, JSON, strategic-as-merge, apply).
    // Over 80 lines on purpose: one branch per patch type (merge, JSON, strategic, apply) with
    // the shared retry on conflict around them.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        kind: PatchType,
        body: &[u8],
        content_type: &str,
        status: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        if kind == PatchType::Strategic && rt.custom {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let unmetered = provisioning_yaml::bounded::Meter::unshared();
        let meter = opts.decode.as_deref().unwrap_or(&unmetered);
        let patch_doc = parse_body(body, if kind == PatchType::Apply { "application/yaml" } else { content_type }, meter)?;
        if kind == PatchType::Apply && (!opts.explicit_manager || opts.field_manager.is_empty()) {
            return Err(ApiError::bad_request("PATCH, field manager is required for apply requests"));
        }
        if kind != PatchType::Json && !patch_doc.is_object() {
            return Err(ApiError::bad_request("the patch must be a JSON object"));
        }
        let mut applied = patch_doc.clone();
        let mut unnamed_apply = false;
        if kind == PatchType::Apply {
            Self::check_type(rt, &mut applied)?;
            unnamed_apply = fill_identity_from_url(&mut applied, name, ns)?;
        }
        let want_rv = if kind == PatchType::Json { None } else { patch_doc["metadata"]["resourceVersion"].as_str().map(str::to_string) };
        for _ in 0..32 {
            let cur = match self.get(rt, ns, name) {
                Ok(c) => c,
                // Upstream applies to an empty object here: its name is the body's, so an
                // unnamed body does not match the URL.
                Err(e) if e.code == 404 && kind == PatchType::Apply && !status && unnamed_apply => {
                    return Err(ApiError::bad_request(format!("the name of the object () does not match the name on the URL ({name})")));
                }
                Err(e) if e.code == 404 && kind == PatchType::Apply && !status => {
                    let now = now_rfc3339();
                    let mut live = json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": {"name": name}});
                    if let Some(n) = ns {
                        live["metadata"]["namespace"] = json!(n);
                    }
                    let req = ApplyRequest {
                        manager: &opts.field_manager,
                        force: opts.force,
                        scope: Self::scope_for(rt, false),
                        api_version: &rt.api_version(),
                        schema: rt.schema.as_ref(),
                        now: &now,
                    };
                    let mut obj = apply::apply(&live, &applied, &req)?;
                    for k in ["apiVersion", "kind"] {
                        obj[k] = applied[k].clone();
                    }
                    match self.create_inner(rt, ns, &mut obj, opts, true).await {
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        other => return other,
                    }
                }
                Err(e) => return Err(e),
            };
            let old = self.convert(rt, cur.value());
            if let Some(w) = &want_rv
                && w.parse::<u64>().ok() != Some(cur.rv)
            {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            let mut candidate = old.clone();
            match kind {
                PatchType::Merge => patch::merge_patch(&mut candidate, &patch_doc),
                // Only built-in kinds get here (custom resources were refused above).
                PatchType::Strategic => crate::strategic::patch(&mut candidate, &patch_doc, rt.schema.as_ref()),
                PatchType::Json => patch::json_patch(&mut candidate, &patch_doc)?,
                PatchType::Apply => {
                    let now = now_rfc3339();
                    let req = ApplyRequest {
                        manager: &opts.field_manager,
                        force: opts.force,
                        scope: Self::scope_for(rt, status),
                        api_version: &rt.api_version(),
                        schema: rt.schema.as_ref(),
                        now: &now,
                    };
                    candidate = apply::apply(&old, &applied, &req)?;
                }
            }
            match self.finish_update(rt, &cur, candidate, status, opts, kind == PatchType::Apply).await {
                Err(e)
                    if e.code == 409
                        && e.reason == "Conflict"
                        && want_rv.is_none()
                        && e.details.as_ref().is_some_and(|d| d.get("causes").is_none()) =>
                {
                    continue;
                }
                other => return other,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// Shared tail of update and patch, in upstream's order: status/spec separation, immutable
    /// metadata, finalizers, normalisation and validation, generation, managedFields, no-op
    /// detection, finalizer-driven removal, store.
    async fn finish_update(
        &self,
        rt: &ResourceType,
        cur: &Arc<Entry>,
        mut new: Value,
        status: bool,
        opts: &WriteOptions,
        applied: bool,
    ) -> ApiResult<Written> {
        let old = self.convert(rt, cur.value());
        let name = cur.key.name.clone();
        Self::check_type(rt, &mut new)?;
        let mut warnings = vec![];
        separate_status(rt, &old, &mut new, status, applied);
        keep_server_metadata(rt, &old, &mut new, applied)?;
        crate::auth::approver::keep(&rt.storage, Some(&old), &mut new)
            .and_then(|()| crate::auth::approver::keep_shard_label(&rt.storage, Some(&old), &mut new, self.may_write_shard_label(opts)))
            .map_err(|m| {
                ApiError::invalid(&rt.kind, &rt.group, &name, vec![Cause::new("FieldValueForbidden", "metadata.annotations", m)])
            })?;
        refuse_new_finalizers_while_deleting(rt, &old, &new, &name)?;
        self.normalize(rt, &mut new, Some(&old))?;
        Self::admit(rt, &new)?;
        if let Some(guard) = &opts.escalation {
            guard.check(&rt.storage, &new, Some(&old))?;
        }
        let list_causes = self.validate_schema(rt, &mut new, opts, &mut warnings)?;
        Self::validate_rules(rt, &new, Some(&old), list_causes).await?;
        bump_generation(rt, &old, &mut new);
        if !applied {
            let now = now_rfc3339();
            apply::record_update(
                Some(&old),
                &mut new,
                &opts.field_manager,
                &rt.api_version(),
                rt.schema.as_ref(),
                Self::scope_for(rt, status),
                &now,
            );
        }
        // After managedFields: no field manager owns the server-owned approver.
        crate::auth::approver::stamp(&rt.storage, Some(&old), &mut new, opts.user.as_deref(), &opts.groups);
        // No-op writes keep the revision (controllers must not trigger themselves), unless the
        // object is stored at another version than the storage version: rewriting it at the
        // storage version is what a storage migration's unchanged write is for (upstream
        // compares the encoded bytes, which then differ).
        if without_managed_times(&old) == without_managed_times(&new) && self.at_storage_version(rt, cur) {
            return Ok(Written { output: Output::Stored(cur.clone()), warnings });
        }
        Self::admit_stored(&new)?;
        if opts.dry_run {
            return Ok(Written { output: Output::Transient(new), warnings });
        }
        self.store_update(rt, cur, new, &name).await.map(|output| Written { output, warnings })
    }

    /// Stores an updated object; one being deleted whose last finalizer just went is removed
    /// instead (a Namespace waits for its finalizer controller).
    async fn store_update(&self, rt: &ResourceType, cur: &Arc<Entry>, new: Value, name: &str) -> ApiResult<Output> {
        let deleting = new["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null());
        let no_finalizers = strs(&new["metadata"]["finalizers"]).is_empty();
        let key = cur.key.clone();
        if deleting && no_finalizers && rt.storage != NAMESPACES {
            let e = self.store.delete(key, Precondition::Revision(cur.rv)).await.map_err(|e| map_store(rt, name, e))?;
            self.gc_wakeup.notify_one();
            if rt.storage == CRDS {
                self.after_crd_delete(&e).await;
            }
            return Ok(Output::Stored(e));
        }
        let entry =
            self.store.put(key, Precondition::Revision(cur.rv), self.to_storage(rt, new)).await.map_err(|e| map_store(rt, name, e))?;
        if rt.storage == CRDS {
            self.rebuild_registry().await;
        }
        Ok(Output::Stored(entry))
    }
}

/// A status write takes only the status (and, applied, its managedFields) from `new`; a main
/// write of a kind with a status subresource keeps the stored status.
fn separate_status(rt: &ResourceType, old: &Value, new: &mut Value, status: bool, applied: bool) {
    if status {
        let mut merged = old.clone();
        match new.get("status") {
            Some(s) => merged["status"] = s.clone(),
            None => {
                if let Some(m) = merged.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        if applied {
            merged["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
        }
        *new = merged;
    } else if rt.has_status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
}

/// As upstream's apply to an existing object, whose name and namespace the merged result
/// keeps: a name or namespace the applied configuration leaves out is the URL's; a different
/// one is a bad request. Returns whether the body had no name.
fn fill_identity_from_url(applied: &mut Value, name: &str, ns: Option<&str>) -> ApiResult<bool> {
    let md = applied["metadata"].as_object_mut().ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
    let unnamed = match md.get("name") {
        None | Some(Value::Null) => true,
        Some(Value::String(an)) if an.is_empty() => true,
        Some(Value::String(an)) if an == name => false,
        Some(other) => {
            let an = other.as_str().map_or_else(|| other.to_string(), str::to_string);
            return Err(ApiError::bad_request(format!("the name of the object ({an}) does not match the name on the URL ({name})")));
        }
    };
    if unnamed {
        md.insert("name".into(), json!(name));
    }
    let Some(ns) = ns else { return Ok(unnamed) };
    match md.get("namespace") {
        None | Some(Value::Null) => drop(md.insert("namespace".into(), json!(ns))),
        Some(Value::String(bn)) if bn.is_empty() => drop(md.insert("namespace".into(), json!(ns))),
        Some(Value::String(bn)) if bn == ns => {}
        Some(_) => {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
    }
    Ok(unnamed)
}

/// Immutable and server-owned metadata come from the stored object; a namespace in the body
/// must be the stored one; null maps and lists mean absent.
fn keep_server_metadata(rt: &ResourceType, old: &Value, new: &mut Value, applied: bool) -> ApiResult<()> {
    let om = &old["metadata"];
    let nm = new["metadata"].as_object_mut().ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
    if let Some(bn) = nm.get("namespace").and_then(Value::as_str)
        && rt.namespaced
        && !bn.is_empty()
        && Some(bn) != om["namespace"].as_str()
    {
        return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
    }
    for k in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match om.get(k) {
            Some(v) if !v.is_null() => {
                nm.insert(k.into(), v.clone());
            }
            _ => {
                nm.remove(k);
            }
        }
    }
    if !applied {
        match om.get("managedFields") {
            Some(v) => nm.insert("managedFields".into(), v.clone()),
            None => nm.remove("managedFields"),
        };
    }
    for k in ["labels", "annotations", "ownerReferences", "finalizers"] {
        if nm.get(k).is_some_and(Value::is_null) {
            nm.remove(k);
        }
    }
    Ok(())
}

/// An object being deleted may lose finalizers but gain none (kube-apiserver's 422).
fn refuse_new_finalizers_while_deleting(rt: &ResourceType, old: &Value, new: &Value, name: &str) -> ApiResult<()> {
    if old["metadata"].get("deletionTimestamp").is_none() {
        return Ok(());
    }
    let of = strs(&old["metadata"]["finalizers"]);
    let added = strs(&new["metadata"]["finalizers"]).into_iter().any(|f| !of.contains(&f));
    if !added {
        return Ok(());
    }
    Err(ApiError::invalid(
        &rt.kind,
        &rt.group,
        name,
        vec![Cause::new(
            "FieldValueForbidden",
            "metadata.finalizers",
            "Forbidden: no new finalizers can be added if the object is being deleted",
        )],
    ))
}

/// Generation moves when anything but metadata (and status, if separate) changes.
fn bump_generation(rt: &ResourceType, old: &Value, new: &mut Value) {
    let strip = |v: &Value| -> Value {
        let mut c = v.clone();
        if let Some(m) = c.as_object_mut() {
            m.remove("metadata");
            if rt.has_status {
                m.remove("status");
            }
        }
        c
    };
    if strip(old) != strip(new) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
        new["metadata"]["generation"] = json!(g);
    }
}

/// The object without managedFields times (a write that changes only those is a no-op).
fn without_managed_times(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(arr) = c["metadata"]["managedFields"].as_array_mut() {
        for e in arr {
            if let Some(m) = e.as_object_mut() {
                m.remove("time");
            }
        }
    }
    c
}
