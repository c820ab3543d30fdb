//! The provider contract suite against the aws provider and the moto EC2 emulator (started
//! here on a free port of 127.0.0.1), with `exec` over SSH to a real sshd; plus the SSH
//! properties: host key pinning, assets copied once per content hash, timeouts.

mod support;

use std::time::{Duration, Instant};

use provisioning_providers::contract::{ContractOptions, run};
use provisioning_providers::{
    Credentials, ExecRequest, ProviderConfig, ProviderError, ServerIdentity, ServerRequest, SharedProvider, SshAsset, SshSettings,
    build_provider,
};
use support::moto::Moto;
use support::sshd::Sshd;

/// Any AMI id from moto's default set (moto does not boot it).
const MOTO_AMI: &str = "ami-1e749f67";

fn config(endpoint: &str, state_dir: &std::path::Path, sshd: &Sshd, assets: Vec<SshAsset>) -> ProviderConfig {
    ProviderConfig {
        name: "moto".into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIAMOTOCONTRACT0001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "moto-contract-secret-value".to_string()),
                ("SSH_PRIVATE_KEY".to_string(), sshd.client_key.clone()),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), MOTO_AMI.to_string())].into(),
        rate_limit: 100,
        state_dir: state_dir.to_path_buf(),
        ssh: SshSettings {
            user: sshd.user.clone(),
            port: sshd.port,
            address_override: Some("127.0.0.1".into()),
            assets,
            assets_marker: state_dir.join("remote/assets.sha256").display().to_string(),
            connect_timeout: Duration::from_secs(10),
            become_root: None,
        },
        // SSH to the managed group from one documentation address (never "any" by default).
        network: provisioning_providers::NetworkSettings { ssh_source_cidrs: vec!["203.0.113.7/32".into()], ..Default::default() },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_passes_contract_against_moto() {
    let moto = Moto::start();
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&moto.endpoint, dir.path(), &sshd, vec![])).expect("build aws provider");
    let opts = ContractOptions {
        run_id: "aws1".into(),
        namespace: "contract".into(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: true,
        deadline: Duration::from_secs(30),
    };
    if let Err(e) = run(provider.as_ref(), &opts).await {
        panic!("{e}\nsshd log:\n{}", sshd.log());
    }
}

