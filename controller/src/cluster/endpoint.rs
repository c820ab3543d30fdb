//! The Cluster's control-plane endpoint (spec.controlPlaneEndpoint): a load balancer or a
//! floating IP at the provider, or a keepalived VIP on the control-plane servers.
//!
//! Each pass (before the plan, which holds the kubernetes service until the endpoint has an
//! address, see [`super::plan::EndpointGate`]) once a control-plane machine exists (so
//! nothing is billed before the machines are approved and made) the endpoint is ensured at
//! the provider — found
//! by the Cluster's uid tag, created when missing, never twice — with the live control-plane
//! machines as targets: a member replaced gets its new machine in, its old one out; a
//! floating IP moves off a machine that is gone. Only when what status records differs from
//! what is wanted is the provider asked (a settled Cluster makes no endpoint call). A type
//! changed away from LoadBalancer or FloatingIP deletes the old one; the Cluster's deletion
//! (finalizer) deletes both kinds, looked up by tag, so one whose creation status never
//! recorded is not left behind. A VIP is not a provider object: the template installs
//! keepalived and haproxy on the control-plane servers.

use kube::ResourceExt;
use provisioning_crds::{Cluster, ClusterSpec, ControlPlaneEndpointStatus, ENDPOINT_READY, EndpointType, LABEL_POOL};
use provisioning_providers::{
    DeleteOutcome, EndpointIdentity, EndpointKind, EndpointObservation, EndpointRequest, ProviderId, SharedProvider,
};

use super::plan::ChildServer;
use crate::conditions::{DesiredCondition, Status};
use crate::context::Context;
use crate::error::Error;

/// The control-plane pool when the kubernetes config does not name one (as [`super::stages`]).
const DEFAULT_CONTROL_PLANE_POOL: &str = "control-plane";

/// What one pass did with the endpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The endpoint as it is now (None: no managed endpoint).
    pub status: Option<ControlPlaneEndpointStatus>,
    /// The `EndpointReady` condition (None for type None, when the condition is dropped).
    pub condition: Option<DesiredCondition>,
    /// Look again soon (a call failed or the provider is still assigning the address).
    pub retry: bool,
    /// Nothing was created or deleted because the Cluster's plan is not approved yet (Manual
    /// approval): ensure again once it is.
    pub awaiting_approval: bool,
}

/// What the endpoint may change at the provider this pass: everything, or (under Manual
/// approval, before the Cluster's plan is approved) only what costs nothing new: an existing
/// endpoint is found and kept on the live control planes, none is created or deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changes {
    /// Automatic approval, or the plan is approved.
    Allowed,
    /// Manual approval and the plan is not approved yet.
    AwaitApproval,
}

fn awaiting(status: Option<ControlPlaneEndpointStatus>, what: String) -> Outcome {
    Outcome {
        status,
        condition: cond(Status::False, "AwaitingApproval", format!("{what} once the Cluster's plan is approved (status.plan)")),
        retry: false,
        awaiting_approval: true,
    }
}

/// The provider kind of a spec type (None for VIP and None).
pub fn kind_of(t: EndpointType) -> Option<EndpointKind> {
    match t {
        EndpointType::LoadBalancer => Some(EndpointKind::LoadBalancer),
        EndpointType::FloatingIp => Some(EndpointKind::FloatingIp),
        EndpointType::Vip | EndpointType::None => None,
    }
}

fn kind_of_status(t: &str) -> Option<EndpointKind> {
    match t {
        "LoadBalancer" => Some(EndpointKind::LoadBalancer),
        "FloatingIP" => Some(EndpointKind::FloatingIp),
        _ => None,
    }
}

/// The live control-plane machines (pure): members of the kubernetes service's
/// `controlPlanePool` (default `control-plane`) that are not being deleted and whose machine
/// is not failed, by name (the first runs `kubeadm init`: a floating IP goes there first).
pub fn targets(spec: &ClusterSpec, servers: &[ChildServer]) -> Vec<ProviderId> {
    let pool = spec
        .taskservs
        .iter()
        .find(|t| t.service == provisioning_crds::KUBERNETES_SERVICE)
        .and_then(|t| t.config.as_ref()?.get("controlPlanePool")?.as_str().map(str::to_string))
        .unwrap_or_else(|| DEFAULT_CONTROL_PLANE_POOL.to_string());
    let mut members: Vec<&ChildServer> = servers
        .iter()
        .filter(|s| s.owned && !s.deleting && !s.machine_failed)
        .filter(|s| pool.is_empty() || s.labels.get(LABEL_POOL) == Some(&pool))
        .filter(|s| s.provider_id.as_deref().is_some_and(|p| !p.is_empty()))
        .collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    members.into_iter().filter_map(|s| s.provider_id.clone()).map(ProviderId).collect()
}

