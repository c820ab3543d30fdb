//! SSH `exec` for cloud machines (aws, upcloud).
//!
//! - The private key is a credential (`SSH_PRIVATE_KEY` in the account's Secret); it never
//!   appears in errors or `Debug` output.
//! - The host key is pinned per machine (by provider id, not by address: cloud addresses
//!   are reused) on first contact, kept in a file under the provider's state directory, and
//!   exposed so the controller can store it in `status.hostKey`. A changed key is refused.
//! - Before the first command, the configured assets (the `nu` binary, task scripts) are
//!   copied over, once per content hash: a marker file on the machine records the hash.
//! - Output is streamed line by line to `ExecRequest::output`; a timeout returns
//!   `ExecResult { timed_out: true, .. }`. Every command runs under the machine's own
//!   `timeout(1)`, which kills the command's whole process group when time is up, also when
//!   the command runs as root (a signal over SSH cannot reach it) or the controller is gone.
//! - A non-root login user (cloud images: `admin`, `debian`…) becomes root through `sudo -n`
//!   for the copy and the commands: stdin, output and exit codes pass through sudo unchanged.
//!   Sudo is probed before the first command on a machine, so a password prompt or a missing
//!   sudo is a `Permanent` error naming user and host, never a hang or a script failure.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::ChannelMsg;
use russh::client;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use sha2::{Digest, Sha256};

use crate::{ExecRequest, ExecResult, OutputSink, ProviderConfig, ProviderError, ProviderResult, SshAsset, SshPrivateKey};

/// Most output kept per stream; the rest is still streamed but not returned.
const MAX_CAPTURE: usize = 4 * 1024 * 1024;
const DEFAULT_MARKER: &str = "/var/lib/provisioning/assets.sha256";
/// How long a command may ignore the TERM of its time limit before `timeout(1)` kills it.
const KILL_AFTER_SECS: u32 = 5;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Critical sections are single map operations: a poisoned lock still holds valid data.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Host keys pinned per machine, persisted as JSON under the state directory.
struct KnownHosts {
    path: Option<PathBuf>,
    pins: Mutex<BTreeMap<String, String>>,
}

impl KnownHosts {
    fn open(path: Option<PathBuf>) -> Self {
        let pins = path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        KnownHosts { path, pins: Mutex::new(pins) }
    }

    fn get(&self, machine: &str) -> Option<String> {
        lock(&self.pins).get(machine).cloned()
    }

    fn pin(&self, machine: &str, key: &str) {
        let snapshot = {
            let mut pins = lock(&self.pins);
            if pins.get(machine).map(String::as_str) == Some(key) {
                return;
            }
            pins.insert(machine.to_string(), key.to_string());
            pins.clone()
        };
        if let Some(path) = &self.path {
            // Write-then-rename: a crash never leaves a torn file behind.
            let tmp = path.with_extension("json.tmp");
            let written = serde_json::to_vec_pretty(&snapshot)
                .map_err(std::io::Error::other)
                .and_then(|bytes| std::fs::write(&tmp, bytes))
                .and_then(|()| std::fs::rename(&tmp, path));
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "cannot persist pinned SSH host keys");
            }
        }
    }
}

/// The public-key part of an OpenSSH key line (algorithm and base64), without comment.
fn normalize_key(line: &str) -> String {
    line.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

struct HostKeyCheck {
    pinned: Option<String>,
    offered: Arc<Mutex<Option<String>>>,
}

impl client::Handler for HostKeyCheck {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            return Ok(false);
        };
        let Ok(line) = key.to_openssh() else {
            return Ok(false);
        };
        let line = normalize_key(&line);
        let accepted = self.pinned.as_ref().is_none_or(|pinned| *pinned == line);
        *lock(&self.offered) = Some(line);
        Ok(accepted)
    }
}

/// Runs commands on cloud machines over SSH.
pub struct SshExecutor {
    account: String,
    user: String,
    port: u16,
    address_override: Option<String>,
    /// Copy and run as root through `sudo -n`.
    become_root: bool,
    key: Result<Arc<PrivateKey>, String>,
    assets: Vec<SshAsset>,
    assets_marker: String,
    connect_timeout: Duration,
    known_hosts: KnownHosts,
    assets_hash: tokio::sync::OnceCell<String>,
    /// Machines where `sudo -n` was seen to work (probed again after a run that sudo refused).
    sudo_ok: Mutex<std::collections::HashSet<String>>,
    /// Machines whose assets are known to be current, with the hash they hold.
    assets_done: Mutex<HashMap<String, String>>,
    /// One asset copy per machine at a time.
    copy_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl fmt::Debug for SshExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshExecutor")
            .field("account", &self.account)
            .field("user", &self.user)
            .field("port", &self.port)
            .field("address_override", &self.address_override)
            .field("become_root", &self.become_root)
            .field("key", &self.key.as_ref().map(|_| "[redacted]"))
            .field("assets", &self.assets.len())
            .finish_non_exhaustive()
    }
}

