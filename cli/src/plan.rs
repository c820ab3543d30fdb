//! `provisioning plan -f FILE...`: what applying manifests would change, against the current
//! cluster, changing nothing (terraform's `plan -detailed-exitcode`: 0 no changes, 2 changes,
//! 1 error).
//!
//! Each provisioning.dev object is server-side applied with `dryRun=All` (the API server
//! defaults and validates it, stores nothing), then:
//! - a Server goes through the controller's own pure planner
//!   ([`provisioning_controller::server::plan::spec_plan`]) against the live object's status (the machine the
//!   controller last observed), with its Workspace's defaults and its provider account's
//!   capabilities and price table (no provider call, no credentials read);
//! - a Cluster goes through the controller's Cluster planner against its live children
//!   (Servers and TaskServs to create, change or delete, surge Servers of a rolling update),
//!   and every member whose machine changes through the Server planner (in place or replaced,
//!   and why), with how its pool rolls;
//! - a TaskServ or Workspace is compared spec to spec: Create, Update (naming the changed
//!   top-level fields) or nothing; their per-server effects are planned by the controller
//!   once applied.
//!
//! Other kinds (Namespaces, Secrets, RoleBindings) are listed as not planned; Secret values
//! are never read or printed.
//!
//! Plan is as strict as admission, and stricter than a dry run alone: every object first goes
//! through the API server's own decoding and validation, run here with the apiserver crate's
//! code ([`admit`]: strict fields — an unknown field is refused as `kubectl apply` refuses it —
//! the CRD's schema and its CEL rules), so that an object whose namespace comes with the same
//! manifests is checked too; an apiVersion/kind the API server does not serve is refused; then
//! the dry-run apply (strict) and the controller's own validation (plans, provider accounts,
//! services and the catalog's config schema). Each refused object is reported with its reason,
//! and any refusal makes the exit code 1 ("N refused").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiResource, Discovery};
use provisioning_crds::{API_VERSION, ChangeAction, Cluster, Plan, PlannedChange, Server, TaskServ, Workspace};
use serde::Serialize;
use serde_json::Value;

use provisioning_controller::server::plan;
use provisioning_controller::server::validate;

/// Summary of an object of a kind that is applied as it is.
const NOT_PLANNED: &str = "not planned";
/// Field manager of the dry-run applies (nothing is stored under it).
const FIELD_MANAGER: &str = "provisioning-plan";

/// One object's plan.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPlan {
    /// `Kind/namespace/name` (`Kind/name` for cluster-scoped kinds).
    pub resource: String,
    /// The plan (id only for Servers, whose ids the controller computes the same way).
    pub plan: Plan,
    /// Whether the change would wait for approval (`approval: Manual`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub needs_approval: bool,
    /// Why the object is not planned, or what applying it would refuse.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// Admission or the controller would refuse it (`note` says why).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

impl ObjectPlan {
    /// An object that would be refused, and why.
    fn refused(resource: String, why: String) -> ObjectPlan {
        let plan = Plan { summary: REFUSED.into(), ..Default::default() };
        ObjectPlan { resource, plan, needs_approval: false, note: why, refused: true }
    }
}

/// Summary of a refused object.
const REFUSED: &str = "refused";

/// Everything `provisioning plan` found.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    /// Per object, in the order of the manifests.
    pub objects: Vec<ObjectPlan>,
    /// One line over all objects: "1 to create, 2 to update".
    pub summary: String,
    /// Whether anything would change (exit code 2).
    pub changes: bool,
    /// Objects that would be refused (exit code 1).
    pub refused: usize,
}

/// Reads every manifest document of `paths` (files, or directories: their `.yaml`, `.yml`
/// and `.json` files, sorted), skipping empty documents. Errors name the file.
pub fn read_manifests(paths: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, Value)>> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot list {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json")))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let values = provisioning_yaml::documents::<Value>(&text)
            .map_err(|e| anyhow::anyhow!("{}: document {} is not valid YAML: {}", file.display(), e.index, e.error))?;
        for (i, value) in values.into_iter().enumerate() {
            if value.is_null() {
                continue;
            }
            if value.get("kind").and_then(Value::as_str).is_none() || value.get("apiVersion").and_then(Value::as_str).is_none() {
                bail!("{}: document {} has no kind or apiVersion", file.display(), i + 1);
            }
            docs.push((file.clone(), value));
        }
    }
    if docs.is_empty() {
        bail!("no manifests in {}", paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
    }
    Ok(docs)
}

