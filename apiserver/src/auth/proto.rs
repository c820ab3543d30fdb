//! Protobuf request bodies of the review kinds and TokenRequest.
//!
//! kubectl's typed clients (`kubectl create token`, `kubectl auth can-i`, `kubectl auth
//! whoami`) send these as `application/vnd.kubernetes.protobuf`; the fields are decoded into
//! the JSON the handlers read (field numbers from k8s.io/api authentication/v1 and
//! authorization/v1). Stored kinds (ServiceAccount, RBAC, ...) are [`crate::protobuf`]'s.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::wire::{Field, bad, fields, text};

/// How to turn one message into JSON: field number -> (JSON name, kind).
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Strs,
    Int,
    Msg(&'static [(u64, &'static str, Kind)]),
    /// map<string, string>
    StrMap,
    /// map<string, ExtraValue{repeated string items = 1}>
    Extra,
}

const META: &[(u64, &str, Kind)] = &[
    (1, "name", Kind::Str),
    (2, "generateName", Kind::Str),
    (3, "namespace", Kind::Str),
    (11, "labels", Kind::StrMap),
    (12, "annotations", Kind::StrMap),
    (14, "finalizers", Kind::Strs),
];
const RESOURCE_ATTRS: &[(u64, &str, Kind)] = &[
    (1, "namespace", Kind::Str),
    (2, "verb", Kind::Str),
    (3, "group", Kind::Str),
    (4, "version", Kind::Str),
    (5, "resource", Kind::Str),
    (6, "subresource", Kind::Str),
    (7, "name", Kind::Str),
];
const NON_RESOURCE_ATTRS: &[(u64, &str, Kind)] = &[(1, "path", Kind::Str), (2, "verb", Kind::Str)];
const SSAR_SPEC: &[(u64, &str, Kind)] =
    &[(1, "resourceAttributes", Kind::Msg(RESOURCE_ATTRS)), (2, "nonResourceAttributes", Kind::Msg(NON_RESOURCE_ATTRS))];
const SAR_SPEC: &[(u64, &str, Kind)] = &[
    (1, "resourceAttributes", Kind::Msg(RESOURCE_ATTRS)),
    (2, "nonResourceAttributes", Kind::Msg(NON_RESOURCE_ATTRS)),
    (3, "user", Kind::Str),
    (4, "groups", Kind::Strs),
    (5, "extra", Kind::Extra),
    (6, "uid", Kind::Str),
];
const SSRR_SPEC: &[(u64, &str, Kind)] = &[(1, "namespace", Kind::Str)];
const TOKEN_REQUEST_SPEC: &[(u64, &str, Kind)] = &[
    (1, "audiences", Kind::Strs),
    (
        3,
        "boundObjectRef",
        Kind::Msg(&[(1, "kind", Kind::Str), (2, "apiVersion", Kind::Str), (3, "name", Kind::Str), (4, "uid", Kind::Str)]),
    ),
    (4, "expirationSeconds", Kind::Int),
];
const TOKEN_REVIEW_SPEC: &[(u64, &str, Kind)] = &[(1, "token", Kind::Str), (2, "audiences", Kind::Strs)];

fn message(buf: &[u8], schema: &[(u64, &str, Kind)]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (n, f) in fields(buf)? {
        let Some((_, name, kind)) = schema.iter().find(|(num, _, _)| *num == n) else { continue };
        match (kind, f) {
            (Kind::Str, Field::Bytes(b)) => {
                m.insert(name.to_string(), json!(text(b)?));
            }
            (Kind::Strs, Field::Bytes(b)) => {
                let e = m.entry(name.to_string()).or_insert_with(|| json!([]));
                if let Some(a) = e.as_array_mut() {
                    a.push(json!(text(b)?));
                }
            }
            (Kind::Int, Field::Varint(v)) => {
                m.insert(name.to_string(), json!(v as i64));
            }
            (Kind::Msg(inner), Field::Bytes(b)) => {
                m.insert(name.to_string(), message(b, inner)?);
            }
            (Kind::StrMap, Field::Bytes(b)) => {
                let (mut k, mut v) = (String::new(), String::new());
                for (en, ef) in fields(b)? {
                    match (en, ef) {
                        (1, Field::Bytes(x)) => k = text(x)?,
                        (2, Field::Bytes(x)) => v = text(x)?,
                        _ => {}
                    }
                }
                let e = m.entry(name.to_string()).or_insert_with(|| json!({}));
                e[k] = json!(v);
            }
            (Kind::Extra, Field::Bytes(b)) => {
                let (mut key, mut items) = (String::new(), vec![]);
                for (en, ef) in fields(b)? {
                    match (en, ef) {
                        (1, Field::Bytes(k)) => key = text(k)?,
                        (2, Field::Bytes(v)) => {
                            for (_, item) in fields(v)? {
                                if let Field::Bytes(s) = item {
                                    items.push(json!(text(s)?));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let e = m.entry(name.to_string()).or_insert_with(|| json!({}));
                e[key] = Value::Array(items);
            }
            _ => return Err(bad()),
        }
    }
    Ok(Value::Object(m))
}

/// Decodes a `k8s\0`-prefixed protobuf body of a review kind or TokenRequest into JSON.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body.strip_prefix(b"k8s\x00").ok_or_else(bad)?;
    let (mut api_version, mut kind, mut raw): (String, String, &[u8]) = (String::new(), String::new(), &[]);
    for (n, f) in fields(rest)? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                for (tn, tf) in fields(tm)? {
                    match (tn, tf) {
                        (1, Field::Bytes(s)) => api_version = text(s)?,
                        (2, Field::Bytes(s)) => kind = text(s)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(s)) => raw = s,
            _ => {}
        }
    }
    let spec: Option<&[(u64, &str, Kind)]> = match kind.as_str() {
        "SelfSubjectAccessReview" => Some(SSAR_SPEC),
        "SubjectAccessReview" | "LocalSubjectAccessReview" => Some(SAR_SPEC),
        "SelfSubjectRulesReview" => Some(SSRR_SPEC),
        "TokenRequest" => Some(TOKEN_REQUEST_SPEC),
        "TokenReview" => Some(TOKEN_REVIEW_SPEC),
        "SelfSubjectReview" => None,
        other => {
            return Err(ApiError::unsupported_media_type(format!("protobuf is not supported for {other}; send application/json")));
        }
    };
    let mut top: Vec<(u64, &str, Kind)> = vec![(1, "metadata", Kind::Msg(META))];
    if let Some(s) = spec {
        top.push((2, "spec", Kind::Msg(s)));
    }
    let mut v = message(raw, &top)?;
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_self_subject_access_review() -> Result<(), ApiError> {
        let attrs = [field(1, b"demo"), field(2, b"list"), field(3, b"provisioning.dev"), field(5, b"servers")].concat();
        let spec = field(1, &attrs);
        let obj = [field(1, &[]), field(2, &spec)].concat();
        let tm = [field(1, b"authorization.k8s.io/v1"), field(2, b"SelfSubjectAccessReview")].concat();
        let body = [b"k8s\x00".to_vec(), field(1, &tm), field(2, &obj)].concat();
        let v = decode(&body)?;
        assert_eq!(v["kind"], "SelfSubjectAccessReview");
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "demo", "verb": "list", "group": "provisioning.dev", "resource": "servers"})
        );
        assert!(decode(b"k8s\x00\xff").is_err());
        assert!(decode(b"nope").is_err());
        Ok(())
    }
}