fn identity(cluster: &Cluster, namespace: &str) -> EndpointIdentity {
    EndpointIdentity { cluster_uid: cluster.uid().unwrap_or_default(), namespace: namespace.to_string(), cluster: cluster.name_any() }
}

fn status_of(t: EndpointType, o: &EndpointObservation, cost: provisioning_crds::ServerCost) -> ControlPlaneEndpointStatus {
    let mut targets: Vec<String> = o.targets.iter().map(|t| t.0.clone()).collect();
    targets.sort();
    ControlPlaneEndpointStatus {
        endpoint_type: t.as_str().to_string(),
        address: o.address.clone(),
        port: o.port,
        id: o.id.clone(),
        targets,
        cost: Some(cost),
    }
}

fn cond(status: Status, reason: &str, message: impl Into<String>) -> Option<DesiredCondition> {
    Some(DesiredCondition::new(ENDPOINT_READY, status, reason, message))
}

/// Whether status already shows what is wanted (then the provider is not asked).
fn settled(recorded: Option<&ControlPlaneEndpointStatus>, t: EndpointType, port: u16, targets: &[ProviderId]) -> bool {
    let Some(r) = recorded else { return false };
    if r.endpoint_type != t.as_str()
        || r.port != port
        || r.address.is_empty()
        || !super::plan::endpoint_host_ok(&r.address)
        || r.id.is_empty()
        || r.cost.is_none()
    {
        return false;
    }
    match t {
        EndpointType::FloatingIp => match r.targets.as_slice() {
            [holder] => targets.iter().any(|t| &t.0 == holder),
            _ => targets.is_empty() && r.targets.is_empty(),
        },
        _ => {
            let mut want: Vec<&str> = targets.iter().map(|t| t.0.as_str()).collect();
            want.sort_unstable();
            r.targets.iter().map(String::as_str).eq(want)
        }
    }
}

/// The provider of the Cluster's account, with what [`Context::provider_call`] needs (each
/// call under the Workspace's parallelLimit, timed in the metrics, in the audit log).
struct Account {
    ws: crate::effective_workspace::EffectiveWorkspace,
    name: String,
    provider: SharedProvider,
}

async fn provider(cluster: &Cluster, namespace: &str, ctx: &Context) -> Result<Account, Error> {
    let ws = ctx.workspace_for(namespace);
    let account = ws.account(&cluster.spec.provider).map_err(|message| Error::Stalled { reason: "UnknownProvider", message })?.clone();
    let provider = ctx.provider_for(&ws, &account).await?;
    Ok(Account { ws, name: account.name, provider })
}

