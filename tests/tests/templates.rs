//! `provisioning template list|render` as users run it: every template is listed and renders
//! into manifests the real API server accepts (`kubectl apply --dry-run=server`, schema
//! validation by the CRDs); `--set` of an unknown parameter or a bad value is an error naming
//! it, exit 1, nothing printed. observability and web need the catalog's prometheus,
//! node-exporter, alertmanager, nginx and docker-registry.

use std::process::{Command, Stdio};

use anyhow::Result;
use provisioning_e2e::{Dev, kubectl_command, provisioning_bin};

const TEMPLATES: [&str; 5] = ["etcd_cluster", "kubernetes_3node", "observability", "postgres_redis", "web"];

fn provisioning(args: &[&str]) -> Result<(i32, String, String)> {
    let out = Command::new(provisioning_bin()).args(args).stdin(Stdio::null()).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn every_template_is_listed_and_renders_manifests_the_api_server_accepts() -> Result<()> {
    let (code, list, stderr) = provisioning(&["template", "list"])?;
    assert_eq!(code, 0, "{stderr}");
    for t in TEMPLATES {
        assert!(list.lines().any(|l| l.starts_with(t)), "{t} listed:\n{list}");
    }
    assert!(list.contains("--set members=3") && list.contains("integer 1..7"), "{list}");

    let dev = Dev::start(&[])?;
    let tmp = tempfile::tempdir()?;
    let mut failures = Vec::new();
    for t in TEMPLATES {
        let file = tmp.path().join(format!("{t}.yaml"));
        let (code, _, stderr) = provisioning(&[
            "template",
            "render",
            t,
            "-n",
            &format!("tpl-{}", t.replace('_', "-")),
            "-o",
            file.to_str().unwrap_or_default(),
        ])?;
        if code != 0 {
            failures.push(format!("{t}: render exited {code}: {stderr}"));
            continue;
        }
        let text = std::fs::read_to_string(&file)?;
        assert!(text.starts_with(&format!("# Rendered by `provisioning template render {t} -n tpl-")), "{text}");
        // Server-side dry run: the API server validates every object against its schema. A
        // dry run creates no Namespace, so the rendered one is created for real first.
        let ns = format!("tpl-{}", t.replace('_', "-"));
        dev.kubectl_ok(&["create", "namespace", &ns])?;
        let out = kubectl_command(&dev.kubeconfig()).args(["apply", "--dry-run=server", "-f"]).arg(&file).output()?;
        if !out.status.success() {
            failures.push(format!("{t}: kubectl apply --dry-run=server: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn set_values_are_applied_and_bad_ones_are_named() -> Result<()> {
    let (code, yaml, stderr) =
        provisioning(&["template", "render", "etcd_cluster", "--set", "members=5", "--set", "name=kv", "-n", "team-a"])?;
    assert_eq!(code, 0, "{stderr}");
    let docs: Vec<serde_json::Value> =
        serde_yaml_ng::Deserializer::from_str(&yaml).map(serde::Deserialize::deserialize).collect::<Result<_, _>>()?;
    let cluster = docs.iter().find(|d| d["kind"] == "Cluster").expect("a Cluster");
    assert_eq!(cluster["metadata"]["name"], "kv");
    assert_eq!(cluster["metadata"]["namespace"], "team-a");
    assert_eq!(cluster["spec"]["pools"][0]["replicas"], 5);

    let cases: [(&[&str], &str); 5] = [
        (&["--set", "size=3"], "template etcd_cluster has no parameter \"size\" (parameters: name, members, plan, version)"),
        (&["--set", "members=9"], "parameter members=\"9\" is invalid: must be at most 7"),
        (&["--set", "members=three"], "parameter members=\"three\" is invalid: must be a whole number"),
        (&["--set", "plan=huge"], "must be one of small, medium, large, xlarge"),
        (&["--set", "name=Not_A_Name"], "parameter name=\"Not_A_Name\" is invalid"),
    ];
    for (args, expected) in cases {
        let mut full = vec!["template", "render", "etcd_cluster"];
        full.extend_from_slice(args);
        let (code, stdout, stderr) = provisioning(&full)?;
        assert_eq!(code, 1, "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {expected:?} not in {stderr}");
        assert!(stdout.is_empty(), "{args:?}: nothing rendered: {stdout}");
    }
    let (code, _, stderr) = provisioning(&["template", "render", "nosuch"])?;
    assert_eq!(code, 1);
    assert!(stderr.contains("no template \"nosuch\" (available: etcd_cluster, kubernetes_3node"), "{stderr}");
    Ok(())
}
