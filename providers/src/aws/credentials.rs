//! The credentials an aws account signs its EC2 calls with: static keys, a role assumed with
//! them (STS `AssumeRole`, optional external id), or a role assumed with a web identity token
//! (STS `AssumeRoleWithWebIdentity`, the projected ServiceAccount token IRSA / EKS Pod
//! Identity give a pod).
//!
//! Temporary credentials are fetched on first use and refreshed [`REFRESH_MARGIN`] before
//! their `Expiration`; one refresh is in flight at a time (callers wait for it), and a caller
//! never gets a credential that expires within [`MIN_VALIDITY`]. A web identity token file is
//! read again at every refresh (the kubelet rotates it). Every secret value seen — static
//! keys, temporary keys, session tokens, web identity tokens — is redacted from errors
//! ([`AwsCredentials::redact`]); `Debug` prints none of them.
//!
//! Who may use web identity is decided by the controller (its config opts in per namespace
//! and role): the token file and its STS endpoint reach this module only through keys the
//! controller sets ([`WEB_IDENTITY_TOKEN_FILE`], [`STS_ENDPOINT`]) and refuses in a tenant's
//! Secret. The token is never sent to the account's own `endpoint` (a tenant's choice).

use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use serde::Deserialize;

use crate::ratelimit::{redact, transport_error};
use crate::{ProviderConfig, ProviderError, ProviderResult};

/// Secret key: the static access key id.
pub const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
/// Secret key: the static secret access key.
pub const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
/// Secret key: the session token of temporary static keys.
pub const SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";
/// Secret key: the role to assume (`arn:aws:iam::<account>:role/<name>`).
pub const ROLE_ARN: &str = "AWS_ROLE_ARN";
/// Secret key: the external id the role's trust policy asks for (AssumeRole only).
pub const EXTERNAL_ID: &str = "AWS_EXTERNAL_ID";
/// Secret key: the role session name (default `provisioning-<account>`).
pub const ROLE_SESSION_NAME: &str = "AWS_ROLE_SESSION_NAME";
/// Set by the controller only (refused in a tenant's Secret): the web identity token file.
pub const WEB_IDENTITY_TOKEN_FILE: &str = "AWS_WEB_IDENTITY_TOKEN_FILE";
/// Set by the controller only (refused in a tenant's Secret): the STS endpoint web identity
/// tokens are sent to; empty for the region's AWS STS endpoint.
pub const STS_ENDPOINT: &str = "AWS_STS_ENDPOINT";
/// Keys only the controller may set.
pub const CONTROLLER_ONLY_KEYS: [&str; 2] = [WEB_IDENTITY_TOKEN_FILE, STS_ENDPOINT];

/// The STS API version spoken.
pub const STS_API_VERSION: &str = "2011-06-15";
/// How long before `Expiration` temporary credentials are refreshed.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// A credential is never handed out with less validity left than this (a request signed now
/// reaches AWS within it), even when a refresh failed.
pub const MIN_VALIDITY: Duration = Duration::from_secs(60);
/// Session length asked of STS (the default maximum of a role).
pub const SESSION_SECONDS: u32 = 3600;
/// Largest web identity token file read (projected tokens are a few KiB).
const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// Temporary credential sets remembered for redaction (older ones have expired).
const REMEMBERED_SETS: usize = 4;
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// Where an account's signing credentials come from.
#[derive(Clone, PartialEq, Eq)]
pub enum Source {
    /// The Secret's keys, as they are.
    Static,
    /// A role assumed with the Secret's keys.
    AssumeRole {
        /// The role.
        role_arn: String,
        /// External id for the trust policy's `sts:ExternalId` condition.
        external_id: Option<String>,
        /// Role session name.
        session_name: String,
    },
    /// A role assumed with the controller's web identity token (opted in by the controller).
    WebIdentity {
        /// The role.
        role_arn: String,
        /// The token file, read at each refresh.
        token_file: PathBuf,
        /// Role session name.
        session_name: String,
    },
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Static => f.write_str("Static"),
            Source::AssumeRole { role_arn, external_id, session_name } => f
                .debug_struct("AssumeRole")
                .field("role_arn", role_arn)
                .field("external_id", &external_id.as_ref().map(|_| "[redacted]"))
                .field("session_name", session_name)
                .finish(),
            Source::WebIdentity { role_arn, token_file, session_name } => f
                .debug_struct("WebIdentity")
                .field("role_arn", role_arn)
                .field("token_file", token_file)
                .field("session_name", session_name)
                .finish(),
        }
    }
}

