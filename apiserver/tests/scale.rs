//! The `/scale` subresource (issue 27 item 4) with the real kubectl: a CRD that declares
//! `subresources.scale` gets `kubectl scale`, the autoscaling/v1 Scale on GET, PUT and PATCH
//! of the Scale (resourceVersion precondition, 422 on invalid replicas), discovery lists
//! `RESOURCE/scale`; the built-in Deployments scale with `kubectl scale deployment`; RBAC
//! authorizes it as `RESOURCE/scale`.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::path::Path;

use common::*;
use serde_json::{Value, json};

const SCALE_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "things.scale.example.com"},
  "spec": {"group": "scale.example.com", "scope": "Namespaced",
    "names": {"plural": "things", "singular": "thing", "kind": "Thing", "listKind": "ThingList"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}},
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"replicas": {"type": "integer", "maximum": 50}, "note": {"type": "string"}}},
        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}}"#;

const THINGS: &str = "/apis/scale.example.com/v1/namespaces/default/things";

fn get_json(kc: &Path, what: &str) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    let out = kubectl(kc, &["get", what, "-o", "json"], None);
    if !out.ok {
        return Err(format!("kubectl get {what}: {}", out.stderr).into());
    }
    Ok(serde_json::from_str(&out.stdout)?)
}

fn must(out: &KubectlOut, what: &str) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    if out.ok { Ok(out.stdout.clone()) } else { Err(format!("{what}: {}", out.stderr).into()) }
}