/// The assets every cloud machine needs before its first task script: the `nu` binary at
/// `/usr/local/bin/nu` and every file of the taskserv catalog under `remote_catalog`.
pub fn task_assets(nu_binary: &std::path::Path, catalog_dir: &std::path::Path, remote_catalog: &str) -> Vec<SshAsset> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if path.is_dir() {
                walk(&path, out);
            } else if path.is_file() {
                out.push(path);
            }
        }
    }
    let mut assets = vec![SshAsset { local: nu_binary.to_path_buf(), remote: "/usr/local/bin/nu".into(), mode: 0o755 }];
    let mut files = Vec::new();
    walk(catalog_dir, &mut files);
    for file in files {
        if let Ok(rel) = file.strip_prefix(catalog_dir) {
            let remote = format!("{}/{}", remote_catalog.trim_end_matches('/'), rel.to_string_lossy());
            assets.push(SshAsset { local: file, remote, mode: 0o644 });
        }
    }
    assets
}

impl SshExecutor {
    /// The OpenSSH public key line of the account's private key, for machines to authorise.
    pub fn public_key(&self) -> Option<String> {
        self.key.as_ref().ok().and_then(|k| k.public_key().to_openssh().ok())
    }

    /// Builds the executor of an account. A missing or unreadable key is reported at the first
    /// `exec`, so that accounts without SSH still work for everything else.
    pub fn new(config: &ProviderConfig, default_user: &str) -> Self {
        let key = match config.credentials.get("SSH_PRIVATE_KEY") {
            None => Err(format!("the credentials of account {:?} hold no SSH_PRIVATE_KEY", config.name)),
            Some(text) => russh::keys::decode_secret_key(text, None).map(Arc::new).map_err(|_| {
                // The decoder's message may quote key material: say only which key failed.
                format!("SSH_PRIVATE_KEY of account {:?} is not a readable OpenSSH private key", config.name)
            }),
        };
        let ssh = &config.ssh;
        let known_hosts_path = (!config.state_dir.as_os_str().is_empty()).then(|| {
            let _ = std::fs::create_dir_all(&config.state_dir);
            config.state_dir.join(format!("known-hosts-{}-{}.json", config.provider_type, config.name))
        });
        let user = if ssh.user.is_empty() { default_user.to_string() } else { ssh.user.clone() };
        SshExecutor {
            account: config.name.clone(),
            become_root: user != "root" && ssh.become_root.unwrap_or(true),
            user,
            port: if ssh.port == 0 { 22 } else { ssh.port },
            address_override: ssh.address_override.clone(),
            key,
            assets: ssh.assets.clone(),
            assets_marker: if ssh.assets_marker.is_empty() { DEFAULT_MARKER.into() } else { ssh.assets_marker.clone() },
            connect_timeout: if ssh.connect_timeout.is_zero() { Duration::from_secs(20) } else { ssh.connect_timeout },
            known_hosts: KnownHosts::open(known_hosts_path),
            assets_hash: tokio::sync::OnceCell::new(),
            sudo_ok: Mutex::new(Default::default()),
            assets_done: Mutex::new(HashMap::new()),
            copy_locks: Mutex::new(HashMap::new()),
        }
    }

    /// The host key pinned for a machine, as an OpenSSH public-key line.
    pub fn pinned_host_key(&self, machine: &str) -> Option<String> {
        self.known_hosts.get(machine)
    }

    /// Pins a host key recorded earlier (status.hostKey).
    pub fn pin_host_key(&self, machine: &str, key: &str) {
        self.known_hosts.pin(machine, &normalize_key(key));
    }

