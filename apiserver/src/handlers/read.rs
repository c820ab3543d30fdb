//! Reads: one object, list pages with continue tokens, list bodies rendered without
//! re-parsing, and conversion between served versions (Events: core/v1 ↔ events.k8s.io/v1).

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{Core, FRESHNESS_WAIT, ListPage};
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::storage::Entry;

/// Converts an Event between core/v1 and events.k8s.io/v1 field names.
pub fn convert_event(mut v: Value, to_events_group: bool) -> Value {
    let Some(m) = v.as_object_mut() else { return v };
    let pairs: [(&str, &str); 5] = [
        ("involvedObject", "regarding"),
        ("message", "note"),
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
        ("count", "deprecatedCount"),
    ];
    for (core, ev) in pairs {
        let (from, to) = if to_events_group { (core, ev) } else { (ev, core) };
        if let Some(x) = m.remove(from) {
            m.insert(to.into(), x);
        }
    }
    if to_events_group {
        if let Some(src) = m.remove("source") {
            if !m.contains_key("reportingController")
                && let Some(c) = src.get("component")
            {
                m.insert("reportingController".into(), c.clone());
            }
            m.insert("deprecatedSource".into(), src);
        }
        if let Some(rc) = m.remove("reportingComponent") {
            m.entry("reportingController").or_insert(rc);
        }
        m.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    } else {
        if let Some(src) = m.remove("deprecatedSource") {
            m.insert("source".into(), src);
        }
        if let Some(rc) = m.remove("reportingController") {
            if !m.contains_key("source") {
                m.insert("source".into(), json!({"component": rc}));
            }
            m.insert("reportingComponent".into(), rc);
        }
        m.insert("apiVersion".into(), json!("v1"));
    }
    v
}

impl Core {
    /// Renders a stored entry for a served type (version conversion where needed).
    pub fn render(&self, rt: &ResourceType, e: &Entry) -> Bytes {
        let want = rt.api_version();
        if e.api_version == want {
            return e.bytes.clone();
        }
        let v = e.value();
        Bytes::from(serde_json::to_vec(&self.convert(rt, v)).unwrap_or_default())
    }

    /// Converts an object to the version of `rt`.
    pub fn convert(&self, rt: &ResourceType, mut v: Value) -> Value {
        let want = rt.api_version();
        if v["apiVersion"].as_str() == Some(want.as_str()) {
            return v;
        }
        if rt.storage == "/events" {
            return convert_event(v, rt.group == "events.k8s.io");
        }
        v["apiVersion"] = json!(want);
        v
    }

    /// The object as it is stored: a custom resource at its CRD's storage version (upstream
    /// encodes every write at the storage version, whatever version it came in at).
    pub fn to_storage(&self, rt: &ResourceType, v: Value) -> Value {
        match self.storage_type(rt) {
            Some(st) => self.convert(&st, v),
            None => v,
        }
    }

    /// Whether a stored entry is at the storage version of its resource (a write of an
    /// unchanged object still stores one that is not: that is how storage is migrated).
    pub fn at_storage_version(&self, rt: &ResourceType, e: &Entry) -> bool {
        if !rt.custom {
            return true;
        }
        if rt.storage_version {
            return e.api_version == rt.api_version();
        }
        self.storage_type(rt).is_none_or(|st| e.api_version == st.api_version())
    }

    /// The storage version's type of a custom resource served at another version.
    fn storage_type(&self, rt: &ResourceType) -> Option<Arc<ResourceType>> {
        if !rt.custom || rt.storage_version {
            return None;
        }
        self.registry().by_storage(&rt.storage).filter(|st| st.storage_version)
    }

    /// GET of one object.
    pub fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> ApiResult<Arc<Entry>> {
        self.store.get(&Self::key(rt, ns, name)).ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    /// Waits (up to [`FRESHNESS_WAIT`]) until the store reached `want`; a 504 like
    /// kube-apiserver's "Too large resource version" otherwise.
    pub async fn wait_fresh(&self, want: u64) -> ApiResult<()> {
        let mut rx = self.store.subscribe();
        let reached = tokio::time::timeout(FRESHNESS_WAIT, async {
            loop {
                if *rx.borrow_and_update() >= want {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        let current = self.store.current_rv();
        if reached.is_ok() && current >= want {
            return Ok(());
        }
        Err(ApiError::too_large_resource_version(want, current))
    }

    /// LIST: matching entries, the list revision and a continue token.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> ApiResult<ListPage> {
        let (start, token_rv) = match cont {
            Some(c) if !c.is_empty() => {
                let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(c)
                    .map_err(|_| ApiError::bad_request("invalid continue token"))?;
                let v: Value = serde_json::from_slice(&raw).map_err(|_| ApiError::bad_request("invalid continue token"))?;
                let ns = v["ns"].as_str().unwrap_or_default().to_string();
                let name = v["name"].as_str().unwrap_or_default().to_string();
                (Some((ns, name)), v["rv"].as_u64())
            }
            _ => (None, None),
        };
        let st = self.store.read();
        let rv = token_rv.unwrap_or(st.rv);
        let mut out = vec![];
        let mut more = None;
        let mut remaining = 0u64;
        let mut scanned = 0u64;
        let namespace = if rt.namespaced { ns } else { None };
        for e in st.candidates(&rt.storage, namespace, labels, start.as_ref()) {
            scanned += 1;
            if !fields.matches(&e.key.namespace, &e.key.name, &e.fields) || !labels.matches(&e.labels) {
                continue;
            }
            if let Some(l) = limit
                && out.len() >= l
            {
                if more.is_none() {
                    let last: &Arc<Entry> = &out[out.len() - 1];
                    more = Some(json!({"rv": rv, "ns": last.key.namespace, "name": last.key.name}));
                }
                remaining += 1;
                continue;
            }
            out.push(e.clone());
        }
        drop(st);
        self.stats.scan("list", &rt.plural, !labels.is_empty(), scanned, out.len() as u64 + remaining);
        let token = more.map(|m| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(m.to_string()));
        Ok((out, rv, token, if remaining > 0 { Some(remaining) } else { None }))
    }

    /// Renders a list response body from entries without re-parsing them.
    pub fn list_body(&self, rt: &ResourceType, entries: &[Arc<Entry>], rv: u64, cont: Option<&str>, remaining: Option<u64>) -> Bytes {
        let head = Self::list_head(rt, rv, cont, remaining);
        let size: usize = entries.iter().map(|e| e.bytes.len() + 1).sum::<usize>() + head.len() + 2;
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&head);
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&self.render(rt, e));
        }
        out.extend_from_slice(b"]}");
        Bytes::from(out)
    }

    /// The start of a list body, up to and including `"items":[` (the items follow, then `]}`).
    pub fn list_head(rt: &ResourceType, rv: u64, cont: Option<&str>, remaining: Option<u64>) -> Vec<u8> {
        let mut meta = Map::new();
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if let Some(c) = cont {
            meta.insert("continue".into(), json!(c));
        }
        if let Some(r) = remaining {
            meta.insert("remainingItemCount".into(), json!(r));
        }
        format!("{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[", rt.list_kind, rt.api_version(), Value::Object(meta))
            .into_bytes()
    }
}
