//! A Cluster pass reads its members as the API has them, not from the Server controller's
//! cache: the `owns` watch that triggers the pass is another watch than the one filling that
//! cache and may deliver a member's change first (a local run of `local_cluster_approval`
//! caught a pass planning on a member that was still Ready in the cache while its machine had
//! stopped; nothing triggered another pass, so the Cluster never planned the replacement).
//! Here the cache never hears of the member at all. Embedded API server, no controller.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector;
use provisioning_controller::cluster::dereference;
use provisioning_controller::context::{Context, Stores};
use provisioning_controller::host::HostPaths;
use provisioning_controller::metrics::Metrics;
use provisioning_controller::sync::CacheSync;
use provisioning_controller::testing::{TestEnv, server};
use provisioning_crds::{Cluster, LABEL_CLUSTER, Server};
use serde_json::json;

const NS: &str = "children";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pass_sees_its_servers_as_the_api_has_them_not_as_a_cache_has_them() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let namespace: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))?;
    kube::Api::<Namespace>::all(env.client.clone()).create(&PostParams::default(), &namespace).await?;
    let servers: kube::Api<Server> = kube::Api::namespaced(env.client.clone(), NS);
    let mut member = server(NS, "cache-nodes-0", json!({"plan": "small"}));
    member.metadata.labels = Some([(LABEL_CLUSTER.to_string(), "cache".to_string())].into());
    servers.create(&PostParams::default(), &member).await?;
    let stopped = json!({"status": {"providerID": "local://m0", "providerState": "stopped"}});
    servers.patch_status("cache-nodes-0", &PatchParams::default(), &Patch::Merge(stopped)).await?;

    // The controller's caches, never fed: as far behind the API as a cache can be.
    let stores = Stores {
        workspaces: reflector::store().0,
        servers: reflector::store().0,
        taskservs: reflector::store().0,
        clusters: reflector::store().0,
        synced: CacheSync::new(&[]),
    };
    let ctx = Context::new(env.client.clone(), env.config(), Arc::new(Metrics::default()), stores, "test".into(), HostPaths::default());
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "cache", "namespace": NS, "uid": "c-1"},
        "spec": {"pools": [{"name": "nodes", "replicas": 1}]}
    }))?;
    let children = dereference::children(&cluster, NS, &ctx).await?;
    let seen: Vec<(&str, bool)> = children.servers.iter().map(|s| (s.name.as_str(), s.machine_failed)).collect();
    assert_eq!(seen, [("cache-nodes-0", true)], "the member and its stopped machine, as the API has them");
    env.shutdown().await;
    Ok(())
}
