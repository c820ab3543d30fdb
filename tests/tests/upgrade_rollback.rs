//! Upgrade and rollback of the controller (issue 30): the previous release — built by
//! `scripts/build-previous.sh`, named by `PROVISIONING_PREVIOUS_BIN` — runs a Workspace with a
//! Cluster (two members with redis) and a standalone Server with its own redis TaskServ on the
//! local Docker provider until everything is Ready. Then this release's `provisioning dev` takes
//! over the same data dir (it applies its CRDs at start: the upgrade), a no-op `kubectl apply`
//! of the same manifest follows, then the previous release takes the data dir back (the
//! rollback: its CRDs are applied again), and this release deletes everything at the end.
//!
//! After each start the API server serves exactly that release's CRDs (so they really move
//! both ways). At each hand-over the test first waits for proof that the controller that took
//! over has visited every object (a provider call attributed to the Workspace and to each
//! Server and a health check of each TaskServ on each of its servers in the audit log, a
//! reconcile of the Workspace and of the Cluster in /metrics, nothing in flight), so it cannot
//! pass by looking too early. Then it asserts that nothing was re-created, re-installed or lost:
//! - every object (Workspace, Cluster, Servers, TaskServs, ChangeRecords, Secrets) keeps its
//!   uid, generation and creation time; none appears, none goes; Secret data is the same;
//! - status is unchanged but for condition messages and [`RECORDED_BY_THIS_RELEASE`]: every
//!   condition keeps its status, reason and lastTransitionTime (Ready never flapped), the
//!   TaskServs' install records (installInputs, servers' lastRun) and the Servers' providerID
//!   and addresses are the same;
//! - the same Docker containers (ids, created and started times, no restart) and networks,
//!   and no container event but `exec_*` since the hand-over (`docker events`);
//! - the audit log gained no provider call that creates, changes or deletes anything and no
//!   script run but `check`;
//! - each redis server is the same process (`INFO server` run_id) and still has the key
//!   written under the previous release.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker, docker_ok};
use serde_json::Value;

const NS: &str = "upgrade-rb";
const CLUSTER: &str = "upg";
const WORKSPACE: &str = "upgrade-rb";
const MANIFEST: &str = "tests/tests/upgrade_rollback.yaml";
/// Servers and TaskServs the manifest makes (the Cluster's are `<cluster>-<pool>-<i>` and one
/// TaskServ per catalog service).
const SERVERS: usize = 3;
const TASKSERVS: usize = 2;
/// A key written into every redis under the previous release; it must still be there.
const MARKER_KEY: &str = "upgrade-rollback-marker";

/// Provider operations that only read (anything else in the audit log after a hand-over is a
/// create, change or delete). `exec` carries a script; what the script does is its own entry
/// (a `scriptRun`, of which only `check` is allowed).
const READ_ONLY_PROVIDER_CALLS: [&str; 5] = ["observe_server", "find_server", "survey", "validate_credentials", "exec"];

/// Status fields this release records on objects the previous release made, the only
/// differences allowed, and only from absent to the value given: `status.disks` of a Server is
/// "the disks the machine was made with", recorded as none for a machine made before disks
/// existed (controller/src/server/status.rs `record_machine_spec`).
const RECORDED_BY_THIS_RELEASE: [(&str, &str, &str); 1] = [("Server/", ".status.disks", "[]")];

/// The previous release's binary and the catalog it reads (its own, copied next to it).
struct Previous {
    bin: PathBuf,
    catalog: String,
    /// Its CRDs (`deploy/crds/crds.yaml` at that commit).
    crds: PathBuf,
}