impl Source {
    /// The role assumed, if any.
    pub fn role_arn(&self) -> Option<&str> {
        match self {
            Source::Static => None,
            Source::AssumeRole { role_arn, .. } | Source::WebIdentity { role_arn, .. } => Some(role_arn),
        }
    }
}

fn value<'a>(config: &'a ProviderConfig, key: &str) -> Option<&'a str> {
    config.credentials.get(key).map(str::trim).filter(|v| !v.is_empty())
}

/// Whether `arn` is an IAM role ARN: `arn:<partition>:iam::<12 digits>:role/<path/name>`.
pub fn is_role_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    matches!(parts.as_slice(), ["arn", partition, "iam", "", account, resource]
        if partition.starts_with("aws")
            && account.len() == 12
            && account.bytes().all(|b| b.is_ascii_digit())
            && resource.strip_prefix("role/").is_some_and(|name| !name.is_empty() && !name.ends_with('/')))
}

/// The role session name: `AWS_ROLE_SESSION_NAME`, else `provisioning-<account>` (cut to
/// STS's 64 characters, characters STS refuses replaced by `-`).
fn session_name(config: &ProviderConfig) -> ProviderResult<String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_+=,.@-".contains(c);
    if let Some(name) = value(config, ROLE_SESSION_NAME) {
        if name.len() < 2 || name.len() > 64 || !name.chars().all(allowed) {
            return Err(ProviderError::InvalidRequest(format!(
                "{ROLE_SESSION_NAME} of aws account {:?} must be 2 to 64 characters of letters, digits and _+=,.@-",
                config.name
            )));
        }
        return Ok(name.to_string());
    }
    let name: String = format!("provisioning-{}", config.name).chars().map(|c| if allowed(c) { c } else { '-' }).take(64).collect();
    Ok(name)
}

/// Which source the account's credentials describe (validated, nothing fetched).
pub fn source(config: &ProviderConfig) -> ProviderResult<Source> {
    let account = &config.name;
    let has_keys = value(config, ACCESS_KEY_ID).is_some() || value(config, SECRET_ACCESS_KEY).is_some();
    let token_file = value(config, WEB_IDENTITY_TOKEN_FILE);
    let Some(role_arn) = value(config, ROLE_ARN) else {
        if token_file.is_some() {
            return Err(ProviderError::Auth(format!(
                "aws account {account:?}: a web identity token file needs {ROLE_ARN}, the role to assume with it"
            )));
        }
        return Ok(Source::Static);
    };
    if !is_role_arn(role_arn) {
        return Err(ProviderError::InvalidRequest(format!(
            "{ROLE_ARN} {role_arn:?} of aws account {account:?} is not an IAM role ARN (arn:aws:iam::<12 digits>:role/<name>)"
        )));
    }
    let session_name = session_name(config)?;
    let role_arn = role_arn.to_string();
    if let Some(token_file) = token_file {
        if has_keys {
            return Err(ProviderError::Auth(format!(
                "aws account {account:?} has both static keys and a web identity for role {role_arn}: use one"
            )));
        }
        if value(config, EXTERNAL_ID).is_some() {
            return Err(ProviderError::InvalidRequest(format!(
                "aws account {account:?}: {EXTERNAL_ID} applies to AssumeRole with keys, not to web identity (role {role_arn})"
            )));
        }
        return Ok(Source::WebIdentity { role_arn, token_file: PathBuf::from(token_file), session_name });
    }
    if value(config, ACCESS_KEY_ID).is_none() || value(config, SECRET_ACCESS_KEY).is_none() {
        return Err(ProviderError::Auth(format!(
            "the credentials of aws account {account:?} name role {role_arn} but hold no {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY} to assume it with (assuming it with the controller's own web identity needs the controller's opt-in: aws_web_identity in its config)"
        )));
    }
    let external_id = value(config, EXTERNAL_ID).map(str::to_string);
    if let Some(id) = &external_id
        && (id.len() < 2 || id.len() > 1224 || !id.chars().all(|c| c.is_ascii_alphanumeric() || "_+=,.@:/-".contains(c)))
    {
        return Err(ProviderError::InvalidRequest(format!(
            "{EXTERNAL_ID} of aws account {account:?} must be 2 to 1224 characters of letters, digits and _+=,.@:/-"
        )));
    }
    Ok(Source::AssumeRole { role_arn, external_id, session_name })
}