    /// Runs `request` on the machine `machine` (a provider id) reachable at `address`.
    pub async fn exec(&self, machine: &str, address: &str, request: ExecRequest) -> ProviderResult<ExecResult> {
        if request.argv.is_empty() {
            return Err(ProviderError::InvalidRequest("exec needs a program to run".into()));
        }
        let command = build_command(&request, self.become_root)?;
        let host = self.address_override.as_deref().unwrap_or(address);
        let key = match &request.ssh_key {
            // A Server's own key (spec.sshKeySecretRef) wins over the account's.
            Some(own) => Login {
                key: decode_private_key(own).map_err(ProviderError::InvalidRequest)?,
                whose: "the Server's key (spec.sshKeySecretRef)",
            },
            None => Login { key: self.key.clone().map_err(ProviderError::InvalidRequest)?, whose: "the account's SSH_PRIVATE_KEY" },
        };
        let session = self.connect(machine, host, key).await?;
        let result = self.run_prepared(machine, host, &session, &command, request).await;
        let _ = session.disconnect(russh::Disconnect::ByApplication, "", "en").await;
        result
    }

    /// Checks sudo, copies the assets if needed, then runs `command`.
    async fn run_prepared(
        &self,
        machine: &str,
        host: &str,
        session: &client::Handle<HostKeyCheck>,
        command: &str,
        request: ExecRequest,
    ) -> ProviderResult<ExecResult> {
        if self.become_root && !lock(&self.sudo_ok).contains(machine) {
            self.check_sudo(machine, host, session).await?;
            lock(&self.sudo_ok).insert(machine.to_string());
        }
        if !self.assets.is_empty() {
            self.ensure_assets(machine, session).await?;
        }
        let result = run(session, command, request.stdin.as_deref(), request.output.as_ref(), Some(request.timeout)).await?;
        if self.become_root && result.exit_code == Some(1) && result.stderr.trim_start().starts_with("sudo: ") {
            // Sudo itself refused (its rules changed since the probe): probe again next time,
            // so the run after this one reports why.
            lock(&self.sudo_ok).remove(machine);
        }
        Ok(result)
    }

    /// Fails with a `Permanent` error unless the login user has passwordless sudo. A separate
    /// probe, because a script's own exit code 1 must not be mistaken for sudo's; run before
    /// the first command on a machine and again after sudo refused one.
    async fn check_sudo(&self, machine: &str, host: &str, session: &client::Handle<HostKeyCheck>) -> ProviderResult<()> {
        // `-n`: never prompt; sudo fails at once when it would need a password.
        let probe =
            run(session, "command -v sudo >/dev/null 2>&1 || exit 127; sudo -n true", None, None, Some(self.connect_timeout)).await?;
        match sudo_problem(&probe) {
            None => Ok(()),
            Some(problem) => Err(ProviderError::Permanent(format!(
                "SSH user {user} on {host} (machine {machine}) cannot run task scripts as root: {problem}; \
                 passwordless sudo is required for a non-root login user (e.g. `{user} ALL=(ALL) NOPASSWD:ALL` \
                 in /etc/sudoers.d/), or log in as root, or set the account's ssh.become: false",
                user = self.user
            ))),
        }
    }

    async fn connect(&self, machine: &str, host: &str, login: Login) -> ProviderResult<client::Handle<HostKeyCheck>> {
        let Login { key, whose } = login;
        let pinned = self.known_hosts.get(machine);
        let offered = Arc::new(Mutex::new(None));
        let check = HostKeyCheck { pinned: pinned.clone(), offered: offered.clone() };
        let config = Arc::new(client::Config {
            inactivity_timeout: Some(Duration::from_secs(300)),
            keepalive_interval: Some(Duration::from_secs(30)),
            ..Default::default()
        });
        let target = format!("{}@{host}:{}", self.user, self.port);
        let connected = tokio::time::timeout(self.connect_timeout, client::connect(config, (host, self.port), check)).await;
        let mut session = match connected {
            Err(_) => return Err(ProviderError::Transient(format!("SSH to {target}: no answer within {:?}", self.connect_timeout))),
            Ok(Err(e)) => {
                let offered = lock(&offered).clone();
                if let (Some(pinned), Some(offered)) = (&pinned, &offered)
                    && pinned != offered
                {
                    return Err(ProviderError::Permanent(format!(
                        "SSH host key of machine {machine} at {host} changed: pinned {}, offered {}; refusing to connect",
                        fingerprint(pinned),
                        fingerprint(offered)
                    )));
                }
                // Booting machines refuse or reset connections for a while.
                return Err(ProviderError::Transient(format!("SSH to {target}: {e}")));
            }
            Ok(Ok(session)) => session,
        };
        let hash = session.best_supported_rsa_hash().await.ok().flatten().flatten();
        let auth = tokio::time::timeout(
            self.connect_timeout,
            session.authenticate_publickey(self.user.clone(), PrivateKeyWithHashAlg::new(key, hash)),
        )
        .await
        .map_err(|_| ProviderError::Transient(format!("SSH to {target}: authentication timed out")))?
        .map_err(|e| ProviderError::Transient(format!("SSH to {target}: {e}")))?;
        if !auth.success() {
            return Err(ProviderError::Auth(format!("SSH login {target} refused {whose}")));
        }
        if pinned.is_none()
            && let Some(offered) = lock(&offered).clone()
        {
            tracing::info!(machine, fingerprint = %fingerprint(&offered), "pinned SSH host key on first contact");
            self.known_hosts.pin(machine, &offered);
        }
        Ok(session)
    }

