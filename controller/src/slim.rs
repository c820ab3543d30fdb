//! Write answers and single reads decoded only as far as the controller needs them.
//!
//! A write (a status patch, an annotation, a finalizer, a child's server-side apply, a
//! relabel) answers with the whole live object, and its live version is whatever its tenant
//! made it: up to the API server's object size, nested as deep as a real API server stores
//! under a field that preserves unknown fields. Decoded into a `DynamicObject` or a typed
//! object, 1 MiB of tiny maps costs ~70 MiB, and a 130-deep map is an error after the write
//! succeeded. The watch caches bound their decode ([`crate::decode`]); these answers are
//! decoded here into [`Slim`]: the metadata the controller reads (name, uid, resourceVersion,
//! generation, annotations, finalizers, the first labels and ownerReferences, and of each
//! managedFields entry who wrote it and which top-level spec fields and annotations it owns). serde_json skips everything else
//! without building it (iteratively, whatever its depth), so an answer costs its text (the
//! API server's object size limit) and the few fields kept.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time};
use kube::api::{ApiResource, GetParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

/// An object as a write answered it, or a single read returned it: its metadata only (see the
/// module docs for what is kept).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Slim {
    /// The kept metadata.
    #[serde(default)]
    metadata: SlimMeta,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    annotations: Option<BTreeMap<String, String>>,
    labels: Option<CappedLabels>,
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<Time>,
    owner_references: Option<Capped<OwnerReference>>,
    managed_fields: Option<ManagedList>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimManaged {
    manager: Option<String>,
    operation: Option<String>,
    subresource: Option<String>,
    time: Option<Time>,
    #[serde(rename = "fieldsV1")]
    fields_v1: Option<SlimFields>,
}

/// Of a managedFields entry's field set: the top-level spec fields and the controller's own
/// annotations (`provisioning.dev/…`) owned — at most [`KEYS`] of each (a client can write
/// managedFields, phantom keys included).
#[derive(Clone, Debug, Default, Deserialize)]
struct SlimFields {
    #[serde(rename = "f:metadata")]
    metadata: Option<SlimFieldsMeta>,
    #[serde(rename = "f:spec")]
    spec: Option<Keys<AnyKey>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct SlimFieldsMeta {
    #[serde(rename = "f:annotations")]
    annotations: Option<Keys<OurAnnotation>>,
}

/// The first [`KEYS`] items of a list (the rest skipped).
#[derive(Clone, Debug, Default)]
struct Capped<T> {
    items: Vec<T>,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Capped<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Capped<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Capped<T>, A::Error> {
                let mut items = Vec::new();
                while items.len() < KEYS {
                    match seq.next_element::<T>()? {
                        Some(item) => items.push(item),
                        None => return Ok(Capped { items }),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Capped { items })
            }
        }
        deserializer.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// A managedFields list: the first [`KEYS`] entries, and after them up to [`KEYS`] more that
/// own one of the controller's annotations (a client can write managedFields, as many entries
/// as the object's size allows; the entries that matter are those owning our annotations).
#[derive(Clone, Debug, Default)]
struct ManagedList {
    entries: Vec<SlimManaged>,
}

impl SlimManaged {
    fn owns_our_annotation(&self) -> bool {
        self.fields_v1.as_ref().and_then(|f| f.metadata.as_ref()).and_then(|m| m.annotations.as_ref()).is_some_and(|a| !a.keys.is_empty())
    }
}

impl<'de> Deserialize<'de> for ManagedList {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ManagedList;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a managedFields list")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ManagedList, A::Error> {
                let mut entries = Vec::new();
                let mut ours_beyond = 0;
                while let Some(entry) = seq.next_element::<SlimManaged>()? {
                    if entries.len() < KEYS {
                        entries.push(entry);
                    } else if ours_beyond < KEYS && entry.owns_our_annotation() {
                        ours_beyond += 1;
                        entries.push(entry);
                    }
                }
                Ok(ManagedList { entries })
            }
        }
        deserializer.deserialize_seq(Visit)
    }
}

/// The first [`KEYS`] labels (a tenant may add as many as the object's size allows).
#[derive(Clone, Debug, Default)]
struct CappedLabels {
    labels: BTreeMap<String, String>,
}

