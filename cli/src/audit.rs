//! `provisioning audit`: the controller's audit log ([`provisioning_controller::audit`]) read
//! back, filtered by object and time, as a table or JSON lines.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use provisioning_controller::audit::{self, Action, Entry};

/// `provisioning audit`: prints the entries of the log under `data_dir` that match `object`
/// and `since`, as a `table` or `json`.
pub fn run(data_dir: &Path, object: Option<String>, since: Option<Duration>, output: &str) -> anyhow::Result<()> {
    if !matches!(output, "table" | "json") {
        anyhow::bail!("-o {output:?}: expected table or json");
    }
    // A --since longer than chrono can represent means "everything".
    let since = since.and_then(|d| chrono::Duration::from_std(d).ok()).and_then(|d| chrono::Utc::now().checked_sub_signed(d));
    let dir = dir_for_data_dir(data_dir);
    if !dir.is_dir() {
        anyhow::bail!(
            "no audit log at {} (is {} the data dir of `provisioning dev` or a controller state dir?)",
            dir.display(),
            data_dir.display()
        );
    }
    let (entries, unreadable) = read(&dir, &Query { object, since })?;
    if output == "json" {
        for entry in &entries {
            println!("{}", serde_json::to_string(entry)?);
        }
    } else {
        print!("{}", table(&entries));
    }
    if unreadable > 0 {
        eprintln!("audit: {unreadable} unreadable line(s) skipped (a line torn by a crash)");
    }
    Ok(())
}

/// Filters for [`read`].
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// `KIND/NAMESPACE/NAME` or `KIND/NAME` (kind matched case-insensitively, also by its
    /// short name or plural).
    pub object: Option<String>,
    /// Only entries at or after this time.
    pub since: Option<DateTime<Utc>>,
}

/// Kind names `--object` accepts for each kind: singular, plural, short name.
const KIND_ALIASES: &[(&str, &[&str])] = &[
    ("Server", &["server", "servers", "srv"]),
    ("TaskServ", &["taskserv", "taskservs", "ts"]),
    ("Cluster", &["cluster", "clusters", "pcl"]),
    ("Workspace", &["workspace", "workspaces", "ws"]),
];

/// Parses `KIND/NS/NAME` or `KIND/NAME` into a canonical kind and the rest.
pub fn parse_object(text: &str) -> anyhow::Result<(String, Option<String>, String)> {
    let parts: Vec<&str> = text.split('/').collect();
    let (kind, namespace, name) = match parts.as_slice() {
        [kind, name] => (*kind, None, *name),
        [kind, namespace, name] => (*kind, Some((*namespace).to_string()), *name),
        _ => anyhow::bail!("--object {text:?}: expected KIND/NAMESPACE/NAME (or KIND/NAME for a Workspace)"),
    };
    let lower = kind.to_ascii_lowercase();
    let lower = lower.strip_suffix(".provisioning.dev").unwrap_or(&lower);
    let canonical = KIND_ALIASES
        .iter()
        .find(|(_, aliases)| aliases.contains(&lower))
        .map(|(canonical, _)| canonical.to_string())
        .ok_or_else(|| anyhow::anyhow!("--object {text:?}: unknown kind {kind:?} (expected server, taskserv, cluster or workspace)"))?;
    if name.is_empty() || namespace.as_deref() == Some("") {
        anyhow::bail!("--object {text:?}: empty namespace or name");
    }
    Ok((canonical, namespace, name.to_string()))
}

/// Reads every entry in `dir` (rotated files first, oldest first) that matches `query`.
/// Unreadable lines (a torn last line after a crash) are counted, not fatal.
pub fn read(dir: &Path, query: &Query) -> anyhow::Result<(Vec<Entry>, usize)> {
    let wanted = query.object.as_deref().map(parse_object).transpose()?;
    let (entries, unreadable) = audit::read_all(dir)?;
    let out = entries.into_iter().filter(|entry| matches(entry, wanted.as_ref(), query.since)).collect();
    Ok((out, unreadable))
}

fn matches(entry: &Entry, wanted: Option<&(String, Option<String>, String)>, since: Option<DateTime<Utc>>) -> bool {
    if let Some(since) = since {
        match DateTime::parse_from_rfc3339(&entry.time) {
            Ok(t) if t.with_timezone(&Utc) >= since => {}
            _ => return false,
        }
    }
    let Some((kind, namespace, name)) = wanted else { return true };
    let Some(object) = &entry.object else { return false };
    // A TaskServ's script runs name the server too: `--object server/ns/x` shows them.
    let on_server = kind == "Server"
        && matches!(&entry.action, Action::ScriptRun { server, .. } if server == name)
        && namespace.as_deref().is_none_or(|ns| ns == object.namespace);
    on_server || (object.kind == *kind && object.name == *name && namespace.as_deref().is_none_or(|ns| ns == object.namespace))
}

