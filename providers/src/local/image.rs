//! `provisioning image build`: the node image of the local provider, made without any
//! container registry.
//!
//! debootstrap bootstraps a minimal Debian (variant minbase plus a few cheap run-time tools)
//! from the mirror the host's own apt configuration names, the files under
//! `providers/image/` are laid over it, package lists are fetched inside it (so task scripts
//! can `apt-get install` right away), and the tree is imported as `provisioning-node:<hash>`
//! and tagged `provisioning-node:latest`. The hash covers the whole recipe (suite, packages,
//! mirror, apt settings, overlay files, recipe version): a build whose tag exists is skipped.
//! debootstrap's package cache and a tarball of its result live under the data directory,
//! so a rebuild after a change of the overlay or apt settings skips debootstrap, and one
//! after a package change downloads only what changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{CreateImageOptions, TagImageOptions};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::Command;

use crate::ProviderError;

/// Progress lines of an image build (our own build's output, shown to whoever runs it).
pub type ProgressSink = tokio::sync::mpsc::UnboundedSender<String>;

/// Repository of the node image.
pub const NODE_IMAGE_REPO: &str = "provisioning-node";
/// The newest node image built on this machine (what the local provider runs).
pub const NODE_IMAGE_LATEST: &str = "provisioning-node:latest";
/// Label on the image holding its recipe hash.
pub const RECIPE_LABEL: &str = "provisioning.dev/node-image-recipe";
/// Debian suite of the node image.
pub const DEFAULT_SUITE: &str = "bookworm";
/// Packages on top of minbase: cheap tools services and scripts need at run time. Services
/// themselves are installed by task scripts.
pub const BASE_PACKAGES: [&str; 5] = ["ca-certificates", "procps", "iproute2", "curl", "netcat-openbsd"];

/// Bump when the build steps change in a way the recipe text does not show.
const RECIPE_VERSION: &str = "1";
const VARIANT: &str = "minbase";
/// Runs inside the rootfs as the last step.
const FINISH_SCRIPT: &str = include_str!("../../image/finish.sh");
/// Files laid over the bootstrapped rootfs: (path in the image, mode, content).
const OVERLAY: [(&str, u32, &str); 3] = [
    ("usr/sbin/policy-rc.d", 0o755, include_str!("../../image/overlay/usr/sbin/policy-rc.d")),
    ("etc/apt/apt.conf.d/01provisioning", 0o644, include_str!("../../image/overlay/etc/apt/apt.conf.d/01provisioning")),
    ("etc/dpkg/dpkg.cfg.d/01provisioning-nodoc", 0o644, include_str!("../../image/overlay/etc/dpkg/dpkg.cfg.d/01provisioning-nodoc")),
];
/// The only keyring a `Signed-By` may name in the image (debootstrap installs it).
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A failed image build, one variant per step.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The host's apt configuration could not be read.
    #[error("reading the host's apt configuration {path}: {source}")]
    AptConfig {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// No apt source of the host serves the suite.
    #[error("no apt source in {apt_dir} serves Debian {suite} (main); configure one on the host or pass a mirror")]
    NoMirror {
        /// The apt directory searched.
        apt_dir: PathBuf,
        /// The suite.
        suite: String,
    },
    /// The Docker engine failed or is unreachable.
    #[error("{0}")]
    Docker(#[from] ProviderError),
    /// Preparing files of the build failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A build command (debootstrap, chroot, tar) failed.
    #[error("{step} failed ({status}); last output:\n{tail}")]
    Command {
        /// Which command.
        step: &'static str,
        /// Its exit status, or why it did not run.
        status: String,
        /// The last lines it printed.
        tail: String,
    },
    /// The engine refused the rootfs tarball.
    #[error("importing the rootfs as {tag}: {message}")]
    Import {
        /// Target tag.
        tag: String,
        /// Engine message.
        message: String,
    },
}

impl ImageError {
    /// Whether running the build again may succeed without changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            ImageError::Docker(e) => e.is_retryable(),
            ImageError::Command { .. } | ImageError::Import { .. } => true,
            _ => false,
        }
    }
}

