//! The controller's API client: a bound on requests in flight, a User-Agent naming the
//! controller, access metrics; and the installation of the project's CRDs (used by
//! `provisioning dev`, `provisioning test` and the tests' embedded control plane).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, ResourceExt};

/// Requests a client sends at once; more wait in its queue. kube's HTTP/1.1 client opens one
/// connection per request in flight, so without a bound a burst of reconciles opens
/// thousands of TLS connections (memory on both sides). Watches release their slot once
/// their response starts.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 32;

/// A client for `config` with at most [`MAX_REQUESTS_IN_FLIGHT`] requests in flight. Its
/// User-Agent names the controller: writes that carry no field manager of their own (the
/// kube-runtime finalizer helper's JSON patches) are recorded under the User-Agent's product,
/// `provisioning-controller`, as kube-apiserver does, instead of "unknown".
pub fn client_from_config(mut config: kube::Config) -> anyhow::Result<Client> {
    if !config.headers.iter().any(|(name, _)| name == hyper::header::USER_AGENT) {
        let agent = format!("{}/{}", crate::context::FIELD_MANAGER, env!("CARGO_PKG_VERSION"));
        config.headers.push((hyper::header::USER_AGENT, hyper::header::HeaderValue::from_str(&agent)?));
    }
    let builder = kube::client::ClientBuilder::try_from(config)?;
    // Refused requests are logged with verb/resource/namespace and feed /readyz.
    Ok(builder
        .with_layer(&crate::metrics::ApiAccessLayer::default())
        .with_layer(&tower::limit::ConcurrencyLimitLayer::new(MAX_REQUESTS_IN_FLIGHT))
        .build())
}

/// A client for the API server described by a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    client_from_config(config)
}

/// Applies every CRD of the project (server-side apply) and waits until all are served.
pub async fn install_crds(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(crate::context::FIELD_MANAGER).force();
    for crd in provisioning_crds::all_crds() {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd)).await.with_context(|| format!("applying CRD {name}"))?;
    }
    let deadline = Instant::now() + timeout;
    loop {
        let served = [
            probe::<provisioning_crds::Workspace>(client).await,
            probe::<provisioning_crds::Server>(client).await,
            probe::<provisioning_crds::TaskServ>(client).await,
            probe::<provisioning_crds::Cluster>(client).await,
        ];
        if served.iter().all(|ok| *ok) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRDs not served after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn probe<K>(client: &Client) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone()).list(&ListParams::default().limit(1)).await.is_ok()
}