/// Ensures the endpoint the spec asks for (see the module). Never fails the pass: a failed
/// call is the condition's message and a retry.
pub async fn ensure(cluster: &Cluster, namespace: &str, servers: &[ChildServer], changes: Changes, ctx: &Context) -> Outcome {
    let recorded = cluster.status.as_ref().and_then(|s| s.control_plane_endpoint.clone());
    let want = cluster.spec.control_plane_endpoint.clone().unwrap_or_default();
    // Invalid specs are refused by validation (Stalled); nothing is created for them.
    if super::validate::control_plane_endpoint(&cluster.spec).is_err() {
        return Outcome { status: recorded, condition: None, ..Outcome::default() };
    }
    // A kind no longer wanted goes first (type changed, or set to None).
    let mut kept = recorded.clone();
    if let Some(old) = recorded.as_ref().and_then(|r| kind_of_status(&r.endpoint_type))
        && kind_of(want.endpoint_type) != Some(old)
    {
        if changes == Changes::AwaitApproval {
            return awaiting(recorded, format!("the old {} is deleted", old.noun()));
        }
        let gone = match provider(cluster, namespace, ctx).await {
            Ok(a) => {
                let id = identity(cluster, namespace);
                ctx.provider_call(&a.ws, &a.provider, &a.name, "delete_endpoint", a.provider.delete_endpoint(old, &id)).await
            }
            Err(e) => Err(e),
        };
        match gone {
            Ok(DeleteOutcome::Gone) => kept = None,
            Ok(DeleteOutcome::InProgress) => {
                return Outcome {
                    status: recorded,
                    condition: cond(Status::False, "Deleting", format!("deleting the old {}", old.noun())),
                    retry: true,
                    awaiting_approval: false,
                };
            }
            Err(e) => {
                return Outcome {
                    status: recorded,
                    condition: cond(Status::False, "Failed", format!("deleting the old {}: {e}", old.noun())),
                    retry: true,
                    awaiting_approval: false,
                };
            }
        }
    }
    match want.endpoint_type {
        EndpointType::None => Outcome { status: None, condition: None, retry: false, awaiting_approval: false },
        EndpointType::Vip => Outcome {
            status: Some(ControlPlaneEndpointStatus {
                endpoint_type: want.endpoint_type.as_str().into(),
                address: want.address.clone(),
                port: want.port,
                id: String::new(),
                targets: Vec::new(),
                cost: None,
            }),
            condition: cond(
                Status::True,
                "VirtualIP",
                format!("{}:{} held by keepalived on the control-plane servers (haproxy to their API servers)", want.address, want.port),
            ),
            retry: false,
            awaiting_approval: false,
        },
        t @ (EndpointType::LoadBalancer | EndpointType::FloatingIp) => {
            ensure_at_provider(cluster, namespace, servers, (t, want.port), kept, changes, ctx).await
        }
    }
}

async fn ensure_at_provider(
    cluster: &Cluster,
    namespace: &str,
    servers: &[ChildServer],
    (t, port): (EndpointType, u16),
    recorded: Option<ControlPlaneEndpointStatus>,
    changes: Changes,
    ctx: &Context,
) -> Outcome {
    let Some(kind) = kind_of(t) else { return Outcome::default() };
    let targets = targets(&cluster.spec, servers);
    // Made with its first target, not before: nothing is billed for a Cluster whose machines
    // are not made yet (under Manual approval: not approved yet).
    if recorded.is_none() && targets.is_empty() {
        return Outcome {
            status: None,
            condition: cond(Status::False, "Waiting", format!("the {} is made once a control-plane machine exists", kind.noun())),
            retry: false,
            awaiting_approval: false,
        };
    }
    let status = if settled(recorded.as_ref(), t, port, &targets) {
        recorded.clone()
    } else {
        let a = match provider(cluster, namespace, ctx).await {
            Ok(a) => a,
            Err(e) => {
                return Outcome {
                    status: recorded,
                    condition: cond(Status::False, "Failed", e.to_string()),
                    retry: true,
                    awaiting_approval: false,
                };
            }
        };
        if let Err(why) = a.provider.supports_endpoint(kind) {
            return Outcome {
                status: recorded,
                condition: cond(
                    Status::False,
                    "Unsupported",
                    format!("{why}: set spec.controlPlaneEndpoint.type to another type (VIP works on every provider)"),
                ),
                retry: false,
                awaiting_approval: false,
            };
        }
        let request =
            EndpointRequest { identity: identity(cluster, namespace), kind, port, zone: zone_of(&cluster.spec), targets: targets.clone() };
        // Before approval only an endpoint that exists is kept up to date; none is made.
        if changes == Changes::AwaitApproval {
            let found =
                ctx.provider_call(&a.ws, &a.provider, &a.name, "find_endpoint", a.provider.find_endpoint(kind, &request.identity)).await;
            match found {
                Ok(Some(_)) => {}
                Ok(None) => return awaiting(recorded, format!("the {} is created", kind.noun())),
                Err(e) => {
                    return Outcome {
                        status: recorded,
                        condition: cond(Status::False, "Failed", format!("looking up the {}: {e}", kind.noun())),
                        retry: true,
                        awaiting_approval: false,
                    };
                }
            }
        }
        match ctx.provider_call(&a.ws, &a.provider, &a.name, "ensure_endpoint", a.provider.ensure_endpoint(&request)).await {
            Ok(o) if !o.address.is_empty() && !super::plan::endpoint_host_ok(&o.address) => {
                // A cloud API's answer is outside input: never written to status (and so never
                // into kubeadm's config or the kubeconfig) unless it is a host.
                tracing::warn!(cluster = %cluster.name_any(), namespace, id = %o.id, kind = kind.noun(), "the provider answered an endpoint address that is not an IP address or DNS name");
                return Outcome {
                    status: recorded,
                    condition: cond(
                        Status::False,
                        "Failed",
                        format!("the provider answered an address for the {} that is not an IP address or DNS name", kind.noun()),
                    ),
                    retry: true,
                    awaiting_approval: false,
                };
            }
            Ok(o) => {
                if recorded.as_ref().is_none_or(|r| r.id != o.id) {
                    tracing::info!(cluster = %cluster.name_any(), namespace, id = %o.id, address = %o.address, kind = kind.noun(), "control-plane endpoint created");
                }
                Some(status_of(t, &o, crate::cost::server_cost(&a.provider.endpoint_price(kind, &request.zone))))
            }
            Err(e) => {
                return Outcome {
                    status: recorded,
                    condition: cond(Status::False, "Failed", format!("ensuring the {}: {e}", kind.noun())),
                    retry: true,
                    awaiting_approval: false,
                };
            }
        }
    };
    let Some(s) = status else { return Outcome::default() };
    let at = format!("{}:{}", s.address, s.port);
    let condition = if s.address.is_empty() {
        cond(Status::False, "Waiting", format!("the provider is assigning the {}'s address", kind.noun()))
    } else if s.targets.is_empty() {
        cond(Status::False, "NoTargets", format!("{} {at}: no live control-plane machine to point at yet", kind.noun()))
    } else {
        let n = s.targets.len();
        cond(Status::True, "Created", format!("{} {at} → {}", kind.noun(), crate::text::count(n, "control-plane machine")))
    };
    let retry = s.address.is_empty();
    Outcome { status: Some(s), condition, retry, awaiting_approval: false }
}

