//! Pure parts of the local provider: plans, names, labels and the container spec.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bollard::models::{ContainerCreateBody, EndpointSettings, HostConfig, NetworkingConfig};

use crate::{ProviderError, ServerIdentity, ServerRequest, plans, tags};

/// Abstract plans → native `cpu<N>-mem<size>` plans. The machine has 2 cores, so nothing
/// asks for more than 2 CPUs.
pub const PLANS: [(&str, &str); 4] = [("small", "cpu1-mem1g"), ("medium", "cpu2-mem2g"), ("large", "cpu2-mem4g"), ("xlarge", "cpu2-mem8g")];

/// Label holding the native plan of a container.
pub const PLAN_LABEL: &str = "provisioning.dev/plan";
/// Label on networks (and nothing else): `cluster` or `namespace`.
pub const NETWORK_SCOPE_LABEL: &str = "provisioning.dev/network-scope";
/// Extra tag that makes a container privileged (for services that run containers
/// themselves with real snapshotters); off by default.
pub const PRIVILEGED_TAG: &str = "provisioning.dev/privileged";

/// The node image every abstract image name maps to.
pub const DEFAULT_NODE_IMAGE: &str = super::image::NODE_IMAGE_LATEST;

/// Where `nu` is mounted in every container.
pub const NU_MOUNT: &str = "/usr/local/bin/nu";
/// Where the taskserv catalog is mounted in every container.
pub const CATALOG_MOUNT: &str = "/opt/provisioning/catalog";

/// CPU and memory of a native plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    /// CPUs in units of 10^-9.
    pub nano_cpus: i64,
    /// Memory in bytes.
    pub memory: i64,
}

/// Resolves a plan name (abstract, or native `cpu<N>-mem<size>`) to its native name.
pub fn resolve_plan(plan: &str) -> Result<String, ProviderError> {
    plans::resolve("local", plan, &PLANS, |p| parse_plan(p).is_some())
}

/// Parses a native plan: `cpu<cpus>-mem<amount><m|g>`, e.g. `cpu1-mem512m`, `cpu0.5-mem1g`.
pub fn parse_plan(native: &str) -> Option<Resources> {
    let (cpu, mem) = native.strip_prefix("cpu")?.split_once("-mem")?;
    let cpus: f64 = cpu.parse().ok()?;
    if !(cpus > 0.0 && cpus <= 64.0) || cpu.starts_with('.') || cpu.ends_with('.') {
        return None;
    }
    let (amount, unit) = mem.split_at(mem.len().checked_sub(1)?);
    let amount: i64 = amount.parse().ok().filter(|a| *a > 0)?;
    let memory = match unit {
        "m" => amount.checked_mul(1 << 20)?,
        "g" => amount.checked_mul(1 << 30)?,
        _ => return None,
    };
    // Docker refuses limits below 6 MiB; a node needs far more anyway.
    if memory < 64 << 20 {
        return None;
    }
    Some(Resources { nano_cpus: (cpus * 1e9).round() as i64, memory })
}

/// The native plan name of `resources` (`cpu1-mem1g`, `cpu0.5-mem512m`): what a container
/// resized in place reports, since its plan label cannot change.
pub fn plan_name(resources: Resources) -> String {
    let cpus = resources.nano_cpus as f64 / 1e9;
    let cpus = format!("{cpus:.3}");
    let cpus = cpus.trim_end_matches('0').trim_end_matches('.');
    let memory =
        if resources.memory % (1 << 30) == 0 { format!("{}g", resources.memory >> 30) } else { format!("{}m", resources.memory >> 20) };
    format!("cpu{cpus}-mem{memory}")
}

/// A short, name-safe form of a uid: the first block of a UUID, or a hash of anything else.
pub fn short_uid(uid: &str) -> String {
    let first = uid.split('-').next().unwrap_or("");
    if uid.len() == 36 && first.len() == 8 && first.chars().all(|c| c.is_ascii_hexdigit()) {
        first.to_ascii_lowercase()
    } else {
        format!("{:08x}", super::image::fnv1a64(uid.as_bytes()) as u32)
    }
}

/// Keeps what Docker accepts in names: `[a-zA-Z0-9_.-]`, other characters become `-`.
fn name_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '-' }).collect()
}

/// The container's name: `prov-<namespace>-<server>-<short uid>`.
pub fn container_name(identity: &ServerIdentity) -> String {
    format!("prov-{}-{}-{}", name_safe(&identity.namespace), name_safe(&identity.name), short_uid(&identity.uid))
}

/// The network a server joins: one per Cluster, one per namespace for standalone servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSpec {
    /// Docker network name. `_` separates the parts because Kubernetes names never contain
    /// one, so two (namespace, cluster) pairs never share a name.
    pub name: String,
    /// Labels on the network, also used to find it.
    pub labels: BTreeMap<String, String>,
}

