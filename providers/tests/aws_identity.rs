//! AWS identities against moto (STS and IAM on the EC2 port): AssumeRole with the account's
//! keys (and an external id), web identity with a token file read at each refresh, refresh
//! before expiry with one refresh in flight, STS errors as Auth errors naming the role and
//! no secret, and instance profiles given to RunInstances.
//!
//! The AssumeRole test runs moto with IAM authentication on (after the set-up calls): the
//! account's user may only call `sts:AssumeRole`, the role may call `ec2:*` and trusts the
//! user only with the right external id, and moto checks every signature, access key and
//! session token. EC2 calls succeed only when signed with the role's temporary credentials.

mod support;

use std::time::Duration;

use aws_smithy_runtime_api::client::identity::Identity;
use provisioning_providers::aws::AwsProvider;
use provisioning_providers::aws::credentials::{self, AwsCredentials};
use provisioning_providers::{Credentials, Provider, ProviderConfig, ProviderError, ServerIdentity, ServerRequest};
use support::moto::Moto;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Any AMI id from moto's default set (moto does not boot it).
const MOTO_AMI: &str = "ami-1e749f67";
/// moto's default account.
const ACCOUNT: &str = "123456789012";
const EXTERNAL_ID: &str = "ext-id-4242";

fn config(name: &str, endpoint: &str, pairs: &[(&str, &str)]) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        images: [("debian-12".to_string(), MOTO_AMI.to_string())].into(),
        rate_limit: 200,
        network: provisioning_providers::NetworkSettings { ssh_source_cidrs: vec!["203.0.113.7/32".into()], ..Default::default() },
        ..Default::default()
    }
}

fn request(uid: &str, instance_profile: &str) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "identity".into(), name: uid.into(), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: instance_profile.into(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    }
}

/// One signed Query API call (IAM set-up, probes); returns (status, body).
async fn query(
    endpoint: &str,
    service: &str,
    keys: (&str, &str),
    action: &str,
    params: &[(&str, &str)],
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let version = match service {
        "iam" => "2010-05-08",
        "sts" => credentials::STS_API_VERSION,
        _ => "2016-11-15",
    };
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", action).append_pair("Version", version);
    for (k, v) in params {
        form.append_pair(k, v);
    }
    let body = form.finish();
    let identity: Identity = aws_credential_types::Credentials::new(keys.0, keys.1, None, None, "test").into();
    let headers = credentials::sign_query(&identity, "us-east-1", service, endpoint, &body)?;
    let mut request = reqwest::Client::new().post(endpoint).header("content-type", "application/x-www-form-urlencoded; charset=utf-8");
    for (k, v) in headers {
        request = request.header(k, v);
    }
    let response = request.body(body).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// The text of the first `<tag>…</tag>` in `xml`.
fn element(xml: &str, tag: &str) -> Option<String> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(xml[start..end].to_string())
}

async fn iam(endpoint: &str, action: &str, params: &[(&str, &str)]) -> Result<String, Box<dyn std::error::Error>> {
    let (status, body) = query(endpoint, "iam", ("AKIAIDENTITYSETUP001", "setup-secret"), action, params).await?;
    if status != 200 {
        return Err(format!("IAM {action}: HTTP {status}: {body}").into());
    }
    Ok(body)
}

/// Number of IAM calls [`set_up_account`] makes (moto lets that many through unauthenticated).
const SET_UP_CALLS: usize = 6;

/// The tenant user (may only assume roles), its keys, the role it may assume with the external
/// id, and a role that does not trust it.
async fn set_up_account(endpoint: &str) -> Result<(String, String), Box<dyn std::error::Error>> {
    iam(endpoint, "CreateUser", &[("UserName", "tenant")]).await?;
    let keys = iam(endpoint, "CreateAccessKey", &[("UserName", "tenant")]).await?;
    let access_key = element(&keys, "AccessKeyId").ok_or("no AccessKeyId")?;
    let secret_key = element(&keys, "SecretAccessKey").ok_or("no SecretAccessKey")?;
    let assume_only = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"sts:AssumeRole","Resource":"*"}]}"#;
    iam(endpoint, "PutUserPolicy", &[("UserName", "tenant"), ("PolicyName", "assume-only"), ("PolicyDocument", assume_only)]).await?;
    let trust = format!(
        r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":{{"AWS":"arn:aws:iam::{ACCOUNT}:user/tenant"}},"Action":"sts:AssumeRole","Condition":{{"StringEquals":{{"sts:ExternalId":"{EXTERNAL_ID}"}}}}}}]}}"#
    );
    iam(endpoint, "CreateRole", &[("RoleName", "deployer"), ("AssumeRolePolicyDocument", &trust)]).await?;
    let ec2 = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ec2:*","Resource":"*"}]}"#;
    iam(endpoint, "PutRolePolicy", &[("RoleName", "deployer"), ("PolicyName", "ec2"), ("PolicyDocument", ec2)]).await?;
    let other = format!(
        r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":{{"AWS":"arn:aws:iam::{ACCOUNT}:user/someone-else"}},"Action":"sts:AssumeRole"}}]}}"#
    );
    iam(endpoint, "CreateRole", &[("RoleName", "untrusted"), ("AssumeRolePolicyDocument", &other)]).await?;
    // Authentication is on from here: unknown keys are refused (checked, not assumed).
    let (status, body) = query(endpoint, "ec2", ("AKIANOSUCHKEY0000001", "nope"), "DescribeRegions", &[]).await?;
    if status < 400 {
        return Err(format!("moto did not check credentials after the set-up: HTTP {status}: {body}").into());
    }
    Ok((access_key, secret_key))
}

