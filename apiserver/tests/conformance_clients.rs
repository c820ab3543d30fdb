//! Conformance-style suite (issue 27 item 6): clients this project did not write, driven against
//! the embedded control plane over real HTTPS, so that a fidelity gap shows up as a failing test
//! carrying the client's own error: the official Python `kubernetes` client
//! (tests/conformance/python_client.py), kubectl's typed commands, and kube-rs's dynamic API
//! after discovery.
#![allow(clippy::too_many_lines, reason = "test scenarios read as one story, step by step")]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = manifest.canonicalize().unwrap_or_else(|_| manifest.to_path_buf());
    manifest.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The Python with the `kubernetes` client: $PROVISIONING_PYCLIENT or <workspace>/.tools/pyclient.
/// Never skips: without it the test fails naming scripts/setup.sh.
fn python_with_client() -> Result<PathBuf, String> {
    let python = std::env::var("PROVISIONING_PYCLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join(".tools/pyclient/bin/python"));
    let probe = std::process::Command::new(&python).args(["-c", "import kubernetes; print(kubernetes.__version__)"]).output();
    match probe {
        Ok(o) if o.status.success() => Ok(python),
        Ok(o) => Err(format!(
            "{} cannot import the Python kubernetes client ({}): run scripts/setup.sh",
            python.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{}: {e}: run scripts/setup.sh (it installs the Python kubernetes client)", python.display())),
    }
}

/// Installs the project's CRDs and waits until each is Established.
async fn install_project_crds(client: &kube::Client) -> TestResult {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let all = provisioning_crds::all_crds();
    for crd in &all {
        crds.create(&PostParams::default(), crd).await?;
    }
    for crd in &all {
        let name = crd.metadata.name.clone().unwrap_or_default();
        eventually(&format!("{name} Established"), Duration::from_secs(10), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                crds.get(&name).await.is_ok_and(|c| {
                    c.status.and_then(|s| s.conditions).unwrap_or_default().iter().any(|c| c.type_ == "Established" && c.status == "True")
                })
            }
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_kubernetes_client_examples_work() -> TestResult {
    let python = python_with_client()?;
    let ts = start().await?;
    let kc = ts.server.kubeconfig_path();
    let client = client_for(&kc).await?;
    install_project_crds(&client).await?;
    let script = workspace_root().join("tests/conformance/python_client.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&kc)
        .arg("py-conform")
        .env("HOME", ts.dir.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out).await.map_err(|_| "python_client.py ran over 120 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python_client.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}\n{stderr}");
    ts.server.shutdown().await;
    Ok(())
}
