//! Each core's request counters: plain `Cell`s owned by the core, so the request path never
//! touches shared memory. `admin` gathers and renders them on a scrape.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use ursula_protocol::http1::Method;

/// The route family of a request path, for metric labels (bounded cardinality).
pub fn route_label(path: &str) -> &'static str {
    if path.starts_with("/v1/stream/") {
        return "compat_stream";
    }
    if path.starts_with("/__") {
        return "internal";
    }
    if path == "/" {
        return "buckets";
    }
    let mut segments = path.trim_start_matches('/').split('/').skip(1);
    match (segments.next(), segments.next()) {
        (None, _) => "bucket",
        (Some("streams"), None) => "bucket_streams",
        (Some(_), None) => "stream",
        (Some(_), Some("append-batch")) => "append_batch",
        (Some(_), Some("attrs")) => "attrs",
        (Some(_), Some("producers")) => "producers",
        (Some(_), Some("snapshot")) => "snapshot",
        (Some(_), Some("retention")) => "retention",
        (Some(_), Some("bootstrap")) => "bootstrap",
        _ => "other",
    }
}

fn method_label(m: &Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Put => "PUT",
        Method::Post => "POST",
        Method::Delete => "DELETE",
        Method::Options => "OPTIONS",
        Method::Other(_) => "other",
    }
}

/// One core's request counters. Only its own thread touches them.
#[derive(Default)]
pub struct CoreMetrics {
    /// Counted on every request. The labels are the server's own constants, so the fast
    /// hasher cannot be steered by clients.
    pub requests:
        RefCell<HashMap<(&'static str, &'static str, u16), u64, foldhash::fast::RandomState>>,
    pub append_bytes: Cell<u64>,
    pub read_bytes: Cell<u64>,
    pub sse_open: Cell<u64>,
    pub moved_out: Cell<u64>,
    /// Stream requests handed to the core owning their stream.
    pub handed_over: Cell<u64>,
    pub loop_lag: RefCell<LoopLag>,
    /// Appends seen, to pick the ones to time, and the times taken by those.
    pub appends_seen: Cell<u64>,
    pub append_times: RefCell<AppendTimes>,
}

/// Upper bounds (microseconds) of the append duration histogram's buckets; +Inf follows.
pub const APPEND_DURATION_BUCKETS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

/// One append in this many is timed: enough for percentiles, while most small appends
/// read no clock (two reads show in their profile).
pub const APPEND_TIMING_SAMPLE: u64 = 8;

/// How long the timed appends took from their head being read to their reply being ready.
#[derive(Default, Clone, Copy, Debug)]
pub struct AppendTimes {
    pub buckets: [u64; APPEND_DURATION_BUCKETS_US.len() + 1],
    pub count: u64,
    pub sum_nanos: u64,
}

