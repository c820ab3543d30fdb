//! Controller tests against the embedded API server over real HTTPS, with the controller
//! running in-process and the simulated provider.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use provisioning_controller::testing::{self, ControllerHandle, TestEnv, condition, is_ready, server, simulated_workspace, wait_for};
use provisioning_crds::{Server, Workspace, WorkspaceStatus};
use provisioning_providers::{Provider, ServerIdentity, ServerRequest};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

async fn create_workspace(client: &Client, ws: &Workspace) -> anyhow::Result<()> {
    let api = Api::<Workspace>::all(client.clone());
    api.create(&PostParams::default(), ws).await?;
    wait_workspace(&api, &ws.name_any(), "Ready", |st| workspace_is(&st, "Ready").then_some(())).await
}

/// Waits until `check` finds what it wants in Workspace `name`'s status.
async fn wait_workspace<T>(
    api: &Api<Workspace>,
    name: &str,
    what: &str,
    check: impl Fn(WorkspaceStatus) -> Option<T>,
) -> anyhow::Result<T> {
    wait_for(&format!("workspace {name} {what}"), DEADLINE, || {
        let api = api.clone();
        let check = &check;
        async move { check(api.get(name).await.ok()?.status?) }
    })
    .await
}

/// Whether a Workspace's condition `type_` is True.
fn workspace_is(status: &WorkspaceStatus, type_: &str) -> bool {
    provisioning_controller::conditions::is_true(&status.conditions, type_)
}

/// A Workspace `name` with one simulated account `sim` that requires `token`, read from the
/// Secret `sim-creds` in its namespace.
fn token_workspace(name: &str, token: &str) -> anyhow::Result<Workspace> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace",
        "metadata": {"name": name},
        "spec": {
            "providers": [{"name": "sim", "type": "simulated",
                           "simulation": {"requiredToken": token},
                           "credentialsSecretRef": {"name": "sim-creds"}}],
            "defaults": {"provider": "sim"}
        }
    }))?)
}

/// A Secret `namespace/name` with `string_data`.
fn secret(namespace: &str, name: &str, string_data: serde_json::Value) -> anyhow::Result<Secret> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
        "stringData": string_data
    }))?)
}

/// Creates namespace `name`, opted in to the Workspace of the same name (its Secrets may be read).
async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"provisioning.dev/workspace": name}}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    Ok(())
}

/// An environment with the controller running (default config) and a Ready simulated
/// Workspace `namespace` (at most 10 servers); the Servers API of that namespace.
async fn start_with_workspace(namespace: &str) -> anyhow::Result<(TestEnv, ControllerHandle, Api<Server>)> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    create_workspace(&env.client, &simulated_workspace(namespace, 0, 0, 10, 5)).await?;
    let api = Api::namespaced(env.client.clone(), namespace);
    Ok((env, controller, api))
}

async fn stop(env: TestEnv, controller: ControllerHandle) {
    controller.stop().await;
    env.shutdown().await;
}

/// Whether a Server's Stalled condition is True.
fn stalled(s: &Server) -> bool {
    condition(s, "Stalled").is_some_and(|c| c.0 == "True")
}

/// The Stalled condition's message of a Server (empty when there is none).
fn stalled_message(s: &Server) -> String {
    condition(s, "Stalled").map(|c| c.1).unwrap_or_default()
}

async fn wait_gone(api: &Api<Server>, name: &str) -> anyhow::Result<()> {
    wait_for(&format!("{name} gone"), DEADLINE, || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().and_then(|o| o.is_none().then_some(())) }
    })
    .await
}

/// A request for a machine of Server `namespace/name` (uid `uid`), as the controller makes it.
fn machine_request(uid: &str, namespace: &str, name: &str, plan: &str, adoptable: bool) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: namespace.into(), name: name.into(), cluster: None },
        plan: plan.into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: if adoptable {
            [(provisioning_providers::tags::ADOPTABLE.to_string(), "true".to_string())].into()
        } else {
            Default::default()
        },
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    }
}

async fn wait_server(api: &Api<Server>, name: &str, what: &str, check: impl Fn(&Server) -> bool) -> anyhow::Result<Server> {
    wait_for(&format!("server {name} {what}"), DEADLINE, || {
        let api = api.clone();
        let name = name.to_string();
        let check = &check;
        async move { api.get(&name).await.ok().filter(|s| check(s)) }
    })
    .await
}

fn free_addr() -> std::net::SocketAddr {
    #[allow(clippy::unwrap_used)]
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    #[allow(clippy::unwrap_used)]
    listener.local_addr().unwrap()
}

async fn scrape(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    let code = body.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body))
}

/// Sum of a metric's samples whose line contains every `filter`.
fn metric(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Records every resourceVersion a Server in `namespace` goes through.
fn record_versions(client: &Client, namespace: &str) -> Arc<Mutex<Vec<(String, String)>>> {
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let sink = seen.clone();
    let api: Api<Server> = Api::namespaced(client.clone(), namespace);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(s)) = stream.next().await {
            let rv = s.resource_version().unwrap_or_default();
            let mut seen = sink.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.iter().any(|(n, v)| *n == s.name_any() && *v == rv) {
                seen.push((s.name_any(), rv));
            }
        }
    });
    seen
}

