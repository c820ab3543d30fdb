//! The admin kubeconfig of a built Kubernetes cluster as the Secret `<cluster>-kubeconfig` in
//! the Cluster's namespace, in Cluster API's format: type `cluster.x-k8s.io/secret`, key
//! `value`, label `cluster.x-k8s.io/cluster-name=<cluster>`, owned by the Cluster
//! (controller=true), its server the cluster's control-plane endpoint.
//!
//! How it leaves the machine: the first control plane's `install.nu` and `check.nu` print the
//! kubeconfig on a `PROVISIONING_SECRET` line, which the runner withholds from every output
//! (logs, the tail in status, events) and hands over as [`ScriptOutcome::secret`]; the TaskServ
//! reconciler passes it to [`offer`] and nowhere else. The Cluster reconciler [`export`]s it:
//! only from the server the controller itself names the first control plane (another
//! member's offer is dropped), with the server URL set from the controller's endpoint (not
//! the machine's word), into a Secret only it owns. Never copied into status, events, logs,
//! the audit log or ChangeRecords: those get the Secret's name and the endpoint only.
//!
//! Rotated: a new offer (the check re-reads `admin.conf` every health interval; a new CA
//! comes with a re-install) or a new endpoint rewrites the Secret when its value differs.
//! A Secret of that name the Cluster does not own is never overwritten: the condition
//! [`KUBECONFIG_READY`](provisioning_crds::kubernetes_condition::KUBECONFIG_READY) names it.
//!
//! [`ScriptOutcome::secret`]: provisioning_taskservs::ScriptOutcome

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use provisioning_crds::{
    Cluster, KUBECONFIG_SECRET_SUFFIX, KUBECONFIG_SECRET_TYPE, LABEL_CAPI_CLUSTER_NAME, kubernetes_condition::KUBECONFIG_READY,
};
use provisioning_taskservs::SecretResult;
use serde_json::Value;

use super::plan::{ChildServer, ChildTaskServ};
use super::stages;
use crate::conditions::{DesiredCondition, Status};
use crate::context::{Context, FIELD_MANAGER};
use crate::error::Error;

/// The key of the kubeconfig in the Secret (Cluster API's).
pub const SECRET_KEY: &str = "value";
/// The API server's port when the endpoint is the first control plane's address.
const API_PORT: u16 = 6443;

/// A kubeconfig a member's script reported (its `Debug` prints nothing of it).
#[derive(Clone)]
struct Offer {
    server: String,
    kubeconfig: String,
    /// Arrival order (the oldest is evicted first).
    at: u64,
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offer").field("server", &self.server).finish_non_exhaustive()
    }
}

/// Offers per (namespace, TaskServ): the latest run's, until a Cluster pass takes it.
static OFFERS: LazyLock<Mutex<HashMap<(String, String), Offer>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn offers() -> std::sync::MutexGuard<'static, HashMap<(String, String), Offer>> {
    OFFERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Called by the TaskServ reconciler for a succeeded run's secret result of the kubernetes
/// service: keeps its `kubeconfig` (a string) for the Cluster of `taskserv`, the latest run's
/// only (at most one per TaskServ, at most 64 KiB: the runner's result cap).
/// Anything else in it is ignored.
pub fn offer(namespace: &str, taskserv: &str, server: &str, secret: &SecretResult) {
    let Some(kubeconfig) = secret.0.get("kubeconfig").and_then(Value::as_str).filter(|k| k.len() <= MAX_KUBECONFIG) else { return };
    let mut offers = offers();
    let key = (namespace.to_string(), taskserv.to_string());
    // Bounded: at most MAX_OFFERS_PER_NAMESPACE per namespace and MAX_OFFERS in all, the
    // oldest evicted (its TaskServ's next health check offers again), so one tenant's
    // standalone or orphaned kubernetes TaskServs cannot keep another's Cluster waiting.
    if !offers.contains_key(&key) {
        let in_namespace = offers.keys().filter(|(ns, _)| ns == namespace).count();
        let oldest = |offers: &HashMap<(String, String), Offer>, same_namespace: bool| {
            offers.iter().filter(|((ns, _), _)| !same_namespace || ns == namespace).min_by_key(|(_, o)| o.at).map(|(k, _)| k.clone())
        };
        let evict = if in_namespace >= MAX_OFFERS_PER_NAMESPACE {
            oldest(&offers, true)
        } else if offers.len() >= MAX_OFFERS {
            oldest(&offers, false)
        } else {
            None
        };
        if let Some(evicted) = evict {
            offers.remove(&evicted);
        }
    }
    let at = OFFER_CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    offers.insert(key, Offer { server: server.to_string(), kubeconfig: kubeconfig.to_string(), at });
}

