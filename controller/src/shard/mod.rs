//! Sharded controllers: N replicas split the objects by namespace (one Workspace claims one
//! namespace, [`crate::effective_workspace`]), with `sharding = true` in the config (off by
//! default: one leader acts, [`crate::leader`]).
//!
//! - **Membership** is the set of live Leases labelled [`MEMBER_LABEL`] in the lease
//!   namespace: each replica holds `provisioning-shard-<identity>` and renews it every
//!   `lease_renew_secs / 2` (the assignment's period too); a Lease not renewed within its
//!   duration is dead. A replica that
//!   cannot renew for `duration - renew` stops (the process exits) before anyone may treat
//!   it as dead, as the leader does.
//! - **Assignment** is [`ring::assign`] over the live members and the shard keys (every
//!   namespace a Workspace claims or an object lives in): a consistent-hash ring with bounded
//!   loads. Every replica computes it from the same inputs.
//! - **Ownership** is the label [`LABEL`]`=<identity>` on the Workspace and on every Server,
//!   TaskServ and Cluster of its namespace. Each replica's watches select its own label
//!   server-side ([`Scope::config`]; the embedded control plane serves them from its label
//!   index), and a reconcile runs only on an object carrying the replica's label in a
//!   namespace it is not handing over ([`Shard::enter`]).
//! - **Who writes the label.** Only the holder: a replica relabels objects that carry its
//!   own label, and nobody else's while their Lease is live. An object without a label, or
//!   labelled by a dead replica, is claimed by the namespace's live holder (a live replica
//!   labelling other objects of the namespace) or, when there is none, by the replica the
//!   ring assigns the namespace to. Every label write is guarded by resourceVersion.
//! - **Hand-over.** When the ring moves a namespace away from its holder, the holder drains
//!   it: no reconcile starts there any more, and once those in flight have ended it relabels
//!   the namespace's objects to the new owner — that write is its acknowledgement, made only
//!   after the drain; the new owner's watch then brings them in. Its own stale cached copies
//!   are older than the relabel, which [`crate::context::Context::is_stale`] refuses. A dead
//!   holder (Lease expired) acknowledges nothing: the new owner relabels at once, within
//!   `lease_duration + lease_renew / 2` of the death (11 s with the defaults).
//!
//! The Workspace cache stays unfiltered (every replica resolves any namespace's settings, as
//! before), and the shard loop keeps metadata-only caches of every Server, TaskServ and
//! Cluster to see unlabelled objects and the namespaces' holders.

pub mod assign;
pub mod ring;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::runtime::watcher;

/// The label saying which replica owns an object.
pub const LABEL: &str = "provisioning.dev/shard";
/// The label on every shard member's Lease.
pub const MEMBER_LABEL: &str = "provisioning.dev/shard-member";
/// Prefix of a member's Lease name.
pub const LEASE_PREFIX: &str = "provisioning-shard-";

/// A replica identity usable as a label value and in a Lease name: lower-case letters,
/// digits and `-`, at most 63 characters (a longer one keeps its start and a hash of all).
pub fn label_value(identity: &str) -> String {
    let clean: String = identity
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_string();
    let clean = if clean.is_empty() { "replica".to_string() } else { clean };
    if clean.len() <= 40 {
        return clean;
    }
    format!("{}-{:016x}", clean[..23].trim_end_matches('-'), ring::hash(identity))
}

/// What a replica's watches select: everything (one replica) or objects carrying its shard
/// label (sharded).
#[derive(Clone, Debug, Default)]
pub struct Scope {
    identity: Option<String>,
}

impl Scope {
    /// Every object (the default, single-leader mode).
    pub fn all() -> Self {
        Scope { identity: None }
    }

    /// The objects labelled with `identity` (a [`label_value`]).
    pub fn of(identity: &str) -> Self {
        Scope { identity: Some(identity.to_string()) }
    }

    /// A watcher config selecting this scope server-side.
    pub fn config(&self) -> watcher::Config {
        match &self.identity {
            Some(id) => watcher::Config::default().labels(&format!("{LABEL}={id}")),
            None => watcher::Config::default(),
        }
    }
}

/// This replica's shard state: which namespaces it is handing over and the reconciles in
/// flight per namespace (the gate every reconcile passes, [`Shard::enter`]).
#[derive(Debug)]
pub struct Shard {
    /// This replica's identity (the label value).
    pub identity: String,
    gate: Mutex<Gate>,
}

