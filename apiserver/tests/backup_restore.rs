//! Backup and restore of the embedded control plane (issue 30, item 4): a snapshot taken from
//! a server process while 8 writers stream creates, the server killed with SIGKILL mid-write,
//! the data dir rebuilt from the snapshot and a server started on it: every write acknowledged
//! at or below the snapshot's revision is there with its resourceVersion, nothing after it; the
//! revision moved past everything clients saw, so a watch from a pre-restore resourceVersion
//! gets 410 Gone (clients relist) and new writes get higher resourceVersions; the credentials
//! came along (same CA and admin token; a ServiceAccount token issued before still works). `GET /backup` is refused to a non-admin.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use provisioning_apiserver::backup;
use serde_json::json;

type Acked = Arc<Mutex<BTreeMap<String, u64>>>;

fn spawn_writers(cms: &Api<ConfigMap>, acked: &Acked) -> Vec<tokio::task::JoinHandle<()>> {
    (0..8)
        .map(|w| {
            let (cms, acked) = (cms.clone(), acked.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("w{w}-{i}");
                    let Ok(cm) = serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": name}, "data": {"i": i.to_string()}}))
                    else {
                        return;
                    };
                    let Ok(c) = cms.create(&PostParams::default(), &cm).await else { return };
                    let rv = c.metadata.resource_version.and_then(|r| r.parse().ok()).unwrap_or(0);
                    if let Ok(mut a) = acked.lock() {
                        a.insert(name, rv);
                    }
                }
            })
        })
        .collect()
}

async fn acked_at_least(acked: &Acked, n: usize) -> TestResult {
    eventually(&format!("{n} acknowledged writes"), Duration::from_secs(60), || {
        let acked = acked.clone();
        async move { acked.lock().map(|a| a.len() >= n).unwrap_or(false) }
    })
    .await
}

#[tokio::test]
async fn backup_during_writes_then_kill_9_restore_keeps_exactly_the_snapshot_and_old_watches_get_410() -> TestResult {
    provisioning_apiserver::install_crypto_provider();
    let tmp = tempfile::tempdir()?;
    let old_dir = tmp.path().join("old");
    let mut server = spawn_standalone(&old_dir)?;
    let client = client_for(&old_dir.join("kubeconfig")).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // A non-admin (impersonated by the admin) is refused the snapshot: it holds every Secret.
    let req = http::Request::get("/backup").header("Impersonate-User", "jane").body(kube::client::Body::empty())?;
    let refused = client.send(req).await?;
    assert_eq!(refused.status().as_u16(), 403, "GET /backup is for cluster-admin only");
    let body = String::from_utf8_lossy(&refused.into_body().collect().await?.to_bytes()).into_owned();
    assert!(body.contains("jane") && body.contains("/backup"), "{body}");

    // A ServiceAccount token issued before the backup must still work after the restore.
    let old_kubeconfig = old_dir.join("kubeconfig");
    assert!(kubectl(&old_kubeconfig, &["create", "serviceaccount", "backup-ci", "-n", "default"], None).ok);
    let issued = kubectl(&old_kubeconfig, &["create", "token", "backup-ci", "-n", "default"], None);
    assert!(issued.ok, "{}", issued.stderr);
    let sa_token = issued.stdout.trim().to_string();

    let acked: Acked = Arc::new(Mutex::new(BTreeMap::new()));
    let writers = spawn_writers(&cms, &acked);
    acked_at_least(&acked, 150).await?;
    // The snapshot, taken while the writers run.
    let resp = client.send(http::Request::get("/backup").body(kube::client::Body::empty())?).await?;
    assert_eq!(resp.status().as_u16(), 200);
    let snapshot = backup::decode(&resp.into_body().collect().await?.to_bytes())?;
    let at_backup = acked.lock().map(|a| a.len()).unwrap_or(0);
    acked_at_least(&acked, at_backup + 150).await?;
    server.kill()?; // SIGKILL, writes in flight
    server.wait()?;
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().map(|a| a.clone()).unwrap_or_default();
    let max_acked = acked.values().copied().max().unwrap_or(0);
    assert!(max_acked > snapshot.revision, "writes were acknowledged after the snapshot ({max_acked} > {})", snapshot.revision);

    // Restore (with the old dir's credentials, as `provisioning backup` adds them) and start.
    let with_files = backup::Backup { files: backup::read_credentials(&old_dir)?, ..snapshot.clone() };
    let decoded = backup::decode(&backup::encode(&with_files)?)?;
    let new_dir = tmp.path().join("new");
    let restored = backup::restore(&decoded, &new_dir, false)?;
    assert_eq!(restored.revision, snapshot.revision + backup::REVISION_BUMP);
    for f in ["ca.crt", "ca.key", "sa.key", "token"] {
        assert_eq!(std::fs::read(old_dir.join(f))?, std::fs::read(new_dir.join(f))?, "{f} restored");
    }
    let mut server = spawn_standalone(&new_dir)?;
    let client = client_for(&new_dir.join("kubeconfig")).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list = cms.list(&ListParams::default()).await?;
    let present: HashMap<String, u64> =
        list.items.iter().filter_map(|c| Some((c.metadata.name.clone()?, c.metadata.resource_version.as_deref()?.parse().ok()?))).collect();
    for (name, rv) in &acked {
        if *rv <= snapshot.revision {
            assert_eq!(present.get(name), Some(rv), "{name} (acknowledged at {rv}, in the snapshot) restored with its resourceVersion");
        } else {
            assert!(!present.contains_key(name), "{name} was written at {rv}, after the snapshot's {}", snapshot.revision);
        }
    }
    let list_rv: u64 = list.metadata.resource_version.unwrap_or_default().parse()?;
    let new_kubeconfig = new_dir.join("kubeconfig");
    let as_sa = kubectl(&new_kubeconfig, &["--token", &sa_token, "get", "--raw", "/version"], None);
    assert!(as_sa.ok, "a token issued before the backup is valid after the restore: {}", as_sa.stderr);
    let forged = kubectl(&new_kubeconfig, &["--token", "not-a-token", "get", "--raw", "/version"], None);
    assert!(!forged.ok && forged.stderr.contains("Unauthorized"), "{}", forged.stderr);
    assert!(list_rv >= restored.revision && list_rv > max_acked, "the revision moved past what clients saw: {list_rv}");

    // A watch from a resourceVersion seen before the restore (lost write, snapshot, older) is
    // 410 Gone: the client relists instead of silently missing changes.
    for rv in [max_acked, snapshot.revision, 1] {
        let mut stream = cms.watch(&WatchParams::default(), &rv.to_string()).await?.boxed();
        match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await? {
            Ok(Some(WatchEvent::Error(e))) => assert_eq!(e.code, 410, "watch from {rv}"),
            other => return Err(format!("watch from pre-restore resourceVersion {rv}: expected 410, got {other:?}").into()),
        }
    }
    // A watch from the list's resourceVersion works and sees a new write, above everything.
    let mut stream = cms.watch(&WatchParams::default().timeout(20), &list_rv.to_string()).await?.boxed();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after-restore"}}))?;
    let created = cms.create(&PostParams::default(), &cm).await?;
    let rv: u64 = created.metadata.resource_version.unwrap_or_default().parse()?;
    assert!(rv > list_rv);
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await? {
        Ok(Some(WatchEvent::Added(o))) => assert_eq!(o.metadata.name.as_deref(), Some("after-restore")),
        other => return Err(format!("expected the new write on the watch, got {other:?}").into()),
    }
    server.kill()?;
    server.wait()?;
    Ok(())
}