/// Orders offers by arrival (for eviction).
static OFFER_CLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Most offers of one namespace waiting at once.
const MAX_OFFERS_PER_NAMESPACE: usize = 8;
/// Most kubeconfig offers waiting for their Cluster at once.
const MAX_OFFERS: usize = 256;
/// Largest kubeconfig accepted (kubeadm's admin.conf is ~6 KiB), from a machine or a Secret.
const MAX_KUBECONFIG: usize = 64 << 10;

fn take_offer(namespace: &str, taskserv: &str) -> Option<Offer> {
    offers().remove(&(namespace.to_string(), taskserv.to_string()))
}

/// Puts back an offer taken by a pass that could not write it (unless a newer one came).
fn return_offer(namespace: &str, taskserv: &str, offer: Offer) {
    let mut offers = offers();
    if offers.len() < MAX_OFFERS {
        offers.entry((namespace.to_string(), taskserv.to_string())).or_insert(offer);
    }
}

/// The Secret's name for Cluster `cluster`.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}{KUBECONFIG_SECRET_SUFFIX}")
}

/// `host:port` of the API: the kubernetes config's `controlPlaneEndpoint`, else the first
/// control plane's address (InternalIP first, as the scripts' `api-endpoint`) and 6443.
pub fn endpoint(k8s: &ChildTaskServ, init: &str, namespace: &str, ctx: &Context) -> Option<String> {
    if let Some(e) = stages::config_str(k8s, "controlPlaneEndpoint").filter(|e| !e.is_empty()) {
        return Some(e.to_string());
    }
    let servers = ctx.stores.servers.state();
    let server = servers.iter().find(|s| s.metadata.namespace.as_deref() == Some(namespace) && s.metadata.name.as_deref() == Some(init))?;
    let addresses = &server.status.as_ref()?.addresses;
    let address = addresses.iter().find(|a| a.address_type == "InternalIP").or(addresses.first())?;
    // Status is outside input here: only a host goes into the kubeconfig's server.
    super::plan::endpoint_host_ok(&address.address).then(|| super::plan::host_port(&address.address, API_PORT))
}

/// Why a kubeconfig was not accepted (never quoting it).
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

/// `kubeconfig` (YAML or JSON, as kubeadm writes `admin.conf`) with every cluster's server
/// set to `https://<endpoint>`, as JSON (which is YAML; kubectl reads it).
pub fn normalize(kubeconfig: &str, endpoint: &str) -> Result<String, Invalid> {
    if kubeconfig.len() > MAX_KUBECONFIG {
        return Err(Invalid("the kubeconfig is larger than 64 KiB"));
    }
    let mut config: Value = provisioning_yaml::from_str(kubeconfig).map_err(|_| Invalid("the kubeconfig is not YAML"))?;
    if config.get("kind").and_then(Value::as_str) != Some("Config") {
        return Err(Invalid("the kubeconfig is not of kind Config"));
    }
    let clusters = config
        .get_mut("clusters")
        .and_then(Value::as_array_mut)
        .filter(|c| !c.is_empty())
        .ok_or(Invalid("the kubeconfig has no clusters"))?;
    for c in clusters {
        let cluster = c.get_mut("cluster").and_then(Value::as_object_mut).ok_or(Invalid("a cluster of the kubeconfig has no `cluster`"))?;
        if cluster.get("certificate-authority-data").and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(Invalid("a cluster of the kubeconfig has no certificate-authority-data"));
        }
        cluster.insert("server".into(), Value::String(format!("https://{endpoint}")));
        // Only what kubeadm writes: no proxy, no skipped verification for tools that read it.
        cluster.retain(|k, _| matches!(k.as_str(), "server" | "certificate-authority-data"));
    }
    let users =
        config.get_mut("users").and_then(Value::as_array_mut).filter(|u| !u.is_empty()).ok_or(Invalid("the kubeconfig has no users"))?;
    for u in users {
        // Credentials as data only: no `exec` or auth-provider command for a reader to run.
        if let Some(user) = u.get_mut("user").and_then(Value::as_object_mut) {
            user.retain(|k, _| matches!(k.as_str(), "client-certificate-data" | "client-key-data" | "token"));
        }
    }
    serde_json::to_string_pretty(&config).map_err(|_| Invalid("the kubeconfig could not be written"))
}

fn owned_by(secret: &Secret, uid: &str) -> bool {
    secret.owner_references().iter().any(|o| o.controller == Some(true) && o.uid == uid && o.kind == "Cluster")
}

fn value_of(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(SECRET_KEY)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The Secret as it should be.
fn desired(cluster: &Cluster, namespace: &str, value: String) -> Secret {
    let name = cluster.name_any();
    let owner = OwnerReference {
        api_version: "provisioning.dev/v1alpha1".into(),
        kind: "Cluster".into(),
        name: name.clone(),
        uid: cluster.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&name)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(LABEL_CAPI_CLUSTER_NAME.to_string(), name)])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some(KUBECONFIG_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([(SECRET_KEY.to_string(), ByteString(value.into_bytes()))])),
        ..Default::default()
    }
}

