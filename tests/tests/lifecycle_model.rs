//! A model-based lifecycle test (issue 25, item 8) on the simulated provider: a seeded
//! generator of user and operator actions — apply, edits of each Server spec field, no-op
//! edits, scale, pause and resume, approval switches and approvals, deletion in each order
//! users produce, kill -9 of `provisioning dev` — or of the controller alone — at random
//! moments and restarts — checked
//! after every step against oracles the controller does not compute for itself: the
//! simulated account's journal of machines (exactly one machine per Server, no machine without
//! a Server, the Cluster's members as many as its replicas) and the audit log's script runs
//! and provider changes (none for a no-op edit or a restart of a settled system). Every object
//! must settle (Ready, Paused, awaiting an approval, or Stalled naming its reason) and every
//! deletion must finish, each within a deadline.
//!
//! Odd seeds run `provisioning dev` (API server and controller in one process: a kill takes
//! both); even seeds run the same control plane as two processes, `provisioning apiserver` and
//! `provisioning controller`, and kill the controller alone (mid-step and settled) while the
//! API server keeps serving — as a controller Pod's crash looks on a real cluster — besides
//! killing both. Manifests are applied as a `kind: List` or as documents, in turn.
//!
//! CI runs a fixed set of seeds ([`CI_SEEDS`], [`CI_STEPS`] steps each). Environment:
//! `PROVISIONING_LIFECYCLE_SEED=N` replays one seed; `PROVISIONING_LIFECYCLE_SEEDS=N` (seeds
//! 1..=N) or `=A..B` (seeds A..=B) and `PROVISIONING_LIFECYCLE_STEPS=M` run a soak. A failure
//! prints the seed, the actions so far and the oracle that broke.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioning_e2e::Dev;
use serde_json::{Value, json};

/// Seeds CI runs; each is a fresh `provisioning dev` and namespace.
const CI_SEEDS: [u64; 3] = [1, 2, 3];
/// Steps per seed in CI.
const CI_STEPS: usize = 12;
/// Seeds run at once (each its own `provisioning dev`); `PROVISIONING_LIFECYCLE_JOBS` overrides.
const CI_JOBS: usize = 3;
/// How long one step may take to settle.
const SETTLE: Duration = Duration::from_secs(90);
/// Standalone Server names the model draws from.
const SERVER_NAMES: [&str; 3] = ["s0", "s1", "s2"];
/// The Cluster's name, its pool's and its service's.
const CLUSTER: &str = "db";
const POOL: &str = "m";
const SERVICE: &str = "etcd";
const PAUSED: &str = "provisioning.dev/paused";

/// splitmix64: a small deterministic generator, so a seed replays the same actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True with `percent`% probability.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// A standalone Server as the user declared it.
#[derive(Clone, Debug, PartialEq)]
struct ServerModel {
    plan: &'static str,
    zone: &'static str,
    image: &'static str,
    update_policy: Option<&'static str>,
    approval: Option<&'static str>,
    paused: bool,
}

/// The Cluster as the user declared it.
#[derive(Clone, Debug, PartialEq)]
struct ClusterModel {
    replicas: u64,
    approval: Option<&'static str>,
    paused: bool,
}

/// What exists, as the user declared it.
#[derive(Clone, Debug, Default)]
struct Model {
    workspace: bool,
    servers: BTreeMap<&'static str, ServerModel>,
    cluster: Option<ClusterModel>,
}

/// What a step's oracles expect beyond the invariants.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Anything may run.
    Changes,
    /// No script runs and no provider changes (a no-op edit, a restart of a settled system).
    Nothing,
}

/// One seed's run: its control plane, namespace, model and the actions so far.
struct Run {
    ns: String,
    dev: Dev,
    /// The control plane is `provisioning apiserver` + `provisioning controller` (even seeds),
    /// not `provisioning dev`.
    split: bool,
    data_dir: PathBuf,
    _tmp: tempfile::TempDir,
    model: Model,
    trace: Vec<String>,
    files: usize,
}

fn workspace_json(ns: &str) -> Value {
    json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": ns},
        "spec": {"defaults": {"provider": "sim"}, "providers": [{"name": "sim", "type": "simulated"}]}})
}

fn server_json(ns: &str, name: &str, s: &ServerModel) -> Value {
    let mut spec = json!({"provider": "sim", "plan": s.plan});
    for (key, value) in [("zone", Some(s.zone)), ("image", Some(s.image)), ("updatePolicy", s.update_policy), ("approval", s.approval)] {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            spec[key] = json!(v);
        }
    }
    let mut obj =
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": name, "namespace": ns}, "spec": spec});
    if s.paused {
        obj["metadata"]["annotations"] = json!({PAUSED: "true"});
    }
    obj
}

fn cluster_json(ns: &str, c: &ClusterModel) -> Value {
    let mut spec = json!({"provider": "sim", "pools": [{"name": POOL, "replicas": c.replicas, "plan": "small"}],
        "taskservs": [{"service": SERVICE, "pools": [POOL]}]});
    if let Some(a) = c.approval {
        spec["approval"] = json!(a);
    }
    let mut obj =
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": CLUSTER, "namespace": ns}, "spec": spec});
    if c.paused {
        obj["metadata"]["annotations"] = json!({PAUSED: "true"});
    }
    obj
}

