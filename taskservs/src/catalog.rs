//! Loading and validating the catalog, resolving dependencies, validating requests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::error::{CatalogError, ConfigViolation, ResolveError, TemplateError, ValidationError};
use crate::manifest::{KNOWN_PROVIDERS, REQUIRED_SCRIPTS, TaskServManifest, is_valid_service_name};

/// The longest a service's script may run (`timeoutSeconds`): a day.
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;
/// Environment variable naming the catalog directory (overrides the built-in default).
pub const CATALOG_ENV: &str = "PROVISIONING_CATALOG";

/// One service of the catalog: its manifest, where it lives, its templates, its compiled schema.
#[derive(Clone)]
pub struct CatalogService {
    /// The parsed manifest.
    pub manifest: TaskServManifest,
    /// The service's directory (`<catalog>/<name>`).
    pub dir: PathBuf,
    /// Template sources by file name (`templates/<file>`).
    pub templates: BTreeMap<String, String>,
    validator: Arc<jsonschema::Validator>,
}

impl std::fmt::Debug for CatalogService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogService")
            .field("manifest", &self.manifest)
            .field("dir", &self.dir)
            .field("templates", &self.templates.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl CatalogService {
    /// Catalog name.
    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    /// The config fields the schema marks secret (`writeOnly: true` or
    /// `x-provisioning-secret: true`), nested objects included, in schema order.
    pub fn secret_fields(&self) -> Vec<SecretField> {
        let mut out = Vec::new();
        collect_secret_fields(&self.manifest.config_schema, &mut Vec::new(), &mut out);
        out
    }
}

/// How a secret field's value is generated when the user leaves it unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretFormat {
    /// 32 characters of `[A-Za-z0-9]` (the default).
    Password,
    /// A kubeadm bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
    KubeadmToken,
    /// 64 lower-case hex digits (32 random bytes), e.g. kubeadm's certificate key.
    Hex64,
    /// A fresh ECDSA P-256 private key, PKCS#8 PEM (a CA key, e.g. kubeadm's).
    EcP256Pem,
}

impl SecretFormat {
    /// The format named by `x-provisioning-generate` (absent: [`SecretFormat::Password`]).
    pub fn from_marker(marker: Option<&str>) -> Option<Self> {
        match marker {
            None | Some("password") => Some(SecretFormat::Password),
            Some("kubeadm-token") => Some(SecretFormat::KubeadmToken),
            Some("hex64") => Some(SecretFormat::Hex64),
            Some("ec-p256-pem") => Some(SecretFormat::EcP256Pem),
            Some(_) => None,
        }
    }
}

/// A config field the schema marks secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretField {
    /// Property names from the config's root (`["auth", "password"]`).
    pub path: Vec<String>,
    /// How to generate it when unset.
    pub format: SecretFormat,
}

impl SecretField {
    /// The dotted path (`auth.password`): the key of the generated Secret.
    pub fn dotted(&self) -> String {
        self.path.join(".")
    }
}

/// Whether a property schema marks a secret.
fn is_secret_schema(schema: &Value) -> bool {
    schema.get("writeOnly").and_then(Value::as_bool) == Some(true)
        || schema.get("x-provisioning-secret").and_then(Value::as_bool) == Some(true)
}

fn collect_secret_fields(schema: &Value, path: &mut Vec<String>, out: &mut Vec<SecretField>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        path.push(name.clone());
        if is_secret_schema(property) {
            let marker = property.get("x-provisioning-generate").and_then(Value::as_str);
            out.push(SecretField {
                path: path.clone(),
                // Checked at load time: an unknown marker never gets here.
                format: SecretFormat::from_marker(marker).unwrap_or(SecretFormat::Password),
            });
        } else {
            collect_secret_fields(property, path, out);
        }
        path.pop();
    }
}

/// Checks the secret markers of a schema: `x-provisioning-generate` names a known format.
/// (A secret field may have a `default`: the controller generates the value whenever the
/// user leaves it unset, so the default only serves scripts run without the controller.)
fn check_secret_markers(schema: &Value, path: &mut Vec<String>) -> Result<(), String> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    for (name, property) in properties {
        path.push(name.clone());
        if let Some(m) = property.get("x-provisioning-generate")
            && SecretFormat::from_marker(m.as_str()).is_none()
        {
            return Err(format!(
                "configSchema {}: x-provisioning-generate must be password, kubeadm-token, hex64 or ec-p256-pem",
                path.join(".")
            ));
        }
        check_secret_markers(property, path)?;
        path.pop();
    }
    Ok(())
}

