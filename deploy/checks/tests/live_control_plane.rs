//! The kstatus-style judge and the Flux expressions against the status our controller really
//! writes: the embedded control plane and the controller run in this process, a Server on the
//! simulated provider and a Server with a bad plan are applied, and every status version the
//! API server stores is recorded and judged.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::{Value, json};

use provisioning_deploy_checks::argocd;
use provisioning_deploy_checks::flux::{self, FluxVerdict, StatusEvaluator};
use provisioning_deploy_checks::kstatus::{self, KStatus};
use provisioning_deploy_checks::lua::Lua51;

const NAMESPACE: &str = "gitops";
const DEADLINE: Duration = Duration::from_secs(120);

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", kind), plural)
}

/// Records every version of one object the API server stores until `stop` says so.
async fn record(api: Api<DynamicObject>, name: &str, stop: impl Fn(&Value) -> bool) -> Vec<Value> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).boxed();
    let mut life: Vec<Value> = Vec::new();
    let outcome = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = stream.next().await {
            let objects = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
                Ok(_) => continue,
                Err(e) => panic!("watch {name}: {e}"),
            };
            for o in objects {
                let v = serde_json::to_value(&o).unwrap_or_else(|e| panic!("{e}"));
                let rv = v.pointer("/metadata/resourceVersion").cloned();
                if life.last().and_then(|l| l.pointer("/metadata/resourceVersion").cloned()) != rv {
                    life.push(v.clone());
                }
                if stop(&v) {
                    return;
                }
            }
        }
    })
    .await;
    assert!(outcome.is_ok(), "{name}: deadline passed; recorded statuses:\n{}", render(&life));
    life
}

fn render(life: &[Value]) -> String {
    life.iter().map(|o| format!("gen={} {}", o["metadata"]["generation"], o["status"])).collect::<Vec<_>>().join("\n")
}

fn evaluator(kind: &str) -> StatusEvaluator {
    let path = flux::flux_dir().join("kustomization-example.yaml");
    let exprs = flux::read_health_check_exprs(&path).unwrap_or_else(|e| panic!("{e}"));
    let found = exprs.iter().find(|e| e.kind == kind).unwrap_or_else(|| panic!("no {kind} exprs"));
    StatusEvaluator::new(found).unwrap_or_else(|e| panic!("{e}"))
}

fn manifests() -> (Value, Value, Value) {
    let workspace = json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": NAMESPACE},
        "spec": {
            "namespace": NAMESPACE,
            "environment": "dev",
            "defaults": {"provider": "sim", "plan": "small", "image": "debian-12"},
            "providers": [{"name": "sim", "type": "simulated", "simulation": {"latencyMs": 300, "jitterPercent": 0}}]
        }
    });
    let good = json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": "web-1", "namespace": NAMESPACE},
        "spec": {"plan": "small"}
    });
    let bad = json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": "bad-plan", "namespace": NAMESPACE},
        "spec": {"plan": "gigantic"}
    });
    (workspace, good, bad)
}

