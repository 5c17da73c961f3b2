//! Many SSE subscribers on one stream, on both cores: every subscriber sees every append
//! exactly once and in order, whether it followed live (through its core's feed) or joined
//! late and caught up; closing or deleting the stream ends every response.

mod support;

use std::thread;
use std::time::Duration;

use support::*;

const JSON: (&str, &str) = ("content-type", "application/json");
const TEXT: (&str, &str) = ("content-type", "text/plain");

/// One subscriber: the whole SSE response of `GET path` (ends when the server ends it).
fn subscribe(addr: &str, path: &str) -> thread::JoinHandle<String> {
    let addr = addr.to_string();
    let path = path.to_string();
    thread::spawn(move || {
        let mut raw = Raw::connect(&addr);
        raw.set_read_timeout(Duration::from_secs(30));
        raw.send(format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
            .expect("send");
        let r = raw.response().expect("whole SSE response");
        assert_eq!(r.status, 200, "{path}: {r:?}");
        r.body_str()
    })
}

/// The SSE events of `body` as (event type, data lines joined by LF).
fn events(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| {
            let mut kind = None;
            let mut data = Vec::new();
            for line in e.lines() {
                if let Some(k) = line.strip_prefix("event: ") {
                    kind = Some(k.to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d);
                }
            }
            kind.map(|k| (k, data.join("\n")))
        })
        .collect()
}

/// The `n` of every `{"n":…}` message in the data events, in order.
fn json_numbers(body: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for (kind, data) in events(body) {
        if kind != "data" {
            continue;
        }
        assert!(data.starts_with('[') && data.ends_with(']'), "{data}");
        for m in data.split("\"n\":").skip(1) {
            let digits: String = m.chars().take_while(char::is_ascii_digit).collect();
            out.push(digits.parse().expect("number"));
        }
    }
    out
}

fn last_control(body: &str) -> String {
    events(body)
        .into_iter()
        .rfind(|(k, _)| k == "control")
        .map(|(_, d)| d)
        .unwrap_or_default()
}

#[test]
fn every_subscriber_sees_every_append_once_in_order() {
    let dir = temp_dir("ursula-sse-fanout");
    let s = Server::spawn_standard(&dir.path().join("data"), "disk", 2, &[], None);
    expect(&s, "PUT", "/v1/stream/fan", &[JSON], b"", 201);
    expect(&s, "PUT", "/v1/stream/fan-text", &[TEXT], b"", 201);

    // Connections spread over both cores (SO_REUSEPORT), so both feed kinds run: the
    // owner core's and the other core's.
    let live_json: Vec<_> = (0..24)
        .map(|_| subscribe(&s.addr, "/v1/stream/fan?offset=-1&live=sse"))
        .collect();
    let live_text: Vec<_> = (0..8)
        .map(|_| subscribe(&s.addr, "/v1/stream/fan-text?offset=-1&live=sse"))
        .collect();
    thread::sleep(Duration::from_millis(300));

    let (mut rng, seed) = Rng::from_env_or_time();
    let mut late = Vec::new();
    let mut n = 0u64;
    let mut text = String::new();
    while n < 300 {
        // Mostly single messages, sometimes a few in one append.
        let k = if rng.chance(0.2) { rng.range(2, 5) } else { 1 };
        let body: Vec<String> = (n..n + k).map(|i| format!("{{\"n\":{i}}}")).collect();
        expect(
            &s,
            "POST",
            "/v1/stream/fan",
            &[JSON],
            format!("[{}]", body.join(",")).as_bytes(),
            204,
        );
        let line = format!("line {n}\n");
        expect(
            &s,
            "POST",
            "/v1/stream/fan-text",
            &[TEXT],
            line.as_bytes(),
            204,
        );
        text.push_str(&line);
        n += k;
        if late.len() < 4 && n > 100 + 40 * late.len() as u64 {
            // Joins after data exists: catches up first, then follows live.
            late.push(subscribe(&s.addr, "/v1/stream/fan?offset=-1&live=sse"));
        }
        if rng.chance(0.1) {
            thread::sleep(Duration::from_millis(rng.range(1, 20)));
        }
    }
    for p in ["/v1/stream/fan", "/v1/stream/fan-text"] {
        expect(&s, "POST", p, &[("stream-closed", "true")], b"", 204);
    }

    let want: Vec<u64> = (0..n).collect();
    for (i, h) in live_json.into_iter().chain(late).enumerate() {
        let body = h.join().expect("subscriber");
        assert_eq!(
            json_numbers(&body),
            want,
            "json subscriber {i} (seed {seed})"
        );
        assert!(
            last_control(&body).contains("\"streamClosed\":true"),
            "json subscriber {i} ends closed: {}",
            last_control(&body)
        );
    }
    for (i, h) in live_text.into_iter().enumerate() {
        let body = h.join().expect("subscriber");
        let got: String = events(&body)
            .into_iter()
            .filter(|(k, _)| k == "data")
            .map(|(_, d)| d)
            .collect();
        // Each data event holds whole lines, so its data lines end in an empty one.
        assert_eq!(got, text, "text subscriber {i} (seed {seed})");
    }
}

#[test]
fn deleting_a_stream_ends_its_live_subscribers() {
    let dir = temp_dir("ursula-sse-fanout-delete");
    let s = Server::spawn_standard(&dir.path().join("data"), "disk", 2, &[], None);
    expect(&s, "PUT", "/v1/stream/gone", &[JSON], b"[{\"n\":0}]", 201);
    let subs: Vec<_> = (0..8)
        .map(|_| subscribe(&s.addr, "/v1/stream/gone?offset=-1&live=sse"))
        .collect();
    thread::sleep(Duration::from_millis(300));
    expect(&s, "POST", "/v1/stream/gone", &[JSON], b"[{\"n\":1}]", 204);
    thread::sleep(Duration::from_millis(300));
    expect(&s, "DELETE", "/v1/stream/gone", &[], b"", 204);
    for (i, h) in subs.into_iter().enumerate() {
        // Returns only because the server ended the response (the read timeout is 30 s,
        // the keep-alive interval 15 s).
        let body = h.join().expect("subscriber");
        assert_eq!(json_numbers(&body), vec![0, 1], "subscriber {i}");
    }
    // A stream recreated under the same name gets fresh subscribers and fresh data.
    expect(&s, "PUT", "/v1/stream/gone", &[JSON], b"[{\"n\":7}]", 201);
    let h = subscribe(&s.addr, "/v1/stream/gone?offset=-1&live=sse");
    thread::sleep(Duration::from_millis(200));
    expect(
        &s,
        "POST",
        "/v1/stream/gone",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    assert_eq!(json_numbers(&h.join().expect("subscriber")), vec![7]);
}