/// How to build the node image.
#[derive(Clone, Debug)]
pub struct NodeImageOptions {
    /// Where debootstrap's package cache and temporary build trees live.
    pub data_dir: PathBuf,
    /// Docker endpoint; empty for `DOCKER_HOST` or the local socket.
    pub docker_endpoint: String,
    /// Debian suite.
    pub suite: String,
    /// Packages beyond [`BASE_PACKAGES`].
    pub extra_packages: Vec<String>,
    /// Mirror URL; `None` to take the one the host's apt configuration uses.
    pub mirror: Option<String>,
    /// The host's apt configuration directory (`/etc/apt`).
    pub apt_dir: PathBuf,
    /// Rebuild even when the tag exists.
    pub force: bool,
    /// Where progress lines go (debootstrap's output among them).
    pub progress: Option<ProgressSink>,
}

impl Default for NodeImageOptions {
    fn default() -> Self {
        NodeImageOptions {
            data_dir: default_data_dir(),
            docker_endpoint: String::new(),
            suite: DEFAULT_SUITE.to_string(),
            extra_packages: Vec::new(),
            mirror: None,
            apt_dir: PathBuf::from("/etc/apt"),
            force: false,
            progress: None,
        }
    }
}

/// `$PROVISIONING_DATA_DIR`, else `$XDG_CACHE_HOME/provisioning`, else
/// `~/.cache/provisioning`, else `/var/tmp/provisioning`.
pub fn default_data_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("PROVISIONING_DATA_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("provisioning")))
        .or_else(|| env("HOME").map(|p| p.join(".cache").join("provisioning")))
        .unwrap_or_else(|| PathBuf::from("/var/tmp/provisioning"))
}

/// One apt source entry (deb822 paragraph or one-line `deb` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AptSource {
    /// Mirror URIs.
    pub uris: Vec<String>,
    /// Suites.
    pub suites: Vec<String>,
    /// Components.
    pub components: Vec<String>,
    /// Keyring path, if one was named.
    pub signed_by: Option<String>,
}

/// Parses a deb822 `.sources` file: binary (`deb`) entries that are not disabled.
pub fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for paragraph in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        let mut fields: BTreeMap<String, String> = BTreeMap::new();
        let mut last: Option<String> = None;
        for line in paragraph.lines() {
            if line.starts_with('#') {
                continue;
            }
            if line.starts_with(' ') || line.starts_with('\t') {
                if let Some(key) = &last {
                    let value = fields.entry(key.clone()).or_default();
                    value.push('\n');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                let key = key.trim().to_ascii_lowercase();
                fields.insert(key.clone(), value.trim().to_string());
                last = Some(key);
            }
        }
        let words =
            |k: &str| -> Vec<String> { fields.get(k).map(|v| v.split_whitespace().map(str::to_string).collect()).unwrap_or_default() };
        let enabled = fields.get("enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        if !enabled || !words("types").iter().any(|t| t == "deb") {
            continue;
        }
        let signed_by = fields.get("signed-by").filter(|v| !v.contains('\n') && v.starts_with('/')).cloned();
        sources.push(AptSource { uris: words("uris"), suites: words("suites"), components: words("components"), signed_by });
    }
    sources
}

/// Parses a one-line `.list` file: `deb [options] uri suite component…` lines.
pub fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for line in text.lines().map(|l| l.split('#').next().unwrap_or("").trim()) {
        let Some(rest) = line.strip_prefix("deb ").or_else(|| line.strip_prefix("deb\t")) else {
            continue;
        };
        let mut rest = rest.trim_start();
        let mut signed_by = None;
        if let Some(options) = rest.strip_prefix('[') {
            let Some((options, after)) = options.split_once(']') else { continue };
            for option in options.split_whitespace() {
                if let Some(path) = option.strip_prefix("signed-by=") {
                    signed_by = Some(path.to_string());
                }
            }
            rest = after.trim_start();
        }
        let mut words = rest.split_whitespace().map(str::to_string);
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else { continue };
        sources.push(AptSource { uris: vec![uri], suites: vec![suite], components: words.collect(), signed_by });
    }
    sources
}

