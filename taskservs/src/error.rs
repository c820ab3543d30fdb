//! Error types, one per step: loading the catalog, resolving, validating a request,
//! rendering templates and running scripts.

use std::path::PathBuf;

/// The catalog on disk is broken. Every variant names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A directory or file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `taskserv.yaml` is not valid YAML or does not have the manifest's shape.
    #[error("{path}: invalid manifest: {message}")]
    Parse {
        /// The manifest file.
        path: PathBuf,
        /// What the parser said (with line and column).
        message: String,
    },
    /// The manifest parses but breaks a rule (name, versions, providers, scripts…).
    #[error("{path}: {problem}")]
    Invalid {
        /// The manifest file (or the offending file).
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// `configSchema` is not a valid JSON schema.
    #[error("{path}: configSchema does not compile: {message}")]
    Schema {
        /// The manifest file.
        path: PathBuf,
        /// What the schema compiler said.
        message: String,
    },
    /// A template does not parse.
    #[error("{path}: template does not parse: {message}")]
    Template {
        /// The template file.
        path: PathBuf,
        /// What minijinja said.
        message: String,
    },
}

/// A set of wanted services cannot be put in install order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The named service is not in the catalog.
    #[error("unknown service {0:?}")]
    Unknown(String),
    /// The dependencies loop; the string is the loop, e.g. `a -> b -> a` ("a requires b…").
    #[error("dependency cycle: {0}")]
    Cycle(String),
}

/// One way a config breaks the service's schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigViolation {
    /// JSON pointer (RFC 6901) into the config; empty for the config itself.
    pub pointer: String,
    /// Why it fails.
    pub reason: String,
}

impl std::fmt::Display for ConfigViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() { "/" } else { &self.pointer };
        write!(f, "at {at}: {}", self.reason)
    }
}

/// A request (service, version, config) the catalog refuses. Not retryable: the spec must change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The service is not in the catalog.
    #[error("unknown service {0:?}")]
    UnknownService(String),
    /// The version is not one the catalog has.
    #[error("service {service} has no version {version:?} (available: {})", available.join(", "))]
    UnknownVersion {
        /// The service.
        service: String,
        /// The version asked for.
        version: String,
        /// What the catalog has.
        available: Vec<String>,
    },
    /// The config fails the service's schema.
    #[error("invalid config for {service}: {}", violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidConfig {
        /// The service.
        service: String,
        /// Every violation, in the validator's order.
        violations: Vec<ConfigViolation>,
    },
}

/// Templates could not be rendered for a context.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The service is not in the catalog.
    #[error("unknown service {0:?}")]
    UnknownService(String),
    /// A template failed to render (an undefined variable, a filter error…).
    #[error("template {service}/templates/{template}: {message}")]
    Render {
        /// The service.
        service: String,
        /// The template's file name.
        template: String,
        /// What minijinja said.
        message: String,
    },
}

/// A script could not be run (as opposed to: it ran and failed, which is a [`crate::ScriptOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The service name is not a catalog name (it would end up in a path).
    #[error("invalid service name {0:?}")]
    InvalidService(String),
    /// The context could not be serialised.
    #[error("cannot serialise the script context: {0}")]
    Context(#[from] serde_json::Error),
    /// The process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// argv[0].
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the process's pipes failed, or waiting on it.
    #[error("i/o with the script process: {0}")]
    Io(#[from] std::io::Error),
    /// The executor (a provider's exec) failed; the message is the executor's.
    #[error("executor failed: {0}")]
    Executor(String),
    /// The executor did not return long after the timeout.
    #[error("executor did not return within {0:?} (timeout plus grace)")]
    ExecutorHung(std::time::Duration),
}

impl RunError {
    /// Whether trying again later may help (transport trouble), as opposed to a bug in the request.
    pub fn is_transient(&self) -> bool {
        matches!(self, RunError::Spawn { .. } | RunError::Io(_) | RunError::Executor(_) | RunError::ExecutorHung(_))
    }
}
