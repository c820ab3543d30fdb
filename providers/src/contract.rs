//! The provider contract suite: the same checks run against every provider implementation
//! (simulated always; local with Docker; aws against moto; upcloud against its test double).

use std::time::{Duration, Instant};

use crate::{
    DeleteOutcome, ExecRequest, MachineState, Provider, ProviderError, ProviderId, ServerIdentity, ServerObservation, ServerRequest,
};

/// How to run the suite against one provider.
#[derive(Clone, Debug)]
pub struct ContractOptions {
    /// A unique prefix for the identities the suite creates.
    pub run_id: String,
    /// Namespace to tag machines with.
    pub namespace: String,
    /// Image to ask for.
    pub image: String,
    /// Zone to ask for ("" for the default).
    pub zone: String,
    /// Whether `exec` runs commands for real (`echo` must print its argument).
    pub real_exec: bool,
    /// How long a machine may take to run, and to go away.
    pub deadline: Duration,
}

/// A failed contract check.
#[derive(Debug, thiserror::Error)]
#[error("provider contract: {0}")]
pub struct ContractViolation(pub String);

fn check(cond: bool, msg: impl Into<String>) -> Result<(), ContractViolation> {
    if cond { Ok(()) } else { Err(ContractViolation(msg.into())) }
}

fn fail(step: &str, e: ProviderError) -> ContractViolation {
    ContractViolation(format!("{step}: {e}"))
}

/// Runs every check of the contract. Leaves no machine behind when it passes. Read top to
/// bottom it is the specification: plans and prices, an idempotent create found by its tags,
/// the machine running with an address, exec, only its own Server may act on it, delete until gone.
pub async fn run(provider: &dyn Provider, opts: &ContractOptions) -> Result<(), ContractViolation> {
    plans_and_prices(provider, opts).await?;
    let (identity, first) = create_once(provider, opts).await?;
    running_with_address(provider, &identity, &first.provider_id, opts.deadline).await?;
    exec_echo(provider, &identity, &first.provider_id, opts.real_exec).await?;
    only_its_server_acts(provider, &identity, &first.provider_id).await?;
    delete_until_gone(provider, &identity, &first.provider_id, opts.deadline).await
}

/// Plans: abstract names resolve, unknown names are invalid requests naming the plan.
/// Prices: each abstract plan has a list price (never decreasing with size) or a reason naming
/// what the price table lacks; never a made-up figure. Credentials validate.
async fn plans_and_prices(provider: &dyn Provider, opts: &ContractOptions) -> Result<(), ContractViolation> {
    let mut last_monthly = 0;
    for plan in crate::plans::ABSTRACT_PLANS {
        let native = provider.resolve_plan(plan).map_err(|e| fail("resolve_plan", e))?;
        match provider.price(&native, &opts.zone) {
            Ok(price) => {
                check(price.monthly_micros >= last_monthly, format!("price of {plan} ({native}) is below the smaller plan's"))?;
                check(price.currency.len() == 3, format!("price of {plan} has currency {:?}", price.currency))?;
                last_monthly = price.monthly_micros;
            }
            Err(why) => check(!why.is_empty(), format!("price of {plan} ({native}) is missing without a reason"))?,
        }
    }
    match provider.resolve_plan("no-such-plan-xyz") {
        Err(ProviderError::InvalidRequest(msg)) => check(msg.contains("no-such-plan-xyz"), "plan error names the plan")?,
        other => return Err(ContractViolation(format!("unknown plan gave {other:?}"))),
    }
    provider.validate_credentials().await.map_err(|e| fail("validate_credentials", e))?;
    Ok(())
}

