//! The upcloud provider: UpCloud through its REST API v1.3 (JSON, HTTP basic auth with an
//! API user).
//!
//! Servers are created from a public template with labels carrying the Server's identity
//! and found by label (`GET /1.3/server?label=key=value`) before one is created. A new server
//! is in `maintenance` until it has `started`. Deleting is two steps, as UpCloud requires:
//! stop (hard: the machine is going away), then `DELETE /1.3/server/{uuid}?storages=1` once it
//! is `stopped`, so that its disks go with it.
//!
//! UpCloud label keys allow only letters, digits, `-` and `_`, so the identity tags are
//! written as `provisioning_server-uid` etc. and mapped back when observed.
//!
//! An account with firewall rules creates servers with `firewall: on` and gives each, right
//! after create (and again when an interrupted create is found by label), the rule set:
//! SSH accepted from the account's `ssh_source_cidrs`, the account's rules in order, then
//! a final rule dropping all other inbound traffic.

pub mod floating_ip;
pub mod model;

/// Title prefix of a storage kept when its server is deleted (deletionPolicy Retain); `:`
/// cannot appear in a disk name, so no other title starts with it.
pub const RETAIN_PREFIX: &str = "retain:";

/// The title of an extra disk's storage: `[retain:]<disk>-<hostname>`, at most 64 characters
/// (UpCloud's limit; the prefix and the disk name come first, so they always survive).
pub fn disk_title(disk: &crate::DiskRequest, hostname: &str) -> String {
    let prefix = if disk.retain { RETAIN_PREFIX } else { "" };
    format!("{prefix}{}-{hostname}", disk.name).chars().take(64).collect()
}

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use self::model::*;
use crate::ratelimit::{
    AccountKey, AccountLimits, BucketSpec, Buckets, CallGuard, RateLimiter, RetryPolicy, classify_status, redact, transport_error,
};
use crate::ssh::SshExecutor;
use crate::{
    Address, DeleteOutcome, ExecRequest, ExecResult, MachineState, Provider, ProviderConfig, ProviderError, ProviderId, ProviderResult,
    ServerIdentity, ServerObservation, ServerRequest, SharedProvider, plans,
};

/// Abstract plans → UpCloud General Purpose plans.
pub const PLANS: [(&str, &str); 4] = [("small", "1xCPU-2GB"), ("medium", "2xCPU-4GB"), ("large", "4xCPU-8GB"), ("xlarge", "6xCPU-16GB")];

/// Storage included in each plan (GiB); the boot disk gets this size.
pub const PLAN_STORAGE_GB: [(&str, u32); 6] =
    [("1xCPU-1GB", 25), ("1xCPU-2GB", 50), ("2xCPU-4GB", 80), ("4xCPU-8GB", 160), ("6xCPU-16GB", 320), ("8xCPU-32GB", 640)];

/// Public zones.
pub const ZONES: [&str; 15] = [
    "fi-hel1", "fi-hel2", "de-fra1", "nl-ams1", "uk-lon1", "es-mad1", "pl-waw1", "se-sto1", "dk-cph1", "no-svg1", "us-chi1", "us-nyc1",
    "us-sjo1", "sg-sin1", "au-syd1",
];

/// Abstract images → public template UUIDs (overridable with `ProviderConfig::images`).
pub const TEMPLATES: [(&str, &str); 3] = [
    ("debian-12", "01000000-0000-4000-8000-000020070100"),
    ("ubuntu-22.04", "01000000-0000-4000-8000-000030220200"),
    ("ubuntu-24.04", "01000000-0000-4000-8000-000030240200"),
];

const DEFAULT_ENDPOINT: &str = "https://api.upcloud.com";
const DEFAULT_ZONE: &str = "fi-hel1";
/// UpCloud's API documentation (<https://developers.upcloud.com/1.3/>) states no numeric
/// request-rate limit: it answers `429 Too Many Requests` when a client goes too fast, and
/// resource limits (cores, memory, IPs) per account are read from `GET /1.3/account`. So the
/// default stays conservative — one bucket of 10 calls per second with a burst of 10 for
/// every call of an API user — and the server's 429 with Retry-After pauses the account.
/// A Workspace's `rateLimit` replaces the rate.
pub const DEFAULT_RATE: u32 = 10;

/// Calls of one API user in flight at once (UpCloud documents none; server creation holds
/// a call for seconds, so a handful in parallel is plenty).
pub const MAX_IN_FLIGHT: usize = 8;

/// The limits of an account: [`DEFAULT_RATE`] or the Workspace's `rateLimit`, and
/// [`MAX_IN_FLIGHT`].
pub fn default_limits(rate_limit: u32) -> AccountLimits {
    let rate = if rate_limit == 0 { DEFAULT_RATE } else { rate_limit };
    AccountLimits { buckets: Buckets::Account(BucketSpec::per_second(rate)), max_in_flight: MAX_IN_FLIGHT }
}

/// UpCloud authenticates (and meters) an API user, account-wide across zones; the account
/// is known here by that user name at the endpoint actually called.
pub fn account_key(endpoint: &str, username: &str) -> AccountKey {
    AccountKey::new("upcloud", endpoint, "", username)
}
const LABEL_PREFIX: &str = "provisioning.dev/";
const UPCLOUD_LABEL_PREFIX: &str = "provisioning_";

/// Builds the provider for an account.
pub fn build(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    Ok(Arc::new(UpcloudProvider::new(config)?))
}

/// Our tag key as an UpCloud label key.
pub fn label_key(tag: &str) -> String {
    let key = match tag.strip_prefix(LABEL_PREFIX) {
        Some(rest) => format!("{UPCLOUD_LABEL_PREFIX}{rest}"),
        None => tag.to_string(),
    };
    key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).take(32).collect()
}

