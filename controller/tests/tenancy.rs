//! The tenancy suite, controller side (issue 26, item 2), written as an attacker: tenant A can
//! write its own Server's status (say, through a role it was wrongly given) and points
//! `status.providerID` at tenant B's machine, on a provider account both workspaces share.
//! The controller must neither observe it as A's, nor delete it when A's Server goes: the
//! machine carries B's Server uid, and status alone is never proof. B's machine and Server
//! are unchanged. (Running scripts through a foreign id is refused by every provider in the
//! provider contract suite: `only_its_server_acts`.)

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use provisioning_controller::testing::{TestEnv, is_ready, server, simulated_workspace, wait_for};
use provisioning_crds::{ANNOTATION_PAUSED, Server, Workspace};
use provisioning_providers::{MachineState, Provider, ProviderId, tags};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

async fn workspace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
    Api::<Workspace>::all(client.clone()).create(&PostParams::default(), &simulated_workspace(name, 0, 0, 10, 5)).await?;
    Ok(())
}

fn status_text(s: &Server) -> String {
    serde_json::to_string(&s.status).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_provider_id_pointing_at_another_tenants_machine_is_refused() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    let (a, b) = ("tenancy-a", "tenancy-b");
    workspace(&env.client, a).await?;
    workspace(&env.client, b).await?;
    let servers_a: Api<Server> = Api::namespaced(env.client.clone(), a);
    let servers_b: Api<Server> = Api::namespaced(env.client.clone(), b);

    // B's Server and its machine.
    servers_b.create(&PostParams::default(), &server(b, "victim", json!({}))).await?;
    let victim = wait_for("victim Ready", DEADLINE, || async { servers_b.get("victim").await.ok().filter(is_ready) }).await?;
    let victim_id = victim.status.as_ref().and_then(|s| s.provider_id.clone()).ok_or_else(|| anyhow::anyhow!("no providerID"))?;
    let sim = env.simulated("sim")?;
    let before = sim.observe_server(&ProviderId(victim_id.clone())).await?.ok_or_else(|| anyhow::anyhow!("victim machine"))?;
    assert_eq!(before.tags.get(tags::SERVER_UID), victim.uid().as_ref());

    // A's Server, paused while its status is forged to name B's machine, then let go.
    let mut intruder = server(a, "intruder", json!({}));
    intruder.metadata.annotations = Some([(ANNOTATION_PAUSED.to_string(), "true".to_string())].into());
    servers_a.create(&PostParams::default(), &intruder).await?;
    let forged = json!({"status": {"providerID": victim_id, "providerState": "running"}});
    servers_a.patch_status("intruder", &PatchParams::default(), &Patch::Merge(&forged)).await?;
    servers_a
        .patch("intruder", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"annotations": {ANNOTATION_PAUSED: null}}})))
        .await?;

    let refused = wait_for("intruder refused", DEADLINE, || async {
        servers_a.get("intruder").await.ok().filter(|s| status_text(s).contains("refusing to observe machine"))
    })
    .await?;
    assert!(!is_ready(&refused), "the intruder never becomes Ready on B's machine: {}", status_text(&refused));
    assert!(!status_text(&refused).contains(&victim.uid().unwrap_or_default()), "B's uid is not disclosed: {}", status_text(&refused));

    // Deleting A's Server deletes nothing of B's.
    servers_a.delete("intruder", &DeleteParams::default()).await?;
    wait_for("intruder gone", DEADLINE, || async { servers_a.get_opt("intruder").await.ok().and_then(|o| o.is_none().then_some(())) })
        .await?;
    let after = sim.observe_server(&ProviderId(victim_id.clone())).await?.ok_or_else(|| anyhow::anyhow!("B's machine was deleted"))?;
    assert_eq!(after.state, MachineState::Running);
    assert_eq!(after.tags, before.tags);
    let victim_after = servers_b.get("victim").await?;
    assert!(is_ready(&victim_after), "B's Server is still Ready");
    assert_eq!(victim_after.status.as_ref().and_then(|s| s.provider_id.clone()), Some(victim_id));

    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
