//! Dereference of config inputs: `spec.configFrom` (Secrets and ConfigMaps of the TaskServ's
//! namespace) merged into `spec.config`, then the secret fields of the service's schema that
//! are still unset, generated once into a Secret the TaskServ owns.
//!
//! Values stay in memory and on the script's stdin: the status gets a salted hash of them
//! ([`inputs_hash`]), error messages name the object, key and path but never a value, and
//! every secret value feeds the [`Redactor`] that filters script output.
//!
//! The merge ([`merge`]) and the generation helpers are pure and unit-tested; [`resolve`]
//! does the API reads and the one write (the generated Secret).
//!
//! # The inputs of an install
//!
//! This is the one place that says what an install depends on; the planner re-runs
//! `install.nu` on a server that already has the service only when one of these changed since
//! it was rolled out ([`install_inputs`], recorded in `status.installInputs`), and the plan's
//! reason names it (`re-install (config.port changed)`):
//!
//! - `service`: the catalog service;
//! - the version: a different one is an upgrade (reason `upgrade`), not a re-install;
//! - `config.<path>`: every leaf of the effective config — `spec.config`, merged with
//!   `configFrom` (so a rotated Secret counts, named by the path it lands on), the generated
//!   secrets and the schema's defaults. Mappings are compared key by key (their order means
//!   nothing); a list is one value (its order may mean something to the service).
//!
//! Not inputs, so changing them runs no script on servers that have the service: labels and
//! annotations (other than `provisioning.dev/approve`, which releases a held plan),
//! `spec.approval` (whatever its value), pause and resume, `spec.rollout`,
//! `spec.rollbackOnFailure`, `spec.dependsOn`, the order of `spec.servers.names`, re-applying
//! the same manifest. The server list itself: a server added installs there only (a scale-up
//! installs on the new members; clustered services join through the new member, as etcd's
//! `member add`); a server removed is drained with `remove.nu`. Other members (peers) are not an
//! input of an existing member's install.
//!
//! An input that changes while an install runs with the old value re-runs that install once it
//! has finished. Besides the inputs, an install runs again on a server whose machine was
//! replaced, went away, failed its health check or drifted (`Drifted`), or whose install was
//! interrupted or failed.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{ConfigFromSource, ConfigSourceKind, TaskServ};
use provisioning_taskservs::{Catalog, Redactor, SecretField, SecretFormat};
use rand::Rng;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Label on generated Secrets naming the TaskServ that owns them.
pub const LABEL_GENERATED_FOR: &str = "provisioning.dev/generated-for";
/// Field manager of the generated-Secret writes.
const FIELD_MANAGER: &str = "provisioning-controller";

/// Name of the Secret holding a TaskServ's generated secret fields.
pub fn generated_secret_name(taskserv: &str) -> String {
    format!("{taskserv}-generated")
}

/// What a `configFrom` entry read: the entry and the value of its key (`None`: the object
/// or the key does not exist).
#[derive(Clone, PartialEq, Eq)]
pub struct SourceValue {
    /// The entry.
    pub source: ConfigFromSource,
    /// The key's text.
    pub value: Option<String>,
}

impl std::fmt::Debug for SourceValue {
    // Never print a value: a Debug of the inputs must be safe to log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceValue").field("source", &self.source).field("present", &self.value.is_some()).finish()
    }
}