#[derive(Debug, Default)]
struct Gate {
    draining: HashSet<String>,
    in_flight: HashMap<String, usize>,
}

/// Why a reconcile may not start on this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The object carries another replica's label, or none yet (its label change is a watch
    /// event that brings it back).
    NotMine,
    /// Its namespace is being handed over (it will leave this replica's watch, or the
    /// namespace comes back and it is looked at again).
    Draining,
}

/// A reconcile in flight in one namespace; ends when dropped.
#[derive(Debug)]
pub struct InFlight {
    shard: Arc<Shard>,
    namespace: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut gate = self.shard.lock();
        if let Some(n) = gate.in_flight.get_mut(&self.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                gate.in_flight.remove(&self.namespace);
            }
        }
    }
}

impl Shard {
    /// The shard state of replica `identity`.
    pub fn new(identity: &str) -> Arc<Self> {
        Arc::new(Shard { identity: identity.to_string(), gate: Mutex::new(Gate::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a reconcile of an object with `labels` in `namespace` (a Workspace: the one it
    /// claims) start, or says why not: the object must carry this replica's label and the
    /// namespace must not be handed over. The returned guard counts it in flight until dropped.
    pub fn enter(self: &Arc<Self>, labels: &BTreeMap<String, String>, namespace: &str) -> Result<InFlight, Refused> {
        if labels.get(LABEL) != Some(&self.identity) {
            return Err(Refused::NotMine);
        }
        let mut gate = self.lock();
        if gate.draining.contains(namespace) {
            return Err(Refused::Draining);
        }
        *gate.in_flight.entry(namespace.to_string()).or_default() += 1;
        Ok(InFlight { shard: self.clone(), namespace: namespace.to_string() })
    }

    /// Counts work a reconcile started in `namespace` and left running after it returned (a
    /// TaskServ's script run) as in flight until the guard is dropped, so a hand-over waits
    /// for it too. Only from inside an admitted reconcile (its own guard still held).
    pub fn hold(self: &Arc<Self>, namespace: &str) -> InFlight {
        *self.lock().in_flight.entry(namespace.to_string()).or_default() += 1;
        InFlight { shard: self.clone(), namespace: namespace.to_string() }
    }

    /// Stops starting reconciles in `namespace`; true once none is in flight there.
    fn drain(&self, namespace: &str) -> bool {
        let mut gate = self.lock();
        gate.draining.insert(namespace.to_string());
        !gate.in_flight.contains_key(namespace)
    }

    /// Reconciles may start in `namespace` again (the ring gave it back).
    fn undrain(&self, namespace: &str) {
        self.lock().draining.remove(namespace);
    }

    /// Namespaces being handed over now.
    pub fn draining(&self) -> BTreeSet<String> {
        self.lock().draining.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_admits_only_own_objects_outside_draining_namespaces() {
        let shard = Shard::new("r1");
        let mine: BTreeMap<String, String> = [(LABEL.to_string(), "r1".to_string())].into();
        let theirs: BTreeMap<String, String> = [(LABEL.to_string(), "r2".to_string())].into();
        assert_eq!(shard.enter(&theirs, "ns").err(), Some(Refused::NotMine));
        assert_eq!(shard.enter(&BTreeMap::new(), "ns").err(), Some(Refused::NotMine));
        let guard = shard.enter(&mine, "ns");
        assert!(guard.is_ok());
        assert!(!shard.drain("ns"), "one reconcile in flight");
        assert_eq!(shard.enter(&mine, "ns").err(), Some(Refused::Draining), "no new reconcile while draining");
        let other = shard.enter(&mine, "other");
        assert!(other.is_ok(), "other namespaces go on");
        drop(guard);
        assert!(shard.drain("ns"), "drained once its own reconcile ended (another namespace's does not count)");
        drop(other);
        shard.undrain("ns");
        // Work a reconcile left running (a script run) holds the drain too.
        let visit = shard.enter(&mine, "ns");
        let run = shard.hold("ns");
        drop(visit);
        assert!(!shard.drain("ns"), "the script run is still in flight");
        drop(run);
        assert!(shard.drain("ns"));
        shard.undrain("ns");
        assert!(shard.enter(&mine, "ns").is_ok());
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("Host_1-42-00ab"), "host-1-42-00ab");
        let long = label_value(&"x".repeat(200));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(label_value(&"x".repeat(200)), label_value(&"x".repeat(201)));
        assert_eq!(label_value("--"), "replica");
    }
}
