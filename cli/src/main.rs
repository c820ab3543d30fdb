//! `provisioning`: the command-line entry point.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use provisioning_cli::dev;
use provisioning_controller::config::ControllerConfig;

/// Infrastructure as code the Kubernetes way.
#[derive(Parser)]
#[command(name = "provisioning", version, about)]
struct Cli {
    /// Log format: text or json.
    #[arg(long, global = true, env = "PROVISIONING_LOG_FORMAT", default_value = "text")]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Embedded control plane + controller in one process; applies manifests and shows progress.
    Dev(DevArgs),
    /// The embedded control plane alone.
    Apiserver {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: SocketAddr,
        /// How long Events are kept after their last update (e.g. 1h, 30m, 90s).
        #[arg(long, default_value = "1h", value_parser = provisioning_apiserver::parse_duration)]
        event_ttl: Duration,
        /// The longest lifetime of a ServiceAccount token from the TokenRequest API; longer
        /// requests are shortened to it (kube-apiserver's flag of the same name).
        #[arg(long, default_value = "48h", value_parser = provisioning_apiserver::parse_duration)]
        service_account_max_token_expiration: Duration,
        #[command(flatten)]
        limits: ApiLimitArgs,
    },
    /// The controller against any API server (KUBECONFIG, --kubeconfig, or in-cluster).
    Controller(ControllerArgs),
    /// An object and everything it owns as a tree (Workspace → Clusters → pools → Servers →
    /// TaskServs per server), with READY, STATUS, AGE and the message that explains the state.
    Trace {
        /// KIND/NAME: workspace/NAME, cluster/NAME, server/NAME or taskserv/NAME (short names work).
        object: String,
        /// Namespace (default: the kubeconfig context's); ignored for a Workspace.
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Redraw whenever something in the tree changes (Ctrl-C to stop).
        #[arg(short = 'w', long)]
        watch: bool,
        /// Output: wide (adds the Cluster's running and next steps) or json.
        #[arg(short = 'o', long, default_value = "")]
        output: String,
        /// Kubeconfig file; default: $KUBECONFIG (merged, as kubectl does), ~/.kube/config,
        /// then in-cluster config.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Kubeconfig context (default: the current one).
        #[arg(long)]
        context: Option<String>,
    },
    /// Prints a new one-time sign-in link for the web console of a running `provisioning dev`
    /// (when the first link was used, or in another browser).
    LoginLink {
        /// Data directory of `provisioning dev`.
        #[arg(long, default_value = ".data")]
        data_dir: PathBuf,
    },
    /// The audit log: every provider call and script run, oldest first.
    Audit {
        /// Data directory of `provisioning dev` (its log is in D/providers/audit), or a
        /// controller's state directory (D/audit).
        #[arg(long, default_value = ".data")]
        data_dir: PathBuf,
        /// Only entries about this object: KIND/NAMESPACE/NAME (KIND/NAME for a Workspace);
        /// a Server also shows the scripts run on it.
        #[arg(long)]
        object: Option<String>,
        /// Only entries of the last DURATION (e.g. 30m, 2h, 90s).
        #[arg(long, value_parser = provisioning_apiserver::parse_duration)]
        since: Option<Duration>,
        /// Output: table (default) or json (one entry per line, as stored).
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// A consistent snapshot of the embedded control plane (every object at one revision, plus
    /// the CA, its key, the ServiceAccount signing key and the admin token) into FILE, mode
    /// 0600: it holds every Secret. Taken from the running server (GET /backup with D's admin
    /// kubeconfig) or, when none runs on D, from D's database file.
    Backup {
        /// Data directory of `provisioning dev` or `provisioning apiserver`.
        #[arg(long, default_value = ".data")]
        data_dir: PathBuf,
        /// The backup file to write.
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
    /// Rebuilds a data dir from a backup (verified first: a corrupt or truncated file is
    /// refused). The restored server starts at the backup's revision + 1e9, so clients that
    /// saw a newer resourceVersion relist (410 Gone) instead of missing changes.
    Restore {
        /// The backup file.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The data directory to create (must be missing or empty unless --force).
        #[arg(long)]
        data_dir: PathBuf,
        /// Restore over a non-empty data dir: it is moved aside to D.before-restore-<time>.
        #[arg(long)]
        force: bool,
    },
    /// What applying manifests would change, against the current cluster; changes nothing.
    /// Exit 0: no changes, 2: changes, 1: error.
    Plan {
        /// Manifest files or directories (repeatable).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Output: json, or nothing for text.
        #[arg(short = 'o', long, default_value = "")]
        output: String,
        /// Kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster config.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Kubeconfig context (default: the current one).
        #[arg(long)]
        context: Option<String>,
    },
    /// Stores every object of the group's CRDs at its storage version (each read and written
    /// back unchanged), then sets each CRD's status.storedVersions to the storage version alone,
    /// so that a later release may stop serving an older version. Run it after an upgrade that
    /// changed a storage version (docs/upgrade.md); safe to repeat.
    MigrateStorage {
        /// API group whose CRDs are migrated.
        #[arg(long, default_value = provisioning_crds::GROUP)]
        group: String,
        /// Kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster config.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Kubeconfig context (default: the current one).
        #[arg(long)]
        context: Option<String>,
    },
    /// Prints all CRDs as YAML.
    Crds,
    /// The local provider's node image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// The taskserv catalog.
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
    /// Cluster templates: the topologies users start from, rendered into manifests.
    Template {
        #[command(subcommand)]
        command: TemplateCommand,
    },
    /// A throwaway test environment: creates SERVICE (a one-server Cluster) or TEMPLATE on the
    /// local provider in a generated namespace, waits for Ready and healthy, runs every
    /// service's check, reports, and removes everything (also on failure and Ctrl-C).
    /// Exit 0 when every check passed.
    Test(TestArgs),
}

/// The embedded API server's per-user and per-peer limits (`apiserver` and `dev`); each
/// unset one keeps its default (docs/limits-note.md).
#[derive(clap::Args)]
struct ApiLimitArgs {
    /// Watches without timeoutSeconds end after a random 1x-2x of this; a client's longer
    /// timeoutSeconds is cut to 2x (kube-apiserver's flag of the same name; default 30m).
    #[arg(long, value_parser = provisioning_apiserver::parse_duration)]
    min_request_timeout: Option<Duration>,
    /// Requests in flight (not watches) of all non-exempt users together (default 400).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_requests_inflight: Option<u64>,
    /// Requests in flight (not watches) of one user (default 100); beyond: 429.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_requests_inflight_per_user: Option<u64>,
    /// Open watches of all non-exempt users together (default 10000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_watches: Option<u64>,
    /// Open watches of one user (default 500); beyond: 429.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_watches_per_user: Option<u64>,
    /// Open connections from one peer address (default 1024).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections_per_peer: Option<u64>,
    /// A user never refused by the per-user caps (repeatable; replaces the default, the
    /// controller's ServiceAccount; system:masters is always exempt).
    #[arg(long = "limits-exempt-user")]
    exempt_users: Vec<String>,
}

impl ApiLimitArgs {
    fn apply(&self, limits: &mut provisioning_apiserver::Limits) {
        let set = |v: Option<u64>, to: &mut usize| *to = v.map_or(*to, |n| usize::try_from(n).unwrap_or(usize::MAX));
        limits.min_request_timeout = self.min_request_timeout.unwrap_or(limits.min_request_timeout);
        set(self.max_requests_inflight, &mut limits.max_requests_in_flight);
        set(self.max_requests_inflight_per_user, &mut limits.max_requests_in_flight_per_user);
        set(self.max_watches, &mut limits.max_watches);
        set(self.max_watches_per_user, &mut limits.max_watches_per_user);
        set(self.max_connections_per_peer, &mut limits.max_connections_per_peer);
        if !self.exempt_users.is_empty() {
            limits.exempt_users = self.exempt_users.clone();
        }
    }
}

/// `provisioning dev`'s arguments.
#[derive(clap::Args)]
struct DevArgs {
    /// Data directory (database, CA, kubeconfig, provider state).
    #[arg(long, default_value = ".data")]
    data_dir: PathBuf,
    /// API server listen address.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Manifest file or directory to apply (repeatable).
    #[arg(long)]
    apply: Vec<PathBuf>,
    /// Exit 0 once every applied resource is Ready (non-zero after --timeout).
    #[arg(long)]
    exit_when_ready: bool,
    /// Seconds to wait with --exit-when-ready.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Controller config file (TOML).
    #[arg(long)]
    config: Option<PathBuf>,
    /// How long Events are kept after their last update (e.g. 1h, 30m, 90s).
    #[arg(long, default_value = "1h", value_parser = provisioning_apiserver::parse_duration)]
    event_ttl: Duration,
    /// Accept plain-http provider endpoints (local emulators only; credentials travel unencrypted).
    #[arg(long)]
    allow_insecure_endpoints: bool,
    /// Web console listen address (HTTPS; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    console_addr: SocketAddr,
    /// Do not serve the web console.
    #[arg(long)]
    no_console: bool,
    #[command(flatten)]
    limits: ApiLimitArgs,
}

/// `provisioning controller`'s arguments.
#[derive(clap::Args)]
struct ControllerArgs {
    /// Kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Controller config file (TOML).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serve /metrics, /healthz, /readyz here (overrides the config file).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Directory for provider state (overrides the config file).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Do not take the leader Lease (single replica only).
    #[arg(long)]
    no_leader_election: bool,
    /// Accept plain-http provider endpoints (local emulators only; credentials travel unencrypted).
    #[arg(long)]
    allow_insecure_endpoints: bool,
    #[command(flatten)]
    console: ConsoleArgs,
}

/// `provisioning test`'s arguments.
#[derive(clap::Args)]
struct TestArgs {
    /// A catalog service (e.g. redis) or a Cluster template (e.g. etcd_cluster).
    target: String,
    /// Template parameter NAME=VALUE (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    sets: Vec<String>,
    /// Leave everything in place (and the embedded control plane's data dir).
    #[arg(long)]
    keep: bool,
    /// Write JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Limit for reaching Ready and healthy (e.g. 10m, 300s).
    #[arg(long, default_value = "15m", value_parser = provisioning_apiserver::parse_duration)]
    timeout: Duration,
    /// Use this API server and the controller serving it instead of embedded ones.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Controller config file (TOML; e.g. user catalogs).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum TemplateCommand {
    /// Lists the templates with their parameters (type, default).
    List,
    /// Renders a template into manifests (Namespace, Workspace where needed, Cluster).
    Render {
        /// Template name.
        name: String,
        /// Parameter NAME=VALUE (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        sets: Vec<String>,
        /// Namespace of the rendered objects (default: the template's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Write to this file instead of stdout.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        /// Controller config file whose user catalogs the manifests are checked against.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// The controller's web console (off unless `--console-addr` is given).
#[derive(clap::Args)]
struct ConsoleArgs {
    /// Serve the web console here (HTTPS; visitors sign in with their own bearer token).
    #[arg(long)]
    console_addr: Option<SocketAddr>,
    /// The console's certificate chain (PEM); default: a self-signed one generated at start.
    #[arg(long, requires = "console_key")]
    console_cert: Option<PathBuf>,
    /// The console certificate's private key (PEM).
    #[arg(long, requires = "console_cert")]
    console_key: Option<PathBuf>,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Builds the local provider's node image.
    Build {
        /// Rebuild even when the image exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum CatalogCommand {
    /// Lists services with versions, dependencies and where each comes from.
    List {
        /// Controller config file: its `catalogs` are merged after the built-in catalog.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Shows one service.
    Show {
        /// Service name.
        name: String,
        /// Controller config file: its `catalogs` are merged after the built-in catalog.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn init_logging(format: &str, default_level: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colour codes only for a person at a terminal, never in a file or a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<ControllerConfig> {
    Ok(match path {
        Some(p) => ControllerConfig::load(p)?,
        None => ControllerConfig::default(),
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let log_format = cli.log_format.as_str();
    match cli.command {
        Command::Dev(args) => {
            init_logging(log_format, "warn");
            dev(args).await
        }
        Command::Apiserver { data_dir, listen, event_ttl, service_account_max_token_expiration, limits } => {
            init_logging(log_format, "info");
            let mut api = provisioning_apiserver::ApiServerConfig::new(data_dir, listen);
            limits.apply(&mut api.limits);
            api.limits.event_ttl = event_ttl;
            api.limits.max_token_expiration = service_account_max_token_expiration;
            provisioning_apiserver::run_cli_with(api).await?;
            Ok(0)
        }
        Command::Controller(args) => {
            init_logging(log_format, "info");
            controller(args).await?;
            Ok(0)
        }
        Command::Trace { object, namespace, watch, output, kubeconfig, context } => {
            init_logging(log_format, "warn");
            trace(&object, namespace, watch, &output, kubeconfig, context).await?;
            Ok(0)
        }
        Command::LoginLink { data_dir } => {
            println!("{}", provisioning_cli::console::login_codes::issue(&data_dir)?);
            Ok(0)
        }
        Command::Audit { data_dir, object, since, output } => {
            provisioning_cli::audit::run(&data_dir, object, since, &output)?;
            Ok(0)
        }
        Command::Backup { data_dir, output } => {
            let (revision, objects, source) = provisioning_cli::backup::run_backup(&data_dir, &output).await?;
            let from = match source {
                provisioning_cli::backup::Source::Server => "the running server",
                provisioning_cli::backup::Source::File => "the database file",
            };
            println!(
                "backup of revision {revision} ({objects} objects, from {from}) written to {} (mode 0600: it holds every Secret and the CA and signing keys)",
                output.display()
            );
            Ok(0)
        }
        Command::Restore { file, data_dir, force } => {
            let (backup, done) = provisioning_cli::backup::run_restore(&file, &data_dir, force)?;
            if let Some(aside) = &done.moved_aside {
                println!("moved the previous data dir aside to {}", aside.display());
            }
            println!(
                "restored {} objects of revision {} into {}; the server starts at revision {} (older resourceVersions get 410 Gone: clients relist)",
                backup.objects.len(),
                backup.revision,
                data_dir.display(),
                done.revision
            );
            Ok(0)
        }
        Command::Plan { files, output, kubeconfig, context } => {
            init_logging(log_format, "warn");
            let (client, namespace) = provisioning_cli::plan::client(kubeconfig, context).await?;
            provisioning_cli::plan::run(client, &files, &namespace, &output).await
        }
        Command::MigrateStorage { group, kubeconfig, context } => {
            init_logging(log_format, "warn");
            let (client, _) = provisioning_cli::plan::client(kubeconfig, context).await?;
            provisioning_cli::migrate::run(&client, &group).await?;
            Ok(0)
        }
        Command::Crds => {
            print!("{}", provisioning_crds::crds_yaml()?);
            Ok(0)
        }
        Command::Image { command: ImageCommand::Build { force } } => {
            init_logging(log_format, "info");
            image_build(force).await?;
            Ok(0)
        }
        Command::Catalog { command } => {
            catalog(command)?;
            Ok(0)
        }
        Command::Template { command } => {
            template(command)?;
            Ok(0)
        }
        Command::Test(args) => {
            // The embedded API server stops before the controller's last watches notice:
            // kube's connect errors at that moment are noise (our own calls report theirs).
            init_logging(log_format, "warn,kube_client::client::builder=off");
            let TestArgs { target, sets, keep, junit, timeout, kubeconfig, config } = args;
            let config = load_config(config.as_ref())?;
            let opts = provisioning_cli::test_command::TestOptions { target, sets, keep, junit, timeout, kubeconfig, config };
            provisioning_cli::test_command::run_test(opts).await
        }
    }
}

/// `provisioning dev`.
async fn dev(args: DevArgs) -> anyhow::Result<i32> {
    let DevArgs {
        data_dir,
        listen,
        apply,
        exit_when_ready,
        timeout,
        config,
        event_ttl,
        allow_insecure_endpoints,
        console_addr,
        no_console,
        limits,
    } = args;
    let mut api_limits = provisioning_apiserver::Limits::default();
    limits.apply(&mut api_limits);
    let mut config = load_config(config.as_ref())?;
    config.allow_insecure_endpoints |= allow_insecure_endpoints;
    // A broken user catalog stops start-up here, before anything is served.
    config.load_catalog()?;
    dev::run_dev(dev::DevOptions {
        data_dir,
        listen,
        apply,
        exit_when_ready,
        timeout: Duration::from_secs(timeout),
        config,
        event_ttl,
        console_addr: (!no_console).then_some(console_addr),
        api_limits,
    })
    .await
}

/// `provisioning controller`: the configuration from the file and the flags, the API server
/// from the kubeconfig (or in-cluster), the web console when asked for; runs until a signal.
async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let ControllerArgs { kubeconfig, config, metrics_addr, state_dir, no_leader_election, allow_insecure_endpoints, console } = args;
    let mut config = load_config(config.as_ref())?;
    config.allow_insecure_endpoints |= allow_insecure_endpoints;
    config.load_catalog()?;
    if metrics_addr.is_some() {
        config.metrics_addr = metrics_addr;
    }
    if let Some(dir) = state_dir {
        config.state_dir = dir;
    }
    if no_leader_election {
        config.leader_election = false;
    }
    if let Ok(ns) = std::env::var("POD_NAMESPACE") {
        config.lease_namespace = ns;
    }
    let api = match kubeconfig.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await.context("no kubeconfig and no in-cluster config")?,
    };
    if let Some(listen) = console.console_addr {
        let cert = match (console.console_cert, console.console_key) {
            (Some(cert), Some(key)) => provisioning_cli::console::CertSource::Files { cert, key },
            _ => provisioning_cli::console::CertSource::SelfSigned,
        };
        let opts = provisioning_cli::console::ConsoleOptions { listen, cert, api: api.clone(), dev: None };
        let running = provisioning_cli::console::start(opts, Default::default()).await?;
        tracing::info!(url = %running.url(), "serving the web console");
    }
    let client = provisioning_controller::client::client_from_config(api)?;
    provisioning_controller::run::run(client, config, shutdown_signal()).await
}

/// `provisioning image build`: the local provider's node image, progress on stderr, its tag
/// on stdout.
async fn image_build(force: bool) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let printer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            eprintln!("{line}");
        }
    });
    let opts = provisioning_providers::local::image::NodeImageOptions { force, progress: Some(tx), ..Default::default() };
    let result = provisioning_providers::local::image::build_node_image(&opts).await;
    drop(opts);
    let _ = printer.await;
    let tag = result?;
    println!("{tag}");
    Ok(())
}

/// `provisioning template list|render`.
fn template(command: TemplateCommand) -> anyhow::Result<()> {
    use provisioning_cli::template;
    let library = template::default_library()?;
    match command {
        TemplateCommand::List => print!("{}", template::list_table(&library)),
        TemplateCommand::Render { name, sets, namespace, output, config } => {
            let catalog = load_config(config.as_ref())?.load_catalog()?;
            let rendered = template::render(&library, &catalog, &name, &sets, namespace.as_deref())?;
            template::write_output(output.as_ref(), &rendered.yaml)?;
        }
    }
    Ok(())
}

/// `provisioning trace`: kubeconfig as kubectl reads it (`--kubeconfig`, else `$KUBECONFIG`
/// merged, else `~/.kube/config`, else in-cluster).
async fn trace(
    object: &str,
    namespace: Option<String>,
    watch: bool,
    output: &str,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
) -> anyhow::Result<()> {
    let root = provisioning_cli::trace::Root::parse(object)?;
    let format = provisioning_cli::trace::Format::parse(output)?;
    let (client, default_namespace) = provisioning_cli::plan::client(kubeconfig, context).await?;
    let namespace = namespace.unwrap_or(default_namespace);
    provisioning_cli::trace::run(client, root, namespace, format, watch).await?;
    Ok(())
}

/// `provisioning catalog list|show`.
fn catalog(command: CatalogCommand) -> anyhow::Result<()> {
    let config = match &command {
        CatalogCommand::List { config } | CatalogCommand::Show { config, .. } => config.clone(),
    };
    let catalog = load_config(config.as_ref())?.load_catalog()?;
    match command {
        CatalogCommand::List { .. } => print!("{}", provisioning_cli::catalog::table(&catalog)),
        CatalogCommand::Show { name, .. } => provisioning_cli::catalog::show(&catalog, &name)?,
    }
    Ok(())
}

fn main() -> ExitCode {
    provisioning_controller::install_crypto_provider();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
