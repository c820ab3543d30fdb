//! The runner: each step is a fresh `nu` process that reads the context as JSON on stdin and
//! reports its result on its last stdout line.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc::{Sender, channel, error::TrySendError};

use crate::context::ScriptContext;
use crate::error::RunError;
use crate::manifest::is_valid_service_name;
use crate::redact::Redactor;

/// Prefix of the stdout line carrying a script's JSON result (see `lib/ctx.nu` `emit-result`).
pub const RESULT_MARKER: &str = "PROVISIONING_RESULT ";
/// Prefix of the stdout line carrying a script's secret result (a built cluster's admin
/// kubeconfig): never forwarded, never in the tail, logs, status or events — the line is
/// replaced by [`SECRET_WITHHELD`] wherever output goes — and parsed into
/// [`ScriptOutcome::secret`], whose `Debug` prints nothing of it.
pub const SECRET_MARKER: &str = "PROVISIONING_SECRET ";
/// What output shows instead of a [`SECRET_MARKER`] line.
pub const SECRET_WITHHELD: &str = "[provisioning] a secret result line was withheld from the output";
/// How many lines of output the tail keeps.
pub const TAIL_LINES: usize = 20;
/// How many bytes of output the tail keeps.
pub const TAIL_BYTES: usize = 4096;
/// Upper bound of stdout/stderr kept whole by [`LocalProcessExecutor`].
const MAX_CAPTURE_BYTES: usize = 128 << 10;
/// The longest result line parsed (`PROVISIONING_RESULT …`); a longer one is a result error,
/// never decoded (a hostile machine could otherwise make a run decode megabytes of JSON).
pub const RESULT_CAP: usize = 64 << 10;
/// The most values (objects, arrays, scalars) a result is decoded into: a result is a few
/// facts (a version, a drift flag and file names), and a 64 KiB line of tiny objects would
/// otherwise decode to about 90 times its size.
pub const RESULT_NODES: usize = 1024;
/// Lines queued between the executor, the runner and the caller (each queue drops lines
/// and counts them when its reader falls behind: a machine may flood output).
pub const OUTPUT_QUEUE: usize = 1024;
/// A streamed line longer than this is cut ([`LocalProcessExecutor`]; the providers cut at
/// the same length).
const LINE_CAP: usize = 64 << 10;
/// How long the runner waits beyond the timeout for an executor to return.
const EXECUTOR_GRACE: Duration = Duration::from_secs(30);

/// Which script of a service to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScriptStep {
    /// `install.nu`: converge to the requested version and config (idempotent).
    Install,
    /// `check.nu`: health; exit 0 when healthy.
    Check,
    /// `remove.nu`: idempotent uninstall.
    Remove,
}

impl ScriptStep {
    /// The script's file name.
    pub fn file_name(self) -> &'static str {
        match self {
            ScriptStep::Install => "install.nu",
            ScriptStep::Check => "check.nu",
            ScriptStep::Remove => "remove.nu",
        }
    }
    /// Lower-case name (for logs and metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            ScriptStep::Install => "install",
            ScriptStep::Check => "check",
            ScriptStep::Remove => "remove",
        }
    }
}

impl std::fmt::Display for ScriptStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where `nu` and the catalog are on the machine that runs the script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptPaths {
    /// The `nu` binary.
    pub nu: String,
    /// The catalog directory (holding `<service>/<step>.nu` and `lib/`).
    pub catalog_dir: String,
}

impl ScriptPaths {
    /// `nu` binary inside local containers (mounted read-only).
    pub const CONTAINER_NU: &'static str = "/usr/local/bin/nu";
    /// Catalog inside local containers (mounted read-only).
    pub const CONTAINER_CATALOG: &'static str = "/opt/provisioning/catalog";

    /// The layout of local containers: `/usr/local/bin/nu` and `/opt/provisioning/catalog`.
    pub fn container() -> Self {
        ScriptPaths { nu: Self::CONTAINER_NU.into(), catalog_dir: Self::CONTAINER_CATALOG.into() }
    }

