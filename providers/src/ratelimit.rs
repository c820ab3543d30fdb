//! Per-account rate limiting, retries with jittered exponential backoff, Retry-After
//! handling and the authentication gate shared by the cloud providers (aws, upcloud).
//!
//! One [`RateLimiter`] exists per provider account *as the cloud sees it* — an [`AccountKey`]
//! made of the provider type, the API endpoint, the scope the cloud meters by (the AWS
//! region) and the principal it authenticates (the AWS access key id, the UpCloud API user),
//! never the account name a tenant chose in its Workspace. So two tenants (or two Workspaces)
//! using the same cloud credentials share one limiter, and two different cloud accounts never
//! do: a throttled account never delays another. The registry of limiters is process-wide;
//! every provider object built for an account gets the same limiter.
//!
//! A limiter holds, per account:
//! - token buckets ([`Buckets`]): one for every call, or one per API action shaped by the
//!   action's category (Amazon EC2 meters each API action in its own bucket);
//! - a cap on calls in flight at once ([`AccountLimits::max_in_flight`]);
//! - an account-wide pause, set when the provider answers 429 / RequestLimitExceeded with a
//!   Retry-After hint, during which no call of the account is sent.
//!
//! The [`AuthGate`] remembers rejected credentials: while its backoff step lasts, calls
//! fail without touching the network, so bad credentials cost at most one call per step.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use rand::Rng;
use sha2::Digest as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::{ProviderError, ProviderResult};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section below leaves the state consistent, so a poisoned lock is usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The shape of one token bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketSpec {
    /// Tokens when full: the burst allowed after a quiet spell.
    pub capacity: f64,
    /// Tokens added per second: the sustained call rate.
    pub refill_per_second: f64,
}

impl BucketSpec {
    /// A bucket of `capacity` tokens refilled at `refill_per_second`.
    pub const fn new(capacity: f64, refill_per_second: f64) -> Self {
        BucketSpec { capacity, refill_per_second }
    }

    /// `calls_per_second` (at least 1) with a burst of one second's worth.
    pub fn per_second(calls_per_second: u32) -> Self {
        let rate = f64::from(calls_per_second.max(1));
        BucketSpec { capacity: rate, refill_per_second: rate }
    }

    fn sane(self) -> Self {
        // Never a bucket that cannot hold one token or never refills.
        BucketSpec { capacity: self.capacity.max(1.0), refill_per_second: self.refill_per_second.max(0.001) }
    }
}

/// How an account's calls map to token buckets.
#[derive(Clone, Copy, Debug)]
pub enum Buckets {
    /// One bucket for every call of the account.
    Account(BucketSpec),
    /// One bucket per API action, shaped by `shape(action)` (the action's category);
    /// `name` identifies the classification (two `PerAction` with one name are equal).
    PerAction {
        /// Names the classification.
        name: &'static str,
        /// The bucket shape of an action.
        shape: fn(&str) -> BucketSpec,
    },
}

impl PartialEq for Buckets {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Buckets::Account(a), Buckets::Account(b)) => a == b,
            (Buckets::PerAction { name: a, .. }, Buckets::PerAction { name: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// The limits of one provider account.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AccountLimits {
    /// The token buckets calls take a token from.
    pub buckets: Buckets,
    /// Calls of the account in flight at once, at most (at least 1).
    pub max_in_flight: usize,
}

/// What identifies one provider account to the cloud's limits: provider type, API endpoint,
/// metering scope (AWS region; empty where the cloud meters account-wide) and the
/// authenticated principal. The principal is kept only as a digest, so the key never holds
/// a credential and can be logged.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct AccountKey(String);

impl AccountKey {
    /// The key of the account authenticated as `principal` at `endpoint` within `scope`.
    pub fn new(provider_type: &str, endpoint: &str, scope: &str, principal: &str) -> Self {
        let digest = sha2::Sha256::digest(principal.as_bytes());
        let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let endpoint = endpoint.trim_end_matches('/');
        AccountKey(format!("{provider_type}|{endpoint}|{scope}|{short}"))
    }

    /// The key as text (no credential in it).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The limiter of one provider account: token buckets, an in-flight cap and a pause.
pub struct RateLimiter {
    key: AccountKey,
    state: Mutex<LimiterState>,
    in_flight: Mutex<Arc<Semaphore>>,
}

struct LimiterState {
    limits: AccountLimits,
    buckets: HashMap<String, Bucket>,
    paused_until: Option<Instant>,
}

struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter").field("key", &self.key).field("limits", &self.limits()).finish_non_exhaustive()
    }
}

