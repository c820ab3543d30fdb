//! Tenancy and transport rules of a provider account (pure): checked before anything is read
//! for it (its Secret) or sent to it (a provider request).

use provisioning_crds::ProviderAccount;

/// Why a provider account may not be used: a tenancy or transport rule it breaks. Nothing is
/// read (no Secret) and nothing is sent (no provider request) for such an account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountRefused {
    /// Condition reason: CrossNamespaceReference, InsecureEndpoint or InvalidEndpoint.
    pub reason: &'static str,
    /// What is wrong and how to fix it (names the account, Secret and endpoint; never a value).
    pub message: String,
}

/// Checks the tenancy and endpoint rules of one account used in `namespace` (pure):
/// - its credentials Secret lives in `namespace` (a Workspace must not borrow another
///   tenant's credentials by naming their namespace);
/// - its endpoint, when set, is `https://` — `http://` only when the controller's config
///   allows insecure endpoints (local emulators), since credentials are sent there.
pub fn check_account(account: &ProviderAccount, namespace: &str, allow_insecure_endpoints: bool) -> Result<(), AccountRefused> {
    if let Some(reference) = &account.credentials_secret_ref
        && let Some(other) = reference.namespace.as_deref().filter(|n| !n.is_empty() && *n != namespace)
    {
        return Err(AccountRefused {
            reason: "CrossNamespaceReference",
            message: format!(
                "provider account {:?}: credentialsSecretRef names Secret {other}/{} but Secrets may only be referenced in the workspace's own namespace {namespace:?}; create the Secret there and drop credentialsSecretRef.namespace",
                account.name, reference.name
            ),
        });
    }
    check_endpoint(&account.name, &account.endpoint, allow_insecure_endpoints)
}

/// The endpoint rule of [`check_account`].
pub fn check_endpoint(account: &str, endpoint: &str, allow_insecure_endpoints: bool) -> Result<(), AccountRefused> {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        return Ok(());
    }
    let scheme = endpoint.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    let host_present = endpoint.split_once("://").is_some_and(|(_, rest)| !rest.is_empty() && !rest.starts_with('/'));
    match scheme.as_deref() {
        Some("https") if host_present => Ok(()),
        Some("http") if host_present && allow_insecure_endpoints => Ok(()),
        Some("http") if host_present => Err(AccountRefused {
            reason: "InsecureEndpoint",
            message: format!(
                "provider account {account:?}: endpoint {endpoint:?} is plain http; endpoints must be https (credentials are sent there) unless the controller runs with --allow-insecure-endpoints (allow_insecure_endpoints in its config), meant for local emulators only"
            ),
        }),
        _ => Err(AccountRefused {
            reason: "InvalidEndpoint",
            message: format!("provider account {account:?}: endpoint {endpoint:?} is not an https:// URL with a host"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(yaml: &str) -> ProviderAccount {
        #[allow(clippy::expect_used)]
        provisioning_yaml::from_str(yaml).expect("account")
    }

    #[test]
    fn secrets_stay_in_the_workspace_namespace() {
        let own = account("{name: a, type: aws, credentialsSecretRef: {name: creds}}");
        assert_eq!(check_account(&own, "team-a", false), Ok(()));
        let same = account("{name: a, type: aws, credentialsSecretRef: {name: creds, namespace: team-a}}");
        assert_eq!(check_account(&same, "team-a", false), Ok(()));
        let other = account("{name: a, type: aws, credentialsSecretRef: {name: creds, namespace: team-b}}");
        let refused = check_account(&other, "team-a", true).expect_err("cross-namespace");
        assert_eq!(refused.reason, "CrossNamespaceReference");
        assert!(refused.message.contains("team-b/creds") && refused.message.contains("\"team-a\""), "{}", refused.message);
    }

    #[test]
    fn endpoints_must_be_https_unless_allowed() {
        let https = account("{name: a, type: upcloud, endpoint: 'https://api.example.test/'}");
        assert_eq!(check_account(&https, "ns", false), Ok(()));
        let http = account("{name: a, type: upcloud, endpoint: 'http://127.0.0.1:8080/'}");
        let refused = check_account(&http, "ns", false).expect_err("http");
        assert_eq!(refused.reason, "InsecureEndpoint");
        assert!(
            refused.message.contains("http://127.0.0.1:8080/") && refused.message.contains("--allow-insecure-endpoints"),
            "{}",
            refused.message
        );
        assert_eq!(check_account(&http, "ns", true), Ok(()));
        for bad in ["ftp://x/", "127.0.0.1:8080", "https://", "http:///path"] {
            let a = account(&format!("{{name: a, type: aws, endpoint: '{bad}'}}"));
            assert_eq!(check_account(&a, "ns", true).map_err(|r| r.reason), Err("InvalidEndpoint"), "{bad}");
        }
        assert_eq!(check_account(&account("{name: l, type: local}"), "ns", false), Ok(()));
    }
}