async fn apply(api: &Api<DynamicObject>, manifest: &Value) -> Value {
    let name = manifest["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let applied = api
        .patch(&name, &PatchParams::apply("gitops-checks").force(), &Patch::Apply(manifest))
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    serde_json::to_value(applied).unwrap_or_else(|e| panic!("{e}"))
}

/// Creates the CRDs from deploy/crds and waits until the API server serves them.
async fn install_crds(client: &kube::Client) {
    let crd_resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource);
    let path = provisioning_deploy_checks::deploy_dir().join("crds/crds.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let crd: DynamicObject = serde::Deserialize::deserialize(document).unwrap_or_else(|e| panic!("{e}"));
        crds.create(&PostParams::default(), &crd).await.unwrap_or_else(|e| panic!("create CRD: {e}"));
    }
    let servers: Api<DynamicObject> = Api::all_with(client.clone(), &resource("Server", "servers"));
    let served = tokio::time::timeout(DEADLINE, async {
        while servers.list(&Default::default()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "the API server never served servers.provisioning.dev");
}

/// The embedded control plane and the controller, running in this process.
struct ControlPlane {
    apiserver: provisioning_apiserver::RunningApiServer,
    client: kube::Client,
    stop_tx: tokio::sync::oneshot::Sender<()>,
    controller: tokio::task::JoinHandle<()>,
    _data: tempfile::TempDir,
}

impl ControlPlane {
    async fn start() -> Self {
        provisioning_apiserver::install_crypto_provider();
        let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let apiserver = provisioning_apiserver::start(provisioning_apiserver::ApiServerConfig {
            data_dir: data.path().join("apiserver"),
            listen: "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
            limits: Default::default(),
        })
        .await
        .unwrap_or_else(|e| panic!("start the embedded control plane: {e}"));
        let kubeconfig = kube::config::Kubeconfig::read_from(apiserver.kubeconfig_path()).unwrap_or_else(|e| panic!("{e}"));
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap_or_else(|e| panic!("{e}"));
        let client = kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}"));
        install_crds(&client).await;

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let controller_config = provisioning_controller::config::ControllerConfig {
            state_dir: data.path().join("providers"),
            leader_election: false,
            poll_secs: 1,
            ..Default::default()
        };
        let controller = tokio::spawn({
            let client = client.clone();
            async move {
                let run = provisioning_controller::run::run(client, controller_config, async move {
                    let _ = stop_rx.await;
                });
                if let Err(e) = run.await {
                    eprintln!("controller: {e}");
                }
            }
        });
        Self { apiserver, client, stop_tx, controller, _data: data }
    }

    /// The namespace and the Workspace with its simulated provider account.
    async fn workspace(&self) {
        let namespaces: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Namespace"), "namespaces"),
        );
        apply(&namespaces, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})).await;
        let workspaces: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource("Workspace", "workspaces"));
        apply(&workspaces, &manifests().0).await;
    }

    async fn stop(self) {
        // The controller may already have stopped; either way it is told to.
        let _ = self.stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.controller).await;
        self.apiserver.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_status_is_in_progress_until_done_and_failed_for_a_bad_plan() {
    let plane = ControlPlane::start().await;
    let client = plane.client.clone();
    plane.workspace().await;
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource("Server", "servers"));
    let (_, good, bad) = manifests();

    // Stage "new": what the API server returns on apply, before any reconcile.
    let good_new = apply(&servers, &good).await;
    let bad_new = apply(&servers, &bad).await;
    let (good_life, bad_life) = tokio::join!(
        record(servers.clone(), "web-1", kstatus::is_done),
        record(servers.clone(), "bad-plan", |o| kstatus::judge(o).status == KStatus::Failed),
    );
    let mut good_life = [vec![good_new], good_life].concat();
    let bad_life = [vec![bad_new], bad_life].concat();

    // Stage "spec changed": generation moves on, observedGeneration lags, then catches up.
    let mut changed = good.clone();
    changed["spec"]["deletionPolicy"] = json!("Orphan");
    let changed_now = apply(&servers, &changed).await;
    let after_change = record(servers.clone(), "web-1", kstatus::is_done).await;
    good_life.push(changed_now.clone());
    good_life.extend(after_change.iter().cloned());

    plane.stop().await;

    eprintln!("web-1, every stored version:\n{}\nbad-plan:\n{}", render(&good_life), render(&bad_life));

    // The judge: InProgress, never Current, until the controller says Ready for this generation.
    let first_life: Vec<Value> = good_life.iter().take_while(|o| o["metadata"]["generation"] == 1).cloned().collect();
    let verdicts = kstatus::check_in_progress_until_done(&first_life).unwrap_or_else(|e| panic!("{e}\nrecorded:\n{}", render(&good_life)));
    assert_eq!(verdicts.first(), Some(&KStatus::InProgress), "new");
    assert_eq!(verdicts.last(), Some(&KStatus::Current), "Ready:\n{}", render(&good_life));
    assert!(verdicts.len() >= 3, "expected new, provisioning and Ready stages:\n{}", render(&good_life));
    // Before Ready, every version is in progress by what it shows: no status yet (kstatus reads
    // the missing observedGeneration as in progress) or Reconciling=True. (The simulated
    // machine runs when its create call returns, so with three writes per Server its first
    // status is already Ready; a cloud machine shows Provisioning, Reconciling=True, first.)
    assert!(
        first_life
            .iter()
            .take(first_life.len() - 1)
            .all(|o| o["status"].is_null() || kstatus::condition(o, "Reconciling").is_some_and(|c| c["status"] == "True")),
        "every stage before Ready has no status or Reconciling=True:\n{}",
        render(&first_life)
    );
    assert_eq!(kstatus::judge(&changed_now).status, KStatus::InProgress, "spec changed: {}", changed_now["status"]);
    let second_life: Vec<Value> = good_life.iter().skip(first_life.len()).cloned().collect();
    let verdicts =
        kstatus::check_in_progress_until_done(&second_life).unwrap_or_else(|e| panic!("{e}\nrecorded:\n{}", render(&second_life)));
    assert_eq!(verdicts.last(), Some(&KStatus::Current));

    // The bad plan: Failed, with a message naming the plan; never Current on the way.
    for obj in &bad_life {
        assert_ne!(kstatus::judge(obj).status, KStatus::Current, "bad plan judged Current: {}", obj["status"]);
    }
    let failed = kstatus::judge(bad_life.last().unwrap_or(&Value::Null));
    assert_eq!(failed.status, KStatus::Failed);
    assert!(failed.message.contains("gigantic"), "the Stalled message should name the plan: {}", failed.message);

    // The same snapshots through Flux's expressions: never Current before done, Failed at the end.
    let evaluator = evaluator("Server");
    for obj in first_life.iter().take(first_life.len() - 1).chain(std::iter::once(&changed_now)) {
        let verdict = evaluator.evaluate(obj);
        assert!(verdict != FluxVerdict::Current && verdict != FluxVerdict::Failed, "Flux: {verdict:?} on {}", obj["status"]);
        if obj.get("status").is_some() {
            assert!(!matches!(verdict, FluxVerdict::Unknown(_)), "Flux expression error on {}: {verdict:?}", obj["status"]);
        }
    }
    assert_eq!(evaluator.evaluate(first_life.last().unwrap_or(&Value::Null)), FluxVerdict::Current);
    assert_eq!(evaluator.evaluate(bad_life.last().unwrap_or(&Value::Null)), FluxVerdict::Failed);

    // And through Argo CD's health.lua in the Lua 5.1 sandbox.
    let lua = Lua51::locate().unwrap_or_else(|e| panic!("{e}"));
    let script_path = argocd::group_dir().join("Server/health.lua");
    let script = std::fs::read_to_string(&script_path).unwrap_or_else(|e| panic!("{}: {e}", script_path.display()));
    let health = |obj: &Value| lua.health("Server/health.lua", &script, obj).unwrap_or_else(|e| panic!("{e}"));
    for obj in first_life.iter().take(first_life.len() - 1).chain(std::iter::once(&changed_now)) {
        assert_eq!(health(obj).status, "Progressing", "{}", obj["status"]);
    }
    assert_eq!(health(first_life.last().unwrap_or(&Value::Null)).status, "Healthy");
    let degraded = health(bad_life.last().unwrap_or(&Value::Null));
    assert_eq!(degraded.status, "Degraded");
    assert!(degraded.message.contains("gigantic"), "{}", degraded.message);
}

