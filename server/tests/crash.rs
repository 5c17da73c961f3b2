//! Crash checker: `kill -9` the server while writers are mid-flight, restart it on the
//! same data dir, and verify that nothing acknowledged was lost or changed and that
//! nothing but whole, actually-sent appends appeared.
//!
//! `URSULA_CRASH_CYCLES` (default 3) sets the number of kill/restart cycles;
//! `URSULA_CRASH_SEED` replays a run (the seed is printed at the start).
//! `scripts/crash-loop [N]` runs only this test, in release mode, with N cycles.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::{offset_token, temp_dir, Client, Rng, Server};

const MAX_READ: usize = 8 * 1024 * 1024;
const WRITERS: usize = 4;
const PRODUCER_ID: &str = "crash-producer";
const PRODUCER_EPOCH: u64 = 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Text,
    Binary,
    Json,
}

/// (name, content type, kind). The last one is written only with producer headers.
const STREAMS: &[(&str, &str, Kind)] = &[
    ("crash-text-0", "text/plain", Kind::Text),
    ("crash-text-1", "text/plain", Kind::Text),
    ("crash-bin-0", "application/octet-stream", Kind::Binary),
    ("crash-bin-1", "application/octet-stream", Kind::Binary),
    ("crash-json-0", "application/json", Kind::Json),
    ("crash-prod", "application/octet-stream", Kind::Binary),
];
const PROD_STREAM: usize = 5;
const PLAIN_STREAMS: u64 = 5;

/// One append as it lands in the stream's canonical byte log.
#[derive(Clone)]
struct Append {
    start: u64,
    /// Canonical bytes (for JSON: each message compacted + LF).
    bytes: Vec<u8>,
}

