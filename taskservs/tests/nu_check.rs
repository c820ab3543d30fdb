//! Every Nushell file of the catalog and of the fixtures parses (`nu-check` prints true).

mod common;

use std::path::{Path, PathBuf};

use common::{crate_dir, nu};

fn nu_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            nu_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "nu") {
            out.push(path);
        }
    }
}

/// Runs nu-check on every file in one nu process; returns (file, printed verdict).
fn nu_check(files: &[PathBuf]) -> Vec<(String, String)> {
    let list: Vec<serde_json::Value> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("read");
            // Files with `def main` are scripts; the others are modules imported with `use`.
            serde_json::json!({"file": f, "module": !text.contains("def main")})
        })
        .collect();
    let script = r#"$env.NU_CHECK_FILES | from json | each {|f|
        let ok = if $f.module { nu-check --as-module $f.file } else { nu-check $f.file }
        $"($f.file)\t($ok)"
    } | str join "\n""#;
    let output = std::process::Command::new(nu())
        .args(["--no-config-file", "-c", script])
        .env("NU_CHECK_FILES", serde_json::to_string(&list).expect("json"))
        .output()
        .expect("nu runs");
    assert!(output.status.success(), "nu failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(f, v)| (f.to_string(), v.trim().to_string())))
        .collect()
}

#[test]
fn every_script_parses() {
    let mut files = Vec::new();
    nu_files(&crate_dir().join("catalog"), &mut files);
    nu_files(&crate_dir().join("tests").join("fixtures"), &mut files);
    assert!(files.len() > 40, "found only {} .nu files", files.len());
    let verdicts = nu_check(&files);
    assert_eq!(verdicts.len(), files.len(), "one verdict per file: {verdicts:?}");
    let bad: Vec<&(String, String)> = verdicts.iter().filter(|(_, v)| v != "true").collect();
    assert!(bad.is_empty(), "nu-check did not print true for: {bad:?}");
}

#[test]
fn nu_check_output_is_read_not_its_exit_code() {
    // The control: a broken file must come back "false" (nu-check exits 0 either way).
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.nu");
    std::fs::write(&broken, "def main [] {\n  let x = (\n}\n").expect("write");
    assert_eq!(nu_check(&[broken]), [(dir.path().join("broken.nu").to_string_lossy().into_owned(), "false".to_string())]);
}

#[test]
fn every_service_uses_the_shared_context_reader() {
    // Scripts read the context from stdin through lib/ctx.nu (data, never argv).
    let catalog = crate_dir().join("catalog");
    for entry in std::fs::read_dir(&catalog).expect("catalog") {
        let dir = entry.expect("entry").path();
        if !dir.join("taskserv.yaml").is_file() {
            continue;
        }
        for step in ["install.nu", "check.nu", "remove.nu"] {
            let text = std::fs::read_to_string(dir.join(step)).expect("script");
            assert!(text.contains("($in | read-context)"), "{}/{step} does not read its context", dir.display());
            // finish-check (lib/check.nu) reports through emit-result, with the drift verdict.
            assert!(text.contains("emit-result") || text.contains("finish-check"), "{}/{step} reports no result", dir.display());
        }
    }
}
