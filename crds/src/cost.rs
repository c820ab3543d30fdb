//! Cost at list prices: `status.cost` of Server, Cluster and Workspace, and a Workspace's
//! `spec.limits.monthlyBudget`.
//!
//! Amounts are decimal strings ("0.0216", "15.77"), not floats: Kubernetes API conventions
//! avoid floating point in the API, and a string keeps the exact figure the price table holds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What one Server's machine costs at list prices.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerCost {
    /// ISO 4217 currency code (USD, EUR). Empty when the cost is unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub currency: String,
    /// List price per hour, a decimal string ("0.0216"). Empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hourly: String,
    /// List price per month, a decimal string rounded to cents ("15.77"): hourly × 730 (AWS),
    /// or the provider's monthly price where hourly billing is capped at it (UpCloud).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub monthly: String,
    /// For the COST column: "$15.77/mo", or "unknown".
    #[serde(default)]
    pub summary: String,
    /// Where the price comes from (pricing page, plan and region).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The date the list price was taken (YYYY-MM-DD); list prices may be stale.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prices_as_of: String,
    /// Why the cost is unknown, or a note about the budget check.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// An amount in one currency.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostAmount {
    /// ISO 4217 currency code.
    pub currency: String,
    /// Per hour, decimal string.
    pub hourly: String,
    /// Per month, decimal string rounded to cents.
    pub monthly: String,
}

/// The cost of several Servers (a Cluster's, a Workspace's namespace) at list prices: the sum
/// over the Servers that have a machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostTotal {
    /// ISO 4217 currency code of the total (the first one when several are summed: see
    /// `otherCurrencies`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub currency: String,
    /// Sum per hour, decimal string.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hourly: String,
    /// Sum per month, decimal string rounded to cents.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub monthly: String,
    /// Totals in further currencies (Servers at providers billing in another currency are
    /// never converted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["currency"]))]
    pub other_currencies: Vec<CostAmount>,
    /// For the COST column: "$31.54/mo", "$31.54/mo + €13.00/mo", "$15.77/mo + 1 unknown".
    #[serde(default)]
    pub summary: String,
    /// Servers with a machine whose cost is in the total.
    #[serde(default)]
    pub priced: u32,
    /// Servers with a machine whose cost is unknown (not in the total).
    #[serde(default)]
    pub unpriced: u32,
    /// Which Servers are missing from the total, and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A Workspace's monthly budget: new machines whose cost would take the namespace's monthly
/// total over it are refused (Stalled, reason BudgetExceeded) before any provider call.
/// Existing machines are never deleted for budget reasons.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonthlyBudget {
    /// The budget per month, a non-negative decimal string ("50", "120.50").
    #[schemars(regex(pattern = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"))]
    pub amount: String,
    /// ISO 4217 currency code of the amount. Servers priced in another currency are not
    /// converted: their cost counts as unknown for the check.
    #[serde(default = "default_currency")]
    #[schemars(regex(pattern = r"^[A-Z]{3}$"))]
    pub currency: String,
    /// What to do with a new Server whose cost cannot be checked (no list price for its plan
    /// or region, or priced in another currency): `Allow` it with a Warning event
    /// (BudgetUnchecked) and a note in its `status.cost.message` (default), or `Refuse` it
    /// (Stalled, BudgetUnchecked).
    #[serde(default)]
    pub unknown_cost: UnknownCostPolicy,
}

fn default_currency() -> String {
    "USD".into()
}

/// What a budget does with a cost it cannot know.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UnknownCostPolicy {
    /// Create the machine; say that the budget could not be checked.
    #[default]
    Allow,
    /// Refuse to create the machine until its cost is known.
    Refuse,
}