fn previous() -> Result<Previous> {
    let Some(bin) = std::env::var_os("PROVISIONING_PREVIOUS_BIN").filter(|v| !v.is_empty()).map(PathBuf::from) else {
        bail!(
            "PROVISIONING_PREVIOUS_BIN is unset: run scripts/build-previous.sh and set PROVISIONING_PREVIOUS_BIN to the binary it prints (scripts/test.sh does both)"
        );
    };
    ensure!(bin.is_file(), "PROVISIONING_PREVIOUS_BIN={} does not exist: run scripts/build-previous.sh", bin.display());
    let catalog = bin.parent().unwrap_or(Path::new(".")).join("taskservs/catalog");
    ensure!(
        catalog.is_dir(),
        "{} is missing (the previous release's catalog, copied there by scripts/build-previous.sh): run scripts/build-previous.sh",
        catalog.display()
    );
    let crds = bin.parent().unwrap_or(Path::new(".")).join("crds.yaml");
    ensure!(crds.is_file(), "{} is missing: run scripts/build-previous.sh", crds.display());
    Ok(Previous { bin, catalog: catalog.display().to_string(), crds })
}

/// CRD name → the schema of each version, from CRD YAML documents.
fn crd_schemas_of(yaml: &str) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let crd: Value = serde::Deserialize::deserialize(doc)?;
        out.insert(crd["metadata"]["name"].as_str().unwrap_or("?").to_string(), schemas(&crd));
    }
    Ok(out)
}

/// `value` with every number as a float: YAML's `1.0` and the API server's `1` are one value.
fn numbers_as_floats(value: &Value) -> Value {
    match value {
        Value::Number(n) => n.as_f64().and_then(serde_json::Number::from_f64).map_or(Value::Null, Value::Number),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), numbers_as_floats(v))).collect()),
        other => other.clone(),
    }
}

fn schemas(crd: &Value) -> Value {
    crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().unwrap_or("?").to_string(), numbers_as_floats(&v["schema"])))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The group's CRDs as the API server serves them.
fn served_crd_schemas(dev: &Dev) -> Result<BTreeMap<String, Value>> {
    let list: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "crd", "-o", "json"])?)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|crd| crd["spec"]["group"].as_str() == Some("provisioning.dev"))
        .map(|crd| (crd["metadata"]["name"].as_str().unwrap_or("?").to_string(), schemas(crd)))
        .collect())
}

/// Fails unless the API server serves exactly the CRDs of `release` (`provisioning dev` applies
/// its own at start: this proves the CRDs were upgraded or rolled back with the binary).
fn ensure_crds_of(run: &Running, previous: &Previous) -> Result<()> {
    let expected = match run.release {
        Release::Previous => crd_schemas_of(&std::fs::read_to_string(&previous.crds)?)?,
        Release::Current => crd_schemas_of(&provisioning_e2e::provisioning_ok(&["crds"])?)?,
    };
    let served = served_crd_schemas(&run.dev)?;
    let differing: Vec<&String> = expected.keys().filter(|name| served.get(*name) != expected.get(*name)).collect();
    ensure!(differing.is_empty() && served.len() == expected.len(), "{:?}: served CRDs differ from its own: {differing:?}", run.release);
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Previous,
    Current,
}

/// A running `provisioning dev` of one release, with its controller's /metrics port.
struct Running {
    dev: Dev,
    metrics_port: u16,
    release: Release,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts `provisioning dev` of `release` on `data_dir`, serving its controller's /metrics.
fn start(release: Release, previous: &Previous, data_dir: &Path, apply: &[&str]) -> Result<Running> {
    std::fs::create_dir_all(data_dir)?;
    let metrics_port = free_port()?;
    let config = data_dir.join("controller.toml");
    std::fs::write(&config, format!("metrics_addr = \"127.0.0.1:{metrics_port}\"\n"))?;
    let config = config.display().to_string();
    let args = ["--config", config.as_str(), "--no-console"];
    let dev = match release {
        Release::Previous => {
            Dev::start_binary_in(&previous.bin, data_dir, apply, &[("PROVISIONING_CATALOG", previous.catalog.as_str())], &args)?
        }
        Release::Current => Dev::start_in_with(data_dir, apply, &[], &args)?,
    };
    Ok(Running { dev, metrics_port, release })
}

/// The controller's metrics: `name{labels}` → value.
fn metrics(port: u16) -> Result<BTreeMap<String, f64>> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).with_context(|| format!("connecting to /metrics on {port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    // HTTP/1.0: the answer is delimited by the connection's end, never chunked.
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    stream.take(16 << 20).read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).context("no HTTP body from /metrics")?;
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, value)) = line.rsplit_once(' ')
            && let Ok(value) = value.parse::<f64>()
        {
            out.insert(name.to_string(), value);
        }
    }
    Ok(out)
}