/// An UpCloud label key as our tag key.
pub fn tag_key(label: &str) -> String {
    match label.strip_prefix(UPCLOUD_LABEL_PREFIX) {
        Some(rest) => format!("{LABEL_PREFIX}{rest}"),
        None => label.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Critical sections are single map operations: a poisoned lock still holds valid data.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The upcloud provider of one account.
pub struct UpcloudProvider {
    account: String,
    endpoint: String,
    zone: String,
    username: String,
    password: String,
    http: reqwest::Client,
    /// Whose budget its answers are charged to.
    source: crate::ratelimit::AnswerSource,
    guard: CallGuard,
    images: BTreeMap<String, String>,
    ssh: SshExecutor,
    /// The firewall rule set of every new server (empty: firewall off), already validated.
    firewall: Vec<UpcloudFirewallRule>,
    ensuring: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl fmt::Debug for UpcloudProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpcloudProvider")
            .field("account", &self.account)
            .field("endpoint", &self.endpoint)
            .field("zone", &self.zone)
            .field("credentials", &"[redacted]")
            .finish_non_exhaustive()
    }
}

enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

/// `a.b.c.d/n`, `a::b/n` or a single address as UpCloud's inclusive (start, end) range.
pub fn address_range(cidr: &str) -> Result<(String, String, &'static str), String> {
    use std::net::IpAddr;
    let (addr, prefix) = match cidr.trim().split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (cidr.trim(), None),
    };
    let ip: IpAddr = addr.parse().map_err(|_| format!("{cidr:?} is not an IP address or CIDR"))?;
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    let prefix: u32 = match prefix {
        None => bits,
        Some(p) => p.parse().ok().filter(|p| *p <= bits).ok_or_else(|| format!("{cidr:?} has an invalid prefix length"))?,
    };
    Ok(match ip {
        IpAddr::V4(v4) => {
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
            let start = u32::from(v4) & mask;
            (std::net::Ipv4Addr::from(start).to_string(), std::net::Ipv4Addr::from(start | !mask).to_string(), "IPv4")
        }
        IpAddr::V6(v6) => {
            let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
            let start = u128::from(v6) & mask;
            (std::net::Ipv6Addr::from(start).to_string(), std::net::Ipv6Addr::from(start | !mask).to_string(), "IPv6")
        }
    })
}

/// The rule set of an account's servers (see the module docs); `Ok(vec![])` when the account
/// declares no rules (firewall stays off). A malformed rule is an `InvalidRequest` naming it.
// Over 80 lines on purpose: one validation per rule field, in the API document's field order.
pub fn firewall_rules(network: &crate::NetworkSettings) -> ProviderResult<Vec<UpcloudFirewallRule>> {
    if network.firewall_rules.is_empty() {
        return Ok(Vec::new());
    }
    let invalid = |i: usize, why: String| ProviderError::InvalidRequest(format!("firewallRules[{i}]: {why}"));
    // With a firewall the controller's SSH must be let in from somewhere; an empty list is not
    // "from anywhere" (0.0.0.0/0 is accepted only when written).
    if network.ssh_source_cidrs.is_empty() {
        return Err(ProviderError::InvalidRequest(
            "sshSourceCidrs is empty: with firewallRules the firewall lets SSH in only from these ranges; list the controller's egress CIDRs (0.0.0.0/0 only if you mean it)".into(),
        ));
    }
    let mut rules = Vec::new();
    for cidr in &network.ssh_source_cidrs {
        let (start, end, family) = address_range(cidr).map_err(|e| ProviderError::InvalidRequest(format!("sshSourceCidrs: {e}")))?;
        rules.push(UpcloudFirewallRule {
            direction: "in".into(),
            action: "accept".into(),
            family: Some(family.into()),
            protocol: Some("tcp".into()),
            source_address_start: Some(start),
            source_address_end: Some(end),
            destination_port_start: Some("22".into()),
            destination_port_end: Some("22".into()),
            comment: Some("provisioning: SSH from the controller".into()),
            ..Default::default()
        });
    }
    for (i, rule) in network.firewall_rules.iter().enumerate() {
        if !matches!(rule.direction.as_str(), "in" | "out") {
            return Err(invalid(i, format!("direction {:?} must be in or out", rule.direction)));
        }
        if !matches!(rule.action.as_str(), "accept" | "reject" | "drop") {
            return Err(invalid(i, format!("action {:?} must be accept, reject or drop", rule.action)));
        }
        if !matches!(rule.protocol.as_str(), "" | "tcp" | "udp" | "icmp") {
            return Err(invalid(i, format!("protocol {:?} must be tcp, udp or icmp", rule.protocol)));
        }
        let mut out = UpcloudFirewallRule {
            direction: rule.direction.clone(),
            action: rule.action.clone(),
            protocol: Some(rule.protocol.clone()).filter(|p| !p.is_empty()),
            comment: Some(rule.comment.clone()).filter(|c| !c.is_empty()),
            ..Default::default()
        };
        let mut family = match rule.family.as_str() {
            "" => None,
            f @ ("IPv4" | "IPv6") => Some(f.to_string()),
            other => return Err(invalid(i, format!("family {other:?} must be IPv4 or IPv6"))),
        };
        if !rule.source.is_empty() {
            let (start, end, f) = address_range(&rule.source).map_err(|e| invalid(i, e))?;
            out.source_address_start = Some(start);
            out.source_address_end = Some(end);
            family = Some(f.to_string());
        }
        if !rule.destination_port.is_empty() {
            let (start, end) = rule.destination_port.split_once('-').unwrap_or((&rule.destination_port, &rule.destination_port));
            let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p > 0).map(|p| p.to_string());
            let (Some(start), Some(end)) = (port(start), port(end)) else {
                return Err(invalid(i, format!("destinationPort {:?} must be a port or start-end", rule.destination_port)));
            };
            out.destination_port_start = Some(start);
            out.destination_port_end = Some(end);
        }
        // UpCloud wants a family whenever a protocol or an address is given.
        if family.is_none() && (out.protocol.is_some() || out.source_address_start.is_some()) {
            family = Some("IPv4".into());
        }
        out.family = family;
        rules.push(out);
    }
    rules.push(UpcloudFirewallRule {
        direction: "in".into(),
        action: "drop".into(),
        comment: Some("provisioning: drop everything else".into()),
        ..Default::default()
    });
    for (i, rule) in rules.iter_mut().enumerate() {
        rule.position = Some((i + 1).to_string());
    }
    Ok(rules)
}

