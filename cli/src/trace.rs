//! `provisioning trace KIND/NAME`: an object and everything it owns as a tree —
//! Workspace → Clusters → pools → Servers → TaskServs per server — with READY, STATUS, AGE and
//! the message that explains the state (like `clusterctl describe cluster` and
//! `crossplane resource trace`).
//!
//! The tree is built by a pure function over the objects as JSON ([`build`]), so what it shows
//! is tested without a cluster; [`fetch`] lists the four kinds of one namespace and [`run`]
//! prints (and with `-w` redraws on every watch event, batched).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::StreamExt;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use provisioning_crds::{Cluster, LABEL_CLUSTER, LABEL_POOL, Server, TaskServ, Workspace};
use serde_json::{Value, json};

/// What to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Root {
    /// A Workspace (cluster-scoped): everything in its namespace.
    Workspace(String),
    /// A Cluster: its pools, Servers and TaskServs.
    Cluster(String),
    /// A Server and the TaskServs installed on it.
    Server(String),
    /// A TaskServ and its per-server state.
    TaskServ(String),
}

impl Root {
    /// Parses `KIND/NAME` with the kinds' names, plurals and short names (as kubectl accepts them).
    pub fn parse(s: &str) -> anyhow::Result<Root> {
        let Some((kind, name)) = s.split_once('/') else {
            bail!("expected KIND/NAME (for example workspace/demo, cluster/etcd, server/web-1, taskserv/redis), got {s:?}");
        };
        if name.is_empty() || name.contains('/') {
            bail!("expected KIND/NAME, got {s:?}: the name is empty or has a '/'");
        }
        let name = name.to_string();
        // `kind.group` as kubectl accepts it (servers.provisioning.dev/web-1).
        let kind = kind.to_ascii_lowercase();
        let kind = kind.strip_suffix(".provisioning.dev").unwrap_or(&kind);
        Ok(match kind {
            "workspace" | "workspaces" | "ws" => Root::Workspace(name),
            "cluster" | "clusters" | "pcl" => Root::Cluster(name),
            "server" | "servers" | "srv" => Root::Server(name),
            "taskserv" | "taskservs" | "ts" => Root::TaskServ(name),
            other => bail!("unknown kind {other:?}: trace knows workspace, cluster, server and taskserv"),
        })
    }
}

/// The objects of one namespace that a tree is drawn from (as JSON, as the API returns them).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// The namespace the objects were listed in.
    pub namespace: String,
    /// The Workspace, when the root is one.
    pub workspace: Option<Value>,
    /// Clusters of the namespace.
    pub clusters: Vec<Value>,
    /// Servers of the namespace.
    pub servers: Vec<Value>,
    /// TaskServs of the namespace.
    pub taskservs: Vec<Value>,
}

/// One line of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Nesting depth (0 = root).
    pub depth: usize,
    /// `Kind/name` (pools: `Pool/name`).
    pub object: String,
    /// Ready condition status: True, False, Unknown, or `-` where there is none.
    pub ready: String,
    /// status.phase (a TaskServ under a Server: its phase on that server).
    pub status: String,
    /// creationTimestamp (RFC 3339), empty for pools.
    pub created: String,
    /// The message of the condition that explains the state.
    pub message: String,
    /// Running step and the step it waits for (Clusters; `-o wide`).
    pub steps: String,
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or_default()
}

fn name_of(v: &Value) -> &str {
    s(v, &["metadata", "name"])
}

