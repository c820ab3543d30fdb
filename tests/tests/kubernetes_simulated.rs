//! A Kubernetes Cluster on the simulated provider, end to end: its machines print what the
//! first control plane's scripts print (the admin kubeconfig on a `PROVISIONING_SECRET` line);
//! the controller exports it to the Secret `<cluster>-kubeconfig` in Cluster API's format,
//! pointing at the control-plane endpoint, rotates it when the endpoint or the CA changes,
//! never writes it over a Secret it does not own, and never lets it into status, events,
//! logs or the audit log. The install's stages are Cluster conditions `provisioning trace`
//! shows.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use base64::Engine;
use provisioning_e2e::{Dev, provisioning_bin};
use serde_json::Value;

const NS: &str = "k8s-sim";
/// base64 of the simulated machines' client key: what must never leave the Secret.
const CLIENT_KEY: &str = "c2ltdWxhdGVkIGNsaWVudCBrZXk=";

fn json(dev: &Dev, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    Ok(serde_json::from_str(&dev.kubectl_ok(&all)?)?)
}

fn condition(cluster: &Value, t: &str) -> Option<(String, String, String)> {
    let c = cluster["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == t)?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

fn cluster(dev: &Dev, name: &str) -> Result<Value> {
    json(dev, &["get", "cluster", name, "-n", NS])
}

/// The kubeconfig in the Secret, decoded.
fn kubeconfig(secret: &Value) -> Result<Value> {
    let b64 = secret["data"]["value"].as_str().context("no data.value")?;
    let text = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64)?)?;
    Ok(serde_json::from_str(&text)?)
}

