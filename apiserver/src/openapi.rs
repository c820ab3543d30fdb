//! OpenAPI v3 documents built from the registered CRD schemas (for `kubectl explain`).

use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::registry::Registry;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// Schema name for a kind: reversed group, version, kind (`dev.provisioning.v1alpha1.Server`).
pub fn schema_name(group: &str, version: &str, kind: &str) -> String {
    if group.is_empty() {
        return format!("io.k8s.api.core.{version}.{kind}");
    }
    let rev: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", rev.join("."))
}

/// `/openapi/v3`: one entry per group/version with a content hash.
pub fn index(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, v) in reg.by_gv.keys() {
        let p = gv_path(g, v);
        let doc = document(reg, &p).unwrap_or(Value::Null);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        doc.to_string().hash(&mut h);
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={:016X}", h.finish())}));
    }
    json!({"paths": paths})
}

fn object_meta() -> Value {
    json!({
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Name must be unique within a namespace."},
            "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be unique."},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Map of string keys and values that can be used to organize and categorize objects."},
            "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Annotations is an unstructured key value map stored with a resource."},
            "uid": {"type": "string", "description": "UID is the unique in time and space value for this object."},
            "resourceVersion": {"type": "string", "description": "An opaque value that represents the internal version of this object."},
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
            "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
            "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."},
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "description": "Must be empty before the object is deleted from the registry."},
            "ownerReferences": {"type": "array", "items": {"type": "object"}, "description": "List of objects depended by this object."},
            "generateName": {"type": "string", "description": "GenerateName is an optional prefix, used by the server, to generate a unique name."},
        }
    })
}

/// The document for one group/version path (`apis/GROUP/VERSION` or `api/v1`).
pub fn document(reg: &Registry, gv: &str) -> Option<Value> {
    let gv = gv.split('?').next().unwrap_or(gv);
    let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    let list = reg.by_gv.get(&(group.clone(), version.clone()))?;
    let mut schemas = Map::new();
    let meta_name = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
    schemas.insert(meta_name.into(), object_meta());
    let mut paths = Map::new();
    for rt in list {
        let mut s = rt.schema.clone().unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        if let Some(m) = s.as_object_mut() {
            m.insert("x-kubernetes-group-version-kind".into(), json!([{"group": group, "version": version, "kind": rt.kind}]));
            let props = m.entry("properties").or_insert_with(|| json!({}));
            if let Some(p) = props.as_object_mut() {
                p.insert("metadata".into(), json!({"allOf": [{"$ref": format!("#/components/schemas/{meta_name}")}], "default": {},
                    "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}));
                p.entry("apiVersion").or_insert_with(|| json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
                p.entry("kind").or_insert_with(|| json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
            }
        }
        let name = schema_name(&group, &version, &rt.kind);
        let prefix = format!("/{}", gv_path(&group, &version));
        let item = if rt.namespaced { format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural) } else { format!("{prefix}/{}/{{name}}", rt.plural) };
        let reference = json!({"$ref": format!("#/components/schemas/{name}")});
        let gvk = json!({"group": group, "version": version, "kind": rt.kind});
        let params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
        ]);
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
        paths.insert(item, json!({
            "get": {"x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk, "responses": ok},
            "put": {"x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok},
            "patch": {"x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok},
            "delete": {"x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk, "responses": ok},
        }));
        let coll = if rt.namespaced { format!("{prefix}/namespaces/{{namespace}}/{}", rt.plural) } else { format!("{prefix}/{}", rt.plural) };
        paths.insert(coll, json!({
            "post": {"x-kubernetes-action": "post", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok},
        }));
        schemas.insert(name, s);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
