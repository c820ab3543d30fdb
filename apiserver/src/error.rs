//! API errors rendered as `meta/v1 Status` objects, the way kube-apiserver reports them.

use serde_json::{Value, json};

/// One field-level cause of an `Invalid` error.
#[derive(Debug, Clone)]
pub struct Cause {
    /// Machine-readable reason, e.g. `FieldValueRequired`.
    pub reason: &'static str,
    /// Human message without the field path.
    pub message: String,
    /// Dotted field path, e.g. `spec.plan`.
    pub field: String,
}

impl Cause {
    /// A cause with the given reason, field path and message.
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { reason, message: message.into(), field: field.into() }
    }
}

/// An error answered to a client as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (NotFound, AlreadyExists, Conflict, Invalid, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `Status.details`, when the error is about one object.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// 404 NotFound for an object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") };
        let mut e = Self::new(404, "NotFound", format!("{what} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "group": group, "kind": plural}));
        e
    }
    /// 404 for a path that names nothing served.
    pub fn path_not_found() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }
    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") };
        let mut e = Self::new(409, "AlreadyExists", format!("{what} \"{name}\" already exists"));
        e.details = Some(json!({"name": name, "group": group, "kind": plural}));
        e
    }
    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") };
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
        e.details = Some(json!({"name": name, "group": group, "kind": plural}));
        e
    }
    /// 409 Conflict with a custom message and causes (server-side apply).
    pub fn conflict_with(message: impl Into<String>, details: Value) -> Self {
        let mut e = Self::new(409, "Conflict", message);
        e.details = Some(details);
        e
    }
    /// 410 Gone / Expired for a too-old resourceVersion.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 413 RequestEntityTooLarge.
    pub fn too_large() -> Self {
        Self::new(413, "RequestEntityTooLarge", "the request body is larger than the limit of 3145728 bytes")
    }
    /// 408 Timeout: the request (its body) did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(408, "Timeout", message)
    }
    /// 413 RequestEntityTooLarge with a message naming what is too large.
    pub fn too_large_with(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }
    /// 504 Timeout for a list or watch from a resourceVersion the store has not reached,
    /// shaped like kube-apiserver's (clients check the `ResourceVersionTooLarge` cause).
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(504, "Timeout", format!("Timeout: Too large resource version: {requested}, current: {current}"));
        e.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        e
    }
    /// 429 TooManyRequests (watch caps).
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.details = Some(json!({"retryAfterSeconds": 1}));
        e
    }
    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }
    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    /// 422 Invalid with causes; message formatted like kube-apiserver.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        let parts: Vec<String> =
            causes.iter().map(|c| if c.field.is_empty() { c.message.clone() } else { format!("{}: {}", c.field, c.message) }).collect();
        let joined = if parts.len() == 1 { parts[0].clone() } else { format!("[{}]", parts.join(", ")) };
        let mut e = Self::new(422, "Invalid", format!("{qualified} \"{name}\" is invalid: {joined}"));
        e.details = Some(json!({
            "name": name, "group": group, "kind": kind,
            "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
        }));
        e
    }
    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }
    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// Result alias for API operations.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// 422 without causes (e.g. a JSON patch that does not apply).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
}
