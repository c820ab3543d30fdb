//! Validate (pure): a Cluster's services against the catalog, and their dependency closure in
//! install order. Services the listed ones require but the spec leaves out are added, on the
//! pools of the services that need them, at their default version.

use std::collections::{BTreeMap, BTreeSet};

use provisioning_crds::{ClusterSpec, ConfigFromSource, DEFAULT_API_PORT, EndpointType};
use provisioning_taskservs::{Catalog, ResolveError, ValidationError};
use serde_json::Value;

/// One service of the rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct ServicePlan {
    /// Catalog name.
    pub service: String,
    /// Pools whose servers get it (every pool when the spec names none).
    pub pools: Vec<String>,
    /// Version as written ("" = catalog default).
    pub version: String,
    /// Config as written.
    pub config: Option<Value>,
    /// `configFrom` as written (resolved by the TaskServ, never here).
    pub config_from: Vec<ConfigFromSource>,
    /// Services of the rollout this one waits for (hard `requires` and soft `after`).
    pub after: Vec<String>,
    /// Listed in the spec (false: brought in as a dependency).
    pub explicit: bool,
}

/// Why a Cluster spec is refused (`Stalled` with this reason and message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidCluster {
    /// CamelCase reason.
    pub reason: &'static str,
    /// For humans: names the service, version, field or cycle.
    pub message: String,
}

fn invalid(reason: &'static str, message: impl Into<String>) -> InvalidCluster {
    InvalidCluster { reason, message: message.into() }
}

/// The pools' own checks (pure): names declared once, `zone` or `zones` (each zone once),
/// rollouts that can make progress and whose surge Servers no other pool's names take.
/// Returns the pool names.
fn pools(name: &str, spec: &ClusterSpec) -> Result<Vec<String>, InvalidCluster> {
    let pool_names: Vec<String> = spec.pools.iter().map(|p| p.name.clone()).collect();
    let mut seen_pools = BTreeSet::new();
    for p in &pool_names {
        if !seen_pools.insert(p) {
            return Err(invalid("DuplicatePool", format!("pool {p:?} is declared twice")));
        }
    }
    for p in &spec.pools {
        if !p.zones.is_empty() && !p.zone.is_empty() {
            return Err(invalid(
                "InvalidPool",
                format!("pool {:?}: set zone or zones (the zones its members are spread over), not both", p.name),
            ));
        }
        provisioning_crds::check_disks(&format!("spec.pools[{:?}].disks", p.name), &p.disks, None)
            .map_err(|e| invalid("InvalidPool", e))?;
        let mut seen_zones = BTreeSet::new();
        if let Some(twice) = p.zones.iter().find(|z| !seen_zones.insert(z.as_str())) {
            return Err(invalid("InvalidPool", format!("pool {:?}: zones lists {twice:?} twice", p.name)));
        }
    }
    for p in &spec.pools {
        let Some(r) = &p.rollout else { continue };
        if r.max_unavailable == 0 && r.max_surge == 0 {
            return Err(invalid(
                "InvalidRollout",
                format!("pool {:?}: rollout needs maxUnavailable or maxSurge above 0 (both 0 could never update a member)", p.name),
            ));
        }
        // Surge Servers are named <cluster>-<pool>-surge-<n>: a pool "<pool>-surge" would share them.
        let clash = format!("{}-surge", p.name);
        if r.max_surge > 0 && pool_names.contains(&clash) {
            return Err(invalid(
                "InvalidRollout",
                format!("pool {:?}: maxSurge names Servers {name}-{clash}-<n>, which pool {clash:?} uses; rename that pool", p.name),
            ));
        }
    }
    Ok(pool_names)
}

/// `spec.controlPlaneEndpoint` (pure; admission's CEL rules say the same for `address`):
/// only for a Cluster with the kubernetes service and not together with that service's own
/// `controlPlaneEndpoint`; a VIP needs an IPv4 `address` and a port other than the API
/// servers' 6443 (haproxy listens on it on the same machines); a FloatingIP forwards
/// nothing, so its port is 6443.
pub fn control_plane_endpoint(spec: &ClusterSpec) -> Result<(), InvalidCluster> {
    let Some(e) = &spec.control_plane_endpoint else { return Ok(()) };
    let field = "spec.controlPlaneEndpoint";
    if e.endpoint_type != EndpointType::Vip && !e.address.is_empty() {
        return Err(invalid(
            "InvalidEndpoint",
            format!("{field}.address is only for type VIP (the provider assigns the address of a {})", e.endpoint_type.as_str()),
        ));
    }
    if e.endpoint_type == EndpointType::None {
        return Ok(());
    }
    let k8s = spec.taskservs.iter().find(|t| t.service == provisioning_crds::KUBERNETES_SERVICE);
    let Some(k8s) = k8s else {
        return Err(invalid(
            "InvalidEndpoint",
            format!("{field}.type {} needs the kubernetes service in spec.taskservs", e.endpoint_type.as_str()),
        ));
    };
    if k8s.config.as_ref().and_then(|c| c.get("controlPlaneEndpoint")).and_then(Value::as_str).is_some_and(|v| !v.is_empty()) {
        return Err(invalid(
            "InvalidEndpoint",
            format!(
                "{field}.type {} and the kubernetes service's config.controlPlaneEndpoint are both set: keep one (the Cluster's is created and kept by the controller)",
                e.endpoint_type.as_str()
            ),
        ));
    }
    if e.port == 0 {
        return Err(invalid("InvalidEndpoint", format!("{field}.port must be 1-65535")));
    }
    match e.endpoint_type {
        EndpointType::Vip => {
            let ip: std::net::Ipv4Addr = e.address.parse().map_err(|_| {
                invalid(
                    "InvalidEndpoint",
                    format!(
                        "{field}.address {:?} is not an IPv4 address (type VIP needs a free address in the machines' subnet)",
                        e.address
                    ),
                )
            })?;
            if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast() {
                return Err(invalid(
                    "InvalidEndpoint",
                    format!("{field}.address {ip} cannot be a virtual IP (unspecified, loopback, multicast or broadcast)"),
                ));
            }
            if e.port == DEFAULT_API_PORT {
                return Err(invalid(
                    "InvalidEndpoint",
                    format!(
                        "{field}.port: a VIP's haproxy runs on the control-plane servers next to the API servers (port {DEFAULT_API_PORT}): choose another port, e.g. 8443"
                    ),
                ));
            }
        }
        EndpointType::FloatingIp if e.port != DEFAULT_API_PORT => {
            return Err(invalid(
                "InvalidEndpoint",
                format!(
                    "{field}.port: a FloatingIP reaches the API server directly, on port {DEFAULT_API_PORT}; set {DEFAULT_API_PORT} or use a LoadBalancer"
                ),
            ));
        }
        _ => {}
    }
    Ok(())
}

