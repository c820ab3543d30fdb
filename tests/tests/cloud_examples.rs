//! The cloud examples end to end: `examples/aws/kubernetes-cluster.yaml` against the moto EC2
//! emulator and `examples/upcloud/kubernetes-cluster.yaml` against the UpCloud API 1.3 test
//! double, applied with one plain `kubectl apply -f DIR` and driven with the real kubectl.
//!
//! Each example is read from the repository and only pointed at the local emulator (the
//! account's `endpoint`, for moto an AMI it knows, test credentials in the Secret) before it is
//! applied, so the example itself is what is tested. The taskservs (containerd, kubernetes,
//! cilium) cannot run on emulated machines; what must hold is `ServersReady` on the Cluster,
//! one machine per Server at the emulator in the zone its pool gives it, each worker's data
//! disk, and nothing once the example is deleted — as a folder (`kubectl delete -f DIR`,
//! Namespace first) or with `kubectl delete namespace`: every kind of resource the emulator
//! keeps is listed after the teardown (moto: instances, volumes, security groups, network
//! interfaces, addresses, VPCs, subnets — only what the test made before applying is left;
//! the double: servers, storages, firewall rules — none). With bad
//! credentials the Workspace shows the account not ready with the cloud's message, the
//! Servers are Stalled, and no secret value shows up in the log, any status or any event.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::cloud::{
    Moto, Upcloud, assert_no_secret_anywhere, condition, docs_of_kind, get_json, read_yaml_docs, unique_secret, write_yaml_docs,
};
use serde_json::{Value, json};

const AWS_EXAMPLE: &str = "examples/aws/kubernetes-cluster.yaml";
const UPCLOUD_EXAMPLE: &str = "examples/upcloud/kubernetes-cluster.yaml";
/// An AMI id from moto's default set (moto boots nothing).
const MOTO_AMI: &str = "ami-1e749f67";
const AWS_REGION: &str = "eu-north-1";
const UPCLOUD_USER: &str = "e2e-api-user";

/// The example as users get it, with the emulator's endpoint and test credentials.
fn example_copy(
    example: &str,
    cloud: &str,
    dir: &Path,
    endpoint: &str,
    images: &[(&str, &str)],
    secret_values: &[(&str, &str)],
    moto_network: bool,
) -> Result<PathBuf> {
    let mut docs = read_yaml_docs(example)?;
    // Realistic as shipped: the account talks to the real cloud, the Secret holds placeholders.
    let mut accounts = 0;
    for ws in docs_of_kind(&mut docs, "Workspace") {
        for account in ws["spec"]["providers"].as_array_mut().context("spec.providers")? {
            ensure!(account["type"] == cloud, "{example}: account {account} is not of type {cloud}");
            ensure!(
                account.get("endpoint").is_none_or(|e| e == ""),
                "{example}: the example must use the real endpoint (none), found {}",
                account["endpoint"]
            );
            account["endpoint"] = json!(endpoint);
            for (image, native) in images {
                account["images"][*image] = json!(native);
            }
            accounts += 1;
        }
    }
    ensure!(accounts == 1, "{example}: expected one provider account, found {accounts}");
    if moto_network {
        // The example's zones, each mapped to a subnet made for it at moto (one VPC).
        provisioning_e2e::cloud::point_zone_subnets_at_moto(&mut docs, endpoint)?;
    }
    let mut secrets = 0;
    for secret in docs_of_kind(&mut docs, "Secret") {
        let data = secret["stringData"].as_object_mut().context("Secret stringData")?;
        for (key, value) in data.iter() {
            ensure!(value.as_str().is_some_and(|v| v.trim().starts_with('<')), "{example}: Secret key {key} is not a placeholder");
        }
        for (key, value) in secret_values {
            ensure!(data.contains_key(*key), "{example}: the Secret has no {key}");
            data.insert((*key).to_string(), json!(value));
        }
        secrets += 1;
    }
    ensure!(secrets == 1, "{example}: expected one Secret, found {secrets}");
    write_yaml_docs(dir, &format!("{cloud}-kubernetes-cluster.yaml"), &docs)
}

