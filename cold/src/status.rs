//! What the cold tier reports: counters and gauges the server renders as metrics, and the
//! fencing state `/readyz` answers with. Written by the archiver thread and by cold reads,
//! read on a scrape; plain atomics, never touched on the request path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The kinds of S3 request the cold tier makes, for the request counter's labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Put,
    Get,
    Delete,
    Manifest,
    /// Listing a shard's prefix for objects no manifest names (the orphan sweep).
    List,
}

impl Request {
    pub const ALL: [Request; 5] = [
        Request::Put,
        Request::Get,
        Request::Delete,
        Request::Manifest,
        Request::List,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Request::Put => "put",
            Request::Get => "get",
            Request::Delete => "delete",
            Request::Manifest => "manifest",
            Request::List => "list",
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// A conditional write lost (412).
    Precondition,
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Precondition, Outcome::Error];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Precondition => "precondition_failed",
            Outcome::Error => "error",
        }
    }
}

#[derive(Debug, Default)]
pub struct Status {
    requests: [[AtomicU64; 3]; 5],
    pub objects_uploaded: AtomicU64,
    pub bytes_uploaded: AtomicU64,
    pub objects_deleted: AtomicU64,
    /// Bytes of archived segments read back for the engine.
    pub cold_read_bytes: AtomicU64,
    /// WAL objects PUT (`--durability s3`) and their bytes.
    pub wal_objects: AtomicU64,
    pub wal_bytes: AtomicU64,
    /// Per shard: durable log bytes not yet in a committed manifest, and since when
    /// (ms since the epoch; 0: none).
    lag: Mutex<Vec<(u64, i64)>>,
    fenced: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Status {
    pub fn new(shards: usize) -> Status {
        Status {
            lag: Mutex::new(vec![(0, 0); shards]),
            ..Status::default()
        }
    }

    pub fn count(&self, kind: Request, outcome: Outcome) {
        self.requests[kind as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests of `kind` that ended as `outcome`.
    pub fn requests(&self, kind: Request, outcome: Outcome) -> u64 {
        self.requests[kind as usize][outcome as usize].load(Ordering::Relaxed)
    }

    /// Shard `shard`'s durable log bytes not yet in a committed manifest.
    pub fn shard_lag_bytes(&self, shard: u32) -> u64 {
        self.lag
            .lock()
            .ok()
            .and_then(|l| l.get(shard as usize).map(|l| l.0))
            .unwrap_or(0)
    }

    pub(crate) fn set_lag(&self, shard: u32, bytes: u64, since_ms: i64) {
        if let Ok(mut lag) = self.lag.lock() {
            if let Some(slot) = lag.get_mut(shard as usize) {
                *slot = (bytes, since_ms);
            }
        }
    }

    /// Durable bytes not in S3 yet (all shards), and the age in seconds of the oldest.
    pub fn lag(&self, now_ms: i64) -> (u64, f64) {
        let Ok(lag) = self.lag.lock() else {
            return (0, 0.0);
        };
        let bytes = lag.iter().map(|l| l.0).sum();
        let oldest = lag.iter().filter(|l| l.1 > 0).map(|l| l.1).min();
        let secs = oldest.map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0);
        (bytes, secs)
    }

    /// Stop claiming the archive: another owner took it over.
    pub(crate) fn fence(&self, why: String) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(why);
        }
        self.fenced.store(true, Ordering::SeqCst);
    }

    /// Why archiving stopped, once another server took the archive over.
    pub fn fenced(&self) -> Option<String> {
        if !self.fenced.load(Ordering::SeqCst) {
            return None;
        }
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_sums_bytes_and_ages_the_oldest() {
        let s = Status::new(2);
        assert_eq!(s.lag(10_000), (0, 0.0));
        s.set_lag(0, 100, 9_000);
        s.set_lag(1, 50, 7_000);
        assert_eq!(s.lag(10_000), (150, 3.0));
        s.set_lag(1, 0, 0);
        assert_eq!(s.lag(10_000), (100, 1.0));
    }

    #[test]
    fn fencing_keeps_the_first_reason() {
        let s = Status::new(1);
        assert!(s.fenced().is_none());
        s.fence("epoch 3 owns it".into());
        s.fence("later".into());
        assert_eq!(s.fenced().as_deref(), Some("epoch 3 owns it"));
        s.count(Request::Manifest, Outcome::Precondition);
        assert_eq!(s.requests(Request::Manifest, Outcome::Precondition), 1);
        assert_eq!(s.requests(Request::Manifest, Outcome::Ok), 0);
    }
}
