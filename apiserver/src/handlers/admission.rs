//! What every write passes, whatever wrote it: apiVersion/kind, metadata, size and depth,
//! kind-specific normalisation (Secrets, Namespaces, CRDs), the schema (prune, default,
//! validate) and the CRD's CEL rules.

use base64::Engine;
use serde_json::{Value, json};

use super::{CRDS, Core, FieldValidation, NAMESPACES, WriteOptions, now_rfc3339, strs};
use crate::apply::Scope;
use crate::error::{ApiError, ApiResult, Cause};
use crate::registry::ResourceType;
use crate::validation;

/// Bytes of `v` as JSON, counted without building them.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, v) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// (namespace, name) of an object.
fn obj_name(obj: &Value) -> (String, String) {
    let md = &obj["metadata"];
    (md["namespace"].as_str().unwrap_or_default().to_string(), md["name"].as_str().unwrap_or_default().to_string())
}

impl Core {
    /// ClusterIPs and node ports of the stored Services (other than `except`, the one written).
    /// Each Service's allocation is read once per revision (only `spec.clusterIP(s)` and the
    /// ports' `nodePort`s are decoded) and kept in [`Core::service_allocations`]: creating a
    /// Service never re-decodes every stored Service.
    fn services_taken(&self, except: (String, String)) -> super::defaults::Taken {
        let mut t = super::defaults::Taken { ips: Default::default(), node_ports: Default::default() };
        // The entries are shared and read after the store's lock is given back: a long read
        // would hold up the writer, and every reader queued behind it.
        let services: Vec<_> = self.store.read().candidates("/services", None, &Default::default(), None).cloned().collect();
        let mut cache = self.service_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut fresh = std::collections::HashMap::with_capacity(services.len());
        for e in services {
            let key = (e.key.namespace.clone(), e.key.name.clone());
            let alloc = match cache.remove(&key) {
                Some(a) if a.rv == e.rv => a,
                _ => super::defaults::Allocation::of(e.rv, &e.bytes),
            };
            if key != except {
                t.ips.extend(alloc.ips.iter().cloned());
                t.node_ports.extend(alloc.node_ports.iter().copied());
            }
            fresh.insert(key, alloc);
        }
        *cache = fresh;
        t
    }