/// Servers of a Cluster's pool, as the API server has them now.
async fn pool_servers(servers: &Api<DynamicObject>, cluster: &str, pool: &str) -> Vec<Value> {
    let prefix = format!("{cluster}-{pool}-");
    servers
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("list servers: {e}"))
        .items
        .into_iter()
        .filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with(&prefix)))
        .map(|s| serde_json::to_value(s).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn servers_counts(obj: &Value) -> (u64, u64) {
    let desired = obj.pointer("/status/servers/desired").and_then(Value::as_u64).unwrap_or(0);
    let ready = obj.pointer("/status/servers/ready").and_then(Value::as_u64).unwrap_or(0);
    (desired, ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_status_is_in_progress_until_its_servers_are_ready_and_failed_when_stalled() {
    let plane = ControlPlane::start().await;
    let client = plane.client.clone();
    plane.workspace().await;
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource("Cluster", "clusters"));
    let servers: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource("Server", "servers"));

    // On the Workspace's default (simulated) provider account; no taskservs.
    let good = json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"provider": "sim", "pools": [{"name": "app", "replicas": 2, "plan": "small"}]}
    });
    // A service the taskserv catalog does not have: the controller stalls on the spec.
    let bad = json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "bad-service", "namespace": NAMESPACE},
        "spec": {
            "provider": "sim",
            "pools": [{"name": "app", "replicas": 1, "plan": "small"}],
            "taskservs": [{"service": "no-such-service"}]
        }
    });

    // Stage "new", then provisioning (servers coming up), then Ready.
    let good_new = apply(&clusters, &good).await;
    let bad_new = apply(&clusters, &bad).await;
    let (good_life, bad_life) = tokio::join!(
        record(clusters.clone(), "web", kstatus::is_done),
        record(clusters.clone(), "bad-service", |o| kstatus::judge(o).status == KStatus::Failed),
    );
    let first_life = [vec![good_new], good_life].concat();
    let bad_life = [vec![bad_new], bad_life].concat();
    let first_servers = pool_servers(&servers, "web", "app").await;

    // Stage "spec changed": replicas 2 → 3.
    let mut changed = good.clone();
    changed["spec"]["pools"][0]["replicas"] = json!(3);
    let changed_now = apply(&clusters, &changed).await;
    let after_change = record(clusters.clone(), "web", kstatus::is_done).await;
    let second_life = [vec![changed_now.clone()], after_change].concat();
    let second_servers = pool_servers(&servers, "web", "app").await;

    plane.stop().await;

    eprintln!(
        "Cluster web, every stored version:\n{}\nafter replicas 3:\n{}\nbad-service:\n{}",
        render(&first_life),
        render(&second_life),
        render(&bad_life)
    );

    // When the controller says done, the pool's Servers really are all Ready.
    for (life, servers_now, replicas) in [(&first_life, &first_servers, 2u64), (&second_life, &second_servers, 3u64)] {
        assert_eq!(servers_now.len() as u64, replicas, "servers of pool app");
        for s in servers_now.iter() {
            assert!(
                kstatus::condition(s, "Ready").is_some_and(|c| c["status"] == "True"),
                "Cluster web done but Server {} is not Ready: {}",
                s["metadata"]["name"],
                s["status"]
            );
        }
        let done = life.last().unwrap_or(&Value::Null);
        assert!(kstatus::is_done(done), "{}", render(life));
        assert_eq!(servers_counts(done), (replicas, replicas), "{}", done["status"]);
    }

    // The judge: InProgress, never Current, until Ready for this generation — and nothing is
    // Current while the status counts fewer Ready servers than the pool wants.
    let verdicts = kstatus::check_in_progress_until_done(&first_life).unwrap_or_else(|e| panic!("{e}\nrecorded:\n{}", render(&first_life)));
    assert_eq!(verdicts.first(), Some(&KStatus::InProgress), "new");
    assert_eq!(verdicts.last(), Some(&KStatus::Current), "Ready:\n{}", render(&first_life));
    assert_eq!(verdicts.len(), first_life.len(), "recording stops at done");
    assert!(verdicts.len() >= 3, "expected new, provisioning and Ready stages:\n{}", render(&first_life));
    assert!(
        first_life.iter().any(|o| {
            kstatus::condition(o, "Reconciling").is_some_and(|c| c["status"] == "True") && o["status"]["phase"] == "Provisioning"
        }),
        "a provisioning stage (phase Provisioning, Reconciling=True):\n{}",
        render(&first_life)
    );
    for (life, replicas) in [(&first_life, 2u64), (&second_life, 3u64)] {
        for obj in life.iter() {
            if kstatus::judge(obj).status == KStatus::Current {
                assert_eq!(servers_counts(obj), (replicas, replicas), "judged Current before its servers are all Ready: {}", obj["status"]);
            }
        }
    }
    let changed_judgement = kstatus::judge(&changed_now);
    assert_eq!(
        changed_judgement.status,
        KStatus::InProgress,
        "spec changed: gen={} {}",
        changed_now["metadata"]["generation"],
        changed_now["status"]
    );
    assert_ne!(
        changed_now["metadata"]["generation"], changed_now["status"]["observedGeneration"],
        "spec changed: observedGeneration behind"
    );
    let verdicts =
        kstatus::check_in_progress_until_done(&second_life).unwrap_or_else(|e| panic!("{e}\nrecorded:\n{}", render(&second_life)));
    assert_eq!(verdicts.last(), Some(&KStatus::Current));
    assert!(
        second_life.iter().any(|o| o["status"]["observedGeneration"] == o["metadata"]["generation"]
            && kstatus::condition(o, "Reconciling").is_some_and(|c| c["status"] == "True"))
            || second_life.len() == 2,
        "after the change, a Reconciling stage (or straight to Ready):\n{}",
        render(&second_life)
    );

    // The invalid spec: Failed with a message naming the service; never Current on the way.
    for obj in &bad_life {
        assert_ne!(kstatus::judge(obj).status, KStatus::Current, "invalid Cluster judged Current: {}", obj["status"]);
    }
    let failed = kstatus::judge(bad_life.last().unwrap_or(&Value::Null));
    assert_eq!(failed.status, KStatus::Failed);
    assert!(failed.message.contains("no-such-service"), "the Stalled message should name the service: {}", failed.message);

    // Everything not done, for Flux and Argo: all but the last of each life.
    let not_done: Vec<&Value> = first_life[..first_life.len() - 1].iter().chain(second_life[..second_life.len() - 1].iter()).collect();

    // Flux's expressions: never current (nor failed) before done, current at Ready, failed when Stalled.
    let evaluator = evaluator("Cluster");
    for obj in &not_done {
        let verdict = evaluator.evaluate(obj);
        assert!(
            verdict != FluxVerdict::Current && verdict != FluxVerdict::Failed,
            "Flux: {verdict:?} on gen={} {}",
            obj["metadata"]["generation"],
            obj["status"]
        );
        if obj.get("status").is_some() {
            assert!(!matches!(verdict, FluxVerdict::Unknown(_)), "Flux expression error on {}: {verdict:?}", obj["status"]);
        }
    }
    for life in [&first_life, &second_life] {
        assert_eq!(evaluator.evaluate(life.last().unwrap_or(&Value::Null)), FluxVerdict::Current);
    }
    for obj in &bad_life {
        assert_ne!(evaluator.evaluate(obj), FluxVerdict::Current, "{}", obj["status"]);
    }
    assert_eq!(evaluator.evaluate(bad_life.last().unwrap_or(&Value::Null)), FluxVerdict::Failed);

    // Argo CD's Cluster/health.lua in the Lua 5.1 sandbox.
    let lua = Lua51::locate().unwrap_or_else(|e| panic!("{e}"));
    let script_path = argocd::group_dir().join("Cluster/health.lua");
    let script = std::fs::read_to_string(&script_path).unwrap_or_else(|e| panic!("{}: {e}", script_path.display()));
    let health = |obj: &Value| lua.health("Cluster/health.lua", &script, obj).unwrap_or_else(|e| panic!("{e}"));
    for obj in &not_done {
        assert_eq!(health(obj).status, "Progressing", "gen={} {}", obj["metadata"]["generation"], obj["status"]);
    }
    for life in [&first_life, &second_life] {
        assert_eq!(health(life.last().unwrap_or(&Value::Null)).status, "Healthy");
    }
    for obj in &bad_life {
        assert_ne!(health(obj).status, "Healthy", "{}", obj["status"]);
    }
    let degraded = health(bad_life.last().unwrap_or(&Value::Null));
    assert_eq!(degraded.status, "Degraded");
    assert!(degraded.message.contains("no-such-service"), "{}", degraded.message);
}
