//! Floating IPs of the double (API 1.3 "IP addresses"), as UpCloud's recorded traffic shows
//! them (upcloud-go-api's `attachmodifyreleasefloatingipaddress` and `getipaddresses`
//! cassettes):
//! - `GET /1.3/ip_address`: every address of the account — each server's own (access,
//!   address, family, mac, ptr_record, server, zone) and the floating ones (`floating: yes`;
//!   a detached one has no `mac` nor `server`);
//! - `POST /1.3/ip_address {"ip_address": {"family": "IPv4", "floating": "yes", "mac": …}}`:
//!   `201` with the new address attached to the interface of that MAC (or `zone` instead of
//!   `mac`: detached in that zone); `release_policy` `keep` (the default for floating IPs) or
//!   `release`;
//! - `GET /1.3/ip_address/{ip}`: `200` with one address;
//! - `PATCH /1.3/ip_address/{ip} {"ip_address": {"mac": … | null}}`: `202`, moved to that
//!   interface or detached (`null`); `ptr_record` and `release_policy` may change too;
//! - `DELETE /1.3/ip_address/{ip}`: `204`;
//! - a server deleted takes its floating IPs of policy `release` with it and leaves those of
//!   policy `keep` detached (API docs, "Release policy").
//!
//! Errors use codes of UpCloud's error-code list (upcloud-go-api `upcloud/error_codes.go`):
//! an address that does not exist is `404 IP_ADDRESS_NOT_FOUND`, a malformed one in a path
//! `400 IP_ADDRESS_INVALID`; a malformed MAC `400 MAC_INVALID`, a MAC no interface of the
//! account has `404 INTERFACE_NOT_FOUND`; a floating IP asked in one zone for a MAC in
//! another, or moved to a server of another zone, `409 FLOATING_IP_NOT_AVAILABLE` (floating
//! IPs move only within their zone); a non-IPv4 floating IP `400 FAMILY_INVALID`; a sixth
//! public address on one server `409 SERVER_IP_LIMIT_REACHED` (at most five). The statuses of
//! the errors no recording shows follow the API's convention (400 a bad attribute, 404 a
//! missing object, 409 a conflict with the current state): the API document's error table
//! for these calls was not available when this was written. Adding or removing a server's
//! own (non-floating) addresses is not served (`501`): the provider never does it.

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Value, json};

use super::{Server, error, reply};

/// A floating IP.
#[derive(Clone, Debug)]
pub(crate) struct FloatingIp {
    zone: String,
    /// The server and interface index (0-based) it is attached to.
    attached: Option<(String, usize)>,
    release_policy: String,
    ptr_record: String,
}

/// The floating IPs attached to server `uuid`: (address, interface index).
pub(crate) fn attached_to(floating: &BTreeMap<String, FloatingIp>, uuid: &str) -> Vec<(String, usize)> {
    floating.iter().filter_map(|(a, f)| f.attached.as_ref().filter(|(s, _)| s == uuid).map(|(_, i)| (a.clone(), *i))).collect()
}

/// Server `uuid` is deleted: its floating IPs of policy `release` go, the others are detached.
pub(crate) fn server_deleted(floating: &mut BTreeMap<String, FloatingIp>, uuid: &str) {
    floating.retain(|_, f| !(f.release_policy == "release" && f.attached.as_ref().is_some_and(|(s, _)| s == uuid)));
    for f in floating.values_mut() {
        if f.attached.as_ref().is_some_and(|(s, _)| s == uuid) {
            f.attached = None;
        }
    }
}

/// Every floating IP by address, with the UUID of the server holding it (None: detached).
pub(crate) fn holders(floating: &BTreeMap<String, FloatingIp>) -> BTreeMap<String, Option<String>> {
    floating.iter().map(|(a, f)| (a.clone(), f.attached.as_ref().map(|(s, _)| s.clone()))).collect()
}

fn ptr_of(address: &str, zone: &str) -> String {
    format!("{}.{zone}.upcloud.host", address.replace('.', "-"))
}

fn floating_json(address: &str, f: &FloatingIp, servers: &BTreeMap<String, Server>) -> Value {
    let mut v = json!({
        "access": "public", "address": address, "family": "IPv4", "floating": "yes",
        "ptr_record": f.ptr_record, "zone": f.zone,
    });
    if let Some((uuid, i)) = &f.attached
        && let Some(server) = servers.get(uuid)
    {
        v["mac"] = json!(server.mac(*i));
        v["server"] = json!(uuid);
    }
    v
}

/// The interface of MAC `mac`: (server uuid, interface index, zone, public IPv4 interface).
fn interface_of(servers: &BTreeMap<String, Server>, mac: &str) -> Option<(String, usize, String, bool)> {
    servers.values().find_map(|s| {
        (0..s.interfaces.len()).find(|i| s.mac(*i) == mac).map(|i| {
            let (kind, ips) = &s.interfaces[i];
            (s.uuid.clone(), i, s.zone.clone(), kind == "public" && ips.iter().any(|(_, f)| f == "IPv4"))
        })
    })
}

