//! TaskServ validation and planning (pure) from YAML fixtures and a fixture catalog.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use provisioning_controller::taskserv::plan::{self, Observed, Operation, OperationResult, PeerTaskServ, Plan, ServerFacts, rfc3339};
use provisioning_controller::taskserv::validate::{self, InvalidTaskServ, ValidTaskServ};
use provisioning_crds::{ScriptRun, TaskServ, TaskServStatus};
use provisioning_taskservs::Catalog;

fn catalog() -> Catalog {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/taskserv_fixtures/catalog");
    Catalog::load(&dir).expect("fixture catalog loads")
}

fn taskserv(yaml: &str) -> TaskServ {
    serde_yaml_ng::from_str(yaml).expect("fixture parses")
}

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn server(name: &str, ready: bool) -> ServerFacts {
    ServerFacts { name: name.into(), ready, ..Default::default() }
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> ServerFacts {
    ServerFacts {
        name: name.into(),
        ready: true,
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

const STORE: &str = r#"
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: store, namespace: dev, generation: 1}
spec:
  service: store
  servers: {names: [s0, s1]}
"#;

/// Inputs of one planning pass (owned, so tests can tweak them).
struct Pass {
    ts: TaskServ,
    status: TaskServStatus,
    validated: Result<ValidTaskServ, InvalidTaskServ>,
    servers: Vec<ServerFacts>,
    peers: Vec<PeerTaskServ>,
    in_flight: BTreeMap<String, Operation>,
    results: Vec<OperationResult>,
    checks_due: BTreeSet<String>,
    now: Timestamp,
}

impl Pass {
    fn new(yaml: &str, servers: Vec<ServerFacts>) -> Pass {
        let ts = taskserv(yaml);
        let validated = validate::validate(&ts.spec, &catalog());
        Pass {
            status: ts.status.clone().unwrap_or_default(),
            ts,
            validated,
            servers,
            peers: vec![],
            in_flight: BTreeMap::new(),
            results: vec![],
            checks_due: BTreeSet::new(),
            now: t("2025-01-01T00:00:00Z"),
        }
    }

    fn plan(&self) -> Plan {
        plan::plan(&self.observed())
    }

    fn observed(&self) -> Observed<'_> {
        Observed {
            name: "store",
            generation: self.ts.metadata.generation,
            spec: &self.ts.spec,
            status: &self.status,
            validated: &self.validated,
            servers: &self.servers,
            taskservs: &self.peers,
            in_flight: &self.in_flight,
            results: &self.results,
            checks_due: &self.checks_due,
            now: self.now,
        }
    }

    /// Applies a plan as the reconciler would: status written, launches in flight, results consumed.
    fn commit(&mut self, plan: &Plan) {
        self.status = plan.status.clone();
        self.results.clear();
        for (server, op) in &plan.launch {
            if *op != Operation::Check {
                self.in_flight.insert(server.clone(), op.clone());
            }
        }
    }

    /// One reconcile pass: plan, then commit what it says.
    fn pass(&mut self) -> Plan {
        let plan = self.plan();
        self.commit(&plan);
        plan
    }

    /// Every run in flight on `servers` succeeds, healthy.
    fn succeed(&mut self, servers: &[&str]) {
        for server in servers {
            self.finish(server, true, Some(true));
        }
    }

    /// A new generation: `change` applied to the spec, which is validated again.
    fn respec(&mut self, change: impl FnOnce(&mut provisioning_crds::TaskServSpec)) {
        self.ts.metadata.generation = self.ts.metadata.generation.map(|g| g + 1);
        change(&mut self.ts.spec);
        self.validated = validate::validate(&self.ts.spec, &catalog());
    }

    fn finish(&mut self, server: &str, succeeded: bool, healthy: Option<bool>) {
        let op = self.in_flight.remove(server).expect("operation in flight");
        let mut r = result(server, op, succeeded, healthy);
        // The run was given the inputs of this pass.
        r.inputs_hash = self.validated.as_ref().ok().and_then(|v| v.inputs_hash.clone());
        self.results.push(r);
    }
}

fn result(server: &str, operation: Operation, succeeded: bool, healthy: Option<bool>) -> OperationResult {
    OperationResult {
        server: server.into(),
        operation: operation.clone(),
        run: ScriptRun {
            script: operation.script().into(),
            started_at: Some("2025-01-01T00:00:00Z".into()),
            finished_at: Some("2025-01-01T00:00:05Z".into()),
            exit_code: Some(if succeeded { 0 } else { 3 }),
            output_tail: Some(if succeeded { "ok".into() } else { "boom: port in use".into() }),
        },
        succeeded,
        healthy,
        message: if succeeded { "succeeded".into() } else { "exited 3".into() },
        inputs_hash: None,
        drifted_files: Vec::new(),
    }
}

fn cond<'a>(status: &'a TaskServStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("condition {type_} missing"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn install(version: &str) -> Operation {
    Operation::Install { version: version.into(), previous: None }
}

/// `servers` (s0, s1) given STORE: the first installs committed and succeeded; returns the
/// pass and the plan that follows (not committed).
fn installed_on(servers: Vec<ServerFacts>) -> (Pass, Plan) {
    let mut p = Pass::new(STORE, servers);
    p.pass();
    p.succeed(&["s0", "s1"]);
    let done = p.plan();
    (p, done)
}

/// Installs on both servers and returns the pass in the Ready state.
fn ready_pass() -> Pass {
    let (mut p, done) = installed_on(vec![server("s0", true), server("s1", true)]);
    p.commit(&done);
    assert_eq!(cond(&p.status, "Ready").0, "True", "{:#?}", p.status);
    p
}

#[test]
fn first_pass_installs_on_every_selected_ready_server() {
    let p = Pass::new(STORE, vec![server("s0", true), server("s1", true), server("other", true)]);
    let plan = p.plan();
    assert_eq!(plan.launch, vec![("s0".to_string(), install("1.0")), ("s1".to_string(), install("1.0"))]);
    let s = &plan.status;
    assert_eq!(s.phase.as_deref(), Some("Installing"));
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(cond(s, "Ready").0, "False");
    assert_eq!(cond(s, "Reconciling").0, "True");
    assert_eq!(cond(s, "Stalled").0, "False");
    assert_eq!(cond(s, "DependenciesReady").0, "True");
    assert_eq!(cond(s, "Installed"), ("False", "Installing", "0/2 servers installed"));
    assert_eq!(s.servers.iter().map(|e| e.phase.as_str()).collect::<Vec<_>>(), ["Installing", "Installing"]);
    assert!(s.servers[0].last_run.as_ref().is_some_and(|r| r.started_at.as_deref() == Some("2025-01-01T00:00:00Z")));
}

#[test]
fn selector_and_names_are_a_union() {
    let p = Pass::new(
        r#"
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: store, namespace: dev, generation: 1}
spec:
  service: store
  servers: {names: [a], selector: {matchLabels: {role: db}}}
"#,
        vec![labelled("a", &[]), labelled("b", &[("role", "db")]), labelled("c", &[("role", "web")])],
    );
    let plan = p.plan();
    let launched: Vec<&str> = plan.launch.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(launched, ["a", "b"]);
}

#[test]
fn results_make_it_ready_and_a_resync_writes_nothing() {
    let mut p = ready_pass();
    let s = p.status.clone();
    assert_eq!(s.phase.as_deref(), Some("Ready"));
    assert_eq!(s.installed_version.as_deref(), Some("1.0"));
    assert_eq!(s.last_good_version.as_deref(), Some("1.0"));
    assert_eq!(cond(&s, "Installed").0, "True");
    assert_eq!(cond(&s, "Healthy").0, "True");
    assert_eq!(cond(&s, "Reconciling").0, "False");
    // A later resync with a passing health check changes nothing at all.
    p.now = t("2025-01-01T01:00:00Z");
    p.checks_due = ["s0".to_string(), "s1".to_string()].into();
    let resync = p.plan();
    assert_eq!(resync.launch, vec![("s0".to_string(), Operation::Check), ("s1".to_string(), Operation::Check)]);
    assert_eq!(resync.status, s, "no-op resync must not change status");
    p.checks_due.clear();
    p.results = vec![result("s0", Operation::Check, true, Some(true)), result("s1", Operation::Check, true, Some(true))];
    let after = p.plan();
    assert_eq!(after.status, s, "healthy checks must not change status");
    assert!(after.events.is_empty(), "{:?}", after.events);
}

#[test]
fn ready_transition_emits_events() {
    let (_, done) = installed_on(vec![server("s0", true), server("s1", true)]);
    let reasons: Vec<&str> = done.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Installed", "Installed", "Ready"]);
}

#[test]
fn on_the_simulated_provider_installed_says_the_scripts_did_not_run() {
    let sim = |name: &str| ServerFacts { simulated: true, ..server(name, true) };
    let s = installed_on(vec![sim("s0"), sim("s1")]).1.status;
    // Ready stays True (the rollout itself was exercised); the reason and messages say so.
    assert_eq!(cond(&s, "Ready").0, "True");
    let (status, reason, msg) = cond(&s, "Installed");
    assert_eq!((status, reason), ("True", "Simulated"));
    assert!(msg.ends_with("installed on 2/2 servers (simulated: scripts not run)"), "{msg}");
    assert!(cond(&s, "Ready").2.contains("simulated: scripts not run"));

    // One real server among simulated ones: Installed, naming the simulated ones.
    let mixed = installed_on(vec![sim("s0"), server("s1", true)]).1.status;
    let (_, reason, msg) = cond(&mixed, "Installed");
    assert_eq!(reason, "Installed");
    assert!(msg.ends_with("(simulated: scripts not run on s0)"), "{msg}");
}

#[test]
fn waits_for_servers_that_are_not_ready() {
    let p = Pass::new(STORE, vec![server("s0", true)]);
    let plan = p.plan();
    assert_eq!(plan.launch, vec![("s0".to_string(), install("1.0"))]);
    let (_, _, msg) = cond(&plan.status, "Installed");
    assert!(msg.contains("waiting for Server s1"), "{msg}");
}

const ORCHESTRATOR: &str = r#"
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: orch, namespace: dev, generation: 1}
spec:
  service: orchestrator
  servers: {names: [s0, s1]}
