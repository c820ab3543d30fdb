//! Limits that hold, as kube-apiserver has them, and abuse that stays on 127.0.0.1 and ends
//! by itself: a JSON Patch bomb, metadata that is not a map of strings, a deep object,
//! thousands of idle TLS connections, a header that never ends, a watch flood, a reader that
//! stops reading, a resourceVersion from the future, a store that cannot commit. After each,
//! the next honest request is answered within 1 s and nothing stored is lost.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The honest request after each abuse: a get answered within 1 s, and every ConfigMap
/// written so far still there.
async fn honest(client: &kube::Client, want: usize) -> TestResult {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    let cm = cms.get("keep-0").await?;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "honest get took {took:?}");
    assert_eq!(cm.data.unwrap_or_default().get("k").map(String::as_str), Some("v"));
    let n = cms.list(&ListParams::default().labels("keep=yes")).await?.items.len();
    assert_eq!(n, want, "objects lost");
    Ok(())
}

async fn seed(client: &kube::Client, n: usize) -> TestResult {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..n {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("keep-{i}"), "labels": {"keep": "yes"}}, "data": {"k": "v"}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    Ok(())
}

fn nested(levels: usize) -> Value {
    let mut v = json!("bottom");
    for _ in 0..levels {
        v = json!({"n": v});
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_bomb_bad_metadata_and_deep_objects_are_refused() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    seed(&client, 3).await?;
    let path = "/api/v1/namespaces/default/configmaps/keep-1";

    // The bomb from the issue: one add, then `copy` of /metadata/annotations into itself.
    for copies in [18, 22] {
        let mut ops = vec![json!({"op": "add", "path": "/metadata/annotations", "value": {"a": "x".repeat(64)}})];
        for i in 0..copies {
            ops.push(json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/c{i}")}));
        }
        let (code, body) = raw(&client, "PATCH", path, "application/json-patch+json", serde_json::to_vec(&ops)?).await?;
        assert_eq!(code, 422, "{copies} copies: {body}");
        assert!(body["message"].as_str().unwrap_or_default().contains("3145728 bytes"), "{body}");
        honest(&client, 3).await?;
    }
    // Too many operations.
    let ops: Vec<Value> = (0..10_001).map(|_| json!({"op": "test", "path": "/kind", "value": "ConfigMap"})).collect();
    let (code, body) = raw(&client, "PATCH", path, "application/json-patch+json", serde_json::to_vec(&ops)?).await?;
    assert_eq!(code, 413, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("maximum operations in a JSON patch is 10000"), "{body}");
    // A few copies that stay under the copy limit but make annotation values maps: the same
    // metadata validation as a create, whatever the patch type.
    let ops = json!([{"op": "add", "path": "/metadata/annotations", "value": {"a": "x"}},
        {"op": "copy", "from": "/metadata/annotations", "path": "/metadata/annotations/nested"}]);
    let (code, body) = raw(&client, "PATCH", path, "application/json-patch+json", serde_json::to_vec(&ops)?).await?;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("annotation values must be strings"), "{body}");
    for (ct, patch) in [
        ("application/merge-patch+json", json!({"metadata": {"annotations": {"m": {"x": "y"}}}})),
        ("application/strategic-merge-patch+json", json!({"metadata": {"labels": {"bad label": "x"}}})),
        ("application/merge-patch+json", json!({"metadata": {"annotations": {"big": "x".repeat(300 * 1024)}}})),
    ] {
        let (code, body) = raw(&client, "PATCH", path, ct, serde_json::to_vec(&patch)?).await?;
        assert_eq!(code, 422, "{ct} {patch:.80}: {body}");
    }
    // Server-side apply is checked the same way.
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep-1", "annotations": {"m": {"x": "y"}}}});
    let (code, body) =
        raw(&client, "PATCH", &format!("{path}?fieldManager=abuse"), "application/apply-patch+yaml", serde_json::to_vec(&applied)?).await?;
    assert_eq!(code, 422, "{body}");
    // Creates too.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "badmeta", "annotations": {"a": 1}}});
    let (code, body) = raw(&client, "POST", "/api/v1/namespaces/default/configmaps", "application/json", serde_json::to_vec(&cm)?).await?;
    assert_eq!(code, 422, "{body}");
    honest(&client, 3).await?;

    // Depth: 64 levels is the limit, with a clear message; an object at the limit stays
    // readable by kube-rs in a list.
    let deep = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "extra": nested(100)});
    let (code, body) =
        raw(&client, "POST", "/api/v1/namespaces/default/configmaps", "application/json", serde_json::to_vec(&deep)?).await?;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("more than the limit of 64"), "{body}");
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep-ok", "labels": {"keep": "yes"}}, "data": {"k": "v"}, "extra": nested(62)});
    let (code, body) = raw(&client, "POST", "/api/v1/namespaces/default/configmaps", "application/json", serde_json::to_vec(&ok)?).await?;
    assert_eq!(code, 201, "{body}");
    let any = kube::core::ApiResource::erase::<ConfigMap>(&());
    let dynamic: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &any);
    assert_eq!(dynamic.list(&ListParams::default()).await?.items.len(), 4);
    // A patch cannot make it deeper than the limit either.
    let ops = json!([{"op": "add", "path": "/extra2", "value": nested(70)}]);
    let (code, body) = raw(&client, "PATCH", path, "application/json-patch+json", serde_json::to_vec(&ops)?).await?;
    assert_eq!(code, 422, "{body}");
    honest(&client, 4).await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_version_from_the_future_is_504() -> TestResult {
    let ts = start().await?;
    // kube-rs retries 504 (as client-go does); this test wants to see the answer itself.
    let client = client_no_retry(&ts.server.kubeconfig_path()).await?;
    seed(&client, 1).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rv: u64 = cms.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default().parse()?;
    let ahead = rv + 1000;
    for path in [
        format!("/api/v1/namespaces/default/configmaps?resourceVersion={ahead}"),
        format!("/api/v1/namespaces/default/configmaps?resourceVersion={ahead}&resourceVersionMatch=NotOlderThan"),
        format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={ahead}"),
    ] {
        let t = Instant::now();
        let (code, body) = raw(&client, "GET", &path, "", vec![]).await?;
        assert_eq!(code, 504, "{path}: {body}");
        assert_eq!(body["reason"], "Timeout");
        assert_eq!(body["details"]["causes"][0]["reason"], "ResourceVersionTooLarge", "{body}");
        assert!(body["message"].as_str().unwrap_or_default().contains("Too large resource version"), "{body}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
    // A revision reached while waiting is served.
    let writer = {
        let cms = cms.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "late"}})).map_err(kube::Error::SerdeError)?;
            cms.create(&PostParams::default(), &cm).await.map(|_| ())
        })
    };
    let (code, body) =
        raw(&client, "GET", &format!("/api/v1/namespaces/default/configmaps?resourceVersion={}", rv + 1), "", vec![]).await?;
    assert_eq!(code, 200, "{body}");
    writer.await??;
    honest(&client, 1).await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_connections_and_slow_headers() -> TestResult {
    const IDLE: usize = 2_000;
    let limits = provisioning_apiserver::Limits {
        max_connections: 500,
        idle_timeout: Duration::from_secs(3),
        header_read_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let ts = start_with(limits).await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    seed(&client, 1).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    // Thousands of TLS connections that never send a request, opened 50 at a time.
    let mut idle = Vec::with_capacity(IDLE);
    while idle.len() < IDLE {
        let batch: Vec<_> = (0..50).map(|_| tokio::spawn(tls_connect(addr, tls.clone()))).collect();
        for b in batch {
            // At the cap the server closes the longest-idle connection, which may be one still
            // handshaking: those count as closed, not as failures of the test.
            if let Ok(Ok(c)) = b.await {
                idle.push(c);
            }
            if idle.len() >= IDLE {
                break;
            }
        }
        if idle.is_empty() {
            return Err("no TLS connection could be opened".into());
        }
    }
    honest(&client, 1).await?;
    // The server holds at most its cap: most of the idle ones are closed already, the rest
    // go after the idle timeout. A read returns EOF (or an error) on a closed connection.
    let mut closed = 0;
    for c in idle.iter_mut() {
        if closed_within(c, Duration::from_millis(5)).await {
            closed += 1;
        }
    }
    assert!(closed >= IDLE - 500 - 50, "only {closed} of {IDLE} idle connections were closed at a cap of 500");
    let deadline = Instant::now() + Duration::from_secs(30);
    for c in idle.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(closed_within(c, left).await, "an idle connection outlived the idle timeout");
    }
    drop(idle);
    honest(&client, 1).await?;

    // A header that never ends is cut off by the header-read timeout.
    let mut slow = tls_connect(addr, tls.clone()).await?;
    slow.write_all(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: 127.0.0.1\r\n").await?;
    let t = Instant::now();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return Err("a connection with an unfinished header stayed open for 20 s".into()),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(15), "header timeout took {:?}", t.elapsed());
    let text = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    honest(&client, 1).await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_never_ends_is_cut_off() -> TestResult {
    let limits = provisioning_apiserver::Limits { body_read_timeout: Duration::from_secs(2), ..Default::default() };
    let ts = start_with(limits).await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    seed(&client, 1).await?;
    let tls = tls_client_config(ts.dir.path())?;
    let mut slow = tls_connect(ts.server.addr(), tls).await?;
    // An authenticated create whose body promises 1000 bytes and sends a few (slowloris).
    let head = format!(
        "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"metadata\"",
        token(ts.dir.path())?.trim()
    );
    slow.write_all(head.as_bytes()).await?;
    let t = Instant::now();
    let mut buf = vec![0u8; 4096];
    let n = match tokio::time::timeout(Duration::from_secs(15), slow.read(&mut buf)).await {
        Ok(read) => read?,
        Err(_) => return Err("a request whose body never ended got no answer for 15 s".into()),
    };
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("the request body was not received within 2 s"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(10), "body timeout took {:?}", t.elapsed());
    honest(&client, 1).await?;
    ts.server.shutdown().await;
    Ok(())
}

/// Whether the server closed this connection (EOF or error) within `d`.
async fn closed_within(c: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>, d: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(d, c.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
}

/// Sends a watch request by hand on its own HTTP/1.1 connection and returns the connection.
async fn raw_watch(
    addr: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
    token: &str,
    path: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Box<dyn std::error::Error + Send + Sync>> {
    let mut c = tls_connect(addr, tls).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n\r\n");
    c.write_all(req.as_bytes()).await?;
    Ok(c)
}

/// Reads the response head of a raw request: the status code.
async fn status_of(
    c: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b)).await??;
        if n == 0 {
            return Err("connection closed before the response head".into());
        }
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head);
    Ok(text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_flood_and_slow_reader() -> TestResult {
    let limits = provisioning_apiserver::Limits {
        max_watches: 60,
        max_watches_per_connection: 5,
        slow_reader_timeout: Duration::from_secs(1),
        watch_buffer_bytes: 256 * 1024,
        ..Default::default()
    };
    let ts = start_with(limits).await?;
    let client = client_no_retry(&ts.server.kubeconfig_path()).await?;
    seed(&client, 1).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    let token = token(ts.dir.path())?;
    let path = "/api/v1/namespaces/default/configmaps?watch=true";

    // A flood from two tenants: 80 watches each on their own connections. The first gets
    // half the shared total of 60 (its fair share while alone), the second what leaves a
    // newcomer's share free; beyond, 429 (system:masters would not be refused: see the
    // per-user test below).
    let mut open = vec![];
    for (ns, want) in [("flood", 30), ("flood-2", 15)] {
        let flooder = tenant_token(&client, ns, "flooder").await?;
        let (mut opened, mut refused) = (0, 0);
        for _ in 0..80 {
            let mut c = raw_watch(addr, tls.clone(), &flooder, &format!("/api/v1/namespaces/{ns}/configmaps?watch=true")).await?;
            match status_of(&mut c).await? {
                200 => {
                    open.push(c);
                    opened += 1;
                }
                429 => refused += 1,
                other => return Err(format!("watch answered {other}").into()),
            }
        }
        assert_eq!((opened, refused), (want, 80 - want), "{ns}: shared watch cap");
    }
    honest(&client, 1).await?;
    drop(open);
    // Per connection (HTTP/2 multiplexes many watches on one connection): a kube client's
    // watches beyond 5 on its connection are refused, and closing them frees the slots.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut streams = vec![];
    let mut per_conn_refused = 0;
    eventually("watches freed after the flood", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            raw(&client, "GET", "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1", "", vec![])
                .await
                .is_ok_and(|(c, _)| c == 200)
        }
    })
    .await?;
    for _ in 0..8 {
        match cms.watch(&kube::api::WatchParams::default(), "0").await {
            Ok(s) => streams.push(s),
            Err(kube::Error::Api(e)) if e.code == 429 => per_conn_refused += 1,
            Err(e) => return Err(e.into()),
        }
    }
    // kube-rs may spread requests over several HTTP/1.1 connections; with HTTP/2 they share one.
    assert!(streams.len() + per_conn_refused == 8, "{} open, {per_conn_refused} refused", streams.len());
    drop(streams);

    // A slow reader: a watch whose client never reads while 40 MiB of changes stream by (more
    // than loopback socket buffers hold, so the server's side of the watch must fill up).
    let mut slow = raw_watch(addr, tls.clone(), &token, path).await?;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let cms = cms.clone();
            tokio::spawn(async move {
                for i in 0..40 {
                    let cm: ConfigMap = serde_json::from_value(
                        json!({"metadata": {"name": format!("big-{w}-{i}")}, "data": {"blob": "x".repeat(256 * 1024)}}),
                    )
                    .map_err(kube::Error::SerdeError)?;
                    cms.create(&PostParams::default(), &cm).await?;
                }
                Ok::<_, kube::Error>(())
            })
        })
        .collect();
    for w in writers {
        w.await??;
    }
    honest(&client, 1).await?;
    // The server dropped that watcher: reading now drains what the socket buffers hold and
    // then ends (the chunked terminator or EOF), instead of streaming on forever.
    let mut total = 0usize;
    let mut tail = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => {
                total += n;
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 16 {
                    tail.drain(..tail.len() - 16);
                }
                if tail.ends_with(b"0\r\n\r\n") {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    assert!(ended, "the slow reader's watch was not dropped ({total} bytes read)");
    assert!(total < 40 * 1024 * 1024, "the slow reader got everything ({total} bytes): nothing was dropped");
    honest(&client, 1).await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_writes_when_storage_cannot_commit() -> TestResult {
    let ts = start().await?;
    let client = client_no_retry(&ts.server.kubeconfig_path()).await?;
    seed(&client, 1).await?;
    let readyz = |client: kube::Client| async move {
        let req = http::Request::builder().uri("/readyz").body(Vec::new()).map_err(|e| e.to_string())?;
        client.send(req.map(kube::client::Body::from)).await.map(|r| r.status().as_u16()).map_err(|e| e.to_string())
    };
    assert_eq!(readyz(client.clone()).await?, 200);
    ts.server.fail_storage_for_test();
    eventually("readyz 503", Duration::from_secs(5), || {
        let client = client.clone();
        async move { readyz(client).await == Ok(503) }
    })
    .await?;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}});
    let (code, body) = raw(&client, "POST", "/api/v1/namespaces/default/configmaps", "application/json", serde_json::to_vec(&cm)?).await?;
    assert_eq!(code, 503, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("storage cannot commit"), "{body}");
    // Reads still work.
    honest(&client, 1).await?;
    ts.server.shutdown().await;
    Ok(())
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A ServiceAccount `ns/name` (created here, with its namespace when missing) that may read,
/// watch and create ConfigMaps in `ns`, and a TokenRequest token for it.
async fn tenant_token(admin: &kube::Client, ns: &str, name: &str) -> Res<String> {
    let post = |path: String, body: Value| {
        let admin = admin.clone();
        async move { raw(&admin, "POST", &path, "application/json", serde_json::to_vec(&body)?).await }
    };
    let (code, body) = post("/api/v1/namespaces".into(), json!({"metadata": {"name": ns}})).await?;
    assert!(code == 201 || code == 409, "{body}");
    let (code, body) = post(format!("/api/v1/namespaces/{ns}/serviceaccounts"), json!({"metadata": {"name": name}})).await?;
    assert_eq!(code, 201, "{body}");
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    let role = json!({"metadata": {"name": format!("{name}-cm")},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create"]}]});
    let (code, body) = post(format!("{rbac}/namespaces/{ns}/roles"), role).await?;
    assert_eq!(code, 201, "{body}");
    let binding = json!({"metadata": {"name": format!("{name}-cm")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("{name}-cm")},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]});
    let (code, body) = post(format!("{rbac}/namespaces/{ns}/rolebindings"), binding).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) =
        post(format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"), json!({"spec": {"expirationSeconds": 3600}})).await?;
    assert_eq!(code, 201, "{body}");
    Ok(body["status"]["token"].as_str().ok_or("no token in the TokenRequest")?.to_string())
}

/// A kube client (no retries) that authenticates with `token` instead of the admin's.
async fn client_with_token(ts: &TestServer, name: &str, token: &str) -> Res<kube::Client> {
    let text = std::fs::read_to_string(ts.server.kubeconfig_path())?;
    let replaced: Vec<String> =
        text.lines().map(|l| if l.trim_start().starts_with("token: ") { format!("    token: {token}") } else { l.to_string() }).collect();
    let path = ts.dir.path().join(format!("kubeconfig-{name}"));
    std::fs::write(&path, replaced.join("\n") + "\n")?;
    client_no_retry(&path).await
}

/// Reads a raw response's head: the status code and the head's text.
async fn head_of(c: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Res<(u16, String)> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b)).await??;
        if n == 0 {
            return Err("connection closed before the response head".into());
        }
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    Ok((text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), text))
}

