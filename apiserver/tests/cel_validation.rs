//! CRD `x-kubernetes-validations` (CEL) rules: the project's own rules (Workspace, TaskServ,
//! Cluster) through kube-rs and kubectl, a transition rule with `oldSelf`, `has()`, evaluation
//! errors, a rule that does not compile, and a big list that must not hang the server.

#![recursion_limit = "256"]

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", kind), plural)
}

fn obj(v: Value) -> Result<DynamicObject, serde_json::Error> {
    serde_json::from_value(v)
}

async fn install_project_crds(client: &Client) -> TestResult {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in provisioning_crds::all_crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    Ok(())
}

/// Asserts a 422 Invalid whose message is exactly `message`.
fn assert_invalid<T: std::fmt::Debug>(r: Result<T, kube::Error>, message: &str) {
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert_eq!(s.reason, "Invalid", "{s:?}");
            assert_eq!(s.message, message);
        }
        other => panic!("expected 422 {message:?}, got {other:?}"),
    }
}

fn cluster(name: &str, pools: &[&str], taskserv_pools: &[&str]) -> Result<DynamicObject, serde_json::Error> {
    let pools: Vec<Value> = pools.iter().map(|p| json!({"name": p, "replicas": 1})).collect();
    obj(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": name},
        "spec": {"pools": pools, "taskservs": [{"service": "containerd", "pools": taskserv_pools}]}}))
}

