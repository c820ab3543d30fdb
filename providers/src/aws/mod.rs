//! The aws provider: Amazon EC2 through the EC2 Query API (SigV4).
//!
//! Machines are found by their identity tags (`DescribeInstances` with tag filters) before
//! one is created, because a lost RunInstances response must never lead to a second machine
//! and emulators ignore ClientToken (sent anyway: real EC2 honours it). Terminated instances
//! count as gone. Every call goes through the account's rate limiter (keyed by endpoint,
//! region and access key id: see [`account_key`]; EC2's documented per-action token buckets
//! by default: see [`ec2_bucket`]); transient failures are retried with jittered backoff,
//! 429/503 and RequestLimitExceeded honour Retry-After and back off exponentially, auth
//! failures are Permanent.
//!
//! Safe defaults: instances require IMDSv2 (`MetadataOptions.HttpTokens=required`: no
//! token-less metadata reads from an SSRF), start in the account's subnet, and join the
//! account's security groups or, when it names none, a group this provider manages for the
//! account (`provisioning-<account>`, tagged `provisioning.dev/account` and
//! `provisioning.dev/managed=true` for cleanup) that allows SSH from the account's
//! `ssh_source_cidrs` and all traffic between its members, nothing else — never the VPC's
//! default group.

pub mod api;
pub mod credentials;
pub mod eip;
pub mod model;
pub mod region;

pub use self::region::{invalid_region, regional_endpoint, valid_region};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use base64::Engine as _;

use self::api::Ec2Client;
use self::model::{
    CreateSecurityGroupResponse, DescribeInstancesResponse, DescribeRegionsResponse, DescribeSecurityGroupsResponse,
    DescribeSubnetsResponse, Instance, RunInstancesResponse, TerminateInstancesResponse,
};
use crate::ratelimit::LOOKUP_CAP;
use crate::ratelimit::{AccountKey, AccountLimits, BucketSpec, Buckets, CallGuard, RateLimiter, RetryPolicy};
use crate::ssh::SshExecutor;
use crate::{
    Address, DeleteOutcome, ExecRequest, ExecResult, MachineState, NetworkSettings, Provider, ProviderConfig, ProviderError, ProviderId,
    ProviderResult, ServerIdentity, ServerObservation, ServerRequest, SharedProvider, plans,
};

/// Tag naming the account a managed security group belongs to.
pub const TAG_ACCOUNT: &str = "provisioning.dev/account";
/// Tag marking resources the provider created for an account (safe to delete with it).
pub const TAG_MANAGED: &str = "provisioning.dev/managed";

/// Abstract plans → EC2 instance types.
pub const PLANS: [(&str, &str); 4] = [("small", "t3.small"), ("medium", "t3.medium"), ("large", "t3.large"), ("xlarge", "t3.xlarge")];

/// Abstract images → (owner account, AMI name pattern), resolved per region with
/// DescribeImages (newest match). `ProviderConfig::images` overrides either per image
/// (`debian-12`) or per region and image (`eu-north-1/debian-12`).
pub const IMAGES: [(&str, &str, &str); 3] = [
    // Debian's official cloud images are published by account 136693071363.
    ("debian-12", "136693071363", "debian-12-amd64-*"),
    ("debian-13", "136693071363", "debian-13-amd64-*"),
    // Canonical.
    ("ubuntu-24.04", "099720109477", "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"),
];

const DEFAULT_REGION: &str = "us-east-1";

/// Why the aws provider has no load balancer endpoint.
pub(crate) const NO_NLB: &str = "the aws provider makes no Network Load Balancer yet (elasticloadbalancing v2 is not implemented): use type FloatingIP (an Elastic IP) or VIP";

/// Amazon EC2 throttles each API action of an account and region in a token bucket of its
/// own, shaped by the action's category ("Request throttling for the Amazon EC2 API",
/// <https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html>, request
/// token bucket sizes and refill rates): non-mutating actions (`Describe*`, `Get*`, `List*`,
/// `Search*`) hold 100 tokens refilled at 20 per second; mutating, resource-intensive
/// (RunInstances, TerminateInstances, AuthorizeSecurityGroupIngress, …) and uncategorised
/// actions hold 50 refilled at 5 per second. (Unfiltered, unpaginated Describe calls have a
/// smaller bucket, 50 at 10 per second; this provider always filters them.)
pub fn ec2_bucket(action: &str) -> BucketSpec {
    const NON_MUTATING: [&str; 4] = ["Describe", "Get", "List", "Search"];
    if NON_MUTATING.iter().any(|prefix| action.starts_with(prefix)) { BucketSpec::new(100.0, 20.0) } else { BucketSpec::new(50.0, 5.0) }
}

/// Calls of one account in flight at once. EC2 documents no concurrency limit; 16 spreads a
/// full Describe burst over several round trips without holding a socket per Server.
pub const MAX_IN_FLIGHT: usize = 16;

/// The limits of an account: EC2's documented per-action buckets ([`ec2_bucket`]), or, when
/// the Workspace sets `rateLimit` (an account whose limits AWS raised, or a test emulator),
/// one bucket of that many calls per second for every call.
pub fn default_limits(rate_limit: u32) -> AccountLimits {
    let buckets = if rate_limit == 0 {
        Buckets::PerAction { name: "ec2-documented", shape: ec2_bucket }
    } else {
        Buckets::Account(BucketSpec::per_second(rate_limit))
    };
    AccountLimits { buckets, max_in_flight: MAX_IN_FLIGHT }
}

/// EC2 meters an AWS account per region. The account is known here by its access key id
/// (every principal of an account could share the bucket; an access key is the closest
/// identity available without an extra STS call), at the endpoint actually called.
pub fn account_key(endpoint: &str, region: &str, access_key_id: &str) -> AccountKey {
    AccountKey::new("aws", endpoint, region, access_key_id)
}

/// Instance states that still hold a machine; `terminated` counts as gone.
const LIVE_STATES: [&str; 5] = ["pending", "running", "stopping", "stopped", "shutting-down"];

/// Builds the provider for an account.
pub fn build(config: &ProviderConfig) -> ProviderResult<SharedProvider> {
    Ok(Arc::new(AwsProvider::new(config)?))
}

/// The aws provider of one account.
#[derive(Debug)]
pub struct AwsProvider {
    account: String,
    region: String,
    client: Ec2Client,
    guard: CallGuard,
    images: BTreeMap<String, String>,
    resolved_images: Mutex<HashMap<String, String>>,
    ssh: SshExecutor,
    network: NetworkSettings,
    /// The managed security group's id once known (see [`AwsProvider::security_groups`]).
    managed_group: tokio::sync::Mutex<Option<String>>,
    /// The VPC of the account's subnets once checked (`Some(None)`: no subnet is configured,
    /// the region's default VPC); see [`AwsProvider::vpc`].
    vpc: tokio::sync::Mutex<Option<Option<String>>>,
    /// One ensure per Server uid at a time inside this process.
    ensuring: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Managed groups EC2 refused to delete as still in use (DependencyViolation), since when.
    in_use_since: Mutex<HashMap<String, std::time::Instant>>,
}

/// How long a managed group that no live instance uses may stay "in use" for EC2
/// (DependencyViolation: network interfaces of terminated instances detaching) before a
/// delete stops waiting for it; the next Server delete of the account tries again.
pub const GROUP_RELEASE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(600);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Critical sections are single map operations: a poisoned lock still holds valid data.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Most bytes of the answer read for an EC2 action: the account's images (a name pattern may
/// match many) up to [`crate::ratelimit::MAX_ANSWER`]; everything else is about one machine or
/// one group ([`LOOKUP_CAP`]). DescribeInstances passes its own cap.
fn answer_cap(action: &str) -> usize {
    match action {
        "DescribeImages" | "DescribeInstances" => crate::ratelimit::MAX_ANSWER,
        _ => LOOKUP_CAP,
    }
}

/// `params` (filters numbered from 1) with a filter for live instance states added.
fn live_filter(mut params: Vec<(String, String)>) -> Vec<(String, String)> {
    let n = params.iter().filter(|(k, _)| k.ends_with(".Name")).count() + 1;
    params.push((format!("Filter.{n}.Name"), "instance-state-name".into()));
    for (i, state) in LIVE_STATES.iter().enumerate() {
        params.push((format!("Filter.{n}.Value.{}", i + 1), (*state).to_string()));
    }
    params
}