/// A private directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "provisioning-plan-{}-{}",
            std::process::id(),
            provisioning_controller::time::jittered(std::time::Duration::from_secs(1_000_000)).as_nanos()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Plans every document against the cluster `client` talks to; `default_namespace` for
/// namespaced objects that name none.
pub async fn plan(client: Client, docs: &[(PathBuf, Value)], default_namespace: &str) -> anyhow::Result<PlanReport> {
    let docs: Vec<(PathBuf, Value)> = docs.iter().map(|(f, d)| (f.clone(), as_v1alpha1(d))).collect();
    let docs = docs.as_slice();
    let mut workspaces: Vec<Arc<Workspace>> = Api::<Workspace>::all(client.clone())
        .list(&Default::default())
        .await
        .context("listing Workspaces")?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    // Workspaces in the same manifests count as they would be after the apply.
    for (file, doc) in docs.iter().filter(|(_, d)| d["kind"] == "Workspace" && d["apiVersion"] == API_VERSION) {
        let ws: Workspace = serde_json::from_value(doc.clone()).with_context(|| format!("{}: reading the Workspace", file.display()))?;
        workspaces.retain(|w| w.metadata.name != ws.metadata.name);
        workspaces.push(Arc::new(ws));
    } // The simulated provider opens a store file when built: a private scratch directory,
    // removed afterwards, keeps the plan from touching any controller's state.
    let scratch = Scratch::new()?;
    let discovery = Discovery::new(client.clone()).run().await.context("API discovery")?;
    let mut report = PlanReport::default();
    for (file, doc) in docs {
        let object = match served(&discovery, doc, docs) {
            Err(why) => ObjectPlan::refused(describe(doc, default_namespace), why),
            Ok(()) => plan_one(&client, doc, default_namespace, &workspaces, scratch.path())
                .await
                .with_context(|| format!("{}: {}", file.display(), describe(doc, default_namespace)))?,
        };
        report.objects.push(object);
    }
    let all: Vec<PlannedChange> = report.objects.iter().flat_map(|o| o.plan.changes.clone()).collect();
    report.summary = plan::summary(&all);
    report.changes = report.objects.iter().any(|o| o.plan.has_changes());
    report.refused = report.objects.iter().filter(|o| o.refused).count();
    Ok(report)
}

/// A `v1beta1` object as `v1alpha1`, the version the planners' types are: the same schema
/// (conversion `None`), so only `apiVersion` changes (docs/upgrade.md).
fn as_v1alpha1(doc: &Value) -> Value {
    let beta = format!("{}/{}", provisioning_crds::GROUP, provisioning_crds::BETA_VERSION);
    let kind = doc["kind"].as_str().unwrap_or_default();
    if doc["apiVersion"].as_str() != Some(beta.as_str()) || !provisioning_crds::BETA_KINDS.contains(&kind) {
        return doc.clone();
    }
    let mut doc = doc.clone();
    doc["apiVersion"] = Value::String(API_VERSION.into());
    doc
}

/// `Err(why)` when the API server serves no such apiVersion/kind (and no CustomResourceDefinition
/// of the same manifests defines it), as `kubectl apply` would say.
fn served(discovery: &Discovery, doc: &Value, docs: &[(PathBuf, Value)]) -> Result<(), String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    if group == provisioning_crds::GROUP {
        // Checked against the CRDs themselves by admission (naming the kinds it has).
        return Ok(());
    }
    if discovery.resolve_gvk(&GroupVersionKind::gvk(group, version, kind)).is_some() {
        return Ok(());
    }
    let defined_here = docs.iter().any(|(_, d)| {
        d["kind"] == "CustomResourceDefinition"
            && d["spec"]["group"] == group
            && d["spec"]["names"]["kind"] == kind
            && d["spec"]["versions"].as_array().is_some_and(|vs| vs.iter().any(|v| v["name"] == version))
    });
    if defined_here {
        return Ok(());
    }
    Err(format!("no matches for kind \"{kind}\" in version \"{api_version}\": the API server does not serve it"))
}

