//! Decoding outside input into a [`serde_json::Value`] within a memory budget (issue 26).
//!
//! A decoded value can be far larger than its text: every node is a 32-byte `Value` in a
//! growing vector, every non-empty map allocates a B-tree leaf of about 630 bytes, and YAML
//! aliases replay nodes. So the API server decodes request bodies with [`json_value`] and
//! [`yaml_value`], which build the value themselves and charge an estimate of each allocation
//! (the [`cost`] model) as they go:
//!
//! - one decode may use at most [`decode_limit`] of its input's size (8 MiB plus 64 bytes per
//!   input byte; an ordinary Kubernetes object uses 5–30 per byte): beyond it the body is
//!   refused ([`DecodeError::TooLarge`], 413), whatever made it large — aliases or a text of
//!   nothing but tiny maps;
//! - all decodes of a process together use at most a [`DecodeBudget`]: a request's first
//!   [`FREE_PER_REQUEST`] bytes are its own (small requests never wait on big ones), beyond
//!   that it reserves from the shared budget, holds what it reserved until its [`Meter`] is
//!   dropped (the end of the request: the decoded value lives that long) and is refused when
//!   the budget is spent ([`DecodeError::Busy`], 429 with Retry-After).
//!
//! The typed decoders of the crate root ([`crate::from_str`], [`crate::documents`]) walk
//! YAML with the same cost model before building anything.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The cost model: estimated bytes of memory of each part of a decoded value.
pub mod cost {
    /// Every node: its `Value` slot plus the slack of the vector it grows in.
    pub const NODE: usize = 2 * std::mem::size_of::<serde_json::Value>();
    /// The first entry of a map: the B-tree leaf it allocates (11 keys and values).
    pub const FIRST_ENTRY: usize = 11 * (std::mem::size_of::<String>() + std::mem::size_of::<serde_json::Value>()) + 16;
    /// Every further entry of a map: its share of leaves that split half full.
    pub const ENTRY: usize = 2 * (std::mem::size_of::<String>() + std::mem::size_of::<serde_json::Value>());

    /// A string or map key of `len` bytes (its heap bytes; the node is charged apart).
    pub const fn bytes(len: usize) -> usize {
        len
    }
}

/// Bytes of decoded memory any text may use regardless of its size.
pub const BASE_LIMIT: usize = 8 * 1024 * 1024;

/// Bytes of decoded memory a text may use per byte of input, beyond [`BASE_LIMIT`].
pub const LIMIT_PER_BYTE: usize = 64;

/// The most memory (estimated by [`cost`]) a text of `len` bytes may decode to.
pub fn decode_limit(len: usize) -> usize {
    BASE_LIMIT.saturating_add(len.saturating_mul(LIMIT_PER_BYTE))
}

/// Bytes each request may decode without reserving from the shared [`DecodeBudget`].
pub const FREE_PER_REQUEST: usize = 256 * 1024;

/// Reservations from the shared budget are taken in steps of this many bytes.
const STEP: usize = 1024 * 1024;

/// Memory for decoding shared by every request of a process, with a fair share per flow
/// (the API server's flows: one per user, one per namespace's ServiceAccounts).
#[derive(Debug)]
pub struct DecodeBudget {
    total: usize,
    used: AtomicUsize,
    /// Bytes each flow holds now (flows holding nothing are removed).
    flows: Mutex<HashMap<String, usize>>,
}

