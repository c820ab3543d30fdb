//! Round-trip property test for every kind at both served versions: objects generated at
//! random from each CRD's own schema (spec and status: optional fields present or not, enums,
//! patterns, bounds, maps, lists, free-form fields, odd strings) are created at one version,
//! read at the other, written back there unchanged (a no-op), and read at the first again:
//! field for field what was created. Both directions, every kind.
//!
//! The generator follows the schema; what the server still refuses (a CEL rule across fields,
//! a cross-object check) is counted, not tested, and at least half of each kind's cases must
//! be accepted so the property is tested on many shapes. The seed is printed; set
//! `ROUNDTRIP_SEED=<n>` to replay a run, `ROUNDTRIP_CASES=<n>` for more cases per kind and
//! direction (default 40).

mod common;

use std::collections::BTreeMap;

use common::*;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Map, Value, json};

/// xorshift64*: small, deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() { None } else { items.get(self.below(items.len())) }
    }
}

/// Strings tried against a field's pattern (each schema pattern matches at least one), and
/// free text for fields without one: quotes, newlines, unicode, JSON and YAML look-alikes.
const PATTERNED: &[&str] = &[
    "",
    "a",
    "web-1",
    "db",
    "x.y-z",
    "sub.domain.example",
    "10.0.0.5",
    "192.168.1.20",
    "20Gi",
    "1Ti",
    "100Gi",
    "/data",
    "/var/lib/x",
    "IPv4",
    "IPv6",
    "22",
    "8080",
    "80-90",
    "my-profile",
    "eu-north-1",
    "us-east-1",
    "app_user",
    "accept",
    "reject",
    "in",
    "out",
    "tcp",
    "udp",
    "12.5",
    "3",
    "EUR",
    "USD",
    "subnet-0123abcd",
    "abc123",
    "prod",
];
const FREE: &[&str] = &[
    "",
    "a",
    "plain text",
    "with \"quotes\" and 'single'",
    "line one\nline two",
    "unicode: ÅÄÖ ✓ 日本",
    "{\"json\": true}",
    "key: value",
    "  spaces  ",
    "tab\there",
    "emoji 🚀",
    "<html>&amp;",
    "very long ............................................................",
];

/// A value for `schema` (an OpenAPI v3 structural schema), or None when this field is
/// better left out (an optional string no candidate fits).
fn generate(schema: &Value, rng: &mut Rng, depth: usize) -> Option<Value> {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return rng.pick(options).cloned();
    }
    if schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        return Some(if rng.chance(50) { json!(rng.below(100)) } else { json!(format!("{}%", rng.below(100))) });
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => generate_object(schema, rng, depth),
        Some("array") => {
            let items = schema.get("items")?;
            let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema.get("maxItems").and_then(Value::as_u64).map_or(3, |m| (m as usize).min(3)).max(min);
            let n = if depth > 6 { min } else { min + rng.below(max - min + 1) };
            let keys: Vec<String> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default();
            let set = schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set");
            let mut out: Vec<Value> = vec![];
            for _ in 0..n {
                let Some(item) = generate(items, rng, depth + 1) else { continue };
                // Lists keyed by fields (or sets) hold each key once.
                let dup =
                    out.iter().any(|o| if keys.is_empty() { set && o == &item } else { keys.iter().all(|k| o.get(k) == item.get(k)) });
                if !dup {
                    out.push(item);
                }
            }
            Some(Value::Array(out))
        }
        Some("string") => generate_string(schema, rng),
        Some("integer") => {
            // Bounds may be written as floats (`minimum: 1.0`).
            let bound = |k: &str| schema.get(k).and_then(Value::as_f64).map(|f| f as i64);
            let min = bound("minimum").unwrap_or(0);
            // Small values unless the schema bounds them: counts, replicas and sizes are small.
            let max = bound("maximum").unwrap_or(min.saturating_add(8)).min(min.saturating_add(1000)).max(min);
            let span = (max - min).clamp(0, 1_000_000) as usize;
            Some(json!(min + rng.below(span + 1) as i64))
        }
        Some("number") => {
            let min = schema.get("minimum").and_then(Value::as_f64).unwrap_or(0.0);
            let max = schema.get("maximum").and_then(Value::as_f64).unwrap_or(min + 125.0).max(min);
            // Eighths: exact in binary, so what is read back is what was written.
            Some(json!((min + rng.below(1000) as f64 / 8.0).min(max)))
        }
        Some("boolean") => Some(json!(rng.chance(50))),
        _ if schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true) => Some(free_form(rng, depth)),
        _ => None,
    }
}

