//! Argo CD: every health and action fixture through a real Lua 5.1 interpreter without the
//! `string`, `math` and `io` libraries, the per-kind script copies and the `argocd-cm` patch
//! generated from the one source in `deploy/argocd/src`, and the patch in sync with the files.

use std::collections::BTreeSet;

use provisioning_deploy_checks::argocd::{self, ActionTests, GROUP, HealthTests, KindCustomization, REGENERATE, UPDATE_ENV};
use provisioning_deploy_checks::kinds::declared_kinds;
use provisioning_deploy_checks::lua::Lua51;

fn lua() -> Lua51 {
    // Fails (never skips) when the interpreter is missing: CI installs it via scripts/setup.sh.
    Lua51::locate().unwrap_or_else(|e| panic!("{e}"))
}

fn customizations() -> Vec<KindCustomization> {
    argocd::load_customizations().unwrap_or_else(|e| panic!("{e}"))
}

fn parse<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> T {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_kind_has_health_and_actions_in_argo_layout() {
    let names = declared_kinds().unwrap_or_else(|e| panic!("{e}"));
    let kinds: BTreeSet<String> = customizations().into_iter().map(|k| k.kind).collect();
    let expected: BTreeSet<String> = names.iter().map(|n| n.kind.clone()).collect();
    assert_eq!(kinds, expected, "one customization directory per CRD kind");
    for kind in customizations() {
        for file in ["health.lua", "health_test.yaml", "actions/discovery.lua", "actions/action_test.yaml"] {
            assert!(kind.dir.join(file).is_file(), "{} lacks {file}", kind.kind);
        }
        let actions: Vec<&str> = kind.actions.keys().map(String::as_str).collect();
        assert_eq!(actions, ["pause", "reconcile", "resume"], "{}", kind.kind);
    }
}

#[test]
fn health_fixtures_give_exactly_the_expected_status_and_message() {
    let lua = lua();
    let mut failures = Vec::new();
    let mut count = 0;
    for kind in customizations() {
        let tests: HealthTests = parse(&kind.dir.join("health_test.yaml"));
        assert!(!tests.tests.is_empty(), "{} has no health tests", kind.kind);
        for test in tests.tests {
            count += 1;
            let input = argocd::read_fixture(&kind.dir, &test.input_path).unwrap_or_else(|e| panic!("{e}"));
            let name = format!("{}/health.lua", kind.kind);
            match lua.health(&name, &kind.health_lua, &input) {
                Ok(got) if got == test.health_status => {}
                Ok(got) => failures.push(format!("{}/{}: expected {:?}, got {:?}", kind.kind, test.input_path, test.health_status, got)),
                Err(e) => failures.push(format!("{}/{}: {e}", kind.kind, test.input_path)),
            }
        }
    }
    assert!(failures.is_empty(), "{} of {count} health tests failed:\n{}", failures.len(), failures.join("\n"));
    assert!(count >= 4 * 10, "only {count} health tests");
}

#[test]
fn every_fixture_is_used_by_a_test() {
    for kind in customizations() {
        let tests: HealthTests = parse(&kind.dir.join("health_test.yaml"));
        let used: BTreeSet<String> = tests.tests.iter().map(|t| t.input_path.clone()).collect();
        let action_tests: ActionTests = parse(&kind.dir.join("actions/action_test.yaml"));
        let mut used_by_actions: BTreeSet<String> = BTreeSet::new();
        for t in &action_tests.discovery_tests {
            used_by_actions.insert(t.input_path.clone());
        }
        for t in &action_tests.action_tests {
            used_by_actions.insert(t.input_path.clone());
            used_by_actions.insert(t.expected_output_path.clone());
        }
        for (dir, used) in [(kind.dir.join("testdata"), &used), (kind.dir.join("actions/testdata"), &used_by_actions)] {
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let file = entry.unwrap_or_else(|e| panic!("{e}")).file_name().to_string_lossy().into_owned();
                assert!(used.contains(&format!("testdata/{file}")), "{}: testdata/{file} is not used by any test", dir.display());
            }
        }
    }
}

