//! `provisioning test SERVICE|TEMPLATE`: a throwaway test environment. Creates the topology
//! (a one-server Cluster for a service, or a rendered Cluster template) on the local provider
//! in a generated namespace, waits for Ready and healthy, has every service's check run again,
//! prints a report (and JUnit XML), and removes everything unless `--keep` — also on failure,
//! Ctrl-C and SIGTERM.
//!
//! Self-contained like `provisioning dev`: by default the embedded control plane and the
//! controller run in this process on a temporary data dir; `--kubeconfig` uses an existing
//! API server and the controller already serving it instead.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};
use provisioning_crds::{Cluster, Server, TaskServ};
use provisioning_taskservs::{Catalog, TemplateLibrary};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use provisioning_controller::client;
use provisioning_controller::config::ControllerConfig;
use provisioning_controller::metrics::{Metrics, ScriptLabels};

use crate::dev;

/// `println!` that ignores a closed stdout: the report is lost then, the cleanup must not be
/// (`println!` panics on a broken pipe, e.g. `provisioning test x | head -1`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`say!`] for stderr.
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Label on the Namespace of a test environment (its value: what is tested).
pub const TEST_LABEL: &str = "provisioning.dev/test";
/// Health-check interval of the embedded controller: checks run again this soon after Ready.
pub const RECHECK_INTERVAL_SECS: u64 = 5;
/// How long an object may stay Stalled before the test stops waiting for it.
const STALLED_GRACE: Duration = Duration::from_secs(30);
/// How long removal may take before what is left is reported.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(300);

/// Options of `provisioning test`.
#[derive(Clone, Debug)]
pub struct TestOptions {
    /// A catalog service or a Cluster template.
    pub target: String,
    /// Template parameters (`NAME=VALUE`).
    pub sets: Vec<String>,
    /// Leave everything in place.
    pub keep: bool,
    /// Where to write JUnit XML.
    pub junit: Option<PathBuf>,
    /// Limit for reaching Ready and healthy (removal has its own).
    pub timeout: Duration,
    /// Use this API server (and its controller) instead of the embedded ones.
    pub kubeconfig: Option<PathBuf>,
    /// Controller configuration (user catalogs…).
    pub config: ControllerConfig,
}

/// What will be created: the manifests in the generated namespace.
#[derive(Clone, Debug)]
pub struct TestPlan {
    /// `redis` or `etcd_cluster`.
    pub title: String,
    /// The generated namespace.
    pub namespace: String,
    /// The objects to apply (Namespace first).
    pub objects: Vec<Value>,
    /// Every catalog service that will be installed (with `requires`), in install order.
    pub services: Vec<String>,
}

/// A fresh namespace name: `ptest-` and 8 random hex digits.
pub fn generate_namespace() -> String {
    format!("ptest-{:08x}", rand::random::<u32>())
}

/// Builds the manifests for `target` in `namespace` (pure apart from reading nothing): a
/// template is rendered with `sets`; a service gets a one-server Cluster named after it. The
/// result is checked against the CRD schemas and the catalog, and refused when a service
/// cannot run on the local provider (cloud only). Errors create nothing.
pub fn plan(target: &str, sets: &[String], namespace: &str, catalog: &Catalog, library: &TemplateLibrary) -> anyhow::Result<TestPlan> {
    let mut objects = if let Some(template) = library.get(target) {
        template.render(sets, Some(namespace))?.objects
    } else if catalog.get(target).is_some() {
        if !sets.is_empty() {
            bail!("--set sets template parameters; {target} is a catalog service, not a template");
        }
        vec![json!({
            "apiVersion": "provisioning.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": target, "namespace": namespace},
            "spec": {
                "provider": "local",
                "pools": [{"name": "node", "replicas": 1, "plan": "small"}],
                "taskservs": [{"service": target, "pools": ["node"]}],
            },
        })]
    } else {
        let services: Vec<&str> = catalog.services().map(|s| s.name()).collect();
        let templates: Vec<&str> = library.templates().map(|t| t.name()).collect();
        bail!("{target:?} is neither a catalog service ({}) nor a template ({})", services.join(", "), templates.join(", "));
    };
    // The Namespace first, labelled so a kept or leaked environment is easy to find (the
    // template's own for this namespace gives way; any other is refused by `confine`).
    objects.retain(|o| !(o["apiVersion"] == "v1" && o["kind"] == "Namespace" && o["metadata"]["name"] == namespace));
    objects.insert(
        0,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {TEST_LABEL: label_value(target)}}}),
    );
    crate::template::validate_objects(&objects, catalog)?;
    for o in &objects {
        let kind = o["kind"].as_str().unwrap_or_default();
        let provider = o.pointer("/spec/provider").and_then(Value::as_str).unwrap_or("local");
        let foreign = match kind {
            "Cluster" | "Server" => provider != "local",
            "Workspace" => o.pointer("/spec/providers").and_then(Value::as_array).into_iter().flatten().any(|p| p["type"] != "local"),
            _ => false,
        };
        if foreign {
            bail!("{target}: {kind} {} uses a cloud account; provisioning test runs on the local provider only", o["metadata"]["name"]);
        }
    }
    confine(&mut objects[1..], namespace)?;
    let wanted: Vec<String> = {
        let mut w = Vec::new();
        for o in &objects {
            for t in o.pointer("/spec/taskservs").and_then(Value::as_array).into_iter().flatten() {
                w.extend(t["service"].as_str().map(str::to_string));
            }
            if o["kind"] == "TaskServ" {
                w.extend(o.pointer("/spec/service").and_then(Value::as_str).map(str::to_string));
            }
        }
        w
    };
    let services = catalog.resolve(&wanted)?;
    for name in &services {
        let Some(service) = catalog.get(name) else { continue };
        let m = &service.manifest;
        if m.cloud_only || !m.providers.iter().any(|p| p == "local") {
            bail!("{target}: service {name} is cloud only (not executed in CI); provisioning test runs on the local provider only");
        }
    }
    Ok(TestPlan { title: target.to_string(), namespace: namespace.to_string(), objects, services })
}

