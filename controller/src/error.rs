//! Reconcile errors, their classification for retry, and the per-object backoff.
//!
//! Every reconciler returns [`Error`]; `error_policy` asks [`Error::class`] how to retry and
//! [`Backoffs`] for how long to wait. TaskServ and Cluster reconcilers reuse both: add a
//! variant here only when a failure needs a new *class*, otherwise map into an existing one
//! (`Error::Stalled` for bad spec/environment, `Error::Provider` for provider calls).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use provisioning_providers::ProviderError;
use rand::Rng;

/// How a failure should be retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The remote asked us to slow down: wait at least `retry_after`.
    Throttled {
        /// The wait the remote asked for.
        retry_after: Duration,
    },
    /// May go away by itself: retry soon, backing off.
    Transient,
    /// Something referenced does not exist (yet): retry, backing off.
    NotFound,
    /// Retrying will not help until the spec or the environment changes: back off hard.
    Permanent,
    /// Work in flight (a deletion the provider is still doing): poll at a fixed short pace.
    InProgress,
    /// "Not now" or "not here" (a provider quota used up, a zone without capacity): Stalled,
    /// looked at again on a slow fixed schedule ([`CAPACITY_RETRY`]), not the backoff.
    Capacity,
}

/// How often an object stalled on a quota or on a zone's capacity looks again (jittered).
pub const CAPACITY_RETRY: Duration = Duration::from_secs(300);

impl ErrorClass {
    /// Stable label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            ErrorClass::Throttled { .. } => "throttled",
            ErrorClass::Transient => "transient",
            ErrorClass::NotFound => "not_found",
            ErrorClass::Permanent => "permanent",
            ErrorClass::InProgress => "in_progress",
            ErrorClass::Capacity => "capacity",
        }
    }
}

/// A failed reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A provider call failed (the message never contains credentials: providers redact them).
    #[error("provider account {account}: {source}")]
    Provider {
        /// Provider account name.
        account: String,
        /// What the provider said.
        #[source]
        source: ProviderError,
    },
    /// The object cannot make progress without a change of spec or environment. Its status
    /// already says `Stalled=True` with `message` when this is returned.
    #[error("{message}")]
    Stalled {
        /// CamelCase condition reason.
        reason: &'static str,
        /// Human message naming the blocking thing.
        message: String,
    },
    /// The provider is still working on something we wait for (deletion).
    #[error("{0}")]
    InProgress(String),
    /// The finalizer helper failed (adding/removing the finalizer, or the wrapped step).
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Building or parsing a JSON document failed.
    #[error("serialization: {0}")]
    Serialization(#[from] serde_json::Error),
    /// The object lacks a field the API server always sets (name, uid, namespace).
    #[error("object has no {0}")]
    MissingField(&'static str),
    /// `error` happened in pipeline step `step`. The message is the inner error's (condition
    /// messages stay as they were); the step is logged with it (see [`Error::step`]).
    #[error("{error}")]
    At {
        /// The step that failed.
        step: Step,
        /// What failed.
        error: Box<Error>,
    },
}

/// The pipeline steps of a reconcile (see [`crate::reconcile`]), named in logs when one fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Waiting for the watch caches (crate::sync).
    CacheSync,
    /// Writing the Paused condition.
    Paused,
    /// Adding or removing the finalizer.
    Finalizer,
    /// Writing the first-visit status.
    FirstStatus,
    /// Reading what the object refers to (other objects, Secrets, provider accounts).
    Dereference,
    /// Checking the spec against the environment.
    Validate,
    /// Deciding what to do.
    Plan,
    /// Doing it (provider calls, child objects, script runs, namespaces).
    Act,
    /// Writing status.
    Status,
    /// Cleaning up a deleted object.
    Cleanup,
}

impl Step {
    /// Stable lower-case name (log field `step`).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::CacheSync => "cache-sync",
            Step::Paused => "paused",
            Step::Finalizer => "finalizer",
            Step::FirstStatus => "first-status",
            Step::Dereference => "dereference",
            Step::Validate => "validate",
            Step::Plan => "plan",
            Step::Act => "act",
            Step::Status => "status",
            Step::Cleanup => "cleanup",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Attaches the failing pipeline step to an error: `api.get(..).await.at(Step::Dereference)?`.
pub trait AtStep<T> {
    /// The error, marked as failed in `step`.
    fn at(self, step: Step) -> Result<T, Error>;
}

impl<T, E: Into<Error>> AtStep<T> for Result<T, E> {
    fn at(self, step: Step) -> Result<T, Error> {
        self.map_err(|e| e.into().at(step))
    }
}

impl Error {
    /// Wraps a provider error with the account it came from.
    pub fn provider(account: &str, source: ProviderError) -> Self {
        Error::Provider { account: account.to_string(), source }
    }

