//! Provider benchmarks (`cargo bench -p provisioning-providers --bench providers`).
//!
//! 1. Per-call overhead of the providers themselves: serialising and SigV4-signing an EC2
//!    request, parsing an EC2 XML response, serialising/parsing UpCloud JSON.
//! 2. 100 Servers against moto with 20 in flight through the aws provider, compared with
//!    moto's own latency floor: the same API calls (tag lookup + RunInstances per Server),
//!    pre-signed and sent raw with 20 in flight, no provider logic at all.
//!
//! Needs moto (`scripts/setup.sh`); fails, never skips, when it is missing.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use futures::StreamExt;
use provisioning_providers::aws::AwsProvider;
use provisioning_providers::aws::model::DescribeInstancesResponse;
use provisioning_providers::upcloud::model::ServerDetailsResponse;
use provisioning_providers::{Credentials, Provider, ProviderConfig, ServerIdentity, ServerRequest};

fn config(endpoint: &str) -> ProviderConfig {
    ProviderConfig {
        name: "bench".into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIABENCHMARK0000001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "benchmark-secret".to_string()),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), "ami-1e749f67".to_string())].into(),
        rate_limit: 10_000,
        ..Default::default()
    }
}

fn describe_xml(instances: usize) -> String {
    let mut xml = String::from(
        r#"<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId><reservationSet>"#,
    );
    for i in 0..instances {
        xml.push_str(&format!(
            "<item><reservationId>r-{i}</reservationId><instancesSet><item><instanceId>i-{i:017x}</instanceId><imageId>ami-1</imageId>\
             <instanceState><code>16</code><name>running</name></instanceState><privateDnsName>ip-10-0-0-{i}.internal</privateDnsName>\
             <dnsName>ec2-1-2-3-{i}.compute.amazonaws.com</dnsName><instanceType>t3.small</instanceType><privateIpAddress>10.0.0.{i}</privateIpAddress>\
             <ipAddress>1.2.3.{i}</ipAddress><tagSet><item><key>provisioning.dev/server-uid</key><value>uid-{i}</value></item>\
             <item><key>provisioning.dev/namespace</key><value>ns</value></item><item><key>provisioning.dev/server</key><value>s{i}</value></item></tagSet>\
             </item></instancesSet></item>"
        ));
    }
    xml.push_str("</reservationSet></DescribeInstancesResponse>");
    xml
}

fn per_call<T>(iterations: u32, mut f: impl FnMut() -> T) -> Duration {
    for _ in 0..iterations / 10 {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(f());
    }
    start.elapsed() / iterations
}

fn request(namespace: &str, i: usize) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: format!("{namespace}-{i:04}"), namespace: namespace.into(), name: format!("s{i}"), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    }
}

async fn provider_run(endpoint: &str) -> Duration {
    let provider = AwsProvider::new(&config(endpoint)).expect("provider");
    let start = Instant::now();
    futures::stream::iter(0..100)
        .map(|i| {
            let provider = &provider;
            async move {
                let obs = provider.ensure_server(&request("bench", i)).await.expect("ensure");
                // Converged = observed running (moto starts instances at once).
                loop {
                    let now = provider.observe_server(&obs.provider_id).await.expect("observe").expect("exists");
                    if now.is_running() {
                        break;
                    }
                }
            }
        })
        .buffer_unordered(20)
        .collect::<Vec<()>>()
        .await;
    start.elapsed()
}

