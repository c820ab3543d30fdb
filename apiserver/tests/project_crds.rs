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

/// `instanceProfile` (Server and Cluster pool) is an IAM name or an instance-profile ARN:
/// anything else is refused at admission, naming the field.
#[tokio::test]
async fn instance_profiles_are_names_or_arns_at_admission() -> TestResult {
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in provisioning_crds::all_crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let ar =
        |kind: &str, plural: &str| ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", kind), plural);
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("Server", "servers"));
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("Cluster", "clusters"));
    let server = |name: &str, profile: &str| -> Result<DynamicObject, serde_json::Error> {
        serde_json::from_value(serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name}, "spec": {"instanceProfile": profile}}))
    };
    let pp = PostParams::default();
    servers.create(&pp, &server("by-name", "eks-node")?).await?;
    servers.create(&pp, &server("by-arn", "arn:aws:iam::123456789012:instance-profile/nodes/eks-node")?).await?;
    for (name, bad) in
        [("spaced", "eks node"), ("short-account", "arn:aws:iam::1234:instance-profile/p"), ("role", "arn:aws:iam::123456789012:role/p")]
    {
        match servers.create(&pp, &server(name, bad)?).await {
            Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains("spec.instanceProfile"), "{bad}: {s:?}"),
            other => return Err(format!("{bad} accepted: {other:?}").into()),
        }
    }
    let cluster: DynamicObject = serde_json::from_value(serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "profiled"}, "spec": {"pools": [{"name": "workers", "replicas": 1, "instanceProfile": "bad profile"}]}}))?;
    match clusters.create(&pp, &cluster).await {
        Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains("instanceProfile"), "{s:?}"),
        other => return Err(format!("a pool's bad instanceProfile was accepted: {other:?}").into()),
    }
    ts.server.shutdown().await;
    Ok(())
}