    async fn assets_hash(&self) -> ProviderResult<&String> {
        self.assets_hash
            .get_or_try_init(|| async {
                let mut hasher = Sha256::new();
                for asset in &self.assets {
                    let content = tokio::fs::read(&asset.local)
                        .await
                        .map_err(|e| ProviderError::Permanent(format!("cannot read asset {}: {e}", asset.local.display())))?;
                    hasher.update(asset.remote.as_bytes());
                    hasher.update([0]);
                    hasher.update(asset.mode.to_le_bytes());
                    hasher.update((content.len() as u64).to_le_bytes());
                    hasher.update(&content);
                }
                Ok(hex(&hasher.finalize()))
            })
            .await
    }

    /// A shell snippet as the remote command line: through `sudo -n sh -c` when becoming root.
    fn as_root(&self, script: &str) -> String {
        if self.become_root { format!("sudo -n -- sh -c {}", quote(script)) } else { script.to_string() }
    }

    /// Copies the assets unless the machine's marker already names their content hash.
    async fn ensure_assets(&self, machine: &str, session: &client::Handle<HostKeyCheck>) -> ProviderResult<()> {
        let hash = self.assets_hash().await?.clone();
        if lock(&self.assets_done).get(machine) == Some(&hash) {
            return Ok(());
        }
        let copy_lock = lock(&self.copy_locks).entry(machine.to_string()).or_default().clone();
        let _guard = copy_lock.lock().await;
        if lock(&self.assets_done).get(machine) == Some(&hash) {
            return Ok(());
        }
        let marker = quote(&self.assets_marker);
        let current = run(session, &self.as_root(&format!("cat {marker} 2>/dev/null || true")), None, None, None).await?;
        if current.stdout.trim() != hash {
            for asset in &self.assets {
                let content = tokio::fs::read(&asset.local)
                    .await
                    .map_err(|e| ProviderError::Permanent(format!("cannot read asset {}: {e}", asset.local.display())))?;
                let remote = quote(&asset.remote);
                let tmp = quote(&format!("{}.provisioning-tmp", asset.remote));
                let copy =
                    format!("mkdir -p \"$(dirname {remote})\" && cat > {tmp} && chmod {:o} {tmp} && mv -f {tmp} {remote}", asset.mode);
                let copied = run(session, &self.as_root(&copy), Some(&content), None, None).await?;
                if copied.exit_code != Some(0) {
                    return Err(ProviderError::Transient(format!(
                        "copying {} to machine {machine} failed: {}",
                        asset.remote,
                        copied.stderr.trim()
                    )));
                }
            }
            let write_marker = format!("mkdir -p \"$(dirname {marker})\" && printf %s {hash} > {marker}");
            let written = run(session, &self.as_root(&write_marker), None, None, None).await?;
            if written.exit_code != Some(0) {
                return Err(ProviderError::Transient(format!("recording assets on machine {machine} failed: {}", written.stderr.trim())));
            }
            tracing::info!(machine, assets = self.assets.len(), hash = %hash, "copied assets");
        }
        lock(&self.assets_done).insert(machine.to_string(), hash);
        Ok(())
    }
}

/// The key a connection logs in with, and whose it is (for error messages, never the key).
struct Login {
    key: Arc<PrivateKey>,
    whose: &'static str,
}

fn decode_private_key(key: &SshPrivateKey) -> Result<Arc<PrivateKey>, String> {
    // The decoder's message may quote key material: never pass it on.
    russh::keys::decode_secret_key(&key.0, None)
        .map(Arc::new)
        .map_err(|_| "the SSH private key is not a readable OpenSSH private key (unencrypted PEM expected)".to_string())
}

