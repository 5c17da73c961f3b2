//! Every status code and header of extensions.md §11's summary table, on the disk engine,
//! one test per endpoint family, plus the `Stream-Extensions` presence/absence rules of §0
//! (the token is sent for bucketed `application/json` streams only: never for other media
//! types and never on the compat surface).

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::{expect, req, temp_dir, Response, Server};

const JSON: (&str, &str) = ("content-type", "application/json");
const TEXT: (&str, &str) = ("content-type", "text/plain");
/// The `Stream-Extensions` value of a bucketed JSON stream.
const TOKEN: &str = "json-record-coordinates-v1, ndjson-append-v1";

fn setup() -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-ext-status");
    let s = Server::spawn_standard(&dir.path().join("data"), "disk", 2, &[], None);
    (s, dir)
}

fn o(pos: u64) -> String {
    format!("{pos:020}")
}

/// The token and the stream-level record headers (§0, §8.5).
#[track_caller]
fn coords(r: &Response, first: u64, next: u64) {
    assert_eq!(r.header("stream-extensions"), Some(TOKEN), "{r:?}");
    assert_eq!(
        r.header("stream-record-first"),
        Some(first.to_string().as_str()),
        "{r:?}"
    );
    assert_eq!(
        r.header("stream-record-next"),
        Some(next.to_string().as_str()),
        "{r:?}"
    );
}

/// A write acknowledgement's range (§8.3).
#[track_caller]
fn ack_range(r: &Response, start: u64, next: u64) {
    assert_eq!(r.header("stream-extensions"), Some(TOKEN), "{r:?}");
    assert_eq!(
        r.header("stream-record-start"),
        Some(start.to_string().as_str()),
        "{r:?}"
    );
    assert_eq!(
        r.header("stream-record-next"),
        Some(next.to_string().as_str()),
        "{r:?}"
    );
}

/// No token and no record header at all (non-JSON, compat, or no-token endpoints).
#[track_caller]
fn no_coords(r: &Response) {
    for h in [
        "stream-extensions",
        "stream-record-first",
        "stream-record-start",
        "stream-record-next",
    ] {
        assert!(r.header(h).is_none(), "unexpected {h}: {r:?}");
    }
}

#[track_caller]
fn no_store(r: &Response) {
    assert_eq!(r.header("cache-control"), Some("no-store"), "{r:?}");
}

#[track_caller]
fn error_code(r: &Response, code: &str) {
    assert!(
        r.body_str().contains(code),
        "expected error code {code}: {:?}",
        r.body_str()
    );
}

fn json(r: &Response) -> Value {
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{r:?}"
    );
    sonic_rs::from_slice(&r.body).unwrap_or_else(|e| panic!("bad JSON {:?}: {e}", r.body_str()))
}

