//! Server-side apply and managedFields bookkeeping (FieldsV1).
//!
//! Field sets are sets of paths; a path is a list of FieldsV1 tokens (`f:spec`, `k:{"name":"a"}`).
//! Lists are atomic unless the schema marks them `x-kubernetes-list-type: map` (keys from
//! `x-kubernetes-list-map-keys`, items `k:{...}`) or `set` (scalar items `v:<json>`), so
//! several managers can own different entries of one list; `metadata.ownerReferences` is keyed
//! by uid as in Kubernetes.
//!
//! Cost: every list is hashed once per key family (`Finder`, `merge_keyed`, `prune`), so the
//! bookkeeping is linear in the object and its managedFields. What bounds them is the object
//! limit (`validation::MAX_OBJECT_BYTES`, 3 MiB, the request body limit; etcd's 1.5 MiB is not
//! ours to copy since we have no etcd), managedFields included: about 20,000 ownerReferences,
//! and no separate count limit. `Update` entries are capped at ten as upstream does. Large objects are computed with `block_in_place`, off the async workers.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// One path inside an object.
pub type FieldPath = Vec<String>;
/// A set of owned paths.
pub type FieldSet = BTreeSet<FieldPath>;

/// Which part of an object an operation may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource of a kind without a status subresource: everything.
    All,
    /// The main resource of a kind with a status subresource: everything but status.
    Main,
    /// The status subresource: only status.
    Status,
}

/// One entry of metadata.managedFields.
#[derive(Debug, Clone)]
pub struct ManagerEntry {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// apiVersion the manager used.
    pub api_version: String,
    /// When the entry last changed.
    pub time: String,
    /// `status` for the status subresource, empty otherwise.
    pub subresource: String,
    /// Owned paths.
    pub fields: FieldSet,
}

fn child_schema<'a>(schema: Option<&'a Value>, field: &str) -> Option<&'a Value> {
    let s = schema?;
    if let Some(p) = s.get("properties").and_then(|p| p.get(field)) {
        return Some(p);
    }
    s.get("additionalProperties").filter(|a| a.is_object())
}

/// Whether the list at `schema` is a `x-kubernetes-list-type: set`.
fn is_set(schema: Option<&Value>) -> bool {
    schema.and_then(|s| s.get("x-kubernetes-list-type")).and_then(Value::as_str) == Some("set")
}

/// The FieldsV1 token of a set item: `v:` and its JSON.
fn set_token(item: &Value) -> String {
    format!("v:{item}")
}

fn list_keys(schema: Option<&Value>, path: &[String]) -> Option<Vec<String>> {
    if path.len() == 2 && path[0] == "f:metadata" && path[1] == "f:ownerReferences" {
        return Some(vec!["uid".into()]);
    }
    let s = schema?;
    if s.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return None;
    }
    let keys: Vec<String> =
        s.get("x-kubernetes-list-map-keys")?.as_array()?.iter().filter_map(|k| k.as_str().map(str::to_string)).collect();
    if keys.is_empty() { None } else { Some(keys) }
}

/// The `k:{...}` token of a list-map item. A key field the item leaves out takes its schema
/// default, as in structured-merge-diff (a container port applied without `protocol` is the
/// stored port with `protocol: TCP`).
fn item_token(item: &Value, keys: &[String], item_schema: Option<&Value>) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        let v = item.get(k).or_else(|| item_schema?.get("properties")?.get(k)?.get("default"))?;
        m.insert(k.clone(), v.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

fn collect(value: &Value, schema: Option<&Value>, path: &mut FieldPath, out: &mut FieldSet) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                path.push(format!("f:{k}"));
                collect(v, child_schema(schema, k), path, out);
                path.pop();
            }
        }
        Value::Array(items) => match list_keys(schema, path) {
            Some(keys) if !items.is_empty() => {
                let item_schema = schema.and_then(|s| s.get("items"));
                for item in items {
                    match item_token(item, &keys, item_schema) {
                        Some(tok) => {
                            path.push(tok);
                            out.insert(path.clone());
                            if let Value::Object(fields) = item {
                                for (k, v) in fields {
                                    path.push(format!("f:{k}"));
                                    collect(v, child_schema(item_schema, k), path, out);
                                    path.pop();
                                }
                            }
                            path.pop();
                        }
                        None => {
                            out.insert(path.clone());
                        }
                    }
                }
            }
            _ if is_set(schema) && !items.is_empty() => {
                for item in items {
                    path.push(set_token(item));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The fields an object sets, restricted to `scope`.
pub fn field_set(obj: &Value, schema: Option<&Value>, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(m) = obj.as_object() else { return out };
    let mut path = vec![];
    for (k, v) in m {
        match k.as_str() {
            "apiVersion" | "kind" => continue,
            "status" if scope == Scope::Main => continue,
            "metadata" => {
                if scope == Scope::Status {
                    continue;
                }
                for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(mv) = v.get(mk) {
                        if mv.is_null() {
                            continue;
                        }
                        path.push("f:metadata".into());
                        path.push(format!("f:{mk}"));
                        collect(mv, None, &mut path, &mut out);
                        path.clear();
                    }
                }
            }
            _ if scope == Scope::Status && k != "status" => continue,
            _ => {
                path.push(format!("f:{k}"));
                collect(v, child_schema(schema, k), &mut path, &mut out);
                path.clear();
            }
        }
    }
    out
}

/// Renders a field set as FieldsV1 JSON.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        owned: bool,
        children: std::collections::BTreeMap<String, Node>,
    }
    fn render(n: &Node) -> Value {
        let mut m = Map::new();
        if n.owned && !n.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &n.children {
            m.insert(k.clone(), render(c));
        }
        Value::Object(m)
    }
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for tok in path {
            node = node.children.entry(tok.clone()).or_default();
        }
        node.owned = true;
    }
    render(&root)
}