impl UpcloudProvider {
    /// Builds the provider; fails on missing credentials or a malformed endpoint.
    pub fn new(config: &ProviderConfig) -> ProviderResult<Self> {
        let missing = |key: &str| ProviderError::Auth(format!("the credentials of upcloud account {:?} hold no {key}", config.name));
        let username = config.credentials.get("UPCLOUD_USERNAME").filter(|v| !v.is_empty()).ok_or_else(|| missing("UPCLOUD_USERNAME"))?;
        let password = config.credentials.get("UPCLOUD_PASSWORD").filter(|v| !v.is_empty()).ok_or_else(|| missing("UPCLOUD_PASSWORD"))?;
        let endpoint = if config.endpoint.is_empty() { DEFAULT_ENDPOINT.to_string() } else { config.endpoint.clone() };
        let url = reqwest::Url::parse(&endpoint)
            .map_err(|e| ProviderError::InvalidRequest(format!("upcloud endpoint {endpoint:?} is not a URL: {e}")))?;
        if url.host_str().is_none() || !matches!(url.scheme(), "http" | "https") {
            return Err(ProviderError::InvalidRequest(format!("upcloud endpoint {endpoint:?} needs http(s) and a host")));
        }
        let http = reqwest::Client::builder()
            // A redirect would take a request (and what it carries) to a host no one checked.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ProviderError::Permanent(format!("cannot build the HTTP client: {e}")))?;
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let key = account_key(&endpoint, username);
        Ok(UpcloudProvider {
            account: config.name.clone(),
            endpoint,
            zone: if config.zone.is_empty() { DEFAULT_ZONE.to_string() } else { config.zone.clone() },
            username: username.to_string(),
            password: password.to_string(),
            http,
            source: crate::ratelimit::AnswerSource::of(config),
            guard: CallGuard::new(key, default_limits(config.rate_limit), RetryPolicy::default()),
            images: config.images.clone(),
            ssh: SshExecutor::new(config, "root"),
            firewall: firewall_rules(&config.network)?,
            ensuring: Mutex::new(HashMap::new()),
        })
    }

