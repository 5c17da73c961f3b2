//! `fanout`: one writer appends timestamped events to one text stream at a fixed rate; N SSE
//! subscribers (`?offset=now&live=sse`, each its own connection, spread over the cores)
//! measure publish-to-receive latency per delivered event. The stamp is the event's
//! *scheduled* send time on the process clock shared with `tail` (coordinated-omission
//! aware). Every subscriber should receive every event published in the window; the
//! shortfall is reported as `missed_deliveries`.
//!
//! The writer is open-loop: it keeps the schedule even when an append takes longer than the
//! interval, by sending each event on whichever of its `--writer-conns` keep-alive
//! connections is free. A closed-loop writer (one connection, each append waiting for its
//! ack) drifts behind its schedule as soon as acks take longer than the interval, and then
//! measures its own backlog rather than the server's delivery. Events sent on different
//! connections may commit out of sequence order, so subscribers check each sequence number
//! once, not their order.
//!
//! Events are text lines `LG <stamp> <seq>\n` on a `text/plain` stream, so the SSE data
//! lines of one data event, joined with LF (protocol §13.3), are the stream's bytes on any
//! server and either surface. If the server ends an SSE response early the subscriber
//! reconnects from the last control event's `streamNextOffset` (counted as `reconnects`).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Args;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use serde::Serialize;
use ursula_protocol::http1::ChunkedDecoder;

use crate::common::{join_merged, merge_all, run_cores, setup_then_sync, Common, Target};
use crate::common::{Ctx, Window};
use crate::http::{Body, Conn};
use crate::stats::Stats;
use crate::tail::{stamp, unstamp};
use crate::Outcome;

const READ_CHUNK: usize = 16 * 1024;
const MAX_HEAD: usize = 64 * 1024;
/// An SSE line or a pending partial event line longer than this is a protocol error.
const MAX_LINE: usize = 1 << 20;

#[derive(Args, Debug, Clone, Serialize)]
pub struct FanoutArgs {
    #[command(flatten)]
    pub common: Common,
    /// SSE subscribers, one connection each, spread over the cores.
    #[arg(long, default_value_t = 1000)]
    pub subscribers: usize,
    /// Events per second published by the single writer.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// How long subscribers wait after the window for the last events.
    #[arg(long, default_value = "2s", value_parser = crate::common::parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub grace: Duration,
    /// Keep-alive connections the writer spreads its appends over, so the rate holds while
    /// up to this many appends await their acks.
    #[arg(long, default_value_t = 8)]
    pub writer_conns: usize,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The writer's schedule, computed identically on every core.
#[derive(Clone, Copy)]
struct Schedule {
    first: Instant,
    interval: Duration,
    /// Sequence numbers due inside the window: `lo..hi`.
    lo: u64,
    hi: u64,
}

impl Schedule {
    fn new(win: &Window, rate: f64) -> Schedule {
        let interval = Duration::from_secs_f64(1.0 / rate);
        // Give subscribers' connections a moment before the first event.
        let first = win.start + Duration::from_millis(100).min(win.warm_end - win.start);
        let due = |seq: u64| first + interval.mul_f64(seq as f64);
        let mut lo = 0;
        while due(lo) < win.warm_end && due(lo) < win.end {
            lo += 1;
        }
        let mut hi = lo;
        while due(hi) < win.end {
            hi += 1;
        }
        Schedule {
            first,
            interval,
            lo,
            hi,
        }
    }

    fn due(&self, seq: u64) -> Instant {
        self.first + self.interval.mul_f64(seq as f64)
    }
}

pub fn encode_line(out: &mut Vec<u8>, ts: u64, seq: u64) {
    out.clear();
    out.extend_from_slice(format!("LG {ts} {seq}\n").as_bytes());
}

/// Length of the encoded line for (`ts`, `seq`).
fn line_len(ts: u64, seq: u64) -> u64 {
    let digits = |v: u64| u64::from(v.checked_ilog10().unwrap_or(0)) + 1;
    5 + digits(ts) + digits(seq)
}

/// Takes whole `LG <ts> <seq>\n` lines from the front of `buf`; returns bytes consumed.
pub fn decode_lines(buf: &[u8], out: &mut Vec<(u64, u64)>) -> Result<usize, String> {
    let mut used = 0;
    while let Some(nl) = buf[used..].iter().position(|&b| b == b'\n') {
        let line = &buf[used..used + nl];
        let text = std::str::from_utf8(line).map_err(|_| "non-UTF-8 event".to_string())?;
        let mut it = text.split(' ');
        let (Some("LG"), Some(ts), Some(seq), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(format!("bad event line {text:?}"));
        };
        let ts = ts.parse().map_err(|_| format!("bad stamp in {text:?}"))?;
        let seq = seq.parse().map_err(|_| format!("bad seq in {text:?}"))?;
        out.push((ts, seq));
        used += nl + 1;
    }
    Ok(used)
}

/// Incremental SSE parser (protocol §13.3): collects the joined data of `event: data`
/// events and the `streamNextOffset` of control events.
#[derive(Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// Joined data of completed data events, in order.
    pub out: Vec<u8>,
    pub next_offset: Option<String>,
}

