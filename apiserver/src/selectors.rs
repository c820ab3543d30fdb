//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`) and field selectors
//! (`metadata.name`, `metadata.namespace`, plus each built-in kind's own field labels).

use std::collections::BTreeMap;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

fn split_top(s: &str) -> Vec<String> {
    let mut out = vec![];
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 317 && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |m: &str| ApiError::bad_request(format!("unable to parse requirement: {m}"));
        let mut reqs = vec![];
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let set_op = |p: &str, kw: &str| -> Option<(String, Vec<String>)> {
                let idx = p.find(kw)?;
                let key = p[..idx].trim();
                let rest = p[idx + kw.len()..].trim();
                let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
                Some((key.to_string(), inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect()))
            };
            if let Some(k) = p.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(bad(p));
                }
                reqs.push(Req::NotExists(k.to_string()));
            } else if let Some((k, v)) = set_op(p, " notin ") {
                if !valid_key(&k) {
                    return Err(bad(p));
                }
                reqs.push(Req::NotIn(k, v));
            } else if let Some((k, v)) = set_op(p, " in ") {
                if !valid_key(&k) {
                    return Err(bad(p));
                }
                reqs.push(Req::In(k, v));
            } else if let Some((k, v)) = p.split_once("!=") {
                reqs.push(Req::Ne(k.trim().to_string(), v.trim().to_string()));
            } else if let Some((k, v)) = p.split_once("==") {
                reqs.push(Req::Eq(k.trim().to_string(), v.trim().to_string()));
            } else if let Some((k, v)) = p.split_once('=') {
                reqs.push(Req::Eq(k.trim().to_string(), v.trim().to_string()));
            } else if valid_key(p) {
                reqs.push(Req::Exists(p.to_string()));
            } else {
                return Err(bad(p));
            }
            if let Some(Req::Eq(k, _) | Req::Ne(k, _)) = reqs.last()
                && !valid_key(k)
            {
                return Err(bad(p));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::Ne(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Whether this selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The requirements an index of label values can answer (`k=v`, `k==v`, `k in (…)`), as
    /// the key and the values one of which a matching object must carry.
    pub fn indexable(&self) -> impl Iterator<Item = (&str, Vec<&str>)> {
        self.0.iter().filter_map(|r| match r {
            Req::Eq(k, v) => Some((k.as_str(), vec![v.as_str()])),
            Req::In(k, vs) => Some((k.as_str(), vs.iter().map(String::as_str).collect())),
            _ => None,
        })
    }
}

/// Which field labels a resource accepts in `fieldSelector`, as kube-apiserver's field label
/// conversion functions define them; anything else is a 400 naming the label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldLabels {
    /// `metadata.name`, `metadata.namespace` (every kind, custom resources included).
    Generic,
    /// Namespaces also select on `status.phase`.
    Namespace,
    /// Secrets also select on `type`.
    Secret,
    /// core/v1 Events: `involvedObject.*`, `reason`, `reportingComponent`, `source`, `type`.
    CoreEvent,
    /// events.k8s.io/v1 Events: `regarding.*`, `reason`, `reportingController`, `type`.
    EventsGroupEvent,
}

/// The `involvedObject` fields an Event selects on (core/v1 names; events.k8s.io says `regarding`).
const INVOLVED: [&str; 7] = ["kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"];

impl FieldLabels {
    /// The labels of a served resource, from its storage key and group.
    pub fn for_resource(storage: &str, group: &str) -> Self {
        match storage {
            "/events" if group == "events.k8s.io" => FieldLabels::EventsGroupEvent,
            "/events" => FieldLabels::CoreEvent,
            "/namespaces" => FieldLabels::Namespace,
            "/secrets" => FieldLabels::Secret,
            _ => FieldLabels::Generic,
        }
    }

    /// Maps a label as the client spelled it to the name stored in [`selectable_fields`]
    /// (core/v1 spelling), None when the resource does not support it.
    fn canonical(self, label: &str) -> Option<String> {
        if label == "metadata.name" || label == "metadata.namespace" {
            return Some(label.to_string());
        }
        match self {
            FieldLabels::Generic => None,
            FieldLabels::Namespace => (label == "status.phase").then(|| label.to_string()),
            FieldLabels::Secret => (label == "type").then(|| label.to_string()),
            FieldLabels::CoreEvent => {
                let ok = matches!(label, "reason" | "reportingComponent" | "source" | "type")
                    || label.strip_prefix("involvedObject.").is_some_and(|f| INVOLVED.contains(&f));
                ok.then(|| label.to_string())
            }
            FieldLabels::EventsGroupEvent => match label {
                "reason" | "type" => Some(label.to_string()),
                "reportingController" => Some("reportingComponent".to_string()),
                _ => label.strip_prefix("regarding.").filter(|f| INVOLVED.contains(f)).map(|f| format!("involvedObject.{f}")),
            },
        }
    }
}

