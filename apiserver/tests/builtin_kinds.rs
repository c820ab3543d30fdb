//! The built-in kinds a cluster deployment uses (ServiceAccount, Service, Deployment, RBAC,
//! PodDisruptionBudget, NetworkPolicy), driven with the real kubectl: `kubectl apply -k
//! deploy/` with client-side validation against the served OpenAPI, `get` of every kind,
//! `explain` through `$ref`s, strategic merge patch, strict validation, server-side apply
//! twice, `/openapi/v2`.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::path::Path;

use common::*;

fn deploy_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("deploy").display().to_string()
}

const BAD_DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: bad, namespace: default}
spec:
  selector: {matchLabels: {app: bad}}
  template:
    metadata: {labels: {app: bad}}
    spec:
      containers:
      - name: c
        image: example/c:1
        bogusField: 1
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_dir_applies_and_builtins_behave_like_a_cluster() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let k = |args: &[&str], stdin: Option<&str>| kubectl(&kc, args, stdin);
    let deploy = deploy_dir();

    // Client-side apply with kubectl's default (strict client-side) validation, which needs
    // the OpenAPI schema of every kind in deploy/.
    let out = k(&["apply", "-k", &deploy], None);
    assert!(out.ok, "apply -k deploy/: {}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("deployment.apps/provisioning-controller created"), "{}", out.stdout);
    // Unchanged, except that kubectl always sends a PodDisruptionBudget's selector (its Go
    // field is `patchStrategy:"replace"`), so it prints "configured" there as against a real
    // cluster; the server still keeps the object as it was.
    let pdb_rv = || k(&["get", "pdb", "-A", "-o", "jsonpath={.items[*].metadata.resourceVersion}"], None).stdout;
    let before = pdb_rv();
    let out = k(&["apply", "-k", &deploy], None);
    assert!(out.ok, "{}", out.stderr);
    let changed: Vec<&str> = out.stdout.lines().filter(|l| l.contains("configured") && !l.starts_with("poddisruptionbudget")).collect();
    assert!(changed.is_empty(), "second apply changed something: {}\n{}", out.stdout, out.stderr);
    assert_eq!(pdb_rv(), before, "a no-op patch moved the resourceVersion");

    // A changed image, applied client-side: kubectl sends a strategic merge patch with
    // `$setElementOrder/containers`; the container is merged by name, nothing else lost.
    let rendered = k(&["kustomize", &deploy], None);
    assert!(rendered.ok, "{}", rendered.stderr);
    let image = k(
        &[
            "get",
            "deploy",
            "-n",
            "provisioning-system",
            "provisioning-controller",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    )
    .stdout;
    assert!(!image.is_empty());
    let changed = rendered.stdout.replace(&format!("image: {image}\n"), "image: example/changed:2\n");
    let out = k(&["apply", "-f", "-"], Some(&changed));
    assert!(out.ok && out.stdout.contains("deployment.apps/provisioning-controller configured"), "{}\n{}", out.stdout, out.stderr);
    let out = k(&["get", "deploy", "-n", "provisioning-system", "provisioning-controller", "-o", "json"], None);
    let d: serde_json::Value = serde_json::from_str(&out.stdout)?;
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "example/changed:2");
    assert!(c["ports"].as_array().is_some_and(|p| p.len() == 1) && c.get("args").is_some(), "container lost fields: {c}");
    assert_eq!(d["metadata"]["generation"], 2);
    assert!(!out.stdout.contains("$setElementOrder"));
    let out = k(
        &[
            "patch",
            "deploy",
            "-n",
            "provisioning-system",
            "provisioning-controller",
            "-p",
            r#"{"spec":{"template":{"spec":{"containers":[{"name":"controller","env":[{"name":"EXTRA","value":"1"}]}]}}}}"#,
        ],
        None,
    );
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &[
            "get",
            "deploy",
            "-n",
            "provisioning-system",
            "provisioning-controller",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env[*].name}",
        ],
        None,
    );
    assert!(out.stdout.contains("EXTRA") && out.stdout.split(' ').count() > 1, "env merged by name: {}", out.stdout);

    let out = k(&["get", "deploy,sa,svc,role,clusterrole,rolebinding,clusterrolebinding,pdb,netpol", "-A"], None);
    assert!(out.ok, "{}", out.stderr);
    for want in [
        "deployment.apps/provisioning-controller",
        "serviceaccount/provisioning-controller",
        "service/provisioning-controller-metrics",
        "role.rbac.authorization.k8s.io/",
        "clusterrole.rbac.authorization.k8s.io/",
        "rolebinding.rbac.authorization.k8s.io/",
        "clusterrolebinding.rbac.authorization.k8s.io/",
    ] {
        assert!(out.stdout.contains(want), "missing {want}:\n{}", out.stdout);
    }
    let out = k(&["get", "deploy", "-n", "provisioning-system"], None);
    let header = out.stdout.lines().next().unwrap_or_default().to_string();
    for col in ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"] {
        assert!(header.contains(col), "missing column {col}: {}", out.stdout);
    }
    // Nothing runs the pods: nothing is ready.
    assert!(out.stdout.contains("0/"), "{}", out.stdout);

    // PodDisruptionBudget and NetworkPolicy (deploy/ may not ship them yet: apply our own).
    let extra = "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pc, namespace: provisioning-system}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: x}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: pc, namespace: provisioning-system}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 8080, protocol: TCP}]
