//! Backup and restore of the embedded control plane end to end (issue 30, item 4), with the
//! real binary and the simulated provider's journal as the oracle: a Cluster's 3 Servers are
//! Ready; `provisioning backup` snapshots the running server; `provisioning dev` is killed with
//! SIGKILL while its controller writes; the data dir is deleted (the simulated cloud, kept in
//! `providers/`, outlives it); a corrupt and a truncated copy of the backup are refused, as is
//! restoring over a non-empty dir; `provisioning restore` rebuilds the data dir and
//! `provisioning dev` starts on it: the Cluster is Ready again on the same machines, and a
//! scale to 4 creates exactly one machine — none was created twice.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;

const NS: &str = "backup-restore";
const MANIFEST: &str = "tests/tests/backup_restore_simulated.yaml";

/// Machine creations in the simulated provider's journals under `dir` (every `create` line).
fn creates(dir: &std::path::Path) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("simulated-") && n.ends_with(".jsonl")) {
            n += std::fs::read_to_string(&p)?.lines().filter(|l| l.contains(r#""op":"create""#)).count();
        }
    }
    Ok(n)
}

/// Servers of the namespace that are Ready.
fn ready_servers(dev: &Dev) -> Result<usize> {
    let out = dev.kubectl_ok(&[
        "get",
        "servers",
        "-n",
        NS,
        "-o",
        r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ])?;
    Ok(out.lines().filter(|l| *l == "True").count())
}

fn restore(file: &std::path::Path, dir: &std::path::Path) -> Result<std::process::Output> {
    provisioning_e2e::provisioning(&["restore", "-f", &file.display().to_string(), "--data-dir", &dir.display().to_string()])
}

#[test]
fn restored_control_plane_converges_without_creating_a_machine_twice() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let mut dev = Dev::start_in(&data, &[MANIFEST])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "ts/etcd-etcd", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "3 Servers Ready", |d| Ok(ready_servers(d)? == 3))?;
    let providers = data.join("providers");
    let before = provisioning_e2e::simulated_machines(&providers)?;
    ensure!(before.len() == 3 && creates(&providers)? == 3, "3 machines: {before:?}");

    // The backup, from the running server (it holds the database), mode 0600.
    let file = tmp.path().join("control-plane.backup");
    let out = provisioning_e2e::provisioning_ok(&["backup", "--data-dir", &data.display().to_string(), "-o", &file.display().to_string()])?;
    ensure!(out.contains("from the running server"), "{out}");
    ensure!(std::fs::metadata(&file)?.permissions().mode() & 0o777 == 0o600, "the backup holds every Secret: mode 0600");
    dev.kill9();
    // With no server on the data dir, the backup reads its database file.
    let offline = tmp.path().join("offline.backup");
    let out =
        provisioning_e2e::provisioning_ok(&["backup", "--data-dir", &data.display().to_string(), "-o", &offline.display().to_string()])?;
    ensure!(out.contains("from the database file"), "{out}");

    // The data dir is lost; the cloud (the simulated account in providers/) is not.
    let cloud = tmp.path().join("cloud");
    std::fs::rename(&providers, &cloud)?;
    std::fs::remove_dir_all(&data)?;

    // A truncated and a corrupt copy are refused, naming the problem, and create nothing.
    let bytes = std::fs::read(&file)?;
    let truncated = tmp.path().join("truncated.backup");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3])?;
    let corrupt = tmp.path().join("corrupt.backup");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x20;
    std::fs::write(&corrupt, &flipped)?;
    for (copy, problem) in [(&truncated, "truncated"), (&corrupt, "corrupt")] {
        let out = restore(copy, &data)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && stderr.contains(problem), "{problem} backup: {stderr}");
        ensure!(!data.exists(), "a refused restore created {}", data.display());
    }
    // Restoring over a non-empty dir needs --force.
    let out = restore(&file, &cloud)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && stderr.contains("--force"), "restore over a non-empty dir: {stderr}");

    let out = restore(&file, &data)?;
    ensure!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&cloud, &providers)?;
    let mut dev = Dev::start_in(&data, &[])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "ts/etcd-etcd", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "3 Servers Ready after the restore", |d| Ok(ready_servers(d)? == 3))?;

    // The controller works on the restored objects: a scale-up creates one machine, the three
    // it had are kept.
    dev.kubectl_ok(&[
        "patch",
        "cluster",
        "etcd",
        "-n",
        NS,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/pools/0/replicas","value":4}]"#,
    ])?;
    dev.wait_until(Duration::from_secs(120), "4 Servers Ready", |d| Ok(ready_servers(d)? == 4))?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "ts/etcd-etcd", "-n", NS, "--timeout=120s"])?;
    let after = provisioning_e2e::simulated_machines(&providers)?;
    ensure!(before.iter().all(|m| after.contains(m)), "the machines from before the restore are kept: {before:?} → {after:?}");
    let created = creates(&providers)?;
    ensure!(
        after.len() == 4 && created == 4,
        "one machine per Server, none created twice: {created} creates, {after:?}\n{}",
        dev.log_tail(40)
    );
    dev.stop();
    Ok(())
}

