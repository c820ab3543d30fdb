//! Disks end to end on the local (Docker) provider: a Server with two disks — `data`
//! (Delete) and `keep` (Retain), each mounted — becomes Ready with its disks in
//! `status.disks` and the plan; each is a named Docker volume mounted at its mountPath inside
//! the machine; deleting the Server removes `data` with the container and leaves `keep`
//! (labelled retained). A raw disk (no mountPath) is refused on local machines: Stalled
//! InvalidDisks naming the field, nothing created. Needs the Docker engine and the node
//! image (`scripts/test.sh` builds it).

use std::time::Duration;

use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use provisioning_controller::testing::{self, TestEnv, condition, is_ready, server, wait_for};
use provisioning_crds::Server;
use provisioning_providers::{ExecRequest, Provider, tags};
use serde_json::json;

const NAMESPACE: &str = "disks-e2e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disks_are_mounted_volumes_and_only_retained_ones_outlive_the_server() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let local = testing::local(&env.state_dir)?;
    for m in testing::machines_in(&local, NAMESPACE).await? {
        local.delete_server(&m.provider_id).await?;
    }
    let controller = env.start_controller(env.config());
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone()).create(&PostParams::default(), &ns).await?;
    let api: Api<Server> = Api::namespaced(env.client.clone(), NAMESPACE);
    let spec = json!({"plan": "small", "disks": [
        {"name": "data", "size": "10Gi", "mountPath": "/var/lib/data"},
        {"name": "keep", "size": "20Gi", "type": "local", "mountPath": "/srv/keep", "deletionPolicy": "Retain"}
    ]});
    let created = api.create(&PostParams::default(), &server(NAMESPACE, "node", spec)).await?;
    let uid = created.uid().unwrap_or_default();
    // A raw disk cannot be a Docker volume: refused before anything is made.
    let raw = json!({"plan": "small", "disks": [{"name": "osd", "size": "10Gi"}]});
    api.create(&PostParams::default(), &server(NAMESPACE, "raw", raw)).await?;

    let ready = wait_for("server node Ready", Duration::from_secs(120), || async { api.get("node").await.ok().filter(is_ready) }).await?;
    let status = ready.status.clone().unwrap_or_default();
    let recorded: Vec<String> =
        status.disks.unwrap_or_default().iter().map(|d| format!("{} {} {}", d.name, d.size, d.mount_path)).collect();
    assert_eq!(recorded, vec!["data 10Gi /var/lib/data", "keep 20Gi /srv/keep"], "status.disks");

    // Each disk is a named volume mounted at its path inside the machine.
    let volumes = local.disk_volumes(&uid).await?;
    let mut names: Vec<String> = volumes.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(names, vec![format!("provisioning-{uid}-data"), format!("provisioning-{uid}-keep")]);
    let machine = status.provider_id.clone().map(provisioning_providers::ProviderId).ok_or_else(|| anyhow::anyhow!("no providerID"))?;
    let mounted = local
        .exec(
            &machine,
            ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "grep -c -E ' (/var/lib/data|/srv/keep) ' /proc/mounts".into()],
                stdin: None,
                env: Default::default(),
                timeout: Duration::from_secs(20),
                output: None,
                ssh_key: None,
            },
        )
        .await?;
    assert_eq!((mounted.exit_code, mounted.stdout.trim()), (Some(0), "2"), "both mounted: {mounted:?}");

    let stalled = wait_for("server raw Stalled", Duration::from_secs(60), || async {
        api.get("raw").await.ok().and_then(|s| condition(&s, "Stalled")).filter(|(status, _)| status == "True")
    })
    .await?;
    assert!(stalled.1.contains("spec.disks[0].mountPath") && stalled.1.contains("raw"), "{stalled:?}");

    for name in ["node", "raw"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    wait_for("servers gone", Duration::from_secs(90), || async {
        api.list(&ListParams::default()).await.ok().filter(|l| l.items.is_empty()).map(|_| ())
    })
    .await?;
    assert!(testing::machines_in(&local, NAMESPACE).await?.is_empty(), "containers removed");
    let left = local.disk_volumes(&uid).await?;
    let left_names: Vec<(&str, Option<&str>)> =
        left.iter().map(|(n, labels)| (n.as_str(), labels.get(tags::RETAINED).map(String::as_str))).collect();
    let keep = format!("provisioning-{uid}-keep");
    assert_eq!(left_names, vec![(keep.as_str(), Some("true"))], "only the retained disk is left");
    local.delete_disk_volume(&keep).await?;
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