/// Why the inputs cannot be resolved. Messages name the object, key and path, never a value.
#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    /// A non-optional Secret/ConfigMap or key does not exist (yet): wait for it.
    #[error("waiting for {kind} {namespace}/{name} (key {key:?}, configFrom[{index}]): {what} does not exist")]
    Missing {
        /// Secret or ConfigMap.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Object name.
        name: String,
        /// Key.
        key: String,
        /// Position in configFrom.
        index: usize,
        /// "the object" or "the key".
        what: &'static str,
    },
    /// The key's text cannot be used: not UTF-8, not YAML, not a mapping, or the target path
    /// runs into a value that is not a mapping.
    #[error("configFrom[{index}] ({kind} {name}, key {key:?}): {problem}")]
    Unusable {
        /// Position in configFrom.
        index: usize,
        /// Secret or ConfigMap.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Key.
        key: String,
        /// What is wrong (never the value).
        problem: String,
    },
    /// The generated-secret Secret exists but belongs to something else.
    #[error("Secret {namespace}/{name} exists and is not owned by this TaskServ: rename it or delete it")]
    ForeignGeneratedSecret {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
    },
    /// A key could not be generated.
    #[error("generating a secret failed: {0}")]
    Generate(String),
    /// The secret values of the config are too many to redact from script output.
    #[error("{0}")]
    TooManySecrets(String),
    /// An API call failed (retried with backoff).
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl InputsError {
    /// CamelCase condition reason (`Stalled`) for the errors that wait on the user.
    pub fn reason(&self) -> &'static str {
        match self {
            InputsError::Missing { .. } => "ConfigFromMissing",
            InputsError::Unusable { .. } => "ConfigFromInvalid",
            InputsError::ForeignGeneratedSecret { .. } => "GeneratedSecretConflict",
            InputsError::Kube(_) => "ApiError",
            InputsError::Generate(_) => "GenerateFailed",
            InputsError::TooManySecrets(_) => "SecretsTooMany",
        }
    }
}

/// The outcome of [`merge`]: the config and the values that came from Secrets.
#[derive(Clone, Default, PartialEq)]
pub struct Merged {
    /// `config` with every entry applied in order.
    pub config: Value,
    /// Every string read from a Secret (whole values and the string leaves of merged YAML).
    pub secrets: Vec<String>,
}

impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged").field("secrets", &self.secrets.len()).finish_non_exhaustive()
    }
}

/// The most text all of a TaskServ's `configFrom` values may come to: each is decoded into the
/// config (YAML of tiny maps decodes to up to 64 times its size), and every reconcile does it.
pub const MAX_CONFIG_FROM_BYTES: usize = 256 << 10;

/// Merges `sources` into `base` in order (later entries win). An entry with `targetPath`
/// sets that dotted path to the key's text; without it the key's text is YAML whose mapping
/// is deep-merged (mappings merge key by key, anything else replaces). A missing object or
/// key is skipped when `optional`, an error otherwise; values over [`MAX_CONFIG_FROM_BYTES`]
/// together are refused.
pub fn merge(base: Option<&Value>, sources: &[SourceValue], namespace: &str) -> Result<Merged, InputsError> {
    let mut config = match base {
        Some(v) if !v.is_null() => v.clone(),
        _ => Value::Object(Default::default()),
    };
    let mut secrets = Vec::new();
    let mut total = 0usize;
    for (index, sv) in sources.iter().enumerate() {
        let s = &sv.source;
        total = total.saturating_add(sv.value.as_ref().map_or(0, String::len));
        if total > MAX_CONFIG_FROM_BYTES {
            return Err(InputsError::Unusable {
                index,
                kind: s.kind.as_str(),
                name: s.name.clone(),
                key: s.key.clone(),
                problem: too_much_config_from(),
            });
        }
        let kind = s.kind.as_str();
        let unusable = |problem: String| InputsError::Unusable { index, kind, name: s.name.clone(), key: s.key.clone(), problem };
        let Some(text) = &sv.value else {
            if s.optional {
                continue;
            }
            return Err(InputsError::Missing {
                kind,
                namespace: namespace.to_string(),
                name: s.name.clone(),
                key: s.key.clone(),
                index,
                what: "the key",
            });
        };
        let is_secret = s.kind == ConfigSourceKind::Secret;
        if s.target_path.is_empty() {
            let parsed: Value = match provisioning_yaml::from_str(text) {
                Ok(v) => v,
                // The parser's message may quote the text: only a ConfigMap's is shown.
                // The alias-expansion refusal quotes nothing of the text: shown for Secrets too.
                Err(e) if !is_secret || e.is_excessive_aliasing() => return Err(unusable(format!("not valid YAML: {e}"))),
                Err(_) => return Err(unusable("not valid YAML (details withheld: the value is secret)".into())),
            };
            if !parsed.is_object() {
                return Err(unusable("holds no YAML mapping to merge (set targetPath to use the value as one field)".into()));
            }
            if is_secret {
                string_leaves(&parsed, &mut secrets);
            }
            deep_merge(&mut config, parsed);
        } else {
            let path: Vec<&str> = s.target_path.split('.').collect();
            if path.iter().any(|p| p.is_empty()) {
                return Err(unusable(format!("targetPath {:?} has an empty segment", s.target_path)));
            }
            set_path(&mut config, &path, Value::String(text.clone()))
                .map_err(|at| unusable(format!("targetPath {:?}: {at} is not a mapping", s.target_path)))?;
            if is_secret {
                secrets.push(text.clone());
            }
        }
    }
    Ok(Merged { config, secrets })
}