fn condition<'a>(v: &'a Value, kind: &str) -> Option<&'a Value> {
    v["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

/// The condition that explains the state: Stalled when true, else Ready's message when Ready
/// is not True, else Reconciling's when it is True; empty for a settled object.
fn explaining_message(v: &Value) -> String {
    let is_true = |t: &str| condition(v, t).is_some_and(|c| c["status"] == "True");
    let msg = |t: &str| condition(v, t).and_then(|c| c["message"].as_str()).unwrap_or_default().to_string();
    if is_true("Stalled") {
        return msg("Stalled");
    }
    if is_true("Paused") {
        return format!("paused: {}", msg("Paused")).trim_end_matches(": ").to_string();
    }
    if !is_true("Ready") {
        let m = msg("Ready");
        if !m.is_empty() {
            return m;
        }
    }
    if is_true("Reconciling") { msg("Reconciling") } else { String::new() }
}

fn object_row(depth: usize, kind: &str, v: &Value) -> Row {
    Row {
        depth,
        object: format!("{kind}/{}", name_of(v)),
        ready: condition(v, "Ready").and_then(|c| c["status"].as_str()).unwrap_or("Unknown").to_string(),
        status: s(v, &["status", "phase"]).to_string(),
        created: s(v, &["metadata", "creationTimestamp"]).to_string(),
        message: explaining_message(v),
        steps: String::new(),
    }
}

/// A Cluster's running steps and the first step still waiting.
fn cluster_steps(cluster: &Value) -> String {
    let steps = cluster["status"]["steps"].as_array().cloned().unwrap_or_default();
    let label = |st: &Value| format!("{} {}", s(st, &["kind"]), s(st, &["target"])).trim().to_string();
    let running: Vec<String> = steps.iter().filter(|st| st["state"] == "Running").map(label).collect();
    let waiting = steps.iter().find(|st| matches!(st["state"].as_str(), Some("Pending" | "Waiting" | "Blocked")));
    let mut out = Vec::new();
    if !running.is_empty() {
        out.push(format!("running: {}", running.join(", ")));
    }
    if let Some(w) = waiting {
        out.push(format!("next: {}", label(w)));
    }
    out.join("; ")
}

/// The servers a TaskServ targets: its resolved per-server status, else the names in its spec.
fn taskserv_servers(ts: &Value) -> Vec<String> {
    let resolved: Vec<String> =
        ts["status"]["servers"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str().map(str::to_string)).collect();
    if !resolved.is_empty() {
        return resolved;
    }
    ts["spec"]["servers"]["names"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(str::to_string)).collect()
}

/// A TaskServ with what the tree asks of it per server, worked out once: the servers it
/// targets and its status entry for each (looked up per Server row, so by name, not by scan).
struct TaskServInfo<'a> {
    ts: &'a Value,
    /// Target server names in the order of the TaskServ's status (else spec).
    targets: Vec<String>,
    target_set: HashSet<String>,
    entries: HashMap<&'a str, &'a Value>,
}

impl<'a> TaskServInfo<'a> {
    fn new(ts: &'a Value) -> Self {
        let targets = taskserv_servers(ts);
        let target_set = targets.iter().cloned().collect();
        let mut entries = HashMap::new();
        for e in ts["status"]["servers"].as_array().into_iter().flatten() {
            // The first entry of a name wins, as a linear search would find it.
            if let Some(n) = e["name"].as_str() {
                entries.entry(n).or_insert(e);
            }
        }
        TaskServInfo { ts, targets, target_set, entries }
    }

    fn targets(&self, server: &str) -> bool {
        self.target_set.contains(server)
    }
}

/// A TaskServ as seen on one server: its phase there and, when it failed, the last output line.
fn taskserv_on_server(depth: usize, ts: &TaskServInfo<'_>, server: &str) -> Row {
    let mut row = object_row(depth, "TaskServ", ts.ts);
    if let Some(entry) = ts.entries.get(server) {
        row.status = s(entry, &["phase"]).to_string();
        let healthy = entry["healthy"].as_bool();
        row.ready = match (row.status.as_str(), healthy) {
            (_, Some(false)) => "False".into(),
            ("Installed" | "Ready", _) => "True".into(),
            ("Failed", _) => "False".into(),
            _ => "Unknown".into(),
        };
        if row.status == "Failed" {
            let tail = s(entry, &["lastRun", "outputTail"]).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
            if !tail.is_empty() {
                row.message = format!("{} failed: {tail}", s(entry, &["lastRun", "script"]));
            }
        }
    }
    row
}

fn label<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v["metadata"]["labels"][key].as_str()
}

fn server_subtree(out: &mut Vec<Row>, depth: usize, server: &Value, taskservs: &[&TaskServInfo<'_>]) {
    out.push(object_row(depth, "Server", server));
    let name = name_of(server);
    for ts in taskservs.iter().filter(|ts| ts.targets(name)) {
        out.push(taskserv_on_server(depth + 1, ts, name));
    }
}

/// The namespace's objects sorted by name, grouped by Cluster and indexed once, so each
/// subtree is drawn from its own members instead of scanning every object per row (the
/// tree of a 1,000-server Cluster with TaskServs on every server was quadratic before).
struct Index<'a> {
    clusters: Vec<&'a Value>,
    servers: Vec<&'a Value>,
    taskservs: Vec<TaskServInfo<'a>>,
    /// Servers per Cluster label, in name order.
    servers_of: HashMap<&'a str, Vec<&'a Value>>,
    /// TaskServs (indices into `taskservs`) per Cluster label, in name order.
    taskservs_of: HashMap<&'a str, Vec<usize>>,
}

