//! A TaskServ under `approval: Manual` on the local provider, through `provisioning dev`,
//! kubectl, Docker and real redis: the install waits (AwaitingApproval, `status.plan`
//! "1 to create", no script run, redis not on the machine) until `provisioning.dev/approve`
//! names the plan; a stale approval is ignored with a PlanStale Warning; a config change is
//! a new plan ("1 to update") that waits while the installed redis keeps running, and is
//! carried out once approved.

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{docker, docker_ok, server_container};

const NS: &str = "ts-approval";

fn field(dev: &Dev, path: &str) -> Result<String> {
    dev.kubectl_ok(&["get", "ts", "redis", "-n", NS, "-o", &format!("jsonpath={path}")])
}

fn ready(dev: &Dev) -> Result<String> {
    field(dev, "{.status.conditions[?(@.type==\"Ready\")].status}/{.status.conditions[?(@.type==\"Ready\")].reason}")
}

fn approve(dev: &Dev, id: &str) -> Result<()> {
    dev.kubectl_ok(&["annotate", "ts", "redis", "-n", NS, "--overwrite", &format!("provisioning.dev/approve={id}")]).map(drop)
}

#[test]
fn a_manual_taskserv_runs_scripts_only_for_the_approved_plan() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    let mut dev = Dev::start(&["tests/tests/local_taskserv_approval.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "srv/cache", "-n", NS, "--timeout=120s"])?;

    // The install waits for approval: nothing ran on the machine.
    dev.wait_until(Duration::from_secs(60), "the TaskServ awaits approval", |d| Ok(ready(d)? == "False/AwaitingApproval"))?;
    assert_eq!(field(&dev, "{.status.phase}")?, "AwaitingApproval");
    assert_eq!(field(&dev, "{.status.plan.summary}")?, "1 to create");
    let first = field(&dev, "{.status.plan.id}")?;
    let message = field(&dev, "{.status.conditions[?(@.type==\"Ready\")].message}")?;
    assert!(message.contains(&format!("provisioning.dev/approve={first}")), "{message}");
    assert_eq!(field(&dev, "{.status.servers[0].lastRun}")?, "", "no script ran");
    let container = server_container(NS, "cache")?;
    let has_redis = |c: &str| docker(&["exec", c, "sh", "-c", "command -v redis-server"]).is_ok_and(|o| o.status.success());
    assert!(!has_redis(&container), "redis was installed before approval");

    // A stale approval is ignored, with a PlanStale Warning naming the current plan.
    approve(&dev, "0000000000")?;
    dev.wait_until(Duration::from_secs(30), "a PlanStale warning", |d| {
        let events =
            d.kubectl_ok(&["get", "events", "-n", NS, "--field-selector", "reason=PlanStale", "-o", "jsonpath={.items[*].message}"])?;
        Ok(events.contains(&first))
    })?;
    assert_eq!(ready(&dev)?, "False/AwaitingApproval");
    assert!(!has_redis(&container));

    // The right approval: installed and Ready.
    approve(&dev, &first)?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "ts/redis", "-n", NS, "--timeout=300s"])?;
    assert!(has_redis(&container));
    assert_eq!(field(&dev, "{.status.approvedPlan.id}")?, first);
    assert_eq!(field(&dev, "{.status.plan.summary}")?, "no changes");

    // A config change is a new plan: it waits, the running redis is left alone.
    dev.kubectl_ok(&["patch", "ts", "redis", "-n", NS, "--type", "merge", "-p", r#"{"spec":{"config":{"maxmemory":"32mb"}}}"#])?;
    dev.wait_until(Duration::from_secs(60), "the update awaits approval", |d| {
        Ok(ready(d)? == "False/AwaitingApproval" && field(d, "{.status.observedGeneration}")? == "2")
    })?;
    assert_eq!(field(&dev, "{.status.plan.summary}")?, "1 to update");
    let second = field(&dev, "{.status.plan.id}")?;
    assert_ne!(second, first);
    let conf = || docker_ok(&["exec", &container, "cat", "/etc/redis/redis.conf"]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(!conf()?.contains("32mb"), "the config changed before approval");
    assert!(docker_ok(&["exec", &container, "sh", "-c", "pgrep -x redis-server"]).is_ok(), "redis keeps running while the plan waits");

    approve(&dev, &second)?;
    dev.wait_until(Duration::from_secs(300), "the update carried out", |d| {
        Ok(ready(d)? == "True/Ready" && field(d, "{.status.plan.summary}")? == "no changes")
    })?;
    assert!(conf()?.contains("32mb"), "{}", conf()?);

    dev.kubectl_ok(&["delete", "ts,srv", "--all", "-n", NS, "--timeout=120s"])?;
    dev.stop();
    Ok(())
}
