//! Plans and approval: what applying a spec would change (`status.plan`), how a Server's spec
//! changes are carried out (`spec.updatePolicy`), and who lets them happen (`spec.approval`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Annotation: approves the plan whose `status.plan.id` it names (under `approval: Manual`).
pub const ANNOTATION_APPROVE: &str = "provisioning.dev/approve";

/// Who lets a plan be carried out.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Approval {
    /// Plans are carried out as soon as they are computed (drift remediated at once).
    #[default]
    Automatic,
    /// Nothing changes at the provider until the annotation `provisioning.dev/approve`
    /// names the current `status.plan.id`.
    Manual,
}

/// How a Server's spec changes after its machine exists are carried out.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdatePolicy {
    /// In place where the provider can change the running machine, otherwise by replacing
    /// it (the old machine is deleted, then a new one created).
    #[default]
    Replace,
    /// Only in place: a change that needs a new machine is refused (Stalled, UpdateRefused).
    InPlace,
    /// Never: any change to plan, zone or image is refused (Stalled, UpdateRefused) and the
    /// machine is left untouched.
    Never,
}

/// What a planned change does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum ChangeAction {
    /// Nothing to do.
    NoOp,
    /// Something new is made.
    Create,
    /// Changed in place.
    Update,
    /// Deleted and made again.
    Replace,
    /// Deleted.
    Delete,
}

impl ChangeAction {
    /// The word used in plan summaries ("to create", "to update"...).
    pub fn verb(self) -> &'static str {
        match self {
            ChangeAction::NoOp => "unchanged",
            ChangeAction::Create => "create",
            ChangeAction::Update => "update",
            ChangeAction::Replace => "replace",
            ChangeAction::Delete => "delete",
        }
    }
}

/// One change of a plan: one field of one resource.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedChange {
    /// The resource changed: `Server/<namespace>/<name>` (or the machine it stands for).
    pub resource: String,
    /// The field that changes (`spec.plan`); empty for the resource as a whole.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
    /// What happens: NoOp, Create, Update, Replace or Delete.
    pub action: ChangeAction,
    /// The value now (observed). Secret values are never shown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    /// The value after the change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub to: String,
    /// Why: what forces a Replace, what a Create is for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// What applying the spec would do, against refreshed observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// A short stable hash of the desired spec and the observed state: approve a plan by
    /// writing it into the annotation `provisioning.dev/approve`.
    pub id: String,
    /// One line: "no changes", "1 to create", "1 to update, 1 to replace".
    pub summary: String,
    /// The changes, per resource and field (NoOp entries only for differences that are never
    /// carried out, such as an adopted machine's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub changes: Vec<PlannedChange>,
    /// How the monthly list price changes, a signed decimal string ("+13.00", "-2.50",
    /// "0.00"); empty when a price is unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub monthly_cost_delta: String,
    /// ISO 4217 currency of `monthlyCostDelta`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub currency: String,
    /// The `metadata.generation` of the object (Cluster, TaskServ) the plan was computed for:
    /// an approval kept while its plan is carried out covers that spec only, a new spec
    /// needs a new approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The version of the inputs read from other objects (a TaskServ's `configFrom`) the plan
    /// was computed with: an approval kept while its plan is carried out covers those inputs
    /// only, changed inputs need a new approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub inputs: Option<String>,
}

impl Plan {
    /// Whether the plan changes anything.
    pub fn has_changes(&self) -> bool {
        self.changes.iter().any(|c| c.action != ChangeAction::NoOp)
    }
}
