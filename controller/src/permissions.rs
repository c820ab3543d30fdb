//! What this controller's identity may do, asked of the API server (SelfSubjectAccessReview).
//!
//! deploy/ grants Secrets per namespace only (ClusterRole `provisioning-controller-secrets`
//! bound by a RoleBinding per workspace namespace, deploy/rbac), so a cluster-wide Secret
//! watch would be refused forever there: the Workspace and TaskServ controllers watch Secrets
//! cluster-wide only where [`may_watch_all_secrets`] says it is allowed, and otherwise one
//! namespace at a time where [`may_watch_secrets_in`] allows it
//! ([`crate::secret_watch`]).

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::{Api, Client};

/// Whether this identity may list and watch Secrets in every namespace. An API server
/// without the authorization API is taken to allow it (it has no RBAC to refuse the watch
/// either).
pub async fn may_watch_all_secrets(client: &Client) -> bool {
    may_watch_secrets(client, None).await
}

/// Whether this identity may list and watch Secrets in `namespace` (same fallback as
/// [`may_watch_all_secrets`]).
pub async fn may_watch_secrets_in(client: &Client, namespace: &str) -> bool {
    may_watch_secrets(client, Some(namespace)).await
}

async fn may_watch_secrets(client: &Client, namespace: Option<&str>) -> bool {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for verb in ["list", "watch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("secrets".into()),
                    namespace: namespace.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&kube::api::PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => return false,
            Err(e) => {
                tracing::debug!(error = %e, "no SelfSubjectAccessReview; assuming Secrets may be watched");
                return true;
            }
        }
    }
    true
}