/// Reads the host's apt sources (`sources.list`, `sources.list.d/*.list|*.sources`).
pub fn host_apt_sources(apt_dir: &Path) -> Result<Vec<AptSource>, ImageError> {
    let read = |path: &Path| std::fs::read_to_string(path).map_err(|source| ImageError::AptConfig { path: path.to_path_buf(), source });
    let mut sources = Vec::new();
    let main_list = apt_dir.join("sources.list");
    if main_list.exists() {
        sources.extend(parse_one_line(&read(&main_list)?));
    }
    for path in sorted_entries(&apt_dir.join("sources.list.d"))? {
        match path.extension().and_then(|e| e.to_str()) {
            Some("list") => sources.extend(parse_one_line(&read(&path)?)),
            Some("sources") => sources.extend(parse_deb822(&read(&path)?)),
            _ => {} // disabled or foreign files
        }
    }
    Ok(sources)
}

/// Single-line `Acquire::…;` settings of the host's apt configuration (validity checks
/// against a snapshot mirror, proxies): the image needs them to reach the same mirror.
pub fn host_acquire_settings(apt_dir: &Path) -> Result<Vec<String>, ImageError> {
    let mut files = Vec::new();
    let main = apt_dir.join("apt.conf");
    if main.exists() {
        files.push(main);
    }
    files.extend(sorted_entries(&apt_dir.join("apt.conf.d"))?);
    let mut settings = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| ImageError::AptConfig { path: path.clone(), source })?;
        for line in text.lines().map(str::trim) {
            if line.starts_with("Acquire::") && line.ends_with(';') && !settings.iter().any(|s| s == line) {
                settings.push(line.to_string());
            }
        }
    }
    Ok(settings)
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, ImageError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let entries = std::fs::read_dir(dir).map_err(|source| ImageError::AptConfig { path: dir.to_path_buf(), source })?;
    let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    paths.sort();
    Ok(paths)
}

/// Everything that determines the node image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeImageRecipe {
    /// Debian suite.
    pub suite: String,
    /// Packages on top of minbase, sorted.
    pub packages: Vec<String>,
    /// Mirror debootstrap downloads from.
    pub mirror: String,
    /// The image's `/etc/apt/sources.list.d/provisioning.sources`.
    pub apt_sources: String,
    /// The image's `/etc/apt/apt.conf.d/90provisioning-host`.
    pub apt_settings: String,
}

impl NodeImageRecipe {
    /// The recipe for `opts`, reading the mirror and apt settings from the host.
    pub fn from_host(opts: &NodeImageOptions) -> Result<Self, ImageError> {
        let suite = opts.suite.clone();
        let family = |s: &str| s == suite || s.strip_prefix(suite.as_str()).is_some_and(|r| r.starts_with(['-', '/']));
        let (mirror, entries) = match &opts.mirror {
            Some(mirror) => {
                let entry = |suites: Vec<String>| AptSource {
                    uris: vec![mirror.clone()],
                    suites,
                    components: vec!["main".into()],
                    signed_by: None,
                };
                (mirror.clone(), vec![entry(vec![suite.clone(), format!("{suite}-updates")])])
            }
            None => {
                let sources = host_apt_sources(&opts.apt_dir)?;
                let mirror = sources
                    .iter()
                    .find(|s| s.suites.contains(&suite) && s.components.iter().any(|c| c == "main"))
                    .and_then(|s| s.uris.first().cloned())
                    .ok_or_else(|| ImageError::NoMirror { apt_dir: opts.apt_dir.clone(), suite: suite.clone() })?;
                let entries = sources
                    .into_iter()
                    .filter_map(|mut s| {
                        s.suites.retain(|x| family(x));
                        s.components.retain(|c| c == "main");
                        (!s.suites.is_empty() && !s.components.is_empty()).then_some(s)
                    })
                    .collect();
                (mirror, entries)
            }
        };
        let apt_sources = entries
            .iter()
            .map(|s| {
                let mut text = format!(
                    "Types: deb\nURIs: {}\nSuites: {}\nComponents: {}\n",
                    s.uris.join(" "),
                    s.suites.join(" "),
                    s.components.join(" ")
                );
                // Other keyrings do not exist in the image; without Signed-By apt uses the
                // Debian keys in trusted.gpg.d.
                if s.signed_by.as_deref() == Some(DEBIAN_KEYRING) {
                    text.push_str(&format!("Signed-By: {DEBIAN_KEYRING}\n"));
                }
                text
            })
            .collect::<Vec<_>>()
            .join("\n");
        let mut settings = if opts.mirror.is_some() { Vec::new() } else { host_acquire_settings(&opts.apt_dir)? };
        settings.insert(0, "// From the apt configuration of the host that built this image.".to_string());
        let mut packages: Vec<String> = BASE_PACKAGES.iter().map(|p| p.to_string()).chain(opts.extra_packages.iter().cloned()).collect();
        packages.sort();
        packages.dedup();
        Ok(NodeImageRecipe { suite, packages, mirror, apt_sources, apt_settings: settings.join("\n") + "\n" })
    }