/// The selectable fields of a stored object beyond name and namespace, under their core/v1
/// names, computed once per write (see `storage::Entry`). Events may be stored in either
/// API version, so both spellings are read.
pub fn selectable_fields(storage: &str, obj: &serde_json::Value) -> Vec<(String, String)> {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    match storage {
        "/events" => {
            let io = if obj.get("involvedObject").is_some() { &obj["involvedObject"] } else { &obj["regarding"] };
            let mut out: Vec<(String, String)> = INVOLVED.iter().map(|f| (format!("involvedObject.{f}"), s(&io[*f]))).collect();
            let reporting =
                [&obj["reportingComponent"], &obj["reportingController"]].iter().map(|v| s(v)).find(|v| !v.is_empty()).unwrap_or_default();
            let source = [&obj["source"]["component"], &obj["deprecatedSource"]["component"]]
                .iter()
                .map(|v| s(v))
                .find(|v| !v.is_empty())
                .unwrap_or_else(|| reporting.clone());
            out.push(("reason".into(), s(&obj["reason"])));
            out.push(("reportingComponent".into(), reporting));
            out.push(("source".into(), source));
            out.push(("type".into(), s(&obj["type"])));
            out
        }
        "/namespaces" => vec![("status.phase".into(), s(&obj["status"]["phase"]))],
        "/secrets" => vec![("type".into(), s(&obj["type"]))],
        _ => vec![],
    }
}

/// A parsed field selector: requirements on `metadata.name`, `metadata.namespace` and the
/// kind's own selectable fields.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter for a resource accepting `labels`.
    pub fn parse(s: &str, labels: FieldLabels) -> Result<Self, ApiError> {
        let mut out = vec![];
        for part in s.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{s}'; can't understand '{p}'")));
            };
            let k = k.trim();
            let Some(canonical) = labels.canonical(k) else {
                return Err(ApiError::bad_request(format!("field label not supported: {k}")));
            };
            out.push((canonical, eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Whether an object with this namespace, name and selectable fields matches; a field the
    /// object does not have counts as empty, as upstream's field sets do.
    pub fn matches(&self, namespace: &str, name: &str, fields: &[(String, String)]) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let actual = match k.as_str() {
                "metadata.name" => name,
                "metadata.namespace" => namespace,
                other => fields.iter().find(|(f, _)| f == other).map(|(_, x)| x.as_str()).unwrap_or_default(),
            };
            (actual == v) == *eq
        })
    }

    /// The name this selector pins, if any (`metadata.name=x`).
    pub fn exact_name(&self) -> Option<&str> {
        self.0.iter().find(|(k, eq, _)| k == "metadata.name" && *eq).map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_selector_operators() -> Result<(), ApiError> {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        assert!(LabelSelector::parse("app=web")?.matches(&l));
        assert!(LabelSelector::parse("app==web,tier")?.matches(&l));
        assert!(!LabelSelector::parse("app!=web")?.matches(&l));
        assert!(LabelSelector::parse("app in (web, db)")?.matches(&l));
        assert!(!LabelSelector::parse("app notin (web)")?.matches(&l));
        assert!(LabelSelector::parse("!missing")?.matches(&l));
        assert!(!LabelSelector::parse("missing")?.matches(&l));
        assert!(LabelSelector::parse("a in (x,y),!b")?.matches(&labels(&[("a", "y")])));
        assert!(LabelSelector::parse("bad key=1").is_err());
        Ok(())
    }

    #[test]
    fn field_selector() -> Result<(), ApiError> {
        let f = FieldSelector::parse("metadata.name=a,metadata.namespace!=b", FieldLabels::Generic)?;
        assert!(f.matches("c", "a", &[]));
        assert!(!f.matches("b", "a", &[]));
        assert!(FieldSelector::parse("spec.x=1", FieldLabels::Generic).is_err());
        Ok(())
    }

    #[test]
    fn event_field_labels_in_both_versions() -> Result<(), ApiError> {
        let core = serde_json::json!({"involvedObject": {"kind": "Server", "name": "web-1", "namespace": "dev", "uid": "u1"},
            "reason": "Provisioned", "type": "Warning", "source": {"component": "provisioning-controller"},
            "reportingComponent": "provisioning-controller"});
        let ev = serde_json::json!({"regarding": {"kind": "Server", "name": "web-1", "namespace": "dev", "uid": "u1"},
            "reason": "Provisioned", "type": "Warning", "reportingController": "provisioning-controller",
            "deprecatedSource": {"component": "provisioning-controller"}});
        for obj in [&core, &ev] {
            let fields = selectable_fields("/events", obj);
            for (sel, labels) in [
                ("involvedObject.kind=Server,involvedObject.name=web-1,involvedObject.uid=u1,type=Warning", FieldLabels::CoreEvent),
                ("source=provisioning-controller,reason=Provisioned", FieldLabels::CoreEvent),
                ("involvedObject.fieldPath=,involvedObject.namespace=dev", FieldLabels::CoreEvent),
                ("regarding.kind=Server,regarding.name=web-1,reportingController=provisioning-controller", FieldLabels::EventsGroupEvent),
            ] {
                assert!(FieldSelector::parse(sel, labels)?.matches("dev", "e1", &fields), "{sel} on {obj}");
            }
            assert!(!FieldSelector::parse("type=Normal", FieldLabels::CoreEvent)?.matches("dev", "e1", &fields));
        }
        let err = FieldSelector::parse("regarding.kind=Server", FieldLabels::CoreEvent).err().map(|e| e.message).unwrap_or_default();
        assert_eq!(err, "field label not supported: regarding.kind");
        assert!(FieldSelector::parse("involvedObject.kind=Server", FieldLabels::EventsGroupEvent).is_err());
        assert!(FieldSelector::parse("involvedObject.bogus=x", FieldLabels::CoreEvent).is_err());
        assert!(FieldSelector::parse("status.phase=Active", FieldLabels::Namespace).is_ok());
        assert!(FieldSelector::parse("status.phase=Active", FieldLabels::Generic).is_err());
        Ok(())
    }
}
