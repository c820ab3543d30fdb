//! The project's kinds at both served versions (`v1alpha1`, storage, and `v1beta1`,
//! conversion `None`): real kubectl reads and writes either one, a watch at one version sees
//! writes at the other, every write is stored at the storage version, discovery prefers
//! `v1beta1`, `status.storedVersions` guards a CRD rollback, and every kind round-trips
//! v1alpha1 → v1beta1 → v1alpha1 without loss.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

const CRDS_YAML: &str = include_str!("../../deploy/crds/crds.yaml");

fn resource(version: &str, kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase());
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", version, kind), &plural)
}

fn api(client: &kube::Client, version: &str, kind: &str, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource(version, kind)),
        None => Api::all_with(client.clone(), &resource(version, kind)),
    }
}

/// The apiVersion of every stored custom resource of `plural`, by name (the server must be
/// shut down: the database is read directly).
fn stored_versions_of(data_dir: &Path, plural: &str) -> Result<Vec<(String, String)>, Box<dyn std::error::Error + Send + Sync>> {
    let (_, objects) = provisioning_apiserver::storage::snapshot_file(&data_dir.join("state.redb"))?;
    let mut out = vec![];
    for (key, bytes) in objects {
        if !key.contains(&format!("provisioning.dev/{plural}")) {
            continue;
        }
        let v: Value = serde_json::from_slice(&bytes)?;
        out.push((
            v["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            v["apiVersion"].as_str().unwrap_or_default().to_string(),
        ));
    }
    out.sort();
    Ok(out)
}

fn parse(out: &KubectlOut) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    assert!(out.ok, "kubectl failed: {}", out.stderr);
    Ok(serde_json::from_str(&out.stdout)?)
}

/// The object without its apiVersion (the only field the versions differ in).
fn but_version(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("apiVersion");
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_and_watches_at_either_version() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let k = |args: &[&str], stdin: Option<&str>| kubectl(&kc, args, stdin);

    // The CRDs as shipped (deploy/crds/crds.yaml), as a cluster admin applies them.
    let out = k(&["apply", "--server-side", "-f", "-"], Some(CRDS_YAML));
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["wait", "--for=condition=Established", "crd/servers.provisioning.dev", "--timeout=10s"], None);
    assert!(out.ok, "{}", out.stderr);
    let crd = parse(&k(&["get", "crd", "servers.provisioning.dev", "-o", "json"], None))?;
    assert_eq!(crd["status"]["storedVersions"], json!(["v1alpha1"]), "{}", crd["status"]);

    // Discovery: both versions, v1beta1 preferred (listed first), as kube-apiserver orders
    // a CRD's versions.
    let out = k(&["api-versions"], None);
    assert!(out.stdout.lines().any(|l| l == "provisioning.dev/v1alpha1"), "{}", out.stdout);
    assert!(out.stdout.lines().any(|l| l == "provisioning.dev/v1beta1"), "{}", out.stdout);
    let group = parse(&k(&["get", "--raw", "/apis/provisioning.dev"], None))?;
    assert_eq!(group["preferredVersion"]["version"], "v1beta1", "{group}");
    let listed: Vec<&str> = group["versions"].as_array().into_iter().flatten().filter_map(|v| v["version"].as_str()).collect();
    assert_eq!(listed, ["v1beta1", "v1alpha1"]);

    // `kubectl explain` at either version (OpenAPI v3 per group-version).
    for v in ["v1alpha1", "v1beta1"] {
        let out = k(&["explain", "servers.spec.plan", &format!("--api-version=provisioning.dev/{v}")], None);
        assert!(
            out.ok
                && out.stdout.lines().any(|l| l.starts_with("VERSION:") && l.trim_end().ends_with(v))
                && out.stdout.contains("FIELD: plan"),
            "{v}: {} {}",
            out.stdout,
            out.stderr
        );
    }

    // A Server written at v1alpha1 (client-side apply), read at v1beta1 and back.
    let alpha = "apiVersion: provisioning.dev/v1alpha1
