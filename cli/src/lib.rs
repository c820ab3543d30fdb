//! The `provisioning` command line and the viewers, on top of the controller crate
//! (`provisioning-controller`: the reconcilers and their core).
//!
//! One module per subcommand (the binary, `src/main.rs`, parses arguments and dispatches):
//! - [`dev`]: `provisioning dev` — the embedded control plane and the controller in one
//!   process, manifest application and live progress;
//! - [`plan`]: `provisioning plan` — what applying manifests would change;
//! - [`trace`]: `provisioning trace` — an object and everything it owns as a tree;
//! - [`console`]: the web console (`dev`, `controller --console-addr`) — the same tree, live;
//! - [`audit`]: `provisioning audit` — the controller's audit log read back;
//! - [`template`]: `provisioning template list|render` — Cluster templates into manifests;
//! - [`test_command`]: `provisioning test` — a throwaway environment that creates a service or
//!   template, checks it and removes everything;
//! - [`catalog`]: `provisioning catalog list|show`;
//! - [`backup`]: `provisioning backup` and `provisioning restore` of the embedded control plane;
//! - [`migrate`]: `provisioning migrate-storage` — every object stored at its storage version.

pub mod audit;
pub mod backup;
pub mod catalog;
pub mod console;
pub mod dev;
pub mod listing;
pub mod migrate;
pub mod plan;
pub mod template;
pub mod test_command;
pub mod trace;
