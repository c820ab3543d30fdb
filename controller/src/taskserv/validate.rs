//! Validate (pure): the TaskServ's request against the catalog. Unknown service, unknown
//! version, a config that breaks the schema and a dependency cycle are all `Stalled`: nothing
//! runs until the spec (or the catalog) changes.

use std::time::Duration;

use provisioning_crds::TaskServSpec;
use provisioning_taskservs::{Catalog, Redactor, ResolveError, ValidationError};
use serde_json::Value;

/// A request the catalog accepts.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidTaskServ {
    /// Catalog name.
    pub service: String,
    /// Version to converge to (the spec's, or the catalog default).
    pub version: String,
    /// Config with the schema's defaults filled in (shared: every script run of the TaskServ
    /// reads it, none copies it).
    pub config: std::sync::Arc<Value>,
    /// Services that must be installed first (the closure of `requires`, install order).
    pub dependencies: Vec<String>,
    /// Time limit of one script run.
    pub timeout: Duration,
    /// How often health is re-checked on resync.
    pub health_interval: Duration,
    /// Version of the `configFrom` and generated inputs (see `inputs::inputs_hash`).
    pub inputs_hash: Option<String>,
    /// Filters the secret values of `config` from script output.
    pub redactor: Redactor,
}

/// Why a request is refused. Every variant is `Stalled` with this reason and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTaskServ {
    /// The service is not in the catalog.
    #[error("unknown service {0:?}: not in the taskserv catalog")]
    UnknownService(String),
    /// The version is not one the catalog has.
    #[error("{0}")]
    UnknownVersion(String),
    /// The config fails the service's schema.
    #[error("{0}")]
    InvalidConfig(String),
    /// The service's dependencies loop.
    #[error("dependency cycle: {0}")]
    DependencyCycle(String),
    /// TaskServs' `dependsOn` lists loop through this one (see
    /// [`check_depends_on`](super::plan::check_depends_on)); the message names the cycle.
    #[error("{0}")]
    DependsOnCycle(String),
    /// `configFrom` or the generated secrets cannot be resolved (a Secret missing, a key
    /// that is not YAML…): the reason and a message naming the object and key.
    #[error("{1}")]
    ConfigInputs(&'static str, String),
}

impl InvalidTaskServ {
    /// CamelCase condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            InvalidTaskServ::UnknownService(_) => "UnknownService",
            InvalidTaskServ::UnknownVersion(_) => "UnknownVersion",
            InvalidTaskServ::InvalidConfig(_) => "InvalidConfig",
            InvalidTaskServ::DependencyCycle(_) | InvalidTaskServ::DependsOnCycle(_) => crate::planning::REASON_DEPENDENCY_CYCLE,
            InvalidTaskServ::ConfigInputs(reason, _) => reason,
        }
    }
}

/// Checks a TaskServ spec against the catalog and resolves its dependencies.
pub fn validate(spec: &TaskServSpec, catalog: &Catalog) -> Result<ValidTaskServ, InvalidTaskServ> {
    validate_resolved(spec, spec.config.clone().unwrap_or(Value::Null), None, Redactor::default(), catalog)
}

/// [`validate`] of the config as resolved from `configFrom` and generated secrets.
pub fn validate_resolved(
    spec: &TaskServSpec,
    config: Value,
    inputs_hash: Option<String>,
    redactor: Redactor,
    catalog: &Catalog,
) -> Result<ValidTaskServ, InvalidTaskServ> {
    let version = if spec.version.is_empty() { None } else { Some(spec.version.as_str()) };
    let resolved = catalog.validate_request(&spec.service, version, &config).map_err(|e| match e {
        ValidationError::UnknownService(s) => InvalidTaskServ::UnknownService(s),
        e @ ValidationError::UnknownVersion { .. } => InvalidTaskServ::UnknownVersion(e.to_string()),
        e @ ValidationError::InvalidConfig { .. } => InvalidTaskServ::InvalidConfig(e.to_string()),
    })?;
    let order = catalog.resolve(std::slice::from_ref(&spec.service)).map_err(|e| match e {
        ResolveError::Unknown(s) => InvalidTaskServ::UnknownService(s),
        ResolveError::Cycle(c) => InvalidTaskServ::DependencyCycle(c),
    })?;
    let dependencies = order.into_iter().filter(|s| s != &spec.service).collect();
    Ok(ValidTaskServ {
        service: resolved.service,
        version: resolved.version,
        config: std::sync::Arc::new(resolved.config),
        dependencies,
        timeout: resolved.timeout,
        health_interval: resolved.health_interval,
        inputs_hash,
        redactor,
    })
}
