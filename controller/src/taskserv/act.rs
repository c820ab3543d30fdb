//! Act: script runs as tracked background tasks.
//!
//! A reconcile never waits for a script. It registers the run in [`ScriptRuns`] (so a second
//! reconcile of the same object does not start it again), spawns it under the cluster's or
//! workspace's semaphore, and returns. When the run ends its [`OperationResult`] is parked in
//! the tracker and the object is queued for reconcile (a [`crate::reconcile::Trigger`]);
//! that reconcile records it in status.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use provisioning_crds::{ScriptRun, TaskServ};
use provisioning_providers::{ExecRequest, ProviderId, SharedProvider, SshPrivateKey};
use provisioning_taskservs::{
    ExecOutput, Redactor, RunError, ScriptContext, ScriptExecutor, ScriptOutcome, ScriptPaths, ScriptStep, run_script_redacted,
};

use super::plan::{Operation, OperationResult, rfc3339};

/// Identity of a TaskServ for the tracker: `namespace/name/uid` (a re-created object with the
/// same name never sees the runs of its predecessor).
pub type TaskServKey = String;

#[derive(Default)]
struct RunsState {
    in_flight: HashMap<TaskServKey, BTreeMap<String, Operation>>,
    results: HashMap<TaskServKey, Vec<OperationResult>>,
    last_check: HashMap<(TaskServKey, String), Instant>,
}

/// In-memory registry of script runs in flight and of finished runs not yet recorded.
#[derive(Default)]
pub struct ScriptRuns {
    state: Mutex<RunsState>,
}

impl ScriptRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Operations running now for `key`, by server.
    pub fn in_flight(&self, key: &str) -> BTreeMap<String, Operation> {
        self.lock().in_flight.get(key).cloned().unwrap_or_default()
    }

    /// Finished operations not yet recorded.
    pub fn results(&self, key: &str) -> Vec<OperationResult> {
        self.lock().results.get(key).cloned().unwrap_or_default()
    }

    /// Forgets the first `n` results of `key` (after their status patch succeeded).
    pub fn acknowledge(&self, key: &str, n: usize) {
        let mut s = self.lock();
        if let Some(r) = s.results.get_mut(key) {
            r.drain(..n.min(r.len()));
            if r.is_empty() {
                s.results.remove(key);
            }
        }
    }

    /// Registers a run; false when one is already running on that server.
    pub fn start(&self, key: &str, server: &str, op: &Operation) -> bool {
        let mut s = self.lock();
        let runs = s.in_flight.entry(key.to_string()).or_default();
        if runs.contains_key(server) {
            return false;
        }
        runs.insert(server.to_string(), op.clone());
        true
    }

    /// Frees the server's slot of a run that never started (its preparation is retried by a
    /// later reconcile); records no result.
    pub fn release(&self, key: &str, server: &str) {
        let mut s = self.lock();
        if let Some(runs) = s.in_flight.get_mut(key) {
            runs.remove(server);
            if runs.is_empty() {
                s.in_flight.remove(key);
            }
        }
    }

    /// Records the end of a run.
    pub fn finish(&self, key: &str, result: OperationResult) {
        let mut s = self.lock();
        if let Some(runs) = s.in_flight.get_mut(key) {
            runs.remove(&result.server);
            if runs.is_empty() {
                s.in_flight.remove(key);
            }
        }
        if matches!(result.operation, Operation::Check | Operation::Install { .. }) {
            s.last_check.insert((key.to_string(), result.server.clone()), Instant::now());
        }
        s.results.entry(key.to_string()).or_default().push(result);
    }

    /// Servers (of `installed`) whose last check is older than `interval` (or never ran).
    pub fn checks_due(&self, key: &str, installed: impl IntoIterator<Item = String>, interval: Duration) -> BTreeSet<String> {
        let s = self.lock();
        installed
            .into_iter()
            .filter(|server| s.last_check.get(&(key.to_string(), server.clone())).is_none_or(|t| t.elapsed() >= interval))
            .collect()
    }

    /// Forgets everything about `key` (the object is gone).
    pub fn forget(&self, key: &str) {
        let mut s = self.lock();
        s.in_flight.remove(key);
        s.results.remove(key);
        s.last_check.retain(|(k, _), _| k != key);
    }

    /// Number of runs in flight across all objects.
    pub fn total_in_flight(&self) -> usize {
        self.lock().in_flight.values().map(BTreeMap::len).sum()
    }
}

