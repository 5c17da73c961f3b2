//! Retention gaps, stream recreation, worker disagreement (block + resume), overlap
//! verification, compaction and GC — against the real binaries, local-directory store.

mod support;

use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::*;

const T0: i64 = 1_784_370_600_000;

fn append(ua: &str, path: &str, from: i64, n: i64) {
    let evs: Vec<String> = (from..from + n)
        .map(|i| format!(r#"{{"captured_at":{}}}"#, T0 + (i * 7919) % 1000))
        .collect();
    expect(
        ua,
        "POST",
        path,
        &[JSON],
        format!("[{}]", evs.join(",")).as_bytes(),
        204,
    );
}

fn count(ia: &str, id: &str) -> usize {
    all_entries(ia, id, T0 - 1, T0 + 100_000, 1000, "").len()
}

/// `ursula` with a stream `/demo/{id}` of `n` events, and worker "a" on `store` with the
/// index `id` over it, durable through the stream's tail.
fn indexed_stream(
    dir: &std::path::Path,
    store: &std::path::Path,
    id: &str,
    n: i64,
) -> (Proc, Proc) {
    let u = ursula(dir);
    let path = format!("/demo/{id}");
    expect(&u.addr, "PUT", "/demo", &[], b"", 201);
    expect(&u.addr, "PUT", &path, &[JSON], b"", 201);
    append(&u.addr, &path, 0, n);
    let ix = indexer(dir, "a", Store::Dir(store), &[]);
    let url = format!("{}{path}", u.url());
    assert_eq!(register(&ix.addr, id, &url, "").status, 201);
    wait_durable(&ix.addr, id, &u.addr, &path);
    (u, ix)
}

fn tail_of(ua: &str, path: &str) -> String {
    request(ua, "HEAD", path, &[], b"")
        .header("stream-next-offset")
        .unwrap_or("")
        .to_string()
}

#[test]
fn retention_gap_then_recreate() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    let (u, ix) = indexed_stream(dir.path(), &store, "r", 10);
    let ua = u.addr.clone();
    let inc = status(&ix.addr, "r")["source"]["incarnation"]
        .as_str()
        .map(str::to_string);
    assert!(inc.is_some());
    ix.kill();

    // While no indexer runs: 10 more events, then retention trims them unread.
    let before = tail_of(&ua, "/demo/r");
    append(&ua, "/demo/r", 10, 10);
    let cut = tail_of(&ua, "/demo/r");
    let snap = request(
        &ua,
        "PUT",
        &format!("/demo/r/snapshot/{cut}"),
        &[],
        b"state",
    );
    assert!(
        snap.status == 201 || snap.status == 204,
        "snapshot: {}",
        snap.text()
    );
    expect(
        &ua,
        "PUT",
        &format!("/demo/r/retention/{cut}"),
        &[],
        b"",
        204,
    );
    append(&ua, "/demo/r", 20, 5);

    let ix = indexer(dir.path(), "a", Store::Dir(&store), &[]);
    wait_durable(&ix.addr, "r", &ua, "/demo/r");
    let s = status(&ix.addr, "r");
    let trimmed = cut.parse::<u64>().unwrap_or(0) - before.parse::<u64>().unwrap_or(0);
    assert_eq!(s["coverage"]["complete"].as_bool(), Some(false));
    assert_eq!(s["coverage"]["trimmed_bytes"].as_u64(), Some(trimmed));
    assert_eq!(s["coverage"]["floor"].as_str(), Some(cut.as_str()));
    assert_eq!(
        count(&ix.addr, "r"),
        5,
        "entries below the floor are never returned"
    );

    // Recreate the stream: the index restarts on the new incarnation.
    expect(&ua, "DELETE", "/demo/r", &[], b"", 204);
    expect(&ua, "PUT", "/demo/r", &[JSON], b"", 201);
    append(&ua, "/demo/r", 0, 3);
    let s = wait_for(Duration::from_secs(20), "restart", || {
        let r = request(&ix.addr, "GET", "/v1/indexes/r/status", &[], b"");
        let v = (r.status == 200).then(|| r.json())?;
        (v["restarted_from_incarnation"].as_str() == inc.as_deref()).then_some(v)
    });
    assert_ne!(s["source"]["incarnation"].as_str(), inc.as_deref());
    wait_durable(&ix.addr, "r", &ua, "/demo/r");
    assert_eq!(count(&ix.addr, "r"), 3);
    let s = status(&ix.addr, "r");
    assert_eq!(
        s["coverage"]["complete"].as_bool(),
        Some(true),
        "a new namespace starts clean"
    );
}

#[test]
fn disagreement_blocks_until_resume() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    let (u, a) = indexed_stream(dir.path(), &store, "d", 20);
    let ua = u.addr.clone();
    let reference = all_entries(&a.addr, "d", T0 - 1, T0 + 100_000, 1000, "");
    a.kill();

    // A worker that re-reads everything and agrees: only the new suffix is added.
    let b = indexer(dir.path(), "b", Store::Dir(&store), &["--debug-reingest"]);
    append(&ua, "/demo/d", 20, 3);
    wait_durable(&b.addr, "d", &ua, "/demo/d");
    assert_eq!(
        status(&b.addr, "d")["status"]["state"].as_str(),
        Some("ready")
    );
    assert_eq!(
        count(&b.addr, "d"),
        23,
        "overlap verified, nothing duplicated"
    );
    b.kill();

    // A worker that extracts differently: the index blocks but stays queryable.
    let c = indexer(
        dir.path(),
        "c",
        Store::Dir(&store),
        &["--debug-reingest", "--debug-time-offset-ms", "1000"],
    );
    append(&ua, "/demo/d", 23, 2);
    let s = wait_for(Duration::from_secs(20), "blocked", || {
        let s = status(&c.addr, "d");
        (s["status"]["state"].as_str() == Some("blocked")).then_some(s)
    });
    assert!(s["status"]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("different")));
    let now = all_entries(&c.addr, "d", T0 - 1, T0 + 100_000, 1000, "");
    assert_eq!(now.len(), 23);
    assert_eq!(
        &now[..],
        &all_entries(&c.addr, "d", T0 - 1, T0 + 100_000, 1000, "")[..]
    );
    assert!(reference.iter().all(|e| now.contains(e)));
    assert_eq!(
        blocked_gauge(&c.addr, "d"),
        Some(1),
        "a blocked index shows in the metrics"
    );
    c.kill();

    // Repaired worker + resume: ingest continues.
    let a = indexer(dir.path(), "a", Store::Dir(&store), &[]);
    let r = expect(
        &a.addr,
        "POST",
        "/v1/indexes/d/status/resume",
        &[],
        b"",
        200,
    )
    .json();
    assert_eq!(r["status"]["state"].as_str(), Some("ready"));
    expect(
        &a.addr,
        "POST",
        "/v1/indexes/d/status/resume",
        &[],
        b"",
        200,
    );
    wait_durable(&a.addr, "d", &ua, "/demo/d");
    assert_eq!(count(&a.addr, "d"), 25);
    assert_eq!(blocked_gauge(&a.addr, "d"), Some(0));
}

