//! Prepare: what a Server needs before any machine is touched — the account (validated,
//! pure), its provider, the spec validated against it, the workspace's maxServers limit,
//! the cost and the monthly budget, and the Server's own SSH key. A failure ends the visit
//! Stalled (or Failed) before any provider call that changes anything.

use provisioning_crds::{ServerCost, ServerStatus};
use provisioning_providers::SharedProvider;

use super::visit::{End, Visit};
use super::{budget, dereference, plan, ssh, validate};
use crate::context::Context;
use crate::error::{Error, Step};
use provisioning_crds::Server;

/// What validation and the gates before any action established.
pub struct Prepared {
    /// The account's provider.
    pub provider: SharedProvider,
    /// The spec, validated against the account.
    pub valid: validate::ValidServer,
    /// What the spec's machine costs.
    pub cost: ServerCost,
    /// The Server's own login key (`spec.sshKeySecretRef`), else the account's is used.
    pub login_key: Option<String>,
}

impl Prepared {
    /// The Server's plan against `observed` (None: before any machine), from the provider's
    /// capabilities and price table (no API call).
    pub fn plan(&self, server: &Server, observed: Option<&ServerStatus>) -> plan::ServerPlan {
        let provider = &self.provider;
        plan::spec_plan(
            server,
            &self.valid,
            observed,
            |f| provider.in_place(f),
            |a, b| provider.same_plan(a, b),
            |p, z| crate::cost::machine_price(provider.as_ref(), p, z, &self.valid.disks),
        )
    }

    /// The cost of the machine as `observed` (its native plan may differ from the spec's).
    pub fn machine_cost(&self, observed: &ServerStatus) -> ServerCost {
        match observed.resolved_plan.as_deref() {
            Some(plan) if plan != self.valid.resolved_plan => {
                let disks = observed.disks.as_deref().unwrap_or_default();
                crate::cost::server_cost(&crate::cost::machine_price(self.provider.as_ref(), plan, &self.valid.zone, disks))
            }
            _ => self.cost.clone(),
        }
    }
}

/// Validate (pure) → the account's provider → limits → cost and the monthly budget → the
/// Server's own SSH key.
pub async fn prepare(visit: &mut Visit<'_>, refs: &dereference::Refs, ctx: &Context) -> Result<Prepared, End> {
    let server = visit.server;
    let ws = &refs.workspace;
    let made_with = server.status.as_ref().filter(|s| s.provider_id.is_some()).and_then(|s| s.provider.as_deref());
    let stall = |invalid: validate::Invalid| End::stalled(Step::Validate, invalid.reason, invalid.message);
    let account = validate::account(&server.spec, ws, made_with).map_err(stall)?;
    let provider = ctx.provider_for(ws, &account).await.map_err(|e| End::failed(Step::Dereference, e, Some(&account.name)))?;
    let mut valid = validate::validate(&server.spec, ws, account, |plan| {
        provider.resolve_plan(plan).map_err(|e| match e {
            provisioning_providers::ProviderError::InvalidRequest(m) => m,
            other => other.to_string(),
        })
    })
    .map_err(stall)?;
    // spec.fallbackZones: where the machine is, or the zone the next create tries.
    valid.zone = validate::placement(&valid, server);
    validate::within_limit(refs.rank, ws).map_err(stall)?;
    // Cost, and the monthly budget before any machine is made (see budget).
    let namespace = server.metadata.namespace.as_deref();
    let others = || ctx.stores.servers.state().into_iter().filter(|s| s.metadata.namespace.as_deref() == namespace).collect();
    let cost = budget::gate(server, ws, &valid, &provider, others, &mut visit.events).map_err(|refused| {
        let (invalid, cost) = *refused;
        End::Stalled { step: Step::Validate, reason: invalid.reason, message: invalid.message, plan: None, cost: Some(Box::new(cost)) }
    })?;
    // Dereference the Server's own SSH key (spec.sshKeySecretRef): a missing Secret or key
    // stalls, naming both, before any machine is made with the wrong key.
    let login_key = if ssh::uses_ssh(&valid.account) {
        match ssh::server_key(&ctx.client, server).await {
            Ok(key) => key.map(|k| k.public),
            Err(Error::Stalled { reason, message }) => return Err(End::stalled(Step::Dereference, reason, message)),
            Err(e) => return Err(End::failed(Step::Dereference, e, Some(&valid.account.name))),
        }
    } else {
        None
    };
    if made_with.is_none() {
        // Before any machine (and any security group) is made: SSH only from where the
        // account says (a Server whose machine exists keeps being observed).
        validate::ssh_sources(&valid.account).map_err(stall)?;
    }
    Ok(Prepared { provider, valid, cost, login_key })
}
