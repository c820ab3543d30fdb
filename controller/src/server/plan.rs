//! Plan (pure): from what the status says to the next provider step, and what applying the
//! spec would change at the provider (`status.plan`, see [`spec_plan`]).

use provisioning_crds::{
    ANNOTATION_APPROVE, ANNOTATION_CREATE_PENDING, Approval, ChangeAction, Plan, PlannedChange, Server, ServerStatus, UpdatePolicy,
};
use provisioning_providers::prices::{NoPrice, Price};
use provisioning_providers::{MachineField, ProviderId};
use sha2::{Digest, Sha256};

use super::validate::ValidServer;

/// The next thing to do at the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The machine is known: observe it.
    Observe(ProviderId),
    /// Adopt the machine named by `spec.externalID`: observe it, never create.
    Adopt(ProviderId),
    /// A create call may have happened without its result being recorded ([`create_pending`],
    /// no providerID): look the machine up by owner tag before creating anything.
    FindThenCreate,
    /// Nothing was ever created: record the create checkpoint (the leak guard), then create.
    Create,
}

/// Whether a create call may have happened without its machine recorded: the create
/// checkpoint in status (Provisioned reason `Creating`, see [`super::status::create_started`])
/// or the `create-pending` annotation (remediation and replacement creates, and controllers
/// before the checkpoint).
pub fn create_pending(server: &Server) -> bool {
    server.annotations().contains_key(ANNOTATION_CREATE_PENDING) || super::status::create_started(server.status.as_ref())
}

/// Decides the next step for a Server that is not being deleted.
pub fn next_step(server: &Server) -> Step {
    let recorded = server.status.as_ref().and_then(|s| s.provider_id.clone()).filter(|id| !id.is_empty());
    let external = Some(server.spec.external_id.clone()).filter(|id| !id.is_empty());
    match (recorded, external) {
        (Some(recorded), Some(external)) if recorded != external => Step::Adopt(ProviderId(external)),
        (_, Some(external)) => Step::Adopt(ProviderId(external)),
        (Some(recorded), None) => Step::Observe(ProviderId(recorded)),
        (None, None) if create_pending(server) => Step::FindThenCreate,
        (None, None) => Step::Create,
    }
}

/// What deleting the Server must do at the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CleanupStep {
    /// deletionPolicy Orphan, or nothing was ever created: nothing to do.
    Nothing,
    /// Delete the known machine.
    Delete(ProviderId),
    /// A create may have happened unrecorded: find by owner tag, delete what is found.
    FindThenDelete,
}

/// Decides what deletion does.
pub fn cleanup_step(server: &Server) -> CleanupStep {
    if server.spec.effective_deletion_policy() == provisioning_crds::DeletionPolicy::Orphan {
        return CleanupStep::Nothing;
    }
    let recorded = server.status.as_ref().and_then(|s| s.provider_id.clone()).filter(|id| !id.is_empty());
    let external = Some(server.spec.external_id.clone()).filter(|id| !id.is_empty());
    // An adopted machine is deleted only once its adoption was recorded (it passed the
    // ownership check); a refused or never-observed externalID deletes nothing.
    let target = match (recorded, external) {
        (Some(recorded), Some(external)) if recorded == external => Some(recorded),
        (recorded, _) => recorded,
    };
    match target {
        Some(id) => CleanupStep::Delete(ProviderId(id)),
        None if create_pending(server) => CleanupStep::FindThenDelete,
        None => CleanupStep::Nothing,
    }
}

/// How a Server plan is to be carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Carry {
    /// Nothing to change.
    Nothing,
    /// A machine is to be made (none exists yet).
    Create,
    /// The machine is changed in place (`update_server`).
    Update,
    /// The machine is deleted, then made again.
    Replace,
    /// `spec.updatePolicy` forbids what the plan needs: Stalled, UpdateRefused, `message`
    /// naming the field.
    Refused(String),
}

