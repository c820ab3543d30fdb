//! Act: the provider calls of a Server reconcile, each under the workspace's parallelLimit.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use provisioning_crds::{ANNOTATION_CREATE_PENDING, ANNOTATION_RECONCILE_REQUESTED_AT, LABEL_CLUSTER, Server};
use provisioning_providers::{DeleteOutcome, MachineState, ProviderId, ServerIdentity, ServerObservation, ServerRequest, SharedProvider};

use super::plan::{CleanupStep, Step};
use super::prepare::Prepared;
use super::validate::ValidServer;
use crate::context::Context;
use crate::effective_workspace::EffectiveWorkspace;
use crate::error::Error;
use crate::reconcile::Note;

/// What acting found out.
#[derive(Clone, Debug)]
pub enum Acted {
    /// A recent observation is still good: nothing asked.
    Unchanged,
    /// The machine as observed (or as created).
    Machine(ServerObservation),
    /// `spec.externalID` names no machine.
    ExternalMissing(ProviderId),
    /// `spec.externalID` names a machine this Server may not adopt (see
    /// [`super::validate::check_adoption`]).
    AdoptionRefused(super::validate::Invalid),
    /// The recorded machine drifted (missing, or stopped): record it, then [`remediate`].
    Drifted(super::drift::Drift),
}

/// The identity tagged onto the Server's machine.
pub fn identity(server: &Server) -> Result<ServerIdentity, Error> {
    Ok(ServerIdentity {
        uid: server.metadata.uid.clone().ok_or(Error::MissingField("metadata.uid"))?,
        namespace: server.metadata.namespace.clone().ok_or(Error::MissingField("metadata.namespace"))?,
        name: server.name_any(),
        cluster: server.labels().get(LABEL_CLUSTER).cloned(),
    })
}

/// Fingerprint under which an observation may be reused: same machine, same forced-reconcile
/// token, same generation.
pub(crate) fn fingerprint(server: &Server, id: &ProviderId) -> String {
    let requested = server.annotations().get(ANNOTATION_RECONCILE_REQUESTED_AT).map(String::as_str).unwrap_or("");
    // A new generation (a spec change) is planned against a fresh observation.
    format!("{id}|{requested}|{}", server.metadata.generation.unwrap_or_default())
}

/// Runs `step` for a prepared Server; its Normal events (Created...) go to `events`, published
/// with the visit's report. A new machine authorises `p.login_key`: the Server's own
/// (`spec.sshKeySecretRef`) or, when `None`, the account's.
pub async fn act(
    server: &Server,
    step: Step,
    p: &Prepared,
    ws: &EffectiveWorkspace,
    ctx: &Context,
    events: &mut Vec<Note>,
) -> Result<Acted, Error> {
    let (valid, provider) = (&p.valid, &p.provider);
    let account = valid.account.name.as_str();
    let uid = server.uid().unwrap_or_default();
    let cached = matches!(&step, Step::Observe(id) | Step::Adopt(id)
        if server.status.as_ref().and_then(|s| s.provider_state.as_deref()) == Some("running")
            && ctx.observed_recently(&uid, &fingerprint(server, id), ctx.config.resync().mul_f64(0.8)));
    if !cached {
        ctx.admit(ws)?;
    }
    match step {
        Step::Observe(id) | Step::Adopt(id) => {
            let adopted = !server.spec.external_id.is_empty();
            let running = server.status.as_ref().and_then(|s| s.provider_state.as_deref()) == Some("running");
            let recorded = server.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(id.0.as_str());
            let fp = fingerprint(server, &id);
            if running && recorded && ctx.observed_recently(&uid, &fp, ctx.config.resync().mul_f64(0.8)) {
                return Ok(Acted::Unchanged);
            }
            // An adopted machine is checked by check_adoption below (with its own condition);
            // any other must carry this Server's uid tag: status.providerID is not proof.
            let observed = if adopted {
                ctx.provider_call(ws, provider, account, "observe_server", provider.observe_server(&id)).await?
            } else {
                ctx.provider_call(ws, provider, account, "observe_server", provider.observe_owned(&id, &uid)).await?
            };
            if let Some(drift) = super::drift::detect(server, &id, observed.as_ref(), provider.can_start_servers()) {
                tracing::warn!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %id, reason = drift.reason, "machine drifted");
                ctx.forget_observed(&uid);
                return Ok(Acted::Drifted(drift));
            }
            match observed {
                Some(obs) => {
                    if adopted && let Err(refused) = super::validate::check_adoption(&uid, &obs) {
                        ctx.forget_observed(&uid);
                        return Ok(Acted::AdoptionRefused(refused));
                    }
                    ctx.mark_observed(&uid, &fingerprint(server, &obs.provider_id));
                    Ok(Acted::Machine(obs))
                }
                None if adopted => Ok(Acted::ExternalMissing(id)),
                // Our machine vanished behind our back: drift (detect said so above).
                None => Ok(Acted::Drifted(super::drift::Drift {
                    reason: super::drift::MACHINE_MISSING,
                    machine: id.clone(),
                    message: format!("machine {id} is missing"),
                })),
            }
        }
        Step::FindThenCreate => {
            let who = identity(server)?;
            match ctx.provider_call(ws, provider, account, "find_server", provider.find_server(&who)).await? {
                Some(obs) if obs.state == MachineState::Pending => {
                    // The create was cut short (e.g. a container created but never started
                    // before a crash): ensure_server finds the same machine and finishes it.
                    tracing::info!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %obs.provider_id, "create-pending: found the machine by owner tag, still pending; finishing its create");
                    create(server, p, ws, ctx, false, events).await
                }
                Some(obs) => {
                    tracing::info!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %obs.provider_id, "create-pending: found the machine by owner tag");
                    ctx.mark_observed(&uid, &fingerprint(server, &obs.provider_id));
                    Ok(Acted::Machine(obs))
                }
                None => create(server, p, ws, ctx, false, events).await,
            }
        }
        // The caller wrote the finalizer and create-pending first (Visit::guard).
        Step::Create => create(server, p, ws, ctx, false, events).await,
    }
}

