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

/// A machine of `uid` in `zone` (empty: the account's), created and running.
async fn running_machine(provider: &provisioning_providers::SharedProvider, uid: &str, zone: &str) -> provisioning_providers::ProviderId {
    let request = ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "ep".into(), name: uid.into(), cluster: Some("kube".into()) },
        plan: "small".into(),
        zone: zone.into(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    };
    let created = provider.ensure_server(&request).await.expect("ensure");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !provider.observe_server(&created.provider_id).await.expect("observe").expect("exists").is_running() {
        assert!(std::time::Instant::now() < deadline, "machine not running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    created.provider_id
}

fn endpoint_request(uid: &str, targets: Vec<provisioning_providers::ProviderId>) -> provisioning_providers::EndpointRequest {
    provisioning_providers::EndpointRequest {
        identity: provisioning_providers::EndpointIdentity { cluster_uid: uid.into(), namespace: "ep".into(), cluster: "kube".into() },
        kind: provisioning_providers::EndpointKind::FloatingIp,
        port: 6443,
        zone: String::new(),
        targets,
    }
}

/// The endpoint contract against the double: a floating IP created attached to the first
/// control-plane machine, found by the Cluster's uid (through the label on its holder), moved
/// when that machine goes, released on delete; load balancers are not made, and say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upcloud_floating_ips_pass_the_endpoint_contract_against_the_double() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&double.endpoint, dir.path(), "api-password", None)).expect("build");
    let a = running_machine(&provider, "fip-a", "").await;
    let b = running_machine(&provider, "fip-b", "").await;
    let opts = ContractOptions {
        run_id: "up-fip".into(),
        namespace: "contract".into(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: false,
        deadline: Duration::from_secs(10),
    };
    for kind in [provisioning_providers::EndpointKind::FloatingIp, provisioning_providers::EndpointKind::LoadBalancer] {
        if let Err(e) = provisioning_providers::contract::endpoint(provider.as_ref(), kind, &[a.clone(), b.clone()], &opts).await {
            panic!("{kind:?}: {e}");
        }
    }
    assert!(double.floating_ips().is_empty(), "released: {:?}", double.floating_ips());
    let why = provider.supports_endpoint(provisioning_providers::EndpointKind::LoadBalancer).expect_err("no load balancer yet");
    assert!(why.contains("FloatingIP"), "{why}");
    let price = provider.endpoint_price(provisioning_providers::EndpointKind::FloatingIp, "").expect("a floating IP has a price");
    assert_eq!((price.currency, price.monthly_micros), ("EUR", 3_150_000));
}

/// The crash window between create and status write: the create's answer is lost, the
/// controller restarts (a new provider, status lost); the next ensure finds the address on
/// the labelled holder instead of making a second one. The address is not the machine's own
/// (not in its observed addresses), and goes with its holder when that server is deleted
/// (release policy), so a holder deleted before the move leaves nothing billed behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floating_ip_whose_create_answer_is_lost_is_found_not_made_twice() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(&double.endpoint, dir.path(), "api-password", None);
    let provider = build_provider(&cfg).expect("build");
    let a = running_machine(&provider, "lost-a", "").await;
    let b = running_machine(&provider, "lost-b", "").await;
    let request = endpoint_request("cluster-uid-1", vec![a.clone(), b.clone()]);
    double.lose_next_answer("POST", "/1.3/ip_address");
    let lost = provider.ensure_endpoint(&request).await.expect_err("the answer is lost");
    assert!(!lost.to_string().is_empty());
    let made = double.floating_ips();
    assert_eq!(made.len(), 1, "created although the answer was lost: {made:?}");
    let (address, holder) = made.iter().next().map(|(a, h)| (a.clone(), h.clone())).expect("one");
    assert_eq!(holder.as_deref(), Some(a.native_id()), "attached to the first target at once");
    assert!(
        double.server_labels(a.native_id()).contains(&("provisioning_cluster-uid".to_string(), "cluster-uid-1".to_string())),
        "the holder is labelled with the Cluster's uid: {:?}",
        double.server_labels(a.native_id())
    );

    let restarted = build_provider(&cfg).expect("build");
    let found = restarted.ensure_endpoint(&request).await.expect("ensure after the restart");
    assert_eq!((found.id.as_str(), found.targets.as_slice()), (address.as_str(), std::slice::from_ref(&a)));
    assert_eq!(double.floating_ips().len(), 1, "not made twice");
    assert_eq!(double.requests_to("POST", "/1.3/ip_address"), 1);
    let observed = restarted.observe_server(&a).await.expect("observe").expect("exists");
    assert!(
        observed.addresses.iter().all(|x| x.address != address),
        "a floating IP is not the machine's own address: {:?}",
        observed.addresses
    );
    let other = restarted
        .find_endpoint(provisioning_providers::EndpointKind::FloatingIp, &endpoint_request("cluster-uid-2", vec![]).identity)
        .await
        .expect("find");
    assert!(other.is_none(), "another Cluster's uid finds nothing: {other:?}");

    // No live control plane: the address stays where it is (never detached, so never lost).
    let patches = double.requests_to("PATCH", &format!("/1.3/ip_address/{address}"));
    let kept = restarted.ensure_endpoint(&endpoint_request("cluster-uid-1", vec![])).await.expect("ensure without targets");
    assert_eq!((kept.id.as_str(), kept.targets.as_slice()), (address.as_str(), std::slice::from_ref(&a)));
    assert_eq!(double.requests_to("PATCH", &format!("/1.3/ip_address/{address}")), patches, "not moved, not detached");
    assert_eq!(double.floating_ips().get(&address), Some(&Some(a.native_id().to_string())));

    // The holder deleted behind the controller's back: the address goes with it.
    assert!(double.remove_server(a.native_id()));
    assert!(double.floating_ips().is_empty(), "left detached: {:?}", double.floating_ips());
    let anew = restarted.ensure_endpoint(&endpoint_request("cluster-uid-1", vec![b.clone()])).await.expect("a new one on b");
    assert_eq!(anew.targets, vec![b.clone()]);
    assert_eq!(double.floating_ips().len(), 1);
    while restarted.delete_endpoint(provisioning_providers::EndpointKind::FloatingIp, &request.identity).await.expect("delete")
        != provisioning_providers::DeleteOutcome::Gone
    {}
    assert!(double.floating_ips().is_empty());
}

