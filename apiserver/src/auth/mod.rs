//! Identities and authorization, as kube-apiserver does them.
//!
//! * Authentication: the admin bearer token of the kubeconfig is a `system:masters` identity;
//!   ServiceAccount tokens are ES256 JWTs issued by the TokenRequest API ([`tokens`]).
//! * Impersonation: `Impersonate-User/-Group/-Uid/-Extra-*` headers, each checked with the
//!   `impersonate` verb on users/groups/serviceaccounts/uids/userextras.
//! * Authorization: `system:masters` is always allowed (kube's privileged-group authorizer);
//!   everyone else through RBAC over stored Roles and bindings ([`rbac`]).
//! * The review APIs (SelfSubjectAccessReview and friends) and TokenRequest ([`reviews`]).
//! * Bootstrap roles and ClusterRole aggregation ([`bootstrap`]).

pub mod bootstrap;
pub mod proto;
pub mod rbac;
pub mod reviews;
pub mod tokens;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, Method};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::storage::Store;
use rbac::{Decision, Policy};

/// User name of the admin token's identity.
pub const ADMIN_USER: &str = "provisioning-admin";
/// The group that is allowed everything.
pub const MASTERS: &str = "system:masters";
/// Every authenticated identity is in this group.
pub const AUTHENTICATED: &str = "system:authenticated";

/// Storage key of ServiceAccounts (built-in `group/plural` convention).
pub const SERVICEACCOUNTS: &str = "/serviceaccounts";
pub(crate) const CLUSTERROLES: &str = "rbac.authorization.k8s.io/clusterroles";
const ROLES: &str = "rbac.authorization.k8s.io/roles";
const CLUSTERROLEBINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
const ROLEBINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";

/// Who is making a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// Uid (a ServiceAccount's uid), possibly empty.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (credential id of a token).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The identity of the admin token.
    pub fn admin() -> Self {
        UserInfo { name: ADMIN_USER.into(), uid: String::new(), groups: vec![MASTERS.into(), AUTHENTICATED.into()], extra: BTreeMap::new() }
    }

    /// The identity of ServiceAccount `ns/name`.
    pub fn service_account(ns: &str, name: &str, uid: &str) -> Self {
        UserInfo {
            name: format!("system:serviceaccount:{ns}:{name}"),
            uid: uid.into(),
            groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}"), AUTHENTICATED.into()],
            extra: BTreeMap::new(),
        }
    }

    /// Whether the identity is in `system:masters`.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// `authentication.k8s.io/v1 UserInfo`.
    pub fn to_value(&self) -> Value {
        let mut v = json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            v["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            v["extra"] = json!(self.extra);
        }
        v
    }
}

/// What a request does, in the terms RBAC rules speak (kube's `authorizer.Attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// get, list, watch, create, update, patch, delete, deletecollection (resources) or the
    /// lower-case HTTP method (non-resource paths).
    pub verb: String,
    /// Whether this addresses an API resource (else a non-resource path).
    pub resource_request: bool,
    /// Request path (non-resource requests).
    pub path: String,
    /// API group.
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource (`status`, `token`).
    pub subresource: String,
    /// Namespace.
    pub namespace: String,
    /// Object name.
    pub name: String,
}

fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (crate::urlpath::percent_decode(k), crate::urlpath::percent_decode(v)),
            None => (crate::urlpath::percent_decode(p), String::new()),
        })
        .collect()
}

