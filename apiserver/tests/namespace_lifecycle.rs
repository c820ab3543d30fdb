//! Namespace deletion as kube-apiserver and its namespace controller do it: the namespaces
//! every cluster has cannot be deleted, and a Terminating namespace says what it waits for.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_namespaces_may_not_be_deleted() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    for name in ["default", "kube-system", "kube-public"] {
        let err = match nss.delete(name, &DeleteParams::default()).await {
            Err(kube::Error::Api(s)) => s,
            other => return Err(format!("deleting {name} should be refused, got {other:?}").into()),
        };
        assert_eq!(err.code, 403, "{err:?}");
        assert_eq!(err.message, format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"));
        let ns = nss.get(name).await?;
        assert!(ns.metadata.deletion_timestamp.is_none(), "{name} must not be Terminating");
    }
    // kubectl shows upstream's words.
    let out = kubectl(&ts.server.kubeconfig_path(), &["delete", "namespace", "default"], None);
    assert!(
        out.stderr.contains("Error from server (Forbidden): namespaces \"default\" is forbidden: this namespace may not be deleted"),
        "{}",
        out.stderr
    );
    // Other namespaces still delete.
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "mortal"}}))?;
    nss.create(&PostParams::default(), &ns).await?;
    nss.delete("mortal", &DeleteParams::default()).await?;
    eventually("namespace mortal gone", Duration::from_secs(10), || {
        let nss = nss.clone();
        async move { matches!(nss.get_opt("mortal").await, Ok(None)) }
    })
    .await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_terminating_namespace_names_the_content_and_finalizers_it_waits_for() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&client).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "held-ns"}}))?;
    nss.create(&PostParams::default(), &ns).await?;
    let api = servers(&client, "held-ns");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "held-ns");
    for name in ["a", "b"] {
        let mut s = server_obj(name, "small")?;
        s.metadata.finalizers = Some(vec!["example.com/hold".into(), "example.com/other".into()]);
        api.create(&PostParams::default(), &s).await?;
    }
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "plain"}}))?;
    cms.create(&PostParams::default(), &cm).await?;

    nss.delete("held-ns", &DeleteParams::default()).await?;
    let condition = |ns: &Namespace, type_: &str| {
        ns.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == type_).cloned())
    };
    let last_status = std::sync::Arc::new(std::sync::Mutex::new(None));
    eventually("conditions name what remains", Duration::from_secs(10), || {
        let last = last_status.clone();
        let nss = nss.clone();
        async move {
            nss.get("held-ns").await.is_ok_and(|ns| {
                *last.lock().unwrap_or_else(|p| p.into_inner()) = ns.status.clone();
                condition(&ns, "NamespaceFinalizersRemaining").is_some_and(|c| {
                    c.status == "True"
                        && c.reason.as_deref() == Some("SomeFinalizersRemain")
                        && c.message.as_deref()
                            == Some("Some content in the namespace has finalizers remaining: example.com/hold in 2 resource instances, example.com/other in 2 resource instances")
                })
            })
        }
    })
    .await
    .map_err(|e| format!("{e}: {:?}", last_status))?;
    let ns = nss.get("held-ns").await?;
    assert_eq!(ns.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Terminating"));
    let remaining = condition(&ns, "NamespaceContentRemaining").ok_or("no NamespaceContentRemaining")?;
    assert_eq!((remaining.status.as_str(), remaining.reason.as_deref()), ("True", Some("SomeResourcesRemain")));
    assert_eq!(remaining.message.as_deref(), Some("Some resources are remaining: servers.provisioning.dev has 2 resource instances"));
    let failure = condition(&ns, "NamespaceDeletionContentFailure").ok_or("no NamespaceDeletionContentFailure")?;
    assert_eq!((failure.status.as_str(), failure.reason.as_deref()), ("False", Some("ContentDeleted")));
    // Content without finalizers went at once; the held objects are Terminating, not gone.
    assert!(cms.get_opt("plain").await?.is_none());
    assert!(api.get("a").await?.metadata.deletion_timestamp.is_some());
    // No new content in a Terminating namespace.
    let refused = api.create(&PostParams::default(), &server_obj("late", "small")?).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "{refused:?}");

    // One finalizer of each released (the objects stay): the message follows.
    for name in ["a", "b"] {
        api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}}))).await?;
    }
    eventually("only example.com/hold remains", Duration::from_secs(10), || {
        let nss = nss.clone();
        async move {
            nss.get("held-ns").await.is_ok_and(|ns| {
                condition(&ns, "NamespaceFinalizersRemaining").and_then(|c| c.message).as_deref()
                    == Some("Some content in the namespace has finalizers remaining: example.com/hold in 2 resource instances")
            })
        }
    })
    .await?;
    // One object released: the count follows.
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    eventually("one object remains", Duration::from_secs(10), || {
        let nss = nss.clone();
        async move {
            nss.get("held-ns").await.is_ok_and(|ns| {
                condition(&ns, "NamespaceContentRemaining").and_then(|c| c.message).as_deref()
                    == Some("Some resources are remaining: servers.provisioning.dev has 1 resource instances")
            })
        }
    })
    .await?;
    api.patch("b", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    eventually("namespace gone", Duration::from_secs(10), || {
        let nss = nss.clone();
        async move { matches!(nss.get_opt("held-ns").await, Ok(None)) }
    })
    .await?;
    ts.server.shutdown().await;
    Ok(())
}
