//! Harness for end-to-end tests: runs `provisioning dev` as a real process and drives it
//! with the real kubectl. Tools are found through the project's setup script
//! (`scripts/setup.sh` installs them into `.tools/`); a missing tool fails the test with a
//! message saying so — these tests never skip.

pub mod cloud;
pub mod cloud_node;
pub mod docker;
pub mod sshd;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// A tool from the environment variable, else from `.tools/bin/<name>`; panics with a hint.
pub fn tool(env_var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var).map(PathBuf::from).filter(|p| p.exists()) {
        return p;
    }
    let p = workspace_root().join(".tools/bin").join(name);
    assert!(p.exists(), "{name} not found ({env_var} unset and {} missing): run scripts/setup.sh", p.display());
    p
}

/// The real kubectl.
pub fn kubectl_bin() -> PathBuf {
    tool("PROVISIONING_KUBECTL", "kubectl")
}

/// kubectl for the API server of `kubeconfig`, with its own discovery cache next to the
/// kubeconfig: tests run in parallel and API servers get random ports, so the shared
/// `~/.kube/cache` (keyed by host:port) could hand one server's cached discovery to another.
pub fn kubectl_command(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(kubectl_bin());
    let cache = kubeconfig.parent().unwrap_or(Path::new(".")).join("kubectl-cache");
    cmd.env("KUBECONFIG", kubeconfig).arg("--cache-dir").arg(cache);
    cmd
}

/// The `provisioning` binary built by `cargo build`.
pub fn provisioning_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PROVISIONING_BIN").map(PathBuf::from) {
        return p;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"));
    let p = target.join("debug/provisioning");
    assert!(p.exists(), "{} missing: run `cargo build --bin provisioning` (scripts/test.sh does)", p.display());
    p
}

/// Runs the `provisioning` binary with `args` (no kubeconfig of its own).
pub fn provisioning(args: &[&str]) -> Result<Output> {
    Ok(Command::new(provisioning_bin()).args(args).output()?)
}

