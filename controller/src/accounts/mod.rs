//! Provider accounts: a Workspace's `ProviderAccount` (plus its credentials Secret) turned
//! into a provider instance, cached per account.
//!
//! - [`ProviderRegistry`]: provider instances per (workspace, account), rebuilt when the
//!   account's spec or its Secret changes; credentials live only inside the instance;
//! - [`rules`]: tenancy and endpoint rules checked before anything is read or sent;
//! - [`build`]: the provider crate's config for an account (host paths from
//!   [`crate::host`], SSH settings, state directory, remote layout of `nu` and the catalog);
//! - [`AccountCheck`] and [`AccountChecks`]: the Workspace reconciler's memo of credential
//!   checks per provider instance.
//!
//! Shared by every kind: imports no kind module.

pub mod build;
pub mod rules;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use provisioning_crds::ProviderAccount;
use provisioning_providers::{Credentials, ProviderError, SharedProvider};

pub use self::build::{
    DEFAULT_REMOTE_CATALOG, DEFAULT_REMOTE_NU, account_state_dir, provider_config, remote_layout, ssh_settings, uses_ssh,
};
pub use self::rules::{AccountRefused, AwsWebIdentity, WebIdentityGrant, check_account, check_aws_identity, check_endpoint};
use crate::effective_workspace::EffectiveWorkspace;
use crate::error::Error;
use crate::host::HostPaths;

/// How long credentials read from a Secret are trusted before the Secret is read again.
const CREDENTIALS_TTL: Duration = Duration::from_secs(60);

/// How one provider account check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountCheck {
    /// Credentials accepted.
    Ready,
    /// Will not work until spec or Secret changes (auth failure, missing Secret, unknown type).
    Failed(String),
    /// Could not tell this time (transient provider error).
    Retrying(String),
}

/// Provider-account checks, keyed `workspace/account`: (provider instance fingerprint, when,
/// result). Credentials are validated again only when the provider instance changes (account
/// spec or Secret changed) or the resync interval passed.
pub type AccountChecks = Mutex<HashMap<String, (String, Instant, AccountCheck)>>;

struct CachedProvider {
    fingerprint: String,
    secret_version: Option<String>,
    fetched: Instant,
    provider: SharedProvider,
    /// Whose it is: for the batched drift survey ([`Providers::cached_accounts`]).
    workspace: EffectiveWorkspace,
    account: String,
}

/// Provider instances per (workspace, account), rebuilt when the account's spec or its
/// credentials Secret changes. Credentials live only inside the provider instance.
pub struct ProviderRegistry {
    client: Client,
    state_dir: PathBuf,
    host: HostPaths,
    cache: Mutex<HashMap<String, CachedProvider>>,
    /// Latest resourceVersion seen by the Secret watch, keyed `namespace/name` (only Secrets
    /// some provider account refers to). A cached provider built from another version is
    /// rebuilt on its next use, whatever [`CREDENTIALS_TTL`] says.
    secret_versions: Mutex<HashMap<String, String>>,
    /// Whether `http://` account endpoints are accepted (controller config).
    pub allow_insecure_endpoints: bool,
    /// Who may assume aws roles with the controller's web identity (controller config).
    pub aws_web_identity: Option<AwsWebIdentity>,
}

/// The credential keys any provider reads from an account's Secret, and the controller-only ones
/// a tenant's Secret is refused for setting.
const CREDENTIAL_KEYS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_EXTERNAL_ID",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_STS_ENDPOINT",
    "UPCLOUD_USERNAME",
    "UPCLOUD_PASSWORD",
    "SIMULATED_TOKEN",
    "SSH_PRIVATE_KEY",
];

impl ProviderRegistry {
    /// A registry building providers with state under `state_dir`, handing them the host
    /// paths resolved at start-up.
    pub fn new(client: Client, state_dir: PathBuf, host: HostPaths) -> Self {
        ProviderRegistry {
            client,
            state_dir,
            host,
            cache: Mutex::new(HashMap::new()),
            secret_versions: Mutex::new(HashMap::new()),
            allow_insecure_endpoints: false,
            aws_web_identity: None,
        }
    }

    /// The host paths providers are built with.
    pub fn host(&self) -> &HostPaths {
        &self.host
    }

    /// Records the resourceVersion of Secret `namespace/name` as seen by the watch (`None`
    /// when it was deleted). Returns whether it differs from the version recorded before,
    /// i.e. whether providers built from it must re-read it. Only metadata is involved:
    /// secret values never pass through here.
    pub fn note_secret(&self, namespace: &str, name: &str, resource_version: Option<&str>) -> bool {
        let key = format!("{namespace}/{name}");
        let mut versions = self.secret_versions.lock().unwrap_or_else(|p| p.into_inner());
        match resource_version {
            Some(rv) => versions.insert(key, rv.to_string()).as_deref() != Some(rv),
            None => {
                versions.insert(key, "deleted".to_string());
                true
            }
        }
    }

    /// Whether a provider built from Secret version `built_from` is still current (no newer
    /// version seen by the watch).
    fn secret_current(&self, secret_key: &str, built_from: Option<&String>) -> bool {
        let versions = self.secret_versions.lock().unwrap_or_else(|p| p.into_inner());
        versions.get(secret_key).is_none_or(|latest| Some(latest) == built_from)
    }

