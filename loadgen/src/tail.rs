//! `tail`: long-poll tailing latency. One writer per stream publishes at a fixed rate,
//! stamping each event with its *scheduled* send time (so a writer that falls behind
//! shows up in the latency: coordinated-omission aware); N long-poll readers measure
//! publish-to-receive per delivered event.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::common::Window;
use crate::common::{
    err_key, join_merged, merge_all, run_cores, setup_then_sync, status_key, Common, Target,
};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::Outcome;

const MAGIC: &[u8; 4] = b"LGTS";
/// magic + u64 stamp (ns since process clock base) + u64 sequence.
pub const MIN_EVENT: usize = 20;

static CLOCK: OnceLock<Instant> = OnceLock::new();

/// Fixes the process-wide clock base shared by writer and reader threads.
pub fn init_clock() {
    let _ = CLOCK.get_or_init(Instant::now);
}

fn clock_base() -> Instant {
    *CLOCK.get_or_init(Instant::now)
}

pub fn stamp(t: Instant) -> u64 {
    t.saturating_duration_since(clock_base()).as_nanos() as u64
}

pub fn unstamp(ns: u64) -> Instant {
    clock_base() + Duration::from_nanos(ns)
}

pub fn encode_event(out: &mut Vec<u8>, ts: u64, seq: u64, size: usize) {
    out.clear();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.resize(size.max(MIN_EVENT), b'.');
}

/// Parses whole events from `buf` (fixed `size`), returning their (stamp, seq) and how many
/// bytes were consumed; `Err` on a malformed event.
pub fn decode_events(buf: &[u8], size: usize, out: &mut Vec<(u64, u64)>) -> Result<usize, String> {
    let size = size.max(MIN_EVENT);
    let mut used = 0;
    while buf.len() - used >= size {
        let ev = &buf[used..used + size];
        if &ev[..4] != MAGIC {
            return Err(format!("bad event magic at byte {used}"));
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&ev[4..12]);
        let mut b = [0u8; 8];
        b.copy_from_slice(&ev[12..20]);
        out.push((u64::from_le_bytes(a), u64::from_le_bytes(b)));
        used += size;
    }
    Ok(used)
}

