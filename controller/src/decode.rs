//! Watched objects decoded one by one, each within a depth and size budget.
//!
//! kube-rs decodes a list (or a watch event) in one piece: a single object it cannot decode
//! fails the whole list, the watch cache never syncs and nothing is reconciled at all. On a
//! real API server that is one `kubectl apply` away: `spec.config` of a TaskServ preserves
//! unknown fields and the API server accepts JSON nested thousands of levels deep, while
//! serde_json stops at 128 levels counted from the list (and an object's managedFields nest
//! as deep as its spec). Our own API server refuses objects deeper than 64 levels, but the
//! controller also runs against other API servers.
//!
//! So every watch of the controller ([`watch`]) decodes each item through [`Tolerant`]: the
//! item is read into a value at most [`MAX_DEPTH`] levels deep and [`MAX_SIZE`] bytes large (estimated)
//! (values plus string bytes), never descending further (the rest is skipped without
//! recursion), and only then converted into its type. An item that does not fit, or does not
//! decode into its type, is left out of the cache and reported once per version: a Warning
//! Event `Undecodable` on the object itself and one log line. Every other object goes on being
//! reconciled. (An object left out keeps its last decodable version in a cache that already
//! held it, until the next relist.)

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{LazyLock, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use provisioning_yaml::bounded::cost;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How deep one object may nest (the object itself is level 1). Well below serde_json's 128
/// levels counted from a list (list, `items` and the item take three), so that a decoded
/// object can be encoded and decoded again inside a list or a patch.
pub const MAX_DEPTH: usize = 100;

/// How much memory one decoded object may take, estimated with the cost model the API server
/// charges decoding with (`provisioning_yaml::bounded::cost`: a node per value, a B-tree leaf
/// per map, string bytes): a watch cache holds every object decoded, so an object of tiny
/// maps (about 90 times its size once decoded) is refused as `Undecodable` beyond this, not
/// held. Real objects take a small fraction of it; a tenant needs hundreds of objects at the
/// limit to fill the controller's memory (an object-count quota's job).
pub const MAX_SIZE: usize = 2 << 20;

/// The reason of the Event on an object the controller cannot decode.
pub const REASON: &str = "Undecodable";

/// One watched item: decoded into `K`, or the reason it could not be (and its metadata, so
/// that it can be named and reported).
#[derive(Clone, Debug)]
pub enum Tolerant<K> {
    /// The item, decoded.
    Decoded(K),
    /// The item could not be decoded; `meta` holds its name, namespace, uid and version.
    Undecodable {
        /// What is known of its metadata.
        meta: Box<ObjectMeta>,
        /// Why (for the Event and the log line).
        reason: String,
    },
}

impl<K> Tolerant<K> {
    /// The decoded item, if it was.
    pub fn into_decoded(self) -> Option<K> {
        match self {
            Tolerant::Decoded(k) => Some(k),
            Tolerant::Undecodable { .. } => None,
        }
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Tolerant<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn metadata_api() -> bool {
        K::metadata_api()
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Tolerant::Decoded(k) => k.meta(),
            Tolerant::Undecodable { meta, .. } => meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Tolerant::Decoded(k) => k.meta_mut(),
            Tolerant::Undecodable { meta, .. } => meta,
        }
    }
}

impl<K: Serialize> Serialize for Tolerant<K> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Tolerant::Decoded(k) => k.serialize(serializer),
            Tolerant::Undecodable { meta, .. } => serde_json::json!({ "metadata": meta }).serialize(serializer),
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Tolerant<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let budget = Budget::default();
        let value = Bounded { budget: &budget, depth: 1, metadata: false }.deserialize(deserializer)?;
        if let Some(exceeded) = budget.exceeded.get() {
            let reason = match exceeded {
                Exceeded::Depth => format!("it nests deeper than {MAX_DEPTH} levels"),
                Exceeded::Size => format!("it would take more than {} MiB of memory decoded", MAX_SIZE >> 20),
            };
            return Ok(Tolerant::Undecodable { meta: Box::new(slim_meta(&value)), reason });
        }
        let meta = Box::new(slim_meta(&value));
        Ok(match serde_json::from_value::<K>(value) {
            Ok(k) => Tolerant::Decoded(k),
            Err(e) => Tolerant::Undecodable { meta, reason: e.to_string() },
        })
    }
}

/// An object of any kind (as [`kube::api::DynamicObject`] is), read as a JSON value within
/// the same depth and size budget as [`Tolerant`]: for readers that show objects rather than
/// act on them (the web console, `provisioning trace`). An object over the budget keeps only
/// the metadata that names it, plus `"undecodable": <why>` at its top level.
#[derive(Clone, Debug)]
pub struct BoundedObject {
    /// The object (or its naming metadata and `undecodable`), with `apiVersion` and `kind`.
    pub value: Value,
    meta: ObjectMeta,
}

