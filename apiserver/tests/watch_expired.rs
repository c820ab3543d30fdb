//! 410 Gone for a resourceVersion older than the watch history window (own process: it
//! shrinks the process-wide window).

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

#[tokio::test]
async fn too_old_resource_version_is_410() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    provisioning_apiserver::storage::set_history_limit(100);
    let limit = provisioning_apiserver::storage::history_limit();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "churn"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    // Push the history window past revision 1 with concurrent writes.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let cms = cms.clone();
            tokio::spawn(async move {
                for i in 0..(limit / 8 + 10) {
                    let _ = cms.patch("churn", &PatchParams::default(), &Patch::Merge(json!({"data": {"t": format!("{t}-{i}")}}))).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let mut stream = cms.watch(&WatchParams::default(), "1").await?.boxed();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await? {
        Ok(Some(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 410),
        other => return Err(format!("expected 410, got {other:?}").into()),
    }
    ts.server.shutdown().await;
    Ok(())
}