impl NetworkSpec {
    /// The network of a server (by its namespace and cluster).
    pub fn for_identity(identity: &ServerIdentity) -> Self {
        Self::new(&identity.namespace, identity.cluster.as_deref())
    }

    /// The network of a cluster, or of a namespace's standalone servers.
    pub fn new(namespace: &str, cluster: Option<&str>) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert(tags::NAMESPACE.to_string(), namespace.to_string());
        let name = match cluster {
            Some(cluster) => {
                labels.insert(tags::CLUSTER.to_string(), cluster.to_string());
                labels.insert(NETWORK_SCOPE_LABEL.to_string(), "cluster".to_string());
                format!("prov_{}_{}", name_safe(namespace), name_safe(cluster))
            }
            None => {
                labels.insert(NETWORK_SCOPE_LABEL.to_string(), "namespace".to_string());
                format!("prov_{}", name_safe(namespace))
            }
        };
        NetworkSpec { name, labels }
    }

    /// Docker `label=` filters selecting this network.
    pub fn label_filters(&self) -> HashMap<String, Vec<String>> {
        label_filter(self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Docker `label=` filters selecting the containers that may be on this network (its
    /// namespace, and cluster for a cluster's network).
    pub fn member_filters(&self) -> HashMap<String, Vec<String>> {
        label_filter(self.labels.iter().filter(|(k, _)| k.as_str() != NETWORK_SCOPE_LABEL).map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

/// Builds Docker list filters for `key=value` labels.
pub fn label_filter<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> HashMap<String, Vec<String>> {
    let values: Vec<String> = labels.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    HashMap::from([("label".to_string(), values)])
}

/// Host paths mounted read-only into every container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mounts {
    /// The `nu` binary (mounted at [`NU_MOUNT`]).
    pub nu_binary: Option<std::path::PathBuf>,
    /// The taskserv catalog (mounted at [`CATALOG_MOUNT`]).
    pub catalog_dir: Option<std::path::PathBuf>,
}

impl Mounts {
    /// `host:container:ro` binds. Paths must be absolute: Docker would read a relative one as
    /// a volume name.
    pub fn binds(&self) -> Result<Vec<String>, ProviderError> {
        let mut binds = Vec::new();
        for (host, target) in [(&self.nu_binary, NU_MOUNT), (&self.catalog_dir, CATALOG_MOUNT)] {
            if let Some(host) = host {
                binds.push(format!("{}:{target}:ro", checked_host_path(host)?));
            }
        }
        Ok(binds)
    }
}

fn checked_host_path(path: &Path) -> Result<String, ProviderError> {
    let text = path
        .to_str()
        .filter(|t| !t.contains(':') && path.is_absolute())
        .ok_or_else(|| ProviderError::InvalidRequest(format!("mount source {} must be an absolute path without ':'", path.display())))?;
    // A missing source would make Docker create an empty directory in its place.
    if !path.exists() {
        return Err(ProviderError::InvalidRequest(format!("mount source {text} does not exist")));
    }
    Ok(text.to_string())
}

/// Everything `create_container` needs, derived from the request alone.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Native plan.
    pub plan: String,
    /// Network to join.
    pub network: NetworkSpec,
    /// Image reference.
    pub image: String,
    /// Labels (identity, plan, extra tags).
    pub labels: BTreeMap<String, String>,
    /// Docker create body.
    pub body: ContainerCreateBody,
}

/// Builds the container for a Server: identity labels, limits from the plan, hostname and
/// network alias = server name, read-only mounts, a long-lived init.
pub fn container_spec(request: &ServerRequest, image: &str, mounts: &Mounts) -> Result<ContainerSpec, ProviderError> {
    let identity = &request.identity;
    let plan = resolve_plan(&request.plan)?;
    let resources = parse_plan(&plan).ok_or_else(|| ProviderError::InvalidRequest(format!("plan {plan:?} has no CPU and memory size")))?;
    let network = NetworkSpec::for_identity(identity);
    let mut labels: BTreeMap<String, String> = request.extra_tags.clone();
    labels.extend(identity.tags());
    labels.insert(PLAN_LABEL.to_string(), plan.clone());
    let privileged = request.extra_tags.get(PRIVILEGED_TAG).is_some_and(|v| v == "true");
    // Hostnames are at most 63 characters; the full name stays resolvable as an alias.
    let hostname: String = identity.name.chars().take(63).collect();
    let host_config = HostConfig {
        nano_cpus: Some(resources.nano_cpus),
        memory: Some(resources.memory),
        // No swap beyond the memory limit: the plan is what the server gets.
        memory_swap: Some(resources.memory),
        // docker-init (tini) as PID 1 reaps the orphans of services started by scripts.
        init: Some(true),
        binds: Some(mounts.binds()?),
        mounts: disk_mounts(request)?,
        network_mode: Some(network.name.clone()),
        privileged: Some(privileged),
        ..Default::default()
    };
    let endpoint = EndpointSettings { aliases: Some(vec![identity.name.clone()]), ..Default::default() };
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        hostname: Some(hostname),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        labels: Some(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        host_config: Some(host_config),
        networking_config: Some(NetworkingConfig { endpoints_config: Some(HashMap::from([(network.name.clone(), endpoint)])) }),
        ..Default::default()
    };
    Ok(ContainerSpec { name: container_name(identity), plan, network, image: image.to_string(), labels, body })
}

/// The Docker volume of a Server's disk: `provisioning-<server uid>-<disk>`.
pub fn disk_volume_name(uid: &str, disk: &str) -> String {
    format!("provisioning-{uid}-{disk}")
}

/// A request's disks as named Docker volumes mounted at their `mountPath` (created by the
/// engine on first use, labelled with the Server's identity, the disk and Retain's mark).
/// A raw disk (no mountPath) is refused, naming the field: a Docker volume is a directory.
/// Docker's local volume driver has no size: `size` is recorded, not enforced.
pub fn disk_mounts(request: &ServerRequest) -> Result<Option<Vec<bollard::models::Mount>>, ProviderError> {
    use bollard::models::{Mount, MountType, MountVolumeOptions};
    if request.disks.is_empty() {
        return Ok(None);
    }
    let mut mounts = Vec::new();
    for (i, disk) in request.disks.iter().enumerate() {
        if disk.mount_path.is_empty() {
            return Err(ProviderError::InvalidRequest(format!(
                "spec.disks[{i}].mountPath is empty: local machines have no raw disks (a Docker volume is a directory)"
            )));
        }
        let mut labels: HashMap<String, String> = request.identity.tags().into_iter().collect();
        labels.insert(crate::tags::DISK.to_string(), disk.name.clone());
        labels.insert(DISK_SIZE_LABEL.to_string(), format!("{}Gi", disk.size_gib));
        if disk.retain {
            labels.insert(crate::tags::RETAINED.to_string(), "true".to_string());
        }
        mounts.push(Mount {
            target: Some(disk.mount_path.clone()),
            source: Some(disk_volume_name(&request.identity.uid, &disk.name)),
            typ: Some(MountType::VOLUME),
            volume_options: Some(MountVolumeOptions { labels: Some(labels), ..Default::default() }),
            ..Default::default()
        });
    }
    Ok(Some(mounts))
}

/// Label of a disk's Docker volume: the size the spec asked for (not enforced by Docker).
pub const DISK_SIZE_LABEL: &str = "provisioning.dev/disk-size";

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(cluster: Option<&str>) -> ServerIdentity {
        ServerIdentity {
            uid: "0c9a5f0e-1b2c-4d5e-8f90-123456789abc".into(),
            namespace: "team-a".into(),
            name: "etcd-0".into(),
            cluster: cluster.map(str::to_string),
        }
    }

    #[test]
    fn disks_are_named_volumes_mounted_at_their_path_and_raw_ones_are_refused() {
        let mut request = ServerRequest {
            identity: identity(None),
            plan: "small".into(),
            zone: String::new(),
            image: "debian-12".into(),
            ssh_public_key: None,
            extra_tags: Default::default(),
            instance_profile: String::new(),
            public_ip: None,
            disks: vec![crate::DiskRequest {
                name: "keep".into(),
                size_gib: 20,
                mount_path: "/srv/keep".into(),
                retain: true,
                ..Default::default()
            }],
            host_key: None,
        };
        let mounts = disk_mounts(&request).expect("mounts").expect("one");
        assert_eq!(mounts[0].source.as_deref(), Some("provisioning-0c9a5f0e-1b2c-4d5e-8f90-123456789abc-keep"));
        assert_eq!(mounts[0].target.as_deref(), Some("/srv/keep"));
        let labels = mounts[0].volume_options.as_ref().and_then(|o| o.labels.clone()).unwrap_or_default();
        assert_eq!(labels.get(tags::RETAINED).map(String::as_str), Some("true"));
        assert_eq!(labels.get(tags::DISK).map(String::as_str), Some("keep"));
        assert_eq!(labels.get(tags::SERVER_UID).map(String::as_str), Some("0c9a5f0e-1b2c-4d5e-8f90-123456789abc"));
        request.disks[0].mount_path = String::new();
        let raw = disk_mounts(&request).expect_err("raw disk");
        assert!(matches!(&raw, ProviderError::InvalidRequest(m) if m.contains("spec.disks[0].mountPath")), "{raw:?}");
        request.disks.clear();
        assert!(disk_mounts(&request).expect("none").is_none());
    }

    #[test]
    fn plans_resolve_to_limits() {
        assert_eq!(resolve_plan("small").ok().as_deref(), Some("cpu1-mem1g"));
        assert_eq!(parse_plan("cpu1-mem1g"), Some(Resources { nano_cpus: 1_000_000_000, memory: 1 << 30 }));
        assert_eq!(parse_plan("cpu2-mem8g"), Some(Resources { nano_cpus: 2_000_000_000, memory: 8 << 30 }));
        assert_eq!(parse_plan("cpu0.5-mem512m"), Some(Resources { nano_cpus: 500_000_000, memory: 512 << 20 }));
        assert_eq!(resolve_plan("cpu1-mem512m").ok().as_deref(), Some("cpu1-mem512m"));
        for native in ["cpu1-mem1g", "cpu2-mem8g", "cpu0.5-mem512m", "cpu1.25-mem1536m"] {
            let parsed = parse_plan(native).expect("parses");
            assert_eq!(plan_name(parsed), native);
        }
        assert_eq!(plan_name(parse_plan("cpu1-mem1024m").expect("parses")), "cpu1-mem1g");
        for bad in ["cpu-mem1g", "cpu1-mem", "cpu1-mem1t", "cpu0-mem1g", "cpu1-mem1m", "t3.small", "cpu1.-mem1g"] {
            assert!(parse_plan(bad).is_none(), "{bad}");
        }
        let err = resolve_plan("huge").expect_err("unknown plan");
        assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("huge")), "{err:?}");
    }

    #[test]
    fn names_are_unambiguous_and_docker_safe() {
        assert_eq!(container_name(&identity(None)), "prov-team-a-etcd-0-0c9a5f0e");
        let other = ServerIdentity { uid: "x-uid-0001".into(), ..identity(None) };
        let name = container_name(&other);
        assert!(name.starts_with("prov-team-a-etcd-0-") && name.len() == "prov-team-a-etcd-0-".len() + 8, "{name}");
        assert_ne!(NetworkSpec::new("a-b", Some("c")).name, NetworkSpec::new("a", Some("b-c")).name);
        assert_eq!(NetworkSpec::new("ns", None).name, "prov_ns");
        assert_eq!(NetworkSpec::new("ns", Some("etcd")).name, "prov_ns_etcd");
    }

    #[test]
    fn spec_carries_identity_limits_and_alias() {
        let request = ServerRequest {
            identity: identity(Some("etcd")),
            plan: "medium".into(),
            zone: String::new(),
            image: "debian-12".into(),
            ssh_public_key: None,
            extra_tags: BTreeMap::from([("team".to_string(), "blue".to_string())]),
            instance_profile: String::new(),
            public_ip: None,
            disks: Vec::new(),
            host_key: None,
        };
        let spec = container_spec(&request, "provisioning-node:latest", &Mounts::default()).expect("spec");
        assert_eq!(spec.labels.get(tags::CLUSTER).map(String::as_str), Some("etcd"));
        assert_eq!(spec.labels.get("team").map(String::as_str), Some("blue"));
        assert_eq!(spec.labels.get(PLAN_LABEL).map(String::as_str), Some("cpu2-mem2g"));
        let host = spec.body.host_config.as_ref().expect("host config");
        assert_eq!(host.nano_cpus, Some(2_000_000_000));
        assert_eq!(host.memory, Some(2 << 30));
        assert_eq!(host.privileged, Some(false));
        assert_eq!(spec.body.hostname.as_deref(), Some("etcd-0"));
        let endpoints = spec.body.networking_config.as_ref().and_then(|n| n.endpoints_config.as_ref()).expect("eps");
        assert_eq!(endpoints.get("prov_team-a_etcd").and_then(|e| e.aliases.clone()), Some(vec!["etcd-0".into()]));
        assert_eq!(spec.network.labels.get(tags::NAMESPACE).map(String::as_str), Some("team-a"));
    }

    #[test]
    fn mounts_must_exist_and_be_absolute() {
        let missing = Mounts { nu_binary: Some("/no/such/nu".into()), catalog_dir: None };
        assert!(matches!(missing.binds(), Err(ProviderError::InvalidRequest(_))));
        let relative = Mounts { nu_binary: Some("nu".into()), catalog_dir: None };
        assert!(matches!(relative.binds(), Err(ProviderError::InvalidRequest(_))));
        let ok = Mounts { nu_binary: None, catalog_dir: Some("/tmp".into()) };
        assert_eq!(ok.binds().ok(), Some(vec![format!("/tmp:{CATALOG_MOUNT}:ro")]));
    }
}
