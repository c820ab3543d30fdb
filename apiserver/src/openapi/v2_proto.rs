//! The swagger 2.0 document in protobuf, as kube-apiserver serves it to kubectl: the messages
//! of gnostic's `openapi_v2` package (`OpenAPIv2.proto`), written by hand from the JSON
//! document. kubectl asks `/openapi/v2` for this format only (client-side validation of a
//! `kind: List`, `kubectl explain` of older versions). Values that swagger keeps as free JSON
//! (`default`, `enum`, `example`, `x-*` extensions) travel as the YAML text of an `Any`, which
//! JSON is.

use serde_json::{Map, Value};

/// One protobuf message being written. Scalars at their default value are left out, as proto3
/// writes them; nested messages are always written, so that an empty one is still present
/// (kube-openapi tells an object with no properties from one without `properties` that way).
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str).filter(|s| !s.is_empty()) {
            self.bytes(field, s.as_bytes());
        }
    }

    fn strings(&mut self, field: u32, v: Option<&Value>) {
        for s in v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            self.bytes(field, s.as_bytes());
        }
    }

    fn message(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }

    fn bool(&mut self, field: u32, v: Option<&Value>) {
        if v.and_then(Value::as_bool).unwrap_or(false) {
            self.key(field, 0);
            self.varint(1);
        }
    }

    fn int64(&mut self, field: u32, v: Option<&Value>) {
        if let Some(i) = v.and_then(Value::as_i64).filter(|i| *i != 0) {
            self.key(field, 0);
            // Two's complement, as protobuf writes a negative int64.
            self.varint(i as u64);
        }
    }

    fn double(&mut self, field: u32, v: Option<&Value>) {
        if let Some(f) = v.and_then(Value::as_f64).filter(|f| *f != 0.0) {
            self.key(field, 1);
            self.0.extend_from_slice(&f.to_bits().to_le_bytes());
        }
    }

    /// An `Any` holding `v` as YAML text (field 2 of gnostic's Any).
    fn any(&mut self, field: u32, v: Option<&Value>) {
        if let Some(v) = v {
            self.message(field, any(v));
        }
    }

    fn anys(&mut self, field: u32, v: Option<&Value>) {
        for item in v.and_then(Value::as_array).into_iter().flatten() {
            self.message(field, any(item));
        }
    }

    /// The `x-*` members of `obj` as repeated `NamedAny`.
    fn vendor_extensions(&mut self, field: u32, obj: &Map<String, Value>) {
        for (name, value) in obj.iter().filter(|(k, _)| k.starts_with("x-")) {
            let mut named = Msg::default();
            named.bytes(1, name.as_bytes());
            named.message(2, any(value));
            self.message(field, named);
        }
    }
}

fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.bytes(2, v.to_string().as_bytes());
    m
}

/// `{name: value}` pairs as repeated `Named*` messages (name = 1, value = 2) in `field`.
fn named(out: &mut Msg, field: u32, map: Option<&Value>, encode: impl Fn(&Value) -> Msg) {
    for (name, value) in map.and_then(Value::as_object).into_iter().flatten() {
        let mut n = Msg::default();
        n.bytes(1, name.as_bytes());
        n.message(2, encode(value));
        out.message(field, n);
    }
}

/// gnostic's `Document` for a swagger 2.0 document.
pub fn encode(doc: &Value) -> Vec<u8> {
    let empty = Map::new();
    let mut m = Msg::default();
    m.string(1, doc.get("swagger"));
    if let Some(info) = doc.get("info") {
        let mut i = Msg::default();
        i.string(1, info.get("title"));
        i.string(2, info.get("version"));
        i.string(3, info.get("description"));
        i.vendor_extensions(7, info.as_object().unwrap_or(&empty));
        m.message(2, i);
    }
    m.string(3, doc.get("host"));
    m.string(4, doc.get("basePath"));
    m.strings(5, doc.get("schemes"));
    m.strings(6, doc.get("consumes"));
    m.strings(7, doc.get("produces"));
    if let Some(paths) = doc.get("paths").and_then(Value::as_object) {
        let mut p = Msg::default();
        p.vendor_extensions(1, paths);
        let items = paths.iter().filter(|(k, _)| !k.starts_with("x-")).map(|(k, v)| (k.clone(), v.clone())).collect();
        named(&mut p, 2, Some(&Value::Object(items)), path_item);
        m.message(8, p);
    }
    if doc.get("definitions").is_some() {
        let mut d = Msg::default();
        named(&mut d, 1, doc.get("definitions"), schema);
        m.message(9, d);
    }
    for requirement in doc.get("security").and_then(Value::as_array).into_iter().flatten() {
        m.message(12, security_requirement(requirement));
    }
    if doc.get("securityDefinitions").is_some() {
        let mut s = Msg::default();
        named(&mut s, 1, doc.get("securityDefinitions"), security_definition);
        m.message(13, s);
    }
    m.vendor_extensions(16, doc.as_object().unwrap_or(&empty));
    m.0
}