kind: Server
metadata: {name: alpha-made, labels: {app: web}}
spec: {plan: small, zone: fi-hel1, image: debian-12, deletionPolicy: Orphan}
";
    let out = k(&["apply", "-f", "-"], Some(alpha));
    assert!(out.ok, "{}", out.stderr);
    let as_alpha = parse(&k(&["get", "servers.v1alpha1.provisioning.dev", "alpha-made", "-o", "json"], None))?;
    let as_beta = parse(&k(&["get", "servers.v1beta1.provisioning.dev", "alpha-made", "-o", "json"], None))?;
    assert_eq!(as_alpha["apiVersion"], "provisioning.dev/v1alpha1");
    assert_eq!(as_beta["apiVersion"], "provisioning.dev/v1beta1");
    assert_eq!(but_version(&as_alpha), but_version(&as_beta));
    // The preferred version is what a plain `kubectl get` reads.
    let plain = parse(&k(&["get", "servers", "alpha-made", "-o", "json"], None))?;
    assert_eq!(plain["apiVersion"], "provisioning.dev/v1beta1");
    // Table output at either version, with the CRD's columns.
    let out = k(&["get", "servers.v1beta1.provisioning.dev"], None);
    assert!(out.ok && out.stdout.contains("alpha-made") && out.stdout.contains("PHASE"), "{} {}", out.stdout, out.stderr);

    // A Server written at v1beta1 (server-side apply), read at v1alpha1; edited at v1beta1
    // (merge patch), the edit read at v1alpha1.
    let beta = alpha.replace("v1alpha1", "v1beta1").replace("alpha-made", "beta-made");
    let out = k(&["apply", "--server-side", "-f", "-"], Some(&beta));
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["patch", "servers.v1beta1.provisioning.dev", "beta-made", "--type=merge", "-p", r#"{"spec":{"plan":"medium"}}"#], None);
    assert!(out.ok, "{}", out.stderr);
    let back = parse(&k(&["get", "servers.v1alpha1.provisioning.dev", "beta-made", "-o", "json"], None))?;
    assert_eq!(back["apiVersion"], "provisioning.dev/v1alpha1");
    assert_eq!(back["spec"], json!({"plan": "medium", "zone": "fi-hel1", "image": "debian-12", "deletionPolicy": "Orphan"}));
    assert_eq!(back["metadata"]["generation"], 2);
    // The same patch again at the other version: nothing changes, not even resourceVersion.
    let out = k(&["patch", "servers.v1alpha1.provisioning.dev", "beta-made", "--type=merge", "-p", r#"{"spec":{"plan":"medium"}}"#], None);
    assert!(out.ok, "{}", out.stderr);
    let again = parse(&k(&["get", "servers.v1beta1.provisioning.dev", "beta-made", "-o", "json"], None))?;
    assert_eq!(again["metadata"]["resourceVersion"], back["metadata"]["resourceVersion"]);
    // A list at v1alpha1 has both, each at v1alpha1.
    let list = parse(&k(&["get", "servers.v1alpha1.provisioning.dev", "-o", "json"], None))?;
    let versions: Vec<&str> = list["items"].as_array().into_iter().flatten().filter_map(|i| i["apiVersion"].as_str()).collect();
    assert_eq!(versions, ["provisioning.dev/v1alpha1", "provisioning.dev/v1alpha1"], "{list}");

    // Watches: one at each version, each seeing the other version's writes in its own.
    let client = client_for(&kc).await?;
    let alpha_api = api(&client, "v1alpha1", "Server", Some("default"));
    let beta_api = api(&client, "v1beta1", "Server", Some("default"));
    // (kubectl's `-o json` of a list is a `List` without a resourceVersion: ask the server.)
    let rv = alpha_api.list(&Default::default()).await?.metadata.resource_version.ok_or("a list without resourceVersion")?;
    let mut alpha_watch = alpha_api.watch(&WatchParams::default().timeout(30), &rv).await?.boxed();
    let mut beta_watch = beta_api.watch(&WatchParams::default().timeout(30), &rv).await?.boxed();
    let out = k(&["apply", "-f", "-"], Some(&beta.replace("beta-made", "watched")));
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["label", "servers.v1alpha1.provisioning.dev", "watched", "seen=yes"], None);
    assert!(out.ok, "{}", out.stderr);
    for (watch, want) in [(&mut alpha_watch, "provisioning.dev/v1alpha1"), (&mut beta_watch, "provisioning.dev/v1beta1")] {
        let mut seen = vec![];
        while seen.len() < 2 {
            let ev = tokio::time::timeout(Duration::from_secs(10), watch.try_next()).await?.map_err(|e| format!("{want}: {e}"))?;
            match ev {
                Some(WatchEvent::Added(o)) => seen.push(("ADDED", o)),
                Some(WatchEvent::Modified(o)) => seen.push(("MODIFIED", o)),
                Some(WatchEvent::Bookmark(_)) => {}
                other => return Err(format!("watch at {want}: unexpected {other:?}").into()),
            }
        }
        for (kind, o) in &seen {
            assert_eq!(o.types.as_ref().map(|t| t.api_version.as_str()), Some(want), "{kind} {o:?}");
            assert_eq!(o.metadata.name.as_deref(), Some("watched"));
        }
        assert_eq!(seen[0].0, "ADDED");
        assert_eq!(seen[1].0, "MODIFIED");
        assert_eq!(seen[1].1.metadata.labels.as_ref().and_then(|l| l.get("seen")).map(String::as_str), Some("yes"));
    }

    // Every write, at whichever version it came, is stored at the storage version.
    let dir = ts.dir.path().to_path_buf();
    ts.server.shutdown().await;
    let stored = stored_versions_of(&dir, "servers")?;
    assert_eq!(
        stored,
        [
            ("alpha-made".to_string(), "provisioning.dev/v1alpha1".to_string()),
            ("beta-made".to_string(), "provisioning.dev/v1alpha1".to_string()),
            ("watched".to_string(), "provisioning.dev/v1alpha1".to_string()),
        ]
    );
    Ok(())
}

/// A condition as the controller writes it.
fn condition() -> Value {
    json!({"type": "Ready", "status": "True", "reason": "Ready", "message": "all 3 servers ready",
           "lastTransitionTime": "2026-11-27T10:00:00Z", "observedGeneration": 1})
}

/// A representative status per kind (most fields set; the schema prunes nothing of it).
fn status_of(kind: &str) -> Value {
    let common = json!({"phase": "Ready", "observedGeneration": 1, "conditions": [condition()]});
    let extra = match kind {
        "Workspace" => json!({"providers": [{"name": "local", "ready": true, "message": "reachable"}],
                              "counts": {"servers": 3, "clusters": 1, "taskservs": 2, "ready": 5, "progressing": 1, "failed": 0, "summary": "5/6 ready"}}),
        "Server" => json!({"provider": "local", "providerID": "local://0123abcd", "resolvedPlan": "cpus=1,memory=1g",
                           "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "InternalIP", "address": "10.0.0.3"}],
                           "providerState": "running", "zone": "", "image": "debian-12", "lastAppliedPlan": "p-1"}),
        "TaskServ" => json!({"installedVersion": "3.5.17", "lastGoodVersion": "3.5.16", "resolvedDependencies": ["containerd", "etcd"],
                             "servers": [{"name": "m-0", "phase": "Installed", "version": "3.5.17", "healthy": true, "providerID": "local://a",
                                          "lastRun": {"script": "install.nu", "startedAt": "2026-11-27T10:00:00Z", "finishedAt": "2026-11-27T10:01:00Z",
                                                      "exitCode": 0, "outputTail": "installed\n"},
                                          "driftedFiles": ["/etc/etcd.conf"]}]}),
        "Cluster" => json!({"servers": {"desired": 3, "ready": 2, "summary": "2/3"},
                            "taskservs": [{"service": "etcd", "phase": "Installing"}],
                            "steps": [{"id": "install/etcd", "kind": "Install", "target": "etcd", "state": "Running",
                                       "startedAt": "2026-11-27T10:00:00Z", "message": "2/3 servers installed"}]}),
        _ => json!({}),
    };
    let mut out = common;
    if let (Some(o), Some(e)) = (out.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    out
}

/// The representative objects: every Workspace, Server, TaskServ and Cluster of `examples/`
/// (what users apply), plus the namespaces they live in.
fn examples() -> Result<(Vec<String>, Vec<Value>), Box<dyn std::error::Error + Send + Sync>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files = vec![];
    for dir in std::fs::read_dir(&root)? {
        let dir = dir?.path();
        if dir.is_dir() {
            for f in std::fs::read_dir(&dir)? {
                let f = f?.path();
                if f.extension().is_some_and(|e| e == "yaml") {
                    files.push(f);
                }
            }
        }
    }
    files.sort();
    let (mut namespaces, mut objects) = (vec![], vec![]);
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc)?;
            if provisioning_crds::BETA_KINDS.contains(&v["kind"].as_str().unwrap_or_default()) {
                if let Some(ns) = v["metadata"]["namespace"].as_str()
                    && !namespaces.iter().any(|n| n == ns)
                {
                    namespaces.push(ns.to_string());
                }
                objects.push(v);
            }
        }
    }
    Ok((namespaces, objects))
}

