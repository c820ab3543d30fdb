//! Garbage collection: ownerReference cascades (background, foreground, orphan) and
//! namespace deletion. Driven by the event history, with a full scan on start and whenever
//! the collector falls behind the history window.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::handlers::{Core, DeleteOptions, NAMESPACES, Propagation};
use crate::storage::{Entry, EventType, ObjKey, Precondition};

/// Storage key of Events (served as core/v1 and events.k8s.io/v1).
pub const EVENTS: &str = "/events";

/// When an Event was last written: the latest of its timestamps. kube-apiserver renews an
/// Event's etcd lease on every write; this reads the same instant from the object, so expiry
/// survives a restart.
pub fn event_last_written(ev: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    let mut times: Vec<&Value> = vec![
        &ev["metadata"]["creationTimestamp"],
        &ev["lastTimestamp"],
        &ev["deprecatedLastTimestamp"],
        &ev["firstTimestamp"],
        &ev["eventTime"],
        &ev["series"]["lastObservedTime"],
    ];
    if let Some(mf) = ev["metadata"]["managedFields"].as_array() {
        times.extend(mf.iter().map(|m| &m["time"]));
    }
    times
        .into_iter()
        .filter_map(|t| t.as_str())
        .filter_map(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
        .max()
}

/// Deletes every Event last written more than `ttl` before `now`; returns how many went.
/// `now` is a parameter so that a simulation (the bench) can run a day in seconds.
pub async fn expire_events(core: &Core, now: chrono::DateTime<chrono::Utc>, ttl: Duration) -> usize {
    let Ok(ttl) = chrono::Duration::from_std(ttl) else { return 0 };
    // The entries are shared, and decoded after the store's lock is given back (a long read
    // holds up the writer and every reader behind it), on a blocking thread.
    let events: Vec<Arc<Entry>> = core.store.read().objects.get(EVENTS).map(|m| m.values().cloned().collect()).unwrap_or_default();
    let expired: Vec<Arc<Entry>> = tokio::task::spawn_blocking(move || {
        events.into_iter().filter(|e| event_last_written(&e.value()).is_none_or(|t| t + ttl <= now)).collect()
    })
    .await
    .unwrap_or_default();
    let mut n = 0;
    // Like an etcd lease running out: finalizers do not hold an expired Event. Deletes go in
    // groups so that they share commits (the writer folds queued writes into one).
    for chunk in expired.chunks(256) {
        let deletes = chunk.iter().map(|e| core.store.delete(e.key.clone(), Precondition::Revision(e.rv)));
        n += futures::future::join_all(deletes).await.into_iter().filter(Result::is_ok).count();
    }
    n
}

/// Sweeps expired Events until shutdown, at a tenth of the TTL (between 1 s and 1 min).
async fn run_event_ttl(core: Arc<Core>) {
    let ttl = core.limits.event_ttl;
    let every = (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = core.shutdown.cancelled() => return,
        }
        let n = expire_events(&core, chrono::Utc::now(), ttl).await;
        if n > 0 {
            tracing::debug!(expired = n, "deleted expired events");
        }
    }
}

/// Runs until shutdown.
pub async fn run(core: Arc<Core>) {
    tokio::spawn(run_event_ttl(core.clone()));
    let mut rx = core.store.subscribe();
    let mut last = core.store.current_rv();
    full_scan(&core).await;
    loop {
        let events: Option<Vec<Arc<crate::storage::Event>>> = {
            let st = core.store.read();
            st.events_after(last).map(|it| it.cloned().collect())
        };
        match events {
            None => {
                last = core.store.current_rv();
                full_scan(&core).await;
            }
            Some(evs) => {
                for ev in evs {
                    last = ev.rv;
                    handle_event(&core, ev.kind, &ev.entry).await;
                }
            }
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = core.gc_wakeup.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(30)) => full_scan(&core).await,
            _ = core.shutdown.cancelled() => return,
        }
    }
}

