//! The record-coordinate invariants of extensions.md §8.12, checked on a bucketed JSON
//! stream against a model of every committed record, across restarts (`kill -9` and
//! SIGTERM), retention advances, and engine compaction (the log cleaner relocating the
//! stream's records out of old segments).
//!
//! The model keeps each record's canonical bytes (compact JSON + LF) by ordinal, so
//! `O(r)` is a prefix sum. `check` then verifies, over the whole retained range:
//! HEAD's `F`/`N`/tail/retained offset; record-aware reads (paged with several
//! `max_records`, and uncapped against the 8 MiB limit) return exactly the complete
//! records `[start, next)` with `Stream-Next-Offset = O(next)`; their total is `N − F`;
//! offset reads (uncapped and with odd `max_bytes`) return the same canonical bytes;
//! `offset=O(r)` starts exactly at record `r`; the envelope view numbers records by
//! ordinal; trimmed ordinals and offsets answer `410`. Deduplicated producer retries
//! must still report their original ranges.

mod support;

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use sonic_rs::{JsonValueTrait, Value};
use support::{expect, temp_dir, write_config, Client, Response, Server};

const JSON: (&str, &str) = ("content-type", "application/json");
/// The `Stream-Extensions` value of a bucketed JSON stream.
const TOKEN: &str = "json-record-coordinates-v1, ndjson-append-v1";
const MAX_READ: usize = 8 << 20;

fn o(pos: u64) -> String {
    format!("{pos:020}")
}

fn hdr<'a>(r: &'a Response, name: &str) -> &'a str {
    r.header(name)
        .unwrap_or_else(|| panic!("missing {name}: {r:?}"))
}

fn hnum(r: &Response, name: &str) -> u64 {
    hdr(r, name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} not a number: {r:?}"))
}