"#;

#[test]
fn missing_hard_dependency_waits_naming_it() {
    let p = Pass::new(ORCHESTRATOR, vec![server("s0", true), server("s1", true)]);
    assert_eq!(p.validated.as_ref().map(|v| v.dependencies.clone()).ok(), Some(vec!["runtime".to_string()]));
    let plan = p.plan();
    assert!(plan.launch.is_empty(), "nothing runs before dependencies: {:?}", plan.launch);
    let (status, reason, msg) = cond(&plan.status, "DependenciesReady");
    assert_eq!((status, reason), ("False", "WaitingForDependencies"));
    assert!(msg.contains("runtime"), "{msg}");
    assert_eq!(cond(&plan.status, "Stalled").0, "False");
    assert_eq!(cond(&plan.status, "Reconciling").0, "True");
    assert_eq!(plan.status.resolved_dependencies, ["runtime"]);
}

#[test]
fn dependency_must_be_ready_on_the_same_servers() {
    let mut p = Pass::new(ORCHESTRATOR, vec![server("s0", true), server("s1", true)]);
    p.peers = vec![PeerTaskServ { name: "rt".into(), service: "runtime".into(), ready: false, installed_on: ["s0".to_string()].into() }];
    let plan = p.plan();
    assert!(plan.launch.is_empty());
    assert_eq!(cond(&plan.status, "DependenciesReady").2, "waiting for TaskServ rt (runtime: 1/2 servers installed)");
    p.peers[0].ready = true;
    p.peers[0].installed_on.insert("s1".into());
    let plan = p.plan();
    assert_eq!(plan.launch.len(), 2);
    assert_eq!(cond(&plan.status, "DependenciesReady").0, "True");
}

