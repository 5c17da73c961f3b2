//! The S3 cold tier through the real binaries: `ursula server` archiving to a real S3
//! server (`ursula-test-s3`, s3s-fs with serialised writes) on a loopback port, and
//! `ursula restore` building a data dir from it.
//!
//! Segments are the engine's smallest (~48 MiB, `segment_bytes = 1`) so that a roll takes
//! one stream of big appends; archive intervals are a fraction of a second. Each test takes
//! 10-30 s.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::s3::{BUCKET, CREDS, S3};
use support::{expect, req, temp_dir, write_config, Server, URSULA_BIN};

const OCTETS: (&str, &str) = ("content-type", "application/octet-stream");
const JSON: (&str, &str) = ("content-type", "application/json");

fn u64_at(v: &sonic_rs::Value, path: &[&str]) -> u64 {
    let mut at = v;
    for p in path {
        at = at
            .get(p)
            .unwrap_or_else(|| panic!("{path:?} missing in {v}"));
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("{path:?} not a number in {v}"))
}

/// Every object key a manifest lists (not its garbage).
fn manifest_keys(m: &sonic_rs::Value) -> Vec<String> {
    let mut out = Vec::new();
    let key = |o: &sonic_rs::Value| {
        o.get("object")
            .and_then(|o| o.get("key"))
            .and_then(|k| k.as_str())
            .map(str::to_string)
    };
    if let Some(segs) = m.get("segments").and_then(|s| s.as_array()) {
        for s in segs.iter() {
            for p in s
                .get("pieces")
                .and_then(|p| p.as_array())
                .expect("pieces")
                .iter()
            {
                out.extend(key(p));
            }
        }
    }
    if let Some(c) = m.get("checkpoint") {
        out.extend(key(c));
    }
    for list in ["index_files", "blobs"] {
        for o in m.get(list).and_then(|l| l.as_array()).expect("list").iter() {
            out.extend(key(o));
        }
    }
    out
}

struct Setup {
    interval_ms: u64,
    grace_ms: u64,
    cores: usize,
}

impl Setup {
    fn config(&self, dir: &Path, s3: &S3, prefix: &str) -> String {
        self.config_with(dir, s3, prefix, "", "")
    }

    /// The config with extra top-level lines and extra `[cold_tier]` lines.
    fn config_with(&self, dir: &Path, s3: &S3, prefix: &str, top: &str, cold: &str) -> String {
        write_config(
            dir,
            &format!(
                "segment_bytes = 1\n{top}[cold_tier]\ns3_bucket = \"{BUCKET}\"\ns3_prefix = \"{prefix}\"\n\
                 s3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\narchive_interval_ms = {}\ngrace_ms = {}\n{cold}",
                s3.endpoint(),
                self.interval_ms,
                self.grace_ms
            ),
        )
    }