/// Upper bounds (microseconds) of the event-loop lag histogram's buckets; +Inf follows.
pub const LOOP_LAG_BUCKETS_US: [u64; 8] = [
    1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// How late the core's heartbeat timer ran, over the core's life (see `runtime`).
#[derive(Default, Clone, Copy, Debug)]
pub struct LoopLag {
    pub buckets: [u64; LOOP_LAG_BUCKETS_US.len() + 1],
    pub count: u64,
    pub sum_nanos: u64,
    pub max_nanos: u64,
}

impl CoreMetrics {
    /// Count a finished request: its route, method and status, the body bytes of a
    /// successful append, and the body bytes of a successful read.
    pub fn request(
        &self,
        route: &'static str,
        method: &Method,
        status: u16,
        req: usize,
        resp: usize,
    ) {
        let method_label = method_label(method);
        *self
            .requests
            .borrow_mut()
            .entry((route, method_label, status))
            .or_insert(0) += 1;
        if (200..300).contains(&status) {
            match method {
                Method::Post => self.append_bytes.set(self.append_bytes.get() + req as u64),
                Method::Get => self.read_bytes.set(self.read_bytes.get() + resp as u64),
                _ => {}
            }
        }
    }

    /// Count response body bytes written outside `request` (SSE events, as they go out).
    pub fn read_bytes(&self, n: usize) {
        self.read_bytes.set(self.read_bytes.get() + n as u64);
    }

    pub fn sse_started(&self) {
        self.sse_open.set(self.sse_open.get() + 1);
    }

    pub fn sse_ended(&self) {
        self.sse_open.set(self.sse_open.get().saturating_sub(1));
    }

    /// A connection was handed to the core owning its stream (see `conn`).
    pub fn connection_moved(&self) {
        self.moved_out.set(self.moved_out.get() + 1);
    }

    /// A stream request was handed to the core owning its stream (`router`).
    pub fn request_handed_over(&self) {
        self.handed_over.set(self.handed_over.get() + 1);
    }

    /// An append arrived: whether to time it (one in [`APPEND_TIMING_SAMPLE`]).
    pub fn time_this_append(&self) -> bool {
        let n = self.appends_seen.get();
        self.appends_seen.set(n + 1);
        n.is_multiple_of(APPEND_TIMING_SAMPLE)
    }

    /// A timed append was answered after `took`.
    pub fn append_took(&self, took: std::time::Duration) {
        let us = took.as_micros();
        let bucket = APPEND_DURATION_BUCKETS_US
            .iter()
            .position(|&b| us <= u128::from(b))
            .unwrap_or(APPEND_DURATION_BUCKETS_US.len());
        let mut t = self.append_times.borrow_mut();
        t.buckets[bucket] += 1;
        t.count += 1;
        t.sum_nanos = t
            .sum_nanos
            .saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The heartbeat timer ran `lag` after it was due.
    pub fn loop_lag(&self, lag: std::time::Duration) {
        let us = lag.as_micros();
        let bucket = LOOP_LAG_BUCKETS_US
            .iter()
            .position(|&b| us <= u128::from(b))
            .unwrap_or(LOOP_LAG_BUCKETS_US.len());
        let nanos = u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX);
        let mut l = self.loop_lag.borrow_mut();
        l.buckets[bucket] += 1;
        l.count += 1;
        l.sum_nanos = l.sum_nanos.saturating_add(nanos);
        l.max_nanos = l.max_nanos.max(nanos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_labels() {
        assert_eq!(route_label("/v1/stream/a/b"), "compat_stream");
        assert_eq!(route_label("/"), "buckets");
        assert_eq!(route_label("/logs"), "bucket");
        assert_eq!(route_label("/logs/streams"), "bucket_streams");
        assert_eq!(route_label("/logs/app"), "stream");
        assert_eq!(route_label("/logs/app/append-batch"), "append_batch");
        assert_eq!(
            route_label("/logs/app/snapshot/00000000000000000001"),
            "snapshot"
        );
        assert_eq!(route_label("/logs/app/producers"), "producers");
        assert_eq!(route_label("/logs/app/x/y"), "other");
        assert_eq!(route_label("/__ursula/metrics"), "internal");
    }

    #[test]
    fn loop_lag_lands_in_its_bucket() {
        let m = CoreMetrics::default();
        m.loop_lag(std::time::Duration::from_micros(300));
        m.loop_lag(std::time::Duration::from_millis(1));
        m.loop_lag(std::time::Duration::from_millis(30));
        m.loop_lag(std::time::Duration::from_secs(3));
        let l = *m.loop_lag.borrow();
        assert_eq!(l.buckets[0], 2, "1 ms is inside the first bucket's bound");
        assert_eq!(l.buckets[4], 1, "30 ms is in (25, 50] ms");
        assert_eq!(l.buckets[LOOP_LAG_BUCKETS_US.len()], 1, "3 s is in +Inf");
        assert_eq!(l.count, 4);
        assert_eq!(l.max_nanos, 3_000_000_000);
    }
}
