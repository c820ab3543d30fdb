//! Approval is an authorization, not just a patch (issue 26, item 5), written as an attacker:
//! - a user who may only `patch` a Server sets `provisioning.dev/approve`: refused (an
//!   ApprovalRefused Warning naming the missing `approve` verb), the plan keeps waiting; a user
//!   granted `approve` re-sets it and the plan is carried out;
//! - an object's own `approval: Automatic` does not loosen its Workspace's Manual;
//! - under `requireDistinctApprover`, the user who last wrote the spec cannot approve it;
//! - a Cluster's approval is passed down to its members only as far as its approver could
//!   approve each member itself.
//!
//! Embedded API server (which records who set the approval), controller in-process, simulated
//! provider; tenants are ServiceAccounts with namespaced Roles and their own tokens.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Event, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use provisioning_controller::testing::{TestEnv, server, simulated_workspace, wait_for};
use provisioning_crds::{ANNOTATION_APPROVE, Cluster, Server, Workspace};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

/// A namespace with a Manual Workspace (`extra` merged into its spec).
async fn manual_workspace(client: &Client, ns: &str, extra: Value) -> anyhow::Result<()> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    let mut ws = serde_json::to_value(simulated_workspace(ns, 0, 0, 10, 5))?;
    ws["spec"]["approval"] = json!("Manual");
    if let (Some(spec), Some(extra)) = (ws["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    Api::<Workspace>::all(client.clone()).create(&PostParams::default(), &serde_json::from_value(ws)?).await?;
    Ok(())
}

/// ServiceAccount `name` in `ns` with a Role of `verbs` on `resources` in provisioning.dev;
/// returns a client with its token.
async fn tenant(env: &TestEnv, ns: &str, name: &str, rules: Value) -> anyhow::Result<Client> {
    tenant_from(env, ns, ns, name, rules).await
}

/// A client for ServiceAccount `sa_ns/name` holding `rules` in `ns`.
async fn tenant_from(env: &TestEnv, ns: &str, sa_ns: &str, name: &str, rules: Value) -> anyhow::Result<Client> {
    let pp = PostParams::default();
    if sa_ns != ns {
        let namespace: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": sa_ns}}))?;
        Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone()).create(&pp, &namespace).await?;
    }
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name, "namespace": sa_ns}}))?;
    Api::<ServiceAccount>::namespaced(env.client.clone(), sa_ns).create(&pp, &sa).await?;
    let role: Role = serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "rules": rules}))?;
    Api::<Role>::namespaced(env.client.clone(), ns).create(&pp, &role).await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": sa_ns}]
    }))?;
    Api::<RoleBinding>::namespaced(env.client.clone(), ns).create(&pp, &binding).await?;
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}}))?;
    let answer = Api::<ServiceAccount>::namespaced(env.client.clone(), sa_ns).create_token_request(name, &pp, &request).await?;
    let token = answer.status.map(|s| s.token).ok_or_else(|| anyhow::anyhow!("no token for {name}"))?;
    let mut kubeconfig = Kubeconfig::read_from(&env.kubeconfig)?;
    for named in &mut kubeconfig.auth_infos {
        named.auth_info = Some(serde_json::from_value::<AuthInfo>(json!({"token": token}))?);
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    provisioning_controller::client::client_from_config(config)
}

fn rules(resources: &[&str], approve: bool) -> Value {
    let mut verbs = vec!["get", "list", "watch", "create", "update", "patch"];
    if approve {
        verbs.push("approve");
    }
    json!([{"apiGroups": ["provisioning.dev"], "resources": resources, "verbs": verbs}])
}

/// Sets the approval as `client`'s user: removed first, so that the API server records this
/// user as the approver even when the value is the same.
async fn approve<K>(client: &Client, ns: &str, name: &str, id: &str) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let pp = PatchParams::default();
    api.patch(name, &pp, &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_APPROVE: null}}}))).await?;
    api.patch(name, &pp, &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_APPROVE: id}}}))).await?;
    Ok(())
}

