//! Process lifecycle: state survives a restart on `--storage disk` (graceful SIGTERM and
//! kill -9), a data dir refuses a different `--cores`, and SIGTERM answers waiting
//! long-polls before exiting 0.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::{offset_token, request, temp_dir, wait_timeout, Response, Server, URSULA_BIN};

const CORES: usize = 2;

fn start(data: &Path) -> Server {
    Server::spawn_standard(data, "disk", CORES, &[], None)
}

fn ok(r: std::io::Result<Response>, status: u16, what: &str) -> Response {
    let r = r.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.status, status, "{what}: {r:?}");
    r
}

/// The identity/metadata headers HEAD reports, for before/after comparison.
fn head_meta(s: &Server, path: &str) -> Vec<(String, Option<String>)> {
    let r = ok(request(&s.addr, "HEAD", path, &[], b""), 200, path);
    assert!(
        r.header("stream-incarnation").is_some(),
        "HEAD must carry Stream-Incarnation: {r:?}"
    );
    [
        "content-type",
        "stream-next-offset",
        "stream-closed",
        "stream-ttl",
        "stream-expires-at",
        "stream-incarnation",
        "stream-retained-offset",
    ]
    .iter()
    .map(|h| (h.to_string(), r.header(h).map(str::to_string)))
    .collect()
}

fn get(s: &Server, path_and_query: &str) -> Response {
    ok(
        request(&s.addr, "GET", path_and_query, &[], b""),
        200,
        path_and_query,
    )
}

const TEXT: &str = "/v1/stream/r-text";
const CLOSED: &str = "/v1/stream/r-closed";
const TTL: &str = "/v1/stream/r-ttl";
const EXP: &str = "/v1/stream/r-exp";
const PROD: &str = "/v1/stream/r-prod";
const JSON: &str = "/v1/stream/r-json";
const BUCKET: &str = "/rbucket";
const BJSON: &str = "/rbucket/events";
const ALL: &[&str] = &[TEXT, CLOSED, TTL, EXP, PROD, JSON, BJSON];

struct Before {
    heads: Vec<Vec<(String, Option<String>)>>,
    bodies: Vec<Vec<u8>>,
    prod_seq1_next: u64,
}

