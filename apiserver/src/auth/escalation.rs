//! RBAC escalation prevention, as kube-apiserver's RBAC registry does it (issue 26, item 2).
//!
//! * A Role or ClusterRole may be created or updated only by a user who already holds every
//!   rule in it at that scope (the namespace of a Role; the cluster for a ClusterRole), or who
//!   may `escalate` roles/clusterroles (by name), or who is in `system:masters`.
//! * A RoleBinding or ClusterRoleBinding may be created or updated only by a user who holds
//!   every rule of the referenced role at the binding's scope, or who may `bind` that role, or
//!   who is in `system:masters`.
//!
//! * A ClusterRole with an `aggregationRule` needs `escalate` (or `system:masters`).
//! * A Workspace's approval policy is loosened (`spec.approval` from Manual to anything else,
//!   `spec.requireDistinctApprover` from true to false) only by a user who may `approve`
//!   that Workspace (the virtual verb the approvals themselves need): whoever may only edit
//!   a Workspace cannot turn off the approvals of its namespace (tightening needs nothing).
//!
//! An update that changes nothing but the fields the garbage collector needs (ownerReferences,
//! finalizers) is not checked, as upstream's `IsOnlyMutatingGCFields`: a controller may put
//! its finalizer on a binding of a role it does not hold. Any other update is checked like a
//! create — a binding's new subjects, a role's labels — since the roleRef or rules left as
//! they were are exactly what the writer may not hold. Messages mirror upstream's
//! `ConfirmNoEscalation`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::attributes::Attributes;
use super::identity::UserInfo;
use super::rbac::{GROUP, Policy, PolicyRule};
use crate::error::{ApiError, ApiResult};

/// The RBAC kinds whose writes are checked, by storage key and plural.
const KINDS: [(&str, &str); 4] = [
    ("rbac.authorization.k8s.io/roles", "roles"),
    ("rbac.authorization.k8s.io/clusterroles", "clusterroles"),
    ("rbac.authorization.k8s.io/rolebindings", "rolebindings"),
    ("rbac.authorization.k8s.io/clusterrolebindings", "clusterrolebindings"),
];

/// Our group, and the storage key of Workspaces.
const PROVISIONING: &str = "provisioning.dev";
const WORKSPACES: &str = "provisioning.dev/workspaces";

/// The escalation check of one request: who writes, and the policy they hold.
#[derive(Debug, Clone)]
pub struct Guard {
    user: UserInfo,
    policy: Arc<Policy>,
}

impl Guard {
    /// The guard for a request, or None when nothing is to be checked: not a write of an RBAC
    /// kind, or a `system:masters` user (upstream's `EscalationAllowed`).
    pub fn for_request(user: &UserInfo, a: &Attributes, policy: impl FnOnce() -> Arc<Policy>) -> Option<Arc<Guard>> {
        let writes = matches!(a.verb.as_str(), "create" | "update" | "patch");
        let rbac = a.resource_request && a.api_group == GROUP && KINDS.iter().any(|(_, plural)| *plural == a.resource);
        let workspace = a.resource_request && a.api_group == PROVISIONING && a.resource == "workspaces" && a.subresource.is_empty();
        if !writes || !(rbac || workspace) || user.is_master() {
            return None;
        }
        Some(Arc::new(Guard { user: user.clone(), policy: policy() }))
    }