/// A floating IP moves only within its zone: a target in another zone is refused before any
/// change, naming the server and both zones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floating_ip_is_not_moved_to_another_zone() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&double.endpoint, dir.path(), "api-password", None)).expect("build");
    let fra = running_machine(&provider, "z-fra", "de-fra1").await;
    let hel = running_machine(&provider, "z-hel", "fi-hel1").await;
    let made = provider.ensure_endpoint(&endpoint_request("zone-uid", vec![fra.clone()])).await.expect("made in de-fra1");
    let err = provider.ensure_endpoint(&endpoint_request("zone-uid", vec![hel.clone()])).await.expect_err("another zone");
    assert!(
        matches!(&err, ProviderError::InvalidRequest(m) if m.contains(hel.native_id()) && m.contains("fi-hel1") && m.contains("de-fra1")),
        "{err:?}"
    );
    assert_eq!(double.floating_ips().get(&made.id), Some(&Some(fra.native_id().to_string())), "left where it was");
}

/// The double answers floating-IP calls the way UpCloud's API document and recordings say.
#[tokio::test]
async fn the_double_validates_floating_ip_calls() {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(&double.endpoint, dir.path(), "api-password", None)).expect("build");
    let fra = running_machine(&provider, "v-fra", "de-fra1").await;
    let hel = running_machine(&provider, "v-hel", "fi-hel1").await;
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, body: Option<serde_json::Value>| {
        let mut r = client.request(method, format!("{}/1.3{path}", double.endpoint)).basic_auth("api-user", Some("api-password"));
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b.to_string());
        }
        r.send()
    };
    let code = |v: &serde_json::Value| v["error"]["error_code"].as_str().unwrap_or("").to_string();
    let details: serde_json::Value =
        call(reqwest::Method::GET, &format!("/server/{}", fra.native_id()), None).await.expect("get").json().await.expect("json");
    let interfaces = details["server"]["networking"]["interfaces"]["interface"].as_array().cloned().unwrap_or_default();
    let mac_of = |kind: &str| interfaces.iter().find(|i| i["type"] == kind).and_then(|i| i["mac"].as_str()).unwrap_or("").to_string();
    let (public, utility) = (mac_of("public"), mac_of("utility"));
    for (body, status, want) in [
        (serde_json::json!({"ip_address": {"family": "IPv4", "floating": "yes", "mac": "not-a-mac"}}), 400, "MAC_INVALID"),
        (serde_json::json!({"ip_address": {"family": "IPv4", "floating": "yes", "mac": "da:45:c4:ff:ff:ff"}}), 404, "INTERFACE_NOT_FOUND"),
        (serde_json::json!({"ip_address": {"family": "IPv6", "floating": "yes", "mac": public}}), 400, "FAMILY_INVALID"),
        (serde_json::json!({"ip_address": {"family": "IPv4", "floating": "yes", "mac": utility}}), 409, "FLOATING_IP_NOT_AVAILABLE"),
        (
            serde_json::json!({"ip_address": {"family": "IPv4", "floating": "yes", "mac": public, "zone": "fi-hel1"}}),
            409,
            "FLOATING_IP_NOT_AVAILABLE",
        ),
    ] {
        let response = call(reqwest::Method::POST, "/ip_address", Some(body.clone())).await.expect("post");
        assert_eq!(response.status().as_u16(), status, "{body}");
        assert_eq!(code(&response.json().await.expect("json")), want, "{body}");
    }
    assert!(double.floating_ips().is_empty(), "nothing made by a refused call");
    let response = call(
        reqwest::Method::POST,
        "/ip_address",
        Some(serde_json::json!({"ip_address": {"family": "IPv4", "floating": "yes", "mac": public}})),
    )
    .await
    .expect("post");
    assert_eq!(response.status().as_u16(), 201);
    let created: serde_json::Value = response.json().await.expect("json");
    let ip = created["ip_address"]["address"].as_str().unwrap_or("").to_string();
    assert_eq!(
        (created["ip_address"]["floating"].as_str(), created["ip_address"]["server"].as_str()),
        (Some("yes"), Some(fra.native_id()))
    );
    // Moving it to a server of another zone is refused; an unknown address is 404 everywhere.
    let hel_details: serde_json::Value =
        call(reqwest::Method::GET, &format!("/server/{}", hel.native_id()), None).await.expect("get").json().await.expect("json");
    let hel_public = hel_details["server"]["networking"]["interfaces"]["interface"][0]["mac"].as_str().unwrap_or("").to_string();
    let response = call(reqwest::Method::PATCH, &format!("/ip_address/{ip}"), Some(serde_json::json!({"ip_address": {"mac": hel_public}})))
        .await
        .expect("patch");
    assert_eq!(response.status().as_u16(), 409);
    for method in [reqwest::Method::GET, reqwest::Method::PATCH, reqwest::Method::DELETE] {
        let body = (method == reqwest::Method::PATCH).then(|| serde_json::json!({"ip_address": {"mac": null}}));
        let response = call(method.clone(), "/ip_address/192.0.2.254", body).await.expect("call");
        assert_eq!(response.status().as_u16(), 404, "{method}");
        assert_eq!(code(&response.json().await.expect("json")), "IP_ADDRESS_NOT_FOUND", "{method}");
    }
    let response = call(reqwest::Method::GET, "/ip_address/not-an-ip", None).await.expect("get");
    assert_eq!(response.status().as_u16(), 400);
    // Detached with `mac: null`; kept (policy keep, the default) when its server goes.
    let response = call(reqwest::Method::PATCH, &format!("/ip_address/{ip}"), Some(serde_json::json!({"ip_address": {"mac": null}})))
        .await
        .expect("patch");
    assert_eq!(response.status().as_u16(), 202);
    assert_eq!(double.floating_ips().get(&ip), Some(&None));
    let response = call(reqwest::Method::PATCH, &format!("/ip_address/{ip}"), Some(serde_json::json!({"ip_address": {"mac": public}})))
        .await
        .expect("patch");
    assert_eq!(response.status().as_u16(), 202);
    assert!(double.remove_server(fra.native_id()));
    assert_eq!(double.floating_ips().get(&ip), Some(&None), "policy keep: detached, not deleted");
    assert_eq!(call(reqwest::Method::DELETE, &format!("/ip_address/{ip}"), None).await.expect("delete").status().as_u16(), 204);
    assert!(double.floating_ips().is_empty());
}
