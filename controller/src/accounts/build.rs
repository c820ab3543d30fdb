//! What a provider instance is built from: the provider crate's config for an account
//! (credentials, host paths, network settings), its state directory, and where task scripts
//! and their assets live on the account's machines.

use std::path::{Path, PathBuf};
use std::time::Duration;

use provisioning_crds::{ProviderAccount, ProviderType};
use provisioning_providers::{Credentials, ProviderConfig, SimulationConfig, SshAsset, SshSettings};

use crate::effective_workspace::EffectiveWorkspace;
use crate::host::HostPaths;

/// Where `nu` goes on machines without `ssh.remoteDir` (the local containers' layout).
pub const DEFAULT_REMOTE_NU: &str = "/usr/local/bin/nu";
/// Where the catalog goes on machines without `ssh.remoteDir`.
pub const DEFAULT_REMOTE_CATALOG: &str = "/opt/provisioning/catalog";

/// Whether an account's machines run task scripts over SSH.
pub fn uses_ssh(account: &ProviderAccount) -> bool {
    matches!(account.provider_type, ProviderType::Aws | ProviderType::Upcloud)
}

/// Where `nu`, the catalog and the copy marker live on an account's machines:
/// `(nu, catalog_dir, marker)`; the marker is empty for the provider default.
pub fn remote_layout(account: &ProviderAccount) -> (String, String, String) {
    match account.ssh.as_ref().map(|s| s.remote_dir.trim_end_matches('/')).filter(|d| !d.is_empty()) {
        Some(dir) => (format!("{dir}/bin/nu"), format!("{dir}/catalog"), format!("{dir}/assets.sha256")),
        None => (DEFAULT_REMOTE_NU.into(), DEFAULT_REMOTE_CATALOG.into(), String::new()),
    }
}

/// The provider's SSH settings for an account: login user, port, address override, and the
/// assets (`nu` and every catalog file) copied before the first script.
pub fn ssh_settings(account: &ProviderAccount, nu_binary: Option<&Path>, catalog_dir: Option<&Path>) -> SshSettings {
    let mut settings = SshSettings::default();
    if !uses_ssh(account) {
        return settings;
    }
    let (remote_nu, remote_catalog, marker) = remote_layout(account);
    if let Some(access) = &account.ssh {
        settings.user = access.user.clone();
        settings.port = access.port;
        settings.address_override = Some(access.address_override.clone()).filter(|a| !a.is_empty());
        settings.become_root = access.become_root;
    }
    settings.assets_marker = marker;
    if let (Some(nu), Some(catalog)) = (nu_binary, catalog_dir) {
        let mut assets = provisioning_providers::ssh::task_assets(nu, catalog, &remote_catalog);
        if let Some(first) = assets.first_mut() {
            *first = SshAsset { remote: remote_nu, ..first.clone() };
        }
        settings.assets = assets;
    }
    settings
}

/// The provider state directory of an account in a workspace. SSH accounts (aws, upcloud)
/// keep their host-key pins there, so the pins are keyed by workspace and account: two
/// workspaces with an account of the same name never share (or overwrite) each other's pins.
/// Other providers keep the shared directory (the simulated store lives there).
pub fn account_state_dir(state_dir: &Path, ws: &EffectiveWorkspace, account: &ProviderAccount) -> PathBuf {
    if !uses_ssh(account) || state_dir.as_os_str().is_empty() {
        return state_dir.to_path_buf();
    }
    // Workspace names and namespaces are DNS labels: safe as one path component.
    let scope = match &ws.name {
        Some(name) => format!("workspace-{name}"),
        None => format!("namespace-{}", ws.namespace),
    };
    state_dir.join("pins").join(scope)
}