impl AwsProvider {
    /// Builds the provider; fails on missing credentials or a malformed endpoint or region.
    pub fn new(config: &ProviderConfig) -> ProviderResult<Self> {
        let region = if config.region.is_empty() { DEFAULT_REGION.to_string() } else { config.region.clone() };
        if !valid_region(&region) {
            return Err(invalid_region(&config.name, &region));
        }
        let client = Ec2Client::new(config, &region)?;
        // Metered as the role when one is assumed, else as the access key.
        let key = account_key(client.endpoint(), &region, &client.credentials().principal());
        Ok(AwsProvider {
            account: config.name.clone(),
            client,
            guard: CallGuard::new(key, default_limits(config.rate_limit), RetryPolicy::default()),
            region,
            images: config.images.clone(),
            resolved_images: Mutex::new(HashMap::new()),
            ssh: SshExecutor::new(config, "admin"),
            network: config.network.clone(),
            managed_group: tokio::sync::Mutex::new(None),
            vpc: tokio::sync::Mutex::new(None),
            ensuring: Mutex::new(HashMap::new()),
            in_use_since: Mutex::new(HashMap::new()),
        })
    }

    /// The account's limiter (shared by every provider of the same cloud account).
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.guard.limiter
    }

    /// The raw transport (benchmarks measure signing and parsing through it).
    pub fn client(&self) -> &Ec2Client {
        &self.client
    }

    async fn call_retrying(&self, action: &str, params: &[(String, String)]) -> ProviderResult<String> {
        self.call_retrying_capped(action, params, answer_cap(action)).await
    }

    async fn call_retrying_capped(&self, action: &str, params: &[(String, String)], cap: usize) -> ProviderResult<String> {
        self.guard.retry(action, || self.client.call_capped(action, params, cap)).await
    }

    /// DescribeInstances, every page, within `cap` bytes of answers together (checked before
    /// each page is parsed): a look-up of one machine expects a few KiB ([`LOOKUP_CAP`]), a
    /// list of the account's machines more ([`crate::ratelimit::MAX_ANSWER`]).
    async fn describe(&self, params: Vec<(String, String)>, cap: usize) -> ProviderResult<Vec<Instance>> {
        let mut instances = Vec::new();
        let mut next_token: Option<String> = None;
        // All pages together within one answer's cap: the endpoint is a Workspace's to name,
        // and what its pages decode to is kept until the last one.
        let mut read = 0usize;
        // And few pages, each with a new token: an endpoint sending tiny pages that always say
        // more follow would otherwise hold the caller for days.
        let max_pages = if cap <= LOOKUP_CAP { MAX_LOOKUP_PAGES } else { MAX_LIST_PAGES };
        let mut pages = 0usize;
        loop {
            pages += 1;
            if pages > max_pages {
                return Err(ProviderError::Permanent(format!("EC2 DescribeInstances: more than {max_pages} pages; refused")));
            }
            let mut page = params.clone();
            if let Some(token) = &next_token {
                page.push(("NextToken".into(), token.clone()));
            }
            let xml = self.call_retrying_capped("DescribeInstances", &page, cap.saturating_sub(read).max(1)).await?;
            read += xml.len();
            if read > cap {
                return Err(ProviderError::Permanent(format!(
                    "EC2 DescribeInstances: the answers are larger than {} KiB together; refused",
                    cap >> 10
                )));
            }
            let parsed: DescribeInstancesResponse = self.client.parse("DescribeInstances", &xml)?;
            instances.extend(
                parsed.reservations.items.into_iter().flat_map(|r| r.instances.items).filter(|i| valid_instance_id(&i.instance_id)),
            );
            // A token is sent back with the next page: only a token's shape is.
            if parsed.next_token.as_ref().is_some_and(|t| t.len() > 4096) {
                return Err(ProviderError::Permanent("EC2 DescribeInstances: a nextToken over 4 KiB; refused".into()));
            }
            match parsed.next_token.filter(|t| !t.is_empty()) {
                Some(token) if next_token.as_ref() == Some(&token) => {
                    return Err(ProviderError::Permanent("EC2 DescribeInstances: the same nextToken twice; refused".into()));
                }
                Some(token) => next_token = Some(token),
                None => return Ok(instances),
            }
        }
    }

    /// Live instances carrying all of `tags`.
    async fn describe_tagged(&self, tags: &[(String, String)], cap: usize) -> ProviderResult<Vec<Instance>> {
        let mut params = Vec::new();
        for (i, (key, value)) in tags.iter().enumerate() {
            params.push((format!("Filter.{}.Name", i + 1), format!("tag:{key}")));
            params.push((format!("Filter.{}.Value.1", i + 1), value.clone()));
        }
        self.describe_live(params, cap).await
    }

    /// Live instances matching the filters `params` (numbered from 1).
    async fn describe_live(&self, params: Vec<(String, String)>, cap: usize) -> ProviderResult<Vec<Instance>> {
        self.describe(live_filter(params), cap).await
    }

    async fn find(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        let tags = [(crate::tags::SERVER_UID.to_string(), identity.uid.clone())];
        let mut found: Vec<ServerObservation> = self.describe_tagged(&tags, LOOKUP_CAP).await?.iter().map(observe).collect();
        if found.len() > 1 {
            // Only a cloud that lost a ClientToken could get here; report, never pick silently.
            tracing::warn!(uid = %identity.uid, count = found.len(), "several machines carry one Server uid");
            found.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        }
        Ok(found.into_iter().next())
    }

    async fn resolve_image(&self, image: &str) -> ProviderResult<String> {
        if let Some(native) = self.images.get(&format!("{}/{image}", self.region)).or_else(|| self.images.get(image)) {
            return Ok(native.clone());
        }
        if image.starts_with("ami-") {
            return Ok(image.to_string());
        }
        if let Some(cached) = lock(&self.resolved_images).get(image) {
            return Ok(cached.clone());
        }
        let Some((_, owner, pattern)) = IMAGES.iter().find(|(name, _, _)| *name == image) else {
            let names: Vec<&str> = IMAGES.iter().map(|(n, _, _)| *n).collect();
            return Err(ProviderError::InvalidRequest(format!(
                "image {image:?} is neither an AMI id nor one of the aws images ({}); set it in the Workspace's images",
                names.join(", ")
            )));
        };
        let params = vec![
            ("Owner.1".to_string(), (*owner).to_string()),
            ("Filter.1.Name".to_string(), "name".to_string()),
            ("Filter.1.Value.1".to_string(), (*pattern).to_string()),
            ("Filter.2.Name".to_string(), "state".to_string()),
            ("Filter.2.Value.1".to_string(), "available".to_string()),
        ];
        let xml = self.call_retrying("DescribeImages", &params).await?;
        let parsed: ImagesResponse = self.client.parse("DescribeImages", &xml)?;
        let newest =
            parsed.images.items.into_iter().filter(|i| valid_image_id(&i.image_id)).max_by(|a, b| a.creation_date.cmp(&b.creation_date));
        let Some(newest) = newest else {
            return Err(ProviderError::InvalidRequest(format!(
                "no AMI for image {image:?} in region {} (owner {owner}, name {pattern}); set it in the Workspace's images",
                self.region
            )));
        };
        lock(&self.resolved_images).insert(image.to_string(), newest.image_id.clone());
        Ok(newest.image_id)
    }

    /// The security groups new instances join: the account's, else the managed group
    /// (found by name, created with its rules when missing, rules re-added when a crash
    /// left it without any).
    async fn security_groups(&self) -> ProviderResult<Vec<String>> {
        if !self.network.security_group_ids.is_empty() {
            return Ok(self.network.security_group_ids.clone());
        }
        // Before anything is created: the group's SSH rule needs its sources.
        check_ssh_sources(&self.account, &self.network.ssh_source_cidrs)?;
        let mut cached = self.managed_group.lock().await;
        if let Some(id) = cached.as_ref() {
            return Ok(vec![id.clone()]);
        }
        let name = managed_group_name(&self.account);
        let vpc = self.vpc().await?;
        let mut filter = vec![("Filter.1.Name".to_string(), "group-name".to_string()), ("Filter.1.Value.1".to_string(), name.clone())];
        if let Some(vpc) = &vpc {
            filter.push(("Filter.2.Name".into(), "vpc-id".into()));
            filter.push(("Filter.2.Value.1".into(), vpc.clone()));
        }
        // Another process of ours may create the group between our look-up and our create:
        // EC2 refuses the second (names are unique per VPC), and the loser takes the winner's.
        let mut attempts = 0;
        let id = loop {
            attempts += 1;
            let xml = self.call_retrying("DescribeSecurityGroups", &filter).await?;
            let parsed: DescribeSecurityGroupsResponse = self.client.parse("DescribeSecurityGroups", &xml)?;
            // A group's id is cached and sent with every create: only an id's shape is.
            match parsed.groups.items.into_iter().find(|g| valid_id(&g.group_id, "sg-")) {
                Some(group) if !group.ingress.items.is_empty() => break group.group_id,
                Some(group) => {
                    self.authorize_managed_group(&group.group_id).await?;
                    break group.group_id;
                }
                None => {}
            }
            let mut params = vec![
                ("GroupName".to_string(), name.clone()),
                ("GroupDescription".to_string(), format!("provisioning account {}: SSH in, traffic between members", self.account)),
                ("TagSpecification.1.ResourceType".to_string(), "security-group".to_string()),
                ("TagSpecification.1.Tag.1.Key".to_string(), TAG_ACCOUNT.to_string()),
                ("TagSpecification.1.Tag.1.Value".to_string(), self.account.clone()),
                ("TagSpecification.1.Tag.2.Key".to_string(), TAG_MANAGED.to_string()),
                ("TagSpecification.1.Tag.2.Value".to_string(), "true".to_string()),
            ];
            if let Some(vpc) = &vpc {
                params.push(("VpcId".into(), vpc.clone()));
            }
            let xml = match self
                .guard
                .once("CreateSecurityGroup", || self.client.call_capped("CreateSecurityGroup", &params, LOOKUP_CAP))
                .await
            {
                Ok(xml) => xml,
                Err(e) if api::is_code(&e, "InvalidGroup.Duplicate") && attempts < 3 => {
                    tracing::debug!(account = %self.account, "the managed security group was created meanwhile; using it");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let created: CreateSecurityGroupResponse = self.client.parse("CreateSecurityGroup", &xml)?;
            if !valid_id(&created.group_id, "sg-") {
                return Err(ProviderError::Transient("EC2 CreateSecurityGroup returned no well-formed group id".into()));
            }
            tracing::info!(account = %self.account, group = %created.group_id, "created the account's security group");
            self.authorize_managed_group(&created.group_id).await?;
            break created.group_id;
        };
        *cached = Some(id.clone());
        Ok(vec![id])
    }

    /// The VPC of the account's subnets (`subnetId` and every `zoneSubnets` entry), checked
    /// once per provider instance with one DescribeSubnets (answer capped at [`LOOKUP_CAP`]):
    /// each subnet must exist, a zone's subnet must be in that zone, and all must share one
    /// VPC (one managed security group serves them all). `None`: no subnet configured.
    async fn vpc(&self) -> ProviderResult<Option<String>> {
        let mut checked = self.vpc.lock().await;
        if let Some(vpc) = checked.as_ref() {
            return Ok(vpc.clone());
        }
        let wanted = configured_subnets(&self.network);
        if wanted.is_empty() {
            *checked = Some(None);
            return Ok(None);
        }
        let params: Vec<(String, String)> =
            wanted.keys().enumerate().map(|(i, subnet)| (format!("SubnetId.{}", i + 1), subnet.clone())).collect();
        let xml = match self.call_retrying("DescribeSubnets", &params).await {
            Ok(xml) => xml,
            Err(e) if api::is_code(&e, "InvalidSubnetID.NotFound") => {
                return Err(ProviderError::InvalidRequest(format!(
                    "a subnet of account {:?} (subnetId, zoneSubnets) does not exist: {e}",
                    self.account
                )));
            }
            Err(e) => return Err(e),
        };
        let parsed: DescribeSubnetsResponse = self.client.parse("DescribeSubnets", &xml)?;
        drop(xml);
        let vpc = check_subnets(&self.account, &wanted, &parsed.subnets.items)?;
        *checked = Some(Some(vpc.clone()));
        Ok(Some(vpc))
    }

    /// The subnet a machine in `zone` starts in: the zone's `zoneSubnets` entry; else, when
    /// the map is empty, `subnetId` (`None`: the region's default subnet). A zone the map
    /// does not list is refused (nothing has been created).
    fn subnet_for(&self, zone: &str) -> ProviderResult<Option<String>> {
        subnet_for(&self.account, &self.network, zone)
    }

    async fn authorize_managed_group(&self, group_id: &str) -> ProviderResult<()> {
        let params = managed_group_ingress(group_id, &self.network.ssh_source_cidrs)?;
        match self.call_retrying("AuthorizeSecurityGroupIngress", &params).await {
            Ok(_) => Ok(()),
            // Added meanwhile by another process of ours: the rules are there.
            Err(e) if api::is_code(&e, "InvalidPermission.Duplicate") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the account's managed security groups once no live instance is in one of them
    /// (found by name and the account and managed tags: never a group this provider did not
    /// create). One DescribeInstances while machines remain; the group look-up and delete
    /// only after the last. `Ok(false)` while EC2 still holds a group as in use
    /// (DependencyViolation: retry later), for at most [`GROUP_RELEASE_PATIENCE`].
    /// Idempotent; a create racing with it finds its group gone at RunInstances and
    /// re-creates it ([`AwsProvider::ensure`]), and a delete racing with a create is refused
    /// by EC2 (DependencyViolation) and finds the new machine next time.
    pub async fn release_unused_groups(&self) -> ProviderResult<bool> {
        let name = managed_group_name(&self.account);
        let members =
            vec![("Filter.1.Name".to_string(), "instance.group-name".to_string()), ("Filter.1.Value.1".to_string(), name.clone())];
        // Whether any member is left: one small page is the answer (runs on every delete).
        let mut page = live_filter(members);
        page.push(("MaxResults".to_string(), "5".to_string()));
        let xml = self.call_retrying_capped("DescribeInstances", &page, LOOKUP_CAP).await?;
        let parsed: DescribeInstancesResponse = self.client.parse("DescribeInstances", &xml)?;
        drop(xml);
        if parsed.reservations.items.iter().any(|r| !r.instances.items.is_empty()) {
            return Ok(true);
        }
        drop(parsed);
        // Serialises the delete with this process's look-ups of the group (a create waits,
        // then misses the cache and finds or re-creates it).
        let mut cached = self.managed_group.lock().await;
        let filter = [
            ("Filter.1.Name", "group-name".to_string()),
            ("Filter.1.Value.1", name),
            ("Filter.2.Name", format!("tag:{TAG_ACCOUNT}")),
            ("Filter.2.Value.1", self.account.clone()),
            ("Filter.3.Name", format!("tag:{TAG_MANAGED}")),
            ("Filter.3.Value.1", "true".to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v));
        let xml = self.call_retrying("DescribeSecurityGroups", &filter).await?;
        let groups: DescribeSecurityGroupsResponse = self.client.parse("DescribeSecurityGroups", &xml)?;
        let mut released = true;
        // At most a few of the account's own groups (one per VPC); ids of a group's shape only.
        for group in groups.groups.items.into_iter().filter(|g| valid_id(&g.group_id, "sg-")).take(MAX_MANAGED_GROUPS) {
            let id = group.group_id;
            match self.call_retrying("DeleteSecurityGroup", &[("GroupId".to_string(), id.clone())]).await {
                Ok(_) => tracing::info!(account = %self.account, group = %id, "deleted the account's security group: no machine uses it"),
                Err(e) if api::is_code(&e, "InvalidGroup.NotFound") => {}
                Err(e) if api::is_code(&e, "DependencyViolation") => {
                    let since = {
                        let mut in_use = lock(&self.in_use_since);
                        if in_use.len() >= MAX_MANAGED_GROUPS && !in_use.contains_key(&id) {
                            in_use.clear();
                        }
                        *in_use.entry(id.clone()).or_insert_with(std::time::Instant::now)
                    };
                    if since.elapsed() < GROUP_RELEASE_PATIENCE {
                        tracing::debug!(account = %self.account, group = %id, "security group still in use at EC2; deleting it later");
                        released = false;
                    } else {
                        tracing::warn!(account = %self.account, group = %id, "security group still in use at EC2 after {GROUP_RELEASE_PATIENCE:?}: left for the next delete");
                    }
                    continue;
                }
                Err(e) => return Err(e),
            }
            lock(&self.in_use_since).remove(&id);
            if cached.as_deref() == Some(id.as_str()) {
                *cached = None;
            }
        }
        Ok(released)
    }

    /// `Gone` once the account's unused managed groups are released, else `InProgress`.
    async fn gone(&self) -> ProviderResult<DeleteOutcome> {
        Ok(if self.release_unused_groups().await? { DeleteOutcome::Gone } else { DeleteOutcome::InProgress })
    }

    fn run_params(
        &self,
        request: &ServerRequest,
        instance_type: &str,
        image_id: &str,
        subnet: Option<&str>,
        groups: &[String],
    ) -> Vec<(String, String)> {
        let mut params = vec![
            ("ImageId".to_string(), image_id.to_string()),
            ("InstanceType".to_string(), instance_type.to_string()),
            ("MinCount".to_string(), "1".to_string()),
            ("MaxCount".to_string(), "1".to_string()),
            // Real EC2 deduplicates on it for a while; the uid is unique per Server (≤ 64 chars).
            ("ClientToken".to_string(), request.identity.uid.chars().take(64).collect()),
            ("TagSpecification.1.ResourceType".to_string(), "instance".to_string()),
        ];
        let mut tags: BTreeMap<String, String> = request.extra_tags.clone();
        tags.extend(request.identity.tags());
        tags.entry("Name".into()).or_insert_with(|| format!("{}/{}", request.identity.namespace, request.identity.name));
        for (i, (key, value)) in tags.iter().enumerate() {
            params.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), key.clone()));
            params.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), value.clone()));
        }
        if !request.zone.is_empty() {
            params.push(("Placement.AvailabilityZone".into(), request.zone.clone()));
        }
        // Checked at admission and plan; an ARN goes as Arn, a name as Name.
        match request.instance_profile.trim() {
            "" => {}
            arn if arn.starts_with("arn:") => params.push(("IamInstanceProfile.Arn".into(), arn.to_string())),
            name => params.push(("IamInstanceProfile.Name".into(), name.to_string())),
        }
        // IMDSv2 only: instance credentials cannot be read by a token-less GET (SSRF).
        params.push(("MetadataOptions.HttpTokens".into(), "required".into()));
        params.push(("MetadataOptions.HttpEndpoint".into(), "enabled".into()));
        params.extend(network_params(subnet, groups, request.public_ip));
        params.extend(disk_params(request, &tags));
        // cloud-init installs the login key for the image's default user (no key pair to
        // manage) and the controller-generated host key.
        if let Some(user_data) = crate::ssh::cloud_config(request.ssh_public_key.as_deref(), request.host_key.as_ref()) {
            params.push(("UserData".into(), base64::engine::general_purpose::STANDARD.encode(user_data)));
        }
        params
    }

    async fn ensure(&self, request: &ServerRequest, instance_type: &str) -> ProviderResult<ServerObservation> {
        if let Some(existing) = self.find(&request.identity).await? {
            // A create whose answer (or disk naming) was lost: name the disks now (CreateTags
            // is idempotent), so a Retain disk is marked before anything can delete it.
            if !request.disks.is_empty() {
                self.tag_disks(existing.provider_id.native_id(), &request.disks).await?;
            }
            return Ok(existing);
        }
        // Before anything is created: the zone must have a subnet when the account maps them.
        let subnet = self.subnet_for(&request.zone)?;
        let image_id = self.resolve_image(&request.image).await?;
        // Checks the subnets (one VPC, each in its zone) before a group or machine is made.
        self.vpc().await?;
        let groups = self.security_groups().await?;
        let params = self.run_params(request, instance_type, &image_id, subnet.as_deref(), &groups);
        // Exactly one attempt: if the response is lost, the caller's next attempt looks the
        // machine up by tag first instead of creating again.
        let xml = match self.guard.once("RunInstances", || self.client.call_capped("RunInstances", &params, LOOKUP_CAP)).await {
            Ok(xml) => xml,
            // The managed group was released (its last machine deleted) since it was cached:
            // forget it; the next attempt finds or re-creates it.
            Err(e) if self.network.security_group_ids.is_empty() && api::is_code(&e, "InvalidGroup.NotFound") => {
                *self.managed_group.lock().await = None;
                return Err(ProviderError::Transient(format!("the account's security group went away meanwhile; re-creating it ({e})")));
            }
            Err(e) => return Err(e.asking(|| asked(instance_type, &request.zone, &self.region))),
        };
        let parsed: RunInstancesResponse = self.client.parse("RunInstances", &xml)?;
        let instance = parsed
            .instances
            .items
            .first()
            .filter(|i| valid_instance_id(&i.instance_id))
            .ok_or_else(|| ProviderError::Transient("EC2 RunInstances returned no instance with a well-formed id".into()))?;
        tracing::info!(account = %self.account, uid = %request.identity.uid, instance = %instance.instance_id, "created EC2 instance");
        // Each extra volume gets its disk's name (and Retain's mark): TagSpecification
        // puts the same tags on every volume of the launch. A failure here is reported; the
        // volumes already carry the Server's uid, so they are findable either way.
        if !request.disks.is_empty() {
            self.tag_disks(&instance.instance_id, &request.disks).await?;
        }
        Ok(observe(instance))
    }
}

