//! A Cluster's control-plane endpoint on AWS as an Elastic IP (EC2 Query API, 2016-11-15):
//! AllocateAddress (Domain=vpc, tagged with the Cluster's identity in the same call, so a lost
//! answer is found again by DescribeAddresses on the uid tag instead of allocating twice),
//! AssociateAddress (AllowReassociation: moves it off a machine that is gone),
//! DisassociateAddress, ReleaseAddress. Network Load Balancers (elasticloadbalancing v2) are
//! not implemented: `supports_endpoint(LoadBalancer)` says so.

use serde::Deserialize;

use super::AwsProvider;
use super::model::{ItemSet, Tag};
use crate::ratelimit::LOOKUP_CAP;
use crate::{
    DeleteOutcome, EndpointIdentity, EndpointKind, EndpointObservation, EndpointRequest, ProviderError, ProviderId, ProviderResult,
};

/// `DescribeAddressesResponse`.
#[derive(Debug, Deserialize)]
pub struct DescribeAddressesResponse {
    /// The addresses.
    #[serde(rename = "addressesSet", default)]
    pub addresses: ItemSet<Address>,
}

/// One Elastic IP.
#[derive(Debug, Deserialize)]
pub struct Address {
    /// `eipalloc-…`.
    #[serde(rename = "allocationId", default)]
    pub allocation_id: String,
    /// The IPv4 address.
    #[serde(rename = "publicIp", default)]
    pub public_ip: String,
    /// The instance it is associated with, if any.
    #[serde(rename = "instanceId", default)]
    pub instance_id: Option<String>,
    /// `eipassoc-…` while associated.
    #[serde(rename = "associationId", default)]
    pub association_id: Option<String>,
    /// Tags.
    #[serde(rename = "tagSet", default)]
    pub tags: ItemSet<Tag>,
}

/// `AllocateAddressResponse`.
#[derive(Debug, Deserialize)]
pub struct AllocateAddressResponse {
    /// `eipalloc-…`.
    #[serde(rename = "allocationId")]
    pub allocation_id: String,
    /// The IPv4 address.
    #[serde(rename = "publicIp", default)]
    pub public_ip: String,
}

fn valid_allocation_id(id: &str) -> bool {
    super::valid_id(id, "eipalloc-")
}

fn observe(address: &Address, port: u16) -> EndpointObservation {
    EndpointObservation {
        kind: EndpointKind::FloatingIp,
        id: address.allocation_id.clone(),
        address: address.public_ip.clone(),
        port,
        targets: address.instance_id.iter().filter(|i| !i.is_empty()).map(|i| ProviderId::new("aws", i)).collect(),
    }
}

/// The parameters of AllocateAddress for `identity` (pure).
pub fn allocate_params(identity: &EndpointIdentity) -> Vec<(String, String)> {
    let mut params =
        vec![("Domain".to_string(), "vpc".to_string()), ("TagSpecification.1.ResourceType".to_string(), "elastic-ip".to_string())];
    let mut tags = identity.tags();
    tags.push(("Name".into(), identity.resource_name()));
    for (i, (key, value)) in tags.iter().enumerate() {
        params.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), key.clone()));
        params.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), value.clone()));
    }
    params
}

impl AwsProvider {
    /// The Elastic IP tagged with the Cluster's uid (several: the lowest id, with a warning).
    pub(super) async fn find_eip(&self, identity: &EndpointIdentity) -> ProviderResult<Option<Address>> {
        let params = vec![
            ("Filter.1.Name".to_string(), format!("tag:{}", crate::tags::CLUSTER_UID)),
            ("Filter.1.Value.1".to_string(), identity.cluster_uid.clone()),
        ];
        let xml = self.call_retrying_capped("DescribeAddresses", &params, LOOKUP_CAP).await?;
        let parsed: DescribeAddressesResponse = self.client.parse("DescribeAddresses", &xml)?;
        let mut found: Vec<Address> = parsed.addresses.items.into_iter().filter(|a| valid_allocation_id(&a.allocation_id)).collect();
        if found.len() > 1 {
            tracing::warn!(uid = %identity.cluster_uid, count = found.len(), "several Elastic IPs carry one Cluster uid");
        }
        found.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
        Ok(found.into_iter().next())
    }

