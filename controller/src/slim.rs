//! Write answers and single reads decoded only as far as the controller needs them.
//!
//! A write (a status patch, an annotation, a finalizer, a child's server-side apply, a
//! relabel) answers with the whole live object, and its live version is whatever its tenant
//! made it: up to the API server's object size, nested as deep as a real API server stores
//! under a field that preserves unknown fields. Decoded into a `DynamicObject` or a typed
//! object, 1 MiB of tiny maps costs ~70 MiB, and a 130-deep map is an error after the write
//! succeeded. The watch caches bound their decode ([`crate::decode`]); these answers are
//! decoded here into [`Slim`]: the metadata the controller reads (name, uid, resourceVersion,
//! generation, annotations, finalizers, and of each managedFields entry who wrote it and which
//! top-level spec fields and annotations it owns). serde_json skips everything else
//! without building it (iteratively, whatever its depth), so an answer costs its text (the
//! API server's object size limit) and the few fields kept.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta, Time};
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
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<Time>,
    managed_fields: Option<Vec<SlimManaged>>,
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

/// Of a managedFields entry's field set: the top-level spec fields and the annotations owned.
#[derive(Clone, Debug, Default, Deserialize)]
struct SlimFields {
    #[serde(rename = "f:metadata")]
    metadata: Option<SlimFieldsMeta>,
    #[serde(rename = "f:spec")]
    spec: Option<BTreeMap<String, IgnoredAny>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct SlimFieldsMeta {
    #[serde(rename = "f:annotations")]
    annotations: Option<BTreeMap<String, IgnoredAny>>,
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
            finalizers: m.finalizers.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
            managed_fields: m.managed_fields.as_ref().map(|all| all.iter().map(SlimManaged::entry).collect()),
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
            let keys =
                |m: &BTreeMap<String, IgnoredAny>| m.keys().map(|k| (k.clone(), serde_json::json!({}))).collect::<serde_json::Map<_, _>>();
            let mut out = serde_json::Map::new();
            if let Some(annotations) = f.metadata.as_ref().and_then(|m| m.annotations.as_ref()) {
                out.insert("f:metadata".into(), serde_json::json!({ "f:annotations": keys(annotations) }));
            }
            if let Some(spec) = &f.spec {
                out.insert("f:spec".into(), serde_json::Value::Object(keys(spec)));
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

    /// [`Self::get`], `None` when there is no such object.
    pub async fn get_opt(&self, name: &str) -> Result<Option<Slim>, kube::Error> {
        match self.get(name).await {
            Ok(found) => Ok(Some(found)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
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
            "fieldsV1":{{"f:metadata":{{"f:annotations":{{"f:a":{{}}}}}},"f:spec":{{"f:config":{deep},"f:service":{{}}}}}}}}]}},"spec":{{"config":{deep}}}}}"#
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
            Some(serde_json::json!({"f:metadata": {"f:annotations": {"f:a": {}}}, "f:spec": {"f:config": {}, "f:service": {}}}))
        );
        Ok(())
    }
}
