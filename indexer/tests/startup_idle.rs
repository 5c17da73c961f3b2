//! A worker listens before its indexes are open, and an idle index costs the source about
//! one long-poll per the source's long-poll timeout, so a worker with 10 000 indexes
//! stays cheap for the source.

mod support;

use std::time::{Duration, Instant};

use sonic_rs::JsonContainerTrait;
use support::*;

/// Requests `ursula` answered on stream routes (reads, HEADs, appends), by method.
fn stream_requests(ua: &str, method: &str) -> u64 {
    let text = get(ua, "/__ursula/metrics").text();
    text.lines()
        .filter(|l| l.starts_with("ursula_http_requests_total{"))
        .filter(|l| l.contains("route=\"stream\""))
        .filter(|l| l.contains(&format!("method=\"{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The test `ursula` holds a long-poll 2 s (`support::ursula`). Before, the owner abandoned
/// each long-poll after at most 1 s to send its once-a-second HEAD: about 2 requests/s per
/// idle index whatever the source's timeout. Now the long-poll stays in flight and an idle
/// source is HEADed every 30 s: about 0.5 requests/s here.
#[test]
fn an_idle_index_costs_one_long_poll_per_source_timeout() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let ua = u.addr.clone();
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    expect(&ua, "PUT", "/demo/idle", &[JSON], b"", 201);
    expect(
        &ua,
        "POST",
        "/demo/idle",
        &[JSON],
        br#"[{"captured_at":1784370600000},{"captured_at":1784370600001}]"#,
        204,
    );
    let store = dir.path().join("store");
    let ix = indexer(dir.path(), "a", Store::Dir(&store), &[]);
    let r = register(&ix.addr, "idle", &format!("{}/demo/idle", u.url()), "");
    assert_eq!(r.status, 201, "{}", r.text());
    wait_durable(&ix.addr, "idle", &ua, "/demo/idle");
    // Let the first idle HEAD and the reads that caught up pass.
    std::thread::sleep(Duration::from_secs(2));
    let (get0, head0) = (stream_requests(&ua, "GET"), stream_requests(&ua, "HEAD"));
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let secs = t0.elapsed().as_secs_f64();
    let gets = stream_requests(&ua, "GET") - get0;
    let heads = stream_requests(&ua, "HEAD") - head0;
    eprintln!("idle index over {secs:.1} s: {gets} GET, {heads} HEAD");
    // 10 s / 2 s = 5 long-polls; one more for the window's edges. The idle HEAD period
    // (30 s) may fall inside the window once.
    assert!(gets <= 6, "{gets} GETs in {secs:.1} s from one idle index");
    assert!(
        heads <= 1,
        "{heads} HEADs in {secs:.1} s from one idle index"
    );
    // Still tailing: a new event shows up without waiting for a timeout to pass.
    expect(
        &ua,
        "POST",
        "/demo/idle",
        &[JSON],
        br#"[{"captured_at":1784370600002}]"#,
        204,
    );
    let appended = Instant::now();
    wait_for(Duration::from_secs(5), "new event queryable", || {
        let v = events(&ix.addr, "idle", "from=0&until=9999999999999");
        (v["entries"].as_array().map(|a| a.len()) == Some(3)).then_some(())
    });
    assert!(
        appended.elapsed() < Duration::from_secs(1),
        "an event on an idle index took {:?} to be queryable",
        appended.elapsed()
    );
}

/// A worker whose indexes take long to open (here: `--debug-open-delay-ms`, in production:
/// thousands of them) answers `/livez` at once, `/readyz` 503 until every index is open,
/// and a query for an index that is still opening waits for it (up to 10 s, then 503 with
/// `Retry-After`).
#[test]
fn a_worker_listens_before_its_indexes_are_open() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let ua = u.addr.clone();
    expect(&ua, "PUT", "/demo", &[], b"", 201);
    let store = dir.path().join("store");
    let first = indexer(dir.path(), "a", Store::Dir(&store), &[]);
    for id in ["o0", "o1"] {
        let path = format!("/demo/{id}");
        expect(&ua, "PUT", &path, &[JSON], b"", 201);
        expect(
            &ua,
            "POST",
            &path,
            &[JSON],
            br#"[{"captured_at":1784370600000},{"captured_at":1784370600005}]"#,
            204,
        );
        let r = register(&first.addr, id, &format!("{}{path}", u.url()), "");
        assert_eq!(r.status, 201, "{}", r.text());
        wait_durable(&first.addr, id, &ua, &path);
    }
    let q = "from=0&until=9999999999999";
    let before = events(&first.addr, "o0", q)["entries"].clone();
    let durable_o1 = status(&first.addr, "o1")["coverage"]["durable"].clone();
    drop(first);

    // Every open takes 12 s: longer than a query waits for one (10 s).
    let started = Instant::now();
    let ix = indexer(
        dir.path(),
        "b",
        Store::Dir(&store),
        &["--debug-open-delay-ms", "12000"],
    );
    let r = get(&ix.addr, "/livez");
    assert_eq!(r.status, 204);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "listening took {:?}",
        started.elapsed()
    );
    let r = get(&ix.addr, "/readyz");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.text().contains("0 of 2 open"), "{}", r.text());

    // Still opening after 10 s: a clear 503 the client can retry.
    let r = get(&ix.addr, &format!("/v1/indexes/o0/events?{q}"));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.text().contains("opening"), "{}", r.text());
    // Asked again, it waits for the open in flight and answers as before the restart.
    let r = get(&ix.addr, &format!("/v1/indexes/o0/events?{q}"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["entries"], before);
    wait_for(Duration::from_secs(20), "/readyz 204", || {
        (get(&ix.addr, "/readyz").status == 204).then_some(())
    });
    assert_eq!(status(&ix.addr, "o1")["coverage"]["durable"], durable_o1);
}