    /// The argv running `step` of `service`:
    /// `[nu, --no-config-file, --no-std-lib, --stdin, <catalog>/<service>/<step>.nu]`.
    /// `--stdin` hands standard input (the context) to the script's `main`; `--no-std-lib`
    /// halves nu's start-up (catalog scripts use only `lib/`, never `use std`).
    pub fn argv(&self, service: &str, step: ScriptStep) -> Vec<String> {
        let catalog = self.catalog_dir.trim_end_matches('/');
        vec![
            self.nu.clone(),
            "--no-config-file".into(),
            "--no-std-lib".into(),
            "--stdin".into(),
            format!("{catalog}/{service}/{}", step.file_name()),
        ]
    }
}

/// What an executor reports about one command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code; `None` when killed or unknown.
    pub exit_code: Option<i64>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Standard output, whole (bounded by the executor).
    pub stdout: String,
    /// Standard error, whole (bounded by the executor).
    pub stderr: String,
}

/// Runs a command somewhere: a local process, `docker exec`, SSH. The controller adapts a
/// provider's `exec` to this trait.
#[async_trait::async_trait]
pub trait ScriptExecutor: Send + Sync {
    /// Runs `argv` (no shell involved), writes `stdin` then closes it, kills the command after
    /// `timeout` (reporting `timed_out`), and sends each output line (stdout and stderr) to
    /// `output` as it comes, never waiting for it (a full queue drops the line).
    async fn exec(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
        timeout: Duration,
        output: Option<Sender<String>>,
    ) -> Result<ExecOutput, RunError>;

    /// Where `nu` and the catalog are where this executor runs commands. The default is the
    /// local containers' layout ([`ScriptPaths::container`]).
    fn script_paths(&self) -> ScriptPaths {
        ScriptPaths::container()
    }
}

/// What one script run did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptOutcome {
    /// The service.
    pub service: String,
    /// The step.
    pub step: ScriptStep,
    /// Exit code; `None` when killed (timeout) or unknown.
    pub exit_code: Option<i64>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// The JSON after the last `PROVISIONING_RESULT ` line of stdout, if any.
    pub result: Option<Value>,
    /// Set when a result line was there but its JSON did not parse.
    pub result_error: Option<String>,
    /// The JSON after the last `PROVISIONING_SECRET ` line of stdout, if any (never
    /// serialized, never printed).
    #[serde(skip)]
    pub secret: Option<SecretResult>,
    /// The last lines of output (at most 20 lines and 4 KiB).
    pub output_tail: String,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: DateTime<Utc>,
}

/// A script's secret result (see [`SECRET_MARKER`]): its `Debug` says only that it is there.
#[derive(Clone, PartialEq)]
pub struct SecretResult(pub Value);

impl std::fmt::Debug for SecretResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretResult(<withheld>)")
    }
}

