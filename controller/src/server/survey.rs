//! The batched drift survey: machines of providers that cannot follow their machines'
//! events (AWS, UpCloud, simulated) are observed with one list call per provider account and
//! interval ([`provisioning_providers::Provider::survey`]), however many Servers the account
//! holds — the cost grows with accounts, not machines.
//!
//! The survey never acts. For each Server recorded at a surveyed account it either
//! - confirms the machine (listed, in the state the Server's status records): the Server's
//!   last observation is renewed, so its own reconcile skips the per-machine describe call at
//!   resync; or
//! - finds it missing or in another state: the Server is queued through its [`Trigger`] with
//!   its last observation forgotten, and that reconcile observes the machine itself before
//!   concluding anything ([`super::drift::detect`]). A list that lags behind a create (AWS is
//!   eventually consistent) therefore costs one describe call, never a wrong remediation.
//!
//! Accounts whose provider follows machine events ([`super::drift::follow`]) are skipped, as
//! are adopted machines (`spec.externalID`: they may not carry the namespace tag the list is
//! filtered by; their reconcile observes them at each resync) and Servers being deleted.

use std::collections::HashMap;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use provisioning_crds::Server;
use provisioning_providers::{MachineSummary, tags};

use crate::context::Context;
use crate::reconcile::Trigger;

/// What the survey concludes for one Server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Listed in the recorded state: renew the Server's observation.
    Confirmed,
    /// Not listed, or listed in another state than recorded: let the Server look.
    Look(String),
}

/// The Servers of one surveyed account: in `namespace`, recorded at account `account`, with a
/// machine the controller created, not being deleted.
pub fn surveyed<'a>(servers: &'a [Arc<Server>], namespace: &str, account: &str) -> Vec<&'a Arc<Server>> {
    servers
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
        .filter(|s| s.metadata.deletion_timestamp.is_none() && s.spec.external_id.is_empty())
        .filter(|s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.provider.as_deref() == Some(account) && st.provider_id.as_deref().is_some_and(|id| !id.is_empty()))
        })
        .collect()
}

/// Compares one Server's recorded machine with the account's list (pure).
pub fn verdict(server: &Server, listed: &HashMap<&str, &MachineSummary>) -> Verdict {
    let status = server.status.as_ref();
    let id = status.and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
    let recorded = status.and_then(|s| s.provider_state.as_deref()).unwrap_or("unknown");
    match listed.get(id) {
        None => Verdict::Look(format!("machine {id} is not in the account's list")),
        Some(m) if m.state.as_str() == recorded => Verdict::Confirmed,
        Some(m) => Verdict::Look(format!("machine {id} is {} (recorded: {recorded})", m.state.as_str())),
    }
}

/// Runs the survey for ever, every `ctx.config.survey()`; queues Servers through `trigger`.
pub async fn run(ctx: Arc<Context>, trigger: Trigger<Server>) {
    let mut interval = tokio::time::interval(ctx.config.survey());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the caches and providers are not there yet anyway.
    interval.tick().await;
    loop {
        interval.tick().await;
        survey_once(&ctx, &trigger).await;
    }
}

/// Accounts surveyed at once.
const SURVEY_CONCURRENCY: usize = 4;

/// One round over every provider account built so far. Returns the number of list calls made.
/// Accounts are listed a few at a time, each within one survey interval: an account whose
/// endpoint answers slowly (or never finishes paging) delays no other account's survey.
pub async fn survey_once(ctx: &Context, trigger: &Trigger<Server>) -> usize {
    use futures::StreamExt as _;
    let servers = ctx.stores.servers.state();
    let accounts = ctx.providers.cached_accounts();
    // Boxed: a stream of borrowing async fns is otherwise not provably Send (rustc #110338).
    let mut rounds: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send + '_>>> = Vec::with_capacity(accounts.len());
    for (ws, account, provider) in &accounts {
        rounds.push(Box::pin(within_interval(ctx, trigger, &servers, ws, account, provider)));
    }
    futures::stream::iter(rounds).buffer_unordered(SURVEY_CONCURRENCY).fold(0, |total, calls| async move { total + calls }).await
}

/// [`survey_account`] within one survey interval.
async fn within_interval(
    ctx: &Context,
    trigger: &Trigger<Server>,
    servers: &[Arc<Server>],
    ws: &crate::effective_workspace::EffectiveWorkspace,
    account: &str,
    provider: &provisioning_providers::SharedProvider,
) -> usize {
    let deadline = ctx.config.survey();
    match tokio::time::timeout(deadline, survey_account(ctx, trigger, servers, ws, account, provider)).await {
        Ok(calls) => calls,
        Err(_) => {
            tracing::warn!(namespace = %ws.namespace, %account, ?deadline, "drift survey: listing the account's machines took longer than the survey interval; skipped this round");
            1
        }
    }
}

