//! Memory spent decoding request bodies is bounded per body and for the whole process
//! (issue 26, re-review N1). A 3 MiB body could decode to gigabytes — YAML aliases of small
//! maps (2 GB from 3 MiB measured by the review), or plain JSON of nothing but tiny maps (~300
//! MB) — and any authenticated identity may send one to `selfsubjectaccessreviews`, which every
//! identity may create; 100 of them in flight per user. Now each body is refused beyond
//! 8 MiB + 64 bytes per byte of itself (413; 400 "excessive aliasing" for YAML), and the decodes in flight together stay within
//! the server's `decode_memory` (429 beyond, with Retry-After).
//!
//! One test per binary: the process's peak memory (VmHWM, reset before each phase) is the
//! measurement.

mod common;

use std::time::Duration;

use common::*;
use kube::client::Body;

const REVIEW: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
const CM: &str = "/api/v1/namespaces/default/configmaps";

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

async fn post(client: &kube::Client, path: &str, ctype: &str, body: Vec<u8>) -> Result<(u16, String), String> {
    let req = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", ctype)
        .body(Body::from(body))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(120), client.send(req))
        .await
        .map_err(|_| "no answer within 120 s".to_string())?
        .map_err(|e| format!("no answer: {e}"))?;
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
    Ok((code, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The review's bypass of the old node count: a comment to fill the body, one anchor of
/// 1,000 one-entry maps, referenced 3,140 times (~2 GB as values).
fn aliased_small_maps() -> Vec<u8> {
    let refs = vec!["*a"; 3140].join(",");
    let items = vec![r#"{"":~}"#; 1000].join(",");
    let doc = format!("a: &a [{items}]\nb: [{refs}]\n");
    format!("#{}\n{doc}", "x".repeat(3 * 1024 * 1024 - doc.len() - 64)).into_bytes()
}

/// 3 MiB of JSON that is nothing but one-entry maps (~300 MB as values).
fn tiny_maps() -> Vec<u8> {
    format!("[{}{{\"\":0}}]", r#"{"":0},"#.repeat(3 * 1024 * 1024 / 7 - 1)).into_bytes()
}

/// A valid body that decodes to ~50 MB: allowed alone, too much many at once.
fn long_list() -> Vec<u8> {
    format!("[{}0]", "0,".repeat(700_000)).into_bytes()
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

fn varint(mut v: usize, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or_default() | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or_default());
}

fn field(num: usize, bytes: &[u8], out: &mut Vec<u8>) {
    varint(num << 3 | 2, out);
    varint(bytes.len(), out);
    out.extend_from_slice(bytes);
}

/// A ConfigMap named `name` with `finalizers` empty finalizers, in Kubernetes' protobuf
/// envelope (`k8s\0`, runtime.Unknown{typeMeta, raw}); ObjectMeta name = 1, finalizers = 14.
fn protobuf_configmap(name: &str, finalizers: usize) -> Vec<u8> {
    let mut meta = Vec::new();
    field(1, name.as_bytes(), &mut meta);
    for _ in 0..finalizers {
        field(14, b"", &mut meta);
    }
    let mut cm = Vec::new();
    field(1, &meta, &mut cm);
    let mut type_meta = Vec::new();
    field(1, b"v1", &mut type_meta);
    field(2, b"ConfigMap", &mut type_meta);
    let mut unknown = Vec::new();
    field(1, &type_meta, &mut unknown);
    field(2, &cm, &mut unknown);
    [b"k8s\0".as_slice(), &unknown].concat()
}

/// A client authenticated as ServiceAccount default/tenant, bound to `edit` in default.
async fn tenant(admin: &kube::Client, kubeconfig: &std::path::Path) -> Result<kube::Client, Box<dyn std::error::Error + Send + Sync>> {
    let (code, text) =
        post(admin, "/api/v1/namespaces/default/serviceaccounts", "application/json", br#"{"metadata":{"name":"tenant"}}"#.to_vec())
            .await?;
    assert_eq!(code, 201, "{text}");
    let binding = br#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"tenant-edit"},
        "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"edit"},
        "subjects":[{"kind":"ServiceAccount","name":"tenant","namespace":"default"}]}"#;
    let (code, text) =
        post(admin, "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", "application/json", binding.to_vec()).await?;
    assert_eq!(code, 201, "{text}");
    let (code, text) = post(
        admin,
        "/api/v1/namespaces/default/serviceaccounts/tenant/token",
        "application/json",
        br#"{"spec":{"expirationSeconds":3600}}"#.to_vec(),
    )
    .await?;
    assert_eq!(code, 201, "{text}");
    let token: serde_json::Value = serde_json::from_str(&text)?;
    let token = token["status"]["token"].as_str().ok_or("no token")?;
    let lines: Vec<String> = std::fs::read_to_string(kubeconfig)?
        .lines()
        .map(|l| if l.trim_start().starts_with("token: ") { format!("    token: {token}") } else { l.to_string() })
        .collect();
    let dir = kubeconfig.parent().ok_or("no parent")?.join("tenant");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kubeconfig");
    std::fs::write(&path, lines.join("\n") + "\n")?;
    client_no_retry(&path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoding_costs_bounded_memory_per_body_and_per_process() -> TestResult {
    let limits = provisioning_apiserver::Limits { decode_memory: 160 * 1024 * 1024, ..Default::default() };
    let ts = start_with(limits).await?;
    // The admin (system:masters) is exempt from the shared budget, as from the flow caps; the
    // bodies below are sent by a tenant: a ServiceAccount with `edit` in default.
    let admin = client_no_retry(&ts.server.kubeconfig_path()).await?;
    let client = tenant(&admin, &ts.server.kubeconfig_path()).await?;
    // Warm up before the baseline.
    let (code, text) =
        post(&client, CM, "application/json", br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"w"}}"#.to_vec()).await?;
    assert_eq!(code, 201, "{text}");

    // 1. Amplifying bodies, four at once: each refused with 413 naming the limit; the
    //    process's peak grows by at most the per-body limit's share, not by gigabytes.
    let base = rss_mib();
    reset_peak()?;
    let mut sends = Vec::new();
    for (path, ctype, body) in [
        (REVIEW, "application/yaml", aliased_small_maps()),
        (REVIEW, "application/yaml", aliased_small_maps()),
        (CM, "application/json", tiny_maps()),
        (CM, "application/json", tiny_maps()),
    ] {
        let client = client.clone();
        sends.push(tokio::spawn(async move { post(&client, path, ctype, body).await }));
    }
    for s in sends {
        let (code, text) = s.await??;
        // YAML's is a 400 "excessive aliasing" as go-yaml's in kube-apiserver; JSON's a 413.
        assert!(code == 400 || code == 413 || code == 429, "an amplifying body answered {code}: {text}");
        assert!(text.contains("decodes to more than") || text.contains("budget"), "{text}");
    }
    let grew = peak_mib().saturating_sub(base);
    eprintln!("amplifying bodies from a tenant: RSS {base} MiB, peak +{grew} MiB");
    assert!(grew < 500, "decoding four amplifying bodies raised the peak by {grew} MiB");

    // 1b. The same from the exempt admin, outside the shared budget: each body stops at its
    //     own limit (8 MiB + 64 per byte), never its gigabytes.
    let base = rss_mib();
    reset_peak()?;
    for (path, ctype, body) in [(REVIEW, "application/yaml", aliased_small_maps()), (CM, "application/json", tiny_maps())] {
        let (code, text) = post(&admin, path, ctype, body).await?;
        assert!(code == 400 || code == 413, "an amplifying body answered {code}: {text}");
        assert!(text.contains("decodes to more than"), "{text}");
    }
    let grew = peak_mib().saturating_sub(base);
    eprintln!("amplifying bodies from the admin: RSS {base} MiB, peak +{grew} MiB");
    // Two bodies one after the other: each stops at ~200 MiB estimated; glibc may keep the
    // first one's freed memory in its thread's arena while the second runs on another.
    assert!(grew < 600, "decoding two amplifying bodies raised the peak by {grew} MiB");

    // 2. Many valid bodies of ~50 MB decoded each, at once: the ones beyond the 160 MiB budget
    //    get 429 with Retry-After, the rest decode (and are refused as not an object: 400).
    let base = rss_mib();
    reset_peak()?;
    let mut sends = Vec::new();
    for _ in 0..12 {
        let client = client.clone();
        sends.push(tokio::spawn(async move { post(&client, CM, "application/json", long_list()).await }));
    }
    let mut codes = Vec::new();
    for s in sends {
        let (code, text) = s.await??;
        assert!(code == 400 || code == 429, "answered {code}: {text}");
        codes.push(code);
    }
    let grew = peak_mib().saturating_sub(base);
    eprintln!("12 long lists at once: {codes:?}; RSS {base} MiB, peak +{grew} MiB");
    assert!(codes.contains(&400), "no body was decoded: {codes:?}");
    assert!(grew < 400, "twelve 50 MB decodes raised the peak by {grew} MiB");

    // 2b. The same from the exempt admin: decoded outside the shared budget, never a 429 (a
    //     tenant spending the budget cannot hold up the controller's writes).
    let mut sends = Vec::new();
    for _ in 0..12 {
        let admin = admin.clone();
        sends.push(tokio::spawn(async move { post(&admin, CM, "application/json", long_list()).await }));
    }
    for s in sends {
        let (code, text) = s.await??;
        assert_eq!(code, 400, "an exempt identity's body: {text}");
    }

    // 3. Protobuf bodies draw on the same budget: 1.5 million empty finalizers in 3 MB (~100
    //    MB as values) are charged up front, beyond the 160 MiB budget: 429, nothing decoded.
    let base = rss_mib();
    reset_peak()?;
    let (code, text) = post(&client, CM, PROTOBUF, protobuf_configmap("fins", 1_500_000)).await?;
    assert_eq!(code, 429, "{text}");
    assert!(text.contains("budget"), "{text}");
    let grew = peak_mib().saturating_sub(base);
    assert!(grew < 64, "a refused protobuf body raised the peak by {grew} MiB");
    let (code, text) = post(&client, CM, PROTOBUF, protobuf_configmap("few-fins", 1)).await?;
    assert_eq!(code, 201, "{text}");

    shaping_is_charged(&admin, &client).await?;

    // 4. The budget is given back: the server decodes and answers as before.
    let (code, text) = post(&client, CM, "application/json", long_list()).await?;
    assert_eq!(code, 400, "{text}");
    let (code, text) =
        post(&client, CM, "application/yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: after}\ndata: {a: b}\n".to_vec()).await?;
    assert_eq!(code, 201, "{text}");
    ts.server.shutdown().await;
    Ok(())
}

async fn shaping_is_charged(admin: &kube::Client, client: &kube::Client) -> TestResult {
    // 3b. Shaping stored objects draws on the same budget (third re-review, H1): a Table of a
    //     2.9 MB object would decode to up to 64 bytes per byte, beyond the 160 MiB budget: the
    //     tenant's list and get as a Table are refused before they start (429), its plain list is
    //     served, and the exempt admin's Table too.
    let big = format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big"}},"data":{{"a":"{}"}}}}"#, "x".repeat(2_900_000));
    let (code, text) = post(admin, CM, "application/json", big.into_bytes()).await?;
    assert_eq!(code, 201, "{text}");
    // A 2.9 MB Event is stored as core/v1; read as events.k8s.io/v1 it is decoded to be
    // converted (sixth re-review, M1): charged like a Table.
    let event = format!(
        r#"{{"apiVersion":"v1","kind":"Event","metadata":{{"name":"bigev"}},"involvedObject":{{"kind":"ConfigMap","name":"big"}},"reason":"R","message":"{}"}}"#,
        "x".repeat(2_900_000)
    );
    let (code, text) = post(admin, "/api/v1/namespaces/default/events", "application/json", event.into_bytes()).await?;
    assert_eq!(code, 201, "{}", &text[..text.len().min(300)]);
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    for (who, c, path, accept, want) in [
        ("tenant", client, "/apis/events.k8s.io/v1/namespaces/default/events/bigev".to_string(), "application/json", 429),
        ("tenant", client, "/api/v1/namespaces/default/events/bigev".to_string(), "application/json", 200),
        ("admin", admin, "/apis/events.k8s.io/v1/namespaces/default/events/bigev".to_string(), "application/json", 200),
        ("tenant", client, CM.to_string(), TABLE, 429),
        ("tenant", client, format!("{CM}/big"), TABLE, 429),
        ("tenant", client, CM.to_string(), "application/json", 200),
        ("admin", admin, CM.to_string(), TABLE, 200),
    ] {
        let req = http::Request::builder().uri(&path).header("accept", accept).body(kube::client::Body::empty())?;
        let resp = c.send(req).await?;
        let code = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await?.to_bytes();
        assert_eq!(code, want, "{who} GET {path} as {accept}: {}", String::from_utf8_lossy(&body[..body.len().min(300)]));
    }

    Ok(())
}
