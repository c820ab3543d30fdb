//! A Cluster under `approval: Manual` on the local provider, through `provisioning dev`,
//! kubectl, Docker and real redis: nothing is made while the Cluster waits (Ready=False
//! AwaitingApproval, its Servers AwaitingApproval too, no container); a stale approval is
//! ignored with a PlanStale Warning; ONE `provisioning.dev/approve` on the Cluster (as the
//! Argo CD action, k9s Shift-V and the console write it) makes both machines and installs
//! redis on them — the test never annotates a member. A config change of the service then
//! waits (no script runs) until the Cluster's next plan is approved the same way, and so do the
//! replacement of a member whose machine stopped and a scale-down (the Server stays until
//! approved). The approved replacement goes on while its plan is restated (the TaskServ, held
//! paused, plans the re-install on the new machine only afterwards) and is not carried out
//! before redis runs there; a second member stopping meanwhile is new: it waits for its own
//! approval, and the Cluster's message names it.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::time::Duration;

use anyhow::{Context, Result};
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{containers, docker, docker_ok, leftovers, server_container};

const NS: &str = "cl-approval";
const CLUSTER: &str = "cache";
const MEMBERS: [&str; 2] = ["cache-nodes-0", "cache-nodes-1"];
const SPARE: &str = "cache-spare-0";
const TASKSERV: &str = "cache-redis";

/// Removes what this test made in Docker when it ends, also when it fails.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        provisioning_e2e::docker::remove_leftovers(NS, CLUSTER);
    }
}

fn get(dev: &Dev, what: &str, path: &str) -> Result<String> {
    dev.kubectl_ok(&["get", what, "-n", NS, "-o", &format!("jsonpath={path}")])
}

fn ready(dev: &Dev, what: &str) -> Result<String> {
    get(dev, what, "{.status.conditions[?(@.type==\"Ready\")].status}/{.status.conditions[?(@.type==\"Ready\")].reason}")
}

fn cluster(dev: &Dev, path: &str) -> Result<String> {
    get(dev, &format!("pcl/{CLUSTER}"), path)
}

/// Annotates the Cluster the way the Argo CD action does: its current plan id.
fn approve(dev: &Dev, id: &str) -> Result<()> {
    dev.kubectl_ok(&["annotate", "pcl", CLUSTER, "-n", NS, "--overwrite", &format!("provisioning.dev/approve={id}")]).map(drop)
}

fn last_runs(dev: &Dev) -> Result<String> {
    get(dev, &format!("ts/{TASKSERV}"), "{range .status.servers[*]}{.name}={.lastRun.finishedAt} {end}")
}

/// Pauses the TaskServ and waits until its controller says so (`Paused=True`): from then on
/// it does not look at its servers until [`resume`].
fn pause(dev: &mut Dev) -> Result<()> {
    dev.kubectl_ok(&["annotate", "ts", TASKSERV, "-n", NS, "--overwrite", "provisioning.dev/paused=true"])?;
    dev.wait_until(Duration::from_secs(30), "the TaskServ paused", |d| {
        Ok(get(d, &format!("ts/{TASKSERV}"), "{.status.conditions[?(@.type==\"Paused\")].status}")? == "True")
    })
}

fn resume(dev: &Dev) -> Result<()> {
    dev.kubectl_ok(&["annotate", "ts", TASKSERV, "-n", NS, "provisioning.dev/paused-"]).map(drop)
}

/// What the Cluster, its Servers and its TaskServ say, for a failed wait's report.
fn state(dev: &Dev) -> String {
    let cluster = cluster(
        dev,
        "plan {.status.plan.id} ({.status.plan.summary}), approved {.status.approvedPlan.id} {.status.approvedPlan.changes}, annotation {.metadata.annotations.provisioning\\.dev/approve}, Ready {.status.conditions[?(@.type==\"Ready\")].message}",
    );
    let servers = get(
        dev,
        "srv",
        "{range .items[*]}{.metadata.name} {.metadata.uid} {.status.providerState} {.status.conditions[?(@.type==\"Ready\")].reason} plan {.status.plan.id} approve {.metadata.annotations.provisioning\\.dev/approve}; {end}",
    );
    let taskserv = get(dev, &format!("ts/{TASKSERV}"), "{.status.plan} approve {.metadata.annotations.provisioning\\.dev/approve}");
    format!("Cluster: {cluster:?}\nServers: {servers:?}\nTaskServ: {taskserv:?}")
}

