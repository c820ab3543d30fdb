//! RBAC evaluation as kube-apiserver's RBAC authorizer does it: bindings select roles, roles
//! hold rules, a request is allowed when any rule of any applicable role covers it.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::attributes::Attributes;
use super::identity::UserInfo;

/// The API group of the RBAC kinds.
pub const GROUP: &str = crate::registry::RBAC_GROUP;

/// Most subjects one RoleBinding or ClusterRoleBinding may name (422 beyond, at admission).
/// Upstream has no such cap; here every binding is held, decoded, by the policy and a
/// binding of 3 MiB names ~95,000 subjects.
pub const MAX_BINDING_SUBJECTS: usize = 1_000;

/// A null where a value is expected reads as the default (the API writes `null` lists).
fn null_default<'de, D: serde::Deserializer<'de>, T: Default + serde::Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

use serde::Deserialize;

/// One `PolicyRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PolicyRule {
    /// Verbs (`*` = all).
    #[serde(deserialize_with = "null_default")]
    pub verbs: Vec<String>,
    /// API groups (`""` = core, `*` = all).
    #[serde(deserialize_with = "null_default")]
    pub api_groups: Vec<String>,
    /// Resources, `plural/subresource`, `*`, `*/subresource`.
    #[serde(deserialize_with = "null_default")]
    pub resources: Vec<String>,
    /// Names the rule is limited to (empty = all).
    #[serde(deserialize_with = "null_default")]
    pub resource_names: Vec<String>,
    /// Non-resource paths (`*` suffix = prefix match).
    #[serde(rename = "nonResourceURLs", deserialize_with = "null_default")]
    pub non_resource_urls: Vec<String>,
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

impl PolicyRule {
    /// Reads a rule from its JSON form.
    pub fn from_value(v: &Value) -> Self {
        PolicyRule {
            verbs: strs(&v["verbs"]),
            api_groups: strs(&v["apiGroups"]),
            resources: strs(&v["resources"]),
            resource_names: strs(&v["resourceNames"]),
            non_resource_urls: strs(&v["nonResourceURLs"]),
        }
    }

    /// The JSON form, omitting empty lists as the API does.
    pub fn to_value(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("verbs".into(), json!(self.verbs));
        for (k, l) in [
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !l.is_empty() {
                m.insert(k.into(), json!(l));
            }
        }
        Value::Object(m)
    }

    /// Whether this rule allows the request described by `a`.
    pub fn allows(&self, a: &Attributes) -> bool {
        if !self.verbs.iter().any(|v| v == "*" || *v == a.verb) {
            return false;
        }
        if !a.resource_request {
            return self
                .non_resource_urls
                .iter()
                .any(|u| u == "*" || *u == a.path || u.strip_suffix('*').is_some_and(|prefix| a.path.starts_with(prefix)));
        }
        if !self.api_groups.iter().any(|g| g == "*" || *g == a.api_group) {
            return false;
        }
        let combined = if a.subresource.is_empty() { a.resource.clone() } else { format!("{}/{}", a.resource, a.subresource) };
        let resource_ok = self.resources.iter().any(|r| {
            r == "*" || *r == combined || (!a.subresource.is_empty() && r.strip_prefix("*/").is_some_and(|sub| sub == a.subresource))
        });
        resource_ok && (self.resource_names.is_empty() || self.resource_names.contains(&a.name))
    }
}

/// One subject of a binding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Subject {
    /// User, Group or ServiceAccount.
    #[serde(deserialize_with = "null_default")]
    pub kind: String,
    /// Name.
    #[serde(deserialize_with = "null_default")]
    pub name: String,
    /// Namespace (ServiceAccounts).
    #[serde(deserialize_with = "null_default")]
    pub namespace: String,
}

/// `metadata` as the policy needs it.
#[derive(Default, Deserialize)]
#[serde(default)]
struct MetaDoc {
    #[serde(deserialize_with = "null_default")]
    name: String,
    #[serde(deserialize_with = "null_default")]
    namespace: String,
}

