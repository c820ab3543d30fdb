//! Approval of a TaskServ's plan (`approval: Manual`): install, upgrade, re-install and
//! remove runs wait until the annotation `provisioning.dev/approve` names the current
//! `status.plan.id`; health checks go on. Pure.
//!
//! Unlike a Server's plan (one machine, carried out at once), a TaskServ's plan shrinks while
//! it is carried out — servers finish one by one, a rollout goes batch by batch — so the
//! approved plan is kept in `status.approvedPlan` and every later plan whose changes it
//! already contains goes on under the same approval ([`crate::approval::gate`]). A change it does not contain (a new
//! spec, drift found meanwhile, a rollback after a failed upgrade) waits for a new one.

use provisioning_crds::{Plan, TaskServStatus};

use super::plan::{Operation, ServerPhase};
// The gate itself is every kind's ([`crate::approval`]).
pub use crate::approval::{AWAITING_APPROVAL, Gate, gate, gate_with, same_change};

/// [`gate`] for a TaskServ, and the approval kept afterwards: only the changes it approved
/// that are still to be carried out (those the current `plan` still has). A change carried
/// out leaves the kept approval, so a later re-install of the same server (config drift, a
/// changed `configFrom` Secret) is never covered by it; once all are carried out the kept
/// approval is spent (no changes) and covers nothing.
pub fn gate_kept(
    approval: provisioning_crds::Approval,
    annotation: Option<&str>,
    plan: &Plan,
    kept: Option<&Plan>,
) -> (Gate, Option<Plan>) {
    let gate = gate(approval, annotation, plan, kept);
    let approved = match &gate {
        Gate::Go { approved } => approved.clone(),
        Gate::Wait | Gate::Stale(_) => kept.cloned(),
    };
    let approved = approved.map(|mut a| {
        a.changes.retain(|c| plan.changes.iter().any(|p| same_change(p, c)));
        a
    });
    (gate, approved)
}

