//! `meta.k8s.io/v1 Table` output from printer columns, with a small JSONPath evaluator.

use serde_json::{Value, json};

use crate::registry::{PrinterColumn, ResourceType};

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    Filter(String, String),
}

fn parse_path(path: &str) -> Vec<Step> {
    let p = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut steps = vec![];
    let chars: Vec<char> = p.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                i += 1;
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                let f: String = chars[start..i].iter().collect();
                if !f.is_empty() {
                    steps.push(Step::Field(f));
                }
            }
            '[' => {
                let start = i + 1;
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '[' {
                        depth += 1;
                    } else if chars[i] == ']' {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    i += 1;
                }
                let inner: String = chars[start..i.min(chars.len())].iter().collect();
                i += 1;
                let inner = inner.trim();
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Ok(n) = inner.parse::<usize>() {
                    steps.push(Step::Index(n));
                } else if let Some(expr) = inner.strip_prefix("?(").and_then(|s| s.strip_suffix(')')) {
                    if let Some((l, r)) = expr.split_once("==") {
                        let field = l.trim().trim_start_matches("@.").to_string();
                        let val = r.trim().trim_matches('"').trim_matches('\'').to_string();
                        steps.push(Step::Filter(field, val));
                    }
                } else {
                    let key = inner.trim_matches('\'').trim_matches('"');
                    steps.push(Step::Field(key.to_string()));
                }
            }
            _ => {
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                steps.push(Step::Field(chars[start..i].iter().collect()));
            }
        }
    }
    steps
}