    /// The recipe as one canonical text (what the hash covers).
    pub fn canonical(&self) -> String {
        let mut text = format!(
            "recipe-version {RECIPE_VERSION}\nsuite {}\nvariant {VARIANT}\npackages {}\nmirror {}\n",
            self.suite,
            self.packages.join(","),
            self.mirror
        );
        text.push_str(&format!("--- sources\n{}--- apt settings\n{}", self.apt_sources, self.apt_settings));
        for (path, mode, content) in OVERLAY {
            text.push_str(&format!("--- {path} {mode:o}\n{content}"));
        }
        text.push_str(&format!("--- finish.sh\n{FINISH_SCRIPT}"));
        text
    }

    /// What debootstrap's result depends on (suite, variant, packages, mirror).
    pub fn base_hash(&self) -> String {
        let base = format!("{} {VARIANT} {} {}", self.suite, self.packages.join(","), self.mirror);
        format!("{:016x}", fnv1a64(base.as_bytes()))
    }

    /// 12 hex digits identifying the recipe.
    pub fn hash(&self) -> String {
        format!("{:016x}", fnv1a64(self.canonical().as_bytes()))[..12].to_string()
    }

    /// `provisioning-node:<hash>`.
    pub fn tag(&self) -> String {
        format!("{NODE_IMAGE_REPO}:{}", self.hash())
    }
}

/// FNV-1a, 64 bit: a stable, dependency-free hash for names and recipe ids (not security).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Whether the engine has `tag`.
pub async fn node_image_exists(docker: &Docker, tag: &str) -> Result<bool, ImageError> {
    match docker.inspect_image(tag).await {
        Ok(_) => Ok(true),
        Err(e) if super::docker::status_of(&e) == Some(404) => Ok(false),
        Err(e) => Err(ImageError::Docker(super::docker::classify("inspect image", e))),
    }
}