#[tokio::test]
async fn project_rules_accept_valid_and_reject_violations() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_project_crds(&client).await?;
    let pp = PostParams::default();

    // Workspace (cluster-scoped): unique provider names; defaults.provider names a provider.
    let ws: Api<DynamicObject> = Api::all_with(client.clone(), &ar("Workspace", "workspaces"));
    let w = |name: &str, providers: Value, defaults: Value| {
        obj(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
            "spec": {"providers": providers, "defaults": defaults}}))
    };
    ws.create(&pp, &w("ok", json!([{"name": "a", "type": "aws"}, {"name": "b", "type": "local"}]), json!({"provider": "a"}))?).await?;
    // The defaulted defaults.provider ("local") is allowed without a provider of that name.
    ws.create(&pp, &w("ok-default", json!([{"name": "a", "type": "aws"}]), json!({}))?).await?;
    assert_invalid(
        ws.create(&pp, &w("dup", json!([{"name": "a", "type": "aws"}, {"name": "a", "type": "local"}]), json!({"provider": "a"}))?).await,
        "Workspace.provisioning.dev \"dup\" is invalid: [spec.providers[1]: Duplicate value: map[string]interface {}{\"name\":\"a\"}, spec: Invalid value: \"object\": provider account names must be unique]",
    );
    assert_invalid(
        ws.create(&pp, &w("nodefault", json!([{"name": "a", "type": "aws"}]), json!({"provider": "zz"}))?).await,
        "Workspace.provisioning.dev \"nodefault\" is invalid: spec: Invalid value: \"object\": defaults.provider must name one of spec.providers",
    );
    // Through a merge patch of an existing object.
    let patch = json!({"spec": {"defaults": {"provider": "nope"}}});
    assert_invalid(
        ws.patch("ok", &PatchParams::default(), &Patch::Merge(&patch)).await,
        "Workspace.provisioning.dev \"ok\" is invalid: spec: Invalid value: \"object\": defaults.provider must name one of spec.providers",
    );

    // TaskServ: no self dependency.
    let tss: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("TaskServ", "taskservs"));
    let t = |name: &str, deps: Value| {
        obj(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": name},
            "spec": {"service": "etcd", "dependsOn": deps}}))
    };
    tss.create(&pp, &t("etcd", json!(["containerd"]))?).await?;
    assert_invalid(
        tss.create(&pp, &t("loop", json!(["containerd", "etcd"]))?).await,
        "TaskServ.provisioning.dev \"loop\" is invalid: spec: Invalid value: \"object\": a TaskServ cannot depend on its own service",
    );
    // Through an update (PUT).
    let mut cur = tss.get("etcd").await?;
    cur.data["spec"]["dependsOn"] = json!(["etcd"]);
    assert_invalid(
        tss.replace("etcd", &pp, &cur).await,
        "TaskServ.provisioning.dev \"etcd\" is invalid: spec: Invalid value: \"object\": a TaskServ cannot depend on its own service",
    );

    // Cluster: unique pool names; taskservs[].pools name pools.
    let cls: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("Cluster", "clusters"));
    cls.create(&pp, &cluster("good", &["cp", "workers"], &["cp"])?).await?;
    assert_invalid(
        cls.create(&pp, &cluster("dup", &["cp", "cp"], &["cp"])?).await,
        "Cluster.provisioning.dev \"dup\" is invalid: [spec.pools[1]: Duplicate value: map[string]interface {}{\"name\":\"cp\"}, spec: Invalid value: \"object\": pool names must be unique]",
    );
    assert_invalid(
        cls.create(&pp, &cluster("stray", &["cp"], &["gpu"])?).await,
        "Cluster.provisioning.dev \"stray\" is invalid: spec: Invalid value: \"object\": taskservs[].pools must name pools of spec.pools",
    );
    // Both at once: kube-apiserver lists every failed rule.
    assert_invalid(
        cls.create(&pp, &cluster("both", &["cp", "cp"], &["gpu"])?).await,
        "Cluster.provisioning.dev \"both\" is invalid: [spec.pools[1]: Duplicate value: map[string]interface {}{\"name\":\"cp\"}, spec: Invalid value: \"object\": pool names must be unique, spec: Invalid value: \"object\": taskservs[].pools must name pools of spec.pools]",
    );
    // Through server-side apply: a configuration naming one pool twice cannot be merged per
    // key, and is refused before validation as kube-apiserver does.
    let applied = cluster("good", &["cp", "cp"], &["cp"])?;
    match cls.patch("good", &PatchParams::apply("cel-test").force(), &Patch::Apply(&applied)).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 500, "{s:?}");
            assert_eq!(
                s.message,
                "failed to create typed patch object (default/good; provisioning.dev/v1alpha1, Kind=Cluster): .spec.pools: duplicate entries for key [name=\"cp\"]"
            );
        }
        other => return Err(format!("duplicate pools applied: {other:?}").into()),
    }
    // The Status causes carry the field path.
    let body = serde_json::to_vec(&json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "raw"}, "spec": {"pools": [{"name": "a", "replicas": 1}, {"name": "a", "replicas": 2}]}}))?;
    let (code, status) =
        raw(&client, "POST", "/apis/provisioning.dev/v1alpha1/namespaces/default/clusters", "application/json", body).await?;
    assert_eq!(code, 422);
    // A duplicate key does not block the rules: kube-apiserver reports both.
    assert_eq!(status["details"]["causes"][0]["field"], "spec.pools[1]", "{status}");
    assert_eq!(status["details"]["causes"][0]["reason"], "FieldValueDuplicate", "{status}");
    assert_eq!(status["details"]["causes"][1]["field"], "spec", "{status}");
    assert_eq!(status["details"]["causes"][1]["reason"], "FieldValueInvalid", "{status}");
    assert_eq!(status["details"]["causes"][1]["message"], "Invalid value: \"object\": pool names must be unique", "{status}");
    ts.server.shutdown().await;
    Ok(())
}