fn metric(all: &BTreeMap<String, f64>, name: &str, kind: &str) -> f64 {
    all.get(&format!("provisioning_{name}{{kind=\"{kind}\"}}")).copied().unwrap_or(0.0)
}

/// Waits until no reconcile is in flight and no provider operation waits for a permit.
fn wait_quiet(run: &mut Running) -> Result<()> {
    let port = run.metrics_port;
    run.dev.wait_until(Duration::from_secs(60), "no reconcile in flight", |_| {
        // Not serving yet (a controller just started) is not quiet.
        let Ok(m) = metrics(port) else { return Ok(false) };
        let busy: f64 = m.iter().filter(|(k, _)| k.starts_with("provisioning_reconciles_in_flight")).map(|(_, v)| v).sum();
        Ok(busy == 0.0 && m.get("provisioning_provider_queue_depth").copied().unwrap_or(0.0) == 0.0)
    })
}

// ---- the audit log -------------------------------------------------------------------------

fn audit_path(data_dir: &Path) -> PathBuf {
    data_dir.join("providers/audit/audit.jsonl")
}

fn audit_entries(data_dir: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(audit_path(data_dir)).unwrap_or_default();
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// `ScriptRun install` / `ProviderCall ensure_server` and the object it was for.
fn describe(entry: &Value) -> String {
    let what = entry["script"].as_str().or(entry["operation"].as_str()).unwrap_or("?");
    let object = &entry["object"];
    format!(
        "{} {what} {}/{} ({}, {})",
        entry["type"].as_str().unwrap_or("?"),
        object["kind"].as_str().unwrap_or("-"),
        object["name"].as_str().unwrap_or("-"),
        entry["server"].as_str().unwrap_or(""),
        entry["outcome"].as_str().unwrap_or("?")
    )
}

/// Entries that changed something: a provider call that is not a read, a script run that is
/// not a health check.
fn changing(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| match e["type"].as_str() {
            Some("providerCall") => !READ_ONLY_PROVIDER_CALLS.contains(&e["operation"].as_str().unwrap_or("")),
            Some("scriptRun") => e["script"].as_str() != Some("check"),
            _ => true,
        })
        .map(describe)
        .collect()
}

// ---- the snapshot --------------------------------------------------------------------------

/// What must survive a hand-over unchanged.
#[derive(Debug, PartialEq)]
struct Snapshot {
    /// `Kind/name` → identity and status.
    objects: BTreeMap<String, Value>,
    /// Container name → id, created, started, restarts, running.
    containers: BTreeMap<String, Value>,
    /// Network and volume ids carrying the namespace label.
    networks: BTreeSet<String>,
    volumes: BTreeSet<String>,
    /// Server name → the redis server's run_id (changes whenever redis restarts) and whether the
    /// marker key is there.
    redis: BTreeMap<String, (String, bool)>,
}

/// Status without what is only for humans (condition messages), conditions in type order.
fn normalized_status(status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions.iter_mut() {
            if let Some(c) = c.as_object_mut() {
                c.remove("message");
            }
        }
        conditions.sort_by_key(|c| c["type"].as_str().unwrap_or("").to_string());
    }
    status
}

fn digest(value: &Value) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut h);
    format!("{:016x}", h.finish())
}

