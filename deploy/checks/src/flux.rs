//! Flux `healthCheckExprs` (CEL) evaluated the way kustomize-controller does
//! (fluxcd/pkg `runtime/cel` StatusEvaluator, RFC 0009):
//!
//! 1. if `status.observedGeneration` exists and differs from `metadata.generation` → InProgress
//!    (a non-integer there is an error);
//! 2. then `inProgress`, `failed`, `current`, in that order: the first that is true decides;
//! 3. none true → InProgress.
//!
//! An expression that fails to evaluate (a missing field, a wrong type) makes the whole check
//! an error: Flux reports the resource as Unknown and keeps polling until its timeout. That is
//! the "waits forever" trap the expressions must avoid. The object's top-level fields are the
//! CEL variables (`metadata`, `spec`, `status`…), exactly as Flux binds them.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

/// One entry of a Kustomization's `spec.healthCheckExprs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckExpr {
    pub api_version: String,
    pub kind: String,
    pub current: String,
    #[serde(default)]
    pub in_progress: Option<String>,
    #[serde(default)]
    pub failed: Option<String>,
}

/// What Flux concludes for one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FluxVerdict {
    InProgress,
    Failed,
    Current,
    /// An evaluation error: Flux shows Unknown and waits for the timeout.
    Unknown(String),
}

impl FluxVerdict {
    /// The kstatus name Flux reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::InProgress => "InProgress",
            Self::Failed => "Failed",
            Self::Current => "Current",
            Self::Unknown(_) => "Unknown",
        }
    }
}

/// Failures to parse an expression (Flux rejects the Kustomization for these).
#[derive(Debug, thiserror::Error)]
#[error("cannot parse the CEL expression {field} for {kind}: {message}")]
pub struct ParseError {
    pub kind: String,
    pub field: &'static str,
    pub message: String,
}

/// Parsed expressions for one kind.
pub struct StatusEvaluator {
    current: cel::Program,
    in_progress: Option<cel::Program>,
    failed: Option<cel::Program>,
}

fn compile(kind: &str, field: &'static str, source: &str) -> Result<cel::Program, ParseError> {
    cel::Program::compile(source).map_err(|e| ParseError { kind: kind.to_owned(), field, message: e.to_string() })
}