impl BoundedObject {
    /// The value, as read.
    pub fn into_value(self) -> Value {
        self.value
    }
}

/// `Resource` for a type of any kind (named by its `ApiResource`, as `DynamicObject` is) that
/// keeps its metadata in a field `meta`; `metadata_api` says whether it is asked for as
/// PartialObjectMetadata.
macro_rules! dynamic_resource {
    ($type:ty, metadata_api: $metadata_api:expr) => {
        impl Resource for $type {
            type DynamicType = kube::api::ApiResource;
            type Scope = kube::core::DynamicResourceScope;

            fn kind(dt: &kube::api::ApiResource) -> Cow<'_, str> {
                dt.kind.as_str().into()
            }
            fn group(dt: &kube::api::ApiResource) -> Cow<'_, str> {
                dt.group.as_str().into()
            }
            fn version(dt: &kube::api::ApiResource) -> Cow<'_, str> {
                dt.version.as_str().into()
            }
            fn api_version(dt: &kube::api::ApiResource) -> Cow<'_, str> {
                dt.api_version.as_str().into()
            }
            fn plural(dt: &kube::api::ApiResource) -> Cow<'_, str> {
                dt.plural.as_str().into()
            }
            fn metadata_api() -> bool {
                $metadata_api
            }
            fn meta(&self) -> &ObjectMeta {
                &self.meta
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.meta
            }
        }
    };
}

dynamic_resource!(BoundedObject, metadata_api: false);

impl Serialize for BoundedObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for BoundedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        bounded_object(deserializer, MAX_SIZE).map(|(object, _)| object)
    }
}

/// A change notice about an object of any kind, for watchers that only need to know that
/// something changed (the console's live streams): requested metadata-only (the API server
/// sends PartialObjectMetadata) and decoded to what names the object; everything else is
/// skipped unread, whatever its size or depth.
#[derive(Clone, Debug, Default)]
pub struct Notice {
    meta: ObjectMeta,
}

dynamic_resource!(Notice, metadata_api: true);

impl Serialize for Notice {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({ "metadata": {
            "name": self.meta.name, "namespace": self.meta.namespace, "uid": self.meta.uid,
            "resourceVersion": self.meta.resource_version,
        }})
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Notice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Unknown fields (spec, status, managedFields, labels…) are skipped by serde unread.
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            metadata: RawMeta,
        }
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct RawMeta {
            name: Option<String>,
            namespace: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
        }
        let raw = Raw::deserialize(deserializer)?.metadata;
        let meta = ObjectMeta {
            name: raw.name,
            namespace: raw.namespace,
            uid: raw.uid,
            resource_version: raw.resource_version,
            ..ObjectMeta::default()
        };
        Ok(Notice { meta })
    }
}

/// What the objects of one listing for display ([`bounded_page`]) may take decoded together,
/// estimated as [`MAX_SIZE`] is; objects past it are shown by name only.
pub const LIST_SIZE: usize = 16 << 20;

/// Reads one page of a list answer (`{"metadata":{"continue":…},"items":[…]}`) for display:
/// each item within [`MAX_SIZE`] and within what is `left` of the listing's budget (reduced
/// by what each item took); items past it keep only what names them. Returns the items and
/// the `continue` token.
pub fn bounded_page(text: &str, left: &mut usize) -> Result<(Vec<Value>, Option<String>), serde_json::Error> {
    let left_cell = Cell::new(*left);
    let page = {
        let mut de = serde_json::Deserializer::from_str(text);
        let page = PageSeed { left: &left_cell }.deserialize(&mut de)?;
        de.end()?;
        page
    };
    *left = left_cell.get();
    Ok(page)
}

struct PageSeed<'a> {
    left: &'a Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for PageSeed<'_> {
    type Value = (Vec<Value>, Option<String>);
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PageSeed<'_> {
    type Value = (Vec<Value>, Option<String>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        #[derive(Deserialize)]
        struct ListMeta {
            #[serde(default, rename = "continue")]
            continue_token: Option<String>,
        }
        let (mut items, mut token) = (Vec::new(), None);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "items" => items = map.next_value_seed(ItemsSeed { left: self.left })?,
                "metadata" => token = map.next_value::<ListMeta>()?.continue_token.filter(|t| !t.is_empty()),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((items, token))
    }
}

struct ItemsSeed<'a> {
    left: &'a Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Vec<Value>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Vec<Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list's items")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some((object, used)) = seq.next_element_seed(ItemSeed { limit: self.left.get().min(MAX_SIZE) })? {
            self.left.set(self.left.get().saturating_sub(used));
            items.push(object.value);
        }
        Ok(items)
    }
}