impl AwsProvider {
    /// The EBS volumes attached to `instance_id` (DescribeVolumes, one page: a machine has at
    /// most 17).
    pub async fn instance_volumes(&self, instance_id: &str) -> ProviderResult<Vec<model::Volume>> {
        let params = [
            ("Filter.1.Name".to_string(), "attachment.instance-id".to_string()),
            ("Filter.1.Value.1".to_string(), instance_id.to_string()),
        ];
        let xml = self.call_retrying_capped("DescribeVolumes", &params, LOOKUP_CAP).await?;
        let parsed: model::DescribeVolumesResponse = self.client.parse("DescribeVolumes", &xml)?;
        Ok(parsed.volumes.items)
    }

    /// The EBS volumes carrying `tags` (DescribeVolumes by tag): a Server's volumes, including
    /// retained ones whose machine is gone.
    pub async fn volumes_tagged(&self, tags: &[(String, String)]) -> ProviderResult<Vec<model::Volume>> {
        let mut params = Vec::new();
        for (i, (key, value)) in tags.iter().enumerate() {
            params.push((format!("Filter.{}.Name", i + 1), format!("tag:{key}")));
            params.push((format!("Filter.{}.Value.1", i + 1), value.clone()));
        }
        let xml = self.call_retrying_capped("DescribeVolumes", &params, LOOKUP_CAP).await?;
        let parsed: model::DescribeVolumesResponse = self.client.parse("DescribeVolumes", &xml)?;
        Ok(parsed.volumes.items)
    }

