//! Restarting a worker, as `systemctl restart ursula-indexer` does: a SIGTERM must commit
//! what the worker indexed in memory and hand its ingest claims back, so that the worker
//! started next picks up at once rather than after the lease, and does not re-read the
//! stream from the start. Also: the log written to a file carries no colour codes.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::*;

const T0: i64 = 1_784_370_600_000; // 2026-07-18T10:30:00Z

/// Long enough that, within the test, only the shutdown can commit the tail and only a
/// released claim can be taken by another worker.
const SLOW: [&str; 4] = ["--commit-interval-ms", "600000", "--lease-ms", "60000"];

fn append_event(ua: &str, stream: &str, t: i64) {
    let body = format!(r#"[{{"captured_at":{t}}}]"#);
    expect(ua, "POST", stream, &[JSON], body.as_bytes(), 204);
}

fn visible(ix: &str, id: &str, t: i64) -> bool {
    let v = events(ix, id, &format!("from={t}&until={}", t + 1));
    v["entries"].as_array().map(|a| a.len()) == Some(1)
}

fn terminate(p: &mut Proc, timeout: Duration) -> std::process::ExitStatus {
    let st = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -TERM");
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = p.child.try_wait() {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "indexer still running {timeout:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stopped_worker_commits_its_tail_and_the_next_one_ingests_at_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let ua = u.addr.clone();
    let store = dir.path().join("store");
    expect(&ua, "PUT", "/rest", &[], b"", 201);
    expect(&ua, "PUT", "/rest/ev", &[JSON], b"", 201);
    let stream_url = format!("{}/rest/ev", u.url());

    // Distinct worker ids, as two processes started without --worker-id get.
    let mut first = indexer(dir.path(), "first", Store::Dir(&store), &SLOW);
    let r = register(&first.addr, "ev", &stream_url, "");
    assert_eq!(r.status, 201, "{}", r.text());
    for i in 0..50 {
        append_event(&ua, "/rest/ev", T0 + i);
    }
    wait_for(Duration::from_secs(10), "the events in the tail", || {
        visible(&first.addr, "ev", T0 + 49).then_some(())
    });
    let tail = request(&ua, "HEAD", "/rest/ev", &[], b"")
        .header("stream-next-offset")
        .expect("next offset")
        .to_string();
    // Queryable from memory only: the commit interval has not come round.
    let before = status(&first.addr, "ev");
    assert_ne!(
        before["coverage"]["durable"].as_str(),
        Some(tail.as_str()),
        "{before:?}"
    );
    assert_eq!(before["parts"].as_u64(), Some(0), "{before:?}");

    let st = terminate(&mut first, Duration::from_secs(25));
    assert!(st.success(), "indexer exit status {st:?}");
    let log = std::fs::read(dir.path().join("indexer-first.log")).expect("indexer log");
    assert!(
        !log.contains(&0x1b),
        "the log written to a file has escape codes: {:?}",
        String::from_utf8_lossy(&log[..log.len().min(300)])
    );
    drop(first);

    let started = Instant::now();
    let second = indexer(dir.path(), "second", Store::Dir(&store), &SLOW);
    let s = status(&second.addr, "ev");
    assert_eq!(
        s["coverage"]["durable"].as_str(),
        Some(tail.as_str()),
        "the stopped worker's tail was not committed: {s:?}"
    );
    assert!(s["parts"].as_u64().unwrap_or(0) >= 1, "{s:?}");
    // Nothing was lost either: every event answers from the committed parts.
    let all = events(&second.addr, "ev", &format!("from={T0}&until={}", T0 + 50));
    assert_eq!(
        all["entries"].as_array().map(|a| a.len()),
        Some(50),
        "{all:?}"
    );

    // The claim was handed back, so the new worker ingests at once (a held claim would
    // keep it following for the 60 s lease).
    let t = T0 + 1_000;
    append_event(&ua, "/rest/ev", t);
    let appended = Instant::now();
    wait_for(
        Duration::from_secs(20),
        "the event appended after the restart",
        || visible(&second.addr, "ev", t).then_some(()),
    );
    let fresh = appended.elapsed();
    eprintln!(
        "restart to first query {:?}; appended -> queryable after the restart {fresh:?}",
        appended.duration_since(started)
    );
    // Steady state is a few hundred ms; the margin is for a loaded CI machine, far below
    // the lease.
    assert!(
        fresh < Duration::from_secs(3),
        "appended -> queryable took {fresh:?}"
    );
}