fn walk_v1(node: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    let Some(m) = node.as_object() else { return };
    for (k, v) in m {
        if k == "." {
            out.insert(path.clone());
            continue;
        }
        path.push(k.clone());
        match v.as_object() {
            Some(c) if !c.is_empty() => walk_v1(v, path, out),
            _ => {
                out.insert(path.clone());
            }
        }
        path.pop();
    }
}

/// Parses FieldsV1 JSON into a field set.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    walk_v1(v, &mut vec![], &mut out);
    out
}

/// What a `k:` or `v:` token selects in a list, in a form that can be hashed: the key fields'
/// names (sorted) and their values, or the member's JSON. Parsed once per token, so lookups
/// never re-parse per item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Selector {
    /// `k:{...}`: the item whose fields `names` hold `values` (a JSON array, in name order).
    Key { names: Vec<String>, values: String },
    /// `v:<json>`: the set member equal to this JSON (rendered canonically).
    Member(String),
}

impl Selector {
    fn parse(tok: &str) -> Option<Self> {
        if let Some(v) = tok.strip_prefix("v:") {
            return serde_json::from_str::<Value>(v).ok().map(|v| Self::Member(v.to_string()));
        }
        let keys = serde_json::from_str::<Map<String, Value>>(tok.strip_prefix("k:")?).ok()?;
        Some(Self::from_keys(keys.iter().map(|(k, v)| (k.as_str(), v))))
    }

    fn from_keys<'v>(pairs: impl Iterator<Item = (&'v str, &'v Value)>) -> Self {
        let mut pairs: Vec<(&str, &Value)> = pairs.collect();
        pairs.sort_by(|a, b| a.0.cmp(b.0));
        let values: Vec<&Value> = pairs.iter().map(|(_, v)| *v).collect();
        Self::Key {
            names: pairs.iter().map(|(k, _)| (*k).to_string()).collect(),
            values: Value::from(values.into_iter().cloned().collect::<Vec<_>>()).to_string(),
        }
    }

    /// The index a list is hashed by for this kind of selector (key names, or members).
    fn family(&self) -> String {
        match self {
            Self::Key { names, .. } => names.join("\u{0}"),
            Self::Member(_) => "\u{1}member".into(),
        }
    }

    fn hash_key(&self) -> &str {
        match self {
            Self::Key { values, .. } | Self::Member(values) => values,
        }
    }

    /// This selector's hash key for `item` (None: the item lacks a key field).
    fn key_of(&self, item: &Value) -> Option<String> {
        match self {
            Self::Key { names, .. } => {
                let vals: Option<Vec<Value>> = names.iter().map(|n| item.get(n).cloned()).collect();
                Some(Value::from(vals?).to_string())
            }
            Self::Member(_) => Some(item.to_string()),
        }
    }
}

/// Position of each item of `items` by `sel`'s family of keys (the first item wins, as a scan
/// would find it).
fn index_list(items: &[Value], sel: &Selector) -> std::collections::HashMap<String, usize> {
    let mut idx = std::collections::HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if let Some(k) = sel.key_of(item) {
            idx.entry(k).or_insert(i);
        }
    }
    idx
}

/// Looks paths up in one object, hashing each list it meets once per key family: a field set of
/// n paths over lists of m items costs O(n + m), not O(n·m).
struct Finder<'a> {
    root: &'a Value,
    lists: std::collections::HashMap<(usize, String), std::collections::HashMap<String, usize>>,
}

impl<'a> Finder<'a> {
    fn new(root: &'a Value) -> Self {
        Self { root, lists: std::collections::HashMap::new() }
    }

    fn get(&mut self, path: &[String]) -> Option<&'a Value> {
        let mut cur = self.root;
        for tok in path {
            cur = if let Some(f) = tok.strip_prefix("f:") {
                cur.get(f)?
            } else if tok.starts_with("k:") || tok.starts_with("v:") {
                let items = cur.as_array()?;
                let sel = Selector::parse(tok)?;
                let idx = self.lists.entry((std::ptr::from_ref(items) as usize, sel.family())).or_insert_with(|| index_list(items, &sel));
                items.get(*idx.get(sel.hash_key())?)?
            } else {
                return None;
            };
        }
        Some(cur)
    }
}

/// The value at a path, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    Finder::new(obj).get(path)
}

/// Paths to remove, as a tree (a node marked `remove` goes with everything below it).
#[derive(Default)]
struct Removal {
    remove: bool,
    children: std::collections::BTreeMap<String, Removal>,
}

