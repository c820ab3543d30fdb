//! Every Kubernetes object under `deploy/` is a valid object of its type, with no field its
//! type does not know (a typo such as `readinesProbe` is silently dropped by a cluster), the
//! controller's ConfigMaps hold config the real loader accepts, and `kubectl kustomize
//! deploy/` renders.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use provisioning_deploy_checks::deploy_dir;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Files under deploy/ that hold objects of other tools' kinds or our own kinds' test data
/// (checked by their own tests).
fn skipped(path: &Path) -> bool {
    let text = path.to_string_lossy();
    text.contains("/argocd/resource_customizations/") || text.contains("/k9s/")
}

/// API groups that are not Kubernetes types (kustomize's and Flux's own kinds).
const OTHER_TOOLS: &[&str] = &["kustomize.config.k8s.io/", "kustomize.toolkit.fluxcd.io/", "source.toolkit.fluxcd.io/", "argoproj.io/"];

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") && !skipped(&path) {
            out.push(path);
        }
    }
}

fn documents(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// Paths present in `original` but absent from `round_trip`: the fields the type dropped.
fn dropped_fields(original: &Value, round_trip: &Value, at: &str, out: &mut Vec<String>) {
    match (original, round_trip) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{at}.{key}");
                match b.get(key) {
                    Some(other) => dropped_fields(value, other, &here, out),
                    // An explicit empty value the type leaves out is not an unknown field.
                    None if value.is_null() || value.as_array().is_some_and(Vec::is_empty) => {}
                    None => out.push(here),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                dropped_fields(x, y, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Parses `object` as `T`, failing on any field `T` does not have.
fn strict<T: DeserializeOwned + serde::Serialize>(object: &Value, origin: &str) {
    let typed: T = serde_json::from_value(object.clone()).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let round_trip = serde_json::to_value(&typed).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let mut dropped = Vec::new();
    dropped_fields(object, &round_trip, "", &mut dropped);
    assert!(dropped.is_empty(), "{origin}: unknown fields {dropped:?}");
}

/// Checks one object as its Kubernetes type; returns its kind.
fn check_object(object: &Value, origin: &str) -> String {
    let api_version = object["apiVersion"].as_str().unwrap_or_else(|| panic!("{origin}: no apiVersion"));
    let kind = object["kind"].as_str().unwrap_or_else(|| panic!("{origin}: no kind"));
    let origin = format!("{origin} ({api_version} {kind} {})", object["metadata"]["name"].as_str().unwrap_or("?"));
    match (api_version, kind) {
        ("v1", "Namespace") => strict::<Namespace>(object, &origin),
        ("v1", "ConfigMap") => strict::<ConfigMap>(object, &origin),
        ("v1", "PersistentVolumeClaim") => strict::<PersistentVolumeClaim>(object, &origin),
        ("v1", "Secret") => strict::<Secret>(object, &origin),
        ("v1", "Service") => strict::<Service>(object, &origin),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(object, &origin),
        ("apps/v1", "Deployment") => strict::<Deployment>(object, &origin),
        ("coordination.k8s.io/v1", "Lease") => strict::<Lease>(object, &origin),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(object, &origin),
        ("networking.k8s.io/v1", "NetworkPolicy") => strict::<NetworkPolicy>(object, &origin),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(object, &origin),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => strict::<ClusterRoleBinding>(object, &origin),
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(object, &origin),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(object, &origin),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => strict::<CustomResourceDefinition>(object, &origin),
        _ if OTHER_TOOLS.iter().any(|g| api_version.starts_with(g)) => {}
        _ => panic!("{origin}: no Kubernetes type known to this test; add it to check_object"),
    }
    kind.to_string()
}

#[test]
fn every_object_under_deploy_parses_as_its_type_with_no_unknown_fields() {
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    let mut kinds = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for object in documents(&text, &file.display().to_string()) {
            if object.get("kind").is_none() {
                continue; // not a Kubernetes object (e.g. a kustomize patch fragment)
            }
            kinds.push(check_object(&object, &file.display().to_string()));
        }
    }
    for expected in ["Deployment", "PodDisruptionBudget", "NetworkPolicy", "ClusterRole", "CustomResourceDefinition"] {
        assert!(kinds.iter().any(|k| k == expected), "no {expected} under deploy/ (found {kinds:?})");
    }
}

/// The strictness check itself: a misspelt field is caught.
#[test]
fn a_misspelt_field_is_an_unknown_field() {
    let object: Value = serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetPrt": 8080}]}
    });
    let outcome = std::panic::catch_unwind(|| strict::<Service>(&object, "inline"));
    assert!(outcome.is_err(), "targetPrt must be reported");
}

fn kubectl() -> PathBuf {
    std::env::var_os("PROVISIONING_KUBECTL").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| {
        let p = provisioning_deploy_checks::workspace_root().join(".tools/bin/kubectl");
        assert!(p.exists(), "kubectl not found (PROVISIONING_KUBECTL unset and {} missing): run scripts/setup.sh", p.display());
        p
    })
}