/// Admission of a provisioning.dev object as the API server does it, with its own code (the
/// apiserver crate): the kind and version must be served, no unknown field (strict decoding,
/// as `kubectl apply` asks for), metadata, the CRD's schema (with its defaults applied) and its
/// CEL rules (`old`: the live object, for transition rules). Returns the object as it would be
/// stored, or why it would be refused, in the API server's words.
pub fn admit(doc: &Value, old: Option<&Value>) -> Result<Value, String> {
    use provisioning_apiserver::{celrules, error::ApiError, validation};
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let crds = provisioning_crds::all_crds();
    let Some(crd) = crds.iter().find(|c| c.spec.group == group && c.spec.names.kind == kind) else {
        let known: Vec<String> = crds.iter().map(|c| c.spec.names.kind.clone()).collect();
        return Err(format!("no matches for kind \"{kind}\" in version \"{api_version}\" (the kinds of {group}: {})", known.join(", ")));
    };
    let Some(served) = crd.spec.versions.iter().find(|v| v.name == version && v.served) else {
        return Err(format!("no matches for kind \"{kind}\" in version \"{api_version}\" (served: {})", provisioning_crds::API_VERSION));
    };
    let schema = served
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| format!("the {kind} schema does not serialise: {e}"))?
        .unwrap_or(Value::Null);
    let mut obj = doc.clone();
    let mut causes = validation::validate_metadata(&obj["metadata"]);
    let outcome = validation::process(&mut obj, &schema);
    if !outcome.unknown.is_empty() {
        let list: Vec<String> = outcome.unknown.iter().map(|u| format!("unknown field \"{u}\"")).collect();
        return Err(format!("{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}", list.join(", ")));
    }
    causes.extend(outcome.causes.into_vec());
    if causes.is_empty() {
        causes.extend(celrules::Rules::from_schema(&schema).validate(&obj, old));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(kind, group, name, causes).message);
    }
    Ok(obj)
}

fn describe(doc: &Value, default_namespace: &str) -> String {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = doc["metadata"]["namespace"].as_str().unwrap_or(default_namespace);
    match kind {
        "Workspace" | "Namespace" => format!("{kind}/{name}"),
        _ => format!("{kind}/{namespace}/{name}"),
    }
}

