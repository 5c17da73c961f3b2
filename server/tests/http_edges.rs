//! HTTP/1.1 edge cases the conformance suite does not exercise (conformance-map §6):
//! pipelining, chunked uploads, `Expect: 100-continue`, body/header limits, request
//! smuggling, slow clients, `Content-Encoding`, offsets beyond the tail, `max_bytes` and
//! the 8 MiB read cap. Every test talks to the real `ursula` binary.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use support::{offset_token, request, temp_dir, write_config, Raw, Response, Server};

const MAX_BODY: usize = 32 << 20;
const MAX_READ: usize = 8 << 20;

/// A memory-storage server with `toml` as its config file (may be empty).
fn server_with(toml: &str) -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-http-edges");
    let cfg = write_config(dir.path(), toml);
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "memory", 2, &["--config", &cfg], None);
    (s, dir)
}

fn server() -> (Server, tempfile::TempDir) {
    server_with("")
}

fn create(s: &Server, path: &str, ct: &str, body: &[u8]) {
    let r = request(&s.addr, "PUT", path, &[("Content-Type", ct)], body).unwrap();
    assert_eq!(r.status, 201, "create {path}: {r:?}");
}

fn read_all(s: &Server, path: &str) -> Response {
    let r = request(&s.addr, "GET", &format!("{path}?offset=-1"), &[], b"").unwrap();
    assert_eq!(r.status, 200, "read {path}: {r:?}");
    r
}

fn tail(s: &Server, path: &str) -> u64 {
    let r = request(&s.addr, "HEAD", path, &[], b"").unwrap();
    assert_eq!(r.status, 200, "HEAD {path}: {r:?}");
    r.next_offset().expect("Stream-Next-Offset on HEAD")
}

fn head_str(r: &Response, name: &str) -> String {
    r.header(name)
        .unwrap_or_else(|| panic!("missing {name} in {r:?}"))
        .to_string()
}

// ---------------------------------------------------------------------------------------
// 1. Pipelining
// ---------------------------------------------------------------------------------------

#[test]
fn pipelined_requests_answered_in_order_on_one_connection() {
    let (s, _d) = server();
    let p = "/v1/stream/pipe";
    let mut wire = Vec::new();
    let h = &s.addr;
    wire.extend_from_slice(
        format!("PUT {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\na").as_bytes(),
    );
    wire.extend_from_slice(
        format!("POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nbc").as_bytes(),
    );
    wire.extend_from_slice(
        format!("POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\ndef").as_bytes(),
    );
    wire.extend_from_slice(format!("GET {p}?offset=-1 HTTP/1.1\r\nHost: {h}\r\n\r\n").as_bytes());
    wire.extend_from_slice(format!("HEAD {p} HTTP/1.1\r\nHost: {h}\r\n\r\n").as_bytes());

    let mut c = Raw::connect(&s.addr);
    c.send(&wire).unwrap();

    let r1 = c.response().unwrap();
    assert_eq!(r1.status, 201, "{r1:?}");
    assert_eq!(r1.next_offset(), Some(1));
    let r2 = c.response().unwrap();
    assert_eq!(r2.status, 204, "{r2:?}");
    assert_eq!(r2.next_offset(), Some(3));
    let r3 = c.response().unwrap();
    assert_eq!(r3.status, 204, "{r3:?}");
    assert_eq!(r3.next_offset(), Some(6));
    let r4 = c.response().unwrap();
    assert_eq!(r4.status, 200, "{r4:?}");
    assert_eq!(r4.body, b"abcdef");
    assert_eq!(r4.next_offset(), Some(6));
    assert_eq!(r4.header("stream-up-to-date"), Some("true"));
    let r5 = c.response_for(true).unwrap();
    assert_eq!(r5.status, 200, "{r5:?}");
    assert_eq!(r5.next_offset(), Some(6));
    assert_eq!(r5.header("content-type"), Some("text/plain"));

    // The connection is still usable afterwards.
    c.send(format!("GET {p}?offset=3 HTTP/1.1\r\nHost: {h}\r\n\r\n").as_bytes())
        .unwrap();
    let r6 = c.response().unwrap();
    assert_eq!(r6.status, 200);
    assert_eq!(r6.body, b"def");
}

