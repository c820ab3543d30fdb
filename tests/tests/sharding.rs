//! Sharded controllers (issue 31, item 3): three `provisioning controller` processes with
//! `sharding = true` against one API server, on the simulated provider.
//!
//! Two replicas split 12 Workspaces (3 Servers each, and an etcd Cluster in one); every
//! Workspace's objects carry exactly one live replica's `provisioning.dev/shard` label. One
//! replica is killed with SIGKILL in the middle of the rollout: its Workspaces are relabelled
//! to the survivor within 15 s and every Server reaches Ready. A third replica joins: it takes
//! some Workspaces over (drain, relabel, take over); new Servers created after that reach
//! Ready, so do the Cluster and its TaskServ. The simulated provider's journal shows exactly
//! one machine created per Server, and the replicas' audit lines show each object's provider
//! calls coming from one replica, or from one and then the next, never back and forth.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioning_e2e::{Dev, provisioning_bin, workspace_root};
use serde_json::{Value, json};

const LABEL: &str = "provisioning.dev/shard";
const PREFIX: &str = "shard-t";
const WORKSPACES: usize = 12;
const SERVERS_PER: usize = 3;
/// Members of the etcd Cluster in the first Workspace (its Servers and TaskServ are sharded
/// with the namespace too).
const MEMBERS: usize = 3;

struct Replica {
    child: Child,
    name: String,
    metrics: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts one sharded replica; its identity starts with `name` (POD_NAME).
fn spawn_replica(dev: &Dev, dir: &Path, name: &str) -> Result<Replica> {
    let metrics = free_port()?;
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\nsharding = true\naudit_stdout = true\nlease_namespace = \"default\"\nmetrics_addr = \"127.0.0.1:{metrics}\"\n",
            dev.data_dir.join("providers").display().to_string()
        ),
    )?;
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(provisioning_bin())
        .current_dir(workspace_root())
        .env("POD_NAME", name)
        .args(["controller", "--kubeconfig"])
        .arg(dev.kubeconfig())
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("spawn provisioning controller")?;
    Ok(Replica { child, name: name.to_string(), metrics })
}

fn get_json(dev: &Dev, args: &[&str]) -> Result<Value> {
    Ok(serde_json::from_str(&dev.kubectl_ok(args)?)?)
}

/// The identity of `replica` from its member Lease, once it holds one.
fn identity_of(dev: &Dev, replica: &Replica) -> Result<Option<String>> {
    let leases = get_json(dev, &["get", "leases", "-n", "default", "-l", "provisioning.dev/shard-member=true", "-o", "json"])?;
    let prefix = format!("{}-", replica.name);
    Ok(leases["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["spec"]["holderIdentity"].as_str())
        .find(|id| id.starts_with(&prefix))
        .map(str::to_string))
}

fn wait_identity(dev: &mut Dev, replica: &Replica) -> Result<String> {
    let mut found = None;
    dev.wait_until(Duration::from_secs(60), &format!("{}'s member Lease", replica.name), |d| {
        found = identity_of(d, replica)?;
        Ok(found.is_some())
    })?;
    found.context("no identity")
}

/// Our Workspaces and Servers: (namespace, kind, name, uid, shard label, Ready).
#[derive(Clone, Debug)]
struct Obj {
    namespace: String,
    kind: String,
    name: String,
    uid: String,
    label: Option<String>,
    ready: bool,
}

fn objects(dev: &Dev) -> Result<Vec<Obj>> {
    objects_of(dev, "workspaces,servers,clusters,taskservs")
}

fn objects_of(dev: &Dev, kinds: &str) -> Result<Vec<Obj>> {
    let list = get_json(dev, &["get", kinds, "-A", "-o", "json"])?;
    let mut out = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let kind = item["kind"].as_str().unwrap_or_default().to_string();
        let name = item["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let namespace =
            if kind == "Workspace" { name.clone() } else { item["metadata"]["namespace"].as_str().unwrap_or_default().to_string() };
        if !namespace.starts_with(PREFIX) {
            continue;
        }
        let conditions = item["status"]["conditions"].as_array().cloned().unwrap_or_default();
        out.push(Obj {
            namespace,
            kind,
            name,
            uid: item["metadata"]["uid"].as_str().unwrap_or_default().to_string(),
            label: item["metadata"]["labels"][LABEL].as_str().map(str::to_string),
            ready: conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"),
        });
    }
    Ok(out)
}

/// The labels each namespace's objects carry.
fn labels_by_namespace(objs: &[Obj]) -> BTreeMap<String, BTreeSet<Option<String>>> {
    let mut out: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    for o in objs {
        out.entry(o.namespace.clone()).or_default().insert(o.label.clone());
    }
    out
}

/// Every namespace's objects carry exactly one label, of a replica in `live`.
fn one_live_label_each(objs: &[Obj], live: &[&str]) -> bool {
    let by_ns = labels_by_namespace(objs);
    by_ns.len() == WORKSPACES
        && by_ns.values().all(|labels| labels.len() == 1 && labels.iter().all(|l| l.as_deref().is_some_and(|l| live.contains(&l))))
}

fn servers_ready(objs: &[Obj]) -> usize {
    objs.iter().filter(|o| o.kind == "Server" && o.ready).count()
}

fn apply_json(dev: &Dev, dir: &Path, name: &str, items: Vec<Value>) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?)?;
    dev.kubectl_ok(&["apply", "-f", &path.display().to_string()])?;
    Ok(())
}