/// Whether a credential expiring at `expires` may still be handed out at `now` without a
/// refresh (more than `margin` left).
pub fn fresh(expires: SystemTime, now: SystemTime, margin: Duration) -> bool {
    expires.duration_since(now).is_ok_and(|left| left > margin)
}

/// Whether a credential expiring at `expires` may be handed out at all at `now` (when a
/// refresh failed): more than [`MIN_VALIDITY`] left.
pub fn usable(expires: SystemTime, now: SystemTime) -> bool {
    fresh(expires, now, MIN_VALIDITY)
}

struct Temporary {
    identity: Identity,
    access_key_id: String,
    expires: SystemTime,
}

/// The signing credentials of one aws account (see the module documentation).
pub struct AwsCredentials {
    account: String,
    source: Source,
    /// The static keys (Static and AssumeRole).
    keys: Option<Identity>,
    static_key_id: String,
    sts_endpoint: String,
    /// Whose budget STS answers are charged to (the tenant's when its endpoint is the account's).
    answers: crate::ratelimit::AnswerSource,
    region: String,
    http: reqwest::Client,
    margin: Duration,
    session_seconds: u32,
    current: tokio::sync::Mutex<Option<Temporary>>,
    /// Every secret value seen, for redaction (static ones first, then recent temporary sets).
    secrets: Mutex<Vec<String>>,
    static_secrets: usize,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("account", &self.account)
            .field("source", &self.source)
            .field("sts_endpoint", &self.sts_endpoint)
            .field("values", &"[redacted]")
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn url_checked(endpoint: &str, what: &str) -> ProviderResult<String> {
    let url = reqwest::Url::parse(endpoint)
        .map_err(|e| ProviderError::InvalidRequest(format!("{what} endpoint {endpoint:?} is not a URL: {e}")))?;
    if url.host_str().is_none() || !matches!(url.scheme(), "http" | "https") {
        return Err(ProviderError::InvalidRequest(format!("{what} endpoint {endpoint:?} needs http(s) and a host")));
    }
    Ok(url.to_string())
}

impl AwsCredentials {
    /// The credentials of `config`'s account in `region`. AssumeRole calls STS at the
    /// account's endpoint override when set (an emulator serving EC2 and STS on one port),
    /// else at the region's STS; web identity only at [`STS_ENDPOINT`] (set by the
    /// controller) or the region's STS, never at the account's endpoint.
    pub fn new(config: &ProviderConfig, region: &str) -> ProviderResult<Self> {
        let source = source(config)?;
        let missing = |key: &str| ProviderError::Auth(format!("the credentials of aws account {:?} hold no {key}", config.name));
        let mut secrets = Vec::new();
        let (keys, static_key_id) = match &source {
            Source::WebIdentity { .. } => (None, String::new()),
            Source::Static | Source::AssumeRole { .. } => {
                let access_key = value(config, ACCESS_KEY_ID).ok_or_else(|| missing(ACCESS_KEY_ID))?;
                let secret_key = value(config, SECRET_ACCESS_KEY).ok_or_else(|| missing(SECRET_ACCESS_KEY))?;
                let session_token = value(config, SESSION_TOKEN);
                secrets.extend([access_key.to_string(), secret_key.to_string()]);
                secrets.extend(session_token.map(str::to_string));
                let identity: Identity = aws_credential_types::Credentials::new(
                    access_key,
                    secret_key,
                    session_token.map(str::to_string),
                    None,
                    "provisioning-workspace-secret",
                )
                .into();
                (Some(identity), access_key.to_string())
            }
        };
        if let Source::AssumeRole { external_id: Some(id), .. } = &source {
            secrets.push(id.clone());
        }
        // The region is placed into a host name: only a region's shape (no '/', '@', '.').
        let regional = super::region::regional_endpoint("sts", &config.name, region)?;
        let (sts_endpoint, answers) = match &source {
            Source::WebIdentity { .. } => {
                (value(config, STS_ENDPOINT).map_or(regional, str::to_string), crate::ratelimit::AnswerSource::Public)
            }
            _ if config.endpoint.is_empty() => (regional, crate::ratelimit::AnswerSource::Public),
            _ => (config.endpoint.clone(), crate::ratelimit::AnswerSource::of(config)),
        };
        let sts_endpoint = url_checked(&sts_endpoint, "aws STS")?;
        let http = reqwest::Client::builder()
            // A redirect would take a request (and what it carries) to a host no one checked.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ProviderError::Permanent(format!("cannot build the HTTP client: {e}")))?;
        let static_secrets = secrets.len();
        Ok(AwsCredentials {
            account: config.name.clone(),
            source,
            keys,
            static_key_id,
            sts_endpoint,
            answers,
            region: region.to_string(),
            http,
            margin: REFRESH_MARGIN,
            session_seconds: SESSION_SECONDS,
            current: tokio::sync::Mutex::new(None),
            secrets: Mutex::new(secrets),
            static_secrets,
        })
    }