/// What `provisioning test` applies besides its own Namespace: our namespaced kinds and the
/// ConfigMaps and Secrets they read, as (group, kind). It runs with the caller's credentials
/// (`--kubeconfig`) and removes the environment by deleting the namespace, so nothing may land
/// outside it: no cluster-scoped objects (RBAC, Workspaces, Namespaces), no other namespace.
const ALLOWED_KINDS: [(&str, &str); 5] =
    [("provisioning.dev", "Cluster"), ("provisioning.dev", "Server"), ("provisioning.dev", "TaskServ"), ("", "ConfigMap"), ("", "Secret")];

/// Refuses, naming the object, anything `provisioning test` may not apply, and puts every
/// object in `namespace`.
fn confine(objects: &mut [Value], namespace: &str) -> anyhow::Result<()> {
    for o in objects {
        let api_version = o["apiVersion"].as_str().unwrap_or_default().to_string();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g).to_string();
        let kind = o["kind"].as_str().unwrap_or_default().to_string();
        let what = format!("{kind} {} ({api_version})", o["metadata"]["name"].as_str().unwrap_or("<no name>"));
        if !ALLOWED_KINDS.contains(&(group.as_str(), kind.as_str())) {
            bail!(
                "{what}: provisioning test applies only Cluster, Server, TaskServ, ConfigMap and Secret objects, all in its own namespace {namespace} (it runs with your credentials and deletes the namespace afterwards)"
            );
        }
        let Some(metadata) = o.get_mut("metadata").and_then(Value::as_object_mut) else {
            bail!("{what}: metadata must be an object");
        };
        match metadata.get("namespace") {
            None | Some(Value::Null) => {}
            Some(Value::String(ns)) if ns.is_empty() || ns == namespace => {}
            Some(other) => bail!("{what} is in namespace {other}: provisioning test applies objects only in its own namespace {namespace}"),
        }
        metadata.insert("namespace".into(), json!(namespace));
    }
    Ok(())
}

/// A label value made from `target` (underscores are allowed in label values).
fn label_value(target: &str) -> String {
    target.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).take(63).collect()
}

/// One line of the report and one JUnit test case.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    /// `ready`, `check redis on redis-node-0`, `cleanup`.
    pub name: String,
    /// How long it took.
    pub duration: Duration,
    /// Why it failed (None: passed).
    pub failure: Option<String>,
    /// Output that explains a failure (the script's output tail).
    pub details: String,
}

impl CaseResult {
    fn passed(name: impl Into<String>, duration: Duration) -> Self {
        CaseResult { name: name.into(), duration, failure: None, details: String::new() }
    }
    fn failed(name: impl Into<String>, duration: Duration, failure: impl Into<String>) -> Self {
        CaseResult { name: name.into(), duration, failure: Some(failure.into()), details: String::new() }
    }
}

/// The whole run.
#[derive(Clone, Debug)]
pub struct TestReport {
    /// What was tested.
    pub title: String,
    /// Its namespace.
    pub namespace: String,
    /// Results in order.
    pub cases: Vec<CaseResult>,
    /// Wall time.
    pub duration: Duration,
    /// When it started (RFC 3339).
    pub timestamp: String,
}

