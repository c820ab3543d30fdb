//! A k9s session, replayed request by request (k9s itself cannot be installed here).
//!
//! The sequence and headers come from reading the sources of k9s (derailed/k9s, go.mod:
//! client-go v0.35.3) and client-go (kubernetes/client-go):
//! - start-up, derailed/k9s `internal/client/client.go`: `InitConnection` →
//!   `supportsMetricsResources` → `Discovery().ServerGroups()` (GET /api, GET /apis), then
//!   `CheckConnectivity` → `ServerVersion()` (GET /version).
//! - discovery, kubernetes/client-go `discovery/discovery_client.go`: `downloadLegacy` and
//!   `downloadAPIs` send `Accept: AcceptV2 + "," + AcceptV1` and pick the parser by the
//!   answer's Content-Type (`ContentTypeIsGVK`); with the legacy answer the resources come
//!   from one GET per group/version (`ServerPreferredResources`, derailed/k9s
//!   `internal/dao/registry.go` `loadPreferred`).
//! - authorization, derailed/k9s `internal/client/client.go` `CanI`/`makeSAR`: one
//!   SelfSubjectAccessReview per verb before a view opens (`internal/watch/factory.go`
//!   `CanForResource`, `internal/view/browser.go`).
//! - CRDs and namespaces, derailed/k9s `internal/dao/registry.go` `loadCRDs` (informer on
//!   customresourcedefinitions) and `internal/client/client.go` `ValidNamespaceNames` (SSAR
//!   list namespaces, then a plain list).
//! - informers, kubernetes/client-go `tools/cache/reflector.go` `watchList`: with
//!   `features/known_features.go` WatchListClient on by default since 1.35, every informer
//!   starts with `watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&
//!   allowWatchBookmarks=true&timeoutSeconds=N` and is synced at the BOOKMARK annotated
//!   `k8s.io/initial-events-end: "true"`; an error (422 included) makes it fall back to list.
//! - resource views, derailed/k9s `internal/dao/table.go` `Table.List`: the Table Accept
//!   header below with `includeObject=Metadata`; the Events view is `events.k8s.io/v1/events`
//!   (`internal/client/gvrs.go` EvGVR; `v1/events` is skipped as deprecated in
//!   `internal/dao/registry.go`).
//! - describe, kubernetes/kubectl `pkg/describe/describe.go` `searchEvents`: core/v1 events
//!   listed with `fieldSelector=involvedObject.kind=..,involvedObject.name=..,
//!   involvedObject.namespace=..,involvedObject.uid=..` (client-go
//!   `kubernetes/typed/core/v1/event_expansion.go` `GetFieldSelector`) and `limit=500`.
//!
//! The SelfSubjectAccessReview answers are served by the authorization work (helper "auth")
//! and the Event field selectors by the events work (helper "limits"); this test expects
//! both.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use kube::Client;
use serde_json::{Value, json};

/// client-go's default User-Agent shape for the k9s binary (`rest.DefaultKubernetesUserAgent`).
const USER_AGENT: &str = "k9s/v0.50.16 (linux/amd64) kubernetes/$Format";
/// client-go `discovery/discovery_client.go` `acceptDiscoveryFormats`.
const ACCEPT_DISCOVERY: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
/// derailed/k9s `internal/dao/table.go` `header`.
const ACCEPT_TABLE: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
/// A typed or dynamic client-go client asking for JSON.
const ACCEPT_JSON: &str = "application/json, */*";

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Answer {
    status: u16,
    content_type: String,
    body: Value,
}

async fn send(client: &Client, method: &str, path: &str, accept: &str, body: Option<Value>) -> Res<Answer> {
    let mut req = http::Request::builder().method(method).uri(path).header("accept", accept).header("user-agent", USER_AGENT);
    let bytes = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            serde_json::to_vec(&b)?
        }
        None => vec![],
    };
    let resp = client.send(req.body(kube::client::Body::from(bytes))?).await?;
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    let raw = resp.into_body().collect().await?.to_bytes();
    let body =
        serde_json::from_slice(&raw).map_err(|e| format!("{method} {path}: body is not JSON ({e}): {}", String::from_utf8_lossy(&raw)))?;
    Ok(Answer { status, content_type, body })
}

