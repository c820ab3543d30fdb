//! AWS regions: they are placed into endpoint host names (`ec2.<region>.amazonaws.com`,
//! `sts.<region>.amazonaws.com`), so only a region's shape is accepted.

use crate::{ProviderError, ProviderResult};

/// Whether `region` has the shape of an AWS region (`eu-north-1`, `us-gov-west-1`): it is
/// placed into endpoint host names, so anything else (a `/`, an `@`, a dot) is refused.
pub fn valid_region(region: &str) -> bool {
    let Some((words, number)) = region.rsplit_once('-') else { return false };
    let mut words = words.split('-');
    let first = words.next().unwrap_or_default();
    let rest: Vec<&str> = words.collect();
    region.len() <= 32
        && (1..=2).contains(&number.len())
        && number.bytes().all(|b| b.is_ascii_digit())
        && (2..=4).contains(&first.len())
        && first.bytes().all(|b| b.is_ascii_lowercase())
        && (1..=3).contains(&rest.len())
        && rest.iter().all(|w| (1..=16).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase()))
}

/// The error for a region that is not one.
pub fn invalid_region(account: &str, region: &str) -> ProviderError {
    let shown: String = region.chars().take(64).collect();
    ProviderError::InvalidRequest(format!(
        "aws account {account:?}: region {shown:?} is not an AWS region (lower-case words joined by '-' ending in a number, e.g. eu-north-1); set spec.providers[].region"
    ))
}

/// `https://<service>.<region>.amazonaws.com/`, for a region of the right shape only.
pub fn regional_endpoint(service: &str, account: &str, region: &str) -> ProviderResult<String> {
    if !valid_region(region) {
        return Err(invalid_region(account, region));
    }
    Ok(format!("https://{service}.{region}.amazonaws.com/"))
}