struct ItemSeed {
    limit: usize,
}

impl<'de> DeserializeSeed<'de> for ItemSeed {
    type Value = (BoundedObject, usize);
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        bounded_object(deserializer, self.limit)
    }
}

/// One object read within `limit` (estimated): the object, and what it took.
fn bounded_object<'de, D: Deserializer<'de>>(deserializer: D, limit: usize) -> Result<(BoundedObject, usize), D::Error> {
    {
        let budget = Budget { limit, ..Budget::default() };
        let mut value = Bounded { budget: &budget, depth: 1, metadata: false }.deserialize(deserializer)?;
        let meta = slim_meta(&value);
        if let Some(exceeded) = budget.exceeded.get() {
            let reason = match exceeded {
                Exceeded::Depth => format!("it nests deeper than {MAX_DEPTH} levels"),
                Exceeded::Size if limit < MAX_SIZE => {
                    format!("the objects listed before it use up what a listing may take decoded ({} MiB)", LIST_SIZE >> 20)
                }
                Exceeded::Size => format!("it would take more than {} MiB of memory decoded", MAX_SIZE >> 20),
            };
            let field = |key: &str| value.get(key).filter(|v| v.is_string()).cloned().unwrap_or(Value::Null);
            value = serde_json::json!({
                "apiVersion": field("apiVersion"),
                "kind": field("kind"),
                "metadata": {
                    "name": meta.name, "namespace": meta.namespace, "uid": meta.uid,
                    "resourceVersion": meta.resource_version, "generation": meta.generation,
                },
                "undecodable": reason,
            });
        }
        Ok((BoundedObject { value, meta }, budget.used.get().min(limit)))
    }
}

/// The metadata that names an object (what survives of it when the rest does not decode).
fn slim_meta(value: &Value) -> ObjectMeta {
    let meta = value.get("metadata");
    let text = |key: &str| meta.and_then(|m| m.get(key)).and_then(Value::as_str).map(str::to_string);
    ObjectMeta {
        name: text("name"),
        namespace: text("namespace"),
        uid: text("uid"),
        resource_version: text("resourceVersion"),
        generation: meta.and_then(|m| m.get("generation")).and_then(Value::as_i64),
        ..ObjectMeta::default()
    }
}

#[derive(Clone, Copy, Debug)]
enum Exceeded {
    Depth,
    Size,
}

struct Budget {
    used: Cell<usize>,
    exceeded: Cell<Option<Exceeded>>,
    limit: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { used: Cell::new(0), exceeded: Cell::new(None), limit: MAX_SIZE }
    }
}

/// The metadata fields that name an object, read whatever came before them (a tenant's
/// managedFields or labels sort first and can use up the budget), each within its own small
/// budget: an undecodable object is still reported, marked and skipped by its uid.
const IDENTITY: &[&str] = &["name", "namespace", "uid", "resourceVersion", "generation"];
const IDENTITY_BUDGET: usize = 4096;

impl Budget {
    /// Counts `units`; false once the object is over its size.
    fn spend(&self, units: usize) -> bool {
        self.used.set(self.used.get().saturating_add(units));
        if self.used.get() > self.limit {
            self.exceeded.set(Some(Exceeded::Size));
        }
        self.exceeded.get().is_none()
    }
}

