//! Provisioning's reconcilers and the shared controller core (a library: the binary is in
//! the `provisioning-cli` crate).
//!
//! The core, shared by every kind:
//! - [`reconcile`]: the reconcile skeleton every kind runs through (span, cache gate, stale
//!   check, paused check, first finalizer and status, finalizer) and [`reconcile::Trigger`]
//!   for in-process reconcile requests;
//! - [`context::Context`]: client, caches, provider registry, per-workspace semaphores,
//!   status patching (server-side apply, compare first), annotations, events, backoff;
//! - [`conditions`]: kstatus conditions (`Summary` → Ready/Reconciling/Stalled) merged so
//!   `lastTransitionTime` moves only on a flip;
//! - [`error`]: `Error` with `class()` (Throttled/Transient/NotFound/Permanent), `category()`
//!   and `step()` (the pipeline step that failed), and the per-object jittered backoff;
//! - [`sync`]: the tracked watch caches and the gate that waits for all of them; [`decode`]:
//!   watched objects decoded one by one within a depth and size budget (one bad object is
//!   reported, never fatal to a cache);
//! - [`time`]: whole-second timestamps and jittered requeues;
//! - [`effective_workspace`]: namespace → its effective workspace (or the controller's
//!   defaults); the Workspace reconciler itself is [`workspace`];
//! - [`accounts`]: provider accounts → cached provider instances (credentials, tenancy and
//!   endpoint rules, provider config); [`host`]: the `nu` binary and catalog on this host,
//!   resolved once at start-up;
//! - [`audit`]: the audit log of provider calls and script runs (read back by
//!   `provisioning audit`); [`history`]: ChangeRecords, one per spec generation carried out;
//! - [`client`]: the controller's API client (bounded, named, metered) and CRD installation;
//! - [`permissions`], [`metrics`], [`leader`], [`config`], and [`run`], which only composes;
//! - [`testing`]: an embedded control plane and helpers for the tests and benchmarks.
//!
//! The command line and the viewers (the `provisioning` binary, `dev`, `plan`, `trace`, the
//! web console, …) live in the `provisioning-cli` crate on top of this one.
//!
//! Kinds: [`workspace`], [`server`], [`taskserv`] and [`cluster`], each split by pipeline
//! step (dereference, validate, plan, act, status) and each wiring its own controller.

pub mod accounts;
pub mod approval;
pub mod audit;
pub mod client;
pub mod cluster;
pub mod conditions;
pub mod config;
pub mod context;
pub mod cost;
pub mod decode;
pub mod effective_workspace;
pub mod error;
pub mod events;
pub mod history;
pub mod host;
pub mod leader;
pub mod metrics;
pub mod permissions;
pub mod planning;
pub mod reconcile;
pub mod run;
pub mod secret_watch;
pub mod server;
pub mod shard;
pub mod slim;
pub mod sync;
pub mod taskserv;
pub mod testing;
pub mod text;
pub mod time;
pub mod workspace;

pub use context::Context;
pub use error::Error;

/// Installs the process-wide rustls crypto provider (aws-lc-rs). Call once at start-up;
/// later calls are harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