impl Attributes {
    /// Derives the attributes of an HTTP request as kube's RequestInfoFactory does.
    pub fn from_request(method: &Method, path: &str, query: Option<&str>) -> Self {
        let lower = method.as_str().to_ascii_lowercase();
        let non_resource = || Attributes { verb: lower.clone(), path: path.to_string(), ..Default::default() };
        let segs: Vec<String> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).map(crate::urlpath::percent_decode).collect();
        let (group, version, mut rest): (&str, &str, &[String]) = match segs.first().map(String::as_str) {
            Some("api") if segs.len() >= 3 => ("", segs[1].as_str(), &segs[2..]),
            Some("apis") if segs.len() >= 4 => (segs[1].as_str(), segs[2].as_str(), &segs[3..]),
            _ => return non_resource(),
        };
        let mut a = Attributes {
            resource_request: true,
            api_group: group.into(),
            api_version: version.into(),
            path: path.into(),
            ..Default::default()
        };
        let mut watch_path = false;
        if rest.first().map(String::as_str) == Some("watch") {
            watch_path = true;
            rest = &rest[1..];
        }
        if rest.first().map(String::as_str) == Some("namespaces") && rest.len() > 1 {
            a.namespace = rest[1].clone();
            // `namespaces/NS/status|finalize` are subresources of the namespace itself.
            if rest.len() > 2 && !matches!(rest[2].as_str(), "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        a.resource = rest.first().cloned().unwrap_or_default();
        a.name = rest.get(1).cloned().unwrap_or_default();
        a.subresource = rest.get(2).cloned().unwrap_or_default();
        let q = query_pairs(query);
        let flag = |k: &str| q.iter().any(|(kk, v)| kk == k && matches!(v.as_str(), "1" | "true"));
        a.verb = match *method {
            Method::POST => "create".into(),
            Method::GET | Method::HEAD => "get".into(),
            Method::PUT => "update".into(),
            Method::PATCH => "patch".into(),
            Method::DELETE => "delete".into(),
            _ => lower.clone(),
        };
        if a.name.is_empty() {
            if a.verb == "get" {
                a.verb = "list".into();
            } else if a.verb == "delete" {
                a.verb = "deletecollection".into();
            }
        }
        if watch_path || (a.verb == "list" && flag("watch")) {
            a.verb = "watch".into();
        }
        // A list or watch narrowed to one name by field selector is authorized for that name.
        if matches!(a.verb.as_str(), "list" | "watch" | "deletecollection")
            && a.name.is_empty()
            && let Some((_, fs)) = q.iter().find(|(k, _)| k == "fieldSelector")
        {
            for term in fs.split(',') {
                if let Some(n) = term.strip_prefix("metadata.name=").map(|n| n.trim_start_matches('=')) {
                    a.name = n.to_string();
                }
            }
        }
        a
    }

    fn resource_with_sub(&self) -> String {
        if self.subresource.is_empty() { self.resource.clone() } else { format!("{}/{}", self.resource, self.subresource) }
    }

    /// kube-apiserver's 403 for these attributes (`responsewriters.ForbiddenStatusError`).
    pub fn forbidden(&self, user: &UserInfo, reason: &str) -> ApiError {
        let who = &user.name;
        let msg = if !self.resource_request {
            format!("User {who:?} cannot {} path {:?}", self.verb, self.path)
        } else if !self.namespace.is_empty() {
            format!(
                "User {who:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
                self.verb,
                self.resource_with_sub(),
                self.api_group,
                self.namespace
            )
        } else {
            format!(
                "User {who:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
                self.verb,
                self.resource_with_sub(),
                self.api_group
            )
        };
        // Same escaping as upstream: the message may be rendered as HTML by proxies.
        let msg = msg.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let err = if reason.is_empty() { msg } else { format!("{msg}: {reason}") };
        let mut details = serde_json::Map::new();
        let message = if !self.resource_request || (self.resource.is_empty() && self.api_group.is_empty()) {
            format!("forbidden: {err}")
        } else {
            let gr = if self.api_group.is_empty() { self.resource.clone() } else { format!("{}.{}", self.resource, self.api_group) };
            if !self.name.is_empty() {
                details.insert("name".into(), json!(self.name));
            }
            if !self.api_group.is_empty() {
                details.insert("group".into(), json!(self.api_group));
            }
            if !self.resource.is_empty() {
                details.insert("kind".into(), json!(self.resource));
            }
            if self.name.is_empty() { format!("{gr} is forbidden: {err}") } else { format!("{gr} {:?} is forbidden: {err}", self.name) }
        };
        let mut e = ApiError::forbidden(message);
        e.details = Some(Value::Object(details));
        e
    }
}

type Fingerprint = [(usize, u64); 4];

/// Authentication and authorization state of one server.
pub struct Auth {
    admin_token: String,
    signer: tokens::Signer,
    audiences: Vec<String>,
    cache: Mutex<Option<(Fingerprint, Arc<Policy>)>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The admin token never appears in debug output.
        f.debug_struct("Auth").field("signer", &self.signer).field("audiences", &self.audiences).finish()
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a request could not be authenticated (logged; never contains the credential).
#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    /// No `Authorization: Bearer` header.
    #[error("no bearer token")]
    Missing,
    /// Neither the admin token nor a JWT.
    #[error("unknown bearer token")]
    Unknown,
    /// A JWT that did not verify.
    #[error("invalid service account token: {0}")]
    Token(#[from] tokens::TokenError),
    /// The token's ServiceAccount is gone or was recreated.
    #[error("service account {0} no longer exists or has a different uid")]
    ServiceAccountGone(String),
}

impl Auth {
    /// State for a server whose admin token is `admin_token` and whose tokens `signer` signs.
    pub fn new(admin_token: &str, signer: tokens::Signer) -> Self {
        let audiences = vec![signer.issuer().to_string()];
        Auth { admin_token: admin_token.to_string(), signer, audiences, cache: Mutex::new(None) }
    }