async fn running_machine(provider: &SharedProvider, uid: &str) -> provisioning_providers::ProviderId {
    let request = ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "ssh".into(), name: uid.into(), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA3f0Y9v7tXb1cQm5r8HkS3y0x3oQeU1dN6q7YV1b2c3 test".into()),
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    };
    let created = provider.ensure_server(&request).await.expect("ensure");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let obs = provider.observe_server(&created.provider_id).await.expect("observe").expect("exists");
        if obs.is_running() {
            return created.provider_id;
        }
        assert!(Instant::now() < deadline, "machine not running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn request(argv: &[&str], timeout: Duration) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        env: Default::default(),
        timeout,
        output: None,
        ssh_key: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_pins_host_keys_copies_assets_once_and_times_out() {
    let moto = Moto::start();
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = dir.path().join("remote");
    let local_nu = dir.path().join("nu");
    std::fs::write(&local_nu, b"#!/bin/sh\necho fake-nu \"$@\"\n").expect("write asset");
    let local_script = dir.path().join("install.nu");
    std::fs::write(&local_script, b"print 'installing'\n").expect("write asset");
    let assets = vec![
        SshAsset { local: local_nu.clone(), remote: remote.join("bin/nu").display().to_string(), mode: 0o755 },
        SshAsset { local: local_script, remote: remote.join("scripts/install.nu").display().to_string(), mode: 0o644 },
    ];
    let provider = build_provider(&config(&moto.endpoint, dir.path(), &sshd, assets.clone())).expect("build");
    let id = running_machine(&provider, "ssh-uid-1").await;
    assert_eq!(provider.pinned_host_key(&id), None, "nothing pinned before first contact");

    // First run: assets land with their modes, output streams, env and stdin arrive.
    let (tx, mut rx) = provisioning_providers::OutputSink::channel();
    let mut first = request(&[&remote.join("bin/nu").display().to_string(), "one two"], Duration::from_secs(30));
    first.output = Some(tx);
    let result = provider.exec(&id, first).await.unwrap_or_else(|e| panic!("exec: {e}\n{}", sshd.log()));
    assert_eq!(result.exit_code, Some(0), "{result:?}");
    assert_eq!(result.stdout.trim(), "fake-nu one two");
    assert_eq!(rx.recv().await.as_deref(), Some("fake-nu one two"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(remote.join("bin/nu")).expect("copied").permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(std::fs::read_to_string(remote.join("scripts/install.nu")).expect("copied"), "print 'installing'\n");

    let pinned = provider.pinned_host_key(&id).expect("host key pinned on first contact");
    let host_key: Vec<&str> = sshd.host_public_key.split_whitespace().take(2).collect();
    assert_eq!(pinned, host_key.join(" "));

    // Same content hash: a second run copies nothing (a tampered copy stays as it is)…
    std::fs::write(remote.join("scripts/install.nu"), b"tampered\n").expect("tamper");
    let mut with_env = request(&["sh", "-c", "printf '%s|' \"$GREETING\"; cat"], Duration::from_secs(30));
    with_env.env = [("GREETING".to_string(), "hello world".to_string())].into();
    with_env.stdin = Some(b"from stdin".to_vec());
    let result = provider.exec(&id, with_env).await.expect("exec with env and stdin");
    assert_eq!(result.stdout, "hello world|from stdin");
    assert_eq!(std::fs::read_to_string(remote.join("scripts/install.nu")).expect("read"), "tampered\n");

    // …also for a fresh provider object (a restarted controller) that reads the marker.
    let restarted = build_provider(&config(&moto.endpoint, dir.path(), &sshd, assets.clone())).expect("build");
    let result = restarted.exec(&id, request(&["true"], Duration::from_secs(30))).await.expect("exec");
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(std::fs::read_to_string(remote.join("scripts/install.nu")).expect("read"), "tampered\n");
    assert_eq!(restarted.pinned_host_key(&id), Some(pinned.clone()), "pins persist in the state dir");

    // Changed content: copied again.
    std::fs::write(&local_nu, b"#!/bin/sh\necho fake-nu-v2\n").expect("write");
    let changed = build_provider(&config(&moto.endpoint, dir.path(), &sshd, assets)).expect("build");
    let result = changed.exec(&id, request(&[&remote.join("bin/nu").display().to_string()], Duration::from_secs(30))).await.expect("exec");
    assert_eq!(result.stdout.trim(), "fake-nu-v2");
    assert_eq!(std::fs::read_to_string(remote.join("scripts/install.nu")).expect("read"), "print 'installing'\n");

    // Timeout.
    let started = Instant::now();
    let result = provider.exec(&id, request(&["sleep", "30"], Duration::from_millis(800))).await.expect("exec");
    assert!(result.timed_out && result.exit_code.is_none(), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "timeout honoured: {:?}", started.elapsed());

    // A non-zero exit code is a result, not an error.
    let result = provider.exec(&id, request(&["sh", "-c", "echo oops >&2; exit 3"], Duration::from_secs(30))).await.expect("exec");
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(result.stderr.trim(), "oops");

    // A changed host key is refused.
    let other = build_provider(&config(&moto.endpoint, tempfile::tempdir().expect("dir").path(), &sshd, vec![])).expect("build");
    other.pin_host_key(&id, &sshd.client_public_key);
    let err = other.exec(&id, request(&["true"], Duration::from_secs(30))).await.expect_err("changed key refused");
    assert!(matches!(&err, ProviderError::Permanent(m) if m.contains("changed")), "{err:?}");
    assert!(!format!("{err:?}").contains("PRIVATE KEY"));

    provider.delete_server(&id).await.expect("delete");
}

/// Raw EC2 call through the provider's own signed client (moto answers what it stored).
async fn raw(provider: &provisioning_providers::aws::AwsProvider, action: &str, params: &[(&str, &str)]) -> String {
    let params: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    provider.client().call(action, &params).await.unwrap_or_else(|e| panic!("{action}: {e}"))
}

fn between<'a>(xml: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    xml.split(open).skip(1).filter_map(|rest| rest.split_once(close).map(|(v, _)| v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_require_imdsv2_and_join_a_minimal_managed_group() {
    let moto = Moto::start();
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&moto.endpoint, dir.path(), &sshd, vec![]);
    cfg.network.ssh_source_cidrs = vec!["203.0.113.7/32".into()];
    let provider = provisioning_providers::aws::AwsProvider::new(&cfg).expect("build");
    let shared: SharedProvider = std::sync::Arc::new(provisioning_providers::aws::AwsProvider::new(&cfg).expect("build"));
    let first = running_machine(&shared, "net-uid-1").await;
    let second = running_machine(&shared, "net-uid-2").await;

    // Both instances: IMDSv2 required, in the one managed group and no other.
    let mut groups = Vec::new();
    for id in [&first, &second] {
        let xml = raw(&provider, "DescribeInstances", &[("InstanceId.1", id.native_id())]).await;
        assert_eq!(between(&xml, "<httpTokens>", "</httpTokens>"), ["required"], "{xml}");
        // Reservation and instance both list the groups: count distinct ids.
        let group_set = between(&xml, "<groupSet>", "</groupSet>").join("");
        let mut ids = between(&group_set, "<groupId>", "</groupId>");
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 1, "one security group: {xml}");
        groups.push(ids[0].to_string());
    }
    assert_eq!(groups[0], groups[1], "one managed group per account, reused");

    // The group: found by its name, tagged for cleanup, SSH from the configured source only
    // and everything from its own members; no 0.0.0.0/0 anywhere.
    // The user data carries the controller-generated host key when the request has one.
    let (private, public) = provisioning_providers::ssh::generate_host_key().expect("host key");
    let keyed = ServerRequest {
        identity: ServerIdentity { uid: "net-uid-keyed".into(), namespace: "ssh".into(), name: "keyed".into(), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: Some(provisioning_providers::HostKey { private, public: public.clone() }),
    };
    let keyed = shared.ensure_server(&keyed).await.expect("create with a host key");
    let xml =
        raw(&provider, "DescribeInstanceAttribute", &[("InstanceId", keyed.provider_id.native_id()), ("Attribute", "userData")]).await;
    let encoded = between(&xml, "<value>", "</value>").first().map(|v| v.to_string()).unwrap_or_default();
    use base64::Engine as _;
    let user_data = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(encoded.trim()).expect("base64")).expect("utf-8");
    assert!(user_data.contains(&format!("ed25519_public: {public}")) && user_data.contains("ssh_deletekeys: true"), "{user_data}");
    shared.delete_server(&keyed.provider_id).await.expect("delete");

    let xml = raw(&provider, "DescribeSecurityGroups", &[("GroupId.1", &groups[0])]).await;
    assert_eq!(between(&xml, "<groupName>", "</groupName>"), ["provisioning-moto"], "{xml}");
    let ingress = between(&xml, "<ipPermissions>", "</ipPermissions>").join("");
    assert!(ingress.contains("<fromPort>22</fromPort>") && ingress.contains("<cidrIp>203.0.113.7/32</cidrIp>"), "{ingress}");
    assert!(ingress.contains(&format!("<groupId>{}</groupId>", groups[0])), "members reach each other: {ingress}");
    assert!(!ingress.contains("0.0.0.0/0"), "{ingress}");
    let tags = between(&xml, "<tagSet>", "</tagSet>").join("");
    assert!(tags.contains("provisioning.dev/managed") && tags.contains("provisioning.dev/account"), "{xml}");

    // An account naming its own groups and subnet gets exactly those.
    let vpc_xml = raw(&provider, "DescribeSubnets", &[]).await;
    let subnet = between(&vpc_xml, "<subnetId>", "</subnetId>").first().map(|s| s.to_string()).expect("moto has default subnets");
    let mut own = config(&moto.endpoint, dir.path(), &sshd, vec![]);
    own.network.security_group_ids = vec![groups[0].clone()];
    own.network.subnet_id = subnet.clone();
    let own: SharedProvider = std::sync::Arc::new(provisioning_providers::aws::AwsProvider::new(&own).expect("build"));
    let third = running_machine(&own, "net-uid-3").await;
    let xml = raw(&provider, "DescribeInstances", &[("InstanceId.1", third.native_id())]).await;
    assert!(xml.contains(&format!("<subnetId>{subnet}</subnetId>")), "{xml}");
    assert_eq!(between(&xml, "<httpTokens>", "</httpTokens>"), ["required"]);
    for id in [first, second, third] {
        shared.delete_server(&id).await.expect("delete");
    }
}

