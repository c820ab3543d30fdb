//! A Cluster's control-plane endpoint on UpCloud as a floating IP (API 1.3, "IP addresses").
//!
//! UpCloud's IP addresses carry no labels, so a floating IP is found through the server it
//! is attached to: before the address is created on (or moved to) a server, that server gets
//! the label `provisioning_cluster-uid=<Cluster uid>` (`PUT /1.3/server/{uuid}`, its other
//! labels kept). The Cluster's floating IP is then the floating IPv4 address of `GET
//! /1.3/ip_address` whose `server` is one of the servers `GET /1.3/server?label=…` lists for
//! that uid. It is created attached in one call (`POST /1.3/ip_address {family: IPv4,
//! floating: yes, mac}`, the MAC of the holder's public interface), so it is never detached
//! and unfindable, and a lost answer is found on the next pass instead of creating a second
//! one. It moves with `PATCH /1.3/ip_address/{ip} {mac}` (the new holder labelled first) and
//! goes with `DELETE /1.3/ip_address/{ip}`.
//!
//! Windows and what covers them:
//! - label written, create not sent (or lost): the next pass finds no address and creates
//!   it; the label on a server without the address is harmless;
//! - create sent, answer lost: the address is on a labelled server: found, not made twice;
//! - moved, answer lost: it is on the new holder (labelled before the move) or still on the
//!   old one (still labelled): found either way;
//! - the holder deleted before the address moved off it: it is created with `release_policy:
//!   release`, so it goes with that server instead of staying behind detached (billed and
//!   unfindable); the next pass makes a new one — a new address (what remains: the Cluster
//!   re-targets as soon as a member is being deleted, which is before its machine is gone,
//!   but nothing here orders the two);
//! - a move racing a delete: the move of an address just deleted answers 404 (an error, the
//!   next pass decides); a create racing a delete of the same Cluster would leave one behind,
//!   which the controller never does (one reconcile of a Cluster at a time, and its deletion
//!   stops the ensures first).
//!
//! An address is never detached: with no live holder it stays where it is. It is made in its
//! first holder's zone and moves only within that zone (UpCloud's rule): a control plane spread
//! over zones keeps it on a holder of that zone, and with none left there the move is refused
//! (the Cluster's `EndpointReady` says why).

use super::model::{
    AssignFloatingIp, AssignFloatingIpRequest, IpAddressListResponse, IpAddressResponse, Label, LabelList, ModifyServerLabels,
    ModifyServerLabelsRequest, MoveFloatingIp, MoveFloatingIpRequest, ServerDetails,
};
use super::{Method, UpcloudProvider, label_key};
use crate::ratelimit::{LOOKUP_CAP, MAX_ANSWER};
use crate::{
    DeleteOutcome, EndpointIdentity, EndpointKind, EndpointObservation, EndpointRequest, ProviderError, ProviderId, ProviderResult,
};

/// A floating IP of a Cluster as found: its address and the server holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundFloatingIp {
    /// The IPv4 address (also its id in paths).
    pub address: String,
    /// The UUID of the server it is attached to.
    pub server: String,
    /// Its zone (it moves only within it).
    pub zone: String,
}

fn well_formed_uuid(s: &str) -> bool {
    s.len() == 36 && crate::ratelimit::well_formed(s, 36, |c| c.is_ascii_hexdigit() || c == '-')
}

/// The floating IPv4 address among `listed` attached to one of `servers` (pure; several: the
/// lowest address). Entries that are not floating, not IPv4, or not well formed are ignored.
pub fn pick(listed: &IpAddressListResponse, servers: &[String]) -> Vec<FoundFloatingIp> {
    let mut found: Vec<FoundFloatingIp> = listed
        .ip_addresses
        .ip_address
        .iter()
        .filter(|ip| ip.floating == "yes" && ip.family == "IPv4" && ip.address.len() <= 15)
        .filter(|ip| ip.address.parse::<std::net::Ipv4Addr>().is_ok())
        .filter(|ip| well_formed_uuid(&ip.server) && servers.contains(&ip.server))
        .map(|ip| FoundFloatingIp { address: ip.address.clone(), server: ip.server.clone(), zone: ip.zone.clone() })
        .collect();
    found.sort_by_key(|f| f.address.parse::<std::net::Ipv4Addr>().map(u32::from).unwrap_or(u32::MAX));
    found
}

