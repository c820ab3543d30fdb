//! Crash test: a server process is killed with SIGKILL during a stream of writes; after a
//! restart on the same data directory every acknowledged write is there, resourceVersions
//! continue upward and a watcher resumes from the last resourceVersion it saw.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn spawn_server(dir: &Path) -> Result<Child, Box<dyn std::error::Error + Send + Sync>> {
    spawn_standalone(dir)
}

#[tokio::test]
async fn kill_9_loses_no_acknowledged_write_and_watch_resumes() -> TestResult {
    provisioning_apiserver::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let mut server = spawn_server(dir.path())?;
    let kubeconfig = dir.path().join("kubeconfig");
    let client = client_for(&kubeconfig).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // A watcher that remembers the last resourceVersion it saw.
    let last_seen = Arc::new(Mutex::new(String::new()));
    let start_rv = cms.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut stream = cms.watch(&WatchParams::default(), &start_rv).await?.boxed();
    let ls = last_seen.clone();
    let watcher = tokio::spawn(async move {
        while let Ok(Some(ev)) = stream.try_next().await {
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) = ev
                && let (Some(rv), Ok(mut l)) = (o.metadata.resource_version, ls.lock())
            {
                *l = rv;
            }
        }
    });

    // 16 writers (as many as the throughput bench's clients, so commits are shared) stream
    // creates; every acknowledged one is recorded.
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let mut writers = vec![];
    for w in 0..16 {
        let cms = cms.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let cm: ConfigMap = match serde_json::from_value(json!({"metadata": {"name": name}, "data": {"i": i.to_string()}})) {
                    Ok(c) => c,
                    Err(_) => return,
                };
                match cms.create(&PostParams::default(), &cm).await {
                    Ok(c) => {
                        let rv = c.metadata.resource_version.and_then(|r| r.parse().ok()).unwrap_or(0);
                        if let Ok(mut a) = acked.lock() {
                            a.insert(name, rv);
                        }
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    eventually("300 acknowledged writes", Duration::from_secs(60), || {
        let acked = acked.clone();
        async move { acked.lock().map(|a| a.len() >= 300).unwrap_or(false) }
    })
    .await?;
    eventually("watcher progress", Duration::from_secs(30), || {
        let l = last_seen.clone();
        async move { l.lock().map(|l| !l.is_empty()).unwrap_or(false) }
    })
    .await?;
    server.kill()?; // SIGKILL
    server.wait()?;
    for w in writers {
        let _ = w.await;
    }
    watcher.abort();
    let acked = acked.lock().map(|a| a.clone()).unwrap_or_default();
    let resume_from = last_seen.lock().map(|l| l.clone()).unwrap_or_default();
    let max_acked = acked.values().copied().max().unwrap_or(0);

    let mut server = spawn_server(dir.path())?;
    let client = client_for(&kubeconfig).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list = cms.list(&ListParams::default()).await?;
    let present: HashSet<String> = list.items.iter().filter_map(|c| c.metadata.name.clone()).collect();
    let missing: Vec<&String> = acked.keys().filter(|n| !present.contains(*n)).collect();
    assert!(missing.is_empty(), "acknowledged writes lost after kill -9: {missing:?}");
    let list_rv: u64 = list.metadata.resource_version.unwrap_or_default().parse()?;
    assert!(list_rv >= max_acked);

    // Resume the watch from the last revision seen before the crash: every object written
    // after it arrives, with no 410.
    let resume: u64 = resume_from.parse()?;
    let mut expected: HashSet<String> = list
        .items
        .iter()
        .filter(|c| c.metadata.resource_version.as_deref().and_then(|r| r.parse::<u64>().ok()).is_some_and(|rv| rv > resume))
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let mut stream = cms.watch(&WatchParams::default().timeout(30), &resume_from).await?.boxed();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !expected.is_empty() {
        match tokio::time::timeout_at(deadline, stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => {
                if let Some(n) = o.metadata.name {
                    expected.remove(&n);
                }
            }
            Ok(Ok(Some(WatchEvent::Error(e)))) => return Err(format!("watch resume failed: {e:?}").into()),
            Ok(Ok(Some(_))) => {}
            other => return Err(format!("watch ended early ({other:?}); {} events missing", expected.len()).into()),
        }
    }
    // New writes continue above every revision seen before the crash.
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after-crash"}}))?;
    let created = cms.create(&PostParams::default(), &cm).await?;
    let rv: u64 = created.metadata.resource_version.unwrap_or_default().parse()?;
    assert!(rv > list_rv);
    server.kill()?;
    server.wait()?;
    Ok(())
}
