//! `provisioning template list|render`: the built-in Cluster templates
//! (`taskservs/templates/<name>/`), rendered into manifests that are checked, before they are
//! printed, against the CRD schemas and the taskserv catalog (unknown service, version or
//! config → an error naming it).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use provisioning_crds::{Cluster, TaskServ};
use provisioning_taskservs::{Catalog, RenderedTemplate, TemplateLibrary};
use serde_json::Value;

/// The template library next to the built-in catalog (or `$PROVISIONING_TEMPLATES`).
pub fn default_library() -> anyhow::Result<TemplateLibrary> {
    let dir = TemplateLibrary::default_dir(&Catalog::default_dir());
    TemplateLibrary::load(&dir).with_context(|| format!("loading the Cluster templates in {}", dir.display()))
}

/// The table `template list` prints: each template, its description and its parameters with
/// type and default.
pub fn list_table(library: &TemplateLibrary) -> String {
    let mut out = String::new();
    for t in library.templates() {
        let m = &t.manifest;
        out.push_str(&format!("{:<18} {}\n", m.name, m.description.trim()));
        out.push_str(&format!("{:<18}   -n NAMESPACE (default {})\n", "", m.default_namespace));
        for p in &m.parameters {
            let mut kind = format!("{:?}", p.kind).to_lowercase();
            if !p.allowed.is_empty() {
                kind = p.allowed.join("|");
            } else if p.minimum.is_some() || p.maximum.is_some() {
                let bound = |b: Option<i64>| b.map(|v| v.to_string()).unwrap_or_default();
                kind = format!("{kind} {}..{}", bound(p.minimum), bound(p.maximum));
            }
            let set = format!("--set {}={}", p.name, p.default_text());
            out.push_str(&format!("{:<18}   {set:<36} {kind:<28} {}\n", "", p.description.trim()));
        }
    }
    out
}

/// Renders template `name` with `sets` in `namespace` and checks the result against the CRD
/// schemas and `catalog`.
pub fn render(
    library: &TemplateLibrary,
    catalog: &Catalog,
    name: &str,
    sets: &[String],
    namespace: Option<&str>,
) -> anyhow::Result<RenderedTemplate> {
    let rendered = library.require(name)?.render(sets, namespace)?;
    validate_objects(&rendered.objects, catalog).with_context(|| format!("template {name} rendered manifests that would not work"))?;
    Ok(rendered)
}

