//! Abstract plan names shared by every provider. Each provider's table maps them to native
//! plans; the list prices of those native plans are in [`crate::prices`].

/// The abstract sizes a Server may ask for.
pub const ABSTRACT_PLANS: [&str; 4] = ["small", "medium", "large", "xlarge"];

/// Looks an abstract plan up in a provider's table, or passes a native plan through when
/// `is_native` accepts it. The error names the plan and what is supported.
pub fn resolve<'a>(
    provider: &str,
    plan: &str,
    table: &[(&'a str, &'a str)],
    is_native: impl Fn(&str) -> bool,
) -> Result<String, crate::ProviderError> {
    if let Some((_, native)) = table.iter().find(|(name, _)| *name == plan) {
        return Ok((*native).to_string());
    }
    if is_native(plan) {
        return Ok(plan.to_string());
    }
    let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    Err(crate::ProviderError::InvalidRequest(format!(
        "plan {plan:?} is not offered by the {provider} provider (abstract plans: {})",
        names.join(", ")
    )))
}
