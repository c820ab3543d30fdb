//! OpenAPI documents: v3 per group/version (`kubectl explain`, client-side validation) and the
//! single swagger 2.0 document at `/openapi/v2` (older clients, Argo CD's gitops-engine), from
//! the built-in kinds' upstream schemas ([`builtin_schemas`]) and the stored CRDs' schemas.

use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::builtin_schemas;
use crate::registry::{Registry, ResourceType};

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
    // The real ObjectMeta (with ManagedFieldsEntry, OwnerReference, Time) from k8s-openapi.
    builtin_schemas::closure(meta_name, &mut schemas);
    let mut paths = Map::new();
    for rt in list {
        // Built-in kinds: the upstream definitions, under upstream names, with every
        // definition they reference, so `kubectl explain` and validation can walk the `$ref`s.
        let builtin = if rt.custom { None } else { builtin_schemas::definition_name(&group, &version, &rt.kind) };
        if let Some(def) = builtin {
            builtin_schemas::closure(def, &mut schemas);
            add_paths(&mut paths, rt, &group, &version, def);
            continue;
        }
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
        add_paths(&mut paths, rt, &group, &version, &name);
        schemas.insert(name, s);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The item and collection paths of one resource, their operations referring to `name`.
fn add_paths(paths: &mut Map<String, Value>, rt: &ResourceType, group: &str, version: &str, name: &str) {
    let prefix = format!("/{}", gv_path(group, version));
    let item = if rt.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
    } else {
        format!("{prefix}/{}/{{name}}", rt.plural)
    };
    let reference = json!({"$ref": format!("#/components/schemas/{name}")});
    let gvk = json!({"group": group, "version": version, "kind": rt.kind});
    let params = json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
    ]);
    let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
    paths.insert(
        item,
        json!({
            "get": {"x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk, "responses": ok},
            "put": {"x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok},
            "patch": {"x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok},
            "delete": {"x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk, "responses": ok},
        }),
    );
    let coll = if rt.namespaced { format!("{prefix}/namespaces/{{namespace}}/{}", rt.plural) } else { format!("{prefix}/{}", rt.plural) };
    paths.insert(
        coll,
        json!({
            "post": {"x-kubernetes-action": "post", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok},
        }),
    );
}

/// The media types `/openapi/v2` can answer; kube-apiserver also offers protobuf
/// (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`), this server does not.
fn accepts_json(accept: &str) -> bool {
    if accept.trim().is_empty() {
        return true;
    }
    accept.split(',').any(|clause| {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or_default().trim();
        // A clause with q=0 refuses the type.
        let refused = parts.any(|p| matches!(p.trim().split_once('='), Some(("q", q)) if q.trim().parse::<f64>().is_ok_and(|q| q == 0.0)));
        !refused && matches!(media, "application/json" | "application/*" | "*/*")
    })
}

/// `/openapi/v2` for the given Accept header: the swagger 2.0 document, or None when the
/// client accepts only formats this server does not produce (kube-openapi answers 406 then).
pub fn v2(reg: &Registry, accept: &str) -> Option<Value> {
    if !accepts_json(accept) {
        return None;
    }
    let mut definitions = Map::new();
    let mut paths = Map::new();
    for (g, v) in reg.by_gv.keys() {
        let Some(doc) = document(reg, &gv_path(g, v)) else {
            continue;
        };
        for (name, s) in doc["components"]["schemas"].as_object().into_iter().flatten() {
            definitions.entry(name.clone()).or_insert_with(|| to_v2(s));
        }
        for (p, ops) in doc["paths"].as_object().into_iter().flatten() {
            let mut out = Map::new();
            for (verb, op) in ops.as_object().into_iter().flatten() {
                let mut o = json!({
                    "x-kubernetes-action": op["x-kubernetes-action"],
                    "x-kubernetes-group-version-kind": op["x-kubernetes-group-version-kind"],
                    "consumes": ["*/*"], "produces": ["application/json"], "schemes": ["https"],
                });
                if let Some(reference) = op["responses"]["200"]["content"]["application/json"]["schema"].get("$ref") {
                    o["responses"] = json!({"200": {"description": "OK", "schema": {"$ref": to_v2_ref(reference)}}});
                }
                let params: Vec<Value> = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| json!({"name": p["name"], "in": p["in"], "type": p["schema"]["type"], "uniqueItems": true}))
                    .collect();
                if !params.is_empty() {
                    o["parameters"] = json!(params);
                }
                out.insert(verb.clone(), o);
            }
            paths.insert(p.clone(), Value::Object(out));
        }
    }
    // Swagger 2.0 has no int-or-string marker; upstream publishes IntOrString this way.
    definitions.insert(
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString".into(),
        json!({
        "description": "IntOrString is a type that can hold an int32 or a string.", "type": "string", "format": "int-or-string"}),
    );
    Some(json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.37.0"},
        "paths": paths,
        "definitions": definitions,
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "type": "apiKey", "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    }))
}

fn to_v2_ref(r: &Value) -> Value {
    match r.as_str() {
        Some(s) => json!(s.replacen(builtin_schemas::REF_PREFIX, "#/definitions/", 1)),
        None => r.clone(),
    }
}

/// An OpenAPI 3 schema as swagger 2.0 writes it: `#/definitions/` references, a lone
/// `allOf: [$ref]` as a plain `$ref`, no `nullable`.
fn to_v2(s: &Value) -> Value {
    match s {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                match k.as_str() {
                    "nullable" => {}
                    "$ref" => {
                        out.insert(k.clone(), to_v2_ref(v));
                    }
                    "allOf" if v.as_array().is_some_and(|a| a.len() == 1 && a[0].get("$ref").is_some()) => {
                        out.insert("$ref".into(), to_v2_ref(&v[0]["$ref"]));
                    }
                    _ => {
                        out.insert(k.clone(), to_v2(v));
                    }
                }
            }
            // Under $ref, swagger 2.0 ignores siblings; drop a default that no longer applies.
            if out.contains_key("$ref") {
                out.remove("default");
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(to_v2).collect()),
        other => other.clone(),
    }
}
