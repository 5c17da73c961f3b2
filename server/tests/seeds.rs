//! The user's seed documents (/work/shared/seeds), walked literally against the real binary
//! on the disk engine: the same paths, headers and bodies as their curl / fetch examples,
//! after creating the bucket they assume (`/demo`, `/telemetry`, `/sessions`, `/otel`).
//!
//! * 000 Record Coordinates: the `[42, 44)` append (after 42 warm-up records), replay with
//!   `record=42&max_records=100`, the envelope view, `record=now` / `tail_records=100`,
//!   `Stream-Record-Match: 44` then its 412, and 410 after retention without renumbering.
//! * 002 Offsets: 20-character opaque tokens, `offset=-1` / `offset=now`, 410 after
//!   retention pointing at `Stream-Retained-Offset`, cursors that move past the request's,
//!   the duplicate outside the receipt window without `Stream-Next-Offset`, and recreation
//!   detected only by `Stream-Incarnation`.
//! * 003 Browser Telemetry: the collector's `fetch` POST, `offset=-1` NDJSON replay across
//!   the 8 MiB cap (buffering the incomplete trailing line), `live=sse`, the `fetchEvent`
//!   locator loop with `max_bytes`, and OTLP exports sent plain and gzip-compressed.

mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use sonic_rs::{JsonValueTrait, Value};
use support::{expect, req, temp_dir, write_config, Raw, Response, Server};

/// The `Stream-Extensions` value of a bucketed JSON stream.
const TOKEN: &str = "json-record-coordinates-v1, ndjson-append-v1";
const MAX_READ: usize = 8 << 20;

fn start() -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-seeds");
    // A small receipt window so seed 002's out-of-window duplicate is reachable.
    let cfg = write_config(dir.path(), "producer_receipt_window = 2\n");
    let s = Server::spawn_standard(
        &dir.path().join("data"),
        "disk",
        2,
        &["--config", &cfg],
        None,
    );
    (s, dir)
}

fn h<'a>(r: &'a Response, name: &str) -> &'a str {
    r.header(name)
        .unwrap_or_else(|| panic!("missing {name}: {r:?}"))
}

/// An opaque offset as seed 002 describes it: a 20-character string.
#[track_caller]
fn offset_token(r: &Response) -> String {
    let v = h(r, "stream-next-offset");
    assert_eq!(v.len(), 20, "20-character offset: {v:?}");
    v.to_string()
}

// ---------------------------------------------------------------------------------------
// Seed 000: Record Coordinates
// ---------------------------------------------------------------------------------------