/// Every kind, from every example with a status written: created at one version, read at the
/// other, written back unchanged there (a no-op: same resourceVersion), read at the first:
/// identical to what was created, field for field. Both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_round_trips_between_versions_without_loss() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    for crd in provisioning_crds::all_crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let (namespaces, objects) = examples()?;
    let mut kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds, ["Cluster", "Server", "TaskServ", "Workspace"], "the examples cover every kind");
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in &namespaces {
        ns_api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}}))?).await?;
    }
    let pp = PostParams::default();
    let mut checked = 0;
    for (first, second) in [("v1alpha1", "v1beta1"), ("v1beta1", "v1alpha1")] {
        for example in &objects {
            let kind = example["kind"].as_str().unwrap_or_default();
            let ns = example["metadata"]["namespace"].as_str().or(if kind == "Workspace" { None } else { Some("default") });
            let mut obj = example.clone();
            obj["apiVersion"] = json!(format!("provisioning.dev/{first}"));
            let name = format!("{}-{first}", obj["metadata"]["name"].as_str().unwrap_or_default());
            obj["metadata"]["name"] = json!(name);
            if kind == "Workspace" {
                // A Workspace's namespace defaults to its name: keep the example's.
                let own = example["spec"]["namespace"].as_str().or(example["metadata"]["name"].as_str()).unwrap_or_default();
                obj["spec"]["namespace"] = json!(format!("{own}-{first}"));
            }
            let at_first = api(&client, first, kind, ns);
            let at_second = api(&client, second, kind, ns);
            at_first.create(&pp, &serde_json::from_value(obj)?).await.map_err(|e| format!("{kind} {name} at {first}: {e}"))?;
            let mut with_status = serde_json::to_value(at_first.get(&name).await?)?;
            with_status["status"] = status_of(kind);
            at_first
                .replace_status(&name, &pp, &serde_json::from_value::<DynamicObject>(with_status)?)
                .await
                .map_err(|e| format!("{kind} {name} status at {first}: {e}"))?;
            let original = serde_json::to_value(at_first.get(&name).await?)?;
            assert_eq!(original["status"], status_of(kind), "{kind}: the status was pruned or changed");

            let converted = serde_json::to_value(at_second.get(&name).await?)?;
            assert_eq!(converted["apiVersion"], format!("provisioning.dev/{second}"));
            assert_eq!(but_version(&converted), but_version(&original), "{kind} {name}: {first} → {second}");
            // Written back unchanged at the second version: a no-op.
            let written = serde_json::to_value(at_second.replace(&name, &pp, &serde_json::from_value(converted)?).await?)?;
            assert_eq!(written["metadata"]["resourceVersion"], original["metadata"]["resourceVersion"], "{kind} {name}");
            let back = serde_json::to_value(at_first.get(&name).await?)?;
            assert_eq!(back, original, "{kind} {name}: {first} → {second} → {first} lost something");
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * objects.len());
    ts.server.shutdown().await;
    Ok(())
}

