//! Measurement, not a regression test (`--ignored`): S3 requests per second for many small
//! active indexes at a steady event rate, counted by `ursula-test-s3 --counts-file`.
//!
//! ```text
//! MANY_STREAMS_N=1000 MANY_STREAMS_RATE=500 MANY_STREAMS_SECS=30 \
//!   cargo test --release -p ursula-indexer --test many_streams -- --ignored --nocapture
//! ```
//!
//! Two workers share one prefix (the pool case: the second one follows every index it does
//! not own). `MANY_STREAMS_INDEXER` runs another `ursula-indexer` binary (e.g. an older
//! build) for a before/after comparison.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn counts(path: &Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

fn worker(dir: &Path, bin: &Path, name: &str, endpoint: &str) -> Proc {
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--s3-bucket",
        S3_BUCKET,
        "--s3-prefix",
        "many",
        "--s3-endpoint",
        endpoint,
        "--s3-region",
        "us-east-1",
        "--worker-id",
        name,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--cache-dir".to_string(),
        dir.join(format!("cache-{name}")).to_string_lossy().into(),
    ])
    .collect();
    Proc::spawn(
        bin,
        &args,
        "ursula-indexer listening on http://",
        &[
            ("AWS_ACCESS_KEY_ID", "testak"),
            ("AWS_SECRET_ACCESS_KEY", "testsecretkey"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
        &dir.join(format!("indexer-{name}.log")),
    )
}

#[test]
#[ignore]
fn many_small_streams_s3_requests() {
    let n = env_num("MANY_STREAMS_N", 1000);
    let rate = env_num("MANY_STREAMS_RATE", 500);
    let secs = env_num("MANY_STREAMS_SECS", 30);
    let bin = std::env::var("MANY_STREAMS_INDEXER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(INDEXER_BIN));
    let dir = tempfile::tempdir().expect("tmp");
    let counts_file = dir.path().join("s3-counts");
    let s3 = test_s3_with(
        dir.path(),
        &["--counts-file".into(), counts_file.to_string_lossy().into()],
    );
    let u = ursula(dir.path());
    let ua = u.addr.clone();
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    for i in 0..n {
        expect(&ua, "PUT", &format!("/demo/s{i}"), &[JSON], b"", 201);
    }
    let a = worker(dir.path(), &bin, "a", &s3.url());
    let started = Instant::now();
    for i in 0..n {
        let r = register(
            &a.addr,
            &format!("s{i}"),
            &format!("{}/demo/s{i}", u.url()),
            "",
        );
        assert!(r.status == 201 || r.status == 200, "register: {}", r.text());
    }
    eprintln!("registered {n} indexes in {:?}", started.elapsed());
    let b = worker(dir.path(), &bin, "b", &s3.url());
    // Steady load: `rate` events/s round-robin over the streams, for a warm-up of 15 s
    // and then the measured window.
    let warmup = Duration::from_secs(15);
    let total = warmup + Duration::from_secs(secs);
    let start = Instant::now();
    let mut before = None;
    let mut sent = 0u64;
    while start.elapsed() < total {
        if before.is_none() && start.elapsed() >= warmup {
            before = Some((Instant::now(), counts(&counts_file)));
        }
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let i = sent % n;
        let body = format!(r#"{{"captured_at":{}}}"#, 1_780_000_000_000u64 + sent);
        expect(
            &ua,
            "POST",
            &format!("/demo/s{i}"),
            &[JSON],
            body.as_bytes(),
            204,
        );
        sent += 1;
    }
    let (t0, c0) = before.expect("measured window");
    let c1 = counts(&counts_file);
    let dt = t0.elapsed().as_secs_f64();
    let achieved = sent as f64 / start.elapsed().as_secs_f64();
    eprintln!(
        "indexes {n}, events/s {achieved:.0}, window {dt:.1} s, binary {}",
        bin.display()
    );
    for (k, v1) in &c1 {
        let v0 = c0.iter().find(|(k0, _)| k0 == k).map_or(0, |x| x.1);
        eprintln!("  {k:6} {:10.1}/s", (v1 - v0) as f64 / dt);
    }
    // Sanity: the pool still indexes (the last stream written is durable soon).
    let last = format!("s{}", (sent.saturating_sub(1)) % n);
    wait_durable(&a.addr, &last, &ua, &format!("/demo/{last}"));
    drop(b);
}
