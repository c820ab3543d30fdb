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
        }
    }
}
