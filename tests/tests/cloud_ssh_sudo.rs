//! Task scripts on machines that log in as a non-root user with passwordless sudo, as Debian's
//! cloud images do (`admin`), end to end: `provisioning dev` with real kubectl, aws at the moto
//! emulator and upcloud at its test double, and for the machine a container that behaves like
//! the cloud image (`provisioning_e2e::cloud_node`: sshd, `admin` with `NOPASSWD` sudo, root
//! login disabled). The accounts' `ssh.addressOverride` points at the container; `ssh.become`
//! is left unset, so becoming root follows from the user not being root.
//!
//! What must hold:
//! - `nu` and the catalog are copied to the root-owned places (`/usr/local/bin/nu`,
//!   `/opt/provisioning/catalog`) that `admin` itself cannot write;
//! - the script runs as root: it writes a root-owned file under `/etc`;
//! - a machine where sudo wants a password gives the TaskServ a clear error naming user, host
//!   and the passwordless-sudo requirement, quickly (no prompt, no hang), and nothing runs;
//!   so does a machine without sudo (provider level: a `Permanent` error);
//! - through sudo, stdin reaches the command, output streams, exit codes come back, and a
//!   timeout kills the command's whole (root) process group;
//! - no private key text in the log, any status or any event.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::cloud::{Moto, Upcloud, assert_no_secret_anywhere, condition, get_json, unique_secret, write_yaml_docs};
use provisioning_e2e::cloud_node::{CloudNode, Sudo, USER};
use provisioning_e2e::sshd::{key_body, keygen};
use provisioning_e2e::{tool, workspace_root};
use serde_json::json;

/// An AMI id from moto's default set (moto boots nothing).
const MOTO_AMI: &str = "ami-1e749f67";
const REGION: &str = "eu-north-1";
/// Where the marker script writes: only root may.
const MARKER: &str = "/etc/provisioning-e2e/marker.txt";

fn key_lines(pem: &str) -> Vec<String> {
    pem.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("-----")).map(str::to_string).collect()
}

/// A login key pair: (private PEM, public line).
fn login_key(dir: &Path) -> Result<(String, String)> {
    let path = dir.join("login_ed25519");
    let private = keygen(&path)?;
    Ok((private, std::fs::read_to_string(path.with_extension("pub"))?.trim().to_string()))
}

fn dev_env() -> Vec<(&'static str, String)> {
    vec![
        ("PROVISIONING_CATALOG", workspace_root().join("tests/ssh-catalog").display().to_string()),
        // Streamed script output is logged at info; the secret check is only as strong as the log.
        ("RUST_LOG", "info,provisioning_controller=debug,provisioning_providers=debug".to_string()),
    ]
}

fn start_dev(dir: &Path, manifest: &Path) -> Result<Dev> {
    let env = dev_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Dev::start_in_with(&dir.join("data"), &[&manifest.display().to_string()], &env, &["--allow-insecure-endpoints"])
}

fn wait_ready(dev: &Dev, namespace: &str, taskserv: &str, nodes: &[&CloudNode]) -> Result<Duration> {
    let started = Instant::now();
    if let Err(e) = dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("ts/{taskserv}"), "-n", namespace, "--timeout=240s"]) {
        let ts = dev.kubectl_ok(&["get", "ts", taskserv, "-n", namespace, "-o", "yaml"]).unwrap_or_default();
        let srv = dev.kubectl_ok(&["get", "srv", "-n", namespace, "-o", "yaml"]).unwrap_or_default();
        let logs: Vec<String> = nodes
            .iter()
            .map(|n| {
                provisioning_e2e::docker::docker(&["logs", &n.id])
                    .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                    .unwrap_or_default()
            })
            .collect();
        return Err(e.context(format!("TaskServ:\n{ts}\nServers:\n{srv}\nsshd logs:\n{}\n{}", logs.join("\n"), dev.log_tail(80))));
    }
    Ok(started.elapsed())
}

