//! `write`: N streams, closed-loop writers. By default one writer per stream on its own
//! keep-alive connection; with `--spread`, a fixed pool of connections (a gateway's or a
//! collector's shape) where every connection sends to every stream in turn.
//!
//! With `--rate`, the run offers a fixed load instead of as much as the server takes (an
//! open loop, as wrk2 does): append `g` of the run is due `g / rate` seconds after the
//! start, whether or not earlier appends have been answered, and its latency runs from
//! when it was due. A server that falls behind therefore shows the queueing in its
//! percentiles instead of slowing the client down to its own pace (coordinated
//! omission). The appends are dealt to lanes, one per stream (or one per client core with
//! `--spread`), and each lane's appends go out on whichever of its connections is free;
//! an append that comes due while all of them are busy is sent as soon as one frees up,
//! counted as late, and still timed from when it was due. (The client's timers count whole
//! milliseconds, so a connection wakes up to 2 ms before an append is due and times an
//! append it sends early from when it sent it.) `--connections` sets how many
//! requests can be in flight at once: at 50,000 appends/s and 100 ms per append that is
//! 5,000. This is the shape for comparing CPU per append between servers or settings at
//! one load, which saturation cannot do (there, whoever runs faster also batches more),
//! and for latency at a load below the maximum.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::{
    err_key, merge_all, run_cores, setup_then_sync, status_key, Common, Rotation, Target, Window,
};
use crate::http::{Body, Conn};
use crate::stats::{Check, Stats};
use crate::Outcome;

#[derive(Args, Debug, Clone, Serialize)]
pub struct WriteArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of streams; one writer (and connection) per stream unless `--spread`.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Gateway shape: a fixed pool of `--connections` keep-alive connections, each
    /// sending to every stream in turn, instead of one connection per stream.
    #[arg(long)]
    pub spread: bool,
    /// Connections: the `--spread` pool's size, or with `--rate` alone the connections
    /// shared out over the streams (at least one each), so that more appends of a stream
    /// can be in flight at once (default: as many as streams).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Bytes per append.
    #[arg(long, default_value = "256", value_parser = crate::common::parse_size)]
    pub payload: usize,
    /// Content type of the streams.
    #[arg(long, default_value = "application/octet-stream")]
    pub content_type: String,
    /// Offered load in appends per second over all streams (open loop): appends are due
    /// evenly spaced whether or not earlier ones were answered, and latency runs from when
    /// each was due. An append that comes due while all its connections are busy waits for
    /// one, counts as late, and is still timed from its due time; give `--connections` of
    /// at least the rate times the latency. Default: closed loop, every writer sends as
    /// soon as its previous append is answered.
    #[arg(long)]
    pub rate: Option<f64>,
}

/// Highest `--rate` accepted; far above what one client host can send, it only keeps the
/// schedule's arithmetic in range.
const MAX_RATE: f64 = 10_000_000.0;

pub fn run(args: &WriteArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0 {
        return Err("--streams must be at least 1".into());
    }
    if args.connections == Some(0) {
        return Err("--connections must be at least 1".into());
    }
    match args.rate {
        None if args.connections.is_some() && !args.spread => {
            Err("--connections needs --spread or --rate".into())
        }
        None => run_closed(args, target, cores),
        Some(rate) if !(rate > 0.0 && rate <= MAX_RATE) => {
            Err(format!("--rate must be in (0, {MAX_RATE}] appends/s"))
        }
        Some(_) if !args.spread && args.connections.is_some_and(|c| c < args.streams) => Err(
            "--connections below --streams: without --spread every stream needs a connection \
             of its own"
                .into(),
        ),
        Some(rate) => run_paced(args, target, cores, rate),
    }
}

