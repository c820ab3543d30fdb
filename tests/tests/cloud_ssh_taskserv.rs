//! A TaskServ whose scripts really run over SSH, end to end: `provisioning dev` with real
//! kubectl, the aws provider against the moto EC2 emulator, and a real OpenSSH sshd on
//! 127.0.0.1 standing in for the machine (the account's `ssh.addressOverride` and `ssh.port`
//! point there; moto boots nothing). The taskserv comes from the test-only catalog
//! `tests/ssh-catalog` (`PROVISIONING_CATALOG`): its scripts write, check and remove one file,
//! so nothing is installed on the host.
//!
//! What must hold:
//! - the Server logs in with its own key (`spec.sshKeySecretRef`, key `ssh-privatekey`): the
//!   account's `SSH_PRIVATE_KEY` is a key the sshd does not accept;
//! - `nu` and the catalog are copied under the account's `ssh.remoteDir` before the first run,
//!   the script's effect (a file) exists, its output streams to the controller log, and the
//!   TaskServ reaches Ready;
//! - the Server's `status.hostKey` is the sshd's host key;
//! - a Server naming a missing Secret, or a Secret without `ssh-privatekey`, is Stalled with a
//!   message naming the Secret and the key, and gets no machine; once the Secret exists it
//!   goes on without waiting for its backoff;
//! - a controller that lost its state dir pins the key recorded in status again (with the sshd
//!   down, so no contact could have pinned it), and then refuses a machine whose host key
//!   changed instead of re-pinning; with the right key back the TaskServ is healthy again;
//! - deleting the TaskServ runs its remove script over SSH; deleting the Servers leaves no
//!   machine at moto; no private key text appears in the log, any status or any event.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::cloud::{Moto, assert_no_secret_anywhere, condition, get_json, unique_secret, write_yaml_docs};
use provisioning_e2e::sshd::{HostKey, Sshd, key_body, keygen};
use provisioning_e2e::{tool, workspace_root};
use serde_json::{Value, json};

const NAMESPACE: &str = "ssh-e2e";
const ACCOUNT: &str = "aws-ssh";
/// An AMI id from moto's default set (moto boots nothing).
const MOTO_AMI: &str = "ami-1e749f67";
const REGION: &str = "eu-north-1";

/// The lines of a PEM private key's body: what must never show up anywhere.
fn key_lines(pem: &str) -> Vec<String> {
    pem.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("-----")).map(str::to_string).collect()
}

fn manifest(dir: &Path, moto: &Moto, sshd: &Sshd, account_key: &str, aws_secret: &str, remote_dir: &Path, marker: &Path) -> Result<String> {
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {"provisioning.dev/workspace": NAMESPACE}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-creds", "namespace": NAMESPACE}, "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": "AKIAE2ESSHTASKSERV01", "AWS_SECRET_ACCESS_KEY": aws_secret, "SSH_PRIVATE_KEY": account_key}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "web-ssh", "namespace": NAMESPACE}, "type": "kubernetes.io/ssh-auth",
            "stringData": {"ssh-privatekey": sshd.client_key}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "no-key-field", "namespace": NAMESPACE}, "type": "Opaque",
            "stringData": {"id_ed25519": "not the field the controller reads"}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NAMESPACE},
        "spec": {
            "defaults": {"provider": ACCOUNT, "plan": "small", "image": "debian-12"},
            "providers": [{
                "name": ACCOUNT, "type": "aws", "region": REGION, "endpoint": moto.endpoint,
                "credentialsSecretRef": {"name": "aws-creds"},
                "images": {"debian-12": MOTO_AMI}, "sshSourceCidrs": ["127.0.0.1/32"],
                "ssh": {"user": sshd.user, "port": sshd.port, "addressOverride": "127.0.0.1", "hostKeys": "FirstUse", "remoteDir": remote_dir.display().to_string()},
            }],
        }}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "web", "namespace": NAMESPACE},
            "spec": {"sshKeySecretRef": {"name": "web-ssh"}}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "no-secret", "namespace": NAMESPACE},
            "spec": {"sshKeySecretRef": {"name": "absent-ssh"}}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "wrong-field", "namespace": NAMESPACE},
            "spec": {"sshKeySecretRef": {"name": "no-key-field"}}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "marker", "namespace": NAMESPACE},
            "spec": {"service": "marker", "servers": {"names": ["web"]}, "config": {"path": marker.display().to_string()}}}),
    ];
    Ok(write_yaml_docs(dir, "ssh-taskserv.yaml", &docs)?.display().to_string())
}