    /// The account's limiter (shared by every provider of the same API user).
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.guard.limiter
    }

    fn clean(&self, text: &str) -> String {
        redact(text, &[&self.password])
    }

    /// One HTTP call: `Ok((status, body))` for 2xx, the classified error otherwise.
    /// `cap`: most bytes of the answer read ([`crate::ratelimit::LOOKUP_CAP`] for one
    /// machine's data, [`crate::ratelimit::MAX_ANSWER`] for the account's list).
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<String>,
        cap: usize,
    ) -> ProviderResult<(u16, String)> {
        let url = reqwest::Url::parse_with_params(&format!("{}/1.3{path}", self.endpoint), query)
            .map_err(|e| ProviderError::InvalidRequest(format!("UpCloud {path}: {e}")))?;
        let mut request = match method {
            Method::Get => self.http.get(url),
            Method::Post => self.http.post(url),
            Method::Put => self.http.put(url),
            Method::Patch => self.http.patch(url),
            Method::Delete => self.http.delete(url),
        };
        request = request.basic_auth(&self.username, Some(&self.password)).header("accept", "application/json");
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let what = format!("UpCloud {path}");
        let response = request.send().await.map_err(|e| ProviderError::Transient(self.clean(&transport_error(&what, &e).to_string())))?;
        let status = response.status().as_u16();
        let retry_after = response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
        let text = crate::ratelimit::text_capped(response, cap, &what, &self.source).await.map_err(|e| match e {
            ProviderError::Permanent(m) => ProviderError::Permanent(self.clean(&m)),
            other => ProviderError::Transient(self.clean(&other.to_string())),
        })?;
        if (200..300).contains(&status) {
            return Ok((status, text));
        }
        Err(classify_error(&what, status, retry_after.as_deref(), &self.clean(crate::ratelimit::error_text(&text))))
    }

    async fn call_retrying(
        &self,
        method: fn() -> Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&str>,
        cap: usize,
    ) -> ProviderResult<(u16, String)> {
        self.guard.retry(path, || self.call(method(), path, query, body.map(str::to_string), cap)).await
    }

    fn parse<T: serde::de::DeserializeOwned>(what: &str, body: &str) -> ProviderResult<T> {
        serde_json::from_str(body).map_err(|e| ProviderError::Transient(format!("UpCloud {what}: unreadable response: {e}")))
    }

    async fn details(&self, uuid: &str) -> ProviderResult<Option<ServerDetails>> {
        match self.call_retrying(|| Method::Get, &format!("/server/{uuid}"), &[], None, crate::ratelimit::LOOKUP_CAP).await {
            Ok((_, body)) => {
                let details = Self::parse::<ServerDetailsResponse>("server details", &body)?.server;
                // Its uuid goes into status and later paths: it must be the one asked for.
                if details.uuid != uuid {
                    return Err(ProviderError::Transient(format!("UpCloud server details: asked for {uuid}, answered another server")));
                }
                Ok(Some(details))
            }
            Err(ProviderError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, tags: &[(String, String)], cap: usize) -> ProviderResult<Vec<ServerSummary>> {
        let query: Vec<(String, String)> = tags.iter().map(|(k, v)| ("label".to_string(), format!("{}={v}", label_key(k)))).collect();
        let (_, body) = self.call_retrying(|| Method::Get, "/server", &query, None, cap).await?;
        let listed: ServerListResponse = Self::parse("server list", &body)?;
        // Filter again locally: the label filter is the API's, the guarantee is ours (and a
        // server's uuid, used in later paths and in status, has a UUID's shape).
        Ok(listed
            .servers
            .server
            .into_iter()
            .filter(|s| s.uuid.len() == 36 && crate::ratelimit::well_formed(&s.uuid, 36, |c| c.is_ascii_hexdigit() || c == '-'))
            .filter(|s| tags.iter().all(|(k, v)| s.labels.label.iter().any(|l| l.key == label_key(k) && &l.value == v)))
            .collect())
    }

    async fn find(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        let tags = [(crate::tags::SERVER_UID.to_string(), identity.uid.clone())];
        let mut found = self.list(&tags, crate::ratelimit::LOOKUP_CAP).await?;
        found.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        let Some(summary) = found.into_iter().next() else { return Ok(None) };
        // The list carries no addresses; the details do.
        Ok(self.details(&summary.uuid).await?.map(|d| observe(&d)))
    }

    fn template(&self, image: &str) -> ProviderResult<String> {
        if let Some(native) = self.images.get(&format!("{}/{image}", self.zone)).or_else(|| self.images.get(image)) {
            return Ok(native.clone());
        }
        if let Some((_, uuid)) = TEMPLATES.iter().find(|(name, _)| *name == image) {
            return Ok((*uuid).to_string());
        }
        if uuid::Uuid::parse_str(image).is_ok() {
            return Ok(image.to_string());
        }
        let names: Vec<&str> = TEMPLATES.iter().map(|(n, _)| *n).collect();
        Err(ProviderError::InvalidRequest(format!(
            "image {image:?} is neither a template UUID nor one of the upcloud images ({}); set it in the Workspace's images",
            names.join(", ")
        )))
    }

    /// The create request of `request`'s machine (its boot disk cloned from `template`, then
    /// one empty storage per extra disk).
    fn create_body(&self, request: &ServerRequest, plan: &str, template: &str) -> CreateServerRequest {
        let identity = &request.identity;
        let mut tags: BTreeMap<String, String> = request.extra_tags.clone();
        tags.extend(identity.tags());
        let labels = LabelList { label: tags.iter().map(|(k, v)| Label { key: label_key(k), value: v.clone() }).collect() };
        let zone = if request.zone.is_empty() { self.zone.clone() } else { request.zone.clone() };
        let size = PLAN_STORAGE_GB.iter().find(|(p, _)| *p == plan).map_or(25, |(_, s)| *s);
        let hostname = hostname(&identity.name, &identity.namespace);
        let interface = |kind: &str| CreateInterface {
            ip_addresses: CreateIpAddresses { ip_address: vec![CreateIpAddress { family: "IPv4".into() }] },
            kind: kind.into(),
        };
        CreateServerRequest {
            server: CreateServer {
                zone,
                title: format!("{}/{}", identity.namespace, identity.name),
                hostname: hostname.clone(),
                plan: plan.to_string(),
                metadata: "yes".into(),
                labels,
                storage_devices: CreateStorageDevices {
                    storage_device: std::iter::once(CreateStorageDevice {
                        action: "clone".into(),
                        storage: template.to_string(),
                        title: format!("{hostname}-disk0"),
                        size,
                        tier: "maxiops".into(),
                    })
                    .chain(request.disks.iter().map(|d| CreateStorageDevice {
                        action: "create".into(),
                        storage: String::new(),
                        title: disk_title(d, &hostname),
                        // Checked by the controller: 10..=4096 GiB on upcloud.
                        size: u32::try_from(d.size_gib).unwrap_or(u32::MAX),
                        tier: if d.disk_type.is_empty() { "maxiops".into() } else { d.disk_type.clone() },
                    }))
                    .collect(),
                },
                networking: CreateNetworking {
                    // `publicIp: false`: no public interface (reached through the utility
                    // network or an SSH address override).
                    interfaces: CreateInterfaces {
                        interface: if request.public_ip == Some(false) {
                            vec![interface("utility")]
                        } else {
                            vec![interface("public"), interface("utility")]
                        },
                    },
                },
                login_user: request.ssh_public_key.as_ref().map(|key| LoginUser {
                    username: "root".into(),
                    ssh_keys: SshKeys { ssh_key: vec![key.trim().to_string()] },
                    create_password: Some("no".into()),
                }),
                firewall: (!self.firewall.is_empty()).then(|| "on".to_string()),
                // The login user is set above; the user data carries only the host key.
                user_data: request.host_key.as_ref().and_then(|k| crate::ssh::cloud_config(None, Some(k))),
            },
        }
    }

    /// Gives server `uuid` the account's firewall rules unless it has exactly them already
    /// (an interrupted earlier attempt may have left part of them: those go first).
    async fn ensure_firewall(&self, uuid: &str) -> ProviderResult<()> {
        if self.firewall.is_empty() {
            return Ok(());
        }
        let path = format!("/server/{uuid}/firewall_rule");
        let (_, body) = self.call_retrying(|| Method::Get, &path, &[], None, crate::ratelimit::LOOKUP_CAP).await?;
        let existing: FirewallRuleListResponse = Self::parse("firewall rules", &body)?;
        let normalized = |rules: &[UpcloudFirewallRule]| -> Vec<UpcloudFirewallRule> {
            // UpCloud reports unset fields as empty strings.
            let clean = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
            rules
                .iter()
                .map(|r| UpcloudFirewallRule {
                    position: clean(&r.position),
                    direction: r.direction.clone(),
                    action: r.action.clone(),
                    family: clean(&r.family),
                    protocol: clean(&r.protocol),
                    source_address_start: clean(&r.source_address_start),
                    source_address_end: clean(&r.source_address_end),
                    destination_port_start: clean(&r.destination_port_start),
                    destination_port_end: clean(&r.destination_port_end),
                    comment: clean(&r.comment),
                })
                .collect()
        };
        if normalized(&existing.firewall_rules.firewall_rule) == normalized(&self.firewall) {
            return Ok(());
        }
        // Only the count is kept across the delete calls (UpCloud allows 1,000 rules).
        let count = existing.firewall_rules.firewall_rule.len();
        drop(existing);
        if count > MAX_FIREWALL_RULES {
            return Err(ProviderError::Permanent(format!("UpCloud {path}: {count} firewall rules; UpCloud allows {MAX_FIREWALL_RULES}")));
        }
        for position in (1..=count).rev() {
            self.call_retrying(|| Method::Delete, &format!("{path}/{position}"), &[], None, crate::ratelimit::LOOKUP_CAP).await?;
        }
        for rule in &self.firewall {
            let body = serde_json::to_string(&FirewallRuleRequest { firewall_rule: rule.clone() })
                .map_err(|e| ProviderError::Permanent(format!("cannot serialise a firewall rule: {e}")))?;
            self.call_retrying(|| Method::Post, &path, &[], Some(&body), crate::ratelimit::LOOKUP_CAP).await?;
        }
        Ok(())
    }

    async fn ensure(&self, request: &ServerRequest, plan: &str) -> ProviderResult<ServerObservation> {
        if let Some(existing) = self.find(&request.identity).await? {
            // Found by label: possibly created by an attempt that never set its rules.
            self.ensure_firewall(existing.provider_id.native_id()).await?;
            return Ok(existing);
        }
        let template = self.template(&request.image)?;
        let body = serde_json::to_string(&self.create_body(request, plan, &template))
            .map_err(|e| ProviderError::Permanent(format!("cannot serialise the create request: {e}")))?;
        // One attempt: after a lost response the next attempt finds the server by label.
        let (_, response) = self
            .guard
            .once("/server", || self.call(Method::Post, "/server", &[], Some(body.clone()), crate::ratelimit::LOOKUP_CAP))
            .await?;
        let created: ServerDetailsResponse = Self::parse("create server", &response)?;
        drop(response);
        if !(created.server.uuid.len() == 36
            && crate::ratelimit::well_formed(&created.server.uuid, 36, |c| c.is_ascii_hexdigit() || c == '-'))
        {
            return Err(ProviderError::Transient("UpCloud create server: the answer holds no well-formed server uuid".into()));
        }
        tracing::info!(account = %self.account, uid = %request.identity.uid, server = %created.server.uuid, "created UpCloud server");
        // What is kept across the firewall calls is the observation, not the answer.
        let observed = observe(&created.server);
        drop(created);
        self.ensure_firewall(observed.provider_id.native_id()).await?;
        Ok(observed)
    }
}

/// Most firewall rules of one UpCloud server (UpCloud's own limit).
const MAX_FIREWALL_RULES: usize = 1000;

/// A hostname UpCloud accepts: lower-case letters, digits and dashes, dot-separated.
fn hostname(name: &str, namespace: &str) -> String {
    let clean = |s: &str| -> String {
        let s: String = s.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let s = s.trim_matches('-').chars().take(63).collect::<String>();
        if s.is_empty() { "server".into() } else { s }
    };
    format!("{}.{}", clean(name), clean(namespace))
}

/// Classifies an UpCloud error response.
pub fn classify_error(what: &str, status: u16, retry_after: Option<&str>, body: &str) -> ProviderError {
    // The classic `{"error": {…}}` or the problem-details form of UpCloud's newer APIs.
    let detail = serde_json::from_str::<ErrorResponse>(body)
        .ok()
        .map(|e| e.error)
        .or_else(|| serde_json::from_str::<ProblemResponse>(body).ok().map(ProblemResponse::into_detail));
    let text = match &detail {
        Some(d) => format!("{what}: {} ({})", d.error_message, d.error_code),
        None => format!("{what}: HTTP {status}"),
    };
    if let Some(kind) = detail.as_ref().and_then(|d| capacity_kind(&d.error_code)) {
        let (code, message) = detail.map(|d| (d.error_code, d.error_message)).unwrap_or_default();
        return ProviderError::capacity(kind, code, format!("{what}: {message}"));
    }
    if let Some(error) = classify_status(status, retry_after, || text.clone()) {
        return error;
    }
    match status {
        401 | 403 => ProviderError::Auth(text),
        404 => ProviderError::NotFound(text),
        // 402: insufficient credits — nothing a retry fixes.
        402 => ProviderError::Permanent(text),
        // 409: the server is busy (e.g. SERVER_STATE_ILLEGAL); it settles by itself.
        409 => ProviderError::Transient(text),
        400..=499 => ProviderError::InvalidRequest(text),
        _ => ProviderError::Permanent(text),
    }
}

/// Whether an UpCloud error code means "not here, not now" (the zone lacks resources) or
/// "not now" (an account limit), per the error codes of UpCloud API 1.3 (as UpCloud's Go
/// client lists them): `*_RESOURCES_UNAVAILABLE` is the zone's capacity; account limits end
/// in `_LIMIT_REACHED` / `_LIMIT_EXCEEDED`, except the per-object ones (rules of one
/// firewall, devices of one server, routes of one router), which a retry never fixes.
pub fn capacity_kind(code: &str) -> Option<crate::CapacityKind> {
    const PER_OBJECT: [&str; 3] = ["FIREWALL_RULE_LIMIT_REACHED", "STORAGE_DEVICE_LIMIT_REACHED", "STATIC_ROUTE_LIMIT_REACHED"];
    if code.ends_with("_RESOURCES_UNAVAILABLE") || code == "INSUFFICIENT_CAPACITY" {
        return Some(crate::CapacityKind::Insufficient);
    }
    if (code.ends_with("_LIMIT_REACHED") || code.ends_with("_LIMIT_EXCEEDED")) && !PER_OBJECT.contains(&code) {
        return Some(crate::CapacityKind::Quota);
    }
    None
}

/// Maps UpCloud's server states.
pub fn machine_state(state: &str) -> MachineState {
    match state {
        "started" => MachineState::Running,
        "stopped" => MachineState::Stopped,
        "maintenance" => MachineState::Pending,
        other => MachineState::Other(other.to_string()),
    }
}

/// What an answer says of a server, as far as it is well formed (addresses that parse, a plan
/// name of at most 64 bytes, the first 64 labels of at most 256 bytes each).
fn observe(details: &ServerDetails) -> ServerObservation {
    let mut addresses: Vec<Address> = Vec::new();
    // A floating IP (a Cluster's endpoint) is not the machine's own address: it moves.
    let floating: Vec<&str> = details
        .networking
        .interfaces
        .interface
        .iter()
        .flat_map(|i| i.ip_addresses.ip_address.iter())
        .filter(|a| a.floating == "yes")
        .map(|a| a.address.as_str())
        .collect();
    // IPv4 first: SSH and status prefer it.
    for family in ["IPv4", "IPv6"] {
        for ip in details.ip_addresses.ip_address.iter().filter(|ip| {
            ip.family == family
                && ip.address.len() <= 64
                && ip.address.parse::<std::net::IpAddr>().is_ok()
                && !floating.contains(&ip.address.as_str())
        }) {
            let kind = if ip.access == "public" { "ExternalIP" } else { "InternalIP" };
            addresses.push(Address { kind: kind.into(), address: ip.address.clone() });
        }
    }
    ServerObservation {
        provider_id: ProviderId::new("upcloud", &details.uuid),
        state: machine_state(&details.state),
        addresses,
        plan: details.plan.chars().take(64).collect(),
        tags: details
            .labels
            .label
            .iter()
            .filter(|l| l.key.len() <= 256 && l.value.len() <= 256)
            .take(64)
            .map(|l| (tag_key(&l.key), l.value.clone()))
            .collect(),
    }
}

#[async_trait]
impl Provider for UpcloudProvider {
    fn provider_type(&self) -> &'static str {
        "upcloud"
    }

    fn price(&self, plan: &str, zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        let zone = if zone.is_empty() { &self.zone } else { zone };
        crate::prices::upcloud(zone, plan, &ZONES)
    }

    fn disk_price(&self, disk_type: &str, size_gib: u64, zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        let zone = if zone.is_empty() { &self.zone } else { zone };
        crate::prices::upcloud_disk(zone, disk_type, size_gib, &ZONES)
    }

    fn supports_endpoint(&self, kind: crate::EndpointKind) -> Result<(), String> {
        match kind {
            crate::EndpointKind::FloatingIp => Ok(()),
            crate::EndpointKind::LoadBalancer => {
                Err("the upcloud provider makes FloatingIP endpoints; its load balancers are not implemented yet".into())
            }
        }
    }

    async fn ensure_endpoint(&self, request: &crate::EndpointRequest) -> ProviderResult<crate::EndpointObservation> {
        self.supports_endpoint(request.kind).map_err(ProviderError::InvalidRequest)?;
        self.ensure_floating_ip(request).await
    }

    async fn find_endpoint(
        &self,
        kind: crate::EndpointKind,
        identity: &crate::EndpointIdentity,
    ) -> ProviderResult<Option<crate::EndpointObservation>> {
        match kind {
            crate::EndpointKind::FloatingIp => self.find_floating_ip_endpoint(identity).await,
            crate::EndpointKind::LoadBalancer => Ok(None),
        }
    }

    async fn delete_endpoint(&self, kind: crate::EndpointKind, identity: &crate::EndpointIdentity) -> ProviderResult<DeleteOutcome> {
        match kind {
            crate::EndpointKind::FloatingIp => self.delete_floating_ip(identity).await,
            crate::EndpointKind::LoadBalancer => Ok(DeleteOutcome::Gone),
        }
    }

    fn endpoint_price(&self, kind: crate::EndpointKind, zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        let zone = if zone.is_empty() { &self.zone } else { zone };
        match kind {
            crate::EndpointKind::FloatingIp => crate::prices::upcloud_floating_ip(zone, &ZONES),
            crate::EndpointKind::LoadBalancer => Err("the upcloud provider makes no load balancers yet: no price".into()),
        }
    }

    fn resolve_plan(&self, plan: &str) -> ProviderResult<String> {
        // Native plans look like 2xCPU-4GB, DEV-1xCPU-1GB-10GB, HIMEM-4xCPU-32GB…
        plans::resolve("upcloud", plan, &PLANS, |p| {
            let core = p.split_once('-').filter(|(prefix, _)| prefix.chars().all(|c| c.is_ascii_uppercase())).map_or(p, |(_, rest)| rest);
            core.split_once("xCPU-").is_some_and(|(cpus, mem)| {
                !cpus.is_empty()
                    && cpus.chars().all(|c| c.is_ascii_digit())
                    && mem.contains("GB")
                    && mem.starts_with(|c: char| c.is_ascii_digit())
            })
        })
    }

    async fn validate_credentials(&self) -> ProviderResult<()> {
        self.call_retrying(|| Method::Get, "/account", &[], None, crate::ratelimit::LOOKUP_CAP).await.map(|_| ())
    }

    async fn ensure_server(&self, request: &ServerRequest) -> ProviderResult<ServerObservation> {
        let plan = self.resolve_plan(&request.plan)?;
        let zone = if request.zone.is_empty() { &self.zone } else { &request.zone };
        if !ZONES.contains(&zone.as_str()) {
            return Err(ProviderError::InvalidRequest(format!("zone {zone:?} is not an UpCloud zone ({})", ZONES.join(", "))));
        }
        let uid_lock = lock(&self.ensuring).entry(request.identity.uid.clone()).or_default().clone();
        let _guard = uid_lock.lock().await;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self.ensure(request, &plan).await;
            let delay = match &result {
                Err(e) if attempt < self.guard.policy.max_attempts => self.guard.policy.retry_delay(e, attempt),
                _ => None,
            };
            let Some(delay) = delay else { return result };
            tokio::time::sleep(delay).await;
        }
    }

    async fn find_server(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        self.find(identity).await
    }

    async fn observe_server(&self, id: &ProviderId) -> ProviderResult<Option<ServerObservation>> {
        Ok(self.details(id.native_id()).await?.map(|d| observe(&d)))
    }

    async fn delete_server(&self, id: &ProviderId) -> ProviderResult<DeleteOutcome> {
        let uuid = id.native_id();
        let Some(details) = self.details(uuid).await? else { return Ok(DeleteOutcome::Gone) };
        match details.state.as_str() {
            "started" | "error" => {
                let body =
                    serde_json::to_string(&StopServerRequest { stop_server: StopServer { stop_type: "hard".into(), timeout: None } })
                        .map_err(|e| ProviderError::Permanent(format!("cannot serialise the stop request: {e}")))?;
                match self
                    .call_retrying(|| Method::Post, &format!("/server/{uuid}/stop"), &[], Some(&body), crate::ratelimit::LOOKUP_CAP)
                    .await
                {
                    Ok(_) => Ok(DeleteOutcome::InProgress),
                    Err(ProviderError::NotFound(_)) => Ok(DeleteOutcome::Gone),
                    Err(e) => Err(e),
                }
            }
            "stopped" => {
                // `storages=1` deletes every storage attached: disks to keep (Retain) are
                // detached first, so only the others go with the server.
                for device in details.storage_devices.storage_device.iter().filter(|d| d.storage_title.starts_with(RETAIN_PREFIX)) {
                    let body = serde_json::to_string(&model::DetachStorageRequest {
                        storage_device: model::DetachStorageDevice { address: device.address.clone() },
                    })
                    .map_err(|e| ProviderError::Permanent(format!("cannot serialise the detach request: {e}")))?;
                    let path = format!("/server/{uuid}/storage/detach");
                    match self.call_retrying(|| Method::Post, &path, &[], Some(&body), crate::ratelimit::LOOKUP_CAP).await {
                        Ok(_) => {
                            tracing::info!(account = %self.account, server = %uuid, storage = %device.storage, "retained disk detached")
                        }
                        Err(ProviderError::NotFound(_)) => return Ok(DeleteOutcome::Gone),
                        Err(e) => return Err(e),
                    }
                }
                let query = [("storages".to_string(), "1".to_string())];
                match self.call_retrying(|| Method::Delete, &format!("/server/{uuid}"), &query, None, crate::ratelimit::LOOKUP_CAP).await {
                    Ok(_) | Err(ProviderError::NotFound(_)) => Ok(DeleteOutcome::Gone),
                    Err(e) => Err(e),
                }
            }
            // maintenance: stopping or still being created.
            _ => Ok(DeleteOutcome::InProgress),
        }
    }

    async fn exec(&self, id: &ProviderId, request: ExecRequest) -> ProviderResult<ExecResult> {
        let observation = self.observe_server(id).await?.ok_or_else(|| ProviderError::NotFound(format!("machine {id}")))?;
        if observation.state != MachineState::Running {
            return Err(ProviderError::Transient(format!("machine {id} is {}, not running", observation.state.as_str())));
        }
        let address =
            crate::aws::ssh_address(&observation).ok_or_else(|| ProviderError::Transient(format!("machine {id} has no address yet")))?;
        self.ssh.exec(&id.0, &address, request).await
    }

    // One observation serves the ownership check and the address (no second describe call).
    async fn exec_owned(&self, id: &ProviderId, server_uid: &str, request: ExecRequest) -> ProviderResult<ExecResult> {
        let observation = self.observe_server(id).await?.ok_or_else(|| ProviderError::NotFound(format!("machine {id}")))?;
        crate::check_owner(&observation, server_uid, "run scripts on")?;
        if observation.state != MachineState::Running {
            return Err(ProviderError::Transient(format!("machine {id} is {}, not running", observation.state.as_str())));
        }
        let address =
            crate::aws::ssh_address(&observation).ok_or_else(|| ProviderError::Transient(format!("machine {id} has no address yet")))?;
        self.ssh.exec(&id.0, &address, request).await
    }

    async fn list_servers(&self, tags: &[(String, String)]) -> ProviderResult<Vec<ServerObservation>> {
        let listed = self.list(tags, crate::ratelimit::MAX_ANSWER).await?;
        let mut observed = Vec::with_capacity(listed.len());
        for summary in listed {
            if let Some(details) = self.details(&summary.uuid).await? {
                observed.push(observe(&details));
            }
        }
        Ok(observed)
    }

    /// One `GET /server` (label-filtered): the list carries each server's state, so no
    /// per-server details call is made.
    async fn survey(&self, tags: &[(String, String)]) -> ProviderResult<Vec<crate::MachineSummary>> {
        Ok(self
            .list(tags, crate::ratelimit::MAX_ANSWER)
            .await?
            .into_iter()
            .map(|s| crate::MachineSummary { provider_id: ProviderId::new("upcloud", &s.uuid), state: machine_state(&s.state) })
            .collect())
    }

    fn ssh_public_key(&self) -> Option<String> {
        self.ssh.public_key()
    }

    fn pinned_host_key(&self, id: &ProviderId) -> Option<String> {
        self.ssh.pinned_host_key(&id.0)
    }

    fn pin_host_key(&self, id: &ProviderId, host_key: &str) {
        self.ssh.pin_host_key(&id.0, host_key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_firewall_without_ssh_sources_is_refused_not_opened_to_everyone() {
        let rule = crate::FirewallRule { direction: "out".into(), action: "accept".into(), ..Default::default() };
        let network = crate::NetworkSettings { firewall_rules: vec![rule], ..Default::default() };
        let refused = firewall_rules(&network).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("sshSourceCidrs"), "{refused}");
        let open = crate::NetworkSettings { ssh_source_cidrs: vec!["0.0.0.0/0".into()], ..network };
        assert!(firewall_rules(&open).is_ok_and(|r| r.iter().any(|r| r.destination_port_start.as_deref() == Some("22"))));
    }

    #[test]
    fn public_ip_false_leaves_out_the_public_interface() {
        let config = crate::ProviderConfig {
            name: "u".into(),
            provider_type: "upcloud".into(),
            zone: "fi-hel1".into(),
            credentials: crate::Credentials(
                [("UPCLOUD_USERNAME".to_string(), "u".to_string()), ("UPCLOUD_PASSWORD".to_string(), "p".to_string())].into(),
            ),
            ..Default::default()
        };
        let provider = UpcloudProvider::new(&config).expect("provider");
        let mut request = crate::ServerRequest {
            identity: crate::ServerIdentity { uid: "u1".into(), namespace: "ns".into(), name: "web-0".into(), cluster: None },
            plan: "1xCPU-2GB".into(),
            zone: String::new(),
            image: "debian-12".into(),
            ssh_public_key: None,
            extra_tags: Default::default(),
            instance_profile: String::new(),
            public_ip: None,
            disks: Vec::new(),
            host_key: None,
        };
        let kinds = |request: &crate::ServerRequest| -> Vec<String> {
            let body = provider.create_body(request, "1xCPU-2GB", "01000000-0000-4000-8000-000020070100");
            body.server.networking.interfaces.interface.iter().map(|i| i.kind.clone()).collect()
        };
        assert_eq!(kinds(&request), ["public", "utility"], "unset: today's interfaces");
        request.public_ip = Some(true);
        assert_eq!(kinds(&request), ["public", "utility"]);
        request.public_ip = Some(false);
        assert_eq!(kinds(&request), ["utility"], "no public IPv4 interface");
    }

    #[test]
    fn label_keys_round_trip() {
        assert_eq!(label_key(crate::tags::SERVER_UID), "provisioning_server-uid");
        assert_eq!(tag_key("provisioning_server-uid"), crate::tags::SERVER_UID);
        assert_eq!(label_key("team.example/x y"), "team_example_x_y");
    }

    #[test]
    fn errors_are_classified() {
        let doc = |code: &str| format!(r#"{{"error":{{"error_code":"{code}","error_message":"m"}}}}"#);
        assert!(matches!(classify_error("x", 401, None, &doc("AUTHENTICATION_FAILED")), ProviderError::Auth(_)));
        assert!(matches!(classify_error("x", 404, None, &doc("SERVER_NOT_FOUND")), ProviderError::NotFound(_)));
        assert!(matches!(classify_error("x", 409, None, &doc("SERVER_STATE_ILLEGAL")), ProviderError::Transient(_)));
        assert!(matches!(classify_error("x", 429, Some("3"), ""), ProviderError::Throttled { .. }));
        assert!(matches!(classify_error("x", 400, None, &doc("ZONE_INVALID")), ProviderError::InvalidRequest(_)));
        // "Not here" and "not now": never InvalidRequest, never a quick retry.
        for (status, code, kind) in [
            (409, "SERVER_RESOURCES_UNAVAILABLE", crate::CapacityKind::Insufficient),
            (409, "STORAGE_RESOURCES_UNAVAILABLE", crate::CapacityKind::Insufficient),
            (409, "IP_ADDRESS_RESOURCES_UNAVAILABLE", crate::CapacityKind::Insufficient),
            (409, "SERVER_CREATING_LIMIT_REACHED", crate::CapacityKind::Quota),
            (409, "IP_ADDRESS_LIMIT_REACHED", crate::CapacityKind::Quota),
            (400, "CORES_LIMIT_EXCEEDED", crate::CapacityKind::Quota),
        ] {
            let e = classify_error("create server", status, None, &doc(code));
            assert!(matches!(&e, ProviderError::Capacity(c) if c.kind == kind && c.quota == code), "{code}: {e:?}");
            assert!(!e.is_retryable());
        }
        // A limit of one object (rules of one firewall) is the spec's, not the account's.
        assert!(!matches!(classify_error("x", 400, None, &doc("FIREWALL_RULE_LIMIT_REACHED")), ProviderError::Capacity(_)));
        assert_eq!(hostname("Web_1", "Prod"), "web-1.prod");
    }

    #[test]
    fn problem_details_errors_name_their_code() {
        // Bodies recorded by upcloud-go-api (loadbalancer.yaml and
        // loadbalancercerticatebundlesandfrontendtlsconfigs.yaml of upcloud/service/fixtures).
        let not_found = r#"{"correlation_id":"01JY3V06MVWFHKM60ZYMHGE4C1","status":404,"title":"Service not found.","type":"https://developers.upcloud.com/1.3/errors#ERROR_RESOURCE_NOT_FOUND"}"#;
        let error = classify_error("x", 404, None, not_found);
        assert!(matches!(&error, ProviderError::NotFound(m) if m.contains("Service not found. (ERROR_RESOURCE_NOT_FOUND)")), "{error:?}");
        let invalid = r#"{"correlation_id":"01KFDTBWFKWSYR6T8BDHY1JD5J","invalid_params":[{"name":"frontends.0.properties.http2_enabled","reason":"At least one certificate bundle must be attached to enable HTTP/2."}],"status":400,"title":"Validation error.","type":"https://developers.upcloud.com/1.3/errors#ERROR_INVALID_REQUEST"}"#;
        let error = classify_error("x", 400, None, invalid);
        assert!(
            matches!(&error, ProviderError::InvalidRequest(m) if m.contains("ERROR_INVALID_REQUEST") && m.contains("frontends.0.properties.http2_enabled: At least one")),
            "{error:?}"
        );
    }
}
