//! Dereference: provider accounts (credentials Secrets, provider checks) and counts.

use std::time::Instant;

use kube::ResourceExt;
use provisioning_crds::{Workspace, WorkspaceCounts};

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
        let check = match ctx.provider_for(ws, account).await {
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

/// Counts the resources of the namespace from the watch caches.
pub fn counts(namespace: &str, ctx: &Context) -> WorkspaceCounts {
    let in_ns = |ns: Option<&str>| ns == Some(namespace);
    let servers = ctx.stores.servers.state().iter().filter(|s| in_ns(s.metadata.namespace.as_deref())).count();
    let taskservs = ctx.stores.taskservs.state().iter().filter(|s| in_ns(s.metadata.namespace.as_deref())).count();
    let clusters = ctx.stores.clusters.state().iter().filter(|s| in_ns(s.metadata.namespace.as_deref())).count();
    WorkspaceCounts { servers: servers as u32, clusters: clusters as u32, taskservs: taskservs as u32 }
}