/// The pinned host keys in the controller's known-hosts file (provider id → key line).
fn known_hosts(data_dir: &Path) -> Result<serde_json::Map<String, Value>> {
    // Pins are kept per workspace and account (the Workspace is named like the namespace).
    let path =
        data_dir.join("providers").join("pins").join(format!("workspace-{NAMESPACE}")).join(format!("known-hosts-aws-{ACCOUNT}.json"));
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(serde_json::from_str::<Value>(&text)?.as_object().cloned().unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

fn server(dev: &Dev, name: &str) -> Result<Value> {
    get_json(dev, &["srv", name, "-n", NAMESPACE])
}

fn stalled_naming(dev: &mut Dev, name: &str, must_name: &[&str]) -> Result<()> {
    let mut last = Value::Null;
    dev.wait_until(Duration::from_secs(60), &format!("Server {name} Stalled"), |d| {
        last = server(d, name)?;
        Ok(condition(&last, "Stalled").is_some_and(|c| c["status"] == "True"))
    })?;
    let stalled = condition(&last, "Stalled").cloned().unwrap_or_default();
    let message = stalled["message"].as_str().unwrap_or_default();
    for word in must_name {
        ensure!(message.contains(word), "Server {name}: the Stalled message should name {word:?}: {stalled}");
    }
    ensure!(last["status"]["providerID"].is_null(), "Server {name} got a machine without a usable key: {}", last["status"]);
    Ok(())
}

#[test]
fn taskserv_runs_over_ssh_with_the_servers_key_and_pins_the_host_key() -> Result<()> {
    let moto = Moto::start(&[])?;
    let mut sshd = Sshd::start()?;
    let tmp = tempfile::tempdir()?;
    let data_dir = tmp.path().join("data");
    let remote_dir = tmp.path().join("machine/provisioning");
    let marker = tmp.path().join("machine/effects/marker.txt");
    // The account's key is a real key the sshd does not accept: only the Server's own works.
    let account_key = keygen(&tmp.path().join("account_ed25519"))?;
    let aws_secret = unique_secret("aws-secret-key");
    let path = manifest(tmp.path(), &moto, &sshd, &account_key, &aws_secret, &remote_dir, &marker)?;
    let catalog = workspace_root().join("tests/ssh-catalog").display().to_string();
    // Verbose logs: streamed script output is logged at info, and the secret check below is
    // only as strong as what the log holds.
    let env = [("PROVISIONING_CATALOG", catalog.as_str()), ("RUST_LOG", "info,provisioning_controller=debug,provisioning_providers=debug")];
    let mut secrets: Vec<String> = key_lines(&sshd.client_key);
    secrets.extend(key_lines(&account_key));
    secrets.push(aws_secret.clone());
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();

    let mut dev = Dev::start_in_with(&data_dir, &[&path], &env, &["--allow-insecure-endpoints"])?;
    let started = std::time::Instant::now();
    // `--apply` may still be creating the last objects: wait for the TaskServ to exist first.
    dev.wait_until(Duration::from_secs(60), "TaskServ marker created", |d| {
        Ok(d.kubectl(&["get", "ts", "marker", "-n", NAMESPACE]).map(|o| o.status.success()).unwrap_or(false))
    })?;
    if let Err(e) = dev.kubectl_ok(&["wait", "--for=condition=Ready", "ts/marker", "-n", NAMESPACE, "--timeout=240s"]) {
        let ts = dev.kubectl_ok(&["get", "ts", "marker", "-n", NAMESPACE, "-o", "yaml"]).unwrap_or_default();
        let srv = dev.kubectl_ok(&["get", "srv", "-n", NAMESPACE, "-o", "yaml"]).unwrap_or_default();
        return Err(e.context(format!("TaskServ:\n{ts}\nServers:\n{srv}\nsshd log:\n{}", sshd.log())));
    }
    eprintln!("TaskServ Ready over SSH {:.1?} after start", started.elapsed());

    // The script's effect, and its output streamed to the controller's log.
    let written = std::fs::read_to_string(&marker).with_context(|| format!("the install script wrote no {}", marker.display()))?;
    ensure!(written == "web 1.0\n", "marker file holds {written:?}");
    ensure!(dev.log().contains(&format!("==> wrote {} on web", marker.display())), "the script's output is not in the controller log");

    // nu and the catalog were copied under ssh.remoteDir before the first run.
    let host_nu = std::fs::read(tool("PROVISIONING_NU", "nu"))?;
    let remote_nu = std::fs::read(remote_dir.join("bin/nu")).context("nu was not copied to the machine")?;
    ensure!(remote_nu == host_nu, "the copied nu differs from the host's");
    use std::os::unix::fs::PermissionsExt;
    ensure!(std::fs::metadata(remote_dir.join("bin/nu"))?.permissions().mode() & 0o777 == 0o755, "nu is not executable");
    for script in ["install.nu", "check.nu", "remove.nu", "taskserv.yaml"] {
        let local = std::fs::read(workspace_root().join("tests/ssh-catalog/marker").join(script))?;
        let copied = std::fs::read(remote_dir.join("catalog/marker").join(script)).with_context(|| format!("{script} was not copied"))?;
        ensure!(copied == local, "the copied {script} differs");
    }
    ensure!(!std::fs::read_to_string(remote_dir.join("assets.sha256"))?.trim().is_empty(), "no copy marker");

    // The host key: pinned on first contact and recorded in the Server's status.
    let host_key = sshd.host_public_key()?;
    let mut recorded = String::new();
    dev.wait_until(Duration::from_secs(60), "Server web records status.hostKey", |d| {
        recorded = server(d, "web")?["status"]["hostKey"].as_str().unwrap_or_default().to_string();
        Ok(!recorded.is_empty())
    })?;
    ensure!(key_body(&recorded) == host_key, "status.hostKey {recorded:?} is not the sshd's host key {host_key:?}");
    let web = server(&dev, "web")?;
    let web_id = web["status"]["providerID"].as_str().context("providerID")?.to_string();
    ensure!(condition(&web, "Ready").is_some_and(|c| c["status"] == "True"), "{}", web["status"]);

    // A missing Secret, or one without ssh-privatekey: Stalled naming both, and no machine.
    stalled_naming(&mut dev, "no-secret", &["Secret ssh-e2e/absent-ssh", "ssh-privatekey"])?;
    stalled_naming(&mut dev, "wrong-field", &["Secret ssh-e2e/no-key-field", "ssh-privatekey", "id_ed25519"])?;
    let live = moto.live_instances(REGION)?;
    ensure!(live.len() == 1 && live[0].provider_id.0 == web_id, "machines at moto: {live:?}");
    // The missing Secret appears: the Server goes on at once (the Secret watch re-triggers it;
    // its error backoff alone would take 30 s and more).
    let key_file = sshd.dir.path().join("client_ed25519").display().to_string();
    dev.kubectl_ok(&["create", "secret", "generic", "absent-ssh", "-n", NAMESPACE, &format!("--from-file=ssh-privatekey={key_file}")])?;
    let appeared = std::time::Instant::now();
    dev.wait_until(Duration::from_secs(25), "Server no-secret Ready once its Secret exists", |d| {
        Ok(condition(&server(d, "no-secret")?, "Ready").is_some_and(|c| c["status"] == "True"))
    })?;
    eprintln!("Server no-secret Ready {:.1?} after its Secret appeared", appeared.elapsed());
    assert_no_secret_anywhere(&dev, &secrets)?;

    // A new controller without its state dir, and the machine unreachable: the key comes back
    // from status alone.
    dev.stop();
    sshd.stop();
    std::fs::remove_file(
        data_dir.join("providers").join("pins").join(format!("workspace-{NAMESPACE}")).join(format!("known-hosts-aws-{ACCOUNT}.json")),
    )?;
    let mut dev = Dev::start_in_with(&data_dir, &[], &env, &["--allow-insecure-endpoints"])?;
    let restarted = std::time::Instant::now();
    dev.wait_until(Duration::from_secs(60), "the host key pinned again from status.hostKey", |_| {
        Ok(known_hosts(&data_dir)?.get(&web_id).and_then(Value::as_str).is_some_and(|k| key_body(k) == host_key))
    })?;

    eprintln!("host key pinned again from status {:.1?} after the restart (sshd down)", restarted.elapsed());

    // The machine now offers another host key: refused with a clear message, never re-pinned.
    sshd.start_again(HostKey::New)?;
    let mut refusal = String::new();
    dev.wait_until(Duration::from_secs(90), "the TaskServ reports the changed host key", |d| {
        let ts = d.kubectl_ok(&["get", "ts", "marker", "-n", NAMESPACE, "-o", "json"])?;
        let events = d.kubectl_ok(&["get", "events.events.k8s.io", "-n", NAMESPACE, "-o", "json"])?;
        refusal = [ts, events].into_iter().find(|t| t.contains("refusing to connect")).unwrap_or_default();
        Ok(!refusal.is_empty())
    })?;
    let at = refusal.find("SSH host key").unwrap_or(0);
    let excerpt: String = refusal[at..].chars().take(240).collect();
    eprintln!("refused: {excerpt}");
    ensure!(excerpt.contains("changed"), "the refusal says the key changed: {excerpt}");
    let pinned = known_hosts(&data_dir)?.get(&web_id).and_then(Value::as_str).map(key_body);
    ensure!(pinned.as_deref() == Some(host_key.as_str()), "re-pinned to {pinned:?}");
    let still = server(&dev, "web")?["status"]["hostKey"].as_str().map(key_body);
    ensure!(still.as_deref() == Some(host_key.as_str()), "status.hostKey changed to {still:?}");

    // The right key back: healthy again.
    sshd.start_again(HostKey::Previous)?;
    dev.wait_until(Duration::from_secs(120), "the TaskServ healthy again", |d| {
        let ts = get_json(d, &["ts", "marker", "-n", NAMESPACE])?;
        let entry = &ts["status"]["servers"][0];
        let tail = entry["lastRun"]["outputTail"].as_str().unwrap_or_default();
        Ok(condition(&ts, "Ready").is_some_and(|c| c["status"] == "True") && entry["healthy"] == true && !tail.contains("refusing"))
    })?;

    // Deleting the TaskServ runs remove.nu over SSH; deleting the Servers leaves no machine.
    dev.kubectl_ok(&["delete", "ts", "marker", "-n", NAMESPACE, "--timeout=120s"])?;
    ensure!(!marker.exists(), "remove.nu did not delete {}", marker.display());
    dev.kubectl_ok(&["delete", "srv", "--all", "-n", NAMESPACE, "--timeout=120s"])?;
    let mut left = usize::MAX;
    dev.wait_until(Duration::from_secs(60), "no machine left at moto", |_| {
        left = moto.live_instances(REGION)?.len();
        Ok(left == 0)
    })
    .with_context(|| format!("{left} machine(s) left"))?;
    assert_no_secret_anywhere(&dev, &secrets)?;
    Ok(())
}
