//! OpenAPI documents: v3 per group/version (`kubectl explain`, client-side validation) and the
//! single swagger 2.0 document at `/openapi/v2`, in JSON or in the protobuf form kubectl and
//! client-go's `OpenAPISchema()` ask for (kubectl's validation of a `kind: List`, Argo CD's
//! gitops-engine), from the built-in kinds' upstream schemas ([`builtin_schemas`]) and the
//! stored CRDs' schemas.

use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

mod v2_proto;

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

/// The protobuf form of `/openapi/v2` as clients ask for it (kubectl asks for nothing else).
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// The content type kube-openapi answers the protobuf form with (sic: `.v1.0`, not `@v1.0`).
pub const V2_PROTOBUF_ANSWER: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `/openapi/v2` as one format or the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V2Format {
    Json,
    Protobuf,
}

/// The format to answer `/openapi/v2` with for an Accept header, as kube-openapi chooses: the
/// clauses by falling quality (the more specific first among equals), the first one that
/// names JSON or the protobuf form (wildcards meaning JSON); None when no clause does (406).
pub fn negotiate_v2(accept: &str) -> Option<V2Format> {
    let accept = if accept.trim().is_empty() { "*/*" } else { accept };
    let mut clauses: Vec<(f64, usize, &str)> = Vec::new();
    for clause in accept.split(',') {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or_default().trim();
        let q = parts
            .filter_map(|p| p.trim().split_once('='))
            .find(|(k, _)| k.trim() == "q")
            .map_or(1.0, |(_, q)| q.trim().parse::<f64>().unwrap_or(0.0));
        if q > 0.0 && !media.is_empty() {
            clauses.push((q, media.matches('*').count(), media));
        }
    }
    clauses.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    clauses.into_iter().find_map(|(_, _, media)| {
        let media = media.to_ascii_lowercase();
        match media.as_str() {
            "application/json" | "application/*" | "*/*" => Some(V2Format::Json),
            m if m == V2_PROTOBUF => Some(V2Format::Protobuf),
            _ => None,
        }
    })
}

/// `/openapi/v2` for an Accept header: content type and body, or None when the client accepts
/// neither form (kube-openapi answers 406 then).
pub fn v2_for(reg: &Registry, accept: &str) -> Option<(&'static str, Vec<u8>)> {
    match negotiate_v2(accept)? {
        V2Format::Json => Some(("application/json", serde_json::to_vec(&v2(reg)).unwrap_or_default())),
        V2Format::Protobuf => Some((V2_PROTOBUF_ANSWER, v2_proto::encode(&v2(reg)))),
    }
}

