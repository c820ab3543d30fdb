//! Provisioning's reconcilers and the shared controller core.
//!
//! The core, reusable by every kind (TaskServ and Cluster reconcilers build on it):
//! - [`context::Context`]: client, caches, provider registry, per-workspace semaphores,
//!   status patching (server-side apply, compare first), annotations, events, backoff;
//! - [`conditions`]: kstatus conditions (`Summary` → Ready/Reconciling/Stalled) merged so
//!   `lastTransitionTime` moves only on a flip;
//! - [`error`]: `Error` with `class()` (Throttled/Transient/NotFound/Permanent) and
//!   `category()`, and the per-object jittered backoff;
//! - [`workspaces`]: namespace → effective workspace (or controller defaults);
//! - [`metrics`], [`leader`], [`config`], [`run`].
//!
//! Kinds: [`workspace`] and [`server`], each split by pipeline step (dereference, validate,
//! plan, act, status).

pub mod cluster;
pub mod conditions;
pub mod config;
pub mod context;
pub mod cost;
pub mod dev;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod run;
pub mod server;
pub mod sync;
pub mod testing;
pub mod taskserv;
pub mod workspace;
pub mod workspaces;

pub use context::Context;
pub use error::Error;

/// Installs the process-wide rustls crypto provider (aws-lc-rs). Call once at start-up;
/// later calls are harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
