//! DELETE (propagation, preconditions, finalizers, namespaces), the removal of a deleted
//! CRD's objects, and internal writes that bypass request handling (garbage collector).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{CRDS, Core, DeleteOptions, NAMESPACES, Output, Propagation, map_store, now_rfc3339, strs};
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceType;
use crate::storage::{Entry, ObjKey, Precondition, StoreError};

/// Namespaces kube-apiserver refuses to delete.
pub const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Kinds whose DELETE answers with the deleted object rather than a Status, as upstream's
/// stores with `ReturnDeletedObject` do (typed clients decode the answer as the kind: the
/// Python client's `delete_namespaced_service` fails on a Status).
const RETURN_DELETED_OBJECT: &[&str] = &[
    "/pods",
    "/services",
    "/persistentvolumeclaims",
    "/persistentvolumes",
    "/podtemplates",
    "/resourcequotas",
    "/serviceaccounts",
    "storage.k8s.io/storageclasses",
    "storage.k8s.io/csidrivers",
    "storage.k8s.io/csinodes",
    "storage.k8s.io/volumeattachments",
    "storage.k8s.io/volumeattributesclasses",
];

impl Core {
    /// DELETE of one object. Returns the object (deferred deletion) or a success Status.
    pub async fn delete(&self, rt: &ResourceType, ns: Option<&str>, name: &str, opts: &DeleteOptions) -> ApiResult<Output> {
        // kube-apiserver's NamespaceLifecycle admission: these namespaces always exist.
        if rt.storage == NAMESPACES && IMMORTAL_NAMESPACES.contains(&name) {
            return Err(ApiError::forbidden(format!("namespaces {name:?} is forbidden: this namespace may not be deleted")));
        }
        for _ in 0..16 {
            let cur = self.get(rt, ns, name)?;
            let mut obj = cur.value();
            if let Some(u) = &opts.uid
                && obj["metadata"]["uid"].as_str() != Some(u.as_str())
            {
                return Err(ApiError::conflict_with(
                    format!(
                        "Precondition failed: UID in precondition: {u}, UID in object meta: {}",
                        obj["metadata"]["uid"].as_str().unwrap_or_default()
                    ),
                    json!({"name": name, "group": rt.group, "kind": rt.plural}),
                ));
            }
            if let Some(r) = &opts.resource_version
                && r.parse::<u64>().ok() != Some(cur.rv)
            {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            let mut finalizers = strs(&obj["metadata"]["finalizers"]);
            let already = cur.deleting;
            match opts.propagation {
                Propagation::Foreground if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
                    finalizers.push("foregroundDeletion".into())
                }
                Propagation::Orphan if !finalizers.iter().any(|f| f == "orphan") => finalizers.push("orphan".into()),
                _ => {}
            }
            let is_ns = rt.storage == NAMESPACES;
            if finalizers.is_empty() && !is_ns {
                if opts.dry_run {
                    return Ok(Output::Transient(obj));
                }
                match self.store.delete(cur.key.clone(), Precondition::Revision(cur.rv)).await {
                    Err(StoreError::Conflict) => continue,
                    Err(e) => return Err(map_store(rt, name, e)),
                    Ok(e) => {
                        self.gc_wakeup.notify_one();
                        if rt.storage == CRDS {
                            self.after_crd_delete(&e).await;
                        }
                        if RETURN_DELETED_OBJECT.contains(&rt.storage.as_str()) {
                            return Ok(Output::Transient(obj));
                        }
                        return Ok(Output::Transient(json!({
                            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": e.uid},
                        })));
                    }
                }
            }
            if already && strs(&obj["metadata"]["finalizers"]) == finalizers {
                return Ok(Output::Stored(cur));
            }
            if !already {
                obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            if finalizers.is_empty() {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("finalizers");
                }
            } else {
                obj["metadata"]["finalizers"] = json!(finalizers);
            }
            if is_ns {
                obj["status"] = json!({"phase": "Terminating"});
            }
            if opts.dry_run {
                return Ok(Output::Transient(obj));
            }
            match self.store.put(cur.key.clone(), Precondition::Revision(cur.rv), obj).await {
                Err(StoreError::Conflict) => continue,
                Err(e) => return Err(map_store(rt, name, e)),
                Ok(e) => {
                    self.gc_wakeup.notify_one();
                    return Ok(Output::Stored(e));
                }
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// Removes every object of a deleted CRD.
    pub(super) async fn after_crd_delete(&self, crd: &Entry) {
        self.rebuild_registry().await;
        let v = crd.value();
        let storage =
            format!("{}/{}", v["spec"]["group"].as_str().unwrap_or_default(), v["spec"]["names"]["plural"].as_str().unwrap_or_default());
        let keys: Vec<(ObjKey, u64)> = {
            let st = self.store.read();
            st.objects.get(storage.as_str()).map(|m| m.values().map(|e| (e.key.clone(), e.rv)).collect()).unwrap_or_default()
        };
        for (k, rv) in keys {
            let _ = self.store.delete(k, Precondition::Revision(rv)).await;
        }
    }

    /// Writes that bypass request handling (garbage collector): store an updated object if unchanged since `cur`.
    pub async fn put_internal(&self, cur: &Arc<Entry>, new: Value) -> Result<Arc<Entry>, StoreError> {
        let deleting = new["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null());
        if deleting && strs(&new["metadata"]["finalizers"]).is_empty() {
            let r = self.store.delete(cur.key.clone(), Precondition::Revision(cur.rv)).await;
            if r.is_ok()
                && &*cur.key.storage == CRDS
                && let Ok(e) = &r
            {
                self.after_crd_delete(e).await;
            }
            return r;
        }
        self.store.put(cur.key.clone(), Precondition::Revision(cur.rv), new).await
    }
}