async fn plan_one(
    client: &Client,
    doc: &Value,
    default_namespace: &str,
    workspaces: &[Arc<Workspace>],
    scratch: &Path,
) -> anyhow::Result<ObjectPlan> {
    let resource = describe(doc, default_namespace);
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    let name = doc["metadata"]["name"].as_str().filter(|n| !n.is_empty()).context("metadata.name is missing")?.to_string();
    let ours = doc["apiVersion"].as_str().is_some_and(|v| v.split_once('/').is_some_and(|(g, _)| g == provisioning_crds::GROUP));
    if ours && let Err(why) = admit(doc, None) {
        // An unknown kind or version of ours, or a kind that is not planned (ChangeRecord).
        return Ok(ObjectPlan::refused(resource, why));
    }
    if doc["apiVersion"].as_str() != Some(API_VERSION) || !matches!(kind.as_str(), "Server" | "Cluster" | "TaskServ" | "Workspace") {
        let plan = Plan { id: String::new(), summary: NOT_PLANNED.into(), ..Default::default() };
        return Ok(ObjectPlan {
            resource,
            plan,
            needs_approval: false,
            note: format!("{kind} is applied as it is, not planned"),
            refused: false,
        });
    }
    let cluster_scoped = kind == "Workspace";
    let namespace = doc["metadata"]["namespace"].as_str().unwrap_or(default_namespace).to_string();
    let gvk = GroupVersionKind::gvk(provisioning_crds::GROUP, provisioning_crds::VERSION, &kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
    let api: Api<DynamicObject> =
        if cluster_scoped { Api::all_with(client.clone(), &ar) } else { Api::namespaced_with(client.clone(), &namespace, &ar) };
    let live = api.get_opt(&name).await.with_context(|| format!("reading {resource}"))?;
    let mut body = doc.clone();
    if !cluster_scoped {
        body["metadata"]["namespace"] = Value::String(namespace.clone());
    }
    // Admission as the API server does it, also for an object whose namespace is not there yet.
    let admitted = match admit(&body, live.as_ref().map(serde_json::to_value).transpose()?.as_ref()) {
        Ok(obj) => obj,
        Err(why) => return Ok(ObjectPlan::refused(resource, why)),
    };
    // The object as it would be stored: defaulted and validated by the API server.
    let params = PatchParams::apply(FIELD_MANAGER).dry_run().force().validation_strict();
    let applied = match api.patch(&name, &params, &Patch::Apply(&body)).await {
        Ok(obj) => serde_json::to_value(obj)?,
        // The namespace comes with the same manifests: plan the object as admitted.
        Err(kube::Error::Api(e)) if e.code == 404 && live.is_none() => admitted,
        Err(kube::Error::Api(e)) => return Ok(ObjectPlan::refused(resource, format!("the API server refuses it: {}", e.message))),
        Err(e) => return Err(anyhow::Error::from(e).context("dry-run apply")),
    };
    if kind == "Server" {
        let mut server: Server = serde_json::from_value(applied).context("reading the Server")?;
        let live: Option<Server> = live.map(serde_json::to_value).transpose()?.map(serde_json::from_value).transpose()?;
        server.status = live.as_ref().and_then(|l| l.status.clone());
        server.metadata.uid = live.as_ref().and_then(|l| l.metadata.uid.clone());
        return server_plan(&server, &namespace, workspaces, scratch);
    }
    if kind == "Cluster" {
        let mut cluster: Cluster = serde_json::from_value(applied).context("reading the Cluster")?;
        let live: Option<Cluster> = live.map(serde_json::to_value).transpose()?.map(serde_json::from_value).transpose()?;
        cluster.status = live.as_ref().and_then(|l| l.status.clone());
        cluster.metadata.uid = live.as_ref().and_then(|l| l.metadata.uid.clone());
        cluster.metadata.generation = live.as_ref().and_then(|l| l.metadata.generation);
        return cluster_plan(client, &cluster, &namespace, workspaces, scratch).await;
    }
    let spec_of = |v: &Value| v.get("spec").cloned().unwrap_or(Value::Null);
    let mut note = String::new();
    if kind == "TaskServ" {
        let ts: TaskServ = serde_json::from_value(applied.clone()).context("reading the TaskServ")?;
        match taskserv_refusal(&ts) {
            Ok(n) => note = n,
            Err(why) => return Ok(ObjectPlan::refused(resource, why)),
        }
    }
    let desired = spec_of(&applied);
    let before = live.as_ref().map(serde_json::to_value).transpose()?.map(|l| spec_of(&l));
    let changes = spec_changes(&resource, before.as_ref(), &desired);
    let summary = plan::summary(&changes);
    // A TaskServ's runs wait under Manual approval (its own, else its Workspace's).
    let needs_approval = kind == "TaskServ" && !changes.is_empty() && {
        let own: Option<provisioning_crds::Approval> = serde_json::from_value(desired["approval"].clone()).ok().flatten();
        let ws = provisioning_controller::effective_workspace::resolve(
            &namespace,
            workspaces.iter(),
            &provisioning_controller::config::default_workspace(),
        );
        provisioning_controller::approval::approval_of(own, ws.spec.approval) == provisioning_crds::Approval::Manual
    };
    Ok(ObjectPlan { resource, plan: Plan { summary, changes, ..Default::default() }, needs_approval, note, refused: false })
}

/// The controller's validation of a TaskServ: the service, its version and its config against
/// the catalog's schema. Secret fields left unset (the controller generates them) get a value
/// of their format first. `Ok(note)`: accepted (the note says what could not be checked).
fn taskserv_refusal(ts: &TaskServ) -> Result<String, String> {
    use provisioning_controller::taskserv::{inputs, validate};
    let catalog = match provisioning_taskservs::Catalog::load(&provisioning_taskservs::Catalog::default_dir()) {
        Ok(c) => c,
        Err(e) => return Ok(format!("service not checked: the catalog does not load ({e})")),
    };
    let mut config = ts.spec.config.clone().unwrap_or_else(|| Value::Object(Default::default()));
    let fields = catalog.get(&ts.spec.service).map(|s| s.secret_fields()).unwrap_or_default();
    for field in inputs::unset_secret_fields(&fields, &config) {
        let path: Vec<&str> = field.path.iter().map(String::as_str).collect();
        let value = inputs::generate(field.format).map_err(|e| e.to_string())?;
        let _ = inputs::set_path(&mut config, &path, Value::String(value));
    }
    let redactor = provisioning_taskservs::Redactor::default();
    match validate::validate_resolved(&ts.spec, config, None, redactor, &catalog) {
        Ok(_) => Ok(String::new()),
        // Values from Secrets and ConfigMaps are not read by plan: they may complete the config.
        Err(validate::InvalidTaskServ::InvalidConfig(why)) if !ts.spec.config_from.is_empty() => {
            Ok(format!("config not fully checked (configFrom is read by the controller): {why}"))
        }
        Err(invalid) => Err(format!("{}: {invalid}", invalid.reason())),
    }
}

/// Create, or an Update per changed top-level spec field, or nothing.
fn spec_changes(resource: &str, before: Option<&Value>, desired: &Value) -> Vec<PlannedChange> {
    let change = |field: String, action| PlannedChange {
        resource: resource.to_string(),
        field,
        action,
        from: String::new(),
        to: String::new(),
        reason: String::new(),
    };
    match before {
        None => vec![change(String::new(), ChangeAction::Create)],
        Some(before) => changed_fields(before, desired).into_iter().map(|f| change(format!("spec.{f}"), ChangeAction::Update)).collect(),
    }
}

/// Top-level spec fields whose values differ, sorted.
fn changed_fields(before: &Value, after: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let b = before.as_object().unwrap_or(&empty);
    let a = after.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| b.get(*k) != a.get(*k)).cloned().collect()
}

