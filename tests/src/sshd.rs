//! A real OpenSSH server on 127.0.0.1 for the end-to-end tests of SSH task runs: a free port,
//! a temporary ed25519 host key and one authorised client key; stopped when dropped. Fails
//! (never skips) when sshd or ssh-keygen is missing: `scripts/setup.sh` installs
//! openssh-server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cloud::free_port;

/// A running (or stopped, see [`Sshd::stop`]) sshd.
pub struct Sshd {
    child: Option<Child>,
    /// Its port (kept across restarts).
    pub port: u16,
    /// Temporary directory holding its keys, config and log.
    pub dir: tempfile::TempDir,
    /// The authorised client private key (OpenSSH PEM).
    pub client_key: String,
    /// The login user (the user running the tests).
    pub user: String,
}

const SSHD: &str = "/usr/sbin/sshd";

/// Generates an ed25519 key pair at `path` (and `path.pub`) and returns the private key.
pub fn keygen(path: &Path) -> Result<String> {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("pub"));
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .context("ssh-keygen not found: run scripts/setup.sh (it installs openssh-server)")?;
    ensure!(status.success(), "ssh-keygen failed for {}", path.display());
    Ok(std::fs::read_to_string(path)?)
}

/// `algorithm base64` of an OpenSSH public-key line (comment dropped).
pub fn key_body(line: &str) -> String {
    line.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

impl Sshd {
    /// Starts sshd with a fresh host key.
    pub fn start() -> Result<Sshd> {
        ensure!(Path::new(SSHD).exists(), "sshd not found at {SSHD}: run scripts/setup.sh (it installs openssh-server)");
        let dir = tempfile::tempdir()?;
        keygen(&dir.path().join("host_ed25519"))?;
        let client_key = keygen(&dir.path().join("client_ed25519"))?;
        std::fs::copy(dir.path().join("client_ed25519.pub"), dir.path().join("authorized_keys"))?;
        let user = std::env::var("USER").ok().filter(|u| !u.is_empty()).map_or_else(
            || -> Result<String> {
                let out = Command::new("id").arg("-un").output()?;
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            },
            Ok,
        )?;
        let mut sshd = Sshd { child: None, port: free_port()?, dir, client_key, user };
        sshd.run()?;
        Ok(sshd)
    }

    fn host_key_path(&self) -> PathBuf {
        self.dir.path().join("host_ed25519")
    }

    /// The host public key as `algorithm base64`.
    pub fn host_public_key(&self) -> Result<String> {
        Ok(key_body(&std::fs::read_to_string(self.host_key_path().with_extension("pub"))?))
    }

    fn run(&mut self) -> Result<()> {
        let dir = self.dir.path();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nPidFile {dir}/sshd.pid\nAuthorizedKeysFile {dir}/authorized_keys\n\
             StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n\
             PrintMotd no\nLogLevel VERBOSE\n",
            port = self.port,
            host = self.host_key_path().display(),
            dir = dir.display()
        );
        std::fs::write(dir.join("sshd_config"), config)?;
        // Privilege separation needs this directory when sshd runs as root.
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("sshd.log"))?;
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawn sshd")?;
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("sshd exited ({status}) before listening on port {}:\n{}", self.port, self.log());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("sshd did not listen on 127.0.0.1:{} within 20 s:\n{}", self.port, self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops sshd. Its port is not reserved meanwhile: restart promptly.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts sshd again on the same port, with the host key `host_key` says (a new one plays
    /// a machine whose key changed).
    pub fn start_again(&mut self, host_key: HostKey) -> Result<()> {
        self.stop();
        let path = self.host_key_path();
        match host_key {
            HostKey::Keep => {}
            HostKey::New => {
                let old = path.with_extension("previous");
                std::fs::copy(&path, &old)?;
                std::fs::copy(path.with_extension("pub"), old.with_extension("previous.pub"))?;
                keygen(&path)?;
            }
            HostKey::Previous => {
                let old = path.with_extension("previous");
                std::fs::copy(&old, &path)?;
                std::fs::copy(old.with_extension("previous.pub"), path.with_extension("pub"))?;
            }
        }
        self.run()
    }

    /// The sshd log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

/// Which host key [`Sshd::start_again`] starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKey {
    /// The current one.
    Keep,
    /// A new one (the current is kept aside).
    New,
    /// The one kept aside by the last `New`.
    Previous,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}