/// What a successful run must have left on the machine: root-owned assets in the default
/// places (which `admin` cannot write) and the script's root-owned file under /etc.
fn assert_ran_as_root(node: &CloudNode, server: &str) -> Result<()> {
    let written = node.exec(&format!("cat {MARKER}")).with_context(|| format!("the install script wrote no {MARKER}"))?;
    ensure!(written == format!("{server} 1.0\n"), "marker file holds {written:?}");
    let owner = node.exec(&format!(
        "stat -c '%U' {MARKER} /usr/local/bin/nu /opt/provisioning/catalog/marker/install.nu /var/lib/provisioning/assets.sha256"
    ))?;
    ensure!(owner.lines().all(|l| l == "root") && owner.lines().count() == 4, "not all root-owned: {owner:?}");
    ensure!(node.exec("stat -c '%a' /usr/local/bin/nu")?.trim() == "755", "nu is not executable");
    // Without sudo the copy could not have happened: admin cannot write there.
    ensure!(
        node.exec(&format!("su {USER} -s /bin/sh -c 'test -w /usr/local/bin || test -w /etc' && echo writable || echo no"))?.trim() == "no",
        "{USER} can write /usr/local/bin or /etc: the check proves nothing"
    );
    let host_nu = std::fs::read(tool("PROVISIONING_NU", "nu"))?;
    let host_sum = sha256_hex(&host_nu)?;
    let remote_sum = node.exec("sha256sum /usr/local/bin/nu")?;
    ensure!(remote_sum.split_whitespace().next() == Some(host_sum.as_str()), "the copied nu differs from the host's");
    for script in ["install.nu", "check.nu", "remove.nu", "taskserv.yaml"] {
        let local = std::fs::read_to_string(workspace_root().join("tests/ssh-catalog/marker").join(script))?;
        let copied = node.exec(&format!("cat /opt/provisioning/catalog/marker/{script}"))?;
        ensure!(copied == local, "the copied {script} differs");
    }
    Ok(())
}

fn sha256_hex(bytes: &[u8]) -> Result<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("sha256sum")?;
    child.stdin.take().context("stdin")?.write_all(bytes)?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string())
}

/// Waits for the TaskServ (or its events) to report the sudo problem; returns the excerpt.
fn sudo_refusal(dev: &mut Dev, namespace: &str, taskserv: &str) -> Result<String> {
    let mut found = String::new();
    dev.wait_until(Duration::from_secs(90), &format!("TaskServ {taskserv} reports that sudo needs a password"), |d| {
        let ts = d.kubectl_ok(&["get", "ts", taskserv, "-n", namespace, "-o", "json"])?;
        let events = d.kubectl_ok(&["get", "events.events.k8s.io", "-n", namespace, "-o", "json"])?;
        found = [ts, events].into_iter().find(|t| t.contains("passwordless sudo is required")).unwrap_or_default();
        Ok(!found.is_empty())
    })?;
    let at = found.find("SSH user").unwrap_or(0);
    Ok(found[at..].chars().take(400).collect())
}