fn assert_clean(text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "a secret value leaked into: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assume_role_signs_ec2_calls_with_the_roles_temporary_credentials() -> TestResult {
    let moto = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", &SET_UP_CALLS.to_string())]);
    let (access_key, secret_key) = set_up_account(&moto.endpoint).await?;
    let role = format!("arn:aws:iam::{ACCOUNT}:role/deployer");
    let keys = [("AWS_ACCESS_KEY_ID", access_key.as_str()), ("AWS_SECRET_ACCESS_KEY", secret_key.as_str())];

    // The keys alone may not call EC2 (the premise: only the role can).
    let alone = AwsProvider::new(&config("keys-only", &moto.endpoint, &keys))?;
    let refused = alone.validate_credentials().await.err().ok_or("the user's own keys were accepted by EC2")?;
    assert!(matches!(refused, ProviderError::Auth(_)), "{refused:?}");

    // With the role and its external id, EC2 calls are signed with the role's credentials.
    let with_role = [keys[0], keys[1], ("AWS_ROLE_ARN", role.as_str()), ("AWS_EXTERNAL_ID", EXTERNAL_ID)];
    let provider = AwsProvider::new(&config("assumed", &moto.endpoint, &with_role))?;
    provider.validate_credentials().await?;
    let created = provider.ensure_server(&request("identity-assume-1", "")).await?;
    let found = provider.find_server(&request("identity-assume-1", "").identity).await?;
    assert_eq!(found.map(|o| o.provider_id), Some(created.provider_id.clone()));
    let temporary = provider.client().credentials().access_key_id().await?;
    assert_ne!(temporary, access_key, "EC2 calls are not signed with the static keys");
    // The temporary key is redacted like the static ones.
    let redacted = provider.client().credentials().redact(&format!("key {temporary} and {secret_key}"));
    assert_clean(&redacted, &[&temporary, &secret_key]);
    assert_clean(&format!("{provider:?}"), &[&temporary, &access_key, &secret_key, EXTERNAL_ID]);
    provider.delete_server(&created.provider_id).await?;

    // A wrong external id, and a role that does not trust the user: Auth errors naming the
    // role, with no key, secret or external id in them.
    let wrong_id = [keys[0], keys[1], ("AWS_ROLE_ARN", role.as_str()), ("AWS_EXTERNAL_ID", "not-the-external-id")];
    let e = AwsProvider::new(&config("wrong-id", &moto.endpoint, &wrong_id))?
        .validate_credentials()
        .await
        .err()
        .ok_or("wrong external id accepted")?;
    assert!(matches!(&e, ProviderError::Auth(m) if m.contains(&role) && m.contains("cannot assume role")), "{e:?}");
    assert_clean(&format!("{e} {e:?}"), &[&access_key, &secret_key, "not-the-external-id"]);
    let untrusted = format!("arn:aws:iam::{ACCOUNT}:role/untrusted");
    let other = [keys[0], keys[1], ("AWS_ROLE_ARN", untrusted.as_str())];
    let e = AwsProvider::new(&config("untrusted", &moto.endpoint, &other))?
        .validate_credentials()
        .await
        .err()
        .ok_or("untrusted role assumed")?;
    assert!(matches!(&e, ProviderError::Auth(m) if m.contains(&untrusted)), "{e:?}");
    assert_clean(&format!("{e} {e:?}"), &[&access_key, &secret_key]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_credentials_are_refreshed_before_expiry_one_refresh_at_a_time() -> TestResult {
    let moto = Moto::start();
    let role = format!("arn:aws:iam::{ACCOUNT}:role/refreshed");
    let pairs =
        [("AWS_ACCESS_KEY_ID", "AKIAREFRESHTEST00001"), ("AWS_SECRET_ACCESS_KEY", "refresh-secret"), ("AWS_ROLE_ARN", role.as_str())];
    let cfg = config("refresh", &moto.endpoint, &pairs);

    // Fresh credentials (a 15-minute session, refreshed 5 minutes before expiry): many
    // callers at once from a cold start share one STS call, then the cached credentials.
    let shared = std::sync::Arc::new(AwsCredentials::new(&cfg, "eu-north-1")?.with_session_seconds(900));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let c = shared.clone();
            tokio::spawn(async move { c.access_key_id().await })
        })
        .collect();
    let mut keys = Vec::new();
    for call in calls {
        keys.push(call.await??);
    }
    keys.dedup();
    assert_eq!(keys.len(), 1, "one refresh in flight: every caller got the same credentials {keys:?}");
    assert_eq!(shared.access_key_id().await?, keys[0], "fresh credentials are reused");

    // Credentials within the refresh margin of their Expiration are never handed out again:
    // with a margin longer than the session, each use refreshes first.
    let near_expiry = AwsCredentials::new(&cfg, "eu-north-1")?.with_session_seconds(900).with_refresh_margin(Duration::from_secs(3600));
    let first = near_expiry.access_key_id().await?;
    let second = near_expiry.access_key_id().await?;
    assert_ne!(first, second, "credentials expiring within the margin were refreshed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_assumes_the_role_and_reads_the_token_file_at_each_refresh() -> TestResult {
    let moto = Moto::start();
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    const FIRST: &str = "eyJhbGciOiJSUzI1NiJ9.first-token-payload.signature";
    const ROTATED: &str = "eyJhbGciOiJSUzI1NiJ9.rotated-token-payload.signature";
    std::fs::write(&token_file, format!("{FIRST}\n"))?;
    let role = format!("arn:aws:iam::{ACCOUNT}:role/irsa");
    let path = token_file.display().to_string();
    // What the controller passes once its config granted the namespace this role.
    let pairs =
        [("AWS_ROLE_ARN", role.as_str()), ("AWS_WEB_IDENTITY_TOKEN_FILE", path.as_str()), ("AWS_STS_ENDPOINT", moto.endpoint.as_str())];
    let cfg = config("web", &moto.endpoint, &pairs);
    let provider = AwsProvider::new(&cfg)?;
    provider.validate_credentials().await?;
    let created = provider.ensure_server(&request("identity-web-1", "")).await?;
    provider.delete_server(&created.provider_id).await?;

    // Each refresh reads the file again: a rotated token is the one sent at the next refresh
    // (only a token read is known to the redaction, which covers every token sent).
    let creds = AwsCredentials::new(&cfg, "eu-north-1")?.with_refresh_margin(Duration::from_secs(7200));
    let first = creds.access_key_id().await?;
    assert_clean(&creds.redact(&format!("sent {FIRST}")), &[FIRST]);
    std::fs::write(&token_file, ROTATED)?;
    assert!(creds.redact(ROTATED).contains(ROTATED), "not read before the refresh");
    let second = creds.access_key_id().await?;
    assert_ne!(first, second);
    assert_clean(&creds.redact(&format!("sent {ROTATED}")), &[ROTATED]);
    // A failed refresh keeps the current credentials while they are valid; with none yet, an
    // unreadable token is an Auth error naming the file and role, not the old token.
    std::fs::write(&token_file, "")?;
    assert_eq!(creds.access_key_id().await?, second, "still valid: kept after a failed refresh");
    let cold = AwsCredentials::new(&cfg, "eu-north-1")?;
    let e = cold.access_key_id().await.err().ok_or("an empty token file was accepted")?;
    assert!(matches!(&e, ProviderError::Auth(m) if m.contains(&path) && m.contains(&role) && m.contains("empty")), "{e:?}");
    assert_clean(&format!("{e} {e:?} {cold:?}"), &["first-token-payload", "rotated-token-payload"]);
    std::fs::remove_file(&token_file)?;
    let e = AwsCredentials::new(&cfg, "eu-north-1")?.access_key_id().await.err().ok_or("a missing token file was accepted")?;
    assert!(matches!(&e, ProviderError::Auth(m) if m.contains(&path)), "{e:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_profiles_reach_run_instances_by_name_and_by_arn() -> TestResult {
    let moto = Moto::start();
    iam(&moto.endpoint, "CreateInstanceProfile", &[("InstanceProfileName", "eks-node")]).await?;
    let pairs = [("AWS_ACCESS_KEY_ID", "AKIAPROFILETEST00001"), ("AWS_SECRET_ACCESS_KEY", "profile-secret")];
    let provider = AwsProvider::new(&config("profiles", &moto.endpoint, &pairs))?;
    let arn = format!("arn:aws:iam::{ACCOUNT}:instance-profile/eks-node");
    for (uid, profile) in [("identity-profile-name", "eks-node"), ("identity-profile-arn", arn.as_str())] {
        let created = provider.ensure_server(&request(uid, profile)).await?;
        let id = created.provider_id.native_id().to_string();
        let params = [("Filter.1.Name".to_string(), "instance-id".to_string()), ("Filter.1.Value.1".to_string(), id.clone())];
        let xml = provider.client().call("DescribeIamInstanceProfileAssociations", &params).await?;
        assert!(xml.contains(&id) && xml.contains(&arn), "{uid}: the instance carries no instance profile {arn}: {xml}");
        provider.delete_server(&created.provider_id).await?;
    }
    // A profile that does not exist is EC2's (moto's) refusal, not a machine without one.
    let missing = provider.ensure_server(&request("identity-profile-missing", "no-such-profile")).await;
    assert!(missing.is_err(), "{missing:?}");
    assert!(provider.find_server(&request("identity-profile-missing", "").identity).await?.is_none());
    Ok(())
}