    /// Every provider instance built so far (for followers of machine events).
    pub fn cached(&self) -> Vec<SharedProvider> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.values().map(|c| c.provider.clone()).collect()
    }

    /// Every provider instance built so far with the workspace and account it serves (for
    /// the batched drift survey, [`crate::server::survey`]).
    pub fn cached_accounts(&self) -> Vec<(EffectiveWorkspace, String, SharedProvider)> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.values().map(|c| (c.workspace.clone(), c.account.clone(), c.provider.clone())).collect()
    }

    /// The provider of `account` in `ws`.
    pub async fn get(&self, ws: &EffectiveWorkspace, account: &ProviderAccount) -> Result<SharedProvider, Error> {
        // Tenancy and transport rules first: nothing is read or sent for a refused account.
        check_account(account, &ws.namespace, self.allow_insecure_endpoints)
            .map_err(|r| Error::Stalled { reason: r.reason, message: r.message })?;
        let key = format!("{}/{}", ws.key(), account.name);
        let fingerprint = format!("{}|{}", ws.namespace, serde_json::to_string(account)?);
        let secret_key =
            account.credentials_secret_ref.as_ref().map(|r| format!("{}/{}", r.namespace.as_deref().unwrap_or(&ws.namespace), r.name));
        {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = cache.get(&key)
                && c.fingerprint == fingerprint
                && secret_key
                    .as_deref()
                    .is_none_or(|k| c.fetched.elapsed() < CREDENTIALS_TTL && self.secret_current(k, c.secret_version.as_ref()))
            {
                return Ok(c.provider.clone());
            }
        }
        let (mut credentials, secret_version) = self.credentials(ws, account).await?;
        // What the Secret asks of the controller's own identity (web identity), before use.
        check_aws_identity(account, &ws.namespace, &mut credentials, self.aws_web_identity.as_ref())
            .map_err(|r| Error::Stalled { reason: r.reason, message: r.message })?;
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = cache.get_mut(&key)
                && c.fingerprint == fingerprint
                && c.secret_version == secret_version
            {
                c.fetched = Instant::now();
                return Ok(c.provider.clone());
            }
        }
        let state_dir = account_state_dir(&self.state_dir, ws, account);
        let mut config = provider_config(account, credentials, &state_dir, &self.host);
        config.tenant = ws.namespace.clone();
        let provider = provisioning_providers::build_provider(&config).map_err(|e| match e {
            ProviderError::InvalidRequest(message) => Error::Stalled { reason: "ProviderUnavailable", message },
            other => Error::provider(&account.name, other),
        })?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(
            key,
            CachedProvider {
                fingerprint,
                secret_version,
                fetched: Instant::now(),
                provider: provider.clone(),
                workspace: ws.clone(),
                account: account.name.clone(),
            },
        );
        Ok(provider)
    }

    /// Whether `namespace` lets Workspace `workspace` use its Secrets: the namespace carries
    /// the label `provisioning.dev/workspace=<workspace>`, set by whoever may edit namespaces
    /// (or by the controller when it created the namespace for that Workspace). Creating a
    /// Workspace that claims a namespace is not enough: its account's endpoint is the
    /// Workspace author's, and the credentials would be sent there.
    async fn opted_in(&self, namespace: &str, workspace: &str) -> Result<(), Error> {
        let found = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone()).get_metadata_opt(namespace).await?;
        let label = found.as_ref().and_then(|n| n.metadata.labels.as_ref()?.get(crate::effective_workspace::LABEL_WORKSPACE).cloned());
        if label.as_deref() == Some(workspace) {
            return Ok(());
        }
        let has = match label {
            Some(other) => format!("is labelled {}={other:?}", crate::effective_workspace::LABEL_WORKSPACE),
            None if found.is_none() => "does not exist yet".to_string(),
            None => format!("has no label {}", crate::effective_workspace::LABEL_WORKSPACE),
        };
        Err(Error::Stalled {
            reason: "NamespaceNotOptedIn",
            message: format!(
                "namespace {namespace:?} {has}: it has not opted in to workspace {workspace:?} reading its Secrets; whoever may edit namespaces opts it in with `kubectl label namespace {namespace} {}={workspace}`",
                crate::effective_workspace::LABEL_WORKSPACE
            ),
        })
    }

    async fn credentials(&self, ws: &EffectiveWorkspace, account: &ProviderAccount) -> Result<(Credentials, Option<String>), Error> {
        let Some(reference) = &account.credentials_secret_ref else {
            return Ok((Credentials::default(), None));
        };
        let namespace = reference.namespace.clone().unwrap_or_else(|| ws.namespace.clone());
        if let Some(workspace) = &ws.name {
            self.opted_in(&namespace, workspace).await?;
        }
        // Only the keys a provider reads (and those refused when a tenant sets them) are
        // decoded (crate::slim): the Secret is the tenant's to make large.
        let secret = crate::slim::SlimApi::of::<Secret>(self.client.clone(), Some(&namespace))
            .get_data(&reference.name, true, &|k| CREDENTIAL_KEYS.contains(&k))
            .await?
            .map(crate::slim::SlimData::secret);
        let Some(secret) = secret else {
            return Err(Error::Stalled {
                reason: "CredentialsNotFound",
                message: format!(
                    "Secret {namespace}/{} holding the credentials of provider account {:?} does not exist",
                    reference.name, account.name
                ),
            });
        };
        let mut values = std::collections::BTreeMap::new();
        for (k, v) in secret.data.unwrap_or_default() {
            if let Ok(s) = String::from_utf8(v.0) {
                values.insert(k, s);
            }
        }
        for (k, v) in secret.string_data.unwrap_or_default() {
            values.insert(k, v);
        }
        Ok((Credentials(values), secret.metadata.resource_version))
    }
}
