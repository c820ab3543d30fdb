//! SSH for cloud Servers (aws, upcloud): the login key a Server brings in
//! `spec.sshKeySecretRef` and the host key checkpoint (`status.hostKey`). The account's SSH
//! settings (user, port, assets to copy) are part of its provider config, in
//! [`crate::accounts`].
//!
//! Host keys (account `ssh.hostKeys`, default `Generated`): before creating a machine the
//! controller generates an ed25519 host key for it, keeps it in the Secret
//! `<server>-ssh-host-key` (owned by the Server; Secrets, unlike status, are not writable by
//! whoever may write status) and hands it to the provider, which injects it through
//! cloud-init. The pin is made from that Secret before the first connection: a machine that
//! offers another key is refused, and `status.hostKey` is only a record — it is never used to
//! restore a pin when a generated key exists.
//!
//! Machines without a generated key (adopted ones, accounts with `hostKeys: FirstUse`, or
//! machines made before) keep trust on first use: the provider pins the key offered at the
//! first contact in its state directory (keyed by workspace and account) and the Server
//! reconciler copies it into `status.hostKey`; a controller that lost its state directory pins
//! the recorded key again, so a changed key is refused, never re-pinned.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{HostKeyPolicy, ProviderAccount, Server};
use provisioning_providers::{HostKey, ProviderId, SharedProvider, SshPrivateKey, ssh};

use crate::error::Error;

// Where task scripts and their assets live on an account's machines is the account's business
// (crate::accounts); re-exported for the Server and TaskServ reconcilers that ask it here.
pub use crate::accounts::{remote_layout, uses_ssh};

/// The Secret key holding a Server's private key (as in `kubernetes.io/ssh-auth` Secrets).
pub const SSH_KEY_FIELD: &str = "ssh-privatekey";

/// Why a Server's own SSH key cannot be used; becomes `Stalled` with `message` (which names
/// the Secret and the key, never a value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyProblem {
    /// Condition reason.
    pub reason: &'static str,
    /// What is wrong.
    pub message: String,
}

/// A Server's own login key and its public half (installed on new machines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerKey {
    /// The private key (redacted in `Debug`).
    pub private: SshPrivateKey,
    /// Its OpenSSH public-key line.
    pub public: String,
}

/// The key from the Secret `namespace/name` named by Server `server` (pure: the Secret as
/// fetched, `None` when it does not exist).
pub fn key_from_secret(secret: Option<&Secret>, namespace: &str, name: &str, server: &str) -> Result<ServerKey, KeyProblem> {
    let place = format!("Secret {namespace}/{name} (spec.sshKeySecretRef of Server {server})");
    let Some(secret) = secret else {
        return Err(KeyProblem {
            reason: "SshKeySecretNotFound",
            message: format!("{place} does not exist; it must hold the SSH private key under {SSH_KEY_FIELD:?}"),
        });
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SSH_KEY_FIELD))
        .map(|b| b.0.clone())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(SSH_KEY_FIELD)).map(|s| s.clone().into_bytes()));
    let Some(bytes) = bytes else {
        let mut keys: Vec<&String> = secret.data.iter().flat_map(|d| d.keys()).collect();
        keys.extend(secret.string_data.iter().flat_map(|d| d.keys()));
        let keys: Vec<&str> = keys.into_iter().map(String::as_str).collect();
        return Err(KeyProblem {
            reason: "SshKeyMissing",
            message: format!(
                "{place} has no key {SSH_KEY_FIELD:?} (it holds: {})",
                if keys.is_empty() { "nothing".into() } else { keys.join(", ") }
            ),
        });
    };
    let unreadable = || KeyProblem {
        reason: "SshKeyUnreadable",
        message: format!("key {SSH_KEY_FIELD:?} of {place} is not a readable OpenSSH private key (unencrypted PEM expected)"),
    };
    let text = String::from_utf8(bytes).map_err(|_| unreadable())?;
    let private = SshPrivateKey(text);
    let public = ssh::public_key_of(&private).map_err(|_| unreadable())?;
    Ok(ServerKey { private, public })
}