/// One plain `kubectl apply -f DIR` of the example's directory, as a GitOps tool applies it
/// on a fresh cluster: it must succeed the first time (the Namespace ships with the example).
fn apply_once(dev: &Dev, manifest: &Path) -> Result<()> {
    let dir = manifest.parent().context("the example copy's directory")?;
    dev.kubectl_ok(&["apply", "-f", &dir.display().to_string()])?;
    Ok(())
}

/// Waits for `ServersReady` on the Cluster `k8s` of `namespace` and checks its Servers: `count`,
/// Ready, each with a providerID, plans resolved as the example's pools say. Returns the
/// providerIDs.
fn servers_ready(dev: &mut Dev, namespace: &str, plans: (&str, &str), count: usize) -> Result<BTreeSet<String>> {
    dev.wait_until(Duration::from_secs(60), &format!("the Cluster's {count} Servers exist"), |d| {
        Ok(get_json(d, &["srv", "-n", namespace])?["items"].as_array().map_or(0, Vec::len) == count)
    })?;
    dev.kubectl_ok(&["wait", "--for=condition=ServersReady", "pcl/k8s", "-n", namespace, "--timeout=300s"])?;
    let cluster = get_json(dev, &["pcl", "k8s", "-n", namespace])?;
    let servers_ready = condition(&cluster, "ServersReady").context("ServersReady")?;
    ensure!(servers_ready["message"].as_str().is_some_and(|m| m.contains(&format!("{count}/{count}"))), "{servers_ready}");
    ensure!(cluster["status"]["servers"]["ready"] == count, "{}", cluster["status"]);
    let servers = get_json(dev, &["srv", "-n", namespace])?;
    let mut ids = BTreeSet::new();
    for server in servers["items"].as_array().context("items")? {
        let name = server["metadata"]["name"].as_str().unwrap_or_default();
        ensure!(condition(server, "Ready").is_some_and(|c| c["status"] == "True"), "Server {name} not Ready: {}", server["status"]);
        let id = server["status"]["providerID"].as_str().filter(|s| !s.is_empty()).context("providerID")?;
        ids.insert(id.to_string());
        let pool = server["metadata"]["labels"]["provisioning.dev/pool"].as_str().unwrap_or_default();
        let want = if name.contains("control-plane") { plans.0 } else { plans.1 };
        ensure!(server["status"]["resolvedPlan"] == want, "Server {name} (pool {pool}): resolvedPlan {}", server["status"]["resolvedPlan"]);
    }
    ensure!(ids.len() == count, "{count} distinct machines: {ids:?}");
    // The Workspace's account check runs in its own reconcile (re-triggered when its Secret
    // appears), so it may finish a moment after the Servers.
    dev.wait_until(Duration::from_secs(60), "the Workspace's provider account is ready", |d| {
        let ws = get_json(d, &["ws", namespace])?;
        Ok(ws["status"]["providers"][0]["ready"] == true)
    })?;
    Ok(ids)
}

/// Each Server of `namespace` with the zone its machine was made in (`status.zone`), sorted.
fn member_zones(dev: &Dev, namespace: &str) -> Result<Vec<(String, String)>> {
    let servers = get_json(dev, &["srv", "-n", namespace])?;
    let mut zones: Vec<(String, String)> = servers["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|s| {
            (s["metadata"]["name"].as_str().unwrap_or_default().to_string(), s["status"]["zone"].as_str().unwrap_or_default().to_string())
        })
        .collect();
    zones.sort();
    Ok(zones)
}

/// How a user takes the example down.
#[derive(Clone, Copy, Debug)]
enum Teardown {
    /// `kubectl delete -f DIR`: kubectl deletes in file order, the Namespace first (as Argo CD's
    /// prune and Flux's garbage collection do), so the credentials Secret and the RoleBinding
    /// that lets the controller read it go at once with everything else.
    Folder,
    /// `kubectl delete namespace NS`.
    Namespace,
}

