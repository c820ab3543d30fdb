//! Structural-schema processing for custom resources (prune unknown fields, apply defaults,
//! validate), and object name validation.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use regex::Regex;
use serde_json::Value;

use crate::error::{Cause, Causes};

static SUBDOMAIN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").ok());
static LABEL: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").ok());
static PATTERNS: LazyLock<Mutex<HashMap<String, Option<Regex>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Nesting levels an object may have. kube-rs (serde_json) stops at 128 levels, and a list
/// adds two (the list and its `items`), so 64 leaves every client room to read any list.
pub const MAX_DEPTH: usize = 64;

/// Largest stored object, in bytes of JSON (the request body limit; etcd's is 1.5 MiB).
pub const MAX_OBJECT_BYTES: usize = 3 * 1024 * 1024;

/// Total size of an object's annotations (keys and values), as kube-apiserver limits it.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

static LABEL_VALUE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").ok());
static QUALIFIED_NAME: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").ok());

/// How many levels of objects and arrays nest in `v` (a scalar is 0, `{}` is 1).
pub fn depth(v: &Value) -> usize {
    // Iterative: the value may come from a patch and be deeper than the stack likes.
    let mut max = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(m) => {
                max = max.max(d + 1);
                stack.extend(m.values().map(|c| (c, d + 1)));
            }
            Value::Array(a) => {
                max = max.max(d + 1);
                stack.extend(a.iter().map(|c| (c, d + 1)));
            }
            _ => {}
        }
    }
    max
}

fn qualified_name_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if p.len() > 253 || !SUBDOMAIN.as_ref().is_some_and(|r| r.is_match(p)) {
            return Some("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into());
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    if !QUALIFIED_NAME.as_ref().is_some_and(|r| r.is_match(name)) {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

/// Validates `metadata.labels` and `metadata.annotations` as kube-apiserver does for every
/// object: maps of strings, qualified-name keys, label values of at most 63 characters, and
/// annotations of at most 256 KiB in total. Stops at the causes' cap ([`Causes`]).
pub fn validate_metadata(md: &Value) -> Vec<Cause> {
    let mut causes = Causes::default();
    for field in ["labels", "annotations"] {
        match md.get(field) {
            None | Some(Value::Null) | Some(Value::Object(_)) => {}
            Some(_) => causes.push(Cause::new("FieldValueInvalid", format!("metadata.{field}"), "Invalid value: must be a map of strings")),
        }
    }
    if let Some(labels) = md.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if causes.overflowed() {
                return causes.into_vec();
            }
            if let Some(m) = qualified_name_error(k) {
                causes.push(Cause::new("FieldValueInvalid", "metadata.labels", format!("Invalid value: {}: {m}", json_str(k))));
            }
            match v.as_str() {
                None => causes.push(Cause::new("FieldValueInvalid", format!("metadata.labels[{k}]"), "Invalid value: must be a string")),
                Some(s) if s.len() > 63 => {
                    causes.push(Cause::new("FieldValueInvalid", "metadata.labels", format!("Invalid value: {}: must be no more than 63 characters", json_str(s))))
                }
                Some(s) if !LABEL_VALUE.as_ref().is_some_and(|r| r.is_match(s)) => causes.push(Cause::new(
                    "FieldValueInvalid",
                    "metadata.labels",
                    format!("Invalid value: {}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')", json_str(s)),
                )),
                Some(_) => {}
            }
        }
    }
    if let Some(ann) = md.get("annotations").and_then(Value::as_object) {
        let mut total = 0usize;
        for (k, v) in ann {
            if causes.overflowed() {
                return causes.into_vec();
            }
            if let Some(m) = qualified_name_error(&k.to_lowercase()) {
                causes.push(Cause::new("FieldValueInvalid", "metadata.annotations", format!("Invalid value: {}: {m}", json_str(k))));
            }
            match v.as_str() {
                Some(s) => total += k.len() + s.len(),
                None => {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        format!("metadata.annotations[{k}]"),
                        "Invalid value: annotation values must be strings",
                    ));
                    total += k.len();
                }
            }
        }
        if total > MAX_ANNOTATIONS_BYTES {
            causes.push(Cause::new(
                "FieldValueTooLong",
                "metadata.annotations",
                format!("Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"),
            ));
        }
    }
    causes.into_vec()
}