// ---------------------------------------------------------------------------------------
// 2. Chunked request bodies
// ---------------------------------------------------------------------------------------

#[test]
fn chunked_post_sent_in_pieces_appends_exactly() {
    let (s, _d) = server();
    let p = "/v1/stream/chunked";
    create(&s, p, "application/octet-stream", b"");
    let mut c = Raw::connect(&s.addr);
    let head = format!(
        "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.addr
    );
    let pieces: &[&[u8]] = &[
        head.as_bytes(),
        b"5\r\nhel",
        b"lo\r\n",
        b"1",
        b"0\r\n, chunked w", // 0x10 = 16 bytes: ", chunked world!"
        b"orld!\r\n",
        b"3;ext=1\r\n\x00\xff\n\r\n", // chunk extension, binary data
        b"0\r\n",
        b"\r\n",
    ];
    for piece in pieces {
        c.send(piece).unwrap();
        thread::sleep(Duration::from_millis(30));
    }
    let r = c.response().unwrap();
    assert_eq!(r.status, 204, "{r:?}");
    let expected: &[u8] = b"hello, chunked world!\x00\xff\n";
    assert_eq!(r.next_offset(), Some(expected.len() as u64));
    assert_eq!(read_all(&s, p).body, expected);

    // Keep-alive still works after a chunked body (with a trailer section this time).
    c.send(
        format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nXY\r\n0\r\nX-Trailer: 1\r\n\r\n",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    let r = c.response().unwrap();
    assert_eq!(r.status, 204, "{r:?}");
    let mut all = expected.to_vec();
    all.extend_from_slice(b"XY");
    assert_eq!(r.next_offset(), Some(all.len() as u64));
    assert_eq!(read_all(&s, p).body, all);
}

#[test]
fn malformed_chunked_framing_is_400_and_appends_nothing() {
    let (s, _d) = server();
    let p = "/v1/stream/badchunk";
    create(&s, p, "text/plain", b"base");
    let bad_bodies: &[&[u8]] = &[
        b"zz\r\nabc\r\n0\r\n\r\n", // non-hex size
        b"3\r\nabcX\r\n0\r\n\r\n", // data longer than the declared size
        b"5\r\nabc\r\n0\r\n\r\n",  // data shorter than declared (eats the CRLF)
        b"-1\r\nabc\r\n0\r\n\r\n", // negative size
        b"3\nabc\r\n0\r\n\r\n",    // bare LF after the size
    ];
    for body in bad_bodies {
        let mut c = Raw::connect(&s.addr);
        let mut wire = format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
            s.addr
        )
        .into_bytes();
        wire.extend_from_slice(body);
        c.send(&wire).unwrap();
        let r = c.response().unwrap();
        assert_eq!(
            r.status,
            400,
            "body {:?}: {r:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(
            tail(&s, p),
            4,
            "nothing appended after {:?}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(read_all(&s, p).body, b"base");
}

#[test]
fn malformed_chunk_trailer_line_is_400() {
    // RFC 9112 §7.1.2: trailer-section = *( field-line CRLF ); a line without ':' is not a
    // field line, so the chunked framing is malformed.
    let (s, _d) = server();
    let p = "/v1/stream/badtrailer";
    create(&s, p, "text/plain", b"base");
    let mut c = Raw::connect(&s.addr);
    c.send(
        format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nnot a field line\r\n\r\n",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    let r = c.response().unwrap();
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(read_all(&s, p).body, b"base");
}

// ---------------------------------------------------------------------------------------
// 3. Expect: 100-continue
// ---------------------------------------------------------------------------------------

#[test]
fn expect_100_continue_gets_interim_response_before_body() {
    let (s, _d) = server();
    let p = "/v1/stream/expect";
    create(&s, p, "text/plain", b"");
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(3));
    c.send(
        format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    let (status, _) = c
        .head_only()
        .expect("server must send 100 Continue before the body is sent");
    assert_eq!(status, 100);
    c.send(b"hello").unwrap();
    let r = c.response().unwrap();
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(r.next_offset(), Some(5));
    assert_eq!(read_all(&s, p).body, b"hello");
}

#[test]
fn expect_100_continue_with_rejected_head_gets_final_status_only() {
    // A request that fails before the body matters (unknown stream) may be answered with
    // the final status directly; it must not be 100 followed by nothing.
    let (s, _d) = server();
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(3));
    c.send(
        format!(
            "POST /v1/stream/absent HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    let (status, _) = c.head_only().expect("some response to the head");
    if status == 100 {
        c.send(b"hello").unwrap();
        let r = c.response().unwrap();
        assert_eq!(r.status, 404, "{r:?}");
    } else {
        assert_eq!(status, 404);
    }
}

// ---------------------------------------------------------------------------------------
// 4. 413
// ---------------------------------------------------------------------------------------

#[test]
fn content_length_over_32_mib_is_413_without_reading_body() {
    let (s, _d) = server();
    let p = "/v1/stream/big";
    create(&s, p, "application/octet-stream", b"x");
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(3));
    let t0 = Instant::now();
    c.send(
        format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            s.addr,
            MAX_BODY + 1
        )
        .as_bytes(),
    )
    .unwrap();
    let r = c
        .response()
        .expect("413 must arrive without the client sending the body");
    assert_eq!(r.status, 413, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(tail(&s, p), 1);

    // Same for PUT (create) — and nothing is created.
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(3));
    c.send(
        format!(
            "PUT /v1/stream/big2 HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            s.addr,
            MAX_BODY + 1
        )
        .as_bytes(),
    )
    .unwrap();
    let r = c.response().expect("413 on PUT");
    assert_eq!(r.status, 413, "{r:?}");
    let h = request(&s.addr, "HEAD", "/v1/stream/big2", &[], b"").unwrap();
    assert_eq!(h.status, 404);
}

#[test]
fn content_length_exactly_32_mib_is_accepted() {
    let (s, _d) = server();
    let p = "/v1/stream/exact";
    create(&s, p, "application/octet-stream", b"");
    let body: Vec<u8> = (0..MAX_BODY).map(|i| (i % 251) as u8).collect();
    let r = request(
        &s.addr,
        "POST",
        p,
        &[("Content-Type", "application/octet-stream")],
        &body,
    )
    .unwrap();
    assert!(r.status == 200 || r.status == 204, "{r:?}");
    assert_eq!(r.next_offset(), Some(MAX_BODY as u64));
    // Spot-check content at the edges without reading 32 MiB back.
    let r = request(
        &s.addr,
        "GET",
        &format!("{p}?offset={}", MAX_BODY - 10),
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, &body[MAX_BODY - 10..]);
}

/// Stream a chunked body of `total` bytes in 1 MiB chunks from a writer thread while the
/// main thread waits for the response (so a server that answers early and closes cannot
/// deadlock the test). Returns the response and whether the server closed afterwards.
fn chunked_upload(s: &Server, path: &str, total: usize) -> (Response, bool) {
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(30));
    let mut w: TcpStream = c.r.get_ref().try_clone().unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.addr
    );
    let writer = thread::spawn(move || -> std::io::Result<()> {
        w.write_all(head.as_bytes())?;
        let chunk = vec![b'z'; 1 << 20];
        let mut sent = 0;
        while sent < total {
            let n = chunk.len().min(total - sent);
            w.write_all(format!("{n:x}\r\n").as_bytes())?;
            w.write_all(&chunk[..n])?;
            w.write_all(b"\r\n")?;
            sent += n;
        }
        w.write_all(b"0\r\n\r\n")?;
        Ok(())
    });
    let r = c.response().expect("a response to the chunked upload");
    let closed = if r.status == 413 {
        c.set_read_timeout(Duration::from_secs(5));
        matches!(c.wait_closed(), Ok(true))
    } else {
        false
    };
    // The writer either finished or failed with EPIPE/ECONNRESET after the close.
    let _ = writer.join();
    (r, closed)
}

