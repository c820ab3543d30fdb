//! Paths on the controller's host that providers are handed: the `nu` binary and the taskserv
//! catalog (mounted read-only into local containers, copied over SSH to cloud machines).
//!
//! They are resolved once, when the controller starts ([`crate::run::run`], which both
//! `provisioning controller` and `provisioning dev` go through), kept in the
//! [`crate::Context`], and reused by every provider (re)build. A missing one is logged then,
//! once, naming what to install and which variable sets it; the providers are built without
//! it, as before (task scripts then fail where they run and their output says why).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Environment variable naming the `nu` binary to mount into local containers (and copy to
/// cloud machines).
pub const NU_ENV: &str = "PROVISIONING_NU";

/// The host's `nu` binary and catalog directory, both absolute (or `None` when not found).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPaths {
    /// The `nu` binary.
    pub nu: Option<PathBuf>,
    /// The taskserv catalog directory.
    pub catalog: Option<PathBuf>,
    /// Why a path is missing, one sentence each (empty when both were found).
    pub problems: Vec<String>,
}

/// What resolution looks at: the process's environment in production, fixed values in tests.
#[derive(Clone, Debug, Default)]
pub struct HostLookup {
    /// `$PROVISIONING_NU` (empty counts as unset).
    pub nu_env: Option<OsString>,
    /// This executable (its ancestors may hold a checkout's `.tools/bin/nu`).
    pub exe: Option<PathBuf>,
    /// The catalog directory as configured (`$PROVISIONING_CATALOG` or the built-in one).
    pub catalog_dir: PathBuf,
    /// `$PATH`.
    pub path_env: Option<OsString>,
}

impl HostLookup {
    /// The lookup of this process.
    pub fn from_process() -> Self {
        HostLookup {
            nu_env: std::env::var_os(NU_ENV),
            exe: std::env::current_exe().ok(),
            catalog_dir: provisioning_taskservs::Catalog::default_dir(),
            path_env: std::env::var_os("PATH"),
        }
    }
}

impl HostPaths {
    /// Resolves the paths of this process (walks the filesystem and `PATH`: call once).
    pub fn resolve() -> Self {
        Self::resolve_with(&HostLookup::from_process())
    }

    /// Resolves `nu` (`$PROVISIONING_NU`, else the setup script's `.tools/bin/nu` of the
    /// checkout holding this binary or the catalog, else `nu` on `PATH`) and the catalog.
    pub fn resolve_with(lookup: &HostLookup) -> Self {
        let mut problems = Vec::new();
        let nu = match lookup.nu_env.as_ref().filter(|v| !v.is_empty()) {
            Some(configured) => {
                let found = existing_file(Path::new(configured));
                if found.is_none() {
                    problems.push(format!(
                        "{NU_ENV}={} is not a file: point {NU_ENV} at a nu binary (scripts/setup.sh installs one in \
                         .tools/bin/nu); until then task scripts cannot run",
                        Path::new(configured).display()
                    ));
                }
                found
            }
            None => {
                let found = search_nu(lookup);
                if found.is_none() {
                    problems.push(format!(
                        "no nu binary found ({NU_ENV} unset, no .tools/bin/nu next to this binary or the catalog, none on \
                         PATH): install nushell (scripts/setup.sh puts it in .tools/bin/nu) or set {NU_ENV} to its path; \
                         until then task scripts cannot run"
                    ));
                }
                found
            }
        };
        let catalog = std::fs::canonicalize(&lookup.catalog_dir).ok().filter(|p| p.is_dir());
        if catalog.is_none() {
            problems.push(format!(
                "taskserv catalog directory {} not found: set {} to the catalog's path",
                lookup.catalog_dir.display(),
                provisioning_taskservs::CATALOG_ENV
            ));
        }
        HostPaths { nu, catalog, problems }
    }

    /// Logs each problem once (at start-up), as a warning.
    pub fn log_problems(&self) {
        for problem in &self.problems {
            tracing::warn!("{problem}");
        }
        if self.problems.is_empty() {
            tracing::debug!(nu = ?self.nu, catalog = ?self.catalog, "host paths for providers");
        }
    }
}

/// Writes the merged catalog (built-in + user catalogs) to `<state_dir>/catalog` and
/// returns its absolute path: what local containers mount and SSH copies. Synced in place, so
/// containers created before a catalog change see the new files.
pub fn materialize_catalog(catalog: &provisioning_taskservs::Catalog, state_dir: &Path) -> anyhow::Result<PathBuf> {
    let dest = state_dir.join("catalog");
    catalog.materialize(&dest)?;
    Ok(std::fs::canonicalize(&dest)?)
}

/// `path` made absolute when it is an existing file.
fn existing_file(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok().filter(|p| p.is_file())
}

/// `.tools/bin/nu` above this binary or the catalog, else `nu` on `PATH`.
fn search_nu(lookup: &HostLookup) -> Option<PathBuf> {
    let roots = lookup.exe.iter().flat_map(|e| e.ancestors()).chain(lookup.catalog_dir.ancestors());
    for root in roots {
        if let Some(p) = existing_file(&root.join(".tools/bin/nu")) {
            return Some(p);
        }
    }
    let path_env = lookup.path_env.clone().unwrap_or_default();
    std::env::split_paths(&path_env).map(|d| d.join("nu")).find_map(|p| existing_file(&p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nu_is_named_with_what_to_install_and_which_variable_sets_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let catalog = dir.path().join("catalog");
        std::fs::create_dir_all(&catalog).expect("mkdir");
        let lookup = HostLookup { nu_env: None, exe: None, catalog_dir: catalog.clone(), path_env: Some(OsString::new()) };
        let paths = HostPaths::resolve_with(&lookup);
        assert_eq!(paths.nu, None);
        assert_eq!(paths.catalog.as_deref(), std::fs::canonicalize(&catalog).ok().as_deref());
        assert_eq!(paths.problems.len(), 1, "{:?}", paths.problems);
        let message = &paths.problems[0];
        assert!(message.contains("no nu binary found") && message.contains(NU_ENV) && message.contains("scripts/setup.sh"), "{message}");

        // A configured path that is not a file is named as such.
        let lookup = HostLookup { nu_env: Some(dir.path().join("no-nu").into()), ..lookup };
        let paths = HostPaths::resolve_with(&lookup);
        assert_eq!(paths.nu, None);
        assert!(paths.problems[0].starts_with(&format!("{NU_ENV}={}", dir.path().join("no-nu").display())), "{:?}", paths.problems);
    }

    #[test]
    fn nu_is_found_in_a_checkout_or_on_path_and_a_missing_catalog_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tools = dir.path().join("checkout/.tools/bin");
        std::fs::create_dir_all(&tools).expect("mkdir");
        std::fs::write(tools.join("nu"), b"nu").expect("write");
        let exe = dir.path().join("checkout/target/debug/provisioning");
        let lookup = HostLookup { nu_env: None, exe: Some(exe), catalog_dir: dir.path().join("nowhere"), path_env: None };
        let paths = HostPaths::resolve_with(&lookup);
        assert_eq!(paths.nu.as_deref(), std::fs::canonicalize(tools.join("nu")).ok().as_deref());
        assert_eq!(paths.catalog, None);
        assert!(paths.problems.len() == 1 && paths.problems[0].contains(provisioning_taskservs::CATALOG_ENV), "{:?}", paths.problems);

        let on_path = HostLookup { exe: None, path_env: Some(std::env::join_paths([&tools]).expect("join")), ..lookup };
        assert_eq!(HostPaths::resolve_with(&on_path).nu, std::fs::canonicalize(tools.join("nu")).ok());
    }
}