fn versions_of(seen: &Arc<Mutex<Vec<(String, String)>>>, name: &str) -> usize {
    seen.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|(n, _)| n == name).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_becomes_ready_with_one_machine_and_resync_writes_nothing() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let metrics_addr = free_addr();
    let mut config = env.config();
    config.resync_secs = 1;
    config.metrics_addr = Some(metrics_addr);
    let controller = env.start_controller(config);
    create_workspace(&env.client, &simulated_workspace("alpha", 0, 0, 10, 5)).await?;
    let versions = record_versions(&env.client, "alpha");
    let api: Api<Server> = Api::namespaced(env.client.clone(), "alpha");
    api.create(&PostParams::default(), &server("alpha", "s1", json!({"plan": "small"}))).await?;
    let ready = wait_server(&api, "s1", "Ready without create-pending", |s| {
        is_ready(s) && !s.annotations().contains_key(provisioning_crds::ANNOTATION_CREATE_PENDING)
    })
    .await?;
    let status = ready.status.clone().unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.observed_generation, ready.metadata.generation);
    assert_eq!(status.resolved_plan.as_deref(), Some("sim-1cpu-1gb"));
    assert_eq!(status.provider.as_deref(), Some("sim"));
    assert!(!status.addresses.is_empty());
    for t in ["Ready", "Reconciling", "Stalled", "Provisioned"] {
        assert!(condition(&ready, t).is_some(), "condition {t} present");
    }
    assert_eq!(condition(&ready, "Stalled").map(|c| c.0).as_deref(), Some("False"));
    let machines = testing::machines_in(&env.simulated("sim")?, "alpha").await?;
    assert_eq!(machines.len(), 1);
    assert_eq!(Some(machines[0].provider_id.0.clone()), status.provider_id);

    // Writes from create to Ready: every resourceVersion after the creation one.
    let writes = versions_of(&versions, "s1").saturating_sub(1);
    eprintln!("writes from create to Ready: {writes}");
    assert!(writes <= 6, "{writes} writes from create to Ready");

    // Resync: wait until several more reconciles of the Server ran, then compare versions.
    let rv = ready.resource_version();
    let (_, text) = scrape(metrics_addr, "/metrics").await?;
    let before = metric(&text, "provisioning_reconciles_total", &["kind=\"Server\""]);
    wait_for("three resyncs", DEADLINE, || async {
        let (_, text) = scrape(metrics_addr, "/metrics").await.ok()?;
        (metric(&text, "provisioning_reconciles_total", &["kind=\"Server\""]) >= before + 3.0).then_some(())
    })
    .await?;
    assert_eq!(api.get("s1").await?.resource_version(), rv, "a no-op resync wrote");
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "alpha").await?.len(), 1);

    // Health endpoints.
    assert_eq!(scrape(metrics_addr, "/healthz").await?.0, 200);
    wait_for("/readyz 200", DEADLINE, || async { (scrape(metrics_addr, "/readyz").await.ok()?.0 == 200).then_some(()) }).await?;
    let (_, text) = scrape(metrics_addr, "/metrics").await?;
    assert!(
        text.contains(
            "provisioning_provider_call_duration_seconds_count{provider=\"simulated\",operation=\"ensure_server\",outcome=\"ok\"} 1"
        ),
        "{text}"
    );
    assert!(!text.contains("s1"), "object names never appear in metrics");

    // Events: a Ready event was recorded.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "alpha");
    let list = events.list(&Default::default()).await?;
    assert!(list.items.iter().any(|e| e.reason.as_deref() == Some("Ready")), "Ready event recorded");
    // ... found by the selector `kubectl events --for server/s1` sends: the object at its
    // preferred version (v1beta1 is listed first in discovery).
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), "alpha");
    let selector = "involvedObject.kind=Server,involvedObject.apiVersion=provisioning.dev/v1beta1,involvedObject.name=s1";
    let found = core.list(&kube::api::ListParams::default().fields(selector)).await?;
    assert!(found.items.iter().any(|e| e.reason.as_deref() == Some("Ready")), "kubectl events --for server/s1 finds nothing");

    stop(env, controller).await;
    Ok(())
}