/// kube's `ValidateRBACName` (`path.IsValidPathSegmentName`), for the RBAC kinds' names: anything usable as one URL path
/// segment, so names such as `system:discovery` are valid.
pub fn validate_path_segment_name(name: &str) -> Option<Cause> {
    let bad = |why: &str| {
        let quoted = serde_json::to_string(name).unwrap_or_default();
        Some(Cause::new("FieldValueInvalid", "metadata.name", format!("Invalid value: {quoted}: {why}")))
    };
    if name.is_empty() {
        return Some(Cause::new("FieldValueRequired", "metadata.name", "Required value: name or generateName is required"));
    }
    match name {
        "." => return bad("may not be '.'"),
        ".." => return bad("may not be '..'"),
        _ => {}
    }
    if name.contains('/') {
        return bad("may not contain '/'");
    }
    if name.contains('%') {
        return bad("may not contain '%'");
    }
    None
}

/// Validates a name as an RFC 1123 subdomain (or label when `label` is set).
pub fn validate_name(name: &str, label: bool) -> Option<Cause> {
    if name.is_empty() {
        return Some(Cause::new("FieldValueRequired", "metadata.name", "Required value: name or generateName is required"));
    }
    let (re, max, msg) = if label {
        (
            &*LABEL,
            63,
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        )
    } else {
        (
            &*SUBDOMAIN,
            253,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        )
    };
    let ok = re.as_ref().is_some_and(|r| r.is_match(name));
    if !ok {
        return Some(Cause::new("FieldValueInvalid", "metadata.name", format!("Invalid value: {}: {msg}", json_str(name))));
    }
    if name.len() > max {
        return Some(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: {}: must be no more than {max} characters", json_str(name)),
        ));
    }
    None
}

fn json_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => json_str(s),
        other => other.to_string(),
    }
}

/// Most unknown field paths an [`Outcome`] names (each becomes a warning or part of a strict
/// decoding error); the rest are counted.
pub const MAX_UNKNOWN_FIELDS: usize = 100;

/// Result of processing an object against its schema.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Validation failures (capped; the walk stops once the cap overflows).
    pub causes: Causes,
    /// Paths of fields that were pruned because the schema does not know them (the first
    /// [`MAX_UNKNOWN_FIELDS`]).
    pub unknown: Vec<String>,
    /// Unknown fields pruned beyond those named in `unknown`.
    pub unknown_more: usize,
}

impl Outcome {
    fn pruned(&mut self, path: String) {
        if self.unknown.len() < MAX_UNKNOWN_FIELDS {
            self.unknown.push(path);
        } else {
            self.unknown_more += 1;
        }
    }
}

/// Prunes, defaults and validates `obj` (a whole custom resource) against `schema`.
pub fn process(obj: &mut Value, schema: &Value) -> Outcome {
    let mut out = Outcome::default();
    let Some(m) = obj.as_object_mut() else {
        out.causes.push(Cause::new("FieldValueTypeInvalid", "", "must be an object"));
        return out;
    };
    let props = schema.get("properties");
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.and_then(|p| p.get(&k)) {
            Some(s) => {
                if m.get(&k).is_some_and(Value::is_null) && s.get("nullable").and_then(Value::as_bool) != Some(true) {
                    m.remove(&k);
                    continue;
                }
                if let Some(v) = m.get_mut(&k) {
                    walk(v, s, &k, &mut out);
                }
            }
            None if preserve => {}
            None => {
                m.remove(&k);
                out.pruned(k.clone());
            }
        }
    }
    if let Some(p) = props.and_then(Value::as_object) {
        for (k, s) in p {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") || m.contains_key(k) {
                continue;
            }
            if let Some(d) = s.get("default") {
                let mut d = d.clone();
                walk(&mut d, s, k, &mut out);
                m.insert(k.clone(), d);
            }
        }
    }
    for r in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(r) = r.as_str()
            && !m.contains_key(r)
            && r != "metadata"
            && r != "apiVersion"
            && r != "kind"
        {
            out.causes.push(Cause::new("FieldValueRequired", r, "Required value"));
        }
    }
    out
}

