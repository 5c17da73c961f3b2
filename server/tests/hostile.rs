//! Hostile clients: requests a careless or malicious client might send. Each one
//! must get its precise 4xx with a short plain-text reason, and must change nothing: the
//! target stream keeps its bytes and tail, and no stream is created. Framing cases that
//! `http_edges.rs` already covers (CL+TE, two Content-Lengths, `gzip, chunked`, 431 with
//! one big or many small headers, 413 by Content-Length) are not repeated here.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use support::{expect, req, request, temp_dir, write_config, Raw, Response, Server};

const TEXT: &str = "text/plain";
const JSON: &str = "application/json";

fn server_with(toml: &str) -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-hostile");
    let cfg = write_config(dir.path(), toml);
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "memory", 2, &["--config", &cfg], None);
    (s, dir)
}

fn server() -> (Server, tempfile::TempDir) {
    server_with("")
}

/// What a stream looks like from outside: its tail and its bytes.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    next: String,
    body: Vec<u8>,
}

fn snapshot(s: &Server, path: &str) -> Snapshot {
    let r = expect(s, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
    Snapshot {
        next: r
            .header("stream-next-offset")
            .unwrap_or_else(|| panic!("no Stream-Next-Offset on {path}"))
            .to_string(),
        body: r.body,
    }
}

fn absent(s: &Server, path: &str) {
    let r = req(s, "HEAD", path, &[], b"");
    assert_eq!(r.status, 404, "{path} must not exist: {r:?}");
}

/// A refusal must be the documented plain-text `<code>: <message>` and short.
fn assert_reason(r: &Response, status: u16, code: &str, what: &str) {
    assert_eq!(r.status, status, "{what}: {r:?} body {:?}", r.body_str());
    let ct = r.header("content-type").unwrap_or("");
    assert!(
        ct.starts_with("text/plain"),
        "{what}: content-type {ct:?} for a {status}"
    );
    let body = r.body_str();
    assert!(
        body.starts_with(&format!("{code}: ")) && body.len() < 200 && body.ends_with('\n'),
        "{what}: reason {body:?} is not a short '{code}: …' line"
    );
}

/// Send raw bytes on a fresh connection and read the one response. The server must close
/// the connection afterwards without running anything that followed the bad request.
fn raw_refusal(s: &Server, wire: &[u8], what: &str) -> Response {
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    c.send(wire).unwrap_or_else(|e| panic!("{what}: send: {e}"));
    let r = c
        .response()
        .unwrap_or_else(|e| panic!("{what}: no response: {e}"));
    c.set_read_timeout(Duration::from_secs(3));
    let (rest, closed) = c.read_until_close();
    assert!(
        rest.is_empty(),
        "{what}: bytes after the refusal: {:?}",
        String::from_utf8_lossy(&rest)
    );
    assert!(closed, "{what}: connection left open after a framing error");
    r
}

/// A POST that would append `EVIL` if it were ever executed, for smuggling checks.
fn smuggled(addr: &str, path: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nEVIL")
}

// ---------------------------------------------------------------------------------------
// Request lines and header bytes
// ---------------------------------------------------------------------------------------

#[test]
fn malformed_request_lines_are_400_and_change_nothing() {
    let (s, _d) = server();
    let p = "/v1/stream/lines";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"seed", 201);
    let before = snapshot(&s, p);
    let h = &s.addr;
    let ev = smuggled(h, p);
    let cases: Vec<(&str, String)> = vec![
        ("method only", format!("POST\r\n\r\n{ev}")),
        ("no version", format!("POST {p}\r\n\r\n{ev}")),
        ("HTTP/2.0", format!("POST {p} HTTP/2.0\r\nHost: {h}\r\n\r\n{ev}")),
        ("HTTP/1.x garbage version", format!("POST {p} HTTP/1.x\r\nHost: {h}\r\n\r\n{ev}")),
        ("space in target", format!("POST /v1/stream/a b HTTP/1.1\r\nHost: {h}\r\n\r\n{ev}")),
        ("double space", format!("POST  {p} HTTP/1.1\r\nHost: {h}\r\n\r\n{ev}")),
        ("relative target", format!("POST v1/stream/lines HTTP/1.1\r\nHost: {h}\r\n\r\n{ev}")),
        ("authority target", format!("POST {h} HTTP/1.1\r\nHost: {h}\r\n\r\n{ev}")),
        ("tab in method", format!("PO\tST {p} HTTP/1.1\r\nHost: {h}\r\n\r\n{ev}")),
        ("NUL in target", format!("POST {p}\0x HTTP/1.1\r\nHost: {h}\r\n\r\n{ev}")),
        ("trailing junk after version", format!("POST {p} HTTP/1.1 x\r\nHost: {h}\r\n\r\n{ev}")),
        ("no Host", format!("POST {p} HTTP/1.1\r\nContent-Length: 1\r\n\r\nx{ev}")),
        ("two Hosts", format!("POST {p} HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\nx{ev}")),
    ];
    for (what, wire) in cases {
        let r = raw_refusal(&s, wire.as_bytes(), what);
        assert_reason(&r, 400, "invalid_request", what);
    }
    // Binary garbage instead of a request line.
    let mut junk: Vec<u8> = (0u8..=255).rev().collect();
    junk.extend_from_slice(b"\r\n\r\n");
    let r = raw_refusal(&s, &junk, "binary garbage");
    assert_reason(&r, 400, "invalid_request", "binary garbage");
    assert_eq!(snapshot(&s, p), before);
    absent(&s, "/v1/stream/a%20b");
}