impl TestReport {
    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        !self.cases.is_empty() && self.cases.iter().all(|c| c.failure.is_none())
    }

    /// The human report.
    pub fn render(&self) -> String {
        let failed = self.cases.iter().filter(|c| c.failure.is_some()).count();
        let mut out = format!("\nprovisioning test {} (namespace {})\n", self.title, self.namespace);
        for c in &self.cases {
            let verdict = if c.failure.is_some() { "FAIL" } else { "PASS" };
            out.push_str(&format!("  {verdict}  {:<56} {:>7.1}s", c.name, c.duration.as_secs_f64()));
            if let Some(f) = &c.failure {
                out.push_str(&format!("  {f}"));
            }
            out.push('\n');
            for line in c.details.lines().filter(|l| !l.trim().is_empty()) {
                out.push_str(&format!("          | {line}\n"));
            }
        }
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        out.push_str(&format!("{verdict}: {} passed, {failed} failed in {:.1}s\n", self.cases.len() - failed, self.duration.as_secs_f64()));
        out
    }

    /// JUnit XML (one testsuite; the form Jenkins, GitLab and GitHub reporters read).
    pub fn junit_xml(&self) -> String {
        let failures = self.cases.iter().filter(|c| c.failure.is_some()).count();
        let classname = format!("provisioning.test.{}", self.title);
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        out.push_str(&format!(
            "<testsuites name=\"provisioning test\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{:.3}\">\n",
            self.cases.len(),
            self.duration.as_secs_f64()
        ));
        out.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{:.3}\" timestamp=\"{}\">\n",
            xml_escape(&format!("provisioning test {}", self.title)),
            self.cases.len(),
            self.duration.as_secs_f64(),
            xml_escape(&self.timestamp)
        ));
        out.push_str(&format!("    <properties><property name=\"namespace\" value=\"{}\"/></properties>\n", xml_escape(&self.namespace)));
        for c in &self.cases {
            let open = format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\"",
                xml_escape(&c.name),
                xml_escape(&classname),
                c.duration.as_secs_f64()
            );
            match &c.failure {
                None => out.push_str(&format!("{open}/>\n")),
                Some(f) => out.push_str(&format!(
                    "{open}>\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                    xml_escape(f),
                    xml_escape(&c.details)
                )),
            }
        }
        out.push_str("  </testsuite>\n</testsuites>\n");
        out
    }
}

/// Escapes text for XML attributes and content; drops characters XML 1.0 cannot carry.
fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

/// The control plane the test talks to.
struct ControlPlane {
    client: Client,
    /// The embedded controller's metrics (None with `--kubeconfig`).
    metrics: Option<Arc<Metrics>>,
    embedded: Option<Embedded>,
}

struct Embedded {
    api: provisioning_apiserver::RunningApiServer,
    controller: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop: CancellationToken,
    data: tempfile::TempDir,
}

impl ControlPlane {
    async fn start(opts: &TestOptions) -> anyhow::Result<ControlPlane> {
        if let Some(path) = &opts.kubeconfig {
            let client = client::client_from_kubeconfig(path).await?;
            return Ok(ControlPlane { client, metrics: None, embedded: None });
        }
        let data = tempfile::Builder::new().prefix("provisioning-test-").tempdir().context("creating a temporary data dir")?;
        let data_dir = data.path().join("data");
        let api = provisioning_apiserver::ApiServerConfig::new(data_dir.clone(), std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        let api = provisioning_apiserver::start(api).await?;
        let client = client::client_from_kubeconfig(&api.kubeconfig_path()).await?;
        client::install_crds(&client, Duration::from_secs(30)).await?;
        let mut config = opts.config.clone();
        config.leader_election = false;
        config.metrics_addr = None;
        config.state_dir = data_dir.join("providers");
        if config.max_health_interval_secs == 0 {
            config.max_health_interval_secs = RECHECK_INTERVAL_SECS;
        }
        let metrics = Arc::new(Metrics::default());
        let stop = CancellationToken::new();
        let controller = {
            let (client, metrics, stop) = (client.clone(), metrics.clone(), stop.clone());
            tokio::spawn(async move {
                provisioning_controller::run::run_with_metrics(client, config, metrics, async move { stop.cancelled().await }).await
            })
        };
        Ok(ControlPlane { client, metrics: Some(metrics), embedded: Some(Embedded { api, controller, stop, data }) })
    }

    /// Stops the embedded control plane; with `keep`, its data dir stays and is returned.
    async fn stop(self, keep: bool) -> Option<PathBuf> {
        let embedded = self.embedded?;
        embedded.stop.cancel();
        match tokio::time::timeout(Duration::from_secs(10), embedded.controller).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "controller stopped with an error"),
            Ok(_) => {}
            Err(_) => tracing::warn!("controller did not stop within 10 s"),
        }
        embedded.api.shutdown().await;
        keep.then(|| embedded.data.keep().join("data"))
    }
}