/// A Server written at v1beta1 (same schema, stored at v1alpha1) is reconciled like any other
/// by the controller, which reads and writes v1alpha1; its status reads back at v1beta1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_written_at_v1beta1_is_reconciled() -> anyhow::Result<()> {
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    let (env, controller, api) = start_with_workspace("beta").await?;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1beta1", "Server"), "servers");
    let beta: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), "beta", &ar);
    let obj = json!({"apiVersion": "provisioning.dev/v1beta1", "kind": "Server", "metadata": {"name": "b1"}, "spec": {"plan": "small"}});
    beta.create(&PostParams::default(), &serde_json::from_value(obj)?).await?;
    let ready = wait_server(&api, "b1", "Ready", is_ready).await?;
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "beta").await?.len(), 1);
    let read = beta.get("b1").await?;
    assert_eq!(read.types.map(|t| t.api_version).as_deref(), Some("provisioning.dev/v1beta1"));
    assert_eq!(read.data["status"]["providerID"], json!(ready.status.and_then(|s| s.provider_id)));
    stop(env, controller).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_makes_no_provider_call_until_resumed() -> anyhow::Result<()> {
    let (env, controller, api) = start_with_workspace("paused").await?;
    let mut s = server("paused", "p1", json!({}));
    s.metadata.annotations = Some([(provisioning_crds::ANNOTATION_PAUSED.to_string(), "true".to_string())].into());
    api.create(&PostParams::default(), &s).await?;
    let paused = wait_server(&api, "p1", "Paused", |s| condition(s, "Paused").is_some_and(|c| c.0 == "True")).await?;
    assert_eq!(condition(&paused, "Ready").map(|c| c.0).as_deref(), Some("Unknown"));
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "paused").await?.len(), 0);
    let patch = json!({"metadata": {"annotations": {provisioning_crds::ANNOTATION_PAUSED: null}}});
    api.patch("p1", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let ready = wait_server(&api, "p1", "Ready", is_ready).await?;
    assert_eq!(condition(&ready, "Paused").map(|c| c.0).as_deref(), Some("False"));
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "paused").await?.len(), 1);
    stop(env, controller).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_servers_stall_with_the_reason_and_no_provider_call() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let metrics_addr = free_addr();
    let mut config = env.config();
    config.metrics_addr = Some(metrics_addr);
    let controller = env.start_controller(config);
    create_workspace(&env.client, &simulated_workspace("beta", 0, 0, 1, 5)).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "beta");
    api.create(&PostParams::default(), &server("beta", "first", json!({}))).await?;
    wait_server(&api, "first", "Ready", is_ready).await?;
    /// A Server that cannot be made, and the Stalled message that says why.
    struct Case {
        name: &'static str,
        spec: serde_json::Value,
        /// The whole message, or (`exact: false`) a part of it.
        message: &'static str,
        exact: bool,
    }
    let cases = [
        Case {
            name: "unknown-provider",
            spec: json!({"provider": "nope"}),
            message: "provider \"nope\" is not defined in workspace \"beta\" (accounts: sim)",
            exact: true,
        },
        Case {
            name: "bad-plan",
            spec: json!({"plan": "huge"}),
            message: "plan \"huge\" is not offered by the simulated provider (abstract plans: small, medium, large, xlarge)",
            exact: true,
        },
        Case { name: "over-limit", spec: json!({}), message: "allows at most 1 servers (limits.maxServers)", exact: false },
    ];
    for case in &cases {
        api.create(&PostParams::default(), &server("beta", case.name, case.spec.clone())).await?;
    }
    for Case { name, message, exact, .. } in &cases {
        let s = wait_server(&api, name, "Stalled", stalled).await?;
        let got = stalled_message(&s);
        if *exact {
            assert_eq!(got, *message, "{name}");
        } else {
            assert!(got.contains(message), "{name}: {got}");
        }
        assert_eq!(condition(&s, "Ready").map(|c| c.0).as_deref(), Some("False"), "{name}");
        assert_eq!(s.status.as_ref().and_then(|st| st.phase.clone()).as_deref(), Some("Failed"), "{name}");
    }
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "beta").await?.len(), 1);

    // No retry storm: the stalled servers' status does not churn and few reconciles fail.
    let names = cases.map(|c| c.name);
    let rvs: Vec<String> =
        futures::future::try_join_all(names.map(|n| api.get(n))).await?.iter().map(|s| s.resource_version().unwrap_or_default()).collect();
    // Let the first rounds of backoff happen (trigger each once more via a no-op annotation).
    for n in names {
        let patch = json!({"metadata": {"annotations": {provisioning_crds::ANNOTATION_RECONCILE_REQUESTED_AT: "1"}}});
        api.patch(n, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    wait_for("errors counted", DEADLINE, || async {
        let (_, text) = scrape(metrics_addr, "/metrics").await.ok()?;
        (metric(&text, "provisioning_reconcile_errors_total", &["kind=\"Server\""]) >= 6.0).then_some(())
    })
    .await?;
    let (_, text) = scrape(metrics_addr, "/metrics").await?;
    let errors = metric(&text, "provisioning_reconcile_errors_total", &["kind=\"Server\""]);
    assert!(errors <= 12.0, "retry storm: {errors} failed reconciles\n{text}");
    assert_eq!(metric(&text, "provisioning_provider_call_duration_seconds_count", &["operation=\"ensure_server\""]), 1.0);
    for (n, rv) in names.iter().zip(rvs) {
        // Only our annotation patch changed the object; status was not rewritten.
        let now = api.get(n).await?;
        assert_ne!(now.resource_version().unwrap_or_default(), rv, "{n}");
        assert!(stalled(&now), "{n}");
    }
    stop(env, controller).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_honours_delete_and_orphan() -> anyhow::Result<()> {
    let (env, controller, api) = start_with_workspace("gamma").await?;
    api.create(&PostParams::default(), &server("gamma", "deleted", json!({}))).await?;
    api.create(&PostParams::default(), &server("gamma", "orphaned", json!({"deletionPolicy": "Orphan"}))).await?;
    let deleted = wait_server(&api, "deleted", "Ready", is_ready).await?;
    let orphaned = wait_server(&api, "orphaned", "Ready", is_ready).await?;
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "gamma").await?.len(), 2);
    api.delete("deleted", &DeleteParams::default()).await?;
    api.delete("orphaned", &DeleteParams::default()).await?;
    for name in ["deleted", "orphaned"] {
        wait_gone(&api, name).await?;
    }
    let left = testing::machines_in(&env.simulated("sim")?, "gamma").await?;
    assert_eq!(left.len(), 1);
    assert_eq!(Some(left[0].provider_id.0.clone()), orphaned.status.and_then(|s| s.provider_id));
    assert_ne!(Some(left[0].provider_id.0.clone()), deleted.status.and_then(|s| s.provider_id));
    stop(env, controller).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopts_a_machine_by_external_id() -> anyhow::Result<()> {
    let (env, controller, api) = start_with_workspace("delta").await?;
    let provider = env.simulated("sim")?;
    let machine = |uid: &str, adoptable: bool| machine_request(uid, "delta", uid, "medium", adoptable);
    // Made elsewhere; its owner marked it adoptable.
    let existing = provider.ensure_server(&machine("made-elsewhere", true)).await?;
    // Someone else's machine, not offered for adoption.
    let foreign = provider.ensure_server(&machine("someone-elses", false)).await?;
    api.create(&PostParams::default(), &server("delta", "adopted", json!({"externalID": existing.provider_id.0}))).await?;
    api.create(&PostParams::default(), &server("delta", "missing", json!({"externalID": "simulated://no-such-machine"}))).await?;
    api.create(
        &PostParams::default(),
        &server("delta", "hijack", json!({"externalID": foreign.provider_id.0, "deletionPolicy": "Delete"})),
    )
    .await?;
    let adopted = wait_server(&api, "adopted", "Ready", is_ready).await?;
    assert_eq!(adopted.status.as_ref().and_then(|s| s.provider_id.clone()), Some(existing.provider_id.0.clone()));
    assert_eq!(adopted.status.as_ref().and_then(|s| s.resolved_plan.clone()).as_deref(), Some("sim-2cpu-4gb"));
    let missing = wait_server(&api, "missing", "Stalled", stalled).await?;
    let message = stalled_message(&missing);
    assert!(message.contains("simulated://no-such-machine") && message.contains("spec.externalID"), "{message}");

    // A foreign machine is refused with a clear condition, and never recorded as ours.
    let hijack = wait_server(&api, "hijack", "Stalled", stalled).await?;
    let stalled = hijack.status.as_ref().and_then(|s| provisioning_controller::conditions::find(&s.conditions, "Stalled").cloned());
    let stalled = stalled.ok_or_else(|| anyhow::anyhow!("no Stalled condition"))?;
    assert_eq!(stalled.reason, "AdoptionRefused");
    assert!(
        stalled.message.contains(&foreign.provider_id.0) && stalled.message.contains("provisioning.dev/adoptable"),
        "{}",
        stalled.message
    );
    assert_eq!(hijack.status.as_ref().and_then(|s| s.provider_id.clone()), None);
    assert_eq!(testing::machines_in(&provider, "delta").await?.len(), 2, "adoption created nothing");

    // `adoptable` hands a machine over once: a second Server (another tenant's, say) naming the
    // adopted machine is refused while the first records it, and is never recorded as its owner.
    api.create(
        &PostParams::default(),
        &server("delta", "second", json!({"externalID": existing.provider_id.0, "deletionPolicy": "Delete"})),
    )
    .await?;
    let second = wait_server(&api, "second", "Stalled", |s| condition(s, "Stalled").is_some_and(|c| c.0 == "True")).await?;
    let message = stalled_message(&second);
    assert!(message.contains("another Server already records it") && !message.contains("delta/adopted"), "{message}");
    assert_eq!(second.status.as_ref().and_then(|s| s.provider_id.clone()), None);

    // Deleting all three: the adopted machine is orphaned by default, the refused ones (even
    // with deletionPolicy Delete) are left alone.
    for name in ["second", "adopted", "hijack"] {
        api.delete(name, &DeleteParams::default()).await?;
        wait_gone(&api, name).await?;
    }
    let mut left: Vec<String> = testing::machines_in(&provider, "delta").await?.into_iter().map(|m| m.provider_id.0).collect();
    left.sort();
    let mut expected = vec![existing.provider_id.0.clone(), foreign.provider_id.0.clone()];
    expected.sort();
    assert_eq!(left, expected, "nothing deleted");
    stop(env, controller).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_pending_guard_finds_the_machine_instead_of_creating_another() -> anyhow::Result<()> {
    let (env, controller, api) = start_with_workspace("epsilon").await?;
    let mut s = server("epsilon", "guarded", json!({}));
    s.metadata.annotations = Some([(provisioning_crds::ANNOTATION_PAUSED.to_string(), "true".to_string())].into());
    let created = api.create(&PostParams::default(), &s).await?;
    // A create call that reached the provider but whose result was never recorded.
    let provider = env.simulated("sim")?;
    let lost = provider.ensure_server(&machine_request(&created.uid().unwrap_or_default(), "epsilon", "guarded", "small", false)).await?;
    let patch = json!({"metadata": {"annotations": {
        provisioning_crds::ANNOTATION_PAUSED: null,
        provisioning_crds::ANNOTATION_CREATE_PENDING: "2026-01-01T00:00:00Z",
    }}});
    api.patch("guarded", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let ready = wait_server(&api, "guarded", "Ready and guard cleared", |s| {
        is_ready(s) && !s.annotations().contains_key(provisioning_crds::ANNOTATION_CREATE_PENDING)
    })
    .await?;
    assert_eq!(ready.status.and_then(|s| s.provider_id), Some(lost.provider_id.0.clone()));
    assert_eq!(testing::machines_in(&provider, "epsilon").await?.len(), 1);
    stop(env, controller).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_reports_namespace_accounts_counts_and_conflicts() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let workspaces: Api<Workspace> = Api::all(env.client.clone());
    workspaces.create(&PostParams::default(), &token_workspace("zeta", "s3cret")?).await?;
    let stalled =
        wait_workspace(&workspaces, "zeta", "Stalled on the missing Secret", |st| workspace_is(&st, "Stalled").then_some(st)).await?;
    assert_eq!(stalled.namespace.as_deref(), Some("zeta"));
    assert!(!stalled.providers[0].ready);
    assert!(stalled.providers[0].message.contains("Secret zeta/sim-creds"), "{:?}", stalled.providers);
    // The namespace was created.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone()).get("zeta").await?;

    let creds = secret("zeta", "sim-creds", json!({"SIMULATED_TOKEN": "s3cret"}))?;
    Api::<Secret>::namespaced(env.client.clone(), "zeta").create(&PostParams::default(), &creds).await?;
    let patch = json!({"metadata": {"annotations": {provisioning_crds::ANNOTATION_RECONCILE_REQUESTED_AT: "now"}}});
    workspaces.patch("zeta", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "zeta");
    api.create(&PostParams::default(), &server("zeta", "a", json!({}))).await?;
    api.create(&PostParams::default(), &server("zeta", "b", json!({}))).await?;
    let ready = wait_workspace(&workspaces, "zeta", "Ready with 2 servers counted", |st| {
        (workspace_is(&st, "Ready") && st.counts.as_ref().is_some_and(|c| c.servers == 2)).then_some(st)
    })
    .await?;
    assert!(ready.providers[0].ready);
    let secret_value_leaked = serde_json::to_string(&ready)?.contains("s3cret");
    assert!(!secret_value_leaked);
    wait_server(&api, "a", "Ready", is_ready).await?;

    // A second Workspace claiming the same namespace is Stalled (the newer one).
    let second: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace",
        "metadata": {"name": "zeta-two"}, "spec": {"namespace": "zeta"}
    }))?;
    workspaces.create(&PostParams::default(), &second).await?;
    let conflict = wait_workspace(&workspaces, "zeta-two", "Stalled", |st| {
        provisioning_controller::conditions::find(&st.conditions, "Stalled").filter(|c| c.status == "True").cloned()
    })
    .await?;
    assert_eq!(conflict.reason, "NamespaceConflict");
    assert_eq!(conflict.message, "namespace \"zeta\" is already claimed by the older workspace \"zeta\"");
    let first = workspaces.get("zeta").await?;
    assert!(provisioning_controller::conditions::is_true(&first.status.unwrap_or_default().conditions, "Ready"));
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "default");
    let notes: BTreeSet<String> = events.list(&Default::default()).await?.items.into_iter().filter_map(|e| e.note).collect();
    assert!(notes.iter().all(|n| !n.contains("s3cret")), "secrets never in events");
    stop(env, controller).await;
    Ok(())
}