#[test]
fn invalid_header_bytes_are_400_and_change_nothing() {
    let (s, _d) = server();
    let p = "/v1/stream/hdrbytes";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"seed", 201);
    let before = snapshot(&s, p);
    let h = &s.addr;
    let start = format!("POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\n");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("space in name", b"Bad Name: x\r\n".to_vec()),
        ("space before colon", b"X-A : x\r\n".to_vec()),
        ("no colon", b"JustAName\r\n".to_vec()),
        ("empty name", b": x\r\n".to_vec()),
        ("NUL in value", b"X-A: a\0b\r\n".to_vec()),
        ("bare CR in value", b"X-A: a\rb\r\n".to_vec()),
        ("DEL in name", b"X-\x7fA: x\r\n".to_vec()),
        ("non-UTF-8 value", b"X-A: \xff\xfe\r\n".to_vec()),
        (
            "non-UTF-8 producer id",
            b"Producer-Id: \xc0\xae\r\nProducer-Epoch: 0\r\nProducer-Seq: 0\r\n".to_vec(),
        ),
        // obs-fold: a continuation line would let a proxy and us disagree on a value.
        ("obs-fold", b"X-A: a\r\n b\r\n".to_vec()),
        (
            "obs-fold on Content-Length",
            b"Content-Length: 1\r\n 0\r\n".to_vec(),
        ),
        (
            "obs-fold on Transfer-Encoding",
            b"Transfer-Encoding:\r\n chunked\r\n".to_vec(),
        ),
    ];
    for (what, line) in cases {
        let mut wire = start.clone().into_bytes();
        wire.extend_from_slice(&line);
        if !what.starts_with("obs-fold on") {
            wire.extend_from_slice(b"Content-Length: 4\r\n");
        }
        wire.extend_from_slice(b"\r\nABCD");
        wire.extend_from_slice(smuggled(h, p).as_bytes());
        let r = raw_refusal(&s, &wire, what);
        assert_reason(&r, 400, "invalid_request", what);
    }
    assert_eq!(snapshot(&s, p), before);
}

// ---------------------------------------------------------------------------------------
// Framing and smuggling
// ---------------------------------------------------------------------------------------

#[test]
fn ambiguous_framing_is_refused_and_the_smuggled_request_never_runs() {
    let (s, _d) = server();
    let p = "/v1/stream/smuggle2";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"seed", 201);
    let before = snapshot(&s, p);
    let h = &s.addr;
    let ev = smuggled(h, p);
    let pre = format!("POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\n");
    let chunked_body = format!("4\r\nABCD\r\n0\r\n\r\n{ev}");
    let cases: Vec<(&str, u16, String)> = vec![
        ("CL with plus sign", 400, format!("{pre}Content-Length: +4\r\n\r\nABCD{ev}")),
        ("negative CL", 400, format!("{pre}Content-Length: -4\r\n\r\nABCD{ev}")),
        ("hex CL", 400, format!("{pre}Content-Length: 0x4\r\n\r\nABCD{ev}")),
        ("CL with inner space", 400, format!("{pre}Content-Length: 4 4\r\n\r\nABCD{ev}")),
        ("empty CL", 400, format!("{pre}Content-Length:\r\n\r\nABCD{ev}")),
        ("CL overflowing u64", 400, format!("{pre}Content-Length: 99999999999999999999\r\n\r\nABCD{ev}")),
        ("TE identity", 400, format!("{pre}Transfer-Encoding: identity\r\n\r\nABCD{ev}")),
        ("TE xchunked", 400, format!("{pre}Transfer-Encoding: xchunked\r\n\r\n{chunked_body}")),
        ("TE chunked then gzip", 400, format!("{pre}Transfer-Encoding: chunked, gzip\r\n\r\n{chunked_body}")),
        ("TE chunked twice in one header", 501, format!("{pre}Transfer-Encoding: chunked, chunked\r\n\r\n{chunked_body}")),
        ("TE chunked in two headers", 501, format!("{pre}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n{chunked_body}")),
        ("TE on HTTP/1.0", 400, format!("POST {p} HTTP/1.0\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{chunked_body}")),
        ("CL then empty TE", 400, format!("{pre}Content-Length: 4\r\nTransfer-Encoding: \r\n\r\nABCD{ev}")),
        ("chunk size with sign", 400, format!("{pre}Transfer-Encoding: chunked\r\n\r\n+4\r\nABCD\r\n0\r\n\r\n{ev}")),
        ("chunk size overflowing u64", 400, format!("{pre}Transfer-Encoding: chunked\r\n\r\n1{}\r\nABCD\r\n0\r\n\r\n{ev}", "0".repeat(16))),
        ("chunk data longer than its size", 400, format!("{pre}Transfer-Encoding: chunked\r\n\r\n2\r\nABCD\r\n0\r\n\r\n{ev}")),
        ("bare LF chunk line", 400, format!("{pre}Transfer-Encoding: chunked\r\n\r\n4\nABCD\r\n0\r\n\r\n{ev}")),
    ];
    for (what, status, wire) in cases {
        let r = raw_refusal(&s, wire.as_bytes(), what);
        let code = if status == 501 {
            "not_implemented"
        } else {
            "invalid_request"
        };
        assert_reason(&r, status, code, what);
    }
    assert_eq!(
        snapshot(&s, p),
        before,
        "a refused request changed the stream"
    );
}

// ---------------------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------------------