/// Builds the node image unless its tag exists; returns `provisioning-node:<hash>`, which
/// is also tagged `provisioning-node:latest`. Several callers (processes) may race: one
/// builds under a lock file in the data directory, the others then find the tag.
pub async fn build_node_image(opts: &NodeImageOptions) -> Result<String, ImageError> {
    let recipe = NodeImageRecipe::from_host(opts)?;
    let tag = recipe.tag();
    let docker = super::docker::connect(&opts.docker_endpoint).await?;
    let progress = Progress(opts.progress.clone());
    if !opts.force && node_image_exists(&docker, &tag).await? {
        progress.say(format!("node image {tag} exists (recipe unchanged); nothing to build"));
        tag_latest(&docker, &tag).await?;
        return Ok(tag);
    }
    std::fs::create_dir_all(&opts.data_dir).map_err(|source| ImageError::Io {
        what: "creating the data directory",
        path: opts.data_dir.clone(),
        source,
    })?;
    let _lock = BuildLock::acquire(&opts.data_dir.join("node-image.lock"), &progress).await?;
    if !opts.force && node_image_exists(&docker, &tag).await? {
        progress.say(format!("node image {tag} was built meanwhile"));
        tag_latest(&docker, &tag).await?;
        return Ok(tag);
    }
    let work = BuildDir::create(&opts.data_dir)?;
    let rootfs = work.path.join("rootfs");
    let cache = opts.data_dir.join("debootstrap-cache").join(&recipe.suite);
    std::fs::create_dir_all(&cache).map_err(|source| ImageError::Io { what: "creating the package cache", path: cache.clone(), source })?;

    bootstrap(&recipe, &rootfs, &cache, &opts.data_dir.join("rootfs-cache"), &progress).await?;

    progress.say("configuring the rootfs".to_string());
    write_file(&rootfs, "etc/apt/sources.list.d/provisioning.sources", 0o644, &recipe.apt_sources)?;
    write_file(&rootfs, "etc/apt/apt.conf.d/90provisioning-host", 0o644, &recipe.apt_settings)?;
    for (path, mode, content) in OVERLAY {
        write_file(&rootfs, path, mode, content)?;
    }
    write_file(&rootfs, "tmp/provisioning-finish.sh", 0o755, FINISH_SCRIPT)?;
    let mut finish = Command::new("chroot");
    finish.arg(&rootfs).args(["/bin/sh", "/tmp/provisioning-finish.sh"]);
    run_logged("configuring the rootfs (chroot)", &mut finish, &progress).await?;
    let script = rootfs.join("tmp/provisioning-finish.sh");
    std::fs::remove_file(&script).map_err(|source| ImageError::Io { what: "removing", path: script, source })?;

    progress.say(format!("importing the rootfs as {tag}"));
    let mut replaced = Vec::new();
    for existing in [tag.as_str(), NODE_IMAGE_LATEST] {
        if let Some(id) = docker.inspect_image(existing).await.ok().and_then(|i| i.id) {
            replaced.push(id);
        }
    }
    import_rootfs(&docker, &rootfs, &recipe, &progress).await?;
    tag_latest(&docker, &tag).await?;
    remove_untagged(&docker, &replaced).await;
    progress.say(format!("built {tag} (also {NODE_IMAGE_LATEST})"));
    Ok(tag)
}

/// Fills `rootfs` with the bootstrapped system: from the saved tarball of an earlier
/// debootstrap with the same suite, packages and mirror (seconds), else by running
/// debootstrap (about a minute) and saving its result for next time. Only the newest
/// tarball is kept.
async fn bootstrap(
    recipe: &NodeImageRecipe,
    rootfs: &Path,
    package_cache: &Path,
    rootfs_cache: &Path,
    progress: &Progress,
) -> Result<(), ImageError> {
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ImageError::Io { what, path, source }
    };
    let saved = rootfs_cache.join(format!("{}.tar", recipe.base_hash()));
    if saved.is_file() {
        progress.say(format!("unpacking the bootstrapped Debian {} saved in {}", recipe.suite, saved.display()));
        std::fs::create_dir_all(rootfs).map_err(io("creating", rootfs))?;
        let mut untar = Command::new("tar");
        untar.arg("--numeric-owner").arg("-xpf").arg(&saved).arg("-C").arg(rootfs);
        return run_logged("unpacking the saved rootfs (tar)", &mut untar, progress).await;
    }
    progress.say(format!("bootstrapping Debian {} ({VARIANT}) from {}", recipe.suite, recipe.mirror));
    let mut debootstrap = Command::new("debootstrap");
    debootstrap
        .arg(format!("--variant={VARIANT}"))
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(format!("--cache-dir={}", package_cache.display()))
        .arg(&recipe.suite)
        .arg(rootfs)
        .arg(&recipe.mirror);
    run_logged("debootstrap", &mut debootstrap, progress).await?;

    // Saving is an optimisation: failing to save does not fail the build.
    let partial = rootfs_cache.join(format!(".{}.tar.partial", uuid::Uuid::new_v4().simple()));
    let save = async {
        std::fs::create_dir_all(rootfs_cache).map_err(io("creating", rootfs_cache))?;
        let mut tar = Command::new("tar");
        tar.arg("--numeric-owner").arg("-cf").arg(&partial).arg("-C").arg(rootfs).arg(".");
        run_logged("saving the bootstrapped rootfs (tar)", &mut tar, progress).await?;
        std::fs::rename(&partial, &saved).map_err(io("renaming", &partial))?;
        for old in sorted_entries(rootfs_cache).unwrap_or_default() {
            if old != saved {
                let _ = std::fs::remove_file(old);
            }
        }
        Ok::<(), ImageError>(())
    };
    if let Err(e) = save.await {
        let _ = std::fs::remove_file(&partial);
        progress.say(format!("could not save the bootstrapped rootfs for later builds: {e}"));
    }
    Ok(())
}