/// Holds a plan that waits: only health checks start. A server held from an install stays
/// `Pending` (the install is still due: the next pass plans it again, under the same plan id)
/// with the last run it had; one held from a remove keeps its phase. Phase and Ready say what
/// the TaskServ waits for.
pub fn hold(desired: &mut TaskServStatus, previous: &TaskServStatus, launch: &mut Vec<(String, Operation)>, plan: &Plan) {
    let held: Vec<(String, Operation)> = launch.iter().filter(|(_, op)| *op != Operation::Check).cloned().collect();
    launch.retain(|(_, op)| *op == Operation::Check);
    for (name, operation) in held {
        let before = previous.servers.iter().find(|e| e.name == name);
        if let Some(entry) = desired.servers.iter_mut().find(|e| e.name == name) {
            entry.last_run = before.and_then(|b| b.last_run.clone());
            match (operation, before) {
                (Operation::Remove, Some(b)) => entry.phase = b.phase.clone(),
                _ => ServerPhase::Pending.set(entry),
            }
        }
    }
    desired.phase = Some(AWAITING_APPROVAL.to_string());
    let message = crate::approval::waiting_message(plan);
    for c in desired.conditions.iter_mut() {
        if c.type_ == provisioning_crds::condition::READY || c.type_ == provisioning_crds::condition::RECONCILING {
            c.reason = AWAITING_APPROVAL.to_string();
            c.message = message.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use provisioning_crds::{Approval, ChangeAction, PlannedChange, TaskServServerStatus};

    use super::*;

    fn change(server: &str, to: &str) -> PlannedChange {
        PlannedChange {
            resource: format!("TaskServ/ns/redis on {server}"),
            field: "version".into(),
            action: ChangeAction::Update,
            from: "7.0".into(),
            to: to.into(),
            reason: "upgrade".into(),
        }
    }

    fn plan(id: &str, changes: Vec<PlannedChange>) -> Plan {
        Plan { id: id.into(), summary: format!("{} to update", changes.len()), changes, ..Default::default() }
    }

    #[test]
    fn automatic_goes_and_manual_waits_for_the_current_id() {
        let p = plan("aaa", vec![change("s0", "7.2"), change("s1", "7.2")]);
        assert_eq!(gate(Approval::Automatic, None, &p, None), Gate::Go { approved: None });
        assert_eq!(gate(Approval::Manual, None, &p, None), Gate::Wait);
        assert_eq!(gate(Approval::Manual, Some(" aaa "), &p, None), Gate::Go { approved: Some(p.clone()) });
        assert_eq!(gate(Approval::Manual, Some("zzz"), &p, None), Gate::Stale("zzz".into()));
        // Nothing to do: nothing to approve, and the approval is kept.
        let none = plan("nnn", vec![]);
        assert_eq!(gate(Approval::Manual, Some("aaa"), &none, Some(&p)), Gate::Go { approved: Some(p.clone()) });
    }

    #[test]
    fn an_approved_plan_goes_on_while_it_shrinks_and_nothing_beyond_it() {
        let approved = plan("aaa", vec![change("s0", "7.2"), change("s1", "7.2")]);
        // s0 finished: the plan now holds s1 only, under a new id — still approved.
        let rest = plan("bbb", vec![change("s1", "7.2")]);
        assert_eq!(gate(Approval::Manual, Some("aaa"), &rest, Some(&approved)), Gate::Go { approved: Some(approved.clone()) });
        // A rollback (another target) or another server is a new plan: it waits, and the
        // old approval is not reported as stale.
        let rollback = plan("ccc", vec![change("s0", "7.0")]);
        assert_eq!(gate(Approval::Manual, Some("aaa"), &rollback, Some(&approved)), Gate::Wait);
        let more = plan("ddd", vec![change("s1", "7.2"), change("s2", "7.2")]);
        assert_eq!(gate(Approval::Manual, Some("aaa"), &more, Some(&approved)), Gate::Wait);
    }

    #[test]
    fn a_new_spec_voids_the_approval_kept_for_the_old_one() {
        let mut approved = plan("aaa", vec![change("s0", "7.2"), change("s1", "7.2")]);
        approved.generation = Some(2);
        // Same generation: the remainder goes on.
        let mut rest = plan("bbb", vec![change("s1", "7.2")]);
        rest.generation = Some(2);
        assert_eq!(gate(Approval::Manual, Some("aaa"), &rest, Some(&approved)), Gate::Go { approved: Some(approved.clone()) });
        // A new spec (generation 3) whose re-installs look the same (a config change): it
        // waits, and the old approval is reported stale.
        rest.generation = Some(3);
        assert_eq!(gate(Approval::Manual, Some("aaa"), &rest, Some(&approved)), Gate::Stale("aaa".into()));
        assert_eq!(gate(Approval::Manual, Some("bbb"), &rest, Some(&approved)), Gate::Go { approved: Some(rest.clone()) });
    }

    #[test]
    fn a_second_config_change_that_re_installs_the_same_servers_needs_a_new_approval() {
        // Real ids: re-installs of s0 and s1 at 7.2 planned for generation 2, then again for
        // generation 3 (a second config change: the changes read the same).
        let servers = |phase: &str| TaskServStatus {
            servers: ["s0", "s1"]
                .iter()
                .map(|s| TaskServServerStatus {
                    name: s.to_string(),
                    phase: phase.into(),
                    version: Some("7.2".into()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let first = crate::taskserv::plan::taskserv_plan("TaskServ/ns/redis", Some(2), &servers("Pending"), Some("7.2"));
        let second = crate::taskserv::plan::taskserv_plan("TaskServ/ns/redis", Some(3), &servers("Pending"), Some("7.2"));
        assert_eq!(first.changes, second.changes);
        assert_ne!(first.id, second.id, "the generation is part of the id");
        // The first approval was carried out (kept with its id); the annotation still names it.
        let carried = Plan { id: first.id.clone(), summary: first.summary.clone(), generation: first.generation, ..Default::default() };
        assert_eq!(gate(Approval::Manual, Some(&first.id), &second, Some(&carried)), Gate::Stale(first.id.clone()));
        assert_eq!(gate(Approval::Manual, Some(&second.id), &second, Some(&carried)), Gate::Go { approved: Some(second.clone()) });
    }

    #[test]
    fn a_carried_out_approval_covers_no_later_re_install() -> Result<(), Box<dyn std::error::Error>> {
        use crate::taskserv::plan::taskserv_plan;
        // s0 and s1 run redis 7.2 at generation 2; `phase` and the configFrom inputs vary.
        let status = |phase: &str, inputs: &str, kept: Option<&Plan>| TaskServStatus {
            servers: ["s0", "s1"]
                .iter()
                .map(|s| TaskServServerStatus {
                    name: s.to_string(),
                    phase: phase.into(),
                    version: Some("7.2".into()),
                    ..Default::default()
                })
                .collect(),
            config_inputs_hash: Some(inputs.into()),
            approved_plan: kept.cloned(),
            ..Default::default()
        };
        let plan_of = |s: &TaskServStatus| taskserv_plan("TaskServ/ns/redis", Some(2), s, Some("7.2"));
        // A configFrom Secret changed (inputs h2): re-install both; approved.
        let first = plan_of(&status("Pending", "h2", None));
        let (gate, kept) = gate_kept(Approval::Manual, Some(&first.id), &first, None);
        assert!(gate.goes());
        assert_eq!(kept.as_ref().map(|k| k.changes.len()), Some(2));
        // The Secret changes again (inputs h3) while both still wait to install: the same
        // installs, but the kept approval was given for h2 and does not cover them (seventh
        // re-review: the new config would have gone in under the old approval).
        let changed = plan_of(&status("Pending", "h3", kept.as_ref()));
        assert_eq!(changed.changes, first.changes);
        assert!(!gate_kept(Approval::Manual, Some(&first.id), &changed, kept.as_ref()).0.goes(), "changed inputs need a new approval");
        // s0 done: the kept approval holds s1 only, and still covers it.
        let mut half = status("Pending", "h2", kept.as_ref());
        half.servers[0].phase = "Installed".into();
        let rest = plan_of(&half);
        let (gate, kept) = gate_kept(Approval::Manual, Some(&first.id), &rest, kept.as_ref());
        assert!(gate.goes());
        assert_eq!(
            kept.as_ref().map(|k| k.changes.iter().map(|c| c.resource.as_str()).collect::<Vec<_>>()),
            Some(vec!["TaskServ/ns/redis on s1"])
        );
        // Both done: the approval is spent (kept under its id, with no changes).
        let done = plan_of(&status("Installed", "h2", kept.as_ref()));
        let (gate, kept) = gate_kept(Approval::Manual, Some(&first.id), &done, kept.as_ref());
        assert!(gate.goes());
        let spent = kept.clone().ok_or("kept")?;
        assert!(spent.id == first.id && spent.changes.is_empty(), "{spent:?}");
        // Config drift on s0 later: a re-install the annotation (still naming the first plan)
        // does not cover.
        let mut drift = status("Installed", "h2", Some(&spent));
        drift.servers[0].phase = "Pending".into();
        drift.servers[0].drifted_files = vec!["/etc/redis/redis.conf".into()];
        let repair = plan_of(&drift);
        assert_eq!(gate_kept(Approval::Manual, Some(&first.id), &repair, Some(&spent)).0, Gate::Wait);
        // The Secret changes again (inputs h3): the same re-installs as the first plan, yet
        // another plan id, which the old annotation does not approve.
        let again = plan_of(&status("Pending", "h3", Some(&spent)));
        assert_eq!(again.changes, first.changes);
        assert_ne!(again.id, first.id, "the inputs and the spent approval are part of the id");
        assert_eq!(gate_kept(Approval::Manual, Some(&first.id), &again, Some(&spent)).0, Gate::Wait);
        // Even back at the first inputs (h2) the spent approval makes it another plan.
        let back = plan_of(&status("Pending", "h2", Some(&spent)));
        assert_ne!(back.id, first.id);
        // Approving the new plan goes.
        assert!(gate_kept(Approval::Manual, Some(&again.id), &again, Some(&spent)).0.goes());
        Ok(())
    }

    #[test]
    fn a_held_plan_starts_only_checks_and_keeps_the_servers_as_they_were() {
        let previous = TaskServStatus {
            servers: vec![TaskServServerStatus {
                name: "s0".into(),
                phase: "Installed".into(),
                version: Some("7.0".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut desired = previous.clone();
        desired.servers[0].phase = "Installing".into();
        desired.servers.push(TaskServServerStatus { name: "s1".into(), phase: "Installing".into(), ..Default::default() });
        desired.conditions = vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "Installing".into(),
            message: "0/2".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }];
        let mut launch = vec![
            ("s0".to_string(), Operation::Install { version: "7.2".into(), previous: Some("7.0".into()) }),
            ("s1".to_string(), Operation::Install { version: "7.2".into(), previous: None }),
            ("s2".to_string(), Operation::Check),
        ];
        let p = plan("aaa", vec![change("s0", "7.2")]);
        hold(&mut desired, &previous, &mut launch, &p);
        assert_eq!(launch, vec![("s2".to_string(), Operation::Check)]);
        // The re-install of s0 is still due (Pending, its version kept); s1 was never installed.
        assert_eq!((desired.servers[0].phase.as_str(), desired.servers[0].version.as_deref()), ("Pending", Some("7.0")));
        assert_eq!(desired.servers[1].phase, "Pending");
        assert_eq!(desired.phase.as_deref(), Some("AwaitingApproval"));
        assert_eq!(desired.conditions[0].reason, "AwaitingApproval");
        assert!(desired.conditions[0].message.contains("provisioning.dev/approve=aaa"), "{}", desired.conditions[0].message);
    }
}
