//! Step 1: finished script runs ([`OperationResult`]s) into the per-server entries, with their
//! events; a failed upgrade under `rollbackOnFailure` starts the rollback.

use super::model::{
    Observed, Operation, OperationResult, PlannedEvent, REASON_CONFIG_CHANGED, ServerPhase, WHILE_INSTALLING, Work, tail_lines,
};

/// Records every finished operation of this pass.
pub(super) fn record_results(o: &Observed<'_>, work: &mut Work) {
    for r in o.results {
        match &r.operation {
            Operation::Install { version, .. } if r.succeeded => installed(o, work, r, version),
            Operation::Install { version, .. } => install_failed(o, work, r, version),
            Operation::Check => checked(o, work, r),
            Operation::Remove => removed(o, work, r),
        }
    }
}

/// The entry of the result's server, created `Pending` when status had none.
fn entry<'w>(work: &'w mut Work, r: &OperationResult) -> &'w mut provisioning_crds::TaskServServerStatus {
    work.entries.entry(r.server.clone()).or_insert_with(|| ServerPhase::Pending.entry(&r.server))
}

fn installed(o: &Observed<'_>, work: &mut Work, r: &OperationResult, version: &str) {
    let e = entry(work, r);
    e.last_run = Some(r.run.clone());
    e.last_failure = None;
    ServerPhase::Installed.set(e);
    e.version = Some(version.to_string());
    e.healthy = Some(true);
    // The install rendered every config file again (and its check passed).
    e.drifted_files.clear();
    // An input changed while this install ran: it ran with the old value.
    let again = e.reinstall_reason.take().and_then(|r| r.strip_suffix(WHILE_INSTALLING).map(str::to_string));
    if let Some(reason) = again {
        ServerPhase::Pending.set(e);
        e.reinstall_reason = Some(reason);
    }
    // A Secret rotated while this install ran: it used the old values.
    let current = o.validated.as_ref().ok().and_then(|v| v.inputs_hash.as_ref());
    if current.is_some() && r.inputs_hash.as_ref() != current {
        ServerPhase::Pending.set(e);
        e.reinstall_reason = Some("configFrom changed during the install".into());
    }
    work.events.push(PlannedEvent::normal("Installed", format!("{} {version} installed on {}", o.spec.service, r.server)));
}

fn install_failed(o: &Observed<'_>, work: &mut Work, r: &OperationResult, version: &str) {
    let tail = r.run.output_tail.clone().unwrap_or_default();
    let e = entry(work, r);
    e.last_run = Some(r.run.clone());
    e.last_failure = Some(r.run.clone());
    ServerPhase::Failed.set(e);
    e.healthy = r.healthy.map(|_| false);
    if r.healthy.is_some() {
        // install.nu succeeded but the check after it failed.
        e.version = Some(version.to_string());
    }
    work.events.push(PlannedEvent::warning(
        "InstallFailed",
        format!("{} {version} failed on {}: {}\n{}", o.spec.service, r.server, r.message, tail_lines(&tail, 10)),
    ));
    let last_good = o.status.last_good_version.as_deref();
    let is_upgrade = last_good.is_some_and(|g| g != version);
    let desired_version = o.validated.as_ref().ok().map(|v| v.version.as_str());
    if o.spec.rollback_on_failure && is_upgrade && desired_version == Some(version) && work.upgrade_failure.is_none() {
        let good = last_good.unwrap_or_default();
        let msg = format!("upgrade of {} to {version} failed on {}: {}; rolling back to {good}", o.spec.service, r.server, r.message);
        work.events.push(PlannedEvent::warning("RollingBack", msg.clone()));
        work.upgrade_failure = Some(msg);
        work.rollback_now = true;
    }
}

fn checked(o: &Observed<'_>, work: &mut Work, r: &OperationResult) {
    let tail = r.run.output_tail.clone().unwrap_or_default();
    let healthy = r.healthy.unwrap_or(false);
    let e = entry(work, r);
    let was_unhealthy = e.healthy == Some(false);
    if healthy {
        e.last_failure = None;
    } else {
        e.last_run = Some(r.run.clone());
        e.last_failure = Some(r.run.clone());
    }
    e.healthy = Some(healthy);
    if !r.drifted_files.is_empty() {
        // Config drift: unhealthy, so the install runs again and renders the files anew.
        let newly = e.drifted_files != r.drifted_files;
        e.drifted_files = r.drifted_files.clone();
        if newly {
            let files = r.drifted_files.join(", ");
            work.events.push(PlannedEvent::warning(
                REASON_CONFIG_CHANGED,
                format!("config of {} changed on {} since install: {files}; re-installing to render it again", o.spec.service, r.server),
            ));
        }
        return;
    }
    if !healthy && !was_unhealthy {
        work.events.push(PlannedEvent::warning(
            "Unhealthy",
            format!("{} health check failed on {}: {}\n{}", o.spec.service, r.server, r.message, tail_lines(&tail, 10)),
        ));
    }
}

fn removed(o: &Observed<'_>, work: &mut Work, r: &OperationResult) {
    if r.succeeded {
        work.events.push(PlannedEvent::normal("Removed", format!("{} removed from {}", o.spec.service, r.server)));
        work.entries.remove(&r.server);
        return;
    }
    let tail = r.run.output_tail.clone().unwrap_or_default();
    let e = entry(work, r);
    ServerPhase::Failed.set(e);
    e.last_run = Some(r.run.clone());
    e.last_failure = Some(r.run.clone());
    work.events.push(PlannedEvent::warning(
        "RemoveFailed",
        format!("{} remove failed on {}: {}\n{}", o.spec.service, r.server, r.message, tail_lines(&tail, 10)),
    ));
}
