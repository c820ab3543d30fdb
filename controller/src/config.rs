//! Controller configuration (TOML file), with built-in defaults.
//!
//! ```toml
//! metrics_addr = "0.0.0.0:8080"
//! state_dir = "/var/lib/provisioning"
//! leader_election = true
//! lease_namespace = "provisioning-system"
//! # Split the objects over every replica by Workspace instead (no single leader; see
//! # `crate::shard`): each replica holds a Lease `provisioning-shard-<identity>` there.
//! sharding = false
//! # Accept `http://` provider endpoints (emulators such as moto or a test double only).
//! allow_insecure_endpoints = false
//! # User catalogs, merged after the built-in one (later entries override earlier ones by
//! # service name); relative paths are relative to this file.
//! catalogs = ["/srv/provisioning/my-services", "../team-catalog"]
//! # What a user catalog may replace of the built-in one (or of an earlier catalog): service
//! # names, and "lib" for its shared lib/ files. Nothing by default.
//! catalog_overrides = ["redis"]
//!
//! # Let aws accounts assume roles with the controller's own web identity (IRSA / EKS Pod
//! # Identity token), only for the listed namespace and role pairs. Off when absent.
//! [aws_web_identity]
//! token_file = "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"
//! grants = [{ namespace = "team-a", role_arns = ["arn:aws:iam::123456789012:role/team-a-provisioning"] }]
//!
//! # Settings for namespaces that no Workspace claims (same fields as Workspace.spec).
//! [default_workspace]
//! providers = [{ name = "local", type = "local" }]
//! defaults = { provider = "local", plan = "small", image = "debian-12" }
//! limits = { maxServers = 50, parallelLimit = 5 }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provisioning_crds::{ProviderAccount, ProviderType, WorkspaceSpec};
use serde::Deserialize;

/// Everything the controller can be told by its config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Where /metrics, /healthz and /readyz are served; `None` serves nothing.
    pub metrics_addr: Option<SocketAddr>,
    /// Directory for provider state (simulated provider store, SSH known hosts…).
    pub state_dir: PathBuf,
    /// Settings of namespaces without a Workspace.
    pub default_workspace: WorkspaceSpec,
    /// Whether to take a Lease before acting (needed when more than one replica runs).
    pub leader_election: bool,
    /// Whether replicas split the objects by Workspace (each acting on its own share, over a
    /// consistent-hash ring of the live member Leases) instead of one leader acting on all;
    /// `leader_election` is then not used. Off by default.
    pub sharding: bool,
    /// Namespace of the Lease (the leader's, or each shard member's).
    pub lease_namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// How long a Lease stays valid without renewal, in seconds.
    pub lease_duration_secs: u64,
    /// How often the leader renews, in seconds.
    pub lease_renew_secs: u64,
    /// How long a Ready object waits before its next resync, in seconds (jittered ±10 %).
    pub resync_secs: u64,
    /// How often a Server whose machine is still starting is observed again, in seconds.
    pub poll_secs: u64,
    /// How often the machines of providers without machine events (AWS, UpCloud, simulated)
    /// are surveyed, in seconds: one list call per provider account, whatever the number of
    /// machines (drift is noticed within this interval).
    pub survey_secs: u64,
    /// Reconciles running at once per kind (0: unbounded). Bounded so that a burst of
    /// thousands of objects does not hold thousands of in-flight reconciles in memory.
    pub concurrency: u16,
    /// Whether provider accounts may name a plain `http://` endpoint. Off by default: an
    /// account's credentials must never travel unencrypted or to a spoofable host; only
    /// tests against local emulators (moto, the UpCloud double) turn it on.
    pub allow_insecure_endpoints: bool,
    /// ChangeRecords kept per Server, TaskServ and Cluster (the newest); 0 records none.
    pub history_limit: usize,
    /// Also write every audit entry as one JSON line to stdout (the controller logs to
    /// stderr), for the cluster's log collector: the file under `state_dir` is per replica and
    /// lives as long as its volume (an emptyDir in deploy/), stdout outlives both.
    pub audit_stdout: bool,
    /// User catalog directories (each like `taskservs/catalog`: `<service>/taskserv.yaml`,
    /// scripts, templates, optional `lib/`), merged after the built-in catalog in order:
    /// a later entry overrides an earlier one's service of the same name.
    pub catalogs: Vec<PathBuf>,
    /// Services of the built-in catalog (or of an earlier entry of `catalogs`) that a later
    /// catalog may replace, and `"lib"` to let it replace `lib/` files: an explicit opt-in,
    /// since catalog scripts run as root on every machine (empty: nothing is replaced).
    pub catalog_overrides: Vec<String>,
    /// Upper bound of every service's health-check interval, in seconds (0: the catalog's
    /// own intervals). `provisioning test` sets it so checks run again soon after Ready.
    pub max_health_interval_secs: u64,
    /// Whether the API server records who sets an approval and who changes a spec
    /// (`provisioning.dev/approved-by`, `-groups`, `changed-by`) and refuses clients that
    /// write them. Unset: detected (the embedded control plane does; on another API server a
    /// client can write them, so Manual approvals there are refused). Set `true` only with an
    /// admission webhook that stamps them and refuses other writers.
    pub api_server_records_writers: Option<bool>,
    /// Whether (and for whom) aws accounts may assume a role with the controller's own web
    /// identity token. Absent: never (see [`crate::accounts::AwsWebIdentity`]).
    pub aws_web_identity: Option<crate::accounts::AwsWebIdentity>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            metrics_addr: None,
            state_dir: PathBuf::from(".data/providers"),
            default_workspace: default_workspace(),
            leader_election: true,
            sharding: false,
            lease_namespace: "default".into(),
            lease_name: "provisioning-controller".into(),
            lease_duration_secs: 10,
            lease_renew_secs: 2,
            resync_secs: 600,
            poll_secs: 5,
            survey_secs: 60,
            concurrency: 128,
            allow_insecure_endpoints: false,
            history_limit: 20,
            audit_stdout: false,
            catalogs: Vec::new(),
            catalog_overrides: Vec::new(),
            max_health_interval_secs: 0,
            api_server_records_writers: None,
            aws_web_identity: None,
        }
    }
}

