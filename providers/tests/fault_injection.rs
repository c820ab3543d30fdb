//! Fault injection between the aws provider and moto: a proxy fails 20 % of calls (HTTP
//! 500/503, 429 with Retry-After, dropped connections, responses lost after the call took
//! effect). 100 Servers, 20 at a time, must converge to exactly 100 machines and, after
//! deletion, none. A lost create response must not make a second machine. Bad credentials
//! cost at most one call per backoff step. No secret appears in any error or Debug output.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use provisioning_providers::aws::AwsProvider;
use provisioning_providers::{
    Credentials, DeleteOutcome, Provider, ProviderConfig, ProviderError, ServerIdentity, ServerRequest, build_provider,
};
use support::fault_proxy::{FaultConfig, FaultProxy};
use support::moto::Moto;

const ACCESS_KEY: &str = "AKIAFAULTINJECT00001";
const SECRET_KEY: &str = "fault-injection-secret-key-value";
const SESSION_TOKEN: &str = "fault-injection-session-token-value";

fn config(name: &str, endpoint: &str, state_dir: &std::path::Path) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), ACCESS_KEY.to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), SECRET_KEY.to_string()),
                ("AWS_SESSION_TOKEN".to_string(), SESSION_TOKEN.to_string()),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), "ami-1e749f67".to_string())].into(),
        rate_limit: 500,
        state_dir: state_dir.to_path_buf(),
        // SSH to the managed group from one documentation address (never "any" by default).
        network: provisioning_providers::NetworkSettings { ssh_source_cidrs: vec!["203.0.113.7/32".into()], ..Default::default() },
        ..Default::default()
    }
}

fn request(namespace: &str, i: usize) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity {
            uid: format!("{namespace}-uid-{i:04}"),
            namespace: namespace.into(),
            name: format!("srv-{i}"),
            cluster: Some("fault".into()),
        },
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

fn assert_clean(text: &str) {
    for secret in [ACCESS_KEY, SECRET_KEY, SESSION_TOKEN] {
        assert!(!text.contains(secret), "a secret leaked into: {text}");
    }
}

/// What a controller does with a retryable error: requeue with a short delay.
async fn until_ok<T, F, Fut>(what: &str, errors: &Mutex<Vec<String>>, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ProviderError>>,
{
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                if let Ok(mut errors) = errors.lock() {
                    errors.push(format!("{e} {e:?}"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_servers_converge_through_twenty_percent_faults() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(&moto.endpoint, FaultConfig { failure_rate: 0.2, ..Default::default() }).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config("faulty", &proxy.endpoint, dir.path())).expect("build");
    // The observer reads moto directly: it sees the truth, not the proxy's failures.
    let observer = build_provider(&config("observer", &moto.endpoint, dir.path())).expect("build");
    let errors = Mutex::new(Vec::new());
    let namespace = "fault100";

    let ids: Vec<_> = futures::stream::iter(0..100)
        .map(|i| {
            let (provider, errors) = (&provider, &errors);
            async move {
                let req = request(namespace, i);
                until_ok("ensure", errors, || provider.ensure_server(&req)).await.provider_id
            }
        })
        .buffer_unordered(20)
        .collect()
        .await;
    let ns_tag = [("provisioning.dev/namespace".to_string(), namespace.to_string())];
    let machines = observer.list_servers(&ns_tag).await.expect("list");
    assert_eq!(machines.len(), 100, "exactly 100 machines");
    let mut uids: Vec<&String> = machines.iter().filter_map(|m| m.tags.get("provisioning.dev/server-uid")).collect();
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), 100, "one machine per Server");
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 100);
    // Ensuring again changes nothing.
    let req7 = request(namespace, 7);
    let again = until_ok("ensure again", &errors, || provider.ensure_server(&req7)).await;
    assert!(ids.contains(&again.provider_id));

    futures::stream::iter(ids.iter())
        .map(|id| {
            let (provider, errors) = (&provider, &errors);
            async move {
                let deadline = Instant::now() + Duration::from_secs(120);
                while until_ok("delete", errors, || provider.delete_server(id)).await != DeleteOutcome::Gone {
                    assert!(Instant::now() < deadline, "{id} never went away");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .buffer_unordered(20)
        .collect::<Vec<()>>()
        .await;
    assert!(observer.list_servers(&ns_tag).await.expect("list").is_empty(), "no machine left");

    let stats = &proxy.stats;
    let injected = stats.injected();
    let total = stats.requests.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "requests {total}, injected {injected} (500: {:?}, 503: {:?}, 429: {:?}, dropped: {:?}, lost responses: {:?}), RunInstances {}",
        stats.injected_500,
        stats.injected_503,
        stats.injected_429,
        stats.dropped_before,
        stats.dropped_after,
        stats.action("RunInstances")
    );
    assert!(injected as f64 > total as f64 * 0.1, "faults were injected: {injected} of {total}");
    assert!(stats.dropped_after.load(std::sync::atomic::Ordering::SeqCst) > 0, "some responses were lost");
    for error in errors.lock().expect("errors").iter() {
        assert_clean(error);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_response_makes_no_second_machine() {
    let moto = Moto::start();
    let proxy =
        FaultProxy::start(&moto.endpoint, FaultConfig { lose_first_response_of: Some("Action=RunInstances".into()), ..Default::default() })
            .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = build_provider(&config("lossy", &proxy.endpoint, dir.path())).expect("build");
    let observer = build_provider(&config("observer", &moto.endpoint, dir.path())).expect("build");
    let req = request("lost", 1);

    // The provider's own retry finds the machine by tag instead of creating it again.
    let first = provider.ensure_server(&req).await.expect("ensure survives a lost response");
    assert_eq!(proxy.stats.dropped_after.load(std::sync::atomic::Ordering::SeqCst), 1);
    // A restarted controller (a fresh provider) asking again gets the same machine.
    let restarted = build_provider(&config("lossy", &proxy.endpoint, dir.path())).expect("build");
    let second = restarted.ensure_server(&req).await.expect("ensure again");
    assert_eq!(first.provider_id, second.provider_id);
    assert_eq!(proxy.stats.action("RunInstances"), 1, "RunInstances was sent once");
    let machines = observer.list_servers(&req.identity.tags()).await.expect("list");
    assert_eq!(machines.len(), 1, "exactly one machine: {machines:?}");
    while provider.delete_server(&first.provider_id).await.expect("delete") != DeleteOutcome::Gone {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_permanent_and_cost_one_call_per_backoff_step() {
    // With INITIAL_NO_AUTH_ACTION_COUNT=0 moto checks credentials: unknown keys are refused.
    let moto = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]);
    let proxy = FaultProxy::start(&moto.endpoint, FaultConfig::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config("badcreds", &proxy.endpoint, dir.path());
    let provider = AwsProvider::new(&cfg).expect("build");

    let err = provider.validate_credentials().await.expect_err("refused");
    assert!(matches!(err, ProviderError::Auth(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(proxy.stats.requests.load(std::sync::atomic::Ordering::SeqCst), 1, "one call, no retries");
    // Until the backoff step ends, further calls fail without reaching the API.
    for i in 0..5 {
        let err = provider.ensure_server(&request("auth", i)).await.expect_err("still refused");
        assert!(matches!(err, ProviderError::Auth(_)), "{err:?}");
        assert_clean(&format!("{err} {err:?}"));
    }
    assert_eq!(proxy.stats.requests.load(std::sync::atomic::Ordering::SeqCst), 1, "no further calls");
    assert_clean(&format!("{err} {err:?} {provider:?} {cfg:?}"));
}