impl<'a> Index<'a> {
    fn new(objs: &'a Objects) -> Self {
        let sorted = |list: &'a [Value]| {
            let mut v: Vec<&'a Value> = list.iter().collect();
            v.sort_by(|a, b| name_of(a).cmp(name_of(b)));
            v
        };
        let (clusters, servers) = (sorted(&objs.clusters), sorted(&objs.servers));
        let taskservs: Vec<TaskServInfo<'a>> = sorted(&objs.taskservs).into_iter().map(TaskServInfo::new).collect();
        let mut servers_of: HashMap<&str, Vec<&Value>> = HashMap::new();
        for srv in &servers {
            if let Some(c) = label(srv, LABEL_CLUSTER) {
                servers_of.entry(c).or_default().push(srv);
            }
        }
        let mut taskservs_of: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, ts) in taskservs.iter().enumerate() {
            if let Some(c) = label(ts.ts, LABEL_CLUSTER) {
                taskservs_of.entry(c).or_default().push(i);
            }
        }
        Index { clusters, servers, taskservs, servers_of, taskservs_of }
    }
}

/// The stages of a Kubernetes install (its Cluster conditions, in the order they are
/// reached), one row each: READY is the condition's status, STATUS its reason.
fn stage_rows(out: &mut Vec<Row>, depth: usize, cluster: &Value) {
    for t in provisioning_crds::kubernetes_condition::ALL {
        let Some(c) = condition(cluster, t) else { continue };
        out.push(Row {
            depth,
            object: format!("Stage/{t}"),
            ready: c["status"].as_str().unwrap_or("Unknown").to_string(),
            status: c["reason"].as_str().unwrap_or_default().to_string(),
            created: String::new(),
            message: c["message"].as_str().unwrap_or_default().to_string(),
            steps: String::new(),
        });
    }
}

fn cluster_subtree(out: &mut Vec<Row>, depth: usize, cluster: &Value, idx: &Index<'_>) {
    let cname = name_of(cluster);
    let mut row = object_row(depth, "Cluster", cluster);
    row.steps = cluster_steps(cluster);
    out.push(row);
    stage_rows(out, depth + 1, cluster);
    let servers: &[&Value] = idx.servers_of.get(cname).map(Vec::as_slice).unwrap_or_default();
    let taskservs: Vec<&TaskServInfo<'_>> =
        idx.taskservs_of.get(cname).into_iter().flatten().filter_map(|&i| idx.taskservs.get(i)).collect();
    let spec_pools: Vec<&Value> = cluster["spec"]["pools"].as_array().into_iter().flatten().collect();
    let mut pools: Vec<String> = spec_pools.iter().filter_map(|p| p["name"].as_str().map(str::to_string)).collect();
    // Members per pool in one pass; pools no longer in the spec follow in order of appearance.
    let mut members_of: HashMap<&str, Vec<&Value>> = HashMap::new();
    for srv in servers {
        let p = label(srv, LABEL_POOL).unwrap_or_default();
        let members = members_of.entry(p).or_default();
        if members.is_empty() && !pools.iter().any(|q| q == p) {
            pools.push(p.to_string());
        }
        members.push(srv);
    }
    for pool in pools {
        let members = members_of.get(pool.as_str()).map(Vec::as_slice).unwrap_or_default();
        let desired = spec_pools.iter().find(|p| p["name"] == pool.as_str()).and_then(|p| p["replicas"].as_u64());
        let ready = members.iter().filter(|m| condition(m, "Ready").is_some_and(|c| c["status"] == "True")).count();
        let want = desired.map_or(members.len(), |d| usize::try_from(d).unwrap_or(usize::MAX));
        out.push(Row {
            depth: depth + 1,
            object: format!("Pool/{}", if pool.is_empty() { "-" } else { &pool }),
            ready: if ready == want && want > 0 { "True".into() } else { "False".into() },
            status: format!("{ready}/{want} ready"),
            created: String::new(),
            message: String::new(),
            steps: String::new(),
        });
        for srv in members {
            server_subtree(out, depth + 2, srv, &taskservs);
        }
    }
    // TaskServs of the Cluster that target no server of it yet.
    let names: HashSet<&str> = servers.iter().map(|s| name_of(s)).collect();
    for ts in taskservs.iter().filter(|ts| !ts.targets.iter().any(|n| names.contains(n.as_str()))) {
        out.push(object_row(depth + 1, "TaskServ", ts.ts));
    }
}

