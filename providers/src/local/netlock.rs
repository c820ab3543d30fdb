//! A lock on this host's Docker networks shared by every process of ours, not only this one.
//!
//! Docker 20.10 (Debian's engine) creates two networks of one name when two creates race,
//! and a container that joins by that name can then no longer start ("network … is
//! ambiguous"). Two controller processes on one host (a leader hand-over, `provisioning test`
//! beside a running controller) would race exactly there, so network create and remove and
//! the container create that joins a network run under an advisory `flock` on a file named
//! after the engine's endpoint. The kernel drops the lock with its holder, so a process
//! killed with -9 never leaves it held. Duplicates that appear anyway (another host using the
//! same engine, a process without access to the lock file, leftovers of older versions) are
//! merged by `LocalProvider::ensure_network`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};

use crate::{ProviderError, ProviderResult};

/// How long a process waits for another one's network step (seconds of Docker calls).
const WAIT: Duration = Duration::from_secs(60);

/// The in-process mutex plus the cross-process file lock.
pub(super) struct NetworkLock {
    local: Mutex<()>,
    path: PathBuf,
}

/// Held while networks are created, joined or removed; both locks are released on drop.
pub(super) struct NetworkGuard<'a> {
    _local: MutexGuard<'a, ()>,
    _file: Option<File>,
}

impl NetworkLock {
    /// The lock for the engine at `endpoint` ("" = the default socket).
    pub(super) fn new(endpoint: &str) -> Self {
        let key = if endpoint.is_empty() { "default".to_string() } else { format!("{:016x}", super::image::fnv1a64(endpoint.as_bytes())) };
        let path = std::env::temp_dir().join(format!("provisioning-docker-networks-{key}.lock"));
        NetworkLock { local: Mutex::new(()), path }
    }

    /// Takes both locks. Without a usable lock file (a read-only temp dir, another user's
    /// file) only the in-process one is held and duplicates are merged afterwards.
    pub(super) async fn lock(&self) -> ProviderResult<NetworkGuard<'_>> {
        let local = self.local.lock().await;
        let path = self.path.clone();
        let file = tokio::task::spawn_blocking(move || acquire(path))
            .await
            .map_err(|e| ProviderError::Transient(format!("waiting for the Docker network lock: {e}")))??;
        Ok(NetworkGuard { _local: local, _file: file })
    }
}

fn acquire(path: PathBuf) -> ProviderResult<Option<File>> {
    let file = match OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&path) {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "no cross-process Docker network lock; duplicates are merged instead");
            return Ok(None);
        }
    };
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < give_up => std::thread::sleep(Duration::from_millis(10)),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(ProviderError::Transient(format!(
                    "another process has held the Docker network lock {} for over {}s",
                    path.display(),
                    WAIT.as_secs()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::debug!(path = %path.display(), error = %e, "flock failed; duplicates are merged instead");
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn two_locks_on_one_engine_exclude_each_other_and_release_on_drop() {
        let endpoint = format!("unix:///test/{}", std::process::id());
        let (a, b) = (NetworkLock::new(&endpoint), NetworkLock::new(&endpoint));
        let held = a.lock().await.expect("first");
        let waiting = tokio::spawn(async move { b.lock().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "a second process's lock waits while the first holds it");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("released on drop").expect("join").expect("second");
        let _ = std::fs::remove_file(NetworkLock::new(&endpoint).path);
    }
}
