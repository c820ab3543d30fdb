//! What keeps an exposed console answering: a cap on connections (overall and per peer
//! address, closing the longest-idle keep-alive connection for a new one), timeouts for a
//! request's headers and body and for idle connections, and a per-peer rate limit on sign-in
//! attempts (each one asks the API server who a token belongs to).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Open connections at most; at the cap the longest-idle one is closed for a new one.
pub const MAX_CONNECTIONS: usize = 512;
/// Open connections from one peer address at most (a browser opens about 6 per tab set; an
/// office behind one NAT address shares this).
pub const MAX_CONNECTIONS_PER_PEER: usize = 128;
/// A connection without a request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A request's headers must arrive within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A form's body must arrive within this once its headers have (408 after).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Sign-in attempts one peer may make at once…
pub const SIGN_IN_BURST: u32 = 10;
/// …and then one per this long (10 a minute).
pub const SIGN_IN_INTERVAL: Duration = Duration::from_secs(6);
/// Peers whose sign-in attempts are remembered at most (the least recently seen is forgotten).
pub const SIGN_IN_PEERS: usize = 10_000;

/// The limits of one console.
#[derive(Clone, Debug)]
pub struct ConsoleLimits {
    /// See [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// See [`MAX_CONNECTIONS_PER_PEER`].
    pub max_connections_per_peer: usize,
    /// See [`IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`BODY_READ_TIMEOUT`].
    pub body_read_timeout: Duration,
    /// See [`SIGN_IN_BURST`].
    pub sign_in_burst: u32,
    /// See [`SIGN_IN_INTERVAL`].
    pub sign_in_interval: Duration,
}

impl Default for ConsoleLimits {
    fn default() -> Self {
        ConsoleLimits {
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            idle_timeout: IDLE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            body_read_timeout: BODY_READ_TIMEOUT,
            sign_in_burst: SIGN_IN_BURST,
            sign_in_interval: SIGN_IN_INTERVAL,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain counters: a panic elsewhere while holding them leaves them usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Who a peer is for the limits: an IPv4 address (also when mapped into IPv6), or the /64 of
/// an IPv6 address (one host usually holds a whole /64, so counting single addresses would
/// let it rotate through them).
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Sign-in attempts per peer as token buckets: [`ConsoleLimits::sign_in_burst`] at once,
/// then one per [`ConsoleLimits::sign_in_interval`].
pub struct SignInLimiter {
    burst: f64,
    interval: Duration,
    peers: Mutex<HashMap<IpAddr, Bucket>>,
}

impl SignInLimiter {
    /// A limiter of `burst` attempts, refilled one per `interval`.
    pub fn new(burst: u32, interval: Duration) -> SignInLimiter {
        SignInLimiter { burst: f64::from(burst.max(1)), interval: interval.max(Duration::from_millis(1)), peers: Mutex::default() }
    }

    /// Takes one attempt of `peer`; when it has none left, how long until it has one.
    pub fn attempt(&self, peer: IpAddr) -> Result<(), Duration> {
        let key = peer_key(peer);
        let now = Instant::now();
        let mut peers = lock(&self.peers);
        if !peers.contains_key(&key) && peers.len() >= SIGN_IN_PEERS {
            // A full bucket is the same as none; else forget the peer seen least recently.
            let full = self.burst;
            let interval = self.interval;
            peers.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() / interval.as_secs_f64() < full);
            if peers.len() >= SIGN_IN_PEERS
                && let Some(oldest) = peers.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k)
            {
                peers.remove(&oldest);
            }
        }
        let b = peers.entry(key).or_insert(Bucket { tokens: self.burst, at: now });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() / self.interval.as_secs_f64()).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(self.interval.mul_f64(1.0 - b.tokens))
    }
}

/// One open connection: whether a request is in flight, since when it is idle, and the token
/// that closes it.
pub struct Conn {
    id: u64,
    peer: IpAddr,
    busy: AtomicUsize,
    idle_since_ms: AtomicU64,
    /// Cancelled to close the connection (idle, evicted at a cap, shutdown).
    pub close: CancellationToken,
    table: Arc<Connections>,
}

