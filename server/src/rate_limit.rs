//! Per-bucket rate limits (a bucket's `rate_limit` setting): token buckets for appends and
//! for appended bytes, one pair per bucket for the whole process.
//!
//! A bucket's streams hash to every core, so a per-core limit would let a bucket whose
//! streams spread over N cores append N times its limit, and give one whose traffic sits on
//! one stream a 1/N share if the limit were split. Each bucket's limiter is therefore shared
//! by all cores: a token bucket kept as one atomic word (the generic cell rate algorithm:
//! the word is the time at which the bucket would be full again), updated with a
//! compare-and-swap. Cores take the same word only while they append to one bucket at the
//! same moment; a core finds a bucket's limiter through its own cache ([`LocalLimits`]), so
//! the shared map's lock is taken only when a core first meets a bucket or after a
//! bucket's settings change.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::bucket_settings::RateLimit;

/// Which of a bucket's limits refused an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Appends,
    Bytes,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Appends => "appends",
            Limit::Bytes => "bytes",
        }
    }
}

/// An append the bucket's limit refused: which limit, and when a retry would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub limit: Limit,
    /// Whole seconds until the limit lets this append through (at least 1): the
    /// `Retry-After` of the 429.
    pub retry_after_secs: u64,
}

/// One bucket's limits, shared by every core.
#[derive(Debug)]
pub struct Limiter {
    appends: Option<Gcra>,
    bytes: Option<Gcra>,
    /// Appends refused by each limit, for `ursula_bucket_throttled_total`.
    throttled: [AtomicU64; 2],
}

impl Limiter {
    pub fn new(rate: RateLimit) -> Limiter {
        Limiter {
            appends: rate
                .appends_per_sec
                .map(|r| Gcra::new(r, rate.appends_burst.unwrap_or(r))),
            bytes: rate
                .bytes_per_sec
                .map(|r| Gcra::new(r, rate.bytes_burst.unwrap_or(r))),
            throttled: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Take `appends` appends of `bytes` bytes from the bucket, or say why not (then
    /// nothing is taken).
    pub fn admit(&self, appends: u64, bytes: u64) -> Result<(), Throttled> {
        let now = now_ns();
        if let Some(g) = &self.appends {
            g.take(appends, now)
                .map_err(|s| self.refused(Limit::Appends, s))?;
        }
        if let Some(g) = &self.bytes {
            if let Err(s) = g.take(bytes, now) {
                if let Some(a) = &self.appends {
                    a.give_back(appends);
                }
                return Err(self.refused(Limit::Bytes, s));
            }
        }
        Ok(())
    }

    /// Appends refused so far by the appends limit and by the bytes limit.
    pub fn throttled(&self) -> [u64; 2] {
        [
            self.throttled[0].load(Ordering::Relaxed),
            self.throttled[1].load(Ordering::Relaxed),
        ]
    }

    fn refused(&self, limit: Limit, wait_ns: u64) -> Throttled {
        self.throttled[limit as usize].fetch_add(1, Ordering::Relaxed);
        Throttled {
            limit,
            retry_after_secs: wait_ns.div_ceil(1_000_000_000).max(1),
        }
    }
}

/// A token bucket of `burst` tokens refilled at `rate` per second, as the time at which it
/// would be full again (its "theoretical arrival time", in nanoseconds of [`now_ns`]).
/// Taking `n` tokens moves that time `n / rate` seconds later; a take that would move it
/// more than the burst's worth past now is refused.
#[derive(Debug)]
struct Gcra {
    full_at: AtomicU64,
    /// Nanoseconds one token takes to come back (times `SCALE`, for rates above 1e9/s).
    per_token: u128,
    /// Nanoseconds the whole burst takes to come back.
    tolerance: u64,
}

/// Fixed-point scale of `Gcra::per_token`.
const SCALE: u128 = 1 << 20;

/// Longer than any wait computed from accepted settings (at most 1e12 tokens at 1 per
/// second is about 31,700 years); keeps the sums below from overflowing.
const MAX_SPAN_NS: u64 = 1 << 62;

impl Gcra {
    fn new(rate: u64, burst: u64) -> Gcra {
        let per_token = 1_000_000_000 * SCALE / u128::from(rate.max(1));
        let mut g = Gcra {
            full_at: AtomicU64::new(0),
            per_token,
            tolerance: 0,
        };
        g.tolerance = g.span(burst.max(1));
        g
    }

    /// How long `n` tokens take to come back.
    fn span(&self, n: u64) -> u64 {
        let ns = (u128::from(n) * self.per_token).div_ceil(SCALE);
        u64::try_from(ns).unwrap_or(MAX_SPAN_NS).min(MAX_SPAN_NS)
    }

    /// Take `n` tokens at `now`, or return how long until they could be taken. A take of
    /// more than the burst is charged as the whole burst: it passes when the bucket is
    /// full, so one large append is never refused for ever.
    fn take(&self, n: u64, now: u64) -> Result<(), u64> {
        let cost = self.span(n).min(self.tolerance);
        let mut full_at = self.full_at.load(Ordering::Relaxed);
        loop {
            let after = full_at.max(now) + cost;
            let ahead = after - now;
            if ahead > self.tolerance {
                return Err(ahead - self.tolerance);
            }
            match self.full_at.compare_exchange_weak(
                full_at,
                after,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => full_at = seen,
            }
        }
    }

    /// Undo a take of `n` tokens (the other limit refused the append).
    fn give_back(&self, n: u64) {
        let cost = self.span(n).min(self.tolerance);
        let _ = self
            .full_at
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(cost))
            });
    }
}

