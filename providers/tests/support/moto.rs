//! Starts `moto_server` on 127.0.0.1 with a free port and stops it when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running moto server.
pub struct Moto {
    child: Child,
    /// Its port.
    pub port: u16,
    /// `http://127.0.0.1:<port>/`.
    pub endpoint: String,
}

/// The moto binary: `$PROVISIONING_MOTO`, else `.tools/bin/moto_server`. Panics (never skips)
/// when it is missing.
pub fn moto_binary() -> PathBuf {
    let candidate =
        std::env::var_os("PROVISIONING_MOTO").map(PathBuf::from).unwrap_or_else(|| super::repo_root().join(".tools/bin/moto_server"));
    assert!(
        candidate.exists(),
        "moto_server not found at {}: run scripts/setup.sh (it installs moto[server] into .tools/)",
        candidate.display()
    );
    candidate
}

impl Moto {
    /// Starts moto.
    pub fn start() -> Moto {
        Self::start_with_env(&[])
    }

    /// Starts moto with extra environment (e.g. `INITIAL_NO_AUTH_ACTION_COUNT=0` to make it
    /// check credentials).
    pub fn start_with_env(env: &[(&str, &str)]) -> Moto {
        let port = super::free_port();
        let mut command = Command::new(moto_binary());
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("spawn moto_server (run scripts/setup.sh)");
        let moto = Moto { child, port, endpoint: format!("http://127.0.0.1:{port}/") };
        super::wait_for_port(port, Duration::from_secs(60), "moto_server");
        moto
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