/// A Server's plan and how it is carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerPlan {
    /// What `status.plan` shows.
    pub plan: Plan,
    /// What the reconcile does with it.
    pub carry: Carry,
}

/// `Server/<namespace>/<name>`, the resource a plan's changes name.
pub fn resource(server: &Server) -> String {
    format!("Server/{}/{}", server.namespace().unwrap_or_default(), server.name_any())
}

/// Reason of the NoOp changes listed for an adopted machine whose spec differs from it.
pub const ADOPTED_NOT_CHANGED: &str = "the machine was adopted (spec.externalID): the controller never changes a machine it did not make; recreate it without externalID to apply this";

/// What applying the spec would do to the Server's machine, against the observed machine in
/// `observed` (the status refreshed by this reconcile's observation: providerID, the plan the
/// machine runs, the zone and image it was made with).
///
/// - No machine (and none adopted): one `Create`.
/// - An adopted machine (`spec.externalID`) is never changed: where its spec differs from the
///   machine the plan lists the fields as `NoOp` with [`ADOPTED_NOT_CHANGED`] as the reason,
///   and the summary stays "no changes".
/// - Each of plan, zone and image that differs is an `Update` where `in_place` accepts the
///   field, else a `Replace` with `in_place`'s reason; one Replace makes the whole change a
///   replacement (the other fields come with the new machine).
/// - `spec.updatePolicy` Never refuses any change, InPlace refuses a Replace.
///
/// `price` is the provider's price table (native plan, zone) for the monthly cost delta.
pub fn spec_plan(
    server: &Server,
    desired: &ValidServer,
    observed: Option<&ServerStatus>,
    in_place: impl Fn(MachineField) -> Result<(), String>,
    same_plan: impl Fn(&str, &str) -> bool,
    price: impl Fn(&str, &str) -> Result<Price, NoPrice>,
) -> ServerPlan {
    let who = resource(server);
    let machine = observed.and_then(|s| s.provider_id.as_deref()).filter(|id| !id.is_empty());
    let adopted = !server.spec.external_id.is_empty();
    if adopted && machine.is_none() {
        return finish(server, machine, Vec::new(), None, Carry::Nothing);
    }
    let Some(machine) = machine else {
        let zone = if desired.zone.is_empty() { String::new() } else { format!(" in {}", desired.zone) };
        let mut extras = Vec::new();
        if let Some(subnet) = desired.account.zone_subnets.get(&desired.zone) {
            extras.push(format!("subnet {subnet}"));
        }
        match desired.public_ip {
            Some(true) => extras.push("public IP".to_string()),
            Some(false) => extras.push("no public IP".to_string()),
            None => {}
        }
        if !desired.disks.is_empty() {
            extras.push(format!("disks {}", desired.disks.iter().map(disk_text).collect::<Vec<_>>().join(", ")));
        }
        let fallbacks: Vec<String> = desired.allowed_zones().into_iter().filter(|z| *z != desired.zone).collect();
        if !desired.fallback_zones.is_empty() {
            extras.push(format!("then {} when out of capacity", fallbacks.join(", ")));
        }
        let extras = if extras.is_empty() { String::new() } else { format!(" ({})", extras.join(", ")) };
        let change = PlannedChange {
            resource: who.clone(),
            field: String::new(),
            action: ChangeAction::Create,
            from: String::new(),
            to: format!("{} machine from {}{zone}{extras} at account {}", desired.resolved_plan, desired.image, desired.account.name),
            reason: "no machine yet".into(),
        };
        let delta = cost_delta(&price, None, &desired.resolved_plan, &desired.zone);
        return finish(server, None, vec![change], delta, Carry::Create);
    };
    let status = observed.cloned().unwrap_or_default();
    let was = |v: &Option<String>, want: &str| v.clone().unwrap_or_else(|| want.to_string());
    let fields = [
        (MachineField::Plan, was(&status.resolved_plan, &desired.resolved_plan), desired.resolved_plan.clone()),
        (MachineField::Zone, was(&status.zone, &desired.zone), desired.zone.clone()),
        (MachineField::Image, was(&status.image, &desired.image), desired.image.clone()),
    ];
    let mut changes = Vec::new();
    for (field, from, to) in fields {
        let same = match field {
            MachineField::Plan => same_plan(&from, &to),
            _ => from == to,
        };
        if same {
            continue;
        }
        let (action, reason) = match in_place(field) {
            // Shown, never carried out: the spec and the adopted machine disagree.
            _ if adopted => (ChangeAction::NoOp, ADOPTED_NOT_CHANGED.to_string()),
            Ok(()) => (ChangeAction::Update, String::new()),
            Err(why) => (ChangeAction::Replace, why),
        };
        changes.push(PlannedChange { resource: who.clone(), field: field.spec_path().into(), action, from, to, reason });
    }
    let disk_changes = if adopted { Vec::new() } else { disk_changes(&who, status.disks.as_deref(), &desired.disks) };
    if !disk_changes.is_empty() {
        // Disks are made with the machine; changing them on an existing one is refused
        // (a shrink is never possible), never carried out halfway.
        let shrink = disk_changes.iter().find(|c| c.reason.starts_with("shrink"));
        let fields = disk_changes.iter().map(|c| c.field.clone()).collect::<Vec<_>>().join(", ");
        let message = match shrink {
            Some(c) => format!(
                "{} shrinks from {} to {}: a disk cannot shrink; machine {machine} is left as it is; revert {}",
                c.field, c.from, c.to, c.field
            ),
            None => format!(
                "{fields} changed: disks are made with the machine and changing the disks of an existing machine is not supported yet; machine {machine} is left as it is; revert spec.disks, or delete and re-create the Server"
            ),
        };
        changes.extend(disk_changes);
        return finish(server, Some(machine), changes, None, Carry::Refused(message));
    }
    if adopted || changes.is_empty() {
        return finish(server, Some(machine), changes, None, Carry::Nothing);
    }
    let replace = changes.iter().any(|c| c.action == ChangeAction::Replace);
    let policy = server.spec.update_policy.unwrap_or_default();
    let fields = changes.iter().map(|c| c.field.as_str()).collect::<Vec<_>>().join(", ");
    let carry = match policy {
        UpdatePolicy::Never => Carry::Refused(format!(
            "{fields} changed but spec.updatePolicy is Never: machine {machine} is left as it is; revert {fields} or set updatePolicy to Replace"
        )),
        UpdatePolicy::InPlace if replace => {
            let forced: Vec<String> =
                changes.iter().filter(|c| c.action == ChangeAction::Replace).map(|c| format!("{} ({})", c.field, c.reason)).collect();
            Carry::Refused(format!(
                "{} needs a new machine but spec.updatePolicy is InPlace: machine {machine} is left as it is; revert it or set updatePolicy to Replace",
                forced.join(", ")
            ))
        }
        _ if replace => Carry::Replace,
        _ => Carry::Update,
    };
    let old_plan = status.resolved_plan.clone().unwrap_or_else(|| desired.resolved_plan.clone());
    let old_zone = status.zone.clone().unwrap_or_else(|| desired.zone.clone());
    let delta = cost_delta(&price, Some((&old_plan, &old_zone)), &desired.resolved_plan, &desired.zone);
    finish(server, Some(machine), changes, delta, carry)
}

