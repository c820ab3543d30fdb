//! Status (pure): the Workspace's desired status.

use k8s_openapi::jiff::Timestamp;
use provisioning_crds::{CostTotal, ProviderAccountStatus, WorkspaceCounts, WorkspaceStatus, condition};

use crate::conditions::{self, DesiredCondition, Status, Summary, Wording};
use crate::workspace::rollup::Child;

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
    /// Resource counts and their roll-up.
    pub counts: Option<WorkspaceCounts>,
    /// The worst resource of the namespace (None when all are Ready).
    pub worst: Option<Child>,
    /// The namespace is being deleted.
    pub namespace_terminating: bool,
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
        return paused(status, &previous, &input);
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
    } else if input.namespace_terminating {
        Summary::progressing(
            "NamespaceTerminating",
            format!("namespace {:?} is being deleted; it is created again once gone", input.namespace.clone().unwrap_or_default()),
        )
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
    let failed_children = input.counts.as_ref().map_or(0, |c| c.failed);
    status.phase = Some(
        match summary {
            Summary::Ready { .. } if failed_children > 0 => "Degraded",
            Summary::Ready { .. } => "Ready",
            Summary::Stalled { .. } => "Failed",
            _ => "Pending",
        }
        .into(),
    );
    let mut wanted = match (&summary, &input.worst) {
        // A parent is not Ready while a resource of its namespace failed.
        (Summary::Ready { .. }, Some(worst)) if failed_children > 0 => Summary::waiting(
            "ResourcesFailed",
            format!("{failed_children} of its resources failed; {}", describe(worst)),
            &Wording::KSTATUS,
        ),
        _ => summary.conditions(),
    };
    wanted.push(providers_ready);
    if let Some(counts) = &input.counts {
        wanted.push(resources_ready(counts, input.worst.as_ref()));
    }
    if conditions::find(&previous.conditions, condition::PAUSED).is_some() {
        // Once paused, the condition stays (False) rather than vanishing from the list.
        wanted.push(DesiredCondition::new(condition::PAUSED, Status::False, "Resumed", ""));
    }
    status.conditions = conditions::merge(&previous.conditions, &wanted, input.generation, input.now);
    status
}

/// A paused Workspace: its conditions kept as they are, plus Reconciling=False and Paused.
fn paused(mut status: WorkspaceStatus, previous: &WorkspaceStatus, input: &StatusInput<'_>) -> WorkspaceStatus {
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
    status
}

/// `ResourcesReady`: the roll-up with the worst resource's reason and message.
fn resources_ready(counts: &WorkspaceCounts, worst: Option<&Child>) -> DesiredCondition {
    match worst {
        None => DesiredCondition::new(condition::RESOURCES_READY, Status::True, "AllReady", counts.summary.clone()),
        Some(worst) => DesiredCondition::new(
            condition::RESOURCES_READY,
            Status::False,
            &worst.reason,
            format!("{}; {}", counts.summary, describe(worst)),
        ),
    }
}

fn describe(child: &Child) -> String {
    format!("{} {}: {}", child.kind, child.name, if child.message.is_empty() { child.reason.as_str() } else { child.message.as_str() })
}

/// The status of a Workspace being deleted: Terminating, and `InUse` naming the resources
/// of its namespace that still use its provider accounts (they hold its deletion).
pub fn terminating(previous: Option<&WorkspaceStatus>, generation: Option<i64>, users: &[String], now: Timestamp) -> WorkspaceStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.observed_generation = generation;
    status.phase = Some("Terminating".into());
    let in_use = if users.is_empty() {
        DesiredCondition::new(condition::IN_USE, Status::False, "Unused", "no resource uses its provider accounts")
    } else {
        const SHOWN: usize = 5;
        let mut named = users.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
        if users.len() > SHOWN {
            named.push_str(&format!(" and {} more", users.len() - SHOWN));
        }
        let namespace = status.namespace.clone().unwrap_or_default();
        DesiredCondition::new(
            condition::IN_USE,
            Status::True,
            "InUseByResources",
            format!(
                "deletion waits for {} resource{} in namespace {namespace:?} that use its provider accounts: {named}",
                users.len(),
                if users.len() == 1 { "" } else { "s" }
            ),
        )
    };
    let message = in_use.message.clone();
    let mut wanted = Summary::progressing("Deleting", message).conditions();
    if let Some(p) = previous.and_then(|p| conditions::find(&p.conditions, condition::PROVIDERS_READY)) {
        wanted.push(DesiredCondition::new(condition::PROVIDERS_READY, word(&p.status), &p.reason, p.message.clone()));
    }
    wanted.push(in_use);
    status.conditions = conditions::merge(status.conditions.as_slice(), &wanted, generation, now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::rollup::{Health, counts};

    fn input(children: &[Child]) -> StatusInput<'static> {
        StatusInput {
            previous: None,
            generation: Some(1),
            namespace: Some("demo".into()),
            conflict: None,
            accounts: vec![("sim".into(), AccountCheck::Ready)],
            counts: Some(counts(children)),
            worst: crate::workspace::rollup::worst(children).cloned(),
            namespace_terminating: false,
            paused: false,
            now: Timestamp::now(),
        }
    }

    fn child(name: &str, health: Health, reason: &str, message: &str) -> Child {
        Child { kind: "Server", name: name.into(), health, reason: reason.into(), message: message.into() }
    }

    #[test]
    fn a_failed_server_makes_the_workspace_not_ready_and_is_named() {
        let children = [
            child("web-1", Health::Ready, "Running", ""),
            child("bad", Health::Failed, "UnknownProvider", "provider \"x\" is not defined"),
        ];
        let status = desired(input(&children));
        assert_eq!(status.phase.as_deref(), Some("Degraded"));
        let ready = conditions::find(&status.conditions, condition::READY).expect("Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ResourcesFailed"));
        assert_eq!(ready.message, "1 of its resources failed; Server bad: provider \"x\" is not defined");
        assert_eq!(conditions::status_of(&status.conditions, condition::STALLED), Some("False"));
        let rollup = conditions::find(&status.conditions, condition::RESOURCES_READY).expect("ResourcesReady");
        assert_eq!((rollup.status.as_str(), rollup.reason.as_str()), ("False", "UnknownProvider"));
        assert_eq!(status.counts.map(|c| c.summary).as_deref(), Some("1/2 ready, 1 failed"));
    }

    #[test]
    fn progressing_servers_leave_the_workspace_ready() {
        let children = [child("web-1", Health::Progressing, "Provisioning", "creating")];
        let status = desired(input(&children));
        assert_eq!(conditions::status_of(&status.conditions, condition::READY), Some("True"));
        assert_eq!(conditions::find(&status.conditions, condition::RESOURCES_READY).map(|c| c.reason.as_str()), Some("Provisioning"));
    }

    #[test]
    fn a_workspace_in_use_while_deleting_names_its_users() {
        let users = vec!["Server web-1".to_string(), "Server web-2".to_string()];
        let status = terminating(None, Some(1), &users, Timestamp::now());
        assert_eq!(status.phase.as_deref(), Some("Terminating"));
        let in_use = conditions::find(&status.conditions, condition::IN_USE).expect("InUse");
        assert_eq!((in_use.status.as_str(), in_use.reason.as_str()), ("True", "InUseByResources"));
        assert!(in_use.message.starts_with("deletion waits for 2 resources"), "{}", in_use.message);
        assert_eq!(conditions::status_of(&status.conditions, condition::READY), Some("False"));
    }
}