/// The seed's first POST, byte for byte as `curl --data-binary` sends it.
const NAV_PAIR: &str = "[
{\"captured_at\":\"2026-07-18T10:30:00.100Z\",\"type\":\"navigation\"},
{\"captured_at\":\"2026-07-18T10:29:59.900Z\",\"type\":\"network_response\"}
]";
const NAV: &str = r#"{"captured_at":"2026-07-18T10:30:00.100Z","type":"navigation"}"#;
const NET: &str = r#"{"captured_at":"2026-07-18T10:29:59.900Z","type":"network_response"}"#;
const CHECKPOINT: &str = r#"{"captured_at":"2026-07-18T10:31:00Z","type":"checkpoint"}"#;

#[test]
fn seed_000_record_coordinates() {
    let (s, _d) = start();
    expect(&s, "PUT", "/demo", &[], b"", 201);
    let ct = ("Content-Type", "application/json");
    expect(&s, "PUT", "/demo/events", &[ct], b"", 201);
    // The seed's example assumes the record tail is 42.
    let warmup: Vec<String> = (0..42)
        .map(|i| format!(r#"{{"type":"warmup","n":{i}}}"#))
        .collect();
    let r = expect(
        &s,
        "POST",
        "/demo/events",
        &[ct],
        format!("[{}]", warmup.join(",")).as_bytes(),
        204,
    );
    assert_eq!(h(&r, "stream-record-next"), "42");

    // curl -i -X POST http://127.0.0.1:4437/demo/events -H 'Content-Type: application/json'
    //   --data-binary '[ {navigation}, {network_response} ]'
    let r = expect(&s, "POST", "/demo/events", &[ct], NAV_PAIR.as_bytes(), 204);
    assert_eq!(h(&r, "stream-extensions"), TOKEN);
    assert_eq!(h(&r, "stream-record-start"), "42");
    assert_eq!(h(&r, "stream-record-next"), "44");
    let after_pair = offset_token(&r);

    // curl -i 'http://127.0.0.1:4437/demo/events?record=42&max_records=100'
    let r = expect(
        &s,
        "GET",
        "/demo/events?record=42&max_records=100",
        &[],
        b"",
        200,
    );
    assert_eq!(h(&r, "content-type"), "application/x-ndjson");
    assert_eq!(r.body_str(), format!("{NAV}\n{NET}\n"));
    assert_eq!(h(&r, "stream-extensions"), TOKEN);
    assert_eq!(h(&r, "stream-record-first"), "0");
    assert_eq!(h(&r, "stream-record-start"), "42");
    assert_eq!(h(&r, "stream-record-next"), "44");
    assert_eq!(offset_token(&r), after_pair);
    // Continuing with the returned Stream-Record-Next is an empty, up-to-date read.
    let r = expect(&s, "GET", "/demo/events?record=44", &[], b"", 200);
    assert!(r.body.is_empty());
    assert_eq!(h(&r, "stream-up-to-date"), "true");

    // curl 'http://127.0.0.1:4437/demo/events?record=42&max_records=100&record_view=envelope'
    let r = expect(
        &s,
        "GET",
        "/demo/events?record=42&max_records=100&record_view=envelope",
        &[],
        b"",
        200,
    );
    assert_eq!(
        r.body_str(),
        format!("{{\"record\":42,\"value\":{NAV}}}\n{{\"record\":43,\"value\":{NET}}}\n")
    );

    // record=now waits only for future records; tail_records=100 reads the recent ones.
    let r = expect(
        &s,
        "GET",
        "/demo/events?record=now&live=long-poll",
        &[],
        b"",
        204,
    );
    assert_eq!(h(&r, "stream-record-start"), "44");
    let r = expect(&s, "GET", "/demo/events?tail_records=100", &[], b"", 200);
    assert_eq!(h(&r, "stream-record-start"), "0");
    assert_eq!(h(&r, "stream-record-next"), "44");
    assert_eq!(r.body_str().lines().count(), 44);

    // curl -i -X POST … -H 'Stream-Record-Match: 44' --data-binary '{…"checkpoint"}'
    let checkpoint = [
        ("Content-Type", "application/json"),
        ("Stream-Record-Match", "44"),
    ];
    let r = expect(
        &s,
        "POST",
        "/demo/events",
        &checkpoint,
        CHECKPOINT.as_bytes(),
        204,
    );
    assert_eq!(h(&r, "stream-record-start"), "44");
    assert_eq!(h(&r, "stream-record-next"), "45");
    let tail = offset_token(&r);
    // The same request again: another record committed since, so 412 with the tail.
    let r = expect(
        &s,
        "POST",
        "/demo/events",
        &checkpoint,
        CHECKPOINT.as_bytes(),
        412,
    );
    assert_eq!(h(&r, "stream-record-next"), "45");
    assert_eq!(offset_token(&r), tail);
    assert_eq!(h(&r, "stream-extensions"), TOKEN);

    // "A deduplicated producer retry returns the original range."
    let producer = [
        ("Content-Type", "application/json"),
        ("Producer-Id", "browser-1"),
        ("Producer-Epoch", "0"),
        ("Producer-Seq", "0"),
    ];
    let first = expect(
        &s,
        "POST",
        "/demo/events",
        &producer,
        NAV_PAIR.as_bytes(),
        200,
    );
    assert_eq!(h(&first, "stream-record-start"), "45");
    assert_eq!(h(&first, "stream-record-next"), "47");
    let retry = expect(
        &s,
        "POST",
        "/demo/events",
        &producer,
        NAV_PAIR.as_bytes(),
        204,
    );
    assert_eq!(h(&retry, "stream-record-start"), "45");
    assert_eq!(h(&retry, "stream-record-next"), "47");
    assert_eq!(offset_token(&retry), offset_token(&first));

    // Retention removed record 42: 410 with the new first ordinal; no renumbering.
    expect(
        &s,
        "PUT",
        "/demo/events/snapshot?record=43",
        &[ct],
        br#"{"through":43}"#,
        204,
    );
    expect(&s, "PUT", "/demo/events/retention?record=43", &[], b"", 204);
    let r = expect(
        &s,
        "GET",
        "/demo/events?record=42&max_records=100",
        &[],
        b"",
        410,
    );
    assert_eq!(h(&r, "stream-record-first"), "43");
    let r = expect(
        &s,
        "GET",
        "/demo/events?record=43&max_records=2&record_view=envelope",
        &[],
        b"",
        200,
    );
    assert_eq!(
        r.body_str(),
        format!("{{\"record\":43,\"value\":{NET}}}\n{{\"record\":44,\"value\":{CHECKPOINT}}}\n")
    );
    assert_eq!(h(&r, "stream-record-first"), "43");
}

// ---------------------------------------------------------------------------------------
// Seed 002: Offsets
// ---------------------------------------------------------------------------------------

#[test]
fn seed_002_offsets() {
    let (s, _d) = start();
    expect(&s, "PUT", "/demo", &[], b"", 201);
    let ct = ("Content-Type", "text/plain");
    let r = expect(&s, "PUT", "/demo/log", &[ct], b"alpha ", 201);
    let o1 = offset_token(&r);
    let r = expect(&s, "POST", "/demo/log", &[ct], b"beta ", 204);
    let o2 = offset_token(&r);
    // Opaque, but lexicographically ordered within a stream.
    assert!(o1 < o2, "{o1} < {o2}");

    // offset=-1: from the beginning; offset=now: the tail, nothing yet.
    let r = expect(&s, "GET", "/demo/log?offset=-1", &[], b"", 200);
    assert_eq!(r.body_str(), "alpha beta ");
    assert_eq!(offset_token(&r), o2);
    let r = expect(&s, "GET", "/demo/log?offset=now", &[], b"", 200);
    assert!(r.body.is_empty());
    assert_eq!(offset_token(&r), o2);
    // Resume from a Stream-Next-Offset passed back unchanged.
    let r = expect(&s, "GET", &format!("/demo/log?offset={o1}"), &[], b"", 200);
    assert_eq!(r.body_str(), "beta ");

    // Live responses carry Stream-Cursor; each is past the one the request sent.
    let r = expect(
        &s,
        "GET",
        &format!("/demo/log?offset={o2}&live=long-poll"),
        &[],
        b"",
        204,
    );
    let c1 = h(&r, "stream-cursor").to_string();
    assert_eq!(offset_token(&r), o2);
    let r = expect(
        &s,
        "GET",
        &format!("/demo/log?offset={o2}&live=long-poll&cursor={c1}"),
        &[],
        b"",
        204,
    );
    let c2 = h(&r, "stream-cursor").to_string();
    assert!(
        c2.parse::<u64>().unwrap() > c1.parse::<u64>().unwrap(),
        "cursor {c2} must be past {c1}"
    );

    // Exactly-once: a duplicate whose receipt left the window (2 here) is a 204 without
    // Stream-Next-Offset; one still in the window reports its original offset.
    let producer = |seq: &'static str| {
        [
            ("Content-Type", "text/plain"),
            ("Producer-Id", "p"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", seq),
        ]
    };
    let first = expect(&s, "POST", "/demo/log", &producer("0"), b"gamma ", 200);
    expect(&s, "POST", "/demo/log", &producer("1"), b"delta ", 200);
    let third = expect(&s, "POST", "/demo/log", &producer("2"), b"eps ", 200);
    let dup = expect(&s, "POST", "/demo/log", &producer("2"), b"eps ", 204);
    assert_eq!(offset_token(&dup), offset_token(&third));
    let old = expect(&s, "POST", "/demo/log", &producer("0"), b"gamma ", 204);
    assert!(
        old.header("stream-next-offset").is_none(),
        "out-of-window duplicate: {old:?}"
    );
    assert!(offset_token(&first) < offset_token(&third));

    // Stability across snapshots: publishing renumbers nothing and deletes nothing.
    let tail = offset_token(&third);
    expect(
        &s,
        "PUT",
        &format!("/demo/log/snapshot/{o2}"),
        &[],
        b"S",
        204,
    );
    let r = expect(&s, "GET", "/demo/log?offset=-1", &[], b"", 200);
    assert_eq!(r.body_str(), "alpha beta gamma delta eps ");
    assert_eq!(offset_token(&r), tail);
    // A retention advance trims: 410, Stream-Next-Offset = earliest readable = HEAD's
    // Stream-Retained-Offset; continuing from it works.
    expect(
        &s,
        "PUT",
        &format!("/demo/log/retention/{o2}"),
        &[],
        b"",
        204,
    );
    for q in ["offset=-1".to_string(), format!("offset={o1}")] {
        let r = expect(&s, "GET", &format!("/demo/log?{q}"), &[], b"", 410);
        assert_eq!(offset_token(&r), o2);
    }
    let head = expect(&s, "HEAD", "/demo/log", &[], b"", 200);
    assert_eq!(h(&head, "stream-retained-offset"), o2);
    let r = expect(&s, "GET", &format!("/demo/log?offset={o2}"), &[], b"", 200);
    assert_eq!(r.body_str(), "gamma delta eps ");

    // Recreated streams: an old offset may be accepted by the new stream and return the
    // new stream's data; only Stream-Incarnation reveals the recreation.
    let inc = h(&head, "stream-incarnation").to_string();
    expect(&s, "DELETE", "/demo/log", &[], b"", 204);
    expect(&s, "PUT", "/demo/log", &[ct], b"ALPHA BETA", 201);
    let r = expect(&s, "GET", &format!("/demo/log?offset={o1}"), &[], b"", 200);
    assert_eq!(r.body_str(), "BETA");
    let head = expect(&s, "HEAD", "/demo/log", &[], b"", 200);
    assert_ne!(h(&head, "stream-incarnation"), inc);
}

// ---------------------------------------------------------------------------------------
// Seed 003: Browser Telemetry
// ---------------------------------------------------------------------------------------

/// Read `?offset=…` responses from `offset` to the tail the way the seed tells clients to:
/// buffer any incomplete trailing line and continue from Stream-Next-Offset. Returns the
/// complete lines and how many responses ended mid-line.
fn replay_lines(s: &Server, path: &str, offset: &str) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut mid_line = 0;
    let mut at = offset.to_string();
    loop {
        let r = expect(s, "GET", &format!("{path}?offset={at}"), &[], b"", 200);
        assert!(r.body.len() <= MAX_READ);
        if !r.body.is_empty() && r.body.last() != Some(&b'\n') {
            mid_line += 1;
        }
        pending.extend_from_slice(&r.body);
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            lines.push(String::from_utf8(line[..line.len() - 1].to_vec()).expect("utf-8"));
        }
        at = offset_token(&r);
        if r.header("stream-up-to-date") == Some("true") {
            assert!(pending.is_empty(), "incomplete line at the tail");
            return (lines, mid_line);
        }
    }
}

/// The seed's `fetchEvent(streamUrl, {offset, len})`, request for request.
fn fetch_event(s: &Server, stream_path: &str, offset: &str, len: usize) -> (Value, usize) {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut received = 0;
    let mut offset = offset.to_string();
    let mut requests = 0;
    while received < len {
        let url = format!("{stream_path}?offset={offset}&max_bytes={}", len - received);
        let response = req(s, "GET", &url, &[], b"");
        requests += 1;
        assert!(
            response.is_success(),
            "event is no longer readable: {}",
            response.status
        );
        let chunk = response.body.clone();
        assert!(!chunk.is_empty(), "event is no longer readable");
        received += chunk.len();
        chunks.push(chunk);
        offset = offset_token(&response);
    }
    assert_eq!(received, len, "max_bytes never overshoots");
    let bytes = chunks.concat();
    (
        sonic_rs::from_slice(&bytes).unwrap_or_else(|e| panic!("JSON.parse: {e}")),
        requests,
    )
}

#[test]
fn seed_003_browser_telemetry() {
    let (s, _d) = start();
    expect(&s, "PUT", "/telemetry", &[], b"", 201);
    let ct = ("Content-Type", "application/json");
    expect(&s, "PUT", "/telemetry/events", &[ct], b"", 201);

    // The collector: fetch("/telemetry/events", {method: "POST", headers:
    // {"Content-Type": "application/json"}, body: JSON.stringify(events)}).
    let events =
        r#"[{"captured_at":"2026-07-18T10:30:00.100Z","type":"navigation","duration_ms":412.5}]"#;
    let r = expect(
        &s,
        "POST",
        "/telemetry/events",
        &[ct],
        events.as_bytes(),
        204,
    );
    let first_tail = offset_token(&r);
    // An out-of-order captured_at is stored in commit order, untouched.
    let late =
        r#"{"captured_at":"2026-07-18T10:29:00.000Z","type":"network_response","status":500}"#;
    expect(&s, "POST", "/telemetry/events", &[ct], late.as_bytes(), 204);

    // curl -i 'http://127.0.0.1:4437/telemetry/events?offset=-1'
    let r = expect(&s, "GET", "/telemetry/events?offset=-1", &[], b"", 200);
    assert_eq!(h(&r, "content-type"), "application/x-ndjson");
    assert_eq!(h(&r, "stream-up-to-date"), "true");
    assert_eq!(
        r.body_str(),
        format!(
            "{}\n{late}\n",
            events.trim_start_matches('[').trim_end_matches(']')
        )
    );

    // More than 8 MiB of events: responses end mid-line; buffering reassembles every event.
    let mut batch = Vec::new();
    for i in 0..40 {
        batch.push(format!(
            r#"{{"captured_at":"2026-07-18T10:31:{:02}.000Z","type":"resource","i":{i},"pad":"{}"}}"#,
            i % 60,
            "r".repeat(250_000 + i * 17)
        ));
    }
    for part in batch.chunks(10) {
        expect(
            &s,
            "POST",
            "/telemetry/events",
            &[ct],
            format!("[{}]", part.join(",")).as_bytes(),
            204,
        );
    }
    let (lines, mid_line) = replay_lines(&s, "/telemetry/events", "-1");
    assert_eq!(lines.len(), 42);
    assert_eq!(&lines[2..], &batch[..]);
    assert!(mid_line > 0, "a >8 MiB replay should hit the cap mid-line");
    // Continuing from a saved offset replays the rest.
    let (rest, _) = replay_lines(&s, "/telemetry/events", &first_tail);
    assert_eq!(rest.len(), 41);

    // For a live native EventSource, add live=sse.
    let mut raw = Raw::connect(&s.addr);
    raw.send(b"GET /telemetry/events?offset=-1&live=sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    raw.set_read_timeout(Duration::from_secs(10));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = vec![0u8; 1 << 16];
    while !String::from_utf8_lossy(&seen).contains("\"upToDate\":true") {
        assert!(Instant::now() < deadline, "no up-to-date control event");
        let n = raw.r.read(&mut buf).expect("sse read");
        assert!(n > 0, "SSE stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..200.min(text.len())]
    );
    assert!(
        text.contains("content-type: text/event-stream")
            || text.contains("Content-Type: text/event-stream")
    );
    assert!(text.contains("event: data"));
    assert!(text.contains("\"captured_at\":\"2026-07-18T10:30:00.100Z\""));
    drop(raw);

    // Locators: an opaque offset plus the message's len, resolved with the fetchEvent loop
    // on the sessions stream the indexer registration points at.
    expect(&s, "PUT", "/sessions", &[], b"", 201);
    let sp = "/sessions/browser-session-42";
    expect(&s, "PUT", sp, &[ct], b"", 201);
    let small =
        r#"{"captured_at":"2026-07-18T10:30:00.100Z","type":"navigation","duration_ms":97}"#;
    let big = format!(
        r#"{{"captured_at":"2026-07-18T10:30:00.200Z","type":"replay_blob","data":"{}"}}"#,
        "b".repeat(9 << 20)
    );
    let mut locators = Vec::new();
    let mut at = offset_token(&expect(&s, "HEAD", sp, &[], b"", 200));
    for ev in [small, big.as_str(), small] {
        let r = expect(&s, "POST", sp, &[ct], ev.as_bytes(), 204);
        let next = offset_token(&r);
        // len as the indexer reports it: the message's canonical bytes (with its LF).
        locators.push((at.clone(), ev.len() + 1, ev));
        at = next;
    }
    let head = expect(&s, "HEAD", sp, &[], b"", 200);
    let incarnation = h(&head, "stream-incarnation").to_string();
    for (offset, len, ev) in &locators {
        let (value, requests) = fetch_event(&s, sp, offset, *len);
        let expected: Value = sonic_rs::from_str(ev).expect("event JSON");
        assert_eq!(value, expected);
        if *len > MAX_READ {
            assert!(requests >= 2, "a >8 MiB event needs several reads");
        }
    }
    let (value, _) = fetch_event(&s, sp, &locators[1].0, locators[1].1);
    assert_eq!(value["type"].as_str(), Some("replay_blob"));
    // Locators are valid for source.incarnation: a recreated stream changes it.
    expect(&s, "DELETE", sp, &[], b"", 204);
    expect(&s, "PUT", sp, &[ct], b"", 201);
    let head = expect(&s, "HEAD", sp, &[], b"", 200);
    assert_ne!(h(&head, "stream-incarnation"), incarnation);

    // OTLP-JSON: one export request is one message, sent plain or compressed with gzip
    // (what the Collector's otlphttp exporter does by default).
    expect(&s, "PUT", "/otel", &[], b"", 201);
    let tp = "/otel/traces-checkout-20261003";
    expect(&s, "PUT", tp, &[ct], b"", 201);
    let export = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":"1","endTimeUnixNano":"2"},{"startTimeUnixNano":"3","endTimeUnixNano":"4"}]}]}]}"#;
    let r = expect(&s, "POST", tp, &[ct], export.as_bytes(), 204);
    assert_eq!(h(&r, "stream-record-start"), "0");
    assert_eq!(h(&r, "stream-record-next"), "1");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, export.as_bytes()).expect("in memory");
    let gz = gz.finish().expect("in memory");
    let r = expect(
        &s,
        "POST",
        tp,
        &[ct, ("Content-Encoding", "gzip")],
        &gz,
        204,
    );
    assert_eq!(h(&r, "stream-record-start"), "1");
    assert_eq!(h(&r, "stream-record-next"), "2");
    let r = expect(&s, "GET", &format!("{tp}?offset=-1"), &[], b"", 200);
    assert_eq!(r.body_str(), format!("{export}\n{export}\n"));
}
