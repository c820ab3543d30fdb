//! Sessions: a random id in an HttpOnly, SameSite=Strict cookie maps, on the server only, to
//! the visitor's bearer token and a client that uses it. Tokens never reach a URL, a log line
//! or the HTML; what the browser holds is the session id and a CSRF token for its forms.
//!
//! One-time login codes (as Jupyter prints them) map to a token too and are consumed by their
//! first use.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use secrecy::SecretString;

/// The cookie that carries the session id.
pub const COOKIE: &str = "provisioning_console";

/// How long a session lives without a request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(12 * 3600);

/// How long a one-time login code stays valid.
pub const CODE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Sessions kept in memory at most (each holds a client and a chart history, so unbounded
/// sign-ins would grow without end). At the limit a sign-in ends the least recently used
/// session that has been idle for [`EVICTABLE_AFTER`], and is refused when there is none: one
/// user never signs another one out.
pub const MAX_SESSIONS: usize = 1000;

/// Sessions one owner keeps at most ([`owner`]: the user as the API server names the token's
/// owner, or all ServiceAccounts of a namespace together, since whoever may create them there
/// can mint tokens for any number); a sign-in beyond it ends that owner's least recently used
/// session, never another owner's.
pub const MAX_SESSIONS_PER_USER: usize = 8;

/// How long a session must have gone without a request before another owner's sign-in may end
/// it at [`MAX_SESSIONS`].
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(15 * 60);

/// Points kept per Cluster in the ready-over-time chart.
pub const HISTORY_POINTS: usize = 500;

/// A random 256-bit value as hex (session ids, CSRF tokens, login codes).
pub fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One point of a Cluster's ready-over-time chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadyPoint {
    /// Seconds since the Unix epoch.
    pub at: i64,
    /// Servers ready.
    pub ready: u32,
    /// Servers desired.
    pub desired: u32,
}

/// Whose share of the sessions a user uses: the ServiceAccounts of one namespace count
/// together (`serviceaccounts:<ns>`), any other user by name (`user:<name>`).
pub fn owner(user: &str) -> String {
    match user.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => format!("serviceaccounts:{ns}"),
        _ => format!("user:{user}"),
    }
}

/// A sign-in refused because every kept session is in use (none idle for [`EVICTABLE_AFTER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the console holds its limit of {0} sessions, all in use; try again later")]
pub struct Full(pub usize);

/// One signed-in visitor.
pub struct Session {
    /// The visitor's bearer token (sent only to the API server).
    pub token: SecretString,
    /// A client that authenticates with [`Session::token`].
    pub client: kube::Client,
    /// The token every form of this session carries.
    pub csrf: String,
    /// Who the API server says the token belongs to.
    pub user: String,
    /// Whose share of the sessions this one uses ([`owner`]).
    owner: String,
    last_seen: Mutex<Instant>,
    /// Live streams this session holds open (counted by [`super::live::StreamLimits`]).
    pub streams: Arc<AtomicUsize>,
    /// Ready-over-time per `namespace/cluster`, recorded from what this visitor's pages and
    /// watches saw (in memory only: it starts when the page is first opened).
    history: Mutex<HashMap<String, VecDeque<ReadyPoint>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these maps leaves plain data behind: keep using it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Session {
    /// A session for `token`, whose API client is `client`.
    pub fn new(token: SecretString, client: kube::Client, user: String) -> Session {
        Session {
            token,
            client,
            csrf: random_hex(),
            owner: owner(&user),
            user,
            last_seen: Mutex::new(Instant::now()),
            streams: Arc::new(AtomicUsize::new(0)),
            history: Mutex::new(HashMap::new()),
        }
    }

    /// Records a Cluster's ready count (a point only when it changed) and returns the history.
    pub fn record_ready(&self, cluster: &str, point: ReadyPoint) -> Vec<ReadyPoint> {
        let mut all = lock(&self.history);
        let h = all.entry(cluster.to_string()).or_default();
        if h.back().is_none_or(|last| (last.ready, last.desired) != (point.ready, point.desired)) {
            h.push_back(point);
            while h.len() > HISTORY_POINTS {
                h.pop_front();
            }
        }
        h.iter().copied().collect()
    }
}

/// Sessions and one-time codes of one console.
pub struct Sessions {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    codes: Mutex<HashMap<String, (SecretString, Instant)>>,
    max_sessions: usize,
    max_per_user: usize,
    evictable_after: Duration,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_limits(MAX_SESSIONS, MAX_SESSIONS_PER_USER)
    }
}

impl Sessions {
    /// A store keeping at most `max_sessions` sessions, `max_per_user` of one user (each at
    /// least one).
    pub fn with_limits(max_sessions: usize, max_per_user: usize) -> Sessions {
        Sessions {
            sessions: Mutex::default(),
            codes: Mutex::default(),
            max_sessions: max_sessions.max(1),
            max_per_user: max_per_user.max(1),
            evictable_after: EVICTABLE_AFTER,
        }
    }