fn string_leaves(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| string_leaves(v, out)),
        Value::Object(map) => map.values().for_each(|v| string_leaves(v, out)),
        Value::Number(n) => out.push(n.to_string()),
        _ => {}
    }
}

fn deep_merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => deep_merge(existing, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Sets `path` in `config` to `value`, creating mappings on the way. `Err(prefix)` when a
/// segment on the way holds something that is not a mapping.
pub fn set_path(config: &mut Value, path: &[&str], value: Value) -> Result<(), String> {
    let mut node = config;
    for (i, segment) in path.iter().enumerate() {
        let Value::Object(map) = node else { return Err(path[..i].join(".")) };
        if i + 1 == path.len() {
            map.insert((*segment).to_string(), value);
            return Ok(());
        }
        node = map.entry((*segment).to_string()).or_insert_with(|| Value::Object(Default::default()));
    }
    Ok(())
}

/// The value at `path`, if any.
pub fn get_path<'a>(config: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(config, |node, segment| node.get(segment))
}

/// The secret fields `config` leaves unset (absent or null).
pub fn unset_secret_fields(fields: &[SecretField], config: &Value) -> Vec<SecretField> {
    fields.iter().filter(|f| get_path(config, &f.path).is_none_or(Value::is_null)).cloned().collect()
}

/// A fresh random value in `format` (the OS-seeded thread RNG, a CSPRNG; keys from aws-lc).
pub fn generate(format: SecretFormat) -> Result<String, InputsError> {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    const LOWER_ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    const HEX: &[u8] = b"0123456789abcdef";
    let mut rng = rand::rng();
    let mut pick =
        |alphabet: &[u8], n: usize| -> String { (0..n).map(|_| alphabet[rng.random_range(0..alphabet.len())] as char).collect() };
    Ok(match format {
        SecretFormat::Password => pick(ALNUM, 32),
        SecretFormat::KubeadmToken => format!("{}.{}", pick(LOWER_ALNUM, 6), pick(LOWER_ALNUM, 16)),
        SecretFormat::Hex64 => pick(HEX, 64),
        SecretFormat::EcP256Pem => {
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| InputsError::Generate(e.to_string()))?.serialize_pem()
        }
    })
}