    /// Admission checks every stored object passes, whatever wrote it (create, update, each
    /// kind of patch): size, nesting depth and metadata (labels and annotations).
    pub(super) fn admit(rt: &ResourceType, obj: &Value) -> ApiResult<()> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let depth = validation::depth(obj);
        if depth > validation::MAX_DEPTH {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "",
                    format!(
                        "Invalid value: the object nests {depth} levels deep, more than the limit of {} (deeper objects cannot be read by every Kubernetes client)",
                        validation::MAX_DEPTH
                    ),
                )],
            ));
        }
        let causes = validation::validate_metadata(&obj["metadata"]);
        if !causes.is_empty() {
            return Err(ApiError::invalid(&rt.kind, &rt.group, name, causes));
        }
        // Every binding is held by the RBAC policy: its subjects are capped (upstream has no cap).
        let max = crate::auth::rbac::MAX_BINDING_SUBJECTS;
        if rt.group == crate::registry::RBAC_GROUP
            && matches!(rt.kind.as_str(), "RoleBinding" | "ClusterRoleBinding")
            && let Some(n) = obj["subjects"].as_array().map(Vec::len).filter(|n| *n > max)
        {
            let why = format!("Too many: {n}: must have at most {max} items");
            return Err(ApiError::invalid(&rt.kind, &rt.group, name, vec![Cause::new("FieldValueTooMany", "subjects", why)]));
        }
        let size = json_len(obj);
        if size > validation::MAX_OBJECT_BYTES {
            return Err(ApiError::too_large_with(format!(
                "the object {name} would be {size} bytes, more than the limit of {} bytes",
                validation::MAX_OBJECT_BYTES
            )));
        }
        Ok(())
    }

    /// The object as it is about to be stored, managedFields recorded, is within the object
    /// limit too: [`Core::admit`] ran before they were added, and they can make an object 1.2 to
    /// 2.3 times larger (one entry per key). 413, as upstream's etcd "request is too large".
    pub(super) fn admit_stored(obj: &Value) -> ApiResult<()> {
        let size = json_len(obj);
        if size > validation::MAX_OBJECT_BYTES {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::too_large_with(format!(
                "etcdserver: request is too large: the object {name} would be {size} bytes with its managedFields, more than the limit of {} bytes",
                validation::MAX_OBJECT_BYTES
            )));
        }
        Ok(())
    }

    /// Checks apiVersion/kind of a body and fills them in.
    pub(super) fn check_type(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
        let Some(m) = obj.as_object_mut() else {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        };
        let want = rt.api_version();
        if let Some(av) = m.get("apiVersion").and_then(Value::as_str) {
            let same_group =
                av == want || (rt.group.is_empty() && av == rt.version) || av.split_once('/').is_some_and(|(g, _)| g == rt.group);
            if !same_group {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want})"
                )));
            }
        }
        if let Some(k) = m.get("kind").and_then(Value::as_str)
            && k != rt.kind
        {
            return Err(ApiError::bad_request(format!("the kind in the data ({k}) does not match the expected kind ({})", rt.kind)));
        }
        m.insert("apiVersion".into(), json!(want));
        m.insert("kind".into(), json!(rt.kind));
        match m.get("metadata") {
            None | Some(Value::Null) => {
                m.insert("metadata".into(), json!({}));
            }
            Some(Value::Object(_)) => {}
            Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
        }
        Ok(())
    }

    /// Kind-specific normalisation done on every write.
    pub(super) fn normalize(&self, rt: &ResourceType, obj: &mut Value, old: Option<&Value>) -> ApiResult<()> {
        if rt.group.is_empty() || matches!(rt.group.as_str(), "apps" | "batch") {
            let who = obj_name(obj);
            let name = who.1.clone();
            super::defaults::apply(&rt.storage, obj, old, || self.services_taken(who))
                .map_err(|causes| ApiError::invalid(&rt.kind, &rt.group, &name, causes))?;
        }
        match rt.storage.as_str() {
            "/secrets" => {
                if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                    let data = obj
                        .as_object_mut()
                        .map(|m| m.entry("data").or_insert_with(|| json!({})))
                        .ok_or_else(|| ApiError::bad_request("bad secret"))?;
                    if data.is_null() {
                        *data = json!({});
                    }
                    for (k, v) in sd {
                        let s = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
                        data[k] = json!(base64::engine::general_purpose::STANDARD.encode(s));
                    }
                }
                if obj.get("type").is_none_or(Value::is_null) {
                    obj["type"] = json!("Opaque");
                }
            }
            NAMESPACES => {
                if obj["spec"]["finalizers"].is_null() {
                    obj["spec"] = json!({"finalizers": ["kubernetes"]});
                }
                let deleting = obj["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null());
                obj["status"] = json!({"phase": if deleting { "Terminating" } else { "Active" }});
                if let Some(o) = old
                    && o["status"]["phase"] == "Terminating"
                {
                    obj["status"] = o["status"].clone();
                }
            }
            CRDS => self.normalize_crd(obj)?,
            "/pods" if old.is_none() && obj["status"].as_object().is_none_or(serde_json::Map::is_empty) => {
                obj["status"] = crate::objects::unrun_pod_status();
            }
            _ => {}
        }
        Ok(())
    }

    // Over 80 lines on purpose: the CRD checks and defaults kube-apiserver applies, in its order
    // (names, scope, versions, schemas, conditions), each a few lines.
    fn normalize_crd(&self, obj: &mut Value) -> ApiResult<()> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let group = obj["spec"]["group"].as_str().unwrap_or_default().to_string();
        let plural = obj["spec"]["names"]["plural"].as_str().unwrap_or_default().to_string();
        let kind = obj["spec"]["names"]["kind"].as_str().unwrap_or_default().to_string();
        let mut causes = vec![];
        if group.is_empty() {
            causes.push(Cause::new("FieldValueRequired", "spec.group", "Required value"));
        }
        if plural.is_empty() {
            causes.push(Cause::new("FieldValueRequired", "spec.names.plural", "Required value"));
        }
        if kind.is_empty() {
            causes.push(Cause::new("FieldValueRequired", "spec.names.kind", "Required value"));
        }
        if causes.is_empty() && name != format!("{plural}.{group}") {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "metadata.name",
                format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
            ));
        }
        let versions = obj["spec"]["versions"].as_array().cloned().unwrap_or_default();
        if versions.is_empty() {
            causes.push(Cause::new(
                "FieldValueRequired",
                "spec.versions",
                "Required value: must have exactly one version marked as storage version",
            ));
        }
        let storage: Vec<String> = versions
            .iter()
            .filter(|v| v["storage"].as_bool() == Some(true))
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        if !versions.is_empty() && storage.len() != 1 {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            ));
        }
        match obj["spec"]["scope"].as_str() {
            Some("Namespaced") | Some("Cluster") => {}
            other => causes.push(Cause::new(
                "FieldValueNotSupported",
                "spec.scope",
                format!(
                    "Unsupported value: {}: supported values: \"Cluster\", \"Namespaced\"",
                    other.map(|s| format!("\"{s}\"")).unwrap_or("\"\"".into())
                ),
            )),
        }
        causes.extend(conversion_causes(&obj["spec"]["conversion"], versions.len()));
        for (i, v) in versions.iter().enumerate() {
            if let Some(schema) = v["schema"].get("openAPIV3Schema") {
                let rules = crate::celrules::Rules::from_schema(schema);
                causes.extend(rules.compile_errors(&format!("spec.versions[{i}].schema.openAPIV3Schema")));
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid("CustomResourceDefinition", "apiextensions.k8s.io", &name, causes));
        }
        let names = &mut obj["spec"]["names"];
        if names["singular"].as_str().is_none_or(str::is_empty) {
            names["singular"] = json!(kind.to_lowercase());
        }
        if names["listKind"].as_str().is_none_or(str::is_empty) {
            names["listKind"] = json!(format!("{kind}List"));
        }
        if obj["spec"]["conversion"].is_null() {
            obj["spec"]["conversion"] = json!({"strategy": "None"});
        }
        let now = now_rfc3339();
        let stored = stored_versions(&obj["status"]["storedVersions"], storage, &versions)
            .map_err(|gone| ApiError::invalid("CustomResourceDefinition", "apiextensions.k8s.io", &name, gone))?;
        let names = obj["spec"]["names"].clone();
        let keep_time = |t: &str| -> String {
            obj["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
                .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string))
                .unwrap_or_else(|| now.clone())
        };
        let t1 = keep_time("NamesAccepted");
        let t2 = keep_time("Established");
        obj["status"] = json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t1},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t2},
            ],
            "acceptedNames": names,
            "storedVersions": stored,
        });
        Ok(())
    }

    /// Prunes, defaults and validates a custom resource; collects warnings. Duplicate entries
    /// of list-maps and sets come back instead of failing: as in kube-apiserver they do not
    /// block the CEL rules, and the 422 lists both.
    pub(super) fn validate_schema(
        &self,
        rt: &ResourceType,
        obj: &mut Value,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> ApiResult<Vec<Cause>> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let mut causes = vec![];
        if let Some(schema) = &rt.schema {
            let out = validation::process(obj, schema);
            if !out.unknown.is_empty() {
                match opts.field_validation {
                    FieldValidation::Strict => {
                        let mut list: Vec<String> = out.unknown.iter().map(|u| format!("unknown field \"{u}\"")).collect();
                        if out.unknown_more > 0 {
                            list.push(format!("and {} more unknown fields", out.unknown_more));
                        }
                        return Err(ApiError::bad_request(format!(
                            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                            rt.kind,
                            rt.api_version(),
                            rt.kind,
                            list.join(", ")
                        )));
                    }
                    FieldValidation::Warn => {
                        warnings.extend(out.unknown.iter().map(|u| format!("unknown field \"{u}\"")));
                        if out.unknown_more > 0 {
                            warnings.push(format!("and {} more unknown fields", out.unknown_more));
                        }
                    }
                    FieldValidation::Ignore => {}
                }
            }
            causes.extend(out.causes.into_vec());
        }
        if causes.iter().any(|c| c.reason != "FieldValueDuplicate") {
            return Err(ApiError::invalid(&rt.kind, &rt.group, &name, causes));
        }
        Ok(causes)
    }

    /// Evaluates the CRD's `x-kubernetes-validations` (CEL) rules on the defaulted, pruned and
    /// schema-valid object; `old` is the stored object on update (for `oldSelf`). Big objects
    /// are evaluated on the blocking pool so that a long evaluation never stalls the runtime.
    pub(super) async fn validate_rules(rt: &ResourceType, obj: &Value, old: Option<&Value>, mut causes: Vec<Cause>) -> ApiResult<()> {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let Some(rules) = rt.rules.clone() else {
            return if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid(&rt.kind, &rt.group, name, causes)) };
        };
        let rule_causes = if crate::celrules::weight(obj) > 20_000 {
            let (o, old) = (obj.clone(), old.cloned());
            tokio::task::spawn_blocking(move || rules.validate(&o, old.as_ref()))
                .await
                .map_err(|_| ApiError::internal("evaluating validation rules failed"))?
        } else {
            rules.validate(obj, old)
        };
        causes.extend(rule_causes);
        if causes.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(&rt.kind, &rt.group, name, causes))
    }

    pub(super) fn scope_for(rt: &ResourceType, status: bool) -> Scope {
        if status {
            Scope::Status
        } else if rt.has_status {
            Scope::Main
        } else {
            Scope::All
        }
    }
}