/// Creates the suite's machine; a second ensure returns the same one; it carries the identity
/// tags and is found and listed by them.
async fn create_once(provider: &dyn Provider, opts: &ContractOptions) -> Result<(ServerIdentity, ServerObservation), ContractViolation> {
    let identity = ServerIdentity {
        uid: format!("{}-uid-0001", opts.run_id),
        namespace: opts.namespace.clone(),
        name: format!("{}-srv", opts.run_id),
        cluster: Some(format!("{}-cl", opts.run_id)),
    };
    let request = ServerRequest {
        identity: identity.clone(),
        plan: "small".into(),
        zone: opts.zone.clone(),
        image: opts.image.clone(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    };
    check(provider.find_server(&identity).await.map_err(|e| fail("find_server", e))?.is_none(), "no machine before create")?;

    let first = provider.ensure_server(&request).await.map_err(|e| fail("ensure_server", e))?;
    for (k, v) in identity.tags() {
        check(first.tags.get(&k) == Some(&v), format!("machine carries tag {k}={v}: {:?}", first.tags))?;
    }
    // Idempotent: the same Server never gets a second machine.
    let second = provider.ensure_server(&request).await.map_err(|e| fail("ensure_server again", e))?;
    check(first.provider_id == second.provider_id, "second ensure_server returns the same machine")?;
    let found = provider.find_server(&identity).await.map_err(|e| fail("find_server", e))?;
    check(found.as_ref().map(|o| &o.provider_id) == Some(&first.provider_id), "find_server finds it by tag")?;
    let listed = provider.list_servers(&identity.tags()).await.map_err(|e| fail("list_servers", e))?;
    check(listed.len() == 1, format!("exactly one machine with the identity tags, got {}", listed.len()))?;
    Ok((identity, first))
}

/// The machine comes up, with an address, and the batched survey sees it running.
async fn running_with_address(
    provider: &dyn Provider,
    identity: &ServerIdentity,
    id: &ProviderId,
    deadline: Duration,
) -> Result<(), ContractViolation> {
    let started = Instant::now();
    let running = loop {
        let obs = provider.observe_server(id).await.map_err(|e| fail("observe_server", e))?;
        match obs {
            Some(o) if o.state == MachineState::Running && !o.addresses.is_empty() => break o,
            _ if started.elapsed() > deadline => {
                return Err(ContractViolation(format!("machine not running with an address after {:?}", deadline)));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    check(!running.plan.is_empty(), "observation names the native plan")?;
    // The batched survey sees it, with the state observe_server reported.
    let surveyed = provider.survey(&identity.tags()).await.map_err(|e| fail("survey", e))?;
    check(
        surveyed.iter().any(|m| m.provider_id == *id && m.state == MachineState::Running),
        format!("survey lists the running machine: {surveyed:?}"),
    )?;
    Ok(())
}

/// `exec` of `echo`: exit code 0, and (for real) its output returned and streamed.
async fn exec_echo(provider: &dyn Provider, identity: &ServerIdentity, id: &ProviderId, real_exec: bool) -> Result<(), ContractViolation> {
    let (tx, mut rx) = crate::OutputSink::channel();
    let result = provider.exec_owned(id, &identity.uid, echo(Some(tx))).await.map_err(|e| fail("exec", e))?;
    check(result.exit_code == Some(0), format!("exec exit code 0, got {:?}", result.exit_code))?;
    if real_exec {
        check(result.stdout.contains("contract-hello"), format!("exec stdout: {:?}", result.stdout))?;
        let mut streamed = Vec::new();
        while let Ok(line) = rx.try_recv() {
            streamed.push(line);
        }
        check(streamed.iter().any(|l| l.contains("contract-hello")), format!("exec streams output: {streamed:?}"))?;
    }
    Ok(())
}

fn echo(output: Option<crate::OutputSink>) -> ExecRequest {
    ExecRequest {
        argv: vec!["echo".into(), "contract-hello".into()],
        stdin: None,
        env: Default::default(),
        timeout: Duration::from_secs(60),
        output,
        ssh_key: None,
    }
}

/// A machine id alone is no authority (issue 26): another Server (another tenant, whose
/// status names this machine) can neither observe, run commands on nor delete it; the
/// machine is still there and running after each attempt.
async fn only_its_server_acts(provider: &dyn Provider, identity: &ServerIdentity, id: &ProviderId) -> Result<(), ContractViolation> {
    let intruder = format!("{}-intruder", identity.uid);
    let refused = |step: &str, r: Result<(), ProviderError>| match r {
        Err(ProviderError::NotOwned(msg)) => {
            check(msg.contains(&id.0) && !msg.contains(&format!("{:?}", identity.uid)), format!("{step}: message {msg:?}"))
        }
        other => Err(ContractViolation(format!("{step} by another Server's uid: expected NotOwned, got {other:?}"))),
    };
    refused("observe_owned", provider.observe_owned(id, &intruder).await.map(|_| ()))?;
    refused("exec_owned", provider.exec_owned(id, &intruder, echo(None)).await.map(|_| ()))?;
    refused("delete_owned", provider.delete_owned(id, &intruder).await.map(|_| ()))?;
    refused("delete_owned without uid", provider.delete_owned(id, "").await.map(|_| ()))?;
    let still = provider.observe_owned(id, &identity.uid).await.map_err(|e| fail("observe_owned by its Server", e))?;
    check(
        still.as_ref().is_some_and(|o| o.state == MachineState::Running),
        format!("the machine is untouched after the refused attempts: {still:?}"),
    )
}

/// Delete, until gone; deleting again is Gone; nothing observes, surveys or finds it after.
async fn delete_until_gone(
    provider: &dyn Provider,
    identity: &ServerIdentity,
    id: &ProviderId,
    deadline: Duration,
) -> Result<(), ContractViolation> {
    let started = Instant::now();
    loop {
        match provider.delete_owned(id, &identity.uid).await.map_err(|e| fail("delete_owned", e))? {
            DeleteOutcome::Gone => break,
            DeleteOutcome::InProgress if started.elapsed() > deadline => {
                return Err(ContractViolation("machine still deleting after deadline".into()));
            }
            DeleteOutcome::InProgress => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let again = provider.delete_server(id).await.map_err(|e| fail("delete again", e))?;
    check(again == DeleteOutcome::Gone, "deleting a deleted machine is Gone")?;
    let after = provider.observe_server(id).await.map_err(|e| fail("observe after delete", e))?;
    check(after.as_ref().is_none_or(|o| o.state == MachineState::Terminated), format!("deleted machine observed as {after:?}"))?;
    let surveyed = provider.survey(&identity.tags()).await.map_err(|e| fail("survey after delete", e))?;
    check(
        surveyed.iter().all(|m| m.provider_id != *id || m.state == MachineState::Terminated),
        format!("survey after delete: {surveyed:?}"),
    )?;
    let left = provider.find_server(identity).await.map_err(|e| fail("find after delete", e))?;
    check(left.is_none(), format!("find_server after delete: {left:?}"))?;
    Ok(())
}

/// The control-plane endpoint contract for providers that support `kind` (a provider that
/// does not must say so from [`Provider::supports_endpoint`] and make nothing): created once
/// for a Cluster uid and found by its tags, pointing at the given machines (a load balancer
/// at all of them, a floating IP at one, kept while it stays a target), re-targeted when a
/// target goes, deleted until not found. `machines` are two or more live machines of the
/// account, in preference order. Leaves nothing behind when it passes.
pub async fn endpoint(
    provider: &dyn Provider,
    kind: crate::EndpointKind,
    machines: &[ProviderId],
    opts: &ContractOptions,
) -> Result<(), ContractViolation> {
    use crate::{EndpointIdentity, EndpointRequest, floating_ip_holder};
    if let Err(why) = provider.supports_endpoint(kind) {
        check(!why.is_empty(), "supports_endpoint: an unsupported kind says why")?;
        let identity =
            EndpointIdentity { cluster_uid: format!("{}-none", opts.run_id), namespace: opts.namespace.clone(), cluster: "c".into() };
        let found = provider.find_endpoint(kind, &identity).await.map_err(|e| fail("find_endpoint (unsupported)", e))?;
        return check(found.is_none(), "an unsupported endpoint kind is never found");
    }
    check(machines.len() >= 2, "endpoint contract: needs two machines")?;
    let identity =
        EndpointIdentity { cluster_uid: format!("{}-endpoint-uid", opts.run_id), namespace: opts.namespace.clone(), cluster: "ep".into() };
    let request = EndpointRequest { identity: identity.clone(), kind, port: 6443, zone: opts.zone.clone(), targets: machines.to_vec() };
    let first = provider.ensure_endpoint(&request).await.map_err(|e| fail("ensure_endpoint", e))?;
    let again = provider.ensure_endpoint(&request).await.map_err(|e| fail("ensure_endpoint (again)", e))?;
    check(first.id == again.id, format!("ensure_endpoint made a second {} ({} then {})", kind.noun(), first.id, again.id))?;
    check(!again.address.is_empty(), format!("the {} has no address", kind.noun()))?;
    let found = provider.find_endpoint(kind, &identity).await.map_err(|e| fail("find_endpoint", e))?;
    check(found.as_ref().map(|f| &f.id) == Some(&first.id), format!("find_endpoint by tags: {found:?}"))?;
    let stranger = EndpointIdentity { cluster_uid: format!("{}-other-uid", opts.run_id), ..identity.clone() };
    let not_mine = provider.find_endpoint(kind, &stranger).await.map_err(|e| fail("find_endpoint (another Cluster)", e))?;
    check(not_mine.is_none(), format!("find_endpoint for another Cluster uid found this one: {not_mine:?}"))?;
    let want_first: Vec<ProviderId> = match kind {
        crate::EndpointKind::LoadBalancer => machines.to_vec(),
        crate::EndpointKind::FloatingIp => floating_ip_holder(None, machines).into_iter().collect(),
    };
    let sorted = |mut v: Vec<ProviderId>| {
        v.sort();
        v
    };
    check(sorted(again.targets.clone()) == sorted(want_first.clone()), format!("targets {:?}, want {want_first:?}", again.targets))?;
    // The first target gone: a load balancer drops it, a floating IP moves to the next.
    let rest = machines[1..].to_vec();
    let moved = provider
        .ensure_endpoint(&EndpointRequest { targets: rest.clone(), ..request.clone() })
        .await
        .map_err(|e| fail("ensure_endpoint (re-target)", e))?;
    check(moved.id == first.id && moved.address == again.address, "re-targeting keeps the endpoint and its address")?;
    let want_moved: Vec<ProviderId> = match kind {
        crate::EndpointKind::LoadBalancer => rest.clone(),
        crate::EndpointKind::FloatingIp => floating_ip_holder(again.targets.first(), &rest).into_iter().collect(),
    };
    check(sorted(moved.targets.clone()) == sorted(want_moved.clone()), format!("re-targeted to {:?}, want {want_moved:?}", moved.targets))?;
    let deadline = Instant::now() + opts.deadline;
    loop {
        match provider.delete_endpoint(kind, &identity).await.map_err(|e| fail("delete_endpoint", e))? {
            DeleteOutcome::Gone => break,
            DeleteOutcome::InProgress => {
                check(Instant::now() < deadline, format!("the {} was not gone in time", kind.noun()))?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let after = provider.find_endpoint(kind, &identity).await.map_err(|e| fail("find_endpoint (after delete)", e))?;
    check(after.is_none(), format!("the {} is still found after delete: {after:?}", kind.noun()))?;
    let twice = provider.delete_endpoint(kind, &identity).await.map_err(|e| fail("delete_endpoint (again)", e))?;
    check(twice == DeleteOutcome::Gone, "deleting a deleted endpoint is Gone")
}
