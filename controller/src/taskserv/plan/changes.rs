//! The TaskServ's `status.plan` (pure): what its scripts still have to do, per server —
//! install (Create), upgrade or re-install (Update), remove (Delete) — read off the status
//! the planner just derived. Informational: script runs are not gated by approval (they run
//! only on Ready Servers, whose machines are).

use provisioning_crds::{ChangeAction, Plan, PlannedChange, TaskServServerStatus, TaskServStatus};
use sha2::{Digest, Sha256};

use super::model::ServerPhase;
use crate::server::plan::{plan_id, summary};

/// The plan of TaskServ `resource` (`TaskServ/ns/name`) at spec `generation` from its
/// desired `status` and the version it converges to (`None` when the spec is invalid:
/// nothing is planned).
pub fn taskserv_plan(resource: &str, generation: Option<i64>, status: &TaskServStatus, version: Option<&str>) -> Plan {
    let mut changes = Vec::new();
    for entry in &status.servers {
        let phase = ServerPhase::of(entry);
        let installed = entry.version.clone().unwrap_or_default();
        let target = version.unwrap_or_default().to_string();
        let (action, from, to, reason) = match phase {
            Some(ServerPhase::Removing) => (ChangeAction::Delete, installed, String::new(), "the server left the selection".to_string()),
            Some(ServerPhase::Installed) if version.is_some_and(|v| entry.version.as_deref() != Some(v)) => {
                (ChangeAction::Update, installed, target, "upgrade".to_string())
            }
            Some(ServerPhase::Installed) | None => continue,
            _ if version.is_none() => continue,
            _ if entry.version.is_none() => (ChangeAction::Create, String::new(), target, "install".to_string()),
            _ if entry.version.as_deref() == version => (ChangeAction::Update, installed, target, reinstall_reason(entry)),
            _ => (ChangeAction::Update, installed, target, "upgrade".to_string()),
        };
        changes.push(PlannedChange {
            resource: format!("{resource} on {}", entry.name),
            field: "version".into(),
            action,
            from,
            to,
            reason,
        });
    }
    let id = taskserv_plan_id(resource, generation, status, &changes);
    Plan { id, summary: summary(&changes), changes, generation, inputs: status.config_inputs_hash.clone(), ..Default::default() }
}

/// The plan id ([`plan_id`]: resource, generation, changes) made single-use for a TaskServ,
/// whose re-installs follow more than its spec: it also covers the config inputs (a changed
/// `configFrom` Secret or generated secret is a new plan, though the generation stays) and,
/// once the approval kept in `status.approvedPlan` is spent (every change it approved carried
/// out), that approval's id — a later re-install that reads the same (config drift again) is
/// never the plan approved before, so the annotation still naming it approves nothing new.
fn taskserv_plan_id(resource: &str, generation: Option<i64>, status: &TaskServStatus, changes: &[PlannedChange]) -> String {
    let base = plan_id(resource, generation, None, changes);
    let spent = status.approved_plan.as_ref().filter(|p| p.changes.is_empty()).map(|p| p.id.as_str());
    if changes.is_empty() || (status.config_inputs_hash.is_none() && status.install_inputs.is_empty() && spent.is_none()) {
        return base;
    }
    let mut hash = Sha256::new();
    for part in [base.as_str(), status.config_inputs_hash.as_deref().unwrap_or_default(), spent.unwrap_or_default()] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    for (input, value) in &status.install_inputs {
        hash.update(input.as_bytes());
        hash.update([1]);
        hash.update(value.as_bytes());
        hash.update([0]);
    }
    hash.finalize().iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// `re-install (WHY)`: the input that changed (`config.port changed`), the machine, health,
/// or an install that did not finish.
fn reinstall_reason(entry: &TaskServServerStatus) -> String {
    let why = match (&entry.reinstall_reason, ServerPhase::of(entry)) {
        (Some(why), _) => why.as_str(),
        _ if !entry.drifted_files.is_empty() => "config drift",
        _ if entry.healthy == Some(false) => "unhealthy",
        (None, Some(ServerPhase::Failed)) => "the last install failed",
        _ => "interrupted",
    };
    format!("re-install ({why})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, phase: &str, version: Option<&str>) -> TaskServServerStatus {
        TaskServServerStatus { name: name.into(), phase: phase.into(), version: version.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn installs_upgrades_and_removals_per_server() {
        let status = TaskServStatus {
            servers: vec![
                entry("a", "Pending", None),
                entry("b", "Installed", Some("3.5.0")),
                entry("c", "Installed", Some("3.4.0")),
                entry("d", "Removing", Some("3.5.0")),
                entry("e", "Failed", Some("3.5.0")),
            ],
            ..Default::default()
        };
        let plan = taskserv_plan("TaskServ/dev/etcd", Some(1), &status, Some("3.5.0"));
        assert_eq!(plan.summary, "1 to create, 2 to update, 1 to delete", "{:#?}", plan.changes);
        let c = plan.changes.iter().find(|c| c.resource.ends_with("on c")).expect("upgrade of c");
        assert_eq!((c.action, c.from.as_str(), c.to.as_str(), c.reason.as_str()), (ChangeAction::Update, "3.4.0", "3.5.0", "upgrade"));
        let settled = TaskServStatus { servers: vec![entry("b", "Installed", Some("3.5.0"))], ..Default::default() };
        assert_eq!(taskserv_plan("TaskServ/dev/etcd", Some(1), &settled, Some("3.5.0")).summary, "no changes");
        assert_eq!(
            taskserv_plan("TaskServ/dev/etcd", Some(1), &status, None).summary,
            "1 to delete",
            "an invalid spec plans only the drain"
        );
    }
}
