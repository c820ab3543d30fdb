//! The local provider: each Server is a Docker container on this machine, through bollard.
//!
//! Like Cluster API's Docker provider it keeps no state of its own: containers and networks
//! are found by their labels. Each container runs the node image built by
//! [`image::build_node_image`] (there is no registry to pull from), with `docker-init`
//! as PID 1 and `sleep infinity` as its only child, so services that task scripts start in
//! the background stay up and are reaped. Containers are not privileged unless the request's
//! extra tags say `provisioning.dev/privileged: "true"`: the services tested here (etcd,
//! redis, postgresql, haproxy, containerd as a daemon) run without it; only running
//! containers *inside* containerd would need it.
//!
//! Each Cluster gets one bridge network (`prov_<namespace>_<cluster>`), standalone servers
//! share one per namespace (`prov_<namespace>`); the network is created on demand and
//! removed with the last container that used it. Every container joins its network with the
//! server name as alias, so peers resolve each other by server name.
//!
//! The engine's container events are followed ([`Provider::machine_events`], see `events`):
//! a container of ours that dies or is destroyed is reported within moments, and a stopped
//! container can be started again ([`Provider::start_server`]).

mod docker;
mod events;
mod exec;
pub mod image;
mod netlock;
pub mod spec;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{
    ContainerSummary, ContainerSummaryStateEnum, EndpointSettings, NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use tokio::sync::OnceCell;

pub use self::docker::connect;
use self::docker::{classify, status_of};
pub use self::exec::EXEC_ID_ENV;
use self::netlock::NetworkLock;
use self::spec::{ContainerSpec, DEFAULT_NODE_IMAGE, Mounts, NetworkSpec, PLAN_LABEL};
use crate::{
    Address, DeleteOutcome, ExecRequest, ExecResult, MachineEvents, MachineState, Provider, ProviderConfig, ProviderError, ProviderId,
    ProviderResult, ServerIdentity, ServerObservation, ServerRequest, SharedProvider, tags,
};

/// Abstract image names that mean "the node image".
const NODE_IMAGE_ALIASES: [&str; 5] = ["", "debian", "debian-12", "debian-bookworm", "provisioning-node"];

/// Builds the provider for an account.
pub fn build(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    Ok(Arc::new(LocalProvider::new(config)?))
}

/// Docker containers on the local engine.
pub struct LocalProvider {
    account: String,
    endpoint: String,
    images: BTreeMap<String, String>,
    mounts: Mounts,
    docker: OnceCell<Docker>,
    /// Serialises network create/remove with container create in this process and across
    /// processes on this host, so that two creates never make two networks of one name and
    /// the last delete of a cluster never removes the network a concurrent create just joined.
    network_lock: NetworkLock,
}

impl LocalProvider {
    /// Creates the container of `request` (and its network) without starting it: exactly
    /// what an `ensure_server` cut short by a crash leaves behind. For failure tests; the
    /// controller itself only calls `ensure_server`, which finishes such a container.
    pub async fn create_unstarted(&self, request: &ServerRequest) -> ProviderResult<()> {
        let image = self.image_for(&request.image)?;
        let spec = spec::container_spec(request, &image, &self.mounts)?;
        if self.find(&request.identity).await?.is_none() {
            self.create(spec).await?;
        }
        Ok(())
    }

    /// A provider for `config`. Nothing is contacted until the first call.
    pub fn new(config: &ProviderConfig) -> ProviderResult<Self> {
        let mounts = Mounts { nu_binary: config.nu_binary.clone(), catalog_dir: config.catalog_dir.clone() };
        mounts.binds()?;
        Ok(LocalProvider {
            account: config.name.clone(),
            endpoint: config.endpoint.clone(),
            images: config.images.clone(),
            mounts,
            docker: OnceCell::new(),
            network_lock: NetworkLock::new(&config.endpoint),
        })
    }

    /// The engine client, connected on first use (and retried after a failure).
    async fn docker(&self) -> ProviderResult<&Docker> {
        self.docker.get_or_try_init(|| connect(&self.endpoint)).await
    }

