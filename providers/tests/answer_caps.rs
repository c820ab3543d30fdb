//! A cloud endpoint is whatever a Workspace account names (issue 26, fifteenth re-review N2):
//! an answer of 64 MiB, or an error document of megabytes, must not be buffered whole. The
//! aws and UpCloud providers read at most 8 MiB of an answer (refused beyond, a Permanent
//! error naming the cap; for EC2 all pages of one call together) and keep 16 KiB of an
//! error's text.
//!
//! A tiny HTTP server on 127.0.0.1 streams the answers (generated chunk by chunk, so only the
//! client's side is measured). One test per binary: the process's peak memory (VmHWM, reset
//! before the phase) is the measurement.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use provisioning_providers::{Credentials, ProviderConfig, ProviderError, build_provider};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const HUGE: usize = 64 << 20;
const CHUNK: usize = 64 << 10;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// 200 with 64 MiB of `x` for every request, or 400 with a 4 MiB error message when the path
/// holds `error`.
async fn handle(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if req.uri().path().contains("latin1") {
        // Not UTF-8: converted lossily each invalid byte would become three.
        let body = http_body_util::Full::new(Bytes::from(vec![0xFFu8; 100_000])).map_err(|never| match never {}).boxed();
        return Ok(Response::builder().status(200).header("content-type", "application/xml").body(body).unwrap_or_default());
    }
    if req.uri().path().contains("small") {
        let body = http_body_util::Full::new(Bytes::from_static(
            b"<Response><Errors><Error><Code>Unavailable</Code><Message>small</Message></Error></Errors></Response>",
        ))
        .map_err(|never| match never {})
        .boxed();
        return Ok(Response::builder().status(400).header("content-type", "application/xml").body(body).unwrap_or_default());
    }
    if req.uri().path().contains("tinypages") || req.uri().path().contains("samepages") {
        // Tiny valid pages that always say more follow: with a new token each, or the same one.
        static PAGE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let token = if req.uri().path().contains("same") { 0 } else { PAGE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
        let page = format!("<DescribeInstancesResponse><reservationSet/><nextToken>t{token}</nextToken></DescribeInstancesResponse>");
        let body = http_body_util::Full::new(Bytes::from(page)).map_err(|never| match never {}).boxed();
        return Ok(Response::builder().status(200).header("content-type", "application/xml").body(body).unwrap_or_default());
    }
    if req.uri().path().contains("pages") {
        // A valid DescribeInstances page of ~1 MiB that always says more follow (a new token each).
        static PAGE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let token = PAGE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let items = "<item><instancesSet/></item>".repeat(36_000);
        let page = format!(
            "<DescribeInstancesResponse><reservationSet>{items}</reservationSet><nextToken>more{token}</nextToken></DescribeInstancesResponse>"
        );
        let body = http_body_util::Full::new(Bytes::from(page)).map_err(|never| match never {}).boxed();
        return Ok(Response::builder().status(200).header("content-type", "application/xml").body(body).unwrap_or_default());
    }
    let error = req.uri().path().contains("error");
    let (status, total) = if error { (400, 4 << 20) } else { (200, HUGE) };
    let prefix = if error { "<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>" } else { "" };
    let suffix = if error { "</Message></Error></Errors><RequestID>caps</RequestID></Response>" } else { "" };
    let last = total / CHUNK - 1;
    let chunks = futures::stream::iter((0..total / CHUNK).map(move |i| {
        let mut chunk = vec![b'x'; CHUNK];
        if i == 0 {
            chunk[..prefix.len()].copy_from_slice(prefix.as_bytes());
        }
        if i == last {
            chunk[CHUNK - suffix.len()..].copy_from_slice(suffix.as_bytes());
        }
        Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))
    }));
    let body = StreamBody::new(chunks).boxed();
    Ok(Response::builder().status(status).header("content-type", "application/xml").body(body).unwrap_or_default())
}

async fn serve() -> Result<String, std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(handle)).await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .unwrap_or(0)
}

