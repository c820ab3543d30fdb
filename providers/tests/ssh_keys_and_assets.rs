//! Cloud providers hand new machines the account's public SSH key, and copy `nu` plus the
//! whole catalog before the first task script.

use std::process::Command;

use provisioning_providers::{Credentials, ProviderConfig, build_provider, ssh::task_assets};

#[test]
fn public_key_is_derived_from_the_accounts_private_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("id");
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen runs (openssh-client; run scripts/setup.sh)");
    assert!(status.success());
    let private = std::fs::read_to_string(&key).expect("private key");
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key");
    let expected: Vec<&str> = public.split_whitespace().take(2).collect();
    for provider_type in ["aws", "upcloud"] {
        let config = ProviderConfig {
            name: "acct".into(),
            provider_type: provider_type.into(),
            region: "eu-west-1".into(),
            zone: "fi-hel1".into(),
            endpoint: "http://127.0.0.1:9".into(),
            credentials: Credentials(
                [
                    ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
                    ("AWS_SECRET_ACCESS_KEY", "secret"),
                    ("UPCLOUD_USERNAME", "user"),
                    ("UPCLOUD_PASSWORD", "pass"),
                    ("SSH_PRIVATE_KEY", private.as_str()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            state_dir: dir.path().join("state"),
            ..Default::default()
        };
        let provider = build_provider(&config).expect("provider builds");
        let derived = provider.ssh_public_key().expect("a public key");
        let got: Vec<&str> = derived.split_whitespace().take(2).collect();
        assert_eq!(got, expected, "{provider_type}");
        assert!(!derived.contains("PRIVATE"), "only the public half");
    }
    let without = ProviderConfig {
        name: "nokey".into(),
        provider_type: "aws".into(),
        region: "eu-west-1".into(),
        endpoint: "http://127.0.0.1:9".into(),
        credentials: Credentials(
            [("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"), ("AWS_SECRET_ACCESS_KEY", "secret")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        state_dir: dir.path().join("state2"),
        ..Default::default()
    };
    assert_eq!(build_provider(&without).expect("builds").ssh_public_key(), None, "no SSH key, no public key");
}

#[test]
fn task_assets_hold_nu_and_every_catalog_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nu = dir.path().join("nu");
    std::fs::write(&nu, b"binary").expect("nu");
    let catalog = dir.path().join("catalog");
    std::fs::create_dir_all(catalog.join("etcd/templates")).expect("dirs");
    std::fs::create_dir_all(catalog.join("lib")).expect("dirs");
    for f in ["etcd/install.nu", "etcd/templates/etcd.conf.j2", "lib/ctx.nu"] {
        std::fs::write(catalog.join(f), b"x").expect("file");
    }
    let assets = task_assets(&nu, &catalog, "/opt/provisioning/catalog/");
    let remotes: Vec<(&str, u32)> = assets.iter().map(|a| (a.remote.as_str(), a.mode)).collect();
    assert_eq!(
        remotes,
        vec![
            ("/usr/local/bin/nu", 0o755),
            ("/opt/provisioning/catalog/etcd/install.nu", 0o644),
            ("/opt/provisioning/catalog/etcd/templates/etcd.conf.j2", 0o644),
            ("/opt/provisioning/catalog/lib/ctx.nu", 0o644),
        ]
    );
}