/// Version of the inputs: `sha256:` and 16 hex digits of a hash over the object's uid (a
/// salt, so equal passwords of two objects do not look equal) and every input in order.
/// `None` when there are no inputs besides the spec.
pub fn inputs_hash(uid: &str, sources: &[SourceValue], generated: &BTreeMap<String, String>) -> Option<String> {
    if sources.is_empty() && generated.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        // Length-prefixed, so no two different input lists hash the same bytes.
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(uid.as_bytes());
    for sv in sources {
        let s = &sv.source;
        field(s.kind.as_str().as_bytes());
        field(s.name.as_bytes());
        field(s.key.as_bytes());
        field(s.target_path.as_bytes());
        match &sv.value {
            Some(v) => field(v.as_bytes()),
            None => field(b"\0absent"),
        }
    }
    for (k, v) in generated {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Some(format!("sha256:{hex}"))
}

/// The inputs of an install (see the module doc), by name, each with a salted hash of its
/// value (`salt`: the object's name, so equal values of two objects do not look equal at a
/// glance). Never holds a value.
pub fn install_inputs(salt: &str, service: &str, config: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("service".to_string(), fingerprint(salt, "service", service));
    let mut leaves = Vec::new();
    config_leaves("config", config, 0, &mut leaves);
    for (path, text) in leaves {
        let fingerprint = fingerprint(salt, &path, &text);
        out.insert(path, fingerprint);
    }
    out
}

/// The names of the inputs that differ between `before` and `after` (changed, added or
/// removed), sorted.
pub fn changed_inputs(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let names: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    names.into_iter().filter(|n| before.get(*n) != after.get(*n)).cloned().collect()
}

/// `config.port changed`, `config.a and config.b changed`, `config.a, config.b, config.c and
/// 2 more changed`.
pub fn describe_changed(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let list = match names {
        [] => return "inputs changed".to_string(),
        [one] => one.clone(),
        [a, b] => format!("{a} and {b}"),
        [a, b, c] if names.len() == SHOWN => format!("{a}, {b} and {c}"),
        _ => format!("{} and {} more", names[..SHOWN].join(", "), names.len() - SHOWN),
    };
    format!("{list} changed")
}

fn fingerprint(salt: &str, name: &str, text: &str) -> String {
    let mut h = Sha256::new();
    for bytes in [salt.as_bytes(), name.as_bytes(), text.as_bytes()] {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    let hex: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Most inputs named per install (the rest of a mapping past it is one input, `prefix.…`).
const MAX_INPUTS: usize = 256;
/// Mappings deeper than this are one input.
const MAX_INPUT_DEPTH: usize = 8;

/// Every leaf of `value` under `prefix`, with its canonical text: mappings are walked key by
/// key; anything else (a scalar, a list, an empty mapping) is one leaf. Bounded whatever the
/// config holds (status records these names): at most [`MAX_INPUTS`] leaves, long keys
/// shortened ([`crate::history::path_key`]), mappings past [`MAX_INPUT_DEPTH`] one leaf.
fn config_leaves(prefix: &str, value: &Value, depth: usize, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if !map.is_empty() && depth < MAX_INPUT_DEPTH && out.len() < MAX_INPUTS => {
            let mut entries = map.iter();
            while let Some((k, v)) = entries.next() {
                if out.len() + 1 >= MAX_INPUTS {
                    let rest: BTreeMap<&String, String> = std::iter::once((k, v)).chain(entries).map(|(k, v)| (k, canonical(v))).collect();
                    let text: Vec<String> = rest.into_iter().map(|(k, v)| format!("{}:{v}", Value::String(k.clone()))).collect();
                    out.push((format!("{prefix}.…"), text.join(",")));
                    return;
                }
                config_leaves(&format!("{prefix}.{}", crate::history::path_key(k)), v, depth + 1, out);
            }
        }
        // No config at all: nothing to compare.
        Value::Null if prefix == "config" => {}
        _ => out.push((prefix.to_string(), canonical(value))),
    }
}

/// JSON text with the keys of every mapping sorted (the order of a mapping means nothing).
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, String> = map.iter().map(|(k, v)| (k, canonical(v))).collect();
            let body: Vec<String> = sorted.into_iter().map(|(k, v)| format!("{}:{v}", Value::String(k.clone()))).collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// Everything a TaskServ's config is made of, resolved.
#[derive(Clone, Default, PartialEq)]
pub struct ResolvedInputs {
    /// `config` merged with `configFrom` and the generated secrets (before schema defaults).
    pub config: Value,
    /// Filters every value known to be secret from script output.
    pub redactor: Redactor,
    /// [`inputs_hash`], for status.
    pub hash: Option<String>,
    /// The generated-secret Secret, when the TaskServ has one.
    pub generated_secret: Option<String>,
}

impl std::fmt::Debug for ResolvedInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedInputs").field("hash", &self.hash).field("generated_secret", &self.generated_secret).finish_non_exhaustive()
    }
}

fn secret_text(secret: &Secret, key: &str) -> Option<Result<String, ()>> {
    if let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(String::from_utf8(bytes.0.clone()).map_err(|_| ()));
    }
    secret.string_data.as_ref().and_then(|d| d.get(key)).map(|s| Ok(s.clone()))
}

/// Reads every `configFrom` entry of `ts` from its namespace; a missing object that is not
/// `optional` is an error naming it.
/// `configFrom` reads in flight in the whole controller: each GET decodes the whole Secret or
/// ConfigMap (up to the API server's object limit, several times that once decoded), whatever
/// key is used, and every TaskServ reconcile reads its sources.
static CONFIG_FROM_READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

