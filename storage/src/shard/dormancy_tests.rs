//! Dormant streams: idle streams leave memory and come back whole on first use, across
//! crashes and clean restarts; a stream with something in flight stays resident; expiry
//! finds dormant streams without waking the others; index files go once nothing sleeps in
//! them; a checkpoint taken in slices gets every stream as it was when it began.

use std::path::Path;

use bytes::Bytes;

use crate::position::off;
use crate::record::{Lifetime, ProducerStamp};
use crate::slices::Slices;
use crate::test_support::block_on;

use super::*;

fn config(dir: &Path) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    cfg.cache_bytes = 4096;
    cfg.checkpoint_bytes = u64::MAX;
    cfg.idle_after = Duration::ZERO;
    cfg
}

fn new_stream(key: &str, lifetime: Lifetime) -> NewStream {
    NewStream {
        meta: StreamMeta {
            key: key.into(),
            incarnation: 3,
            created_ms: 1,
            content_type: "text/plain".into(),
            lifetime,
            ext: Bytes::from_static(b"ext"),
        },
        initial: AppendRec::default(),
    }
}

fn data(bytes: &str, producer_seq: Option<u64>) -> AppendRec {
    AppendRec {
        append_lens: vec![bytes.len() as u32],
        msg_lens: vec![bytes.len() as u32],
        data: Bytes::copy_from_slice(bytes.as_bytes()),
        producer: producer_seq.map(|seq| ProducerStamp {
            id: "p".into(),
            epoch: 1,
            seq,
        }),
        ..Default::default()
    }
}

/// `n` streams `s0..`, each with `appends` appends ("k.a;" for stream k, append a), the
/// first two by producer `p`.
async fn fill(shard: &Shard, n: usize, appends: usize) {
    for k in 0..n {
        let (id, c) = shard
            .create(new_stream(&format!("s{k}"), Lifetime::Forever))
            .expect("create");
        c.durable().await.expect("durable");
        for a in 0..appends {
            let seq = (a < 2).then_some(a as u64);
            let (_, c) = shard
                .append(id, data(&format!("{k}.{a};"), seq))
                .expect("append");
            c.durable().await.expect("durable");
        }
    }
}

fn expected(k: usize, appends: usize) -> Vec<u8> {
    (0..appends)
        .map(|a| format!("{k}.{a};"))
        .collect::<String>()
        .into_bytes()
}

async fn read_all(shard: &Shard, key: &str) -> Vec<u8> {
    let id = shard.lookup(key).expect("key");
    shard
        .read(id, off(0), off(u64::MAX))
        .await
        .expect("read")
        .concat()
}

#[test]
fn idle_streams_sleep_and_wake_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        fill(&shard, 40, 30).await;
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(shard.stream_counts(), (40, 40), "every idle stream sleeps");
        assert_eq!(
            shard.resident_bytes(),
            0,
            "their cached bytes left with them"
        );
        for k in 0..40 {
            assert_eq!(read_all(&shard, &format!("s{k}")).await, expected(k, 30));
        }
        assert_eq!(shard.stream_counts(), (40, 0), "each woke on its read");
        shard.sleep_idle().await.expect("sleep");
        // Everything a stream is comes back: metadata, producer state, records.
        let id = shard.lookup("s7").expect("s7");
        {
            let s = shard.state(id).expect("woken");
            assert_eq!((s.meta.incarnation, &s.meta.ext[..]), (3, &b"ext"[..]));
            assert_eq!(s.meta.content_type.as_ref(), "text/plain");
            assert_eq!(s.message_count().get(), 30);
            assert_eq!(
                s.message_start(crate::position::rec(29)),
                Some(off(10 * 4 + 19 * 5))
            );
            // What a retried producer append is answered with.
            let p = &s.producers["p"];
            assert_eq!((p.epoch, p.last_seq), (1, 1));
            assert_eq!(
                p.receipt(1).map(|r| (r.start, r.next)),
                Some((off(4), off(8)))
            );
        }
        shard.sleep_idle().await.expect("sleep");
        let (r, c) = shard.append(id, data("new;", Some(2))).expect("append");
        c.durable().await.expect("durable");
        assert_eq!(r.start, off(10 * 4 + 20 * 5));
        assert_eq!(
            read_all(&shard, "s7").await,
            [expected(7, 30), b"new;".to_vec()].concat()
        );
        shard.halt().await.expect("halt");
    });
}