/// Why v1alpha1 stays the storage version: a rollback to the previous release's CRDs (v1alpha1
/// only, applied by its controller with the same field manager) is accepted, and what was
/// written at v1beta1 meanwhile is read there unchanged.
#[tokio::test]
async fn a_rollback_to_v1alpha1_only_crds_keeps_every_object() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    let apply = kube::api::PatchParams::apply("provisioning-controller").force();
    for crd in provisioning_crds::all_crds() {
        crds.patch(&crd.metadata.name.clone().unwrap_or_default(), &apply, &kube::api::Patch::Apply(&crd)).await?;
    }
    let beta = api(&client, "v1beta1", "Server", Some("default"));
    let obj = json!({"apiVersion": "provisioning.dev/v1beta1", "kind": "Server", "metadata": {"name": "made-at-beta"},
                     "spec": {"plan": "large", "zone": "eu-west-1a"}});
    beta.create(&PostParams::default(), &serde_json::from_value(obj)?).await?;
    let before = serde_json::to_value(api(&client, "v1alpha1", "Server", Some("default")).get("made-at-beta").await?)?;
    // The previous release's CRDs: v1alpha1 only.
    for mut crd in provisioning_crds::all_crds() {
        crd.spec.versions.retain(|v| v.name == "v1alpha1");
        crd.spec.conversion = None;
        crds.patch(&crd.metadata.name.clone().unwrap_or_default(), &apply, &kube::api::Patch::Apply(&crd)).await?;
    }
    let served = crds.get("servers.provisioning.dev").await?;
    let names: Vec<&str> = served.spec.versions.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["v1alpha1"]);
    eventually("v1beta1 no longer served", Duration::from_secs(5), || {
        let beta = beta.clone();
        async move { matches!(beta.get("made-at-beta").await, Err(kube::Error::Api(s)) if s.code == 404) }
    })
    .await?;
    let after = serde_json::to_value(api(&client, "v1alpha1", "Server", Some("default")).get("made-at-beta").await?)?;
    assert_eq!(after, before);
    ts.server.shutdown().await;
    Ok(())
}

