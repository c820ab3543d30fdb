//! Events as kube-apiserver serves them: one store behind core/v1 and events.k8s.io/v1,
//! every upstream field label in list and watch (anything else a 400 naming it), the
//! upstream Event table, the Event TTL, and the real kubectl: `describe` of every project
//! kind shows its Events, `kubectl events --for`, `get events -w --field-selector`.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

const KINDS: [(&str, &str, bool, &str); 4] = [
    ("Server", "servers", true, r#"{"plan": "small"}"#),
    ("TaskServ", "taskservs", true, r#"{"service": "etcd", "servers": {"names": ["web-1"]}}"#),
    (
        "Cluster",
        "clusters",
        true,
        r#"{"provider": "local", "pools": [{"name": "members", "replicas": 1, "plan": "small"}], "taskservs": []}"#,
    ),
    ("Workspace", "workspaces", false, r#"{"namespace": "dev"}"#),
];

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", kind), plural)
}

/// A core/v1 Event about an object, as kube-rs's recorder writes it.
fn core_event(name: &str, about: &Value, reason: &str, type_: &str, message: &str) -> Value {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": about,
        "reason": reason, "type": type_, "message": message,
        "source": {"component": "provisioning-controller"},
        "reportingComponent": "provisioning-controller", "reportingInstance": "ctl-0",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    })
}

async fn list_names(client: &kube::Client, path: &str, selector: &str) -> Result<(u16, Value), Box<dyn std::error::Error + Send + Sync>> {
    let q = format!("{path}?fieldSelector={}", selector.replace('=', "%3D").replace(',', "%2C").replace('!', "%21"));
    raw(client, "GET", &q, "application/json", vec![]).await
}