#[test]
fn oversized_request_line_is_431() {
    let (s, _d) = server();
    let p = format!("/v1/stream/{}", "a".repeat(70 * 1024));
    let wire = format!(
        "PUT {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\nx",
        s.addr
    );
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    let _ = c.send(wire.as_bytes());
    let r = c.response().expect("a 431");
    assert_reason(&r, 431, "header_too_large", "70 KiB request line");
    // Too many (small) header fields is the same refusal.
    let mut wire = format!("GET /v1/stream/x HTTP/1.1\r\nHost: {}\r\n", s.addr);
    for i in 0..200 {
        wire.push_str(&format!("X-{i}: v\r\n"));
    }
    wire.push_str("\r\n");
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    let _ = c.send(wire.as_bytes());
    let r = c.response().expect("a 431");
    assert_reason(&r, 431, "header_too_large", "200 header fields");
}

/// The server must refuse a chunked body that grows past 32 MiB while the client is still
/// sending: the client here never sends the last chunk, so only an early answer arrives.
#[test]
fn chunked_body_over_32_mib_is_refused_before_the_client_finishes() {
    let (s, _d) = server();
    let p = "/v1/stream/early413";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"seed", 201);
    let before = snapshot(&s, p);
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(30));
    let mut w: TcpStream = c.r.get_ref().try_clone().expect("clone");
    let head = format!(
        "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.addr
    );
    let writer = thread::spawn(move || -> usize {
        let mut sent = 0usize;
        if w.write_all(head.as_bytes()).is_err() {
            return sent;
        }
        let chunk = vec![b'z'; 1 << 20];
        // 40 MiB of chunks, then stall with the body unfinished.
        for _ in 0..40 {
            if w.write_all(b"100000\r\n").is_err()
                || w.write_all(&chunk).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                return sent;
            }
            sent += chunk.len();
        }
        thread::sleep(Duration::from_secs(20));
        sent
    });
    let r = c
        .response()
        .expect("413 while the body is still unfinished");
    assert_reason(
        &r,
        413,
        "payload_too_large",
        "unfinished 40 MiB chunked body",
    );
    assert_eq!(r.header("connection"), Some("close"));
    let (_, closed) = c.read_until_close();
    assert!(closed, "connection must close after a chunked 413");
    let sent = writer.join().expect("writer");
    assert!(
        sent < 40 << 20,
        "the client managed to send all 40 MiB ({sent}); the server read past the limit"
    );
    assert_eq!(snapshot(&s, p), before);
}

// ---------------------------------------------------------------------------------------
// Stream IDs and percent-encoding
// ---------------------------------------------------------------------------------------

#[test]
fn hostile_compat_stream_ids_are_400_and_create_nothing() {
    let (s, _d) = server();
    expect(
        &s,
        "PUT",
        "/v1/stream/x/y",
        &[("Content-Type", TEXT)],
        b"xy",
        201,
    );
    let before = snapshot(&s, "/v1/stream/x/y");
    let ids = [
        "a/../b",
        "a/./b",
        "..",
        "%2e%2e",
        "%2E%2e/b",
        "a/%2e%2e/b",
        "a/%2e",
        // An encoded '/' must not smuggle an empty or dot segment into the decoded ID.
        "x%2f..%2fy",
        "x%2F.%2Fy",
        "x%2f%2fy",
        "%2fx",
        "x%2f",
        "a//b",
        "a/",
        "%00",
        "a%00b",
        "%ff",
        "%c0%ae%c0%ae",
        "%e0%80%ae",
        "%ed%a0%80",
        "%",
        "%2",
        "%zz",
        "%%32%65",
    ];
    for id in ids {
        let path = format!("/v1/stream/{id}");
        for (m, body) in [
            ("PUT", &b"evil"[..]),
            ("POST", &b"evil"[..]),
            ("GET", &b""[..]),
        ] {
            let r = req(&s, m, &path, &[("Content-Type", TEXT)], body);
            assert_reason(&r, 400, "invalid_stream_id", &format!("{m} {path}"));
        }
    }
    // Raw non-UTF-8 bytes in the target.
    let wire = b"PUT /v1/stream/\xff\xfe HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx";
    let mut c = Raw::connect(&s.addr);
    c.send(wire).expect("send");
    let r = c.response().expect("response");
    assert_eq!(r.status, 400, "raw non-UTF-8 target: {r:?}");
    assert_eq!(snapshot(&s, "/v1/stream/x/y"), before);
    // Over-long IDs (1024 bytes is the limit after decoding).
    let long = "a".repeat(1025);
    let r = req(
        &s,
        "PUT",
        &format!("/v1/stream/{long}"),
        &[("Content-Type", TEXT)],
        b"x",
    );
    assert_reason(&r, 400, "invalid_stream_id", "1025-byte id");
    let encoded = "%61".repeat(1025);
    let r = req(
        &s,
        "PUT",
        &format!("/v1/stream/{encoded}"),
        &[("Content-Type", TEXT)],
        b"x",
    );
    assert_reason(&r, 400, "invalid_stream_id", "1025 encoded bytes");
    // Nothing was created under the names a path-normalising server would have used.
    for alias in [
        "/v1/stream/b",
        "/v1/stream/y",
        "/v1/stream/a/b",
        "/v1/stream/x",
        "/v1/stream/a",
    ] {
        absent(&s, alias);
    }
}