/// Takes the example down as `how` says and waits until the namespace it created is gone and
/// `machines()` reports none left at the emulator: the Servers must be deleted at the cloud
/// with the credentials of a Secret that is being deleted in the same breath. (After a
/// namespace deletion the Workspace, cluster-scoped, creates its namespace again, empty; the
/// test then deletes the Workspace.)
fn teardown(dev: &mut Dev, how: Teardown, manifest: &Path, namespace: &str, mut machines: impl FnMut() -> Result<usize>) -> Result<()> {
    let uid = get_json(dev, &["namespace", namespace])?["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    match how {
        Teardown::Folder => {
            let dir = manifest.parent().context("the example copy's directory")?;
            dev.kubectl_ok(&["delete", "-f", &dir.display().to_string(), "--wait=false"])?;
        }
        Teardown::Namespace => {
            dev.kubectl_ok(&["delete", "namespace", namespace, "--wait=false"])?;
        }
    }
    let mut last = usize::MAX;
    dev.wait_until(Duration::from_secs(180), &format!("namespace {namespace} (uid {uid}) gone after {how:?} teardown"), |d| {
        last = machines()?;
        let out = d.kubectl(&["get", "namespace", namespace, "--ignore-not-found", "-o", "jsonpath={.metadata.uid}"])?;
        Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() != uid)
    })
    .with_context(|| format!("{last} machine(s) at the emulator"))?;
    last = machines()?;
    ensure!(last == 0, "{how:?} teardown finished with {last} machine(s) left at the emulator");
    if matches!(how, Teardown::Namespace) {
        dev.kubectl_ok(&["delete", "ws", namespace, "--timeout=60s"])?;
    }
    let workspace = dev.kubectl(&["get", "ws", namespace, "--ignore-not-found", "-o", "name"])?;
    ensure!(String::from_utf8_lossy(&workspace.stdout).trim().is_empty(), "Workspace {namespace} still exists");
    Ok(())
}

#[test]
fn aws_kubernetes_example_reaches_servers_ready_and_deletes_cleanly_as_a_folder() -> Result<()> {
    aws_example(Teardown::Folder)
}

#[test]
fn aws_kubernetes_example_deletes_cleanly_with_its_namespace() -> Result<()> {
    aws_example(Teardown::Namespace)
}