/// A stored Role or ClusterRole, only what the policy needs (everything else is skipped while
/// decoding: no `Value` tree of the whole object).
#[derive(Default, Deserialize)]
#[serde(default)]
struct RoleDoc {
    #[serde(deserialize_with = "null_default")]
    metadata: MetaDoc,
    #[serde(deserialize_with = "null_default")]
    rules: Vec<PolicyRule>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RoleRefDoc {
    #[serde(deserialize_with = "null_default")]
    kind: String,
    #[serde(deserialize_with = "null_default")]
    name: String,
}

/// A stored RoleBinding or ClusterRoleBinding, only what the policy needs.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct BindingDoc {
    #[serde(deserialize_with = "null_default")]
    metadata: MetaDoc,
    #[serde(deserialize_with = "null_default")]
    role_ref: RoleRefDoc,
    #[serde(deserialize_with = "null_default")]
    subjects: Vec<Subject>,
}

impl Subject {
    /// Whether the subject names `user`. `binding_ns` is the RoleBinding's namespace, which a
    /// ServiceAccount subject without namespace defaults to.
    pub fn applies_to(&self, user: &UserInfo, binding_ns: &str) -> bool {
        match self.kind.as_str() {
            "User" => user.name == self.name,
            "Group" => user.groups.contains(&self.name),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() { binding_ns } else { self.namespace.as_str() };
                // Compared piece by piece: no string is built per subject and request.
                !ns.is_empty()
                    && user
                        .name
                        .strip_prefix("system:serviceaccount:")
                        .and_then(|r| r.strip_prefix(ns))
                        .and_then(|r| r.strip_prefix(':'))
                        .is_some_and(|n| n == self.name)
            }
            _ => false,
        }
    }

    fn describe(&self) -> String {
        if self.kind == "ServiceAccount" && !self.namespace.is_empty() {
            format!("{} {:?}", self.kind, format!("{}/{}", self.namespace, self.name))
        } else {
            format!("{} {:?}", self.kind, self.name)
        }
    }
}

/// A RoleBinding (namespace set) or ClusterRoleBinding (namespace empty).
#[derive(Debug, Clone)]
pub struct Binding {
    /// metadata.name
    pub name: String,
    /// metadata.namespace ("" for ClusterRoleBindings).
    pub namespace: String,
    /// roleRef.kind: Role or ClusterRole.
    pub role_kind: String,
    /// roleRef.name
    pub role_name: String,
    /// subjects
    pub subjects: Vec<Subject>,
}

impl Binding {
    /// Reads a binding from its JSON form.
    pub fn from_value(v: &Value) -> Self {
        Binding {
            name: v["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            namespace: v["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
            role_kind: v["roleRef"]["kind"].as_str().unwrap_or_default().to_string(),
            role_name: v["roleRef"]["name"].as_str().unwrap_or_default().to_string(),
            subjects: v["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| Subject {
                    kind: s["kind"].as_str().unwrap_or_default().to_string(),
                    name: s["name"].as_str().unwrap_or_default().to_string(),
                    namespace: s["namespace"].as_str().unwrap_or_default().to_string(),
                })
                .collect(),
        }
    }

    fn describe(&self, subject: &Subject) -> String {
        if self.namespace.is_empty() {
            format!("ClusterRoleBinding {:?} of {} {:?} to {}", self.name, self.role_kind, self.role_name, subject.describe())
        } else {
            format!(
                "RoleBinding {:?} of {} {:?} to {}",
                format!("{}/{}", self.name, self.namespace),
                self.role_kind,
                self.role_name,
                subject.describe()
            )
        }
    }
}

/// The outcome of an authorization check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is allowed.
    pub allowed: bool,
    /// Why (the binding that allowed it), or the errors met while looking (missing roles).
    pub reason: String,
}