/// Reads a value `depth` levels down; past [`MAX_DEPTH`] or [`MAX_SIZE`] it records that and
/// skips the rest (serde_json skips without recursion).
struct Bounded<'a> {
    budget: &'a Budget,
    depth: usize,
    /// The object's `metadata` map: its [`IDENTITY`] fields are read even over budget.
    metadata: bool,
}

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.budget.spend(cost::NODE);
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.budget.spend(cost::NODE);
        Ok(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.budget.spend(cost::NODE);
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.budget.spend(cost::NODE);
        Ok(Value::from(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.visit_string(v.to_string())
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.spend(cost::NODE + cost::bytes(v.len()));
        Ok(Value::String(v))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.budget.spend(cost::NODE);
        Ok(Value::Null)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        if !self.enter() {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Value::Null);
        }
        loop {
            if self.budget.exceeded.get().is_some() {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                break;
            }
            match seq.next_element_seed(Bounded { budget: self.budget, depth: self.depth + 1, metadata: false })? {
                Some(v) => items.push(v),
                None => break,
            }
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Map::new();
        // The object itself is always entered: what names it is read whatever the budget.
        if !self.enter() && !self.metadata && self.depth > 1 {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Value::Null);
        }
        while let Some(key) = map.next_key::<String>()? {
            let entry = if fields.is_empty() { cost::FIRST_ENTRY } else { cost::ENTRY };
            let metadata = self.depth == 1 && key == "metadata";
            if !self.budget.spend(entry + cost::bytes(key.len())) && !metadata {
                if self.metadata && IDENTITY.contains(&key.as_str()) {
                    // Its own small budget: what it exceeds is not kept, and is not counted
                    // against the object (already over).
                    let own = Budget { limit: IDENTITY_BUDGET, ..Budget::default() };
                    let value = map.next_value_seed(Bounded { budget: &own, depth: self.depth + 1, metadata: false })?;
                    if own.exceeded.get().is_none() {
                        fields.insert(key, value);
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
                continue;
            }
            let value = map.next_value_seed(Bounded { budget: self.budget, depth: self.depth + 1, metadata })?;
            fields.insert(key, value);
        }
        Ok(Value::Object(fields))
    }
}

impl Bounded<'_> {
    /// Counts a list or map at this level; false when it is one level too deep (or the
    /// object is already over budget) and is to be skipped.
    fn enter(&self) -> bool {
        if self.depth > MAX_DEPTH {
            self.budget.exceeded.set(Some(Exceeded::Depth));
        }
        self.budget.spend(cost::NODE)
    }
}

/// What the controller watches: `K` cluster-wide, each item decoded on its own. The items
/// that do not decode are reported ([`report`]) and left out; the stream goes on.
pub fn watch<K>(client: &Client, config: watcher::Config) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    watch_in(client, Api::<Tolerant<K>>::all(client.clone()), config)
}

/// [`watch`] over `api` (one namespace's, for instance), each item decoded on its own.
pub fn watch_in<K>(
    client: &Client,
    api: Api<Tolerant<K>>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    let reporter = client.clone();
    watcher(api, config).filter_map(move |event| {
        let decoded = event.map(|event| decoded_event(event, &reporter));
        futures::future::ready(match decoded {
            Ok(Some(event)) => Some(Ok(event)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })
    })
}

/// [`watch`]'s objects as a trigger stream (for `Controller::watches_stream` and
/// `owns_stream`, in place of `watches` and `owns`, which decode whole lists).
pub fn touched<K>(client: &Client, config: watcher::Config) -> impl Stream<Item = Result<K, watcher::Error>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    use kube::runtime::WatchStreamExt;
    watch::<K>(client, config).touched_objects()
}

/// The `K` of `namespace` that `params` selects, listed and decoded one by one: an object that
/// does not decode is reported ([`report`]) and left out of the list, not fatal to it.
pub async fn list<K>(client: &Client, namespace: &str, params: &kube::api::ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope> + Clone + DeserializeOwned + fmt::Debug,
{
    let list = Api::<Tolerant<K>>::namespaced(client.clone(), namespace).list(params).await?;
    Ok(keep_decoded(client, list.items))
}

/// Every `K` (a cluster-scoped kind) that `params` selects, decoded one by one as [`list`]
/// does: one undecodable Workspace does not hide the others.
pub async fn list_cluster<K>(client: &Client, params: &kube::api::ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope> + Clone + DeserializeOwned + fmt::Debug,
{
    let list = Api::<Tolerant<K>>::all(client.clone()).list(params).await?;
    Ok(keep_decoded(client, list.items))
}

fn keep_decoded<K: Resource<DynamicType = ()>>(client: &Client, items: Vec<Tolerant<K>>) -> Vec<K> {
    items
        .into_iter()
        .filter_map(|item| match item {
            Tolerant::Decoded(k) => Some(k),
            Tolerant::Undecodable { meta, reason } => {
                report::<K>(client, &meta, &reason);
                None
            }
        })
        .collect()
}

/// A watch event of decoded items: `None` for an item that did not decode (reported, and
/// marked as a newer version than the cached copy: see [`superseded_by_undecodable`]).
fn decoded_event<K>(event: watcher::Event<Tolerant<K>>, client: &Client) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()>,
{
    let decoded = |item: Tolerant<K>, applied: bool| match item {
        Tolerant::Decoded(k) => {
            if applied {
                Undecodable::decoded::<K>(k.meta());
            } else {
                Undecodable::forget::<K>(k.meta());
            }
            Some(k)
        }
        Tolerant::Undecodable { meta, reason } => {
            report::<K>(client, &meta, &reason);
            if applied {
                Undecodable::mark::<K>(&meta);
            } else {
                Undecodable::forget::<K>(&meta);
            }
            None
        }
    };
    match event {
        watcher::Event::Apply(item) => decoded(item, true).map(watcher::Event::Apply),
        watcher::Event::Delete(item) => decoded(item, false).map(watcher::Event::Delete),
        watcher::Event::InitApply(item) => decoded(item, true).map(watcher::Event::InitApply),
        watcher::Event::Init => Some(watcher::Event::Init),
        watcher::Event::InitDone => Some(watcher::Event::InitDone),
    }
}

/// Objects (by the decoded type and uid: a metadata-only watch of the same kind decodes what a
/// full one cannot) whose newest version seen by a watch did not decode, with that version's
/// resourceVersion: the cache still holds an older copy (or none), which must not be acted on
/// — its spec is not what the object says now, and a write made for it answers with the live
/// version, which is the one too large to decode. Bounded: forgotten when full (then an old
/// copy may be acted on again, as before this mark existed).
static UNDECODABLE: LazyLock<Mutex<HashMap<String, String>>> = LazyLock::new(Mutex::default);
const UNDECODABLE_CAP: usize = 10_000;

struct Undecodable;

impl Undecodable {
    fn key<K>(uid: &str) -> String {
        format!("{}/{uid}", std::any::type_name::<K>())
    }

    fn mark<K>(meta: &ObjectMeta) {
        let (Some(uid), Some(rv)) = (meta.uid.as_deref(), meta.resource_version.as_deref()) else { return };
        let key = Self::key::<K>(uid);
        let mut marks = UNDECODABLE.lock().unwrap_or_else(|p| p.into_inner());
        if marks.len() >= UNDECODABLE_CAP && !marks.contains_key(&key) {
            marks.clear();
        }
        marks.insert(key, rv.to_string());
    }

    /// A decodable version arrived: a mark for an older (or the same) version goes.
    fn decoded<K>(meta: &ObjectMeta) {
        let (Some(uid), Some(rv)) = (meta.uid.as_deref(), meta.resource_version.as_deref()) else { return };
        let key = Self::key::<K>(uid);
        let mut marks = UNDECODABLE.lock().unwrap_or_else(|p| p.into_inner());
        if marks.get(&key).is_some_and(|marked| !newer(marked, rv)) {
            marks.remove(&key);
        }
    }

    fn forget<K>(meta: &ObjectMeta) {
        if let Some(uid) = meta.uid.as_deref() {
            UNDECODABLE.lock().unwrap_or_else(|p| p.into_inner()).remove(&Self::key::<K>(uid));
        }
    }
}

/// Whether resourceVersion `a` is newer than `b`: compared as numbers where both are (etcd and
/// the embedded control plane); otherwise any other value counts as newer (opaque versions).
fn newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => a != b,
    }
}

