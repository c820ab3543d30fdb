//! The k9s plugin file's shape: what k9s requires of each plugin, shortcuts k9s can parse,
//! scopes naming our resources, and no two plugins on one key in one view.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One plugin, with the fields k9s' plugin schema allows (unknown fields are typos).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Plugin {
    pub short_cut: Option<String>,
    pub description: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub confirm: bool,
    #[serde(default)]
    pub dangerous: bool,
    #[serde(default)]
    pub background: bool,
    #[serde(default)]
    #[serde(rename = "override")]
    pub override_: bool,
    #[serde(default)]
    pub overwrite_output: bool,
    #[serde(default)]
    pub pipes: Vec<String>,
}

/// The file: `plugins:` mapping a plugin name to its definition.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginFile {
    pub plugins: BTreeMap<String, Plugin>,
}

/// `deploy/k9s/plugins.yaml`.
pub fn plugins_path() -> std::path::PathBuf {
    crate::deploy_dir().join("k9s/plugins.yaml")
}

/// Reads and parses a plugin file.
pub fn load(path: &std::path::Path) -> Result<PluginFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Whether k9s can bind `key`: a lowercase letter or digit, or Shift-/Ctrl-/Alt- and a letter.
pub fn is_valid_shortcut(key: &str) -> bool {
    let single = |s: &str| s.len() == 1 && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let upper = |s: &str| s.len() == 1 && s.chars().all(|c| c.is_ascii_uppercase());
    match key.split_once('-') {
        None => single(key),
        Some(("Shift" | "Ctrl" | "Alt", letter)) => upper(letter),
        Some(_) => false,
    }
}

/// Keys k9s itself binds in every resource view (a plugin there would be ignored or shadow
/// a built-in): describe, edit, yaml, logs, delete, kill, wide, faults, save, sort by name/age…
pub const RESERVED_KEYS: [&str; 17] = [
    "a", "d", "e", "l", "s", "y", "Ctrl-A", "Ctrl-D", "Ctrl-E", "Ctrl-K", "Ctrl-Q", "Ctrl-R", "Ctrl-S", "Ctrl-W", "Ctrl-Z", "Shift-A",
    "Shift-N",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortcut_syntax() {
        for good in ["r", "1", "Shift-R", "Ctrl-P", "Alt-X"] {
            assert!(is_valid_shortcut(good), "{good}");
        }
        for bad in ["", "R", "shift-r", "Shift-r", "Ctrl-", "Ctrl-PP", "Super-R", "Shift+R", "rr"] {
            assert!(!is_valid_shortcut(bad), "{bad}");
        }
    }
}
