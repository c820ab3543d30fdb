//! Identities and authorization, as kube-apiserver does them.
//!
//! * Authentication: the admin bearer token of the kubeconfig is a `system:masters` identity;
//!   ServiceAccount tokens are ES256 JWTs issued by the TokenRequest API ([`tokens`]).
//! * Impersonation: `Impersonate-User/-Group/-Uid/-Extra-*` headers, each checked with the
//!   `impersonate` verb on users/groups/serviceaccounts/uids/userextras.
//! * Authorization: `system:masters` is always allowed (kube's privileged-group authorizer);
//!   everyone else through RBAC over stored Roles and bindings ([`rbac`]).
//! * Escalation prevention: a user grants (in a Role or a binding) only what they hold, unless
//!   they may `escalate` or `bind` ([`escalation`]).
//! * The review APIs (SelfSubjectAccessReview and friends) and TokenRequest ([`reviews`]).
//! * Bootstrap roles and ClusterRole aggregation ([`bootstrap`]).

pub mod access;
pub mod approver;
pub mod attributes;
pub mod bootstrap;
pub mod escalation;
pub mod identity;
pub mod proto;
pub mod rbac;
pub mod reviews;
pub mod tokens;

pub use crate::registry::{VIRTUAL_PREFIX, virtual_types};
pub use access::{Auth, AuthnError, SERVICEACCOUNTS};
pub use attributes::{Attributes, warn_forbidden};
pub use identity::{ADMIN_USER, AUTHENTICATED, MASTERS, UserInfo};