/// A Server's plan as its reconcile would compute it against the live status.
fn server_plan(server: &Server, namespace: &str, workspaces: &[Arc<Workspace>], scratch: &Path) -> anyhow::Result<ObjectPlan> {
    let resource = plan::resource(server);
    let ws = provisioning_controller::effective_workspace::resolve(
        namespace,
        workspaces.iter(),
        &provisioning_controller::config::default_workspace(),
    );
    let made_with = server.status.as_ref().filter(|s| s.provider_id.is_some()).and_then(|s| s.provider.as_deref());
    let refused = |note: String| Ok(ObjectPlan::refused(resource.clone(), note));
    let account = match validate::account(&server.spec, &ws, made_with) {
        Ok(a) => a,
        Err(invalid) => return refused(format!("{}: {}", invalid.reason, invalid.message)),
    };
    // Only the provider's pure tables are used (plans, in-place capabilities, prices): no
    // API call is made and no credentials are read, so placeholders stand in for them.
    let credentials = provisioning_providers::Credentials(BTreeMap::from(
        ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "UPCLOUD_USERNAME", "UPCLOUD_PASSWORD"]
            .map(|k| (k.to_string(), "plan-only".to_string())),
    ));
    let config = provisioning_controller::accounts::build::provider_config(
        &account,
        credentials,
        scratch,
        &provisioning_controller::host::HostPaths::default(),
    );
    let provider = provisioning_providers::build_provider(&config)
        .map_err(|e| anyhow::anyhow!("provider account {:?} of {resource}: {e}", account.name))?;
    let mut valid = match validate::validate(&server.spec, &ws, account, |p| provider.resolve_plan(p).map_err(|e| e.to_string())) {
        Ok(v) => v,
        Err(invalid) => return refused(format!("{}: {}", invalid.reason, invalid.message)),
    };
    // As the reconcile places it (a machine in a fallback zone stays there).
    valid.zone = validate::placement(&valid, server);
    let planned = plan::spec_plan(
        server,
        &valid,
        server.status.as_ref(),
        |f| provider.in_place(f),
        |a, b| provider.same_plan(a, b),
        |p, z| provisioning_controller::cost::machine_price(provider.as_ref(), p, z, &valid.disks),
    );
    let note = match &planned.carry {
        plan::Carry::Refused(message) => format!("UpdateRefused: {message}"),
        _ => String::new(),
    };
    let needs_approval = planned.plan.has_changes() && plan::approval(server, ws.spec.approval) == provisioning_crds::Approval::Manual;
    Ok(ObjectPlan { resource, plan: planned.plan, needs_approval, note, refused: false })
}