/// The newest message of a Warning `reason` about `name` in `ns` that contains `text`.
async fn warning(client: &Client, ns: &str, name: &str, reason: &str, text: &str) -> Option<String> {
    let events = Api::<Event>::namespaced(client.clone(), ns).list(&Default::default()).await.ok()?;
    events
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .find(|m| m.contains(text))
}

fn plan_id(s: &Server) -> Option<String> {
    s.status.as_ref()?.plan.as_ref().map(|p| p.id.clone()).filter(|id| !id.is_empty())
}

fn machine(s: &Server) -> bool {
    s.status.as_ref().is_some_and(|st| st.provider_id.is_some())
}

async fn awaiting(servers: &Api<Server>, name: &str) -> anyhow::Result<String> {
    wait_for(&format!("{name} awaiting approval"), DEADLINE, || async {
        let s = servers.get(name).await.ok()?;
        let waiting = s.status.as_ref()?.phase.as_deref() == Some("AwaitingApproval");
        if waiting && !machine(&s) { plan_id(&s) } else { None }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_needs_the_approve_verb_and_an_object_cannot_loosen_its_workspace() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let ns = "approve-verb";
    manual_workspace(&env.client, ns, json!({})).await?;
    let patcher = tenant(&env, ns, "patcher", rules(&["servers"], false)).await?;
    let approver = tenant(&env, ns, "approver", rules(&["servers"], true)).await?;
    let servers: Api<Server> = Api::namespaced(env.client.clone(), ns);

    // The Server asks for Automatic itself: the Workspace's Manual still holds it.
    servers.create(&PostParams::default(), &server(ns, "web", json!({"approval": "Automatic"}))).await?;
    let id = awaiting(&servers, "web").await?;

    // Only patch: the annotation is written, but it does not count.
    approve::<Server>(&patcher, ns, "web", &id).await?;
    let refused = wait_for("the patcher's approval refused", DEADLINE, || {
        warning(&env.client, ns, "web", "ApprovalRefused", "may not approve servers")
    })
    .await?;
    assert!(refused.contains("system:serviceaccount:approve-verb:patcher") && refused.contains("grant the approve verb"), "{refused}");
    let still = servers.get("web").await?;
    assert!(!machine(&still), "no machine on a refused approval: {:?}", still.status);
    assert_eq!(still.status.as_ref().and_then(|s| s.phase.as_deref()), Some("AwaitingApproval"));

    // A user granted the approve verb: carried out.
    approve::<Server>(&approver, ns, "web", &id).await?;
    wait_for("web created once approved", DEADLINE, || async { servers.get("web").await.ok().filter(machine) }).await?;

    controller.stop().await;
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_writer_of_the_spec_cannot_approve_it_under_require_distinct_approver() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let ns = "approve-distinct";
    manual_workspace(&env.client, ns, json!({"requireDistinctApprover": true})).await?;
    let author = tenant(&env, ns, "author", rules(&["servers"], true)).await?;
    // A ServiceAccount of the namespace is anyone's who may edit it (a token of it can be
    // requested): not a second person. The reviewer is one of another namespace.
    let same_ns = tenant(&env, ns, "ci", rules(&["servers"], true)).await?;
    let reviewer = tenant_from(&env, ns, "approve-distinct-reviewers", "reviewer", rules(&["servers"], true)).await?;
    let servers: Api<Server> = Api::namespaced(env.client.clone(), ns);

    // The author writes the Server and approves it in the same breath: refused.
    Api::<Server>::namespaced(author.clone(), ns).create(&PostParams::default(), &server(ns, "db", json!({}))).await?;
    let id = awaiting(&servers, "db").await?;
    approve::<Server>(&author, ns, "db", &id).await?;
    let refused = wait_for("the author's own approval refused", DEADLINE, || {
        warning(&env.client, ns, "db", "ApprovalRefused", "requireDistinctApprover")
    })
    .await?;
    assert!(refused.contains("approve-distinct:author") && refused.contains("last changed its spec"), "{refused}");
    assert!(!machine(&servers.get("db").await?), "no machine on the author's own approval");

    approve::<Server>(&same_ns, ns, "db", &id).await?;
    let refused = wait_for("a same-namespace ServiceAccount's approval refused", DEADLINE, || {
        warning(&env.client, ns, "db", "ApprovalRefused", "is a ServiceAccount of namespace")
    })
    .await?;
    assert!(refused.contains("approve-distinct:ci"), "{refused}");
    assert!(!machine(&servers.get("db").await?), "no machine on a same-namespace ServiceAccount's approval");

    // Another user who may approve: carried out.
    approve::<Server>(&reviewer, ns, "db", &id).await?;
    wait_for("db created once reviewed", DEADLINE, || async { servers.get("db").await.ok().filter(machine) }).await?;

    controller.stop().await;
    env.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_approval_reaches_only_the_members_its_approver_may_approve() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let ns = "approve-cluster";
    manual_workspace(&env.client, ns, json!({})).await?;
    // May approve Clusters but not Servers; and one who may approve both.
    let rules_clusters_only = json!([
        {"apiGroups": ["provisioning.dev"], "resources": ["clusters"], "verbs": ["get", "list", "patch", "approve"]},
        {"apiGroups": ["provisioning.dev"], "resources": ["servers", "taskservs"], "verbs": ["get", "list", "patch"]}
    ]);
    let lead = tenant(&env, ns, "lead", rules_clusters_only).await?;
    let owner = tenant(&env, ns, "owner", rules(&["clusters", "servers", "taskservs"], true)).await?;
    let clusters: Api<Cluster> = Api::namespaced(env.client.clone(), ns);
    let servers: Api<Server> = Api::namespaced(env.client.clone(), ns);
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "kv", "namespace": ns},
        "spec": {"provider": "sim", "pools": [{"name": "m", "replicas": 1, "plan": "small"}]}
    }))?;
    clusters.create(&PostParams::default(), &cluster).await?;
    let member = "kv-m-0";
    awaiting(&servers, member).await?;
    let id = wait_for("the Cluster's plan", DEADLINE, || async {
        let c = clusters.get("kv").await.ok()?;
        let plan = c.status?.plan?;
        (!plan.changes.is_empty()).then_some(plan.id)
    })
    .await?;

    // The lead may approve the Cluster, not its Servers: not passed down. (The Cluster may
    // re-plan once more as its member reports; the lead then approves the plan it shows now,
    // as a user would after a PlanStale event.)
    let deadline = std::time::Instant::now() + DEADLINE;
    let mut approved = String::new();
    let mut current = id.clone();
    let refused = loop {
        if current != approved {
            approve::<Cluster>(&lead, ns, "kv", &current).await?;
            approved = current.clone();
        }
        if let Some(w) = warning(&env.client, ns, "kv", "ApprovalRefused", "is not passed down").await {
            break w;
        }
        if std::time::Instant::now() > deadline {
            let events = Api::<Event>::namespaced(env.client.clone(), ns).list(&Default::default()).await?;
            let seen: Vec<String> =
                events.items.iter().map(|e| format!("{:?} {:?}: {:?}", e.involved_object.name, e.reason, e.message)).collect();
            anyhow::bail!("no ApprovalRefused for the pass-down within {DEADLINE:?} (approved {approved}); events: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        current = clusters.get("kv").await?.status.and_then(|s| s.plan).map(|p| p.id).filter(|i| !i.is_empty()).unwrap_or(current);
    };
    assert!(refused.contains(&format!("Server {member}")) && refused.contains("approve-cluster:lead"), "{refused}");
    let m = servers.get(member).await?;
    assert!(!machine(&m), "the member got no machine: {:?}", m.status);
    let member_approval = m.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_APPROVE).cloned());
    assert_eq!(member_approval, None, "nothing was passed down");

    // The owner may approve every member: passed down and carried out.
    approve::<Cluster>(&owner, ns, "kv", &approved).await?;
    wait_for("the member created once the owner approved", DEADLINE, || async { servers.get(member).await.ok().filter(machine) }).await?;

    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
