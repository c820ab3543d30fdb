//! What the console asks the API server, always with the visitor's own token: lists and gets
//! (as JSON, so fields this build does not know, such as a newer `status.plan`, still show),
//! SelfSubjectAccessReviews, and the annotation patches and deletes behind the actions.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::{ApiResource, DeleteParams, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use provisioning_controller::decode::BoundedObject;
use provisioning_crds::{GROUP, LABEL_CHANGE_OF, VERSION};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::trace::Objects;

/// Field manager of the console's patches.
pub const FIELD_MANAGER: &str = "provisioning-console";

/// Why a request failed, as the console reacts to it.
#[derive(Debug, thiserror::Error)]
pub enum ApiFailure {
    /// 401: the token is unknown or expired; the visitor signs in again.
    #[error("the API server no longer accepts your token")]
    Unauthorized,
    /// 403: RBAC refused; the message names what.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// 404.
    #[error("not found: {0}")]
    NotFound(String),
    /// Anything else (network, 5xx, decoding).
    #[error("{0}")]
    Other(String),
}

impl From<kube::Error> for ApiFailure {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 401 => ApiFailure::Unauthorized,
            kube::Error::Api(s) if s.code == 403 => ApiFailure::Forbidden(s.message.clone()),
            kube::Error::Api(s) if s.code == 404 => ApiFailure::NotFound(s.message.clone()),
            other => ApiFailure::Other(other.to_string()),
        }
    }
}

impl From<crate::listing::ListingError> for ApiFailure {
    fn from(e: crate::listing::ListingError) -> Self {
        match e {
            crate::listing::ListingError::Api(e) => e.into(),
            crate::listing::ListingError::Other(m) => ApiFailure::Other(m),
        }
    }
}

/// The kinds a console page shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Workspace (cluster-scoped).
    Workspace,
    /// Cluster.
    Cluster,
    /// Server.
    Server,
    /// TaskServ.
    TaskServ,
}

impl Kind {
    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Workspace => "Workspace",
            Kind::Cluster => "Cluster",
            Kind::Server => "Server",
            Kind::TaskServ => "TaskServ",
        }
    }

    /// The plural resource name (also the URL segment of its pages).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Workspace => "workspaces",
            Kind::Cluster => "clusters",
            Kind::Server => "servers",
            Kind::TaskServ => "taskservs",
        }
    }

    /// The kind for a plural resource name.
    pub fn from_plural(s: &str) -> Option<Kind> {
        [Kind::Workspace, Kind::Cluster, Kind::Server, Kind::TaskServ].into_iter().find(|k| k.plural() == s)
    }

    fn resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, self.name()), self.plural())
    }
}

/// A client for `base` (the API server's address and CA) that authenticates with `token` alone:
/// whatever credentials `base` carried (the controller's own) are dropped.
pub fn visitor_client(base: &kube::Config, token: SecretString) -> Result<Client, ApiFailure> {
    let mut config = base.clone();
    config.auth_info = kube::config::AuthInfo { token: Some(token), ..Default::default() };
    config.headers.clear();
    Client::try_from(config).map_err(|e| ApiFailure::Other(format!("building a client: {e}")))
}

/// A client for `base` without any credentials, for requests that carry their own
/// `Authorization` header (the sign-in check).
pub fn anonymous_client(base: &kube::Config) -> Result<Client, ApiFailure> {
    let mut config = base.clone();
    config.auth_info = kube::config::AuthInfo::default();
    config.headers.clear();
    Client::try_from(config).map_err(|e| ApiFailure::Other(format!("building a client: {e}")))
}

// Objects are read within the controller's per-object depth and size budget (a tenant's
// object of tiny maps decodes to ~90 times its size): one over it is shown by name only.
fn api(client: &Client, kind: Kind, namespace: Option<&str>) -> Api<BoundedObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &kind.resource()),
        None => Api::all_with(client.clone(), &kind.resource()),
    }
}

#[allow(clippy::unnecessary_wraps)] // one signature for every caller's `?`
fn to_value(o: BoundedObject) -> Result<Value, ApiFailure> {
    Ok(o.into_value())
}

/// Lists `kind` (in `namespace`, or across all for a Workspace) as JSON.
pub async fn list(client: &Client, kind: Kind, namespace: Option<&str>) -> Result<Vec<Value>, ApiFailure> {
    Ok(crate::listing::bounded_list(&api(client, kind, namespace), &ListParams::default()).await?)
}

/// Reads one object as JSON.
pub async fn get(client: &Client, kind: Kind, namespace: Option<&str>, name: &str) -> Result<Value, ApiFailure> {
    // Counted with the listings: each object may take up to the per-object budget decoded.
    let _turn = crate::listing::turn().await?;
    to_value(api(client, kind, namespace).get(name).await?)
}

