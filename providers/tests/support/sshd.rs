//! A real OpenSSH server on 127.0.0.1 with a free port, a temporary host key and an
//! authorized client key; stopped when dropped. Panics (never skips) when sshd is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running sshd.
pub struct Sshd {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Temporary directory holding its keys and config.
    pub dir: tempfile::TempDir,
    /// The client's private key (OpenSSH format), authorized for `user`.
    pub client_key: String,
    /// The client's public key line.
    pub client_public_key: String,
    /// The server's host public key line.
    pub host_public_key: String,
    /// The login user (the user running the tests).
    pub user: String,
}

fn sshd_binary() -> PathBuf {
    let path = PathBuf::from("/usr/sbin/sshd");
    assert!(path.exists(), "sshd not found at /usr/sbin/sshd: run scripts/setup.sh (it installs openssh-server)");
    path
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .expect("ssh-keygen (run scripts/setup.sh)");
    assert!(status.success(), "ssh-keygen failed");
}

impl Sshd {
    /// Starts sshd.
    pub fn start() -> Sshd {
        let sshd = sshd_binary();
        let dir = tempfile::tempdir().expect("tempdir");
        let host_key = dir.path().join("host_ed25519");
        let client_key = dir.path().join("client_ed25519");
        keygen(&host_key);
        keygen(&client_key);
        let client_public_key = std::fs::read_to_string(client_key.with_extension("pub")).expect("client pub");
        std::fs::write(dir.path().join("authorized_keys"), &client_public_key).expect("authorized_keys");
        let port = super::free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nPidFile {dir}/sshd.pid\nAuthorizedKeysFile {dir}/authorized_keys\n\
             StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n\
             PrintMotd no\nLogLevel ERROR\n",
            host = host_key.display(),
            dir = dir.path().display()
        );
        let config_path = dir.path().join("sshd_config");
        std::fs::write(&config_path, config).expect("sshd_config");
        // sshd's privilege separation needs this directory when it runs as root.
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::File::create(dir.path().join("sshd.log")).expect("log");
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sshd");
        super::wait_for_port(port, Duration::from_secs(20), "sshd");
        let user = std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| {
            let out = Command::new("id").arg("-un").output().expect("id -un");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        });
        Sshd {
            child,
            port,
            client_key: std::fs::read_to_string(&client_key).expect("client key"),
            client_public_key: client_public_key.trim().to_string(),
            host_public_key: std::fs::read_to_string(host_key.with_extension("pub")).expect("host pub").trim().to_string(),
            user,
            dir,
        }
    }

    /// The sshd log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