impl ScriptOutcome {
    /// Exit 0, not timed out, and no malformed result line.
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && self.result_error.is_none()
    }
    /// The `version` the script reported, if any.
    pub fn reported_version(&self) -> Option<&str> {
        self.result.as_ref()?.get("version")?.as_str()
    }
    /// The config files a check reported as changed since install (`configDrift: true` with
    /// `driftedFiles`, the catalog's lib/check.nu contract; the check exits 3 then). Bounded:
    /// at most 16 names of at most 256 characters, control characters escaped (the machine
    /// writes them; they reach status, events and logs).
    pub fn drifted_files(&self) -> Vec<String> {
        let Some(result) = self.result.as_ref() else { return Vec::new() };
        if result.get("configDrift").and_then(serde_json::Value::as_bool) != Some(true) {
            return Vec::new();
        }
        let mut files: Vec<String> = result
            .get("driftedFiles")
            .and_then(serde_json::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(serde_json::Value::as_str)
                    .take(16)
                    .map(|f| escape_controls(&f.chars().take(256).collect::<String>()).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if files.is_empty() {
            files.push("(unnamed config file)".into());
        }
        files
    }
    /// Wall-clock time of the run.
    pub fn duration(&self) -> Duration {
        (self.finished_at - self.started_at).to_std().unwrap_or_default()
    }
    /// One line for status and events: "install of etcd exited 3" / "timed out after …".
    pub fn summary(&self) -> String {
        let what = format!("{} of {}", self.step, self.service);
        match (self.timed_out, self.exit_code, &self.result_error) {
            (true, _, _) => format!("{what} timed out after {:.1?}", self.duration()),
            (false, Some(0), Some(err)) => {
                format!("{what} exited 0 but its result is malformed: {err}")
            }
            (false, Some(0), None) => format!("{what} succeeded"),
            (false, Some(code), _) => format!("{what} exited {code}"),
            (false, None, _) => format!("{what} was killed"),
        }
    }
}

/// Runs `step` of `service` through `exec`: a fresh `nu` process with `ctx` as JSON on stdin
/// (data, never part of the command line), killed after `timeout`. Output lines are forwarded
/// to `output` as they come; the outcome carries the exit code, the parsed result and the tail.
/// An `Err` means the script could not be run at all; a script that ran and failed is an `Ok`
/// outcome with `succeeded() == false`.
pub async fn run_script(
    exec: &dyn ScriptExecutor,
    step: ScriptStep,
    service: &str,
    ctx: &ScriptContext,
    timeout: Duration,
    output: Option<Sender<String>>,
) -> Result<ScriptOutcome, RunError> {
    run_script_redacted(exec, step, service, ctx, timeout, output, &Redactor::default()).await
}

/// [`run_script`] with every output line passed through `redactor` before it is forwarded
/// or kept in the tail (and the result-parse error, which quotes output, too): the values
/// it knows never leave the runner.
pub async fn run_script_redacted(
    exec: &dyn ScriptExecutor,
    step: ScriptStep,
    service: &str,
    ctx: &ScriptContext,
    timeout: Duration,
    output: Option<Sender<String>>,
    redactor: &Redactor,
) -> Result<ScriptOutcome, RunError> {
    if !is_valid_service_name(service) {
        return Err(RunError::InvalidService(service.to_string()));
    }
    let argv = exec.script_paths().argv(service, step);
    let stdin = serde_json::to_vec(ctx)?;

    // Tee the executor's lines: forward them and keep a tail.
    let tail = Arc::new(Mutex::new(OutputTail::default()));
    let (line_tx, mut line_rx) = channel::<String>(OUTPUT_QUEUE);
    let forwarder = {
        let tail = Arc::clone(&tail);
        let redactor = redactor.clone();
        tokio::spawn(async move {
            let mut forward = Forward::new(output);
            let mut incomplete = false;
            while let Some(line) = line_rx.recv().await {
                incomplete |= is_gap_notice(&line);
                let line = escape_controls(&redactor.redact(withhold_secret(&line))).into_owned();
                if let Ok(mut t) = tail.lock() {
                    t.push(&line);
                }
                forward.send(line);
            }
            forward.finish();
            incomplete
        })
    };

    let started_at = Utc::now();
    let result = tokio::time::timeout(timeout + EXECUTOR_GRACE, exec.exec(argv, stdin, timeout, Some(line_tx))).await;
    let finished_at = Utc::now();
    // The executor dropped its sender when it returned; give stragglers a moment.
    let incomplete = !matches!(tokio::time::timeout(Duration::from_secs(2), forwarder).await, Ok(Ok(false)));
    let exec_output = match result {
        Ok(out) => out?,
        Err(_) => return Err(RunError::ExecutorHung(timeout + EXECUTOR_GRACE)),
    };

    let mut output_tail = tail.lock().map(|t| t.render()).unwrap_or_default();
    let returned = !(exec_output.stdout.is_empty() && exec_output.stderr.is_empty());
    if output_tail.is_empty() || (incomplete && returned) {
        // The executor did not stream, or not all of it (a flood, the stream cap): build the
        // tail from what it returned, which ends where the command ended.
        let mut t = OutputTail::default();
        if incomplete {
            t.push("[provisioning] output was not streamed in full; its last lines:");
        }
        for line in exec_output.stdout.lines().chain(exec_output.stderr.lines()) {
            t.push(&escape_controls(&redactor.redact(withhold_secret(line))));
        }
        output_tail = t.render();
    }
    let (result, result_error) = match parse_result(&exec_output.stdout) {
        None => (None, None),
        Some(Ok(value)) => (Some(value), None),
        Some(Err(e)) => (None, Some(redactor.redact(&e))),
    };
    let secret = match parse_secret(&exec_output.stdout) {
        Some(Ok(value)) => Some(SecretResult(value)),
        Some(Err(e)) => {
            tracing::warn!(service, step = %step, "ignoring the secret result line: {e}");
            None
        }
        None => None,
    };
    Ok(ScriptOutcome {
        service: service.to_string(),
        step,
        exit_code: exec_output.exit_code,
        timed_out: exec_output.timed_out,
        result,
        result_error,
        secret,
        output_tail,
        started_at,
        finished_at,
    })
}

/// Whether an executor's line says that lines were left out of the stream (the providers'
/// notices: dropped lines, the stream cap).
fn is_gap_notice(line: &str) -> bool {
    line.starts_with("[provisioning] ") && (line.contains(" lines dropped") || line.contains("not streamed"))
}

/// Forwards lines to the caller's queue without waiting: a full queue drops the line and
/// counts it; the count is said before the next line that fits, and logged at the end.
struct Forward {
    out: Option<Sender<String>>,
    unreported: u64,
    dropped: u64,
}

impl Forward {
    fn new(out: Option<Sender<String>>) -> Self {
        Forward { out, unreported: 0, dropped: 0 }
    }

    fn send(&mut self, line: String) {
        let Some(out) = &self.out else { return };
        if self.unreported > 0 {
            match out.try_send(format!("[provisioning] {} output lines dropped: the log could not keep up", self.unreported)) {
                Ok(()) => self.unreported = 0,
                Err(TrySendError::Closed(_)) => return,
                Err(TrySendError::Full(_)) => {
                    self.unreported += 1;
                    self.dropped += 1;
                    return;
                }
            }
        }
        if let Err(TrySendError::Full(_)) = out.try_send(line) {
            self.unreported += 1;
            self.dropped += 1;
        }
    }

    fn finish(self) {
        if let Some(out) = &self.out
            && self.unreported > 0
        {
            let _ = out.try_send(format!("[provisioning] {} output lines dropped: the log could not keep up", self.unreported));
        }
        if self.dropped > 0 {
            tracing::warn!(dropped = self.dropped, "script output lines were dropped: the log could not keep up");
        }
    }
}

/// `text` with every control character (but tab), DEL, C1 control and bidirectional
/// formatting character written as `\u{..}`: output never moves a terminal's cursor,
/// recolours it or reorders what a log reader sees. Idempotent (what it writes is printable).
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        (c.is_control() && c != '\t') || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `line`, or [`SECRET_WITHHELD`] when it is a secret result line.
fn withhold_secret(line: &str) -> &str {
    if line.trim_start().starts_with(SECRET_MARKER.trim_end()) { SECRET_WITHHELD } else { line }
}

/// The JSON of the last `PROVISIONING_SECRET ` line of `stdout`, if there is one. Its errors
/// never quote the line.
pub fn parse_secret(stdout: &str) -> Option<Result<Value, String>> {
    let line = stdout.lines().rev().find_map(|l| l.trim_end_matches('\r').strip_prefix(SECRET_MARKER))?;
    if line.len() > RESULT_CAP {
        return Some(Err(format!("the secret result line is {} bytes, more than the limit of {RESULT_CAP}", line.len())));
    }
    if json_nodes(line) > RESULT_NODES {
        return Some(Err(format!("the secret result has more than {RESULT_NODES} values")));
    }
    Some(serde_json::from_str(line.trim()).map_err(|e| format!("the secret result is not JSON (line {}, column {})", e.line(), e.column())))
}

/// The JSON of the last `PROVISIONING_RESULT ` line of `stdout`, if there is one.
pub fn parse_result(stdout: &str) -> Option<Result<Value, String>> {
    let line = stdout.lines().rev().find_map(|l| l.trim_end_matches('\r').strip_prefix(RESULT_MARKER))?;
    if line.len() > RESULT_CAP {
        return Some(Err(format!("the result line is {} bytes, more than the limit of {RESULT_CAP}", line.len())));
    }
    let nodes = json_nodes(line);
    if nodes > RESULT_NODES {
        return Some(Err(format!("the result has about {nodes} values, more than the limit of {RESULT_NODES}")));
    }
    Some(serde_json::from_str(line.trim()).map_err(|e| format!("{e} in {:?}", truncate(line, 200))))
}

/// An upper bound of the values `json` decodes to, counted without decoding: one more than
/// its separators and openings outside strings.
fn json_nodes(json: &str) -> usize {
    let (mut nodes, mut in_string, mut escaped) = (1usize, false, false);
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b'[' | b'{' | b':' => nodes += 1,
            _ => {}
        }
    }
    nodes
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The last lines of output, bounded in lines and bytes.
#[derive(Default)]
struct OutputTail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl OutputTail {
    fn push(&mut self, line: &str) {
        let line = if line.len() > TAIL_BYTES { &line[line.len() - tail_cut(line, TAIL_BYTES)..] } else { line };
        self.bytes += line.len() + 1;
        self.lines.push_back(line.to_string());
        while self.lines.len() > TAIL_LINES || (self.bytes > TAIL_BYTES && self.lines.len() > 1) {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.len() + 1;
            }
        }
    }
    fn render(&self) -> String {
        self.lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

/// Length of the longest suffix of `s` of at most `max` bytes that starts at a char boundary.
fn tail_cut(s: &str, max: usize) -> usize {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s.len() - start
}

/// Runs argv as a local process (tests, benchmarks, and running scripts on this machine).
/// The process gets its own process group so a timeout kills whatever it started too.
#[derive(Clone, Debug)]
pub struct LocalProcessExecutor {
    paths: ScriptPaths,
    env: Vec<(String, String)>,
}

impl LocalProcessExecutor {
    /// An executor whose scripts are `<catalog_dir>/<service>/<step>.nu` run by `nu`.
    pub fn new(nu: impl Into<String>, catalog_dir: impl Into<String>) -> Self {
        LocalProcessExecutor { paths: ScriptPaths { nu: nu.into(), catalog_dir: catalog_dir.into() }, env: Vec::new() }
    }

    /// Adds an environment variable for every command.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

#[async_trait::async_trait]
impl ScriptExecutor for LocalProcessExecutor {
    async fn exec(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
        timeout: Duration,
        output: Option<Sender<String>>,
    ) -> Result<ExecOutput, RunError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(RunError::Executor("empty argv".into()));
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| RunError::Spawn { program: program.clone(), source })?;
        let pid = child.id();

        let mut child_stdin = child.stdin.take();
        let writer = tokio::spawn(async move {
            if let Some(pipe) = child_stdin.as_mut() {
                // A script that exits without reading its stdin is not an error of ours.
                let _ = pipe.write_all(&stdin).await;
                let _ = pipe.shutdown().await;
            }
            drop(child_stdin);
        });
        let stdout = child.stdout.take().map(|pipe| tokio::spawn(read_lines(pipe, output.clone())));
        let stderr = child.stderr.take().map(|pipe| tokio::spawn(read_lines(pipe, output)));

        let (status, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => (Some(status?), false),
            Err(_) => {
                kill_group(pid);
                let _ = child.kill().await;
                (None, true)
            }
        };
        writer.abort();
        // A daemon started by the script may hold the pipes open: don't wait for it forever.
        let collect = |task: Option<tokio::task::JoinHandle<String>>| async move {
            match task {
                Some(mut task) => match tokio::time::timeout(Duration::from_secs(2), &mut task).await {
                    Ok(Ok(text)) => text,
                    _ => {
                        task.abort();
                        String::new()
                    }
                },
                None => String::new(),
            }
        };
        let stdout = collect(stdout).await;
        let stderr = collect(stderr).await;
        Ok(ExecOutput { exit_code: if timed_out { None } else { status.and_then(|s| s.code()).map(i64::from) }, timed_out, stdout, stderr })
    }

    fn script_paths(&self) -> ScriptPaths {
        self.paths.clone()
    }
}

