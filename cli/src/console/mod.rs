//! The web console: server-rendered pages of Workspaces, Clusters (their live tree, a timeline
//! of their steps and Servers ready over time), Servers and TaskServs, with live updates by
//! server-sent events and the actions approve, pause/resume, reconcile now and delete.
//!
//! Every visitor signs in with a Kubernetes bearer token and every API request the console
//! makes for them uses that token (as Headlamp and the Kubernetes Dashboard do), so RBAC
//! decides what each person sees and may do; actions are offered only where a
//! SelfSubjectAccessReview allows them. The token stays on the server ([`session`]).
//!
//! - [`http`]: HTTPS listener, routing, sign-in, actions;
//! - [`pages`]: what each page reads (with the visitor's client) and hands to [`render`];
//! - [`render`], [`charts`]: pure HTML/SVG rendering (unit-tested, benchmarked), both escaping
//!   through [`html`];
//! - [`live`]: watches with the visitor's token, re-rendering at most every 300 ms;
//! - [`api`], [`session`], [`tls`]: API calls, sessions and one-time codes, certificates;
//! - [`login_codes`]: one-time links issued by `provisioning login-link` for a dev console;
//! - [`limits`]: connection caps, read timeouts and the sign-in rate limit of an exposed console.

pub mod api;
pub mod charts;
pub mod html;
pub mod http;
pub mod limits;
pub mod live;
pub mod login_codes;
pub mod pages;
pub mod render;
pub mod session;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

pub use tls::CertSource;

/// How to run the console.
#[derive(Clone)]
pub struct ConsoleOptions {
    /// Listen address (127.0.0.1 by default: nothing is exposed unless asked for).
    pub listen: SocketAddr,
    /// Where the HTTPS certificate comes from.
    pub cert: CertSource,
    /// The API server's address and CA; its credentials are never used for visitors.
    pub api: kube::Config,
    /// Set by `provisioning dev`: its data directory and admin token, for sign-in links that
    /// `provisioning login-link` issues from another process.
    pub dev: Option<DevSignIn>,
}

/// The data directory and admin identity of a console that `provisioning dev` started.
#[derive(Clone)]
pub struct DevSignIn {
    /// `provisioning dev --data-dir`.
    pub data_dir: std::path::PathBuf,
    /// The dev kubeconfig's admin token.
    pub admin: SecretString,
}

/// State shared by every request.
pub struct ConsoleState {
    /// Sessions and one-time codes.
    pub sessions: session::Sessions,
    /// The API server's address and CA.
    pub api: kube::Config,
    /// Open live streams, capped per session and in total.
    pub streams: Arc<live::StreamLimits>,
    /// See [`ConsoleOptions::dev`].
    pub dev: Option<DevSignIn>,
    /// One client without credentials for every sign-in check (the token goes in that
    /// request's header): a failed sign-in builds no TLS client of its own.
    pub sign_in_client: kube::Client,
    /// Sign-in attempts per peer.
    pub sign_in: limits::SignInLimiter,
    /// Open connections.
    pub connections: Arc<limits::Connections>,
    /// Caps and timeouts.
    pub limits: limits::ConsoleLimits,
}

/// A started console.
pub struct RunningConsole {
    addr: SocketAddr,
    state: Arc<ConsoleState>,
}

impl RunningConsole {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The console's base URL (`https://127.0.0.1:PORT/`).
    pub fn url(&self) -> String {
        format!("https://{}/", provisioning_apiserver::tls::client_host(self.addr))
    }

    /// A sign-in URL with a one-time code that opens a session with `token`, once.
    pub fn login_url(&self, token: SecretString) -> String {
        format!("{}login?code={}", self.url(), self.state.sessions.issue_code(token))
    }
}

/// Binds `opts.listen` and serves the console until `shutdown` is cancelled.
pub async fn start(opts: ConsoleOptions, shutdown: CancellationToken) -> anyhow::Result<RunningConsole> {
    let listener =
        tokio::net::TcpListener::bind(opts.listen).await.map_err(|e| anyhow::anyhow!("binding the console to {}: {e}", opts.listen))?;
    let addr = listener.local_addr()?;
    let tls = tls::load(&opts.cert, addr)?;
    let limits = limits::ConsoleLimits::default();
    let sign_in_client = api::anonymous_client(&opts.api).map_err(|e| anyhow::anyhow!("the console's API client: {e}"))?;
    let state = Arc::new(ConsoleState {
        sessions: session::Sessions::default(),
        api: opts.api,
        streams: Arc::default(),
        dev: opts.dev,
        sign_in_client,
        sign_in: limits::SignInLimiter::new(limits.sign_in_burst, limits.sign_in_interval),
        connections: limits::Connections::new(limits.max_connections, limits.max_connections_per_peer),
        limits,
    });
    tokio::spawn(http::serve(state.clone(), listener, tls, shutdown));
    Ok(RunningConsole { addr, state })
}