/// Reads a Server's own SSH key; `None` when it names no Secret. A missing Secret or key is
/// `Error::Stalled` naming both; an API failure is the API error (retried).
pub async fn server_key(client: &Client, server: &Server) -> Result<Option<ServerKey>, Error> {
    let Some(reference) = &server.spec.ssh_key_secret_ref else { return Ok(None) };
    let own_namespace = server.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let namespace = check_key_namespace(reference, &own_namespace, &server.name_any())
        .map_err(|p| Error::Stalled { reason: p.reason, message: p.message })?;
    // Only the key read and a few others (named when the key is missing) are decoded
    // (crate::slim): the Secret is the tenant's to make large.
    let others = std::sync::atomic::AtomicUsize::new(0);
    let keep = |k: &str| k == SSH_KEY_FIELD || others.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 16;
    let secret = crate::slim::SlimApi::of::<Secret>(client.clone(), Some(&namespace))
        .get_data(&reference.name, true, &keep)
        .await?
        .map(crate::slim::SlimData::secret);
    key_from_secret(secret.as_ref(), &namespace, &reference.name, &server.name_any())
        .map(Some)
        .map_err(|p| Error::Stalled { reason: p.reason, message: p.message })
}

/// The namespace of a Server's `spec.sshKeySecretRef` (pure): the Server's own. A reference
/// into another namespace is refused before anything is read, so one tenant cannot log in
/// to machines with (or learn the public half of) another tenant's key.
pub fn check_key_namespace(
    reference: &provisioning_crds::SecretReference,
    own_namespace: &str,
    server: &str,
) -> Result<String, KeyProblem> {
    match reference.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(other) if other != own_namespace => Err(KeyProblem {
            reason: "CrossNamespaceReference",
            message: format!(
                "spec.sshKeySecretRef of Server {server} names Secret {other}/{} but a Server may only reference Secrets in its own namespace {own_namespace:?}",
                reference.name
            ),
        }),
        _ => Ok(own_namespace.to_string()),
    }
}

/// Secret keys of a generated host key (the names OpenSSH gives the files).
const HOST_KEY_PRIVATE: &str = "ssh_host_ed25519_key";
const HOST_KEY_PUBLIC: &str = "ssh_host_ed25519_key.pub";

/// Whether new machines of an account get a controller-generated host key.
pub fn generates_host_keys(account: &ProviderAccount) -> bool {
    uses_ssh(account) && account.ssh.as_ref().is_none_or(|s| s.host_keys == HostKeyPolicy::Generated)
}

/// Name of the Secret holding a Server's generated host key.
pub fn host_key_secret_name(server: &str) -> String {
    format!("{server}-ssh-host-key")
}

/// The generated host key of `server` from its Secret (pure): `Ok(None)` when there is no
/// Secret; an error message when the Secret is not owned by this Server (someone else's
/// Secret must not decide which key is trusted) or unreadable.
pub fn host_key_from_secret(secret: Option<&Secret>, server: &Server) -> Result<Option<HostKey>, String> {
    let Some(secret) = secret else { return Ok(None) };
    let name = secret.name_any();
    let uid = server.uid().unwrap_or_default();
    if !secret.owner_references().iter().any(|o| o.uid == uid && o.controller == Some(true)) {
        return Err(format!(
            "Secret {name} exists but is not owned by Server {}; it is not used as the machine's host key",
            server.name_any()
        ));
    }
    let text = |key: &str| secret.data.as_ref().and_then(|d| d.get(key)).and_then(|b| String::from_utf8(b.0.clone()).ok());
    match (text(HOST_KEY_PRIVATE), text(HOST_KEY_PUBLIC)) {
        (Some(private), Some(public)) => Ok(Some(HostKey { private: SshPrivateKey(private), public })),
        _ => Err(format!("Secret {name} lacks {HOST_KEY_PRIVATE} or {HOST_KEY_PUBLIC}")),
    }
}

/// Reads a Server's generated host key (`None`: none was generated).
pub async fn generated_host_key(client: &Client, server: &Server) -> Result<Option<HostKey>, Error> {
    let namespace = server.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let secret = crate::slim::SlimApi::of::<Secret>(client.clone(), Some(&namespace))
        .get_data(&host_key_secret_name(&server.name_any()), true, &|k| k == HOST_KEY_PRIVATE || k == HOST_KEY_PUBLIC)
        .await?
        .map(crate::slim::SlimData::secret);
    host_key_from_secret(secret.as_ref(), server).map_err(|message| Error::Stalled { reason: "HostKeySecretInvalid", message })
}

