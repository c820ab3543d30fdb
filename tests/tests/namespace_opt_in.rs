//! A Workspace reads its namespace's Secrets only when the namespace opted in (issue 26, low):
//! whoever may create a Workspace could otherwise claim any unclaimed namespace and have the
//! controller send that namespace's Secrets to the account endpoint the Workspace names.
//! `provisioning dev` with real kubectl and the aws provider against the moto EC2 emulator:
//!
//! - a Namespace without the label `provisioning.dev/workspace`, a Secret in it, a Workspace
//!   claiming it with an account whose credentials are that Secret, and a Server: the Server is
//!   Stalled with reason `NamespaceNotOptedIn` and a message naming the `kubectl label` to run,
//!   and moto sees no instance (nothing was sent with the credentials);
//! - a label naming another Workspace does not count either;
//! - once the namespace's owner labels it for this Workspace, the Server becomes Ready;
//! - deleting the Server leaves no instance at moto.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::cloud::{Moto, condition, get_json, write_yaml_docs};
use serde_json::json;

const NAMESPACE: &str = "optin-e2e";
const REGION: &str = "eu-north-1";

fn manifest(dir: &Path, moto: &Moto) -> Result<String> {
    let docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "aws-creds", "namespace": NAMESPACE}, "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": "AKIAE2EOPTIN00000001", "AWS_SECRET_ACCESS_KEY": "e2e-opt-in"}}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": NAMESPACE},
        "spec": {
            "defaults": {"provider": "aws-optin", "plan": "small", "image": "debian-12"},
            "providers": [{
                "name": "aws-optin", "type": "aws", "region": REGION, "endpoint": moto.endpoint,
                "credentialsSecretRef": {"name": "aws-creds"}, "sshSourceCidrs": ["127.0.0.1/32"],
                "images": {"debian-12": "ami-1e749f67"},
            }],
        }}),
        json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "metadata": {"name": "a", "namespace": NAMESPACE},
            "spec": {"plan": "small"}}),
    ];
    Ok(write_yaml_docs(dir, "optin.yaml", &docs)?.display().to_string())
}

/// Waits until Server a is Stalled with NamespaceNotOptedIn and a message saying `what`.
fn stalled_not_opted_in(dev: &mut Dev, what: &str) -> Result<String> {
    let mut message = String::new();
    dev.wait_until(Duration::from_secs(120), &format!("Server a Stalled NamespaceNotOptedIn ({what})"), |d| {
        let srv = get_json(d, &["srv", "a", "-n", NAMESPACE])?;
        let stalled = condition(&srv, "Stalled").cloned().unwrap_or_default();
        message = stalled["message"].as_str().unwrap_or_default().to_string();
        Ok(stalled["status"] == "True" && stalled["reason"] == "NamespaceNotOptedIn" && message.contains(what))
    })?;
    Ok(message)
}

fn scenario(dev: &mut Dev, moto: &Moto) -> Result<()> {
    let message = stalled_not_opted_in(dev, "has no label")?;
    let label = format!("kubectl label namespace {NAMESPACE} provisioning.dev/workspace={NAMESPACE}");
    ensure!(message.contains(&label), "the message names what to run ({label:?}): {message}");
    ensure!(!message.contains("e2e-opt-in"), "no credential in the message: {message}");
    ensure!(moto.live_instances(REGION)?.is_empty(), "an instance was created with the credentials of a namespace that did not opt in");

    // A label for another Workspace is no opt-in for this one.
    dev.kubectl_ok(&["label", "namespace", NAMESPACE, "provisioning.dev/workspace=someone-else"])?;
    stalled_not_opted_in(dev, "someone-else")?;
    ensure!(moto.live_instances(REGION)?.is_empty(), "an instance was created under another workspace's label");

    dev.kubectl_ok(&["label", "--overwrite", "namespace", NAMESPACE, &format!("provisioning.dev/workspace={NAMESPACE}")])?;
    dev.wait_until(Duration::from_secs(180), "Server a Ready once the namespace opted in", |d| {
        let srv = get_json(d, &["srv", "a", "-n", NAMESPACE])?;
        Ok(condition(&srv, "Ready").is_some_and(|c| c["status"] == "True"))
    })?;
    ensure!(moto.live_instances(REGION)?.len() == 1, "one instance once opted in");
    Ok(())
}

#[test]
fn a_workspace_uses_a_namespaces_secrets_only_once_the_namespace_opted_in() -> Result<()> {
    let moto = Moto::start(&[])?;
    let tmp = tempfile::tempdir()?;
    let path = manifest(tmp.path(), &moto)?;
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[&path], &[], &["--allow-insecure-endpoints"])?;
    let result = scenario(&mut dev, &moto);
    let _ = dev.kubectl(&["delete", "srv", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=120s"]);
    let left = moto.live_instances(REGION);
    dev.stop();
    result?;
    ensure!(left?.is_empty(), "instances left at moto after deleting the Server");
    Ok(())
}