#[test]
fn kubernetes_cluster_exports_its_kubeconfig_and_shows_its_stages() -> Result<()> {
    // At info, so that the log holds every script line the controller passes on.
    let tmp = tempfile::tempdir()?;
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[], &[("RUST_LOG", "info")], &[])?;
    let manifest = provisioning_e2e::workspace_root().join("tests/tests/kubernetes_simulated.yaml");
    dev.kubectl_ok(&["apply", "-f", &manifest.display().to_string()])?;

    dev.wait_until(Duration::from_secs(240), "Cluster kube exports its kubeconfig", |d| {
        Ok(condition(&cluster(d, "kube")?, "KubeconfigReady").is_some_and(|c| c.0 == "True"))
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/kube", "-n", NS, "--timeout=120s"])?;
    let kube = cluster(&dev, "kube")?;
    let uid = kube["metadata"]["uid"].as_str().unwrap_or_default().to_string();

    // The stages, from which members are done.
    assert_eq!(
        condition(&kube, "ControlPlaneInitialized"),
        Some(("True".into(), "Initialized".into(), "kubeadm init done on kube-control-plane-0".into()))
    );
    assert_eq!(condition(&kube, "ControlPlaneAvailable"), Some(("True".into(), "MembersJoined".into(), "2/2 members".into())));
    assert_eq!(condition(&kube, "WorkersJoined"), Some(("True".into(), "MembersJoined".into(), "1/1 members".into())));
    // The catalog pins the default cilium CLI (v0.16.22), so the CNI stage is Ready.
    assert_eq!(condition(&kube, "CNIReady"), Some(("True".into(), "Ready".into(), "cilium ready on 2 servers".into())));
    assert_eq!(condition(&kube, "StorageReady"), None, "no storage service, no condition");

    // The Secret, in Cluster API's format, owned by the Cluster, its server the endpoint
    // (the first control plane's address and 6443: no controlPlaneEndpoint is set).
    let secret = json(&dev, &["get", "secret", "kube-kubeconfig", "-n", NS])?;
    assert_eq!(secret["type"], "cluster.x-k8s.io/secret");
    assert_eq!(secret["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"], "kube");
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str(), owner["controller"].as_bool()),
        (Some("Cluster"), Some(uid.as_str()), Some(true))
    );
    let server = json(&dev, &["get", "server", "kube-control-plane-0", "-n", NS])?;
    let address = server["status"]["addresses"][0]["address"].as_str().context("no address")?.to_string();
    let config = kubeconfig(&secret)?;
    assert_eq!(config["clusters"][0]["cluster"]["server"], format!("https://{address}:6443"));
    assert_eq!(config["users"][0]["user"]["client-key-data"], CLIENT_KEY);
    let first_ca = config["clusters"][0]["cluster"]["certificate-authority-data"].clone();
    assert_eq!(
        condition(&kube, "KubeconfigReady"),
        Some(("True".into(), "Exported".into(), format!("Secret kube-kubeconfig (server https://{address}:6443)")))
    );

    // A Secret of that name the Cluster does not own is never written over.
    dev.wait_until(Duration::from_secs(120), "Cluster taken refuses the Secret it does not own", |d| {
        Ok(condition(&cluster(d, "taken")?, "KubeconfigReady").is_some_and(|c| c.1 == "SecretNotOwned"))
    })?;
    let (_, _, message) = condition(&cluster(&dev, "taken")?, "KubeconfigReady").unwrap_or_default();
    assert!(message.contains("Secret k8s-sim/taken-kubeconfig exists and is not owned by Cluster taken"), "{message}");
    let foreign = json(&dev, &["get", "secret", "taken-kubeconfig", "-n", NS])?;
    assert_eq!(foreign["data"]["value"], base64::engine::general_purpose::STANDARD.encode("not ours"));
    assert!(foreign["metadata"]["ownerReferences"].is_null(), "{foreign}");
    // A cilium CLI version the catalog has no pin for is said up front, naming the field and
    // where upstream publishes the value, even though the simulated run would "succeed".
    dev.wait_until(Duration::from_secs(120), "Cluster taken says its cilium CLI is unpinned", |d| {
        Ok(condition(&cluster(d, "taken")?, "CNIReady").is_some_and(|c| c.1 == "PinMissing"))
    })?;
    let (status, _, message) = condition(&cluster(&dev, "taken")?, "CNIReady").unwrap_or_default();
    assert_eq!(status, "False", "{message}");
    assert!(
        message.contains("cliSha256.\"v0.16.21\"") && message.contains("releases/download/v0.16.21/cilium-linux-amd64.tar.gz.sha256sum"),
        "{message}"
    );

    // `provisioning trace` shows the stages.
    let out = Command::new(provisioning_bin())
        .args(["trace", "cluster/kube", "-n", NS, "--kubeconfig"])
        .arg(dev.kubeconfig())
        .env_remove("KUBECONFIG")
        .output()?;
    let table = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "trace failed: {}", String::from_utf8_lossy(&out.stderr));
    for row in [
        "Stage/ControlPlaneInitialized",
        "Stage/ControlPlaneAvailable",
        "2/2 members",
        "Stage/WorkersJoined",
        "Stage/CNIReady",
        "Stage/KubeconfigReady",
    ] {
        assert!(table.contains(row), "{row} missing:\n{table}");
    }

    // A late joiner (a scale-up): WorkersJoined counts it once its kubernetes install is done.
    dev.kubectl_ok(&[
        "patch",
        "cluster",
        "kube",
        "-n",
        NS,
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/pools/1/replicas","value":2}]"#,
    ])?;
    dev.wait_until(Duration::from_secs(240), "the late worker has joined", |d| {
        Ok(condition(&cluster(d, "kube")?, "WorkersJoined") == Some(("True".into(), "MembersJoined".into(), "2/2 members".into())))
    })?;

    // Rotation: a new endpoint and a new CA key (the machine's CA changes with it) rewrite it.
    let patch = r#"[{"op":"add","path":"/spec/taskservs/1/config","value":{"controlPlaneEndpoint":"api.kube.example:6443","caKey":"-----BEGIN PRIVATE KEY-----\nrotated for the test\n-----END PRIVATE KEY-----\n"}}]"#;
    dev.kubectl_ok(&["patch", "cluster", "kube", "-n", NS, "--type", "json", "-p", patch])?;
    dev.wait_until(Duration::from_secs(240), "the Secret is rotated to the new endpoint and CA", |d| {
        let config = kubeconfig(&json(d, &["get", "secret", "kube-kubeconfig", "-n", NS])?)?;
        let cluster = &config["clusters"][0]["cluster"];
        Ok(cluster["server"] == "https://api.kube.example:6443" && cluster["certificate-authority-data"] != first_ca)
    })?;

    // Never in status, events, logs or the audit log: only the Secret holds it.
    let mut places = Vec::new();
    for kind in ["clusters", "taskservs", "servers", "events", "changerecords"] {
        places.push((kind.to_string(), dev.kubectl_ok(&["get", kind, "-n", NS, "-o", "json"])?));
    }
    let log = dev.log();
    ensure!(log.contains("simulated: scripts not run (install.nu)"), "the log holds the script lines");
    places.push(("controller log".into(), log));
    let data_dir = dev.data_dir.display().to_string();
    places.push(("audit log".into(), provisioning_e2e::provisioning_ok(&["audit", "--data-dir", &data_dir, "-o", "json"])?));
    for (place, text) in &places {
        assert!(!text.contains(CLIENT_KEY) && !text.contains("simulated client key"), "the kubeconfig leaked into {place}");
    }
    let taskservs = &places[1].1;
    assert!(taskservs.contains("a secret result line was withheld"), "the first control plane's tail says what was withheld");

    // Deleted with its Cluster; the foreign Secret outlives the Cluster that did not own it.
    dev.kubectl_ok(&["delete", "cluster", "kube", "taken", "-n", NS, "--timeout=180s"])?;
    dev.wait_until(Duration::from_secs(60), "the kubeconfig Secret is deleted with its Cluster", |d| {
        let out = d.kubectl(&["get", "secret", "kube-kubeconfig", "-n", NS])?;
        Ok(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"))
    })?;
    dev.kubectl_ok(&["get", "secret", "taken-kubeconfig", "-n", NS])?;
    Ok(())
}