fn objects(dev: &Dev) -> Result<BTreeMap<String, Value>> {
    let mut items: Vec<Value> = Vec::new();
    let ws = dev.kubectl_ok(&["get", "workspaces.v1alpha1.provisioning.dev", WORKSPACE, "-o", "json"])?;
    items.push(serde_json::from_str(&ws)?);
    let list = dev.kubectl_ok(&[
        "get",
        "clusters.v1alpha1.provisioning.dev,servers.v1alpha1.provisioning.dev,taskservs.v1alpha1.provisioning.dev,changerecords.v1alpha1.provisioning.dev,secrets",
        "-n",
        NS,
        "-o",
        "json",
    ])?;
    let list: Value = serde_json::from_str(&list)?;
    items.extend(list["items"].as_array().cloned().unwrap_or_default());
    let mut out = BTreeMap::new();
    for item in items {
        let kind = item["kind"].as_str().unwrap_or("?").to_string();
        let meta = &item["metadata"];
        let name = meta["name"].as_str().unwrap_or("?").to_string();
        let mut state = serde_json::json!({
            "uid": meta["uid"],
            "generation": meta["generation"],
            "creationTimestamp": meta["creationTimestamp"],
            "ownerUids": meta["ownerReferences"].as_array().map(|o| o.iter().map(|r| r["uid"].clone()).collect::<Vec<_>>()),
            "status": normalized_status(&item["status"]),
        });
        if kind == "Secret" {
            // Never the values: a digest shows whether they changed.
            state["dataDigest"] = Value::String(digest(&item["data"]));
        }
        out.insert(format!("{kind}/{name}"), state);
    }
    Ok(out)
}

fn namespace_filter() -> String {
    format!("label=provisioning.dev/namespace={NS}")
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

fn containers() -> Result<BTreeMap<String, Value>> {
    let ids = lines(&docker_ok(&["ps", "-aq", "--filter", &namespace_filter()])?);
    let mut out = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let mut args = vec!["inspect"];
    args.extend(ids.iter().map(String::as_str));
    let inspected: Value = serde_json::from_str(&docker_ok(&args)?)?;
    for c in inspected.as_array().into_iter().flatten() {
        let server = c["Config"]["Labels"]["provisioning.dev/server"].as_str().unwrap_or("?").to_string();
        let state = serde_json::json!({
            "id": c["Id"],
            "created": c["Created"],
            "startedAt": c["State"]["StartedAt"],
            "running": c["State"]["Running"],
            "restarts": c["RestartCount"],
        });
        ensure!(out.insert(server.clone(), state).is_none(), "two containers for Server {server}");
    }
    Ok(out)
}

/// The redis password a TaskServ generated (its owned Secret, `status.generatedSecretRef`).
fn redis_password(dev: &Dev, taskserv: &str) -> Result<String> {
    let secret = dev.kubectl_ok(&["get", "ts", taskserv, "-n", NS, "-o", "jsonpath={.status.generatedSecretRef.name}"])?;
    ensure!(!secret.is_empty(), "TaskServ {taskserv} names no generated Secret");
    let encoded = dev.kubectl_ok(&["get", "secret", &secret, "-n", NS, "-o", "jsonpath={.data.password}"])?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).context("the generated password is not base64")?;
    Ok(String::from_utf8(bytes)?)
}

/// TaskServ name → the servers it is installed on (from status).
fn taskserv_servers(dev: &Dev) -> Result<BTreeMap<String, Vec<String>>> {
    let text = dev.kubectl_ok(&["get", "ts", "-n", NS, "-o", "json"])?;
    let list: Value = serde_json::from_str(&text)?;
    let mut out = BTreeMap::new();
    for ts in list["items"].as_array().into_iter().flatten() {
        let name = ts["metadata"]["name"].as_str().unwrap_or("?").to_string();
        let servers =
            ts["status"]["servers"].as_array().into_iter().flatten().filter_map(|s| s["name"].as_str().map(str::to_string)).collect();
        out.insert(name, servers);
    }
    Ok(out)
}

