//! JSON record coordinates (extensions.md §8) on the bucketed surface: the reference vectors
//! of §8.7, producer retries, the parameter rules of §8.6, and survival across a restart.

mod support;

use std::time::Duration;

use support::{expect, temp_dir, Response, Server};

fn records(r: &Response) -> (Option<&str>, Option<&str>, Option<&str>) {
    (
        r.header("stream-record-first"),
        r.header("stream-record-start"),
        r.header("stream-record-next"),
    )
}

const JSON: (&str, &str) = ("content-type", "application/json");
/// The `Stream-Extensions` value of a bucketed JSON stream.
const TOKEN: &str = "json-record-coordinates-v1, ndjson-append-v1";

fn setup(disk: bool) -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-records");
    let storage = if disk { "disk" } else { "memory" };
    let s = Server::spawn_standard(&dir.path().join("data"), storage, 2, &[], None);
    expect(&s, "PUT", "/demo", &[], b"", 201);
    (s, dir)
}

#[test]
fn reference_vectors() {
    let (s, _dir) = setup(false);
    let r = expect(
        &s,
        "PUT",
        "/demo/ev",
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(
        (
            r.header("stream-record-start"),
            r.header("stream-record-next")
        ),
        (Some("0"), Some("3"))
    );

    let r = expect(&s, "HEAD", "/demo/ev", &[], b"", 200);
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    assert_eq!(records(&r), (Some("0"), None, Some("3")));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000027"));

    let r = expect(
        &s,
        "POST",
        "/demo/ev",
        &[JSON, ("stream-record-match", "2")],
        br#"{"id":3}"#,
        412,
    );
    assert_eq!(r.header("stream-record-next"), Some("3"));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000027"));
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));

    let r = expect(&s, "GET", "/demo/ev?record=1&max_records=2", &[], b"", 200);
    assert_eq!(r.body_str(), "{\"id\":1}\n{\"id\":2}\n");
    assert_eq!(records(&r), (Some("0"), Some("1"), Some("3")));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000027"));
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    let etag = r.header("etag").map(str::to_string).expect("etag");

    let r = expect(
        &s,
        "GET",
        "/demo/ev?record=1&max_records=2&record_view=envelope",
        &[],
        b"",
        200,
    );
    assert_eq!(
        r.body_str(),
        "{\"record\":1,\"value\":{\"id\":1}}\n{\"record\":2,\"value\":{\"id\":2}}\n"
    );
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.durable-stream-records+ndjson")
    );
    assert_eq!(records(&r), (Some("0"), Some("1"), Some("3")));
    let envelope_etag = r.header("etag").expect("etag");
    assert_eq!(envelope_etag, format!("{}:e\"", etag.trim_end_matches('"')));

    let r = expect(&s, "GET", "/demo/ev?record=4", &[], b"", 400);
    assert_eq!(r.header("stream-record-next"), Some("3"));
    expect(
        &s,
        "GET",
        "/demo/ev?record=0&offset=00000000000000000000",
        &[],
        b"",
        400,
    );

    let r = expect(
        &s,
        "GET",
        "/demo/ev?record=3&live=long-poll&timeout_ms=200",
        &[],
        b"",
        204,
    );
    assert_eq!(records(&r), (Some("0"), Some("3"), Some("3")));
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000027"));
    assert!(r.header("stream-cursor").is_some());

    let r = expect(
        &s,
        "POST",
        "/demo/ev",
        &[JSON],
        br#"[{"id":3},{"id":4}]"#,
        204,
    );
    assert_eq!(
        (
            r.header("stream-record-start"),
            r.header("stream-record-next")
        ),
        (Some("3"), Some("5"))
    );
    assert_eq!(r.header("stream-next-offset"), Some("00000000000000000045"));
    // A matching precondition appends.
    let r = expect(
        &s,
        "POST",
        "/demo/ev",
        &[JSON, ("stream-record-match", "5")],
        br#"{"id":5}"#,
        204,
    );
    assert_eq!(r.header("stream-record-start"), Some("5"));

    // Offset reads stay byte-oriented NDJSON (may start mid-record) and carry the token.
    let r = expect(
        &s,
        "GET",
        "/demo/ev?offset=00000000000000000003",
        &[],
        b"",
        200,
    );
    assert!(r.body_str().starts_with("d\":0}\n{\"id\":1}"));
    assert_eq!(r.header("stream-extensions"), Some(TOKEN));
    let r = expect(&s, "GET", "/demo/ev?tail_records=2", &[], b"", 200);
    assert_eq!(r.body_str(), "{\"id\":4}\n{\"id\":5}\n");
    assert_eq!(records(&r), (Some("0"), Some("4"), Some("6")));
    let r = expect(&s, "GET", "/demo/ev?record=now", &[], b"", 200);
    assert!(r.body.is_empty());
    assert_eq!(records(&r), (Some("0"), Some("6"), Some("6")));
    assert!(r.header("etag").is_none());
}