    /// Checks the object a write would store (`old`: the stored one on update).
    pub fn check(&self, storage: &str, new: &Value, old: Option<&Value>) -> ApiResult<()> {
        if storage == WORKSPACES {
            return self.check_approval_policy(new, old);
        }
        let Some((_, plural)) = KINDS.iter().find(|(s, _)| *s == storage) else { return Ok(()) };
        let name = new["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = new["metadata"]["namespace"].as_str().unwrap_or_default();
        let forbidden = |detail: String| {
            let mut e = ApiError::forbidden(format!("{plural}.{GROUP} {name:?} is forbidden: {detail}"));
            e.details = Some(serde_json::json!({"name": name, "group": GROUP, "kind": plural}));
            e
        };
        if old.is_some_and(|o| only_gc_fields(new, o)) {
            return Ok(());
        }
        let rules = if plural.ends_with("bindings") {
            let kind = new["roleRef"]["kind"].as_str().unwrap_or_default();
            let role = new["roleRef"]["name"].as_str().unwrap_or_default();
            let role_plural = if kind == "ClusterRole" { "clusterroles" } else { "roles" };
            if self.allowed("bind", role_plural, namespace, role) {
                return Ok(());
            }
            self.policy.role_ref_rules(kind, role, namespace).map_err(forbidden)?
        } else {
            if self.allowed("escalate", plural, namespace, name) {
                return Ok(());
            }
            // Upstream: an aggregating ClusterRole gathers rules nobody checked here, so writing
            // one (or turning one into a plain role) takes full authority.
            let aggregates = |v: &Value| !v["aggregationRule"].is_null();
            if (aggregates(new) || old.is_some_and(aggregates)) && self.confirm_no_escalation("", &full_authority()).is_err() {
                return Err(forbidden("must have cluster-admin privileges to use the aggregationRule".into()));
            }
            new["rules"].as_array().into_iter().flatten().map(PolicyRule::from_value).collect()
        };
        self.confirm_no_escalation(namespace, &rules).map_err(forbidden)
    }

    /// A Workspace write that loosens its approval policy needs `approve` on it.
    fn check_approval_policy(&self, new: &Value, old: Option<&Value>) -> ApiResult<()> {
        let Some(old) = old else { return Ok(()) };
        let Some(loosened) = loosened_approval(old, new) else { return Ok(()) };
        let name = new["metadata"]["name"].as_str().unwrap_or_default();
        if self.allowed_in(PROVISIONING, "approve", "workspaces", "", name) {
            return Ok(());
        }
        let mut e = ApiError::forbidden(format!(
            "workspaces.{PROVISIONING} {name:?} is forbidden: {loosened} loosens the approval of the namespace's plans, which \
             needs the approve verb on the Workspace (user {:?} may edit it but not approve: the admin role of a namespace does \
             not grant it on cluster-scoped Workspaces; a ClusterRole with approve on workspaces.{PROVISIONING} does)",
            self.user.name
        ));
        e.details = Some(serde_json::json!({"name": name, "group": PROVISIONING, "kind": "workspaces"}));
        Err(e)
    }

    fn allowed(&self, verb: &str, plural: &str, namespace: &str, name: &str) -> bool {
        self.allowed_in(GROUP, verb, plural, namespace, name)
    }

    fn allowed_in(&self, group: &str, verb: &str, plural: &str, namespace: &str, name: &str) -> bool {
        let a = Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "v1".into(),
            resource: plural.into(),
            subresource: String::new(),
            namespace: namespace.into(),
            name: name.into(),
            path: String::new(),
        };
        self.policy.authorize(&self.user, &a).allowed
    }

    /// Upstream's `ConfirmNoEscalation`: every rule is covered by the user's own rules in
    /// `namespace` (cluster-wide ones only when it is empty).
    fn confirm_no_escalation(&self, namespace: &str, rules: &[PolicyRule]) -> Result<(), String> {
        let (owned, errors) = self.policy.rules_for(&self.user, namespace);
        let missing = missing_rules(&owned, rules);
        if missing.is_empty() {
            return Ok(());
        }
        let groups = self.user.groups.iter().map(|g| format!("{g:?}")).collect::<Vec<_>>().join(" ");
        let mut msg = format!(
            "user {:?} (groups=[{groups}]) is attempting to grant RBAC permissions not currently held:\n{}",
            self.user.name,
            missing.join("\n")
        );
        if !errors.is_empty() {
            msg.push_str(&format!("; resolution errors: [{}]", errors.join(" ")));
        }
        Err(msg)
    }
}

/// What in a Workspace write loosens its approval policy, if anything.
fn loosened_approval(old: &Value, new: &Value) -> Option<String> {
    let manual = |v: &Value| v["spec"]["approval"].as_str() == Some("Manual");
    let distinct = |v: &Value| v["spec"]["requireDistinctApprover"].as_bool() == Some(true);
    if manual(old) && !manual(new) {
        let to = new["spec"]["approval"].as_str().unwrap_or("the default (Automatic)");
        return Some(format!("spec.approval from Manual to {to}"));
    }
    (distinct(old) && !distinct(new)).then(|| "spec.requireDistinctApprover from true to false".to_string())
}

/// Upstream's `IsOnlyMutatingGCFields`: `new` differs from `old` in nothing but ownerReferences
/// and finalizers (and what the server keeps itself: managedFields, selfLink, resourceVersion).
fn only_gc_fields(new: &Value, old: &Value) -> bool {
    let without = |v: &Value| {
        let mut v = v.clone();
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["ownerReferences", "finalizers", "managedFields", "selfLink", "resourceVersion"] {
                meta.remove(field);
            }
        }
        v
    };
    without(new) == without(old)
}

