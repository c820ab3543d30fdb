//! Test harnesses shared by the provider tests: the moto server, a real sshd, the
//! fault-injecting proxy, the EC2 scripting proxy and the account-limits proxy (the UpCloud test double is the
//! `upcloud-double` crate, shared with the end-to-end tests). Each test binary uses a subset.
#![allow(dead_code)]

pub mod ec2_proxy;
pub mod fault_proxy;
pub mod limit_proxy;
pub mod moto;
pub mod sshd;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// Waits until something accepts connections on the port, or panics naming `what`.
pub fn wait_for_port(port: u16, deadline: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within {deadline:?}");
}
