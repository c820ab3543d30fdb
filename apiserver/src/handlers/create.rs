//! POST: a new object through the create pipeline in upstream's order (namespace, name,
//! server-owned metadata, admission, schema, rules, managedFields, store).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{CRDS, Core, NAMESPACES, Output, WriteOptions, Written, map_store, now_rfc3339};
use crate::apply;
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceType;
use crate::storage::{ObjKey, Precondition};
use crate::validation;

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect()
}

impl Core {
    /// Whether a namespace exists; Err when it is terminating (for creates).
    fn check_namespace(&self, ns: &str) -> ApiResult<()> {
        let key = ObjKey { storage: Arc::from(NAMESPACES), namespace: String::new(), name: ns.to_string() };
        match self.store.get(&key) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(e) if e.deleting => {
                Err(ApiError::forbidden(format!("unable to create new content in namespace {ns} because it is being terminated")))
            }
            Some(_) => Ok(()),
        }
    }

    /// POST: creates an object.
    pub async fn create(&self, rt: &ResourceType, ns: Option<&str>, mut obj: Value, opts: &WriteOptions) -> ApiResult<Written> {
        self.create_inner(rt, ns, &mut obj, opts, false).await
    }

    // Over 80 lines on purpose: the create pipeline in upstream's order (metadata, namespace,
    // admission, schema, rules, managedFields, store); each step is a call.
    pub(super) async fn create_inner(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        obj: &mut Value,
        opts: &WriteOptions,
        applied: bool,
    ) -> ApiResult<Written> {
        Self::check_type(rt, obj)?;
        let mut warnings = vec![];
        let md = obj["metadata"].as_object_mut().ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
        // Namespace.
        let namespace = if rt.namespaced {
            let body_ns = md.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
            let ns = match (ns, body_ns) {
                (Some(p), Some(b)) if p != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(p), _) => p.to_string(),
                (None, Some(b)) => b,
                (None, None) => return Err(ApiError::bad_request("namespace is required for a namespaced resource")),
            };
            md.insert("namespace".into(), json!(ns));
            Some(ns)
        } else {
            md.remove("namespace");
            None
        };
        // Name.
        let mut name = md.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        if name.is_empty()
            && let Some(g) = md.get("generateName").and_then(Value::as_str).filter(|s| !s.is_empty())
        {
            name = format!("{g}{}", random_suffix());
            md.insert("name".into(), json!(name));
        }
        let label_name = rt.storage == NAMESPACES;
        // RBAC objects may have any path-segment name (`system:discovery`), as upstream.
        let invalid_name = if rt.group == crate::registry::RBAC_GROUP {
            validation::validate_path_segment_name(&name)
        } else {
            validation::validate_name(&name, label_name)
        };
        if let Some(c) = invalid_name {
            return Err(ApiError::invalid(&rt.kind, &rt.group, &name, vec![c]));
        }
        // Server-owned metadata.
        for k in
            ["uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "generation"]
        {
            md.remove(k);
        }
        if !applied {
            md.remove("managedFields");
        }
        let now = now_rfc3339();
        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        md.insert("creationTimestamp".into(), json!(now));
        md.insert("generation".into(), json!(1));
        if let Some(n) = &namespace {
            self.check_namespace(n)?;
        }
        // A create never sets status (upstream's PrepareForCreate clears it for built-ins too;
        // Namespace and CRD status is then derived in normalize).
        if rt.has_status
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        crate::auth::approver::keep(&rt.storage, None, obj)
            .and_then(|()| crate::auth::approver::keep_shard_label(&rt.storage, None, obj, self.may_write_shard_label(opts)))
            .map_err(|m| {
                ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    &name,
                    vec![crate::error::Cause::new("FieldValueForbidden", "metadata.annotations", m)],
                )
            })?;
        self.normalize(rt, obj, None)?;
        Self::admit(rt, obj)?;
        if let Some(guard) = &opts.escalation {
            guard.check(&rt.storage, obj, None)?;
        }
        let list_causes = self.validate_schema(rt, obj, opts, &mut warnings)?;
        Self::validate_rules(rt, obj, None, list_causes).await?;
        if !applied {
            apply::record_update(None, obj, &opts.field_manager, &rt.api_version(), rt.schema.as_ref(), Self::scope_for(rt, false), &now);
        }
        // After managedFields: no field manager owns the server-owned approver.
        crate::auth::approver::stamp(&rt.storage, None, obj, opts.user.as_deref(), &opts.groups);
        Self::admit_stored(obj)?;
        if opts.dry_run {
            return Ok(Written { output: Output::Transient(obj.clone()), warnings });
        }
        let key = Self::key(rt, namespace.as_deref(), &name);
        let entry =
            self.store.put(key, Precondition::MustNotExist, self.to_storage(rt, obj.clone())).await.map_err(|e| map_store(rt, &name, e))?;
        if rt.storage == CRDS {
            self.rebuild_registry().await;
        }
        Ok(Written { output: Output::Stored(entry), warnings })
    }
}