/// The MAC of a server's public IPv4 interface (what a floating IP attaches to), if any.
pub fn public_mac(details: &ServerDetails) -> Option<String> {
    details
        .networking
        .interfaces
        .interface
        .iter()
        .filter(|i| i.kind == "public" && i.mac.len() == 17)
        .find(|i| i.ip_addresses.ip_address.iter().any(|a| a.family == "IPv4" && a.floating != "yes"))
        .map(|i| i.mac.clone())
}

/// The request that creates a floating IP attached to interface `mac` (pure).
pub fn assign_body(mac: &str) -> AssignFloatingIpRequest {
    AssignFloatingIpRequest {
        ip_address: AssignFloatingIp {
            family: "IPv4".into(),
            floating: "yes".into(),
            mac: mac.to_string(),
            release_policy: "release".into(),
        },
    }
}

fn serialise<T: serde::Serialize>(what: &str, body: &T) -> ProviderResult<String> {
    serde_json::to_string(body).map_err(|e| ProviderError::Permanent(format!("cannot serialise the {what}: {e}")))
}

fn observe(found: &FoundFloatingIp, port: u16) -> EndpointObservation {
    EndpointObservation {
        kind: EndpointKind::FloatingIp,
        id: found.address.clone(),
        address: found.address.clone(),
        port,
        targets: vec![ProviderId::new("upcloud", &found.server)],
    }
}

impl UpcloudProvider {
    /// The Cluster's floating IP (see the module), if any.
    pub(super) async fn find_floating_ip(&self, identity: &EndpointIdentity) -> ProviderResult<Option<FoundFloatingIp>> {
        let tags = [(crate::tags::CLUSTER_UID.to_string(), identity.cluster_uid.clone())];
        let servers: Vec<String> = self.list(&tags, MAX_ANSWER).await?.into_iter().map(|s| s.uuid).collect();
        if servers.is_empty() {
            return Ok(None);
        }
        let (_, body) = self.call_retrying(|| Method::Get, "/ip_address", &[], None, MAX_ANSWER).await?;
        let listed: IpAddressListResponse = Self::parse("IP address list", &body)?;
        drop(body);
        let found = pick(&listed, &servers);
        if found.len() > 1 {
            tracing::warn!(account = %self.account, uid = %identity.cluster_uid, count = found.len(), "several floating IPs on one Cluster's servers");
        }
        Ok(found.into_iter().next())
    }

    /// Labels server `uuid` with the Cluster's uid (its other labels kept) unless it has it,
    /// and returns the MAC of its public interface. `zone`: the floating IP's, when it exists
    /// (a new one is made in its holder's zone).
    async fn claim(&self, uuid: &str, identity: &EndpointIdentity, zone: Option<&str>) -> ProviderResult<String> {
        let details = self.details(uuid).await?.ok_or_else(|| ProviderError::NotFound(format!("UpCloud server {uuid}")))?;
        if let Some(zone) = zone.filter(|z| !z.is_empty() && !details.zone.is_empty() && details.zone != *z) {
            return Err(ProviderError::InvalidRequest(format!(
                "server {uuid} is in zone {}, the floating IP in {zone}: a floating IP moves only within its zone",
                details.zone
            )));
        }
        let mac = public_mac(&details).ok_or_else(|| {
            ProviderError::InvalidRequest(format!(
                "server {uuid} has no public IPv4 interface for the floating IP (a Server with publicIp: false cannot hold one)"
            ))
        })?;
        let key = label_key(crate::tags::CLUSTER_UID);
        if !details.labels.label.iter().any(|l| l.key == key && l.value == identity.cluster_uid) {
            let mut labels: Vec<Label> = details.labels.label.into_iter().filter(|l| l.key != key).collect();
            labels.push(Label { key, value: identity.cluster_uid.clone() });
            let body = serialise(
                "label change",
                &ModifyServerLabelsRequest { server: ModifyServerLabels { labels: LabelList { label: labels } } },
            )?;
            self.call_retrying(|| Method::Put, &format!("/server/{uuid}"), &[], Some(&body), LOOKUP_CAP).await?;
        }
        Ok(mac)
    }

