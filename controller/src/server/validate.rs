//! Validate (pure): is the Server's spec usable in its workspace?

use provisioning_crds::{ProviderAccount, ServerSpec};

use crate::effective_workspace::EffectiveWorkspace;

/// What a valid Server asks for, with workspace defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidServer {
    /// The provider account.
    pub account: ProviderAccount,
    /// Plan as written (abstract or native).
    pub plan: String,
    /// Provider-native plan.
    pub resolved_plan: String,
    /// Zone the machine is (to be) made in ("" for the account default): the spec's, or the
    /// fallback zone a create moves on to ([`placement`]).
    pub zone: String,
    /// The zone the spec asks for (with defaults), the first one tried.
    pub spec_zone: String,
    /// Image.
    pub image: String,
    /// Zones tried after the spec's when it has no capacity (`spec.fallbackZones`).
    pub fallback_zones: Vec<String>,
    /// Whether the machine gets a public IPv4 address (`spec.publicIp`; `None`: the provider's
    /// default).
    pub public_ip: Option<bool>,
    /// Extra disks (`spec.disks`, checked against the account's provider).
    pub disks: Vec<provisioning_crds::Disk>,
}

impl ValidServer {
    /// The zones a machine of this spec may be in, in the order they are tried: the spec's,
    /// then its fallback zones.
    pub fn allowed_zones(&self) -> Vec<String> {
        std::iter::once(self.spec_zone.clone()).chain(self.fallback_zones.iter().cloned()).collect()
    }
}

/// Why a Server cannot be provisioned as written. Becomes `Stalled=True` with `message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Condition reason: UnknownProvider, UnknownPlan, ServerLimitReached.
    pub reason: &'static str,
    /// Exactly what is wrong.
    pub message: String,
}

/// Resolves the account a Server uses (its `spec.provider` or the workspace default).
///
/// `made_with` is the account recorded in status when the Server already has a machine: a
/// machine never moves between accounts, so resolving to another one (spec.provider or the
/// workspace default changed) stalls instead of creating a second machine elsewhere.
pub fn account(spec: &ServerSpec, ws: &EffectiveWorkspace, made_with: Option<&str>) -> Result<ProviderAccount, Invalid> {
    let account = ws.account(&spec.provider).cloned().map_err(|message| Invalid { reason: "UnknownProvider", message })?;
    match made_with {
        Some(recorded) if recorded != account.name => Err(Invalid {
            reason: "ProviderChanged",
            message: format!(
                "the machine was created with provider account {recorded:?} but the Server now resolves to {:?}; a machine cannot move between accounts: set spec.provider back to {recorded:?}, or delete the Server and create a new one",
                account.name
            ),
        }),
        _ => Ok(account),
    }
}

/// Where SSH to the account's new machines may come from, before anything is created at the
/// provider: an aws account with no `securityGroupIds` (the controller's managed group) and
/// an upcloud account with `firewallRules` need `sshSourceCidrs` — empty is an error naming
/// the field, never "any source" (`0.0.0.0/0` and `::/0` are accepted only as written) — and
/// each entry must be a CIDR.
pub fn ssh_sources(account: &ProviderAccount) -> Result<(), Invalid> {
    use provisioning_crds::ProviderType;
    let fenced = match account.provider_type {
        ProviderType::Aws => account.security_group_ids.is_empty(),
        ProviderType::Upcloud => !account.firewall_rules.is_empty(),
        ProviderType::Local | ProviderType::Simulated => false,
    };
    if !fenced {
        return Ok(());
    }
    if account.ssh_source_cidrs.is_empty() {
        let what = match account.provider_type {
            ProviderType::Aws => "the security group the controller manages for it (no securityGroupIds are set)",
            _ => "its servers' firewall (firewallRules are set)",
        };
        return Err(Invalid {
            reason: "SshSourcesMissing",
            message: format!(
                "provider account {:?} has no sshSourceCidrs, which {what} needs: list the networks SSH may come from \
                 (the controller's egress address, e.g. 203.0.113.7/32), or 0.0.0.0/0 (and ::/0) explicitly to allow any source",
                account.name
            ),
        });
    }
    for cidr in &account.ssh_source_cidrs {
        let valid = cidr.split_once('/').is_some_and(|(ip, prefix)| match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => prefix.parse::<u8>().is_ok_and(|p| p <= 32),
            Ok(std::net::IpAddr::V6(_)) => prefix.parse::<u8>().is_ok_and(|p| p <= 128),
            Err(_) => false,
        });
        if !valid {
            return Err(Invalid {
                reason: "SshSourcesInvalid",
                message: format!(
                    "sshSourceCidrs of provider account {:?}: {cidr:?} is not a CIDR (address/prefix, e.g. 203.0.113.7/32)",
                    account.name
                ),
            });
        }
    }
    Ok(())
}

