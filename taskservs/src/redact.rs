//! Redaction of known secret values from script output before it is logged or stored.
//!
//! The controller knows every secret a script is given (values of secret config fields,
//! values read from Secrets through `configFrom`, generated secrets); a script, a package
//! manager or a server may still echo one. Every line of output goes through a [`Redactor`]
//! before it reaches a log line, a status field or an event.

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Shortest secret (or line of a multi-line secret) that is redacted: shorter ones would
/// blank out ordinary text; the catalog's generated secrets are far longer.
pub const MIN_SECRET_LEN: usize = 3;

/// Most patterns one redactor holds (values, their JSON forms and lines): a config whose
/// secrets make more is refused (a tenant's Secret of many short lines would otherwise cost
/// every run's output a pass per pattern).
pub const MAX_PATTERNS: usize = 4096;
/// Most bytes of patterns one redactor holds.
pub const MAX_PATTERN_BYTES: usize = 1 << 20;

/// Replaces known secret values in text.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Patterns, longest first (a secret containing another is replaced whole). Shared: a
    /// redactor is cloned into every run.
    patterns: std::sync::Arc<Vec<String>>,
    /// One automaton over every pattern (leftmost-longest): text is redacted in one pass,
    /// whatever the number of patterns.
    automaton: Option<std::sync::Arc<aho_corasick::AhoCorasick>>,
}

impl PartialEq for Redactor {
    fn eq(&self, other: &Self) -> bool {
        self.patterns == other.patterns
    }
}

impl Eq for Redactor {}

impl std::fmt::Debug for Redactor {
    // The patterns are the secrets: a Debug print shows how many, never which.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("patterns", &self.patterns.len()).finish()
    }
}

impl Redactor {
    /// A redactor for `secrets`. Besides each value it covers the value's JSON-escaped form
    /// (a script echoing its context) and each line of a multi-line value (output is
    /// handled line by line). Err (naming the counts, never a value) when they make more than
    /// [`MAX_PATTERNS`] patterns or [`MAX_PATTERN_BYTES`] bytes.
    pub fn try_new<I, S>(secrets: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut bytes = 0usize;
        for secret in secrets {
            let secret = secret.as_ref();
            let mut forms = vec![secret.to_string()];
            if let Ok(json) = serde_json::to_string(secret) {
                forms.push(json.trim_matches('"').to_string());
            }
            if secret.contains(['\n', '\r']) {
                forms.extend(secret.split(['\n', '\r']).map(str::to_string));
            }
            for form in forms {
                if form.chars().count() < MIN_SECRET_LEN || seen.contains(&form) {
                    continue;
                }
                bytes += form.len();
                seen.insert(form);
                if seen.len() > MAX_PATTERNS || bytes > MAX_PATTERN_BYTES {
                    return Err(format!(
                        "the secret values of the config make more than {MAX_PATTERNS} distinct values and lines to redact or more than {MAX_PATTERN_BYTES} bytes of them; use fewer, longer secrets"
                    ));
                }
            }
        }
        let mut patterns: Vec<String> = seen.into_iter().collect();
        patterns.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        let automaton = if patterns.is_empty() {
            None
        } else {
            let built = aho_corasick::AhoCorasick::builder()
                .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                .build(&patterns)
                .map_err(|e| format!("the secret values of the config cannot be matched: {e}"))?;
            Some(std::sync::Arc::new(built))
        };
        Ok(Redactor { patterns: std::sync::Arc::new(patterns), automaton })
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// `text` with every known secret replaced by [`REDACTED`] (one pass; where two secrets
    /// start at the same place the longer one is replaced).
    pub fn redact(&self, text: &str) -> String {
        match &self.automaton {
            None => text.to_string(),
            Some(a) => {
                let mut out = String::with_capacity(text.len());
                a.replace_all_with(text, &mut out, |_, _, dst| {
                    dst.push_str(REDACTED);
                    true
                });
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_values_escaped_forms_and_lines_of_multi_line_secrets() {
        let hostile = "p'a\"s$(id)`x`\\y\nsecond-line";
        let r = Redactor::try_new([hostile, "hunter2", "ab"]).unwrap_or_default();
        assert_eq!(r.redact("password is hunter2."), "password is [redacted].");
        // JSON-escaped (a context echoed back) and line by line.
        let json = serde_json::to_string(hostile).unwrap_or_default();
        assert!(!r.redact(&json).contains("second-line"), "{}", r.redact(&json));
        assert!(!r.redact(&json).contains("$(id)"));
        assert_eq!(r.redact("p'a\"s$(id)`x`\\y"), REDACTED);
        assert_eq!(r.redact("x second-line y"), "x [redacted] y");
        // Too short to redact without destroying ordinary text.
        assert_eq!(r.redact("abc"), "abc");
        assert!(Redactor::default().is_empty());
        assert_eq!(Redactor::default().redact("same"), "same");
    }

    #[test]
    fn a_secret_containing_another_is_replaced_whole() {
        let r = Redactor::try_new(["secret", "secret-and-more"]).unwrap_or_default();
        assert_eq!(r.redact("secret-and-more / secret"), "[redacted] / [redacted]");
    }

    #[test]
    fn many_short_secret_lines_are_refused_in_linear_time() {
        // 300,000 distinct 3-character lines (a 1.2 MB Secret): refused, naming counts only.
        let lines: Vec<String> = (0..300_000u32).map(|i| format!("{:03x}", i % 4096) + &format!("{i}")).collect();
        let secret = lines.join("\n");
        let started = std::time::Instant::now();
        let refused = Redactor::try_new([secret.as_str()]);
        assert!(matches!(&refused, Err(e) if e.contains("more than 4096")), "{:?}", refused.as_ref().map(|_| ()));
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
        // Many patterns redact in one pass.
        let ok: Vec<String> = (0..4000).map(|i| format!("secret-{i:05}")).collect();
        let r = Redactor::try_new(&ok).unwrap_or_default();
        assert_eq!(r.redact("a secret-00042 b secret-03999"), "a [redacted] b [redacted]");
    }
}
