//! [`Auth`]: one server's authentication (the admin token, ServiceAccount tokens),
//! impersonation and authorization (RBAC over the stored Roles and bindings, the policy
//! rebuilt only when one of them changed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::HeaderMap;

use super::attributes::{Attributes, warn_forbidden};
use super::identity::{AUTHENTICATED, UserInfo};
use super::rbac::{Decision, Policy};
use super::tokens;
use crate::error::ApiError;
use crate::storage::Store;

/// Storage key of ServiceAccounts (built-in `group/plural` convention).
pub const SERVICEACCOUNTS: &str = "/serviceaccounts";
pub(crate) const CLUSTERROLES: &str = "rbac.authorization.k8s.io/clusterroles";
const ROLES: &str = "rbac.authorization.k8s.io/roles";
const CLUSTERROLEBINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
const ROLEBINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";

type Fingerprint = u64;

type Cache = Mutex<Option<(Fingerprint, Arc<Policy>)>>;

fn lock_cache(m: &Cache) -> std::sync::MutexGuard<'_, Option<(Fingerprint, Arc<Policy>)>> {
    match m.lock() {
        Ok(c) => c,
        Err(p) => p.into_inner(),
    }
}

/// The store's RBAC generation: changes whenever an RBAC object is written, read in O(1) (it
/// is read on every request that is not the admin's; iterating the RBAC objects was 2.1 ms at
/// 100k of them, under the store's read lock).
fn fingerprint(st: &crate::storage::State) -> Fingerprint {
    st.rbac_generation
}

/// Authentication and authorization state of one server.
pub struct Auth {
    admin_token: String,
    signer: tokens::Signer,
    audiences: Vec<String>,
    max_token_expiration_seconds: i64,
    cache: Cache,
    /// Held by the one request rebuilding the policy.
    rebuilding: Mutex<()>,
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
        Auth {
            admin_token: admin_token.to_string(),
            signer,
            audiences,
            max_token_expiration_seconds: tokens::DEFAULT_MAX_EXPIRATION_SECONDS,
            cache: Mutex::new(None),
            rebuilding: Mutex::new(()),
        }
    }

    /// With tokens from the TokenRequest API living at most `max` (kube-apiserver
    /// `--service-account-max-token-expiration`); clamped to the API's own bounds.
    pub fn with_max_token_expiration(mut self, max: std::time::Duration) -> Self {
        let seconds = i64::try_from(max.as_secs()).unwrap_or(tokens::MAX_EXPIRATION_SECONDS);
        self.max_token_expiration_seconds = seconds.clamp(tokens::MIN_EXPIRATION_SECONDS, tokens::MAX_EXPIRATION_SECONDS);
        self
    }

    /// The longest lifetime of a token from the TokenRequest API, in seconds.
    pub fn max_token_expiration_seconds(&self) -> i64 {
        self.max_token_expiration_seconds
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
        let fp = fingerprint(&store.read());
        let previous = match lock_cache(&self.cache).as_ref() {
            Some((cached, p)) if *cached == fp => return p.clone(),
            other => other.map(|(_, p)| p.clone()),
        };
        // One rebuild at a time. A request arriving meanwhile answers from the policy before
        // the change (as kube-apiserver's informer-fed RBAC cache lags a write by moments)
        // rather than blocking its async worker on the rebuild; the next request after the
        // rebuild sees the new one.
        let _rebuilding = match (self.rebuilding.try_lock(), previous) {
            (Ok(g), _) => g,
            (Err(std::sync::TryLockError::Poisoned(p)), _) => p.into_inner(),
            (Err(std::sync::TryLockError::WouldBlock), Some(previous)) => return previous,
            (Err(std::sync::TryLockError::WouldBlock), None) => match self.rebuilding.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            },
        };
        // Entries are shared and decoded after the store's lock is given back, so that
        // rebuilding a large policy never holds up writers.
        let (fp, raw) = {
            let st = store.read();
            let fp = fingerprint(&st);
            if let Some((cached, p)) = lock_cache(&self.cache).as_ref()
                && *cached == fp
            {
                return p.clone();
            }
            let entries = |k: &str| st.objects.get(k).map(|m| m.values().cloned().collect::<Vec<_>>()).unwrap_or_default();
            (fp, [entries(CLUSTERROLES), entries(ROLES), entries(CLUSTERROLEBINDINGS), entries(ROLEBINDINGS)])
        };
        let rebuild = move || {
            let [crs, rs, crbs, rbs] = &raw;
            fn bytes(es: &[Arc<crate::storage::Entry>]) -> impl Iterator<Item = &[u8]> {
                es.iter().map(|e| e.bytes.as_ref())
            }
            Arc::new(Policy::from_stored(bytes(crs), bytes(rs), bytes(crbs), bytes(rbs)))
        };
        // Decoding every role is CPU work: on a multi-threaded runtime the async worker hands
        // its other tasks to the rest first (block_in_place).
        let multi_thread =
            tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let p = if multi_thread { tokio::task::block_in_place(rebuild) } else { rebuild() };
        *lock_cache(&self.cache) = Some((fp, p.clone()));
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