    /// The audiences the server accepts (and puts into tokens by default).
    pub fn audiences(&self) -> &[String] {
        &self.audiences
    }

    /// The token signer.
    pub fn signer(&self) -> &tokens::Signer {
        &self.signer
    }

    /// Identifies the caller of a request from its `Authorization` header.
    pub fn authenticate(&self, store: &Store, headers: &HeaderMap) -> Result<UserInfo, AuthnError> {
        let token = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(AuthnError::Missing)?;
        self.authenticate_token(store, token, &self.audiences)
    }

    /// Identifies the holder of `token` when it is meant for one of `audiences` (TokenReview).
    pub fn authenticate_token(&self, store: &Store, token: &str, audiences: &[String]) -> Result<UserInfo, AuthnError> {
        if constant_eq(token.as_bytes(), self.admin_token.as_bytes()) {
            return Ok(UserInfo::admin());
        }
        if !tokens::Signer::looks_like_jwt(token) {
            return Err(AuthnError::Unknown);
        }
        let claims = self.signer.verify(token, audiences, chrono::Utc::now().timestamp())?;
        let k = &claims.kubernetes;
        let sa = &k.serviceaccount;
        let who = format!("{}/{}", k.namespace, sa.name);
        let live = {
            let st = store.read();
            st.objects
                .get(SERVICEACCOUNTS)
                .and_then(|m| m.get(&(k.namespace.clone(), sa.name.clone())))
                .map(|e| (e.uid.clone(), e.deleting))
        };
        match live {
            Some((uid, false)) if uid == sa.uid => {}
            _ => return Err(AuthnError::ServiceAccountGone(who)),
        }
        let mut user = UserInfo::service_account(&k.namespace, &sa.name, &sa.uid);
        user.extra.insert("authentication.kubernetes.io/credential-id".into(), vec![format!("JTI={}", claims.jti)]);
        Ok(user)
    }