/// A few bytes of a 429's JSON body after its head (the message names the limit).
async fn body_start(c: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Res<String> {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await??;
    Ok(String::from_utf8_lossy(&buf[..n]).to_string())
}

/// Whether a watch of `client` on ConfigMaps in `ns` opens and sees the ADDED event of a
/// ConfigMap created after it started.
async fn watch_sees_a_new_configmap(client: &kube::Client, writer: &kube::Client, ns: &str, name: &str) -> TestResult {
    use futures::StreamExt;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let rv = cms.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let stream = cms.watch(&kube::api::WatchParams::default(), &rv).await?;
    let mut stream = Box::pin(stream);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<ConfigMap>::namespaced(writer.clone(), ns).create(&PostParams::default(), &cm).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(Ok(kube::api::WatchEvent::Added(o)))) if o.metadata.name.as_deref() == Some(name) => return Ok(()),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) => return Err(format!("the watch ended before {name} was added").into()),
            Err(_) => return Err(format!("the watch did not see {name} within 10 s").into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_watch_cap_gets_429_and_the_controller_still_watches() -> TestResult {
    let limits = provisioning_apiserver::Limits { max_watches_per_user: 5, max_watches: 12, ..Default::default() };
    let ts = start_with(limits).await?;
    let admin = client_no_retry(&ts.server.kubeconfig_path()).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    let alice = tenant_token(&admin, "lim-a", "alice").await?;
    let bob = tenant_token(&admin, "lim-b", "bob").await?;
    let controller = tenant_token(&admin, "provisioning-system", "provisioning-controller").await?;

    // Alice opens watches up to her cap; the next is refused with 429 and Retry-After, as APF does.
    let mut alices = vec![];
    for _ in 0..5 {
        let mut c = raw_watch(addr, tls.clone(), &alice, "/api/v1/namespaces/lim-a/configmaps?watch=true").await?;
        let (code, head) = head_of(&mut c).await?;
        assert_eq!(code, 200, "{head}");
        alices.push(c);
    }
    let mut c = raw_watch(addr, tls.clone(), &alice, "/api/v1/namespaces/lim-a/configmaps?watch=true").await?;
    let (code, head) = head_of(&mut c).await?;
    assert_eq!(code, 429, "alice's sixth watch: {head}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{head}");
    let body = body_start(&mut c).await?;
    assert!(body.contains("too many watches open for this client's flow (serviceaccounts:lim-a) (limit 5)"), "{body}");
    drop(c);

    // Bob has his own share: past half of the shared total (12), his fair share of it
    // (12 / (2 flows + 1) = 4).
    let mut bobs = vec![];
    for _ in 0..4 {
        let mut c = raw_watch(addr, tls.clone(), &bob, "/api/v1/namespaces/lim-b/configmaps?watch=true").await?;
        let (code, head) = head_of(&mut c).await?;
        assert_eq!(code, 200, "bob: {head}");
        bobs.push(c);
    }
    let mut c = raw_watch(addr, tls.clone(), &bob, "/api/v1/namespaces/lim-b/configmaps?watch=true").await?;
    let (code, head) = head_of(&mut c).await?;
    assert_eq!(code, 429, "bob beyond his fair share: {head}");
    let body = body_start(&mut c).await?;
    assert!(
        body.contains("flow (serviceaccounts:lim-b) holds its fair share of the 12 watches open on this server (4 held, 2 flows active)"),
        "{body}"
    );
    drop(c);

    // With every tenant place taken, system:masters and the controller's ServiceAccount still
    // open watches and see events.
    watch_sees_a_new_configmap(&admin, &admin, "lim-a", "seen-by-admin").await?;
    let controller_client = client_with_token(&ts, "controller", &controller).await?;
    watch_sees_a_new_configmap(&controller_client, &admin, "provisioning-system", "seen-by-controller").await?;

    // A watch that ends gives its place back: bob gets one again.
    drop(bobs.pop());
    eventually("bob's closed watch is given back", Duration::from_secs(10), || {
        let (tls, bob) = (tls.clone(), bob.clone());
        async move {
            match raw_watch(addr, tls, &bob, "/api/v1/namespaces/lim-b/configmaps?watch=true").await {
                Ok(mut c) => head_of(&mut c).await.is_ok_and(|(code, _)| code == 200),
                Err(_) => false,
            }
        }
    })
    .await?;
    honest_after(&admin).await?;
    ts.server.shutdown().await;
    Ok(())
}

/// After the abuse: the admin's list answers within 1 s.
async fn honest_after(admin: &kube::Client) -> TestResult {
    let t = Instant::now();
    Api::<ConfigMap>::namespaced(admin.clone(), "default").list(&ListParams::default()).await?;
    assert!(t.elapsed() < Duration::from_secs(1), "honest list took {:?}", t.elapsed());
    Ok(())
}

/// A create whose body never comes: the request stays in flight until the body timeout.
async fn stuck_create(addr: std::net::SocketAddr, tls: std::sync::Arc<rustls::ClientConfig>, token: &str, ns: &str) -> Res<TlsConn> {
    let mut c = tls_connect(addr, tls).await?;
    let head = format!(
        "POST /api/v1/namespaces/{ns}/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"metadata\""
    );
    c.write_all(head.as_bytes()).await?;
    Ok(c)
}

type TlsConn = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// The status and Retry-After of a GET of ConfigMaps in `ns` with `client`.
async fn list_status(client: &kube::Client, ns: &str) -> Res<(u16, Option<String>, String)> {
    let req = http::Request::builder().uri(format!("/api/v1/namespaces/{ns}/configmaps")).body(Vec::new())?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    let code = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    use http_body_util::BodyExt;
    let body = String::from_utf8_lossy(&resp.into_body().collect().await?.to_bytes()).to_string();
    Ok((code, retry, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_in_flight_cap_gets_429_and_others_go_on() -> TestResult {
    let limits = provisioning_apiserver::Limits {
        max_requests_in_flight_per_user: 3,
        body_read_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let ts = start_with(limits).await?;
    let admin = client_no_retry(&ts.server.kubeconfig_path()).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    let alice_token = tenant_token(&admin, "inflight-a", "alice").await?;
    let bob_token = tenant_token(&admin, "inflight-b", "bob").await?;
    let alice = client_with_token(&ts, "alice", &alice_token).await?;
    let bob = client_with_token(&ts, "bob", &bob_token).await?;

    // Alice holds her 3 places with creates whose bodies never come.
    let mut stuck = vec![];
    for _ in 0..3 {
        stuck.push(stuck_create(addr, tls.clone(), &alice_token, "inflight-a").await?);
    }
    eventually("alice's next request is refused", Duration::from_secs(10), || {
        let alice = alice.clone();
        async move { list_status(&alice, "inflight-a").await.is_ok_and(|(code, _, _)| code == 429) }
    })
    .await?;
    let (code, retry, body) = list_status(&alice, "inflight-a").await?;
    assert_eq!((code, retry.as_deref()), (429, Some("1")), "{body}");
    assert!(body.contains("too many requests in flight for this client's flow (serviceaccounts:inflight-a) (limit 3)"), "{body}");
    // Others go on: another tenant, and the admin (system:masters).
    let (code, _, body) = list_status(&bob, "inflight-b").await?;
    assert_eq!(code, 200, "bob: {body}");
    honest_after(&admin).await?;
    // Her places come back when those requests end.
    drop(stuck);
    eventually("alice's places are given back", Duration::from_secs(10), || {
        let alice = alice.clone();
        async move { list_status(&alice, "inflight-a").await.is_ok_and(|(code, _, _)| code == 200) }
    })
    .await?;
    ts.server.shutdown().await;
    Ok(())
}

/// Reads a watch response until it ends (chunked terminator or EOF); Err after `limit`.
async fn until_watch_ends(c: &mut TlsConn, limit: Duration) -> Res<Duration> {
    let t = Instant::now();
    let mut buf = vec![0u8; 16 * 1024];
    let mut tail = Vec::new();
    loop {
        let left = limit.saturating_sub(t.elapsed());
        match tokio::time::timeout(left, c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(t.elapsed()),
            Ok(Ok(n)) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 16 {
                    tail.drain(..tail.len() - 16);
                }
                if tail.ends_with(b"0\r\n\r\n") {
                    return Ok(t.elapsed());
                }
            }
            Err(_) => return Err(format!("the watch was still open after {limit:?}").into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_timeout_seconds_is_capped_by_the_server() -> TestResult {
    let limits = provisioning_apiserver::Limits { min_request_timeout: Duration::from_secs(1), ..Default::default() };
    let ts = start_with(limits).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    let token = token(ts.dir.path())?;
    // A client asking for an hour gets at most 2x the minimum request timeout (2 s).
    let mut c = raw_watch(addr, tls.clone(), &token, "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=3600").await?;
    assert_eq!(status_of(&mut c).await?, 200);
    let took = until_watch_ends(&mut c, Duration::from_secs(10)).await?;
    assert!(took <= Duration::from_millis(2500), "an hour-long watch was cut only after {took:?}");
    // Without timeoutSeconds: between 1x and 2x.
    let mut c = raw_watch(addr, tls.clone(), &token, "/api/v1/namespaces/default/configmaps?watch=true").await?;
    assert_eq!(status_of(&mut c).await?, 200);
    let took = until_watch_ends(&mut c, Duration::from_secs(10)).await?;
    assert!(took >= Duration::from_millis(900) && took <= Duration::from_millis(2500), "a watch without timeoutSeconds lasted {took:?}");
    // A shorter value of the client's is kept.
    let mut c = raw_watch(addr, tls, &token, "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1").await?;
    assert_eq!(status_of(&mut c).await?, 200);
    let took = until_watch_ends(&mut c, Duration::from_secs(10)).await?;
    assert!(took <= Duration::from_millis(1500), "timeoutSeconds=1 lasted {took:?}");
    ts.server.shutdown().await;
    Ok(())
}

/// A TLS connection to `addr` from the local address `from` (127.0.0.x: another peer).
async fn tls_connect_from(from: &str, addr: std::net::SocketAddr, tls: std::sync::Arc<rustls::ClientConfig>) -> Res<TlsConn> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse()?)?;
    let tcp = socket.connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    Ok(tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_flooding_connections_closes_only_its_own() -> TestResult {
    const CAP: usize = 10;
    let limits =
        provisioning_apiserver::Limits { max_connections_per_peer: CAP, idle_timeout: Duration::from_secs(120), ..Default::default() };
    let ts = start_with(limits).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    // Someone else's idle keep-alive connections, opened first (the longest idle ones).
    let mut others = vec![];
    for _ in 0..3 {
        others.push(tls_connect_from("127.0.0.1", addr, tls.clone()).await?);
    }
    // One peer opens 4x its cap.
    let mut flood = vec![];
    for _ in 0..4 * CAP {
        if let Ok(c) = tls_connect_from("127.0.0.2", addr, tls.clone()).await {
            flood.push(c);
        }
    }
    // The server closes the flood's own longest-idle connections as it goes (the close
    // reaches the client after a short grace), never the other peer's.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut closed = 0;
    for c in flood.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(5));
        if closed_within(c, left.min(Duration::from_millis(200))).await {
            closed += 1;
        }
    }
    assert!(closed >= 3 * CAP - 2, "only {closed} of {} connections of one peer were closed at a cap of {CAP}", 4 * CAP);
    for c in others.iter_mut() {
        assert!(!closed_within(c, Duration::from_millis(50)).await, "another peer's idle connection was closed");
    }
    // The other peer's connections still serve requests.
    let token = token(ts.dir.path())?;
    for c in others.iter_mut() {
        let req = format!("GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n");
        c.write_all(req.as_bytes()).await?;
        assert_eq!(status_of(c).await?, 200);
    }
    ts.server.shutdown().await;
    Ok(())
}

/// A request sent by hand on its own connection with extra headers (impersonation); the
/// connection is returned unread.
async fn raw_request(addr: std::net::SocketAddr, tls: std::sync::Arc<rustls::ClientConfig>, head: &str) -> Res<TlsConn> {
    let mut c = tls_connect(addr, tls).await?;
    c.write_all(head.as_bytes()).await?;
    Ok(c)
}

/// A create in `ns` whose body never comes, made by `token` as `impersonate` (if any).
fn stuck_create_head(token: &str, ns: &str, impersonate: Option<&str>) -> String {
    let imp = impersonate.map(|u| format!("Impersonate-User: {u}\r\n")).unwrap_or_default();
    format!(
        "POST /api/v1/namespaces/{ns}/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{imp}\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"metadata\""
    )
}

/// A watch of ConfigMaps in `ns` by `token` as `impersonate` (if any).
fn watch_head(token: &str, ns: &str, impersonate: Option<&str>) -> String {
    let imp = impersonate.map(|u| format!("Impersonate-User: {u}\r\n")).unwrap_or_default();
    format!(
        "GET /api/v1/namespaces/{ns}/configmaps?watch=true HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{imp}\
         Accept: application/json\r\n\r\n"
    )
}

/// Tenant a's setup in `ns`: a ServiceAccount `imp` that may impersonate every ServiceAccount
/// of `ns` (as `edit` may), and ConfigMap rights for all of them; returns imp's token.
async fn impersonator(admin: &kube::Client, ns: &str) -> Res<String> {
    let token = tenant_token(admin, ns, "imp").await?;
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    let objects = [
        (
            "roles",
            json!({"metadata": {"name": "impersonate-sas"},
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
                      {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create"]}]}),
        ),
        (
            "rolebindings",
            json!({"metadata": {"name": "imp-impersonates"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "impersonate-sas"},
            "subjects": [{"kind": "ServiceAccount", "name": "imp", "namespace": ns},
                         {"kind": "Group", "name": format!("system:serviceaccounts:{ns}"), "apiGroup": "rbac.authorization.k8s.io"}]}),
        ),
    ];
    for (plural, body) in objects {
        let (code, body) =
            raw(admin, "POST", &format!("{rbac}/namespaces/{ns}/{plural}"), "application/json", serde_json::to_vec(&body)?).await?;
        assert_eq!(code, 201, "{body}");
    }
    Ok(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_many_service_accounts_and_impersonations_are_one_flow() -> TestResult {
    // Issue 26 N3: the caps were keyed by the user after impersonation, so a tenant with 4
    // minted ServiceAccount tokens and impersonation of made-up ServiceAccount names held the
    // whole shared total and every other tenant got 429.
    let limits = provisioning_apiserver::Limits {
        max_requests_in_flight_per_user: 3,
        max_requests_in_flight: 8,
        max_watches_per_user: 3,
        max_watches: 8,
        body_read_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let ts = start_with(limits).await?;
    let admin = client_no_retry(&ts.server.kubeconfig_path()).await?;
    let addr = ts.server.addr();
    let tls = tls_client_config(ts.dir.path())?;
    let imp = impersonator(&admin, "flow-a").await?;
    let mut minted = vec![];
    for i in 0..4 {
        minted.push(tenant_token(&admin, "flow-a", &format!("minted-{i}")).await?);
    }
    let b_token = tenant_token(&admin, "flow-b", "b").await?;
    let b = client_with_token(&ts, "flow-b", &b_token).await?;
    let a = client_with_token(&ts, "flow-a", &minted[0]).await?;

    // Requests in flight: 4 impersonated made-up names and 4 minted tokens, 2 stuck creates each.
    let mut stuck = vec![];
    for (i, token) in minted.iter().enumerate() {
        let ghost = format!("system:serviceaccount:flow-a:ghost-{i}");
        for _ in 0..2 {
            stuck.push(raw_request(addr, tls.clone(), &stuck_create_head(&imp, "flow-a", Some(&ghost))).await?);
            stuck.push(raw_request(addr, tls.clone(), &stuck_create_head(token, "flow-a", None)).await?);
        }
    }
    eventually("tenant a is refused", Duration::from_secs(10), || {
        let a = a.clone();
        async move { list_status(&a, "flow-a").await.is_ok_and(|(code, _, _)| code == 429) }
    })
    .await?;
    let (code, retry, body) = list_status(&a, "flow-a").await?;
    assert_eq!((code, retry.as_deref()), (429, Some("1")), "{body}");
    assert!(body.contains("too many requests in flight for this client's flow (serviceaccounts:flow-a) (limit 3)"), "{body}");
    // Impersonating yet another name does not move imp to another flow.
    let get = format!(
        "GET /api/v1/namespaces/flow-a/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {imp}\r\n\
         Impersonate-User: system:serviceaccount:flow-a:ghost-new\r\n\r\n"
    );
    let mut c = raw_request(addr, tls.clone(), &get).await?;
    let (code, head) = head_of(&mut c).await?;
    assert_eq!(code, 429, "{head}");
    assert!(body_start(&mut c).await?.contains("(serviceaccounts:flow-a)"));
    // Tenant b goes on: a list, and slow requests of its own up to its cap.
    let (code, _, body) = list_status(&b, "flow-b").await?;
    assert_eq!(code, 200, "tenant b: {body}");
    honest_after(&admin).await?;
    drop(stuck);
    eventually("tenant a's places are given back", Duration::from_secs(10), || {
        let a = a.clone();
        async move { list_status(&a, "flow-a").await.is_ok_and(|(code, _, _)| code == 200) }
    })
    .await?;

    // Watches: 3 per token or impersonated name, 8 names: tenant a holds one flow's 3.
    let mut watches = vec![];
    let mut open = 0;
    for (i, token) in minted.iter().enumerate() {
        let ghost = format!("system:serviceaccount:flow-a:ghost-{i}");
        for _ in 0..3 {
            for head in [watch_head(&imp, "flow-a", Some(&ghost)), watch_head(token, "flow-a", None)] {
                let mut c = raw_request(addr, tls.clone(), &head).await?;
                let (code, head) = head_of(&mut c).await?;
                match code {
                    200 => open += 1,
                    429 => {}
                    other => return Err(format!("tenant a's watch answered {other}: {head}").into()),
                }
                watches.push(c);
            }
        }
    }
    assert_eq!(open, 3, "tenant a's watches over 8 names");
    watch_sees_a_new_configmap(&b, &admin, "flow-b", "seen-by-b").await?;
    drop(watches);
    ts.server.shutdown().await;
    Ok(())
}

/// The object limit holds for what is stored, managedFields included (issue 26, twenty-first
/// re-review item 6): it was checked before managedFields were recorded, so a ConfigMap of
/// 200,000 small keys (2.6 MB) was stored at ~5.6 MB, one managedFields entry per key. Now a
/// create or an update whose stored form would exceed 3 MiB is a 413, dry run too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_limit_counts_managed_fields() -> TestResult {
    let ts = start().await?;
    let client = client_no_retry(&ts.server.kubeconfig_path()).await?;
    let cm = |name: &str, keys: usize| {
        let data: serde_json::Map<String, Value> = (0..keys).map(|i| (format!("k{i:06}"), json!(""))).collect();
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
    };
    let path = "/api/v1/namespaces/default/configmaps";
    let body = serde_json::to_vec(&cm("wide", 200_000))?;
    assert!(body.len() < 3 * 1024 * 1024, "the body itself is within the limit: {}", body.len());
    for query in ["?dryRun=All", ""] {
        let (code, status) = raw(&client, "POST", &format!("{path}{query}"), "application/json", body.clone()).await?;
        assert_eq!(code, 413, "{query}: {}", status["message"]);
        assert_eq!(status["reason"], "RequestEntityTooLarge");
        let message = status["message"].as_str().unwrap_or_default();
        assert!(message.contains("request is too large") && message.contains("managedFields"), "{message}");
    }
    let (code, _) = raw(&client, "GET", &format!("{path}/wide"), "application/json", vec![]).await?;
    assert_eq!(code, 404, "nothing was stored");
    // An update growing a small ConfigMap the same way: refused, the stored one unchanged.
    let (code, status) = raw(&client, "POST", path, "application/json", serde_json::to_vec(&cm("grows", 10))?).await?;
    assert_eq!(code, 201, "{}", status["message"]);
    let grow = json!({"data": cm("grows", 200_000)["data"]});
    let (code, status) =
        raw(&client, "PATCH", &format!("{path}/grows"), "application/merge-patch+json", serde_json::to_vec(&grow)?).await?;
    assert_eq!(code, 413, "{}", status["message"]);
    let (code, stored) = raw(&client, "GET", &format!("{path}/grows"), "application/json", vec![]).await?;
    assert_eq!(code, 200);
    assert_eq!(stored["data"].as_object().map(serde_json::Map::len), Some(10));
    // Below the limit with managedFields: stored as before.
    let (code, status) = raw(&client, "POST", path, "application/json", serde_json::to_vec(&cm("fits", 50_000))?).await?;
    assert_eq!(code, 201, "{}", status["message"]);
    ts.server.shutdown().await;
    Ok(())
}
