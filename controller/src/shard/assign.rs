//! Membership (the member Leases) and assignment (the ring, the shard labels, the
//! hand-over) of [`crate::shard`]: the loop each sharded replica runs beside its controllers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, ObjectMeta, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use provisioning_crds::{Cluster, Server, TaskServ, Workspace};

use super::{LABEL, LEASE_PREFIX, MEMBER_LABEL, Shard, ring};
use crate::context::Context;
use crate::effective_workspace::claimed_namespace;
use crate::slim::SlimApi;
use crate::sync::CacheSync;

/// Lease timing of the shard members.
#[derive(Clone, Debug)]
pub struct Membership {
    /// Namespace of the members' Leases.
    pub namespace: String,
    /// Validity of a Lease without renewal.
    pub duration: Duration,
    /// Renewal interval (also the assignment loop's period).
    pub renew: Duration,
}

/// Why the shard loop ended.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The member Lease could not be renewed in time: this replica stops acting.
    #[error("could not renew the shard Lease {0} within its duration")]
    Lost(String),
}

/// The metadata caches of every object (unfiltered), for unlabelled objects and holders.
struct Everything {
    servers: reflector::Store<PartialObjectMeta<Server>>,
    taskservs: reflector::Store<PartialObjectMeta<TaskServ>>,
    clusters: reflector::Store<PartialObjectMeta<Cluster>>,
    /// Nothing is decided before all three hold their initial list (a missing namespace
    /// would change this replica's view of the ring's keys).
    synced: CacheSync,
}

const EVERY_SERVER: &str = "shard: every Server";
const EVERY_TASKSERV: &str = "shard: every TaskServ";
const EVERY_CLUSTER: &str = "shard: every Cluster";

fn everything_of<K>(client: &Client, synced: &CacheSync, name: &'static str) -> reflector::Store<PartialObjectMeta<K>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let watch = crate::decode::watch::<PartialObjectMeta<K>>(client, watcher::Config::default().any_semantic());
    let stream = synced.track(name, reflector::reflector(writer, watch)).default_backoff().for_each(|_| futures::future::ready(()));
    tokio::spawn(stream);
    reader
}

/// One object as the assignment sees it.
#[derive(Clone, Debug)]
struct Item {
    kind: &'static str,
    namespace: Option<String>,
    name: String,
    key: String,
    label: Option<String>,
    uid: String,
    resource_version: Option<String>,
}

impl Item {
    fn of(kind: &'static str, meta: &ObjectMeta, key: String) -> Item {
        Item {
            kind,
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
            key,
            label: meta.labels.as_ref().and_then(|l| l.get(LABEL).cloned()),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
        }
    }
}

/// A label write the assignment decided: the object `item` gets `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Relabel {
    index: usize,
    to: String,
}

/// What one round of the assignment decides for replica `me` (pure): the relabels to write,
/// the namespaces to drain (handed over, waiting for their reconciles) and the ones to
/// open again.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    relabels: Vec<Relabel>,
    drain: BTreeSet<String>,
    open: BTreeSet<String>,
}

fn plan(me: &str, live: &BTreeSet<String>, items: &[Item], idle: &dyn Fn(&str) -> bool) -> Plan {
    let keys: BTreeSet<&str> = items.iter().map(|i| i.key.as_str()).collect();
    let members: Vec<&str> = live.iter().map(String::as_str).collect();
    let keys_vec: Vec<&str> = keys.iter().copied().collect();
    let target = ring::assign(&members, &keys_vec, ring::LOAD_FACTOR);
    // The live holders of each key.
    let mut holders: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for item in items {
        if let Some(label) = item.label.as_deref().filter(|l| live.contains(*l)) {
            holders.entry(item.key.as_str()).or_default().insert(label);
        }
    }
    let mut out = Plan::default();
    for key in &keys {
        let Some(to) = target.get(key).copied() else { continue };
        let mine = holders.get(key).is_some_and(|h| h.contains(me));
        if to == me {
            out.open.insert((*key).to_string());
        } else if mine {
            out.drain.insert((*key).to_string());
        }
    }
    for (index, item) in items.iter().enumerate() {
        let Some(to) = target.get(item.key.as_str()).copied() else { continue };
        let live_label = item.label.as_deref().filter(|l| live.contains(*l));
        match live_label {
            // Mine, and the ring moved it: hand over once the namespace has drained.
            Some(l) if l == me && to != me => {
                if idle(&item.key) {
                    out.relabels.push(Relabel { index, to: to.to_string() });
                }
            }
            Some(_) => {}
            // Unlabelled, or its holder is dead: the namespace's live holder claims it (one
            // of them, the lowest), else the ring's choice.
            None => {
                let claimer = holders.get(item.key.as_str()).and_then(|h| h.iter().next().copied()).unwrap_or(to);
                if claimer == me && item.label.as_deref() != Some(me) {
                    out.relabels.push(Relabel { index, to: me.to_string() });
                }
            }
        }
    }
    out
}

