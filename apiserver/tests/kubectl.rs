//! The real kubectl against the server: apply (client- and server-side), get with printer
//! columns and categories, explain, patch, wait --for=condition, get -w, delete with
//! finalizers, garbage collection, validation errors as kubectl prints them.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const SERVER: &str = "apiVersion: provisioning.dev/v1alpha1
kind: Server
metadata:
  name: web-1
  labels: {app: web}
spec:
  plan: small
  zone: fi-hel1
  replicas: 2
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_end_to_end() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let k = |args: &[&str], stdin: Option<&str>| kubectl(&kc, args, stdin);

    let out = k(&["apply", "-f", "-"], Some(FIXTURE_CRD));
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["wait", "--for=condition=Established", "crd/servers.provisioning.dev", "--timeout=10s"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["api-resources", "--api-group=provisioning.dev"], None);
    assert!(out.stdout.contains("srv") && out.stdout.contains("Server"), "{}", out.stdout);

    // Client-side apply, then get by short name and category with printer columns.
    let out = k(&["apply", "-f", "-"], Some(SERVER));
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("server.provisioning.dev/web-1 created"), "{}", out.stdout);
    let out = k(&["get", "srv"], None);
    assert!(out.ok, "{}", out.stderr);
    let header = out.stdout.lines().next().unwrap_or_default().to_string();
    for col in ["NAME", "PLAN", "PHASE", "READY", "AGE"] {
        assert!(header.contains(col), "missing column {col}: {}", out.stdout);
    }
    assert!(!header.contains("REPLICAS"), "priority-1 column shown without -o wide");
    assert!(out.stdout.contains("web-1") && out.stdout.contains("small"));
    let out = k(&["get", "srv", "-o", "wide"], None);
    assert!(out.stdout.contains("REPLICAS"), "{}", out.stdout);
    let out = k(&["get", "provisioning"], None);
    assert!(out.stdout.contains("web-1"), "{} {}", out.stdout, out.stderr);
    let out = k(&["get", "srv", "-l", "app=web", "-o", "name"], None);
    assert_eq!(out.stdout.trim(), "server.provisioning.dev/web-1");
    // Re-apply unchanged: unchanged. Apply a change: configured.
    let out = k(&["apply", "-f", "-"], Some(SERVER));
    assert!(out.stdout.contains("unchanged"), "{}", out.stdout);
    let out = k(&["apply", "-f", "-"], Some(&SERVER.replace("plan: small", "plan: medium")));
    assert!(out.stdout.contains("configured"), "{} {}", out.stdout, out.stderr);

    // Explain from OpenAPI v3.
    let out = k(&["explain", "server.spec"], None);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("Abstract size of the machine") && out.stdout.contains("plan"), "{}", out.stdout);

    // Validation error printed like a real cluster.
    let bad = SERVER.replace("web-1", "bad").replace("plan: small", "plan: huge");
    let out = k(&["apply", "-f", "-"], Some(&bad));
    assert!(!out.ok);
    assert!(out.stderr.contains("spec.plan: Unsupported value: \"huge\""), "{}", out.stderr);
    let out = k(&["apply", "-f", "-"], Some(&SERVER.replace("zone: fi-hel1", "zone: fi-hel1\n  bogus: 1")));
    assert!(!out.ok && out.stderr.contains("unknown field \"spec.bogus\""), "{}", out.stderr);

    // Server-side apply, then a conflicting one and --force-conflicts.
    let ssa = "apiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata:\n  name: ssa-1\nspec:\n  plan: small\n";
    let out = k(&["apply", "--server-side", "-f", "-"], Some(ssa));
    assert!(out.ok && out.stdout.contains("serverside-applied"), "{} {}", out.stdout, out.stderr);
    let out = k(&["apply", "--server-side", "--field-manager=other", "-f", "-"], Some(&ssa.replace("small", "large")));
    assert!(!out.ok && out.stderr.contains("conflict"), "{}", out.stderr);
    let out = k(&["apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-"], Some(&ssa.replace("small", "large")));
    assert!(out.ok, "{}", out.stderr);

    // get -w streams changes.
    let cache = kc.parent().map(|p| p.join("kubectl-cache")).unwrap_or_default();
    let mut watch = Command::new(kubectl_path())
        .env("KUBECONFIG", &kc)
        .arg("--cache-dir")
        .arg(&cache)
        .args(["get", "srv", "web-1", "-w", "--request-timeout=30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = watch.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(15))?;
    assert!(first.contains("NAME") || first.contains("web-1"), "{first}");

    // Status patch through the subresource, then wait for the condition.
    let out = k(
        &[
            "patch",
            "srv",
            "web-1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","reason":"Up","message":"ok","lastTransitionTime":"2025-01-01T00:00:00Z"}]}}"#,
        ],
        None,
    );
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["wait", "--for=condition=Ready", "srv/web-1", "--timeout=10s"], None);
    assert!(out.ok, "{}", out.stderr);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut saw_running = false;
    while std::time::Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(l) if l.contains("Running") && l.contains("True") => {
                saw_running = true;
                break;
            }
            _ => {}
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(saw_running, "kubectl get -w did not stream the status change");

    // JSON patch and merge patch.
    let out = k(&["patch", "srv", "web-1", "--type=json", "-p", r#"[{"op":"replace","path":"/spec/plan","value":"large"}]"#], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["get", "srv", "web-1", "-o", "jsonpath={.spec.plan} {.metadata.generation}"], None);
    assert_eq!(out.stdout.trim(), "large 3");

    // Built-ins: ConfigMap owned by the server; GC removes it when the owner goes.
    let uid = k(&["get", "srv", "web-1", "-o", "jsonpath={.metadata.uid}"], None).stdout;
    let cm = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  ownerReferences:\n  - apiVersion: provisioning.dev/v1alpha1\n    kind: Server\n    name: web-1\n    uid: {uid}\ndata:\n  a: b\n"
    );
    let out = k(&["apply", "-f", "-"], Some(&cm));
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["get", "cm", "owned", "-o", "jsonpath={.data.a}"], None);
    assert_eq!(out.stdout, "b");

    // Delete with a finalizer: waits until the finalizer is removed.
    let out = k(&["patch", "srv", "web-1", "--type=merge", "-p", r#"{"metadata":{"finalizers":["provisioning.dev/cleanup"]}}"#], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["delete", "srv", "web-1", "--wait=false"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["get", "srv", "web-1", "-o", "jsonpath={.metadata.deletionTimestamp}"], None);
    assert!(!out.stdout.is_empty(), "deletionTimestamp not set");
    let out = k(&["patch", "srv", "web-1", "--type=json", "-p", r#"[{"op":"remove","path":"/metadata/finalizers"}]"#], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["wait", "--for=delete", "srv/web-1", "--timeout=10s"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["wait", "--for=delete", "cm/owned", "--timeout=10s"], None);
    assert!(out.ok, "garbage collection: {}", out.stderr);

    // Secret from a manifest with stringData; delete with --wait.
    let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\nstringData:\n  AWS_ACCESS_KEY_ID: abc\n";
    let out = k(&["apply", "-f", "-"], Some(secret));
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["get", "secret", "creds", "-o", "jsonpath={.data.AWS_ACCESS_KEY_ID}"], None);
    assert_eq!(out.stdout, "YWJj");
    // Imperative creates send protobuf bodies.
    let out = k(&["create", "namespace", "imperative"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["create", "secret", "generic", "aws-creds", "-n", "imperative", "--from-literal=AWS_SECRET_ACCESS_KEY=xyz"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["create", "configmap", "settings", "-n", "imperative", "--from-literal=a=b"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["get", "secret", "aws-creds", "-n", "imperative", "-o", "jsonpath={.data.AWS_SECRET_ACCESS_KEY}"], None);
    assert_eq!(out.stdout, "eHl6");
    let out = k(&["delete", "namespace", "imperative"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["get", "configmap", "-n", "imperative", "-o", "name"], None);
    assert!(out.stdout.trim().is_empty(), "{}", out.stdout);
    let out = k(&["delete", "secret", "creds"], None);
    assert!(out.ok, "{}", out.stderr);
    let out = k(&["delete", "srv", "ssa-1"], None);
    assert!(out.ok, "{}", out.stderr);
    ts.server.shutdown().await;
    Ok(())
}