/// Runs `provisioning test`; returns the exit code (0: every case passed).
pub async fn run_test(opts: TestOptions) -> anyhow::Result<i32> {
    let catalog = opts.config.load_catalog()?;
    let library = crate::template::default_library()?;
    let plan = plan(&opts.target, &opts.sets, &generate_namespace(), &catalog, &library)?;
    if opts.kubeconfig.is_none() {
        require_node_image().await?;
    }
    let interrupted = CancellationToken::new();
    tokio::spawn(watch_signals(interrupted.clone()));

    let started = Instant::now();
    let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    say!("provisioning test {}: namespace {}, services {}", plan.title, plan.namespace, plan.services.join(", "));
    let control = ControlPlane::start(&opts).await?;
    // The namespace is deleted at the end: it must be the one this run makes.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(control.client.clone());
    if namespaces.get_opt(&plan.namespace).await?.is_some() {
        control.stop(false).await;
        bail!("namespace {} already exists; provisioning test only uses a namespace it creates", plan.namespace);
    }
    let mut cases = exercise(&control, &plan, &opts, &interrupted).await;
    if opts.keep {
        say!("--keep: everything stays in namespace {}", plan.namespace);
    } else {
        let t = Instant::now();
        cases.push(match cleanup(&control.client, &plan.namespace).await {
            Ok(()) => CaseResult::passed("cleanup (nothing left behind)", t.elapsed()),
            Err(e) => CaseResult::failed("cleanup (nothing left behind)", t.elapsed(), format!("{e:#}")),
        });
    }
    if let Some(dir) = control.stop(opts.keep).await {
        say!("control plane data kept in {0}: `provisioning dev --data-dir {0}` serves it again", dir.display());
    }
    let report = TestReport { title: plan.title.clone(), namespace: plan.namespace.clone(), cases, duration: started.elapsed(), timestamp };
    say!("{}", report.render().trim_end());
    if let Some(path) = &opts.junit {
        std::fs::write(path, report.junit_xml()).with_context(|| format!("writing {}", path.display()))?;
        say!("JUnit XML: {}", path.display());
    }
    Ok(if report.passed() { 0 } else { 1 })
}