/// Translates a Workspace account into the provider crate's config.
pub fn provider_config(account: &ProviderAccount, credentials: Credentials, state_dir: &Path, host: &HostPaths) -> ProviderConfig {
    let simulation = account
        .simulation
        .as_ref()
        .map(|s| SimulationConfig {
            latency: Duration::from_millis(s.latency_ms),
            jitter_percent: s.jitter_percent,
            failure_rate: s.failure_rate,
            required_token: s.required_token.clone(),
        })
        .unwrap_or_default();
    // Resolved once at start-up (crate::host), never walked again here.
    let nu_binary = host.nu.clone();
    let catalog_dir = host.catalog.clone();
    // Cloud machines get `nu` and the catalog copied over SSH before their first script, at
    // the paths the runner uses (the local provider mounts them instead); the account's `ssh`
    // says how to reach them.
    let ssh = ssh_settings(account, nu_binary.as_deref(), catalog_dir.as_deref());
    ProviderConfig {
        name: account.name.clone(),
        provider_type: account.provider_type.as_str().to_string(),
        region: account.region.clone(),
        zone: account.zone.clone(),
        endpoint: account.endpoint.clone(),
        // Set by the caller, which knows the Workspace.
        tenant: String::new(),
        credentials,
        images: account.images.clone(),
        rate_limit: account.rate_limit,
        simulation,
        state_dir: state_dir.to_path_buf(),
        // Local provider: `nu` and the catalog are mounted read-only into every container.
        nu_binary,
        catalog_dir,
        ssh,
        network: provisioning_providers::NetworkSettings {
            security_group_ids: account.security_group_ids.clone(),
            subnet_id: account.subnet_id.clone(),
            zone_subnets: account.zone_subnets.clone(),
            ssh_source_cidrs: account.ssh_source_cidrs.clone(),
            firewall_rules: account
                .firewall_rules
                .iter()
                .map(|r| provisioning_providers::FirewallRule {
                    direction: r.direction.clone(),
                    action: r.action.clone(),
                    family: r.family.clone(),
                    protocol: r.protocol.clone(),
                    source: r.source.clone(),
                    destination_port: r.destination_port.clone(),
                    comment: r.comment.clone(),
                })
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(yaml: &str) -> ProviderAccount {
        provisioning_yaml::from_str(yaml).expect("account")
    }

    #[test]
    fn remote_layout_and_settings_follow_the_account() {
        let plain = account("{name: a, type: aws}");
        assert_eq!(remote_layout(&plain), (DEFAULT_REMOTE_NU.into(), DEFAULT_REMOTE_CATALOG.into(), String::new()));
        let custom = account("{name: a, type: aws, ssh: {user: ops, port: 2222, addressOverride: 127.0.0.1, remoteDir: /home/ops/prov/}}");
        assert_eq!(
            remote_layout(&custom),
            ("/home/ops/prov/bin/nu".into(), "/home/ops/prov/catalog".into(), "/home/ops/prov/assets.sha256".into())
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let nu = dir.path().join("nu");
        std::fs::write(&nu, b"nu").expect("write");
        std::fs::create_dir_all(dir.path().join("catalog/x")).expect("mkdir");
        std::fs::write(dir.path().join("catalog/x/install.nu"), b"x").expect("write");
        let s = ssh_settings(&custom, Some(&nu), Some(&dir.path().join("catalog")));
        assert_eq!((s.user.as_str(), s.port, s.address_override.as_deref()), ("ops", 2222, Some("127.0.0.1")));
        let remotes: Vec<&str> = s.assets.iter().map(|a| a.remote.as_str()).collect();
        assert_eq!(remotes, ["/home/ops/prov/bin/nu", "/home/ops/prov/catalog/x/install.nu"]);
        assert_eq!(s.assets_marker, "/home/ops/prov/assets.sha256");
        assert_eq!(s.become_root, None, "unset: the provider decides by user");
        let no_sudo = account("{name: a, type: upcloud, ssh: {user: ops, become: false}}");
        assert_eq!(ssh_settings(&no_sudo, None, None).become_root, Some(false));
        // Accounts without SSH get nothing to copy.
        assert!(ssh_settings(&account("{name: l, type: local}"), Some(&nu), Some(&dir.path().join("catalog"))).assets.is_empty());
    }

    #[test]
    fn provider_configs_take_the_host_paths_resolved_at_start_up() {
        // Paths that do not exist: a lookup (canonicalize, PATH walk) would drop or replace
        // them, so seeing them unchanged shows the config is built without one.
        let host = HostPaths { nu: Some("/resolved/once/nu".into()), catalog: Some("/resolved/once/catalog".into()), problems: vec![] };
        let config = provider_config(&account("{name: l, type: local}"), Credentials::default(), Path::new("/state"), &host);
        assert_eq!(config.nu_binary.as_deref(), Some(Path::new("/resolved/once/nu")));
        assert_eq!(config.catalog_dir.as_deref(), Some(Path::new("/resolved/once/catalog")));
        let missing = provider_config(&account("{name: a, type: aws}"), Credentials::default(), Path::new("/state"), &HostPaths::default());
        assert_eq!((missing.nu_binary, missing.catalog_dir), (None, None));
        assert!(missing.ssh.assets.is_empty(), "nothing to copy without nu and the catalog");
    }
}
