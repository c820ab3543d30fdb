//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! kubectl's typed commands (`kubectl create deployment|service|job|cronjob|configmap|secret|
//! namespace|serviceaccount|role|rolebinding|clusterrole|clusterrolebinding|quota|pdb`) send
//! built-in kinds as protobuf. Those kinds are decoded by our own table ([`kinds`]) into the
//! same JSON the server stores; the review kinds and TokenRequest go to [`crate::auth::proto`];
//! any other kind is a 415 asking for JSON. Responses are always JSON (kubectl accepts it).
//! The wire format is read by [`crate::wire`].

pub mod kinds;

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::wire::{Field, bad, fields, text};
use provisioning_yaml::bounded::Meter;

/// The `runtime.Unknown` envelope after the `k8s\0` magic: apiVersion, kind and the raw object.
fn envelope(body: &[u8]) -> Result<(String, String, &[u8]), ApiError> {
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
            // contentEncoding and contentType: empty for objects kubectl sends.
            (3 | 4, Field::Bytes([])) => {}
            (3 | 4, Field::Bytes(_)) => {
                return Err(ApiError::unsupported_media_type("encoded protobuf content is not supported; send application/json"));
            }
            _ => return Err(bad()),
        }
    }
    Ok((api_version, kind, raw))
}

/// Memory charged per byte of a protobuf body (see [`decode`]).
const COST_PER_BYTE: usize = 2 * provisioning_yaml::bounded::LIMIT_PER_BYTE;

/// Decodes a `k8s\0`-prefixed protobuf body into the JSON object it stands for, its memory
/// charged to the request's `meter` up front (429 when the shared budget cannot cover it).
pub fn decode(body: &[u8], meter: &Meter) -> Result<Value, ApiError> {
    // Every field takes at least two bytes and decodes to at most a node, a map entry and its
    // bytes; embedded JSON (`fieldsV1`) at most what bounded JSON allows: charged up front.
    meter.reserve(body.len().saturating_mul(COST_PER_BYTE)).map_err(|e| ApiError::too_many_requests(e.to_string()))?;
    let (api_version, kind, raw) = envelope(body)?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version.as_str()));
    let Some(msg) = kinds::message_for(group, &kind).filter(|_| version == "v1") else {
        // Review kinds and TokenRequest (or a 415 naming the kind).
        return crate::auth::proto::decode(body);
    };
    let mut v = kinds::message(raw, msg)?;
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}

#[cfg(test)]
mod tests;
