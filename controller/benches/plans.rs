//! Plan computation (harness = false, pure, a few seconds): a 100-server Cluster's
//! `status.plan` over its observed children (every member with a pending machine plan, so
//! the worst case), and the 100 member Servers' own plans (a pool resize on the local
//! provider: an in-place Update each), as the reconcilers compute them on every pass.
//!
//! Run: `cargo bench -p provisioning-controller --bench plans --profile dev` (the release
//! profile would rebuild every dependency; README.md has the debug-build figures)

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use provisioning_controller::cluster::plan::{ChildServer, Observed, cluster_plan, desired_servers};
use provisioning_controller::server::plan::spec_plan;
use provisioning_controller::server::validate::ValidServer;
use provisioning_crds::{Cluster, ClusterStatus, ProviderAccount, ServerStatus};
use provisioning_providers::Provider;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let cluster: Cluster = serde_yaml_ng::from_str(
        "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {name: big, namespace: bench, uid: c-1, generation: 2}\n\
         spec:\n  provider: local\n  pools: [{name: members, replicas: 100, plan: medium}]\n",
    )?;
    let status = ClusterStatus::default();
    let services = Ok(Vec::new());
    let empty = Observed {
        name: "big",
        uid: "c-1",
        generation: Some(2),
        spec: &cluster.spec,
        status: &status,
        services: &services,
        servers: &[],
        taskservs: &[],
        clusters: &[],
        now: Timestamp::now(),
        endpoint: Default::default(),
    };
    let local = provisioning_controller::testing::local(&std::env::temp_dir().join("plans-bench"))?;
    let account: ProviderAccount = serde_json::from_value(serde_json::json!({"name": "local", "type": "local"}))?;
    let desired = desired_servers(&empty);
    // Every member exists, was made small and is planned to be resized.
    let members: Vec<(provisioning_crds::Server, ServerStatus)> = desired
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.clone();
            s.metadata.namespace = Some("bench".into());
            let st = ServerStatus {
                provider_id: Some(format!("local://{i:012x}")),
                provider_state: Some("running".into()),
                resolved_plan: Some("cpu1-mem1g".into()),
                zone: Some(String::new()),
                image: Some("debian-12".into()),
                ..Default::default()
            };
            (s, st)
        })
        .collect();
    let valid = ValidServer {
        account,
        plan: "medium".into(),
        resolved_plan: local.resolve_plan("medium")?,
        zone: String::new(),
        spec_zone: String::new(),
        image: "debian-12".into(),
        fallback_zones: Vec::new(),
        public_ip: None,
        disks: Vec::new(),
    };
    let server_plans = |members: &[(provisioning_crds::Server, ServerStatus)]| {
        members
            .iter()
            .map(|(s, st)| spec_plan(s, &valid, Some(st), |f| local.in_place(f), |a, b| local.same_plan(a, b), |p, z| local.price(p, z)))
            .collect::<Vec<_>>()
    };
    let mut samples = Vec::new();
    let mut plans = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        plans = server_plans(&members);
        samples.push(t.elapsed());
    }
    let servers_median = median(samples);
    let children: Vec<ChildServer> = desired
        .iter()
        .zip(&plans)
        .map(|(s, p)| ChildServer {
            name: s.metadata.name.clone().unwrap_or_default(),
            labels: s.metadata.labels.clone().unwrap_or_default(),
            spec: provisioning_crds::ServerSpec { plan: "small".into(), ..s.spec.clone() },
            owned: true,
            ready: true,
            stalled: None,
            deleting: false,
            machine_failed: false,
            pending_since: None,
            pending_plan: Some(p.plan.clone()),
            provider_id: None,
            observed_current: true,
            approve: None,
        })
        .collect();
    let observed = Observed { servers: &children, ..empty };
    let mut samples = Vec::new();
    let mut summary = String::new();
    for _ in 0..200 {
        let t = Instant::now();
        let plan = cluster_plan(&observed, "bench", &[]);
        samples.push(t.elapsed());
        summary = plan.summary;
    }
    let cluster_median = median(samples);
    println!(
        "100 member Servers' plans (local resize, in place): {servers_median:?} median of 200 ({:?} per Server)",
        servers_median / 100
    );
    println!("100-server Cluster plan with every member's pending plan: {cluster_median:?} median of 200 (summary: {summary})");
    Ok(())
}
