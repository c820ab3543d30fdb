//! Servers on an aws account whose network is mapped per zone (`zoneSubnets`), through the
//! controller and the embedded API server against moto (plain HTTP, allowed by the test's
//! controller config), behind a proxy that answers RunInstances in `eu-north-1a` with EC2's
//! `InsufficientInstanceCapacity` (moto has no capacity limits):
//! - a Server in `eu-north-1a` with `fallbackZones: [eu-north-1b, eu-north-1c]` is asked once
//!   in 1a, then its next create goes to 1b: one machine, in 1b's subnet, `status.zone` 1b,
//!   its plan without changes (no replacement back to 1a), Ready;
//! - a Server in a zone the account does not map stalls `InvalidZone`, naming the field,
//!   before any RunInstances;
//! - after the Servers are deleted nothing the controller made is left at moto (instances,
//!   security groups).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use provisioning_controller::testing::{TestEnv, server, wait_for};
use provisioning_crds::{Server, Workspace};
use provisioning_providers::Provider;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "aws-zones";
const REGION: &str = "eu-north-1";
const ZONES: [&str; 3] = ["eu-north-1a", "eu-north-1b", "eu-north-1c"];
const DEADLINE: Duration = Duration::from_secs(90);

/// `moto_server` on 127.0.0.1 (port read from its log); killed when dropped. Fails, never
/// skips, when moto is missing.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Moto {
    fn start() -> anyhow::Result<Moto> {
        let binary = std::env::var_os("PROVISIONING_MOTO")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/moto_server"));
        anyhow::ensure!(binary.exists(), "moto_server not found at {}: run scripts/setup.sh", binary.display());
        let mut child = std::process::Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("moto's stderr"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(port) = line.split("Running on http://127.0.0.1:").nth(1).and_then(|r| r.trim().parse::<u16>().ok())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(port);
                }
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                anyhow::bail!("moto_server did not report its port within 60 s");
            }
        };
        Ok(Moto { child, endpoint: format!("http://127.0.0.1:{port}/") })
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads one HTTP message (head and a Content-Length body) from `stream`.
async fn read_message(stream: &mut tokio::net::TcpStream, until_eof: bool) -> anyhow::Result<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some((head, body)) = text.split_once("\r\n\r\n") else { continue };
        let length = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>()));
        match length {
            Some(Ok(length)) if body.len() >= length => return Ok((head.to_string(), body.to_string())),
            None if !until_eof => return Ok((head.to_string(), body.to_string())),
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((head.to_string(), body.to_string()))
}

/// A proxy in front of moto: RunInstances placed in `eu-north-1a` is answered with
/// InsufficientInstanceCapacity (HTTP 500, as EC2 does); everything else goes to moto. Counts
/// RunInstances per zone asked.
async fn capacity_proxy(moto: &str) -> anyhow::Result<(String, Arc<Mutex<HashMap<String, u32>>>)> {
    let upstream = moto.trim_start_matches("http://").trim_end_matches('/').to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}/", listener.local_addr()?);
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counts = runs.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (counts, upstream) = (counts.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok((head, body)) = read_message(&mut stream, false).await else { return };
                let form: Vec<(String, String)> =
                    form_urlencoded::parse(body.as_bytes()).map(|(k, v)| (k.to_string(), v.to_string())).collect();
                let param = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
                let (status, answer) = if param("Action") == "RunInstances" {
                    let zone = param("Placement.AvailabilityZone");
                    if let Ok(mut c) = counts.lock() {
                        *c.entry(zone.clone()).or_default() += 1;
                    }
                    if zone == ZONES[0] {
                        let xml = "<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code><Message>We currently do not have sufficient t3.small capacity in the Availability Zone you requested (eu-north-1a).</Message></Error></Errors><RequestID>proxy</RequestID></Response>";
                        (500, xml.to_string())
                    } else {
                        forward(&upstream, &head, &body).await.unwrap_or((502, String::new()))
                    }
                } else {
                    forward(&upstream, &head, &body).await.unwrap_or((502, String::new()))
                };
                let response = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok((endpoint, runs))
}

