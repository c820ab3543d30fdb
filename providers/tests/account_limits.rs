//! Per-account limits against local API doubles (moto for EC2, the UpCloud double), behind a
//! proxy that tells accounts apart by the principal each request authenticates as:
//! - one throttled account (429 / RequestLimitExceeded with Retry-After) never delays
//!   another, even when both tenants call their account by the same name;
//! - one cloud account used by two tenants under different names shares one limiter: the
//!   server's Retry-After holds back both;
//! - a Retry-After longer than the provider waits through goes back to the caller at once;
//! - calls in flight per account never exceed the cap, and each account has its own cap.
//!
//! Counted, not timed: the proxy counts requests and the most in flight at once per
//! principal; the only time bounds are deadlines and lower bounds set by Retry-After.

mod support;

use std::sync::Arc;
use std::time::Duration;

use provisioning_providers::aws::AwsProvider;
use provisioning_providers::upcloud::UpcloudProvider;
use provisioning_providers::{Credentials, Provider, ProviderConfig};
use support::limit_proxy::{EC2_THROTTLED, Hold, LimitProxy, ProxyConfig, Throttle};
use support::moto::Moto;
use upcloud_double::{DoubleConfig, UpcloudDouble};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn aws_config(name: &str, endpoint: &str, access_key: &str) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), access_key.to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), format!("secret-of-{access_key}")),
            ]
            .into(),
        ),
        network: provisioning_providers::NetworkSettings { ssh_source_cidrs: vec!["203.0.113.7/32".into()], ..Default::default() },
        ..Default::default()
    }
}

fn upcloud_config(name: &str, endpoint: &str, username: &str) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        provider_type: "upcloud".into(),
        zone: "de-fra1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [("UPCLOUD_USERNAME".to_string(), username.to_string()), ("UPCLOUD_PASSWORD".to_string(), format!("password-of-{username}"))]
                .into(),
        ),
        ..Default::default()
    }
}