#[test]
fn chunked_body_growing_past_32_mib_is_413_and_closes() {
    let (s, _d) = server();
    let p = "/v1/stream/bigchunked";
    create(&s, p, "application/octet-stream", b"a");
    let (r, closed) = chunked_upload(&s, p, MAX_BODY + 3 * (1 << 20));
    assert_eq!(r.status, 413, "{r:?}");
    assert!(closed, "connection must be closed after a chunked 413");
    assert_eq!(tail(&s, p), 1, "nothing appended");
}

#[test]
fn chunked_body_of_exactly_32_mib_is_accepted() {
    let (s, _d) = server();
    let p = "/v1/stream/exactchunked";
    create(&s, p, "application/octet-stream", b"");
    let (r, _) = chunked_upload(&s, p, MAX_BODY);
    assert!(r.status == 200 || r.status == 204, "{r:?}");
    assert_eq!(r.next_offset(), Some(MAX_BODY as u64));
    assert_eq!(tail(&s, p), MAX_BODY as u64);
}

// ---------------------------------------------------------------------------------------
// 5. 431
// ---------------------------------------------------------------------------------------

#[test]
fn request_head_over_64_kib_is_431() {
    let (s, _d) = server();
    let p = "/v1/stream/hdr";
    create(&s, p, "text/plain", b"q");

    // Well under the limit: fine.
    let pad = "a".repeat(32 * 1024);
    let r = request(
        &s.addr,
        "GET",
        &format!("{p}?offset=-1"),
        &[("X-Pad", &pad)],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 200, "32 KiB header must be accepted");

    // Over the limit, one big header.
    let pad = "a".repeat(70 * 1024);
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    let _ = c.send(
        format!(
            "GET {p}?offset=-1 HTTP/1.1\r\nHost: {}\r\nX-Pad: {pad}\r\n\r\n",
            s.addr
        )
        .as_bytes(),
    );
    let r = c.response().expect("431 response");
    assert_eq!(r.status, 431, "{r:?}");

    // Over the limit, many small headers on a POST: nothing appended.
    let mut wire = format!(
        "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n",
        s.addr
    );
    for i in 0..2000 {
        wire.push_str(&format!("X-H{i}: {}\r\n", "b".repeat(30)));
    }
    wire.push_str("\r\nZ");
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    let _ = c.send(wire.as_bytes());
    let r = c.response().expect("431 response");
    assert_eq!(r.status, 431, "{r:?}");
    assert_eq!(tail(&s, p), 1);
}