/// The OpenSSH public-key line of a private key (what new machines authorise). The error
/// says only that the key is unreadable, never what it holds.
pub fn public_key_of(key: &SshPrivateKey) -> Result<String, String> {
    let private = decode_private_key(key)?;
    private.public_key().to_openssh().map_err(|_| "cannot encode the public part of the SSH key".to_string())
}

/// A fresh ed25519 SSH host key for a machine: (private key in OpenSSH PEM, public-key line).
/// The controller makes one per machine and injects it through cloud-init, so the key the
/// machine will offer is known before the first connection (no trust on first use).
pub fn generate_host_key() -> Result<(SshPrivateKey, String), String> {
    use russh::keys::ssh_key::private::Ed25519Keypair;
    let seed: [u8; 32] = rand::random();
    let private = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
    let pem = private.to_openssh(russh::keys::ssh_key::LineEnding::LF).map_err(|_| "cannot encode the generated host key".to_string())?;
    let public = private.public_key().to_openssh().map_err(|_| "cannot encode the generated host key".to_string())?;
    Ok((SshPrivateKey(pem.to_string()), public))
}

/// The cloud-config (user data) for a new machine: the login key for the image's default
/// user and, when given, the machine's SSH host key (cloud-init's `ssh_keys`; the image's own
/// host keys are deleted and no others generated, so the machine offers exactly this one).
pub fn cloud_config(login_key: Option<&str>, host_key: Option<&crate::HostKey>) -> Option<String> {
    if login_key.is_none() && host_key.is_none() {
        return None;
    }
    let mut text = String::from("#cloud-config\n");
    if let Some(key) = login_key {
        text.push_str(&format!("ssh_authorized_keys:\n  - {}\n", key.trim()));
    }
    if let Some(host) = host_key {
        text.push_str("ssh_deletekeys: true\nssh_genkeytypes: []\nssh_keys:\n  ed25519_private: |\n");
        for line in host.private.0.lines() {
            text.push_str(&format!("    {line}\n"));
        }
        text.push_str(&format!("  ed25519_public: {}\n", host.public.trim()));
    }
    Some(text)
}

/// Whether two OpenSSH public-key lines name the same key (comments ignored).
pub fn same_key(a: &str, b: &str) -> bool {
    normalize_key(a) == normalize_key(b)
}

/// `SHA256:<base64>` of an OpenSSH public-key line, as `ssh-keygen -l` prints it.
pub fn fingerprint(key_line: &str) -> String {
    russh::keys::PublicKey::from_openssh(key_line)
        .map(|k| k.fingerprint(russh::keys::HashAlg::Sha256).to_string())
        .unwrap_or_else(|_| "(unreadable key)".into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Quotes one word for the remote POSIX shell (SSH passes a single command string).
pub fn quote(word: &str) -> String {
    let safe = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if safe { word.to_string() } else { format!("'{}'", word.replace('\'', "'\\''")) }
}

/// Why a `sudo -n true` probe failed, from its result; `None` when it succeeded. Only sudo's
/// own first line is quoted (it holds no secret).
fn sudo_problem(probe: &ExecResult) -> Option<String> {
    if probe.timed_out {
        return Some("`sudo -n true` did not finish in time".into());
    }
    match probe.exit_code {
        Some(0) => None,
        Some(127) => Some("sudo is not installed on the machine".into()),
        code => {
            let said: String = probe.stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("").chars().take(200).collect();
            let code = code.map_or_else(|| "no exit status".to_string(), |c| format!("exit code {c}"));
            Some(if said.is_empty() {
                format!("`sudo -n true` failed ({code})")
            } else {
                format!("`sudo -n true` failed ({code}): {said}")
            })
        }
    }
}

/// The remote command line: `[sudo -n --] timeout -k 5 <limit>s [env K=V …] argv…`, every word
/// quoted. Nothing secret goes here (the context travels on stdin).
fn build_command(request: &ExecRequest, become_root: bool) -> ProviderResult<String> {
    let mut words = Vec::new();
    if become_root {
        words.extend(["sudo", "-n", "--"].map(String::from));
    }
    // The machine enforces the limit on the whole process group (`timeout` signals its group),
    // also when the controller's signal cannot reach a root process or the controller is gone.
    if !request.timeout.is_zero() {
        words.extend(["timeout", "-k"].map(String::from));
        words.push(format!("{KILL_AFTER_SECS}"));
        words.push(format!("{}s", request.timeout.as_secs_f64()));
    }
    if !request.env.is_empty() {
        words.push("env".to_string());
        for (key, value) in &request.env {
            let valid = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(ProviderError::InvalidRequest(format!("invalid environment variable name {key:?}")));
            }
            words.push(quote(&format!("{key}={value}")));
        }
    }
    words.extend(request.argv.iter().map(|w| quote(w)));
    Ok(words.join(" "))
}

/// Splits a byte stream into lines, sends each to the sink and keeps a bounded copy.
#[derive(Default)]
struct LineStream {
    pending: Vec<u8>,
    captured: Vec<u8>,
}

impl LineStream {
    fn push(&mut self, data: &[u8], sink: Option<&OutputSink>) {
        if self.captured.len() < MAX_CAPTURE {
            let room = MAX_CAPTURE - self.captured.len();
            self.captured.extend_from_slice(&data[..data.len().min(room)]);
        }
        self.pending.extend_from_slice(data);
        while let Some(pos) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=pos).collect();
            if let Some(sink) = sink {
                let _ = sink.send(String::from_utf8_lossy(&line[..line.len() - 1]).trim_end_matches('\r').to_string());
            }
        }
    }

    fn finish(mut self, sink: Option<&OutputSink>) -> String {
        if !self.pending.is_empty()
            && let Some(sink) = sink
        {
            let _ = sink.send(String::from_utf8_lossy(&self.pending).to_string());
        }
        self.pending.clear();
        String::from_utf8_lossy(&self.captured).to_string()
    }
}