async fn read_sources(client: &Client, ts: &TaskServ, namespace: &str) -> Result<Vec<SourceValue>, InputsError> {
    if ts.spec.config_from.is_empty() {
        return Ok(vec![]);
    }
    // The semaphore is never closed.
    let _reading = CONFIG_FROM_READS.acquire().await.ok();
    // Only the key read is decoded (crate::slim): the object is the tenant's to make large.
    let secrets = crate::slim::SlimApi::of::<Secret>(client.clone(), Some(namespace));
    let config_maps = crate::slim::SlimApi::of::<ConfigMap>(client.clone(), Some(namespace));
    let mut sources = Vec::with_capacity(ts.spec.config_from.len());
    let mut total = 0usize;
    for (index, source) in ts.spec.config_from.iter().enumerate() {
        let kind = source.kind.as_str();
        let not_utf8 = || InputsError::Unusable {
            index,
            kind,
            name: source.name.clone(),
            key: source.key.clone(),
            problem: "the value is not UTF-8 text".into(),
        };
        let (exists, value) = match source.kind {
            ConfigSourceKind::Secret => {
                match secrets.get_data(&source.name, true, &|k| k == source.key).await?.map(crate::slim::SlimData::secret) {
                    None => (false, None),
                    Some(s) => (true, secret_text(&s, &source.key).transpose().map_err(|_| not_utf8())?),
                }
            }
            ConfigSourceKind::ConfigMap => {
                match config_maps.get_data(&source.name, false, &|k| k == source.key).await?.map(crate::slim::SlimData::config_map) {
                    None => (false, None),
                    Some(cm) => {
                        let text = cm.data.as_ref().and_then(|d| d.get(&source.key)).cloned();
                        let binary = cm.binary_data.as_ref().and_then(|d| d.get(&source.key));
                        match (text, binary) {
                            (Some(t), _) => (true, Some(t)),
                            (None, Some(b)) => (true, Some(String::from_utf8(b.0.clone()).map_err(|_| not_utf8())?)),
                            (None, None) => (true, None),
                        }
                    }
                }
            }
        };
        if !exists && !source.optional {
            return Err(InputsError::Missing {
                kind,
                namespace: namespace.to_string(),
                name: source.name.clone(),
                key: source.key.clone(),
                index,
                what: "the object",
            });
        }
        // Stop as soon as the values pass the limit, before keeping the next one.
        total = total.saturating_add(value.as_ref().map_or(0, String::len));
        if total > MAX_CONFIG_FROM_BYTES {
            return Err(InputsError::Unusable {
                index,
                kind,
                name: source.name.clone(),
                key: source.key.clone(),
                problem: too_much_config_from(),
            });
        }
        sources.push(SourceValue { source: source.clone(), value });
    }
    Ok(sources)
}

fn too_much_config_from() -> String {
    format!(
        "the configFrom values come to more than {} KiB together (the limit of what the controller reads into a config)",
        MAX_CONFIG_FROM_BYTES >> 10
    )
}