impl Removal {
    fn build<'p>(paths: impl Iterator<Item = &'p FieldPath>) -> Self {
        let mut root = Self::default();
        for p in paths {
            let mut node = &mut root;
            for tok in p {
                node = node.children.entry(tok.clone()).or_default();
            }
            node.remove = true;
        }
        root
    }
}

/// Removes the marked paths from `value` in one pass; an object (below the top level) left
/// empty by a removal goes too unless `kept` says someone owns it or sets something in it.
/// Returns whether anything directly in `value` was removed.
fn prune(value: &mut Value, node: &Removal, path: &mut FieldPath, kept: &dyn Fn(&[String]) -> bool) -> bool {
    let mut removed_any = false;
    match value {
        Value::Object(m) => {
            for (tok, child) in &node.children {
                let Some(f) = tok.strip_prefix("f:") else { continue };
                if child.remove {
                    removed_any |= m.remove(f).is_some();
                    continue;
                }
                let Some(cv) = m.get_mut(f) else { continue };
                path.push(tok.clone());
                let emptied = prune(cv, child, path, kept) && path.len() >= 2 && cv == &json!({}) && !kept(path);
                path.pop();
                if emptied {
                    m.remove(f);
                    removed_any = true;
                }
            }
        }
        Value::Array(items) => {
            let mut idx: std::collections::HashMap<String, std::collections::HashMap<String, usize>> = std::collections::HashMap::new();
            let mut doomed: std::collections::HashMap<String, (Selector, std::collections::HashSet<String>)> =
                std::collections::HashMap::new();
            for (tok, child) in &node.children {
                let Some(sel) = Selector::parse(tok) else { continue };
                if child.remove {
                    doomed.entry(sel.family()).or_insert_with(|| (sel.clone(), Default::default())).1.insert(sel.hash_key().to_string());
                    continue;
                }
                let family = idx.entry(sel.family()).or_insert_with(|| index_list(items, &sel));
                if let Some(&i) = family.get(sel.hash_key()) {
                    path.push(tok.clone());
                    prune(&mut items[i], child, path, kept);
                    path.pop();
                }
            }
            if !doomed.is_empty() {
                let before = items.len();
                items.retain(|item| !doomed.values().any(|(sel, keys)| sel.key_of(item).is_some_and(|k| keys.contains(&k))));
                removed_any = items.len() != before;
            }
        }
        _ => {}
    }
    removed_any
}

/// Whether some path of `set` is `p` or below it.
fn has_at_or_below(set: &FieldSet, p: &[String]) -> bool {
    set.range(p.to_vec()..).next().is_some_and(|q| q.starts_with(p))
}

/// Merges an applied configuration into the live object (maps deep, keyed lists by key,
/// everything else replaced).
pub fn merge_applied(live: &mut Value, applied: &Value, schema: Option<&Value>, path: &mut FieldPath) {
    match (live.as_object_mut(), applied.as_object()) {
        (Some(lm), Some(am)) => {
            for (k, av) in am {
                path.push(format!("f:{k}"));
                let cs = if path.len() == 1 && k == "metadata" { None } else { child_schema(schema, k) };
                match lm.get_mut(k) {
                    Some(lv) if lv.is_object() && av.is_object() => merge_applied(lv, av, cs, path),
                    Some(lv) if lv.is_array() && av.is_array() => {
                        if let Some(keys) = list_keys(cs, path) {
                            if let (Some(larr), Some(aarr)) = (lv.as_array_mut(), av.as_array()) {
                                merge_keyed(larr, aarr, &keys, cs.and_then(|s| s.get("items")), path);
                            }
                        } else if is_set(cs) {
                            if let (Some(larr), Some(aarr)) = (lv.as_array_mut(), av.as_array()) {
                                let mut members: std::collections::HashSet<String> = larr.iter().map(Value::to_string).collect();
                                for ai in aarr {
                                    if members.insert(ai.to_string()) {
                                        larr.push(ai.clone());
                                    }
                                }
                            }
                        } else {
                            *lv = av.clone();
                        }
                    }
                    _ => {
                        lm.insert(k.clone(), av.clone());
                    }
                }
                path.pop();
            }
        }
        _ => *live = applied.clone(),
    }
}

/// Merges applied items of a keyed list into the live items by key (hashed once: linear in
/// both lists).
fn merge_keyed(larr: &mut Vec<Value>, aarr: &[Value], keys: &[String], item_schema: Option<&Value>, path: &mut FieldPath) {
    let mut indexes: std::collections::HashMap<String, std::collections::HashMap<String, usize>> = std::collections::HashMap::new();
    for ai in aarr {
        let Some(sel) = item_token(ai, keys, item_schema).and_then(|t| Selector::parse(&t)) else {
            larr.push(ai.clone());
            continue;
        };
        let idx = indexes.entry(sel.family()).or_insert_with(|| index_list(larr, &sel));
        match idx.get(sel.hash_key()).copied() {
            Some(i) => merge_applied(&mut larr[i], ai, item_schema, path),
            None => {
                larr.push(ai.clone());
                let pushed = larr.len() - 1;
                if let Some(k) = sel.key_of(&larr[pushed]) {
                    idx.entry(k).or_insert(pushed);
                }
            }
        }
    }
}

