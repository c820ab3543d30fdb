//! Per-account rate limiting, retries with jittered exponential backoff, Retry-After
//! handling and the authentication gate shared by the cloud providers (aws, upcloud).
//!
//! One [`RateLimiter`] exists per provider account (the registry hands the same limiter to
//! every provider object of an account), so a throttled account slows down as a whole.
//! The [`AuthGate`] remembers rejected credentials: while its backoff step lasts, calls
//! fail without touching the network, so bad credentials cost at most one call per step.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::{ProviderError, ProviderResult};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section below leaves the state consistent, so a poisoned lock is usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A token bucket: `rate` calls per second with a burst of one second's worth, plus an
/// account-wide pause set when the provider answers 429/503 with Retry-After.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    refilled_at: Instant,
    paused_until: Option<Instant>,
}

static LIMITERS: LazyLock<Mutex<HashMap<String, Arc<RateLimiter>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

impl RateLimiter {
    /// A limiter allowing `calls_per_second` (at least 1).
    pub fn new(calls_per_second: u32) -> Self {
        let rate = f64::from(calls_per_second.max(1));
        RateLimiter { rate, burst: rate, state: Mutex::new(BucketState { tokens: rate, refilled_at: Instant::now(), paused_until: None }) }
    }

    /// The limiter of one provider account, shared by every provider object built for it.
    /// A changed rate replaces the limiter.
    pub fn for_account(provider_type: &str, account: &str, calls_per_second: u32) -> Arc<RateLimiter> {
        let key = format!("{provider_type}/{account}");
        let mut limiters = lock(&LIMITERS);
        match limiters.get(&key) {
            Some(existing) if existing.rate == f64::from(calls_per_second.max(1)) => existing.clone(),
            _ => {
                let limiter = Arc::new(RateLimiter::new(calls_per_second));
                limiters.insert(key, limiter.clone());
                limiter
            }
        }
    }

    /// Waits for a call slot.
    pub async fn acquire(&self) {
        loop {
            let wait = {
                let mut state = lock(&self.state);
                let now = Instant::now();
                match state.paused_until {
                    Some(until) if until > now => until - now,
                    _ => {
                        state.paused_until = None;
                        let elapsed = now.saturating_duration_since(state.refilled_at).as_secs_f64();
                        state.tokens = (state.tokens + elapsed * self.rate).min(self.burst);
                        state.refilled_at = now;
                        if state.tokens >= 1.0 {
                            state.tokens -= 1.0;
                            return;
                        }
                        Duration::from_secs_f64((1.0 - state.tokens) / self.rate)
                    }
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Holds every call of the account back for `delay` (the provider asked us to slow down).
    pub fn pause_for(&self, delay: Duration) {
        let mut state = lock(&self.state);
        let until = Instant::now() + delay;
        if state.paused_until.is_none_or(|current| current < until) {
            state.paused_until = Some(until);
        }
    }
}

/// How often and how patiently a call is retried inside a provider.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in total (the first call included).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles per attempt.
    pub base_delay: Duration,
    /// Upper bound of one backoff.
    pub max_delay: Duration,
    /// Upper bound honoured for a provider's Retry-After (longer waits are returned to the
    /// caller as `Throttled` instead of being slept through).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The ceiling of the backoff before attempt `attempt + 1` (`attempt` counts from 1).
    pub fn backoff_ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(16));
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// A jittered backoff ("full jitter"): uniform between half the ceiling and the ceiling,
    /// so that many clients failing together do not retry together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self.backoff_ceiling(attempt);
        ceiling.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
}

/// Remembers rejected credentials so that they cost at most one call per backoff step.
#[derive(Debug, Default)]
pub struct AuthGate {
    state: Mutex<Option<AuthFailure>>,
}

#[derive(Debug)]
struct AuthFailure {
    message: String,
    retry_at: Instant,
    step: u32,
}

impl AuthGate {
    /// First step of the auth backoff; doubles up to [`AuthGate::MAX_STEP`].
    pub const FIRST_STEP: Duration = Duration::from_secs(30);
    /// Longest auth backoff step.
    pub const MAX_STEP: Duration = Duration::from_secs(30 * 60);

    /// Fails with the remembered error while the current backoff step lasts.
    pub fn check(&self) -> ProviderResult<()> {
        match &*lock(&self.state) {
            Some(failure) if Instant::now() < failure.retry_at => Err(ProviderError::Auth(failure.message.clone())),
            _ => Ok(()),
        }
    }

    /// Records the outcome of a call that reached the provider.
    pub fn record<T>(&self, result: &ProviderResult<T>) {
        let mut state = lock(&self.state);
        match result {
            Err(ProviderError::Auth(message)) => {
                let step = state.as_ref().map_or(0, |f| f.step + 1);
                let delay = Self::FIRST_STEP.saturating_mul(2u32.saturating_pow(step.min(10))).min(Self::MAX_STEP);
                *state = Some(AuthFailure { message: message.clone(), retry_at: Instant::now() + delay, step });
            }
            Ok(_) => *state = None,
            Err(_) => {}
        }
    }
}

/// Everything a cloud provider needs to call its API politely.
#[derive(Debug)]
pub struct CallGuard {
    /// The account's limiter.
    pub limiter: Arc<RateLimiter>,
    /// The account's auth gate.
    pub auth: AuthGate,
    /// Retries inside the provider.
    pub policy: RetryPolicy,
}

impl CallGuard {
    /// A guard for one account.
    pub fn new(provider_type: &str, account: &str, calls_per_second: u32, policy: RetryPolicy) -> Self {
        CallGuard { limiter: RateLimiter::for_account(provider_type, account, calls_per_second), auth: AuthGate::default(), policy }
    }

    /// Runs `op` once through the limiter and the auth gate, without retrying.
    pub async fn once<T, Fut>(&self, op: impl FnOnce() -> Fut) -> ProviderResult<T>
    where
        Fut: Future<Output = ProviderResult<T>>,
    {
        self.auth.check()?;
        self.limiter.acquire().await;
        let result = op().await;
        if let Err(ProviderError::Throttled { retry_after }) = &result {
            self.limiter.pause_for(*retry_after);
        }
        self.auth.record(&result);
        result
    }

    /// Runs `op` until it succeeds, fails permanently, or the attempts are used up.
    /// `Transient` errors back off with jitter; `Throttled` waits the provider's Retry-After
    /// (holding back the whole account); everything else is returned at once.
    pub async fn retry<T, Fut>(&self, mut op: impl FnMut() -> Fut) -> ProviderResult<T>
    where
        Fut: Future<Output = ProviderResult<T>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self.once(&mut op).await;
            let delay = match &result {
                Err(ProviderError::Transient(_)) => self.policy.backoff(attempt),
                Err(ProviderError::Throttled { retry_after }) if *retry_after <= self.policy.max_retry_after => {
                    // The limiter is paused already; a little jitter spreads the restart.
                    *retry_after + self.policy.backoff(1) / 4
                }
                _ => return result,
            };
            if attempt >= self.policy.max_attempts {
                return result;
            }
            tracing::debug!(attempt, delay_ms = delay.as_millis() as u64, error = ?result.as_ref().err(), "retrying provider call");
            tokio::time::sleep(delay).await;
        }
    }
}