/// Runs one command on an open session.
async fn run(
    session: &client::Handle<HostKeyCheck>,
    command: &str,
    stdin: Option<&[u8]>,
    sink: Option<&OutputSink>,
    timeout: Option<Duration>,
) -> ProviderResult<ExecResult> {
    let io = |e: russh::Error| ProviderError::Transient(format!("SSH channel: {e}"));
    let mut channel = session.channel_open_session().await.map_err(io)?;
    channel.exec(true, command).await.map_err(io)?;
    if let Some(bytes) = stdin {
        channel.data(bytes).await.map_err(io)?;
    }
    channel.eof().await.map_err(io)?;
    let started = tokio::time::Instant::now();
    let deadline = timeout.map(|t| started + t);
    let (mut out, mut err) = (LineStream::default(), LineStream::default());
    let mut exit_code = None;
    let mut timed_out = false;
    loop {
        let msg = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, channel.wait()).await {
                Ok(msg) => msg,
                Err(_) => {
                    timed_out = true;
                    // Best effort: OpenSSH delivers the signal; closing the channel hangs up.
                    let _ = channel.signal(russh::Sig::KILL).await;
                    let _ = channel.close().await;
                    break;
                }
            },
            None => channel.wait().await,
        };
        match msg {
            None => break,
            Some(ChannelMsg::Data { data }) => out.push(&data, sink),
            Some(ChannelMsg::ExtendedData { data, ext: 1 }) => err.push(&data, sink),
            Some(ChannelMsg::ExitStatus { exit_status }) => exit_code = Some(i64::from(exit_status)),
            Some(_) => {}
        }
    }
    // The machine's own `timeout` (started before our clock) may end the command first: its
    // exit code 124 once the limit has passed is the same timeout, not the command's failure.
    if !timed_out && exit_code == Some(TIMEOUT_EXIT) && timeout.is_some_and(|t| started.elapsed() >= t) {
        timed_out = true;
    }
    Ok(ExecResult { exit_code: if timed_out { None } else { exit_code }, timed_out, stdout: out.finish(sink), stderr: err.finish(sink) })
}