/// Send a request head announcing `len` body bytes and return the status line the server
/// answers with before (or instead of) reading the body.
fn status_for_announced_body(s: &Server, head: &str) -> String {
    let mut sock = std::net::TcpStream::connect(&s.addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    sock.write_all(head.as_bytes()).expect("write");
    let mut buf = [0u8; 64];
    let n = sock.read(&mut buf).expect("read");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

// ---------------------------------------------------------------------------------------
// §1 buckets
// ---------------------------------------------------------------------------------------

#[test]
fn buckets() {
    let (s, _d) = setup();
    // PUT /{b}: 201 with an absolute Location, 409 when it exists, 400 on an invalid ID.
    let r = expect(&s, "PUT", "/stat-b", &[], b"", 201);
    let loc = r.header("location").expect("Location");
    assert_eq!(loc, format!("{}/stat-b", s.base_url));
    assert!(r.body.is_empty());
    no_store(&r);
    no_coords(&r);
    expect(&s, "PUT", "/stat-b", &[], b"", 409);
    for bad in ["/abc", "/Upper", "/a.bc", &format!("/{}", "x".repeat(65))] {
        let r = expect(&s, "PUT", bad, &[], b"", 400);
        error_code(&r, "invalid_bucket_id");
    }

    // GET /{b}: 200 JSON, 400, 404.
    let r = expect(&s, "GET", "/stat-b", &[], b"", 200);
    no_store(&r);
    no_coords(&r);
    let v = json(&r);
    assert_eq!(v["bucket_id"].as_str(), Some("stat-b"));
    assert_eq!(v["streams"].as_u64(), Some(0));
    expect(&s, "GET", "/abc", &[], b"", 400);
    expect(&s, "GET", "/no-such-bucket", &[], b"", 404);

    // Stream operations under a missing bucket are 404 bucket_not_found, PUT included.
    let r = expect(&s, "PUT", "/no-such-bucket/s", &[TEXT], b"", 404);
    error_code(&r, "bucket_not_found");

    // GET /{b}/streams: 200 JSON, 400 id/params, 404.
    for id in ["c", "a", "b"] {
        expect(&s, "PUT", &format!("/stat-b/{id}"), &[JSON], b"[1]", 201);
    }
    let r = expect(&s, "GET", "/stat-b/streams?limit=2", &[], b"", 200);
    no_store(&r);
    no_coords(&r);
    let v = json(&r);
    assert_eq!(v["stream_count"].as_u64(), Some(2));
    assert_eq!(v["has_more"].as_bool(), Some(true));
    assert_eq!(v["next_cursor"].as_str(), Some("b"));
    assert!(v["prefix"].is_null());
    let first = &v["streams"][0];
    assert_eq!(first["stream_id"].as_str(), Some("a"));
    assert_eq!(first["tail_offset"].as_str(), Some(o(2).as_str()));
    let v = json(&expect(
        &s,
        "GET",
        "/stat-b/streams?after=b&limit=1000",
        &[],
        b"",
        200,
    ));
    assert_eq!(v["stream_count"].as_u64(), Some(1));
    assert_eq!(v["has_more"].as_bool(), Some(false));
    assert!(v["next_cursor"].is_null());
    for bad in ["limit=0", "limit=1001", "limit=x", "limit=-1", "limit="] {
        expect(&s, "GET", &format!("/stat-b/streams?{bad}"), &[], b"", 400);
    }
    expect(&s, "GET", "/abc/streams", &[], b"", 400);
    expect(&s, "GET", "/no-such-bucket/streams", &[], b"", 404);
    expect(&s, "DELETE", "/stat-b/streams", &[], b"", 405);

    // DELETE /{b}: 409 bucket_not_empty, 400, 404, 204.
    let r = expect(&s, "DELETE", "/stat-b", &[], b"", 409);
    error_code(&r, "bucket_not_empty");
    expect(&s, "DELETE", "/abc", &[], b"", 400);
    expect(&s, "DELETE", "/no-such-bucket", &[], b"", 404);
    for id in ["a", "b", "c"] {
        expect(&s, "DELETE", &format!("/stat-b/{id}"), &[], b"", 204);
    }
    let r = expect(&s, "DELETE", "/stat-b", &[], b"", 204);
    no_store(&r);
    expect(&s, "GET", "/stat-b", &[], b"", 404);
}

// ---------------------------------------------------------------------------------------
// §2 stream identity on HEAD
// ---------------------------------------------------------------------------------------

#[test]
fn stream_identity_on_head() {
    let dir = temp_dir("ursula-ext-status-id");
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    expect(&s, "PUT", "/ident", &[], b"", 201);
    expect(&s, "PUT", "/ident/t", &[TEXT], b"abc", 201);
    let h = expect(&s, "HEAD", "/ident/t", &[], b"", 200);
    let inc = h
        .header("stream-incarnation")
        .expect("incarnation")
        .to_string();
    assert!(!inc.is_empty());
    assert_eq!(h.header("stream-retained-offset"), Some(o(0).as_str()));
    assert_eq!(h.header("stream-next-offset"), Some(o(3).as_str()));
    no_coords(&h);
    assert!(h.header("stream-snapshot-offset").is_none());

    // Deleted and recreated at once: a different incarnation, even within the same ms.
    expect(&s, "DELETE", "/ident/t", &[], b"", 204);
    expect(&s, "PUT", "/ident/t", &[TEXT], b"abc", 201);
    let h2 = expect(&s, "HEAD", "/ident/t", &[], b"", 200);
    let inc2 = h2
        .header("stream-incarnation")
        .expect("incarnation")
        .to_string();
    assert_ne!(inc, inc2, "recreated stream must change its incarnation");

    // JSON in any case / with parameters: token and record headers on HEAD.
    expect(
        &s,
        "PUT",
        "/ident/j",
        &[("content-type", "Application/JSON; charset=utf-8")],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    let h = expect(&s, "HEAD", "/ident/j", &[], b"", 200);
    coords(&h, 0, 3);
    assert!(h.header("stream-record-start").is_none());
    assert!(h.header("stream-incarnation").is_some());
    // Other JSON-ish types never get the token.
    expect(
        &s,
        "PUT",
        "/ident/nd",
        &[("content-type", "application/x-ndjson")],
        b"{\"a\":1}\n",
        201,
    );
    no_coords(&expect(&s, "HEAD", "/ident/nd", &[], b"", 200));
    // Compat surface: identity headers too (§2 applies to both surfaces), never the token.
    expect(&s, "PUT", "/v1/stream/ident-j", &[JSON], b"[1]", 201);
    let h = expect(&s, "HEAD", "/v1/stream/ident-j", &[], b"", 200);
    assert!(h.header("stream-incarnation").is_some());
    assert_eq!(h.header("stream-retained-offset"), Some(o(0).as_str()));
    no_coords(&h);

    // Retention moves Stream-Retained-Offset; HEAD describes the visible snapshot (§3.5).
    let snap = expect(&s, "PUT", "/ident/j/snapshot?record=2", &[], b"s", 204);
    expect(&s, "PUT", "/ident/j/retention?record=1", &[], b"", 204);
    let h = expect(&s, "HEAD", "/ident/j", &[], b"", 200);
    assert_eq!(h.header("stream-retained-offset"), Some(o(9).as_str()));
    assert_eq!(h.header("stream-snapshot-offset"), Some(o(18).as_str()));
    assert_eq!(
        h.header("stream-snapshot-digest"),
        snap.header("stream-snapshot-digest")
    );
    coords(&h, 1, 3);
    // It matches the Stream-Next-Offset of a 410 read.
    let gone = expect(&s, "GET", "/ident/j?offset=-1", &[], b"", 410);
    assert_eq!(gone.header("stream-next-offset"), Some(o(9).as_str()));

    // Restarts keep the incarnation.
    let j_inc = h.header("stream-incarnation").unwrap().to_string();
    s.sigterm(Duration::from_secs(10)).expect("exits");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    let h = expect(&s, "HEAD", "/ident/t", &[], b"", 200);
    assert_eq!(h.header("stream-incarnation"), Some(inc2.as_str()));
    let h = expect(&s, "HEAD", "/ident/j", &[], b"", 200);
    assert_eq!(h.header("stream-incarnation"), Some(j_inc.as_str()));
    assert_eq!(h.header("stream-retained-offset"), Some(o(9).as_str()));
}

// ---------------------------------------------------------------------------------------
// §8 record coordinates: acks, 400/410/412, reads, and Stream-Extensions presence/absence
// ---------------------------------------------------------------------------------------

#[test]
fn record_coordinates() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/recs", &[], b"", 201);
    let p = "/recs/ev";

    // Create acks: with records, empty, `[]`; idempotent 200 reports Start = Next = N.
    let r = expect(
        &s,
        "PUT",
        p,
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    ack_range(&r, 0, 3);
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    ack_range(&expect(&s, "PUT", "/recs/empty", &[JSON], b"", 201), 0, 0);
    ack_range(&expect(&s, "PUT", "/recs/arr", &[JSON], b"[]", 201), 0, 0);
    ack_range(&expect(&s, "PUT", p, &[JSON], b"", 200), 3, 3);
    // POST `[]` is 400 (nothing to commit).
    expect(&s, "POST", p, &[JSON], b"[]", 400);

    // Stream-Record-Match: 412 with the current tail; invalid values are 400.
    let r = expect(
        &s,
        "POST",
        p,
        &[JSON, ("stream-record-match", "2")],
        br#"{"id":9}"#,
        412,
    );
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(r.header("stream-record-next"), Some("3"));
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    for bad in ["", "-1", "1.0", "x", "99999999999999999999999"] {
        expect(
            &s,
            "POST",
            p,
            &[JSON, ("stream-record-match", bad)],
            br#"{"id":9}"#,
            400,
        );
    }
    let h = expect(&s, "HEAD", p, &[], b"", 200);
    coords(&h, 0, 3);
    assert_eq!(h.header("stream-next-offset"), Some(o(27).as_str()));
    let r = expect(
        &s,
        "POST",
        p,
        &[JSON, ("stream-record-match", "3")],
        br#"{"id":3}"#,
        204,
    );
    ack_range(&r, 3, 4);
    assert_eq!(r.header("stream-next-offset"), Some(o(36).as_str()));

    // With producer headers: a first accept is 200; a duplicate is answered before the
    // precondition is looked at (204, original range).
    let prod = |seq: &'static str, m: &'static str| {
        [
            JSON,
            ("producer-id", "w"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
            ("stream-record-match", m),
        ]
    };
    let r = expect(&s, "POST", p, &prod("0", "4"), br#"{"id":4}"#, 200);
    ack_range(&r, 4, 5);
    let r = expect(&s, "POST", p, &prod("1", "4"), br#"{"id":9}"#, 412);
    assert_eq!(r.header("stream-record-next"), Some("5"));
    let r = expect(&s, "POST", p, &prod("0", "0"), br#"{"id":4}"#, 204);
    ack_range(&r, 4, 5);
    assert_eq!(r.header("stream-next-offset"), Some(o(45).as_str()));

    // Record-aware 200: full header set; Up-To-Date only at the tail.
    let r = expect(
        &s,
        "GET",
        &format!("{p}?record=1&max_records=2"),
        &[],
        b"",
        200,
    );
    coords(&r, 0, 3);
    assert_eq!(r.header("stream-record-start"), Some("1"));
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    assert!(r.header("stream-up-to-date").is_none(), "{r:?}");
    assert!(r.header("etag").is_some());
    assert!(r.header("cache-control").is_some());
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let r = expect(&s, "GET", &format!("{p}?tail_records=1"), &[], b"", 200);
    coords(&r, 0, 5);
    assert_eq!(r.header("stream-record-start"), Some("4"));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    // tail_records larger than the stream starts at F.
    let r = expect(&s, "GET", &format!("{p}?tail_records=99"), &[], b"", 200);
    assert_eq!(r.header("stream-record-start"), Some("0"));
    // r = N: valid, empty, up to date.
    let r = expect(&s, "GET", &format!("{p}?record=5"), &[], b"", 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("stream-record-start"), Some("5"));
    coords(&r, 0, 5);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));

    // 400 r > N: token, First, Next.
    let r = expect(&s, "GET", &format!("{p}?record=6"), &[], b"", 400);
    coords(&r, 0, 5);
    // 404 on a missing stream / bucket.
    expect(&s, "GET", "/recs/missing?record=0", &[], b"", 404);
    expect(&s, "GET", "/no-such-bucket/ev?record=0", &[], b"", 404);

    // Long-poll timeout: 204 with the record headers and a cursor.
    let r = expect(
        &s,
        "GET",
        &format!("{p}?record=now&live=long-poll"),
        &[],
        b"",
        204,
    );
    coords(&r, 0, 5);
    assert_eq!(r.header("stream-record-start"), Some("5"));
    assert_eq!(r.header("stream-next-offset"), Some(o(45).as_str()));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert!(r.header("stream-cursor").is_some());
    // Offset-based catch-up reads of a JSON stream advertise the token too (the long-poll
    // timeout has its own test below).
    let r = expect(&s, "GET", &format!("{p}?offset=-1"), &[], b"", 200);
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));

    // 410 r < F after retention: token, First, Next, Stream-Next-Offset = retained start.
    expect(&s, "PUT", &format!("{p}/snapshot?record=2"), &[], b"x", 204);
    expect(&s, "PUT", &format!("{p}/retention?record=2"), &[], b"", 204);
    let r = expect(&s, "GET", &format!("{p}?record=1"), &[], b"", 410);
    coords(&r, 2, 5);
    assert_eq!(r.header("stream-next-offset"), Some(o(18).as_str()));
    let r = expect(
        &s,
        "GET",
        &format!("{p}?record=1&live=long-poll"),
        &[],
        b"",
        410,
    );
    coords(&r, 2, 5);
    let r = expect(&s, "GET", &format!("{p}?tail_records=99"), &[], b"", 200);
    assert_eq!(r.header("stream-record-start"), Some("2"));
    coords(&r, 2, 5);

    // Close ack: token, Start = Next = N; Stream-Record-Match is ignored on close-only.
    let r = expect(
        &s,
        "POST",
        p,
        &[("stream-closed", "true"), ("stream-record-match", "0")],
        b"",
        204,
    );
    ack_range(&r, 5, 5);
    let r = expect(&s, "GET", &format!("{p}?record=5"), &[], b"", 200);
    assert_eq!(r.header("stream-closed"), Some("true"));
    // SSE: token and data content types, default and envelope (closed, so it ends).
    let r = expect(&s, "GET", &format!("{p}?record=4&live=sse"), &[], b"", 200);
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(
        r.header("stream-data-content-type"),
        Some("application/x-ndjson")
    );
    let r = expect(
        &s,
        "GET",
        &format!("{p}?record=4&live=sse&record_view=envelope"),
        &[],
        b"",
        200,
    );
    assert_eq!(
        r.header("stream-data-content-type"),
        Some("application/vnd.durable-stream-record+json")
    );
    assert!(
        r.body_str()
            .contains("data:{\"record\":4,\"value\":{\"id\":4}}"),
        "{}",
        r.body_str()
    );
    let r = expect(&s, "GET", &format!("{p}?offset=-1&live=sse"), &[], b"", 410);
    assert_eq!(r.header("stream-next-offset"), Some(o(18).as_str()));
    let r = expect(
        &s,
        "GET",
        &format!("{p}?offset={}&live=sse", o(18)),
        &[],
        b"",
        200,
    );
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));

    // Absence: a text/plain stream never carries the token, not even on its errors.
    let t = "/recs/t";
    no_coords(&expect(&s, "PUT", t, &[TEXT], b"ab", 201));
    no_coords(&expect(&s, "POST", t, &[TEXT], b"cd", 204));
    no_coords(&expect(&s, "GET", &format!("{t}?offset=-1"), &[], b"", 200));
    no_coords(&expect(
        &s,
        "GET",
        &format!("{t}?offset=now&live=long-poll"),
        &[],
        b"",
        204,
    ));
    no_coords(&expect(&s, "GET", &format!("{t}?record=0"), &[], b"", 400));
    no_coords(&expect(
        &s,
        "GET",
        &format!("{t}?tail_records=1"),
        &[],
        b"",
        400,
    ));
    no_coords(&expect(
        &s,
        "POST",
        t,
        &[TEXT, ("stream-record-match", "0")],
        b"x",
        400,
    ));
    no_coords(&expect(
        &s,
        "POST",
        t,
        &[("stream-closed", "true")],
        b"",
        204,
    ));
    let r = expect(&s, "GET", &format!("{t}?offset=-1&live=sse"), &[], b"", 200);
    no_coords(&r);
    // application/x-ndjson is not application/json.
    let nd = "/recs/nd";
    let nd_ct = ("content-type", "application/x-ndjson");
    no_coords(&expect(&s, "PUT", nd, &[nd_ct], b"{\"a\":1}\n", 201));
    no_coords(&expect(&s, "POST", nd, &[nd_ct], b"{\"a\":2}\n", 204));
    no_coords(&expect(
        &s,
        "GET",
        &format!("{nd}?offset=-1"),
        &[],
        b"",
        200,
    ));
    expect(&s, "GET", &format!("{nd}?record=0"), &[], b"", 400);
    // Compat surface: a JSON stream there is the plain base protocol.
    let c = "/v1/stream/recs-compat";
    no_coords(&expect(&s, "PUT", c, &[JSON], br#"[{"id":0}]"#, 201));
    no_coords(&expect(&s, "POST", c, &[JSON], br#"[{"id":1}]"#, 204));
    no_coords(&expect(&s, "HEAD", c, &[], b"", 200));
    no_coords(&expect(&s, "GET", &format!("{c}?offset=-1"), &[], b"", 200));
    no_coords(&expect(
        &s,
        "GET",
        &format!("{c}?offset=now&live=long-poll"),
        &[],
        b"",
        204,
    ));
    // The compat surface ignores Stream-Record-Match rather than answering 412.
    no_coords(&expect(
        &s,
        "POST",
        c,
        &[JSON, ("stream-record-match", "0")],
        br#"{"id":2}"#,
        204,
    ));
}

/// §0: the token is sent on offset-based long-poll responses of a JSON stream, including
/// the `204` a timed-out poll answers with (record-aware long-polls already carry it).
#[test]
fn offset_long_poll_timeout_on_a_json_stream_carries_the_token() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/lpoll", &[], b"", 201);
    expect(&s, "PUT", "/lpoll/ev", &[JSON], b"[1]", 201);
    let r = expect(
        &s,
        "GET",
        "/lpoll/ev?offset=now&live=long-poll",
        &[],
        b"",
        204,
    );
    assert_eq!(r.header("stream-next-offset"), Some(o(2).as_str()));
    assert_eq!(
        r.header("stream-extensions"),
        Some(TOKEN),
        "offset-based long-poll 204 on a JSON stream: {r:?}"
    );
}

// ---------------------------------------------------------------------------------------
// §3 snapshots
// ---------------------------------------------------------------------------------------

#[test]
fn snapshots() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/snaps", &[], b"", 201);
    let p = "/snaps/ev";
    expect(
        &s,
        "PUT",
        p,
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    let snap = |o: &str| format!("{p}/snapshot/{o}");

    // 400: syntax, missing/invalid record, record > N, empty match header, alignment.
    for bad in [
        snap("-1"),
        snap("now"),
        snap("abc"),
        snap(&"0".repeat(21)),
        format!("{p}/snapshot"),
        format!("{p}/snapshot?record=x"),
        format!("{p}/snapshot?record=-1"),
        format!("{p}/snapshot?record=4"),
        snap(&o(3)),
    ] {
        expect(&s, "PUT", &bad, &[JSON], b"{}", 400);
    }
    expect(
        &s,
        "PUT",
        &snap(&o(9)),
        &[JSON, ("stream-snapshot-match", "")],
        b"{}",
        400,
    );
    // 404: stream or bucket missing.
    expect(&s, "PUT", "/snaps/nope/snapshot/0", &[], b"", 404);
    expect(&s, "PUT", "/no-such-bucket/ev/snapshot/0", &[], b"", 404);
    // 409 beyond the tail, with Stream-Next-Offset = tail.
    let r = expect(&s, "PUT", &snap(&o(36)), &[JSON], b"{}", 409);
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    // 409 when a match header is given but nothing is visible.
    expect(
        &s,
        "PUT",
        &snap(&o(9)),
        &[JSON, ("stream-snapshot-match", "00")],
        b"{}",
        409,
    );
    // GET: nothing published yet.
    expect(&s, "GET", &format!("{p}/snapshot"), &[], b"", 404);
    expect(&s, "GET", &snap(&o(9)), &[], b"", 404);

    // 204 publish at record 1 (short offset form accepted): full header set.
    let r = expect(&s, "PUT", &snap("9"), &[JSON], br#"{"n":1}"#, 204);
    assert_eq!(r.header("stream-snapshot-offset"), Some(o(9).as_str()));
    let d1 = r
        .header("stream-snapshot-digest")
        .expect("digest")
        .to_string();
    assert!(
        !d1.is_empty()
            && d1
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "lower-case hex digest: {d1}"
    );
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    coords(&r, 0, 3);
    no_store(&r);
    // Idempotent republish: 204, same digest; a different blob at the same offset: 409.
    let r = expect(&s, "PUT", &snap(&o(9)), &[JSON], br#"{"n":1}"#, 204);
    assert_eq!(r.header("stream-snapshot-digest"), Some(d1.as_str()));
    expect(&s, "PUT", &snap(&o(9)), &[JSON], br#"{"n":2}"#, 409);
    // Same body, different content type: a different digest, hence 409 here.
    expect(
        &s,
        "PUT",
        &snap(&o(9)),
        &[("content-type", "text/plain")],
        br#"{"n":1}"#,
        409,
    );
    // Stale (visible snapshot is higher): 409.
    expect(&s, "PUT", &snap(&o(0)), &[JSON], b"{}", 409);
    // Match header: wrong digest 409, right digest publishes.
    expect(
        &s,
        "PUT",
        &format!("{p}/snapshot?record=2"),
        &[JSON, ("stream-snapshot-match", "deadbeef")],
        b"{}",
        409,
    );
    let r = expect(
        &s,
        "PUT",
        &format!("{p}/snapshot?record=2"),
        &[JSON, ("stream-snapshot-match", d1.as_str())],
        br#"{"n":2}"#,
        204,
    );
    assert_eq!(r.header("stream-snapshot-offset"), Some(o(18).as_str()));
    let d2 = r.header("stream-snapshot-digest").unwrap().to_string();
    assert_ne!(d1, d2);

    // Digests are a function of (content type, body) only: another stream, same inputs.
    expect(
        &s,
        "PUT",
        "/snaps/other",
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    let r = expect(
        &s,
        "PUT",
        "/snaps/other/snapshot?record=2",
        &[JSON],
        br#"{"n":2}"#,
        204,
    );
    assert_eq!(r.header("stream-snapshot-digest"), Some(d2.as_str()));

    // GET latest: 307 with Location and the snapshot headers; not up to date (tail 27).
    let r = expect(&s, "GET", &format!("{p}/snapshot"), &[], b"", 307);
    assert_eq!(
        r.header("location"),
        Some(format!("{}{p}/snapshot/{}", s.base_url, o(18)).as_str())
    );
    assert_eq!(r.header("stream-snapshot-offset"), Some(o(18).as_str()));
    assert_eq!(r.header("stream-snapshot-digest"), Some(d2.as_str()));
    assert_eq!(r.header("stream-next-offset"), Some(o(18).as_str()));
    assert!(r.header("stream-up-to-date").is_none(), "{r:?}");
    coords(&r, 0, 3);
    no_store(&r);
    // GET by offset: 200 with the blob and its type.
    let r = expect(&s, "GET", &snap(&o(18)), &[], b"", 200);
    assert_eq!(r.body_str(), r#"{"n":2}"#);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("stream-snapshot-offset"), Some(o(18).as_str()));
    assert_eq!(r.header("stream-snapshot-digest"), Some(d2.as_str()));
    assert_eq!(r.header("stream-next-offset"), Some(o(18).as_str()));
    assert!(r.header("stream-up-to-date").is_none());
    assert!(r.header("stream-closed").is_none());
    coords(&r, 0, 3);
    no_store(&r);
    // Superseded → 404; syntax → 400; missing stream → 404.
    expect(&s, "GET", &snap(&o(9)), &[], b"", 404);
    expect(&s, "GET", &snap("abc"), &[], b"", 400);
    expect(&s, "GET", &snap("-1"), &[], b"", 400);
    expect(&s, "GET", "/snaps/nope/snapshot", &[], b"", 404);
    expect(
        &s,
        "GET",
        &format!("/snaps/nope/snapshot/{}", o(0)),
        &[],
        b"",
        404,
    );
    // DELETE: visible → 409, anything else → 404.
    expect(&s, "DELETE", &snap(&o(18)), &[], b"", 409);
    expect(&s, "DELETE", &snap(&o(9)), &[], b"", 404);

    // 410 below the retained start (offset and record forms).
    expect(&s, "PUT", &format!("{p}/retention?record=2"), &[], b"", 204);
    let r = expect(&s, "PUT", &snap(&o(9)), &[JSON], b"{}", 410);
    assert_eq!(r.header("stream-next-offset"), Some(o(18).as_str()));
    let r = expect(&s, "PUT", &format!("{p}/snapshot?record=1"), &[], b"", 410);
    assert_eq!(r.header("stream-next-offset"), Some(o(18).as_str()));

    // A snapshot at the tail of a closed stream: Up-To-Date and Closed on reads.
    expect(&s, "POST", p, &[("stream-closed", "true")], b"", 204);
    let r = expect(&s, "PUT", &format!("{p}/snapshot?record=3"), &[], b"z", 204);
    assert_eq!(r.header("stream-snapshot-offset"), Some(o(27).as_str()));
    let r = expect(&s, "GET", &format!("{p}/snapshot"), &[], b"", 307);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    let r = expect(&s, "GET", &snap(&o(27)), &[], b"", 200);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert_eq!(r.header("stream-closed"), Some("true"));

    // Non-JSON stream: message boundaries, no record form, no token.
    expect(&s, "PUT", "/snaps/t", &[TEXT], b"abc", 201);
    expect(&s, "POST", "/snaps/t", &[TEXT], b"def", 204);
    expect(
        &s,
        "PUT",
        &format!("/snaps/t/snapshot/{}", o(2)),
        &[],
        b"",
        400,
    );
    expect(&s, "PUT", "/snaps/t/snapshot?record=0", &[], b"", 400);
    let r = expect(
        &s,
        "PUT",
        &format!("/snaps/t/snapshot/{}", o(3)),
        &[],
        b"",
        204,
    );
    no_coords(&r);
    no_coords(&expect(&s, "GET", "/snaps/t/snapshot", &[], b"", 307));
    no_coords(&expect(
        &s,
        "GET",
        &format!("/snaps/t/snapshot/{}", o(3)),
        &[],
        b"",
        200,
    ));

    // 413 above 128 MiB, answered from the request head.
    let line = status_for_announced_body(
        &s,
        &format!(
            "PUT /snaps/t/snapshot/{} HTTP/1.1\r\nHost: x\r\nContent-Length: 134217729\r\n\r\n",
            o(6)
        ),
    );
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
}

// ---------------------------------------------------------------------------------------
// §4 retention
// ---------------------------------------------------------------------------------------

#[test]
fn retention() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/retain", &[], b"", 201);
    let p = "/retain/ev";
    expect(
        &s,
        "PUT",
        p,
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2},{"id":3},{"id":4}]"#,
        201,
    );
    let ret = |o: &str| format!("{p}/retention/{o}");
    for bad in [
        ret("abc"),
        ret("-1"),
        ret("now"),
        format!("{p}/retention"),
        format!("{p}/retention?record=x"),
    ] {
        expect(&s, "PUT", &bad, &[], b"", 400);
    }
    expect(&s, "PUT", "/retain/nope/retention/0", &[], b"", 404);
    expect(&s, "PUT", "/no-such-bucket/ev/retention/0", &[], b"", 404);
    // Equal to the current start: a 204 no-op, even without a snapshot.
    let r = expect(&s, "PUT", &ret(&o(0)), &[], b"", 204);
    assert_eq!(r.header("stream-retained-offset"), Some(o(0).as_str()));
    coords(&r, 0, 5);
    // No snapshot: 409.
    expect(&s, "PUT", &ret(&o(9)), &[], b"", 409);
    expect(&s, "PUT", &format!("{p}/retention?record=1"), &[], b"", 409);

    expect(&s, "PUT", &format!("{p}/snapshot?record=3"), &[], b"s", 204);
    // Beyond the snapshot: 409; not a record boundary: 400; record > N: 400.
    expect(&s, "PUT", &ret(&o(36)), &[], b"", 409);
    expect(&s, "PUT", &ret(&o(5)), &[], b"", 400);
    expect(&s, "PUT", &format!("{p}/retention?record=6"), &[], b"", 400);
    // Advance by record: 204 with the new retained offset and F.
    let r = expect(&s, "PUT", &format!("{p}/retention?record=1"), &[], b"", 204);
    assert_eq!(r.header("stream-retained-offset"), Some(o(9).as_str()));
    coords(&r, 1, 5);
    no_store(&r);
    // Backwards by offset: 409; record below F: 410 with the way forward.
    expect(&s, "PUT", &ret(&o(0)), &[], b"", 409);
    let r = expect(&s, "PUT", &format!("{p}/retention?record=0"), &[], b"", 410);
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(r.header("stream-record-first"), Some("1"));
    // Repeating the current position is a no-op; advance by aligned offset.
    expect(&s, "PUT", &format!("{p}/retention?record=1"), &[], b"", 204);
    let r = expect(&s, "PUT", &ret(&o(27)), &[], b"", 204);
    assert_eq!(r.header("stream-retained-offset"), Some(o(27).as_str()));
    coords(&r, 3, 5);
    let r = expect(&s, "GET", &format!("{p}?offset={}", o(18)), &[], b"", 410);
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    // A catch-up without `offset` starts at the beginning, so it is 410 too.
    expect(&s, "GET", p, &[], b"", 410);

    // Non-JSON stream: no record form, message boundaries, no token.
    expect(&s, "PUT", "/retain/t", &[TEXT], b"abc", 201);
    expect(&s, "POST", "/retain/t", &[TEXT], b"def", 204);
    expect(
        &s,
        "PUT",
        &format!("/retain/t/snapshot/{}", o(6)),
        &[],
        b"",
        204,
    );
    expect(&s, "PUT", "/retain/t/retention?record=1", &[], b"", 400);
    expect(
        &s,
        "PUT",
        &format!("/retain/t/retention/{}", o(4)),
        &[],
        b"",
        400,
    );
    let r = expect(
        &s,
        "PUT",
        &format!("/retain/t/retention/{}", o(3)),
        &[],
        b"",
        204,
    );
    assert_eq!(r.header("stream-retained-offset"), Some(o(3).as_str()));
    no_coords(&r);
    let r = expect(&s, "GET", "/retain/t?offset=-1", &[], b"", 410);
    assert_eq!(r.header("stream-next-offset"), Some(o(3).as_str()));
    no_coords(&r);
}

// ---------------------------------------------------------------------------------------
// §5 bootstrap
// ---------------------------------------------------------------------------------------

fn boundary(r: &Response) -> String {
    let ct = r.header("content-type").expect("content type");
    let b = ct
        .strip_prefix("multipart/mixed; boundary=")
        .unwrap_or_else(|| panic!("multipart/mixed: {ct}"));
    assert!(
        (1..=70).contains(&b.len())
            && b.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"'()+_,-./:=?".contains(&c)),
        "RFC 2046 boundary: {b:?}"
    );
    b.to_string()
}

#[test]
fn bootstrap() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/boot", &[], b"", 201);
    // Non-JSON, no snapshot: empty octet-stream first part, one part per append.
    expect(&s, "PUT", "/boot/t", &[TEXT], b"abc", 201);
    expect(&s, "POST", "/boot/t", &[TEXT], b"de", 204);
    let r = expect(&s, "GET", "/boot/t/bootstrap", &[], b"", 200);
    let b = boundary(&r);
    assert_eq!(
        r.body_str(),
        format!(
            "--{b}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--{b}\r\nContent-Type: text/plain\r\n\r\nabc\r\n--{b}\r\nContent-Type: text/plain\r\n\r\nde\r\n--{b}--\r\n"
        )
    );
    assert_eq!(r.header("stream-snapshot-offset"), Some("-1"));
    assert_eq!(r.header("stream-next-offset"), Some(o(5).as_str()));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert!(r.header("stream-closed").is_none());
    no_store(&r);
    no_coords(&r);

    // Any `live` parameter is 400; others are ignored.
    for q in ["live=sse", "live=long-poll", "live=true", "live="] {
        expect(&s, "GET", &format!("/boot/t/bootstrap?{q}"), &[], b"", 400);
    }
    expect(&s, "GET", "/boot/t/bootstrap?foo=bar", &[], b"", 200);
    // 404: stream or bucket missing.
    expect(&s, "GET", "/boot/nope/bootstrap", &[], b"", 404);
    expect(&s, "GET", "/no-such-bucket/t/bootstrap", &[], b"", 404);

    // JSON, snapshot, closed: record headers, token, Stream-Closed, one record per part.
    expect(
        &s,
        "PUT",
        "/boot/j",
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    expect(
        &s,
        "PUT",
        "/boot/j/snapshot?record=1",
        &[("content-type", "text/plain")],
        b"S",
        204,
    );
    expect(&s, "PUT", "/boot/j/retention?record=1", &[], b"", 204);
    expect(
        &s,
        "POST",
        "/boot/j",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    let r = expect(&s, "GET", "/boot/j/bootstrap", &[], b"", 200);
    let b = boundary(&r);
    assert_eq!(
        r.body_str(),
        format!(
            "--{b}\r\nContent-Type: text/plain\r\n\r\nS\r\n--{b}\r\nContent-Type: application/json\r\n\r\n{{\"id\":1}}\n\r\n--{b}\r\nContent-Type: application/json\r\n\r\n{{\"id\":2}}\n\r\n--{b}--\r\n"
        )
    );
    assert_eq!(r.header("stream-snapshot-offset"), Some(o(9).as_str()));
    assert_eq!(r.header("stream-next-offset"), Some(o(27).as_str()));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert_eq!(r.header("stream-closed"), Some("true"));
    coords(&r, 1, 3);
    no_store(&r);
}

// ---------------------------------------------------------------------------------------
// §6 append-batch
// ---------------------------------------------------------------------------------------

fn frames(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

#[test]
fn append_batch() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/batch", &[], b"", 201);
    expect(&s, "PUT", "/batch/j", &[JSON], b"", 201);
    expect(&s, "PUT", "/batch/t", &[TEXT], b"", 201);
    let minimal = ("prefer", "return=minimal");

    // JSON: 200 JSON array, token, outer Stream-Next-Offset; minimal still gets the array.
    let r = expect(
        &s,
        "POST",
        "/batch/j/append-batch",
        &[JSON, minimal],
        &frames(&[b"1", b"[2,3]"]),
        200,
    );
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(r.header("stream-next-offset"), Some(o(6).as_str()));
    no_store(&r);
    let v = json(&r);
    assert_eq!(v.as_array().map(|a| a.len()), Some(2));
    assert_eq!(v[1]["stream_record_start"].as_u64(), Some(1));
    assert_eq!(v[1]["stream_record_next"].as_u64(), Some(3));
    assert_eq!(v[1]["stream_next_offset"].as_str(), Some(o(6).as_str()));

    // Non-JSON: 200 array without token; `return=minimal` → 204 with Stream-Next-Offset.
    let r = expect(
        &s,
        "POST",
        "/batch/t/append-batch",
        &[TEXT],
        &frames(&[b"ab", b"c"]),
        200,
    );
    no_coords(&r);
    let v = json(&r);
    assert_eq!(v[0]["status"].as_u64(), Some(204));
    assert!(v[0].get("stream_record_start").is_none());
    let r = expect(
        &s,
        "POST",
        "/batch/t/append-batch",
        &[TEXT, minimal],
        &frames(&[b"d"]),
        204,
    );
    assert_eq!(r.header("stream-next-offset"), Some(o(4).as_str()));
    no_coords(&r);
    // A per-frame failure keeps the outer 200, even with return=minimal.
    let r = expect(
        &s,
        "POST",
        "/batch/t/append-batch",
        &[("content-type", "application/octet-stream"), minimal],
        &frames(&[b"e"]),
        200,
    );
    let v = json(&r);
    assert_eq!(v[0]["status"].as_u64(), Some(409));

    // 400: missing Content-Type, rejected headers, framing, invalid JSON.
    expect(
        &s,
        "POST",
        "/batch/j/append-batch",
        &[],
        &frames(&[b"1"]),
        400,
    );
    expect(
        &s,
        "POST",
        "/batch/j/append-batch",
        &[JSON, ("producer-id", "p")],
        &frames(&[b"1"]),
        400,
    );
    expect(
        &s,
        "POST",
        "/batch/j/append-batch",
        &[JSON],
        &[0, 0, 0, 9],
        400,
    );
    expect(
        &s,
        "POST",
        "/batch/j/append-batch",
        &[JSON],
        &frames(&[b"1", b"nope"]),
        400,
    );
    // 404: stream or bucket missing.
    expect(
        &s,
        "POST",
        "/batch/nope/append-batch",
        &[JSON],
        &frames(&[b"1"]),
        404,
    );
    expect(
        &s,
        "POST",
        "/no-such-bucket/j/append-batch",
        &[JSON],
        &frames(&[b"1"]),
        404,
    );
    // 413: more than 512 frames, or a body over 32 MiB (answered from the head).
    let many: Vec<&[u8]> = vec![&b"1"[..]; 513];
    expect(
        &s,
        "POST",
        "/batch/j/append-batch",
        &[JSON],
        &frames(&many),
        413,
    );
    let line = status_for_announced_body(
        &s,
        "POST /batch/t/append-batch HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 33554433\r\n\r\n",
    );
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    // 415: a request Content-Encoding the server does not decode.
    expect(
        &s,
        "POST",
        "/batch/t/append-batch",
        &[TEXT, ("content-encoding", "br")],
        &frames(&[b"x"]),
        415,
    );
    // Nothing of the rejected requests was appended.
    let h = expect(&s, "HEAD", "/batch/j", &[], b"", 200);
    coords(&h, 0, 3);
    assert_eq!(h.header("stream-next-offset"), Some(o(6).as_str()));
}

// ---------------------------------------------------------------------------------------
// §7 attributes
// ---------------------------------------------------------------------------------------

#[test]
fn attributes() {
    let (s, _d) = setup();
    expect(&s, "PUT", "/attrs", &[], b"", 201);
    let attrs = r#"{"title":"Run 1","metadata":{"k":[1,2]},"extra":true}"#;
    // Invalid Stream-Attrs on create: 400 and nothing is created.
    for bad in ["nope", "[]", r#"{"title":1}"#, r#"{"metadata":"x"}"#] {
        expect(
            &s,
            "PUT",
            "/attrs/a",
            &[JSON, ("stream-attrs", bad)],
            b"",
            400,
        );
    }
    expect(&s, "HEAD", "/attrs/a", &[], b"", 404);
    expect(
        &s,
        "PUT",
        "/attrs/a",
        &[JSON, ("stream-attrs", attrs)],
        b"",
        201,
    );
    // Part of the idempotency match (unknown fields dropped before comparing).
    expect(
        &s,
        "PUT",
        "/attrs/a",
        &[
            JSON,
            (
                "stream-attrs",
                r#"{"metadata":{"k":[1,2]},"title":"Run 1"}"#,
            ),
        ],
        b"",
        200,
    );
    expect(&s, "PUT", "/attrs/a", &[JSON], b"", 409);
    expect(
        &s,
        "PUT",
        "/attrs/a",
        &[JSON, ("stream-attrs", r#"{"title":"Run 2"}"#)],
        b"",
        409,
    );

    // GET: 200 JSON (unknown fields dropped), 404.
    let r = expect(&s, "GET", "/attrs/a/attrs", &[], b"", 200);
    no_store(&r);
    let v = json(&r);
    assert_eq!(v["title"].as_str(), Some("Run 1"));
    assert!(v.get("extra").is_none(), "{}", r.body_str());
    expect(&s, "GET", "/attrs/nope/attrs", &[], b"", 404);
    expect(&s, "GET", "/no-such-bucket/a/attrs", &[], b"", 404);

    // PUT: 204, 400 (type, JSON, shape, size), 404.
    let r = expect(
        &s,
        "PUT",
        "/attrs/a/attrs",
        &[JSON],
        br#"{"title":"x"}"#,
        204,
    );
    no_store(&r);
    expect(&s, "PUT", "/attrs/a/attrs", &[], br#"{"title":"x"}"#, 400);
    expect(
        &s,
        "PUT",
        "/attrs/a/attrs",
        &[TEXT],
        br#"{"title":"x"}"#,
        400,
    );
    for bad in [
        &b"{"[..],
        b"[]",
        b"1",
        br#"{"title":false}"#,
        br#"{"metadata":[1]}"#,
    ] {
        expect(&s, "PUT", "/attrs/a/attrs", &[JSON], bad, 400);
    }
    let big = format!(r#"{{"metadata":{{"pad":"{}"}}}}"#, "p".repeat(17 << 10));
    expect(&s, "PUT", "/attrs/a/attrs", &[JSON], big.as_bytes(), 400);
    expect(&s, "PUT", "/attrs/nope/attrs", &[JSON], b"{}", 404);
    expect(&s, "PUT", "/no-such-bucket/a/attrs", &[JSON], b"{}", 404);
    // Cleared with {}: 204, reads back {}; allowed on closed streams.
    expect(
        &s,
        "POST",
        "/attrs/a",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    expect(&s, "PUT", "/attrs/a/attrs", &[JSON], b"{}", 204);
    let r = expect(&s, "GET", "/attrs/a/attrs", &[], b"", 200);
    assert_eq!(r.body_str().trim(), "{}");
    // Three-segment paths that are not a known subresource are 404 (§10).
    let r = req(&s, "GET", "/attrs/a/unknown-sub", &[], b"");
    assert_eq!(r.status, 404, "{r:?}");
}