/// The zone the endpoint is made in: the control-plane pool's, else the account's.
fn zone_of(spec: &ClusterSpec) -> String {
    spec.pools.iter().find(|p| p.name == DEFAULT_CONTROL_PLANE_POOL).map(|p| p.zone.clone()).unwrap_or_default()
}

/// Deletes the Cluster's endpoints at the provider (both kinds, found by tag). `true` once
/// nothing is left.
pub async fn delete(cluster: &Cluster, namespace: &str, ctx: &Context) -> Result<bool, Error> {
    let recorded = cluster.status.as_ref().and_then(|s| s.control_plane_endpoint.as_ref()).and_then(|r| kind_of_status(&r.endpoint_type));
    let wanted = cluster.spec.control_plane_endpoint.as_ref().and_then(|e| kind_of(e.endpoint_type));
    if recorded.is_none() && wanted.is_none() {
        return Ok(true);
    }
    let a = provider(cluster, namespace, ctx).await?;
    let id = identity(cluster, namespace);
    let mut gone = true;
    for kind in [EndpointKind::LoadBalancer, EndpointKind::FloatingIp] {
        if a.provider.supports_endpoint(kind).is_err() {
            continue;
        }
        match ctx.provider_call(&a.ws, &a.provider, &a.name, "delete_endpoint", a.provider.delete_endpoint(kind, &id)).await? {
            DeleteOutcome::Gone => {}
            DeleteOutcome::InProgress => gone = false,
        }
    }
    if gone {
        tracing::info!(cluster = %cluster.name_any(), namespace, "control-plane endpoint deleted");
    }
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, pool: &str, id: Option<&str>) -> ChildServer {
        ChildServer {
            name: name.into(),
            labels: [(LABEL_POOL.to_string(), pool.to_string())].into(),
            spec: Default::default(),
            owned: true,
            ready: true,
            stalled: None,
            deleting: false,
            machine_failed: false,
            pending_since: None,
            pending_plan: None,
            provider_id: id.map(str::to_string),
            observed_current: true,
            approve: None,
        }
    }

    #[test]
    fn targets_are_the_live_control_plane_machines_by_name() {
        let spec: ClusterSpec = serde_json::from_value(serde_json::json!({
            "pools": [{"name": "control-plane", "replicas": 3}, {"name": "workers", "replicas": 1}],
            "taskservs": [{"service": "kubernetes"}]
        }))
        .unwrap_or_default();
        let mut failed = server("k-control-plane-2", "control-plane", Some("sim://c"));
        failed.machine_failed = true;
        let servers = vec![
            server("k-control-plane-1", "control-plane", Some("sim://b")),
            server("k-control-plane-0", "control-plane", Some("sim://a")),
            failed,
            server("k-workers-0", "workers", Some("sim://w")),
            server("k-control-plane-3", "control-plane", None),
        ];
        assert_eq!(targets(&spec, &servers), vec![ProviderId("sim://a".into()), ProviderId("sim://b".into())]);
    }

    #[test]
    fn status_is_settled_only_when_it_shows_what_is_wanted() {
        let ids = |v: &[&str]| v.iter().map(|s| ProviderId((*s).to_string())).collect::<Vec<_>>();
        let lb = ControlPlaneEndpointStatus {
            endpoint_type: "LoadBalancer".into(),
            address: "lb.example".into(),
            port: 6443,
            id: "lb-1".into(),
            targets: vec!["sim://a".into(), "sim://b".into()],
            cost: Some(Default::default()),
        };
        assert!(settled(Some(&lb), EndpointType::LoadBalancer, 6443, &ids(&["sim://b", "sim://a"])));
        assert!(!settled(Some(&lb), EndpointType::LoadBalancer, 6443, &ids(&["sim://b", "sim://c"])), "a replaced member re-targets");
        assert!(!settled(Some(&lb), EndpointType::LoadBalancer, 443, &ids(&["sim://a", "sim://b"])), "a new port");
        assert!(!settled(Some(&lb), EndpointType::FloatingIp, 6443, &ids(&["sim://a"])), "another type");
        assert!(!settled(None, EndpointType::LoadBalancer, 6443, &[]));
        let fip = ControlPlaneEndpointStatus { endpoint_type: "FloatingIP".into(), targets: vec!["sim://b".into()], ..lb };
        assert!(settled(Some(&fip), EndpointType::FloatingIp, 6443, &ids(&["sim://a", "sim://b"])), "the holder stays while it lives");
        assert!(!settled(Some(&fip), EndpointType::FloatingIp, 6443, &ids(&["sim://a"])), "the holder is gone: move it");
        let forged = ControlPlaneEndpointStatus { address: "evil.example/x?".into(), ..fip.clone() };
        assert!(
            !settled(Some(&forged), EndpointType::FloatingIp, 6443, &ids(&["sim://b"])),
            "an address that is no host is asked for again"
        );
    }

    #[test]
    fn only_a_host_is_a_usable_endpoint_address() {
        use super::super::plan::{EndpointGate, endpoint_host_ok};
        for ok in ["203.0.113.7", "2001:db8::1", "lb-1.elb.eu-north-1.amazonaws.com", "lb.example.", "k8s"] {
            assert!(endpoint_host_ok(ok), "{ok}");
        }
        let long = format!("{}.example", "a".repeat(64));
        for bad in [
            "",
            "999.1.1.1",
            "1.2.3",
            "evil.example/x",
            "user@evil.example",
            "https://evil.example",
            "evil.example:1",
            "a b",
            "-lb.example",
            "lb-.example",
            "lb..example",
            "\"lb\"",
            long.as_str(),
            "[2001:db8::1]",
        ] {
            assert!(!endpoint_host_ok(bad), "{bad:?}");
        }
        // The gate never hands a forged status address to kubeadm or the kubeconfig.
        let spec: ClusterSpec = serde_json::from_value(serde_json::json!({
            "pools": [{"name": "control-plane", "replicas": 1}],
            "taskservs": [{"service": "kubernetes"}],
            "controlPlaneEndpoint": {"type": "LoadBalancer", "port": 6443}
        }))
        .unwrap_or_default();
        let status = |address: &str| ControlPlaneEndpointStatus {
            endpoint_type: "LoadBalancer".into(),
            address: address.into(),
            port: 6443,
            id: "lb-1".into(),
            targets: vec!["sim://a".into()],
            cost: Some(Default::default()),
        };
        assert_eq!(EndpointGate::of(&spec, Some(&status("203.0.113.7"))), EndpointGate::At("203.0.113.7:6443".into()));
        assert_eq!(
            EndpointGate::of(&spec, Some(&status("2001:db8::1"))),
            EndpointGate::At("[2001:db8::1]:6443".into()),
            "IPv6 in brackets"
        );
        assert!(
            matches!(EndpointGate::of(&spec, Some(&status("x\n- --token y"))), EndpointGate::Waiting(m) if m.contains("not an IP address or DNS name"))
        );
    }
}
