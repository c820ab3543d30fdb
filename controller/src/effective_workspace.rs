//! Which Workspace a namespace belongs to (pure).
//!
//! A namespaced resource belongs to the Workspace whose `spec.namespace` (default: its name)
//! is the resource's namespace. When two claim one namespace, the older one (creation time,
//! then name) owns it and the newer one is Stalled. Without any Workspace, the controller's
//! default settings apply. TaskServ/Cluster reconcilers call [`crate::Context::workspace_for`]
//! which wraps [`resolve`] over the Workspace cache.

use std::sync::Arc;

use kube::ResourceExt;
use provisioning_crds::{ProviderAccount, Workspace, WorkspaceSpec};

/// Label on a namespace naming the Workspace it opted in to (the controller puts it on the
/// namespaces it creates for a Workspace): that Workspace's accounts may read its Secrets.
pub const LABEL_WORKSPACE: &str = "provisioning.dev/workspace";

/// The namespace a Workspace claims.
pub fn claimed_namespace(ws: &Workspace) -> String {
    ws.spec.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| ws.name_any())
}

fn age_key(ws: &Workspace) -> (Option<k8s_openapi::jiff::Timestamp>, String) {
    (ws.metadata.creation_timestamp.as_ref().map(|t| t.0), ws.name_any())
}

/// The Workspace owning `namespace`, if any (the oldest claimant). One being deleted still
/// owns it: its finalizer holds it until the namespace's resources are gone, and they are
/// deleted at their provider with its accounts, whatever the order of deletion.
pub fn owner_of<'a>(namespace: &str, workspaces: impl IntoIterator<Item = &'a Arc<Workspace>>) -> Option<Arc<Workspace>> {
    workspaces.into_iter().filter(|ws| claimed_namespace(ws) == namespace).min_by_key(|ws| age_key(ws)).cloned()
}

/// The effective settings for resources of one namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveWorkspace {
    /// The owning Workspace's name; `None` when controller defaults apply.
    pub name: Option<String>,
    /// The namespace.
    pub namespace: String,
    /// The settings (Workspace.spec or the controller's default workspace).
    pub spec: WorkspaceSpec,
}

impl EffectiveWorkspace {
    /// Stable key for per-workspace state (semaphores, provider cache).
    pub fn key(&self) -> String {
        match &self.name {
            Some(name) => format!("ws/{name}"),
            None => format!("default/{}", self.namespace),
        }
    }

    /// Display name for messages.
    pub fn display(&self) -> String {
        match &self.name {
            Some(name) => format!("workspace {name:?}"),
            None => format!("the controller's default workspace (namespace {:?} has no Workspace)", self.namespace),
        }
    }

    /// The account a resource asks for (`requested`, or the workspace default when empty).
    pub fn account(&self, requested: &str) -> Result<&ProviderAccount, String> {
        let name = if requested.is_empty() { self.spec.defaults.provider.as_str() } else { requested };
        self.spec.providers.iter().find(|a| a.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.spec.providers.iter().map(|a| a.name.as_str()).collect();
            format!(
                "provider {name:?} is not defined in {} (accounts: {})",
                self.display(),
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )
        })
    }
}

/// Resolves the effective workspace of `namespace`.
pub fn resolve<'a>(
    namespace: &str,
    workspaces: impl IntoIterator<Item = &'a Arc<Workspace>>,
    defaults: &WorkspaceSpec,
) -> EffectiveWorkspace {
    match owner_of(namespace, workspaces) {
        Some(ws) => {
            let mut spec = ws.spec.clone();
            if spec.providers.is_empty() {
                spec.providers = defaults.providers.clone();
            }
            EffectiveWorkspace { name: Some(ws.name_any()), namespace: namespace.to_string(), spec }
        }
        None => EffectiveWorkspace { name: None, namespace: namespace.to_string(), spec: defaults.clone() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(yaml: &str) -> Arc<Workspace> {
        Arc::new(provisioning_yaml::from_str(yaml).expect("fixture parses"))
    }

    #[test]
    fn oldest_claimant_owns_the_namespace() {
        let a = ws(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: a, creationTimestamp: '2024-01-02T00:00:00Z'}\nspec: {namespace: shared}",
        );
        let b = ws(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: b, creationTimestamp: '2024-01-01T00:00:00Z'}\nspec: {namespace: shared}",
        );
        let all = [a, b];
        assert_eq!(owner_of("shared", &all).map(|w| w.name_any()).as_deref(), Some("b"));
        assert!(owner_of("other", &all).is_none());
    }

    #[test]
    fn namespace_defaults_to_the_name_and_defaults_apply_elsewhere() {
        let dev = ws(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: dev}\nspec:\n  providers: [{name: sim, type: simulated}]\n  defaults: {provider: sim}",
        );
        let defaults = crate::config::default_workspace();
        let eff = resolve("dev", [&dev], &defaults);
        assert_eq!(eff.name.as_deref(), Some("dev"));
        assert_eq!(eff.account("").map(|a| a.name.as_str()), Ok("sim"));
        let err = eff.account("aws-main").expect_err("unknown account");
        assert_eq!(err, "provider \"aws-main\" is not defined in workspace \"dev\" (accounts: sim)");
        let other = resolve("elsewhere", [&dev], &defaults);
        assert_eq!(other.name, None);
        assert_eq!(other.account("").map(|a| a.name.as_str()), Ok("local"));
    }

    #[test]
    fn a_workspace_being_deleted_still_owns_its_namespace() {
        // Its resources are deleted with its accounts (kubectl delete -f DIR deletes the
        // Workspace before the Servers); an older claimant keeps winning over a newer one.
        let deleting = ws(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: demo, creationTimestamp: '2024-01-01T00:00:00Z', deletionTimestamp: '2024-01-03T00:00:00Z'}\nspec:\n  providers: [{name: sim, type: simulated}]\n  defaults: {provider: sim}",
        );
        let newer = ws(
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: again, creationTimestamp: '2024-01-02T00:00:00Z'}\nspec: {namespace: demo}",
        );
        let defaults = crate::config::default_workspace();
        let eff = resolve("demo", [&deleting], &defaults);
        assert_eq!(eff.name.as_deref(), Some("demo"));
        assert_eq!(eff.account("").map(|a| a.name.as_str()), Ok("sim"));
        assert_eq!(owner_of("demo", [&newer, &deleting]).map(|w| w.name_any()).as_deref(), Some("demo"));
    }
}