/// `ursula_indexer_index_blocked{index="ID"}` on the worker at `ia`.
fn blocked_gauge(ia: &str, id: &str) -> Option<i64> {
    let text = expect(ia, "GET", "/metrics", &[], b"", 200).text();
    let series = format!("ursula_indexer_index_blocked{{index=\"{id}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// The one index's manifest slot in the manifest shards (`shards/NN.json`): its namespace
/// (from the key `indexes/{ns}/CURRENT`) and the manifest.
fn manifest_slot(store: &std::path::Path) -> Option<(String, sonic_rs::Value)> {
    for ent in std::fs::read_dir(store.join("shards")).ok()?.flatten() {
        let Ok(bytes) = std::fs::read(ent.path()) else {
            continue;
        };
        let Ok(doc) = sonic_rs::from_slice::<sonic_rs::Value>(&bytes) else {
            continue;
        };
        for (k, v) in doc["slots"].as_object()?.iter() {
            if let Some(ns) = k
                .strip_prefix("indexes/")
                .and_then(|r| r.strip_suffix("/CURRENT"))
            {
                return Some((ns.to_string(), sonic_rs::from_str(v.as_str()?).ok()?));
            }
        }
    }
    None
}

fn read_manifest(store: &std::path::Path) -> Option<sonic_rs::Value> {
    manifest_slot(store).map(|(_, m)| m)
}

/// Every part key the manifest names, live or retired.
fn named_keys(m: &sonic_rs::Value) -> Option<Vec<String>> {
    Some(
        m["parts"]
            .as_array()?
            .iter()
            .chain(m["retired_parts"].as_array()?.iter())
            .filter_map(|p| p["key"].as_str().map(str::to_string))
            .collect(),
    )
}

/// Create the stream `/demo/c`, register index `c` on it with worker `ix`, append
/// `batches` x 50 events, wait until all are durable, and return every entry.
fn fill_c(ix: &str, u: &Proc, batches: i64, pause: Duration) -> Vec<sonic_rs::Value> {
    expect(&u.addr, "PUT", "/demo", &[], b"", 201);
    expect(&u.addr, "PUT", "/demo/c", &[JSON], b"", 201);
    assert_eq!(
        register(ix, "c", &format!("{}/demo/c", u.url()), "").status,
        201
    );
    for k in 0..batches {
        append(&u.addr, "/demo/c", k * 50, 50);
        std::thread::sleep(pause);
    }
    wait_durable(ix, "c", &u.addr, "/demo/c");
    let all = all_entries(ix, "c", T0 - 1, T0 + 100_000, 1000, "");
    assert_eq!(all.len() as i64, batches * 50);
    all
}

fn levels(m: &sonic_rs::Value) -> Vec<u64> {
    m["parts"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["level"].as_u64()).collect())
        .unwrap_or_default()
}

/// An owner killed in the middle of its index's first compaction leaves the outputs it
/// uploaded under `parts/`, named by no manifest. The next owner must find them although
/// the index never compacted before and receives no new events: it finishes the compaction
/// that is still due, and GC deletes the orphan once past the grace window.
#[test]
fn a_dead_owners_unpublished_compaction_is_collected_while_the_index_is_idle() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let store = dir.path().join("store");
    // First owner: level-0 parts of 40 entries, and compaction out of reach.
    let a = indexer(
        dir.path(),
        "a",
        Store::Dir(&store),
        &["--commit-entries", "40", "--compact-parts", "100"],
    );
    let all = fill_c(&a.addr, &u, 4, Duration::from_millis(100));
    let before = read_manifest(&store).expect("manifest");
    let l0 = levels(&before);
    assert!(
        l0.len() >= 3 && l0.iter().all(|l| *l == 0),
        "level-0 parts only: {l0:?}"
    );
    // Killed (SIGKILL) with its claim held, as if mid-compaction: an output it uploaded
    // but never published, old enough to be past any grace window.
    drop(a);
    let (ns, _) = manifest_slot(&store).expect("manifest slot");
    let parts_dir = store.join("indexes").join(&ns).join("parts");
    std::fs::create_dir_all(&parts_dir).expect("mkdir parts");
    let orphan = parts_dir.join(format!("{}.parquet", "0".repeat(32)));
    std::fs::write(&orphan, b"an unpublished compaction output").expect("write orphan");
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&orphan)
        .and_then(|f| f.set_modified(hour_ago))
        .expect("age the orphan");
    // The next owner, with compaction now due (3 parts) and nothing new to index.
    let b = indexer(
        dir.path(),
        "b",
        Store::Dir(&store),
        &[
            "--compact-parts",
            "3",
            "--gc-interval-ms",
            "200",
            "--gc-grace-ms",
            "1500",
            "--gc-retain-generations",
            "1",
        ],
    );
    wait_for(Duration::from_secs(30), "orphan collected", || {
        (!orphan.exists()).then_some(())
    });
    let after = read_manifest(&store).expect("manifest");
    assert!(
        levels(&after).contains(&1),
        "the due compaction ran while idle: {:?}",
        levels(&after)
    );
    assert_eq!(
        after["durable_offset"], before["durable_offset"],
        "no new events were indexed"
    );
    // Every object left under parts/ is one the manifest names.
    let named = named_keys(&after).expect("part lists");
    for ent in std::fs::read_dir(&parts_dir).expect("ls parts").flatten() {
        let key = format!("indexes/{ns}/parts/{}", ent.file_name().to_string_lossy());
        assert!(named.contains(&key), "{key} is named by the manifest");
    }
    assert_eq!(
        all_entries(&b.addr, "c", T0 - 1, T0 + 100_000, 1000, ""),
        all,
        "answers unchanged"
    );
}