fn type_ok(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn regex_for(pattern: &str) -> Option<Regex> {
    let mut cache = match PATTERNS.lock() {
        Ok(c) => c,
        Err(p) => p.into_inner(),
    };
    cache.entry(pattern.to_string()).or_insert_with(|| Regex::new(pattern).ok()).clone()
}

/// One recursive walk applying every OpenAPI v3 keyword in the order kube-apiserver's
/// structural schema does: type, enum, then per kind of value (prune, default, required,
/// bounds, formats, list types).
fn walk(v: &mut Value, s: &Value, path: &str, out: &mut Outcome) {
    // The object is invalid and its causes full: the rest of it is not looked at.
    if out.causes.overflowed() {
        return;
    }
    if v.is_null() && s.get("nullable").and_then(Value::as_bool) == Some(true) {
        return;
    }
    if !type_matches(v, s, path, out) {
        return;
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        let supported: Vec<String> = e.iter().map(render).collect();
        out.causes.push(Cause::new(
            "FieldValueNotSupported",
            path,
            format!("Unsupported value: {}: supported values: {}", render(v), supported.join(", ")),
        ));
    }
    match v {
        Value::Object(m) => walk_object(m, s, path, out),
        Value::Array(items) => walk_array(items, s, path, out),
        Value::String(st) => check_string(st, s, path, out),
        Value::Number(n) => check_number(n, s, path, out),
        _ => {}
    }
}

/// Whether `v` has the schema's type (or is an int-or-string); a cause when not.
fn type_matches(v: &Value, s: &Value, path: &str, out: &mut Outcome) -> bool {
    let int_or_string = s.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if int_or_string {
        if !(v.is_string() || type_ok(v, "integer")) {
            out.causes.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!("Invalid value: {}: {path} in body must be of type integer-or-string: {}", render(v), render(v)),
            ));
            return false;
        }
    } else if let Some(t) = s.get("type").and_then(Value::as_str)
        && !type_ok(v, t)
    {
        let actual = match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        out.causes.push(Cause::new(
            "FieldValueTypeInvalid",
            path,
            format!("Invalid value: \"{actual}\": {path} in body must be of type {t}: \"{actual}\""),
        ));
        return false;
    }
    true
}

/// An object: prunes unknown fields (unless preserved), walks known ones, fills defaults,
/// checks required fields and maxProperties.
fn walk_object(m: &mut serde_json::Map<String, Value>, s: &Value, path: &str, out: &mut Outcome) {
    let props = s.get("properties").and_then(Value::as_object);
    let addl = s.get("additionalProperties");
    let preserve = s.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    let embedded = s.get("x-kubernetes-embedded-resource").and_then(Value::as_bool) == Some(true);
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        if out.causes.overflowed() {
            return;
        }
        let child_path = format!("{path}.{k}");
        let cs = props.and_then(|p| p.get(&k)).or_else(|| addl.filter(|a| a.is_object()));
        match cs {
            Some(cs) => {
                if m.get(&k).is_some_and(Value::is_null) && cs.get("nullable").and_then(Value::as_bool) != Some(true) {
                    m.remove(&k);
                    continue;
                }
                if let Some(cv) = m.get_mut(&k) {
                    walk(cv, cs, &child_path, out);
                }
            }
            None if preserve || addl.and_then(Value::as_bool) == Some(true) => {}
            None if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") => {}
            None => {
                m.remove(&k);
                out.pruned(child_path);
            }
        }
    }
    if let Some(p) = props {
        for (k, cs) in p {
            if m.contains_key(k) {
                continue;
            }
            if let Some(d) = cs.get("default") {
                let mut d = d.clone();
                walk(&mut d, cs, &format!("{path}.{k}"), out);
                m.insert(k.clone(), d);
            }
        }
    }
    for r in s.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(r) = r.as_str()
            && !m.contains_key(r)
        {
            out.causes.push(Cause::new("FieldValueRequired", format!("{path}.{r}"), "Required value"));
        }
    }
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
        && m.len() as u64 > max
    {
        out.causes.push(Cause::new("FieldValueTooMany", path, format!("Too many: {}: must have at most {max} items", m.len())));
    }
}

