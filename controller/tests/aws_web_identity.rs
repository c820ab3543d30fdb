//! The controller's web identity (IRSA / EKS Pod Identity token) through the controller and
//! the embedded API server, against a stub STS + EC2 endpoint (plain HTTP, allowed by the
//! test's controller config): a namespace the config grants the role assumes it with the
//! token; a namespace without a grant, and a Secret naming a token file itself, are refused
//! with a clear message and send nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use provisioning_controller::accounts::{AwsWebIdentity, WebIdentityGrant};
use provisioning_controller::testing::{TestEnv, wait_for};
use provisioning_crds::{ProviderAccountStatus, Workspace};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(60);
const ROLE: &str = "arn:aws:iam::123456789012:role/team-granted";
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.controller-sa-token-payload.sig";

fn answer(action: &str) -> (u16, String) {
    let expires = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    match action {
        "AssumeRoleWithWebIdentity" => (
            200,
            format!(
                "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIASTUBTEMPORARY001</AccessKeyId><SecretAccessKey>stub-temporary-secret</SecretAccessKey><SessionToken>stub-session-token-value</SessionToken><Expiration>{expires}</Expiration></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
            ),
        ),
        "DescribeRegions" => (
            200,
            "<DescribeRegionsResponse><regionInfo><item><regionName>eu-north-1</regionName></item></regionInfo></DescribeRegionsResponse>"
                .into(),
        ),
        other => (
            400,
            format!("<Response><Errors><Error><Code>UnsupportedOperation</Code><Message>not {other}</Message></Error></Errors></Response>"),
        ),
    }
}

/// A one-request-per-connection HTTP stub of STS and EC2; keeps every request (headers and body).
async fn stub() -> anyhow::Result<(String, Arc<Mutex<Vec<String>>>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}/", listener.local_addr()?);
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let requests = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (text, body) = loop {
                    let Ok(n) = stream.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
                    let length = head
                        .lines()
                        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").and_then(|v| v.trim().parse::<usize>().ok()))
                        .unwrap_or(0);
                    if body.len() >= length {
                        break (text.clone(), body.to_string());
                    }
                };
                let action = body.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or_default().to_string();
                if let Ok(mut r) = requests.lock() {
                    r.push(text);
                }
                let (status, xml) = answer(&action);
                let response = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{xml}",
                    xml.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok((endpoint, seen))
}

/// The status of the one account of Workspace `name` once it is ready or says `expected`
/// (it says "does not exist" until the test's Secret is created).
async fn account_status(env: &TestEnv, name: &str, expected: &str) -> anyhow::Result<ProviderAccountStatus> {
    let api = Api::<Workspace>::all(env.client.clone());
    wait_for(&format!("account of {name} checked"), DEADLINE, || {
        let api = api.clone();
        async move {
            let ws = api.get(name).await.ok()?;
            ws.status?.providers.into_iter().next().filter(|p| p.ready || p.message.contains(expected))
        }
    })
    .await
}

async fn workspace_with_secret(env: &TestEnv, name: &str, endpoint: &str, secret: serde_json::Value) -> anyhow::Result<()> {
    let ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
        "spec": {"providers": [{"name": name, "type": "aws", "region": "eu-north-1", "endpoint": endpoint,
                                "credentialsSecretRef": {"name": "aws-role"}, "sshSourceCidrs": ["203.0.113.7/32"]}],
                 "defaults": {"provider": name}}
    }))?;
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &ws).await?;
    wait_for(&format!("namespace {name}"), DEADLINE, || {
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone());
        async move { api.get_opt(name).await.ok().flatten().map(|_| ()) }
    })
    .await?;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-role", "namespace": name}, "stringData": secret
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), name).create(&PostParams::default(), &secret).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_is_used_only_for_a_granted_namespace_and_role() -> anyhow::Result<()> {
    let (endpoint, requests) = stub().await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN)?;
    let env = TestEnv::start().await?;
    let mut config = env.config();
    config.allow_insecure_endpoints = true;
    config.aws_web_identity = Some(AwsWebIdentity {
        token_file: token_file.clone(),
        endpoint: endpoint.clone(),
        grants: vec![WebIdentityGrant { namespace: "wi-granted".into(), role_arns: vec![ROLE.into()] }],
    });
    let controller = env.start_controller(config);

    // Not granted: the same role from another namespace.
    workspace_with_secret(&env, "wi-other", &endpoint, json!({"AWS_ROLE_ARN": ROLE})).await?;
    // A Secret naming the controller's token file itself.
    let path = token_file.display().to_string();
    workspace_with_secret(&env, "wi-sneaky", &endpoint, json!({"AWS_ROLE_ARN": ROLE, "AWS_WEB_IDENTITY_TOKEN_FILE": path})).await?;
    let other = account_status(&env, "wi-other", "may not assume").await?;
    assert!(!other.ready && other.message.contains("may not assume role") && other.message.contains(ROLE), "{}", other.message);
    assert!(other.message.contains("\"wi-other\""), "names the namespace: {}", other.message);
    let sneaky = account_status(&env, "wi-sneaky", "only the controller").await?;
    assert!(
        !sneaky.ready && sneaky.message.contains("AWS_WEB_IDENTITY_TOKEN_FILE") && sneaky.message.contains("only the controller"),
        "{}",
        sneaky.message
    );
    assert!(requests.lock().map(|r| r.is_empty()).unwrap_or(false), "a refused account sent a request");

    // Granted: the role is assumed with the token, and EC2 is signed with the role's keys.
    workspace_with_secret(&env, "wi-granted", &endpoint, json!({"AWS_ROLE_ARN": ROLE})).await?;
    let granted = account_status(&env, "wi-granted", "assume role").await?;
    assert!(granted.ready, "{}", granted.message);
    let seen = requests.lock().map(|r| r.clone()).unwrap_or_default();
    let assume: Vec<&String> = seen.iter().filter(|r| r.contains("Action=AssumeRoleWithWebIdentity")).collect();
    assert!(!assume.is_empty(), "no AssumeRoleWithWebIdentity: {seen:?}");
    for r in &assume {
        assert!(r.contains(&format!("WebIdentityToken={TOKEN}")) && r.contains("RoleSessionName=provisioning-wi-granted"), "{r}");
        assert!(!r.to_ascii_lowercase().contains("authorization:"), "AssumeRoleWithWebIdentity is unsigned: {r}");
    }
    let describe = seen.iter().find(|r| r.contains("Action=DescribeRegions")).ok_or_else(|| anyhow::anyhow!("no EC2 call"))?;
    assert!(describe.contains("Credential=ASIASTUBTEMPORARY001/") && describe.contains("stub-session-token-value"), "{describe}");
    // Nothing of the token or the temporary credentials in any Workspace status.
    let all = serde_json::to_string(&Api::<Workspace>::all(env.client.clone()).list(&Default::default()).await?)?;
    for secret in [TOKEN, "stub-temporary-secret", "stub-session-token-value"] {
        assert!(!all.contains(secret), "{secret} in a status");
    }
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