#[test]
fn hostile_bucketed_stream_ids_are_400_and_create_nothing() {
    let (s, _d) = server();
    expect(&s, "PUT", "/logs", &[], b"", 201);
    expect(
        &s,
        "PUT",
        "/logs/app",
        &[("Content-Type", TEXT)],
        b"app",
        201,
    );
    let before = snapshot(&s, "/logs/app");
    let names = [
        "..", "%2e%2e", "a..b", "%2e", ".", "a%2fb", "a%2Fb", "%00", "%ff", "%c0%ae", "%",
    ];
    for n in names {
        let path = format!("/logs/{n}");
        let r = req(&s, "PUT", &path, &[("Content-Type", TEXT)], b"evil");
        assert_eq!(r.status, 400, "PUT {path}: {r:?}");
        assert!(r.body_str().len() < 200, "{path}: long reason");
    }
    let list = expect(&s, "GET", "/logs/streams", &[], b"", 200).body_str();
    assert!(!list.contains("evil") && !list.contains(".."), "{list}");
    assert_eq!(snapshot(&s, "/logs/app"), before);
    // Bad bucket IDs.
    for b in ["%41bcd", "ab", "a.b.c", "ABCD", "%2e%2e%2e%2e", "caf%c3%a9"] {
        let r = req(&s, "PUT", &format!("/{b}"), &[], b"");
        assert_reason(&r, 400, "invalid_bucket_id", b);
    }
}

// ---------------------------------------------------------------------------------------
// Query parameters and header values
// ---------------------------------------------------------------------------------------

#[test]
fn bad_offsets_and_read_parameters_are_400() {
    let (s, _d) = server();
    let p = "/v1/stream/offsets";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"hello", 201);
    let offsets = [
        "abc",
        "-2",
        "-0",
        "+1",
        "1e3",
        "0x10",
        "%201",
        "1%20",
        "",
        "18446744073709551616",
        "99999999999999999999",
        "000000000000000000001",
        "NOW",
        "%ff",
        "1.0",
    ];
    for o in offsets {
        let r = req(&s, "GET", &format!("{p}?offset={o}"), &[], b"");
        let code = if o == "%ff" {
            "invalid_request"
        } else {
            "invalid_offset"
        };
        assert_reason(&r, 400, code, &format!("offset={o}"));
    }
    for q in [
        "offset=0&offset=0",
        "offset=-1&live=poll",
        "offset=-1&max_bytes=0",
        "offset=-1&max_bytes=-5",
        "offset=-1&max_bytes=abc",
        "offset=-1&live=sse&live=sse",
        "live=long-poll",
    ] {
        let r = req(&s, "GET", &format!("{p}?{q}"), &[], b"");
        assert_eq!(r.status, 400, "{q}: {r:?}");
        assert!(r.body_str().len() < 200);
    }
    // Bucketed record parameters.
    expect(&s, "PUT", "/recs", &[], b"", 201);
    expect(
        &s,
        "PUT",
        "/recs/j",
        &[("Content-Type", JSON)],
        b"[1,2,3]",
        201,
    );
    for q in [
        "record=abc",
        "record=-1",
        "record=1&record=2",
        "record=99999999999999999999999",
        "tail_records=-1",
        "tail_records=1e2",
        "record=0&max_records=0",
        "record=0&max_records=x",
        "record=0&record_view=json",
        "record=0&tail_records=1",
        "record=0&offset=-1",
        "max_records=1",
    ] {
        let r = req(&s, "GET", &format!("/recs/j?{q}"), &[], b"");
        assert_eq!(r.status, 400, "{q}: {r:?}");
        assert!(r.body_str().starts_with("invalid_request: "), "{q}: {r:?}");
    }
    assert_eq!(snapshot(&s, p).body, b"hello");
}