/// The AWS example against its own moto and control plane, taken down as `how` says.
fn aws_example(how: Teardown) -> Result<()> {
    let moto = Moto::start(&[])?;
    let tmp = tempfile::tempdir()?;
    let secret_key = unique_secret("aws-secret-key");
    let ssh_key = unique_secret("ssh-key");
    let manifest = example_copy(
        AWS_EXAMPLE,
        "aws",
        tmp.path(),
        &moto.endpoint,
        &[("debian-12", MOTO_AMI)],
        &[("AWS_ACCESS_KEY_ID", "AKIAE2ETEST000000001"), ("AWS_SECRET_ACCESS_KEY", &secret_key), ("SSH_PRIVATE_KEY", &ssh_key)],
        true,
    )?;
    // What the account holds before the example: moto's default VPC with its subnets and
    // `default` group, and the VPC and subnets made above for the example's zones.
    let before = moto.inventory(AWS_REGION)?;
    let mut dev = Dev::start_allowing_insecure_endpoints(&[])?;
    apply_once(&dev, &manifest)?;

    // One control-plane machine and three workers, one per zone.
    let ids = servers_ready(&mut dev, "k8s-aws", ("t3.medium", "t3.large"), 4)?;
    let zones = member_zones(&dev, "k8s-aws")?;
    let want = [
        ("k8s-control-plane-0", "eu-north-1a"),
        ("k8s-workers-0", "eu-north-1a"),
        ("k8s-workers-1", "eu-north-1b"),
        ("k8s-workers-2", "eu-north-1c"),
    ];
    ensure!(zones.iter().map(|(n, z)| (n.as_str(), z.as_str())).eq(want), "members spread over the zones: {zones:?}");
    let live = moto.live_instances(AWS_REGION)?;
    let at_moto: BTreeSet<String> = live.iter().map(|o| o.provider_id.0.clone()).collect();
    ensure!(at_moto == ids, "machines at moto {at_moto:?} != providerIDs {ids:?}");
    for machine in &live {
        ensure!(machine.tags.get("provisioning.dev/namespace").map(String::as_str) == Some("k8s-aws"), "{:?}", machine.tags);
        ensure!(machine.tags.get("provisioning.dev/cluster").map(String::as_str) == Some("k8s"), "{:?}", machine.tags);
    }
    // The machines share the security group the controller manages for the account.
    ensure!(moto.managed_groups(AWS_REGION, "aws-eu")? == 1, "one managed security group for the account");
    // Each worker has its `data` disk: a 100 GiB gp3 volume tagged with the disk's name.
    let disks = moto.disk_volumes(AWS_REGION)?;
    ensure!(disks == vec![(100, "gp3".to_string()); 3], "one 100 GiB gp3 volume per worker: {disks:?}");
    // The control-plane endpoint: one Elastic IP, on the control-plane machine.
    let control_plane = get_json(&dev, &["srv", "k8s-control-plane-0", "-n", "k8s-aws"])?["status"]["providerID"].clone();
    dev.wait_until(Duration::from_secs(60), "the Elastic IP is on the control plane", |d| {
        let cluster = get_json(d, &["pcl", "k8s", "-n", "k8s-aws"])?;
        let endpoint = &cluster["status"]["controlPlaneEndpoint"];
        Ok(endpoint["type"] == "FloatingIP" && endpoint["targets"] == json!([control_plane]) && endpoint["address"].is_string())
    })?;
    ensure!(provisioning_e2e::cloud::moto_addresses(&moto.endpoint, AWS_REGION)? == 1, "one Elastic IP at moto");
    assert_no_secret_anywhere(&dev, &[&secret_key, &ssh_key])?;

    // Nothing left: no machine, no disk volume (deletionPolicy Delete), no Elastic IP and no
    // managed security group (deleted with the last machine).
    let during = moto.inventory(AWS_REGION)?;
    // moto makes a root volume only for an instance launched without a BlockDeviceMapping:
    // the control-plane machine's, then the workers' three data disks.
    ensure!(during.volumes.len() == before.volumes.len() + 4, "a root volume and 3 data disks at moto: {during:?}");
    ensure!(during.security_groups.len() == before.security_groups.len() + 1, "{during:?}");
    teardown(&mut dev, how, &manifest, "k8s-aws", || {
        Ok(moto.live_instances(AWS_REGION)?.len()
            + moto.disk_volumes(AWS_REGION)?.len()
            + moto.managed_groups(AWS_REGION, "aws-eu")?
            + provisioning_e2e::cloud::moto_addresses(&moto.endpoint, AWS_REGION)?)
    })?;
    // Every kind the account can hold, listed: only what was there before the example is left
    // (no instance, volume, group, network interface or address of the example's).
    let after = moto.inventory(AWS_REGION)?;
    for (kind, was, is) in [
        ("instances", &before.instances, &after.instances),
        ("volumes", &before.volumes, &after.volumes),
        ("security groups", &before.security_groups, &after.security_groups),
        ("network interfaces", &before.network_interfaces, &after.network_interfaces),
        ("addresses", &before.addresses, &after.addresses),
        ("VPCs", &before.vpcs, &after.vpcs),
        ("subnets", &before.subnets, &after.subnets),
    ] {
        ensure!(was == is, "{how:?} teardown left {kind} at moto: before the example {was:?}, after {is:?}");
    }
    ensure!(
        after.instances.is_empty() && after.volumes.is_empty() && after.network_interfaces.is_empty() && after.addresses.is_empty(),
        "nothing that costs money is left: {after:?}"
    );
    assert_no_secret_anywhere(&dev, &[&secret_key, &ssh_key])?;
    Ok(())
}

#[test]
fn upcloud_kubernetes_example_reaches_servers_ready_and_deletes_cleanly_with_its_namespace() -> Result<()> {
    upcloud_example(Teardown::Namespace)
}