/// Reads metadata.managedFields.
pub fn read_managed(obj: &Value) -> Vec<ManagerEntry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| ManagerEntry {
            manager: e["manager"].as_str().unwrap_or_default().to_string(),
            operation: e["operation"].as_str().unwrap_or("Update").to_string(),
            api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
            time: e["time"].as_str().unwrap_or_default().to_string(),
            subresource: e["subresource"].as_str().unwrap_or_default().to_string(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

/// Writes metadata.managedFields (entries with no fields are dropped).
pub fn write_managed(obj: &mut Value, entries: &[ManagerEntry]) {
    let arr: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if arr.is_empty() {
            md.remove("managedFields");
        } else {
            md.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

fn subresource_name(scope: Scope) -> String {
    if scope == Scope::Status { "status".into() } else { String::new() }
}

/// Objects with more nodes than this have their managedFields computed off the async workers.
pub(crate) const OFFLOAD_NODES: usize = 2_000;

/// Whether `v` has more than `limit` nodes (stops counting there).
pub(crate) fn larger_than(v: &Value, limit: usize) -> bool {
    fn count(v: &Value, left: &mut usize) -> bool {
        if *left == 0 {
            return true;
        }
        *left -= 1;
        match v {
            Value::Object(m) => m.values().any(|c| count(c, left)),
            Value::Array(a) => a.iter().any(|c| count(c, left)),
            _ => false,
        }
    }
    count(v, &mut { limit })
}

/// Runs `work` for a `large` object so that the async worker it was called on keeps serving
/// (tokio's `block_in_place` hands the worker's other tasks to another thread). Small objects,
/// and callers outside a multi-threaded runtime, run it in place.
pub(crate) fn off_the_workers<R>(large: bool, work: impl FnOnce() -> R) -> R {
    let multi = tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi && large { tokio::task::block_in_place(work) } else { work() }
}

/// Records a non-apply write (create, update, patch) by `manager`: it takes ownership of every
/// field it changed; fields that no longer exist are dropped from every manager.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    schema: Option<&Value>,
    scope: Scope,
    now: &str,
) {
    let large = larger_than(new, OFFLOAD_NODES) || old.is_some_and(|o| larger_than(o, OFFLOAD_NODES));
    off_the_workers(large, || record_update_now(old, new, manager, api_version, schema, scope, now));
}

fn record_update_now(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    schema: Option<&Value>,
    scope: Scope,
    now: &str,
) {
    let mut entries = old.map(read_managed).unwrap_or_default();
    let new_fields = field_set(new, schema, scope);
    let mut in_new = Finder::new(new);
    let changed: FieldSet = match old {
        Some(o) => {
            let mut in_old = Finder::new(o);
            new_fields.iter().filter(|p| in_old.get(p) != in_new.get(p)).cloned().collect()
        }
        None => new_fields.clone(),
    };
    let sub = subresource_name(scope);
    for e in entries.iter_mut() {
        e.fields.retain(|p| !changed.contains(p) && in_new.get(p).is_some());
    }
    if !changed.is_empty() {
        match entries.iter_mut().find(|e| e.manager == manager && e.operation == "Update" && e.subresource == sub) {
            Some(e) => {
                e.fields.extend(changed);
                e.time = now.to_string();
                e.api_version = api_version.to_string();
            }
            None => entries.push(ManagerEntry {
                manager: manager.to_string(),
                operation: "Update".into(),
                api_version: api_version.to_string(),
                time: now.to_string(),
                subresource: sub,
                fields: changed,
            }),
        }
    }
    cap_update_managers(&mut entries);
    write_managed(new, &entries);
}

/// Most `Update` entries kept in managedFields, as kube-apiserver (`DefaultMaxUpdateManagers`):
/// every client that writes with a new field manager name would add one more.
pub const MAX_UPDATE_MANAGERS: usize = 10;
/// The manager the oldest `Update` entries are merged into, one per apiVersion (upstream's name).
pub const ANCIENT_CHANGES: &str = "ancient-changes";

/// Merges the oldest `Update` entries into an `ancient-changes` entry per apiVersion until at
/// most [`MAX_UPDATE_MANAGERS`] are left (structured-merge-diff's capManagers: the first entry
/// of a version seen is kept until a second of that version arrives, then both become the
/// bucket, which takes the newer time).
fn cap_update_managers(entries: &mut Vec<ManagerEntry>) {
    let mut updaters: Vec<usize> = (0..entries.len()).filter(|&i| entries[i].operation != "Apply").collect();
    let mut length = updaters.len();
    if length <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|&a, &b| entries[a].time.cmp(&entries[b].time));
    let is_bucket = |e: &ManagerEntry, version: &str| {
        e.manager == ANCIENT_CHANGES && e.operation == "Update" && e.subresource.is_empty() && e.api_version == version
    };
    let mut first_of_version: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut merged = std::collections::HashSet::new();
    for &i in &updaters {
        if length <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entries[i].api_version.clone();
        let Some(&first) = first_of_version.get(&version) else {
            first_of_version.insert(version, i);
            continue;
        };
        let bucket = match (0..entries.len()).find(|&b| !merged.contains(&b) && is_bucket(&entries[b], &version)) {
            Some(b) => b,
            None => {
                let e = &mut entries[first];
                e.manager = ANCIENT_CHANGES.into();
                e.operation = "Update".into();
                e.subresource = String::new();
                first
            }
        };
        if bucket == i {
            continue;
        }
        let fields = std::mem::take(&mut entries[i].fields);
        let time = entries[i].time.clone();
        entries[bucket].fields.extend(fields);
        entries[bucket].time = time;
        merged.insert(i);
        length -= 1;
    }
    let mut index = 0;
    entries.retain(|_| {
        index += 1;
        !merged.contains(&(index - 1))
    });
}

/// Parameters of one server-side apply.
pub struct ApplyRequest<'a> {
    /// Field manager (required for apply).
    pub manager: &'a str,
    /// Take ownership of conflicting fields.
    pub force: bool,
    /// Main resource or status subresource.
    pub scope: Scope,
    /// apiVersion of the request.
    pub api_version: &'a str,
    /// Schema of the resource, for keyed lists.
    pub schema: Option<&'a Value>,
    /// Current time (RFC 3339).
    pub now: &'a str,
}

/// Entries of keyed lists and sets that the applied configuration names twice, rendered as
/// structured-merge-diff does (`.spec.pools: duplicate entries for key [name="cp"]`).
fn duplicate_entries(value: &Value, schema: Option<&Value>, path: &mut FieldPath, out: &mut Vec<String>) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                path.push(format!("f:{k}"));
                let cs = if path.len() == 1 && k == "metadata" { None } else { child_schema(schema, k) };
                duplicate_entries(v, cs, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            let keys = list_keys(schema, path);
            let set = keys.is_none() && is_set(schema);
            let mut seen = std::collections::HashSet::new();
            let item_schema = schema.and_then(|s| s.get("items"));
            for item in items {
                let token = match &keys {
                    Some(k) => item_token(item, k, item_schema),
                    None if set => Some(set_token(item)),
                    None => None,
                };
                if let Some(t) = token
                    && !seen.insert(t.clone())
                {
                    let what = if set {
                        format!("value {}", t.trim_start_matches("v:"))
                    } else {
                        format!("key {}", render_path(std::slice::from_ref(&t)))
                    };
                    out.push(format!("{}: duplicate entries for {what}", render_path(path)));
                }
            }
            if let Some(k) = &keys {
                for item in items {
                    if let Some(t) = item_token(item, k, item_schema) {
                        path.push(t);
                        duplicate_entries(item, item_schema, path, out);
                        path.pop();
                    }
                }
            }
        }
        _ => {}
    }
}

