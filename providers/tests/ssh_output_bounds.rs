//! A machine is outside input (issue 26, N2): over a real sshd, a command that floods output,
//! a line without end, terminal escapes and an asset-copy step that never ends each cost the
//! controller bounded memory and time.

mod support;

use std::time::Duration;

use provisioning_providers::output::{CAPTURE_CAP, LINE_CAP};
use provisioning_providers::ssh::SshExecutor;
use provisioning_providers::{Credentials, ExecRequest, OutputSink, ProviderConfig, SshAsset, SshSettings};
use support::sshd::Sshd;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn executor(sshd: &Sshd, state: &std::path::Path, assets: Vec<SshAsset>, marker: &std::path::Path) -> SshExecutor {
    let config = ProviderConfig {
        name: "bounds".into(),
        provider_type: "aws".into(),
        credentials: Credentials([("SSH_PRIVATE_KEY".to_string(), sshd.client_key.clone())].into()),
        state_dir: state.to_path_buf(),
        ssh: SshSettings {
            user: sshd.user.clone(),
            port: sshd.port,
            address_override: Some("127.0.0.1".into()),
            assets,
            assets_marker: marker.display().to_string(),
            connect_timeout: Duration::from_secs(3),
            become_root: Some(false),
        },
        ..Default::default()
    };
    SshExecutor::new(&config, "root")
}

fn request(script: &str, timeout: Duration, output: Option<OutputSink>) -> ExecRequest {
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        stdin: None,
        env: Default::default(),
        timeout,
        output,
        ssh_key: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asset_step_that_never_ends_is_an_error_naming_it() -> Result {
    let sshd = Sshd::start();
    let dir = tempfile::tempdir()?;
    let asset = dir.path().join("nu");
    std::fs::write(&asset, b"#!/bin/sh\n")?;
    // `cat` of a FIFO nobody writes blocks forever: the marker read must still end.
    let marker = dir.path().join("marker.fifo");
    let made = std::process::Command::new("mkfifo").arg(&marker).status()?;
    assert!(made.success());
    let assets = vec![SshAsset { local: asset, remote: dir.path().join("remote/nu").display().to_string(), mode: 0o755 }];
    let exec = executor(&sshd, &dir.path().join("state"), assets, &marker);
    let started = std::time::Instant::now();
    let outcome =
        tokio::time::timeout(Duration::from_secs(60), exec.exec("m-fifo", "127.0.0.1", request("true", Duration::from_secs(5), None)))
            .await
            .map_err(|_| "the asset step hung: no deadline")?;
    let error = outcome.err().ok_or("a marker read that never ends must fail")?.to_string();
    assert!(error.contains("`cat ") && error.contains("did not finish within 3s"), "{error}\n{}", sshd.log());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_long_lines_and_escapes_stay_bounded() -> Result {
    let sshd = Sshd::start();
    let dir = tempfile::tempdir()?;
    let exec = executor(&sshd, &dir.path().join("state"), Vec::new(), &dir.path().join("marker"));

    // A flood of short lines into a queue nobody reads: the queue stays at its bound, and the
    // command ends at its deadline.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let sink = OutputSink::new(tx);
    let flood = exec.exec("m-1", "127.0.0.1", request("yes flood", Duration::from_secs(2), Some(sink.clone()))).await?;
    assert!(flood.timed_out, "{:?}", flood.exit_code);
    assert_eq!(rx.len(), 8);
    assert!(sink.dropped() > 1000, "{}", sink.dropped());
    assert!(flood.stdout.len() <= CAPTURE_CAP);

    // 50 MB without a newline, then a result line: the line is cut, the tail (with the
    // result) is kept, and terminal escapes arrive escaped.
    let (sink, mut rx) = OutputSink::channel();
    let script = "head -c 50000000 /dev/zero | tr '\\0' x; echo; printf '\\033[2J\\033]0;pwned\\007done\\n'";
    let long = exec.exec("m-1", "127.0.0.1", request(script, Duration::from_secs(60), Some(sink))).await?;
    assert_eq!(long.exit_code, Some(0), "{}", long.stderr);
    assert_eq!(long.stdout.len(), CAPTURE_CAP);
    assert!(long.stdout.ends_with("xxx\n\u{1b}[2J\u{1b}]0;pwned\u{7}done\n"), "the raw tail is the result");
    let mut lines = Vec::new();
    while let Ok(line) = rx.try_recv() {
        lines.push(line);
    }
    assert_eq!(lines.len(), 2, "{:?}", lines.iter().map(|l| l.len()).collect::<Vec<_>>());
    assert!(lines[0].len() <= LINE_CAP + 100 && lines[0].ends_with("(line cut at 64 KiB)"));
    assert_eq!(lines[1], "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}done");
    Ok(())
}