impl StatusEvaluator {
    /// Parses the three expressions (`current` is required, as in Flux).
    pub fn new(exprs: &HealthCheckExpr) -> Result<Self, ParseError> {
        Ok(Self {
            current: compile(&exprs.kind, "current", &exprs.current)?,
            in_progress: exprs
                .in_progress
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| compile(&exprs.kind, "inProgress", s))
                .transpose()?,
            failed: exprs.failed.as_deref().filter(|s| !s.is_empty()).map(|s| compile(&exprs.kind, "failed", s)).transpose()?,
        })
    }

    /// Evaluates one expression against an object: `Ok(bool)`, or the error Flux would get.
    pub fn evaluate_expression(program: &cel::Program, obj: &Value) -> Result<bool, String> {
        let env = Arc::new(cel::Env::stdlib());
        let mut context = cel::Context::with_env(env);
        if let Value::Object(fields) = obj {
            for (name, value) in fields {
                let value = cel::to_value(value).map_err(|e| e.to_string())?;
                context.add_variable_from_value(name.clone(), value);
            }
        }
        match program.execute(&context) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("expression did not evaluate to a boolean: {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Each expression's own outcome (used to prove none of them errors on a snapshot).
    pub fn evaluate_each(&self, obj: &Value) -> Vec<(&'static str, Result<bool, String>)> {
        let mut outcomes = Vec::new();
        if let Some(p) = &self.in_progress {
            outcomes.push(("inProgress", Self::evaluate_expression(p, obj)));
        }
        if let Some(p) = &self.failed {
            outcomes.push(("failed", Self::evaluate_expression(p, obj)));
        }
        outcomes.push(("current", Self::evaluate_expression(&self.current, obj)));
        outcomes
    }

    /// Flux's verdict for an object.
    pub fn evaluate(&self, obj: &Value) -> FluxVerdict {
        if let Some(observed) = obj.pointer("/status/observedGeneration") {
            let Some(observed) = observed.as_i64() else {
                return FluxVerdict::Unknown(format!(".status.observedGeneration accessor error: {observed} is not an int64"));
            };
            if let Some(generation) = obj.pointer("/metadata/generation") {
                let Some(generation) = generation.as_i64() else {
                    return FluxVerdict::Unknown(format!(".metadata.generation accessor error: {generation} is not an int64"));
                };
                if observed != generation {
                    return FluxVerdict::InProgress;
                }
            }
        }
        let ordered = [
            (self.in_progress.as_ref(), FluxVerdict::InProgress),
            (self.failed.as_ref(), FluxVerdict::Failed),
            (Some(&self.current), FluxVerdict::Current),
        ];
        for (program, verdict) in ordered {
            let Some(program) = program else { continue };
            match Self::evaluate_expression(program, obj) {
                Ok(true) => return verdict,
                Ok(false) => {}
                Err(e) => return FluxVerdict::Unknown(e),
            }
        }
        FluxVerdict::InProgress
    }
}

/// `deploy/flux`.
pub fn flux_dir() -> std::path::PathBuf {
    crate::deploy_dir().join("flux")
}

/// Reads the `healthCheckExprs` of every Kustomization in a multi-document YAML file.
pub fn read_health_check_exprs(path: &std::path::Path) -> Result<Vec<HealthCheckExpr>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut exprs = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).map_err(|e| format!("{}: {e}", path.display()))?;
        if value.get("kind").and_then(Value::as_str) != Some("Kustomization") {
            continue;
        }
        if let Some(list) = value.pointer("/spec/healthCheckExprs") {
            let parsed: Vec<HealthCheckExpr> =
                serde_json::from_value(list.clone()).map_err(|e| format!("{}: healthCheckExprs: {e}", path.display()))?;
            exprs.extend(parsed);
        }
    }
    Ok(exprs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn evaluator(current: &str, in_progress: &str, failed: &str) -> StatusEvaluator {
        StatusEvaluator::new(&HealthCheckExpr {
            api_version: "example.com/v1".into(),
            kind: "Thing".into(),
            current: current.into(),
            in_progress: Some(in_progress.into()),
            failed: Some(failed.into()),
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    // The same cases as fluxcd/pkg's status_evaluator_test.go, to show this model matches Flux.
    #[test]
    fn order_and_defaults_match_flux() {
        let e = evaluator("data.current", "data.inProgress", "data.failed");
        let obj = |c: bool, i: bool, f: bool| json!({"data": {"current": c, "inProgress": i, "failed": f}});
        assert_eq!(e.evaluate(&obj(false, false, false)), FluxVerdict::InProgress);
        assert_eq!(e.evaluate(&obj(true, true, true)), FluxVerdict::InProgress);
        assert_eq!(e.evaluate(&obj(true, false, true)), FluxVerdict::Failed);
        assert_eq!(e.evaluate(&obj(true, false, false)), FluxVerdict::Current);
    }

    #[test]
    fn observed_generation_mismatch_is_in_progress_before_any_expression() {
        let e = evaluator("true", "false", "false");
        let obj = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 1}});
        assert_eq!(e.evaluate(&obj), FluxVerdict::InProgress);
    }

    #[test]
    fn missing_fields_are_errors_as_in_flux() {
        let e = evaluator(
            "status.conditions.filter(e, e.type == 'Ready').all(e, e.status == 'True')",
            "has(status.observedGeneration) && metadata.generation != status.observedGeneration",
            "status.conditions.filter(e, e.type == 'Ready').all(e, e.status == 'False')",
        );
        assert!(matches!(e.evaluate(&json!({})), FluxVerdict::Unknown(_)));
        assert!(matches!(e.evaluate(&json!({"status": {}})), FluxVerdict::Unknown(_)));
        // An empty list: `all` is vacuously true, so this naive pair calls it Failed.
        assert_eq!(e.evaluate(&json!({"metadata": {"generation": 1}, "status": {"conditions": []}})), FluxVerdict::Failed);
    }
}