/// What coreutils' `timeout` exits with when the limit ends the command.
const TIMEOUT_EXIT: i64 = 124;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_remote_shell() {
        assert_eq!(quote("echo"), "echo");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
        let request = ExecRequest {
            argv: vec!["nu".into(), "-c".into(), "print $env.X".into()],
            stdin: None,
            env: [("X".to_string(), "1 2".to_string())].into(),
            timeout: Duration::from_secs(1),
            output: None,
            ssh_key: None,
        };
        assert_eq!(build_command(&request, false).ok().as_deref(), Some("timeout -k 5 1s env 'X=1 2' nu -c 'print $env.X'"));
        let request = ExecRequest { timeout: Duration::from_millis(800), env: BTreeMap::new(), ..request };
        assert_eq!(build_command(&request, true).ok().as_deref(), Some("sudo -n -- timeout -k 5 0.8s nu -c 'print $env.X'"));
    }

    #[test]
    fn a_failed_sudo_probe_says_why() {
        let probe = |code: Option<i64>, stderr: &str| ExecResult {
            exit_code: code,
            timed_out: false,
            stdout: String::new(),
            stderr: stderr.into(),
        };
        assert_eq!(sudo_problem(&probe(Some(0), "")), None);
        let password = sudo_problem(&probe(Some(1), "sudo: a password is required\n")).unwrap_or_default();
        assert!(password.contains("sudo: a password is required") && password.contains("exit code 1"), "{password}");
        let missing = sudo_problem(&probe(Some(127), "sh: 1: sudo: not found")).unwrap_or_default();
        assert!(missing.contains("not installed"), "{missing}");
        let hung = ExecResult { timed_out: true, ..probe(None, "") };
        assert!(sudo_problem(&hung).is_some_and(|p| p.contains("did not finish")));
    }

    #[test]
    fn become_root_defaults_to_non_root_users() {
        let executor = |user: &str, become_root: Option<bool>| {
            let ssh = crate::SshSettings { user: user.into(), become_root, ..Default::default() };
            SshExecutor::new(&ProviderConfig { name: "acct".into(), ssh, ..Default::default() }, "admin").become_root
        };
        assert!(executor("", None), "the provider default user admin");
        assert!(executor("debian", None));
        assert!(!executor("root", None));
        assert!(!executor("root", Some(true)), "root needs no sudo");
        assert!(!executor("admin", Some(false)));
    }

    #[test]
    fn lines_are_streamed_and_captured() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut s = LineStream::default();
        s.push(b"one\ntw", Some(&tx));
        s.push(b"o\nthree", Some(&tx));
        let all = s.finish(Some(&tx));
        assert_eq!(all, "one\ntwo\nthree");
        let lines: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(lines, ["one", "two", "three"]);
    }

    #[test]
    fn unreadable_keys_are_named_not_quoted() {
        let err = public_key_of(&SshPrivateKey("-----BEGIN OPENSSH PRIVATE KEY-----\nbm90LWEta2V5LXMzY3JldA==\n".into()));
        let message = err.err().unwrap_or_default();
        assert!(message.contains("not a readable"), "{message}");
        assert!(!message.contains("bm90"), "{message}");
        assert!(same_key("ssh-ed25519 AAAA x@y", "ssh-ed25519 AAAA"));
        assert!(!same_key("ssh-ed25519 AAAA", "ssh-ed25519 AAAB"));
    }

    #[test]
    fn cloud_config_carries_the_login_key_and_the_generated_host_key() {
        let (private, public) = generate_host_key().expect("generate");
        assert_eq!(public_key_of(&private).expect("readable"), public);
        let host = crate::HostKey { private: private.clone(), public: public.clone() };
        let text = cloud_config(Some("ssh-ed25519 AAAALOGIN me"), Some(&host)).expect("config");
        assert!(text.starts_with("#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 AAAALOGIN me\n"), "{text}");
        assert!(text.contains("ssh_deletekeys: true\nssh_genkeytypes: []\n"), "{text}");
        assert!(text.contains(&format!("  ed25519_public: {public}\n")), "{text}");
        // The PEM is a block scalar: every line indented under ed25519_private.
        let block: Vec<&str> =
            text.lines().skip_while(|l| !l.starts_with("  ed25519_private: |")).skip(1).take_while(|l| l.starts_with("    ")).collect();
        assert_eq!(block.iter().map(|l| &l[4..]).collect::<Vec<_>>().join("\n"), private.0.trim_end());
        assert_eq!(cloud_config(None, None), None);
        assert!(!format!("{host:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn debug_hides_the_key() {
        let config = ProviderConfig {
            name: "acct".into(),
            credentials: crate::Credentials([("SSH_PRIVATE_KEY".to_string(), "not-a-key-s3cret".to_string())].into()),
            ..Default::default()
        };
        let exec = SshExecutor::new(&config, "root");
        let text = format!("{exec:?} {:?}", exec.key.as_ref().err());
        assert!(!text.contains("s3cret"), "{text}");
    }
}