// Over 80 lines on purpose: read the live children, run the Cluster planner, then refine each
// member through the Server planner and describe each pool's rollout — one linear story.
/// A Cluster's plan as its reconcile would compute it against its live children — Servers
/// and TaskServs to create, change or delete (surge Servers of a rolling update included) —
/// with every member whose machine changes planned by the Server planner itself (in place
/// or a replacement, and why), and how the pool rolls.
async fn cluster_plan(
    client: &Client,
    cluster: &Cluster,
    namespace: &str,
    workspaces: &[Arc<Workspace>],
    scratch: &Path,
) -> anyhow::Result<ObjectPlan> {
    use provisioning_controller::cluster::{dereference, plan as cplan};
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let resource = format!("Cluster/{namespace}/{name}");
    let labelled = ListParams::default().labels(&format!("{}={name}", provisioning_crds::LABEL_CLUSTER));
    let (servers, taskservs) = if cluster.metadata.uid.is_some() {
        let servers =
            Api::<Server>::namespaced(client.clone(), namespace).list(&labelled).await.context("listing the Cluster's Servers")?;
        let taskservs =
            Api::<TaskServ>::namespaced(client.clone(), namespace).list(&labelled).await.context("listing the Cluster's TaskServs")?;
        (servers.items, taskservs.items)
    } else {
        (Vec::new(), Vec::new())
    };
    let children: Vec<cplan::ChildServer> = servers.iter().map(|s| dereference::child_server(s, &uid)).collect();
    let ts_children: Vec<cplan::ChildTaskServ> = taskservs.iter().map(|t| dereference::child_taskserv(t, &uid)).collect();
    let catalog = provisioning_taskservs::Catalog::load(&provisioning_taskservs::Catalog::default_dir());
    let (services, mut notes) = match &catalog {
        Ok(c) => (provisioning_controller::cluster::validate::validate(&name, &cluster.spec, c), Vec::new()),
        Err(e) => (Ok(Vec::new()), vec![format!("services not planned: the catalog does not load ({e})")]),
    };
    let services = match services {
        Ok(s) => s,
        Err(invalid) => return Ok(ObjectPlan::refused(resource, format!("{}: {}", invalid.reason, invalid.message))),
    };
    let status = cluster.status.clone().unwrap_or_default();
    let no_clusters = Vec::new();
    let ok_services = Ok(services.clone());
    let observed = cplan::Observed {
        name: &name,
        uid: &uid,
        generation: cluster.metadata.generation,
        spec: &cluster.spec,
        status: &status,
        services: &ok_services,
        servers: &children,
        taskservs: &ts_children,
        clusters: &no_clusters,
        now: k8s_openapi::jiff::Timestamp::now(),
        endpoint: cplan::EndpointGate::of(&cluster.spec, status.control_plane_endpoint.as_ref()),
    };
    let mut plan = cplan::cluster_plan(&observed, namespace, &services);
    // Members whose machine changes, and new members: what their own planner would do.
    for want in cplan::desired_with_surge(&observed) {
        let member = want.metadata.name.clone().unwrap_or_default();
        let live = servers.iter().find(|s| s.metadata.name.as_deref() == Some(member.as_str()));
        if live.is_some_and(|l| !cplan::machine_differs(&l.spec, &want.spec)) {
            continue;
        }
        let mut server = live.cloned().unwrap_or_else(|| want.clone());
        server.spec = provisioning_crds::ServerSpec { approval: server.spec.approval, ..want.spec.clone() };
        server.metadata.namespace = Some(namespace.to_string());
        let member_plan = server_plan(&server, namespace, workspaces, scratch)?;
        let who = format!("Server/{namespace}/{member}");
        plan.changes.retain(|c| c.resource != who || !matches!(c.field.as_str(), "" | "spec.plan" | "spec.zone" | "spec.image"));
        plan.changes.extend(member_plan.plan.changes);
        if member_plan.refused {
            return Ok(ObjectPlan::refused(resource, format!("{who}: {}", member_plan.note)));
        }
        if !member_plan.note.is_empty() {
            notes.push(format!("{who}: {}", member_plan.note));
        }
    }
    plan.summary = plan::summary(&plan.changes);
    plan.id = String::new();
    for pool in &cluster.spec.pools {
        let rolled = plan
            .changes
            .iter()
            .any(|c| c.resource.starts_with(&format!("Server/{namespace}/{name}-{}-", pool.name)) && c.action == ChangeAction::Replace);
        match (&pool.rollout, rolled) {
            (Some(r), true) => notes.push(format!(
                "pool {}: members are replaced {} at a time{}",
                pool.name,
                r.max_unavailable.max(1),
                if r.max_surge > 0 { format!(", after {} surge Server(s) of the new spec serve", r.max_surge) } else { String::new() }
            )),
            (None, true) => notes.push(format!("pool {}: every member is replaced at once (no rollout)", pool.name)),
            _ => {}
        }
    }
    let ws = provisioning_controller::effective_workspace::resolve(
        namespace,
        workspaces.iter(),
        &provisioning_controller::config::default_workspace(),
    );
    let manual =
        provisioning_controller::approval::approval_of(cluster.spec.approval, ws.spec.approval) == provisioning_crds::Approval::Manual;
    Ok(ObjectPlan { resource, needs_approval: manual && plan.has_changes(), plan, note: notes.join("\n  "), refused: false })
}