    /// This error, marked as failed in `step` (an error already marked keeps its step).
    pub fn at(self, step: Step) -> Self {
        match self {
            Error::At { .. } => self,
            other => Error::At { step, error: Box::new(other) },
        }
    }

    /// The pipeline step that failed, when known (the finalizer helper's `Apply`/`Cleanup`
    /// wrapper counts as the step its closure failed in).
    pub fn step(&self) -> Option<Step> {
        match self {
            Error::At { step, .. } => Some(*step),
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e) => e.step(),
                kube::runtime::finalizer::Error::CleanupFailed(e) => e.step().or(Some(Step::Cleanup)),
                _ => Some(Step::Finalizer),
            },
            _ => None,
        }
    }

    /// How to retry this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::At { error, .. } => error.class(),
            Error::Kube(e) => kube_class(e),
            Error::Provider { source, .. } => match source {
                ProviderError::Throttled { retry_after } => ErrorClass::Throttled { retry_after: *retry_after },
                ProviderError::Transient(_) => ErrorClass::Transient,
                ProviderError::NotFound(_) => ErrorClass::NotFound,
                ProviderError::Capacity(_) => ErrorClass::Capacity,
                ProviderError::Auth(_) | ProviderError::InvalidRequest(_) | ProviderError::NotOwned(_) | ProviderError::Permanent(_) => {
                    ErrorClass::Permanent
                }
            },
            Error::Stalled { .. } | Error::MissingField(_) | Error::Serialization(_) => ErrorClass::Permanent,
            Error::InProgress(_) => ErrorClass::InProgress,
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e.class(),
                // Usually a race with our own stale cache (the JSON patch `test` fails): retry soon.
                kube::runtime::finalizer::Error::AddFinalizer(e) | kube::runtime::finalizer::Error::RemoveFinalizer(e) => {
                    match kube_class(e) {
                        ErrorClass::Permanent => ErrorClass::Transient,
                        other => other,
                    }
                }
                _ => ErrorClass::Permanent,
            },
        }
    }

    /// Short, bounded category for metrics labels and condition reasons (never the message).
    pub fn category(&self) -> &'static str {
        match self {
            Error::At { error, .. } => error.category(),
            Error::Kube(_) => "KubeApi",
            Error::Provider { source, .. } => source.category(),
            Error::Stalled { reason, .. } => reason,
            Error::InProgress(_) => "InProgress",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e.category(),
                _ => "Finalizer",
            },
            Error::Serialization(_) => "Serialization",
            Error::MissingField(_) => "MissingField",
        }
    }

    /// Whether the API server refused the call (401 or 403): the client's access layer logs
    /// that already, naming the verb and resource (`crate::metrics`), so the reconcile's
    /// failure is not logged a second time.
    pub fn refused_by_api(&self) -> bool {
        use kube::runtime::finalizer::Error as Finalizer;
        let refused = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 401 || s.code == 403);
        match self.root() {
            Error::Kube(e) => refused(e),
            Error::Finalizer(inner) => match inner.as_ref() {
                Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => refused(e),
                _ => false,
            },
            _ => false,
        }
    }

    /// The innermost reconcile error (unwraps the finalizer helper's wrapper).
    pub fn root(&self) -> &Error {
        match self {
            Error::At { error, .. } => error.root(),
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e.root(),
                _ => self,
            },
            _ => self,
        }
    }
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(e: kube::runtime::finalizer::Error<Error>) -> Self {
        Error::Finalizer(Box::new(e))
    }
}

fn kube_class(e: &kube::Error) -> ErrorClass {
    match e {
        kube::Error::Api(status) => match status.code {
            429 => ErrorClass::Throttled { retry_after: Duration::from_secs(1) },
            404 => ErrorClass::NotFound,
            409 | 500..=599 => ErrorClass::Transient,
            _ => ErrorClass::Permanent,
        },
        _ => ErrorClass::Transient,
    }
}

/// Base delay and cap of the backoff per class.
fn backoff_bounds(class: ErrorClass) -> (Duration, Duration) {
    match class {
        ErrorClass::Throttled { retry_after } => (retry_after.max(Duration::from_secs(1)), Duration::from_secs(300)),
        ErrorClass::Transient => (Duration::from_secs(1), Duration::from_secs(300)),
        ErrorClass::NotFound => (Duration::from_secs(5), Duration::from_secs(300)),
        // 30 s, 60 s, 2 min, 4 min, 8 min, then 10 min: a Stalled object never storms an API.
        ErrorClass::Permanent => (Duration::from_secs(30), Duration::from_secs(600)),
        ErrorClass::InProgress => (Duration::from_secs(2), Duration::from_secs(2)),
        ErrorClass::Capacity => (CAPACITY_RETRY, CAPACITY_RETRY),
    }
}