fn cond(status: Status, reason: &str, message: impl Into<String>) -> DesiredCondition {
    DesiredCondition::new(KUBECONFIG_READY, status, reason, message)
}

/// Exports the kubeconfig of a Kubernetes Cluster (see the module). Returns the
/// `KubeconfigReady` condition, or none for a Cluster without the kubernetes service.
pub async fn export(
    cluster: &Cluster,
    namespace: &str,
    servers: &[ChildServer],
    taskservs: &[ChildTaskServ],
    ctx: &Context,
) -> Result<Option<DesiredCondition>, Error> {
    let Some(k8s) = stages::kubernetes_taskserv(taskservs) else { return Ok(None) };
    let name = cluster.name_any();
    let secret_name = secret_name(&name);
    let roles = stages::roles(k8s, servers);
    let offered = take_offer(namespace, &k8s.name);
    let Some(init) = roles.init() else {
        return Ok(Some(cond(Status::False, "WaitingForControlPlane", "no control-plane server yet")));
    };
    let offered = match offered {
        Some(o) if o.server == init => Some(o),
        Some(o) => {
            tracing::warn!(cluster = %name, namespace, server = %o.server, init, "ignoring a kubeconfig reported by a server that is not the first control plane");
            None
        }
        None => None,
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    // Only the key used is decoded (crate::slim): a tenant can make a Secret of that name large.
    let existing = crate::slim::SlimApi::of::<Secret>(ctx.client.clone(), Some(namespace))
        .get_data(&secret_name, true, &|k| k == SECRET_KEY)
        .await?
        .map(crate::slim::SlimData::secret);
    let uid = cluster.uid().unwrap_or_default();
    if let Some(s) = &existing
        && !owned_by(s, &uid)
    {
        return Ok(Some(cond(
            Status::False,
            "SecretNotOwned",
            format!("Secret {namespace}/{secret_name} exists and is not owned by Cluster {name}: not overwritten; delete or rename it"),
        )));
    }
    let Some(endpoint) = endpoint(k8s, init, namespace, ctx) else {
        if let Some(o) = offered {
            return_offer(namespace, &k8s.name, o);
        }
        return Ok(Some(cond(Status::False, "WaitingForEndpoint", format!("the address of {init} is not known yet"))));
    };
    let current = existing.as_ref().and_then(value_of);
    let Some(source) = offered.as_ref().map(|o| o.kubeconfig.clone()).or_else(|| current.clone()) else {
        let why = if k8s.serving.contains_key(init) {
            format!("waiting for {init} to report the admin kubeconfig (its next health check)")
        } else {
            format!("waiting for kubeadm init on {init}")
        };
        return Ok(Some(cond(Status::False, "WaitingForKubeconfig", why)));
    };
    let value = match normalize(&source, &endpoint) {
        Ok(v) => v,
        Err(Invalid(why)) => {
            return Ok(Some(cond(Status::False, "InvalidKubeconfig", format!("{init} reported a kubeconfig that is not usable: {why}"))));
        }
    };
    let message = format!("Secret {secret_name} (server https://{endpoint})");
    let want = desired(cluster, namespace, value.clone());
    let written = write(&api, &name, &secret_name, existing, current.as_deref(), want, ctx).await;
    if written.is_err()
        && let Some(o) = offered
    {
        return_offer(namespace, &k8s.name, o);
    }
    written?;
    tracing::debug!(cluster = %name, namespace, endpoint, "kubeconfig Secret up to date");
    Ok(Some(cond(Status::True, "Exported", message)))
}

/// Creates the Secret, or patches it when its value, type or label differ.
async fn write(
    api: &Api<Secret>,
    name: &str,
    secret_name: &str,
    existing: Option<Secret>,
    current: Option<&str>,
    want: Secret,
    ctx: &Context,
) -> Result<(), Error> {
    let value = want.data.as_ref().and_then(|d| d.get(SECRET_KEY)).map(|b| b.0.as_slice());
    match existing {
        None => {
            let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
            match api.create(&params, &want).await {
                Ok(_) => {}
                // Created meanwhile (by whom is seen on the next pass).
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    return Err(Error::InProgress(format!("Secret {secret_name} was created meanwhile")));
                }
                Err(e) => return Err(e.into()),
            }
            ctx.metrics.record_write("Secret");
            tracing::info!(cluster = %name, secret = %secret_name, "kubeconfig exported");
        }
        Some(s)
            if current.map(str::as_bytes) != value
                || s.type_.as_deref() != Some(KUBECONFIG_SECRET_TYPE)
                || s.labels().get(LABEL_CAPI_CLUSTER_NAME).map(String::as_str) != Some(name) =>
        {
            // Guarded by resourceVersion: a Secret replaced since the read is not written over.
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": s.resource_version(), "labels": want.metadata.labels},
                "data": want.data,
            });
            // The answer decoded slim (crate::slim): the Secret may hold a tenant's bloat.
            crate::slim::SlimApi::of::<Secret>(api.clone().into_client(), s.namespace().as_deref())
                .patch(secret_name, &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &Patch::Merge(&patch))
                .await?;
            ctx.metrics.record_write("Secret");
            tracing::info!(cluster = %name, secret = %secret_name, "kubeconfig rotated");
        }
        Some(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN_CONF: &str = "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: Q0E=\n    server: https://10.0.0.5:6443\n  name: k8s\ncontexts:\n- context: {cluster: k8s, user: kubernetes-admin}\n  name: kubernetes-admin@k8s\ncurrent-context: kubernetes-admin@k8s\nusers:\n- name: kubernetes-admin\n  user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}\n";

    #[test]
    fn the_server_is_the_controllers_endpoint_and_bad_input_is_named_without_quoting_it() -> Result<(), Box<dyn std::error::Error>> {
        let out = normalize(ADMIN_CONF, "lb.example.com:6443").map_err(|e| e.0)?;
        let v: Value = serde_json::from_str(&out)?;
        assert_eq!(v["clusters"][0]["cluster"]["server"], "https://lb.example.com:6443");
        assert_eq!(v["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(normalize("kind: Pod", "x:1"), Err(Invalid("the kubeconfig is not of kind Config")));
        assert_eq!(normalize("{{{", "x:1"), Err(Invalid("the kubeconfig is not YAML")));
        let no_ca = ADMIN_CONF.replace("certificate-authority-data: Q0E=", "insecure-skip-tls-verify: true");
        assert_eq!(normalize(&no_ca, "x:1"), Err(Invalid("a cluster of the kubeconfig has no certificate-authority-data")));
        // Too large to parse (a tenant's Secret of that name, or a machine's output).
        let large = format!("{ADMIN_CONF}# {}", "0".repeat(MAX_KUBECONFIG));
        assert_eq!(normalize(&large, "x:1"), Err(Invalid("the kubeconfig is larger than 64 KiB")));
        // Nothing a reader would run or trust beyond what kubeadm writes.
        let extra = ADMIN_CONF
            .replace(
                "    server: https://10.0.0.5:6443\n",
                "    server: https://10.0.0.5:6443\n    proxy-url: http://evil:3128\n    insecure-skip-tls-verify: true\n",
            )
            .replace(
                "user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}",
                "user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ, exec: {command: /bin/sh}}",
            );
        let out: Value = serde_json::from_str(&normalize(&extra, "x:1").map_err(|e| e.0)?)?;
        assert_eq!(out["clusters"][0]["cluster"].as_object().map(|c| c.len()), Some(2), "{out}");
        assert!(out["users"][0]["user"].get("exec").is_none(), "{out}");
        Ok(())
    }

    #[test]
    fn offers_debug_print_no_kubeconfig_and_only_a_kubeconfig_string_is_kept() {
        offer("ns-offers", "ts", "cp-0", &SecretResult(serde_json::json!({"kubeconfig": ADMIN_CONF})));
        let o = take_offer("ns-offers", "ts");
        assert!(o.as_ref().is_some_and(|o| o.server == "cp-0" && !format!("{o:?}").contains("S0VZ")), "{o:?}");
        assert!(take_offer("ns-offers", "ts").is_none(), "taken once");
        offer("ns-offers", "ts", "cp-0", &SecretResult(serde_json::json!({"kubeconfig": 5})));
        assert!(take_offer("ns-offers", "ts").is_none());
    }

    #[test]
    fn one_namespaces_offers_cannot_crowd_out_anothers() {
        let kubeconfig = SecretResult(serde_json::json!({"kubeconfig": ADMIN_CONF}));
        offer("ns-victim", "k8s", "cp-0", &kubeconfig);
        for i in 0..(MAX_OFFERS * 2) {
            offer("ns-flood", &format!("ts-{i}"), "cp-0", &kubeconfig);
        }
        let flood = offers().keys().filter(|(ns, _)| ns == "ns-flood").count();
        assert_eq!(flood, MAX_OFFERS_PER_NAMESPACE, "the flooding namespace keeps its newest only");
        assert!(take_offer("ns-victim", "k8s").is_some(), "another namespace's offer stays");
        // The newest is kept, the oldest evicted.
        assert!(take_offer("ns-flood", &format!("ts-{}", MAX_OFFERS * 2 - 1)).is_some());
        assert!(take_offer("ns-flood", "ts-0").is_none());
    }
}
