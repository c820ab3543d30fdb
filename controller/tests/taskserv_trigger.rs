//! A TaskServ whose script run fails has the Server reconciler look at the machine at once,
//! in process: nothing is written to the Server (no `reconcile-requested-at` annotation, which
//! stays the user's "reconcile now"). Embedded API server, controller in-process, simulated
//! provider (its exec answers for machines that exist).

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use provisioning_controller::testing::{TestEnv, is_ready, server, simulated_workspace, wait_for};
use provisioning_crds::{ANNOTATION_RECONCILE_REQUESTED_AT, Server, TaskServ, Workspace};
use provisioning_providers::{Provider, ProviderId};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
const NS: &str = "poke";

async fn ready_server(api: &Api<Server>, name: &str, not_id: Option<&str>) -> anyhow::Result<Server> {
    wait_for(&format!("Server {name} Ready (machine other than {not_id:?})"), DEADLINE, || {
        let api = api.clone();
        let name = name.to_string();
        async move {
            let s = api.get(&name).await.ok()?;
            let id = s.status.as_ref().and_then(|st| st.provider_id.clone())?;
            (is_ready(&s) && Some(id.as_str()) != not_id).then_some(s)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_pokes_the_server_in_process_without_writing_to_it() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    // Ready Servers resync after 10 min: only the TaskServ's poke makes this one look sooner.
    let controller = env.start_controller(env.config());
    Api::<Workspace>::all(env.client.clone()).create(&PostParams::default(), &simulated_workspace(NS, 0, 0, 10, 5)).await?;
    let servers: Api<Server> = Api::namespaced(env.client.clone(), NS);
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    wait_for("namespace made by the Workspace", DEADLINE, || {
        let namespaces = namespaces.clone();
        async move { namespaces.get_opt(NS).await.ok().flatten().map(|_| ()) }
    })
    .await?;
    servers.create(&PostParams::default(), &server(NS, "web", json!({"plan": "small"}))).await?;
    let first = ready_server(&servers, "web", None).await?;
    let first_id = first.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();

    // The machine dies behind the controller's back; the Server's status still says Ready.
    env.simulated("sim")?.delete_server(&ProviderId(first_id.clone())).await?;
    let taskservs: Api<TaskServ> = Api::namespaced(env.client.clone(), NS);
    let ts: TaskServ = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ",
        "metadata": {"name": "cache", "namespace": NS},
        "spec": {"service": "redis", "servers": {"names": ["web"]}}
    }))?;
    taskservs.create(&PostParams::default(), &ts).await?;

    // The install fails (no machine), the Server looks now and makes a new machine.
    let second = ready_server(&servers, "web", Some(&first_id)).await?;
    assert!(
        !second.annotations().contains_key(ANNOTATION_RECONCILE_REQUESTED_AT),
        "the TaskServ wrote {ANNOTATION_RECONCILE_REQUESTED_AT} on the Server: {:?}",
        second.annotations()
    );
    let annotation_writers: Vec<String> = second
        .managed_fields()
        .iter()
        .filter(|m| m.fields_v1.as_ref().is_some_and(|f| f.0.to_string().contains("reconcile-requested-at")))
        .map(|m| m.manager.clone().unwrap_or_default())
        .collect();
    assert!(annotation_writers.is_empty(), "managers of reconcile-requested-at: {annotation_writers:?}");

    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
