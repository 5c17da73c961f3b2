//! The command-line client (`ursula ls|stat|cat|tail|append|create|delete|snapshot|retain`,
//! crate `ursula-cli`): the real binary run against a real server, over HTTP, with tokens,
//! and over HTTPS with a self-signed certificate. What the client prints is checked against
//! what the server holds, read with the tests' own HTTP client.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use support::{expect, offset_token, temp_dir, Server, URSULA_BIN};

/// The client's own environment variables, removed from every run so that the machine's
/// settings cannot change what a test sees.
const CLIENT_ENV: [&str; 4] = [
    "URSULA_URL",
    "URSULA_TOKEN",
    "URSULA_TOKEN_FILE",
    "URSULA_CACERT",
];

/// `ursula ARGS --server URL` with `stdin` as standard input.
fn ursula(server: &str, args: &[&str], stdin: &[u8]) -> Output {
    ursula_with(args, &[("URSULA_URL", server)], stdin)
}

/// `ursula ARGS` with exactly the client variables `env`.
fn ursula_with(args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
    let mut cmd = Command::new(URSULA_BIN);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in CLIENT_ENV {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("run ursula");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait for ursula")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Its standard output, after checking that it succeeded.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "ursula failed ({:?}): {}",
        out.status,
        stderr(&out)
    );
    stdout(&out)
}