#[test]
fn aws_taskserv_runs_as_root_through_sudo_and_a_sudo_password_is_a_clear_error() -> Result<()> {
    const NAMESPACE: &str = "sudo-aws";
    let moto = Moto::start(&[])?;
    let tmp = tempfile::tempdir()?;
    let (private, public) = login_key(tmp.path())?;
    let web = CloudNode::start(&public, Sudo::Passwordless)?;
    let locked = CloudNode::start(&public, Sudo::PasswordRequired)?;
    let aws_secret = unique_secret("aws-secret-key");
    let account = |name: &str, node: &CloudNode| {
        json!({"name": name, "type": "aws", "region": REGION, "endpoint": moto.endpoint,
            "credentialsSecretRef": {"name": "aws-creds"}, "images": {"debian-12": MOTO_AMI}, "sshSourceCidrs": ["127.0.0.1/32"],
            "ssh": {"user": USER, "addressOverride": node.ip, "hostKeys": "FirstUse"}})
    };
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {"provisioning.dev/workspace": NAMESPACE}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-creds", "namespace": NAMESPACE}, "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": "AKIAE2ESSHSUDO000001", "AWS_SECRET_ACCESS_KEY": aws_secret, "SSH_PRIVATE_KEY": private}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NAMESPACE},
            "spec": {"defaults": {"provider": "aws-sudo", "plan": "small", "image": "debian-12"},
                "providers": [account("aws-sudo", &web), account("aws-locked", &locked)]}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "web", "namespace": NAMESPACE}, "spec": {}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "locked", "namespace": NAMESPACE},
            "spec": {"provider": "aws-locked"}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "marker", "namespace": NAMESPACE},
            "spec": {"service": "marker", "servers": {"names": ["web"]}, "config": {"path": MARKER}}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "locked-marker", "namespace": NAMESPACE},
            "spec": {"service": "marker", "servers": {"names": ["locked"]}, "config": {"path": MARKER}}}),
    ];
    let manifest = write_yaml_docs(tmp.path(), "sudo-aws.yaml", &docs)?;
    let mut dev = start_dev(tmp.path(), &manifest)?;
    let started = Instant::now();

    let took = wait_ready(&dev, NAMESPACE, "marker", &[&web])?;
    eprintln!("aws: TaskServ Ready through sudo {took:.1?} after start");
    assert_ran_as_root(&web, "web")?;
    ensure!(dev.log().contains(&format!("==> wrote {MARKER} on web")), "the script's output is not in the controller log");
    let recorded = get_json(&dev, &["srv", "web", "-n", NAMESPACE])?["status"]["hostKey"].as_str().unwrap_or_default().to_string();
    ensure!(key_body(&recorded) == web.host_key()?, "status.hostKey {recorded:?} is not the machine's host key");

    // Sudo wants a password: a clear error on the TaskServ, nothing run, no prompt waited on.
    let refusal = sudo_refusal(&mut dev, NAMESPACE, "locked-marker")?;
    eprintln!("aws: refused ({:.1?} after start): {refusal}", started.elapsed());
    for word in [USER, locked.ip.as_str(), "a password is required", "passwordless sudo is required"] {
        ensure!(refusal.contains(word), "the error should name {word:?}: {refusal}");
    }
    ensure!(locked.exec(&format!("test -e {MARKER} && echo yes || echo no"))?.trim() == "no", "the script ran without sudo");
    ensure!(locked.exec("test -e /usr/local/bin/nu && echo yes || echo no")?.trim() == "no", "assets copied without sudo");
    // The reason shows on the TaskServ's Ready condition (what `kubectl wait` and dashboards
    // see), not only in its per-server status and events.
    let mut ready = serde_json::Value::Null;
    dev.wait_until(Duration::from_secs(30), "locked-marker's Ready condition names the sudo problem", |d| {
        ready = condition(&get_json(d, &["ts", "locked-marker", "-n", NAMESPACE])?, "Ready").cloned().unwrap_or_default();
        Ok(ready["message"].as_str().is_some_and(|m| m.contains("passwordless sudo is required")))
    })?;
    ensure!(ready["status"] == "False" && ready["reason"] == "InstallFailed", "{ready}");

    // Deleting the TaskServ runs remove.nu through sudo.
    dev.kubectl_ok(&["delete", "ts", "marker", "-n", NAMESPACE, "--timeout=120s"])?;
    ensure!(web.exec(&format!("test -e {MARKER} && echo yes || echo no"))?.trim() == "no", "remove.nu did not delete {MARKER}");
    dev.kubectl_ok(&["delete", "ts", "locked-marker", "-n", NAMESPACE, "--wait=false"])?;
    let mut secrets = key_lines(&private);
    secrets.push(aws_secret);
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    assert_no_secret_anywhere(&dev, &secrets)?;
    Ok(())
}