#[test]
fn dormant_streams_stay_dormant_across_restarts_and_crashes() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        fill(&shard, 30, 20).await;
        shard.sleep_idle().await.expect("sleep");
        shard.checkpoint().await.expect("checkpoint");
        // Woken after the checkpoint and changed: the log replays on top of its saved state.
        let id = shard.lookup("s3").expect("s3");
        let (_, c) = shard.append(id, data("after;", None)).expect("append");
        c.durable().await.expect("durable");
        shard.halt().await.expect("halt");
    });
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(report.streams, 30);
        assert_eq!(shard.stream_counts(), (30, 29), "loaded as they slept");
        for k in 0..30 {
            let mut want = expected(k, 20);
            if k == 3 {
                want.extend_from_slice(b"after;");
            }
            assert_eq!(read_all(&shard, &format!("s{k}")).await, want, "s{k}");
        }
        shard.sleep_idle().await.expect("sleep");
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(shard.stream_counts(), (30, 30));
        assert_eq!(
            read_all(&shard, "s3").await,
            [expected(3, 20), b"after;".to_vec()].concat()
        );
        // Files nobody sleeps in any more go with the next checkpoint.
        for k in 0..30 {
            read_all(&shard, &format!("s{k}")).await;
        }
        shard.sleep_idle().await.expect("sleep");
        shard.checkpoint().await.expect("checkpoint");
        let files = std::fs::read_dir(dir.path().join("shard-0"))
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".idx"))
            })
            .count();
        assert_eq!(files, 1, "only the newest file holds sleeping streams");
        shard.halt().await.expect("halt");
    });
}

/// Start a checkpoint in a task of its own, and return once it has numbered the streams and
/// serves requests between its slices.
async fn start_checkpoint(
    shard: &Shard,
) -> impl std::future::Future<Output = Result<bool, StorageError>> {
    // The upkeep task is idle (so the checkpoint need not wait for it on a timer, which
    // would not fire while this task keeps yielding).
    shard.wait_for_upkeep().await;
    shard.inner.upkeep_busy.set(false);
    let checkpointer = shard.clone();
    let checkpoint = monoio::spawn(async move { checkpointer.checkpoint().await });
    while !shard.inner.catalog.borrow().checkpoint_open() {
        crate::slices::yield_to_requests().await;
    }
    checkpoint
}

/// A checkpoint lists the dormant streams in slices with requests served in between: streams
/// woken, changed or deleted meanwhile are in it as they were when it began, and the log
/// after it brings them to what they became.
#[test]
fn a_checkpoint_lists_streams_as_they_were_though_they_wake_while_it_runs() {
    const STREAMS: usize = 200;
    let dir = tempfile::tempdir().expect("tempdir");
    let touched = block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        fill(&shard, STREAMS, 2).await;
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(shard.stream_counts(), (STREAMS, STREAMS));
        let checkpoint = start_checkpoint(&shard).await;
        // Stream k is woken unchanged (as a read wakes it), appended to, or deleted, one per
        // slice.
        let mut touched = 0;
        let mut commits = Vec::new();
        while shard.inner.catalog.borrow().checkpoint_open() && touched < STREAMS {
            let key = format!("s{touched}");
            let id = shard.lookup(&key).expect("key");
            match touched % 3 {
                0 => assert!(shard.wake(id)),
                1 => commits.push(shard.append(id, data("w;", None)).expect("append").1),
                _ => commits.push(shard.delete(id).expect("delete")),
            }
            touched += 1;
            crate::slices::yield_to_requests().await;
        }
        assert!(
            touched >= 10,
            "only {touched} streams woke during the listing"
        );
        checkpoint.await.expect("checkpoint");
        for c in commits {
            c.durable().await.expect("durable");
        }
        shard.halt().await.expect("halt");
        touched
    });
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("reopen");
        let deleted = touched / 3;
        assert_eq!(shard.stream_counts().0, STREAMS - deleted);
        for k in 0..STREAMS {
            let key = format!("s{k}");
            if k < touched && k % 3 == 2 {
                assert!(shard.lookup(&key).is_none(), "{key} was deleted");
                continue;
            }
            let mut want = expected(k, 2);
            if k < touched && k % 3 == 1 {
                want.extend_from_slice(b"w;");
            }
            assert_eq!(read_all(&shard, &key).await, want, "{key}");
        }
        shard.halt().await.expect("halt");
    });
}

