//! What a script is told: the context it reads as JSON on stdin, with its service's templates
//! rendered into it (the rendering itself is in [`crate::templates`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::catalog::Catalog;
use crate::error::TemplateError;

/// An address of a server, as in `Server.status.addresses`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressInfo {
    /// InternalIP, ExternalIP, InternalDNS, ExternalDNS or Hostname.
    #[serde(rename = "type")]
    pub kind: String,
    /// The address.
    pub address: String,
}

/// The server the script runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerInfo {
    /// The Server's name.
    pub name: String,
    /// The Server's namespace.
    pub namespace: String,
    /// Its addresses, the preferred (internal) one first.
    #[serde(default)]
    pub addresses: Vec<AddressInfo>,
    /// Host name inside the machine.
    #[serde(default)]
    pub hostname: String,
    /// The Cluster pool it belongs to ("" for a standalone Server).
    #[serde(default)]
    pub pool: String,
}

/// Another server: of the same TaskServ (in `peers`) or of the same Cluster (in `cluster.servers`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerInfo {
    /// The Server's name.
    pub name: String,
    /// Its addresses, the preferred (internal) one first.
    #[serde(default)]
    pub addresses: Vec<AddressInfo>,
    /// The Cluster pool it belongs to ("" for a standalone Server).
    #[serde(default)]
    pub pool: String,
}

/// The Cluster the TaskServ belongs to (empty name for a standalone TaskServ).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// The Cluster's name, or "".
    pub name: String,
    /// Every server of the Cluster, this one included (e.g. haproxy's backends by pool).
    #[serde(default)]
    pub servers: Vec<PeerInfo>,
}

/// The Workspace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceInfo {
    /// The Workspace's name.
    pub name: String,
    /// dev | test | prod.
    pub environment: String,
    /// The Workspace's free `config` values.
    #[serde(default)]
    pub config: Value,
}

/// The TaskServ being run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskServInfo {
    /// The TaskServ resource's name.
    pub name: String,
    /// The catalog service.
    pub service: String,
    /// The version to converge to.
    pub version: String,
    /// The version installed before (upgrades, rollbacks), if any.
    #[serde(default)]
    pub previous_version: Option<String>,
}

/// Everything a script gets, as one JSON document on stdin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptContext {
    /// The server the script runs on.
    pub server: ServerInfo,
    /// The other servers of the same TaskServ (this one excluded), sorted by name.
    #[serde(default)]
    pub peers: Vec<PeerInfo>,
    /// The owning Cluster.
    #[serde(default)]
    pub cluster: ClusterInfo,
    /// The Workspace.
    pub workspace: WorkspaceInfo,
    /// The TaskServ.
    pub taskserv: TaskServInfo,
    /// The service config, validated, with schema defaults (see `Catalog::validate_request`).
    #[serde(default)]
    pub config: Value,
    /// Rendered `templates/*` of the service, by file name.
    #[serde(default)]
    pub templates: BTreeMap<String, String>,
}

impl ScriptContext {
    /// The values templates see: `workspace`, `cluster`, `server`, `peers`, `taskserv`, `config`.
    pub fn template_values(&self) -> Value {
        serde_json::json!({
            "workspace": self.workspace,
            "cluster": self.cluster,
            "server": self.server,
            "peers": self.peers,
            "taskserv": self.taskserv,
            "config": self.config,
        })
    }

    /// Renders the templates of `self.taskserv.service` into `self.templates`.
    pub fn with_templates(mut self, catalog: &Catalog) -> Result<Self, TemplateError> {
        self.templates = catalog.render_templates(&self.taskserv.service, &self.template_values())?;
        Ok(self)
    }
}