fn random_server(rng: &mut Rng) -> ServerModel {
    ServerModel {
        plan: rng.pick(&["small", "medium"]),
        zone: rng.pick(&["", "zone-a", "zone-b"]),
        image: rng.pick(&["", "debian-12", "debian-13"]),
        update_policy: rng.pick(&[None, None, Some("Replace"), Some("InPlace"), Some("Never")]),
        approval: rng.pick(&[None, None, None, Some("Automatic"), Some("Manual")]),
        paused: false,
    }
}

impl Run {
    fn start(seed: u64) -> Result<Run> {
        let tmp = tempfile::tempdir()?;
        let data_dir = tmp.path().join("data");
        let split = seed.is_multiple_of(2);
        let dev = if split { Dev::start_split_in(&data_dir)? } else { Dev::start_in(&data_dir, &[])? };
        let trace = vec![
            if split { "control plane: provisioning apiserver + provisioning controller" } else { "control plane: provisioning dev" }
                .into(),
        ];
        Ok(Run { ns: format!("lifecycle-{seed}"), dev, split, data_dir, _tmp: tmp, model: Model::default(), trace, files: 0 })
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.dev.kubectl_ok(args)
    }

    /// `kubectl apply` of `objects` (applied in order), as a `kind: List` or as documents in turn.
    fn apply(&mut self, objects: Vec<Value>) -> Result<()> {
        self.files += 1;
        let path = self.data_dir.join(format!("step-{}.json", self.files));
        let text = if self.files.is_multiple_of(2) {
            serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": objects}))?
        } else {
            documents(&objects)?
        };
        std::fs::write(&path, text)?;
        self.kubectl(&["apply", "-f", &path.display().to_string()])?;
        Ok(())
    }