fn redis_cli(container: &str, password: &str, args: &[&str]) -> Result<String> {
    let auth = format!("REDISCLI_AUTH={password}");
    let mut argv = vec!["exec", "-e", auth.as_str(), container, "redis-cli"];
    argv.extend_from_slice(args);
    let out = docker(&argv)?;
    // Not docker_ok: its error would carry the argv, and with it the password.
    ensure!(out.status.success(), "redis-cli {args:?} in {container} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Server → (redis run_id, marker key present); `write_marker` sets the key first.
fn redis_state(dev: &Dev, containers: &BTreeMap<String, Value>, write_marker: bool) -> Result<BTreeMap<String, (String, bool)>> {
    let mut out = BTreeMap::new();
    for (taskserv, servers) in taskserv_servers(dev)? {
        let password = redis_password(dev, &taskserv)?;
        for server in servers {
            let id = containers.get(&server).and_then(|c| c["id"].as_str()).with_context(|| format!("no container for Server {server}"))?;
            if write_marker {
                redis_cli(id, &password, &["SET", MARKER_KEY, "kept"])?;
            }
            let info = redis_cli(id, &password, &["INFO", "server"])?;
            let run_id = info.lines().find_map(|l| l.strip_prefix("run_id:")).map(str::trim).unwrap_or_default().to_string();
            ensure!(!run_id.is_empty(), "no run_id in redis INFO on {server}");
            let marker = redis_cli(id, &password, &["GET", MARKER_KEY])?.trim() == "kept";
            out.insert(server, (run_id, marker));
        }
    }
    Ok(out)
}

fn snapshot(dev: &Dev, write_marker: bool) -> Result<Snapshot> {
    let containers = containers()?;
    let redis = redis_state(dev, &containers, write_marker)?;
    Ok(Snapshot {
        objects: objects(dev)?,
        networks: lines(&docker_ok(&["network", "ls", "-q", "--filter", &namespace_filter()])?).into_iter().collect(),
        volumes: lines(&docker_ok(&["volume", "ls", "-q", "--filter", &namespace_filter()])?).into_iter().collect(),
        containers,
        redis,
    })
}

/// Every difference between two snapshots, one line each, fields named.
fn differences(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    let keys: BTreeSet<&String> = before.objects.keys().chain(after.objects.keys()).collect();
    for key in keys {
        match (before.objects.get(key), after.objects.get(key)) {
            (Some(_), None) => out.push(format!("{key}: lost")),
            (None, Some(_)) => out.push(format!("{key}: new")),
            (Some(b), Some(a)) => diff_values(key, b, a, &mut out),
            (None, None) => {}
        }
    }
    for (server, b) in &before.containers {
        match after.containers.get(server) {
            None => out.push(format!("container of {server}: gone")),
            Some(a) if a != b => out.push(format!("container of {server}: {b} -> {a}")),
            Some(_) => {}
        }
    }
    for server in after.containers.keys().filter(|s| !before.containers.contains_key(*s)) {
        out.push(format!("container of {server}: new"));
    }
    if before.networks != after.networks {
        out.push(format!("networks {:?} -> {:?}", before.networks, after.networks));
    }
    if before.volumes != after.volumes {
        out.push(format!("volumes {:?} -> {:?}", before.volumes, after.volumes));
    }
    for (server, (run_id, _)) in &before.redis {
        match after.redis.get(server) {
            None => out.push(format!("redis on {server}: gone")),
            Some((id, _)) if id != run_id => out.push(format!("redis on {server}: restarted (run_id {run_id} -> {id})")),
            Some((_, false)) => out.push(format!("redis on {server}: the key written before is lost")),
            Some(_) => {}
        }
    }
    out
}

/// Whether `value` is the JSON `text`.
fn recorded_as(value: &Value, text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|expected| &expected == value)
}

/// A value for a difference line: long text (an output tail) cut to its first 120 characters.
fn shortened(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(120) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

fn diff_values(path: &str, before: &Value, after: &Value, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for k in keys {
                let sub = format!("{path}.{k}");
                diff_values(&sub, b.get(k).unwrap_or(&Value::Null), a.get(k).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (i, (b, a)) in b.iter().zip(a).enumerate() {
                let label = b["type"].as_str().or(b["name"].as_str()).map_or(i.to_string(), str::to_string);
                diff_values(&format!("{path}[{label}]"), b, a, out);
            }
        }
        (Value::Null, a)
            if RECORDED_BY_THIS_RELEASE
                .iter()
                .any(|(kind, field, value)| path.starts_with(kind) && path.ends_with(field) && recorded_as(a, value)) => {}
        (b, a) if b != a => out.push(format!("{path}: {} -> {}", shortened(b), shortened(a))),
        _ => {}
    }
}

// ---- the hand-over -------------------------------------------------------------------------

/// Waits until the controller that took over has visited every object: a provider call for
/// the Workspace (its account check) and each Server (an observation) and a health check of
/// each TaskServ on each of its servers, all in the audit log after `since` (its line count at
/// the hand-over), and a reconcile of the Workspace and of the Cluster in /metrics; then until
/// nothing is in flight.
fn wait_visited(run: &mut Running, since: usize, expected: &BTreeMap<String, Vec<String>>, servers: &BTreeSet<String>) -> Result<()> {
    let data_dir = run.dev.data_dir.clone();
    let port = run.metrics_port;
    let mut missing = Vec::new();
    let result = run.dev.wait_until(Duration::from_secs(180), "the controller's visit of every object", |_| {
        let entries = audit_entries(&data_dir)?;
        let new = entries.get(since..).unwrap_or_default();
        let seen = |kind: &str, name: &str, check_on: Option<&str>| {
            new.iter().any(|e| {
                e["object"]["kind"].as_str() == Some(kind)
                    && e["object"]["name"].as_str() == Some(name)
                    && check_on.is_none_or(|s| e["script"].as_str() == Some("check") && e["server"].as_str() == Some(s))
            })
        };
        missing.clear();
        if !seen("Workspace", WORKSPACE, None) {
            missing.push(format!("Workspace {WORKSPACE}"));
        }
        for server in servers {
            if !seen("Server", server, None) {
                missing.push(format!("Server {server}"));
            }
        }
        for (taskserv, on) in expected {
            for server in on {
                if !seen("TaskServ", taskserv, Some(server)) {
                    missing.push(format!("TaskServ {taskserv} check on {server}"));
                }
            }
        }
        let m = metrics(port).unwrap_or_default();
        for kind in ["Workspace", "Cluster"] {
            if metric(&m, "reconciles_total", kind) < 1.0 {
                missing.push(format!("a reconcile of the {kind}"));
            }
        }
        Ok(missing.is_empty())
    });
    result.with_context(|| format!("not visited: {missing:?}"))?;
    wait_quiet(run)
}

/// A Ready condition of every object, as kubectl wait sees it.
fn wait_ready(dev: &Dev) -> Result<()> {
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("workspace/{WORKSPACE}"), "--timeout=120s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("cluster/{CLUSTER}"), "-n", NS, "--timeout=600s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "srv,ts", "--all", "-n", NS, "--timeout=300s"])?;
    Ok(())
}

