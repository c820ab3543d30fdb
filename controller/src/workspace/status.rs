//! Status (pure): the Workspace's desired status.

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{CostTotal, ProviderAccountStatus, WorkspaceCounts, WorkspaceStatus, condition};

use crate::conditions::{self, DesiredCondition, Status, Summary};

pub use crate::accounts::AccountCheck;

/// Inputs of [`desired`].
#[derive(Clone, Debug)]
pub struct StatusInput<'a> {
    /// The status as it is.
    pub previous: Option<&'a WorkspaceStatus>,
    /// metadata.generation.
    pub generation: Option<i64>,
    /// The namespace (None when not resolved because of a conflict).
    pub namespace: Option<String>,
    /// Conflict message when another Workspace owns the namespace.
    pub conflict: Option<String>,
    /// Account results in spec order.
    pub accounts: Vec<(String, AccountCheck)>,
    /// Resource counts.
    pub counts: Option<WorkspaceCounts>,
    /// Paused annotation.
    pub paused: bool,
    /// Clock.
    pub now: Timestamp,
}

/// Builds the desired status and whether anything is still retrying.
// Over 80 lines on purpose: counts, cost and per-account checks copied into the status, then
// the condition table; one place shows which input sets which field.
pub fn desired(input: StatusInput<'_>) -> WorkspaceStatus {
    let previous = input.previous.cloned().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = input.generation;
    if input.paused {
        let mut wanted: Vec<DesiredCondition> = [condition::READY, condition::STALLED, condition::PROVIDERS_READY]
            .iter()
            .map(|t| match conditions::find(&previous.conditions, t) {
                Some(c) => DesiredCondition::new(t, word(&c.status), &c.reason, c.message.clone()),
                None => DesiredCondition::new(t, Status::Unknown, "Paused", ""),
            })
            .collect();
        wanted.insert(1, DesiredCondition::new(condition::RECONCILING, Status::False, "Paused", "reconciliation is paused"));
        wanted.push(DesiredCondition::new(
            condition::PAUSED,
            Status::True,
            "Paused",
            "annotation provisioning.dev/paused=true stops reconciliation",
        ));
        status.conditions = conditions::merge(&previous.conditions, &wanted, input.generation, input.now);
        return status;
    }
    status.namespace = input.namespace.clone();
    status.providers = input
        .accounts
        .iter()
        .map(|(name, check)| ProviderAccountStatus {
            name: name.clone(),
            ready: *check == AccountCheck::Ready,
            message: match check {
                AccountCheck::Ready => "credentials accepted".into(),
                AccountCheck::Failed(m) | AccountCheck::Retrying(m) => m.clone(),
            },
        })
        .collect();
    if input.counts.is_some() {
        status.counts = input.counts.clone();
    }
    let failed: Vec<String> = input
        .accounts
        .iter()
        .filter_map(|(n, c)| match c {
            AccountCheck::Failed(m) => Some(format!("provider account {n:?}: {m}")),
            _ => None,
        })
        .collect();
    let retrying: Vec<String> = input
        .accounts
        .iter()
        .filter_map(|(n, c)| match c {
            AccountCheck::Retrying(m) => Some(format!("provider account {n:?}: {m}")),
            _ => None,
        })
        .collect();
    let summary = if let Some(conflict) = &input.conflict {
        Summary::stalled("NamespaceConflict", conflict.clone())
    } else if !failed.is_empty() {
        Summary::stalled("ProviderAccountFailed", failed.join("; "))
    } else if !retrying.is_empty() {
        Summary::progressing("ValidatingProviders", retrying.join("; "))
    } else {
        Summary::ready(
            "Ready",
            format!("namespace {:?} with {} provider account(s) ready", input.namespace.clone().unwrap_or_default(), input.accounts.len()),
        )
    };
    let providers_ready = if input.conflict.is_some() {
        DesiredCondition::new(condition::PROVIDERS_READY, Status::Unknown, "NamespaceConflict", "")
    } else if failed.is_empty() && retrying.is_empty() {
        DesiredCondition::new(condition::PROVIDERS_READY, Status::True, "CredentialsAccepted", "")
    } else {
        let mut all = failed.clone();
        all.extend(retrying.clone());
        DesiredCondition::new(condition::PROVIDERS_READY, Status::False, "AccountsNotReady", all.join("; "))
    };
    status.phase = Some(
        match summary {
            Summary::Ready { .. } => "Ready",
            Summary::Stalled { .. } => "Failed",
            _ => "Pending",
        }
        .into(),
    );
    let mut wanted = summary.conditions();
    wanted.push(providers_ready);
    if conditions::find(&previous.conditions, condition::PAUSED).is_some() {
        // Once paused, the condition stays (False) rather than vanishing from the list.
        wanted.push(DesiredCondition::new(condition::PAUSED, Status::False, "Resumed", ""));
    }
    status.conditions = conditions::merge(&previous.conditions, &wanted, input.generation, input.now);
    status
}

/// Records the namespace's cost total (kept as it was when the namespace is not resolved).
pub fn record_cost(mut status: WorkspaceStatus, cost: Option<CostTotal>) -> WorkspaceStatus {
    if cost.is_some() {
        status.cost = cost;
    }
    status
}

fn word(s: &str) -> Status {
    match s {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    }
}