/// Server-side apply of `applied` onto `live`; returns the new object with managedFields set.
/// Upstream's order, so it can be read against structured-merge-diff: refuse duplicate list
/// entries, check conflicts per manager, drop what this manager no longer applies, merge, then
/// the managedFields bookkeeping.
pub fn apply(live: &Value, applied: &Value, req: &ApplyRequest<'_>) -> Result<Value, ApiError> {
    let large = larger_than(live, OFFLOAD_NODES) || larger_than(applied, OFFLOAD_NODES);
    off_the_workers(large, || apply_now(live, applied, req))
}

fn apply_now(live: &Value, applied: &Value, req: &ApplyRequest<'_>) -> Result<Value, ApiError> {
    refuse_duplicate_entries(live, applied, req)?;
    let mut entries = read_managed(live);
    let applied_fields = field_set(applied, req.schema, req.scope);
    let sub = subresource_name(req.scope);
    let conflicts = conflicts(&entries, live, applied, &applied_fields, req.manager);
    if !conflicts.is_empty() && !req.force {
        return Err(conflict_error(&conflicts));
    }
    // Forced: the other managers lose the fields this one takes over.
    for (m, p) in &conflicts {
        for e in entries.iter_mut().filter(|e| &e.manager == m) {
            e.fields.remove(p);
        }
    }
    let mut out = live.clone();
    drop_released_fields(&mut out, &entries, &applied_fields, req.manager, &sub);
    merge_applied(&mut out, &scoped_configuration(applied, req.scope), req.schema, &mut vec![]);
    // Other managers keep only what still exists.
    let mut in_out = Finder::new(&out);
    for e in entries.iter_mut() {
        e.fields.retain(|p| in_out.get(p).is_some());
    }
    entries.retain(|e| !(e.manager == req.manager && e.operation == "Apply" && e.subresource == sub));
    entries.push(ManagerEntry {
        manager: req.manager.to_string(),
        operation: "Apply".into(),
        api_version: req.api_version.to_string(),
        time: req.now.to_string(),
        subresource: sub,
        fields: applied_fields,
    });
    cap_update_managers(&mut entries);
    write_managed(&mut out, &entries);
    Ok(out)
}

/// A configuration naming one list entry twice cannot be merged per key; kube-apiserver
/// refuses it before anything else (an error that is not a Status: 500, reason unset).
fn refuse_duplicate_entries(live: &Value, applied: &Value, req: &ApplyRequest<'_>) -> Result<(), ApiError> {
    let mut duplicates = vec![];
    duplicate_entries(applied, req.schema, &mut vec![], &mut duplicates);
    if duplicates.is_empty() {
        return Ok(());
    }
    let md = &live["metadata"];
    let object = format!(
        "{}/{}; {}, Kind={}",
        md["namespace"].as_str().unwrap_or_default(),
        md["name"].as_str().unwrap_or_default(),
        req.api_version,
        applied["kind"].as_str().unwrap_or_default()
    );
    let detail = if duplicates.len() == 1 { duplicates.remove(0) } else { format!("errors:\n  {}", duplicates.join("\n  ")) };
    Err(ApiError { code: 500, reason: "", message: format!("failed to create typed patch object ({object}): {detail}"), details: None })
}

