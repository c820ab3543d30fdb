//! `provisioning dev`: the embedded control plane and the controller in one process, plus
//! manifest application (server-side apply of manifest files, also used by `plan` and
//! `test`) and live progress.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use provisioning_controller::client::{client_from_kubeconfig, install_crds};
use provisioning_controller::config::ControllerConfig;

/// Field manager of `provisioning dev --apply` (like kubectl's `kubectl`).
pub const APPLY_MANAGER: &str = "provisioning-dev";

/// One document of a manifest file.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// Where it came from (for messages).
    pub source: String,
    /// The object.
    pub object: Value,
}

/// Reads manifest files (multi-document YAML or JSON; `kind: List` expanded); directories
/// are read recursively in name order.
pub fn read_manifests(paths: &[PathBuf]) -> anyhow::Result<Vec<Manifest>> {
    let mut files = Vec::new();
    for path in paths {
        collect_files(path, &mut files)?;
    }
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let values = provisioning_yaml::documents::<Value>(&text)
            .map_err(|e| anyhow::anyhow!("{}: document {} is not valid YAML: {}", file.display(), e.index, e.error))?;
        for (i, value) in values.into_iter().enumerate() {
            let source = format!("{}#{}", file.display(), i + 1);
            push_object(value, &source, &mut out)?;
        }
    }
    Ok(out)
}

fn push_object(value: Value, source: &str, out: &mut Vec<Manifest>) -> anyhow::Result<()> {
    if value.is_null() {
        return Ok(());
    }
    if value.get("kind").and_then(Value::as_str) == Some("List") {
        for item in value.get("items").and_then(Value::as_array).cloned().unwrap_or_default() {
            push_object(item, source, out)?;
        }
        return Ok(());
    }
    if value.get("apiVersion").and_then(Value::as_str).is_none() || value.get("kind").and_then(Value::as_str).is_none() {
        bail!("{source}: an object needs apiVersion and kind");
    }
    if value.pointer("/metadata/name").and_then(Value::as_str).is_none() {
        bail!("{source}: metadata.name is required");
    }
    out.push(Manifest { source: source.to_string(), object: value });
    Ok(())
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for entry in entries {
            let is_manifest = entry.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if entry.is_dir() || is_manifest {
                collect_files(&entry, out)?;
            }
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// An object `apply_manifests` applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Applied {
    /// Kind.
    pub kind: String,
    /// Namespace, for namespaced kinds.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// API resource (for reading it back).
    pub resource: ApiResourceKey,
}

/// The parts of an ApiResource needed to read an object back.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiResourceKey {
    /// Group.
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural.
    pub plural: String,
    /// Namespaced.
    pub namespaced: bool,
}

impl ApiResourceKey {
    fn api_resource(&self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(&self.group, &self.version, &self.kind);
        ApiResource::from_gvk_with_plural(&gvk, &self.plural)
    }
}

fn apply_order(kind: &str) -> u8 {
    match kind {
        "Namespace" => 0,
        "CustomResourceDefinition" => 1,
        // Before Secrets: a Workspace creates the namespace its credentials Secret lives in.
        "Workspace" => 2,
        "Secret" | "ConfigMap" | "ServiceAccount" => 3,
        _ => 4,
    }
}

/// Server-side applies `manifests` (namespaced objects without a namespace go to
/// `default`). Retries objects whose namespace does not exist yet (a Workspace creates it)
/// until `timeout`.
pub async fn apply_manifests(client: &Client, manifests: &[Manifest], timeout: Duration) -> anyhow::Result<Vec<Applied>> {
    let discovery = Discovery::new(client.clone()).run().await.context("API discovery")?;
    let mut sorted: Vec<&Manifest> = manifests.iter().collect();
    sorted.sort_by_key(|m| apply_order(m.object.get("kind").and_then(Value::as_str).unwrap_or("")));
    // Strict, as `kubectl apply`: a misspelt field is refused, not dropped.
    let params = PatchParams::apply(APPLY_MANAGER).force().validation_strict();
    let deadline = Instant::now() + timeout;
    let mut applied = Vec::new();
    for manifest in sorted {
        let obj: DynamicObject = serde_json::from_value(manifest.object.clone()).with_context(|| manifest.source.clone())?;
        let types = obj.types.clone().unwrap_or_default();
        let gvk = GroupVersionKind::try_from(&types).with_context(|| manifest.source.clone())?;
        let Some((resource, caps)) = discovery.resolve_gvk(&gvk) else {
            bail!("{}: the server does not serve {}/{}", manifest.source, types.api_version, types.kind);
        };
        let name = obj.name_any();
        let namespaced = caps.scope == Scope::Namespaced;
        let namespace = namespaced.then(|| obj.metadata.namespace.clone().unwrap_or_else(|| "default".into()));
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let mut body = manifest.object.clone();
        if let (Some(ns), Some(meta)) = (&namespace, body.get_mut("metadata").and_then(Value::as_object_mut)) {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        }
        loop {
            match api.patch(&name, &params, &Patch::Apply(&body)).await {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 404 && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(anyhow::anyhow!("{}: {} {name} refused: {e}", manifest.source, types.kind)),
            }
        }
        applied.push(Applied {
            kind: types.kind.clone(),
            namespace,
            name,
            resource: ApiResourceKey {
                group: resource.group.clone(),
                version: resource.version.clone(),
                kind: resource.kind.clone(),
                plural: resource.plural.clone(),
                namespaced,
            },
        });
    }
    Ok(applied)
}

