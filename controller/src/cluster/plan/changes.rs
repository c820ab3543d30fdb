//! The Cluster's `status.plan` (pure): what applying its spec would still change, as one
//! list over its children — Servers to create, update or delete per pool, TaskServs to add,
//! change or remove — plus what each member's own plan would do: a Server's to its machine
//! (an Update or Replace a pool's plan or image change causes), a TaskServ's per server
//! (install, upgrade, re-install, remove). Its id therefore covers everything the members
//! would do, which is what approving the Cluster approves ([`crate::cluster::approval`]).
//! Config values are never shown (they may hold secrets): a config change names the field only.

use provisioning_crds::{ChangeAction, EndpointType, LABEL_POOL, Plan, PlannedChange, Server};
use provisioning_providers::prices::{self, NoPrice, Price};

use super::model::{Observed, desired_taskserv, desired_with_surge};
use crate::cluster::validate::ServicePlan;
use crate::server::plan::{plan_id, summary};

/// The Cluster's plan against its observed children.
pub fn cluster_plan(o: &Observed<'_>, namespace: &str, services: &[ServicePlan]) -> Plan {
    let desired = desired_with_surge(o);
    let mut changes = server_changes(o, namespace, &desired);
    changes.extend(taskserv_changes(o, namespace, services, &desired));
    let who = format!("Cluster/{namespace}/{}", o.name);
    Plan {
        id: plan_id(&who, o.generation, None, &changes),
        summary: summary(&changes),
        changes,
        generation: o.generation,
        ..Default::default()
    }
}

/// The Cluster's plan with its control-plane endpoint at the provider (pure): a Create of
/// `spec.controlPlaneEndpoint` when the spec wants a load balancer or floating IP that status
/// does not show yet (its monthly list price `price` in `to`), a Delete when status shows one
/// the spec no longer wants. The plan's `monthlyCostDelta` is the endpoint's (the created one's
/// price less the deleted one's recorded cost) when nothing else in the plan is billed (only
/// TaskServ changes besides); otherwise, or when a price is unknown, it stays empty (unknown).
pub fn with_endpoint(plan: Plan, o: &Observed<'_>, namespace: &str, price: Option<&Result<Price, NoPrice>>) -> Plan {
    let at_provider = |t: &str| matches!(t, "LoadBalancer" | "FloatingIP");
    let wanted = o.spec.control_plane_endpoint.as_ref().map(|e| e.endpoint_type).filter(|t| at_provider(t.as_str()));
    let recorded = o.status.control_plane_endpoint.as_ref().filter(|r| !r.id.is_empty() && at_provider(&r.endpoint_type));
    let resource = format!("Cluster/{namespace}/{}", o.name);
    let mut endpoint_changes = Vec::new();
    // (micro-units, currency): added by the create, taken off by the delete; None: unknown.
    let mut added: Option<(u64, &str)> = Some((0, ""));
    let mut removed: Option<(u64, &str)> = Some((0, ""));
    if let Some(r) = recorded.filter(|r| wanted.map(EndpointType::as_str) != Some(r.endpoint_type.as_str())) {
        endpoint_changes.push(change(
            resource.clone(),
            "spec.controlPlaneEndpoint",
            ChangeAction::Delete,
            r.endpoint_type.clone(),
            String::new(),
        ));
        removed = r.cost.as_ref().and_then(crate::cost::amounts).map(|(currency, _, monthly)| (monthly, currency));
    }
    if let Some(t) = wanted.filter(|t| recorded.is_none_or(|r| r.endpoint_type != t.as_str())) {
        let (to, cost) = match price {
            Some(Ok(p)) => {
                (format!("{} ({}/mo)", t.as_str(), prices::display(p.currency, p.monthly_micros)), Some((p.monthly_micros, p.currency)))
            }
            Some(Err(why)) => (format!("{} (cost unknown: {why})", t.as_str()), None),
            None => (format!("{} (cost unknown)", t.as_str()), None),
        };
        let mut c = change(resource.clone(), "spec.controlPlaneEndpoint", ChangeAction::Create, String::new(), to);
        c.reason = format!(
            "a {} at the provider, billed while the Cluster exists",
            if t == EndpointType::LoadBalancer { "load balancer" } else { "floating IP" }
        );
        endpoint_changes.push(c);
        added = cost;
    }
    if endpoint_changes.is_empty() {
        return plan;
    }
    let only_endpoint = plan.changes.iter().all(|c| c.action == ChangeAction::NoOp || c.resource.starts_with("TaskServ/"));
    let mut changes = plan.changes;
    changes.extend(endpoint_changes);
    let delta = match (added, removed) {
        (Some((plus, a)), Some((minus, b))) if only_endpoint && (a.is_empty() || b.is_empty() || a == b) => {
            let currency = if a.is_empty() { b } else { a };
            let text = match plus.cmp(&minus) {
                std::cmp::Ordering::Greater => format!("+{}", prices::format_cents(plus - minus)),
                std::cmp::Ordering::Less => format!("-{}", prices::format_cents(minus - plus)),
                std::cmp::Ordering::Equal => "0.00".to_string(),
            };
            Some((text, currency.to_string())).filter(|_| !currency.is_empty())
        }
        _ => None,
    };
    let (monthly_cost_delta, currency) = delta.unwrap_or_default();
    Plan { id: plan_id(&resource, o.generation, None, &changes), summary: summary(&changes), changes, monthly_cost_delta, currency, ..plan }
}