#[test]
fn bad_producer_and_lifetime_headers_are_400_and_change_nothing() {
    let (s, _d) = server();
    let p = "/v1/stream/prod";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"seed", 201);
    let before = snapshot(&s, p);
    let big = "x".repeat(257);
    let bad_trios: Vec<[(&str, &str); 3]> = vec![
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "abc"),
            ("Producer-Seq", "0"),
        ],
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "-1"),
            ("Producer-Seq", "0"),
        ],
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "1e3"),
            ("Producer-Seq", "0"),
        ],
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "9007199254740992"),
        ],
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "18446744073709551616"),
            ("Producer-Seq", "0"),
        ],
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0x1"),
        ],
        [
            ("Producer-Id", "w"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", ""),
        ],
        [
            ("Producer-Id", ""),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0"),
        ],
        [
            ("Producer-Id", &big),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0"),
        ],
    ];
    for trio in &bad_trios {
        let mut h: Vec<(&str, &str)> = vec![("Content-Type", TEXT)];
        h.extend_from_slice(trio);
        let r = req(&s, "POST", p, &h, b"evil");
        assert_reason(&r, 400, "invalid_request", &format!("{trio:?}"));
    }
    // Partial trios.
    for h in [
        vec![("Content-Type", TEXT), ("Producer-Id", "w")],
        vec![
            ("Content-Type", TEXT),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0"),
        ],
    ] {
        let r = req(&s, "POST", p, &h, b"evil");
        assert_reason(&r, 400, "invalid_request", &format!("{h:?}"));
    }
    let long_seq = "9".repeat(1025);
    let r = req(
        &s,
        "POST",
        p,
        &[("Content-Type", TEXT), ("Stream-Seq", &long_seq)],
        b"evil",
    );
    assert_reason(&r, 400, "invalid_request", "1025-byte Stream-Seq");
    // Record preconditions on a bucketed JSON stream.
    expect(&s, "PUT", "/prod", &[], b"", 201);
    expect(&s, "PUT", "/prod/j", &[("Content-Type", JSON)], b"[1]", 201);
    let jbefore = snapshot(&s, "/prod/j");
    for v in ["-1", "abc", "1.0", "99999999999999999999999", ""] {
        let r = req(
            &s,
            "POST",
            "/prod/j",
            &[("Content-Type", JSON), ("Stream-Record-Match", v)],
            b"2",
        );
        assert_eq!(r.status, 400, "Stream-Record-Match {v:?}: {r:?}");
    }
    assert_eq!(snapshot(&s, "/prod/j"), jbefore);
    assert_eq!(snapshot(&s, p), before);

    // Lifetimes on create: nothing may be created.
    for (k, v) in [
        ("Stream-TTL", "+60"),
        ("Stream-TTL", "00060"),
        ("Stream-TTL", "-1"),
        ("Stream-TTL", "1e3"),
        ("Stream-TTL", "60.5"),
        ("Stream-TTL", "18446744073709551616"),
        ("Stream-TTL", ""),
        ("Stream-Expires-At", "tomorrow"),
        ("Stream-Expires-At", "2026-13-01T00:00:00Z"),
        ("Stream-Expires-At", "2026-02-30T00:00:00Z"),
        ("Stream-Expires-At", "2026-01-01T25:00:00Z"),
        ("Stream-Expires-At", "2026-01-01T00:00:00"),
        ("Stream-Expires-At", "2026-01-01T00:00:00+99:99"),
        ("Stream-Expires-At", "99999-01-01T00:00:00Z"),
        ("Stream-Expires-At", "2026-01-01T00:00:00.Z"),
    ] {
        let r = req(
            &s,
            "PUT",
            "/v1/stream/ttl",
            &[("Content-Type", TEXT), (k, v)],
            b"x",
        );
        assert_eq!(r.status, 400, "{k}: {v:?}: {r:?}");
        absent(&s, "/v1/stream/ttl");
    }
    let r = req(
        &s,
        "PUT",
        "/v1/stream/ttl",
        &[
            ("Content-Type", TEXT),
            ("Stream-TTL", "60"),
            ("Stream-Expires-At", "2030-01-01T00:00:00Z"),
        ],
        b"x",
    );
    assert_eq!(r.status, 400, "TTL and Expires-At together: {r:?}");
    absent(&s, "/v1/stream/ttl");
    for ct in [
        "text",
        "/plain",
        "text/",
        "text/plain;;=",
        "text /plain",
        "a/b; c",
    ] {
        let r = req(&s, "PUT", "/v1/stream/ct", &[("Content-Type", ct)], b"x");
        assert_eq!(r.status, 400, "Content-Type {ct:?}: {r:?}");
        absent(&s, "/v1/stream/ct");
    }
}

// ---------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------

#[test]
fn invalid_json_is_400_and_changes_nothing() {
    let (s, _d) = server();
    let p = "/v1/stream/json";
    expect(&s, "PUT", p, &[("Content-Type", JSON)], b"[{\"a\":1}]", 201);
    let before = snapshot(&s, p);
    let bodies: Vec<&[u8]> = vec![
        b"{",
        b"}",
        b"[1,]",
        b"{\"a\":1,}",
        b"{a:1}",
        b"'x'",
        b"1 2",
        b"{} {}",
        b"[1] x",
        b"NaN",
        b"Infinity",
        b"-",
        b"01",
        b"1.",
        b".5",
        b"1e",
        b"tru",
        b"nul",
        b"\"abc",
        b"\"a\\x\"",
        b"\"\\u12\"",
        b"\"tab\there\"",
        b"\"\xff\"",
        b"\"\xc0\xaf\"",
        b"\xef\xbb\xbf{}",
        b"// c\n1",
        b"/* c */ 1",
        b"[1]\0",
        b"   ",
        b"[]",
    ];
    for b in bodies {
        let r = req(&s, "POST", p, &[("Content-Type", JSON)], b);
        assert_eq!(r.status, 400, "{:?}: {r:?}", String::from_utf8_lossy(b));
        let text = r.body_str();
        assert!(
            (text.starts_with("invalid_json: ") || text.starts_with("empty_json_array: "))
                && text.len() < 200,
            "{:?}: reason {text:?}",
            String::from_utf8_lossy(b)
        );
        let r = req(
            &s,
            "PUT",
            "/v1/stream/json-new",
            &[("Content-Type", JSON)],
            b,
        );
        if b != b"[]" {
            assert_eq!(
                r.status,
                400,
                "create with {:?}: {r:?}",
                String::from_utf8_lossy(b)
            );
            absent(&s, "/v1/stream/json-new");
        } else {
            // An empty array is a valid (empty) initial body on create.
            assert_eq!(r.status, 201, "{r:?}");
            expect(&s, "DELETE", "/v1/stream/json-new", &[], b"", 204);
        }
    }
    assert_eq!(snapshot(&s, p), before);
}