/// The same calls with no provider logic: pre-signed bodies, raw HTTP, responses unread.
async fn floor_run(endpoint: &str) -> Duration {
    let provider = AwsProvider::new(&config(endpoint)).expect("provider");
    let client = provider.client();
    let mut prepared = Vec::new();
    for i in 0..100 {
        let uid = format!("floor-{i:04}");
        let describe = vec![
            ("Filter.1.Name".to_string(), "tag:provisioning.dev/server-uid".to_string()),
            ("Filter.1.Value.1".to_string(), uid.clone()),
        ];
        let run = vec![
            ("ImageId".to_string(), "ami-1e749f67".to_string()),
            ("InstanceType".to_string(), "t3.small".to_string()),
            ("MinCount".to_string(), "1".to_string()),
            ("MaxCount".to_string(), "1".to_string()),
            ("TagSpecification.1.ResourceType".to_string(), "instance".to_string()),
            ("TagSpecification.1.Tag.1.Key".to_string(), "provisioning.dev/server-uid".to_string()),
            ("TagSpecification.1.Tag.1.Value".to_string(), uid),
        ];
        prepared.push((
            client.prepare("DescribeInstances", &describe).expect("prepare"),
            client.prepare("RunInstances", &run).expect("prepare"),
            client.prepare("DescribeInstances", &describe).expect("prepare"),
        ));
    }
    let http = reqwest::Client::new();
    let send = |p: &provisioning_providers::aws::api::PreparedRequest| {
        let mut r = http.post(endpoint).body(p.body.clone());
        for (k, v) in &p.headers {
            r = r.header(k.as_str(), v.as_str());
        }
        r.send()
    };
    let start = Instant::now();
    futures::stream::iter(prepared.iter())
        .map(|(find, run, observe)| {
            let send = &send;
            async move {
                for p in [find, run, observe] {
                    let response = send(p).await.expect("send");
                    assert!(response.status().is_success(), "{}", response.status());
                    black_box(response.bytes().await.expect("body"));
                }
            }
        })
        .buffer_unordered(20)
        .collect::<Vec<()>>()
        .await;
    start.elapsed()
}

fn main() {
    // 1. Overhead per call.
    let provider = AwsProvider::new(&config("http://127.0.0.1:9/")).expect("provider");
    let client = provider.client();
    let run_params: Vec<(String, String)> = (0..12).map(|i| (format!("Param.{i}"), format!("value-{i}"))).collect();
    let sign = per_call(2000, || client.prepare("RunInstances", &run_params).expect("prepare"));
    let xml1 = describe_xml(1);
    let xml20 = describe_xml(20);
    let parse1 = per_call(2000, || client.parse::<DescribeInstancesResponse>("DescribeInstances", &xml1).expect("parse"));
    let parse20 = per_call(500, || client.parse::<DescribeInstancesResponse>("DescribeInstances", &xml20).expect("parse"));
    let upcloud_json = r#"{"server":{"uuid":"00798b85-efdc-41ca-8021-f6ef457b8531","state":"started","plan":"1xCPU-2GB","zone":"fi-hel1","title":"t","hostname":"h",
        "labels":{"label":[{"key":"provisioning_server-uid","value":"u"},{"key":"provisioning_namespace","value":"n"}]},
        "ip_addresses":{"ip_address":[{"access":"public","address":"198.51.100.1","family":"IPv4"},{"access":"utility","address":"10.1.0.1","family":"IPv4"}]},
        "storage_devices":{"storage_device":[{"storage":"01","storage_size":50,"storage_title":"d","type":"disk","address":"virtio:0"}]}}}"#;
    let upcloud = per_call(2000, || {
        let parsed: ServerDetailsResponse = serde_json::from_str(upcloud_json).expect("parse");
        serde_json::to_string(&parsed).expect("serialise")
    });
    println!("per-call overhead (mean of 2000 calls, single thread):");
    println!("  aws: serialise + SigV4-sign RunInstances (12 params)   {:>8.1} µs", sign.as_secs_f64() * 1e6);
    println!("  aws: parse DescribeInstances, 1 instance               {:>8.1} µs", parse1.as_secs_f64() * 1e6);
    println!("  aws: parse DescribeInstances, 20 instances             {:>8.1} µs", parse20.as_secs_f64() * 1e6);
    println!("  aws: sign + parse (1 instance), one whole call          {:>8.1} µs", (sign + parse1).as_secs_f64() * 1e6);
    println!("  upcloud: parse + serialise server details JSON         {:>8.1} µs", upcloud.as_secs_f64() * 1e6);

    // 2. 100 servers against moto, 20 in flight.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let floor = {
            let moto = support::moto::Moto::start();
            floor_run(&moto.endpoint).await
        };
        let with_provider = {
            let moto = support::moto::Moto::start();
            provider_run(&moto.endpoint).await
        };
        println!("100 servers against moto, 20 in flight:");
        println!("  moto latency floor (300 raw pre-signed calls)          {:>8.0} ms", floor.as_secs_f64() * 1e3);
        println!("  aws provider (ensure + observe until running)          {:>8.0} ms", with_provider.as_secs_f64() * 1e3);
        println!(
            "  ratio                                                  {:>8.2} (target ≤ 1.5)",
            with_provider.as_secs_f64() / floor.as_secs_f64()
        );
    });
}