fn security_requirement(v: &Value) -> Msg {
    let mut r = Msg::default();
    named(&mut r, 1, Some(v), |scopes| {
        let mut a = Msg::default();
        a.strings(1, Some(scopes));
        a
    });
    r
}

fn security_definition(v: &Value) -> Msg {
    let empty = Map::new();
    let obj = v.as_object().unwrap_or(&empty);
    let mut item = Msg::default();
    let mut s = Msg::default();
    match v.get("type").and_then(Value::as_str) {
        Some("basic") => {
            s.string(1, v.get("type"));
            s.string(2, v.get("description"));
            s.vendor_extensions(3, obj);
            item.message(1, s);
        }
        Some("apiKey") => {
            s.string(1, v.get("type"));
            s.string(2, v.get("name"));
            s.string(3, v.get("in"));
            s.string(4, v.get("description"));
            s.vendor_extensions(5, obj);
            item.message(2, s);
        }
        // OAuth2 flows: this server publishes none.
        _ => {}
    }
    item
}

fn path_item(v: &Value) -> Msg {
    let empty = Map::new();
    let mut p = Msg::default();
    p.string(1, v.get("$ref"));
    for (field, verb) in [(2, "get"), (3, "put"), (4, "post"), (5, "delete"), (6, "options"), (7, "head"), (8, "patch")] {
        if let Some(op) = v.get(verb) {
            p.message(field, operation(op));
        }
    }
    for param in v.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        p.message(9, parameters_item(param));
    }
    p.vendor_extensions(10, v.as_object().unwrap_or(&empty));
    p
}

fn operation(v: &Value) -> Msg {
    let empty = Map::new();
    let mut o = Msg::default();
    o.strings(1, v.get("tags"));
    o.string(2, v.get("summary"));
    o.string(3, v.get("description"));
    o.string(5, v.get("operationId"));
    o.strings(6, v.get("produces"));
    o.strings(7, v.get("consumes"));
    for param in v.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        o.message(8, parameters_item(param));
    }
    if let Some(responses) = v.get("responses").and_then(Value::as_object) {
        let mut r = Msg::default();
        let codes = responses.iter().filter(|(k, _)| !k.starts_with("x-")).map(|(k, v)| (k.clone(), v.clone())).collect();
        named(&mut r, 1, Some(&Value::Object(codes)), |resp| {
            let mut value = Msg::default();
            if let Some(reference) = resp.get("$ref") {
                let mut j = Msg::default();
                j.string(1, Some(reference));
                value.message(2, j);
            } else {
                let mut out = Msg::default();
                out.string(1, resp.get("description"));
                if let Some(s) = resp.get("schema") {
                    let mut item = Msg::default();
                    item.message(1, schema(s));
                    out.message(2, item);
                }
                out.vendor_extensions(5, resp.as_object().unwrap_or(&empty));
                value.message(1, out);
            }
            value
        });
        r.vendor_extensions(2, responses);
        o.message(9, r);
    }
    o.strings(10, v.get("schemes"));
    o.bool(11, v.get("deprecated"));
    for requirement in v.get("security").and_then(Value::as_array).into_iter().flatten() {
        o.message(12, security_requirement(requirement));
    }
    o.vendor_extensions(13, v.as_object().unwrap_or(&empty));
    o
}

