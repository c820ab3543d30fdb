//! managedFields bookkeeping stays linear in the object: a ConfigMap with 20,000
//! ownerReferences (a keyed list on every kind, by uid) is created, updated and server-side
//! applied within seconds, not minutes; the work runs off the async workers, so a GET of
//! another object keeps answering meanwhile, even on a runtime with a single worker.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// As many as fit: the stored object, managedFields included, stays under the 3 MiB limit
/// (each reference costs ~60 bytes in the list and ~75 in managedFields).
const REFS: usize = 20_000;

/// Each write of it, in a debug build on a busy 2-core machine (today's main: minutes).
const DEADLINE: Duration = Duration::from_secs(60);

fn owner_refs(owner_uid: &str) -> Vec<Value> {
    let mut refs = vec![json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "mf-owner", "uid": owner_uid})];
    refs.extend((1..REFS).map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": format!("u{i}")})));
    refs
}

/// One timed request; fails when it is not answered within `deadline` or not with `want`.
async fn timed(client: &kube::Client, what: &str, method: &str, path: &str, ct: &str, body: &Value, want: u16) -> TestResult {
    let deadline = DEADLINE;
    let t = Instant::now();
    let (code, resp) = tokio::time::timeout(deadline, raw(client, method, path, ct, serde_json::to_vec(body)?))
        .await
        .map_err(|_| format!("{what} not answered within {deadline:?}"))??;
    eprintln!("{what}: {code} in {:?}", t.elapsed());
    assert_eq!(code, want, "{what}: {resp}");
    Ok(())
}

// One worker thread: a write that computed managedFields on it would stall every other request.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn twenty_thousand_owner_references_update_and_apply_quickly() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let base = "/api/v1/namespaces/default/configmaps";
    let (code, owner) =
        raw(&client, "POST", base, "application/json", serde_json::to_vec(&json!({"metadata": {"name": "mf-owner"}, "data": {"k": "v"}}))?)
            .await?;
    assert_eq!(code, 201, "{owner}");
    let owner_uid = owner["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let refs = owner_refs(&owner_uid);

    // A reader that must keep being answered while the big writes run.
    let reading = Arc::new(AtomicBool::new(true));
    let reader = {
        let client = client.clone();
        let reading = reading.clone();
        tokio::spawn(async move {
            // The longest time between two answers (a stalled worker shows here, whether the
            // GET or the pause between GETs was waiting).
            let mut slowest = Duration::ZERO;
            let mut answered = 0u32;
            let mut last = Instant::now();
            while reading.load(Ordering::Relaxed) {
                let r = tokio::time::timeout(
                    Duration::from_secs(5),
                    raw(&client, "GET", "/api/v1/namespaces/default/configmaps/mf-owner", "application/json", vec![]),
                )
                .await;
                match r {
                    Ok(Ok((200, _))) => answered += 1,
                    other => return Err(format!("GET during the big writes: {other:?}")),
                }
                slowest = slowest.max(last.elapsed());
                last = Instant::now();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok((answered, slowest))
        })
    };

    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "mf-big", "ownerReferences": refs}, "data": {"a": "1"}});
    timed(&client, "create", "POST", base, "application/json", &cm, 201).await?;
    let merge = json!({"data": {"a": "2", "b": "x"}});
    timed(&client, "update", "PATCH", &format!("{base}/mf-big"), "application/merge-patch+json", &merge, 200).await?;
    // SSA by another manager setting a key (every other manager's 100,000 paths are checked).
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mf-big"}, "data": {"c": "3"}});
    let ssa = format!("{base}/mf-big?fieldManager=big-applier");
    timed(&client, "apply", "PATCH", &ssa, "application/apply-patch+yaml", &applied, 200).await?;
    // A second ConfigMap whose references only an applier owns: dropping 19,999 of them
    // removes them.
    let solo = format!("{base}/mf-solo?fieldManager=solo-applier");
    let all = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mf-solo", "ownerReferences": refs}});
    timed(&client, "apply creating", "PATCH", &solo, "application/apply-patch+yaml", &all, 201).await?;
    let fewer = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mf-solo", "ownerReferences": [refs[0].clone()]}});
    timed(&client, "apply dropping", "PATCH", &solo, "application/apply-patch+yaml", &fewer, 200).await?;

    reading.store(false, Ordering::Relaxed);
    let (answered, slowest) = reader.await??;
    eprintln!("concurrent GETs: {answered}, longest gap {slowest:?}");
    assert!(answered > 0, "no GET answered during the writes");
    assert!(slowest < Duration::from_millis(2500), "no GET answered for {slowest:?} during the big writes");

    let (code, got) = raw(&client, "GET", &format!("{base}/mf-big"), "application/json", vec![]).await?;
    assert_eq!(code, 200);
    assert_eq!(got["data"], json!({"a": "2", "b": "x", "c": "3"}));
    // The update's manager still owns the references it wrote, so they stay.
    assert_eq!(got["metadata"]["ownerReferences"].as_array().map(Vec::len), Some(REFS));
    let managers: Vec<&str> =
        got["metadata"]["managedFields"].as_array().into_iter().flatten().filter_map(|e| e["manager"].as_str()).collect();
    assert!(managers.contains(&"big-applier"), "{managers:?}");
    let (code, got) = raw(&client, "GET", &format!("{base}/mf-solo"), "application/json", vec![]).await?;
    assert_eq!(code, 200);
    assert_eq!(got["metadata"]["ownerReferences"], json!([refs[0]]));
    Ok(())
}