/// Runs commands on a machine through its provider's `exec` (Docker exec, SSH).
pub struct ProviderExecutor {
    /// The machine's provider.
    pub provider: SharedProvider,
    /// The machine.
    pub id: ProviderId,
    /// The uid of the Server the machine must belong to (checked on every exec).
    pub server_uid: String,
    /// When set, the command runs under `flock` on this file: a run left behind by a killed
    /// controller (a Docker exec outlives its client) finishes before the same step starts again.
    /// `-o`: daemons the script starts must not inherit (and hold) the lock.
    pub lock_file: Option<String>,
    /// SSH machines: the Server's own login key (`spec.sshKeySecretRef`) instead of the account's.
    pub ssh_key: Option<SshPrivateKey>,
    /// Where `nu` and the catalog are on the machine.
    pub paths: ScriptPaths,
}

#[async_trait::async_trait]
impl ScriptExecutor for ProviderExecutor {
    async fn exec(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
        timeout: Duration,
        output: Option<tokio::sync::mpsc::Sender<String>>,
    ) -> Result<ExecOutput, RunError> {
        let argv = match &self.lock_file {
            Some(lock) => {
                let mut wrapped =
                    vec!["flock".to_string(), "-o".to_string(), "-w".to_string(), timeout.as_secs().to_string(), lock.clone()];
                wrapped.extend(argv);
                wrapped
            }
            None => argv,
        };
        // The provider's sink never waits on the queue: a full one drops (and counts) lines.
        let output = output.map(provisioning_providers::OutputSink::new);
        let request = ExecRequest { argv, stdin: Some(stdin), env: BTreeMap::new(), timeout, output, ssh_key: self.ssh_key.clone() };
        let result = self.provider.exec_owned(&self.id, &self.server_uid, request).await.map_err(|e| RunError::Executor(e.to_string()))?;
        Ok(ExecOutput { exit_code: result.exit_code, timed_out: result.timed_out, stdout: result.stdout, stderr: result.stderr })
    }

    fn script_paths(&self) -> ScriptPaths {
        self.paths.clone()
    }
}

/// One script run's inputs.
pub struct RunRequest {
    /// Which TaskServ (for the trigger and the tracker).
    pub object: ObjectRef<TaskServ>,
    /// Tracker key.
    pub key: TaskServKey,
    /// Server name.
    pub server: String,
    /// What to run.
    pub operation: Operation,
    /// The script context (templates rendered).
    pub context: ScriptContext,
    /// Where to run it.
    pub executor: ProviderExecutor,
    /// Time limit per script.
    pub timeout: Duration,
    /// Filters the secret values of the context from the output (logs, tail, events).
    pub redactor: Redactor,
    /// The config inputs version the context carries (recorded with the result).
    pub inputs_hash: Option<String>,
}

fn script_run(outcome: &Result<ScriptOutcome, RunError>, step: ScriptStep, started: String) -> (ScriptRun, String) {
    match outcome {
        Ok(o) => (
            ScriptRun {
                script: step.as_str().to_string(),
                started_at: Some(rfc3339(k8s_openapi::jiff::Timestamp::from_second(o.started_at.timestamp()).unwrap_or_default())),
                finished_at: Some(rfc3339(k8s_openapi::jiff::Timestamp::from_second(o.finished_at.timestamp()).unwrap_or_default())),
                exit_code: o.exit_code.map(|c| c as i32),
                output_tail: Some(o.output_tail.clone()),
            },
            o.summary(),
        ),
        Err(e) => (
            ScriptRun {
                script: step.as_str().to_string(),
                started_at: Some(started),
                finished_at: Some(rfc3339(k8s_openapi::jiff::Timestamp::now())),
                exit_code: None,
                // The error may quote what the machine sent (an SSH algorithm list): bounded.
                output_tail: Some(crate::conditions::truncate(&e.to_string(), provisioning_taskservs::TAIL_BYTES)),
            },
            crate::conditions::truncate(&e.to_string(), provisioning_taskservs::TAIL_BYTES),
        ),
    }
}