/// Terraform-like text: one block per object that changes (or is refused), then a total.
pub fn render(report: &PlanReport) -> String {
    let mut out = String::new();
    for o in &report.objects {
        // Kinds that are not planned (Namespaces, Secrets...) are in the JSON output only.
        if (!o.plan.has_changes() && o.note.is_empty()) || o.plan.summary == NOT_PLANNED {
            continue;
        }
        let id = if o.plan.id.is_empty() { String::new() } else { format!(" (plan {})", o.plan.id) };
        out.push_str(&format!("{}: {}{id}\n", o.resource, o.plan.summary));
        for c in &o.plan.changes {
            let sign = match c.action {
                ChangeAction::Create => "+",
                ChangeAction::Update => "~",
                ChangeAction::Replace => "-/+",
                ChangeAction::Delete => "-",
                ChangeAction::NoOp => " ",
            };
            // A Cluster's changes are about its children: name them.
            let what = match (c.field.is_empty(), c.resource == o.resource) {
                (true, _) => c.resource.clone(),
                (false, true) => c.field.clone(),
                (false, false) => format!("{} {}", c.resource, c.field),
            };
            let values = match (c.from.is_empty(), c.to.is_empty()) {
                (true, true) => String::new(),
                (true, false) => format!(": {}", c.to),
                _ => format!(": {} → {}", c.from, c.to),
            };
            let reason = if c.action == ChangeAction::Replace && !c.reason.is_empty() {
                format!(" (forces replacement: {})", c.reason)
            } else {
                String::new()
            };
            out.push_str(&format!("  {sign} {what}{values}{reason}\n"));
        }
        if !o.plan.monthly_cost_delta.is_empty() && o.plan.has_changes() {
            out.push_str(&format!("  monthly cost: {} {}\n", o.plan.monthly_cost_delta, o.plan.currency));
        }
        if o.needs_approval && o.plan.id.is_empty() {
            // Its plan id is computed by the controller once applied (over the live children).
            out.push_str("  waits for approval: once applied, annotate provisioning.dev/approve with its status.plan.id\n");
        } else if o.needs_approval {
            out.push_str(&format!("  waits for approval: annotate provisioning.dev/approve={} once applied\n", o.plan.id));
        }
        if !o.note.is_empty() {
            out.push_str(&format!("  {}\n", o.note));
        }
    }
    if report.refused > 0 {
        let changes = if report.changes { format!("Plan: {}; ", report.summary) } else { String::new() };
        out.push_str(&format!("\n{changes}{} refused.\n", report.refused));
    } else if report.changes {
        out.push_str(&format!("\nPlan: {}.\n", report.summary));
    } else {
        out.push_str("No changes. The cluster matches the manifests.\n");
    }
    out
}

/// Runs `provisioning plan`: prints the report (`output`: "" for text, "json") and returns the
/// exit code: 0 no changes, 2 changes, 1 an object would be refused.
pub async fn run(client: Client, paths: &[PathBuf], default_namespace: &str, output: &str) -> anyhow::Result<i32> {
    if !matches!(output, "" | "json") {
        bail!("unknown output {output:?} (use -o json, or nothing for text)");
    }
    let docs = read_manifests(paths)?;
    let report = plan(client, &docs, default_namespace).await?;
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.refused > 0 {
        1
    } else if report.changes {
        2
    } else {
        0
    })
}

/// A client from `kubeconfig` (default: `$KUBECONFIG`, `~/.kube/config`, then in-cluster) and
/// `context`, with the context's default namespace.
pub async fn client(kubeconfig: Option<PathBuf>, context: Option<String>) -> anyhow::Result<(Client, String)> {
    let options = kube::config::KubeConfigOptions { context, ..Default::default() };
    let config = match kubeconfig.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await.with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(e) if options.context.is_none() => {
                kube::Config::incluster().map_err(|_| anyhow::anyhow!("no usable kubeconfig ({e}) and no in-cluster config"))?
            }
            Err(e) => return Err(anyhow::Error::from(e).context("kubeconfig")),
        },
    };
    let namespace = config.default_namespace.clone();
    Ok((provisioning_controller::client::client_from_config(config)?, namespace))
}
