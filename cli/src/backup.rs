//! `provisioning backup` and `provisioning restore`: a consistent snapshot of the embedded
//! control plane's data dir and the rebuild of a data dir from it (format and revision rules:
//! [`provisioning_apiserver::backup`]).

use std::path::Path;

use anyhow::Context as _;
use provisioning_apiserver::backup::{self, Backup};
use provisioning_apiserver::storage::{self, SnapshotFileError};

/// Where a backup's objects came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The running server's `GET /backup` (it holds the database).
    Server,
    /// The database file itself (no server running on the data dir).
    File,
}

/// `provisioning backup --data-dir D -o FILE`: asks the server running on `D` for a snapshot
/// (with D's admin kubeconfig), or reads `D/state.redb` when no server has it open; adds D's
/// credentials; writes FILE with mode 0600. Returns the backup's revision, object count and
/// source.
pub async fn run_backup(data_dir: &Path, output: &Path) -> anyhow::Result<(u64, usize, Source)> {
    let db = data_dir.join("state.redb");
    let (revision, objects, source) = match storage::snapshot_file(&db) {
        Ok((revision, objects)) => (revision, objects, Source::File),
        Err(SnapshotFileError::InUse(_)) => {
            let (revision, objects) = from_server(data_dir).await?;
            (revision, objects, Source::Server)
        }
        Err(e) => {
            return Err(anyhow::anyhow!(e))
                .with_context(|| format!("{} is not a data dir of the embedded control plane", data_dir.display()));
        }
    };
    let files = backup::read_credentials(data_dir)?;
    let count = objects.len();
    let encoded = backup::encode(&Backup { revision, objects, files })?;
    backup::write_private_file(output, &encoded)?;
    Ok((revision, count, source))
}

async fn from_server(data_dir: &Path) -> anyhow::Result<storage::Snapshot> {
    let kubeconfig = data_dir.join("kubeconfig");
    let client = provisioning_controller::client::client_from_kubeconfig(&kubeconfig)
        .await
        .with_context(|| format!("a server runs on {} but its admin kubeconfig cannot be used", data_dir.display()))?;
    let req = http::Request::get("/backup").body(Vec::new())?;
    let text = client.request_text(req).await.context("GET /backup from the running server")?;
    let snap = backup::decode(text.as_bytes()).context("the server's snapshot")?;
    Ok((snap.revision, snap.objects))
}

/// `provisioning restore -f FILE --data-dir D [--force]`: verifies FILE, then rebuilds D.
pub fn run_restore(file: &Path, data_dir: &Path, force: bool) -> anyhow::Result<(Backup, backup::Restored)> {
    let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let decoded = backup::decode(&data).with_context(|| format!("{} cannot be restored", file.display()))?;
    let done = backup::restore(&decoded, data_dir, force)?;
    Ok((decoded, done))
}
