//! The project's real CRDs (`provisioning_crds::all_crds()`) are accepted, established and
//! served with their short names and the `provisioning` category.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::discovery::Discovery;

#[tokio::test]
async fn project_crds_are_established_and_discoverable() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let all = provisioning_crds::all_crds();
    for crd in &all {
        crds.create(&PostParams::default(), crd).await?;
    }
    for crd in &all {
        let name = crd.metadata.name.clone().unwrap_or_default();
        eventually(&format!("{name} Established"), Duration::from_secs(5), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                crds.get(&name).await.is_ok_and(|c| {
                    c.status.and_then(|s| s.conditions).unwrap_or_default().iter().any(|c| c.type_ == "Established" && c.status == "True")
                })
            }
        })
        .await?;
    }
    let discovery = Discovery::new(client.clone()).run().await?;
    let group = discovery.groups().find(|g| g.name() == "provisioning.dev").ok_or("group not discovered")?;
    let kinds: Vec<String> = group.recommended_resources().into_iter().map(|(ar, _)| ar.kind).collect();
    for k in ["Workspace", "Server", "TaskServ", "Cluster"] {
        assert!(kinds.iter().any(|x| x == k), "{k} not served: {kinds:?}");
    }
    ts.server.shutdown().await;
    Ok(())
}
