//! A strict checker of kubeadm configuration documents against a transcription of kubeadm's
//! Go config types (`fixtures/kubeadm/kubeadm-v1beta4.json`): what `kubeadm config validate`
//! refuses without a cluster — an unknown apiVersion or kind, a field no struct has (kubeadm
//! decodes strictly, case-sensitively), a value of the wrong JSON type, a missing required
//! field, a value kubeadm's validation rejects (token, hash, address, port, duration, ...).

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The transcription (see the fixture's `_about`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// apiVersion → the kinds described (and those known but not described).
    pub api_versions: BTreeMap<String, ApiVersion>,
    /// Go struct name → its JSON fields.
    pub structs: BTreeMap<String, StructDesc>,
}

/// The kinds of one apiVersion.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiVersion {
    /// Kinds whose struct (same name) is described.
    pub kinds: Vec<String>,
    /// Kinds that exist but are not transcribed: refused, never silently accepted.
    #[serde(default)]
    pub not_described: Vec<String>,
}

/// One Go struct as JSON sees it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StructDesc {
    /// JSON field name → type (see [`Ty::parse`]).
    pub fields: BTreeMap<String, String>,
    /// Structs embedded with `json:",inline"`: their fields are this struct's fields.
    #[serde(default)]
    pub inline: Vec<String>,
    /// Fields that must be present and not empty.
    #[serde(default)]
    pub required: Vec<String>,
    /// Groups of which exactly one field must be set.
    #[serde(default)]
    pub exactly_one: Vec<Vec<String>>,
    /// Groups of which at least one field must be set.
    #[serde(default)]
    pub at_least_one: Vec<Vec<String>>,
    /// Groups of which at most one field may be set.
    #[serde(default)]
    pub at_most_one: Vec<Vec<String>>,
    /// Field → format its value (or each element) must have.
    #[serde(default)]
    pub formats: BTreeMap<String, String>,
}

/// A field's type.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    String,
    Bool,
    Int32,
    Int64,
    Float64,
    /// metav1.Duration: a Go duration string.
    Duration,
    /// metav1.Time: RFC 3339.
    Time,
    List(Box<Ty>),
    Map(Box<Ty>),
    Struct(String),
    /// In kubeadm's type, content not transcribed: any value is refused.
    Opaque,
}

impl Ty {
    /// `string`, `bool`, `int32`, `int64`, `float64`, `duration`, `time`, `opaque`, `[]T`,
    /// `map[string]T`, or a struct name.
    pub fn parse(text: &str) -> Ty {
        if let Some(inner) = text.strip_prefix("[]") {
            return Ty::List(Box::new(Ty::parse(inner)));
        }
        if let Some(inner) = text.strip_prefix("map[string]") {
            return Ty::Map(Box::new(Ty::parse(inner)));
        }
        match text {
            "string" => Ty::String,
            "bool" => Ty::Bool,
            "int32" => Ty::Int32,
            "int64" => Ty::Int64,
            "float64" => Ty::Float64,
            "duration" => Ty::Duration,
            "time" => Ty::Time,
            "opaque" => Ty::Opaque,
            other => Ty::Struct(other.to_string()),
        }
    }
}

/// The formats the checker knows (a fixture naming another one is an error).
pub const FORMATS: &[&str] = &[
    "bootstrapToken",
    "bootstrapGroup",
    "certificateKey",
    "caCertHash",
    "hostPort",
    "hostOptionalPort",
    "ip",
    "port",
    "dns1123Subdomain",
    "socketPath",
    "cidrList",
    "kubernetesVersion",
];

impl Description {
    /// Loads the description from JSON.
    pub fn from_json(text: &str) -> Result<Description, String> {
        serde_json::from_str(text).map_err(|e| format!("the kubeadm types description does not parse: {e}"))
    }