    /// The image reference for a requested image name.
    fn image_for(&self, requested: &str) -> ProviderResult<String> {
        if let Some(native) = self.images.get(requested) {
            return Ok(native.clone());
        }
        if NODE_IMAGE_ALIASES.contains(&requested) {
            return Ok(DEFAULT_NODE_IMAGE.to_string());
        }
        if requested.contains(':') || requested.contains('/') || requested.contains('@') {
            return Ok(requested.to_string());
        }
        Err(ProviderError::InvalidRequest(format!(
            "image {requested:?} is unknown to the local provider (use debian-12 for the node image, or a \
             local image reference name:tag)"
        )))
    }

    async fn list(&self, filters: HashMap<String, Vec<String>>) -> ProviderResult<Vec<ContainerSummary>> {
        let docker = self.docker().await?;
        docker
            .list_containers(Some(ListContainersOptions { all: true, filters: Some(filters), ..Default::default() }))
            .await
            .map_err(|e| classify("list containers", e))
    }

    async fn find(&self, identity: &ServerIdentity) -> ProviderResult<Option<ContainerSummary>> {
        let filters = spec::label_filter([(tags::SERVER_UID, identity.uid.as_str())]);
        let mut found = self.list(filters).await?;
        // Never more than one unless someone copied labels by hand; the oldest is the machine.
        found.sort_by_key(|c| c.created.unwrap_or(i64::MAX));
        Ok(found.into_iter().next())
    }

