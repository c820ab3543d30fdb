//! The upcloud provider: UpCloud through its REST API v1.3.

use crate::{ProviderConfig, ProviderError, ProviderResult, SharedProvider};

/// Builds the provider for an account.
pub fn build(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    Err(ProviderError::InvalidRequest(format!(
        "the upcloud provider (account {:?}) is not implemented yet",
        config.name
    )))
}