    /// Tags each of a new machine's extra volumes with its disk's name, and Retain ones as
    /// retained (CreateTags per volume; matched by the device name [`disk_device`] gave it).
    async fn tag_disks(&self, instance_id: &str, disks: &[crate::DiskRequest]) -> ProviderResult<()> {
        let volumes = self.instance_volumes(instance_id).await?;
        for (i, disk) in disks.iter().enumerate() {
            let device = disk_device(i);
            let Some(volume) = volumes.iter().find(|v| v.attachments.items.iter().any(|a| a.device == device)) else {
                return Err(ProviderError::Transient(format!(
                    "EC2 instance {instance_id} has no volume at {device} for disk {:?} yet",
                    disk.name
                )));
            };
            let mut params = vec![
                ("ResourceId.1".to_string(), volume.volume_id.clone()),
                ("Tag.1.Key".to_string(), crate::tags::DISK.to_string()),
                ("Tag.1.Value".to_string(), disk.name.clone()),
            ];
            if disk.retain {
                params.push(("Tag.2.Key".to_string(), crate::tags::RETAINED.to_string()));
                params.push(("Tag.2.Value".to_string(), "true".to_string()));
            }
            self.call_retrying("CreateTags", &params).await?;
        }
        Ok(())
    }
}

/// The device name of a machine's `index`-th extra disk: `/dev/sdf`, `/dev/sdg`… (16 disks
/// end at `/dev/sdu`, within the names EC2 recommends for EBS volumes).
pub fn disk_device(index: usize) -> String {
    let letter = (b'f' + u8::try_from(index.min(20)).unwrap_or(20)) as char;
    format!("/dev/sd{letter}")
}

/// RunInstances parameters of a request's extra disks: one `BlockDeviceMapping.N` per disk
/// (size, type — gp3 unless given —, encrypted, DeleteOnTermination unless Retain) and the
/// machine's identity tags on its volumes (`TagSpecification.2`, ResourceType volume).
pub fn disk_params(request: &ServerRequest, tags: &BTreeMap<String, String>) -> Vec<(String, String)> {
    if request.disks.is_empty() {
        return Vec::new();
    }
    let mut params = Vec::new();
    for (i, disk) in request.disks.iter().enumerate() {
        let n = i + 1;
        let volume_type = if disk.disk_type.is_empty() { "gp3" } else { disk.disk_type.as_str() };
        params.push((format!("BlockDeviceMapping.{n}.DeviceName"), disk_device(i)));
        params.push((format!("BlockDeviceMapping.{n}.Ebs.VolumeSize"), disk.size_gib.to_string()));
        params.push((format!("BlockDeviceMapping.{n}.Ebs.VolumeType"), volume_type.to_string()));
        params.push((format!("BlockDeviceMapping.{n}.Ebs.Encrypted"), "true".to_string()));
        params.push((format!("BlockDeviceMapping.{n}.Ebs.DeleteOnTermination"), (!disk.retain).to_string()));
    }
    params.push(("TagSpecification.2.ResourceType".to_string(), "volume".to_string()));
    for (i, (key, value)) in tags.iter().enumerate() {
        params.push((format!("TagSpecification.2.Tag.{}.Key", i + 1), key.clone()));
        params.push((format!("TagSpecification.2.Tag.{}.Value", i + 1), value.clone()));
    }
    params
}