    /// Everything the model holds, in folder order (Namespace, Workspace, Servers, Cluster).
    fn manifest(&self) -> Vec<Value> {
        let mut all = vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})];
        if self.model.workspace {
            all.push(workspace_json(&self.ns));
        }
        all.extend(self.model.servers.iter().map(|(name, s)| server_json(&self.ns, name, s)));
        all.extend(self.model.cluster.iter().map(|c| cluster_json(&self.ns, c)));
        all
    }

    /// Kills `provisioning dev` (both processes, when split) with SIGKILL and starts it again
    /// on the same data dir.
    fn restart(&mut self) -> Result<()> {
        self.dev.kill9();
        self.dev = if self.split { Dev::start_split_in(&self.data_dir)? } else { Dev::start_in(&self.data_dir, &[])? };
        Ok(())
    }

    /// Kills the controller's process alone with SIGKILL and starts it again; the API server
    /// keeps serving (split control plane only).
    fn restart_controller(&mut self) -> Result<()> {
        ensure!(self.split, "the controller runs in provisioning dev's process");
        self.dev.kill9_controller();
        self.dev.start_controller()
    }

    fn get_json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&all)?)?)
    }

    /// The Servers, TaskServs and Clusters of the namespace.
    fn objects(&self) -> Result<Vec<Value>> {
        let list = self.get_json(&["get", "srv,ts,pcl", "-n", &self.ns])?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until `check` holds, failing with its last answer after `deadline`.
    fn wait_for(&mut self, deadline: Duration, what: &str, mut check: impl FnMut(&Run) -> Result<Option<String>>) -> Result<()> {
        let start = Instant::now();
        loop {
            let pending = check(self)?;
            let Some(why) = pending else { return Ok(()) };
            if start.elapsed() > deadline {
                bail!("{what}: not reached after {deadline:?}: {why}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// A multi-document manifest of `objects` (JSON documents, which YAML reads as they are),
/// applied in order.
fn documents(objects: &[Value]) -> Result<String> {
    let docs: Vec<String> = objects.iter().map(serde_json::to_string).collect::<Result<_, _>>()?;
    Ok(docs.join("\n---\n"))
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

fn name_of(obj: &Value) -> String {
    format!("{}/{}", obj["kind"].as_str().unwrap_or_default(), obj["metadata"]["name"].as_str().unwrap_or_default())
}

/// Why `obj` has not settled, or None when it has: Paused when paused; otherwise its status
/// describes its generation and it is Ready with nothing planned, awaiting an approval, or
/// Stalled naming its reason. An object being deleted has not settled.
fn unsettled(obj: &Value) -> Option<String> {
    let name = name_of(obj);
    if !obj["metadata"]["deletionTimestamp"].is_null() {
        return Some(format!("{name} is being deleted"));
    }
    if obj["metadata"]["annotations"][PAUSED] == "true" {
        let paused = condition(obj, "Paused").is_some_and(|c| c["status"] == "True");
        return (!paused).then(|| format!("{name} paused but without Paused=True"));
    }
    let generation = obj["metadata"]["generation"].as_i64();
    if generation.is_none() || generation != obj["status"]["observedGeneration"].as_i64() {
        return Some(format!("{name} at generation {generation:?}, status at {}", obj["status"]["observedGeneration"]));
    }
    let ready = condition(obj, "Ready").cloned().unwrap_or_default();
    let stalled = condition(obj, "Stalled").is_some_and(|c| c["status"] == "True" && !c["reason"].as_str().unwrap_or_default().is_empty());
    let reconciling = condition(obj, "Reconciling").is_some_and(|c| c["status"] == "True");
    let summary = obj["status"]["plan"]["summary"].as_str().unwrap_or("no changes");
    if ready["status"] == "True" && !reconciling && summary == "no changes" {
        return None;
    }
    if stalled || ready["reason"] == "AwaitingApproval" {
        return None;
    }
    Some(format!(
        "{name} Ready={} ({}: {}), plan {summary:?}, Reconciling={reconciling}",
        ready["status"], ready["reason"], ready["message"]
    ))
}

/// Seeds, steps per seed and seeds run at once, from the environment (CI's set by default).
fn main_seeds() -> Result<(Vec<u64>, usize, usize)> {
    let parse = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    let number = |var: &str, default: usize| -> Result<usize> {
        match parse(var) {
            Some(v) => v.trim().parse().with_context(|| format!("{var}={v:?} is not a number")),
            None => Ok(default),
        }
    };
    let steps = number("PROVISIONING_LIFECYCLE_STEPS", CI_STEPS)?;
    let jobs = number("PROVISIONING_LIFECYCLE_JOBS", CI_JOBS)?;
    if let Some(v) = parse("PROVISIONING_LIFECYCLE_SEED") {
        let seed = v.trim().parse().with_context(|| format!("PROVISIONING_LIFECYCLE_SEED={v:?} is not a seed (a number)"))?;
        return Ok((vec![seed], steps, 1));
    }
    if let Some(v) = parse("PROVISIONING_LIFECYCLE_SEEDS") {
        let bad = || format!("PROVISIONING_LIFECYCLE_SEEDS={v:?} is neither N (seeds 1..=N) nor A..B (seeds A..=B)");
        let (from, to) = match v.trim().split_once("..") {
            Some((a, b)) => (a.parse().with_context(bad)?, b.parse().with_context(bad)?),
            None => (1, v.trim().parse().with_context(bad)?),
        };
        return Ok(((from..=to).collect(), steps, jobs));
    }
    Ok((CI_SEEDS.to_vec(), steps, jobs))
}

#[test]
fn model_based_lifecycle_on_the_simulated_provider() -> Result<()> {
    let (seeds, steps, jobs) = main_seeds()?;
    let started = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    // Seeds run side by side, each with its own `provisioning dev`, data dir and namespace.
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, seeds.len().max(1)) {
            scope.spawn(|| {
                while let Some(seed) = seeds.get(next.fetch_add(1, std::sync::atomic::Ordering::SeqCst)).copied() {
                    let begun = Instant::now();
                    match run_seed(seed, steps) {
                        Ok(()) => eprintln!("lifecycle seed {seed}: {steps} steps passed in {:.1}s", begun.elapsed().as_secs_f64()),
                        Err(e) => {
                            eprintln!(
                                "lifecycle seed {seed} FAILED (replay: PROVISIONING_LIFECYCLE_SEED={seed} PROVISIONING_LIFECYCLE_STEPS={steps}):\n{e:#}"
                            );
                            failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(seed);
                        }
                    }
                }
            });
        }
    });
    let mut failed = failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    failed.sort_unstable();
    eprintln!(
        "lifecycle: {} seeds x {steps} steps ({jobs} at a time), {} failed {failed:?}, in {:.1}s",
        seeds.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    ensure!(failed.is_empty(), "lifecycle seeds failed: {failed:?} (replay one with PROVISIONING_LIFECYCLE_SEED=N)");
    Ok(())
}

fn run_seed(seed: u64, steps: usize) -> Result<()> {
    let mut rng = Rng(seed);
    let mut run = Run::start(seed)?;
    let outcome = drive(&mut run, &mut rng, steps);
    if outcome.is_ok() && std::env::var_os("PROVISIONING_LIFECYCLE_SEED").is_some() {
        eprintln!("seed {seed} actions:\n  {}", run.trace.join("\n  "));
    }
    outcome.map_err(|e| {
        anyhow::anyhow!(
            "seed {seed}, after {} actions:\n  {}\noracle: {e:#}\n--- dev log tail ---\n{}",
            run.trace.len(),
            run.trace.join("\n  "),
            run.dev.log_tail(30)
        )
    })
}

fn drive(run: &mut Run, rng: &mut Rng, steps: usize) -> Result<()> {
    // The starting point: a Workspace, one Server and the Cluster.
    run.trace.push("apply workspace".into());
    recreate_workspace(run)?;
    let first = random_server(rng);
    run.model.servers.insert(SERVER_NAMES[0], ServerModel { approval: None, paused: false, ..first });
    run.model.cluster = Some(ClusterModel { replicas: 2, approval: None, paused: false });
    run.trace.push(format!("apply {:?} and cluster {:?}", run.model.servers, run.model.cluster));
    run.apply(run.manifest())?;
    check(run, Expect::Changes, &(Vec::new(), Vec::new()))?;
    for _ in 0..steps {
        let before = audited_changes(&run.data_dir)?;
        let expect = step(run, rng)?;
        if rng.chance(15) {
            // kill -9 at a random moment of the step's work (mid-create, mid-delete …): of
            // provisioning dev, or, split, of the controller alone (2 in 3) or of both.
            let after = rng.below(1500) as u64;
            if run.split && rng.chance(67) {
                run.trace.push(format!("  kill -9 of the controller alone after {after} ms, restart it"));
                std::thread::sleep(Duration::from_millis(after));
                run.restart_controller()?;
            } else {
                run.trace.push(format!("  kill -9 of provisioning dev after {after} ms, restart"));
                std::thread::sleep(Duration::from_millis(after));
                run.restart()?;
            }
        }
        check(run, expect, &before)?;
    }
    // Finally everything goes, in folder order, and nothing is left.
    run.trace.push("final: delete -f everything".into());
    delete_all_folder_order(run)?;
    let left = machines_in_ns(run)?;
    ensure!(left.is_empty(), "machines left after everything was deleted: {left:?}");
    Ok(())
}

/// Applies the Namespace and Workspace and waits for the Workspace to be Ready, before
/// anything that resolves its provider through it.
fn recreate_workspace(run: &mut Run) -> Result<()> {
    run.model.workspace = true;
    run.apply(vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": run.ns}}), workspace_json(&run.ns)])?;
    let ws = format!("workspace/{}", run.ns);
    run.wait_for(SETTLE, "the Workspace Ready", |r| {
        let got = r.get_json(&["get", &ws])?;
        Ok((condition(&got, "Ready").is_none_or(|c| c["status"] != "True")).then(|| format!("{:#}", got["status"])))
    })
}

/// What the step generator can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    CreateServer,
    EditServer,
    NoopEdit,
    Scale,
    PauseOrResume,
    SwitchApproval,
    Approve,
    DeleteServer,
    DeleteClusterFirst,
    DeleteTaskServsFirst,
    DeleteWorkspaceFirst,
    DeleteNamespace,
    DeleteFolderOrder,
    Recreate,
    Restart,
    RestartController,
}

/// The actions that apply to what exists, with their weights.
fn applicable(run: &Run) -> Result<Vec<(Action, usize)>> {
    let m = &run.model;
    let awaiting = !awaiting_approval(run)?.is_empty();
    let any = !m.servers.is_empty() || m.cluster.is_some();
    let mut all = Vec::new();
    let mut add = |cond: bool, action: Action, weight: usize| {
        if cond {
            all.push((action, weight));
        }
    };
    add(m.workspace && m.servers.len() < SERVER_NAMES.len(), Action::CreateServer, 3);
    add(!m.servers.is_empty(), Action::EditServer, 6);
    add(any, Action::NoopEdit, 4);
    add(m.cluster.is_some(), Action::Scale, 3);
    add(any, Action::PauseOrResume, 2);
    add(any, Action::SwitchApproval, 2);
    add(awaiting, Action::Approve, 6);
    add(!m.servers.is_empty(), Action::DeleteServer, 2);
    add(m.cluster.is_some(), Action::DeleteClusterFirst, 1);
    add(m.cluster.is_some(), Action::DeleteTaskServsFirst, 1);
    add(m.workspace && any, Action::DeleteWorkspaceFirst, 1);
    add(m.workspace && any, Action::DeleteNamespace, 1);
    add(m.workspace && any, Action::DeleteFolderOrder, 1);
    add(!m.workspace || m.cluster.is_none() || m.servers.is_empty(), Action::Recreate, 3);
    add(true, Action::Restart, 1);
    add(run.split, Action::RestartController, 1);
    Ok(all)
}

/// Picks and carries out one action; returns what the oracles should expect of it.
fn step(run: &mut Run, rng: &mut Rng) -> Result<Expect> {
    let actions = applicable(run)?;
    let total: usize = actions.iter().map(|(_, w)| w).sum();
    let mut at = rng.below(total);
    let action = actions
        .iter()
        .find(|(_, w)| {
            if at < *w {
                true
            } else {
                at -= w;
                false
            }
        })
        .map_or(Action::Restart, |(a, _)| *a);
    match action {
        Action::CreateServer => {
            let free: Vec<&'static str> = SERVER_NAMES.iter().copied().filter(|n| !run.model.servers.contains_key(n)).collect();
            let name = rng.pick(&free);
            let server = random_server(rng);
            run.trace.push(format!("create server {name} {server:?}"));
            run.model.servers.insert(name, server);
            run.apply(run.manifest())?;
            Ok(Expect::Changes)
        }
        Action::EditServer => edit_server(run, rng),
        Action::NoopEdit => noop_edit(run, rng),
        Action::Scale => {
            let cluster = run.model.cluster.as_mut().context("no cluster")?;
            let replicas = rng.pick(&[1, 2, 3].into_iter().filter(|r| *r != cluster.replicas).collect::<Vec<u64>>());
            run.trace.push(format!("scale cluster {} -> {replicas}", cluster.replicas));
            cluster.replicas = replicas;
            run.apply(run.manifest())?;
            Ok(Expect::Changes)
        }
        Action::PauseOrResume => pause_or_resume(run, rng),
        Action::SwitchApproval => switch_approval(run, rng),
        Action::Approve => {
            let waiting = awaiting_approval(run)?;
            let (what, plan) = rng.pick(&waiting);
            run.trace.push(format!("approve {what} plan {plan}"));
            run.kubectl(&["annotate", &what, "-n", &run.ns, "--overwrite", &format!("provisioning.dev/approve={plan}")])?;
            Ok(Expect::Changes)
        }
        Action::DeleteServer => {
            let names: Vec<&'static str> = run.model.servers.keys().copied().collect();
            let name = rng.pick(&names);
            run.trace.push(format!("delete server {name}"));
            resume_all(run)?;
            run.model.servers.remove(name);
            run.kubectl(&["delete", "srv", name, "-n", &run.ns, "--wait=false"])?;
            wait_gone(run, &format!("server {name}"), &["get", "srv", name])
        }
        Action::DeleteClusterFirst | Action::DeleteTaskServsFirst => delete_cluster(run, action == Action::DeleteClusterFirst),
        Action::DeleteWorkspaceFirst => delete_workspace_first(run),
        Action::DeleteNamespace => delete_namespace(run),
        Action::DeleteFolderOrder => {
            run.trace.push("delete -f everything (folder order)".into());
            delete_all_folder_order(run)?;
            Ok(Expect::Changes)
        }
        Action::Recreate => recreate(run, rng),
        Action::Restart => {
            run.trace.push("kill -9 of a settled provisioning dev, restart".into());
            run.restart()?;
            Ok(Expect::Nothing)
        }
        Action::RestartController => {
            run.trace.push("kill -9 of a settled controller alone, restart it".into());
            run.restart_controller()?;
            Ok(Expect::Nothing)
        }
    }
}

fn pause_or_resume(run: &mut Run, rng: &mut Rng) -> Result<Expect> {
    let target = pick_target(run, rng);
    let paused = match target {
        Some(name) => run.model.servers.get_mut(name).map(|s| {
            s.paused = !s.paused;
            s.paused
        }),
        None => run.model.cluster.as_mut().map(|c| {
            c.paused = !c.paused;
            c.paused
        }),
    };
    run.trace.push(format!("{} {}", if paused == Some(true) { "pause" } else { "resume" }, target.unwrap_or(CLUSTER)));
    run.apply(run.manifest())?;
    Ok(Expect::Changes)
}

fn switch_approval(run: &mut Run, rng: &mut Rng) -> Result<Expect> {
    let target = pick_target(run, rng);
    let current = match target {
        Some(name) => run.model.servers.get(name).and_then(|s| s.approval),
        None => run.model.cluster.as_ref().and_then(|c| c.approval),
    };
    let choices: Vec<Option<&'static str>> = [Some("Manual"), Some("Automatic"), None].into_iter().filter(|a| *a != current).collect();
    let approval = rng.pick(&choices);
    match target {
        Some(name) => run.model.servers.get_mut(name).into_iter().for_each(|s| s.approval = approval),
        None => run.model.cluster.iter_mut().for_each(|c| c.approval = approval),
    }
    run.trace.push(format!("approval of {} -> {approval:?}", target.unwrap_or(CLUSTER)));
    run.apply(run.manifest())?;
    Ok(Expect::Changes)
}

fn delete_namespace(run: &mut Run) -> Result<Expect> {
    run.trace.push("delete namespace".into());
    resume_all(run)?;
    let uid = run.kubectl(&["get", "namespace", &run.ns, "-o", "jsonpath={.metadata.uid}"])?;
    run.kubectl(&["delete", "namespace", &run.ns, "--wait=false"])?;
    run.model.servers.clear();
    run.model.cluster = None;
    let ns = run.ns.clone();
    run.wait_for(SETTLE, "the namespace deleted (and made anew by its Workspace)", |r| {
        let now = r.kubectl(&["get", "namespace", &ns, "--ignore-not-found", "-o", "jsonpath={.metadata.uid}"])?;
        Ok(if now.trim() == uid.trim() {
            Some("the old namespace is still there".to_string())
        } else if now.trim().is_empty() {
            Some("the Workspace has not made its namespace anew".to_string())
        } else {
            None
        })
    })?;
    Ok(Expect::Changes)
}

fn recreate(run: &mut Run, rng: &mut Rng) -> Result<Expect> {
    run.trace.push("re-create what is missing".into());
    if !run.model.workspace {
        recreate_workspace(run)?;
    }
    if run.model.cluster.is_none() {
        run.model.cluster = Some(ClusterModel { replicas: 1 + rng.below(3) as u64, approval: None, paused: false });
    }
    if run.model.servers.is_empty() {
        run.model.servers.insert(SERVER_NAMES[rng.below(SERVER_NAMES.len())], random_server(rng));
    }
    run.trace.push(format!("  now {:?} and cluster {:?}", run.model.servers, run.model.cluster));
    run.apply(run.manifest())?;
    Ok(Expect::Changes)
}

/// A standalone Server (Some) or the Cluster (None), among those present.
fn pick_target(run: &Run, rng: &mut Rng) -> Option<&'static str> {
    let mut targets: Vec<Option<&'static str>> = run.model.servers.keys().copied().map(Some).collect();
    if run.model.cluster.is_some() {
        targets.push(None);
    }
    if targets.is_empty() { None } else { rng.pick(&targets) }
}

/// Changes one spec field of one standalone Server to a different value.
fn edit_server(run: &mut Run, rng: &mut Rng) -> Result<Expect> {
    let names: Vec<&'static str> = run.model.servers.keys().copied().collect();
    let name = rng.pick(&names);
    let server = run.model.servers.get_mut(name).context("server in model")?;
    let fresh = random_server(rng);
    let field = rng.pick(&["plan", "zone", "image", "updatePolicy", "approval"]);
    let before = server.clone();
    // Draw until the value differs, so every edit changes the spec.
    let mut draw = fresh;
    for _ in 0..20 {
        let mut next = server.clone();
        match field {
            "plan" => next.plan = draw.plan,
            "zone" => next.zone = draw.zone,
            "image" => next.image = draw.image,
            "updatePolicy" => next.update_policy = draw.update_policy,
            _ => next.approval = draw.approval,
        }
        if next != before {
            *server = next;
            break;
        }
        draw = random_server(rng);
    }
    run.trace.push(format!("edit server {name}: {field} -> {:?}", run.model.servers.get(name)));
    run.apply(run.manifest())?;
    Ok(Expect::Changes)
}

/// An edit that changes nothing a machine or an install depends on.
fn noop_edit(run: &mut Run, rng: &mut Rng) -> Result<Expect> {
    let target = pick_target(run, rng);
    let what = match target {
        Some(name) => format!("srv/{name}"),
        None => format!("pcl/{CLUSTER}"),
    };
    let n = rng.below(1000);
    match rng.below(5) {
        0 => {
            run.trace.push(format!("no-op: label {what} n={n}"));
            run.kubectl(&["label", &what, "-n", &run.ns, "--overwrite", &format!("n={n}")])?;
        }
        1 => {
            run.trace.push(format!("no-op: annotate {what} note={n}"));
            run.kubectl(&["annotate", &what, "-n", &run.ns, "--overwrite", &format!("note={n}")])?;
        }
        2 => {
            run.trace.push("no-op: re-apply the same manifest".into());
            run.apply(run.manifest())?;
        }
        3 => {
            // The effective approval written out: unset means the Workspace's, Automatic.
            let approval = match target {
                Some(name) => run.model.servers.get_mut(name).map(|s| &mut s.approval),
                None => run.model.cluster.as_mut().map(|c| &mut c.approval),
            };
            if let Some(a) = approval {
                if a.is_none() {
                    *a = Some("Automatic");
                }
                run.trace.push(format!("no-op: approval of {what} written as its effective value {a:?}"));
            }
            run.apply(run.manifest())?;
        }
        _ => {
            let paused = run.get_json(&["get", &what, "-n", &run.ns])?["metadata"]["annotations"][PAUSED] == "true";
            if paused {
                run.trace.push(format!("no-op: annotate paused {what} note={n}"));
                run.kubectl(&["annotate", &what, "-n", &run.ns, "--overwrite", &format!("note={n}")])?;
            } else {
                run.trace.push(format!("no-op: pause {what} and resume it once Paused"));
                run.kubectl(&["annotate", &what, "-n", &run.ns, "--overwrite", &format!("{PAUSED}=true")])?;
                let ns = run.ns.clone();
                run.wait_for(SETTLE, "Paused=True", |r| {
                    let obj = r.get_json(&["get", &what, "-n", &ns])?;
                    Ok((!condition(&obj, "Paused").is_some_and(|c| c["status"] == "True"))
                        .then(|| format!("{:#}", obj["status"]["conditions"])))
                })?;
                run.kubectl(&["annotate", &what, "-n", &run.ns, &format!("{PAUSED}-")])?;
            }
        }
    }
    Ok(Expect::Nothing)
}

/// Objects waiting for an approval, as (kubectl name, plan id): standalone Servers and the
/// Cluster (its members are approved through it).
fn awaiting_approval(run: &Run) -> Result<Vec<(String, String)>> {
    let mut found = Vec::new();
    for obj in run.objects()? {
        let owned = obj["metadata"]["ownerReferences"].as_array().is_some_and(|o| !o.is_empty());
        let kind = obj["kind"].as_str().unwrap_or_default();
        let plan = obj["status"]["plan"]["id"].as_str().unwrap_or_default();
        let waiting =
            condition(&obj, "Ready").is_some_and(|c| c["reason"] == "AwaitingApproval") || obj["status"]["phase"] == "AwaitingApproval";
        if waiting && !owned && kind != "TaskServ" && !plan.is_empty() && obj["metadata"]["deletionTimestamp"].is_null() {
            let short = if kind == "Cluster" { "pcl" } else { "srv" };
            found.push((format!("{short}/{}", obj["metadata"]["name"].as_str().unwrap_or_default()), plan.to_string()));
        }
    }
    Ok(found)
}

/// Removes every pause (a paused Server holds its deletion, by design), as an operator does
/// before deleting.
fn resume_all(run: &mut Run) -> Result<()> {
    let paused = run.model.servers.values().any(|s| s.paused) || run.model.cluster.as_ref().is_some_and(|c| c.paused);
    if paused {
        run.model.servers.values_mut().for_each(|s| s.paused = false);
        run.model.cluster.iter_mut().for_each(|c| c.paused = false);
        run.trace.push("  resume everything first".into());
        run.apply(run.manifest())?;
    }
    Ok(())
}

/// Waits until `get` finds nothing: a deletion finishes within the deadline.
fn wait_gone(run: &mut Run, what: &str, get: &[&str]) -> Result<Expect> {
    let mut args: Vec<String> = get.iter().map(|s| s.to_string()).collect();
    args.extend(["-n".into(), run.ns.clone(), "--ignore-not-found".into()]);
    run.wait_for(SETTLE, &format!("the deletion of {what} finished"), |r| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // `--ignore-not-found` prints nothing at all (no empty List) once nothing is left.
        let out = r.kubectl(&[args.as_slice(), &["-o", "json"]].concat())?;
        let left: Value = if out.trim().is_empty() { json!({"items": []}) } else { serde_json::from_str(&out)? };
        let left: Vec<String> = left["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                let ready = condition(o, "Ready").cloned().unwrap_or_default();
                format!(
                    "{} (phase {}, Ready {}: {}, finalizers {})",
                    name_of(o),
                    o["status"]["phase"],
                    ready["reason"],
                    ready["message"],
                    o["metadata"]["finalizers"]
                )
            })
            .collect();
        Ok((!left.is_empty()).then(|| format!("still there: {}", left.join("; "))))
    })?;
    Ok(Expect::Changes)
}

/// Deletes the Cluster and its TaskServs, the Cluster first or the TaskServs first.
fn delete_cluster(run: &mut Run, cluster_first: bool) -> Result<Expect> {
    run.trace
        .push(format!("delete {}", if cluster_first { "the cluster, then its taskservs" } else { "the taskservs, then their cluster" }));
    resume_all(run)?;
    run.model.cluster = None;
    let ns = run.ns.clone();
    let cluster = ["delete", "pcl", CLUSTER, "-n", &ns, "--wait=false", "--ignore-not-found"];
    let taskservs = ["delete", "ts", "--all", "-n", &ns, "--wait=false"];
    if cluster_first {
        run.kubectl(&cluster)?;
        run.kubectl(&taskservs)?;
    } else {
        run.kubectl(&taskservs)?;
        run.kubectl(&cluster)?;
    }
    wait_gone(run, "the cluster", &["get", "pcl,ts"])?;
    wait_gone(run, "the cluster's servers", &["get", "srv", "-l", &format!("provisioning.dev/cluster={CLUSTER}")])
}

/// Deletes the Workspace first, then everything in its namespace.
fn delete_workspace_first(run: &mut Run) -> Result<Expect> {
    run.trace.push("delete the workspace first, then its servers and cluster".into());
    resume_all(run)?;
    let ns = run.ns.clone();
    run.kubectl(&["delete", "workspace", &ns, "--wait=false"])?;
    run.kubectl(&["delete", "pcl,srv", "--all", "-n", &ns, "--wait=false"])?;
    run.model = Model::default();
    wait_gone(run, "every server and cluster", &["get", "srv,ts,pcl"])?;
    run.wait_for(SETTLE, "the Workspace gone", |r| {
        let left = r.kubectl(&["get", "workspace", &ns, "--ignore-not-found", "-o", "name"])?;
        Ok((!left.trim().is_empty()).then(|| "the Workspace is still there".to_string()))
    })?;
    Ok(Expect::Changes)
}

/// `kubectl delete -f` of the whole manifest (Namespace, Workspace, Servers, Cluster).
fn delete_all_folder_order(run: &mut Run) -> Result<()> {
    resume_all(run)?;
    let manifest = {
        let mut all = run.manifest();
        if !run.model.workspace {
            all.push(workspace_json(&run.ns));
        }
        all
    };
    run.files += 1;
    let path = run.data_dir.join(format!("step-{}.json", run.files));
    std::fs::write(&path, documents(&manifest)?)?;
    run.model = Model::default();
    run.kubectl(&["delete", "-f", &path.display().to_string(), "--ignore-not-found", "--timeout=120s"])?;
    let ns = run.ns.clone();
    run.wait_for(SETTLE, "the namespace and Workspace gone", |r| {
        let left = r.kubectl(&["get", &format!("namespace/{ns}"), &format!("workspace/{ns}"), "--ignore-not-found", "-o", "name"])?;
        Ok((!left.trim().is_empty()).then(|| format!("still there: {}", left.trim())))
    })
}

/// Machines at the simulated provider (every machine of the data dir: this seed made them all).
fn machines_in_ns(run: &Run) -> Result<Vec<provisioning_e2e::SimulatedMachine>> {
    provisioning_e2e::simulated_machines(&run.data_dir)
}

/// Script runs (install/remove; health checks excluded) and provider calls that change
/// something, from the audit log.
fn audited_changes(data_dir: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let out = provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &data_dir.display().to_string(), "-o", "json"])?;
    let (mut scripts, mut calls) = (Vec::new(), Vec::new());
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        let object = format!("{}/{}", v["object"]["kind"].as_str().unwrap_or_default(), v["object"]["name"].as_str().unwrap_or_default());
        let op = v["operation"].as_str().unwrap_or_default();
        let script = v["script"].as_str().unwrap_or_default();
        if v["type"] == "scriptRun" && script != "check" {
            scripts.push(format!("{script} on {} ({object})", v["server"].as_str().unwrap_or_default()));
        } else if v["type"] == "providerCall" && ["ensure_server", "delete_server", "start_server", "update_server"].contains(&op) {
            calls.push(format!("{op} ({object})"));
        }
    }
    Ok((scripts, calls))
}