fn call(
    c: &mut Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    c.request(method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[track_caller]
fn call_ok(
    c: &mut Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    status: u16,
) -> Response {
    let r = call(c, method, path, headers, body);
    if r.status != status {
        let mut shown = r.clone();
        shown.body.truncate(512);
        panic!("{method} {path}: expected {status}, got {shown:?}");
    }
    r
}

/// A compact JSON object; its canonical record is exactly this text + LF.
fn obj(tag: &str, i: usize, pad: usize) -> String {
    format!(r#"{{"t":"{tag}","i":{i},"p":"{}"}}"#, "x".repeat(pad))
}

struct Receipt {
    seq: u64,
    body: Vec<u8>,
    start: u64,
    next: u64,
    next_offset: String,
}

/// Every record ever committed to one stream, by ordinal.
struct Model {
    path: String,
    recs: Vec<Vec<u8>>,
    offs: Vec<u64>,
    first: usize,
    receipts: Vec<Receipt>,
    producer_seq: u64,
}

impl Model {
    fn new(path: &str) -> Model {
        Model {
            path: path.to_string(),
            recs: Vec::new(),
            offs: vec![0],
            first: 0,
            receipts: Vec::new(),
            producer_seq: 0,
        }
    }

    fn n(&self) -> usize {
        self.recs.len()
    }

    fn off(&self, r: usize) -> u64 {
        self.offs[r]
    }

    fn push(&mut self, text: &str) {
        let mut rec = text.as_bytes().to_vec();
        rec.push(b'\n');
        let end = self.offs[self.n()] + rec.len() as u64;
        self.recs.push(rec);
        self.offs.push(end);
    }

    fn canonical(&self, from: usize, to: usize) -> Vec<u8> {
        self.recs[from..to].concat()
    }

    /// Invariants 1–3 for one acknowledged request: it got exactly the next contiguous
    /// range, one ordinal per normalised message, ending at the new tail.
    #[track_caller]
    fn acked(&mut self, r: &Response, values: &[String]) {
        assert_eq!(hdr(r, "stream-extensions"), TOKEN);
        assert_eq!(hnum(r, "stream-record-start"), self.n() as u64, "{r:?}");
        assert_eq!(
            hnum(r, "stream-record-next"),
            (self.n() + values.len()) as u64,
            "{r:?}"
        );
        for v in values {
            self.push(v);
        }
        assert_eq!(hdr(r, "stream-next-offset"), o(self.off(self.n())), "{r:?}");
    }
}

fn post(c: &mut Client, m: &mut Model, body: &str, values: &[String]) {
    let r = call_ok(c, "POST", &m.path.clone(), &[JSON], body.as_bytes(), 204);
    m.acked(&r, values);
}

fn post_producer(c: &mut Client, m: &mut Model, values: &[String]) {
    let body = format!("[{}]", values.join(","));
    let seq = m.producer_seq.to_string();
    let r = call_ok(
        c,
        "POST",
        &m.path.clone(),
        &[
            JSON,
            ("producer-id", "inv-writer"),
            ("producer-epoch", "0"),
            ("producer-seq", &seq),
        ],
        body.as_bytes(),
        200,
    );
    let start = m.n() as u64;
    m.acked(&r, values);
    m.receipts.push(Receipt {
        seq: m.producer_seq,
        body: body.into_bytes(),
        start,
        next: m.n() as u64,
        next_offset: o(m.off(m.n())),
    });
    m.producer_seq += 1;
}

fn frames(parts: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p.as_bytes());
    }
    out
}

/// A mix of every way to commit records: single values, arrays (one-level flattening,
/// nested arrays stay one record), append-batch frames and producer appends.
fn populate(c: &mut Client, m: &mut Model, tag: &str, big: bool) {
    for i in 0..5 {
        let v = obj(tag, i, i * 7);
        post(c, m, &v, std::slice::from_ref(&v));
    }
    let vals: Vec<String> = (0..4).map(|i| obj(tag, 100 + i, 3)).collect();
    post(c, m, &format!("[{}]", vals.join(",")), &vals);
    // `[[1,2],"s",{...}]` is three records; the inner array is one value.
    let nested = vec!["[1,2]".to_string(), "\"s\"".to_string(), obj(tag, 200, 1)];
    post(c, m, &format!("[{}]", nested.join(",")), &nested);

    // Append-batch: per-frame contiguous ranges in frame order.
    let f1 = vec![obj(tag, 300, 0)];
    let f2 = vec![obj(tag, 301, 2), obj(tag, 302, 4)];
    let f3 = vec!["7".to_string()];
    let batch = frames(&[f1[0].clone(), format!("[{}]", f2.join(",")), f3[0].clone()]);
    let r = call_ok(
        c,
        "POST",
        &format!("{}/append-batch", m.path),
        &[JSON],
        &batch,
        200,
    );
    let acks: Value = sonic_rs::from_slice(&r.body).expect("ack JSON");
    for (k, vals) in [f1, f2, f3].iter().enumerate() {
        let ack = &acks[k];
        assert_eq!(ack["status"].as_u64(), Some(204), "{}", r.body_str());
        assert_eq!(ack["stream_record_start"].as_u64(), Some(m.n() as u64));
        assert_eq!(
            ack["stream_record_next"].as_u64(),
            Some((m.n() + vals.len()) as u64)
        );
        for v in vals {
            m.push(v);
        }
        assert_eq!(
            ack["stream_next_offset"].as_str(),
            Some(o(m.off(m.n())).as_str())
        );
    }

    for i in 0..3 {
        let vals: Vec<String> = (0..=i).map(|j| obj(tag, 400 + 10 * i + j, j)).collect();
        post_producer(c, m, &vals);
    }

    if big {
        // Records around and above the 8 MiB response cap.
        for (i, mib) in [3usize, 3, 9, 2].into_iter().enumerate() {
            let v = obj(tag, 500 + i, (mib << 20) - 40);
            post(c, m, &v, std::slice::from_ref(&v));
        }
        let vals = vec![obj(tag, 600, 1), obj(tag, 601, 1)];
        post_producer(c, m, &vals);
    }
}

/// Concurrent writers (invariants 2 and 3): every request gets one contiguous range, the
/// ranges tile `[N0, N1)` without gaps or overlaps, and the records at each range are that
/// request's values.
fn concurrent_appends(s: &Server, m: &mut Model, tag: &str) {
    let handles: Vec<_> = (0..4)
        .map(|w| {
            let addr = s.addr.clone();
            let path = m.path.clone();
            let tag = tag.to_string();
            thread::spawn(move || {
                let mut c = Client::new(&addr);
                let mut acks = Vec::new();
                for k in 0..8 {
                    let vals: Vec<String> = (0..(1 + (w + k) % 4))
                        .map(|j| obj(&format!("{tag}-w{w}"), k * 10 + j, j))
                        .collect();
                    let body = format!("[{}]", vals.join(","));
                    let r = call_ok(&mut c, "POST", &path, &[JSON], body.as_bytes(), 204);
                    acks.push((
                        hnum(&r, "stream-record-start"),
                        hnum(&r, "stream-record-next"),
                        vals,
                    ));
                }
                acks
            })
        })
        .collect();
    let mut all: Vec<(u64, u64, Vec<String>)> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("writer"))
        .collect();
    all.sort_by_key(|a| a.0);
    for (start, next, vals) in all {
        assert_eq!(
            start,
            m.n() as u64,
            "ranges must tile without gaps/overlaps"
        );
        assert_eq!(next - start, vals.len() as u64);
        for v in &vals {
            m.push(v);
        }
    }
}