#[test]
fn upcloud_kubernetes_example_deletes_cleanly_as_a_folder() -> Result<()> {
    upcloud_example(Teardown::Folder)
}

/// The UpCloud example against its own API double and control plane, taken down as `how` says.
fn upcloud_example(how: Teardown) -> Result<()> {
    let password = unique_secret("upcloud-password");
    let ssh_key = unique_secret("ssh-key");
    let upcloud = Upcloud::start(UPCLOUD_USER, &password)?;
    let tmp = tempfile::tempdir()?;
    let manifest = example_copy(
        UPCLOUD_EXAMPLE,
        "upcloud",
        tmp.path(),
        upcloud.endpoint(),
        &[],
        &[("UPCLOUD_USERNAME", UPCLOUD_USER), ("UPCLOUD_PASSWORD", &password), ("SSH_PRIVATE_KEY", &ssh_key)],
        false,
    )?;
    let mut dev = Dev::start_allowing_insecure_endpoints(&[])?;
    apply_once(&dev, &manifest)?;

    // One control-plane server and three workers, one per zone.
    let ids = servers_ready(&mut dev, "k8s-upcloud", ("2xCPU-4GB", "4xCPU-8GB"), 4)?;
    let zones = member_zones(&dev, "k8s-upcloud")?;
    let want =
        [("k8s-control-plane-0", "fi-hel1"), ("k8s-workers-0", "fi-hel1"), ("k8s-workers-1", "fi-hel2"), ("k8s-workers-2", "se-sto1")];
    ensure!(zones.iter().map(|(n, z)| (n.as_str(), z.as_str())).eq(want), "members spread over the zones: {zones:?}");
    let at_double = upcloud.double.server_states();
    ensure!(at_double.len() == 4, "{} servers at the double: {at_double:?}", at_double.len());
    ensure!(at_double.values().all(|state| state == "started"), "{at_double:?}");
    for id in &ids {
        ensure!(at_double.keys().any(|uuid| id.ends_with(uuid.as_str())), "providerID {id} names no server at the double: {at_double:?}");
    }
    let mut double_zones: Vec<String> = upcloud.double.server_zones().into_values().collect();
    double_zones.sort();
    ensure!(double_zones == ["fi-hel1", "fi-hel1", "fi-hel2", "se-sto1"], "zones at the double: {double_zones:?}");
    // Each server's boot disk, and each worker's `data` disk: a 100 GiB MaxIOPS storage.
    let storages = upcloud.double.storages();
    let data: Vec<_> = storages.iter().filter(|(title, ..)| title.starts_with("data-")).collect();
    ensure!(
        data.len() == 3 && data.iter().all(|(_, size, tier)| *size == 100 && tier == "maxiops"),
        "one data disk per worker: {storages:?}"
    );
    ensure!(storages.len() == 7, "4 boot disks and 3 data disks: {storages:?}");
    // The control-plane endpoint: one floating IP, on the control-plane server, its address in
    // status (and not among the server's own addresses).
    let control_plane = get_json(&dev, &["srv", "k8s-control-plane-0", "-n", "k8s-upcloud"])?["status"]["providerID"].clone();
    dev.wait_until(Duration::from_secs(60), "the floating IP is on the control plane", |d| {
        let cluster = get_json(d, &["pcl", "k8s", "-n", "k8s-upcloud"])?;
        let endpoint = &cluster["status"]["controlPlaneEndpoint"];
        Ok(endpoint["type"] == "FloatingIP" && endpoint["targets"] == json!([control_plane]) && endpoint["address"].is_string())
    })?;
    let cluster = get_json(&dev, &["pcl", "k8s", "-n", "k8s-upcloud"])?;
    let address = cluster["status"]["controlPlaneEndpoint"]["address"].as_str().unwrap_or_default().to_string();
    let floating = upcloud.double.floating_ips();
    let holder = control_plane.as_str().and_then(|id| id.strip_prefix("upcloud://")).map(str::to_string);
    ensure!(floating.len() == 1 && floating.get(&address) == Some(&holder), "one floating IP {address} on {holder:?}: {floating:?}");
    let server = get_json(&dev, &["srv", "k8s-control-plane-0", "-n", "k8s-upcloud"])?;
    ensure!(!server["status"]["addresses"].to_string().contains(&format!("\"{address}\"")), "the floating IP is the Cluster's: {server}");
    ensure!(
        cluster["status"]["controlPlaneEndpoint"]["cost"]["currency"] == "EUR",
        "priced: {}",
        cluster["status"]["controlPlaneEndpoint"]
    );
    assert_no_secret_anywhere(&dev, &[&password, &ssh_key])?;

    // Everything the double keeps — servers, storages (attached or not), servers' firewall
    // rules, IP addresses (floating ones: the others go with their servers) — counted while
    // the example is taken down.
    let left =
        || upcloud.double.server_count() + upcloud.double.storage_count() + firewall_rules(&upcloud) + upcloud.double.floating_ips().len();
    teardown(&mut dev, how, &manifest, "k8s-upcloud", || Ok(left()))?;
    // Each kind listed: nothing is left (the example retains no disk).
    let (servers, storages) = (upcloud.double.server_states(), upcloud.double.storages());
    ensure!(servers.is_empty(), "{how:?} teardown left servers at the double: {servers:?}");
    ensure!(storages.is_empty(), "{how:?} teardown left storages at the double: {storages:?}");
    ensure!(firewall_rules(&upcloud) == 0, "{how:?} teardown left firewall rules: {:?}", upcloud.double.firewalls());
    ensure!(upcloud.double.floating_ips().is_empty(), "{how:?} teardown left IP addresses: {:?}", upcloud.double.floating_ips());
    assert_no_secret_anywhere(&dev, &[&password, &ssh_key])?;
    Ok(())
}