/// An array: item count bounds, list-type duplicates, then each item.
fn walk_array(items: &mut [Value], s: &Value, path: &str, out: &mut Outcome) {
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        out.causes.push(Cause::new("FieldValueTooMany", path, format!("Too many: {}: must have at most {max} items", items.len())));
    }
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        out.causes.push(Cause::new(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {}: {path} in body should have at least {min} items", items.len()),
        ));
    }
    list_duplicates(items, s, path, out);
    if let Some(is) = s.get("items") {
        for (i, item) in items.iter_mut().enumerate() {
            if out.causes.overflowed() {
                return;
            }
            walk(item, is, &format!("{path}[{i}]"), out);
        }
    }
}

/// A string: length bounds and pattern.
fn check_string(st: &str, s: &Value, path: &str, out: &mut Outcome) {
    let len = st.chars().count() as u64;
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        out.causes.push(Cause::new("FieldValueTooLong", path, format!("Too long: may not be more than {max} bytes")));
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        out.causes.push(Cause::new(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {}: {path} in body should be at least {min} chars long", json_str(st)),
        ));
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str)
        && let Some(re) = regex_for(p)
        && !re.is_match(st)
    {
        out.causes.push(Cause::new(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {}: {path} in body should match '{p}'", json_str(st)),
        ));
    }
}

/// A number: minimum and maximum (exclusive or not).
fn check_number(n: &serde_json::Number, s: &Value, path: &str, out: &mut Outcome) {
    let Some(x) = n.as_f64() else { return };
    let excl_min = s.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
    let excl_max = s.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
    if let Some(min) = s.get("minimum").and_then(Value::as_f64)
        && (x < min || (excl_min && x == min))
    {
        let rel = if excl_min { "greater than" } else { "greater than or equal to" };
        out.causes.push(Cause::new("FieldValueInvalid", path, format!("Invalid value: {n}: {path} in body should be {rel} {}", num(min))));
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64)
        && (x > max || (excl_max && x == max))
    {
        let rel = if excl_max { "less than" } else { "less than or equal to" };
        out.causes.push(Cause::new("FieldValueInvalid", path, format!("Invalid value: {n}: {path} in body should be {rel} {}", num(max))));
    }
}

/// What identifies a list item for duplicate detection (None: not comparable).
type ItemIdentity = Box<dyn Fn(&Value) -> Option<Value>>;

/// kube-apiserver's list-type validation: a `set` holds each value once, a `map` each key
/// combination once (server-side apply could not tell such entries apart).
fn list_duplicates(items: &[Value], s: &Value, path: &str, out: &mut Outcome) {
    let identity: ItemIdentity = match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => Box::new(|v: &Value| Some(v.clone())),
        Some("map") => {
            let keys: Vec<String> =
                s["x-kubernetes-list-map-keys"].as_array().into_iter().flatten().filter_map(|k| k.as_str().map(str::to_string)).collect();
            Box::new(move |v: &Value| {
                let m: serde_json::Map<String, Value> = keys.iter().filter_map(|k| v.get(k).map(|x| (k.clone(), x.clone()))).collect();
                (!m.is_empty()).then_some(Value::Object(m))
            })
        }
        _ => return,
    };
    // By serialized identity: big lists stay linear.
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        if out.causes.overflowed() {
            return;
        }
        let Some(id) = identity(item) else { continue };
        if !seen.insert(id.to_string()) {
            out.causes.push(Cause::new("FieldValueDuplicate", format!("{path}[{i}]"), format!("Duplicate value: {}", go_value(&id))));
        }
    }
}

/// How kube-apiserver prints a duplicate (`%#v` of the Go value): strings quoted, key maps as
/// `map[string]interface {}{"name":"a"}`.
fn go_value(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{}:{}", json_str(k), go_value(v))).collect();
            format!("map[string]interface {{}}{{{}}}", parts.join(", "))
        }
        other => render(other),
    }
}