/// `status.storedVersions` records every version objects may be stored at: a CRD update that
/// drops one is refused (naming the field), as upstream refuses a rollback before a migration.
#[tokio::test]
async fn a_stored_version_cannot_be_dropped() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    let server_crd = provisioning_crds::all_crds().into_iter().find(|c| c.spec.names.kind == "Server").ok_or("no Server CRD")?;
    crds.create(&PostParams::default(), &server_crd).await?;
    // Make v1beta1 the storage version: storedVersions gains it.
    let mut flipped = crds.get("servers.provisioning.dev").await?;
    for v in &mut flipped.spec.versions {
        v.storage = v.name == "v1beta1";
    }
    let flipped = crds.replace("servers.provisioning.dev", &PostParams::default(), &flipped).await?;
    assert_eq!(flipped.status.as_ref().and_then(|s| s.stored_versions.clone()), Some(vec!["v1alpha1".to_string(), "v1beta1".to_string()]));
    // Dropping v1alpha1 now is refused: objects may still be stored at it.
    let mut dropped = flipped.clone();
    dropped.spec.versions.retain(|v| v.name == "v1beta1");
    match crds.replace("servers.provisioning.dev", &PostParams::default(), &dropped).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("status.storedVersions[0]") && s.message.contains("must appear in spec.versions"), "{}", s.message);
        }
        other => return Err(format!("dropping a stored version was accepted: {other:?}").into()),
    }
    // A conversion webhook this server would never call is refused for a multi-version CRD.
    let mut webhook = flipped.clone();
    webhook.metadata.resource_version = None;
    let mut value = serde_json::to_value(&webhook)?;
    value["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
        "clientConfig": {"url": "https://127.0.0.1:9/convert"}}});
    match crds.replace("servers.provisioning.dev", &PostParams::default(), &serde_json::from_value(value)?).await {
        Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains("spec.conversion.strategy"), "{s:?}"),
        other => return Err(format!("a Webhook conversion was accepted: {other:?}").into()),
    }
    ts.server.shutdown().await;
    Ok(())
}
