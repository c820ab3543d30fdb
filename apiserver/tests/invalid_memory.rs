//! A body that is invalid in many places costs bounded memory and gets a bounded reply
//! (issue 26, twenty-first re-review item 1). A 3 MiB ConfigMap of ~280k bad labels asked
//! for one cause each: a 166 MB message, a 2.2 GB peak and a 364 MB reply. Now one `Invalid`
//! lists at most 100 causes (64 KiB of text) and one "... and more errors" entry, validators
//! stop walking once that is full, a NodePort Service reports a full port range once, and a
//! reply carries at most 50 Warning headers (4 KiB).
//!
//! One test per binary: the process's peak memory (VmHWM, reset before the phase) is the
//! measurement, and the phase that measures it runs first.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::client::Body;

const CM: &str = "/api/v1/namespaces/default/configmaps";
const SVC: &str = "/api/v1/namespaces/default/services";

fn peak_mib() -> u64 {
    status_kib("VmHWM:") / 1024
}

fn rss_mib() -> u64 {
    status_kib("VmRSS:") / 1024
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .unwrap_or(0)
}

/// Resets the peak to the current RSS (`echo 5 > /proc/self/clear_refs`).
fn reset_peak() -> TestResult {
    std::fs::write("/proc/self/clear_refs", "5")?;
    Ok(())
}

/// Status code, body and the number of Warning headers of one request.
async fn send(client: &kube::Client, method: &str, path: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>, usize), String> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(300), client.send(req))
        .await
        .map_err(|_| "no answer within 300 s".to_string())?
        .map_err(|e| format!("no answer: {e}"))?;
    let code = resp.status().as_u16();
    let warnings = resp.headers().get_all("warning").iter().count();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
    Ok((code, bytes.to_vec(), warnings))
}

/// The review's body: a ConfigMap of as many labels `"-N":"-"` (key and value both invalid) as
/// fit in 3 MiB.
fn many_bad_labels() -> (Vec<u8>, usize) {
    let mut labels = String::new();
    let mut n = 0usize;
    while labels.len() < 3 * 1024 * 1024 - 200 {
        if n > 0 {
            labels.push(',');
        }
        labels.push_str(&format!("\"-{n}\":\"-\""));
        n += 1;
    }
    let body = format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"labels","labels":{{{labels}}}}}}}"#);
    (body.into_bytes(), n)
}

/// A NodePort Service with as many ports (no nodePort: each asks for one) as fit in 3 MiB.
fn many_node_ports() -> (Vec<u8>, usize) {
    let mut ports = String::new();
    let mut n = 0usize;
    while ports.len() < 3 * 1024 * 1024 - 200 {
        if n > 0 {
            ports.push(',');
        }
        ports.push_str(&format!("{{\"port\":{}}}", n % 65535 + 1));
        n += 1;
    }
    let body =
        format!(r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"ports"}},"spec":{{"type":"NodePort","ports":[{ports}]}}}}"#);
    (body.into_bytes(), n)
}

fn causes(status: &serde_json::Value) -> Vec<serde_json::Value> {
    status["details"]["causes"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_validation_errors_cost_bounded_memory_and_reply() -> TestResult {
    let ts = start().await?;
    let admin = client_no_retry(&ts.server.kubeconfig_path()).await?;
    let (code, text, _) =
        send(&admin, "POST", CM, br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"warm"}}"#.to_vec()).await?;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&text));

    // 1. ~280k invalid labels: 422, a reply well under 1 MiB, and a small peak (the body's own
    //    decode is ~50 MB; the old code peaked 2.2 GB above it).
    let (body, labels) = many_bad_labels();
    let base = rss_mib();
    reset_peak()?;
    let (code, reply, _) = send(&admin, "POST", CM, body).await?;
    let grew = peak_mib().saturating_sub(base);
    eprintln!("{labels} bad labels: {code}, reply {} bytes, RSS {base} MiB, peak +{grew} MiB", reply.len());
    assert_eq!(code, 422, "{}", String::from_utf8_lossy(&reply[..reply.len().min(2000)]));
    assert!(reply.len() < 1024 * 1024, "the reply is {} bytes", reply.len());
    let status: serde_json::Value = serde_json::from_slice(&reply)?;
    let listed = causes(&status);
    assert!(listed.len() <= 100, "{} causes listed", listed.len());
    let last = listed.last().and_then(|c| c["message"].as_str()).unwrap_or_default();
    assert!(last.contains("more errors"), "the last cause does not say more were found: {last}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("ConfigMap \"labels\" is invalid: [metadata.labels: Invalid value: \"-0\""),
        "{}",
        &message[..message.len().min(300)]
    );
    assert!(grew < 400, "validating {labels} bad labels raised the peak by {grew} MiB");

    // 2. A NodePort Service asking for ~280k node ports: the range (2,768) is full once, and
    //    that is one cause, not one per port beyond it.
    let (body, ports) = many_node_ports();
    let started = Instant::now();
    let (code, reply, _) = send(&admin, "POST", SVC, body).await?;
    eprintln!("{ports} node ports: {code} in {:?}, reply {} bytes", started.elapsed(), reply.len());
    assert_eq!(code, 422, "{}", String::from_utf8_lossy(&reply[..reply.len().min(2000)]));
    let status: serde_json::Value = serde_json::from_slice(&reply)?;
    let full = causes(&status).iter().filter(|c| c["message"].as_str().is_some_and(|m| m.contains("range of valid ports is full"))).count();
    assert_eq!(full, 1, "{}", &reply.len());
    // A wide margin: 0.5 s here, while the old code had not answered after 300 s.
    assert!(started.elapsed() < Duration::from_secs(60), "{ports} node ports took {:?}", started.elapsed());
    assert!(reply.len() < 64 * 1024, "the reply is {} bytes", reply.len());

    // 3. A custom resource with 20,000 unknown fields, in Warn mode (the default): created, with
    //    at most 50 Warning headers (the old code sent 20,000; clients refuse over 100).
    install_crd(&admin).await?;
    let unknown: Vec<String> = (0..20_000).map(|i| format!("\"u{i}\":1")).collect();
    let body = format!(
        r#"{{"apiVersion":"provisioning.dev/v1alpha1","kind":"Server","metadata":{{"name":"warned"}},"spec":{{"plan":"small",{}}}}}"#,
        unknown.join(",")
    );
    let (code, reply, warnings) =
        send(&admin, "POST", "/apis/provisioning.dev/v1alpha1/namespaces/default/servers", body.into_bytes()).await?;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&reply[..reply.len().min(2000)]));
    assert!((1..=50).contains(&warnings), "{warnings} Warning headers");

    // 4. The server answers as before.
    let (code, text, _) =
        send(&admin, "POST", CM, br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"after","labels":{"-bad":"x"}}}"#.to_vec())
            .await?;
    assert_eq!(code, 422, "{}", String::from_utf8_lossy(&text));
    let status: serde_json::Value = serde_json::from_slice(&text)?;
    assert_eq!(causes(&status).len(), 1, "{status}");
    ts.server.shutdown().await;
    Ok(())
}