/// First SIGINT/SIGTERM: cancel (the test stops waiting and cleans up). Second: exit at once.
async fn watch_signals(interrupted: CancellationToken) {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    loop {
        #[cfg(unix)]
        {
            let term_recv = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term_recv => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        if interrupted.is_cancelled() {
            say_err!("interrupted again: exiting without finishing the cleanup");
            std::process::exit(130);
        }
        say_err!("interrupted: removing the test environment (interrupt again to abort)");
        interrupted.cancel();
    }
}

/// Fails unless the local provider's node image exists.
async fn require_node_image() -> anyhow::Result<()> {
    let docker = provisioning_providers::local::connect("").await?;
    let tag = provisioning_providers::local::image::NODE_IMAGE_LATEST;
    if !provisioning_providers::local::image::node_image_exists(&docker, tag).await? {
        bail!("the local provider's node image {tag} is missing: run `provisioning image build` first");
    }
    Ok(())
}

/// Applies the plan, waits for Ready and healthy, has the checks run again; the test cases.
async fn exercise(control: &ControlPlane, plan: &TestPlan, opts: &TestOptions, interrupted: &CancellationToken) -> Vec<CaseResult> {
    let started = Instant::now();
    let deadline = started + opts.timeout;
    let manifests: Vec<dev::Manifest> = plan
        .objects
        .iter()
        .enumerate()
        .map(|(i, o)| dev::Manifest { source: format!("{}#{}", plan.title, i + 1), object: o.clone() })
        .collect();
    if let Err(e) = dev::apply_manifests(&control.client, &manifests, Duration::from_secs(60)).await {
        return vec![CaseResult::failed("apply", started.elapsed(), format!("{e:#}"))];
    }
    let ready = wait_ready(&control.client, &plan.namespace, deadline, interrupted).await;
    let mut cases = vec![match &ready {
        Ok(()) => CaseResult::passed("Ready and healthy", started.elapsed()),
        Err(e) => CaseResult::failed("Ready and healthy", started.elapsed(), e.to_string()),
    }];
    let taskservs = Api::<TaskServ>::namespaced(control.client.clone(), &plan.namespace).list(&ListParams::default()).await;
    let taskservs = match taskservs {
        Ok(list) => list.items,
        Err(e) => {
            cases.push(CaseResult::failed("checks", Duration::ZERO, format!("listing TaskServs: {e}")));
            return cases;
        }
    };
    let recheck = match (&ready, &control.metrics) {
        (Ok(()), Some(metrics)) => Some(recheck(&control.client, &plan.namespace, &taskservs, metrics, deadline, interrupted).await),
        _ => None,
    };
    cases.extend(check_cases(&control.client, &plan.namespace, recheck.as_ref()).await);
    cases
}

/// Polls Clusters and TaskServs of `namespace` until all are Ready (TaskServs also Healthy),
/// printing each change. Fails when one stays Stalled, at the deadline, or on interrupt.
async fn wait_ready(client: &Client, namespace: &str, deadline: Instant, interrupted: &CancellationToken) -> anyhow::Result<()> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    let taskservs: Api<TaskServ> = Api::namespaced(client.clone(), namespace);
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut stalled_since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let mut states: BTreeMap<String, (bool, String, bool)> = BTreeMap::new();
        for c in clusters.list(&ListParams::default()).await?.items {
            let status = c.status.clone().unwrap_or_default();
            states.insert(format!("Cluster/{}", c.name_any()), summarize(&status.conditions, status.phase.as_deref(), false));
        }
        let ts_list = taskservs.list(&ListParams::default()).await?.items;
        for t in &ts_list {
            let status = t.status.clone().unwrap_or_default();
            states.insert(format!("TaskServ/{}", t.name_any()), summarize(&status.conditions, status.phase.as_deref(), true));
        }
        for (what, (_, line, _)) in &states {
            if last.get(what) != Some(line) {
                say!("  {what:<40} {line}");
                last.insert(what.clone(), line.clone());
            }
        }
        // Stalled can be brief (a configFrom Secret another TaskServ is about to generate):
        // only one that stays Stalled fails the wait early.
        stalled_since.retain(|what, _| states.get(what).is_some_and(|(_, _, stalled)| *stalled));
        for (what, (_, _, stalled)) in &states {
            if *stalled {
                stalled_since.entry(what.clone()).or_insert_with(Instant::now);
            }
        }
        if let Some((what, _)) = stalled_since.iter().find(|(_, since)| since.elapsed() >= STALLED_GRACE) {
            let line = states.get(what).map(|(_, l, _)| l.split_whitespace().collect::<Vec<_>>().join(" ")).unwrap_or_default();
            bail!("{what} is Stalled: {line}");
        }
        if !ts_list.is_empty() && states.values().all(|(ready, _, _)| *ready) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let compact = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
            let blocking: Vec<String> =
                states.iter().filter(|(_, (r, _, _))| !r).map(|(w, (_, l, _))| format!("{w}: {}", compact(l))).collect();
            bail!("not Ready before the timeout: {}", blocking.join("; "));
        }
        tokio::select! {
            _ = interrupted.cancelled() => bail!("interrupted before Ready"),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// (ready, "phase Ready=… message", stalled) of an object's conditions. With `healthy`, Ready
/// also needs `Healthy=True`.
fn summarize(conditions: &[provisioning_crds::Condition], phase: Option<&str>, healthy: bool) -> (bool, String, bool) {
    let status = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let is_true = |t: &str| status(t).is_some_and(|c| c.status == "True");
    let ready = is_true("Ready") && (!healthy || is_true("Healthy"));
    let message = status("Ready").map(|c| c.message.clone()).unwrap_or_else(|| "waiting for the controller".into());
    let ready_text = status("Ready").map(|c| c.status.clone()).unwrap_or_else(|| "Unknown".into());
    (ready, format!("{:<12} Ready={ready_text:<7} {message}", phase.unwrap_or("-")), is_true("Stalled"))
}

/// Result of the re-check round: per service, how many checks passed and failed after Ready.
#[derive(Clone, Debug, Default)]
struct Recheck {
    runs: BTreeMap<String, (u64, u64)>,
    error: Option<String>,
    duration: Duration,
}

/// Waits until the embedded controller has run every TaskServ's check again on each of its
/// servers (counted from its script-run metrics: after Ready the only runs are checks), or
/// one failed.
async fn recheck(
    client: &Client,
    namespace: &str,
    taskservs: &[TaskServ],
    metrics: &Metrics,
    deadline: Instant,
    interrupted: &CancellationToken,
) -> Recheck {
    let started = Instant::now();
    let mut needed: BTreeMap<String, u64> = BTreeMap::new();
    for t in taskservs {
        let servers = t.status.as_ref().map_or(0, |s| s.servers.len() as u64);
        *needed.entry(t.spec.service.clone()).or_default() += servers;
    }
    let count = |service: &str, outcome: &str| {
        metrics.script_runs.get_or_create(&ScriptLabels { service: service.to_string(), outcome: outcome.to_string() }).get()
    };
    let base: BTreeMap<String, (u64, u64)> = needed.keys().map(|s| (s.clone(), (count(s, "ok"), count(s, "failed")))).collect();
    // Three intervals and a margin: the checks of a busy machine may be a little late.
    let round_deadline = deadline.min(Instant::now() + Duration::from_secs(RECHECK_INTERVAL_SECS * 3 + 60));
    loop {
        let runs: BTreeMap<String, (u64, u64)> =
            base.iter().map(|(s, (ok, failed))| (s.clone(), (count(s, "ok") - ok, count(s, "failed") - failed))).collect();
        let failed: Vec<&String> = runs.iter().filter(|(_, (_, f))| *f > 0).map(|(s, _)| s).collect();
        let done = runs.iter().all(|(s, (ok, _))| *ok >= needed.get(s).copied().unwrap_or(0));
        let error = if !failed.is_empty() {
            Some(format!("checks failed after Ready: {}", failed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")))
        } else if done {
            None
        } else if Instant::now() >= round_deadline {
            Some("the checks did not all run again before the timeout".to_string())
        } else if interrupted.is_cancelled() {
            Some("interrupted during the checks".to_string())
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        // The controller records an unhealthy check in status right after the run: give the
        // write a moment so the per-server cases show it.
        if error.is_some() {
            let api: Api<TaskServ> = Api::namespaced(client.clone(), namespace);
            let _ = tokio::time::timeout(Duration::from_secs(5), api.list(&ListParams::default())).await;
        }
        return Recheck { runs, error, duration: started.elapsed() };
    }
}

/// One case per TaskServ and server: healthy in status (check.nu passed after the install),
/// and — with the embedded controller — checked again after Ready.
async fn check_cases(client: &Client, namespace: &str, recheck: Option<&Recheck>) -> Vec<CaseResult> {
    let api: Api<TaskServ> = Api::namespaced(client.clone(), namespace);
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => return vec![CaseResult::failed("checks", Duration::ZERO, format!("listing TaskServs: {e}"))],
    };
    let rerun = |service: &str| recheck.map(|r| (r.runs.get(service).copied().unwrap_or_default(), r.error.clone(), r.duration));
    list.iter().flat_map(|t| taskserv_cases(t, rerun(&t.spec.service))).collect()
}

/// Check runs counted after Ready (passed, failed), the recheck's error and its duration.
type Rerun = ((u64, u64), Option<String>, Duration);

/// The cases of one TaskServ: one per server it is on (pure, from its status).
fn taskserv_cases(t: &TaskServ, rerun: Option<Rerun>) -> Vec<CaseResult> {
    let mut cases = Vec::new();
    let status = t.status.clone().unwrap_or_default();
    let service = &t.spec.service;
    let version = status.installed_version.clone().unwrap_or_else(|| "-".into());
    if status.servers.is_empty() {
        cases.push(CaseResult::failed(format!("check {service} ({})", t.name_any()), Duration::ZERO, "no server has it installed"));
    }
    for s in &status.servers {
        let name = format!("check {service} {version} on {}", s.name);
        let duration = rerun.as_ref().map(|r| r.2).unwrap_or_default();
        let mut case = match (s.healthy, &rerun) {
            (Some(true), None) => CaseResult::passed(name, duration),
            (Some(true), Some(((ok, _), None, _))) if *ok > 0 => CaseResult::passed(name, duration),
            (Some(true), Some((_, Some(e), _))) => CaseResult::failed(name, duration, e.clone()),
            (Some(true), Some(_)) => CaseResult::failed(name, duration, "not checked again after Ready"),
            (healthy, _) => {
                let what = if healthy == Some(false) { "unhealthy" } else { "not checked yet" };
                CaseResult::failed(name, duration, format!("{what} (phase {})", s.phase))
            }
        };
        if case.failure.is_some() {
            // The failed run, also while a retry of it runs (its own output is not in yet).
            let run = s.last_failure.as_ref().or(s.last_run.as_ref());
            case.details = run.and_then(|r| r.output_tail.clone()).unwrap_or_default();
        }
        cases.push(case);
    }
    cases
}

/// Deletes everything in `namespace` (Clusters and standalone TaskServs, then Servers, then
/// the Namespace, which goes even when a step before it failed) and waits until no Server is left and Docker holds nothing with the
/// namespace's label; fails naming what is left.
async fn cleanup(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + CLEANUP_TIMEOUT;
    let mut problems = Vec::new();
    if let Err(e) = remove_environment(client, namespace, deadline).await {
        problems.push(format!("{e:#}"));
    }
    // The namespace goes whatever failed above: with it its ConfigMaps, Secrets and anything
    // left.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    match namespaces.delete(namespace, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => problems.push(format!("deleting the namespace {namespace}: {e}")),
    }
    // Networks go once their last container is gone: allow the controller a moment.
    let docker_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = docker_leftovers(namespace).await?;
        if left.is_empty() {
            break;
        }
        if Instant::now() >= docker_deadline {
            problems.push(format!("left behind in Docker: {}", left.join(", ")));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if problems.is_empty() { Ok(()) } else { bail!("{}", problems.join("; ")) }
}

/// Clusters and standalone TaskServs, then Servers, each waited for.
async fn remove_environment(client: &Client, namespace: &str, deadline: Instant) -> anyhow::Result<()> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    let taskservs: Api<TaskServ> = Api::namespaced(client.clone(), namespace);
    let servers: Api<Server> = Api::namespaced(client.clone(), namespace);
    let dp = DeleteParams::background();
    let lp = ListParams::default();
    // A Cluster tears down what it owns in reverse dependency order; standalone TaskServs
    // go next (their remove.nu needs the machines), Servers last.
    delete_all(&clusters, &dp, &lp).await.context("deleting the Clusters")?;
    wait_gone(&clusters, deadline, "Cluster").await?;
    delete_all(&taskservs, &dp, &lp).await.context("deleting the TaskServs")?;
    wait_gone(&taskservs, deadline, "TaskServ").await?;
    delete_all(&servers, &dp, &lp).await.context("deleting the Servers")?;
    wait_gone(&servers, deadline, "Server").await
}

/// Deletes every object `api` lists (one call each; "already gone" is fine).
async fn delete_all<K>(api: &Api<K>, dp: &DeleteParams, lp: &ListParams) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for o in api.list(lp).await?.items {
        match api.delete(&o.name_any(), dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn wait_gone<K>(api: &Api<K>, deadline: Instant, kind: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    loop {
        let left: Vec<String> = api.list(&ListParams::default()).await?.items.iter().map(|o| o.name_any()).collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{kind}s not removed after {CLEANUP_TIMEOUT:?}: {}", left.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Containers, networks and volumes labelled with `namespace`.
pub async fn docker_leftovers(namespace: &str) -> anyhow::Result<Vec<String>> {
    use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions, ListVolumesOptions};
    let docker = provisioning_providers::local::connect("").await?;
    let filters = provisioning_providers::local::spec::label_filter([(provisioning_providers::tags::NAMESPACE, namespace)]);
    let mut out = Vec::new();
    let containers =
        docker.list_containers(Some(ListContainersOptions { all: true, filters: Some(filters.clone()), ..Default::default() }));
    for c in containers.await? {
        out.push(format!("container {}", c.names.unwrap_or_default().join(",")));
    }
    for n in docker.list_networks(Some(ListNetworksOptions { filters: Some(filters.clone()) })).await? {
        out.push(format!("network {}", n.name.unwrap_or_default()));
    }
    let volumes = docker.list_volumes(Some(ListVolumesOptions { filters: Some(filters) })).await?;
    for v in volumes.volumes.unwrap_or_default() {
        out.push(format!("volume {}", v.name));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> (Catalog, TemplateLibrary) {
        (Catalog::load(&Catalog::default_dir()).expect("catalog"), crate::template::default_library().expect("templates"))
    }

    /// The report names why a check failed also when a retry of the install is running at
    /// the timeout (its run has no output yet): the user_catalog test's "sour" service
    /// failed 1 run in 5 without the script's message in the report.
    #[test]
    fn a_failed_check_is_reported_with_its_output_while_a_retry_runs() {
        use provisioning_crds::{ScriptRun, TaskServServerStatus, TaskServStatus};
        let failed_check = ScriptRun { script: "check".into(), output_tail: Some("this check always fails".into()), ..Default::default() };
        let retry = ScriptRun { script: "install".into(), started_at: Some("2026-11-26T11:00:00Z".into()), ..Default::default() };
        let mut t: TaskServ = serde_json::from_value(serde_json::json!({
            "apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ",
            "metadata": {"name": "sour-sour", "namespace": "ptest-1"},
            "spec": {"service": "sour", "servers": {"names": ["sour-node-0"]}}
        }))
        .expect("taskserv");
        t.status = Some(TaskServStatus {
            servers: vec![TaskServServerStatus {
                name: "sour-node-0".into(),
                phase: "Installing".into(),
                healthy: Some(false),
                last_run: Some(retry),
                last_failure: Some(failed_check),
                ..Default::default()
            }],
            ..Default::default()
        });
        let cases = taskserv_cases(&t, None);
        assert_eq!(cases.len(), 1);
        assert!(cases[0].failure.is_some(), "{:?}", cases[0].failure);
        assert_eq!(cases[0].details, "this check always fails");
    }

    #[test]
    fn a_service_is_a_one_server_cluster_and_a_template_is_rendered_into_the_namespace() {
        let (catalog, library) = inputs();
        let p = plan("redis", &[], "ptest-1", &catalog, &library).expect("plan");
        assert_eq!(p.objects[0]["kind"], "Namespace");
        assert_eq!(p.objects[0]["metadata"]["labels"][TEST_LABEL], "redis");
        assert_eq!(p.objects[1]["spec"]["pools"][0]["replicas"], 1);
        assert_eq!(p.objects[1]["metadata"]["namespace"], "ptest-1");
        assert_eq!(p.services, ["redis"]);

        let p = plan("etcd_cluster", &["members=1".into()], "ptest-2", &catalog, &library).expect("plan");
        assert_eq!(p.objects.iter().filter(|o| o["kind"] == "Namespace").count(), 1);
        let cluster = p.objects.iter().find(|o| o["kind"] == "Cluster").expect("cluster");
        assert_eq!(cluster["metadata"]["namespace"], "ptest-2");
        assert_eq!(cluster["spec"]["pools"][0]["replicas"], 1);
    }

    /// A template rendering `manifests` (a Cluster of redis first, so the plan is otherwise
    /// valid), in a library of its own.
    fn hostile_library(dir: &std::path::Path, manifests: &str) -> anyhow::Result<TemplateLibrary> {
        let t = dir.join("hostile");
        std::fs::create_dir_all(&t)?;
        std::fs::write(
            t.join("template.yaml"),
            "name: hostile\ndescription: renders more than it should\ndefaultNamespace: hostile\nparameters: []\n",
        )?;
        let cluster = "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: r\nspec:\n  provider: local\n  pools:\n  - name: node\n    replicas: 1\n    plan: small\n  taskservs:\n  - service: redis\n    pools: [node]\n";
        std::fs::write(t.join("manifests.yaml.j2"), format!("{cluster}---\n{manifests}"))?;
        Ok(TemplateLibrary::load(dir)?)
    }

    /// `provisioning test` runs with the caller's credentials: a template may put only our
    /// namespaced kinds and ConfigMaps/Secrets into the test namespace; anything else is refused
    /// naming the object, before anything is created.
    #[test]
    fn a_template_cannot_reach_outside_the_test_namespace() -> anyhow::Result<()> {
        let catalog = Catalog::load(&Catalog::default_dir())?;
        let refused = [
            (
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: grab\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: Group, name: system:authenticated, apiGroup: rbac.authorization.k8s.io}]\n",
                "ClusterRoleBinding grab (rbac.authorization.k8s.io/v1): provisioning test applies only",
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plant\n  namespace: kube-system\ndata: {a: b}\n",
                "ConfigMap plant (v1) is in namespace \"kube-system\"",
            ),
            ("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: elsewhere\n", "Namespace elsewhere (v1): provisioning test applies only"),
            ("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n", "ServiceAccount sa (v1): provisioning test applies only"),
            (
                "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: ws\nspec:\n  providers: [{name: local, type: local}]\n",
                "Workspace ws (provisioning.dev/v1alpha1): provisioning test applies only",
            ),
        ];
        for (manifest, want) in refused {
            let dir = tempfile::tempdir()?;
            let library = hostile_library(dir.path(), manifest)?;
            let e = match plan("hostile", &[], "ptest-h", &catalog, &library) {
                Ok(p) => anyhow::bail!("{manifest}: planned {:?}", p.objects),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains(want), "{manifest}: {e}");
        }
        // Allowed kinds land in the test namespace, whatever the template left out.
        let dir = tempfile::tempdir()?;
        let library = hostile_library(dir.path(), "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata: {a: b}\n")?;
        let p = plan("hostile", &[], "ptest-h", &catalog, &library)?;
        assert_eq!(
            p.objects.iter().map(|o| o["kind"].as_str().unwrap_or_default()).collect::<Vec<_>>(),
            ["Namespace", "Cluster", "ConfigMap"]
        );
        for o in &p.objects[1..] {
            assert_eq!(o["metadata"]["namespace"], "ptest-h", "{o}");
        }
        Ok(())
    }

    #[test]
    fn unknown_targets_cloud_only_services_and_bad_params_are_refused_with_a_reason() {
        let (catalog, library) = inputs();
        let e = plan("nosuch", &[], "ptest-1", &catalog, &library).expect_err("unknown").to_string();
        assert!(e.contains("\"nosuch\" is neither a catalog service") && e.contains("redis") && e.contains("etcd_cluster"), "{e}");
        let e = plan("kubernetes", &[], "ptest-1", &catalog, &library).expect_err("cloud only").to_string();
        assert!(e.contains("kubernetes is cloud only"), "{e}");
        let e = plan("kubernetes_3node", &[], "ptest-1", &catalog, &library).expect_err("cloud").to_string();
        assert!(e.contains("local provider only"), "{e}");
        let e = plan("etcd_cluster", &["members=0".into()], "ptest-1", &catalog, &library).expect_err("bad").to_string();
        assert!(e.contains("members") && e.contains("at least 1"), "{e}");
        let e = plan("redis", &["x=1".into()], "ptest-1", &catalog, &library).expect_err("set on a service").to_string();
        assert!(e.contains("not a template"), "{e}");
    }

    #[test]
    fn junit_xml_escapes_and_counts() {
        let report = TestReport {
            title: "redis".into(),
            namespace: "ptest-1".into(),
            cases: vec![
                CaseResult::passed("Ready and healthy", Duration::from_millis(1500)),
                CaseResult {
                    details: "line <1>\n\u{1b}[31mred".into(),
                    ..CaseResult::failed("check redis on a", Duration::ZERO, "bad \"x\" & y")
                },
            ],
            duration: Duration::from_secs(2),
            timestamp: "2026-11-25T00:00:00Z".into(),
        };
        let xml = report.junit_xml();
        assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
        assert!(xml.contains("<testcase name=\"Ready and healthy\" classname=\"provisioning.test.redis\" time=\"1.500\"/>"), "{xml}");
        assert!(xml.contains("<failure message=\"bad &quot;x&quot; &amp; y\">line &lt;1&gt;\n[31mred</failure>"), "{xml}");
        assert!(!report.passed());
        assert!(report.render().contains("FAILED: 1 passed, 1 failed"));
    }
}