    /// Refreshes `margin` before expiry instead of [`REFRESH_MARGIN`] (tests: a margin longer
    /// than the session refreshes at every call).
    pub fn with_refresh_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// Asks STS for sessions of `seconds` (900 to the role's maximum).
    pub fn with_session_seconds(mut self, seconds: u32) -> Self {
        self.session_seconds = seconds;
        self
    }

    /// Where the credentials come from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The STS endpoint called (normalised URL).
    pub fn sts_endpoint(&self) -> &str {
        &self.sts_endpoint
    }

    /// Who the account's calls are metered as: the role's ARN, else the static access key id.
    pub fn principal(&self) -> String {
        self.source.role_arn().map_or_else(|| self.static_key_id.clone(), str::to_string)
    }

    /// The credentials to sign with now, fetched or refreshed first when needed.
    pub async fn identity(&self) -> ProviderResult<Identity> {
        Ok(self.current_temporary().await?.0)
    }

    /// The access key id signing calls now (tests compare it; it is redacted from errors like
    /// every key, and never logged).
    pub async fn access_key_id(&self) -> ProviderResult<String> {
        Ok(self.current_temporary().await?.1)
    }

    async fn current_temporary(&self) -> ProviderResult<(Identity, String)> {
        if let Some(keys) = &self.keys
            && self.source == Source::Static
        {
            return Ok((keys.clone(), self.static_key_id.clone()));
        }
        // Held across the STS call: one refresh in flight, the others wait for its result.
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some(t) = current.as_ref().filter(|t| fresh(t.expires, now, self.margin)) {
            return Ok((t.identity.clone(), t.access_key_id.clone()));
        }
        match self.fetch().await {
            Ok(t) => {
                let out = (t.identity.clone(), t.access_key_id.clone());
                *current = Some(t);
                Ok(out)
            }
            // A failed refresh keeps a credential that is still valid for a while.
            Err(e) => match current.as_ref().filter(|t| usable(t.expires, SystemTime::now())) {
                Some(t) => {
                    tracing::warn!(account = %self.account, error = %e, "refreshing the account's temporary AWS credentials failed; using the current ones until they near expiry");
                    Ok((t.identity.clone(), t.access_key_id.clone()))
                }
                None => {
                    *current = None;
                    Err(e)
                }
            },
        }
    }

    /// The credentials to sign with, when known without a call (static keys, or temporary
    /// ones fetched before and still fresh).
    pub fn cached_identity(&self) -> Option<Identity> {
        if self.source == Source::Static {
            return self.keys.clone();
        }
        let current = self.current.try_lock().ok()?;
        current.as_ref().filter(|t| fresh(t.expires, SystemTime::now(), self.margin)).map(|t| t.identity.clone())
    }