/// A disk as plans show it: `data 100Gi gp3 raw`, `logs 10Gi at /var/log (Retain)`.
pub fn disk_text(d: &provisioning_crds::Disk) -> String {
    let mut text = format!("{} {}", d.name, d.size);
    if !d.disk_type.is_empty() {
        text.push_str(&format!(" {}", d.disk_type));
    }
    if d.mount_path.is_empty() {
        text.push_str(" raw");
    } else {
        text.push_str(&format!(" at {}", d.mount_path));
    }
    if d.deletion_policy == provisioning_crds::DiskDeletionPolicy::Retain {
        text.push_str(" (Retain)");
    }
    text
}

/// The changes from the disks a machine was made with (`status.disks`; `None`: recorded
/// before disks existed, taken as none) to the spec's: a disk added, removed, or changed
/// (size, type, mountPath, deletionPolicy), one change each, named `spec.disks[<name>]…`.
/// A smaller size is reported with the reason "shrink".
pub fn disk_changes(who: &str, had: Option<&[provisioning_crds::Disk]>, want: &[provisioning_crds::Disk]) -> Vec<PlannedChange> {
    let had = had.unwrap_or_default();
    let change = |field: String, action, from: String, to: String, reason: &str| PlannedChange {
        resource: who.to_string(),
        field,
        action,
        from,
        to,
        reason: reason.to_string(),
    };
    let mut out = Vec::new();
    for w in want {
        let field = format!("spec.disks[{}]", w.name);
        match had.iter().find(|h| h.name == w.name) {
            None => out.push(change(field, ChangeAction::Create, String::new(), disk_text(w), "disk added to an existing machine")),
            Some(h) if h == w => {}
            Some(h) => {
                let smaller = matches!((h.size_gib(), w.size_gib()), (Ok(a), Ok(b)) if b < a);
                let (field, reason) = if smaller {
                    (format!("{field}.size"), "shrink: a disk cannot shrink")
                } else {
                    (field, "disk changed on an existing machine")
                };
                let (from, to) = if smaller { (h.size.clone(), w.size.clone()) } else { (disk_text(h), disk_text(w)) };
                out.push(change(field, ChangeAction::Update, from, to, reason));
            }
        }
    }
    for h in had.iter().filter(|h| !want.iter().any(|w| w.name == h.name)) {
        out.push(change(
            format!("spec.disks[{}]", h.name),
            ChangeAction::Delete,
            disk_text(h),
            String::new(),
            "disk removed from the spec",
        ));
    }
    out
}