#[test]
fn depends_on_names_other_taskservs() {
    let mut p = Pass::new(
        r#"
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: store, namespace: dev, generation: 1}
spec: {service: store, servers: {names: [s0]}, dependsOn: [web]}
"#,
        vec![server("s0", true)],
    );
    let plan = p.plan();
    assert!(plan.launch.is_empty());
    assert!(cond(&plan.status, "DependenciesReady").2.contains("TaskServ web not found"));
    p.peers = vec![PeerTaskServ { name: "web".into(), service: "haproxy".into(), ready: true, installed_on: BTreeSet::new() }];
    assert_eq!(p.plan().launch.len(), 1);
}

/// Bad input (an unknown service or version, invalid config, a dependency cycle) is Stalled
/// with a Warning naming the reason; nothing runs, and the next pass repeats nothing.
#[test]
fn bad_input_is_stalled_with_the_message_and_nothing_runs() {
    struct Case {
        name: &'static str,
        spec: &'static str,
        reason: &'static str,
        message: &'static str,
    }
    let cases = [
        Case { name: "unknown service", spec: "service: nosuch", reason: "UnknownService", message: "unknown service \"nosuch\"" },
        Case {
            name: "unknown version",
            spec: "service: store\n  version: \"9.9\"",
            reason: "UnknownVersion",
            message: "service store has no version \"9.9\" (available: 1.0, 2.0)",
        },
        Case {
            name: "config value fails its schema",
            spec: "service: store\n  config: {port: \"$(reboot)\"}",
            reason: "InvalidConfig",
            message: "invalid config for store",
        },
        Case { name: "unknown config key", spec: "service: store\n  config: {bogus: 1}", reason: "InvalidConfig", message: "bogus" },
        Case { name: "dependency cycle", spec: "service: loopa", reason: "DependencyCycle", message: "loopa -> loopb -> loopa" },
    ];
    for Case { name, spec, reason, message } in cases {
        let yaml = format!(
            "apiVersion: provisioning.dev/v1alpha1\nkind: TaskServ\nmetadata: {{name: bad, namespace: dev, generation: 1}}\nspec:\n  {spec}\n  servers: {{names: [s0]}}\n"
        );
        let p = Pass::new(&yaml, vec![server("s0", true)]);
        let plan = p.plan();
        assert!(plan.launch.is_empty(), "{name}: nothing may run");
        assert!(plan.status.servers.is_empty(), "{name}: no per-server entries");
        let (status, r, msg) = cond(&plan.status, "Stalled");
        assert_eq!((status, r), ("True", reason), "{name}");
        assert!(msg.contains(message), "{name}: {msg}");
        assert_eq!(cond(&plan.status, "Ready").0, "False", "{name}");
        assert_eq!(cond(&plan.status, "Reconciling").0, "False", "{name}");
        assert_eq!(plan.status.phase.as_deref(), Some("Failed"), "{name}");
        assert!(plan.events.iter().any(|e| e.warning && e.reason == reason), "{name}: {:?}", plan.events);
        // The stall does not repeat its event on the next pass.
        let mut again = p;
        again.status = plan.status.clone();
        let second = again.plan();
        assert_eq!(second.status, plan.status, "{name}");
        assert!(second.events.is_empty(), "{name}: {:?}", second.events);
    }
}