async fn handle_event(core: &Arc<Core>, kind: EventType, e: &Arc<Entry>) {
    match kind {
        EventType::Deleted => {
            let dependents: Vec<ObjKey> = {
                let st = core.store.read();
                st.dependents.get(&e.uid).map(|s| s.iter().cloned().collect()).unwrap_or_default()
            };
            for d in dependents {
                collect_if_orphaned(core, &d).await;
            }
            for o in &e.owners {
                let owner = {
                    let st = core.store.read();
                    st.by_uid.get(&o.uid).and_then(|k| st.get(k).cloned())
                };
                if let Some(owner) = owner
                    && owner.deleting
                {
                    process_deleting(core, &owner).await;
                }
            }
            if !e.key.namespace.is_empty() {
                let ns = core.store.get(&ns_key(&e.key.namespace));
                if let Some(ns) = ns.filter(|n| n.deleting) {
                    process_namespace(core, &ns).await;
                }
            }
        }
        EventType::Added | EventType::Modified => {
            let Some(cur) = core.store.get(&e.key) else { return };
            if cur.rv != e.rv {
                return;
            }
            if cur.deleting {
                process_deleting(core, &cur).await;
            }
            if !cur.owners.is_empty() {
                collect_if_orphaned(core, &cur.key).await;
            }
            // A change of content (a finalizer removed) changes what a Terminating namespace
            // waits for.
            if !cur.key.namespace.is_empty()
                && let Some(ns) = core.store.get(&ns_key(&cur.key.namespace)).filter(|n| n.deleting)
            {
                process_namespace(core, &ns).await;
            }
        }
    }
}

fn ns_key(name: &str) -> ObjKey {
    ObjKey { storage: Arc::from(NAMESPACES), namespace: String::new(), name: name.to_string() }
}

async fn full_scan(core: &Arc<Core>) {
    let all: Vec<Arc<Entry>> = {
        let st = core.store.read();
        st.objects.values().flat_map(|m| m.values().cloned()).collect()
    };
    for e in all {
        if e.deleting {
            process_deleting(core, &e).await;
        }
        if !e.owners.is_empty() {
            collect_if_orphaned(core, &e.key).await;
        }
    }
}

/// Deletes an object whose owners are all gone.
async fn collect_if_orphaned(core: &Arc<Core>, key: &ObjKey) {
    let target = {
        let st = core.store.read();
        match st.get(key) {
            Some(e) if !e.owners.is_empty() && !e.deleting && e.owners.iter().all(|o| !st.by_uid.contains_key(&o.uid)) => Some(e.clone()),
            _ => None,
        }
    };
    if let Some(e) = target {
        delete_entry(core, &e, Propagation::Background).await;
    }
}

async fn delete_entry(core: &Arc<Core>, e: &Arc<Entry>, propagation: Propagation) {
    if let Err(err) = try_delete_entry(core, e, propagation).await {
        tracing::warn!(object = %e.key.name, error = %err, "garbage collection delete failed");
    }
}

/// Deletes one object as the collector does; a 404 or 409 (gone, or changed meanwhile) is
/// not a failure: the next event brings the object back if it still needs deleting.
async fn try_delete_entry(core: &Arc<Core>, e: &Arc<Entry>, propagation: Propagation) -> Result<(), String> {
    let rt = core.registry().by_storage(&e.key.storage);
    match rt {
        Some(rt) => {
            let ns = if rt.namespaced { Some(e.key.namespace.as_str()) } else { None };
            let opts = DeleteOptions { propagation, dry_run: false, uid: Some(e.uid.clone()), resource_version: None };
            match core.delete(&rt, ns, &e.key.name, &opts).await {
                Err(err) if err.code != 404 && err.code != 409 => Err(err.to_string()),
                _ => Ok(()),
            }
        }
        None => {
            let _ = core.store.delete(e.key.clone(), Precondition::Revision(e.rv)).await;
            Ok(())
        }
    }
}

