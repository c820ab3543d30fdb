//! UpCloud API 1.3 request and response shapes (JSON). UpCloud wraps every list in an
//! object named after its items (`{"servers": {"server": [...]}}`, `{"labels": {"label":
//! [...]}}`), which these types follow literally.

use serde::{Deserialize, Serialize};

/// `{"label": [...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LabelList {
    /// Labels.
    #[serde(default)]
    pub label: Vec<Label>,
}

/// A server label.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Label {
    /// Key: letters, digits, `-` and `_`.
    pub key: String,
    /// Value.
    pub value: String,
}

/// `POST /1.3/server` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateServerRequest {
    /// The server to create.
    pub server: CreateServer,
}

/// The `server` object of a create request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateServer {
    /// Zone, e.g. fi-hel1.
    pub zone: String,
    /// Title shown in the hub.
    pub title: String,
    /// Hostname.
    pub hostname: String,
    /// Plan, e.g. 1xCPU-2GB.
    pub plan: String,
    /// `yes`: cloud-init templates need the metadata service.
    pub metadata: String,
    /// Labels.
    pub labels: LabelList,
    /// Storage devices.
    pub storage_devices: CreateStorageDevices,
    /// Network interfaces.
    pub networking: CreateNetworking,
    /// The login user and its SSH keys.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub login_user: Option<LoginUser>,
    /// cloud-init user data (the controller-generated SSH host key).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub user_data: Option<String>,
    /// `on` when the account declares firewall rules (absent: UpCloud's default, off).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub firewall: Option<String>,
}

/// `POST /1.3/server/{uuid}/firewall_rule` body and response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FirewallRuleRequest {
    /// The rule.
    pub firewall_rule: UpcloudFirewallRule,
}

/// `GET /1.3/server/{uuid}/firewall_rule`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FirewallRuleListResponse {
    /// `{"firewall_rule": [...]}`.
    #[serde(default)]
    pub firewall_rules: FirewallRuleList,
}

/// `{"firewall_rule": [...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FirewallRuleList {
    /// Rules in evaluation order.
    #[serde(default)]
    pub firewall_rule: Vec<UpcloudFirewallRule>,
}

/// A server firewall rule (API 1.3 `firewall_rule`; every value is a string, absent when unset).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpcloudFirewallRule {
    /// 1-based position in evaluation order.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub position: Option<String>,
    /// `in` or `out`.
    pub direction: String,
    /// `accept`, `reject` or `drop`.
    pub action: String,
    /// `IPv4` or `IPv6`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub family: Option<String>,
    /// `tcp`, `udp` or `icmp`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub protocol: Option<String>,
    /// First source address.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_address_start: Option<String>,
    /// Last source address.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_address_end: Option<String>,
    /// First destination port.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub destination_port_start: Option<String>,
    /// Last destination port.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub destination_port_end: Option<String>,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub comment: Option<String>,
}

/// `{"storage_device": [...]}` of a create request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateStorageDevices {
    /// Devices.
    pub storage_device: Vec<CreateStorageDevice>,
}

/// A storage device to create.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateStorageDevice {
    /// `clone` a template, `create` an empty disk or `attach` an existing one.
    pub action: String,
    /// Template (or storage) UUID; absent for `create`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage: String,
    /// Title.
    pub title: String,
    /// Size in GiB.
    pub size: u32,
    /// `maxiops` or `hdd`.
    pub tier: String,
}

/// `networking` of a create request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateNetworking {
    /// `{"interface": [...]}`.
    pub interfaces: CreateInterfaces,
}

/// `{"interface": [...]}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateInterfaces {
    /// Interfaces.
    pub interface: Vec<CreateInterface>,
}

/// One interface to create.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateInterface {
    /// Addresses to assign.
    pub ip_addresses: CreateIpAddresses,
    /// `public`, `utility` or `private`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// `{"ip_address": [...]}` of a create request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateIpAddresses {
    /// Addresses.
    pub ip_address: Vec<CreateIpAddress>,
}

/// An address to assign.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateIpAddress {
    /// `IPv4` or `IPv6`.
    pub family: String,
}

/// `login_user` of a create request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoginUser {
    /// User name.
    pub username: String,
    /// `{"ssh_key": [...]}`.
    pub ssh_keys: SshKeys,
    /// `no`: keys only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub create_password: Option<String>,
}