#[test]
fn failing_health_check_goes_unhealthy_then_reinstalls() {
    let mut p = ready_pass();
    p.now = t("2025-01-01T01:00:00Z");
    p.results = vec![result("s1", Operation::Check, false, Some(false))];
    let plan = p.plan();
    let (status, reason, msg) = cond(&plan.status, "Healthy");
    assert_eq!((status, reason), ("False", "HealthCheckFailed"));
    assert_eq!(msg, "unhealthy on s1");
    assert_eq!(cond(&plan.status, "Ready").0, "False");
    let warning = plan.events.iter().find(|e| e.reason == "Unhealthy").expect("Warning event");
    assert!(warning.warning && warning.note.contains("boom: port in use"), "{warning:?}");
    // Re-install on the broken server in the same pass.
    assert_eq!(plan.launch, vec![("s1".to_string(), Operation::Install { version: "1.0".into(), previous: None })]);
    p.commit(&plan);
    p.succeed(&["s1"]);
    let healed = p.plan();
    assert_eq!(cond(&healed.status, "Healthy").0, "True");
    assert_eq!(cond(&healed.status, "Ready").0, "True");
}

#[test]
fn a_server_that_disappears_is_reinstalled_when_back() {
    let mut p = ready_pass();
    p.servers[1].ready = false;
    let plan = p.plan();
    assert!(plan.launch.is_empty());
    assert_eq!(cond(&plan.status, "Healthy").0, "False");
    p.commit(&plan);
    p.servers[1].ready = true;
    let back = p.plan();
    assert_eq!(back.launch, vec![("s1".to_string(), install("1.0"))]);
}

#[test]
fn restarted_controller_resumes_from_status_without_running_twice() {
    let mut p = Pass::new(STORE, vec![server("s0", true), server("s1", true)]);
    p.pass();
    // Same process, next pass: runs are in flight, nothing is started again.
    assert!(p.plan().launch.is_empty());
    // New process: status says Installing, nothing in flight → run again (idempotent script,
    // guarded by the per-service lock on the machine).
    p.in_flight.clear();
    let resumed = p.plan();
    assert_eq!(resumed.launch.len(), 2);
}

#[test]
fn failed_install_is_retried_after_a_pause_with_a_warning() {
    let (mut p, failed) = failed_install_on_s0();
    assert!(failed.launch.is_empty(), "no hot retry");
    assert_eq!(failed.status.servers[0].phase, "Failed");
    assert_eq!(failed.status.servers[0].last_run.as_ref().and_then(|r| r.exit_code), Some(3));
    let w = failed.events.iter().find(|e| e.reason == "InstallFailed").expect("warning");
    assert!(w.warning && w.note.contains("boom: port in use"));
    // The reason is on the object's conditions too, not only in events.
    let (status, reason, message) = cond(&failed.status, "Ready");
    assert_eq!((status, reason), ("False", "InstallFailed"), "{message}");
    assert!(message.starts_with("0/1 servers installed; install failed on s0: ") && message.contains("boom"), "{message}");
    p.commit(&failed);
    p.now = t("2025-01-01T00:01:00Z");
    assert_eq!(p.plan().launch.len(), 1, "retried after the pause");
}

#[test]
fn failed_upgrade_rolls_back_to_last_good_version() {
    let mut p = ready_pass();
    p.respec(|spec| spec.version = "2.0".into());
    let upgrade = p.plan();
    assert_eq!(
        upgrade.launch,
        vec![
            ("s0".to_string(), Operation::Install { version: "2.0".into(), previous: Some("1.0".into()) }),
            ("s1".to_string(), Operation::Install { version: "2.0".into(), previous: Some("1.0".into()) }),
        ]
    );
    p.commit(&upgrade);
    p.succeed(&["s0"]);
    p.finish("s1", false, Some(false));
    let failed = p.plan();
    let (status, reason, msg) = cond(&failed.status, "Stalled");
    assert_eq!((status, reason), ("True", "UpgradeFailed"));
    assert!(msg.contains("rolling back to 1.0"), "{msg}");
    assert_eq!(failed.status.phase.as_deref(), Some("Degraded"));
    // Both servers go back to 1.0.
    let rollback: Vec<(String, Operation)> = failed.launch.clone();
    assert_eq!(
        rollback,
        vec![
            ("s0".to_string(), Operation::Install { version: "1.0".into(), previous: Some("2.0".into()) }),
            ("s1".to_string(), Operation::Install { version: "1.0".into(), previous: Some("2.0".into()) }),
        ]
    );
    p.commit(&failed);
    p.succeed(&["s0", "s1"]);
    let rolled = p.plan();
    assert!(rolled.launch.is_empty(), "the failed version is not retried for this generation");
    assert_eq!(rolled.status.installed_version.as_deref(), Some("1.0"));
    assert_eq!(rolled.status.last_good_version.as_deref(), Some("1.0"));
    assert_eq!(cond(&rolled.status, "Stalled").1, "UpgradeFailed");
    assert_eq!(cond(&rolled.status, "Installed").0, "True");
}

