//! `provisioning test SERVICE|TEMPLATE` end to end with real Docker: a service and a
//! template reach Ready and pass their checks, the JUnit XML says so, nothing is left behind
//! (no container, network or volume with the namespace's label); refused targets and
//! template parameters exit 1 before anything is created; Ctrl-C cleans up too.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use provisioning_e2e::docker::{docker_ok, require_node_image};
use provisioning_e2e::provisioning_bin;

/// Runs `provisioning test ARGS` to the end; returns (exit code, stdout, stderr).
pub fn run_test(args: &[&str]) -> Result<(i32, String, String)> {
    let out: Output = Command::new(provisioning_bin()).arg("test").args(args).stdin(Stdio::null()).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The namespace `provisioning test` announced on its first line.
pub fn namespace_of(stdout: &str) -> Option<String> {
    let rest = stdout.split("namespace ").nth(1)?;
    Some(rest.split(|c: char| c == ',' || c.is_whitespace() || c == ')').next()?.to_string())
}

/// Containers, networks and volumes labelled with `namespace`.
pub fn leftovers(namespace: &str) -> Result<Vec<String>> {
    let label = format!("label=provisioning.dev/namespace={namespace}");
    let mut out = Vec::new();
    for (what, args) in [("container", vec!["ps", "-aq"]), ("network", vec!["network", "ls", "-q"]), ("volume", vec!["volume", "ls", "-q"])]
    {
        let mut args = args;
        args.extend(["--filter", label.as_str()]);
        out.extend(docker_ok(&args)?.lines().filter(|l| !l.trim().is_empty()).map(|id| format!("{what} {id}")));
    }
    Ok(out)
}

fn assert_passed(code: i32, stdout: &str, stderr: &str) {
    assert_eq!(code, 0, "exit code\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(stdout.contains("PASSED:") && !stdout.contains("FAIL "), "{stdout}");
}

#[test]
fn a_service_and_a_template_pass_report_junit_and_leave_nothing_behind() -> Result<()> {
    require_node_image()?;
    let tmp = tempfile::tempdir()?;

    // A service alone: a one-server Cluster with redis.
    let junit = tmp.path().join("redis.xml");
    let (code, stdout, stderr) = run_test(&["redis", "--junit", junit.to_str().unwrap_or_default(), "--timeout", "10m"])?;
    assert_passed(code, &stdout, &stderr);
    let ns = namespace_of(&stdout).unwrap_or_default();
    assert!(ns.starts_with("ptest-"), "{stdout}");
    assert!(stdout.contains("PASS  check redis 7.0.15 on redis-node-0"), "{stdout}");
    assert!(stdout.contains("PASS  cleanup (nothing left behind)"), "{stdout}");
    assert_eq!(leftovers(&ns)?, Vec::<String>::new(), "nothing of {ns} is left in Docker");
    let xml = std::fs::read_to_string(&junit)?;
    assert!(
        xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"provisioning test\" tests=\"3\" failures=\"0\""),
        "{xml}"
    );
    assert!(xml.contains("<testsuite name=\"provisioning test redis\" tests=\"3\" failures=\"0\""), "{xml}");
    assert!(xml.contains(&format!("<property name=\"namespace\" value=\"{ns}\"/>")), "{xml}");
    for case in ["Ready and healthy", "check redis 7.0.15 on redis-node-0", "cleanup (nothing left behind)"] {
        assert!(xml.contains(&format!("<testcase name=\"{case}\" classname=\"provisioning.test.redis\"")), "{case} in {xml}");
    }
    assert!(!xml.contains("<failure"), "{xml}");

    // A template: the 3-member etcd cluster, every member checked.
    let (code, stdout, stderr) = run_test(&["etcd_cluster", "--timeout", "10m"])?;
    assert_passed(code, &stdout, &stderr);
    let ns = namespace_of(&stdout).unwrap_or_default();
    for member in 0..3 {
        assert!(stdout.contains(&format!("PASS  check etcd 3.4.23 on etcd-members-{member}")), "{stdout}");
    }
    assert_eq!(leftovers(&ns)?, Vec::<String>::new(), "nothing of {ns} is left in Docker");
    Ok(())
}

#[test]
fn bad_targets_and_parameters_exit_1_naming_them_before_anything_is_created() -> Result<()> {
    let cases: [(&[&str], &[&str]); 4] = [
        (&["nosuch"], &["\"nosuch\" is neither a catalog service", "etcd_cluster"]),
        (&["etcd_cluster", "--set", "members=0"], &["parameter members=\"0\"", "at least 1"]),
        (&["etcd_cluster", "--set", "size=3"], &["no parameter \"size\"", "members"]),
        (&["kubernetes_3node"], &["local provider only"]),
    ];
    for (args, expected) in cases {
        let started = Instant::now();
        let (code, stdout, stderr) = run_test(args)?;
        assert_eq!(code, 1, "{args:?}: {stdout}{stderr}");
        for e in expected {
            assert!(stderr.contains(e), "{args:?}: {e:?} not in {stderr}");
        }
        // Refused before the control plane started or a namespace was chosen.
        assert!(!stdout.contains("namespace ptest-"), "{args:?}: {stdout}");
        assert!(started.elapsed() < Duration::from_secs(20), "{args:?} took {:?}", started.elapsed());
    }
    Ok(())
}

/// `provisioning test` applies with the caller's credentials: a template that renders a
/// ClusterRoleBinding (or anything outside the test namespace) is refused, naming the object,
/// before a control plane starts or a namespace is chosen.
#[test]
fn a_template_reaching_outside_the_test_namespace_is_refused_before_anything_is_created() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let t = dir.path().join("grabber");
    std::fs::create_dir_all(&t)?;
    std::fs::write(t.join("template.yaml"), "name: grabber\ndescription: redis and a grab\ndefaultNamespace: grabber\nparameters: []\n")?;
    std::fs::write(
        t.join("manifests.yaml.j2"),
        "apiVersion: provisioning.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: r\n  namespace: {{ namespace }}\nspec:\n  provider: local\n  pools:\n  - name: node\n    replicas: 1\n    plan: small\n  taskservs:\n  - service: redis\n    pools: [node]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: grab\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: Group, name: system:authenticated, apiGroup: rbac.authorization.k8s.io}]\n",
    )?;
    let out = Command::new(provisioning_bin())
        .args(["test", "grabber"])
        .env("PROVISIONING_TEMPLATES", dir.path())
        .stdin(Stdio::null())
        .output()?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("ClusterRoleBinding grab (rbac.authorization.k8s.io/v1): provisioning test applies only"), "{stderr}");
    assert!(!stdout.contains("namespace ptest-"), "{stdout}");
    Ok(())
}

