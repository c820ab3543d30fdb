//! A Workspace the controller has not visited yet holds no finalizer: deleted then, it vanished
//! at once and left the machines made with its accounts without a provider that could delete
//! them (the Servers looped on "provider not defined", their namespace never finished
//! deleting). Now a resource holds its Workspace (adds the finalizer) before it uses one of its
//! accounts, as Crossplane's managed resources record a ProviderConfigUsage first.
//!
//! The race is made deterministic with a Workspace created paused: the controller does not
//! visit a paused Workspace, so it never adds the finalizer itself, while its Servers keep
//! using its accounts.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use provisioning_controller::testing::{TestEnv, is_ready, server, simulated_workspace, wait_for};
use provisioning_crds::{ANNOTATION_PAUSED, FINALIZER, Server, Workspace};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_deleted_before_the_controller_saw_it_still_deletes_its_machines() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let name = "usage-early";
    namespace(&env.client, name).await?;
    let mut ws = simulated_workspace(name, 0, 0, 10, 5);
    ws.metadata.annotations = Some([(ANNOTATION_PAUSED.to_string(), "true".to_string())].into());
    let workspaces: Api<Workspace> = Api::all(env.client.clone());
    workspaces.create(&PostParams::default(), &ws).await?;
    let servers: Api<Server> = Api::namespaced(env.client.clone(), name);
    servers.create(&PostParams::default(), &server(name, "web", json!({}))).await?;
    wait_for("web Ready", DEADLINE, || async { servers.get("web").await.ok().filter(is_ready) }).await?;
    let sim = env.simulated("sim")?;
    assert_eq!(provisioning_controller::testing::machines_in(&sim, name).await?.len(), 1);

    // The Server took the Workspace into use before making its machine.
    let held = workspaces.get(name).await?;
    assert!(held.finalizers().iter().any(|f| f == FINALIZER), "Workspace finalizers: {:?}", held.finalizers());

    // Deleted now, the Workspace stays (deleting) until its Server is gone ...
    workspaces.delete(name, &DeleteParams::default()).await?;
    let deleting = workspaces.get(name).await?;
    assert!(deleting.metadata.deletion_timestamp.is_some());
    // ... and the Server still deletes its machine with the Workspace's account.
    servers.delete("web", &DeleteParams::default()).await?;
    wait_for("web gone", DEADLINE, || async { matches!(servers.get_opt("web").await, Ok(None)).then_some(()) }).await?;
    assert!(provisioning_controller::testing::machines_in(&sim, name).await?.is_empty(), "a machine outlived its Server");

    // Let go, the Workspace finishes deleting.
    let unpause = json!({"metadata": {"annotations": {ANNOTATION_PAUSED: null}}});
    workspaces.patch(name, &PatchParams::default(), &Patch::Merge(&unpause)).await?;
    wait_for("Workspace gone", DEADLINE, || async { matches!(workspaces.get_opt(name).await, Ok(None)).then_some(()) }).await?;

    // A Server that arrives while a never-visited Workspace is being deleted makes nothing.
    let late = "usage-late";
    namespace(&env.client, late).await?;
    let mut ws = simulated_workspace(late, 0, 0, 10, 5);
    ws.metadata.annotations = Some([(ANNOTATION_PAUSED.to_string(), "true".to_string())].into());
    ws.metadata.finalizers = Some(vec!["test.example/hold".to_string()]);
    workspaces.create(&PostParams::default(), &ws).await?;
    workspaces.delete(late, &DeleteParams::default()).await?;
    let late_servers: Api<Server> = Api::namespaced(env.client.clone(), late);
    late_servers.create(&PostParams::default(), &server(late, "web", json!({}))).await?;
    let refused = wait_for("late web Stalled", DEADLINE, || async {
        late_servers.get("web").await.ok().filter(|s| serde_json::to_string(&s.status).unwrap_or_default().contains("WorkspaceDeleting"))
    })
    .await?;
    assert!(refused.status.as_ref().and_then(|s| s.provider_id.as_ref()).is_none(), "{:?}", refused.status);
    assert!(provisioning_controller::testing::machines_in(&sim, late).await?.is_empty());

    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