/// The same for resident streams: a checkpoint captures them in slices, and one changed,
/// deleted or replaced before its slice came is in it as it was when the checkpoint began.
#[test]
fn a_checkpoint_captures_streams_as_they_were_though_they_change_while_it_runs() {
    const STREAMS: usize = 200;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.idle_after = Duration::MAX;
    let touched = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        fill(&shard, STREAMS, 2).await;
        let checkpoint = start_checkpoint(&shard).await;
        // Stream k, from the last (captured last), is appended to, deleted, or replaced by
        // a new stream under its key; and a stream is created. One per slice.
        let mut touched = 0;
        let mut commits = Vec::new();
        while shard.inner.catalog.borrow().checkpoint_open() && touched < STREAMS {
            let k = STREAMS - 1 - touched;
            let key = format!("s{k}");
            let id = shard.lookup(&key).expect("key");
            match touched % 3 {
                0 => commits.push(shard.append(id, data("w;", None)).expect("append").1),
                1 => commits.push(shard.delete(id).expect("delete")),
                _ => {
                    commits.push(shard.delete(id).expect("delete"));
                    let (id, c) = shard
                        .create(new_stream(&key, Lifetime::Forever))
                        .expect("create");
                    commits.push(c);
                    commits.push(shard.append(id, data("new;", None)).expect("append").1);
                }
            }
            let (_, c) = shard
                .create(new_stream(&format!("n{touched}"), Lifetime::Forever))
                .expect("create");
            commits.push(c);
            touched += 1;
            crate::slices::yield_to_requests().await;
        }
        assert!(
            touched >= 10,
            "only {touched} streams changed during the capture"
        );
        checkpoint.await.expect("checkpoint");
        // The file holds each stream as it was when the checkpoint began (its changes are
        // in the log after it, and may not have been durable when it was written).
        let file = std::fs::read(
            dir.path()
                .join("shard-0")
                .join(crate::checkpoint::FILE_NAME),
        )
        .expect("checkpoint file");
        let (_, saved, _) = crate::checkpoint::decode(0, &file.into(), &mut |_| None, &mut |_| {})
            .expect("decodes");
        let mut tails: Vec<(String, u64)> = saved
            .iter()
            .map(|s| (s.image.meta.key.to_string(), s.image.tail.get()))
            .collect();
        tails.sort();
        let mut want: Vec<(String, u64)> = (0..STREAMS)
            .map(|k| (format!("s{k}"), expected(k, 2).len() as u64))
            .collect();
        want.sort();
        assert_eq!(tails, want);
        for c in commits {
            c.durable().await.expect("durable");
        }
        shard.halt().await.expect("halt");
        touched
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        let deleted = (0..touched).filter(|t| t % 3 == 1).count();
        assert_eq!(shard.stream_counts().0, STREAMS - deleted + touched);
        for t in 0..STREAMS {
            let k = STREAMS - 1 - t;
            let key = format!("s{k}");
            let want = match (t < touched).then_some(t % 3) {
                Some(0) => [expected(k, 2), b"w;".to_vec()].concat(),
                Some(1) => {
                    assert!(shard.lookup(&key).is_none(), "{key} was deleted");
                    continue;
                }
                Some(_) => b"new;".to_vec(),
                None => expected(k, 2),
            };
            assert_eq!(read_all(&shard, &key).await, want, "{key}");
        }
        for t in 0..touched {
            assert!(shard.lookup(&format!("n{t}")).is_some(), "n{t}");
        }
        shard.halt().await.expect("halt");
    });
}

#[test]
fn a_stream_with_something_in_flight_stays_resident() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        fill(&shard, 2, 3).await;
        let waited = shard.lookup("s0").expect("s0");
        let version = shard.state(waited).map(|s| s.version()).expect("s0");
        // A reader waits on s0.
        let mut wait = Box::pin(shard.changed(waited, version));
        let woke = std::future::poll_fn(|cx| {
            assert!(wait.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        });
        woke.await;
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(
            shard.stream_counts(),
            (2, 1),
            "only the stream nobody waits on"
        );
        assert!(shard.inner.catalog.borrow().get(waited).is_some());
        drop(wait);
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(shard.stream_counts(), (2, 2));
        shard.halt().await.expect("halt");
    });
}