fn names(list: &Value) -> Vec<String> {
    let mut v: Vec<String> =
        list["items"].as_array().into_iter().flatten().filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string)).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_field_selectors_table_and_kubectl() -> TestResult {
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in provisioning_crds::all_crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "dev"}}))?).await?;

    // One object of every project kind, each with one Event about it.
    let mut refs = vec![];
    for (kind, plural, namespaced, spec) in KINDS {
        let ar = resource(kind, plural);
        let api: Api<DynamicObject> =
            if namespaced { Api::namespaced_with(client.clone(), "default", &ar) } else { Api::all_with(client.clone(), &ar) };
        let name = format!("{}-1", kind.to_lowercase());
        let name = if kind == "Server" { "web-1".to_string() } else { name };
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name}, "spec": serde_json::from_str::<Value>(spec)?}))?;
        let created = api.create(&PostParams::default(), &obj).await?;
        // As the controller names its objects: at the preferred version (`kubectl events --for`
        // selects on it).
        let mut about = json!({"apiVersion": provisioning_crds::preferred_api_version(kind), "kind": kind, "name": name,
            "uid": created.metadata.uid, "resourceVersion": created.metadata.resource_version});
        if namespaced {
            about["namespace"] = json!("default");
        }
        refs.push((kind, name.clone(), about));
    }
    let events = "/api/v1/namespaces/default/events";
    for (kind, name, about) in &refs {
        let ev = core_event(&format!("{name}.ev1"), about, &format!("{kind}Provisioned"), "Normal", &format!("{kind} {name} provisioned"));
        let (code, body) = raw(&client, "POST", events, "application/json", serde_json::to_vec(&ev)?).await?;
        assert_eq!(code, 201, "{body}");
    }
    // A Warning about the Server, with a field path, written through events.k8s.io/v1.
    let server_ref = refs[0].2.clone();
    let mut regarding = server_ref.clone();
    regarding["fieldPath"] = json!("spec.plan");
    let warning = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web-1.warn", "namespace": "default"},
        "regarding": regarding, "reason": "PlanUnavailable", "type": "Warning", "note": "plan small is not offered in zone z",
        "action": "Provision", "reportingController": "provisioning.dev/controller", "reportingInstance": "ctl-0",
        "eventTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)});
    let (code, body) =
        raw(&client, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", "application/json", serde_json::to_vec(&warning)?).await?;
    assert_eq!(code, 201, "{body}");

    // Every core/v1 field label, in list.
    let uid = server_ref["uid"].as_str().unwrap_or_default().to_string();
    let rv = server_ref["resourceVersion"].as_str().unwrap_or_default().to_string();
    let cases: Vec<(String, Vec<&str>)> = vec![
        ("involvedObject.kind=Server".into(), vec!["web-1.ev1", "web-1.warn"]),
        ("involvedObject.name=web-1,involvedObject.namespace=default".into(), vec!["web-1.ev1", "web-1.warn"]),
        (format!("involvedObject.uid={uid}"), vec!["web-1.ev1", "web-1.warn"]),
        ("involvedObject.apiVersion=provisioning.dev/v1beta1,involvedObject.kind=Workspace".into(), vec!["workspace-1.ev1"]),
        (format!("involvedObject.resourceVersion={rv},involvedObject.kind=Server"), vec!["web-1.ev1", "web-1.warn"]),
        ("involvedObject.fieldPath=spec.plan".into(), vec!["web-1.warn"]),
        ("reason=ClusterProvisioned".into(), vec!["cluster-1.ev1"]),
        ("reportingComponent=provisioning.dev/controller".into(), vec!["web-1.warn"]),
        ("source=provisioning-controller,involvedObject.kind=TaskServ".into(), vec!["taskserv-1.ev1"]),
        ("source=provisioning.dev/controller".into(), vec!["web-1.warn"]),
        ("type=Warning".into(), vec!["web-1.warn"]),
        ("type!=Normal".into(), vec!["web-1.warn"]),
        ("metadata.name=cluster-1.ev1".into(), vec!["cluster-1.ev1"]),
        ("metadata.namespace=default,type==Warning".into(), vec!["web-1.warn"]),
    ];
    for (sel, want) in &cases {
        let (code, body) = list_names(&client, events, sel).await?;
        assert_eq!(code, 200, "{sel}: {body}");
        assert_eq!(names(&body), *want, "core/v1 fieldSelector {sel}");
    }
    // events.k8s.io/v1 spells them regarding.* and reportingController.
    let ev_group = "/apis/events.k8s.io/v1/namespaces/default/events";
    for (sel, want) in [
        ("regarding.kind=Server,regarding.name=web-1", vec!["web-1.ev1", "web-1.warn"]),
        ("regarding.fieldPath=spec.plan", vec!["web-1.warn"]),
        ("reportingController=provisioning-controller,regarding.kind=Cluster", vec!["cluster-1.ev1"]),
        ("reason=PlanUnavailable,type=Warning", vec!["web-1.warn"]),
    ] {
        let (code, body) = list_names(&client, ev_group, sel).await?;
        assert_eq!(code, 200, "{sel}: {body}");
        assert_eq!(names(&body), want, "events.k8s.io fieldSelector {sel}");
    }
    // Anything else is a 400 naming the label, in both versions, in list and watch.
    for (path, sel) in [
        (events, "involvedObject.bogus=x"),
        (events, "regarding.kind=Server"),
        (events, "spec.plan=small"),
        (ev_group, "involvedObject.kind=Server"),
        ("/apis/provisioning.dev/v1alpha1/namespaces/default/servers", "spec.plan=small"),
    ] {
        let label = sel.split('=').next().unwrap_or_default();
        let (code, body) = list_names(&client, path, sel).await?;
        assert_eq!(code, 400, "{path} {sel}: {body}");
        assert_eq!(body["message"], format!("field label not supported: {label}"), "{body}");
        let watch = format!("{path}?watch=true&fieldSelector={}", sel.replace('=', "%3D").replace(',', "%2C"));
        let (code, body) = raw(&client, "GET", &watch, "application/json", vec![]).await?;
        assert_eq!(code, 400, "watch {path} {sel}: {body}");
    }
    let (code, body) = raw(&client, "GET", &format!("{events}?watch=true&fieldSelector=bogus%3Dx"), "application/json", vec![]).await?;
    assert_eq!(code, 400, "watch with an unknown field label: {body}");
    // Namespaces keep status.phase, as upstream.
    let (code, body) = list_names(&client, "/api/v1/namespaces", "status.phase=Active,metadata.name=dev").await?;
    assert_eq!((code, names(&body)), (200, vec!["dev".to_string()]), "{body}");

    // Watch with a field selector: only matching Events arrive.
    let core_events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let list = core_events.list(&ListParams::default()).await?;
    let from = list.metadata.resource_version.unwrap_or_default();
    let mut stream = core_events.watch(&WatchParams::default().fields("type=Warning,involvedObject.kind=Server"), &from).await?.boxed();
    let normal = core_event("web-1.ev2", &server_ref, "Checked", "Normal", "still fine");
    let warn2 = core_event("web-1.ev3", &server_ref, "Unreachable", "Warning", "ssh timed out");
    for ev in [normal, warn2] {
        let (code, body) = raw(&client, "POST", events, "application/json", serde_json::to_vec(&ev)?).await?;
        assert_eq!(code, 201, "{body}");
    }
    let got = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await??;
    match got {
        Some(WatchEvent::Added(e)) => assert_eq!(e.metadata.name.as_deref(), Some("web-1.ev3")),
        other => panic!("expected the Warning event, got {other:?}"),
    }
    drop(stream);

    // The Event table: upstream's columns in upstream's order (Name last, wide only).
    let req = http::Request::builder().uri(events).header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io").body(Vec::new())?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    use http_body_util::BodyExt;
    let table: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    let cols: Vec<(String, i64)> = table["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["name"].as_str().unwrap_or_default().to_string(), c["priority"].as_i64().unwrap_or(0)))
        .collect();
    let want: Vec<(String, i64)> = [
        ("Last Seen", 0),
        ("Type", 0),
        ("Reason", 0),
        ("Object", 0),
        ("Subobject", 1),
        ("Source", 1),
        ("Message", 0),
        ("First Seen", 1),
        ("Count", 1),
        ("Name", 1),
    ]
    .iter()
    .map(|(n, p)| (n.to_string(), *p))
    .collect();
    assert_eq!(cols, want, "{table}");
    let warn_row = table["rows"].as_array().into_iter().flatten().find(|r| r["cells"][9] == "web-1.warn").ok_or("no row for web-1.warn")?;
    assert_eq!(warn_row["cells"][1], "Warning");
    assert_eq!(warn_row["cells"][3], "server/web-1");
    assert_eq!(warn_row["cells"][4], "spec.plan");
    assert_eq!(warn_row["cells"][5], "provisioning.dev/controller, ctl-0");
    assert_eq!(warn_row["cells"][6], "plan small is not offered in zone z");
    assert_eq!(warn_row["cells"][8], 1);

    // The real kubectl.
    let k = |args: &[&str]| kubectl(&kc, args, None);
    for (kind, name, _) in &refs {
        let res = format!("{}/{name}", kind.to_lowercase());
        let out = k(&["describe", &res]);
        assert!(out.ok, "describe {res}: {}", out.stderr);
        let events_part = out.stdout.split("Events:").nth(1).unwrap_or_default();
        assert!(events_part.contains(&format!("{kind}Provisioned")), "describe {res} shows no Events:\n{}", out.stdout);
    }
    let out = k(&["describe", "srv", "web-1"]);
    assert!(out.stdout.contains("PlanUnavailable") && out.stdout.contains("Unreachable"), "{}", out.stdout);
    let out = k(&["events", "--for", "server/web-1"]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("ServerProvisioned") && out.stdout.contains("PlanUnavailable"), "{}", out.stdout);
    assert!(!out.stdout.contains("ClusterProvisioned"), "kubectl events --for server/web-1 shows other objects' events:\n{}", out.stdout);
    let out = k(&["events", "--types=Warning"]);
    assert!(out.stdout.contains("Unreachable") && !out.stdout.contains("ServerProvisioned"), "{}", out.stdout);
    let out = k(&["get", "events"]);
    assert!(out.ok, "{}", out.stderr);
    let header: Vec<&str> = out.stdout.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{}", out.stdout);
    let out = k(&["get", "events", "-o", "wide"]);
    let header: Vec<&str> = out.stdout.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE", "FIRST", "SEEN", "COUNT", "NAME"],
        "{}",
        out.stdout
    );
    let out = k(&["get", "events", "--field-selector", "involvedObject.kind=Cluster", "-o", "name"]);
    assert_eq!(out.stdout.trim(), "event/cluster-1.ev1", "{} {}", out.stdout, out.stderr);
    let out = k(&["get", "events", "--field-selector", "nonsense=1"]);
    assert!(!out.ok && out.stderr.contains("field label not supported: nonsense"), "{}", out.stderr);

    // kubectl get events -w --field-selector type=Warning: a new Warning shows, Normal ones do not.
    let cache = kc.parent().map(|p| p.join("kubectl-cache")).unwrap_or_default();
    let mut child = Command::new(kubectl_path())
        .env("KUBECONFIG", &kc)
        .arg("--cache-dir")
        .arg(&cache)
        .args(["get", "events", "-w", "--field-selector", "type=Warning", "--request-timeout=60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The initial list arrives first; then write one Normal and one Warning.
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await?.ok_or("kubectl -w printed nothing")?;
    assert!(first.contains("LAST SEEN") || first.contains("Warning"), "{first}");
    for ev in [
        core_event("web-1.ev4", &server_ref, "Rechecked", "Normal", "fine"),
        core_event("web-1.ev5", &server_ref, "DiskFull", "Warning", "disk full"),
    ] {
        let (code, body) = raw(&client, "POST", events, "application/json", serde_json::to_vec(&ev)?).await?;
        assert_eq!(code, 201, "{body}");
    }
    let mut seen = vec![first];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.iter().any(|l| l.contains("DiskFull")) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(l)) => seen.push(l),
            _ => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.iter().any(|l| l.contains("DiskFull")), "kubectl get events -w did not show the new Warning: {seen:?}");
    assert!(
        !seen.iter().any(|l| l.contains("Rechecked") || l.contains("ServerProvisioned")),
        "a Normal event passed type=Warning: {seen:?}"
    );
    ts.server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_expire_after_the_ttl() -> TestResult {
    let limits = provisioning_apiserver::Limits { event_ttl: Duration::from_secs(3), ..Default::default() };
    let ts = start_with(limits).await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let about = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "namespace": "default"});
    let events = "/api/v1/namespaces/default/events";
    // One Event last seen two hours ago goes at the first sweep; a fresh one lives about 3 s.
    let mut old = core_event("old", &about, "Old", "Normal", "long ago");
    let two_hours_ago = (chrono::Utc::now() - chrono::Duration::hours(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    old["lastTimestamp"] = json!(two_hours_ago);
    old["firstTimestamp"] = json!(two_hours_ago);
    for ev in [old, core_event("fresh", &about, "Fresh", "Normal", "just now")] {
        let (code, body) = raw(&client, "POST", events, "application/json", serde_json::to_vec(&ev)?).await?;
        assert_eq!(code, 201, "{body}");
    }
    let created = std::time::Instant::now();
    let list = || {
        let client = client.clone();
        async move { raw(&client, "GET", events, "", vec![]).await.map(|(_, b)| names(&b)).unwrap_or_default() }
    };
    // Creation stamps managedFields with now, so "old" is only as old as its last write: it
    // expires with "fresh", after the TTL and not before.
    assert_eq!(list().await, vec!["fresh".to_string(), "old".to_string()]);
    eventually("both events expired", Duration::from_secs(30), || async { list().await.is_empty() }).await?;
    assert!(created.elapsed() >= Duration::from_secs(2), "events expired before their TTL: {:?}", created.elapsed());
    // Other kinds never expire.
    let (code, _) = raw(&client, "GET", "/api/v1/namespaces/default", "", vec![]).await?;
    assert_eq!(code, 200);
    ts.server.shutdown().await;
    Ok(())
}
