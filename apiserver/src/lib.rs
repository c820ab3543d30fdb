//! Embedded control plane: a Kubernetes-compatible API server for one machine.
//!
//! Serves discovery, OpenAPI v3, built-in kinds (Namespace, Secret, ConfigMap, Event, Lease,
//! ServiceAccount, Service, Deployment, the RBAC kinds, PodDisruptionBudget, NetworkPolicy,
//! CustomResourceDefinition) and every resource defined by a stored CRD, over HTTPS with a
//! bearer token, backed by redb on disk (see [`storage`]).

pub mod apply;
pub mod auth;
pub mod backup;
pub mod builtin_cells;
pub mod builtin_schemas;
pub mod celrules;
pub mod default_service;
pub mod discovery;
pub mod error;
pub mod gc;
pub mod handlers;
pub mod limits;
pub mod list_body;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod registry;
pub mod scale;
pub mod selectors;
pub mod server;
pub mod stats;
pub mod storage;
pub mod strategic;
pub mod table;
pub mod tls;
pub mod urlpath;
pub mod validation;
pub mod watch;
pub mod wire;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;

pub use crate::handlers::Limits;
use crate::handlers::{Core, WriteOptions};

/// Where the server keeps its state, where it listens, and its limits.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Data directory: database, CA, serving certificate, token, kubeconfig.
    pub data_dir: PathBuf,
    /// Listen address; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Event TTL, connection and watch limits, timeouts (kube-apiserver's defaults).
    pub limits: Limits,
}

impl ApiServerConfig {
    /// A configuration with the default limits.
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> Self {
        ApiServerConfig { data_dir, listen, limits: Limits::default() }
    }
}

/// Parses a duration as kube-apiserver flags write them: `1h`, `30m`, `90s`, `1h30m`, or
/// plain seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<std::time::Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(secs));
    }
    let mut total = 0u64;
    let mut num = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().map_err(|_| anyhow::anyhow!("invalid duration {s:?}: expected e.g. 1h, 30m, 90s"))?;
        num.clear();
        total += n * match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => anyhow::bail!("invalid duration {s:?}: unknown unit {c:?} (use h, m or s)"),
        };
    }
    if !num.is_empty() || total == 0 {
        anyhow::bail!("invalid duration {s:?}: expected e.g. 1h, 30m, 90s");
    }
    Ok(std::time::Duration::from_secs(total))
}

/// A started server.
pub struct RunningApiServer {
    addr: SocketAddr,
    kubeconfig: PathBuf,
    core: Arc<Core>,
    server: JoinHandle<()>,
    gc: JoinHandle<()>,
    aggregation: JoinHandle<()>,
}

impl RunningApiServer {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `D/kubeconfig` (mode 0600): server URL, embedded CA and bearer token.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.kubeconfig.clone()
    }

    /// The request and scan counters (see [`stats`]).
    pub fn stats(&self) -> Arc<stats::Stats> {
        self.core.stats.clone()
    }

    /// Makes the storage writer fail, as a disk error would. Only for tests of /readyz and
    /// of the 503 answered to writes.
    #[doc(hidden)]
    pub fn fail_storage_for_test(&self) {
        self.core.store.fail_writer_for_test();
    }

    /// Stops accepting requests, ends watches, waits for in-flight requests and closes storage.
    pub async fn shutdown(self) {
        self.core.shutdown.cancel();
        let _ = self.server.await;
        let _ = self.gc.await;
        let _ = self.aggregation.await;
        let store = self.core.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
    }
}

/// Installs the process-wide rustls crypto provider (aws-lc-rs); a no-op when one is installed.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Starts the server: opens storage under `data_dir`, generates credentials on first start,
/// writes the kubeconfig and begins serving.
pub async fn start(config: ApiServerConfig) -> anyhow::Result<RunningApiServer> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| format!("creating {}", config.data_dir.display()))?;
    std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o700))?;
    let listener = tokio::net::TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    let dir = config.data_dir.clone();
    let creds = tokio::task::spawn_blocking(move || tls::load_or_create(&dir, addr)).await??;
    let db_path = config.data_dir.join("state.redb");
    let store = tokio::task::spawn_blocking(move || storage::Store::open(&db_path)).await??;
    let core = Core::with_limits(store, config.limits.clone());
    let reg = core.registry();
    if let Some(ns_rt) = reg.get("", "v1", "namespaces") {
        let opts = WriteOptions { field_manager: "provisioning-apiserver".into(), ..Default::default() };
        for ns in gc::default_namespaces() {
            let name = ns["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if core.get(&ns_rt, None, &name).is_err()
                && let Err(e) = core.create(&ns_rt, None, ns, &opts).await
                && e.code != 409
            {
                anyhow::bail!("creating namespace {name}: {e}");
            }
        }
    }
    default_service::ensure(&core, addr).await?;
    auth::bootstrap::ensure(&*core).await?;
    auth::bootstrap::aggregate_once(&*core).await;
    let dir = config.data_dir.clone();
    let signer = tokio::task::spawn_blocking(move || auth::tokens::Signer::load_or_create(&dir, auth::tokens::DEFAULT_ISSUER)).await??;
    let kubeconfig = tls::write_kubeconfig(&config.data_dir, addr, &creds)?;
    let authn = Arc::new(auth::Auth::new(&creds.token, signer).with_max_token_expiration(config.limits.max_token_expiration));
    let server = tokio::spawn(server::serve(core.clone(), listener, creds.server_config.clone(), authn));
    let gc = tokio::spawn(gc::run(core.clone()));
    let aggregation = tokio::spawn(auth::bootstrap::run_aggregation(core.clone(), core.shutdown.clone()));
    Ok(RunningApiServer { addr, kubeconfig, core, server, gc, aggregation })
}

/// Runs the server until Ctrl-C, printing where it listens and the kubeconfig path.
pub async fn run_cli(data_dir: PathBuf, listen: SocketAddr) -> anyhow::Result<()> {
    run_cli_with(ApiServerConfig::new(data_dir, listen)).await
}

/// [`run_cli`] with a full configuration (e.g. `--event-ttl`).
pub async fn run_cli_with(config: ApiServerConfig) -> anyhow::Result<()> {
    install_crypto_provider();
    let running = start(config).await?;
    // A closed stdout (a parent that stopped reading) must not take the server down: println!
    // would panic on EPIPE, so the lines are written and errors ignored.
    let kubeconfig = running.kubeconfig_path();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "apiserver listening on https://{}", tls::client_host(running.addr()));
    let _ = writeln!(out, "kubeconfig: {}", kubeconfig.display());
    let _ = writeln!(out, "try: KUBECONFIG={} kubectl api-resources", kubeconfig.display());
    let _ = out.flush();
    drop(out);
    tokio::signal::ctrl_c().await?;
    running.shutdown().await;
    Ok(())
}