/// The bindings of one scope (the cluster, or one namespace), indexed when the policy is built
/// by the user and group names their subjects stand for: a check looks at the bindings naming
/// the user or one of its groups, not at every subject of every binding.
#[derive(Debug, Default)]
struct Bindings {
    list: Vec<Binding>,
    /// User name (a ServiceAccount subject's `system:serviceaccount:NS:NAME`) → (binding,
    /// first subject naming it) positions, each binding once.
    by_user: HashMap<String, Vec<(usize, usize)>>,
    /// Group name → (binding, first subject naming it).
    by_group: HashMap<String, Vec<(usize, usize)>>,
}

impl Bindings {
    fn push(&mut self, b: Binding) {
        let i = self.list.len();
        let add = |index: &mut HashMap<String, Vec<(usize, usize)>>, name: String, j: usize| {
            let hits = index.entry(name).or_default();
            if hits.last().is_none_or(|(last, _)| *last != i) {
                hits.push((i, j));
            }
        };
        for (j, s) in b.subjects.iter().enumerate() {
            match s.kind.as_str() {
                "User" => add(&mut self.by_user, s.name.clone(), j),
                "Group" => add(&mut self.by_group, s.name.clone(), j),
                "ServiceAccount" => {
                    let ns = if s.namespace.is_empty() { &b.namespace } else { &s.namespace };
                    if !ns.is_empty() {
                        add(&mut self.by_user, format!("system:serviceaccount:{ns}:{}", s.name), j);
                    }
                }
                _ => {}
            }
        }
        self.list.push(b);
    }

    /// The bindings that apply to `user`, each with the first of its subjects naming the user,
    /// in the order they were added.
    fn applying(&self, user: &UserInfo) -> Vec<(&Binding, &Subject)> {
        let mut hits: Vec<(usize, usize)> = self.by_user.get(&user.name).into_iter().flatten().copied().collect();
        for g in &user.groups {
            hits.extend(self.by_group.get(g).into_iter().flatten().copied());
        }
        hits.sort_unstable();
        hits.dedup_by_key(|h| h.0);
        hits.into_iter().filter_map(|(i, j)| self.list.get(i).and_then(|b| b.subjects.get(j).map(|s| (b, s)))).collect()
    }
}

/// A snapshot of every Role, ClusterRole and binding.
#[derive(Debug, Default)]
pub struct Policy {
    cluster_roles: HashMap<String, Vec<PolicyRule>>,
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    cluster_bindings: Bindings,
    bindings: HashMap<String, Bindings>,
}

fn rules_of(v: &Value) -> Vec<PolicyRule> {
    v["rules"].as_array().into_iter().flatten().map(PolicyRule::from_value).collect()
}

/// A Role's or ClusterRole's ((namespace, name), rules) from its stored JSON, decoded straight
/// into the rules; an object of another shape through its `Value` (alone, as before).
fn role_from_bytes(bytes: &[u8]) -> ((String, String), Vec<PolicyRule>) {
    match serde_json::from_slice::<RoleDoc>(bytes) {
        Ok(d) => ((d.metadata.namespace, d.metadata.name), d.rules),
        Err(_) => {
            let v: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
            let md = &v["metadata"];
            let key = (md["namespace"].as_str().unwrap_or_default().to_string(), md["name"].as_str().unwrap_or_default().to_string());
            (key, rules_of(&v))
        }
    }
}

/// A binding from its stored JSON (see [`role_from_bytes`]).
fn binding_from_bytes(bytes: &[u8]) -> Binding {
    match serde_json::from_slice::<BindingDoc>(bytes) {
        Ok(d) => Binding {
            name: d.metadata.name,
            namespace: d.metadata.namespace,
            role_kind: d.role_ref.kind,
            role_name: d.role_ref.name,
            subjects: d.subjects,
        },
        Err(_) => Binding::from_value(&serde_json::from_slice(bytes).unwrap_or(Value::Null)),
    }
}