/// The flagship template as a user tries it: `provisioning template render kubernetes_3node
/// --set cloud=simulated --set controlPlanes=3`, applied, reaches Ready with its stages, its
/// control-plane endpoint (the simulated provider's load balancer, the default) and the
/// kubeconfig Secret pointing at it. The first control plane's machine deleted out of band:
/// the load balancer keeps its address and re-targets to the replacement, the Secret still
/// points at it. `kubectl delete` leaves nothing at the provider (its journal is the oracle).
#[test]
fn the_kubernetes_3node_template_reaches_ready_with_its_endpoint_which_outlives_the_first_control_plane() -> Result<()> {
    const TPL_NS: &str = "k8s-tpl-sim";
    let tmp = tempfile::tempdir()?;
    // A 2 s drift survey, so a machine deleted behind the controller's back is seen soon.
    let config = tmp.path().join("controller.toml");
    std::fs::write(&config, "survey_secs = 2\n")?;
    let config_arg = config.display().to_string();
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[], &[], &["--config", &config_arg])?;
    let file = tmp.path().join("k8s.yaml");
    let file_arg = file.display().to_string();
    provisioning_e2e::provisioning_ok(&[
        "template",
        "render",
        "kubernetes_3node",
        "--set",
        "cloud=simulated",
        "--set",
        "controlPlanes=3",
        "-n",
        TPL_NS,
        "-o",
        &file_arg,
    ])?;
    dev.kubectl_ok(&["apply", "-f", &file_arg])?;
    dev.wait_until(Duration::from_secs(300), "the template's Cluster is Ready with its kubeconfig", |d| {
        let c = json(d, &["get", "cluster", "k8s", "-n", TPL_NS])?;
        Ok(condition(&c, "Ready").is_some_and(|c| c.0 == "True") && condition(&c, "KubeconfigReady").is_some_and(|c| c.0 == "True"))
    })?;
    let c = json(&dev, &["get", "cluster", "k8s", "-n", TPL_NS])?;
    let uid = c["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    // Every stage condition the template's services make, True: with the catalog's pins the
    // CNI stage is Ready too (the template installs cilium at its default CLI version).
    assert_eq!(condition(&c, "ControlPlaneInitialized").map(|c| (c.0, c.1)), Some(("True".into(), "Initialized".into())));
    assert_eq!(condition(&c, "ControlPlaneAvailable").map(|c| c.2), Some("3/3 members".into()));
    assert_eq!(condition(&c, "WorkersJoined").map(|c| c.2), Some("2/2 members".into()));
    assert_eq!(condition(&c, "CNIReady").map(|c| (c.0, c.1)), Some(("True".into(), "Ready".into())), "{}", c["status"]);
    // The endpoint in status, and at the provider: one load balancer of this Cluster, its
    // targets the three control-plane machines.
    let endpoint = c["status"]["controlPlaneEndpoint"].clone();
    assert_eq!((endpoint["type"].as_str(), endpoint["port"].as_u64()), (Some("LoadBalancer"), Some(6443)), "{endpoint}");
    let address = endpoint["address"].as_str().context("no endpoint address")?.to_string();
    let (status, reason, message) = condition(&c, "EndpointReady").unwrap_or_default();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Created"), "{message}");
    assert!(message.contains(&address) && message.contains("3 control-plane machines"), "{message}");
    // Its price, with its source, is in the Cluster's cost (the simulated provider's is free).
    assert_eq!(endpoint["cost"]["source"], "simulated provider: no charge", "{endpoint}");
    assert!(c["status"]["cost"]["priced"].as_u64() == Some(6), "5 machines and the endpoint: {}", c["status"]["cost"]);
    let machine_of = |d: &Dev, server: &str| -> Result<String> {
        let s = json(d, &["get", "server", server, "-n", TPL_NS])?;
        Ok(s["status"]["providerID"].as_str().context("no providerID")?.to_string())
    };
    let mut control_planes = Vec::new();
    for i in 0..3 {
        control_planes.push(machine_of(&dev, &format!("k8s-control-plane-{i}"))?);
    }
    let native = |id: &str| id.split_once("://").map(|(_, n)| n.to_string()).unwrap_or_default();
    let endpoints = provisioning_e2e::simulated_endpoints(&dev.data_dir)?;
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    let lb = endpoints[0].clone();
    assert_eq!((lb.kind.as_str(), lb.address.as_str()), ("LoadBalancer", address.as_str()));
    assert_eq!(lb.tags.get("provisioning.dev/cluster-uid"), Some(&uid));
    let mut want: Vec<String> = control_planes.iter().map(|p| native(p)).collect();
    want.sort();
    let mut have = lb.targets.clone();
    have.sort();
    assert_eq!(have, want);
    // kubeadm got it (the kubernetes service's controlPlaneEndpoint) and so does the Secret.
    let k8s = json(&dev, &["get", "taskserv", "k8s-kubernetes", "-n", TPL_NS])?;
    assert_eq!(k8s["spec"]["config"]["controlPlaneEndpoint"], format!("{address}:6443"));
    let secret_server = |d: &Dev| -> Result<String> {
        let value = d.kubectl_ok(&["get", "secret", "k8s-kubeconfig", "-n", TPL_NS, "-o", "jsonpath={.data.value}"])?;
        let config: Value = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(value.trim())?)?;
        Ok(config["clusters"][0]["cluster"]["server"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(secret_server(&dev)?, format!("https://{address}:6443"));

    // The first control plane's machine deleted behind the controller's back.
    let first = control_planes[0].clone();
    provisioning_e2e::simulated_delete_out_of_band(&dev.data_dir, &native(&first))?;
    dev.wait_until(Duration::from_secs(240), "the load balancer re-targets to the replacement machine", |d| {
        let replacement = machine_of(d, "k8s-control-plane-0").unwrap_or_default();
        let endpoints = provisioning_e2e::simulated_endpoints(&d.data_dir)?;
        Ok(!replacement.is_empty()
            && replacement != first
            && endpoints.len() == 1
            && endpoints[0].targets.contains(&native(&replacement))
            && !endpoints[0].targets.contains(&native(&first)))
    })?;
    let endpoints = provisioning_e2e::simulated_endpoints(&dev.data_dir)?;
    assert_eq!((endpoints[0].id.as_str(), endpoints[0].address.as_str()), (lb.id.as_str(), address.as_str()), "the same load balancer");
    assert_eq!(endpoints[0].targets.len(), 3, "{endpoints:?}");
    dev.wait_until(Duration::from_secs(60), "status shows the new targets", |d| {
        let c = json(d, &["get", "cluster", "k8s", "-n", TPL_NS])?;
        let targets = &c["status"]["controlPlaneEndpoint"]["targets"];
        Ok(c["status"]["controlPlaneEndpoint"]["address"] == address.as_str()
            && targets.as_array().is_some_and(|t| t.len() == 3 && !t.iter().any(|x| x == first.as_str())))
    })?;
    assert_eq!(secret_server(&dev)?, format!("https://{address}:6443"), "the Secret still points at the endpoint");

    // Deleted with the Cluster: nothing left at the provider.
    dev.kubectl_ok(&["delete", "cluster", "k8s", "-n", TPL_NS, "--timeout=240s"])?;
    let endpoints = provisioning_e2e::simulated_endpoints(&dev.data_dir)?;
    assert!(endpoints.is_empty(), "endpoints left at the provider: {endpoints:?}");
    let machines = provisioning_e2e::simulated_machines(&dev.data_dir)?;
    assert!(machines.iter().all(|m| m.tags.get("provisioning.dev/namespace").map(String::as_str) != Some(TPL_NS)), "{machines:?}");
    Ok(())
}

/// `endpoint=FloatingIP` on the simulated provider: kubernetes waits until the address is on
/// the first control plane, kubeadm and the Secret use it, and it is released with the Cluster.
#[test]
fn a_floating_ip_endpoint_is_on_the_first_control_plane_and_released_with_the_cluster() -> Result<()> {
    const FIP_NS: &str = "k8s-fip-sim";
    let tmp = tempfile::tempdir()?;
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[], &[], &[])?;
    let file = tmp.path().join("k8s.yaml");
    let file_arg = file.display().to_string();
    provisioning_e2e::provisioning_ok(&[
        "template",
        "render",
        "kubernetes_3node",
        "--set",
        "cloud=simulated",
        "--set",
        "endpoint=FloatingIP",
        "-n",
        FIP_NS,
        "-o",
        &file_arg,
    ])?;
    dev.kubectl_ok(&["apply", "-f", &file_arg])?;
    dev.wait_until(Duration::from_secs(240), "the Cluster is Ready with its kubeconfig", |d| {
        let c = json(d, &["get", "cluster", "k8s", "-n", FIP_NS])?;
        Ok(condition(&c, "Ready").is_some_and(|c| c.0 == "True") && condition(&c, "KubeconfigReady").is_some_and(|c| c.0 == "True"))
    })?;
    let c = json(&dev, &["get", "cluster", "k8s", "-n", FIP_NS])?;
    let endpoint = &c["status"]["controlPlaneEndpoint"];
    assert_eq!(endpoint["type"], "FloatingIP", "{endpoint}");
    let address = endpoint["address"].as_str().context("no address")?.to_string();
    assert!(address.starts_with("198.51.100."), "{address}");
    let cp0 = json(&dev, &["get", "server", "k8s-control-plane-0", "-n", FIP_NS])?;
    let machine = cp0["status"]["providerID"].as_str().context("no providerID")?.to_string();
    assert_eq!(endpoint["targets"], serde_json::json!([machine]), "on the first control plane");
    let journal = provisioning_e2e::simulated_endpoints(&dev.data_dir)?;
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!((journal[0].kind.as_str(), journal[0].address.as_str()), ("FloatingIp", address.as_str()));
    let k8s = json(&dev, &["get", "taskserv", "k8s-kubernetes", "-n", FIP_NS])?;
    assert_eq!(k8s["spec"]["config"]["controlPlaneEndpoint"], format!("{address}:6443"));
    let value = dev.kubectl_ok(&["get", "secret", "k8s-kubeconfig", "-n", FIP_NS, "-o", "jsonpath={.data.value}"])?;
    let config: Value = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(value.trim())?)?;
    assert_eq!(config["clusters"][0]["cluster"]["server"], format!("https://{address}:6443"));
    // Admission refuses a VIP without its address, naming the field (the CRD's CEL rule).
    let bad = tmp.path().join("bad.json");
    std::fs::write(
        &bad,
        format!(
            r#"{{"apiVersion":"provisioning.dev/v1alpha1","kind":"Cluster","metadata":{{"name":"bad","namespace":"{FIP_NS}"}},
              "spec":{{"controlPlaneEndpoint":{{"type":"VIP","port":8443}},"pools":[{{"name":"control-plane","replicas":1}}],
                "taskservs":[{{"service":"kubernetes"}}]}}}}"#
        ),
    )?;
    let out = dev.kubectl(&["apply", "-f", &bad.display().to_string()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("controlPlaneEndpoint.address is required for type VIP"), "{stderr}");
    dev.kubectl_ok(&["delete", "cluster", "k8s", "-n", FIP_NS, "--timeout=180s"])?;
    let left = provisioning_e2e::simulated_endpoints(&dev.data_dir)?;
    assert!(left.is_empty(), "released with the Cluster: {left:?}");
    Ok(())
}

