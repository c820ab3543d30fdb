//! Servers on aws accounts whose first day goes wrong, through the controller and the embedded
//! API server against a stub EC2 endpoint (plain HTTP, allowed by the test's controller
//! config): an account that fences SSH without `sshSourceCidrs` stalls before any call that
//! creates anything; an account out of vCPUs stalls with `QuotaExceeded`, naming the quota,
//! the instance type and its vCPUs, with a Warning event, after one RunInstances.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use provisioning_controller::testing::{TestEnv, server, wait_for};
use provisioning_crds::{Server, Workspace};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "aws-quota";
const DEADLINE: Duration = Duration::from_secs(60);

/// What the stub answers per EC2 action (anything else: 400 UnsupportedOperation).
fn answer(action: &str) -> (u16, String) {
    match action {
        "DescribeRegions" => (200, "<DescribeRegionsResponse><regionInfo><item><regionName>eu-north-1</regionName></item></regionInfo></DescribeRegionsResponse>".into()),
        "DescribeInstances" => (200, "<DescribeInstancesResponse><requestId>r</requestId><reservationSet/></DescribeInstancesResponse>".into()),
        "DescribeSecurityGroups" => (
            200,
            "<DescribeSecurityGroupsResponse><securityGroupInfo><item><groupId>sg-0123456789abcdef0</groupId><ipPermissions><item><ipProtocol>tcp</ipProtocol></item></ipPermissions></item></securityGroupInfo></DescribeSecurityGroupsResponse>".into(),
        ),
        "RunInstances" => (400, error("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 0 allows")),
        other => (400, error("UnsupportedOperation", &format!("the stub does not do {other}"))),
    }
}

fn error(code: &str, message: &str) -> String {
    format!(
        "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>stub</RequestID></Response>"
    )
}

/// A one-request-per-connection HTTP stub of EC2 on 127.0.0.1; counts the actions it saw.
async fn stub_ec2() -> anyhow::Result<(String, Arc<Mutex<HashMap<String, u32>>>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}/", listener.local_addr()?);
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counts = counts.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body = loop {
                    let Ok(n) = stream.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break body.to_string();
                    }
                };
                let action = body.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or_default().to_string();
                if let Ok(mut c) = counts.lock() {
                    *c.entry(action.clone()).or_default() += 1;
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

fn seen(counts: &Mutex<HashMap<String, u32>>, action: &str) -> u32 {
    counts.lock().map(|c| c.get(action).copied().unwrap_or(0)).unwrap_or(0)
}

/// The Stalled condition of `name` as (reason, message) once it is True.
async fn stalled(api: &Api<Server>, name: &str) -> anyhow::Result<(String, String)> {
    wait_for(&format!("{name} Stalled"), DEADLINE, || {
        let api = api.clone();
        async move {
            let s = api.get(name).await.ok()?;
            let c = provisioning_controller::conditions::find(&s.status?.conditions, "Stalled")?.clone();
            (c.status == "True").then_some((c.reason, c.message))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_sources_missing_and_a_vcpu_quota_stall_servers_with_what_to_fix() -> anyhow::Result<()> {
    let (endpoint, counts) = stub_ec2().await?;
    let env = TestEnv::start().await?;
    let mut config = env.config();
    config.allow_insecure_endpoints = true;
    let controller = env.start_controller(config);
    let account = |name: &str, ssh: serde_json::Value| {
        json!({"name": name, "type": "aws", "region": "eu-north-1", "endpoint": endpoint, "rateLimit": 50,
               "credentialsSecretRef": {"name": "aws-creds"}, "images": {"debian-12": "ami-1e749f67"}, "sshSourceCidrs": ssh})
    };
    let ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NS},
        "spec": {"providers": [account("open", json!([])), account("capped", json!(["203.0.113.7/32"]))],
                 "defaults": {"provider": "capped", "image": "debian-12"}}
    }))?;
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &ws).await?;
    wait_for("namespace", DEADLINE, || {
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone());
        async move { api.get_opt(NS).await.ok().flatten().map(|_| ()) }
    })
    .await?;
    let creds: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-creds", "namespace": NS},
        "stringData": {"AWS_ACCESS_KEY_ID": "AKIAQUOTACONTROLLER1", "AWS_SECRET_ACCESS_KEY": "quota-controller-secret"}
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), NS).create(&PostParams::default(), &creds).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), NS);

    // No SSH sources: Stalled before anything is created, naming the field and the account.
    api.create(&PostParams::default(), &server(NS, "no-sources", json!({"provider": "open", "plan": "small"}))).await?;
    let (reason, message) = stalled(&api, "no-sources").await?;
    assert_eq!(reason, "SshSourcesMissing", "{message}");
    assert!(message.contains("sshSourceCidrs") && message.contains("\"open\"") && message.contains("0.0.0.0/0"), "{message}");
    assert_eq!((seen(&counts, "RunInstances"), seen(&counts, "CreateSecurityGroup")), (0, 0));

    // Out of vCPUs: Stalled QuotaExceeded naming the quota and what was asked, with an event.
    api.create(&PostParams::default(), &server(NS, "capped", json!({"provider": "capped", "plan": "medium"}))).await?;
    let (reason, message) = stalled(&api, "capped").await?;
    assert_eq!(reason, "QuotaExceeded", "{message}");
    for part in ["VcpuLimitExceeded", "t3.medium", "2 vCPUs", "capped"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), NS);
    wait_for("a QuotaExceeded event", DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.iter().any(|e| e.reason.as_deref() == Some("QuotaExceeded") && e.type_.as_deref() == Some("Warning")).then_some(())
        }
    })
    .await?;
    // Retried on the slow schedule (minutes), not at once.
    assert_eq!(seen(&counts, "RunInstances"), 1);
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
