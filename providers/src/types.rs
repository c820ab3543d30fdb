//! Plain data types of the provider contract.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A machine's id at its provider, written `<type>://<native id>` (Cluster API style).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProviderId(pub String);

impl ProviderId {
    /// Builds `<provider_type>://<native_id>`.
    pub fn new(provider_type: &str, native_id: &str) -> Self {
        ProviderId(format!("{provider_type}://{native_id}"))
    }
    /// The part after `://` (the whole string when there is no scheme).
    pub fn native_id(&self) -> &str {
        self.0.split_once("://").map(|(_, id)| id).unwrap_or(&self.0)
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who a machine belongs to: the identity tagged onto it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerIdentity {
    /// The Server's metadata.uid.
    pub uid: String,
    /// The Server's namespace.
    pub namespace: String,
    /// The Server's name.
    pub name: String,
    /// The owning Cluster, if any.
    pub cluster: Option<String>,
}

impl ServerIdentity {
    /// The identity as tag key/value pairs (the keys of [`crate::tags`]).
    pub fn tags(&self) -> Vec<(String, String)> {
        let mut tags = vec![
            (crate::tags::SERVER_UID.to_string(), self.uid.clone()),
            (crate::tags::NAMESPACE.to_string(), self.namespace.clone()),
            (crate::tags::SERVER.to_string(), self.name.clone()),
        ];
        if let Some(cluster) = &self.cluster {
            tags.push((crate::tags::CLUSTER.to_string(), cluster.clone()));
        }
        tags
    }
}

/// What a Server asks of its provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRequest {
    /// Who the machine belongs to.
    pub identity: ServerIdentity,
    /// Plan as written (abstract or native); the provider resolves it.
    pub plan: String,
    /// Zone or region; empty for the account default.
    pub zone: String,
    /// Image, abstract (debian-12) or native.
    pub image: String,
    /// Public SSH key to install for exec on cloud machines.
    pub ssh_public_key: Option<String>,
    /// Extra tags to put on the machine.
    pub extra_tags: BTreeMap<String, String>,
}

/// A machine's lifecycle state, normalised across providers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MachineState {
    /// Being created or booting.
    Pending,
    /// Up.
    Running,
    /// Shutting down to stopped.
    Stopping,
    /// Stopped (exists, not running).
    Stopped,
    /// Being deleted.
    Terminating,
    /// Deleted (some clouds keep showing these for a while).
    Terminated,
    /// Anything else, with the provider's word for it.
    Other(String),
}

impl MachineState {
    /// Lower-case word for status.
    pub fn as_str(&self) -> &str {
        match self {
            MachineState::Pending => "pending",
            MachineState::Running => "running",
            MachineState::Stopping => "stopping",
            MachineState::Stopped => "stopped",
            MachineState::Terminating => "terminating",
            MachineState::Terminated => "terminated",
            MachineState::Other(s) => s,
        }
    }
}

/// An address of a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    /// InternalIP, ExternalIP, InternalDNS, ExternalDNS or Hostname.
    pub kind: String,
    /// The address.
    pub address: String,
}

/// What a provider observes of a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerObservation {
    /// Provider id.
    pub provider_id: ProviderId,
    /// Lifecycle state.
    pub state: MachineState,
    /// Addresses (may be empty while pending).
    pub addresses: Vec<Address>,
    /// Native plan.
    pub plan: String,
    /// Tags on the machine.
    pub tags: BTreeMap<String, String>,
}

impl ServerObservation {
    /// Whether the machine is up.
    pub fn is_running(&self) -> bool {
        self.state == MachineState::Running
    }
}

/// Result of a delete call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The machine no longer exists (including: it never did).
    Gone,
    /// Deletion started; observe again later.
    InProgress,
}

/// A stream of output lines from a running command.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<String>;

/// A command to run on a machine.
#[derive(Clone, Debug)]
pub struct ExecRequest {
    /// Program and arguments (no shell is involved).
    pub argv: Vec<String>,
    /// Bytes fed to standard input, then closed.
    pub stdin: Option<Vec<u8>>,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// Kill the command after this long.
    pub timeout: Duration,
    /// Where output lines go as they come (stdout and stderr, line by line).
    pub output: Option<OutputSink>,
    /// SSH providers: log in with this key instead of the account's `SSH_PRIVATE_KEY` (a
    /// Server's own `spec.sshKeySecretRef`). Ignored by providers without SSH.
    pub ssh_key: Option<SshPrivateKey>,
}

/// An OpenSSH private key (PEM text). A secret: `Debug` never prints it, and it is never
/// part of an error message.
#[derive(Clone, PartialEq, Eq)]
pub struct SshPrivateKey(pub String);

impl fmt::Debug for SshPrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SshPrivateKey([redacted])")
    }
}

