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
    /// Zone ("" for the account default).
    pub zone: String,
    /// Image.
    pub image: String,
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
    Ok(ValidServer { account, plan, resolved_plan, zone, image })
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