/// Parses an HTTP Retry-After value: delay-seconds or an HTTP-date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// Default wait when a 429/503 carries no Retry-After.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Maps an HTTP status that says "slow down" or "try again" to an error, if it is one.
pub fn classify_status(status: u16, retry_after: Option<&str>, detail: impl FnOnce() -> String) -> Option<ProviderError> {
    match status {
        429 | 503 => Some(ProviderError::Throttled { retry_after: retry_after.and_then(parse_retry_after).unwrap_or(DEFAULT_RETRY_AFTER) }),
        500..=599 => Some(ProviderError::Transient(format!("HTTP {status}: {}", detail()))),
        _ => None,
    }
}

/// Maps a transport failure (connect, reset, timeout, truncated body) to `Transient`.
pub fn transport_error(what: &str, error: &reqwest::Error) -> ProviderError {
    // reqwest's Display names the URL, never headers: no credential can leak through it.
    let mut text = format!("{what}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    ProviderError::Transient(text)
}

/// Replaces every occurrence of a secret in `text` (providers echo request parts in errors).
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(secret, "[redacted]");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn backoff_grows_and_is_bounded() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_ceiling(1), Duration::from_millis(100));
        assert_eq!(p.backoff_ceiling(3), Duration::from_millis(400));
        assert_eq!(p.backoff_ceiling(30), Duration::from_secs(5));
        for attempt in 1..10 {
            let d = p.backoff(attempt);
            assert!(d <= p.backoff_ceiling(attempt) && d >= p.backoff_ceiling(attempt) / 2);
        }
    }

    #[test]
    fn statuses_are_classified() {
        assert!(matches!(
            classify_status(429, Some("2"), String::new),
            Some(ProviderError::Throttled { retry_after }) if retry_after == Duration::from_secs(2)
        ));
        assert!(matches!(classify_status(503, None, String::new), Some(ProviderError::Throttled { .. })));
        assert!(matches!(classify_status(500, None, String::new), Some(ProviderError::Transient(_))));
        assert!(classify_status(400, None, String::new).is_none());
    }

    #[tokio::test]
    async fn auth_failures_cost_one_call_per_step() {
        let guard = CallGuard::new("test", "auth-gate", 1000, RetryPolicy::default());
        let calls = std::sync::atomic::AtomicU32::new(0);
        for _ in 0..5 {
            let r: ProviderResult<()> = guard
                .retry(|| async {
                    calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Err(ProviderError::Auth("denied".into()))
                })
                .await;
            assert!(matches!(r, Err(ProviderError::Auth(_))));
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_a_bounded_number_of_times() {
        let guard = CallGuard::new("test", "transient", 1000, RetryPolicy::default());
        let calls = std::sync::atomic::AtomicU32::new(0);
        let r: ProviderResult<()> = guard
            .retry(|| async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(ProviderError::Transient("boom".into()))
            })
            .await;
        assert!(matches!(r, Err(ProviderError::Transient(_))));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn limiter_spaces_calls() {
        let limiter = RateLimiter::new(10);
        let start = Instant::now();
        for _ in 0..30 {
            limiter.acquire().await;
        }
        // 10 from the burst, 20 more at 10/s.
        assert!(start.elapsed() >= Duration::from_millis(1900), "{:?}", start.elapsed());
    }
}
