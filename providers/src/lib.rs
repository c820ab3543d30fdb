//! The Provider contract and its implementations.
//!
//! A provider turns a [`ServerRequest`] into a machine and reports what it observes. Every
//! machine carries the Server's identity as tags (EC2 tags, UpCloud labels, Docker labels),
//! and `ensure_server` looks the machine up by those tags before creating one, so a lost
//! response or a restarted controller never makes a second machine.
//!
//! This crate has no Kubernetes dependency: the controller translates resources into these
//! plain types.

pub mod aws;
pub mod contract;
pub mod error;
pub mod local;
pub mod output;
pub mod plans;
pub mod prices;
pub mod ratelimit;
pub mod simulated;
pub mod simulated_scripts;
pub mod ssh;
pub mod types;
pub mod upcloud;

pub use error::{CapacityError, CapacityKind, ProviderError, ProviderResult};
pub use types::*;

use std::sync::Arc;

use async_trait::async_trait;

/// Tag / label keys every machine carries.
pub mod tags {
    /// The Server's uid.
    pub const SERVER_UID: &str = "provisioning.dev/server-uid";
    /// On a disk (EBS volume, UpCloud storage, Docker volume): the disk's name in the spec.
    pub const DISK: &str = "provisioning.dev/disk";
    /// On a disk: `"true"` when it outlives its machine (deletionPolicy Retain).
    pub const RETAINED: &str = "provisioning.dev/retained";
    /// The Server's namespace.
    pub const NAMESPACE: &str = "provisioning.dev/namespace";
    /// The Server's name.
    pub const SERVER: &str = "provisioning.dev/server";
    /// The owning Cluster's name, when a Cluster owns the Server.
    pub const CLUSTER: &str = "provisioning.dev/cluster";
    /// Set to `"true"` by a machine's owner to allow a Server of another identity to adopt
    /// it through `spec.externalID`.
    pub const ADOPTABLE: &str = "provisioning.dev/adoptable";
    /// The owning Cluster's uid, on a Cluster's control-plane endpoint (load balancer,
    /// floating IP).
    pub const CLUSTER_UID: &str = "provisioning.dev/cluster-uid";
}