/// Evaluates a simple JSONPath; returns every match.
pub fn eval<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut cur = vec![obj];
    for step in parse_path(path) {
        let mut next = vec![];
        for v in cur {
            match &step {
                Step::Field(f) => {
                    if let Some(x) = v.get(f) {
                        next.push(x);
                    }
                }
                Step::Index(n) => {
                    if let Some(x) = v.get(*n) {
                        next.push(x);
                    }
                }
                Step::All => next.extend(v.as_array().into_iter().flatten()),
                Step::Filter(f, want) => {
                    for item in v.as_array().into_iter().flatten() {
                        let got = item.get(f).map(|g| match g {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        });
                        if got.as_deref() == Some(want.as_str()) {
                            next.push(item);
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

/// Kubernetes' HumanDuration (as in `kubectl get` AGE).
pub fn human_duration(d: chrono::Duration) -> String {
    let secs = d.num_seconds();
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 60 * 2 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{dy}d", hours / 24 / 365) };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(ts: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(ts) {
        Ok(t) => human_duration(chrono::Utc::now().signed_duration_since(t.with_timezone(&chrono::Utc))),
        Err(_) => "<invalid>".into(),
    }
}

fn cell(col: &PrinterColumn, obj: &Value) -> Value {
    match col.json_path.as_str() {
        "#datacount" => {
            let n = obj["data"].as_object().map(|m| m.len()).unwrap_or(0) + obj["binaryData"].as_object().map(|m| m.len()).unwrap_or(0);
            return json!(n);
        }
        "#lastseen" | "#firstseen" | "#count" | "#fieldpath" | "#source" | "#message" | "#involved" => {
            return event_cell(&col.json_path, obj);
        }
        path if path.starts_with("#builtin:") => return crate::builtin_cells::cell(&path["#builtin:".len()..], obj),
        _ => {}
    }
    let found = eval(obj, &col.json_path);
    let Some(first) = found.first() else { return Value::Null };
    match col.type_.as_str() {
        "date" => first.as_str().map(|s| json!(age(s))).unwrap_or(Value::Null),
        "integer" => first.as_i64().map(|n| json!(n)).unwrap_or_else(|| json!(render(first))),
        "number" => first.as_f64().map(|n| json!(n)).unwrap_or_else(|| json!(render(first))),
        "boolean" => first.as_bool().map(|b| json!(b)).unwrap_or_else(|| json!(render(first))),
        _ => {
            let parts: Vec<String> = found.iter().map(|v| render(v)).collect();
            json!(parts.join(" "))
        }
    }
}

/// Cells of kube-apiserver's Event printer (`printEvent`), for either Event API version.
fn event_cell(which: &str, obj: &Value) -> Value {
    let pick = |keys: &[&str]| keys.iter().map(|k| &obj[*k]).find(|v| !v.is_null()).cloned().unwrap_or(Value::Null);
    let since = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(age);
    let first = since(&pick(&["firstTimestamp", "deprecatedFirstTimestamp"])).or_else(|| since(&obj["eventTime"]));
    let io = if obj.get("involvedObject").is_some() { &obj["involvedObject"] } else { &obj["regarding"] };
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    match which {
        "#lastseen" => {
            let last = if obj["series"].is_object() {
                since(&obj["series"]["lastObservedTime"])
            } else {
                since(&pick(&["lastTimestamp", "deprecatedLastTimestamp"])).or_else(|| first.clone())
            };
            json!(last.unwrap_or_else(|| "<unknown>".into()))
        }
        "#firstseen" => json!(first.unwrap_or_else(|| "<unknown>".into())),
        "#count" => {
            let n = if obj["series"].is_object() { obj["series"]["count"].as_i64() } else { pick(&["count", "deprecatedCount"]).as_i64() };
            json!(n.filter(|n| *n > 0).unwrap_or(1))
        }
        "#fieldpath" => json!(s(&io["fieldPath"])),
        "#source" => {
            let src = if obj.get("source").is_some() { &obj["source"] } else { &obj["deprecatedSource"] };
            let component =
                Some(s(&src["component"])).filter(|c| !c.is_empty()).unwrap_or_else(|| s(&obj["reportingController"]).to_string());
            let component = if component.is_empty() { s(&obj["reportingComponent"]) } else { component };
            let host = Some(s(&src["host"])).filter(|h| !h.is_empty()).unwrap_or_else(|| s(&obj["reportingInstance"]));
            json!(if host.is_empty() { component } else { format!("{component}, {host}") })
        }
        "#message" => json!(s(&pick(&["message", "note"])).trim()),
        _ => {
            let kind = s(&io["kind"]).to_lowercase();
            let name = s(&io["name"]);
            json!(if name.is_empty() { kind } else { format!("{kind}/{name}") })
        }
    }
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether the kind's printer has its own Name column (Events: last, wide only) instead of
/// the leading one every other kind has.
fn own_name_column(rt: &ResourceType) -> bool {
    rt.printer_columns.iter().any(|c| c.format == "name")
}

/// Column definitions (Name first, unless the kind places it itself).
pub fn columns(rt: &ResourceType) -> Vec<Value> {
    if own_name_column(rt) {
        return rt
            .printer_columns
            .iter()
            .map(|c| json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}))
            .collect();
    }
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names", "priority": 0}),
    ];
    for c in &rt.printer_columns {
        cols.push(json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    cols
}

/// One Table row for an object (taken, not copied: with "Object" it becomes the row's object).
/// `include_object`: "None", "Metadata" (default) or "Object".
pub fn row(rt: &ResourceType, mut obj: Value, include_object: &str) -> Value {
    let mut cells = if own_name_column(rt) { vec![] } else { vec![json!(obj["metadata"]["name"].as_str().unwrap_or_default())] };
    for c in &rt.printer_columns {
        cells.push(cell(c, &obj));
    }
    let object = match include_object {
        "None" => Value::Null,
        "Object" => obj,
        _ => {
            let mut md = obj["metadata"].take();
            if let Some(m) = md.as_object_mut() {
                m.remove("managedFields");
            }
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": md})
        }
    };
    let mut r = json!({"cells": cells});
    if !object.is_null() {
        r["object"] = object;
    }
    r
}

/// A Table for the given objects.
pub fn table(rt: &ResourceType, objs: Vec<Value>, rv: Option<String>, cont: Option<String>, include_object: &str, headers: bool) -> Value {
    let rows: Vec<Value> = objs.into_iter().map(|o| row(rt, o, include_object)).collect();
    let mut t = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta(rv, cont), "rows": rows});
    t["columnDefinitions"] = if headers { json!(columns(rt)) } else { json!([]) };
    t
}

/// The start of a Table list body, up to and including `"rows":[` (rows made with [`row`]
/// follow, one at a time, then `]}`: see [`crate::list_body`]).
pub fn table_head(rt: &ResourceType, rv: Option<String>, cont: Option<String>) -> Vec<u8> {
    let head = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta(rv, cont), "columnDefinitions": columns(rt)});
    let mut out = serde_json::to_vec(&head).unwrap_or_default();
    out.pop(); // the closing brace: the rows follow
    out.extend_from_slice(b",\"rows\":[");
    out
}

fn list_meta(rv: Option<String>, cont: Option<String>) -> Value {
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv);
    }
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_filter() {
        let obj = json!({"status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"a": [1, 2]}});
        let r = eval(&obj, ".status.conditions[?(@.type==\"Ready\")].status");
        assert_eq!(r, vec![&json!("True")]);
        assert_eq!(eval(&obj, ".spec.a[1]"), vec![&json!(2)]);
        assert!(eval(&obj, ".spec.missing").is_empty());
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(chrono::Duration::seconds(5)), "5s");
        assert_eq!(human_duration(chrono::Duration::seconds(300)), "5m");
        assert_eq!(human_duration(chrono::Duration::seconds(3600 * 30)), "30h");
    }
}