/// A call slot: the call counts as in flight until this is dropped.
#[derive(Debug)]
pub struct CallPermit {
    _permit: Option<OwnedSemaphorePermit>,
}

static LIMITERS: LazyLock<Mutex<HashMap<AccountKey, Weak<RateLimiter>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

impl RateLimiter {
    /// A limiter of its own (not shared through the registry).
    pub fn new(key: AccountKey, limits: AccountLimits) -> Self {
        let limits = AccountLimits { max_in_flight: limits.max_in_flight.max(1), ..limits };
        RateLimiter {
            key,
            state: Mutex::new(LimiterState { limits, buckets: HashMap::new(), paused_until: None }),
            in_flight: Mutex::new(Arc::new(Semaphore::new(limits.max_in_flight))),
        }
    }

    /// The limiter of one provider account, shared by every provider object built for it
    /// while any of them lives. Changed limits (an operator raised the account's rate) are
    /// applied in place: the pause and the buckets' tokens carry over.
    pub fn for_account(key: AccountKey, limits: AccountLimits) -> Arc<RateLimiter> {
        let mut limiters = lock(&LIMITERS);
        limiters.retain(|_, limiter| limiter.strong_count() > 0);
        if let Some(existing) = limiters.get(&key).and_then(Weak::upgrade) {
            existing.reconfigure(limits);
            return existing;
        }
        let limiter = Arc::new(RateLimiter::new(key.clone(), limits));
        limiters.insert(key, Arc::downgrade(&limiter));
        limiter
    }

    /// The account this limiter serves.
    pub fn key(&self) -> &AccountKey {
        &self.key
    }

    /// The limits in force.
    pub fn limits(&self) -> AccountLimits {
        lock(&self.state).limits
    }

    fn reconfigure(&self, limits: AccountLimits) {
        let limits = AccountLimits { max_in_flight: limits.max_in_flight.max(1), ..limits };
        let mut state = lock(&self.state);
        if state.limits == limits {
            return;
        }
        tracing::debug!(account = ?self.key, ?limits, "provider account limits changed");
        if state.limits.max_in_flight != limits.max_in_flight {
            // Calls holding a slot of the old semaphore finish on it; new calls use the new cap.
            *lock(&self.in_flight) = Arc::new(Semaphore::new(limits.max_in_flight));
        }
        if state.limits.buckets != limits.buckets {
            state.buckets.clear();
        }
        state.limits = limits;
    }

    /// Calls of the account in flight now.
    pub fn in_flight(&self) -> usize {
        let max = lock(&self.state).limits.max_in_flight;
        max.saturating_sub(lock(&self.in_flight).available_permits())
    }

    /// Waits for a call slot for `action`: a free in-flight slot first, then (while the
    /// account is not paused) a token from the action's bucket. The call counts as in
    /// flight until the returned permit is dropped.
    pub async fn acquire(&self, action: &str) -> CallPermit {
        let semaphore = lock(&self.in_flight).clone();
        // The semaphore is never closed; a closed one would only mean "no cap".
        let permit = semaphore.acquire_owned().await.ok();
        self.take_token(action).await;
        CallPermit { _permit: permit }
    }

