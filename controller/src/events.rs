//! Kubernetes Events with counts for repeats, in little memory.
//!
//! Events are written through core/v1, as client-go's and controller-runtime's recorders do,
//! with `firstTimestamp`, `lastTimestamp` and `count`: `kubectl get events
//! --sort-by=.lastTimestamp` orders them as it does every other controller's, on any API
//! server. (An events.k8s.io/v1 Event has only `eventTime` and `series`, which core/v1 readers
//! see as empty timestamps.) Readers of events.k8s.io/v1 see the same objects with `note`,
//! `regarding` and the `deprecated*` fields.
//!
//! kube-runtime's `Recorder` keeps a full copy of every Event it published for six minutes
//! and sweeps that whole cache on every publish: with 10,000 Servers (a `Created` and a
//! `Ready` Event each) that was ~70 MB of the controller's memory and a quadratic sweep.
//! This publisher keeps, per distinct event, only what a repeat needs — the Event's name,
//! namespace, count and last time — and sweeps expired entries at most once a minute.
//!
//! Semantics follow the Kubernetes event guidelines: the first occurrence creates an Event;
//! the same event again (same object, type, reason, action and note) within six minutes
//! updates that Event's `count` and `lastTimestamp` instead of creating another.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Field manager of every write the controller makes (re-exported by [`crate::context`]).
pub const FIELD_MANAGER: &str = "provisioning-controller";

/// How long a repeat joins the earlier Event's series.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// How often expired entries are swept.
const SWEEP_EVERY: SignedDuration = SignedDuration::from_mins(1);

pub use kube::runtime::events::EventType;

fn type_str(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

#[derive(Clone, Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

#[derive(Debug, Default)]
struct Cache {
    entries: HashMap<u64, Published>,
    swept: Option<Timestamp>,
}

/// Publishes Events as `controller`/`instance`.
pub struct Publisher {
    client: Client,
    controller: String,
    instance: String,
    cache: Mutex<Cache>,
}

/// What to publish about `regarding`.
#[derive(Clone, Debug)]
pub struct Occurrence<'a> {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: &'a str,
    /// CamelCase action (what the controller did or tried).
    pub action: &'a str,
    /// Human-readable note (at most 1 kB; longer notes are cut by the caller).
    pub note: Option<&'a str>,
}

impl Publisher {
    /// A publisher reporting as `controller` (reportingController) and `instance`.
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Publisher { client, controller: controller.into(), instance: instance.into(), cache: Mutex::default() }
    }

    /// How many distinct events are remembered for series (for tests and metrics).
    pub fn remembered(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(&self, what: &Occurrence<'_>, regarding: &ObjectReference) -> u64 {
        let mut h = DefaultHasher::new();
        (what.type_, what.reason, what.action, what.note).hash(&mut h);
        (&regarding.uid, &regarding.namespace, &regarding.name, &regarding.kind, &regarding.api_version).hash(&mut h);
        h.finish()
    }

    /// Publishes `what` about `regarding`: a new Event, or the next count of the same
    /// Event's series when it happened within the last six minutes.
    pub async fn publish(&self, what: &Occurrence<'_>, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = self.key(what, regarding);
        let earlier = {
            let mut cache = self.lock();
            if cache.swept.is_none_or(|at| at + SWEEP_EVERY <= now) {
                cache.entries.retain(|_, p| p.last + SERIES_TTL > now);
                cache.swept = Some(now);
            }
            cache.entries.get(&key).filter(|p| p.last + SERIES_TTL > now).cloned()
        };
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Some(mut p) = earlier {
            p.count += 1;
            p.last = now;
            let patch = json!({"count": p.count, "lastTimestamp": Time(now)});
            match api
                .patch(&p.name, &PatchParams { field_manager: Some(self.controller.clone()), ..Default::default() }, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.lock().entries.insert(key, p);
                    return Ok(());
                }
                // Deleted meanwhile (TTL on the server, or by hand): start a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!("{}.{:x}", regarding.name.as_deref().unwrap_or(&self.controller), now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            type_: Some(type_str(what.type_).into()),
            reason: Some(what.reason.into()),
            action: Some(what.action.into()),
            message: what.note.map(str::to_string),
            involved_object: regarding.clone(),
            source: Some(EventSource { component: Some(self.controller.clone()), host: None }),
            reporting_component: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        api.create(&PostParams { field_manager: Some(self.controller.clone()), ..Default::default() }, &event).await?;
        self.lock().entries.insert(key, Published { name, count: 1, last: now });
        Ok(())
    }
}