    /// `text` with every secret value this account has seen replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let secrets = lock(&self.secrets);
        let refs: Vec<&str> = secrets.iter().map(String::as_str).collect();
        redact(text, &refs)
    }

    /// `error` with its message redacted ([`AwsCredentials::redact`]).
    pub fn redact_error(&self, error: ProviderError) -> ProviderError {
        let clean = |m: &String| self.redact(m);
        match error {
            ProviderError::Transient(m) => ProviderError::Transient(clean(&m)),
            ProviderError::NotFound(m) => ProviderError::NotFound(clean(&m)),
            ProviderError::Auth(m) => ProviderError::Auth(clean(&m)),
            ProviderError::InvalidRequest(m) => ProviderError::InvalidRequest(clean(&m)),
            ProviderError::NotOwned(m) => ProviderError::NotOwned(clean(&m)),
            ProviderError::Permanent(m) => ProviderError::Permanent(clean(&m)),
            ProviderError::Capacity(mut c) => {
                c.asked = clean(&c.asked);
                c.message = clean(&c.message);
                ProviderError::Capacity(c)
            }
            throttled @ ProviderError::Throttled { .. } => throttled,
        }
    }

    fn remember(&self, values: impl IntoIterator<Item = String>) {
        let mut secrets = lock(&self.secrets);
        secrets.extend(values.into_iter().filter(|v| !v.is_empty()));
        // Static values stay; of the temporary ones, the newest sets (3 values each, plus a
        // token per web identity refresh).
        let keep = self.static_secrets + REMEMBERED_SETS * 4;
        if secrets.len() > keep {
            let excess = secrets.len() - keep;
            secrets.drain(self.static_secrets..self.static_secrets + excess);
        }
    }

    async fn fetch(&self) -> ProviderResult<Temporary> {
        let (action, role_arn, mut form) = match &self.source {
            Source::Static => return Err(ProviderError::Permanent("static credentials are not fetched".into())),
            Source::AssumeRole { role_arn, external_id, session_name } => {
                let mut form = vec![("RoleArn", role_arn.clone()), ("RoleSessionName", session_name.clone())];
                form.extend(external_id.as_ref().map(|id| ("ExternalId", id.clone())));
                ("AssumeRole", role_arn, form)
            }
            Source::WebIdentity { role_arn, token_file, session_name } => {
                let token = self.read_token(token_file, role_arn).await?;
                self.remember([token.clone()]);
                let form = vec![("RoleArn", role_arn.clone()), ("RoleSessionName", session_name.clone()), ("WebIdentityToken", token)];
                ("AssumeRoleWithWebIdentity", role_arn, form)
            }
        };
        form.push(("DurationSeconds", self.session_seconds.to_string()));
        let result = self.call_sts(action, role_arn, &form).await;
        result.map_err(|e| self.redact_error(e))
    }