/// `DescribeImagesResponse` (only what image resolution reads).
#[derive(Debug, serde::Deserialize)]
struct ImagesResponse {
    #[serde(rename = "imagesSet", default)]
    images: model::ItemSet<ImageItem>,
}

#[derive(Debug, serde::Deserialize)]
struct ImageItem {
    #[serde(rename = "imageId")]
    image_id: String,
    #[serde(rename = "creationDate", default)]
    creation_date: String,
}

/// Checks the shape of an instance profile as a Server or pool names it: an IAM name (1 to
/// 128 letters, digits and `_+=,.@-`) or `arn:aws:iam::<12 digits>:instance-profile/<path/name>`.
/// The error says what is wrong (whether it exists is EC2's answer at RunInstances).
pub fn check_instance_profile(value: &str) -> Result<(), String> {
    let name_ok =
        |name: &str| !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || "_+=,.@-".contains(c));
    if let Some(rest) = value.strip_prefix("arn:") {
        let parts: Vec<&str> = rest.splitn(5, ':').collect();
        let ok = matches!(parts.as_slice(), [partition, "iam", "", account, resource]
            if partition.starts_with("aws")
                && account.len() == 12
                && account.bytes().all(|b| b.is_ascii_digit())
                && resource.strip_prefix("instance-profile/").and_then(|p| p.rsplit('/').next()).is_some_and(name_ok));
        return if ok {
            Ok(())
        } else {
            Err(format!("instance profile {value:?} is not an ARN of the form arn:aws:iam::<12 digits>:instance-profile/<name>"))
        };
    }
    if name_ok(value) {
        Ok(())
    } else {
        Err(format!("instance profile {value:?} is not an IAM name (1 to 128 letters, digits and _+=,.@-) nor an instance-profile ARN"))
    }
}

/// Name of the security group managed for `account`.
pub fn managed_group_name(account: &str) -> String {
    format!("provisioning-{account}")
}

/// AuthorizeSecurityGroupIngress parameters of the managed group: SSH from `ssh_sources`
/// (IPv4 and IPv6 CIDRs; `0.0.0.0/0` or `::/0` only when written so) and everything from
/// members of the group itself. No sources is an error naming the field.
pub fn managed_group_ingress(group_id: &str, ssh_sources: &[String]) -> ProviderResult<Vec<(String, String)>> {
    if ssh_sources.is_empty() {
        return Err(ssh_sources_missing(&format!("the rules of security group {group_id}")));
    }
    let mut params = vec![
        ("GroupId".to_string(), group_id.to_string()),
        ("IpPermissions.1.IpProtocol".to_string(), "tcp".to_string()),
        ("IpPermissions.1.FromPort".to_string(), "22".to_string()),
        ("IpPermissions.1.ToPort".to_string(), "22".to_string()),
    ];
    let (v6, v4): (Vec<&String>, Vec<&String>) = ssh_sources.iter().partition(|cidr| cidr.contains(':'));
    for (i, cidr) in v4.iter().enumerate() {
        params.push((format!("IpPermissions.1.IpRanges.{}.CidrIp", i + 1), (*cidr).clone()));
    }
    for (i, cidr) in v6.iter().enumerate() {
        params.push((format!("IpPermissions.1.Ipv6Ranges.{}.CidrIpv6", i + 1), (*cidr).clone()));
    }
    params.push(("IpPermissions.2.IpProtocol".to_string(), "-1".to_string()));
    params.push(("IpPermissions.2.Groups.1.GroupId".to_string(), group_id.to_string()));
    Ok(params)
}

/// Every subnet an account names (`subnetId` and `zoneSubnets`), each with the zone it must be
/// in ("" for `subnetId`: any zone).
fn configured_subnets(network: &NetworkSettings) -> BTreeMap<String, String> {
    let mut subnets: BTreeMap<String, String> = network.zone_subnets.iter().map(|(zone, s)| (s.clone(), zone.clone())).collect();
    if !network.subnet_id.is_empty() {
        subnets.entry(network.subnet_id.clone()).or_default();
    }
    subnets
}

/// Checks the account's subnet settings without a call: at most [`MAX_ZONE_SUBNETS`] zones,
/// each subnet id of EC2's shape (`subnet-` and hex), no subnet under two zones, `subnetId`
/// of that shape when set. The error names the field.
pub fn check_zone_subnets(network: &NetworkSettings) -> Result<(), String> {
    if network.zone_subnets.len() > MAX_ZONE_SUBNETS {
        return Err(format!("zoneSubnets lists {} zones; at most {MAX_ZONE_SUBNETS}", network.zone_subnets.len()));
    }
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (zone, subnet) in &network.zone_subnets {
        if !crate::ratelimit::well_formed(zone, 63, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
            return Err(format!("zoneSubnets: {zone:?} is not a zone name (lower-case letters, digits and -, e.g. eu-north-1a)"));
        }
        if !valid_id(subnet, "subnet-") {
            return Err(format!("zoneSubnets.{zone}: {subnet:?} is not a subnet id (subnet- and hex digits)"));
        }
        if let Some(other) = seen.insert(subnet, zone) {
            return Err(format!("zoneSubnets: subnet {subnet} is listed for zones {other} and {zone}; a subnet is in one zone"));
        }
    }
    if !network.subnet_id.is_empty() && !valid_id(&network.subnet_id, "subnet-") {
        return Err(format!("subnetId: {:?} is not a subnet id (subnet- and hex digits)", network.subnet_id));
    }
    Ok(())
}

/// The subnet of a machine in `zone` (see [`AwsProvider::subnet_for`]), pure.
pub fn subnet_for(account: &str, network: &NetworkSettings, zone: &str) -> ProviderResult<Option<String>> {
    check_zone_subnets(network).map_err(|e| ProviderError::InvalidRequest(format!("provider account {account:?}: {e}")))?;
    if network.zone_subnets.is_empty() {
        return Ok(Some(network.subnet_id.clone()).filter(|s| !s.is_empty()));
    }
    if let Some(subnet) = network.zone_subnets.get(zone) {
        return Ok(Some(subnet.clone()));
    }
    if zone.is_empty() && !network.subnet_id.is_empty() {
        return Ok(Some(network.subnet_id.clone()));
    }
    let zones: Vec<&str> = network.zone_subnets.keys().map(String::as_str).collect();
    let asked = if zone.is_empty() { "a machine without a zone".to_string() } else { format!("zone {zone:?}") };
    Err(ProviderError::InvalidRequest(format!(
        "{asked} has no subnet in provider account {account:?}: spec.providers[].zoneSubnets lists {}; set the \
         Server's zone (or the pool's) to one of them, or add the zone to zoneSubnets (or set subnetId)",
        zones.join(", ")
    )))
}

/// Checks DescribeSubnets' answer against the subnets asked (`wanted`: subnet → zone it must
/// be in, "" for any) and returns their one VPC.
fn check_subnets(account: &str, wanted: &BTreeMap<String, String>, found: &[model::Subnet]) -> ProviderResult<String> {
    let mut vpcs: BTreeMap<&str, &str> = BTreeMap::new();
    for (subnet, zone) in wanted {
        let Some(s) = found.iter().find(|s| &s.subnet_id == subnet) else {
            return Err(ProviderError::InvalidRequest(format!("subnet {subnet} of account {account:?} does not exist")));
        };
        if !valid_id(&s.vpc_id, "vpc-") {
            return Err(ProviderError::Transient(format!("EC2 DescribeSubnets returned no well-formed VPC id for {subnet}")));
        }
        if !zone.is_empty() && &s.availability_zone != zone {
            return Err(ProviderError::InvalidRequest(format!(
                "zoneSubnets of account {account:?}: subnet {subnet} is listed for zone {zone} but is in zone {:?}",
                s.availability_zone.chars().take(64).collect::<String>()
            )));
        }
        vpcs.entry(s.vpc_id.as_str()).or_insert(subnet.as_str());
    }
    let mut each = vpcs.iter();
    match (each.next(), each.next()) {
        (Some((vpc, _)), None) => Ok((*vpc).to_string()),
        (Some((a, sa)), Some((b, sb))) => Err(ProviderError::InvalidRequest(format!(
            "the subnets of account {account:?} (subnetId, zoneSubnets) are in more than one VPC ({sa} in {a}, {sb} in {b}): \
             list subnets of one VPC"
        ))),
        (None, _) => Err(ProviderError::InvalidRequest(format!("account {account:?} names no subnet"))),
    }
}