/// Reads every `configFrom` entry of `ts` (same namespace only: the entries have no
/// namespace field), merges, and — when `generate` — creates or extends the TaskServ's
/// generated Secret with the unset secret fields of its service.
pub async fn resolve(client: &Client, ts: &TaskServ, catalog: &Catalog, generate_missing: bool) -> Result<ResolvedInputs, InputsError> {
    let namespace = ts.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let sources = read_sources(client, ts, &namespace).await?;
    let merged = merge(ts.spec.config.as_ref(), &sources, &namespace)?;
    let mut config = merged.config;
    let mut known_secrets = merged.secrets;

    let fields = catalog.get(&ts.spec.service).map(|s| s.secret_fields()).unwrap_or_default();
    // Inline values of secret fields are secret too (redacted from output).
    for f in &fields {
        if let Some(Value::String(v)) = get_path(&config, &f.path) {
            known_secrets.push(v.clone());
        }
    }
    let unset = unset_secret_fields(&fields, &config);
    let name = generated_secret_name(&ts.name_any());
    let mut generated: BTreeMap<String, String> = BTreeMap::new();
    let mut generated_secret = None;
    if !unset.is_empty() {
        // Only the generated keys are decoded (crate::slim): the tenant can add others.
        let wanted: std::collections::BTreeSet<String> = unset.iter().map(|f| f.dotted()).collect();
        let existing = crate::slim::SlimApi::of::<Secret>(client.clone(), Some(&namespace))
            .get_data(&name, true, &|k| wanted.contains(k))
            .await?
            .map(crate::slim::SlimData::secret);
        let uid = ts.uid().unwrap_or_default();
        if let Some(s) = &existing
            && !s.owner_references().iter().any(|o| o.uid == uid)
        {
            return Err(InputsError::ForeignGeneratedSecret { namespace, name });
        }
        let mut new_keys: BTreeMap<String, ByteString> = BTreeMap::new();
        for f in &unset {
            let key = f.dotted();
            let current = existing.as_ref().and_then(|s| secret_text(s, &key)).and_then(Result::ok);
            let value = match current {
                Some(v) => v,
                None if generate_missing => {
                    let v = generate(f.format)?;
                    new_keys.insert(key.clone(), ByteString(v.clone().into_bytes()));
                    v
                }
                // Removing: nothing to generate, the scripts get the schema default.
                None => continue,
            };
            let path: Vec<&str> = f.path.iter().map(String::as_str).collect();
            // A secret field's parents are mappings of the schema; a config that put a
            // scalar there fails validation anyway.
            let _ = set_path(&mut config, &path, Value::String(value.clone()));
            known_secrets.push(value.clone());
            generated.insert(key, value);
        }
        if !new_keys.is_empty() {
            write_generated(&secrets, ts, &name, existing.is_some(), new_keys).await?;
        }
        if existing.is_some() || !generated.is_empty() {
            generated_secret = Some(name);
        }
    }
    let redactor = Redactor::try_new(&known_secrets).map_err(InputsError::TooManySecrets)?;
    Ok(ResolvedInputs { config, redactor, hash: inputs_hash(&ts.uid().unwrap_or_default(), &sources, &generated), generated_secret })
}