/// After a step: every object settles, then the oracles hold.
fn check(run: &mut Run, expect: Expect, before: &(Vec<String>, Vec<String>)) -> Result<()> {
    run.wait_for(SETTLE, "every object settled", |r| Ok(r.objects()?.iter().find_map(unsettled)))?;
    // The journal is written before the status that reports it; a short grace covers a
    // deletion's last write racing the poll.
    run.wait_for(Duration::from_secs(10), "one machine per Server, none without one", machines_match_servers)?;
    model_matches(run)?;
    if expect == Expect::Nothing {
        let after = audited_changes(&run.data_dir)?;
        ensure!(after.0 == before.0, "a no-op step ran scripts: {:?}", after.0.get(before.0.len()..).unwrap_or(&after.0));
        ensure!(
            after.1 == before.1,
            "a no-op step changed machines at the provider: {:?}",
            after.1.get(before.1.len()..).unwrap_or(&after.1)
        );
    }
    Ok(())
}

/// The journal oracle: every machine belongs to a Server that exists, no Server has two, and
/// a Ready Server has its one.
fn machines_match_servers(run: &Run) -> Result<Option<String>> {
    let machines = machines_in_ns(run)?;
    let servers: Vec<Value> = run.objects()?.into_iter().filter(|o| o["kind"] == "Server").collect();
    let mut per_uid: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in &machines {
        per_uid.entry(m.tags.get("provisioning.dev/server-uid").cloned().unwrap_or_default()).or_default().push(m.id.clone());
    }
    let mut uids = BTreeSet::new();
    for s in &servers {
        let uid = s["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        let held = per_uid.get(&uid).map_or(0, Vec::len);
        let ready = condition(s, "Ready").is_some_and(|c| c["status"] == "True");
        if held > 1 || (ready && held == 0) {
            return Ok(Some(format!("{} (Ready={ready}) has {held} machines: {:?}", name_of(s), per_uid.get(&uid))));
        }
        uids.insert(uid);
    }
    let orphans: Vec<_> =
        machines.iter().filter(|m| !m.tags.get("provisioning.dev/server-uid").is_some_and(|u| uids.contains(u))).collect();
    if !orphans.is_empty() {
        return Ok(Some(format!("machines without a Server: {orphans:?}")));
    }
    Ok(None)
}

/// The model oracle: the Servers are the model's plus the Cluster's members, and what nothing
/// holds back (a pause, a Manual approval, an update policy that may refuse) is Ready.
fn model_matches(run: &Run) -> Result<()> {
    let objects = run.objects()?;
    let ready = |o: &Value| condition(o, "Ready").is_some_and(|c| c["status"] == "True");
    let mut standalone = BTreeSet::new();
    let mut members = 0;
    for o in objects.iter().filter(|o| o["kind"] == "Server") {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        let owned = o["metadata"]["ownerReferences"].as_array().is_some_and(|r| r.iter().any(|r| r["kind"] == "Cluster"));
        if owned {
            members += 1;
        } else {
            standalone.insert(name.to_string());
        }
    }
    let expected: BTreeSet<String> = run.model.servers.keys().map(|s| s.to_string()).collect();
    ensure!(standalone == expected, "standalone Servers {standalone:?}, the model holds {expected:?}");
    for (name, s) in &run.model.servers {
        let free = !s.paused && s.approval != Some("Manual") && matches!(s.update_policy, None | Some("Replace"));
        let obj = objects.iter().find(|o| o["kind"] == "Server" && o["metadata"]["name"] == *name);
        if free && !obj.is_some_and(ready) {
            bail!("Server {name} ({s:?}) is not Ready: {:#}", obj.map(|o| o["status"].clone()).unwrap_or_default());
        }
    }
    match &run.model.cluster {
        None => ensure!(members == 0, "{members} Cluster members without a Cluster"),
        Some(c) => {
            let obj = objects.iter().find(|o| o["kind"] == "Cluster");
            if !c.paused && c.approval != Some("Manual") {
                ensure!(
                    obj.is_some_and(ready),
                    "the Cluster ({c:?}) is not Ready: {:#}",
                    obj.map(|o| o["status"].clone()).unwrap_or_default()
                );
            }
            if obj.is_some_and(ready) && !c.paused {
                ensure!(members == c.replicas, "the Ready Cluster has {members} members, replicas {}", c.replicas);
            }
        }
    }
    Ok(())
}

/// Found by seed 4: a namespace deleted with `kubectl delete namespace` after its last Server
/// went stayed gone until the Workspace's next resync (10 minutes), because nothing told the
/// Workspace and it trusted its memo of the namespace. It is made anew within seconds.
#[test]
fn a_workspace_makes_its_deleted_namespace_anew() -> Result<()> {
    let mut run = Run::start(9_000)?;
    recreate_workspace(&mut run)?;
    let ns = run.ns.clone();
    let uid = run.kubectl(&["get", "namespace", &ns, "-o", "jsonpath={.metadata.uid}"])?;
    run.kubectl(&["delete", "namespace", &ns, "--timeout=60s"])?;
    run.wait_for(Duration::from_secs(30), "the namespace made anew", |r| {
        let now = r.kubectl(&["get", "namespace", &ns, "--ignore-not-found", "-o", "jsonpath={.metadata.uid}"])?;
        Ok((now.trim().is_empty() || now.trim() == uid.trim()).then(|| format!("namespace uid now {now:?}, was {uid:?}")))
    })?;
    Ok(())
}