/// Validates the spec and returns the services in install order.
// Over 80 lines on purpose: one flat list of independent checks in the order users read the
// spec (pools, then services, versions, configs, dependencies), each returning its own reason.
pub fn validate(name: &str, spec: &ClusterSpec, catalog: &Catalog) -> Result<Vec<ServicePlan>, InvalidCluster> {
    let pool_names = pools(name, spec)?;
    control_plane_endpoint(spec)?;
    if spec.depends_on.iter().any(|d| d == name) {
        return Err(invalid("DependencyCycle", format!("Cluster {name} depends on itself")));
    }
    let mut listed: BTreeMap<String, ServicePlan> = BTreeMap::new();
    for (i, t) in spec.taskservs.iter().enumerate() {
        if listed.contains_key(&t.service) {
            return Err(invalid("DuplicateService", format!("taskservs[{i}]: service {:?} is listed twice", t.service)));
        }
        for p in &t.pools {
            if !pool_names.contains(p) {
                return Err(invalid("UnknownPool", format!("taskservs[{i}] ({}): pool {p:?} is not in spec.pools", t.service)));
            }
        }
        let version = if t.version.is_empty() { None } else { Some(t.version.as_str()) };
        // Partial: values from configFrom and generated secrets are added by the TaskServ.
        catalog.validate_partial_request(&t.service, version, t.config.as_ref().unwrap_or(&Value::Null)).map_err(|e| match e {
            ValidationError::UnknownService(s) => invalid("UnknownService", format!("unknown service {s:?}: not in the taskserv catalog")),
            e @ ValidationError::UnknownVersion { .. } => invalid("UnknownVersion", e.to_string()),
            e @ ValidationError::InvalidConfig { .. } => invalid("InvalidConfig", e.to_string()),
        })?;
        let pools = if t.pools.is_empty() { pool_names.clone() } else { t.pools.clone() };
        listed.insert(
            t.service.clone(),
            ServicePlan {
                service: t.service.clone(),
                pools,
                version: t.version.clone(),
                config: t.config.clone(),
                config_from: t.config_from.clone(),
                after: Vec::new(),
                explicit: true,
            },
        );
    }
    let wanted: Vec<String> = listed.keys().cloned().collect();
    let order = catalog.resolve(&wanted).map_err(|e| match e {
        ResolveError::Unknown(s) => invalid("UnknownService", format!("unknown service {s:?}: not in the taskserv catalog")),
        ResolveError::Cycle(c) => invalid("DependencyCycle", format!("dependency cycle: {c}")),
    })?;
    let in_plan: BTreeSet<&String> = order.iter().collect();
    // Dependencies go on the pools of everything that needs them: walk dependents first.
    let mut pools_of: BTreeMap<String, BTreeSet<String>> =
        listed.values().map(|s| (s.service.clone(), s.pools.iter().cloned().collect())).collect();
    for service in order.iter().rev() {
        let Some(entry) = catalog.get(service) else { continue };
        let mine = pools_of.get(service).cloned().unwrap_or_default();
        for dep in &entry.manifest.requires {
            pools_of.entry(dep.clone()).or_default().extend(mine.iter().cloned());
        }
    }
    let mut out = Vec::with_capacity(order.len());
    for service in &order {
        let manifest = catalog.get(service).map(|s| &s.manifest);
        let after: Vec<String> = manifest
            .map(|m| m.requires.iter().chain(m.after.iter()).filter(|d| in_plan.contains(d)).cloned().collect())
            .unwrap_or_default();
        let mut plan = listed.remove(service).unwrap_or_else(|| ServicePlan {
            service: service.clone(),
            pools: Vec::new(),
            version: String::new(),
            config: None,
            config_from: Vec::new(),
            after: Vec::new(),
            explicit: false,
        });
        if !plan.explicit {
            // Keep spec order of pools for readability.
            let wanted_pools = pools_of.get(service).cloned().unwrap_or_default();
            plan.pools = pool_names.iter().filter(|p| wanted_pools.contains(*p)).cloned().collect();
        }
        plan.after = after;
        out.push(plan);
    }
    Ok(out)
}
