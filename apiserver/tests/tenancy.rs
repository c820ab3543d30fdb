//! The tenancy suite of the embedded control plane, written as an attacker (issue 26): tenant A
//! holds `admin` in namespace `a` (a RoleBinding of the bootstrap ClusterRole, as a cluster
//! operator hands out) and tries to leave it. Every attempt is refused with kube-apiserver's
//! message, and B's objects in namespace `b` are unchanged.
//!
//! * RBAC escalation: a RoleBinding of `cluster-admin` in `a`, a Role with `*` rules, a patch
//!   that widens a Role A may edit, a binding of a Role A does not hold — refused as upstream's
//!   `ConfirmNoEscalation`; granting what A holds, or with `bind`/`escalate`, works.
//! * An update of an existing binding or role is checked like a create (new subjects of a
//!   binding whose roleRef is unchanged); only a finalizer/ownerReference change is not.
//! * Who changed a spec is the authenticated user the server records (`provisioning.dev/changed-by`,
//!   the ChangeRecord's `changedByUser`), not a field manager the client names; a forged value is
//!   refused.
//! * `?watch=` (empty) is served as a watch and authorized as one (not as a list).
//! * A "billion laughs" YAML body sent to SelfSubjectAccessReview (which every authenticated
//!   identity may create) is a 400 naming excessive aliasing, and the next request is answered.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

async fn post(c: &kube::Client, path: &str, body: &Value) -> Res<(u16, Value)> {
    raw(c, "POST", path, "application/json", serde_json::to_vec(body)?).await
}

fn role_binding(ns: &str, name: &str, kind: &str, role: &str, sa: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
}

fn role(ns: &str, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "namespace": ns}, "rules": rules})
}

/// A client authenticated as ServiceAccount `ns/name` (created here), with a token from the
/// TokenRequest API.
async fn tenant(admin: &kube::Client, kubeconfig: &std::path::Path, ns: &str, name: &str) -> Res<kube::Client> {
    let (code, body) = post(admin, &format!("/api/v1/namespaces/{ns}/serviceaccounts"), &json!({"metadata": {"name": name}})).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) =
        post(admin, &format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"), &json!({"spec": {"expirationSeconds": 3600}}))
            .await?;
    assert_eq!(code, 201, "{body}");
    let token = body["status"]["token"].as_str().ok_or("no token")?;
    let text = std::fs::read_to_string(kubeconfig)?;
    let replaced: Vec<String> =
        text.lines().map(|l| if l.trim_start().starts_with("token: ") { format!("    token: {token}") } else { l.to_string() }).collect();
    let dir = kubeconfig.parent().ok_or("no parent")?.join(format!("tenant-{ns}-{name}"));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kubeconfig");
    std::fs::write(&path, replaced.join("\n") + "\n")?;
    client_for(&path).await
}

fn assert_escalation_refused(code: u16, body: &Value, what: &str, resource: &str, name: &str, missing: &str) {
    assert_eq!(code, 403, "{what}: {body}");
    let msg = body["message"].as_str().unwrap_or_default();
    let want = format!(
        r#"{resource}.rbac.authorization.k8s.io "{name}" is forbidden: user "system:serviceaccount:a:alice" (groups=["system:serviceaccounts" "system:serviceaccounts:a" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:"#
    );
    assert!(msg.starts_with(&want), "{what}: {msg}");
    assert!(msg.contains(missing), "{what}: {missing} not in {msg}");
}