#[test]
fn failed_upgrade_without_rollback_keeps_retrying() {
    let mut p = ready_pass();
    p.respec(|spec| {
        spec.version = "2.0".into();
        spec.rollback_on_failure = false;
    });
    p.pass();
    p.finish("s0", false, None);
    p.finish("s1", false, None);
    let failed = p.plan();
    assert_eq!(cond(&failed.status, "Stalled").0, "False");
    assert!(failed.launch.is_empty());
    assert_eq!(failed.status.phase.as_deref(), Some("Failed"));
}

#[test]
fn deselected_server_is_drained_with_remove() {
    let mut p = ready_pass();
    p.respec(|spec| spec.servers.names = vec!["s0".into()]);
    let plan = p.plan();
    // The server list is not an input of s0's install: only s1 runs a script.
    assert_eq!(plan.launch, vec![("s1".to_string(), Operation::Remove)]);
    assert_eq!(plan.status.servers.iter().find(|s| s.name == "s1").map(|s| s.phase.as_str()), Some("Removing"));
    p.commit(&plan);
    p.finish("s1", true, None);
    let after = p.plan();
    assert_eq!(after.status.servers.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["s0"]);
    assert!(after.events.iter().any(|e| e.reason == "Removed"));
}

#[test]
fn spec_change_reinstalls_everywhere_once() {
    let mut p = ready_pass();
    p.respec(|spec| spec.config = Some(serde_json::json!({"port": 2400})));
    assert_eq!(p.pass().launch.len(), 2);
    p.succeed(&["s0", "s1"]);
    let done = p.plan();
    assert!(done.launch.is_empty());
    assert_eq!(cond(&done.status, "Ready").0, "True");
    p.commit(&done);
    assert!(p.plan().launch.is_empty());
}

#[test]
fn delete_runs_remove_everywhere_then_is_done() {
    let mut p = ready_pass();
    let (plan, done) = plan::plan_removal(&p.observed());
    assert!(!done);
    assert_eq!(plan.launch, vec![("s0".to_string(), Operation::Remove), ("s1".to_string(), Operation::Remove)]);
    assert_eq!(plan.status.phase.as_deref(), Some("Removing"));
    p.commit(&plan);
    p.finish("s0", true, None);
    // s1's machine is gone meanwhile: nothing to drain there.
    p.in_flight.clear();
    p.servers.retain(|s| s.name != "s1");
    let (last, done) = plan::plan_removal(&p.observed());
    assert!(done, "{:#?}", last.status.servers);
    assert!(last.status.servers.is_empty());
}

#[test]
fn times_are_rfc3339_seconds() {
    assert_eq!(rfc3339(t("2025-01-01T00:00:00.123456Z")), "2025-01-01T00:00:00Z");
}

#[test]
fn delete_after_a_failed_install_gives_up_after_one_failed_remove() {
    // Unreachable machines: the install failed, so does the remove; deletion must finish.
    let (mut p, failed) = failed_install_on_s0();
    p.commit(&failed);
    p.now = t("2025-01-01T00:01:00Z");
    let (removal, done) = plan::plan_removal(&p.observed());
    assert!(!done);
    assert_eq!(removal.launch, vec![("s0".to_string(), Operation::Remove)], "one best-effort remove");
    let ready = cond(&removal.status, "Ready");
    assert!(ready.2.contains("from 1 server") && !ready.2.contains("1 servers"), "singular: {ready:?}");
    p.commit(&removal);
    p.finish("s0", false, None);
    let (last, done) = plan::plan_removal(&p.observed());
    assert!(done, "{:#?}", last.status.servers);
    assert!(last.events.iter().any(|e| e.warning && e.reason == "RemoveFailed" && e.note.contains("never installed")));
}

/// STORE on s0 only, its install failed; returns the pass and the plan that follows (not
/// committed), six seconds after the run.
fn failed_install_on_s0() -> (Pass, Plan) {
    let mut p = Pass::new(STORE, vec![server("s0", true)]);
    p.ts.spec.servers.names = vec!["s0".into()];
    p.pass();
    p.finish("s0", false, None);
    p.now = t("2025-01-01T00:00:06Z");
    let failed = p.plan();
    (p, failed)
}

/// The configFrom inputs as `inputs::resolve` gives them: a new version of the values and the
/// value itself merged into the config (at `password`).
fn with_inputs_hash(p: &mut Pass, hash: &str) {
    if let Ok(v) = p.validated.as_mut() {
        v.inputs_hash = Some(hash.to_string());
        std::sync::Arc::make_mut(&mut v.config)["password"] = serde_json::Value::String(format!("from-secret-{hash}"));
    }
}

#[test]
fn new_values_behind_config_from_reinstall_everywhere_once() {
    let mut p = Pass::new(STORE, vec![server("s0", true), server("s1", true)]);
    with_inputs_hash(&mut p, "sha256:aaaa");
    assert_eq!(p.pass().status.config_inputs_hash.as_deref(), Some("sha256:aaaa"));
    p.succeed(&["s0", "s1"]);
    p.pass();
    assert_eq!(cond(&p.status, "Ready").0, "True");
    // A resync with the same values runs nothing.
    assert!(p.plan().launch.is_empty());
    // The Secret was rotated: same generation, new hash → install again on both servers.
    with_inputs_hash(&mut p, "sha256:bbbb");
    let rotated = p.plan();
    assert_eq!(rotated.launch, vec![("s0".to_string(), install("1.0")), ("s1".to_string(), install("1.0"))]);
    assert_eq!(rotated.status.config_inputs_hash.as_deref(), Some("sha256:bbbb"));
    let reasons: Vec<&str> = rotated.status.servers.iter().filter_map(|s| s.reinstall_reason.as_deref()).collect();
    assert_eq!(reasons, ["config.password changed", "config.password changed"], "the entries name the input");
    p.commit(&rotated);
    // Once: the next pass (hash recorded) starts nothing more.
    assert!(p.plan().launch.is_empty());
}