/// The open connections of one console.
pub struct Connections {
    max: usize,
    per_peer: usize,
    started: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Connections {
    /// A table holding at most `max` connections, `per_peer` of one peer.
    pub fn new(max: usize, per_peer: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max: max.max(1),
            per_peer: per_peer.max(1),
            started: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::default(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Registers a new connection from `peer`, first closing the longest-idle connection of
    /// that peer (at its cap) or of anyone (at the overall cap); None when the connections that
    /// would have to go are all busy. The connection leaves the table when its [`ConnGuard`]
    /// is dropped.
    pub fn open(self: &Arc<Self>, peer: IpAddr, close: CancellationToken) -> Option<ConnGuard> {
        let key = peer_key(peer);
        let mut open = lock(&self.open);
        let live: Vec<Arc<Conn>> = open.values().filter(|c| !c.close.is_cancelled()).cloned().collect();
        let longest_idle = |of_peer: bool| {
            live.iter()
                .filter(|c| c.busy.load(Ordering::SeqCst) == 0 && !c.close.is_cancelled() && (!of_peer || c.peer == key))
                .min_by_key(|c| c.idle_since_ms.load(Ordering::SeqCst))
                .cloned()
        };
        if live.iter().filter(|c| c.peer == key).count() >= self.per_peer {
            longest_idle(true)?.close.cancel();
        }
        if live.iter().filter(|c| !c.close.is_cancelled()).count() >= self.max {
            longest_idle(false)?.close.cancel();
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let conn = Arc::new(Conn {
            id,
            peer: key,
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            close,
            table: self.clone(),
        });
        open.insert(id, conn.clone());
        Some(ConnGuard(conn))
    }

    /// Connections open now (closing ones included until they are gone).
    pub fn len(&self) -> usize {
        lock(&self.open).len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered connection; dropping it removes it from the table.
pub struct ConnGuard(pub Arc<Conn>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.0.table.open).remove(&self.0.id);
    }
}

impl Conn {
    /// Marks a request in flight until the returned guard is dropped (with the response body).
    pub fn request(self: &Arc<Self>) -> RequestGuard {
        self.busy.fetch_add(1, Ordering::SeqCst);
        RequestGuard(self.clone())
    }

    /// Whether the connection has been idle (no request in flight) for `timeout`.
    pub fn idle_for(&self, timeout: Duration) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
            && self.table.now_ms().saturating_sub(self.idle_since_ms.load(Ordering::SeqCst)) >= timeout.as_millis() as u64
    }
}

/// A request in flight on its connection.
pub struct RequestGuard(Arc<Conn>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.idle_since_ms.store(self.0.table.now_ms(), Ordering::SeqCst);
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Result<IpAddr, std::net::AddrParseError> {
        s.parse()
    }

    #[test]
    fn sign_in_attempts_are_limited_per_peer() -> anyhow::Result<()> {
        let l = SignInLimiter::new(3, Duration::from_secs(60));
        for _ in 0..3 {
            assert!(l.attempt(ip("192.0.2.1")?).is_ok());
        }
        let wait = l.attempt(ip("192.0.2.1")?).err().ok_or_else(|| anyhow::anyhow!("the fourth attempt was let in"))?;
        assert!(wait > Duration::from_secs(50) && wait <= Duration::from_secs(60), "{wait:?}");
        // Another peer has its own attempts; one host's IPv6 /64 counts as one peer.
        assert!(l.attempt(ip("192.0.2.2")?).is_ok());
        for i in 0..3 {
            assert!(l.attempt(ip(&format!("2001:db8::{i}"))?).is_ok());
        }
        assert!(l.attempt(ip("2001:db8::ffff")?).is_err());
        assert!(l.attempt(ip("::ffff:192.0.2.1")?).is_err(), "an IPv4-mapped address is the IPv4 peer");
        Ok(())
    }

    #[test]
    fn attempts_come_back_over_time() -> anyhow::Result<()> {
        let l = SignInLimiter::new(1, Duration::from_millis(20));
        assert!(l.attempt(ip("192.0.2.1")?).is_ok());
        assert!(l.attempt(ip("192.0.2.1")?).is_err());
        let deadline = Instant::now() + Duration::from_secs(5);
        while l.attempt(ip("192.0.2.1")?).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "no attempt came back within 5 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    #[test]
    fn the_peer_table_stays_bounded() -> anyhow::Result<()> {
        let l = SignInLimiter::new(1, Duration::from_secs(3600));
        for i in 0..(SIGN_IN_PEERS + 50) as u32 {
            let _ = l.attempt(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        assert!(lock(&l.peers).len() <= SIGN_IN_PEERS);
        Ok(())
    }

    #[test]
    fn a_flooding_peer_loses_its_own_idle_connections_first() -> anyhow::Result<()> {
        let t = Connections::new(6, 3);
        let other = t.open(ip("192.0.2.9")?, CancellationToken::new()).ok_or_else(|| anyhow::anyhow!("first"))?;
        let busy = t.open(ip("192.0.2.1")?, CancellationToken::new()).ok_or_else(|| anyhow::anyhow!("busy"))?;
        let _in_flight = busy.0.request();
        let mut flood = vec![];
        for _ in 0..10 {
            flood.push(t.open(ip("192.0.2.1")?, CancellationToken::new()).ok_or_else(|| anyhow::anyhow!("flood"))?);
        }
        assert!(!other.0.close.is_cancelled(), "another peer's connection was closed");
        assert!(!busy.0.close.is_cancelled(), "a busy connection was closed");
        let open = flood.iter().filter(|c| !c.0.close.is_cancelled()).count();
        assert_eq!(open, 2, "the peer keeps its cap of 3 (one busy)");
        // When every connection that could go is busy, the new one is refused.
        let guards: Vec<RequestGuard> = flood.iter().filter(|c| !c.0.close.is_cancelled()).map(|c| c.0.request()).collect();
        assert!(t.open(ip("192.0.2.1")?, CancellationToken::new()).is_none());
        drop(guards);
        drop(flood);
        assert_eq!(t.len(), 2);
        Ok(())
    }
}
