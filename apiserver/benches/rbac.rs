//! Cost of authentication and RBAC per request: the same GET (one Server) and LIST (100
//! Servers) sent sequentially as the admin (`system:masters`, no RBAC evaluation) and as a
//! ServiceAccount whose token is verified (ES256) and whose RoleBinding is found among 500
//! other RoleBindings. Prints mean and p99 latency of each.
//!
//! `cargo bench -p provisioning-apiserver --bench rbac` (release), or for a quick relative
//! figure in the debug profile: `cargo test -p provisioning-apiserver --bench rbac`.

use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::json;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const REQUESTS: usize = 500;

fn servers_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", "v1alpha1", "Server"), "servers")
}

async fn client(kubeconfig: &std::path::Path) -> BoxResult<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(Client::try_from(cfg)?)
}

async fn post(c: &Client, path: &str, body: serde_json::Value) -> BoxResult<serde_json::Value> {
    let req =
        http::Request::builder().method("POST").uri(path).header("content-type", "application/json").body(serde_json::to_vec(&body)?)?;
    Ok(c.request::<serde_json::Value>(req).await?)
}

async fn timed(label: &str, c: &Client) -> BoxResult<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), "demo", &servers_resource());
    for (what, list) in [("get", false), ("list 100", true)] {
        let mut lat = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let t = Instant::now();
            if list {
                api.list(&ListParams::default()).await?;
            } else {
                api.get("s-0").await?;
            }
            lat.push(t.elapsed());
        }
        lat.sort();
        let mean = lat.iter().sum::<Duration>() / REQUESTS as u32;
        let p99 = lat[(REQUESTS * 99 / 100).min(REQUESTS - 1)];
        println!("{label:<16} {what:<9} mean {:>8.1} µs  p99 {:>8.1} µs", mean.as_secs_f64() * 1e6, p99.as_secs_f64() * 1e6);
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> BoxResult<()> {
    provisioning_apiserver::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let server =
        provisioning_apiserver::start(provisioning_apiserver::ApiServerConfig::new(dir.path().to_path_buf(), "127.0.0.1:0".parse()?))
            .await?;
    let admin = client(&server.kubeconfig_path()).await?;
    let crd: serde_json::Value = serde_yaml_ng::from_str(include_str!("../tests/fixtures/server-crd.yaml"))?;
    post(&admin, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "demo", &servers_resource());
    post(&admin, "/api/v1/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})).await?;
    while api.list(&ListParams::default()).await.is_err() {
        if Instant::now() > deadline {
            return Err("CRD never served".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..100 {
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": format!("s-{i}")}, "spec": {"plan": "small"}}))?;
        api.create(&PostParams::default(), &obj).await?;
    }
    post(
        &admin,
        "/api/v1/namespaces/demo/serviceaccounts",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ci"}}),
    )
    .await?;
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    post(&admin, &format!("{rbac}/namespaces/demo/roles"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "reader"}, "rules": [{"apiGroups": ["provisioning.dev"], "resources": ["servers"], "verbs": ["get", "list"]}]})).await?;
    // Noise: 500 bindings for other subjects, in the same namespace.
    for i in 0..500 {
        post(&admin, &format!("{rbac}/namespaces/demo/rolebindings"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("other-{i}")}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "User", "name": format!("user-{i}")}]})).await?;
    }
    post(
        &admin,
        &format!("{rbac}/namespaces/demo/rolebindings"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "ci"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "ci", "namespace": "demo"}]}),
    )
    .await?;
    let tr = post(
        &admin,
        "/api/v1/namespaces/demo/serviceaccounts/ci/token",
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
    )
    .await?;
    let token = tr["status"]["token"].as_str().ok_or("no token in TokenRequest")?;
    let text = std::fs::read_to_string(server.kubeconfig_path())?;
    let sa_text: Vec<String> =
        text.lines().map(|l| if l.trim_start().starts_with("token: ") { format!("    token: {token}") } else { l.to_string() }).collect();
    let sa_kc = dir.path().join("sa-kubeconfig");
    std::fs::write(&sa_kc, sa_text.join("\n") + "\n")?;
    let sa = client(&sa_kc).await?;
    // Warm both connections and the policy cache.
    timed("warm-up admin", &admin).await?;
    timed("warm-up sa", &sa).await?;
    timed("admin", &admin).await?;
    timed("serviceaccount", &sa).await?;
    server.shutdown().await;
    Ok(())
}
