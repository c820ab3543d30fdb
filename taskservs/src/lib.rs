//! The taskserv catalog and the script runner.
//!
//! - [`Catalog::load`] reads `taskservs/catalog/<name>/taskserv.yaml` (+ scripts, templates),
//!   validates everything and fails naming the broken file; [`Catalog::default_dir`] finds it.
//! - [`Catalog::resolve`] turns wanted services into an install order (closure of `requires`,
//!   `after` when both present, cycles and unknown names as [`ResolveError`]).
//! - [`Catalog::validate_request`] checks service, version and config (JSON schema) and
//!   returns a [`ResolvedService`].
//! - [`ScriptContext`] is what a script reads on stdin; [`ScriptContext::with_templates`]
//!   renders the service's `templates/*` into it (minijinja, strict, with the `ip`, `ip_host`
//!   and `conf_quote` filters; see `templates.rs`).
//! - [`run_script`] runs one step (install/check/remove) as a fresh `nu` process through a
//!   [`ScriptExecutor`] (the controller adapts a provider's exec; [`LocalProcessExecutor`]
//!   runs local processes) and returns a [`ScriptOutcome`].

#![warn(missing_docs)]

mod catalog;
mod cluster_templates;
mod context;
mod error;
mod manifest;
mod redact;
mod runner;
mod templates;

pub use catalog::{CATALOG_ENV, Catalog, CatalogService, ResolvedService, SecretField, SecretFormat};
pub use cluster_templates::{
    ClusterTemplate, ClusterTemplateError, ParameterType, RenderedTemplate, TEMPLATE_MANIFEST, TEMPLATE_SOURCE, TEMPLATES_ENV,
    TemplateLibrary, TemplateManifest, TemplateParameter, is_dns_label,
};
pub use context::{AddressInfo, ClusterInfo, PeerInfo, ScriptContext, ServerInfo, TaskServInfo, WorkspaceInfo};
pub use error::{CatalogError, ConfigViolation, ResolveError, RunError, TemplateError, ValidationError};
pub use manifest::{HealthSpec, KNOWN_PROVIDERS, REQUIRED_SCRIPTS, TaskServManifest};
pub use redact::{MIN_SECRET_LEN, REDACTED, Redactor};
pub use runner::{
    ExecOutput, LocalProcessExecutor, OUTPUT_QUEUE, RESULT_MARKER, RESULT_NODES, SECRET_MARKER, SECRET_WITHHELD, ScriptExecutor,
    ScriptOutcome, ScriptPaths, ScriptStep, SecretResult, TAIL_BYTES, TAIL_LINES, parse_result, parse_secret, run_script,
    run_script_redacted,
};
