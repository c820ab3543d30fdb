//! The object operations that code outside the request path relies on — the RBAC bootstrap
//! and the ClusterRole aggregation in [`crate::auth`] — as the trait [`ObjectWriter`] plus the
//! write types it speaks. The request core ([`crate::handlers::Core`]) implements it, so that
//! code depends on this small interface, never on the handlers.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::error::ApiResult;
use crate::registry::{Registry, ResourceType};
use crate::storage::{Entry, Store};

/// How unknown fields are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop silently.
    Ignore,
    /// Drop and return a Warning header (server default).
    #[default]
    Warn,
    /// Reject with 400.
    Strict,
}

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    /// `fieldManager` (or one derived from the User-Agent).
    pub field_manager: String,
    /// Whether the manager came from the request explicitly.
    pub explicit_manager: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `force` for server-side apply.
    pub force: bool,
    /// RBAC escalation check of the requesting user (None: not an RBAC write, a
    /// `system:masters` user, or the server's own write).
    pub escalation: Option<std::sync::Arc<crate::auth::escalation::Guard>>,
    /// The authenticated user of the request (None: the server's own write): recorded as who
    /// approved a plan ([`crate::auth::approver`]).
    pub user: Option<String>,
    /// The groups of [`WriteOptions::user`]: recorded with who approved a plan (the
    /// controller's SubjectAccessReview of the approver needs them).
    pub groups: Vec<String>,
    /// The request's decode meter (None: the server's own write, not charged).
    pub decode: Option<std::sync::Arc<provisioning_yaml::bounded::Meter>>,
}

/// What a write produced.
pub enum Output {
    /// The stored object.
    Stored(Arc<Entry>),
    /// An object that was not stored (dry run, or a deletion summary).
    Transient(Value),
}

impl Output {
    /// Serialized body.
    pub fn bytes(&self) -> Bytes {
        match self {
            Output::Stored(e) => e.bytes.clone(),
            Output::Transient(v) => Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
        }
    }
    /// Parsed value.
    pub fn value(&self) -> Value {
        match self {
            Output::Stored(e) => e.value(),
            Output::Transient(v) => v.clone(),
        }
    }
}

/// A write result with warnings for the client.
pub struct Written {
    /// The object.
    pub output: Output,
    /// Warning headers.
    pub warnings: Vec<String>,
}

/// Reads and writes objects through the full request semantics (admission, validation,
/// managedFields), for writers that are not HTTP requests.
pub trait ObjectWriter: Send + Sync {
    /// The store (for reading snapshots and waiting on changes).
    fn store(&self) -> &Store;
    /// The types served now.
    fn registry(&self) -> Arc<Registry>;
    /// One object.
    fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> ApiResult<Arc<Entry>>;
    /// Creates an object (as a POST would).
    fn create(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> impl Future<Output = ApiResult<Written>> + Send;
    /// Replaces an object, or its status when `status` (as a PUT would).
    fn update(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> impl Future<Output = ApiResult<Written>> + Send;
}

/// The status a new Pod is stored with: nothing will run it (no nodes, kubelet or scheduler in
/// the embedded control plane), so it says so where `kubectl get` and `kubectl describe` show
/// it — phase Pending, `PodScheduled=False` with the reason — as kwok's fake nodes would.
pub fn unrun_pod_status() -> Value {
    serde_json::json!({
        "phase": "Pending",
        "conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "NoKubelet",
            "message": "the embedded control plane (provisioning dev/apiserver) has no nodes, scheduler or kubelet: this Pod is stored and served but never runs",
        }],
    })
}