/// Four controller processes (four provider objects, no shared cache) create the first
/// machines of one account at once: each finds no managed security group and creates it. EC2
/// refuses all but one (`InvalidGroup.Duplicate`), and re-adding its rules is refused as
/// `InvalidPermission.Duplicate`; the losers must take the winner's group, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_processes_share_one_managed_security_group() {
    let moto = Moto::start();
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(&moto.endpoint, dir.path(), &sshd, vec![]);
    let racers: Vec<SharedProvider> = (0..4)
        .map(|_| std::sync::Arc::new(provisioning_providers::aws::AwsProvider::new(&cfg).expect("build")) as SharedProvider)
        .collect();
    let ids =
        futures::future::join_all(racers.iter().enumerate().map(|(i, p)| async move { running_machine(p, &format!("race-{i}")).await }))
            .await;
    let probe = provisioning_providers::aws::AwsProvider::new(&cfg).expect("build");
    let xml = raw(&probe, "DescribeSecurityGroups", &[("Filter.1.Name", "group-name"), ("Filter.1.Value.1", "provisioning-moto")]).await;
    assert_eq!(between(&xml, "<groupName>", "</groupName>").len(), 1, "one managed group: {xml}");
    for id in ids {
        racers[0].delete_server(&id).await.expect("delete");
    }
}