    pub(super) async fn ensure_floating_ip(&self, request: &EndpointRequest) -> ProviderResult<EndpointObservation> {
        // The address is made in its holder's zone (the control-plane pool's zone may have
        // fallen back to another); the requested zone is only checked.
        if !request.zone.is_empty() && !super::ZONES.contains(&request.zone.as_str()) {
            return Err(ProviderError::InvalidRequest(format!(
                "zone {:?} is not an UpCloud zone ({})",
                request.zone,
                super::ZONES.join(", ")
            )));
        }
        for target in &request.targets {
            if !well_formed_uuid(target.native_id()) || !target.0.starts_with("upcloud://") {
                return Err(ProviderError::InvalidRequest(format!("{target} is not an UpCloud server")));
            }
        }
        // One ensure per Cluster at a time in this process (a second would not see the first's
        // address before it is created).
        let uid_lock = super::lock(&self.ensuring).entry(format!("endpoint/{}", request.identity.cluster_uid)).or_default().clone();
        let _guard = uid_lock.lock().await;
        let found = self.find_floating_ip(&request.identity).await?;
        let current = found.as_ref().map(|f| ProviderId::new("upcloud", &f.server));
        let Some(holder) = crate::floating_ip_holder(current.as_ref(), &request.targets) else {
            // No live holder: an existing address stays where it is; none is made detached.
            return match found {
                Some(f) => Ok(observe(&f, request.port)),
                None => Err(ProviderError::Transient("no live control-plane machine to attach the floating IP to yet".into())),
            };
        };
        let holder_uuid = holder.native_id().to_string();
        match found {
            Some(f) if f.server == holder_uuid => Ok(observe(&f, request.port)),
            Some(f) => {
                let mac = self.claim(&holder_uuid, &request.identity, Some(&f.zone)).await?;
                let body = serialise("move request", &MoveFloatingIpRequest { ip_address: MoveFloatingIp { mac } })?;
                let path = format!("/ip_address/{}", f.address);
                let (_, answer) = self.call_retrying(|| Method::Patch, &path, &[], Some(&body), LOOKUP_CAP).await?;
                let moved: IpAddressResponse = Self::parse("move floating IP", &answer)?;
                if moved.ip_address.server != holder_uuid {
                    return Err(ProviderError::Transient(format!("UpCloud moved floating IP {} elsewhere than asked", f.address)));
                }
                tracing::info!(account = %self.account, address = %f.address, from = %f.server, to = %holder_uuid, "moved floating IP");
                Ok(observe(&FoundFloatingIp { address: f.address, server: holder_uuid, zone: f.zone }, request.port))
            }
            None => {
                let mac = self.claim(&holder_uuid, &request.identity, None).await?;
                let body = serialise("floating IP request", &assign_body(&mac))?;
                // One attempt: after a lost answer the next pass finds it through the label.
                let (_, answer) =
                    self.guard.once("/ip_address", || self.call(Method::Post, "/ip_address", &[], Some(body.clone()), LOOKUP_CAP)).await?;
                let created: IpAddressResponse = Self::parse("create floating IP", &answer)?;
                let address = created.ip_address.address;
                if address.len() > 15 || address.parse::<std::net::Ipv4Addr>().is_err() {
                    return Err(ProviderError::Transient("UpCloud create floating IP: the answer holds no IPv4 address".into()));
                }
                tracing::info!(account = %self.account, uid = %request.identity.cluster_uid, address = %address, server = %holder_uuid, "created floating IP");
                let zone = created.ip_address.zone;
                Ok(observe(&FoundFloatingIp { address, server: holder_uuid, zone }, request.port))
            }
        }
    }