/// The backup taken as soon as the Cluster's Servers exist, while the controller creates their
/// machines (Servers with no machine recorded in the backup yet): after the restore the
/// controller finds the machines created meanwhile (tagged with the Server's uid, which the
/// restore keeps) instead of creating them again.
#[test]
fn restore_of_a_backup_taken_while_machines_are_created_creates_none_twice() -> Result<()> {
    const NS: &str = "backup-midway";
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let data_arg = data.display().to_string();
    let file = tmp.path().join("midway.backup");
    let mut dev = Dev::start_in(&data, &["tests/tests/backup_restore_midway.yaml"])?;
    // The Cluster has made its 3 Servers (a Server made after the backup gets a new uid after
    // the restore: its first machine is orphaned, see the README); their machines may be
    // anywhere between not asked for and recorded.
    dev.wait_until(Duration::from_secs(60), "3 Server objects", |d| {
        Ok(d.kubectl_ok(&["get", "servers", "-n", NS, "-o", "name"])?.lines().count() == 3)
    })?;
    provisioning_e2e::provisioning_ok(&["backup", "--data-dir", &data_arg, "-o", &file.display().to_string()])?;
    // Servers in the backup and how many of them had a machine recorded.
    let text = std::fs::read_to_string(&file)?;
    let servers: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!(r#""provisioning.dev/servers\u0000{NS}\u0000"#))).collect();
    let recorded = servers.iter().filter(|l| l.contains(r#""providerID""#)).count();
    ensure!(servers.len() == 3 && recorded < 3, "the backup holds the 3 Servers, a machine in flight: {recorded} recorded");
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "-n", NS, "--timeout=120s"])?;
    dev.kill9();
    let providers = data.join("providers");
    let cloud = tmp.path().join("cloud");
    std::fs::rename(&providers, &cloud)?;
    std::fs::remove_dir_all(&data)?;
    let out = restore(&file, &data)?;
    ensure!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&cloud, &providers)?;
    let mut dev = Dev::start_in(&data, &[])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "ts/etcd-etcd", "-n", NS, "--timeout=120s"])?;
    dev.wait_until(Duration::from_secs(60), "3 Servers Ready after the restore", |d| {
        let out = d.kubectl_ok(&[
            "get",
            "servers",
            "-n",
            NS,
            "-o",
            r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
        ])?;
        Ok(out.lines().filter(|l| *l == "True").count() == 3)
    })?;
    let machines = provisioning_e2e::simulated_machines(&providers)?;
    let created = creates(&providers)?;
    eprintln!("the backup held {} Server(s), {recorded} with a machine recorded", servers.len());
    ensure!(
        machines.len() == 3 && created == 3,
        "one machine per Server, none created twice: {created} creates, {machines:?}\n{}",
        dev.log_tail(40)
    );
    dev.stop();
    Ok(())
}