#[test]
fn upcloud_taskserv_runs_as_root_through_sudo() -> Result<()> {
    const NAMESPACE: &str = "sudo-upcloud";
    let password = unique_secret("upcloud-password");
    let upcloud = Upcloud::start("e2e-sudo", &password)?;
    let tmp = tempfile::tempdir()?;
    let (private, public) = login_key(tmp.path())?;
    let node = CloudNode::start(&public, Sudo::Passwordless)?;
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {"provisioning.dev/workspace": NAMESPACE}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "upcloud-creds", "namespace": NAMESPACE}, "type": "Opaque",
            "stringData": {"UPCLOUD_USERNAME": "e2e-sudo", "UPCLOUD_PASSWORD": password, "SSH_PRIVATE_KEY": private}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NAMESPACE},
            "spec": {"defaults": {"provider": "upcloud-sudo", "plan": "small", "image": "debian-12"},
                "providers": [{"name": "upcloud-sudo", "type": "upcloud", "zone": "de-fra1", "endpoint": upcloud.endpoint(),
                    "credentialsSecretRef": {"name": "upcloud-creds"}, "ssh": {"user": USER, "addressOverride": node.ip, "hostKeys": "FirstUse"}}]}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "web", "namespace": NAMESPACE}, "spec": {}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "marker", "namespace": NAMESPACE},
            "spec": {"service": "marker", "servers": {"names": ["web"]}, "config": {"path": MARKER}}}),
    ];
    let manifest = write_yaml_docs(tmp.path(), "sudo-upcloud.yaml", &docs)?;
    let mut dev = start_dev(tmp.path(), &manifest)?;
    let took = wait_ready(&dev, NAMESPACE, "marker", &[&node])?;
    eprintln!("upcloud: TaskServ Ready through sudo {took:.1?} after start");
    assert_ran_as_root(&node, "web")?;
    let recorded = get_json(&dev, &["srv", "web", "-n", NAMESPACE])?["status"]["hostKey"].as_str().unwrap_or_default().to_string();
    ensure!(key_body(&recorded) == node.host_key()?, "status.hostKey {recorded:?} is not the machine's host key");

    dev.kubectl_ok(&["delete", "ts", "marker", "-n", NAMESPACE, "--timeout=120s"])?;
    ensure!(node.exec(&format!("test -e {MARKER} && echo yes || echo no"))?.trim() == "no", "remove.nu did not delete {MARKER}");
    dev.kubectl_ok(&["delete", "srv", "--all", "-n", NAMESPACE, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "no server left at the UpCloud double", |_| Ok(upcloud.double.server_count() == 0))?;
    let mut secrets = key_lines(&private);
    secrets.push(password.clone());
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    assert_no_secret_anywhere(&dev, &secrets)?;
    Ok(())
}