/// A scale-up long after `kubeadm init`, when its bootstrap token has expired: the simulated
/// machines keep kubeadm's token (2 s here instead of an hour), a joiner without a valid token
/// fails, and the first control plane's health check renews the token while a server of the
/// Cluster is not a node — so the late worker joins.
#[test]
fn a_late_worker_joins_with_the_token_the_first_control_plane_renews() -> Result<()> {
    const LATE_NS: &str = "k8s-late-sim";
    let tmp = tempfile::tempdir()?;
    let config = tmp.path().join("controller.toml");
    std::fs::write(&config, "max_health_interval_secs = 2\n")?;
    let config_arg = config.display().to_string();
    let env = [("PROVISIONING_SIMULATED_JOIN_TOKEN_TTL_SECS", "2"), ("RUST_LOG", "info")];
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[], &env, &["--config", &config_arg])?;
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
          {{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{LATE_NS}"}}}},
          {{"apiVersion":"provisioning.dev/v1alpha1","kind":"Workspace","metadata":{{"name":"{LATE_NS}"}},
            "spec":{{"defaults":{{"provider":"sim"}},"providers":[{{"name":"sim","type":"simulated"}}]}}}},
          {{"apiVersion":"provisioning.dev/v1alpha1","kind":"Cluster","metadata":{{"name":"late","namespace":"{LATE_NS}"}},
            "spec":{{"pools":[{{"name":"control-plane","replicas":1,"plan":"small"}},{{"name":"workers","replicas":1,"plan":"small"}}],
              "taskservs":[{{"service":"containerd"}},{{"service":"kubernetes"}}]}}}}]}}"#
    );
    let file = tmp.path().join("late.json");
    std::fs::write(&file, manifest)?;
    dev.kubectl_ok(&["apply", "-f", &file.display().to_string()])?;
    let joined = |d: &Dev, n: &str| -> Result<bool> {
        let c = json(d, &["get", "cluster", "late", "-n", LATE_NS])?;
        Ok(condition(&c, "WorkersJoined") == Some(("True".into(), "MembersJoined".into(), format!("{n} members"))))
    };
    dev.wait_until(Duration::from_secs(180), "the first worker has joined", |d| joined(d, "1/1"))?;
    // "Days later": the token's lifetime passes with every server a node, so nobody renews it.
    std::thread::sleep(Duration::from_secs(3));
    dev.kubectl_ok(&[
        "patch",
        "cluster",
        "late",
        "-n",
        LATE_NS,
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/pools/1/replicas","value":2}]"#,
    ])?;
    dev.wait_until(Duration::from_secs(180), "the late worker has joined", |d| joined(d, "2/2"))?;
    let log = dev.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("simulated") || l.contains("kubernetes")).collect();
    assert!(
        log.contains("simulated: join token renewed for late-workers-1"),
        "the first control plane's check renewed the token for the late worker:\n{}",
        lines.join("\n")
    );
    Ok(())
}