/// The built-in default workspace: one account `local` of type `local`.
pub fn default_workspace() -> WorkspaceSpec {
    WorkspaceSpec {
        providers: vec![ProviderAccount {
            name: "local".into(),
            provider_type: ProviderType::Local,
            region: String::new(),
            zone: String::new(),
            endpoint: String::new(),
            credentials_secret_ref: None,
            images: Default::default(),
            simulation: None,
            rate_limit: 0,
            ssh: None,
            security_group_ids: Vec::new(),
            subnet_id: String::new(),
            zone_subnets: Default::default(),
            ssh_source_cidrs: Vec::new(),
            firewall_rules: Vec::new(),
        }],
        ..WorkspaceSpec::default()
    }
}

/// A config file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema. One line: where, the offending line
    /// (which names the key) and why — the parser's own rendering spans several lines.
    #[error("invalid config {path}:{line}: `{text}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error (0 when the parser gave no position).
        line: usize,
        /// That line of the file, trimmed.
        text: String,
        /// The parser's message (names unknown keys and expected types).
        message: String,
    },
}

impl ControllerConfig {
    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        let mut config: ControllerConfig = toml::from_str(text)?;
        if config.default_workspace.providers.is_empty() {
            config.default_workspace.providers = default_workspace().providers;
        }
        Ok(config)
    }

    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut config = Self::from_toml(&text).map_err(|e| parse_error(path, &text, &e))?;
        let base = path.parent().unwrap_or(Path::new(""));
        for dir in &mut config.catalogs {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        Ok(config)
    }

    /// The catalog directories in merge order: the built-in one, then `catalogs`.
    pub fn catalog_layers(&self) -> Vec<PathBuf> {
        std::iter::once(provisioning_taskservs::Catalog::default_dir()).chain(self.catalogs.iter().cloned()).collect()
    }

    /// Loads and validates the merged catalog (built-in + `catalogs`): an error names the
    /// broken file or directory.
    pub fn load_catalog(&self) -> Result<provisioning_taskservs::Catalog, provisioning_taskservs::CatalogError> {
        provisioning_taskservs::Catalog::load_layers_allowing(&self.catalog_layers(), &self.catalog_overrides)
    }

    /// The health-check interval to use for a service whose catalog says `interval`.
    pub fn health_interval(&self, interval: Duration) -> Duration {
        match self.max_health_interval_secs {
            0 => interval,
            max => interval.min(Duration::from_secs(max)),
        }
    }

    /// Lease validity.
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration_secs.max(2))
    }
    /// Lease renewal interval.
    pub fn lease_renew(&self) -> Duration {
        Duration::from_secs(self.lease_renew_secs.max(1))
    }
    /// Resync interval of Ready objects.
    pub fn resync(&self) -> Duration {
        Duration::from_secs(self.resync_secs.max(1))
    }
    /// Poll interval while waiting for a provider.
    pub fn poll(&self) -> Duration {
        Duration::from_secs(self.poll_secs.max(1))
    }
    /// Interval of the batched drift survey.
    pub fn survey(&self) -> Duration {
        Duration::from_secs(self.survey_secs.max(1))
    }
}