/// The Clusters, Servers and TaskServs of `namespace` (and the Workspace `workspace`, when
/// given), for [`crate::trace::build`].
pub async fn namespace_objects(client: &Client, namespace: &str, workspace: Option<&str>) -> Result<Objects, ApiFailure> {
    let (clusters, servers, taskservs) = futures::try_join!(
        list(client, Kind::Cluster, Some(namespace)),
        list(client, Kind::Server, Some(namespace)),
        list(client, Kind::TaskServ, Some(namespace)),
    )?;
    let workspace = match workspace {
        Some(name) => Some(get(client, Kind::Workspace, None, name).await?),
        None => None,
    };
    Ok(Objects { namespace: namespace.to_string(), workspace, clusters, servers, taskservs })
}

/// Events (events.k8s.io/v1) about `kind`/`name` in `namespace`, oldest first.
pub async fn events_about(client: &Client, namespace: &str, kind: Kind, name: &str) -> Result<Vec<Value>, ApiFailure> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events");
    let api: Api<BoundedObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    // Only this object's events: the API server filters (a namespace can hold thousands).
    let lp = ListParams::default().fields(&event_selector(kind, name));
    let mut out: Vec<Value> = crate::listing::bounded_list(&api, &lp)
        .await?
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == kind.name() && e["regarding"]["name"] == name)
        .collect();
    out.sort_by_key(|e| event_time(e).to_string());
    Ok(out)
}

/// The field selector of the events.k8s.io/v1 Events about `kind`/`name` (names are checked
/// DNS names, so nothing in them needs escaping).
pub fn event_selector(kind: Kind, name: &str) -> String {
    format!("regarding.kind={},regarding.name={name}", kind.name())
}

/// When an event last happened (series, then eventTime, then deprecated timestamps).
pub fn event_time(e: &Value) -> &str {
    ["/series/lastObservedTime", "/eventTime", "/deprecatedLastTimestamp", "/metadata/creationTimestamp"]
        .iter()
        .find_map(|p| e.pointer(p).and_then(Value::as_str))
        .unwrap_or_default()
}

/// ChangeRecords owned by the object with `uid`, oldest first; empty where the API server does
/// not serve the kind (an older CRD set).
pub async fn change_records(client: &Client, namespace: &str, uid: &str) -> Result<Vec<Value>, ApiFailure> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "ChangeRecord"), "changerecords");
    let api: Api<BoundedObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    // The controller labels each record with the uid it records: only those are listed.
    let items = match crate::listing::bounded_list(&api, &ListParams::default().labels(&format!("{LABEL_CHANGE_OF}={uid}"))).await {
        Ok(items) => items,
        Err(crate::listing::ListingError::Api(kube::Error::Api(s))) if s.code == 404 => return Ok(vec![]),
        Err(e) => return Err(e.into()),
    };
    let mut out: Vec<Value> = items
        .into_iter()
        .filter(|r| r["metadata"]["ownerReferences"].as_array().is_some_and(|o| o.iter().any(|o| o["uid"] == uid)))
        .collect();
    out.sort_by_key(|r| r["metadata"]["creationTimestamp"].as_str().unwrap_or_default().to_string());
    Ok(out)
}

/// The virtual verb an approver needs on the object (as the controller checks it:
/// controller/src/approval/authorize.rs).
pub const APPROVE_VERB: &str = "approve";

/// Whether the visitor may `verb` the `kind` object (SelfSubjectAccessReview).
pub async fn may(client: &Client, verb: &str, kind: Kind, namespace: Option<&str>, name: &str) -> Result<bool, ApiFailure> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(kind.plural().into()),
                verb: Some(verb.into()),
                namespace: namespace.map(str::to_string),
                name: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Who `token` belongs to (SelfSubjectReview), which also proves the token is accepted; asked
/// through `client`, one without credentials of its own ([`anonymous_client`]), shared by
/// every sign-in.
pub async fn whoami(client: &Client, token: &SecretString) -> Result<String, ApiFailure> {
    use secrecy::ExposeSecret;
    let mut bearer = http::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
        .map_err(|_| ApiFailure::Other("the token cannot be sent in a header".into()))?;
    bearer.set_sensitive(true);
    let req = http::Request::builder()
        .method("POST")
        .uri("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .header(http::header::AUTHORIZATION, bearer)
        .body(serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})).unwrap_or_default())
        .map_err(|e| ApiFailure::Other(e.to_string()))?;
    let answer: Value = client.request(req).await?;
    Ok(answer["status"]["userInfo"]["username"].as_str().unwrap_or("unknown").to_string())
}

/// Sets (`Some`) or removes (`None`) one annotation with a merge patch.
pub async fn annotate(
    client: &Client,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), ApiFailure> {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    notices(client, kind, namespace).patch(name, &params, &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Deletes the object.
pub async fn delete(client: &Client, kind: Kind, namespace: Option<&str>, name: &str) -> Result<(), ApiFailure> {
    notices(client, kind, namespace).delete(name, &DeleteParams::default()).await?;
    Ok(())
}

/// `kind` for writes whose answer is not used: asked for metadata only, decoded to what names
/// the object (a tenant's object can be large).
fn notices(client: &Client, kind: Kind, namespace: Option<&str>) -> Api<provisioning_controller::decode::Notice> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &kind.resource()),
        None => Api::all_with(client.clone(), &kind.resource()),
    }
}