/// Read `len` bytes from `offset` following `Stream-Next-Offset` (responses may be capped).
fn fetch_bytes(c: &mut Client, path: &str, offset: u64, len: usize) -> (Vec<u8>, String) {
    let mut out = Vec::new();
    let mut at = o(offset);
    while out.len() < len {
        let q = format!("{path}?offset={at}&max_bytes={}", len - out.len());
        let r = call_ok(c, "GET", &q, &[], b"", 200);
        assert!(!r.body.is_empty(), "empty read at {at}");
        assert!(r.body.len() <= len - out.len());
        out.extend_from_slice(&r.body);
        at = hdr(&r, "stream-next-offset").to_string();
    }
    (out, at)
}

/// Offset reads from `O(F)` until the tail; returns the concatenated bytes.
fn offset_read_all(c: &mut Client, m: &Model, max_bytes: Option<usize>, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = m.off(m.first);
    loop {
        let mut q = format!("{}?offset={}", m.path, o(at));
        if let Some(mb) = max_bytes {
            q.push_str(&format!("&max_bytes={mb}"));
        }
        let r = call_ok(c, "GET", &q, &[], b"", 200);
        assert_eq!(hdr(&r, "stream-extensions"), TOKEN);
        assert!(r.body.len() <= max_bytes.unwrap_or(MAX_READ).min(MAX_READ));
        out.extend_from_slice(&r.body);
        at += r.body.len() as u64;
        assert_eq!(hdr(&r, "stream-next-offset"), o(at));
        if r.header("stream-up-to-date") == Some("true") || out.len() >= limit {
            assert!(!r.body.is_empty() || at == m.off(m.n()));
            return out;
        }
        assert!(!r.body.is_empty(), "no progress at {at}");
    }
}