    pub(super) async fn ensure_eip(&self, request: &EndpointRequest) -> ProviderResult<EndpointObservation> {
        if request.kind != EndpointKind::FloatingIp {
            return Err(ProviderError::InvalidRequest(super::NO_NLB.into()));
        }
        let mut address = match self.find_eip(&request.identity).await? {
            Some(a) => a,
            None => {
                // One attempt: a lost answer is found by its tag on the next pass.
                let params = allocate_params(&request.identity);
                let xml = self.guard.once("AllocateAddress", || self.client.call_capped("AllocateAddress", &params, LOOKUP_CAP)).await?;
                let parsed: AllocateAddressResponse = self.client.parse("AllocateAddress", &xml)?;
                if !valid_allocation_id(&parsed.allocation_id) {
                    return Err(ProviderError::Transient("EC2 AllocateAddress returned no well-formed allocation id".into()));
                }
                tracing::info!(account = %self.account, uid = %request.identity.cluster_uid, allocation = %parsed.allocation_id, "allocated Elastic IP");
                Address {
                    allocation_id: parsed.allocation_id,
                    public_ip: parsed.public_ip,
                    instance_id: None,
                    association_id: None,
                    tags: ItemSet::default(),
                }
            }
        };
        let current = address.instance_id.as_deref().filter(|i| !i.is_empty()).map(|i| ProviderId::new("aws", i));
        let holder = crate::floating_ip_holder(current.as_ref(), &request.targets);
        match (&holder, &current) {
            (Some(h), c) if c.as_ref() != Some(h) => {
                let instance = h.native_id().to_string();
                if !super::valid_instance_id(&instance) {
                    return Err(ProviderError::InvalidRequest(format!("{h} is not an EC2 instance id")));
                }
                let params = vec![
                    ("AllocationId".to_string(), address.allocation_id.clone()),
                    ("InstanceId".to_string(), instance.clone()),
                    ("AllowReassociation".to_string(), "true".to_string()),
                ];
                self.call_retrying("AssociateAddress", &params).await?;
                tracing::info!(account = %self.account, allocation = %address.allocation_id, instance = %instance, "associated Elastic IP");
                address.instance_id = Some(instance);
            }
            (None, Some(_)) => {
                self.disassociate(&address).await?;
                address.instance_id = None;
            }
            _ => {}
        }
        Ok(observe(&address, request.port))
    }

    async fn disassociate(&self, address: &Address) -> ProviderResult<()> {
        let Some(association) = address.association_id.as_deref().filter(|a| !a.is_empty()) else { return Ok(()) };
        let params = vec![("AssociationId".to_string(), association.to_string())];
        match self.call_retrying("DisassociateAddress", &params).await {
            Ok(_) => Ok(()),
            Err(e) if super::api::is_code(&e, "InvalidAssociationID.NotFound") => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn delete_eip(&self, identity: &EndpointIdentity) -> ProviderResult<DeleteOutcome> {
        let Some(address) = self.find_eip(identity).await? else { return Ok(DeleteOutcome::Gone) };
        self.disassociate(&address).await?;
        let params = vec![("AllocationId".to_string(), address.allocation_id.clone())];
        match self.call_retrying("ReleaseAddress", &params).await {
            Ok(_) => {}
            Err(e) if super::api::is_code(&e, "InvalidAllocationID.NotFound") => {}
            Err(e) => return Err(e),
        }
        tracing::info!(account = %self.account, allocation = %address.allocation_id, "released Elastic IP");
        // Gone once no address of this Cluster is found (a second one, if a cloud ever made it, next).
        Ok(if self.find_eip(identity).await?.is_none() { DeleteOutcome::Gone } else { DeleteOutcome::InProgress })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_tags_the_address_with_the_clusters_identity_in_the_same_call() {
        let identity = EndpointIdentity { cluster_uid: "0f0e-uid".into(), namespace: "k8s".into(), cluster: "kube".into() };
        let params = allocate_params(&identity);
        let get = |k: &str| params.iter().find(|(p, _)| p == k).map(|(_, v)| v.as_str());
        assert_eq!(get("Domain"), Some("vpc"));
        assert_eq!(get("TagSpecification.1.ResourceType"), Some("elastic-ip"));
        assert_eq!(get("TagSpecification.1.Tag.1.Key"), Some(crate::tags::CLUSTER_UID));
        assert_eq!(get("TagSpecification.1.Tag.1.Value"), Some("0f0e-uid"));
    }

    #[test]
    fn parses_describe_addresses() {
        let xml = r#"<DescribeAddressesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>x</requestId>
  <addressesSet><item><publicIp>198.51.100.1</publicIp><allocationId>eipalloc-12345678</allocationId><domain>vpc</domain>
  <instanceId>i-1234567890abcdef0</instanceId><associationId>eipassoc-12345678</associationId>
  <tagSet><item><key>provisioning.dev/cluster-uid</key><value>u</value></item></tagSet></item></addressesSet>
</DescribeAddressesResponse>"#;
        let parsed: DescribeAddressesResponse = super::super::model::parse(xml).expect("parses");
        let a = &parsed.addresses.items[0];
        assert_eq!((a.allocation_id.as_str(), a.public_ip.as_str()), ("eipalloc-12345678", "198.51.100.1"));
        let o = observe(a, 6443);
        assert_eq!(o.targets, vec![ProviderId::new("aws", "i-1234567890abcdef0")]);
    }
}