#[test]
fn deeply_nested_json_is_refused_without_crashing() {
    let (s, _d) = server();
    let p = "/v1/stream/deep";
    expect(&s, "PUT", p, &[("Content-Type", JSON)], b"[0]", 201);
    let before = snapshot(&s, p);
    // 128 levels are allowed; anything deeper is refused, even millions of levels (a
    // recursive parser would overflow its stack long before that).
    let ok = format!("[{}{}]", "[".repeat(127), "]".repeat(127));
    let r = req(&s, "POST", p, &[("Content-Type", JSON)], ok.as_bytes());
    assert_eq!(r.status, 204, "128 levels: {r:?}");
    let before_deep = snapshot(&s, p);
    assert_ne!(before_deep, before);
    for depth in [129usize, 10_000, 1_000_000, 5_000_000] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let mut b = open.repeat(depth);
            b.push('1');
            b.push_str(&close.repeat(depth));
            let r = req(&s, "POST", p, &[("Content-Type", JSON)], b.as_bytes());
            assert_reason(&r, 400, "invalid_json", &format!("{open} x {depth}"));
        }
    }
    // Unclosed nesting is refused the same way.
    let r = req(
        &s,
        "POST",
        p,
        &[("Content-Type", JSON)],
        "[".repeat(1 << 20).as_bytes(),
    );
    assert_reason(&r, 400, "invalid_json", "unclosed");
    assert_eq!(snapshot(&s, p), before_deep);
    // The server is alive and serving after all that.
    expect(
        &s,
        "POST",
        p,
        &[("Content-Type", JSON)],
        b"{\"ok\":true}",
        204,
    );
}

// ---------------------------------------------------------------------------------------
// Append-batch frames
// ---------------------------------------------------------------------------------------

fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

#[test]
fn bad_append_batch_bodies_are_refused_and_append_nothing() {
    let (s, _d) = server();
    expect(&s, "PUT", "/bat1", &[], b"", 201);
    let p = "/bat1/s";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"seed", 201);
    let before = snapshot(&s, p);
    let url = format!("{p}/append-batch");
    let mut good_then_truncated = Vec::new();
    frame(&mut good_then_truncated, b"ok");
    good_then_truncated.extend_from_slice(&[0, 0, 0, 9, b'x']);
    let mut good_then_zero = Vec::new();
    frame(&mut good_then_zero, b"ok");
    good_then_zero.extend_from_slice(&[0, 0, 0, 0]);
    let mut huge_len = Vec::new();
    huge_len.extend_from_slice(&u32::MAX.to_be_bytes());
    huge_len.extend_from_slice(b"abc");
    let mut too_many = Vec::new();
    for _ in 0..513 {
        frame(&mut too_many, b"x");
    }
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("half a prefix", vec![0, 0], 400),
        ("truncated payload", good_then_truncated, 400),
        ("zero-length frame", good_then_zero, 400),
        ("length near u32::MAX", huge_len, 400),
        ("513 frames", too_many, 413),
    ];
    for (what, body, status) in cases {
        let r = req(&s, "POST", &url, &[("Content-Type", TEXT)], &body);
        assert_eq!(r.status, status, "{what}: {r:?} {:?}", r.body_str());
        assert!(r.body_str().len() < 200, "{what}: long reason");
    }
    // Invalid JSON inside frames fails those frames only, and fails them cleanly.
    expect(&s, "PUT", "/bat1/j", &[("Content-Type", JSON)], b"", 201);
    let jbefore = snapshot(&s, "/bat1/j");
    let mut b = Vec::new();
    frame(&mut b, b"{");
    frame(
        &mut b,
        &format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
    );
    let r = req(
        &s,
        "POST",
        "/bat1/j/append-batch",
        &[("Content-Type", JSON)],
        &b,
    );
    assert!(
        r.status == 200 || r.status == 207 || r.status == 400,
        "{r:?}"
    );
    assert_eq!(snapshot(&s, "/bat1/j"), jbefore);
    assert_eq!(snapshot(&s, p), before);
}

// ---------------------------------------------------------------------------------------
// A hostile client cannot stop the server from serving others
// ---------------------------------------------------------------------------------------

#[test]
fn server_still_serves_after_the_hostile_barrage() {
    let (s, _d) = server();
    let p = "/v1/stream/after";
    expect(&s, "PUT", p, &[("Content-Type", TEXT)], b"", 201);
    let t0 = Instant::now();
    for i in 0..200u32 {
        let mut c = Raw::connect(&s.addr);
        c.set_read_timeout(Duration::from_secs(5));
        let garbage: Vec<u8> = (0..64).map(|k| (i.wrapping_mul(31) ^ k) as u8).collect();
        let _ = c.send(&garbage);
        let _ = c.send(b"\r\n\r\n");
        let _ = c.read_until_close();
    }
    let r = request(&s.addr, "POST", p, &[("Content-Type", TEXT)], b"fine").expect("post");
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(snapshot(&s, p).body, b"fine");
    assert!(t0.elapsed() < Duration::from_secs(60));
}

// ---------------------------------------------------------------------------------------
// Tokens before bodies, body deadlines and budgets, lifetimes, Location, repeated headers,
// text charsets, active content
// ---------------------------------------------------------------------------------------

const WRITE_TOKEN: &str = "write-token-0123456789";

