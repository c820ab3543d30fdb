//! Minimal decoding of Kubernetes protobuf request bodies.
//!
//! kubectl's typed clients (`kubectl create configmap|secret|namespace`) send built-in kinds as
//! `application/vnd.kubernetes.protobuf`. Only those kinds are decoded, into the same JSON
//! the server stores; responses are always JSON (kubectl accepts it). The wire format is read
//! by [`crate::wire`]; other kinds go to [`crate::auth::proto`].

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::wire::{Field, Reader, bad, text};

fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), ApiError> {
    let mut r = Reader::new(b);
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    while let Some((n, f)) = r.next_field()? {
        match (n, f) {
            (1, Field::Bytes(s)) => k = text(s)?,
            (2, Field::Bytes(s)) if bytes_value => v = json!(base64::engine::general_purpose::STANDARD.encode(s)),
            (2, Field::Bytes(s)) => v = json!(text(s)?),
            _ => {}
        }
    }
    Ok((k, v))
}

fn owner_ref(b: &[u8]) -> Result<Value, ApiError> {
    let mut r = Reader::new(b);
    let mut m = Map::new();
    while let Some((n, f)) = r.next_field()? {
        match (n, f) {
            (1, Field::Bytes(s)) => drop(m.insert("kind".into(), json!(text(s)?))),
            (3, Field::Bytes(s)) => drop(m.insert("name".into(), json!(text(s)?))),
            (4, Field::Bytes(s)) => drop(m.insert("uid".into(), json!(text(s)?))),
            (5, Field::Bytes(s)) => drop(m.insert("apiVersion".into(), json!(text(s)?))),
            (6, Field::Varint(v)) => drop(m.insert("controller".into(), json!(v != 0))),
            (7, Field::Varint(v)) => drop(m.insert("blockOwnerDeletion".into(), json!(v != 0))),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    let mut r = Reader::new(b);
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut owners = vec![];
    let mut finalizers = vec![];
    while let Some((n, f)) = r.next_field()? {
        match (n, f) {
            (1, Field::Bytes(s)) => drop(m.insert("name".into(), json!(text(s)?))),
            (2, Field::Bytes(s)) => drop(m.insert("generateName".into(), json!(text(s)?))),
            (3, Field::Bytes(s)) => drop(m.insert("namespace".into(), json!(text(s)?))),
            (6, Field::Bytes(s)) => drop(m.insert("resourceVersion".into(), json!(text(s)?))),
            (11, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, false)?;
                labels.insert(k, v);
            }
            (12, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, false)?;
                annotations.insert(k, v);
            }
            (13, Field::Bytes(s)) => owners.push(owner_ref(s)?),
            (14, Field::Bytes(s)) => finalizers.push(json!(text(s)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Value::Array(owners));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(m))
}

fn kind_body(kind: &str, b: &[u8]) -> Result<Value, ApiError> {
    let mut r = Reader::new(b);
    let mut obj = Map::new();
    let mut data = Map::new();
    let mut binary = Map::new();
    let mut string_data = Map::new();
    while let Some((n, f)) = r.next_field()? {
        match (kind, n, f) {
            (_, 1, Field::Bytes(s)) => drop(obj.insert("metadata".into(), object_meta(s)?)),
            ("ConfigMap", 2, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, false)?;
                data.insert(k, v);
            }
            ("ConfigMap", 3, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, true)?;
                binary.insert(k, v);
            }
            ("ConfigMap", 4, Field::Varint(v)) | ("Secret", 5, Field::Varint(v)) => drop(obj.insert("immutable".into(), json!(v != 0))),
            ("Secret", 2, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, true)?;
                data.insert(k, v);
            }
            ("Secret", 3, Field::Bytes(s)) => drop(obj.insert("type".into(), json!(text(s)?))),
            ("Secret", 4, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, false)?;
                string_data.insert(k, v);
            }
            _ => {}
        }
    }
    if !data.is_empty() {
        obj.insert("data".into(), Value::Object(data));
    }
    if !binary.is_empty() {
        obj.insert("binaryData".into(), Value::Object(binary));
    }
    if !string_data.is_empty() {
        obj.insert("stringData".into(), Value::Object(string_data));
    }
    Ok(Value::Object(obj))
}

/// Decodes a `k8s\0`-prefixed protobuf body of a ConfigMap, Secret or Namespace into JSON.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body.strip_prefix(b"k8s\x00").ok_or_else(bad)?;
    let mut r = Reader::new(rest);
    let (mut api_version, mut kind, mut raw): (String, String, &[u8]) = (String::new(), String::new(), &[]);
    while let Some((n, f)) = r.next_field()? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                let mut t = Reader::new(tm);
                while let Some((tn, tf)) = t.next_field()? {
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
    if !matches!(kind.as_str(), "ConfigMap" | "Secret" | "Namespace") {
        // ServiceAccount, RBAC and review kinds (or a 415 naming the kind).
        return crate::auth::proto::decode(body);
    }
    let mut v = kind_body(&kind, raw)?;
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}
