//! k9s: deploy/k9s/plugins.yaml has the shape k9s needs and only names our resources.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use provisioning_deploy_checks::k9s::{self, RESERVED_KEYS};
use provisioning_deploy_checks::kinds::{CrdNames, crd_names, crd_schema, declared_kinds};

fn plugins() -> k9s::PluginFile {
    k9s::load(&k9s::plugins_path()).unwrap_or_else(|e| panic!("{e}"))
}

fn kind_of<'a>(names: &'a [CrdNames], scope: &str) -> Option<&'a CrdNames> {
    names.iter().find(|n| n.all_names().iter().any(|name| name == scope))
}

#[test]
fn every_plugin_has_the_required_fields_and_a_valid_shortcut() {
    for (name, plugin) in plugins().plugins {
        let key = plugin.short_cut.as_deref().unwrap_or_else(|| panic!("{name}: shortCut is required"));
        assert!(k9s::is_valid_shortcut(key), "{name}: k9s cannot bind {key:?}");
        assert!(!RESERVED_KEYS.contains(&key), "{name}: {key} is a k9s built-in key");
        assert!(plugin.description.as_deref().is_some_and(|d| !d.is_empty()), "{name}: description is required");
        assert!(plugin.scopes.as_ref().is_some_and(|s| !s.is_empty()), "{name}: scopes are required");
        assert!(plugin.command.as_deref().is_some_and(|c| !c.is_empty()), "{name}: command is required");
    }
}

#[test]
fn scopes_exist_in_our_crds_and_no_key_is_taken_twice_in_a_view() {
    let names = crd_names().unwrap_or_else(|e| panic!("{e}"));
    // A view is a kind: `servers` and `srv` open the same one.
    let mut keys_per_kind: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (name, plugin) in plugins().plugins {
        let mut kinds = BTreeSet::new();
        for scope in plugin.scopes.clone().unwrap_or_default() {
            let crd = kind_of(&names, &scope).unwrap_or_else(|| panic!("{name}: scope {scope} is none of our CRDs' names"));
            kinds.insert(crd.kind.clone());
        }
        for kind in kinds {
            keys_per_kind.entry((kind, plugin.short_cut.clone().unwrap_or_default())).or_default().push(name.clone());
        }
    }
    for ((kind, key), plugins) in &keys_per_kind {
        assert_eq!(plugins.len(), 1, "{kind}: {key} is bound by {plugins:?}");
    }
    // Each kind is reachable by its plural and short names wherever it has plugins.
    for (name, plugin) in plugins().plugins {
        let scopes = plugin.scopes.unwrap_or_default();
        for scope in &scopes {
            let crd = kind_of(&names, scope).unwrap_or_else(|| panic!("{scope}"));
            for required in std::iter::once(&crd.plural).chain(crd.short_names.iter()) {
                assert!(scopes.contains(required), "{name}: scoped to {} but not to {required}", crd.kind);
            }
        }
    }
}

#[test]
fn every_kind_gets_reconcile_pause_resume_and_taskservs_their_output() {
    let names = crd_names().unwrap_or_else(|e| panic!("{e}"));
    let file = plugins();
    let find = |kind: &str, needle: &str| -> Vec<(String, k9s::Plugin)> {
        file.plugins
            .iter()
            .filter(|(_, p)| {
                p.scopes.iter().flatten().any(|s| kind_of(&names, s).is_some_and(|c| c.kind == kind))
                    && format!("{} {}", p.command.clone().unwrap_or_default(), p.args.join(" ")).contains(needle)
            })
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    };
    let declared = declared_kinds().unwrap_or_else(|e| panic!("{e}"));
    for crd in &declared {
        for needle in ["provisioning.dev/reconcile-requested-at=", "provisioning.dev/paused=true", "provisioning.dev/paused=false"] {
            let found = find(&crd.kind, needle);
            assert_eq!(found.len(), 1, "{}: one plugin setting {needle}", crd.kind);
            let (name, plugin) = &found[0];
            assert!(plugin.confirm && plugin.dangerous, "{name} mutates: confirm and dangerous");
            let text = plugin.args.join(" ");
            // Namespaced kinds need the namespace; cluster-scoped ones must not pass one.
            assert_eq!(text.contains("$NAMESPACE"), crd.namespaced, "{name}: namespace handling for {}", crd.kind);
            assert!(text.contains("$CONTEXT"), "{name}: must target k9s' current context");
        }
    }
    let output = find("TaskServ", "outputTail");
    assert_eq!(output.len(), 1, "one TaskServ output plugin");
    let (name, plugin) = &output[0];
    assert!(!plugin.dangerous && !plugin.background, "{name} only reads and shows output in the foreground");
    let schema = crd_schema("TaskServ").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        schema.pointer("/properties/status/properties/servers/items/properties/lastRun/properties/outputTail").is_some(),
        "TaskServ CRD has no status.servers[].lastRun.outputTail"
    );
}

#[test]
fn shell_commands_parse_after_k9s_substitution() {
    for (name, plugin) in plugins().plugins {
        if plugin.command.as_deref() != Some("sh") {
            continue;
        }
        assert_eq!(plugin.args.first().map(String::as_str), Some("-c"), "{name}");
        let script = plugin.args.get(1).unwrap_or_else(|| panic!("{name}: no script"));
        // What k9s hands the shell: its variables already substituted.
        let substituted = script
            .replace("$RESOURCE_NAME", "servers")
            .replace("$RESOURCE_GROUP", "provisioning.dev")
            .replace("$NAMESPACE", "dev")
            .replace("$NAME", "web-1")
            .replace("$CONTEXT", "provisioning-dev");
        let status = Command::new("sh").arg("-n").arg("-c").arg(&substituted).status().unwrap_or_else(|e| panic!("sh: {e}"));
        assert!(status.success(), "{name}: sh cannot parse {substituted}");
    }
}
