//! Who makes a request: [`UserInfo`] and the well-known users and groups.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// User name of the admin token's identity.
pub const ADMIN_USER: &str = "provisioning-admin";
/// The group that is allowed everything.
pub const MASTERS: &str = "system:masters";

/// The controller's ServiceAccount (deploy/rbac/service-account.yaml), exempt from the
/// per-identity limits by default ([`crate::limits`]).
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "system:serviceaccount:provisioning-system:provisioning-controller";
/// Every authenticated identity is in this group.
pub const AUTHENTICATED: &str = "system:authenticated";

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

/// The identity that authenticated a request, before impersonation (a request extension):
/// approvals and spec changes are recorded as its, so that impersonating another user — a
/// ServiceAccount that may approve, say — never makes one person count as two.
#[derive(Debug, Clone)]
pub struct Authenticated(pub UserInfo);

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

    /// The namespace of a ServiceAccount identity (`system:serviceaccount:<ns>:<name>`), None
    /// for any other user.
    pub fn service_account_namespace(&self) -> Option<&str> {
        let (ns, name) = self.name.strip_prefix("system:serviceaccount:")?.split_once(':')?;
        (!ns.is_empty() && !name.is_empty()).then_some(ns)
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