/// Where the audit log of a data directory is: `provisioning dev`'s layout
/// (`D/providers/audit`) or a controller state directory (`D/audit`).
pub fn dir_for_data_dir(data_dir: &Path) -> PathBuf {
    let dev = data_dir.join("providers").join("audit");
    if dev.is_dir() { dev } else { data_dir.join("audit") }
}

/// Renders entries as a table (time, object, what, duration, outcome, message).
pub fn table(entries: &[Entry]) -> String {
    let mut rows: Vec<[String; 6]> = vec![["TIME", "OBJECT", "ACTION", "DURATION", "OUTCOME", "MESSAGE"].map(String::from)];
    for e in entries {
        let what = match &e.action {
            Action::ProviderCall { provider, account, operation } => format!("{operation} at {provider}/{account}"),
            Action::ScriptRun { service, server, script, exit_code } => {
                let code = exit_code.map(|c| format!(" (exit {c})")).unwrap_or_default();
                format!("{service} {script} on {server}{code}")
            }
            Action::Approval { plan, user: Some(user), .. } => format!("plan {plan} approved by user {user}"),
            Action::Approval { plan, user: None, field_manager } => {
                format!("plan {plan} approved by field manager {}", field_manager.as_deref().unwrap_or("(unknown)"))
            }
        };
        let object = e.object.as_ref().map(|o| match o.generation {
            Some(g) => format!("{} (gen {g})", o.path()),
            None => o.path(),
        });
        rows.push([
            e.time.clone(),
            object.unwrap_or_else(|| "-".into()),
            what,
            format!("{}ms", e.duration_ms),
            e.outcome.clone(),
            e.message.clone().unwrap_or_default().replace('\n', " "),
        ]);
    }
    let widths: Vec<usize> = (0..5).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < 5 {
                out.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            } else {
                out.push_str(cell);
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioning_controller::audit::{AuditObject, FILE_NAME};

    fn call(op: &str) -> Action {
        Action::ProviderCall { provider: "local".into(), account: "local".into(), operation: op.into() }
    }

    #[test]
    fn queries_filter_by_object_kind_alias_and_time_and_survive_a_torn_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = AuditObject { kind: "Server".into(), namespace: "demo".into(), name: "web-0".into(), generation: Some(1) };
        let ts = AuditObject { kind: "TaskServ".into(), namespace: "demo".into(), name: "redis".into(), generation: Some(4) };
        let old = Entry {
            time: "2026-01-01T00:00:00.000Z".into(),
            ..Entry::now(call("ensure_server"), Duration::ZERO, "ok", None).about(server.clone())
        };
        let script = Action::ScriptRun { service: "redis".into(), server: "web-0".into(), script: "install".into(), exit_code: Some(0) };
        let run = Entry::now(script, Duration::from_secs(3), "ok", None).about(ts.clone());
        let mut text = String::new();
        for e in [&old, &run] {
            text.push_str(&serde_json::to_string(e).expect("json"));
            text.push('\n');
        }
        text.push_str("{\"time\":\"2026-11-2"); // torn by a crash
        std::fs::write(dir.path().join(FILE_NAME), text).expect("write");

        let q = |object: Option<&str>, since: Option<&str>| Query {
            object: object.map(String::from),
            since: since.map(|s| DateTime::parse_from_rfc3339(s).expect("time").with_timezone(&Utc)),
        };
        let (all, unreadable) = read(dir.path(), &q(None, None)).expect("read");
        assert_eq!((all.len(), unreadable), (2, 1));
        let (on_server, _) = read(dir.path(), &q(Some("srv/demo/web-0"), None)).expect("read");
        assert_eq!(on_server, vec![old.clone(), run.clone()], "a server's own calls and the scripts run on it");
        let (on_ts, _) = read(dir.path(), &q(Some("ts/demo/redis"), None)).expect("read");
        assert_eq!(on_ts, vec![run.clone()]);
        let (recent, _) = read(dir.path(), &q(Some("Server/demo/web-0"), Some("2026-06-01T00:00:00Z"))).expect("read");
        assert_eq!(recent, vec![run]);
        assert!(read(dir.path(), &q(Some("pod/demo/x"), None)).is_err());
        assert!(read(dir.path(), &q(Some("just-a-name"), None)).is_err());
        let table = table(&all);
        assert!(table.contains("ensure_server at local/local") && table.contains("redis install on web-0 (exit 0)"), "{table}");
    }
}