async fn setup() -> Res<(TestServer, kube::Client, kube::Client)> {
    let ts = start().await?;
    let admin = client_for(&ts.server.kubeconfig_path()).await?;
    install_crd(&admin).await?;
    for ns in ["a", "b"] {
        let (code, body) = post(&admin, "/api/v1/namespaces", &json!({"metadata": {"name": ns}})).await?;
        assert_eq!(code, 201, "{body}");
    }
    eventually("servers served", Duration::from_secs(30), || {
        let c = admin.clone();
        async move { raw(&c, "GET", "/apis/provisioning.dev/v1alpha1/servers", "application/json", vec![]).await.is_ok_and(|(s, _)| s == 200) }
    })
    .await?;
    let (code, body) =
        post(&admin, "/apis/provisioning.dev/v1alpha1/namespaces/b/servers", &serde_json::to_value(server_obj("victim", "small")?)?)
            .await?;
    assert_eq!(code, 201, "{body}");
    let alice = tenant(&admin, &ts.server.kubeconfig_path(), "a", "alice").await?;
    let (code, body) =
        post(&admin, &format!("{RBAC}/namespaces/a/rolebindings"), &role_binding("a", "alice-admin", "ClusterRole", "admin", "alice"))
            .await?;
    assert_eq!(code, 201, "{body}");
    // `admin` is aggregated from its parts by a controller loop: wait until it applies.
    eventually("alice holds admin in a", Duration::from_secs(30), || {
        let c = alice.clone();
        async move { raw(&c, "GET", "/api/v1/namespaces/a/configmaps", "application/json", vec![]).await.is_ok_and(|(s, _)| s == 200) }
    })
    .await?;
    Ok((ts, admin, alice))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_admin_cannot_grant_what_it_does_not_hold() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    let status_patch = |c: kube::Client, ns: &'static str| async move {
        let patch = serde_json::to_vec(&json!({"status": {"providerID": "local://someone-elses"}}))?;
        let path = format!("/apis/provisioning.dev/v1alpha1/namespaces/{ns}/servers/victim/status");
        raw(&c, "PATCH", &path, "application/merge-patch+json", patch).await
    };
    let (code, _) = status_patch(alice.clone(), "b").await?;
    assert_eq!(code, 403, "alice starts without status writes");

    // The escalation of the issue: a RoleBinding of cluster-admin in her own namespace.
    let rbs = format!("{RBAC}/namespaces/a/rolebindings");
    let (code, body) = post(&alice, &rbs, &role_binding("a", "mine", "ClusterRole", "cluster-admin", "alice")).await?;
    assert_escalation_refused(
        code,
        &body,
        "bind cluster-admin",
        "rolebindings",
        "mine",
        r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#,
    );
    // A Role with rules she does not hold, and then a binding of it made by someone else's Role.
    let roles = format!("{RBAC}/namespaces/a/roles");
    let wide = role("a", "wide", json!([{"apiGroups": ["provisioning.dev"], "resources": ["servers/status"], "verbs": ["patch"]}]));
    let (code, body) = post(&alice, &roles, &wide).await?;
    assert_escalation_refused(
        code,
        &body,
        "wide role",
        "roles",
        "wide",
        r#"{APIGroups:["provisioning.dev"], Resources:["servers/status"], Verbs:["patch"]}"#,
    );
    let (code, body) = post(&admin, &roles, &wide).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(&alice, &rbs, &role_binding("a", "wide", "Role", "wide", "alice")).await?;
    assert_escalation_refused(code, &body, "bind wide", "rolebindings", "wide", "servers/status");
    // A binding of a role that does not exist: upstream's resolution error.
    let (code, body) = post(&alice, &rbs, &role_binding("a", "ghost", "ClusterRole", "ghost", "alice")).await?;
    assert_eq!(code, 403, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains(r#"clusterrole.rbac.authorization.k8s.io "ghost" not found"#), "{body}");

    // What she holds she may grant: a Role of ConfigMap reads, bound to her.
    let narrow = role("a", "narrow", json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]));
    let (code, body) = post(&alice, &roles, &narrow).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(&alice, &rbs, &role_binding("a", "narrow", "Role", "narrow", "alice")).await?;
    assert_eq!(code, 201, "{body}");
    // ... but not widen it afterwards, by merge patch or by update.
    let widen = serde_json::to_vec(&json!({"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{roles}/narrow"), "application/merge-patch+json", widen).await?;
    assert_escalation_refused(code, &body, "widen by patch", "roles", "narrow", r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#);
    // B's Server is unchanged, and her status writes are still refused in both namespaces.
    for ns in ["a", "b"] {
        let (code, _) = status_patch(alice.clone(), ns).await?;
        assert!(code == 403 || (ns == "a" && code == 404), "{ns}: {code}");
    }
    let (code, victim) =
        raw(&admin, "GET", "/apis/provisioning.dev/v1alpha1/namespaces/b/servers/victim", "application/json", vec![]).await?;
    assert_eq!(code, 200);
    assert!(victim["status"]["providerID"].is_null(), "{victim}");

    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_binding_gains_no_subject_its_writer_could_not_bind() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    let (roles, rbs) = (format!("{RBAC}/namespaces/a/roles"), format!("{RBAC}/namespaces/a/rolebindings"));
    // The cluster's admin grants bob (not alice) a Role alice does not hold, in her namespace.
    let wide = role("a", "bobs", json!([{"apiGroups": ["provisioning.dev"], "resources": ["servers/status"], "verbs": ["patch"]}]));
    let (code, body) = post(&admin, &roles, &wide).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(&admin, &rbs, &role_binding("a", "bobs", "Role", "bobs", "bob")).await?;
    assert_eq!(code, 201, "{body}");
    let missing = r#"{APIGroups:["provisioning.dev"], Resources:["servers/status"], Verbs:["patch"]}"#;
    // `update rolebindings` (admin has it) does not let her add herself to it: the roleRef is
    // unchanged, the grant is not. By merge patch, JSON patch and update.
    let both =
        json!([{"kind": "ServiceAccount", "name": "bob", "namespace": "a"}, {"kind": "ServiceAccount", "name": "alice", "namespace": "a"}]);
    let merge = serde_json::to_vec(&json!({"subjects": both}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{rbs}/bobs"), "application/merge-patch+json", merge).await?;
    assert_escalation_refused(code, &body, "add a subject by merge patch", "rolebindings", "bobs", missing);
    let json_patch = serde_json::to_vec(
        &json!([{"op": "add", "path": "/subjects/-", "value": {"kind": "ServiceAccount", "name": "alice", "namespace": "a"}}]),
    )?;
    let (code, body) = raw(&alice, "PATCH", &format!("{rbs}/bobs"), "application/json-patch+json", json_patch).await?;
    assert_escalation_refused(code, &body, "add a subject by JSON patch", "rolebindings", "bobs", missing);
    let (code, mut current) = raw(&alice, "GET", &format!("{rbs}/bobs"), "application/json", vec![]).await?;
    assert_eq!(code, 200, "{current}");
    current["subjects"] = both;
    let (code, body) = raw(&alice, "PUT", &format!("{rbs}/bobs"), "application/json", serde_json::to_vec(&current)?).await?;
    assert_escalation_refused(code, &body, "add a subject by update", "rolebindings", "bobs", missing);
    // Nor relabel the Role (upstream checks every update but a garbage-collection one).
    let relabel = serde_json::to_vec(&json!({"metadata": {"labels": {"team": "a"}}}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{roles}/bobs"), "application/merge-patch+json", relabel).await?;
    assert_escalation_refused(code, &body, "relabel a role", "roles", "bobs", missing);
    // A change of finalizers or ownerReferences only is allowed (a controller's finalizer on a
    // binding of a role it does not hold), as upstream's IsOnlyMutatingGCFields.
    let finalizer = serde_json::to_vec(&json!({"metadata": {"finalizers": ["example.com/keep"]}}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{rbs}/bobs"), "application/merge-patch+json", finalizer).await?;
    assert_eq!(code, 200, "finalizer only: {body}");
    let none = serde_json::to_vec(&json!({"metadata": {"finalizers": null}}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{rbs}/bobs"), "application/merge-patch+json", none).await?;
    assert_eq!(code, 200, "finalizer removed: {body}");
    // The binding still grants bob alone.
    let (code, stored) = raw(&admin, "GET", &format!("{rbs}/bobs"), "application/json", vec![]).await?;
    assert_eq!(code, 200);
    assert_eq!(stored["subjects"], json!([{"kind": "ServiceAccount", "name": "bob", "namespace": "a"}]), "{stored}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_watch_parameter_is_authorized_as_the_watch_it_is_served_as() -> TestResult {
    let (ts, admin, _alice) = setup().await?;
    // carol may list ConfigMaps in a, not watch them.
    let lister = role("a", "cm-lister", json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]));
    let (code, body) = post(&admin, &format!("{RBAC}/namespaces/a/roles"), &lister).await?;
    assert_eq!(code, 201, "{body}");
    let carol = tenant(&admin, &ts.server.kubeconfig_path(), "a", "carol").await?;
    let (code, body) =
        post(&admin, &format!("{RBAC}/namespaces/a/rolebindings"), &role_binding("a", "carol", "Role", "cm-lister", "carol")).await?;
    assert_eq!(code, 201, "{body}");
    let cms = "/api/v1/namespaces/a/configmaps";
    eventually("carol may list", Duration::from_secs(30), || {
        let c = carol.clone();
        async move { raw(&c, "GET", cms, "application/json", vec![]).await.is_ok_and(|(s, _)| s == 200) }
    })
    .await?;
    // Served as a watch (upstream reads an empty `watch` as true), so authorized as one.
    for query in ["watch=", "watch", "watch=TRUE", "watch=false&watch=1"] {
        let (code, body) = raw(&carol, "GET", &format!("{cms}?{query}&timeoutSeconds=1"), "application/json", vec![]).await?;
        let expected = if query.starts_with("watch=false") { 200 } else { 403 };
        assert_eq!(code, expected, "?{query}: {body}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spec_changer_is_recorded_by_the_server_and_cannot_be_forged() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    let editor = role(
        "a",
        "server-editor",
        json!([{"apiGroups": ["provisioning.dev"], "resources": ["servers"], "verbs": ["create", "get", "patch"]}]),
    );
    let (code, body) = post(&admin, &format!("{RBAC}/namespaces/a/roles"), &editor).await?;
    assert_eq!(code, 201, "{body}");
    let binding = role_binding("a", "server-editor", "Role", "server-editor", "alice");
    let (code, body) = post(&admin, &format!("{RBAC}/namespaces/a/rolebindings"), &binding).await?;
    assert_eq!(code, 201, "{body}");
    let servers = "/apis/provisioning.dev/v1alpha1/namespaces/a/servers";
    let changed_by = |v: &Value| v["metadata"]["annotations"]["provisioning.dev/changed-by"].as_str().map(str::to_string);
    let (code, created) = post(&alice, servers, &serde_json::to_value(server_obj("mine", "small")?)?).await?;
    assert_eq!(code, 201, "{created}");
    assert_eq!(changed_by(&created).as_deref(), Some("system:serviceaccount:a:alice"));
    // A label from the cluster's admin is no spec change: alice still made this generation.
    let label = serde_json::to_vec(&json!({"metadata": {"labels": {"team": "a"}}}))?;
    let (code, labelled) = raw(&admin, "PATCH", &format!("{servers}/mine"), "application/merge-patch+json", label).await?;
    assert_eq!((code, changed_by(&labelled).as_deref()), (200, Some("system:serviceaccount:a:alice")), "{labelled}");
    // Her spec change, then a forged value (refused, naming the annotation).
    let (code, changed) = raw(
        &alice,
        "PATCH",
        &format!("{servers}/mine"),
        "application/merge-patch+json",
        serde_json::to_vec(&json!({"spec": {"plan": "medium"}}))?,
    )
    .await?;
    assert_eq!((code, changed_by(&changed).as_deref()), (200, Some("system:serviceaccount:a:alice")), "{changed}");
    let forged = serde_json::to_vec(&json!({"metadata": {"annotations": {"provisioning.dev/changed-by": "system:serviceaccount:b:bob"}}}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{servers}/mine"), "application/merge-patch+json", forged).await?;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("provisioning.dev/changed-by"), "{body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scope_and_aggregation_are_not_a_tenants() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    // Cluster scope is not hers at all.
    let crb = json!({"metadata": {"name": "alice-root"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": "a"}]});
    let (code, _) = post(&alice, &format!("{RBAC}/clusterrolebindings"), &crb).await?;
    assert_eq!(code, 403);
    // Not even with `create` on clusterroles: an aggregating or wider one is an escalation.
    let cr_writer = json!({"metadata": {"name": "alice-cr-writer"}, "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["create"]}]});
    let (code, body) = post(&admin, &format!("{RBAC}/clusterroles"), &cr_writer).await?;
    assert_eq!(code, 201, "{body}");
    let crb = json!({"metadata": {"name": "alice-cr-writer"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "alice-cr-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": "a"}]});
    let (code, body) = post(&admin, &format!("{RBAC}/clusterrolebindings"), &crb).await?;
    assert_eq!(code, 201, "{body}");
    let aggregating = json!({"metadata": {"name": "sneaky"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}]}});
    let (code, body) = post(&alice, &format!("{RBAC}/clusterroles"), &aggregating).await?;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"].as_str().unwrap_or_default().contains("must have cluster-admin privileges to use the aggregationRule"),
        "{body}"
    );
    let root = json!({"metadata": {"name": "root"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
    let (code, body) = post(&alice, &format!("{RBAC}/clusterroles"), &root).await?;
    assert_escalation_refused(code, &body, "cluster role", "clusterroles", "root", r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#);

    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_and_escalate_allow_what_they_name_as_upstream() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    let (roles, rbs) = (format!("{RBAC}/namespaces/a/roles"), format!("{RBAC}/namespaces/a/rolebindings"));
    // With `bind` on cluster-admin (granted by the cluster's admin), the binding is allowed, as
    // upstream; with `escalate` on roles, so is the wide Role.
    let grant = role(
        "a",
        "binder",
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": ["view"], "verbs": ["bind"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]),
    );
    let (code, body) = post(&admin, &roles, &grant).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(&admin, &rbs, &role_binding("a", "binder", "Role", "binder", "alice")).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(&alice, &rbs, &role_binding("a", "viewer", "ClusterRole", "view", "alice")).await?;
    assert_eq!(code, 201, "bind view: {body}");
    let (code, body) = post(&alice, &rbs, &role_binding("a", "mine", "ClusterRole", "cluster-admin", "alice")).await?;
    assert_eq!(code, 403, "bind is per role name: {body}");
    let escalated = role("a", "escalated", json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]));
    let (code, body) = post(&alice, &roles, &escalated).await?;
    assert_eq!(code, 201, "escalate: {body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yaml_alias_bomb_is_a_bad_request_and_the_server_answers_the_next() -> TestResult {
    let (_ts, _admin, alice) = setup().await?;
    // ~700 KB that expands to 2 * 10^10 nodes (upstream's body limit is 3 MB).
    let items = vec!["x"; 200_000].join(",");
    let aliases = vec!["*a"; 120_000].join(",");
    let bomb = format!(
        "apiVersion: authorization.k8s.io/v1\nkind: SelfSubjectAccessReview\nspec:\n  resourceAttributes:\n    verb: get\n    \
         extra: &a [{items}]\n  more: [{aliases}]\n"
    );
    let started = Instant::now();
    let path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let (code, body) = raw(&alice, "POST", path, "application/yaml", bomb.into_bytes()).await?;
    assert_eq!(code, 400, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("excessive aliasing"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    // Honest YAML with an alias still works, and the server answers at once.
    let honest = "apiVersion: authorization.k8s.io/v1\nkind: SelfSubjectAccessReview\nspec:\n  resourceAttributes: &r {verb: get, resource: configmaps, namespace: a}\n";
    let t = Instant::now();
    let (code, body) = raw(&alice, "POST", path, "application/yaml", honest.as_bytes().to_vec()).await?;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"]["allowed"], json!(true), "{body}");
    assert!(t.elapsed() < Duration::from_secs(2), "honest request took {:?}", t.elapsed());
    Ok(())
}

/// Impersonation never makes one person count as two (issue 26 re-review M2): an approval
/// set while impersonating a ServiceAccount — one that may approve, or a second identity to
/// get past `requireDistinctApprover` — is recorded as the impersonator's, as is a spec change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_set_through_impersonation_is_recorded_as_the_impersonators() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    // Servers in `a` for alice and for the ServiceAccount bot she may impersonate (`admin`).
    let rules = json!([{"apiGroups": ["provisioning.dev"], "resources": ["servers"], "verbs": ["*"]}]);
    let (code, body) = post(&admin, &format!("{RBAC}/namespaces/a/roles"), &role("a", "servers", rules)).await?;
    assert_eq!(code, 201, "{body}");
    for sa in ["alice", "bot"] {
        let (code, body) =
            post(&admin, &format!("{RBAC}/namespaces/a/rolebindings"), &role_binding("a", &format!("servers-{sa}"), "Role", "servers", sa))
                .await?;
        assert_eq!(code, 201, "{body}");
    }
    let servers = "/apis/provisioning.dev/v1alpha1/namespaces/a/servers";
    let (code, created) = post(&alice, servers, &serde_json::to_value(server_obj("mine", "small")?)?).await?;
    assert_eq!(code, 201, "{created}");
    let changed_by = created["metadata"]["annotations"]["provisioning.dev/changed-by"].as_str().unwrap_or_default().to_string();
    assert!(!changed_by.is_empty(), "{created}");
    let bot = "system:serviceaccount:a:bot";
    let patch = serde_json::to_vec(&json!({"metadata": {"annotations": {"provisioning.dev/approve": "plan-1"}}}))?;
    let req = http::Request::builder()
        .method("PATCH")
        .uri(format!("{servers}/mine"))
        .header("content-type", "application/merge-patch+json")
        .header("Impersonate-User", bot)
        .body(kube::client::Body::from(patch))?;
    let resp = alice.send(req).await?;
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await?.to_bytes();
    let got: serde_json::Value = serde_json::from_slice(&bytes)?;
    assert_eq!(code, 200, "{got}");
    let annotations = &got["metadata"]["annotations"];
    assert_eq!(annotations["provisioning.dev/approved-by"], json!(changed_by), "recorded as the impersonator: {annotations}");
    assert_ne!(annotations["provisioning.dev/approved-by"], json!(bot), "{annotations}");
    Ok(())
}

/// Loosening a Workspace's approval policy is an approval of its own (issue 26 re-review):
/// a user who may edit Workspaces (here: a ClusterRole with update/patch on them, as a
/// ClusterRoleBinding to `edit` gives) cannot turn Manual into Automatic, nor switch off
/// `requireDistinctApprover`; tightening needs nothing more; with `approve` on the Workspace
/// it may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_approver_loosens_a_workspaces_approval_policy() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    let crds = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds/crds.yaml"))?;
    let doc = crds.split("\n---").find(|d| d.contains("name: workspaces.provisioning.dev")).ok_or("no Workspace CRD")?;
    let (code, body) =
        raw(&admin, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "application/yaml", doc.as_bytes().to_vec()).await?;
    assert_eq!(code, 201, "{body}");
    let workspaces = "/apis/provisioning.dev/v1alpha1/workspaces";
    eventually("workspaces served", Duration::from_secs(30), || {
        let c = admin.clone();
        async move { raw(&c, "GET", workspaces, "application/json", vec![]).await.is_ok_and(|(s, _)| s == 200) }
    })
    .await?;
    let ws = json!({"apiVersion": "provisioning.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "wsa"},
        "spec": {"namespace": "a", "approval": "Manual", "requireDistinctApprover": true}});
    let (code, body) = post(&admin, workspaces, &ws).await?;
    assert_eq!(code, 201, "{body}");
    let editor = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "ws-editor"},
        "rules": [{"apiGroups": ["provisioning.dev"], "resources": ["workspaces"], "verbs": ["get", "list", "update", "patch"]}]});
    let (code, body) = post(&admin, &format!("{RBAC}/clusterroles"), &editor).await?;
    assert_eq!(code, 201, "{body}");
    let bind = |name: &str, role: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": "a"}]})
    };
    let (code, body) = post(&admin, &format!("{RBAC}/clusterrolebindings"), &bind("alice-ws-editor", "ws-editor")).await?;
    assert_eq!(code, 201, "{body}");
    let patch = |spec: Value| {
        let c = alice.clone();
        async move {
            let body = serde_json::to_vec(&json!({"spec": spec}))?;
            raw(&c, "PATCH", "/apis/provisioning.dev/v1alpha1/workspaces/wsa", "application/merge-patch+json", body).await
        }
    };
    for (spec, what) in [
        (json!({"approval": "Automatic"}), "spec.approval from Manual to Automatic"),
        (json!({"approval": null}), "spec.approval from Manual to the default"),
        (json!({"requireDistinctApprover": false}), "spec.requireDistinctApprover from true to false"),
    ] {
        let (code, body) = patch(spec.clone()).await?;
        assert_eq!(code, 403, "{spec}: {body}");
        let msg = body["message"].as_str().unwrap_or_default();
        assert!(msg.contains(what) && msg.contains("approve verb"), "{msg}");
    }
    let (code, got) = raw(&admin, "GET", &format!("{workspaces}/wsa"), "application/json", vec![]).await?;
    assert_eq!((code, &got["spec"]["approval"], &got["spec"]["requireDistinctApprover"]), (200, &json!("Manual"), &json!(true)));
    // Nor by moving the Workspace: spec.namespace is immutable (its namespace would fall to
    // the default, Automatic, or to another Workspace's policy).
    let (code, body) = patch(json!({"namespace": "b"})).await?;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("spec.namespace is immutable"), "{body}");
    // Other edits of the Workspace are an editor's to make.
    let (code, body) = patch(json!({"environment": "prod"})).await?;
    assert_eq!(code, 200, "{body}");
    // With `approve` on Workspaces (deploy/rbac's provisioning-approve, here by hand) it may.
    let approver = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "ws-approver"},
        "rules": [{"apiGroups": ["provisioning.dev"], "resources": ["workspaces"], "verbs": ["approve"]}]});
    let (code, body) = post(&admin, &format!("{RBAC}/clusterroles"), &approver).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(&admin, &format!("{RBAC}/clusterrolebindings"), &bind("alice-ws-approver", "ws-approver")).await?;
    assert_eq!(code, 201, "{body}");
    eventually("alice may loosen it", Duration::from_secs(30), || async {
        patch(json!({"approval": "Automatic", "requireDistinctApprover": false})).await.is_ok_and(|(s, _)| s == 200)
    })
    .await?;
    Ok(())
}

/// The shard label names the controller replica that owns an object (sharded mode): only the
/// controller (and `system:masters`) writes it, so a tenant cannot move its objects between
/// replicas and have two act on one (fourth re-review X5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_write_the_shard_label() -> TestResult {
    let (_ts, admin, alice) = setup().await?;
    let rules = json!([{"apiGroups": ["provisioning.dev"], "resources": ["servers"], "verbs": ["*"]}]);
    let (code, body) = post(&admin, &format!("{RBAC}/namespaces/a/roles"), &role("a", "servers", rules)).await?;
    assert_eq!(code, 201, "{body}");
    let (code, body) =
        post(&admin, &format!("{RBAC}/namespaces/a/rolebindings"), &role_binding("a", "servers-alice", "Role", "servers", "alice")).await?;
    assert_eq!(code, 201, "{body}");
    let servers = "/apis/provisioning.dev/v1alpha1/namespaces/a/servers";
    let mut obj = serde_json::to_value(server_obj("labelled", "small")?)?;
    obj["metadata"]["labels"] = json!({"provisioning.dev/shard": "replica-2"});
    let (code, body) = post(&alice, servers, &obj).await?;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("set by the controller only"), "{body}");
    let (code, body) = post(&admin, servers, &obj).await?;
    assert_eq!(code, 201, "the admin (system:masters) may: {body}");
    let patch = serde_json::to_vec(&json!({"metadata": {"labels": {"provisioning.dev/shard": "replica-1"}}}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{servers}/labelled"), "application/merge-patch+json", patch).await?;
    assert_eq!(code, 422, "{body}");
    let patch = serde_json::to_vec(&json!({"metadata": {"labels": {"provisioning.dev/shard": null, "team": "a"}}}))?;
    let (code, body) = raw(&alice, "PATCH", &format!("{servers}/labelled"), "application/merge-patch+json", patch).await?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["labels"], json!({"provisioning.dev/shard": "replica-2", "team": "a"}), "a dropped label is kept");
    Ok(())
}
