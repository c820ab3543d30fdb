//! The provider contract suite against the simulated provider, plus its own properties.

use std::time::Duration;

use provisioning_providers::contract::{ContractOptions, run};
use provisioning_providers::{Credentials, ProviderConfig, ProviderError, ServerIdentity, ServerRequest, SimulationConfig, build_provider};

fn config(dir: &std::path::Path, name: &str) -> ProviderConfig {
    ProviderConfig { name: name.into(), provider_type: "simulated".into(), state_dir: dir.to_path_buf(), ..Default::default() }
}

fn request(uid: &str) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "ns".into(), name: uid.into(), cluster: None },
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

#[tokio::test]
async fn simulated_passes_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(dir.path(), "sim")).expect("build");
    let opts = ContractOptions {
        run_id: "c1".into(),
        namespace: "contract".into(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: false,
        deadline: Duration::from_secs(10),
    };
    run(provider.as_ref(), &opts).await.expect("contract");
}

#[tokio::test]
async fn machines_outlive_the_provider_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("simulated-sim-a.jsonl");
    let first = {
        let p = build_provider(&config(dir.path(), "persist")).expect("build");
        p.ensure_server(&request("u1")).await.expect("create")
    };
    // Simulate a restarted process: read the log with a fresh store.
    let text = std::fs::read_to_string(dir.path().join("simulated-persist.jsonl")).expect("log");
    assert!(text.contains(&first.provider_id.native_id().to_string()));
    std::fs::write(&path, &text).expect("copy log");
    let copy = build_provider(&config(dir.path(), "sim-a")).expect("build copy");
    let found = copy.find_server(&request("u1").identity).await.expect("find");
    assert_eq!(found.map(|o| o.provider_id), Some(first.provider_id));
}

#[tokio::test]
async fn failure_rate_and_auth_are_honoured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path(), "flaky");
    cfg.simulation = SimulationConfig { failure_rate: 1.0, ..Default::default() };
    let p = build_provider(&cfg).expect("build");
    let err = p.ensure_server(&request("u2")).await.expect_err("always fails");
    assert!(err.is_retryable(), "{err:?}");

    let mut cfg = config(dir.path(), "locked");
    cfg.simulation = SimulationConfig { required_token: Some("s3cret".into()), ..Default::default() };
    let p = build_provider(&cfg).expect("build");
    let err = p.validate_credentials().await.expect_err("no token");
    assert!(matches!(err, ProviderError::Auth(_)), "{err:?}");
    assert!(!format!("{err}").contains("s3cret"), "error must not carry the secret");
    cfg.credentials = Credentials([("SIMULATED_TOKEN".to_string(), "s3cret".to_string())].into());
    assert!(!format!("{:?}", cfg.credentials).contains("s3cret"));
    let p = build_provider(&cfg).expect("build");
    p.validate_credentials().await.expect("token accepted");
}

#[tokio::test]
async fn unknown_plan_is_invalid_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = build_provider(&config(dir.path(), "plans")).expect("build");
    let mut req = request("u3");
    req.plan = "huge".into();
    let err = p.ensure_server(&req).await.expect_err("bad plan");
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("huge")), "{err:?}");
    assert!(p.list_servers(&[]).await.expect("list").is_empty(), "nothing created");
}

#[tokio::test]
async fn a_torn_last_line_from_a_killed_writer_loses_no_later_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = {
        let p = build_provider(&config(dir.path(), "torn-src")).expect("build");
        p.ensure_server(&request("before")).await.expect("create")
    };
    // A log whose writer died mid-line: a whole entry, then half of the next one.
    let log = std::fs::read_to_string(dir.path().join("simulated-torn-src.jsonl")).expect("log");
    let torn = format!("{log}{{\"op\":\"create\",\"machine\":{{\"id\":\"sim-half");
    std::fs::write(dir.path().join("simulated-torn.jsonl"), torn).expect("write torn log");
    let p = build_provider(&config(dir.path(), "torn")).expect("build on torn log");
    let after = p.ensure_server(&request("after")).await.expect("create after the torn line");
    assert_eq!(p.find_server(&request("before").identity).await.expect("find").map(|o| o.provider_id), Some(first.provider_id));
    assert_eq!(
        p.find_server(&request("after").identity).await.expect("find").map(|o| o.provider_id.clone()),
        Some(after.provider_id.clone())
    );
    // A fresh reader of the same file (another process) sees both.
    let text = std::fs::read_to_string(dir.path().join("simulated-torn.jsonl")).expect("log");
    let copy = dir.path().join("simulated-torn-copy.jsonl");
    std::fs::write(&copy, text).expect("copy");
    let reader = build_provider(&config(dir.path(), "torn-copy")).expect("build reader");
    assert_eq!(reader.list_servers(&[]).await.expect("list").len(), 2);
}

#[tokio::test]
async fn a_server_uid_finds_its_current_machine_after_a_delete_and_a_create_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = build_provider(&config(dir.path(), "uids")).expect("build");
    let first = p.ensure_server(&request("u1")).await.expect("create");
    let other = p.ensure_server(&request("u2")).await.expect("create");
    assert_eq!(p.ensure_server(&request("u1")).await.expect("ensure again").provider_id, first.provider_id, "found, not made twice");
    p.delete_server(&first.provider_id).await.expect("delete");
    assert!(p.find_server(&request("u1").identity).await.expect("find").is_none(), "a deleted machine is not found by its uid");
    let again = p.ensure_server(&request("u1")).await.expect("create again");
    assert_ne!(again.provider_id, first.provider_id);
    assert_eq!(p.find_server(&request("u1").identity).await.expect("find").map(|o| o.provider_id), Some(again.provider_id));
    assert_eq!(p.find_server(&request("u2").identity).await.expect("find").map(|o| o.provider_id), Some(other.provider_id));
}

#[tokio::test]
async fn simulated_passes_the_endpoint_contract_for_load_balancers_and_floating_ips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config(dir.path(), "sim-ep")).expect("build");
    let a = provider.ensure_server(&request("ep-a")).await.expect("machine a").provider_id;
    let b = provider.ensure_server(&request("ep-b")).await.expect("machine b").provider_id;
    let opts = ContractOptions {
        run_id: "ep".into(),
        namespace: "contract".into(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: false,
        deadline: Duration::from_secs(10),
    };
    for kind in [provisioning_providers::EndpointKind::LoadBalancer, provisioning_providers::EndpointKind::FloatingIp] {
        provisioning_providers::contract::endpoint(provider.as_ref(), kind, &[a.clone(), b.clone()], &opts)
            .await
            .expect("endpoint contract");
    }
    // The journal (the tests' oracle) holds each endpoint's creation, re-targeting and deletion.
    let journal = std::fs::read_to_string(dir.path().join("simulated-sim-ep.jsonl")).expect("journal");
    assert_eq!(journal.matches("\"op\":\"endpoint-delete\"").count(), 2, "{journal}");
    assert!(journal.contains("\"kind\":\"LoadBalancer\"") && journal.contains("\"kind\":\"FloatingIp\""), "{journal}");
}