/// All §8.12 read-side invariants for the model's current state.
fn check(s: &Server, m: &Model, what: &str) {
    eprintln!("check {what}: F={} N={}", m.first, m.n());
    let mut c = s.client();
    let (f, n) = (m.first, m.n());
    let p = m.path.as_str();

    let h = call_ok(&mut c, "HEAD", p, &[], b"", 200);
    assert_eq!(hdr(&h, "stream-extensions"), TOKEN, "{what}");
    assert_eq!(hnum(&h, "stream-record-first"), f as u64, "{what}: F");
    assert_eq!(hnum(&h, "stream-record-next"), n as u64, "{what}: N");
    assert_eq!(hdr(&h, "stream-next-offset"), o(m.off(n)), "{what}: tail");
    assert_eq!(
        hdr(&h, "stream-retained-offset"),
        o(m.off(f)),
        "{what}: retained offset"
    );

    // Record-aware reads, paged: complete records only, exact ranges, N − F in total.
    for step in [None, Some(1usize), Some(3), Some(7)] {
        let mut r = f;
        let mut total = 0;
        loop {
            let q = match step {
                None => format!("{p}?record={r}"),
                Some(k) => format!("{p}?record={r}&max_records={k}"),
            };
            let resp = call_ok(&mut c, "GET", &q, &[], b"", 200);
            assert_eq!(hdr(&resp, "content-type"), "application/x-ndjson");
            assert_eq!(hnum(&resp, "stream-record-first"), f as u64, "{what} {q}");
            assert_eq!(hnum(&resp, "stream-record-start"), r as u64, "{what} {q}");
            let next = hnum(&resp, "stream-record-next") as usize;
            assert!(next <= n, "{what} {q}: next {next} > N {n}");
            if let Some(k) = step {
                assert!(next - r <= k, "{what} {q}: more than max_records");
            }
            if r < n {
                assert!(next > r, "{what} {q}: no record although some exist");
            }
            assert!(
                resp.body.len() <= MAX_READ || next - r == 1,
                "{what} {q}: {} bytes over the cap with {} records",
                resp.body.len(),
                next - r
            );
            assert!(
                resp.body == m.canonical(r, next),
                "{what} {q}: body is not records [{r}, {next}) ({} bytes, expected {})",
                resp.body.len(),
                m.canonical(r, next).len()
            );
            assert_eq!(
                hdr(&resp, "stream-next-offset"),
                o(m.off(next)),
                "{what} {q}"
            );
            assert_eq!(
                resp.header("stream-up-to-date") == Some("true"),
                next == n,
                "{what} {q}: Up-To-Date"
            );
            total += next - r;
            r = next;
            if r == n {
                break;
            }
        }
        assert_eq!(total, n - f, "{what}: N - F = retained records ({step:?})");
    }

    // Offset reads expose the same canonical sequence (they may end mid-record).
    let expected = m.canonical(f, n);
    for mb in [None, Some(1_000_003)] {
        let got = offset_read_all(&mut c, m, mb, usize::MAX);
        assert!(
            got == expected,
            "{what}: offset reads (max_bytes {mb:?}) differ from the records: {} vs {} bytes",
            got.len(),
            expected.len()
        );
    }
    let prefix = offset_read_all(&mut c, m, Some(97), 4096);
    assert!(prefix == expected[..prefix.len()], "{what}: 97-byte reads");

    // O(r) is the first byte of record r, for every retained r.
    for r in f..n {
        let q = format!("{p}?record={r}&max_records=1");
        let resp = call_ok(&mut c, "GET", &q, &[], b"", 200);
        assert!(resp.body == m.recs[r], "{what} {q}");
        assert_eq!(
            hdr(&resp, "stream-next-offset"),
            o(m.off(r + 1)),
            "{what} {q}"
        );
        let (bytes, next) = fetch_bytes(&mut c, p, m.off(r), m.recs[r].len());
        assert!(
            bytes == m.recs[r],
            "{what}: offset O({r}) is not record {r}"
        );
        assert_eq!(next, o(m.off(r + 1)));
    }

    // Envelope view: ordinals beside the same values.
    let q = format!("{p}?record={f}&max_records=12&record_view=envelope");
    let resp = call_ok(&mut c, "GET", &q, &[], b"", 200);
    let next = hnum(&resp, "stream-record-next") as usize;
    let mut env = Vec::new();
    for r in f..next {
        env.extend_from_slice(format!("{{\"record\":{r},\"value\":").as_bytes());
        env.extend_from_slice(&m.recs[r][..m.recs[r].len() - 1]);
        env.extend_from_slice(b"}\n");
    }
    assert!(resp.body == env, "{what}: envelope view");

    // tail_records.
    for k in [0usize, 1, 5, n + 3] {
        let resp = call_ok(
            &mut c,
            "GET",
            &format!("{p}?tail_records={k}"),
            &[],
            b"",
            200,
        );
        let start = n.saturating_sub(k).max(f);
        assert_eq!(
            hnum(&resp, "stream-record-start"),
            start as u64,
            "{what} tail {k}"
        );
    }

    // Trimmed history answers 410 pointing at F / the retained offset.
    if f > 0 {
        let resp = call_ok(
            &mut c,
            "GET",
            &format!("{p}?record={}", f - 1),
            &[],
            b"",
            410,
        );
        assert_eq!(hnum(&resp, "stream-record-first"), f as u64);
        assert_eq!(hdr(&resp, "stream-next-offset"), o(m.off(f)));
        let resp = call_ok(&mut c, "GET", &format!("{p}?offset=-1"), &[], b"", 410);
        assert_eq!(hdr(&resp, "stream-next-offset"), o(m.off(f)));
        let q = format!("{p}?offset={}", o(m.off(f - 1)));
        call_ok(&mut c, "GET", &q, &[], b"", 410);
    } else {
        let resp = call_ok(&mut c, "GET", &format!("{p}?offset=-1"), &[], b"", 200);
        assert!(resp.body.len() <= MAX_READ);
        assert!(resp.body[..] == expected[..resp.body.len()]);
    }
}