/// Surveys one account: lists its machines in the Workspace's namespace and queues the
/// Servers whose recorded machine differs. Returns the number of list calls made (0 or 1).
async fn survey_account(
    ctx: &Context,
    trigger: &Trigger<Server>,
    servers: &[Arc<Server>],
    ws: &crate::effective_workspace::EffectiveWorkspace,
    account: &str,
    provider: &provisioning_providers::SharedProvider,
) -> usize {
    if provider.machine_event_source().is_some() {
        return 0;
    }
    let mine = surveyed(servers, &ws.namespace, account);
    if mine.is_empty() {
        return 0;
    }
    let filter = [(tags::NAMESPACE.to_string(), ws.namespace.clone())];
    let listed = match ctx.provider_call(ws, provider, account, "survey", provider.survey(&filter)).await {
        Ok(listed) => listed,
        Err(e) => {
            // The Servers' own reconciles observe (and report) at their resync meanwhile.
            tracing::warn!(namespace = %ws.namespace, %account, error = %e, "drift survey: listing the account's machines failed");
            return 1;
        }
    };
    let by_id: HashMap<&str, &MachineSummary> = listed.iter().map(|m| (m.provider_id.0.as_str(), m)).collect();
    for server in mine {
        let uid = server.uid().unwrap_or_default();
        let id = server.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        match verdict(server, &by_id) {
            Verdict::Confirmed => ctx.mark_observed(&uid, &super::act::fingerprint(server, &provisioning_providers::ProviderId(id))),
            Verdict::Look(why) => {
                tracing::info!(
                    namespace = %ws.namespace,
                    name = %server.name_any(),
                    %why,
                    "drift survey: machine differs from the Server's status; checking the Server"
                );
                ctx.forget_observed(&uid);
                trigger.send(ObjectRef::from_obj(server.as_ref()));
            }
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use provisioning_crds::{ServerSpec, ServerStatus};
    use provisioning_providers::{MachineState, ProviderId};

    use super::*;

    fn server(name: &str, account: &str, id: &str, state: &str) -> Arc<Server> {
        let mut s = Server::new(name, ServerSpec::default());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.status = Some(ServerStatus {
            provider: Some(account.into()),
            provider_id: Some(id.into()),
            provider_state: Some(state.into()),
            ..Default::default()
        });
        Arc::new(s)
    }

    #[test]
    fn only_the_accounts_own_created_live_machines_are_surveyed() {
        let mut adopted = (*server("adopted", "a", "aws://i-3", "running")).clone();
        adopted.spec.external_id = "aws://i-3".into();
        let mut deleting = (*server("deleting", "a", "aws://i-4", "running")).clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        let mut other_ns = (*server("elsewhere", "a", "aws://i-5", "running")).clone();
        other_ns.metadata.namespace = Some("other".into());
        let servers = vec![
            server("one", "a", "aws://i-1", "running"),
            server("other-account", "b", "aws://i-2", "running"),
            server("no-machine", "a", "", "running"),
            Arc::new(adopted),
            Arc::new(deleting),
            Arc::new(other_ns),
        ];
        let names: Vec<String> = surveyed(&servers, "ns", "a").iter().map(|s| s.name_any()).collect();
        assert_eq!(names, vec!["one"]);
    }

    #[test]
    fn a_listed_machine_in_its_recorded_state_is_confirmed_anything_else_is_looked_at() {
        let listed = [
            MachineSummary { provider_id: ProviderId("aws://i-1".into()), state: MachineState::Running },
            MachineSummary { provider_id: ProviderId("aws://i-2".into()), state: MachineState::Stopped },
        ];
        let by_id: HashMap<&str, &MachineSummary> = listed.iter().map(|m| (m.provider_id.0.as_str(), m)).collect();
        assert_eq!(verdict(&server("a", "a", "aws://i-1", "running"), &by_id), Verdict::Confirmed);
        assert_eq!(
            verdict(&server("b", "a", "aws://i-2", "running"), &by_id),
            Verdict::Look("machine aws://i-2 is stopped (recorded: running)".into())
        );
        assert_eq!(
            verdict(&server("c", "a", "aws://i-9", "running"), &by_id),
            Verdict::Look("machine aws://i-9 is not in the account's list".into())
        );
        // A machine recorded as pending that now runs is looked at too: its status catches up.
        assert!(matches!(verdict(&server("d", "a", "aws://i-1", "pending"), &by_id), Verdict::Look(_)));
    }
}