/// What a valid request resolves to: the version to install and the config with schema defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedService {
    /// Catalog name.
    pub service: String,
    /// The version to install (the request's, or the catalog default).
    pub version: String,
    /// The request's config with the schema's `default`s filled in; validated.
    pub config: Value,
    /// Hard dependencies.
    pub requires: Vec<String>,
    /// Soft ordering.
    pub after: Vec<String>,
    /// Time limit of one script run.
    pub timeout: Duration,
    /// How often to re-check health.
    pub health_interval: Duration,
}

/// The taskserv catalog: every `<dir>/<name>/taskserv.yaml`, validated.
#[derive(Clone, Debug)]
pub struct Catalog {
    dir: PathBuf,
    services: BTreeMap<String, CatalogService>,
    /// Every catalog directory merged into this one, in order (one for [`Catalog::load`]).
    layers: Vec<PathBuf>,
}

impl Catalog {
    /// The catalog directory to use: `$PROVISIONING_CATALOG` when set, otherwise
    /// `taskservs/catalog` of this crate's source tree (fixed at build time).
    pub fn default_dir() -> PathBuf {
        match std::env::var_os(CATALOG_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog"),
        }
    }

    /// Loads and validates every service under `dir`. Subdirectories `lib` (shared Nushell
    /// helpers) and hidden ones are not services; any other directory must hold a manifest.
    /// Checks: manifest shape, name = directory, versions, providers, dependencies exist,
    /// scripts exist, schema compiles, templates parse.
    pub fn load(dir: &Path) -> Result<Catalog, CatalogError> {
        let services = load_services(dir)?;
        check_dependencies_exist(&services)?;
        Ok(Catalog { dir: dir.to_path_buf(), services, layers: vec![dir.to_path_buf()] })
    }

    /// Loads several catalog directories as one: the first (the built-in catalog) first,
    /// later directories override earlier ones by service name. Each directory is checked as
    /// [`Catalog::load`] does; on top of that the merged catalog must have no repeated entry
    /// in a `requires`/`after` list and no dependency cycle. Every error names the file.
    ///
    /// A later layer may not replace a service or a `lib/` file of an earlier one (the
    /// built-in catalog's scripts run as root on every machine): see
    /// [`Catalog::load_layers_allowing`] for the explicit opt-in.
    pub fn load_layers(dirs: &[PathBuf]) -> Result<Catalog, CatalogError> {
        Self::load_layers_allowing(dirs, &[])
    }

