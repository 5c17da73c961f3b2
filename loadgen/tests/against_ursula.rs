//! Runs `ursula-loadgen` against the real `ursula` binary (memory storage) and checks
//! that the reports are sane: `verify` passes, short `write` and `read` runs have
//! throughput and no errors, `append-max` sees the 413.
//!
//! The server binary is taken from `$URSULA_BIN`, else from the cargo target directory
//! this test runs from (`cargo build -p ursula-server` / `--release` puts it there).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const LOADGEN: &str = env!("CARGO_BIN_EXE_ursula-loadgen");

fn ursula_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("URSULA_BIN") {
        return PathBuf::from(p);
    }
    // .../target/<profile>/deps/against_ursula-HASH → .../target/<profile>/ursula
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile dir");
    let mut candidates = vec![profile_dir.join("ursula")];
    if let Some(target) = profile_dir.parent() {
        candidates.push(target.join("release").join("ursula"));
        candidates.push(target.join("debug").join("ursula"));
    }
    for c in &candidates {
        if c.is_file() {
            return c.clone();
        }
    }
    panic!(
        "ursula binary not found (tried {candidates:?}); run `cargo build -p ursula-server` \
         (or --release) first, or set URSULA_BIN"
    );
}

struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    /// With `extra` flags for `ursula server`.
    fn start_with(extra: &[&str]) -> Server {
        let bin = ursula_bin();
        let mut child = Command::new(&bin)
            .args(["server", "--listen", "127.0.0.1:0", "--storage", "memory"])
            .args(["--long-poll-timeout-ms", "500"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let mut sent = false;
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !sent => {
                        let _ = tx.send(line.trim_end().to_string());
                        sent = true;
                    }
                    Ok(_) => {}
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ursula did not start");
            }
        };
        let base = line
            .strip_prefix("ursula listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim_end_matches('/')
            .to_string();
        Server { child, base }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the loadgen, returns (exit code, parsed JSON report).
fn loadgen(dir: &Path, name: &str, args: &[&str]) -> (i32, sonic_rs::Value) {
    let json = dir.join(format!("{name}.json"));
    let out = Command::new(LOADGEN)
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ursula-loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {name}\n{stdout}{stderr}");
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("{name}: no report ({e}); stderr: {stderr}"));
    let v: sonic_rs::Value = sonic_rs::from_str(&text).expect("report is JSON");
    (out.status.code().unwrap_or(-1), v)
}

fn num(v: &sonic_rs::Value, path: &[&str]) -> f64 {
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};
    let mut cur = v;
    for p in path {
        cur = cur
            .as_object()
            .and_then(|o| o.get(p))
            .unwrap_or_else(|| panic!("report lacks {path:?}"));
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number"))
}

fn is_true(v: &sonic_rs::Value, key: &str) -> bool {
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};
    v.as_object()
        .and_then(|o| o.get(&key))
        .and_then(|x| x.as_bool())
        == Some(true)
}

