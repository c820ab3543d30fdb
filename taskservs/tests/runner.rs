//! The runner with real `nu` processes (LocalProcessExecutor) on fixture scripts.

mod common;

use std::time::{Duration, Instant};

use common::{fixture, nu};
use provisioning_taskservs::{LocalProcessExecutor, RunError, ScriptContext, ScriptExecutor, ScriptStep, TAIL_LINES, run_script};
use serde_json::json;

fn executor() -> LocalProcessExecutor {
    LocalProcessExecutor::new(nu().to_string_lossy(), fixture("runner").to_string_lossy())
}

fn ctx(service: &str, config: serde_json::Value) -> ScriptContext {
    let mut ctx = ScriptContext::default();
    ctx.server.name = "node-0".into();
    ctx.taskserv.service = service.into();
    ctx.taskserv.version = "1.2.3".into();
    ctx.config = config;
    ctx
}

const HOSTILE: &[&str] = &[
    "$(touch PWNED)",
    "`touch PWNED`",
    "; touch PWNED; rm -rf /",
    "a' ; touch PWNED ; echo 'b",
    "quote \" double \" and 'single'",
    "line one\nline two\n; touch PWNED",
    "(touch PWNED)",
    "$env.HOME ^touch PWNED {}",
    "ünïcødé ✓ \t tab",
];

#[tokio::test]
async fn result_and_streamed_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("value");
    let mut context = ctx("echo", json!({"value": "plain", "outFile": out}));
    context.templates.insert("a.conf".into(), "x = 1\n".into());
    let (tx, mut rx) = tokio::sync::mpsc::channel(provisioning_taskservs::OUTPUT_QUEUE);
    let outcome = run_script(&executor(), ScriptStep::Install, "echo", &context, Duration::from_secs(30), Some(tx)).await.expect("runs");
    assert!(outcome.succeeded(), "{outcome:?}");
    assert_eq!(outcome.exit_code, Some(0));
    assert!(!outcome.timed_out);
    assert_eq!(outcome.reported_version(), Some("1.2.3"));
    assert_eq!(outcome.result, Some(json!({"version": "1.2.3", "value": "plain", "server": "node-0", "templates": ["a.conf"]})));
    assert!(outcome.output_tail.contains("==> installing echo 1.2.3 on node-0"), "{}", outcome.output_tail);
    assert!(outcome.finished_at >= outcome.started_at);
    let mut lines = Vec::new();
    while let Ok(line) = rx.try_recv() {
        lines.push(line);
    }
    assert!(lines.iter().any(|l| l == "value: plain"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("PROVISIONING_RESULT ")), "{lines:?}");

    for step in [ScriptStep::Check, ScriptStep::Remove] {
        let outcome = run_script(&executor(), step, "echo", &context, Duration::from_secs(30), None).await.expect("runs");
        assert!(outcome.succeeded(), "{step}: {outcome:?}");
    }
}

#[tokio::test]
async fn hostile_config_values_arrive_literally() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, value) in HOSTILE.iter().enumerate() {
        let out = dir.path().join(format!("value-{i}"));
        let context = ctx("echo", json!({"value": value, "outFile": out}));
        let outcome = run_script(&executor(), ScriptStep::Install, "echo", &context, Duration::from_secs(30), None).await.expect("runs");
        assert!(outcome.succeeded(), "{value:?}: {outcome:?}");
        assert_eq!(outcome.result.as_ref().and_then(|r| r.get("value")), Some(&json!(value)), "{value:?}");
        let written = std::fs::read_to_string(&out).expect("script wrote the value");
        assert_eq!(&written, value, "the script saw exactly the value");
    }
    // Nothing was executed: no PWNED file in the script's working directory or here.
    for candidate in [std::env::current_dir().expect("cwd").join("PWNED"), dir.path().join("PWNED")] {
        assert!(!candidate.exists(), "{} exists", candidate.display());
    }
}

#[tokio::test]
async fn failing_exit_code_and_tail() {
    let outcome =
        run_script(&executor(), ScriptStep::Install, "fail", &ctx("fail", json!({})), Duration::from_secs(30), None).await.expect("runs");
    assert_eq!(outcome.exit_code, Some(3));
    assert!(!outcome.succeeded());
    assert!(outcome.result.is_none());
    assert!(outcome.output_tail.contains("about to fail"), "{}", outcome.output_tail);
    assert!(outcome.output_tail.contains("something broke on stderr"), "{}", outcome.output_tail);
    assert_eq!(outcome.summary(), "install of fail exited 3");
}

#[tokio::test]
async fn nushell_errors_are_a_failed_run_with_the_error_in_the_tail() {
    let outcome = run_script(&executor(), ScriptStep::Install, "nuerror", &ctx("nuerror", json!({})), Duration::from_secs(30), None)
        .await
        .expect("runs");
    assert_eq!(outcome.exit_code, Some(1));
    assert!(outcome.output_tail.contains("doesNotExist"), "{}", outcome.output_tail);
}

#[tokio::test]
async fn timeout_kills_the_script_and_its_children() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("child.pid");
    let started = Instant::now();
    let outcome =
        run_script(&executor(), ScriptStep::Install, "slow", &ctx("slow", json!({"pidFile": pid_file})), Duration::from_millis(1500), None)
            .await
            .expect("runs");
    assert!(outcome.timed_out, "{outcome:?}");
    assert_eq!(outcome.exit_code, None);
    assert!(!outcome.succeeded());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(outcome.output_tail.contains("sleeping"));
    assert!(outcome.summary().contains("timed out"), "{}", outcome.summary());
    // The grandchild (sleep 30) is gone too.
    let pid = std::fs::read_to_string(&pid_file).expect("child pid").trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    let proc_dir = std::path::Path::new("/proc").join(&pid);
    while proc_dir.exists() && !is_zombie(&proc_dir) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!proc_dir.exists() || is_zombie(&proc_dir), "sleep {pid} survived the timeout");
}

