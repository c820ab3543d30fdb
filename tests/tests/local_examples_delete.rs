//! The local examples as one folder (issue 25): `kubectl apply -f examples/local/` brings up
//! its three Clusters (etcd, HAProxy + web, PostgreSQL + Redis) on Docker, each in the
//! Namespace its file ships; `kubectl delete -f examples/local/` deletes in file order —
//! each file's Namespace first, then its Cluster and TaskServ, the order Argo CD prune and
//! Flux garbage collection use — finishes, and leaves no container, network or volume. One
//! of the three (PostgreSQL + Redis) is first taken down with `kubectl delete namespace`
//! while the others keep running.
//!
//! The folder is copied with its namespaces renamed (`etcd-demo` → `lx-etcd`, …), so that this
//! test never shares Docker containers with local_etcd, local_haproxy_web and
//! local_postgres_redis, which apply the same files; nothing else in the manifests changes.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use provisioning_e2e::Dev;
use provisioning_e2e::docker::{containers, leftovers};

const NS: &str = "lx-etcd";
const CLUSTER: &str = "etcd";

/// (namespace in examples/local, its name in this test, the Cluster in it, its Servers).
const EXAMPLES: [(&str, &str, &str, usize); 3] =
    [("etcd-demo", NS, CLUSTER, 3), ("web-demo", "lx-web", "web", 3), ("data-demo", "lx-data", "data", 2)];

/// examples/local copied into `dir` with the namespaces renamed; checks that each file ships
/// its Namespace as its first document and puts everything else in it.
fn renamed_copy(dir: &std::path::Path) -> Result<String> {
    let src = provisioning_e2e::workspace_root().join("examples/local");
    let mut files: Vec<_> = std::fs::read_dir(&src)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    ensure!(files.len() == EXAMPLES.len(), "examples/local holds {files:?}");
    for file in files {
        let mut text = std::fs::read_to_string(&file)?;
        let docs: Vec<&str> = text.split("\n---\n").filter(|d| d.contains("kind:")).collect();
        ensure!(docs.first().is_some_and(|d| d.contains("\nkind: Namespace\n")), "{} does not start with its Namespace", file.display());
        let (example_ns, test_ns, _, _) = EXAMPLES
            .iter()
            .find(|(ns, ..)| docs[0].contains(&format!("name: {ns}\n")))
            .ok_or_else(|| anyhow::anyhow!("{}: an unexpected Namespace", file.display()))?;
        for doc in &docs[1..] {
            ensure!(doc.contains(&format!("namespace: {example_ns}\n")), "{}: an object outside {example_ns}", file.display());
        }
        text = text.replace(example_ns, test_ns);
        std::fs::write(dir.join(file.file_name().unwrap_or_default()), text)?;
    }
    Ok(dir.display().to_string())
}

fn all_leftovers() -> Result<Vec<String>> {
    let mut left = Vec::new();
    for (_, ns, cluster, _) in EXAMPLES {
        left.extend(leftovers(ns, cluster)?.into_iter().map(|l| format!("{ns}/{cluster}: {l}")));
    }
    Ok(left)
}

#[test]
fn namespace_and_folder_delete_of_the_local_examples_finish_and_leave_no_container() -> Result<()> {
    provisioning_e2e::docker::require_node_image()?;
    assert!(all_leftovers()?.is_empty(), "leftovers of an earlier run: {:?}", all_leftovers()?);
    let tmp = tempfile::tempdir()?;
    let folder = renamed_copy(tmp.path())?;
    let mut dev = Dev::start(&[])?;

    let applied = dev.kubectl_ok(&["apply", "-f", &folder])?;
    for (_, ns, cluster, _) in EXAMPLES {
        assert!(applied.contains(&format!("namespace/{ns} created")), "{applied}");
        assert!(applied.contains(&format!("cluster.provisioning.dev/{cluster} created")), "{applied}");
    }
    for (_, ns, cluster, _) in EXAMPLES {
        dev.kubectl_ok(&["wait", "-n", ns, "--for=condition=Ready", &format!("cluster/{cluster}"), "--timeout=600s"])?;
    }
    dev.kubectl_ok(&["wait", "-n", "lx-web", "--for=condition=Ready", "ts/web-app", "--timeout=300s"])?;
    for (_, ns, cluster, servers) in EXAMPLES {
        assert_eq!(containers(ns, cluster)?.len(), servers, "one container per Server in {ns}/{cluster}");
    }

    // One example by its namespace (`kubectl delete namespace`): its Cluster, Servers and
    // containers go, the others stay up.
    let started = Instant::now();
    dev.kubectl_ok(&["delete", "namespace", "lx-data", "--timeout=300s"])?;
    dev.wait_until(Duration::from_secs(60), "no container, network or volume of lx-data left", |_| {
        Ok(leftovers("lx-data", "data")?.is_empty())
    })?;
    assert_eq!(containers(NS, CLUSTER)?.len(), 3, "the other examples' machines stay");
    eprintln!("kubectl delete namespace lx-data: everything gone in {:.1}s", started.elapsed().as_secs_f64());

    // The rest as the folder: kubectl deletes in file order, each file's Namespace before
    // what is in it, and waits for every object to be gone (--wait is the default).
    let started = Instant::now();
    let deleted = dev.kubectl_ok(&["delete", "-f", &folder, "--ignore-not-found", "--timeout=300s"])?;
    let first = deleted.lines().next().unwrap_or_default();
    assert!(first.starts_with("namespace \"lx-etcd\" deleted"), "{deleted}");
    dev.wait_until(Duration::from_secs(60), "no container, network or volume left", |_| Ok(all_leftovers()?.is_empty()))?;
    for (what, args) in [
        ("namespaces", vec!["get", "namespace", "lx-etcd", "lx-web", "lx-data", "--ignore-not-found", "-o", "name"]),
        ("objects", vec!["get", "clusters,servers,taskservs", "-A", "-o", "name"]),
    ] {
        let left = dev.kubectl_ok(&args)?;
        assert!(left.trim().is_empty(), "{what} left after the delete: {left}");
    }
    assert!(started.elapsed() < Duration::from_secs(300), "delete took {:?}", started.elapsed());
    eprintln!("kubectl delete -f of the folder: everything gone in {:.1}s", started.elapsed().as_secs_f64());
    dev.stop();
    Ok(())
}