/// Hands the data dir over from `from` to a `to` release and checks that nothing changed.
fn hand_over(from: Running, to: Release, previous: &Previous, baseline: &Snapshot, what: &str) -> Result<Running> {
    let mut from = from;
    // The last state the old controller wrote, then a clean stop.
    wait_quiet(&mut from)?;
    let since = audit_entries(&from.dev.data_dir)?.len();
    let at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let expected = taskserv_servers(&from.dev)?;
    let servers: BTreeSet<String> = baseline.objects.keys().filter_map(|k| k.strip_prefix("Server/")).map(str::to_string).collect();
    let data_dir = from.dev.data_dir.clone();
    from.dev.interrupt(Duration::from_secs(30)).with_context(|| format!("stopping {:?}", from.release))?;
    let stopped_with = audit_entries(&data_dir)?.len();
    let started = std::time::Instant::now();
    let mut to = start(to, previous, &data_dir, &[])?;
    wait_visited(&mut to, stopped_with, &expected, &servers).with_context(|| format!("{what}: waiting for the visit"))?;
    let visited = started.elapsed();
    ensure_crds_of(&to, previous).with_context(|| what.to_string())?;
    check_unchanged(&to, since, at, baseline, what)?;
    let mut done: BTreeMap<String, usize> = BTreeMap::new();
    for entry in audit_entries(&data_dir)?.get(since..).unwrap_or_default() {
        let operation = entry["script"].as_str().or(entry["operation"].as_str()).unwrap_or("?").to_string();
        *done.entry(operation).or_default() += 1;
    }
    println!(
        "{what} ({:?} -> {:?}): every object visited {visited:.1?} after the start; audit log since the stop: {done:?}",
        from.release, to.release
    );
    Ok(to)
}