/// Firewall rules of every server at the double.
fn firewall_rules(upcloud: &Upcloud) -> usize {
    upcloud.double.firewalls().values().map(|(_, rules)| rules.len()).sum()
}

/// Waits until the Workspace `name` reports its one account not ready, and returns the
/// account's message.
fn account_refused(dev: &mut Dev, name: &str) -> Result<String> {
    let mut message = String::new();
    dev.wait_until(Duration::from_secs(120), &format!("Workspace {name}: account not ready"), |d| {
        // Not there yet while `provisioning dev --apply` is still applying.
        let Ok(ws) = get_json(d, &["ws", name]) else { return Ok(false) };
        let account = &ws["status"]["providers"][0];
        message = account["message"].as_str().unwrap_or_default().to_string();
        Ok(account["ready"] == false && !message.is_empty())
    })?;
    let ws = get_json(dev, &["ws", name])?;
    let providers = ws["status"]["providers"].as_array().context("status.providers")?;
    ensure!(providers.len() == 1, "{providers:?}");
    let stalled = condition(&ws, "Stalled").context("Stalled")?;
    ensure!(stalled["status"] == "True", "Workspace {name}: {stalled}");
    ensure!(
        stalled["message"].as_str().is_some_and(|m| m.contains(&message)),
        "the Stalled condition carries the cloud's message: {stalled}"
    );
    ensure!(condition(&ws, "Ready").is_some_and(|c| c["status"] == "False"), "{}", ws["status"]);
    Ok(message)
}

/// Waits until the Cluster's `count` Servers in `namespace` are Stalled, none with a machine.
fn servers_stalled(dev: &mut Dev, namespace: &str, count: usize) -> Result<Vec<Value>> {
    dev.wait_until(Duration::from_secs(120), &format!("the Servers of {namespace} are Stalled"), |d| {
        let servers = get_json(d, &["srv", "-n", namespace])?;
        let items = servers["items"].as_array().cloned().unwrap_or_default();
        Ok(items.len() == count && items.iter().all(|s| condition(s, "Stalled").is_some_and(|c| c["status"] == "True")))
    })?;
    let servers = get_json(dev, &["srv", "-n", namespace])?;
    let items = servers["items"].as_array().cloned().unwrap_or_default();
    for s in &items {
        ensure!(s["status"]["providerID"].is_null(), "no machine for a refused account: {}", s["status"]);
    }
    Ok(items)
}