fn server_with_tokens(toml: &str) -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-hostile");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("write:{WRITE_TOKEN}\n")).expect("write tokens");
    let toml = format!(
        "auth_token_file = {:?}\n{toml}",
        tokens.display().to_string()
    );
    let cfg = write_config(dir.path(), &toml);
    let s = Server::spawn_standard(
        &dir.path().join("data"),
        "memory",
        2,
        &["--config", &cfg],
        None,
    );
    (s, dir)
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_request_without_a_token_is_refused_on_its_head() {
    let (s, _d) = server_with_tokens("");
    // Expect: 100-continue gets the 401 at once, never a 100 Continue.
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(3));
    let head = "POST /v1/stream/x HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\n\
                Content-Length: 31457280\r\nExpect: 100-continue\r\n\r\n";
    c.send(head.as_bytes()).expect("send");
    let (status, _) = c.head_only().expect("an answer without the body");
    assert_eq!(status, 401);

    // Ten tokenless clients that send most of a 30 MiB body and stall hold no body memory:
    // each is answered and closed on its head.
    let before = rss_kib(s.pid());
    let chunk = vec![b'x'; 1 << 20];
    let clients: Vec<_> = (0..10)
        .map(|_| {
            let addr = s.addr.clone();
            let chunk = chunk.clone();
            thread::spawn(move || {
                let Ok(mut t) = TcpStream::connect(&addr) else {
                    return Duration::ZERO;
                };
                let _ = t.set_write_timeout(Some(Duration::from_secs(5)));
                let t0 = Instant::now();
                let head = "POST /v1/stream/x HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\n\
                            Content-Length: 31457280\r\n\r\n";
                if t.write_all(head.as_bytes()).is_err() {
                    return t0.elapsed();
                }
                for _ in 0..30 {
                    if t.write_all(&chunk).is_err() {
                        break;
                    }
                }
                t0.elapsed()
            })
        })
        .collect();
    for c in clients {
        let took = c.join().expect("client");
        assert!(
            took < Duration::from_secs(5),
            "a refused body kept its sender busy for {took:?}"
        );
    }
    let grown = rss_kib(s.pid()).saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "RSS grew {grown} KiB for ten refused 30 MiB bodies"
    );
    let auth = format!("Bearer {WRITE_TOKEN}");
    let r = req(&s, "HEAD", "/v1/stream/x", &[("authorization", &auth)], b"");
    assert_eq!(r.status, 404, "a refused body created nothing");
    // With the token the same request goes through.
    expect(
        &s,
        "PUT",
        "/v1/stream/x",
        &[("authorization", &auth), ("content-type", TEXT)],
        b"ok",
        201,
    );
}

#[test]
fn a_body_slower_than_the_minimum_rate_runs_out_of_time() {
    // The default minimum is 256 KiB/s on average after the first second.
    let (s, _d) = server_with("body_timeout_ms = 1000\n");
    expect(
        &s,
        "PUT",
        "/v1/stream/slow",
        &[("content-type", TEXT)],
        b"",
        201,
    );
    let mut c = Raw::connect(&s.addr);
    c.send(
        b"POST /v1/stream/slow HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\n\
          Content-Length: 1048576\r\n\r\n",
    )
    .expect("head");
    // 64 KiB/s: four times what used to be the minimum, a quarter of the minimum now.
    let t0 = Instant::now();
    let piece = vec![b'a'; 16 * 1024];
    while t0.elapsed() < Duration::from_secs(12) {
        if c.send(&piece).is_err() {
            break;
        }
        thread::sleep(Duration::from_millis(250));
    }
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the body was still being taken after {took:?}"
    );
    assert!(snapshot(&s, "/v1/stream/slow").body.is_empty());
}

#[test]
fn bodies_beyond_the_core_budget_wait_their_turn() {
    let (s, _d) = server_with("body_budget_bytes = 1048576\n");
    expect(
        &s,
        "PUT",
        "/v1/stream/b",
        &[("content-type", TEXT)],
        b"",
        201,
    );
    // Core affinity is by connection; two connections land on either core, so hold the
    // budget on every core with one stalled body each.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut c = Raw::connect(&s.addr);
        c.send(
            b"POST /v1/stream/b HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\n\
              Content-Length: 900000\r\n\r\nabc",
        )
        .expect("head");
        stalled.push(c);
    }
    thread::sleep(Duration::from_millis(300));
    let r = req(
        &s,
        "POST",
        "/v1/stream/b",
        &[("content-type", TEXT), ("content-length", "900000")],
        &vec![b'z'; 900_000],
    );
    assert_reason(&r, 503, "unavailable", "over the body budget");
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(stalled);
    thread::sleep(Duration::from_millis(300));
    expect(
        &s,
        "POST",
        "/v1/stream/b",
        &[("content-type", TEXT)],
        b"after",
        204,
    );
}

#[test]
fn lifetimes_that_overflow_or_are_over_create_nothing() {
    let (s, _d) = server();
    for (name, value) in [
        ("stream-ttl", "18446744073709551615"),
        ("stream-ttl", "9223372036854775807"),
        ("stream-ttl", "9223372036854775"),
        ("stream-expires-at", "2000-01-01T00:00:00Z"),
    ] {
        let r = req(
            &s,
            "PUT",
            "/v1/stream/life",
            &[("content-type", TEXT), (name, value)],
            b"initial",
        );
        assert_reason(&r, 400, "invalid_request", &format!("{name}: {value}"));
        absent(&s, "/v1/stream/life");
    }
    // A century is a window the clock can hold.
    expect(
        &s,
        "PUT",
        "/v1/stream/life",
        &[("content-type", TEXT), ("stream-ttl", "3153600000")],
        b"initial",
        201,
    );
    assert_eq!(snapshot(&s, "/v1/stream/life").body, b"initial");
}