impl<'de> Deserialize<'de> for CappedLabels {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = CappedLabels;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("labels")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<CappedLabels, A::Error> {
                let mut labels = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if labels.len() < KEYS && key.len() <= MAX_KEY_LEN {
                        labels.insert(key, map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(CappedLabels { labels })
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// Most keys kept of one field set's map.
const KEYS: usize = 64;
/// Longest field-set key kept (`f:` and a field name; longer ones are no field of ours).
const MAX_KEY_LEN: usize = 320;

/// Which keys of a field set's map are kept.
trait KeyFilter {
    fn keep(key: &str) -> bool;
}

#[derive(Clone, Debug, Default)]
struct AnyKey;
impl KeyFilter for AnyKey {
    fn keep(_: &str) -> bool {
        true
    }
}

#[derive(Clone, Debug, Default)]
struct OurAnnotation;
impl KeyFilter for OurAnnotation {
    fn keep(key: &str) -> bool {
        key.starts_with("f:provisioning.dev/")
    }
}

/// The keys of a map (values skipped), at most [`KEYS`] that `F` keeps.
#[derive(Clone, Debug, Default)]
struct Keys<F> {
    keys: Vec<String>,
    filter: std::marker::PhantomData<F>,
}

impl<'de, F: KeyFilter> Deserialize<'de> for Keys<F> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<F>(std::marker::PhantomData<F>);
        impl<'de, F: KeyFilter> serde::de::Visitor<'de> for Visit<F> {
            type Value = Keys<F>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field set map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys<F>, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    map.next_value::<IgnoredAny>()?;
                    if keys.len() < KEYS && key.len() <= MAX_KEY_LEN && F::keep(&key) {
                        keys.push(key.into_owned());
                    }
                }
                Ok(Keys { keys, filter: std::marker::PhantomData })
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl Slim {
    /// The kept metadata as an `ObjectMeta`; each managedFields entry's `fieldsV1` holds only
    /// the owned annotations and top-level spec fields (each as `{}`).
    pub fn meta(&self) -> ObjectMeta {
        let m = &self.metadata;
        ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            generation: m.generation,
            annotations: m.annotations.clone(),
            labels: m.labels.as_ref().map(|l| l.labels.clone()),
            finalizers: m.finalizers.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
            owner_references: m.owner_references.as_ref().map(|o| o.items.clone()),
            managed_fields: m.managed_fields.as_ref().map(|all| all.entries.iter().map(SlimManaged::entry).collect()),
            ..ObjectMeta::default()
        }
    }

    /// The uid.
    pub fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    /// The resourceVersion written.
    pub fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }
}

impl SlimManaged {
    fn entry(&self) -> ManagedFieldsEntry {
        let fields = self.fields_v1.as_ref().map(|f| {
            let keys = |keys: &[String]| keys.iter().map(|k| (k.clone(), serde_json::json!({}))).collect::<serde_json::Map<_, _>>();
            let mut out = serde_json::Map::new();
            if let Some(annotations) = f.metadata.as_ref().and_then(|m| m.annotations.as_ref()) {
                out.insert("f:metadata".into(), serde_json::json!({ "f:annotations": keys(&annotations.keys) }));
            }
            if let Some(spec) = &f.spec {
                out.insert("f:spec".into(), serde_json::Value::Object(keys(&spec.keys)));
            }
            FieldsV1(serde_json::Value::Object(out))
        });
        ManagedFieldsEntry {
            manager: self.manager.clone(),
            operation: self.operation.clone(),
            subresource: self.subresource.clone(),
            time: self.time.clone(),
            fields_v1: fields,
            ..ManagedFieldsEntry::default()
        }
    }
}

/// A Secret or ConfigMap read for some of its keys: its slim metadata and only the data keys
/// the reader asked for (a tenant's object may hold ~1 MiB of tiny keys, tens of MiB decoded).
#[derive(Clone, Debug, Default)]
pub struct SlimData {
    /// Slim metadata (owner references included, the first [`KEYS`]).
    pub meta: ObjectMeta,
    /// Kept keys of the base64 map (a Secret's `data`, a ConfigMap's `binaryData`).
    pub bytes: BTreeMap<String, ByteString>,
    /// Kept keys of the text map (a ConfigMap's `data`).
    pub text: BTreeMap<String, String>,
    /// The Secret's `type`.
    pub type_: Option<String>,
}

impl SlimData {
    /// As a Secret holding only the kept keys.
    pub fn secret(self) -> Secret {
        Secret { metadata: self.meta, data: Some(self.bytes), type_: self.type_, ..Secret::default() }
    }

