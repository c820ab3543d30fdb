//! One object the controller cannot decode (a TaskServ whose `spec.config` nests ~130 levels,
//! which a real API server stores: it preserves unknown fields there and has no depth limit
//! of ours) must not stop the watch caches: the other objects are cached (so they reconcile),
//! the deep one is reported once per version with a Warning Event `Undecodable` on it.
//!
//! Our own API server refuses such an object at admission, so the test serves the lists and
//! watches from a tiny fake API server (plain HTTP) that holds it beside normal ones.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::{Client, Config};
use provisioning_controller::sync::{CacheSync, metadata_store, tracked_reflector};
use provisioning_crds::TaskServ;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const NS: &str = "undecodable-a";

fn task_serv(name: &str, resource_version: &str, config: Value) -> Value {
    json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "TaskServ",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": resource_version},
        "spec": {"service": "haproxy", "servers": {"names": ["s1"]}, "config": config}
    })
}

/// `levels` maps one inside the other (serialized by hand: serde_json's own encoder would
/// recurse as deep, which is fine at 130, but the server's text is what matters).
fn deep_config(levels: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
}

/// A TaskServ's JSON with its config replaced by `levels` nested maps.
fn deep_task_serv(name: &str, resource_version: &str, levels: usize) -> Result<String, serde_json::Error> {
    let shell = serde_json::to_string(&task_serv(name, resource_version, json!("DEEP")))?;
    Ok(shell.replace("\"DEEP\"", &deep_config(levels)))
}

#[derive(Default)]
struct Fake {
    /// Events created: (involved object name, its resourceVersion, reason) → how many times.
    events: Mutex<HashMap<(String, String, String), usize>>,
    watches: Mutex<usize>,
}

impl Fake {
    fn events_for(&self, name: &str) -> Vec<((String, String, String), usize)> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.iter().filter(|((n, _, _), _)| n == name).map(|(k, v)| (k.clone(), *v)).collect()
    }
}

async fn handle(fake: Arc<Fake>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let ok = |body: String| Response::builder().header("content-type", "application/json").body(Full::new(Bytes::from(body)));
    let response = if req.method() == Method::POST && path.ends_with("/events") {
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let event: Value = serde_json::from_slice(&body).unwrap_or_default();
        let object = &event["involvedObject"];
        let key = (
            object["name"].as_str().unwrap_or_default().to_string(),
            object["resourceVersion"].as_str().unwrap_or_default().to_string(),
            event["reason"].as_str().unwrap_or_default().to_string(),
        );
        *fake.events.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
        Response::builder().status(201).header("content-type", "application/json").body(Full::new(body))
    } else if path == "/apis/provisioning.dev/v1alpha1/taskservs" && !query.contains("watch=true") {
        let items = [
            serde_json::to_string(&task_serv("normal", "3", json!({"port": 80}))).unwrap_or_default(),
            deep_task_serv("deep", "4", 130).unwrap_or_default(),
        ];
        ok(format!(
            "{{\"apiVersion\":\"provisioning.dev/v1alpha1\",\"kind\":\"TaskServList\",\"metadata\":{{\"resourceVersion\":\"5\"}},\"items\":[{}]}}",
            items.join(",")
        ))
    } else if path == "/apis/provisioning.dev/v1alpha1/taskservs" {
        let first = {
            let mut watches = fake.watches.lock().unwrap_or_else(|p| p.into_inner());
            *watches += 1;
            *watches <= 2 // one per cache: the TaskServ cache and the metadata cache
        };
        if !first {
            // Later watches stay open with nothing to say.
            std::future::pending::<()>().await;
        }
        // The deep object modified (still deep), then a normal one added after it.
        let modified = format!("{{\"type\":\"MODIFIED\",\"object\":{}}}", deep_task_serv("deep", "6", 130).unwrap_or_default());
        let added = json!({"type": "ADDED", "object": task_serv("later", "7", json!({}))}).to_string();
        ok(format!("{modified}\n{added}\n"))
    } else {
        Response::builder().status(404).body(Full::new(Bytes::from_static(b"{}")))
    };
    Ok(response.unwrap_or_default())
}

async fn serve(fake: Arc<Fake>) -> Result<SocketAddr, std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let fake = fake.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(fake.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_deep_task_serv_is_reported_once_and_the_others_are_cached() -> TestResult {
    provisioning_controller::install_crypto_provider();
    let fake = Arc::new(Fake::default());
    let addr = serve(fake.clone()).await?;
    let client = Client::try_from(Config::new(format!("http://{addr}").parse()?))?;

    let synced = CacheSync::new(&["TaskServ", "TaskServ metadata"]);
    let (store, stream) = tracked_reflector::<TaskServ>(&synced, "TaskServ", &client, kube::runtime::watcher::Config::default());
    let metadata = metadata_store::<TaskServ>(client.clone(), &synced, "TaskServ metadata", std::future::pending());
    tokio::spawn(futures::StreamExt::for_each(stream, |_| futures::future::ready(())));

    // Today's kube-rs decoding fails the whole list on the deep item: the caches never sync.
    synced.wait_at_most(Duration::from_secs(20)).await?;
    let names = |names: Vec<String>| {
        let mut names = names;
        names.sort();
        names
    };
    eventually("the later TaskServ from the watch", || store.state().iter().any(|t| t.metadata.name.as_deref() == Some("later"))).await?;
    eventually("the later TaskServ in the metadata cache", || metadata.state().iter().any(|t| t.metadata.name.as_deref() == Some("later")))
        .await?;
    assert_eq!(names(store.state().iter().filter_map(|t| t.metadata.name.clone()).collect()), ["later", "normal"]);
    assert_eq!(names(metadata.state().iter().filter_map(|t| t.metadata.name.clone()).collect()), ["later", "normal"]);

    // One Event per version of the deep object, though two caches saw each version.
    eventually("an Undecodable event per version", || fake.events_for("deep").len() == 2).await?;
    let mut events = fake.events_for("deep");
    events.sort();
    assert_eq!(
        events,
        [(("deep".into(), "4".into(), "Undecodable".into()), 1), (("deep".into(), "6".into(), "Undecodable".into()), 1)],
        "one Warning per version of the undecodable object"
    );
    assert!(fake.events_for("normal").is_empty() && fake.events_for("later").is_empty());
    Ok(())
}
