//! Shared helpers for the integration tests: a server in a temp dir, clients, kubectl.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use provisioning_apiserver::{ApiServerConfig, RunningApiServer};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

pub const FIXTURE_CRD: &str = include_str!("../fixtures/server-crd.yaml");

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub server: RunningApiServer,
}

pub async fn start() -> Result<TestServer, Box<dyn std::error::Error + Send + Sync>> {
    provisioning_apiserver::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let server = provisioning_apiserver::start(ApiServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse()?,
        limits: Default::default(),
    })
    .await?;
    Ok(TestServer { dir, server })
}

/// A server with these limits (tests of timeouts, caps and the Event TTL use small ones).
pub async fn start_with(limits: provisioning_apiserver::Limits) -> Result<TestServer, Box<dyn std::error::Error + Send + Sync>> {
    provisioning_apiserver::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let mut config = ApiServerConfig::new(dir.path().to_path_buf(), "127.0.0.1:0".parse()?);
    config.limits = limits;
    let server = provisioning_apiserver::start(config).await?;
    Ok(TestServer { dir, server })
}

/// A rustls client config trusting the test server's CA (for raw TLS connections).
pub fn tls_client_config(data_dir: &Path) -> Result<std::sync::Arc<rustls::ClientConfig>, Box<dyn std::error::Error + Send + Sync>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_file(data_dir.join("ca.crt"))?)?;
    Ok(std::sync::Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()))
}

/// A TLS connection to the server speaking HTTP/1.1 (ALPN), for requests written by hand.
pub async fn tls_connect(
    addr: std::net::SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Box<dyn std::error::Error + Send + Sync>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    Ok(connector.connect(name, tcp).await?)
}

/// The bearer token of the test server.
pub fn token(data_dir: &Path) -> Result<String, std::io::Error> {
    Ok(std::fs::read_to_string(data_dir.join("token"))?.trim().to_string())
}

pub async fn restart(ts: TestServer) -> Result<TestServer, Box<dyn std::error::Error + Send + Sync>> {
    let TestServer { dir, server } = ts;
    server.shutdown().await;
    let server = provisioning_apiserver::start(ApiServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse()?,
        limits: Default::default(),
    })
    .await?;
    Ok(TestServer { dir, server })
}

pub async fn client_for(kubeconfig: &Path) -> Result<Client, Box<dyn std::error::Error + Send + Sync>> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A client without kube-rs's retry of 429/503/504 (tests that expect those answers).
pub async fn client_no_retry(kubeconfig: &Path) -> Result<Client, Box<dyn std::error::Error + Send + Sync>> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

pub fn server_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", "Server"), "servers")
}

pub async fn install_crd(client: &Client) -> TestResult {
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml_ng::from_str(FIXTURE_CRD)?;
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    api.create(&PostParams::default(), &crd).await?;
    Ok(())
}

pub fn servers(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &server_resource())
}

pub fn server_obj(name: &str, plan: &str) -> Result<DynamicObject, serde_json::Error> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name}, "spec": {"plan": plan}
    }))
}

/// Polls `f` until it returns true or the deadline passes.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut f: F) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The kubectl binary: $PROVISIONING_KUBECTL or <workspace>/.tools/bin/kubectl. Panics (fails the
/// test) with a hint when missing: these tests never skip.
pub fn kubectl_path() -> PathBuf {
    if let Ok(p) = std::env::var("PROVISIONING_KUBECTL") {
        return PathBuf::from(p);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = manifest.canonicalize().unwrap_or_else(|_| manifest.to_path_buf());
    let root = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
    let p = root.join(".tools/bin/kubectl");
    assert!(p.exists(), "kubectl not found at {} (and PROVISIONING_KUBECTL unset): run scripts/setup.sh", p.display());
    p
}

pub struct KubectlOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs kubectl against the server (with a private cache dir), returning its output.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> KubectlOut {
    use std::io::Write;
    let cache = kubeconfig.parent().map(|p| p.join("kubectl-cache")).unwrap_or_default();
    let mut cmd = Command::new(kubectl_path());
    cmd.env("KUBECONFIG", kubeconfig).env("HOME", kubeconfig.parent().unwrap_or(Path::new("/tmp"))).arg("--cache-dir").arg(&cache);
    cmd.args(args);
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let Ok(mut child) = cmd.spawn() else {
        return KubectlOut { ok: false, stdout: String::new(), stderr: "spawn failed: run scripts/setup.sh".into() };
    };
    if let (Some(input), Some(mut si)) = (stdin, child.stdin.take()) {
        let _ = si.write_all(input.as_bytes());
    }
    match child.wait_with_output() {
        Ok(o) => KubectlOut {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        },
        Err(e) => KubectlOut { ok: false, stdout: String::new(), stderr: e.to_string() },
    }
}

/// A raw HTTPS client (reqwest-free): sends one request with curl-like semantics via kube's client.
pub async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(u16, serde_json::Value), Box<dyn std::error::Error + Send + Sync>> {
    let req = http::Request::builder().method(method).uri(path).header("content-type", content_type).body(body)?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    let status = resp.status().as_u16();
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await?.to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Ok((status, v))
}

/// The embedded API server as its own process (`apiserver-standalone`) on `dir`, returned once
/// it accepts connections (it prints its kubeconfig line then); the kubeconfig is `dir/kubeconfig`.
pub fn spawn_standalone(dir: &Path) -> Result<std::process::Child, Box<dyn std::error::Error + Send + Sync>> {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_apiserver-standalone"))
        .arg("--data-dir")
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    for line in std::io::BufReader::new(stdout).lines() {
        if line?.starts_with("kubeconfig:") {
            return Ok(child);
        }
    }
    Err("server exited before it was ready".into())
}