/// The swagger 2.0 document: every served kind's definition, CRD schemas made structural
/// for swagger 2.0 as apiextensions-apiserver publishes them ([`crd_schema_v2`]).
pub fn v2(reg: &Registry) -> Value {
    let custom: std::collections::HashSet<String> =
        reg.by_gv.iter().flat_map(|((g, v), list)| list.iter().filter(|rt| rt.custom).map(move |rt| schema_name(g, v, &rt.kind))).collect();
    let mut definitions = Map::new();
    let mut paths = Map::new();
    for (g, v) in reg.by_gv.keys() {
        let Some(doc) = document(reg, &gv_path(g, v)) else {
            continue;
        };
        for (name, s) in doc["components"]["schemas"].as_object().into_iter().flatten() {
            definitions.entry(name.clone()).or_insert_with(|| if custom.contains(name) { to_v2(&crd_schema_v2(s)) } else { to_v2(s) });
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
    // apiextensions' JSON is any JSON value (a CRD's `default`, `enum`, `example`): upstream
    // publishes it untyped, k8s-openapi's schema says object.
    if let Some(Value::Object(any)) = definitions.get_mut("io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON") {
        any.remove("type");
    }
    // Swagger 2.0 has no int-or-string marker; upstream publishes IntOrString this way.
    definitions.insert(
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString".into(),
        json!({
        "description": "IntOrString is a type that can hold an int32 or a string.", "type": "string", "format": "int-or-string"}),
    );
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.37.0"},
        "paths": paths,
        "definitions": definitions,
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "type": "apiKey", "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    })
}

/// A CRD's schema as apiextensions-apiserver publishes it in swagger 2.0
/// (`ToStructuralOpenAPIV2`), which kubectl's validation of v2 copes with: no junctors
/// (`allOf`/`oneOf`/`anyOf`/`not`), a nullable value untyped and without properties or items
/// (and no longer required), a value keeping unknown fields without properties or items, an
/// array without items untyped. A lone `allOf: [$ref]` is the metadata reference this server
/// adds, kept for [`to_v2`] to turn into a plain `$ref`.
fn crd_schema_v2(s: &Value) -> Value {
    let Value::Object(m) = s else {
        return s.clone();
    };
    let mut out = m.clone();
    for junctor in ["oneOf", "anyOf", "not"] {
        out.remove(junctor);
    }
    if out.get("allOf").is_some_and(|a| !a.as_array().is_some_and(|a| a.len() == 1 && a[0].get("$ref").is_some())) {
        out.remove("allOf");
    }
    let nullable = |v: &Value| v.get("nullable").and_then(Value::as_bool).unwrap_or(false);
    // Required fields that may be null are no longer required (checked before the children change).
    let nullable_props: Vec<String> = out
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(_, v)| nullable(v))
        .map(|(k, _)| k.clone())
        .collect();
    if out.get("additionalProperties").is_some_and(nullable) {
        out.remove("required");
    } else if let Some(Value::Array(required)) = out.get_mut("required") {
        required.retain(|r| !r.as_str().is_some_and(|r| nullable_props.iter().any(|p| p == r)));
        if required.is_empty() {
            out.remove("required");
        }
    }
    if nullable(s) {
        for key in ["type", "nullable", "items", "properties"] {
            out.remove(key);
        }
    }
    if out.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool).unwrap_or(false) {
        out.remove("items");
        out.remove("properties");
    }
    if out.get("type").and_then(Value::as_str) == Some("array") && !out.contains_key("items") {
        out.remove("type");
    }
    if let Some(Value::Object(props)) = out.get_mut("properties") {
        for v in props.values_mut() {
            *v = crd_schema_v2(v);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = out.get_mut(key).filter(|v| v.is_object()) {
            *v = crd_schema_v2(v);
        }
    }
    Value::Object(out)
}

fn to_v2_ref(r: &Value) -> Value {
    match r.as_str() {
        Some(s) => json!(s.replacen(builtin_schemas::REF_PREFIX, "#/definitions/", 1)),
        None => r.clone(),
    }
}

/// An OpenAPI 3 schema as swagger 2.0 writes it: `#/definitions/` references, a lone
/// `allOf: [$ref]` as a plain `$ref`, no `nullable`. Walks schemas only: the members of
/// `properties` are field names (JSONSchemaProps has fields called `$ref`, `nullable` and
/// `default`), and `default`, `enum` and `example` are values.
fn to_v2(s: &Value) -> Value {
    let Value::Object(m) = s else {
        return s.clone();
    };
    let schemas = |v: &Value| match v {
        Value::Array(a) => Value::Array(a.iter().map(to_v2).collect()),
        other => to_v2(other),
    };
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
            "properties" | "patternProperties" | "definitions" => {
                let named = v.as_object().map(|p| p.iter().map(|(name, s)| (name.clone(), to_v2(s))).collect());
                out.insert(k.clone(), named.map_or_else(|| v.clone(), Value::Object));
            }
            "items" | "additionalProperties" | "additionalItems" | "not" | "allOf" | "oneOf" | "anyOf" => {
                out.insert(k.clone(), schemas(v));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    // Under $ref, swagger 2.0 ignores siblings; drop a default that no longer applies.
    if out.contains_key("$ref") {
        out.remove("default");
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_format_is_chosen_as_kube_openapi_does() {
        // kubectl asks for protobuf only; curl and browsers for anything.
        assert_eq!(negotiate_v2(V2_PROTOBUF), Some(V2Format::Protobuf));
        assert_eq!(negotiate_v2(""), Some(V2Format::Json));
        assert_eq!(negotiate_v2("*/*"), Some(V2Format::Json));
        assert_eq!(negotiate_v2("application/json, */*"), Some(V2Format::Json));
        assert_eq!(negotiate_v2(&format!("{V2_PROTOBUF}, application/json")), Some(V2Format::Protobuf));
        // Quality first, then the more specific clause.
        assert_eq!(negotiate_v2(&format!("application/json;q=0.5, {V2_PROTOBUF}")), Some(V2Format::Protobuf));
        assert_eq!(negotiate_v2(&format!("*/*, {V2_PROTOBUF}")), Some(V2Format::Protobuf));
        // Refused or unknown only: 406.
        assert_eq!(negotiate_v2("application/json;q=0"), None);
        assert_eq!(negotiate_v2("application/yaml"), None);
    }

    #[test]
    fn a_crd_schema_is_published_in_v2_as_apiextensions_does() {
        let s = json!({
            "type": "object",
            "required": ["name", "note"],
            "properties": {
                "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
                "name": {"type": "string", "anyOf": [{"pattern": "^a"}, {"pattern": "^b"}]},
                "note": {"type": "string", "nullable": true},
                "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}},
                "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        });
        let v2 = to_v2(&crd_schema_v2(&s));
        let props = &v2["properties"];
        assert_eq!(v2["required"], json!(["name"]), "a nullable field is no longer required");
        assert_eq!(props["metadata"], json!({"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}));
        assert_eq!(props["name"], json!({"type": "string"}));
        assert_eq!(props["note"], json!({}), "nullable: untyped");
        assert_eq!(props["config"], json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        assert_eq!(props["port"], json!({"x-kubernetes-int-or-string": true}));
        assert_eq!(props["tags"], json!({"type": "array", "items": {"type": "string"}}));
    }

    #[test]
    fn v2_keeps_fields_named_like_keywords() {
        // JSONSchemaProps has fields called `$ref`, `nullable` and `default`.
        let s = json!({"type": "object", "properties": {
            "$ref": {"type": "string"},
            "nullable": {"type": "boolean"},
            "default": {"$ref": "#/components/schemas/x.JSON", "default": {}},
        }});
        let v2 = to_v2(&s);
        assert_eq!(v2["properties"]["$ref"], json!({"type": "string"}));
        assert_eq!(v2["properties"]["nullable"], json!({"type": "boolean"}));
        assert_eq!(v2["properties"]["default"], json!({"$ref": "#/definitions/x.JSON"}));
    }
}
