//! Measurement, not a regression test (`--ignored`): for many small indexes, idle and then
//! at a steady event rate, S3 requests per second (counted by `ursula-test-s3
//! --counts-file`), requests per second the workers send to the source `ursula` (from its
//! `/metrics`), per index, and the workers' memory. Above 1 000 indexes, all but the first
//! are registered with one CATALOG write through the library.
//!
//! ```text
//! MANY_STREAMS_N=1000 MANY_STREAMS_RATE=500 MANY_STREAMS_SECS=30 \
//!   cargo test --release -p ursula-indexer --test many_streams -- --ignored --nocapture
//! ```
//!
//! Two workers share one prefix (the pool case: the second one follows every index it does
//! not own). The second one starts after every index is registered, and the time it takes
//! to listen and to be ready (`/readyz`: every index open) is reported. `MANY_STREAMS_INDEXER` runs another `ursula-indexer` binary (e.g. an older
//! build) for a before/after comparison.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use ursula_indexer::manifest::{self, Catalog};
use ursula_indexer::store::{DynStore, S3Settings, S3Store};

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

/// Requests `ursula` answered, by method, from its `/metrics`.
fn source_requests(ua: &str) -> Vec<(String, u64)> {
    // The source's metrics live under its internal prefix (`/metrics` is a bucket).
    let text = get(ua, "/__ursula/metrics").text();
    let mut by_method: Vec<(String, u64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("ursula_http_requests_total{") else {
            continue;
        };
        let method = rest
            .split("method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next())
            .unwrap_or("?");
        let v: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        match by_method.iter_mut().find(|(m, _)| m == method) {
            Some(e) => e.1 += v,
            None => by_method.push((method.to_string(), v)),
        }
    }
    by_method
}

/// `VmRSS` and `VmHWM` of a process, in MiB.
fn memory_mib(p: &Proc) -> (u64, u64) {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", p.child.id())).unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (kib("VmRSS:") / 1024, kib("VmHWM:") / 1024)
}

/// Counters at the start of a measured window.
struct Window {
    t0: Instant,
    s3: Vec<(String, u64)>,
    source: Vec<(String, u64)>,
}

impl Window {
    fn start(counts_file: &Path, ua: &str) -> Window {
        Window {
            t0: Instant::now(),
            s3: counts(counts_file),
            source: source_requests(ua),
        }
    }

    /// Print S3 requests/s, source requests/s per index, and the workers' memory.
    fn report(&self, what: &str, n: u64, counts_file: &Path, ua: &str, workers: &[&Proc]) {
        let dt = self.t0.elapsed().as_secs_f64();
        let rate = |now: &[(String, u64)], then: &[(String, u64)], k: &str| {
            let v0 = then.iter().find(|(k0, _)| k0 == k).map_or(0, |x| x.1);
            let v1 = now.iter().find(|(k1, _)| k1 == k).map_or(0, |x| x.1);
            v1.saturating_sub(v0) as f64 / dt
        };
        eprintln!("{what}: {n} indexes, window {dt:.1} s");
        let s3 = counts(counts_file);
        for (k, _) in &s3 {
            eprintln!("  S3 {k:6} {:10.1}/s", rate(&s3, &self.s3, k));
        }
        let source = source_requests(ua);
        let mut total = 0.0;
        for (m, _) in &source {
            let r = rate(&source, &self.source, m);
            total += r;
            eprintln!(
                "  source {m:6} {r:10.1}/s ({:.3}/s per index)",
                r / n as f64
            );
        }
        eprintln!(
            "  source total {total:10.1}/s ({:.3}/s per index)",
            total / n as f64
        );
        for (i, w) in workers.iter().enumerate() {
            let (rss, hwm) = memory_mib(w);
            eprintln!("  worker {i}: RSS {rss} MiB (peak {hwm} MiB)");
        }
    }
}

/// Register `s1..n` (like `s0`, already registered through the API) with one CATALOG
/// compare-and-swap through the library: the HTTP route rewrites the whole CATALOG once
/// per registration, which is O(n²) bytes at 10 000 indexes.
fn bulk_register(s3_url: &str, ua: &str, n: u64) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let store: DynStore = Arc::new(
            S3Store::connect(&S3Settings {
                bucket: S3_BUCKET.into(),
                prefix: "many".into(),
                endpoint: Some(s3_url.to_string()),
                region: Some("us-east-1".into()),
                path_style: true,
                static_credentials: Some(("testak".into(), "testsecretkey".into())),
            })
            .await,
        );
        let (_, done) = manifest::update::<Catalog, ()>(&store, manifest::CATALOG_KEY, 8, |cur| {
            let mut next = cur.cloned().expect("a CATALOG");
            let template = next
                .registrations
                .iter()
                .find(|r| r.id == "s0")
                .cloned()
                .expect("s0 is registered");
            next.registrations.retain(|r| r.id == "s0");
            for i in 1..n {
                let mut r = template.clone();
                r.id = format!("s{i}");
                r.stream_url = template
                    .stream_url
                    .replace("/demo/s0", &format!("/demo/s{i}"));
                r.incarnation = request(ua, "HEAD", &format!("/demo/s{i}"), &[], b"")
                    .header("stream-incarnation")
                    .map(str::to_string);
                next.registrations.push(r);
            }
            Ok((Some(next), ()))
        })
        .await
        .expect("bulk register");
        assert_eq!(done.map(|d| d.value.registrations.len()), Some(n as usize));
    });
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
    // Every owned index holds one long-poll open: more connections than the default
    // 10 000 at 10 000 indexes.
    let u = ursula_with(dir.path(), &["--max-connections", "40000"]);
    let ua = u.addr.clone();
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    for i in 0..n {
        expect(&ua, "PUT", &format!("/demo/s{i}"), &[JSON], b"", 201);
    }
    let a = worker(dir.path(), &bin, "a", &s3.url());
    let started = Instant::now();
    let bulk = n > 1000;
    for i in 0..if bulk { 1 } else { n } {
        let r = register(
            &a.addr,
            &format!("s{i}"),
            &format!("{}/demo/s{i}", u.url()),
            "",
        );
        assert!(r.status == 201 || r.status == 200, "register: {}", r.text());
    }
    if bulk {
        bulk_register(&s3.url(), &ua, n);
    }
    eprintln!(
        "registered {n} indexes in {:?}{}",
        started.elapsed(),
        if bulk { " (one CATALOG write)" } else { "" }
    );
    // The second worker starts with every index in CATALOG: it listens at once and opens
    // them in the background; /readyz turns 204 once all are open.
    let b_started = Instant::now();
    let b = worker(dir.path(), &bin, "b", &s3.url());
    let listening = b_started.elapsed();
    loop {
        let r = request(&b.addr, "GET", "/readyz", &[], b"");
        if r.status == 204 {
            break;
        }
        assert!(
            b_started.elapsed() < Duration::from_secs(600),
            "second worker not ready: {}",
            r.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "second worker: listening after {listening:?}, ready (all {n} indexes open) after {:?}",
        b_started.elapsed()
    );
    let workers = [&a, &b];
    // Idle: every index registered and open, no events. What the pool costs the object
    // store and the source when nothing happens.
    let warmup = Duration::from_secs(15);
    std::thread::sleep(warmup);
    let idle = Window::start(&counts_file, &ua);
    std::thread::sleep(Duration::from_secs(secs));
    idle.report("idle", n, &counts_file, &ua, &workers);
    // Steady load: `rate` events/s round-robin over the streams, for a warm-up of 15 s
    // and then the measured window.
    let total = warmup + Duration::from_secs(secs);
    let start = Instant::now();
    let mut before = None;
    let mut sent = 0u64;
    while start.elapsed() < total {
        if before.is_none() && start.elapsed() >= warmup {
            before = Some(Window::start(&counts_file, &ua));
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
    let achieved = sent as f64 / start.elapsed().as_secs_f64();
    eprintln!(
        "indexes {n}, events/s {achieved:.0}, binary {}",
        bin.display()
    );
    let active = before.expect("measured window");
    active.report("active", n, &counts_file, &ua, &workers);
    // Sanity: the pool still indexes (the last stream written is durable soon).
    let last = format!("s{}", (sent.saturating_sub(1)) % n);
    wait_durable(&a.addr, &last, &ua, &format!("/demo/{last}"));
    drop(b);
}