fn valid_mac(mac: &str) -> bool {
    mac.len() == 17 && mac.split(':').count() == 6 && mac.split(':').all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Public addresses on server `uuid`, its own and floating.
fn public_count(servers: &BTreeMap<String, Server>, floating: &BTreeMap<String, FloatingIp>, uuid: &str) -> usize {
    let own = servers.get(uuid).map_or(0, |s| s.interfaces.iter().filter(|(k, _)| k == "public").map(|(_, ips)| ips.len()).sum());
    own + attached_to(floating, uuid).len()
}

/// Where a MAC may take a floating IP of `zone`: its server and interface, or the error.
fn attach_target(
    servers: &BTreeMap<String, Server>,
    floating: &BTreeMap<String, FloatingIp>,
    mac: &str,
    zone: Option<&str>,
) -> Result<(String, usize, String), Response<Full<Bytes>>> {
    if !valid_mac(mac) {
        return Err(error(400, "MAC_INVALID", &format!("The MAC address {mac} is invalid.")));
    }
    let Some((uuid, i, server_zone, public_ipv4)) = interface_of(servers, mac) else {
        return Err(error(404, "INTERFACE_NOT_FOUND", &format!("No network interface has the MAC address {mac}.")));
    };
    if !public_ipv4 {
        return Err(error(409, "FLOATING_IP_NOT_AVAILABLE", "A floating IP attaches only to a public IPv4 interface."));
    }
    if zone.is_some_and(|z| z != server_zone) {
        return Err(error(409, "FLOATING_IP_NOT_AVAILABLE", &format!("The interface {mac} is not in zone {}.", zone.unwrap_or_default())));
    }
    if public_count(servers, floating, &uuid) >= 5 {
        return Err(error(409, "SERVER_IP_LIMIT_REACHED", &format!("The server {uuid} already has five public addresses.")));
    }
    Ok((uuid, i, server_zone))
}

/// `GET /1.3/ip_address`.
pub(crate) fn list(servers: &BTreeMap<String, Server>, floating: &BTreeMap<String, FloatingIp>) -> Response<Full<Bytes>> {
    let mut all: Vec<Value> = Vec::new();
    for s in servers.values() {
        for (i, (access, ips)) in s.interfaces.iter().enumerate() {
            for (address, family) in ips {
                let ptr = if access == "public" { ptr_of(address, &s.zone) } else { String::new() };
                all.push(json!({
                    "access": access, "address": address, "family": family, "mac": s.mac(i),
                    "ptr_record": ptr, "server": s.uuid, "zone": s.zone,
                }));
            }
        }
    }
    all.extend(floating.iter().map(|(a, f)| floating_json(a, f, servers)));
    reply(200, Some(json!({"ip_addresses": {"ip_address": all}})))
}

/// `GET /1.3/ip_address/{ip}`.
pub(crate) fn get(servers: &BTreeMap<String, Server>, floating: &BTreeMap<String, FloatingIp>, ip: &str) -> Response<Full<Bytes>> {
    if let Some(f) = floating.get(ip) {
        return reply(200, Some(json!({"ip_address": floating_json(ip, f, servers)})));
    }
    for s in servers.values() {
        for (i, (access, ips)) in s.interfaces.iter().enumerate() {
            if let Some((address, family)) = ips.iter().find(|(a, _)| a == ip) {
                let ptr = if access == "public" { ptr_of(address, &s.zone) } else { String::new() };
                return reply(
                    200,
                    Some(json!({"ip_address": {
                        "access": access, "address": address, "family": family, "mac": s.mac(i),
                        "ptr_record": ptr, "server": s.uuid, "zone": s.zone,
                    }})),
                );
            }
        }
    }
    not_found(ip)
}

fn not_found(ip: &str) -> Response<Full<Bytes>> {
    error(404, "IP_ADDRESS_NOT_FOUND", &format!("The IP address {ip} does not exist."))
}

const ASSIGN_ATTRIBUTES: [&str; 7] = ["access", "family", "floating", "mac", "release_policy", "server", "zone"];

/// `POST /1.3/ip_address`.
pub(crate) fn create(
    servers: &BTreeMap<String, Server>,
    floating: &mut BTreeMap<String, FloatingIp>,
    serial: &mut u32,
    body: &Value,
) -> Response<Full<Bytes>> {
    let Some(ip) = body.get("ip_address").and_then(Value::as_object) else {
        return error(400, "IP_ADDRESS_INVALID", "The request must contain an ip_address object.");
    };
    if let Some(unknown) = ip.keys().find(|k| !ASSIGN_ATTRIBUTES.contains(&k.as_str())) {
        return error(400, "UNKNOWN_ATTRIBUTE", &format!("The attribute {unknown} is unknown."));
    }
    let text = |k: &str| ip.get(k).and_then(Value::as_str);
    if text("floating") != Some("yes") {
        return error(501, "NOT_IMPLEMENTED", "The double serves floating addresses only.");
    }
    if text("family").unwrap_or("IPv4") != "IPv4" {
        return error(400, "FAMILY_INVALID", "A floating IP is an IPv4 address.");
    }
    let release_policy = text("release_policy").unwrap_or("keep");
    if !matches!(release_policy, "keep" | "release") {
        return error(400, "RELEASE_POLICY_INVALID", "The release_policy must be keep or release.");
    }
    let zone = text("zone");
    if let Some(z) = zone
        && !super::ZONES.contains(&z)
    {
        return error(404, "ZONE_NOT_FOUND", &format!("The zone {z} does not exist."));
    }
    let (attached, zone) = match text("mac") {
        Some(mac) => match attach_target(servers, floating, mac, zone) {
            Ok((uuid, i, server_zone)) => (Some((uuid, i)), server_zone),
            Err(response) => return response,
        },
        None => match zone {
            Some(z) => (None, z.to_string()),
            None => return error(400, "ZONE_MISSING", "A floating IP needs a mac or a zone."),
        },
    };
    *serial += 1;
    // 192.0.2.0/24 (documentation range): clearly fake, never routed, apart from the servers'.
    let address = format!("192.0.{}.{}", 2 + *serial / 250 % 50, *serial % 250 + 1);
    let f = FloatingIp { ptr_record: ptr_of(&address, &zone), zone, attached, release_policy: release_policy.to_string() };
    let answer = floating_json(&address, &f, servers);
    floating.insert(address, f);
    reply(201, Some(json!({"ip_address": answer})))
}

const MODIFY_ATTRIBUTES: [&str; 3] = ["mac", "ptr_record", "release_policy"];

/// `PATCH /1.3/ip_address/{ip}`.
pub(crate) fn modify(
    servers: &BTreeMap<String, Server>,
    floating: &mut BTreeMap<String, FloatingIp>,
    ip: &str,
    body: &Value,
) -> Response<Full<Bytes>> {
    let Some(change) = body.get("ip_address").and_then(Value::as_object) else {
        return error(400, "IP_ADDRESS_INVALID", "The request must contain an ip_address object.");
    };
    if let Some(unknown) = change.keys().find(|k| !MODIFY_ATTRIBUTES.contains(&k.as_str())) {
        return error(400, "UNKNOWN_ATTRIBUTE", &format!("The attribute {unknown} is unknown."));
    }
    let Some(zone) = floating.get(ip).map(|f| f.zone.clone()) else {
        return if get(servers, floating, ip).status() == 200 {
            error(501, "NOT_IMPLEMENTED", "The double changes floating addresses only.")
        } else {
            not_found(ip)
        };
    };
    let mut attached = floating.get(ip).and_then(|f| f.attached.clone());
    match change.get("mac") {
        None => {}
        Some(Value::Null) => attached = None,
        Some(Value::String(mac)) => {
            // Moving within the same server counts its own address once only.
            let others: BTreeMap<String, FloatingIp> =
                floating.iter().filter(|(a, _)| *a != ip).map(|(a, f)| (a.clone(), f.clone())).collect();
            match attach_target(servers, &others, mac, Some(&zone)) {
                Ok((uuid, i, _)) => attached = Some((uuid, i)),
                Err(response) => return response,
            }
        }
        Some(_) => return error(400, "MAC_INVALID", "The mac must be a string or null."),
    }
    let release_policy = match change.get("release_policy").map(|v| v.as_str()) {
        None => None,
        Some(Some(p @ ("keep" | "release"))) => Some(p.to_string()),
        Some(_) => return error(400, "RELEASE_POLICY_INVALID", "The release_policy must be keep or release."),
    };
    let ptr_record = match change.get("ptr_record").map(|v| v.as_str()) {
        None => None,
        Some(Some(p)) if p.len() <= 253 => Some(p.to_string()),
        Some(_) => return error(400, "PTR_RECORD_INVALID", "The ptr_record is invalid."),
    };
    let Some(f) = floating.get_mut(ip) else { return not_found(ip) };
    f.attached = attached;
    if let Some(p) = release_policy {
        f.release_policy = p;
    }
    if let Some(p) = ptr_record {
        f.ptr_record = p;
    }
    let answer = floating_json(ip, f, servers);
    reply(202, Some(json!({"ip_address": answer})))
}

/// `DELETE /1.3/ip_address/{ip}`.
pub(crate) fn delete(servers: &BTreeMap<String, Server>, floating: &mut BTreeMap<String, FloatingIp>, ip: &str) -> Response<Full<Bytes>> {
    if floating.remove(ip).is_some() {
        return reply(204, None);
    }
    if get(servers, floating, ip).status() == 200 {
        return error(501, "NOT_IMPLEMENTED", "The double releases floating addresses only.");
    }
    not_found(ip)
}