impl Append {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

#[derive(Default)]
struct StreamState {
    /// Acknowledged appends (plus in-flight ones found after a restart), all cycles.
    acked: Vec<Append>,
    /// Canonical bytes of appends sent in this cycle whose outcome is unknown.
    uncertain: Vec<Vec<u8>>,
    /// Log length seen at the last verification.
    verified_len: u64,
}

#[derive(Default)]
struct ProducerState {
    next_seq: u64,
    /// (seq, body, Stream-Next-Offset) of the last acknowledged producer append.
    last_acked: Option<(u64, Vec<u8>, u64)>,
    /// A producer append in flight at the kill: (seq, body).
    uncertain: Option<(u64, Vec<u8>)>,
}

struct Shared {
    streams: Vec<Mutex<StreamState>>,
    producer: Mutex<ProducerState>,
    errors: Mutex<Vec<String>>,
}

#[derive(Default, Clone, Copy)]
struct WriterStats {
    acked: u64,
    acked_bytes: u64,
    uncertain: u64,
    rejected_503: u64,
}

fn path_of(stream: usize) -> String {
    format!("/v1/stream/{}", STREAMS[stream].0)
}

fn filler(rng: &mut Rng, kind: Kind, n: usize, out: &mut Vec<u8>) {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x = rng.next_u64();
    for i in 0..n {
        if i % 8 == 0 {
            x = rng.next_u64();
        }
        let b = (x >> ((i % 8) * 8)) as u8;
        out.push(match kind {
            Kind::Binary => b,
            Kind::Text | Kind::Json => ALNUM[b as usize % ALNUM.len()],
        });
    }
}

/// Build a request body of about `size` bytes and its canonical log bytes. `tag` makes
/// every payload unique.
fn make_payload(rng: &mut Rng, kind: Kind, tag: &str, size: usize) -> (Vec<u8>, Vec<u8>) {
    match kind {
        Kind::Text | Kind::Binary => {
            let mut b = Vec::with_capacity(size.max(tag.len()));
            b.extend_from_slice(tag.as_bytes());
            let n = size.saturating_sub(b.len());
            filler(rng, kind, n, &mut b);
            (b.clone(), b)
        }
        Kind::Json => {
            // Already-canonical compact objects; sometimes a batch (array flattened one
            // level by the server into several messages).
            let msgs = if rng.chance(0.2) {
                rng.range(2, 3) as usize
            } else {
                1
            };
            let per = (size / msgs).max(1);
            let mut objs = Vec::new();
            for m in 0..msgs {
                let mut o = format!(
                    "{{\"t\":\"{tag}/{m}\",\"n\":{},\"p\":\"",
                    rng.range(0, 1 << 40)
                )
                .into_bytes();
                let n = per.saturating_sub(o.len() + 2);
                filler(rng, Kind::Json, n, &mut o);
                o.extend_from_slice(b"\"}");
                objs.push(o);
            }
            let mut canonical = Vec::new();
            for o in &objs {
                canonical.extend_from_slice(o);
                canonical.push(b'\n');
            }
            let body = if msgs == 1 {
                objs.pop().unwrap()
            } else {
                let mut b = vec![b'['];
                b.extend_from_slice(&objs.join(&b","[..]));
                b.push(b']');
                b
            };
            (body, canonical)
        }
    }
}

fn payload_size(rng: &mut Rng) -> usize {
    if rng.chance(0.005) {
        1 << 20
    } else {
        rng.log_size(16, 64 * 1024)
    }
}

fn record_error(shared: &Shared, msg: String) {
    eprintln!("crash test error: {msg}");
    shared.errors.lock().unwrap().push(msg);
}

/// Append to a plain stream once. Returns false when the writer should stop.
fn plain_append(
    shared: &Shared,
    client: &mut Client,
    rng: &mut Rng,
    stats: &mut WriterStats,
    tag: &str,
) -> bool {
    let si = rng.range(0, PLAIN_STREAMS - 1) as usize;
    let (_, ctype, kind) = STREAMS[si];
    let size = payload_size(rng);
    let (body, canonical) = make_payload(rng, kind, tag, size);
    if client.connect().is_err() {
        return false; // server is gone: nothing was sent
    }
    match client.request("POST", &path_of(si), &[("Content-Type", ctype)], &body) {
        Ok(resp) if resp.is_success() => {
            let Some(next) = resp.next_offset() else {
                record_error(
                    shared,
                    format!(
                        "{}: {} without Stream-Next-Offset",
                        STREAMS[si].0, resp.status
                    ),
                );
                return false;
            };
            let len = canonical.len() as u64;
            if next < len {
                record_error(
                    shared,
                    format!(
                        "{}: Stream-Next-Offset {next} < append length {len}",
                        STREAMS[si].0
                    ),
                );
                return false;
            }
            stats.acked += 1;
            stats.acked_bytes += len;
            shared.streams[si].lock().unwrap().acked.push(Append {
                start: next - len,
                bytes: canonical,
            });
            true
        }
        Ok(resp) if resp.status == 503 => {
            stats.rejected_503 += 1;
            thread::sleep(Duration::from_millis(10));
            true
        }
        Ok(resp) => {
            record_error(
                shared,
                format!(
                    "{}: append answered {}: {}",
                    STREAMS[si].0,
                    resp.status,
                    resp.body_str()
                ),
            );
            false
        }
        Err(_) => {
            // Sent (at least partly) with unknown outcome: it may or may not be in the log.
            stats.uncertain += 1;
            shared.streams[si].lock().unwrap().uncertain.push(canonical);
            true
        }
    }
}

/// One producer append (retried on transient errors). Returns false when the writer
/// should stop.
fn producer_append(
    shared: &Shared,
    client: &mut Client,
    rng: &mut Rng,
    stats: &mut WriterStats,
    tag: &str,
) -> bool {
    let seq = shared.producer.lock().unwrap().next_seq;
    let size = payload_size(rng).min(64 * 1024);
    let (body, _) = make_payload(rng, Kind::Binary, &format!("{tag}P{seq}|"), size);
    let epoch = PRODUCER_EPOCH.to_string();
    let seq_s = seq.to_string();
    let mut sent = false;
    loop {
        if client.connect().is_err() {
            if sent {
                stats.uncertain += 1;
                shared.producer.lock().unwrap().uncertain = Some((seq, body.clone()));
                shared.streams[PROD_STREAM]
                    .lock()
                    .unwrap()
                    .uncertain
                    .push(body);
            }
            return false;
        }
        sent = true;
        let headers = [
            ("Content-Type", STREAMS[PROD_STREAM].1),
            ("Producer-Id", PRODUCER_ID),
            ("Producer-Epoch", epoch.as_str()),
            ("Producer-Seq", seq_s.as_str()),
        ];
        match client.request("POST", &path_of(PROD_STREAM), &headers, &body) {
            Ok(resp) if resp.status == 200 || resp.status == 204 => {
                // 204 = our own earlier attempt of this seq was committed (duplicate).
                let Some(next) = resp.next_offset() else {
                    record_error(
                        shared,
                        format!(
                            "producer seq {seq}: {} without Stream-Next-Offset",
                            resp.status
                        ),
                    );
                    return false;
                };
                if resp.status == 200 && resp.header("producer-seq") != Some(seq_s.as_str()) {
                    record_error(
                        shared,
                        format!(
                            "producer seq {seq}: 200 with Producer-Seq {:?}",
                            resp.header("producer-seq")
                        ),
                    );
                    return false;
                }
                let len = body.len() as u64;
                if next < len {
                    record_error(
                        shared,
                        format!("producer seq {seq}: Stream-Next-Offset {next} < length {len}"),
                    );
                    return false;
                }
                stats.acked += 1;
                stats.acked_bytes += len;
                shared.streams[PROD_STREAM]
                    .lock()
                    .unwrap()
                    .acked
                    .push(Append {
                        start: next - len,
                        bytes: body.clone(),
                    });
                let mut p = shared.producer.lock().unwrap();
                p.last_acked = Some((seq, body, next));
                p.next_seq = seq + 1;
                return true;
            }
            Ok(resp) if resp.status == 503 => {
                stats.rejected_503 += 1;
                thread::sleep(Duration::from_millis(10));
            }
            Ok(resp) => {
                record_error(
                    shared,
                    format!(
                        "producer seq {seq}: answered {}: {}",
                        resp.status,
                        resp.body_str()
                    ),
                );
                return false;
            }
            Err(_) => {
                // Unknown outcome; retry the same (epoch, seq, body) if the server is
                // still up (dedup makes that safe), else record it as in flight.
            }
        }
    }
}

fn writer(
    id: usize,
    addr: String,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    seed: u64,
    cycle: usize,
) -> WriterStats {
    let mut rng = Rng::new(seed);
    let mut client = Client::new(&addr);
    let mut stats = WriterStats::default();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let tag = format!("c{cycle}w{id}n{n}|");
        n += 1;
        let go_on = if id == 0 && n & 1 == 0 {
            producer_append(&shared, &mut client, &mut rng, &mut stats, &tag)
        } else {
            plain_append(&shared, &mut client, &mut rng, &mut stats, &tag)
        };
        if !go_on {
            break;
        }
    }
    stats
}