fn populate(s: &Server) -> Before {
    let a = &s.addr;
    let tp = [("Content-Type", "text/plain")];
    ok(request(a, "PUT", TEXT, &tp, b"hello"), 201, "create text");
    ok(
        request(a, "POST", TEXT, &[tp[0], ("Stream-Seq", "005")], b" world"),
        204,
        "seq 005",
    );

    ok(
        request(a, "PUT", CLOSED, &tp, b"final words"),
        201,
        "create closed",
    );
    let r = ok(
        request(a, "POST", CLOSED, &[("Stream-Closed", "true")], b""),
        204,
        "close",
    );
    assert_eq!(r.header("stream-closed"), Some("true"));

    ok(
        request(a, "PUT", TTL, &[tp[0], ("Stream-TTL", "3600")], b"t"),
        201,
        "create ttl",
    );
    ok(
        request(
            a,
            "PUT",
            EXP,
            &[tp[0], ("Stream-Expires-At", "2099-01-01T00:00:00Z")],
            b"e",
        ),
        201,
        "create expires-at",
    );

    let ob = [("Content-Type", "application/octet-stream")];
    ok(request(a, "PUT", PROD, &ob, b""), 201, "create prod");
    let prod = |seq: &str, body: &[u8], status: u16| {
        ok(
            request(
                a,
                "POST",
                PROD,
                &[
                    ob[0],
                    ("Producer-Id", "p1"),
                    ("Producer-Epoch", "3"),
                    ("Producer-Seq", seq),
                ],
                body,
            ),
            status,
            &format!("producer seq {seq}"),
        )
    };
    prod("0", b"AAAA", 200);
    let r1 = prod("1", b"BB", 200);
    let prod_seq1_next = r1.next_offset().unwrap();
    assert_eq!(prod_seq1_next, 6);

    let js = [("Content-Type", "application/json")];
    ok(request(a, "PUT", JSON, &js, b""), 201, "create json");
    ok(
        request(a, "POST", JSON, &js, br#"[{"a": 1}, {"b" : [1, 2]}]"#),
        204,
        "json batch",
    );
    ok(
        request(a, "POST", JSON, &js, br#" {"c":"x y"} "#),
        204,
        "json one",
    );

    ok(request(a, "PUT", BUCKET, &[], b""), 201, "create bucket");
    ok(
        request(a, "PUT", BJSON, &js, br#"[{"k":1},{"k":2}]"#),
        201,
        "create bucketed json",
    );

    let heads = ALL.iter().map(|p| head_meta(s, p)).collect();
    let bodies = ALL
        .iter()
        .map(|p| get(s, &format!("{p}?offset=-1")).body)
        .collect::<Vec<_>>();
    assert_eq!(bodies[0], b"hello world");
    assert_eq!(bodies[5], br#"[{"a":1},{"b":[1,2]},{"c":"x y"}]"#);
    assert_eq!(bodies[6], b"{\"k\":1}\n{\"k\":2}\n");
    Before {
        heads,
        bodies,
        prod_seq1_next,
    }
}

fn verify(s: &Server, before: &Before) {
    let a = &s.addr;
    for (i, p) in ALL.iter().enumerate() {
        assert_eq!(head_meta(s, p), before.heads[i], "HEAD {p} after restart");
        assert_eq!(
            get(s, &format!("{p}?offset=-1")).body,
            before.bodies[i],
            "data of {p} after restart"
        );
    }
    let h = |p: &str, name: &str| {
        head_meta(s, p)
            .into_iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v)
    };
    assert_eq!(h(TTL, "stream-ttl").as_deref(), Some("3600"));
    assert!(h(EXP, "stream-expires-at").is_some());
    assert_eq!(h(CLOSED, "stream-closed").as_deref(), Some("true"));
    assert_eq!(h(JSON, "content-type").as_deref(), Some("application/json"));

    // JSON message boundaries survived: reading from the 2nd message's offset works and a
    // misaligned offset is still rejected on the ds profile.
    let r = get(s, &format!("{JSON}?offset={}", offset_token(8)));
    assert_eq!(r.body, br#"[{"b":[1,2]},{"c":"x y"}]"#);
    let r = ok(
        request(a, "GET", &format!("{JSON}?offset=3"), &[], b""),
        400,
        "misaligned ds JSON offset after restart",
    );
    drop(r);

    // Closed flag: appends are still refused.
    let r = ok(
        request(
            a,
            "POST",
            CLOSED,
            &[("Content-Type", "text/plain")],
            b"more",
        ),
        409,
        "append to closed stream after restart",
    );
    assert_eq!(r.header("stream-closed"), Some("true"));

    // Stream-Seq high-water mark: regression and equal still 409, greater accepted.
    let tp = ("Content-Type", "text/plain");
    for seq in ["004", "005"] {
        let r = ok(
            request(a, "POST", TEXT, &[tp, ("Stream-Seq", seq)], b"!"),
            409,
            &format!("Stream-Seq {seq} after restart"),
        );
        assert_eq!(r.next_offset(), Some(11));
    }
    let r = ok(
        request(a, "POST", TEXT, &[tp, ("Stream-Seq", "006")], b"!"),
        204,
        "Stream-Seq 006 after restart",
    );
    assert_eq!(r.next_offset(), Some(12));

    // Producer state: retry of seq 1 is a duplicate with the original offset; seq 2 new.
    let ob = ("Content-Type", "application/octet-stream");
    let prod = |seq: &str, body: &[u8]| {
        request(
            a,
            "POST",
            PROD,
            &[
                ob,
                ("Producer-Id", "p1"),
                ("Producer-Epoch", "3"),
                ("Producer-Seq", seq),
            ],
            body,
        )
        .unwrap()
    };
    let r = prod("1", b"BB");
    assert_eq!(r.status, 204, "producer retry after restart: {r:?}");
    assert_eq!(r.next_offset(), Some(before.prod_seq1_next));
    assert_eq!(r.header("producer-seq"), Some("1"));
    let r = prod("3", b"gap");
    assert_eq!(r.status, 409, "producer gap after restart: {r:?}");
    assert_eq!(r.header("producer-expected-seq"), Some("2"));
    let r = prod("2", b"C");
    assert_eq!(r.status, 200, "producer next seq after restart: {r:?}");
    assert_eq!(r.next_offset(), Some(7));
    let r = request(
        a,
        "POST",
        PROD,
        &[
            ob,
            ("Producer-Id", "p1"),
            ("Producer-Epoch", "2"),
            ("Producer-Seq", "0"),
        ],
        b"zombie",
    )
    .unwrap();
    assert_eq!(r.status, 403, "stale epoch after restart: {r:?}");
    assert_eq!(get(s, &format!("{PROD}?offset=-1")).body, b"AAAABBC");

    // The bucket still exists and lists its stream.
    let r = get(s, &format!("{BUCKET}/streams"));
    let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).unwrap();
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};
    let ids: Vec<&str> = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["stream_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["events"]);
}

fn restart_keeps_state(graceful: bool) {
    let dir = temp_dir("ursula-restart");
    let data = dir.path().join("data");
    let s = start(&data);
    let before = populate(&s);
    if graceful {
        let st = s
            .sigterm(Duration::from_secs(10))
            .expect("exit after SIGTERM");
        assert!(st.success(), "SIGTERM exit status {st:?}");
    } else {
        s.kill9();
    }
    let s = start(&data);
    verify(&s, &before);

    // And once more, after the post-restart writes, with the other stop mode.
    let before2_heads: Vec<_> = ALL.iter().map(|p| head_meta(&s, p)).collect();
    if graceful {
        s.kill9();
    } else {
        let st = s
            .sigterm(Duration::from_secs(10))
            .expect("exit after SIGTERM");
        assert!(st.success(), "SIGTERM exit status {st:?}");
    }
    let s = start(&data);
    let after2: Vec<_> = ALL.iter().map(|p| head_meta(&s, p)).collect();
    assert_eq!(after2, before2_heads);
    assert_eq!(get(&s, &format!("{PROD}?offset=-1")).body, b"AAAABBC");
    assert_eq!(get(&s, &format!("{TEXT}?offset=-1")).body, b"hello world!");
}

#[test]
fn restart_after_sigterm_keeps_state() {
    restart_keeps_state(true);
}

#[test]
fn restart_after_kill9_keeps_state() {
    restart_keeps_state(false);
}

#[test]
fn incarnation_changes_on_recreate_but_not_on_restart() {
    let dir = temp_dir("ursula-incarnation");
    let data = dir.path().join("data");
    let s = start(&data);
    let p = "/v1/stream/inc";
    let tp = [("Content-Type", "text/plain")];
    ok(request(&s.addr, "PUT", p, &tp, b"1"), 201, "create");
    let inc1 = head_meta(&s, p)[5].1.clone().unwrap();
    ok(request(&s.addr, "DELETE", p, &[], b""), 204, "delete");
    ok(request(&s.addr, "PUT", p, &tp, b"2"), 201, "recreate");
    let inc2 = head_meta(&s, p)[5].1.clone().unwrap();
    assert_ne!(inc1, inc2);
    s.kill9();
    let s = start(&data);
    assert_eq!(head_meta(&s, p)[5].1.clone().unwrap(), inc2);
    assert_eq!(get(&s, &format!("{p}?offset=-1")).body, b"2");
}

#[test]
fn different_cores_than_data_dir_fails_clearly() {
    let dir = temp_dir("ursula-cores");
    let data = dir.path().join("data");
    let s = start(&data);
    ok(
        request(
            &s.addr,
            "PUT",
            "/v1/stream/c",
            &[("Content-Type", "text/plain")],
            b"x",
        ),
        201,
        "create",
    );
    let st = s.sigterm(Duration::from_secs(10)).expect("exit");
    assert!(st.success());

    let err = refused(&data, 1, &[]);
    assert!(
        err.contains("cores") && err.contains(&CORES.to_string()),
        "stderr should explain the cores mismatch: {err:?}"
    );

    // The data dir is untouched: the right core count still works.
    let s = start(&data);
    assert_eq!(get(&s, "/v1/stream/c?offset=-1").body, b"x");
}

/// Start a server on `data` with `cores` cores that must refuse to start without
/// announcing that it listens; its stderr.
fn refused(data: &Path, cores: usize, extra: &[&str]) -> String {
    let args = support::server_args(data, "disk", cores, extra);
    let mut child = Command::new(URSULA_BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Some(st) = wait_timeout(&mut child, Duration::from_secs(20)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "server started with {cores} cores and {extra:?} on {}",
            data.display()
        );
    };
    assert!(!st.success(), "exit status {st:?}");
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        !out.contains("listening"),
        "must not announce listening: {out:?}"
    );
    err
}

/// Create `n` streams, then read each back after a restart (a stream looked for on
/// another core than the one that wrote it would be missing).
fn streams_survive_a_restart(data: &Path, extra: &[&str], n: usize) {
    let s = Server::spawn_standard(data, "disk", CORES, extra, None);
    for i in 0..n {
        ok(
            request(
                &s.addr,
                "PUT",
                &format!("/v1/stream/placed-{i}"),
                &[("Content-Type", "text/plain")],
                format!("body {i}").as_bytes(),
            ),
            201,
            "create",
        );
    }
    assert!(s.sigterm(Duration::from_secs(10)).expect("exit").success());
    let s = Server::spawn_standard(data, "disk", CORES, &[], None);
    for i in 0..n {
        let r = get(&s, &format!("/v1/stream/placed-{i}?offset=-1"));
        assert_eq!(r.status, 200, "stream {i} after restart");
        assert_eq!(r.body, format!("body {i}").as_bytes());
    }
}

#[test]
fn the_data_dir_fixes_its_lanes() {
    let dir = temp_dir("ursula-lanes");

    // A new data dir records the lanes it was created with, and keeps them.
    let data = dir.path().join("new");
    streams_survive_a_restart(&data, &["--lanes", "16"], 40);
    let layout = std::fs::read_to_string(data.join("ursula.layout")).unwrap();
    assert_eq!(layout, "shards=2\nlanes=16\n");
    let err = refused(&data, CORES, &["--lanes", "64"]);
    assert!(
        err.contains("16 lanes") && err.contains("--lanes 16"),
        "{err}"
    );

    // A data dir from before lanes keeps the older placement, and cannot be given lanes.
    let data = dir.path().join("older");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("ursula.layout"), "shards=2\n").unwrap();
    streams_survive_a_restart(&data, &[], 40);
    let layout = std::fs::read_to_string(data.join("ursula.layout")).unwrap();
    assert_eq!(layout, "shards=2\n");
    let err = refused(&data, CORES, &["--lanes", "64"]);
    assert!(err.contains("before lanes"), "{err}");

    // Fewer lanes than cores is refused before anything is written.
    let data = dir.path().join("uneven");
    let err = refused(&data, CORES, &["--lanes", "1"]);
    assert!(err.contains("1 lanes cannot spread over 2 shards"), "{err}");
    assert!(!data.join("ursula.layout").exists());
}

/// The streams `a_log_per_lane_moves_between_core_counts` writes: compat IDs and a
/// bucket's streams, each with its expected body.
fn lane_log_streams(round: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .flat_map(|i| {
            [
                (format!("/v1/stream/{round}-{i}"), format!("{round} {i}\n")),
                (format!("/bucket/{round}-{i}"), format!("{round} b{i}\n")),
            ]
        })
        .collect()
}

fn write_streams(s: &Server, streams: &[(String, String)]) {
    let mut c = s.client();
    for (path, body) in streams {
        let r = c
            .request(
                "PUT",
                path,
                &[("Content-Type", "text/plain")],
                body.as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 201, "create {path}: {}", r.body_str());
        let r = c
            .request(
                "POST",
                path,
                &[("Content-Type", "text/plain")],
                body.as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 204, "append {path}: {}", r.body_str());
    }
}

fn read_streams(s: &Server, streams: &[(String, String)], when: &str) {
    let mut c = s.client();
    for (path, body) in streams {
        let r = c
            .request("GET", &format!("{path}?offset=-1"), &[], b"")
            .unwrap();
        assert_eq!(r.status, 200, "{path} {when}");
        assert_eq!(r.body_str(), format!("{body}{body}"), "{path} {when}");
    }
}

/// With a log per lane, each lane is a shard of its own and any core count up to the lanes
/// opens the data dir: every stream, and every bucket's record, is found after a crash on
/// 2 cores, a restart on 1 (all six logs on one core) and one on 3.
#[test]
fn a_log_per_lane_moves_between_core_counts() {
    let dir = temp_dir("ursula-lane-logs");
    let data = dir.path().join("data");
    let first = lane_log_streams("first", 15);
    let s = Server::spawn_standard(&data, "disk", 2, &["--logs", "lane", "--lanes", "6"], None);
    assert_eq!(
        s.client()
            .request("PUT", "/bucket", &[], b"")
            .unwrap()
            .status,
        201
    );
    write_streams(&s, &first);
    s.kill9();
    let layout = std::fs::read_to_string(data.join("ursula.layout")).unwrap();
    assert_eq!(layout, "shards=6\nlanes=6\nlogs=lane\n");
    for shard in 0..6 {
        assert!(
            data.join(format!("shard-{shard}")).is_dir(),
            "shard-{shard}"
        );
    }

    let s = Server::spawn_standard(&data, "disk", 1, &[], None);
    read_streams(&s, &first, "on 1 core");
    let second = lane_log_streams("second", 10);
    write_streams(&s, &second);
    read_streams(&s, &first, "after new streams on 1 core");
    assert!(s.sigterm(Duration::from_secs(10)).expect("exit").success());

    let s = Server::spawn_standard(&data, "disk", 3, &[], None);
    read_streams(&s, &first, "on 3 cores");
    read_streams(&s, &second, "on 3 cores");
    let r = get(&s, "/bucket/streams");
    assert_eq!(r.status, 200);
    let listing: sonic_rs::Value = sonic_rs::from_slice(&r.body).unwrap();
    assert_eq!(
        listing["stream_count"].as_u64(),
        Some(25),
        "{}",
        r.body_str()
    );
    let r = get(&s, "/__ursula/lanes");
    let lanes: sonic_rs::Value = sonic_rs::from_slice(&r.body).unwrap();
    assert_eq!(lanes["logs"].as_str(), Some("lane"));
    assert_eq!(lanes["cores"].as_u64(), Some(3));
    assert_eq!(lanes["lanes"][5]["shard"].as_u64(), Some(5));
    assert_eq!(lanes["lanes"][5]["core"].as_u64(), Some(2));
    assert!(
        lanes["lanes"][5]["archive"].is_null(),
        "no cold tier, no archive"
    );
    assert!(s.sigterm(Duration::from_secs(10)).expect("exit").success());

    let err = refused(&data, 7, &[]);
    assert!(err.contains("at most --cores 6"), "{err}");
    let err = refused(&data, 2, &["--logs", "core"]);
    assert!(err.contains("a log per lane"), "{err}");
}

#[test]
fn sigterm_answers_waiting_long_poll_and_exits_zero() {
    let dir = temp_dir("ursula-shutdown");
    let data = dir.path().join("data");
    let data_s = data.to_str().unwrap();
    let s = Server::spawn(
        &[
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_s,
            "--storage",
            "disk",
            "--cores",
            "2",
            "--long-poll-timeout-ms",
            "30000",
        ],
        None,
        Duration::from_secs(60),
    );
    let p = "/v1/stream/lp";
    ok(
        request(&s.addr, "PUT", p, &[("Content-Type", "text/plain")], b"abc"),
        201,
        "create",
    );
    let addr = s.addr.clone();
    let poller = thread::spawn(move || {
        let t0 = Instant::now();
        let r = request(
            &addr,
            "GET",
            &format!("{p}?offset={}&live=long-poll", offset_token(3)),
            &[],
            b"",
        );
        (r, t0.elapsed())
    });
    thread::sleep(Duration::from_millis(500));
    assert!(!poller.is_finished(), "long-poll returned before shutdown");
    let t0 = Instant::now();
    let st = s
        .sigterm(Duration::from_secs(5))
        .expect("server must exit within 5 s of SIGTERM");
    assert!(st.success(), "exit status {st:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    let (r, took) = poller.join().unwrap();
    let r = r.expect("the waiting long-poll must get an HTTP answer, not a dropped connection");
    assert!(took < Duration::from_secs(10), "long-poll took {took:?}");
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(r.next_offset(), Some(3));
}

/// An SSE session idle at the tail ends promptly on SIGTERM wherever it runs. A session on
/// a core that does not own its stream may step on the owner once its feed ends, and the
/// owner, with nothing of its own in flight, must still answer then: before, it had
/// stopped running jobs, and the session's core waited out the whole 8 s drain deadline.
/// Which core accepts the connection, and whether the feed ends before the session wakes,
/// are up to the kernel and the wake order, so the case is tried several times.
#[test]
fn sigterm_ends_an_idle_sse_session_promptly_on_any_core() {
    use std::io::Write;
    for round in 0..8 {
        let dir = temp_dir("ursula-sse-shutdown");
        let data = dir.path().join("data");
        let s = Server::spawn_standard(&data, "memory", CORES, &[], None);
        let p = "/v1/stream/sse";
        ok(
            request(&s.addr, "PUT", p, &[("Content-Type", "text/plain")], b"abc"),
            201,
            "create",
        );
        let mut sock = std::net::TcpStream::connect(&s.addr).unwrap();
        sock.write_all(
            format!("GET {p}?offset=-1&live=sse HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let reader = thread::spawn(move || {
            let mut got = Vec::new();
            let _ = sock.read_to_end(&mut got);
            got
        });
        // The session has sent its catch-up and waits at the tail.
        thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let st = s
            .sigterm(Duration::from_secs(10))
            .expect("server must exit after SIGTERM");
        let took = t0.elapsed();
        assert!(st.success(), "round {round}: exit status {st:?}");
        assert!(
            took < Duration::from_secs(3),
            "round {round}: exit took {took:?} with one idle SSE session"
        );
        let got = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.contains("data:abc"), "catch-up delivered: {got}");
        assert!(
            got.ends_with("0\r\n\r\n"),
            "the response ends cleanly: {got:?}"
        );
    }
}
