//! Node containers for the catalog service tests (`services.rs`, `upgrades.rs`): a `Lab`
//! starts containers of the local node image on its own network and removes them on drop;
//! scripts run in them through `run_script` with `docker exec` as the executor, the shape of
//! the controller's adapter over the local provider's exec.
// Each test file uses a part of these helpers.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use provisioning_taskservs::{
    AddressInfo, Catalog, ClusterInfo, ExecOutput, LocalProcessExecutor, PeerInfo, RunError, ScriptContext, ScriptExecutor, ScriptOutcome,
    ScriptPaths, ScriptStep, ServerInfo, TaskServInfo, WorkspaceInfo, run_script,
};
use serde_json::{Value, json};

use crate::common::{crate_dir, nu};

/// The node image the local provider runs (`provisioning image build`).
pub const IMAGE: &str = "provisioning-node:latest";
/// Time limit of one script step (apt downloads included).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(420);
/// Exit code of a check that found config drift (catalog/lib/check.nu).
pub const DRIFT_EXIT: i64 = 3;

/// The docker CLI (`$PROVISIONING_DOCKER`, else `docker`).
pub fn docker() -> String {
    std::env::var("PROVISIONING_DOCKER").ok().filter(|d| !d.is_empty()).unwrap_or_else(|| "docker".into())
}

