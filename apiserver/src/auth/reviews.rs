//! Create-only virtual resources answered from the authenticator and authorizer:
//! SelfSubjectAccessReview, LocalSubjectAccessReview, SubjectAccessReview,
//! SelfSubjectRulesReview, SelfSubjectReview, TokenReview, and the TokenRequest subresource
//! `serviceaccounts/token`. Nothing here is stored.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::access::{Auth, SERVICEACCOUNTS};
use super::attributes::Attributes;
use super::identity::UserInfo;
use super::rbac::PolicyRule;
use super::tokens;
use crate::error::{ApiError, ApiResult, Cause};
use crate::storage::Store;

/// Which virtual resource a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    /// authentication.k8s.io SelfSubjectReview.
    SelfSubject,
    /// authentication.k8s.io TokenReview.
    Token,
    /// authorization.k8s.io SelfSubjectAccessReview.
    SelfSubjectAccess,
    /// authorization.k8s.io LocalSubjectAccessReview.
    LocalSubjectAccess,
    /// authorization.k8s.io SubjectAccessReview.
    SubjectAccess,
    /// authorization.k8s.io SelfSubjectRulesReview.
    SelfSubjectRules,
    /// `POST .../serviceaccounts/NAME/token`.
    TokenRequest,
}

impl Review {
    /// The virtual resource `a` addresses, if any.
    pub fn of(a: &Attributes) -> Option<Self> {
        if !a.resource_request || a.api_version != "v1" {
            return None;
        }
        let r = match (a.api_group.as_str(), a.resource.as_str(), a.subresource.as_str()) {
            ("authentication.k8s.io", "selfsubjectreviews", "") => Review::SelfSubject,
            ("authentication.k8s.io", "tokenreviews", "") => Review::Token,
            ("authorization.k8s.io", "selfsubjectaccessreviews", "") => Review::SelfSubjectAccess,
            ("authorization.k8s.io", "localsubjectaccessreviews", "") => Review::LocalSubjectAccess,
            ("authorization.k8s.io", "subjectaccessreviews", "") => Review::SubjectAccess,
            ("authorization.k8s.io", "selfsubjectrulesreviews", "") => Review::SelfSubjectRules,
            ("", "serviceaccounts", "token") if !a.name.is_empty() && !a.namespace.is_empty() => Review::TokenRequest,
            _ => return None,
        };
        Some(r)
    }

