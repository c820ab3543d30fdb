//! JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

use serde_json::Value;

use crate::error::ApiError;

/// The patch flavours a client can send, by Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// application/merge-patch+json
    Merge,
    /// application/json-patch+json
    Json,
    /// application/strategic-merge-patch+json (built-in kinds only, see [`crate::strategic`])
    Strategic,
    /// application/apply-patch+yaml (server-side apply)
    Apply,
}

impl PatchType {
    /// Maps a Content-Type to a patch type, 415 otherwise.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
            other => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
            ))),
        }
    }
}

/// Applies an RFC 7386 merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies an RFC 6902 JSON patch given as raw JSON.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let mut ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    // Like kube-apiserver (evanphx/json-patch), `test` of `null` succeeds on a missing path:
    // kube-rs's finalizer helper sends `test /metadata/finalizers null` before adding the first.
    ops.0.retain(|op| match op {
        json_patch::PatchOperation::Test(t) => !(t.value.is_null() && t.path.resolve(target).is_err()),
        _ => true,
    });
    json_patch::patch(target, &ops).map_err(|e| ApiError::unprocessable(format!("the server rejected our request due to an error in our request: {e}")))
}
