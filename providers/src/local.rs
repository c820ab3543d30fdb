//! The local provider: Docker containers on this machine, through bollard.

use crate::{ProviderConfig, ProviderError, ProviderResult, SharedProvider};

/// Builds the provider for an account.
pub fn build(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    Err(ProviderError::InvalidRequest(format!(
        "the local provider (account {:?}) is not implemented yet",
        config.name
    )))
}