/// A fixture CRD exercising transition rules, default messages, has(), messageExpression,
/// array-item rules, map-list correlation and evaluation errors.
fn widget_crd(rules_on_spec: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.cel.test"},
        "spec": {"group": "cel.test", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('w-')", "message": "name must start with w-"}],
                    "properties": {
                    "spec": {"type": "object", "x-kubernetes-validations": rules_on_spec,
                        "properties": {
                            "mode": {"type": "string"},
                            "size": {"type": "integer", "default": 1},
                            "limit": {"type": "integer"},
                            "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                "items": {"type": "object", "required": ["name"],
                                    "x-kubernetes-validations": [
                                        {"rule": "self.weight >= 0", "messageExpression": "'weight of ' + self.name + ' must not be negative'"},
                                        {"rule": "self.weight >= oldSelf.weight", "message": "weight may only grow", "fieldPath": ".weight"}
                                    ],
                                    "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "default": 0}}}}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

async fn install_widgets(client: &Client, rules_on_spec: Value) -> Result<Api<DynamicObject>, Box<dyn std::error::Error + Send + Sync>> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &serde_json::from_value(widget_crd(rules_on_spec))?).await?;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cel.test", "v1", "Widget"), "widgets");
    Ok(Api::namespaced_with(client.clone(), "default", &ar))
}

fn widget(name: &str, spec: Value) -> Result<DynamicObject, serde_json::Error> {
    obj(json!({"apiVersion": "cel.test/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}))
}

#[tokio::test]
async fn transition_rules_defaults_has_and_errors() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let widgets = install_widgets(
        &client,
        json!([
            {"rule": "!has(self.mode) || !has(oldSelf.mode) || self.mode == oldSelf.mode", "message": "mode is immutable"},
            {"rule": "self.size <= 10"},
            {"rule": "!has(self.limit) || self.limit > self.missing", "message": "never shown"}
        ]),
    )
    .await?;
    let pp = PostParams::default();

    // Create: the transition rule is skipped (no oldSelf); defaults are visible to rules.
    let w = widgets.create(&pp, &widget("w-1", json!({"mode": "a", "items": [{"name": "x", "weight": 2}]}))?).await?;
    assert_eq!(w.data["spec"]["size"], 1);

    // Root rule sees metadata.name.
    assert_invalid(
        widgets.create(&pp, &widget("bad", json!({}))?).await,
        "Widget.cel.test \"bad\" is invalid: <nil>: Invalid value: \"object\": name must start with w-",
    );
    // A rule without message: kube-apiserver's default text.
    assert_invalid(
        widgets.create(&pp, &widget("w-big", json!({"size": 11}))?).await,
        "Widget.cel.test \"w-big\" is invalid: spec: Invalid value: \"object\": failed rule: self.size <= 10",
    );
    // An evaluation error (no such key) is a 422 naming the rule, not a crash.
    assert_invalid(
        widgets.create(&pp, &widget("w-err", json!({"limit": 3}))?).await,
        "Widget.cel.test \"w-err\" is invalid: spec: Invalid value: \"object\": No such key: missing evaluating rule: never shown",
    );
    // messageExpression on an array item.
    assert_invalid(
        widgets.create(&pp, &widget("w-neg", json!({"items": [{"name": "ok", "weight": 1}, {"name": "y", "weight": -1}]}))?).await,
        "Widget.cel.test \"w-neg\" is invalid: spec.items[1]: Invalid value: \"object\": weight of y must not be negative",
    );

    // Update: changing mode is refused with oldSelf; other changes pass.
    let patch = json!({"spec": {"mode": "b"}});
    assert_invalid(
        widgets.patch("w-1", &PatchParams::default(), &Patch::Merge(&patch)).await,
        "Widget.cel.test \"w-1\" is invalid: spec: Invalid value: \"object\": mode is immutable",
    );
    let patch = json!({"spec": {"size": 5}});
    let w = widgets.patch("w-1", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    assert_eq!(w.data["spec"]["size"], 5);
    let mut cur = widgets.get("w-1").await?;
    cur.data["spec"]["mode"] = json!("c");
    assert_invalid(
        widgets.replace("w-1", &pp, &cur).await,
        "Widget.cel.test \"w-1\" is invalid: spec: Invalid value: \"object\": mode is immutable",
    );

    // Transition rule on items of a map-list: correlated by key, with fieldPath.
    let patch = json!({"spec": {"items": [{"name": "x", "weight": 1}]}});
    assert_invalid(
        widgets.patch("w-1", &PatchParams::default(), &Patch::Merge(&patch)).await,
        "Widget.cel.test \"w-1\" is invalid: spec.items[0].weight: Invalid value: \"object\": weight may only grow",
    );
    // A new item has no old counterpart: the transition rule is skipped.
    let patch = json!({"spec": {"items": [{"name": "x", "weight": 3}, {"name": "z", "weight": 0}]}});
    widgets.patch("w-1", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    // A status-only write leaves spec unchanged: spec rules are not re-run (ratcheting).
    let status = json!({"status": {"phase": "Ready"}});
    widgets.patch_status("w-1", &PatchParams::default(), &Patch::Merge(&status)).await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn malformed_rule_rejects_the_crd() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(widget_crd(json!([{"rule": "self.size >"}])))?;
    match crds.create(&PostParams::default(), &crd).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(
                s.message.starts_with(
                    "CustomResourceDefinition.apiextensions.k8s.io \"widgets.cel.test\" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"self.size >\": compilation failed: "
                ),
                "{}",
                s.message
            );
        }
        other => return Err(format!("expected 422, got {other:?}").into()),
    }
    assert!(matches!(crds.get("widgets.cel.test").await, Err(kube::Error::Api(ref s)) if s.code == 404));
    // Same for a bad messageExpression; and the server still serves afterwards.
    let crd: CustomResourceDefinition = serde_json::from_value(widget_crd(json!([{"rule": "true", "messageExpression": "'a' +"}])))?;
    let err = crds.create(&PostParams::default(), &crd).await.err().ok_or("accepted")?;
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("messageExpression")), "{err:?}");
    let widgets = install_widgets(&client, json!([{"rule": "self.size < 5"}])).await?;
    widgets.create(&PostParams::default(), &widget("w-ok", json!({}))?).await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn big_lists_do_not_hang() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    // The project's lists carry maxItems (Cluster pools: 32), so the schema refuses big ones
    // before any rule runs; the fixture's list is unbounded.
    let widgets = install_widgets(
        &client,
        json!([{"rule": "!has(self.items) || self.items.all(a, self.items.exists_one(b, b.name == a.name))",
                "message": "item names must be unique"}]),
    )
    .await?;
    let pp = PostParams::default();
    let items = |n: usize| -> Value { (0..n).map(|i| json!({"name": format!("i{i}"), "weight": 1})).collect() };

    // A moderately sized list is evaluated in full.
    widgets.create(&pp, &widget("w-medium", json!({"items": items(100)}))?).await?;
    let mut dup = items(100);
    dup[99]["name"] = json!("i0");
    assert_invalid(
        widgets.create(&pp, &widget("w-dup", json!({"items": dup}))?).await,
        "Widget.cel.test \"w-dup\" is invalid: [spec.items[99]: Duplicate value: map[string]interface {}{\"name\":\"i0\"}, spec: Invalid value: \"object\": item names must be unique]",
    );

    // 40,000 items (under the 3 MiB body limit): the quadratic uniqueness rule would take
    // 1.6e9 steps; the cost bound refuses it quickly instead.
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), widgets.create(&pp, &widget("w-huge", json!({"items": items(40_000)}))?)).await?;
    let elapsed = started.elapsed();
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("call cost exceeds limit for rule: item names must be unique"), "{}", s.message);
        }
        other => return Err(format!("expected 422, got {:?}", other.map(|o| o.metadata.name)).into()),
    }
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
    // The server is still responsive.
    widgets.get("w-medium").await?;
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_prints_rule_failures_like_a_real_cluster() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let crds = include_str!("../../deploy/crds/crds.yaml");
    let out = kubectl(&kc, &["apply", "-f", "-"], Some(crds));
    assert!(out.ok, "{}", out.stderr);
    let good = "apiVersion: provisioning.dev/v1alpha1
kind: Cluster
metadata:
  name: web
spec:
  pools:
  - {name: cp, replicas: 1}
  - {name: workers, replicas: 2}
  taskservs:
  - {service: containerd, pools: [cp, workers]}
";
    let out = kubectl(&kc, &["apply", "-f", "-"], Some(good));
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("cluster.provisioning.dev/web created"), "{}", out.stdout);
    let bad = good.replace("name: workers", "name: cp").replace("pools: [cp, workers]", "pools: [cp]");
    let out = kubectl(&kc, &["apply", "-f", "-"], Some(&bad));
    assert!(!out.ok);
    assert!(
        out.stderr.contains("spec: Invalid value: \"object\": pool names must be unique")
            && out.stderr.contains("spec.pools[1]: Duplicate value: map[string]interface {}{\"name\":\"cp\"}"),
        "{}",
        out.stderr
    );
    let out = kubectl(
        &kc,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&good.replace("pools: [cp, workers]", "pools: [gpu]")),
    );
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("The Cluster \"web\" is invalid: spec: Invalid value: \"object\": taskservs[].pools must name pools of spec.pools"),
        "{}",
        out.stderr
    );
    ts.server.shutdown().await;
    Ok(())
}
