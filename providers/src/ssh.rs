//! SSH `exec` for cloud machines (aws, upcloud).
//!
//! - The private key is a credential (`SSH_PRIVATE_KEY` in the account's Secret); it never
//!   appears in errors or `Debug` output.
//! - The host key is pinned per machine (by provider id, not by address: cloud addresses
//!   are reused) on first contact, kept in a file under the provider's state directory, and
//!   exposed so the controller can store it in `status.hostKey`. A changed key is refused.
//! - Before the first command, the configured assets (the `nu` binary, task scripts) are
//!   copied over, once per content hash: a marker file on the machine records the hash.
//! - Output is streamed line by line to `ExecRequest::output`, bounded and escaped (see
//!   [`crate::output`]: a machine is outside input); a timeout returns
//!   `ExecResult { timed_out: true, .. }`. Every command over SSH has a deadline, also the
//!   asset copy's own (`cat` of the marker, the copy, the marker write): a machine that
//!   never answers or streams forever costs a bounded time and memory. Every command runs under the machine's own
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

use crate::output::{LineStream, escape_controls};
use crate::{ExecRequest, ExecResult, OutputSink, ProviderConfig, ProviderError, ProviderResult, SshAsset, SshPrivateKey};

const DEFAULT_MARKER: &str = "/var/lib/provisioning/assets.sha256";
/// How long a command may ignore the TERM of its time limit before `timeout(1)` kills it.
const KILL_AFTER_SECS: u32 = 5;
/// Time an asset copy gets at least, plus a second per [`ASSET_COPY_RATE`] bytes.
const ASSET_COPY_MIN: Duration = Duration::from_secs(60);
/// Slowest transfer an asset copy is allowed (bytes per second).
const ASSET_COPY_RATE: u64 = 256 << 10;

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
        let result = run(session, command, request.stdin.as_deref(), request.output.as_ref(), request.timeout).await?;
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
        let probe = run(session, "command -v sudo >/dev/null 2>&1 || exit 127; sudo -n true", None, None, self.connect_timeout).await?;
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

    /// Runs one step of the asset copy within `limit`; running out of time is an error
    /// naming the step and its command.
    async fn asset_step(
        &self,
        session: &client::Handle<HostKeyCheck>,
        machine: &str,
        script: &str,
        stdin: Option<&[u8]>,
        limit: Duration,
    ) -> ProviderResult<ExecResult> {
        let command = self.as_root(script);
        let result = run(session, &command, stdin, None, limit).await?;
        if result.timed_out {
            return Err(ProviderError::Transient(format!(
                "preparing machine {machine}: `{}` did not finish within {limit:?}",
                escape_controls(&command)
            )));
        }
        Ok(result)
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
        let read_marker = format!("cat {marker} 2>/dev/null || true");
        let current = self.asset_step(session, machine, &read_marker, None, self.connect_timeout).await?;
        if current.stdout.trim() != hash {
            for asset in &self.assets {
                let content = tokio::fs::read(&asset.local)
                    .await
                    .map_err(|e| ProviderError::Permanent(format!("cannot read asset {}: {e}", asset.local.display())))?;
                let remote = quote(&asset.remote);
                let tmp = quote(&format!("{}.provisioning-tmp", asset.remote));
                let copy =
                    format!("mkdir -p \"$(dirname {remote})\" && cat > {tmp} && chmod {:o} {tmp} && mv -f {tmp} {remote}", asset.mode);
                let limit = ASSET_COPY_MIN + Duration::from_secs(content.len() as u64 / ASSET_COPY_RATE);
                let copied = self.asset_step(session, machine, &copy, Some(&content), limit).await?;
                if copied.exit_code != Some(0) {
                    return Err(ProviderError::Transient(format!(
                        "copying {} to machine {machine} failed: {}",
                        asset.remote,
                        excerpt(&copied.stderr)
                    )));
                }
            }
            let write_marker = format!("mkdir -p \"$(dirname {marker})\" && printf %s {hash} > {marker}");
            let written = self.asset_step(session, machine, &write_marker, None, self.connect_timeout).await?;
            if written.exit_code != Some(0) {
                return Err(ProviderError::Transient(format!(
                    "recording assets on machine {machine} failed: {}",
                    excerpt(&written.stderr)
                )));
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
            let said = escape_controls(&said);
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

/// What a machine said (stderr) in an error message: the last 300 characters of its last
/// non-empty line, control characters escaped (errors reach status and events).
fn excerpt(text: &str) -> String {
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("");
    let start = line.char_indices().rev().nth(299).map_or(0, |(i, _)| i);
    escape_controls(&line[start..]).into_owned()
}

/// The messages of a command's channel, and hanging it up (a trait so that the deadline and
/// the bounds of [`collect`] are tested without a machine).
trait Messages {
    fn next_message(&mut self) -> impl std::future::Future<Output = Option<ChannelMsg>> + Send;
    fn hang_up(&mut self) -> impl std::future::Future<Output = ()> + Send;
}

impl Messages for russh::Channel<client::Msg> {
    async fn next_message(&mut self) -> Option<ChannelMsg> {
        self.wait().await
    }

    async fn hang_up(&mut self) {
        // Best effort: OpenSSH delivers the signal; closing the channel hangs up. Bounded:
        // a session that does not take the messages any more must not hold us either.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = self.signal(russh::Sig::KILL).await;
            let _ = self.close().await;
        })
        .await;
    }
}

/// What a command's channel carried until it closed or the deadline passed.
struct Collected {
    out: LineStream,
    err: LineStream,
    exit_code: Option<i64>,
    timed_out: bool,
}

/// Reads a command's messages until the channel closes or `deadline` passes (then the
/// command is hung up and `timed_out` set). Output is kept and streamed bounded.
async fn collect(channel: &mut impl Messages, deadline: tokio::time::Instant, sink: Option<&OutputSink>) -> Collected {
    let mut collected = Collected { out: LineStream::default(), err: LineStream::default(), exit_code: None, timed_out: false };
    loop {
        let Ok(msg) = tokio::time::timeout_at(deadline, channel.next_message()).await else {
            collected.timed_out = true;
            channel.hang_up().await;
            break;
        };
        match msg {
            None => break,
            Some(ChannelMsg::Data { data }) => collected.out.push(&data, sink),
            Some(ChannelMsg::ExtendedData { data, ext: 1 }) => collected.err.push(&data, sink),
            Some(ChannelMsg::ExitStatus { exit_status }) => collected.exit_code = Some(i64::from(exit_status)),
            Some(_) => {}
        }
    }
    collected
}

/// Runs one command on an open session; all of it (opening the channel, sending stdin,
/// reading the output) ends by `timeout`.
async fn run(
    session: &client::Handle<HostKeyCheck>,
    command: &str,
    stdin: Option<&[u8]>,
    sink: Option<&OutputSink>,
    timeout: Duration,
) -> ProviderResult<ExecResult> {
    let io = |e: russh::Error| ProviderError::Transient(format!("SSH channel: {e}"));
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let timed_out = || ExecResult { exit_code: None, timed_out: true, stdout: String::new(), stderr: String::new() };
    let Ok(opened) = tokio::time::timeout_at(deadline, session.channel_open_session()).await else {
        return Ok(timed_out());
    };
    let mut channel = opened.map_err(io)?;
    let send = async {
        channel.exec(true, command).await?;
        if let Some(bytes) = stdin {
            channel.data(bytes).await?;
        }
        channel.eof().await
    };
    match tokio::time::timeout_at(deadline, send).await {
        Ok(sent) => sent.map_err(io)?,
        Err(_) => {
            // A machine that does not read its stdin (a full window) holds no one past the deadline.
            channel.hang_up().await;
            return Ok(timed_out());
        }
    }
    let Collected { mut out, mut err, exit_code, mut timed_out } = collect(&mut channel, deadline, sink).await;
    // The machine's own `timeout` (started before our clock) may end the command first: its
    // exit code 124 once the limit has passed is the same timeout, not the command's failure.
    if !timed_out && exit_code == Some(TIMEOUT_EXIT) && started.elapsed() >= timeout {
        timed_out = true;
    }
    let (stdout, stderr) = (out.finish(sink), err.finish(sink));
    if let Some(sink) = sink {
        sink.finish();
    }
    Ok(ExecResult { exit_code: if timed_out { None } else { exit_code }, timed_out, stdout, stderr })
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

    /// A command that never ends and never says anything.
    struct Silent {
        hung_up: bool,
    }

    impl Messages for Silent {
        async fn next_message(&mut self) -> Option<ChannelMsg> {
            if self.hung_up { None } else { std::future::pending().await }
        }
        async fn hang_up(&mut self) {
            self.hung_up = true;
        }
    }

    /// A command that floods short lines (and a line without end on stderr) until hung up.
    struct Flood {
        chunks: u64,
        hung_up: bool,
    }

    impl Messages for Flood {
        async fn next_message(&mut self) -> Option<ChannelMsg> {
            if self.hung_up {
                return None;
            }
            tokio::task::yield_now().await;
            self.chunks += 1;
            Some(if self.chunks.is_multiple_of(2) {
                ChannelMsg::Data { data: bytes::Bytes::from_static(b"flood\nflood\nflood\n") }
            } else {
                ChannelMsg::ExtendedData { data: bytes::Bytes::from(vec![b'x'; 32 << 10]), ext: 1 }
            })
        }
        async fn hang_up(&mut self) {
            self.hung_up = true;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_that_never_ends_is_hung_up_at_its_deadline() {
        let mut channel = Silent { hung_up: false };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
        let collected = collect(&mut channel, deadline, None).await;
        assert!(collected.timed_out && channel.hung_up);
        assert_eq!(collected.exit_code, None);
        assert_eq!(tokio::time::Instant::now(), deadline);
    }

    #[tokio::test]
    async fn a_flood_costs_bounded_memory_and_ends_at_the_deadline() {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let sink = OutputSink::new(tx);
        let mut channel = Flood { chunks: 0, hung_up: false };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        let mut collected = collect(&mut channel, deadline, Some(&sink)).await;
        assert!(collected.timed_out && channel.hung_up);
        // A stderr line without end stays cut, and the queue nobody reads stays at 8.
        assert!(channel.chunks > 100, "{}", channel.chunks);
        assert_eq!(rx.len(), 8);
        assert!(sink.dropped() > 0);
        assert!(collected.err.held() <= (4 << 20) + (128 << 10), "{}", collected.err.held());
        assert!(collected.err.finish(None).len() <= 4 << 20);
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
