//! The audit log: one JSON line per provider call and per task script run, appended to
//! `<state dir>/audit/audit.jsonl` and rotated by size, read back ([`read_all`]) by
//! `provisioning audit`; optionally (`audit_stdout`) also streamed as the same JSON lines to
//! stdout, where a cluster's log collector keeps them beyond the replica's volume.
//!
//! Writes go through a channel to one writer thread, so a reconcile never waits on the disk;
//! the writer appends and `fdatasync`s after each batch it drains (a kill -9 loses at most the
//! lines of the batch in flight). Entries carry identities, operations, durations and
//! outcomes, never a value from a spec's config or a Secret: failure messages are the ones
//! status already shows (provider errors carry no credentials; script messages are redacted
//! before they reach here).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use anyhow::Context as _;
use chrono::{SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

/// The live file's name inside the audit directory; rotated files add `.1`, `.2`, ….
pub const FILE_NAME: &str = "audit.jsonl";
/// Size at which the live file is rotated.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Rotated files kept besides the live one.
pub const DEFAULT_KEEP: usize = 4;
/// Longest failure message kept in an entry.
const MAX_MESSAGE: usize = 512;

tokio::task_local! {
    /// The object the running reconcile is about (set by the reconcile skeleton), so provider
    /// calls are attributed without every call site passing it.
    pub static CURRENT: AuditObject;
}

/// The object an entry is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditObject {
    /// Kind (Server, TaskServ, …).
    pub kind: String,
    /// Namespace; empty for cluster-scoped kinds.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.generation at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl AuditObject {
    /// `KIND/NAMESPACE/NAME` (or `KIND/NAME` for cluster-scoped kinds), as `--object` takes it.
    pub fn path(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.kind, self.name)
        } else {
            format!("{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// What an entry records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Action {
    /// One call to a provider's API (or engine).
    #[serde(rename_all = "camelCase")]
    ProviderCall {
        /// Provider type (aws, upcloud, local, simulated).
        provider: String,
        /// Account name in the workspace.
        account: String,
        /// Operation (ensure_server, observe_server, delete_server, survey, …).
        operation: String,
    },
    /// One task script run on a server.
    #[serde(rename_all = "camelCase")]
    ScriptRun {
        /// Catalog service.
        service: String,
        /// Server it ran on.
        server: String,
        /// install, check or remove.
        script: String,
        /// Exit code; absent when it never started or was killed by a timeout.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// The approval of a plan came into force (`provisioning.dev/approve` named it).
    #[serde(rename_all = "camelCase")]
    Approval {
        /// The approved plan's id.
        plan: String,
        /// The authenticated user, when the API server recorded it
        /// (`provisioning.dev/approved-by`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// The field manager that set the annotation (managedFields): the name the client
        /// chose, not an authenticated user; absent when no entry owned it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field_manager: Option<String>,
    },
}

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// When it finished (RFC 3339, milliseconds, UTC).
    pub time: String,
    /// The object it was done for; absent for account-wide work (surveys, credential checks
    /// outside a reconcile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<AuditObject>,
    /// What was done.
    #[serde(flatten)]
    pub action: Action,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// `ok`, or the error's category (Throttled, Transient, NotFound, Auth, …, `failed` for a
    /// script).
    pub outcome: String,
    /// Why it failed (as status shows it), truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Entry {
    /// An entry finished now, about the reconcile's current object (if any).
    pub fn now(action: Action, duration: Duration, outcome: &str, message: Option<String>) -> Entry {
        Entry {
            time: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            object: CURRENT.try_with(Clone::clone).ok(),
            action,
            duration_ms: duration.as_millis().try_into().unwrap_or(u64::MAX),
            outcome: outcome.to_string(),
            message: message.map(|m| truncate(&m)),
        }
    }

    /// Sets the object explicitly (script runs finish outside the reconcile's task).
    pub fn about(mut self, object: AuditObject) -> Entry {
        self.object = Some(object);
        self
    }
}

fn truncate(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Handle to the audit log; cloning shares the writer. Recording never blocks and never
/// fails the caller: a disk error is logged once by the writer, which keeps trying.
#[derive(Clone, Debug)]
pub struct AuditLog {
    tx: Option<Sender<Entry>>,
}

/// Where audit lines are streamed besides the file (stdout in a deployment).
pub type Stream = Box<dyn Write + Send>;

impl AuditLog {
    /// Opens (creating) `dir` and starts the writer thread.
    pub fn open(dir: &Path) -> anyhow::Result<AuditLog> {
        AuditLog::open_with(dir, DEFAULT_MAX_BYTES, DEFAULT_KEEP, None)
    }

    /// As [`AuditLog::open`], with the rotation size and count given, each line also written
    /// to `stream` when there is one.
    pub fn open_with(dir: &Path, max_bytes: u64, keep: usize, stream: Option<Stream>) -> anyhow::Result<AuditLog> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the audit directory {}", dir.display()))?;
        let file = Rotating::open(dir, max_bytes, keep)?;
        AuditLog::start(Some(file), stream)
    }

    /// A log with no file that streams to `stream` (none: records nothing).
    pub fn stream_only(stream: Option<Stream>) -> AuditLog {
        if stream.is_none() {
            return AuditLog::disabled();
        }
        AuditLog::start(None, stream).unwrap_or_else(|e| {
            tracing::warn!(error = %format!("{e:#}"), "the audit log is off");
            AuditLog::disabled()
        })
    }

    fn start(file: Option<Rotating>, stream: Option<Stream>) -> anyhow::Result<AuditLog> {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(file, stream, rx))
            .context("starting the audit writer")?;
        Ok(AuditLog { tx: Some(tx) })
    }

    /// A log that records nothing (a controller whose state directory cannot be written;
    /// the reason is logged where it is built).
    pub fn disabled() -> AuditLog {
        AuditLog { tx: None }
    }

    /// Appends `entry` (in the background).
    pub fn record(&self, entry: Entry) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(entry);
        }
    }
}

