//! `--durability s3` through the real binaries and a real S3 server (`ursula-test-s3`):
//! an append is acknowledged only once it is in S3, so losing the host and its disk
//! (`kill -9`, the data dir deleted, `ursula restore` onto a new one) loses nothing
//! acknowledged; a server whose shards were taken over acknowledges nothing more; S3
//! going away turns appends into 503s, and its return into acknowledgements again.
//!
//! `URSULA_S3_CYCLES` sets how many host losses the main test goes through (default 5;
//! the release check runs 50).

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::s3::{BUCKET, CREDS, S3};
use support::{expect, req, signal, temp_dir, write_config, Client, Server, URSULA_BIN};

const JSON: (&str, &str) = ("content-type", "application/json");
const PREFIX: &str = "s3-durability";
const WRITERS: usize = 8;

/// The config of an `s3`-mode server: small segments, a long archive interval (so the
/// WAL objects carry the recent appends, not the archive), a short acknowledgement bound.
fn config(dir: &Path, s3: &S3, ack_timeout_ms: u64) -> String {
    write_config(
        dir,
        &format!(
            "segment_bytes = 1\ndurability = \"s3\"\n[cold_tier]\ns3_bucket = \"{BUCKET}\"\n\
             s3_prefix = \"{PREFIX}\"\ns3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\n\
             archive_interval_ms = 10000\ngrace_ms = 600000\ns3_ack_timeout_ms = {ack_timeout_ms}\n",
            s3.endpoint()
        ),
    )
}