#[test]
fn a_missing_config_source_is_stalled_naming_it_and_runs_nothing() {
    let mut p = Pass::new(STORE, vec![server("s0", true), server("s1", true)]);
    p.validated = Err(InvalidTaskServ::ConfigInputs(
        "ConfigFromMissing",
        "waiting for Secret dev/db-creds (key \"password\", configFrom[0]): the object does not exist".into(),
    ));
    let plan = p.plan();
    assert!(plan.launch.is_empty());
    let (status, reason, message) = cond(&plan.status, "Stalled");
    assert_eq!((status, reason), ("True", "ConfigFromMissing"));
    assert!(message.contains("Secret dev/db-creds") && message.contains("password"), "{message}");
    assert!(plan.events.iter().any(|e| e.warning && e.reason == "ConfigFromMissing"));
    // Polled too, not only watched (the Secret watch may be refused by per-namespace RBAC).
    assert_eq!(plan.requeue, Some(plan::CONFIG_INPUTS_REQUEUE));
}

#[test]
fn an_install_that_ran_with_values_rotated_meanwhile_runs_again() {
    let mut p = Pass::new(STORE, vec![server("s0", true), server("s1", true)]);
    with_inputs_hash(&mut p, "sha256:aaaa");
    p.pass();
    // Both installs run with "aaaa"; the Secret is rotated before they finish.
    p.succeed(&["s0", "s1"]);
    with_inputs_hash(&mut p, "sha256:bbbb");
    let next = p.pass();
    assert_eq!(next.launch, vec![("s0".to_string(), install("1.0")), ("s1".to_string(), install("1.0"))]);
    p.succeed(&["s0", "s1"]);
    let done = p.plan();
    assert!(done.launch.is_empty());
    assert_eq!(cond(&done.status, "Ready").0, "True");
}

const STORE_ROLLING: &str = r#"
apiVersion: provisioning.dev/v1alpha1
kind: TaskServ
metadata: {name: store, namespace: dev, generation: 1}
spec:
  service: store
  servers: {names: [s0, s1, s2]}
  rollout: {maxUnavailable: 1}
"#;

/// Three servers with `rollout.maxUnavailable: 1`, installed (first installs are not limited).
fn rolling_ready_pass() -> Pass {
    let mut p = Pass::new(STORE_ROLLING, vec![server("s0", true), server("s1", true), server("s2", true)]);
    let first = p.plan();
    assert_eq!(first.launch.len(), 3, "a first install is not a rolling update: {:?}", first.launch);
    assert_eq!(first.status.updated.as_deref(), Some("0/3"));
    p.commit(&first);
    p.succeed(&["s0", "s1", "s2"]);
    p.pass();
    assert_eq!(cond(&p.status, "Ready").0, "True", "{:#?}", p.status);
    assert_eq!(p.status.updated.as_deref(), Some("3/3"));
    p
}

fn launched(plan: &Plan) -> Vec<&str> {
    plan.launch.iter().map(|(s, _)| s.as_str()).collect()
}

#[test]
fn a_rolling_upgrade_goes_server_by_server_gated_on_health() {
    let mut p = rolling_ready_pass();
    p.respec(|spec| spec.version = "2.0".into());
    let mut order = Vec::new();
    for (step, expected) in ["s0", "s1", "s2"].into_iter().enumerate() {
        let plan = p.plan();
        assert_eq!(launched(&plan), [expected], "step {step}: one server at a time");
        assert_eq!(plan.status.updated, Some(format!("{step}/3")));
        assert_eq!(cond(&plan.status, "Ready").0, "False");
        p.commit(&plan);
        // While it runs, nobody else starts.
        assert!(p.plan().launch.is_empty(), "step {step}: the next waits for this one");
        p.finish(expected, true, Some(true));
        order.push(expected);
    }
    let done = p.plan();
    assert!(done.launch.is_empty());
    assert_eq!(done.status.updated.as_deref(), Some("3/3"));
    assert_eq!(done.status.installed_version.as_deref(), Some("2.0"));
    assert_eq!(cond(&done.status, "Ready").0, "True");
    assert_eq!(order, ["s0", "s1", "s2"]);
}

