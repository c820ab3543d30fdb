//! The web console's live-stream limits over real HTTPS (reqwest, no browser), against
//! `provisioning dev`: one session may hold 6 live streams (server-sent events) at once; the
//! seventh gets 429 with a body naming the limit (logged once per burst, without the session
//! id or the token); another session is not affected; a stream whose client goes away frees
//! its place within seconds (well before the 15 s keepalive would notice). A Server page lists
//! only its own Events (the API server filters by field selector) and how long it takes with
//! many Events about other objects in the namespace is printed.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioning_e2e::Dev;
use reqwest::header::{CONTENT_TYPE, COOKIE, SET_COOKIE};
use reqwest::{Client, Response, StatusCode};

/// The console's per-session limit (cli/src/console/live.rs MAX_STREAMS_PER_SESSION).
const PER_SESSION: usize = 6;

/// A client that trusts only dev's CA and does not follow redirects (the cookie is read from them).
fn client(dev: &Dev) -> Result<Client> {
    let ca = std::fs::read(dev.data_dir.join("ca.crt")).context("reading dev's ca.crt")?;
    Ok(Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca)?])
        .redirect(reqwest::redirect::Policy::none())
        .http1_only()
        .build()?)
}

/// Percent-encodes a form value (reqwest is built here without its `form` feature).
fn urlencode(v: &str) -> String {
    v.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// The `name=value` of the session cookie a sign-in answer sets.
fn session_cookie(r: &Response) -> Result<String> {
    ensure!(r.status() == StatusCode::SEE_OTHER, "sign-in answered {} instead of a redirect", r.status());
    let set = r.headers().get(SET_COOKIE).context("no Set-Cookie on sign-in")?.to_str()?;
    let pair = set.split(';').next().unwrap_or_default().trim();
    ensure!(pair.starts_with("provisioning_console=") && pair.len() > 30, "unexpected session cookie");
    Ok(pair.to_string())
}

/// The one-time sign-in link dev prints (the console starts after the API server answers).
async fn console_login(dev: &Dev) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = dev.log();
        if let Some(link) = log.lines().find_map(|l| l.strip_prefix("Console: ")).and_then(|l| l.split_whitespace().next()) {
            return Ok(link.to_string());
        }
        ensure!(Instant::now() < deadline, "dev printed no Console line within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Refusal bursts as the console counts them: a 429 after any accepted stream starts one.
#[derive(Default)]
struct Bursts {
    count: usize,
    refusing: bool,
}

impl Bursts {
    fn saw(&mut self, r: &Response) {
        match r.status() {
            StatusCode::TOO_MANY_REQUESTS if !self.refusing => (self.count, self.refusing) = (self.count + 1, true),
            StatusCode::OK => self.refusing = false,
            _ => {}
        }
    }
}

/// Opens a live stream of the Workspaces page; an accepted one has sent its first bytes.
async fn open_stream(c: &Client, base: &str, cookie: &str) -> Result<Response> {
    let mut r = c.get(format!("{base}live/")).header(COOKIE, cookie).send().await?;
    if r.status() == StatusCode::OK {
        ensure!(r.headers().get(CONTENT_TYPE).is_some_and(|v| v == "text/event-stream"), "not an event stream");
        let first = tokio::time::timeout(Duration::from_secs(20), r.chunk()).await.context("no first event within 20 s")??;
        ensure!(first.is_some_and(|b| !b.is_empty()), "the stream ended at once");
    }
    Ok(r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_are_capped_per_session_and_freed_when_closed() -> Result<()> {
    let dev = tokio::task::spawn_blocking(|| Dev::start(&[])).await??;
    let result = check(&dev).await;
    result.map_err(|e| e.context(format!("--- dev log tail ---\n{}", dev.log_tail(30))))
}

// Over 80 lines on purpose: one scenario, step by step, each step saying what it checks.
async fn check(dev: &Dev) -> Result<()> {
    let login = console_login(dev).await?;
    let base = std::fs::read_to_string(dev.data_dir.join("console-url"))?.trim().to_string();
    ensure!(base.starts_with("https://127.0.0.1:"), "console not on loopback: {base}");
    let c = client(dev)?;
    let cookie = session_cookie(&c.get(&login).send().await?)?;
    let mut bursts = Bursts::default();

    // The session's limit of streams, all accepted and streaming.
    let mut streams = Vec::new();
    for i in 0..PER_SESSION {
        let r = open_stream(&c, &base, &cookie).await?;
        bursts.saw(&r);
        ensure!(r.status() == StatusCode::OK, "stream {} of {PER_SESSION} refused: {}", i + 1, r.status());
        streams.push(r);
    }

    // One more is refused, twice (a burst), with a plain-text body naming the limit.
    for _ in 0..2 {
        let r = open_stream(&c, &base, &cookie).await?;
        bursts.saw(&r);
        ensure!(r.status() == StatusCode::TOO_MANY_REQUESTS, "stream {} answered {}", PER_SESSION + 1, r.status());
        ensure!(r.headers().get(CONTENT_TYPE).is_some_and(|v| v.to_str().unwrap_or_default().starts_with("text/plain")), "not plain text");
        let body = r.text().await?;
        ensure!(body.contains(&format!("at most {PER_SESSION} per session")), "the 429 body does not name the limit: {body:?}");
    }

    // Another visitor (the admin token pasted into the sign-in form) still gets a stream.
    let kubeconfig: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dev.kubeconfig())?)?;
    let token = kubeconfig["users"][0]["user"]["token"].as_str().context("dev's kubeconfig has no token")?.to_string();
    let form = format!("token={}", urlencode(&token));
    let other =
        session_cookie(&c.post(format!("{base}login")).header(CONTENT_TYPE, "application/x-www-form-urlencoded").body(form).send().await?)?;
    ensure!(other != cookie, "the second sign-in reused the first session");
    let r = open_stream(&c, &base, &other).await?;
    bursts.saw(&r);
    ensure!(r.status() == StatusCode::OK, "a second session was refused ({}): the limit is not per session", r.status());
    drop(r);

    // A client going away frees its place promptly: a new stream is accepted again.
    drop(streams.pop());
    let closed = Instant::now();
    let reopened = loop {
        let r = open_stream(&c, &base, &cookie).await?;
        bursts.saw(&r);
        if r.status() == StatusCode::OK {
            break r;
        }
        ensure!(r.status() == StatusCode::TOO_MANY_REQUESTS, "unexpected {}", r.status());
        if closed.elapsed() > Duration::from_secs(10) {
            bail!("the closed stream's place was not freed within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let freed = closed.elapsed();
    println!("a closed stream's place was free again after {} ms", freed.as_millis());
    ensure!(freed < Duration::from_secs(5), "freeing took {freed:?}: the disconnect was noticed late");
    streams.push(reopened);
    let r = open_stream(&c, &base, &cookie).await?;
    bursts.saw(&r);
    ensure!(r.status() == StatusCode::TOO_MANY_REQUESTS, "over the limit again but answered {}", r.status());

    // Refusals are logged once per burst (two here, three when the first retry above came
    // before the close was noticed), never with the session id or the token.
    ensure!(bursts.count >= 2, "{} refusal bursts", bursts.count);
    let refusals = |log: &str| log.lines().filter(|l| l.contains("refusing live streams")).count();
    let deadline = Instant::now() + Duration::from_secs(5);
    while refusals(&dev.log()) < bursts.count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = dev.log();
    ensure!(refusals(&log) == bursts.count, "{} refusal log lines for {} bursts", refusals(&log), bursts.count);
    let session_id = cookie.trim_start_matches("provisioning_console=");
    ensure!(!log.contains(session_id) && !log.contains(&token), "the log holds a session id or the token");
    Ok(())
}

/// Events (events.k8s.io/v1) about `server` in namespace demo, as YAML documents of JSON.
fn events_about(server: &str, count: usize) -> String {
    let items: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": format!("probe-{server}-{i}"), "namespace": "demo"},
                "eventTime": "2026-11-25T10:00:00.000000Z", "reportingController": "console-test", "reportingInstance": "console-test",
                "action": "Probe", "reason": "ConsoleProbe", "type": "Normal", "note": format!("note-for-{server}-{i}"),
                "regarding": {"apiVersion": "provisioning.dev/v1alpha1", "kind": "Server", "name": server, "namespace": "demo"}})
        })
        .collect();
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("\n---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_page_lists_only_its_own_events() -> Result<()> {
    let dev = tokio::task::spawn_blocking(|| Dev::start(&["examples/simulated"])).await??;
    let result = own_events(&dev).await;
    result.map_err(|e| e.context(format!("--- dev log tail ---\n{}", dev.log_tail(30))))
}

async fn own_events(dev: &Dev) -> Result<()> {
    const OTHERS: usize = 1000;
    let file = dev.data_dir.join("probe-events.yaml");
    std::fs::write(&file, events_about("web-1", 2))?;
    dev.kubectl_ok(&["create", "-f", &file.display().to_string()])?;
    std::fs::write(&file, events_about("web-2", OTHERS))?;
    dev.kubectl_ok(&["create", "-f", &file.display().to_string()])?;

    let login = console_login(dev).await?;
    let base = std::fs::read_to_string(dev.data_dir.join("console-url"))?.trim().to_string();
    let c = client(dev)?;
    let cookie = session_cookie(&c.get(&login).send().await?)?;
    let mut times = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let r = c.get(format!("{base}namespaces/demo/servers/web-1")).header(COOKIE, &cookie).send().await?;
        ensure!(r.status() == StatusCode::OK, "the web-1 page answered {}", r.status());
        let html = r.text().await?;
        times.push(started.elapsed());
        ensure!(!html.contains("Events not shown"), "the events were not listed (field selector refused?)");
        ensure!(html.contains("note-for-web-1-0") && html.contains("note-for-web-1-1"), "web-1's own events are missing");
        ensure!(!html.contains("note-for-web-2-"), "web-2's events are on web-1's page");
    }
    times.sort();
    println!(
        "Server page with {OTHERS} events about another Server in the namespace: median {} ms, max {} ms over {} loads",
        times[times.len() / 2].as_millis(),
        times[times.len() - 1].as_millis(),
        times.len()
    );
    Ok(())
}

/// A client like [`client`] whose connections come from `from` (127.0.0.x: another peer).
fn client_from(dev: &Dev, from: &str) -> Result<Client> {
    let ca = std::fs::read(dev.data_dir.join("ca.crt")).context("reading dev's ca.crt")?;
    Ok(Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca)?])
        .redirect(reqwest::redirect::Policy::none())
        .http1_only()
        .local_address(from.parse::<std::net::IpAddr>()?)
        .build()?)
}

