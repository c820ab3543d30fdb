//! Server-side apply on list-map items (status.conditions) and the kube-runtime reflector store
//! becoming ready (list+watch and streaming lists), also behind `Controller::for_stream`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{Controller, WatchStreamExt, controller::Action, watcher};
use serde_json::{Value, json};

fn status(conditions: Value) -> Value {
    json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "web"},
        "status": {"conditions": conditions}})
}

fn cond_types(o: &DynamicObject) -> Vec<String> {
    o.data["status"]["conditions"].as_array().into_iter().flatten().map(|c| c["type"].as_str().unwrap_or("<none>").to_string()).collect()
}

#[tokio::test]
async fn ssa_drops_list_map_item_no_longer_applied() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let api = servers(&client, "default");
    api.create(&PostParams::default(), &server_obj("web", "small")?).await?;
    let ctrl = PatchParams::apply("ctrl").force();
    let both = json!([{"type": "Ready", "status": "True", "reason": "Up"}, {"type": "Paused", "status": "False", "reason": "NotPaused"}]);
    let o = api.patch_status("web", &ctrl, &Patch::Apply(status(both))).await?;
    assert_eq!(cond_types(&o), ["Ready", "Paused"]);
    let ready = json!([{"type": "Ready", "status": "True", "reason": "Up"}]);
    let o = api.patch_status("web", &ctrl, &Patch::Apply(status(ready.clone()))).await?;
    assert_eq!(cond_types(&o), ["Ready"], "{:#}", o.data["status"]);
    let mf = serde_json::to_string(&o.metadata.managed_fields)?;
    assert!(!mf.contains("Paused"), "{mf}");
    // The object still validates: apply again, and a plain status update, succeed.
    let o = api.patch_status("web", &ctrl, &Patch::Apply(status(ready))).await?;
    assert_eq!(cond_types(&o), ["Ready"]);
    api.patch_status("web", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}}))).await?;
    api.replace_status("web", &PostParams::default(), &api.get("web").await?).await?;

    // Two managers: Paused stays while "other" owns fields in it; only ctrl's fields go.
    let both = json!([{"type": "Ready", "status": "True"}, {"type": "Paused", "status": "False", "reason": "NotPaused"}]);
    api.patch_status("web", &ctrl, &Patch::Apply(status(both))).await?;
    let other = PatchParams::apply("other");
    api.patch_status("web", &other, &Patch::Apply(status(json!([{"type": "Paused", "status": "False", "message": "by other"}])))).await?;
    let o = api.patch_status("web", &ctrl, &Patch::Apply(status(json!([{"type": "Ready", "status": "True"}])))).await?;
    assert_eq!(cond_types(&o), ["Ready", "Paused"], "{:#}", o.data["status"]);
    let paused = &o.data["status"]["conditions"][1];
    assert_eq!(paused, &json!({"type": "Paused", "status": "False", "message": "by other"}));
    // Now "other" lets go too: the item is removed.
    let o = api.patch_status("web", &other, &Patch::Apply(status(json!([])))).await?;
    assert_eq!(cond_types(&o), ["Ready"], "{:#}", o.data["status"]);
    api.patch_status("web", &ctrl, &Patch::Apply(status(json!([{"type": "Ready", "status": "True"}])))).await?;
    ts.server.shutdown().await;
    Ok(())
}

const READY_DEADLINE: Duration = Duration::from_secs(10);