/// Account A's first call is throttled with Retry-After 30 s; while A waits, account B (same
/// Workspace account name "prod", other credentials) makes `calls` calls well within the
/// deadline and A sends nothing more.
async fn throttled_a_never_delays_b(proxy: &LimitProxy, a: Arc<dyn Provider>, b: Arc<dyn Provider>, a_id: &str, b_id: &str) -> TestResult {
    // Warm the double up first (moto loads its EC2 backend on the first call: seconds on a
    // busy machine), so that the deadline below measures the limiter, not the cold start.
    b.list_servers(&[]).await?;
    let waiting = tokio::spawn(async move { a.list_servers(&[]).await });
    assert!(proxy.wait_for_requests(a_id, 1, Duration::from_secs(20)).await, "account A never called");
    let calls = 20;
    let b_calls = async {
        for _ in 0..calls {
            b.list_servers(&[]).await?;
        }
        Ok::<_, provisioning_providers::ProviderError>(())
    };
    // Without per-account limiters B would wait out A's 30 s pause.
    tokio::time::timeout(Duration::from_secs(20), b_calls).await.map_err(|_| "account B was held back by account A's throttling")??;
    let (a_stats, b_stats) = (proxy.stats(a_id), proxy.stats(b_id));
    assert_eq!(b_stats.requests, calls + 1, "{b_stats:?}");
    assert_eq!((a_stats.requests, a_stats.throttled), (1, 1), "A honours Retry-After: no second call while paused");
    assert!(!waiting.is_finished(), "A is still waiting out its Retry-After");
    waiting.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_throttled_account_never_delays_another_account() -> TestResult {
    let moto = Moto::start();
    let throttle = Throttle {
        principal: "AKIALIMITSTENANTA001".into(),
        status: 503,
        retry_after: Some("30".into()),
        body: EC2_THROTTLED.into(),
        first: None,
    };
    let proxy = LimitProxy::start(&moto.endpoint, ProxyConfig { throttle: Some(throttle), ..Default::default() }).await?;
    // Two tenants, each calling its own AWS account "prod".
    let a = provisioning_providers::build_provider(&aws_config("prod", &proxy.endpoint, "AKIALIMITSTENANTA001"))?;
    let b = provisioning_providers::build_provider(&aws_config("prod", &proxy.endpoint, "AKIALIMITSTENANTB001"))?;
    throttled_a_never_delays_b(&proxy, a, b, "AKIALIMITSTENANTA001", "AKIALIMITSTENANTB001").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upcloud_throttled_user_never_delays_another_user() -> TestResult {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let throttle = Throttle {
        principal: "limits-user-a".into(),
        status: 429,
        retry_after: Some("30".into()),
        body: r#"{"error":{"error_code":"TOO_MANY_REQUESTS","error_message":"slow down"}}"#.into(),
        first: None,
    };
    let config = ProxyConfig {
        throttle: Some(throttle),
        upstream_basic_auth: Some(("api-user".into(), "api-password".into())),
        ..Default::default()
    };
    let proxy = LimitProxy::start(&double.endpoint, config).await?;
    let a = provisioning_providers::build_provider(&upcloud_config("prod", &proxy.endpoint, "limits-user-a"))?;
    let b = provisioning_providers::build_provider(&upcloud_config("prod", &proxy.endpoint, "limits-user-b"))?;
    throttled_a_never_delays_b(&proxy, a, b, "limits-user-a", "limits-user-b").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_aws_account_under_two_names_shares_the_retry_after_pause() -> TestResult {
    let moto = Moto::start();
    let key = "AKIALIMITSSHARED0001";
    let throttle =
        Throttle { principal: key.into(), status: 503, retry_after: Some("2".into()), body: EC2_THROTTLED.into(), first: Some(1) };
    let proxy = LimitProxy::start(&moto.endpoint, ProxyConfig { throttle: Some(throttle), ..Default::default() }).await?;
    // Two tenants name the same cloud account differently.
    let x = Arc::new(AwsProvider::new(&aws_config("tenant-x-prod", &proxy.endpoint, key))?);
    let y = Arc::new(AwsProvider::new(&aws_config("tenant-y-main", &proxy.endpoint, key))?);
    assert!(Arc::ptr_eq(x.limiter(), y.limiter()), "one limiter for one cloud account");
    let first = {
        let x = x.clone();
        tokio::spawn(async move { x.list_servers(&[]).await })
    };
    assert!(proxy.wait_for_requests(key, 1, Duration::from_secs(20)).await, "no call arrived");
    // Once X has heard the answer (a call sent before that cannot be held back)…
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while y.limiter().paused_until().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "X never heard its throttling answer");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // …Y's call goes out only after the pause X was told to take.
    tokio::time::timeout(Duration::from_secs(20), y.list_servers(&[])).await??;
    tokio::time::timeout(Duration::from_secs(20), first).await???;
    let stats = proxy.stats(key);
    assert_eq!((stats.requests, stats.throttled), (3, 1), "{stats:?}");
    let throttled_at = stats.arrivals[0];
    for later in &stats.arrivals[1..] {
        assert!(later.duration_since(throttled_at) >= Duration::from_secs(2), "a call went out during the Retry-After pause: {stats:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_retry_after_goes_back_to_the_caller_without_further_calls() -> TestResult {
    let moto = Moto::start();
    let key = "AKIALIMITSLONGPAUSE1";
    let throttle =
        Throttle { principal: key.into(), status: 503, retry_after: Some("120".into()), body: EC2_THROTTLED.into(), first: None };
    let proxy = LimitProxy::start(&moto.endpoint, ProxyConfig { throttle: Some(throttle), ..Default::default() }).await?;
    let mut config = aws_config("long-pause", &proxy.endpoint, key);
    config.images = [("debian-12".to_string(), "ami-1e749f67".to_string())].into();
    let provider = provisioning_providers::build_provider(&config)?;
    let request = provisioning_providers::ServerRequest {
        identity: provisioning_providers::ServerIdentity {
            uid: "long-pause-uid-1".into(),
            namespace: "limits".into(),
            name: "srv-1".into(),
            cluster: None,
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
    };
    // Neither the create nor a later call sleeps through 120 s: both return `Throttled` with
    // the time left (the controller requeues after it), and only the first reached the cloud.
    for _ in 0..2 {
        let result = tokio::time::timeout(Duration::from_secs(20), provider.ensure_server(&request)).await?;
        assert!(
            matches!(&result, Err(provisioning_providers::ProviderError::Throttled { retry_after }) if *retry_after > Duration::from_secs(60)),
            "{result:?}"
        );
    }
    let listed = tokio::time::timeout(Duration::from_secs(20), provider.list_servers(&[])).await?;
    assert!(matches!(listed, Err(provisioning_providers::ProviderError::Throttled { .. })), "{listed:?}");
    assert_eq!(proxy.stats(key).requests, 1, "{:?}", proxy.stats(key));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_per_account_never_exceed_the_cap() -> TestResult {
    let moto = Moto::start();
    let cap = provisioning_providers::aws::MAX_IN_FLIGHT as u64;
    let calls = 3 * cap;
    // The proxy holds each request until the account has `cap` in flight (or made its last
    // calls): with a working cap exactly `cap` are ever in flight; without one, more arrive
    // while the first wait.
    let hold = Hold { target: cap, total: calls, patience: Duration::from_secs(20) };
    let proxy = LimitProxy::start(&moto.endpoint, ProxyConfig { hold: Some(hold), ..Default::default() }).await?;
    let (key_a, key_b) = ("AKIALIMITSINFLIGHTA1", "AKIALIMITSINFLIGHTB1");
    let a = provisioning_providers::build_provider(&aws_config("in-flight", &proxy.endpoint, key_a))?;
    let b = provisioning_providers::build_provider(&aws_config("in-flight", &proxy.endpoint, key_b))?;
    let mut tasks = Vec::new();
    for provider in [a, b] {
        for _ in 0..calls {
            let provider = provider.clone();
            tasks.push(tokio::spawn(async move { provider.list_servers(&[]).await }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await???;
    }
    for key in [key_a, key_b] {
        let stats = proxy.stats(key);
        assert_eq!(stats.requests, calls, "{key}: {stats:?}");
        assert_eq!(stats.max_in_flight, cap, "{key}: at most the cap in flight, and each account reaches its own cap");
    }
    Ok(())
}

#[tokio::test]
async fn upcloud_limiter_is_the_api_user_not_the_name() -> TestResult {
    let endpoint = "http://127.0.0.1:9/";
    let a = UpcloudProvider::new(&upcloud_config("tenant-x", endpoint, "shared-user"))?;
    let b = UpcloudProvider::new(&upcloud_config("tenant-y", endpoint, "shared-user"))?;
    let c = UpcloudProvider::new(&upcloud_config("tenant-x", endpoint, "other-user"))?;
    assert!(Arc::ptr_eq(a.limiter(), b.limiter()));
    assert!(!Arc::ptr_eq(a.limiter(), c.limiter()));
    assert!(!format!("{:?}", a.limiter()).contains("shared-user"));
    assert_eq!(a.limiter().limits().max_in_flight, provisioning_providers::upcloud::MAX_IN_FLIGHT);
    Ok(())
}
