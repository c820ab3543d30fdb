//! The EC2 Query API transport: form-encoded POST, signed with SigV4 (`aws-sigv4`), errors
//! classified for retry. One call, one attempt: retrying is the caller's decision, because
//! RunInstances must not be repeated blindly (emulators ignore ClientToken).

use std::fmt;
use std::time::Duration;

use aws_smithy_runtime_api::client::identity::Identity;

use super::credentials::{AwsCredentials, sign_query};
use super::model::{self, ErrorResponse};
use crate::ratelimit::{classify_status, transport_error};
use crate::{ProviderConfig, ProviderError, ProviderResult};

/// The EC2 API version spoken.
pub const API_VERSION: &str = "2016-11-15";
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// Error codes meaning "these credentials cannot do this" (Permanent until they change).
const AUTH_CODES: &[&str] = &[
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "ExpiredToken",
    "RequestExpired",
    "OptInRequired",
    "Blocked",
    "PendingVerification",
    "AccessDenied",
    "AccessDeniedException",
];
const THROTTLE_CODES: &[&str] = &["RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"];
const TRANSIENT_CODES: &[&str] = &["InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"];
/// Error codes meaning "not now": an account quota is used up ("Error codes for the Amazon
/// EC2 API", <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html>).
/// Retrying at once cannot help; a slow retry may (machines go, the quota is raised).
const QUOTA_CODES: &[&str] = &[
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "ResourceLimitExceeded",
    "SecurityGroupLimitExceeded",
    "VolumeLimitExceeded",
    "AddressLimitExceeded",
];
/// Error codes meaning "not here, not now": the zone (or its hosts, or the subnet's address
/// pool) has no capacity for what was asked (same page: "wait a few minutes, or request
/// another instance type or Availability Zone").
const CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientReservedInstanceCapacity",
    "UnfulfillableCapacity",
    "InsufficientFreeAddressesInSubnet",
];

/// A signed, serialised EC2 request, ready to send.
pub struct PreparedRequest {
    /// Form body.
    pub body: String,
    /// Headers to send (content type and the SigV4 headers).
    pub headers: Vec<(String, String)>,
}

impl fmt::Debug for PreparedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The Authorization header carries the access key id and a session token may follow.
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("PreparedRequest").field("body", &self.body).field("headers", &names).finish()
    }
}

/// An EC2 endpoint with the account's credentials.
pub struct Ec2Client {
    account: String,
    endpoint: String,
    region: String,
    credentials: AwsCredentials,
    http: reqwest::Client,
    /// Whose budget its answers are charged to.
    source: crate::ratelimit::AnswerSource,
}