#[test]
fn expiry_finds_dormant_streams_past_their_deadline_without_waking_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        let now = crate::now_ms();
        let (soon, c) = shard
            .create(new_stream("soon", Lifetime::ExpiresAtMs(now + 1_000)))
            .expect("create");
        c.durable().await.expect("durable");
        let (_, c) = shard
            .create(new_stream("later", Lifetime::TtlSeconds(3_600)))
            .expect("create");
        c.durable().await.expect("durable");
        let (_, c) = shard
            .create(new_stream("never", Lifetime::Forever))
            .expect("create");
        c.durable().await.expect("durable");
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(shard.stream_counts(), (3, 3));
        assert!(shard.expiry_candidates(now).is_empty());
        assert_eq!(shard.expiry_candidates(now + 2_000), vec![soon]);
        assert_eq!(shard.stream_counts(), (3, 3), "nothing woke to be checked");
        shard
            .delete(soon)
            .expect("delete")
            .durable()
            .await
            .expect("durable");
        assert_eq!(shard.stream_counts(), (2, 2));
        assert!(shard.lookup("soon").is_none());
        // The key is free for a new stream.
        let (again, c) = shard
            .create(new_stream("soon", Lifetime::Forever))
            .expect("create");
        c.durable().await.expect("durable");
        assert_eq!(shard.lookup("soon"), Some(again));
        shard.halt().await.expect("halt");
    });
}

/// Streams a restart loads resident (written after the last checkpoint) count as unused
/// since an idle period before the restart: the first upkeep round may put them to sleep,
/// and one a client asks for first stays.
#[test]
fn streams_replayed_after_a_crash_are_due_to_sleep_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.idle_after = Duration::from_secs(3600);
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        fill(&shard, 3, 2).await;
        assert!(!shard.sleep_due(), "just used");
        shard.halt().await.expect("halt");
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        assert_eq!(shard.stream_counts(), (3, 0), "replayed resident");
        assert!(shard.sleep_due(), "nobody used them since the restart");
        let used = shard.lookup("s1").expect("s1");
        assert!(shard.stream(used).is_some());
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(
            shard.stream_counts(),
            (3, 2),
            "all but the one used went dormant"
        );
        assert_eq!(read_all(&shard, "s0").await, expected(0, 2));
        shard.shutdown().await.expect("shutdown");
    });
}

/// Index files in the shard's directory.
fn index_files_on_disk(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("shard-0"))
        .expect("shard dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "idx"))
        })
        .count()
}

#[test]
fn a_trickle_of_sleepers_leaves_few_index_files_once_they_are_compacted() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        // One stream goes idle per round: one small file each.
        for k in 0..40 {
            let (id, c) = shard
                .create(new_stream(&format!("s{k}"), Lifetime::Forever))
                .expect("create");
            c.durable().await.expect("durable");
            let (_, c) = shard
                .append(id, data(&format!("{k}.0;"), None))
                .expect("append");
            c.durable().await.expect("durable");
            shard.sleep_idle().await.expect("sleep");
        }
        assert_eq!(shard.stream_counts(), (40, 40));
        assert!(index_files_on_disk(dir.path()) >= 40);
        // Compaction moves the small files' states into the next file; the checkpoint
        // after it lets the emptied files go.
        shard.move_sparse_states(&mut Slices::default()).await;
        let (_, dormant) = shard.stream_counts();
        assert!(dormant < 10, "{dormant} still asleep in their old files");
        shard.sleep_idle().await.expect("sleep");
        assert_eq!(
            shard.stream_counts(),
            (40, 40),
            "back to sleep, in one file"
        );
        shard.checkpoint().await.expect("checkpoint");
        let files = index_files_on_disk(dir.path());
        assert!(
            files <= crate::limits::INDEX_FILES_SOFT_MAX,
            "{files} index files"
        );
        for k in 0..40 {
            assert_eq!(read_all(&shard, &format!("s{k}")).await, expected(k, 1));
        }
        shard.sleep_idle().await.expect("sleep");
        shard.halt().await.expect("halt");
    });
    // After a crash, the checkpoint names the merged file: everything reads back.
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("reopen");
        for k in 0..40 {
            assert_eq!(read_all(&shard, &format!("s{k}")).await, expected(k, 1));
        }
        shard.halt().await.expect("halt");
    });
}