/// A `ParametersItem`: a `$ref` to a shared parameter, a body parameter or one of the four
/// non-body kinds.
fn parameters_item(v: &Value) -> Msg {
    let empty = Map::new();
    let obj = v.as_object().unwrap_or(&empty);
    let mut item = Msg::default();
    if let Some(reference) = v.get("$ref") {
        let mut j = Msg::default();
        j.string(1, Some(reference));
        item.message(2, j);
        return item;
    }
    let mut parameter = Msg::default();
    let location = v.get("in").and_then(Value::as_str).unwrap_or_default();
    if location == "body" {
        let mut b = Msg::default();
        b.string(1, v.get("description"));
        b.string(2, v.get("name"));
        b.string(3, v.get("in"));
        b.bool(4, v.get("required"));
        if let Some(s) = v.get("schema") {
            b.message(5, schema(s));
        }
        b.vendor_extensions(6, obj);
        parameter.message(1, b);
    } else {
        // header = 1, formData = 2, query = 3, path = 4; formData and query have
        // allowEmptyValue at 5, which moves every later field up by one.
        let (kind, allow_empty) = match location {
            "header" => (1, false),
            "formData" => (2, true),
            "path" => (4, false),
            _ => (3, true),
        };
        let mut s = Msg::default();
        s.bool(1, v.get("required"));
        s.string(2, v.get("in"));
        s.string(3, v.get("description"));
        s.string(4, v.get("name"));
        let base = if allow_empty {
            s.bool(5, v.get("allowEmptyValue"));
            6
        } else {
            5
        };
        s.string(base, v.get("type"));
        s.string(base + 1, v.get("format"));
        if let Some(items) = v.get("items") {
            s.message(base + 2, primitives_items(items));
        }
        s.string(base + 3, v.get("collectionFormat"));
        s.any(base + 4, v.get("default"));
        s.double(base + 5, v.get("maximum"));
        s.bool(base + 6, v.get("exclusiveMaximum"));
        s.double(base + 7, v.get("minimum"));
        s.bool(base + 8, v.get("exclusiveMinimum"));
        s.int64(base + 9, v.get("maxLength"));
        s.int64(base + 10, v.get("minLength"));
        s.string(base + 11, v.get("pattern"));
        s.int64(base + 12, v.get("maxItems"));
        s.int64(base + 13, v.get("minItems"));
        s.bool(base + 14, v.get("uniqueItems"));
        s.anys(base + 15, v.get("enum"));
        s.double(base + 16, v.get("multipleOf"));
        s.vendor_extensions(base + 17, obj);
        let mut non_body = Msg::default();
        non_body.message(kind, s);
        parameter.message(2, non_body);
    }
    item.message(1, parameter);
    item
}

fn primitives_items(v: &Value) -> Msg {
    let empty = Map::new();
    let mut p = Msg::default();
    p.string(1, v.get("type"));
    p.string(2, v.get("format"));
    if let Some(items) = v.get("items") {
        p.message(3, primitives_items(items));
    }
    p.string(4, v.get("collectionFormat"));
    p.any(5, v.get("default"));
    p.anys(16, v.get("enum"));
    p.vendor_extensions(18, v.as_object().unwrap_or(&empty));
    p
}