fn server(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": name, "namespace": ns}, "spec": {}})
}

/// Machines created per Server uid, from the simulated provider's journals (every `create`
/// entry, deleted or not): the oracle of "no machine created twice".
fn creates_per_server(data_dir: &Path) -> Result<BTreeMap<String, usize>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() { walk(&p, out) } else { out.push(p) }
        }
    }
    let mut files = Vec::new();
    walk(data_dir, &mut files);
    let mut out = BTreeMap::new();
    for f in files
        .iter()
        .filter(|f| f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("simulated-") && n.ends_with(".jsonl")))
    {
        for line in std::fs::read_to_string(f)?.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            if v["op"] == "create"
                && let Some(uid) = v["machine"]["tags"]["provisioning.dev/server-uid"].as_str()
            {
                *out.entry(uid.to_string()).or_default() += 1;
            }
        }
    }
    Ok(out)
}

/// Per object, the replicas that made provider calls for it, in time order with repeats
/// collapsed (`A, B`: A acted, then B); from each replica's audit lines on its stdout.
fn actors_per_object(dir: &Path, replicas: &[&str]) -> Result<BTreeMap<String, Vec<String>>> {
    let mut calls: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for replica in replicas {
        for line in std::fs::read_to_string(dir.join(format!("{replica}.log")))?.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            let (Some(time), Some(kind), Some(name)) = (v["time"].as_str(), v["object"]["kind"].as_str(), v["object"]["name"].as_str())
            else {
                continue;
            };
            let object = format!("{kind}/{}/{name}", v["object"]["namespace"].as_str().unwrap_or_default());
            calls.entry(object).or_default().push((time.to_string(), (*replica).to_string()));
        }
    }
    Ok(calls
        .into_iter()
        .map(|(object, mut calls)| {
            calls.sort();
            let mut actors: Vec<String> = calls.into_iter().map(|(_, r)| r).collect();
            actors.dedup();
            (object, actors)
        })
        .collect())
}

/// No object was acted on by two replicas at once: per object, each replica's provider calls
/// form one run (`A, B` after a hand-over; never `A, B, A`).
fn check_no_interleaving(dir: &Path, replicas: &[&str]) -> Result<usize> {
    let actors = actors_per_object(dir, replicas)?;
    ensure!(!actors.is_empty(), "no audit lines found in the replicas' output");
    let interleaved: Vec<_> = actors
        .iter()
        .filter(|(_, a)| {
            let distinct: BTreeSet<&String> = a.iter().collect();
            distinct.len() != a.len()
        })
        .collect();
    ensure!(interleaved.is_empty(), "objects acted on by two replicas in turn: {interleaved:?}");
    Ok(actors.values().filter(|a| a.len() > 1).count())
}

fn scrape(port: u16) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

