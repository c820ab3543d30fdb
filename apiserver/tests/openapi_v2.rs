//! `kubectl apply -f` of a `kind: List` (and of files holding several documents) with
//! kubectl's default client-side validation. kubectl validates a List's items against the
//! swagger 2.0 document, which it asks `/openapi/v2` for in protobuf only
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`); the server used to answer
//! 406, so every List failed with "error validating data: 406 Not Acceptable" (issue 25).
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

const LIST: &str = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: list-demo}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: settings, namespace: list-demo}
  data: {colour: blue}
- apiVersion: provisioning.dev/v1alpha1
  kind: Server
  metadata: {name: web-1, namespace: list-demo}
  spec: {plan: small, provider: sim}
";

const SEVERAL: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: first, namespace: list-demo}
data: {a: b}
---
apiVersion: v1
kind: List
items:
- apiVersion: provisioning.dev/v1alpha1
  kind: Server
  metadata: {name: web-2, namespace: list-demo}
  spec: {plan: medium}
---
apiVersion: provisioning.dev/v1alpha1
kind: Server
metadata: {name: web-3, namespace: list-demo}
spec: {plan: large}
";

/// A misspelt field in a Server (`plna`) and an unknown top-level field in a ConfigMap.
const MISSPELT: &str = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: typo, namespace: list-demo}
  data: {a: b}
  bogus: 1
- apiVersion: provisioning.dev/v1alpha1
  kind: Server
  metadata: {name: typo, namespace: list-demo}
  spec: {plna: small}
";

async fn install_project_crds(kubeconfig: &std::path::Path) -> TestResult {
    let client = client_for(kubeconfig).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    for crd in provisioning_crds::all_crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    for crd in provisioning_crds::all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let out = kubectl(kubeconfig, &["wait", "--for=condition=Established", &format!("crd/{name}"), "--timeout=10s"], None);
        assert!(out.ok, "{name}: {}", out.stderr);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_lists_and_multi_document_files_with_client_side_validation() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let k = |args: &[&str], stdin: Option<&str>| kubectl(&kc, args, stdin);
    install_project_crds(&kc).await?;
    let dir = ts.dir.path();
    let write = |name: &str, text: &str| -> Result<String, std::io::Error> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };

    // A List: every item created, in order (the Namespace first).
    let list = write("list.yaml", LIST)?;
    let out = k(&["apply", "-f", &list], None);
    assert!(out.ok, "apply of a List: {}", out.stderr);
    for line in ["namespace/list-demo created", "configmap/settings created", "server.provisioning.dev/web-1 created"] {
        assert!(out.stdout.contains(line), "{line} missing: {}", out.stdout);
    }
    let out = k(&["get", "srv", "web-1", "-n", "list-demo", "-o", "jsonpath={.spec.plan}"], None);
    assert_eq!(out.stdout, "small", "{}", out.stderr);
    // Again: nothing to change.
    let out = k(&["apply", "-f", &list], None);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.matches("unchanged").count(), 3, "{}", out.stdout);

    // Several documents in one file, one of them a List.
    let several = write("several.yaml", SEVERAL)?;
    let out = k(&["apply", "-f", &several], None);
    assert!(out.ok, "apply of several documents: {}", out.stderr);
    for line in ["configmap/first created", "server.provisioning.dev/web-2 created", "server.provisioning.dev/web-3 created"] {
        assert!(out.stdout.contains(line), "{line} missing: {}", out.stdout);
    }

    // kubectl really validates the items against the served document (it is not skipped):
    // both unknown fields are named, and nothing is created.
    let misspelt = write("misspelt.yaml", MISSPELT)?;
    let out = k(&["apply", "-f", &misspelt], None);
    assert!(!out.ok, "a List with unknown fields was applied: {}", out.stdout);
    assert!(out.stderr.contains(r#"unknown field "plna" in dev.provisioning.v1alpha1.Server.spec"#), "{}", out.stderr);
    assert!(out.stderr.contains(r#"unknown field "bogus" in io.k8s.api.core.v1.ConfigMap"#), "{}", out.stderr);
    assert!(!out.stderr.contains("406"), "{}", out.stderr);
    let out = k(&["get", "srv,cm", "typo", "-n", "list-demo", "--ignore-not-found", "-o", "name"], None);
    assert!(out.stdout.trim().is_empty(), "created despite the refusal: {}", out.stdout);

    // Every built-in kind of deploy/ (CRDs with nullable fields, defaults and enums included)
    // passes kubectl's validation as one List: the swagger 2.0 schemas are upstream's, not
    // stricter (a CRD's `nullable`/`default` are fields of JSONSchemaProps, `enum` values any JSON).
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let out = k(&["create", "--dry-run=client", "-o", "json", "-k", &deploy.display().to_string()], None);
    assert!(out.ok, "{}", out.stderr);
    let items: Vec<serde_json::Value> =
        serde_json::Deserializer::from_str(&out.stdout).into_iter::<serde_json::Value>().collect::<Result<_, _>>()?;
    let kinds: std::collections::BTreeSet<&str> = items.iter().filter_map(|i| i["kind"].as_str()).collect();
    for kind in ["CustomResourceDefinition", "Deployment", "ClusterRole", "NetworkPolicy", "PodDisruptionBudget", "Service"] {
        assert!(kinds.contains(kind), "deploy/ has no {kind}: {kinds:?}");
    }
    let deploy_list = write("deploy-list.json", &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())?;
    let out = k(&["apply", "--dry-run=client", "-f", &deploy_list], None);
    assert!(out.ok, "deploy/ as a List: {}", out.stderr);

    // The protobuf form is what was asked for (and JSON still is, for everyone else).
    let out = k(&["get", "--raw", "/openapi/v2", "-v=8"], None);
    assert!(out.ok, "{}", out.stderr);
    assert!(serde_json::from_str::<serde_json::Value>(&out.stdout)?["swagger"] == "2.0");
    let out = k(&["apply", "-f", &list, "-v=8"], None);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
            && out.stderr.contains("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
        "kubectl's protobuf request and the answer's content type not seen: {}",
        out.stderr.lines().filter(|l| l.contains("openapi")).collect::<Vec<_>>().join("\n")
    );

    ts.server.shutdown().await;
    Ok(())
}