/// `tar` of the rootfs streamed into the engine's image import (`docker import`).
async fn import_rootfs(docker: &Docker, rootfs: &Path, recipe: &NodeImageRecipe, progress: &Progress) -> Result<(), ImageError> {
    let tag = recipe.tag();
    let mut tar = Command::new("tar");
    tar.arg("--numeric-owner").arg("-C").arg(rootfs).args(["-cf", "-", "."]);
    tar.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child =
        tar.spawn().map_err(|e| ImageError::Command { step: "tar", status: format!("could not start: {e}"), tail: String::new() })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ImageError::Command { step: "tar", status: "no pipes".into(), tail: String::new() });
    };
    let body = futures::stream::unfold(stdout, |mut out| async move {
        let mut buf = vec![0u8; 256 << 10];
        match out.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), out))
            }
            Err(e) => Some((Err(e), out)),
        }
    });
    let stderr_tail = tokio::spawn(collect_tail(stderr, progress.clone()));
    let options = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(NODE_IMAGE_REPO.into()),
        tag: Some(recipe.hash()),
        message: Some(format!("provisioning node image, Debian {}", recipe.suite)),
        changes: vec![
            r#"CMD ["sleep", "infinity"]"#.to_string(),
            "ENV LANG=C.UTF-8".to_string(),
            format!("LABEL {RECIPE_LABEL}={}", recipe.hash()),
        ],
        ..Default::default()
    };
    let mut answers = docker.create_image(Some(options), Some(bollard::body_try_stream(body)), None);
    let mut failure = None;
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(info) => {
                if let Some(status) = info.status.filter(|s| !s.is_empty()) {
                    progress.say(status);
                }
            }
            Err(e) => failure = Some(e.to_string()),
        }
    }
    let status = child.wait().await.map_err(|e| ImageError::Command { step: "tar", status: e.to_string(), tail: String::new() })?;
    let tail = stderr_tail.await.unwrap_or_default();
    if !status.success() {
        return Err(ImageError::Command { step: "tar", status: status.to_string(), tail });
    }
    if let Some(message) = failure {
        return Err(ImageError::Import { tag, message });
    }
    match node_image_exists(docker, &tag).await? {
        true => Ok(()),
        false => Err(ImageError::Import { tag, message: "the engine reported no error but has no such image".into() }),
    }
}

/// Removes images this build replaced when nothing tags or runs them any more (the engine
/// refuses otherwise, which is fine).
async fn remove_untagged(docker: &Docker, ids: &[String]) {
    for id in ids {
        let untagged = docker.inspect_image(id).await.is_ok_and(|i| i.repo_tags.unwrap_or_default().is_empty());
        if untagged {
            let options = bollard::query_parameters::RemoveImageOptions { force: false, noprune: false, ..Default::default() };
            if let Err(e) = docker.remove_image(id, Some(options), None).await {
                tracing::debug!(image = %id, error = %e, "replaced node image kept (still in use)");
            }
        }
    }
}

