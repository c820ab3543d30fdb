//! `provisioning migrate-storage` (the binary) against the embedded control plane: after a
//! CRD's storage version changes, every object is stored at the new one, storedVersions names
//! it alone, nothing else about the objects changes, a second run changes nothing, and only
//! then may the old version be dropped.
#![allow(clippy::too_many_lines, reason = "one upgrade story, step by step")]

use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use provisioning_controller::testing::TestEnv;
use serde_json::{Value, json};

fn api(env: &TestEnv, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", version, kind), plural);
    Api::namespaced_with(env.client.clone(), "default", &ar)
}

async fn stored_versions(crds: &Api<CustomResourceDefinition>, name: &str) -> anyhow::Result<Vec<String>> {
    Ok(crds.get(name).await?.status.and_then(|s| s.stored_versions).unwrap_or_default())
}

/// Everything a client sees of an object but what a rewrite may move (resourceVersion,
/// managedFields).
fn content(o: &DynamicObject) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(o)?;
    if let Some(md) = v["metadata"].as_object_mut() {
        md.remove("resourceVersion");
        md.remove("managedFields");
    }
    Ok(v)
}

fn migrate(env: &TestEnv) -> anyhow::Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_provisioning")).arg("migrate-storage").arg("--kubeconfig").arg(&env.kubeconfig).output()?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    anyhow::ensure!(out.status.success(), "migrate-storage failed: {stdout}{stderr}");
    Ok(stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_storage_moves_every_object_to_the_storage_version() -> anyhow::Result<()> {
    let mut env = TestEnv::start().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let pp = PostParams::default();
    let servers = api(&env, "v1alpha1", "Server", "servers");
    // Three Servers (one with a status) and a Cluster, all stored at v1alpha1.
    for name in ["a", "b", "c"] {
        let obj = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": name},
                         "spec": {"plan": "small", "provider": "sim"}});
        servers.create(&pp, &serde_json::from_value(obj)?).await?;
    }
    let status =
        json!({"status": {"phase": "Running", "providerID": "sim://1", "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
    servers.patch_status("a", &PatchParams::default(), &Patch::Merge(&status)).await?;
    let cluster = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "k"},
                         "spec": {"pools": [{"name": "members", "replicas": 1}]}});
    api(&env, "v1alpha1", "Cluster", "clusters").create(&pp, &serde_json::from_value(cluster)?).await?;

    // A later release makes v1beta1 the storage version of Servers and Clusters.
    for crd in ["servers.provisioning.dev", "clusters.provisioning.dev"] {
        let mut c = crds.get(crd).await?;
        for v in &mut c.spec.versions {
            v.storage = v.name == "v1beta1";
        }
        crds.replace(crd, &pp, &c).await?;
        assert_eq!(stored_versions(&crds, crd).await?, ["v1alpha1", "v1beta1"], "{crd}");
    }
    let before: Vec<Value> = {
        let beta = api(&env, "v1beta1", "Server", "servers");
        let mut out = vec![];
        for name in ["a", "b", "c"] {
            out.push(content(&beta.get(name).await?)?);
        }
        out
    };
    // v1alpha1 cannot be dropped yet: objects are stored at it.
    let mut dropped = crds.get("servers.provisioning.dev").await?;
    dropped.spec.versions.retain(|v| v.name == "v1beta1");
    match crds.replace("servers.provisioning.dev", &pp, &dropped).await {
        Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains("storedVersions"), "{s:?}"),
        other => anyhow::bail!("dropping a stored version was accepted before the migration: {other:?}"),
    }

    let out = migrate(&env)?;
    assert!(
        out.contains("servers.provisioning.dev: 3 objects stored at v1beta1; storedVersions [v1alpha1, v1beta1] -> [v1beta1]"),
        "{out}"
    );
    assert!(
        out.contains("clusters.provisioning.dev: 1 objects stored at v1beta1; storedVersions [v1alpha1, v1beta1] -> [v1beta1]"),
        "{out}"
    );
    assert!(out.contains("workspaces.provisioning.dev: 0 objects stored at v1alpha1; storedVersions [v1alpha1] -> [v1alpha1]"), "{out}");
    for crd in ["servers.provisioning.dev", "clusters.provisioning.dev"] {
        assert_eq!(stored_versions(&crds, crd).await?, ["v1beta1"], "{crd}");
    }
    assert_eq!(stored_versions(&crds, "taskservs.provisioning.dev").await?, ["v1alpha1"]);
    // Nothing else about the objects changed (uid, generation, labels, spec, status).
    let beta = api(&env, "v1beta1", "Server", "servers");
    let mut after = vec![];
    let mut rvs = vec![];
    for name in ["a", "b", "c"] {
        let o = beta.get(name).await?;
        rvs.push(o.metadata.resource_version.clone());
        after.push(content(&o)?);
    }
    assert_eq!(after, before);
    assert_eq!(after[0]["status"]["providerID"], "sim://1");

    // Again: every object is at the storage version already, so nothing is written.
    let out = migrate(&env)?;
    assert!(out.contains("servers.provisioning.dev: 3 objects stored at v1beta1; storedVersions [v1beta1] -> [v1beta1]"), "{out}");
    for (name, rv) in ["a", "b", "c"].iter().zip(&rvs) {
        assert_eq!(&beta.get(name).await?.metadata.resource_version, rv, "{name} was written again");
    }

    // Now v1alpha1 can go.
    let mut dropped = crds.get("servers.provisioning.dev").await?;
    dropped.spec.versions.retain(|v| v.name == "v1beta1");
    crds.replace("servers.provisioning.dev", &pp, &dropped).await?;

    // And the database holds every Server and the Cluster at v1beta1.
    if let Some(api) = env.api.take() {
        api.shutdown().await;
    }
    let (_, objects) = provisioning_apiserver::storage::snapshot_file(&env.dir.path().join("api/state.redb"))?;
    let mut stored: Vec<(String, String)> = vec![];
    for (key, bytes) in &objects {
        if key.contains("provisioning.dev/servers") || key.contains("provisioning.dev/clusters") {
            let v: Value = serde_json::from_slice(bytes)?;
            stored.push((v["metadata"]["name"].as_str().unwrap_or_default().into(), v["apiVersion"].as_str().unwrap_or_default().into()));
        }
    }
    stored.sort();
    let beta = "provisioning.dev/v1beta1".to_string();
    assert_eq!(stored, [("a".into(), beta.clone()), ("b".into(), beta.clone()), ("c".into(), beta.clone()), ("k".into(), beta)]);
    Ok(())
}