fn is_stalled<T>(conditions: Option<&T>) -> bool
where
    T: AsRef<[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>,
{
    conditions.is_some_and(|c| provisioning_controller::conditions::is_true(c.as_ref(), "Stalled"))
}

/// A fixed credentials Secret is picked up through the Secret watch: Workspace and Server
/// recover in seconds, not after the error backoff or the credentials cache's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixing_a_credentials_secret_recovers_workspace_and_server_quickly() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "kappa");
    create_namespace(&env.client, "kappa").await?;
    secrets.create(&PostParams::default(), &secret("kappa", "sim-creds", json!({"SIMULATED_TOKEN": "wrong-token"}))?).await?;
    let workspaces: Api<Workspace> = Api::all(env.client.clone());
    workspaces.create(&PostParams::default(), &token_workspace("kappa", "right-token")?).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "kappa");
    api.create(&PostParams::default(), &server("kappa", "s1", json!({}))).await?;
    wait_workspace(&workspaces, "kappa", "Stalled on the wrong token", |st| is_stalled(Some(&st.conditions)).then_some(())).await?;
    wait_server(&api, "s1", "Stalled", |s| is_stalled(s.status.as_ref().map(|s| &s.conditions))).await?;

    // Fix the Secret: both become Ready well within the backoff (30 s doubling) and the TTL.
    let started = std::time::Instant::now();
    let patch = json!({"stringData": {"SIMULATED_TOKEN": "right-token"}});
    secrets.patch("sim-creds", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let fast = Duration::from_secs(30);
    wait_for("kappa Ready after the Secret fix", fast, || {
        let workspaces = workspaces.clone();
        async move { workspace_is(&workspaces.get("kappa").await.ok()?.status?, "Ready").then_some(()) }
    })
    .await?;
    let ready = wait_for("s1 Ready after the Secret fix", fast, || {
        let api = api.clone();
        async move { api.get("s1").await.ok().filter(is_ready) }
    })
    .await?;
    eprintln!("recovered {:?} after the Secret fix", started.elapsed());
    let ws = workspaces.get("kappa").await?;
    for text in [serde_json::to_string(&ws.status)?, serde_json::to_string(&ready.status)?] {
        assert!(!text.contains("right-token") && !text.contains("wrong-token"), "secret values never in status");
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    let notes: Vec<String> = events.list(&Default::default()).await?.items.into_iter().filter_map(|e| e.note).collect();
    assert!(notes.iter().all(|n| !n.contains("right-token") && !n.contains("wrong-token")), "secret values never in events");
    stop(env, controller).await;
    Ok(())
}

#[tokio::test]
async fn repeated_events_become_one_series_and_little_is_remembered() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::EventType;
    use provisioning_controller::events::{Occurrence, Publisher};
    let env = TestEnv::start().await?;
    let publisher = Publisher::new(env.client.clone(), "provisioning-controller", "test-1");
    let regarding = ObjectReference {
        api_version: Some("provisioning.dev/v1alpha1".into()),
        kind: Some("Server".into()),
        namespace: Some("default".into()),
        name: Some("web-1".into()),
        uid: Some("uid-1".into()),
        ..Default::default()
    };
    let failed = Occurrence { type_: EventType::Warning, reason: "Transient", action: "Provision", note: Some("provider busy") };
    for _ in 0..3 {
        publisher.publish(&failed, &regarding).await?;
    }
    // Another note is another event; another object too.
    let other_note = Occurrence { note: Some("provider down"), ..failed.clone() };
    publisher.publish(&other_note, &regarding).await?;
    let other_object = ObjectReference { name: Some("web-2".into()), uid: Some("uid-2".into()), ..regarding.clone() };
    publisher.publish(&failed, &other_object).await?;
    assert_eq!(publisher.remembered(), 3);

    // Read as `kubectl get events` does (core/v1): counts and both timestamps, as on a real
    // cluster with client-go's recorder, so `--sort-by=.lastTimestamp` works.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), "default");
    let all = events.list(&Default::default()).await?.items;
    assert_eq!(all.len(), 3, "{all:#?}");
    let count = |name: &str, note: &str| {
        all.iter()
            .find(|e| e.involved_object.name.as_deref() == Some(name) && e.message.as_deref() == Some(note))
            .map(|e| e.count.unwrap_or_default())
    };
    assert_eq!(count("web-1", "provider busy"), Some(3), "three occurrences, one Event");
    assert_eq!(count("web-1", "provider down"), Some(1));
    assert_eq!(count("web-2", "provider busy"), Some(1));
    let first = all.iter().find(|e| e.message.as_deref() == Some("provider busy") && e.count == Some(3)).expect("repeated event");
    assert_eq!(first.reporting_component.as_deref(), Some("provisioning-controller"));
    assert_eq!(first.reporting_instance.as_deref(), Some("test-1"));
    assert_eq!(first.type_.as_deref(), Some("Warning"));
    let (Some(first_seen), Some(last_seen)) = (&first.first_timestamp, &first.last_timestamp) else {
        panic!("no firstTimestamp/lastTimestamp: {first:#?}")
    };
    assert!(first_seen.0 <= last_seen.0, "{first:#?}");
    assert!(all.iter().all(|e| e.first_timestamp.is_some() && e.last_timestamp.is_some()), "{all:#?}");
    // The same objects read through events.k8s.io/v1 (the console) keep their note and object.
    let v1: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "default");
    assert!(
        v1.list(&Default::default())
            .await?
            .items
            .iter()
            .any(|e| e.note.as_deref() == Some("provider busy") && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web-1"))
    );

    // An Event deleted meanwhile (server-side TTL or by hand): the next repeat starts a new one.
    let name = first.metadata.name.clone().unwrap_or_default();
    events.delete(&name, &Default::default()).await?;
    publisher.publish(&failed, &regarding).await?;
    let again = events.list(&Default::default()).await?.items;
    assert_eq!(again.len(), 3);
    assert!(again.iter().any(|e| e.message.as_deref() == Some("provider busy")
        && e.involved_object.name.as_deref() == Some("web-1")
        && e.count == Some(1)));
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_reconciled_until_every_cache_syncs_and_readyz_says_so() -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let env = TestEnv::start().await?;
    // A missing CRD (here Cluster's) keeps one watch cache from ever syncing.
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    crds.delete("clusters.provisioning.dev", &DeleteParams::default()).await?;
    wait_for("Cluster CRD gone", DEADLINE, || async { crds.get_opt("clusters.provisioning.dev").await.ok()?.is_none().then_some(()) })
        .await?;
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &simulated_workspace("gate", 0, 0, 10, 5)).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), "gate");
    wait_for("namespace gate", DEADLINE, || async {
        // The Workspace controller is not running yet: create the namespace by hand.
        let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": "gate"}})).ok()?;
        let nss = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone());
        let _ = nss.create(&PostParams::default(), &ns).await;
        nss.get_opt("gate").await.ok().flatten()
    })
    .await?;
    api.create(&PostParams::default(), &server("gate", "s1", json!({}))).await?;

    let metrics_addr = free_addr();
    let mut config = env.config();
    config.metrics_addr = Some(metrics_addr);
    let controller = env.start_controller(config);
    wait_for("/healthz 200", DEADLINE, || async { (scrape(metrics_addr, "/healthz").await.ok()?.0 == 200).then_some(()) }).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_ne!(scrape(metrics_addr, "/readyz").await?.0, 200, "not ready while a cache cannot sync");
    let s1 = api.get("s1").await?;
    assert!(s1.status.is_none() && s1.metadata.finalizers.is_none(), "nothing reconciled before every cache synced: {:?}", s1.status);
    assert!(testing::machines_in(&env.simulated("sim")?, "gate").await?.is_empty(), "no provider call");

    // The CRD comes back: the caches sync, the controller becomes ready and goes on.
    provisioning_controller::client::install_crds(&env.client, Duration::from_secs(30)).await?;
    wait_for("/readyz 200", DEADLINE, || async { (scrape(metrics_addr, "/readyz").await.ok()?.0 == 200).then_some(()) }).await?;
    wait_server(&api, "s1", "Ready", is_ready).await?;
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "gate").await?.len(), 1);
    stop(env, controller).await;
    Ok(())
}

