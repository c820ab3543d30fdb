//! `provisioning plan` is as strict as admission and the controller (issue 25, item 4): each
//! manifest below is refused — a misspelt field (as `kubectl apply` refuses it, also in a
//! namespace that comes with the same manifests), an unknown kind or apiVersion, a CEL rule, an
//! unknown plan or service, a TaskServ config that breaks the service's schema — with its reason
//! and exit 1 ("1 refused"). `provisioning dev --apply` refuses the misspelt field too and
//! stops, naming the object.

use std::path::Path;
use std::process::{Command, Output};

use provisioning_e2e::Dev;

const NS: &str = "plan-strict";

const WORKSPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: plan-strict}\n---\napiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: plan-strict}\nspec:\n  defaults: {provider: sim}\n  providers: [{name: sim, type: simulated}, {name: aws, type: aws, region: eu-north-1, zoneSubnets: {eu-north-1a: subnet-0a1a1a1a1a1a1a1a1, eu-north-1b: subnet-0b1b1b1b1b1b1b1b1}}]\n";

fn plan(dev: &Dev, dir: &Path, name: &str, manifest: &str) -> anyhow::Result<Output> {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, manifest)?;
    Ok(Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .arg("plan")
        .arg("--kubeconfig")
        .arg(dev.kubeconfig())
        .arg("-f")
        .arg(&path)
        .output()?)
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn plan_refuses_what_admission_or_the_controller_would_refuse() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("workspace.yaml");
    std::fs::write(&ws, WORKSPACE)?;
    let dev = Dev::start(&[ws.to_str().unwrap_or_default()])?;
    let server = |spec: &str| {
        format!("apiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {{name: web, namespace: {NS}}}\nspec: {spec}\n")
    };
    let taskserv = |spec: &str| {
        format!("apiVersion: provisioning.dev/v1alpha1\nkind: TaskServ\nmetadata: {{name: cache, namespace: {NS}}}\nspec: {spec}\n")
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("misspelt field", server("{plna: small}"), "unknown field \"spec.plna\""),
        (
            "misspelt field, namespace in the same manifests",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: fresh-ns}\n---\napiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {name: web, namespace: fresh-ns}\nspec: {plna: small}\n"
                .to_string(),
            "unknown field \"spec.plna\"",
        ),
        (
            "unknown kind",
            format!("apiVersion: provisioning.dev/v1alpha1\nkind: Servr\nmetadata: {{name: web, namespace: {NS}}}\nspec: {{}}\n"),
            "no matches for kind \"Servr\"",
        ),
        (
            "unknown apiVersion",
            format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w, namespace: {NS}}}\n"),
            "no matches for kind \"Widget\"",
        ),
        (
            "unknown version",
            format!("apiVersion: provisioning.dev/v9\nkind: Server\nmetadata: {{name: web, namespace: {NS}}}\nspec: {{}}\n"),
            "no matches for kind \"Server\" in version \"provisioning.dev/v9\"",
        ),
        ("schema", server("{plan: 5}"), "spec.plan"),
        ("CEL rule", taskserv("{service: redis, dependsOn: [redis], servers: {names: [web]}}"), "cannot depend on its own service"),
        ("unknown plan", server("{plan: gigantic}"), "gigantic"),
        ("unknown provider", server("{provider: nowhere}"), "nowhere"),
        ("unknown service", taskserv("{service: nosuch, servers: {names: [web]}}"), "UnknownService"),
        (
            "config against the service's schema",
            taskserv("{service: redis, config: {port: 99999}, servers: {names: [web]}}"),
            "InvalidConfig",
        ),
        // Networks per zone (issue 28): the same checks as the controller's, before any call.
        ("zone outside zoneSubnets", server("{provider: aws, zone: eu-west-1a}"), "spec.providers[].zoneSubnets"),
        // Disks (issue 28 item 2): admission's schema and rules, then the provider's types.
        ("disk size", server("{disks: [{name: data, size: 0Gi}]}"), "spec.disks[0].size"),
        ("disk size too big", server("{disks: [{name: data, size: 17Ti}]}"), "spec.disks[0].size"),
        ("disk names twice", server("{disks: [{name: data, size: 1Gi}, {name: data, size: 2Gi}]}"), "spec.disks[1]: Duplicate value"),
        ("disk mountPath", server("{disks: [{name: data, size: 1Gi, mountPath: /}]}"), "mountPath must be an absolute path"),
        ("disk type", server("{provider: aws, zone: eu-north-1a, disks: [{name: data, size: 10Gi, type: maxiops}]}"), "InvalidDisks"),
        ("raw disk on a mount-only provider", server("{provider: aws, zone: eu-north-1a, disks: [{name: data, size: 10Gi, mountPath: /data}]}"), "spec.disks[0].mountPath"),
        ("fallback zone outside zoneSubnets", server("{provider: aws, zone: eu-north-1a, fallbackZones: [eu-north-1c]}"), "InvalidZone"),
        ("fallback zones without a zone", server("{fallbackZones: [eu-north-1b]}"), "InvalidFallbackZones"),
        ("publicIp on a simulated account", server("{publicIp: false}"), "PublicIpUnsupported"),
        (
            "zoneSubnets of another shape",
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: zones-bad}\nspec:\n  providers: [{name: aws, type: aws, zoneSubnets: {eu-north-1a: sg-0a1a1a1a}}]\n"
                .to_string(),
            "zoneSubnets",
        ),
        (
            "zoneSubnets on an upcloud account",
            "apiVersion: provisioning.dev/v1alpha1\nkind: Workspace\nmetadata: {name: zones-upcloud}\nspec:\n  providers: [{name: up, type: upcloud, zoneSubnets: {fi-hel1: subnet-0a1a1a1a}}]\n"
                .to_string(),
            "only aws accounts map zones to subnets",
        ),
        (
            "a pool with zone and zones",
            format!("apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: spread, namespace: {NS}}}\nspec:\n  pools: [{{name: w, replicas: 3, zone: eu-north-1a, zones: [eu-north-1a, eu-north-1b]}}]\n  taskservs: []\n"),
            "set zone or zones",
        ),
    ];
    for (what, manifest, reason) in &cases {
        let out = plan(&dev, dir.path(), &what.replace(' ', "-"), manifest)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        assert!(stdout.contains("1 refused") && stdout.contains(reason), "{what}: wants {reason:?}: {}", text(&out));
        assert!(!stdout.contains("No changes"), "{what}: {}", text(&out));
    }
    // The same objects, written right: accepted (exit 2: they would be created).
    let good = format!("{}---\n{}", server("{plan: small}"), taskserv("{service: redis, config: {port: 6380}, servers: {names: [web]}}"));
    let zoned =
        server("{provider: aws, zone: eu-north-1a, fallbackZones: [eu-north-1b], publicIp: false, disks: [{name: data, size: 100Gi, type: gp3}, {name: keep, size: 20Gi, deletionPolicy: Retain}]}")
            .replace("name: web", "name: zoned");
    let good = format!("{good}---\n{zoned}");
    let out = plan(&dev, dir.path(), "good", &good)?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("refused"), "{}", text(&out));
    // The plan shows where the machine goes: its zone's subnet, no public address, the fallback.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let part = "in eu-north-1a (subnet subnet-0a1a1a1a1a1a1a1a1, no public IP, disks data 100Gi gp3 raw, keep 20Gi raw (Retain), then eu-north-1b when out of capacity)";
    assert!(stdout.contains(part), "{part}: {}", text(&out));
    // The same at v1beta1 (the same schema, docs/upgrade.md): planned alike, not passed
    // through unplanned; and refused alike.
    let beta = |m: &str| m.replace("provisioning.dev/v1alpha1", "provisioning.dev/v1beta1");
    let out = plan(&dev, dir.path(), "good-beta", &beta(&good))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!stdout.contains("refused") && !stdout.contains("applied as it is") && !stdout.contains("not planned"), "{}", text(&out));
    let out = plan(&dev, dir.path(), "misspelt-beta", &beta(&server("{plna: small}")))?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("unknown field \"spec.plna\""), "{}", text(&out));
    Ok(())
}

#[test]
fn dev_apply_refuses_a_misspelt_field_naming_the_object() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let manifest = dir.path().join("bad.yaml");
    std::fs::write(
        &manifest,
        format!(
            "{WORKSPACE}---\napiVersion: provisioning.dev/v1alpha1\nkind: Server\nmetadata: {{name: web, namespace: {NS}}}\nspec: {{plna: small}}\n"
        ),
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_provisioning"))
        .args(["dev", "--listen", "127.0.0.1:0", "--exit-when-ready", "--timeout", "60", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--apply")
        .arg(&manifest)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr.contains("Server web refused") && stderr.contains("unknown field \"spec.plna\""), "{}", text(&out));
    Ok(())
}