#[test]
fn bad_credentials_stall_with_the_clouds_message_and_no_secret_leaks() -> Result<()> {
    // moto checks credentials only with INITIAL_NO_AUTH_ACTION_COUNT=0: unknown keys are refused.
    let moto = Moto::start(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")])?;
    let upcloud = Upcloud::start(UPCLOUD_USER, "the-right-password")?;
    let aws_secret = unique_secret("bad-aws-secret-key");
    let upcloud_password = unique_secret("bad-upcloud-password");
    let ssh_key = unique_secret("ssh-key");
    let tmp = tempfile::tempdir()?;
    let aws = example_copy(
        AWS_EXAMPLE,
        "aws",
        tmp.path(),
        &moto.endpoint,
        &[("debian-12", MOTO_AMI)],
        &[("AWS_ACCESS_KEY_ID", "AKIAE2EUNKNOWNKEY001"), ("AWS_SECRET_ACCESS_KEY", &aws_secret), ("SSH_PRIVATE_KEY", &ssh_key)],
        // Refused before any subnet is looked at: the example's placeholder subnets stay.
        false,
    )?;
    let up = example_copy(
        UPCLOUD_EXAMPLE,
        "upcloud",
        tmp.path(),
        upcloud.endpoint(),
        &[],
        &[("UPCLOUD_USERNAME", UPCLOUD_USER), ("UPCLOUD_PASSWORD", &upcloud_password), ("SSH_PRIVATE_KEY", &ssh_key)],
        false,
    )?;
    let (aws, up) = (aws.display().to_string(), up.display().to_string());
    let mut dev = Dev::start_allowing_insecure_endpoints(&[&aws, &up])?;

    let aws_message = account_refused(&mut dev, "k8s-aws")?;
    ensure!(aws_message.contains("AuthFailure"), "AWS's own message: {aws_message}");
    let upcloud_message = account_refused(&mut dev, "k8s-upcloud")?;
    ensure!(upcloud_message.contains("AUTHENTICATION_FAILED"), "UpCloud's own message: {upcloud_message}");

    for (namespace, count) in [("k8s-aws", 4), ("k8s-upcloud", 4)] {
        for server in servers_stalled(&mut dev, namespace, count)? {
            let stalled = condition(&server, "Stalled").cloned().unwrap_or_default();
            ensure!(stalled["message"].as_str().is_some_and(|m| !m.is_empty()), "{stalled}");
        }
        let cluster = get_json(&dev, &["pcl", "k8s", "-n", namespace])?;
        ensure!(condition(&cluster, "ServersReady").is_some_and(|c| c["status"] != "True"), "{}", cluster["status"]);
    }
    ensure!(upcloud.double.server_count() == 0, "no server created with refused credentials");

    // A refused account costs at most one call per backoff step, not one per reconcile.
    let before = upcloud.requests();
    std::thread::sleep(Duration::from_secs(10));
    let during = upcloud.requests() - before;
    ensure!(during <= 2, "{during} calls to the UpCloud API within 10 s of a refused account");

    // The refusal is visible where users look: Warning events carrying the cloud's message
    // (which also shows the secret check below read real events).
    for (namespace, message) in [("k8s-aws", "AuthFailure"), ("k8s-upcloud", "AUTHENTICATION_FAILED")] {
        let events = get_json(&dev, &["events.events.k8s.io", "-n", namespace])?;
        let warned = events["items"].as_array().is_some_and(|items| {
            items.iter().any(|e| {
                e["type"] == "Warning" && e["regarding"]["kind"] == "Server" && e["note"].as_str().is_some_and(|n| n.contains(message))
            })
        });
        ensure!(warned, "no Warning event on a Server of {namespace} carries {message:?}: {events}");
    }
    eprintln!("aws: {aws_message}\nupcloud: {upcloud_message}");
    assert_no_secret_anywhere(&dev, &[&aws_secret, &upcloud_password, &ssh_key])?;
    Ok(())
}