/// Runs docker; its trimmed stdout, or an error naming the command and stderr.
pub fn docker_out(args: &[&str]) -> Result<String, String> {
    let out = Command::new(docker()).args(args).output().map_err(|e| format!("docker {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("docker {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `docker exec CONTAINER ARGS…` → (exit code, stdout + stderr).
pub fn exec_status(container: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(docker()).arg("exec").arg(container).args(args).output().expect("docker exec runs");
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// `docker exec`, panicking with the output when it fails.
pub fn exec_in(container: &str, args: &[&str]) -> String {
    let (code, out) = exec_status(container, args);
    assert_eq!(code, 0, "docker exec {container} {args:?}:\n{out}");
    out.trim().to_string()
}

/// Containers and a network for one test, removed on drop (by the names this test chose).
pub struct Lab {
    network: String,
    containers: Vec<String>,
}

static LABS: AtomicUsize = AtomicUsize::new(0);

impl Lab {
    /// A new network; fails (never skips) when Docker or the node image is missing.
    pub fn new(tag: &str) -> Lab {
        docker_out(&["info", "--format", "{{.ServerVersion}}"]).expect("Docker must run: run scripts/setup.sh");
        docker_out(&["image", "inspect", "--format", "{{.Id}}", IMAGE])
            .unwrap_or_else(|e| panic!("node image {IMAGE} missing (run `provisioning image build`): {e}"));
        let network = format!("tscat-{}-{}-{tag}", std::process::id(), LABS.fetch_add(1, Ordering::SeqCst));
        docker_out(&["network", "create", "--label", "provisioning.dev/test=taskservs", &network]).expect("network");
        Lab { network, containers: Vec::new() }
    }

    /// Starts a node container as the local provider does (docker-init, unprivileged) with
    /// `extra` docker run flags; returns its name and IP.
    pub fn node(&mut self, name: &str, extra: &[&str]) -> (String, String) {
        let container = format!("{}-{name}", self.network);
        let nu_mount = format!("{}:{}:ro", nu().display(), ScriptPaths::CONTAINER_NU);
        let catalog_mount = format!("{}:{}:ro", crate_dir().join("catalog").display(), ScriptPaths::CONTAINER_CATALOG);
        let mut args = vec![
            "run",
            "-d",
            "--init",
            "--name",
            &container,
            "--hostname",
            name,
            "--network",
            &self.network,
            "--label",
            "provisioning.dev/test=taskservs",
            "-v",
            &nu_mount,
            "-v",
            &catalog_mount,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, "sleep", "infinity"]);
        docker_out(&args).expect("container starts");
        self.containers.push(container.clone());
        let ip = docker_out(&["inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", &container]).expect("inspect");
        (container, ip)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = docker_out(&["rm", "-f", c]);
        }
        let _ = docker_out(&["network", "rm", &self.network]);
    }
}

/// `docker exec -i <container> <argv>` through a local process.
pub struct DockerExec {
    container: String,
    local: LocalProcessExecutor,
}

impl DockerExec {
    /// An executor for `container`.
    pub fn new(container: &str) -> Self {
        DockerExec { container: container.into(), local: LocalProcessExecutor::new("unused", "unused") }
    }
}

#[async_trait::async_trait]
impl ScriptExecutor for DockerExec {
    async fn exec(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
        timeout: Duration,
        output: Option<tokio::sync::mpsc::Sender<String>>,
    ) -> Result<ExecOutput, RunError> {
        let mut full = vec![docker(), "exec".into(), "-i".into(), self.container.clone()];
        full.extend(argv);
        self.local.exec(full, stdin, timeout, output).await
    }
}

/// A server of a test Cluster: name, IP, pool.
pub fn node_info(name: &str, ip: &str, pool: &str) -> PeerInfo {
    PeerInfo { name: name.into(), addresses: vec![AddressInfo { kind: "InternalIP".into(), address: ip.into() }], pool: pool.into() }
}

/// The context the controller would hand `service` on `me`: the TaskServ's other servers as
/// `peers`, every server of the Cluster in `cluster.servers`, the version (None = default)
/// and config validated by the catalog, templates rendered.
pub fn context(
    catalog: &Catalog,
    service: &str,
    version: Option<&str>,
    me: &PeerInfo,
    peers: &[PeerInfo],
    cluster: &[PeerInfo],
    config: Value,
) -> ScriptContext {
    let resolved = catalog.validate_request(service, version, &config).unwrap_or_else(|e| panic!("{service}: invalid request: {e}"));
    ScriptContext {
        server: ServerInfo {
            name: me.name.clone(),
            namespace: "test".into(),
            addresses: me.addresses.clone(),
            hostname: me.name.clone(),
            pool: me.pool.clone(),
        },
        peers: peers.to_vec(),
        cluster: ClusterInfo { name: if cluster.is_empty() { String::new() } else { "lab".into() }, servers: cluster.to_vec() },
        workspace: WorkspaceInfo { name: "test".into(), environment: "test".into(), config: json!({}) },
        taskserv: TaskServInfo { name: service.into(), service: service.into(), version: resolved.version, previous_version: None },
        config: resolved.config,
        templates: Default::default(),
    }
    .with_templates(catalog)
    .unwrap_or_else(|e| panic!("{service}: templates do not render: {e}"))
}

/// Runs one step of the context's service in `container`.
pub async fn step(container: &str, step: ScriptStep, ctx: &ScriptContext) -> ScriptOutcome {
    run_script(&DockerExec::new(container), step, &ctx.taskserv.service, ctx, STEP_TIMEOUT, None).await.expect("script runs")
}

/// Panics with the outcome's summary and output tail unless it succeeded.
pub fn assert_ok(what: &str, outcome: &ScriptOutcome) {
    assert!(outcome.succeeded(), "{what}: {}:\n{}", outcome.summary(), outcome.output_tail);
}

/// Runs the check until it passes (a daemon may need a moment after install), at most `within`.
pub async fn check_until_ok(container: &str, ctx: &ScriptContext, within: Duration) -> ScriptOutcome {
    let deadline = Instant::now() + within;
    loop {
        let outcome = step(container, ScriptStep::Check, ctx).await;
        if outcome.succeeded() || Instant::now() > deadline {
            return outcome;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A string field of the script's result.
pub fn result_str<'a>(outcome: &'a ScriptOutcome, field: &str) -> Option<&'a str> {
    outcome.result.as_ref().and_then(|r| r.get(field)).and_then(Value::as_str)
}

/// The config files install recorded for drift detection (its digest record).
pub fn recorded_files(container: &str, service: &str) -> Vec<String> {
    let text = exec_in(container, &["cat", &format!("/var/lib/provisioning/taskservs/{service}/config.sha256.json")]);
    let records: Vec<Value> = serde_json::from_str(&text).expect("digest record is JSON");
    records.iter().filter_map(|r| r.get("path").and_then(Value::as_str).map(str::to_string)).collect()
}

/// The drift round trip: a rendered config file edited by hand → check exits 3 with
/// `configDrift: true` naming that file → install again restores it → check passes.
pub async fn drift_roundtrip(container: &str, ctx: &ScriptContext) {
    let service = ctx.taskserv.service.clone();
    let files = recorded_files(container, &service);
    assert!(!files.is_empty(), "{service}: install recorded no config files");
    let edited = files[0].clone();
    // A trailing newline: harmless to every format, yet a different digest.
    exec_in(container, &["sh", "-c", "printf '\\n' >> \"$1\"", "edit", &edited]);
    let drifted = step(container, ScriptStep::Check, ctx).await;
    assert_eq!(drifted.exit_code, Some(DRIFT_EXIT), "{service}: check after editing {edited}:\n{}", drifted.output_tail);
    let result = drifted.result.clone().unwrap_or_else(|| panic!("{service}: drift check printed no result:\n{}", drifted.output_tail));
    assert_eq!(result.get("configDrift"), Some(&Value::Bool(true)), "{service}: {result}");
    assert_eq!(result.get("driftedFiles"), Some(&json!([edited])), "{service}: {result}");
    let healed = step(container, ScriptStep::Install, ctx).await;
    assert_ok(&format!("{service}: install after drift"), &healed);
    let clean = check_until_ok(container, ctx, Duration::from_secs(30)).await;
    assert_ok(&format!("{service}: check after re-install"), &clean);
    assert_eq!(clean.result.as_ref().and_then(|r| r.get("configDrift")), Some(&Value::Bool(false)), "{service}");
}

/// Remove → the check fails → remove again (idempotent).
pub async fn remove_twice(container: &str, ctx: &ScriptContext) {
    let service = &ctx.taskserv.service;
    assert_ok(&format!("{service}: remove"), &step(container, ScriptStep::Remove, ctx).await);
    let after = step(container, ScriptStep::Check, ctx).await;
    assert!(!after.succeeded(), "{service}: healthy after remove:\n{}", after.output_tail);
    assert_ok(&format!("{service}: second remove"), &step(container, ScriptStep::Remove, ctx).await);
}

/// Install (timed) → check until it passes; returns the install's wall time.
pub async fn install_and_check(container: &str, ctx: &ScriptContext) -> Duration {
    let service = &ctx.taskserv.service;
    let started = Instant::now();
    let install = step(container, ScriptStep::Install, ctx).await;
    let took = started.elapsed();
    assert_ok(&format!("{service}: install"), &install);
    assert_eq!(install.reported_version(), Some(ctx.taskserv.version.as_str()), "{service}: reported version");
    let check = check_until_ok(container, ctx, Duration::from_secs(30)).await;
    assert_ok(&format!("{service}: check"), &check);
    eprintln!("install time: {service} {:.1}s", took.as_secs_f64());
    took
}