/// Checks rendered objects: those of our API group against their CRD's OpenAPI schema and
/// their typed shape, Clusters and TaskServs against the catalog as the controller would.
pub fn validate_objects(objects: &[Value], catalog: &Catalog) -> anyhow::Result<()> {
    let crds = provisioning_crds::all_crds();
    for object in objects {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let what = format!("{kind} {name}");
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        if !api_version.starts_with(&format!("{}/", provisioning_crds::GROUP)) {
            continue;
        }
        let Some(crd) = crds.iter().find(|c| c.spec.names.kind == kind) else {
            bail!("{what}: {api_version} has no kind {kind}");
        };
        let version = api_version.rsplit('/').next().unwrap_or_default();
        let Some(schema) = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
        else {
            bail!("{what}: {api_version} is not a served version");
        };
        let schema = serde_json::to_value(schema)?;
        let validator = jsonschema::validator_for(&schema).map_err(|e| anyhow::anyhow!("{kind} CRD schema: {e}"))?;
        let problems: Vec<String> =
            validator.iter_errors(object).map(|e| format!("{}: {}", e.instance_path().as_str(), e.masked_with("the value"))).collect();
        if !problems.is_empty() {
            bail!("{what} does not match the CRD schema: {}", problems.join("; "));
        }
        match kind {
            "Cluster" => {
                let cluster: Cluster = serde_json::from_value(object.clone()).with_context(|| what.clone())?;
                provisioning_controller::cluster::validate::validate(name, &cluster.spec, catalog)
                    .map_err(|e| anyhow::anyhow!("{what}: {} ({})", e.message, e.reason))?;
            }
            "TaskServ" => {
                let ts: TaskServ = serde_json::from_value(object.clone()).with_context(|| what.clone())?;
                let version = Some(ts.spec.version.as_str()).filter(|v| !v.is_empty());
                catalog
                    .validate_partial_request(&ts.spec.service, version, ts.spec.config.as_ref().unwrap_or(&Value::Null))
                    .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes `text` to `path` (`-` = stdout).
pub fn write_output(path: Option<&PathBuf>, text: &str) -> anyhow::Result<()> {
    match path.filter(|p| p.as_os_str() != "-") {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::load(&Catalog::default_dir()).expect("catalog loads")
    }

    /// Every built-in template renders with its defaults into manifests that match the CRD
    /// schemas and name only services of the catalog. (observability and web need the
    /// catalog's nginx, prometheus, node-exporter, alertmanager and docker-registry.)
    #[test]
    fn every_template_renders_valid_manifests() {
        let library = default_library().expect("templates load");
        let names: Vec<&str> = library.templates().map(|t| t.name()).collect();
        assert_eq!(names, ["etcd_cluster", "kubernetes_3node", "observability", "postgres_redis", "web"]);
        let catalog = catalog();
        let mut failures = Vec::new();
        for t in library.templates() {
            match render(&library, &catalog, t.name(), &[], None) {
                Ok(r) => assert!(r.objects.iter().any(|o| o["kind"] == "Cluster"), "{}: no Cluster", t.name()),
                Err(e) => failures.push(format!("{}: {e:#}", t.name())),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn a_set_changes_the_manifests_and_the_variants_render() {
        let library = default_library().expect("templates load");
        let catalog = catalog();
        let r = render(&library, &catalog, "etcd_cluster", &["members=5".into(), "name=kv".into()], Some("team-a")).expect("renders");
        let cluster = r.objects.iter().find(|o| o["kind"] == "Cluster").expect("a Cluster");
        assert_eq!(cluster["metadata"]["name"], "kv");
        assert_eq!(cluster["metadata"]["namespace"], "team-a");
        assert_eq!(cluster["spec"]["pools"][0]["replicas"], 5);
        let ns = r.objects.iter().find(|o| o["kind"] == "Namespace").expect("a Namespace");
        assert_eq!(ns["metadata"]["name"], "team-a");

        let r = render(&library, &catalog, "kubernetes_3node", &["cloud=upcloud".into(), "region=de-fra1".into()], None).expect("renders");
        let ws = r.objects.iter().find(|o| o["kind"] == "Workspace").expect("a Workspace");
        assert_eq!(ws["spec"]["providers"][0]["type"], "upcloud");
        assert_eq!(ws["spec"]["providers"][0]["zone"], "de-fra1");
        assert!(!r.objects.iter().any(|o| o["kind"] == "Secret"), "credentials are never rendered");
        // The control-plane endpoint by default: a floating IP on upcloud, an Elastic IP on
        // aws, a load balancer on the simulated provider.
        let endpoint_of = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| (*s).to_string()).collect();
            let r = render(&library, &catalog, "kubernetes_3node", &sets, None).expect("renders");
            r.objects.iter().find(|o| o["kind"] == "Cluster").expect("a Cluster")["spec"]["controlPlaneEndpoint"].clone()
        };
        assert_eq!(endpoint_of(&["cloud=upcloud"]), serde_json::json!({"type": "FloatingIP"}));
        assert_eq!(endpoint_of(&["cloud=upcloud", "endpoint=None"]), Value::Null);
        assert_eq!(endpoint_of(&["cloud=aws"]), serde_json::json!({"type": "FloatingIP"}));
        assert_eq!(endpoint_of(&["cloud=simulated"]), serde_json::json!({"type": "LoadBalancer"}));
        assert_eq!(endpoint_of(&["cloud=aws", "endpoint=None"]), Value::Null);
        assert_eq!(endpoint_of(&["cloud=simulated", "endpoint=FloatingIP"]), serde_json::json!({"type": "FloatingIP"}));
    }

    #[test]
    fn the_kubernetes_template_with_a_vip_installs_keepalived_and_haproxy_and_needs_an_address() {
        let (library, catalog) = (default_library().expect("templates load"), catalog());
        let set = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        let r = render(&library, &catalog, "kubernetes_3node", &set(&["endpoint=VIP", "vipAddress=10.0.0.100", "controlPlanes=3"]), None)
            .expect("renders");
        let cluster = r.objects.iter().find(|o| o["kind"] == "Cluster").expect("a Cluster");
        let spec = &cluster["spec"];
        assert_eq!(spec["controlPlaneEndpoint"], serde_json::json!({"type": "VIP", "address": "10.0.0.100", "port": 8443}));
        assert_eq!(spec["pools"][0]["replicas"], 3);
        let service = |name: &str| spec["taskservs"].as_array().and_then(|t| t.iter().find(|s| s["service"] == name)).cloned();
        let keepalived = service("keepalived").expect("keepalived");
        assert_eq!(keepalived["config"]["virtualAddress"], "10.0.0.100/24");
        assert_eq!(keepalived["pools"], serde_json::json!(["control-plane"]));
        let haproxy = service("haproxy").expect("haproxy");
        assert_eq!((haproxy["config"]["frontendPort"].as_i64(), haproxy["config"]["backendPort"].as_i64()), (Some(8443), Some(6443)));
        // Installed before kubernetes (its catalog entry orders after them when present).
        let cluster: Cluster = serde_json::from_value(cluster.clone()).expect("a Cluster");
        let order: Vec<String> = provisioning_controller::cluster::validate::validate("k8s", &cluster.spec, &catalog)
            .expect("valid")
            .into_iter()
            .map(|s| s.service)
            .collect();
        let at = |s: &str| order.iter().position(|o| o == s).unwrap_or(usize::MAX);
        assert!(at("keepalived") < at("kubernetes") && at("haproxy") < at("kubernetes"), "{order:?}");
        // No address: refused at render, naming the field.
        let e = render(&library, &catalog, "kubernetes_3node", &set(&["endpoint=VIP"]), None).expect_err("no address");
        let e = format!("{e:#}");
        assert!(e.contains("controlPlaneEndpoint.address"), "{e}");
        let e =
            render(&library, &catalog, "kubernetes_3node", &set(&["endpoint=VIP", "vipAddress=10.0.0"]), None).expect_err("not an address");
        let e = format!("{e:#}");
        assert!(e.contains("controlPlaneEndpoint"), "{e}");
    }

    #[test]
    fn an_unknown_service_or_a_bad_config_is_named() {
        let catalog = catalog();
        let cluster = |taskservs: Value| {
            serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "c"},
                "spec": {"pools": [{"name": "p", "replicas": 1}], "taskservs": taskservs}})
        };
        let e = validate_objects(&[cluster(serde_json::json!([{"service": "nosuch"}]))], &catalog).expect_err("unknown").to_string();
        assert!(e.contains("nosuch") && e.contains("UnknownService"), "{e}");
        let e = validate_objects(&[cluster(serde_json::json!([{"service": "redis", "config": {"port": "x"}}]))], &catalog)
            .expect_err("bad config")
            .to_string();
        assert!(e.contains("InvalidConfig") && e.contains("/port"), "{e}");
        let bad_schema = serde_json::json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "c"},
            "spec": {"pools": [{"name": "p", "replicas": "three"}]}});
        let e = validate_objects(&[bad_schema], &catalog).expect_err("schema").to_string();
        assert!(e.contains("CRD schema") && e.contains("/spec/pools/0/replicas"), "{e}");
    }
}
