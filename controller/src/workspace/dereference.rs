//! Dereference: provider accounts (credentials Secrets, provider checks) and counts.

use std::time::Instant;

use kube::ResourceExt;
use kube::api::ListParams;
use provisioning_crds::{Cluster, TaskServ, Workspace};

use super::status::AccountCheck;
use crate::context::Context;
use crate::effective_workspace::EffectiveWorkspace;
use crate::error::ErrorClass;

/// The effective settings of a Workspace that owns `namespace`.
pub fn effective(ws: &Workspace, namespace: &str, ctx: &Context) -> EffectiveWorkspace {
    let mut spec = ws.spec.clone();
    if spec.providers.is_empty() {
        spec.providers = ctx.config.default_workspace.providers.clone();
    }
    EffectiveWorkspace { name: Some(ws.name_any()), namespace: namespace.to_string(), spec }
}

/// Checks every provider account: Secret present, provider built, credentials accepted.
/// Results are memoised per provider instance for the resync interval.
pub async fn check_accounts(ws: &EffectiveWorkspace, ctx: &Context) -> Vec<(String, AccountCheck)> {
    let mut out = Vec::new();
    for account in &ws.spec.providers {
        let check = match ctx.providers.get(ws, account).await {
            Err(e) => classify(&e),
            Ok(provider) => {
                let key = format!("{}/{}", ws.key(), account.name);
                let fingerprint = format!("{:p}", std::sync::Arc::as_ptr(&provider));
                let memo = {
                    let map = ctx.account_checks.lock().unwrap_or_else(|p| p.into_inner());
                    map.get(&key).filter(|(fp, at, _)| *fp == fingerprint && at.elapsed() < ctx.config.resync()).map(|(_, _, c)| c.clone())
                };
                match memo {
                    Some(check) => check,
                    None => {
                        let result =
                            ctx.provider_call(ws, &provider, &account.name, "validate_credentials", provider.validate_credentials()).await;
                        let check = match result {
                            Ok(()) => AccountCheck::Ready,
                            Err(e) => classify(&e),
                        };
                        if !matches!(check, AccountCheck::Retrying(_)) {
                            let mut map = ctx.account_checks.lock().unwrap_or_else(|p| p.into_inner());
                            map.insert(key, (fingerprint, Instant::now(), check.clone()));
                        }
                        check
                    }
                }
            }
        };
        out.push((account.name.clone(), check));
    }
    out
}

fn classify(e: &crate::Error) -> AccountCheck {
    let message = match e.root() {
        crate::Error::Provider { source, .. } => source.to_string(),
        other => other.to_string(),
    };
    match e.class() {
        ErrorClass::Permanent => AccountCheck::Failed(message),
        _ => AccountCheck::Retrying(message),
    }
}

/// The namespace's Servers, Clusters and TaskServs, for the roll-up: Servers from their
/// cache; Clusters and TaskServs (cached as metadata only) listed from the API, and only
/// when the namespace has any.
pub async fn children(namespace: &str, ctx: &Context) -> Result<Vec<super::rollup::Child>, crate::Error> {
    let in_ns = |ns: Option<&str>| ns == Some(namespace);
    let servers = ctx.stores.servers.state();
    let clusters = if ctx.stores.clusters.state().iter().any(|c| in_ns(c.metadata.namespace.as_deref())) {
        crate::decode::list::<Cluster>(&ctx.client, namespace, &ListParams::default()).await?
    } else {
        vec![]
    };
    let taskservs = if ctx.stores.taskservs.state().iter().any(|t| in_ns(t.metadata.namespace.as_deref())) {
        crate::decode::list::<TaskServ>(&ctx.client, namespace, &ListParams::default()).await?
    } else {
        vec![]
    };
    Ok(super::rollup::children(namespace, servers.iter().map(AsRef::as_ref), clusters.iter(), taskservs.iter()))
}

/// The resources of the namespace that use the Workspace's accounts (`Server web-1`), sorted,
/// from the watch caches: while any exists, a Workspace being deleted keeps its finalizer.
pub fn users(namespace: &str, ctx: &Context) -> Vec<String> {
    let in_ns = |ns: Option<&str>| ns == Some(namespace);
    let named = |kind: &str, name: String| format!("{kind} {name}");
    let mut users: Vec<String> = Vec::new();
    users.extend(
        ctx.stores.servers.state().iter().filter(|s| in_ns(s.metadata.namespace.as_deref())).map(|s| named("Server", s.name_any())),
    );
    users.extend(
        ctx.stores.clusters.state().iter().filter(|s| in_ns(s.metadata.namespace.as_deref())).map(|s| named("Cluster", s.name_any())),
    );
    users.extend(
        ctx.stores.taskservs.state().iter().filter(|s| in_ns(s.metadata.namespace.as_deref())).map(|s| named("TaskServ", s.name_any())),
    );
    users.sort();
    users
}
