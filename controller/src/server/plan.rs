//! Plan (pure): from what the status says to the next provider step.

use provisioning_crds::{ANNOTATION_CREATE_PENDING, Server};
use provisioning_providers::ProviderId;

/// The next thing to do at the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The machine is known: observe it.
    Observe(ProviderId),
    /// Adopt the machine named by `spec.externalID`: observe it, never create.
    Adopt(ProviderId),
    /// A create call may have happened without its result being recorded (create-pending
    /// set, no providerID): look the machine up by owner tag before creating anything.
    FindThenCreate,
    /// Nothing was ever created: write create-pending, then create.
    Create,
}

/// Decides the next step for a Server that is not being deleted.
pub fn next_step(server: &Server) -> Step {
    let recorded = server.status.as_ref().and_then(|s| s.provider_id.clone()).filter(|id| !id.is_empty());
    let external = Some(server.spec.external_id.clone()).filter(|id| !id.is_empty());
    match (recorded, external) {
        (Some(recorded), Some(external)) if recorded != external => Step::Adopt(ProviderId(external)),
        (_, Some(external)) => Step::Adopt(ProviderId(external)),
        (Some(recorded), None) => Step::Observe(ProviderId(recorded)),
        (None, None) if server.annotations().contains_key(ANNOTATION_CREATE_PENDING) => Step::FindThenCreate,
        (None, None) => Step::Create,
    }
}

/// What deleting the Server must do at the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CleanupStep {
    /// deletionPolicy Orphan, or nothing was ever created: nothing to do.
    Nothing,
    /// Delete the known machine.
    Delete(ProviderId),
    /// A create may have happened unrecorded: find by owner tag, delete what is found.
    FindThenDelete,
}

/// Decides what deletion does.
pub fn cleanup_step(server: &Server) -> CleanupStep {
    if server.spec.effective_deletion_policy() == provisioning_crds::DeletionPolicy::Orphan {
        return CleanupStep::Nothing;
    }
    let recorded = server.status.as_ref().and_then(|s| s.provider_id.clone()).filter(|id| !id.is_empty());
    let external = Some(server.spec.external_id.clone()).filter(|id| !id.is_empty());
    // An adopted machine is deleted only once its adoption was recorded (it passed the
    // ownership check); a refused or never-observed externalID deletes nothing.
    let target = match (recorded, external) {
        (Some(recorded), Some(external)) if recorded == external => Some(recorded),
        (recorded, _) => recorded,
    };
    match target {
        Some(id) => CleanupStep::Delete(ProviderId(id)),
        None if server.annotations().contains_key(ANNOTATION_CREATE_PENDING) => CleanupStep::FindThenDelete,
        None => CleanupStep::Nothing,
    }
}

use kube::ResourceExt;