    fn args(&self, data: &Path, config: &str, extra: &[&str]) -> Vec<String> {
        let mut args = support::server_args(data, "disk", self.cores, &["--config", config]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn start(&self, data: &Path, config: &str, log: &Path, extra: &[&str]) -> Server {
        let args = self.args(data, config, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::spawn_with_env(&args, &CREDS, Some(log), Duration::from_secs(60))
    }
}

fn restore(s3: &S3, prefix: &str, data: &Path) -> std::process::Output {
    restore_with(s3, prefix, data, &[])
}

fn restore_with(s3: &S3, prefix: &str, data: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(URSULA_BIN)
        .args(["restore", "--data-dir"])
        .arg(data)
        .args([
            "--cold-s3-bucket",
            BUCKET,
            "--cold-s3-prefix",
            prefix,
            "--cold-s3-endpoint",
        ])
        .arg(s3.endpoint())
        .args(["--cold-s3-region", "us-east-1"])
        .args(extra)
        .envs(CREDS)
        .output()
        .expect("run ursula restore")
}

fn restore_ok(s3: &S3, prefix: &str, data: &Path) {
    let out = restore(s3, prefix, data);
    assert!(
        out.status.success(),
        "restore failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of an unlabelled metric.
fn metric(s: &Server, name: &str) -> f64 {
    let r = expect(s, "GET", "/__ursula/metrics", &[], b"", 200);
    let body = r.body_str();
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing:\n{body}"))
}

/// Wait until everything durable is in a committed manifest: the lag is 0 after the cores
/// have published their durable ends at least once since the last write.
fn wait_archived(s: &Server, timeout: Duration) {
    thread::sleep(Duration::from_millis(2_500));
    let deadline = Instant::now() + timeout;
    while metric(s, "ursula_cold_archive_lag_bytes") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the archive did not catch up within {timeout:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// What a stream looks like to a client, for comparing before and after a restore.
#[derive(Debug, PartialEq)]
struct Seen {
    incarnation: Option<String>,
    next: Option<String>,
    retained: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

fn seen(s: &Server, path: &str) -> Seen {
    let h = expect(s, "HEAD", path, &[], b"", 200);
    let retained = h.header("stream-retained-offset").map(str::to_string);
    let from = retained.clone().unwrap_or_else(|| "-1".to_string());
    let body = expect(s, "GET", &format!("{path}?offset={from}"), &[], b"", 200).body;
    Seen {
        incarnation: h.header("stream-incarnation").map(str::to_string),
        next: h.header("stream-next-offset").map(str::to_string),
        retained,
        content_type: h.header("content-type").map(str::to_string),
        body,
    }
}

/// The whole body of a stream, read in pieces until its tail.
fn read_all(s: &Server, path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = "-1".to_string();
    loop {
        let r = expect(s, "GET", &format!("{path}?offset={offset}"), &[], b"", 200);
        out.extend_from_slice(&r.body);
        let next = r
            .header("stream-next-offset")
            .expect("next offset")
            .to_string();
        if r.header("stream-up-to-date") == Some("true") || next == offset {
            return out;
        }
        offset = next;
    }
}

/// The path of a redirect's (absolute) location.
fn location_path(r: &support::Response) -> String {
    let loc = r.header("location").expect("location");
    match loc.split_once("://") {
        Some((_, rest)) => rest[rest.find('/').unwrap_or(rest.len())..].to_string(),
        None => loc.to_string(),
    }
}

fn pattern(stream: usize, n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (stream * 31 + n * 7 + i) as u8).collect()
}

#[test]
fn archive_kill_restore_and_continue_under_a_new_epoch() {
    let dir = temp_dir("ursula-cold-restore");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let setup = Setup {
        interval_ms: 300,
        grace_ms: 600_000,
        cores: 2,
    };
    let config = setup.config(dir.path(), &s3, "restore");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &[]);

    // Byte streams with appends of many sizes, and one that rolls its shard's log.
    let mut paths = Vec::new();
    for i in 0..12 {
        let path = format!("/v1/stream/bytes-{i}");
        expect(&s, "PUT", &path, &[OCTETS], &pattern(i, 0, 10 + i), 201);
        for n in 1..(3 + i % 5) {
            expect(
                &s,
                "POST",
                &path,
                &[OCTETS],
                &pattern(i, n, 1 + n * 97 * i),
                204,
            );
        }
        paths.push(path);
    }
    expect(&s, "PUT", "/v1/stream/big", &[OCTETS], b"", 201);
    for n in 0..56 {
        expect(
            &s,
            "POST",
            "/v1/stream/big",
            &[OCTETS],
            &pattern(99, n, 1 << 20),
            204,
        );
    }
    paths.push("/v1/stream/big".to_string());
    // JSON streams in a bucket, one with a snapshot and retention past its first records.
    expect(&s, "PUT", "/demo", &[], b"", 201);
    for i in 0..4 {
        let path = format!("/demo/ev-{i}");
        expect(
            &s,
            "PUT",
            &path,
            &[JSON],
            format!(r#"[{{"i":{i},"n":0}},{{"i":{i},"n":1}}]"#).as_bytes(),
            201,
        );
        for n in 2..6 {
            expect(
                &s,
                "POST",
                &path,
                &[JSON],
                format!(r#"{{"i":{i},"n":{n}}}"#).as_bytes(),
                204,
            );
        }
        paths.push(path);
    }
    expect(
        &s,
        "PUT",
        "/demo/ev-0/snapshot?record=3",
        &[JSON],
        br#"{"upto":3}"#,
        204,
    );
    expect(&s, "PUT", "/demo/ev-0/retention?record=3", &[], b"", 204);
    // Deleted, and deleted then recreated.
    expect(&s, "DELETE", "/v1/stream/bytes-3", &[], b"", 204);
    expect(&s, "DELETE", "/v1/stream/bytes-4", &[], b"", 204);
    expect(
        &s,
        "PUT",
        "/v1/stream/bytes-4",
        &[OCTETS],
        b"second life",
        201,
    );
    paths.retain(|p| p != "/v1/stream/bytes-3");

    let before: Vec<Seen> = paths.iter().map(|p| seen(&s, p)).collect();
    let records_before: Vec<Vec<u8>> = (0..4)
        .map(|i| expect(&s, "GET", &format!("/demo/ev-{i}?record=4"), &[], b"", 200).body)
        .collect();
    let snapshot_before = expect(&s, "GET", "/demo/ev-0/snapshot", &[], b"", 307);
    let big_before = read_all(&s, "/v1/stream/big");
    assert_eq!(big_before.len(), 56 << 20);
    wait_archived(&s, Duration::from_secs(30));
    // The manifest naming the checkpoint is written after the segments it covers, so it
    // may land a moment after the archive lag reaches zero.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(0..2).any(|c| {
        let m = s3.manifest("restore", c).expect("manifest");
        m.get("segments")
            .and_then(|s| s.as_array())
            .is_some_and(|segs| {
                segs.iter()
                    .any(|s| s.get("sealed").and_then(|b| b.as_bool()) == Some(true))
            })
            && m.get("checkpoint").is_some_and(|c| !c.is_null())
    }) {
        assert!(
            Instant::now() < deadline,
            "a rolled log archives a sealed segment and its checkpoint"
        );
        thread::sleep(Duration::from_millis(100));
    }
    s.kill9();

    std::fs::remove_dir_all(&data).expect("lose the host's disk");
    let started = Instant::now();
    restore_ok(&s3, "restore", &data);
    eprintln!("restore took {:?}", started.elapsed());
    let out = restore(&s3, "restore", &data);
    assert!(!out.status.success(), "a non-empty data dir is refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));

    let s = setup.start(&data, &config, &log, &[]);
    let after: Vec<Seen> = paths.iter().map(|p| seen(&s, p)).collect();
    for ((p, b), a) in paths.iter().zip(&before).zip(&after) {
        assert_eq!(b, a, "{p} after restore");
    }
    assert_eq!(read_all(&s, "/v1/stream/big"), big_before);
    for (i, want) in records_before.iter().enumerate() {
        let r = expect(&s, "GET", &format!("/demo/ev-{i}?record=4"), &[], b"", 200);
        assert_eq!(&r.body, want, "record 4 of ev-{i}");
    }
    let snap = expect(&s, "GET", "/demo/ev-0/snapshot", &[], b"", 307);
    let path = location_path(&snap);
    assert_eq!(path, location_path(&snapshot_before), "the same snapshot");
    assert_eq!(
        expect(&s, "GET", &path, &[], b"", 200).body,
        br#"{"upto":3}"#
    );
    expect(&s, "HEAD", "/v1/stream/bytes-3", &[], b"", 404);
    assert_eq!(read_all(&s, "/v1/stream/bytes-4"), b"second life");

    // The restored server owns the archive under the next epoch and keeps archiving.
    expect(
        &s,
        "POST",
        "/v1/stream/bytes-0",
        &[OCTETS],
        b"after the restore",
        204,
    );
    wait_archived(&s, Duration::from_secs(30));
    for c in 0..2 {
        let m = s3.manifest("restore", c).expect("manifest");
        assert_eq!(u64_at(&m, &["epoch"]), 2, "shard {c}: {m}");
    }
    let new_epoch_objects = (0..2)
        .flat_map(|c| manifest_keys(&s3.manifest("restore", c).expect("manifest")))
        .filter(|k| k.contains("/e2/"))
        .count();
    assert!(
        new_epoch_objects > 0,
        "the append after the restore is archived under epoch 2"
    );
    let want = [before[0].body.clone(), b"after the restore".to_vec()].concat();
    s.kill9();
    let again = dir.path().join("again");
    restore_ok(&s3, "restore", &again);
    let s = setup.start(&again, &config, &log, &[]);
    assert_eq!(read_all(&s, "/v1/stream/bytes-0"), want);
    assert_eq!(read_all(&s, "/v1/stream/big"), big_before);
}

#[test]
fn a_single_append_on_a_quiet_server_reaches_s3_within_the_interval() {
    let dir = temp_dir("ursula-cold-quiet");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let setup = Setup {
        interval_ms: 2_000,
        grace_ms: 600_000,
        cores: 2,
    };
    let config = setup.config(dir.path(), &s3, "quiet");
    let s = setup.start(
        &dir.path().join("data"),
        &config,
        &dir.path().join("server.log"),
        &[],
    );
    expect(&s, "PUT", "/v1/stream/q", &[OCTETS], b"", 201);
    wait_archived(&s, Duration::from_secs(20));
    let lsn = |c| {
        u64_at(
            &s3.manifest("quiet", c).expect("manifest"),
            &["archived", "lsn"],
        )
    };
    let before: Vec<u64> = (0..2).map(lsn).collect();
    thread::sleep(Duration::from_millis(2_500));
    let acked = Instant::now();
    expect(
        &s,
        "POST",
        "/v1/stream/q",
        &[OCTETS],
        b"one quiet append",
        204,
    );
    // Published by the core within 1 s, archived by the next round.
    let slack = Duration::from_millis(2_000 + 4_000);
    loop {
        if (0..2).map(lsn).zip(&before).any(|(now, b)| now > *b) {
            break;
        }
        assert!(
            acked.elapsed() < slack,
            "not in S3 after {:?}",
            acked.elapsed()
        );
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("a quiet append reached S3 after {:?}", acked.elapsed());
}

#[test]
fn a_second_server_is_refused_and_a_takeover_fences_the_first() {
    let dir = temp_dir("ursula-cold-fence");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let setup = Setup {
        interval_ms: 1_000,
        grace_ms: 600_000,
        cores: 1,
    };
    let config = setup.config(dir.path(), &s3, "fence");
    let first = setup.start(
        &dir.path().join("a"),
        &config,
        &dir.path().join("a.log"),
        &[],
    );
    expect(&first, "PUT", "/v1/stream/f", &[OCTETS], b"first", 201);
    wait_archived(&first, Duration::from_secs(20));

    let second = dir.path().join("b");
    let out = Command::new(URSULA_BIN)
        .args(setup.args(&second, &config, &[]))
        .envs(CREDS)
        .stdin(Stdio::null())
        .output()
        .expect("run a second server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second owner must be refused: {err}"
    );
    assert!(
        err.contains("is owned by server") && err.contains("--cold-takeover"),
        "{err}"
    );

    let second = setup.start(
        &second,
        &config,
        &dir.path().join("b.log"),
        &["--cold-takeover"],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = req(&first, "GET", "/__ursula/readyz", &[], b"");
        if r.status == 503 {
            assert!(
                r.body_str().contains("cold tier archiving stopped"),
                "{}",
                r.body_str()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first server was not fenced: {r:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(&first, "ursula_cold_fenced"), 1.0);
    // Appends keep working locally on the fenced server.
    expect(
        &first,
        "POST",
        "/v1/stream/f",
        &[OCTETS],
        b" still durable",
        204,
    );
    assert_eq!(read_all(&first, "/v1/stream/f"), b"first still durable");
    expect(&second, "GET", "/__ursula/readyz", &[], b"", 200);
    let m = s3.manifest("fence", 0).expect("manifest");
    assert_eq!(u64_at(&m, &["epoch"]), 2);

    // The fenced server's clean stop does not try a last round on an archive it lost.
    let status = first
        .sigterm(Duration::from_secs(30))
        .expect("a fenced server stops cleanly");
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(dir.path().join("a.log")).expect("server log");
    assert!(text.contains("no last archive round"), "{text}");
    assert!(
        !text.contains("archived up to the final durable end"),
        "{text}"
    );
    assert_eq!(
        u64_at(&s3.manifest("fence", 0).expect("manifest"), &["epoch"]),
        2
    );
}

#[test]
fn a_clean_stop_with_s3_down_gives_up_in_time_and_archives_after_the_restart() {
    let dir = temp_dir("ursula-cold-stop-down");
    let s3_root = dir.path().join("s3");
    let s3 = S3::start(&s3_root, 0);
    let port = s3.port();
    let setup = Setup {
        interval_ms: 60_000,
        grace_ms: 600_000,
        cores: 1,
    };
    let config = setup.config(dir.path(), &s3, "down");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s3
        .manifest("down", 0)
        .is_none_or(|m| u64_at(&m, &["archived", "segment"]) == 0)
    {
        assert!(Instant::now() < deadline, "no first round");
        thread::sleep(Duration::from_millis(50));
    }
    let paths: Vec<String> = (0..4).map(|i| format!("/v1/stream/d-{i}")).collect();
    let mut want = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let body = pattern(i, 0, 5_000 + i);
        expect(&s, "PUT", p, &[OCTETS], &body, 201);
        want.push(body);
    }
    thread::sleep(Duration::from_millis(2_500));
    assert!(metric(&s, "ursula_cold_archive_lag_bytes") > 0.0);

    // S3 goes away before the stop: the last round retries, gives up within its bound and
    // says what is only on the local disk; the stop still succeeds.
    s3.stop();
    let stopped_at = Instant::now();
    let status = s
        .sigterm(Duration::from_secs(40))
        .expect("the stop is bounded even with S3 down");
    let took = stopped_at.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(25), "the stop took {took:?}");
    let text = std::fs::read_to_string(&log).expect("server log");
    assert!(
        text.contains("the last archive round ran out of time") && text.contains("lag_bytes"),
        "{text}"
    );

    // Nothing was lost: with S3 back, the same data dir archives what the stop could not.
    let s3 = S3::start(&s3_root, port);
    let s = setup.start(&data, &config, &log, &[]);
    wait_archived(&s, Duration::from_secs(30));
    s.kill9();
    let restored = dir.path().join("restored");
    restore_ok(&s3, "down", &restored);
    let s = setup.start(&restored, &config, &log, &[]);
    for (p, want) in paths.iter().zip(&want) {
        assert_eq!(
            &read_all(&s, p),
            want,
            "{p} after the restart and a restore"
        );
    }
}

#[test]
fn an_s3_outage_loses_nothing_and_the_archive_catches_up() {
    let dir = temp_dir("ursula-cold-outage");
    let s3_root = dir.path().join("s3");
    let s3 = S3::start(&s3_root, 0);
    let port = s3.port();
    let setup = Setup {
        interval_ms: 300,
        grace_ms: 600_000,
        cores: 2,
    };
    let config = setup.config(dir.path(), &s3, "outage");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = Arc::new(setup.start(&data, &config, &log, &[]));
    const STREAMS: usize = 8;
    for i in 0..STREAMS {
        expect(&s, "PUT", &format!("/v1/stream/o-{i}"), &[OCTETS], b"", 201);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(vec![Vec::new(); STREAMS]));
    let writer = {
        let (s, stop, acked) = (s.clone(), stop.clone(), acked.clone());
        thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let i = n % STREAMS;
                let body = pattern(i, n, 200 + n % 3000);
                let r = req(&s, "POST", &format!("/v1/stream/o-{i}"), &[OCTETS], &body);
                assert_eq!(r.status, 204, "append {n} during the outage: {r:?}");
                acked.lock().expect("lock")[i].extend_from_slice(&body);
                n += 1;
                thread::sleep(Duration::from_millis(2));
            }
            n
        })
    };
    thread::sleep(Duration::from_secs(2));
    s3.stop();
    thread::sleep(Duration::from_secs(4));
    let lag = metric(&s, "ursula_cold_archive_lag_seconds");
    assert!(lag >= 2.0, "the lag grows while S3 is down: {lag}");
    assert!(metric(&s, "ursula_cold_archive_lag_bytes") > 0.0);
    let s3 = S3::start(&s3_root, port);
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    let appends = writer.join().expect("every append succeeded");
    wait_archived(&s, Duration::from_secs(30));
    assert!(metric(&s, "ursula_cold_archive_lag_seconds") < 1.0);
    eprintln!("{appends} appends across the outage");
    let want = acked.lock().expect("lock").clone();
    match Arc::try_unwrap(s) {
        Ok(s) => s.kill9(),
        Err(_) => panic!("server still shared"),
    }
    let restored = dir.path().join("restored");
    restore_ok(&s3, "outage", &restored);
    let s = setup.start(&restored, &config, &log, &[]);
    for (i, want) in want.iter().enumerate() {
        assert_eq!(
            &read_all(&s, &format!("/v1/stream/o-{i}")),
            want,
            "stream o-{i}"
        );
    }
}

#[test]
fn objects_no_manifest_needs_are_deleted_after_the_grace_period() {
    let dir = temp_dir("ursula-cold-grace");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let grace = Duration::from_millis(8_000);
    let setup = Setup {
        interval_ms: 300,
        grace_ms: grace.as_millis() as u64,
        cores: 1,
    };
    let config = setup.config(dir.path(), &s3, "grace");
    let s = setup.start(
        &dir.path().join("data"),
        &config,
        &dir.path().join("server.log"),
        &[],
    );
    expect(&s, "PUT", "/demo", &[], b"", 201);
    expect(
        &s,
        "PUT",
        "/demo/g",
        &[JSON],
        br#"[{"n":0},{"n":1},{"n":2}]"#,
        201,
    );
    expect(
        &s,
        "PUT",
        "/demo/g/snapshot?record=1",
        &[JSON],
        br#"{"first":1}"#,
        204,
    );
    wait_archived(&s, Duration::from_secs(20));
    let blob_key = |m: &sonic_rs::Value| -> Vec<String> {
        m.get("blobs")
            .and_then(|b| b.as_array())
            .expect("blobs")
            .iter()
            .filter_map(|b| {
                b.get("object")
                    .and_then(|o| o.get("key"))
                    .and_then(|k| k.as_str())
                    .map(str::to_string)
            })
            .collect()
    };
    let first = blob_key(&s3.manifest("grace", 0).expect("manifest"));
    assert_eq!(first.len(), 1, "the snapshot blob is archived");
    // A newer snapshot drops the first blob; deleting the stream drops the second.
    expect(
        &s,
        "PUT",
        "/demo/g/snapshot?record=2",
        &[JSON],
        br#"{"second":2}"#,
        204,
    );
    wait_archived(&s, Duration::from_secs(20));
    let second = blob_key(&s3.manifest("grace", 0).expect("manifest"));
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);
    expect(&s, "DELETE", "/demo/g", &[], b"", 204);
    wait_archived(&s, Duration::from_secs(20));
    let dropped_at = Instant::now();
    let m = s3.manifest("grace", 0).expect("manifest");
    assert!(
        blob_key(&m).is_empty(),
        "a deleted stream's blob leaves the manifest: {m}"
    );
    let garbage: Vec<String> = m
        .get("garbage")
        .and_then(|g| g.as_array())
        .expect("garbage")
        .iter()
        .filter_map(|g| g.get("key").and_then(|k| k.as_str()).map(str::to_string))
        .collect();
    for k in first.iter().chain(&second) {
        assert!(garbage.contains(k), "{k} waits in the garbage list: {m}");
        assert!(
            s3.object("grace", k).is_some(),
            "{k} is kept during the grace period"
        );
    }
    let deadline = dropped_at + grace + Duration::from_secs(10);
    while first
        .iter()
        .chain(&second)
        .any(|k| s3.object("grace", k).is_some())
    {
        assert!(
            Instant::now() < deadline,
            "garbage not deleted after the grace period"
        );
        thread::sleep(Duration::from_millis(100));
    }
    wait_archived(&s, Duration::from_secs(20));
    let m = s3.manifest("grace", 0).expect("manifest");
    let still: Vec<_> = m
        .get("garbage")
        .and_then(|g| g.as_array())
        .expect("garbage")
        .iter()
        .filter_map(|g| g.get("key").and_then(|k| k.as_str()).map(str::to_string))
        .filter(|k| first.contains(k) || second.contains(k))
        .collect();
    assert!(
        still.is_empty(),
        "deleted garbage leaves the list: {still:?}"
    );
    for k in manifest_keys(&m) {
        assert!(
            s3.object("grace", &k).is_some(),
            "{k} is listed and present"
        );
    }
}

/// Bytes of the segment files in `data`'s shard directories, and the largest one.
fn local_segments(data: &Path) -> (u64, u64) {
    let mut total = 0;
    let mut largest = 0;
    for shard in std::fs::read_dir(data).expect("read data dir").flatten() {
        let Ok(files) = std::fs::read_dir(shard.path()) else {
            continue;
        };
        for f in files.flatten() {
            if f.path().extension().is_some_and(|e| e == "seg") {
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                total += len;
                largest = largest.max(len);
            }
        }
    }
    (total, largest)
}

/// The sum of a per-shard metric over its shards.
fn shard_metric(s: &Server, name: &str) -> f64 {
    let r = expect(s, "GET", "/__ursula/metrics", &[], b"", 200);
    r.body_str()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

#[test]
fn a_bounded_local_disk_reads_evicted_segments_back_from_s3() {
    let dir = temp_dir("ursula-cold-local");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let setup = Setup {
        interval_ms: 300,
        grace_ms: 600_000,
        cores: 1,
    };
    // Two of the engine's smallest segments stay local; a 1 MiB cache keeps reads off memory.
    let local_bytes: u64 = 100 << 20;
    let config = setup.config_with(
        dir.path(),
        &s3,
        "local",
        "cache_bytes = 1048576\n",
        &format!("local_bytes = {local_bytes}\n"),
    );
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &[]);

    // JSON records first, so that they end up in evicted segments, then 300 MiB of bytes
    // over six streams, then more records at the head.
    expect(&s, "PUT", "/demo", &[], b"", 201);
    expect(&s, "PUT", "/demo/ev", &[JSON], b"[]", 201);
    let record = |n: usize| format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(n % 200));
    let post_records = |from: usize| {
        let batch: Vec<String> = (from..from + 100).map(record).collect();
        let body = format!("[{}]", batch.join(","));
        expect(&s, "POST", "/demo/ev", &[JSON], body.as_bytes(), 204);
    };
    for b in 0..20 {
        post_records(b * 100);
    }
    let streams = 6;
    let appends = 50;
    for i in 0..streams {
        expect(&s, "PUT", &format!("/v1/stream/b-{i}"), &[OCTETS], b"", 201);
    }
    for n in 0..appends {
        for i in 0..streams {
            let path = format!("/v1/stream/b-{i}");
            expect(&s, "POST", &path, &[OCTETS], &pattern(i, n, 1 << 20), 204);
        }
    }
    for b in 20..25 {
        post_records(b * 100);
    }
    let want_bytes: Vec<Vec<u8>> = (0..streams)
        .map(|i| (0..appends).flat_map(|n| pattern(i, n, 1 << 20)).collect())
        .collect();
    let read_record = |s: &Server, n: usize| {
        let path = format!("/demo/ev?record={n}&max_records=1");
        expect(s, "GET", &path, &[], b"", 200).body
    };
    let probes = [0usize, 1, 99, 100, 777, 1999, 2000, 2499];
    for n in probes {
        let body = read_record(&s, n);
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(&format!(r#""n":{n},"#)), "record {n}: {text}");
    }
    let records_before: Vec<Vec<u8>> = probes.iter().map(|&n| read_record(&s, n)).collect();

    // Everything reaches S3, and the local files shrink to the budget.
    wait_archived(&s, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(60);
    let bound = |seg: u64| local_bytes + 3 * seg;
    loop {
        let (local, seg) = local_segments(&data);
        if shard_metric(&s, "ursula_storage_cold_segments") > 0.0 && local <= bound(seg) {
            eprintln!(
                "local segment files {} MiB (budget {} MiB, segment {} MiB)",
                local >> 20,
                local_bytes >> 20,
                seg >> 20
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "local segment files {local} bytes never came within {} (segment {seg})",
            bound(seg)
        );
        thread::sleep(Duration::from_millis(200));
    }

    let check = |s: &Server, data: &Path, when: &str| {
        let cold_before = metric(s, "ursula_cold_read_bytes_total");
        for (i, want) in want_bytes.iter().enumerate() {
            let got = read_all(s, &format!("/v1/stream/b-{i}"));
            assert!(got == *want, "stream b-{i} {when}: {} bytes", got.len());
        }
        for (k, &n) in probes.iter().enumerate() {
            assert_eq!(read_record(s, n), records_before[k], "record {n} {when}");
        }
        let cold = metric(s, "ursula_cold_read_bytes_total") - cold_before;
        assert!(cold > 0.0, "reads {when} came from S3");
        let (local, seg) = local_segments(data);
        assert!(local <= bound(seg), "reads {when} keep the disk in budget");
    };
    check(&s, &data, "after eviction");
    s.kill9();
    let s = setup.start(&data, &config, &log, &[]);
    check(&s, &data, "after a kill -9 and restart");

    // The host is lost; a new one with as small a disk restores only what fits. What
    // recovery replays comes down, then the newest older segments within the budget.
    wait_archived(&s, Duration::from_secs(60));
    s.kill9();
    let restored = dir.path().join("restored");
    let budget = local_bytes.to_string();
    let out = restore_with(&s3, "local", &restored, &["--cold-local-bytes", &budget]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "restore failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("stay in the cold tier"), "{stdout}");
    let (local, seg) = local_segments(&restored);
    assert!(
        local <= bound(seg),
        "the restore wrote {local} bytes of segments, over {}",
        bound(seg)
    );
    eprintln!(
        "restored {} MiB of segment files locally; the rest stays in S3",
        local >> 20
    );

    // Without its cold tier the restored dir would have holes: refused, and left as it was.
    let plain = support::server_args(&restored, "disk", setup.cores, &[]);
    let mut child = Command::new(URSULA_BIN)
        .args(&plain)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ursula");
    let status = support::wait_timeout(&mut child, Duration::from_secs(30));
    if status.is_none() {
        let _ = child.kill();
        panic!("a server without the cold tier started on a dir with cold segments");
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        status.is_some_and(|s| !s.success()) && err.contains("only in the S3 cold tier"),
        "{err}"
    );
    assert_eq!(
        local_segments(&restored),
        (local, seg),
        "the refusal changed nothing"
    );

    let s = setup.start(&restored, &config, &log, &[]);
    check(&s, &restored, "after a bounded restore");
}

/// The garbage list's keys.
fn garbage_keys(m: &sonic_rs::Value) -> Vec<String> {
    m.get("garbage")
        .and_then(|g| g.as_array())
        .expect("garbage")
        .iter()
        .filter_map(|g| g.get("key").and_then(|k| k.as_str()).map(str::to_string))
        .collect()
}

/// The object keys of archived segment `index`, if the manifest lists it.
fn segment_keys(m: &sonic_rs::Value, index: u64) -> Option<Vec<String>> {
    let segs = m
        .get("segments")
        .and_then(|s| s.as_array())
        .expect("segments");
    let seg = segs
        .iter()
        .find(|s| s.get("index").and_then(|i| i.as_u64()) == Some(index))?;
    Some(
        seg.get("pieces")
            .and_then(|p| p.as_array())
            .expect("pieces")
            .iter()
            .filter_map(|p| {
                p.get("object")
                    .and_then(|o| o.get("key"))
                    .and_then(|k| k.as_str())
                    .map(str::to_string)
            })
            .collect(),
    )
}

/// Every segment of the archived log before the one being written is archived whole: no
/// sealed segment is left as slices that may stop short of its end.
fn assert_whole_below_the_head(m: &sonic_rs::Value) {
    let head = u64_at(m, &["archived", "segment"]);
    for s in m
        .get("segments")
        .and_then(|s| s.as_array())
        .expect("segments")
        .iter()
    {
        let index = s.get("index").and_then(|i| i.as_u64()).expect("index");
        let sealed = s.get("sealed").and_then(|b| b.as_bool()).expect("sealed");
        assert!(
            index >= head || sealed,
            "segment {index} below the head {head} is not archived whole: {m}"
        );
    }
}

/// Write `content` as the S3 server's object `key` under `prefix`, last modified `age` ago:
/// what a round that uploaded and then never committed leaves (the S3 server's objects
/// are its files).
fn plant(s3: &S3, prefix: &str, key: &str, age: Duration) -> PathBuf {
    let path = s3.root.join(BUCKET).join(prefix).join(key);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&path, format!("uploaded, never committed: {key}")).expect("write");
    let when = std::time::SystemTime::now() - age;
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(when))
        .expect("set mtime");
    path
}

#[test]
fn objects_no_manifest_names_are_swept_once_older_than_the_grace_period() {
    let dir = temp_dir("ursula-cold-orphans");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let grace = Duration::from_millis(10_000);
    let setup = Setup {
        interval_ms: 300,
        grace_ms: grace.as_millis() as u64,
        cores: 2,
    };
    let config = setup.config(dir.path(), &s3, "orphans");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &[]);
    let mut paths = Vec::new();
    for i in 0..6 {
        let path = format!("/v1/stream/o-{i}");
        expect(&s, "PUT", &path, &[OCTETS], &pattern(i, 0, 100 + i), 201);
        expect(&s, "POST", &path, &[OCTETS], &pattern(i, 1, 5_000), 204);
        paths.push(path);
    }
    // A sealed segment too, so that the sweep walks past a whole segment object.
    expect(&s, "PUT", "/v1/stream/big", &[OCTETS], b"", 201);
    for n in 0..52 {
        let body = pattern(98, n, 1 << 20);
        expect(&s, "POST", "/v1/stream/big", &[OCTETS], &body, 204);
    }
    paths.push("/v1/stream/big".to_string());
    wait_archived(&s, Duration::from_secs(30));
    let before: Vec<Vec<u8>> = paths.iter().map(|p| read_all(&s, p)).collect();
    s.kill9();

    // Left by rounds whose commit never happened, under this owner's epoch and older ones.
    let hour = Duration::from_secs(3600);
    let old = [
        plant(
            &s3,
            "orphans",
            "shard-0/e1/0000000042.seg.000000004096-000000008192",
            hour,
        ),
        plant(&s3, "orphans", "shard-1/e1/0000000042.seg", hour),
        plant(
            &s3,
            "orphans",
            "shard-1/e0/checkpoint.00000000000000000009.0000abcd",
            hour,
        ),
    ];
    let young = plant(
        &s3,
        "orphans",
        "shard-0/e1/0000000043.seg.000000000000-000000004096",
        Duration::ZERO,
    );
    let planted_at = Instant::now();
    // Not this archive's to sweep: a shard this server does not have, another prefix in the
    // bucket, and a key outside the epoch directories.
    let foreign = [
        plant(&s3, "orphans", "shard-2/e1/0000000042.seg", hour),
        plant(&s3, "elsewhere", "shard-0/e1/0000000042.seg", hour),
        plant(&s3, "orphans", "shard-0/operator-notes.txt", hour),
    ];

    // The restart's sweep (at start, after the claim) takes the old ones only.
    let s = setup.start(&data, &config, &log, &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while old.iter().any(|p| p.exists()) {
        assert!(Instant::now() < deadline, "old orphans not swept at start");
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        planted_at.elapsed() < grace && young.exists(),
        "an object younger than the grace period is kept"
    );
    assert!(metric(&s, "ursula_cold_objects_deleted_total") >= old.len() as f64);
    let deadline = planted_at + 2 * grace + Duration::from_secs(5);
    while young.exists() {
        assert!(
            Instant::now() < deadline,
            "the young orphan outlived two grace periods"
        );
        thread::sleep(Duration::from_millis(100));
    }
    for p in &foreign {
        assert!(p.exists(), "{} is not this archive's to sweep", p.display());
    }
    assert!(s3.object("orphans", "layout.json").is_some());
    for c in 0..2 {
        let m = s3.manifest("orphans", c).expect("manifest");
        for k in manifest_keys(&m) {
            assert!(s3.object("orphans", &k).is_some(), "{k} is named and kept");
        }
    }
    s.kill9();

    let restored = dir.path().join("restored");
    restore_ok(&s3, "orphans", &restored);
    let s = setup.start(&restored, &config, &log, &[]);
    for (p, want) in paths.iter().zip(&before) {
        assert!(
            read_all(&s, p) == *want,
            "{p} after the sweep and a restore"
        );
    }
}

#[test]
fn a_clean_stop_archives_what_the_interval_had_not_yet() {
    let dir = temp_dir("ursula-cold-stop");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let setup = Setup {
        interval_ms: 60_000,
        grace_ms: 600_000,
        cores: 2,
    };
    let config = setup.config(dir.path(), &s3, "stop");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &[]);
    // The first round after a start archives the (empty) log at once; from then on the
    // interval rules, so nothing written after it reaches S3 for a minute.
    let head = |c| {
        u64_at(
            &s3.manifest("stop", c).expect("manifest"),
            &["archived", "segment"],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while (0..2).any(|c| head(c) == 0) {
        assert!(Instant::now() < deadline, "no first round");
        thread::sleep(Duration::from_millis(50));
    }
    let lsn = |c| {
        u64_at(
            &s3.manifest("stop", c).expect("manifest"),
            &["archived", "lsn"],
        )
    };
    let archived: Vec<u64> = (0..2).map(lsn).collect();
    let paths: Vec<String> = (0..6).map(|i| format!("/v1/stream/s-{i}")).collect();
    let mut want = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        expect(&s, "PUT", p, &[OCTETS], &pattern(i, 0, 300), 201);
        let last = pattern(i, 1, 2_000 + i);
        expect(&s, "POST", p, &[OCTETS], &last, 204);
        want.push([pattern(i, 0, 300), last].concat());
    }
    // Durable and published by the cores, but an interval away from S3.
    thread::sleep(Duration::from_millis(2_500));
    assert!(metric(&s, "ursula_cold_archive_lag_bytes") > 0.0);
    assert_eq!((0..2).map(lsn).collect::<Vec<_>>(), archived);

    let stopped_at = Instant::now();
    let status = s
        .sigterm(Duration::from_secs(30))
        .expect("a clean stop exits");
    assert!(status.success(), "{status:?}");
    eprintln!("the clean stop took {:?}", stopped_at.elapsed());
    let now: Vec<u64> = (0..2).map(lsn).collect();
    assert!(
        now.iter().zip(&archived).all(|(n, a)| n >= a)
            && now.iter().sum::<u64>() > archived.iter().sum(),
        "the last round archived the appends: {archived:?} then {now:?}"
    );
    let text = std::fs::read_to_string(&log).expect("server log");
    assert_eq!(
        text.matches("archived up to the final durable end").count(),
        2,
        "every shard's last round is logged:\n{text}"
    );

    std::fs::remove_dir_all(&data).expect("lose the host's disk");
    restore_ok(&s3, "stop", &data);
    let s = setup.start(&data, &config, &log, &[]);
    for (p, want) in paths.iter().zip(&want) {
        assert_eq!(
            &read_all(&s, p),
            want,
            "{p} after a clean stop and a restore"
        );
    }
}

#[test]
fn segments_the_cleaner_drops_leave_s3_after_the_grace_period() {
    let dir = temp_dir("ursula-cold-segments");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let grace = Duration::from_millis(6_000);
    let setup = Setup {
        interval_ms: 300,
        grace_ms: grace.as_millis() as u64,
        cores: 1,
    };
    let config = setup.config(dir.path(), &s3, "segs");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &[]);

    // ~100 MiB over two mostly dead segments: a stream to delete, a JSON stream whose
    // history retention drops, and a small stream that lives on, written in between.
    let keep = "/v1/stream/keep";
    expect(&s, "PUT", keep, &[OCTETS], b"", 201);
    let mut kept = Vec::new();
    let mut keep_append = |s: &Server, n: usize| {
        let body = pattern(7, n, 3_000 + n);
        expect(s, "POST", keep, &[OCTETS], &body, 204);
        kept.extend_from_slice(&body);
    };
    expect(&s, "PUT", "/v1/stream/doomed", &[OCTETS], b"", 201);
    for n in 0..60 {
        let body = pattern(1, n, 1 << 20);
        expect(&s, "POST", "/v1/stream/doomed", &[OCTETS], &body, 204);
        if n % 10 == 0 {
            keep_append(&s, n);
        }
    }
    expect(&s, "PUT", "/demo", &[], b"", 201);
    expect(&s, "PUT", "/demo/trim", &[JSON], b"[]", 201);
    let pad = "y".repeat(1000);
    let mut records = 0;
    for b in 0..10 {
        let batch: Vec<String> = (0..4000)
            .map(|i| format!(r#"{{"n":{},"pad":"{pad}"}}"#, records + i))
            .collect();
        records += batch.len();
        let body = format!("[{}]", batch.join(","));
        expect(&s, "POST", "/demo/trim", &[JSON], body.as_bytes(), 204);
        keep_append(&s, 100 + b);
    }
    // The archive follows the durable end the shard publishes between its upkeep jobs,
    // which a checkpoint of this much log can hold back for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = loop {
        wait_archived(&s, Duration::from_secs(30));
        let m = s3.manifest("segs", 0).expect("manifest");
        if u64_at(&m, &["archived", "segment"]) >= 3 {
            break m;
        }
        assert!(Instant::now() < deadline, "the log is not archived: {m}");
    };
    assert_whole_below_the_head(&m);
    let doomed_keys: Vec<String> = [1, 2]
        .iter()
        .flat_map(|&i| segment_keys(&m, i).unwrap_or_else(|| panic!("segment {i}: {m}")))
        .collect();
    for k in &doomed_keys {
        assert!(s3.object("segs", k).is_some(), "{k} archived");
    }

    // Delete one, drop the other's history: segments 1 and 2 hold almost nothing live.
    expect(&s, "DELETE", "/v1/stream/doomed", &[], b"", 204);
    let last = records - 1;
    expect(
        &s,
        "PUT",
        &format!("/demo/trim/snapshot?record={last}"),
        &[JSON],
        br#"{"folded":true}"#,
        204,
    );
    expect(
        &s,
        "PUT",
        &format!("/demo/trim/retention?record={last}"),
        &[],
        b"",
        204,
    );
    let shard_dir = data.join("shard-0");
    let deadline = Instant::now() + Duration::from_secs(20);
    while [1u64, 2]
        .iter()
        .any(|i| shard_dir.join(format!("{i:010}.seg")).exists())
    {
        assert!(
            Instant::now() < deadline,
            "the cleaner never removed segments 1 and 2"
        );
        thread::sleep(Duration::from_millis(100));
    }
    // A roll: the checkpoint after it no longer needs the cleaned segments.
    expect(&s, "PUT", "/v1/stream/after", &[OCTETS], b"", 201);
    let mut after = Vec::new();
    for n in 0..50 {
        let body = pattern(3, n, 1 << 20);
        expect(&s, "POST", "/v1/stream/after", &[OCTETS], &body, 204);
        after.extend_from_slice(&body);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let dropped_at = loop {
        let m = s3.manifest("segs", 0).expect("manifest");
        assert_whole_below_the_head(&m);
        if segment_keys(&m, 1).is_none() && segment_keys(&m, 2).is_none() {
            let garbage = garbage_keys(&m);
            for k in &doomed_keys {
                assert!(garbage.contains(k), "{k} waits in the garbage list: {m}");
                assert!(
                    s3.object("segs", k).is_some(),
                    "{k} kept during the grace period"
                );
            }
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "segments 1 and 2 never left the manifest: {m}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    let deadline = dropped_at + grace + Duration::from_secs(10);
    while doomed_keys.iter().any(|k| s3.object("segs", k).is_some()) {
        assert!(
            Instant::now() < deadline,
            "segment objects outlived the grace period"
        );
        thread::sleep(Duration::from_millis(100));
    }
    wait_archived(&s, Duration::from_secs(30));
    let m = s3.manifest("segs", 0).expect("manifest");
    let garbage = garbage_keys(&m);
    assert!(
        doomed_keys.iter().all(|k| !garbage.contains(k)),
        "deleted objects leave the garbage list: {m}"
    );
    for k in manifest_keys(&m) {
        assert!(s3.object("segs", &k).is_some(), "{k} is named and present");
    }
    let trimmed = seen(&s, "/demo/trim");
    s.kill9();

    let restored = dir.path().join("restored");
    restore_ok(&s3, "segs", &restored);
    let s = setup.start(&restored, &config, &log, &[]);
    assert!(read_all(&s, keep) == kept, "{keep} after a restore");
    assert!(read_all(&s, "/v1/stream/after") == after, "after, restored");
    assert_eq!(seen(&s, "/demo/trim"), trimmed);
    expect(&s, "HEAD", "/v1/stream/doomed", &[], b"", 404);
}

/// With a log per lane, each lane is archived under a manifest of its own; a restore
/// brings every lane back, and a server with another core count runs them.
#[test]
fn a_log_per_lane_is_archived_per_lane_and_restores_onto_other_cores() {
    let dir = temp_dir("ursula-cold-lane-logs");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let setup = Setup {
        interval_ms: 60_000,
        grace_ms: 600_000,
        cores: 2,
    };
    let config = setup.config(dir.path(), &s3, "lanes");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let s = setup.start(&data, &config, &log, &["--logs", "lane", "--lanes", "4"]);
    expect(&s, "PUT", "/bucket", &[], b"", 201);
    let mut want = Vec::new();
    for i in 0..12 {
        for path in [format!("/v1/stream/s-{i}"), format!("/bucket/b-{i}")] {
            expect(&s, "PUT", &path, &[OCTETS], &pattern(i, 0, 300), 201);
            let last = pattern(i, 1, 1_000 + i);
            expect(&s, "POST", &path, &[OCTETS], &last, 204);
            want.push((path, [pattern(i, 0, 300), last].concat()));
        }
    }
    let before: Vec<Seen> = want.iter().map(|(path, _)| seen(&s, path)).collect();
    let status = s
        .sigterm(Duration::from_secs(30))
        .expect("a clean stop exits");
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).expect("server log");
    assert_eq!(
        text.matches("archived up to the final durable end").count(),
        4,
        "every lane's log has its last round:\n{text}"
    );
    for lane in 0..4 {
        let m = s3.manifest("lanes", lane).expect("a manifest per lane");
        assert!(u64_at(&m, &["archived", "lsn"]) > 0, "lane {lane}: {m:?}");
    }
    let layout = s3.object("lanes", "layout.json").expect("layout");
    assert_eq!(layout, br#"{"shards":4,"lanes":4,"logs":"lane"}"#);

    std::fs::remove_dir_all(&data).expect("lose the host's disk");
    restore_ok(&s3, "lanes", &data);
    let one_core = Setup { cores: 1, ..setup };
    let s = one_core.start(&data, &config, &log, &[]);
    for ((path, want), before) in want.iter().zip(&before) {
        assert_eq!(
            &read_all(&s, path),
            want,
            "{path} after a restore onto 1 core"
        );
        // Offsets and incarnations move with the lane.
        assert_eq!(&seen(&s, path), before, "{path}");
    }
    let r = expect(&s, "GET", "/bucket/streams", &[], b"", 200);
    let listing: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("listing");
    assert_eq!(listing["stream_count"].as_u64(), Some(12));
    // Every lane's archive, under the epoch the restored server took it over with.
    let r = expect(&s, "GET", "/__ursula/lanes", &[], b"", 200);
    let lanes: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("lanes");
    for lane in 0..4 {
        let archive = &lanes["lanes"][lane]["archive"];
        assert_eq!(
            archive["epoch"].as_u64(),
            Some(2),
            "lane {lane}: {archive:?}"
        );
        assert!(archive["owner"].as_str().is_some_and(|o| !o.is_empty()));
        assert!(archive["lag_bytes"].as_u64().is_some(), "{archive:?}");
    }
}