#[test]
fn compaction_keeps_answers_and_gc_reclaims() {
    let dir = tempfile::tempdir().expect("tmp");
    let u = ursula(dir.path());
    let store = dir.path().join("store");
    let flags = [
        "--commit-entries",
        "40",
        "--compact-parts",
        "3",
        "--compaction-max-entries",
        "1024",
        "--gc-interval-ms",
        "100",
        "--gc-grace-ms",
        "1500",
        "--gc-retain-generations",
        "1",
    ];
    let a = indexer(dir.path(), "a", Store::Dir(&store), &flags);
    let all = fill_c(&a.addr, &u, 30, Duration::from_millis(30));
    let mut offs: Vec<&str> = all.iter().filter_map(|e| e["offset"].as_str()).collect();
    offs.sort();
    offs.dedup();
    assert_eq!(offs.len(), 1500, "no duplicates after compaction");
    // Read the manifest: level-1 parts of the day are disjoint in time.
    let ns_dir = std::fs::read_dir(store.join("indexes"))
        .expect("ls")
        .flatten()
        .next()
        .expect("ns")
        .path();
    let m = read_manifest(&store).expect("manifest in a shard");
    let parts = m["parts"].as_array().expect("parts");
    let mut l1: Vec<(i64, i64)> = parts
        .iter()
        .filter(|p| p["level"].as_u64() == Some(1))
        .map(|p| {
            (
                p["min_t_ms"].as_i64().unwrap_or(0),
                p["max_t_ms"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert!(!l1.is_empty(), "compaction ran");
    l1.sort();
    assert!(
        l1.windows(2).all(|w| w[0].1 <= w[1].0),
        "level-1 runs are time-disjoint: {l1:?}"
    );
    // GC: the part files on disk are exactly the referenced ones, eventually.
    // Level-0 parts live in packs (`packs/<hash>.pack`), compaction outputs under the
    // namespace; both kinds are counted.
    wait_for(Duration::from_secs(30), "gc", || {
        let keys = named_keys(&read_manifest(&store)?)?;
        let own = keys.iter().filter(|k| !k.starts_with("packs/")).count();
        let mut packs: Vec<String> = keys
            .iter()
            .filter_map(|k| {
                k.strip_prefix("packs/")?
                    .split('/')
                    .next()
                    .map(str::to_string)
            })
            .collect();
        packs.sort();
        packs.dedup();
        let on_disk = std::fs::read_dir(ns_dir.join("parts")).ok()?.count();
        let packs_on_disk = std::fs::read_dir(store.join("packs")).ok()?.count();
        (on_disk == own && packs_on_disk == packs.len()).then_some(())
    });
    // And answers are unchanged by all of it.
    assert_eq!(
        all_entries(&a.addr, "c", T0 - 1, T0 + 100_000, 1000, ""),
        all
    );
}