async fn tag_latest(docker: &Docker, tag: &str) -> Result<(), ImageError> {
    let options = TagImageOptions { repo: Some(NODE_IMAGE_REPO.into()), tag: Some("latest".into()) };
    docker.tag_image(tag, Some(options)).await.map_err(|e| ImageError::Docker(super::docker::classify("tag image", e)))
}

/// Progress lines to the caller's sink, or to the log when there is none (once, not both:
/// `provisioning image build` prints the sink and logs at info).
#[derive(Clone)]
struct Progress(Option<ProgressSink>);

impl Progress {
    fn say(&self, line: String) {
        match &self.0 {
            // Nobody listening any more is not a build failure.
            Some(sink) => {
                let _ = sink.send(line);
            }
            None => tracing::info!(target: "provisioning::image", "{line}"),
        }
    }
}

/// Runs a build command, streaming its output as progress; a failure carries its last lines.
async fn run_logged(step: &'static str, command: &mut Command, progress: &Progress) -> Result<(), ImageError> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| ImageError::Command {
        step,
        status: format!("could not start: {e} (debootstrap and chroot must be installed; scripts/setup.sh installs them)"),
        tail: String::new(),
    })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ImageError::Command { step, status: "no pipes".into(), tail: String::new() });
    };
    let out = tokio::spawn(collect_tail(stdout, progress.clone()));
    let err = tokio::spawn(collect_tail(stderr, progress.clone()));
    let status = child.wait().await.map_err(|e| ImageError::Command { step, status: e.to_string(), tail: String::new() })?;
    let tail = [out.await.unwrap_or_default(), err.await.unwrap_or_default()].join("\n");
    if status.success() { Ok(()) } else { Err(ImageError::Command { step, status: status.to_string(), tail }) }
}

/// Forwards lines as progress and returns the last 30.
async fn collect_tail(reader: impl AsyncRead + Unpin, progress: Progress) -> String {
    let mut lines = BufReader::new(reader).lines();
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    while let Ok(Some(line)) = lines.next_line().await {
        progress.say(line.clone());
        if tail.len() == 30 {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    Vec::from(tail).join("\n")
}

fn write_file(root: &Path, relative: &str, mode: u32, content: &str) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    let path = root.join(relative);
    let io = |what: &'static str, path: &Path, source| ImageError::Io { what, path: path.to_path_buf(), source };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
    }
    std::fs::write(&path, content).map_err(|e| io("writing", &path, e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(|e| io("setting the mode of", &path, e))
}

/// An exclusive lock on a file, held across processes until dropped.
struct BuildLock(#[allow(dead_code)] std::fs::File);

impl BuildLock {
    async fn acquire(path: &Path, progress: &Progress) -> Result<Self, ImageError> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|source| ImageError::Io {
            what: "opening the lock file",
            path: path.to_path_buf(),
            source,
        })?;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(BuildLock(file)),
                Err(std::fs::TryLockError::WouldBlock) => {
                    progress.say("another build of the node image is running; waiting for it".into());
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(ImageError::Io { what: "locking", path: path.to_path_buf(), source });
                }
            }
        }
    }
}

/// A temporary build tree under the data directory, removed when dropped — but never while
/// anything is mounted inside it (a failed debootstrap can leave /proc or /sys mounted, and
/// deleting through them would reach the host).
struct BuildDir {
    path: PathBuf,
}

impl BuildDir {
    fn create(data_dir: &Path) -> Result<Self, ImageError> {
        let path = data_dir.join(format!("build-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).map_err(|source| ImageError::Io {
            what: "creating the build directory",
            path: path.clone(),
            source,
        })?;
        Ok(BuildDir { path })
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        let mounted = || mounts_under(&self.path);
        for mount in mounted() {
            let _ = std::process::Command::new("umount").arg("-l").arg(&mount).status();
        }
        let left = mounted();
        if !left.is_empty() {
            tracing::error!(dir = %self.path.display(), ?left, "not removing the build directory: mounts remain inside");
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(dir = %self.path.display(), error = %e, "could not remove the build directory");
        }
    }
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mounts") else { return Vec::new() };
    let mut found: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
Types: deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n\n\
Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
Types: deb\nEnabled: no\nURIs: http://off.example/\nSuites: bookworm\nComponents: main\n";