/// Split a ds-profile JSON array body into canonical messages (each + LF).
fn canonical_from_array(body: &[u8]) -> Result<Vec<u8>, String> {
    let s = body.trim_ascii();
    if s.first() != Some(&b'[') || s.last() != Some(&b']') {
        return Err(format!(
            "JSON read body is not an array: {:?}",
            String::from_utf8_lossy(&s[..s.len().min(80)])
        ));
    }
    let inner = &s[1..s.len() - 1];
    let mut out = Vec::with_capacity(inner.len() + 16);
    let (mut depth, mut in_str, mut esc, mut start) = (0i32, false, false, 0usize);
    let push = |elem: &[u8], out: &mut Vec<u8>| -> Result<(), String> {
        let e = elem.trim_ascii();
        if e.is_empty() {
            return Err("empty element in JSON array read".into());
        }
        out.extend_from_slice(e);
        out.push(b'\n');
        Ok(())
    };
    for (i, &c) in inner.iter().enumerate() {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => {
                push(&inner[start..i], &mut out)?;
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner.trim_ascii().is_empty() {
        push(&inner[start..], &mut out)?;
    }
    Ok(out)
}

/// Read a stream's whole canonical log by catch-up reads from `-1`.
fn read_log(client: &mut Client, stream: usize) -> Result<Vec<u8>, String> {
    let (name, _, kind) = STREAMS[stream];
    let mut log = Vec::new();
    let mut offset = "-1".to_string();
    loop {
        let path = format!("/v1/stream/{name}?offset={offset}");
        let resp = client
            .request("GET", &path, &[], &[])
            .map_err(|e| format!("GET {path}: {e}"))?;
        if resp.status != 200 {
            return Err(format!(
                "GET {path}: status {} {}",
                resp.status,
                resp.body_str()
            ));
        }
        if resp.body.len() > MAX_READ {
            return Err(format!(
                "GET {path}: body of {} bytes exceeds 8 MiB",
                resp.body.len()
            ));
        }
        let next = resp
            .next_offset()
            .ok_or_else(|| format!("GET {path}: no valid Stream-Next-Offset"))?;
        let up_to_date = resp.header("stream-up-to-date") == Some("true");
        let chunk = if kind == Kind::Json {
            canonical_from_array(&resp.body).map_err(|e| format!("GET {path}: {e}"))?
        } else {
            resp.body
        };
        let expect = log.len() as u64 + chunk.len() as u64;
        if next != expect {
            return Err(format!(
                "GET {path}: Stream-Next-Offset {next} but {} bytes read so far",
                expect
            ));
        }
        log.extend_from_slice(&chunk);
        if up_to_date {
            return Ok(log);
        }
        if chunk.is_empty() {
            return Err(format!("GET {path}: empty body but not up to date"));
        }
        offset = offset_token(next);
    }
}

fn snippet(b: &[u8]) -> String {
    let s = &b[..b.len().min(48)];
    format!("{:?}", String::from_utf8_lossy(s))
}

/// Check `log` against what was acknowledged; promote in-flight appends that made it.
/// Returns (recovered in-flight, lost in-flight).
fn verify_stream(st: &mut StreamState, name: &str, log: &[u8]) -> Result<(usize, usize), String> {
    st.acked.sort_by_key(|a| a.start);
    let mut cands = std::mem::take(&mut st.uncertain);
    let mut promoted = Vec::new();
    let mut pos = 0usize;
    let mut ai = 0usize;
    while pos < log.len() {
        if let Some(a) = st.acked.get(ai) {
            let start = a.start as usize;
            if start < pos {
                return Err(format!(
                    "{name}: acknowledged append at {start} (len {}) overlaps bytes already accounted for up to {pos}",
                    a.bytes.len()
                ));
            }
            if start == pos {
                let end = pos + a.bytes.len();
                if end > log.len() {
                    return Err(format!(
                        "{name}: log is {} bytes but the acknowledged append at {start} ends at {end}",
                        log.len()
                    ));
                }
                if log[pos..end] != a.bytes[..] {
                    let d = (0..a.bytes.len())
                        .find(|&i| log[pos + i] != a.bytes[i])
                        .unwrap_or(0);
                    return Err(format!(
                        "{name}: acknowledged append at {start} (len {}) differs at byte {} : log has {} expected {}",
                        a.bytes.len(),
                        start + d,
                        snippet(&log[pos + d..end]),
                        snippet(&a.bytes[d..])
                    ));
                }
                pos = end;
                ai += 1;
                continue;
            }
        }
        let limit = st
            .acked
            .get(ai)
            .map(|a| a.start as usize)
            .unwrap_or(log.len());
        let found = cands
            .iter()
            .position(|c| pos + c.len() <= limit && log[pos..pos + c.len()] == c[..]);
        match found {
            Some(i) => {
                let c = cands.swap_remove(i);
                let len = c.len();
                promoted.push(Append {
                    start: pos as u64,
                    bytes: c,
                });
                pos += len;
            }
            None => {
                return Err(format!(
                    "{name}: bytes {pos}..{limit} are neither acknowledged nor a whole in-flight append (of {} candidates): {}",
                    cands.len(),
                    snippet(&log[pos..limit])
                ));
            }
        }
    }
    if let Some(a) = st.acked.get(ai) {
        let max_end = st.acked.iter().map(Append::end).max().unwrap_or(0);
        return Err(format!(
            "{name}: log is only {} bytes; acknowledged append at {} (and up to offset {max_end}) missing",
            log.len(),
            a.start
        ));
    }
    if (log.len() as u64) < st.verified_len {
        return Err(format!(
            "{name}: log shrank from {} to {} bytes",
            st.verified_len,
            log.len()
        ));
    }
    let recovered = promoted.len();
    st.acked.extend(promoted);
    st.acked.sort_by_key(|a| a.start);
    st.verified_len = log.len() as u64;
    Ok((recovered, cands.len()))
}

fn server_log_tail(path: &std::path::Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn fail_with_log(log_path: &std::path::Path, msg: String) -> ! {
    panic!(
        "{msg}\n--- last server log lines ---\n{}",
        server_log_tail(log_path)
    );
}

fn create_streams(client: &mut Client, expect: u16) -> Result<(), String> {
    for (i, (name, ctype, _)) in STREAMS.iter().enumerate() {
        let resp = client
            .request("PUT", &path_of(i), &[("Content-Type", ctype)], &[])
            .map_err(|e| format!("PUT {name}: {e}"))?;
        if resp.status != expect {
            return Err(format!(
                "PUT {name}: expected {expect}, got {} {}",
                resp.status,
                resp.body_str()
            ));
        }
    }
    Ok(())
}

/// After a restart: retry the last acknowledged producer seq and expect a duplicate 204
/// that appends nothing.
fn check_producer(shared: &Shared, client: &mut Client) -> Result<(), String> {
    let mut p = shared.producer.lock().unwrap();
    // Did the producer append that was in flight at the kill survive?
    let mut highest = p.last_acked.as_ref().map(|(s, _, _)| *s);
    let mut promoted_last = None;
    if let Some((seq, body)) = p.uncertain.take() {
        let st = shared.streams[PROD_STREAM].lock().unwrap();
        if let Some(a) = st.acked.iter().find(|a| a.bytes == body) {
            highest = Some(seq);
            promoted_last = Some((seq, body.clone(), a.end()));
        }
    }
    if let Some((seq, body, next)) = p.last_acked.clone() {
        let (epoch, seq_s) = (PRODUCER_EPOCH.to_string(), seq.to_string());
        let headers = [
            ("Content-Type", STREAMS[PROD_STREAM].1),
            ("Producer-Id", PRODUCER_ID),
            ("Producer-Epoch", epoch.as_str()),
            ("Producer-Seq", seq_s.as_str()),
        ];
        let resp = client
            .request("POST", &path_of(PROD_STREAM), &headers, &body)
            .map_err(|e| format!("producer retry: {e}"))?;
        if resp.status != 204 {
            return Err(format!(
                "retry of acknowledged producer seq {seq} after restart: expected 204 duplicate, got {} {}",
                resp.status,
                resp.body_str()
            ));
        }
        let want = highest.unwrap().to_string();
        if resp.header("producer-seq") != Some(want.as_str()) {
            return Err(format!(
                "producer duplicate: Producer-Seq {:?}, expected highest accepted {want}",
                resp.header("producer-seq")
            ));
        }
        if let Some(n) = resp.next_offset() {
            if n != next {
                return Err(format!(
                    "producer duplicate: Stream-Next-Offset {n}, originally {next}"
                ));
            }
        }
        let verified = shared.streams[PROD_STREAM].lock().unwrap().verified_len;
        let head = client
            .request("HEAD", &path_of(PROD_STREAM), &[], &[])
            .map_err(|e| format!("HEAD after producer retry: {e}"))?;
        if head.next_offset() != Some(verified) {
            return Err(format!(
                "producer duplicate appended data: tail {:?}, log was {verified} bytes",
                head.next_offset()
            ));
        }
    }
    if let Some(last) = promoted_last {
        p.next_seq = last.0 + 1;
        p.last_acked = Some(last);
    }
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

#[test]
fn kill9_keeps_every_acknowledged_append() {
    let cycles: usize = std::env::var("URSULA_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let (mut rng, seed) = Rng::from_env_or_time();
    println!("crash test: {cycles} cycles, seed {seed} (replay with URSULA_CRASH_SEED={seed})");

    let tmp = temp_dir("ursula-crash-");
    let data_dir = tmp.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    let log_path = tmp.path().join("server.stderr.log");
    let spawn = || Server::spawn_standard(&data_dir, "disk", 2, &[], Some(&log_path));

    let shared = Arc::new(Shared {
        streams: STREAMS
            .iter()
            .map(|_| Mutex::new(StreamState::default()))
            .collect(),
        producer: Mutex::new(ProducerState::default()),
        errors: Mutex::new(Vec::new()),
    });

    let mut server = spawn();
    if let Err(e) = create_streams(&mut server.client(), 201) {
        fail_with_log(&log_path, e);
    }

    for cycle in 1..=cycles {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..WRITERS)
            .map(|id| {
                let (addr, shared, stop) = (server.addr.clone(), shared.clone(), stop.clone());
                let wseed = rng.next_u64();
                thread::spawn(move || writer(id, addr, shared, stop, wseed, cycle))
            })
            .collect();
        let delay = rng.range(50, 800);
        thread::sleep(Duration::from_millis(delay));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut total = WriterStats::default();
        for h in handles {
            let s = h.join().expect("writer thread panicked");
            total.acked += s.acked;
            total.acked_bytes += s.acked_bytes;
            total.uncertain += s.uncertain;
            total.rejected_503 += s.rejected_503;
        }
        let errors = shared.errors.lock().unwrap().clone();
        if !errors.is_empty() {
            fail_with_log(
                &log_path,
                format!("cycle {cycle}: writer errors:\n{}", errors.join("\n")),
            );
        }

        let t0 = Instant::now();
        server = spawn();
        let restart_ms = t0.elapsed().as_millis();
        let mut client = server.client();
        if let Err(e) = create_streams(&mut client, 200) {
            fail_with_log(&log_path, format!("cycle {cycle} after restart: {e}"));
        }
        let (mut recovered, mut lost, mut total_len) = (0, 0, 0u64);
        for (i, (name, _, _)) in STREAMS.iter().enumerate() {
            let log = match read_log(&mut client, i) {
                Ok(l) => l,
                Err(e) => fail_with_log(&log_path, format!("cycle {cycle}: {e}")),
            };
            let mut st = shared.streams[i].lock().unwrap();
            match verify_stream(&mut st, name, &log) {
                Ok((r, l)) => {
                    recovered += r;
                    lost += l;
                }
                Err(e) => {
                    drop(st);
                    fail_with_log(&log_path, format!("cycle {cycle}: {e}"))
                }
            }
            total_len += log.len() as u64;
            let head = client.request("HEAD", &path_of(i), &[], &[]);
            match head {
                Ok(h) if h.status == 200 && h.next_offset() == Some(log.len() as u64) => {}
                Ok(h) => fail_with_log(
                    &log_path,
                    format!(
                        "cycle {cycle}: HEAD {name}: status {} tail {:?}, read {} bytes",
                        h.status,
                        h.next_offset(),
                        log.len()
                    ),
                ),
                Err(e) => fail_with_log(&log_path, format!("cycle {cycle}: HEAD {name}: {e}")),
            }
        }
        if let Err(e) = check_producer(&shared, &mut client) {
            fail_with_log(&log_path, format!("cycle {cycle}: {e}"));
        }
        println!(
            "cycle {cycle}/{cycles}: kill -9 after {delay} ms; {} appends acked ({:.2} MiB), {} 503s, \
             {} in flight at kill: {recovered} recovered whole, {lost} absent; restart {restart_ms} ms; \
             verified {:.2} MiB in {} streams",
            total.acked,
            mib(total.acked_bytes),
            total.rejected_503,
            total.uncertain,
            mib(total_len),
            STREAMS.len()
        );
    }

    match server.sigterm(Duration::from_secs(10)) {
        Some(st) if st.success() => {}
        other => fail_with_log(
            &log_path,
            format!("SIGTERM: server did not exit 0 within 10 s: {other:?}"),
        ),
    }
    println!("crash test: {cycles} cycles passed");
}