/// Remediates `drift` as a reconcile would: a missing machine is created again (guarded
/// like any create), a stopped one started.
pub async fn remediate(
    server: &Server,
    drift: &super::drift::Drift,
    p: &Prepared,
    ws: &EffectiveWorkspace,
    ctx: &Context,
    events: &mut Vec<Note>,
) -> Result<Acted, Error> {
    if drift.reason != super::drift::MACHINE_STOPPED {
        return create(server, p, ws, ctx, true, events).await;
    }
    let (account, provider) = (p.valid.account.name.as_str(), &p.provider);
    let obs = ctx.provider_call(ws, provider, account, "start_server", provider.start_server(&drift.machine)).await?;
    tracing::info!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %obs.provider_id, "machine started again");
    ctx.mark_observed(&server.uid().unwrap_or_default(), &fingerprint(server, &obs.provider_id));
    Ok(Acted::Machine(obs))
}

/// Changes the machine `id` in place to `valid` (the fields the provider's `in_place` accepts).
pub async fn update(
    server: &Server,
    id: &ProviderId,
    p: &Prepared,
    ws: &EffectiveWorkspace,
    ctx: &Context,
    events: &mut Vec<Note>,
) -> Result<ServerObservation, Error> {
    let (valid, provider) = (&p.valid, &p.provider);
    let request = request(server, valid, None, None, provider)?;
    let obs = ctx.provider_call(ws, provider, &valid.account.name, "update_server", provider.update_server(id, &request)).await?;
    tracing::info!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %obs.provider_id, plan = %obs.plan, "machine changed in place");
    ctx.mark_observed(&server.uid().unwrap_or_default(), &fingerprint(server, &obs.provider_id));
    events.push(Note::normal("Updated", "UpdateMachine", format!("changed machine {id} in place (plan {})", obs.plan)));
    Ok(obs)
}

/// Replaces machine `old`: deletes it first and makes the new one only once it is gone,
/// since the create path finds machines by owner tag (a surviving old machine would be
/// "found" instead of a new one made). The create keeps the create-pending leak guard.
pub async fn replace(
    server: &Server,
    old: &ProviderId,
    p: &Prepared,
    ws: &EffectiveWorkspace,
    ctx: &Context,
    events: &mut Vec<Note>,
) -> Result<Acted, Error> {
    let (account, provider) = (p.valid.account.name.as_str(), &p.provider);
    let uid = server.uid().unwrap_or_default();
    match ctx.provider_call(ws, provider, account, "delete_server", provider.delete_owned(old, &uid)).await? {
        DeleteOutcome::Gone => {}
        DeleteOutcome::InProgress => return Err(Error::InProgress(format!("machine {old} is being deleted to be replaced"))),
    }
    tracing::info!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %old, "machine deleted to be replaced");
    ctx.forget_observed(&server.uid().unwrap_or_default());
    events.push(Note::normal("Replacing", "ReplaceMachine", format!("deleted machine {old}; creating its replacement")));
    create(server, p, ws, ctx, true, events).await
}

/// The request for `valid`'s machine.
fn request(
    server: &Server,
    valid: &ValidServer,
    login_key: Option<&str>,
    host_key: Option<provisioning_providers::HostKey>,
    provider: &SharedProvider,
) -> Result<ServerRequest, Error> {
    Ok(ServerRequest {
        identity: identity(server)?,
        plan: valid.plan.clone(),
        zone: valid.zone.clone(),
        image: valid.image.clone(),
        // Cloud machines authorise the SSH key task scripts log in with: the Server's own
        // (spec.sshKeySecretRef), else the account's.
        ssh_public_key: login_key.map(str::to_string).or_else(|| provider.ssh_public_key()),
        extra_tags: Default::default(),
        // Checked by validate::instance_profile (aws only, name or ARN).
        instance_profile: server.spec.instance_profile.clone(),
        // Checked by validate::public_ip (cloud providers only).
        public_ip: valid.public_ip,
        // Checked by validate::disks (sizes within bounds, types the provider's).
        disks: valid
            .disks
            .iter()
            .map(|d| provisioning_providers::DiskRequest {
                name: d.name.clone(),
                size_gib: d.size_gib().unwrap_or_default(),
                disk_type: d.disk_type.clone(),
                mount_path: d.mount_path.clone(),
                retain: d.deletion_policy == provisioning_crds::DiskDeletionPolicy::Retain,
            })
            .collect(),
        host_key,
    })
}