    /// [`Catalog::load_layers`], where a later layer may replace the earlier layers' services
    /// named in `overrides`, and their `lib/` files when `overrides` holds `"lib"` (the
    /// controller config's `catalog_overrides`). Catalog files must be regular files or
    /// directories: a symlink, device, FIFO or socket is refused, naming its path.
    pub fn load_layers_allowing(dirs: &[PathBuf], overrides: &[String]) -> Result<Catalog, CatalogError> {
        let Some(first) = dirs.first() else {
            return Err(CatalogError::Invalid { path: PathBuf::new(), problem: "no catalog directory given".into() });
        };
        let mut services: BTreeMap<String, CatalogService> = BTreeMap::new();
        let mut lib_files: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        for dir in dirs {
            if !dir.is_dir() {
                return Err(CatalogError::Invalid { path: dir.clone(), problem: "catalog directory does not exist".into() });
            }
            for (name, service) in load_services(dir)? {
                if let Some(earlier) = services.get(&name)
                    && !overrides.contains(&name)
                {
                    return Err(CatalogError::Invalid {
                        path: service.dir.clone(),
                        problem: format!(
                            "replaces service {name:?} of {}; list {name:?} in the controller config's catalog_overrides to allow that",
                            earlier.dir.display()
                        ),
                    });
                }
                services.insert(name, service);
            }
            let mut layer_lib = BTreeMap::new();
            collect_files(&dir.join("lib"), Path::new("lib"), &mut layer_lib)?;
            for (rel, path) in layer_lib {
                if let Some(earlier) = lib_files.get(&rel)
                    && !overrides.iter().any(|o| o == "lib")
                {
                    return Err(CatalogError::Invalid {
                        path,
                        problem: format!(
                            "replaces {}; add \"lib\" to the controller config's catalog_overrides to allow that",
                            earlier.display()
                        ),
                    });
                }
                lib_files.insert(rel, path);
            }
        }
        check_dependencies_exist(&services)?;
        for service in services.values() {
            let path = service.dir.join("taskserv.yaml");
            for (field, deps) in [("requires", &service.manifest.requires), ("after", &service.manifest.after)] {
                let mut seen = BTreeSet::new();
                if let Some(dup) = deps.iter().find(|d| !seen.insert(*d)) {
                    return Err(CatalogError::Invalid { path, problem: format!("{field} lists {dup:?} twice") });
                }
            }
        }
        let catalog = Catalog { dir: first.clone(), services, layers: dirs.to_vec() };
        let deps: BTreeMap<&str, BTreeSet<&str>> = catalog
            .services
            .values()
            .map(|s| (s.name(), s.manifest.requires.iter().chain(&s.manifest.after).map(String::as_str).collect()))
            .collect();
        if let Some(cycle) = find_cycle(&deps) {
            let path = catalog.services.get(&cycle[0]).map(|s| s.dir.join("taskserv.yaml")).unwrap_or_default();
            return Err(CatalogError::Invalid { path, problem: format!("dependency cycle: {}", cycle.join(" -> ")) });
        }
        Ok(catalog)
    }

    /// The catalog directories merged into this catalog, in order.
    pub fn layers(&self) -> &[PathBuf] {
        &self.layers
    }

    /// The directory a service was loaded from (the layer, not the service's own directory).
    pub fn source_of(&self, name: &str) -> Option<&Path> {
        self.services.get(name).and_then(|s| s.dir.parent())
    }

    /// Makes `dest` hold this catalog as one directory tree, as scripts expect it
    /// (`<dest>/<service>/…` and `<dest>/lib/`, each layer's `lib/` files overriding earlier
    /// ones of the same name). Synced in place — changed files rewritten, stale ones removed,
    /// `dest` itself never replaced — so a container that bind-mounts `dest` sees the update.
    pub fn materialize(&self, dest: &Path) -> Result<(), CatalogError> {
        let mut wanted: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        for layer in &self.layers {
            collect_files(&layer.join("lib"), Path::new("lib"), &mut wanted)?;
        }
        for service in self.services.values() {
            collect_files(&service.dir, Path::new(service.name()), &mut wanted)?;
        }
        sync_tree(dest, &wanted)
    }

    /// The directory the catalog was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A service by name.
    pub fn get(&self, name: &str) -> Option<&CatalogService> {
        self.services.get(name)
    }

    /// All services, by name.
    pub fn services(&self) -> impl Iterator<Item = &CatalogService> {
        self.services.values()
    }

    /// Install order for `wanted`: the closure of `requires`, topologically sorted (each service
    /// after what it requires, and after its `after` entries that are part of the plan). Ties are
    /// broken by name, so the order is deterministic.
    pub fn resolve(&self, wanted: &[String]) -> Result<Vec<String>, ResolveError> {
        // Closure of hard dependencies.
        let mut plan: BTreeSet<String> = BTreeSet::new();
        let mut queue: Vec<String> = wanted.to_vec();
        while let Some(name) = queue.pop() {
            if plan.contains(&name) {
                continue;
            }
            let service = self.services.get(&name).ok_or_else(|| ResolveError::Unknown(name.clone()))?;
            queue.extend(service.manifest.requires.iter().cloned());
            plan.insert(name);
        }
        // "name must come after each of deps[name]".
        let deps: BTreeMap<&str, BTreeSet<&str>> = plan
            .iter()
            .map(|name| {
                let manifest = &self.services[name].manifest;
                let hard = manifest.requires.iter();
                let soft = manifest.after.iter().filter(|a| plan.contains(*a));
                (name.as_str(), hard.chain(soft).map(String::as_str).collect())
            })
            .collect();
        if let Some(cycle) = find_cycle(&deps) {
            return Err(ResolveError::Cycle(cycle.join(" -> ")));
        }
        // Kahn's algorithm, smallest name first among the ready ones.
        let mut remaining = deps.clone();
        let mut order = Vec::with_capacity(plan.len());
        while !remaining.is_empty() {
            let ready: Option<&str> = remaining.iter().find(|(_, d)| d.is_empty()).map(|(n, _)| *n);
            let Some(next) = ready else {
                // Unreachable after find_cycle; report rather than loop.
                let names: Vec<&str> = remaining.keys().copied().collect();
                return Err(ResolveError::Cycle(names.join(" -> ")));
            };
            remaining.remove(next);
            for d in remaining.values_mut() {
                d.remove(next);
            }
            order.push(next.to_string());
        }
        Ok(order)
    }

