//! Backup and restore of the embedded control plane.
//!
//! A backup is one consistent cut of the store (every live object as stored, at one revision:
//! [`crate::storage::Store::snapshot`] while the server runs, served at `GET /backup`, or
//! [`crate::storage::snapshot_file`] when no server has the database open) plus the data
//! dir's credentials, in a versioned, checksummed text file:
//!
//! ```text
//! {"format":"provisioning-backup","version":1,"revision":N,"objects":K,"files":F,"createdAt":"…"}
//! <storage key as a JSON string> TAB <object JSON as stored>        (K lines)
//! {"file":"ca.key","base64":"…"}                                    (F lines)
//! {"sha256":"<hex of every byte before this line>"}
//! ```
//!
//! The file holds every Secret, the CA key, the ServiceAccount signing key and the admin token:
//! it is as sensitive as the data dir, so it is written with mode 0600, and `GET /backup` is
//! a non-resource URL only `cluster-admin` (nonResourceURLs `*`, i.e. system:masters) holds by
//! default.
//!
//! Restore writes a new data dir: the objects keep their resourceVersions, the store's
//! revision becomes the backup's plus [`REVISION_BUMP`] and the watch history starts there, as
//! etcd's `snapshot restore --bump-revision --mark-compacted` does: a client that saw a
//! resourceVersion before the restore (even one written after the backup and lost) gets 410
//! Gone on its watch and relists; no resourceVersion is ever handed out twice.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The `format` field of a backup's header.
pub const FORMAT: &str = "provisioning-backup";
/// How every backup starts.
const MAGIC: &[u8] = br#"{"format":"provisioning-backup","version":"#;
/// The version of the format this build writes and reads.
pub const VERSION: u64 = 1;
/// How far a restore moves the revision past the backup's (etcd's documented example value):
/// more than any number of writes a server could have acknowledged after the backup was taken.
pub const REVISION_BUMP: u64 = 1_000_000_000;
/// The data dir's files a backup carries: the CA (so kubeconfigs and clients keep trusting the
/// server), the ServiceAccount signing key (so issued tokens stay valid) and the admin token.
/// The serving certificate and the kubeconfig are written afresh by every start; provider
/// state (`providers/`), logs and console sign-in codes are not part of the control plane.
pub const CREDENTIAL_FILES: [&str; 4] = ["ca.crt", "ca.key", "sa.key", "token"];

/// A decoded backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    /// The store's revision the objects are current at.
    pub revision: u64,
    /// (storage key, object JSON as stored), sorted by key.
    pub objects: Vec<(String, Bytes)>,
    /// (file name in the data dir, contents).
    pub files: Vec<(String, Vec<u8>)>,
}