/// The closed loop: every writer sends its next append when the previous one is answered.
fn run_closed(args: &WriteArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let senders = if a.spread {
                let conns = a.connections.unwrap_or(a.streams);
                let setup =
                    t.spread_pool(&ctx, "write", a.streams, conns, &a.content_type, timeout);
                let pool = setup_then_sync(&ctx, setup).await?;
                pool.conns
                    .into_iter()
                    .map(|(c, first)| (c, Rotation::starting_at(pool.paths.clone(), first)))
                    .collect::<Vec<_>>()
            } else {
                let mine: Vec<usize> = ctx.mine(a.streams).collect();
                let setup = t.connect_streams("write", &mine, |i| i, &a.content_type, timeout);
                let conns = setup_then_sync(&ctx, setup).await?;
                conns
                    .into_iter()
                    .map(|(c, path)| (c, Rotation::one(path)))
                    .collect()
            };
            let win = ctx.window(a.common.warmup, a.common.duration);
            let payload = Bytes::from(crate::common::pattern(0, 0, a.payload));
            let ct: Rc<str> = Rc::from(a.content_type.as_str());
            let mut tasks = Vec::with_capacity(senders.len());
            for (conn, route) in senders {
                let payload = payload.clone();
                let ct = ct.clone();
                tasks.push(monoio::spawn(writer(conn, route, ct, payload, win)));
            }
            let mut parts = Vec::with_capacity(tasks.len());
            for t in tasks {
                parts.push(t.await);
            }
            Ok(merge_all(parts))
        }
    })?;
    Ok(Outcome {
        stats: merge_all(parts),
        op: "append",
        latency_of: "append request",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

async fn writer(
    mut conn: Conn,
    mut route: Rotation,
    ct: Rc<str>,
    payload: Bytes,
    win: Window,
) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", &*ct)];
    while !win.over() {
        let t0 = Instant::now();
        let r = conn
            .request(
                "POST",
                route.advance(),
                &headers,
                Body::Shared(payload.clone()),
            )
            .await;
        let t1 = Instant::now();
        let counted = win.counts(t1);
        match r {
            Ok(resp) if (200..300).contains(&resp.status) => {
                if counted {
                    st.requests += 1;
                    st.ops += 1;
                    st.bytes += payload.len() as u64;
                    st.record(t1 - t0);
                }
            }
            Ok(resp) => st.failed(counted, status_key(resp.status)),
            Err(e) => {
                st.failed(counted, err_key(&e));
                // Do not spin on a dead server.
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

/// One lane's share of the `--rate` schedule. Append `g` of the run (counting over every
/// lane from 0) is due `g / rate` seconds after `start`; lane `lane` of `lanes` owns
/// appends `lane`, `lane + lanes`, `lane + 2 * lanes`, ..., so the lanes together send
/// one evenly spaced stream of appends rather than each its own burst.
#[derive(Clone, Copy, Debug)]
struct Schedule {
    start: Instant,
    rate: f64,
    lane: u64,
    lanes: u64,
}

impl Schedule {
    /// When the lane's `n`-th append (from 0) is due.
    fn due(&self, n: u64) -> Instant {
        let g = self.lane.saturating_add(n.saturating_mul(self.lanes));
        // From the start every time rather than by adding an interval to the previous due
        // time: rounding an interval to whole nanoseconds would drift over a long run.
        self.start + Duration::from_secs_f64(g as f64 / self.rate)
    }

    /// How many of the lane's appends are due before `t` (the index of the first one due
    /// at or after it).
    fn due_before(&self, t: Instant) -> u64 {
        let secs = t.saturating_duration_since(self.start).as_secs_f64();
        let lane = self.lane as f64;
        let lanes = self.lanes as f64;
        // Run-wide appends due before t, then the lane's share of them: an estimate within
        // one or two of the answer, settled against `due` itself so that the two agree on
        // every boundary.
        let run_wide = (secs * self.rate).ceil();
        let mut n = if run_wide <= lane {
            0
        } else {
            ((run_wide - lane) / lanes).ceil() as u64
        };
        while n > 0 && self.due(n - 1) >= t {
            n -= 1;
        }
        while self.due(n) < t {
            n += 1;
        }
        n
    }
}

/// A lane's appends, taken in due order by whichever of its connections is free, the way
/// a producer with a connection pool sends on any idle connection rather than queueing
/// behind a busy one.
struct Lane {
    schedule: Schedule,
    /// The lane's streams, one append to each in turn.
    paths: Rc<[String]>,
    first_path: usize,
    /// The next append not yet taken by a connection.
    next: Cell<u64>,
}

impl Lane {
    /// Takes the next append: its index and when it is due.
    fn take(&self) -> (u64, Instant) {
        let n = self.next.get();
        self.next.set(n + 1);
        (n, self.schedule.due(n))
    }

    fn path(&self, n: u64) -> &str {
        let len = self.paths.len().max(1) as u64;
        let i = (self.first_path as u64 + n % len) % len;
        &self.paths[i as usize]
    }

    /// Counts the lane's appends due inside the window (`due`) and those of them never
    /// sent (`unsent`: all the lane's connections were still busy when the window ended).
    /// An unsent append goes into the latencies with what it had waited by the window's
    /// end, a lower bound: a server too slow for the offered load must not shorten its
    /// percentiles by leaving appends unanswered.
    fn tally(&self, win: &Window, st: &mut Stats) {
        let from = self.schedule.due_before(win.warm_end);
        let to = self.schedule.due_before(win.end);
        let taken = self.next.get().clamp(from, to);
        st.count("due", to - from);
        st.count("unsent", to - taken);
        for n in taken..to {
            st.record(win.end.saturating_duration_since(self.schedule.due(n)));
        }
    }
}

/// How many of `connections` stream `s` of `streams` gets (without `--spread`): an even
/// share, the remainder going one each to the first streams.
fn connections_of(s: usize, streams: usize, connections: usize) -> usize {
    connections / streams + usize::from(s < connections % streams)
}

/// How long before an append's due time its connection wakes up to send it. monoio's
/// timers count whole milliseconds: a deadline is rounded up to the next tick, and the
/// loop parks for whole milliseconds from a truncated now, so a sleep ends up to 2 ms after
/// its deadline. Sleeping until the due time itself would put that wait into the server's
/// latency; waking up to 2 ms early and timing the append from when it was sent does not,
/// and sending early never shortens a latency.
const TIMER_LEAD: Duration = Duration::from_millis(2);

/// Where an append's latency starts: when it was due, or when it was sent if the timer
/// released it before that.
fn latency_start(due: Instant, sent: Instant) -> Instant {
    due.min(sent)
}

/// The open loop of `--rate`.
fn run_paced(
    args: &WriteArgs,
    target: &Target,
    cores: usize,
    rate: f64,
) -> Result<Outcome, String> {
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let connections = a.connections.unwrap_or(a.streams);
            // Every connection makes one request before the schedule starts. A TCP connect
            // alone completes in the kernel's accept queue, and thousands of connections
            // the server has not yet accepted (or, on Ursula, handed to the core owning
            // their stream) would stall the first second of the schedule. Any answer will
            // do: a server that refuses the connection shows it in the run's statuses.
            let open = |mut c: Conn, path: String| async move {
                c.request("HEAD", &path, &[], Body::None)
                    .await
                    .map_err(|e| format!("HEAD {path} to open a connection: {e}"))?;
                Ok::<Conn, String>(c)
            };
            // (lane index, lanes, paths, first path, connections), for this core's lanes.
            let setup = async {
                let mut lanes = Vec::new();
                if a.spread {
                    let pool = t
                        .spread_pool(
                            &ctx,
                            "write",
                            a.streams,
                            connections,
                            &a.content_type,
                            timeout,
                        )
                        .await?;
                    let mut conns = Vec::with_capacity(pool.conns.len());
                    for (c, first) in pool.conns {
                        conns.push(open(c, pool.paths[first].clone()).await?);
                    }
                    // One lane per client core that has connections; each starts at its
                    // own stream so that the cores cover the streams evenly.
                    let with_conns = ctx.cores.min(connections);
                    if !conns.is_empty() {
                        let first = ctx.core * a.streams / ctx.cores;
                        lanes.push((ctx.core, with_conns, pool.paths, first, conns));
                    }
                } else {
                    let mine: Vec<usize> = ctx.mine(a.streams).collect();
                    let opened = t
                        .connect_streams("write", &mine, |i| i, &a.content_type, timeout)
                        .await?;
                    for (s, (c, path)) in mine.into_iter().zip(opened) {
                        let mut conns = vec![c];
                        for _ in 1..connections_of(s, a.streams, connections) {
                            conns.push(open(Conn::new(t.addr, timeout), path.clone()).await?);
                        }
                        let paths: Rc<[String]> = vec![path].into();
                        lanes.push((s, a.streams, paths, 0, conns));
                    }
                }
                Ok::<_, String>(lanes)
            };
            let lanes = setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let payload = Bytes::from(crate::common::pattern(0, 0, a.payload));
            let ct: Rc<str> = Rc::from(a.content_type.as_str());
            let mut tasks = Vec::new();
            let mut all = Vec::with_capacity(lanes.len());
            for (lane, lanes, paths, first_path, conns) in lanes {
                let lane = Rc::new(Lane {
                    schedule: Schedule {
                        start: win.start,
                        rate,
                        lane: lane as u64,
                        lanes: lanes as u64,
                    },
                    paths,
                    first_path,
                    next: Cell::new(0),
                });
                for conn in conns {
                    let args = (lane.clone(), ct.clone(), payload.clone(), win);
                    tasks.push(monoio::spawn(paced_writer(conn, args)));
                }
                all.push(lane);
            }
            let mut parts = Vec::with_capacity(tasks.len() + 1);
            for t in tasks {
                parts.push(t.await);
            }
            // Every lane's tally, once its connections are done with it.
            let mut tally = Stats::default();
            for lane in &all {
                lane.tally(&win, &mut tally);
            }
            tally.count("late", 0);
            tally.count("late_no_connection", 0);
            parts.push(tally);
            Ok(merge_all(parts))
        }
    })?;
    let stats = merge_all(parts);
    let check = offered_load_held(rate, &stats, args.common.duration);
    Ok(Outcome {
        stats,
        op: "append",
        latency_of: "append, from when it was due (or sent, if earlier)",
        checks: vec![check],
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

/// One connection of a lane: takes the lane's next append, waits until it is due, sends
/// it, and repeats until the window ends. Appends count by when they were due, so each
/// one due inside the window is counted even if its answer comes after the window ends.
async fn paced_writer(
    mut conn: Conn,
    (lane, ct, payload, win): (Rc<Lane>, Rc<str>, Bytes, Window),
) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", &*ct)];
    while !win.over() {
        let (n, due) = lane.take();
        if due >= win.end {
            break;
        }
        let counted = due >= win.warm_end;
        let now = Instant::now();
        if now > due {
            // This connection was busy when the append came due, and so were the lane's
            // others (each takes the next append as soon as it is free).
            if counted {
                st.count("late_no_connection", 1);
            }
        } else if let Some(wake) = due.checked_sub(TIMER_LEAD) {
            if wake > now {
                monoio::time::sleep(wake - now).await;
            }
        }
        let sent = Instant::now();
        if counted && sent > due {
            st.count("late", 1);
        }
        let from = latency_start(due, sent);
        let r = conn
            .request(
                "POST",
                lane.path(n),
                &headers,
                Body::Shared(payload.clone()),
            )
            .await;
        let took = from.elapsed();
        match r {
            Ok(resp) if (200..300).contains(&resp.status) => {
                if counted {
                    st.requests += 1;
                    st.ops += 1;
                    st.bytes += payload.len() as u64;
                    st.record(took);
                }
            }
            // A 503's Retry-After is not obeyed: the offered load stays what it is, and
            // the refusals are counted by status.
            Ok(resp) => st.failed(counted, status_key(resp.status)),
            Err(e) => {
                st.failed(counted, err_key(&e));
                // Do not spin on a dead server; the lane's other connections go on.
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

/// Whether the server kept up with `--rate`: a server that answers more slowly than the
/// offered load has its appends queue, and its CPU per append is then measured at a lower
/// load than the other servers'. The detail also says how many appends went out late or
/// not at all, which is the client's shortfall rather than the server's when it had too
/// few connections for the latency.
fn offered_load_held(rate: f64, st: &Stats, window: Duration) -> Check {
    let achieved = st.ops as f64 / window.as_secs_f64().max(1e-9);
    let counter = |k| st.counters.get(k).copied().unwrap_or(0);
    Check {
        name: "offered load held".into(),
        passed: achieved >= 0.97 * rate,
        detail: format!(
            "{achieved:.0} of {rate:.0} appends/s; of {} due in the window, {} sent late \
             ({} of them because every connection was busy), {} never sent",
            counter("due"),
            counter("late"),
            counter("late_no_connection"),
            counter("unsent")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(start: Instant, rate: f64, lane: u64, lanes: u64) -> Schedule {
        Schedule {
            start,
            rate,
            lane,
            lanes,
        }
    }

    #[test]
    fn lanes_interleave_into_one_evenly_spaced_stream() {
        let start = Instant::now();
        // 50,000 appends/s over 2 lanes (2 client cores with --spread): one every 20 µs,
        // the lanes alternating.
        let lanes: Vec<Schedule> = (0..2).map(|l| schedule(start, 50_000.0, l, 2)).collect();
        let mut all: Vec<Duration> = lanes
            .iter()
            .flat_map(|s| (0..500).map(|n| s.due(n) - start))
            .collect();
        all.sort();
        let want: Vec<Duration> = (0..1000u64)
            .map(|g| Duration::from_micros(20 * g))
            .collect();
        assert_eq!(all, want);
    }

    #[test]
    fn each_lane_sends_its_share_evenly_starting_a_step_apart() {
        let start = Instant::now();
        // 4 lanes sharing 1,000 appends/s: each sends every 4 ms, their first appends 1 ms
        // apart.
        for l in 0..4u64 {
            let s = schedule(start, 1000.0, l, 4);
            assert_eq!(s.due(0) - start, Duration::from_millis(l));
            for n in 0..100 {
                assert_eq!(
                    s.due(n + 1) - s.due(n),
                    Duration::from_millis(4),
                    "lane {l}"
                );
            }
        }
    }

    #[test]
    fn due_times_do_not_drift_over_a_long_run() {
        let start = Instant::now();
        // A rate whose interval is not a whole number of nanoseconds (3 µs and a third):
        // adding it up a billion times would be off by a third of a second.
        let s = schedule(start, 300_000.0, 0, 1);
        let at = s.due(1_000_000_000) - start;
        let want = Duration::from_secs_f64(1e9 / 300_000.0);
        let off = at.abs_diff(want);
        assert!(off < Duration::from_micros(1), "{at:?} against {want:?}");
    }

    #[test]
    fn due_before_agrees_with_due_on_every_boundary() {
        let start = Instant::now();
        for (rate, lanes) in [
            (1000.0, 1),
            (333.3, 3),
            (50_000.0, 2),
            (7.0, 100),
            (123_457.0, 7),
        ] {
            for lane in [0, lanes - 1, lanes / 2] {
                let s = schedule(start, rate, lane, lanes);
                for n in [0u64, 1, 2, 17, 1000, 123_456] {
                    let due = s.due(n);
                    // Exactly at a due time: that append is not before it.
                    assert_eq!(
                        s.due_before(due),
                        n,
                        "rate {rate} lane {lane}/{lanes} n {n}"
                    );
                    // Just after it: it is.
                    let after = due + Duration::from_nanos(1);
                    assert_eq!(s.due_before(after), n + 1, "rate {rate} lane {lane} n {n}");
                }
                assert_eq!(s.due_before(start), 0);
                // An instant before the start (a window cannot begin there, but the
                // arithmetic must not underflow).
                if let Some(before) = start.checked_sub(Duration::from_secs(1)) {
                    assert_eq!(s.due_before(before), 0);
                }
            }
        }
    }

    fn lane(rate: f64, l: u64, lanes: u64, start: Instant, paths: &[&str]) -> Lane {
        Lane {
            schedule: schedule(start, rate, l, lanes),
            paths: paths
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .into(),
            first_path: 0,
            next: Cell::new(0),
        }
    }

    #[test]
    fn a_lane_hands_out_its_appends_in_order_once_each() {
        let start = Instant::now();
        let l = lane(1000.0, 1, 2, start, &["a"]);
        let taken: Vec<(u64, Duration)> = (0..3)
            .map(|_| {
                let (n, due) = l.take();
                (n, due - start)
            })
            .collect();
        assert_eq!(
            taken,
            [(0, 1), (1, 3), (2, 5)].map(|(n, ms)| (n, Duration::from_millis(ms)))
        );
    }

    #[test]
    fn a_spread_lane_writes_every_stream_in_turn_from_its_own_first() {
        let start = Instant::now();
        let mut l = lane(1000.0, 0, 1, start, &["a", "b", "c"]);
        l.first_path = 2;
        let seen: Vec<&str> = (0..5).map(|n| l.path(n)).collect();
        assert_eq!(seen, ["c", "a", "b", "c", "a"]);
    }

    #[test]
    fn the_tally_counts_the_window_and_what_was_never_sent() {
        let start = Instant::now();
        let win = Window::starting_at(start, Duration::from_secs(1), Duration::from_secs(2));
        // Lane 1 of 4 at 1,000/s: due at 1, 5, 9, ... ms; 500 of them in the 2 s window.
        let l = lane(1000.0, 1, 4, start, &["a"]);
        let first_in_window = l.schedule.due_before(win.warm_end);
        assert_eq!(first_in_window, 250);
        let tally = |next: u64| {
            l.next.set(next);
            let mut st = Stats::default();
            l.tally(&win, &mut st);
            let latency = st.latencies.summary();
            (st.counters["due"], st.counters["unsent"], latency)
        };
        // Everything up to the window's end taken (and one past it, as each connection
        // takes one more before it stops): none unsent, no latency added.
        let (due, unsent, latency) = tally(l.schedule.due_before(win.end) + 1);
        assert_eq!((due, unsent, latency.count), (500, 0, 0));
        // Connections stuck 100 appends before the end: those 100 were never sent, and
        // count with their waits at the end, from 3 ms (due at 2,997 ms) to 399 ms.
        let (due, unsent, latency) = tally(l.schedule.due_before(win.end) - 100);
        assert_eq!((due, unsent, latency.count), (500, 100, 100));
        assert!((latency.max_ms - 399.0).abs() < 0.5, "{latency:?}");
        assert!((latency.p50_ms - 203.0).abs() < 4.5, "{latency:?}");
        // Stuck before the window even began: all of the window's appends unsent.
        let (due, unsent, latency) = tally(10);
        assert_eq!((due, unsent, latency.count), (500, 500, 500));
    }

    #[test]
    fn connections_are_shared_out_evenly_over_the_streams() {
        for (streams, connections) in [(100, 100), (100, 1000), (100, 250), (7, 10), (1, 5)] {
            let shares: Vec<usize> = (0..streams)
                .map(|s| connections_of(s, streams, connections))
                .collect();
            assert_eq!(shares.iter().sum::<usize>(), connections);
            let (lo, hi) = (shares.iter().min(), shares.iter().max());
            assert!(
                lo >= Some(&1),
                "{streams} streams, {connections}: {shares:?}"
            );
            assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "{shares:?}");
        }
    }

    #[test]
    fn latency_runs_from_the_due_time_or_an_earlier_send() {
        let due = Instant::now() + Duration::from_millis(5);
        let early = due - Duration::from_micros(300);
        let late = due + Duration::from_millis(2);
        assert_eq!(latency_start(due, early), early);
        assert_eq!(
            latency_start(due, late),
            due,
            "a late send is timed from its due time"
        );
    }

    #[test]
    fn a_server_below_the_offered_load_fails_the_check() {
        let window = Duration::from_secs(10);
        let mut st = Stats {
            ops: 9_800,
            ..Stats::default()
        };
        st.count("due", 10_000);
        assert!(offered_load_held(1000.0, &st, window).passed);
        st.ops = 9_000;
        st.count("late", 700);
        st.count("late_no_connection", 650);
        st.count("unsent", 300);
        let behind = offered_load_held(1000.0, &st, window);
        assert!(!behind.passed);
        assert_eq!(
            behind.detail,
            "900 of 1000 appends/s; of 10000 due in the window, 700 sent late \
             (650 of them because every connection was busy), 300 never sent"
        );
    }
}