/// What every provider implements. All methods are idempotent.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider type: `local`, `aws`, `upcloud` or `simulated`.
    fn provider_type(&self) -> &'static str;

    /// Resolves an abstract plan (small|medium|large|xlarge) or a native plan name to the
    /// native plan, or fails with [`ProviderError::InvalidRequest`] naming the plan.
    fn resolve_plan(&self, plan: &str) -> ProviderResult<String>;

    /// Checks that the account's credentials are accepted (auth errors are `Permanent`).
    async fn validate_credentials(&self) -> ProviderResult<()>;

    /// Finds the machine of a Server by its identity tags, or creates it. Never creates a
    /// second machine for the same Server uid.
    async fn ensure_server(&self, request: &ServerRequest) -> ProviderResult<ServerObservation>;

    /// Looks a Server's machine up by its identity tags only (no create).
    async fn find_server(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>>;

    /// Observes a machine by provider id; `None` when it does not exist (any more).
    async fn observe_server(&self, id: &ProviderId) -> ProviderResult<Option<ServerObservation>>;

    /// Deletes a machine. A machine that is already gone is `Gone`.
    async fn delete_server(&self, id: &ProviderId) -> ProviderResult<DeleteOutcome>;

    /// Runs a command on the machine. Output lines go to `request.output` as they come.
    async fn exec(&self, id: &ProviderId, request: ExecRequest) -> ProviderResult<ExecResult>;

    /// Observes machine `id` for the Server of uid `server_uid`: the machine must carry that
    /// uid tag (or its owner's `adoptable` tag), else [`ProviderError::NotOwned`]. A machine id
    /// from a Server's status is never trusted alone (issue 26): a tenant who can write status
    /// could point it at another tenant's machine.
    async fn observe_owned(&self, id: &ProviderId, server_uid: &str) -> ProviderResult<Option<ServerObservation>> {
        let observed = self.observe_server(id).await?;
        if let Some(o) = &observed {
            check_owner(o, server_uid, "observe")?;
        }
        Ok(observed)
    }

    /// Deletes machine `id` of the Server of uid `server_uid`, after the ownership check of
    /// [`Provider::observe_owned`]; a machine that is gone is `Gone`.
    async fn delete_owned(&self, id: &ProviderId, server_uid: &str) -> ProviderResult<DeleteOutcome> {
        match self.observe_server(id).await? {
            Some(o) if o.state != MachineState::Terminated => check_owner(&o, server_uid, "delete")?,
            _ => return Ok(DeleteOutcome::Gone),
        }
        self.delete_server(id).await
    }

    /// Runs a command on machine `id` of the Server of uid `server_uid`, after the ownership
    /// check of [`Provider::observe_owned`].
    async fn exec_owned(&self, id: &ProviderId, server_uid: &str, request: ExecRequest) -> ProviderResult<ExecResult> {
        let observed = self.observe_server(id).await?.ok_or_else(|| ProviderError::NotFound(format!("machine {id}")))?;
        check_owner(&observed, server_uid, "run scripts on")?;
        self.exec(id, request).await
    }

    /// Lists every machine of this account that carries the given tags (all of them).
    /// Used for leak checks and by tests.
    async fn list_servers(&self, tags: &[(String, String)]) -> ProviderResult<Vec<ServerObservation>>;

    /// The id and state of every machine of this account carrying all of `tags`, in as few
    /// API calls as the provider allows — what the controller's batched drift survey polls
    /// once per account and interval, whatever the number of machines. Addresses and plans
    /// are not needed there, so providers whose list call lacks them (UpCloud) do not fetch
    /// each machine's details. The default is [`Provider::list_servers`].
    async fn survey(&self, tags: &[(String, String)]) -> ProviderResult<Vec<MachineSummary>> {
        Ok(self.list_servers(tags).await?.into_iter().map(|o| MachineSummary { provider_id: o.provider_id, state: o.state }).collect())
    }

    /// The SSH host key (OpenSSH public-key line) pinned for a machine on first contact, for
    /// the Server's `status.hostKey`. `None` for providers without SSH or before first contact.
    fn pinned_host_key(&self, _id: &ProviderId) -> Option<String> {
        None
    }

    /// Pins a host key recorded earlier (from `status.hostKey`), so that a restarted
    /// controller still refuses a machine whose key changed.
    fn pin_host_key(&self, _id: &ProviderId, _host_key: &str) {}

    /// The OpenSSH public key new machines must authorise so that `exec` can log in
    /// (derived from the account's `SSH_PRIVATE_KEY`); `None` for providers without SSH.
    fn ssh_public_key(&self) -> Option<String> {
        None
    }

    /// Where [`Provider::machine_events`] comes from (e.g. one Docker engine), so that one
    /// follower serves every account sharing it; `None` when this provider cannot follow its
    /// machines (they are observed at each resync instead).
    fn machine_event_source(&self) -> Option<String> {
        None
    }

    /// Follows this provider's machines: an item each time one of them stops or is removed,
    /// whoever did it. Connects lazily; the caller reconnects (with backoff) after an error or
    /// the end of the stream. Empty for providers without a [`Provider::machine_event_source`].
    fn machine_events(&self) -> MachineEvents {
        Box::pin(futures::stream::empty())
    }

    /// Whether [`Provider::start_server`] can start a stopped machine.
    fn can_start_servers(&self) -> bool {
        false
    }

    /// Starts a stopped machine and observes it (a running one is left as it is).
    async fn start_server(&self, id: &ProviderId) -> ProviderResult<ServerObservation> {
        Err(ProviderError::Permanent(format!("the {} provider cannot start machine {id}", self.provider_type())))
    }

    /// Whether `field` of an existing, running machine can be changed in place by
    /// [`Provider::update_server`] (`Ok`), or why a new machine is needed (`Err`, a sentence
    /// for the plan's `reason`). Pure: no API call. The default is honest for clouds that
    /// resize only stopped machines (EC2 ModifyInstanceAttribute, UpCloud modify server):
    /// this controller does not stop machines to resize them, so every change replaces.
    fn in_place(&self, field: MachineField) -> Result<(), String> {
        let provider = self.provider_type();
        Err(match field {
            MachineField::Plan => format!(
                "the {provider} provider changes a machine's plan only while it is stopped, and the controller does not stop running machines"
            ),
            MachineField::Zone => format!("the {provider} provider cannot move a machine to another zone"),
            MachineField::Image => format!("the {provider} provider cannot change the image of an existing machine"),
        })
    }

    /// Whether two native plan names mean the same size (`cpu1-mem1024m` and `cpu1-mem1g`).
    fn same_plan(&self, a: &str, b: &str) -> bool {
        a == b
    }

    /// Changes machine `id` in place to what `request` asks for (the fields
    /// [`Provider::in_place`] accepts) and observes it.
    async fn update_server(&self, id: &ProviderId, _request: &ServerRequest) -> ProviderResult<ServerObservation> {
        Err(ProviderError::Permanent(format!("the {} provider cannot change machine {id} in place", self.provider_type())))
    }

    /// The list price of a machine of native plan `plan` in `zone` (empty: the account's
    /// region or zone), from the provider's price table (no API call). `Err` says why there
    /// is none (a plan, region or zone the table does not cover); never a guessed figure.
    fn price(&self, plan: &str, _zone: &str) -> Result<prices::Price, prices::NoPrice> {
        Err(format!("the {} provider has no price table (plan {plan:?})", self.provider_type()))
    }

    /// The list price of an extra disk of `size_gib` of `disk_type` (empty: the provider's
    /// default) in `zone` (empty: the account's), from the provider's table (no API call).
    fn disk_price(&self, disk_type: &str, size_gib: u64, _zone: &str) -> Result<prices::Price, prices::NoPrice> {
        Err(format!("the {} provider has no disk price table ({size_gib} GiB {disk_type:?})", self.provider_type()))
    }

    /// Whether this provider can make a control-plane endpoint of `kind` (`Err`: a sentence
    /// for the Cluster's `EndpointReady` condition). Pure: no API call.
    fn supports_endpoint(&self, kind: EndpointKind) -> Result<(), String> {
        Err(format!("the {} provider has no {}s", self.provider_type(), kind.noun()))
    }

    /// Finds the Cluster's endpoint of `request.kind` by its identity tags, or creates it,
    /// then converges it: a load balancer's targets become `request.targets` (TCP on
    /// `request.port`, health-checked), a floating IP is on [`floating_ip_holder`]. Never
    /// creates a second one for the same Cluster uid.
    async fn ensure_endpoint(&self, request: &EndpointRequest) -> ProviderResult<EndpointObservation> {
        Err(ProviderError::InvalidRequest(format!("the {} provider cannot make a {}", self.provider_type(), request.kind.noun())))
    }

    /// Looks the Cluster's endpoint of `kind` up by its identity tags (no create).
    async fn find_endpoint(&self, _kind: EndpointKind, _identity: &EndpointIdentity) -> ProviderResult<Option<EndpointObservation>> {
        Ok(None)
    }

    /// Deletes the Cluster's endpoint of `kind` (found by its identity tags); none is `Gone`.
    async fn delete_endpoint(&self, _kind: EndpointKind, _identity: &EndpointIdentity) -> ProviderResult<DeleteOutcome> {
        Ok(DeleteOutcome::Gone)
    }

    /// The list price of an endpoint of `kind` in `zone` (empty: the account's), from the
    /// provider's price table, with its source; `Err` says why there is none.
    fn endpoint_price(&self, kind: EndpointKind, _zone: &str) -> Result<prices::Price, prices::NoPrice> {
        Err(format!("the {} provider has no price for a {}", self.provider_type(), kind.noun()))
    }
}

