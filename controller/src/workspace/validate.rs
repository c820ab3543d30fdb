//! Validate (pure): may this Workspace own its namespace?

use std::sync::Arc;

use kube::ResourceExt;
use provisioning_crds::Workspace;

use crate::effective_workspace::{claimed_namespace, owner_of};

/// A namespace claimed by an older Workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceConflict {
    /// The contested namespace.
    pub namespace: String,
    /// The older Workspace that owns it.
    pub owner: String,
}

impl NamespaceConflict {
    /// Condition message.
    pub fn message(&self) -> String {
        format!("namespace {:?} is already claimed by the older workspace {:?}", self.namespace, self.owner)
    }
}

/// Checks that `ws` is the owner of the namespace it claims among `all`.
pub fn check_namespace<'a>(ws: &Workspace, all: impl IntoIterator<Item = &'a Arc<Workspace>>) -> Result<String, NamespaceConflict> {
    let namespace = claimed_namespace(ws);
    match owner_of(&namespace, all) {
        Some(owner) if owner.uid() != ws.uid() || owner.name_any() != ws.name_any() => {
            Err(NamespaceConflict { namespace, owner: owner.name_any() })
        }
        _ => Ok(namespace),
    }
}
