//! Web console render time for a 1,000-server Cluster: the Cluster page's HTML (tree, steps
//! timeline, ready chart, conditions) rendered server-side from objects built in memory, as the
//! page handler and every batched live update do. Fails (exit 1) above the 1 s budget.
//!
//! `cargo bench -p provisioning-cli --bench console`

use std::time::{Duration, Instant};

use chrono::Utc;
use provisioning_cli::console::api::Kind;
use provisioning_cli::console::render::{self, Allowed, Layout, ObjectView};
use provisioning_cli::console::session::ReadyPoint;
use provisioning_cli::trace::{self, Objects, Root};
use provisioning_crds::{LABEL_CLUSTER, LABEL_POOL};
use serde_json::{Value, json};

const SERVERS: usize = 1000;
const BUDGET: Duration = Duration::from_secs(1);

fn conditions(ready: bool) -> Value {
    json!([{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": if ready { "Ready" } else { "Provisioning" },
        "message": if ready { "" } else { "waiting for the machine to boot" }, "lastTransitionTime": "2026-11-24T00:00:00Z"},
        {"type": "Reconciling", "status": if ready { "False" } else { "True" }, "reason": "Progressing", "message": "creating the machine",
        "lastTransitionTime": "2026-11-24T00:00:00Z"}])
}

fn objects() -> Objects {
    let pools = ["control", "workers", "storage", "edge"];
    let servers: Vec<Value> = (0..SERVERS)
        .map(|i| {
            let pool = pools[i % pools.len()];
            json!({"metadata": {"name": format!("big-{pool}-{i}"), "namespace": "scale", "uid": format!("uid-{i}"),
                "creationTimestamp": "2026-11-24T00:00:00Z", "labels": {LABEL_CLUSTER: "big", LABEL_POOL: pool}},
                "spec": {"plan": "small"}, "status": {"phase": if i % 7 == 0 { "Provisioning" } else { "Running" }, "conditions": conditions(i % 7 != 0)}})
        })
        .collect();
    let names: Vec<String> = servers.iter().filter_map(|s| s["metadata"]["name"].as_str().map(str::to_string)).collect();
    let taskservs: Vec<Value> = ["containerd", "etcd", "kubernetes"]
        .iter()
        .map(|svc| {
            let per_server: Vec<Value> = names
                .iter()
                .map(|n| json!({"name": n, "phase": "Installed", "healthy": true, "lastRun": {"script": "install.nu", "exitCode": 0, "outputTail": "ok"}}))
                .collect();
            json!({"metadata": {"name": format!("big-{svc}"), "namespace": "scale", "creationTimestamp": "2026-11-24T00:00:00Z",
                "labels": {LABEL_CLUSTER: "big"}}, "spec": {"service": svc, "servers": {"names": names}},
                "status": {"phase": "Installing", "conditions": conditions(false), "servers": per_server}})
        })
        .collect();
    let steps: Vec<Value> = (0..SERVERS + 3)
        .map(|i| {
            let start = format!("2026-11-24T00:{:02}:{:02}Z", (i / 60) % 60, i % 60);
            let end = format!("2026-11-24T00:{:02}:{:02}Z", ((i + 20) / 60) % 60, (i + 20) % 60);
            json!({"id": format!("s{i}"), "kind": if i < SERVERS { "CreateServer" } else { "InstallTaskServ" }, "target": format!("t{i}"),
                "state": if i < SERVERS - 100 { "Done" } else { "Running" }, "startedAt": start, "finishedAt": if i < SERVERS - 100 { Value::String(end) } else { Value::Null }})
        })
        .collect();
    let cluster = json!({"metadata": {"name": "big", "namespace": "scale", "uid": "c", "creationTimestamp": "2026-11-24T00:00:00Z"},
        "spec": {"pools": pools.iter().map(|p| json!({"name": p, "replicas": SERVERS / pools.len()})).collect::<Vec<_>>()},
        "status": {"phase": "Provisioning", "conditions": conditions(false), "servers": {"desired": SERVERS, "ready": SERVERS - SERVERS / 7},
            "steps": steps, "plan": {"id": "p-1", "summary": "create 3 servers", "changes": ["create big-edge-1000"]}}});
    Objects { namespace: "scale".into(), workspace: None, clusters: vec![cluster], servers, taskservs }
}

fn render_cluster_page(objs: &Objects, history: &[ReadyPoint]) -> anyhow::Result<String> {
    let now = Utc::now();
    let rows = trace::build(&Root::Cluster("big".into()), objs)?;
    let view = ObjectView {
        kind: Kind::Cluster,
        namespace: Some("scale"),
        object: &objs.clusters[0],
        rows: &rows,
        tree_namespace: "scale",
        allowed: Allowed { patch: true, approve: true, delete: true },
        csrf: "csrf",
        events: Ok(vec![]),
        records: Ok(vec![]),
        runs: vec![],
        ready_history: Some(history.to_vec()),
        now,
    };
    let fragment = render::object_fragment(&view);
    let layout = Layout { title: "Cluster big", user: "admin", csrf: "csrf", crumbs: vec![], path: "/namespaces/scale/clusters/big", now };
    Ok(render::page(&layout, &fragment))
}

fn main() -> anyhow::Result<()> {
    let objs = objects();
    let t0 = Utc::now().timestamp() - 600;
    let history: Vec<ReadyPoint> =
        (0..500).map(|i| ReadyPoint { at: t0 + i, ready: u32::try_from(i * 2).unwrap_or(0), desired: 1000 }).collect();
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..10 {
        let start = Instant::now();
        let html = render_cluster_page(&objs, &history)?;
        times.push(start.elapsed());
        size = html.len();
        anyhow::ensure!(html.matches("data-object=\"Server/").count() == SERVERS, "every server is in the tree");
    }
    times.sort();
    let (median, max) = (times[times.len() / 2], times[times.len() - 1]);
    println!(
        "console cluster page, {SERVERS} servers (3 TaskServs on each, {} steps): median {:.1} ms, max {:.1} ms over {} renders, {} KiB of HTML",
        SERVERS + 3,
        median.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        times.len(),
        size / 1024
    );
    anyhow::ensure!(max < BUDGET, "the Cluster page took {max:?}, over the {BUDGET:?} budget");
    Ok(())
}