    /// Finds the network of `spec` by its labels, or creates it. Call with `network_lock`.
    async fn ensure_network(&self, spec: &NetworkSpec) -> ProviderResult<String> {
        let docker = self.docker().await?;
        let mut ids = self.networks(spec).await?;
        if ids.is_empty() {
            let request = NetworkCreateRequest {
                name: spec.name.clone(),
                driver: Some("bridge".into()),
                labels: Some(spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
                ..Default::default()
            };
            match docker.create_network(request).await {
                Ok(_) => {}
                // Created meanwhile by another process (newer engines refuse duplicate names).
                Err(e) if status_of(&e) == Some(409) => {}
                // Docker's address pools hold about 30 bridge networks; they free up as
                // clusters go, so this is worth retrying.
                Err(e) if e.to_string().contains("non-overlapping") => {
                    return Err(ProviderError::Transient(format!(
                        "create network {}: the Docker engine has no free address pool ({e}); remove unused \
                         networks (docker network ls)",
                        spec.name
                    )));
                }
                Err(e) => return Err(classify(&format!("create network {}", spec.name), e)),
            }
            ids = self.networks(spec).await?;
        }
        // Docker 20.10 allows two networks of one name; the host lock keeps our processes on
        // this host from making them, but another host on the same engine or an older version
        // may have. Everyone keeps the oldest and moves the others' members over to it.
        let chosen = ids
            .first()
            .cloned()
            .ok_or_else(|| ProviderError::Transient(format!("network {} vanished right after it was created", spec.name)))?;
        for extra in ids.drain(1..) {
            self.merge_network(spec, &extra, &chosen).await?;
        }
        Ok(chosen)
    }

    /// Moves every container of ours on the duplicate network `extra` (running or only
    /// created) to `chosen`, with its server name as alias, and removes `extra`. Call with
    /// `network_lock`.
    async fn merge_network(&self, spec: &NetworkSpec, extra: &str, chosen: &str) -> ProviderResult<()> {
        let docker = self.docker().await?;
        let members = self.list(spec.member_filters()).await?;
        for container in members.iter().filter(|c| on_network(c, extra)) {
            let Some(id) = container.id.as_deref() else { continue };
            let alias = container.labels.as_ref().and_then(|l| l.get(tags::SERVER)).cloned();
            let leave = NetworkDisconnectRequest { container: id.to_string(), force: Some(true) };
            match docker.disconnect_network(extra, leave).await {
                Ok(()) => {}
                Err(e) if matches!(status_of(&e), Some(404)) => {}
                Err(e) => return Err(classify(&format!("move container {id} off duplicate network {}", spec.name), e)),
            }
            let join = NetworkConnectRequest {
                container: id.to_string(),
                endpoint_config: Some(EndpointSettings {
                    aliases: alias.map(|a| vec![a]),
                    network_id: Some(chosen.to_string()),
                    ..Default::default()
                }),
            };
            match docker.connect_network(chosen, join).await {
                Ok(()) => tracing::info!(container = id, network = %spec.name, "moved a container off a duplicate network"),
                // Removed meanwhile.
                Err(e) if matches!(status_of(&e), Some(404)) => {}
                Err(e) if e.to_string().contains("already exists") => {}
                Err(e) => return Err(classify(&format!("move container {id} to network {}", spec.name), e)),
            }
        }
        match docker.remove_network(extra).await {
            Ok(()) => tracing::info!(network = %spec.name, duplicate = extra, "removed a duplicate network"),
            Err(e) if matches!(status_of(&e), Some(404)) => {}
            Err(e) => return Err(classify(&format!("remove duplicate network {} ({extra})", spec.name), e)),
        }
        Ok(())
    }

    /// Ids of the networks carrying `spec`'s labels, oldest first.
    async fn networks(&self, spec: &NetworkSpec) -> ProviderResult<Vec<String>> {
        let docker = self.docker().await?;
        let networks = docker
            .list_networks(Some(ListNetworksOptions { filters: Some(spec.label_filters()) }))
            .await
            .map_err(|e| classify("list networks", e))?;
        let mut found: Vec<(Option<chrono::DateTime<chrono::FixedOffset>>, String)> = networks
            .into_iter()
            .filter(|n| n.labels.as_ref().is_some_and(|l| spec.labels.iter().all(|(k, v)| l.get(k) == Some(v))))
            .filter_map(|n| {
                let created = n.created.as_deref().and_then(|c| chrono::DateTime::parse_from_rfc3339(c).ok());
                n.id.map(|id| (created, id))
            })
            .collect();
        // Oldest first: a racer that saw only one network saw the oldest, so everyone keeps it.
        found.sort_by(|a, b| match (a.0, b.0) {
            (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.1.cmp(&b.1)),
            _ => a.1.cmp(&b.1),
        });
        Ok(found.into_iter().map(|(_, id)| id).collect())
    }

    /// Removes the network of `network` when no container (running or not) uses it any more.
    async fn remove_network_if_unused(&self, network: &NetworkSpec) -> ProviderResult<()> {
        let _guard = self.network_lock.lock().await?;
        self.remove_network_if_unused_locked(network).await
    }

    /// [`Self::remove_network_if_unused`] for callers holding `network_lock`.
    async fn remove_network_if_unused_locked(&self, network: &NetworkSpec) -> ProviderResult<()> {
        let namespace = network.labels.get(tags::NAMESPACE).map(String::as_str).unwrap_or_default();
        let cluster = network.labels.get(tags::CLUSTER).map(String::as_str);
        let mut filter = vec![(tags::NAMESPACE, namespace)];
        if let Some(cluster) = cluster {
            filter.push((tags::CLUSTER, cluster));
        }
        let members = self.list(spec::label_filter(filter)).await?;
        let in_use = members.iter().any(|c| {
            c.labels.as_ref().is_some_and(|l| l.contains_key(tags::SERVER_UID) && l.get(tags::CLUSTER).map(String::as_str) == cluster)
        });
        if in_use {
            return Ok(());
        }
        let docker = self.docker().await?;
        for id in self.networks(network).await? {
            match docker.remove_network(&id).await {
                Ok(()) => tracing::debug!(network = %network.name, "removed the network of the last server"),
                Err(e) if matches!(status_of(&e), Some(404)) => {}
                // Joined meanwhile by a container of another process: it stays.
                Err(e) if matches!(status_of(&e), Some(403 | 409)) => {
                    tracing::debug!(network = %network.name, error = %e, "network still in use")
                }
                Err(e) => return Err(classify(&format!("remove network {}", network.name), e)),
            }
        }
        Ok(())
    }

    /// The Docker volumes of the disks of the Server `uid`, as (name, labels).
    pub async fn disk_volumes(&self, uid: &str) -> ProviderResult<Vec<(String, HashMap<String, String>)>> {
        let docker = self.docker().await?;
        let mut filters = spec::label_filter([(tags::SERVER_UID, uid)]);
        filters.entry("label".into()).or_default().push(tags::DISK.to_string());
        let listed =
            docker.list_volumes(Some(ListVolumesOptions { filters: Some(filters) })).await.map_err(|e| classify("list volumes", e))?;
        Ok(listed.volumes.unwrap_or_default().into_iter().map(|v| (v.name, v.labels)).collect())
    }

    /// Removes one disk volume by name (a retained disk nobody needs any more: the
    /// operator's decision, never the controller's). A volume already gone is no error.
    pub async fn delete_disk_volume(&self, name: &str) -> ProviderResult<()> {
        let docker = self.docker().await?;
        match docker.remove_volume(name, Some(RemoveVolumeOptions { force: false })).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(classify(&format!("remove volume {name}"), e)),
        }
    }