fn dependents_of(core: &Core, uid: &str) -> Vec<Arc<Entry>> {
    let st = core.store.read();
    st.dependents.get(uid).map(|s| s.iter().filter_map(|k| st.get(k).cloned()).collect()).unwrap_or_default()
}

async fn remove_finalizer(core: &Arc<Core>, e: &Arc<Entry>, finalizer: &str) {
    let mut v = e.value();
    if let Some(arr) = v["metadata"]["finalizers"].as_array_mut() {
        arr.retain(|f| f != finalizer);
        if arr.is_empty()
            && let Some(m) = v["metadata"].as_object_mut()
        {
            m.remove("finalizers");
        }
    }
    let _ = core.put_internal(e, v).await;
}

async fn process_deleting(core: &Arc<Core>, e: &Arc<Entry>) {
    if &*e.key.storage == NAMESPACES {
        process_namespace(core, e).await;
        return;
    }
    if e.finalizers.iter().any(|f| f == "orphan") {
        for d in dependents_of(core, &e.uid) {
            for _ in 0..5 {
                let Some(cur) = core.store.get(&d.key) else { break };
                let mut v = cur.value();
                if let Some(arr) = v["metadata"]["ownerReferences"].as_array_mut() {
                    arr.retain(|o| o["uid"].as_str() != Some(e.uid.as_str()));
                    if arr.is_empty()
                        && let Some(m) = v["metadata"].as_object_mut()
                    {
                        m.remove("ownerReferences");
                    }
                }
                if core.put_internal(&cur, v).await.is_ok() {
                    break;
                }
            }
        }
        if let Some(cur) = core.store.get(&e.key) {
            remove_finalizer(core, &cur, "orphan").await;
        }
        return;
    }
    if e.finalizers.iter().any(|f| f == "foregroundDeletion") {
        let deps = dependents_of(core, &e.uid);
        if deps.is_empty() {
            if let Some(cur) = core.store.get(&e.key) {
                remove_finalizer(core, &cur, "foregroundDeletion").await;
            }
            return;
        }
        for d in deps {
            if !d.deleting {
                delete_entry(core, &d, Propagation::Foreground).await;
            }
        }
    }
}

async fn process_namespace(core: &Arc<Core>, ns: &Arc<Entry>) {
    let name = ns.key.name.clone();
    let storages = core.registry().namespaced_storages();
    let contents: Vec<Arc<Entry>> = {
        let st = core.store.read();
        storages
            .iter()
            .filter_map(|s| st.objects.get(s.as_str()))
            .flat_map(|m| m.range((name.clone(), String::new())..).take_while(|((n, _), _)| n == &name).map(|(_, e)| e.clone()))
            .collect()
    };
    if contents.is_empty() {
        if ns.finalizers.is_empty() {
            let _ = core.store.delete(ns.key.clone(), Precondition::Revision(ns.rv)).await;
        } else {
            write_namespace_conditions(core, &ns.key, &NamespaceContent::default()).await;
        }
        return;
    }
    let mut failures = Vec::new();
    for e in &contents {
        if !e.deleting
            && let Err(err) = try_delete_entry(core, e, Propagation::Background).await
        {
            failures.push(format!("{}: {err}", resource_name(&e.key.storage)));
        }
    }
    // What is left after this pass (objects without finalizers are gone already).
    let remaining: Vec<Arc<Entry>> = contents.iter().filter_map(|e| core.store.get(&e.key)).collect();
    let content = NamespaceContent::of(&remaining, failures);
    write_namespace_conditions(core, &ns.key, &content).await;
}

/// What keeps a Terminating namespace: the content left and the finalizers holding it, as
/// upstream's namespace controller counts them.
#[derive(Debug, Default, PartialEq)]
struct NamespaceContent {
    /// Objects left per resource (`servers.provisioning.dev`, `secrets`).
    remaining: std::collections::BTreeMap<String, usize>,
    /// Objects holding each finalizer.
    finalizers: std::collections::BTreeMap<String, usize>,
    /// Deletes that failed, with their error.
    failures: Vec<String>,
}

