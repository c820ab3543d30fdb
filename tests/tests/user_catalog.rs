//! User catalogs (`catalogs = [...]` in the controller config), end to end: a user's service
//! is listed with its source, overrides a built-in one (with `catalog_overrides`), and runs on the local provider (real
//! Docker, real nu) through `provisioning test`; a failing user check fails the run and still
//! cleans up; a broken user catalog stops start-up with one message naming the file.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use provisioning_e2e::docker::{docker_ok, require_node_image};
use provisioning_e2e::provisioning_bin;

fn provisioning(args: &[&str]) -> Result<(i32, String, String)> {
    let out = Command::new(provisioning_bin()).args(args).stdin(Stdio::null()).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn write(root: &Path, rel: &str, text: &str) -> Result<()> {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// A service whose install writes its rendered greeting to /var/lib/NAME/greeting and whose
/// check compares the file with what it should be (`check_ok` false: a check that fails).
fn write_service(root: &Path, name: &str, version: &str, check_ok: bool) -> Result<()> {
    write(
        root,
        &format!("{name}/taskserv.yaml"),
        &format!(
            "name: {name}\ndescription: a user service ({name}) writing a greeting\nversions: [\"{version}\"]\ndefaultVersion: \"{version}\"\n\
             providers: [local]\nconfigSchema:\n  type: object\n  properties:\n    who: {{type: string, description: whom to greet, default: world}}\n\
             health: {{script: check.nu, intervalSeconds: 30}}\ntimeoutSeconds: 60\n"
        ),
    )?;
    write(root, &format!("{name}/templates/greeting.txt"), "hello {{ config.who }} from {{ server.name }}\n")?;
    write(
        root,
        &format!("{name}/install.nu"),
        &format!(
            "use ../lib/ctx.nu *\nuse ../lib/files.nu *\ndef main [] {{\n  let ctx = ($in | read-context)\n  \
             write-template $ctx greeting.txt /var/lib/{name}/greeting | ignore\n  emit-result {{version: $ctx.taskserv.version}}\n}}\n"
        ),
    )?;
    let check = if check_ok {
        format!(
            "use ../lib/ctx.nu *\ndef main [] {{\n  let ctx = ($in | read-context)\n  let want = ($ctx.templates | get \"greeting.txt\")\n  \
             let have = (open --raw /var/lib/{name}/greeting | decode utf-8)\n  if $have != $want {{ fail $\"greeting is ($have)\" }}\n  \
             emit-result {{healthy: true, version: $ctx.taskserv.version}}\n}}\n"
        )
    } else {
        "use ../lib/ctx.nu *\ndef main [] {\n  let ctx = ($in | read-context)\n  fail \"this check always fails\"\n}\n".to_string()
    };
    write(root, &format!("{name}/check.nu"), &check)?;
    write(
        root,
        &format!("{name}/remove.nu"),
        &format!(
            "use ../lib/ctx.nu *\ndef main [] {{\n  let ctx = ($in | read-context)\n  rm -rf /var/lib/{name}\n  emit-result {{removed: true}}\n}}\n"
        ),
    )?;
    Ok(())
}

fn leftovers(namespace: &str) -> Result<String> {
    let label = format!("label=provisioning.dev/namespace={namespace}");
    Ok(format!("{}{}", docker_ok(&["ps", "-aq", "--filter", &label])?, docker_ok(&["network", "ls", "-q", "--filter", &label])?))
}

fn namespace_of(stdout: &str) -> String {
    stdout.split("namespace ").nth(1).and_then(|r| r.split([',', ' ', ')', '\n']).next()).unwrap_or_default().to_string()
}

#[test]
fn a_user_service_is_listed_overrides_a_built_in_and_runs_on_the_local_provider() -> Result<()> {
    require_node_image()?;
    let tmp = tempfile::tempdir()?;
    let user = tmp.path().join("my-catalog");
    write_service(&user, "hello", "1.0", true)?;
    write_service(&user, "redis", "9.9-mine", true)?;
    write_service(&user, "sour", "1.0", false)?;
    // Relative to the config file.
    let config = tmp.path().join("controller.toml");
    // Replacing a built-in service needs the operator's opt-in (issue 26, item 3).
    std::fs::write(&config, "catalogs = [\"my-catalog\"]\n")?;
    let (code, _, stderr) = provisioning(&["catalog", "list", "--config", config.to_str().unwrap_or_default()])?;
    assert!(code == 1 && stderr.contains(r#"replaces service "redis""#) && stderr.contains("catalog_overrides"), "{stderr}");
    std::fs::write(&config, "catalogs = [\"my-catalog\"]\ncatalog_overrides = [\"redis\"]\n")?;
    let config = config.to_str().unwrap_or_default();

    let (code, list, stderr) = provisioning(&["catalog", "list", "--config", config])?;
    assert_eq!(code, 0, "{stderr}");
    let line = |svc: &str| list.lines().find(|l| l.split_whitespace().next() == Some(svc)).unwrap_or_default().to_string();
    assert!(line("hello").ends_with(&user.display().to_string()), "{list}");
    assert!(line("redis").contains("9.9-mine") && line("redis").ends_with(&user.display().to_string()), "the user's redis wins:\n{list}");
    assert!(line("etcd").ends_with("built-in"), "{list}");
    let (_, builtin_list, _) = provisioning(&["catalog", "list"])?;
    assert!(!builtin_list.contains("hello") && !builtin_list.contains("9.9-mine"), "{builtin_list}");

    // The user's service on a real container: installed, checked (its template rendered), removed.
    let (code, stdout, stderr) = provisioning(&["test", "hello", "--config", config, "--timeout", "5m"])?;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("PASS  check hello 1.0 on hello-node-0"), "{stdout}");
    assert!(leftovers(&namespace_of(&stdout))?.trim().is_empty());

    // The override is what runs: the user's redis (its version), not the built-in one.
    let (code, stdout, stderr) = provisioning(&["test", "redis", "--config", config, "--timeout", "5m"])?;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("PASS  check redis 9.9-mine on redis-node-0"), "{stdout}");

    // A failing check: exit 1, the script's message in the report, and still nothing left.
    let junit = tmp.path().join("sour.xml");
    let (code, stdout, stderr) =
        provisioning(&["test", "sour", "--config", config, "--timeout", "90s", "--junit", junit.to_str().unwrap_or_default()])?;
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(stdout.contains("FAIL  Ready and healthy") && stdout.contains("this check always fails"), "{stdout}");
    assert!(stdout.contains("PASS  cleanup (nothing left behind)"), "{stdout}");
    assert!(leftovers(&namespace_of(&stdout))?.trim().is_empty());
    let xml = std::fs::read_to_string(&junit)?;
    assert!(xml.contains("<failure message=") && xml.contains("this check always fails"), "{xml}");
    Ok(())
}

#[test]
fn a_broken_user_catalog_stops_start_up_naming_the_file() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let user = tmp.path().join("broken");
    write_service(&user, "hello", "1.0", true)?;
    std::fs::remove_file(user.join("hello/check.nu"))?;
    let config = tmp.path().join("controller.toml");
    std::fs::write(&config, format!("catalogs = [{:?}]\n", user.display().to_string()))?;
    let config = config.to_str().unwrap_or_default();
    let data = tmp.path().join("data");
    let expected = format!("{}: script is missing", user.join("hello/check.nu").display());
    for args in [
        vec!["controller", "--config", config, "--kubeconfig", "/nonexistent/kubeconfig"],
        vec!["dev", "--config", config, "--data-dir", data.to_str().unwrap_or_default(), "--listen", "127.0.0.1:0"],
        vec!["catalog", "list", "--config", config],
    ] {
        let started = Instant::now();
        let (code, _, stderr) = provisioning(&args)?;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.contains(&expected), "{args:?}: {expected:?} not in {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(20), "{args:?}");
    }
    assert!(!data.join("kubeconfig").exists(), "dev served nothing");

    // A missing directory and a dependency cycle are named the same way.
    std::fs::write(tmp.path().join("missing.toml"), "catalogs = [\"/no/such/catalog\"]\n")?;
    let (code, _, stderr) = provisioning(&["catalog", "list", "--config", tmp.path().join("missing.toml").to_str().unwrap_or_default()])?;
    assert!(code == 1 && stderr.contains("/no/such/catalog: catalog directory does not exist"), "{stderr}");
    let cyclic = tmp.path().join("cyclic");
    write_service(&cyclic, "a", "1.0", true)?;
    write_service(&cyclic, "b", "1.0", true)?;
    for (svc, dep) in [("a", "b"), ("b", "a")] {
        let path = cyclic.join(format!("{svc}/taskserv.yaml"));
        let text = std::fs::read_to_string(&path)?;
        std::fs::write(&path, format!("{text}requires: [{dep}]\n"))?;
    }
    std::fs::write(tmp.path().join("cyclic.toml"), "catalogs = [\"cyclic\"]\n")?;
    let (code, _, stderr) = provisioning(&["catalog", "list", "--config", tmp.path().join("cyclic.toml").to_str().unwrap_or_default()])?;
    assert!(code == 1 && stderr.contains("a/taskserv.yaml: dependency cycle: a -> b -> a"), "{stderr}");
    Ok(())
}