impl fmt::Debug for Ec2Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ec2Client")
            .field("account", &self.account)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl Ec2Client {
    /// Builds the client; credentials come from `config.credentials` (static keys, or a role
    /// assumed with them or with a web identity: [`AwsCredentials`]).
    pub fn new(config: &ProviderConfig, region: &str) -> ProviderResult<Self> {
        let endpoint = if config.endpoint.is_empty() {
            super::region::regional_endpoint("ec2", &config.name, region)?
        } else {
            config.endpoint.clone()
        };
        let url = reqwest::Url::parse(&endpoint)
            .map_err(|e| ProviderError::InvalidRequest(format!("aws endpoint {endpoint:?} is not a URL: {e}")))?;
        if url.host_str().is_none() || !matches!(url.scheme(), "http" | "https") {
            return Err(ProviderError::InvalidRequest(format!("aws endpoint {endpoint:?} needs http(s) and a host")));
        }
        let credentials = AwsCredentials::new(config, region)?;
        let http = reqwest::Client::builder()
            // A redirect would take a request (and what it carries) to a host no one checked.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ProviderError::Permanent(format!("cannot build the HTTP client: {e}")))?;
        Ok(Ec2Client {
            account: config.name.clone(),
            endpoint: url.to_string(),
            region: region.to_string(),
            credentials,
            http,
            source: crate::ratelimit::AnswerSource::of(config),
        })
    }

    /// The endpoint called (normalised URL).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The account's credentials.
    pub fn credentials(&self) -> &AwsCredentials {
        &self.credentials
    }

    /// Serialises and signs one call with the credentials known without a call (static keys,
    /// or temporary ones already fetched and fresh).
    pub fn prepare(&self, action: &str, params: &[(String, String)]) -> ProviderResult<PreparedRequest> {
        let identity = self
            .credentials
            .cached_identity()
            .ok_or_else(|| ProviderError::Transient(format!("EC2 {action}: the account's temporary credentials are not fetched yet")))?;
        self.prepare_with(&identity, action, params)
    }

    fn prepare_with(&self, identity: &Identity, action: &str, params: &[(String, String)]) -> ProviderResult<PreparedRequest> {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", action).append_pair("Version", API_VERSION);
        for (k, v) in params {
            form.append_pair(k, v);
        }
        let body = form.finish();
        let signed = sign_query(identity, &self.region, "ec2", &self.endpoint, &body)
            .map_err(|e| ProviderError::Permanent(format!("cannot sign {action}: {e}")))?;
        let mut headers = vec![("content-type".to_string(), CONTENT_TYPE.to_string())];
        headers.extend(signed);
        Ok(PreparedRequest { body, headers })
    }

    /// Sends one call and returns the response document, or the classified error (an answer
    /// over [`crate::ratelimit::MAX_ANSWER`] is refused).
    pub async fn call(&self, action: &str, params: &[(String, String)]) -> ProviderResult<String> {
        self.call_capped(action, params, crate::ratelimit::MAX_ANSWER).await
    }

    /// [`Self::call`], reading at most `cap` bytes of the answer.
    pub async fn call_capped(&self, action: &str, params: &[(String, String)], cap: usize) -> ProviderResult<String> {
        let identity = self.credentials.identity().await?;
        let prepared = self.prepare_with(&identity, action, params)?;
        let mut request = self.http.post(&self.endpoint).body(prepared.body);
        for (k, v) in &prepared.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let response = request.send().await.map_err(|e| self.redact_error(transport_error(&format!("EC2 {action}"), &e)))?;
        let status = response.status().as_u16();
        let retry_after = response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
        let text =
            crate::ratelimit::text_capped(response, cap, &format!("EC2 {action}"), &self.source).await.map_err(|e| self.redact_error(e))?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(self.redact_error(classify_error(action, status, retry_after.as_deref(), crate::ratelimit::error_text(&text))))
    }

    /// Parses a successful response document.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, action: &str, xml: &str) -> ProviderResult<T> {
        // A truncated document is what a dropped connection looks like mid-body.
        model::parse(xml).map_err(|e| ProviderError::Transient(format!("EC2 {action}: unreadable response: {e}")))
    }

    fn redact_error(&self, error: ProviderError) -> ProviderError {
        self.credentials.redact_error(error)
    }
}

/// Whether `error` is the EC2 error response with error code `code` (as [`classify_error`]
/// words it: `EC2 <action>: <code>: <message>`).
pub fn is_code(error: &ProviderError, code: &str) -> bool {
    let ProviderError::InvalidRequest(text) = error else { return false };
    text.starts_with("EC2 ") && text.split(": ").nth(1) == Some(code)
}