/// One progress line's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// `Kind/namespace/name`.
    pub what: String,
    /// status.phase.
    pub phase: String,
    /// Ready condition status (`-` for kinds without conditions).
    pub ready: String,
    /// The Ready condition's message (the blocking reason).
    pub message: String,
}

impl Progress {
    /// Whether the object counts as done (Ready=True, or a kind without conditions).
    pub fn is_done(&self) -> bool {
        self.ready == "True" || self.ready == "-"
    }
}

/// Reads the current progress of every applied object (one list per kind).
pub async fn progress(client: &Client, applied: &[Applied]) -> anyhow::Result<Vec<Progress>> {
    let mut by_resource: BTreeMap<&ApiResourceKey, Vec<&Applied>> = BTreeMap::new();
    for a in applied {
        by_resource.entry(&a.resource).or_default().push(a);
    }
    let mut out = Vec::new();
    for (resource, objects) in by_resource {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource.api_resource());
        let list = api.list(&ListParams::default()).await?;
        let found: HashMap<(Option<String>, String), &DynamicObject> =
            list.items.iter().map(|o| ((o.metadata.namespace.clone(), o.name_any()), o)).collect();
        for a in objects {
            let what = match &a.namespace {
                Some(ns) => format!("{}/{ns}/{}", a.kind, a.name),
                None => format!("{}/{}", a.kind, a.name),
            };
            let Some(obj) = found.get(&(a.namespace.clone(), a.name.clone())) else {
                out.push(Progress { what, phase: "Deleted".into(), ready: "False".into(), message: "not found".into() });
                continue;
            };
            let status = obj.data.get("status");
            let phase = status.and_then(|s| s.get("phase")).and_then(Value::as_str).unwrap_or("-").to_string();
            let conditions = status.and_then(|s| s.get("conditions")).and_then(Value::as_array);
            let has_conditions = resource.group == provisioning_crds::GROUP;
            let ready_condition = conditions.and_then(|cs| cs.iter().find(|c| c.get("type").and_then(Value::as_str) == Some("Ready")));
            let (ready, message) = match (has_conditions, ready_condition) {
                (false, _) => ("-".to_string(), String::new()),
                (true, None) => ("Unknown".to_string(), "waiting for the controller".to_string()),
                (true, Some(c)) => (
                    c.get("status").and_then(Value::as_str).unwrap_or("Unknown").to_string(),
                    c.get("message").and_then(Value::as_str).unwrap_or("").to_string(),
                ),
            };
            out.push(Progress { what, phase, ready, message });
        }
    }
    out.sort_by(|a, b| a.what.cmp(&b.what));
    Ok(out)
}

fn render(lines: &[Progress]) -> String {
    let width = lines.iter().map(|l| l.what.len()).max().unwrap_or(10).max(10);
    let mut out = String::new();
    for l in lines {
        let message = if l.ready == "True" { String::new() } else { l.message.clone() };
        out.push_str(&format!("{:<width$}  {:<12}  {:<7}  {}\n", l.what, l.phase, l.ready, message));
    }
    out
}

/// Options of `provisioning dev`.
#[derive(Clone, Debug)]
pub struct DevOptions {
    /// Data directory (database, kubeconfig, provider state).
    pub data_dir: PathBuf,
    /// API server listen address.
    pub listen: std::net::SocketAddr,
    /// Manifest files or directories to apply.
    pub apply: Vec<PathBuf>,
    /// Exit 0 once every applied resource is Ready.
    pub exit_when_ready: bool,
    /// With `exit_when_ready`: give up (exit 1) after this long.
    pub timeout: Duration,
    /// Controller configuration.
    pub config: ControllerConfig,
    /// How long the embedded API server keeps Events (`--event-ttl`).
    pub event_ttl: Duration,
    /// Where the web console listens (`None`: no console).
    pub console_addr: Option<std::net::SocketAddr>,
    /// The embedded API server's limits (`event_ttl` above wins over the one in here).
    pub api_limits: provisioning_apiserver::Limits,
}

