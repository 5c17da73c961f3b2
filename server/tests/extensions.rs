//! Append-batch (extensions.md §6, §8.11) and stream attributes (§7) on the bucketed
//! surface, against the real binary: exact acknowledgement bodies, per-frame record ranges,
//! whole-request rejections that append nothing, the frame limit, and durability of both
//! features across a `kill -9` restart.

mod support;

use support::{expect, temp_dir, Server};

const JSON: (&str, &str) = ("content-type", "application/json");
const TEXT: (&str, &str) = ("content-type", "text/plain");
/// The `Stream-Extensions` value of a bucketed JSON stream.
const TOKEN: &str = "json-record-coordinates-v1, ndjson-append-v1";

fn frames<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn start(dir: &std::path::Path, storage: &str) -> Server {
    Server::spawn_standard(&dir.join("data"), storage, 2, &[], None)
}

fn setup(storage: &str) -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-ext");
    let s = start(dir.path(), storage);
    expect(&s, "PUT", "/demo", &[], b"", 201);
    (s, dir)
}

fn tail(s: &Server, path: &str) -> String {
    let r = expect(s, "HEAD", path, &[], b"", 200);
    r.header("stream-next-offset").expect("tail").to_string()
}

fn body(s: &Server, path: &str) -> String {
    expect(s, "GET", &format!("{path}?offset=-1"), &[], b"", 200).body_str()
}