/// Nanoseconds on a monotonic clock, from an origin before any limiter was used (one past
/// it, so a new bucket's `full_at` of 0 reads as full).
fn now_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(MAX_SPAN_NS) + 1
}

/// Every bucket's limiter, shared by the cores. Settings changes replace a bucket's entry
/// and advance `generation`, which empties every core's cache at its next look.
#[derive(Debug, Default)]
pub struct BucketLimits {
    generation: AtomicU64,
    limiters: Mutex<HashMap<String, Arc<Limiter>>>,
}

impl BucketLimits {
    /// The limiter of `bucket`: the one in use, or a new one for `rate` (read from a core's
    /// copy of the bucket's settings).
    fn get_or_insert(&self, bucket: &str, rate: RateLimit) -> Arc<Limiter> {
        let mut map = self.lock();
        if let Some(l) = map.get(bucket) {
            return l.clone();
        }
        let l = Arc::new(Limiter::new(rate));
        map.insert(bucket.to_string(), l.clone());
        l
    }

    /// `bucket`'s settings changed (or it was deleted: `None`). A new limiter starts full;
    /// the throttled counts carry over, so the metric stays a counter.
    pub fn set(&self, bucket: &str, rate: Option<RateLimit>) {
        let mut map = self.lock();
        let old = map.remove(bucket);
        if let Some(rate) = rate {
            let new = Limiter::new(rate);
            if let Some(old) = old {
                for (n, o) in new.throttled.iter().zip(old.throttled()) {
                    n.store(o, Ordering::Relaxed);
                }
            }
            map.insert(bucket.to_string(), Arc::new(new));
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Each limited bucket with its throttled counts (appends, bytes), sorted by bucket.
    pub fn throttled(&self) -> Vec<(String, [u64; 2])> {
        let mut rows: Vec<_> = self
            .lock()
            .iter()
            .map(|(b, l)| (b.clone(), l.throttled()))
            .collect();
        rows.sort_unstable();
        rows
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Limiter>>> {
        // The map holds no invariant a panicking holder could break half-way.
        self.limiters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One core's cache of the limiters it has looked up: `None` for a bucket without limits.
#[derive(Default)]
pub struct LocalLimits {
    /// The `BucketLimits` generation the entries were read at, and the entries.
    cache: RefCell<(u64, LimiterCache)>,
}

type LimiterCache = HashMap<Box<str>, Option<Arc<Limiter>>, foldhash::fast::RandomState>;

impl LocalLimits {
    /// Runs `f` on the limiter of `bucket`, asking `settings` for the bucket's rate limit
    /// on a miss; None for a bucket without limits. The limiter is lent, not cloned: a
    /// clone of its `Arc` would add two writes to the reference count every core shares.
    pub fn with<R>(
        &self,
        shared: &BucketLimits,
        bucket: &str,
        settings: impl FnOnce() -> Option<RateLimit>,
        f: impl FnOnce(&Limiter) -> R,
    ) -> Option<R> {
        let mut cache = self.cache.borrow_mut();
        let generation = shared.generation.load(Ordering::Acquire);
        if cache.0 != generation {
            cache.1.clear();
            cache.0 = generation;
        }
        if let Some(hit) = cache.1.get(bucket) {
            return hit.as_deref().map(f);
        }
        let limiter = settings().map(|rate| shared.get_or_insert(bucket, rate));
        let result = limiter.as_deref().map(f);
        cache.1.insert(bucket.into(), limiter);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(appends: Option<u64>, burst: Option<u64>, bytes: Option<u64>) -> RateLimit {
        RateLimit {
            appends_per_sec: appends,
            appends_burst: burst,
            bytes_per_sec: bytes,
            bytes_burst: None,
        }
    }

    #[test]
    fn burst_then_refill() {
        let g = Gcra::new(10, 5);
        let t0 = 1_000;
        for _ in 0..5 {
            assert_eq!(g.take(1, t0), Ok(()));
        }
        let wait = g.take(1, t0).expect_err("burst spent");
        assert_eq!(wait, 100_000_000, "one token comes back in 1/10 s");
        assert_eq!(g.take(1, t0 + wait), Ok(()));
        assert!(g.take(1, t0 + wait).is_err());
        // A long pause refills to the burst, not beyond.
        let later = t0 + 60_000_000_000;
        for _ in 0..5 {
            assert_eq!(g.take(1, later), Ok(()));
        }
        assert!(g.take(1, later).is_err());
    }

    #[test]
    fn a_take_larger_than_the_burst_passes_when_full() {
        let g = Gcra::new(1_000, 1_000);
        assert_eq!(g.take(50_000, 5), Ok(()));
        assert!(g.take(1, 5).is_err());
        assert_eq!(g.take(50_000, 5 + 1_000_000_000), Ok(()));
    }

    #[test]
    fn high_rates_keep_their_precision() {
        // 4 GB/s: a quarter of a nanosecond per byte.
        let g = Gcra::new(4_000_000_000, 4_000_000_000);
        assert_eq!(g.span(4_000_000_000), 1_000_000_000);
        assert_eq!(g.span(1), 1);
    }

    #[test]
    fn a_refusal_by_bytes_gives_the_append_back() {
        let l = Limiter::new(rate(Some(2), None, Some(100)));
        assert_eq!(l.admit(1, 60), Ok(()));
        assert_eq!(l.admit(1, 60).map_err(|t| t.limit), Err(Limit::Bytes));
        // The append the bytes limit refused was given back.
        assert_eq!(l.admit(1, 10), Ok(()));
        let t = l.admit(1, 10).expect_err("appends spent");
        assert_eq!(t.limit, Limit::Appends);
        assert_eq!(t.retry_after_secs, 1);
        assert_eq!(l.throttled(), [1, 1]);
    }

    #[test]
    fn settings_changes_reach_every_cache() {
        let shared = BucketLimits::default();
        let local = LocalLimits::default();
        let admit = |l: &Limiter| l.admit(1, 0);
        assert!(local.with(&shared, "logs", || None, admit).is_none());
        // Cached: the settings are not read again.
        assert!(local
            .with(&shared, "logs", || unreachable!("cached"), admit)
            .is_none());
        let one = rate(Some(1), None, None);
        shared.set("logs", Some(one));
        assert_eq!(
            local.with(&shared, "logs", || Some(one), admit),
            Some(Ok(()))
        );
        assert!(matches!(
            local.with(&shared, "logs", || Some(one), admit),
            Some(Err(_))
        ));
        // A core whose copy of the settings is behind still gets the limiter in use.
        shared.set("logs", Some(rate(Some(1000), None, None)));
        assert_eq!(
            local.with(&shared, "logs", || Some(one), admit),
            Some(Ok(()))
        );
        assert_eq!(shared.throttled(), vec![("logs".to_string(), [1, 0])]);
        shared.set("logs", None);
        assert!(local.with(&shared, "logs", || None, admit).is_none());
    }
}