/// Sends the request (its headers but Host, Content-Length and Connection) to moto.
async fn forward(upstream: &str, head: &str, body: &str) -> anyhow::Result<(u16, String)> {
    let mut request = format!("POST / HTTP/1.1\r\nhost: {upstream}\r\n");
    for line in head.lines().skip(1) {
        let lower = line.to_ascii_lowercase();
        if !(lower.starts_with("host:") || lower.starts_with("content-length:") || lower.starts_with("connection:")) {
            request.push_str(line);
            request.push_str("\r\n");
        }
    }
    request.push_str(&format!("content-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()));
    let mut moto = tokio::net::TcpStream::connect(upstream).await?;
    moto.write_all(request.as_bytes()).await?;
    let (head, body) = read_message(&mut moto, true).await?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(502);
    Ok((status, body))
}

fn admin(endpoint: &str) -> anyhow::Result<provisioning_providers::aws::AwsProvider> {
    Ok(provisioning_providers::aws::AwsProvider::new(&provisioning_providers::ProviderConfig {
        name: "zones".into(),
        provider_type: "aws".into(),
        region: REGION.into(),
        endpoint: endpoint.into(),
        credentials: provisioning_providers::Credentials(
            [("AWS_ACCESS_KEY_ID".to_string(), "AKIAZONESADMIN000001".to_string()), ("AWS_SECRET_ACCESS_KEY".to_string(), "s".to_string())]
                .into(),
        ),
        rate_limit: 100,
        ..Default::default()
    })?)
}

fn first(xml: &str, tag: &str) -> anyhow::Result<String> {
    xml.split(&format!("<{tag}>"))
        .nth(1)
        .and_then(|r| r.split_once(&format!("</{tag}>")).map(|(v, _)| v.to_string()))
        .ok_or_else(|| anyhow::anyhow!("no <{tag}> in {xml}"))
}

/// A VPC and a subnet per zone in moto: zone → subnet.
async fn three_subnets(ec2: &provisioning_providers::aws::AwsProvider) -> anyhow::Result<BTreeMap<String, String>> {
    let vpc = first(&ec2.client().call("CreateVpc", &[("CidrBlock".to_string(), "10.60.0.0/16".to_string())]).await?, "vpcId")?;
    let mut subnets = BTreeMap::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let params = [
            ("VpcId".to_string(), vpc.clone()),
            ("CidrBlock".to_string(), format!("10.60.{}.0/24", i + 1)),
            ("AvailabilityZone".to_string(), zone.to_string()),
        ];
        subnets.insert(zone.to_string(), first(&ec2.client().call("CreateSubnet", &params).await?, "subnetId")?);
    }
    Ok(subnets)
}

/// Live instances and managed security groups of account `zones` at moto.
async fn leftovers(ec2: &provisioning_providers::aws::AwsProvider) -> anyhow::Result<(usize, usize)> {
    let live = ec2.list_servers(&[]).await?.len();
    let params =
        [("Filter.1.Name".to_string(), "group-name".to_string()), ("Filter.1.Value.1".to_string(), "provisioning-zones".to_string())];
    let xml = ec2.client().call("DescribeSecurityGroups", &params).await?;
    Ok((live, usize::from(xml.contains("<groupName>provisioning-zones</groupName>"))))
}

fn condition(s: &Server, type_: &str) -> Option<(String, String, String)> {
    let c = provisioning_controller::conditions::find(&s.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_capacity_in_the_zone_moves_the_next_create_to_a_fallback_zone_and_unlisted_zones_stall() -> anyhow::Result<()> {
    let moto = Moto::start()?;
    let ec2 = admin(&moto.endpoint)?;
    let subnets = three_subnets(&ec2).await?;
    let (endpoint, runs) = capacity_proxy(&moto.endpoint).await?;
    let env = TestEnv::start().await?;
    let mut config = env.config();
    config.allow_insecure_endpoints = true;
    let controller = env.start_controller(config);
    let ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NS},
        "spec": {"providers": [{"name": "zones", "type": "aws", "region": REGION, "endpoint": endpoint, "rateLimit": 50,
                                "credentialsSecretRef": {"name": "aws-creds"}, "images": {"debian-12": "ami-1e749f67"},
                                "sshSourceCidrs": ["203.0.113.7/32"], "zoneSubnets": subnets}],
                 "defaults": {"provider": "zones", "image": "debian-12"}}
    }))?;
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &ws).await?;
    wait_for("namespace", DEADLINE, || {
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone());
        async move { api.get_opt(NS).await.ok().flatten().map(|_| ()) }
    })
    .await?;
    let creds: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-creds", "namespace": NS},
        "stringData": {"AWS_ACCESS_KEY_ID": "AKIAZONESCONTROLLER1", "AWS_SECRET_ACCESS_KEY": "zones-controller-secret"}
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), NS).create(&PostParams::default(), &creds).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), NS);

    // A zone the account does not map: Stalled before any RunInstances, naming the field.
    api.create(&PostParams::default(), &server(NS, "elsewhere", json!({"plan": "small", "zone": "eu-west-1a"}))).await?;
    let (_, reason, message) = wait_for("elsewhere Stalled", DEADLINE, || {
        let api = api.clone();
        async move { condition(&api.get("elsewhere").await.ok()?, "Stalled").filter(|c| c.0 == "True") }
    })
    .await?;
    assert_eq!(reason, "InvalidZone", "{message}");
    assert!(message.contains("spec.providers[].zoneSubnets") && message.contains("eu-west-1a"), "{message}");
    assert!(runs.lock().map(|r| r.is_empty()).unwrap_or(false), "no RunInstances for an unlisted zone");

    // No capacity in 1a: one RunInstances there, then the next create goes to 1b.
    let spec = json!({"plan": "small", "zone": ZONES[0], "fallbackZones": [ZONES[1], ZONES[2]]});
    api.create(&PostParams::default(), &server(NS, "web-0", spec)).await?;
    let s = wait_for("web-0 Ready", DEADLINE, || {
        let api = api.clone();
        async move { api.get("web-0").await.ok().filter(provisioning_controller::testing::is_ready) }
    })
    .await?;
    let status = s.status.clone().unwrap_or_default();
    assert_eq!(status.zone.as_deref(), Some(ZONES[1]), "{status:?}");
    assert_eq!(status.zone_fallback, None, "cleared once a machine is made");
    let asked = runs.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!((asked.get(ZONES[0]), asked.get(ZONES[1]), asked.get(ZONES[2])), (Some(&1), Some(&1), None), "{asked:?}");
    let id = status.provider_id.clone().unwrap_or_default();
    let native = id.trim_start_matches("aws://").to_string();
    let xml = ec2.client().call("DescribeInstances", &[("InstanceId.1".to_string(), native)]).await?;
    assert_eq!(first(&xml, "subnetId")?, subnets[ZONES[1]], "{xml}");
    // One machine for the Server, and the spec (1a, falling back to 1b) is what it is: no change planned.
    let uid = s.metadata.uid.clone().unwrap_or_default();
    let tagged = ec2.list_servers(&[(provisioning_providers::tags::SERVER_UID.to_string(), uid)]).await?;
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    let plan = status.plan.clone().unwrap_or_default();
    assert!(!plan.has_changes(), "a machine in a fallback zone is not replaced: {plan:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), NS);
    let list = events.list(&Default::default()).await?;
    assert!(
        list.items.iter().any(|e| e.reason.as_deref() == Some("InsufficientCapacity") && e.type_.as_deref() == Some("Warning")),
        "a Warning for the zone without capacity"
    );

    // Deleted: nothing the controller made is left at moto.
    for name in ["web-0", "elsewhere"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    wait_for("Servers gone", DEADLINE, || {
        let api = api.clone();
        async move { api.list(&Default::default()).await.ok().filter(|l| l.items.is_empty()).map(|_| ()) }
    })
    .await?;
    assert_eq!(leftovers(&ec2).await?, (0, 0), "no instance and no managed security group left");
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
