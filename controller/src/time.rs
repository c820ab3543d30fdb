//! Time helpers shared by every reconciler: the API's whole-second timestamps, jittered
//! requeues and the short fixed delays of the reconcile skeleton.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rand::Rng;

/// How long a reconcile of a stale cached copy (older than our own last write) waits before
/// it looks again; the watch event of the newer version usually comes first.
pub const STALE_REQUEUE: Duration = Duration::from_secs(2);

/// Now, in whole seconds (the API stores seconds).
pub fn now_seconds() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// Jitters a requeue interval by ±10 % so that objects created together do not resync together.
pub fn jittered(interval: Duration) -> Duration {
    let factor = rand::rng().random_range(0.9..=1.1);
    interval.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(100));
            assert!(d >= Duration::from_secs(90) && d <= Duration::from_secs(110), "{d:?}");
        }
    }

    #[test]
    fn now_has_no_fraction() {
        assert_eq!(now_seconds().subsec_nanosecond(), 0);
    }
}
