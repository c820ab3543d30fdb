//! Credentials held while machines need them.
//!
//! `kubectl delete namespace`, `kubectl delete -f DIR` (Namespace first) and a GitOps prune
//! delete a namespace's credentials Secret and the RoleBinding that lets the controller read
//! it at the same moment as its Servers. Without them a Server cannot delete its machine at
//! the cloud: its finalizer waits forever and the machine keeps costing money. So while any
//! Server, Cluster or TaskServ of the namespace exists, the Workspace owning it puts the
//! finalizer [`IN_USE`] on every Secret those resources need to reach their provider (the
//! accounts' `credentialsSecretRef`, the Servers' `sshKeySecretRef`) and on the RoleBinding
//! [`CONTROLLER_BINDING`]; a deleted one stays readable (Terminating) until the last of them
//! is gone, then the Workspace removes the finalizer — as Kubernetes' own
//! `kubernetes.io/pvc-protection` keeps a volume claim while a pod uses it. A finalizer
//! change is the only write made here: no Secret value is read.
//!
//! Adding a finalizer to the RoleBinding needs `get`/`patch` on `rolebindings` named
//! [`CONTROLLER_BINDING`] (deploy/rbac/cluster-role.yaml). Upstream's escalation check
//! ignores a change of finalizers only, so that grant cannot widen the controller's access.
//! Without it the controller logs once, names the rule, and still holds the Secrets.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::{Resource, ResourceExt};
use provisioning_crds::{ProviderAccount, Server};

use crate::context::Context;
use crate::error::Error;

/// The finalizer holding a Secret or RoleBinding while the namespace's resources need it.
pub const IN_USE: &str = "provisioning.dev/credentials-in-use";

/// The RoleBinding granting the controller the namespace's Secrets (deploy/rbac/secrets.yaml).
pub const CONTROLLER_BINDING: &str = "provisioning-controller-secrets";

/// The Secrets of `namespace` that its resources need to reach their provider (pure): the
/// accounts' credentials Secrets and the Servers' `sshKeySecretRef` Secrets.
pub fn needed<'a>(namespace: &str, accounts: &[ProviderAccount], servers: impl IntoIterator<Item = &'a Arc<Server>>) -> BTreeSet<String> {
    let local = |ns: Option<&String>| ns.map(String::as_str).filter(|n| !n.is_empty()).is_none_or(|n| n == namespace);
    let mut names: BTreeSet<String> = accounts
        .iter()
        .filter_map(|a| a.credentials_secret_ref.as_ref())
        .filter(|r| local(r.namespace.as_ref()))
        .map(|r| r.name.clone())
        .collect();
    for server in servers {
        if server.metadata.namespace.as_deref() == Some(namespace)
            && let Some(r) = &server.spec.ssh_key_secret_ref
            && local(r.namespace.as_ref())
        {
            names.insert(r.name.clone());
        }
    }
    names
}

/// The finalizers `current` should have: [`IN_USE`] added when `hold`, removed otherwise;
/// `None` when they are right already (pure).
pub fn finalizers_for(current: &[String], hold: bool) -> Option<Vec<String>> {
    let has = current.iter().any(|f| f == IN_USE);
    match (has, hold) {
        (false, true) => Some(current.iter().cloned().chain([IN_USE.to_string()]).collect()),
        (true, false) => Some(current.iter().filter(|f| *f != IN_USE).cloned().collect()),
        _ => None,
    }
}

/// Holds (`hold`) or releases the credentials of `namespace` for the Workspace that owns it,
/// `secrets` being the Secrets its resources need. Done once per change of `hold` or
/// `secrets`: every change of a Secret of the namespace (the Secret watch) forgets it
/// ([`forget`]), so an idle controller makes no request here.
pub async fn sync(ctx: &Context, namespace: &str, secrets: &BTreeSet<String>, hold: bool) -> Result<(), Error> {
    let memo = memo_key(namespace);
    let fingerprint = format!("{hold}|{secrets:?}");
    if ctx.observed_recently(&memo, &fingerprint, std::time::Duration::MAX) {
        return Ok(());
    }
    hold_secrets(ctx, namespace, secrets, hold).await?;
    hold_binding(ctx, namespace, hold && !secrets.is_empty()).await?;
    ctx.mark_observed(&memo, &fingerprint);
    Ok(())
}

/// Forgets what [`sync`] remembered for `namespace` (a Secret of it changed).
pub fn forget(ctx: &Context, namespace: &str) {
    ctx.forget_observed(&memo_key(namespace));
}

fn memo_key(namespace: &str) -> String {
    format!("credentials-hold/{namespace}")
}

