//! Snapshots, retention and bootstrap (extensions.md §3–§5) through the real binary,
//! including restart persistence and the 128 MiB snapshot body limit.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::{expect, temp_dir, Server};

const JSON: (&str, &str) = ("content-type", "application/json");

#[test]
fn publish_trim_bootstrap_and_restart() {
    let dir = temp_dir("ursula-snapshots");
    let data = dir.path().join("data");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    expect(&s, "PUT", "/demo", &[], b"", 201);
    expect(
        &s,
        "PUT",
        "/demo/ev",
        &[JSON],
        br#"[{"id":0},{"id":1},{"id":2}]"#,
        201,
    );

    // Retention needs a snapshot that covers it.
    expect(&s, "PUT", "/demo/ev/retention?record=2", &[], b"", 409);
    expect(&s, "GET", "/demo/ev/snapshot", &[], b"", 404);
    // Syntax and alignment.
    expect(&s, "PUT", "/demo/ev/snapshot/-1", &[JSON], b"{}", 400);
    expect(
        &s,
        "PUT",
        "/demo/ev/snapshot/00000000000000000003",
        &[JSON],
        b"{}",
        400,
    );
    expect(
        &s,
        "PUT",
        "/demo/ev/snapshot/00000000000000000099",
        &[JSON],
        b"{}",
        409,
    );
    expect(&s, "PUT", "/demo/ev/snapshot?record=9", &[JSON], b"{}", 400);

    let r = expect(
        &s,
        "PUT",
        "/demo/ev/snapshot?record=2",
        &[JSON],
        br#"{"count":2}"#,
        204,
    );
    assert_eq!(
        r.header("stream-snapshot-offset"),
        Some("00000000000000000018")
    );
    let digest = r
        .header("stream-snapshot-digest")
        .map(str::to_string)
        .expect("digest");
    assert_eq!(digest.len(), 64);
    // Idempotent republish; a different blob at the same offset or an older offset is 409.
    let again = expect(
        &s,
        "PUT",
        "/demo/ev/snapshot/00000000000000000018",
        &[JSON],
        br#"{"count":2}"#,
        204,
    );
    assert_eq!(
        again.header("stream-snapshot-digest"),
        Some(digest.as_str())
    );
    expect(
        &s,
        "PUT",
        "/demo/ev/snapshot/00000000000000000018",
        &[JSON],
        br#"{"count":3}"#,
        409,
    );
    expect(
        &s,
        "PUT",
        "/demo/ev/snapshot/00000000000000000009",
        &[JSON],
        b"{}",
        409,
    );
    expect(
        &s,
        "PUT",
        "/demo/ev/snapshot?record=3",
        &[JSON, ("stream-snapshot-match", "nope")],
        b"{}",
        409,
    );

    let latest = expect(&s, "GET", "/demo/ev/snapshot", &[], b"", 307);
    assert!(latest
        .header("location")
        .is_some_and(|l| l.ends_with("/demo/ev/snapshot/00000000000000000018")));
    let blob = expect(
        &s,
        "GET",
        "/demo/ev/snapshot/00000000000000000018",
        &[],
        b"",
        200,
    );
    assert_eq!(blob.body_str(), r#"{"count":2}"#);
    assert_eq!(blob.header("content-type"), Some("application/json"));
    expect(
        &s,
        "GET",
        "/demo/ev/snapshot/00000000000000000009",
        &[],
        b"",
        404,
    );
    expect(
        &s,
        "DELETE",
        "/demo/ev/snapshot/00000000000000000018",
        &[],
        b"",
        409,
    );

    // Trim to the snapshot; trimmed offsets and records answer 410 with the way forward.
    expect(
        &s,
        "PUT",
        "/demo/ev/retention/00000000000000000027",
        &[],
        b"",
        409,
    );
    let r = expect(&s, "PUT", "/demo/ev/retention?record=2", &[], b"", 204);
    assert_eq!(
        r.header("stream-retained-offset"),
        Some("00000000000000000018")
    );
    assert_eq!(r.header("stream-record-first"), Some("2"));
    expect(
        &s,
        "PUT",
        "/demo/ev/retention/00000000000000000018",
        &[],
        b"",
        204,
    );
    expect(
        &s,
        "PUT",
        "/demo/ev/retention/00000000000000000009",
        &[],
        b"",
        409,
    );
    let gone = expect(&s, "GET", "/demo/ev?offset=-1", &[], b"", 410);
    assert_eq!(
        gone.header("stream-next-offset"),
        Some("00000000000000000018")
    );
    let gone = expect(&s, "GET", "/demo/ev?record=1", &[], b"", 410);
    assert_eq!(gone.header("stream-record-first"), Some("2"));
    let r = expect(
        &s,
        "GET",
        "/demo/ev?offset=00000000000000000018",
        &[],
        b"",
        200,
    );
    assert_eq!(r.body_str(), "{\"id\":2}\n");

    expect(&s, "POST", "/demo/ev", &[JSON], br#"{"id":3}"#, 204);
    let boot = expect(&s, "GET", "/demo/ev/bootstrap", &[], b"", 200);
    let ct = boot
        .header("content-type")
        .expect("content type")
        .to_string();
    let boundary = ct
        .strip_prefix("multipart/mixed; boundary=")
        .expect("multipart");
    let expected = format!(
        "--{b}\r\nContent-Type: application/json\r\n\r\n{{\"count\":2}}\r\n--{b}\r\nContent-Type: application/json\r\n\r\n{{\"id\":2}}\n\r\n--{b}\r\nContent-Type: application/json\r\n\r\n{{\"id\":3}}\n\r\n--{b}--\r\n",
        b = boundary
    );
    assert_eq!(boot.body_str(), expected);
    assert_eq!(
        boot.header("stream-snapshot-offset"),
        Some("00000000000000000018")
    );
    assert_eq!(boot.header("stream-up-to-date"), Some("true"));
    expect(&s, "GET", "/demo/ev/bootstrap?live=sse", &[], b"", 400);

    // Everything survives a restart.
    let head_before = expect(&s, "HEAD", "/demo/ev", &[], b"", 200);
    s.sigterm(Duration::from_secs(10)).expect("exits");
    let s = Server::spawn_standard(&data, "disk", 2, &[], None);
    let head = expect(&s, "HEAD", "/demo/ev", &[], b"", 200);
    for h in [
        "stream-retained-offset",
        "stream-snapshot-offset",
        "stream-snapshot-digest",
        "stream-record-first",
        "stream-record-next",
        "stream-next-offset",
    ] {
        assert_eq!(head.header(h), head_before.header(h), "{h} after restart");
    }
    let blob = expect(
        &s,
        "GET",
        "/demo/ev/snapshot/00000000000000000018",
        &[],
        b"",
        200,
    );
    assert_eq!(blob.body_str(), r#"{"count":2}"#);
    expect(&s, "GET", "/demo/ev?offset=-1", &[], b"", 410);
    let r = expect(&s, "GET", "/demo/ev?record=2", &[], b"", 200);
    assert_eq!(r.body_str(), "{\"id\":2}\n{\"id\":3}\n");
}

#[test]
fn snapshot_bodies_may_exceed_the_append_limit_up_to_128_mib() {
    let dir = temp_dir("ursula-snapshots-big");
    let s = Server::spawn_standard(&dir.path().join("data"), "memory", 2, &[], None);
    expect(&s, "PUT", "/bigs", &[], b"", 201);
    expect(
        &s,
        "PUT",
        "/bigs/b",
        &[("content-type", "application/octet-stream")],
        b"abc",
        201,
    );
    let big = vec![7u8; 40 << 20];
    let r = expect(
        &s,
        "PUT",
        "/bigs/b/snapshot/00000000000000000003",
        &[],
        &big,
        204,
    );
    assert!(r.header("stream-snapshot-digest").is_some());
    let back = expect(
        &s,
        "GET",
        "/bigs/b/snapshot/00000000000000000003",
        &[],
        b"",
        200,
    );
    assert_eq!(back.body.len(), big.len());
    // Over 128 MiB is refused from the headers alone.
    let mut sock = std::net::TcpStream::connect(&s.addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    sock.write_all(b"PUT /bigs/b/snapshot/00000000000000000003 HTTP/1.1\r\nHost: x\r\nContent-Length: 134217729\r\n\r\n")
        .expect("write");
    let mut buf = [0u8; 64];
    let n = sock.read(&mut buf).expect("read");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Appends keep their 32 MiB limit (answered from the headers, like above).
    let mut sock = std::net::TcpStream::connect(&s.addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    sock.write_all(
        b"POST /bigs/b HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 33554433\r\n\r\n",
    )
    .expect("write");
    let n = sock.read(&mut buf).expect("read");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
}