/// The tree for `root` over `objs`, depth-first, children sorted by name.
pub fn build(root: &Root, objs: &Objects) -> anyhow::Result<Vec<Row>> {
    let idx = Index::new(objs);
    fn find<'a>(list: &[&'a Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
        list.iter().copied().find(|v| name_of(v) == name).with_context(|| format!("{kind} {name:?} not found"))
    }
    let mut out = Vec::new();
    match root {
        Root::Workspace(name) => {
            let ws = objs.workspace.as_ref().with_context(|| format!("Workspace {name:?} not found"))?;
            out.push(object_row(0, "Workspace", ws));
            for cluster in &idx.clusters {
                cluster_subtree(&mut out, 1, cluster, &idx);
            }
            let standalone_ts: Vec<&TaskServInfo<'_>> =
                idx.taskservs.iter().filter(|ts| ts.ts["metadata"]["labels"][LABEL_CLUSTER].is_null()).collect();
            for srv in idx.servers.iter().filter(|v| v["metadata"]["labels"][LABEL_CLUSTER].is_null()) {
                server_subtree(&mut out, 1, srv, &standalone_ts);
            }
            let placed: HashSet<&str> = idx.servers.iter().map(|s| name_of(s)).collect();
            for ts in standalone_ts.iter().filter(|ts| !ts.targets.iter().any(|n| placed.contains(n.as_str()))) {
                out.push(object_row(1, "TaskServ", ts.ts));
            }
        }
        Root::Cluster(name) => {
            let cluster = find(&idx.clusters, "Cluster", name)?;
            cluster_subtree(&mut out, 0, cluster, &idx);
        }
        Root::Server(name) => {
            let srv = find(&idx.servers, "Server", name)?;
            let all: Vec<&TaskServInfo<'_>> = idx.taskservs.iter().collect();
            server_subtree(&mut out, 0, srv, &all);
        }
        Root::TaskServ(name) => {
            let ts = idx.taskservs.iter().find(|ts| name_of(ts.ts) == name).with_context(|| format!("TaskServ {name:?} not found"))?;
            out.push(object_row(0, "TaskServ", ts.ts));
            let by_name: HashMap<&str, &Value> = idx.servers.iter().map(|s| (name_of(s), *s)).collect();
            for server in &ts.targets {
                match by_name.get(server.as_str()) {
                    Some(srv) => {
                        let mut row = object_row(1, "Server", srv);
                        let on = taskserv_on_server(1, ts, server);
                        row.status = format!("{} (service: {})", row.status, if on.status.is_empty() { "-" } else { &on.status });
                        if row.message.is_empty() {
                            row.message = on.message;
                        }
                        out.push(row);
                    }
                    None => out.push(Row {
                        depth: 1,
                        object: format!("Server/{server}"),
                        ready: "False".into(),
                        status: "Missing".into(),
                        created: String::new(),
                        message: "no such Server in the namespace".into(),
                        steps: String::new(),
                    }),
                }
            }
        }
    }
    Ok(out)
}

/// `kubectl`-style age: 45s, 12m, 3h, 5d.
pub fn age(created: &str, now: chrono::DateTime<chrono::Utc>) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(created) else { return "-".into() };
    let secs = (now - t.with_timezone(&chrono::Utc)).num_seconds().max(0);
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// The rows with tree branches (`├─`, `└─`, `│`) in the first column.
fn tree_names(rows: &[Row]) -> Vec<String> {
    (0..rows.len())
        .map(|i| {
            let depth = rows[i].depth;
            if depth == 0 {
                return rows[i].object.clone();
            }
            // Whether a later row continues the branch at level `d` before the tree leaves it.
            let continues = |d: usize| rows[i + 1..].iter().take_while(|r| r.depth >= d).any(|r| r.depth == d);
            let mut prefix = String::new();
            for d in 1..depth {
                prefix.push_str(if continues(d) { "│ " } else { "  " });
            }
            prefix.push_str(if continues(depth) { "├─" } else { "└─" });
            format!("{prefix}{}", rows[i].object)
        })
        .collect()
}