/// Under Manual approval the endpoint is a change like any other: added to a running Cluster,
/// it is listed in the plan (with its price) and nothing is made at the provider until that
/// plan is approved; then the load balancer is made, and it goes with the Cluster.
#[test]
fn under_manual_approval_an_added_endpoint_waits_for_the_plan_to_be_approved() -> Result<()> {
    const NS_MANUAL: &str = "k8s-manual-sim";
    let tmp = tempfile::tempdir()?;
    let mut dev = Dev::start_in_with(&tmp.path().join("data"), &[], &[], &[])?;
    let file = tmp.path().join("manual.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS_MANUAL}}}\n---\n\
             apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {{name: {NS_MANUAL}}}\n\
             spec:\n  defaults: {{provider: sim}}\n  providers:\n  - {{name: sim, type: simulated}}\n---\n\
             apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: kube, namespace: {NS_MANUAL}}}\n\
             spec:\n  approval: Manual\n  pools:\n  - {{name: control-plane, replicas: 1, plan: small}}\n\
             \x20 taskservs:\n  - service: containerd\n  - service: kubernetes\n"
        ),
    )?;
    let file_arg = file.display().to_string();
    dev.kubectl_ok(&["apply", "-f", &file_arg])?;
    let approve = |d: &mut Dev, what: &str| -> Result<()> {
        d.wait_until(Duration::from_secs(120), what, |d| {
            let c = cluster_in(d, NS_MANUAL)?;
            Ok(condition(&c, "Ready").is_some_and(|c| c.1 == "AwaitingApproval") && c["status"]["plan"]["id"].as_str().is_some())
        })?;
        let id = cluster_in(d, NS_MANUAL)?["status"]["plan"]["id"].as_str().unwrap_or_default().to_string();
        d.kubectl_ok(&["annotate", "cluster", "kube", "-n", NS_MANUAL, "--overwrite", &format!("provisioning.dev/approve={id}")])?;
        Ok(())
    };
    approve(&mut dev, "the new Cluster awaiting approval")?;
    dev.wait_until(Duration::from_secs(240), "the Cluster Ready", |d| {
        Ok(condition(&cluster_in(d, NS_MANUAL)?, "Ready").is_some_and(|c| c.0 == "True"))
    })?;
    assert!(provisioning_e2e::simulated_endpoints(&dev.data_dir)?.is_empty());

    // The endpoint added: planned with its price, not made.
    dev.kubectl_ok(&[
        "patch",
        "cluster",
        "kube",
        "-n",
        NS_MANUAL,
        "--type=merge",
        "-p",
        r#"{"spec":{"controlPlaneEndpoint":{"type":"LoadBalancer","port":6443}}}"#,
    ])?;
    dev.wait_until(Duration::from_secs(120), "the endpoint awaiting approval", |d| {
        Ok(condition(&cluster_in(d, NS_MANUAL)?, "EndpointReady").is_some_and(|c| c.1 == "AwaitingApproval"))
    })?;
    let c = cluster_in(&dev, NS_MANUAL)?;
    let (_, _, message) = condition(&c, "EndpointReady").unwrap_or_default();
    assert_eq!(message, "the load balancer is created once the Cluster's plan is approved (status.plan)");
    let changes = c["status"]["plan"]["changes"].as_array().cloned().unwrap_or_default();
    assert!(
        changes.iter().any(|ch| ch["field"] == "spec.controlPlaneEndpoint" && ch["action"] == "Create"),
        "the plan lists the endpoint: {}",
        c["status"]["plan"]
    );
    // Visited more than once meanwhile (the patch, the status writes): still nothing made.
    std::thread::sleep(Duration::from_secs(3));
    assert!(provisioning_e2e::simulated_endpoints(&dev.data_dir)?.is_empty(), "made before approval");

    approve(&mut dev, "the plan with the endpoint awaiting approval")?;
    // Once the load balancer has its address the kubernetes service's controlPlaneEndpoint
    // changes: a plan that did not cover that (the address was unknown when it was made) waits
    // for its own approval, as any change does. Approved as a user would, with its new id.
    dev.wait_until(Duration::from_secs(180), "the endpoint made and Ready", |d| {
        let c = cluster_in(d, NS_MANUAL)?;
        let (id, approved) = (c["status"]["plan"]["id"].as_str(), c["metadata"]["annotations"]["provisioning.dev/approve"].as_str());
        if condition(&c, "Ready").is_some_and(|c| c.1 == "AwaitingApproval")
            && let Some(id) = id.filter(|id| Some(*id) != approved)
        {
            eprintln!("approving the follow-up plan {id}: {}", c["status"]["plan"]["summary"]);
            d.kubectl_ok(&["annotate", "cluster", "kube", "-n", NS_MANUAL, "--overwrite", &format!("provisioning.dev/approve={id}")])?;
        }
        Ok(condition(&c, "EndpointReady").is_some_and(|c| c.0 == "True") && condition(&c, "Ready").is_some_and(|c| c.0 == "True"))
    })?;
    let made = provisioning_e2e::simulated_endpoints(&dev.data_dir)?;
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].kind, "LoadBalancer");
    dev.kubectl_ok(&["delete", "cluster", "kube", "-n", NS_MANUAL, "--timeout=180s"])?;
    assert!(provisioning_e2e::simulated_endpoints(&dev.data_dir)?.is_empty(), "deleted with the Cluster");
    Ok(())
}

fn cluster_in(dev: &Dev, namespace: &str) -> Result<Value> {
    json(dev, &["get", "cluster", "kube", "-n", namespace])
}
