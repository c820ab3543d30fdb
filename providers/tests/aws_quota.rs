//! The aws provider against moto on an account's first real day: quota and capacity errors
//! (injected at RunInstances by a proxy in front of moto, which has no quotas) are
//! `ProviderError::Capacity` naming the limit and what was asked, tried once; the managed
//! security group needs explicit SSH sources and is deleted with the last machine that uses
//! it (EC2's `DependencyViolation` while it detaches is "later", not an error), and comes
//! back with the next create, also in another process whose cache still names the old one.

mod support;

use provisioning_providers::aws::AwsProvider;
use provisioning_providers::{
    CapacityKind, Credentials, DeleteOutcome, NetworkSettings, Provider, ProviderConfig, ProviderError, ProviderId, ServerIdentity,
    ServerRequest,
};
use support::ec2_proxy::{Ec2Proxy as Proxy, error_doc};
use support::moto::Moto;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MOTO_AMI: &str = "ami-1e749f67";
const GROUP: &str = "provisioning-quota";

fn config(endpoint: &str, ssh_sources: &[&str]) -> ProviderConfig {
    ProviderConfig {
        name: "quota".into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIAQUOTATEST0000001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "quota-test-secret".to_string()),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), MOTO_AMI.to_string())].into(),
        rate_limit: 200,
        network: NetworkSettings { ssh_source_cidrs: ssh_sources.iter().map(|s| s.to_string()).collect(), ..Default::default() },
        ..Default::default()
    }
}

fn request(uid: &str, plan: &str, zone: &str) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "quota".into(), name: uid.into(), cluster: None },
        plan: plan.into(),
        zone: zone.into(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    }
}