/// How a plan shows a spec value left to its default (a TaskServ's version: the catalog's).
pub const DEFAULT_SHOWN: &str = "(default)";

fn change(resource: String, field: &str, action: ChangeAction, from: String, to: String) -> PlannedChange {
    PlannedChange { resource, field: field.to_string(), action, from, to, reason: String::new() }
}

/// Pool members to create, change (and what their machines go through) or delete.
fn server_changes(o: &Observed<'_>, namespace: &str, desired: &[Server]) -> Vec<PlannedChange> {
    let mut changes = Vec::new();
    for server in desired {
        let name = server.metadata.name.clone().unwrap_or_default();
        let resource = format!("Server/{namespace}/{name}");
        let pool = server.metadata.labels.as_ref().and_then(|l| l.get(LABEL_POOL)).cloned().unwrap_or_default();
        match o.servers.iter().find(|c| c.name == name) {
            None => {
                let mut c = change(
                    resource,
                    "",
                    ChangeAction::Create,
                    String::new(),
                    format!("pool {pool}, plan {}", or_default(&server.spec.plan)),
                );
                if server.metadata.labels.as_ref().is_some_and(|l| l.contains_key(super::model::LABEL_SURGE)) {
                    c.reason = super::model::SURGE_REASON.to_string();
                }
                changes.push(c);
            }
            Some(child) => {
                // A member whose machine died is replaced by the Cluster (deleted, made anew).
                if let Some(why) = super::model::remediation(o, child) {
                    let mut c =
                        change(resource.clone(), "", ChangeAction::Replace, format!("machine {why}"), "a new Server and machine".into());
                    c.reason = format!("the machine {why}: the Cluster replaces the member");
                    changes.push(c);
                }
                for (field, from, to) in [
                    ("spec.plan", &child.spec.plan, &server.spec.plan),
                    ("spec.zone", &child.spec.zone, &server.spec.zone),
                    ("spec.image", &child.spec.image, &server.spec.image),
                ] {
                    if from != to {
                        changes.push(change(resource.clone(), field, ChangeAction::Update, or_default(from), or_default(to)));
                    }
                }
                // What the member's machine still has to go through (its own plan).
                if let Some(pending) = child.pending_plan.as_ref().filter(|p| p.has_changes()) {
                    changes.extend(pending.changes.iter().filter(|c| c.action != ChangeAction::NoOp).cloned());
                }
            }
        }
    }
    for child in o.servers.iter().filter(|c| c.owned && !c.deleting) {
        if !desired.iter().any(|d| d.metadata.name.as_deref() == Some(child.name.as_str())) {
            changes.push(change(format!("Server/{namespace}/{}", child.name), "", ChangeAction::Delete, String::new(), String::new()));
        }
    }
    changes
}

/// TaskServs to add, change (version, config by name only, servers) or remove.
fn taskserv_changes(o: &Observed<'_>, namespace: &str, services: &[ServicePlan], desired: &[Server]) -> Vec<PlannedChange> {
    let mut changes = Vec::new();
    for service in services {
        let ts = desired_taskserv(o, service, desired);
        let name = ts.metadata.name.clone().unwrap_or_default();
        let resource = format!("TaskServ/{namespace}/{name}");
        match o.taskservs.iter().find(|c| c.name == name) {
            None => changes.push(change(
                resource,
                "",
                ChangeAction::Create,
                String::new(),
                format!("{} on {}", service.service, crate::text::count(ts.spec.servers.names.len(), "server")),
            )),
            Some(child) => {
                if child.spec.version != ts.spec.version {
                    changes.push(change(
                        resource.clone(),
                        "spec.version",
                        ChangeAction::Update,
                        or_default(&child.spec.version),
                        or_default(&ts.spec.version),
                    ));
                }
                if child.spec.config != ts.spec.config || child.spec.config_from != ts.spec.config_from {
                    changes.push(change(resource.clone(), "spec.config", ChangeAction::Update, String::new(), String::new()));
                }
                let (mut have, mut want) = (child.spec.servers.names.clone(), ts.spec.servers.names.clone());
                have.sort();
                want.sort();
                if have != want {
                    changes.push(change(
                        resource,
                        "spec.servers",
                        ChangeAction::Update,
                        crate::text::count(have.len(), "server"),
                        crate::text::count(want.len(), "server"),
                    ));
                }
                // What the member's scripts still have to do (its own plan), so the Cluster's
                // plan id covers it too.
                if let Some(pending) = child.pending_plan.as_ref().filter(|p| p.has_changes()) {
                    changes.extend(pending.changes.iter().filter(|c| c.action != ChangeAction::NoOp).cloned());
                }
            }
        }
    }
    for child in o.taskservs.iter().filter(|c| c.owned && !c.deleting) {
        let wanted = services.iter().any(|s| super::model::taskserv_name(o.name, &s.service) == child.name);
        if !wanted {
            changes.push(change(format!("TaskServ/{namespace}/{}", child.name), "", ChangeAction::Delete, String::new(), String::new()));
        }
    }
    changes
}

fn or_default(value: &str) -> String {
    if value.is_empty() { DEFAULT_SHOWN.into() } else { value.to_string() }
}
