//! A worker listens before its indexes are open (issue #6: 10 000 indexes).

mod support;

use std::time::{Duration, Instant};

use support::*;

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