#[derive(Args, Debug, Clone, Serialize)]
pub struct TailArgs {
    #[command(flatten)]
    pub common: Common,
    /// Streams, each with one writer.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Long-poll readers in total (spread over the streams).
    #[arg(long, default_value_t = 10)]
    pub readers: usize,
    /// Events per second per stream.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Event size in bytes (at least 20).
    #[arg(long, default_value_t = 64)]
    pub event_size: usize,
    /// How long readers keep polling after the writers stop, to collect the last events.
    #[arg(long, default_value = "2s", value_parser = crate::common::parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub grace: Duration,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

pub fn run(args: &TailArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.streams == 0 || args.readers == 0 {
        return Err("--streams and --readers must be > 0".into());
    }
    if !(args.rate > 0.0 && args.rate <= 100_000.0) {
        return Err("--rate must be in (0, 100000]".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let setup = async {
                let mut c = Conn::new(t.addr, timeout);
                t.ensure_bucket(&mut c).await?;
                for s in ctx.mine(a.streams) {
                    let path = t.stream_path(&t.stream_name("tail", s));
                    t.create_stream(&mut c, &path, "application/octet-stream")
                        .await?;
                }
                Ok(())
            };
            setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let mut tasks = Vec::new();
            for r in ctx.mine(a.readers) {
                let path = t.stream_path(&t.stream_name("tail", r % a.streams));
                let conn = Conn::new(t.addr, timeout);
                tasks.push(monoio::spawn(reader(
                    conn,
                    path,
                    a.event_size,
                    win,
                    a.grace,
                )));
            }
            for s in ctx.mine(a.streams) {
                let path = t.stream_path(&t.stream_name("tail", s));
                let conn = Conn::new(t.addr, timeout);
                // Readers of stream s: r in 0..readers with r % streams == s.
                let readers = (a.readers + a.streams - 1 - s) / a.streams;
                tasks.push(monoio::spawn(writer(
                    conn,
                    path,
                    a.event_size,
                    a.rate,
                    win,
                    readers as u64,
                )));
            }
            Ok(join_merged(tasks).await)
        }
    })?;
    let mut stats = merge_all(parts);
    let expected = stats
        .counters
        .get("expected_deliveries")
        .copied()
        .unwrap_or(0);
    let delivered = stats.ops;
    stats.count("missed_deliveries", expected.saturating_sub(delivered));
    Ok(Outcome {
        stats,
        op: "delivery",
        latency_of: "publish-to-receive (scheduled send to long-poll response)",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

async fn writer(
    mut conn: Conn,
    path: String,
    size: usize,
    rate: f64,
    win: Window,
    readers: u64,
) -> Stats {
    let mut st = Stats::default();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let headers = [("Content-Type", "application/octet-stream")];
    let mut body = Vec::with_capacity(size.max(MIN_EVENT));
    // Give readers a moment to park their first long-poll.
    let first = win.start + Duration::from_millis(200).min(win.warm_end - win.start);
    for seq in 0u64.. {
        let due = first + interval.mul_f64(seq as f64);
        if due >= win.end {
            break;
        }
        let now = Instant::now();
        if due > now {
            monoio::time::sleep(due - now).await;
        }
        encode_event(&mut body, stamp(due), seq, size);
        let r = conn
            .request("POST", &path, &headers, Body::Slice(&body))
            .await;
        let in_window = due >= win.warm_end;
        count_publish(&mut st, &r, in_window, readers);
    }
    st
}

async fn reader(mut conn: Conn, path: String, size: usize, win: Window, grace: Duration) -> Stats {
    let mut st = Stats::default();
    let stop = win.end + grace;
    // Start at the current tail.
    let mut offset = match conn.get(&format!("{path}?offset=now")).await {
        Ok(r) if r.status == 200 => match r.next_offset {
            Some(o) => o,
            None => {
                st.error("missing Stream-Next-Offset");
                return st;
            }
        },
        Ok(r) => {
            st.error(status_key(r.status));
            return st;
        }
        Err(e) => {
            st.error(err_key(&e));
            return st;
        }
    };
    let mut carry: Vec<u8> = Vec::new();
    let mut events = Vec::new();
    while Instant::now() < stop {
        let url = format!("{path}?offset={offset}&live=long-poll");
        let r = conn.get(&url).await;
        let now = Instant::now();
        st.requests += 1;
        match r {
            Ok(resp) if resp.status == 200 || resp.status == 204 => {
                if resp.status == 200 {
                    carry.extend_from_slice(&resp.body);
                    events.clear();
                    match decode_events(&carry, size, &mut events) {
                        Ok(used) => {
                            carry.drain(..used);
                        }
                        Err(e) => {
                            st.error("bad event");
                            st.count("bad_events", 1);
                            let _ = e;
                            carry.clear();
                        }
                    }
                    for &(ts, _) in &events {
                        let due = unstamp(ts);
                        if due >= win.warm_end && due < win.end {
                            st.ops += 1;
                            st.bytes += size.max(MIN_EVENT) as u64;
                            st.record(now.saturating_duration_since(due));
                        }
                    }
                    conn.recycle(resp.body);
                }
                match resp.next_offset {
                    Some(o) => offset = o,
                    None => {
                        st.error("missing Stream-Next-Offset");
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                if resp.closed {
                    break;
                }
            }
            Ok(resp) => {
                st.error(status_key(resp.status));
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => {
                st.error(err_key(&e));
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    st
}

/// Account for one publish of a latency scenario (`tail`, `fanout`): inside the measured
/// window a success expects a delivery to each of `receivers`, a failure is an error.
pub fn count_publish(
    st: &mut Stats,
    r: &Result<crate::http::Response, crate::http::ReqError>,
    in_window: bool,
    receivers: u64,
) {
    if !in_window {
        return;
    }
    match r {
        Ok(resp) if (200..300).contains(&resp.status) => {
            st.count("published", 1);
            st.count("expected_deliveries", receivers);
        }
        Ok(resp) => st.error(format!("publish {}", status_key(resp.status))),
        Err(e) => st.error(format!("publish {}", err_key(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_carry() {
        let mut buf = Vec::new();
        let mut ev = Vec::new();
        for seq in 0..3u64 {
            encode_event(&mut ev, 1000 + seq, seq, 32);
            buf.extend_from_slice(&ev);
        }
        let mut out = Vec::new();
        // Split mid-event: only whole events are taken.
        let used = decode_events(&buf[..80], 32, &mut out).unwrap();
        assert_eq!(used, 64);
        assert_eq!(out, vec![(1000, 0), (1001, 1)]);
        out.clear();
        let used = decode_events(&buf[64..], 32, &mut out).unwrap();
        assert_eq!(used, 32);
        assert_eq!(out, vec![(1002, 2)]);
        assert!(decode_events(&[0u8; 32], 32, &mut out).is_err());
    }

    #[test]
    fn clock_round_trip() {
        init_clock();
        let t = Instant::now();
        let back = unstamp(stamp(t));
        assert!(back <= t && t - back < Duration::from_micros(1));
    }
}