impl DecodeBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Arc<DecodeBudget> {
        Arc::new(DecodeBudget { total, used: AtomicUsize::new(0), flows: Mutex::default() })
    }

    /// The budget's size in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes reserved by requests now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Bytes the requests of `flow` hold now.
    pub fn held_by(&self, flow: &str) -> usize {
        self.flows.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(flow).copied().unwrap_or_default()
    }

    /// Takes `n` bytes for `flow`. A flow holding nothing may take what is free (one body of
    /// any admissible size gets through), but a flow already holding some never takes the
    /// budget past half for itself: one identity sending many large bodies at once cannot
    /// spend the budget every other identity needs.
    pub fn reserve(&self, n: usize, flow: Option<&str>) -> bool {
        let mut flows = self.flows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = flow {
            let held = flows.get(f).copied().unwrap_or_default();
            if held > 0 && held.saturating_add(n) > self.total / 2 {
                return false;
            }
        }
        if self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(n).filter(|u| *u <= self.total)).is_err() {
            return false;
        }
        if let Some(f) = flow {
            *flows.entry(f.to_string()).or_default() += n;
        }
        true
    }

    /// Gives back `n` bytes [`DecodeBudget::reserve`]d for `flow`.
    pub fn release(&self, n: usize, flow: Option<&str>) {
        if let Some(f) = flow {
            let mut flows = self.flows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(held) = flows.get_mut(f) {
                *held = held.saturating_sub(n);
                if *held == 0 {
                    flows.remove(f);
                }
            }
        }
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// What one request has decoded so far, and what it holds of the shared budget (given back
/// when dropped).
#[derive(Debug, Default)]
pub struct Meter {
    budget: Option<Arc<DecodeBudget>>,
    flow: Option<String>,
    charged: AtomicUsize,
    reserved: AtomicUsize,
}

impl Meter {
    /// A meter with no shared budget (the CLI, tests): only the per-decode limit applies.
    pub fn unshared() -> Meter {
        Meter::default()
    }

    /// A meter reserving beyond [`FREE_PER_REQUEST`] from `budget`.
    pub fn new(budget: Arc<DecodeBudget>) -> Meter {
        Meter { budget: Some(budget), flow: None, charged: AtomicUsize::new(0), reserved: AtomicUsize::new(0) }
    }

    /// A meter reserving from `budget` within the fair share of `flow`.
    pub fn for_flow(budget: Arc<DecodeBudget>, flow: String) -> Meter {
        Meter { budget: Some(budget), flow: Some(flow), charged: AtomicUsize::new(0), reserved: AtomicUsize::new(0) }
    }

    /// Bytes charged so far (estimated by [`cost`]).
    pub fn charged(&self) -> usize {
        self.charged.load(Ordering::Acquire)
    }

    /// Charges `n` bytes up front, for a decoder that cannot charge as it builds (protobuf:
    /// its values are bounded by a constant times its input): 429-style [`DecodeError::Busy`]
    /// when the shared budget cannot cover them.
    pub fn reserve(&self, n: usize) -> Result<(), DecodeError> {
        self.charge(n).map_err(|Busy(total)| DecodeError::Busy { total })
    }

    fn charge(&self, n: usize) -> Result<(), Busy> {
        let charged = self.charged.fetch_add(n, Ordering::AcqRel).saturating_add(n);
        self.cover(charged)
    }

    /// Reserves ahead what a decode of `len` bytes will likely use (its per-byte share of
    /// [`decode_limit`]), so that a large body is admitted or refused as a whole before it is
    /// decoded: many large decodes growing together would otherwise share out the budget
    /// until every one of them is refused. Bodies up to [`RESERVE_AHEAD_ABOVE`] charge as they
    /// are built instead (most never leave their free part).
    fn reserve_ahead(&self, len: usize) -> Result<(), Busy> {
        if len <= RESERVE_AHEAD_ABOVE {
            return Ok(());
        }
        self.cover(self.charged().saturating_add(len.saturating_mul(LIMIT_PER_BYTE)))
    }

    /// Holds enough of the shared budget for `total` bytes charged.
    fn cover(&self, total: usize) -> Result<(), Busy> {
        let Some(budget) = &self.budget else { return Ok(()) };
        let need = total.saturating_sub(FREE_PER_REQUEST);
        let mut reserved = self.reserved.load(Ordering::Acquire);
        while reserved < need {
            let step = (need - reserved).max(STEP);
            if !budget.reserve(step, self.flow.as_deref()) {
                return Err(Busy(budget.total));
            }
            reserved = self.reserved.fetch_add(step, Ordering::AcqRel) + step;
        }
        Ok(())
    }
}

/// Bodies larger than this reserve their share of the budget before they are decoded.
pub const RESERVE_AHEAD_ABOVE: usize = 256 * 1024;

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release(*self.reserved.get_mut(), self.flow.as_deref());
        }
    }
}