    /// Removes the disk volumes of the Server `uid` whose deletionPolicy is Delete (a
    /// retained one stays, labelled `provisioning.dev/retained`).
    async fn remove_disks(&self, uid: &str) -> ProviderResult<()> {
        for (name, labels) in self.disk_volumes(uid).await? {
            if labels.get(tags::RETAINED).is_some_and(|v| v == "true") {
                continue;
            }
            self.delete_disk_volume(&name).await?;
        }
        Ok(())
    }

    async fn create(&self, spec: ContainerSpec) -> ProviderResult<()> {
        let docker = self.docker().await?;
        // Checked first so that a missing image leaves no network behind.
        if !image::node_image_exists(docker, &spec.image).await.map_err(|e| match e {
            image::ImageError::Docker(e) => e,
            other => ProviderError::Transient(other.to_string()),
        })? {
            return Err(ProviderError::InvalidRequest(format!("image {} is missing: run `provisioning image build` first", spec.image)));
        }
        let _guard = self.network_lock.lock().await?;
        let network_id = self.ensure_network(&spec.network).await?;
        // Joined by id, and the endpoint keeps that id: Docker stores endpoints by network
        // name and resolves the name again at every start, unless the endpoint names the id.
        let mut body = spec.body;
        if let Some(host) = body.host_config.as_mut() {
            host.network_mode = Some(network_id.clone());
        }
        if let Some(endpoints) = body.networking_config.as_mut().and_then(|n| n.endpoints_config.as_mut())
            && let Some(mut endpoint) = endpoints.remove(&spec.network.name)
        {
            endpoint.network_id = Some(network_id.clone());
            endpoints.insert(network_id, endpoint);
        }
        let options = CreateContainerOptions { name: Some(spec.name.clone()), ..Default::default() };
        match docker.create_container(Some(options), body).await {
            Ok(_) => Ok(()),
            // Same name: a concurrent ensure_server created it; the caller finds it by label.
            Err(e) if status_of(&e) == Some(409) => Ok(()),
            Err(e) => {
                let error = classify(&format!("create container {}", spec.name), e);
                if let Err(cleanup) = self.remove_network_if_unused_locked(&spec.network).await {
                    tracing::warn!(network = %spec.network.name, error = %cleanup, "network left after a failed create");
                }
                Err(error)
            }
        }
    }

    /// Starts a created container. While a racing process still removes its duplicate
    /// network, the engine finds the network name ambiguous: settle the duplicates and retry.
    async fn start(&self, id: &str, network: &NetworkSpec) -> ProviderResult<()> {
        let docker = self.docker().await?;
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match docker.start_container(id, None).await {
                Ok(()) => return Ok(()),
                // 304: already started.
                Err(e) if status_of(&e) == Some(304) => return Ok(()),
                Err(e) if e.to_string().contains("ambiguous") && tokio::time::Instant::now() < give_up => {
                    tracing::debug!(container = id, error = %e, "settling duplicate networks before start");
                    let guard = self.network_lock.lock().await?;
                    self.ensure_network(network).await?;
                    drop(guard);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => return Err(classify(&format!("start container {id}"), e)),
            }
        }
    }

    /// Observes a container with the plan its limits really are: `docker update` changes
    /// CPU and memory but not the plan label, so the label is trusted only while it agrees.
    async fn observe_live(&self, container: &ContainerSummary) -> ProviderResult<ServerObservation> {
        let mut obs = observe(container);
        let Some(id) = container.id.as_deref() else { return Ok(obs) };
        let docker = self.docker().await?;
        let inspected = match docker.inspect_container(id, None).await {
            Ok(i) => i,
            // Removed between the list and the inspect: the listed state is what we know.
            Err(e) if status_of(&e) == Some(404) => return Ok(obs),
            Err(e) => return Err(classify(&format!("inspect container {id}"), e)),
        };
        let host = inspected.host_config.unwrap_or_default();
        if let (Some(nano_cpus), Some(memory)) = (host.nano_cpus.filter(|n| *n > 0), host.memory.filter(|m| *m > 0)) {
            let live = spec::Resources { nano_cpus, memory };
            if spec::parse_plan(&obs.plan) != Some(live) {
                obs.plan = spec::plan_name(live);
            }
        }
        Ok(obs)
    }