/// Whether a newer version of the object `meta` describes (a cached copy) was seen by a watch
/// and could not be decoded: then the copy is out of date and is not acted on until a
/// decodable version arrives (the Warning Event on the object says why).
pub fn superseded_by_undecodable<K: Resource>(obj: &K) -> bool {
    let meta = obj.meta();
    let (Some(uid), Some(rv)) = (meta.uid.as_deref(), meta.resource_version.as_deref()) else { return false };
    let key = Undecodable::key::<K>(uid);
    UNDECODABLE.lock().unwrap_or_else(|p| p.into_inner()).get(&key).is_some_and(|marked| newer(marked, rv))
}

/// Object versions already reported (uid and resourceVersion), so that several watches of the
/// same kind, and relists, report each version once. Bounded: forgotten when full.
static REPORTED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);
const REPORTED_CAP: usize = 10_000;

/// Reports an object that could not be decoded: one log line and a Warning Event on the
/// object, once per version.
pub fn report<K: Resource<DynamicType = ()>>(client: &Client, meta: &ObjectMeta, reason: &str) {
    let key = format!(
        "{}/{}/{}@{}",
        K::kind(&()),
        meta.uid.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.resource_version.as_deref().unwrap_or_default()
    );
    {
        let mut reported = REPORTED.lock().unwrap_or_else(|p| p.into_inner());
        if reported.len() >= REPORTED_CAP {
            reported.clear();
        }
        if !reported.insert(key) {
            return;
        }
    }
    let kind = K::kind(&()).to_string();
    tracing::warn!(
        kind,
        namespace = meta.namespace.as_deref(),
        name = meta.name.as_deref(),
        resource_version = meta.resource_version.as_deref(),
        reason,
        "object cannot be decoded; it is not reconciled until it is fixed"
    );
    let note = crate::conditions::truncate(
        &format!("The controller cannot decode this {kind}: {reason}. It is not reconciled until it is fixed (every other object is)."),
        1000,
    );
    let regarding = ObjectReference {
        api_version: Some(K::api_version(&()).to_string()),
        kind: Some(kind),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..ObjectReference::default()
    };
    let publisher = crate::events::Publisher::new(client.clone(), crate::events::FIELD_MANAGER, "watch");
    tokio::spawn(async move {
        let what = crate::events::Occurrence { type_: EventType::Warning, reason: REASON, action: "Decode", note: Some(&note) };
        if let Err(e) = publisher.publish(&what, &regarding).await {
            tracing::debug!(error = %e, "could not publish the Undecodable event");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ObjectList;

    #[tokio::test]
    async fn a_cached_copy_is_superseded_while_its_newer_version_does_not_decode() -> Result<(), Box<dyn std::error::Error>> {
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
        let meta = |rv: &str| ObjectMeta {
            name: Some("t".into()),
            namespace: Some("n".into()),
            uid: Some(format!("uid-superseded-{}", std::process::id())),
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        };
        let copy = |rv: &str| provisioning_crds::TaskServ { metadata: meta(rv), spec: Default::default(), status: None };
        let undecodable =
            |rv: &str| Tolerant::<provisioning_crds::TaskServ>::Undecodable { meta: Box::new(meta(rv)), reason: "too large".into() };
        // Cached at 5; version 7 arrives and does not decode: the copy at 5 is out of date.
        assert!(decoded_event(watcher::Event::Apply(Tolerant::Decoded(copy("5"))), &client).is_some());
        assert!(!superseded_by_undecodable(&copy("5")));
        assert!(decoded_event(watcher::Event::Apply(undecodable("7")), &client).is_none());
        assert!(superseded_by_undecodable(&copy("5")), "the cached copy is older than the undecodable version");
        // Only for the kind whose decode failed (a metadata-only cache of it is not affected).
        let meta_only: kube::api::PartialObjectMeta<provisioning_crds::TaskServ> = serde_json::from_value(
            serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta("5")}),
        )?;
        assert!(!superseded_by_undecodable(&meta_only));
        // A fixed version (8) decodes: acted on again.
        assert!(decoded_event(watcher::Event::Apply(Tolerant::Decoded(copy("8"))), &client).is_some());
        assert!(!superseded_by_undecodable(&copy("8")));
        // Deleted while undecodable: the mark goes with it.
        assert!(decoded_event(watcher::Event::Apply(undecodable("9")), &client).is_none());
        assert!(decoded_event(watcher::Event::Delete(undecodable("10")), &client).is_none());
        assert!(!superseded_by_undecodable(&copy("8")));
        Ok(())
    }

    /// `levels` maps, one inside the other.
    fn nested(levels: usize) -> String {
        let mut s = String::from("1");
        for _ in 0..levels {
            s = format!("{{\"a\":{s}}}");
        }
        s
    }

    /// Like our kinds: `spec` holds free-form JSON (a TaskServ's `config` preserves unknown
    /// fields), decoded in full, so depth counts.
    #[derive(Clone, Debug, Deserialize)]
    struct Thing {
        metadata: ObjectMeta,
        #[allow(dead_code, reason = "decoded for its depth, as a kind's spec is")]
        spec: serde_json::Value,
    }

    fn list(items: &[String]) -> String {
        format!("{{\"apiVersion\":\"v1\",\"kind\":\"List\",\"metadata\":{{\"resourceVersion\":\"7\"}},\"items\":[{}]}}", items.join(","))
    }

    fn item(name: &str, spec: &str) -> String {
        format!(
            "{{\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"n\",\"uid\":\"u-{name}\",\"resourceVersion\":\"3\"}},\"spec\":{spec}}}"
        )
    }

    #[test]
    fn a_list_with_one_deep_item_decodes_the_others() -> Result<(), serde_json::Error> {
        let text = list(&[item("ok", "{\"x\":1}"), item("deep", &nested(130)), item("ok2", "{}")]);
        // Whole-list decoding (what kube-rs does) fails on the deep item:
        assert!(serde_json::from_str::<ObjectList<Thing>>(&text).is_err());
        let list: ObjectList<Tolerant<Thing>> = serde_json::from_str(&text)?;
        let names: Vec<_> = list
            .items
            .iter()
            .map(|i| match i {
                Tolerant::Decoded(t) => (t.metadata.name.clone().unwrap_or_default(), true),
                Tolerant::Undecodable { meta, .. } => (meta.name.clone().unwrap_or_default(), false),
            })
            .collect();
        assert_eq!(names, vec![("ok".into(), true), ("deep".into(), false), ("ok2".into(), true)]);
        let Tolerant::Undecodable { meta, reason } = &list.items[1] else {
            return Err(serde::de::Error::custom("the deep item decoded"));
        };
        assert_eq!(meta.uid.as_deref(), Some("u-deep"));
        assert!(reason.contains("deeper than 100"), "{reason}");
        Ok(())
    }

    #[test]
    fn depth_is_counted_from_the_object() -> Result<(), serde_json::Error> {
        // item (level 1) → spec (levels 2…): MAX_DEPTH levels in all is fine, one more is not.
        let fits = format!("[{}]", item("a", &nested(MAX_DEPTH - 1)));
        let over = format!("[{}]", item("a", &nested(MAX_DEPTH)));
        let fits: Vec<Tolerant<Thing>> = serde_json::from_str(&fits)?;
        let over: Vec<Tolerant<Thing>> = serde_json::from_str(&over)?;
        assert!(matches!(fits[0], Tolerant::Decoded(_)));
        assert!(matches!(over[0], Tolerant::Undecodable { .. }));
        Ok(())
    }

    #[test]
    fn very_deep_and_very_large_items_cost_bounded_work() -> Result<(), serde_json::Error> {
        let deep = format!("[{}]", item("a", &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000))));
        let items: Vec<Tolerant<Thing>> = serde_json::from_str(&deep)?;
        assert!(matches!(items[0], Tolerant::Undecodable { .. }));
        let big = format!("[{}]", item("a", &format!("[{}0]", "0,".repeat(MAX_SIZE / 16))));
        let items: Vec<Tolerant<Thing>> = serde_json::from_str(&big)?;
        let Tolerant::Undecodable { reason, .. } = &items[0] else {
            return Err(serde::de::Error::custom("the large item decoded"));
        };
        assert!(reason.contains("MiB of memory decoded"), "{reason}");
        Ok(())
    }

    #[test]
    fn an_undecodable_item_keeps_its_name_and_uid_whatever_sorts_before_them() -> Result<(), serde_json::Error> {
        // Keys arrive sorted: managedFields (and labels, annotations, finalizers) before name,
        // namespace, resourceVersion and uid. Bloated or deep, they use up the budget first.
        let bloat = format!("[{}{{\"a\":{{}}}}]", "{\"a\":{}},".repeat(40_000));
        let deep = format!("{}1{}", "{\"a\":".repeat(200), "}".repeat(200));
        for managed in [bloat, deep] {
            let text = format!(
                r#"[{{"apiVersion":"v1","kind":"Thing","metadata":{{"managedFields":{managed},"name":"t","namespace":"n","resourceVersion":"7","uid":"u-7"}},"spec":{{}}}}]"#
            );
            let items: Vec<Tolerant<Thing>> = serde_json::from_str(&text)?;
            let Tolerant::Undecodable { meta, .. } = &items[0] else {
                return Err(serde::de::Error::custom("the bloated item decoded"));
            };
            let seen = (meta.name.as_deref(), meta.namespace.as_deref(), meta.resource_version.as_deref(), meta.uid.as_deref());
            assert_eq!(seen, (Some("t"), Some("n"), Some("7"), Some("u-7")));
        }
        // An identity field that is itself oversized is left out, not kept.
        let long = "x".repeat(IDENTITY_BUDGET * 2);
        let bloat = format!("[{}{{\"a\":{{}}}}]", "{\"a\":{}},".repeat(40_000));
        let text = format!(r#"[{{"metadata":{{"managedFields":{bloat},"name":"{long}","uid":"u-8"}}}}]"#);
        let items: Vec<Tolerant<Thing>> = serde_json::from_str(&text)?;
        let Tolerant::Undecodable { meta, .. } = &items[0] else { return Err(serde::de::Error::custom("decoded")) };
        assert_eq!((meta.name.as_deref(), meta.uid.as_deref()), (None, Some("u-8")));
        Ok(())
    }

    #[test]
    fn an_item_that_decodes_to_far_more_than_its_size_is_undecodable() -> Result<(), serde_json::Error> {
        // 300,000 one-entry maps: 2.4 MB of text, about 230 MB decoded (a B-tree leaf each).
        // Counted by values it was 600,000 units, under the old limit, and held in the cache.
        let maps = format!("[{}{{\"\":0}}]", "{\"\":0},".repeat(299_999));
        let items: Vec<Tolerant<Thing>> = serde_json::from_str(&format!("[{}]", item("a", &maps)))?;
        assert!(matches!(items[0], Tolerant::Undecodable { .. }));
        // An ordinary config decodes.
        let fine = format!("[{}]", item("a", r#"{"backends":[{"name":"web","port":80}],"replicas":3}"#));
        let items: Vec<Tolerant<Thing>> = serde_json::from_str(&fine)?;
        assert!(matches!(items[0], Tolerant::Decoded(_)));
        Ok(())
    }

    #[test]
    fn objects_shown_by_the_console_and_trace_are_read_within_the_budget() -> Result<(), serde_json::Error> {
        // Twenty-first re-review H3: the console decoded a tenant's TaskServ of 209,692 tiny
        // maps (3 MiB) whole, twice (~300 MiB), in the controller's process.
        let maps = format!("[{}{{\"a\":0,\"bb\":0}}]", "{\"a\":0,\"bb\":0},".repeat(209_691));
        let text = list(&[item("big", &format!("{{\"config\":{{\"x\":{maps}}}}}")), item("ok", r#"{"config":{"port":80}}"#)]);
        let list: ObjectList<BoundedObject> = serde_json::from_str(&text)?;
        let big = &list.items[0].value;
        assert!(big["undecodable"].as_str().is_some_and(|r| r.contains("MiB of memory decoded")), "{}", big["undecodable"]);
        assert_eq!((big["metadata"]["name"].as_str(), big.get("spec")), (Some("big"), None));
        assert_eq!(list.items[0].meta().uid.as_deref(), Some("u-big"));
        let ok = &list.items[1].value;
        assert_eq!((ok["spec"]["config"]["port"].as_i64(), ok.get("undecodable")), (Some(80), None));
        Ok(())
    }

    #[test]
    fn a_listing_for_display_is_bounded_as_a_whole_not_only_per_object() -> Result<(), serde_json::Error> {
        // Twenty-second review H: 150 objects of ~30 KiB of tiny maps each stay under the
        // per-object budget but decode to ~200 MiB together.
        let maps = format!("[{}{{\"a\":0,\"bb\":0}}]", "{\"a\":0,\"bb\":0},".repeat(2_200));
        let items: Vec<String> = (0..150).map(|i| item(&format!("t{i}"), &format!("{{\"config\":{{\"x\":{maps}}}}}"))).collect();
        let text = format!("{{\"kind\":\"List\",\"metadata\":{{\"continue\":\"next-page\"}},\"items\":[{}]}}", items.join(","));
        let mut left = LIST_SIZE;
        let (read, token) = bounded_page(&text, &mut left)?;
        assert_eq!((read.len(), token.as_deref()), (150, Some("next-page")));
        let full = read.iter().filter(|o| o.get("undecodable").is_none()).count();
        assert!(full > 0 && full < 150, "{full} of 150 read in full");
        let last = &read[149];
        assert_eq!(last["metadata"]["name"].as_str(), Some("t149"));
        assert!(last["undecodable"].as_str().is_some_and(|r| r.contains("use up what a listing may take")), "{}", last["undecodable"]);
        assert_eq!(left, 0);
        // The next page of the same listing has nothing left: names only.
        let (again, token) = bounded_page(&list(&[item("small", "{}")]), &mut left)?;
        assert_eq!((again[0]["metadata"]["name"].as_str(), again[0].get("undecodable").is_some(), token), (Some("small"), true, None));
        // A fresh listing reads ordinary objects in full.
        let mut left = LIST_SIZE;
        let (fine, _) = bounded_page(&list(&[item("a", r#"{"config":{"port":80}}"#)]), &mut left)?;
        assert_eq!(fine[0]["spec"]["config"]["port"].as_i64(), Some(80));
        Ok(())
    }

    #[test]
    fn a_notice_reads_only_what_names_the_object() -> Result<(), serde_json::Error> {
        // Twenty-third review H1: the console's live streams decoded every watched object.
        let bloat = format!("[{}{{\"a\":{{}}}}]", "{\"a\":{},\"bb\":0},".repeat(40_000));
        let deep = format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000));
        let text = format!(
            r#"{{"kind":"PartialObjectMetadataList","metadata":{{"resourceVersion":"9"}},"items":[{{"metadata":{{"managedFields":{bloat},"labels":{{"x":"y"}},"name":"t","namespace":"n","resourceVersion":"7","uid":"u-7"}},"spec":{deep}}}]}}"#
        );
        let list: ObjectList<Notice> = serde_json::from_str(&text)?;
        let meta = list.items[0].meta();
        let seen = (meta.name.as_deref(), meta.namespace.as_deref(), meta.resource_version.as_deref(), meta.uid.as_deref());
        assert_eq!(seen, (Some("t"), Some("n"), Some("7"), Some("u-7")));
        assert!(meta.managed_fields.is_none() && meta.labels.is_none());
        assert!(Notice::metadata_api(), "requested as PartialObjectMetadata");
        Ok(())
    }

    #[test]
    fn an_item_of_the_wrong_shape_is_undecodable_not_fatal() -> Result<(), serde_json::Error> {
        #[derive(Clone, Debug, Deserialize)]
        struct Strict {
            #[allow(dead_code)]
            spec: std::collections::BTreeMap<String, u32>,
        }
        let items: Vec<Tolerant<Strict>> =
            serde_json::from_str(&format!("[{},{}]", item("bad", "{\"x\":\"y\"}"), item("good", "{\"x\":1}")))?;
        assert!(matches!(items[0], Tolerant::Undecodable { .. }));
        assert!(matches!(items[1], Tolerant::Decoded(_)));
        Ok(())
    }
}