#[test]
fn discovery_and_action_fixtures_give_exactly_the_expected_result() {
    let lua = lua();
    let mut failures = Vec::new();
    let mut count = 0;
    for kind in customizations() {
        let actions_dir = kind.dir.join("actions");
        let tests: ActionTests = parse(&actions_dir.join("action_test.yaml"));
        assert!(!tests.discovery_tests.is_empty() && !tests.action_tests.is_empty(), "{}", kind.kind);
        let mut exercised = BTreeSet::new();
        for test in tests.discovery_tests {
            count += 1;
            let input = argocd::read_fixture(&actions_dir, &test.input_path).unwrap_or_else(|e| panic!("{e}"));
            let mut expected = test.result.clone();
            expected.sort_by(|a, b| a.name.cmp(&b.name));
            match lua.discovery(&format!("{}/discovery.lua", kind.kind), &kind.discovery_lua, &input) {
                Ok(got) if got == expected => {}
                Ok(got) => failures.push(format!("{}/{} discovery: expected {expected:?}, got {got:?}", kind.kind, test.input_path)),
                Err(e) => failures.push(format!("{}/{} discovery: {e}", kind.kind, test.input_path)),
            }
        }
        for test in tests.action_tests {
            count += 1;
            exercised.insert(test.action.clone());
            let Some(script) = kind.actions.get(&test.action) else {
                failures.push(format!("{}: no action {}", kind.kind, test.action));
                continue;
            };
            let input = argocd::read_fixture(&actions_dir, &test.input_path).unwrap_or_else(|e| panic!("{e}"));
            let expected = argocd::read_fixture(&actions_dir, &test.expected_output_path).unwrap_or_else(|e| panic!("{e}"));
            match lua.action(&format!("{}/{}/action.lua", kind.kind, test.action), script, &input) {
                Ok(got) if got == expected => {}
                Ok(got) => {
                    failures.push(format!("{}/{} on {}: expected {}\n got {}", kind.kind, test.action, test.input_path, expected, got))
                }
                Err(e) => failures.push(format!("{}/{} on {}: {e}", kind.kind, test.action, test.input_path)),
            }
        }
        let defined: BTreeSet<String> = kind.actions.keys().cloned().collect();
        assert_eq!(exercised, defined, "{}: every action needs an action test", kind.kind);
    }
    assert!(failures.is_empty(), "{} of {count} action tests failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn scripts_do_not_name_libraries_argo_withholds() {
    // The sandbox catches what the fixtures execute; this catches branches they might not.
    let forbidden = ["string.", "math.", "io.", "debug.", "string[", "math[", "io[", "require(\"string", "require(\"math", "require(\"io"];
    for kind in customizations() {
        let mut scripts =
            vec![("health.lua".to_owned(), kind.health_lua.clone()), ("discovery.lua".to_owned(), kind.discovery_lua.clone())];
        scripts.extend(kind.actions.iter().map(|(n, s)| (format!("{n}/action.lua"), s.clone())));
        for (name, script) in scripts {
            let code: String = script.lines().map(|line| line.split("--").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
            for word in forbidden {
                // Match whole identifiers: "os.date" must not count as "s.date"-like hits.
                for (at, _) in code.match_indices(word) {
                    let before = code[..at].chars().last();
                    assert!(before.is_some_and(|c| c.is_alphanumeric() || c == '_'), "{}/{name} uses {word}", kind.kind);
                }
            }
        }
    }
}

#[test]
fn generated_copies_and_patch_match_the_one_source() {
    // One customization per CRD kind, all from deploy/argocd/src.
    let kinds: Vec<String> = declared_kinds().unwrap_or_else(|e| panic!("{e}")).into_iter().map(|n| n.kind).collect();
    let source = argocd::load_source().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(source.actions.keys().map(String::as_str).collect::<Vec<_>>(), ["pause", "reconcile", "resume"]);
    let files = argocd::generated_files(&kinds, &source);
    if std::env::var_os(UPDATE_ENV).is_some() {
        argocd::write_generated(&files).unwrap_or_else(|e| panic!("{e}"));
    }
    let drift = argocd::drifted(&files);
    assert!(
        drift.is_empty(),
        "generated Argo CD files differ from deploy/argocd/src (edit the source, then run {REGENERATE}):\n{}",
        drift.join("\n")
    );
}

#[test]
fn argocd_cm_patch_is_generated_from_the_files() {
    let kinds = customizations();
    let generated = argocd::generate_cm_patch(&kinds);
    let path = argocd::cm_patch_path();
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(committed == generated, "{} drifted from deploy/argocd/resource_customizations; regenerate with {REGENERATE}", path.display());

    // And it is what Argo CD will read: each key holds exactly the file's text.
    let cm: serde_json::Value = serde_yaml_ng::from_str(&committed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "argocd-cm");
    let data = cm["data"].as_object().unwrap_or_else(|| panic!("no data"));
    assert_eq!(data.len(), kinds.len() * 2);
    for kind in &kinds {
        let health = &data[&format!("resource.customizations.health.{GROUP}_{}", kind.kind)];
        assert_eq!(health.as_str(), Some(kind.health_lua.as_str()), "{}", kind.kind);
        let actions_text = data[&format!("resource.customizations.actions.{GROUP}_{}", kind.kind)]
            .as_str()
            .unwrap_or_else(|| panic!("{}: actions is not a string", kind.kind));
        let actions: serde_json::Value = serde_yaml_ng::from_str(actions_text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(actions["discovery.lua"].as_str(), Some(kind.discovery_lua.as_str()));
        let definitions = actions["definitions"].as_array().unwrap_or_else(|| panic!("no definitions"));
        assert_eq!(definitions.len(), kind.actions.len());
        for definition in definitions {
            let name = definition["name"].as_str().unwrap_or_default();
            assert_eq!(definition["action.lua"].as_str(), kind.actions.get(name).map(String::as_str), "{}/{name}", kind.kind);
        }
    }
}