/// `{"ssh_key": [...]}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SshKeys {
    /// OpenSSH public-key lines.
    pub ssh_key: Vec<String>,
}

/// `POST /1.3/server/{uuid}/stop` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StopServerRequest {
    /// The stop request.
    pub stop_server: StopServer,
}

/// `stop_server`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StopServer {
    /// `soft` (ACPI, then hard after timeout) or `hard`.
    pub stop_type: String,
    /// Seconds before a soft stop turns hard (a string in UpCloud's API).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub timeout: Option<String>,
}

/// `GET /1.3/server` response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerListResponse {
    /// `{"server": [...]}`.
    pub servers: ServerList,
}

/// `{"server": [...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ServerList {
    /// Servers.
    #[serde(default)]
    pub server: Vec<ServerSummary>,
}

/// A server as listed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerSummary {
    /// UUID.
    pub uuid: String,
    /// started, stopped, maintenance or error.
    pub state: String,
    /// Plan name or `custom`.
    #[serde(default)]
    pub plan: String,
    /// Zone.
    #[serde(default)]
    pub zone: String,
    /// Title.
    #[serde(default)]
    pub title: String,
    /// Hostname.
    #[serde(default)]
    pub hostname: String,
    /// Labels.
    #[serde(default)]
    pub labels: LabelList,
}

/// `GET /1.3/server/{uuid}` and create/stop responses.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerDetailsResponse {
    /// The server.
    pub server: ServerDetails,
}

/// Server details.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerDetails {
    /// UUID.
    pub uuid: String,
    /// started, stopped, maintenance or error.
    pub state: String,
    /// Plan.
    #[serde(default)]
    pub plan: String,
    /// Zone.
    #[serde(default)]
    pub zone: String,
    /// Title.
    #[serde(default)]
    pub title: String,
    /// Hostname.
    #[serde(default)]
    pub hostname: String,
    /// Labels.
    #[serde(default)]
    pub labels: LabelList,
    /// Addresses.
    #[serde(default)]
    pub ip_addresses: IpAddressList,
    /// Attached storages.
    #[serde(default)]
    pub storage_devices: StorageDeviceList,
    /// Network interfaces (with each one's MAC and which of its addresses float).
    #[serde(default)]
    pub networking: Networking,
}

/// `networking` of a server's details.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Networking {
    /// `{"interface": [...]}`.
    #[serde(default)]
    pub interfaces: InterfaceList,
}

/// `{"interface": [...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InterfaceList {
    /// Interfaces in order.
    #[serde(default)]
    pub interface: Vec<Interface>,
}

/// A network interface of a server.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Interface {
    /// `public`, `utility` or `private`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Its MAC address (what a floating IP is attached to).
    #[serde(default)]
    pub mac: String,
    /// Its addresses.
    #[serde(default)]
    pub ip_addresses: InterfaceAddressList,
}

/// `{"ip_address": [...]}` of an interface.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InterfaceAddressList {
    /// Addresses.
    #[serde(default)]
    pub ip_address: Vec<InterfaceAddress>,
}

/// An address of an interface.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InterfaceAddress {
    /// The address.
    #[serde(default)]
    pub address: String,
    /// `IPv4` or `IPv6`.
    #[serde(default)]
    pub family: String,
    /// `yes` for a floating IP attached here.
    #[serde(default)]
    pub floating: String,
}

/// `PUT /1.3/server/{uuid}` body changing only the labels (the whole set is replaced).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModifyServerLabelsRequest {
    /// `{"labels": …}`.
    pub server: ModifyServerLabels,
}

/// The `server` object of a label change.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModifyServerLabels {
    /// Every label the server is to carry.
    pub labels: LabelList,
}

/// `GET /1.3/ip_address` response.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IpAddressListResponse {
    /// `{"ip_address": [...]}`.
    #[serde(default)]
    pub ip_addresses: AccountIpAddressList,
}

/// `{"ip_address": [...]}` of the account's list.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AccountIpAddressList {
    /// Addresses.
    #[serde(default)]
    pub ip_address: Vec<AccountIpAddress>,
}

/// `POST`/`GET`/`PATCH /1.3/ip_address…` response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IpAddressResponse {
    /// The address.
    pub ip_address: AccountIpAddress,
}

