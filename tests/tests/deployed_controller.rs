//! The shipped `deploy/` run for real: the embedded control plane (`provisioning apiserver`),
//! `kubectl apply -k deploy/`, a token for the controller's ServiceAccount from the
//! TokenRequest API, and the built image (scripts/build-image.sh) run in Docker exactly as
//! the Deployment's pod spec says. Every docker flag is derived from `kubectl kustomize
//! deploy/` read as a k8s-openapi Deployment, so a change to deploy/ that a cluster would not
//! run (a wrong port, a missing volume, a root filesystem the process writes to, a memory limit
//! too small) fails here.
//!
//! What a kubelet does and this test does instead: the pod network is Docker's bridge (the
//! control plane and moto listen on the bridge's gateway address, which is this host, so the
//! containers reach them as pods reach the API server's Service; the serving certificate covers
//! the listen address); emptyDir volumes are tmpfs; the ConfigMap is written to a directory
//! mounted read-only at its mountPath; the projected ServiceAccount token, ca.crt and namespace
//! are files mounted at /var/run/secrets/kubernetes.io/serviceaccount; probes are HTTP GETs on
//! the container's address.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, HTTPGetAction, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use provisioning_e2e::cloud::{docs_of_kind, read_yaml_docs, unique_secret, write_yaml_docs};
use provisioning_e2e::{kubectl_bin, kubectl_command, provisioning_bin, tool, workspace_root};
use serde_json::{Value, json};

const NAMESPACE: &str = "provisioning-system";
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const MOTO_AMI: &str = "ami-1e749f67";

fn docker() -> PathBuf {
    tool("PROVISIONING_DOCKER", "docker")
}

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    Ok(out)
}