    /// The same store, where another owner's sign-in may end a session idle for `idle` (tests).
    pub fn evictable_after(mut self, idle: Duration) -> Sessions {
        self.evictable_after = idle;
        self
    }

    /// Stores `session`, first dropping expired ones, then at the owner's limit that owner's
    /// least recently used session, then at the overall limit the least recently used session
    /// idle for at least [`EVICTABLE_AFTER`]; returns its id (for the cookie), or [`Full`] when
    /// every kept session is in use.
    pub fn insert(&self, session: Session) -> Result<String, Full> {
        let id = random_hex();
        let mut map = lock(&self.sessions);
        map.retain(|_, s| lock(&s.last_seen).elapsed() < IDLE_TIMEOUT);
        loop {
            let own = map.iter().filter(|(_, s)| s.owner == session.owner);
            if own.clone().count() < self.max_per_user {
                break;
            }
            let Some(oldest) = own.min_by_key(|(_, s)| *lock(&s.last_seen)).map(|(k, _)| k.clone()) else { break };
            map.remove(&oldest);
            tracing::info!(
                limit = self.max_per_user,
                "console sessions per user reached: signed out that user's least recently used session"
            );
        }
        while map.len() >= self.max_sessions {
            // The owner's own sessions, and other owners' idle ones, may go.
            let evictable = map
                .iter()
                .map(|(k, s)| (k, s.owner == session.owner, *lock(&s.last_seen)))
                .filter(|(_, own, seen)| *own || seen.elapsed() >= self.evictable_after);
            let Some(oldest) = evictable.min_by_key(|(_, _, seen)| *seen).map(|(k, _, _)| k.clone()) else {
                tracing::warn!(limit = self.max_sessions, "console session limit reached, every session in use: sign-in refused");
                return Err(Full(self.max_sessions));
            };
            map.remove(&oldest);
            tracing::info!(limit = self.max_sessions, "console session limit reached: signed out the least recently used idle session");
        }
        map.insert(id.clone(), Arc::new(session));
        Ok(id)
    }

    /// Whether the session `id` is still kept (a live stream of an ended session stops).
    pub fn contains(&self, id: &str) -> bool {
        lock(&self.sessions).contains_key(id)
    }

    /// Sessions kept now.
    pub fn len(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live session with `id`, marking it used.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = lock(&self.sessions);
        let session = map.get(id)?.clone();
        let mut seen = lock(&session.last_seen);
        if seen.elapsed() >= IDLE_TIMEOUT {
            drop(seen);
            map.remove(id);
            return None;
        }
        *seen = Instant::now();
        drop(seen);
        Some(session)
    }

    /// Ends the session `id` (logout, or the API server no longer accepts its token).
    pub fn remove(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// A new one-time code that [`Sessions::redeem`] exchanges for `token`, once.
    pub fn issue_code(&self, token: SecretString) -> String {
        let code = random_hex();
        let mut codes = lock(&self.codes);
        codes.retain(|_, (_, at)| at.elapsed() < CODE_TTL);
        codes.insert(code.clone(), (token, Instant::now()));
        code
    }

    /// The token behind `code`; the code is gone afterwards, whatever the outcome.
    pub fn redeem(&self, code: &str) -> Option<SecretString> {
        let (token, at) = lock(&self.codes).remove(code)?;
        (at.elapsed() < CODE_TTL).then_some(token)
    }
}

/// The session id in a `Cookie` header, if any.
pub fn cookie_value(header: &str) -> Option<&str> {
    header.split(';').filter_map(|kv| kv.trim().split_once('=')).find(|(k, _)| *k == COOKIE).map(|(_, v)| v)
}

/// The `Set-Cookie` value that stores `id` (HttpOnly, Secure, SameSite=Strict).
pub fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={}", IDLE_TIMEOUT.as_secs())
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_single_use() {
        let s = Sessions::default();
        let code = s.issue_code(SecretString::from("t0ken"));
        assert!(s.redeem("nope").is_none());
        assert!(s.redeem(&code).is_some());
        assert!(s.redeem(&code).is_none(), "a code works once");
    }

