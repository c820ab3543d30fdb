//! The one YAML decoder for outside input (issue 26, item 1): API bodies, `configFrom`
//! ConfigMaps and Secrets, manifests the CLI reads, catalogs and rendered templates.
//!
//! YAML aliases (`*name`) replay an anchored node (`&name`) wherever they appear, so a small
//! document can expand to billions of values ("billion laughs"). The underlying parser bounds
//! alias *jumps*, not the nodes they expand to. Every document is therefore first walked
//! without allocating, estimating the memory it expands to with the cost model of
//! [`bounded::cost`] — every node, every map's leaves, every byte of every string, so that one
//! long string or one small map referenced many times counts for each copy — and a document
//! that would take more than [`node_limit`] bytes for its size is refused before anything is
//! built (the rule of go-yaml, which the Kubernetes API server uses: aliases are allowed,
//! excessive aliasing is not). Ordinary documents take 5–30 bytes per input byte; the limit
//! is 8 MiB plus 64 per byte.
//!
//! [`bounded`] decodes API request bodies (JSON or YAML) into values with the same model and
//! a process-wide budget.
//!
//! A test in `yaml/tests/call_sites.rs` keeps product code from calling `serde_yaml_ng`'s
//! decoders directly.

use serde::de::{self, DeserializeOwned, DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use std::cell::Cell;
use std::fmt;

pub mod bounded;

use bounded::cost;

/// The most memory (estimated bytes, [`bounded::cost`]) a YAML text of `len` bytes may expand
/// to, all its documents together: [`bounded::decode_limit`].
pub fn node_limit(len: usize) -> usize {
    bounded::decode_limit(len)
}

/// Why YAML was refused.
#[derive(Debug)]
pub enum Error {
    /// The text is not valid YAML, or does not have the expected shape.
    Syntax(serde_yaml_ng::Error),
    /// Aliases expand the text to more nodes than its size allows.
    ExcessiveAliasing {
        /// Size of the text in bytes.
        len: usize,
        /// The node limit for that size.
        limit: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Syntax(e) => write!(f, "{e}"),
            Error::ExcessiveAliasing { len, limit } => write!(
                f,
                "document contains excessive aliasing: its aliases (*name) expand it to more than {} MiB of memory, \
                 the most a {len}-byte YAML text may expand to",
                limit / (1024 * 1024)
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Syntax(e) => Some(e),
            Error::ExcessiveAliasing { .. } => None,
        }
    }
}

impl Error {
    /// Whether the text was refused for expanding too far (not for its syntax).
    pub fn is_excessive_aliasing(&self) -> bool {
        matches!(self, Error::ExcessiveAliasing { .. })
    }
}

/// A failure in one document of a stream.
#[derive(Debug)]
pub struct DocumentError {
    /// 1-based index of the document in the stream.
    pub index: usize,
    /// What is wrong with it.
    pub error: Error,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}: {}", self.index, self.error)
    }
}

impl std::error::Error for DocumentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Decodes one YAML document, refusing excessive aliasing.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let budget = Budget::new(text.len());
    // A syntax error is reported by the decoding pass below, with the same message.
    if let Err(e) = budget.walk(serde_yaml_ng::Deserializer::from_str(text)) {
        budget.check()?;
        return Err(Error::Syntax(e));
    }
    serde_yaml_ng::from_str(text).map_err(Error::Syntax)
}

/// Decodes every document of a YAML stream (`---` separated), refusing excessive aliasing
/// across the whole stream. Empty documents decode as `T` from null.
pub fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, DocumentError> {
    let budget = Budget::new(text.len());
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        if let Err(e) = budget.walk(doc) {
            budget.check().map_err(|error| DocumentError { index: i + 1, error })?;
            return Err(DocumentError { index: i + 1, error: Error::Syntax(e) });
        }
    }
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        out.push(T::deserialize(doc).map_err(|e| DocumentError { index: i + 1, error: Error::Syntax(e) })?);
    }
    Ok(out)
}

/// Counts nodes as a walk visits them (aliases replay their anchor's nodes).
struct Budget {
    len: usize,
    limit: usize,
    used: Cell<usize>,
    exceeded: Cell<bool>,
}

impl Budget {
    fn new(len: usize) -> Self {
        Budget { len, limit: node_limit(len), used: Cell::new(0), exceeded: Cell::new(false) }
    }

    fn walk(&self, doc: serde_yaml_ng::Deserializer<'_>) -> Result<(), serde_yaml_ng::Error> {
        Count(self).deserialize(doc)
    }

    fn check(&self) -> Result<(), Error> {
        if self.exceeded.get() { Err(Error::ExcessiveAliasing { len: self.len, limit: self.limit }) } else { Ok(()) }
    }

    fn tick<E: de::Error>(&self) -> Result<(), E> {
        self.charge(cost::NODE)
    }