/// The live file plus its rotation rule.
struct Rotating {
    dir: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
    keep: usize,
}

impl Rotating {
    fn open(dir: &Path, max_bytes: u64, keep: usize) -> anyhow::Result<Rotating> {
        let path = dir.join(FILE_NAME);
        let file = OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("opening {}", path.display()))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Rotating { dir: dir.to_path_buf(), file, size, max_bytes, keep })
    }

    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.file.sync_data()?;
        let name = |n: usize| self.dir.join(if n == 0 { FILE_NAME.to_string() } else { format!("{FILE_NAME}.{n}") });
        if self.keep == 0 {
            std::fs::remove_file(name(0))?;
        } else {
            // audit.jsonl.(keep-1) → .keep (the oldest beyond `keep` is overwritten), …, live → .1
            for n in (0..self.keep).rev() {
                let from = name(n);
                if from.exists() {
                    std::fs::rename(&from, name(n + 1))?;
                }
            }
        }
        self.file = OpenOptions::new().create(true).append(true).open(name(0))?;
        self.size = 0;
        Ok(())
    }
}

fn write_loop(mut file: Option<Rotating>, mut stream: Option<Stream>, rx: Receiver<Entry>) {
    let mut warned = false;
    while let Ok(first) = rx.recv() {
        let mut result = Ok(());
        let mut streamed = Ok(());
        for entry in std::iter::once(first).chain(rx.try_iter()) {
            let Ok(mut line) = serde_json::to_vec(&entry) else { continue };
            line.push(b'\n');
            if let Some(file) = file.as_mut()
                && let Err(e) = file.append(&line)
            {
                result = Err(e);
            }
            if let Some(out) = stream.as_mut()
                && let Err(e) = out.write_all(&line)
            {
                streamed = Err(e);
            }
        }
        if let Some(out) = stream.as_mut() {
            streamed = streamed.and_then(|()| out.flush());
        }
        let result = match file.as_mut() {
            Some(file) => result.and_then(|()| file.file.sync_data()),
            None => Ok(()),
        };
        match result.and(streamed) {
            Err(e) if !warned => {
                let dir = file.as_ref().map(|f| f.dir.display().to_string()).unwrap_or_default();
                tracing::warn!(dir, error = %e, "could not write the audit log; entries may be missing");
                warned = true;
            }
            Ok(()) => warned = false,
            Err(_) => {}
        }
    }
}