    /// As a ConfigMap holding only the kept keys.
    pub fn config_map(self) -> ConfigMap {
        ConfigMap { metadata: self.meta, data: Some(self.text), binary_data: Some(self.bytes), ..ConfigMap::default() }
    }
}

/// Decodes a Secret (`secret`) or ConfigMap answer keeping the data keys `keep` accepts.
struct DataSeed<'a> {
    keep: &'a (dyn Fn(&str) -> bool + Sync),
    secret: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for DataSeed<'_> {
    type Value = SlimData;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<SlimData, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DataSeed<'_> {
    type Value = SlimData;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Secret or ConfigMap")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<SlimData, A::Error> {
        let mut out = SlimData::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match (key.as_ref(), self.secret) {
                ("metadata", _) => out.meta = Slim { metadata: map.next_value()? }.meta(),
                ("type", true) => out.type_ = map.next_value()?,
                ("data", true) | ("binaryData", false) => {
                    out.bytes = map.next_value_seed(KeptKeys { keep: self.keep, _value: std::marker::PhantomData })?
                }
                ("data", false) => out.text = map.next_value_seed(KeptKeys { keep: self.keep, _value: std::marker::PhantomData })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// A map keeping only the entries whose key `keep` accepts (the others' values skipped).
struct KeptKeys<'a, V> {
    keep: &'a (dyn Fn(&str) -> bool + Sync),
    _value: std::marker::PhantomData<V>,
}

impl<'de, V: Deserialize<'de>> serde::de::DeserializeSeed<'de> for KeptKeys<'_, V> {
    type Value = BTreeMap<String, V>;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for KeptKeys<'_, V> {
    type Value = BTreeMap<String, V>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map of data keys")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if (self.keep)(&key) {
                out.insert(key.into_owned(), map.next_value::<V>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// The objects of kind `K` in `namespace` (`None`: cluster-scoped), for slim reads and writes.
#[derive(Clone)]
pub struct SlimApi {
    client: Client,
    request: kube::core::Request,
}

impl SlimApi {
    /// Objects of kind `K` in `namespace` (`None` for a cluster-scoped kind).
    pub fn of<K: Resource<DynamicType = ()>>(client: Client, namespace: Option<&str>) -> Self {
        Self::erased(client, &ApiResource::erase::<K>(&()), namespace)
    }

    /// Objects of `resource` in `namespace` (`None` for a cluster-scoped kind).
    pub fn erased(client: Client, resource: &ApiResource, namespace: Option<&str>) -> Self {
        SlimApi { client, request: kube::core::Request::new(kube::api::DynamicObject::url_path(resource, namespace)) }
    }

    /// PATCH of the object; the answer decoded slim.
    pub async fn patch<P: Serialize + Debug>(&self, name: &str, params: &PatchParams, patch: &Patch<P>) -> Result<Slim, kube::Error> {
        let mut req = self.request.patch(name, params, patch).map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("patch");
        self.client.request::<Slim>(req).await
    }

    /// PATCH of the object's status; the answer decoded slim.
    pub async fn patch_status<P: Serialize + Debug>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<Slim, kube::Error> {
        let mut req = self.request.patch_subresource("status", name, params, patch).map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("patch_status");
        self.client.request::<Slim>(req).await
    }

    /// GET of the object, decoded slim.
    pub async fn get(&self, name: &str) -> Result<Slim, kube::Error> {
        let mut req = self.request.get(name, &GetParams::default()).map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("get");
        self.client.request::<Slim>(req).await
    }

    /// GET of a Secret (`secret`) or ConfigMap keeping only the data keys `keep` accepts;
    /// `None` when there is no such object.
    pub async fn get_data(&self, name: &str, secret: bool, keep: &(dyn Fn(&str) -> bool + Sync)) -> Result<Option<SlimData>, kube::Error> {
        let mut req = self.request.get(name, &GetParams::default()).map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("get");
        let text = match self.client.request_text(req).await {
            Ok(text) => text,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(decode_data(&text, secret, keep).map_err(kube::Error::SerdeError)?))
    }

    /// DELETE of the object; the answer (the object, or a Status) decoded slim.
    pub async fn delete(&self, name: &str) -> Result<Slim, kube::Error> {
        let mut req = self.request.delete(name, &kube::api::DeleteParams::default()).map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("delete");
        self.client.request::<Slim>(req).await
    }

    /// [`Self::get`], `None` when there is no such object.
    pub async fn get_opt(&self, name: &str) -> Result<Option<Slim>, kube::Error> {
        match self.get(name).await {
            Ok(found) => Ok(Some(found)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A Secret (`secret`) or ConfigMap answer with only the data keys `keep` accepts.
pub fn decode_data(text: &str, secret: bool, keep: &(dyn Fn(&str) -> bool + Sync)) -> Result<SlimData, serde_json::Error> {
    use serde::de::DeserializeSeed as _;
    let mut de = serde_json::Deserializer::from_str(text);
    let data = DataSeed { keep, secret }.deserialize(&mut de)?;
    de.end()?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_metadata_and_skips_a_deep_spec() -> Result<(), serde_json::Error> {
        let deep = format!("{}1{}", "{\"a\":".repeat(5000), "}".repeat(5000));
        let text = format!(
            r#"{{"apiVersion":"provisioning.dev/v1alpha1","kind":"TaskServ","metadata":{{"name":"t","namespace":"n","uid":"u-1","resourceVersion":"42","generation":3,
            "annotations":{{"a":"b"}},"finalizers":["f"],"managedFields":[{{"manager":"kubectl","operation":"Apply","time":"2026-11-27T08:00:00Z",
            "fieldsV1":{{"f:metadata":{{"f:annotations":{{"f:a":{{}},"f:provisioning.dev/approve":{{}}}}}},"f:spec":{{"f:config":{deep},"f:service":{{}}}}}}}}]}},"spec":{{"config":{deep}}}}}"#
        );
        // The typed decode gives up on the depth; the slim one skips it.
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());
        let slim: Slim = serde_json::from_str(&text)?;
        let meta = slim.meta();
        assert_eq!((meta.uid.as_deref(), meta.resource_version.as_deref(), meta.generation), (Some("u-1"), Some("42"), Some(3)));
        assert_eq!(meta.finalizers, Some(vec!["f".to_string()]));
        let managed = meta.managed_fields.unwrap_or_default();
        let fields = managed.first().and_then(|m| m.fields_v1.clone()).map(|f| f.0);
        assert_eq!(
            fields,
            Some(
                serde_json::json!({"f:metadata": {"f:annotations": {"f:provisioning.dev/approve": {}}}, "f:spec": {"f:config": {}, "f:service": {}}})
            ),
            "only the controller's own annotations are kept"
        );
        Ok(())
    }

    #[test]
    fn secrets_and_config_maps_keep_only_the_keys_asked_for() -> Result<(), serde_json::Error> {
        let tiny: Vec<String> = (0..50_000).map(|i| format!("\"k{i}\":\"\"")).collect();
        let secret = format!(
            r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"s","uid":"u","ownerReferences":[{{"apiVersion":"v1","kind":"TaskServ","name":"t","uid":"o"}}]}},"data":{{{},"wanted":"aGk="}},"type":"Opaque"}}"#,
            tiny.join(",")
        );
        let s = decode_data(&secret, true, &|k| k == "wanted")?.secret();
        assert_eq!(
            s.data.map(|d| d.into_iter().map(|(k, v)| (k, v.0)).collect::<Vec<_>>()),
            Some(vec![("wanted".to_string(), b"hi".to_vec())])
        );
        assert_eq!(s.metadata.owner_references.map(|o| o.len()), Some(1));
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        let cm = format!(r#"{{"metadata":{{"name":"c"}},"data":{{{},"conf":"x: 1"}},"binaryData":{{"bin":"aGk="}}}}"#, tiny.join(","));
        let c = decode_data(&cm, false, &|k| k == "conf" || k == "bin")?.config_map();
        assert_eq!(c.data.and_then(|d| d.get("conf").cloned()).as_deref(), Some("x: 1"));
        assert_eq!(c.binary_data.map(|d| d.len()), Some(1));
        Ok(())
    }