/// Starts the web console with a certificate from the dev CA, writes its URL to
/// `<data-dir>/console-url` and returns a one-time sign-in link for the kubeconfig's admin token.
async fn start_console(
    data_dir: &Path,
    kubeconfig: &Path,
    addr: std::net::SocketAddr,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<String> {
    let kc = Kubeconfig::read_from(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let api = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let admin = api.auth_info.token.clone().context("the dev kubeconfig has no token")?;
    let dev = Some(crate::console::DevSignIn { data_dir: data_dir.to_path_buf(), admin: admin.clone() });
    let opts = crate::console::ConsoleOptions { listen: addr, cert: crate::console::CertSource::DevCa(data_dir.to_path_buf()), api, dev };
    let console = crate::console::start(opts, shutdown).await?;
    std::fs::write(data_dir.join("console-url"), format!("{}\n", console.url())).context("writing console-url")?;
    Ok(console.login_url(admin))
}

/// The ClusterRoles of deploy/rbac/aggregated-roles.yaml, so that the built-in `view`, `edit`
/// and `admin` roles cover our kinds under `provisioning dev` as on a cluster where deploy/ was
/// applied (server-side apply: re-running dev brings them back to the shipped version).
const AGGREGATED_ROLES: &str = include_str!("../../deploy/rbac/aggregated-roles.yaml");

async fn install_aggregated_roles(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let roles: Vec<ClusterRole> = provisioning_yaml::documents(AGGREGATED_ROLES).context("reading the aggregated roles")?;
    let api: kube::Api<ClusterRole> = kube::Api::all(client.clone());
    let params = kube::api::PatchParams::apply("provisioning-dev").force();
    for role in roles {
        let name = role.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &kube::api::Patch::Apply(&role)).await.with_context(|| format!("applying ClusterRole {name}"))?;
    }
    Ok(())
}

/// Runs `provisioning dev`; returns the process exit code.
pub async fn run_dev(opts: DevOptions) -> anyhow::Result<i32> {
    let mut api = provisioning_apiserver::ApiServerConfig::new(opts.data_dir.clone(), opts.listen);
    api.limits = opts.api_limits.clone();
    api.limits.event_ttl = opts.event_ttl;
    let running = provisioning_apiserver::start(api).await?;
    let kubeconfig = running.kubeconfig_path();
    let client = client_from_kubeconfig(&kubeconfig).await?;
    install_crds(&client, Duration::from_secs(30)).await?;
    install_aggregated_roles(&client).await?;

    let mut config = opts.config.clone();
    config.leader_election = false;
    if config.state_dir == ControllerConfig::default().state_dir {
        config.state_dir = opts.data_dir.join("providers");
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let controller = {
        let client = client.clone();
        let token = shutdown.clone();
        tokio::spawn(async move { provisioning_controller::run::run(client, config, async move { token.cancelled().await }).await })
    };

    let manifests = read_manifests(&opts.apply)?;
    let applied = apply_manifests(&client, &manifests, Duration::from_secs(60)).await?;
    let absolute = std::fs::canonicalize(&kubeconfig).unwrap_or(kubeconfig.clone());
    println!("API server: https://{}", running.addr());
    println!("export KUBECONFIG={}", absolute.display());
    if let Some(addr) = opts.console_addr {
        let login = start_console(&opts.data_dir, &kubeconfig, addr, shutdown.clone()).await?;
        println!("Console: {login}  (one-time sign-in link; `provisioning login-link` prints a new one)");
    }
    println!("applied {} object(s); Ctrl-C to stop", applied.len());

    let started = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let mut last: Vec<Progress> = Vec::new();
    let mut drawn_lines = 0usize;
    let code = loop {
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::select! {
            _ = ctrl_c => break 130,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let now = match progress(&client, &applied).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "reading progress");
                continue;
            }
        };
        if now != last {
            if tty {
                if drawn_lines > 0 {
                    print!("\x1b[{drawn_lines}A\x1b[J");
                }
                let text = render(&now);
                drawn_lines = text.lines().count();
                print!("{text}");
            } else {
                // One line per resource that changed, so logs stay readable.
                let changed: Vec<Progress> = now.iter().filter(|p| !last.contains(p)).cloned().collect();
                print!("{}", render(&changed));
            }
            last = now.clone();
        }
        if opts.exit_when_ready && !now.is_empty() && now.iter().all(Progress::is_done) {
            println!("all {} resource(s) Ready after {:.1}s", now.len(), started.elapsed().as_secs_f64());
            break 0;
        }
        if opts.exit_when_ready && started.elapsed() > opts.timeout {
            eprintln!("timed out after {:?}; not Ready:", opts.timeout);
            eprint!("{}", render(&now.into_iter().filter(|p| !p.is_done()).collect::<Vec<_>>()));
            break 1;
        }
    };
    shutdown.cancel();
    match tokio::time::timeout(Duration::from_secs(10), controller).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "controller stopped with an error"),
        Ok(_) => {}
        Err(_) => tracing::warn!("controller did not stop within 10 s"),
    }
    running.shutdown().await;
    Ok(code)
}