";
    let out = k(&["apply", "-f", "-"], Some(extra));
    assert!(out.ok, "{}\n{}", out.stdout, out.stderr);
    let out = k(&["get", "pdb,netpol", "-n", "provisioning-system"], None);
    assert!(
        out.stdout.contains("poddisruptionbudget.policy/pc") && out.stdout.contains("networkpolicy.networking.k8s.io/pc"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("MIN AVAILABLE") && out.stdout.contains("POD-SELECTOR") && out.stdout.contains("app=x"), "{}", out.stdout);

    // explain walks $refs from Deployment down to Container.
    let out = k(&["explain", "deployment.spec.template.spec.containers"], None);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("KIND:       Deployment") && out.stdout.contains("imagePullPolicy"), "{}", out.stdout);

    // Unknown field: refused naming it under Strict (client- and server-side), a warning
    // under Warn; a wrong type is 422 Invalid naming the field.
    let out = k(&["apply", "--validate=strict", "-f", "-"], Some(BAD_DEPLOYMENT));
    assert!(!out.ok && out.stderr.contains("bogusField"), "{}", out.stderr);
    let out = k(&["apply", "--server-side", "--validate=strict", "-f", "-"], Some(BAD_DEPLOYMENT));
    assert!(!out.ok && out.stderr.contains("unknown field \"spec.template.spec.containers[0].bogusField\""), "{}", out.stderr);
    let out = k(&["create", "--validate=warn", "--dry-run=server", "-f", "-"], Some(BAD_DEPLOYMENT));
    assert!(
        out.ok && out.stderr.contains("unknown field \"spec.template.spec.containers[0].bogusField\""),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let wrong_type = BAD_DEPLOYMENT.replace("bogusField: 1", "ports: [{containerPort: \"http\"}]");
    let out = k(&["create", "--validate=false", "-f", "-"], Some(&wrong_type));
    assert!(
        !out.ok && out.stderr.contains("is invalid") && out.stderr.contains("spec.template.spec.containers[0].ports[0].containerPort"),
        "{}",
        out.stderr
    );

    // Server-side apply, twice: the second is a no-op (same resourceVersion), and a dry run
    // changes nothing either.
    let ssa =
        BAD_DEPLOYMENT.replace("bad", "ssa").replace("        bogusField: 1\n", "        ports: [{containerPort: 8080, name: http}]\n");
    let out = k(&["apply", "--server-side", "-f", "-"], Some(&ssa));
    assert!(out.ok, "{}", out.stderr);
    let rv = |k: &dyn Fn(&[&str], Option<&str>) -> KubectlOut| {
        k(&["get", "deploy", "ssa", "-n", "default", "-o", "jsonpath={.metadata.resourceVersion} {.metadata.generation}"], None).stdout
    };
    let first = rv(&k);
    let out = k(&["apply", "--server-side", "-f", "-"], Some(&ssa));
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(rv(&k), first, "second server-side apply changed the object");
    let out = k(&["apply", "--server-side", "--dry-run=server", "-f", "-"], Some(&ssa.replace("example/c:1", "example/c:2")));
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(rv(&k), first, "dry run changed the object");
    // A real change moves the generation; a status write does not.
    let out = k(&["apply", "--server-side", "-f", "-"], Some(&ssa.replace("example/c:1", "example/c:2")));
    assert!(out.ok, "{}", out.stderr);
    let after = rv(&k);
    assert!(after.ends_with(" 2"), "generation after a spec change: {after}");
    let out = k(
        &[
            "patch",
            "deploy",
            "ssa",
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":1,"readyReplicas":1}}"#,
        ],
        None,
    );
    assert!(out.ok, "{}", out.stderr);
    assert!(rv(&k).ends_with(" 2"));
    let out = k(&["get", "deploy", "ssa", "-n", "default", "-o", "jsonpath={.status.readyReplicas}"], None);
    assert_eq!(out.stdout, "1");

    // /openapi/v2: swagger 2.0 with the definitions of every served kind.
    let out = k(&["get", "--raw", "/openapi/v2"], None);
    assert!(out.ok, "{}", out.stderr);
    let doc: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(doc["swagger"], "2.0");
    for def in [
        "io.k8s.api.apps.v1.Deployment",
        "io.k8s.api.core.v1.ServiceAccount",
        "io.k8s.api.rbac.v1.ClusterRoleBinding",
        "io.k8s.api.policy.v1.PodDisruptionBudget",
        "io.k8s.api.networking.v1.NetworkPolicy",
        "io.k8s.api.core.v1.Container",
        "io.k8s.api.core.v1.ConfigMap",
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition",
        "dev.provisioning.v1alpha1.Workspace",
    ] {
        assert!(doc["definitions"].get(def).is_some(), "/openapi/v2 lacks {def}");
    }
    assert_eq!(doc["definitions"]["io.k8s.api.apps.v1.Deployment"]["x-kubernetes-group-version-kind"][0]["kind"], "Deployment");
    assert!(!out.stdout.contains("#/components/schemas/"), "v2 refers to v3 locations");

    // A client that accepts only protobuf (kubectl) gets protobuf, as from kube-apiserver
    // (`openapi_v2.rs` has kubectl use it); one that accepts neither form gets 406.
    let client = client_for(&kc).await?;
    let req = http::Request::builder()
        .uri("/openapi/v2")
        .header("accept", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
        .body(Vec::new())?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
    );
    let req = http::Request::builder().uri("/openapi/v2").header("accept", "application/yaml").body(Vec::new())?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    assert_eq!(resp.status().as_u16(), 406);

    ts.server.shutdown().await;
    Ok(())
}