    #[test]
    fn phantom_field_set_keys_are_capped() -> Result<(), serde_json::Error> {
        let phantom: Vec<String> = (0..100_000).map(|i| format!("\"f:k{i}\":{{}}")).collect();
        let text = format!(
            r#"{{"metadata":{{"uid":"u","managedFields":[{{"manager":"m","fieldsV1":{{"f:metadata":{{"f:annotations":{{{}}}}},"f:spec":{{{}}}}}}}]}}}}"#,
            phantom.join(","),
            phantom.join(",")
        );
        let slim: Slim = serde_json::from_str(&text)?;
        let managed = slim.meta().managed_fields.unwrap_or_default();
        let fields = managed.first().and_then(|m| m.fields_v1.clone()).map(|f| f.0).unwrap_or_default();
        assert_eq!(fields["f:spec"].as_object().map(serde_json::Map::len), Some(KEYS));
        assert_eq!(fields["f:metadata"]["f:annotations"].as_object().map(serde_json::Map::len), Some(0));
        // Entries: the first KEYS, then only those owning one of our annotations.
        let mut entries: Vec<String> =
            (0..10_000).map(|i| format!(r#"{{"manager":"m{i}","fieldsV1":{{"f:spec":{{"f:x":{{}}}}}}}}"#)).collect();
        entries.push(r#"{"manager":"late","fieldsV1":{"f:metadata":{"f:annotations":{"f:provisioning.dev/approve":{}}}}}"#.into());
        let text = format!(r#"{{"metadata":{{"managedFields":[{}]}}}}"#, entries.join(","));
        let slim: Slim = serde_json::from_str(&text)?;
        let managers: Vec<String> = slim.meta().managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
        assert_eq!(managers.len(), KEYS + 1);
        assert_eq!(managers.last().map(String::as_str), Some("late"));
        Ok(())
    }
}
