//! `provisioning catalog list|show`: the taskserv catalog (built-in and user catalogs) as a
//! table, or one service in full.

use std::path::PathBuf;

use provisioning_taskservs::Catalog;

/// `provisioning catalog show NAME`: one service's manifest, where it comes from and its
/// config schema.
pub fn show(catalog: &Catalog, name: &str) -> anyhow::Result<()> {
    let Some(svc) = catalog.get(name) else {
        anyhow::bail!("no service {name:?} in the catalog at {}", catalog.dir().display());
    };
    let m = &svc.manifest;
    println!("name:        {}", m.name);
    println!("description: {}", m.description);
    println!("versions:    {} (default {})", m.versions.join(", "), m.default_version);
    println!("requires:    {}", m.requires.join(", "));
    println!("after:       {}", m.after.join(", "));
    println!("providers:   {}", m.providers.join(", "));
    println!("source:      {}", source_label(catalog, &m.name));
    if m.cloud_only {
        println!("cloud only:  {CLOUD_ONLY}");
    }
    println!("config schema:\n{}", serde_json::to_string_pretty(&m.config_schema)?);
    Ok(())
}

/// What `catalog list` and `show` say of a cloud-only service.
const CLOUD_ONLY: &str = "cloud only, not executed in CI";

/// `provisioning catalog list`: one line per service; the CI column says whether CI runs its
/// scripts (`local`) or the service is cloud only (only checked for parse errors).
pub fn table(catalog: &Catalog) -> String {
    let mut out = format!("{:<14} {:<10} {:<24} {:<36} {:<20} SOURCE\n", "SERVICE", "DEFAULT", "VERSIONS", "CI", "REQUIRES");
    for svc in catalog.services() {
        let m = &svc.manifest;
        let ci = if m.cloud_only { CLOUD_ONLY } else { "executed (local provider)" };
        out.push_str(&format!(
            "{:<14} {:<10} {:<24} {:<36} {:<20} {}\n",
            m.name,
            m.default_version,
            m.versions.join(","),
            ci,
            m.requires.join(","),
            source_label(catalog, &m.name)
        ));
    }
    out
}

/// Where a service comes from: `built-in`, or the user catalog directory.
fn source_label(catalog: &Catalog, name: &str) -> String {
    match catalog.source_of(name) {
        Some(dir) if catalog.layers().first().map(PathBuf::as_path) == Some(dir) => "built-in".to_string(),
        Some(dir) => dir.display().to_string(),
        None => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_list_marks_the_cloud_only_services() {
        let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog loads");
        let table = table(&catalog);
        assert!(table.lines().next().is_some_and(|h| h.contains(" CI ")), "{table}");
        for line in table.lines().skip(1) {
            let service = line.split_whitespace().next().unwrap_or_default();
            let cloud_only = ["kubernetes", "cilium", "coredns", "rook-ceph"].contains(&service);
            assert_eq!(line.contains("cloud only, not executed in CI"), cloud_only, "{line}");
            assert_eq!(line.contains("executed (local provider)"), !cloud_only, "{line}");
        }
        assert_eq!(table.lines().count(), 21, "header and twenty services:\n{table}");
    }
}