fn generate_object(schema: &Value, rng: &mut Rng, depth: usize) -> Option<Value> {
    let mut out = Map::new();
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let must = required.contains(&name.as_str());
            if !must && (depth > 5 || !rng.chance(55)) {
                continue;
            }
            match generate(property, rng, depth + 1) {
                Some(v) => {
                    out.insert(name.clone(), v);
                }
                None if must => return None,
                None => {}
            }
        }
    } else if let Some(values) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        let max = schema.get("maxProperties").and_then(Value::as_u64).map_or(3, |m| (m as usize).min(3));
        for i in 0..rng.below(max + 1) {
            if let Some(v) = generate(values, rng, depth + 1) {
                out.insert(format!("key-{i}.example/{}", rng.below(100)), v);
            }
        }
    } else if schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true) {
        return Some(free_form(rng, depth));
    }
    Some(Value::Object(out))
}

fn generate_string(schema: &Value, rng: &mut Rng) -> Option<Value> {
    if schema.get("format").and_then(Value::as_str) == Some("date-time") {
        return Some(json!(format!("2026-11-{:02}T{:02}:{:02}:00Z", 1 + rng.below(28), rng.below(24), rng.below(60))));
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = schema.get("maxLength").and_then(Value::as_u64).map_or(usize::MAX, |m| m as usize);
    let fits = |s: &&str| (min..=max).contains(&s.chars().count());
    let candidates: Vec<&str> = match schema.get("pattern").and_then(Value::as_str) {
        Some(p) => {
            let re = regex::Regex::new(p).ok()?;
            PATTERNED.iter().copied().filter(|s| re.is_match(s)).filter(fits).collect()
        }
        None => FREE.iter().chain(PATTERNED).copied().filter(fits).collect(),
    };
    rng.pick(&candidates).map(|s| json!(s))
}

/// Anything JSON: what a free-form field (`config`, `values`) may hold.
fn free_form(rng: &mut Rng, depth: usize) -> Value {
    let mut out = Map::new();
    for i in 0..rng.below(4) {
        let v = match rng.below(if depth > 4 { 4 } else { 6 }) {
            0 => json!(rng.pick(FREE).copied().unwrap_or_default()),
            1 => json!(rng.below(1 << 20)),
            2 => json!(rng.chance(50)),
            3 => Value::Null,
            4 => json!([rng.below(10), "two", {"three": 3}]),
            _ => free_form(rng, depth + 1),
        };
        out.insert(format!("field{i}"), v);
    }
    Value::Object(out)
}

/// A refusal's reason without the object's name (so equal reasons are counted together).
fn why(message: &str) -> String {
    let reason = message.split_once(" is invalid: ").map_or(message, |(_, r)| r);
    reason.chars().take(100).collect()
}

/// The schema's generator knows each field alone; these CEL rules relate fields, so the
/// generated spec is adjusted to them (what is left is refused and counted, not tested).
fn fix_cross_field_rules(kind: &str, spec: &mut Value) {
    let disks_ok = |disks: Option<&mut Value>| {
        for d in disks.and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(o) = d.as_object_mut() {
                o.insert("mountPath".into(), json!("/data"));
            }
        }
    };
    match kind {
        "Cluster" => {
            if let Some(e) = spec.get_mut("controlPlaneEndpoint").and_then(Value::as_object_mut) {
                if e.get("type").and_then(Value::as_str) == Some("VIP") {
                    e.insert("address".into(), json!("10.0.0.5"));
                } else {
                    e.remove("address");
                }
            }
            let mut names = vec![];
            for p in spec.get_mut("pools").and_then(Value::as_array_mut).into_iter().flatten() {
                names.push(p.get("name").cloned().unwrap_or(Value::Null));
                if p.get("zones").and_then(Value::as_array).is_some_and(|z| !z.is_empty()) {
                    p.as_object_mut().map(|o| o.remove("zone"));
                }
                disks_ok(p.get_mut("disks"));
            }
            for t in spec.get_mut("taskservs").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(pools) = t.get_mut("pools").and_then(Value::as_array_mut) {
                    pools.retain(|n| names.contains(n));
                }
            }
        }
        "Server" => disks_ok(spec.get_mut("disks")),
        "TaskServ" => {
            let service = spec.get("service").cloned();
            if let Some(d) = spec.get_mut("dependsOn").and_then(Value::as_array_mut) {
                d.retain(|x| Some(x) != service.as_ref());
            }
        }
        "Workspace" => {
            let mut names = vec![];
            for p in spec.get_mut("providers").and_then(Value::as_array_mut).into_iter().flatten() {
                if p.get("type").and_then(Value::as_str) != Some("aws") {
                    p.as_object_mut().map(|o| o.remove("zoneSubnets"));
                }
                names.push(p.get("name").cloned());
            }
            if let Some(d) = spec.get_mut("defaults").and_then(Value::as_object_mut)
                && d.get("provider").is_some_and(|p| p != "local" && !names.contains(&Some(p.clone())))
            {
                d.remove("provider");
            }
        }
        _ => {}
    }
}

fn resource(version: &str, kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase());
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("provisioning.dev", version, kind), &plural)
}

fn api(client: &kube::Client, version: &str, kind: &str, namespaced: bool) -> Api<DynamicObject> {
    if namespaced {
        Api::namespaced_with(client.clone(), "roundtrip", &resource(version, kind))
    } else {
        Api::all_with(client.clone(), &resource(version, kind))
    }
}