/// Reads every entry in `dir`, rotated files first, oldest first. Unreadable lines (a torn
/// last line after a crash) are counted, not fatal.
pub fn read_all(dir: &Path) -> anyhow::Result<(Vec<Entry>, usize)> {
    let mut files: Vec<(usize, PathBuf)> = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading the audit directory {}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if name == FILE_NAME {
            files.push((0, entry.path()));
        } else if let Some(n) = name.strip_prefix(&format!("{FILE_NAME}.")).and_then(|n| n.parse::<usize>().ok()) {
            files.push((n, entry.path()));
        }
    }
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut out = Vec::new();
    let mut unreadable = 0;
    for (_, path) in files {
        let file = match File::open(&path) {
            Ok(f) => f,
            // Rotated away between listing and opening (the controller is writing): its
            // entries are in the next file now.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        let reader = BufReader::new(file);
        for line in reader.lines() {
            let Ok(line) = line else {
                unreadable += 1;
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Entry>(&line) {
                Ok(entry) => out.push(entry),
                Err(_) => unreadable += 1,
            }
        }
    }
    Ok((out, unreadable))
}

/// The audit directory under a controller's state directory.
pub fn dir_for_state_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("audit")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: &str) -> Action {
        Action::ProviderCall { provider: "local".into(), account: "local".into(), operation: op.into() }
    }

    fn wait_for_lines(dir: &Path, n: usize) -> Vec<Entry> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (entries, _) = read_all(dir).expect("read");
            if entries.len() >= n || std::time::Instant::now() > deadline {
                return entries;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A `Write` that keeps what it is given, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// `audit_stdout`: every entry is streamed as the same JSON line the file gets (for a
    /// cluster's log collector), also when the file cannot be opened.
    #[test]
    fn entries_are_streamed_as_json_lines_too() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let captured = Captured::default();
        let log = AuditLog::open_with(dir.path(), DEFAULT_MAX_BYTES, DEFAULT_KEEP, Some(Box::new(captured.clone())))?;
        log.record(Entry::now(call("ensure_server"), Duration::from_millis(5), "ok", None));
        log.record(Entry::now(call("delete_server"), Duration::from_millis(7), "Permanent", Some("gone".into())));
        let entries = wait_for_lines(dir.path(), 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let streamed = loop {
            let text = String::from_utf8(captured.0.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone())?;
            if text.lines().count() >= 2 || std::time::Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let file = std::fs::read_to_string(dir.path().join(FILE_NAME))?;
        assert_eq!(entries.len(), 2);
        assert_eq!(streamed, file, "the stream carries exactly the file's lines");
        for line in streamed.lines() {
            let v: serde_json::Value = serde_json::from_str(line)?;
            assert_eq!(v["type"], "providerCall", "{line}");
        }

        let only = Captured::default();
        let log = AuditLog::stream_only(Some(Box::new(only.clone())));
        log.record(Entry::now(call("survey"), Duration::from_millis(1), "ok", None));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while only.0.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.is_empty() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "nothing streamed without a file");
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    #[tokio::test]
    async fn provider_calls_are_attributed_to_the_current_object() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::open(dir.path()).expect("open");
        let object = AuditObject { kind: "Server".into(), namespace: "demo".into(), name: "web-0".into(), generation: Some(2) };
        CURRENT.scope(object.clone(), async { log.record(Entry::now(call("ensure_server"), Duration::from_millis(12), "ok", None)) }).await;
        log.record(Entry::now(call("survey"), Duration::from_millis(3), "Transient", Some("connection refused".into())));
        let entries = wait_for_lines(dir.path(), 2);
        assert_eq!(entries.len(), 2, "{entries:?}");
        assert_eq!(entries[0].object.as_ref(), Some(&object));
        assert_eq!(entries[0].duration_ms, 12);
        assert_eq!(entries[1].object, None, "a survey outside a reconcile is account-wide");
        assert_eq!(entries[1].message.as_deref(), Some("connection refused"));
        let raw = std::fs::read_to_string(dir.path().join(FILE_NAME)).expect("raw");
        assert!(raw.contains(r#""type":"providerCall""#) && raw.contains(r#""durationMs":12"#), "{raw}");
    }

    #[test]
    fn the_log_rotates_by_size_and_keeps_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::open_with(dir.path(), 400, 2, None).expect("open");
        for i in 0..40 {
            log.record(Entry::now(call(&format!("op{i}")), Duration::ZERO, "ok", None));
        }
        // Wait for the last entry to land, then look at the files.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (entries, _) = read_all(dir.path()).expect("read");
            if entries.last().is_some_and(|e| e.action == call("op39")) || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut names: Vec<String> =
            std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().to_string()).collect();
        names.sort();
        assert_eq!(names, vec!["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]);
        for name in &names {
            let size = std::fs::metadata(dir.path().join(name)).expect("meta").len();
            assert!(size <= 400, "{name} is {size} bytes");
        }
        let (entries, unreadable) = read_all(dir.path()).expect("read");
        assert_eq!(unreadable, 0);
        // Oldest first, newest last, nothing out of order; the oldest rotated away.
        let ops: Vec<String> = entries
            .iter()
            .map(|e| match &e.action {
                Action::ProviderCall { operation, .. } => operation.clone(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(ops.last().map(String::as_str), Some("op39"));
        assert!(!ops.contains(&"op0".to_string()), "the oldest file was dropped: {ops:?}");
        let numbers: Vec<usize> = ops.iter().filter_map(|o| o.strip_prefix("op")?.parse().ok()).collect();
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(600);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