/// `spec.conversion` of a CRD with `versions` versions: strategy None or Webhook (upstream's
/// values). This control plane converts by rewriting `apiVersion` only (None): a CRD with more
/// than one version whose objects need a conversion webhook is refused rather than served
/// unconverted.
fn conversion_causes(conversion: &Value, versions: usize) -> Vec<Cause> {
    match conversion["strategy"].as_str() {
        None if conversion.is_null() => vec![],
        Some("None") => vec![],
        Some("Webhook") if versions <= 1 => vec![],
        Some("Webhook") => vec![Cause::new(
            "FieldValueNotSupported",
            "spec.conversion.strategy",
            "Unsupported value: \"Webhook\": this control plane converts between versions only by rewriting apiVersion (strategy None) and calls no conversion webhook; serve one version, or use identical schemas with strategy None",
        )],
        other => vec![Cause::new(
            "FieldValueNotSupported",
            "spec.conversion.strategy",
            format!(
                "Unsupported value: {}: supported values: \"None\", \"Webhook\"",
                other.map_or_else(|| conversion["strategy"].to_string(), |s| format!("\"{s}\""))
            ),
        )],
    }
}

/// A CRD's `status.storedVersions` with its storage version added; every entry must still be
/// one of `versions` (upstream's ValidateCustomResourceDefinitionStoredVersions: a version
/// objects may still be stored at cannot be dropped; a rollback of the CRD first needs a
/// migration).
fn stored_versions(recorded: &Value, storage: Vec<String>, versions: &[Value]) -> Result<Vec<String>, Vec<Cause>> {
    let mut stored = strs(recorded);
    for s in storage {
        if !stored.contains(&s) {
            stored.push(s);
        }
    }
    let names: Vec<&str> = versions.iter().filter_map(|v| v["name"].as_str()).collect();
    let gone: Vec<Cause> = stored
        .iter()
        .enumerate()
        .filter(|(_, s)| !names.contains(&s.as_str()))
        .map(|(i, s)| {
            Cause::new(
                "FieldValueInvalid",
                format!("status.storedVersions[{i}]"),
                format!("Invalid value: \"{s}\": must appear in spec.versions"),
            )
        })
        .collect();
    if gone.is_empty() { Ok(stored) } else { Err(gone) }
}