/// Runs this replica's membership and assignment until its Lease cannot be renewed (an
/// error) or `shutdown` (its Lease is deleted, so the others take over at once).
pub async fn run(ctx: Arc<Context>, shard: Arc<Shard>, membership: Membership) -> ShardError {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &membership.namespace);
    // Renewal runs beside the assignment (a slow round of relabels never delays it), every
    // half renewal period: a dead member is noticed within half a period of its Lease running
    // out.
    let period = (membership.renew / 2).max(Duration::from_millis(500));
    tokio::select! {
        lost = hold(&leases, &shard.identity, &membership, period) => lost,
        () = assign(&ctx, &shard, &leases, period) => unreachable_end(),
    }
}

/// `assign` loops for ever; this satisfies the type of the `select!` arm.
fn unreachable_end() -> ShardError {
    ShardError::Lost("(the assignment loop ended)".into())
}

/// Renews this replica's member Lease every `period` until it could not for
/// `duration - renew - period` (each attempt bounded by `period`); returns then, at most
/// `duration - renew` after the last renewal, before any other replica may see the Lease as
/// dead (the Lease's renewTime is taken before the call that renewed it).
async fn hold(leases: &Api<Lease>, identity: &str, membership: &Membership, period: Duration) -> ShardError {
    let lease_name = format!("{LEASE_PREFIX}{identity}");
    let fence = membership.duration.saturating_sub(membership.renew + period);
    let mut last_renewal = Instant::now();
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let error = match tokio::time::timeout(period, renew(leases, &lease_name, identity, membership.duration)).await {
            Ok(Ok(())) => {
                last_renewal = Instant::now();
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {period:?}"),
        };
        tracing::warn!(lease = %lease_name, %error, "could not renew the shard Lease");
        if last_renewal.elapsed() >= fence {
            return ShardError::Lost(lease_name);
        }
    }
}

/// The assignment loop: every `period`, the live members, then one [`round`].
async fn assign(ctx: &Arc<Context>, shard: &Arc<Shard>, leases: &Api<Lease>, period: Duration) {
    let synced = CacheSync::new(&[EVERY_SERVER, EVERY_TASKSERV, EVERY_CLUSTER]);
    let everything = Everything {
        servers: everything_of::<Server>(&ctx.client, &synced, EVERY_SERVER),
        taskservs: everything_of::<TaskServ>(&ctx.client, &synced, EVERY_TASKSERV),
        clusters: everything_of::<Cluster>(&ctx.client, &synced, EVERY_CLUSTER),
        synced,
    };
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_live = BTreeSet::new();
    loop {
        interval.tick().await;
        let live = match live_members(leases).await {
            // This replica counts as a member once its own Lease is there.
            Ok(live) if live.contains(&shard.identity) => live,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "could not list the shard members' Leases; assignment unchanged this round");
                continue;
            }
        };
        if live != last_live {
            tracing::info!(members = ?live, "shard members changed");
            last_live = live.clone();
        }
        // Nothing is assigned before every cache holds its initial list: an unsynced cache
        // would make objects look unlabelled.
        if !ctx.stores.synced.is_synced() || !everything.synced.is_synced() {
            continue;
        }
        round(ctx, shard, &everything, &live).await;
    }
}