#[test]
fn a_failed_rolling_upgrade_stops_there_and_rolls_back_one_server_at_a_time() {
    let mut p = rolling_ready_pass();
    p.respec(|spec| spec.version = "2.0".into());
    assert_eq!(launched(&p.pass()), ["s0"]);
    p.succeed(&["s0"]);
    assert_eq!(launched(&p.pass()), ["s1"]);
    p.finish("s1", false, Some(false));
    // s1 failed its upgrade: rollback to 1.0 starts on s1 (the one down); s0 (upgraded,
    // healthy) waits for its turn; s2 never got 2.0.
    let failed = p.plan();
    assert_eq!(cond(&failed.status, "Stalled").1, "UpgradeFailed");
    assert_eq!(failed.launch, vec![("s1".to_string(), Operation::Install { version: "1.0".into(), previous: Some("2.0".into()) })]);
    p.commit(&failed);
    p.succeed(&["s1"]);
    let next = p.pass();
    assert_eq!(next.launch, vec![("s0".to_string(), Operation::Install { version: "1.0".into(), previous: Some("2.0".into()) })]);
    p.succeed(&["s0"]);
    // s2 never left 1.0 (a version change is not an input of a re-install): nothing to run there.
    let rolled = p.plan();
    assert!(rolled.launch.is_empty(), "{:?}", rolled.launch);
    assert_eq!(rolled.status.updated.as_deref(), Some("3/3"), "all back on the last good version");
    assert_eq!(rolled.status.installed_version.as_deref(), Some("1.0"));
}

#[test]
fn a_rolling_config_change_honours_max_unavailable_two() {
    let mut p = rolling_ready_pass();
    p.respec(|spec| {
        spec.rollout = Some(provisioning_crds::Rollout { max_unavailable: 2 });
        spec.config = Some(serde_json::json!({"port": 2400}));
    });
    assert_eq!(launched(&p.pass()), ["s0", "s1"]);
    p.succeed(&["s0"]);
    let next = p.plan();
    assert_eq!(launched(&next), ["s2"], "s0 done, s1 still running: one more slot");
}

#[test]
fn config_drift_found_by_a_check_is_drifted_then_re_rendered() {
    let mut p = ready_pass();
    assert!(p.status.conditions.iter().all(|c| c.type_ != "Drifted"), "no Drifted condition before any drift");
    let mut check = result("s1", Operation::Check, false, Some(false));
    check.drifted_files = vec!["/etc/store/store.conf".into()];
    p.results.push(check);
    let drifted = p.plan();
    assert_eq!(cond(&drifted.status, "Drifted").0, "True");
    assert_eq!(cond(&drifted.status, "Drifted").1, "ConfigChanged");
    assert!(cond(&drifted.status, "Drifted").2.contains("s1 (/etc/store/store.conf)"), "{:?}", cond(&drifted.status, "Drifted"));
    assert_eq!(cond(&drifted.status, "Ready").0, "False");
    let warnings: Vec<&str> = drifted.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(warnings, ["ConfigChanged"], "one ConfigChanged warning, not also Unhealthy");
    // Remediation: the install runs again on s1 only.
    assert_eq!(drifted.launch, vec![("s1".to_string(), install("1.0"))]);
    p.commit(&drifted);
    p.succeed(&["s1"]);
    let fixed = p.plan();
    assert_eq!((cond(&fixed.status, "Drifted").0, cond(&fixed.status, "Drifted").1), ("False", "Remediated"));
    assert_eq!(cond(&fixed.status, "Ready").0, "True");
    assert!(fixed.status.servers.iter().all(|s| s.drifted_files.is_empty()));
}

#[test]
fn a_server_whose_machine_was_replaced_gets_the_service_again() {
    let on = |name: &str, machine: &str| ServerFacts { provider_id: Some(machine.into()), ..server(name, true) };
    let mut p = Pass::new(STORE, vec![on("s0", "m0"), on("s1", "m1")]);
    p.pass();
    let entry = |p: &Pass, name: &str| p.status.servers.iter().find(|e| e.name == name).cloned().expect("entry");
    assert_eq!(entry(&p, "s0").provider_id.as_deref(), Some("m0"), "the machine is recorded at install");
    p.succeed(&["s0", "s1"]);
    p.pass();
    assert_eq!(entry(&p, "s0").phase, "Installed");
    // s0's Server got a new machine under the same name, and the Ready=False in between was
    // never seen: the entry still says Installed, but on m0.
    p.servers[0].provider_id = Some("m0-new".into());
    let again = p.plan();
    assert!(
        again.launch.iter().any(|(s, op)| s == "s0" && matches!(op, Operation::Install { .. })),
        "re-installed on the new machine: {:?}",
        again.launch
    );
    assert!(!again.launch.iter().any(|(s, op)| s == "s1" && matches!(op, Operation::Install { .. })), "s1 untouched");
    p.commit(&again);
    assert_eq!(entry(&p, "s0").provider_id.as_deref(), Some("m0-new"));
}