/// Ids of the managed groups of the account, as moto lists them by name.
async fn managed_groups(provider: &AwsProvider) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let params = [("Filter.1.Name".to_string(), "group-name".to_string()), ("Filter.1.Value.1".to_string(), GROUP.to_string())];
    let xml = provider.client().call("DescribeSecurityGroups", &params).await?;
    // A group's own id appears again in its self-referencing rule.
    let mut ids: Vec<String> =
        xml.split("<groupId>").skip(1).filter_map(|r| r.split_once("</groupId>").map(|(id, _)| id.to_string())).collect();
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// Deletes until gone, within a deadline; returns how many calls said InProgress.
async fn delete_until_gone(provider: &dyn Provider, id: &ProviderId, uid: &str) -> Result<u32, Box<dyn std::error::Error>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut in_progress = 0;
    loop {
        match provider.delete_owned(id, uid).await? {
            DeleteOutcome::Gone => return Ok(in_progress),
            DeleteOutcome::InProgress if std::time::Instant::now() < deadline => {
                in_progress += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            DeleteOutcome::InProgress => return Err(format!("{id} still deleting after 30 s").into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_capacity_errors_name_the_limit_and_what_was_asked_and_are_tried_once() -> TestResult {
    let moto = Moto::start();
    let proxy = Proxy::start(&moto.endpoint).await?;
    let provider = AwsProvider::new(&config(&proxy.endpoint, &["203.0.113.7/32"]))?;
    let vcpu = "You have requested more vCPU capacity than your current vCPU limit of 32 allows for the instance bucket";
    proxy.answer("RunInstances", u32::MAX, 400, error_doc("VcpuLimitExceeded", vcpu));
    let err = provider.ensure_server(&request("quota-1", "large", "eu-north-1a")).await.err().ok_or("RunInstances was refused")?;
    match &err {
        ProviderError::Capacity(c) if c.kind == CapacityKind::Quota => {
            assert_eq!(c.quota, "VcpuLimitExceeded");
            assert!(c.asked.contains("t3.large") && c.asked.contains("2 vCPUs") && c.asked.contains("eu-north-1a"), "{c:?}");
            assert!(c.message.contains("vCPU limit of 32"), "{c:?}");
        }
        other => return Err(format!("expected a quota error, got {other:?}").into()),
    }
    assert_eq!(err.category(), "QuotaExceeded");
    assert_eq!(proxy.seen("RunInstances"), 1, "a quota error is not retried at once");

    // EC2 answers a zone without capacity with HTTP 500: still one call, not a quick retry.
    proxy.answer("RunInstances", u32::MAX, 500, error_doc("InsufficientInstanceCapacity", "We currently do not have sufficient capacity"));
    let err = provider.ensure_server(&request("quota-2", "xlarge", "")).await.err().ok_or("RunInstances was refused")?;
    assert!(
        matches!(&err, ProviderError::Capacity(c) if c.kind == CapacityKind::Insufficient && c.asked.contains("t3.xlarge") && c.asked.contains("4 vCPUs")),
        "{err:?}"
    );
    assert_eq!(proxy.seen("RunInstances"), 2, "{err}");
    assert!(provider.list_servers(&[]).await?.is_empty(), "nothing was created");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ssh_sources_creates_nothing_and_any_source_is_taken_only_as_written() -> TestResult {
    let moto = Moto::start();
    let proxy = Proxy::start(&moto.endpoint).await?;
    let provider = AwsProvider::new(&config(&proxy.endpoint, &[]))?;
    let err = provider.ensure_server(&request("ssh-1", "small", "")).await.err().ok_or("refused")?;
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("sshSourceCidrs") && m.contains("0.0.0.0/0")), "{err:?}");
    assert_eq!((proxy.seen("CreateSecurityGroup"), proxy.seen("RunInstances")), (0, 0), "nothing created");

    let open = AwsProvider::new(&config(&moto.endpoint, &["0.0.0.0/0", "::/0"]))?;
    let created = open.ensure_server(&request("ssh-2", "small", "")).await?;
    let groups = managed_groups(&open).await?;
    let params = [("GroupId.1".to_string(), groups.first().cloned().ok_or("a managed group")?)];
    let xml = open.client().call("DescribeSecurityGroups", &params).await?;
    assert!(xml.contains("<cidrIp>0.0.0.0/0</cidrIp>") && xml.contains("<cidrIpv6>::/0</cidrIpv6>"), "{xml}");
    delete_until_gone(&open, &created.provider_id, "ssh-2").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managed_group_goes_with_the_last_machine_and_comes_back_with_the_next() -> TestResult {
    let moto = Moto::start();
    let proxy = Proxy::start(&moto.endpoint).await?;
    let cfg = config(&proxy.endpoint, &["203.0.113.7/32"]);
    // Two controller processes: `b` caches the group id too.
    let a = AwsProvider::new(&cfg)?;
    let b = AwsProvider::new(&cfg)?;
    let first = a.ensure_server(&request("life-1", "small", "")).await?;
    let second = b.ensure_server(&request("life-2", "small", "")).await?;
    let groups = managed_groups(&a).await?;
    assert_eq!(groups.len(), 1, "{groups:?}");

    // Not the last machine: the group stays.
    delete_until_gone(&a, &first.provider_id, "life-1").await?;
    assert_eq!(managed_groups(&a).await?, groups, "the group stays while a machine uses it");

    // The last one: EC2 still holds the group once (interfaces detaching): "later", not an
    // error; then it is gone.
    proxy.answer("DeleteSecurityGroup", 1, 400, error_doc("DependencyViolation", "resource sg has a dependent object"));
    let waited = delete_until_gone(&a, &second.provider_id, "life-2").await?;
    assert!(waited >= 1, "DependencyViolation made the delete wait");
    assert!(managed_groups(&a).await?.is_empty(), "no managed group left after the last delete");
    // Deleting again is Gone and harmless.
    assert_eq!(a.delete_owned(&second.provider_id, "life-2").await?, DeleteOutcome::Gone);

    // The next create, in the process whose cache still names the deleted group, re-creates it.
    let third = b.ensure_server(&request("life-3", "small", "")).await?;
    let again = managed_groups(&a).await?;
    assert!(again.len() == 1 && again != groups, "a new group: {again:?} (old {groups:?})");
    assert_eq!(b.list_servers(&[]).await?.len(), 1);
    // Three machines made, and one RunInstances refused for the stale group (then re-tried).
    assert_eq!(proxy.seen("RunInstances"), 4);
    delete_until_gone(&b, &third.provider_id, "life-3").await?;
    assert!(managed_groups(&a).await?.is_empty());
    Ok(())
}