    fn charge<E: de::Error>(&self, units: usize) -> Result<(), E> {
        let used = self.used.get().saturating_add(units);
        self.used.set(used);
        if used > self.limit {
            self.exceeded.set(true);
            return Err(E::custom("document contains excessive aliasing"));
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
struct Count<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

macro_rules! leaf {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name<E: de::Error>(self, _: $ty) -> Result<(), E> { self.0.tick() })*
    };
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128, visit_u128: u128, visit_f64: f64);

    // A string costs its bytes too: an alias of a long string replays all of them.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.charge(cost::NODE + cost::bytes(v.len()))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
        self.0.charge(cost::NODE + cost::bytes(v.len()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.tick()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.0.tick()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.0.tick()?;
        self.deserialize(deserializer)
    }

    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.0.tick()?;
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.tick()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    // A map's entries cost their share of its B-tree leaves besides their key and value.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.tick()?;
        let mut entry = cost::FIRST_ENTRY;
        while map.next_key_seed(self)?.is_some() {
            self.0.charge(entry)?;
            entry = cost::ENTRY;
            map.next_value_seed(self)?;
        }
        Ok(())
    }

    // A tagged node (`!Tag value`): the tag, then its value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        self.0.tick()?;
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// One anchor of `width` items referenced `refs` times: `refs * width` nodes from a text of
    /// about `2 * width + 4 * refs` bytes.
    fn laughs(width: usize, refs: usize) -> String {
        let items = vec!["0"; width].join(",");
        let aliases = vec!["*a"; refs].join(",");
        format!("anchor: &a [{items}]\nrefs: [{aliases}]\n")
    }

    #[test]
    fn aliases_that_expand_far_beyond_the_input_are_refused_quickly() {
        // ~600 KB of text that expands to 2 * 10^10 nodes; refused after the first ~600k.
        let text = laughs(200_000, 100_000);
        let started = std::time::Instant::now();
        let err = from_str::<Value>(&text).expect_err("refused");
        assert!(err.is_excessive_aliasing(), "{err}");
        assert!(err.to_string().contains("excessive aliasing"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
        let err = documents::<Value>(&format!("a: 1\n---\n{text}")).expect_err("refused");
        assert_eq!(err.index, 2, "{err}");
        assert!(err.error.is_excessive_aliasing(), "{err}");
    }

    #[test]
    fn the_classic_nested_billion_laughs_is_refused() {
        let mut text = String::from("a0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n");
        for i in 1..10 {
            let prev = format!("*a{}", i - 1);
            text.push_str(&format!("a{i}: &a{i} [{}]\n", [prev.as_str(); 9].join(",")));
        }
        // Refused either by our memory estimate or, first, by the parser's own limit on alias
        // replays (it allows about 4x the events a document has plus 1,000).
        let err = from_str::<Value>(&text).expect_err("refused").to_string();
        assert!(err.contains("excessive aliasing") || err.contains("repetition limit"), "{err}");
    }

    #[test]
    fn modest_aliases_and_plain_documents_decode() {
        let text = "base: &b {cpu: 2, tags: [a, b]}\none: *b\ntwo: {<<: *b, cpu: 4}\n";
        let v: Value = from_str(text).expect("decodes");
        assert_eq!(v["one"], json!({"cpu": 2, "tags": ["a", "b"]}));
        let big = laughs(1_000, 10);
        from_str::<Value>(&big).expect("10k expanded nodes fit");
        let docs: Vec<Value> = documents("a: 1\n---\n---\nb: [1, 2]\n").expect("decodes");
        assert_eq!(docs.len(), 3);
        assert!(docs[1].is_null());
        from_str::<serde_yaml_ng::Value>("a: !tagged [1, 2]\n").expect("tags are walked");
    }

    #[test]
    fn one_long_string_aliased_many_times_is_refused() {
        // 1 MB of text that would expand to 2 GB of string copies (each alias is 4 bytes of
        // input but a million bytes of output): counted by bytes, refused at once.
        let text = format!("s: &s {}\nrefs: [{}]\n", "x".repeat(1_000_000), vec!["*s"; 2_000].join(","));
        let started = std::time::Instant::now();
        let err = from_str::<Value>(&text).expect_err("refused");
        assert!(err.is_excessive_aliasing(), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
        // A long string used once or twice is fine, and so are long strings without aliases,
        // block scalars and many short strings: an alias-free text never reaches the limit.
        let twice = format!("s: &s {}\nagain: *s\n", "x".repeat(1_000_000));
        from_str::<Value>(&twice).expect("two copies of one string fit");
        let plain = format!("a: {0}\nb: \"{0}\"\nc: |\n  {0}\n  {0}\nd: [{1}]\n", "y".repeat(500_000), vec!["\"q\""; 100_000].join(","));
        from_str::<Value>(&plain).expect("an alias-free document decodes whatever its strings");
    }

    #[test]
    fn syntax_errors_keep_the_parsers_message_and_document_index() {
        let err = documents::<Value>("a: 1\n---\nb: [\n").expect_err("invalid");
        assert_eq!(err.index, 2);
        assert!(!err.error.is_excessive_aliasing());
        assert!(from_str::<Value>("a: *missing").is_err());
    }
}