/// Checks the workspace's maxServers. `rank` is how many Servers of the namespace are older
/// than this one (`None` when the Server already has a machine and so is within the limit).
pub fn within_limit(rank: Option<usize>, ws: &EffectiveWorkspace) -> Result<(), Invalid> {
    let max = ws.spec.limits.max_servers as usize;
    match rank {
        Some(rank) if rank >= max => Err(Invalid {
            reason: "ServerLimitReached",
            message: format!(
                "{} allows at most {max} servers (limits.maxServers) and {rank} older servers already count against it",
                ws.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// Validates plan, zone and image against the account; `resolve_plan` is the provider's
/// plan table (pure: no API call).
pub fn validate(
    spec: &ServerSpec,
    ws: &EffectiveWorkspace,
    account: ProviderAccount,
    resolve_plan: impl Fn(&str) -> Result<String, String>,
) -> Result<ValidServer, Invalid> {
    let plan = if spec.plan.is_empty() { ws.spec.defaults.plan.clone() } else { spec.plan.clone() };
    let resolved_plan = resolve_plan(&plan).map_err(|message| Invalid { reason: "UnknownPlan", message })?;
    let zone = [&spec.zone, &account.zone, &ws.spec.defaults.zone].into_iter().find(|z| !z.is_empty()).cloned().unwrap_or_default();
    let image = if spec.image.is_empty() { ws.spec.defaults.image.clone() } else { spec.image.clone() };
    instance_profile(&spec.instance_profile, &account)?;
    zones(&zone, &spec.fallback_zones, &account)?;
    public_ip(spec.public_ip, &account)?;
    disks(&spec.disks, &account)?;
    Ok(ValidServer {
        account,
        plan,
        resolved_plan,
        spec_zone: zone.clone(),
        zone,
        image,
        fallback_zones: spec.fallback_zones.clone(),
        public_ip: spec.public_ip,
        disks: spec.disks.clone(),
    })
}

/// `spec.disks` against the account's provider (pure): the check admission and
/// `provisioning plan` make ([`provisioning_crds::check_disks`]), plus the disk types and
/// raw disks the provider has.
pub fn disks(disks: &[provisioning_crds::Disk], account: &ProviderAccount) -> Result<(), Invalid> {
    provisioning_crds::check_disks("spec.disks", disks, Some(account.provider_type))
        .map_err(|e| Invalid { reason: "InvalidDisks", message: format!("{e} (provider account {:?})", account.name) })
}

/// The zone and `spec.fallbackZones` against the account (pure): fallback zones need a zone
/// to fall back from, are distinct, at most [`provisioning_crds::MAX_FALLBACK_ZONES`]; an aws
/// account's `zoneSubnets` (well formed, at most 16) must list every one of them
/// (`InvalidZone`, naming the field) — the same check the provider makes before any create.
pub fn zones(zone: &str, fallback_zones: &[String], account: &ProviderAccount) -> Result<(), Invalid> {
    use provisioning_crds::ProviderType;
    if !fallback_zones.is_empty() {
        let why = if zone.is_empty() {
            Some("needs a zone to fall back from: set spec.zone (or the pool's zone)".to_string())
        } else if fallback_zones.len() > provisioning_crds::MAX_FALLBACK_ZONES {
            Some(format!("lists {} zones; at most {}", fallback_zones.len(), provisioning_crds::MAX_FALLBACK_ZONES))
        } else {
            let mut seen = std::collections::BTreeSet::from([zone]);
            fallback_zones.iter().find(|z| !seen.insert(z.as_str())).map(|z| format!("lists zone {z:?} twice (or the zone itself)"))
        };
        if let Some(why) = why {
            return Err(Invalid { reason: "InvalidFallbackZones", message: format!("spec.fallbackZones {why}") });
        }
    }
    if account.zone_subnets.is_empty() {
        return Ok(());
    }
    if account.provider_type != ProviderType::Aws {
        return Err(Invalid {
            reason: "InvalidZoneSubnets",
            message: format!(
                "provider account {:?} is of type {} but sets zoneSubnets, which only aws accounts have",
                account.name,
                account.provider_type.as_str()
            ),
        });
    }
    let network = provisioning_providers::NetworkSettings {
        zone_subnets: account.zone_subnets.clone(),
        subnet_id: account.subnet_id.clone(),
        ..Default::default()
    };
    provisioning_providers::aws::check_zone_subnets(&network).map_err(|e| Invalid {
        reason: "InvalidZoneSubnets",
        message: format!("spec.providers[].{e} (provider account {:?})", account.name),
    })?;
    for z in std::iter::once(zone).chain(fallback_zones.iter().map(String::as_str)) {
        provisioning_providers::aws::subnet_for(&account.name, &network, z).map_err(|e| Invalid {
            reason: "InvalidZone",
            message: match e {
                provisioning_providers::ProviderError::InvalidRequest(m) => m,
                other => other.to_string(),
            },
        })?;
    }
    Ok(())
}

/// `spec.publicIp` is for cloud machines (aws, upcloud); local and simulated ones have no
/// public address to turn on or off.
pub fn public_ip(public_ip: Option<bool>, account: &ProviderAccount) -> Result<(), Invalid> {
    use provisioning_crds::ProviderType;
    match (public_ip, account.provider_type) {
        (None, _) | (Some(_), ProviderType::Aws | ProviderType::Upcloud) => Ok(()),
        (Some(_), other) => Err(Invalid {
            reason: "PublicIpUnsupported",
            message: format!(
                "spec.publicIp is set but provider account {:?} is of type {}: only aws and upcloud machines have public addresses",
                account.name,
                other.as_str()
            ),
        }),
    }
}

/// The zone a create of this Server asks for (pure). Without `spec.fallbackZones`: the
/// spec's zone. With them: a machine that exists stays where it is while its zone is allowed
/// (having fallen back is no reason to replace it); while creates find no capacity
/// (Stalled `InsufficientCapacity` for the current generation) the first allowed zone not
/// tried in this round (`status.zoneFallback.tried`), else — every zone tried — the spec's
/// zone again, once the round's wait is over ([`crate::server::steps::capacity_cooldown`]).
pub fn placement(valid: &ValidServer, server: &provisioning_crds::Server) -> String {
    if valid.fallback_zones.is_empty() {
        return valid.spec_zone.clone();
    }
    let allowed = valid.allowed_zones();
    let Some(status) = server.status.as_ref() else { return valid.spec_zone.clone() };
    if status.provider_id.as_deref().is_some_and(|id| !id.is_empty()) {
        return status.zone.clone().filter(|z| allowed.contains(z)).unwrap_or_else(|| valid.spec_zone.clone());
    }
    match tried_zones(server) {
        Some(tried) => allowed.into_iter().find(|z| !tried.contains(z)).unwrap_or_else(|| valid.spec_zone.clone()),
        None => valid.spec_zone.clone(),
    }
}

/// The zones tried without capacity in the current round: `status.zoneFallback.tried` while
/// the Server is Stalled `InsufficientCapacity` for its current generation, else `None`.
pub fn tried_zones(server: &provisioning_crds::Server) -> Option<&[String]> {
    let status = server.status.as_ref()?;
    let stalled = crate::conditions::find(&status.conditions, provisioning_crds::condition::STALLED)?;
    let no_capacity =
        stalled.status == "True" && stalled.reason == "InsufficientCapacity" && stalled.observed_generation == server.metadata.generation;
    if !no_capacity {
        return None;
    }
    status.zone_fallback.as_ref().map(|f| f.tried.as_slice())
}

/// An instance profile (`spec.instanceProfile`) is an aws thing, written as an IAM name or an
/// instance-profile ARN ([`provisioning_providers::aws::check_instance_profile`]); empty is
/// none. Whether it exists is EC2's answer when the machine is created.
pub fn instance_profile(profile: &str, account: &ProviderAccount) -> Result<(), Invalid> {
    if profile.is_empty() {
        return Ok(());
    }
    if account.provider_type != provisioning_crds::ProviderType::Aws {
        return Err(Invalid {
            reason: "InstanceProfileUnsupported",
            message: format!(
                "spec.instanceProfile {profile:?} is set but provider account {:?} is of type {}: only aws machines have instance profiles",
                account.name,
                account.provider_type.as_str()
            ),
        });
    }
    provisioning_providers::aws::check_instance_profile(profile)
        .map_err(|e| Invalid { reason: "InvalidInstanceProfile", message: format!("spec.instanceProfile: {e}") })
}

/// Whether a Server may adopt the machine `observed` named by its `spec.externalID` (pure).
///
/// The machine must carry this Server's identity (`provisioning.dev/server-uid` equal to the
/// Server's uid: it made the machine, or its status was lost) or the explicit tag
/// `provisioning.dev/adoptable: "true"` its owner put there. Anything else is someone else's
/// machine: adopting it would let this Server run scripts on it and, with deletionPolicy
/// Delete, destroy it. Checked on every observation and again before deleting, so the tag
/// must stay while the machine is adopted.
pub fn check_adoption(server_uid: &str, observed: &provisioning_providers::ServerObservation) -> Result<(), Invalid> {
    use provisioning_providers::tags;
    let owner = observed.tags.get(tags::SERVER_UID).map(String::as_str).filter(|u| !u.is_empty());
    if owner == Some(server_uid) && !server_uid.is_empty() {
        return Ok(());
    }
    if observed.tags.get(tags::ADOPTABLE).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(());
    }
    let whose = match owner {
        Some(uid) => format!("it belongs to another Server (tag {}={uid})", tags::SERVER_UID),
        None => "it carries no identity tag of this Server".to_string(),
    };
    Err(Invalid {
        reason: "AdoptionRefused",
        message: format!(
            "refusing to adopt machine {} (spec.externalID): {whose}; tag the machine {}=\"true\" to allow adoption. Nothing was changed or deleted",
            observed.provider_id,
            tags::ADOPTABLE
        ),
    })
}

#[cfg(test)]
mod tests {
    use provisioning_providers::{MachineState, ProviderId, ServerObservation, tags};

    use super::*;

    fn machine(tags: &[(&str, &str)]) -> ServerObservation {
        ServerObservation {
            provider_id: ProviderId("aws://i-0abc".into()),
            state: MachineState::Running,
            addresses: vec![],
            plan: "t3.small".into(),
            tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    fn account(value: serde_json::Value) -> ProviderAccount {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("account: {e}"))
    }

    #[test]
    fn instance_profiles_are_aws_names_or_arns() {
        let aws = account(serde_json::json!({"name": "aws-main", "type": "aws"}));
        assert_eq!(instance_profile("", &aws), Ok(()));
        assert_eq!(instance_profile("eks-node", &aws), Ok(()));
        assert_eq!(instance_profile("arn:aws:iam::123456789012:instance-profile/eks-node", &aws), Ok(()));
        let bad = instance_profile("arn:aws:iam::1234:instance-profile/x", &aws).expect_err("short account");
        assert!(bad.reason == "InvalidInstanceProfile" && bad.message.contains("spec.instanceProfile"), "{bad:?}");
        let local = instance_profile("eks-node", &account(serde_json::json!({"name": "l", "type": "local"}))).expect_err("local");
        assert!(local.reason == "InstanceProfileUnsupported" && local.message.contains("\"l\""), "{local:?}");
    }

    #[test]
    fn zones_must_have_a_subnet_when_the_account_maps_them() {
        let three = account(serde_json::json!({"name": "aws-main", "type": "aws", "zoneSubnets": {
            "eu-north-1a": "subnet-0a1b2c3d", "eu-north-1b": "subnet-0b1b2c3d", "eu-north-1c": "subnet-0c1b2c3d"}}));
        assert_eq!(zones("eu-north-1b", &[], &three), Ok(()));
        assert_eq!(zones("eu-north-1a", &["eu-north-1b".into(), "eu-north-1c".into()], &three), Ok(()));
        let outside = zones("eu-west-1a", &[], &three).expect_err("unlisted zone");
        assert!(outside.reason == "InvalidZone" && outside.message.contains("spec.providers[].zoneSubnets"), "{outside:?}");
        assert!(outside.message.contains("eu-west-1a") && outside.message.contains("\"aws-main\""), "{outside:?}");
        let fallback_outside = zones("eu-north-1a", &["eu-west-1a".into()], &three).expect_err("fallback unlisted");
        assert_eq!(fallback_outside.reason, "InvalidZone");
        // Fallback zones need a zone, and are distinct.
        let plain = account(serde_json::json!({"name": "a", "type": "aws"}));
        assert_eq!(zones("", &["eu-north-1b".into()], &plain).map_err(|e| e.reason), Err("InvalidFallbackZones"));
        assert_eq!(zones("eu-north-1a", &["eu-north-1a".into()], &plain).map_err(|e| e.reason), Err("InvalidFallbackZones"));
        assert_eq!(zones("anything", &[], &plain), Ok(()), "no map: any zone (subnetId or the default subnet)");
        // Only aws accounts map zones to subnets; ids are of EC2's shape.
        let upcloud = account(serde_json::json!({"name": "u", "type": "upcloud", "zoneSubnets": {"fi-hel1": "subnet-0a1b2c3d"}}));
        assert_eq!(zones("fi-hel1", &[], &upcloud).map_err(|e| e.reason), Err("InvalidZoneSubnets"));
        let bad = account(serde_json::json!({"name": "a", "type": "aws", "zoneSubnets": {"eu-north-1a": "subnet-xyz"}}));
        let e = zones("eu-north-1a", &[], &bad).expect_err("bad id");
        assert!(e.reason == "InvalidZoneSubnets" && e.message.contains("spec.providers[].zoneSubnets.eu-north-1a"), "{e:?}");
    }

    #[test]
    fn disks_are_checked_against_the_accounts_provider() {
        let disk = |v: serde_json::Value| -> provisioning_crds::Disk { serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}")) };
        let aws = account(serde_json::json!({"name": "aws-main", "type": "aws"}));
        assert_eq!(disks(&[disk(serde_json::json!({"name": "osd", "size": "100Gi", "type": "gp3"}))], &aws), Ok(()));
        let tier = disks(&[disk(serde_json::json!({"name": "osd", "size": "100Gi", "type": "maxiops"}))], &aws).expect_err("upcloud tier");
        assert!(
            tier.reason == "InvalidDisks" && tier.message.contains("spec.disks[0].type") && tier.message.contains("\"aws-main\""),
            "{tier:?}"
        );
        let local = account(serde_json::json!({"name": "l", "type": "local"}));
        let raw = disks(&[disk(serde_json::json!({"name": "osd", "size": "10Gi"}))], &local).expect_err("raw on local");
        assert!(raw.reason == "InvalidDisks" && raw.message.contains("spec.disks[0].mountPath"), "{raw:?}");
    }

    #[test]
    fn public_ip_is_for_cloud_machines() {
        for t in ["aws", "upcloud"] {
            assert_eq!(public_ip(Some(false), &account(serde_json::json!({"name": "a", "type": t}))), Ok(()));
        }
        assert_eq!(public_ip(None, &account(serde_json::json!({"name": "l", "type": "local"}))), Ok(()));
        let local = public_ip(Some(true), &account(serde_json::json!({"name": "l", "type": "local"}))).expect_err("local");
        assert!(local.reason == "PublicIpUnsupported" && local.message.contains("spec.publicIp"), "{local:?}");
    }

    #[test]
    fn ssh_sources_are_required_where_the_controller_fences_ssh() {
        let missing = ssh_sources(&account(serde_json::json!({"name": "aws-main", "type": "aws"}))).expect_err("empty");
        assert_eq!(missing.reason, "SshSourcesMissing");
        assert!(missing.message.contains("sshSourceCidrs") && missing.message.contains("\"aws-main\""), "{}", missing.message);
        // "Any" only when written, IPv4 and IPv6.
        assert_eq!(ssh_sources(&account(serde_json::json!({"name": "a", "type": "aws", "sshSourceCidrs": ["0.0.0.0/0", "::/0"]}))), Ok(()));
        assert_eq!(ssh_sources(&account(serde_json::json!({"name": "a", "type": "aws", "sshSourceCidrs": ["203.0.113.7/32"]}))), Ok(()));
        let bad = ssh_sources(&account(serde_json::json!({"name": "a", "type": "aws", "sshSourceCidrs": ["203.0.113.7"]})))
            .expect_err("no prefix");
        assert!(bad.reason == "SshSourcesInvalid" && bad.message.contains("203.0.113.7"), "{bad:?}");
        // The account's own groups, an upcloud account without a firewall, local: not fenced here.
        assert_eq!(ssh_sources(&account(serde_json::json!({"name": "a", "type": "aws", "securityGroupIds": ["sg-1"]}))), Ok(()));
        assert_eq!(ssh_sources(&account(serde_json::json!({"name": "u", "type": "upcloud"}))), Ok(()));
        assert_eq!(ssh_sources(&account(serde_json::json!({"name": "l", "type": "local"}))), Ok(()));
        let rules = serde_json::json!([{"direction": "in", "action": "accept", "protocol": "tcp", "destinationPort": "443"}]);
        let upcloud = ssh_sources(&account(serde_json::json!({"name": "u", "type": "upcloud", "firewallRules": rules}))).expect_err("fw");
        assert!(upcloud.reason == "SshSourcesMissing" && upcloud.message.contains("firewallRules"), "{upcloud:?}");
    }

    #[test]
    fn adoption_needs_our_identity_or_the_adoptable_tag() {
        assert_eq!(check_adoption("uid-1", &machine(&[(tags::SERVER_UID, "uid-1")])), Ok(()));
        assert_eq!(check_adoption("uid-1", &machine(&[(tags::ADOPTABLE, "true")])), Ok(()));
        assert_eq!(check_adoption("uid-1", &machine(&[(tags::SERVER_UID, "uid-9"), (tags::ADOPTABLE, "True")])), Ok(()));
        let foreign = check_adoption("uid-1", &machine(&[(tags::SERVER_UID, "uid-9")])).expect_err("foreign");
        assert_eq!(foreign.reason, "AdoptionRefused");
        assert!(foreign.message.contains("aws://i-0abc") && foreign.message.contains("uid-9"), "{}", foreign.message);
        let untagged = check_adoption("uid-1", &machine(&[("Name", "legacy"), (tags::ADOPTABLE, "yes")])).expect_err("untagged");
        assert!(untagged.message.contains("provisioning.dev/adoptable"), "{}", untagged.message);
        assert!(check_adoption("", &machine(&[(tags::SERVER_UID, "")])).is_err());
    }
}