    /// Applies `Impersonate-*` headers: checks that `user` may impersonate each requested
    /// attribute and returns the impersonated identity (or `user` when nothing is requested).
    pub fn impersonate(&self, store: &Store, user: UserInfo, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
        let values = |name: &str| -> Result<Vec<String>, ApiError> {
            headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().map(str::to_string).map_err(|_| ApiError::bad_request(format!("header {name} is not valid text"))))
                .collect()
        };
        let users = values("impersonate-user")?;
        let groups = values("impersonate-group")?;
        let uids = values("impersonate-uid")?;
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in headers {
            if let Some(key) = k.as_str().strip_prefix("impersonate-extra-") {
                let value = v.to_str().map_err(|_| ApiError::bad_request(format!("header {k} is not valid text")))?;
                extra.entry(crate::urlpath::percent_decode(key)).or_default().push(value.to_string());
            }
        }
        if users.is_empty() {
            if groups.is_empty() && uids.is_empty() && extra.is_empty() {
                return Ok(user);
            }
            return Err(ApiError::bad_request("requested impersonation of groups, uid or extra without impersonating a user"));
        }
        if users.len() > 1 || uids.len() > 1 {
            return Err(ApiError::bad_request("only one Impersonate-User and one Impersonate-Uid header may be given"));
        }
        let target = users[0].clone();
        let check = |a: Attributes| -> Result<(), ApiError> {
            let d = self.authorize(store, &user, &a);
            if d.allowed {
                Ok(())
            } else {
                warn_forbidden(&user, &a);
                Err(a.forbidden(&user, &d.reason))
            }
        };
        let imp = |resource: &str, sub: &str, ns: &str, name: &str| Attributes {
            verb: "impersonate".into(),
            resource_request: true,
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            api_version: "v1".into(),
            ..Default::default()
        };
        let mut out_groups: Vec<String> = vec![];
        match target.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
            Some((ns, name)) => {
                check(imp("serviceaccounts", "", ns, name))?;
                out_groups.push("system:serviceaccounts".into());
                out_groups.push(format!("system:serviceaccounts:{ns}"));
            }
            None => check(imp("users", "", "", &target))?,
        }
        for g in &groups {
            check(imp("groups", "", "", g))?;
        }
        for u in &uids {
            check(Attributes { api_group: "authentication.k8s.io".into(), ..imp("uids", "", "", u) })?;
        }
        for (k, vs) in &extra {
            for v in vs {
                check(Attributes { api_group: "authentication.k8s.io".into(), ..imp("userextras", k, "", v) })?;
            }
        }
        for g in groups {
            if !out_groups.contains(&g) {
                out_groups.push(g);
            }
        }
        if target != "system:anonymous" && !out_groups.iter().any(|g| g == AUTHENTICATED) {
            out_groups.push(AUTHENTICATED.into());
        }
        Ok(UserInfo { name: target, uid: uids.into_iter().next().unwrap_or_default(), groups: out_groups, extra })
    }

    /// The current RBAC policy, rebuilt only when an RBAC object changed.
    pub fn policy(&self, store: &Store) -> Arc<Policy> {
        let st = store.read();
        let fp_of = |k: &str| st.objects.get(k).map(|m| (m.len(), m.values().map(|e| e.rv).max().unwrap_or(0))).unwrap_or((0, 0));
        let fp: Fingerprint = [fp_of(CLUSTERROLES), fp_of(ROLES), fp_of(CLUSTERROLEBINDINGS), fp_of(ROLEBINDINGS)];
        let mut cache = match self.cache.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if let Some((cached, p)) = cache.as_ref()
            && *cached == fp
        {
            return p.clone();
        }
        let vals = |k: &str| -> Vec<Value> { st.objects.get(k).map(|m| m.values().map(|e| e.value()).collect()).unwrap_or_default() };
        let (crs, rs, crbs, rbs) = (vals(CLUSTERROLES), vals(ROLES), vals(CLUSTERROLEBINDINGS), vals(ROLEBINDINGS));
        let p = Arc::new(Policy::from_values(&crs, &rs, &crbs, &rbs));
        *cache = Some((fp, p.clone()));
        p
    }

    /// Decides whether `user` may do what `a` describes.
    pub fn authorize(&self, store: &Store, user: &UserInfo, a: &Attributes) -> Decision {
        if user.is_master() {
            return Decision { allowed: true, reason: String::new() };
        }
        self.policy(store).authorize(user, a)
    }
}

/// Logs a denied request: who, verb, resource, namespace. Never the credential.
pub fn warn_forbidden(user: &UserInfo, a: &Attributes) {
    if a.resource_request {
        let resource = if a.api_group.is_empty() { a.resource_with_sub() } else { format!("{}.{}", a.resource_with_sub(), a.api_group) };
        tracing::warn!(user = %user.name, verb = %a.verb, resource = %resource, name = %a.name, namespace = %a.namespace, "forbidden");
    } else {
        tracing::warn!(user = %user.name, verb = %a.verb, path = %a.path, "forbidden");
    }
}

