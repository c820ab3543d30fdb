//! EC2 Query API responses (API version 2016-11-15), parsed with quick-xml's serde support.
//! Only the fields the provider reads are declared; everything else is ignored.

use serde::Deserialize;

/// EC2's `<xxxSet><item>…</item></xxxSet>` list wrapper.
#[derive(Debug, Deserialize)]
pub struct ItemSet<T> {
    /// The items (none for an empty set).
    #[serde(rename = "item", default = "Vec::new")]
    pub items: Vec<T>,
}

impl<T> Default for ItemSet<T> {
    fn default() -> Self {
        ItemSet { items: Vec::new() }
    }
}

/// `DescribeInstancesResponse`.
#[derive(Debug, Deserialize)]
pub struct DescribeInstancesResponse {
    /// Reservations holding the instances.
    #[serde(rename = "reservationSet", default)]
    pub reservations: ItemSet<Reservation>,
    /// Pagination token, when more pages follow.
    #[serde(rename = "nextToken", default)]
    pub next_token: Option<String>,
}

/// One reservation (one RunInstances call).
#[derive(Debug, Deserialize)]
pub struct Reservation {
    /// Its instances.
    #[serde(rename = "instancesSet", default)]
    pub instances: ItemSet<Instance>,
}

/// `RunInstancesResponse`: the reservation itself.
#[derive(Debug, Deserialize)]
pub struct RunInstancesResponse {
    /// The instances started.
    #[serde(rename = "instancesSet", default)]
    pub instances: ItemSet<Instance>,
}

/// An instance as DescribeInstances and RunInstances return it.
#[derive(Debug, Deserialize)]
pub struct Instance {
    /// `i-…`.
    #[serde(rename = "instanceId")]
    pub instance_id: String,
    /// Lifecycle state.
    #[serde(rename = "instanceState")]
    pub state: InstanceState,
    /// e.g. t3.small.
    #[serde(rename = "instanceType", default)]
    pub instance_type: String,
    /// Private IPv4.
    #[serde(rename = "privateIpAddress", default)]
    pub private_ip: Option<String>,
    /// Public IPv4.
    #[serde(rename = "ipAddress", default)]
    pub public_ip: Option<String>,
    /// Private DNS name.
    #[serde(rename = "privateDnsName", default)]
    pub private_dns: Option<String>,
    /// Public DNS name.
    #[serde(rename = "dnsName", default)]
    pub public_dns: Option<String>,
    /// Tags.
    #[serde(rename = "tagSet", default)]
    pub tags: ItemSet<Tag>,
}

/// `instanceState` / `currentState`.
#[derive(Debug, Deserialize)]
pub struct InstanceState {
    /// pending, running, shutting-down, terminated, stopping, stopped.
    pub name: String,
}

/// `DescribeVolumesResponse` (what disk tagging and tests read).
#[derive(Debug, Deserialize)]
pub struct DescribeVolumesResponse {
    /// The volumes.
    #[serde(rename = "volumeSet", default)]
    pub volumes: ItemSet<Volume>,
}

/// An EBS volume.
#[derive(Debug, Deserialize)]
pub struct Volume {
    /// `vol-…`.
    #[serde(rename = "volumeId")]
    pub volume_id: String,
    /// Size in GiB.
    #[serde(default)]
    pub size: u64,
    /// gp3, gp2, io1…
    #[serde(rename = "volumeType", default)]
    pub volume_type: String,
    /// Attachments (one for a volume a machine was made with).
    #[serde(rename = "attachmentSet", default)]
    pub attachments: ItemSet<VolumeAttachment>,
    /// Tags.
    #[serde(rename = "tagSet", default)]
    pub tags: ItemSet<Tag>,
}

/// A volume's attachment.
#[derive(Debug, Deserialize)]
pub struct VolumeAttachment {
    /// The device name the volume was attached as (`/dev/sdf`).
    #[serde(default)]
    pub device: String,
}

/// A tag.
#[derive(Debug, Deserialize)]
pub struct Tag {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    #[serde(default)]
    pub value: Option<String>,
}

/// `TerminateInstancesResponse`.
#[derive(Debug, Deserialize)]
pub struct TerminateInstancesResponse {
    /// State changes.
    #[serde(rename = "instancesSet", default)]
    pub instances: ItemSet<StateChange>,
}

/// One instance's state change.
#[derive(Debug, Deserialize)]
pub struct StateChange {
    /// `i-…`.
    #[serde(rename = "instanceId")]
    pub instance_id: String,
    /// State after the call.
    #[serde(rename = "currentState")]
    pub current: InstanceState,
}

/// `DescribeSecurityGroupsResponse`.
#[derive(Debug, Deserialize)]
pub struct DescribeSecurityGroupsResponse {
    /// The groups.
    #[serde(rename = "securityGroupInfo", default)]
    pub groups: ItemSet<SecurityGroup>,
}