#[test]
fn batch_on_a_json_stream_reports_each_frames_range() {
    let (s, _dir) = setup("memory");
    expect(&s, "PUT", "/demo/ev", &[JSON], br#"{"id":0}"#, 201);
    let batch = frames([&br#" {"a": 1} "#[..], br#"[1, [2, 3]]"#, br#""s""#]);
    let r = expect(&s, "POST", "/demo/ev/append-batch", &[JSON], &batch, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000029"));
    assert_eq!(
        r.body_str(),
        concat!(
            r#"[{"status":204,"stream_next_offset":"00000000000000000017","stream_record_start":1,"stream_record_next":2},"#,
            r#"{"status":204,"stream_next_offset":"00000000000000000025","stream_record_start":2,"stream_record_next":4},"#,
            r#"{"status":204,"stream_next_offset":"00000000000000000029","stream_record_start":4,"stream_record_next":5}]"#
        )
    );
    assert_eq!(
        body(&s, "/demo/ev"),
        "{\"id\":0}\n{\"a\":1}\n1\n[2,3]\n\"s\"\n"
    );
    let h = expect(&s, "HEAD", "/demo/ev", &[], b"", 200);
    assert_eq!(h.header("stream-record-next"), Some("5"));
    // Frames are whole records: record reads see each frame's values separately.
    let r = expect(&s, "GET", "/demo/ev?record=2&max_records=2", &[], b"", 200);
    assert_eq!(r.body_str(), "1\n[2,3]\n");
}

#[test]
fn batch_on_a_byte_stream_keeps_message_boundaries() {
    let (s, _dir) = setup("memory");
    expect(&s, "PUT", "/demo/t", &[TEXT], b"", 201);
    let r = expect(
        &s,
        "POST",
        "/demo/t/append-batch",
        &[TEXT],
        &frames([&b"ab"[..], b"cde"]),
        200,
    );
    assert_eq!(r.header("stream-extensions"), None);
    assert_eq!(
        r.body_str(),
        r#"[{"status":204,"stream_next_offset":"00000000000000000002"},{"status":204,"stream_next_offset":"00000000000000000005"}]"#
    );
    // Prefer: return=minimal on a fully successful non-JSON batch: 204, tail still given.
    let r = expect(
        &s,
        "POST",
        "/demo/t/append-batch",
        &[TEXT, ("prefer", "return=minimal")],
        &frames([&b"f"[..]]),
        204,
    );
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000006"));
    assert_eq!(body(&s, "/demo/t"), "abcdef");
}

/// Per-frame failures live inside the 200 body. With every frame of a request committed
/// synchronously, a closed stream or a content-type mismatch fails each frame alike; a
/// failure of one frame among successes needs a storage error (covered by the unit test
/// `batch::tests::failed_frame_assigns_nothing_and_later_frames_continue`).
#[test]
fn per_frame_failures_are_reported_in_the_ack_body() {
    let (s, _dir) = setup("memory");
    expect(&s, "PUT", "/demo/c", &[JSON], br#"[1,2]"#, 201);
    let r = expect(
        &s,
        "POST",
        "/demo/c/append-batch",
        &[TEXT],
        &frames([&b"x"[..], b"y"]),
        200,
    );
    let mismatch = r#"{"status":409,"error_code":"content_type_mismatch","error":"Content-Type differs from the stream's","stream_next_offset":"00000000000000000004"}"#;
    assert_eq!(r.body_str(), format!("[{mismatch},{mismatch}]"));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000004"));

    expect(
        &s,
        "POST",
        "/demo/c",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    let r = expect(
        &s,
        "POST",
        "/demo/c/append-batch",
        &[JSON, ("prefer", "return=minimal")],
        &frames([&b"3"[..]]),
        200,
    );
    assert_eq!(
        r.body_str(),
        r#"[{"status":409,"error_code":"stream_closed","error":"stream is closed","stream_closed":true,"stream_next_offset":"00000000000000000004"}]"#
    );
    assert_eq!(body(&s, "/demo/c"), "1\n2\n");
}

#[test]
fn whole_request_rejections_append_nothing() {
    let (s, _dir) = setup("memory");
    expect(&s, "PUT", "/demo/r", &[JSON], b"", 201);
    let good = frames([&b"1"[..], b"2"]);
    let path = "/demo/r/append-batch";
    for h in [
        ("producer-id", "w"),
        ("producer-epoch", "0"),
        ("producer-seq", "0"),
        ("stream-seq", "a"),
        ("stream-record-match", "0"),
        ("stream-closed", "true"),
        ("stream-closed", "TRUE"),
    ] {
        expect(&s, "POST", path, &[JSON, h], &good, 400);
    }
    // The whole producer trio is refused too.
    expect(
        &s,
        "POST",
        path,
        &[
            JSON,
            ("producer-id", "w"),
            ("producer-epoch", "0"),
            ("producer-seq", "0"),
        ],
        &good,
        400,
    );
    // Bad framing, missing Content-Type, invalid JSON in any frame, `[]` frames.
    expect(&s, "POST", path, &[], &good, 400);
    expect(&s, "POST", path, &[JSON], b"", 400);
    expect(&s, "POST", path, &[JSON], &[0, 0, 0, 0], 400);
    expect(&s, "POST", path, &[JSON], &[0, 0, 1], 400);
    let mut truncated = good.clone();
    truncated.pop();
    expect(&s, "POST", path, &[JSON], &truncated, 400);
    let mut zero_after = good.clone();
    zero_after.extend_from_slice(&[0, 0, 0, 0]);
    expect(&s, "POST", path, &[JSON], &zero_after, 400);
    let r = expect(
        &s,
        "POST",
        path,
        &[JSON],
        &frames([&b"1"[..], b"{bad", b"3"]),
        400,
    );
    assert!(r.body_str().starts_with("invalid_json"), "{}", r.body_str());
    let r = expect(&s, "POST", path, &[JSON], &frames([&b"1"[..], b"[]"]), 400);
    assert!(r.body_str().starts_with("empty_json_array"));
    expect(
        &s,
        "POST",
        path,
        &[JSON, ("content-encoding", "br")],
        &good,
        415,
    );
    assert_eq!(tail(&s, "/demo/r"), "00000000000000000000");
    assert_eq!(body(&s, "/demo/r"), "");
    // Allowed: Stream-Closed values other than `true`, and an empty Stream-Seq.
    expect(
        &s,
        "POST",
        path,
        &[JSON, ("stream-closed", "false"), ("stream-seq", "")],
        &good,
        200,
    );
    assert_eq!(body(&s, "/demo/r"), "1\n2\n");
    // Missing stream / bucket, wrong method, invalid stream ID.
    expect(&s, "POST", "/demo/nope/append-batch", &[JSON], &good, 404);
    expect(&s, "POST", "/nobucket/r/append-batch", &[JSON], &good, 404);
    expect(&s, "GET", path, &[], b"", 405);
    expect(&s, "POST", "/demo/a..b/append-batch", &[JSON], &good, 400);
}

#[test]
fn frame_limit_is_512() {
    let (s, _dir) = setup("memory");
    expect(&s, "PUT", "/demo/l", &[TEXT], b"", 201);
    let one: &[u8] = b"z";
    let path = "/demo/l/append-batch";
    let r = expect(&s, "POST", path, &[TEXT], &frames(vec![one; 513]), 413);
    assert!(r.body_str().starts_with("payload_too_large"));
    assert_eq!(tail(&s, "/demo/l"), "00000000000000000000");
    let r = expect(&s, "POST", path, &[TEXT], &frames(vec![one; 512]), 200);
    let acks = r.body_str();
    assert_eq!(acks.matches("\"status\":204").count(), 512);
    assert!(acks.ends_with(r#"{"status":204,"stream_next_offset":"00000000000000000512"}]"#));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000512"));
}

#[test]
fn acknowledged_batches_survive_kill9() {
    let dir = temp_dir("ursula-ext-crash");
    let s = start(dir.path(), "disk");
    expect(&s, "PUT", "/demo", &[], b"", 201);
    expect(&s, "PUT", "/demo/d", &[JSON], b"", 201);
    let mut want = String::new();
    let mut n = 0u64;
    for round in 0..20 {
        let values: Vec<String> = (0..50)
            .map(|i| format!(r#"{{"round":{round},"i":{i},"pad":"{}"}}"#, "p".repeat(100)))
            .collect();
        let r = expect(
            &s,
            "POST",
            "/demo/d/append-batch",
            &[JSON],
            &frames(values.iter().map(|v| v.as_bytes())),
            200,
        );
        assert_eq!(r.body_str().matches("\"status\":204").count(), 50);
        for v in &values {
            want.push_str(v);
            want.push('\n');
        }
        n += 50;
        assert_eq!(
            r.header("stream-next-offset"),
            Some(format!("{:020}", want.len()).as_str())
        );
    }
    s.kill9();
    let s = start(dir.path(), "disk");
    let h = expect(&s, "HEAD", "/demo/d", &[], b"", 200);
    assert_eq!(h.header("stream-record-next"), Some(n.to_string().as_str()));
    assert_eq!(body(&s, "/demo/d"), want);
    // Appending continues from the recovered tail and record count.
    let r = expect(
        &s,
        "POST",
        "/demo/d/append-batch",
        &[JSON],
        &frames([&b"true"[..]]),
        200,
    );
    assert!(r.body_str().contains(&format!(
        "\"stream_record_start\":{n},\"stream_record_next\":{}",
        n + 1
    )));
}

fn attrs(s: &Server, path: &str) -> String {
    let r = expect(s, "GET", &format!("{path}/attrs"), &[], b"", 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.body_str()
}

#[test]
fn attributes_on_create_match_read_and_replace() {
    let (s, _dir) = setup("memory");
    let a = r#"{"title":"Orders","metadata":{"team":"core","n":[1,2.50]},"junk":true}"#;
    let stored = r#"{"title":"Orders","metadata":{"team":"core","n":[1,2.50]}}"#;
    expect(&s, "PUT", "/demo/o", &[JSON, ("stream-attrs", a)], b"", 201);
    assert_eq!(attrs(&s, "/demo/o"), stored);
    // Idempotent create: same attributes (unknown fields and whitespace ignored) → 200.
    expect(
        &s,
        "PUT",
        "/demo/o",
        &[
            JSON,
            (
                "stream-attrs",
                r#"{ "metadata": {"team": "core", "n": [1, 2.50]}, "title": "Orders" }"#,
            ),
        ],
        b"",
        200,
    );
    // Different, or absent, attributes → 409.
    for h in [
        r#"{"title":"Other","metadata":{"team":"core","n":[1,2.50]}}"#,
        r#"{"title":"Orders"}"#,
        "{}",
    ] {
        expect(&s, "PUT", "/demo/o", &[JSON, ("stream-attrs", h)], b"", 409);
    }
    expect(&s, "PUT", "/demo/o", &[JSON], b"", 409);
    // No attributes ≡ `{}`.
    expect(&s, "PUT", "/demo/plain", &[JSON], b"", 201);
    assert_eq!(attrs(&s, "/demo/plain"), "{}");
    expect(
        &s,
        "PUT",
        "/demo/plain",
        &[JSON, ("stream-attrs", "{}")],
        b"",
        200,
    );
    expect(
        &s,
        "PUT",
        "/demo/plain",
        &[JSON, ("stream-attrs", r#"{"ignored":1}"#)],
        b"",
        200,
    );
    expect(
        &s,
        "PUT",
        "/demo/plain",
        &[JSON, ("stream-attrs", r#"{"title":"x"}"#)],
        b"",
        409,
    );
    // Invalid header values → 400, nothing created.
    for bad in [
        "[]",
        "nope",
        r#"{"title":1}"#,
        r#"{"metadata":[]}"#,
        r#"{"title":"x""#,
    ] {
        expect(&s, "PUT", "/demo/bad", &[("stream-attrs", bad)], b"", 400);
    }
    expect(&s, "HEAD", "/demo/bad", &[], b"", 404);

    // Replace: whole object, no merge; `{}` clears; allowed on a closed stream.
    let before = expect(&s, "GET", "/demo/o?offset=-1", &[], b"", 200);
    let head_before = tail(&s, "/demo/o");
    expect(
        &s,
        "PUT",
        "/demo/o/attrs",
        &[("content-type", "application/json; charset=utf-8")],
        br#"{"metadata":{"v":2}}"#,
        204,
    );
    assert_eq!(attrs(&s, "/demo/o"), r#"{"metadata":{"v":2}}"#);
    let after = expect(&s, "GET", "/demo/o?offset=-1", &[], b"", 200);
    assert_eq!(before.header("etag"), after.header("etag"));
    assert_eq!(tail(&s, "/demo/o"), head_before);
    expect(&s, "PUT", "/demo/o/attrs", &[JSON], b"{}", 204);
    assert_eq!(attrs(&s, "/demo/o"), "{}");
    expect(&s, "PUT", "/demo/o", &[JSON], b"", 200);
    expect(
        &s,
        "POST",
        "/demo/o",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    expect(
        &s,
        "PUT",
        "/demo/o/attrs",
        &[JSON],
        br#"{"title":"closed"}"#,
        204,
    );
    assert_eq!(attrs(&s, "/demo/o"), r#"{"title":"closed"}"#);

    // Replace errors.
    expect(&s, "PUT", "/demo/o/attrs", &[], br#"{"title":"a"}"#, 400);
    expect(
        &s,
        "PUT",
        "/demo/o/attrs",
        &[TEXT],
        br#"{"title":"a"}"#,
        400,
    );
    expect(&s, "PUT", "/demo/o/attrs", &[JSON], b"{", 400);
    expect(
        &s,
        "PUT",
        "/demo/o/attrs",
        &[JSON],
        br#"{"title":false}"#,
        400,
    );
    assert_eq!(attrs(&s, "/demo/o"), r#"{"title":"closed"}"#);
    expect(&s, "GET", "/demo/missing/attrs", &[], b"", 404);
    expect(&s, "PUT", "/demo/missing/attrs", &[JSON], b"{}", 404);
    expect(&s, "GET", "/nobucket/o/attrs", &[], b"", 404);
    expect(&s, "DELETE", "/demo/o/attrs", &[], b"", 405);
}

#[test]
fn attribute_size_limit_is_16_kib() {
    let (s, _dir) = setup("memory");
    expect(&s, "PUT", "/demo/z", &[JSON], b"", 201);
    // `{"title":"…"}` is 12 bytes of framing.
    let fits = format!(r#"{{"title":"{}"}}"#, "x".repeat(16 * 1024 - 12));
    let over = format!(r#"{{"title":"{}"}}"#, "x".repeat(16 * 1024 - 11));
    assert_eq!((fits.len(), over.len()), (16384, 16385));
    expect(&s, "PUT", "/demo/z/attrs", &[JSON], over.as_bytes(), 400);
    assert_eq!(attrs(&s, "/demo/z"), "{}");
    expect(&s, "PUT", "/demo/z/attrs", &[JSON], fits.as_bytes(), 204);
    assert_eq!(attrs(&s, "/demo/z"), fits);
    expect(&s, "PUT", "/demo/h", &[("stream-attrs", &over)], b"", 400);
    expect(&s, "PUT", "/demo/h", &[("stream-attrs", &fits)], b"", 201);
    assert_eq!(attrs(&s, "/demo/h"), fits);
}

#[test]
fn attributes_survive_kill9() {
    let dir = temp_dir("ursula-ext-attrs");
    let s = start(dir.path(), "disk");
    expect(&s, "PUT", "/demo", &[], b"", 201);
    let created = r#"{"title":"made at create"}"#;
    expect(&s, "PUT", "/demo/a", &[("stream-attrs", created)], b"", 201);
    expect(&s, "PUT", "/demo/b", &[JSON], b"[1]", 201);
    let replaced = r#"{"title":"t\u00e9","metadata":{"deep":{"x":[null,true]}}}"#;
    expect(
        &s,
        "PUT",
        "/demo/b/attrs",
        &[JSON],
        replaced.as_bytes(),
        204,
    );
    expect(&s, "PUT", "/demo/c", &[("stream-attrs", created)], b"", 201);
    expect(&s, "PUT", "/demo/c/attrs", &[JSON], b"{}", 204);
    s.kill9();
    let s = start(dir.path(), "disk");
    assert_eq!(attrs(&s, "/demo/a"), created);
    assert_eq!(
        attrs(&s, "/demo/b"),
        r#"{"title":"té","metadata":{"deep":{"x":[null,true]}}}"#
    );
    assert_eq!(attrs(&s, "/demo/c"), "{}");
    // Still part of the create match after recovery.
    expect(&s, "PUT", "/demo/a", &[("stream-attrs", created)], b"", 200);
    expect(&s, "PUT", "/demo/a", &[], b"", 409);
    assert_eq!(body(&s, "/demo/b"), "1\n");
}