    async fn by_id(&self, id: &ProviderId) -> ProviderResult<Option<ContainerSummary>> {
        let native = id.native_id();
        if native.is_empty() || !native.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
            return Ok(None);
        }
        let mut filters = spec::label_filter([]);
        filters.insert("label".into(), vec![tags::SERVER_UID.to_string()]);
        filters.insert("id".into(), vec![native.to_string()]);
        let found = self.list(filters).await?;
        // The id filter matches prefixes; only the exact container counts.
        Ok(found.into_iter().find(|c| c.id.as_deref() == Some(native)))
    }
}

/// Whether `container` is on (or, created but not started, will join) the network `id`.
fn on_network(container: &ContainerSummary, id: &str) -> bool {
    let mode = container.host_config.as_ref().and_then(|h| h.network_mode.as_deref());
    let endpoints = container.network_settings.as_ref().and_then(|n| n.networks.as_ref());
    mode == Some(id) || endpoints.into_iter().flatten().any(|(_, e)| e.network_id.as_deref() == Some(id))
}

/// Maps a container summary to what the contract reports.
fn observe(container: &ContainerSummary) -> ServerObservation {
    let labels: BTreeMap<String, String> = container.labels.clone().unwrap_or_default().into_iter().collect();
    let state = match container.state {
        Some(ContainerSummaryStateEnum::CREATED | ContainerSummaryStateEnum::RESTARTING) => MachineState::Pending,
        Some(ContainerSummaryStateEnum::RUNNING) => MachineState::Running,
        Some(ContainerSummaryStateEnum::STOPPING) => MachineState::Stopping,
        Some(ContainerSummaryStateEnum::EXITED) => MachineState::Stopped,
        Some(ContainerSummaryStateEnum::REMOVING) => MachineState::Terminating,
        Some(ContainerSummaryStateEnum::PAUSED) => MachineState::Other("paused".into()),
        Some(ContainerSummaryStateEnum::DEAD) => MachineState::Other("dead".into()),
        Some(ContainerSummaryStateEnum::EMPTY) | None => MachineState::Other("unknown".into()),
    };
    let mut addresses = Vec::new();
    if state == MachineState::Running {
        let networks = container.network_settings.as_ref().and_then(|n| n.networks.as_ref());
        let mut ips: Vec<(&String, String)> = networks
            .into_iter()
            .flatten()
            .filter_map(|(name, ep)| ep.ip_address.clone().filter(|ip| !ip.is_empty()).map(|ip| (name, ip)))
            .collect();
        ips.sort();
        addresses.extend(ips.into_iter().map(|(_, ip)| Address { kind: "InternalIP".into(), address: ip }));
        if let Some(server) = labels.get(tags::SERVER) {
            addresses.push(Address { kind: "Hostname".into(), address: server.chars().take(63).collect() });
        }
    }
    ServerObservation {
        provider_id: ProviderId::new("local", container.id.as_deref().unwrap_or_default()),
        state,
        addresses,
        plan: labels.get(PLAN_LABEL).cloned().unwrap_or_default(),
        tags: labels,
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn provider_type(&self) -> &'static str {
        "local"
    }

    fn price(&self, _plan: &str, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        Ok(crate::prices::local())
    }

    fn disk_price(&self, _disk_type: &str, _size_gib: u64, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        Ok(crate::prices::local())
    }

    fn resolve_plan(&self, plan: &str) -> ProviderResult<String> {
        spec::resolve_plan(plan)
    }

    fn machine_event_source(&self) -> Option<String> {
        Some(format!("docker:{}", if self.endpoint.is_empty() { "local" } else { &self.endpoint }))
    }

    fn machine_events(&self) -> MachineEvents {
        events::follow(self.endpoint.clone())
    }

    fn can_start_servers(&self) -> bool {
        true
    }

    fn in_place(&self, field: crate::MachineField) -> Result<(), String> {
        match field {
            // docker update changes CPU and memory limits of a running container.
            crate::MachineField::Plan => Ok(()),
            crate::MachineField::Image => Err("the local provider cannot change the image of a running container".into()),
            crate::MachineField::Zone => Err("the local provider cannot move a container to another zone".into()),
        }
    }

    fn same_plan(&self, a: &str, b: &str) -> bool {
        a == b || matches!((spec::parse_plan(a), spec::parse_plan(b)), (Some(x), Some(y)) if x == y)
    }

    async fn update_server(&self, id: &ProviderId, request: &ServerRequest) -> ProviderResult<ServerObservation> {
        let plan = spec::resolve_plan(&request.plan)?;
        let resources =
            spec::parse_plan(&plan).ok_or_else(|| ProviderError::InvalidRequest(format!("plan {plan:?} has no CPU and memory size")))?;
        if self.by_id(id).await?.is_none() {
            return Err(ProviderError::NotFound(format!("machine {id}")));
        }
        let docker = self.docker().await?;
        let body = bollard::models::ContainerUpdateBody {
            nano_cpus: Some(resources.nano_cpus),
            memory: Some(resources.memory),
            // As at create: no swap beyond the memory limit.
            memory_swap: Some(resources.memory),
            ..Default::default()
        };
        docker.update_container(id.native_id(), body).await.map_err(|e| classify(&format!("update container {id}"), e))?;
        match self.by_id(id).await? {
            Some(updated) => self.observe_live(&updated).await,
            None => Err(ProviderError::NotFound(format!("machine {id} vanished while it was updated"))),
        }
    }

    async fn start_server(&self, id: &ProviderId) -> ProviderResult<ServerObservation> {
        let Some(container) = self.by_id(id).await? else {
            return Err(ProviderError::NotFound(format!("machine {id}")));
        };
        if container.state != Some(ContainerSummaryStateEnum::RUNNING) {
            let labels = container.labels.clone().unwrap_or_default();
            let namespace = labels.get(tags::NAMESPACE).cloned().unwrap_or_default();
            let network = NetworkSpec::new(&namespace, labels.get(tags::CLUSTER).map(String::as_str));
            self.start(id.native_id(), &network).await?;
        }
        match self.by_id(id).await? {
            Some(started) => Ok(observe(&started)),
            None => Err(ProviderError::NotFound(format!("machine {id} vanished while it was started"))),
        }
    }

    async fn validate_credentials(&self) -> ProviderResult<()> {
        let docker = self.docker().await?;
        docker.ping().await.map(|_| ()).map_err(|e| classify(&format!("ping (account {})", self.account), e))
    }

    async fn ensure_server(&self, request: &ServerRequest) -> ProviderResult<ServerObservation> {
        let image = self.image_for(&request.image)?;
        let spec = spec::container_spec(request, &image, &self.mounts)?;
        if self.find(&request.identity).await?.is_none() {
            self.create(spec.clone()).await?;
        }
        // After a name conflict the other creator's container may take a moment to be listed.
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let container = loop {
            match self.find(&request.identity).await? {
                Some(container) => break container,
                None if tokio::time::Instant::now() < give_up => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                None => {
                    return Err(ProviderError::Transient(format!(
                        "the container of server {} is not listed after its create",
                        request.identity.name
                    )));
                }
            }
        };
        // A create that was interrupted before start leaves a created container: finish it.
        // Stopped (exited) containers are reported as such; replacing them is the caller's call.
        if container.state == Some(ContainerSummaryStateEnum::CREATED) {
            let id = container.id.clone().unwrap_or_default();
            self.start(&id, &spec.network).await?;
            if let Some(started) = self.by_id(&ProviderId::new("local", &id)).await? {
                return Ok(observe(&started));
            }
        }
        Ok(observe(&container))
    }

    async fn find_server(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        Ok(self.find(identity).await?.as_ref().map(observe))
    }

    async fn observe_server(&self, id: &ProviderId) -> ProviderResult<Option<ServerObservation>> {
        match self.by_id(id).await? {
            Some(container) => self.observe_live(&container).await.map(Some),
            None => Ok(None),
        }
    }

    async fn delete_server(&self, id: &ProviderId) -> ProviderResult<DeleteOutcome> {
        let Some(container) = self.by_id(id).await? else {
            return Ok(DeleteOutcome::Gone);
        };
        let labels = container.labels.clone().unwrap_or_default();
        let namespace = labels.get(tags::NAMESPACE).cloned().unwrap_or_default();
        let network = NetworkSpec::new(&namespace, labels.get(tags::CLUSTER).map(String::as_str));
        let docker = self.docker().await?;
        // The machine is being destroyed: no graceful stop, and its anonymous volumes go too.
        let options = RemoveContainerOptions { force: true, v: true, link: false };
        match docker.remove_container(id.native_id(), Some(options)).await {
            Ok(()) => {}
            Err(e) if status_of(&e) == Some(404) => {}
            // "removal already in progress"
            Err(e) if status_of(&e) == Some(409) => return Ok(DeleteOutcome::InProgress),
            Err(e) => return Err(classify(&format!("remove container {id}"), e)),
        }
        self.remove_network_if_unused(&network).await?;
        if let Some(uid) = labels.get(tags::SERVER_UID) {
            self.remove_disks(uid).await?;
        }
        Ok(DeleteOutcome::Gone)
    }

    async fn exec(&self, id: &ProviderId, request: ExecRequest) -> ProviderResult<ExecResult> {
        if self.by_id(id).await?.is_none() {
            return Err(ProviderError::NotFound(format!("machine {id}")));
        }
        exec::run(self.docker().await?, id.native_id(), request).await
    }

    async fn list_servers(&self, tags: &[(String, String)]) -> ProviderResult<Vec<ServerObservation>> {
        let mut filter: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut filters = spec::label_filter(filter.drain(..));
        // Only machines of this provider: containers that carry a server uid.
        filters.entry("label".into()).or_default().push(tags::SERVER_UID.to_string());
        Ok(self.list(filters).await?.iter().map(observe).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerSummaryNetworkSettings, EndpointSettings};

    fn summary(state: ContainerSummaryStateEnum) -> ContainerSummary {
        let labels = HashMap::from([
            (tags::SERVER_UID.to_string(), "u1".to_string()),
            (tags::SERVER.to_string(), "etcd-0".to_string()),
            (PLAN_LABEL.to_string(), "cpu1-mem1g".to_string()),
        ]);
        let endpoint = EndpointSettings { ip_address: Some("172.20.0.2".into()), ..Default::default() };
        ContainerSummary {
            id: Some("abc123".into()),
            labels: Some(labels),
            state: Some(state),
            network_settings: Some(ContainerSummaryNetworkSettings {
                networks: Some(HashMap::from([("prov_ns_etcd".to_string(), endpoint)])),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn states_and_addresses_map_to_the_contract() {
        let running = observe(&summary(ContainerSummaryStateEnum::RUNNING));
        assert_eq!(running.provider_id.0, "local://abc123");
        assert_eq!(running.state, MachineState::Running);
        assert_eq!(running.plan, "cpu1-mem1g");
        let kinds: Vec<(&str, &str)> = running.addresses.iter().map(|a| (a.kind.as_str(), a.address.as_str())).collect();
        assert_eq!(kinds, [("InternalIP", "172.20.0.2"), ("Hostname", "etcd-0")]);
        for (state, expected) in [
            (ContainerSummaryStateEnum::CREATED, MachineState::Pending),
            (ContainerSummaryStateEnum::EXITED, MachineState::Stopped),
            (ContainerSummaryStateEnum::REMOVING, MachineState::Terminating),
            (ContainerSummaryStateEnum::DEAD, MachineState::Other("dead".into())),
        ] {
            let obs = observe(&summary(state));
            assert_eq!(obs.state, expected);
            assert!(obs.addresses.is_empty(), "only running machines have addresses: {obs:?}");
        }
    }

    #[test]
    fn images_map_to_the_node_image_or_pass_through() {
        let config = ProviderConfig { images: BTreeMap::from([("custom".to_string(), "mine:1".to_string())]), ..Default::default() };
        let provider = LocalProvider::new(&config).expect("provider");
        assert_eq!(provider.image_for("debian-12").ok().as_deref(), Some(DEFAULT_NODE_IMAGE));
        assert_eq!(provider.image_for("custom").ok().as_deref(), Some("mine:1"));
        assert_eq!(provider.image_for("alpine:3").ok().as_deref(), Some("alpine:3"));
        assert!(matches!(provider.image_for("ubuntu-24"), Err(ProviderError::InvalidRequest(_))));
    }
}