/// Renders the table: NAME READY STATUS AGE MESSAGE (and STEPS with `wide`).
pub fn render_table(rows: &[Row], wide: bool, now: chrono::DateTime<chrono::Utc>) -> String {
    let names = tree_names(rows);
    let ages: Vec<String> = rows.iter().map(|r| if r.created.is_empty() { String::new() } else { age(&r.created, now) }).collect();
    let width = |header: &str, col: &dyn Fn(usize) -> usize| (0..rows.len()).map(col).max().unwrap_or(0).max(header.chars().count());
    let wn = width("NAME", &|i| names[i].chars().count());
    let wr = width("READY", &|i| rows[i].ready.len());
    let ws = width("STATUS", &|i| rows[i].status.chars().count());
    let wa = width("AGE", &|i| ages[i].len());
    let pad = |t: &str, w: usize| format!("{t}{}", " ".repeat(w.saturating_sub(t.chars().count())));
    let mut out = String::new();
    let mut line = |cols: [&str; 6]| {
        let mut l = format!("{}  {}  {}  {}  {}", pad(cols[0], wn), pad(cols[1], wr), pad(cols[2], ws), pad(cols[3], wa), cols[4]);
        if wide && !cols[5].is_empty() {
            l.push_str(if cols[4].is_empty() { "" } else { "  " });
            l.push_str(cols[5]);
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(["NAME", "READY", "STATUS", "AGE", "MESSAGE", if wide { "STEPS" } else { "" }]);
    for (i, r) in rows.iter().enumerate() {
        let msg = one_line(&r.message, if wide { 400 } else { 100 });
        line([&names[i], &r.ready, &r.status, &ages[i], &msg, &r.steps]);
    }
    out
}

fn one_line(m: &str, max: usize) -> String {
    let flat = m.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max { flat } else { format!("{}…", flat.chars().take(max).collect::<String>()) }
}

/// The rows as nested JSON (`-o json`): each node with its children.
pub fn render_json(rows: &[Row]) -> Value {
    fn node(rows: &[Row], i: usize) -> (Value, usize) {
        let r = &rows[i];
        let mut children = Vec::new();
        let mut j = i + 1;
        while j < rows.len() && rows[j].depth > r.depth {
            let (child, next) = node(rows, j);
            children.push(child);
            j = next;
        }
        let (kind, name) = r.object.split_once('/').unwrap_or((&r.object, ""));
        let v = json!({"kind": kind, "name": name, "ready": r.ready, "status": r.status, "created": r.created,
            "message": r.message, "steps": r.steps, "children": children});
        (v, j)
    }
    if rows.is_empty() { Value::Null } else { node(rows, 0).0 }
}

/// Lists what the tree of `root` needs from `namespace` (a Workspace: its own namespace).
pub async fn fetch(client: &Client, root: &Root, namespace: &str) -> anyhow::Result<Objects> {
    let mut ns = namespace.to_string();
    let mut objs = Objects::default();
    if let Root::Workspace(name) = root {
        let api: Api<Workspace> = Api::all(client.clone());
        let ws = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading Workspace {name}"))?
            .with_context(|| format!("Workspace {name:?} not found"))?;
        ns = provisioning_controller::effective_workspace::claimed_namespace(&ws);
        objs.workspace = Some(serde_json::to_value(ws)?);
    }
    objs.namespace = ns.clone();
    // Each object read within the controller's per-object depth and size budget (one over it
    // is shown by name only), as the web console does.
    let list = |ar: kube::api::ApiResource, what: &'static str| {
        let api: Api<provisioning_controller::decode::BoundedObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        async move { crate::listing::bounded_list(&api, &ListParams::default()).await.with_context(|| format!("listing {what}")) }
    };
    objs.clusters = list(kube::api::ApiResource::erase::<Cluster>(&()), "Clusters").await?;
    objs.servers = list(kube::api::ApiResource::erase::<Server>(&()), "Servers").await?;
    objs.taskservs = list(kube::api::ApiResource::erase::<TaskServ>(&()), "TaskServs").await?;
    Ok(objs)
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// NAME READY STATUS AGE MESSAGE.
    Table,
    /// The table plus the Cluster's running/next steps.
    Wide,
    /// Nested JSON.
    Json,
}

impl Format {
    /// Parses `-o`: empty, `wide` or `json`.
    pub fn parse(s: &str) -> anyhow::Result<Format> {
        match s {
            "" | "table" => Ok(Format::Table),
            "wide" => Ok(Format::Wide),
            "json" => Ok(Format::Json),
            other => bail!("unknown output format {other:?}: use wide or json"),
        }
    }
}

fn render(rows: &[Row], format: Format) -> anyhow::Result<String> {
    let now = chrono::Utc::now();
    Ok(match format {
        Format::Table => render_table(rows, false, now),
        Format::Wide => render_table(rows, true, now),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&render_json(rows))?),
    })
}