async fn get(client: &Client, path: &str, accept: &str) -> Res<Answer> {
    send(client, "GET", path, accept, None).await
}

fn ok(step: &str, a: &Answer, code: u16) -> Res<()> {
    if a.status != code {
        return Err(format!("{step}: expected {code}, got {} {}", a.status, a.body).into());
    }
    Ok(())
}

/// client-go `ContentTypeIsGVK`: base type and the g/v/as parameters, in any order.
fn is_aggregated(content_type: &str) -> bool {
    let mut parts = content_type.split(';').map(str::trim);
    let base = parts.next().unwrap_or_default();
    let params: Vec<(String, String)> =
        parts.filter_map(|p| p.split_once('=').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))).collect();
    let param = |k: &str| params.iter().find(|(pk, _)| pk == k).map(|(_, v)| v.as_str());
    base == "application/json"
        && param("g") == Some("apidiscovery.k8s.io")
        && param("v") == Some("v2")
        && param("as") == Some("APIGroupDiscoveryList")
}

/// k9s `makeSAR` plus one verb: POST a SelfSubjectAccessReview and require `allowed`.
async fn can_i(client: &Client, ns: &str, group: &str, resource: &str, verbs: &[&str]) -> Res<()> {
    for verb in verbs {
        let mut attrs = json!({"verb": verb, "resource": resource});
        if !ns.is_empty() {
            attrs["namespace"] = json!(ns);
        }
        if !group.is_empty() {
            attrs["group"] = json!(group);
        }
        let sar = json!({"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null}, "spec": {"resourceAttributes": attrs}, "status": {"allowed": false}});
        let a = send(client, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", ACCEPT_JSON, Some(sar)).await?;
        ok(&format!("SelfSubjectAccessReview {verb} {group}/{resource} in {ns:?}"), &a, 201)?;
        if a.body["status"]["allowed"] != json!(true) {
            return Err(format!("SelfSubjectAccessReview {verb} {resource}: not allowed: {}", a.body).into());
        }
    }
    Ok(())
}

/// What one informer start (reflector `watchList`) received before the initial-events-end
/// bookmark, and the watch kept open after it.
struct WatchList {
    added: Vec<Value>,
    bookmark: Value,
    body: kube::client::Body,
    rest: Vec<u8>,
}

/// Opens a watch-list exactly as the reflector does and reads until the bookmark annotated
/// `k8s.io/initial-events-end` (or fails on anything else: an ERROR, the end, the deadline).
async fn watch_list(client: &Client, path: &str) -> Res<WatchList> {
    let uri =
        format!("{path}?allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=300&watch=true");
    let req = http::Request::builder()
        .uri(&uri)
        .header("accept", ACCEPT_JSON)
        .header("user-agent", USER_AGENT)
        .body(kube::client::Body::from(vec![]))?;
    let resp = client.send(req).await?;
    if resp.status() != 200 {
        let raw = resp.into_body().collect().await?.to_bytes();
        return Err(format!("watch-list {path}: {}", String::from_utf8_lossy(&raw)).into());
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = vec![];
    let mut added = vec![];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let ev: Value = serde_json::from_slice(&line)?;
            match ev["type"].as_str() {
                Some("ADDED") => added.push(ev["object"].clone()),
                Some("BOOKMARK") if ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true" => {
                    return Ok(WatchList { added, bookmark: ev["object"].clone(), body, rest: buf });
                }
                Some("BOOKMARK") => {}
                _ => return Err(format!("watch-list {path}: unexpected event before the initial-events-end bookmark: {ev}").into()),
            }
        }
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .map_err(|_| format!("watch-list {path}: no initial-events-end bookmark within 30 s (objects so far: {})", added.len()))?;
        match frame {
            Some(f) => {
                if let Ok(data) = f?.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            None => return Err(format!("watch-list {path}: stream ended before the initial-events-end bookmark").into()),
        }
    }
}

impl WatchList {
    /// The next non-bookmark event on the still-open watch.
    async fn next_event(&mut self) -> Res<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            while let Some(nl) = self.rest.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.rest.drain(..=nl).collect();
                let ev: Value = serde_json::from_slice(&line)?;
                if ev["type"] != "BOOKMARK" {
                    return Ok(ev);
                }
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.map_err(|_| "no event within 30 s on the open watch")?;
            match frame {
                Some(f) => {
                    if let Ok(data) = f?.into_data() {
                        self.rest.extend_from_slice(&data);
                    }
                }
                None => return Err("watch ended".into()),
            }
        }
    }
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The fixture: the project's CRDs, namespace `demo`, Server `web` and one Event about it,
/// written the way the controller writes them (events.k8s.io/v1).
async fn fixture(client: &Client) -> Res<String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in provisioning_crds::all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &PatchParams::apply("provisioning-controller").force(), &Patch::Apply(&crd)).await?;
    }
    let ns = send(
        client,
        "POST",
        "/api/v1/namespaces",
        ACCEPT_JSON,
        Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})),
    )
    .await?;
    ok("create namespace", &ns, 201)?;
    let server = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"plan": "small"}});
    let mut created = None;
    // The CRD is served once the registry is rebuilt: retry briefly on 404.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while created.is_none() {
        let a = send(client, "POST", "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers", ACCEPT_JSON, Some(server.clone())).await?;
        match a.status {
            201 => created = Some(a.body),
            404 if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return Err(format!("create server: {} {}", a.status, a.body).into()),
        }
    }
    let uid = created.as_ref().and_then(|c| c["metadata"]["uid"].as_str()).unwrap_or_default().to_string();
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web.k9s-session", "namespace": "demo"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal", "reason": "MachineRequested", "action": "Create",
        "note": "asked the provider for a machine",
        "regarding": {"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "name": "web", "namespace": "demo", "uid": uid},
        "reportingController": "provisioning-controller", "reportingInstance": "test"});
    let e = send(client, "POST", "/apis/events.k8s.io/v1/namespaces/demo/events", ACCEPT_JSON, Some(event)).await?;
    ok("create event", &e, 201)?;
    Ok(uid)
}

