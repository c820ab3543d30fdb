//! Shared test helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The crate directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    crate_dir().join("tests").join("fixtures").join(name)
}

/// The `nu` binary: `$PROVISIONING_NU`, else `.tools/bin/nu` of the workspace. Panics (the
/// test fails, it does not skip) when it is missing.
pub fn nu() -> PathBuf {
    let candidate = match std::env::var_os("PROVISIONING_NU") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => crate_dir().join("..").join(".tools").join("bin").join("nu"),
    };
    assert!(candidate.is_file(), "nu not found at {} (set PROVISIONING_NU): run scripts/setup.sh", candidate.display());
    candidate
}

/// Writes `files` (relative path → content) under `root`.
pub fn write_tree(root: &Path, files: &[(&str, &str)]) {
    for (rel, content) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, content).expect("write");
    }
}

/// A minimal valid service directory under `root` with the given manifest body.
pub fn write_service(root: &Path, name: &str, manifest: &str) {
    write_tree(
        root,
        &[
            (&format!("{name}/taskserv.yaml"), manifest),
            (&format!("{name}/install.nu"), "def main [] {}\n"),
            (&format!("{name}/check.nu"), "def main [] {}\n"),
            (&format!("{name}/remove.nu"), "def main [] {}\n"),
        ],
    );
}

/// A minimal manifest text.
pub fn manifest(name: &str, extra: &str) -> String {
    format!(
        "name: {name}\ndescription: test service {name}\nversions: [\"1.0\", \"2.0\"]\ndefaultVersion: \"1.0\"\nproviders: [local]\n{extra}"
    )
}
