//! Server-side apply on the project's own CRDs (generated from the Rust types): list-maps
//! and sets merge per entry across managers, duplicates are refused like kube-apiserver
//! does, and `dryRun=All` answers the managedFields a real apply records, for an object that
//! exists and for one that does not yet (Argo CD's server-side diff of a new resource).

mod common;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn install_project_crds(client: &Client) -> TestResult {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in provisioning_crds::all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply("provisioning-controller").force(), &Patch::Apply(&crd)).await?;
    }
    Ok(())
}

fn api(client: &Client, kind: &str, plural: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn fields_of(obj: &DynamicObject, manager: &str) -> Value {
    obj.metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.manager.as_deref() == Some(manager))
        .and_then(|e| e.fields_v1.as_ref())
        .map(|f| f.0.clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn project_lists_merge_per_entry_and_dry_run_reports_ownership() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_project_crds(&client).await?;
    let clusters = api(&client, "Cluster", "clusters", Some("default"));
    let cluster = |pools: Value, taskservs: Value| {
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "c1"},
            "spec": {"pools": pools, "taskservs": taskservs}})
    };
    // The CRDs are served once the registry has them: retry the first apply briefly.
    let first = cluster(json!([{"name": "members", "replicas": 3}]), json!([{"service": "etcd", "pools": ["members"]}]));
    eventually("Cluster served", std::time::Duration::from_secs(20), || {
        let clusters = clusters.clone();
        let first = first.clone();
        async move { clusters.patch("c1", &PatchParams::apply("team-a"), &Patch::Apply(&first)).await.is_ok() }
    })
    .await?;

    // Dry run of a second manager adding a pool: the answer shows team-b's ownership...
    let second = cluster(json!([{"name": "workers", "replicas": 2}]), json!([{"service": "etcd", "pools": ["workers"]}]));
    let dry = clusters.patch("c1", &PatchParams::apply("team-b").dry_run(), &Patch::Apply(&second)).await?;
    let dry_fields = fields_of(&dry, "team-b");
    assert!(dry_fields["f:spec"]["f:pools"].get(r#"k:{"name":"workers"}"#).is_some(), "{dry_fields:#}");
    assert!(dry_fields["f:spec"]["f:taskservs"][r#"k:{"service":"etcd"}"#]["f:pools"].get(r#"v:"workers""#).is_some(), "{dry_fields:#}");
    // ...and nothing is stored.
    let live = clusters.get("c1").await?;
    assert_eq!(live.data["spec"]["pools"].as_array().map(Vec::len), Some(1));
    assert!(fields_of(&live, "team-b").is_null());

    // The real apply: no conflict (different entries, set members), both managers' entries kept.
    let real = clusters.patch("c1", &PatchParams::apply("team-b"), &Patch::Apply(&second)).await?;
    assert_eq!(fields_of(&real, "team-b"), dry_fields, "the dry run reported what the apply records");
    let pools: Vec<&str> = real.data["spec"]["pools"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(pools, ["members", "workers"]);
    assert_eq!(real.data["spec"]["taskservs"][0]["pools"], json!(["members", "workers"]));

    // team-a drops `members` from etcd's pools: team-b's member stays.
    let shrink = cluster(json!([{"name": "members", "replicas": 3}]), json!([{"service": "etcd"}]));
    let o = clusters.patch("c1", &PatchParams::apply("team-a"), &Patch::Apply(&shrink)).await?;
    assert_eq!(o.data["spec"]["taskservs"][0]["pools"], json!(["workers"]));

    // Duplicate keys and set members are refused, naming the item: a create gets 422...
    let dup = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "dup"},
        "spec": {"pools": [{"name": "a", "replicas": 1}], "taskservs": [{"service": "etcd"}, {"service": "etcd"}]}});
    let err = clusters.create(&PostParams::default(), &serde_json::from_value(dup.clone())?).await;
    match err {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(
                e.message.contains(r#"spec.taskservs[1]: Duplicate value: map[string]interface {}{"service":"etcd"}"#),
                "{}",
                e.message
            );
        }
        other => return Err(format!("duplicate taskservs accepted: {other:?}").into()),
    }
    let taskservs = api(&client, "TaskServ", "taskservs", Some("default"));
    let ts_dup = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "t"},
        "spec": {"service": "redis", "dependsOn": ["etcd", "etcd"]}});
    let err = taskservs.create(&PostParams::default(), &serde_json::from_value(ts_dup.clone())?).await;
    assert!(
        matches!(&err, Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains(r#"spec.dependsOn[1]: Duplicate value: "etcd""#)),
        "{err:?}"
    );
    // ...and an apply cannot even be merged (structured-merge-diff's message).
    let err = clusters.patch("dup", &PatchParams::apply("team-a"), &Patch::Apply(&dup)).await;
    assert!(
        matches!(&err, Err(kube::Error::Api(e)) if e.message.ends_with(r#".spec.taskservs: duplicate entries for key [service="etcd"]"#)),
        "{err:?}"
    );
    let err = taskservs.patch("t", &PatchParams::apply("team-a"), &Patch::Apply(&ts_dup)).await;
    assert!(
        matches!(&err, Err(kube::Error::Api(e)) if e.message.ends_with(r#".spec.dependsOn: duplicate entries for value "etcd""#)),
        "{err:?}"
    );

    // Dry-run apply of an object that does not exist: created in the answer only.
    let mut new_cluster = cluster(json!([{"name": "p", "replicas": 1}]), json!([]));
    new_cluster["metadata"]["name"] = json!("c2");
    let dry_new = clusters.patch("c2", &PatchParams::apply("argocd-controller").dry_run(), &Patch::Apply(&new_cluster)).await?;
    assert!(fields_of(&dry_new, "argocd-controller")["f:spec"]["f:pools"].get(r#"k:{"name":"p"}"#).is_some());
    assert!(clusters.get_opt("c2").await?.is_none(), "a dry run stored the object");
    ts.server.shutdown().await;
    Ok(())
}