    /// Checks a request against the catalog: the service exists, the version is one the catalog
    /// has (none = the default), the config (schema defaults filled in) satisfies the schema.
    pub fn validate_request(&self, service: &str, version: Option<&str>, config: &Value) -> Result<ResolvedService, ValidationError> {
        self.validate(service, version, config, false)
    }

    /// [`Catalog::validate_request`] for a config that is not complete yet: values still to
    /// come from `configFrom` or from generated secrets may be missing (`required` is not
    /// checked), everything present must be valid. A Cluster checks its services this way.
    pub fn validate_partial_request(
        &self,
        service: &str,
        version: Option<&str>,
        config: &Value,
    ) -> Result<ResolvedService, ValidationError> {
        self.validate(service, version, config, true)
    }

    fn validate(&self, service: &str, version: Option<&str>, config: &Value, partial: bool) -> Result<ResolvedService, ValidationError> {
        let entry = self.services.get(service).ok_or_else(|| ValidationError::UnknownService(service.to_string()))?;
        let manifest = &entry.manifest;
        let version = match version {
            None | Some("") => manifest.default_version.clone(),
            Some(v) if manifest.versions.iter().any(|known| known == v) => v.to_string(),
            Some(v) => {
                return Err(ValidationError::UnknownVersion {
                    service: service.to_string(),
                    version: v.to_string(),
                    available: manifest.versions.clone(),
                });
            }
        };
        let mut config = if config.is_null() { Value::Object(Default::default()) } else { config.clone() };
        apply_defaults(&manifest.config_schema, &mut config);
        let violations: Vec<ConfigViolation> = entry
            .validator
            .iter_errors(&config)
            .filter(|e| !(partial && e.kind().keyword() == "required"))
            // The path and the rule, never the value: it may be a password.
            .map(|e| ConfigViolation { pointer: e.instance_path().as_str().to_string(), reason: e.masked_with("the value").to_string() })
            .collect();
        if !violations.is_empty() {
            return Err(ValidationError::InvalidConfig { service: service.to_string(), violations });
        }
        Ok(ResolvedService {
            service: service.to_string(),
            version,
            config,
            requires: manifest.requires.clone(),
            after: manifest.after.clone(),
            timeout: Duration::from_secs(manifest.timeout_seconds),
            health_interval: Duration::from_secs(manifest.health.interval_seconds),
        })
    }
}

/// The services of one catalog directory (no cross-service checks).
fn load_services(dir: &Path) -> Result<BTreeMap<String, CatalogService>, CatalogError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CatalogError::Io { path, source }
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let kind = entry.file_type().map_err(io(&entry.path()))?;
        if !entry.file_name().to_string_lossy().starts_with('.') {
            regular(&entry.path(), kind)?;
        }
        if kind.is_dir() {
            entries.push(entry.path());
        }
    }
    entries.sort();
    let mut services = BTreeMap::new();
    for service_dir in entries {
        let dir_name = service_dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if dir_name.starts_with('.') {
            continue;
        }
        if dir_name == "lib" {
            collect_files(&service_dir, Path::new("lib"), &mut BTreeMap::new())?;
            continue;
        }
        let service = load_service(&service_dir, &dir_name)?;
        // Every file the service would copy onto machines is checked now.
        collect_files(&service_dir, Path::new(&dir_name), &mut BTreeMap::new())?;
        services.insert(dir_name, service);
    }
    Ok(services)
}