/// The plan of remediating drift of `machine`: a missing machine is made again (Create), a
/// stopped one started (Update). `message` is the drift's. No cost delta: the machine costs
/// what it cost.
pub fn drift_plan(server: &Server, machine: &ProviderId, stopped: bool, message: &str, desired: &ValidServer) -> ServerPlan {
    let who = resource(server);
    let change = if stopped {
        PlannedChange {
            resource: who.clone(),
            field: String::new(),
            action: ChangeAction::Update,
            from: format!("machine {machine} stopped"),
            to: "running".into(),
            reason: message.to_string(),
        }
    } else {
        PlannedChange {
            resource: who.clone(),
            field: String::new(),
            action: ChangeAction::Create,
            from: format!("machine {machine} missing"),
            to: format!("{} machine from {}", desired.resolved_plan, desired.image),
            reason: message.to_string(),
        }
    };
    let carry = if stopped { Carry::Update } else { Carry::Create };
    finish(server, Some(&machine.0), vec![change], None, carry)
}

/// (signed decimal, currency) of the monthly price change; `None` when a price is unknown
/// or the currencies differ.
fn cost_delta(
    price: &impl Fn(&str, &str) -> Result<Price, NoPrice>,
    old: Option<(&str, &str)>,
    new_plan: &str,
    new_zone: &str,
) -> Option<(String, String)> {
    let new = price(new_plan, new_zone).ok()?;
    let (old_micros, old_currency) = match old {
        Some((plan, zone)) => {
            let p = price(plan, zone).ok()?;
            (p.monthly_micros, p.currency)
        }
        None => (0, new.currency),
    };
    if old_currency != new.currency {
        return None;
    }
    let text = match new.monthly_micros.cmp(&old_micros) {
        std::cmp::Ordering::Greater => format!("+{}", provisioning_providers::prices::format_cents(new.monthly_micros - old_micros)),
        std::cmp::Ordering::Less => format!("-{}", provisioning_providers::prices::format_cents(old_micros - new.monthly_micros)),
        std::cmp::Ordering::Equal => "0.00".to_string(),
    };
    Some((text, new.currency.to_string()))
}