/// Invariant 4: every producer retry whose receipt is in the window reports the original
/// range and offset, and appends nothing.
fn check_receipts(s: &Server, m: &Model, what: &str) {
    let mut c = s.client();
    let highest = (m.producer_seq - 1).to_string();
    for rc in &m.receipts {
        let seq = rc.seq.to_string();
        let r = call_ok(
            &mut c,
            "POST",
            &m.path,
            &[
                JSON,
                ("producer-id", "inv-writer"),
                ("producer-epoch", "0"),
                ("producer-seq", &seq),
            ],
            &rc.body,
            204,
        );
        assert_eq!(
            hnum(&r, "stream-record-start"),
            rc.start,
            "{what} seq {seq}"
        );
        assert_eq!(hnum(&r, "stream-record-next"), rc.next, "{what} seq {seq}");
        assert_eq!(
            hdr(&r, "stream-next-offset"),
            rc.next_offset,
            "{what} seq {seq}"
        );
        assert_eq!(hdr(&r, "producer-seq"), highest, "{what} seq {seq}");
    }
    let h = call_ok(&mut c, "HEAD", &m.path, &[], b"", 200);
    assert_eq!(
        hnum(&h, "stream-record-next"),
        m.n() as u64,
        "{what}: retries appended"
    );
}

fn incarnation(s: &Server, path: &str) -> String {
    let h = expect(s, "HEAD", path, &[], b"", 200);
    hdr(&h, "stream-incarnation").to_string()
}

fn create(c: &mut Client, m: &mut Model, tag: &str) {
    let vals: Vec<String> = (0..3).map(|i| obj(tag, i, 1)).collect();
    let body = format!("[{}]", vals.join(","));
    let r = call_ok(c, "PUT", &m.path.clone(), &[JSON], body.as_bytes(), 201);
    m.acked(&r, &vals);
}

#[test]
fn invariants_across_kill9_and_sigterm() {
    let dir = temp_dir("ursula-inv-restart");
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    expect(&s, "PUT", "/invar", &[], b"", 201);
    let mut m = Model::new("/invar/restart");
    let mut c = s.client();
    create(&mut c, &mut m, "a");
    populate(&mut c, &mut m, "a", true);
    concurrent_appends(&s, &mut m, "a");
    check(&s, &m, "before restart");
    check_receipts(&s, &m, "before restart");
    let inc = incarnation(&s, &m.path);

    drop(c);
    s.kill9();
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    check(&s, &m, "after kill -9");
    check_receipts(&s, &m, "after kill -9");
    assert_eq!(incarnation(&s, &m.path), inc);

    let mut c = s.client();
    populate(&mut c, &mut m, "b", false);
    concurrent_appends(&s, &mut m, "b");
    check(&s, &m, "after kill -9 + appends");
    drop(c);
    s.sigterm(Duration::from_secs(20)).expect("SIGTERM exit");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    check(&s, &m, "after SIGTERM");
    check_receipts(&s, &m, "after SIGTERM");
    assert_eq!(incarnation(&s, &m.path), inc);
}

/// Publish a snapshot at record `r` and advance retention to it (by record or by offset).
fn trim(c: &mut Client, m: &mut Model, r: usize, by_offset: bool) {
    let p = m.path.clone();
    let snap = call_ok(
        c,
        "PUT",
        &format!("{p}/snapshot?record={r}"),
        &[JSON],
        format!("{{\"through\":{r}}}").as_bytes(),
        204,
    );
    assert_eq!(hdr(&snap, "stream-snapshot-offset"), o(m.off(r)));
    let q = if by_offset {
        format!("{p}/retention/{}", o(m.off(r)))
    } else {
        format!("{p}/retention?record={r}")
    };
    let ret = call_ok(c, "PUT", &q, &[], b"", 204);
    assert_eq!(hdr(&ret, "stream-retained-offset"), o(m.off(r)));
    assert_eq!(hnum(&ret, "stream-record-first"), r as u64);
    assert_eq!(hnum(&ret, "stream-record-next"), m.n() as u64);
    m.first = r;
}