/// Edits that change nothing an install depends on (`taskserv::inputs`, module doc): no script
/// runs on servers that have the service, and the plan has no changes.
#[test]
fn no_op_edits_run_no_script() {
    type Edit = fn(&mut TaskServ);
    let cases: &[(&str, Edit)] = &[
        ("a label", |ts| {
            ts.metadata.labels.get_or_insert_default().insert("team".into(), "db".into());
        }),
        ("an annotation", |ts| {
            ts.metadata.annotations.get_or_insert_default().insert("note".into(), "hello".into());
        }),
        ("approval set to its effective value", |ts| ts.spec.approval = Some(provisioning_crds::Approval::Automatic)),
        ("approval switched to Manual", |ts| ts.spec.approval = Some(provisioning_crds::Approval::Manual)),
        ("a rollout", |ts| ts.spec.rollout = Some(provisioning_crds::Rollout { max_unavailable: 1 })),
        ("rollbackOnFailure off", |ts| ts.spec.rollback_on_failure = false),
        ("server names reordered", |ts| ts.spec.servers.names.reverse()),
        ("the schema default written out", |ts| ts.spec.config = Some(serde_json::json!({"port": 2379}))),
        ("the same manifest re-applied", |_| {}),
    ];
    for (what, edit) in cases {
        let mut p = ready_pass();
        // Every edit is a new generation here (most are; labels and annotations are not, which
        // is the easier case).
        p.ts.metadata.generation = p.ts.metadata.generation.map(|g| g + 1);
        edit(&mut p.ts);
        p.validated = validate::validate(&p.ts.spec, &catalog());
        let plan = p.plan();
        assert!(plan.launch.is_empty(), "{what}: {:?}", plan.launch);
        assert!(plan.status.servers.iter().all(|s| s.phase == "Installed"), "{what}: {:?}", plan.status.servers);
        let ts_plan = plan::taskserv_plan("TaskServ/dev/store", p.ts.metadata.generation, &plan.status, plan.version.as_deref());
        assert_eq!(ts_plan.summary, "no changes", "{what}");
        assert_eq!(cond(&plan.status, "Ready").0, "True", "{what}");
    }
}

/// A change of an input re-installs everywhere, once, and the plan's reason names the input.
#[test]
fn a_config_change_plans_a_re_install_naming_the_field() {
    let mut p = ready_pass();
    p.respec(|spec| spec.config = Some(serde_json::json!({"port": 2400})));
    let plan = p.plan();
    let ts_plan = plan::taskserv_plan("TaskServ/dev/store", p.ts.metadata.generation, &plan.status, plan.version.as_deref());
    assert_eq!(ts_plan.summary, "2 to update", "{:#?}", ts_plan.changes);
    assert!(ts_plan.changes.iter().all(|c| c.reason == "re-install (config.port changed)"), "{:#?}", ts_plan.changes);
    p.commit(&plan);
    p.succeed(&["s0", "s1"]);
    let done = p.pass();
    assert!(done.status.servers.iter().all(|s| s.reinstall_reason.is_none()), "cleared by the install: {:?}", done.status.servers);
    assert!(p.plan().launch.is_empty(), "once");
}

/// A scale-up installs on the new server only.
#[test]
fn a_scale_up_installs_only_on_the_new_server() {
    let mut p = ready_pass();
    p.servers.push(server("s2", true));
    p.respec(|spec| spec.servers.names.push("s2".into()));
    let plan = p.plan();
    assert_eq!(plan.launch, vec![("s2".to_string(), install("1.0"))]);
    let ts_plan = plan::taskserv_plan("TaskServ/dev/store", p.ts.metadata.generation, &plan.status, plan.version.as_deref());
    assert_eq!(ts_plan.summary, "1 to create", "{:#?}", ts_plan.changes);
}

/// A status written before the install inputs were recorded: a pass with no spec change
/// records them and runs nothing; a spec change then counts as before.
#[test]
fn a_status_without_recorded_inputs_records_them_and_runs_nothing() {
    let mut p = ready_pass();
    p.status.install_inputs.clear();
    let plan = p.plan();
    assert!(plan.launch.is_empty(), "{:?}", plan.launch);
    assert!(plan.status.install_inputs.contains_key("service"), "{:?}", plan.status.install_inputs);
    p.status.install_inputs.clear();
    p.respec(|spec| spec.config = Some(serde_json::json!({"port": 2400})));
    assert_eq!(p.plan().launch.len(), 2, "a spec change with nothing recorded re-installs");
}

/// A config change while the installs of the previous one run: they finish, then run again
/// with the new value (once), the reason naming it.
#[test]
fn a_config_change_during_an_install_runs_it_again_afterwards() {
    let mut p = ready_pass();
    p.respec(|spec| spec.config = Some(serde_json::json!({"port": 2400})));
    assert_eq!(p.pass().launch.len(), 2);
    p.respec(|spec| spec.config = Some(serde_json::json!({"port": 2401})));
    assert!(p.pass().launch.is_empty(), "the runs in flight are not started twice");
    p.succeed(&["s0", "s1"]);
    let again = p.pass();
    assert_eq!(again.launch, vec![("s0".to_string(), install("1.0")), ("s1".to_string(), install("1.0"))]);
    let ts_plan = plan::taskserv_plan("TaskServ/dev/store", p.ts.metadata.generation, &again.status, again.version.as_deref());
    assert!(ts_plan.changes.iter().all(|c| c.reason == "re-install (config.port changed)"), "{:#?}", ts_plan.changes);
    p.succeed(&["s0", "s1"]);
    let done = p.pass();
    assert!(done.launch.is_empty() && cond(&done.status, "Ready").0 == "True", "{:?}", done.launch);
    assert!(p.plan().launch.is_empty(), "once");
}
