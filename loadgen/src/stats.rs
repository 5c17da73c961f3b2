//! Per-core measurements (merged at the end) and the report (human summary + JSON).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds, 1 µs .. 1 h, 3 significant digits.
const HIST_MAX_US: u64 = 3_600_000_000;

/// Operations recorded by all cores so far, for the progress line (read by `progress`).
pub static RECORDED: AtomicU64 = AtomicU64::new(0);

pub fn new_hist() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds")
}

/// What one task or core measured.
#[derive(Default)]
pub struct Stats {
    /// Latency of the operation the scenario measures (request, replay, delivery).
    pub latencies: Latencies,
    /// Operations completed successfully inside the measured window.
    pub ops: u64,
    /// Payload bytes moved by those operations.
    pub bytes: u64,
    /// HTTP requests sent inside the window (for CPU-per-request figures).
    pub requests: u64,
    /// Errors inside the window by key: HTTP status ("413") or client error ("io").
    pub errors: BTreeMap<String, u64>,
    /// Scenario-specific counters.
    pub counters: BTreeMap<&'static str, u64>,
}

impl Stats {
    pub fn record(&mut self, latency: Duration) {
        self.latencies.record(latency);
        RECORDED.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `latency` as if the operation had been issued every `interval` since it was
    /// due (coordinated-omission correction for open-loop schedules).
    pub fn record_corrected(&mut self, latency: Duration, interval: Duration) {
        let iv = (interval.as_micros() as u64).max(1);
        // Clamped into range, so this cannot fail.
        let _ = self.latencies.hist().record_correct(micros(latency), iv);
        RECORDED.fetch_add(1, Ordering::Relaxed);
    }

    pub fn error(&mut self, key: impl Into<String>) {
        *self.errors.entry(key.into()).or_insert(0) += 1;
    }

    /// A failed request: inside the measured window it counts as a request and an error
    /// under `key`; during warm-up only as a warm-up error.
    pub fn failed(&mut self, counted: bool, key: impl Into<String>) {
        if counted {
            self.requests += 1;
            self.error(key);
        } else {
            self.count("warmup_errors", 1);
        }
    }

    pub fn count(&mut self, key: &'static str, n: u64) {
        *self.counters.entry(key).or_insert(0) += n;
    }

    pub fn merge(&mut self, other: Stats) {
        self.latencies.merge(other.latencies);
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.requests += other.requests;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_insert(0) += v;
        }
        for (k, v) in other.counters {
            *self.counters.entry(k).or_insert(0) += v;
        }
    }

    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The errors that were HTTP answers, by status (their keys are status codes; the
    /// client's own failures have names).
    pub fn non_2xx(&self) -> BTreeMap<String, u64> {
        self.errors
            .iter()
            .filter(|(k, _)| k.parse::<u16>().is_ok())
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

/// Recorded latencies. A task's first [`KEPT_AS_IS`] are kept as they are and folded into a
/// histogram only past that: a histogram at these bounds takes 188 KB, and a run of 12,000
/// connections, each its own task recording a few dozen appends, would otherwise spend
/// 2.3 GB and the page faults to zero it on histograms that hold almost nothing.
#[derive(Default)]
pub struct Latencies {
    /// In microseconds, clamped to the histogram's bounds (which fit in a u32).
    kept: Vec<u32>,
    hist: Option<Histogram<u64>>,
}

/// Latencies a [`Latencies`] keeps before it takes a histogram (16 KiB of them).
const KEPT_AS_IS: usize = 4096;

fn micros(latency: Duration) -> u64 {
    (latency.as_micros() as u64).clamp(1, HIST_MAX_US)
}

impl Latencies {
    pub fn record(&mut self, latency: Duration) {
        let us = micros(latency);
        match &mut self.hist {
            None if self.kept.len() < KEPT_AS_IS => self.kept.push(us as u32),
            // Clamped into range, so this cannot fail.
            _ => {
                let _ = self.hist().record(us);
            }
        }
    }

    /// The histogram, holding everything recorded so far.
    fn hist(&mut self) -> &mut Histogram<u64> {
        let hist = self.hist.get_or_insert_with(new_hist);
        for us in self.kept.drain(..) {
            // In range: clamped when kept.
            let _ = hist.record(u64::from(us));
        }
        hist
    }

    pub fn merge(&mut self, other: Latencies) {
        if self.hist.is_none()
            && other.hist.is_none()
            && self.kept.len() + other.kept.len() <= KEPT_AS_IS
        {
            self.kept.extend(other.kept);
            return;
        }
        match (&mut self.hist, other.hist) {
            // Same bounds on both sides; add cannot fail.
            (Some(mine), Some(theirs)) => {
                let _ = mine.add(&theirs);
            }
            // Take theirs over rather than build a histogram to copy it into.
            (mine @ None, Some(theirs)) => *mine = Some(theirs),
            (_, None) => {}
        }
        let hist = self.hist();
        for us in other.kept {
            let _ = hist.record(u64::from(us));
        }
    }

    #[cfg(test)]
    fn len(&self) -> u64 {
        self.kept.len() as u64 + self.hist.as_ref().map_or(0, |h| h.len())
    }

    /// The percentiles of everything recorded.
    pub fn summary(&mut self) -> Latency {
        Latency::from_hist(self.hist())
    }
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// (quantile, ms) at the quantiles of [`crate::svg::QUANTILES`], for charts.
    pub curve: Vec<(f64, f64)>,
}

impl Latency {
    pub fn from_hist(h: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        if h.is_empty() {
            return Latency {
                count: 0,
                mean_ms: 0.0,
                p50_ms: 0.0,
                p90_ms: 0.0,
                p99_ms: 0.0,
                p999_ms: 0.0,
                max_ms: 0.0,
                curve: Vec::new(),
            };
        }
        Latency {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
            curve: crate::svg::QUANTILES
                .iter()
                .map(|&q| (q, ms(h.value_at_quantile(q))))
                .collect(),
        }
    }
}

/// The machine-readable report (`--json FILE`).
#[derive(Serialize, Debug)]
pub struct Report {
    pub scenario: String,
    pub target: String,
    pub surface: String,
    pub cores: usize,
    pub parameters: sonic_rs::Value,
    pub warmup_s: f64,
    /// Length of the measured window.
    pub duration_s: f64,
    /// What one "op" is for this scenario (append, read request, replay, delivery, …).
    pub op: String,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub requests: u64,
    pub bytes: u64,
    pub mb_per_sec: f64,
    /// The load generator's own CPU time (user + system, all threads) over the window,
    /// per op, in microseconds; absent when the run ended before its window did.
    pub client_cpu_us_per_op: Option<f64>,
    /// What the latency histogram measures.
    pub latency_of: String,
    pub latency: Latency,
    pub errors: BTreeMap<String, u64>,
    pub error_total: u64,
    /// The HTTP answers among `errors` (status outside 2xx) by status: a server that
    /// sheds load (`503` with `Retry-After`) shows here apart from failed connections.
    pub non_2xx: BTreeMap<String, u64>,
    pub counters: BTreeMap<String, u64>,
    /// Scenario checks (verify mismatches, the 413 probe, …); empty when none ran.
    pub checks: Vec<Check>,
    /// `true` when every check passed (the process exits non-zero otherwise).
    pub ok: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Report {
    pub fn human(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "scenario {}  target {}  surface {}  cores {}",
            self.scenario, self.target, self.surface, self.cores
        );
        let _ = writeln!(
            s,
            "window   {:.2} s after {:.2} s warm-up",
            self.duration_s, self.warmup_s
        );
        let _ = writeln!(
            s,
            "ops      {} x {} ({:.1}/s), {} requests, {:.2} MB/s ({} bytes)",
            self.ops, self.op, self.ops_per_sec, self.requests, self.mb_per_sec, self.bytes
        );
        if let Some(cpu) = self.client_cpu_us_per_op {
            let _ = writeln!(s, "client   {cpu:.2} µs CPU per {} (this process)", self.op);
        }
        let l = &self.latency;
        let _ = writeln!(
            s,
            "latency  ({}, n={}) p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  mean {:.3} ms",
            self.latency_of, l.count, l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms
        );
        if self.errors.is_empty() {
            let _ = writeln!(s, "errors   none");
        } else {
            let list: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(s, "errors   {} ({})", self.error_total, list.join(", "));
        }
        if self.non_2xx.is_empty() {
            let _ = writeln!(s, "non-2xx  none");
        } else {
            let list: Vec<String> = self
                .non_2xx
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let total: u64 = self.non_2xx.values().sum();
            let _ = writeln!(s, "non-2xx  {total} ({})", list.join(", "));
        }
        if !self.counters.is_empty() {
            let list: Vec<String> = self
                .counters
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(s, "counters {}", list.join(" "));
        }
        for c in &self.checks {
            let _ = writeln!(
                s,
                "check    {} {}: {}",
                if c.passed { "PASS" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_percentiles() {
        let mut a = Stats::default();
        for ms in 1..=100u64 {
            a.record(Duration::from_millis(ms));
        }
        a.ops = 100;
        a.error("503");
        let mut b = Stats::default();
        b.record(Duration::from_secs(2));
        b.ops = 1;
        b.error("503");
        b.error("io");
        a.merge(b);
        assert_eq!(a.ops, 101);
        assert_eq!(a.errors.get("503"), Some(&2));
        assert_eq!(a.error_total(), 3);
        assert_eq!(
            a.non_2xx().into_iter().collect::<Vec<_>>(),
            [("503".to_string(), 2)],
            "a failed connection is not an answer"
        );
        let l = a.latencies.summary();
        assert_eq!(l.count, 101);
        assert!((l.p50_ms - 51.0).abs() < 0.5, "{l:?}");
        assert!((l.max_ms - 2000.0).abs() < 2.0, "{l:?}");
        assert_eq!(Latency::from_hist(&new_hist()).count, 0);
    }

    #[test]
    fn corrected_recording_fills_gaps() {
        let mut s = Stats::default();
        s.record_corrected(Duration::from_millis(100), Duration::from_millis(10));
        // 100 ms with a 10 ms schedule adds the 90, 80, …, 10 ms samples it hid.
        assert_eq!(s.latencies.len(), 10);
    }

    #[test]
    fn latencies_are_kept_as_is_until_there_are_many() {
        let mut small = Stats::default();
        small.record(Duration::from_millis(3));
        assert!(small.latencies.hist.is_none(), "a few need no histogram");
        let mut many = Stats::default();
        for us in 1..=(KEPT_AS_IS as u64 + 10) {
            many.record(Duration::from_micros(us));
        }
        assert!(many.latencies.hist.is_some());
        assert!(many.latencies.kept.is_empty(), "folded into it");
        many.merge(small);
        let l = many.latencies.summary();
        assert_eq!(l.count, KEPT_AS_IS as u64 + 11);
        assert!((l.max_ms - 4.106).abs() < 0.01, "{l:?}");
        // A histogram merged into a few kept values is taken over, the kept values added.
        let mut few = Stats::default();
        few.record(Duration::from_millis(9));
        few.merge(many);
        assert!(few.latencies.kept.is_empty());
        let l = few.latencies.summary();
        assert_eq!(l.count, KEPT_AS_IS as u64 + 12);
        assert!((l.max_ms - 9.0).abs() < 0.01, "{l:?}");
        // Two small ones merge without a histogram, and past the limit take one.
        let (mut a, mut b) = (Stats::default(), Stats::default());
        for _ in 0..KEPT_AS_IS / 2 {
            a.record(Duration::from_millis(1));
            b.record(Duration::from_millis(2));
        }
        a.merge(b);
        assert!(a.latencies.hist.is_none());
        let mut c = Stats::default();
        c.record(Duration::from_secs(7200));
        a.merge(c);
        assert!(a.latencies.hist.is_some());
        let l = a.latencies.summary();
        assert_eq!(l.count, KEPT_AS_IS as u64 + 1);
        assert!(
            (l.max_ms - 3_600_000.0).abs() < 3_600.0,
            "clamped to an hour: {l:?}"
        );
    }
}
