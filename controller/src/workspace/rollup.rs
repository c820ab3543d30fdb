//! Roll-up (pure): the namespace's Servers, Clusters and TaskServs summed up the way
//! `clusterctl describe` does it — counts of ready / progressing / failed and the worst one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use provisioning_crds::{Cluster, Server, TaskServ, WorkspaceCounts, condition};

use crate::conditions;

/// How one resource of the namespace stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// Ready=True and not being deleted.
    Ready,
    /// Work in flight, waiting, or being deleted.
    Progressing,
    /// Stalled=True, or phase Failed: it needs a change to go on.
    Failed,
}

/// One resource of the namespace, as the roll-up sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    /// Its kind.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// How it stands.
    pub health: Health,
    /// The reason of its most telling condition (Stalled when failed, else Ready).
    pub reason: String,
    /// That condition's message.
    pub message: String,
}

impl Child {
    /// Classifies one resource from its metadata and status.
    pub fn of(kind: &'static str, name: String, deleting: bool, phase: Option<&str>, conds: &[Condition]) -> Child {
        let stalled = conditions::find(conds, condition::STALLED).filter(|c| c.status == "True");
        let ready = conditions::find(conds, condition::READY);
        let (health, telling) = if deleting {
            (Health::Progressing, None)
        } else if stalled.is_some() || phase == Some("Failed") {
            (Health::Failed, stalled.or(ready))
        } else if ready.is_some_and(|c| c.status == "True") {
            (Health::Ready, ready)
        } else {
            (Health::Progressing, ready)
        };
        let (reason, message) = match telling {
            Some(c) => (c.reason.clone(), c.message.clone()),
            None if deleting => ("Deleting".to_string(), "being deleted".to_string()),
            None => ("Pending".to_string(), "not reconciled yet".to_string()),
        };
        Child { kind, name, health, reason, message }
    }
}

/// The namespace's resources from the caches (any order).
pub fn children<'a>(
    namespace: &str,
    servers: impl IntoIterator<Item = &'a Server>,
    clusters: impl IntoIterator<Item = &'a Cluster>,
    taskservs: impl IntoIterator<Item = &'a TaskServ>,
) -> Vec<Child> {
    let in_ns = |ns: Option<&str>| ns == Some(namespace);
    let mut out = Vec::new();
    for c in clusters.into_iter().filter(|c| in_ns(c.metadata.namespace.as_deref())) {
        let status = c.status.as_ref();
        let (phase, conds) = (status.and_then(|s| s.phase.as_deref()), status.map(|s| s.conditions.as_slice()).unwrap_or_default());
        out.push(Child::of("Cluster", c.name_any(), c.metadata.deletion_timestamp.is_some(), phase, conds));
    }
    for s in servers.into_iter().filter(|s| in_ns(s.metadata.namespace.as_deref())) {
        let status = s.status.as_ref();
        let (phase, conds) = (status.and_then(|s| s.phase.as_deref()), status.map(|s| s.conditions.as_slice()).unwrap_or_default());
        out.push(Child::of("Server", s.name_any(), s.metadata.deletion_timestamp.is_some(), phase, conds));
    }
    for t in taskservs.into_iter().filter(|t| in_ns(t.metadata.namespace.as_deref())) {
        let status = t.status.as_ref();
        let (phase, conds) = (status.and_then(|s| s.phase.as_deref()), status.map(|s| s.conditions.as_slice()).unwrap_or_default());
        out.push(Child::of("TaskServ", t.name_any(), t.metadata.deletion_timestamp.is_some(), phase, conds));
    }
    out
}

/// The counts of `children` with their roll-up and summary (`5/7 ready, 2 failed`).
pub fn counts(children: &[Child]) -> WorkspaceCounts {
    let of_kind = |k: &str| children.iter().filter(|c| c.kind == k).count() as u32;
    let of_health = |h: Health| children.iter().filter(|c| c.health == h).count() as u32;
    let (ready, progressing, failed) = (of_health(Health::Ready), of_health(Health::Progressing), of_health(Health::Failed));
    let mut summary = format!("{ready}/{} ready", children.len());
    if failed > 0 {
        summary.push_str(&format!(", {failed} failed"));
    }
    if progressing > 0 {
        summary.push_str(&format!(", {progressing} progressing"));
    }
    WorkspaceCounts {
        servers: of_kind("Server"),
        clusters: of_kind("Cluster"),
        taskservs: of_kind("TaskServ"),
        ready,
        progressing,
        failed,
        summary,
    }
}

/// The worst resource: a failed one before a progressing one, then by kind and name, so the
/// same one is named on every pass. `None` when every resource is Ready (or there is none).
pub fn worst(children: &[Child]) -> Option<&Child> {
    children
        .iter()
        .filter(|c| c.health != Health::Ready)
        .max_by(|a, b| a.health.cmp(&b.health).then_with(|| (b.kind, &b.name).cmp(&(a.kind, &a.name))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        serde_json::from_value(serde_json::json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }))
        .expect("condition")
    }

    #[test]
    fn failed_ready_progressing_and_deleting_children_are_counted_and_the_worst_named() {
        let ready = [cond("Ready", "True", "Running", "machine running")];
        let stalled =
            [cond("Ready", "False", "UnknownPlan", "plan huge"), cond("Stalled", "True", "UnknownPlan", "plan \"huge\" is unknown")];
        let children = vec![
            Child::of("Server", "web-1".into(), false, Some("Running"), &ready),
            Child::of("Server", "web-2".into(), false, Some("Failed"), &stalled),
            Child::of("Server", "db-1".into(), false, Some("Failed"), &stalled),
            Child::of("Server", "old".into(), true, Some("Running"), &ready),
            Child::of("TaskServ", "etcd".into(), false, None, &[]),
        ];
        let counts = counts(&children);
        assert_eq!((counts.servers, counts.taskservs, counts.clusters), (4, 1, 0));
        assert_eq!((counts.ready, counts.progressing, counts.failed), (1, 2, 2));
        assert_eq!(counts.summary, "1/5 ready, 2 failed, 2 progressing");
        let worst = worst(&children).expect("a worst child");
        assert_eq!((worst.kind, worst.name.as_str(), worst.reason.as_str()), ("Server", "db-1", "UnknownPlan"));
        assert_eq!(worst.message, "plan \"huge\" is unknown");
        // A Server being deleted is never counted Ready, whatever its status says.
        assert_eq!(children[3].health, Health::Progressing);
        assert_eq!(children[3].reason, "Deleting");
    }

    #[test]
    fn all_ready_has_no_worst_child() {
        let ready = [cond("Ready", "True", "Running", "")];
        let children = vec![Child::of("Server", "a".into(), false, None, &ready)];
        assert_eq!(counts(&children).summary, "1/1 ready");
        assert!(worst(&children).is_none());
        assert_eq!(counts(&[]).summary, "0/0 ready");
    }
}