fn has_redis(container: &str) -> bool {
    docker(&["exec", container, "sh", "-c", "command -v redis-server"]).is_ok_and(|o| o.status.success())
}

// Over 80 lines on purpose: one scenario, step by step, each step's assertions next to it.
#[test]
fn one_approval_of_a_manual_cluster_carries_out_everything_its_plan_covers() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(leftovers(NS, CLUSTER)?.is_empty(), "leftovers of an earlier run: {:?}", leftovers(NS, CLUSTER)?);
    let _cleanup = Cleanup;
    let mut dev = Dev::start(&["tests/tests/local_cluster_approval.yaml"])?;

    // Waiting: the Cluster and its 3 Servers await approval; the Cluster's plan holds the
    // members' machines (their own plans) and the TaskServ to create.
    dev.wait_until(Duration::from_secs(60), "the Cluster and its Servers await approval", |d| {
        let members_wait =
            MEMBERS.iter().chain([&SPARE]).all(|m| ready(d, &format!("srv/{m}")).is_ok_and(|r| r == "False/AwaitingApproval"));
        let machines = cluster(d, "{.status.plan.changes[*].to}")?.matches("machine from").count();
        Ok(members_wait && machines == 3 && ready(d, &format!("pcl/{CLUSTER}"))? == "False/AwaitingApproval")
    })?;
    let first = cluster(&dev, "{.status.plan.id}")?;
    let message = cluster(&dev, "{.status.conditions[?(@.type==\"Ready\")].message}")?;
    assert!(message.contains(&format!("provisioning.dev/approve={first}")), "{message}");
    assert_eq!(cluster(&dev, "{.status.phase}")?, "AwaitingApproval");
    assert!(containers(NS, CLUSTER)?.is_empty(), "a container was made before approval");

    // A stale approval is ignored, with a PlanStale Warning on the Cluster naming its plan.
    approve(&dev, "0000000000")?;
    dev.wait_until(Duration::from_secs(30), "a PlanStale warning on the Cluster", |d| {
        let selector = format!("reason=PlanStale,involvedObject.kind=Cluster,involvedObject.name={CLUSTER}");
        let events = d.kubectl_ok(&["get", "events", "-n", NS, "--field-selector", &selector, "-o", "jsonpath={.items[*].message}"])?;
        Ok(events.contains(&first))
    })?;
    assert_eq!(ready(&dev, &format!("pcl/{CLUSTER}"))?, "False/AwaitingApproval");
    assert!(containers(NS, CLUSTER)?.is_empty(), "a stale approval made a container");

    // One approval on the Cluster: both machines, redis on both, Ready. The members were
    // approved by the controller (their annotation names the plan each carried out).
    approve(&dev, &first)?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", &format!("pcl/{CLUSTER}"), "-n", NS, "--timeout=240s"])?;
    let mut machines = Vec::new();
    for m in MEMBERS {
        let container = server_container(NS, m)?;
        assert!(has_redis(&container), "redis missing on {m}");
        let annotation = get(&dev, &format!("srv/{m}"), "{.metadata.annotations.provisioning\\.dev/approve}")?;
        assert_eq!(annotation, get(&dev, &format!("srv/{m}"), "{.status.lastAppliedPlan}")?, "{m} carried out the plan approved for it");
        machines.push(container);
    }
    let managers = get(&dev, &format!("ts/{TASKSERV}"), "{.metadata.managedFields[*].manager}")?;
    assert!(managers.contains("provisioning-controller"), "{managers}");
    dev.wait_until(Duration::from_secs(30), "the approval carried out: it covers nothing more", |d| {
        Ok(cluster(d, "{.status.approvedPlan.id}")? == first && cluster(d, "{.status.approvedPlan.changes}")?.is_empty())
    })?;
    assert_eq!(cluster(&dev, "{.status.plan.summary}")?, "no changes");

    // A config change of the service is a new plan: the Cluster waits, no script runs.
    let before = last_runs(&dev)?;
    dev.kubectl_ok(&[
        "patch",
        "pcl",
        CLUSTER,
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"taskservs":[{"service":"redis","pools":["nodes"],"config":{"maxmemory":"32mb"}}]}}"#,
    ])?;
    dev.wait_until(Duration::from_secs(60), "the re-install awaits the Cluster's approval", |d| {
        let reinstalls = cluster(d, "{.status.plan.changes[*].resource}")?.matches(&format!("TaskServ/{NS}/{TASKSERV} on ")).count();
        Ok(reinstalls == 2
            && cluster(d, "{.status.observedGeneration}")? == "2"
            && ready(d, &format!("pcl/{CLUSTER}"))? == "False/AwaitingApproval")
    })?;
    let second = cluster(&dev, "{.status.plan.id}")?;
    assert_ne!(second, first);
    let conf = |c: &str| docker_ok(&["exec", c, "cat", "/etc/redis/redis.conf"]);
    for c in &machines {
        assert!(!conf(c)?.contains("32mb"), "the config changed before approval");
    }
    assert_eq!(last_runs(&dev)?, before, "a script ran before approval");

    approve(&dev, &second)?;
    dev.wait_until(Duration::from_secs(240), "the re-install carried out", |d| {
        Ok(ready(d, &format!("pcl/{CLUSTER}"))? == "True/Ready" && cluster(d, "{.status.plan.summary}")? == "no changes")
    })?;
    for c in &machines {
        assert!(conf(c)?.contains("32mb"), "{}", conf(c)?);
    }
    assert_ne!(last_runs(&dev)?, before);

    // A member whose machine stopped: the Cluster would replace it, and under Manual that
    // waits too — the Server is not deleted until the Cluster's plan naming it is approved.
    // What that approval covers while observed state still moves (README, Plans and
    // approval): the TaskServ is paused first, so it has not looked at the stopped machine
    // when the plan is approved (as when its reconciler lags behind the Cluster's): the
    // approved plan is exactly "1 to replace", and the re-install of redis on the replacement
    // shows up only later, restating it — the same approval carries it out.
    let uid = |d: &Dev, server: &str| get(d, &format!("srv/{server}"), "{.metadata.uid}");
    let old_uid = uid(&dev, MEMBERS[1])?;
    pause(&mut dev)?;
    docker_ok(&["stop", "-t", "0", &machines[1]])?;
    dev.wait_until(Duration::from_secs(60), "the replacement awaits the Cluster's approval", |d| {
        let plan = cluster(d, "{range .status.plan.changes[*]}{.resource} {.action} {.reason};{end}")?;
        Ok(plan.contains(&format!("Server/{NS}/{} Replace the machine stopped", MEMBERS[1]))
            && ready(d, &format!("pcl/{CLUSTER}"))? == "False/AwaitingApproval")
    })
    .with_context(|| state(&dev))?;
    // The Cluster holds the delete in the pass that writes AwaitingApproval.
    assert_eq!(uid(&dev, MEMBERS[1])?, old_uid, "the member was replaced before approval");
    assert_eq!(cluster(&dev, "{.status.plan.summary}")?, "1 to replace", "the paused TaskServ has not planned a re-install yet");
    let replace = cluster(&dev, "{.status.plan.id}")?;
    approve(&dev, &replace)?;
    // The replacement Server is made and approved under the same approval; the approval stays
    // in force while redis is not on the new machine.
    dev.wait_until(Duration::from_secs(180), "the member replaced by a Ready Server with a new machine", |d| {
        let replaced = uid(d, MEMBERS[1]).is_ok_and(|u| !u.is_empty() && u != old_uid);
        Ok(replaced && ready(d, &format!("srv/{}", MEMBERS[1]))?.starts_with("True/"))
    })
    .with_context(|| state(&dev))?;
    assert_eq!(cluster(&dev, "{.status.approvedPlan.id}")?, replace);
    assert!(!cluster(&dev, "{.status.approvedPlan.changes}")?.is_empty(), "carried out while redis is not on the new machine");

    // Something new while that approval is in force — the spare's machine stops — waits for
    // its own approval, and the waiting message names it; the member's replacement is not
    // named (it is covered).
    let spare_uid = uid(&dev, SPARE)?;
    docker_ok(&["stop", "-t", "0", &server_container(NS, SPARE)?])?;
    let covered = format!("not covered by the approved plan {replace}: ");
    dev.wait_until(Duration::from_secs(60), "the spare's replacement awaits its own approval, named", |d| {
        let message = cluster(d, "{.status.conditions[?(@.type==\"Ready\")].message}")?;
        Ok(ready(d, &format!("pcl/{CLUSTER}"))? == "False/AwaitingApproval"
            && message.contains(&covered)
            && message.contains(&format!("replace Server/{NS}/{SPARE}")))
    })
    .with_context(|| state(&dev))?;
    let message = cluster(&dev, "{.status.conditions[?(@.type==\"Ready\")].message}")?;
    let new = &message[message.find(&covered).map_or(0, |i| i + covered.len())..];
    assert!(!new.contains(MEMBERS[1]), "the member's replacement is covered: {message}");
    assert_eq!(uid(&dev, SPARE)?, spare_uid, "the spare was replaced before approval");
    assert_eq!(cluster(&dev, "{.status.approvedPlan.id}")?, replace, "the approval in force is kept, not stale");
    let spare_plan = cluster(&dev, "{.status.plan.id}")?;
    approve(&dev, &spare_plan)?;
    dev.wait_until(Duration::from_secs(120), "the spare replaced", |d| Ok(uid(d, SPARE).is_ok_and(|u| !u.is_empty() && u != spare_uid)))
        .with_context(|| state(&dev))?;

    // The TaskServ looks now: redis re-installs on the new machine under the approvals given,
    // and the Cluster becomes Ready without another one.
    resume(&dev)?;
    dev.wait_until(Duration::from_secs(240), "redis on the replacement and the Cluster Ready", |d| {
        Ok(ready(d, &format!("pcl/{CLUSTER}"))? == "True/Ready" && cluster(d, "{.status.plan.summary}")? == "no changes")
    })?;
    assert_eq!(cluster(&dev, "{.metadata.annotations.provisioning\\.dev/approve}")?, spare_plan, "no further approval was given");
    let stale = dev.kubectl_ok(&[
        "get",
        "events",
        "-n",
        NS,
        "--field-selector",
        &format!("reason=PlanStale,involvedObject.kind=Cluster,involvedObject.name={CLUSTER}"),
        "-o",
        "jsonpath={.items[*].message}",
    ])?;
    for id in [&replace, &spare_plan] {
        assert!(!stale.contains(&format!("approval {id} ")), "approval {id} reported stale: {stale}");
    }
    machines[1] = server_container(NS, MEMBERS[1])?;
    assert!(has_redis(&machines[1]), "redis re-installed on the new machine");

    // A scale-down is a plan too: the Servers to delete (and redis to remove from one) wait;
    // the spare pool's Server has no service to drain, only the Cluster's approval holds it.
    let replicas =
        r#"[{"op":"replace","path":"/spec/pools/0/replicas","value":1},{"op":"replace","path":"/spec/pools/1/replicas","value":0}]"#;
    dev.kubectl_ok(&["patch", "pcl", CLUSTER, "-n", NS, "--type", "json", "-p", replicas])?;
    dev.wait_until(Duration::from_secs(60), "the scale-down awaits the Cluster's approval", |d| {
        let resources = cluster(d, "{.status.plan.changes[*].resource}")?;
        Ok(resources.contains(&format!("Server/{NS}/{}", MEMBERS[1]))
            && resources.contains(&format!("Server/{NS}/{SPARE}"))
            && resources.contains(&format!("TaskServ/{NS}/{TASKSERV} on {}", MEMBERS[1]))
            && cluster(d, "{.status.observedGeneration}")? == "3"
            && ready(d, &format!("pcl/{CLUSTER}"))? == "False/AwaitingApproval")
    })
    .with_context(|| state(&dev))?;
    // The Cluster deletes in the same pass it writes its status: nothing was deleted.
    for m in [MEMBERS[1], SPARE] {
        assert_eq!(get(&dev, &format!("srv/{m}"), "{.metadata.deletionTimestamp}")?, "", "{m} deleted before approval");
    }
    assert_eq!(containers(NS, CLUSTER)?.len(), 3, "a machine went before approval");
    assert!(has_redis(&machines[1]));
    let third = cluster(&dev, "{.status.plan.id}")?;
    approve(&dev, &third)?;
    dev.wait_until(Duration::from_secs(120), "the scale-down carried out", |d| {
        Ok(ready(d, &format!("pcl/{CLUSTER}"))? == "True/Ready"
            && cluster(d, "{.status.plan.summary}")? == "no changes"
            && containers(NS, CLUSTER)?.len() == 1)
    })?;
    assert!(has_redis(&server_container(NS, MEMBERS[0])?));

    dev.kubectl_ok(&["delete", "pcl", CLUSTER, "-n", NS, "--timeout=180s"])?;
    dev.stop();
    Ok(())
}