/// Nothing re-created, re-installed or lost since `baseline`: the audit log after entry
/// `since`, Docker's events after `at` (unix seconds), and a fresh snapshot against it.
fn check_unchanged(run: &Running, since: usize, at: u64, baseline: &Snapshot, what: &str) -> Result<()> {
    let entries = audit_entries(&run.dev.data_dir)?;
    let changed = changing(entries.get(since..).unwrap_or_default());
    ensure!(changed.is_empty(), "{what}: the audit log records changes: {changed:#?}");
    let until = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 1;
    let events = docker_ok(&[
        "events",
        "--since",
        &at.to_string(),
        "--until",
        &until.to_string(),
        "--filter",
        "type=container",
        "--filter",
        &namespace_filter(),
        "--format",
        "{{.Action}} {{.Actor.Attributes.name}}",
    ])?;
    let container_events: Vec<&str> = events.lines().filter(|l| !l.starts_with("exec_")).collect();
    ensure!(container_events.is_empty(), "{what}: Docker container events since the hand-over: {container_events:#?}");
    let now = snapshot(&run.dev, false)?;
    let diff = differences(baseline, &now);
    ensure!(diff.is_empty(), "{what}: changed since the previous release made it:\n  {}", diff.join("\n  "));
    Ok(())
}

/// Removes whatever the test left in Docker (a failed run's containers, networks, volumes).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = namespace_filter();
        for id in lines(&docker_ok(&["ps", "-aq", "--filter", &filter]).unwrap_or_default()) {
            let _ = docker(&["rm", "-f", "-v", &id]);
        }
        for id in lines(&docker_ok(&["network", "ls", "-q", "--filter", &filter]).unwrap_or_default()) {
            let _ = docker(&["network", "rm", &id]);
        }
        for id in lines(&docker_ok(&["volume", "ls", "-q", "--filter", &filter]).unwrap_or_default()) {
            let _ = docker(&["volume", "rm", &id]);
        }
    }
}