    async fn read_token(&self, path: &std::path::Path, role_arn: &str) -> ProviderResult<String> {
        let unreadable = |why: String| {
            ProviderError::Auth(format!(
                "aws account {:?}: cannot read the web identity token file {} to assume role {role_arn}: {why}",
                self.account,
                path.display()
            ))
        };
        let meta = tokio::fs::metadata(path).await.map_err(|e| unreadable(e.to_string()))?;
        if meta.len() > MAX_TOKEN_BYTES {
            return Err(unreadable(format!("it holds {} bytes, more than a token's {MAX_TOKEN_BYTES}", meta.len())));
        }
        let text = tokio::fs::read_to_string(path).await.map_err(|e| unreadable(e.to_string()))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(unreadable("it is empty".into()));
        }
        Ok(token.to_string())
    }

    async fn call_sts(&self, action: &str, role_arn: &str, form: &[(&str, String)]) -> ProviderResult<Temporary> {
        let body = {
            let mut serializer = form_urlencoded::Serializer::new(String::new());
            serializer.append_pair("Action", action).append_pair("Version", STS_API_VERSION);
            for (k, v) in form {
                serializer.append_pair(k, v);
            }
            serializer.finish()
        };
        let mut request = self.http.post(&self.sts_endpoint).header("content-type", CONTENT_TYPE);
        // AssumeRoleWithWebIdentity is unsigned: the token is the proof.
        if let Some(keys) = self.keys.as_ref().filter(|_| action == "AssumeRole") {
            for (k, v) in sign_query(keys, &self.region, "sts", &self.sts_endpoint, &body)? {
                request = request.header(k, v);
            }
        }
        let what = format!("STS {action} of role {role_arn}");
        let response = request.body(body).send().await.map_err(|e| transport_error(&what, &e))?;
        let status = response.status().as_u16();
        let retry_after = response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
        // An STS answer is a few KiB; the endpoint may be a tenant's.
        let text = crate::ratelimit::text_capped(response, 1 << 20, &what, &self.answers).await?;
        if !(200..300).contains(&status) {
            return Err(classify_sts_error(
                &self.account,
                action,
                role_arn,
                status,
                retry_after.as_deref(),
                crate::ratelimit::error_text(&text),
            ));
        }
        let parsed: StsResponse =
            crate::aws::model::parse(&text).map_err(|e| ProviderError::Transient(format!("{what}: unreadable response: {e}")))?;
        let c = parsed.result.credentials;
        // Kept and sent with every call: only values of credentials' shape are.
        let sane = crate::ratelimit::well_formed(&c.access_key_id, 128, |ch| ch.is_ascii_alphanumeric())
            && crate::ratelimit::well_formed(&c.secret_access_key, 256, |ch| ch.is_ascii_graphic())
            && crate::ratelimit::well_formed(&c.session_token, 16 << 10, |ch| ch.is_ascii_graphic());
        if !sane {
            return Err(ProviderError::Auth(format!(
                "aws account {:?}: {what} returned credentials that are not well formed",
                self.account
            )));
        }
        let expires = chrono::DateTime::parse_from_rfc3339(c.expiration.trim())
            .map_err(|e| ProviderError::Transient(format!("{what}: unreadable Expiration {:?}: {e}", c.expiration)))?;
        let expires = SystemTime::from(expires.with_timezone(&chrono::Utc));
        self.remember([c.access_key_id.clone(), c.secret_access_key.clone(), c.session_token.clone()]);
        if !usable(expires, SystemTime::now()) {
            return Err(ProviderError::Auth(format!(
                "aws account {:?}: STS {action} of role {role_arn} returned credentials that expire within {MIN_VALIDITY:?}",
                self.account
            )));
        }
        tracing::info!(account = %self.account, role = %role_arn, action, "assumed role: temporary credentials until their expiry");
        let identity: Identity = aws_credential_types::Credentials::new(
            c.access_key_id.clone(),
            c.secret_access_key,
            Some(c.session_token),
            Some(expires),
            "provisioning-sts",
        )
        .into();
        Ok(Temporary { identity, access_key_id: c.access_key_id, expires })
    }
}

