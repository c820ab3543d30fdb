//! Helpers for controller tests and benchmarks: an embedded API server in a temp dir with
//! the CRDs installed, an in-process controller, simulated-provider inspection, and waiting
//! on conditions with deadlines (never bare sleeps).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use provisioning_providers::{Provider, ServerObservation};
use tokio_util::sync::CancellationToken;

use crate::config::ControllerConfig;

/// An embedded API server with the CRDs installed.
pub struct TestEnv {
    /// Temp dir holding the API server's data and the provider state.
    pub dir: tempfile_dir::Dir,
    /// The running API server.
    pub api: Option<provisioning_apiserver::RunningApiServer>,
    /// A client for it.
    pub client: Client,
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    /// Provider state directory (simulated stores).
    pub state_dir: PathBuf,
}

/// A temp directory removed on drop (tiny, to avoid a dev-dependency in the library).
pub mod tempfile_dir {
    use std::path::{Path, PathBuf};

    /// A directory deleted when dropped.
    pub struct Dir(PathBuf);

    impl Dir {
        /// Creates a fresh directory under the system temp dir.
        pub fn new(prefix: &str) -> std::io::Result<Self> {
            let path = std::env::temp_dir().join(format!("{prefix}-{}-{:08x}", std::process::id(), rand::random::<u32>()));
            std::fs::create_dir_all(&path)?;
            Ok(Dir(path))
        }
        /// The path.
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl TestEnv {
    /// Starts an API server on 127.0.0.1:0 in a fresh temp dir and installs the CRDs.
    pub async fn start() -> anyhow::Result<TestEnv> {
        crate::install_crypto_provider();
        if std::env::var_os("RUST_LOG").is_some() {
            let _ =
                tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
        }
        let dir = tempfile_dir::Dir::new("provisioning-test")?;
        let api = provisioning_apiserver::start(provisioning_apiserver::ApiServerConfig {
            data_dir: dir.path().join("api"),
            listen: "127.0.0.1:0".parse()?,
            limits: Default::default(),
        })
        .await?;
        let kubeconfig = api.kubeconfig_path();
        let client = crate::client::client_from_kubeconfig(&kubeconfig).await?;
        crate::client::install_crds(&client, Duration::from_secs(30)).await?;
        let state_dir = dir.path().join("providers");
        Ok(TestEnv { dir, api: Some(api), client, kubeconfig, state_dir })
    }

    /// A controller config for tests: provider state in the temp dir, short resync.
    pub fn config(&self) -> ControllerConfig {
        ControllerConfig { state_dir: self.state_dir.clone(), leader_election: false, ..ControllerConfig::default() }
    }

    /// Runs the controller in this process until the returned handle is stopped.
    pub fn start_controller(&self, config: ControllerConfig) -> ControllerHandle {
        let token = CancellationToken::new();
        let client = self.client.clone();
        let stop = token.clone();
        let task = tokio::spawn(async move { crate::run::run(client, config, async move { stop.cancelled().await }).await });
        ControllerHandle { token, task }
    }

    /// Runs the controller in this process with another identity's `client` (e.g. a
    /// ServiceAccount token bound by deploy/rbac) until the returned handle is stopped.
    pub fn start_controller_as(&self, client: Client, config: ControllerConfig) -> ControllerHandle {
        let token = CancellationToken::new();
        let stop = token.clone();
        let task = tokio::spawn(async move { crate::run::run(client, config, async move { stop.cancelled().await }).await });
        ControllerHandle { token, task }
    }

    /// The simulated provider of `account` (reads the same file-backed store).
    pub fn simulated(&self, account: &str) -> anyhow::Result<provisioning_providers::simulated::SimulatedProvider> {
        simulated(&self.state_dir, account)
    }

    /// Stops the API server.
    pub async fn shutdown(mut self) {
        if let Some(api) = self.api.take() {
            api.shutdown().await;
        }
    }
}

/// The simulated provider of `account` with state under `state_dir`.
pub fn simulated(state_dir: &Path, account: &str) -> anyhow::Result<provisioning_providers::simulated::SimulatedProvider> {
    let config = provisioning_providers::ProviderConfig {
        name: account.to_string(),
        provider_type: "simulated".into(),
        state_dir: state_dir.to_path_buf(),
        ..Default::default()
    };
    Ok(provisioning_providers::simulated::SimulatedProvider::open(&config)?)
}

/// The local (Docker) provider as the controller's default workspace builds it: to check
/// that nothing was created at the wrong provider.
pub fn local(state_dir: &Path) -> anyhow::Result<provisioning_providers::local::LocalProvider> {
    let config = provisioning_providers::ProviderConfig {
        name: "local".into(),
        provider_type: "local".into(),
        state_dir: state_dir.to_path_buf(),
        ..Default::default()
    };
    Ok(provisioning_providers::local::LocalProvider::new(&config)?)
}

/// Every machine of a simulated account in `namespace`.
pub async fn machines_in(provider: &dyn Provider, namespace: &str) -> anyhow::Result<Vec<ServerObservation>> {
    Ok(provider.list_servers(&[(provisioning_providers::tags::NAMESPACE.to_string(), namespace.to_string())]).await?)
}

/// An in-process controller.
pub struct ControllerHandle {
    token: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ControllerHandle {
    /// Stops it and waits (bounded) for it to finish.
    pub async fn stop(self) {
        self.token.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after `deadline`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if start.elapsed() > deadline {
            anyhow::bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Workspace manifest with one simulated account `sim`.
pub fn simulated_workspace(
    name: &str,
    latency_ms: u64,
    jitter_percent: u32,
    max_servers: u32,
    parallel_limit: u32,
) -> provisioning_crds::Workspace {
    let value = serde_json::json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": name},
        "spec": {
            "providers": [{"name": "sim", "type": "simulated",
                           "simulation": {"latencyMs": latency_ms, "jitterPercent": jitter_percent}}],
            "defaults": {"provider": "sim"},
            "limits": {"maxServers": max_servers, "parallelLimit": parallel_limit}
        }
    });
    #[allow(clippy::expect_used)]
    serde_json::from_value(value).expect("static workspace manifest")
}

/// A Server manifest.
pub fn server(namespace: &str, name: &str, spec: serde_json::Value) -> provisioning_crds::Server {
    let value = serde_json::json!({
        "apiVersion": "provisioning.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    });
    #[allow(clippy::expect_used)]
    serde_json::from_value(value).expect("server manifest")
}

/// Whether a Server's Ready condition is True.
pub fn is_ready(server: &provisioning_crds::Server) -> bool {
    server.status.as_ref().is_some_and(|s| crate::conditions::is_true(&s.conditions, "Ready"))
}

/// The status and message of condition `type_`.
pub fn condition(server: &provisioning_crds::Server, type_: &str) -> Option<(String, String)> {
    server.status.as_ref().and_then(|s| crate::conditions::find(&s.conditions, type_)).map(|c| (c.status.clone(), c.message.clone()))
}