/// A [`ConfigError::Parse`] with the line of `error` in `text`.
fn parse_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let (line, line_text) = match error.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let line = text.get(..start).map_or(0, |before| before.matches('\n').count()) + 1;
            (line, text.lines().nth(line - 1).unwrap_or_default().trim().to_string())
        }
        None => (0, String::new()),
    };
    ConfigError::Parse { path: path.into(), line, text: line_text, message: error.message().trim().replace('\n', " ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_file_is_one_line_naming_the_line_and_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "metrics_addr = \"0.0.0.0:8080\"\n\n[[default_providers]]\nname = \"local\"\n").expect("write");
        let message = ControllerConfig::load(&path).expect_err("rejected").to_string();
        assert!(!message.contains('\n'), "one line: {message}");
        assert!(message.contains("config.toml:3:"), "names the line: {message}");
        assert!(message.contains("default_providers"), "names the key: {message}");

        std::fs::write(&path, "state_dir = \"/x\"\nmetrics_addr = 8080\n").expect("write");
        let message = ControllerConfig::load(&path).expect_err("rejected").to_string();
        assert!(message.contains(":2: `metrics_addr = 8080`"), "names the line and key: {message}");
    }

    #[test]
    fn user_catalogs_are_relative_to_the_file_and_come_after_the_built_in_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "catalogs = [\"mine\", \"/abs/theirs\"]\n").expect("write");
        let c = ControllerConfig::load(&path).expect("parses");
        assert_eq!(c.catalogs, vec![dir.path().join("mine"), PathBuf::from("/abs/theirs")]);
        let layers = c.catalog_layers();
        assert_eq!(layers[0], provisioning_taskservs::Catalog::default_dir());
        assert_eq!(&layers[1..], c.catalogs.as_slice());
        let e = c.load_catalog().expect_err("missing dir").to_string();
        assert!(e.contains("mine") && e.contains("does not exist"), "{e}");
    }

    #[test]
    fn web_identity_is_off_unless_configured_with_grants() {
        assert_eq!(ControllerConfig::from_toml("").expect("parses").aws_web_identity, None);
        let c = ControllerConfig::from_toml(
            r#"
            [aws_web_identity]
            token_file = "/var/run/token"
            grants = [{ namespace = "team-a", role_arns = ["arn:aws:iam::123456789012:role/a"] }]
            "#,
        )
        .expect("parses");
        let web = c.aws_web_identity.expect("set");
        assert_eq!(web.token_file, PathBuf::from("/var/run/token"));
        assert_eq!(web.grants[0].namespace, "team-a");
        assert!(
            ControllerConfig::from_toml("[aws_web_identity]\ntoken_file = \"/t\"\nallow_all = true\n").is_err(),
            "unknown keys refused"
        );
    }

    #[test]
    fn defaults_have_one_local_account() {
        let c = ControllerConfig::from_toml("").expect("empty config parses");
        assert_eq!(c.default_workspace.providers.len(), 1);
        assert_eq!(c.default_workspace.providers[0].name, "local");
        assert_eq!(c.default_workspace.defaults.provider, "local");
    }

    #[test]
    fn file_overrides_defaults() {
        let c = ControllerConfig::from_toml(
            r#"
            state_dir = "/tmp/x"
            metrics_addr = "127.0.0.1:9090"
            [default_workspace]
            providers = [{ name = "sim", type = "simulated", simulation = { latencyMs = 5 } }]
            defaults = { provider = "sim" }
            limits = { maxServers = 7, parallelLimit = 2 }
            "#,
        )
        .expect("parses");
        assert_eq!(c.default_workspace.providers[0].provider_type, ProviderType::Simulated);
        assert_eq!(c.default_workspace.limits.max_servers, 7);
        assert_eq!(c.default_workspace.defaults.plan, "small");
        assert!(ControllerConfig::from_toml("nonsense = 1").is_err());
    }
}
