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

/// Most causes one `Invalid` error lists; the rest are summed up in one last entry (a hostile
/// body of 3 MiB could otherwise ask for half a million causes and a reply of hundreds of MB).
pub const MAX_CAUSES: usize = 100;

/// Most bytes of cause messages (and field paths) one `Invalid` error carries.
pub const MAX_CAUSE_BYTES: usize = 64 * 1024;

/// A collector of causes with a cap ([`MAX_CAUSES`], [`MAX_CAUSE_BYTES`]): causes beyond it are
/// counted, not kept, and validators stop walking once [`Causes::overflowed`] says so.
#[derive(Debug, Default)]
pub struct Causes {
    list: Vec<Cause>,
    bytes: usize,
    omitted: usize,
}

impl Causes {
    /// Keeps `c` when there is room, otherwise counts it as omitted.
    pub fn push(&mut self, c: Cause) {
        let size = c.field.len() + c.message.len();
        // Room is left for the last entry, so that `ApiError::invalid` keeps the list as it is.
        if self.list.len() < MAX_CAUSES - 1 && self.bytes + size <= MAX_CAUSE_BYTES - 256 {
            self.bytes += size;
            self.list.push(c);
        } else {
            self.omitted += 1;
        }
    }
    /// Whether a cause was refused: the error is certain and its list full, so a validator may
    /// stop walking.
    pub fn overflowed(&self) -> bool {
        self.omitted > 0
    }
    /// Whether no cause was pushed.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty() && self.omitted == 0
    }
    /// The causes kept.
    pub fn iter(&self) -> std::slice::Iter<'_, Cause> {
        self.list.iter()
    }
    /// The causes kept, and one last entry saying that more were found when some were not kept
    /// (validators stop at the first one beyond the cap, so how many more is not known).
    pub fn into_vec(mut self) -> Vec<Cause> {
        if self.overflowed() {
            self.list.push(Cause::new(
                "FieldValueTooMany",
                "",
                format!("... and more errors (only the first {} are listed)", self.list.len()),
            ));
        }
        self.list
    }
}

impl Extend<Cause> for Causes {
    fn extend<T: IntoIterator<Item = Cause>>(&mut self, iter: T) {
        for c in iter {
            self.push(c);
        }
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
    /// At most [`MAX_CAUSES`] causes and [`MAX_CAUSE_BYTES`] of their text are listed, then one
    /// "... and N more errors" entry (an upstream-shaped Status of bounded size, whatever the
    /// body asked for).
    pub fn invalid(kind: &str, group: &str, name: &str, mut causes: Vec<Cause>) -> Self {
        let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        let mut bytes = 0usize;
        let keep = causes
            .iter()
            .take(MAX_CAUSES)
            .take_while(|c| {
                bytes += c.field.len() + c.message.len();
                bytes <= MAX_CAUSE_BYTES
            })
            .count();
        if keep < causes.len() {
            let more = causes.len() - keep;
            causes.truncate(keep);
            causes.push(Cause::new("FieldValueTooMany", "", format!("... and {more} more errors")));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_error_lists_at_most_the_cap_then_how_many_more() {
        let many: Vec<Cause> =
            (0..5000).map(|i| Cause::new("FieldValueInvalid", "metadata.labels", format!("Invalid value: \"-{i}\""))).collect();
        let e = ApiError::invalid("ConfigMap", "", "x", many);
        let causes = e.details.as_ref().and_then(|d| d["causes"].as_array().cloned()).unwrap_or_default();
        assert_eq!(causes.len(), MAX_CAUSES + 1);
        assert_eq!(causes[MAX_CAUSES]["message"], "... and 4900 more errors");
        assert!(e.message.starts_with("ConfigMap \"x\" is invalid: [metadata.labels: Invalid value: \"-0\", "), "{}", e.message);
        assert!(e.message.ends_with(", ... and 4900 more errors]"), "{}", e.message);
        // Long messages: the byte cap stops the list first.
        let long: Vec<Cause> = (0..50).map(|_| Cause::new("FieldValueInvalid", "spec", "x".repeat(10_000))).collect();
        let e = ApiError::invalid("S", "g", "x", long);
        assert!(e.message.len() < MAX_CAUSE_BYTES + 1024, "{}", e.message.len());
        // One or a few causes: exactly as before.
        let e = ApiError::invalid("ConfigMap", "", "x", vec![Cause::new("FieldValueRequired", "data", "Required value")]);
        assert_eq!(e.message, "ConfigMap \"x\" is invalid: data: Required value");
    }

    #[test]
    fn the_collector_keeps_room_for_its_last_entry_and_says_it_overflowed() {
        let mut c = Causes::default();
        assert!(c.is_empty() && !c.overflowed());
        for i in 0..MAX_CAUSES - 1 {
            c.push(Cause::new("FieldValueInvalid", "f", format!("{i}")));
        }
        assert!(!c.overflowed());
        c.push(Cause::new("FieldValueInvalid", "f", "one more"));
        assert!(c.overflowed());
        let v = c.into_vec();
        assert_eq!(v.len(), MAX_CAUSES);
        assert!(v[MAX_CAUSES - 1].message.contains("more errors"), "{:?}", v[MAX_CAUSES - 1]);
        // ApiError::invalid keeps such a list as it is.
        let e = ApiError::invalid("S", "", "x", v);
        let causes = e.details.as_ref().and_then(|d| d["causes"].as_array().cloned()).unwrap_or_default();
        assert_eq!(causes.len(), MAX_CAUSES);
    }
}
