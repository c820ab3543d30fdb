//! Hostile inputs against every decoder that takes outside input (issue 26, "bounded-resource
//! tests"): JSON, YAML, JSON/merge/strategic-merge patches, server-side apply, protobuf, query
//! strings. A corpus of known-bad bodies, then a seeded mutation fuzz run for a bounded time
//! (`PROVISIONING_FUZZ_SECS`, default 15; `PROVISIONING_FUZZ_SEED` replays a run). Each request
//! must get an answer below 500 (a clear 4xx, or 2xx for what happens to be valid), the server
//! must answer the next request, and the process's memory must stay bounded.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::client::Body;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CM: &str = "/api/v1/namespaces/default/configmaps";
const JSON: &str = "application/json";
const YAML: &str = "application/yaml";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";
const PROTO: &str = "application/vnd.kubernetes.protobuf";

/// One hostile request: method, path (with query), content type, body.
struct Case {
    name: String,
    method: &'static str,
    path: String,
    ctype: &'static str,
    body: Vec<u8>,
}

fn case(name: &str, method: &'static str, path: &str, ctype: &'static str, body: impl Into<Vec<u8>>) -> Case {
    Case { name: name.into(), method, path: path.into(), ctype, body: body.into() }
}

fn target() -> String {
    format!("{CM}/target")
}