impl Policy {
    /// Builds a policy from the stored JSON of the RBAC objects, one object at a time and
    /// straight into what the policy holds (rules, roleRef, subjects): rebuilding never holds
    /// a `Value` tree of every role and binding at once (~23 times their stored size).
    pub fn from_stored<'a>(
        cluster_roles: impl IntoIterator<Item = &'a [u8]>,
        roles: impl IntoIterator<Item = &'a [u8]>,
        cluster_bindings: impl IntoIterator<Item = &'a [u8]>,
        bindings: impl IntoIterator<Item = &'a [u8]>,
    ) -> Self {
        let mut p = Policy::default();
        for cr in cluster_roles {
            let ((_, name), rules) = role_from_bytes(cr);
            p.cluster_roles.insert(name, rules);
        }
        for r in roles {
            let (key, rules) = role_from_bytes(r);
            p.roles.insert(key, rules);
        }
        for b in cluster_bindings {
            p.cluster_bindings.push(binding_from_bytes(b));
        }
        for b in bindings {
            let b = binding_from_bytes(b);
            p.bindings.entry(b.namespace.clone()).or_default().push(b);
        }
        p
    }

    /// Builds a policy from the JSON of stored objects.
    pub fn from_values<'a>(
        cluster_roles: impl IntoIterator<Item = &'a Value>,
        roles: impl IntoIterator<Item = &'a Value>,
        cluster_bindings: impl IntoIterator<Item = &'a Value>,
        bindings: impl IntoIterator<Item = &'a Value>,
    ) -> Self {
        let mut p = Policy::default();
        for cr in cluster_roles {
            p.cluster_roles.insert(cr["metadata"]["name"].as_str().unwrap_or_default().to_string(), rules_of(cr));
        }
        for r in roles {
            let md = &r["metadata"];
            let key = (md["namespace"].as_str().unwrap_or_default().to_string(), md["name"].as_str().unwrap_or_default().to_string());
            p.roles.insert(key, rules_of(r));
        }
        for b in cluster_bindings {
            p.cluster_bindings.push(Binding::from_value(b));
        }
        for b in bindings {
            let b = Binding::from_value(b);
            p.bindings.entry(b.namespace.clone()).or_default().push(b);
        }
        p
    }

    fn role_rules(&self, b: &Binding) -> Result<&[PolicyRule], String> {
        let found = match b.role_kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&b.role_name),
            "Role" if !b.namespace.is_empty() => self.roles.get(&(b.namespace.clone(), b.role_name.clone())),
            _ => None,
        };
        found.map(Vec::as_slice).ok_or_else(|| format!("{}.{GROUP} {:?} not found", b.role_kind.to_lowercase(), b.role_name))
    }

    /// The rules of a binding's roleRef (`namespace`: the binding's; empty for a
    /// ClusterRoleBinding), or upstream's error when the role does not exist.
    pub fn role_ref_rules(&self, kind: &str, name: &str, namespace: &str) -> Result<Vec<PolicyRule>, String> {
        let b = Binding {
            name: String::new(),
            namespace: namespace.to_string(),
            role_kind: kind.to_string(),
            role_name: name.to_string(),
            subjects: vec![],
        };
        self.role_rules(&b).map(<[PolicyRule]>::to_vec)
    }

    /// Visits (binding, subject, rules) of every binding that applies to `user` in `namespace`
    /// (cluster bindings always, RoleBindings of `namespace` when it is set); `f` returns true to
    /// stop. Only the bindings naming the user or its groups are looked at (through the index);
    /// returns how many were.
    fn visit(
        &self,
        user: &UserInfo,
        namespace: &str,
        errors: &mut Vec<String>,
        mut f: impl FnMut(&Binding, &Subject, &[PolicyRule]) -> bool,
    ) -> usize {
        let ns_bindings = if namespace.is_empty() { None } else { self.bindings.get(namespace) };
        let mut examined = 0;
        for (b, subject) in
            self.cluster_bindings.applying(user).into_iter().chain(ns_bindings.map(|n| n.applying(user)).into_iter().flatten())
        {
            examined += 1;
            match self.role_rules(b) {
                Ok(rules) => {
                    if f(b, subject, rules) {
                        return examined;
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        examined
    }

    /// Decides a request.
    pub fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        let mut errors = vec![];
        let mut reason = None;
        self.visit(user, &a.namespace, &mut errors, |b, s, rules| {
            if rules.iter().any(|r| r.allows(a)) {
                reason = Some(format!("RBAC: allowed by {}", b.describe(s)));
                return true;
            }
            false
        });
        match reason {
            Some(reason) => Decision { allowed: true, reason },
            None => {
                let reason = match errors.len() {
                    0 => String::new(),
                    1 => format!("RBAC: {}", errors[0]),
                    _ => format!("RBAC: [{}]", errors.join(", ")),
                };
                Decision { allowed: false, reason }
            }
        }
    }

    /// Every rule that applies to `user` in `namespace`, plus errors met (missing roles).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut errors = vec![];
        let mut out: Vec<PolicyRule> = vec![];
        // Duplicates dropped through a set: a user bound to tens of thousands of rules must not
        // cost a quadratic scan on every RBAC write and rules review.
        let mut seen: std::collections::HashSet<PolicyRule> = std::collections::HashSet::new();
        self.visit(user, namespace, &mut errors, |_, _, rules| {
            for r in rules {
                if seen.insert(r.clone()) {
                    out.push(r.clone());
                }
            }
            false
        });
        (out, errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(ns: &str, name: &str) -> UserInfo {
        UserInfo::service_account(ns, name, "uid-1")
    }

    fn res(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            path: String::new(),
        }
    }

    fn nonres(verb: &str, path: &str) -> Attributes {
        Attributes { verb: verb.into(), path: path.into(), ..Default::default() }
    }

    fn rule(v: Value) -> PolicyRule {
        PolicyRule::from_value(&v)
    }

    #[test]
    fn rule_matching_follows_upstream() {
        let r = rule(json!({"verbs": ["get", "list"], "apiGroups": ["provisioning.dev"], "resources": ["servers"]}));
        assert!(r.allows(&res("list", "provisioning.dev", "servers", "", "demo", "")));
        assert!(!r.allows(&res("watch", "provisioning.dev", "servers", "", "demo", "")));
        assert!(!r.allows(&res("get", "", "servers", "", "demo", "a")));
        // A subresource needs its own entry.
        assert!(!r.allows(&res("get", "provisioning.dev", "servers", "status", "demo", "a")));
        let r = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/status"]}));
        assert!(r.allows(&res("update", "x", "servers", "status", "demo", "a")));
        assert!(!r.allows(&res("update", "x", "servers", "", "demo", "a")));
        let r = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"]}));
        assert!(r.allows(&res("get", "", "secrets", "", "demo", "one")));
        assert!(!r.allows(&res("get", "", "secrets", "", "demo", "two")));
        assert!(!r.allows(&res("list", "", "secrets", "", "demo", "")));
        let r = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        assert!(r.allows(&nonres("get", "/healthz")));
        assert!(r.allows(&nonres("get", "/apis/provisioning.dev/v1")));
        assert!(!r.allows(&nonres("get", "/api")));
        assert!(!r.allows(&nonres("post", "/healthz")));
        // Non-resource rules never cover resource requests.
        assert!(!r.allows(&res("get", "", "pods", "", "", "")));
    }

    fn policy() -> Policy {
        let crs = [
            json!({"metadata": {"name": "server-reader"}, "rules": [{"verbs": ["get", "list", "watch"], "apiGroups": ["provisioning.dev"], "resources": ["servers"]}]}),
        ];
        let roles = [
            json!({"metadata": {"name": "status-writer", "namespace": "demo"}, "rules": [{"verbs": ["update"], "apiGroups": ["provisioning.dev"], "resources": ["servers/status"]}]}),
        ];
        let crbs = [
            json!({"metadata": {"name": "dangling"}, "roleRef": {"kind": "ClusterRole", "name": "gone"}, "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]}),
        ];
        let rbs = [
            json!({"metadata": {"name": "read", "namespace": "demo"}, "roleRef": {"kind": "ClusterRole", "name": "server-reader"}, "subjects": [{"kind": "ServiceAccount", "name": "ci"}]}),
            json!({"metadata": {"name": "status", "namespace": "demo"}, "roleRef": {"kind": "Role", "name": "status-writer"}, "subjects": [{"kind": "User", "name": "system:serviceaccount:demo:ci"}]}),
        ];
        Policy::from_values(&crs, &roles, &crbs, &rbs)
    }

    #[test]
    fn a_policy_from_stored_bytes_decides_as_one_from_values() {
        let crs = [json!({"metadata": {"name": "server-reader", "labels": {"a": "b"}, "managedFields": [{"manager": "x"}]},
            "rules": [{"verbs": ["get", "list", "watch"], "apiGroups": ["provisioning.dev"], "resources": ["servers"], "resourceNames": null}]})];
        let roles = [json!({"metadata": {"name": "status-writer", "namespace": "demo"},
            "rules": [{"verbs": ["update"], "apiGroups": ["provisioning.dev"], "resources": ["servers/status"]}]})];
        let crbs = [json!({"metadata": {"name": "dangling"}, "roleRef": {"kind": "ClusterRole", "name": "gone"}, "subjects": null})];
        let rbs = [
            json!({"metadata": {"name": "read", "namespace": "demo"}, "roleRef": {"kind": "ClusterRole", "name": "server-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "ci"}]}),
            // Not of the API's shape (a number as a name): read through its Value, as before.
            json!({"metadata": {"name": "status", "namespace": "demo"}, "roleRef": {"kind": "Role", "name": "status-writer"},
                "subjects": [{"kind": "User", "name": "system:serviceaccount:demo:ci"}, {"kind": "User", "name": 5}]}),
        ];
        let bytes = |vs: &[Value]| vs.iter().map(|v| serde_json::to_vec(v).unwrap_or_default()).collect::<Vec<_>>();
        let (c, r, cb, b) = (bytes(&crs), bytes(&roles), bytes(&crbs), bytes(&rbs));
        let stored = Policy::from_stored(
            c.iter().map(Vec::as_slice),
            r.iter().map(Vec::as_slice),
            cb.iter().map(Vec::as_slice),
            b.iter().map(Vec::as_slice),
        );
        let values = Policy::from_values(&crs, &roles, &crbs, &rbs);
        for a in [
            res("list", "provisioning.dev", "servers", "", "demo", ""),
            res("list", "provisioning.dev", "servers", "", "other", ""),
            res("update", "provisioning.dev", "servers", "status", "demo", "a"),
            res("update", "provisioning.dev", "servers", "", "demo", "a"),
        ] {
            assert_eq!(stored.authorize(&sa("demo", "ci"), &a), values.authorize(&sa("demo", "ci"), &a), "{a:?}");
        }
        assert!(stored.authorize(&sa("demo", "ci"), &res("update", "provisioning.dev", "servers", "status", "demo", "a")).allowed);
        assert_eq!(stored.rules_for(&sa("demo", "ci"), "demo"), values.rules_for(&sa("demo", "ci"), "demo"));
    }

    /// `n` RoleBindings in `ns` of ClusterRole `server-reader`, `subjects` ServiceAccount
    /// subjects each (`sa-B-S`), as stored bytes.
    fn many_bindings(ns: &str, n: usize, subjects: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|b| {
                let subjects: Vec<Value> =
                    (0..subjects).map(|s| json!({"kind": "ServiceAccount", "name": format!("sa-{b}-{s}")})).collect();
                serde_json::to_vec(&json!({"metadata": {"name": format!("rb-{b}"), "namespace": ns},
                    "roleRef": {"kind": "ClusterRole", "name": "server-reader"}, "subjects": subjects}))
                .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn a_check_examines_only_the_bindings_naming_the_user() {
        let reader = serde_json::to_vec(&json!({"metadata": {"name": "server-reader"},
            "rules": [{"verbs": ["get"], "apiGroups": ["provisioning.dev"], "resources": ["servers"]}]}))
        .unwrap_or_default();
        let mut rbs = many_bindings("a", 200, 50);
        rbs.push(
            serde_json::to_vec(
                &json!({"metadata": {"name": "group", "namespace": "a"}, "roleRef": {"kind": "ClusterRole", "name": "server-reader"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts:a"}]}),
            )
            .unwrap_or_default(),
        );
        let p = Policy::from_stored([reader.as_slice()], [], [], rbs.iter().map(Vec::as_slice));
        let mut errors = vec![];
        // Named by rb-7 and, through its group system:serviceaccounts:a, by `group`: 2 of 201.
        let user = sa("a", "sa-7-3");
        assert_eq!(p.visit(&user, "a", &mut errors, |_, _, _| false), 2);
        assert_eq!(p.visit(&sa("a", "nobody"), "a", &mut errors, |_, _, _| false), 1, "only the group binding");
        assert_eq!(p.visit(&sa("b", "sa-7-3"), "a", &mut errors, |_, _, _| false), 0);
        let d = p.authorize(&user, &res("get", "provisioning.dev", "servers", "", "a", "x"));
        assert_eq!(d.reason, r#"RBAC: allowed by RoleBinding "rb-7/a" of ClusterRole "server-reader" to ServiceAccount "sa-7-3""#);
        assert!(!p.authorize(&sa("b", "sa-7-3"), &res("get", "provisioning.dev", "servers", "", "a", "x")).allowed);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn checks_cost_nothing_per_subject_of_other_bindings() {
        // One namespace admin's 10 bindings of 20,000 subjects each, and 5,000 checks of a user
        // none of them names: a scan of every subject per check (a string built for each
        // ServiceAccount subject) made 10^9 comparisons, minutes; through the index each check
        // is a few lookups. 10 s is a wide margin (well under a second now).
        let rbs = many_bindings("a", 10, 20_000);
        let p = Policy::from_stored([], [], [], rbs.iter().map(Vec::as_slice));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let a = res("get", "", "configmaps", "", "a", "x");
            let allowed = (0..5_000).filter(|i| p.authorize(&sa("a", &format!("other-{i}")), &a).allowed).count();
            let _ = tx.send(allowed);
        });
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(0), "5,000 checks did not finish within 10 s");
    }

    #[test]
    fn bindings_apply_only_in_their_namespace() {
        let p = policy();
        let d = p.authorize(&sa("demo", "ci"), &res("list", "provisioning.dev", "servers", "", "demo", ""));
        assert!(d.allowed);
        assert_eq!(d.reason, r#"RBAC: allowed by RoleBinding "read/demo" of ClusterRole "server-reader" to ServiceAccount "ci""#);
        let d = p.authorize(&sa("demo", "ci"), &res("list", "provisioning.dev", "servers", "", "other", ""));
        assert!(!d.allowed);
        assert_eq!(d.reason, r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#);
        assert!(!p.authorize(&sa("other", "ci"), &res("list", "provisioning.dev", "servers", "", "demo", "")).allowed);
        assert!(p.authorize(&sa("demo", "ci"), &res("update", "provisioning.dev", "servers", "status", "demo", "a")).allowed);
        assert!(!p.authorize(&sa("demo", "ci"), &res("update", "provisioning.dev", "servers", "", "demo", "a")).allowed);
        // Cluster scope: RoleBindings never apply.
        assert!(!p.authorize(&sa("demo", "ci"), &res("list", "provisioning.dev", "servers", "", "", "")).allowed);
        let (rules, errors) = p.rules_for(&sa("demo", "ci"), "demo");
        assert_eq!(rules.len(), 2);
        assert_eq!(errors.len(), 1);
    }
}