/// Encodes a backup (header, objects, files, checksum trailer).
pub fn encode(backup: &Backup) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(backup.objects.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>() + 256);
    // Written field by field so that every backup starts with MAGIC (`json!` sorts keys).
    let created = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let header = format!(
        r#"{{"format":"{FORMAT}","version":{VERSION},"revision":{},"objects":{},"files":{},"createdAt":"{created}"}}"#,
        backup.revision,
        backup.objects.len(),
        backup.files.len()
    );
    debug_assert!(header.as_bytes().starts_with(MAGIC));
    out.extend_from_slice(header.as_bytes());
    out.push(b'\n');
    for (key, object) in &backup.objects {
        ensure!(!object.contains(&b'\n'), "object {key:?} is not stored as one line of JSON");
        serde_json::to_writer(&mut out, key)?;
        out.push(b'\t');
        out.extend_from_slice(object);
        out.push(b'\n');
    }
    for (name, data) in &backup.files {
        let line = json!({"file": name, "base64": base64::engine::general_purpose::STANDARD.encode(data)});
        serde_json::to_writer(&mut out, &line)?;
        out.push(b'\n');
    }
    let sum = hex(&Sha256::digest(&out));
    serde_json::to_writer(&mut out, &json!({ "sha256": sum }))?;
    out.push(b'\n');
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes and verifies a backup: refuses a truncated or corrupt one (checksum, structure,
/// counts, every object a JSON object) with an error naming what is wrong.
pub fn decode(data: &[u8]) -> anyhow::Result<Backup> {
    ensure!(!data.is_empty(), "the backup is empty");
    let start = &data[..data.len().min(MAGIC.len())];
    ensure!(MAGIC.starts_with(start), "not a provisioning backup (it does not start with {})", String::from_utf8_lossy(MAGIC));
    ensure!(data.ends_with(b"\n"), "the backup is truncated: it does not end with its checksum line");
    let body_end = data[..data.len() - 1].iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let trailer: Value = serde_json::from_slice(&data[body_end..])
        .map_err(|_| anyhow::anyhow!("the backup is truncated: its last line is not the checksum line"))?;
    let Some(want) = trailer.get("sha256").and_then(Value::as_str) else {
        bail!("the backup is truncated: its last line is not the checksum line");
    };
    let body = &data[..body_end];
    let got = hex(&Sha256::digest(body));
    ensure!(got == want, "the backup is corrupt: sha256 of its contents is {got}, its checksum line says {want}");
    let mut lines = body.split(|b| *b == b'\n');
    let header: Value = serde_json::from_slice(lines.next().unwrap_or_default()).context("the backup's header is not JSON")?;
    ensure!(header["format"] == FORMAT, "not a provisioning backup (format {})", header["format"]);
    ensure!(
        header["version"].as_u64() == Some(VERSION),
        "backup format version {} is not supported by this build (it reads version {VERSION})",
        header["version"]
    );
    let count = |field: &str| header[field].as_u64().with_context(|| format!("the backup's header has no {field} count"));
    let revision = count("revision")?;
    let (n_objects, n_files) = (count("objects")?, count("files")?);
    let mut objects = Vec::new();
    for i in 0..n_objects {
        let line =
            lines.next().filter(|l| !l.is_empty()).with_context(|| format!("the backup ends after {i} of its {n_objects} objects"))?;
        objects.push(decode_object(line).with_context(|| format!("object {} of the backup", i + 1))?);
    }
    let mut files = Vec::new();
    for i in 0..n_files {
        let line = lines.next().filter(|l| !l.is_empty()).with_context(|| format!("the backup ends after {i} of its {n_files} files"))?;
        files.push(decode_file(line).with_context(|| format!("file {} of the backup", i + 1))?);
    }
    ensure!(lines.next().is_some_and(<[u8]>::is_empty) && lines.next().is_none(), "the backup has lines beyond its header's counts");
    Ok(Backup { revision, objects, files })
}

fn decode_object(line: &[u8]) -> anyhow::Result<(String, Bytes)> {
    let tab = line.iter().position(|b| *b == b'\t').context("no tab between key and object")?;
    let key: String = serde_json::from_slice(&line[..tab]).context("the key is not a JSON string")?;
    ensure!(key.split('\u{0}').count() == 3, "invalid storage key {key:?}");
    let object = &line[tab + 1..];
    let value: Value = serde_json::from_slice(object).with_context(|| format!("{key:?} is not JSON"))?;
    ensure!(value.is_object() && value["metadata"]["resourceVersion"].is_string(), "{key:?} is not a stored object");
    Ok((key, Bytes::copy_from_slice(object)))
}

fn decode_file(line: &[u8]) -> anyhow::Result<(String, Vec<u8>)> {
    let v: Value = serde_json::from_slice(line).context("not JSON")?;
    let name = v["file"].as_str().context("no file name")?;
    ensure!(CREDENTIAL_FILES.contains(&name), "unexpected file {name:?} (a backup carries only {CREDENTIAL_FILES:?})");
    let data =
        base64::engine::general_purpose::STANDARD.decode(v["base64"].as_str().context("no contents")?).context("contents not base64")?;
    Ok((name.to_string(), data))
}

/// Reads the credential files present in `data_dir`.
pub fn read_credentials(data_dir: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut files = vec![];
    for name in CREDENTIAL_FILES {
        let path = data_dir.join(name);
        match std::fs::read(&path) {
            Ok(data) => files.push((name.to_string(), data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    Ok(files)
}

/// Writes `data` to `path` with mode 0600 (through a temporary file renamed into place).
pub fn write_private_file(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// What [`restore`] did.
#[derive(Debug)]
pub struct Restored {
    /// The revision the restored server starts at.
    pub revision: u64,
    /// Where the previous data dir was moved (with `force`).
    pub moved_aside: Option<PathBuf>,
}

/// Rebuilds `data_dir` from a decoded backup. An existing non-empty `data_dir` is refused
/// unless `force`, which moves it aside to `<data_dir>.before-restore-<unix time>` (never
/// while a server has its database open). The new dir is assembled next to it and renamed
/// into place, so a failed restore leaves nothing half-written.
pub fn restore(backup: &Backup, data_dir: &Path, force: bool) -> anyhow::Result<Restored> {
    let non_empty = std::fs::read_dir(data_dir).is_ok_and(|mut d| d.next().is_some());
    let mut moved_aside = None;
    if non_empty {
        ensure!(force, "{} exists and is not empty; restore into a new directory, or pass --force to move it aside", data_dir.display());
        ensure!(
            !crate::storage::in_use(&data_dir.join("state.redb")),
            "a server is running on {}: stop it before restoring over it",
            data_dir.display()
        );
    }
    let name = data_dir.file_name().and_then(|n| n.to_str()).context("the data dir has no file name")?;
    let staging = data_dir.with_file_name(format!(".{name}.restoring-{}", std::process::id()));
    if let Some(parent) = staging.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir(&staging).with_context(|| format!("creating {}", staging.display()))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o700))?;
    let revision = backup.revision.checked_add(REVISION_BUMP).context("the backup's revision is too large to restore")?;
    let built = (|| -> anyhow::Result<()> {
        for (file, data) in &backup.files {
            write_private_file(&staging.join(file), data)?;
        }
        crate::storage::create_restored(&staging.join("state.redb"), revision, &backup.objects)
    })();
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    if non_empty {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let aside = data_dir.with_file_name(format!("{name}.before-restore-{now}"));
        std::fs::rename(data_dir, &aside).with_context(|| format!("moving {} aside to {}", data_dir.display(), aside.display()))?;
        moved_aside = Some(aside);
    } else if data_dir.exists() {
        std::fs::remove_dir(data_dir).with_context(|| format!("replacing the empty {}", data_dir.display()))?;
    }
    std::fs::rename(&staging, data_dir).with_context(|| format!("renaming {} to {}", staging.display(), data_dir.display()))?;
    Ok(Restored { revision, moved_aside })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Backup {
        Backup {
            revision: 42,
            objects: vec![(
                "/configmaps\u{0}default\u{0}a".into(),
                Bytes::from_static(
                    br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"41"},"data":{"x":"a\tb"}}"#,
                ),
            )],
            files: vec![("token".into(), b"secret-token".to_vec())],
        }
    }

    #[test]
    fn round_trip_keeps_objects_byte_for_byte() -> anyhow::Result<()> {
        let b = sample();
        assert_eq!(decode(&encode(&b)?)?, b);
        Ok(())
    }

    #[test]
    fn truncated_and_corrupt_backups_are_refused_naming_the_problem() -> anyhow::Result<()> {
        let data = encode(&sample())?;
        for cut in [1, 10, data.len() / 2, data.len() - 1] {
            let err = decode(&data[..cut]).err().map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(err.contains("truncated"), "cut at {cut}: {err}");
        }
        let mut flipped = data.clone();
        flipped[data.len() / 2] ^= 0x01;
        let err = decode(&flipped).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err.contains("corrupt") && err.contains("sha256"), "{err}");
        assert!(format!("{:#}", decode(b"").err().unwrap_or_else(|| anyhow::anyhow!(""))).contains("empty"));
        let err = decode(b"garbage\n").err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err.contains("not a provisioning backup"), "{err}");
        Ok(())
    }

    #[test]
    fn restore_refuses_a_non_empty_dir_without_force_and_moves_it_aside_with_it() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir)?;
        std::fs::write(dir.join("keep"), "old")?;
        let err = restore(&sample(), &dir, false).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("not empty") && err.contains("--force"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.join("keep"))?, "old", "untouched");
        let done = restore(&sample(), &dir, true)?;
        assert_eq!(done.revision, 42 + REVISION_BUMP);
        let aside = done.moved_aside.context("moved aside")?;
        assert_eq!(std::fs::read_to_string(aside.join("keep"))?, "old");
        assert_eq!(std::fs::read(dir.join("token"))?, b"secret-token");
        assert_eq!(std::fs::metadata(dir.join("token"))?.permissions().mode() & 0o777, 0o600);
        let (rv, objects) = crate::storage::snapshot_file(&dir.join("state.redb"))?;
        assert_eq!((rv, objects), (42 + REVISION_BUMP, sample().objects));
        Ok(())
    }
}