/// Installs the CRD and creates `default/NAME` with 1 replica and status (2, `app=NAME`).
async fn thing(kc: &Path, client: &kube::Client, name: &str) -> TestResult {
    must(&kubectl(kc, &["apply", "-f", "-"], Some(SCALE_CRD)), "apply crd")?;
    let obj =
        json!({"apiVersion": "scale.example.com/v1", "kind": "Thing", "metadata": {"name": name}, "spec": {"replicas": 1, "note": "n"}});
    let text = obj.to_string();
    eventually("the Thing is created", std::time::Duration::from_secs(20), || {
        let text = text.clone();
        async move { kubectl(kc, &["create", "-f", "-"], Some(&text)).ok }
    })
    .await?;
    let st = json!({"status": {"replicas": 2, "selector": format!("app={name}")}});
    let (code, v) =
        raw(client, "PATCH", &format!("{THINGS}/{name}/status"), "application/merge-patch+json", st.to_string().into_bytes()).await?;
    assert_eq!(code, 200, "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_scale_subresource_get_put_patch_and_kubectl_scale() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    thing(&kc, &client, "t1").await?;
    let before = get_json(&kc, "thing/t1")?;

    // GET: the Scale's shape, from the object.
    let (code, s) = raw(&client, "GET", &format!("{THINGS}/t1/scale"), "application/json", vec![]).await?;
    assert_eq!(code, 200, "{s}");
    assert_eq!((s["apiVersion"].as_str(), s["kind"].as_str()), (Some("autoscaling/v1"), Some("Scale")), "{s}");
    for k in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        assert_eq!(s["metadata"][k], before["metadata"][k], "metadata.{k}: {s}");
    }
    assert_eq!(s["spec"], json!({"replicas": 1}), "{s}");
    assert_eq!(s["status"], json!({"replicas": 2, "selector": "app=t1"}), "{s}");

    // kubectl scale sets spec.replicas of the object (a new generation, status kept).
    let out = must(&kubectl(&kc, &["scale", "--replicas=5", "thing/t1"], None), "kubectl scale")?;
    assert!(out.contains("scaled"), "{out}");
    let after = get_json(&kc, "thing/t1")?;
    assert_eq!(after["spec"]["replicas"], 5, "{after}");
    assert_eq!(after["spec"]["note"], "n", "{after}");
    assert_eq!(after["status"]["replicas"], 2, "{after}");
    assert_eq!(after["metadata"]["generation"], before["metadata"]["generation"].as_i64().unwrap_or(0) + 1, "{after}");

    // PATCH (merge) of the Scale.
    let (code, s) =
        raw(&client, "PATCH", &format!("{THINGS}/t1/scale"), "application/merge-patch+json", br#"{"spec":{"replicas":7}}"#.to_vec())
            .await?;
    assert_eq!(code, 200, "{s}");
    assert_eq!((s["kind"].as_str(), s["spec"]["replicas"].as_i64()), (Some("Scale"), Some(7)), "{s}");
    assert_eq!(get_json(&kc, "thing/t1")?["spec"]["replicas"], 7);
    // JSON patch too.
    let jp = br#"[{"op":"replace","path":"/spec/replicas","value":6}]"#.to_vec();
    let (code, s) = raw(&client, "PATCH", &format!("{THINGS}/t1/scale"), "application/json-patch+json", jp).await?;
    assert_eq!((code, s["spec"]["replicas"].as_i64()), (200, Some(6)), "{s}");
    // Strategic merge is not offered for custom resources (as upstream).
    let (code, s) = raw(
        &client,
        "PATCH",
        &format!("{THINGS}/t1/scale"),
        "application/strategic-merge-patch+json",
        br#"{"spec":{"replicas":3}}"#.to_vec(),
    )
    .await?;
    assert_eq!(code, 415, "{s}");

    // PUT with the current resourceVersion works; a stale one is a 409 and changes nothing.
    let (_, cur) = raw(&client, "GET", &format!("{THINGS}/t1/scale"), "application/json", vec![]).await?;
    let stale_rv = before["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    let mut put = cur.clone();
    put["spec"]["replicas"] = json!(4);
    let (code, s) = raw(&client, "PUT", &format!("{THINGS}/t1/scale"), "application/json", put.to_string().into_bytes()).await?;
    assert_eq!((code, s["spec"]["replicas"].as_i64()), (200, Some(4)), "{s}");
    assert_ne!(s["metadata"]["resourceVersion"], cur["metadata"]["resourceVersion"], "{s}");
    put["metadata"]["resourceVersion"] = json!(stale_rv);
    put["spec"]["replicas"] = json!(9);
    let (code, s) = raw(&client, "PUT", &format!("{THINGS}/t1/scale"), "application/json", put.to_string().into_bytes()).await?;
    assert_eq!(code, 409, "{s}");
    assert_eq!(s["reason"], "Conflict", "{s}");
    let merge_stale = json!({"metadata": {"resourceVersion": stale_rv}, "spec": {"replicas": 9}});
    let (code, s) =
        raw(&client, "PATCH", &format!("{THINGS}/t1/scale"), "application/merge-patch+json", merge_stale.to_string().into_bytes()).await?;
    assert_eq!(code, 409, "{s}");
    assert_eq!(get_json(&kc, "thing/t1")?["spec"]["replicas"], 4);

    // Invalid replicas: 422 naming the field; the CRD's schema still applies (maximum 50).
    for (body, field) in [(r#"{"spec":{"replicas":-1}}"#, "spec.replicas"), (r#"{"spec":{"replicas":"three"}}"#, "spec.replicas")] {
        let (code, s) =
            raw(&client, "PATCH", &format!("{THINGS}/t1/scale"), "application/merge-patch+json", body.as_bytes().to_vec()).await?;
        assert_eq!(code, 422, "{body}: {s}");
        assert_eq!(s["details"]["causes"][0]["field"], field, "{s}");
    }
    let (code, s) =
        raw(&client, "PATCH", &format!("{THINGS}/t1/scale"), "application/merge-patch+json", br#"{"spec":{"replicas":51}}"#.to_vec())
            .await?;
    assert_eq!(code, 422, "{s}");
    assert!(s["message"].as_str().unwrap_or_default().contains("spec.replicas"), "{s}");
    assert_eq!(get_json(&kc, "thing/t1")?["spec"]["replicas"], 4);

    // Unknown name: 404; a scale of a kind without one: 404.
    let (code, _) = raw(&client, "GET", &format!("{THINGS}/nope/scale"), "application/json", vec![]).await?;
    assert_eq!(code, 404);
    let (code, _) = raw(&client, "GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt/scale", "application/json", vec![]).await?;
    assert_eq!(code, 404);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_the_scale_subresource() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    thing(&kc, &client, "d1").await?;
    let (code, list) = raw(&client, "GET", "/apis/scale.example.com/v1", "application/json", vec![]).await?;
    assert_eq!(code, 200, "{list}");
    let names: Vec<&str> = list["resources"].as_array().into_iter().flatten().filter_map(|r| r["name"].as_str()).collect();
    assert!(names.contains(&"things/scale") && names.contains(&"things/status"), "{names:?}");
    let sc = list["resources"].as_array().into_iter().flatten().find(|r| r["name"] == "things/scale").cloned().unwrap_or_default();
    assert_eq!(
        (sc["group"].as_str(), sc["version"].as_str(), sc["kind"].as_str()),
        (Some("autoscaling"), Some("v1"), Some("Scale")),
        "{sc}"
    );
    assert_eq!(sc["verbs"], json!(["get", "patch", "update"]), "{sc}");
    let (_, apps) = raw(&client, "GET", "/apis/apps/v1", "application/json", vec![]).await?;
    let names: Vec<&str> = apps["resources"].as_array().into_iter().flatten().filter_map(|r| r["name"].as_str()).collect();
    for n in ["deployments/scale", "replicasets/scale", "statefulsets/scale"] {
        assert!(names.contains(&n), "{n}: {names:?}");
    }
    assert!(!names.contains(&"daemonsets/scale"), "{names:?}");
    // kubectl reads aggregated discovery: it still finds the kind.
    let out = must(&kubectl(&kc, &["api-resources", "--api-group=scale.example.com", "-o", "wide"], None), "api-resources")?;
    assert!(out.contains("things"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_deployment_replicaset_statefulset() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    must(&kubectl(&kc, &["create", "deployment", "d1", "--image=nginx"], None), "create deployment")?;
    let out = must(&kubectl(&kc, &["scale", "deployment", "d1", "--replicas=3"], None), "kubectl scale deployment")?;
    assert!(out.contains("scaled"), "{out}");
    assert_eq!(get_json(&kc, "deploy/d1")?["spec"]["replicas"], 3);
    let (code, s) = raw(&client, "GET", "/apis/apps/v1/namespaces/default/deployments/d1/scale", "application/json", vec![]).await?;
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["spec"]["replicas"], 3, "{s}");
    assert_eq!(s["status"]["selector"], "app=d1", "{s}");
    assert_eq!(s["status"]["replicas"], 0, "nothing runs the Deployment: {s}");
    // kubectl scale with a precondition (--current-replicas) and with --resource-version.
    must(&kubectl(&kc, &["scale", "deployment", "d1", "--current-replicas=3", "--replicas=2"], None), "scale --current-replicas")?;
    let out = kubectl(&kc, &["scale", "deployment", "d1", "--current-replicas=3", "--replicas=1"], None);
    assert!(!out.ok, "the precondition must fail: {}", out.stdout);
    let rv = get_json(&kc, "deploy/d1")?["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    must(&kubectl(&kc, &["scale", "deployment", "d1", "--resource-version", &rv, "--replicas=4"], None), "scale --resource-version")?;
    assert_eq!(get_json(&kc, "deploy/d1")?["spec"]["replicas"], 4);
    // Strategic merge on a built-in kind's Scale.
    let (code, s) = raw(
        &client,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/d1/scale",
        "application/strategic-merge-patch+json",
        br#"{"spec":{"replicas":6}}"#.to_vec(),
    )
    .await?;
    assert_eq!((code, s["spec"]["replicas"].as_i64()), (200, Some(6)), "{s}");

    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs1"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs1"}},
            "template": {"metadata": {"labels": {"app": "rs1"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    must(&kubectl(&kc, &["create", "-f", "-"], Some(&rs.to_string())), "create rs")?;
    must(&kubectl(&kc, &["scale", "rs/rs1", "--replicas=2"], None), "scale rs")?;
    assert_eq!(get_json(&kc, "rs/rs1")?["spec"]["replicas"], 2);
    let mut sts = rs.clone();
    sts["kind"] = json!("StatefulSet");
    sts["metadata"]["name"] = json!("sts1");
    sts["spec"]["serviceName"] = json!("sts1");
    must(&kubectl(&kc, &["create", "-f", "-"], Some(&sts.to_string())), "create sts")?;
    must(&kubectl(&kc, &["scale", "sts/sts1", "--replicas=0"], None), "scale sts")?;
    assert_eq!(get_json(&kc, "sts/sts1")?["spec"]["replicas"], 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_needs_rbac_on_the_scale_subresource() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    thing(&kc, &client, "r1").await?;
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "thing-editor", "namespace": "default"},
        "rules": [{"apiGroups": ["scale.example.com"], "resources": ["things"], "verbs": ["get", "list", "patch", "update"]}]});
    must(&kubectl(&kc, &["apply", "-f", "-"], Some(&role.to_string())), "role")?;
    must(&kubectl(&kc, &["create", "rolebinding", "alice-things", "--role=thing-editor", "--user=alice"], None), "rolebinding")?;
    let as_alice = |args: &[&str]| {
        let mut a = vec!["--as=alice"];
        a.extend_from_slice(args);
        kubectl(&kc, &a, None)
    };
    eventually("alice may patch the Thing", std::time::Duration::from_secs(20), || async {
        as_alice(&["patch", "thing", "r1", "--type=merge", "-p", r#"{"spec":{"note":"alice"}}"#]).ok
    })
    .await?;
    let out = as_alice(&["scale", "thing/r1", "--replicas=3"]);
    assert!(!out.ok, "{}", out.stdout);
    assert!(out.stderr.contains("forbidden") && out.stderr.contains("things/scale"), "{}", out.stderr);
    assert_eq!(get_json(&kc, "thing/r1")?["spec"]["replicas"], 1);
    // Granting things/scale lets her scale.
    let mut role2 = role.clone();
    role2["rules"][0]["resources"] = json!(["things", "things/scale"]);
    must(&kubectl(&kc, &["apply", "-f", "-"], Some(&role2.to_string())), "role with scale")?;
    eventually("alice may scale the Thing", std::time::Duration::from_secs(20), || async {
        as_alice(&["scale", "thing/r1", "--replicas=3"]).ok
    })
    .await?;
    assert_eq!(get_json(&kc, "thing/r1")?["spec"]["replicas"], 3);
    Ok(())
}
