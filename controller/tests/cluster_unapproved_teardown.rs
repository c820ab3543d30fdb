//! A Manual Cluster scaled up (its new member awaits approval: no machine, no address) and
//! then deleted before its TaskServ (the 200-seed lifecycle soak, seed 173). The TaskServ's
//! `remove.nu` runs on the old members render etcd's member list, which named the unapproved
//! member; its missing address made every removal wait for it, for ever, and the Cluster
//! stayed "Deleting". A removal now leaves a peer without a machine out of its context.
//! Embedded API server, controller in-process, simulated provider, the real catalog.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use provisioning_controller::testing::{TestEnv, simulated_workspace, wait_for};
use provisioning_crds::{Cluster, Server, TaskServ, Workspace};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);
const NS: &str = "unapproved-teardown";

fn ready(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> bool {
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

async fn workspace(client: &Client) -> anyhow::Result<()> {
    let api = Api::<Workspace>::all(client.clone());
    api.create(&PostParams::default(), &simulated_workspace(NS, 0, 0, 10, 5)).await?;
    wait_for("workspace Ready", DEADLINE, || {
        let api = api.clone();
        async move { api.get(NS).await.ok()?.status.filter(|s| ready(&s.conditions)).map(|_| ()) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_cluster_deleted_while_its_new_member_awaits_approval_is_gone() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    workspace(&env.client).await?;
    let clusters: Api<Cluster> = Api::namespaced(env.client.clone(), NS);
    let servers: Api<Server> = Api::namespaced(env.client.clone(), NS);
    let taskservs: Api<TaskServ> = Api::namespaced(env.client.clone(), NS);
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "db", "namespace": NS},
        "spec": {"provider": "sim", "pools": [{"name": "m", "replicas": 2, "plan": "small"}],
                 "taskservs": [{"service": "etcd", "pools": ["m"]}]}
    }))?;
    clusters.create(&PostParams::default(), &cluster).await?;
    wait_for("the Cluster and its TaskServ Ready", DEADLINE, || {
        let (clusters, taskservs) = (clusters.clone(), taskservs.clone());
        async move {
            let ts = taskservs.get("db-etcd").await.ok()?.status?;
            let installed = ts.servers.iter().filter(|s| s.phase == "Installed").count();
            let c = clusters.get("db").await.ok()?.status?;
            (installed == 2 && ready(&ts.conditions) && ready(&c.conditions)).then_some(())
        }
    })
    .await?;

    // Manual approval, then 2 → 3: the new member exists but gets no machine until approved.
    let manual = json!({"spec": {"approval": "Manual", "pools": [{"name": "m", "replicas": 3, "plan": "small"}]}});
    clusters.patch("db", &PatchParams::default(), &Patch::Merge(&manual)).await?;
    wait_for("member db-m-2 awaiting approval, without a machine", DEADLINE, || {
        let servers = servers.clone();
        async move {
            let s = servers.get("db-m-2").await.ok()?;
            let plan = s.status.as_ref()?.plan.as_ref()?;
            (s.status.as_ref()?.provider_id.is_none() && !plan.changes.is_empty()).then_some(())
        }
    })
    .await?;

    // The Cluster deleted first: its TaskServ is removed from the two old members, then the
    // Servers go, then the Cluster.
    clusters.delete("db", &DeleteParams::default()).await?;
    wait_for("the Cluster, its TaskServ and its Servers gone", DEADLINE, || {
        let (clusters, taskservs, servers) = (clusters.clone(), taskservs.clone(), servers.clone());
        async move {
            let cluster_gone = clusters.get_opt("db").await.ok()?.is_none();
            let ts_gone = taskservs.get_opt("db-etcd").await.ok()?.is_none();
            let servers_gone = servers.list(&Default::default()).await.ok()?.items.is_empty();
            (cluster_gone && ts_gone && servers_gone).then_some(())
        }
    })
    .await?;
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
