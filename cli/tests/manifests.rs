//! Manifests the CLI reads (`provisioning plan -f`, `dev --apply`) are decoded with the bounded
//! YAML decoder (issue 26, item 1): a file whose aliases expand to billions of values is an
//! error naming the file, the document and the problem, reached quickly.

use std::time::{Duration, Instant};

fn bomb() -> String {
    let items = vec!["x"; 100_000].join(",");
    let aliases = vec!["*a"; 60_000].join(",");
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ok}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: bomb}}\n\
         data: {{a: &a [{items}], b: [{aliases}]}}\n"
    )
}

#[test]
fn a_yaml_alias_bomb_in_a_manifest_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bomb.yaml");
    std::fs::write(&file, bomb()).expect("write");
    let started = Instant::now();
    let e = provisioning_cli::plan::read_manifests(std::slice::from_ref(&file)).expect_err("plan -f refuses it");
    let msg = format!("{e:#}");
    assert!(msg.contains("bomb.yaml") && msg.contains("document 2") && msg.contains("excessive aliasing"), "{msg}");
    let e = provisioning_cli::dev::read_manifests(std::slice::from_ref(&file)).expect_err("dev --apply refuses it");
    let msg = format!("{e:#}");
    assert!(msg.contains("bomb.yaml") && msg.contains("document 2") && msg.contains("excessive aliasing"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[test]
fn manifests_with_modest_aliases_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ok.yaml");
    // Anchors are per document (YAML).
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: one}\n---\n\
                apiVersion: v1\nkind: ConfigMap\nmetadata: {name: two, labels: &l {team: a}, annotations: *l}\n";
    std::fs::write(&file, text).expect("write");
    let read = provisioning_cli::dev::read_manifests(std::slice::from_ref(&file)).expect("reads");
    assert_eq!(read.len(), 2);
    assert_eq!(read[1].object["metadata"]["annotations"]["team"], "a");
    assert_eq!(provisioning_cli::plan::read_manifests(&[file]).expect("reads").len(), 2);
}