pub use crate::registry::{VIRTUAL_PREFIX, virtual_types};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_attributes_follow_request_info_factory() {
        let a = Attributes::from_request(&Method::GET, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers", None);
        assert_eq!(
            (a.verb.as_str(), a.api_group.as_str(), a.resource.as_str(), a.namespace.as_str()),
            ("list", "provisioning.dev", "servers", "demo")
        );
        let a = Attributes::from_request(
            &Method::GET,
            "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers",
            Some("watch=1&resourceVersion=5"),
        );
        assert_eq!(a.verb, "watch");
        let a = Attributes::from_request(&Method::GET, "/api/v1/watch/namespaces/demo/configmaps/x", None);
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "x"));
        let a = Attributes::from_request(
            &Method::GET,
            "/api/v1/namespaces/demo/configmaps",
            Some("fieldSelector=metadata.name%3Dx&watch=true"),
        );
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "x"));
        let a = Attributes::from_request(&Method::PUT, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers/web/status", None);
        assert_eq!((a.verb.as_str(), a.subresource.as_str(), a.name.as_str()), ("update", "status", "web"));
        let a = Attributes::from_request(&Method::DELETE, "/api/v1/namespaces/demo/secrets", None);
        assert_eq!(a.verb, "deletecollection");
        let a = Attributes::from_request(&Method::GET, "/api/v1/namespaces/demo", None);
        assert_eq!((a.verb.as_str(), a.resource.as_str(), a.name.as_str(), a.namespace.as_str()), ("get", "namespaces", "demo", "demo"));
        let a = Attributes::from_request(&Method::PUT, "/api/v1/namespaces/demo/finalize", None);
        assert_eq!((a.resource.as_str(), a.name.as_str(), a.subresource.as_str()), ("namespaces", "demo", "finalize"));
        let a = Attributes::from_request(&Method::POST, "/api/v1/namespaces/demo/serviceaccounts/ci/token", None);
        assert_eq!(
            (a.verb.as_str(), a.resource.as_str(), a.subresource.as_str(), a.name.as_str()),
            ("create", "serviceaccounts", "token", "ci")
        );
        for p in ["/apis", "/api", "/apis/provisioning.dev", "/apis/provisioning.dev/v1", "/version", "/openapi/v3"] {
            let a = Attributes::from_request(&Method::GET, p, None);
            assert!(!a.resource_request, "{p}");
            assert_eq!(a.verb, "get");
        }
    }

    #[test]
    fn forbidden_messages_match_kube_apiserver() {
        let u = UserInfo::service_account("ns", "sa", "x");
        let a = Attributes::from_request(&Method::GET, "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers", None);
        let e = a.forbidden(&u, "");
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            r#"servers.provisioning.dev is forbidden: User "system:serviceaccount:ns:sa" cannot list resource "servers" in API group "provisioning.dev" in the namespace "demo""#
        );
        assert_eq!(e.details, Some(json!({"group": "provisioning.dev", "kind": "servers"})));
        let a = Attributes::from_request(&Method::GET, "/api/v1/namespaces/kube-system/secrets/tok", None);
        assert_eq!(
            a.forbidden(&u, "").message,
            r#"secrets "tok" is forbidden: User "system:serviceaccount:ns:sa" cannot get resource "secrets" in API group "" in the namespace "kube-system""#
        );
        let a = Attributes::from_request(
            &Method::DELETE,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/servers.provisioning.dev",
            None,
        );
        assert_eq!(
            a.forbidden(&u, "").message,
            r#"customresourcedefinitions.apiextensions.k8s.io "servers.provisioning.dev" is forbidden: User "system:serviceaccount:ns:sa" cannot delete resource "customresourcedefinitions" in API group "apiextensions.k8s.io" at the cluster scope"#
        );
        let a = Attributes::from_request(&Method::GET, "/metrics", None);
        let e = a.forbidden(&u, "");
        assert_eq!(e.message, r#"forbidden: User "system:serviceaccount:ns:sa" cannot get path "/metrics""#);
        assert_eq!(e.details, Some(json!({})));
    }
}