/// A security group (only what the provider reads).
#[derive(Debug, Deserialize)]
pub struct SecurityGroup {
    /// `sg-…`.
    #[serde(rename = "groupId")]
    pub group_id: String,
    /// Inbound rules.
    #[serde(rename = "ipPermissions", default)]
    pub ingress: ItemSet<IpPermission>,
}

/// One inbound rule of a security group.
#[derive(Debug, Deserialize)]
pub struct IpPermission {
    /// `tcp`, `udp`, `icmp` or `-1`.
    #[serde(rename = "ipProtocol", default)]
    pub protocol: String,
}

/// `CreateSecurityGroupResponse`.
#[derive(Debug, Deserialize)]
pub struct CreateSecurityGroupResponse {
    /// The new group's id.
    #[serde(rename = "groupId")]
    pub group_id: String,
}

/// `DescribeSubnetsResponse`.
#[derive(Debug, Deserialize)]
pub struct DescribeSubnetsResponse {
    /// The subnets.
    #[serde(rename = "subnetSet", default)]
    pub subnets: ItemSet<Subnet>,
}

/// A subnet (its id, VPC and zone).
#[derive(Debug, Deserialize)]
pub struct Subnet {
    /// `subnet-…`.
    #[serde(rename = "subnetId", default)]
    pub subnet_id: String,
    /// `vpc-…`.
    #[serde(rename = "vpcId")]
    pub vpc_id: String,
    /// The availability zone (`eu-north-1a`).
    #[serde(rename = "availabilityZone", default)]
    pub availability_zone: String,
}

/// `DescribeRegionsResponse` (used to validate credentials).
#[derive(Debug, Deserialize)]
pub struct DescribeRegionsResponse {
    /// Regions.
    #[serde(rename = "regionInfo", default)]
    pub regions: ItemSet<RegionInfo>,
}

/// A region.
#[derive(Debug, Deserialize)]
pub struct RegionInfo {
    /// e.g. eu-north-1.
    #[serde(rename = "regionName")]
    pub name: String,
}

/// The error document: `<Response><Errors><Error><Code/><Message/></Error></Errors>…`.
#[derive(Debug, Deserialize)]
pub struct ErrorResponse {
    /// Errors (EC2 sends one).
    #[serde(rename = "Errors")]
    pub errors: ErrorList,
}

/// `<Errors>`.
#[derive(Debug, Deserialize)]
pub struct ErrorList {
    /// `<Error>` elements.
    #[serde(rename = "Error", default)]
    pub errors: Vec<ErrorDetail>,
}

/// `<Error>`.
#[derive(Debug, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable code, e.g. AuthFailure.
    #[serde(rename = "Code")]
    pub code: String,
    /// Human-readable message.
    #[serde(rename = "Message", default)]
    pub message: String,
}

/// Parses an XML document into `T`.
pub fn parse<T: serde::de::DeserializeOwned>(xml: &str) -> Result<T, quick_xml::DeError> {
    quick_xml::de::from_str(xml)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
  <reservationSet>
    <item>
      <reservationId>r-1234567890abcdef0</reservationId>
      <ownerId>123456789012</ownerId>
      <groupSet/>
      <instancesSet>
        <item>
          <instanceId>i-1234567890abcdef0</instanceId>
          <imageId>ami-bff32ccc</imageId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-192-168-1-88.eu-west-1.compute.internal</privateDnsName>
          <dnsName>ec2-54-194-252-215.eu-west-1.compute.amazonaws.com</dnsName>
          <instanceType>t3.small</instanceType>
          <privateIpAddress>192.168.1.88</privateIpAddress>
          <ipAddress>54.194.252.215</ipAddress>
          <tagSet>
            <item><key>provisioning.dev/server-uid</key><value>u-1</value></item>
            <item><key>empty</key><value/></item>
          </tagSet>
        </item>
      </instancesSet>
    </item>
  </reservationSet>
</DescribeInstancesResponse>"#;

    #[test]
    fn parses_describe_instances() {
        let parsed: DescribeInstancesResponse = parse(DESCRIBE).expect("parse");
        let instance = &parsed.reservations.items[0].instances.items[0];
        assert_eq!(instance.instance_id, "i-1234567890abcdef0");
        assert_eq!(instance.state.name, "running");
        assert_eq!(instance.public_ip.as_deref(), Some("54.194.252.215"));
        assert_eq!(instance.tags.items[0].value.as_deref(), Some("u-1"));
        assert!(parsed.next_token.is_none());
    }

    #[test]
    fn parses_empty_sets_and_errors() {
        let parsed: DescribeInstancesResponse =
            parse("<DescribeInstancesResponse><requestId>x</requestId><reservationSet/></DescribeInstancesResponse>").expect("parse");
        assert!(parsed.reservations.items.is_empty());
        let err: ErrorResponse = parse(
            "<Response><Errors><Error><Code>AuthFailure</Code><Message>AWS was not able to validate the provided access credentials</Message></Error></Errors><RequestID>r</RequestID></Response>",
        )
        .expect("parse");
        assert_eq!(err.errors.errors[0].code, "AuthFailure");
    }
}