#[allow(clippy::too_many_lines, reason = "a data table: one hostile input per entry")]
fn corpus() -> Vec<Case> {
    let deep_array = "[".repeat(100_000);
    let deep_object = format!("{}{}", r#"{"a":"#.repeat(5_000), "1");
    let laughs = {
        let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            y.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n", p = i - 1));
        }
        y
    };
    let cm = |data: &str| format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"fuzz"}},"data":{data}}}"#);
    let many_ops: String = format!("[{}]", vec![r#"{"op":"add","path":"/data/k","value":"v"}"#; 20_000].join(","));
    let copy_bomb: String = format!(
        "[{}]",
        (0..40).map(|i| format!(r#"{{"op":"copy","from":"/data","path":"/metadata/annotations/c{i}"}}"#)).collect::<Vec<_>>().join(",")
    );
    vec![
        case("deep JSON array", "POST", CM, JSON, deep_array.clone()),
        case("deep JSON object", "POST", CM, JSON, deep_object.clone()),
        case("huge number", "POST", CM, JSON, cm(r#"{"n":1e999999}"#)),
        case("number where a string goes", "POST", CM, JSON, cm(r#"{"n":12345678901234567890123456789}"#)),
        case("invalid UTF-8", "POST", CM, JSON, [cm(r#"{"k":""#).as_bytes(), &[0xff, 0xfe, 0x80], b"\"}}"].concat()),
        case("duplicate keys", "POST", CM, JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"d","name":"e"}}"#),
        case("unterminated", "POST", CM, JSON, r#"{"apiVersion":"v1","kind":"Con"#),
        case("wrong kind in body", "POST", CM, JSON, r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"w"}}"#),
        case("4 MiB body", "POST", CM, JSON, cm(&format!(r#"{{"k":"{}"}}"#, "x".repeat(4 << 20)))),
        case("YAML alias bomb", "POST", CM, YAML, laughs.clone()),
        case("deep YAML flow", "POST", CM, YAML, "[".repeat(100_000)),
        case(
            "YAML long string aliased",
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            YAML,
            format!("s: &s {}\nspec: {{resourceAttributes: {{verb: [{}]}}}}\n", "x".repeat(1_000_000), vec!["*s"; 2_000].join(",")),
        ),
        case("YAML merge keys", "POST", CM, YAML, "a: &a {k: v}\nb:\n  <<: [*a, *a, *a]\n  <<: *a\n"),
        case(
            "YAML foreign tags",
            "POST",
            CM,
            YAML,
            "apiVersion: v1\nkind: ConfigMap\nmetadata: !!python/object {name: t}\ndata: !!binary aGk=\n",
        ),
        case("YAML documents", "POST", CM, YAML, "---\n".repeat(50_000)),
        case("JSON patch: 20,000 ops", "PATCH", &target(), JSON_PATCH, many_ops),
        case("JSON patch: copy bomb", "PATCH", &target(), JSON_PATCH, copy_bomb),
        case("JSON patch: move root", "PATCH", &target(), JSON_PATCH, r#"[{"op":"move","from":"","path":"/data/x"}]"#),
        case("JSON patch: bad pointer", "PATCH", &target(), JSON_PATCH, r#"[{"op":"add","path":"data/~2/x","value":1}]"#),
        case(
            "JSON patch: test of a huge value",
            "PATCH",
            &target(),
            JSON_PATCH,
            format!(r#"[{{"op":"test","path":"/data","value":{deep_array}}}]"#),
        ),
        case("merge patch: null name", "PATCH", &target(), MERGE, r#"{"metadata":{"name":null}}"#),
        case("merge patch: deep", "PATCH", &target(), MERGE, format!(r#"{{"data":{deep_object}}}"#)),
        case("strategic: $patch delete", "PATCH", &target(), STRATEGIC, r#"{"$patch":"delete"}"#),
        case(
            "strategic: bad directives",
            "PATCH",
            &target(),
            STRATEGIC,
            r#"{"$retainKeys":5,"data":{"$setElementOrder/x":[1,2],"$deleteFromPrimitiveList/y":{}}}"#,
        ),
        case(
            "apply: no name",
            "PATCH",
            &format!("{}?fieldManager=fuzz", target()),
            APPLY,
            "apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n",
        ),
        case(
            "apply: managedFields garbage",
            "PATCH",
            &format!("{}?fieldManager=fuzz&force=true", target()),
            APPLY,
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: target, managedFields: [{manager: 5, fieldsV1: {f:x: []}}]}\n",
        ),
        case("apply: alias bomb", "PATCH", &format!("{}?fieldManager=fuzz", target()), APPLY, laughs),
        case("protobuf: garbage", "POST", CM, PROTO, vec![0x6b, 0x38, 0x73, 0x00, 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01]),
        case("protobuf: huge length", "POST", CM, PROTO, [&[0x6b, 0x38, 0x73, 0x00, 0x12][..], &[0xff; 9], &[0x01]].concat()),
        case("protobuf: no magic", "POST", CM, PROTO, b"\x0a\x02v1".to_vec()),
        case("bad label selector", "GET", &format!("{CM}?labelSelector=((((a"), JSON, ""),
        case("bad field selector", "GET", &format!("{CM}?fieldSelector=metadata.name==a,,,=="), JSON, ""),
        case("bad continue token", "GET", &format!("{CM}?limit=1&continue=%FF%FE"), JSON, ""),
        case("negative limit", "GET", &format!("{CM}?limit=-5"), JSON, ""),
        case("bad watch parameters", "GET", &format!("{CM}?watch=1&resourceVersion=abc&timeoutSeconds=-1"), JSON, ""),
        case("bad resourceVersionMatch", "GET", &format!("{CM}?resourceVersion=0&resourceVersionMatch=Sometimes"), JSON, ""),
        case("path traversal", "GET", "/api/v1/namespaces/default/configmaps/..%2f..%2fsecrets", JSON, ""),
        case("unknown content type", "POST", CM, "application/x-evil", "{}"),
    ]
}

/// A body over the server's 3 MiB limit is refused (413) before it is read, and the
/// connection closed; a client still writing the body may then see only the closed
/// connection (Go's and hyper's clients both can). That, and only for such a body, counts as
/// the refusal it is; every other request must be answered.
const OVER_LIMIT: usize = 3 * 1024 * 1024;

async fn send(client: &kube::Client, c: &Case) -> Result<u16, String> {
    match send_raw(client, c).await {
        Err(e) if c.body.len() > OVER_LIMIT && e.contains("SendRequest") => Ok(413),
        other => other,
    }
}

async fn send_raw(client: &kube::Client, c: &Case) -> Result<u16, String> {
    let mut builder = http::Request::builder().method(c.method).uri(&c.path);
    if !c.body.is_empty() || c.method != "GET" {
        builder = builder.header("content-type", c.ctype);
    }
    let req = builder.body(Body::from(c.body.clone())).map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(60), client.send(req)).await {
        Ok(Ok(resp)) => Ok(resp.status().as_u16()),
        Ok(Err(e)) => Err(format!("no answer: {e}")),
        Err(_) => Err("no answer within 60 s".into()),
    }
}

async fn ready(client: &kube::Client) -> Result<(), String> {
    let req = http::Request::builder().uri("/readyz").body(Body::empty()).map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(10), client.send(req)).await {
        Ok(Ok(r)) if r.status() == 200 => Ok(()),
        Ok(Ok(r)) => Err(format!("/readyz answered {}", r.status())),
        Ok(Err(e)) => Err(format!("/readyz: {e}")),
        Err(_) => Err("/readyz did not answer within 10 s".into()),
    }
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(0, |kib| kib / 1024)
}

async fn seed_target(client: &kube::Client) -> TestResult {
    let c = case("seed", "POST", CM, JSON, r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"target"},"data":{"a":"b"}}"#);
    let status = send(client, &c).await?;
    assert!(status == 201 || status == 409, "seeding the target: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_input_gets_a_clear_answer_and_the_server_stays_up() -> TestResult {
    let ts = start().await?;
    let client = client_no_retry(&ts.server.kubeconfig_path()).await?;
    seed_target(&client).await?;
    for c in corpus() {
        let status = send(&client, &c).await.map_err(|e| format!("{}: {e}", c.name))?;
        assert!((200..500).contains(&status), "{}: answered {status}", c.name);
        ready(&client).await.map_err(|e| format!("after {}: {e}", c.name))?;
    }
    // The refusals that must be refusals (a body that is valid is never among these).
    for name in [
        "deep JSON array",
        "YAML long string aliased",
        "huge number",
        "invalid UTF-8",
        "4 MiB body",
        "YAML alias bomb",
        "deep YAML flow",
        "JSON patch: copy bomb",
        "protobuf: huge length",
    ] {
        let c = corpus().into_iter().find(|c| c.name == name).ok_or("missing case")?;
        let status = send(&client, &c).await?;
        assert!((400..500).contains(&status), "{name}: answered {status}, want a 4xx");
    }
    ts.server.shutdown().await;
    Ok(())
}

/// Flips, cuts, repeats and inserts bytes of a corpus body.
fn mutate(rng: &mut StdRng, body: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    if b.len() > 1 << 16 {
        b.truncate(rng.random_range(0..1 << 16));
    }
    for _ in 0..rng.random_range(1..8) {
        let at = if b.is_empty() { 0 } else { rng.random_range(0..b.len()) };
        match rng.random_range(0..5) {
            0 if !b.is_empty() => b[at] = rng.random(),
            1 => b.truncate(at),
            2 if !b.is_empty() => {
                let end = (at + rng.random_range(1..64)).min(b.len());
                let piece = b[at..end].to_vec();
                for _ in 0..rng.random_range(1..32) {
                    b.splice(at..at, piece.iter().copied());
                }
            }
            3 => {
                let tokens: [&[u8]; 10] = [b"{", b"}", b"[", b"]", b"\"", b":", b",", b"*a", b"&a ", b"\\u0000"];
                let t = tokens[rng.random_range(0..tokens.len())];
                b.splice(at..at, t.iter().copied());
            }
            _ => b.insert(at, rng.random()),
        }
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_fuzz_run_never_gets_a_5xx_or_takes_the_server_down() -> TestResult {
    let secs: u64 = std::env::var("PROVISIONING_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let seed: u64 = std::env::var("PROVISIONING_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("fuzz seed {seed} for {secs} s (replay: PROVISIONING_FUZZ_SEED={seed})");
    let ts = start().await?;
    let client = client_no_retry(&ts.server.kubeconfig_path()).await?;
    seed_target(&client).await?;
    let corpus = corpus();
    // Warm up (schemas, caches) before taking the baseline.
    for c in &corpus {
        send(&client, c).await?;
    }
    let before = rss_mib();
    let mut rng = StdRng::seed_from_u64(seed);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut sent = 0u64;
    while Instant::now() < deadline {
        let base = &corpus[rng.random_range(0..corpus.len())];
        let c = Case {
            name: base.name.clone(),
            method: base.method,
            path: base.path.clone(),
            ctype: base.ctype,
            body: mutate(&mut rng, &base.body),
        };
        let status = send(&client, &c).await.map_err(|e| format!("seed {seed}, request {sent} (from {}): {e}", c.name))?;
        assert!(
            status < 500,
            "seed {seed}, request {sent} (from {}): answered {status}; body {:?}",
            c.name,
            String::from_utf8_lossy(&c.body[..c.body.len().min(200)])
        );
        sent += 1;
        if sent.is_multiple_of(50) {
            ready(&client).await.map_err(|e| format!("seed {seed} after {sent} requests: {e}"))?;
        }
    }
    ready(&client).await?;
    let after = rss_mib();
    eprintln!("{sent} mutated requests; RSS {before} MiB -> {after} MiB");
    assert!(sent > 0, "no request sent");
    assert!(after < before + 512, "memory grew from {before} to {after} MiB over {sent} requests (seed {seed})");
    ts.server.shutdown().await;
    Ok(())
}