/// Upstream's `fullAuthority`: every verb on every resource and every non-resource URL.
fn full_authority() -> Vec<PolicyRule> {
    let all = || vec!["*".to_string()];
    vec![
        PolicyRule { verbs: all(), api_groups: all(), resources: all(), resource_names: vec![], non_resource_urls: vec![] },
        PolicyRule { verbs: all(), api_groups: vec![], resources: vec![], resource_names: vec![], non_resource_urls: all() },
    ]
}

/// The most verb × group × resource (and verb × URL) combinations one write's rules may break
/// down into for the escalation check. Upstream breaks every rule down without a bound; here a
/// 20 KB Role of 1,000 verbs, groups and resources would be 10^9 combinations (memory and CPU
/// for everyone), so rules beyond this are refused, naming the count.
pub const MAX_BREAKDOWN: usize = 100_000;

/// The most coverage checks (broken-down rules × the writer's own rules) one write may cost.
pub const MAX_COVERAGE_CHECKS: usize = 20_000_000;

/// How many single-verb rules `rules` break down into (saturating); every rule counts at least
/// one, so that rules without verbs or groups still count.
fn breakdown_size(rules: &[PolicyRule]) -> usize {
    rules.iter().fold(0usize, |sum, r| {
        let per_verb = r.api_groups.len().saturating_mul(r.resources.len()).saturating_add(r.non_resource_urls.len());
        sum.saturating_add(r.verbs.len().saturating_mul(per_verb).max(1))
    })
}

/// One verb on one resource (or one URL): upstream's `BreakdownRule`, produced one at a time.
fn breakdown(rule: &PolicyRule) -> impl Iterator<Item = PolicyRule> + '_ {
    rule.verbs.iter().flat_map(move |verb| {
        let resources = rule.api_groups.iter().flat_map(move |group| {
            rule.resources.iter().map(move |resource| PolicyRule {
                verbs: vec![verb.clone()],
                api_groups: vec![group.clone()],
                resources: vec![resource.clone()],
                resource_names: rule.resource_names.clone(),
                non_resource_urls: vec![],
            })
        });
        let urls = rule.non_resource_urls.iter().map(move |url| PolicyRule {
            verbs: vec![verb.clone()],
            non_resource_urls: vec![url.clone()],
            ..Default::default()
        });
        resources.chain(urls)
    })
}

fn has_or_star(list: &[String], item: &str) -> bool {
    list.iter().any(|x| x == "*" || x == item)
}

fn resource_covers(owner: &[String], resource: &str) -> bool {
    has_or_star(owner, resource) || resource.split_once('/').is_some_and(|(_, sub)| owner.iter().any(|o| o.strip_prefix("*/") == Some(sub)))
}

fn url_covers(owner: &[String], url: &str) -> bool {
    owner.iter().any(|o| o == "*" || o == url || o.strip_suffix('*').is_some_and(|prefix| url.starts_with(prefix)))
}

/// Upstream's `ruleCovers` for one broken-down rule.
fn covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    if !sub.verbs.iter().all(|v| has_or_star(&owner.verbs, v)) {
        return false;
    }
    if !sub.non_resource_urls.is_empty() {
        return sub.non_resource_urls.iter().all(|u| url_covers(&owner.non_resource_urls, u));
    }
    sub.api_groups.iter().all(|g| has_or_star(&owner.api_groups, g))
        && sub.resources.iter().all(|r| resource_covers(&owner.resources, r))
        && (owner.resource_names.is_empty()
            || (!sub.resource_names.is_empty() && sub.resource_names.iter().all(|n| owner.resource_names.contains(n))))
}

/// A rule without its verbs: API groups, resources, resource names, non-resource URLs.
type RuleKey = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

