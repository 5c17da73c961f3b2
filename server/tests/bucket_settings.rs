//! Bucket settings against the real binary: streams a bucket creates on their first append
//! (`auto_create`), and per-bucket rate limits (`rate_limit`, 429 with `Retry-After`).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{expect, req, request, temp_dir, Server};

const JSON: (&str, &str) = ("content-type", "application/json");
const NDJSON: (&str, &str) = ("content-type", "application/x-ndjson");
const TEXT: (&str, &str) = ("content-type", "text/plain");

fn start(storage: &str, data: &std::path::Path) -> Server {
    Server::spawn_standard(data, storage, 2, &[], None)
}

fn lines(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .map(str::to_string)
        .collect()
}

const DAILY: &str = r#"{"auto_create":{"content_type":"application/json","ttl_seconds":259200}}"#;

#[test]
fn a_first_append_creates_the_stream_as_the_bucket_says() {
    let dir = temp_dir("ursula-auto-create");
    let s = start("memory", &dir.path().join("data"));
    expect(&s, "PUT", "/otel", &[JSON], DAILY.as_bytes(), 201);
    let meta = expect(&s, "GET", "/otel", &[], b"", 200).body_str();
    assert!(
        meta.contains(r#""auto_create":{"content_type":"application/json","ttl_seconds":259200}"#),
        "{meta}"
    );

    // The first append creates the stream with the bucket's type and TTL and appends.
    let path = "/otel/logs-2026-12-06";
    let r = expect(&s, "POST", path, &[JSON], br#"[{"n":0},{"n":1}]"#, 204);
    assert_eq!(r.header("stream-record-start"), Some("0"));
    assert_eq!(r.header("stream-record-next"), Some("2"));
    let h = expect(&s, "HEAD", path, &[], b"", 200);
    assert_eq!(h.header("content-type"), Some("application/json"));
    assert_eq!(h.header("stream-ttl"), Some("259200"));
    assert_eq!(
        h.header("stream-next-offset"),
        r.header("stream-next-offset")
    );
    // Later appends go to it as to any stream; NDJSON too.
    expect(&s, "POST", path, &[NDJSON], b"{\"n\":2}\n{\"n\":3}\n", 204);
    let body = expect(&s, "GET", &format!("{path}?offset=-1"), &[], b"", 200).body;
    assert_eq!(
        lines(&body),
        [r#"{"n":0}"#, r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]
    );

    // An NDJSON batch and a producer's append may be the first write as well.
    let r = expect(
        &s,
        "POST",
        "/otel/ndjson",
        &[NDJSON],
        b"{\"a\":1}\n{\"a\":2}\n",
        204,
    );
    assert_eq!(r.header("stream-record-next"), Some("2"));
    let producer = [
        JSON,
        ("producer-id", "collector-1"),
        ("producer-epoch", "0"),
        ("producer-seq", "0"),
    ];
    expect(&s, "POST", "/otel/produced", &producer, br#"{"p":0}"#, 200);
    let again = expect(&s, "POST", "/otel/produced", &producer, br#"{"p":0}"#, 204);
    assert_eq!(again.header("producer-seq"), Some("0"));
    let body = expect(&s, "GET", "/otel/produced?offset=-1", &[], b"", 200).body;
    assert_eq!(lines(&body), [r#"{"p":0}"#]);
    // A producer's first append to a new stream must be its sequence 0.
    let late = [
        JSON,
        ("producer-id", "collector-2"),
        ("producer-epoch", "0"),
        ("producer-seq", "3"),
    ];
    expect(&s, "POST", "/otel/late", &late, br#"{"p":3}"#, 409);
    expect(&s, "HEAD", "/otel/late", &[], b"", 404);

    // A refused first append creates nothing: wrong type, bad JSON, a close alone.
    for (headers, body, status) in [
        (&[TEXT][..], &b"plain"[..], 409),
        (&[JSON][..], &b"{oops"[..], 400),
        (&[NDJSON][..], &b"{\"a\":1}\n{oops\n"[..], 400),
        (&[("stream-closed", "true")][..], &b""[..], 404),
    ] {
        let r = req(&s, "POST", "/otel/refused", headers, body);
        assert_eq!(r.status, status, "{headers:?}: {}", r.body_str());
        expect(&s, "HEAD", "/otel/refused", &[], b"", 404);
    }
    // The compat surface has no buckets, so nothing there is created on first write.
    expect(&s, "POST", "/v1/stream/otel/x", &[JSON], b"{}", 404);
}

#[test]
fn concurrent_first_appends_create_one_stream_with_every_record() {
    let dir = temp_dir("ursula-auto-create-race");
    let s = Arc::new(start("disk", &dir.path().join("data")));
    expect(&s, "PUT", "/race", &[JSON], DAILY.as_bytes(), 201);
    for round in 0..8 {
        let path = format!("/race/day-{round}");
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let writers: Vec<_> = (0..16)
            .map(|i| {
                let (s, path, barrier) = (s.clone(), path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let body = format!(r#"{{"writer":{i}}}"#);
                    barrier.wait();
                    request(&s.addr, "POST", &path, &[JSON], body.as_bytes())
                        .map(|r| (r.status, r.body_str()))
                })
            })
            .collect();
        for w in writers {
            let (status, body) = w.join().expect("writer").expect("request");
            assert_eq!(status, 204, "{path}: {body}");
        }
        let h = expect(&s, "HEAD", &path, &[], b"", 200);
        assert_eq!(h.header("stream-record-next"), Some("16"), "{path}");
        let body = expect(&s, "GET", &format!("{path}?offset=-1"), &[], b"", 200).body;
        let mut got = lines(&body);
        got.sort();
        let mut want: Vec<String> = (0..16).map(|i| format!(r#"{{"writer":{i}}}"#)).collect();
        want.sort();
        assert_eq!(got, want, "{path}");
    }
    let listing = expect(&s, "GET", "/race/streams", &[], b"", 200).body_str();
    assert!(listing.contains(r#""stream_count":8"#), "{listing}");
}

/// An append-batch body: one `[u32 BE len][bytes]` per frame.
fn frames(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("in memory");
    e.finish().expect("in memory")
}

#[test]
fn an_append_batch_creates_a_missing_stream_as_a_post_does() {
    let dir = temp_dir("ursula-auto-create-batch");
    let s = start("memory", &dir.path().join("data"));
    expect(&s, "PUT", "/otel", &[JSON], DAILY.as_bytes(), 201);

    // The first frame creates the stream with the bucket's type and TTL; the others
    // append to it, each acknowledged as its own append.
    let path = "/otel/traces-2026-12-06";
    let body = frames(&[br#"[{"n":0},{"n":1}]"#, br#"{"n":2}"#, br#"{"n":3}"#]);
    let r = expect(
        &s,
        "POST",
        &format!("{path}/append-batch"),
        &[JSON],
        &body,
        200,
    );
    assert_eq!(
        r.body_str(),
        concat!(
            r#"[{"status":204,"stream_next_offset":"00000000000000000016","stream_record_start":0,"stream_record_next":2},"#,
            r#"{"status":204,"stream_next_offset":"00000000000000000024","stream_record_start":2,"stream_record_next":3},"#,
            r#"{"status":204,"stream_next_offset":"00000000000000000032","stream_record_start":3,"stream_record_next":4}]"#
        )
    );
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000032"));
    let h = expect(&s, "HEAD", path, &[], b"", 200);
    assert_eq!(h.header("content-type"), Some("application/json"));
    assert_eq!(h.header("stream-ttl"), Some("259200"));
    assert_eq!(h.header("stream-record-next"), Some("4"));
    let body = expect(&s, "GET", &format!("{path}?offset=-1"), &[], b"", 200).body;
    assert_eq!(
        lines(&body),
        [r#"{"n":0}"#, r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]
    );
    // Later batches and POSTs go to it as to any stream.
    expect(&s, "POST", path, &[JSON], br#"{"n":4}"#, 204);
    let r = expect(
        &s,
        "POST",
        &format!("{path}/append-batch"),
        &[JSON],
        &frames(&[br#"{"n":5}"#]),
        200,
    );
    assert!(
        r.body_str()
            .contains(r#""stream_record_start":5,"stream_record_next":6"#),
        "{}",
        r.body_str()
    );

    // A gzip-compressed batch of NDJSON frames, as a shipper sends it, may be the first
    // write too.
    let nd = "/otel/logs-2026-12-06";
    let body = gzip(&frames(&[b"{\"a\":1}\n{\"a\":2}\n", b"{\"a\":3}\n"]));
    let r = expect(
        &s,
        "POST",
        &format!("{nd}/append-batch"),
        &[NDJSON, ("content-encoding", "gzip")],
        &body,
        200,
    );
    assert!(
        r.body_str()
            .contains(r#""stream_record_start":2,"stream_record_next":3"#),
        "{}",
        r.body_str()
    );
    let h = expect(&s, "HEAD", nd, &[], b"", 200);
    assert_eq!(h.header("content-type"), Some("application/json"));
    assert_eq!(h.header("stream-record-next"), Some("3"));

    // A refused batch creates nothing: a bad frame refuses the request, and frames of
    // another type are each refused as a POST of theirs would be.
    let missing = "/otel/refused";
    let r = req(
        &s,
        "POST",
        &format!("{missing}/append-batch"),
        &[JSON],
        &frames(&[br#"{"ok":1}"#, b"{oops"]),
    );
    assert_eq!(r.status, 400, "{}", r.body_str());
    expect(&s, "HEAD", missing, &[], b"", 404);
    let r = expect(
        &s,
        "POST",
        &format!("{missing}/append-batch"),
        &[TEXT],
        &frames(&[b"one", b"two"]),
        200,
    );
    let mismatch = r#"{"status":409,"error_code":"content_type_mismatch","error":"Content-Type differs from the stream's","stream_next_offset":"00000000000000000000"}"#;
    assert_eq!(r.body_str(), format!("[{mismatch},{mismatch}]"));
    expect(&s, "HEAD", missing, &[], b"", 404);
    // The bucket holds the two streams made, nothing more.
    let listing = expect(&s, "GET", "/otel/streams", &[], b"", 200).body_str();
    assert!(listing.contains(r#""stream_count":2"#), "{listing}");

    // Without auto_create, and on a bucket that does not exist, still 404.
    expect(&s, "PUT", "/plain", &[], b"", 201);
    let one = frames(&[b"{}"]);
    expect(
        &s,
        "POST",
        "/plain/missing/append-batch",
        &[JSON],
        &one,
        404,
    );
    expect(
        &s,
        "POST",
        "/nobucket/missing/append-batch",
        &[JSON],
        &one,
        404,
    );
}

#[test]
fn concurrent_first_batches_and_posts_create_one_stream() {
    let dir = temp_dir("ursula-auto-create-batch-race");
    let s = Arc::new(start("disk", &dir.path().join("data")));
    expect(&s, "PUT", "/race", &[JSON], DAILY.as_bytes(), 201);
    let rounds = 6;
    for round in 0..rounds {
        let path = format!("/race/day-{round}");
        let barrier = Arc::new(std::sync::Barrier::new(16));
        // Half the writers send a two-frame append-batch, half a POST.
        let writers: Vec<_> = (0..16)
            .map(|i| {
                let (s, path, barrier) = (s.clone(), path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let first = format!(r#"{{"writer":{i},"frame":0}}"#);
                    let (target, body, status) = if i % 2 == 0 {
                        let second = format!(r#"{{"writer":{i},"frame":1}}"#);
                        let body = frames(&[first.as_bytes(), second.as_bytes()]);
                        (format!("{path}/append-batch"), body, 200)
                    } else {
                        (path.clone(), first.into_bytes(), 204)
                    };
                    barrier.wait();
                    request(&s.addr, "POST", &target, &[JSON], &body)
                        .map(|r| (r.status == status, r.status, r.body_str()))
                })
            })
            .collect();
        for w in writers {
            let (ok, status, body) = w.join().expect("writer").expect("request");
            assert!(ok, "{path}: {status} {body}");
            assert!(!body.contains("\"status\":4"), "{path}: {body}");
        }
        let h = expect(&s, "HEAD", &path, &[], b"", 200);
        assert_eq!(h.header("stream-record-next"), Some("24"), "{path}");
        let body = expect(&s, "GET", &format!("{path}?offset=-1"), &[], b"", 200).body;
        let mut got = lines(&body);
        got.sort();
        let mut want: Vec<String> = (0..16)
            .flat_map(|i| {
                let frames = if i % 2 == 0 { 2 } else { 1 };
                (0..frames).map(move |f| format!(r#"{{"writer":{i},"frame":{f}}}"#))
            })
            .collect();
        want.sort();
        assert_eq!(got, want, "{path}");
    }
    let listing = expect(&s, "GET", "/race/streams", &[], b"", 200).body_str();
    assert!(
        listing.contains(&format!(r#""stream_count":{rounds}"#)),
        "{listing}"
    );
}

#[test]
fn a_bucket_without_auto_create_still_answers_404() {
    let dir = temp_dir("ursula-auto-create-off");
    let s = start("memory", &dir.path().join("data"));
    expect(&s, "PUT", "/plain", &[], b"", 201);
    expect(&s, "POST", "/plain/missing", &[JSON], b"{}", 404);
    // Limits alone do not create streams either.
    expect(
        &s,
        "PUT",
        "/limited",
        &[JSON],
        br#"{"rate_limit":{"appends_per_sec":100}}"#,
        201,
    );
    expect(&s, "POST", "/limited/missing", &[JSON], b"{}", 404);
    expect(&s, "POST", "/nobucket/missing", &[JSON], b"{}", 404);
}

#[test]
fn bad_settings_are_400_with_a_plain_reason_and_change_nothing() {
    let dir = temp_dir("ursula-bad-settings");
    let s = start("memory", &dir.path().join("data"));
    for (body, reason) in [
        (
            "{",
            "invalid_settings: bucket settings are not a JSON object",
        ),
        (r#"{"autocreate":{}}"#, "unknown field"),
        (r#"{"auto_create":{}}"#, "missing field"),
        (
            r#"{"auto_create":{"content_type":"no type"}}"#,
            "auto_create.content_type is not a valid content type",
        ),
        (
            r#"{"auto_create":{"content_type":"text/plain;charset=latin1"}}"#,
            "UTF-8 only",
        ),
        (
            r#"{"auto_create":{"content_type":"text/plain","ttl_seconds":0}}"#,
            "auto_create.ttl_seconds",
        ),
        (
            r#"{"auto_create":{"content_type":"text/plain","ttl_seconds":-5}}"#,
            "invalid_settings",
        ),
        (
            r#"{"rate_limit":{}}"#,
            "rate_limit must set appends_per_sec or bytes_per_sec",
        ),
        (
            r#"{"rate_limit":{"appends_per_sec":0}}"#,
            "rate_limit.appends_per_sec must be from 1",
        ),
        (
            r#"{"rate_limit":{"bytes_per_sec":10,"appends_burst":5}}"#,
            "rate_limit.appends_burst needs its appends_per_sec",
        ),
    ] {
        let r = expect(&s, "PUT", "/tenant", &[JSON], body.as_bytes(), 400);
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        let text = r.body_str();
        assert!(text.contains(reason), "{body}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        expect(&s, "GET", "/tenant", &[], b"", 404);
    }
    // A bad change leaves the settings as they were.
    expect(&s, "PUT", "/tenant", &[JSON], DAILY.as_bytes(), 201);
    let before = expect(&s, "GET", "/tenant", &[], b"", 200).body_str();
    let r = expect(
        &s,
        "PATCH",
        "/tenant",
        &[JSON],
        br#"{"rate_limit":{"appends_per_sec":0}}"#,
        400,
    );
    assert!(
        r.body_str().starts_with("invalid_settings: "),
        "{}",
        r.body_str()
    );
    assert_eq!(
        expect(&s, "GET", "/tenant", &[], b"", 200).body_str(),
        before
    );
    expect(&s, "PATCH", "/nobucket", &[JSON], b"{}", 404);
}

#[test]
fn settings_change_and_survive_a_restart() {
    let dir = temp_dir("ursula-settings-restart");
    let data = dir.path().join("data");
    let s = start("disk", &data);
    expect(&s, "PUT", "/later", &[], b"", 201);
    expect(&s, "POST", "/later/a", &[TEXT], b"x", 404);
    let r = expect(
        &s,
        "PATCH",
        "/later",
        &[JSON],
        br#"{"auto_create":{"content_type":"text/plain"}}"#,
        200,
    );
    assert!(
        r.body_str()
            .contains(r#""auto_create":{"content_type":"text/plain"}"#),
        "{}",
        r.body_str()
    );
    // Every core's copy changed: streams on both cores are created.
    for name in ["a", "b", "c", "d", "e", "f"] {
        expect(&s, "POST", &format!("/later/{name}"), &[TEXT], b"x", 204);
    }
    s.sigterm(Duration::from_secs(20)).expect("stopped");
    let s = start("disk", &data);
    expect(&s, "POST", "/later/g", &[TEXT], b"x", 204);
    // `null` removes a part.
    expect(
        &s,
        "PATCH",
        "/later",
        &[JSON],
        br#"{"auto_create":null}"#,
        200,
    );
    expect(&s, "POST", "/later/h", &[TEXT], b"x", 404);
    let meta = expect(&s, "GET", "/later", &[], b"", 200).body_str();
    assert_eq!(meta, r#"{"bucket_id":"later","streams":7}"#);
}

fn metrics(s: &Server) -> String {
    expect(s, "GET", "/__ursula/metrics", &[], b"", 200).body_str()
}

fn throttled(metrics: &str, bucket: &str, limit: &str) -> Option<u64> {
    let key = format!("ursula_bucket_throttled_total{{bucket=\"{bucket}\",limit=\"{limit}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_burst_over_the_limit_is_429_for_that_bucket_only() {
    let dir = temp_dir("ursula-rate-limit");
    let s = start("memory", &dir.path().join("data"));
    expect(
        &s,
        "PUT",
        "/noisy",
        &[JSON],
        br#"{"rate_limit":{"appends_per_sec":5,"appends_burst":10}}"#,
        201,
    );
    expect(&s, "PUT", "/quiet", &[], b"", 201);
    // Streams on both cores: the limit is the bucket's, whichever core owns a stream.
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    for b in ["noisy", "quiet"] {
        for n in names {
            expect(&s, "PUT", &format!("/{b}/{n}"), &[TEXT], b"", 201);
        }
    }
    let started = Instant::now();
    let (mut ok, mut limited) = (0u64, 0u64);
    for i in 0..60 {
        let name = names[i % names.len()];
        let r = req(&s, "POST", &format!("/noisy/{name}"), &[TEXT], b"x");
        match r.status {
            204 => ok += 1,
            429 => {
                limited += 1;
                assert_eq!(r.header("retry-after"), Some("1"));
                assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
                assert_eq!(
                    r.body_str(),
                    "rate_limited: the bucket's appends per second limit is reached; retry later\n"
                );
            }
            other => panic!("append {i}: {other} {}", r.body_str()),
        }
        // The other bucket is not held back by it.
        expect(&s, "POST", &format!("/quiet/{name}"), &[TEXT], b"x", 204);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let most = 10 + (5.0 * elapsed).ceil() as u64;
    assert!(
        ok >= 10 && ok <= most,
        "{ok} accepted in {elapsed:.2} s, at most {most}"
    );
    assert_eq!(ok + limited, 60);
    // The refused appends appended nothing.
    let mut records = 0;
    for n in names {
        let h = expect(&s, "HEAD", &format!("/noisy/{n}"), &[], b"", 200);
        records += h.next_offset().expect("tail");
    }
    assert_eq!(records, ok);
    let m = metrics(&s);
    assert_eq!(throttled(&m, "noisy", "appends"), Some(limited), "{m}");
    assert_eq!(throttled(&m, "quiet", "appends"), None);

    // After a pause the bucket takes appends again.
    std::thread::sleep(Duration::from_millis(1200));
    expect(&s, "POST", "/noisy/a", &[TEXT], b"x", 204);
}

#[test]
fn the_bytes_limit_counts_appended_bytes_and_batches() {
    let dir = temp_dir("ursula-rate-limit-bytes");
    let s = start("memory", &dir.path().join("data"));
    expect(
        &s,
        "PUT",
        "/bulk",
        &[JSON],
        br#"{"rate_limit":{"bytes_per_sec":1000,"bytes_burst":3000}}"#,
        201,
    );
    expect(&s, "PUT", "/bulk/s", &[TEXT], b"", 201);
    let kb = vec![b'x'; 1000];
    for _ in 0..3 {
        expect(&s, "POST", "/bulk/s", &[TEXT], &kb, 204);
    }
    let r = expect(&s, "POST", "/bulk/s", &[TEXT], &kb, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        r.body_str().contains("bytes per second"),
        "{}",
        r.body_str()
    );
    // An append-batch counts its frames' bytes.
    std::thread::sleep(Duration::from_millis(3100));
    let mut batch = Vec::new();
    for _ in 0..4 {
        batch.extend_from_slice(&(kb.len() as u32).to_be_bytes());
        batch.extend_from_slice(&kb);
    }
    expect(&s, "POST", "/bulk/s/append-batch", &[TEXT], &batch, 200);
    expect(&s, "POST", "/bulk/s/append-batch", &[TEXT], &batch, 429);
    let h = expect(&s, "HEAD", "/bulk/s", &[], b"", 200);
    assert_eq!(h.next_offset(), Some(7000));
    // Raising the limit takes effect at once.
    expect(
        &s,
        "PATCH",
        "/bulk",
        &[JSON],
        br#"{"rate_limit":{"bytes_per_sec":100000000}}"#,
        200,
    );
    expect(&s, "POST", "/bulk/s/append-batch", &[TEXT], &batch, 200);
    let m = metrics(&s);
    assert_eq!(throttled(&m, "bulk", "bytes"), Some(2), "{m}");
}