    pub(super) async fn delete_floating_ip(&self, identity: &EndpointIdentity) -> ProviderResult<DeleteOutcome> {
        let Some(found) = self.find_floating_ip(identity).await? else { return Ok(DeleteOutcome::Gone) };
        match self.call_retrying(|| Method::Delete, &format!("/ip_address/{}", found.address), &[], None, LOOKUP_CAP).await {
            Ok(_) | Err(ProviderError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        tracing::info!(account = %self.account, address = %found.address, "released floating IP");
        // Gone once no floating IP of this Cluster is found (a second one, if ever, next).
        Ok(if self.find_floating_ip(identity).await?.is_none() { DeleteOutcome::Gone } else { DeleteOutcome::InProgress })
    }

    pub(super) async fn find_floating_ip_endpoint(&self, identity: &EndpointIdentity) -> ProviderResult<Option<EndpointObservation>> {
        // The port is not stored at UpCloud: a floating IP reaches the API servers directly.
        Ok(self.find_floating_ip(identity).await?.map(|f| observe(&f, crate::DEFAULT_API_PORT)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_floating_ipv4_on_the_clusters_servers_only() {
        let listed: IpAddressListResponse = serde_json::from_value(serde_json::json!({"ip_addresses": {"ip_address": [
            {"access": "public", "address": "94.237.9.172", "family": "IPv4", "floating": "yes", "mac": "da:45:c4:5c:65:6c",
             "server": "0078c168-d578-4a64-95cf-07376f1dc524", "zone": "fi-hel2"},
            {"access": "public", "address": "94.237.12.73", "family": "IPv4", "mac": "da:45:c4:5c:65:6c",
             "server": "0078c168-d578-4a64-95cf-07376f1dc524", "zone": "fi-hel2"},
            {"access": "public", "address": "94.237.9.1", "family": "IPv4", "floating": "yes", "mac": "da:45:c4:5c:65:6d",
             "server": "00aaaaaa-d578-4a64-95cf-07376f1dc524", "zone": "fi-hel2"},
            {"access": "public", "address": "y.y.y.y", "family": "IPv4", "floating": "yes",
             "server": "0078c168-d578-4a64-95cf-07376f1dc524", "zone": "fi-hel2"},
            {"access": "public", "address": "94.237.9.2", "family": "IPv4", "floating": "yes", "zone": "nl-ams1"}
        ]}}))
        .expect("parses");
        let mine = vec!["0078c168-d578-4a64-95cf-07376f1dc524".to_string()];
        assert_eq!(
            pick(&listed, &mine),
            vec![FoundFloatingIp {
                address: "94.237.9.172".into(),
                server: "0078c168-d578-4a64-95cf-07376f1dc524".into(),
                zone: "fi-hel2".into()
            }],
            "the plan's own address, another account's server, a malformed and a detached address are not it"
        );
        assert!(pick(&listed, &[]).is_empty());
    }

    #[test]
    fn the_holders_public_ipv4_interface_carries_it() {
        let details: ServerDetails = serde_json::from_value(serde_json::json!({
            "uuid": "0078c168-d578-4a64-95cf-07376f1dc524", "state": "started",
            "networking": {"interfaces": {"interface": [
                {"type": "utility", "mac": "da:45:c4:5c:c5:4a", "ip_addresses": {"ip_address": [{"address": "10.6.6.200", "family": "IPv4", "floating": "no"}]}},
                {"type": "public", "mac": "da:45:c4:5c:58:52", "ip_addresses": {"ip_address": [{"address": "2a04::1", "family": "IPv6", "floating": "no"}]}},
                {"type": "public", "mac": "da:45:c4:5c:65:6c", "ip_addresses": {"ip_address": [{"address": "94.237.12.73", "family": "IPv4", "floating": "no"}]}}
            ]}}
        }))
        .expect("parses");
        assert_eq!(public_mac(&details).as_deref(), Some("da:45:c4:5c:65:6c"));
        let body = serde_json::to_value(assign_body("da:45:c4:5c:65:6c")).expect("serialises");
        assert_eq!(
            body,
            serde_json::json!({"ip_address": {"family": "IPv4", "floating": "yes", "mac": "da:45:c4:5c:65:6c", "release_policy": "release"}})
        );
    }
}