/// An IP address of the account (API 1.3 "IP addresses"; fields absent in an answer are
/// empty: a detached floating IP has no `server` nor `mac`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AccountIpAddress {
    /// `public`, `utility` or `private`.
    #[serde(default)]
    pub access: String,
    /// The address.
    #[serde(default)]
    pub address: String,
    /// `IPv4` or `IPv6`.
    #[serde(default)]
    pub family: String,
    /// `yes` for a floating IP.
    #[serde(default)]
    pub floating: String,
    /// The MAC of the interface it is attached to.
    #[serde(default)]
    pub mac: String,
    /// The UUID of the server it is attached to.
    #[serde(default)]
    pub server: String,
    /// Its zone.
    #[serde(default)]
    pub zone: String,
}

/// `POST /1.3/ip_address` body of a floating IP created attached to an interface.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AssignFloatingIpRequest {
    /// The address to create.
    pub ip_address: AssignFloatingIp,
}

/// The `ip_address` object of [`AssignFloatingIpRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AssignFloatingIp {
    /// `IPv4` (floating IPs are IPv4 only).
    pub family: String,
    /// `yes`.
    pub floating: String,
    /// The public interface to attach it to (the zone follows from it).
    pub mac: String,
    /// `release`: deleted with the server it is attached to, never left detached.
    pub release_policy: String,
}

/// `PATCH /1.3/ip_address/{ip}` body moving a floating IP to another interface.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MoveFloatingIpRequest {
    /// The change.
    pub ip_address: MoveFloatingIp,
}

/// The `ip_address` object of [`MoveFloatingIpRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MoveFloatingIp {
    /// The interface to move it to.
    pub mac: String,
}

/// `{"ip_address": [...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IpAddressList {
    /// Addresses.
    #[serde(default)]
    pub ip_address: Vec<IpAddress>,
}

/// An address of a server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IpAddress {
    /// `public`, `utility` or `private`.
    pub access: String,
    /// The address.
    pub address: String,
    /// `IPv4` or `IPv6`.
    pub family: String,
}

/// `{"storage_device": [...]}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StorageDeviceList {
    /// Devices.
    #[serde(default)]
    pub storage_device: Vec<StorageDevice>,
}

/// An attached storage.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StorageDevice {
    /// Storage UUID.
    pub storage: String,
    /// Size in GiB.
    #[serde(default)]
    pub storage_size: u32,
    /// Title.
    #[serde(default)]
    pub storage_title: String,
    /// `disk` or `cdrom`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// e.g. `virtio:0`.
    #[serde(default)]
    pub address: String,
}

/// `POST /1.3/server/{uuid}/storage/detach` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DetachStorageRequest {
    /// The device to detach, by its address.
    pub storage_device: DetachStorageDevice,
}

/// The device of a detach request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DetachStorageDevice {
    /// `virtio:1`…
    pub address: String,
}

/// UpCloud's error document.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorDetail,
}

/// `error`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable code, e.g. SERVER_NOT_FOUND.
    pub error_code: String,
    /// Human-readable message.
    pub error_message: String,
}

/// UpCloud's newer error document (RFC 7807 problem details), which its load balancer, file
/// storage and other newer APIs answer with (recorded by upcloud-go-api), e.g.
/// `{"type": "https://developers.upcloud.com/1.3/errors#ERROR_RESOURCE_NOT_FOUND", "title":
/// "Service not found.", "status": 404, "correlation_id": "…"}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProblemResponse {
    /// A URL whose fragment is the error code.
    #[serde(rename = "type")]
    pub kind: String,
    /// Human-readable summary.
    pub title: String,
    /// Which request fields are invalid, and why.
    #[serde(default)]
    pub invalid_params: Vec<InvalidParam>,
}

/// One entry of `invalid_params`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InvalidParam {
    /// The field, e.g. `frontends.0.properties.http2_enabled`.
    #[serde(default)]
    pub name: String,
    /// Why it is invalid.
    #[serde(default)]
    pub reason: String,
}

impl ProblemResponse {
    /// As the classic `error` object: the code from the type's fragment, the title and each
    /// invalid field's reason as the message.
    pub fn into_detail(self) -> ErrorDetail {
        let code = self.kind.rsplit_once('#').map_or(self.kind.as_str(), |(_, code)| code).to_string();
        let mut message = self.title;
        for param in self.invalid_params {
            message.push_str(&format!(" {}: {}", param.name, param.reason));
        }
        ErrorDetail { error_code: code, error_message: message }
    }
}