fn run_ok(cmd: &mut Command) -> Result<String> {
    let out = run(cmd)?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for `check` to hold, polling every 500 ms, failing after `deadline`.
fn wait_until(deadline: Duration, what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let start = Instant::now();
    let mut last_error = String::new();
    loop {
        match check() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) => last_error = format!("{e:#}"),
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what} (last error: {last_error})");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The address of Docker's default bridge on this host: what containers reach the host at.
/// The engine names it as the gateway, or (older engines) only the subnet, whose first
/// address the bridge takes.
fn bridge_gateway() -> Result<String> {
    let out = run_ok(Command::new(docker()).args(["network", "inspect", "bridge", "-f", "{{json .IPAM.Config}}"]))?;
    let config: Value = serde_json::from_str(out.trim()).with_context(|| format!("IPAM config {out:?}"))?;
    let first = config.get(0).with_context(|| format!("no IPAM config on Docker's bridge network: {out}"))?;
    if let Some(gateway) = first["Gateway"].as_str().filter(|g| !g.is_empty()) {
        return Ok(gateway.to_string());
    }
    let subnet = first["Subnet"].as_str().with_context(|| format!("no subnet on Docker's bridge network: {out}"))?;
    let network: std::net::Ipv4Addr = subnet.split('/').next().unwrap_or_default().parse().with_context(|| format!("subnet {subnet}"))?;
    Ok(std::net::Ipv4Addr::from(u32::from(network) + 1).to_string())
}

/// `provisioning apiserver` on a free port of `host`, in a temp data dir.
struct ControlPlane {
    child: Child,
    kubeconfig: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ControlPlane {
    fn start(host: &str) -> Result<ControlPlane> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("apiserver.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(provisioning_bin())
            .args(["apiserver", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--listen")
            .arg(format!("{host}:0"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("spawn provisioning apiserver")?;
        let mut plane = ControlPlane { child, kubeconfig: PathBuf::new(), log, _dir: dir };
        wait_until(Duration::from_secs(60), "the apiserver's kubeconfig", || {
            let text = std::fs::read_to_string(&plane.log)?;
            if let Some(path) = text.lines().find_map(|l| l.strip_prefix("kubeconfig: ")) {
                plane.kubeconfig = PathBuf::from(path.trim());
                return Ok(plane.kubeconfig.exists());
            }
            if let Some(status) = plane.child.try_wait()? {
                bail!("apiserver exited ({status}):\n{text}");
            }
            Ok(false)
        })?;
        wait_until(Duration::from_secs(60), "the API answering", || Ok(plane.kubectl(&["get", "--raw", "/readyz"])?.status.success()))?;
        Ok(plane)
    }

    fn kubectl(&self, args: &[&str]) -> Result<Output> {
        run(kubectl_command(&self.kubeconfig).args(args))
    }

    fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        run_ok(kubectl_command(&self.kubeconfig).args(args))
    }

    /// The API server's URL and CA bundle (PEM), from the admin kubeconfig.
    fn server_and_ca(&self) -> Result<(String, Vec<u8>)> {
        let server = self.kubectl_ok(&["config", "view", "--raw", "-o", "jsonpath={.clusters[0].cluster.server}"])?;
        let ca = self.kubectl_ok(&["config", "view", "--raw", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}"])?;
        let ca = base64::engine::general_purpose::STANDARD.decode(ca.trim()).context("certificate-authority-data")?;
        Ok((server.trim().to_string(), ca))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto_server on a free port of `host` (the bridge gateway, so the containers reach it).
struct MotoOnBridge {
    child: Child,
    endpoint: String,
}

impl MotoOnBridge {
    fn start(host: &str) -> Result<MotoOnBridge> {
        let port = std::net::TcpListener::bind((host, 0))?.local_addr()?.port();
        let child = Command::new(tool("PROVISIONING_MOTO", "moto_server"))
            .args(["-H", host, "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn moto_server")?;
        let moto = MotoOnBridge { child, endpoint: format!("http://{host}:{port}/") };
        let addr: std::net::SocketAddr = format!("{host}:{port}").parse()?;
        wait_until(Duration::from_secs(60), "moto listening", || Ok(std::net::TcpStream::connect(addr).is_ok()))?;
        Ok(moto)
    }
}

impl Drop for MotoOnBridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kubectl kustomize deploy/`, parsed.
fn rendered_deploy() -> Result<Vec<Value>> {
    let text = run_ok(Command::new(kubectl_bin()).arg("kustomize").arg(workspace_root().join("deploy")))?;
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// A Kubernetes memory quantity in bytes (`512Mi`, `1Gi`, `500M`, `1000000`).
fn memory_bytes(quantity: &str) -> Result<u64> {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return Ok(number.parse::<u64>().with_context(|| format!("memory quantity {quantity}"))? * factor);
        }
    }
    quantity.parse::<u64>().with_context(|| format!("memory quantity {quantity}"))
}

/// One replica of the Deployment's pod, as docker arguments.
struct PodRun {
    name: String,
    args: Vec<String>,
    _files: tempfile::TempDir,
}

/// Translates the pod spec into `docker run` arguments for the pod `pod_name`. Anything in the
/// spec this translation does not know is an error (so the test cannot silently drift).
/// What the kubelet hands a pod to reach the API server.
struct InCluster {
    /// The ServiceAccount token.
    token: String,
    /// The CA bundle (ca.crt).
    ca: Vec<u8>,
    /// KUBERNETES_SERVICE_HOST.
    host: String,
    /// KUBERNETES_SERVICE_PORT.
    port: u16,
}

fn docker_run_args(
    pod: &PodSpec,
    pod_name: &str,
    config_maps: &BTreeMap<String, ConfigMap>,
    api: &InCluster,
    label: &str,
) -> Result<PodRun> {
    ensure!(pod.containers.len() == 1, "one container expected, found {}", pod.containers.len());
    ensure!(pod.init_containers.as_ref().is_none_or(Vec::is_empty), "init containers are not run by this test");
    let container: &Container = &pod.containers[0];
    let files = tempfile::tempdir()?;
    let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), pod_name.into(), "--label".into(), label.into()];
    args.extend(["--hostname".into(), pod_name.into()]);

    // Security context: the container's fields override the pod's.
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    let sc = container.security_context.clone().unwrap_or_default();
    let uid = sc.run_as_user.or(pod_sc.run_as_user);
    let gid = sc.run_as_group.or(pod_sc.run_as_group);
    if sc.run_as_non_root.or(pod_sc.run_as_non_root) == Some(true) {
        ensure!(uid.is_some_and(|u| u != 0), "runAsNonRoot needs a non-zero runAsUser (the kubelet checks the image's user otherwise)");
    }
    match (uid, gid) {
        (Some(u), Some(g)) => args.extend(["--user".into(), format!("{u}:{g}")]),
        (Some(u), None) => args.extend(["--user".into(), u.to_string()]),
        (None, _) => {}
    }
    if let Some(fs_group) = pod_sc.fs_group {
        args.extend(["--group-add".into(), fs_group.to_string()]);
    }
    for g in pod_sc.supplemental_groups.iter().flatten() {
        args.extend(["--group-add".into(), g.to_string()]);
    }
    if sc.read_only_root_filesystem == Some(true) {
        args.push("--read-only".into());
    }
    if sc.allow_privilege_escalation == Some(false) {
        args.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    ensure!(sc.privileged != Some(true), "privileged containers are not run by this test");
    if let Some(caps) = &sc.capabilities {
        for c in caps.drop.iter().flatten() {
            args.extend(["--cap-drop".into(), c.clone()]);
        }
        for c in caps.add.iter().flatten() {
            args.extend(["--cap-add".into(), c.clone()]);
        }
    }
    if let Some(limits) = container.resources.as_ref().and_then(|r| r.limits.as_ref()) {
        if let Some(memory) = limits.get("memory") {
            args.extend(["--memory".into(), memory_bytes(&memory.0)?.to_string()]);
        }
        if let Some(cpu) = limits.get("cpu") {
            let cpus = match cpu.0.strip_suffix('m') {
                Some(milli) => milli.parse::<f64>()? / 1000.0,
                None => cpu.0.parse::<f64>()?,
            };
            args.extend(["--cpus".into(), cpus.to_string()]);
        }
    }

    // Environment: literal values and the downward API fields the kubelet fills in.
    args.extend([
        "-e".into(),
        format!("KUBERNETES_SERVICE_HOST={}", api.host),
        "-e".into(),
        format!("KUBERNETES_SERVICE_PORT={}", api.port),
    ]);
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => {
                let field = from.field_ref.as_ref().map(|f| f.field_path.as_str());
                match field {
                    Some("metadata.name") => pod_name.to_string(),
                    Some("metadata.namespace") => NAMESPACE.to_string(),
                    other => bail!("env {}: valueFrom {other:?} is not supported by this test", var.name),
                }
            }
            (None, None) => String::new(),
            (Some(_), Some(_)) => bail!("env {}: both value and valueFrom", var.name),
        };
        args.extend(["-e".into(), format!("{}={value}", var.name)]);
    }
    ensure!(container.env_from.as_ref().is_none_or(Vec::is_empty), "envFrom is not supported by this test");

    // Volumes.
    let volumes: BTreeMap<String, _> = pod.volumes.iter().flatten().map(|v| (v.name.clone(), v.clone())).collect();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes.get(&mount.name).with_context(|| format!("volumeMount {} names no volume", mount.name))?;
        let read_only = mount.read_only == Some(true);
        ensure!(mount.sub_path.is_none(), "subPath mounts are not supported by this test");
        if let Some(source) = &volume.config_map {
            let cm = config_maps.get(&source.name).with_context(|| format!("volume {}: no ConfigMap {}", mount.name, source.name))?;
            let dir = files.path().join(&mount.name);
            std::fs::create_dir_all(&dir)?;
            for (key, value) in cm.data.iter().flatten() {
                std::fs::write(dir.join(key), value)?;
            }
            set_world_readable(&dir)?;
            args.extend(["-v".into(), format!("{}:{}:{}", dir.display(), mount.mount_path, if read_only { "ro" } else { "rw" })]);
        } else if let Some(empty) = &volume.empty_dir {
            // An emptyDir is writable by the pod (mode 0777, group fsGroup). This engine
            // ignores tmpfs `mode=`, so the mount is owned by the pod's user and group.
            let owner_gid = pod_sc.fs_group.or(gid).unwrap_or(0);
            let mut options = format!("rw,exec,uid={},gid={owner_gid}", uid.unwrap_or(0));
            if let Some(limit) = &empty.size_limit {
                options.push_str(&format!(",size={}", memory_bytes(&limit.0)?));
            }
            args.extend(["--tmpfs".into(), format!("{}:{options}", mount.mount_path)]);
        } else {
            bail!("volume {}: only configMap and emptyDir volumes are supported by this test", mount.name);
        }
    }

    // The ServiceAccount token, as the kubelet projects it.
    if pod.automount_service_account_token != Some(false) {
        let sa = files.path().join("serviceaccount");
        std::fs::create_dir_all(&sa)?;
        std::fs::write(sa.join("token"), &api.token)?;
        std::fs::write(sa.join("ca.crt"), &api.ca)?;
        std::fs::write(sa.join("namespace"), NAMESPACE)?;
        set_world_readable(&sa)?;
        args.extend(["-v".into(), format!("{}:{SERVICE_ACCOUNT_DIR}:ro", sa.display())]);
    }

    // Image, command (ENTRYPOINT) and args (CMD).
    let image = container.image.clone().context("the container has no image")?;
    let command = container.command.clone().unwrap_or_default();
    if let Some((entrypoint, rest)) = command.split_first() {
        args.extend(["--entrypoint".into(), entrypoint.clone(), image]);
        args.extend(rest.iter().cloned());
    } else {
        args.push(image);
    }
    args.extend(container.args.iter().flatten().cloned());
    Ok(PodRun { name: pod_name.to_string(), args, _files: files })
}

/// The mounted files are read by uid 65532, not by the test's user.
fn set_world_readable(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(dir)? {
        std::fs::set_permissions(entry?.path(), std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// Containers this test started (removed on drop, also when the test fails).
struct Replicas {
    runs: Vec<PodRun>,
    label: String,
}

impl Replicas {
    fn logs(&self, name: &str) -> String {
        match run(Command::new(docker()).args(["logs", name])) {
            Ok(out) => format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
            Err(e) => format!("(no logs: {e})"),
        }
    }

    fn ip(&self, name: &str) -> Result<String> {
        let out = run_ok(Command::new(docker()).args(["inspect", "-f", "{{.NetworkSettings.IPAddress}}", name]))?;
        let ip = out.trim().to_string();
        ensure!(!ip.is_empty(), "container {name} has no address (not running?)\n{}", self.logs(name));
        Ok(ip)
    }

    fn running(&self, name: &str) -> bool {
        run_ok(Command::new(docker()).args(["inspect", "-f", "{{.State.Running}}", name])).is_ok_and(|o| o.trim() == "true")
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        let _ = run(Command::new(docker()).args(["rm", "-f"]).args(self.runs.iter().map(|r| r.name.as_str())));
        let _ = run(Command::new(docker()).args(["container", "prune", "-f", "--filter", &format!("label={}", self.label)]));
    }
}

/// An HTTP GET of `path` on `ip:port`; the status code.
fn http_get(ip: &str, port: u16, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&format!("{ip}:{port}").parse()?, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response.split_whitespace().nth(1).context("no status line")?.parse()?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok((code, body))
}

/// The port and path a probe's httpGet names, resolving a named port through the container.
fn probe_target(container: &Container, probe: &HTTPGetAction) -> Result<(u16, String)> {
    let port = match &probe.port {
        IntOrString::Int(p) => *p,
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .with_context(|| format!("probe port {name} is not a container port"))?,
    };
    ensure!(probe.scheme.as_deref().is_none_or(|s| s == "HTTP"), "only HTTP probes are supported by this test");
    Ok((u16::try_from(port)?, probe.path.clone().unwrap_or_else(|| "/".into())))
}

/// The holder of the controller's Lease.
fn lease_holder(plane: &ControlPlane) -> Result<String> {
    let out = plane.kubectl(&["get", "lease", "provisioning-controller", "-n", NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}"])?;
    Ok(if out.status.success() { String::from_utf8_lossy(&out.stdout).trim().to_string() } else { String::new() })
}

/// The AWS example pointed at moto (endpoint, an AMI moto knows, test credentials), written
/// into a directory of its own; returns the directory.
fn aws_example(dir: &Path, endpoint: &str) -> Result<PathBuf> {
    let mut docs = read_yaml_docs("examples/aws/kubernetes-cluster.yaml")?;
    for ws in docs_of_kind(&mut docs, "Workspace") {
        for account in ws["spec"]["providers"].as_array_mut().context("spec.providers")? {
            account["endpoint"] = json!(endpoint);
            account["images"]["debian-12"] = json!(MOTO_AMI);
        }
    }
    // The example's zones, each mapped to a subnet made for it at moto (one VPC).
    provisioning_e2e::cloud::point_zone_subnets_at_moto(&mut docs, endpoint)?;
    for secret in docs_of_kind(&mut docs, "Secret") {
        let data = secret["stringData"].as_object_mut().context("stringData")?;
        data.insert("AWS_ACCESS_KEY_ID".into(), json!("AKIAE2ETEST000000002"));
        data.insert("AWS_SECRET_ACCESS_KEY".into(), json!(unique_secret("aws-secret-key")));
        data.insert("SSH_PRIVATE_KEY".into(), json!(unique_secret("ssh-key")));
    }
    let out = dir.join("aws");
    std::fs::create_dir_all(&out)?;
    write_yaml_docs(&out, "kubernetes-cluster.yaml", &docs)?;
    Ok(out)
}

/// The region of the example's (one) provider account.
fn aws_region(dir: &Path) -> Result<String> {
    let mut docs = read_yaml_docs(&dir.join("kubernetes-cluster.yaml").display().to_string())?;
    let ws = docs_of_kind(&mut docs, "Workspace").next().context("no Workspace")?;
    Ok(ws["spec"]["providers"][0]["region"].as_str().context("the account's region")?.to_string())
}

#[test]
fn the_shipped_deployment_runs_two_replicas_with_least_privilege_and_hands_over() -> Result<()> {
    let objects = rendered_deploy()?;
    let deployment: Deployment =
        serde_json::from_value(objects.iter().find(|o| o["kind"] == "Deployment").cloned().context("no Deployment in deploy/")?)?;
    let config_maps: BTreeMap<String, ConfigMap> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .map(|o| serde_json::from_value::<ConfigMap>(o.clone()))
        .map(|cm| cm.map(|cm| (cm.metadata.name.clone().unwrap_or_default(), cm)))
        .collect::<Result<_, _>>()?;
    // The AWS example below talks to moto over plain http: this run (only) allows insecure
    // endpoints, as the shipped config rightly does not.
    let mut config_maps = config_maps;
    for cm in config_maps.values_mut() {
        if let Some(toml) = cm.data.as_mut().and_then(|d| d.get_mut("config.toml")) {
            *toml = format!("allow_insecure_endpoints = true\n{toml}");
        }
    }
    let spec = deployment.spec.clone();
    let pod = spec.template.spec.clone().context("pod template spec")?;
    let container = pod.containers.first().context("no container")?.clone();
    let image = container.image.clone().context("no image")?;
    let service_account = pod.service_account_name.clone().context("no serviceAccountName")?;
    let replicas = spec.replicas.unwrap_or(1);
    ensure!(replicas == 2, "deploy/ runs {replicas} replicas; this test expects the two it ships");
    ensure!(
        run(Command::new(docker()).args(["image", "inspect", &image]))?.status.success(),
        "image {image} is missing: run scripts/build-image.sh (scripts/test.sh does)"
    );

    let gateway = bridge_gateway()?;
    let plane = ControlPlane::start(&gateway)?;
    plane.kubectl_ok(&["apply", "-k", &workspace_root().join("deploy").display().to_string()])?;
    let token = plane.kubectl_ok(&["create", "token", &service_account, "-n", NAMESPACE])?.trim().to_string();
    ensure!(!token.is_empty(), "kubectl create token returned nothing");
    let (server, ca) = plane.server_and_ca()?;
    let port: u16 = server.rsplit(':').next().context("server URL without port")?.trim_end_matches('/').parse()?;
    let in_cluster = InCluster { token, ca, host: gateway.clone(), port };

    // Least privilege, as the control plane's authorizer sees it.
    let subject = format!("--as=system:serviceaccount:{NAMESPACE}:{service_account}");
    for (verb, resource, namespace) in
        [("get", "secrets", "kube-system"), ("list", "secrets", "kube-system"), ("delete", "customresourcedefinitions", "")]
    {
        let mut args = vec!["auth", "can-i", verb, resource, subject.as_str()];
        if !namespace.is_empty() {
            args.extend(["-n", namespace]);
        }
        let out = plane.kubectl(&args)?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ensure!(
            answer == "no",
            "the controller may {verb} {resource} in {namespace:?}: {answer:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The two replicas, as the kubelet would start them.
    let label = format!("provisioning-e2e-deployed={}", std::process::id());
    let mut pods = Replicas { runs: Vec::new(), label: label.clone() };
    for i in 0..replicas {
        let name = format!("provisioning-controller-e2e-{}-{i}", std::process::id());
        let _ = run(Command::new(docker()).args(["rm", "-f", &name]));
        let pod_run = docker_run_args(&pod, &name, &config_maps, &in_cluster, &label)?;
        run_ok(Command::new(docker()).args(&pod_run.args))?;
        pods.runs.push(pod_run);
    }
    let names: Vec<String> = pods.runs.iter().map(|r| r.name.clone()).collect();

    // The probes, as written, answer 200 on both replicas.
    let readiness = container.readiness_probe.as_ref().and_then(|p| p.http_get.clone()).context("no httpGet readinessProbe")?;
    let liveness = container.liveness_probe.as_ref().and_then(|p| p.http_get.clone()).context("no httpGet livenessProbe")?;
    let (ready_port, ready_path) = probe_target(&container, &readiness)?;
    let (live_port, live_path) = probe_target(&container, &liveness)?;
    for name in &names {
        wait_until(Duration::from_secs(90), &format!("{name} ready ({ready_path} 200)"), || {
            ensure!(pods.running(name), "{name} exited:\n{}", pods.logs(name));
            let ip = pods.ip(name)?;
            Ok(http_get(&ip, ready_port, &ready_path)?.0 == 200 && http_get(&ip, live_port, &live_path)?.0 == 200)
        })
        .with_context(|| pods.logs(name))?;
    }

    // Exactly one leads.
    let leader_of = |holder: &str| names.iter().find(|n| holder.starts_with(&format!("{n}-"))).cloned();
    wait_until(Duration::from_secs(60), "a leader", || Ok(leader_of(&lease_holder(&plane)?).is_some()))?;
    let leader = leader_of(&lease_holder(&plane)?).context("no leader")?;
    let leading = |name: &str| -> Result<bool> {
        let (_, metrics) = http_get(&pods.ip(name)?, ready_port, "/metrics")?;
        Ok(metrics.lines().any(|l| l.trim() == "provisioning_leader 1"))
    };
    let leaders: Vec<&String> = names.iter().filter(|n| leading(n).unwrap_or(false)).collect();
    ensure!(leaders == vec![&leader], "exactly one replica must lead; leader gauge says {leaders:?}, the Lease says {leader}");

    // The examples reach Ready, reconciled by the deployed controller with its own token.
    let moto = MotoOnBridge::start(&gateway)?;
    let tmp = tempfile::tempdir()?;
    let aws = aws_example(tmp.path(), &moto.endpoint)?;
    plane.kubectl_ok(&["apply", "-f", &workspace_root().join("examples/simulated").display().to_string()])?;
    plane.kubectl_ok(&["apply", "-f", &aws.display().to_string()])?;
    let waited = plane.kubectl(&["wait", "--for=condition=Ready", "srv", "--all", "-n", "demo", "--timeout=180s"])?;
    ensure!(waited.status.success(), "simulated Servers not Ready: {}\n{}", String::from_utf8_lossy(&waited.stderr), pods.logs(&leader));
    let waited = plane.kubectl(&["wait", "--for=condition=ServersReady", "pcl/k8s", "-n", "k8s-aws", "--timeout=300s"])?;
    ensure!(
        waited.status.success(),
        "AWS (moto) Cluster not ServersReady: {}\n{}",
        String::from_utf8_lossy(&waited.stderr),
        pods.logs(&leader)
    );

    // Killing the leader's container hands over within 15 s.
    let standby = names.iter().find(|n| **n != leader).context("no standby")?.clone();
    run_ok(Command::new(docker()).args(["kill", &leader]))?;
    let took = wait_until(Duration::from_secs(30), "the standby taking the Lease", || {
        Ok(leader_of(&lease_holder(&plane)?).as_deref() == Some(standby.as_str()))
    })?;
    ensure!(took < Duration::from_secs(15), "handover took {took:?} (limit 15 s)");
    wait_until(Duration::from_secs(60), "the new leader ready", || {
        let ip = pods.ip(&standby)?;
        Ok(http_get(&ip, ready_port, &ready_path)?.0 == 200 && leading(&standby)?)
    })?;

    // Deleted as a folder (Namespace first, its credentials Secret and the RoleBinding that
    // lets the controller read it go in the same breath), the AWS example leaves no machine:
    // the Workspace holds both until its Servers are gone, with no more than deploy/ grants.
    let uid = plane.kubectl_ok(&["get", "namespace", "k8s-aws", "-o", "jsonpath={.metadata.uid}"])?;
    plane.kubectl_ok(&["delete", "-f", &aws.display().to_string(), "--wait=false"])?;
    wait_until(Duration::from_secs(180), "namespace k8s-aws deleted", || {
        let now = plane.kubectl_ok(&["get", "namespace", "k8s-aws", "--ignore-not-found", "-o", "jsonpath={.metadata.uid}"])?;
        Ok(now.trim() != uid.trim())
    })
    .with_context(|| pods.logs(&standby))?;
    let region = aws_region(&aws)?;
    let left = provisioning_e2e::cloud::moto_live_instances(&moto.endpoint, &region)?;
    ensure!(left.is_empty(), "{} machine(s) left at moto after deleting the example:\n{}", left.len(), pods.logs(&standby));

    // The RBAC in deploy/ was enough: no request of the controller was refused.
    for name in &names {
        let logs = pods.logs(name);
        ensure!(!logs.contains("API request refused"), "{name}: the control plane refused a request:\n{logs}");
        ensure!(!logs.contains("panicked"), "{name} panicked:\n{logs}");
    }
    eprintln!("handover took {took:?}");
    Ok(())
}

/// The image deploy/ names (scripts/build-image.sh) says what it is and what it bundles: OCI
/// labels with the workspace's version and the commit, a notice listing the crates compiled
/// into `provisioning` with their licences, nu's licence and the Debian libraries it carries;
/// and it carries nothing else of a distribution (no shell to exec into).
#[test]
fn the_image_carries_its_version_and_the_notices_of_what_it_bundles() -> Result<()> {
    let docs = rendered_deploy()?;
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").context("no Deployment in deploy/")?;
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"].as_str().context("no image")?.to_string();
    let labels = run_ok(Command::new(docker()).args(["image", "inspect", "-f", "{{json .Config.Labels}}", &image]))
        .with_context(|| format!("image {image} is missing: run scripts/build-image.sh (scripts/test.sh does)"))?;
    let labels: Value = serde_json::from_str(labels.trim()).context("labels")?;
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"), "labels: {labels}");
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap_or_default();
    ensure!(
        revision.len() >= 40 && revision.chars().take(40).all(|c| c.is_ascii_hexdigit()),
        "revision label {revision:?} is not a commit"
    );

    let container = run_ok(Command::new(docker()).args(["create", &image]))?.trim().to_string();
    let dir = tempfile::tempdir()?;
    let notice = dir.path().join("NOTICE");
    let copied = run_ok(Command::new(docker()).args(["cp", &format!("{container}:/usr/share/doc/provisioning/NOTICE")]).arg(&notice));
    let _ = run(Command::new(docker()).args(["rm", &container]));
    copied?;
    let text = std::fs::read_to_string(&notice)?;
    for expected in [
        "=== Rust crates ===",
        "\ntokio ",
        "\nkube-client ",
        "nushell ",
        "Permission is hereby granted",
        "Shared libraries from Debian",
        "libc6 ",
    ] {
        ensure!(text.contains(expected), "NOTICE lacks {expected:?}");
    }
    // Proc-macros run at compile time only: not bundled, not listed.
    ensure!(!text.contains("\nserde_derive "), "NOTICE lists a proc-macro crate");

    let shell = run(Command::new(docker()).args(["run", "--rm", "--entrypoint", "/bin/sh", &image, "-c", "true"]))?;
    ensure!(!shell.status.success(), "the image has a shell; it should carry only provisioning, nu and their libraries");
    Ok(())
}
