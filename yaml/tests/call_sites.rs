//! Product code decodes YAML only through `provisioning_yaml` (issue 26, item 1): a direct
//! `serde_yaml_ng` decoder call would bring back unbounded alias expansion.

use std::path::{Path, PathBuf};

const PRODUCT_CRATES: &[&str] = &["apiserver", "cli", "controller", "crds", "providers", "taskservs", "yaml"];
const DECODERS: &[&str] = &[
    "serde_yaml_ng::from_",
    "serde_yaml_ng::Deserializer",
    "serde_yaml::from_",
    "serde_yaml::Deserializer",
    "Value::deserialize(serde_yaml",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn product_code_decodes_yaml_only_through_the_bounded_decoder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let allowed = [root.join("yaml/src/lib.rs"), root.join("yaml/src/bounded.rs")];
    let mut files = Vec::new();
    for krate in PRODUCT_CRATES {
        rust_files(&root.join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
    let mut offenders = Vec::new();
    for file in files.iter().filter(|f| !allowed.contains(f)) {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if DECODERS.iter().any(|d| line.contains(d)) {
                offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "decode YAML with provisioning_yaml::{{from_str, documents}} (bounded alias expansion), not:\n{}",
        offenders.join("\n")
    );
}