    #[tokio::test]
    async fn sessions_are_bounded_and_the_least_recently_used_goes_first() -> anyhow::Result<()> {
        // A client that is never used: building one needs a runtime, not a server.
        let client = kube::Client::try_from(kube::Config::new("https://127.0.0.1:9".parse()?))?;
        let new = || Session::new(SecretString::from("t0ken"), client.clone(), "u".into());
        let s = Sessions::with_limits(3, 3);
        let mut ids = vec![];
        for _ in 0..3 {
            ids.push(s.insert(new())?);
            std::thread::sleep(Duration::from_millis(2));
        }
        let [a, b, c] = <[String; 3]>::try_from(ids).map_err(|_| anyhow::anyhow!("three ids"))?;
        assert_eq!(s.len(), 3);
        // `a` is used again, so `b` is now the least recently used.
        std::thread::sleep(Duration::from_millis(5));
        assert!(s.get(&a).is_some());
        let d = s.insert(new())?;
        assert_eq!(s.len(), 3, "the limit holds");
        assert!(s.get(&b).is_none(), "the least recently used session was evicted");
        for kept in [&a, &c, &d] {
            assert!(s.get(kept).is_some());
        }
        for _ in 0..10 {
            s.insert(new())?;
        }
        assert_eq!(s.len(), 3);
        assert_eq!(Sessions::default().max_sessions, MAX_SESSIONS);
        Ok(())
    }

    #[tokio::test]
    async fn one_user_signing_in_again_and_again_signs_out_only_their_own_sessions() -> anyhow::Result<()> {
        let client = kube::Client::try_from(kube::Config::new("https://127.0.0.1:9".parse()?))?;
        let new = |user: &str| Session::new(SecretString::from("t0ken"), client.clone(), user.into());
        let s = Sessions::with_limits(4, 2);
        let alice = s.insert(new("alice"))?;
        let bob = s.insert(new("bob"))?;
        for _ in 0..20 {
            s.insert(new("mallory"))?;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(s.contains(&alice) && s.contains(&bob), "other users' sessions are kept");
        assert_eq!(s.len(), 4, "alice, bob and mallory's newest two");
        Ok(())
    }

    #[tokio::test]
    async fn many_service_account_tokens_do_not_sign_other_users_out() -> anyhow::Result<()> {
        // Issue 26: a user with many ServiceAccount tokens (each a user name of its own) signed
        // every other user out through the global LRU by signing in again and again.
        let client = kube::Client::try_from(kube::Config::new("https://127.0.0.1:9".parse()?))?;
        let new = |user: &str| Session::new(SecretString::from("t0ken"), client.clone(), user.into());
        let s = Sessions::with_limits(4, 2);
        let alice = s.insert(new("alice"))?;
        let bob = s.insert(new("system:serviceaccount:b:viewer"))?;
        for i in 0..20 {
            s.insert(new(&format!("system:serviceaccount:evil:minted-{i}")))?;
        }
        assert!(s.contains(&alice) && s.contains(&bob), "one namespace's ServiceAccounts are one owner");
        assert_eq!(s.len(), 4);
        // Owners of their own (other namespaces) at the overall limit: refused, nobody signed out.
        let full = s.insert(new("system:serviceaccount:evil-2:sa")).err();
        assert_eq!(full, Some(Full(4)));
        assert!(full.is_some_and(|f| f.to_string().contains("limit of 4 sessions")));
        assert!(s.contains(&alice) && s.contains(&bob) && s.len() == 4);
        assert_eq!(owner("system:serviceaccount:evil:x"), "serviceaccounts:evil");
        assert_eq!(owner("system:serviceaccount:evil"), "user:system:serviceaccount:evil");
        assert_eq!(owner("alice"), "user:alice");
        Ok(())
    }

    #[tokio::test]
    async fn at_the_limit_only_idle_sessions_of_other_users_are_ended() -> anyhow::Result<()> {
        let client = kube::Client::try_from(kube::Config::new("https://127.0.0.1:9".parse()?))?;
        let new = |user: &str| Session::new(SecretString::from("t0ken"), client.clone(), user.into());
        let s = Sessions::with_limits(2, 2).evictable_after(Duration::from_millis(300));
        let alice = s.insert(new("alice"))?;
        std::thread::sleep(Duration::from_millis(350));
        let bob = s.insert(new("bob"))?;
        // alice has been idle past the threshold, bob has not: carol's sign-in ends alice's.
        let carol = s.insert(new("carol"))?;
        assert!(!s.contains(&alice) && s.contains(&bob) && s.contains(&carol));
        assert_eq!(s.insert(new("dave")).err(), Some(Full(2)), "bob and carol are in use");
        // A user at the overall limit may still replace their own session.
        let carol2 = s.insert(new("carol"))?;
        assert!(s.contains(&bob) && s.contains(&carol2) && !s.contains(&carol));
        Ok(())
    }

    #[test]
    fn cookies_parse_and_carry_the_safe_attributes() {
        assert_eq!(cookie_value("a=b; provisioning_console=abc; c=d"), Some("abc"));
        assert_eq!(cookie_value("a=b"), None);
        let c = set_cookie("x");
        for attr in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(c.contains(attr), "{c}");
        }
        assert!(constant_time_eq("abc", "abc") && !constant_time_eq("abc", "abd") && !constant_time_eq("abc", "ab"));
    }
}