async fn run_step(req: &RunRequest, step: ScriptStep) -> Result<ScriptOutcome, RunError> {
    // Bounded: when logging is slower than the machine, the runner drops and counts lines
    // instead of queueing them (they are escaped before they get here).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(provisioning_taskservs::OUTPUT_QUEUE);
    let server = req.server.clone();
    let service = req.context.taskserv.service.clone();
    let object = req.object.to_string();
    // Output lines stream to the logs as they come.
    let logger = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            tracing::info!(taskserv = %object, server = %server, service = %service, step = %step, "{line}");
        }
    });
    let outcome =
        run_script_redacted(&req.executor, step, &req.context.taskserv.service, &req.context, req.timeout, Some(tx), &req.redactor).await;
    let _ = logger.await;
    // A secret result (a built Kubernetes cluster's kubeconfig) goes to its Cluster only.
    if let Ok(o) = &outcome
        && o.succeeded()
        && let Some(secret) = &o.secret
        && req.context.taskserv.service == crate::cluster::stages::KUBERNETES
    {
        crate::cluster::kubeconfig::offer(req.object.namespace.as_deref().unwrap_or_default(), &req.object.name, &req.server, secret);
    }
    outcome
}

/// Runs one operation to its end and returns what goes into status.
pub async fn run_operation(req: &RunRequest) -> OperationResult {
    let started = rfc3339(k8s_openapi::jiff::Timestamp::now());
    match &req.operation {
        Operation::Install { .. } => {
            let install = run_step(req, ScriptStep::Install).await;
            let install_ok = install.as_ref().is_ok_and(ScriptOutcome::succeeded);
            let (mut run, mut message) = script_run(&install, ScriptStep::Install, started.clone());
            let mut healthy = None;
            if install_ok {
                let check = run_step(req, ScriptStep::Check).await;
                let ok = check.as_ref().is_ok_and(ScriptOutcome::succeeded);
                healthy = Some(ok);
                if !ok {
                    let (check_run, check_message) = script_run(&check, ScriptStep::Check, started);
                    // The install's start, the check's end and output: what failed is visible.
                    run.finished_at = check_run.finished_at;
                    run.exit_code = check_run.exit_code;
                    run.output_tail = check_run.output_tail;
                    message = format!("installed, but the health check failed: {check_message}");
                }
            }
            OperationResult {
                server: req.server.clone(),
                operation: req.operation.clone(),
                run,
                succeeded: install_ok && healthy == Some(true),
                healthy,
                message,
                inputs_hash: req.inputs_hash.clone(),
                drifted_files: Vec::new(),
            }
        }
        Operation::Check => {
            let check = run_step(req, ScriptStep::Check).await;
            let ok = check.as_ref().is_ok_and(ScriptOutcome::succeeded);
            let (run, message) = script_run(&check, ScriptStep::Check, started);
            OperationResult {
                server: req.server.clone(),
                operation: Operation::Check,
                run,
                succeeded: ok,
                healthy: Some(ok),
                message,
                inputs_hash: req.inputs_hash.clone(),
                drifted_files: check.as_ref().map(ScriptOutcome::drifted_files).unwrap_or_default(),
            }
        }
        Operation::Remove => {
            let remove = run_step(req, ScriptStep::Remove).await;
            let ok = remove.as_ref().is_ok_and(ScriptOutcome::succeeded);
            let (run, message) = script_run(&remove, ScriptStep::Remove, started);
            OperationResult {
                server: req.server.clone(),
                operation: Operation::Remove,
                run,
                succeeded: ok,
                healthy: None,
                message,
                inputs_hash: req.inputs_hash.clone(),
                drifted_files: Vec::new(),
            }
        }
    }
}

/// A result for an operation that could not even start (no provider, template error…).
pub fn failed_to_start(server: &str, operation: &Operation, message: String) -> OperationResult {
    let now = rfc3339(k8s_openapi::jiff::Timestamp::now());
    OperationResult {
        server: server.to_string(),
        operation: operation.clone(),
        run: ScriptRun {
            script: operation.script().to_string(),
            started_at: Some(now.clone()),
            finished_at: Some(now),
            exit_code: None,
            output_tail: Some(message.clone()),
        },
        succeeded: false,
        healthy: if *operation == Operation::Check { Some(false) } else { None },
        message,
        inputs_hash: None,
        drifted_files: Vec::new(),
    }
}