/// Dependencies must name services of the catalog.
fn check_dependencies_exist(services: &BTreeMap<String, CatalogService>) -> Result<(), CatalogError> {
    for service in services.values() {
        let path = service.dir.join("taskserv.yaml");
        for (field, deps) in [("requires", &service.manifest.requires), ("after", &service.manifest.after)] {
            for dep in deps {
                if !services.contains_key(dep) {
                    return Err(CatalogError::Invalid { path, problem: format!("{field} names {dep:?}, which is not in the catalog") });
                }
            }
        }
    }
    Ok(())
}

/// Refuses anything but a regular file or a directory (a symlink could copy the signing key,
/// the admin token or a CA key into the catalog that every machine receives).
fn regular(path: &Path, kind: std::fs::FileType) -> Result<(), CatalogError> {
    use std::os::unix::fs::FileTypeExt;
    let what = if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        return Ok(());
    };
    Err(CatalogError::Invalid {
        path: path.to_path_buf(),
        problem: format!("is {what}; catalogs accept regular files and directories only"),
    })
}

/// Reads `path`, which was listed as a regular file: opened without following a symbolic link
/// and without blocking on a FIFO, then checked on the open handle — a symlink, FIFO or device
/// swapped in after the listing is refused, never followed to what it points at.
pub(crate) fn read_regular(path: &Path) -> Result<Vec<u8>, CatalogError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| CatalogError::Io { path: path.to_path_buf(), source };
    let mut file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(CatalogError::Invalid {
                path: path.to_path_buf(),
                problem: "is a symbolic link; catalogs accept regular files and directories only".into(),
            });
        }
        other => other.map_err(io)?,
    };
    let kind = file.metadata().map_err(io)?.file_type();
    regular(path, kind)?;
    if !kind.is_file() {
        return Err(CatalogError::Invalid { path: path.to_path_buf(), problem: "is not a regular file".into() });
    }
    let mut content = Vec::new();
    file.read_to_end(&mut content).map_err(io)?;
    Ok(content)
}

/// [`read_regular`] as UTF-8 text.
pub(crate) fn read_regular_text(path: &Path) -> Result<String, CatalogError> {
    String::from_utf8(read_regular(path)?)
        .map_err(|_| CatalogError::Invalid { path: path.to_path_buf(), problem: "is not UTF-8 text".into() })
}

/// Every regular file under `dir` (recursively; hidden entries skipped) into `out` as
/// `prefix/<relative path>` → source. A missing `dir` adds nothing; a symlink, device, FIFO
/// or socket (`dir` itself included) is an error naming its path.
fn collect_files(dir: &Path, prefix: &Path, out: &mut BTreeMap<PathBuf, PathBuf>) -> Result<(), CatalogError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CatalogError::Io { path, source }
    };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(dir)(e)),
        Ok(md) => regular(dir, md.file_type())?,
    }
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        regular(&path, kind)?;
        if kind.is_dir() {
            collect_files(&path, &prefix.join(&name), out)?;
        } else if kind.is_file() {
            out.insert(prefix.join(&name), path);
        }
    }
    Ok(())
}

/// Makes `dest` hold exactly `wanted` (relative path → source): copies what differs,
/// removes what is not wanted, keeps `dest` itself.
fn sync_tree(dest: &Path, wanted: &BTreeMap<PathBuf, PathBuf>) -> Result<(), CatalogError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CatalogError::Io { path, source }
    };
    std::fs::create_dir_all(dest).map_err(io(dest))?;
    let mut present = BTreeMap::new();
    collect_files(dest, Path::new(""), &mut present)?;
    for (rel, path) in &present {
        if !wanted.contains_key(rel) {
            std::fs::remove_file(path).map_err(io(path))?;
        }
    }
    for (rel, source) in wanted {
        let target = dest.join(rel);
        let content = read_regular(source)?;
        if std::fs::read(&target).ok().as_deref() == Some(content.as_slice()) {
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&target, &content).map_err(io(&target))?;
    }
    remove_empty_dirs(dest, true);
    Ok(())
}