/// `kubectl kustomize deploy/` with the real kubectl, parsed.
fn rendered() -> Vec<Value> {
    rendered_dir(&deploy_dir())
}

/// `kubectl kustomize DIR` with the real kubectl, parsed.
fn rendered_dir(dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl()).arg("kustomize").arg(dir).output().expect("run kubectl kustomize");
    assert!(out.status.success(), "kubectl kustomize {} failed: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    documents(&String::from_utf8_lossy(&out.stdout), &format!("kubectl kustomize {}", dir.display()))
}

/// The optional component deploy/components/durable-state, applied by an overlay the way the
/// docs say (kustomize wants relative paths and no overlay inside deploy/, hence the overlay
/// under target/): the Deployment's `state` volume becomes the claim (no emptyDir left beside
/// it), one replica replaced with Recreate, and every rendered object is valid.
#[test]
fn durable_state_component_puts_the_state_volume_on_a_claim() {
    let root = provisioning_deploy_checks::workspace_root();
    let overlay = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let up = overlay.path().strip_prefix(&root).expect("CARGO_TARGET_TMPDIR is inside the workspace").components().count();
    let to_deploy = format!("{}deploy", "../".repeat(up));
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{to_deploy}]\ncomponents: [{to_deploy}/components/durable-state]\n"),
    )
    .expect("write overlay");
    let objects = rendered_dir(overlay.path());
    for object in &objects {
        check_object(object, "the durable-state overlay");
    }
    let claim = objects.iter().find(|o| o["kind"] == "PersistentVolumeClaim").expect("a PersistentVolumeClaim");
    assert_eq!(claim["metadata"]["namespace"], "provisioning-system");
    let deployment: Deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .map(|o| serde_json::from_value(o.clone()).expect("Deployment parses"))
        .expect("a Deployment");
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(1), "one replica: a ReadWriteOnce claim is mounted by one pod");
    let strategy = spec.strategy.expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("Recreate"));
    assert!(strategy.rolling_update.is_none());
    let volumes = spec.template.spec.expect("pod spec").volumes.unwrap_or_default();
    let state = volumes.iter().find(|v| v.name == "state").expect("the state volume");
    assert_eq!(state.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()), claim["metadata"]["name"].as_str());
    assert!(state.empty_dir.is_none(), "the emptyDir is replaced, not kept beside the claim");
}

#[test]
fn kustomize_renders_deploy_and_every_rendered_object_is_valid() {
    let objects = rendered();
    for object in &objects {
        check_object(object, "kubectl kustomize deploy/");
        // Every namespaced object lands in the controller's namespace.
        let kind = object["kind"].as_str().unwrap_or_default();
        let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"].contains(&kind);
        if !cluster_scoped {
            assert_eq!(object["metadata"]["namespace"], "provisioning-system", "{kind} {}", object["metadata"]["name"]);
        }
    }
}

/// Every ConfigMap that holds controller config (a `config.toml` key), under deploy/ and as
/// rendered, loads with the controller's own loader; and the Deployment's probes point at the
/// port `metrics_addr` serves, and its `state` volume at `state_dir`.
#[test]
fn controller_config_maps_load_and_match_the_deployment() {
    let objects = rendered();
    let configs: Vec<provisioning_controller::config::ControllerConfig> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .filter_map(|o| o["data"]["config.toml"].as_str().map(|t| (o["metadata"]["name"].clone(), t.to_string())))
        .map(|(name, text)| {
            provisioning_controller::config::ControllerConfig::from_toml(&text)
                .unwrap_or_else(|e| panic!("ConfigMap {name}: the controller rejects its config.toml: {e}"))
        })
        .collect();
    assert_eq!(configs.len(), 1, "one controller ConfigMap expected");
    let config = &configs[0];
    let deployment: Deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .map(|o| serde_json::from_value(o.clone()).expect("Deployment parses"))
        .expect("a Deployment");
    let pod = deployment.spec.template.spec.expect("pod spec");
    let container = &pod.containers[0];
    let port = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("http-metrics"))
        .map(|p| p.container_port)
        .expect("an http-metrics port");
    let addr = config.metrics_addr.expect("metrics_addr is set (the probes need it)");
    assert_eq!(i32::from(addr.port()), port, "metrics_addr serves the probes' port");
    assert!(addr.ip().is_unspecified(), "metrics_addr must listen on all addresses, not {addr}: the kubelet probes the pod IP");
    let state_mount = container.volume_mounts.iter().flatten().find(|m| m.name == "state").expect("a state volume mount");
    assert_eq!(Path::new(&state_mount.mount_path), config.state_dir, "state_dir is on the state volume");
    let config_mount = container.volume_mounts.iter().flatten().find(|m| m.name == "config").expect("config mount");
    let args = container.args.clone().unwrap_or_default();
    let config_arg = args.iter().position(|a| a == "--config").and_then(|i| args.get(i + 1)).expect("--config arg");
    assert!(config_arg.starts_with(&format!("{}/", config_mount.mount_path)), "--config {config_arg} is under the config mount");
}
