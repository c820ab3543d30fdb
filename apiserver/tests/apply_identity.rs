//! Server-side apply edge cases as upstream documents them (issue 27 item 3): an applied
//! configuration without `metadata.name`/`metadata.namespace` merges into the existing object
//! named by the URL (the merged result keeps the live name), a different name or namespace is
//! 400, and an unnamed apply that would create is 400 like kube-apiserver's (the result of
//! applying to an empty object has no name). For built-ins (ConfigMap) and custom resources;
//! plus `force=true` taking ownership of a conflicting field, and apply to `/status`.

mod common;

use common::*;
use serde_json::{Value, json};

const APPLY: &str = "application/apply-patch+yaml";

fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["manager"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn apply_without_name_merges_into_the_object_on_the_url() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let cms = "/api/v1/namespaces/default/configmaps";
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "baz"}, "data": {"a": "1"}});
    let (code, body) = raw(&client, "POST", cms, "application/json", serde_json::to_vec(&cm)?).await?;
    assert_eq!(code, 201, "{body}");
    let url = format!("{cms}/baz?fieldManager=tool");

    // No metadata at all, then metadata without name or namespace: both merge into baz.
    for applied in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"b": "2"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"team": "a"}}, "data": {"b": "2"}}),
    ] {
        let (code, body) = raw(&client, "PATCH", &url, APPLY, serde_json::to_vec(&applied)?).await?;
        assert_eq!(code, 200, "{applied}: {body}");
        assert_eq!(body["metadata"]["name"], "baz");
        assert_eq!(body["metadata"]["namespace"], "default");
        assert_eq!(body["data"], json!({"a": "1", "b": "2"}), "{body}");
        assert!(managers(&body).contains(&"tool".to_string()), "{body}");
    }
    // A different name or namespace is still refused.
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "qux"}, "data": {"b": "3"}});
    let (code, body) = raw(&client, "PATCH", &url, APPLY, serde_json::to_vec(&other)?).await?;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["message"], "the name of the object (qux) does not match the name on the URL (baz)");
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "kube-system"}, "data": {"b": "3"}});
    let (code, body) = raw(&client, "PATCH", &url, APPLY, serde_json::to_vec(&other)?).await?;
    assert_eq!(code, 400, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("namespace"), "{body}");
    // Applying an unnamed body where nothing exists yet creates nothing (upstream: 400).
    let unnamed = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"x": "1"}});
    let (code, body) = raw(&client, "PATCH", &format!("{cms}/fresh?fieldManager=tool"), APPLY, serde_json::to_vec(&unnamed)?).await?;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["message"], "the name of the object () does not match the name on the URL (fresh)");
    let (code, _) = raw(&client, "GET", &format!("{cms}/fresh"), "application/json", vec![]).await?;
    assert_eq!(code, 404);

    // The same for a custom resource.
    install_crd(&client).await?;
    let srv = "/apis/provisioning.dev/v1alpha1/namespaces/default/servers";
    let s = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "baz"}, "spec": {"plan": "small"}});
    eventually("Server served", std::time::Duration::from_secs(20), || {
        let (client, s) = (client.clone(), s.clone());
        async move { matches!(raw(&client, "POST", srv, "application/json", serde_json::to_vec(&s).unwrap_or_default()).await, Ok((201, _))) }
    })
    .await?;
    let applied = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "spec": {"plan": "small", "zone": "z1"}});
    let (code, body) = raw(&client, "PATCH", &format!("{srv}/baz?fieldManager=tool"), APPLY, serde_json::to_vec(&applied)?).await?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["name"], "baz");
    assert_eq!(body["spec"]["zone"], "z1");
    let other =
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "qux"}, "spec": {"plan": "small"}});
    let (code, body) = raw(&client, "PATCH", &format!("{srv}/baz?fieldManager=tool"), APPLY, serde_json::to_vec(&other)?).await?;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["message"], "the name of the object (qux) does not match the name on the URL (baz)");
    Ok(())
}

#[tokio::test]
async fn apply_force_takes_conflicting_fields_and_status_applies() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let url = |manager: &str, force: bool| format!("/api/v1/namespaces/default/configmaps/forced?fieldManager={manager}&force={force}");
    let cm = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "forced"}, "data": {"k": v}});
    let (code, body) = raw(&client, "PATCH", &url("one", false), APPLY, serde_json::to_vec(&cm("1"))?).await?;
    assert_eq!(code, 201, "{body}");
    // Another manager setting the same field to another value conflicts, naming the owner...
    let (code, body) = raw(&client, "PATCH", &url("two", false), APPLY, serde_json::to_vec(&cm("2"))?).await?;
    assert_eq!(code, 409, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("one"), "{body}");
    // ...and with force=true takes the field: "one" no longer owns it.
    let (code, body) = raw(&client, "PATCH", &url("two", true), APPLY, serde_json::to_vec(&cm("2"))?).await?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["data"]["k"], "2");
    assert_eq!(managers(&body), ["two"], "{body}");

    // Apply to /status of a custom resource sets status only, owned by the applier in the
    // status subresource's entry.
    install_crd(&client).await?;
    let srv = "/apis/provisioning.dev/v1alpha1/namespaces/default/servers";
    let s = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "st"}, "spec": {"plan": "small"}});
    eventually("Server served", std::time::Duration::from_secs(20), || {
        let (client, s) = (client.clone(), s.clone());
        async move { matches!(raw(&client, "POST", srv, "application/json", serde_json::to_vec(&s).unwrap_or_default()).await, Ok((201, _))) }
    })
    .await?;
    let status = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "st"},
        "spec": {"plan": "large"}, "status": {"phase": "Ready"}});
    let (code, body) = raw(&client, "PATCH", &format!("{srv}/st/status?fieldManager=ctl"), APPLY, serde_json::to_vec(&status)?).await?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"]["phase"], "Ready");
    assert_eq!(body["spec"]["plan"], "small", "spec changes through /status are ignored: {body}");
    let entry =
        body["metadata"]["managedFields"].as_array().and_then(|a| a.iter().find(|e| e["manager"] == "ctl").cloned()).unwrap_or(Value::Null);
    assert_eq!(entry["subresource"], "status", "{body}");
    assert_eq!(entry["operation"], "Apply", "{body}");
    Ok(())
}