/// Removes directories left empty under `dir` (and `dir` itself unless `keep`).
fn remove_empty_dirs(dir: &Path, keep: bool) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&entry.path(), false);
            }
        }
    }
    if !keep {
        // Fails (and is left) when not empty.
        let _ = std::fs::remove_dir(dir);
    }
}

/// A dependency cycle as a path `[a, b, a]` (a depends on b, b on a), if there is one.
fn find_cycle(deps: &BTreeMap<&str, BTreeSet<&str>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Visiting,
        Done,
    }
    fn visit<'a>(
        node: &'a str,
        deps: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        marks: &mut BTreeMap<&'a str, Mark>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Visiting) => {
                let start = stack.iter().position(|n| *n == node).unwrap_or(0);
                let mut cycle: Vec<String> = stack[start..].iter().map(|s| s.to_string()).collect();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node, Mark::Visiting);
        stack.push(node);
        for dep in deps.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(dep, deps, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in deps.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(node, deps, &mut marks, &mut stack) {
            return Some(cycle);
        }
    }
    None
}

/// Fills in `default`s of object properties (recursively) that the config leaves out.
fn apply_defaults(schema: &Value, config: &mut Value) {
    let (Some(properties), Value::Object(object)) = (schema.get("properties").and_then(Value::as_object), config) else {
        return;
    };
    for (key, property_schema) in properties {
        if !object.contains_key(key) {
            if let Some(default) = property_schema.get("default") {
                object.insert(key.clone(), default.clone());
            } else if property_schema.get("type").and_then(Value::as_str) == Some("object") && property_schema.get("properties").is_some() {
                // A nested object with defaults of its own gets them even when left out.
                let mut nested = Value::Object(Default::default());
                apply_defaults(property_schema, &mut nested);
                if nested.as_object().is_some_and(|o| !o.is_empty()) {
                    object.insert(key.clone(), nested);
                }
            }
        }
        if let Some(value) = object.get_mut(key) {
            apply_defaults(property_schema, value);
        }
    }
}

fn load_service(dir: &Path, dir_name: &str) -> Result<CatalogService, CatalogError> {
    let path = dir.join("taskserv.yaml");
    let invalid = |problem: String| CatalogError::Invalid { path: path.clone(), problem };
    if let Ok(md) = std::fs::symlink_metadata(&path) {
        regular(&path, md.file_type())?;
    }
    if !path.is_file() {
        return Err(invalid("missing taskserv.yaml (every catalog directory but lib/ is a service)".into()));
    }
    let text = read_regular_text(&path)?;
    let manifest: TaskServManifest =
        provisioning_yaml::from_str(&text).map_err(|e| CatalogError::Parse { path: path.clone(), message: e.to_string() })?;

    if manifest.name != dir_name {
        return Err(invalid(format!("name {:?} differs from its directory {dir_name:?}", manifest.name)));
    }
    if !is_valid_service_name(&manifest.name) {
        return Err(invalid(format!("name {:?} must be lower-case letters, digits and '-'", manifest.name)));
    }
    if manifest.description.trim().is_empty() {
        return Err(invalid("description is empty".into()));
    }
    if manifest.versions.is_empty() {
        return Err(invalid("versions is empty".into()));
    }
    let mut seen = BTreeSet::new();
    for v in &manifest.versions {
        if v.trim().is_empty() || !seen.insert(v) {
            return Err(invalid(format!("versions has an empty or repeated entry {v:?}")));
        }
    }
    if !manifest.versions.contains(&manifest.default_version) {
        return Err(invalid(format!(
            "defaultVersion {:?} is not one of versions [{}]",
            manifest.default_version,
            manifest.versions.join(", ")
        )));
    }
    if manifest.providers.is_empty() {
        return Err(invalid("providers is empty".into()));
    }
    for p in &manifest.providers {
        if !KNOWN_PROVIDERS.contains(&p.as_str()) {
            return Err(invalid(format!("unknown provider {p:?} (known: {})", KNOWN_PROVIDERS.join(", "))));
        }
    }
    if manifest.cloud_only && manifest.providers.iter().any(|p| p == "local") {
        return Err(invalid("cloudOnly is true but providers lists local (which runs the scripts in CI)".into()));
    }
    for dep in manifest.requires.iter().chain(&manifest.after) {
        if dep == &manifest.name {
            return Err(invalid(format!("{dep:?} depends on itself")));
        }
    }
    if manifest.timeout_seconds == 0 {
        return Err(invalid("timeoutSeconds must be > 0".into()));
    }
    if manifest.timeout_seconds > MAX_TIMEOUT_SECONDS {
        return Err(invalid(format!("timeoutSeconds must be at most {MAX_TIMEOUT_SECONDS} (24 hours), got {}", manifest.timeout_seconds)));
    }
    if manifest.health.interval_seconds == 0 {
        return Err(invalid("health.intervalSeconds must be > 0".into()));
    }
    if manifest.health.script != "check.nu" {
        return Err(invalid(format!("health.script is {:?}; the check step runs check.nu", manifest.health.script)));
    }
    for script in REQUIRED_SCRIPTS {
        if let Ok(md) = std::fs::symlink_metadata(dir.join(script)) {
            regular(&dir.join(script), md.file_type())?;
        }
        if !dir.join(script).is_file() {
            return Err(CatalogError::Invalid { path: dir.join(script), problem: "script is missing".into() });
        }
    }
    if !manifest.config_schema.is_object() {
        return Err(CatalogError::Schema { path: path.clone(), message: "configSchema must be an object".into() });
    }
    check_secret_markers(&manifest.config_schema, &mut Vec::new())
        .map_err(|message| CatalogError::Schema { path: path.clone(), message })?;
    let validator = jsonschema::validator_for(&manifest.config_schema)
        .map_err(|e| CatalogError::Schema { path: path.clone(), message: e.to_string() })?;

    let templates = load_templates(&dir.join("templates"))?;
    Ok(CatalogService { manifest, dir: dir.to_path_buf(), templates, validator: Arc::new(validator) })
}