#[tokio::test]
async fn k9s_session_replayed() -> TestResult {
    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let uid = fixture(&client).await?;

    // 1. InitConnection → ServerGroups: aggregated discovery on /api and /apis.
    let core = get(&client, "/api", ACCEPT_DISCOVERY).await?;
    ok("GET /api (aggregated)", &core, 200)?;
    assert!(is_aggregated(&core.content_type), "GET /api answered {:?}", core.content_type);
    assert_eq!(core.body["kind"], "APIGroupDiscoveryList");
    let core_v1 = &core.body["items"][0]["versions"][0];
    assert_eq!(core_v1["version"], "v1");
    let find = |version: &Value, res: &str| -> Value {
        version["resources"].as_array().into_iter().flatten().find(|r| r["resource"] == res).cloned().unwrap_or(Value::Null)
    };
    assert_eq!(find(core_v1, "namespaces")["scope"], "Cluster");
    assert_eq!(find(core_v1, "events")["responseKind"]["kind"], "Event");
    let apis = get(&client, "/apis", ACCEPT_DISCOVERY).await?;
    ok("GET /apis (aggregated)", &apis, 200)?;
    assert!(is_aggregated(&apis.content_type), "GET /apis answered {:?}", apis.content_type);
    let group = |name: &str| -> Value {
        apis.body["items"].as_array().into_iter().flatten().find(|g| g["metadata"]["name"] == name).cloned().unwrap_or(Value::Null)
    };
    let prov = group("provisioning.dev");
    let servers = find(&prov["versions"][0], "servers");
    // Both served versions, the preferred (v1beta1) first, as kube-apiserver orders them.
    assert_eq!(prov["versions"][0]["version"], "v1beta1");
    assert_eq!(prov["versions"][1]["version"], "v1alpha1");
    assert_eq!(servers["scope"], "Namespaced");
    assert_eq!(servers["shortNames"], json!(["srv"]));
    assert_eq!(servers["categories"], json!(["provisioning"]));
    assert_eq!(servers["subresources"][0]["subresource"], "status");
    assert!(servers["verbs"].as_array().is_some_and(|v| v.contains(&json!("watch"))), "{servers}");
    assert_eq!(find(&group("events.k8s.io")["versions"][0], "events")["scope"], "Namespaced");

    // 1b. The legacy answer a client without aggregated discovery gets (UseLegacyDiscovery:
    // Accept AcceptV1), and the per-group/version lists ServerPreferredResources then reads.
    let legacy = get(&client, "/api", "application/json").await?;
    ok("GET /api (legacy)", &legacy, 200)?;
    assert!(!is_aggregated(&legacy.content_type), "{}", legacy.content_type);
    assert_eq!(legacy.body["kind"], "APIVersions");
    let legacy_apis = get(&client, "/apis", "application/json").await?;
    assert_eq!(legacy_apis.body["kind"], "APIGroupList");
    for gv in legacy_apis.body["groups"].as_array().into_iter().flatten().filter_map(|g| g["preferredVersion"]["groupVersion"].as_str()) {
        let list = get(&client, &format!("/apis/{gv}"), ACCEPT_JSON).await?;
        ok(&format!("GET /apis/{gv}"), &list, 200)?;
        assert_eq!(list.body["kind"], "APIResourceList");
        // Every legacy resource is in the aggregated document too.
        let (g, v) = gv.split_once('/').unwrap_or(("", gv));
        let agg = group(g);
        let agg_v = agg["versions"].as_array().into_iter().flatten().find(|x| x["version"] == v).cloned().unwrap_or(Value::Null);
        for r in list.body["resources"].as_array().into_iter().flatten().filter_map(|r| r["name"].as_str()).filter(|n| !n.contains('/')) {
            assert!(!find(&agg_v, r).is_null(), "{gv} {r} is in legacy discovery but not in the aggregated one");
        }
    }

    // 2. CheckConnectivity → ServerVersion.
    let version = get(&client, "/version", ACCEPT_JSON).await?;
    ok("GET /version", &version, 200)?;
    let git_version = version.body["gitVersion"].as_str().unwrap_or_default();
    assert!(git_version.starts_with("v1.") && version.body["major"] == "1", "{}", version.body);

    // 3. loadCRDs: an informer on CRDs (SSAR list+watch first, then watch-list).
    can_i(&client, "", "apiextensions.k8s.io", "customresourcedefinitions", &["list", "watch"]).await?;
    let crds = watch_list(&client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions").await?;
    let names: Vec<&str> = crds.added.iter().filter_map(|c| c["metadata"]["name"].as_str()).collect();
    for want in ["workspaces.provisioning.dev", "servers.provisioning.dev", "taskservs.provisioning.dev", "clusters.provisioning.dev"] {
        assert!(names.contains(&want), "watch-list of CRDs lacks {want}: {names:?}");
    }
    assert_eq!(crds.bookmark["kind"], "CustomResourceDefinition");
    assert!(crds.added.iter().all(|c| rv(c) <= rv(&crds.bookmark)), "the bookmark's resourceVersion covers every object sent");
    drop(crds);

    // 4. ValidNamespaceNames: SSAR list namespaces, then the list; the namespace informer.
    can_i(&client, "", "", "namespaces", &["list"]).await?;
    let nss = get(&client, "/api/v1/namespaces", ACCEPT_JSON).await?;
    ok("list namespaces", &nss, 200)?;
    assert!(nss.body["items"].as_array().into_iter().flatten().any(|n| n["metadata"]["name"] == "demo"));
    let ns_informer = watch_list(&client, "/api/v1/namespaces").await?;
    assert!(ns_informer.added.iter().any(|n| n["metadata"]["name"] == "demo"));
    drop(ns_informer);

    // 5. `:srv` in namespace demo: SSAR list, then the Table k9s renders.
    can_i(&client, "demo", "provisioning.dev", "servers", &["list"]).await?;
    let table = get(&client, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers?includeObject=Metadata", ACCEPT_TABLE).await?;
    ok("Table of servers", &table, 200)?;
    assert_eq!(table.body["kind"], "Table");
    assert_eq!(table.body["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = table.body["columnDefinitions"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(columns.first(), Some(&"Name"), "{columns:?}");
    for c in ["Provider", "Phase", "Ready", "Age"] {
        assert!(columns.contains(&c), "column {c} missing: {columns:?}");
    }
    let row = &table.body["rows"][0];
    assert_eq!(row["cells"][0], "web");
    assert_eq!(row["cells"].as_array().map(Vec::len), Some(columns.len()));
    // includeObject=Metadata: the row's object is PartialObjectMetadata, no spec.
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata", "{row}");
    assert_eq!(row["object"]["metadata"]["namespace"], "demo");
    assert!(row["object"].get("spec").is_none(), "{row}");
    assert!(table.body["metadata"]["resourceVersion"].as_str().is_some_and(|s| !s.is_empty()));

    // 5b. The Server informer (factory.CanForResource: SSAR list+watch, watch-list), and a
    // change arriving on the same watch after the bookmark.
    can_i(&client, "demo", "provisioning.dev", "servers", &["list", "watch"]).await?;
    let mut srv_informer = watch_list(&client, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers").await?;
    assert_eq!(srv_informer.added.len(), 1);
    assert_eq!(srv_informer.bookmark["apiVersion"], "provisioning.dev/v1alpha1");
    let merge = http::Request::builder()
        .method("PATCH")
        .uri("/apis/provisioning.dev/v1alpha1/namespaces/demo/servers/web")
        .header("content-type", "application/merge-patch+json")
        .header("user-agent", USER_AGENT)
        .body(kube::client::Body::from(serde_json::to_vec(&json!({"metadata": {"labels": {"tier": "front"}}}))?))?;
    let resp = client.send(merge).await?;
    assert_eq!(resp.status(), 200);
    let ev = srv_informer.next_event().await?;
    assert_eq!(ev["type"], "MODIFIED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["labels"]["tier"], "front");
    drop(srv_informer);

    // 5c. A watch-list the server cannot honour is refused (422), never silently served as
    // a plain watch: the reflector would wait for a bookmark that never comes.
    let bad = get(
        &client,
        "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
        ACCEPT_JSON,
    )
    .await?;
    ok("watch-list without resourceVersionMatch", &bad, 422)?;
    assert_eq!(bad.body["reason"], "Invalid");
    let bad = get(&client, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers?sendInitialEvents=true", ACCEPT_JSON).await?;
    ok("sendInitialEvents on a list", &bad, 422)?;

    // 6. Describe (`d` on the row): the object, then kubectl's event search.
    can_i(&client, "demo", "provisioning.dev", "servers", &["get"]).await?;
    let obj = get(&client, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers/web", ACCEPT_JSON).await?;
    ok("get server", &obj, 200)?;
    let selector =
        format!("involvedObject.kind%3DServer%2CinvolvedObject.name%3Dweb%2CinvolvedObject.namespace%3Ddemo%2CinvolvedObject.uid%3D{uid}");
    let events = get(&client, &format!("/api/v1/namespaces/demo/events?fieldSelector={selector}&limit=500"), ACCEPT_JSON).await?;
    ok("describe's event search", &events, 200)?;
    let reasons: Vec<&str> = events.body["items"].as_array().into_iter().flatten().filter_map(|e| e["reason"].as_str()).collect();
    assert_eq!(reasons, ["MachineRequested"], "{}", events.body);
    assert_eq!(events.body["items"][0]["involvedObject"]["uid"], json!(uid));
    assert_eq!(events.body["items"][0]["message"], "asked the provider for a machine");

    // 7. `:events`: events.k8s.io/v1 as a Table.
    can_i(&client, "demo", "events.k8s.io", "events", &["list"]).await?;
    let ev_table = get(&client, "/apis/events.k8s.io/v1/namespaces/demo/events?includeObject=Metadata", ACCEPT_TABLE).await?;
    ok("Table of events.k8s.io events", &ev_table, 200)?;
    assert_eq!(ev_table.body["kind"], "Table");
    let columns: Vec<&str> =
        ev_table.body["columnDefinitions"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    for c in ["Type", "Reason", "Object", "Message"] {
        assert!(columns.contains(&c), "events Table lacks column {c}: {columns:?}");
    }
    let row = &ev_table.body["rows"][0];
    let cell = |name: &str| columns.iter().position(|c| *c == name).map(|i| row["cells"][i].clone()).unwrap_or(Value::Null);
    assert_eq!(cell("Reason"), "MachineRequested", "{row}");
    assert_eq!(cell("Object"), "server/web", "{row}");
    assert_eq!(cell("Message"), "asked the provider for a machine", "{row}");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata", "{row}");

    ts.server.shutdown().await;
    Ok(())
}