/// Conflicts: fields another manager owns that this apply sets to a different value, with
/// their owner.
fn conflicts(
    entries: &[ManagerEntry],
    live: &Value,
    applied: &Value,
    applied_fields: &FieldSet,
    manager: &str,
) -> Vec<(String, FieldPath)> {
    let mut conflicts: Vec<(String, FieldPath)> = vec![];
    let (mut in_live, mut in_applied) = (Finder::new(live), Finder::new(applied));
    for e in entries.iter() {
        if e.manager == manager {
            continue;
        }
        for p in applied_fields {
            // A keyed list item's own path, or a set member, marks membership (shared freely);
            // a keyed item's fields conflict.
            if p.last().is_some_and(|t| t.starts_with("k:") || t.starts_with("v:")) {
                continue;
            }
            if e.fields.contains(p) && in_live.get(p) != in_applied.get(p) {
                conflicts.push((e.manager.clone(), p.clone()));
            }
        }
    }
    conflicts
}

/// The 409 of an apply with conflicts, in kube-apiserver's words.
fn conflict_error(conflicts: &[(String, FieldPath)]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| {
            let field = render_path(p);
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\": {field}"), "field": field})
        })
        .collect();
    let msg = if conflicts.len() == 1 {
        format!("Apply failed with 1 conflict: conflict with \"{}\": {}", conflicts[0].0, render_path(&conflicts[0].1))
    } else {
        let parts: Vec<String> = conflicts.iter().map(|(m, p)| format!("conflict with \"{m}\": {}", render_path(p))).collect();
        format!("Apply failed with {} conflicts: {}", conflicts.len(), parts.join("\n"))
    };
    ApiError::conflict_with(msg, json!({"causes": causes}))
}

/// Removes from `out` the fields `manager` applied before (in this subresource) but no longer
/// does, and nobody else owns. Every check is a set lookup or a range query and the removal is
/// one pass over `out`, so dropping thousands of list items stays linear.
fn drop_released_fields(out: &mut Value, entries: &[ManagerEntry], applied_fields: &FieldSet, manager: &str, sub: &str) {
    let is_self = |e: &ManagerEntry| e.manager == manager && e.operation == "Apply" && e.subresource == sub;
    let others: Vec<&FieldSet> = entries.iter().filter(|e| !is_self(e)).map(|e| &e.fields).collect();
    let previous: FieldSet = entries.iter().filter(|e| is_self(e)).flat_map(|e| e.fields.iter().cloned()).collect();
    let owned_by_other = |p: &[String]| others.iter().any(|f| f.contains(p));
    // Someone else (another manager, or this manager's other entries) still owns `p` or a field
    // below it, or this apply sets something below it.
    let in_use_below = |p: &[String]| others.iter().any(|f| has_at_or_below(f, p)) || has_at_or_below(applied_fields, p);
    let is_item = |p: &FieldPath| p.last().is_some_and(|t| t.starts_with("k:"));
    let candidates: Vec<&FieldPath> = previous.iter().filter(|p| !applied_fields.contains(*p)).filter(|p| !owned_by_other(p)).collect();
    // A keyed list item goes as a whole when nothing in it is still in use; otherwise it stays
    // (with its key fields) and only this manager's other fields in it go.
    let removed_items: std::collections::HashSet<&FieldPath> =
        candidates.iter().copied().filter(|p| is_item(p) && !in_use_below(p)).collect();
    let removed = candidates
        .into_iter()
        .filter(|p| !is_item(p) || removed_items.contains(p))
        // Inside an item removed as a whole: the item's removal takes care of it.
        .filter(|p| !(1..p.len()).any(|n| removed_items.contains(&p[..n].to_vec())))
        // Key fields of an item that stays.
        .filter(|p| !is_key_field(p));
    // An object whose last field just went goes too (`status.plan: {}` would fail its schema's
    // required fields), unless someone owns it as such or this apply sets it; top-level objects
    // (spec, status) stay.
    let kept = |parent: &[String]| owned_by_other(parent) || has_at_or_below(applied_fields, parent);
    prune(out, &Removal::build(removed), &mut vec![], &kept);
}

/// The part of the configuration `scope` may touch (no apiVersion/kind; status only through
/// the status subresource; of metadata only labels, annotations, finalizers, owners).
fn scoped_configuration(applied: &Value, scope: Scope) -> Value {
    let mut restricted = applied.clone();
    if let Some(m) = restricted.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        match scope {
            Scope::Main => {
                m.remove("status");
            }
            Scope::Status => m.retain(|k, _| k == "status"),
            Scope::All => {}
        }
        if let Some(md) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            md.retain(|k, _| matches!(k.as_str(), "labels" | "annotations" | "finalizers" | "ownerReferences"));
        }
    }
    restricted
}

