//! Conformance-style suite (issue 27 item 6): clients this project did not write, driven against
//! the embedded control plane over real HTTPS, so that a fidelity gap shows up as a failing test
//! carrying the client's own error: the official Python `kubernetes` client
//! (tests/conformance/python_client.py), kubectl's typed commands, and kube-rs's dynamic API
//! after discovery.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = manifest.canonicalize().unwrap_or_else(|_| manifest.to_path_buf());
    manifest.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The Python with the `kubernetes` client: $PROVISIONING_PYCLIENT or <workspace>/.tools/pyclient.
/// Never skips: without it the test fails naming scripts/setup.sh.
fn python_with_client() -> Result<PathBuf, String> {
    let python =
        std::env::var("PROVISIONING_PYCLIENT").map(PathBuf::from).unwrap_or_else(|_| workspace_root().join(".tools/pyclient/bin/python"));
    let probe = std::process::Command::new(&python).args(["-c", "import kubernetes; print(kubernetes.__version__)"]).output();
    match probe {
        Ok(o) if o.status.success() => Ok(python),
        Ok(o) => Err(format!(
            "{} cannot import the Python kubernetes client ({}): run scripts/setup.sh",
            python.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{}: {e}: run scripts/setup.sh (it installs the Python kubernetes client)", python.display())),
    }
}

/// Installs the project's CRDs and waits until each is Established.
async fn install_project_crds(client: &kube::Client) -> TestResult {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let all = provisioning_crds::all_crds();
    for crd in &all {
        crds.create(&PostParams::default(), crd).await?;
    }
    for crd in &all {
        let name = crd.metadata.name.clone().unwrap_or_default();
        eventually(&format!("{name} Established"), Duration::from_secs(10), || {
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
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_kubernetes_client_examples_work() -> TestResult {
    let python = python_with_client()?;
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    install_project_crds(&client).await?;
    let script = workspace_root().join("tests/conformance/python_client.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&kc)
        .arg("py-conform")
        .env("HOME", ts.dir.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out).await.map_err(|_| "python_client.py ran over 120 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python_client.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}\n{stderr}");
    ts.server.shutdown().await;
    Ok(())
}

fn must(out: &KubectlOut, what: &str) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    if out.ok { Ok(out.stdout.clone()) } else { Err(format!("kubectl {what}: {}\n{}", out.stdout, out.stderr).into()) }
}

/// kubectl's typed commands beyond `create` (kubectl_typed.rs has those): scale, set image/env,
/// label, expose, run, rollout status/restart/history, wait, api-resources, explain. With no
/// controller running, `rollout status` waits as it would on a cluster whose
/// kube-controller-manager is down (the Deployment's status never observes its generation),
/// and finishes once something writes the status a controller would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_workload_commands_work() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    install_project_crds(&client_for(&kc).await?).await?;
    let k = |args: &[&str]| kubectl(&kc, args, None);
    must(&k(&["create", "namespace", "kt"]), "create namespace")?;
    let n = ["-n", "kt"];
    let kn = |args: &[&str]| kubectl(&kc, &[&n[..], args].concat(), None);
    must(&kn(&["create", "deployment", "web", "--image=nginx:1.27", "--port=80"]), "create deployment")?;
    let out = must(
        &kn(&["get", "deploy", "web", "-o", "jsonpath={.spec.strategy.type} {.spec.template.spec.containers[0].imagePullPolicy}"]),
        "get",
    )?;
    assert_eq!(out, "RollingUpdate IfNotPresent");

    let out = must(&kn(&["scale", "deployment", "web", "--replicas=3"]), "scale")?;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    let out = must(&kn(&["set", "image", "deployment/web", "nginx=nginx:1.28"]), "set image")?;
    assert!(out.contains("deployment.apps/web image updated"), "{out}");
    let out = must(&kn(&["set", "env", "deployment/web", "MODE=prod"]), "set env")?;
    assert!(out.contains("env updated"), "{out}");
    must(&kn(&["label", "deployment/web", "tier=front"]), "label")?;
    must(&kn(&["annotate", "deployment/web", "note=hi"]), "annotate")?;
    let out = must(
        &kn(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].env[0].value} {.metadata.labels.tier} {.metadata.generation}",
        ]),
        "get",
    )?;
    assert_eq!(out, "3 nginx:1.28 prod front 4");

    // No controller: the spec update is never observed, as upstream prints it, until --timeout.
    let out = kn(&["rollout", "status", "deployment/web", "--timeout=2s"]);
    assert!(!out.ok, "rollout status finished with no controller: {}", out.stdout);
    assert!(out.stdout.contains("Waiting for deployment spec update to be observed..."), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("timed out waiting for the condition"), "{}", out.stderr);
    // A controller's status (through the status subresource) completes the rollout.
    let status = r#"{"status":{"observedGeneration":4,"replicas":3,"updatedReplicas":3,"readyReplicas":3,"availableReplicas":3}}"#;
    must(&kn(&["patch", "deployment/web", "--subresource=status", "--type=merge", "-p", status]), "patch status")?;
    let out = must(&kn(&["rollout", "status", "deployment/web", "--timeout=10s"]), "rollout status")?;
    assert!(out.contains("deployment \"web\" successfully rolled out"), "{out}");
    let out = must(&kn(&["rollout", "restart", "deployment/web"]), "rollout restart")?;
    assert!(out.contains("deployment.apps/web restarted"), "{out}");
    let out = must(&kn(&["get", "deploy", "web", "-o", "jsonpath={.spec.template.metadata.annotations}"]), "get")?;
    assert!(out.contains("kubectl.kubernetes.io/restartedAt"), "{out}");
    // History lists the Deployment's ReplicaSets: none, as no controller made one.
    must(&kn(&["rollout", "history", "deployment/web"]), "rollout history")?;

    // expose reads the Deployment's selector; the Service gets an address and its targetPort.
    must(&kn(&["expose", "deployment", "web", "--port=8080", "--target-port=80"]), "expose")?;
    let out =
        must(&kn(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP} {.spec.selector.app} {.spec.ports[0].targetPort}"]), "get svc")?;
    let (ip, rest) = out.split_once(' ').ok_or("no clusterIP")?;
    assert!(ip.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.octets()[0] == 10), "{out}");
    assert_eq!(rest, "web 80");
    let out = must(&kn(&["get", "svc", "web"]), "get svc")?;
    assert!(out.contains(ip) && out.contains("8080/TCP"), "{out}");

    // run creates a Pod (it never runs: a condition says so); wait sees a condition change.
    must(&kn(&["run", "p1", "--image=busybox", "--restart=Never", "--", "sleep", "1"]), "run")?;
    let out = must(&kn(&["get", "pod", "p1", "-o", "jsonpath={.status.phase}"]), "get pod")?;
    assert_eq!(out, "Pending");
    let out = kn(&["wait", "--for=condition=Ready", "pod/p1", "--timeout=1s"]);
    assert!(!out.ok && out.stderr.contains("timed out waiting for the condition"), "{}\n{}", out.stdout, out.stderr);
    must(&kn(&["create", "job", "j1", "--image=busybox"]), "create job")?;
    let out = must(&kn(&["get", "job", "j1", "-o", "jsonpath={.spec.backoffLimit} {.spec.selector.matchLabels}"]), "get job")?;
    assert!(out.starts_with("6 ") && out.contains("batch.kubernetes.io/controller-uid"), "{out}");
    let out = must(&kn(&["wait", "--for=jsonpath={.spec.completions}=1", "job/j1", "--timeout=5s"]), "wait jsonpath")?;
    assert!(out.contains("condition met"), "{out}");

    let out = must(&k(&["api-resources"]), "api-resources")?;
    for line in ["pods ", "deployments ", "cronjobs ", "servers "] {
        assert!(out.lines().any(|l| l.starts_with(line)), "api-resources is missing {line}:\n{out}");
    }
    let out = must(&k(&["api-resources", "--namespaced=false", "-o", "name"]), "api-resources")?;
    assert!(out.lines().any(|l| l == "nodes") && !out.lines().any(|l| l == "pods"), "{out}");
    let out = must(&k(&["explain", "deployment.spec"]), "explain")?;
    for field in ["KIND:       Deployment", "FIELD: spec <DeploymentSpec>", "replicas", "strategy", "template", "progressDeadlineSeconds"] {
        assert!(out.contains(field), "explain deployment.spec is missing {field}:\n{out}");
    }
    // kubectl itself warns for a cluster-scoped resource whenever a namespace is in effect (it
    // fills in `default` when the kubeconfig names none), as against any cluster; -A does not.
    let out = k(&["auth", "can-i", "list", "nodes"]);
    assert_eq!(out.stdout.trim(), "yes", "{}", out.stderr);
    assert!(out.stderr.contains("Warning: resource 'nodes' is not namespace scoped"), "{}", out.stderr);
    let out = k(&["auth", "can-i", "list", "nodes", "-A"]);
    assert_eq!((out.stdout.trim(), out.stderr.as_str()), ("yes", ""));
    let out = must(&k(&["get", "all", "-A"]), "get all -A")?;
    for name in ["pod/p1", "service/web", "deployment.apps/web", "job.batch/j1", "service/kubernetes"] {
        assert!(out.contains(name), "get all -A is missing {name}:\n{out}");
    }
    ts.server.shutdown().await;
    Ok(())
}

/// kube-rs's generic path, as generic tools (k9s, Argo CD, Flux) use it: discover every group,
/// then list every listable resource through `Api<DynamicObject>`, and write a built-in kind and
/// a custom resource through the `ApiResource` discovery resolved, with server-side apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_objects_through_discovery() -> TestResult {
    use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
    use kube::core::GroupVersionKind;
    use kube::discovery::{Discovery, Scope, verbs};
    use serde_json::json;

    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    install_project_crds(&client).await?;
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut listed = vec![];
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            api.list(&ListParams::default().limit(5)).await.map_err(|e| format!("list {}/{}: {e}", ar.api_version, ar.plural))?;
            listed.push(format!("{}/{}", ar.group, ar.plural));
        }
    }
    for want in ["/pods", "/nodes", "apps/deployments", "batch/cronjobs", "provisioning.dev/servers", "provisioning.dev/workspaces"] {
        assert!(listed.iter().any(|l| l == want), "{want} not listed: {listed:?}");
    }

    let (ar, caps) = discovery.resolve_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment")).ok_or("Deployment not discovered")?;
    assert_eq!(caps.scope, Scope::Namespaced);
    assert!(caps.subresources.iter().any(|(s, _)| s.plural == "deployments/scale" || s.plural == "scale"), "{:?}", caps.subresources);
    let deployments: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dyn"},
        "spec": {"selector": {"matchLabels": {"app": "dyn"}},
                 "template": {"metadata": {"labels": {"app": "dyn"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    });
    let pp = PatchParams::apply("dynamic-test");
    let out = deployments.patch("dyn", &pp, &Patch::Apply(&d)).await?;
    assert_eq!(out.data["spec"]["replicas"], 1, "{:?}", out.data);
    let scale = deployments.get_subresource("scale", "dyn").await?;
    assert_eq!(scale.data["spec"]["replicas"], 1, "{:?}", scale.data);

    let (ar, caps) =
        discovery.resolve_gvk(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", "Server")).ok_or("Server not discovered")?;
    assert_eq!(caps.scope, Scope::Namespaced);
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let s = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "dyn"}, "spec": {"plan": "small"}});
    let out = servers.patch("dyn", &pp, &Patch::Apply(&s)).await?;
    assert_eq!(out.data["spec"]["plan"], "small");
    let (ar, caps) =
        discovery.resolve_gvk(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", "Workspace")).ok_or("Workspace not discovered")?;
    assert_eq!(caps.scope, Scope::Cluster);
    let list = Api::<DynamicObject>::all_with(client.clone(), &ar).list(&ListParams::default()).await?;
    assert!(list.items.is_empty());
    ts.server.shutdown().await;
    Ok(())
}