/// gnostic's `Schema` (a swagger 2.0 schema object).
fn schema(v: &Value) -> Msg {
    let empty = Map::new();
    let obj = v.as_object().unwrap_or(&empty);
    let mut s = Msg::default();
    s.string(1, v.get("$ref"));
    s.string(2, v.get("format"));
    s.string(3, v.get("title"));
    s.string(4, v.get("description"));
    s.any(5, v.get("default"));
    s.double(6, v.get("multipleOf"));
    s.double(7, v.get("maximum"));
    s.bool(8, v.get("exclusiveMaximum"));
    s.double(9, v.get("minimum"));
    s.bool(10, v.get("exclusiveMinimum"));
    s.int64(11, v.get("maxLength"));
    s.int64(12, v.get("minLength"));
    s.string(13, v.get("pattern"));
    s.int64(14, v.get("maxItems"));
    s.int64(15, v.get("minItems"));
    s.bool(16, v.get("uniqueItems"));
    s.int64(17, v.get("maxProperties"));
    s.int64(18, v.get("minProperties"));
    s.strings(19, v.get("required"));
    s.anys(20, v.get("enum"));
    match v.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut a = Msg::default();
            // A oneof member is present even when false.
            a.key(2, 0);
            a.varint(u64::from(*b));
            s.message(21, a);
        }
        Some(ap @ Value::Object(_)) => {
            let mut a = Msg::default();
            a.message(1, schema(ap));
            s.message(21, a);
        }
        _ => {}
    }
    match v.get("type") {
        Some(t @ Value::String(_)) => {
            let mut ty = Msg::default();
            ty.string(1, Some(t));
            s.message(22, ty);
        }
        Some(t @ Value::Array(_)) => {
            let mut ty = Msg::default();
            ty.strings(1, Some(t));
            s.message(22, ty);
        }
        _ => {}
    }
    match v.get("items") {
        Some(Value::Array(list)) => {
            let mut items = Msg::default();
            for item in list {
                items.message(1, schema(item));
            }
            s.message(23, items);
        }
        Some(item @ Value::Object(_)) => {
            let mut items = Msg::default();
            items.message(1, schema(item));
            s.message(23, items);
        }
        _ => {}
    }
    for sub in v.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        s.message(24, schema(sub));
    }
    if v.get("properties").is_some() {
        let mut props = Msg::default();
        named(&mut props, 1, v.get("properties"), schema);
        s.message(25, props);
    }
    s.string(26, v.get("discriminator"));
    s.bool(27, v.get("readOnly"));
    if let Some(docs) = v.get("externalDocs") {
        let mut d = Msg::default();
        d.string(1, docs.get("description"));
        d.string(2, docs.get("url"));
        s.message(29, d);
    }
    s.any(30, v.get("example"));
    s.vendor_extensions(31, obj);
    s
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A minimal reader of the wire format: (field, wire type, payload) in order.
    fn fields(mut b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            while let Some((&byte, rest)) = b.split_first() {
                *b = rest;
                v |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    break;
                }
            }
            v
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = varint(&mut b);
            let (field, wire) = (key >> 3, key & 7);
            let payload = match wire {
                0 => varint(&mut b).to_le_bytes().to_vec(),
                1 => {
                    let (head, rest) = b.split_at(8.min(b.len()));
                    b = rest;
                    head.to_vec()
                }
                _ => {
                    let len = usize::try_from(varint(&mut b)).unwrap_or(usize::MAX).min(b.len());
                    let (head, rest) = b.split_at(len);
                    b = rest;
                    head.to_vec()
                }
            };
            out.push((field, wire, payload));
        }
        out
    }

    fn field(b: &[u8], n: u64) -> Vec<Vec<u8>> {
        fields(b).into_iter().filter(|(f, _, _)| *f == n).map(|(_, _, p)| p).collect()
    }

    #[test]
    fn a_definition_keeps_its_properties_types_and_kind_extension() {
        let doc = json!({
            "swagger": "2.0",
            "definitions": {"example.v1.Thing": {
                "type": "object",
                "required": ["spec"],
                "properties": {"spec": {"type": "object", "properties": {}}, "size": {"type": "integer", "maximum": 5}},
                "x-kubernetes-group-version-kind": [{"group": "example", "version": "v1", "kind": "Thing"}],
            }},
        });
        let bytes = encode(&doc);
        assert_eq!(field(&bytes, 1), vec![b"2.0".to_vec()]);
        let definitions = &field(&bytes, 9)[0];
        let named = &field(definitions, 1)[0];
        assert_eq!(field(named, 1)[0], b"example.v1.Thing");
        let thing = &field(named, 2)[0];
        assert_eq!(field(&field(thing, 22)[0], 1)[0], b"object");
        assert_eq!(field(thing, 19)[0], b"spec");
        let props = field(&field(thing, 25)[0], 1);
        assert_eq!(props.len(), 2);
        // An empty `properties` is still there (an object with no fields, not a map).
        let spec = props.iter().map(|p| field(p, 2)[0].clone()).find(|s| field(&field(s, 22)[0], 1)[0] == b"object");
        assert!(spec.is_some_and(|s| field(&s, 25) == vec![Vec::<u8>::new()]));
        let ext = &field(thing, 31)[0];
        assert_eq!(field(ext, 1)[0], b"x-kubernetes-group-version-kind");
        let yaml = field(&field(ext, 2)[0], 2)[0].clone();
        assert_eq!(serde_json::from_slice::<Value>(&yaml).ok(), Some(json!([{"group": "example", "version": "v1", "kind": "Thing"}])));
    }

    #[test]
    fn query_parameters_land_in_their_sub_schema() {
        let doc = json!({"paths": {"/x": {"patch": {
            "parameters": [{"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": true}],
            "x-kubernetes-action": "patch",
        }}}});
        let bytes = encode(&doc);
        let path = &field(&field(&bytes, 8)[0], 2)[0];
        assert_eq!(field(path, 1)[0], b"/x");
        let patch = &field(&field(path, 2)[0], 8)[0];
        let parameter = &field(&field(patch, 8)[0], 1)[0];
        let query = &field(&field(parameter, 2)[0], 3)[0];
        assert_eq!(field(query, 4)[0], b"fieldValidation");
        assert_eq!(field(query, 2)[0], b"query");
        assert_eq!(field(query, 6)[0], b"string");
        assert_eq!(field(query, 20)[0][0], 1, "uniqueItems");
        assert_eq!(field(&field(patch, 13)[0], 1)[0], b"x-kubernetes-action");
    }
}