fn start(data: &Path, config: &str, log: &Path, env: &[(&str, &str)]) -> Server {
    let args = support::server_args(data, "disk", 2, &["--config", config]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut all: Vec<(&str, &str)> = CREDS.to_vec();
    all.extend_from_slice(env);
    Server::spawn_with_env(&args, &all, Some(log), Duration::from_secs(60))
}

fn restore(s3: &S3, data: &Path) {
    let out = Command::new(URSULA_BIN)
        .args(["restore", "--data-dir"])
        .arg(data)
        .args(["--cold-s3-bucket", BUCKET, "--cold-s3-prefix", PREFIX])
        .args(["--cold-s3-endpoint", &s3.endpoint(), "--cold-s3-region"])
        .arg("us-east-1")
        .envs(CREDS)
        .output()
        .expect("run ursula restore");
    assert!(
        out.status.success(),
        "restore failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn stream(writer: usize) -> String {
    format!("/v1/stream/writer-{writer}")
}

/// Appends each writer was told are durable, by writer.
type Acked = Arc<Mutex<Vec<BTreeSet<u64>>>>;

/// `WRITERS` threads appending `{"w":W,"n":N}` with producer headers until `stop`, each
/// remembering the N of every append answered 2xx. Stops at the first refused connection
/// (the server was killed).
fn write_until(
    addr: &str,
    stop: &Arc<AtomicBool>,
    acked: &Acked,
    first_n: u64,
) -> Vec<thread::JoinHandle<()>> {
    (0..WRITERS)
        .map(|w| {
            let (addr, stop, acked) = (addr.to_string(), stop.clone(), acked.clone());
            thread::spawn(move || {
                let mut client = Client::new(&addr);
                client.timeout = Duration::from_secs(20);
                let mut n = first_n;
                while !stop.load(Ordering::SeqCst) {
                    let body = format!("{{\"w\":{w},\"n\":{n}}}");
                    let seq = (n - first_n).to_string();
                    let epoch = (first_n / 1_000_000).to_string();
                    let headers = [
                        JSON,
                        ("producer-id", "durability-test"),
                        ("producer-epoch", epoch.as_str()),
                        ("producer-seq", seq.as_str()),
                    ];
                    match client.request("POST", &stream(w), &headers, body.as_bytes()) {
                        Ok(r) if r.is_success() => {
                            acked.lock().expect("acked")[w].insert(n);
                            n += 1;
                        }
                        // Not acknowledged (S3 slow or the write queue full): try the
                        // same append again, as a producer would.
                        Ok(r) if r.status == 503 => thread::sleep(Duration::from_millis(20)),
                        Ok(r) => panic!("append {body}: {r:?} {}", r.body_str()),
                        Err(_) => return,
                    }
                }
            })
        })
        .collect()
}

/// Every N each writer's stream holds.
fn stored(s: &Server) -> Vec<BTreeSet<u64>> {
    (0..WRITERS)
        .map(|w| {
            let mut found = BTreeSet::new();
            let mut offset = "-1".to_string();
            loop {
                let r = expect(
                    s,
                    "GET",
                    &format!("{}?offset={offset}", stream(w)),
                    &[],
                    b"",
                    200,
                );
                let values: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("JSON array");
                for v in values.as_array().expect("array").iter() {
                    found.insert(v.get("n").and_then(|n| n.as_u64()).expect("n"));
                }
                let next = r.header("stream-next-offset").expect("next").to_string();
                if r.header("stream-up-to-date") == Some("true") || next == offset {
                    return found;
                }
                offset = next;
            }
        })
        .collect()
}

/// Acknowledged appends the server does not hold.
fn missing(acked: &Acked, s: &Server) -> Vec<(usize, u64)> {
    let held = stored(s);
    let acked = acked.lock().expect("acked");
    let mut out = Vec::new();
    for (w, ns) in acked.iter().enumerate() {
        out.extend(ns.difference(&held[w]).map(|&n| (w, n)));
    }
    out
}

/// Host-loss cycles: load, `kill -9`, a new data dir restored from S3, start, check. Returns
/// the acknowledged appends missing after the last cycle (a loss stays missing), and how
/// many were acknowledged.
fn host_loss_cycles(cycles: usize, put_delay_ms: u64, env: &[(&str, &str)]) -> (usize, usize) {
    let dir = temp_dir("ursula-s3-durability");
    let delay = put_delay_ms.to_string();
    let s3 = S3::start_with(&dir.path().join("s3"), 0, &["--put-delay-ms", &delay]);
    let config = config(dir.path(), &s3, 5_000);
    let log = dir.path().join("server.log");
    let acked: Acked = Arc::new(Mutex::new(vec![BTreeSet::new(); WRITERS]));
    let mut data = dir.path().join("data-0");
    let mut s = start(&data, &config, &log, env);
    for w in 0..WRITERS {
        expect(&s, "PUT", &stream(w), &[JSON], b"", 201);
    }
    let mut lost = 0;
    for cycle in 0..cycles {
        let stop = Arc::new(AtomicBool::new(false));
        // A new producer epoch per server life: the restored server may hold appends
        // that were never acknowledged, past what a writer counted.
        let writers = write_until(&s.addr, &stop, &acked, (cycle as u64 + 1) * 1_000_000);
        thread::sleep(Duration::from_millis(1_200 + 97 * (cycle as u64 % 7)));
        s.kill9();
        stop.store(true, Ordering::SeqCst);
        for t in writers {
            t.join().expect("writer");
        }
        // The host is gone with its disk: only S3 is left.
        std::fs::remove_dir_all(&data).expect("delete the data dir");
        data = dir.path().join(format!("data-{}", cycle + 1));
        restore(&s3, &data);
        s = start(&data, &config, &log, env);
        let gone = missing(&acked, &s);
        if !gone.is_empty() {
            eprintln!(
                "after cycle {cycle}: {} acknowledged appends missing, e.g. {:?}",
                gone.len(),
                &gone[..gone.len().min(5)]
            );
        }
        lost = gone.len();
    }
    let total = acked.lock().expect("acked").iter().map(BTreeSet::len).sum();
    (lost, total)
}

#[test]
fn losing_the_host_and_its_disk_loses_no_acknowledged_append() {
    let cycles = std::env::var("URSULA_S3_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let (lost, acked) = host_loss_cycles(cycles, 20, &[]);
    eprintln!("{cycles} host losses: {acked} appends acknowledged, {lost} lost");
    assert!(
        acked > cycles * WRITERS,
        "the load acknowledged too little: {acked}"
    );
    assert_eq!(lost, 0, "acknowledged appends were lost");
}

#[test]
fn acknowledging_before_s3_is_caught_losing_appends() {
    // The check above must be able to fail: with acknowledgements sent once the append is
    // durable locally, a host loss takes what the slow PUTs had not delivered.
    let (lost, acked) = host_loss_cycles(2, 300, &[("URSULA_FAULT_ACK_BEFORE_S3", "1")]);
    eprintln!("acknowledging before S3: {acked} acknowledged, {lost} lost");
    assert!(
        lost > 0,
        "acknowledging before S3 lost nothing: the test cannot see a loss"
    );
}

/// Append `{"n":N}` to `path`.
fn post(s: &Server, path: &str, n: u64) -> support::Response {
    req(
        s,
        "POST",
        path,
        &[JSON],
        format!("{{\"n\":{n}}}").as_bytes(),
    )
}

/// Append `{"n":N}` for each N, each acknowledged.
fn append_all(s: &Server, path: &str, ns: std::ops::Range<u64>) {
    for n in ns {
        let r = post(s, path, n);
        assert_eq!(r.status, 204, "append {n}: {r:?} {}", r.body_str());
    }
}

/// The N of every record a JSON stream holds, in order.
fn ns_in(s: &Server, path: &str) -> Vec<u64> {
    let r = expect(s, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
    let values: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("JSON");
    values
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.get("n").and_then(|n| n.as_u64()).expect("n"))
        .collect()
}

#[test]
fn a_paused_owner_taken_over_acknowledges_nothing_more() {
    let dir = temp_dir("ursula-s3-zombie");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(dir.path(), &s3, 2_000);
    let log = dir.path().join("server.log");
    let old = start(&dir.path().join("old"), &config, &log, &[]);
    let path = "/v1/stream/zombie";
    expect(&old, "PUT", path, &[JSON], b"", 201);
    append_all(&old, path, 0..20);
    // The owner stops answering (paused, cut off) and another host takes its data over.
    signal(old.pid(), libc::SIGSTOP);
    let data = dir.path().join("new");
    restore(&s3, &data);
    let new = start(&data, &config, &log, &[]);
    append_all(&new, path, 20..40);
    // The old owner wakes up and takes appends again: none may be acknowledged.
    signal(old.pid(), libc::SIGCONT);
    let mut refused = 0;
    for n in 100..110 {
        let r = post(&old, path, n);
        assert!(
            !r.is_success(),
            "a fenced server acknowledged an append: {r:?}"
        );
        assert_eq!(r.status, 503, "{r:?} {}", r.body_str());
        refused += 1;
    }
    assert_eq!(refused, 10);
    let ready = req(&old, "GET", "/__ursula/readyz", &[], b"");
    assert_eq!(ready.status, 503, "a fenced server reports not ready");
    // Everything both owners acknowledged, in order, and nothing of the fenced one's.
    assert_eq!(ns_in(&new, path), (0..40).collect::<Vec<_>>());
}

#[test]
fn appends_get_503_while_s3_is_down_and_succeed_once_it_is_back() {
    let dir = temp_dir("ursula-s3-outage");
    let root = dir.path().join("s3");
    let s3 = S3::start(&root, 0);
    let port = s3.port();
    let config = config(dir.path(), &s3, 1_500);
    let log = dir.path().join("server.log");
    let s = start(&dir.path().join("data"), &config, &log, &[]);
    let path = "/v1/stream/outage";
    expect(&s, "PUT", path, &[JSON], b"", 201);
    let mut acked = Vec::new();
    append_all(&s, path, 0..10);
    acked.extend(0..10);
    s3.stop();
    for n in 10..13 {
        let started = Instant::now();
        let r = post(&s, path, n);
        assert_eq!(r.status, 503, "{r:?} {}", r.body_str());
        assert!(
            r.header("retry-after").is_some(),
            "a retry may succeed: {r:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the answer came after {:?}",
            started.elapsed()
        );
    }
    let _s3 = S3::start(&root, port);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 13;
    while acked.len() < 15 {
        assert!(Instant::now() < deadline, "appends never succeeded again");
        let r = post(&s, path, n);
        if r.is_success() {
            acked.push(n);
        }
        n += 1;
    }
    let held: BTreeSet<u64> = ns_in(&s, path).into_iter().collect();
    for n in &acked {
        assert!(held.contains(n), "acknowledged {n} is missing: {held:?}");
    }
}

#[test]
fn s3_durability_without_a_cold_tier_refuses_to_start() {
    let dir = temp_dir("ursula-s3-nocold");
    let out = Command::new(URSULA_BIN)
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--durability",
            "s3",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .expect("run ursula");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs the cold tier"), "{err}");
}
