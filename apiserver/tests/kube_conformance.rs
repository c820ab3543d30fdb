//! Conformance-style suite driving the server with kube-rs: typed and dynamic APIs,
//! watcher, a small Controller, SSA, selectors, paging, GC, validation and error codes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

#[tokio::test]
async fn typed_builtins_and_secret_string_data() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c1", "labels": {"app": "x"}}, "data": {"k": "v"}}))?;
    let created = cms.create(&PostParams::default(), &cm).await?;
    assert!(created.metadata.uid.is_some());
    let rv1: u64 = created.metadata.resource_version.clone().unwrap_or_default().parse()?;
    // Stale update -> 409.
    let mut stale = created.clone();
    stale.data = Some([("k".to_string(), "v2".to_string())].into());
    let updated = cms.replace("c1", &PostParams::default(), &stale).await?;
    let rv2: u64 = updated.metadata.resource_version.clone().unwrap_or_default().parse()?;
    assert!(rv2 > rv1);
    let err = cms.replace("c1", &PostParams::default(), &stale).await.err().ok_or("expected conflict")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409), "{err:?}");
    // Already exists.
    let err = cms.create(&PostParams::default(), &cm).await.err().ok_or("expected AlreadyExists")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"));

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(json!({"metadata": {"name": "s1"}, "stringData": {"password": "hunter2"}}))?;
    let s = secrets.create(&PostParams::default(), &s).await?;
    let data = s.data.ok_or("no data")?;
    assert_eq!(data.get("password").map(|b| b.0.clone()), Some(b"hunter2".to_vec()));
    assert!(s.string_data.is_none());

    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}))?;
    leases.create(&PostParams::default(), &l).await?;
    let l = leases.patch("leader", &PatchParams::default(), &Patch::Merge(json!({"spec": {"holderIdentity": "b"}}))).await?;
    assert_eq!(l.spec.and_then(|s| s.holder_identity).as_deref(), Some("b"));

    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = nss.list(&ListParams::default()).await?.items.into_iter().filter_map(|n| n.metadata.name).collect();
    assert!(names.contains(&"default".to_string()));
    // Namespace that does not exist -> 404.
    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let err = missing.create(&PostParams::default(), &cm).await.err().ok_or("expected 404")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 404));
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn crd_lifecycle_status_generation_and_validation() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let api = servers(&client, "default");
    let s = api.create(&PostParams::default(), &server_obj("web", "small")?).await?;
    // Defaults applied.
    assert_eq!(s.data["spec"]["image"], "debian-12");
    assert_eq!(s.metadata.generation, Some(1));
    // Status via /status does not bump generation; status on main resource is ignored.
    let st = api.patch_status("web", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}}))).await?;
    assert_eq!(st.metadata.generation, Some(1));
    assert_eq!(st.data["status"]["phase"], "Running");
    let m =
        api.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"plan": "large"}, "status": {"phase": "Hacked"}}))).await?;
    assert_eq!(m.metadata.generation, Some(2));
    assert_eq!(m.data["status"]["phase"], "Running");
    // No-op patch keeps the resourceVersion.
    let again = api.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"plan": "large"}}))).await?;
    assert_eq!(again.metadata.resource_version, m.metadata.resource_version);
    // JSON patch.
    let j = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([{"op": "replace", "path": "/spec/plan", "value": "medium"}]))?),
        )
        .await?;
    assert_eq!(j.data["spec"]["plan"], "medium");
    // Invalid values -> 422 with causes and the kube-apiserver message shape.
    let bad: DynamicObject = serde_json::from_value(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "bad"}, "spec": {"plan": "huge", "replicas": 50}}))?;
    let err = api.create(&PostParams::default(), &bad).await.err().ok_or("expected 422")?;
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert_eq!(s.reason, "Invalid");
            assert!(
                s.message.contains("Server.provisioning.dev \"bad\" is invalid: [spec.plan: Unsupported value: \"huge\": supported values: \"small\", \"medium\", \"large\", \"xlarge\""),
                "{}",
                s.message
            );
        }
        other => return Err(format!("unexpected {other:?}").into()),
    }
    // Missing required field.
    let bad: DynamicObject = serde_json::from_value(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "bad2"}, "spec": {}}))?;
    let err = api.create(&PostParams::default(), &bad).await.err().ok_or("expected 422")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("spec.plan: Required value")), "{err:?}");
    // Bad name.
    let err = api.create(&PostParams::default(), &server_obj("Bad_Name", "small")?).await.err().ok_or("expected 422")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("RFC 1123")));
    // Strict field validation rejects unknown fields; default prunes them.
    let unknown: DynamicObject = serde_json::from_value(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "u"}, "spec": {"plan": "small", "bogus": true}}))?;
    let strict = PostParams { field_manager: None, dry_run: false };
    let pruned = api.create(&strict, &unknown).await?;
    assert!(pruned.data["spec"].get("bogus").is_none());
    // dryRun stores nothing.
    let dry = PostParams { dry_run: true, field_manager: None };
    api.create(&dry, &server_obj("dry", "small")?).await?;
    assert!(api.get_opt("dry").await?.is_none());
    // generateName.
    let mut gen_obj = server_obj("", "small")?;
    gen_obj.metadata.name = None;
    gen_obj.metadata.generate_name = Some("gen-".into());
    let g = api.create(&PostParams::default(), &gen_obj).await?;
    assert!(g.metadata.name.as_deref().is_some_and(|n| n.starts_with("gen-") && n.len() == 9));
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn server_side_apply_managers_conflicts_force() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let api = servers(&client, "default");
    let cfg = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "a"},
        "spec": {"plan": "small", "zone": "z1"}});
    let a = api.patch("a", &PatchParams::apply("alice"), &Patch::Apply(&cfg)).await?;
    assert_eq!(a.data["spec"]["zone"], "z1");
    let mf = a.metadata.managed_fields.clone().unwrap_or_default();
    assert!(mf.iter().any(|m| m.manager.as_deref() == Some("alice") && m.operation.as_deref() == Some("Apply")));
    let bob = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "a"}, "spec": {"plan": "large"}});
    let err = api.patch("a", &PatchParams::apply("bob"), &Patch::Apply(&bob)).await.err().ok_or("expected conflict")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("conflict with \"alice\"")), "{err:?}");
    let forced = api.patch("a", &PatchParams::apply("bob").force(), &Patch::Apply(&bob)).await?;
    assert_eq!(forced.data["spec"]["plan"], "large");
    // Alice drops zone from her config: it is removed.
    let alice2 = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "a"}, "spec": {}});
    let r = api.patch("a", &PatchParams::apply("alice"), &Patch::Apply(&alice2)).await?;
    assert!(r.data["spec"].get("zone").is_none());
    assert_eq!(r.data["spec"]["plan"], "large");
    // Status apply with keyed conditions from two managers.
    let c1 = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "a"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    api.patch_status("a", &PatchParams::apply("ctrl").force(), &Patch::Apply(&c1)).await?;
    let c2 = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "a"},
        "status": {"conditions": [{"type": "Synced", "status": "False"}]}});
    let s = api.patch_status("a", &PatchParams::apply("other").force(), &Patch::Apply(&c2)).await?;
    assert_eq!(s.data["status"]["conditions"].as_array().map(Vec::len), Some(2));
    // Apply creates when missing.
    let newcfg =
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "fresh"}, "spec": {"plan": "small"}});
    let created = api.patch("fresh", &PatchParams::apply("alice"), &Patch::Apply(&newcfg)).await?;
    assert!(created.metadata.uid.is_some());
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn selectors_paging_and_watch_semantics() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        let tier = if i % 2 == 0 { "front" } else { "back" };
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("c{i:02}"), "labels": {"tier": tier, "n": i.to_string()}}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let front = cms.list(&ListParams::default().labels("tier=front")).await?;
    assert_eq!(front.items.len(), 13);
    assert_eq!(cms.list(&ListParams::default().labels("tier!=front")).await?.items.len(), 12);
    assert_eq!(cms.list(&ListParams::default().labels("n in (1,2,3)")).await?.items.len(), 3);
    assert_eq!(cms.list(&ListParams::default().labels("n notin (1,2,3),tier")).await?.items.len(), 22);
    assert_eq!(cms.list(&ListParams::default().labels("!tier")).await?.items.len(), 0);
    assert_eq!(cms.list(&ListParams::default().fields("metadata.name=c03")).await?.items.len(), 1);
    // Paging.
    let mut seen = 0;
    let mut lp = ListParams::default().limit(10);
    loop {
        let page = cms.list(&lp).await?;
        seen += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(seen, 25);
    // Watch from a resourceVersion sees only later events.
    let rv = cms.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut stream = cms.watch(&WatchParams::default().timeout(10), &rv).await?.boxed();
    cms.patch("c00", &PatchParams::default(), &Patch::Merge(json!({"data": {"x": "y"}}))).await?;
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await?? {
        Some(WatchEvent::Modified(cm)) => assert_eq!(cm.metadata.name.as_deref(), Some("c00")),
        other => return Err(format!("unexpected {other:?}").into()),
    }
    // Label-filtered watch: an object leaving the selector is seen as DELETED.
    let mut fw = cms.watch(&WatchParams::default().labels("tier=front").timeout(10), &rv).await?.boxed();
    cms.patch("c02", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}}))).await?;
    let mut got_deleted = false;
    while let Ok(Ok(Some(ev))) = tokio::time::timeout(Duration::from_secs(5), fw.try_next()).await {
        if let WatchEvent::Deleted(cm) = ev {
            assert_eq!(cm.metadata.name.as_deref(), Some("c02"));
            got_deleted = true;
            break;
        }
    }
    assert!(got_deleted);
    // Bookmarks.
    let mut bw = cms.watch(&WatchParams::default().timeout(20), "0").await?.boxed();
    let mut bookmark = false;
    while let Ok(Ok(Some(ev))) = tokio::time::timeout(Duration::from_secs(15), bw.try_next()).await {
        if matches!(ev, WatchEvent::Bookmark(_)) {
            bookmark = true;
            break;
        }
    }
    assert!(bookmark, "no bookmark");
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn watcher_and_controller_converge() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let api = servers(&client, "default");
    // A tiny controller: marks every Server Ready via server-side apply on /status.
    let ar = server_resource();
    let ctrl_api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let ctx = Arc::new(client.clone());
    let controller = kube::runtime::Controller::new_with(ctrl_api, watcher::Config::default(), ar.clone())
        .run(
            |obj: Arc<DynamicObject>, ctx: Arc<kube::Client>| async move {
                let ns = obj.metadata.namespace.clone().unwrap_or_default();
                let name = obj.metadata.name.clone().unwrap_or_default();
                let api: Api<DynamicObject> = Api::namespaced_with((*ctx).clone(), &ns, &server_resource());
                let status = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": name},
                    "status": {"phase": "Ready", "observedGeneration": obj.metadata.generation,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "Done", "message": "ok", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}});
                api.patch_status(&name, &PatchParams::apply("test-controller").force(), &Patch::Apply(&status)).await?;
                Ok::<_, kube::Error>(kube::runtime::controller::Action::await_change())
            },
            |_obj, _err, _ctx| kube::runtime::controller::Action::requeue(Duration::from_millis(200)),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);
    // The watcher sees what the controller does.
    let events = watcher(api.clone(), watcher::Config::default()).applied_objects();
    let mut events = events.boxed();
    api.create(&PostParams::default(), &server_obj("c1", "small")?).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut ready = false;
    while let Ok(Some(Ok(obj))) = tokio::time::timeout_at(deadline, events.next()).await {
        if obj.data["status"]["phase"] == "Ready" {
            ready = true;
            break;
        }
    }
    assert!(ready, "controller did not converge");
    // Generation bump -> controller updates observedGeneration.
    api.patch("c1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"plan": "large"}}))).await?;
    eventually("observedGeneration 2", Duration::from_secs(10), || {
        let api = api.clone();
        async move { api.get("c1").await.is_ok_and(|o| o.data["status"]["observedGeneration"] == 2) }
    })
    .await?;
    handle.abort();
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn finalizers_gc_and_namespace_deletion() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "gc"}}))?;
    nss.create(&PostParams::default(), &ns).await?;
    let api = servers(&client, "gc");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "gc");
    // Finalizer holds deletion.
    let mut f = server_obj("held", "small")?;
    f.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &f).await?;
    api.delete("held", &DeleteParams::default()).await?;
    let held = api.get("held").await?;
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    assert!(api.get_opt("held").await?.is_none());

    // Background GC.
    let owner = api.create(&PostParams::default(), &server_obj("owner", "small")?).await?;
    let uid = owner.metadata.uid.clone().unwrap_or_default();
    let child = |name: &str| -> Result<ConfigMap, serde_json::Error> {
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [{"apiVersion": "provisioning.dev/v1alpha1",
            "kind": "Server", "name": "owner", "uid": uid, "controller": true, "blockOwnerDeletion": true}]}}))
    };
    cms.create(&PostParams::default(), &child("dep1")?).await?;
    api.delete("owner", &DeleteParams::background()).await?;
    eventually("dependent collected", Duration::from_secs(5), || {
        let cms = cms.clone();
        async move { matches!(cms.get_opt("dep1").await, Ok(None)) }
    })
    .await?;

    // Orphan.
    let owner = api.create(&PostParams::default(), &server_obj("owner", "small")?).await?;
    let uid = owner.metadata.uid.clone().unwrap_or_default();
    let child2: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "dep2", "ownerReferences": [{"apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Server", "name": "owner", "uid": uid}]}}))?;
    cms.create(&PostParams::default(), &child2).await?;
    api.delete("owner", &DeleteParams::orphan()).await?;
    eventually("owner gone", Duration::from_secs(5), || {
        let api = api.clone();
        async move { matches!(api.get_opt("owner").await, Ok(None)) }
    })
    .await?;
    let dep2 = cms.get("dep2").await?;
    assert!(dep2.metadata.owner_references.unwrap_or_default().is_empty());

    // Foreground: owner stays until the dependent is gone.
    let owner = api.create(&PostParams::default(), &server_obj("owner", "small")?).await?;
    let uid = owner.metadata.uid.clone().unwrap_or_default();
    let child3: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep3", "finalizers": ["example.com/slow"],
        "ownerReferences": [{"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "name": "owner", "uid": uid, "blockOwnerDeletion": true}]}}))?;
    cms.create(&PostParams::default(), &child3).await?;
    api.delete("owner", &DeleteParams::foreground()).await?;
    eventually("dependent marked for deletion", Duration::from_secs(5), || {
        let cms = cms.clone();
        async move { cms.get("dep3").await.is_ok_and(|c| c.metadata.deletion_timestamp.is_some()) }
    })
    .await?;
    assert!(api.get_opt("owner").await?.is_some(), "foreground owner must wait");
    cms.patch("dep3", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    eventually("owner gone after dependent", Duration::from_secs(5), || {
        let api = api.clone();
        async move { matches!(api.get_opt("owner").await, Ok(None)) }
    })
    .await?;

    // Namespace deletion removes its contents.
    api.create(&PostParams::default(), &server_obj("inside", "small")?).await?;
    nss.delete("gc", &DeleteParams::default()).await?;
    eventually("namespace gone", Duration::from_secs(5), || {
        let nss = nss.clone();
        async move { matches!(nss.get_opt("gc").await, Ok(None)) }
    })
    .await?;
    assert!(cms.list(&ListParams::default()).await?.items.is_empty());
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_status_errors() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let p = "/apis/provisioning.dev/v1alpha1/namespaces/default/servers";
    let (code, st) = raw(&client, "POST", p, "application/json", b"{not json".to_vec()).await?;
    assert_eq!(code, 400, "{st}");
    assert_eq!(st["kind"], "Status");
    let (code, _) = raw(&client, "POST", p, "application/yaml", b"a: [unclosed".to_vec()).await?;
    assert_eq!(code, 400);
    let big = vec![b' '; 3 * 1024 * 1024 + 10];
    let (code, _) = raw(&client, "POST", p, "application/json", big).await?;
    assert_eq!(code, 413);
    let api = servers(&client, "default");
    api.create(&PostParams::default(), &server_obj("x", "small")?).await?;
    let (code, _) = raw(&client, "PATCH", &format!("{p}/x"), "application/strategic-merge-patch+json", b"{}".to_vec()).await?;
    assert_eq!(code, 415);
    let (code, _) = raw(&client, "PATCH", &format!("{p}/x"), "text/plain", b"{}".to_vec()).await?;
    assert_eq!(code, 415);
    // Strategic merge on a built-in kind is accepted (treated as merge patch).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "sm"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    let r = cms.patch("sm", &PatchParams::default(), &Patch::Strategic(json!({"data": {"a": "b"}}))).await?;
    assert_eq!(r.data.and_then(|d| d.get("a").cloned()).as_deref(), Some("b"));
    // Garbage of every kind never panics the server.
    for body in [&b"[]"[..], b"null", b"1", b"\"s\"", b"{\"metadata\": 5}", b"{\"metadata\": {\"name\": 5}}", b"\xff\xfe"] {
        let (code, _) = raw(&client, "POST", p, "application/json", body.to_vec()).await?;
        assert!((400..500).contains(&code), "{code} for {body:?}");
    }
    // Wrong token -> 401.
    let mut cfg = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(ts.server.kubeconfig_path())?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    cfg.auth_info.token = Some("wrong".to_string().into());
    let bad_client = kube::Client::try_from(cfg)?;
    let err = Api::<ConfigMap>::namespaced(bad_client, "default").list(&ListParams::default()).await.err().ok_or("expected 401")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 401), "{err:?}");
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn restart_keeps_objects_and_resource_versions_move_up() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let api = servers(&client, "default");
    let a = api.create(&PostParams::default(), &server_obj("persist", "small")?).await?;
    let rv_before: u64 = a.metadata.resource_version.clone().unwrap_or_default().parse()?;
    let list_rv = api.list(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    api.patch("persist", &PatchParams::default(), &Patch::Merge(json!({"spec": {"plan": "large"}}))).await?;
    let ts = restart(ts).await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let api = servers(&client, "default");
    let got = api.get("persist").await?;
    assert_eq!(got.data["spec"]["plan"], "large");
    let b = api.create(&PostParams::default(), &server_obj("after", "small")?).await?;
    let rv_after: u64 = b.metadata.resource_version.unwrap_or_default().parse()?;
    assert!(rv_after > rv_before + 1);
    // A watch from before the restart resumes and sees the change made before the restart.
    let mut stream = api.watch(&WatchParams::default().timeout(5), &list_rv).await?.boxed();
    let mut seen_large = false;
    while let Ok(Ok(Some(ev))) = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await {
        if let WatchEvent::Modified(o) | WatchEvent::Added(o) = ev
            && o.metadata.name.as_deref() == Some("persist")
            && o.data["spec"]["plan"] == "large"
        {
            seen_large = true;
            break;
        }
    }
    assert!(seen_large);
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn metadata_only_lists_and_watches_carry_no_data() -> TestResult {
    use kube::api::PartialObjectMeta;
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let meta: Api<PartialObjectMeta<Secret>> = Api::namespaced(client.clone(), "default");
    let s: Secret =
        serde_json::from_value(json!({"metadata": {"name": "m1", "labels": {"a": "b"}}, "stringData": {"password": "hunter2"}}))?;
    secrets.create(&PostParams::default(), &s).await?;
    let listed = meta.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.labels.as_ref().and_then(|l| l.get("a")).map(String::as_str), Some("b"));
    // The raw watch lines are PartialObjectMetadata without the Secret's data.
    let mut events = meta.watch(&WatchParams::default(), "0").await?.boxed();
    let first = tokio::time::timeout(Duration::from_secs(5), events.try_next()).await??.ok_or("watch ended")?;
    match first {
        WatchEvent::Added(m) => {
            assert_eq!(m.metadata.name.as_deref(), Some("m1"));
            let types = m.types.clone().ok_or("no TypeMeta")?;
            assert_eq!((types.kind.as_str(), types.api_version.as_str()), ("PartialObjectMetadata", "meta.k8s.io/v1"));
        }
        other => return Err(format!("unexpected {other:?}").into()),
    }
    // A status-only style change (data) still arrives as an event on a metadata watch.
    secrets.patch("m1", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"password": "other"}}))).await?;
    let next = tokio::time::timeout(Duration::from_secs(5), events.try_next()).await??.ok_or("watch ended")?;
    assert!(matches!(next, WatchEvent::Modified(_)), "{next:?}");
    Ok(())
}