#[test]
fn location_never_comes_from_the_host_header() {
    let (s, _d) = server();
    for (path, ct) in [
        ("/evilbkt", ""),
        ("/evilbkt/s", "Content-Type: application/json\r\n"),
        ("/v1/stream/e", "Content-Type: text/plain\r\n"),
    ] {
        let mut c = Raw::connect(&s.addr);
        let wire = format!(
            "PUT {path} HTTP/1.1\r\nHost: attacker.example\r\n{ct}Content-Length: 0\r\n\r\n"
        );
        c.send(wire.as_bytes()).expect("send");
        let r = c.response().expect("response");
        assert_eq!(r.status, 201, "{path}");
        assert_eq!(
            r.header("location"),
            Some(format!("{}{path}", s.base_url).as_str()),
            "{path}"
        );
    }
    // HTTP/1.0 without Host still gets a Location.
    let mut c = Raw::connect(&s.addr);
    c.send(b"PUT /otherbkt HTTP/1.0\r\n\r\n").expect("send");
    let r = c.response().expect("response");
    assert_eq!(r.status, 201);
    assert_eq!(
        r.header("location"),
        Some(format!("{}/otherbkt", s.base_url).as_str())
    );

    // A configured public URL is the base instead.
    let (p, _d2) = server_with("public_url = \"https://streams.example.com/\"\n");
    let mut c = Raw::connect(&p.addr);
    c.send(b"PUT /pubbkt HTTP/1.1\r\nHost: 127.0.0.1@evil.com\r\nContent-Length: 0\r\n\r\n")
        .expect("send");
    let r = c.response().expect("response");
    assert_eq!(r.status, 201);
    assert_eq!(
        r.header("location"),
        Some("https://streams.example.com/pubbkt")
    );
}

#[test]
fn repeated_single_valued_headers_are_ambiguous() {
    let (s, _d) = server();
    for (name, a, b) in [
        ("Authorization", "Bearer a", "Bearer b"),
        ("Content-Type", "text/plain", "application/json"),
        ("Stream-TTL", "60", "120"),
        ("Producer-Id", "p1", "p2"),
    ] {
        let wire = format!(
            "PUT /v1/stream/dup HTTP/1.1\r\nHost: a\r\n{name}: {a}\r\n{}: {b}\r\n\
             Content-Length: 0\r\n\r\n",
            name.to_ascii_lowercase()
        );
        let r = raw_refusal(&s, wire.as_bytes(), name);
        assert_reason(&r, 400, "invalid_request", name);
        assert!(
            r.body_str().contains("duplicate"),
            "{name}: {:?}",
            r.body_str()
        );
        absent(&s, "/v1/stream/dup");
    }
}

#[test]
fn text_streams_hold_utf8_only() {
    let (s, _d) = server();
    let r = req(
        &s,
        "PUT",
        "/v1/stream/latin",
        &[("content-type", "text/plain; charset=latin1")],
        b"caf\xe9",
    );
    assert_reason(&r, 415, "unsupported_charset", "latin1 text stream");
    absent(&s, "/v1/stream/latin");

    expect(
        &s,
        "PUT",
        "/v1/stream/t",
        &[("content-type", TEXT)],
        b"caf\xc3\xa9",
        201,
    );
    let before = snapshot(&s, "/v1/stream/t");
    let r = req(
        &s,
        "POST",
        "/v1/stream/t",
        &[("content-type", TEXT)],
        b"caf\xe9",
    );
    assert_reason(&r, 400, "invalid_text", "invalid UTF-8 on a text stream");
    assert_eq!(snapshot(&s, "/v1/stream/t"), before);
    // Bytes of any kind still go to binary streams.
    expect(
        &s,
        "PUT",
        "/v1/stream/bin",
        &[("content-type", "application/octet-stream")],
        b"caf\xe9",
        201,
    );
}

#[test]
fn json_with_a_lone_surrogate_is_refused() {
    let (s, _d) = server();
    expect(
        &s,
        "PUT",
        "/v1/stream/j",
        &[("content-type", JSON)],
        b"",
        201,
    );
    for body in [&br#"["\ud800"]"#[..], br#"{"k":"\udc00x"}"#] {
        let r = req(&s, "POST", "/v1/stream/j", &[("content-type", JSON)], body);
        assert_reason(&r, 400, "invalid_json", "lone surrogate");
    }
    expect(
        &s,
        "POST",
        "/v1/stream/j",
        &[("content-type", JSON)],
        br#"["\ud83d\ude00"]"#,
        204,
    );
}

#[test]
fn active_content_is_sandboxed() {
    let (s, _d) = server();
    expect(
        &s,
        "PUT",
        "/v1/stream/html",
        &[("content-type", "text/html")],
        b"<script>1</script>",
        201,
    );
    let r = expect(&s, "GET", "/v1/stream/html?offset=-1", &[], b"", 200);
    assert_eq!(r.header("content-security-policy"), Some("sandbox"));
    expect(
        &s,
        "PUT",
        "/v1/stream/plain",
        &[("content-type", TEXT)],
        b"x",
        201,
    );
    let r = expect(&s, "GET", "/v1/stream/plain?offset=-1", &[], b"", 200);
    assert_eq!(r.header("content-security-policy"), None);
}

#[test]
fn a_connection_that_never_speaks_is_closed_at_the_head_timeout() {
    let (s, _d) = server_with("header_timeout_ms = 300\nidle_timeout_ms = 20000\n");
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(10));
    let t0 = Instant::now();
    let (_, closed) = c.read_until_close();
    let took = t0.elapsed();
    assert!(
        closed && took < Duration::from_secs(3),
        "closed {closed} after {took:?}"
    );
}

#[test]
fn an_offset_past_u64_says_so() {
    let (s, _d) = server();
    expect(
        &s,
        "PUT",
        "/v1/stream/o",
        &[("content-type", TEXT)],
        b"x",
        201,
    );
    let r = req(
        &s,
        "GET",
        "/v1/stream/o?offset=99999999999999999999",
        &[],
        b"",
    );
    assert_reason(&r, 400, "invalid_offset", "20 digits past u64");
    assert!(
        r.body_str().contains("largest offset"),
        "{:?}",
        r.body_str()
    );
}