const WORKLOADS: &str = "apiVersion: v1
kind: Pod
metadata: {name: p1, namespace: work}
spec: {containers: [{name: c, image: example/c:1}]}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs1, namespace: work}
spec:
  replicas: 2
  selector: {matchLabels: {app: rs1}}
  template: {metadata: {labels: {app: rs1}}, spec: {containers: [{name: c, image: example/c:1}]}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: sts1, namespace: work}
spec:
  serviceName: sts1
  selector: {matchLabels: {app: sts1}}
  template: {metadata: {labels: {app: sts1}}, spec: {containers: [{name: c, image: example/c:1}]}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds1, namespace: work}
spec:
  selector: {matchLabels: {app: ds1}}
  template: {metadata: {labels: {app: ds1}}, spec: {containers: [{name: c, image: example/c:1}]}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: job1, namespace: work}
spec:
  template: {spec: {restartPolicy: Never, containers: [{name: c, image: example/c:1}]}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: cj1, namespace: work}
spec:
  schedule: '*/5 * * * *'
  jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: c, image: example/c:1}]}}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc1, namespace: work}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
";

/// What a client that starts from Pods and `get all` sees (issue 27): the core and workload
/// kinds answer with lists, not "the server doesn't have a resource type"; a Pod says that
/// nothing runs it; the `default/kubernetes` Service and EndpointSlice point at the server;
/// the kubeconfig's context names no namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_and_workload_kinds_answer_like_a_cluster_without_nodes() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let k = |args: &[&str], stdin: Option<&str>| kubectl(&kc, args, stdin);
    for kind in [
        "pods",
        "nodes",
        "replicasets",
        "statefulsets",
        "daemonsets",
        "jobs",
        "cronjobs",
        "pvc",
        "pv",
        "endpoints",
        "endpointslices",
        "resourcequotas",
        "limitranges",
    ] {
        let out = k(&["get", kind, "-A"], None);
        assert!(out.ok, "kubectl get {kind} -A: {}", out.stderr);
    }
    let all = k(&["get", "all", "-A"], None);
    assert!(all.ok && all.stdout.contains("service/kubernetes"), "get all -A:\n{}\n{}", all.stdout, all.stderr);
    let port = ts.server.addr().port().to_string();
    let svc = k(&["get", "svc", "kubernetes", "-n", "default", "-o", "jsonpath={.spec.ports[0].port}"], None);
    assert_eq!(svc.stdout, port, "{}", svc.stderr);
    let slice =
        k(&["get", "endpointslice", "kubernetes", "-n", "default", "-o", "jsonpath={.endpoints[0].addresses[0]}:{.ports[0].port}"], None);
    assert_eq!(slice.stdout, format!("127.0.0.1:{port}"), "{}", slice.stderr);

    assert!(k(&["create", "namespace", "work"], None).ok);
    let out = k(&["apply", "-f", "-"], Some(WORKLOADS));
    assert!(out.ok, "apply workloads: {}\n{}", out.stdout, out.stderr);
    let reason = k(&["get", "pod", "p1", "-n", "work", "-o", "jsonpath={.status.phase} {.status.conditions[0].reason}"], None);
    assert_eq!(reason.stdout, "Pending NoKubelet", "{}", reason.stderr);
    let pods = k(&["get", "pods", "-n", "work"], None);
    assert!(pods.stdout.lines().any(|l| l.starts_with("p1 ") && l.contains("0/1") && l.contains("Pending")), "{}", pods.stdout);
    let jobs = k(&["get", "jobs", "-n", "work"], None);
    assert!(jobs.stdout.lines().any(|l| l.starts_with("job1 ") && l.contains("0/1")), "{}", jobs.stdout);
    let all = k(&["get", "all", "-n", "work"], None);
    for name in ["pod/p1", "replicaset.apps/rs1", "statefulset.apps/sts1", "daemonset.apps/ds1", "job.batch/job1", "cronjob.batch/cj1"] {
        assert!(all.stdout.contains(name), "get all is missing {name}:\n{}", all.stdout);
    }
    // A misspelt field is refused as on a real server (schemas are upstream's).
    let bad = k(
        &["apply", "--validate=strict", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: p2, namespace: work}\nspec: {containerz: []}\n"),
    );
    assert!(!bad.ok, "a misspelt Pod field was accepted: {}", bad.stdout);

    // Single built-in objects as upstream's typed encoder writes them: `kind` first.
    let raw = k(&["get", "--raw", "/api/v1/namespaces/work/pods/p1"], None);
    assert!(raw.stdout.starts_with(r#"{"kind":"Pod","apiVersion":"v1","metadata":"#), "{}", raw.stdout);
    let raw = k(&["get", "--raw", "/apis/batch/v1/namespaces/work/jobs/job1"], None);
    assert!(raw.stdout.starts_with(r#"{"kind":"Job","apiVersion":"batch/v1","#), "{}", raw.stdout);

    let ns = k(&["config", "view", "--minify", "-o", "jsonpath={.contexts[0].context.namespace}"], None);
    assert!(ns.ok && ns.stdout.is_empty(), "the kubeconfig's context names a namespace: {:?}", ns.stdout);
    let can = k(&["auth", "can-i", "list", "nodes"], None);
    assert_eq!(can.stdout.trim(), "yes", "{}", can.stderr);
    ts.server.shutdown().await;
    Ok(())
}
