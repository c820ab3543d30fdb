//! Starts `moto_server` on 127.0.0.1 with a free port and stops it when dropped.

use std::io::{BufRead, BufReader};
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
    ///
    /// Moto binds port 0 itself and the port is read from the line it prints ("Running on
    /// http://127.0.0.1:PORT"): picking a free port first and passing it races with every
    /// other test binding port 0 meanwhile (moto takes seconds to start), and the test then
    /// talks to whatever else got the port.
    pub fn start_with_env(env: &[(&str, &str)]) -> Moto {
        let mut command = Command::new(moto_binary());
        command.args(["-H", "127.0.0.1", "-p", "0"]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn moto_server (run scripts/setup.sh)");
        let stderr = child.stderr.take().expect("moto's stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the port, then keeps draining stderr (moto logs every request there).
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(port) = line.split("Running on http://127.0.0.1:").nth(1).and_then(|rest| rest.trim().parse::<u16>().ok())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(port);
                }
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("moto_server did not report its port within 60 s");
            }
        };
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
