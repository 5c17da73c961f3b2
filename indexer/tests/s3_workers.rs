//! Against a real S3 server (`ursula-test-s3`: s3s-fs with serialised writes, SigV4):
//! conditional-write races, two workers sharing one prefix, and a fresh worker with an
//! empty cache giving identical answers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sonic_rs::JsonValueTrait;
use support::*;
use ursula_indexer::store::{DynStore, LocalStore, PutMode, S3Settings, S3Store, StoreError};

const T0: i64 = 1_784_370_600_000;

async fn race(store: DynStore) {
    for round in 0..5 {
        let key = format!("race/{round}");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = store.clone();
            let k = key.clone();
            tasks.push(tokio::spawn(async move {
                s.put(&k, Bytes::from(format!("c{i}")), PutMode::CreateOnly)
                    .await
            }));
        }
        let mut etags = Vec::new();
        for t in tasks {
            match t.await.expect("join") {
                Ok(e) => etags.push(e),
                Err(StoreError::PreconditionFailed) => {}
                Err(e) => panic!("create: {e}"),
            }
        }
        assert_eq!(etags.len(), 1, "exactly one creator wins");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = store.clone();
            let k = key.clone();
            let e = etags[0].clone();
            tasks.push(tokio::spawn(async move {
                s.put(&k, Bytes::from(format!("u{i}")), PutMode::IfMatch(e))
                    .await
            }));
        }
        let mut wins = 0;
        for t in tasks {
            match t.await.expect("join") {
                Ok(_) => wins += 1,
                Err(StoreError::PreconditionFailed) => {}
                Err(e) => panic!("cas: {e}"),
            }
        }
        assert_eq!(wins, 1, "exactly one compare-and-swap wins");
        let got = store.get(&key).await.expect("get").expect("present");
        assert!(got.bytes.starts_with(b"u"));
        assert!(matches!(
            store
                .get_if_changed(&key, Some(&got.etag))
                .await
                .expect("cond get"),
            ursula_indexer::store::Fetched::Unchanged
        ));
    }
    assert_eq!(store.list("race/").await.expect("list").len(), 5);
    store.delete("race/0").await.expect("delete");
    assert!(store.get("race/0").await.expect("get").is_none());
}

#[test]
fn conditional_writes_have_one_winner() {
    let dir = tempfile::tempdir().expect("tmp");
    let s3 = test_s3(dir.path());
    let rt = tokio::runtime::Runtime::new().expect("rt");
    // Credentials given to the client directly: setting them in the environment would
    // race with other test threads (child processes get theirs through Command::env).
    rt.block_on(async {
        let s3store = S3Store::connect(&S3Settings {
            bucket: S3_BUCKET.into(),
            prefix: "cas".into(),
            endpoint: Some(s3.url()),
            region: Some("us-east-1".into()),
            path_style: true,
            static_credentials: Some(("testak".into(), "testsecretkey".into())),
        })
        .await;
        race(Arc::new(s3store)).await;
        let local = LocalStore::open(&dir.path().join("local")).expect("local");
        race(Arc::new(local)).await;
    });
}

/// `--put-delay-ms` and `--get-delay-ms` stand in for an object store's latency: every
/// request waits that long, and concurrent requests wait side by side, not one after another
/// behind the write lock.
#[test]
fn the_test_server_delays_each_request_as_configured() {
    let dir = tempfile::tempdir().expect("tmp");
    let delay = Duration::from_millis(250);
    let s3 = test_s3_with(
        dir.path(),
        &[
            "--put-delay-ms".into(),
            "250".into(),
            "--get-delay-ms".into(),
            "250".into(),
        ],
    );
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let store: DynStore = Arc::new(
            S3Store::connect(&S3Settings {
                bucket: S3_BUCKET.into(),
                prefix: "delay".into(),
                endpoint: Some(s3.url()),
                region: Some("us-east-1".into()),
                path_style: true,
                static_credentials: Some(("testak".into(), "testsecretkey".into())),
            })
            .await,
        );
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = store.clone();
            tasks.push(tokio::spawn(async move {
                let t = std::time::Instant::now();
                s.put(&format!("k{i}"), Bytes::from("v"), PutMode::CreateOnly)
                    .await
                    .expect("put");
                t.elapsed()
            }));
        }
        for t in tasks {
            assert!(t.await.expect("join") >= delay, "a PUT waits the delay");
        }
        // One after another they would take 8 delays; side by side, about one.
        assert!(started.elapsed() < delay * 6, "{:?}", started.elapsed());
        let t = std::time::Instant::now();
        assert!(store.get("k0").await.expect("get").is_some());
        assert!(t.elapsed() >= delay, "a GET waits the delay");
    });
}

#[test]
fn two_workers_one_prefix_then_empty_cache() {
    let dir = tempfile::tempdir().expect("tmp");
    let s3 = test_s3(dir.path());
    let u = ursula(dir.path());
    let ua = u.addr.clone();
    let endpoint = s3.url();
    let st = || Store::S3 {
        endpoint: &endpoint,
        prefix: "pool",
    };
    let a = indexer(dir.path(), "a", st(), &[]);
    let b = indexer(dir.path(), "b", st(), &[]);
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    expect(&ua, "PUT", "/demo/w", &[JSON], b"", 201);
    assert_eq!(
        register(&a.addr, "w", &format!("{}/demo/w", u.url()), "").status,
        201
    );
    // The other worker learns about it from CATALOG.
    wait_for(Duration::from_secs(10), "registration visible on b", || {
        (request(&b.addr, "GET", "/v1/indexes/w/status", &[], b"").status == 200).then_some(())
    });
    let batch = |from: i64| {
        let evs: Vec<String> = (from..from + 25)
            .map(|i| format!(r#"{{"captured_at":{},"i":{i}}}"#, T0 + (i * 7919) % 5000))
            .collect();
        expect(
            &ua,
            "POST",
            "/demo/w",
            &[JSON],
            format!("[{}]", evs.join(",")).as_bytes(),
            204,
        );
    };
    for k in 0..8 {
        batch(k * 25);
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_durable(&b.addr, "w", &ua, "/demo/w");
    // Kill one worker mid-stream; the other takes over once the claim lease runs out.
    a.kill();
    for k in 8..16 {
        batch(k * 25);
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_durable(&b.addr, "w", &ua, "/demo/w");
    let on_b = all_entries(&b.addr, "w", T0 - 1, T0 + 100_000, 1000, "");
    assert_eq!(on_b.len(), 400);
    let mut offs: Vec<&str> = on_b.iter().filter_map(|e| e["offset"].as_str()).collect();
    offs.sort();
    offs.dedup();
    assert_eq!(offs.len(), 400, "never lost or duplicated");

    // A fresh worker with an empty cache answers identically from S3 alone.
    let c = indexer(dir.path(), "c-fresh", st(), &[]);
    let on_c = all_entries(&c.addr, "w", T0 - 1, T0 + 100_000, 1000, "");
    assert_eq!(on_c, on_b);
    let first_page = format!("from={T0}&until={}&limit=10", T0 + 2500);
    let page_b = events(&b.addr, "w", &first_page);
    let page_c = events(&c.addr, "w", &first_page);
    assert_eq!(page_b["entries"], page_c["entries"]);
    assert_eq!(page_b["next"], page_c["next"]);
    // Bytes per entry on S3 (parts only).
    let parts: u64 = walk(&dir.path().join("s3-root").join(S3_BUCKET))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    eprintln!(
        "s3 part bytes {parts} for 400 entries ({:.1} B/entry, small parts)",
        parts as f64 / 400.0
    );
}

fn walk(p: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}