/// Its one-line error message, after checking that it failed with status 1.
fn fails(out: Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a failure; stdout {:?} stderr {:?}",
        stdout(&out),
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(
        err.starts_with("ursula: ") && err.ends_with('\n'),
        "{err:?}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    err
}

fn json(text: &str) -> Value {
    sonic_rs::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// Each line of `text` as JSON.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(json).collect()
}

fn memory_server(dir: &Path, extra: &[&str]) -> Server {
    Server::spawn_standard(&dir.join("data"), "memory", 2, extra, None)
}

/// A memory server in a new directory named from `prefix`, holding the bucket `logs` and
/// the stream `stream` of type `kind`, both made with the client.
fn server_with_stream(prefix: &str, stream: &str, kind: &str) -> (tempfile::TempDir, Server) {
    let dir = temp_dir(prefix);
    let s = memory_server(dir.path(), &[]);
    ok(ursula(&s.base_url, &["create", "logs"], b""));
    ok(ursula(&s.base_url, &["create", stream, "-t", kind], b""));
    (dir, s)
}

#[test]
fn buckets_and_streams_are_created_listed_and_deleted() {
    let dir = temp_dir("ursula-cli-manage");
    let s = memory_server(dir.path(), &[]);
    let url = s.base_url.as_str();

    assert_eq!(ok(ursula(url, &["ls"], b"")), "BUCKET  STREAMS\n");
    assert_eq!(
        ok(ursula(url, &["create", "logs"], b"")),
        "created bucket logs\n"
    );
    let out = ok(ursula(
        url,
        &[
            "create",
            "logs/app",
            "-t",
            "json",
            "--ttl",
            "1h",
            "--attrs",
            r#"{"title":"App events"}"#,
        ],
        b"",
    ));
    assert_eq!(out, "created stream logs/app (application/json)\n");
    // The same settings again: no change, and said so.
    let same = [
        "create",
        "logs/app",
        "-t",
        "application/json",
        "--ttl",
        "3600",
        "--attrs",
        r#"{"title":"App events"}"#,
        "--json",
    ];
    let out = ok(ursula(url, &same, b""));
    let v = json(&out);
    assert_eq!(v["created"].as_bool(), Some(false), "{out}");
    assert_eq!(v["url"].as_str(), Some(format!("{url}/logs/app").as_str()));
    // Other settings are a conflict, with the server's reason.
    let err = fails(ursula(url, &["create", "logs/app", "-t", "text"], b""));
    assert!(err.contains("stream logs/app: 409 "), "{err}");
    let out = ok(ursula(
        url,
        &["create", "logs/notes", "-t", "text", "--json"],
        b"",
    ));
    let v = json(&out);
    assert_eq!(v["created"].as_bool(), Some(true));
    assert_eq!(v["content_type"].as_str(), Some("text/plain"));
    assert_eq!(v["next_offset"].as_str(), Some(offset_token(0).as_str()));
    // The server has what the client said it made.
    let head = expect(&s, "HEAD", "/logs/app", &[], b"", 200);
    assert_eq!(head.header("stream-ttl"), Some("3600"));
    let attrs = expect(&s, "GET", "/logs/app/attrs", &[], b"", 200);
    assert_eq!(attrs.body_str(), r#"{"title":"App events"}"#);

    ok(ursula(url, &["create", "metrics"], b""));
    let listed = ok(ursula(url, &["ls"], b""));
    assert_eq!(
        listed,
        "BUCKET   STREAMS\nlogs           2\nmetrics        0\n"
    );
    let v = json(&ok(ursula(url, &["ls", "--json"], b"")));
    let buckets = v["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 2);
    assert_eq!(buckets[0]["bucket_id"].as_str(), Some("logs"));
    assert_eq!(buckets[0]["streams"].as_u64(), Some(2));
    // One at a time: the client follows the server's cursor.
    let v = json(&ok(ursula(url, &["ls", "--json", "--limit", "1"], b"")));
    assert_eq!(v["buckets"].as_array().map(|b| b.len()), Some(1));

    let v = json(&ok(ursula(url, &["ls", "logs", "--json"], b"")));
    let ids: Vec<&str> = v["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .filter_map(|e| e["stream_id"].as_str())
        .collect();
    assert_eq!(ids, ["app", "notes"]);
    let table = ok(ursula(url, &["ls", "logs", "--prefix", "no"], b""));
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].starts_with("STREAM  STATUS  CONTENT TYPE"),
        "{table}"
    );
    assert!(rows[1].starts_with("notes   open    text/plain"), "{table}");
    assert!(rows[1].contains(&offset_token(0)), "{table}");

    // A bucket with streams is not deleted; its streams are, then it is.
    let err = fails(ursula(url, &["delete", "logs"], b""));
    assert!(err.contains("bucket logs: 409 bucket_not_empty"), "{err}");
    assert_eq!(
        ok(ursula(url, &["delete", "logs/app"], b"")),
        "deleted stream logs/app\n"
    );
    let v = json(&ok(ursula(url, &["delete", "logs/notes", "--json"], b"")));
    assert_eq!(
        v["deleted"].as_str(),
        Some(format!("{url}/logs/notes").as_str())
    );
    ok(ursula(url, &["delete", "logs"], b""));
    expect(&s, "GET", "/logs", &[], b"", 404);
    let err = fails(ursula(url, &["stat", "logs/app"], b""));
    assert!(
        err.contains("stream logs/app not found (404 bucket_not_found"),
        "{err}"
    );
    let err = fails(ursula(url, &["ls", "logs"], b""));
    assert!(err.contains("bucket logs not found"), "{err}");
    // Settings of a stream given for a bucket are a mistake, said before any request.
    let err = fails(ursula(url, &["create", "other", "-t", "json"], b""));
    assert!(
        err.contains("--content-type is a setting of a stream"),
        "{err}"
    );
}

#[test]
fn json_lines_are_appended_as_records_and_read_back() {
    let (_dir, s) = server_with_stream("ursula-cli-json", "logs/app", "json");
    let url = s.base_url.as_str();

    // Blank lines are skipped; a line that is an array is one record.
    let input = b"{\"n\": 1}\n{\"n\":2}\n\n[3, 4]\n";
    let out = ok(ursula(url, &["append", "logs/app"], input));
    assert_eq!(
        out,
        format!(
            "appended 3 lines to logs/app; next offset {}, next record 3\n",
            offset_token(22)
        )
    );
    let head = expect(&s, "HEAD", "/logs/app", &[], b"", 200);
    assert_eq!(head.header("stream-record-next"), Some("3"));

    assert_eq!(
        ok(ursula(url, &["cat", "logs/app"], b"")),
        "{\"n\":1}\n{\"n\":2}\n[3,4]\n"
    );
    let envelopes = json_lines(&ok(ursula(url, &["cat", "logs/app", "--json"], b"")));
    assert_eq!(envelopes.len(), 3);
    for (i, e) in envelopes.iter().enumerate() {
        assert_eq!(e["record"].as_u64(), Some(i as u64), "{e:?}");
    }
    assert_eq!(envelopes[2]["value"][1].as_u64(), Some(4));
    // Each envelope's offset is where its record starts: reading there gives it first.
    let third = envelopes[2]["offset"].as_str().expect("offset").to_string();
    assert_eq!(third, offset_token(16));
    let r = expect(
        &s,
        "GET",
        &format!("/logs/app?offset={third}"),
        &[],
        b"",
        200,
    );
    assert_eq!(r.body_str(), "[3,4]\n");

    let out = ok(ursula(
        url,
        &["cat", "logs/app", "--record", "1", "--count", "1"],
        b"",
    ));
    assert_eq!(out, "{\"n\":2}\n");
    assert_eq!(
        ok(ursula(url, &["cat", "logs/app", "--last", "1"], b"")),
        "[3,4]\n"
    );
    let out = ok(ursula(url, &["cat", "logs/app", "--offset", "8"], b""));
    assert_eq!(out, "{\"n\":2}\n[3,4]\n");
    // By offset the records are not numbered, but still placed.
    let e = json_lines(&ok(ursula(
        url,
        &["cat", "logs/app", "--offset", "8", "--json"],
        b"",
    )));
    assert_eq!(e[0]["offset"].as_str(), Some(offset_token(8).as_str()));
    assert!(e[0].get("record").is_none(), "{:?}", e[0]);

    // An invalid line: the lines before it are appended, nothing from it on.
    let err = fails(ursula(
        url,
        &["append", "logs/app"],
        b"{\"n\":5}\n{oops\n{\"n\":6}\n",
    ));
    assert!(err.contains("line 2: not one JSON value"), "{err}");
    let head = expect(&s, "HEAD", "/logs/app", &[], b"", 200);
    assert_eq!(head.header("stream-record-next"), Some("4"));

    let v = json(&ok(ursula(url, &["stat", "logs/app", "--json"], b"")));
    assert_eq!(v["stream"].as_str(), Some("logs/app"));
    assert_eq!(v["content_type"].as_str(), Some("application/json"));
    assert_eq!(v["records"]["first"].as_u64(), Some(0));
    assert_eq!(v["records"]["next"].as_u64(), Some(4));
    assert_eq!(v["next_offset"].as_str(), Some(offset_token(30).as_str()));
    assert_eq!(v["retained_bytes"].as_u64(), Some(30));
    assert_eq!(v["closed"].as_bool(), Some(false));
    assert!(
        v["snapshot"].is_null() && v["ttl_seconds"].is_null(),
        "{v:?}"
    );
    assert!(v["created_at_ms"]
        .as_i64()
        .is_some_and(|ms| ms > 1_700_000_000_000));
    assert!(v["last_write_at_ms"].as_i64() >= v["created_at_ms"].as_i64());
    // A snapshot and retention show in the stat, and a read below retention is refused.
    expect(&s, "PUT", "/logs/app/snapshot?record=2", &[], b"{}", 204);
    expect(&s, "PUT", "/logs/app/retention?record=2", &[], b"", 204);
    let human = ok(ursula(url, &["stat", "logs/app"], b""));
    for want in [
        "content type  application/json\n",
        "status        open\n",
        &format!(
            "offsets       {} .. {} (14 bytes retained)\n",
            offset_token(16),
            offset_token(30)
        ),
        "records       2 .. 4 (2 retained)\n",
        "lifetime      kept until deleted\n",
        &format!("snapshot      at {} (digest ", offset_token(16)),
    ] {
        assert!(human.contains(want), "{want:?} in\n{human}");
    }
    let err = fails(ursula(url, &["cat", "logs/app", "--record", "0"], b""));
    assert!(err.contains("stream logs/app from record 0: 410 "), "{err}");
    // Where records are not numbered, asking for one is refused before any read.
    ok(ursula(url, &["create", "logs/notes", "-t", "text"], b""));
    let err = fails(ursula(url, &["cat", "logs/notes", "--last", "2"], b""));
    assert!(
        err.contains("--last needs a stream that numbers its records"),
        "{err}"
    );
}

#[test]
fn stat_lists_the_producers_of_a_stream() {
    let (_dir, s) = server_with_stream("ursula-cli-producers", "logs/app", "text");
    let url = s.base_url.as_str();
    ok(ursula(url, &["create", "logs/quiet", "-t", "text"], b""));
    let produce = |id: &str, epoch: &str, seq: &str, body: &[u8], status: u16| {
        let headers = [
            ("Content-Type", "text/plain"),
            ("Producer-Id", id),
            ("Producer-Epoch", epoch),
            ("Producer-Seq", seq),
        ];
        expect(&s, "POST", "/logs/app", &headers, body, status);
    };
    produce("web-1", "0", "0", b"aa", 200);
    produce("web-1", "0", "1", b"bbb", 200);
    // A retry appends nothing and changes no state.
    produce("web-1", "0", "1", b"bbb", 204);
    produce("web-2", "0", "0", b"c", 200);
    // A new epoch starts again at 0.
    produce("web-2", "1", "0", b"dd", 200);

    let v = json(&ok(ursula(url, &["stat", "logs/app", "--json"], b"")));
    let producers = v["producers"].as_array().expect("producers");
    let got: Vec<(&str, u64, u64, &str, &str)> = producers
        .iter()
        .map(|p| {
            (
                p["producer_id"].as_str().unwrap_or_default(),
                p["epoch"].as_u64().unwrap_or(u64::MAX),
                p["seq"].as_u64().unwrap_or(u64::MAX),
                p["last_append"]["offset"].as_str().unwrap_or_default(),
                p["last_append"]["next_offset"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let (o2, o5, o6, o8) = (
        offset_token(2),
        offset_token(5),
        offset_token(6),
        offset_token(8),
    );
    assert_eq!(
        got,
        [
            ("web-1", 0, 1, o2.as_str(), o5.as_str()),
            ("web-2", 1, 0, o6.as_str(), o8.as_str()),
        ],
        "{v:?}"
    );
    let human = ok(ursula(url, &["stat", "logs/app"], b""));
    let want = format!(
        "producers     web-1 epoch 0 seq 1 (last append {o2} .. {o5})\n              \
         web-2 epoch 1 seq 0 (last append {o6} .. {o8})\n"
    );
    assert!(human.contains(&want), "{want:?} in\n{human}");

    // A stream no producer wrote to has none, said so.
    let v = json(&ok(ursula(url, &["stat", "logs/quiet", "--json"], b"")));
    assert_eq!(v["producers"].as_array().map(|p| p.len()), Some(0), "{v:?}");
    let human = ok(ursula(url, &["stat", "logs/quiet"], b""));
    assert!(human.contains("producers     none\n"), "{human}");
    // The compat surface has no sub-resources: no producers to show.
    ok(ursula(
        url,
        &["create", "/v1/stream/plain", "-t", "text"],
        b"",
    ));
    let v = json(&ok(ursula(
        url,
        &["stat", "/v1/stream/plain", "--json"],
        b"",
    )));
    assert!(v["producers"].is_null(), "{v:?}");

    // The route itself: read-only, and refused for what does not exist.
    let r = expect(&s, "GET", "/logs/app/producers", &[], b"", 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(json(&r.body_str())["producer_count"].as_u64(), Some(2));
    expect(&s, "POST", "/logs/app/producers", &[], b"", 405);
    let r = expect(&s, "GET", "/logs/nope/producers", &[], b"", 404);
    assert!(r.body_str().starts_with("stream_not_found"), "{r:?}");
}

#[test]
fn snapshots_are_published_and_read_and_retention_moves_up_to_them() {
    let (_dir, s) = server_with_stream("ursula-cli-snapshot", "logs/app", "json");
    let url = s.base_url.as_str();
    // Three records of 8 bytes each ({"n":1} and its line feed): 0, 8, 16; the tail at 24.
    ok(ursula(
        url,
        &["append", "logs/app"],
        b"{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n",
    ));

    let err = fails(ursula(url, &["snapshot", "get", "logs/app"], b""));
    assert!(
        err.contains("the snapshot of stream logs/app not found (404 "),
        "{err}"
    );
    // Retention needs a snapshot to cover what it drops.
    let err = fails(ursula(url, &["retain", "logs/app", "--record", "1"], b""));
    assert!(err.contains("stream logs/app: 409 "), "{err}");

    let out = ok(ursula(
        url,
        &["snapshot", "put", "logs/app", "--record", "2", "-t", "json"],
        br#"{"sum":3}"#,
    ));
    let want = format!(
        "published a snapshot of logs/app at offset {} (9 bytes, digest ",
        offset_token(16)
    );
    assert!(out.starts_with(&want), "{out}");
    let head = expect(&s, "HEAD", "/logs/app", &[], b"", 200);
    assert_eq!(
        head.header("stream-snapshot-offset"),
        Some(offset_token(16).as_str())
    );
    let digest = head
        .header("stream-snapshot-digest")
        .expect("digest")
        .to_string();
    assert!(out.contains(&digest), "{out}");

    assert_eq!(
        ok(ursula(url, &["snapshot", "get", "logs/app"], b"")),
        r#"{"sum":3}"#
    );
    let v = json(&ok(ursula(
        url,
        &["snapshot", "get", "logs/app", "--json"],
        b"",
    )));
    assert_eq!(v["offset"].as_str(), Some(offset_token(16).as_str()));
    assert_eq!(v["digest"].as_str(), Some(digest.as_str()));
    assert_eq!(v["content_type"].as_str(), Some("application/json"));
    assert_eq!(v["base64"].as_str(), Some("eyJzdW0iOjN9"));

    // Replacing it only if it is still the one read; an offset given as its number.
    let wrong = [
        "snapshot", "put", "logs/app", "--offset", "24", "--match", "00",
    ];
    let err = fails(ursula(url, &wrong, b"six"));
    assert!(err.contains("stream logs/app: 409 "), "{err}");
    let put = [
        "snapshot", "put", "logs/app", "--offset", "24", "--match", &digest, "--json",
    ];
    let v = json(&ok(ursula(url, &put, b"binary")));
    assert_eq!(v["offset"].as_str(), Some(offset_token(24).as_str()));
    assert_eq!(v["bytes"].as_u64(), Some(6));
    assert_ne!(v["digest"].as_str(), Some(digest.as_str()));
    assert_eq!(
        ok(ursula(url, &["snapshot", "get", "logs/app"], b"")),
        "binary"
    );
    // An older point than the visible snapshot's is stale.
    let err = fails(ursula(
        url,
        &["snapshot", "put", "logs/app", "--record", "1"],
        b"old",
    ));
    assert!(err.contains("stream logs/app: 409 "), "{err}");

    assert_eq!(
        ok(ursula(url, &["retain", "logs/app", "--record", "2"], b"")),
        format!(
            "logs/app now starts at offset {}, record 2\n",
            offset_token(16)
        )
    );
    let v = json(&ok(ursula(
        url,
        &[
            "retain",
            "logs/app",
            "--offset",
            &offset_token(24),
            "--json",
        ],
        b"",
    )));
    assert_eq!(
        v["retained_offset"].as_str(),
        Some(offset_token(24).as_str())
    );
    assert_eq!(v["record_first"].as_u64(), Some(3));
    let head = expect(&s, "HEAD", "/logs/app", &[], b"", 200);
    assert_eq!(
        head.header("stream-retained-offset"),
        Some(offset_token(24).as_str())
    );
    // Retention never moves back; a record it dropped is gone.
    let err = fails(ursula(url, &["retain", "logs/app", "--offset", "16"], b""));
    assert!(err.contains("stream logs/app: 409 "), "{err}");
    let err = fails(ursula(url, &["retain", "logs/app", "--record", "2"], b""));
    assert!(err.contains("stream logs/app: 410 "), "{err}");

    // Points that are not fixed, streams without snapshots, and no point at all.
    let err = fails(ursula(url, &["retain", "logs/app", "--offset", "now"], b""));
    assert!(
        err.contains("--offset now: give the offset itself"),
        "{err}"
    );
    let err = fails(ursula(
        url,
        &["snapshot", "put", "logs/app", "--offset", "-1"],
        b"x",
    ));
    assert!(err.contains("--offset -1: give the offset itself"), "{err}");
    ok(ursula(url, &["create", "/v1/stream/plain"], b""));
    let err = fails(ursula(url, &["snapshot", "get", "/v1/stream/plain"], b""));
    assert!(err.contains("only streams in a bucket"), "{err}");
    let out = ursula(url, &["retain", "logs/app"], b"");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn text_lines_and_compat_streams_read_back_as_written() {
    let (_dir, s) = server_with_stream("ursula-cli-text", "logs/notes", "text");
    let url = s.base_url.as_str();
    // append-batch: one message per line, line end included, so cat gives the input back.
    let input = b"hello\nworld\n\nno newline at the end";
    let out = ok(ursula(url, &["append", "logs/notes"], input));
    assert!(
        out.starts_with("appended 4 lines to logs/notes; next offset "),
        "{out}"
    );
    assert_eq!(
        ok(ursula(url, &["cat", "logs/notes"], b"")).as_bytes(),
        input
    );
    let lines = json_lines(&ok(ursula(url, &["cat", "logs/notes", "--json"], b"")));
    let got: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            let offset = l["offset"].as_str().expect("offset").to_string();
            (offset, l["line"].as_str().expect("line").to_string())
        })
        .collect();
    let want = [
        (0, "hello"),
        (6, "world"),
        (12, ""),
        (13, "no newline at the end"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(o, l)| (offset_token(*o), l.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        ok(ursula(url, &["cat", "logs/notes", "-n", "2"], b"")),
        "hello\nworld\n"
    );

    // The compat surface: no buckets, no record numbers, JSON read as arrays.
    ok(ursula(
        url,
        &["create", "/v1/stream/team/events", "-t", "json"],
        b"",
    ));
    let out = ok(ursula(
        url,
        &["append", "/v1/stream/team/events", "--json"],
        b"{\"a\":1}\n\"two\"\n",
    ));
    let v = json(&out);
    assert_eq!(v["lines"].as_u64(), Some(2));
    assert!(v["next_record"].is_null(), "{v:?}");
    let r = expect(&s, "GET", "/v1/stream/team/events?offset=-1", &[], b"", 200);
    assert_eq!(r.body_str(), "[{\"a\":1},\"two\"]");
    let e = json_lines(&ok(ursula(
        url,
        &["cat", "v1/stream/team/events", "--json"],
        b"",
    )));
    assert_eq!(e.len(), 2);
    assert_eq!(e[1]["offset"].as_str(), Some(offset_token(8).as_str()));
    assert_eq!(e[1]["value"].as_str(), Some("two"));
    let human = ok(ursula(url, &["stat", "/v1/stream/team/events"], b""));
    assert!(
        human.contains(&format!("url           {url}/v1/stream/team/events\n")),
        "{human}"
    );
    assert!(!human.contains("records"), "{human}");
    // Text on the compat surface goes one POST per line.
    ok(ursula(
        url,
        &["create", "/v1/stream/plain", "-t", "text"],
        b"",
    ));
    ok(ursula(url, &["append", "/v1/stream/plain"], b"a\nb\n"));
    assert_eq!(ok(ursula(url, &["cat", "/v1/stream/plain"], b"")), "a\nb\n");
    // A binary stream's bytes come out as they are.
    ok(ursula(url, &["create", "logs/blob", "-t", "binary"], b""));
    expect(
        &s,
        "POST",
        "/logs/blob",
        &[("Content-Type", "application/octet-stream")],
        b"\x00\x01\xff",
        204,
    );
    let out = ursula(url, &["cat", "logs/blob"], b"");
    assert!(out.status.success());
    assert_eq!(out.stdout, b"\x00\x01\xff");
    let e = json(&ok(ursula(url, &["cat", "logs/blob", "--json"], b"")));
    assert_eq!(e["base64"].as_str(), Some("AAH/"));
    let err = fails(ursula(url, &["cat", "logs/blob", "--count", "1"], b""));
    assert!(err.contains("--count counts records or lines"), "{err}");
}

/// `ursula tail` as a child whose output lines arrive on a channel.
fn spawn_tail(server: &str, args: &[&str]) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut cmd = Command::new(URSULA_BIN);
    cmd.arg("tail")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in CLIENT_ENV {
        cmd.env_remove(name);
    }
    let mut child = cmd
        .env("URSULA_URL", server)
        .spawn()
        .expect("run ursula tail");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

/// Wait up to `within` for `child` to exit; its status, or `None`.
fn exited(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    support::wait_timeout(child, within)
}

#[test]
fn tail_prints_appends_as_they_arrive() {
    let dir = temp_dir("ursula-cli-tail");
    // The test servers' long-poll lasts 500 ms: the tail waits in several polls between
    // appends.
    let s = memory_server(dir.path(), &[]);
    let url = s.base_url.as_str();
    ok(ursula(url, &["create", "logs"], b""));
    ok(ursula(url, &["create", "logs/live", "-t", "json"], b""));
    ok(ursula(url, &["append", "logs/live"], b"{\"old\":true}\n"));

    // From now on only: the record already there is not printed.
    let (mut tail, lines) = spawn_tail(url, &["logs/live", "--count", "3", "--json"]);
    let ct = [("Content-Type", "application/json")];
    let mut appended = 0;
    let started = Instant::now();
    while exited(&mut tail, Duration::from_millis(200)).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "tail did not stop after 3 records"
        );
        appended += 1;
        expect(
            &s,
            "POST",
            "/logs/live",
            &ct,
            format!("{{\"n\":{appended}}}").as_bytes(),
            204,
        );
    }
    let status = tail.wait().expect("tail status");
    assert!(status.success(), "{status:?}");
    let printed: Vec<Value> = (0..3)
        .map(|_| {
            json(
                &lines
                    .recv_timeout(Duration::from_secs(10))
                    .expect("a record"),
            )
        })
        .collect();
    assert!(
        lines.recv_timeout(Duration::from_millis(100)).is_err(),
        "more than 3 lines"
    );
    assert_eq!(printed.len(), 3, "{printed:?}");
    // Consecutive records, none of them the old one, each the append it says it is.
    let first = printed[0]["record"].as_u64().expect("record");
    assert!(first >= 1, "{printed:?}");
    for (i, e) in printed.iter().enumerate() {
        assert_eq!(e["record"].as_u64(), Some(first + i as u64), "{printed:?}");
        assert_eq!(
            e["value"]["n"].as_u64(),
            Some(first + i as u64),
            "{printed:?}"
        );
    }
    assert!(appended >= 3, "{appended} appends");

    // A quiet stream: the timeout ends the tail, successfully and with nothing printed.
    let started = Instant::now();
    let out = ursula(url, &["tail", "logs/live", "--timeout", "1s"], b"");
    let took = started.elapsed();
    assert_eq!(ok(out), "");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "{took:?}"
    );

    // A text stream, fed by `ursula append` while it is tailed; closing the stream ends it.
    ok(ursula(url, &["create", "logs/text", "-t", "text"], b""));
    let (mut tail, lines) = spawn_tail(url, &["logs/text", "--timeout", "30s"]);
    std::thread::sleep(Duration::from_millis(500));
    ok(ursula(url, &["append", "logs/text"], b"first\nsecond\n"));
    let got: Vec<String> = (0..2)
        .map(|_| {
            lines
                .recv_timeout(Duration::from_secs(10))
                .expect("a line from tail")
        })
        .collect();
    assert_eq!(got, ["first", "second"]);
    expect(
        &s,
        "POST",
        "/logs/text",
        &[("Stream-Closed", "true")],
        b"",
        204,
    );
    let status =
        exited(&mut tail, Duration::from_secs(10)).expect("tail ends when the stream closes");
    assert!(status.success(), "{status:?}");
}

/// `read:` and `write:` tokens for `--auth-token-file`.
const READ_TOKEN: &str = "read-token-0123456789";
const WRITE_TOKEN: &str = "write-token-0123456789";

#[test]
fn tokens_are_sent_and_refusals_explained() {
    let dir = temp_dir("ursula-cli-auth");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("read:{READ_TOKEN}\nwrite:{WRITE_TOKEN}\n")).expect("write");
    let s = memory_server(
        dir.path(),
        &["--auth-token-file", tokens.to_str().expect("utf-8")],
    );
    let url = s.base_url.as_str();

    let err = fails(ursula(url, &["ls"], b""));
    assert!(err.contains("requires a token: pass --token"), "{err}");
    let err = fails(ursula(
        url,
        &["ls", "--token", "wrong-token-0123456789"],
        b"",
    ));
    assert!(
        err.contains("did not accept the token (401 unauthorized"),
        "{err}"
    );

    // A write token from a file creates; a read token from the environment reads only.
    let write_file = dir.path().join("write-token");
    std::fs::write(&write_file, format!("# ingest\n{WRITE_TOKEN}\n")).expect("write");
    let write_file = write_file.to_str().expect("utf-8");
    ok(ursula(
        url,
        &["create", "logs", "--token-file", write_file],
        b"",
    ));
    let as_reader = [("URSULA_URL", url), ("URSULA_TOKEN", READ_TOKEN)];
    assert_eq!(
        ok(ursula_with(&["ls"], &as_reader, b"")),
        "BUCKET  STREAMS\nlogs          0\n"
    );
    let err = fails(ursula_with(&["create", "logs/app"], &as_reader, b""));
    assert!(
        err.contains("a read token can only read (403 forbidden"),
        "{err}"
    );
    // A flag wins over the environment.
    ok(ursula_with(
        &["create", "logs/app", "--token", WRITE_TOKEN],
        &as_reader,
        b"",
    ));
    let via_file = [("URSULA_URL", url), ("URSULA_TOKEN_FILE", write_file)];
    ok(ursula_with(&["append", "logs/app"], &via_file, b"x\n"));
    assert_eq!(
        ok(ursula_with(&["cat", "logs/app"], &as_reader, b"")),
        "x\n"
    );
    // The producer listing is a read: a read token sees it, no token does not.
    let human = ok(ursula_with(&["stat", "logs/app"], &as_reader, b""));
    assert!(human.contains("producers     none\n"), "{human}");
    expect(&s, "GET", "/logs/app/producers", &[], b"", 401);
}

/// A self-signed certificate for 127.0.0.1 and localhost, as PEM files.
fn write_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("generate certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
    (cert, key)
}

/// A self-signed certificate for 127.0.0.1 that says it is a CA, as PEM files.
fn write_ca_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed");
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

#[test]
fn https_with_a_self_signed_certificate_needs_it_as_the_ca() {
    let dir = temp_dir("ursula-cli-tls");
    let (cert, key) = write_cert(dir.path());
    let (cert, key) = (cert.to_str().expect("utf-8"), key.to_str().expect("utf-8"));
    let s = memory_server(dir.path(), &["--tls-cert", cert, "--tls-key", key]);
    assert!(s.base_url.starts_with("https://"), "{}", s.base_url);
    let url = s.base_url.as_str();

    // The system's roots are replaced by another CA's certificate, so that what the
    // client trusts without --cacert does not depend on the machine.
    // (Its own subject name: rcgen gives every certificate the same one by default, and a
    // root with the server certificate's issuer name would be tried, failing its signature.)
    let other_ca = dir.path().join("other-ca.pem");
    let mut other = rcgen::CertificateParams::new(vec!["ca.example".to_string()]).expect("params");
    other
        .distinguished_name
        .push(rcgen::DnType::CommonName, "another CA");
    let other_key = rcgen::KeyPair::generate().expect("key");
    let other = other.self_signed(&other_key).expect("self-signed");
    std::fs::write(&other_ca, other.pem()).expect("write");
    let untrusting = [
        ("URSULA_URL", url),
        ("SSL_CERT_FILE", other_ca.to_str().expect("utf-8")),
    ];
    let err = fails(ursula_with(&["ls"], &untrusting, b""));
    assert!(
        err.contains(&format!("TLS with {url} failed: invalid peer certificate")),
        "{err}"
    );
    assert!(err.contains("pass it with --cacert"), "{err}");

    ok(ursula(url, &["create", "secure", "--cacert", cert], b""));
    let trusted = [("URSULA_URL", url), ("URSULA_CACERT", cert)];
    ok(ursula_with(
        &["create", "secure/app", "-t", "json"],
        &trusted,
        b"",
    ));
    ok(ursula_with(
        &["append", "secure/app"],
        &trusted,
        b"{\"tls\":true}\n",
    ));
    assert_eq!(
        ok(ursula_with(&["cat", "secure/app"], &trusted, b"")),
        "{\"tls\":true}\n"
    );
    let out = ok(ursula_with(
        &["tail", "secure/app", "--last", "1", "--count", "1"],
        &trusted,
        b"",
    ));
    assert_eq!(out, "{\"tls\":true}\n");
    // A self-signed certificate made as a CA (what `openssl req -x509` makes by default)
    // is refused as a server's own even when trusted; the error says what to change.
    let ca_dir = dir.path().join("as-ca");
    std::fs::create_dir(&ca_dir).expect("mkdir");
    let (ca_cert, ca_key) = write_ca_cert(&ca_dir);
    let (ca_cert, ca_key) = (
        ca_cert.to_str().expect("utf-8"),
        ca_key.to_str().expect("utf-8"),
    );
    let as_ca = memory_server(&ca_dir, &["--tls-cert", ca_cert, "--tls-key", ca_key]);
    let err = fails(ursula(&as_ca.base_url, &["ls", "--cacert", ca_cert], b""));
    assert!(err.contains("must say basicConstraints CA:FALSE"), "{err}");
    // By name too: the certificate names localhost.
    let by_name = url.replace("127.0.0.1", "localhost");
    let v = json(&ok(ursula_with(
        &["ls", "--json", "--server", &by_name, "--cacert", cert],
        &[],
        b"",
    )));
    assert_eq!(v["buckets"][0]["bucket_id"].as_str(), Some("secure"));
}

#[test]
fn unreachable_servers_and_bad_names_are_explained() {
    // Bound and closed again: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let err = fails(ursula(&url, &["ls"], b""));
    assert!(
        err.contains(&format!("cannot reach the server at {url}: ")),
        "{err}"
    );
    let err = fails(ursula(&url, &["ls", "--server", "ftp://x"], b""));
    assert!(err.contains("invalid server URL \"ftp://x\""), "{err}");
    let err = fails(ursula(&url, &["stat", "logs"], b""));
    assert!(
        err.contains("expected a stream: BUCKET/STREAM or /v1/stream/ID"),
        "{err}"
    );
    let err = fails(ursula(&url, &["cat", "logs/a/b"], b""));
    assert!(err.contains("has no '/' in its name"), "{err}");
    // A missing token file is named before any connection is tried.
    let err = fails(ursula(
        &url,
        &["ls", "--token-file", "/nonexistent/token"],
        b"",
    ));
    assert!(
        err.contains("cannot read the token file /nonexistent/token"),
        "{err}"
    );
}