#[test]
fn upgrade_and_rollback_recreate_reinstall_and_lose_nothing() -> Result<()> {
    let previous = previous()?;
    provisioning_e2e::docker::require_node_image()?;
    let leftovers = lines(&docker_ok(&["ps", "-aq", "--filter", &namespace_filter()])?);
    ensure!(leftovers.is_empty(), "containers of an earlier run in {NS}: {leftovers:?}");
    let _cleanup = Cleanup;
    let tmp = tempfile::tempdir()?;
    let data_dir = tmp.path().join("data");
    let started = std::time::Instant::now();

    // The previous release makes everything.
    let previous_crds = crd_schemas_of(&std::fs::read_to_string(&previous.crds)?)?;
    let current_crds = crd_schemas_of(&provisioning_e2e::provisioning_ok(&["crds"])?)?;
    ensure!(previous_crds != current_crds, "the two releases' CRDs are the same: the test would not upgrade or roll back any");
    let mut old = start(Release::Previous, &previous, &data_dir, &[MANIFEST])?;
    ensure_crds_of(&old, &previous)?;
    wait_ready(&old.dev)?;
    wait_quiet(&mut old)?;
    let ready_after = started.elapsed();
    let baseline = snapshot(&old.dev, true)?;
    let count = |prefix: &str| baseline.objects.keys().filter(|k| k.starts_with(prefix)).count();
    ensure!(count("Server/") == SERVERS && count("TaskServ/") == TASKSERVS, "unexpected objects: {:?}", baseline.objects.keys());
    ensure!(baseline.containers.len() == SERVERS, "one container per Server: {:?}", baseline.containers);
    ensure!(baseline.redis.len() == SERVERS && baseline.redis.values().all(|(_, marker)| *marker), "redis: {:?}", baseline.redis);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for key in baseline.objects.keys() {
        *kinds.entry(key.split('/').next().unwrap_or("?")).or_default() += 1;
    }
    println!("made by the previous release: {kinds:?}, {} containers, {} networks", baseline.containers.len(), baseline.networks.len());
    let installs = audit_entries(&data_dir)?.iter().filter(|e| e["script"].as_str() == Some("install")).count();
    ensure!(installs >= SERVERS, "the previous release's installs are in the audit log ({installs})");

    // Upgrade: this release on the same data dir (it applies its CRDs at start).
    let mut current = hand_over(old, Release::Current, &previous, &baseline, "upgrade")?;
    let upgraded_after = started.elapsed();
    let crd_versions = current.dev.kubectl_ok(&["get", "crd", "servers.provisioning.dev", "-o", "jsonpath={.status.storedVersions}"])?;
    ensure!(crd_versions.contains("v1alpha1"), "storedVersions {crd_versions}");

    // A no-op apply of the same manifest (metadata only: kubectl's last-applied annotation):
    // every object it names is modified, the controller visits each again, nothing is done.
    let since = audit_entries(&data_dir)?.len();
    let at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let before = metrics(current.metrics_port)?;
    let applied = current.dev.kubectl_ok(&["apply", "-f", &provisioning_e2e::workspace_root().join(MANIFEST).display().to_string()])?;
    ensure!(applied.lines().all(|l| !l.contains(" created")), "the apply created something: {applied}");
    println!("no-op apply: {}", applied.lines().collect::<Vec<_>>().join("; "));
    let port = current.metrics_port;
    current.dev.wait_until(Duration::from_secs(60), "a reconcile of each applied object", |_| {
        let Ok(now) = metrics(port) else { return Ok(false) };
        Ok([("Workspace", 1.0), ("Cluster", 1.0), ("Server", 1.0), ("TaskServ", 1.0)]
            .iter()
            .all(|(kind, n)| metric(&now, "reconciles_total", kind) >= metric(&before, "reconciles_total", kind) + n))
    })?;
    wait_quiet(&mut current)?;
    check_unchanged(&current, since, at, &baseline, "no-op apply after the upgrade")?;

    // Rollback: the previous release again (it applies its own CRDs again).
    let old = hand_over(current, Release::Previous, &previous, &baseline, "rollback")?;
    let rolled_back_after = started.elapsed();

    // This release deletes everything; nothing is left in Docker.
    let mut current = hand_over(old, Release::Current, &previous, &baseline, "second upgrade")?;
    current.dev.kubectl_ok(&["delete", "cluster", CLUSTER, "-n", NS, "--timeout=300s"])?;
    current.dev.kubectl_ok(&["delete", "ts,srv", "--all", "-n", NS, "--timeout=300s"])?;
    current.dev.kubectl_ok(&["delete", "workspace", WORKSPACE, "--timeout=120s"])?;
    current.dev.wait_until(Duration::from_secs(120), "nothing left in Docker", |_| {
        let filter = namespace_filter();
        Ok(lines(&docker_ok(&["ps", "-aq", "--filter", &filter])?).is_empty()
            && lines(&docker_ok(&["network", "ls", "-q", "--filter", &filter])?).is_empty()
            && lines(&docker_ok(&["volume", "ls", "-q", "--filter", &filter])?).is_empty())
    })?;
    current.dev.interrupt(Duration::from_secs(30))?;
    println!(
        "previous release Ready after {ready_after:.1?}; upgraded and checked after {upgraded_after:.1?}; rolled back and checked after {rolled_back_after:.1?}; done after {:.1?}",
        started.elapsed()
    );
    Ok(())
}
