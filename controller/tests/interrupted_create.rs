//! A create cut short by a crash, on the local (Docker) provider: the controller died after
//! Docker created the container but before it was started and before the result was
//! recorded (create-pending set, no providerID). The restarted controller must find that
//! container by its owner labels and finish it (start it), not leave it pending forever
//! and not make a second one. Needs the Docker engine and the node image (`scripts/test.sh`
//! builds it).

use std::time::Duration;

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use provisioning_controller::testing::{self, TestEnv, is_ready, server, wait_for};
use provisioning_crds::{ANNOTATION_CREATE_PENDING, ANNOTATION_PAUSED, Server};
use provisioning_providers::{MachineState, Provider, ServerIdentity, ServerRequest};
use serde_json::json;

const NAMESPACE: &str = "cut-short";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_created_but_never_started_is_finished_not_duplicated() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let local = testing::local(&env.state_dir)?;
    // Leftovers of an earlier failed run of this test would confuse the counts.
    for m in testing::machines_in(&local, NAMESPACE).await? {
        local.delete_server(&m.provider_id).await?;
    }
    let controller = env.start_controller(env.config());
    // No Workspace claims the namespace: the controller's default workspace (account
    // `local`) applies.
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone()).create(&PostParams::default(), &ns).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), NAMESPACE);
    // Paused while the "crash" is staged, so the controller does not act yet.
    let mut s = server(NAMESPACE, "node", json!({}));
    s.metadata.annotations = Some([(ANNOTATION_PAUSED.to_string(), "true".to_string())].into());
    let s = api.create(&PostParams::default(), &s).await?;
    let identity = ServerIdentity { uid: s.uid().unwrap_or_default(), namespace: NAMESPACE.into(), name: "node".into(), cluster: None };
    let request = ServerRequest {
        identity: identity.clone(),
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: Vec::new(),
        host_key: None,
    };
    local.create_unstarted(&request).await?;
    let staged = local.find_server(&identity).await?.expect("the staged container");
    assert_eq!(staged.state, MachineState::Pending, "created, not started");

    // The state a crash mid-ensure_server leaves: create-pending set, nothing recorded.
    let patch = json!({"metadata": {"annotations": {ANNOTATION_PAUSED: null, ANNOTATION_CREATE_PENDING: "2026-11-22T00:00:00Z"}}});
    api.patch("node", &PatchParams::default(), &Patch::Merge(&patch)).await?;

    // Ready is written first, then the guard is removed (the result is recorded by then).
    let ready = wait_for("server node Ready with the create-pending guard cleared", Duration::from_secs(90), || async {
        api.get("node").await.ok().filter(|s| is_ready(s) && !s.annotations().contains_key(ANNOTATION_CREATE_PENDING))
    })
    .await?;
    let machines = testing::machines_in(&local, NAMESPACE).await?;
    assert_eq!(machines.len(), 1, "the staged container was finished, no second one: {machines:?}");
    assert_eq!(machines[0].provider_id, staged.provider_id, "the same container");
    assert_eq!(machines[0].state, MachineState::Running);
    let recorded = ready.status.as_ref().and_then(|st| st.provider_id.clone());
    assert_eq!(recorded.as_deref(), Some(staged.provider_id.0.as_str()));

    api.delete("node", &DeleteParams::default()).await?;
    wait_for("server node gone", Duration::from_secs(60), || async {
        api.list(&ListParams::default()).await.ok().filter(|l| l.items.is_empty()).map(|_| ())
    })
    .await?;
    assert!(testing::machines_in(&local, NAMESPACE).await?.is_empty(), "deleting the Server removed its container");
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