/// Whether `p` names a key field of a keyed list item (`...k:{"type":"Ready"}, f:type`).
fn is_key_field(p: &FieldPath) -> bool {
    let [.., item, field] = p.as_slice() else { return false };
    let (Some(keys), Some(f)) = (item.strip_prefix("k:"), field.strip_prefix("f:")) else { return false };
    serde_json::from_str::<Map<String, Value>>(keys).is_ok_and(|m| m.contains_key(f))
}

/// `.spec.plan`-style rendering of a path for conflict messages.
pub fn render_path(p: &[String]) -> String {
    let mut s = String::new();
    for tok in p {
        if let Some(f) = tok.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(v) = tok.strip_prefix("v:") {
            s.push_str("[=");
            s.push_str(v);
            s.push(']');
        } else if let Some(keys) = tok.strip_prefix("k:").and_then(|k| serde_json::from_str::<Map<String, Value>>(k).ok()) {
            // kube-apiserver's form: `.spec.providers[name="sim"]`.
            let parts: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push('[');
            s.push_str(&parts.join(","));
            s.push(']');
        } else {
            s.push('[');
            s.push_str(tok.trim_start_matches("k:"));
            s.push(']');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let obj = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "labels": {"x": "1"}},
            "spec": {"a": 1, "b": {"c": [1, 2]}}});
        let set = field_set(&obj, None, Scope::All);
        let v1 = to_fields_v1(&set);
        assert_eq!(v1, json!({"f:metadata": {"f:labels": {"f:x": {}}}, "f:spec": {"f:a": {}, "f:b": {"f:c": {}}}}));
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_conflicts_and_force() -> Result<(), ApiError> {
        let live0 = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}});
        let req = |m: &'static str, force| ApplyRequest { manager: m, force, scope: Scope::All, api_version: "v1", schema: None, now: "t" };
        let a = apply(&live0, &json!({"spec": {"plan": "small", "zone": "z"}}), &req("one", false))?;
        let err = apply(&a, &json!({"spec": {"plan": "large"}}), &req("two", false));
        assert_eq!(err.err().map(|e| e.code), Some(409));
        // Same value: shared ownership, no conflict.
        let b = apply(&a, &json!({"spec": {"plan": "small"}}), &req("two", false))?;
        let c = apply(&b, &json!({"spec": {"plan": "large"}}), &req("two", true))?;
        assert_eq!(c["spec"]["plan"], "large");
        // Manager one drops zone: removed since nobody else owns it.
        let d = apply(&c, &json!({"spec": {}}), &req("one", false))?;
        assert!(d["spec"].get("zone").is_none());
        assert_eq!(d["spec"]["plan"], "large");
        Ok(())
    }

    #[test]
    fn an_object_whose_fields_all_go_goes_too() -> Result<(), ApiError> {
        let req = ApplyRequest { manager: "m", force: false, scope: Scope::Status, api_version: "v1", schema: None, now: "t" };
        let live = json!({"metadata": {"name": "a"}});
        let a = apply(&live, &json!({"status": {"phase": "Ready", "approvedPlan": {"id": "abc", "changes": [{"x": 1}]}}}), &req)?;
        assert_eq!(a["status"]["approvedPlan"]["id"], "abc");
        // The manager stops applying approvedPlan: no `approvedPlan: {}` left behind.
        let b = apply(&a, &json!({"status": {"phase": "Ready"}}), &req)?;
        assert!(b["status"].get("approvedPlan").is_none(), "{b}");
        assert_eq!(b["status"]["phase"], "Ready");
        // An empty object applied as such is owned as a leaf and stays.
        let c = apply(&b, &json!({"status": {"phase": "Ready", "cost": {}}}), &req)?;
        assert_eq!(c["status"]["cost"], json!({}));
        Ok(())
    }

    /// A twelfth manager writing: the two oldest Update entries become `ancient-changes`, so
    /// managedFields holds at most ten Update entries (as kube-apiserver); Apply entries stay.
    #[test]
    fn update_managers_are_capped_at_ten() -> Result<(), ApiError> {
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {}});
        let req = ApplyRequest { manager: "applier", force: false, scope: Scope::All, api_version: "v1", schema: None, now: "t00" };
        obj = apply(&obj, &json!({"data": {"applied": "x"}}), &req)?;
        for i in 0..12 {
            let mut next = obj.clone();
            next["data"][format!("k{i}")] = json!("v");
            record_update(Some(&obj), &mut next, &format!("writer-{i}"), "v1", None, Scope::All, &format!("t{:02}", i + 1));
            obj = next;
        }
        let entries = read_managed(&obj);
        let updates: Vec<&ManagerEntry> = entries.iter().filter(|e| e.operation == "Update").collect();
        assert_eq!(updates.len(), MAX_UPDATE_MANAGERS, "{:#}", obj["metadata"]);
        let ancient = entries.iter().find(|e| e.manager == ANCIENT_CHANGES).ok_or_else(|| ApiError::bad_request("no ancient-changes"))?;
        let owned: Vec<String> = ancient.fields.iter().map(|p| render_path(p)).collect();
        assert_eq!(owned, [".data.k0", ".data.k1", ".data.k2"], "the three oldest writers' fields");
        assert_eq!(ancient.time, "t03");
        assert!(entries.iter().any(|e| e.manager == "applier" && e.operation == "Apply"));
        assert!(!entries.iter().any(|e| ["writer-0", "writer-1", "writer-2"].contains(&e.manager.as_str())));
        Ok(())
    }

    #[test]
    fn keyed_lists_merge() -> Result<(), ApiError> {
        let schema = json!({"type": "object", "properties": {"status": {"type": "object", "properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object"}}}}}});
        let live = json!({"metadata": {"name": "a"}, "status": {"conditions": [{"type": "A", "status": "True"}]}});
        let req = ApplyRequest { manager: "m", force: false, scope: Scope::Status, api_version: "v1", schema: Some(&schema), now: "t" };
        let out = apply(&live, &json!({"status": {"conditions": [{"type": "B", "status": "False"}]}}), &req)?;
        assert_eq!(out["status"]["conditions"].as_array().map(Vec::len), Some(2));
        Ok(())
    }

    #[test]
    fn sets_merge_per_member() -> Result<(), ApiError> {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "dependsOn": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}}});
        let req = |m: &'static str| ApplyRequest {
            manager: m,
            force: false,
            scope: Scope::All,
            api_version: "v1",
            schema: Some(&schema),
            now: "t",
        };
        let live = json!({"metadata": {"name": "a"}});
        let a = apply(&live, &json!({"spec": {"dependsOn": ["etcd", "dns"]}}), &req("one"))?;
        // Another manager adds a member: no conflict, both kept.
        let b = apply(&a, &json!({"spec": {"dependsOn": ["redis", "etcd"]}}), &req("two"))?;
        assert_eq!(b["spec"]["dependsOn"], json!(["etcd", "dns", "redis"]));
        assert!(to_fields_v1(&read_managed(&b)[1].fields).to_string().contains(r#""v:\"redis\"""#), "{:#}", b["metadata"]);
        // "one" drops etcd and dns: dns goes, etcd stays (two still owns it).
        let c = apply(&b, &json!({"spec": {"dependsOn": []}}), &req("one"))?;
        assert_eq!(c["spec"]["dependsOn"], json!(["etcd", "redis"]));
        Ok(())
    }

    #[test]
    fn map_lists_of_two_managers_do_not_conflict() -> Result<(), ApiError> {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "providers": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object"}}}}}});
        let req = |m: &'static str| ApplyRequest {
            manager: m,
            force: false,
            scope: Scope::All,
            api_version: "v1",
            schema: Some(&schema),
            now: "t",
        };
        let live = json!({"metadata": {"name": "a"}});
        let a = apply(&live, &json!({"spec": {"providers": [{"name": "local", "type": "local"}]}}), &req("one"))?;
        let b = apply(&a, &json!({"spec": {"providers": [{"name": "aws", "type": "aws", "region": "r"}]}}), &req("two"))?;
        assert_eq!(b["spec"]["providers"], json!([{"name": "local", "type": "local"}, {"name": "aws", "type": "aws", "region": "r"}]));
        // A field of another manager's entry set to a different value does conflict.
        let err = apply(&b, &json!({"spec": {"providers": [{"name": "aws", "region": "other"}]}}), &req("one"));
        assert_eq!(err.err().map(|e| e.code), Some(409));
        Ok(())
    }

    fn conditions_schema() -> Value {
        json!({"type": "object", "properties": {"status": {"type": "object", "properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object"}}}}}})
    }

    #[test]
    fn keyed_list_item_dropped_by_sole_owner_is_removed() -> Result<(), ApiError> {
        let schema = conditions_schema();
        let req = ApplyRequest { manager: "m", force: false, scope: Scope::Status, api_version: "v1", schema: Some(&schema), now: "t" };
        let live = json!({"metadata": {"name": "a"}});
        let a = apply(
            &live,
            &json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Paused", "status": "False", "reason": "x"}]}}),
            &req,
        )?;
        let b = apply(&a, &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}), &req)?;
        assert_eq!(b["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]));
        let fields = &read_managed(&b)[0].fields;
        assert!(fields.iter().all(|p| !p.iter().any(|t| t.contains("Paused"))), "{fields:?}");
        Ok(())
    }

    #[test]
    fn keyed_list_item_shared_keeps_other_managers_fields() -> Result<(), ApiError> {
        let schema = conditions_schema();
        let req = |m: &'static str| ApplyRequest {
            manager: m,
            force: false,
            scope: Scope::Status,
            api_version: "v1",
            schema: Some(&schema),
            now: "t",
        };
        let live = json!({"metadata": {"name": "a"}});
        let a = apply(
            &live,
            &json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Paused", "status": "False", "reason": "x"}]}}),
            &req("one"),
        )?;
        let b = apply(&a, &json!({"status": {"conditions": [{"type": "Paused", "message": "hi"}]}}), &req("two"))?;
        let c = apply(&b, &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}), &req("one"))?;
        assert_eq!(c["status"]["conditions"], json!([{"type": "Ready", "status": "True"}, {"type": "Paused", "message": "hi"}]));
        let d = apply(&c, &json!({"status": {"conditions": []}}), &req("two"))?;
        assert_eq!(d["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]));
        Ok(())
    }
}