/// SIGKILL to the whole process group the command leads.
fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    // The group may already be gone; nothing to do then.
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// Reads lines (lossy UTF-8, cut at [`LINE_CAP`]), forwards each without waiting (a full
/// queue drops it), and returns the whole text (bounded).
async fn read_lines(pipe: impl AsyncRead + Unpin, output: Option<Sender<String>>) -> String {
    let mut reader = BufReader::new(pipe);
    let mut whole = String::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader).take(LINE_CAP as u64).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if buf.last() != Some(&b'\n') && buf.len() == LINE_CAP {
                    // Cut: skip the rest of the line, a bounded read at a time.
                    let mut rest = Vec::new();
                    while let Ok(1..) = (&mut reader).take(LINE_CAP as u64).read_until(b'\n', &mut rest).await {
                        if rest.last() == Some(&b'\n') {
                            break;
                        }
                        rest.clear();
                    }
                }
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                if let Some(out) = &output {
                    let _ = out.try_send(line.to_string());
                }
                if whole.len() + line.len() < MAX_CAPTURE_BYTES {
                    whole.push_str(line);
                    whole.push('\n');
                }
            }
        }
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_of_too_many_values_is_an_error_never_decoded() {
        let maps = format!("{RESULT_MARKER}[{}{{\"\":0}}]\n", "{\"\":0},".repeat(2000));
        assert!(maps.len() < RESULT_CAP);
        let parsed = parse_result(&maps);
        assert!(matches!(&parsed, Some(Err(e)) if e.contains("values, more than the limit")), "{parsed:?}");
        // Separators inside strings are not values.
        let text = format!("{RESULT_MARKER}{{\"version\":\"{}\"}}\n", ",[{:".repeat(5000));
        assert!(matches!(parse_result(&text), Some(Ok(_))));
        assert_eq!(json_nodes(r#"{"a":[1,2],"b":"x,y\",z"}"#), 7);
    }

    #[test]
    fn a_result_line_over_the_cap_is_an_error_never_decoded() {
        let huge = format!("{RESULT_MARKER}[{}0]\n", "0,".repeat(RESULT_CAP));
        let parsed = parse_result(&huge);
        assert!(matches!(&parsed, Some(Err(e)) if e.contains("more than the limit")), "{parsed:?}");
        assert!(matches!(parse_result(&format!("{RESULT_MARKER}{{\"ok\":1}}\n")), Some(Ok(_))));
    }

    #[test]
    fn the_last_result_line_wins() {
        let out = "PROVISIONING_RESULT {\"a\":1}\nnoise\nPROVISIONING_RESULT {\"a\":2}\r\ntrailing\n";
        assert_eq!(parse_result(out), Some(Ok(serde_json::json!({"a": 2}))));
        assert_eq!(parse_result("no marker\n"), None);
        assert!(matches!(parse_result("PROVISIONING_RESULT {oops"), Some(Err(_))));
    }

    /// Floods the runner with lines, as a compromised machine can, and ends.
    struct Flood;

    #[async_trait::async_trait]
    impl ScriptExecutor for Flood {
        async fn exec(&self, _: Vec<String>, _: Vec<u8>, _: Duration, output: Option<Sender<String>>) -> Result<ExecOutput, RunError> {
            let Some(output) = output else { return Err(RunError::Executor("no output queue".into())) };
            for i in 0..200_000 {
                // What providers do: never wait for the reader.
                let _ = output.try_send(format!("\x1b]0;owned\x07line {i}"));
            }
            Ok(ExecOutput { exit_code: Some(0), timed_out: false, stdout: String::new(), stderr: String::new() })
        }
    }

    #[tokio::test]
    async fn a_reader_that_never_drains_holds_at_most_its_queue() -> Result<(), RunError> {
        let (tx, mut rx) = channel(8);
        let ctx = ScriptContext::default();
        let outcome = run_script(&Flood, ScriptStep::Install, "echo", &ctx, Duration::from_secs(30), Some(tx)).await?;
        assert_eq!(rx.len(), 8, "the caller's queue never grows past its bound");
        let first = rx.try_recv().unwrap_or_default();
        assert_eq!(first, "\\u{1b}]0;owned\\u{7}line 0", "escaped before anyone logs it");
        assert!(!outcome.output_tail.contains('\x1b'), "{}", outcome.output_tail);
        Ok(())
    }

    /// Streams a few lines, says some were dropped, and returns output ending elsewhere.
    struct Gappy;

    #[async_trait::async_trait]
    impl ScriptExecutor for Gappy {
        async fn exec(&self, _: Vec<String>, _: Vec<u8>, _: Duration, output: Option<Sender<String>>) -> Result<ExecOutput, RunError> {
            if let Some(output) = output {
                let _ = output.try_send("early line".into());
                let _ = output.try_send("[provisioning] 5000 output lines dropped: the log could not keep up".into());
            }
            Ok(ExecOutput { exit_code: Some(1), timed_out: false, stdout: "early line\n...\nfinal error\n".into(), stderr: String::new() })
        }
    }

    #[tokio::test]
    async fn a_stream_with_gaps_leaves_the_tail_to_the_returned_output() -> Result<(), RunError> {
        let outcome = run_script(&Gappy, ScriptStep::Install, "echo", &ScriptContext::default(), Duration::from_secs(30), None).await?;
        assert!(outcome.output_tail.starts_with("[provisioning] output was not streamed in full"), "{}", outcome.output_tail);
        assert!(outcome.output_tail.ends_with("final error"), "{}", outcome.output_tail);
        Ok(())
    }

    /// Prints a kubeconfig on a secret result line (streamed and returned), as the first
    /// control plane of a Kubernetes cluster does.
    struct SecretPrinter;

    const KUBECONFIG_LINE: &str = "PROVISIONING_SECRET {\"kubeconfig\":\"client-key-data: c2VjcmV0\"}";

    #[async_trait::async_trait]
    impl ScriptExecutor for SecretPrinter {
        async fn exec(&self, _: Vec<String>, _: Vec<u8>, _: Duration, output: Option<Sender<String>>) -> Result<ExecOutput, RunError> {
            let stdout = format!("==> kubeadm init\n{KUBECONFIG_LINE}\nPROVISIONING_RESULT {{\"version\":\"1.31.4\"}}\n");
            if let Some(output) = output {
                for line in stdout.lines() {
                    let _ = output.try_send(line.to_string());
                }
            }
            Ok(ExecOutput { exit_code: Some(0), timed_out: false, stdout, stderr: String::new() })
        }
    }

    #[tokio::test]
    async fn a_secret_result_line_is_parsed_and_never_shown() -> Result<(), RunError> {
        let (tx, mut rx) = channel(16);
        let outcome =
            run_script(&SecretPrinter, ScriptStep::Install, "kubernetes", &ScriptContext::default(), Duration::from_secs(30), Some(tx))
                .await?;
        let forwarded: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert!(forwarded.iter().all(|l| !l.contains("c2VjcmV0")), "{forwarded:?}");
        assert!(forwarded.iter().any(|l| l == SECRET_WITHHELD), "{forwarded:?}");
        assert!(!outcome.output_tail.contains("c2VjcmV0") && outcome.output_tail.contains(SECRET_WITHHELD), "{}", outcome.output_tail);
        assert!(!format!("{outcome:?}").contains("c2VjcmV0"), "Debug prints nothing of it");
        assert!(!serde_json::to_string(&outcome)?.contains("c2VjcmV0"), "never serialized");
        assert_eq!(outcome.secret, Some(SecretResult(serde_json::json!({"kubeconfig": "client-key-data: c2VjcmV0"}))));
        assert_eq!(outcome.reported_version(), Some("1.31.4"), "the plain result is still there");
        // Not streamed: the tail is built from the returned stdout, and withholds it too.
        let outcome =
            run_script(&SecretPrinter, ScriptStep::Install, "kubernetes", &ScriptContext::default(), Duration::from_secs(30), None).await?;
        assert!(!outcome.output_tail.contains("c2VjcmV0"), "{}", outcome.output_tail);
        // A malformed secret line is ignored and its error quotes nothing of it.
        let err = parse_secret("PROVISIONING_SECRET {\"kubeconfig\": c2VjcmV0").and_then(Result::err).unwrap_or_default();
        assert!(err.contains("not JSON") && !err.contains("c2VjcmV0"), "{err}");
        Ok(())
    }

    #[test]
    fn forwarding_never_waits_and_says_what_it_dropped() {
        let (tx, mut rx) = channel(4);
        let mut forward = Forward::new(Some(tx));
        for i in 0..1000 {
            forward.send(format!("line {i}"));
        }
        assert_eq!(rx.len(), 4);
        assert_eq!(forward.dropped, 996);
        let lines: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(lines, ["line 0", "line 1", "line 2", "line 3"]);
        forward.send("after".into());
        let lines: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(lines, ["[provisioning] 996 output lines dropped: the log could not keep up", "after"]);
        assert_eq!(escape_controls("\u{1b}[2J\u{202e}ok\t"), "\\u{1b}[2J\\u{202e}ok\t");
        assert_eq!(escape_controls(&escape_controls("\u{1b}")), "\\u{1b}", "idempotent");
    }

    #[test]
    fn drifted_file_names_from_the_machine_are_escaped() {
        let now = Utc::now();
        let outcome = ScriptOutcome {
            service: "x".into(),
            step: ScriptStep::Check,
            exit_code: Some(3),
            timed_out: false,
            result: Some(serde_json::json!({"configDrift": true, "driftedFiles": ["/etc/a\u{1b}[2J.conf"]})),
            result_error: None,
            secret: None,
            output_tail: String::new(),
            started_at: now,
            finished_at: now,
        };
        assert_eq!(outcome.drifted_files(), ["/etc/a\\u{1b}[2J.conf"]);
    }

    #[test]
    fn tail_is_bounded_in_lines_and_bytes_on_char_boundaries() {
        let mut tail = OutputTail::default();
        for i in 0..50 {
            tail.push(&format!("line {i}"));
        }
        assert_eq!(tail.render().lines().count(), TAIL_LINES);
        let mut tail = OutputTail::default();
        let wide = "é".repeat(3000); // 6000 bytes, 2 bytes per char
        tail.push("first");
        tail.push(&wide);
        let text = tail.render();
        assert!(text.len() <= TAIL_BYTES, "{}", text.len());
        assert!(text.chars().all(|c| c == 'é'));
    }
}