fn aws(endpoint: &str) -> ProviderConfig {
    ProviderConfig {
        name: "caps".into(),
        provider_type: "aws".into(),
        region: "eu-north-1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIACAPSCAPSCAPS0001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "caps-secret".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

fn upcloud(endpoint: &str) -> ProviderConfig {
    ProviderConfig {
        name: "caps".into(),
        provider_type: "upcloud".into(),
        zone: "de-fra1".into(),
        endpoint: endpoint.into(),
        credentials: Credentials(
            [("UPCLOUD_USERNAME".to_string(), "caps".to_string()), ("UPCLOUD_PASSWORD".to_string(), "caps-password".to_string())].into(),
        ),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_answers_are_refused_not_buffered_and_error_text_is_clipped() -> TestResult {
    let endpoint = serve().await?;
    let identity = provisioning_providers::ServerIdentity { uid: "u-1".into(), namespace: "n".into(), name: "s".into(), cluster: None };
    // Warm up (clients, TLS, threads) on small answers, so that what follows measures reading.
    for config in [aws(&format!("{endpoint}/small")), upcloud(&format!("{endpoint}/small"))] {
        let _ = build_provider(&config)?.find_server(&identity).await;
    }
    // First (memory an earlier phase freed would hide what this one reads): a look-up of one
    // machine stops reading at its cap: 64 MiB streamed, refused as over 256 KiB.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let base = status_kib("VmRSS:") / 1024;
    for config in [aws(&endpoint), upcloud(&endpoint)] {
        let error = build_provider(&config)?.find_server(&identity).await.err().ok_or("a 64 MiB look-up answer was accepted")?;
        assert!(error.to_string().contains("larger than 256 KiB"), "{error}");
    }
    let lookups_grew = (status_kib("VmHWM:") / 1024).saturating_sub(base);
    eprintln!("two 64 MiB look-up answers refused: peak +{lookups_grew} MiB");
    assert!(lookups_grew < 6, "a look-up read past its cap: peak +{lookups_grew} MiB");

    std::fs::write("/proc/self/clear_refs", "5")?;
    let base = status_kib("VmRSS:") / 1024;
    for config in [aws(&endpoint), upcloud(&endpoint)] {
        let provider = build_provider(&config)?;
        let started = std::time::Instant::now();
        let result = provider.list_servers(&[]).await;
        let error = result.err().ok_or("a 64 MiB answer was accepted")?;
        eprintln!("{}: {error} after {:?}", config.provider_type, started.elapsed());
        assert!(matches!(error, ProviderError::Permanent(_)), "{error:?}");
        assert!(error.to_string().contains("larger than 8192 KiB"), "{error}");
    }
    let grew = (status_kib("VmHWM:") / 1024).saturating_sub(base);
    eprintln!("two 64 MiB answers refused: peak +{grew} MiB");
    assert!(grew < 32, "reading was not capped: peak +{grew} MiB");

    // Pages of 1 MiB without end: refused once they pass the cap together.
    let provider = build_provider(&aws(&format!("{endpoint}/pages")))?;
    let error = provider.list_servers(&[]).await.err().ok_or("endless pages were accepted")?;
    // (the last page is read only up to what is left of the call's cap)
    assert!(matches!(error, ProviderError::Permanent(_)) && error.to_string().contains("larger than"), "{error}");
    // A look-up of one machine expects a few KiB: refused at 256 KiB.
    let error = provider.find_server(&identity).await.err().ok_or("a 1 MiB look-up answer was accepted")?;
    assert!(error.to_string().contains("larger than 256 KiB"), "{error}");

    // Tiny pages without end (twenty-first re-review M3): refused after a number of pages, not
    // after the bytes of days of pages; a token sent twice is refused at once.
    let provider = build_provider(&aws(&format!("{endpoint}/tinypages")))?;
    let error = provider.list_servers(&[]).await.err().ok_or("endless tiny pages were accepted")?;
    assert!(error.to_string().contains("more than 200 pages"), "{error}");
    let error = provider.find_server(&identity).await.err().ok_or("endless tiny look-up pages were accepted")?;
    assert!(error.to_string().contains("more than 20 pages"), "{error}");
    let provider = build_provider(&aws(&format!("{endpoint}/samepages")))?;
    let error = provider.list_servers(&[]).await.err().ok_or("a repeated token was followed")?;
    assert!(error.to_string().contains("the same nextToken twice"), "{error}");

    // An answer that is not UTF-8 is refused, not converted.
    let error =
        build_provider(&aws(&format!("{endpoint}/latin1")))?.find_server(&identity).await.err().ok_or("a non-UTF-8 answer was accepted")?;
    assert!(error.to_string().contains("not UTF-8"), "{error}");

    // A well-formed error document with a 4 MiB message: what is kept of it is clipped.
    let error_endpoint = format!("{endpoint}/error");
    let provider = build_provider(&aws(&error_endpoint))?;
    let error = provider.list_servers(&[]).await.err().ok_or("an error answer was accepted")?;
    let text = error.to_string();
    eprintln!("error answer: {} bytes of message", text.len());
    assert!(text.len() < 20 << 10, "the error text is {} bytes", text.len());
    Ok(())
}