impl SseParser {
    pub fn feed(&mut self, mut input: &[u8]) -> Result<(), String> {
        while let Some(nl) = input.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&input[..nl]);
            input = &input[nl + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.on_line(&line);
            line.clear();
            self.line = line;
        }
        self.line.extend_from_slice(input);
        if self.line.len() > MAX_LINE {
            return Err("SSE line too long".into());
        }
        Ok(())
    }

    fn on_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            if self.event == b"data" && self.has_data {
                self.out.extend_from_slice(&self.data);
            } else if self.event == b"control" {
                if let Some(o) = control_offset(&self.data) {
                    self.next_offset = Some(o);
                }
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            _ => {}
        }
    }
}

fn control_offset(data: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(data).ok()?;
    let key = "\"streamNextOffset\":\"";
    let at = text.find(key)? + key.len();
    let end = text[at..].find('"')?;
    Some(text[at..at + end].to_string())
}

pub fn run(args: &FanoutArgs, target: &Target, cores: usize) -> Result<Outcome, String> {
    if args.subscribers == 0 {
        return Err("--subscribers must be at least 1".into());
    }
    if !(args.rate > 0.0 && args.rate <= 100_000.0) {
        return Err("--rate must be in (0, 100000]".into());
    }
    if !(1..=256).contains(&args.writer_conns) {
        return Err("--writer-conns must be in 1..=256".into());
    }
    let a = args.clone();
    let t = target.clone();
    let parts = run_cores(cores, move |ctx: Ctx| {
        let a = a.clone();
        let t = t.clone();
        async move {
            let timeout = a.common.timeout;
            let path = t.stream_path(&t.stream_name("fanout", 0));
            let setup = async {
                // Every core creates the stream (idempotent) before its subscribers open.
                let mut c = Conn::new(t.addr, timeout);
                t.ensure_bucket(&mut c).await?;
                t.create_stream(&mut c, &path, "text/plain").await?;
                let mut subs = Vec::new();
                for _ in ctx.mine(a.subscribers) {
                    subs.push(Sub::open(&t, &path, "now", timeout).await?);
                }
                Ok(subs)
            };
            let subs = setup_then_sync(&ctx, setup).await?;
            let win = ctx.window(a.common.warmup, a.common.duration);
            let sched = Schedule::new(&win, a.rate);
            let stop = win.end + a.grace;
            let mut tasks = Vec::with_capacity(subs.len() + 1);
            for s in subs {
                let (t, path) = (t.clone(), path.clone());
                tasks.push(monoio::spawn(subscriber(s, t, path, sched, stop)));
            }
            if ctx.core == 0 {
                let subscribers = a.subscribers as u64;
                let next = Rc::new(Cell::new(0u64));
                for _ in 0..a.writer_conns {
                    let conn = Conn::new(t.addr, timeout);
                    let w = writer(conn, path.clone(), sched, subscribers, next.clone());
                    tasks.push(monoio::spawn(w));
                }
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
    stats.count("missed_deliveries", expected.saturating_sub(stats.ops));
    Ok(Outcome {
        stats,
        op: "delivery",
        latency_of: "publish-to-receive (scheduled send to SSE data event)",
        checks: Vec::new(),
        window: args.common.duration,
        warmup: args.common.warmup,
    })
}

/// One of the writer's connections: claims the next unsent sequence number, waits for its
/// due time, appends it and waits for the ack, then claims the next. While this connection
/// waits on an ack, the others take the events that fall due.
async fn writer(
    mut conn: Conn,
    path: String,
    sched: Schedule,
    subscribers: u64,
    next: Rc<Cell<u64>>,
) -> Stats {
    let mut st = Stats::default();
    let headers = [("Content-Type", "text/plain")];
    let mut body = Vec::with_capacity(64);
    loop {
        let seq = next.get();
        if seq >= sched.hi {
            break;
        }
        next.set(seq + 1);
        let due = sched.due(seq);
        let now = Instant::now();
        if due > now {
            monoio::time::sleep(due - now).await;
        }
        encode_line(&mut body, stamp(due), seq);
        let r = conn
            .request("POST", &path, &headers, Body::Slice(&body))
            .await;
        let in_window = seq >= sched.lo;
        if in_window {
            st.requests += 1;
        }
        crate::tail::count_publish(&mut st, &r, in_window, subscribers);
    }
    st
}

/// The sequence numbers a subscriber has received. Appends sent on different writer
/// connections may commit out of order, so this is a set, kept small: everything below
/// `floor` was seen, and only the numbers that arrived ahead of a gap are stored.
#[derive(Default)]
struct Seen {
    floor: u64,
    ahead: std::collections::BTreeSet<u64>,
}

impl Seen {
    /// False when `seq` was already seen.
    fn insert(&mut self, seq: u64) -> bool {
        if seq < self.floor || !self.ahead.insert(seq) {
            return false;
        }
        while self.ahead.remove(&self.floor) {
            self.floor += 1;
        }
        true
    }
}

/// One open SSE response.
struct Sub {
    stream: TcpStream,
    /// Bytes read past the response head, not yet decoded.
    rbuf: Vec<u8>,
    dec: ChunkedDecoder,
    chunked: bool,
}

impl Sub {
    async fn open(t: &Target, path: &str, offset: &str, timeout: Duration) -> Result<Sub, String> {
        match monoio::time::timeout(timeout, Sub::open_inner(t, path, offset)).await {
            Ok(r) => r,
            Err(_) => Err(format!("SSE GET {path}: timeout")),
        }
    }

    async fn open_inner(t: &Target, path: &str, offset: &str) -> Result<Sub, String> {
        let mut stream = TcpStream::connect(t.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let req = format!(
            "GET {path}?offset={offset}&live=sse HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
            t.addr
        );
        let (r, _) = stream.write_all(req.into_bytes()).await;
        r.map_err(|e| format!("SSE GET {path}: {e}"))?;
        let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        loop {
            let (len, cap) = (buf.len(), buf.capacity());
            if cap - len < 1024 {
                buf.reserve(READ_CHUNK);
            }
            let cap = buf.capacity();
            let (res, slice) = stream.read(buf.slice_mut(len..cap)).await;
            buf = slice.into_inner();
            match res {
                Ok(0) => return Err(format!("SSE GET {path}: closed before response")),
                Ok(_) => {}
                Err(e) => return Err(format!("SSE GET {path}: {e}")),
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            let used = match resp.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => continue,
                Ok(httparse::Status::Partial) => return Err("SSE head too large".into()),
                Err(e) => return Err(format!("SSE GET {path}: bad response: {e}")),
            };
            let status = resp.code.unwrap_or(0);
            if status != 200 {
                return Err(format!("SSE GET {path}: status {status}"));
            }
            let chunked = resp.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("transfer-encoding")
                    && String::from_utf8_lossy(h.value)
                        .to_ascii_lowercase()
                        .contains("chunked")
            });
            buf.drain(..used);
            return Ok(Sub {
                stream,
                rbuf: buf,
                dec: ChunkedDecoder::new(),
                chunked,
            });
        }
    }

    /// Reads and de-chunks more of the body into `out`; `Ok(false)` when it ended.
    async fn next(&mut self, out: &mut Vec<u8>) -> Result<bool, String> {
        if !self.rbuf.is_empty() {
            // Leftover from the response head's read: hand it out before blocking.
            return self.take(out);
        }
        let mut buf = std::mem::take(&mut self.rbuf);
        buf.clear();
        if buf.capacity() < READ_CHUNK {
            buf.reserve(READ_CHUNK);
        }
        let cap = buf.capacity();
        let (res, slice) = self.stream.read(buf.slice_mut(0..cap)).await;
        self.rbuf = slice.into_inner();
        match res {
            Ok(0) => Ok(false),
            Ok(_) => self.take(out),
            Err(e) => Err(format!("read: {e}")),
        }
    }

    fn take(&mut self, out: &mut Vec<u8>) -> Result<bool, String> {
        if !self.chunked {
            out.extend_from_slice(&self.rbuf);
            self.rbuf.clear();
            return Ok(true);
        }
        let (used, done) = self
            .dec
            .feed(&self.rbuf, out)
            .map_err(|e| format!("chunked: {e}"))?;
        self.rbuf.drain(..used);
        Ok(!done)
    }
}

async fn subscriber(
    mut sub: Sub,
    t: Target,
    path: String,
    sched: Schedule,
    stop: Instant,
) -> Stats {
    let mut st = Stats::default();
    let mut sse = SseParser::default();
    let mut body = Vec::with_capacity(READ_CHUNK);
    let mut events = Vec::new();
    let mut seen = Seen::default();
    let mut in_window_left = sched.hi - sched.lo;
    // Done once every in-window event arrived (or at `stop`).
    while in_window_left > 0 {
        let now = Instant::now();
        if now >= stop {
            break;
        }
        body.clear();
        let r = monoio::time::timeout(stop - now, sub.next(&mut body)).await;
        let now = Instant::now();
        let more = match r {
            Err(_) => break,
            Ok(Ok(more)) => more,
            Ok(Err(e)) => {
                st.error(format!("sse {e}"));
                false
            }
        };
        if let Err(e) = sse.feed(&body) {
            st.error(format!("sse {e}"));
            break;
        }
        events.clear();
        match decode_lines(&sse.out, &mut events) {
            Ok(used) => {
                sse.out.drain(..used);
            }
            Err(_) => {
                st.error("bad event");
                break;
            }
        }
        if sse.out.len() > MAX_LINE {
            st.error("bad event");
            break;
        }
        for &(ts, seq) in &events {
            if seq >= sched.hi {
                st.error("unexpected sequence number");
                continue;
            }
            if !seen.insert(seq) {
                st.error("duplicate delivery");
                continue;
            }
            if (sched.lo..sched.hi).contains(&seq) {
                in_window_left -= 1;
                st.ops += 1;
                st.bytes += line_len(ts, seq);
                st.record(now.saturating_duration_since(unstamp(ts)));
            }
        }
        if !more {
            // The response ended: resume from the last position the server reported.
            let Some(offset) = sse.next_offset.clone() else {
                st.error("sse ended without a control event");
                break;
            };
            if Instant::now() >= stop {
                break;
            }
            st.count("reconnects", 1);
            sse = SseParser {
                next_offset: Some(offset.clone()),
                ..SseParser::default()
            };
            match Sub::open(&t, &path, &offset, stop - Instant::now()).await {
                Ok(s) => sub = s,
                Err(e) => {
                    st.error(format!("sse reconnect: {e}"));
                    break;
                }
            }
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let mut buf = Vec::new();
        let mut l = Vec::new();
        for seq in 0..3 {
            encode_line(&mut l, 1000 + seq, seq);
            buf.extend_from_slice(&l);
        }
        assert_eq!(line_len(1002, 2), l.len() as u64);
        assert_eq!(line_len(0, 10), 8);
        let mut out = Vec::new();
        let used = decode_lines(&buf[..buf.len() - 3], &mut out).unwrap();
        assert_eq!(out, vec![(1000, 0), (1001, 1)]);
        out.clear();
        assert_eq!(
            decode_lines(&buf[used..], &mut out).unwrap(),
            buf.len() - used
        );
        assert_eq!(out, vec![(1002, 2)]);
        assert!(decode_lines(b"XX 1 2\n", &mut out).is_err());
    }

    #[test]
    fn sse_events_split_anywhere() {
        let raw = b"event: control\ndata:{\"streamNextOffset\":\"00000000000000000007\",\"upToDate\":true}\n\n:\n\nevent: data\ndata:LG 5 0\ndata:LG 6 1\ndata:\n\nevent: data\ndata:LG 7 2\ndata:\n\n";
        for cut in 0..raw.len() {
            let mut p = SseParser::default();
            p.feed(&raw[..cut]).unwrap();
            p.feed(&raw[cut..]).unwrap();
            assert_eq!(p.out, b"LG 5 0\nLG 6 1\nLG 7 2\n", "cut {cut}");
            assert_eq!(p.next_offset.as_deref(), Some("00000000000000000007"));
        }
    }

    #[test]
    fn seen_accepts_each_number_once_in_any_order() {
        let mut s = Seen::default();
        for seq in [1, 0, 3, 2, 5] {
            assert!(s.insert(seq), "{seq}");
        }
        assert_eq!(s.floor, 4);
        assert_eq!(s.ahead.len(), 1);
        for seq in [0, 3, 5] {
            assert!(!s.insert(seq), "{seq} again");
        }
        assert!(s.insert(4));
        assert_eq!((s.floor, s.ahead.len()), (6, 0));
    }

    #[test]
    fn schedule_window() {
        let start = Instant::now();
        let win = Window::starting_at(start, Duration::from_secs(1), Duration::from_secs(2));
        let s = Schedule::new(&win, 10.0);
        // first = start + 100 ms; due(seq) = first + seq * 100 ms.
        assert_eq!(s.lo, 9);
        assert_eq!(s.hi, 29);
        assert!(s.due(s.lo) >= win.warm_end && s.due(s.hi - 1) < win.end);
    }
}