/// Result of a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    /// Exit code; `None` when killed (timeout) or unknown.
    pub exit_code: Option<i64>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Standard output, whole (bounded by the provider to a few MiB).
    pub stdout: String,
    /// Standard error, whole (bounded likewise).
    pub stderr: String,
}

/// Secret values of an account. `Debug` never prints them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials(pub BTreeMap<String, String>);

impl Credentials {
    /// A value by key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&String> = self.0.keys().collect();
        write!(f, "Credentials(keys: {keys:?}, values redacted)")
    }
}

/// Settings of the simulated provider.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimulationConfig {
    /// Latency of each operation.
    pub latency: Duration,
    /// Variation of the latency, 0..=100 percent.
    pub jitter_percent: u32,
    /// Share of calls failing transiently, 0.0..=1.0.
    pub failure_rate: f64,
    /// When set, credentials must hold `SIMULATED_TOKEN` with this value.
    pub required_token: Option<String>,
}

/// Everything needed to build a provider for one account.
#[derive(Clone, Debug, Default)]
pub struct ProviderConfig {
    /// Account name (from the Workspace).
    pub name: String,
    /// Provider type: local, aws, upcloud, simulated.
    pub provider_type: String,
    /// Region (AWS).
    pub region: String,
    /// Zone (UpCloud) or default zone.
    pub zone: String,
    /// Endpoint override; empty for the public endpoint.
    pub endpoint: String,
    /// Secret values.
    pub credentials: Credentials,
    /// Abstract image → native id overrides.
    pub images: BTreeMap<String, String>,
    /// Calls per second allowed; 0 for the provider default.
    pub rate_limit: u32,
    /// Simulated provider behaviour.
    pub simulation: SimulationConfig,
    /// Directory for provider state files (simulated store, SSH known hosts…).
    pub state_dir: PathBuf,
    /// Local provider: the `nu` binary on the Docker host, mounted read-only into every
    /// container at `/usr/local/bin/nu`.
    pub nu_binary: Option<PathBuf>,
    /// Local provider: the taskserv catalog directory on the Docker host, mounted read-only
    /// into every container at `/opt/provisioning/catalog`.
    pub catalog_dir: Option<PathBuf>,
    /// How cloud providers (aws, upcloud) reach machines over SSH for `exec`. The private
    /// key itself is a credential: `SSH_PRIVATE_KEY` in [`ProviderConfig::credentials`].
    pub ssh: SshSettings,
    /// How new machines are fenced off (aws security groups and subnet, upcloud firewall).
    pub network: NetworkSettings,
}

/// How an account's new machines are fenced off at the provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkSettings {
    /// aws: security groups new instances join; empty for the provider's managed group
    /// (SSH from `ssh_source_cidrs`, all traffic between members, nothing else).
    pub security_group_ids: Vec<String>,
    /// aws: subnet for new instances; empty for the default subnet.
    pub subnet_id: String,
    /// Sources (CIDR) allowed to reach SSH; empty for any.
    pub ssh_source_cidrs: Vec<String>,
    /// upcloud: firewall rules; non-empty turns each new server's firewall on.
    pub firewall_rules: Vec<FirewallRule>,
}

/// One firewall rule as an account declares it (see the upcloud provider for the mapping to
/// UpCloud's `firewall_rule`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirewallRule {
    /// `in` or `out`.
    pub direction: String,
    /// `accept`, `reject` or `drop`.
    pub action: String,
    /// `IPv4` or `IPv6`; empty for IPv4.
    pub family: String,
    /// `tcp`, `udp`, `icmp`; empty for any.
    pub protocol: String,
    /// Source CIDR or address; empty for any.
    pub source: String,
    /// Destination port or `start-end`; empty for any.
    pub destination_port: String,
    /// Free text.
    pub comment: String,
}

/// How a cloud provider reaches its machines over SSH.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SshSettings {
    /// Login user; empty for the provider's default (aws: `admin`, upcloud: `root`).
    pub user: String,
    /// Port; 0 for 22.
    pub port: u16,
    /// Connect to this host instead of the machine's address (bastion port-forwards, tests).
    pub address_override: Option<String>,
    /// Files copied to every machine before its first command (the `nu` binary, task scripts).
    pub assets: Vec<SshAsset>,
    /// Remote file holding the content hash of the copied assets; empty for
    /// `/var/lib/provisioning/assets.sha256`.
    pub assets_marker: String,
    /// Connect and handshake timeout; zero for 20 s.
    pub connect_timeout: Duration,
    /// Whether the asset copy and every command run as root through `sudo -n` (passwordless
    /// sudo; a prompt or a missing sudo is a `Permanent` error). `None`: when the login user
    /// is not root. A root login never uses sudo.
    pub become_root: Option<bool>,
}

/// A file copied to machines before the first command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshAsset {
    /// Path on the controller.
    pub local: PathBuf,
    /// Absolute path on the machine.
    pub remote: String,
    /// Unix mode, e.g. 0o755.
    pub mode: u32,
}