/// `POST /login` with `token`.
async fn sign_in(c: &Client, base: &str, token: &str) -> Result<Response> {
    let form = format!("token={}", urlencode(token));
    Ok(c.post(format!("{base}login")).header(CONTENT_TYPE, "application/x-www-form-urlencoded").body(form).send().await?)
}

/// Whether the session behind `cookie` is still signed in (its home page is not a redirect
/// to the sign-in page).
async fn signed_in(c: &Client, base: &str, cookie: &str) -> Result<bool> {
    let r = c.get(base).header(COOKIE, cookie).send().await?;
    let to_login = r.status() == StatusCode::SEE_OTHER && r.headers().get("location").is_some_and(|l| l == "/login");
    Ok(!to_login)
}

/// The console's sign-in limits (cli/src/console/limits.rs SIGN_IN_BURST, session.rs
/// MAX_SESSIONS_PER_USER).
const SIGN_IN_BURST: usize = 10;
const SESSIONS_PER_USER: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_is_rate_limited_per_peer_and_sessions_are_capped_per_user() -> Result<()> {
    let dev = tokio::task::spawn_blocking(|| Dev::start(&[])).await??;
    let result = sign_in_limits(&dev).await;
    result.map_err(|e| e.context(format!("--- dev log tail ---\n{}", dev.log_tail(30))))
}

