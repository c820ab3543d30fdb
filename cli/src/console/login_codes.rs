//! One-time sign-in links issued by another process for a console that `provisioning dev`
//! started: `provisioning login-link` writes a file named after a new code into
//! `<data-dir>/login-codes/` (directory 0700, file 0600) and prints the link; the console
//! exchanges the code for the admin identity once, removing the file. Whoever can write there
//! can read the admin kubeconfig in the same directory anyway, so this grants nothing new.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context as _;

use super::session::{CODE_TTL, random_hex};

/// The directory of pending codes under a dev data directory.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("login-codes")
}

/// A code is 64 lowercase hex digits; anything else never touches the file system.
fn well_formed(code: &str) -> bool {
    code.len() == 64 && code.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Writes a new code for the console of `data_dir` and returns the sign-in link, read from
/// `<data-dir>/console-url`.
pub fn issue(data_dir: &Path) -> anyhow::Result<String> {
    let url_file = data_dir.join("console-url");
    let url = std::fs::read_to_string(&url_file).with_context(|| {
        format!("reading {}: is `provisioning dev --data-dir {}` running with its console?", url_file.display(), data_dir.display())
    })?;
    let dir = dir(data_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    restrict(&dir, 0o700)?;
    let code = random_hex();
    let file = dir.join(&code);
    std::fs::write(&file, b"").with_context(|| format!("writing {}", file.display()))?;
    restrict(&file, 0o600)?;
    Ok(format!("{}login?code={code}", url.trim()))
}

#[cfg(unix)]
fn restrict(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).with_context(|| format!("restricting {}", path.display()))
}

#[cfg(not(unix))]
fn restrict(_: &Path, _: u32) -> anyhow::Result<()> {
    Ok(())
}

/// Whether `code` was issued for `data_dir` within [`CODE_TTL`]; it is gone afterwards,
/// whatever the outcome (the removal decides which of two concurrent visits wins).
pub fn redeem(data_dir: &Path, code: &str) -> bool {
    if !well_formed(code) {
        return false;
    }
    let file = dir(data_dir).join(code);
    let Ok(meta) = std::fs::symlink_metadata(&file) else { return false };
    if std::fs::remove_file(&file).is_err() || !meta.file_type().is_file() {
        return false;
    }
    meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).is_some_and(|age| age < CODE_TTL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_dir() -> anyhow::Result<tempfile::TempDir> {
        let d = tempfile::tempdir()?;
        std::fs::write(d.path().join("console-url"), "https://127.0.0.1:1234/\n")?;
        Ok(d)
    }

    #[test]
    fn a_link_works_once() -> anyhow::Result<()> {
        let d = data_dir()?;
        let link = issue(d.path())?;
        let code = link.strip_prefix("https://127.0.0.1:1234/login?code=").context(link.clone())?;
        assert!(redeem(d.path(), code));
        assert!(!redeem(d.path(), code), "a code works once");
        Ok(())
    }

    #[test]
    fn malformed_or_unknown_codes_touch_nothing() -> anyhow::Result<()> {
        let d = data_dir()?;
        std::fs::write(d.path().join("token"), "secret")?;
        for code in ["../token", "..", "", &"a".repeat(63), &"g".repeat(64), &"A".repeat(64), &"a".repeat(64)] {
            assert!(!redeem(d.path(), code), "{code:?}");
        }
        assert!(d.path().join("token").exists(), "a path in the code never reaches the file system");
        Ok(())
    }

    #[test]
    fn without_a_running_console_the_error_says_what_to_start() -> anyhow::Result<()> {
        let d = tempfile::tempdir()?;
        let err = issue(d.path()).err().context("issued without a console")?.to_string();
        assert!(err.contains("provisioning dev --data-dir"), "{err}");
        Ok(())
    }
}