fn configs() -> [(&'static str, watcher::Config); 2] {
    [("list+watch", watcher::Config::default()), ("streaming lists", watcher::Config::default().streaming_lists())]
}

#[tokio::test]
async fn reflector_store_becomes_ready() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let ar = server_resource();
    for (populated, (what, cfg)) in
        [(false, configs()[0].clone()), (false, configs()[1].clone()), (true, configs()[0].clone()), (true, configs()[1].clone())]
    {
        if populated {
            let _ = servers(&client, "default").create(&PostParams::default(), &server_obj("s1", "small")?).await;
            let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c1"}, "data": {"k": "v"}}))?;
            let _ = Api::<ConfigMap>::namespaced(client.clone(), "default").create(&PostParams::default(), &cm).await;
        }
        // ConfigMaps (typed).
        let (reader, writer) = reflector::store::<ConfigMap>();
        let stream = reflector::reflector(writer, watcher(Api::<ConfigMap>::all(client.clone()), cfg.clone())).applied_objects();
        let h = tokio::spawn(stream.for_each(|_| async {}));
        tokio::time::timeout(READY_DEADLINE, reader.wait_until_ready())
            .await
            .map_err(|_| format!("ConfigMap store not ready ({what}, populated={populated})"))??;
        assert_eq!(reader.state().len(), usize::from(populated), "{what}");
        h.abort();
        // Servers (CRD, dynamic).
        let writer = Writer::<DynamicObject>::new(ar.clone());
        let reader = writer.as_reader();
        let stream = reflector::reflector(writer, watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), cfg)).applied_objects();
        let h = tokio::spawn(stream.for_each(|_| async {}));
        tokio::time::timeout(READY_DEADLINE, reader.wait_until_ready())
            .await
            .map_err(|_| format!("Server store not ready ({what}, populated={populated})"))??;
        assert_eq!(reader.state().len(), usize::from(populated), "{what}");
        h.abort();
    }
    ts.server.shutdown().await;
    Ok(())
}

/// `Controller::for_stream` over `reflector(writer, watcher(..))`, list+watch and streaming lists:
/// the watcher's InitDone arrives at once and the controller reconciles.
///
/// Note (kube-runtime 5.0.0, client side): `Store::wait_until_ready()` keeps a single waker
/// (a `futures` oneshot behind `DelayedInit`), so when two tasks wait on the same store at the
/// same time (e.g. the Controller's runner and the application) only the one that polled last
/// is woken; the other resolves only when polled again. Await readiness after the controller
/// has started reconciling, or with a timeout in a loop, rather than concurrently with it.
#[tokio::test]
async fn controller_for_stream_store_becomes_ready() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let ar = server_resource();
    let api = servers(&client, "default");
    api.create(&PostParams::default(), &server_obj("s1", "small")?).await?;
    for (what, cfg) in configs() {
        let writer = Writer::<DynamicObject>::new(ar.clone());
        let reader = writer.as_reader();
        let (init_tx, mut init_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let w = watcher(Api::<DynamicObject>::all_with(client.clone(), &ar), cfg).inspect(move |e| {
            if matches!(e, Ok(watcher::Event::InitDone)) {
                let _ = init_tx.send(());
            }
        });
        let stream = reflector::reflector(writer, w).applied_objects();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let ctrl = Controller::for_stream_with(stream, reader.clone(), ar.clone())
            .run(
                move |obj: Arc<DynamicObject>, tx: Arc<tokio::sync::mpsc::UnboundedSender<String>>| async move {
                    let _ = tx.send(obj.metadata.name.clone().unwrap_or_default());
                    Ok::<_, kube::Error>(Action::await_change())
                },
                |_obj, _err, _ctx| Action::requeue(Duration::from_millis(200)),
                Arc::new(tx),
            )
            .for_each(|_| async {});
        let h = tokio::spawn(ctrl);
        let started = std::time::Instant::now();
        tokio::time::timeout(READY_DEADLINE, init_rx.recv()).await.map_err(|_| format!("no InitDone ({what})"))?;
        // The controller's own wait on the store resolved: it reconciles the existing object.
        let name = tokio::time::timeout(READY_DEADLINE, rx.recv()).await.map_err(|_| format!("no reconcile ({what})"))?;
        assert_eq!(name.as_deref(), Some("s1"), "{what}");
        tokio::time::timeout(Duration::from_secs(1), reader.wait_until_ready())
            .await
            .map_err(|_| format!("store not ready after reconcile ({what})"))??;
        assert!(started.elapsed() < Duration::from_secs(3), "{what}: took {:?}", started.elapsed());
        assert_eq!(reader.state().len(), 1, "{what}");
        h.abort();
    }
    ts.server.shutdown().await;
    Ok(())
}
