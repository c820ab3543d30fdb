//! The web console in a real browser: chromium driven over WebDriver (chromedriver) against
//! `provisioning dev`. Signs in with the one-time link dev prints; sees the demo Workspace's
//! objects and phases; watches a Cluster scale up without reloading the page; pauses and
//! resumes a Server with its buttons (the annotation is read back with kubectl); approves a
//! plan; a view-only ServiceAccount token sees no action buttons and its forged POST gets 403;
//! an editor (no `approve` verb) sees no Approve button and its forged approve gets 403;
//! a bad token, and a revoked one, get the sign-in page. Screenshots of the main pages go to
//! target/console-screenshots/.
#![allow(clippy::too_many_lines, reason = "end-to-end scenarios read as one story, step by step")]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use fantoccini::{Client, ClientBuilder, Locator};
use provisioning_e2e::{Dev, provisioning_ok, workspace_root};
use serde_json::{Value, json};

/// A browser binary from the environment or the Debian package (scripts/setup.sh installs it).
fn browser_tool(env_var: &str, path: &str, package: &str) -> PathBuf {
    let p = std::env::var_os(env_var).map(PathBuf::from).filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from(path));
    assert!(p.exists(), "{path} not found ({env_var} unset): run scripts/setup.sh (installs Debian's {package})");
    p
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Result<Driver> {
        let bin = browser_tool("PROVISIONING_CHROMEDRIVER", "/usr/bin/chromedriver", "chromium-driver");
        let port = free_port()?;
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromedriver")?;
        let driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(Instant::now() < deadline, "chromedriver did not listen on {port} within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(driver)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver, profile: &std::path::Path) -> Result<Client> {
    let chromium = browser_tool("PROVISIONING_CHROMIUM", "/usr/bin/chromium", "chromium");
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            // Root in a container needs --no-sandbox; the console's certificate is from dev's own CA.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--ignore-certificate-errors",
                     "--window-size=1280,1000", "--no-first-run", format!("--user-data-dir={}", profile.display())],
        }
    });
    let Value::Object(caps) = caps else { bail!("capabilities are an object") };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector).capabilities(caps).connect(&driver.url).await.context("opening a chromium session")
}

/// Polls the page's HTML until `check` holds (no reload: only reads the live DOM).
async fn wait_page(c: &Client, what: &str, secs: u64, check: impl Fn(&str) -> bool) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let html = c.source().await?;
        if check(&html) {
            return Ok(html);
        }
        if Instant::now() > deadline {
            bail!("timed out after {secs}s waiting for {what}; the page at {} is:\n{html}", c.current_url().await?);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

fn screenshots_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target")).join("console-screenshots")
}

async fn screenshot(c: &Client, name: &str) -> Result<()> {
    let dir = screenshots_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{name}.png")), c.screenshot().await?)?;
    Ok(())
}

fn annotation(dev: &Dev, args: &[&str], key: &str) -> Result<Option<String>> {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    let obj: Value = serde_json::from_str(&dev.kubectl_ok(&full)?)?;
    Ok(obj["metadata"]["annotations"][key].as_str().map(str::to_string))
}

/// A form POST made from inside the page (same origin, the session's cookie and CSRF token),
/// as a visitor forging a request to an action the page did not offer; returns the status.
async fn forged_post(c: &Client, fields: Value) -> Result<u64> {
    let script = r#"
        const done = arguments[arguments.length - 1];
        const fields = arguments[0];
        const csrf = document.querySelector('input[name=csrf]');
        if (csrf && !('csrf' in fields)) fields.csrf = csrf.value;
        fetch('/actions', {method: 'POST', body: new URLSearchParams(fields), redirect: 'manual'})
            .then(r => done(r.status), e => done(String(e)));
    "#;
    let status = c.execute_async(script, vec![fields]).await?;
    status.as_u64().with_context(|| format!("forged POST: {status}"))
}