    #[test]
    fn deb822_sources_parse() {
        let sources = parse_deb822(DEB822);
        assert_eq!(sources.len(), 2, "{sources:?}");
        assert_eq!(sources[0].uris, ["http://mirror.example/debian"]);
        assert_eq!(sources[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(sources[0].signed_by.as_deref(), Some(DEBIAN_KEYRING));
        assert_eq!(sources[1].suites, ["bookworm-security"]);
    }

    #[test]
    fn one_line_sources_parse() {
        let text = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main\n\
deb-src http://m.example/debian bookworm main\ndeb http://m.example/debian bookworm-updates main # trailing\n";
        let sources = parse_one_line(text);
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].signed_by.as_deref(), Some("/k.gpg"));
        assert_eq!(sources[1].suites, ["bookworm-updates"]);
        assert_eq!(sources[1].components, ["main"]);
    }

    fn apt_dir(sources: &str, conf: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("sources.list.d")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("apt.conf.d")).expect("mkdir");
        std::fs::write(dir.path().join("sources.list.d/debian.sources"), sources).expect("write");
        std::fs::write(dir.path().join("sources.list.d/other.list.disabled"), "deb http://x.example/ y main").expect("w");
        std::fs::write(dir.path().join("apt.conf.d/99snapshot"), conf).expect("write");
        dir
    }

    #[test]
    fn recipe_comes_from_the_host_and_hash_follows_it() {
        let dir = apt_dir(DEB822, "Acquire::Check-Valid-Until \"false\";\nAPT::Other \"x\";\n");
        let opts = NodeImageOptions { apt_dir: dir.path().to_path_buf(), ..Default::default() };
        let recipe = NodeImageRecipe::from_host(&opts).expect("recipe");
        assert_eq!(recipe.mirror, "http://mirror.example/debian");
        assert!(recipe.apt_sources.contains("Suites: bookworm bookworm-updates\nComponents: main\n"), "{}", recipe.apt_sources);
        assert!(recipe.apt_sources.contains("bookworm-security"));
        assert!(!recipe.apt_sources.contains("off.example") && !recipe.apt_sources.contains("x.example"));
        assert!(recipe.apt_settings.contains("Acquire::Check-Valid-Until \"false\";"));
        assert!(!recipe.apt_settings.contains("APT::Other"));
        assert!(recipe.packages.contains(&"ca-certificates".to_string()));
        let tag = recipe.tag();
        assert!(tag.starts_with("provisioning-node:") && tag.len() == "provisioning-node:".len() + 12, "{tag}");
        assert_eq!(NodeImageRecipe::from_host(&opts).expect("again").tag(), tag, "stable");

        let more = NodeImageOptions { extra_packages: vec!["less".into()], ..opts.clone() };
        assert_ne!(NodeImageRecipe::from_host(&more).expect("more").tag(), tag, "packages change the tag");
        let moved = apt_dir(&DEB822.replace("mirror.example", "other.example"), "");
        let moved = NodeImageOptions { apt_dir: moved.path().to_path_buf(), ..opts };
        assert_ne!(NodeImageRecipe::from_host(&moved).expect("moved").tag(), tag, "mirror changes the tag");
    }

    #[test]
    fn no_source_for_the_suite_is_a_clear_error() {
        let dir = apt_dir("Types: deb\nURIs: http://u.example/ubuntu\nSuites: noble\nComponents: main\n", "");
        let opts = NodeImageOptions { apt_dir: dir.path().to_path_buf(), ..Default::default() };
        let err = NodeImageRecipe::from_host(&opts).expect_err("no bookworm");
        assert!(matches!(err, ImageError::NoMirror { .. }), "{err}");
        assert!(err.to_string().contains("bookworm"));
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