// ---------------------------------------------------------------------------------------
// 6. Request smuggling
// ---------------------------------------------------------------------------------------

fn assert_rejected_framing(s: &Server, wire: String, what: &str) {
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    c.send(wire.as_bytes()).unwrap();
    let r = c
        .response()
        .unwrap_or_else(|e| panic!("{what}: no response: {e}"));
    assert_eq!(r.status, 400, "{what}: {r:?}");
    // The smuggled second request must never be executed: the connection is closed (or at
    // least the trailing bytes are not run as a request).
    c.set_read_timeout(Duration::from_secs(2));
    let (rest, _) = c.read_until_close();
    assert!(
        rest.is_empty(),
        "{what}: extra bytes after the 400: {:?}",
        String::from_utf8_lossy(&rest)
    );
}

#[test]
fn content_length_plus_transfer_encoding_is_400() {
    let (s, _d) = server();
    let p = "/v1/stream/smuggle";
    create(&s, p, "text/plain", b"0");
    let h = &s.addr;
    // CL says 5, chunked says "abc" and then a smuggled POST follows.
    let wire = format!(
        "POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nPOST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nEVIL"
    );
    assert_rejected_framing(&s, wire, "CL + TE");
    // Header order reversed.
    let wire = format!(
        "POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    );
    assert_rejected_framing(&s, wire, "TE + CL");
    assert_eq!(read_all(&s, p).body, b"0");
}

#[test]
fn duplicate_content_length_is_400() {
    let (s, _d) = server();
    let p = "/v1/stream/dupcl";
    create(&s, p, "text/plain", b"0");
    let h = &s.addr;
    let wire = format!(
        "POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nContent-Length: 7\r\n\r\nabcdefg"
    );
    assert_rejected_framing(&s, wire, "CL 3 + CL 7");
    let wire = format!(
        "POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
    );
    assert_rejected_framing(&s, wire, "CL 3 + CL 3");
    let wire = format!(
        "POST {p} HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain\r\nContent-Length: 3, 3\r\n\r\nabc"
    );
    assert_rejected_framing(&s, wire, "CL '3, 3'");
    assert_eq!(read_all(&s, p).body, b"0");
}

#[test]
fn unsupported_transfer_encoding_is_rejected() {
    let (s, _d) = server();
    let p = "/v1/stream/te";
    create(&s, p, "text/plain", b"0");
    let mut c = Raw::connect(&s.addr);
    c.set_read_timeout(Duration::from_secs(5));
    c.send(
        format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    let r = c.response().unwrap();
    assert!(r.status == 400 || r.status == 501, "{r:?}");
    assert_eq!(read_all(&s, p).body, b"0");
}

// ---------------------------------------------------------------------------------------
// 7. Slow clients
// ---------------------------------------------------------------------------------------

const SLOW_CFG: &str = "header_timeout_ms = 300\nidle_timeout_ms = 300\n";

/// Wait for the server to end the connection; a `408` response before the close is fine.
fn expect_closed_within(c: &mut Raw, limit: Duration, what: &str) -> Duration {
    let t0 = Instant::now();
    c.set_read_timeout(limit);
    let (bytes, closed) = c.read_until_close();
    let took = t0.elapsed();
    assert!(closed, "{what}: connection still open after {took:?}");
    if !bytes.is_empty() {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.starts_with("HTTP/1.1 408"),
            "{what}: unexpected bytes before close: {text:?}"
        );
    }
    took
}

#[test]
fn stalled_request_head_is_closed_after_header_timeout() {
    let (s, _d) = server_with(SLOW_CFG);
    let mut c = Raw::connect(&s.addr);
    c.send(b"GET /v1/stream/x?offset=-1 HTTP/1.1\r\nHost: x\r\nX-Partial: ")
        .unwrap();
    let took = expect_closed_within(&mut c, Duration::from_secs(5), "stalled head");
    assert!(
        took >= Duration::from_millis(200),
        "closed too early: {took:?}"
    );
}

#[test]
fn trickled_request_head_is_closed_after_header_timeout() {
    // Slowloris: one byte every 50 ms keeps the socket busy but the head never completes
    // within header_timeout; the deadline must be for the whole head, not per read.
    let (s, _d) = server_with(SLOW_CFG);
    let mut c = Raw::connect(&s.addr);
    c.send(b"GET /v1/stream/x?offset=-1 HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let t0 = Instant::now();
    let mut closed_by_write = false;
    while t0.elapsed() < Duration::from_secs(3) {
        if c.send(b"X-A: b\r\n").is_err() {
            closed_by_write = true;
            break;
        }
        thread::sleep(Duration::from_millis(50));
        // Check (without blocking long) whether the server already closed.
        c.set_read_timeout(Duration::from_millis(1));
        let mut buf = [0u8; 256];
        match std::io::Read::read(&mut c.r, &mut buf) {
            Ok(0) => {
                closed_by_write = true;
                break;
            }
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                assert!(text.starts_with("HTTP/1.1 408"), "unexpected: {text:?}");
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                closed_by_write = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(
        closed_by_write,
        "trickling client kept the connection open for {:?} with header_timeout 300 ms",
        t0.elapsed()
    );
}

#[test]
fn stalled_request_body_is_closed() {
    let (s, _d) = server_with(SLOW_CFG);
    let p = "/v1/stream/stallbody";
    create(&s, p, "text/plain", b"");
    let mut c = Raw::connect(&s.addr);
    c.send(
        format!(
            "POST {p} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nabc",
            s.addr
        )
        .as_bytes(),
    )
    .unwrap();
    expect_closed_within(&mut c, Duration::from_secs(5), "stalled body");
    assert_eq!(tail(&s, p), 0, "partial body must not be appended");
}

#[test]
fn idle_keep_alive_connection_is_closed_after_idle_timeout() {
    let (s, _d) = server_with(SLOW_CFG);
    let p = "/v1/stream/idle";
    create(&s, p, "text/plain", b"hi");
    let mut c = Raw::connect(&s.addr);
    let get = format!("GET {p}?offset=-1 HTTP/1.1\r\nHost: {}\r\n\r\n", s.addr);
    c.send(get.as_bytes()).unwrap();
    let r = c.response().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hi");
    // A quick follow-up on the same connection still works.
    thread::sleep(Duration::from_millis(50));
    c.send(get.as_bytes()).unwrap();
    assert_eq!(c.response().unwrap().body, b"hi");
    let t0 = Instant::now();
    c.set_read_timeout(Duration::from_secs(5));
    let (bytes, closed) = c.read_until_close();
    let took = t0.elapsed();
    assert!(closed, "idle connection still open after {took:?}");
    assert!(
        bytes.is_empty() || String::from_utf8_lossy(&bytes).starts_with("HTTP/1.1 408"),
        "unexpected bytes {:?}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(
        took >= Duration::from_millis(200),
        "closed too early: {took:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 8. Content-Encoding
// ---------------------------------------------------------------------------------------

#[test]
fn content_encoding_is_decoded_on_appends_only() {
    let (s, _d) = server();
    let p = "/v1/stream/gz";
    create(&s, p, "text/plain", b"x");
    // A gzip member of "hello", byte for byte as `gzip` writes it.
    let gz: &[u8] = &[
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9,
        0x07, 0x00, 0x86, 0xa6, 0x10, 0x36, 0x05, 0x00, 0x00, 0x00,
    ];
    for (enc, status) in [
        ("gzip", 204),
        ("GZIP", 204),
        ("gzip, identity", 204),
        ("br", 415),
        ("gzip, gzip", 415),
        // Not zlib data and not valid raw deflate either.
        ("deflate", 400),
    ] {
        let r = request(
            &s.addr,
            "POST",
            p,
            &[("Content-Type", "text/plain"), ("Content-Encoding", enc)],
            gz,
        )
        .unwrap();
        assert_eq!(r.status, status, "Content-Encoding {enc}: {r:?}");
    }
    assert_eq!(read_all(&s, p).body, b"xhellohellohello");
    // PUT with an encoded initial body is refused and creates nothing: only appends are
    // decoded.
    let r = request(
        &s.addr,
        "PUT",
        "/v1/stream/gz2",
        &[("Content-Type", "text/plain"), ("Content-Encoding", "gzip")],
        gz,
    )
    .unwrap();
    assert_eq!(r.status, 415, "{r:?}");
    assert_eq!(
        request(&s.addr, "HEAD", "/v1/stream/gz2", &[], b"")
            .unwrap()
            .status,
        404
    );

    // identity is fine.
    let r = request(
        &s.addr,
        "POST",
        p,
        &[
            ("Content-Type", "text/plain"),
            ("Content-Encoding", "identity"),
        ],
        b"y",
    )
    .unwrap();
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(read_all(&s, p).body, b"xhellohellohelloy");
}

// ---------------------------------------------------------------------------------------
// 9. Offsets beyond the tail, max_bytes, 8 MiB read cap
// ---------------------------------------------------------------------------------------

#[test]
fn offset_beyond_tail_is_400_with_tail() {
    let (s, _d) = server();
    let p = "/v1/stream/beyond";
    create(&s, p, "text/plain", b"hello");
    for q in [
        "offset=6",
        "offset=00000000000000000006",
        "offset=18446744073709551615",
        "offset=6&live=long-poll",
        "offset=1000&live=sse",
    ] {
        let r = request(&s.addr, "GET", &format!("{p}?{q}"), &[], b"").unwrap();
        assert_eq!(r.status, 400, "{q}: {r:?}");
        assert_eq!(
            r.header("stream-next-offset"),
            Some(offset_token(5).as_str()),
            "{q}: {r:?}"
        );
    }
    // Exactly the tail is fine: empty, up to date.
    let r = request(&s.addr, "GET", &format!("{p}?offset=5"), &[], b"").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    // Out of u64 range is a malformed offset, still 400.
    let r = request(
        &s.addr,
        "GET",
        &format!("{p}?offset=18446744073709551616"),
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 400);
}

#[test]
fn max_bytes_caps_a_read_and_partial_reads_are_not_up_to_date() {
    let (s, _d) = server();
    let p = "/v1/stream/maxb";
    create(&s, p, "application/octet-stream", b"0123456789");
    let r = request(
        &s.addr,
        "GET",
        &format!("{p}?offset=-1&max_bytes=4"),
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"0123");
    assert_eq!(r.next_offset(), Some(4));
    assert_eq!(r.header("stream-up-to-date"), None, "{r:?}");

    let mut got = r.body.clone();
    let mut off = 4;
    loop {
        let r = request(
            &s.addr,
            "GET",
            &format!("{p}?offset={}&max_bytes=4", offset_token(off)),
            &[],
            b"",
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body.len() <= 4);
        got.extend_from_slice(&r.body);
        off = r.next_offset().unwrap();
        if off == 10 {
            assert_eq!(r.header("stream-up-to-date"), Some("true"), "{r:?}");
            break;
        }
        assert_eq!(r.header("stream-up-to-date"), None, "{r:?}");
    }
    assert_eq!(got, b"0123456789");

    // max_bytes exactly the remaining size is up to date.
    let r = request(
        &s.addr,
        "GET",
        &format!("{p}?offset=6&max_bytes=4"),
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.body, b"6789");
    assert_eq!(r.header("stream-up-to-date"), Some("true"));

    for bad in ["0", "-1", "abc", "", "1.5"] {
        let r = request(
            &s.addr,
            "GET",
            &format!("{p}?offset=-1&max_bytes={bad}"),
            &[],
            b"",
        )
        .unwrap();
        assert_eq!(r.status, 400, "max_bytes={bad}: {r:?}");
    }
}

#[test]
fn large_stream_reads_are_capped_at_8_mib_and_reassemble_exactly() {
    let (s, _d) = server();
    let p = "/v1/stream/large";
    create(&s, p, "application/octet-stream", b"");
    // ~20 MiB in uneven appends, content depends on position.
    let total = 20 * (1 << 20) + 12345;
    let data: Vec<u8> = (0..total)
        .map(|i: usize| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut pos = 0;
    let mut c = s.client();
    for size in [3 << 20, 7 << 20, 1, (9 << 20) + 77] {
        let end = (pos + size).min(total);
        let r = c
            .request(
                "POST",
                p,
                &[("Content-Type", "application/octet-stream")],
                &data[pos..end],
            )
            .unwrap();
        assert_eq!(r.status, 204);
        pos = end;
    }
    let r = c
        .request(
            "POST",
            p,
            &[("Content-Type", "application/octet-stream")],
            &data[pos..],
        )
        .unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(r.next_offset(), Some(total as u64));

    for extra in ["", "&max_bytes=20000000"] {
        let mut got = Vec::with_capacity(total);
        let mut off = 0u64;
        let mut responses = 0;
        loop {
            let r = c
                .request(
                    "GET",
                    &format!("{p}?offset={}{extra}", offset_token(off)),
                    &[],
                    b"",
                )
                .unwrap();
            assert_eq!(r.status, 200);
            assert!(
                r.body.len() <= MAX_READ,
                "response of {} bytes exceeds 8 MiB",
                r.body.len()
            );
            responses += 1;
            got.extend_from_slice(&r.body);
            let next = r.next_offset().unwrap();
            assert_eq!(next, off + r.body.len() as u64);
            off = next;
            if r.header("stream-up-to-date") == Some("true") {
                break;
            }
            assert!(!r.body.is_empty(), "non-final empty read");
            assert!(responses < 100);
        }
        assert!(responses >= 3, "{responses} responses for 20 MiB");
        assert_eq!(got.len(), total);
        assert!(got == data, "reassembled data differs");
        assert_eq!(
            off,
            head_str(
                &c.request("HEAD", p, &[], b"").unwrap(),
                "stream-next-offset"
            )
            .parse::<u64>()
            .unwrap()
        );
    }
}
