//! Flux: the example Kustomization waits, and its healthCheckExprs, evaluated by a CEL
//! interpreter with Flux's rules, give the expected verdict for every status snapshot and
//! never fail to evaluate on an object that has a status.

use std::collections::BTreeSet;

use provisioning_deploy_checks::flux::{self, StatusEvaluator};
use provisioning_deploy_checks::kinds::declared_kinds;
use provisioning_deploy_checks::snapshots;

fn example() -> serde_json::Value {
    let path = flux::flux_dir().join("kustomization-example.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let first = serde_yaml_ng::Deserializer::from_str(&text).next().unwrap_or_else(|| panic!("{} is empty", path.display()));
    serde::Deserialize::deserialize(first).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn evaluators() -> Vec<(String, String, StatusEvaluator)> {
    let path = flux::flux_dir().join("kustomization-example.yaml");
    flux::read_health_check_exprs(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|e| {
            let evaluator = StatusEvaluator::new(&e).unwrap_or_else(|err| panic!("{err}"));
            (e.api_version, e.kind, evaluator)
        })
        .collect()
}

#[test]
fn the_example_kustomization_waits_and_covers_every_kind() {
    let kustomization = example();
    assert_eq!(kustomization["apiVersion"], "kustomize.toolkit.fluxcd.io/v1");
    assert_eq!(kustomization["kind"], "Kustomization");
    assert_eq!(kustomization["spec"]["wait"], true);
    for field in ["interval", "timeout", "sourceRef", "path"] {
        assert!(!kustomization["spec"][field].is_null(), "spec.{field} is required");
    }
    let exprs = kustomization["spec"]["healthCheckExprs"].as_array().unwrap_or_else(|| panic!("no healthCheckExprs"));
    for e in exprs {
        for field in ["apiVersion", "kind", "current", "inProgress", "failed"] {
            assert!(e[field].as_str().is_some_and(|s| !s.is_empty()), "{e}: {field}");
        }
    }
    let covered: BTreeSet<(String, String)> = evaluators().into_iter().map(|(a, k, _)| (a, k)).collect();
    let names = declared_kinds().unwrap_or_else(|e| panic!("{e}"));
    let expected: BTreeSet<(String, String)> = names.iter().map(|n| (format!("{}/v1alpha1", n.group), n.kind.clone())).collect();
    assert_eq!(covered, expected);
}

#[test]
fn health_check_exprs_give_the_expected_verdict_for_every_snapshot() {
    let evaluators = evaluators();
    let mut failures = Vec::new();
    let all = snapshots::load().unwrap_or_else(|e| panic!("{e}"));
    assert!(all.len() >= 4 * 12, "only {} snapshots", all.len());
    for snapshot in &all {
        let obj = snapshots::object(snapshot).unwrap_or_else(|e| panic!("{e}"));
        let kind = obj["kind"].as_str().unwrap_or_default();
        let Some((_, _, evaluator)) = evaluators.iter().find(|(_, k, _)| k == kind) else {
            failures.push(format!("{}: no healthCheckExprs for kind {kind}", snapshot.path));
            continue;
        };
        let verdict = evaluator.evaluate(&obj);
        if verdict.name() != snapshot.flux {
            failures.push(format!("{} ({}): expected {}, got {verdict:?}", snapshot.path, snapshot.stage, snapshot.flux));
        }
        // The waits-forever trap: once there is a status, no expression may fail to evaluate.
        if obj.get("status").is_some() {
            for (field, outcome) in evaluator.evaluate_each(&obj) {
                if let Err(e) = outcome {
                    failures.push(format!("{}: {field} errors: {e}", snapshot.path));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn expressions_survive_arbitrarily_missing_status_fields() {
    // Every subset of the fields the expressions read, on a Ready object: none may error.
    let evaluators = evaluators();
    let base = serde_json::json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": "web-1", "namespace": "dev", "generation": 1},
        "status": {"observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "True", "reason": "Running", "message": "ok"},
            {"type": "Reconciling", "status": "False"},
            {"type": "Stalled", "status": "False"}]}
    });
    let removable = [
        "/metadata/generation",
        "/status/observedGeneration",
        "/status/conditions",
        "/status/conditions/0/type",
        "/status/conditions/0/status",
        "/status/conditions/1/type",
        "/status/conditions/2/status",
    ];
    for (_, kind, evaluator) in &evaluators {
        for mask in 0u32..(1 << removable.len()) {
            let mut obj = base.clone();
            obj["kind"] = serde_json::json!(kind);
            for (bit, pointer) in removable.iter().enumerate().rev() {
                if mask & (1 << bit) != 0 {
                    let (parent, key) = pointer.rsplit_once('/').unwrap_or_default();
                    if let Some(serde_json::Value::Object(map)) = obj.pointer_mut(parent) {
                        map.remove(key);
                    }
                }
            }
            for (field, outcome) in evaluator.evaluate_each(&obj) {
                assert!(outcome.is_ok(), "{kind} {field} errors on {obj}: {outcome:?}");
            }
            let verdict = evaluator.evaluate(&obj);
            assert!(!matches!(verdict, flux::FluxVerdict::Unknown(_)), "{kind}: {verdict:?} on {obj}");
        }
    }
}
