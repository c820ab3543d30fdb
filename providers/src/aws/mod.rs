//! The aws provider: Amazon EC2 through the EC2 Query API (SigV4).

use crate::{ProviderConfig, ProviderError, ProviderResult, SharedProvider};

/// Builds the provider for an account.
pub fn build(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    Err(ProviderError::InvalidRequest(format!(
        "the aws provider (account {:?}) is not implemented yet",
        config.name
    )))
}