/// Runs `provisioning` and returns its stdout; a non-zero exit is an error carrying stderr.
pub fn provisioning_ok(args: &[&str]) -> Result<String> {
    let out = provisioning(args)?;
    if !out.status.success() {
        anyhow::bail!("provisioning {args:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A running `provisioning dev`, or ([`Dev::start_split_in`]) the same control plane as two
/// processes: `provisioning apiserver` and `provisioning controller`, so that the controller
/// alone can be killed and started again.
pub struct Dev {
    child: Option<Child>,
    /// The controller's own process, in the two-process form.
    controller: Option<Child>,
    /// Its data directory.
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    log_path: PathBuf,
}

impl Dev {
    /// Starts `provisioning dev` on a free loopback port in a fresh temp data dir, applying
    /// `apply` (paths relative to the workspace root), and waits for its kubeconfig.
    pub fn start(apply: &[&str]) -> Result<Dev> {
        let tmp = tempfile::tempdir()?;
        let data_dir = tmp.path().join("data");
        let mut dev = Dev::start_in(&data_dir, apply)?;
        dev._tmp = Some(tmp);
        Ok(dev)
    }

    /// Starts `provisioning dev` with the given data dir (reused across restarts).
    pub fn start_in(data_dir: &Path, apply: &[&str]) -> Result<Dev> {
        Dev::start_in_with_env(data_dir, apply, &[])
    }

    /// Like [`Dev::start_in`], with extra environment variables for the process (e.g.
    /// `PROVISIONING_CATALOG`).
    pub fn start_in_with_env(data_dir: &Path, apply: &[&str], env: &[(&str, &str)]) -> Result<Dev> {
        Dev::start_in_with(data_dir, apply, env, &[])
    }

    /// Starts `provisioning dev` with plain-http provider endpoints allowed
    /// (`--allow-insecure-endpoints`), as tests against moto and the UpCloud double need.
    pub fn start_allowing_insecure_endpoints(apply: &[&str]) -> Result<Dev> {
        let tmp = tempfile::tempdir()?;
        let data_dir = tmp.path().join("data");
        let mut dev = Dev::start_in_with(&data_dir, apply, &[], &["--allow-insecure-endpoints"])?;
        dev._tmp = Some(tmp);
        Ok(dev)
    }

    /// Like [`Dev::start_in_with_env`], with extra command-line arguments for `provisioning dev`.
    pub fn start_in_with(data_dir: &Path, apply: &[&str], env: &[(&str, &str)], args: &[&str]) -> Result<Dev> {
        Dev::start_binary_in(&provisioning_bin(), data_dir, apply, env, args)
    }

    /// Like [`Dev::start_in_with`], running `binary` instead of the `provisioning` this workspace
    /// built (the previous release's, for the upgrade and rollback test).
    pub fn start_binary_in(binary: &Path, data_dir: &Path, apply: &[&str], env: &[(&str, &str)], args: &[&str]) -> Result<Dev> {
        std::fs::create_dir_all(data_dir)?;
        let kubeconfig = data_dir.join("kubeconfig");
        let _ = std::fs::remove_file(&kubeconfig);
        let log_path = data_dir.join(format!("dev-{}.log", std::process::id()));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let mut cmd = Command::new(binary);
        cmd.current_dir(workspace_root())
            .arg("dev")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for a in apply {
            cmd.arg("--apply").arg(workspace_root().join(a));
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        let child = cmd.spawn().context("spawn provisioning dev")?;
        let mut dev = Dev { child: Some(child), controller: None, data_dir: data_dir.to_path_buf(), _tmp: None, log_path };
        dev.wait_until(Duration::from_secs(60), "kubeconfig written", |d| Ok(d.data_dir.join("kubeconfig").exists()))?;
        // The API answers once discovery of our group serves every kind (`provisioning dev`
        // applies the CRDs after writing the kubeconfig; a test applying a Cluster right after
        // only Servers were served met "no matches for kind Cluster").
        dev.wait_until(Duration::from_secs(60), "API serving provisioning.dev", |d| Ok(every_kind_served(d)))?;
        // `--apply` runs after the API is up: tests start only once every object is there
        // (a test's first kubectl could otherwise run before its Namespace exists).
        if !apply.is_empty() {
            dev.wait_until(Duration::from_secs(120), "the --apply manifests applied", |d| {
                Ok(d.log().contains(" object(s); Ctrl-C to stop"))
            })?;
        }
        Ok(dev)
    }

    /// The control plane of `provisioning dev` as two processes on `data_dir` (reused across
    /// restarts): `provisioning apiserver`, the CRDs applied as `provisioning dev` installs
    /// them, and `provisioning controller` with its provider state in `data_dir/providers` (where
    /// `provisioning dev` keeps it), both logging to one file.
    pub fn start_split_in(data_dir: &Path) -> Result<Dev> {
        let mut dev = Dev::start_apiserver_in(data_dir)?;
        dev.start_controller()?;
        dev.wait_until(Duration::from_secs(60), "API serving provisioning.dev", |d| Ok(every_kind_served(d)))?;
        Ok(dev)
    }

    /// The API server of [`Dev::start_split_in`] with the CRDs applied and no controller (a
    /// test starts its own, e.g. several sharded replicas).
    pub fn start_apiserver_in(data_dir: &Path) -> Result<Dev> {
        std::fs::create_dir_all(data_dir)?;
        let kubeconfig = data_dir.join("kubeconfig");
        let _ = std::fs::remove_file(&kubeconfig);
        let log_path = data_dir.join(format!("dev-{}.log", std::process::id()));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let child = Command::new(provisioning_bin())
            .current_dir(workspace_root())
            .arg("apiserver")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn provisioning apiserver")?;
        let mut dev = Dev { child: Some(child), controller: None, data_dir: data_dir.to_path_buf(), _tmp: None, log_path };
        dev.wait_until(Duration::from_secs(60), "kubeconfig written", |d| Ok(d.data_dir.join("kubeconfig").exists()))?;
        let crds = data_dir.join("crds.yaml");
        std::fs::write(&crds, provisioning_ok(&["crds"])?)?;
        let crds = crds.display().to_string();
        dev.wait_until(Duration::from_secs(60), "the CRDs applied", |d| {
            Ok(d.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crds]).map(|o| o.status.success()).unwrap_or(false))
        })?;
        dev.kubectl_ok(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"])?;
        Ok(dev)
    }

    /// The log file both processes of the two-process form write to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Starts `provisioning controller` against this control plane (two-process form).
    pub fn start_controller(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path)?;
        let child = Command::new(provisioning_bin())
            .current_dir(workspace_root())
            .arg("controller")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--state-dir")
            .arg(self.data_dir.join("providers"))
            .arg("--no-leader-election")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn provisioning controller")?;
        self.controller = Some(child);
        Ok(())
    }

    /// Kills the controller's own process with SIGKILL (two-process form); the API server
    /// keeps running.
    pub fn kill9_controller(&mut self) {
        if let Some(mut child) = self.controller.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The kubeconfig path.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("kubeconfig")
    }

    /// Runs kubectl against this control plane.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Ok(kubectl_command(&self.kubeconfig()).args(args).output()?)
    }

    /// Runs kubectl and fails unless it succeeds; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            // A NotFound that should not happen: repeat once at -v=6 so the report shows the
            // requests kubectl made and what the server answered.
            let trace = if stderr.contains("NotFound") {
                let mut verbose = vec!["-v=6"];
                verbose.extend_from_slice(args);
                self.kubectl(&verbose).map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default()
            } else {
                String::new()
            };
            bail!(
                "kubectl {args:?} failed: {}{stderr}\n{trace}\n--- dev log tail ---\n{}",
                String::from_utf8_lossy(&out.stdout),
                self.log_tail(40)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Polls `check` until it returns true or the deadline passes.
    pub fn wait_until(&mut self, deadline: Duration, what: &str, mut check: impl FnMut(&Dev) -> Result<bool>) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("provisioning dev exited ({status}) while waiting for {what}\n{}", self.log_tail(60));
            }
            if let Some(child) = self.controller.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("provisioning controller exited ({status}) while waiting for {what}\n{}", self.log_tail(60));
            }
            if check(self)? {
                return Ok(());
            }
            if start.elapsed() > deadline {
                bail!("timed out after {deadline:?} waiting for {what}\n--- dev log tail ---\n{}", self.log_tail(60));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The last lines of the process's output.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Kills the process (both, in the two-process form) with SIGKILL (no cleanup), keeping
    /// the data dir.
    pub fn kill9(&mut self) {
        self.kill9_controller();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops `provisioning dev` the way it stops cleanly (SIGINT: Ctrl-C; its controller
    /// finishes, the API server shuts down) and waits for it to exit; an error when it is still
    /// running after `deadline` (it is killed then) or exits with a failure.
    pub fn interrupt(&mut self, deadline: Duration) -> Result<()> {
        let Some(mut child) = self.child.take() else { bail!("provisioning dev is not running") };
        let _ = Command::new("kill").arg("-INT").arg(child.id().to_string()).status();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                // 130: the exit code `provisioning dev` gives for Ctrl-C.
                if status.success() || status.code() == Some(130) {
                    return Ok(());
                }
                bail!("provisioning dev exited with {status} on SIGINT\n{}", self.log_tail(40));
            }
            if start.elapsed() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("provisioning dev still running {deadline:?} after SIGINT (killed)\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the process (the controller first, in the two-process form) gracefully (SIGTERM,
    /// then SIGKILL after 10 s).
    pub fn stop(&mut self) {
        let processes = [self.controller.take(), self.child.take()];
        for mut child in processes.into_iter().flatten() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A machine alive at the simulated provider, as its journal records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedMachine {
    /// The machine's id at the provider.
    pub id: String,
    /// Its tags (`provisioning.dev/server-uid`, `provisioning.dev/namespace`, …).
    pub tags: std::collections::BTreeMap<String, String>,
}

/// Machines alive in the simulated provider's journals (`simulated-*.jsonl`) under `data_dir`:
/// an oracle the controller does not compute (creates minus deletes, by machine id). A torn
/// line (a writer killed mid-write) is skipped, as the provider's own store skips it.
pub fn simulated_machines(data_dir: &Path) -> Result<Vec<SimulatedMachine>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() { walk(&p, out) } else { out.push(p) }
        }
    }
    let mut files = Vec::new();
    walk(data_dir, &mut files);
    let mut alive = std::collections::BTreeMap::new();
    for entry in files {
        if entry.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("simulated-") && n.ends_with(".jsonl")) {
            for line in std::fs::read_to_string(&entry)?.lines() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
                match v["op"].as_str() {
                    Some("create") => {
                        let id = v["machine"]["id"].as_str().unwrap_or_default().to_string();
                        let tags = v["machine"]["tags"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect();
                        alive.insert(id.clone(), SimulatedMachine { id, tags });
                    }
                    Some("delete") => {
                        alive.remove(v["id"].as_str().unwrap_or_default());
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(alive.into_values().collect())
}

/// A control-plane endpoint (load balancer, floating IP) alive at the simulated provider, as
/// its journal records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedEndpoint {
    /// The endpoint's id at the provider.
    pub id: String,
    /// `LoadBalancer` or `FloatingIp`.
    pub kind: String,
    /// Its address.
    pub address: String,
    /// The machine ids it points at.
    pub targets: Vec<String>,
    /// Its tags (`provisioning.dev/cluster-uid`, …).
    pub tags: std::collections::BTreeMap<String, String>,
}

/// The simulated provider's journal files under `data_dir`.
fn simulated_journals(data_dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() { walk(&p, out) } else { out.push(p) }
        }
    }
    let mut files = Vec::new();
    walk(data_dir, &mut files);
    files.retain(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("simulated-") && n.ends_with(".jsonl")));
    files
}

/// Endpoints alive in the simulated provider's journals under `data_dir` (each one's latest
/// state, minus the deleted): an oracle the controller does not compute.
pub fn simulated_endpoints(data_dir: &Path) -> Result<Vec<SimulatedEndpoint>> {
    let mut alive = std::collections::BTreeMap::new();
    for file in simulated_journals(data_dir) {
        for line in std::fs::read_to_string(&file)?.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            match v["op"].as_str() {
                Some("endpoint") => {
                    let e = &v["endpoint"];
                    let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                    let endpoint = SimulatedEndpoint {
                        id: text("id"),
                        kind: text("kind"),
                        address: text("address"),
                        targets: e["targets"].as_array().into_iter().flatten().filter_map(|t| t.as_str().map(str::to_string)).collect(),
                        tags: e["tags"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect(),
                    };
                    alive.insert(endpoint.id.clone(), endpoint);
                }
                Some("endpoint-delete") => {
                    alive.remove(v["id"].as_str().unwrap_or_default());
                }
                _ => {}
            }
        }
    }
    Ok(alive.into_values().collect())
}

/// Deletes machine `id` at the simulated provider behind the controller's back (as if someone
/// removed it in the cloud console): appends its deletion to the journal that created it.
pub fn simulated_delete_out_of_band(data_dir: &Path, id: &str) -> Result<()> {
    use std::io::Write as _;
    for file in simulated_journals(data_dir) {
        if std::fs::read_to_string(&file)?.contains(&format!("\"id\":\"{id}\"")) {
            let mut f = std::fs::OpenOptions::new().append(true).open(&file)?;
            f.write_all(format!("{}\n", serde_json::json!({"op": "delete", "id": id})).as_bytes())?;
            return Ok(());
        }
    }
    anyhow::bail!("no simulated journal under {} has machine {id}", data_dir.display())
}

/// How many machines are alive in the simulated provider's journals under `data_dir`.
pub fn simulated_machines_alive(data_dir: &Path) -> Result<usize> {
    Ok(simulated_machines(data_dir)?.len())
}

/// Whether kubectl finds every kind of the group (discovery and list), as a test's first
/// `kubectl apply` needs.
fn every_kind_served(dev: &Dev) -> bool {
    dev.kubectl(&["get", "workspaces,servers,taskservs,clusters,changerecords", "-A"]).map(|o| o.status.success()).unwrap_or(false)
}