/// Every Secret of the namespace carrying [`IN_USE`] that is not needed loses it (a reference
/// changed, or nothing needs it any more); every needed one gets it.
async fn hold_secrets(ctx: &Context, namespace: &str, secrets: &BTreeSet<String>, hold: bool) -> Result<(), Error> {
    // Secrets of a namespace that did not bind CONTROLLER_BINDING are not the controller's to
    // read: no credentials were taken from there either. Asked first, so that no refused
    // request is logged for every namespace without credentials.
    if !crate::permissions::may_watch_secrets_in(&ctx.client, namespace).await {
        once(ctx, namespace, "secrets", || {
            tracing::debug!(namespace, "may not list Secrets here (no RoleBinding to {CONTROLLER_BINDING}): nothing to hold")
        });
        return Ok(());
    }
    let api = crate::slim::SlimApi::of::<Secret>(ctx.client.clone(), Some(namespace));
    // Each Secret's metadata decoded within the decoder's bounds (a tenant's labels are not
    // bounded in number).
    let listed = crate::decode::list::<PartialObjectMeta<Secret>>(&ctx.client, namespace, &ListParams::default()).await?;
    for secret in listed {
        let name = secret.name_any();
        let want = hold && secrets.contains(&name);
        if let Some(finalizers) = finalizers_for(secret.finalizers(), want) {
            crate::context::patch_finalizers(&api, &name, secret.meta().resource_version.as_deref(), finalizers).await?;
            tracing::debug!(namespace, secret = %name, held = want, "credentials Secret hold changed");
        }
    }
    Ok(())
}

async fn hold_binding(ctx: &Context, namespace: &str, hold: bool) -> Result<(), Error> {
    let api = crate::slim::SlimApi::of::<RoleBinding>(ctx.client.clone(), Some(namespace));
    let binding = match api.get_opt(CONTROLLER_BINDING).await {
        Ok(Some(binding)) => binding.meta(),
        Ok(None) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            forbidden_binding(ctx, namespace);
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let Some(finalizers) = finalizers_for(binding.finalizers.as_deref().unwrap_or_default(), hold) else { return Ok(()) };
    match crate::context::patch_finalizers(&api, CONTROLLER_BINDING, binding.resource_version.as_deref(), finalizers).await {
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 403 => {
            forbidden_binding(ctx, namespace);
            Ok(())
        }
        other => other,
    }
}

fn forbidden_binding(ctx: &Context, namespace: &str) {
    once(ctx, namespace, "rolebinding", || {
        tracing::warn!(
            namespace,
            "may not get/patch RoleBinding {CONTROLLER_BINDING}: deleting this namespace at once can strand machines at the cloud \
             (the binding goes before the Servers can read their credentials); grant get and patch on rolebindings with \
             resourceNames [{CONTROLLER_BINDING}] as deploy/rbac/cluster-role.yaml does"
        );
    });
}

/// Runs `log` once per namespace and topic for the controller's lifetime.
fn once(ctx: &Context, namespace: &str, topic: &str, log: impl FnOnce()) {
    let key = format!("credentials-hold-logged/{topic}/{namespace}");
    if !ctx.observed_recently(&key, "", std::time::Duration::MAX) {
        ctx.mark_observed(&key, "");
        log();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn account(v: serde_json::Value) -> Result<ProviderAccount, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn the_needed_secrets_are_the_accounts_and_the_servers_ssh_keys_of_the_namespace() -> Result<(), serde_json::Error> {
        let accounts = vec![
            account(json!({"name": "a", "type": "aws", "credentialsSecretRef": {"name": "creds"}}))?,
            account(json!({"name": "b", "type": "aws", "credentialsSecretRef": {"name": "elsewhere", "namespace": "other"}}))?,
            account(json!({"name": "c", "type": "simulated"}))?,
        ];
        let server = |ns: &str, key: &str| -> Result<Arc<Server>, serde_json::Error> {
            Ok(Arc::new(serde_json::from_value(json!({
                "apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
                "metadata": {"name": "s", "namespace": ns},
                "spec": {"sshKeySecretRef": {"name": key}}
            }))?))
        };
        let servers = [server("team", "ssh")?, server("other", "theirs")?];
        let names: Vec<String> = needed("team", &accounts, servers.iter()).into_iter().collect();
        assert_eq!(names, ["creds", "ssh"]);
        Ok(())
    }

    #[test]
    fn the_finalizer_is_added_and_removed_and_others_are_kept() {
        let others = vec!["other/finalizer".to_string()];
        let held = finalizers_for(&others, true);
        assert_eq!(held.as_deref(), Some(&["other/finalizer".to_string(), IN_USE.to_string()][..]));
        let held = held.unwrap_or_default();
        assert_eq!(finalizers_for(&held, true), None);
        assert_eq!(finalizers_for(&held, false), Some(others.clone()));
        assert_eq!(finalizers_for(&others, false), None);
    }
}