/// The Server's generated host key, made (and stored in its owned Secret) when missing.
/// Called right before a machine is created, so the key exists before the machine does.
pub async fn ensure_generated_host_key(client: &Client, server: &Server) -> Result<HostKey, Error> {
    if let Some(key) = generated_host_key(client, server).await? {
        return Ok(key);
    }
    let namespace = server.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let (private, public) = ssh::generate_host_key().map_err(|message| Error::Stalled { reason: "HostKeyGeneration", message })?;
    let owner = OwnerReference {
        api_version: "provisioning.dev/v1alpha1".into(),
        kind: "Server".into(),
        name: server.name_any(),
        uid: server.uid().ok_or(Error::MissingField("metadata.uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(host_key_secret_name(&server.name_any())),
            namespace: Some(namespace.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (HOST_KEY_PRIVATE.to_string(), ByteString(private.0.clone().into_bytes())),
            (HOST_KEY_PUBLIC.to_string(), ByteString(public.clone().into_bytes())),
        ])),
        ..Default::default()
    };
    let params = PostParams { field_manager: Some(crate::context::FIELD_MANAGER.into()), ..Default::default() };
    match Api::<Secret>::namespaced(client.clone(), &namespace).create(&params, &secret).await {
        Ok(_) => Ok(HostKey { private, public }),
        // Made concurrently: use that one (the next read returns it).
        Err(kube::Error::Api(e)) if e.code == 409 => {
            generated_host_key(client, server).await?.ok_or_else(|| Error::InProgress("host key Secret being created".into()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Pins the controller-generated host key of machine `id` (pure decision, then the pin): an
/// earlier pin of another key is a mismatch (refused), `status.hostKey` plays no part.
pub fn pin_generated(provider: &SharedProvider, id: &ProviderId, generated: &str) -> Result<String, String> {
    match provider.pinned_host_key(id) {
        Some(pinned) if ssh::same_key(&pinned, generated) => Ok(generated.to_string()),
        Some(pinned) => Err(format!(
            "SSH host key of machine {id}: the controller generated {} for it but {} is pinned; refusing to connect. \
             If the machine was rebuilt outside the controller, delete its entry from the controller's known-hosts file",
            ssh::fingerprint(generated),
            ssh::fingerprint(&pinned)
        )),
        None => {
            tracing::info!(provider_id = %id, fingerprint = %ssh::fingerprint(generated), "pinned the generated SSH host key");
            provider.pin_host_key(id, generated);
            Ok(generated.to_string())
        }
    }
}

/// What the recorded host key (`status.hostKey`) and the provider's pin say together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKeyState {
    /// No contact yet and nothing recorded.
    Unknown,
    /// Pinned by the provider and not recorded yet: record it.
    FirstContact(String),
    /// Recorded and pinned alike.
    Agreed(String),
    /// Recorded, but the provider lost its pin (new state dir): pin the recorded one again.
    Restore(String),
    /// Recorded and pinned differ: refuse to choose.
    Mismatch {
        /// `status.hostKey`.
        recorded: String,
        /// The provider's pin.
        pinned: String,
    },
}

/// Compares `status.hostKey` with the provider's pin (pure).
pub fn host_key_state(recorded: Option<&str>, pinned: Option<&str>) -> HostKeyState {
    let recorded = recorded.map(str::trim).filter(|k| !k.is_empty());
    match (recorded, pinned) {
        (None, None) => HostKeyState::Unknown,
        (None, Some(pinned)) => HostKeyState::FirstContact(pinned.to_string()),
        (Some(recorded), None) => HostKeyState::Restore(recorded.to_string()),
        (Some(recorded), Some(pinned)) if ssh::same_key(recorded, pinned) => HostKeyState::Agreed(recorded.to_string()),
        (Some(recorded), Some(pinned)) => HostKeyState::Mismatch { recorded: recorded.to_string(), pinned: pinned.to_string() },
    }
}

/// The message of a [`HostKeyState::Mismatch`] (fingerprints only).
pub fn mismatch_message(id: &ProviderId, recorded: &str, pinned: &str) -> String {
    format!(
        "SSH host key of machine {id}: status.hostKey records {} but the controller has {} pinned; refusing to connect with either. \
         If the machine's key really changed, remove status.hostKey (kubectl edit --subresource=status) and the machine's entry \
         from the controller's known-hosts file",
        ssh::fingerprint(recorded),
        ssh::fingerprint(pinned)
    )
}

/// Brings the provider's pin in line with `status.hostKey` (recorded for machine `id`) and
/// returns the key to record. Before any script runs on a machine, and on every Server
/// reconcile. A disagreement is an error message, and nothing is re-pinned.
pub fn restore_pin(provider: &SharedProvider, id: &ProviderId, recorded: Option<&str>) -> Result<Option<String>, String> {
    match host_key_state(recorded, provider.pinned_host_key(id).as_deref()) {
        HostKeyState::Unknown => Ok(None),
        HostKeyState::FirstContact(key) | HostKeyState::Agreed(key) => Ok(Some(key)),
        HostKeyState::Restore(key) => {
            tracing::info!(provider_id = %id, fingerprint = %ssh::fingerprint(&key), "pinned the SSH host key recorded in status");
            provider.pin_host_key(id, &key);
            Ok(Some(key))
        }
        HostKeyState::Mismatch { recorded, pinned } => Err(mismatch_message(id, &recorded, &pinned)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    const A: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA3f0Y9v7tXb1cQm5r8HkS3y0x3oQeU1dN6q7YV1b2c3";
    const B: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxq1n3ZzJ0m7c8o2V4r6t8y0u2w4e6q8s0d2f4h6j8k";

    #[test]
    fn host_key_states() {
        assert_eq!(host_key_state(None, None), HostKeyState::Unknown);
        assert_eq!(host_key_state(None, Some(A)), HostKeyState::FirstContact(A.into()));
        assert_eq!(host_key_state(Some(A), None), HostKeyState::Restore(A.into()));
        assert_eq!(host_key_state(Some(&format!("{A} root@host")), Some(A)), HostKeyState::Agreed(format!("{A} root@host")));
        assert_eq!(host_key_state(Some(A), Some(B)), HostKeyState::Mismatch { recorded: A.into(), pinned: B.into() });
        assert_eq!(host_key_state(Some(""), Some(A)), HostKeyState::FirstContact(A.into()));
        let message = mismatch_message(&ProviderId::new("aws", "i-1"), A, B);
        assert!(message.contains("aws://i-1") && message.contains("SHA256:") && !message.contains("AAAA"), "{message}");
    }

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect::<BTreeMap<_, _>>()),
            ..Default::default()
        }
    }

    #[test]
    fn missing_secret_or_key_names_both_and_no_value() {
        let missing = key_from_secret(None, "ns", "keys", "web-1").expect_err("missing Secret");
        assert_eq!(missing.reason, "SshKeySecretNotFound");
        assert!(missing.message.contains("Secret ns/keys") && missing.message.contains("Server web-1"), "{}", missing.message);
        assert!(missing.message.contains("\"ssh-privatekey\""), "{}", missing.message);

        let wrong_key = key_from_secret(Some(&secret(&[("id_ed25519", b"s3cret-value")])), "ns", "keys", "web-1").expect_err("no key");
        assert_eq!(wrong_key.reason, "SshKeyMissing");
        assert!(wrong_key.message.contains("\"ssh-privatekey\"") && wrong_key.message.contains("id_ed25519"), "{}", wrong_key.message);
        assert!(!wrong_key.message.contains("s3cret"), "{}", wrong_key.message);

        let garbage = key_from_secret(Some(&secret(&[(SSH_KEY_FIELD, b"s3cret-value")])), "ns", "keys", "web-1").expect_err("bad key");
        assert_eq!(garbage.reason, "SshKeyUnreadable");
        assert!(!garbage.message.contains("s3cret"), "{}", garbage.message);
    }

    #[test]
    fn generated_host_keys_come_only_from_the_servers_own_secret() {
        let server: Server = serde_json::from_value(serde_json::json!({
            "apiVersion": "provisioning.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": "web-1", "namespace": "ns", "uid": "uid-web-1"}, "spec": {}
        }))
        .expect("server");
        let (private, public) = ssh::generate_host_key().expect("generate");
        assert!(public.starts_with("ssh-ed25519 ") && private.0.contains("BEGIN OPENSSH PRIVATE KEY"));
        let mut secret = secret(&[(HOST_KEY_PRIVATE, private.0.as_bytes()), (HOST_KEY_PUBLIC, public.as_bytes())]);
        secret.metadata.name = Some(host_key_secret_name("web-1"));
        assert_eq!(host_key_from_secret(None, &server), Ok(None));
        // Not owned by this Server (anyone could have made it): refused.
        let refused = host_key_from_secret(Some(&secret), &server).expect_err("foreign");
        assert!(refused.contains("web-1-ssh-host-key") && refused.contains("not owned"), "{refused}");
        secret.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "provisioning.dev/v1alpha1".into(),
            kind: "Server".into(),
            name: "web-1".into(),
            uid: "uid-web-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        let key = host_key_from_secret(Some(&secret), &server).expect("owned").expect("present");
        assert_eq!(key.public, public);
        assert!(!format!("{key:?}").contains("PRIVATE KEY"), "Debug hides the private half");
        // Accounts choose: generated by default for SSH providers, never for local.
        assert!(generates_host_keys(&account("{name: a, type: aws}")));
        assert!(!generates_host_keys(&account("{name: a, type: upcloud, ssh: {hostKeys: FirstUse}}")));
        assert!(!generates_host_keys(&account("{name: l, type: local}")));
    }

    fn account(yaml: &str) -> ProviderAccount {
        provisioning_yaml::from_str(yaml).expect("account")
    }
}
