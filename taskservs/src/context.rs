//! What a script is told: the context it reads as JSON on stdin, and template rendering.

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
        self.templates = catalog.render_templates(&self.taskserv.service, &self)?;
        Ok(self)
    }
}

/// The template environment: strict about undefined variables (a typo is an error, not an
/// empty string) and keeping trailing newlines of config files.
pub(crate) fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    // Config files, not HTML: no escaping by file extension (.yml would JSON-quote strings).
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.add_filter("ip", filter_ip);
    env.add_filter("ip_host", filter_ip_host);
    env.add_filter("conf_quote", filter_conf_quote);
    env
}

/// `{{ address | ip }}`: the address as a canonical IP, or a render error. Provider-reported
/// addresses end up in config files (haproxy.cfg, etcd.conf.yml, redis.conf): anything but an
/// IP (a name, text with spaces or newlines) is refused rather than written.
fn filter_ip(value: String) -> Result<String, minijinja::Error> {
    parse_ip(&value).map(|ip| ip.to_string())
}

/// `{{ address | ip_host }}`: like `ip`, IPv6 in brackets (for `host:port` and URLs).
fn filter_ip_host(value: String) -> Result<String, minijinja::Error> {
    parse_ip(&value).map(|ip| if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() })
}

fn parse_ip(value: &str) -> Result<std::net::IpAddr, minijinja::Error> {
    value.parse().map_err(|_| {
        // The value is provider data, not a secret, but may be long or multi-line: quote a bit.
        let shown: String = value.chars().take(64).collect();
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("{shown:?} is not an IP address"))
    })
}

/// `{{ value | conf_quote }}`: a double-quoted string in the syntax of redis.conf (and other
/// configs parsed like it: sdssplitargs): backslash and quote escaped, control characters as
/// `\xHH`, so any value (a password with quotes, backslashes, newlines) stays one argument.
fn filter_conf_quote(value: String) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Catalog {
    /// Renders every `templates/*` file of `service` with the context's values.
    pub fn render_templates(
        &self,
        service: &str,
        ctx: &ScriptContext,
    ) -> Result<BTreeMap<String, String>, TemplateError> {
        let entry = self
            .get(service)
            .ok_or_else(|| TemplateError::UnknownService(service.to_string()))?;
        let values = ctx.template_values();
        let mut rendered = BTreeMap::new();
        for (name, source) in &entry.templates {
            let render_error = |e: minijinja::Error| TemplateError::Render {
                service: service.to_string(),
                template: name.clone(),
                // Display only: the alternate form dumps every referenced value (passwords too).
                message: e.to_string(),
            };
            let env = template_env();
            let text = env
                .template_from_named_str(name, source)
                .and_then(|t| t.render(&values))
                .map_err(render_error)?;
            rendered.insert(name.clone(), text);
        }
        Ok(rendered)
    }
}