/// Clicks the element `css`; live updates replace the page's content several times a second,
/// so an element found a moment before can be gone: find it again and retry, up to 10 s.
async fn click(c: &Client, css: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let attempt = async { c.find(Locator::Css(css)).await?.click().await };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(anyhow::Error::from(e).context(format!("clicking {css}"))),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn sign_in_with_token(c: &Client, base: &str, token: &str) -> Result<()> {
    c.goto(&format!("{base}login")).await?;
    c.find(Locator::Css("#token")).await?.send_keys(token).await?;
    click(c, "#sign-in").await?;
    Ok(())
}

// Over 80 lines on purpose: one visitor's session after another, in the order a user meets
// them; each step is a few calls and says what it checks.
async fn drive(dev: &Dev, driver: &Driver, profile: &std::path::Path) -> Result<()> {
    let log = dev.log();
    let login = log
        .lines()
        .find_map(|l| l.strip_prefix("Console: "))
        .and_then(|l| l.split_whitespace().next())
        .context("dev printed no Console line")?;
    let base = std::fs::read_to_string(dev.data_dir.join("console-url"))?.trim().to_string();
    ensure!(login.starts_with(&format!("{base}login?code=")) && base.starts_with("https://127.0.0.1:"), "{login} / {base}");
    let c = browser(driver, profile).await?;

    // Without a session every page leads to sign-in; a bad token is refused there.
    c.goto(&format!("{base}namespaces/demo/servers/web-1")).await?;
    ensure!(c.current_url().await?.path() == "/login", "unauthenticated visit not sent to /login");
    sign_in_with_token(&c, &base, "not-a-real-token").await?;
    wait_page(&c, "a bad token refused", 30, |h| h.contains("did not accept this token") && h.contains("id=\"token\"")).await?;
    screenshot(&c, "login").await?;

    // The one-time link signs in as dev's admin, once.
    c.goto(login).await?;
    ensure!(c.current_url().await?.path() == "/", "the one-time link did not land on /");
    wait_page(&c, "both Workspaces Ready", 60, |h| {
        h.contains("id=\"ws-demo\"") && h.contains("id=\"ws-tracing\"") && h.matches("✔</span> Ready").count() >= 2
    })
    .await?;
    screenshot(&c, "workspaces").await?;
    c.goto(&format!("{base}workspaces/demo")).await?;
    wait_page(&c, "the demo Servers Running in the tree (live)", 60, |h| {
        ["Server/web-1", "Server/web-2", "Server/db-1"].iter().all(|s| h.contains(&format!("data-object=\"{s}\"")))
            && h.matches("✔</span> Running").count() >= 3
    })
    .await?;
    screenshot(&c, "workspace").await?;

    // The Cluster page updates itself when the Cluster scales (no reload: a marker survives).
    let cluster = format!("{base}namespaces/tracing/clusters/etcd");
    c.goto(&cluster).await?;
    wait_page(&c, "3/3 ready with the live stream open", 60, |h| h.contains("3 of 3 ready") && h.contains("● Live")).await?;
    c.execute("window.__sameDocument = 'yes';", vec![]).await?;
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
    let started = Instant::now();
    wait_page(&c, "the fourth member and 4 of 4 ready, pushed live", 90, |h| {
        h.contains("data-object=\"Server/etcd-members-3\"") && h.contains("4 of 4 ready")
    })
    .await?;
    let same = c.execute("return [window.__sameDocument, document.getElementById('live').dataset.updates];", vec![]).await?;
    ensure!(same[0] == "yes" && same[1].as_str().and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n >= 1), "page was reloaded: {same}");
    println!("scale-up shown live after {:.1}s", started.elapsed().as_secs_f64());
    screenshot(&c, "cluster-scaled").await?;

    // A TaskServ page shows each server's last script run and its (redacted) output tail.
    c.goto(&format!("{base}namespaces/tracing/taskservs/cache")).await?;
    wait_page(&c, "the last script run of TaskServ cache on solo", 45, |h| h.contains("cache on solo") && h.contains("class=\"output\""))
        .await?;
    screenshot(&c, "taskserv").await?;

    // Pause and resume with the buttons; kubectl sees the annotation.
    let server = format!("{base}namespaces/demo/servers/web-1");
    c.goto(&server).await?;
    click(&c, "#action-pause").await?;
    wait_page(&c, "the Resume button after pausing", 45, |h| h.contains("id=\"action-resume\"") && h.contains("Paused:")).await?;
    ensure!(annotation(dev, &["server", "web-1", "-n", "demo"], "provisioning.dev/paused")?.as_deref() == Some("true"), "not paused");
    screenshot(&c, "server-paused").await?;
    click(&c, "#action-resume").await?;
    wait_page(&c, "the Pause button after resuming", 45, |h| h.contains("id=\"action-pause\"")).await?;
    ensure!(annotation(dev, &["server", "web-1", "-n", "demo"], "provisioning.dev/paused")?.is_none(), "still paused");

    // Approve: a plan in status, as the controller writes it for `approval: Manual` (written by
    // hand here, on a paused Server so the controller leaves its status alone). A CRD set from
    // before plans existed gets the field first, so the status patch is not pruned.
    let crd: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "crd", "servers.provisioning.dev", "-o", "json"])?)?;
    if crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/plan").is_none() {
        let add = r#"[{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/plan","value":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}]"#;
        dev.kubectl_ok(&["patch", "crd", "servers.provisioning.dev", "--type=json", "-p", add])?;
    }
    dev.kubectl_ok(&["annotate", "server", "web-2", "-n", "demo", "provisioning.dev/paused=true"])?;
    let plan = r#"{"status":{"plan":{"id":"plan-7f3a","summary":"1 to update","changes":[{"resource":"Server/demo/web-2","field":"spec.plan","action":"Update","from":"small","to":"medium"}]}}}"#;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        dev.kubectl_ok(&["patch", "server", "web-2", "-n", "demo", "--subresource=status", "--type=merge", "-p", plan])?;
        let got: Value = serde_json::from_str(&dev.kubectl_ok(&["get", "server", "web-2", "-n", "demo", "-o", "json"])?)?;
        if got["status"]["plan"]["id"] == "plan-7f3a" {
            break;
        }
        ensure!(Instant::now() < deadline, "status.plan is not kept: {got}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.goto(&format!("{base}namespaces/demo/servers/web-2")).await?;
    wait_page(&c, "the plan and its Approve button", 45, |h| h.contains("plan-7f3a") && h.contains("id=\"action-approve\"")).await?;
    screenshot(&c, "server-plan").await?;
    click(&c, "#action-approve").await?;
    wait_page(&c, "the plan shown approved", 45, |h| h.contains("Approved; waiting for the controller")).await?;
    ensure!(
        annotation(dev, &["server", "web-2", "-n", "demo"], "provisioning.dev/approve")?.as_deref() == Some("plan-7f3a"),
        "not approved"
    );

    // The ready-over-time chart lives in the session: a new visit of the Cluster still has it.
    c.goto(&cluster).await?;
    wait_page(&c, "the chart kept across visits", 45, |h| h.contains("4 of 4 ready") && h.contains("● Live")).await?;
    screenshot(&c, "cluster").await?;

    // The link works once only.
    c.goto(login).await?;
    let html = wait_page(&c, "a used link refused", 30, |h| h.contains("used already")).await?;

    // The sign-in page names dev's token file, and `provisioning login-link` prints a new link
    // (from another process) that signs in as dev's admin, once.
    let dir = dev.data_dir.display().to_string();
    ensure!(html.contains(&format!("{dir}/token")) && html.contains("provisioning login-link --data-dir"), "no way back in named");
    let again = provisioning_ok(&["login-link", "--data-dir", &dir])?.trim().to_string();
    ensure!(again.starts_with(&format!("{base}login?code=")) && again != login, "{again}");
    c.delete_all_cookies().await?;
    c.goto(&again).await?;
    ensure!(c.current_url().await?.path() == "/", "the new link did not land on /");
    wait_page(&c, "signed in again as admin", 45, |h| h.contains("id=\"ws-demo\"")).await?;
    c.goto(&again).await?;
    wait_page(&c, "the new link works once", 30, |h| h.contains("used already")).await?;

    // An editor (the `edit` role: patch, not the `approve` verb) sees a waiting plan and the
    // Pause/Resume buttons, but no Approve button, and a forged approve (with the page's CSRF
    // token) is refused: an approval set by `edit` alone would not count (issue 26, item 5).
    dev.kubectl_ok(&["apply", "-f", &workspace_root().join("deploy/rbac/aggregated-roles.yaml").display().to_string()])?;
    dev.kubectl_ok(&["annotate", "server", "web-2", "-n", "demo", "provisioning.dev/approve-"])?;
    dev.kubectl_ok(&["create", "serviceaccount", "editor", "-n", "demo"])?;
    dev.kubectl_ok(&["create", "rolebinding", "console-editor", "-n", "demo", "--clusterrole=edit", "--serviceaccount=demo:editor"])?;
    let token = dev.kubectl_ok(&["create", "token", "editor", "-n", "demo"])?.trim().to_string();
    c.delete_all_cookies().await?;
    sign_in_with_token(&c, &base, &token).await?;
    wait_page(&c, "the editor signed in", 45, |h| h.contains("system:serviceaccount:demo:editor")).await?;
    c.goto(&format!("{base}namespaces/demo/servers/web-2")).await?;
    let html = wait_page(&c, "web-2's plan for the editor", 45, |h| h.contains("plan-7f3a") && h.contains("id=\"action-resume\"")).await?;
    ensure!(!html.contains("id=\"action-approve\""), "an editor without the approve verb is offered Approve");
    let fields = json!({"kind": "servers", "namespace": "demo", "name": "web-2", "action": "approve", "plan": "plan-7f3a"});
    ensure!(forged_post(&c, fields).await? == 403, "an editor's forged approve was not refused");
    ensure!(annotation(dev, &["server", "web-2", "-n", "demo"], "provisioning.dev/approve")?.is_none(), "the forged approve changed web-2");
    screenshot(&c, "server-editor").await?;

    // A view-only ServiceAccount: no action buttons, and a forged action is refused.
    dev.kubectl_ok(&["apply", "-f", &workspace_root().join("deploy/rbac/aggregated-roles.yaml").display().to_string()])?;
    dev.kubectl_ok(&["create", "serviceaccount", "viewer", "-n", "demo"])?;
    dev.kubectl_ok(&["create", "clusterrolebinding", "console-viewer", "--clusterrole=view", "--serviceaccount=demo:viewer"])?;
    dev.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "console-viewer-provisioning",
        "--clusterrole=provisioning-view",
        "--serviceaccount=demo:viewer",
    ])?;
    let token = dev.kubectl_ok(&["create", "token", "viewer", "-n", "demo"])?.trim().to_string();
    c.delete_all_cookies().await?;
    sign_in_with_token(&c, &base, &token).await?;
    wait_page(&c, "the viewer signed in", 45, |h| h.contains("system:serviceaccount:demo:viewer") && h.contains("id=\"ws-demo\"")).await?;
    c.goto(&server).await?;
    let html = wait_page(&c, "web-1 for the viewer", 45, |h| h.contains("data-object=\"Server/web-1\"")).await?;
    ensure!(!html.contains("class=\"actions\"") && !html.contains("id=\"action-"), "a viewer sees action buttons");
    screenshot(&c, "server-viewer").await?;
    let fields = json!({"kind": "servers", "namespace": "demo", "name": "web-1", "action": "pause"});
    ensure!(forged_post(&c, fields.clone()).await? == 403, "a viewer's forged pause was not refused");
    let mut no_csrf = fields.clone();
    no_csrf["csrf"] = json!("forged");
    ensure!(forged_post(&c, no_csrf).await? == 403, "a POST without the session's CSRF token was not refused");
    ensure!(
        annotation(dev, &["server", "web-1", "-n", "demo"], "provisioning.dev/paused")?.is_none(),
        "the forged pause changed the Server"
    );

    // A token that stops working (its ServiceAccount deleted) leads back to sign-in.
    dev.kubectl_ok(&["delete", "serviceaccount", "viewer", "-n", "demo"])?;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        c.goto(&server).await?;
        if c.current_url().await?.path() == "/login" {
            break;
        }
        ensure!(Instant::now() < deadline, "a revoked token still reads pages");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    c.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_real_browser() -> Result<()> {
    let started = Instant::now();
    let dev = tokio::task::spawn_blocking(|| Dev::start(&["examples/simulated", "tests/tests/trace.yaml"])).await??;
    let driver = Driver::start()?;
    let profile = tempfile::tempdir()?;
    let result = drive(&dev, &driver, profile.path()).await;
    println!("console browser test took {:.1}s", started.elapsed().as_secs_f64());
    result.map_err(|e| e.context(format!("--- dev log tail ---\n{}", dev.log_tail(30))))
}