/// The broken-down rules of `rules` that no rule of `owned` covers, compacted (verbs of the same
/// group/resource/names merged) and described as upstream's `CompactString`.
pub fn missing_rules(owned: &[PolicyRule], rules: &[PolicyRule]) -> Vec<String> {
    let size = breakdown_size(rules);
    if size > MAX_BREAKDOWN {
        return vec![format!(
            "{{rules that break down into {size} verb/resource combinations: more than the {MAX_BREAKDOWN} the escalation check takes; split them or use \"*\"}}"
        )];
    }
    if size.saturating_mul(owned.len().max(1)) > MAX_COVERAGE_CHECKS {
        return vec![format!(
            "{{{size} verb/resource combinations checked against the {} rules the writer holds: more than the {MAX_COVERAGE_CHECKS} checks one write may cost}}",
            owned.len()
        )];
    }
    let mut compact: BTreeMap<RuleKey, Vec<String>> = BTreeMap::new();
    for sub in rules.iter().flat_map(breakdown) {
        if owned.iter().any(|o| covers(o, &sub)) {
            continue;
        }
        let verbs = compact
            .entry((sub.api_groups.clone(), sub.resources.clone(), sub.resource_names.clone(), sub.non_resource_urls.clone()))
            .or_default();
        if !verbs.contains(&sub.verbs[0]) {
            verbs.push(sub.verbs[0].clone());
        }
    }
    compact
        .into_iter()
        .map(|((groups, resources, names, urls), verbs)| {
            let q = |l: &[String]| l.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" ");
            let mut parts = vec![];
            if !groups.is_empty() {
                parts.push(format!("APIGroups:[{}]", q(&groups)));
            }
            if !resources.is_empty() {
                parts.push(format!("Resources:[{}]", q(&resources)));
            }
            if !names.is_empty() {
                parts.push(format!("ResourceNames:[{}]", q(&names)));
            }
            if !urls.is_empty() {
                parts.push(format!("NonResourceURLs:[{}]", q(&urls)));
            }
            parts.push(format!("Verbs:[{}]", q(&verbs)));
            format!("{{{}}}", parts.join(", "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(v: Value) -> PolicyRule {
        PolicyRule::from_value(&v)
    }

    #[test]
    fn a_role_that_breaks_down_into_a_billion_rules_is_refused_at_once() {
        let many = |prefix: &str| (0..1_000).map(|i| json!(format!("{prefix}{i}"))).collect::<Vec<_>>();
        let huge = [rule(json!({"verbs": many("v"), "apiGroups": many("g"), "resources": many("r")}))];
        let owned = [rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"]}))];
        let started = std::time::Instant::now();
        let missing = missing_rules(&owned, &huge);
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "took {:?}", started.elapsed());
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].contains("1000000000 verb/resource combinations"), "{missing:?}");
        // Even a user who holds everything gets the same answer: the check is bounded first.
        assert_eq!(missing_rules(&full_authority(), &huge).len(), 1);
        // Within the bound, coverage is checked as before.
        let fits = [rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": many("r")}))];
        assert_eq!(missing_rules(&owned, &fits).len(), 1_000, "one entry per resource not held");
        assert!(missing_rules(&full_authority(), &fits).is_empty());
    }

    #[test]
    fn many_rules_cost_no_quadratic_work() {
        let named =
            |i: usize| rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": [format!("n{i}")]}));
        let owned: Vec<PolicyRule> = (0..30_000).map(named).collect();
        let started = std::time::Instant::now();
        // 30,000 new rules against 30,000 held ones: 9 * 10^8 checks, refused before any.
        let missing = missing_rules(&owned, &owned);
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "took {:?}", started.elapsed());
        assert!(missing.len() == 1 && missing[0].contains("checks one write may cost"), "{missing:?}");
        // Rules without verbs or groups still count.
        let empty: Vec<PolicyRule> = (0..200_000).map(|_| rule(json!({"verbs": [], "apiGroups": []}))).collect();
        assert!(missing_rules(&owned[..1], &empty)[0].contains("200000 verb/resource combinations"));
    }

    #[test]
    fn coverage_follows_upstream() {
        let owned = [
            rule(json!({"verbs": ["get", "list"], "apiGroups": ["provisioning.dev"], "resources": ["servers", "*/scale"]})),
            rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"]})),
            rule(json!({"verbs": ["get"], "nonResourceURLs": ["/apis/*"]})),
        ];
        let held = [
            rule(json!({"verbs": ["list"], "apiGroups": ["provisioning.dev"], "resources": ["servers", "clusters/scale"]})),
            rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"]})),
            rule(json!({"verbs": ["get"], "nonResourceURLs": ["/apis/x"]})),
        ];
        assert!(missing_rules(&owned, &held).is_empty());
        let more = [
            rule(json!({"verbs": ["get", "update"], "apiGroups": ["provisioning.dev"], "resources": ["servers/status"]})),
            rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]})),
            rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})),
            rule(json!({"verbs": ["get"], "nonResourceURLs": ["/api"]})),
        ];
        assert_eq!(
            missing_rules(&owned, &more),
            vec![
                r#"{NonResourceURLs:["/api"], Verbs:["get"]}"#,
                r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}"#,
                r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#,
                r#"{APIGroups:["provisioning.dev"], Resources:["servers/status"], Verbs:["get" "update"]}"#,
            ]
        );
    }
}