fn finish(
    server: &Server,
    machine: Option<&str>,
    changes: Vec<PlannedChange>,
    delta: Option<(String, String)>,
    carry: Carry,
) -> ServerPlan {
    let (monthly_cost_delta, currency) = delta.unwrap_or_default();
    let id = plan_id(&resource(server), server.metadata.generation, machine, &changes);
    let plan = Plan { id, summary: summary(&changes), changes, monthly_cost_delta, currency, generation: None, inputs: None };
    ServerPlan { plan, carry }
}

/// "no changes", or counts per action in a fixed order: "1 to create, 2 to update, 1 to
/// replace". A resource with several changed fields counts once, under its strongest action.
pub fn summary(changes: &[PlannedChange]) -> String {
    let mut strongest: std::collections::BTreeMap<&str, ChangeAction> = std::collections::BTreeMap::new();
    for c in changes.iter().filter(|c| c.action != ChangeAction::NoOp) {
        let entry = strongest.entry(c.resource.as_str()).or_insert(c.action);
        *entry = (*entry).max(c.action);
    }
    let parts: Vec<String> = [ChangeAction::Create, ChangeAction::Update, ChangeAction::Replace, ChangeAction::Delete]
        .into_iter()
        .filter_map(|action| {
            let n = strongest.values().filter(|a| **a == action).count();
            (n > 0).then(|| format!("{n} to {}", action.verb()))
        })
        .collect();
    if parts.is_empty() { "no changes".into() } else { parts.join(", ") }
}

/// A short stable hash of the resource, the spec generation and the machine it is planned
/// against, and the changes (whose from/to carry the desired and observed values): the same
/// inputs give the same id on every reconcile, in every controller and in `provisioning plan`
/// (a dry-run apply reports the generation the apply would give). The generation makes an
/// approval single-use per spec: a later spec change that plans the same changes (a second
/// config change re-installs the same servers) has a new id, so the old approval is stale.
pub fn plan_id(who: &str, generation: Option<i64>, machine: Option<&str>, changes: &[PlannedChange]) -> String {
    let mut hash = Sha256::new();
    hash.update(who.as_bytes());
    hash.update([0]);
    hash.update(generation.unwrap_or_default().to_le_bytes());
    hash.update([0]);
    hash.update(machine.unwrap_or_default().as_bytes());
    for c in changes {
        for part in [c.resource.as_str(), c.field.as_str(), c.action.verb(), c.from.as_str(), c.to.as_str()] {
            hash.update([0]);
            hash.update(part.as_bytes());
        }
    }
    hash.finalize().iter().take(5).map(|b| format!("{b:02x}")).collect()
}

pub use crate::approval::Gate;

/// The approval in force: the Server's own, else its Workspace's (Automatic by default).
/// A Cluster writes its own approval into the Servers it makes.
pub fn approval(server: &Server, workspace_default: Option<Approval>) -> Approval {
    crate::approval::approval_of(server.spec.approval, workspace_default)
}

/// Whether `plan` may be carried out now: a plan carried out at once
/// ([`crate::approval::gate_once`]); the approval of the plan carried out last
/// (`status.lastAppliedPlan`) is not stale.
pub fn gate(server: &Server, approval: Approval, plan: &Plan) -> Gate {
    let annotation = server.annotations().get(ANNOTATION_APPROVE).map(String::as_str);
    let last = server.status.as_ref().and_then(|s| s.last_applied_plan.as_deref());
    crate::approval::gate_once(approval, annotation, plan, last)
}

use kube::ResourceExt;