/// Whether machine `observed` may be acted on for the Server of uid `server_uid`: it carries
/// that uid tag, or the `adoptable` tag its owner set to allow adoption (`spec.externalID`).
/// The error names the machine and the tag, never the other Server's uid.
pub fn check_owner(observed: &ServerObservation, server_uid: &str, action: &str) -> ProviderResult<()> {
    let owner = observed.tags.get(tags::SERVER_UID).map(String::as_str).filter(|u| !u.is_empty());
    if !server_uid.is_empty() && owner == Some(server_uid) {
        return Ok(());
    }
    if observed.tags.get(tags::ADOPTABLE).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(());
    }
    let whose = if owner.is_some() { "another Server's" } else { "no" };
    Err(ProviderError::NotOwned(format!(
        "refusing to {action} machine {}: it carries {whose} {} tag, not this Server's (uid {server_uid:?}); \
         a machine id in status is not proof of ownership",
        observed.provider_id,
        tags::SERVER_UID
    )))
}

/// A shared provider handle.
pub type SharedProvider = Arc<dyn Provider>;

/// Builds the provider for an account.
pub fn build_provider(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    match config.provider_type.as_str() {
        "simulated" => Ok(Arc::new(simulated::SimulatedProvider::open(config)?)),
        "local" => local::build(config),
        "aws" => aws::build(config),
        "upcloud" => upcloud::build(config),
        other => Err(ProviderError::InvalidRequest(format!(
            "provider type {other:?} of account {:?} is not available in this build",
            config.name
        ))),
    }
}
