//! `provisioning trace` against `provisioning dev` (real HTTPS, real kubeconfig): the tree of a
//! Workspace, a Cluster, a Server and a TaskServ as a new user sees it; `-o json`; clear errors
//! for what does not exist; `-w` redraws when the Cluster scales; and the k9s plugin's command,
//! substituted as k9s would, runs.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioning_e2e::{Dev, provisioning_bin, workspace_root};
use serde_json::Value;

fn trace(dev: &Dev, args: &[&str]) -> Result<std::process::Output> {
    Ok(Command::new(provisioning_bin())
        .arg("trace")
        .args(args)
        .arg("--kubeconfig")
        .arg(dev.kubeconfig())
        .env_remove("KUBECONFIG")
        .output()?)
}

fn trace_ok(dev: &Dev, args: &[&str]) -> Result<String> {
    let out = trace(dev, args)?;
    ensure!(out.status.success(), "provisioning trace {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Each line's NAME (with its tree branches) and READY, cut at the header's READY column.
fn names_and_ready(table: &str) -> Vec<(String, String)> {
    let at = table.lines().next().and_then(|h| h.find("READY")).unwrap_or(0);
    table
        .lines()
        .skip(1)
        .map(|l| {
            let name: String = l.chars().take(at).collect();
            let rest: String = l.chars().skip(at).collect();
            (name.trim_end().to_string(), rest.split_whitespace().next().unwrap_or_default().to_string())
        })
        .collect()
}

#[test]
fn trace_shows_the_tree_of_every_kind_and_redraws_live() -> Result<()> {
    let dev = Dev::start(&["tests/tests/trace.yaml"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "cluster/etcd", "ts/cache", "-n", "tracing", "--timeout=120s"])?;
    dev.kubectl_ok(&["wait", "--for=condition=Ready", "workspace/tracing", "--timeout=60s"])?;

    let table = trace_ok(&dev, &["workspace/tracing"])?;
    let header = table.lines().next().unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    ensure!(header == ["NAME", "READY", "STATUS", "AGE", "MESSAGE"], "{table}");
    let rows = names_and_ready(&table);
    let expected = [
        "Workspace/tracing",
        "├─Cluster/etcd",
        "│ └─Pool/members",
        "│   ├─Server/etcd-members-0",
        "│   │ └─TaskServ/etcd-etcd",
        "│   ├─Server/etcd-members-1",
        "│   │ └─TaskServ/etcd-etcd",
        "│   └─Server/etcd-members-2",
        "│     └─TaskServ/etcd-etcd",
        "└─Server/solo",
        "  └─TaskServ/cache",
    ];
    let got: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    ensure!(got == expected, "tree:\n{table}");
    ensure!(rows.iter().all(|(_, ready)| ready == "True"), "not all Ready:\n{table}");
    ensure!(table.contains("3/3 ready"), "{table}");

    // Every root kind, by short name as kubectl accepts them.
    let cluster = trace_ok(&dev, &["pcl/etcd", "-n", "tracing", "-o", "wide"])?;
    ensure!(cluster.lines().nth(1).is_some_and(|l| l.starts_with("Cluster/etcd")) && cluster.lines().count() == 9, "{cluster}");
    ensure!(cluster.lines().next().is_some_and(|l| l.trim_end().ends_with("STEPS")), "{cluster}");
    let server = trace_ok(&dev, &["srv/solo", "-n", "tracing"])?;
    ensure!(
        names_and_ready(&server).iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>() == ["Server/solo", "└─TaskServ/cache"],
        "{server}"
    );
    let ts = trace_ok(&dev, &["ts/cache", "-n", "tracing"])?;
    ensure!(ts.contains("└─Server/solo") && ts.contains("(service: Installed)"), "{ts}");

    let json: Value = serde_json::from_str(&trace_ok(&dev, &["workspace/tracing", "-o", "json"])?)?;
    ensure!(json["kind"] == "Workspace" && json["children"][0]["kind"] == "Cluster", "{json:#}");
    let members = json["children"][0]["children"][0]["children"].as_array().map(Vec::len);
    ensure!(members == Some(3), "{json:#}");

    // What does not exist, or cannot be parsed, is a clear error and exit code 1.
    for (args, says) in [
        (vec!["server/nope", "-n", "tracing"], "Server \"nope\" not found"),
        (vec!["workspace/nope"], "Workspace \"nope\" not found"),
        (vec!["pod/x"], "unknown kind \"pod\""),
        (vec!["cluster/etcd", "-n", "tracing", "-o", "yaml"], "unknown output format \"yaml\""),
    ] {
        let out = trace(&dev, &args)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.code() == Some(1) && stderr.contains(says), "{args:?}: {:?} {stderr}", out.status);
    }

    // -w: a scale-up shows up without restarting the command.
    let out_path = dev.data_dir.join("trace-watch.txt");
    let mut child = Command::new(provisioning_bin())
        .args(["trace", "cluster/etcd", "-n", "tracing", "-w", "--kubeconfig"])
        .arg(dev.kubeconfig())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(Stdio::piped())
        .spawn()?;
    let watched = (|| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&out_path)?.contains("3/3 ready") {
            ensure!(Instant::now() < deadline, "trace -w drew nothing");
            std::thread::sleep(Duration::from_millis(100));
        }
        dev.kubectl_ok(&[
            "patch",
            "cluster",
            "etcd",
            "-n",
            "tracing",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/pools/0/replicas","value":4}]"#,
        ])?;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let text = std::fs::read_to_string(&out_path)?;
            if text.contains("Server/etcd-members-3") && text.contains("4/4 ready") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("trace -w never showed the fourth member:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })();
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = watched {
        let mut stderr = String::new();
        child.stderr.take().map(|mut s| s.read_to_string(&mut stderr));
        return Err(e.context(stderr));
    }

    // The k9s plugin's command, as k9s runs it (variables substituted, --watch dropped).
    let plugins: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(workspace_root().join("deploy/k9s/plugins.yaml"))?)?;
    let kubeconfig: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dev.kubeconfig())?)?;
    let context = kubeconfig["current-context"].as_str().context("kubeconfig has no current-context")?;
    for (plugin, resource, name) in [("provisioning-trace", "clusters", "etcd"), ("provisioning-trace-workspace", "workspaces", "tracing")]
    {
        let p = &plugins["plugins"][plugin];
        ensure!(p["command"] == "provisioning", "{plugin}: {p:?}");
        let args: Vec<String> = p["args"]
            .as_array()
            .context("args")?
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| *a != "--watch")
            .map(|a| {
                a.replace("$RESOURCE_NAME", resource).replace("$NAMESPACE", "tracing").replace("$NAME", name).replace("$CONTEXT", context)
            })
            .collect();
        let out = Command::new(provisioning_bin()).args(&args).env("KUBECONFIG", dev.kubeconfig()).output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && stdout.contains("Server/etcd-members-3"),
            "{plugin} {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