/// Why a body was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not valid JSON or YAML (the parser's message).
    Syntax(String),
    /// It decodes to more memory than its size allows (aliases, or nothing but tiny maps).
    TooLarge {
        /// Size of the text in bytes.
        len: usize,
        /// The most its decoded value may use.
        limit: usize,
    },
    /// The process is decoding as much as its budget allows; try again shortly.
    Busy {
        /// The process-wide budget in bytes.
        total: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Syntax(e) => f.write_str(e),
            DecodeError::TooLarge { len, limit } => write!(
                f,
                "the {len}-byte body decodes to more than {} MiB of memory, the most a body of its size may \
                 (aliases that expand it, or a body of nothing but tiny maps or lists)",
                limit / (1024 * 1024)
            ),
            DecodeError::Busy { total } => write!(
                f,
                "the server is decoding as many large request bodies as its {} MiB budget allows; try again shortly",
                total / (1024 * 1024)
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The shared budget (of this many bytes) cannot cover a reservation now.
#[derive(Debug, Clone, Copy)]
struct Busy(usize);

#[derive(Debug, Clone, Copy)]
enum Fail {
    TooLarge,
    Busy(usize),
}

/// One decode: its own limit and the request's meter.
struct Cost<'m> {
    meter: &'m Meter,
    used: Cell<usize>,
    limit: usize,
    failed: Cell<Option<Fail>>,
}

impl<'m> Cost<'m> {
    fn new(meter: &'m Meter, len: usize) -> Result<Self, DecodeError> {
        meter.reserve_ahead(len).map_err(|Busy(total)| DecodeError::Busy { total })?;
        Ok(Cost { meter, used: Cell::new(0), limit: decode_limit(len), failed: Cell::new(None) })
    }

    fn charge<E: de::Error>(&self, n: usize) -> Result<(), E> {
        let used = self.used.get().saturating_add(n);
        self.used.set(used);
        let fail = if used > self.limit { Some(Fail::TooLarge) } else { self.meter.charge(n).err().map(|Busy(total)| Fail::Busy(total)) };
        match fail {
            Some(f) => {
                self.failed.set(Some(f));
                Err(E::custom("the body decodes to more memory than allowed"))
            }
            None => Ok(()),
        }
    }

    fn error(&self, len: usize, syntax: impl fmt::Display) -> DecodeError {
        match self.failed.get() {
            Some(Fail::TooLarge) => DecodeError::TooLarge { len, limit: self.limit },
            Some(Fail::Busy(total)) => DecodeError::Busy { total },
            None => DecodeError::Syntax(syntax.to_string()),
        }
    }
}

/// Decodes a JSON text into a value within `meter`'s budget and [`decode_limit`].
pub fn json_value(bytes: &[u8], meter: &Meter) -> Result<Value, DecodeError> {
    let cost = Cost::new(meter, bytes.len())?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Build(&cost).deserialize(&mut de).map_err(|e| cost.error(bytes.len(), e))?;
    de.end().map_err(|e| cost.error(bytes.len(), e))?;
    Ok(value)
}

/// Decodes one YAML document into a value within `meter`'s budget and [`decode_limit`]
/// (aliases are charged for every copy they expand to).
pub fn yaml_value(text: &str, meter: &Meter) -> Result<Value, DecodeError> {
    let cost = Cost::new(meter, text.len())?;
    Build(&cost).deserialize(serde_yaml_ng::Deserializer::from_str(text)).map_err(|e| cost.error(text.len(), e))
}

#[derive(Clone, Copy)]
struct Build<'a, 'm>(&'a Cost<'m>);

impl<'de> DeserializeSeed<'de> for Build<'_, '_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Build<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.charge(cost::NODE)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.charge(cost::NODE)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.charge(cost::NODE)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.charge(cost::NODE)?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.charge(cost::NODE + cost::bytes(v.len()))?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.0.charge(cost::NODE + cost::bytes(v.len()))?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.0.charge(cost::NODE)?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.charge(cost::NODE)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.charge(cost::NODE)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Key(self.0))? {
            self.0.charge(if out.is_empty() { cost::FIRST_ENTRY } else { cost::ENTRY })?;
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A map key: a string (YAML's plain scalars such as `1` or `true` are read as their text,
/// as `serde_json::Value` reads them).
struct Key<'a, 'm>(&'a Cost<'m>);

impl<'de> DeserializeSeed<'de> for Key<'_, '_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Key<'_, '_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.charge(cost::bytes(v.len()))?;
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        self.0.charge(cost::bytes(v.len()))?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meter() -> Meter {
        Meter::unshared()
    }

    #[test]
    fn decodes_as_serde_json_does() -> Result<(), DecodeError> {
        for text in
            [r#"{"a":[1,-2,3.5,true,null,"x"],"b":{"c":{}},"d":[]}"#, r#""just a string""#, "18446744073709551615", r#"{"dup":1,"dup":2}"#]
        {
            let ours = json_value(text.as_bytes(), &meter())?;
            let theirs: Value = serde_json::from_str(text).map_err(|e| DecodeError::Syntax(e.to_string()))?;
            assert_eq!(ours, theirs, "{text}");
        }
        assert!(matches!(json_value(b"{\"a\":1} x", &meter()), Err(DecodeError::Syntax(_))));
        assert!(matches!(json_value(b"{\"a\":", &meter()), Err(DecodeError::Syntax(_))));
        let y = yaml_value("a: [1, b, true, ~]\n1: one\nnested: {x: {y: z}}\n", &meter())?;
        assert_eq!(y, json!({"a": [1, "b", true, null], "1": "one", "nested": {"x": {"y": "z"}}}));
        Ok(())
    }

    /// The reviewer's bypass of the old node count: one anchor of 1,000 one-entry maps
    /// referenced thousands of times (a 3 MiB body would expand to about 2 GB).
    #[test]
    fn aliases_of_small_maps_are_refused_within_the_limit() {
        let items = vec![r#"{"":~}"#; 1000].join(",");
        let refs = vec!["*a"; 3140].join(",");
        let text = format!("a: &a [{items}]\nb: [{refs}]\n");
        let m = meter();
        let err = yaml_value(&text, &m).expect_err("refused");
        assert!(matches!(err, DecodeError::TooLarge { .. }), "{err}");
        assert!(m.charged() <= decode_limit(text.len()) + cost::FIRST_ENTRY + cost::NODE, "{}", m.charged());
        assert!(err.to_string().contains("decodes to more than"), "{err}");
    }

    #[test]
    fn a_body_of_nothing_but_tiny_maps_is_refused_not_decoded() {
        // 3 MiB of `[{"":0},...]`: ~450k maps of one entry, ~300 MB as values.
        let body = format!("[{}{{\"\":0}}]", r#"{"":0},"#.repeat(3 * 1024 * 1024 / 7));
        assert!(matches!(json_value(body.as_bytes(), &meter()), Err(DecodeError::TooLarge { .. })));
    }

    #[test]
    fn ordinary_objects_decode_far_below_the_limit() -> Result<(), DecodeError> {
        // A CRD-like schema of many small maps, and a ConfigMap of long strings.
        let prop = r#""f":{"type":"string","description":"a field of the object, as the schema says"}"#;
        let schema = format!(r#"{{"spec":{{"versions":[{{"schema":{{"properties":{{{}}}}}}}]}}}}"#, vec![prop; 20_000].join(","));
        let m = meter();
        json_value(schema.as_bytes(), &m)?;
        assert!(m.charged() < schema.len() * 30, "{} bytes for {}", m.charged(), schema.len());
        let cm = format!(r#"{{"data":{{"a":"{}"}}}}"#, "x".repeat(2_000_000));
        let m = meter();
        json_value(cm.as_bytes(), &m)?;
        assert!(m.charged() < cm.len() * 2);
        Ok(())
    }

    #[test]
    fn the_shared_budget_refuses_beyond_its_total_and_is_given_back() -> Result<(), DecodeError> {
        let budget = DecodeBudget::new(64 * 1024 * 1024);
        // ~500 KB: ~32 MB reserved ahead (64 per byte), ~16 MB charged; two fit in 64 MiB.
        let list = format!("[{}0]", "0,".repeat(250_000));
        let first = Meter::new(budget.clone());
        json_value(list.as_bytes(), &first)?;
        let held = budget.in_use();
        assert!(held >= first.charged() - FREE_PER_REQUEST, "{held}");
        let second = Meter::new(budget.clone());
        json_value(list.as_bytes(), &second)?;
        let third = Meter::new(budget.clone());
        let err = json_value(list.as_bytes(), &third).expect_err("budget spent");
        assert!(matches!(err, DecodeError::Busy { .. }), "{err}");
        // Small bodies never wait on the budget.
        json_value(br#"{"kind":"ConfigMap","data":{"a":"b"}}"#, &Meter::new(budget.clone()))?;
        // An up-front reservation (protobuf) draws on the same budget.
        assert!(matches!(Meter::new(budget.clone()).reserve(64 * 1024 * 1024), Err(DecodeError::Busy { .. })));
        drop((first, second, third));
        assert_eq!(budget.in_use(), 0);
        json_value(list.as_bytes(), &Meter::new(budget.clone()))?;
        assert_eq!(budget.in_use(), 0);
        Ok(())
    }
    #[test]
    fn one_flow_never_holds_more_than_half_while_another_can_start() -> Result<(), DecodeError> {
        let budget = DecodeBudget::new(64 * 1024 * 1024);
        // ~500 KB bodies reserve ~32 MB ahead each.
        let list = format!("[{}0]", "0,".repeat(250_000));
        let a1 = Meter::for_flow(budget.clone(), "user:a".into());
        json_value(list.as_bytes(), &a1)?;
        // A second large body of the same flow would take it past half: refused.
        let a2 = Meter::for_flow(budget.clone(), "user:a".into());
        let err = json_value(list.as_bytes(), &a2).expect_err("flow a holds half");
        assert!(matches!(err, DecodeError::Busy { .. }), "{err}");
        assert_eq!(budget.held_by("user:a"), a1.reserved.load(Ordering::Acquire));
        // Another flow's body still gets in.
        let b1 = Meter::for_flow(budget.clone(), "serviceaccounts:b".into());
        json_value(list.as_bytes(), &b1)?;
        // Bodies up to RESERVE_AHEAD_ABOVE reserve nothing ahead (64 per byte would be 12 MiB
        // here, past the flow's half): a 200 KB ConfigMap charges as it is built and fits in
        // its free part.
        let small = format!(r#"{{"data":{{"a":"{}"}}}}"#, "x".repeat(200_000));
        let a3 = Meter::for_flow(budget.clone(), "user:a".into());
        json_value(small.as_bytes(), &a3)?;
        drop((a1, a2, a3, b1));
        assert_eq!((budget.in_use(), budget.held_by("user:a"), budget.held_by("serviceaccounts:b")), (0, 0, 0));
        Ok(())
    }
}