#[test]
fn invariants_across_retention() {
    let dir = temp_dir("ursula-inv-retention");
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    expect(&s, "PUT", "/invar", &[], b"", 201);
    let mut m = Model::new("/invar/retained");
    let mut c = s.client();
    create(&mut c, &mut m, "a");
    populate(&mut c, &mut m, "a", false);
    check(&s, &m, "before retention");

    trim(&mut c, &mut m, 4, false);
    check(&s, &m, "after retention by record");
    check_receipts(&s, &m, "after retention by record");
    populate(&mut c, &mut m, "b", true);
    let mid = m.n() - 3;
    trim(&mut c, &mut m, mid - 8, true);
    check(&s, &m, "after retention by offset");

    drop(c);
    s.sigterm(Duration::from_secs(20)).expect("SIGTERM exit");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    check(&s, &m, "after retention + restart");
    check_receipts(&s, &m, "after retention + restart");
    let mut c = s.client();
    populate(&mut c, &mut m, "c", false);
    // Retention right up to the tail: F = N, nothing retained.
    let n = m.n();
    trim(&mut c, &mut m, n, false);
    check(&s, &m, "retained nothing");
    populate(&mut c, &mut m, "d", false);
    check(&s, &m, "appends after trimming everything");
}

fn seg_files(data: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(data).expect("data dir").flatten() {
        if !shard.file_name().to_string_lossy().starts_with("shard-") {
            continue;
        }
        for f in std::fs::read_dir(shard.path())
            .expect("shard dir")
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.ends_with(".seg") {
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                out.push((
                    format!("{}/{name}", shard.file_name().to_string_lossy()),
                    len,
                ));
            }
        }
    }
    out.sort();
    out
}

fn seg_total(data: &Path) -> u64 {
    seg_files(data).iter().map(|f| f.1).sum()
}

#[test]
fn invariants_across_compaction() {
    let dir = temp_dir("ursula-inv-compact");
    let data = dir.path().join("data");
    // The engine raises segment_bytes to its minimum (~48 MiB); one core, so the JSON
    // stream and the filler share one log.
    let cfg = write_config(dir.path(), "segment_bytes = 1\n");
    let start = |data: &Path| Server::spawn_standard(data, "disk", 1, &["--config", &cfg], None);
    let s = start(&data);
    expect(&s, "PUT", "/invar", &[], b"", 201);
    let mut m = Model::new("/invar/compacted");
    let mut c = s.client();
    create(&mut c, &mut m, "a");
    populate(&mut c, &mut m, "a", true);
    trim(&mut c, &mut m, 6, false);
    populate(&mut c, &mut m, "b", false);
    check(&s, &m, "before compaction");
    let original_segments: Vec<String> = seg_files(&data).into_iter().map(|f| f.0).collect();
    eprintln!("segments holding the JSON stream: {original_segments:?}");

    // ~120 MiB of soon-dead data in other streams, then delete them.
    let chunk = vec![b'f'; 8 << 20];
    let oct = ("content-type", "application/octet-stream");
    for k in 0..3 {
        let p = format!("/invar/filler-{k}");
        call_ok(&mut c, "PUT", &p, &[oct], b"", 201);
        for _ in 0..5 {
            call_ok(&mut c, "POST", &p, &[oct], &chunk, 204);
        }
    }
    // Interleave a little more JSON so the stream spans several segments.
    populate(&mut c, &mut m, "c", false);
    let before = seg_total(&data);
    eprintln!(
        "segment files before deleting the filler: {:?}",
        seg_files(&data)
    );
    for k in 0..3 {
        call_ok(
            &mut c,
            "DELETE",
            &format!("/invar/filler-{k}"),
            &[],
            b"",
            204,
        );
    }

    // The upkeep task cleans once a second while the files exceed 2x live + one segment.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let files = seg_files(&data);
        let total: u64 = files.iter().map(|f| f.1).sum();
        let old_left = files.iter().any(|f| original_segments.contains(&f.0));
        if total < before && !old_left {
            eprintln!("compacted: {before} -> {total} bytes, files {files:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "log cleaner did not reclaim the dead segments within 180 s: {before} -> {total}, files {files:?}"
        );
        thread::sleep(Duration::from_millis(500));
    }

    check(&s, &m, "after compaction");
    check_receipts(&s, &m, "after compaction");
    populate(&mut c, &mut m, "d", false);
    check(&s, &m, "appends after compaction");
    drop(c);
    s.sigterm(Duration::from_secs(30)).expect("SIGTERM exit");
    let s = start(&data);
    check(&s, &m, "after compaction + restart");
    check_receipts(&s, &m, "after compaction + restart");
    assert!(seg_total(&data) < before);
}