impl NamespaceContent {
    fn of(remaining: &[Arc<Entry>], failures: Vec<String>) -> Self {
        let mut content = NamespaceContent { failures, ..Default::default() };
        for e in remaining {
            *content.remaining.entry(resource_name(&e.key.storage)).or_default() += 1;
            for f in &e.finalizers {
                *content.finalizers.entry(f.clone()).or_default() += 1;
            }
        }
        content
    }

    /// The namespace's status conditions (type, status, reason, message) in upstream's order.
    fn conditions(&self) -> Vec<(&'static str, &'static str, &'static str, String)> {
        let list = |m: &std::collections::BTreeMap<String, usize>, sep: &str| {
            m.iter().map(|(k, n)| format!("{k}{sep}{n} resource instances")).collect::<Vec<_>>().join(", ")
        };
        let failure = if self.failures.is_empty() {
            ("False", "ContentDeleted", "All content successfully deleted, may be waiting on finalization".to_string())
        } else {
            (
                "True",
                "ContentDeletionFailed",
                format!("Failed to delete all resource types, {} remaining: {}", self.failures.len(), self.failures.join(", ")),
            )
        };
        let remaining = if self.remaining.is_empty() {
            ("False", "ContentRemoved", "All content successfully removed".to_string())
        } else {
            ("True", "SomeResourcesRemain", format!("Some resources are remaining: {}", list(&self.remaining, " has ")))
        };
        let finalizers = if self.finalizers.is_empty() {
            ("False", "ContentHasNoFinalizers", "All content-preserving finalizers finished".to_string())
        } else {
            (
                "True",
                "SomeFinalizersRemain",
                format!("Some content in the namespace has finalizers remaining: {}", list(&self.finalizers, " in ")),
            )
        };
        vec![
            ("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered", "All resources successfully discovered".to_string()),
            (
                "NamespaceDeletionGroupVersionParsingFailure",
                "False",
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed".to_string(),
            ),
            ("NamespaceDeletionContentFailure", failure.0, failure.1, failure.2),
            ("NamespaceContentRemaining", remaining.0, remaining.1, remaining.2),
            ("NamespaceFinalizersRemaining", finalizers.0, finalizers.1, finalizers.2),
        ]
    }
}

/// `servers.provisioning.dev` for storage `provisioning.dev/servers`, `secrets` for `/secrets`.
fn resource_name(storage: &str) -> String {
    match storage.split_once('/') {
        Some(("", plural)) => plural.to_string(),
        Some((group, plural)) => format!("{plural}.{group}"),
        None => storage.to_string(),
    }
}

/// Writes the Terminating namespace's conditions when they changed; `lastTransitionTime`
/// moves only when a condition's status flips.
async fn write_namespace_conditions(core: &Arc<Core>, key: &ObjKey, content: &NamespaceContent) {
    for _ in 0..5 {
        let Some(cur) = core.store.get(key) else { return };
        let mut v = cur.value();
        let previous = v["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let now = crate::handlers::now_rfc3339();
        let conditions: Vec<Value> = content
            .conditions()
            .into_iter()
            .map(|(type_, status, reason, message)| {
                let old = previous.iter().find(|c| c["type"] == type_);
                let since = old.filter(|c| c["status"] == status).and_then(|c| c["lastTransitionTime"].as_str()).unwrap_or(&now);
                json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
            })
            .collect();
        if previous == conditions {
            return;
        }
        v["status"] = json!({"phase": "Terminating", "conditions": conditions});
        // A plain put: a Terminating namespace without finalizers is still kept until its
        // content is gone (put_internal would delete it).
        if core.store.put(cur.key.clone(), Precondition::Revision(cur.rv), v).await.is_ok() {
            return;
        }
    }
}

/// The default namespaces every cluster has.
pub fn default_namespaces() -> Vec<Value> {
    ["default", "kube-system", "kube-public", "kube-node-lease"]
        .iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
        .collect()
}