/// The SigV4 headers of a form-encoded POST of the Query API (`service`: ec2, sts, iam…).
pub fn sign_query(identity: &Identity, region: &str, service: &str, endpoint: &str, body: &str) -> ProviderResult<Vec<(String, String)>> {
    let failed = |e: &dyn fmt::Display| ProviderError::Permanent(format!("cannot sign a {service} request: {e}"));
    let base_headers = [("content-type", CONTENT_TYPE)];
    let signable =
        SignableRequest::new("POST", endpoint, base_headers.into_iter(), SignableBody::Bytes(body.as_bytes())).map_err(|e| failed(&e))?;
    let params = v4::SigningParams::builder()
        .identity(identity)
        .region(region)
        .name(service)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| failed(&e))?
        .into();
    let (instructions, _signature) = sign(signable, &params).map_err(|e| failed(&e))?.into_parts();
    Ok(instructions.headers().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// Classifies an STS error response: throttling and 5xx are retried; everything else means
/// the role cannot be assumed with these credentials (an Auth error naming the role).
pub fn classify_sts_error(
    account: &str,
    action: &str,
    role_arn: &str,
    status: u16,
    retry_after: Option<&str>,
    body: &str,
) -> ProviderError {
    let detail = crate::aws::model::parse::<StsErrorResponse>(body).ok().map(|e| e.error);
    let (code, message) = detail.as_ref().map_or(("", ""), |d| (d.code.as_str(), d.message.as_str()));
    let what = if code.is_empty() { format!("HTTP {status}") } else { format!("{code}: {message}") };
    if matches!(code, "Throttling" | "ThrottlingException" | "RequestLimitExceeded") || status == 429 {
        return ProviderError::Throttled {
            retry_after: retry_after.and_then(crate::ratelimit::parse_retry_after).unwrap_or(Duration::from_secs(1)),
        };
    }
    if status >= 500 || matches!(code, "IDPCommunicationError" | "ServiceUnavailable" | "InternalFailure") {
        return ProviderError::Transient(format!("aws account {account:?}: STS {action} of role {role_arn}: {what}"));
    }
    ProviderError::Auth(format!("aws account {account:?}: cannot assume role {role_arn} (STS {action}): {what}"))
}

/// `AssumeRoleResponse` / `AssumeRoleWithWebIdentityResponse` (what is read of them).
#[derive(Deserialize)]
struct StsResponse {
    #[serde(rename = "AssumeRoleResult", alias = "AssumeRoleWithWebIdentityResult")]
    result: StsResult,
}

#[derive(Deserialize)]
struct StsResult {
    #[serde(rename = "Credentials")]
    credentials: StsCredentials,
}

#[derive(Deserialize)]
struct StsCredentials {
    #[serde(rename = "AccessKeyId")]
    access_key_id: String,
    #[serde(rename = "SecretAccessKey")]
    secret_access_key: String,
    #[serde(rename = "SessionToken")]
    session_token: String,
    #[serde(rename = "Expiration")]
    expiration: String,
}

/// STS's `<ErrorResponse><Error><Code/><Message/></Error></ErrorResponse>`.
#[derive(Debug, Deserialize)]
pub struct StsErrorResponse {
    /// The error.
    #[serde(rename = "Error")]
    pub error: StsErrorDetail,
}

/// One STS error.
#[derive(Debug, Deserialize)]
pub struct StsErrorDetail {
    /// e.g. AccessDenied.
    #[serde(rename = "Code", default)]
    pub code: String,
    /// Human-readable message.
    #[serde(rename = "Message", default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Credentials;

    fn config(pairs: &[(&str, &str)]) -> ProviderConfig {
        ProviderConfig {
            name: "acct".into(),
            credentials: Credentials(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    const ROLE: &str = "arn:aws:iam::123456789012:role/provisioning";
    const KEYS: [(&str, &str); 2] = [(ACCESS_KEY_ID, "AKIDEXAMPLEKEY1"), (SECRET_ACCESS_KEY, "wJalrXUtnFEMIEXAMPLESECRET")];

    #[test]
    fn sources_follow_the_secret_keys() -> Result<(), String> {
        assert_eq!(source(&config(&KEYS)).map_err(|e| e.to_string())?, Source::Static);
        let assume = config(&[KEYS[0], KEYS[1], (ROLE_ARN, ROLE), (EXTERNAL_ID, "ext-1")]);
        let expected =
            Source::AssumeRole { role_arn: ROLE.into(), external_id: Some("ext-1".into()), session_name: "provisioning-acct".into() };
        assert_eq!(source(&assume).map_err(|e| e.to_string())?, expected);
        let web = config(&[(ROLE_ARN, ROLE), (WEB_IDENTITY_TOKEN_FILE, "/var/run/token")]);
        assert!(matches!(source(&web).map_err(|e| e.to_string())?, Source::WebIdentity { .. }));
        // A role without keys (and no web identity from the controller) is an Auth error
        // naming the role and the controller's opt-in.
        let e = source(&config(&[(ROLE_ARN, ROLE)])).err().ok_or("role without keys accepted")?;
        assert!(matches!(&e, ProviderError::Auth(m) if m.contains(ROLE) && m.contains("aws_web_identity")), "{e:?}");
        for bad in ["arn:aws:iam::12345:role/x", "arn:aws:iam::123456789012:user/x", "role/x", "arn:aws:iam::123456789012:role/"] {
            let e = source(&config(&[KEYS[0], KEYS[1], (ROLE_ARN, bad)])).err().ok_or(format!("{bad} accepted"))?;
            assert!(matches!(&e, ProviderError::InvalidRequest(m) if m.contains(ROLE_ARN)), "{e:?}");
        }
        let both = config(&[KEYS[0], KEYS[1], (ROLE_ARN, ROLE), (WEB_IDENTITY_TOKEN_FILE, "/t")]);
        assert!(source(&both).is_err());
        let bad_session = config(&[KEYS[0], KEYS[1], (ROLE_ARN, ROLE), (ROLE_SESSION_NAME, "has space")]);
        assert!(source(&bad_session).is_err());
        Ok(())
    }

    #[test]
    fn refresh_happens_before_expiry_and_nothing_expired_is_handed_out() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| now + Duration::from_secs(s);
        assert!(fresh(at(3600), now, REFRESH_MARGIN));
        assert!(!fresh(at(299), now, REFRESH_MARGIN), "refreshed 5 minutes before Expiration");
        assert!(!fresh(now - Duration::from_secs(1), now, REFRESH_MARGIN));
        assert!(usable(at(120), now) && !usable(at(59), now) && !usable(now, now));
    }

    #[test]
    fn web_identity_never_goes_to_the_account_endpoint() -> Result<(), String> {
        let mut web = config(&[(ROLE_ARN, ROLE), (WEB_IDENTITY_TOKEN_FILE, "/var/run/token")]);
        web.endpoint = "https://tenant.example.test/".into();
        let c = AwsCredentials::new(&web, "eu-north-1").map_err(|e| e.to_string())?;
        assert_eq!(c.sts_endpoint(), "https://sts.eu-north-1.amazonaws.com/");
        // A region is placed into the host name: one that would move the host is refused
        // (https://sts.x@attacker.example/.amazonaws.com/ is a request to attacker.example).
        for region in ["x@attacker.example/", "x.attacker.example/", "a@attacker.example:8443/x?"] {
            let refused = AwsCredentials::new(&web, region).err().ok_or(format!("region {region:?} was accepted"))?;
            assert!(refused.to_string().contains("is not an AWS region"), "{refused}");
        }
        web.credentials.0.insert(STS_ENDPOINT.into(), "http://127.0.0.1:5000/".into());
        let c = AwsCredentials::new(&web, "eu-north-1").map_err(|e| e.to_string())?;
        assert_eq!(c.sts_endpoint(), "http://127.0.0.1:5000/");
        // AssumeRole with the tenant's own keys uses the account's endpoint (an emulator).
        let mut assume = config(&[KEYS[0], KEYS[1], (ROLE_ARN, ROLE)]);
        assume.endpoint = "http://127.0.0.1:5001/".into();
        let c = AwsCredentials::new(&assume, "eu-north-1").map_err(|e| e.to_string())?;
        assert_eq!(c.sts_endpoint(), "http://127.0.0.1:5001/");
        assert_eq!(c.principal(), ROLE);
        let debug = format!("{c:?}");
        assert!(!debug.contains("AKIDEXAMPLEKEY1") && !debug.contains("EXAMPLESECRET"), "{debug}");
        Ok(())
    }

    #[test]
    fn sts_errors_name_the_role_and_never_a_secret() {
        let body = "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>not authorized</Message></Error><RequestId>r</RequestId></ErrorResponse>";
        let e = classify_sts_error("acct", "AssumeRole", ROLE, 403, None, body);
        assert!(matches!(&e, ProviderError::Auth(m) if m.contains(ROLE) && m.contains("AccessDenied")), "{e:?}");
        assert!(matches!(
            classify_sts_error(
                "a",
                "AssumeRole",
                ROLE,
                400,
                None,
                "<ErrorResponse><Error><Code>Throttling</Code><Message>m</Message></Error></ErrorResponse>"
            ),
            ProviderError::Throttled { .. }
        ));
        assert!(matches!(classify_sts_error("a", "AssumeRole", ROLE, 503, None, "down"), ProviderError::Transient(_)));
    }
}