/// Tenancy: a Workspace may not borrow another namespace's credentials Secret, and its
/// account endpoints must be https unless the controller allows insecure endpoints; a
/// refused account sends nothing (a listener standing in for the endpoint sees no
/// connection) and its Servers stall too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_namespace_secrets_and_http_endpoints_are_refused() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    // The victim's valid credentials, in the victim's namespace.
    create_namespace(&env.client, "victim").await?;
    let victims = secret(
        "victim",
        "aws-creds",
        json!({"AWS_ACCESS_KEY_ID": "AKIAVICTIM0000000001", "AWS_SECRET_ACCESS_KEY": "victim-secret-value"}),
    )?;
    Api::<Secret>::namespaced(env.client.clone(), "victim").create(&PostParams::default(), &victims).await?;
    // Where an attacker would like the credentials sent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let endpoint = format!("http://{}/", listener.local_addr()?);
    let ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "mallory"},
        "spec": {"providers": [
            {"name": "borrowed", "type": "aws", "region": "eu-west-1", "credentialsSecretRef": {"name": "aws-creds", "namespace": "victim"}},
            {"name": "plaintext", "type": "aws", "region": "eu-west-1", "endpoint": endpoint, "credentialsSecretRef": {"name": "own"}}
        ], "defaults": {"provider": "borrowed"}}
    }))?;
    let workspaces: Api<Workspace> = Api::all(env.client.clone());
    workspaces.create(&PostParams::default(), &ws).await?;
    let status =
        wait_workspace(&workspaces, "mallory", "Stalled", |st| (workspace_is(&st, "Stalled") && st.providers.len() == 2).then_some(st))
            .await?;
    let stalled_reason = provisioning_controller::conditions::find(&status.conditions, "Stalled").map(|c| c.reason.clone());
    assert_eq!(stalled_reason.as_deref(), Some("ProviderAccountFailed"));
    let borrowed = &status.providers[0].message;
    assert!(!status.providers[0].ready && borrowed.contains("victim/aws-creds") && borrowed.contains("own namespace"), "{borrowed}");
    let plaintext = &status.providers[1].message;
    assert!(
        plaintext.contains(&endpoint) && plaintext.contains("https") && plaintext.contains("--allow-insecure-endpoints"),
        "{plaintext}"
    );
    assert!(!serde_json::to_string(&status)?.contains("victim-secret-value"));

    // A Server using the borrowed account stalls with the same rule, and so does one naming
    // another namespace's SSH key Secret.
    let api: Api<Server> = Api::namespaced(env.client.clone(), "mallory");
    api.create(&PostParams::default(), &server("mallory", "thief", json!({}))).await?;
    let thief = wait_server(&api, "thief", "Stalled", stalled).await?;
    let message = stalled_message(&thief);
    assert!(message.contains("victim/aws-creds"), "{message}");
    let aws_ws: Workspace = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "keys2"},
        "spec": {"providers": [{"name": "aws", "type": "aws", "region": "eu-west-1", "endpoint": "https://127.0.0.1:1/",
                                "credentialsSecretRef": {"name": "mine"}}],
                 "defaults": {"provider": "aws"}}
    }))?;
    workspaces.create(&PostParams::default(), &aws_ws).await?;
    let keys2: Api<Server> = Api::namespaced(env.client.clone(), "keys2");
    let mine = secret("keys2", "mine", json!({"AWS_ACCESS_KEY_ID": "AKIAKEYS200000000001", "AWS_SECRET_ACCESS_KEY": "x"}))?;
    wait_for("namespace keys2", DEADLINE, || {
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone());
        async move { api.get_opt("keys2").await.ok().flatten().map(|_| ()) }
    })
    .await?;
    Api::<Secret>::namespaced(env.client.clone(), "keys2").create(&PostParams::default(), &mine).await?;
    keys2
        .create(
            &PostParams::default(),
            &server("keys2", "borrowed-key", json!({"sshKeySecretRef": {"name": "ssh", "namespace": "victim"}})),
        )
        .await?;
    let borrowed_key = wait_server(&keys2, "borrowed-key", "Stalled", |s| {
        s.status
            .as_ref()
            .and_then(|st| provisioning_controller::conditions::find(&st.conditions, "Stalled"))
            .is_some_and(|c| c.reason == "CrossNamespaceReference")
    })
    .await?;
    let message = stalled_message(&borrowed_key);
    assert!(message.contains("victim/ssh") && message.contains("sshKeySecretRef"), "{message}");

    // Nothing ever connected to the plain-http endpoint.
    assert!(matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "a request reached the http endpoint");
    controller.stop().await;

    // The same plain-http account is used when the controller allows insecure endpoints:
    // the request reaches the listener.
    let mut config = env.config();
    config.allow_insecure_endpoints = true;
    let controller = env.start_controller(config);
    let patch = json!({"metadata": {"annotations": {provisioning_crds::ANNOTATION_RECONCILE_REQUESTED_AT: "insecure-allowed"}}});
    workspaces.patch("mallory", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let own = secret("mallory", "own", json!({"AWS_ACCESS_KEY_ID": "AKIAMALLORY000000001", "AWS_SECRET_ACCESS_KEY": "y"}))?;
    Api::<Secret>::namespaced(env.client.clone(), "mallory").create(&PostParams::default(), &own).await?;
    wait_for("a request at the http endpoint", DEADLINE, || {
        let accepted = listener.accept().is_ok();
        async move { accepted.then_some(()) }
    })
    .await?;
    stop(env, controller).await;
    Ok(())
}