/// RunInstances' network parameters: the subnet and security groups, at the instance level;
/// or, when `public_ip` says whether to have a public address, inside the primary network
/// interface (EC2 refuses an instance-level SubnetId or SecurityGroupId beside a
/// NetworkInterface block).
pub fn network_params(subnet: Option<&str>, groups: &[String], public_ip: Option<bool>) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let Some(public) = public_ip else {
        if let Some(subnet) = subnet {
            params.push(("SubnetId".to_string(), subnet.to_string()));
        }
        for (i, group) in groups.iter().enumerate() {
            params.push((format!("SecurityGroupId.{}", i + 1), group.clone()));
        }
        return params;
    };
    params.push(("NetworkInterface.1.DeviceIndex".to_string(), "0".to_string()));
    params.push(("NetworkInterface.1.AssociatePublicIpAddress".to_string(), public.to_string()));
    params.push(("NetworkInterface.1.DeleteOnTermination".to_string(), "true".to_string()));
    if let Some(subnet) = subnet {
        params.push(("NetworkInterface.1.SubnetId".to_string(), subnet.to_string()));
    }
    for (i, group) in groups.iter().enumerate() {
        params.push((format!("NetworkInterface.1.SecurityGroupId.{}", i + 1), group.clone()));
    }
    params
}

fn ssh_sources_missing(whose: &str) -> ProviderError {
    ProviderError::InvalidRequest(format!(
        "sshSourceCidrs for {whose} is empty: list the networks SSH may come from (the controller's egress \
         address, e.g. 203.0.113.7/32), or 0.0.0.0/0 explicitly to allow any source"
    ))
}

/// The managed group allows SSH only from sources the account lists (never "any" by default).
fn check_ssh_sources(account: &str, ssh_sources: &[String]) -> ProviderResult<()> {
    if ssh_sources.is_empty() { Err(ssh_sources_missing(&format!("the managed security group of account {account:?}"))) } else { Ok(()) }
}

/// vCPUs of an EC2 instance type, from its size by EC2's naming (`large` 2, `xlarge` 4,
/// `Nxlarge` 4·N; burstable `t3`/`t3a`/`t4g` have 2 from `nano` up, `t2` 1 up to `small`);
/// `None` where the name does not tell (`metal`, unknown sizes).
pub fn vcpus(instance_type: &str) -> Option<u32> {
    let (family, size) = instance_type.split_once('.')?;
    match size {
        "nano" | "micro" | "small" if family == "t2" => Some(1),
        "nano" | "micro" | "small" | "medium" if family.starts_with('t') => Some(2),
        "medium" => Some(1),
        "large" => Some(2),
        "xlarge" => Some(4),
        _ => size.strip_suffix("xlarge")?.parse::<u32>().ok().map(|n| n * 4),
    }
}

/// What a RunInstances asks for, for a quota or capacity error.
fn asked(instance_type: &str, zone: &str, region: &str) -> String {
    let cpus = vcpus(instance_type).map(|n| format!(", {n} vCPUs")).unwrap_or_default();
    let place = if zone.is_empty() { format!("region {region} (any zone)") } else { format!("zone {zone}") };
    format!("1 instance of type {instance_type}{cpus} in {place}")
}

/// Maps EC2's instance state names.
pub fn machine_state(name: &str) -> MachineState {
    match name {
        "pending" => MachineState::Pending,
        "running" => MachineState::Running,
        "stopping" => MachineState::Stopping,
        "stopped" => MachineState::Stopped,
        "shutting-down" => MachineState::Terminating,
        "terminated" => MachineState::Terminated,
        other => MachineState::Other(other.to_string()),
    }
}

/// Pages of one DescribeInstances look-up of a machine (EC2 answers it in one).
const MAX_LOOKUP_PAGES: usize = 20;
/// Pages of one DescribeInstances list (EC2 pages by up to 1,000 instances; the answers
/// together stay within [`MAX_ANSWER`] as well).
const MAX_LIST_PAGES: usize = 200;

/// Managed groups of one account handled at once (one per VPC the account's machines use).
const MAX_MANAGED_GROUPS: usize = 16;

/// Most zones an account maps to subnets (`zoneSubnets`).
pub const MAX_ZONE_SUBNETS: usize = 16;

/// An EC2 resource id: `prefix` and at most 17 hex digits (EC2 makes 8 or 17).
fn valid_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|hex| crate::ratelimit::well_formed(hex, 17, |c| c.is_ascii_hexdigit()))
}

/// An EC2 instance id: `i-` and at most 17 hex digits (EC2 makes 8 or 17).
fn valid_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| crate::ratelimit::well_formed(hex, 17, |c| c.is_ascii_hexdigit()))
}

/// An AMI id (`ami-` and 8 or 17 hex digits).
fn valid_image_id(id: &str) -> bool {
    id.strip_prefix("ami-").is_some_and(|hex| crate::ratelimit::well_formed(hex, 17, |c| c.is_ascii_hexdigit()))
}

/// What an answer says of a machine, as far as it is well formed: addresses and DNS names of
/// at most 253 bytes, an instance type of at most 64, the first 64 tags (keys ≤ 128 bytes,
/// values ≤ 256, EC2's own limits).
fn observe(instance: &Instance) -> ServerObservation {
    let mut addresses = Vec::new();
    let mut push = |kind: &str, value: &Option<String>| {
        if let Some(v) =
            value.as_ref().filter(|v| crate::ratelimit::well_formed(v, 253, |c| c.is_ascii_alphanumeric() || ".-:".contains(c)))
        {
            addresses.push(Address { kind: kind.into(), address: v.clone() });
        }
    };
    push("InternalIP", &instance.private_ip);
    push("ExternalIP", &instance.public_ip);
    push("InternalDNS", &instance.private_dns);
    push("ExternalDNS", &instance.public_dns);
    ServerObservation {
        provider_id: ProviderId::new("aws", &instance.instance_id),
        state: machine_state(&instance.state.name),
        addresses,
        plan: instance.instance_type.chars().take(64).collect(),
        tags: instance
            .tags
            .items
            .iter()
            .filter(|t| t.key.len() <= 128 && t.value.as_ref().is_none_or(|v| v.len() <= 256))
            .take(64)
            .map(|t| (t.key.clone(), t.value.clone().unwrap_or_default()))
            .collect(),
    }
}

/// The address SSH should use: public first, then private.
pub(crate) fn ssh_address(observation: &ServerObservation) -> Option<String> {
    ["ExternalIP", "ExternalDNS", "InternalIP", "InternalDNS"]
        .iter()
        .find_map(|kind| observation.addresses.iter().find(|a| a.kind == *kind).map(|a| a.address.clone()))
}

