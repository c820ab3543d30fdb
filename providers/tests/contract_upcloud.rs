//! The provider contract suite against the upcloud provider and the local UpCloud API 1.3
//! test double, with `exec` over SSH to a real sshd; plus UpCloud specifics: auth errors,
//! request validation, storages deleted with their server.

mod support;

use std::time::Duration;

use provisioning_providers::contract::{ContractOptions, run};
use provisioning_providers::{Credentials, ProviderConfig, ProviderError, ServerIdentity, ServerRequest, SshSettings, build_provider};
use support::sshd::Sshd;
use upcloud_double::{DoubleConfig, UpcloudDouble};

fn config(endpoint: &str, state_dir: &std::path::Path, password: &str, sshd: Option<&Sshd>) -> ProviderConfig {
    let mut credentials =
        vec![("UPCLOUD_USERNAME".to_string(), "api-user".to_string()), ("UPCLOUD_PASSWORD".to_string(), password.to_string())];
    if let Some(sshd) = sshd {
        credentials.push(("SSH_PRIVATE_KEY".to_string(), sshd.client_key.clone()));
    }
    ProviderConfig {
        name: "double".into(),
        provider_type: "upcloud".into(),
        zone: "de-fra1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(credentials.into_iter().collect()),
        rate_limit: 100,
        state_dir: state_dir.to_path_buf(),
        ssh: sshd.map_or_else(SshSettings::default, |sshd| SshSettings {
            user: sshd.user.clone(),
            port: sshd.port,
            address_override: Some("127.0.0.1".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upcloud_passes_contract_against_the_double() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&double.endpoint, dir.path(), "api-password", Some(&sshd))).expect("build");
    let opts = ContractOptions {
        run_id: "up1".into(),
        namespace: "contract".into(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: true,
        deadline: Duration::from_secs(30),
    };
    if let Err(e) = run(provider.as_ref(), &opts).await {
        panic!("{e}\nsshd log:\n{}", sshd.log());
    }
    assert_eq!(double.server_count(), 0, "no server left");
    assert_eq!(double.storage_count(), 0, "storages deleted with the server");
}

#[tokio::test]
async fn bad_credentials_are_auth_errors_after_one_call_without_the_password() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(&double.endpoint, dir.path(), "wrong-password-s3cret", None);
    let provider = build_provider(&cfg).expect("build");
    for _ in 0..3 {
        let err = provider.validate_credentials().await.expect_err("rejected");
        assert!(matches!(&err, ProviderError::Auth(m) if m.contains("AUTHENTICATION_FAILED")), "{err:?}");
        let direct = provisioning_providers::upcloud::UpcloudProvider::new(&cfg).expect("build");
        assert!(!format!("{err} {err:?} {direct:?} {cfg:?}").contains("s3cret"));
    }
    assert_eq!(double.requests.load(std::sync::atomic::Ordering::SeqCst), 1, "one call per auth backoff step");
}

#[tokio::test]
async fn the_double_validates_requests_like_upcloud() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let client = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        client
            .post(format!("{}/1.3/server", double.endpoint))
            .basic_auth("api-user", Some("api-password"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let base = serde_json::json!({"server": {
        "zone": "fi-hel1", "title": "t", "hostname": "h.example", "plan": "1xCPU-2GB", "metadata": "yes",
        "storage_devices": {"storage_device": [{"action": "clone", "storage": "01000000-0000-4000-8000-000020070100", "title": "d", "size": 25, "tier": "maxiops"}]},
        "labels": {"label": [{"key": "bad/key", "value": "x"}]}
    }});
    let response = post(base.clone()).await.expect("post");
    assert_eq!(response.status().as_u16(), 400);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["error"]["error_code"], "INVALID_LABEL_KEY");
    let mut no_zone = base.clone();
    no_zone["server"].as_object_mut().expect("object").remove("zone");
    let body: serde_json::Value = post(no_zone).await.expect("post").json().await.expect("json");
    assert_eq!(body["error"]["error_code"], "ZONE_MISSING");

    // Through the provider: an unknown zone never reaches the API; a known one does.
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&double.endpoint, dir.path(), "api-password", None)).expect("build");
    let mut request = ServerRequest {
        identity: ServerIdentity { uid: "v-1".into(), namespace: "ns".into(), name: "v1".into(), cluster: None },
        plan: "medium".into(),
        zone: "xx-nowhere1".into(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    };
    let err = provider.ensure_server(&request).await.expect_err("unknown zone");
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("xx-nowhere1")), "{err:?}");
    request.zone = String::new();
    let created = provider.ensure_server(&request).await.expect("create");
    assert_eq!(created.plan, "2xCPU-4GB");
    assert_eq!(created.state, provisioning_providers::MachineState::Pending, "maintenance while created");
    assert_eq!(created.tags.get("provisioning.dev/server-uid").map(String::as_str), Some("v-1"));
    // Delete goes stop → stopped → delete with storages.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while provider.delete_server(&created.provider_id).await.expect("delete") != provisioning_providers::DeleteOutcome::Gone {
        assert!(std::time::Instant::now() < deadline, "delete did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((double.server_count(), double.storage_count()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firewall_rules_are_attached_to_new_servers() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&double.endpoint, dir.path(), "api-password", None);
    cfg.network.ssh_source_cidrs = vec!["203.0.113.0/28".into()];
    cfg.network.firewall_rules = vec![
        provisioning_providers::FirewallRule {
            direction: "in".into(),
            action: "accept".into(),
            protocol: "tcp".into(),
            source: "10.0.0.0/8".into(),
            destination_port: "5432".into(),
            comment: "postgres from the private network".into(),
            ..Default::default()
        },
        provisioning_providers::FirewallRule { direction: "out".into(), action: "accept".into(), ..Default::default() },
    ];
    let provider = build_provider(&cfg).expect("build");
    let request = ServerRequest {
        identity: ServerIdentity { uid: "fw-1".into(), namespace: "ns".into(), name: "fw1".into(), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    };
    let created = provider.ensure_server(&request).await.expect("create");
    let firewalls = double.firewalls();
    let (state, rules) = firewalls.get(created.provider_id.native_id()).expect("server in the double");
    assert_eq!(state, "on");
    let field = |i: usize, k: &str| rules[i][k].as_str().unwrap_or("?").to_string();
    assert_eq!(rules.len(), 4, "{rules:#?}");
    // SSH from the configured range first, as an UpCloud address range.
    assert_eq!(
        (field(0, "action"), field(0, "source_address_start"), field(0, "source_address_end"), field(0, "destination_port_start")),
        ("accept".into(), "203.0.113.0".into(), "203.0.113.15".into(), "22".into())
    );
    assert_eq!((field(1, "source_address_start"), field(1, "source_address_end")), ("10.0.0.0".into(), "10.255.255.255".into()));
    assert_eq!((field(1, "family"), field(1, "destination_port_end")), ("IPv4".into(), "5432".into()));
    assert_eq!((field(2, "direction"), field(2, "action")), ("out".into(), "accept".into()));
    // Everything else inbound is dropped.
    assert_eq!((field(3, "direction"), field(3, "action"), field(3, "source_address_start")), ("in".into(), "drop".into(), String::new()));
    assert_eq!(field(3, "position"), "4");

    // Ensuring again (a lost create response) finds the server and leaves its rules alone.
    let again = provider.ensure_server(&request).await.expect("ensure again");
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(double.firewalls().get(created.provider_id.native_id()).map(|(_, r)| r.len()), Some(4));

    // Without rules the firewall stays off; a malformed rule is refused before any call.
    let plain = build_provider(&config(&double.endpoint, dir.path(), "api-password", None)).expect("build");
    let other = ServerRequest {
        identity: ServerIdentity { uid: "fw-2".into(), namespace: "ns".into(), name: "fw2".into(), cluster: None },
        ..request.clone()
    };
    let created_plain = plain.ensure_server(&other).await.expect("create");
    assert_eq!(double.firewalls().get(created_plain.provider_id.native_id()).map(|(s, r)| (s.clone(), r.len())), Some(("off".into(), 0)));
    let mut bad = cfg.clone();
    bad.network.firewall_rules[0].source = "10.0.0.0/99".into();
    let Err(err) = build_provider(&bad) else { panic!("a malformed rule must be refused") };
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("firewallRules[0]")), "{err:?}");
}

#[tokio::test]
async fn public_ip_false_creates_a_server_without_a_public_address() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&double.endpoint, dir.path(), "api-password", None)).expect("build");
    let request = |uid: &str, public_ip: Option<bool>| ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "ns".into(), name: uid.into(), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip,
        disks: Vec::new(),
        host_key: None,
    };
    let kinds = |o: &provisioning_providers::ServerObservation| o.addresses.iter().map(|a| a.kind.clone()).collect::<Vec<_>>();
    let private = provider.ensure_server(&request("no-public", Some(false))).await.expect("create");
    let observed = provider.observe_server(&private.provider_id).await.expect("observe").expect("exists");
    assert!(!kinds(&observed).contains(&"ExternalIP".to_string()), "{:?}", observed.addresses);
    assert!(kinds(&observed).contains(&"InternalIP".to_string()), "the utility address: {:?}", observed.addresses);
    let default = provider.ensure_server(&request("default", None)).await.expect("create");
    let observed = provider.observe_server(&default.provider_id).await.expect("observe").expect("exists");
    assert!(kinds(&observed).contains(&"ExternalIP".to_string()), "unset: a public address as before: {:?}", observed.addresses);
}
