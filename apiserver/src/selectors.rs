//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`) and field selectors
//! (`metadata.name`, `metadata.namespace`).

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
                && !valid_key(k) {
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
}

/// A parsed field selector over metadata.name / metadata.namespace.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
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
            if k != "metadata.name" && k != "metadata.namespace" {
                return Err(ApiError::bad_request(format!("field label not supported: {k}")));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Whether an object with this namespace and name matches.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let actual = if k == "metadata.name" { name } else { namespace };
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
        let f = FieldSelector::parse("metadata.name=a,metadata.namespace!=b")?;
        assert!(f.matches("c", "a"));
        assert!(!f.matches("b", "a"));
        assert!(FieldSelector::parse("spec.x=1").is_err());
        Ok(())
    }
}