#[test]
fn scenarios_against_real_server() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let t = server.base.as_str();

    // verify: byte-exact, both surfaces.
    for surface in ["compat", "bucketed"] {
        let (code, r) = loadgen(
            dir.path(),
            &format!("verify-{surface}"),
            &[
                "verify",
                "--target",
                t,
                "--surface",
                surface,
                "--streams",
                "3",
                "--appends",
                "40",
                "--max-payload",
                "20k",
                "--page-bytes",
                "7000",
            ],
        );
        assert_eq!(code, 0, "verify on {surface} failed");
        assert!(is_true(&r, "ok"));
        assert_eq!(num(&r, &["error_total"]), 0.0);
        assert_eq!(num(&r, &["ops"]), 120.0);
        assert!(num(&r, &["counters", "bytes_verified"]) > 0.0);
    }

    // write: throughput, percentiles ordered, no errors.
    let write_svg = dir.path().join("write.svg");
    let (code, r) = loadgen(
        dir.path(),
        "write",
        &[
            "write",
            "--target",
            t,
            "--streams",
            "8",
            "--payload",
            "256",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--cores",
            "2",
            "--svg",
            write_svg.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(num(&r, &["error_total"]), 0.0);
    assert!(num(&r, &["ops_per_sec"]) > 0.0);
    assert!(num(&r, &["mb_per_sec"]) > 0.0);
    // The client's own CPU over the window: some, and no more than its two cores' worth.
    let client_cpu_s = num(&r, &["client_cpu_us_per_op"]) * num(&r, &["ops"]) / 1e6;
    assert!(
        client_cpu_s > 0.0 && client_cpu_s <= 2.0 * num(&r, &["duration_s"]) + 0.05,
        "client CPU {client_cpu_s} s over the window"
    );
    // --svg drew the latency curve; `chart` overlays reports.
    let svg = std::fs::read_to_string(&write_svg).expect("--svg wrote the chart");
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "{svg}"
    );
    let overlay = dir.path().join("overlay.svg");
    let report = dir.path().join("write.json");
    let status = Command::new(LOADGEN)
        .arg("chart")
        .arg("--out")
        .arg(&overlay)
        .arg(format!("a={}", report.display()))
        .arg(format!("b={}", report.display()))
        .status()
        .expect("run chart");
    assert!(status.success());
    let overlay = std::fs::read_to_string(&overlay).expect("chart written");
    assert_eq!(overlay.matches("<polyline").count(), 2);
    let p50 = num(&r, &["latency", "p50_ms"]);
    let p99 = num(&r, &["latency", "p99_ms"]);
    let max = num(&r, &["latency", "max_ms"]);
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{p50} {p99} {max}");
    assert_eq!(num(&r, &["ops"]), num(&r, &["latency", "count"]));
    assert_eq!(num(&r, &["bytes"]), num(&r, &["ops"]) * 256.0);

    // read: catch-up reads up to the 8 MiB cap, following Stream-Next-Offset.
    let (code, r) = loadgen(
        dir.path(),
        "read",
        &[
            "read",
            "--target",
            t,
            "--streams",
            "2",
            "--prefill",
            "10m",
            "--append-size",
            "1m",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(num(&r, &["error_total"]), 0.0);
    assert!(num(&r, &["mb_per_sec"]) > 0.0);
    assert!(num(&r, &["counters", "full_passes"]) > 0.0);

    // read by record ordinals (and as envelopes) on the bucketed surface.
    for view in ["records", "envelope", "ndjson"] {
        let (code, r) = loadgen(
            dir.path(),
            &format!("read-{view}"),
            &[
                "read",
                "--target",
                t,
                "--surface",
                "bucketed",
                "--view",
                view,
                "--streams",
                "1",
                "--prefill",
                "2m",
                "--append-size",
                "256k",
                "--duration",
                "1s",
                "--warmup",
                "200ms",
            ],
        );
        assert_eq!(code, 0, "{view}");
        assert_eq!(num(&r, &["error_total"]), 0.0, "{view}");
        assert!(num(&r, &["counters", "full_passes"]) > 0.0, "{view}");
    }

    // append-max: the limit is accepted, limit + 1 is refused with 413.
    let (code, r) = loadgen(
        dir.path(),
        "append-max",
        &[
            "append-max",
            "--target",
            t,
            "--writers",
            "1",
            "--duration",
            "1s",
            "--warmup",
            "0s",
            "--max-total",
            "64m",
        ],
    );
    assert_eq!(code, 0, "append-max checks failed");
    assert!(is_true(&r, "ok"));
    assert!(num(&r, &["ops"]) >= 1.0);

    // tail: every published event reaches every long-poll reader.
    let (code, r) = loadgen(
        dir.path(),
        "tail",
        &[
            "tail",
            "--target",
            t,
            "--readers",
            "4",
            "--rate",
            "40",
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--grace",
            "1s",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(num(&r, &["error_total"]), 0.0);
    assert!(num(&r, &["counters", "published"]) > 0.0);
    assert_eq!(num(&r, &["counters", "missed_deliveries"]), 0.0);
    assert_eq!(
        num(&r, &["ops"]),
        num(&r, &["counters", "expected_deliveries"])
    );

    // replay: each replay returns the whole pre-filled stream.
    let (code, r) = loadgen(
        dir.path(),
        "replay",
        &[
            "replay",
            "--target",
            t,
            "--clients",
            "5",
            "--events",
            "50",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(num(&r, &["error_total"]), 0.0);
    assert!(num(&r, &["ops"]) > 0.0);
    assert_eq!(num(&r, &["bytes"]), num(&r, &["ops"]) * 50.0 * 1024.0);

    // head: metadata requests complete with 200 and no errors.
    let (code, r) = loadgen(
        dir.path(),
        "head",
        &[
            "head",
            "--target",
            t,
            "--connections",
            "8",
            "--streams",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(num(&r, &["error_total"]), 0.0);
    assert!(num(&r, &["ops"]) > 0.0);
    assert_eq!(num(&r, &["ops"]), num(&r, &["requests"]));

    // batch: events through append-batch frames (bucketed) and JSON arrays (compat).
    for surface in ["bucketed", "compat"] {
        let (code, r) = loadgen(
            dir.path(),
            &format!("batch-{surface}"),
            &[
                "batch",
                "--target",
                t,
                "--surface",
                surface,
                "--connections",
                "4",
                "--events",
                "50",
                "--event-size",
                "200",
                "--duration",
                "1s",
                "--warmup",
                "200ms",
            ],
        );
        assert_eq!(code, 0, "batch on {surface}");
        assert_eq!(num(&r, &["error_total"]), 0.0, "batch on {surface}");
        assert!(num(&r, &["ops"]) > 0.0, "batch on {surface}");
        assert_eq!(num(&r, &["ops"]), num(&r, &["requests"]) * 50.0);
        assert_eq!(num(&r, &["bytes"]), num(&r, &["ops"]) * 200.0);
        assert!(num(&r, &["mb_per_sec"]) > 0.0);
    }

    // fanout: every published event reaches every SSE subscriber, on both surfaces.
    for surface in ["compat", "bucketed"] {
        let (code, r) = loadgen(
            dir.path(),
            &format!("fanout-{surface}"),
            &[
                "fanout",
                "--target",
                t,
                "--surface",
                surface,
                "--subscribers",
                "20",
                "--rate",
                "20",
                "--duration",
                "2s",
                "--warmup",
                "300ms",
                "--grace",
                "2s",
            ],
        );
        assert_eq!(code, 0, "fanout on {surface}");
        assert_eq!(num(&r, &["error_total"]), 0.0, "fanout on {surface}");
        let published = num(&r, &["counters", "published"]);
        assert!(published > 0.0, "fanout on {surface}");
        assert!(num(&r, &["ops"]) > 0.0);
        assert_eq!(
            num(&r, &["counters", "missed_deliveries"]),
            0.0,
            "{surface}"
        );
        assert_eq!(num(&r, &["ops"]), published * 20.0, "fanout on {surface}");
    }
}

/// GET `path` on `base` (`http://host:port`) over a fresh connection: (status, body).
fn get(base: &str, path: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let hostport = base.strip_prefix("http://").expect("plain http base");
    let mut s = std::net::TcpStream::connect(hostport).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length in {head}"));
    let body = raw[split + 4..].to_vec();
    assert_eq!(body.len(), length, "body of {path}");
    (status, body)
}

/// `write --rate` offers a fixed load: the appends counted are the ones due in the window,
/// the rate times the window (not as many as the server takes), every one of them sent, and
/// the report says the load held.
#[test]
fn a_paced_write_sends_the_offered_load() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let t = server.base.as_str();
    for (shape, extra) in [
        ("one", &[][..]),
        ("three-per-stream", &["--connections", "24"][..]),
        ("spread", &["--spread", "--connections", "4"][..]),
    ] {
        let mut args = vec![
            "write",
            "--target",
            t,
            "--streams",
            "8",
            "--rate",
            "400",
            "--duration",
            "2s",
            "--warmup",
            "300ms",
            "--cores",
            "2",
            "--prefix",
            "paced",
            "--run-id",
            shape,
        ];
        args.extend_from_slice(extra);
        let (code, r) = loadgen(dir.path(), &format!("write-rate-{shape}"), &args);
        assert_eq!(code, 0, "{shape}: the offered load did not hold");
        assert!(is_true(&r, "ok"));
        assert_eq!(num(&r, &["error_total"]), 0.0);
        // 400/s over 2 s: counted by when they were due, so exactly 800.
        assert_eq!(num(&r, &["counters", "due"]), 800.0, "{shape}");
        assert_eq!(num(&r, &["counters", "unsent"]), 0.0, "{shape}");
        assert_eq!(num(&r, &["ops"]), 800.0, "{shape}");
        assert!(num(&r, &["counters", "late"]) >= num(&r, &["counters", "late_no_connection"]));
    }
}

/// An open loop does not wait for answers: with appends due faster than its connections
/// can carry them, the appends wait for a connection, count as late, and are timed from
/// when they were due, so the wait shows in the latency.
#[test]
fn a_paced_write_beyond_its_connections_counts_late_appends() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, r) = loadgen(
        dir.path(),
        "write-rate-short",
        &[
            "write",
            "--target",
            &server.base,
            "--streams",
            "1",
            "--cores",
            "1",
            // One connection cannot carry a million appends a second on any host.
            "--rate",
            "1000000",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert_eq!(code, 1, "the offered load cannot have held");
    assert!(!is_true(&r, "ok"));
    let due = num(&r, &["counters", "due"]);
    assert_eq!(due, 1_000_000.0);
    let sent = num(&r, &["ops"]) + num(&r, &["error_total"]);
    let unsent = num(&r, &["counters", "unsent"]);
    assert!(unsent > 0.0);
    assert_eq!(sent + unsent, due);
    assert_eq!(num(&r, &["counters", "late_no_connection"]), sent);
    // Every append due in the window is in the latencies, the unsent ones with their wait
    // at the window's end (at most 1 s, the window's length; half of them over 0.5 s).
    assert_eq!(num(&r, &["latency", "count"]), num(&r, &["ops"]) + unsent);
    assert!(num(&r, &["latency", "p50_ms"]) > 400.0);
}

/// Appends the server refuses are reported by status: a server holding fewer connections
/// than the pool opens answers the others 503 (with Retry-After) and closes them.
#[test]
fn refused_appends_are_counted_by_status() {
    let server = Server::start_with(&["--cores", "1", "--max-connections", "2"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, r) = loadgen(
        dir.path(),
        "write-refused",
        &[
            "write",
            "--target",
            &server.base,
            "--streams",
            "2",
            "--spread",
            "--connections",
            "8",
            "--rate",
            "400",
            "--cores",
            "1",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    let refused = num(&r, &["non_2xx", "503"]);
    assert!(refused > 0.0, "no 503 counted");
    assert!(
        num(&r, &["ops"]) > 0.0,
        "the connections within the limit wrote"
    );
    assert!(num(&r, &["error_total"]) >= refused);
}

/// The gateway shape: a pool of fewer connections than streams still writes every stream,
/// with whole appends only, on both write scenarios.
#[test]
fn spread_pool_writes_every_stream() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let t = server.base.as_str();
    let streams = 7;

    let (code, r) = loadgen(
        dir.path(),
        "write-spread",
        &[
            "write",
            "--target",
            t,
            "--spread",
            "--connections",
            "3",
            "--streams",
            "7",
            "--payload",
            "256",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--cores",
            "2",
            "--prefix",
            "gw",
            "--run-id",
            "pool",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(num(&r, &["error_total"]), 0.0);
    let measured = num(&r, &["bytes"]);
    assert!(measured > 0.0);
    assert_eq!(measured, num(&r, &["ops"]) * 256.0);
    let mut stored = 0usize;
    for i in 0..streams {
        let (status, body) = get(t, &format!("/v1/stream/gw-write-pool-{i}?offset=-1"));
        assert_eq!(status, 200, "stream {i}");
        assert!(!body.is_empty(), "stream {i} got no appends");
        assert_eq!(body.len() % 256, 0, "stream {i} holds a partial append");
        stored += body.len();
    }
    // The warm-up's appends are stored but not counted.
    assert!(stored as f64 >= measured, "{stored} < {measured}");

    // batch: JSON arrays (compat) and append-batch frames (bucketed), over a pool.
    for surface in ["compat", "bucketed"] {
        let run_id = format!("pool{surface}");
        let (code, r) = loadgen(
            dir.path(),
            &format!("batch-spread-{surface}"),
            &[
                "batch",
                "--target",
                t,
                "--surface",
                surface,
                "--spread",
                "--connections",
                "2",
                "--streams",
                "5",
                "--events",
                "10",
                "--event-size",
                "64",
                "--duration",
                "1s",
                "--warmup",
                "200ms",
                "--prefix",
                "gw",
                "--run-id",
                &run_id,
            ],
        );
        assert_eq!(code, 0, "batch --spread on {surface}");
        assert_eq!(num(&r, &["error_total"]), 0.0, "{surface}");
        assert!(num(&r, &["ops"]) > 0.0, "{surface}");
        assert_eq!(num(&r, &["ops"]), num(&r, &["requests"]) * 10.0);
        for i in 0..5 {
            let path = match surface {
                "compat" => format!("/v1/stream/gw-batch-{run_id}-{i}?offset=-1"),
                _ => format!("/loadgen/gw-batch-{run_id}-{i}?offset=-1"),
            };
            let (status, body) = get(t, &path);
            assert_eq!(status, 200, "{path}");
            // The compat surface reads a JSON stream back as one array; the bucketed
            // surface as one event per line.
            let events: Vec<sonic_rs::Value> = match surface {
                "compat" => sonic_rs::from_slice(&body).unwrap_or_else(|e| panic!("{path}: {e}")),
                _ => body
                    .split(|&b| b == b'\n')
                    .filter(|line| !line.is_empty())
                    .map(|line| {
                        sonic_rs::from_slice(line).unwrap_or_else(|e| panic!("{path}: {e}"))
                    })
                    .collect(),
            };
            assert!(!events.is_empty(), "{path} got no events");
            assert_eq!(events.len() % 10, 0, "{path} holds a partial batch");
        }
    }
}

/// `--cpus` pins the client threads to the CPUs given (one thread per CPU unless --cores
/// says otherwise), so a comparison can keep the client off the server's CPUs.
#[test]
fn client_threads_pin_to_the_cpus_given() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
    let last = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|list| list.trim().rsplit([',', '-']).next().map(str::to_owned))
        .expect("Cpus_allowed_list");
    let json = dir.path().join("pinned.json");
    let mut child = Command::new(LOADGEN)
        .args(["write", "--target", server.base.as_str(), "--streams", "2"])
        .args([
            "--duration",
            "1500ms",
            "--warmup",
            "200ms",
            "--cpus",
            last.as_str(),
        ])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run ursula-loadgen");
    std::thread::sleep(Duration::from_millis(700));
    let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id())).expect("tasks");
    let allowed: Vec<String> = tasks
        .flatten()
        .filter(|t| {
            // The client threads are loadgen-0, loadgen-1, ...
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| {
                c.trim()
                    .strip_prefix("loadgen-")
                    .is_some_and(|n| n.parse::<usize>().is_ok())
            })
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|l| l.trim().to_owned())
        })
        .collect();
    let exit = child.wait().expect("wait for ursula-loadgen");
    assert!(exit.success(), "ursula-loadgen failed");
    assert_eq!(allowed, vec![last.clone()], "the client threads' CPUs");
    let report: sonic_rs::Value =
        sonic_rs::from_str(&std::fs::read_to_string(&json).expect("report")).expect("JSON");
    assert_eq!(
        num(&report, &["cores"]),
        1.0,
        "one client thread per CPU given"
    );
}

/// `--window-marks` creates PATH.start when the measured window begins and PATH.end when
/// it ends: after the warm-up, and a window's length apart.
#[test]
fn window_marks_are_created_at_the_windows_edges() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let marks = dir.path().join("run");
    let launched = std::time::SystemTime::now();
    let marks_arg = marks.to_string_lossy().into_owned();
    let (code, r) = loadgen(
        dir.path(),
        "write-marks",
        &[
            "write",
            "--target",
            &server.base,
            "--streams",
            "4",
            "--duration",
            "1s",
            "--warmup",
            "500ms",
            "--window-marks",
            &marks_arg,
        ],
    );
    assert_eq!(code, 0);
    assert!(is_true(&r, "ok"));
    let created = |suffix: &str| {
        let path = dir.path().join(format!("run.{suffix}"));
        std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    // File times come from the kernel's coarse clock, up to a tick (a few ms) behind the
    // fine one `launched` was read from: allow a margin well above a tick.
    let tick = Duration::from_millis(50);
    let (start, end) = (created("start"), created("end"));
    let warm = start.duration_since(launched).unwrap_or(Duration::ZERO);
    let window = end.duration_since(start).expect("end after start");
    assert!(
        warm + tick >= Duration::from_millis(500),
        "window began {warm:?} after launch"
    );
    assert!(
        window + tick >= Duration::from_secs(1) && window < Duration::from_secs(3),
        "window {window:?} long"
    );
}