/// Classifies an EC2 error response by HTTP status and error code.
pub fn classify_error(action: &str, status: u16, retry_after: Option<&str>, body: &str) -> ProviderError {
    let detail = model::parse::<ErrorResponse>(body).ok().and_then(|e| e.errors.errors.into_iter().next());
    let (code, message) = match &detail {
        Some(d) => (d.code.as_str(), d.message.as_str()),
        None => ("", ""),
    };
    let text = if code.is_empty() { format!("EC2 {action}: HTTP {status}") } else { format!("EC2 {action}: {code}: {message}") };
    if THROTTLE_CODES.contains(&code) {
        return ProviderError::Throttled {
            retry_after: retry_after.and_then(crate::ratelimit::parse_retry_after).unwrap_or(Duration::from_secs(1)),
        };
    }
    if AUTH_CODES.contains(&code) || status == 401 || status == 403 {
        return ProviderError::Auth(text);
    }
    if TRANSIENT_CODES.contains(&code) {
        return ProviderError::Transient(text);
    }
    let capacity = |kind| ProviderError::capacity(kind, code, format!("EC2 {action}: {message}"));
    if QUOTA_CODES.contains(&code) {
        return capacity(crate::CapacityKind::Quota);
    }
    if CAPACITY_CODES.contains(&code) {
        return capacity(crate::CapacityKind::Insufficient);
    }
    if let Some(error) = classify_status(status, retry_after, || text.clone()) {
        return error;
    }
    if code.starts_with("InvalidInstanceID.NotFound") || code == "InvalidInstanceID.Malformed" {
        return ProviderError::NotFound(text);
    }
    if (400..500).contains(&status) {
        return ProviderError::InvalidRequest(text);
    }
    ProviderError::Permanent(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Credentials;

    fn client() -> Ec2Client {
        let config = ProviderConfig {
            name: "acct".into(),
            credentials: Credentials(
                [
                    ("AWS_ACCESS_KEY_ID".to_string(), "AKIDEXAMPLEKEY1".to_string()),
                    ("AWS_SECRET_ACCESS_KEY".to_string(), "wJalrXUtnFEMIEXAMPLESECRET".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        Ec2Client::new(&config, "eu-north-1").expect("client")
    }

    #[test]
    fn requests_are_signed_and_debug_is_clean() {
        let c = client();
        let prepared = c.prepare("DescribeInstances", &[("InstanceId.1".into(), "i-1".into())]).expect("prepare");
        assert!(prepared.body.contains("Action=DescribeInstances") && prepared.body.contains("Version=2016-11-15"));
        let auth = prepared.headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone()).unwrap_or_default();
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLEKEY1/"), "{auth}");
        assert!(auth.contains("/eu-north-1/ec2/aws4_request"));
        let debug = format!("{c:?} {prepared:?}");
        assert!(!debug.contains("AKIDEXAMPLEKEY1") && !debug.contains("EXAMPLESECRET"), "{debug}");
    }

    #[test]
    fn errors_are_classified() {
        let doc = |code: &str| {
            format!("<Response><Errors><Error><Code>{code}</Code><Message>m</Message></Error></Errors><RequestID>r</RequestID></Response>")
        };
        assert!(matches!(classify_error("X", 401, None, &doc("AuthFailure")), ProviderError::Auth(_)));
        let duplicate = classify_error("CreateSecurityGroup", 400, None, &doc("InvalidGroup.Duplicate"));
        assert!(is_code(&duplicate, "InvalidGroup.Duplicate") && !is_code(&duplicate, "InvalidGroup"), "{duplicate:?}");
        assert!(matches!(classify_error("X", 403, None, &doc("UnauthorizedOperation")), ProviderError::Auth(_)));
        assert!(matches!(
            classify_error("X", 503, Some("2"), &doc("RequestLimitExceeded")),
            ProviderError::Throttled { retry_after } if retry_after == Duration::from_secs(2)
        ));
        assert!(matches!(classify_error("X", 500, None, &doc("InternalError")), ProviderError::Transient(_)));
        assert!(matches!(classify_error("X", 502, None, "<html>bad gateway</html>"), ProviderError::Transient(_)));
        assert!(matches!(classify_error("X", 400, None, &doc("InvalidInstanceID.NotFound")), ProviderError::NotFound(_)));
        assert!(matches!(classify_error("X", 400, None, &doc("InvalidAMIID.Malformed")), ProviderError::InvalidRequest(_)));
    }

    #[test]
    fn quota_and_capacity_errors_are_neither_invalid_nor_transient() {
        let doc = |code: &str| {
            format!("<Response><Errors><Error><Code>{code}</Code><Message>m</Message></Error></Errors><RequestID>r</RequestID></Response>")
        };
        for code in ["VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"] {
            let e = classify_error("RunInstances", 400, None, &doc(code));
            assert!(matches!(&e, ProviderError::Capacity(c) if c.kind == crate::CapacityKind::Quota && c.quota == code), "{code}: {e:?}");
            assert_eq!(e.category(), "QuotaExceeded");
        }
        // EC2 answers InsufficientInstanceCapacity with HTTP 500: still not a quick retry.
        for (code, status) in [("InsufficientInstanceCapacity", 500), ("InsufficientHostCapacity", 400), ("InsufficientCapacity", 400)] {
            let e = classify_error("RunInstances", status, None, &doc(code));
            assert!(
                matches!(&e, ProviderError::Capacity(c) if c.kind == crate::CapacityKind::Insufficient && c.quota == code),
                "{code}: {e:?}"
            );
            assert!(!e.is_retryable() && e.to_string().contains(code), "{e}");
        }
    }
}