/// Prints the tree once, or with `watch` redraws it whenever one of the four kinds changes
/// (events within 200 ms are drawn once). Returns when not watching, or on Ctrl-C.
pub async fn run(client: Client, root: Root, namespace: String, format: Format, watch: bool) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let draw = |text: &str| {
        let mut out = std::io::stdout().lock();
        if watch && std::io::stdout().is_terminal() {
            let _ = write!(out, "\x1b[2J\x1b[H");
        }
        let _ = out.write_all(text.as_bytes());
        if watch && !std::io::stdout().is_terminal() {
            let _ = out.write_all(b"\n");
        }
        let _ = out.flush();
    };
    let objs = fetch(&client, &root, &namespace).await?;
    let rows = build(&root, &objs)?;
    let mut last = render(&rows, format)?;
    draw(&last);
    if !watch {
        return Ok(());
    }
    let ns = objs.namespace.clone();
    // Change notifications only: metadata-only requests, decoded to what names each object.
    let notices = |ar: kube::api::ApiResource, namespaced: bool| {
        let api: Api<provisioning_controller::decode::Notice> =
            if namespaced { Api::namespaced_with(client.clone(), &ns, &ar) } else { Api::all_with(client.clone(), &ar) };
        watcher(api, watcher::Config::default().page_size(10)).map(|r| r.map(|_| ()).map_err(anyhow::Error::from)).boxed()
    };
    let changes = futures::stream::select_all(vec![
        notices(kube::api::ApiResource::erase::<Cluster>(&()), true),
        notices(kube::api::ApiResource::erase::<Server>(&()), true),
        notices(kube::api::ApiResource::erase::<TaskServ>(&()), true),
        notices(kube::api::ApiResource::erase::<Workspace>(&()), false),
    ]);
    tokio::pin!(changes);
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            ev = changes.next() => {
                match ev {
                    None => return Ok(()),
                    Some(Err(e)) => tracing::debug!(error = %e, "watch error (retrying)"),
                    Some(Ok(())) => {}
                }
                // Batch a burst of events into one redraw.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = ticker.tick() => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let text = match fetch(&client, &root, &namespace).await.and_then(|o| build(&root, &o)) {
            Ok(rows) => render(&rows, format)?,
            Err(e) => format!("error: {e:#}\n"),
        };
        // AGE changes every tick; redraw only when something else did, or on the ticker.
        if text != last {
            draw(&text);
            last = text;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, status: &str, msg: &str) -> Value {
        json!({"type": t, "status": status, "message": msg, "reason": "R"})
    }

    fn obj(name: &str, labels: Value, phase: &str, conditions: Vec<Value>) -> Value {
        json!({"metadata": {"name": name, "labels": labels, "creationTimestamp": "2026-11-24T00:00:00Z"},
            "spec": {}, "status": {"phase": phase, "conditions": conditions}})
    }

    fn sample() -> Objects {
        let mut cluster = obj("etcd", json!({}), "Provisioning", vec![cond("Ready", "False", "1/3 servers ready")]);
        cluster["spec"]["pools"] = json!([{"name": "members", "replicas": 3}]);
        cluster["status"]["steps"] = json!([
            {"id": "a", "kind": "CreateServer", "target": "etcd-members-1", "state": "Done"},
            {"id": "b", "kind": "CreateServer", "target": "etcd-members-2", "state": "Running"},
            {"id": "c", "kind": "InstallTaskServ", "target": "etcd", "state": "Pending"}]);
        let member =
            |n: &str, ready: &str| obj(n, json!({LABEL_CLUSTER: "etcd", LABEL_POOL: "members"}), "Running", vec![cond("Ready", ready, "")]);
        let mut ts_etcd = obj("etcd-etcd", json!({LABEL_CLUSTER: "etcd"}), "Installing", vec![cond("Ready", "False", "installing")]);
        ts_etcd["status"]["servers"] = json!([{"name": "etcd-members-1", "phase": "Installed", "healthy": true},
            {"name": "etcd-members-2", "phase": "Failed", "lastRun": {"script": "install.nu", "outputTail": "ok\nboom: disk full\n"}}]);
        let mut redis = obj("redis", json!({}), "Ready", vec![cond("Ready", "True", "")]);
        redis["spec"]["servers"] = json!({"names": ["solo"]});
        let orphan = obj(
            "lonely",
            json!({}),
            "Pending",
            vec![cond("Ready", "False", "waiting for server ghost"), cond("Stalled", "True", "Server ghost not found")],
        );
        Objects {
            namespace: "demo".into(),
            workspace: Some(obj("demo", json!({}), "Ready", vec![cond("Ready", "False", "2 of 5 servers ready")])),
            clusters: vec![cluster],
            servers: vec![
                member("etcd-members-2", "False"),
                member("etcd-members-1", "True"),
                obj("solo", json!({}), "Running", vec![cond("Ready", "True", "")]),
            ],
            taskservs: vec![ts_etcd, redis, orphan],
        }
    }

    #[test]
    fn a_kubernetes_clusters_stages_are_rows_under_it() -> anyhow::Result<()> {
        let mut objs = sample();
        let stage = |t: &str, status: &str, reason: &str, msg: &str| json!({"type": t, "status": status, "reason": reason, "message": msg});
        if let Some(conds) = objs.clusters[0]["status"]["conditions"].as_array_mut() {
            conds.push(stage("WorkersJoined", "False", "MembersJoining", "1/2 members"));
            conds.push(stage("ControlPlaneInitialized", "True", "Initialized", "kubeadm init done on k8s-cp-0"));
        }
        let rows = build(&Root::Cluster("etcd".into()), &objs)?;
        let stages: Vec<(&str, &str, &str, &str)> = rows
            .iter()
            .filter(|r| r.object.starts_with("Stage/"))
            .map(|r| (r.object.as_str(), r.ready.as_str(), r.status.as_str(), r.message.as_str()))
            .collect();
        assert_eq!(
            stages,
            [
                ("Stage/ControlPlaneInitialized", "True", "Initialized", "kubeadm init done on k8s-cp-0"),
                ("Stage/WorkersJoined", "False", "MembersJoining", "1/2 members"),
            ]
        );
        assert_eq!((rows[1].depth, rows[3].object.as_str()), (1, "Pool/members"), "stages come first, pools after");
        Ok(())
    }

    #[test]
    fn workspace_tree_nests_clusters_pools_servers_and_taskservs_per_server() -> anyhow::Result<()> {
        let rows = build(&Root::Workspace("demo".into()), &sample())?;
        let shape: Vec<(usize, &str)> = rows.iter().map(|r| (r.depth, r.object.as_str())).collect();
        assert_eq!(
            shape,
            vec![
                (0, "Workspace/demo"),
                (1, "Cluster/etcd"),
                (2, "Pool/members"),
                (3, "Server/etcd-members-1"),
                (4, "TaskServ/etcd-etcd"),
                (3, "Server/etcd-members-2"),
                (4, "TaskServ/etcd-etcd"),
                (1, "Server/solo"),
                (2, "TaskServ/redis"),
                (1, "TaskServ/lonely"),
            ]
        );
        assert_eq!(rows[2].status, "1/3 ready");
        assert_eq!(rows[2].ready, "False");
        // The TaskServ under each server shows its state there, and a failure's last line.
        assert_eq!((rows[4].status.as_str(), rows[4].ready.as_str()), ("Installed", "True"));
        assert_eq!((rows[6].status.as_str(), rows[6].ready.as_str()), ("Failed", "False"));
        assert_eq!(rows[6].message, "install.nu failed: boom: disk full");
        // Stalled explains before Ready.
        assert_eq!(rows[9].message, "Server ghost not found");
        assert_eq!(rows[1].steps, "running: CreateServer etcd-members-2; next: InstallTaskServ etcd");
        Ok(())
    }

    #[test]
    fn leftover_pools_and_taskservs_and_the_taskserv_root() -> anyhow::Result<()> {
        let mut objs = sample();
        // A member of a pool the spec no longer has, and one without a pool label.
        objs.servers.push(obj("etcd-old-9", json!({LABEL_CLUSTER: "etcd", LABEL_POOL: "old"}), "Running", vec![]));
        objs.servers.push(obj("etcd-stray", json!({LABEL_CLUSTER: "etcd"}), "Running", vec![]));
        // A Cluster TaskServ aimed at a server outside the Cluster (solo): listed on its own.
        let mut side = obj("etcd-side", json!({LABEL_CLUSTER: "etcd"}), "Pending", vec![]);
        side["spec"]["servers"] = json!({"names": ["solo"]});
        objs.taskservs.push(side);
        let rows = build(&Root::Cluster("etcd".into()), &objs)?;
        let shape: Vec<(usize, &str)> = rows.iter().map(|r| (r.depth, r.object.as_str())).collect();
        assert_eq!(
            shape,
            vec![
                (0, "Cluster/etcd"),
                (1, "Pool/members"),
                (2, "Server/etcd-members-1"),
                (3, "TaskServ/etcd-etcd"),
                (2, "Server/etcd-members-2"),
                (3, "TaskServ/etcd-etcd"),
                (1, "Pool/old"),
                (2, "Server/etcd-old-9"),
                (1, "Pool/-"),
                (2, "Server/etcd-stray"),
                (1, "TaskServ/etcd-side"),
            ]
        );
        assert_eq!((rows[6].status.as_str(), rows[6].ready.as_str()), ("0/1 ready", "False"));
        // The TaskServ root: one row per target server, a missing one said so.
        let mut ts = objs.taskservs[0].clone();
        ts["status"]["servers"] = json!([{"name": "etcd-members-1", "phase": "Installed"}, {"name": "ghost", "phase": "Pending"}]);
        objs.taskservs[0] = ts;
        let rows = build(&Root::TaskServ("etcd-etcd".into()), &objs)?;
        let got: Vec<(&str, &str)> = rows.iter().map(|r| (r.object.as_str(), r.status.as_str())).collect();
        assert_eq!(
            got,
            vec![
                ("TaskServ/etcd-etcd", "Installing"),
                ("Server/etcd-members-1", "Running (service: Installed)"),
                ("Server/ghost", "Missing")
            ]
        );
        Ok(())
    }

    #[test]
    fn table_draws_branches_and_json_nests() -> anyhow::Result<()> {
        let rows = build(&Root::Cluster("etcd".into()), &sample())?;
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-24T00:05:00Z")?.with_timezone(&chrono::Utc);
        let table = render_table(&rows, true, now);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[0].contains("READY") && lines[0].ends_with("STEPS"), "{table}");
        assert!(lines[1].starts_with("Cluster/etcd ") && lines[1].contains(" 5m ") && lines[1].contains("1/3 servers ready"), "{table}");
        assert!(lines[2].starts_with("└─Pool/members"), "{table}");
        assert!(lines[3].starts_with("  ├─Server/etcd-members-1"), "{table}");
        assert!(lines[4].starts_with("  │ └─TaskServ/etcd-etcd"), "{table}");
        assert!(lines[5].starts_with("  └─Server/etcd-members-2"), "{table}");
        let v = render_json(&rows);
        assert_eq!(v["kind"], "Cluster");
        assert_eq!(v["children"][0]["children"][1]["children"][0]["status"], "Failed");
        Ok(())
    }

    #[test]
    fn unknown_inputs_get_clear_errors() {
        let e = |r: anyhow::Result<Root>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e(Root::parse("demo")).contains("KIND/NAME"));
        assert!(e(Root::parse("pod/x")).contains("unknown kind \"pod\""));
        assert!(e(Root::parse("server/")).contains("name is empty"));
        assert_eq!(Root::parse("srv/web-1").ok(), Some(Root::Server("web-1".into())));
        assert_eq!(Root::parse("TaskServs.provisioning.dev/redis").ok(), Some(Root::TaskServ("redis".into())));
        let missing = build(&Root::Server("nope".into()), &sample()).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(missing, "Server \"nope\" not found");
        assert!(Format::parse("yaml").is_err());
    }

    #[test]
    fn ages_read_like_kubectl() -> anyhow::Result<()> {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-24T12:00:00Z")?.with_timezone(&chrono::Utc);
        assert_eq!(age("2026-11-24T11:59:15Z", now), "45s");
        assert_eq!(age("2026-11-24T11:48:00Z", now), "12m");
        assert_eq!(age("2026-11-24T09:00:00Z", now), "3h");
        assert_eq!(age("2026-11-19T12:00:00Z", now), "5d");
        assert_eq!(age("garbage", now), "-");
        Ok(())
    }
}