    fn kind(self) -> (&'static str, &'static str) {
        match self {
            Review::SelfSubject => ("SelfSubjectReview", "authentication.k8s.io/v1"),
            Review::Token => ("TokenReview", "authentication.k8s.io/v1"),
            Review::SelfSubjectAccess => ("SelfSubjectAccessReview", "authorization.k8s.io/v1"),
            Review::LocalSubjectAccess => ("LocalSubjectAccessReview", "authorization.k8s.io/v1"),
            Review::SubjectAccess => ("SubjectAccessReview", "authorization.k8s.io/v1"),
            Review::SelfSubjectRules => ("SelfSubjectRulesReview", "authorization.k8s.io/v1"),
            Review::TokenRequest => ("TokenRequest", "authentication.k8s.io/v1"),
        }
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn invalid(review: Review, name: &str, field: &str, message: &str) -> ApiError {
    let (kind, api_version) = review.kind();
    let group = api_version.split('/').next().unwrap_or_default();
    ApiError::invalid(kind, group, name, vec![Cause::new("FieldValueInvalid", field, message)])
}

/// Reads the attributes an access review asks about.
fn review_attributes(review: Review, spec: &Value) -> ApiResult<Attributes> {
    let (ra, nra) = (&spec["resourceAttributes"], &spec["nonResourceAttributes"]);
    match (ra.is_object(), nra.is_object()) {
        (true, false) => {
            let s = |k: &str| ra[k].as_str().unwrap_or_default().to_string();
            Ok(Attributes {
                verb: s("verb"),
                resource_request: true,
                path: String::new(),
                api_group: s("group"),
                api_version: s("version"),
                resource: s("resource"),
                subresource: s("subresource"),
                namespace: s("namespace"),
                name: s("name"),
            })
        }
        (false, true) => Ok(Attributes {
            verb: nra["verb"].as_str().unwrap_or_default().to_string(),
            path: nra["path"].as_str().unwrap_or_default().to_string(),
            ..Default::default()
        }),
        _ => Err(invalid(
            review,
            "",
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

fn access_status(auth: &Auth, store: &Store, user: &UserInfo, a: &Attributes) -> Value {
    let d = auth.authorize(store, user, a);
    let mut status = json!({"allowed": d.allowed});
    if !d.reason.is_empty() {
        status["reason"] = json!(d.reason);
    }
    status
}

/// Answers a POST to a virtual resource: the object with its status filled in (HTTP 201),
/// and the warnings for the client (a token lifetime shortened to the server's maximum).
/// `user` is the (possibly impersonated) caller; `a` the request's attributes.
pub fn create(auth: &Auth, store: &Store, user: &UserInfo, a: &Attributes, review: Review, body: Value) -> ApiResult<(Value, Vec<String>)> {
    if review == Review::TokenRequest {
        return token_request(auth, store, a, checked(review, body)?);
    }
    Ok((answer(auth, store, user, a, review, checked(review, body)?)?, vec![]))
}

/// The body of a review as a JSON object of its kind.
fn checked(review: Review, mut body: Value) -> ApiResult<Value> {
    let (kind, api_version) = review.kind();
    if !body.is_object() {
        return Err(ApiError::bad_request(format!("the body of a {kind} must be a JSON object")));
    }
    if let Some(k) = body["kind"].as_str()
        && !k.is_empty()
        && k != kind
    {
        return Err(ApiError::bad_request(format!("expected a {kind}, got kind {k:?}")));
    }
    body["kind"] = json!(kind);
    body["apiVersion"] = json!(api_version);
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    body["metadata"]["creationTimestamp"] = Value::Null;
    Ok(body)
}

/// The status of a review (every kind but TokenRequest).
fn answer(auth: &Auth, store: &Store, user: &UserInfo, a: &Attributes, review: Review, mut body: Value) -> ApiResult<Value> {
    let spec = body["spec"].clone();
    let status = match review {
        Review::SelfSubject => json!({"userInfo": user.to_value()}),
        Review::SelfSubjectAccess => {
            let attrs = review_attributes(review, &spec)?;
            access_status(auth, store, user, &attrs)
        }
        Review::LocalSubjectAccess | Review::SubjectAccess => {
            let mut attrs = review_attributes(review, &spec)?;
            if review == Review::LocalSubjectAccess {
                if !attrs.resource_request {
                    return Err(invalid(review, "", "spec.nonResourceAttributes", "disallowed on this kind of request"));
                }
                if attrs.namespace.is_empty() {
                    attrs.namespace = a.namespace.clone();
                } else if attrs.namespace != a.namespace {
                    return Err(invalid(review, "", "spec.resourceAttributes.namespace", "must match metadata.namespace"));
                }
            }
            let subject = UserInfo {
                name: spec["user"].as_str().unwrap_or_default().to_string(),
                uid: spec["uid"].as_str().unwrap_or_default().to_string(),
                groups: strs(&spec["groups"]),
                extra: spec["extra"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), strs(v))).collect::<BTreeMap<_, _>>())
                    .unwrap_or_default(),
            };
            if subject.name.is_empty() && subject.groups.is_empty() {
                return Err(invalid(review, "", "spec.user", "at least one of user or group must be specified"));
            }
            access_status(auth, store, &subject, &attrs)
        }
        Review::SelfSubjectRules => {
            let ns = spec["namespace"].as_str().unwrap_or_default();
            rules_status(auth, store, user, ns)
        }
        Review::Token => {
            let token = spec["token"].as_str().unwrap_or_default();
            let wanted = strs(&spec["audiences"]);
            let audiences: Vec<String> = if wanted.is_empty() { auth.audiences().to_vec() } else { wanted };
            match auth.authenticate_token(store, token, &audiences) {
                Ok(u) => json!({"authenticated": true, "user": u.to_value(), "audiences": audiences}),
                Err(e) => json!({"user": {}, "error": e.to_string()}),
            }
        }
        Review::TokenRequest => return Err(ApiError::internal("a TokenRequest is not a review")),
    };
    body["status"] = status;
    Ok(body)
}

fn rules_status(auth: &Auth, store: &Store, user: &UserInfo, ns: &str) -> Value {
    let (mut rules, errors) = auth.policy(store).rules_for(user, ns);
    if user.is_master() {
        // kube's privileged-group authorizer reports everything as allowed.
        let everything =
            [json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}), json!({"verbs": ["*"], "nonResourceURLs": ["*"]})];
        for (i, v) in everything.iter().enumerate() {
            let r = PolicyRule::from_value(v);
            rules.retain(|x| *x != r);
            rules.insert(i, r);
        }
    }
    let resource_rules: Vec<Value> = rules
        .iter()
        .filter(|r| !r.resources.is_empty())
        .map(|r| {
            let mut v = PolicyRule { non_resource_urls: vec![], ..r.clone() }.to_value();
            if r.api_groups.is_empty() {
                v["apiGroups"] = json!([]);
            }
            v
        })
        .collect();
    let non_resource_rules: Vec<Value> = rules
        .iter()
        .filter(|r| !r.non_resource_urls.is_empty())
        .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
        .collect();
    let mut status = json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": !errors.is_empty()});
    if !errors.is_empty() {
        status["evaluationError"] = json!(errors.join(", "));
    }
    status
}

fn token_request(auth: &Auth, store: &Store, a: &Attributes, mut body: Value) -> ApiResult<(Value, Vec<String>)> {
    let review = Review::TokenRequest;
    let (ns, name) = (a.namespace.as_str(), a.name.as_str());
    let spec = body["spec"].clone();
    let seconds = match &spec["expirationSeconds"] {
        Value::Null => tokens::DEFAULT_EXPIRATION_SECONDS,
        v => v.as_i64().ok_or_else(|| invalid(review, name, "spec.expirationSeconds", "must be an integer"))?,
    };
    if seconds < tokens::MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            review,
            name,
            "spec.expirationSeconds",
            &format!("Invalid value: {seconds}: may not specify a duration less than 10 minutes"),
        ));
    }
    if seconds > tokens::MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            review,
            name,
            "spec.expirationSeconds",
            &format!("Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"),
        ));
    }
    // Upstream's --service-account-max-token-expiration: a longer lifetime is shortened, with
    // a warning (not refused).
    let mut warnings = vec![];
    let max = auth.max_token_expiration_seconds();
    if seconds > max {
        warnings.push(format!("requested expiration of {seconds} seconds shortened to {max} seconds"));
    }
    let seconds = seconds.min(max);
    if !spec["boundObjectRef"].is_null() {
        return Err(invalid(review, name, "spec.boundObjectRef", "binding tokens to objects is not supported by this control plane"));
    }
    let mut audiences = strs(&spec["audiences"]);
    if audiences.is_empty() {
        audiences = auth.audiences().to_vec();
    }
    let uid = {
        let st = store.read();
        st.objects
            .get(SERVICEACCOUNTS)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .filter(|e| !e.deleting)
            .map(|e| e.uid.clone())
    };
    let uid = uid.ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
    let now = chrono::Utc::now().timestamp();
    let claims = auth.signer().claims(ns, name, &uid, audiences.clone(), now, seconds);
    let token = auth.signer().sign(&claims).map_err(|e| ApiError::internal(format!("signing the token: {e}")))?;
    let expires =
        chrono::DateTime::from_timestamp(claims.exp, 0).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_default();
    body["metadata"]["name"] = json!(name);
    body["metadata"]["namespace"] = json!(ns);
    body["spec"] = json!({"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": null});
    body["status"] = json!({"token": token, "expirationTimestamp": expires});
    Ok((body, warnings))
}