fn num(f: f64) -> String {
    if f.fract() == 0.0 { format!("{}", f as i64) } else { f.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_prune_and_errors() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["plan"],
            "properties": {
                "plan": {"type": "string", "enum": ["small", "large"]},
                "zone": {"type": "string", "default": "z1", "pattern": "^[a-z0-9]+$"},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "S", "metadata": {"name": "a"},
            "spec": {"plan": "huge", "replicas": 9, "bogus": 1, "free": {"anything": 1}}});
        let out = process(&mut obj, &schema);
        assert_eq!(obj["spec"]["zone"], "z1");
        assert!(obj["spec"].get("bogus").is_none());
        assert_eq!(obj["spec"]["free"]["anything"], 1);
        assert_eq!(out.unknown, vec!["spec.bogus".to_string()]);
        let msgs: Vec<String> = out.causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        assert!(msgs.contains(&"spec.plan: Unsupported value: \"huge\": supported values: \"small\", \"large\"".to_string()), "{msgs:?}");
        assert!(msgs.iter().any(|m| m.starts_with("spec.replicas: Invalid value: 9")), "{msgs:?}");
    }

    #[test]
    fn names() {
        assert!(validate_name("good-name.x", false).is_none());
        assert!(validate_name("Bad_Name", false).is_some());
        assert!(validate_name("a.b", true).is_some());
    }

    #[test]
    fn metadata_rules() {
        assert!(validate_metadata(&json!({"labels": {"app.kubernetes.io/name": "web", "x": ""}, "annotations": {"A/b": "{}"}})).is_empty());
        let c = validate_metadata(&json!({"annotations": {"a": {"nested": "map"}}}));
        assert_eq!(c.len(), 1);
        assert!(c[0].message.contains("must be strings"), "{:?}", c);
        assert!(!validate_metadata(&json!({"labels": {"a": "has space"}})).is_empty());
        assert!(!validate_metadata(&json!({"labels": {"-bad": "x"}})).is_empty());
        assert!(!validate_metadata(&json!({"labels": ["x"]})).is_empty());
        let big = "x".repeat(MAX_ANNOTATIONS_BYTES);
        let c = validate_metadata(&json!({"annotations": {"a": big}}));
        assert!(c.iter().any(|c| c.reason == "FieldValueTooLong"), "{:?}", c);
    }

    #[test]
    fn many_bad_labels_stop_at_the_cap() {
        let labels: serde_json::Map<String, Value> = (0..50_000).map(|i| (format!("-{i}"), json!("-"))).collect();
        let c = validate_metadata(&json!({"labels": labels}));
        assert_eq!(c.len(), crate::error::MAX_CAUSES, "{}", c.len());
        assert!(c[c.len() - 1].message.contains("more errors"), "{:?}", c[c.len() - 1]);
    }

    #[test]
    fn a_schema_walk_stops_at_the_cap_and_names_at_most_100_unknown_fields() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "string"}}}}}});
        let mut obj = json!({"spec": {"items": vec![json!(1); 50_000]}});
        let out = process(&mut obj, &schema);
        assert!(out.causes.overflowed());
        assert_eq!(out.causes.into_vec().len(), crate::error::MAX_CAUSES);
        let spec: serde_json::Map<String, Value> = (0..5_000).map(|i| (format!("u{i}"), json!(1))).collect();
        let mut obj = json!({"spec": spec});
        let out = process(&mut obj, &schema);
        assert_eq!((out.unknown.len(), out.unknown_more), (MAX_UNKNOWN_FIELDS, 4_900));
        assert_eq!(obj["spec"].as_object().map(serde_json::Map::len), Some(0), "every unknown field is pruned");
    }

    #[test]
    fn nesting_depth() {
        assert_eq!(depth(&json!("x")), 0);
        assert_eq!(depth(&json!({"a": [1, {"b": {}}]})), 4);
        let mut v = json!(1);
        for _ in 0..100 {
            v = json!({"n": v});
        }
        assert_eq!(depth(&v), 100);
    }
}
