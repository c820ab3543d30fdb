//! Bad input to the `provisioning controller` process, as a new user meets it: a malformed
//! config file is one line naming the line and the key and a non-zero exit (no panic, no
//! backtrace); credentials the API server rejects are logged with the request's verb and
//! resource, /readyz says not ready with the reason, and the process stays up (so the
//! kubelet reports the pod unready instead of crash-looping it).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use provisioning_controller::testing::TestEnv;

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// GET `path`: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.to_string();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Some((code, body))
}

#[test]
fn a_malformed_config_is_one_line_naming_line_and_key_and_a_non_zero_exit() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.toml");
    // What deploy/ shipped before: a key the controller does not know.
    std::fs::write(&config, "# Provider accounts\n[[default_providers]]\nname = \"local\"\ntype = \"local\"\n")?;
    let out = Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .args(["controller", "--kubeconfig", "/nonexistent", "--config"])
        .arg(&config)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {}: {stderr}", out.status);
    assert_eq!(out.status.code(), Some(1), "an error exit, not a signal or panic code: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line:\n{stderr}");
    assert!(lines[0].contains("config.toml:2:"), "names the line: {stderr}");
    assert!(lines[0].contains("default_providers"), "names the key: {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_credentials_are_logged_and_not_ready_while_the_process_stays_up() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    // The admin kubeconfig with a token the server never issued.
    let text = std::fs::read_to_string(&env.kubeconfig)?;
    let mut kubeconfig: serde_json::Value = serde_yaml_ng::from_str(&text)?;
    kubeconfig["users"][0]["user"]["token"] = serde_json::json!("not-a-token-the-server-issued");
    let bad = env.dir.path().join("bad-kubeconfig");
    std::fs::write(&bad, serde_yaml_ng::to_string(&kubeconfig)?)?;
    let config = env.dir.path().join("controller.toml");
    std::fs::write(&config, format!("state_dir = {:?}\n", env.state_dir.display().to_string()))?;
    let log = env.dir.path().join("controller.log");
    let metrics = free_addr()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .args(["controller", "--kubeconfig"])
        .arg(&bad)
        .arg("--config")
        .arg(&config)
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;

    let deadline = Instant::now() + Duration::from_secs(60);
    let outcome = async {
        loop {
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            let refused = logged.lines().find(|l| l.contains("API request refused") && l.contains("code=401"));
            let readyz = get(metrics, "/readyz").await;
            if let (Some(line), Some((code, body))) = (refused, &readyz) {
                anyhow::ensure!(line.contains("verb=") && line.contains("resource="), "names verb and resource: {line}");
                anyhow::ensure!(!line.contains("not-a-token"), "never the token: {line}");
                anyhow::ensure!(code == "503", "/readyz must be 503, got {code}: {body}");
                anyhow::ensure!(body.contains("401"), "/readyz says why: {body}");
                break;
            }
            anyhow::ensure!(child.try_wait()?.is_none(), "the process exited instead of staying up unready:\n{logged}");
            anyhow::ensure!(Instant::now() < deadline, "no refusal logged / readyz {readyz:?} within 60 s:\n{logged}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // Still up and still unready a little later (not crash-looping, not flapping).
        tokio::time::sleep(Duration::from_secs(3)).await;
        anyhow::ensure!(child.try_wait()?.is_none(), "exited:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        let (code, _) = get(metrics, "/readyz").await.unwrap_or_default();
        anyhow::ensure!(code == "503", "/readyz {code}");
        let (code, _) = get(metrics, "/healthz").await.unwrap_or_default();
        anyhow::ensure!(code == "200", "alive: /healthz {code}");
        Ok(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    env.shutdown().await;
    outcome
}