/// The provider's `exec` through sudo, without the controller: what the runner relies on.
#[test]
fn sudo_exec_passes_stdin_output_exit_codes_and_kills_the_process_group_on_timeout() -> Result<()> {
    use provisioning_providers::{
        Credentials, ExecRequest, ProviderConfig, ProviderError, ServerIdentity, ServerRequest, SshSettings, build_provider,
    };
    let moto = Moto::start(&[])?;
    let tmp = tempfile::tempdir()?;
    let (private, public) = login_key(tmp.path())?;
    let node = CloudNode::start(&public, Sudo::Passwordless)?;
    let locked = CloudNode::start(&public, Sudo::PasswordRequired)?;
    let bare = CloudNode::start(&public, Sudo::Missing)?;
    let config = ProviderConfig {
        name: "sudo-exec".into(),
        provider_type: "aws".into(),
        region: REGION.into(),
        endpoint: moto.endpoint.clone(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2ESUDOEXEC00001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-sudo-exec".to_string()),
                ("SSH_PRIVATE_KEY".to_string(), private),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), MOTO_AMI.to_string())].into(),
        state_dir: tmp.path().join("state"),
        ssh: SshSettings { user: USER.into(), address_override: Some(node.ip.clone()), ..Default::default() },
        network: provisioning_providers::NetworkSettings { ssh_source_cidrs: vec!["127.0.0.1/32".into()], ..Default::default() },
        ..Default::default()
    };
    let provider = build_provider(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let at = |node: &CloudNode| {
        let mut other = config.clone();
        other.ssh.address_override = Some(node.ip.clone());
        other.state_dir = tmp.path().join(format!("state-{}", node.ip));
        build_provider(&other).map_err(|e| anyhow::anyhow!("{e}"))
    };
    let (at_locked, at_bare) = (at(&locked)?, at(&bare)?);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let request = |argv: &[&str], timeout: Duration| ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        env: Default::default(),
        timeout,
        output: None,
        ssh_key: None,
    };
    runtime.block_on(async {
        let server = ServerRequest {
            identity: ServerIdentity { uid: "sudo-exec-1".into(), namespace: "sudo".into(), name: "sudo-exec".into(), cluster: None },
            plan: "small".into(),
            zone: String::new(),
            image: "debian-12".into(),
            ssh_public_key: Some(public.clone()),
            extra_tags: Default::default(),
            instance_profile: String::new(),
            public_ip: None,
            disks: Vec::new(),
            host_key: None,
        };
        let id = provider.ensure_server(&server).await.map_err(|e| anyhow::anyhow!("ensure_server: {e}"))?.provider_id;

        // Stdin, env and streamed output pass through sudo; the command is root.
        let (tx, mut rx) = provisioning_providers::OutputSink::channel();
        let mut with_stdin = request(&["sh", "-c", "printf '%s|%s|' \"$(id -u)\" \"$GREETING\"; cat; echo; echo second"], Duration::from_secs(30));
        with_stdin.env = [("GREETING".to_string(), "hello world".to_string())].into();
        with_stdin.stdin = Some(b"{\"from\": \"stdin\"}".to_vec());
        with_stdin.output = Some(tx);
        let result = provider.exec(&id, with_stdin).await.map_err(|e| anyhow::anyhow!("exec: {e}"))?;
        ensure!(result.exit_code == Some(0), "{result:?}");
        ensure!(result.stdout == "0|hello world|{\"from\": \"stdin\"}\nsecond\n", "{result:?}");
        let lines: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        ensure!(lines == ["0|hello world|{\"from\": \"stdin\"}", "second"], "streamed {lines:?}");

        // Exit codes and stderr come back as the command left them.
        let result = provider.exec(&id, request(&["sh", "-c", "echo oops >&2; exit 3"], Duration::from_secs(30))).await?;
        ensure!(result.exit_code == Some(3) && result.stderr.trim() == "oops", "{result:?}");

        // A timeout kills the whole root process group: the command and what it started.
        let started = Instant::now();
        let slow = request(&["sh", "-c", "sleep 313 & sleep 313 & sleep 313; wait"], Duration::from_secs(2));
        let result = provider.exec(&id, slow).await?;
        ensure!(result.timed_out && result.exit_code.is_none(), "{result:?}");
        ensure!(started.elapsed() < Duration::from_secs(10), "timeout honoured: {:?}", started.elapsed());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = node.exec("ps -eo user=,args= | grep '[s]leep 313' || true")?;
            if left.trim().is_empty() {
                break;
            }
            ensure!(Instant::now() < deadline, "processes left 10 s after the timeout:\n{left}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("timed-out process group gone {:.1?} after the exec started", started.elapsed());

        // Per call, the sudo probe adds one round trip: measure a trivial command.
        let started = Instant::now();
        for _ in 0..10 {
            let r = provider.exec(&id, request(&["true"], Duration::from_secs(30))).await?;
            ensure!(r.exit_code == Some(0), "{r:?}");
        }
        let with_sudo = started.elapsed() / 10;
        let mut plain = config.clone();
        plain.ssh.become_root = Some(false);
        plain.state_dir = tmp.path().join("state-plain");
        let plain = build_provider(&plain).map_err(|e| anyhow::anyhow!("{e}"))?;
        let started = Instant::now();
        for _ in 0..10 {
            let r = plain.exec(&id, request(&["id", "-u"], Duration::from_secs(30))).await?;
            ensure!(r.exit_code == Some(0) && r.stdout.trim() != "0", "ssh.become: false runs as the login user: {r:?}");
        }
        eprintln!("one exec of a trivial command (connect, run): {with_sudo:.1?} through sudo (probed on the first contact only), {:.1?} as {USER}", started.elapsed() / 10);

        // Sudo rules that change after the probe: that run fails as sudo says, the next run
        // probes again and gets the clear error.
        node.exec("printf 'admin ALL=(ALL) ALL\\n' > /etc/sudoers.d/90-cloud-init-users")?;
        let refused = provider.exec(&id, request(&["true"], Duration::from_secs(30))).await?;
        ensure!(refused.exit_code == Some(1) && refused.stderr.contains("a password is required"), "{refused:?}");
        let err = provider.exec(&id, request(&["true"], Duration::from_secs(30))).await.err().context("the next run probes sudo again")?;
        ensure!(matches!(&err, ProviderError::Permanent(m) if m.contains("passwordless sudo is required")), "{err:?}");

        // A password prompt or no sudo at all: a Permanent error at once, naming user and host.
        for (provider, node, says) in [(&at_locked, &locked, "a password is required"), (&at_bare, &bare, "sudo is not installed")] {
            let started = Instant::now();
            let err = match provider.exec(&id, request(&["true"], Duration::from_secs(30))).await {
                Ok(r) => anyhow::bail!("exec on {} without usable sudo succeeded: {r:?}", node.ip),
                Err(e) => e,
            };
            let message = err.to_string();
            ensure!(matches!(err, ProviderError::Permanent(_)), "{err:?}");
            for word in [USER, node.ip.as_str(), says, "passwordless sudo is required"] {
                ensure!(message.contains(word), "the error should name {word:?}: {message}");
            }
            ensure!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        }
        provider.delete_server(&id).await.map_err(|e| anyhow::anyhow!("delete: {e}"))?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(())
}
