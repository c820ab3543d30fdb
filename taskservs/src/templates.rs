//! Template rendering: the minijinja environment every catalog template is parsed (at load)
//! and rendered (per script run) with, and its filters. Knows neither the catalog nor the
//! script context: both call in with plain text and values.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::TemplateError;

/// Renders every template of `service` (file name → source) with `values`.
pub(crate) fn render(
    service: &str,
    templates: &BTreeMap<String, String>,
    values: &Value,
) -> Result<BTreeMap<String, String>, TemplateError> {
    let mut rendered = BTreeMap::new();
    for (name, source) in templates {
        let render_error = |e: minijinja::Error| TemplateError::Render {
            service: service.to_string(),
            template: name.clone(),
            // Display only: the alternate form dumps every referenced value (passwords too).
            message: e.to_string(),
        };
        let env = template_env();
        let text = env.template_from_named_str(name, source).and_then(|t| t.render(values)).map_err(render_error)?;
        rendered.insert(name.clone(), text);
    }
    Ok(rendered)
}

/// The template environment: strict about undefined variables (a typo is an error, not an
/// empty string) and keeping trailing newlines of config files.
pub(crate) fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_keep_trailing_newline(true);
    // Config files, not HTML: no escaping by file extension (.yml would JSON-quote strings).
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.add_filter("ip", filter_ip);
    env.add_filter("ip_host", filter_ip_host);
    env.add_filter("conf_quote", filter_conf_quote);
    env
}

/// `{{ address | ip }}`: the address as a canonical IP, or a render error. Provider-reported
/// addresses end up in config files (haproxy.cfg, etcd.conf.yml, redis.conf): anything but an
/// IP (a name, text with spaces or newlines) is refused rather than written.
fn filter_ip(value: String) -> Result<String, minijinja::Error> {
    parse_ip(&value).map(|ip| ip.to_string())
}

/// `{{ address | ip_host }}`: like `ip`, IPv6 in brackets (for `host:port` and URLs).
fn filter_ip_host(value: String) -> Result<String, minijinja::Error> {
    parse_ip(&value).map(|ip| if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() })
}

fn parse_ip(value: &str) -> Result<std::net::IpAddr, minijinja::Error> {
    value.parse().map_err(|_| {
        // The value is provider data, not a secret, but may be long or multi-line: quote a bit.
        let shown: String = value.chars().take(64).collect();
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("{shown:?} is not an IP address"))
    })
}

/// `{{ value | conf_quote }}`: a double-quoted string in the syntax of redis.conf (and other
/// configs parsed like it: sdssplitargs): backslash and quote escaped, control characters as
/// `\xHH`, so any value (a password with quotes, backslashes, newlines) stays one argument.
fn filter_conf_quote(value: String) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