    async fn take_token(&self, action: &str) {
        loop {
            let wait = {
                let mut state = lock(&self.state);
                let now = Instant::now();
                match state.paused_until {
                    Some(until) if until > now => until - now,
                    _ => {
                        state.paused_until = None;
                        let (name, spec) = match state.limits.buckets {
                            Buckets::Account(spec) => (String::new(), spec.sane()),
                            Buckets::PerAction { shape, .. } => (action.to_string(), shape(action).sane()),
                        };
                        let bucket = state.buckets.entry(name).or_insert(Bucket { tokens: spec.capacity, refilled_at: now });
                        let elapsed = now.saturating_duration_since(bucket.refilled_at).as_secs_f64();
                        bucket.tokens = (bucket.tokens + elapsed * spec.refill_per_second).min(spec.capacity);
                        bucket.refilled_at = now;
                        if bucket.tokens >= 1.0 {
                            bucket.tokens -= 1.0;
                            return;
                        }
                        Duration::from_secs_f64((1.0 - bucket.tokens) / spec.refill_per_second)
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

    /// When the account's pause ends, if it is paused.
    pub fn paused_until(&self) -> Option<Instant> {
        lock(&self.state).paused_until.filter(|until| *until > Instant::now())
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

    /// How long to wait before attempt `attempt + 1` after `error`, or `None` when the error
    /// goes back to the caller: `Transient` backs off with jitter; `Throttled` waits the
    /// provider's Retry-After (plus a little jitter to spread the restart) or the exponential
    /// backoff when that is longer (EC2 sends no hint: repeated RequestLimitExceeded back off
    /// further each time); a hint longer than `max_retry_after`, and everything else, is
    /// returned.
    pub fn retry_delay(&self, error: &ProviderError, attempt: u32) -> Option<Duration> {
        match error {
            ProviderError::Transient(_) => Some(self.backoff(attempt)),
            ProviderError::Throttled { retry_after } if *retry_after <= self.max_retry_after => {
                Some((*retry_after + self.backoff(1) / 4).max(self.backoff(attempt)))
            }
            _ => None,
        }
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
    /// A guard for one account (its limiter shared with every other guard of the account).
    pub fn new(key: AccountKey, limits: AccountLimits, policy: RetryPolicy) -> Self {
        CallGuard { limiter: RateLimiter::for_account(key, limits), auth: AuthGate::default(), policy }
    }

    /// Runs `op` (the API action `action`) once through the limiter and the auth gate,
    /// without retrying. While the account is paused for longer than the policy's
    /// `max_retry_after`, fails with `Throttled` (the time left) without calling.
    pub async fn once<T, Fut>(&self, action: &str, op: impl FnOnce() -> Fut) -> ProviderResult<T>
    where
        Fut: Future<Output = ProviderResult<T>>,
    {
        self.auth.check()?;
        // A pause longer than this guard waits through goes back to the caller at once (its
        // requeue honours it) instead of holding the caller for minutes.
        if let Some(until) = self.limiter.paused_until() {
            let remaining = until.saturating_duration_since(Instant::now());
            if remaining > self.policy.max_retry_after {
                return Err(ProviderError::Throttled { retry_after: remaining });
            }
        }
        let permit = self.limiter.acquire(action).await;
        let result = op().await;
        drop(permit);
        if let Err(ProviderError::Throttled { retry_after }) = &result {
            tracing::debug!(account = ?self.limiter.key(), action, retry_after_ms = retry_after.as_millis() as u64, "provider throttled the account");
            self.limiter.pause_for(*retry_after);
        }
        self.auth.record(&result);
        result
    }

    /// Runs `op` (the API action `action`) until it succeeds, fails permanently, or the
    /// attempts are used up, waiting [`RetryPolicy::retry_delay`] between attempts (a
    /// `Throttled` answer also holds back the whole account: see [`CallGuard::once`]).
    pub async fn retry<T, Fut>(&self, action: &str, mut op: impl FnMut() -> Fut) -> ProviderResult<T>
    where
        Fut: Future<Output = ProviderResult<T>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self.once(action, &mut op).await;
            let Some(delay) = result.as_ref().err().and_then(|e| self.policy.retry_delay(e, attempt)) else {
                return result;
            };
            if attempt >= self.policy.max_attempts {
                return result;
            }
            tracing::debug!(attempt, action, delay_ms = delay.as_millis() as u64, error = ?result.as_ref().err(), "retrying provider call");
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

/// Most bytes of a cloud API answer read (EC2 pages, all pages of one DescribeInstances
/// together, UpCloud lists): an endpoint (which a Workspace may point anywhere) that sends
/// more is refused, not buffered. About 1,500 EC2 instances, or 8,000 UpCloud servers.
pub const MAX_ANSWER: usize = 8 << 20;
/// Most bytes of the answers to a look-up of one machine (by id or by its Server's uid tag):
/// a few machines' worth; anything larger is refused before it is parsed.
pub const LOOKUP_CAP: usize = 256 << 10;

/// Most bytes of an error answer's text kept for its classification and message.
pub const MAX_ERROR_TEXT: usize = 16 << 10;

/// Reads an answer's body as text, refusing one over `cap` bytes (checked as it arrives, and
/// up front when the length is announced) with a `Transient` error naming the cap.
pub async fn text_capped(mut response: reqwest::Response, cap: usize, what: &str, source: &AnswerSource) -> ProviderResult<String> {
    // Not worth retrying: no real answer of these APIs comes near the cap.
    let too_large = || ProviderError::Permanent(format!("{what}: the answer is larger than {} KiB; refused", cap >> 10));
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    // Answers being read hold at most a budget, charged by the bytes read so far (not by
    // chunk); a reader that finds no room fails at once (Transient, retried) rather than wait
    // while holding what it has. Answers of a provider's public endpoint and of endpoints a
    // Workspace names have budgets of their own, and each tenant holds at most a share of the
    // latter: one hostile endpoint fills neither the public budget nor other tenants' room.
    let mut charge = AnswerCharge::new(source.clone());
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_error(&format!("{what} response"), &e))? {
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        charge.grow(body.len() + chunk.len()).map_err(|full| {
            ProviderError::Transient(match full {
                Full::Share => format!(
                    "{what}: this namespace's other answers from its own endpoints fill its share of the controller's budget; trying again"
                ),
                Full::Budget => format!("{what}: other provider answers fill the controller's budget; trying again"),
            })
        })?;
        body.extend_from_slice(&chunk);
    }
    // Refused rather than converted: a lossy conversion triples invalid bytes.
    String::from_utf8(body).map_err(|_| ProviderError::Permanent(format!("{what}: the answer is not UTF-8 text; refused")))
}

/// Whose answer is being read, for the budgets of [`text_capped`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerSource {
    /// A provider's own public endpoint (or one the controller's config names).
    Public,
    /// An endpoint a Workspace names, used by this tenant (its namespace).
    Tenant(String),
}

impl AnswerSource {
    /// The source of answers to calls made for `config` at its account endpoint.
    pub fn of(config: &crate::ProviderConfig) -> Self {
        if config.endpoint.is_empty() { AnswerSource::Public } else { AnswerSource::Tenant(config.tenant.clone()) }
    }
}

/// Whether `value`, taken from a cloud API's answer, is at most `max` bytes of the characters
/// `allowed` accepts (ids, tokens and names are checked before they are kept or sent again).
pub fn well_formed(value: &str, max: usize, allowed: impl Fn(char) -> bool) -> bool {
    !value.is_empty() && value.len() <= max && value.chars().all(allowed)
}

/// Answers of public endpoints being read at once, all accounts together (in KiB).
static PUBLIC_BUDGET: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(BUDGET_KIB as usize);
/// Answers of endpoints Workspaces name being read at once, all tenants together (in KiB).
static TENANT_BUDGET: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(BUDGET_KIB as usize);
/// Each budget: 32 MiB.
const BUDGET_KIB: u32 = 32 << 10;
/// Bytes of each answer read without charging a budget.
const FREE_ANSWER: usize = 64 << 10;
/// What the answers of one tenant's own endpoints may hold of [`TENANT_BUDGET`] at once, in
/// KiB: one answer of [`MAX_ANSWER`]. Filling the budget takes four tenants' endpoints.
const TENANT_SHARE_KIB: u32 = 8 << 10;
/// KiB of [`TENANT_BUDGET`] held per tenant.
static TENANT_HELD: LazyLock<Mutex<HashMap<String, u32>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// KiB of the budget of `source`'s kind held by answers being read now (for tests, metrics).
pub fn answers_held_kib(source: &AnswerSource) -> u32 {
    let budget = match source {
        AnswerSource::Public => &PUBLIC_BUDGET,
        AnswerSource::Tenant(_) => &TENANT_BUDGET,
    };
    BUDGET_KIB.saturating_sub(u32::try_from(budget.available_permits()).unwrap_or(u32::MAX))
}

/// Which limit an answer being read ran into.
#[derive(Debug, PartialEq)]
enum Full {
    /// Its tenant's share of the budget.
    Share,
    /// The budget, all together.
    Budget,
}

/// What one answer being read holds of its budget (and of its tenant's share); given back
/// when dropped.
struct AnswerCharge {
    source: AnswerSource,
    kib: u32,
    held: Option<tokio::sync::SemaphorePermit<'static>>,
}

impl AnswerCharge {
    fn new(source: AnswerSource) -> Self {
        AnswerCharge { source, kib: 0, held: None }
    }

    /// Charges the answer for `read` bytes read so far (the first [`FREE_ANSWER`] are free).
    fn grow(&mut self, read: usize) -> Result<(), Full> {
        let due = u32::try_from(read.saturating_sub(FREE_ANSWER).div_ceil(1024)).unwrap_or(u32::MAX);
        if due <= self.kib {
            return Ok(());
        }
        let more = due - self.kib;
        let permit = match &self.source {
            AnswerSource::Public => PUBLIC_BUDGET.try_acquire_many(more).map_err(|_| Full::Budget)?,
            AnswerSource::Tenant(tenant) => {
                let mut shares = lock(&TENANT_HELD);
                let held = shares.get(tenant).copied().unwrap_or(0);
                if held.saturating_add(more) > TENANT_SHARE_KIB {
                    return Err(Full::Share);
                }
                let permit = TENANT_BUDGET.try_acquire_many(more).map_err(|_| Full::Budget)?;
                shares.insert(tenant.clone(), held + more);
                permit
            }
        };
        match self.held.as_mut() {
            Some(h) => h.merge(permit),
            None => self.held = Some(permit),
        }
        self.kib = due;
        Ok(())
    }
}

impl Drop for AnswerCharge {
    fn drop(&mut self) {
        let AnswerSource::Tenant(tenant) = &self.source else { return };
        if self.kib == 0 {
            return;
        }
        let mut shares = lock(&TENANT_HELD);
        if let Some(held) = shares.get_mut(tenant) {
            *held = held.saturating_sub(self.kib);
            if *held == 0 {
                shares.remove(tenant);
            }
        }
    }
}

/// The first [`MAX_ERROR_TEXT`] bytes of an error answer (on a character boundary).
pub fn error_text(text: &str) -> &str {
    let mut end = text.len().min(MAX_ERROR_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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
    fn one_tenant_holds_at_most_its_share_of_the_answer_budget_and_gives_it_back() {
        let tenant = |t: &str| AnswerSource::Tenant(format!("test-share-{t}"));
        let mut first = AnswerCharge::new(tenant("a"));
        // One answer of the largest size fits in a tenant's share.
        assert_eq!(first.grow(MAX_ANSWER), Ok(()));
        let mut second = AnswerCharge::new(tenant("a"));
        assert_eq!(second.grow(FREE_ANSWER), Ok(()), "the first 64 KiB of an answer are free");
        assert_eq!(second.grow(FREE_ANSWER + (128 << 10)), Err(Full::Share), "a second large answer of one tenant");
        let mut other = AnswerCharge::new(tenant("b"));
        assert_eq!(other.grow(1 << 20), Ok(()), "another tenant is not held back");
        let mut public = AnswerCharge::new(AnswerSource::Public);
        assert_eq!(public.grow(MAX_ANSWER), Ok(()), "public endpoints' answers have their own budget");
        drop(first);
        assert_eq!(second.grow(2 << 20), Ok(()), "the share comes back when an answer is done");
        drop((second, other, public));
        assert!(!lock(&TENANT_HELD).keys().any(|k| k.starts_with("test-share")), "nothing stays charged");
    }

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
        let guard = CallGuard::new(key("auth-gate"), limits(1000, 8), RetryPolicy::default());
        let calls = std::sync::atomic::AtomicU32::new(0);
        for _ in 0..5 {
            let r: ProviderResult<()> = guard
                .retry("Call", || async {
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
        let guard = CallGuard::new(key("transient"), limits(1000, 8), RetryPolicy::default());
        let calls = std::sync::atomic::AtomicU32::new(0);
        let r: ProviderResult<()> = guard
            .retry("Call", || async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(ProviderError::Transient("boom".into()))
            })
            .await;
        assert!(matches!(r, Err(ProviderError::Transient(_))));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn limiter_spaces_calls() {
        let limiter = RateLimiter::new(key("spaces"), limits(10, 8));
        let start = Instant::now();
        for _ in 0..30 {
            drop(limiter.acquire("Call").await);
        }
        // 10 from the burst, 20 more at 10/s.
        assert!(start.elapsed() >= Duration::from_millis(1900), "{:?}", start.elapsed());
    }

    fn key(principal: &str) -> AccountKey {
        AccountKey::new("test", "http://127.0.0.1:1/", "", principal)
    }

    fn limits(calls_per_second: u32, max_in_flight: usize) -> AccountLimits {
        AccountLimits { buckets: Buckets::Account(BucketSpec::per_second(calls_per_second)), max_in_flight }
    }

    fn by_verb(action: &str) -> BucketSpec {
        if action.starts_with("Describe") { BucketSpec::new(100.0, 20.0) } else { BucketSpec::new(50.0, 5.0) }
    }

    #[tokio::test(start_paused = true)]
    async fn each_action_has_its_own_bucket_of_its_category() {
        let limiter = RateLimiter::new(
            key("per-action"),
            AccountLimits { buckets: Buckets::PerAction { name: "by-verb", shape: by_verb }, max_in_flight: 1000 },
        );
        let start = Instant::now();
        for _ in 0..50 {
            drop(limiter.acquire("RunInstances").await);
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the mutating burst is 50");
        // RunInstances' bucket is empty: neither another action of the category nor a
        // Describe waits for it.
        for _ in 0..50 {
            drop(limiter.acquire("TerminateInstances").await);
        }
        for _ in 0..100 {
            drop(limiter.acquire("DescribeInstances").await);
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "other actions have buckets of their own");
        // The 51st RunInstances waits for a refill at 5 per second: 10 more take 2 s.
        for _ in 0..10 {
            drop(limiter.acquire("RunInstances").await);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // The 101st DescribeInstances refills at 20 per second (2 s elapsed: 40 are back).
        for _ in 0..60 {
            drop(limiter.acquire("DescribeInstances").await);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn calls_in_flight_never_exceed_the_cap() {
        let limiter = Arc::new(RateLimiter::new(key("in-flight"), limits(1000, 3)));
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let max_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..12 {
            let (limiter, held, max_seen) = (limiter.clone(), held.clone(), max_seen.clone());
            tasks.push(tokio::spawn(async move {
                let permit = limiter.acquire("Call").await;
                let now = held.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                max_seen.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                drop(permit);
            }));
        }
        for task in tasks {
            assert!(task.await.is_ok());
        }
        assert_eq!(max_seen.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(limiter.in_flight(), 0);
    }

    #[test]
    fn the_key_is_the_cloud_account_not_the_chosen_name() {
        let a = AccountKey::new("aws", "https://ec2.eu-north-1.amazonaws.com/", "eu-north-1", "AKIAONE");
        assert_eq!(a, AccountKey::new("aws", "https://ec2.eu-north-1.amazonaws.com", "eu-north-1", "AKIAONE"));
        assert_ne!(a, AccountKey::new("aws", "https://ec2.eu-north-1.amazonaws.com/", "eu-north-1", "AKIATWO"));
        assert_ne!(a, AccountKey::new("aws", "https://ec2.eu-west-1.amazonaws.com/", "eu-west-1", "AKIAONE"));
        assert!(!format!("{a:?}").contains("AKIAONE"), "the principal is kept as a digest only");
    }

    #[tokio::test]
    async fn one_limiter_per_account_and_changed_limits_keep_the_pause() {
        let first = RateLimiter::for_account(key("shared"), limits(10, 4));
        first.pause_for(Duration::from_secs(60));
        let second = RateLimiter::for_account(key("shared"), limits(20, 8));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(second.limits(), limits(20, 8));
        assert!(second.paused_until().is_some(), "a new configuration does not lift the provider's pause");
        let other = RateLimiter::for_account(key("someone-else"), limits(20, 8));
        assert!(!Arc::ptr_eq(&first, &other));
        assert!(other.paused_until().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_without_a_hint_backs_off_further_each_time() {
        let policy = RetryPolicy { base_delay: Duration::from_secs(1), max_delay: Duration::from_secs(30), ..RetryPolicy::default() };
        let guard = CallGuard::new(key("no-hint"), limits(1000, 8), policy);
        let calls = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let r: ProviderResult<()> = guard
            .retry("Call", || {
                let calls = calls.clone();
                async move {
                    lock(&calls).push(start.elapsed());
                    Err(ProviderError::Throttled { retry_after: DEFAULT_RETRY_AFTER })
                }
            })
            .await;
        assert!(matches!(r, Err(ProviderError::Throttled { .. })));
        let calls = lock(&calls).clone();
        assert_eq!(calls.len(), 6);
        let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
        // Never sooner than the hint; later gaps follow the exponential backoff (the fifth:
        // ceiling 16 s, at least half of it).
        assert!(gaps.iter().all(|g| *g >= DEFAULT_RETRY_AFTER), "{gaps:?}");
        assert!(gaps[4] >= Duration::from_secs(8), "{gaps:?}");
    }
}
