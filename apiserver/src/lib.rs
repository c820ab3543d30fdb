//! Embedded control plane: a Kubernetes-compatible API server for one machine.
//!
//! Serves discovery, OpenAPI v3, built-in kinds (Namespace, Secret, ConfigMap, Event, Lease,
//! ServiceAccount, Service, Deployment, the RBAC kinds, PodDisruptionBudget, NetworkPolicy,
//! CustomResourceDefinition) and every resource defined by a stored CRD, over HTTPS with a
//! bearer token, backed by redb on disk (see [`storage`]).

pub mod apply;
pub mod builtin_cells;
pub mod builtin_schemas;
pub mod celrules;
pub mod error;
pub mod gc;
pub mod handlers;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod registry;
pub mod selectors;
pub mod server;
pub mod storage;
pub mod strategic;
pub mod table;
pub mod tls;
pub mod validation;
pub mod watch;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;

use crate::handlers::{Core, WriteOptions};

/// Where the server keeps its state and where it listens.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Data directory: database, CA, serving certificate, token, kubeconfig.
    pub data_dir: PathBuf,
    /// Listen address; port 0 picks a free port.
    pub listen: SocketAddr,
}

/// A started server.
pub struct RunningApiServer {
    addr: SocketAddr,
    kubeconfig: PathBuf,
    core: Arc<Core>,
    server: JoinHandle<()>,
    gc: JoinHandle<()>,
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

    /// Stops accepting requests, ends watches, waits for in-flight requests and closes storage.
    pub async fn shutdown(self) {
        self.core.shutdown.cancel();
        let _ = self.server.await;
        let _ = self.gc.await;
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
    let core = Core::new(store);
    let reg = core.registry();
    if let Some(ns_rt) = reg.get("", "v1", "namespaces") {
        let opts = WriteOptions { field_manager: "provisioning-apiserver".into(), ..Default::default() };
        for ns in gc::default_namespaces() {
            let name = ns["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if core.get(&ns_rt, None, &name).is_err()
                && let Err(e) = core.create(&ns_rt, None, ns, &opts).await
                    && e.code != 409 {
                        anyhow::bail!("creating namespace {name}: {e}");
                    }
        }
    }
    let kubeconfig = tls::write_kubeconfig(&config.data_dir, addr, &creds)?;
    let token: Arc<str> = Arc::from(creds.token.as_str());
    let server = tokio::spawn(server::serve(core.clone(), listener, creds.server_config.clone(), token));
    let gc = tokio::spawn(gc::run(core.clone()));
    Ok(RunningApiServer { addr, kubeconfig, core, server, gc })
}

/// Runs the server until Ctrl-C, printing where it listens and the kubeconfig path.
pub async fn run_cli(data_dir: PathBuf, listen: SocketAddr) -> anyhow::Result<()> {
    install_crypto_provider();
    let running = start(ApiServerConfig { data_dir, listen }).await?;
    println!("apiserver listening on https://{}", tls::client_host(running.addr()));
    println!("kubeconfig: {}", running.kubeconfig_path().display());
    println!("try: KUBECONFIG={} kubectl api-resources", running.kubeconfig_path().display());
    tokio::signal::ctrl_c().await?;
    running.shutdown().await;
    Ok(())
}
