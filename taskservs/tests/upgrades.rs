//! A real upgrade and a real rollback, at script level, on a 3-member Cluster of node
//! containers: nginx has two installable Debian versions here (1.22.1-9+deb12u9 from
//! bookworm, 1.22.1-9+deb12u11 from bookworm-security), and install.nu pins the exact
//! package version (downgrading too). The steps are the controller's for a TaskServ whose
//! version changes with rollbackOnFailure: one member at a time, install the new version,
//! check; a failure stops the rollout and re-installs the last good version.
//!
//! Needs Docker, the node image `provisioning-node:latest` and nu; it fails, never skips.

mod common;
#[path = "common/lab.rs"]
mod lab;

use std::time::Duration;

use lab::{Lab, assert_ok, check_until_ok, context, exec_in, exec_status, node_info, step};
use provisioning_taskservs::{Catalog, PeerInfo, ScriptContext, ScriptStep};
use serde_json::{Value, json};

const OLD: &str = "1.22.1-9+deb12u9";
const NEW: &str = "1.22.1-9+deb12u11";

/// The dpkg version of nginx in `container`.
fn dpkg_version(container: &str) -> String {
    exec_in(container, &["dpkg-query", "-W", "-f", "${Version}", "nginx"])
}

/// The context of member `i` at `version` with `config`, its previous version set as the
/// controller sets it during an upgrade or rollback.
fn member_ctx(catalog: &Catalog, members: &[PeerInfo], i: usize, version: &str, previous: Option<&str>, config: &Value) -> ScriptContext {
    let peers: Vec<PeerInfo> = members.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, p)| p.clone()).collect();
    let mut ctx = context(catalog, "nginx", Some(version), &members[i], &peers, members, config.clone());
    ctx.taskserv.previous_version = previous.map(str::to_string);
    ctx
}

#[tokio::test(flavor = "multi_thread")]
async fn nginx_rolling_upgrade_and_rollback_on_three_members() {
    let catalog = Catalog::load(&Catalog::default_dir()).expect("catalog");
    let versions = &catalog.get("nginx").expect("nginx in the catalog").manifest.versions;
    assert!(versions.iter().any(|v| v == OLD) && versions.iter().any(|v| v == NEW), "{versions:?}");
    let mut lab = Lab::new("upgrade");
    let nodes: Vec<(String, PeerInfo)> = (0..3)
        .map(|i| {
            let name = format!("web-{i}");
            let (container, ip) = lab.node(&name, &[]);
            (container, node_info(&name, &ip, "web"))
        })
        .collect();
    let members: Vec<PeerInfo> = nodes.iter().map(|(_, p)| p.clone()).collect();
    let good = json!({});

    // 1. The old version everywhere (a first rollout, all members at once).
    let first: Vec<ScriptContext> = (0..3).map(|i| member_ctx(&catalog, &members, i, OLD, None, &good)).collect();
    let installs = tokio::join!(
        step(&nodes[0].0, ScriptStep::Install, &first[0]),
        step(&nodes[1].0, ScriptStep::Install, &first[1]),
        step(&nodes[2].0, ScriptStep::Install, &first[2]),
    );
    for outcome in [&installs.0, &installs.1, &installs.2] {
        assert_ok("install old", outcome);
        assert_eq!(outcome.reported_version(), Some(OLD));
    }
    for (i, (c, _)) in nodes.iter().enumerate() {
        assert_ok("check old", &check_until_ok(c, &member_ctx(&catalog, &members, i, OLD, None, &good), Duration::from_secs(30)).await);
        assert_eq!(dpkg_version(c), OLD);
    }

    // 2. A failed upgrade: the new version with a config whose port is taken on web-0 (a
    //    listener the machine already runs). Install fails naming the cause; the rollout
    //    stops at the first member, the others keep serving the old version.
    exec_in(&nodes[0].0, &["sh", "-c", "nohup nc -lk -p 8088 >/dev/null 2>&1 &"]);
    let bad = json!({"listenPort": 8088});
    let failed = step(&nodes[0].0, ScriptStep::Install, &member_ctx(&catalog, &members, 0, NEW, Some(OLD), &bad)).await;
    assert!(!failed.succeeded(), "the upgrade onto a busy port succeeded:\n{}", failed.output_tail);
    assert!(failed.output_tail.contains("Address already in use"), "{}", failed.output_tail);
    assert_eq!(dpkg_version(&nodes[0].0), NEW, "the failed upgrade did install the new package");
    let unhealthy = step(&nodes[0].0, ScriptStep::Check, &member_ctx(&catalog, &members, 0, NEW, Some(OLD), &bad)).await;
    assert!(!unhealthy.succeeded(), "web-0 healthy after the failed upgrade:\n{}", unhealthy.output_tail);
    for i in [1, 2] {
        assert_ok("untouched member", &step(&nodes[i].0, ScriptStep::Check, &member_ctx(&catalog, &members, i, OLD, None, &good)).await);
        assert_eq!(dpkg_version(&nodes[i].0), OLD);
    }
    //    Rollback: the last good version and config go back on web-0 (a real downgrade).
    let rollback_ctx = member_ctx(&catalog, &members, 0, OLD, Some(NEW), &good);
    let rollback = step(&nodes[0].0, ScriptStep::Install, &rollback_ctx).await;
    assert_ok("rollback", &rollback);
    assert_eq!(rollback.reported_version(), Some(OLD));
    let healthy = check_until_ok(&nodes[0].0, &rollback_ctx, Duration::from_secs(30)).await;
    assert_ok("check after rollback", &healthy);
    assert_eq!(lab::result_str(&healthy, "packageVersion"), Some(OLD));
    assert_eq!(dpkg_version(&nodes[0].0), OLD);
    exec_in(&nodes[0].0, &["pkill", "-x", "nc"]);

    // 3. The upgrade again with a good config, one member at a time: each runs the new
    //    version and passes its check before the next starts; the others serve meanwhile.
    for i in 0..3 {
        let ctx = member_ctx(&catalog, &members, i, NEW, Some(OLD), &good);
        let upgraded = step(&nodes[i].0, ScriptStep::Install, &ctx).await;
        assert_ok(&format!("upgrade web-{i}"), &upgraded);
        assert_eq!(lab::result_str(&upgraded, "packageVersion"), Some(NEW));
        let check = check_until_ok(&nodes[i].0, &ctx, Duration::from_secs(30)).await;
        assert_ok(&format!("check web-{i} after upgrade"), &check);
        assert_eq!(dpkg_version(&nodes[i].0), NEW);
        for (j, (c, p)) in nodes.iter().enumerate().filter(|(j, _)| *j != i) {
            let url = format!("http://{}:80/healthz", p.addresses[0].address);
            let (code, body) = exec_status(&nodes[i].0, &["curl", "-fsS", "--max-time", "5", &url]);
            assert_eq!((code, body.trim()), (0, "ok"), "web-{j} ({c}) not serving while web-{i} upgrades");
        }
    }

    for (i, (c, _)) in nodes.iter().enumerate() {
        let ctx = member_ctx(&catalog, &members, i, NEW, None, &good);
        assert_ok("remove", &step(c, ScriptStep::Remove, &ctx).await);
        // Purged: dpkg knows no such package, or "unknown ok not-installed".
        let (_, status) = exec_status(c, &["dpkg-query", "-W", "-f", "${Status}", "nginx"]);
        assert!(!status.contains(" installed"), "nginx still installed on web-{i}: {status}");
    }
}