#[async_trait]
impl Provider for AwsProvider {
    fn provider_type(&self) -> &'static str {
        "aws"
    }

    fn price(&self, plan: &str, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        // Instances are billed by region; the availability zone does not change the price.
        crate::prices::aws(&self.region, plan)
    }

    fn disk_price(&self, disk_type: &str, size_gib: u64, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        crate::prices::aws_disk(&self.region, disk_type, size_gib)
    }

    fn resolve_plan(&self, plan: &str) -> ProviderResult<String> {
        // EC2 instance types are family.size (t3.small, m7i.2xlarge…): pass those through.
        plans::resolve("aws", plan, &PLANS, |p| {
            p.split_once('.').is_some_and(|(family, size)| {
                !family.is_empty()
                    && !size.is_empty()
                    && family.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && size.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            })
        })
    }

    async fn validate_credentials(&self) -> ProviderResult<()> {
        let params = [("RegionName.1".to_string(), self.region.clone())];
        let xml = self.call_retrying("DescribeRegions", &params).await?;
        let _: DescribeRegionsResponse = self.client.parse("DescribeRegions", &xml)?;
        Ok(())
    }

    async fn ensure_server(&self, request: &ServerRequest) -> ProviderResult<ServerObservation> {
        let instance_type = self.resolve_plan(&request.plan)?;
        let uid_lock = lock(&self.ensuring).entry(request.identity.uid.clone()).or_default().clone();
        let _guard = uid_lock.lock().await;
        // Each attempt starts with the tag lookup, so a create whose response was lost is
        // found instead of repeated.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self.ensure(request, &instance_type).await;
            let delay = match &result {
                Err(e) if attempt < self.guard.policy.max_attempts => self.guard.policy.retry_delay(e, attempt),
                _ => None,
            };
            let Some(delay) = delay else { return result };
            tracing::debug!(uid = %request.identity.uid, attempt, error = ?result.as_ref().err(), "ensure_server retrying");
            tokio::time::sleep(delay).await;
        }
    }

    async fn find_server(&self, identity: &ServerIdentity) -> ProviderResult<Option<ServerObservation>> {
        self.find(identity).await
    }

    async fn observe_server(&self, id: &ProviderId) -> ProviderResult<Option<ServerObservation>> {
        let params = vec![("InstanceId.1".to_string(), id.native_id().to_string())];
        match self.describe(params, LOOKUP_CAP).await {
            Ok(instances) => {
                Ok(instances.iter().find(|i| i.instance_id == id.native_id()).map(observe).filter(|o| o.state != MachineState::Terminated))
            }
            Err(ProviderError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete_server(&self, id: &ProviderId) -> ProviderResult<DeleteOutcome> {
        // Already terminated (or never existed): nothing to call but the account's groups.
        if self.observe_server(id).await?.is_none() {
            return self.gone().await;
        }
        let params = vec![("InstanceId.1".to_string(), id.native_id().to_string())];
        // TerminateInstances is idempotent: repeating it after a lost response is safe.
        let xml = match self.call_retrying("TerminateInstances", &params).await {
            Ok(xml) => xml,
            Err(ProviderError::NotFound(_)) => return self.gone().await,
            Err(e) => return Err(e),
        };
        let parsed: TerminateInstancesResponse = self.client.parse("TerminateInstances", &xml)?;
        drop(xml);
        let state = parsed.instances.items.iter().find(|c| c.instance_id == id.native_id()).map(|c| machine_state(&c.current.name));
        drop(parsed);
        match state {
            None | Some(MachineState::Terminated) => self.gone().await,
            Some(_) => Ok(DeleteOutcome::InProgress),
        }
    }

    // Like the default, but a machine already gone still releases the account's unused
    // security groups: its first delete may have ended while it was shutting down.
    async fn delete_owned(&self, id: &ProviderId, server_uid: &str) -> ProviderResult<DeleteOutcome> {
        match self.observe_server(id).await? {
            Some(o) => crate::check_owner(&o, server_uid, "delete")?,
            None => return self.gone().await,
        }
        self.delete_server(id).await
    }

    async fn exec(&self, id: &ProviderId, request: ExecRequest) -> ProviderResult<ExecResult> {
        let observation = self.observe_server(id).await?.ok_or_else(|| ProviderError::NotFound(format!("machine {id}")))?;
        if observation.state != MachineState::Running {
            return Err(ProviderError::Transient(format!("machine {id} is {}, not running", observation.state.as_str())));
        }
        let address = ssh_address(&observation).ok_or_else(|| ProviderError::Transient(format!("machine {id} has no address yet")))?;
        self.ssh.exec(&id.0, &address, request).await
    }

    // One observation serves the ownership check and the address (no second describe call).
    async fn exec_owned(&self, id: &ProviderId, server_uid: &str, request: ExecRequest) -> ProviderResult<ExecResult> {
        let observation = self.observe_server(id).await?.ok_or_else(|| ProviderError::NotFound(format!("machine {id}")))?;
        crate::check_owner(&observation, server_uid, "run scripts on")?;
        if observation.state != MachineState::Running {
            return Err(ProviderError::Transient(format!("machine {id} is {}, not running", observation.state.as_str())));
        }
        let address = ssh_address(&observation).ok_or_else(|| ProviderError::Transient(format!("machine {id} has no address yet")))?;
        self.ssh.exec(&id.0, &address, request).await
    }

    fn supports_endpoint(&self, kind: crate::EndpointKind) -> Result<(), String> {
        match kind {
            crate::EndpointKind::FloatingIp => Ok(()),
            crate::EndpointKind::LoadBalancer => Err(NO_NLB.into()),
        }
    }

    async fn ensure_endpoint(&self, request: &crate::EndpointRequest) -> ProviderResult<crate::EndpointObservation> {
        self.ensure_eip(request).await
    }

    async fn find_endpoint(
        &self,
        kind: crate::EndpointKind,
        identity: &crate::EndpointIdentity,
    ) -> ProviderResult<Option<crate::EndpointObservation>> {
        if kind != crate::EndpointKind::FloatingIp {
            return Ok(None);
        }
        Ok(self.find_eip(identity).await?.map(|a| crate::EndpointObservation {
            kind,
            id: a.allocation_id.clone(),
            address: a.public_ip.clone(),
            port: crate::DEFAULT_API_PORT,
            targets: a.instance_id.iter().filter(|i| !i.is_empty()).map(|i| ProviderId::new("aws", i)).collect(),
        }))
    }

    async fn delete_endpoint(&self, kind: crate::EndpointKind, identity: &crate::EndpointIdentity) -> ProviderResult<DeleteOutcome> {
        match kind {
            crate::EndpointKind::FloatingIp => self.delete_eip(identity).await,
            crate::EndpointKind::LoadBalancer => Ok(DeleteOutcome::Gone),
        }
    }

    fn endpoint_price(&self, kind: crate::EndpointKind, _zone: &str) -> Result<crate::prices::Price, crate::prices::NoPrice> {
        match kind {
            crate::EndpointKind::FloatingIp => Ok(crate::prices::aws_public_ipv4()),
            crate::EndpointKind::LoadBalancer => Err(NO_NLB.into()),
        }
    }

    async fn list_servers(&self, tags: &[(String, String)]) -> ProviderResult<Vec<ServerObservation>> {
        Ok(self.describe_tagged(tags, crate::ratelimit::MAX_ANSWER).await?.iter().map(observe).collect())
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
    fn ids_from_answers_are_kept_only_in_their_shape() {
        assert!(valid_id("sg-0123456789abcdef0", "sg-") && valid_id("sg-12345678", "sg-") && valid_id("vpc-0a1b2c3d", "vpc-"));
        assert!(!valid_id("sg-", "sg-") && !valid_id(&format!("sg-{}", "a".repeat(18)), "sg-") && !valid_id("sg-xyz12345", "sg-"));
        assert!(!valid_id("vpc-0a1b2c3d", "sg-"));
        assert!(valid_instance_id("i-0123456789abcdef0") && !valid_instance_id(&format!("i-{}", "0".repeat(300_000))));
        assert!(valid_image_id("ami-1e749f67") && !valid_image_id("ami-../../x"));
    }

    fn network(zones: &[(&str, &str)], subnet_id: &str) -> NetworkSettings {
        NetworkSettings {
            zone_subnets: zones.iter().map(|(z, s)| (z.to_string(), s.to_string())).collect(),
            subnet_id: subnet_id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_zone_starts_in_its_subnet_and_an_unlisted_zone_is_refused_naming_the_field() {
        let three = network(&[("eu-north-1a", "subnet-0a"), ("eu-north-1b", "subnet-0b"), ("eu-north-1c", "subnet-0c")], "");
        assert_eq!(subnet_for("a", &three, "eu-north-1b").ok().flatten().as_deref(), Some("subnet-0b"));
        let refused = subnet_for("a", &three, "eu-west-1a").expect_err("unlisted zone");
        assert!(
            matches!(&refused, ProviderError::InvalidRequest(m) if m.contains("spec.providers[].zoneSubnets") && m.contains("eu-north-1a, eu-north-1b, eu-north-1c") && m.contains("eu-west-1a")),
            "{refused:?}"
        );
        assert!(subnet_for("a", &three, "").is_err(), "no zone and no subnetId: refused");
        // subnetId: the default when the map is empty, and for no zone.
        assert_eq!(subnet_for("a", &network(&[], "subnet-0d"), "eu-west-1a").ok().flatten().as_deref(), Some("subnet-0d"));
        assert_eq!(
            subnet_for("a", &network(&[("eu-north-1a", "subnet-0a")], "subnet-0d"), "").ok().flatten().as_deref(),
            Some("subnet-0d")
        );
        assert_eq!(subnet_for("a", &network(&[], ""), "eu-north-1a").ok().flatten(), None);
        // Shapes and bounds.
        for (bad, field) in [
            (network(&[("eu-north-1a", "sg-0a")], ""), "zoneSubnets.eu-north-1a"),
            (network(&[("EU North", "subnet-0a")], ""), "zoneSubnets"),
            (network(&[("eu-north-1a", "subnet-0a"), ("eu-north-1b", "subnet-0a")], ""), "listed for zones"),
            (network(&[], "subnet-../x"), "subnetId"),
        ] {
            let e = check_zone_subnets(&bad).expect_err(field);
            assert!(e.contains(field), "{e}");
        }
        let many: Vec<(String, String)> = (0..17).map(|i| (format!("z-{i}"), format!("subnet-{i:08x}"))).collect();
        let many = NetworkSettings { zone_subnets: many.into_iter().collect(), ..Default::default() };
        assert!(check_zone_subnets(&many).is_err_and(|e| e.contains("at most 16")));
    }

    #[test]
    fn subnets_must_exist_sit_in_their_zone_and_share_one_vpc() {
        let subnet =
            |id: &str, vpc: &str, zone: &str| model::Subnet { subnet_id: id.into(), vpc_id: vpc.into(), availability_zone: zone.into() };
        let wanted = configured_subnets(&network(&[("eu-north-1a", "subnet-0a"), ("eu-north-1b", "subnet-0b")], "subnet-0d"));
        let good = [
            subnet("subnet-0a", "vpc-01", "eu-north-1a"),
            subnet("subnet-0b", "vpc-01", "eu-north-1b"),
            subnet("subnet-0d", "vpc-01", "eu-north-1c"),
        ];
        assert_eq!(check_subnets("a", &wanted, &good).ok().as_deref(), Some("vpc-01"));
        let two_vpcs = [
            subnet("subnet-0a", "vpc-01", "eu-north-1a"),
            subnet("subnet-0b", "vpc-02", "eu-north-1b"),
            subnet("subnet-0d", "vpc-01", "x"),
        ];
        assert!(check_subnets("a", &wanted, &two_vpcs).is_err_and(|e| e.to_string().contains("more than one VPC")));
        let wrong_zone = [
            subnet("subnet-0a", "vpc-01", "eu-north-1b"),
            subnet("subnet-0b", "vpc-01", "eu-north-1b"),
            subnet("subnet-0d", "vpc-01", "x"),
        ];
        assert!(check_subnets("a", &wanted, &wrong_zone).is_err_and(|e| e.to_string().contains("listed for zone eu-north-1a")));
        assert!(check_subnets("a", &wanted, &good[..2]).is_err_and(|e| e.to_string().contains("subnet-0d")));
    }

    #[test]
    fn disks_are_block_device_mappings_with_their_volume_tags() {
        let request = ServerRequest {
            identity: crate::ServerIdentity { uid: "u-1".into(), namespace: "ns".into(), name: "n".into(), cluster: None },
            plan: "small".into(),
            zone: String::new(),
            image: "debian-12".into(),
            ssh_public_key: None,
            extra_tags: Default::default(),
            instance_profile: String::new(),
            public_ip: None,
            disks: vec![
                crate::DiskRequest { name: "data".into(), size_gib: 100, ..Default::default() },
                crate::DiskRequest { name: "keep".into(), size_gib: 20, disk_type: "st1".into(), retain: true, ..Default::default() },
            ],
            host_key: None,
        };
        let tags: BTreeMap<String, String> = request.identity.tags().into_iter().collect();
        let params: BTreeMap<String, String> = disk_params(&request, &tags).into_iter().collect();
        let get = |k: &str| params.get(k).map(String::as_str);
        assert_eq!(get("BlockDeviceMapping.1.DeviceName"), Some("/dev/sdf"));
        assert_eq!(get("BlockDeviceMapping.1.Ebs.VolumeSize"), Some("100"));
        assert_eq!(get("BlockDeviceMapping.1.Ebs.VolumeType"), Some("gp3"), "gp3 by default");
        assert_eq!(get("BlockDeviceMapping.1.Ebs.Encrypted"), Some("true"));
        assert_eq!(get("BlockDeviceMapping.1.Ebs.DeleteOnTermination"), Some("true"));
        assert_eq!(get("BlockDeviceMapping.2.DeviceName"), Some("/dev/sdg"));
        assert_eq!(get("BlockDeviceMapping.2.Ebs.VolumeType"), Some("st1"));
        assert_eq!(get("BlockDeviceMapping.2.Ebs.DeleteOnTermination"), Some("false"), "Retain outlives the instance");
        assert_eq!(get("TagSpecification.2.ResourceType"), Some("volume"));
        assert!(params.values().any(|v| v == "u-1"), "the server uid is on the volumes: {params:?}");
        assert_eq!(disk_device(15), "/dev/sdu", "the 16th disk");
        let none = ServerRequest { disks: Vec::new(), ..request };
        assert!(disk_params(&none, &tags).is_empty(), "no disks: no mapping, no volume tags");
    }

    #[test]
    fn a_public_ip_choice_moves_subnet_and_groups_into_the_interface() {
        let groups = vec!["sg-01".to_string()];
        let plain = network_params(Some("subnet-0a"), &groups, None);
        assert_eq!(plain, [("SubnetId".to_string(), "subnet-0a".to_string()), ("SecurityGroupId.1".to_string(), "sg-01".to_string())]);
        let private = network_params(Some("subnet-0a"), &groups, Some(false));
        assert!(private.contains(&("NetworkInterface.1.AssociatePublicIpAddress".into(), "false".into())), "{private:?}");
        assert!(private.contains(&("NetworkInterface.1.SubnetId".into(), "subnet-0a".into())), "{private:?}");
        assert!(private.contains(&("NetworkInterface.1.SecurityGroupId.1".into(), "sg-01".into())), "{private:?}");
        assert!(!private.iter().any(|(k, _)| k == "SubnetId" || k.starts_with("SecurityGroupId")), "{private:?}");
        assert!(network_params(None, &groups, Some(true)).contains(&("NetworkInterface.1.AssociatePublicIpAddress".into(), "true".into())));
    }

    #[test]
    fn plans_and_states_map() {
        let config = ProviderConfig {
            name: "a".into(),
            provider_type: "aws".into(),
            credentials: crate::Credentials(
                [("AWS_ACCESS_KEY_ID".to_string(), "AKID1".to_string()), ("AWS_SECRET_ACCESS_KEY".to_string(), "S".to_string())].into(),
            ),
            ..Default::default()
        };
        let p = AwsProvider::new(&config).expect("provider");
        assert_eq!(p.resolve_plan("small").ok().as_deref(), Some("t3.small"));
        assert_eq!(p.resolve_plan("xlarge").ok().as_deref(), Some("t3.xlarge"));
        assert_eq!(p.resolve_plan("m7i.2xlarge").ok().as_deref(), Some("m7i.2xlarge"));
        assert!(p.resolve_plan("huge").is_err());
        assert_eq!(machine_state("shutting-down"), MachineState::Terminating);
        assert_eq!(machine_state("terminated"), MachineState::Terminated);
    }

    #[test]
    fn ssh_sources_are_required_and_taken_as_written() {
        let err = managed_group_ingress("sg-1", &[]).expect_err("no sources");
        assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("sshSourceCidrs")), "{err:?}");
        let params = managed_group_ingress("sg-1", &["0.0.0.0/0".into(), "::/0".into()]).expect("explicit any");
        assert!(params.contains(&("IpPermissions.1.IpRanges.1.CidrIp".into(), "0.0.0.0/0".into())), "{params:?}");
        assert!(params.contains(&("IpPermissions.1.Ipv6Ranges.1.CidrIpv6".into(), "::/0".into())), "{params:?}");
        let params = managed_group_ingress("sg-1", &["203.0.113.7/32".into()]).expect("one source");
        assert!(!params.iter().any(|(_, v)| v == "0.0.0.0/0"), "{params:?}");
    }

    #[test]
    fn instance_profiles_are_names_or_arns() {
        for ok in
            ["eks-node", "a", "arn:aws:iam::123456789012:instance-profile/eks-node", "arn:aws:iam::123456789012:instance-profile/path/to/p"]
        {
            assert_eq!(check_instance_profile(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "has space",
            "arn:aws:iam::1234:instance-profile/p",
            "arn:aws:iam::123456789012:role/p",
            "arn:aws:iam::123456789012:instance-profile/",
            "arn:aws:ec2::123456789012:instance-profile/p",
        ] {
            let e = check_instance_profile(bad).expect_err(bad);
            assert!(e.contains("instance profile"), "{e}");
        }
        assert!(check_instance_profile(&"x".repeat(129)).is_err());
    }

    #[test]
    fn vcpus_follow_ec2_sizes() {
        let cases =
            [("t3.small", Some(2)), ("t2.micro", Some(1)), ("m7i.large", Some(2)), ("m7i.2xlarge", Some(8)), ("c6g.medium", Some(1))];
        for (t, n) in cases {
            assert_eq!(vcpus(t), n, "{t}");
        }
        assert_eq!(vcpus("m7i.metal-24xl"), None);
        assert_eq!(asked("t3.xlarge", "", "eu-north-1"), "1 instance of type t3.xlarge, 4 vCPUs in region eu-north-1 (any zone)");
    }
}
