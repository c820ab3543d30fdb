//! Provider errors, classified for retry.

use std::time::Duration;

/// Result of a provider operation.
pub type ProviderResult<T> = Result<T, ProviderError>;

/// A provider failure, classified so that callers know whether and when to retry.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ProviderError {
    /// The provider asked us to slow down; retry after the given time.
    #[error("throttled by the provider; retry after {retry_after:?}")]
    Throttled {
        /// How long to wait.
        retry_after: Duration,
    },
    /// A failure that may go away on retry (5xx, dropped connection, timeout).
    #[error("transient provider error: {0}")]
    Transient(String),
    /// The thing asked for does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Credentials rejected or permission denied; retrying will not help until they change.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The request cannot succeed as written (unknown plan, image, zone…).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The machine is not the requesting Server's (its uid tag differs): nothing was done.
    #[error("not this Server's machine: {0}")]
    NotOwned(String),
    /// Any other failure that retrying will not fix.
    #[error("provider error: {0}")]
    Permanent(String),
    /// "Not now" or "not here": an account quota is used up (vCPUs, instances, addresses…) or
    /// the zone has no capacity for what was asked. Retrying at once will not help; retrying
    /// slowly may (capacity comes back, a quota is raised, other machines go).
    #[error("{0}")]
    Capacity(Box<CapacityError>),
}

/// What a [`ProviderError::Capacity`] says (boxed: errors stay small).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityError {
    /// An account quota, or the zone's capacity.
    pub kind: CapacityKind,
    /// The provider's name for the limit (EC2 `VcpuLimitExceeded`, UpCloud
    /// `SERVER_RESOURCES_UNAVAILABLE`…).
    pub quota: String,
    /// What was asked, for humans (`1 instance of type t3.large, 2 vCPUs in zone
    /// eu-north-1a`); empty when the layer that classified the error did not know (see
    /// [`ProviderError::asking`]).
    pub asked: String,
    /// The provider's own words.
    pub message: String,
}

impl std::fmt::Display for CapacityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&capacity_text(self.kind, &self.quota, &self.asked, &self.message))
    }
}

/// Which limit a [`ProviderError::Capacity`] hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityKind {
    /// An account quota (raised by asking the provider, or freed by deleting machines).
    Quota,
    /// The zone (or host pool) lacks capacity for this machine type now.
    Insufficient,
}

fn capacity_text(kind: CapacityKind, quota: &str, asked: &str, message: &str) -> String {
    let what = match kind {
        CapacityKind::Quota => "quota exceeded",
        CapacityKind::Insufficient => "insufficient capacity",
    };
    let asked = if asked.is_empty() { String::new() } else { format!(" asking for {asked}") };
    let message = if message.is_empty() { String::new() } else { format!(": {message}") };
    format!("{what} ({quota}){asked}{message}")
}

impl ProviderError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProviderError::Throttled { .. } | ProviderError::Transient(_))
    }

    /// A short, stable category for metrics and condition reasons.
    pub fn category(&self) -> &'static str {
        match self {
            ProviderError::Throttled { .. } => "Throttled",
            ProviderError::Transient(_) => "Transient",
            ProviderError::NotFound(_) => "NotFound",
            ProviderError::Auth(_) => "AuthFailed",
            ProviderError::InvalidRequest(_) => "InvalidRequest",
            ProviderError::NotOwned(_) => "NotOwned",
            ProviderError::Permanent(_) => "Permanent",
            ProviderError::Capacity(c) if c.kind == CapacityKind::Quota => "QuotaExceeded",
            ProviderError::Capacity(_) => "InsufficientCapacity",
        }
    }

    /// A quota or capacity error of limit `quota`, with the provider's `message`.
    pub fn capacity(kind: CapacityKind, quota: impl Into<String>, message: impl Into<String>) -> Self {
        ProviderError::Capacity(Box::new(CapacityError { kind, quota: quota.into(), asked: String::new(), message: message.into() }))
    }

    /// A [`ProviderError::Capacity`] names what was asked (`asked`, unless it already does);
    /// any other error is returned as it is.
    pub fn asking(self, asked: impl FnOnce() -> String) -> Self {
        match self {
            ProviderError::Capacity(mut c) if c.asked.is_empty() => {
                c.asked = asked();
                ProviderError::Capacity(c)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_errors_name_the_quota_and_what_was_asked() {
        let e = ProviderError::capacity(CapacityKind::Quota, "VcpuLimitExceeded", "limit of 32 vCPUs");
        assert!(!e.is_retryable());
        assert_eq!(e.category(), "QuotaExceeded");
        let e = e.asking(|| "1 × t3.large (2 vCPUs)".into());
        assert_eq!(e.to_string(), "quota exceeded (VcpuLimitExceeded) asking for 1 × t3.large (2 vCPUs): limit of 32 vCPUs");
        // Asked once: an outer layer does not overwrite it.
        assert_eq!(e.clone().asking(|| "other".into()), e);
        let e = ProviderError::capacity(CapacityKind::Insufficient, "InsufficientInstanceCapacity", "");
        assert_eq!(
            (e.category(), e.to_string().as_str()),
            ("InsufficientCapacity", "insufficient capacity (InsufficientInstanceCapacity)")
        );
        assert_eq!(ProviderError::Transient("x".into()).asking(|| "y".into()), ProviderError::Transient("x".into()));
    }
}
