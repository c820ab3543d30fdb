//! What a request does, in the terms RBAC rules speak ([`Attributes`], kube's
//! `authorizer.Attributes`), derived from the HTTP request as kube's RequestInfoFactory does,
//! and the 403 a denied request gets.

use http::Method;
use serde_json::{Value, json};

use super::identity::UserInfo;
use crate::error::ApiError;

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

/// A boolean query parameter as upstream's `Convert_Slice_string_To_bool` reads it (its first
/// value): absent is false, `0` and `false` (any case) are false, anything else — the empty
/// value included — is true. The server and the authorizer both read `watch` (and every other
/// flag) through this one function, so a request is never served as a watch and authorized as
/// a list.
pub fn query_bool(first_value: Option<&str>) -> bool {
    first_value.is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
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
        let flag = |k: &str| query_bool(q.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str()));
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

/// Logs a denied request: who, verb, resource, namespace. Never the credential.
pub fn warn_forbidden(user: &UserInfo, a: &Attributes) {
    if a.resource_request {
        let resource = if a.api_group.is_empty() { a.resource_with_sub() } else { format!("{}.{}", a.resource_with_sub(), a.api_group) };
        tracing::warn!(user = %user.name, verb = %a.verb, resource = %resource, name = %a.name, namespace = %a.namespace, "forbidden");
    } else {
        tracing::warn!(user = %user.name, verb = %a.verb, path = %a.path, "forbidden");
    }
}

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
        // `watch` read as the server reads it (upstream's bool parameter): the first value;
        // empty is true, `0`/`false` in any case are false.
        let servers = "/apis/provisioning.dev/v1alpha1/namespaces/demo/servers";
        for (query, verb) in [
            ("watch=", "watch"),
            ("watch", "watch"),
            ("watch=TRUE", "watch"),
            ("watch=yes", "watch"),
            ("watch=0", "list"),
            ("watch=False", "list"),
            ("watch=false&watch=true", "list"),
            ("watch=&watch=false", "watch"),
        ] {
            assert_eq!(Attributes::from_request(&Method::GET, servers, Some(query)).verb, verb, "{query}");
        }
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
