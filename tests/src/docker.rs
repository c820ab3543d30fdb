//! Docker helpers for end-to-end tests of the local provider: find a Server's container by
//! its labels, run `docker` commands, and list what a Cluster left behind.

use std::process::{Command, Output};

use anyhow::{Result, bail};

/// Runs `docker` with `args`.
pub fn docker(args: &[&str]) -> Result<Output> {
    Ok(Command::new("docker").args(args).output()?)
}

/// Runs `docker` and fails unless it succeeds; returns stdout.
pub fn docker_ok(args: &[&str]) -> Result<String> {
    let out = docker(args)?;
    if !out.status.success() {
        bail!("docker {args:?} failed ({}): {}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// Ids of the containers (running or not) labelled with the namespace and cluster.
pub fn containers(namespace: &str, cluster: &str) -> Result<Vec<String>> {
    let ns = format!("label=provisioning.dev/namespace={namespace}");
    let cl = format!("label=provisioning.dev/cluster={cluster}");
    Ok(lines(&docker_ok(&["ps", "-aq", "--filter", &ns, "--filter", &cl])?))
}

/// The running container of Server `name` in `namespace` (fails when there is none or several).
pub fn server_container(namespace: &str, name: &str) -> Result<String> {
    let ns = format!("label=provisioning.dev/namespace={namespace}");
    let srv = format!("label=provisioning.dev/server={name}");
    let ids = lines(&docker_ok(&["ps", "-q", "--filter", &ns, "--filter", &srv])?);
    match ids.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no running container for Server {namespace}/{name}"),
        many => bail!("{} running containers for Server {namespace}/{name}: {many:?}", many.len()),
    }
}

/// Containers, networks and volumes still carrying the namespace and cluster labels.
pub fn leftovers(namespace: &str, cluster: &str) -> Result<Vec<String>> {
    let ns = format!("label=provisioning.dev/namespace={namespace}");
    let cl = format!("label=provisioning.dev/cluster={cluster}");
    let mut out = Vec::new();
    for (what, args) in [("container", vec!["ps", "-aq"]), ("network", vec!["network", "ls", "-q"]), ("volume", vec!["volume", "ls", "-q"])]
    {
        let mut args = args;
        args.extend(["--filter", ns.as_str(), "--filter", cl.as_str()]);
        for id in lines(&docker_ok(&args)?) {
            out.push(format!("{what} {id}"));
        }
    }
    Ok(out)
}

/// Fails with a hint unless the local provider's node image exists (`provisioning image build`).
pub fn require_node_image() -> Result<()> {
    let out = docker(&["image", "inspect", "provisioning-node:latest"])?;
    if !out.status.success() {
        bail!(
            "the node image provisioning-node:latest is missing: run `target/debug/provisioning image build` (scripts/test.sh does, in its images phase)"
        );
    }
    Ok(())
}

/// Ids of every container (running or not) labelled with the namespace.
pub fn namespace_containers(namespace: &str) -> Result<Vec<String>> {
    let ns = format!("label=provisioning.dev/namespace={namespace}");
    Ok(lines(&docker_ok(&["ps", "-aq", "--filter", &ns])?))
}

/// Removes every container of the namespace and then its network (docker refuses to remove
/// a network in use). Best effort: for a test's Drop guard, also when the test fails.
pub fn remove_namespace(namespace: &str) {
    for id in namespace_containers(namespace).unwrap_or_default() {
        let _ = docker(&["rm", "-f", "-v", &id]);
    }
    let _ = docker(&["network", "rm", &format!("prov_{namespace}")]);
}

/// Removes the containers, networks and volumes a Cluster left ([`leftovers`]). Best effort:
/// for a test's Drop guard, also when the test fails.
pub fn remove_leftovers(namespace: &str, cluster: &str) {
    for item in leftovers(namespace, cluster).unwrap_or_default() {
        match item.split_once(' ') {
            Some(("container", id)) => drop(docker(&["rm", "-f", "-v", id])),
            Some(("network", id)) => drop(docker(&["network", "rm", id])),
            Some(("volume", id)) => drop(docker(&["volume", "rm", id])),
            _ => {}
        }
    }
}
