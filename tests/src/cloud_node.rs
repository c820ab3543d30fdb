//! A container that behaves like a Debian cloud image, for end-to-end tests of task scripts
//! over SSH: OpenSSH server, a non-root login user `admin` with passwordless sudo (as
//! cloud-init sets up on Debian AMIs), root login and passwords disabled, host keys generated
//! at first start.
//!
//! The image is the local node image (`provisioning-node:latest`, built by `provisioning image
//! build`) plus `openssh-server` and `sudo` installed with apt in a container and committed as
//! `provisioning-e2e-cloud-node:<node image id>`: built once (about 10 s; the node image ships
//! its package lists) and reused while the node image stays the same. Every container carries
//! [`LABEL`] and the id of the test process; containers of processes that are gone are removed
//! when the next one starts. Fails, never skips, when Docker or the node image is missing.

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::docker::{docker, docker_ok, require_node_image};

/// Label on every container (and the committed image) made here.
pub const LABEL: &str = "provisioning.dev/e2e-cloud-node";
/// The login user, as on Debian's cloud images.
pub const USER: &str = "admin";
const IMAGE_REPO: &str = "provisioning-e2e-cloud-node";
const SUDOERS: &str = "/etc/sudoers.d/90-cloud-init-users";

/// Runs inside a container from the node image; the result is committed as the image.
const SETUP: &str = r#"set -eu
export DEBIAN_FRONTEND=noninteractive
add_packages() { apt-get install -y -q --no-install-recommends openssh-server sudo; }
# The node image ships package lists; refresh them only if they went stale.
add_packages || { apt-get update -q && add_packages; }
useradd --create-home --shell /bin/bash admin
install -d -m 700 -o admin -g admin /home/admin/.ssh
printf 'admin ALL=(ALL) NOPASSWD:ALL\n' > /etc/sudoers.d/90-cloud-init-users
chmod 440 /etc/sudoers.d/90-cloud-init-users
printf 'PermitRootLogin no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n' > /etc/ssh/sshd_config.d/50-cloud-image.conf
rm -f /etc/ssh/ssh_host_*
apt-get clean
"#;

/// The container's command: fresh host keys (as a cloud machine's first boot), then sshd.
const START: &str = "ssh-keygen -A >/dev/null && mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e";

/// How `admin` may use sudo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sudo {
    /// `NOPASSWD:ALL`, as cloud images do.
    Passwordless,
    /// `ALL=(ALL) ALL` with a password set: sudo would prompt.
    PasswordRequired,
    /// No sudo installed (minimal images).
    Missing,
}

/// A running cloud-like machine; removed when dropped.
pub struct CloudNode {
    /// Container id.
    pub id: String,
    /// Its address on the Docker bridge (reachable from the host).
    pub ip: String,
}

static IMAGE: Mutex<Option<String>> = Mutex::new(None);

fn alive(pid: &str) -> bool {
    std::path::Path::new("/proc").join(pid).exists()
}

/// Removes containers left by test processes that are gone.
fn remove_leftovers() -> Result<()> {
    let listed =
        docker_ok(&["ps", "-a", "--filter", &format!("label={LABEL}"), "--format", &format!("{{{{.ID}}}} {{{{.Label \"{LABEL}\"}}}}")])?;
    for line in listed.lines() {
        let mut words = line.split_whitespace();
        let (Some(id), owner) = (words.next(), words.next().unwrap_or("")) else { continue };
        if owner.is_empty() || !alive(owner) {
            let _ = docker(&["rm", "-f", id]);
        }
    }
    Ok(())
}

