//! Tenancy and transport rules of a provider account (pure): checked before anything is read
//! for it (its Secret) or sent to it (a provider request).

use provisioning_crds::ProviderAccount;

/// Why a provider account may not be used: a tenancy or transport rule it breaks. Nothing is
/// read (no Secret) and nothing is sent (no provider request) for such an account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountRefused {
    /// Condition reason: CrossNamespaceReference, InvalidRegion, InsecureEndpoint or InvalidEndpoint.
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
    if account.provider_type == provisioning_crds::ProviderType::Aws
        && !account.region.is_empty()
        && !provisioning_providers::aws::valid_region(&account.region)
    {
        // The region names the regional endpoints' hosts (EC2, and STS, where a web identity
        // token goes): "x@attacker.example/" would send requests elsewhere.
        let shown: String = account.region.chars().take(64).collect();
        return Err(AccountRefused {
            reason: "InvalidRegion",
            message: format!(
                "provider account {:?}: region {shown:?} is not an AWS region (lower-case words joined by '-' ending in a number, e.g. eu-north-1)",
                account.name
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

/// The controller's opt-in to web identity for aws accounts (`[aws_web_identity]` in its
/// config): assuming a role with the controller's own token (IRSA / EKS Pod Identity).
///
/// The token is the controller's identity, not a tenant's: any role that trusts it could be
/// assumed for anyone who can name it (a confused deputy). So a Workspace account may use it
/// only for a role its namespace is granted here, by whoever configures the controller; a
/// tenant's Secret can never name a token file or an STS endpoint; and the token goes only to
/// `endpoint` (empty: the region's AWS STS), never to an account's own `endpoint`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsWebIdentity {
    /// The projected ServiceAccount token file (read again at each refresh).
    pub token_file: std::path::PathBuf,
    /// STS endpoint the token is sent to; empty for `https://sts.<region>.amazonaws.com/`.
    /// An account using web identity may set its own `endpoint` only to this same value
    /// (an emulator serving EC2 and STS on one port), since the role's temporary
    /// credentials are sent there.
    #[serde(default)]
    pub endpoint: String,
    /// Who may assume what with it. No grant: nobody.
    #[serde(default)]
    pub grants: Vec<WebIdentityGrant>,
}

/// Namespace `namespace` may assume `role_arns` (exact ARNs) with the controller's web identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebIdentityGrant {
    /// The namespace (of the Workspace and its Secret).
    pub namespace: String,
    /// Roles it may assume.
    pub role_arns: Vec<String>,
}

/// Checks what an aws account's Secret asks for and completes it (pure): a Secret holding
/// `AWS_ROLE_ARN` and no static keys asks for the controller's web identity, allowed only by
/// a grant of `web` for (`namespace`, role) — then the token file and STS endpoint are added
/// to `credentials`. Keys only the controller sets (token file, STS endpoint) are refused in
/// a Secret. Messages name keys and roles, never a value of a secret key.
pub fn check_aws_identity(
    account: &ProviderAccount,
    namespace: &str,
    credentials: &mut provisioning_providers::Credentials,
    web: Option<&AwsWebIdentity>,
) -> Result<(), AccountRefused> {
    use provisioning_providers::aws::credentials::{
        ACCESS_KEY_ID, CONTROLLER_ONLY_KEYS, ROLE_ARN, SECRET_ACCESS_KEY, STS_ENDPOINT, WEB_IDENTITY_TOKEN_FILE,
    };
    if account.provider_type != provisioning_crds::ProviderType::Aws {
        return Ok(());
    }
    let secret = account.credentials_secret_ref.as_ref().map_or_else(|| "(none)".to_string(), |r| r.name.clone());
    if let Some(key) = CONTROLLER_ONLY_KEYS.iter().find(|k| credentials.0.contains_key(**k)) {
        return Err(AccountRefused {
            reason: "ControllerOnlyCredential",
            message: format!(
                "provider account {:?}: Secret {secret} sets {key}, which only the controller's config may set (a token file is the controller's own identity, not the workspace's); remove it and put {ROLE_ARN} alone to ask for web identity",
                account.name
            ),
        });
    }
    let set = |k: &str| credentials.get(k).is_some_and(|v| !v.trim().is_empty());
    let Some(role) = credentials.get(ROLE_ARN).map(str::trim).filter(|r| !r.is_empty()).map(str::to_string) else {
        return Ok(());
    };
    if set(ACCESS_KEY_ID) || set(SECRET_ACCESS_KEY) {
        return Ok(()); // AssumeRole with the workspace's own keys.
    }
    let Some(web) = web else {
        return Err(AccountRefused {
            reason: "WebIdentityNotEnabled",
            message: format!(
                "provider account {:?}: Secret {secret} names role {role} without {ACCESS_KEY_ID}/{SECRET_ACCESS_KEY}, which asks for the controller's web identity, and the controller's config does not enable it ([aws_web_identity]); add the keys to assume the role with",
                account.name
            ),
        });
    };
    let granted = web.grants.iter().any(|g| g.namespace == namespace && g.role_arns.iter().any(|r| r == &role));
    if !granted {
        return Err(AccountRefused {
            reason: "WebIdentityNotAllowed",
            message: format!(
                "provider account {:?}: namespace {namespace:?} may not assume role {role} with the controller's web identity: the controller's config grants it no such role ([aws_web_identity] grants); ask its operator, or add {ACCESS_KEY_ID}/{SECRET_ACCESS_KEY} to assume the role with",
                account.name
            ),
        });
    }
    let endpoint = account.endpoint.trim();
    if !endpoint.is_empty() && endpoint.trim_end_matches('/') != web.endpoint.trim().trim_end_matches('/') {
        return Err(AccountRefused {
            reason: "WebIdentityEndpoint",
            message: format!(
                "provider account {:?}: endpoint {endpoint:?} cannot be used with the controller's web identity (role {role}): its temporary credentials would be sent there; drop endpoint",
                account.name
            ),
        });
    }
    credentials.0.insert(WEB_IDENTITY_TOKEN_FILE.to_string(), web.token_file.display().to_string());
    if !web.endpoint.trim().is_empty() {
        credentials.0.insert(STS_ENDPOINT.to_string(), web.endpoint.trim().to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(yaml: &str) -> ProviderAccount {
        #[allow(clippy::expect_used)]
        provisioning_yaml::from_str(yaml).expect("account")
    }

    #[test]
    fn an_aws_region_that_would_change_the_endpoints_host_is_refused() {
        // Twenty-first re-review H1: the region is placed into https://sts.<region>.amazonaws.com/
        // where the controller's web identity token is posted.
        for region in ["x@attacker.example/", "x.attacker.example/", "a@attacker.example:8443/x?", "eu-north-1.", "EU-NORTH-1", "eu-north-"]
        {
            let refused = check_account(&account(&format!("{{name: a, type: aws, region: {region:?}}}")), "ns", false).expect_err(region);
            assert_eq!(refused.reason, "InvalidRegion", "{region}");
        }
        for region in ["eu-north-1", "us-gov-west-1", "ap-southeast-2", "eusc-de-east-1", ""] {
            assert_eq!(check_account(&account(&format!("{{name: a, type: aws, region: {region:?}}}")), "ns", false), Ok(()), "{region}");
        }
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

    fn creds(pairs: &[(&str, &str)]) -> provisioning_providers::Credentials {
        provisioning_providers::Credentials(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    const ROLE: &str = "arn:aws:iam::123456789012:role/team-a";

    fn web() -> AwsWebIdentity {
        AwsWebIdentity {
            token_file: "/var/run/token".into(),
            endpoint: String::new(),
            grants: vec![WebIdentityGrant { namespace: "team-a".into(), role_arns: vec![ROLE.into()] }],
        }
    }

    #[test]
    fn web_identity_needs_the_controllers_grant_for_the_namespace_and_role() {
        let aws = account("{name: a, type: aws, credentialsSecretRef: {name: creds}}");
        // Off by default: a role without keys is refused, naming the config section.
        let mut c = creds(&[("AWS_ROLE_ARN", ROLE)]);
        let off = check_aws_identity(&aws, "team-a", &mut c, None).expect_err("off");
        assert_eq!(off.reason, "WebIdentityNotEnabled");
        assert!(off.message.contains("[aws_web_identity]") && off.message.contains(ROLE), "{}", off.message);
        // Granted: the token file is added for the provider.
        check_aws_identity(&aws, "team-a", &mut c, Some(&web())).expect("granted");
        assert_eq!(c.get("AWS_WEB_IDENTITY_TOKEN_FILE"), Some("/var/run/token"));
        // Another namespace, or another role, is refused (confused deputy).
        let mut c = creds(&[("AWS_ROLE_ARN", ROLE)]);
        let other_ns = check_aws_identity(&aws, "team-b", &mut c, Some(&web())).expect_err("other namespace");
        assert_eq!(other_ns.reason, "WebIdentityNotAllowed");
        assert!(c.get("AWS_WEB_IDENTITY_TOKEN_FILE").is_none());
        let mut c = creds(&[("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/admin")]);
        assert_eq!(check_aws_identity(&aws, "team-a", &mut c, Some(&web())).map_err(|r| r.reason), Err("WebIdentityNotAllowed"));
        // The tenant's own endpoint would receive the role's temporary credentials.
        let tenant_endpoint = account("{name: a, type: aws, endpoint: 'https://evil.example.test/', credentialsSecretRef: {name: c}}");
        let mut c = creds(&[("AWS_ROLE_ARN", ROLE)]);
        assert_eq!(check_aws_identity(&tenant_endpoint, "team-a", &mut c, Some(&web())).map_err(|r| r.reason), Err("WebIdentityEndpoint"));
    }

    #[test]
    fn a_tenant_secret_never_names_a_token_file_or_sts_endpoint() {
        let aws = account("{name: a, type: aws, credentialsSecretRef: {name: creds}}");
        for key in ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_STS_ENDPOINT"] {
            let mut c = creds(&[("AWS_ROLE_ARN", ROLE), (key, "/var/run/secrets/eks.amazonaws.com/serviceaccount/token")]);
            let refused = check_aws_identity(&aws, "team-a", &mut c, Some(&web())).expect_err(key);
            assert_eq!(refused.reason, "ControllerOnlyCredential");
            assert!(refused.message.contains(key) && !refused.message.contains("/var/run/secrets"), "{}", refused.message);
        }
        // Keys plus a role: AssumeRole with the workspace's own keys, no opt-in needed.
        let mut c = creds(&[("AWS_ROLE_ARN", ROLE), ("AWS_ACCESS_KEY_ID", "AKIA1"), ("AWS_SECRET_ACCESS_KEY", "s")]);
        assert_eq!(check_aws_identity(&aws, "team-b", &mut c, None), Ok(()));
        assert!(c.get("AWS_WEB_IDENTITY_TOKEN_FILE").is_none());
    }
}