/// The endpoint contract against moto: an Elastic IP allocated once for a Cluster uid (tagged
/// in AllocateAddress), associated with the first control plane, moved when it goes, released
/// on delete (DescribeAddresses by the tag finds nothing after); no load balancer, said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_elastic_ips_pass_the_endpoint_contract_against_moto() {
    let moto = Moto::start();
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&moto.endpoint, dir.path(), &sshd, vec![])).expect("build aws provider");
    let a = running_machine(&provider, "eip-a").await;
    let b = running_machine(&provider, "eip-b").await;
    let opts = ContractOptions {
        run_id: "aws-eip".into(),
        namespace: "contract".into(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: false,
        deadline: Duration::from_secs(30),
    };
    for kind in [provisioning_providers::EndpointKind::FloatingIp, provisioning_providers::EndpointKind::LoadBalancer] {
        if let Err(e) = provisioning_providers::contract::endpoint(provider.as_ref(), kind, &[a.clone(), b.clone()], &opts).await {
            panic!("{kind:?}: {e}");
        }
    }
    let why = provider.supports_endpoint(provisioning_providers::EndpointKind::LoadBalancer).expect_err("no NLB");
    assert!(why.contains("FloatingIP"), "{why}");
    let price = provider.endpoint_price(provisioning_providers::EndpointKind::FloatingIp, "").expect("an EIP has a price");
    assert_eq!((price.currency, price.hourly_micros), ("USD", 5_000));
}