fn metric(body: &str, prefix: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn check_exactly_one_machine_each(dev: &Dev, objs: &[Obj]) -> Result<()> {
    let creates = creates_per_server(&dev.data_dir)?;
    let servers: Vec<&Obj> = objs.iter().filter(|o| o.kind == "Server").collect();
    for s in &servers {
        let n = creates.get(&s.uid).copied().unwrap_or(0);
        ensure!(n == 1, "Server {}/{} has {n} machines created at the simulated provider (want exactly 1)", s.namespace, s.name);
    }
    let ours: BTreeSet<&str> = servers.iter().map(|s| s.uid.as_str()).collect();
    let doubled: Vec<_> = creates.iter().filter(|(uid, n)| ours.contains(uid.as_str()) && **n > 1).collect();
    ensure!(doubled.is_empty(), "machines created twice: {doubled:?}");
    Ok(())
}

/// 12 Workspaces on a slow simulated account (1.5 s per call, one operation at a time, so the
/// rollout is still going when a replica is killed), 3 Servers each, and an etcd Cluster in
/// the first: (Namespaces and Workspaces, the rest).
fn manifests() -> (Vec<Value>, Vec<Value>) {
    let mut first = Vec::new();
    for i in 0..WORKSPACES {
        let ns = format!("{PREFIX}-{i:02}");
        first.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        first.push(json!({
            "apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": ns},
            "spec": {
                "providers": [{"name": "sim", "type": "simulated", "simulation": {"latencyMs": 1500}}],
                "defaults": {"provider": "sim"},
                "limits": {"maxServers": 10, "parallelLimit": 1}
            }
        }));
    }
    let mut servers: Vec<Value> =
        (0..WORKSPACES).flat_map(|i| (0..SERVERS_PER).map(move |j| server(&format!("{PREFIX}-{i:02}"), &format!("web-{j}")))).collect();
    servers.push(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "etcd", "namespace": format!("{PREFIX}-00")},
        "spec": {"pools": [{"name": "members", "replicas": MEMBERS, "plan": "small"}], "taskservs": [{"service": "etcd", "pools": ["members"]}]}
    }));
    (first, servers)
}