    /// Problems of the description itself: a type naming a struct not described, a format
    /// the checker does not know, a rule naming a field the struct does not have.
    pub fn self_check(&self) -> Vec<String> {
        let mut errors = Vec::new();
        for (name, s) in &self.structs {
            for (field, ty) in &s.fields {
                let mut t = Ty::parse(ty);
                while let Ty::List(inner) | Ty::Map(inner) = t {
                    t = *inner;
                }
                if let Ty::Struct(target) = t
                    && !self.structs.contains_key(&target)
                {
                    errors.push(format!("{name}.{field}: type {target} is not described"));
                }
            }
            for inline in &s.inline {
                if !self.structs.contains_key(inline) {
                    errors.push(format!("{name}: inline {inline} is not described"));
                }
            }
            let fields = self.fields_of(name);
            let named = s
                .required
                .iter()
                .chain(s.formats.keys())
                .chain(s.exactly_one.iter().chain(&s.at_least_one).chain(&s.at_most_one).flatten());
            for field in named {
                if !fields.contains_key(field) {
                    errors.push(format!("{name}: a rule names {field}, which it has no field of"));
                }
            }
            for (field, format) in &s.formats {
                if !format.starts_with("enum:") && !FORMATS.contains(&format.as_str()) {
                    errors.push(format!("{name}.{field}: unknown format {format:?}"));
                }
            }
        }
        for (api, v) in &self.api_versions {
            for kind in &v.kinds {
                if !self.structs.contains_key(kind) {
                    errors.push(format!("{api} {kind}: no struct of that name"));
                }
            }
        }
        errors
    }

