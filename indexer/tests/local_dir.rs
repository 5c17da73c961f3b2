//! End-to-end against the real `ursula` server and the real `ursula-indexer` on the
//! local-directory store: registration, out-of-order events, windows, pagination with a
//! pinned `through`, locators resolved byte-exact, records, skips, OTLP extractors,
//! freshness of the in-memory tail.

mod support;

use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::*;

const T0: i64 = 1_784_370_600_000; // 2026-07-18T10:30:00Z

fn iso(ms: i64) -> String {
    // Good enough for the test window: seconds + millis after T0 within one hour.
    let d = ms - T0;
    format!(
        "2026-07-18T10:{:02}:{:02}.{:03}Z",
        30 + d / 60_000,
        (d / 1000) % 60,
        d % 1000
    )
}

/// A permutation of 0..n so captured_at arrives out of order.
fn perm(i: i64, n: i64) -> i64 {
    (i * 37) % n
}

/// Append one event at `t` and time how long until a query for `[t, t + 1)` finds it.
fn append_until_visible(ua: &str, stream: &str, ix: &str, id: &str, t: i64) -> Duration {
    let start = Instant::now();
    let body = format!(r#"{{"captured_at":{t}}}"#);
    expect(ua, "POST", stream, &[JSON], body.as_bytes(), 204);
    wait_for(Duration::from_secs(5), "the appended event", || {
        let v = events(ix, id, &format!("from={t}&until={}", t + 1));
        (v["entries"].as_array().map(|a| a.len()) == Some(1)).then_some(())
    });
    start.elapsed()
}

#[test]
fn register_query_paginate_resolve() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let store = dir.path().join("store");
    let ix = indexer(dir.path(), "a", Store::Dir(&store), &[]);
    let (ua, ia) = (u.addr.clone(), ix.addr.clone());

    expect(&ua, "PUT", "/demo", &[], b"", 201);
    expect(&ua, "PUT", "/demo/ev", &[JSON], b"", 201);
    let stream_url = format!("{}/demo/ev", u.url());

    // Registration and its errors.
    let r = register(&ia, "ev", &stream_url, "");
    assert_eq!(r.status, 201, "{}", r.text());
    let reg = r.json();
    assert_eq!(
        reg["indexed_from_offset"].as_str(),
        Some("00000000000000000000")
    );
    assert_eq!(reg["record_coordinates"].as_bool(), Some(true));
    assert_eq!(
        register(&ia, "ev", &stream_url, "").status,
        201,
        "idempotent"
    );
    assert_eq!(
        register(&ia, "ev", &stream_url, r#""timestamp_field":"other""#).status,
        409
    );
    assert_eq!(
        register(&ia, "ev2", &stream_url, "").status,
        409,
        "one index per stream"
    );
    assert_eq!(register(&ia, "Bad!", &stream_url, "").status, 400);
    assert_eq!(register(&ia, "x", &stream_url, r#""bogus":1"#).status, 400);
    assert_eq!(
        register(&ia, "x", &stream_url, r#""extract":{"time":[]}"#).status,
        400
    );
    assert_eq!(
        register(
            &ia,
            "x",
            &stream_url,
            r#""extract":{"time":["/a"]},"timestamp_field":"a""#
        )
        .status,
        400
    );
    assert_eq!(
        register(&ia, "x", &format!("{}/demo/missing", u.url()), "").status,
        422
    );
    let list = expect(&ia, "GET", "/v1/indexes", &[], b"", 200).json();
    assert_eq!(list.as_array().map(|a| a.len()), Some(1));
    expect(&ia, "GET", "/v1/indexes/nope/status", &[], b"", 404);
    expect(&ia, "GET", "/livez", &[], b"", 204);
    expect(&ia, "GET", "/readyz", &[], b"", 204);

    // 200 out-of-order events in batches, plus bad ones.
    let n = 200i64;
    for batch in 0..10 {
        let evs: Vec<String> = (batch * 20..batch * 20 + 20)
            .map(|i| {
                format!(
                    r#"{{"captured_at":"{}","i":{i}}}"#,
                    iso(T0 + perm(i, n) * 10)
                )
            })
            .collect();
        expect(
            &ua,
            "POST",
            "/demo/ev",
            &[JSON],
            format!("[{}]", evs.join(",")).as_bytes(),
            204,
        );
    }
    expect(
        &ua,
        "POST",
        "/demo/ev",
        &[JSON],
        br#"[{"type":"no time"},{"captured_at":"soon"},{"captured_at":null}]"#,
        204,
    );

    // Queryable from the in-memory tail quickly, then durable.
    let tail = request(&ua, "HEAD", "/demo/ev", &[], b"")
        .header("stream-next-offset")
        .map(str::to_string);
    wait_for(Duration::from_secs(10), "indexed through tail", || {
        (status(&ia, "ev")["coverage"]["indexed"].as_str() == tail.as_deref()).then_some(())
    });
    let s = status(&ia, "ev");
    assert_eq!(s["skipped"]["missing"].as_u64(), Some(2));
    assert_eq!(s["skipped"]["invalid"].as_u64(), Some(1));
    assert_eq!(s["status"]["state"].as_str(), Some("ready"));
    wait_durable(&ia, "ev", &ua, "/demo/ev");

    let all = all_entries(&ia, "ev", T0, T0 + 10_000, 1000, "");
    assert_eq!(all.len(), n as usize);
    let keys: Vec<(i64, String)> = all
        .iter()
        .map(|e| {
            (
                e["t_ms"].as_i64().unwrap_or(0),
                e["offset"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "ordered by (t_ms, offset)");

    // Window [T0+500, T0+1000): events with perm*10 in that range: 50 of them.
    let w = all_entries(&ia, "ev", T0 + 500, T0 + 1000, 1000, "");
    assert_eq!(w.len(), 50);
    let rfc = expect(
        &ia,
        "GET",
        "/v1/indexes/ev/events?from=2026-07-18T10:30:00.500Z&until=2026-07-18T10:30:01Z",
        &[],
        b"",
        200,
    );
    assert_eq!(rfc.json()["entries"].as_array().map(|a| a.len()), Some(50));
    assert!(rfc.header("durable-offset").is_some());
    expect(
        &ia,
        "GET",
        "/v1/indexes/ev/events?from=5&until=1",
        &[],
        b"",
        400,
    );
    expect(
        &ia,
        "GET",
        "/v1/indexes/ev/events?from=1&until=5&through=99999999999",
        &[],
        b"",
        400,
    );

    // Pagination pinned by `through` while new events land inside the window.
    let first = events(
        &ia,
        "ev",
        &format!("from={T0}&until={}&limit=7", T0 + 10_000),
    );
    let through = first["coverage"]["through"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_default();
    let mut paged: Vec<sonic_rs::Value> = first["entries"]
        .as_array()
        .map(|a| a.iter().cloned().collect())
        .unwrap_or_default();
    let mut next = first["next"].as_str().map(str::to_string);
    let mut extra = 0;
    while let Some(a) = next {
        if extra < 5 {
            extra += 1;
            let e = format!(r#"{{"captured_at":"{}","late":true}}"#, iso(T0 + 5));
            expect(&ua, "POST", "/demo/ev", &[JSON], e.as_bytes(), 204);
        }
        let p = events(
            &ia,
            "ev",
            &format!(
                "from={T0}&until={}&limit=7&after={a}&through={through}",
                T0 + 10_000
            ),
        );
        assert_eq!(p["coverage"]["through"].as_str(), Some(through.as_str()));
        paged.extend(
            p["entries"]
                .as_array()
                .map(|a| a.iter().cloned().collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        next = p["next"].as_str().map(str::to_string);
    }
    assert_eq!(
        paged.len(),
        n as usize,
        "a pinned paginated answer ignores late events"
    );
    let paged_keys: Vec<(i64, String)> = paged
        .iter()
        .map(|e| {
            (
                e["t_ms"].as_i64().unwrap_or(0),
                e["offset"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(paged_keys, keys);

    // Locators resolve byte-exact through the server; records count from 0.
    for e in all.iter().step_by(17) {
        let off = e["offset"].as_str().unwrap_or("");
        let len = e["len"].as_u64().unwrap_or(0);
        let bytes = resolve(&ua, "/demo/ev", off, len);
        assert_eq!(bytes.len() as u64, len);
        assert_eq!(bytes.last(), Some(&b'\n'));
        let v: sonic_rs::Value = sonic_rs::from_slice(&bytes[..bytes.len() - 1]).expect("json");
        let t = v["captured_at"].as_str().unwrap_or("");
        assert_eq!(t, iso(e["t_ms"].as_i64().unwrap_or(0)));
        let i = v["i"].as_u64().unwrap_or(u64::MAX);
        assert_eq!(e["record"].as_u64(), Some(i), "record ordinal");
        let rec = expect(
            &ua,
            "GET",
            &format!("/demo/ev?record={i}&max_records=1"),
            &[],
            b"",
            200,
        );
        assert_eq!(rec.body, bytes, "record read equals the offset locator");
    }
    let q = events(
        &ia,
        "ev",
        &format!("from={T0}&until={}&through_record=10", T0 + 10_000),
    );
    assert_eq!(q["entries"].as_array().map(|a| a.len()), Some(10));
    assert!(q["indexed_through_record"].as_u64().is_some());
    assert!(q["durable_through_record"].as_u64().is_some());

    // Freshness: an appended event is queryable well within a second.
    let mut lags = Vec::new();
    for k in 0..20 {
        lags.push(append_until_visible(
            &ua,
            "/demo/ev",
            &ia,
            "ev",
            T0 + 3_600_000 + k,
        ));
    }
    lags.sort();
    eprintln!(
        "freshness lag: p50 {:?} max {:?}",
        lags[lags.len() / 2],
        lags[lags.len() - 1]
    );
    assert!(lags[lags.len() / 2] < Duration::from_secs(1));

    // Metrics: Prometheus text with this index's counters, at the tail, and the store's
    // request counts.
    let metric = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    wait_for(Duration::from_secs(10), "metrics", || {
        let text = expect(&ia, "GET", "/metrics", &[], b"", 200).text();
        let events = metric(&text, "ursula_indexer_events_indexed_total{index=\"ev\"}")?;
        let lag = metric(&text, "ursula_indexer_ingest_lag_bytes{index=\"ev\"}")?;
        let puts = metric(&text, "ursula_indexer_store_requests_total{op=\"put\"}")?;
        let skipped = text.contains("ursula_indexer_events_skipped_total{index=\"ev\",reason=");
        let queries = metric(&text, "ursula_indexer_query_seconds_count")?;
        let commits = metric(&text, "ursula_indexer_commits_total{index=\"ev\"}")?;
        (events >= 200.0 && lag == 0.0 && puts > 0.0 && skipped && queries > 10.0 && commits > 0.0)
            .then_some(())
    });

    // Delete.
    expect(&ia, "DELETE", "/v1/indexes/ev", &[], b"", 204);
    expect(&ia, "DELETE", "/v1/indexes/ev", &[], b"", 404);
    expect(&ia, "GET", "/v1/indexes/ev/status", &[], b"", 404);
}

#[test]
fn otlp_ndjson_and_compat_sources() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let store = dir.path().join("store");
    let ix = indexer(dir.path(), "a", Store::Dir(&store), &[]);
    let (ua, ia) = (u.addr.clone(), ix.addr.clone());
    expect(&ua, "PUT", "/otel", &[], b"", 201);

    // Traces: each export request is one message spanning its spans.
    expect(&ua, "PUT", "/otel/traces", &[JSON], b"", 201);
    let r = register(
        &ia,
        "traces",
        &format!("{}/otel/traces", u.url()),
        r#""extract":{"each":"/resourceSpans/*/scopeSpans/*/spans/*","time":["/startTimeUnixNano"],"end":["/endTimeUnixNano"],"unit":"ns"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let span = |s: i64, e: i64| {
        format!(
            r#"{{"name":"x","startTimeUnixNano":"{}","endTimeUnixNano":"{}"}}"#,
            s * 1_000_000,
            e * 1_000_000
        )
    };
    let batch = format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{},{}]}}]}},{{"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
        span(T0 + 100, T0 + 300),
        span(T0 + 50, T0 + 200),
        span(T0 + 1000, T0 + 2000)
    );
    expect(&ua, "POST", "/otel/traces", &[JSON], batch.as_bytes(), 204);
    wait_durable(&ia, "traces", &ua, "/otel/traces");
    let q = |path: &str| expect(&ia, "GET", path, &[], b"", 200).json();
    let v = q(&format!(
        "/v1/indexes/traces/events?from={}&until={}",
        T0,
        T0 + 10_000
    ));
    assert_eq!(v["entries"][0]["t_ms"].as_i64(), Some(T0 + 50));
    assert_eq!(v["entries"][0]["t_end_ms"].as_i64(), Some(T0 + 2000));
    // A window inside the batch's span: only match=overlap finds it.
    let w = format!("from={}&until={}", T0 + 1500, T0 + 1600);
    assert_eq!(
        q(&format!("/v1/indexes/traces/events?{w}"))["entries"]
            .as_array()
            .map(|a| a.len()),
        Some(0)
    );
    assert_eq!(
        q(&format!("/v1/indexes/traces/events?{w}&match=overlap"))["entries"]
            .as_array()
            .map(|a| a.len()),
        Some(1)
    );

    // Logs: timeUnixNano 0 falls back to observedTimeUnixNano.
    expect(&ua, "PUT", "/otel/logs", &[JSON], b"", 201);
    let r = register(
        &ia,
        "logs",
        &format!("{}/otel/logs", u.url()),
        r#""extract":{"each":"/resourceLogs/*/scopeLogs/*/logRecords/*","time":["/timeUnixNano","/observedTimeUnixNano"],"unit":"ns"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let logs = format!(
        r#"{{"resourceLogs":[{{"scopeLogs":[{{"logRecords":[{{"timeUnixNano":"0","observedTimeUnixNano":"{}"}}]}}]}}]}}"#,
        (T0 + 7) * 1_000_000
    );
    expect(&ua, "POST", "/otel/logs", &[JSON], logs.as_bytes(), 204);
    wait_durable(&ia, "logs", &ua, "/otel/logs");
    let v = q(&format!(
        "/v1/indexes/logs/events?from={}&until={}",
        T0,
        T0 + 10
    ));
    assert_eq!(v["entries"][0]["t_ms"].as_i64(), Some(T0 + 7));

    // NDJSON stream on the compat surface, with an unparseable line and a partial line.
    expect(&ua, "PUT", "/v1/stream/nd", &[NDJSON], b"", 201);
    let r = register(
        &ia,
        "nd",
        &format!("{}/v1/stream/nd", u.url()),
        r#""extract":{"time":["/ts"],"unit":"s"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    expect(
        &ua,
        "POST",
        "/v1/stream/nd",
        &[NDJSON],
        b"not json\n{\"ts\":1784370600.25}\n{\"ts\":",
        204,
    );
    std::thread::sleep(Duration::from_millis(300));
    expect(
        &ua,
        "POST",
        "/v1/stream/nd",
        &[NDJSON],
        b"1784370601}\n",
        204,
    );
    wait_durable(&ia, "nd", &ua, "/v1/stream/nd");
    let s = status(&ia, "nd");
    assert_eq!(s["skipped"]["unparseable"].as_u64(), Some(1));
    let v = q(&format!(
        "/v1/indexes/nd/events?from={}&until={}",
        T0,
        T0 + 10_000
    ));
    let entries = v["entries"].as_array().map(|a| a.len());
    assert_eq!(entries, Some(2), "{v:?}");
    assert_eq!(v["entries"][0]["t_ms"].as_i64(), Some(T0 + 250));
    let e1 = &v["entries"][1];
    let bytes = resolve(
        &ua,
        "/v1/stream/nd",
        e1["offset"].as_str().unwrap_or(""),
        e1["len"].as_u64().unwrap_or(0),
    );
    assert_eq!(bytes, b"{\"ts\":1784370601}\n");

    // JSON stream on the compat surface (reads render arrays).
    expect(&ua, "PUT", "/v1/stream/cj", &[JSON], b"", 201);
    assert_eq!(
        register(&ia, "cj", &format!("{}/v1/stream/cj", u.url()), "").status,
        201
    );
    expect(
        &ua,
        "POST",
        "/v1/stream/cj",
        &[JSON],
        format!(
            r#"[{{"captured_at":{}}},{{"captured_at":{}}}]"#,
            T0 + 2,
            T0 + 1
        )
        .as_bytes(),
        204,
    );
    wait_durable(&ia, "cj", &ua, "/v1/stream/cj");
    let v = q(&format!(
        "/v1/indexes/cj/events?from={}&until={}",
        T0,
        T0 + 10
    ));
    assert_eq!(v["entries"][0]["t_ms"].as_i64(), Some(T0 + 1));
    assert_eq!(
        v["entries"][1]["offset"].as_str(),
        Some("00000000000000000000")
    );
}

/// Freshness under steady load: a writer appends 500 events/s while probe events are
/// timed from append to first visibility in a query. Prints p50/p99; asserts p99 < 1 s.
/// `cargo test --release -p ursula-indexer --test local_dir -- --ignored --nocapture`
#[test]
#[ignore]
fn freshness_under_load() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let store = dir.path().join("store");
    let ix = indexer(
        dir.path(),
        "a",
        Store::Dir(&store),
        &["--commit-interval-ms", "2000"],
    );
    let (ua, ia) = (u.addr.clone(), ix.addr.clone());
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    expect(&ua, "PUT", "/demo/f", &[JSON], b"", 201);
    assert_eq!(
        register(&ia, "f", &format!("{}/demo/f", u.url()), "").status,
        201
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (ua, stop) = (ua.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let evs: Vec<String> = (0..10)
                    .map(|k| format!(r#"{{"captured_at":{}}}"#, T0 + (i * 10 + k) % 3_600_000))
                    .collect();
                expect(
                    &ua,
                    "POST",
                    "/demo/f",
                    &[JSON],
                    format!("[{}]", evs.join(",")).as_bytes(),
                    204,
                );
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut lags = Vec::new();
    for k in 0..200 {
        lags.push(append_until_visible(
            &ua,
            "/demo/f",
            &ia,
            "f",
            T0 + 7_200_000 + k,
        ));
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.join();
    lags.sort();
    let p = |q: usize| lags[(lags.len() * q / 100).min(lags.len() - 1)];
    println!(
        "freshness under 500 ev/s: p50 {:?} p99 {:?} max {:?}",
        p(50),
        p(99),
        lags[lags.len() - 1]
    );
    assert!(p(99) < Duration::from_secs(1));
}
