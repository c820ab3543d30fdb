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

/// Operations one JSON patch may have (kube-apiserver's `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// Bytes all `copy` operations of one JSON patch may copy together (kube-apiserver's
/// `JSONPatchMaxCopyBytes`): without it, copying a map into itself doubles it per operation.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Applies an RFC 6902 JSON patch given as raw JSON.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if let Some(n) = patch.as_array().map(Vec::len)
        && n > MAX_JSON_PATCH_OPERATIONS
    {
        return Err(ApiError::too_large_with(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {n}"
        )));
    }
    let mut ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    // Like kube-apiserver (evanphx/json-patch), `test` of `null` succeeds on a missing path:
    // kube-rs's finalizer helper sends `test /metadata/finalizers null` before adding the first.
    ops.0.retain(|op| match op {
        json_patch::PatchOperation::Test(t) => !(t.value.is_null() && t.path.resolve(target).is_err()),
        _ => true,
    });
    let rejected =
        |e: json_patch::PatchError| ApiError::unprocessable(format!("the server rejected our request due to an error in our request: {e}"));
    // One operation at a time so that the copied bytes are counted before each copy is made;
    // `target` is the caller's scratch copy, so a failure halfway leaves nothing behind.
    let mut copied = 0usize;
    for op in &ops.0 {
        if let json_patch::PatchOperation::Copy(c) = op
            && let Ok(from) = c.from.resolve(target)
        {
            copied = copied.saturating_add(serde_json::to_vec(from).map(|b| b.len()).unwrap_or(usize::MAX));
            if copied > MAX_JSON_PATCH_COPY_BYTES {
                return Err(ApiError::unprocessable(format!(
                    "the server rejected our request due to an error in our request: the copy operations of this JSON patch copy more than the limit of {MAX_JSON_PATCH_COPY_BYTES} bytes"
                )));
            }
        }
        json_patch::patch(target, std::slice::from_ref(op)).map_err(rejected)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn copy_bomb_stops_at_the_copy_limit() {
        let mut obj = json!({"metadata": {"name": "x", "annotations": {}}});
        let mut ops = vec![json!({"op": "add", "path": "/metadata/annotations/a", "value": "x".repeat(100)})];
        for i in 0..40 {
            ops.push(json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/c{i}")}));
        }
        let err = json_patch(&mut obj, &json!(ops)).err().map(|e| (e.code, e.message)).unwrap_or_default();
        assert_eq!(err.0, 422, "{}", err.1);
        assert!(err.1.contains("3145728 bytes"), "{}", err.1);
    }

    #[test]
    fn too_many_operations() {
        let mut obj = json!({});
        let ops: Vec<_> = (0..=MAX_JSON_PATCH_OPERATIONS).map(|_| json!({"op": "test", "path": "", "value": {}})).collect();
        let err = json_patch(&mut obj, &json!(ops)).err().map(|e| (e.code, e.message)).unwrap_or_default();
        assert_eq!(err.0, 413);
        assert!(err.1.contains("10000, got 10001"), "{}", err.1);
    }

    #[test]
    fn ordinary_patch_still_applies() -> Result<(), ApiError> {
        let mut obj = json!({"metadata": {"finalizers": ["a"]}});
        json_patch(
            &mut obj,
            &json!([{"op": "test", "path": "/metadata/labels", "value": null}, {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
            {"op": "copy", "from": "/metadata/finalizers", "path": "/metadata/f2"}]),
        )?;
        assert_eq!(obj["metadata"]["labels"]["x"], "y");
        assert_eq!(obj["metadata"]["f2"], json!(["a"]));
        Ok(())
    }
}
