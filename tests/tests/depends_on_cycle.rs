//! A user-made `dependsOn` cycle end to end: two TaskServs that depend on each other are
//! reported `Stalled` (reason DependencyCycle, the cycle named, a Warning event) instead of
//! waiting forever, and a `kubectl patch` that breaks the cycle lets them go on: the one
//! left depending waits for the other (Ready=False WaitingForDependencies, not stalled).

use std::time::Duration;

use anyhow::Result;
use provisioning_e2e::Dev;

/// `(status, reason, message)` of condition `type_` of TaskServ `name`.
fn condition(dev: &Dev, name: &str, type_: &str) -> Result<(String, String, String)> {
    let q = format!("{{.status.conditions[?(@.type==\"{type_}\")]");
    let out = dev.kubectl_ok(&["get", "ts", name, "-n", "cycle", "-o", &format!("jsonpath={q}.status}}|{q}.reason}}|{q}.message}}")])?;
    let mut parts = out.splitn(3, '|').map(str::to_string);
    Ok((parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default()))
}

#[test]
fn a_taskserv_cycle_is_stalled_naming_it_and_resolves_when_broken() -> Result<()> {
    let mut dev = Dev::start(&[])?;
    let file = provisioning_e2e::workspace_root().join("tests/tests/depends_on_cycle.yaml");
    dev.kubectl_ok(&["apply", "-f", &file.display().to_string()])?;
    for (name, cycle) in [("front", "front → back → front"), ("back", "back → front → back")] {
        dev.wait_until(Duration::from_secs(60), &format!("{name} Stalled"), |d| {
            Ok(condition(d, name, "Stalled").is_ok_and(|c| c.0 == "True"))
        })?;
        let (_, reason, message) = condition(&dev, name, "Stalled")?;
        assert_eq!(reason, "DependencyCycle", "{name}: {message}");
        assert_eq!(message, format!("dependsOn cycle: TaskServ {cycle}"));
        assert_eq!(condition(&dev, name, "Ready")?.0, "False");
    }
    dev.kubectl_ok(&["wait", "--for=condition=Stalled", "ts", "--all", "-n", "cycle", "--timeout=30s"])?;
    dev.wait_until(Duration::from_secs(30), "a DependencyCycle Warning event", |d| {
        let warnings = d.kubectl_ok(&[
            "get",
            "events",
            "-n",
            "cycle",
            "-o",
            "jsonpath={range .items[?(@.type==\"Warning\")]}{.regarding.name}{.involvedObject.name}/{.reason}{\"\\n\"}{end}",
        ])?;
        Ok(warnings.contains("front/DependencyCycle") && warnings.contains("back/DependencyCycle"))
    })?;

    // Break the cycle on front: front goes on at once (its spec changed), back notices on
    // its next look and waits for front instead of being stalled.
    dev.kubectl_ok(&["patch", "ts", "front", "-n", "cycle", "--type=json", "-p", r#"[{"op":"remove","path":"/spec/dependsOn"}]"#])?;
    for name in ["front", "back"] {
        dev.wait_until(Duration::from_secs(60), &format!("{name} no longer Stalled"), |d| {
            Ok(condition(d, name, "Stalled").is_ok_and(|c| c.0 == "False"))
        })?;
    }
    let (status, reason, message) = condition(&dev, "back", "Ready")?;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "WaitingForDependencies"), "{message}");
    assert!(message.contains("waiting for TaskServ front to be Ready"), "{message}");
    let (_, reason, message) = condition(&dev, "front", "Ready")?;
    assert_ne!(reason, "DependencyCycle", "{message}");
    assert!(message.contains("waiting for Server nowhere"), "front waits for its Server now: {message}");
    dev.kubectl_ok(&["delete", "ts", "--all", "-n", "cycle", "--timeout=60s"])?;
    dev.stop();
    Ok(())
}