/// The cloud-node image for the current node image, built when missing.
pub fn image() -> Result<String> {
    let mut cached = IMAGE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(tag) = cached.as_ref() {
        return Ok(tag.clone());
    }
    require_node_image()?;
    remove_leftovers()?;
    let node_id = docker_ok(&["image", "inspect", "--format", "{{.Id}}", "provisioning-node:latest"])?;
    let short: String = node_id.trim().trim_start_matches("sha256:").chars().take(12).collect();
    let tag = format!("{IMAGE_REPO}:{short}");
    if !docker(&["image", "inspect", &tag])?.status.success() {
        let started = Instant::now();
        let name = format!("{IMAGE_REPO}-build-{}", std::process::id());
        let _ = docker(&["rm", "-f", &name]);
        let owner = format!("{LABEL}={}", std::process::id());
        let built = docker(&["run", "--name", &name, "--label", &owner, "provisioning-node:latest", "sh", "-c", SETUP])?;
        let committed = if built.status.success() {
            docker(&[
                "commit",
                "--change",
                &format!("CMD [\"sh\", \"-c\", \"{START}\"]"),
                "--change",
                &format!("LABEL {LABEL}=image"),
                &name,
                &tag,
            ])
        } else {
            Ok(built.clone())
        };
        let _ = docker(&["rm", "-f", &name]);
        if !built.status.success() {
            bail!(
                "installing openssh-server and sudo into the node image failed ({}):\n{}{}",
                built.status,
                String::from_utf8_lossy(&built.stdout),
                String::from_utf8_lossy(&built.stderr)
            );
        }
        let committed = committed?;
        ensure!(committed.status.success(), "docker commit {tag}: {}", String::from_utf8_lossy(&committed.stderr));
        eprintln!("built {tag} (node image + openssh-server + sudo) in {:.1?}", started.elapsed());
        // Images made for earlier node images only take space (one still in use stays).
        for old in docker_ok(&["images", IMAGE_REPO, "--format", "{{.Repository}}:{{.Tag}}"])?.lines() {
            if old.trim() != tag {
                let _ = docker(&["rmi", old.trim()]);
            }
        }
    }
    *cached = Some(tag.clone());
    Ok(tag)
}

impl CloudNode {
    /// Starts a machine whose `admin` accepts `authorized_key` (an OpenSSH public-key line) and
    /// uses sudo as `sudo` says; waits until sshd listens.
    pub fn start(authorized_key: &str, sudo: Sudo) -> Result<CloudNode> {
        let image = image()?;
        let owner = format!("{LABEL}={}", std::process::id());
        let id = docker_ok(&["run", "-d", "--label", &owner, &image])?.trim().to_string();
        // Owned from here: an early return removes the container.
        let mut node = CloudNode { id, ip: String::new() };
        let ip = docker_ok(&["inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", &node.id])?;
        node.ip = ip.trim().to_string();
        ensure!(!node.ip.is_empty(), "container {} has no IP address", node.id);
        node.exec_stdin(
            "cat > /home/admin/.ssh/authorized_keys && chown admin:admin /home/admin/.ssh/authorized_keys && chmod 600 /home/admin/.ssh/authorized_keys",
            authorized_key.as_bytes(),
        )?;
        if sudo == Sudo::PasswordRequired {
            node.exec(&format!("printf 'admin ALL=(ALL) ALL\\n' > {SUDOERS}"))?;
            // On stdin, not the command line.
            node.exec_stdin("chpasswd", b"admin:e2e-sudo-password-not-given\n")?;
        }
        if sudo == Sudo::Missing {
            node.exec("rm -f /usr/bin/sudo")?;
        }
        let started = Instant::now();
        while std::net::TcpStream::connect_timeout(&format!("{}:22", node.ip).parse()?, Duration::from_secs(1)).is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                let logs = docker(&["logs", &node.id]).map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
                bail!("sshd in container {} did not listen on {}:22 within 30 s:\n{logs}", node.id, node.ip);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(node)
    }

    /// Runs a shell command in the container as root; returns stdout.
    pub fn exec(&self, script: &str) -> Result<String> {
        docker_ok(&["exec", &self.id, "sh", "-c", script])
    }

    /// Runs a shell command in the container as root with `input` on stdin.
    pub fn exec_stdin(&self, script: &str, input: &[u8]) -> Result<String> {
        use std::io::Write;
        let mut child = Command::new("docker")
            .args(["exec", "-i", &self.id, "sh", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("docker exec")?;
        child.stdin.take().context("stdin")?.write_all(input)?;
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "docker exec {script:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The machine's ed25519 host key, `algorithm base64`.
    pub fn host_key(&self) -> Result<String> {
        Ok(crate::sshd::key_body(&self.exec("cat /etc/ssh/ssh_host_ed25519_key.pub")?))
    }
}

impl Drop for CloudNode {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.id]);
    }
}