#[test]
fn replicas_split_workspaces_survive_a_kill_and_rebalance_on_join_without_double_work() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let mut dev = Dev::start_apiserver_in(&dir.join("data"))?;
    let r1 = spawn_replica(&dev, &dir, "replica1")?;
    let mut r2 = Some(spawn_replica(&dev, &dir, "replica2")?);
    let id1 = wait_identity(&mut dev, &r1)?;
    let id2 = wait_identity(&mut dev, r2.as_ref().context("r2")?)?;

    let (workspaces, servers) = manifests();
    apply_json(&dev, &dir, "workspaces.json", workspaces)?;
    apply_json(&dev, &dir, "servers.json", servers)?;
    let total = WORKSPACES * SERVERS_PER + MEMBERS;
    let count = |objs: &[Obj], kind: &str| objs.iter().filter(|o| o.kind == kind).count();

    // Split between the two: each Workspace's objects carry one live replica's label, and
    // both replicas hold some.
    // (A replica that saw itself alone for a moment may hold everything first and hand half
    // over a round later: wait for the split, with loads bounded by ceil(1.25 * 12 / 2) = 8.)
    let held = |objs: &[Obj], id: &str| objs.iter().filter(|o| o.kind == "Workspace" && o.label.as_deref() == Some(id)).count();
    let mut objs = Vec::new();
    dev.wait_until(Duration::from_secs(60), "the Workspaces split between replica1 and replica2", |d| {
        objs = objects(d)?;
        let (one, two) = (held(&objs, &id1), held(&objs, &id2));
        Ok(count(&objs, "Server") == total && one_live_label_each(&objs, &[&id1, &id2]) && (1..=8).contains(&one) && (1..=8).contains(&two))
    })?;

    // Mid-rollout: some machines created at the provider, not all. Kill -9 replica2.
    let mut created = 0;
    dev.wait_until(Duration::from_secs(120), "the first machines created", |d| {
        created = creates_per_server(&d.data_dir)?.len();
        Ok(created > 0)
    })?;
    drop(r2.take());
    let killed = Instant::now();
    ensure!(created < total, "the rollout was over before the kill ({created}/{total} machines): slow the account down");
    // Its Lease is not expired yet: the labels are as they were at the kill.
    objs = objects(&dev)?;
    let lost = held(&objs, &id2);
    // Up to the kill each object was acted on by one replica only.
    check_no_interleaving(&dir, &["replica1", "replica2"])?;
    dev.wait_until(Duration::from_secs(40), "replica2's Workspaces relabelled to replica1", |d| {
        objs = objects(d)?;
        Ok(one_live_label_each(&objs, &[&id1]))
    })?;
    let moved_in = killed.elapsed();
    ensure!(moved_in <= Duration::from_secs(15), "replica2's {lost} Workspaces took {moved_in:?} to move (limit 15 s)");
    eprintln!("kill -9 of replica2 at {created}/{total} machines created: its {lost} Workspaces moved in {:.1} s", moved_in.as_secs_f64());
    dev.wait_until(Duration::from_secs(240), "every Server Ready after the kill", |d| {
        objs = objects(d)?;
        Ok(servers_ready(&objs) == total)
    })?;
    check_exactly_one_machine_each(&dev, &objs)?;
    let handed = check_no_interleaving(&dir, &["replica1", "replica2"])?;
    eprintln!("{handed} objects were acted on by replica2, then replica1");

    // A third replica joins: it takes some Workspaces over; every Workspace ends with one
    // live label, and nothing is created twice.
    let r3 = spawn_replica(&dev, &dir, "replica3")?;
    let id3 = wait_identity(&mut dev, &r3)?;
    dev.wait_until(Duration::from_secs(60), "replica3 holding its share of the Workspaces", |d| {
        objs = objects(d)?;
        let (one, three) = (held(&objs, &id1), held(&objs, &id3));
        Ok(one_live_label_each(&objs, &[&id1, &id3]) && (1..=8).contains(&one) && (1..=8).contains(&three))
    })?;
    let joined = held(&objs, &id3);
    eprintln!("replica3 joined and took {joined} of {WORKSPACES} Workspaces");
    // New Servers after the hand-over reach Ready under whichever replica holds them.
    let more: Vec<Value> = (0..WORKSPACES).map(|i| server(&format!("{PREFIX}-{i:02}"), "late")).collect();
    apply_json(&dev, &dir, "late.json", more)?;
    dev.wait_until(Duration::from_secs(240), "every Server Ready after the join", |d| {
        objs = objects(d)?;
        Ok(servers_ready(&objs) == total + WORKSPACES && one_live_label_each(&objs, &[&id1, &id3]))
    })?;
    check_exactly_one_machine_each(&dev, &objs)?;
    let alive = provisioning_e2e::simulated_machines(&dev.data_dir)?;
    let ours = alive.iter().filter(|m| m.tags.get("provisioning.dev/namespace").is_some_and(|n| n.starts_with(PREFIX))).count();
    ensure!(ours == total + WORKSPACES, "{ours} machines alive for {} Servers", total + WORKSPACES);
    // The Cluster and its TaskServ went on under whichever replica holds their namespace.
    dev.wait_until(Duration::from_secs(120), "the etcd Cluster and its TaskServ Ready", |d| {
        objs = objects(d)?;
        Ok(objs.iter().filter(|o| o.kind == "Cluster" || o.kind == "TaskServ").filter(|o| o.ready).count() == 2)
    })?;
    let handed = check_no_interleaving(&dir, &["replica1", "replica2", "replica3"])?;
    eprintln!("{handed} objects were acted on by two replicas in turn (after a kill or a hand-over), none by two at once");

    // Visible: the label as a kubectl column, and each replica's count on its /metrics.
    let column = dev.kubectl_ok(&["get", "servers", "-n", &format!("{PREFIX}-00"), "-L", LABEL])?;
    let holder = objs.iter().find(|o| o.namespace == format!("{PREFIX}-00")).and_then(|o| o.label.clone()).unwrap_or_default();
    ensure!(column.contains("SHARD") && column.contains(&holder), "kubectl -L shows the shard:\n{column}");
    for (replica, id) in [(&r1, &id1), (&r3, &id3)] {
        let want = objs.iter().filter(|o| o.kind == "Server" && o.label.as_deref() == Some(id.as_str())).count();
        let prefix = format!("provisioning_shard_objects{{shard=\"{id}\",kind=\"Server\"}}");
        let start = Instant::now();
        loop {
            let seen = scrape(replica.metrics).ok().and_then(|body| metric(&body, &prefix));
            #[expect(clippy::cast_precision_loss, reason = "small counts")]
            if seen == Some(want as f64) {
                break;
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("{prefix} is {seen:?}, want {want}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    Ok(())
}
