//! SSE responses count in `ursula_read_bytes_total` like any other read.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{request, temp_dir, Server};

/// Sum of `ursula_read_bytes_total` over the cores, and the size of the scrape's own body
/// (which the next scrape will have counted).
fn read_bytes(addr: &str) -> (u64, u64) {
    let r = request(addr, "GET", "/__ursula/metrics", &[], b"").expect("metrics");
    assert_eq!(r.status, 200);
    let text = r.body_str();
    let sum = text
        .lines()
        .filter(|l| l.starts_with("ursula_read_bytes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    (sum, r.body.len() as u64)
}

/// Decode complete chunks of a chunked body; returns the payload so far.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .expect("chunk size line");
        let start = eol + 2;
        if body.len() < start + size + 2 {
            break;
        }
        out.extend_from_slice(&body[start..start + size]);
        body = &body[start + size + 2..];
    }
    out
}

#[test]
fn sse_events_count_as_read_bytes() {
    let dir = temp_dir("ursula-sse-metrics");
    let server = Server::spawn_standard(dir.path(), "memory", 2, &[], None);
    let addr = server.addr.clone();
    let ct = [("content-type", "text/plain")];
    assert_eq!(
        request(&addr, "PUT", "/v1/stream/m", &ct, b"")
            .expect("put")
            .status,
        201
    );
    assert_eq!(
        request(&addr, "POST", "/v1/stream/m", &ct, b"hello sse")
            .expect("post")
            .status,
        204
    );

    let (before, scrape_len) = read_bytes(&addr);

    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET /v1/stream/m?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("send");
    let mut raw = Vec::new();
    // Read until the body holds `controls` complete control events; returns the body.
    let mut read_until = |controls: usize| loop {
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).expect("read sse");
        assert!(n > 0, "sse ended early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        let Some(head_end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let payload = dechunk(&raw[head_end + 4..]);
        let text = String::from_utf8_lossy(&payload);
        if text.matches("event: control").count() >= controls && text.ends_with("\n\n") {
            break payload;
        }
    };
    // The catch-up events, then a live one for an append made while the response is open
    // (the two may be produced by different paths of the SSE loop).
    let first = read_until(1);
    assert!(String::from_utf8_lossy(&first).contains("data:hello sse\n"));
    assert_eq!(
        request(&addr, "POST", "/v1/stream/m", &ct, b" and more")
            .expect("post")
            .status,
        204
    );
    let payload = read_until(2);
    let text = String::from_utf8_lossy(&payload).to_string();
    assert!(text.contains("data: and more\n"), "{text}");

    // Counted as the events go out, while the response is still open. Every scrape's own
    // body counts as a read too, so the expected total grows by each scrape made.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut scrapes = scrape_len;
    loop {
        let (after, len) = read_bytes(&addr);
        let expected = before + scrapes + payload.len() as u64;
        if after == expected {
            break;
        }
        assert!(
            after < expected && Instant::now() < deadline,
            "read bytes {after}, expected {expected} (SSE payload {})",
            payload.len()
        );
        scrapes += len;
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(s);
}

#[test]
fn every_core_reports_its_event_loop_lag() {
    let dir = temp_dir("ursula-loop-lag");
    let server = Server::spawn_standard(dir.path(), "memory", 2, &[], None);
    // The heartbeat is due every 10 ms; give each core a few.
    std::thread::sleep(Duration::from_millis(300));
    let r = request(&server.addr, "GET", "/__ursula/metrics", &[], b"").expect("metrics");
    assert_eq!(r.status, 200);
    let text = r.body_str();
    // The value of `family{core="N"}` in the scrape.
    let per_core = |family: &str, core: usize| -> f64 {
        let prefix = format!("{family}{{core=\"{core}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or_else(|| panic!("no {family} for core {core} in:\n{text}"))
    };
    for core in 0..2 {
        let count = per_core("ursula_core_loop_lag_seconds_count", core);
        assert!(count >= 5.0, "core {core}: {count} heartbeats in 300 ms");
        let max = per_core("ursula_core_loop_lag_max_seconds", core);
        assert!((0.0..60.0).contains(&max), "core {core}: max lag {max} s");
    }
}
