//! Under deploy/'s least-privilege RBAC (Secrets granted per workspace namespace by a
//! RoleBinding, no cluster-wide Secret watch), the controller — running with the
//! ServiceAccount token of deploy/rbac against the embedded control plane — watches Secrets
//! per workspace namespace: a fixed credentials Secret is picked up in seconds, not at the
//! error backoff's retry (30 s and more), and so is a TaskServ's awaited `configFrom` Secret.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use provisioning_controller::conditions::is_true;
use provisioning_controller::permissions::{may_watch_all_secrets, may_watch_secrets_in};
use provisioning_controller::testing::{TestEnv, is_ready, server, wait_for};
use provisioning_crds::{Server, TaskServ, Workspace};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let bin = std::env::var_os("PROVISIONING_KUBECTL").map(PathBuf::from).unwrap_or_else(|| root().join(".tools/bin/kubectl"));
    ensure!(bin.exists(), "kubectl not found at {} (run scripts/setup.sh)", bin.display());
    let cache = kubeconfig.parent().map(|p| p.join("kubectl-cache")).unwrap_or_default();
    let out = Command::new(bin).env("KUBECONFIG", kubeconfig).arg("--cache-dir").arg(cache).args(args).output()?;
    ensure!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The admin kubeconfig with its user replaced by `token`.
fn kubeconfig_with_token(admin: &Path, token: &str) -> anyhow::Result<PathBuf> {
    let mut kc: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(admin)?)?;
    let users = kc["users"].as_array_mut().context("users")?;
    for u in users {
        u["user"] = json!({"token": token});
    }
    let path = admin.with_file_name("controller-sa.kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&kc)?)?;
    Ok(path)
}

const NAMESPACE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: kappa, labels: {provisioning.dev/workspace: kappa}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: provisioning-controller-secrets, namespace: kappa}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: provisioning-controller-secrets}
subjects:
- {kind: ServiceAccount, name: provisioning-controller, namespace: provisioning-system}
---
apiVersion: v1
kind: Secret
metadata: {name: sim-creds, namespace: kappa}
stringData: {SIMULATED_TOKEN: wrong-token}
---
apiVersion: provisioning.dev/v1alpha1
kind: Workspace
metadata: {name: kappa}
spec:
  providers:
  - name: sim
    type: simulated
    simulation: {requiredToken: right-token}
    credentialsSecretRef: {name: sim-creds}
  defaults: {provider: sim}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_credentials_secret_is_picked_up_at_once_under_per_namespace_rbac() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let admin = env.kubeconfig.clone();
    let deploy = root().join("deploy");
    kubectl(&admin, &["apply", "-f", &deploy.join("namespace.yaml").display().to_string()])?;
    kubectl(&admin, &["apply", "-f", &deploy.join("rbac").display().to_string()])?;
    let token = kubectl(&admin, &["create", "token", "provisioning-controller", "-n", "provisioning-system"])?.trim().to_string();
    let sa = provisioning_controller::client::client_from_kubeconfig(&kubeconfig_with_token(&admin, &token)?).await?;

    let manifest = admin.with_file_name("kappa.yaml");
    std::fs::write(&manifest, NAMESPACE)?;
    kubectl(&admin, &["apply", "-f", &manifest.display().to_string()])?;
    // The premise: no cluster-wide Secret watch, but one in the bound namespace.
    ensure!(!may_watch_all_secrets(&sa).await, "deploy/ must not grant a cluster-wide Secret watch");
    ensure!(may_watch_secrets_in(&sa, "kappa").await, "the RoleBinding grants Secrets in kappa");
    ensure!(!may_watch_secrets_in(&sa, "kube-system").await, "and nowhere else");

    let controller = env.start_controller_as(sa, env.config());
    let workspaces: Api<Workspace> = Api::all(env.client.clone());
    let servers: Api<Server> = Api::namespaced(env.client.clone(), "kappa");
    servers.create(&PostParams::default(), &server("kappa", "s1", json!({}))).await?;
    let stalled = |c: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| is_true(c, "Stalled");
    wait_for("kappa Stalled on the wrong token", DEADLINE, || {
        let workspaces = workspaces.clone();
        async move { workspaces.get("kappa").await.ok()?.status.filter(|s| stalled(&s.conditions)).map(drop) }
    })
    .await?;
    wait_for("s1 Stalled on the wrong token", DEADLINE, || {
        let servers = servers.clone();
        async move { servers.get("s1").await.ok()?.status.filter(|s| stalled(&s.conditions)).map(drop) }
    })
    .await?;

    // Fix the Secret: the per-namespace watch sees it; both recover well before the error
    // backoff's next retry (30 s and more) or a resync.
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "kappa");
    let started = Instant::now();
    let patch = json!({"stringData": {"SIMULATED_TOKEN": "right-token"}});
    secrets.patch("sim-creds", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let fast = Duration::from_secs(10);
    wait_for("kappa Ready after the Secret fix", fast, || {
        let workspaces = workspaces.clone();
        async move { workspaces.get("kappa").await.ok()?.status.filter(|s| is_true(&s.conditions, "Ready")).map(drop) }
    })
    .await?;
    wait_for("s1 Ready after the Secret fix", fast, || {
        let servers = servers.clone();
        async move { servers.get("s1").await.ok().filter(is_ready) }
    })
    .await?;
    eprintln!("recovered {:?} after the Secret fix, under per-namespace RBAC", started.elapsed());

    // A TaskServ waiting for its configFrom Secret goes on as soon as it is created (not at
    // the 30 s poll of a missing input).
    let tss: Api<TaskServ> = Api::namespaced(env.client.clone(), "kappa");
    let ts: TaskServ = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ", "metadata": {"name": "db", "namespace": "kappa"},
        "spec": {"service": "postgresql", "servers": {"names": ["s1"]}, "config": {"user": "app"},
                 "configFrom": [{"kind": "Secret", "name": "db-creds", "key": "password", "targetPath": "password"}]}
    }))?;
    tss.create(&PostParams::default(), &ts).await?;
    let reason = |t: &TaskServ, type_: &str| {
        t.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == type_)).map(|c| (c.status.clone(), c.reason.clone()))
    };
    wait_for("db waiting for db-creds", DEADLINE, || {
        let tss = tss.clone();
        async move { tss.get("db").await.ok().filter(|t| reason(t, "Stalled").is_some_and(|r| r.1 == "ConfigFromMissing")).map(drop) }
    })
    .await?;
    let db_creds: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-creds", "namespace": "kappa"},
        "stringData": {"password": "db-pass-VALUE"}
    }))?;
    secrets.create(&PostParams::default(), &db_creds).await?;
    let started = Instant::now();
    wait_for("db no longer waiting after db-creds appeared", fast, || {
        let tss = tss.clone();
        async move { tss.get("db").await.ok().filter(|t| reason(t, "Stalled").is_some_and(|r| r.0 == "False")).map(drop) }
    })
    .await?;
    eprintln!("TaskServ went on {:?} after its Secret appeared", started.elapsed());
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
