//! One hostile endpoint cannot fill the controller's budget for provider answers (issue 26,
//! twentieth re-review N6, twenty-first M2): answers being read used to hold at most 64 MiB
//! together, and a Workspace author who points accounts at an endpoint that sends 8 MiB and
//! then stalls, nine times at once, held all of it — every other account's answers over
//! 64 KiB then failed. Now answers of endpoints a Workspace names have a budget apart from the
//! providers' public endpoints, and one tenant (namespace) holds at most 8 MiB of it.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use provisioning_providers::{Credentials, ProviderConfig, build_provider};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

const CHUNK: usize = 64 << 10;

/// 8 MiB less one chunk of a DescribeInstances answer, then nothing (the answer never ends).
async fn stalling(_req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let head = b"<DescribeInstancesResponse><reservationSet>".to_vec();
    let chunks = futures::StreamExt::chain(
        futures::stream::iter((0..(8 << 20) / CHUNK - 1).map(move |i| {
            let mut chunk = b" ".repeat(CHUNK);
            if i == 0 {
                chunk[..head.len()].copy_from_slice(&head);
            }
            Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
        })),
        futures::stream::pending(),
    );
    Ok(Response::builder().status(200).header("content-type", "application/xml").body(StreamBody::new(chunks).boxed()).unwrap_or_default())
}

/// A valid DescribeInstances answer of about 1 MiB.
async fn ordinary(_req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let items = "<item><instancesSet/></item>".repeat(36_000);
    let page = format!("<DescribeInstancesResponse><reservationSet>{items}</reservationSet></DescribeInstancesResponse>");
    let body = http_body_util::Full::new(Bytes::from(page)).map_err(|never| match never {}).boxed();
    Ok(Response::builder().status(200).header("content-type", "application/xml").body(body).unwrap_or_default())
}

async fn serve<F, Fut>(ip: &str, handler: F) -> Result<String, std::io::Error>
where
    F: Fn(Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(handler)).await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

fn aws(endpoint: &str, tenant: &str, key: usize) -> ProviderConfig {
    ProviderConfig {
        name: format!("share-{key}"),
        tenant: tenant.into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                // A different access key each: each is an account of its own, with its own limits.
                ("AWS_ACCESS_KEY_ID".to_string(), format!("AKIASHARESHARE{key:06}")),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "share-secret".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalling_endpoint_cannot_fill_the_answer_budget_for_other_accounts() -> TestResult {
    let hostile = serve("127.0.0.2", stalling).await?;
    let honest = serve("127.0.0.1", ordinary).await?;

    // Nine accounts of one namespace at the hostile endpoint list their machines at once.
    let mut readers = Vec::new();
    for key in 0..9 {
        let provider = build_provider(&aws(&hostile, "hostile", key))?;
        readers.push(tokio::spawn(async move { provider.list_servers(&[]).await.map(|_| ()) }));
    }
    // Until what they hold stops growing (each answer is read as fast as it arrives).
    let started = Instant::now();
    let tenants = provisioning_providers::ratelimit::AnswerSource::Tenant(String::new());
    let mut last = u32::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = provisioning_providers::ratelimit::answers_held_kib(&tenants);
        if held == last && held > 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the stalling answers were not read (held {held} KiB)");
        last = held;
    }
    let held = provisioning_providers::ratelimit::answers_held_kib(&tenants);
    eprintln!("the hostile endpoint's answers hold {held} KiB of the budget");
    assert!(held <= 8 << 10, "one tenant's endpoint holds {held} KiB, more than its share of the budget");

    // Another tenant's account, at its own endpoint, still reads an answer of 1 MiB.
    let provider = build_provider(&aws(&honest, "honest", 100))?;
    let servers = provider.list_servers(&[]).await.map_err(|e| format!("the ordinary account's 1 MiB answer failed: {e}"))?;
    assert!(servers.is_empty(), "{servers:?}");
    for reader in readers {
        reader.abort();
    }
    Ok(())
}