async fn write_generated(
    api: &Api<Secret>,
    ts: &TaskServ,
    name: &str,
    exists: bool,
    data: BTreeMap<String, ByteString>,
) -> Result<(), InputsError> {
    if exists {
        // Adds the new keys only: values generated earlier are never replaced. The answer is
        // decoded slim (crate::slim): the tenant can have made the Secret large.
        let patch = serde_json::json!({"data": data});
        let slim = crate::slim::SlimApi::of::<Secret>(api.clone().into_client(), ts.namespace().as_deref());
        slim.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        return Ok(());
    }
    let owner = OwnerReference {
        api_version: "provisioning.dev/v1alpha1".into(),
        kind: "TaskServ".into(),
        name: ts.name_any(),
        uid: ts.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: ts.namespace(),
            labels: Some(BTreeMap::from([(LABEL_GENERATED_FOR.to_string(), ts.name_any())])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    };
    match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &secret).await {
        Ok(_) => Ok(()),
        // A concurrent reconcile created it first: the next pass reads its values.
        Err(kube::Error::Api(e)) if e.code == 409 => Err(InputsError::Kube(kube::Error::Api(e))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn config_from_values_over_the_limit_together_are_refused() {
        let source = |name: &str| ConfigFromSource {
            kind: ConfigSourceKind::ConfigMap,
            name: name.into(),
            key: "k".into(),
            target_path: String::new(),
            optional: false,
        };
        let half = format!("a: \"{}\"\n", "x".repeat(MAX_CONFIG_FROM_BYTES / 2));
        let sources =
            [SourceValue { source: source("one"), value: Some(half.clone()) }, SourceValue { source: source("two"), value: Some(half) }];
        let refused = merge(None, &sources, "ns");
        assert!(matches!(&refused, Err(InputsError::Unusable { index: 1, problem, .. }) if problem.contains("256 KiB")), "{refused:?}");
        assert!(merge(None, &sources[..1], "ns").is_ok());
    }

    fn src(kind: ConfigSourceKind, name: &str, key: &str, target: &str, optional: bool, value: Option<&str>) -> SourceValue {
        SourceValue {
            source: ConfigFromSource { kind, name: name.into(), key: key.into(), target_path: target.into(), optional },
            value: value.map(str::to_string),
        }
    }

    #[test]
    fn merges_in_order_with_target_paths_and_deep_yaml() {
        let base = json!({"port": 1, "auth": {"user": "app", "password": "inline"}});
        let sources = [
            src(ConfigSourceKind::ConfigMap, "cm", "values.yaml", "", false, Some("port: 2\nauth: {mode: scram}\n")),
            src(ConfigSourceKind::Secret, "s", "pw", "auth.password", false, Some("from-secret")),
            src(ConfigSourceKind::Secret, "s2", "values.yaml", "", false, Some("port: 3\nextra: {token: tk-123}\n")),
        ];
        let m = merge(Some(&base), &sources, "ns").expect("merges");
        assert_eq!(
            m.config,
            json!({"port": 3, "auth": {"user": "app", "password": "from-secret", "mode": "scram"}, "extra": {"token": "tk-123"}})
        );
        // Only Secret values are secret; ConfigMap values are not.
        assert_eq!(m.secrets, ["from-secret", "tk-123", "3"]);
    }

    #[test]
    fn optional_entries_are_skipped_and_missing_ones_name_object_and_key() {
        let sources = [src(ConfigSourceKind::Secret, "gone", "pw", "password", true, None)];
        assert_eq!(merge(None, &sources, "ns").expect("optional").config, json!({}));
        let sources = [src(ConfigSourceKind::Secret, "db", "pw", "password", false, None)];
        let e = merge(None, &sources, "ns").expect_err("missing");
        assert_eq!(e.reason(), "ConfigFromMissing");
        let msg = e.to_string();
        assert!(msg.contains("Secret ns/db") && msg.contains("\"pw\""), "{msg}");
    }

    #[test]
    fn unusable_values_are_refused_without_quoting_them() {
        let secret = "not: [valid yaml SECRETVALUE";
        let e = merge(None, &[src(ConfigSourceKind::Secret, "s", "v", "", false, Some(secret))], "ns").expect_err("bad yaml");
        assert!(!e.to_string().contains("SECRETVALUE"), "{e}");
        let e = merge(None, &[src(ConfigSourceKind::Secret, "s", "v", "", false, Some("SECRETVALUE"))], "ns").expect_err("scalar");
        assert!(!e.to_string().contains("SECRETVALUE"), "{e}");
        let base = json!({"auth": "scalar"});
        let e = merge(Some(&base), &[src(ConfigSourceKind::Secret, "s", "v", "auth.password", false, Some("SECRETVALUE"))], "ns")
            .expect_err("path through a scalar");
        assert!(e.to_string().contains("auth is not a mapping") && !e.to_string().contains("SECRETVALUE"), "{e}");
    }

    /// Issue 26, item 1: a tenant's ConfigMap that expands to billions of values through
    /// aliases is refused (quickly, in bounded memory), naming the problem; a Secret's too.
    #[test]
    fn a_yaml_alias_bomb_in_config_from_is_refused() {
        let bomb = format!("a: &a [{}]\nb: [{}]\n", vec!["x"; 30_000].join(","), vec!["*a"; 30_000].join(","));
        for kind in [ConfigSourceKind::ConfigMap, ConfigSourceKind::Secret] {
            let started = std::time::Instant::now();
            let e = merge(None, &[src(kind, "bomb", "values.yaml", "", false, Some(&bomb))], "ns").expect_err("refused");
            assert!(e.to_string().contains("excessive aliasing"), "{e}");
            assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
        }
    }

    #[test]
    fn generated_values_have_their_formats() {
        let token = generate(SecretFormat::KubeadmToken).expect("token");
        let (a, b) = token.split_once('.').expect("dot");
        assert!(a.len() == 6 && b.len() == 16, "{token}");
        assert!(token.chars().all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit()), "{token}");
        let key = generate(SecretFormat::Hex64).expect("hex");
        assert!(key.len() == 64 && key.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{key}");
        let pw = generate(SecretFormat::Password).expect("password");
        assert!(pw.len() == 32 && pw.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(pw, generate(SecretFormat::Password).expect("password"));
        let pem = generate(SecretFormat::EcP256Pem).expect("key");
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "not a PKCS#8 PEM key");
    }

    #[test]
    fn the_hash_changes_with_a_value_and_is_salted_by_the_uid() {
        let one = [src(ConfigSourceKind::Secret, "s", "pw", "password", false, Some("a"))];
        let two = [src(ConfigSourceKind::Secret, "s", "pw", "password", false, Some("b"))];
        let none = BTreeMap::new();
        let h1 = inputs_hash("uid-1", &one, &none).expect("hash");
        assert!(h1.starts_with("sha256:") && h1.len() == 7 + 16, "{h1}");
        assert_ne!(Some(h1.clone()), inputs_hash("uid-1", &two, &none));
        assert_ne!(Some(h1.clone()), inputs_hash("uid-2", &one, &none));
        assert_eq!(Some(h1), inputs_hash("uid-1", &one, &none));
        assert_eq!(inputs_hash("uid-1", &[], &none), None);
    }

    #[test]
    fn install_inputs_are_bounded_whatever_the_config_holds() {
        let long = "k".repeat(512 << 10);
        let wide: serde_json::Map<String, Value> = (0..5000).map(|i| (format!("a{i}"), json!(0))).collect();
        let config = json!({ long.clone(): Value::Object(wide) });
        let inputs = install_inputs("ts", "web", &config);
        assert!(inputs.len() <= MAX_INPUTS + 1, "{}", inputs.len());
        let bytes: usize = inputs.keys().map(String::len).sum();
        assert!(bytes < 64 << 10, "{bytes} bytes of names");
        // A change past the limit still shows.
        let mut changed = config.clone();
        changed[&long]["a4999"] = json!(1);
        assert_eq!(changed_inputs(&inputs, &install_inputs("ts", "web", &changed)).len(), 1);
    }

    #[test]
    fn install_inputs_name_each_config_leaf_and_ignore_mapping_order() {
        let a = install_inputs("ts", "redis", &json!({"port": 6379, "auth": {"user": "app", "password": "pw"}, "tags": ["x", "y"]}));
        let names: Vec<&str> = a.keys().map(String::as_str).collect();
        assert_eq!(names, ["config.auth.password", "config.auth.user", "config.port", "config.tags", "service"]);
        assert!(a.values().all(|v| v.starts_with("sha256:") && !v.contains("pw")), "{a:?}");
        // The same config written in another key order: no change.
        let b = install_inputs("ts", "redis", &json!({"tags": ["x", "y"], "auth": {"password": "pw", "user": "app"}, "port": 6379}));
        assert_eq!(changed_inputs(&a, &b), Vec::<String>::new());
        // A list's order may mean something: a change.
        let c = install_inputs("ts", "redis", &json!({"port": 6380, "auth": {"user": "app", "password": "pw"}, "tags": ["y", "x"]}));
        assert_eq!(changed_inputs(&a, &c), ["config.port", "config.tags"]);
        assert_eq!(describe_changed(&changed_inputs(&a, &c)), "config.port and config.tags changed");
        // Added and removed keys count; another object's hashes differ (salted).
        let d = install_inputs("ts", "redis", &json!({"port": 6379, "auth": {"user": "app"}, "tags": ["x", "y"], "extra": 1}));
        assert_eq!(changed_inputs(&a, &d), ["config.auth.password", "config.extra"]);
        assert_ne!(install_inputs("other", "redis", &json!({"port": 6379}))["config.port"], a["config.port"]);
        let many: Vec<String> = ["config.a", "config.b", "config.c", "config.d", "config.e"].map(String::from).into();
        assert_eq!(describe_changed(&many), "config.a, config.b, config.c and 2 more changed");
        assert_eq!(describe_changed(&many[..3]), "config.a, config.b and config.c changed");
        assert_eq!(describe_changed(&many[..1]), "config.a changed");
    }

    #[test]
    fn unset_secret_fields_are_absent_or_null() {
        let fields = vec![
            SecretField { path: vec!["password".into()], format: SecretFormat::Password },
            SecretField { path: vec!["auth".into(), "token".into()], format: SecretFormat::Hex64 },
        ];
        let unset = unset_secret_fields(&fields, &json!({"password": null, "auth": {"token": "x"}}));
        assert_eq!(unset, fields[..1]);
        let mut config = json!({});
        set_path(&mut config, &["auth", "token"], json!("v")).expect("set");
        assert_eq!(config, json!({"auth": {"token": "v"}}));
    }
}
