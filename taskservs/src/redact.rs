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

/// Replaces known secret values in text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Patterns, longest first (a secret containing another is replaced whole).
    patterns: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    // The patterns are the secrets: a Debug print shows how many, never which.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("patterns", &self.patterns.len()).finish()
    }
}

impl Redactor {
    /// A redactor for `secrets`. Besides each value it covers the value's JSON-escaped form
    /// (a script echoing its context) and each line of a multi-line value (output is
    /// handled line by line).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut patterns: Vec<String> = Vec::new();
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
                if form.chars().count() >= MIN_SECRET_LEN && !patterns.contains(&form) {
                    patterns.push(form);
                }
            }
        }
        patterns.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        Redactor { patterns }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// `text` with every known secret replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for pattern in &self.patterns {
            if out.contains(pattern.as_str()) {
                out = out.replace(pattern.as_str(), REDACTED);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_values_escaped_forms_and_lines_of_multi_line_secrets() {
        let hostile = "p'a\"s$(id)`x`\\y\nsecond-line";
        let r = Redactor::new([hostile, "hunter2", "ab"]);
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
        let r = Redactor::new(["secret", "secret-and-more"]);
        assert_eq!(r.redact("secret-and-more / secret"), "[redacted] / [redacted]");
    }
}