#[test]
fn an_interrupted_test_cleans_up() -> Result<()> {
    require_node_image()?;
    let tmp = tempfile::tempdir()?;
    let log = tmp.path().join("out.log");
    let mut child = Command::new(provisioning_bin())
        .args(["test", "postgres_redis"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(tmp.path().join("err.log"))?)
        .spawn()?;
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(180);
    // Interrupt once a machine runs: something real to clean up.
    let ns = loop {
        if let Some(ns) = namespace_of(&read(&log))
            && !leftovers(&ns)?.iter().filter(|l| l.starts_with("container")).collect::<Vec<_>>().is_empty()
        {
            break ns;
        }
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            let _ = child.kill();
            bail!("no container appeared\n{}\n{}", read(&log), read(&tmp.path().join("err.log")));
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    Command::new("kill").arg("-INT").arg(child.id().to_string()).status()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("did not finish after the interrupt\n{}", read(&log));
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let stdout = read(&log);
    assert_eq!(status.code(), Some(1), "{stdout}\n{}", read(&tmp.path().join("err.log")));
    // Interrupted while installing (or, on a fast machine, during the checks after Ready).
    assert!(stdout.contains("FAIL  ") && stdout.contains("interrupted"), "{stdout}");
    assert!(stdout.contains("PASS  cleanup (nothing left behind)"), "{stdout}");
    assert_eq!(leftovers(&ns)?, Vec::<String>::new(), "nothing of {ns} is left in Docker");
    Ok(())
}

/// The templates built on the catalog's newer services (prometheus, node-exporter,
/// alertmanager, nginx, docker-registry): every service's check passes on the local provider.
/// Fails with "unknown service" where the catalog lacks them.
#[test]
fn the_observability_and_web_templates_pass() -> Result<()> {
    require_node_image()?;
    for (args, checks) in [
        (vec!["observability", "--set", "nodes=1"], vec!["check prometheus", "check alertmanager", "check node-exporter"]),
        (vec!["web"], vec!["check docker-registry", "check haproxy"]),
        (vec!["web", "--set", "frontend=nginx"], vec!["check docker-registry", "check nginx"]),
    ] {
        let mut full = args.clone();
        full.extend(["--timeout", "10m"]);
        let (code, stdout, stderr) = run_test(&full)?;
        assert_passed(code, &stdout, &stderr);
        for check in checks {
            assert!(stdout.contains(&format!("PASS  {check}")), "{args:?}: {check}\n{stdout}");
        }
        let ns = namespace_of(&stdout).unwrap_or_default();
        assert_eq!(leftovers(&ns)?, Vec::<String>::new(), "nothing of {ns} is left in Docker");
    }
    Ok(())
}

/// `--kubeconfig`: the environment is made through an existing API server and the controller
/// serving it (here a `provisioning dev`), and removed from there too.
#[test]
fn an_existing_api_server_is_used_with_kubeconfig() -> Result<()> {
    require_node_image()?;
    let dev = provisioning_e2e::Dev::start(&[])?;
    let kubeconfig = dev.kubeconfig();
    // Watch the dev server's Clusters while the test runs: the environment must appear there.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (seen, done, kubeconfig) = (seen.clone(), done.clone(), kubeconfig.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let out = provisioning_e2e::kubectl_command(&kubeconfig).args(["get", "pcl", "-A", "-o", "name"]).output();
                if let Ok(out) = out
                    && let Ok(mut s) = seen.lock()
                {
                    s.push_str(&String::from_utf8_lossy(&out.stdout));
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let result = run_test(&["redis", "--kubeconfig", kubeconfig.to_str().unwrap_or_default(), "--timeout", "10m"]);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    let (code, stdout, stderr) = result?;
    assert_passed(code, &stdout, &stderr);
    let ns = namespace_of(&stdout).unwrap_or_default();
    assert!(stdout.contains("PASS  check redis 7.0.15 on redis-node-0"), "{stdout}");
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(seen.contains("cluster.provisioning.dev/redis"), "the Cluster was made through the dev server: {seen}");
    // ... and removed from there.
    let clusters = dev.kubectl_ok(&["get", "pcl", "-n", &ns, "-o", "name"])?;
    assert!(clusters.trim().is_empty(), "{clusters}");
    assert_eq!(leftovers(&ns)?, Vec::<String>::new(), "nothing of {ns} is left in Docker");
    Ok(())
}