/// Every version of Server `name` in `namespace` the watch delivers, in order.
fn record_objects(client: &Client, namespace: &str, name: &str) -> Arc<Mutex<Vec<Server>>> {
    let seen: Arc<Mutex<Vec<Server>>> = Arc::default();
    let sink = seen.clone();
    let api: Api<Server> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut stream = watcher(api, config).applied_objects().boxed();
        while let Some(Ok(s)) = stream.next().await {
            let mut seen = sink.lock().unwrap_or_else(|p| p.into_inner());
            if seen.last().is_none_or(|l: &Server| l.resource_version() != s.resource_version()) {
                seen.push(s);
            }
        }
    });
    seen
}

/// DESIGN §1's leak guard: `provisioning.dev/create-pending` is on record (with the finalizer,
/// in the same write) before the create call, stays until the status records the machine,
/// then goes; a Server that never reached a create has no finalizer and is deleted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_pending_and_the_finalizer_are_written_before_the_create_and_cleared_after_it() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    create_workspace(&env.client, &simulated_workspace("guard", 0, 0, 10, 5)).await?;
    let seen = record_objects(&env.client, "guard", "s1");
    let api: Api<Server> = Api::namespaced(env.client.clone(), "guard");
    tokio::time::sleep(Duration::from_millis(200)).await; // the watch's initial list first
    api.create(&PostParams::default(), &server("guard", "s1", json!({"plan": "small"}))).await?;
    wait_server(&api, "s1", "Ready without create-pending", |s| {
        is_ready(s) && !s.annotations().contains_key(provisioning_crds::ANNOTATION_CREATE_PENDING)
    })
    .await?;
    let versions = wait_for("the watch to deliver the settled version", DEADLINE, || {
        let seen = seen.clone();
        async move {
            let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
            seen.last()
                .is_some_and(|s| is_ready(s) && !s.annotations().contains_key(provisioning_crds::ANNOTATION_CREATE_PENDING))
                .then_some(seen)
        }
    })
    .await?;
    let pending = |s: &Server| s.annotations().contains_key(provisioning_crds::ANNOTATION_CREATE_PENDING);
    let finalized = |s: &Server| s.finalizers().iter().any(|f| f == provisioning_crds::FINALIZER);
    let machine = |s: &Server| s.status.as_ref().is_some_and(|st| st.provider_id.is_some());
    let trail: Vec<String> =
        versions.iter().map(|s| format!("finalizer={} pending={} machine={}", finalized(s), pending(s), machine(s))).collect();
    let first_machine = versions.iter().position(machine).ok_or_else(|| anyhow::anyhow!("no version records a machine: {trail:?}"))?;
    let guarded = versions.iter().position(|s| pending(s) && finalized(s) && !machine(s));
    assert!(guarded.is_some_and(|g| g < first_machine), "create-pending with the finalizer before the machine: {trail:?}");
    assert!(
        versions.iter().all(|s| finalized(s) == pending(s) || machine(s)),
        "the finalizer and create-pending arrive in one write: {trail:?}"
    );
    assert!(pending(&versions[first_machine]), "the machine is recorded before create-pending goes: {trail:?}");
    let machines = testing::machines_in(&env.simulated("sim")?, "guard").await?;
    assert_eq!(machines.len(), 1, "one machine");

    // A Server that waits for approval made nothing: no finalizer, and a delete is immediate.
    api.create(&PostParams::default(), &server("guard", "s2", json!({"plan": "small", "approval": "Manual"}))).await?;
    let waiting = wait_server(&api, "s2", "waiting for approval", |s| {
        s.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("AwaitingApproval")
    })
    .await?;
    assert!(waiting.finalizers().is_empty(), "no finalizer before any provider step: {:?}", waiting.finalizers());
    api.delete("s2", &DeleteParams::default()).await?;
    wait_for("s2 gone", DEADLINE, || {
        let api = api.clone();
        async move { matches!(api.get("s2").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(()) }
    })
    .await?;
    assert_eq!(testing::machines_in(&env.simulated("sim")?, "guard").await?.len(), 1, "no machine for the unapproved Server");
    stop(env, controller).await;
    Ok(())
}
