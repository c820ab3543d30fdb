//! Secret watch mapping (pure): which Workspaces and Servers a Secret change concerns.
//!
//! A fixed credentials Secret must not wait for the error backoff: the Secret watch (metadata
//! only, values never read here) maps each change to the Workspaces whose provider accounts
//! name it, marks the providers built from it stale, and re-triggers the Stalled Servers of
//! those workspaces (and Servers whose `spec.sshKeySecretRef` names it).

use std::sync::Arc;

use provisioning_crds::{ProviderAccount, Server, Workspace, condition};

use crate::effective_workspace::{claimed_namespace, owner_of};

/// Whether one of `accounts`, used in `namespace`, takes its credentials from Secret
/// `secret_namespace/secret_name` (a reference without a namespace means `namespace`).
pub fn accounts_use(accounts: &[ProviderAccount], namespace: &str, secret_namespace: &str, secret_name: &str) -> bool {
    accounts.iter().any(|a| {
        a.credentials_secret_ref.as_ref().is_some_and(|r| {
            r.name == secret_name && r.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(namespace) == secret_namespace
        })
    })
}

/// The Workspaces (among `all`) whose accounts use the Secret, and the namespaces whose
/// resources are affected (those Workspaces' namespaces, plus the Secret's own namespace
/// when it has no Workspace and the controller's `default_accounts` use the Secret).
pub fn referrers<'a>(
    all: &'a [Arc<Workspace>],
    default_accounts: &[ProviderAccount],
    secret_namespace: &str,
    secret_name: &str,
) -> (Vec<&'a Arc<Workspace>>, Vec<String>) {
    let mut workspaces = Vec::new();
    let mut namespaces = Vec::new();
    for ws in all {
        let namespace = claimed_namespace(ws);
        let accounts = if ws.spec.providers.is_empty() { default_accounts } else { &ws.spec.providers };
        if accounts_use(accounts, &namespace, secret_namespace, secret_name) {
            workspaces.push(ws);
            namespaces.push(namespace);
        }
    }
    if owner_of(secret_namespace, all.iter()).is_none() && accounts_use(default_accounts, secret_namespace, secret_namespace, secret_name) {
        namespaces.push(secret_namespace.to_string());
    }
    (workspaces, namespaces)
}

/// Whether a Server change to this Secret should re-trigger: it is Stalled in one of
/// `namespaces` (it may be waiting for these credentials), or its `spec.sshKeySecretRef`
/// names the Secret.
pub fn server_affected(server: &Server, namespaces: &[String], secret_namespace: &str, secret_name: &str) -> bool {
    let Some(namespace) = server.metadata.namespace.as_deref() else { return false };
    let stalled = server.status.as_ref().is_some_and(|s| crate::conditions::is_true(&s.conditions, condition::STALLED));
    let ssh_key = server.spec.ssh_key_secret_ref.as_ref().is_some_and(|r| {
        r.name == secret_name && r.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(namespace) == secret_namespace
    });
    ssh_key || (stalled && namespaces.iter().any(|n| n == namespace))
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;

    fn ws(value: serde_json::Value) -> Arc<Workspace> {
        #[allow(clippy::expect_used)]
        Arc::new(serde_json::from_value(value).expect("workspace"))
    }

    #[test]
    fn maps_a_secret_to_the_workspaces_naming_it() {
        let all = vec![
            ws(serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "a"},
                "spec": {"providers": [{"name": "aws", "type": "aws", "credentialsSecretRef": {"name": "creds"}}]}})),
            ws(serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "b"},
                "spec": {"namespace": "bee", "providers": [{"name": "aws", "type": "aws", "credentialsSecretRef": {"name": "creds", "namespace": "a"}}]}})),
            ws(serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "c"},
                "spec": {"providers": [{"name": "local", "type": "local"}]}})),
        ];
        let (found, namespaces) = referrers(&all, &[], "a", "creds");
        let names: Vec<String> = found.iter().map(|w| w.name_any()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(namespaces, ["a", "bee"]);
        assert!(referrers(&all, &[], "bee", "creds").0.is_empty());
        assert!(referrers(&all, &[], "a", "other").0.is_empty());
    }
}