#[test]
fn producer_retries_report_their_original_range() {
    let (s, _dir) = setup(false);
    expect(&s, "PUT", "/demo/p", &[JSON], b"", 201);
    let producer = |seq: &'static str| {
        [
            JSON,
            ("producer-id", "w"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
        ]
    };
    let first = expect(&s, "POST", "/demo/p", &producer("0"), br#"[1,2,3]"#, 200);
    assert_eq!(records(&first), (None, Some("0"), Some("3")));
    expect(&s, "POST", "/demo/p", &producer("1"), br#"[4]"#, 200);
    let retry = expect(&s, "POST", "/demo/p", &producer("0"), br#"[9,9,9]"#, 204);
    assert_eq!(records(&retry), (None, Some("0"), Some("3")));
    assert_eq!(
        retry.header("stream-next-offset"),
        first.header("stream-next-offset")
    );
    // A close-only request reports an empty range at the tail.
    let close = expect(
        &s,
        "POST",
        "/demo/p",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    assert_eq!(records(&close), (None, Some("4"), Some("4")));
}

#[test]
fn parameter_rules_and_inactive_streams() {
    let (s, _dir) = setup(false);
    expect(&s, "PUT", "/demo/j", &[JSON], b"[1,2]", 201);
    expect(
        &s,
        "PUT",
        "/demo/t",
        &[("content-type", "text/plain")],
        b"abc",
        201,
    );
    for bad in [
        "record=0&tail_records=1",
        "max_records=2",
        "record_view=envelope",
        "record=0&max_records=0",
        "record=0&record_view=raw",
        "record=0&max_bytes=4",
        "record=x",
        "tail_records=-1",
    ] {
        expect(&s, "GET", &format!("/demo/j?{bad}"), &[], b"", 400);
    }
    // Not a JSON stream: record parameters and preconditions are 400, no token anywhere.
    expect(&s, "GET", "/demo/t?record=0", &[], b"", 400);
    expect(
        &s,
        "POST",
        "/demo/t",
        &[("content-type", "text/plain"), ("stream-record-match", "0")],
        b"x",
        400,
    );
    let r = expect(&s, "HEAD", "/demo/t", &[], b"", 200);
    assert!(r.header("stream-extensions").is_none());
    expect(
        &s,
        "POST",
        "/demo/j",
        &[JSON, ("stream-record-match", "two")],
        b"3",
        400,
    );
    // The compat surface never advertises coordinates and ignores record parameters.
    expect(&s, "PUT", "/v1/stream/j", &[JSON], b"[1,2]", 201);
    let r = expect(&s, "GET", "/v1/stream/j?offset=-1&record=5", &[], b"", 200);
    assert_eq!(r.body_str(), "[1,2]");
    assert!(r.header("stream-extensions").is_none());
}

#[test]
fn record_sse_and_ordinals_survive_restart() {
    let dir = temp_dir("ursula-records-restart");
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    expect(&s, "PUT", "/demo", &[], b"", 201);
    expect(
        &s,
        "PUT",
        "/demo/r",
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );
    // Closed, so the event stream ends after its closing control and can be read whole.
    expect(
        &s,
        "POST",
        "/demo/r",
        &[("stream-closed", "true")],
        b"",
        204,
    );
    let sse = expect(&s, "GET", "/demo/r?record=2&live=sse", &[], b"", 200);
    let body = sse.body_str();
    assert!(body.contains("event: data\ndata:{\"id\":2}\n"), "{body}");
    assert!(
        body.contains("\"streamFirstRecord\":0,\"streamNextRecord\":3"),
        "{body}"
    );
    assert_eq!(sse.header("stream-extensions"), Some(TOKEN));
    s.sigterm(Duration::from_secs(10)).expect("exits");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    let r = expect(&s, "GET", "/demo/r?record=1", &[], b"", 200);
    assert_eq!(r.body_str(), "{\"id\":1}\n{\"id\":2}\n");
    assert_eq!(records(&r), (Some("0"), Some("1"), Some("3")));
}