// Over 80 lines on purpose: one scenario, step by step, each step saying what it checks.
async fn sign_in_limits(dev: &Dev) -> Result<()> {
    console_login(dev).await?;
    let base = std::fs::read_to_string(dev.data_dir.join("console-url"))?.trim().to_string();
    let kubeconfig: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dev.kubeconfig())?)?;
    let admin = kubeconfig["users"][0]["user"]["token"].as_str().context("dev's kubeconfig has no token")?.to_string();
    let guessed = "guessed-token-7f3a9c";

    // One peer guessing tokens: each attempt is checked with the API server (401) until its
    // burst is used up; then 429 with Retry-After, even for the right token.
    let mallory = client_from(dev, "127.0.0.1")?;
    for i in 0..SIGN_IN_BURST {
        let r = sign_in(&mallory, &base, &format!("{guessed}-{i}")).await?;
        ensure!(r.status() == StatusCode::UNAUTHORIZED, "guess {} answered {}", i + 1, r.status());
    }
    let started = Instant::now();
    let r = sign_in(&mallory, &base, &format!("{guessed}-x")).await?;
    ensure!(r.status() == StatusCode::TOO_MANY_REQUESTS, "a guess past the burst answered {}", r.status());
    let retry: u64 = r.headers().get("retry-after").context("no Retry-After")?.to_str()?.parse()?;
    ensure!((1..=60).contains(&retry), "Retry-After {retry}");
    ensure!(r.text().await?.contains("Too many sign-in attempts"), "the 429 page does not say why");
    let r = sign_in(&mallory, &base, &admin).await?;
    ensure!(r.status() == StatusCode::TOO_MANY_REQUESTS, "the right token got past the limit: {}", r.status());
    ensure!(started.elapsed() < Duration::from_secs(5), "the refusals were slow");

    // Another peer is not affected: its wrong token is checked (401), its right one signs in.
    let alice = client_from(dev, "127.0.0.2")?;
    let r = sign_in(&alice, &base, guessed).await?;
    ensure!(r.status() == StatusCode::UNAUTHORIZED, "another peer's attempt answered {}", r.status());
    let first_admin = session_cookie(&sign_in(&alice, &base, &admin).await?)?;

    // Sessions per user: another user (a ServiceAccount) signs in once; the admin signs in
    // again and again (from several peers, each within its burst). The admin's oldest session
    // ends, the other user's stays.
    dev.kubectl_ok(&["create", "serviceaccount", "viewer", "-n", "default"])?;
    let viewer_token = dev.kubectl_ok(&["create", "token", "viewer", "-n", "default"])?.trim().to_string();
    let bob = client_from(dev, "127.0.0.3")?;
    let viewer = session_cookie(&sign_in(&bob, &base, &viewer_token).await?)?;
    let mut newest = first_admin.clone();
    for i in 0..SESSIONS_PER_USER {
        let c = client_from(dev, &format!("127.0.0.{}", 4 + i / (SIGN_IN_BURST - 1)))?;
        newest = session_cookie(&sign_in(&c, &base, &admin).await?)?;
    }
    ensure!(!signed_in(&alice, &base, &first_admin).await?, "the admin's oldest session survived {SESSIONS_PER_USER} newer ones");
    ensure!(signed_in(&alice, &base, &newest).await?, "the admin's newest session was signed out");
    ensure!(signed_in(&bob, &base, &viewer).await?, "one user's sign-ins signed another user out");

    let log = dev.log();
    ensure!(!log.contains(guessed) && !log.contains(&admin) && !log.contains(&viewer_token), "the log holds a token");
    Ok(())
}