/// The delay before retry number `attempt` (0-based) of an error of `class`, with `jitter`
/// in `[-1, 1]` spreading it by ±20 %. Pure, so the schedule is unit-tested.
pub fn backoff_delay(class: ErrorClass, attempt: u32, jitter: f64) -> Duration {
    let (base, cap) = backoff_bounds(class);
    let exp = base.saturating_mul(1u32 << attempt.min(20));
    let delay = exp.min(cap);
    let factor = 1.0 + 0.2 * jitter.clamp(-1.0, 1.0);
    let jittered = delay.mul_f64(factor);
    match class {
        // Never retry earlier than the remote asked.
        ErrorClass::Throttled { retry_after } => jittered.max(retry_after),
        _ => jittered,
    }
}

/// Per-object retry counters: the n-th consecutive failure of an object waits longer.
/// Keys are `kind/namespace/name`; a successful reconcile resets the counter.
#[derive(Default)]
pub struct Backoffs {
    attempts: Mutex<HashMap<String, u32>>,
}

impl Backoffs {
    /// Records a failure of `key` and returns how long to wait before retrying.
    pub fn next_delay(&self, key: &str, class: ErrorClass) -> Duration {
        let attempt = {
            let mut map = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
            let slot = map.entry(key.to_string()).or_insert(0);
            let attempt = *slot;
            *slot = slot.saturating_add(1);
            attempt
        };
        backoff_delay(class, attempt, rand::rng().random_range(-1.0..=1.0))
    }

    /// Forgets the failures of `key` (call after a successful reconcile).
    pub fn reset(&self, key: &str) {
        let mut map = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(key);
    }

    /// How many consecutive failures `key` has had.
    pub fn attempts(&self, key: &str) -> u32 {
        let map = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_backoff_grows_to_at_least_five_minutes() {
        let delays: Vec<Duration> = (0..8).map(|a| backoff_delay(ErrorClass::Permanent, a, -1.0)).collect();
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
        assert!(delays[0] >= Duration::from_secs(20));
        assert!(delays[7] >= Duration::from_secs(300), "{delays:?}");
    }

    #[test]
    fn quota_and_capacity_errors_wait_five_minutes_every_time() {
        let e = Error::provider(
            "aws",
            ProviderError::Capacity(Box::new(provisioning_providers::CapacityError {
                kind: provisioning_providers::CapacityKind::Quota,
                quota: "VcpuLimitExceeded".into(),
                asked: "1 instance of type t3.large, 2 vCPUs".into(),
                message: "m".into(),
            })),
        );
        assert_eq!((e.class(), e.category()), (ErrorClass::Capacity, "QuotaExceeded"));
        for attempt in [0, 1, 5, 20] {
            let d = backoff_delay(ErrorClass::Capacity, attempt, -1.0);
            assert!(
                d >= Duration::from_secs(240) && backoff_delay(ErrorClass::Capacity, attempt, 1.0) <= Duration::from_secs(360),
                "{d:?}"
            );
        }
    }

    #[test]
    fn throttled_never_earlier_than_asked() {
        let d = backoff_delay(ErrorClass::Throttled { retry_after: Duration::from_secs(7) }, 0, -1.0);
        assert!(d >= Duration::from_secs(7));
    }

    #[test]
    fn transient_is_quick_then_capped() {
        assert!(backoff_delay(ErrorClass::Transient, 0, 0.0) <= Duration::from_secs(2));
        assert!(backoff_delay(ErrorClass::Transient, 30, 1.0) <= Duration::from_secs(360));
    }

    #[test]
    fn counters_reset_on_success() {
        let b = Backoffs::default();
        b.next_delay("Server/a/b", ErrorClass::Transient);
        b.next_delay("Server/a/b", ErrorClass::Transient);
        assert_eq!(b.attempts("Server/a/b"), 2);
        b.reset("Server/a/b");
        assert_eq!(b.attempts("Server/a/b"), 0);
    }

    #[test]
    fn provider_errors_classify() {
        let e = Error::provider("sim", ProviderError::Auth("nope".into()));
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert_eq!(e.category(), "AuthFailed");
        let e = Error::provider("sim", ProviderError::Throttled { retry_after: Duration::from_secs(3) });
        assert_eq!(e.class(), ErrorClass::Throttled { retry_after: Duration::from_secs(3) });
    }

    #[test]
    fn a_refusal_by_the_api_server_is_logged_by_the_access_layer_only() {
        let api = |code: u16| {
            let mut status = kube::core::Status::failure("refused", "Forbidden");
            status.code = code;
            Error::Kube(kube::Error::Api(status.boxed()))
        };
        assert!(api(403).refused_by_api());
        assert!(api(401).at(Step::Status).refused_by_api(), "through the step it failed at");
        let wrapped: Error = kube::runtime::finalizer::Error::<Error>::ApplyFailed(api(403)).into();
        assert!(wrapped.refused_by_api());
        assert!(!api(409).refused_by_api());
        assert!(!Error::InProgress("x".into()).refused_by_api());
    }
}