fn is_zombie(proc_dir: &std::path::Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

#[tokio::test]
async fn output_tail_keeps_the_last_lines() {
    let outcome = run_script(&executor(), ScriptStep::Install, "chatty", &ctx("chatty", json!({})), Duration::from_secs(30), None)
        .await
        .expect("runs");
    assert!(outcome.succeeded());
    let lines: Vec<&str> = outcome.output_tail.lines().collect();
    assert_eq!(lines.len(), TAIL_LINES);
    assert_eq!(lines[0], "line 82");
    assert_eq!(lines[TAIL_LINES - 2], "line 100");
    assert!(lines[TAIL_LINES - 1].starts_with("PROVISIONING_RESULT "));
    assert_eq!(outcome.result, Some(json!({"lines": 100})));
}

#[tokio::test]
async fn malformed_result_is_reported() {
    let outcome = run_script(&executor(), ScriptStep::Install, "badresult", &ctx("badresult", json!({})), Duration::from_secs(30), None)
        .await
        .expect("runs");
    assert_eq!(outcome.exit_code, Some(0));
    assert!(outcome.result.is_none());
    assert!(outcome.result_error.is_some());
    assert!(!outcome.succeeded());
}

#[tokio::test]
async fn bad_service_names_and_missing_nu_are_errors() {
    let err = run_script(&executor(), ScriptStep::Install, "../etc", &ctx("x", json!({})), Duration::from_secs(5), None)
        .await
        .expect_err("path-like service");
    assert!(matches!(err, RunError::InvalidService(_)), "{err}");
    let missing = LocalProcessExecutor::new("/nonexistent/nu", "/tmp");
    let err =
        run_script(&missing, ScriptStep::Install, "echo", &ctx("echo", json!({})), Duration::from_secs(5), None).await.expect_err("no nu");
    assert!(matches!(err, RunError::Spawn { .. }), "{err}");
    assert!(err.is_transient());
}

#[test]
fn argv_is_nu_and_the_script_path_only() {
    let exec = LocalProcessExecutor::new("/usr/local/bin/nu", "/opt/provisioning/catalog/");
    assert_eq!(
        exec.script_paths().argv("etcd", ScriptStep::Check),
        ["/usr/local/bin/nu", "--no-config-file", "--no-std-lib", "--stdin", "/opt/provisioning/catalog/etcd/check.nu"]
    );
}

/// An executor that does not stream lines still gets a tail from its returned output.
struct BufferedExecutor;

#[async_trait::async_trait]
impl ScriptExecutor for BufferedExecutor {
    async fn exec(
        &self,
        argv: Vec<String>,
        stdin: Vec<u8>,
        _timeout: Duration,
        _output: Option<tokio::sync::mpsc::Sender<String>>,
    ) -> Result<provisioning_taskservs::ExecOutput, RunError> {
        assert_eq!(argv[0], "/usr/local/bin/nu", "default paths are the container layout");
        let ctx: serde_json::Value = serde_json::from_slice(&stdin).map_err(RunError::Context)?;
        Ok(provisioning_taskservs::ExecOutput {
            exit_code: Some(0),
            timed_out: false,
            stdout: format!("hello\nPROVISIONING_RESULT {{\"version\":{}}}\n", ctx["taskserv"]["version"]),
            stderr: "warn\n".into(),
        })
    }
}

#[tokio::test]
async fn non_streaming_executor() {
    let outcome = run_script(&BufferedExecutor, ScriptStep::Install, "echo", &ctx("echo", json!({})), Duration::from_secs(5), None)
        .await
        .expect("runs");
    assert_eq!(outcome.reported_version(), Some("1.2.3"));
    assert_eq!(outcome.output_tail, "hello\nPROVISIONING_RESULT {\"version\":\"1.2.3\"}\nwarn");
}

#[tokio::test]
async fn known_secrets_are_redacted_from_streamed_lines_and_the_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("value");
    let secret = "s3cr3t 'q' \"dq\" $(id) `x` back\\slash\nsecond-line-of-it";
    let context = ctx("echo", json!({"value": secret, "outFile": out}));
    let redactor = provisioning_taskservs::Redactor::try_new([secret]).expect("a redactor");
    let (tx, mut rx) = tokio::sync::mpsc::channel(provisioning_taskservs::OUTPUT_QUEUE);
    let outcome = provisioning_taskservs::run_script_redacted(
        &executor(),
        ScriptStep::Install,
        "echo",
        &context,
        Duration::from_secs(30),
        Some(tx),
        &redactor,
    )
    .await
    .expect("runs");
    assert!(outcome.succeeded(), "{}", outcome.summary());
    // The script did get the value (it wrote it to a file)…
    assert_eq!(std::fs::read_to_string(&out).expect("value written"), secret);
    // …but no line of output carries it, in any form.
    let mut lines = Vec::new();
    while let Ok(line) = rx.try_recv() {
        lines.push(line);
    }
    let streamed = lines.join("\n");
    for text in [&streamed, &outcome.output_tail] {
        assert!(!text.contains("s3cr3t"), "a secret leaked");
        assert!(!text.contains("second-line-of-it"), "a secret line leaked");
        assert!(text.contains(provisioning_taskservs::REDACTED), "nothing was redacted");
    }
}
