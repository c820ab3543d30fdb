//! ChangeRecord: the history of one object, one record per spec generation carried out.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on a ChangeRecord: the uid of the object it records (to list an object's history).
pub const LABEL_CHANGE_OF: &str = "provisioning.dev/change-of";

/// One change of a Server, TaskServ or Cluster carried out by the controller: which generation
/// of the spec, who changed it (from managedFields), which fields changed, when it started
/// and ended, and how it ended. Written by the controller and owned by the object; the last
/// `history_limit` (default 20) are kept per object.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "provisioning.dev",
    version = "v1alpha1",
    kind = "ChangeRecord",
    namespaced,
    status = "ChangeRecordStatus",
    shortname = "chg",
    category = "provisioning",
    doc = "One change of a Server, TaskServ or Cluster carried out by the controller: who, what, when, result.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.object.kind"),
    printcolumn(name = "Object", type_ = "string", json_path = ".spec.object.name"),
    printcolumn(name = "Gen", type_ = "integer", json_path = ".spec.generation"),
    printcolumn(name = "By", type_ = "string", json_path = ".spec.changedBy[0].manager"),
    printcolumn(name = "Summary", type_ = "string", json_path = ".spec.summary"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecordSpec {
    /// The object that changed.
    pub object: ChangedObject,
    /// The spec generation this record carries out.
    pub generation: i64,
    /// The generation recorded before this one, when the controller saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_generation: Option<i64>,
    /// Field managers that wrote the spec, most recent first (from managedFields): the first
    /// one made this change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub changed_by: Vec<SpecWriter>,
    /// The authenticated user whose write made this generation, when the API server records
    /// it (the embedded one does, in the server-owned annotation `provisioning.dev/changed-by`);
    /// `changedBy` names field managers, which clients choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_by_user: Option<String>,
    /// One line: "created", or the spec fields that changed since the previous record.
    #[serde(default)]
    pub summary: String,
    /// Spec fields (paths such as `spec.plan`, `spec.config.port`) that differ from the
    /// previous record. Values are not recorded here (they may be secret): the object's
    /// `status.plan` at the time, copied into `plan`, shows redacted values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub changed_fields: Vec<String>,
    /// Salted digests of the spec's fields at this generation (path → digest), used to find
    /// the changed fields of the next record; never the values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub field_digests: BTreeMap<String, String>,
    /// The object's `status.plan` when the change started, if it had one (values redacted
    /// by the planner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::free_form_object")]
    pub plan: Option<serde_json::Value>,
    /// When the controller started carrying the change out (RFC 3339).
    pub started_at: String,
    /// Approvals given while this generation was current (Manual approval): which plan, and
    /// who set `provisioning.dev/approve`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub approvals: Vec<RecordedApproval>,
}

/// One approval of a plan, as the controller saw it come into force.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedApproval {
    /// The approved plan's id.
    pub plan: String,
    /// The authenticated user, when the API server recorded it (`provisioning.dev/approved-by`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// The field manager that set the annotation (managedFields): the name the client chose,
    /// not an authenticated user. Empty when no managedFields entry owned it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_manager: String,
    /// When the approval came into force (RFC 3339).
    pub time: String,
}

/// The object a ChangeRecord is about.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedObject {
    /// Kind: Server, TaskServ or Cluster.
    pub kind: String,
    /// Name (in the record's namespace).
    pub name: String,
    /// uid of the object.
    pub uid: String,
}

/// One field manager that wrote spec fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpecWriter {
    /// Field manager (kubectl-client-side-apply, kubectl-edit, argocd-controller, …).
    pub manager: String,
    /// Apply or Update.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation: String,
    /// When it last wrote (RFC 3339).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub time: String,
}

/// How a recorded change ended.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecordStatus {
    /// InProgress, Succeeded, Failed (Stalled: the change cannot be carried out as written),
    /// or Superseded (a newer generation arrived before this one finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When it ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it failed, or what superseded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The record's generation the controller last wrote this status for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: True when the change succeeded, False when it failed or was superseded,
    /// Unknown while in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions_schema")]
    pub conditions: Vec<Condition>,
}
