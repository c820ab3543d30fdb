//! kubectl's typed commands send built-in kinds as `application/vnd.kubernetes.protobuf`
//! (issue 27 item 2): the real kubectl creates a Deployment, Services, a Job, a CronJob, a
//! ResourceQuota and a PodDisruptionBudget against the server, and reads back the JSON the
//! server stored. A protobuf body with a field the server does not know is refused with 415,
//! not stored without it.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use common::*;
use serde_json::{Value, json};

fn get_json(kc: &std::path::Path, what: &str) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    let out = kubectl(kc, &["get", what, "-o", "json", "--show-managed-fields"], None);
    if !out.ok {
        return Err(format!("kubectl get {what}: {}", out.stderr).into());
    }
    Ok(serde_json::from_str(&out.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_create_commands_send_protobuf_and_work() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let k = |args: &[&str]| kubectl(&kc, args, None);
    for args in [
        &["create", "deployment", "d1", "--image=nginx", "--replicas=2", "--port=80"][..],
        &["create", "service", "clusterip", "s1", "--tcp=80:8080"],
        &["create", "service", "nodeport", "s2", "--tcp=80:web"],
        &["create", "job", "j1", "--image=busybox", "--", "echo", "hi"],
        &["create", "cronjob", "c1", "--image=busybox", "--schedule=*/1 * * * *"],
        &["create", "quota", "q1", "--hard=pods=2,requests.cpu=1"],
        &["create", "pdb", "p1", "--selector=app=d1", "--min-available=1"],
        &["create", "serviceaccount", "sa1"],
        &["create", "role", "r1", "--verb=get,list", "--resource=deployments.apps"],
        &["create", "rolebinding", "rb1", "--role=r1", "--serviceaccount=default:sa1"],
    ] {
        let out = k(args);
        assert!(out.ok, "kubectl {}: {}", args.join(" "), out.stderr);
        assert!(out.stdout.contains("created"), "{}", out.stdout);
    }
    // kubectl did send protobuf (so the above went through the decoder).
    let out = k(&["-v=8", "create", "deployment", "d9", "--image=nginx"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stderr.contains("Content-Type: application/vnd.kubernetes.protobuf"), "{}", out.stderr);

    let d = get_json(&kc, "deploy/d1")?;
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["spec"]["selector"], json!({"matchLabels": {"app": "d1"}}));
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!((c["name"].as_str(), c["image"].as_str()), (Some("nginx"), Some("nginx")), "{d}");
    assert_eq!(c["ports"][0]["containerPort"], 80, "{d}");
    assert_eq!(d["metadata"]["managedFields"][0]["manager"], "kubectl-create", "{d}");

    let s = get_json(&kc, "svc/s1")?;
    assert_eq!(s["spec"]["ports"][0]["port"], 80, "{s}");
    assert_eq!(s["spec"]["ports"][0]["targetPort"], 8080, "{s}");
    assert_eq!(s["spec"]["type"], "ClusterIP");
    assert_eq!(s["spec"]["selector"], json!({"app": "s1"}));
    let s = get_json(&kc, "svc/s2")?;
    assert_eq!(s["spec"]["ports"][0]["targetPort"], "web", "{s}");
    assert_eq!(s["spec"]["type"], "NodePort");

    let j = get_json(&kc, "job/j1")?;
    let c = &j["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["command"], json!(["echo", "hi"]), "{j}");
    assert_eq!(j["spec"]["template"]["spec"]["restartPolicy"], "Never", "{j}");

    let cj = get_json(&kc, "cronjob/c1")?;
    assert_eq!(cj["spec"]["schedule"], "*/1 * * * *");
    assert_eq!(cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"], "OnFailure", "{cj}");

    let q = get_json(&kc, "quota/q1")?;
    assert_eq!(q["spec"]["hard"], json!({"pods": "2", "requests.cpu": "1"}), "{q}");
    let p = get_json(&kc, "pdb/p1")?;
    assert_eq!(p["spec"]["minAvailable"], 1, "{p}");
    assert_eq!(p["spec"]["selector"], json!({"matchLabels": {"app": "d1"}}), "{p}");
    let rb = get_json(&kc, "rolebinding/rb1")?;
    assert_eq!(rb["subjects"], json!([{"kind": "ServiceAccount", "name": "sa1", "namespace": "default"}]), "{rb}");

    // `kubectl create job --from=cronjob/...` sends the owner reference and annotations too.
    let out = k(&["create", "job", "j2", "--from=cronjob/c1"]);
    assert!(out.ok, "{}", out.stderr);
    let j2 = get_json(&kc, "job/j2")?;
    assert_eq!(j2["metadata"]["ownerReferences"][0]["name"], "c1", "{j2}");
    assert_eq!(j2["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"], "manual", "{j2}");

    // A field this server's table does not know is refused, naming it.
    let client = client_for(&kc).await?;
    let container = [pb(1, b"c"), pb(2, b"img"), pb(15, &[0x08, 0x01])].concat();
    let spec = pb(3, &pb(2, &pb(2, &container)));
    let obj = [pb(1, &pb(1, b"d-unknown")), pb(2, &spec)].concat();
    let tm = [pb(1, b"apps/v1"), pb(2, b"Deployment")].concat();
    let body = [b"k8s\x00".to_vec(), pb(1, &tm), pb(2, &obj)].concat();
    let (code, status) =
        raw(&client, "POST", "/apis/apps/v1/namespaces/default/deployments", "application/vnd.kubernetes.protobuf", body).await?;
    assert_eq!(code, 415, "{status}");
    assert_eq!(status["message"], "protobuf field 15 of Container is not supported by this server; send application/json");
    let out = k(&["get", "deploy/d-unknown"]);
    assert!(!out.ok, "stored without the unknown field: {}", out.stdout);
    Ok(())
}

/// One length-delimited protobuf field (payloads under 128 bytes).
fn pb(n: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(n << 3) | 2, u8::try_from(payload.len()).unwrap_or(127)];
    out.extend_from_slice(payload);
    out
}