    /// Every JSON field of `name`, inline structs' included.
    fn fields_of(&self, name: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(s) = self.structs.get(name) {
            for inline in &s.inline {
                out.extend(self.fields_of(inline));
            }
            out.extend(s.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        out
    }

    /// Every problem of one document (a YAML/JSON object), each naming its path.
    pub fn check_document(&self, doc: &Value) -> Vec<String> {
        let Some(object) = doc.as_object() else {
            return vec!["the document is not an object".into()];
        };
        let (Some(api), Some(kind)) = (object.get("apiVersion").and_then(Value::as_str), object.get("kind").and_then(Value::as_str)) else {
            return vec!["apiVersion and kind must be strings".into()];
        };
        let Some(version) = self.api_versions.get(api) else {
            return vec![format!("apiVersion {api:?} is not one kubeadm reads here (known: {:?})", self.api_versions.keys())];
        };
        if version.not_described.iter().any(|k| k == kind) {
            return vec![format!("{api} {kind} is a known kind whose type is not transcribed: describe it first")];
        }
        if !version.kinds.iter().any(|k| k == kind) {
            return vec![format!("{api} has no kind {kind:?}")];
        }
        let mut rest = object.clone();
        rest.remove("apiVersion");
        rest.remove("kind");
        let mut errors = Vec::new();
        self.check_struct(kind, &rest, kind, &mut errors);
        errors
    }

    fn check_struct(&self, name: &str, object: &serde_json::Map<String, Value>, path: &str, errors: &mut Vec<String>) {
        let fields = self.fields_of(name);
        for (key, value) in object {
            let at = format!("{path}.{key}");
            match fields.get(key) {
                None => errors.push(format!("{at}: unknown field (no field {key:?} in {name}; strict decoding refuses it)")),
                Some(ty) => self.check_value(&Ty::parse(ty), value, &at, errors),
            }
        }
        let Some(rules) = self.structs.get(name) else { return };
        let set = |f: &String| object.get(f).is_some_and(is_set);
        for field in &rules.required {
            if !set(field) {
                errors.push(format!("{path}.{field}: required by kubeadm, missing or empty"));
            }
        }
        for group in &rules.exactly_one {
            if group.iter().filter(|f| set(f)).count() != 1 {
                errors.push(format!("{path}: exactly one of {group:?} must be set"));
            }
        }
        for group in &rules.at_least_one {
            if !group.iter().any(set) {
                errors.push(format!("{path}: one of {group:?} must be set"));
            }
        }
        for group in &rules.at_most_one {
            if group.iter().filter(|f| set(f)).count() > 1 {
                errors.push(format!("{path}: {group:?} are mutually exclusive"));
            }
        }
        for (field, format) in &rules.formats {
            match object.get(field) {
                Some(Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        check_format(format, item, &format!("{path}.{field}[{i}]"), errors);
                    }
                }
                Some(Value::Null) | None => {}
                Some(value) => check_format(format, value, &format!("{path}.{field}"), errors),
            }
        }
    }

    fn check_value(&self, ty: &Ty, value: &Value, at: &str, errors: &mut Vec<String>) {
        // Go's decoder leaves the zero value for a JSON null, whatever the type.
        if value.is_null() {
            return;
        }
        let wrong = |want: &str| format!("{at}: expected {want}, found {}", json_kind(value));
        match ty {
            Ty::String if !value.is_string() => errors.push(wrong("a string")),
            Ty::Bool if !value.is_boolean() => errors.push(wrong("a boolean")),
            Ty::Int32 if value.as_i64().is_none_or(|n| i32::try_from(n).is_err()) => errors.push(wrong("a 32-bit integer")),
            Ty::Int64 if value.as_i64().is_none() => errors.push(wrong("an integer")),
            Ty::Float64 if !value.is_number() => errors.push(wrong("a number")),
            Ty::Duration => match value.as_str() {
                Some(s) if go_duration_ok(s) => {}
                Some(s) => errors.push(format!("{at}: {s:?} is not a Go duration (e.g. \"1h0m0s\")")),
                None => errors.push(wrong("a duration string")),
            },
            Ty::Time => match value.as_str() {
                Some(s) if chrono::DateTime::parse_from_rfc3339(s).is_ok() => {}
                _ => errors.push(wrong("an RFC 3339 time")),
            },
            Ty::List(inner) => match value.as_array() {
                Some(items) => {
                    for (i, item) in items.iter().enumerate() {
                        self.check_value(inner, item, &format!("{at}[{i}]"), errors);
                    }
                }
                None => errors.push(wrong("a list")),
            },
            Ty::Map(inner) => match value.as_object() {
                Some(map) => {
                    for (k, v) in map {
                        self.check_value(inner, v, &format!("{at}[{k:?}]"), errors);
                    }
                }
                None => errors.push(wrong("a map")),
            },
            Ty::Struct(name) => match value.as_object() {
                Some(object) => self.check_struct(name, object, at, errors),
                None => errors.push(wrong(&format!("an object ({name})"))),
            },
            Ty::Opaque => errors.push(format!("{at}: its type is not transcribed in the description; transcribe it before generating it")),
            _ => {}
        }
    }
}

fn is_set(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Bool(b) => *b,
        _ => true,
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Go's `time.ParseDuration`: an optional sign, then `0` or one or more `<decimal><unit>`.
pub fn go_duration_ok(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    if s == "0" {
        return true;
    }
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let number = &rest[..digits];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[digits..];
        // "ms" comes before "m" and "s": the first unit that matches is the longest.
        let Some(unit) = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"].iter().find(|u| rest.starts_with(**u)) else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}

fn hex_of_len(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn lower_alnum(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// kubeadm's node names and DNS domains: RFC 1123 subdomain.
pub fn dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// `host:port` as Go's `net.SplitHostPort` takes it (IPv6 in brackets).
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return Some((host, after.strip_prefix(':')?));
    }
    let (host, port) = s.rsplit_once(':')?;
    (!host.contains(':')).then_some((host, port))
}

fn port_ok(port: &str) -> bool {
    !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))
}

fn host_ok(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok() || dns1123_subdomain(host)
}

fn cidr_ok(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else { return false };
    let Ok(bits) = bits.parse::<u8>() else { return false };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

fn format_ok(format: &str, value: &Value) -> bool {
    if let Some(values) = format.strip_prefix("enum:") {
        return value.as_str().is_some_and(|s| values.split(',').any(|v| v == s));
    }
    if format == "port" {
        return value.as_i64().is_some_and(|p| (1..=65535).contains(&p));
    }
    let Some(s) = value.as_str() else { return false };
    match format {
        "bootstrapToken" => {
            s.split_once('.').is_some_and(|(id, secret)| id.len() == 6 && secret.len() == 16 && lower_alnum(id) && lower_alnum(secret))
        }
        "bootstrapGroup" => s.strip_prefix("system:bootstrappers:").is_some_and(|rest| {
            !rest.is_empty()
                && rest.len() <= 256
                && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
                && rest.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        }),
        "certificateKey" => hex_of_len(s, 64),
        "caCertHash" => s.strip_prefix("sha256:").is_some_and(|h| hex_of_len(h, 64)),
        "hostPort" => split_host_port(s).is_some_and(|(h, p)| host_ok(h) && port_ok(p)),
        "hostOptionalPort" => match split_host_port(s) {
            Some((h, p)) => host_ok(h) && port_ok(p),
            None => host_ok(s),
        },
        "ip" => s.parse::<std::net::IpAddr>().is_ok(),
        "dns1123Subdomain" => dns1123_subdomain(s),
        "socketPath" => s.strip_prefix("unix://").unwrap_or(s).starts_with('/'),
        "cidrList" => s.split(',').all(cidr_ok),
        "kubernetesVersion" => {
            let v = s.strip_prefix('v').unwrap_or(s);
            let core = v.split(['-', '+']).next().unwrap_or_default();
            let parts: Vec<&str> = core.split('.').collect();
            parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        }
        _ => false,
    }
}

fn check_format(format: &str, value: &Value, at: &str, errors: &mut Vec<String>) {
    if !format_ok(format, value) {
        errors.push(format!("{at}: {value} is not a valid {format}"));
    }
}