/// One assignment round: decide, drain, relabel, report.
async fn round(ctx: &Context, shard: &Arc<Shard>, everything: &Everything, live: &BTreeSet<String>) {
    let items = collect(ctx, everything);
    // Draining is decided inside the plan: a namespace handed over stops starting reconciles
    // there first, and its objects are relabelled once none is in flight.
    let decided = plan(&shard.identity, live, &items, &|ns| shard.drain(ns));
    for ns in &decided.drain {
        if shard.drain(ns) {
            tracing::debug!(namespace = %ns, "namespace drained");
        }
    }
    for ns in &decided.open {
        shard.undrain(ns);
    }
    for relabel in &decided.relabels {
        let Some(item) = items.get(relabel.index) else { continue };
        match write_label(ctx, item, &relabel.to).await {
            Ok(rv) => {
                if let Some(rv) = rv {
                    ctx.note_written_version(&item.uid, rv);
                }
                let from = item.label.as_deref().unwrap_or("(none)");
                tracing::info!(kind = item.kind, namespace = %item.namespace.as_deref().unwrap_or(""), name = %item.name, %from, to = %relabel.to, "shard label written");
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => tracing::warn!(kind = item.kind, name = %item.name, error = %e, "could not write the shard label"),
        }
    }
    report(ctx, &shard.identity, &items);
}

fn collect(ctx: &Context, everything: &Everything) -> Vec<Item> {
    let mut items = Vec::new();
    for ws in ctx.stores.workspaces.state() {
        items.push(Item::of("Workspace", &ws.metadata, claimed_namespace(&ws)));
    }
    let namespaced = |kind: &'static str, meta: &ObjectMeta| Item::of(kind, meta, meta.namespace.clone().unwrap_or_default());
    items.extend(everything.servers.state().iter().map(|o| namespaced("Server", &o.metadata)));
    items.extend(everything.taskservs.state().iter().map(|o| namespaced("TaskServ", &o.metadata)));
    items.extend(everything.clusters.state().iter().map(|o| namespaced("Cluster", &o.metadata)));
    items
}

/// Writes `LABEL=to` on the object, guarded by the resourceVersion the decision saw; returns
/// the written resourceVersion.
async fn write_label(ctx: &Context, item: &Item, to: &str) -> Result<Option<u64>, kube::Error> {
    let patch = serde_json::json!({"metadata": {"labels": {LABEL: to}, "resourceVersion": item.resource_version}});
    let params = PatchParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() };
    let ns = item.namespace.clone().unwrap_or_default();
    let client = ctx.client.clone();
    // The answer is the live object, decoded slim (crate::slim): a tenant can make it large.
    let api = match item.kind {
        "Workspace" => SlimApi::of::<Workspace>(client, None),
        "Server" => SlimApi::of::<Server>(client, Some(&ns)),
        "TaskServ" => SlimApi::of::<TaskServ>(client, Some(&ns)),
        _ => SlimApi::of::<Cluster>(client, Some(&ns)),
    };
    let written = api.patch(&item.name, &params, &Patch::Merge(&patch)).await?;
    Ok(written.resource_version().and_then(|rv| rv.parse().ok()))
}

/// Objects and namespaces this replica holds, on /metrics.
fn report(ctx: &Context, me: &str, items: &[Item]) {
    let mut by_kind: BTreeMap<&str, i64> = ["Workspace", "Server", "TaskServ", "Cluster"].into_iter().map(|k| (k, 0)).collect();
    let mut keys = BTreeSet::new();
    for item in items.iter().filter(|i| i.label.as_deref() == Some(me)) {
        *by_kind.entry(item.kind).or_default() += 1;
        keys.insert(item.key.as_str());
    }
    for (kind, n) in by_kind {
        ctx.metrics.shard_objects.get_or_create(&crate::metrics::ShardLabels { shard: me.to_string(), kind: kind.to_string() }).set(n);
    }
    #[expect(clippy::cast_possible_wrap, reason = "small counts")]
    ctx.metrics.shard_namespaces.set(keys.len() as i64);
}

/// Creates or renews this replica's member Lease.
async fn renew(leases: &Api<Lease>, name: &str, identity: &str, duration: Duration) -> Result<(), kube::Error> {
    let now = MicroTime(Timestamp::now());
    let secs = i32::try_from(duration.as_secs()).unwrap_or(10);
    let spec = LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(secs),
        renew_time: Some(now.clone()),
        ..Default::default()
    };
    let params = PostParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() };
    match leases.get_opt(name).await? {
        Some(mut lease) => {
            let current = lease.spec.get_or_insert_with(LeaseSpec::default);
            current.holder_identity = spec.holder_identity;
            current.lease_duration_seconds = spec.lease_duration_seconds;
            current.renew_time = spec.renew_time;
            leases.replace(name, &params, &lease).await.map(drop)
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some([(MEMBER_LABEL.to_string(), "true".to_string())].into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec { acquire_time: Some(now), ..spec }),
            };
            leases.create(&params, &lease).await.map(drop)
        }
    }
}

/// The identities holding a live member Lease. Leases dead for an hour (a replica killed
/// without its graceful stop) are deleted on the way.
async fn live_members(leases: &Api<Lease>) -> Result<BTreeSet<String>, kube::Error> {
    let now = Timestamp::now();
    let list = leases.list(&ListParams::default().labels(&format!("{MEMBER_LABEL}=true"))).await?;
    let mut live = BTreeSet::new();
    for lease in list.items {
        let name = lease.name_any();
        let Some(spec) = lease.spec else { continue };
        if !expired(&spec, now) {
            live.extend(spec.holder_identity);
        } else if expired(&spec, now - SignedDuration::from_hours(1)) {
            let _ = leases.delete(&name, &Default::default()).await;
        }
    }
    Ok(live)
}

/// Whether a Lease's term has run out at `now`.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else { return true };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0));
    renewed.0 + SignedDuration::from_secs(secs) < now
}

/// Deletes this replica's member Lease (graceful shutdown): the others take its namespaces
/// over at their next round instead of after the Lease's duration.
pub async fn leave(client: Client, membership: &Membership, identity: &str) {
    let leases: Api<Lease> = Api::namespaced(client, &membership.namespace);
    let _ = leases.delete(&format!("{LEASE_PREFIX}{identity}"), &Default::default()).await;
}

#[cfg(test)]
mod tests;