async fn create(
    server: &Server,
    p: &Prepared,
    ws: &EffectiveWorkspace,
    ctx: &Context,
    mark_pending: bool,
    events: &mut Vec<Note>,
) -> Result<Acted, Error> {
    let (valid, provider) = (&p.valid, &p.provider);
    if mark_pending {
        // Leak guard: recorded before the call, so a crash mid-call leads to a lookup, not a second machine.
        ctx.set_annotation(server, ANNOTATION_CREATE_PENDING, Some(&Timestamp::now().to_string())).await?;
    }
    // The machine's SSH host key, generated (and kept in the Server's Secret) before the
    // machine exists, so it is pinned before the first connection.
    let host_key = if super::ssh::generates_host_keys(&valid.account) {
        Some(super::ssh::ensure_generated_host_key(&ctx.client, server).await?)
    } else {
        None
    };
    let request = request(server, valid, p.login_key.as_deref(), host_key, provider)?;
    let obs = ctx.provider_call(ws, provider, &valid.account.name, "ensure_server", provider.ensure_server(&request)).await?;
    tracing::info!(namespace = server.namespace().as_deref(), name = %server.name_any(), provider_id = %obs.provider_id, "machine created");
    ctx.mark_observed(&server.uid().unwrap_or_default(), &fingerprint(server, &obs.provider_id));
    events.push(Note::normal(
        "Created",
        "CreateMachine",
        format!("created machine {} at provider account {}", obs.provider_id, valid.account.name),
    ));
    Ok(Acted::Machine(obs))
}

/// Brings the provider's SSH host key pin for the Server's machine in line with the
/// generated key (`generated`, when the controller made one) or else `status.hostKey`
/// (recorded for that same machine only), and returns the key to record; `Err` with a
/// message naming both fingerprints when they differ.
pub fn host_key(
    server: &Server,
    machine: &ProviderId,
    provider: &SharedProvider,
    generated: Option<&str>,
) -> Result<Option<String>, String> {
    if let Some(generated) = generated {
        return super::ssh::pin_generated(provider, machine, generated).map(Some);
    }
    let recorded =
        server.status.as_ref().filter(|s| s.provider_id.as_deref() == Some(machine.0.as_str())).and_then(|s| s.host_key.as_deref());
    super::ssh::restore_pin(provider, machine, recorded)
}

/// Runs the deletion step. `Ok(())` means the machine is gone (or left, for Orphan). Its
/// events go to `events`, published with the cleanup's report.
pub async fn cleanup(
    server: &Server,
    step: CleanupStep,
    account: &str,
    ws: &EffectiveWorkspace,
    provider: &SharedProvider,
    ctx: &Context,
    events: &mut Vec<Note>,
) -> Result<(), Error> {
    let id = match step {
        CleanupStep::Nothing => return Ok(()),
        CleanupStep::Delete(id) => id,
        CleanupStep::FindThenDelete => {
            let who = identity(server)?;
            match ctx.provider_call(ws, provider, account, "find_server", provider.find_server(&who)).await? {
                Some(obs) => obs.provider_id,
                None => return Ok(()),
            }
        }
    };
    if id.0 == server.spec.external_id {
        // An adopted machine: the ownership check again right before the delete (tags may
        // have changed since, and status alone is not proof of a successful adoption).
        let observed = ctx.provider_call(ws, provider, account, "observe_server", provider.observe_server(&id)).await?;
        let Some(observed) = observed else { return Ok(()) };
        if let Err(refused) = super::validate::check_adoption(&server.uid().unwrap_or_default(), &observed) {
            let note = format!("{}; the Server is released and the machine left running", refused.message);
            events.push(Note::warning(refused.reason, "DeleteMachine", note));
            return Ok(());
        }
    }
    let uid = server.uid().unwrap_or_default();
    let deleted = ctx.provider_call(ws, provider, account, "delete_server", provider.delete_owned(&id, &uid)).await;
    // Not this Server's machine (a status.providerID pointing at someone else's): nothing is
    // deleted, and the Server goes without it.
    if let Err(Error::Provider { source: provisioning_providers::ProviderError::NotOwned(message), .. }) = &deleted {
        let message = format!("{message}; the Server is released and the machine left running");
        events.push(Note::warning("MachineNotOwned", "DeleteMachine", message));
        return Ok(());
    }
    match deleted? {
        DeleteOutcome::Gone => {
            events.push(Note::normal("Deleted", "DeleteMachine", format!("deleted machine {id}")));
            Ok(())
        }
        DeleteOutcome::InProgress => Err(Error::InProgress(format!("machine {id} is being deleted"))),
    }
}