fn load_templates(dir: &Path) -> Result<BTreeMap<String, String>, CatalogError> {
    let mut templates = BTreeMap::new();
    if let Ok(md) = std::fs::symlink_metadata(dir) {
        regular(dir, md.file_type())?;
    }
    if !dir.is_dir() {
        return Ok(templates);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CatalogError::Io { path, source }
    };
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        regular(&path, kind)?;
        if !kind.is_file() {
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            return Err(CatalogError::Invalid { path, problem: "template file name is not UTF-8".into() });
        };
        let source = read_regular_text(&path)?;
        // Parse now so a broken template is a start-up error, not a failed install.
        let mut env = crate::templates::template_env();
        env.add_template_owned(name.clone(), source.clone())
            .map_err(|e| CatalogError::Template { path: path.clone(), message: e.to_string() })?;
        templates.insert(name, source);
    }
    Ok(templates)
}

impl Catalog {
    /// Renders every `templates/*` file of `service` with `values` (a script context's
    /// [`crate::ScriptContext::template_values`]).
    pub fn render_templates(&self, service: &str, values: &Value) -> Result<BTreeMap<String, String>, TemplateError> {
        let entry = self.get(service).ok_or_else(|| TemplateError::UnknownService(service.to_string()))?;
        crate::templates::render(service, &entry.templates, values)
    }
}

#[cfg(test)]
mod read_tests {
    use super::read_regular;

    /// What was listed as a regular file may be swapped before it is read: a symlink is not
    /// followed and a FIFO does not block the reader; both are refused naming the path.
    #[test]
    fn a_file_swapped_after_listing_is_refused_not_followed() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let secret = dir.path().join("secret.key");
        std::fs::write(&secret, "KEY")?;
        let plain = dir.path().join("plain.nu");
        std::fs::write(&plain, "ok")?;
        assert_eq!(read_regular(&plain)?, b"ok");
        let link = dir.path().join("swapped.nu");
        std::os::unix::fs::symlink(&secret, &link)?;
        let e = read_regular(&link).err().ok_or("a symlink was followed")?.to_string();
        assert!(e.contains("swapped.nu") && e.contains("symbolic link"), "{e}");
        let fifo = dir.path().join("fifo.nu");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status()?.success());
        let e = read_regular(&fifo).err().ok_or("a FIFO was read")?.to_string();
        assert!(e.contains("fifo.nu") && e.contains("FIFO"), "{e}");
        Ok(())
    }
}