fn but_version(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("apiVersion");
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_objects_of_every_kind_round_trip_between_versions() -> TestResult {
    let seed = std::env::var("ROUNDTRIP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1);
    let cases: usize = std::env::var("ROUNDTRIP_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    eprintln!("round-trip property test: ROUNDTRIP_SEED={seed} ROUNDTRIP_CASES={cases}");
    let mut rng = Rng(seed);

    let ts = start().await?;
    let client = client_for(&ts.server.kubeconfig_path()).await?;
    let crds_api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crds = provisioning_crds::all_crds();
    for crd in &crds {
        crds_api.create(&PostParams::default(), crd).await?;
    }
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns_api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "roundtrip"}}))?).await?;

    let pp = PostParams::default();
    let mut tally: BTreeMap<String, (usize, usize, BTreeMap<String, usize>)> = BTreeMap::new();
    for crd in &crds {
        let kind = crd.spec.names.kind.clone();
        if !provisioning_crds::BETA_KINDS.contains(&kind.as_str()) {
            continue;
        }
        let namespaced = crd.spec.scope == "Namespaced";
        let schema = serde_json::to_value(
            crd.spec.versions.iter().find(|v| v.storage).and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.as_ref()),
        )?;
        let (spec_schema, status_schema) = (&schema["properties"]["spec"], &schema["properties"]["status"]);
        for (first, second) in [("v1alpha1", "v1beta1"), ("v1beta1", "v1alpha1")] {
            let (at_first, at_second) = (api(&client, first, &kind, namespaced), api(&client, second, &kind, namespaced));
            for case in 0..cases {
                let entry = tally.entry(kind.clone()).or_default();
                entry.0 += 1;
                let name = format!("{}-{first}-{case}", kind.to_lowercase());
                let mut spec = generate(spec_schema, &mut rng, 1).unwrap_or_else(|| json!({}));
                fix_cross_field_rules(&kind, &mut spec);
                if kind == "Workspace" {
                    // Each Workspace claims its own namespace.
                    spec["namespace"] = json!(format!("ns-{name}"));
                }
                let obj =
                    json!({"apiVersion": format!("provisioning.dev/{first}"), "kind": kind, "metadata": {"name": name}, "spec": spec});
                let created = match at_first.create(&pp, &serde_json::from_value(obj)?).await {
                    Ok(o) => o,
                    Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => {
                        *entry.2.entry(why(&s.message)).or_default() += 1;
                        continue;
                    }
                    Err(e) => return Err(format!("{kind} {name} at {first}: {e}").into()),
                };
                let mut with_status = serde_json::to_value(created)?;
                if let Some(mut status) = generate(status_schema, &mut rng, 1) {
                    fix_cross_field_rules(&kind, &mut status);
                    with_status["status"] = status;
                    if let Err(e) = at_first.replace_status(&name, &pp, &serde_json::from_value::<DynamicObject>(with_status)?).await {
                        match e {
                            kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
                                *entry.2.entry(format!("status: {}", why(&s.message))).or_default() += 1;
                            }
                            e => return Err(format!("{kind} {name} status at {first}: {e}").into()),
                        }
                    }
                }
                let original = serde_json::to_value(at_first.get(&name).await?)?;
                let converted = serde_json::to_value(at_second.get(&name).await?)?;
                assert_eq!(converted["apiVersion"], format!("provisioning.dev/{second}"), "seed {seed}");
                assert_eq!(but_version(&converted), but_version(&original), "{kind} {name}: {first} → {second} (ROUNDTRIP_SEED={seed})");
                let written = serde_json::to_value(at_second.replace(&name, &pp, &serde_json::from_value(converted.clone())?).await?)?;
                assert_eq!(
                    written["metadata"]["resourceVersion"], original["metadata"]["resourceVersion"],
                    "{kind} {name}: an unchanged write at {second} is a no-op (ROUNDTRIP_SEED={seed})"
                );
                // Status written at the second version comes back at the first unchanged too.
                if converted.get("status").is_some() {
                    at_second.replace_status(&name, &pp, &serde_json::from_value(converted)?).await?;
                }
                let back = serde_json::to_value(at_first.get(&name).await?)?;
                assert_eq!(back, original, "{kind} {name}: {first} → {second} → {first} lost something (ROUNDTRIP_SEED={seed})");
                entry.1 += 1;
            }
        }
    }
    for (kind, (tried, passed, refused)) in &tally {
        eprintln!("{kind}: {passed}/{tried} generated objects accepted and round-tripped; refused: {refused:?}");
        assert!(
            passed * 2 >= *tried,
            "{kind}: only {passed} of {tried} generated objects were accepted (ROUNDTRIP_SEED={seed}): {refused:?}"
        );
    }
    let mut kinds: Vec<&str> = tally.keys().map(String::as_str).collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["Cluster", "Server", "TaskServ", "Workspace"]);
    ts.server.shutdown().await;
    Ok(())
}
