//! Download pins the Kubernetes add-ons need before their scripts run: a version without a
//! SHA-256 pin is refused on the machine (`lib/k8s.nu` `fetch`), so the Cluster says so up
//! front, naming the config field to set and where upstream publishes the value.
//!
//! The catalog pins the default versions and cites each value's source in its taskserv.yaml:
//! the cilium CLI's checksum is the release's `.sha256sum` file; Rook publishes no checksum
//! for its manifests, so the value is the SHA-256 of the file at the release tag.

use provisioning_taskservs::Catalog;
use serde_json::Value;

use super::plan::ChildTaskServ;

/// A config value of `ts`, else its schema default in the catalog.
fn config_or_default(ts: &ChildTaskServ, catalog: &Catalog, key: &str) -> Option<Value> {
    if let Some(v) = ts.spec.config.as_ref().and_then(|c| c.get(key)) {
        return Some(v.clone());
    }
    catalog.get(&ts.spec.service)?.manifest.config_schema["properties"][key].get("default").cloned()
}

fn version(ts: &ChildTaskServ, catalog: &Catalog) -> String {
    match ts.spec.version.as_str() {
        "" => catalog.get(&ts.spec.service).map(|s| s.manifest.default_version.clone()).unwrap_or_default(),
        v => v.to_string(),
    }
}

fn pinned(pins: Option<&Value>, key: &str) -> bool {
    pins.and_then(|p| p.get(key)).and_then(Value::as_str).is_some_and(|s| s.len() == 64)
}

/// What pin `ts` lacks for the version it installs (a message naming the field and the
/// source), or none.
pub fn missing(ts: &ChildTaskServ, catalog: &Catalog) -> Option<String> {
    match ts.spec.service.as_str() {
        "cilium" => {
            let cli = config_or_default(ts, catalog, "cliVersion")?.as_str()?.to_string();
            let pins = config_or_default(ts, catalog, "cliSha256");
            (!pinned(pins.as_ref(), &cli)).then(|| {
                format!(
                    "no pin for the cilium CLI {cli}: set config cliSha256.\"{cli}\" to the SHA-256 published in \
                     https://github.com/cilium/cilium-cli/releases/download/{cli}/cilium-linux-amd64.tar.gz.sha256sum \
                     (the install refuses to download it unpinned)"
                )
            })
        }
        "rook-ceph" => {
            let version = version(ts, catalog);
            let pins = config_or_default(ts, catalog, "manifestSha256");
            let missing: Vec<String> = ["crds.yaml", "common.yaml", "operator.yaml"]
                .iter()
                .map(|f| format!("v{version}/{f}"))
                .filter(|k| !pinned(pins.as_ref(), k))
                .collect();
            (!missing.is_empty()).then(|| {
                format!(
                    "no pin for the Rook manifests {}: set config manifestSha256.\"<key>\" to the SHA-256 of \
                     https://raw.githubusercontent.com/rook/rook/v{version}/deploy/examples/<file> at the release tag \
                     (Rook publishes no checksum file: compute and review it yourself; the install refuses unpinned manifests)",
                    missing.join(", ")
                )
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use provisioning_crds::TaskServSpec;

    use super::*;

    fn ts(service: &str, config: Value) -> ChildTaskServ {
        ChildTaskServ {
            name: format!("k-{service}"),
            labels: Default::default(),
            spec: TaskServSpec { service: service.into(), config: Some(config), ..Default::default() },
            owned: true,
            ready: true,
            stalled: None,
            phase: "Ready".into(),
            message: String::new(),
            servers_in_status: Default::default(),
            was_ever_ready: true,
            deleting: false,
            serving: Default::default(),
            pending_plan: None,
            approve: None,
            settled: true,
        }
    }

    #[test]
    fn a_missing_pin_names_the_field_and_where_the_value_comes_from() -> Result<(), Box<dyn std::error::Error>> {
        let catalog = Catalog::load(&Catalog::default_dir())?;
        // The catalog's defaults pin the default versions.
        assert_eq!(missing(&ts("cilium", serde_json::json!({})), &catalog), None);
        assert_eq!(missing(&ts("rook-ceph", serde_json::json!({})), &catalog), None);
        // A version the catalog has no pin for is named, with the field and the source.
        let m = missing(&ts("cilium", serde_json::json!({"cliVersion": "v0.16.21"})), &catalog).unwrap_or_default();
        assert!(
            m.contains("cliSha256.\"v0.16.21\"") && m.contains("releases/download/v0.16.21/cilium-linux-amd64.tar.gz.sha256sum"),
            "{m}"
        );
        let mut rook = ts("rook-ceph", serde_json::json!({}));
        rook.spec.version = "1.14.0".into();
        let m = missing(&rook, &catalog).unwrap_or_default();
        assert!(
            m.contains("v1.14.0/crds.yaml, v1.14.0/common.yaml, v1.14.0/operator.yaml") && m.contains("rook/v1.14.0/deploy/examples"),
            "{m}"
        );
        // A config that names its own pins replaces the catalog's: a partial map is refused.
        let m = missing(&ts("rook-ceph", serde_json::json!({"manifestSha256": {"v1.15.6/crds.yaml": "0".repeat(64)}})), &catalog)
            .unwrap_or_default();
        assert!(m.contains("v1.15.6/common.yaml, v1.15.6/operator.yaml"), "{m}");
        // Pinned: nothing to say.
        let pin = "0".repeat(64);
        assert_eq!(missing(&ts("cilium", serde_json::json!({"cliSha256": {"v0.16.22": pin}})), &catalog), None);
        let pins =
            serde_json::json!({"manifestSha256": {"v1.15.6/crds.yaml": pin, "v1.15.6/common.yaml": pin, "v1.15.6/operator.yaml": pin}});
        assert_eq!(missing(&ts("rook-ceph", pins), &catalog), None);
        assert_eq!(missing(&ts("etcd", serde_json::json!({})), &catalog), None);
        Ok(())
    }
}
