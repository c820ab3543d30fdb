//! Cloud emulators for the end-to-end tests of `examples/aws` and `examples/upcloud`: the moto
//! server (a real process on a free port of 127.0.0.1) and the UpCloud API 1.3 test double
//! (the `upcloud-double` crate, served over HTTP on 127.0.0.1 from a runtime owned by the
//! test); plus rewriting an example so it points at them, and the "no secret anywhere" check.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{Dev, tool, workspace_root};

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running `moto_server`; killed when dropped.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>/`.
    pub endpoint: String,
}

impl Moto {
    /// Starts `$PROVISIONING_MOTO` or `.tools/bin/moto_server` (fails, never skips, when it is
    /// missing: run scripts/setup.sh) with extra environment, e.g.
    /// `INITIAL_NO_AUTH_ACTION_COUNT=0` to make it check credentials.
    pub fn start(env: &[(&str, &str)]) -> Result<Moto> {
        let binary = tool("PROVISIONING_MOTO", "moto_server");
        // Moto binds port 0 itself and prints the port ("Running on http://127.0.0.1:PORT"):
        // picking a free port first races with every other test binding port 0 meanwhile
        // (moto takes seconds to start), and the test then talks to whatever got the port.
        let mut command = Command::new(binary);
        command.args(["-H", "127.0.0.1", "-p", "0"]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().context("spawn moto_server (run scripts/setup.sh)")?;
        let stderr = child.stderr.take().context("moto's stderr is piped")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the port, then keeps draining stderr (moto logs every request there).
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(port) = line.split("Running on http://127.0.0.1:").nth(1).and_then(|rest| rest.trim().parse::<u16>().ok())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(port);
                }
            }
        });
        let mut moto = Moto { child, endpoint: String::new() };
        let port =
            rx.recv_timeout(Duration::from_secs(60)).map_err(|_| anyhow::anyhow!("moto_server did not report its port within 60 s"))?;
        moto.endpoint = format!("http://127.0.0.1:{port}/");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("moto_server did not listen on 127.0.0.1:{port} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(moto)
    }

    /// How many security groups named as the aws provider's managed group of `account` moto
    /// holds in `region` (DescribeSecurityGroups by name).
    pub fn managed_groups(&self, region: &str, account: &str) -> Result<usize> {
        let config = provisioning_providers::ProviderConfig {
            name: "e2e-observer".into(),
            provider_type: "aws".into(),
            region: region.into(),
            endpoint: self.endpoint.clone(),
            credentials: provisioning_providers::Credentials(
                [
                    ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2EOBSERVER00001".to_string()),
                    ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-observer".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let provider = provisioning_providers::aws::AwsProvider::new(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
        let name = provisioning_providers::aws::managed_group_name(account);
        let params = [("Filter.1.Name".to_string(), "group-name".to_string()), ("Filter.1.Value.1".to_string(), name)];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let xml = runtime
            .block_on(provider.client().call("DescribeSecurityGroups", &params))
            .map_err(|e| anyhow::anyhow!("DescribeSecurityGroups at moto: {e}"))?;
        // One <groupName> per group (rules name groups by id only).
        Ok(xml.matches("<groupName>").count())
    }

    /// The EBS volumes at moto in `region` that are a Server's disk (tag
    /// `provisioning.dev/disk`), as (size GiB, volume type) (DescribeVolumes by tag key).
    pub fn disk_volumes(&self, region: &str) -> Result<Vec<(u64, String)>> {
        let config = provisioning_providers::ProviderConfig {
            name: "e2e-observer".into(),
            provider_type: "aws".into(),
            region: region.into(),
            endpoint: self.endpoint.clone(),
            credentials: provisioning_providers::Credentials(
                [
                    ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2EOBSERVER00001".to_string()),
                    ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-observer".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let provider = provisioning_providers::aws::AwsProvider::new(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
        let params = [
            ("Filter.1.Name".to_string(), "tag-key".to_string()),
            ("Filter.1.Value.1".to_string(), provisioning_providers::tags::DISK.to_string()),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let xml = runtime
            .block_on(provider.client().call("DescribeVolumes", &params))
            .map_err(|e| anyhow::anyhow!("DescribeVolumes at moto: {e}"))?;
        let parsed: provisioning_providers::aws::model::DescribeVolumesResponse =
            provider.client().parse("DescribeVolumes", &xml).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(parsed.volumes.items.into_iter().map(|v| (v.size, v.volume_type)).collect())
    }

    /// Calls the EC2 Query API `action` at moto in `region` with `params`, as an observer with
    /// its own keys, and returns the XML answer.
    pub fn call(&self, region: &str, action: &str, params: &[(&str, &str)]) -> Result<String> {
        let config = provisioning_providers::ProviderConfig {
            name: "e2e-observer".into(),
            provider_type: "aws".into(),
            region: region.into(),
            endpoint: self.endpoint.clone(),
            credentials: provisioning_providers::Credentials(
                [
                    ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2EOBSERVER00001".to_string()),
                    ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-observer".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let provider = provisioning_providers::aws::AwsProvider::new(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
        let params: Vec<(String, String)> = params.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(provider.client().call(action, &params)).map_err(|e| anyhow::anyhow!("{action} at moto: {e}"))
    }

    /// Every resource of the kinds the aws provider can leave behind (instances not
    /// terminated, EBS volumes, security groups, network interfaces, Elastic IP addresses),
    /// plus the VPCs and subnets, that moto holds in `region`: one Describe call per kind.
    pub fn inventory(&self, region: &str) -> Result<Ec2Inventory> {
        let live = [
            ("Filter.1.Name", "instance-state-name"),
            ("Filter.1.Value.1", "pending"),
            ("Filter.1.Value.2", "running"),
            ("Filter.1.Value.3", "shutting-down"),
            ("Filter.1.Value.4", "stopping"),
            ("Filter.1.Value.5", "stopped"),
        ];
        Ok(Ec2Inventory {
            instances: xml_values(&self.call(region, "DescribeInstances", &live)?, "instanceId"),
            volumes: xml_values(&self.call(region, "DescribeVolumes", &[])?, "volumeId"),
            security_groups: xml_values(&self.call(region, "DescribeSecurityGroups", &[])?, "groupId"),
            network_interfaces: xml_values(&self.call(region, "DescribeNetworkInterfaces", &[])?, "networkInterfaceId"),
            addresses: xml_values(&self.call(region, "DescribeAddresses", &[])?, "publicIp"),
            vpcs: xml_values(&self.call(region, "DescribeVpcs", &[])?, "vpcId"),
            subnets: xml_values(&self.call(region, "DescribeSubnets", &[])?, "subnetId"),
        })
    }

    /// The live (not terminated) instances at moto in `region`, as seen through
    /// DescribeInstances.
    pub fn live_instances(&self, region: &str) -> Result<Vec<provisioning_providers::ServerObservation>> {
        moto_live_instances(&self.endpoint, region)
    }
}

/// What an EC2 account holds in one region, by kind (ids; addresses by public IP).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ec2Inventory {
    /// Instances not terminated.
    pub instances: BTreeSet<String>,
    /// EBS volumes, attached or not.
    pub volumes: BTreeSet<String>,
    /// Security groups, the VPCs' `default` groups included.
    pub security_groups: BTreeSet<String>,
    /// Network interfaces.
    pub network_interfaces: BTreeSet<String>,
    /// Elastic IP addresses.
    pub addresses: BTreeSet<String>,
    /// VPCs, the default one included.
    pub vpcs: BTreeSet<String>,
    /// Subnets, the default VPC's included.
    pub subnets: BTreeSet<String>,
}

/// The distinct values of every `<tag>…</tag>` element in `xml` (an EC2 answer names a
/// resource again inside others, e.g. a volume in its attachment: a set counts it once).
pub fn xml_values(xml: &str, tag: &str) -> BTreeSet<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(&open).skip(1).filter_map(|rest| rest.split_once(&close).map(|(value, _)| value.trim().to_string())).collect()
}

/// The instances not terminated at the moto server `endpoint` in `region`.
pub fn moto_live_instances(endpoint: &str, region: &str) -> Result<Vec<provisioning_providers::ServerObservation>> {
    {
        let dir = tempfile::tempdir()?;
        let config = provisioning_providers::ProviderConfig {
            name: "e2e-observer".into(),
            provider_type: "aws".into(),
            region: region.into(),
            endpoint: endpoint.to_string(),
            credentials: provisioning_providers::Credentials(
                [
                    ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2EOBSERVER00001".to_string()),
                    ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-observer".to_string()),
                ]
                .into(),
            ),
            state_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let provider = provisioning_providers::build_provider(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(provider.list_servers(&[])).map_err(|e| anyhow::anyhow!("DescribeInstances at moto: {e}"))
    }
}

/// The Elastic IPs at the moto server `endpoint` in `region` (DescribeAddresses, unfiltered):
/// how many there are.
pub fn moto_addresses(endpoint: &str, region: &str) -> Result<usize> {
    let dir = tempfile::tempdir()?;
    let config = provisioning_providers::ProviderConfig {
        name: "e2e-observer".into(),
        provider_type: "aws".into(),
        region: region.into(),
        endpoint: endpoint.to_string(),
        credentials: provisioning_providers::Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2EOBSERVER00001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-observer".to_string()),
            ]
            .into(),
        ),
        state_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let provider = provisioning_providers::aws::AwsProvider::new(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let xml = runtime
        .block_on(provider.client().call_capped("DescribeAddresses", &[], 1 << 20))
        .map_err(|e| anyhow::anyhow!("DescribeAddresses at moto: {e}"))?;
    Ok(xml.matches("<allocationId>").count())
}

/// Makes a VPC and one subnet per zone of `zones` at the moto server `endpoint` in `region`
/// (what an account's `zoneSubnets` names on a real account): zone → subnet id.
pub fn moto_subnets(endpoint: &str, region: &str, zones: &[String]) -> Result<std::collections::BTreeMap<String, String>> {
    let config = provisioning_providers::ProviderConfig {
        name: "e2e-network".into(),
        provider_type: "aws".into(),
        region: region.into(),
        endpoint: endpoint.to_string(),
        credentials: provisioning_providers::Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIAE2EOBSERVER00001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "e2e-observer".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    let provider = provisioning_providers::aws::AwsProvider::new(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let call = |action: &str, params: Vec<(String, String)>| {
        runtime.block_on(provider.client().call(action, &params)).map_err(|e| anyhow::anyhow!("{action} at moto: {e}"))
    };
    let first = |xml: &str, tag: &str| -> Result<String> {
        xml.split(&format!("<{tag}>"))
            .nth(1)
            .and_then(|r| r.split_once(&format!("</{tag}>")).map(|(v, _)| v.to_string()))
            .ok_or_else(|| anyhow::anyhow!("no <{tag}> in moto's answer: {xml}"))
    };
    let vpc = first(&call("CreateVpc", vec![("CidrBlock".into(), "10.77.0.0/16".into())])?, "vpcId")?;
    let mut subnets = std::collections::BTreeMap::new();
    for (i, zone) in zones.iter().enumerate() {
        let params = vec![
            ("VpcId".into(), vpc.clone()),
            ("CidrBlock".into(), format!("10.77.{}.0/24", i + 1)),
            ("AvailabilityZone".into(), zone.clone()),
        ];
        subnets.insert(zone.clone(), first(&call("CreateSubnet", params)?, "subnetId")?);
    }
    Ok(subnets)
}

/// Points every aws account of `docs` (an example's documents) whose `zoneSubnets` lists zones
/// at subnets made for those zones at moto (`moto_subnets`); the zones stay the example's.
pub fn point_zone_subnets_at_moto(docs: &mut [Value], endpoint: &str) -> Result<()> {
    for ws in docs_of_kind(docs, "Workspace") {
        let Some(accounts) = ws["spec"]["providers"].as_array_mut() else { continue };
        for account in accounts {
            let Some(map) = account.get("zoneSubnets").and_then(Value::as_object) else { continue };
            let zones: Vec<String> = map.keys().cloned().collect();
            let region = account["region"].as_str().unwrap_or("us-east-1").to_string();
            let subnets = moto_subnets(endpoint, &region, &zones)?;
            account["zoneSubnets"] = serde_json::to_value(subnets)?;
        }
    }
    Ok(())
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The UpCloud API 1.3 test double served on 127.0.0.1 by a runtime of its own; stops when
/// dropped.
pub struct Upcloud {
    /// The double (state inspection).
    pub double: upcloud_double::UpcloudDouble,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Upcloud {
    /// Starts the double accepting `username`/`password`.
    pub fn start(username: &str, password: &str) -> Result<Upcloud> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let config = upcloud_double::DoubleConfig {
            username: username.into(),
            password: password.into(),
            create_time: Duration::from_secs(2),
            stop_time: Duration::from_secs(1),
        };
        let double = runtime.block_on(upcloud_double::UpcloudDouble::start_on("127.0.0.1:0", config))?;
        Ok(Upcloud { double, runtime: Some(runtime) })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.double.endpoint
    }

    /// Requests served so far (including refused ones).
    pub fn requests(&self) -> u64 {
        self.double.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Upcloud {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Stops the accept loop and every connection with it.
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// A value unique to this run, to grep for (`e2e-<label>-<hex>`).
pub fn unique_secret(label: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    format!("e2e-{label}-{:x}{:x}", nanos, std::process::id())
}

/// Reads a multi-document YAML file (relative to the workspace root) as JSON values.
pub fn read_yaml_docs(relative: &str) -> Result<Vec<Value>> {
    let path = workspace_root().join(relative);
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).with_context(|| format!("parse {}", path.display()))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// Writes `docs` as one multi-document YAML file `dir/name` and returns its absolute path.
pub fn write_yaml_docs(dir: &Path, name: &str, docs: &[Value]) -> Result<PathBuf> {
    let mut text = String::new();
    for doc in docs {
        text.push_str("---\n");
        text.push_str(&serde_yaml_ng::to_string(doc)?);
    }
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The documents of `docs` of `kind`.
pub fn docs_of_kind<'a>(docs: &'a mut [Value], kind: &str) -> impl Iterator<Item = &'a mut Value> {
    let kind = kind.to_string();
    docs.iter_mut().filter(move |d| d["kind"] == kind.as_str())
}

/// Fails naming the place if any of `secrets` appears in the dev process's log, in any
/// status of our kinds, or in any event (core/v1 and events.k8s.io/v1).
pub fn assert_no_secret_anywhere(dev: &Dev, secrets: &[&str]) -> Result<()> {
    let mut places = vec![("dev process log".to_string(), dev.log())];
    for kind in ["workspaces", "clusters", "servers", "taskservs"] {
        places.push((format!("{kind} (all of it, status included)"), dev.kubectl_ok(&["get", kind, "-A", "-o", "json"])?));
    }
    places.push(("events (core/v1)".into(), dev.kubectl_ok(&["get", "events", "-A", "-o", "json"])?));
    places.push(("events (events.k8s.io/v1)".into(), dev.kubectl_ok(&["get", "events.events.k8s.io", "-A", "-o", "json"])?));
    for (place, text) in &places {
        for secret in secrets {
            if text.contains(secret) {
                bail!("a secret value appears in the {place}");
            }
        }
    }
    Ok(())
}

/// `kubectl get <what> -o json` parsed.
pub fn get_json(dev: &Dev, args: &[&str]) -> Result<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    Ok(serde_json::from_str(&dev.kubectl_ok(&all)?)?)
}

/// The condition `type_` of an object's status, if present.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}
