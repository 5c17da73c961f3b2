use std::path::Path;

use bytes::Bytes;

use crate::aligned::{align_up, AlignedBuf};
use crate::checkpoint;
use crate::position::{off, rec, Offset};
use crate::record::{Lifetime, ProducerStamp, SnapshotMeta};
use crate::segment::SegmentHeader;
use crate::test_support::block_on;

use super::*;

fn config(dir: &Path) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    cfg.segment_bytes = 0; // raised to the minimum that fits the largest record
    cfg
}

fn new_stream(key: &str, data: &[u8]) -> NewStream {
    NewStream {
        meta: StreamMeta {
            key: key.into(),
            incarnation: 7,
            created_ms: 1,
            content_type: "text/plain".into(),
            lifetime: Lifetime::TtlSeconds(60),
            ext: Bytes::from_static(b"ext"),
        },
        initial: data_rec(data),
    }
}

fn data_rec(data: &[u8]) -> AppendRec {
    AppendRec {
        append_lens: vec![data.len() as u32],
        msg_lens: vec![data.len() as u32],
        data: Bytes::copy_from_slice(data),
        ..Default::default()
    }
}

/// Stop as a crash would once everything is durable: no final checkpoint.
async fn stop_without_checkpoint(shard: &Shard) {
    shard.halt().await.expect("durable");
}

/// Create empty streams `s0`, `s1`, … durably and return their ids.
async fn create_empty_streams(shard: &Shard, n: usize) -> Vec<StreamId> {
    let mut ids = Vec::with_capacity(n);
    for s in 0..n {
        let (id, c) = shard
            .create(new_stream(&format!("s{s}"), b""))
            .expect("create");
        c.durable().await.expect("durable");
        ids.push(id);
    }
    ids
}

/// Delete every stream of `ids` but each `k`-th (the first one kept).
async fn delete_all_but_every(shard: &Shard, ids: &[StreamId], k: usize) {
    for (i, &id) in ids.iter().enumerate() {
        if i % k != 0 {
            let c = shard.delete(id).expect("delete");
            c.durable().await.expect("durable");
        }
    }
}

/// Remove the checkpoint and index files, so the next open replays every segment. A roll
/// writes both at the upkeep round after it, which on a loaded machine may fall inside a
/// test's appends. Nothing was cleaned, so the log alone is complete.
fn forget_checkpoint(seg_dir: &Path) {
    let _ = std::fs::remove_file(checkpoint::path(seg_dir));
    for number in index::list(seg_dir).expect("list") {
        std::fs::remove_file(index::index_path(seg_dir, number)).expect("remove");
    }
}

async fn read_all(shard: &Shard, key: &str) -> Vec<u8> {
    let id = shard.lookup(key).expect("stream exists");
    shard
        .read(id, Offset::ZERO, off(u64::MAX))
        .await
        .expect("read")
        .concat()
}

#[test]
fn appends_survive_reopen_with_all_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("open");
        assert_eq!(report.records, 0);
        let (id, c) = shard.create(new_stream("a", b"hello ")).expect("create");
        c.durable().await.expect("durable");
        let mut rec = data_rec(b"world");
        rec.stream_seq = Some(Bytes::from_static(b"s1"));
        rec.producer = Some(ProducerStamp {
            id: "p".into(),
            epoch: 2,
            seq: 0,
        });
        let (receipt, c) = shard.append(id, rec).expect("append");
        assert_eq!((receipt.start, receipt.next), (off(6), off(11)));
        assert_eq!(
            shard
                .read(id, off(0), off(100))
                .await
                .expect("read")
                .concat(),
            b"hello "
        );
        c.durable().await.expect("durable");
        let (_, c) = shard
            .append(
                id,
                AppendRec {
                    close: true,
                    ..Default::default()
                },
            )
            .expect("close");
        c.durable().await.expect("durable");
        let (gone, c) = shard.create(new_stream("gone", b"x")).expect("create");
        c.durable().await.expect("durable");
        shard
            .delete(gone)
            .expect("delete")
            .durable()
            .await
            .expect("durable");
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        // The clean stop left a checkpoint at the head: nothing to replay.
        assert_eq!((report.checkpoint_lsn, report.records), (Lsn::new(5), 0));
        assert_eq!(report.dropped_bytes, 0);
        assert_eq!(read_all(&shard, "a").await, b"hello world");
        assert!(shard.lookup("gone").is_none());
        {
            let s = shard.state_by_key("a").expect("a");
            assert!(s.visible_closed && s.closed);
            assert_eq!(s.meta.incarnation, 7);
            assert_eq!(s.meta.lifetime, Lifetime::TtlSeconds(60));
            assert_eq!(&s.meta.ext[..], b"ext");
            assert_eq!(s.last_stream_seq.as_deref(), Some(&b"s1"[..]));
            let p = &s.producers["p"];
            assert_eq!((p.epoch, p.last_seq), (2, 0));
            assert_eq!(p.receipt(0).map(|r| r.next), Some(off(11)));
        }
        // Writing continues after the recovered records.
        let id = shard.lookup("a").expect("a");
        assert!(shard.next_incarnation(0) > 7);
        let (_, c) = shard.create(new_stream("b", b"more")).expect("create");
        c.durable().await.expect("durable");
        assert_eq!(shard.state(id).map(|s| s.tail), Some(off(11)));
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!((report.checkpoint_lsn, report.records), (Lsn::new(6), 0));
        assert_eq!(read_all(&shard, "b").await, b"more");
    });
}

/// After a stop, the flusher and the upkeep task end within a moment instead of waiting out
/// the upkeep period: a task still parked on a timer when its runtime is dropped is never
/// freed, and holds the whole shard with it.
#[test]
fn background_tasks_end_soon_after_a_stop() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        block_on(async {
            let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
            let (_, c) = shard.create(new_stream("a", b"x")).expect("create");
            c.durable().await.expect("durable");
            if clean {
                shard.shutdown().await.expect("shutdown");
            } else {
                shard.halt().await.expect("halt");
            }
            monoio::time::sleep(std::time::Duration::from_millis(5)).await;
            assert_eq!(
                Rc::strong_count(&shard.inner),
                1,
                "a background task still holds the shard (clean stop: {clean})"
            );
        });
    }
}

/// Each flush lands in one commit-size bucket, and the buckets add up to the flushes; reads
/// count what the cache answered apart from what they fetched from the log.
#[test]
fn commit_sizes_and_read_cache_bytes_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.cache_bytes = 0; // nothing stays cached: the second read fetches from the log
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        let (_, c) = shard.append(id, data_rec(&[1u8; 100_000])).expect("append");
        c.durable().await.expect("durable");
        let stats = shard.stats();
        assert_eq!(
            stats.commit_bytes_buckets.iter().sum::<u64>(),
            stats.flushes
        );
        let over_64k: u64 = stats.commit_bytes_buckets[3..].iter().sum();
        assert!(
            over_64k >= 1,
            "the 100 KB append's flush is over 64 KiB: {stats:?}"
        );
        let read = shard.read(id, off(0), off(100_000)).await.expect("read");
        assert_eq!(read.iter().map(|b| b.len()).sum::<usize>(), 100_000);
        let stats = shard.stats();
        assert_eq!(
            stats.read_cache_hit_bytes + stats.read_cache_miss_bytes,
            100_000,
            "{stats:?}"
        );
        assert_eq!(stats.read_cache_miss_bytes, 100_000, "nothing was cached");
    });
}

#[test]
fn many_concurrent_appends_share_flushes() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        let mut ids = Vec::new();
        for i in 0..50 {
            let (id, c) = shard
                .create(new_stream(&format!("s{i}"), b""))
                .expect("create");
            c.durable().await.expect("durable");
            ids.push(id);
        }
        let before = shard.stats().flushes;
        let mut commits = Vec::new();
        for round in 0..20u8 {
            for &id in &ids {
                commits.push(shard.append(id, data_rec(&[round; 100])).expect("append").1);
            }
        }
        for c in commits {
            c.durable().await.expect("durable");
        }
        let flushes = shard.stats().flushes - before;
        assert!(flushes < 50, "1000 appends took {flushes} flushes");
        for &id in &ids {
            assert_eq!(shard.state(id).map(|s| s.visible_tail), Some(off(2000)));
        }
    });
}

#[test]
fn torn_and_corrupt_tails_are_cut_at_the_last_valid_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg_dir = dir.path().join("shard-0");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"first")).expect("create");
        c.durable().await.expect("durable");
        for part in [&b"second"[..], b"third"] {
            let (_, c) = shard.append(id, data_rec(part)).expect("append");
            c.durable().await.expect("durable");
        }
        stop_without_checkpoint(&shard).await;
    });
    let seg = segment::segment_path(&seg_dir, SegmentNo::new(1));
    let contents = std::fs::read(&seg).expect("read");
    let end = DATA_START as usize
        + contents[DATA_START as usize..]
            .iter()
            .rposition(|&b| b != 0)
            .expect("data")
        + 1;
    // Flip a byte inside the last record's data: the last append must disappear.
    let mut bad = contents.clone();
    bad[end - 2] ^= 0xFF;
    std::fs::write(&seg, &bad).expect("write");
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(report.records, 2);
        assert!(report.dropped_bytes > 0);
        assert_eq!(read_all(&shard, "a").await, b"firstsecond");
        // New writes land where the dropped record was, and survive another restart.
        let id = shard.lookup("a").expect("a");
        let (_, c) = shard.append(id, data_rec(b"THIRD")).expect("append");
        c.durable().await.expect("durable");
        stop_without_checkpoint(&shard).await;
    });
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(report.dropped_bytes, 0);
        assert_eq!(read_all(&shard, "a").await, b"firstsecondTHIRD");
    });
    // Cut the file mid-record (a torn write that lost its last blocks).
    let contents = std::fs::read(&seg).expect("read");
    let mut torn = contents.clone();
    let end = DATA_START as usize
        + contents[DATA_START as usize..]
            .iter()
            .rposition(|&b| b != 0)
            .expect("data")
        + 1;
    torn[end - 3..].fill(0);
    std::fs::write(&seg, &torn).expect("write");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(read_all(&shard, "a").await, b"firstsecond");
    });
}

#[test]
fn spare_segments_are_adopted_and_a_leftover_one_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg_dir = dir.path().join("shard-0");
    let spare = segment::spare_path(&seg_dir);
    let mut cfg = config(dir.path());
    cfg.spare_fill_time = Duration::ZERO;
    // Segments hold one 30 MiB append each (the minimum segment fits 48 MiB).
    let big = vec![9u8; 30 << 20];
    let appends = 5;
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        for _ in 0..appends {
            let (_, c) = shard.append(id, data_rec(&big)).expect("append");
            c.durable().await.expect("durable");
            // Let a spare started by a roll finish, so the next roll adopts it.
            for _ in 0..500 {
                if !spare_pending(&shard) {
                    break;
                }
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // A roll for every append after the first. The first roll started the first
        // spare, and every later roll adopted one.
        assert_eq!(shard.stats().spare_segments, appends - 2);
        stop_without_checkpoint(&shard).await;
    });
    let segs = segment::list_segments(&seg_dir).expect("list");
    assert_eq!(segs.len() as u64, appends);
    for &i in &segs {
        let h = std::fs::read(segment::segment_path(&seg_dir, i)).expect("read");
        let header =
            SegmentHeader::decode(&h[..crate::limits::IO_BLOCK_BYTES]).expect("valid header");
        assert_eq!(header.index, i);
    }
    // A spare left half-made by a crash is removed at open; the data is intact.
    std::fs::write(&spare, b"torn").expect("write spare");
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("reopen");
        assert_eq!(report.dropped_bytes, 0);
        assert!(!spare.exists(), "leftover spare removed");
        let tail = shard.state_by_key("a").expect("a").visible_tail;
        assert_eq!(tail, off(appends * big.len() as u64));
        let data = read_all(&shard, "a").await;
        assert!(data.len() == appends as usize * big.len() && data.iter().all(|&b| b == 9));
    });
}

/// Appends in concurrent groups, some large enough to land on zeros still being
/// written, must read back exactly after a restart: no zero write ever lands on records.
#[test]
fn zeros_written_ahead_never_overwrite_records() {
    for zero_ahead_below in [u64::MAX, 0] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = config(dir.path());
        cfg.spare_fill_time = Duration::MAX;
        // u64::MAX: every crossing counts as a slow fill; 0: never zero.
        cfg.zero_ahead_below = zero_ahead_below;
        let mut expected = Vec::new();
        block_on(async {
            let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
            let (id, c) = shard.create(new_stream("a", b"")).expect("create");
            c.durable().await.expect("durable");
            for round in 0..120u32 {
                let mut commits = Vec::new();
                for i in 0..16u32 {
                    // Every 10th round begins with 2 MiB, which reaches past the zeros
                    // started by the previous flush.
                    let len = if round % 10 == 9 && i == 0 {
                        2 << 20
                    } else {
                        3000
                    };
                    let data: Vec<u8> = (0..len).map(|b| (b as u32 ^ round ^ i) as u8).collect();
                    expected.extend_from_slice(&data);
                    let (_, c) = shard.append(id, data_rec(&data)).expect("append");
                    commits.push(c);
                }
                for c in commits {
                    c.durable().await.expect("durable");
                }
            }
            let zeroed = shard.stats().zeroed_ahead_bytes;
            if zero_ahead_below == 0 {
                assert_eq!(zeroed, 0);
            } else {
                // The zeroed ranges cover the log, less what large appends skipped.
                assert!(zeroed >= 8 << 20, "zeroed only {zeroed} bytes");
            }
            stop_without_checkpoint(&shard).await;
        });
        block_on(async {
            let (shard, report) = Shard::open(cfg.clone()).await.expect("reopen");
            assert_eq!(report.dropped_bytes, 0);
            assert!(
                read_all(&shard, "a").await == expected,
                "data read back intact"
            );
        });
    }
}

/// A flush waits for a zero write still in flight only when its records reach it.
#[test]
fn a_flush_waits_only_for_zeros_it_reaches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.zero_ahead_below = 0; // the log starts none of its own
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        for (gap, reached) in [(8u64 << 20, false), (0, true)] {
            let (seg, from) = {
                let log = shard.inner.log.borrow();
                let log = log.as_ref().expect("log");
                let (seg, end) = log.write_position();
                (seg, align_up(end as usize) as u64 + gap)
            };
            // Stands in for a zero write that the disk is slow to finish.
            let done = Rc::new(Cell::new(false));
            let finished = done.clone();
            let write = monoio::spawn(async move {
                monoio::time::sleep(Duration::from_millis(300)).await;
                finished.set(true);
                (
                    Ok(()),
                    AlignedBuf::with_capacity(crate::limits::IO_BLOCK_BYTES),
                )
            });
            shard
                .inner
                .log
                .borrow_mut()
                .as_mut()
                .expect("log")
                .pretend_zeroing(seg, from, write);
            let (_, c) = shard.append(id, data_rec(&[7u8; 8192])).expect("append");
            c.durable().await.expect("durable");
            assert_eq!(done.get(), reached, "gap {gap}");
        }
    });
}

/// Whether the shard is still preparing a spare segment.
fn spare_pending(shard: &Shard) -> bool {
    shard
        .inner
        .log
        .borrow()
        .as_ref()
        .is_some_and(|l| l.spare_in_progress())
}

#[test]
fn segments_roll_and_orphans_after_a_break_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seg_dir = dir.path().join("shard-0");
    let big = vec![7u8; 20 << 20];
    // No checkpoint: the reopens below must scan every segment. On a loaded machine the
    // six appends outlast an upkeep round, which would otherwise take one at 64 MiB.
    let config = |dir: &Path| ShardConfig {
        checkpoint_bytes: u64::MAX,
        ..config(dir)
    };
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        for _ in 0..6 {
            let (_, c) = shard.append(id, data_rec(&big)).expect("append");
            c.durable().await.expect("durable");
        }
        stop_without_checkpoint(&shard).await;
    });
    forget_checkpoint(&seg_dir);
    let segs = segment::list_segments(&seg_dir).expect("list");
    assert!(segs.len() >= 2, "expected a roll, got {segs:?}");
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(report.segments, segs.len());
        let s = shard.state_by_key("a").expect("a");
        assert_eq!(s.visible_tail, off(6 * big.len() as u64));
    });
    // Damage the first segment's last record: everything after it is unacknowledged
    // history that must go, including whole later segments.
    let first = segment::segment_path(&seg_dir, segs[0]);
    let mut contents = std::fs::read(&first).expect("read");
    let last = contents.iter().rposition(|&b| b != 0).expect("data");
    contents[last] ^= 0xFF;
    std::fs::write(&first, &contents).expect("write");
    block_on(async {
        let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
        assert_eq!(report.orphan_segments, segs.len() - 1);
        let tail = shard.state_by_key("a").expect("a").visible_tail.get();
        assert!(tail < 6 * big.len() as u64);
        assert_eq!(tail % big.len() as u64, 0);
    });
}

#[test]
fn cold_reads_of_small_interleaved_appends_share_disk_reads() {
    // Three streams written in turn with small appends (and one record of several
    // chunks): read back cold, byte-exact, with far fewer disk reads than chunks, and
    // the chunks cached again as few runs.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.checkpoint_bytes = u64::MAX;
    let payload = |s: usize, i: usize| -> Vec<u8> {
        let len = 200 + (i * 37 + s * 11) % 900;
        let mut v: Vec<u8> = (0..len).map(|j| (s * 7 + i * 13 + j) as u8).collect();
        v[..4].copy_from_slice(&(i as u32).to_le_bytes());
        v
    };
    let appends = 3_000;
    let mut expected = vec![Vec::new(); 3];
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let mut ids = Vec::new();
        for s in 0..3 {
            let (id, c) = shard
                .create(new_stream(&format!("s{s}"), b""))
                .expect("create");
            c.durable().await.expect("durable");
            ids.push(id);
        }
        let mut last = None;
        for i in 0..appends {
            for (s, &id) in ids.iter().enumerate() {
                let p = payload(s, i);
                let mut rec = data_rec(&p);
                if i == 7 {
                    // One record holding three chunks of the same stream.
                    let third = p.len() / 3;
                    rec.append_lens =
                        vec![third as u32, third as u32, (p.len() - 2 * third) as u32];
                    rec.msg_lens = rec.append_lens.clone();
                }
                expected[s].extend_from_slice(&p);
                last = Some(shard.append(id, rec).expect("append").1);
            }
        }
        last.expect("appended").durable().await.expect("durable");
        stop_without_checkpoint(&shard).await;
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        let chunks = appends as u64 + 2;
        for (s, want) in expected.iter().enumerate() {
            let id = shard.lookup(&format!("s{s}")).expect("stream");
            let before = shard.stats().disk_reads;
            let got = shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read");
            assert_eq!(got.concat(), *want, "stream s{s}");
            let reads = shard.stats().disk_reads - before;
            assert!(
                reads * 20 < chunks,
                "{reads} disk reads for {chunks} chunks"
            );
            // A mid-chunk range, now served from the cache.
            let part = shard
                .read(id, off(1_001), off(50_003))
                .await
                .expect("read")
                .concat();
            assert_eq!(part, &want[1_001..50_003]);
            assert_eq!(shard.stats().disk_reads - before, reads, "cached again");
            let pieces = shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .len() as u64;
            assert!(pieces * 20 < chunks, "{pieces} pieces for {chunks} chunks");
        }
    });
}

#[test]
fn cold_data_is_read_from_disk_and_verified() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.cache_bytes = 64 << 10;
    let chunk = |i: u32| -> Vec<u8> {
        let mut c: Vec<u8> = (0..10_000u32).map(|j| (i * 31 + j) as u8).collect();
        c[..8].copy_from_slice(format!("CHUNK{i:03}").as_bytes());
        c
    };
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        for i in 0..40 {
            let (_, c) = shard.append(id, data_rec(&chunk(i))).expect("append");
            c.durable().await.expect("durable");
        }
        assert!(shard.resident_bytes() <= 64 << 10, "cache over budget");
        shard.check_cache();
        let expected: Vec<u8> = (0..40).flat_map(chunk).collect();
        assert_eq!(
            shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .concat(),
            expected
        );
        // A read spanning cold chunks, starting and ending mid-chunk.
        let part = shard
            .read(id, off(15_000), off(123_456))
            .await
            .expect("read")
            .concat();
        assert_eq!(part, &expected[15_000..123_456]);
        stop_without_checkpoint(&shard).await;
    });
    // After a restart nothing is cached; everything reads from disk.
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        assert_eq!(shard.resident_bytes(), 0);
        shard.check_cache();
        let id = shard.lookup("a").expect("a");
        let expected: Vec<u8> = (0..40).flat_map(chunk).collect();
        assert_eq!(
            shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .concat(),
            expected
        );
    });
    // Corrupt one record in place: reading it fails instead of serving bad bytes.
    let seg = segment::segment_path(&dir.path().join("shard-0"), SegmentNo::new(1));
    let mut contents = std::fs::read(&seg).expect("read");
    let at = contents
        .windows(8)
        .position(|w| w == b"CHUNK003")
        .expect("find record data");
    contents[at + 10] ^= 0xFF;
    std::fs::write(&seg, &contents).expect("write");
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        let id = shard.lookup("a").expect("a");
        // Recovery truncated the log at the corrupt record: the stream ends before it.
        let tail = shard.state(id).expect("a").visible_tail;
        assert_eq!(tail, off(3 * 10_000));
    });
}

#[test]
fn deleted_data_gives_its_space_back_and_survivors_stay_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let payload = |stream: usize, i: usize| -> Vec<u8> {
        let mut v = vec![(stream * 7 + i) as u8; 64 << 10];
        let tag = format!("s{stream:04}-i{i:08}");
        v[..tag.len()].copy_from_slice(tag.as_bytes());
        v
    };
    let streams = 20;
    let per_stream = 200; // 20 x 200 x 64 KiB = 250 MiB: several segments
    let (expected_tail, seg_bytes) = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let ids = create_empty_streams(&shard, streams).await;
        for i in 0..per_stream {
            let mut commits = Vec::new();
            for (s, &id) in ids.iter().enumerate() {
                let mut rec = data_rec(&payload(s, i));
                if s == 0 {
                    rec.producer = Some(ProducerStamp {
                        id: "p".into(),
                        epoch: 1,
                        seq: i as u64,
                    });
                }
                commits.push(shard.append(id, rec).expect("append").1);
            }
            for c in commits {
                c.durable().await.expect("durable");
            }
        }
        let before = shard.disk_usage();
        assert!(before.segments >= 5, "{before:?}");
        // Delete 90% of the streams (keep s0 and s10).
        delete_all_but_every(&shard, &ids, 10).await;
        let removed = shard.clean().await.expect("clean");
        let after = shard.disk_usage();
        assert!(removed > 0);
        assert!(
            after.segment_bytes <= 2 * after.live_bytes + shard.segment_bytes(),
            "after cleaning {after:?}"
        );
        let on_disk: u64 = std::fs::read_dir(dir.path().join("shard-0"))
            .expect("dir")
            .map(|e| e.expect("entry"))
            .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
            .map(|e| e.metadata().expect("meta").len())
            .sum();
        assert_eq!(on_disk, after.segment_bytes, "files match the accounting");
        assert!(on_disk <= 2 * after.live_bytes + shard.segment_bytes());
        for &s in &[0usize, 10] {
            let got = read_all(&shard, &format!("s{s}")).await;
            let want: Vec<u8> = (0..per_stream).flat_map(|i| payload(s, i)).collect();
            assert!(got == want, "stream s{s} changed by cleaning");
        }
        shard.shutdown().await.expect("shutdown");
        (per_stream as u64 * (64 << 10), shard.segment_bytes())
    });
    // Everything, including producer state, survives a restart after cleaning.
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        let usage = shard.disk_usage();
        assert!(usage.segments as u64 * seg_bytes <= 2 * 2 * expected_tail + seg_bytes);
        assert_eq!(shard.keys().len(), 2);
        for &s in &[0usize, 10] {
            let got = read_all(&shard, &format!("s{s}")).await;
            let want: Vec<u8> = (0..per_stream).flat_map(|i| payload(s, i)).collect();
            assert!(got == want, "stream s{s} changed across restart");
            let st = shard.state_by_key(&format!("s{s}")).expect("stream");
            assert_eq!(st.tail, off(expected_tail));
            assert_eq!(st.message_count(), rec(per_stream as u64));
        }
        let st = shard.state_by_key("s0").expect("s0");
        let p = &st.producers["p"];
        assert_eq!(p.last_seq, per_stream as u64 - 1);
        assert_eq!(
            p.receipt(p.last_seq).map(|r| r.next),
            Some(off(expected_tail))
        );
    });
}

#[test]
fn records_queued_across_several_segments_in_one_flush() {
    // Regression: rolling twice before a flush once dropped the write handle of a
    // segment that still had queued records, failing the shard.
    let dir = tempfile::tempdir().expect("tempdir");
    let big = vec![3u8; 30 << 20];
    // No periodic checkpoint: the reopen must scan every segment the flush wrote.
    let mut cfg = config(dir.path());
    cfg.checkpoint_bytes = u64::MAX;
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        let commits: Vec<Commit> = (0..5)
            .map(|_| shard.append(id, data_rec(&big)).expect("append").1)
            .collect();
        for c in commits {
            c.durable().await.expect("durable");
        }
        assert!(shard.failure().is_none());
        assert_eq!(
            shard.state(id).map(|s| s.visible_tail),
            Some(off(5 * big.len() as u64))
        );
        stop_without_checkpoint(&shard).await;
    });
    forget_checkpoint(&dir.path().join("shard-0"));
    block_on(async {
        let (shard, report) = Shard::open(cfg).await.expect("reopen");
        assert!(report.segments >= 3);
        assert_eq!(read_all(&shard, "a").await.len(), 5 * big.len());
    });
}

#[test]
fn snapshots_and_retention_survive_restart_and_keep_ordinals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let msg = |i: usize| format!("{{\"i\":{i}}}\n");
    let (retain_at, total) = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(new_stream("j", b"")).expect("create");
        c.durable().await.expect("durable");
        let mut offsets = Vec::new();
        let mut total = Offset::ZERO;
        for batch in 0..5 {
            let msgs: Vec<String> = (batch * 4..batch * 4 + 4).map(msg).collect();
            let data = msgs.concat();
            let mut rec = data_rec(data.as_bytes());
            rec.msg_lens = msgs.iter().map(|m| m.len() as u32).collect();
            for m in &msgs {
                offsets.push(total);
                total += m.len() as u64;
            }
            let (_, c) = shard.append(id, rec).expect("append");
            c.durable().await.expect("durable");
        }
        // Snapshot at record 10, then retention to it (a mid-append record boundary).
        let at = offsets[10];
        let blob = shard
            .write_blob(Bytes::from_static(b"folded state"))
            .await
            .expect("blob");
        let meta = SnapshotMeta {
            offset: at,
            content_type: "application/json".into(),
            digest: "d1".into(),
            blob,
            len: 12,
        };
        shard
            .set_snapshot(id, meta)
            .expect("snapshot")
            .durable()
            .await
            .expect("durable");
        let live_before = shard.disk_usage().live_bytes;
        shard
            .retain(id, at)
            .expect("retain")
            .durable()
            .await
            .expect("durable");
        assert!(shard.disk_usage().live_bytes < live_before);
        {
            let s = shard.state(id).expect("s");
            assert_eq!(s.retained_start, at);
            assert_eq!(s.first_message(), rec(10));
            assert_eq!(s.message_count(), rec(20));
            assert_eq!(s.message_start(rec(10)), Some(at));
            assert_eq!(s.message_start(rec(9)), None, "trimmed ordinals are gone");
        }
        let read = shard
            .read(id, at, off(u64::MAX))
            .await
            .expect("read")
            .concat();
        assert_eq!(read, (10..20).map(msg).collect::<String>().into_bytes());
        // An unreferenced blob (a publish that never committed) is removed at restart.
        shard
            .write_blob(Bytes::from_static(b"orphan"))
            .await
            .expect("blob");
        shard.shutdown().await.expect("shutdown");
        (at, total)
    });
    let blobs = dir.path().join("shard-0").join("snapshots");
    assert_eq!(std::fs::read_dir(&blobs).expect("dir").count(), 2);
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        assert_eq!(std::fs::read_dir(&blobs).expect("dir").count(), 1);
        let id = shard.lookup("j").expect("j");
        let meta = {
            let s = shard.state(id).expect("s");
            assert_eq!(s.retained_start, retain_at);
            assert_eq!(s.first_message(), rec(10));
            assert_eq!(s.message_count(), rec(20));
            assert_eq!(s.message_start(rec(10)), Some(retain_at));
            assert_eq!(s.visible_tail, total);
            s.snapshot.clone().expect("snapshot survives")
        };
        assert_eq!(meta.offset, retain_at);
        assert_eq!(
            shard.read_blob(&meta).await.expect("blob"),
            &b"folded state"[..]
        );
        let read = shard
            .read(id, retain_at, off(u64::MAX))
            .await
            .expect("read")
            .concat();
        assert_eq!(read, (10..20).map(msg).collect::<String>().into_bytes());
        // A new snapshot replaces the old one; the old blob goes once durable.
        let blob = shard
            .write_blob(Bytes::from_static(b"v2"))
            .await
            .expect("blob");
        let meta2 = SnapshotMeta {
            offset: total,
            content_type: "text/plain".into(),
            digest: "d2".into(),
            blob,
            len: 2,
        };
        shard
            .set_snapshot(id, meta2)
            .expect("snap")
            .durable()
            .await
            .expect("durable");
        shard.collect_dead_blobs();
        assert_eq!(std::fs::read_dir(&blobs).expect("dir").count(), 1);
    });
}

/// Everything a restart must reproduce about the shard's streams, as comparable text.
async fn describe(shard: &Shard) -> Vec<String> {
    let mut keys = shard.keys();
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let Some(id) = shard.lookup(&key) else {
            continue;
        };
        let meta = {
            let s = shard.state(id).expect("listed");
            let mut producers: Vec<_> = s
                .producers
                .iter()
                .map(|(k, p)| format!("{k}:{}:{}:{:?}", p.epoch, p.last_seq, p.receipts))
                .collect();
            producers.sort();
            let starts: Vec<_> = (s.first_message().get()..s.message_count().get())
                .map(|o| s.message_start(rec(o)))
                .collect();
            format!(
                "{key} inc={} tail={}/{} closed={}/{} ext={:?} seq={:?} retained={} \
                 msgs={}..{} starts={starts:?} producers={producers:?}",
                s.meta.incarnation,
                s.tail,
                s.visible_tail,
                s.closed,
                s.visible_closed,
                s.meta.ext,
                s.last_stream_seq,
                s.retained_start,
                s.first_message(),
                s.message_count(),
            )
        };
        let from = shard.state(id).map_or(Offset::ZERO, |s| s.retained_start);
        let data = shard
            .read(id, from, off(u64::MAX))
            .await
            .expect("read")
            .concat();
        out.push(format!("{meta} data={}", String::from_utf8_lossy(&data)));
    }
    out
}

fn json_rec(msgs: &[&str]) -> AppendRec {
    let data: String = msgs.concat();
    AppendRec {
        append_lens: vec![data.len() as u32],
        msg_lens: msgs.iter().map(|m| m.len() as u32).collect(),
        data: Bytes::from(data),
        ..Default::default()
    }
}

#[test]
fn the_checkpoint_interval_grows_with_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.checkpoint_bytes = 1;
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (a, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        let msgs: Vec<String> = (0..2000).map(|i| format!("{{\"n\":{i}}}\n")).collect();
        let msgs: Vec<&str> = msgs.iter().map(String::as_str).collect();
        let append = |rec| {
            let (_, c) = shard.append(a, rec).expect("append");
            c.durable()
        };
        append(json_rec(&msgs)).await.expect("durable");
        assert!(shard.checkpoint_due());
        assert!(shard.checkpoint().await.expect("checkpoint"));
        let size = shard.inner.checkpoints.borrow().last_size();
        assert!(size > 2000, "the index of 2000 messages is in it: {size}");

        // Less than four checkpoints' worth of log since: not yet, though well over
        // checkpoint_bytes.
        let since = |shard: &Shard| shard.inner.checkpoints.borrow().since_last();
        while since(&shard) + 200 < CHECKPOINT_LOG_RATIO * size {
            append(data_rec(&[b'x'; 100])).await.expect("durable");
            assert!(!shard.checkpoint_due(), "due after {} bytes", since(&shard));
        }
        while since(&shard) < CHECKPOINT_LOG_RATIO * size {
            append(data_rec(b"x")).await.expect("durable");
        }
        assert!(shard.checkpoint_due());
        shard.shutdown().await.expect("shutdown");

        // A restart knows the size of the checkpoint it loaded.
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        assert!(shard.inner.checkpoints.borrow().last_size() > 2000);
        assert!(!shard.checkpoint_due());
        shard.shutdown().await.expect("shutdown");
    });
}

#[test]
fn checkpoint_bounds_replay_and_restores_every_stream_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.checkpoint_bytes = u64::MAX; // only the explicit checkpoint below
    let (lsn, want) = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (a, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        let mut rec = json_rec(&["{\"n\":1}\n", "{\"n\":2}\n", "{\"n\":3}\n"]);
        rec.stream_seq = Some(Bytes::from_static(b"s1"));
        rec.producer = Some(ProducerStamp {
            id: "p".into(),
            epoch: 1,
            seq: 0,
        });
        shard
            .append(a, rec)
            .expect("append")
            .1
            .durable()
            .await
            .expect("ok");
        let (b, c) = shard.create(new_stream("b", b"bee")).expect("create");
        c.durable().await.expect("durable");
        let (gone, c) = shard.create(new_stream("gone", b"x")).expect("create");
        c.durable().await.expect("durable");
        shard
            .set_ext(a, Bytes::from_static(b"ext2"))
            .expect("ext")
            .durable()
            .await
            .expect("ok");
        shard
            .retain(a, off(8))
            .expect("retain")
            .durable()
            .await
            .expect("ok");
        assert!(shard.checkpoint().await.expect("checkpoint"));
        let lsn = shard.last_lsn();
        // After the checkpoint: appends to old streams, a new stream, a deletion.
        let mut rec = json_rec(&["{\"n\":4}\n"]);
        rec.producer = Some(ProducerStamp {
            id: "p".into(),
            epoch: 1,
            seq: 1,
        });
        shard
            .append(a, rec)
            .expect("append")
            .1
            .durable()
            .await
            .expect("ok");
        shard
            .append(b, data_rec(b"-more"))
            .expect("append")
            .1
            .durable()
            .await
            .expect("ok");
        let (_, c) = shard.create(new_stream("c", b"sea")).expect("create");
        c.durable().await.expect("durable");
        shard
            .delete(gone)
            .expect("delete")
            .durable()
            .await
            .expect("ok");
        let want = describe(&shard).await;
        stop_without_checkpoint(&shard).await;
        (lsn, want)
    });
    assert!(want.iter().any(|d| d.contains("msgs=1..4")), "{want:?}");
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("reopen");
        assert_eq!(report.checkpoint_lsn, lsn);
        assert_eq!(report.records, 4, "only the records after the checkpoint");
        assert_eq!(describe(&shard).await, want);
        assert!(shard.next_incarnation(0) > 7);
        // Writing continues, and a clean stop checkpoints at the head.
        let a = shard.lookup("a").expect("a");
        let (r, c) = shard.append(a, json_rec(&["{\"n\":5}\n"])).expect("append");
        assert_eq!((r.record_start, r.record_next), (rec(4), rec(5)));
        c.durable().await.expect("durable");
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, report) = Shard::open(cfg).await.expect("reopen");
        assert_eq!(report.records, 0);
        let s = shard.state_by_key("a").expect("a");
        assert_eq!((s.first_message(), s.message_count()), (rec(1), rec(5)));
    });
}

#[test]
fn a_corrupt_checkpoint_stops_recovery_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        let (_, c) = shard.create(new_stream("a", b"data")).expect("create");
        c.durable().await.expect("durable");
        shard.shutdown().await.expect("shutdown");
    });
    let path = checkpoint::path(&dir.path().join("shard-0"));
    let mut bytes = std::fs::read(&path).expect("checkpoint written at shutdown");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).expect("write");
    let err =
        block_on(async { Shard::open(config(dir.path())).await.err() }).expect("refuses to start");
    let msg = err.to_string();
    assert!(
        msg.contains("checkpoint") && msg.contains("corrupt"),
        "{msg}"
    );
}

#[test]
fn cleaning_after_a_checkpoint_keeps_every_live_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.checkpoint_bytes = u64::MAX;
    let payload = |stream: usize, i: usize| -> Vec<u8> {
        let mut v = vec![(stream * 3 + i) as u8; 64 << 10];
        let tag = format!("s{stream:02}-i{i:06}");
        v[..tag.len()].copy_from_slice(tag.as_bytes());
        v
    };
    let (streams, per_stream) = (10usize, 300usize); // ~190 MiB: four segments
    let (lsn, want) = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let ids = create_empty_streams(&shard, streams).await;
        // A stream with no data at all: only its creation record (in segment 1) and
        // the checkpoint know it.
        let (_, c) = shard.create(new_stream("empty", b"")).expect("create");
        c.durable().await.expect("durable");
        let mut lsn = Lsn::NONE;
        for i in 0..per_stream {
            if i == 100 {
                assert!(shard.checkpoint().await.expect("checkpoint"));
                lsn = shard.last_lsn();
            }
            let mut commits = Vec::new();
            for (s, &id) in ids.iter().enumerate() {
                let mut rec = data_rec(&payload(s, i));
                rec.producer = Some(ProducerStamp {
                    id: "p".into(),
                    epoch: 1,
                    seq: i as u64,
                });
                commits.push(shard.append(id, rec).expect("append").1);
            }
            for c in commits {
                c.durable().await.expect("durable");
            }
        }
        delete_all_but_every(&shard, &ids, 5).await;
        let removed = shard.clean().await.expect("clean");
        assert!(
            removed >= 2,
            "the checkpoint's own segment is reclaimed too"
        );
        let want = describe(&shard).await;
        stop_without_checkpoint(&shard).await;
        (lsn, want)
    });
    assert_eq!(want.len(), 3);
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("reopen");
        // Reclaiming the segment the checkpoint resumed in needed a newer checkpoint
        // first; otherwise the deletions logged there would be lost and the deleted
        // streams would come back from the old checkpoint.
        assert!(
            report.checkpoint_lsn > lsn,
            "{} <= {lsn}",
            report.checkpoint_lsn
        );
        assert_eq!(describe(&shard).await, want);
        // Pre-checkpoint segments were not scanned, yet the cleaner still finds the data
        // it must move out of them.
        let s5 = shard.lookup("s5").expect("s5");
        shard
            .delete(s5)
            .expect("delete")
            .durable()
            .await
            .expect("ok");
        shard.clean().await.expect("clean");
        stop_without_checkpoint(&shard).await;
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        let got = describe(&shard).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], want[0], "empty");
        assert_eq!(got[1], want[1], "s0");
        let usage = shard.disk_usage();
        assert!(usage.segment_bytes <= 2 * usage.live_bytes + shard.segment_bytes());
    });
}

#[test]
fn a_failed_commit_write_acknowledges_nothing_and_stops_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.fail_commit_after = Some(2);
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"one.")).expect("create");
        c.durable().await.expect("flush 0");
        let (_, c) = shard.append(id, data_rec(b"two.")).expect("append");
        c.durable().await.expect("flush 1");
        let (_, c) = shard.append(id, data_rec(b"three.")).expect("append");
        let err = c.durable().await.expect_err("flush 2 fails");
        assert!(matches!(err, StorageError::Failed(_)), "{err:?}");
        assert!(shard.failure().is_some());
        // No further write is accepted; what was acknowledged is still readable, and
        // the unacknowledged append never became visible.
        assert!(matches!(
            shard.append(id, data_rec(b"four.")),
            Err(StorageError::Failed(_))
        ));
        assert!(shard.create(new_stream("b", b"")).is_err());
        assert_eq!(read_all(&shard, "a").await, b"one.two.");
    });
    cfg.fail_commit_after = None;
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        // The failed flush's bytes were written; whether they survived is unknown, so
        // the append may be there whole or not at all, never in part.
        let got = read_all(&shard, "a").await;
        assert!(got == b"one.two." || got == b"one.two.three.", "{got:?}");
        let id = shard.lookup("a").expect("a");
        let (_, c) = shard.append(id, data_rec(b"five.")).expect("writes again");
        c.durable().await.expect("durable");
    });
}

#[test]
fn a_read_racing_the_cleaner_follows_moved_chunks() {
    // Regression: a read planned its disk locations up front; when the cleaner moved a
    // chunk and deleted its segment before the read reached it, the read failed with
    // "No such file or directory" (found by the long crash checker).
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.checkpoint_bytes = u64::MAX;
    cfg.cache_bytes = 0;
    let chunk = |i: usize| vec![(i % 251) as u8; 256 << 10];
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        for i in 0..300 {
            let (_, c) = shard.append(id, data_rec(&chunk(i))).expect("append");
            c.durable().await.expect("durable");
        }
        assert!(shard.disk_usage().segments >= 2);
        shard.halt().await.expect("halt");
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        let id = shard.lookup("a").expect("a");
        // Move the first chunks to the head, so the read below starts with segment 3
        // (or later) and only then reaches segment 2, which is cleaned meanwhile.
        shard
            .clean_segment(SegmentNo::new(1))
            .await
            .expect("clean segment 1");
        let reader = shard.clone();
        let read = monoio::spawn(async move { reader.read(id, Offset::ZERO, off(u64::MAX)).await });
        shard
            .clean_segment(SegmentNo::new(2))
            .await
            .expect("clean segment 2");
        let got = read
            .await
            .expect("the read follows the moved chunks")
            .concat();
        let want: Vec<u8> = (0..300).flat_map(chunk).collect();
        assert!(got == want, "read returned other bytes");
    });
}

#[test]
fn memory_mode_acknowledges_at_once() {
    block_on(async {
        let (shard, _) = Shard::open(ShardConfig::new(0, Durability::Memory))
            .await
            .expect("open");
        let (id, c) = shard.create(new_stream("a", b"x")).expect("create");
        c.durable().await.expect("durable");
        let (_, c) = shard.append(id, data_rec(b"y")).expect("append");
        assert_eq!(read_all(&shard, "a").await, b"xy");
        c.durable().await.expect("durable");
    });
}

#[test]
fn readers_see_an_append_only_once_it_is_durable_and_the_head_sees_it_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    block_on(async {
        let (shard, _) = Shard::open(config(dir.path())).await.expect("open");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("durable");
        let (_, c) = shard
            .append(id, json_rec(&["{\"a\":1}\n", "{\"b\":2}\n"]))
            .expect("append");
        c.durable().await.expect("durable");
        let durable_end = off(16);

        let mut pending = json_rec(&["{\"c\":3}\n"]);
        pending.close = true;
        let (_, commit) = shard.append(id, pending).expect("append");
        {
            let head = shard.head(id).expect("head");
            assert_eq!(
                (head.tail(), head.closed(), head.message_count()),
                (off(24), true, rec(3))
            );
            let view = shard.stream(id).expect("view");
            assert_eq!((view.next_offset(), view.is_closed()), (durable_end, false));
            assert_eq!(view.message_count(), rec(2));
            assert_eq!(view.message_start(rec(1)), Some(off(8)));
            assert_eq!(view.message_start(rec(2)), Some(durable_end));
            assert_eq!(view.message_start(rec(3)), None);
            assert!(view.is_message_boundary(durable_end));
            assert!(!view.is_message_boundary(off(24)));
            assert_eq!(view.message_at_or_after(off(20)), rec(2));
            assert_eq!(
                view.records_within(rec(0), rec(u64::MAX), off(u64::MAX)),
                rec(2)
            );
            assert_eq!(view.message_lens(rec(0), rec(4)), vec![8, 8, 0]);
            assert_eq!(
                view.chunks().map(|c| c.start).collect::<Vec<_>>(),
                vec![off(0)]
            );
            assert!(view.chunk_at(durable_end).is_none());
        }
        commit.durable().await.expect("durable");
        let view = shard.stream(id).expect("view");
        assert_eq!((view.next_offset(), view.is_closed()), (off(24), true));
        assert_eq!(
            (view.message_count(), view.message_start(rec(3))),
            (rec(3), Some(off(24)))
        );
        assert_eq!(view.message_lens(rec(0), rec(4)), vec![8, 8, 8, 0]);
        assert!(view.chunk_at(durable_end).is_some());
    });
}

/// Every handle the log writes through is `O_DSYNC` (and `O_DIRECT`): a commit is
/// acknowledged when its write completes, with no fdatasync after it, so a handle without
/// the flag would acknowledge appends a power cut can lose. Covers the segment opened at
/// start, the ones made by a roll, and the one reopened by recovery.
#[test]
fn the_log_writes_through_dsync_handles_only() {
    fn flags(shard: &Shard) -> Vec<(SegmentNo, i32)> {
        let log = shard.inner.log.borrow();
        let log = log.as_ref().expect("a disk shard has a log");
        let mut out: Vec<(SegmentNo, i32)> = log
            .write_handles()
            .map(|(seg, file)| {
                let fd = std::os::unix::io::AsRawFd::as_raw_fd(file);
                // SAFETY: F_GETFL only reads the status flags of `fd`, which the log keeps
                // open for as long as `file` lives (borrowed here).
                (seg, unsafe { libc::fcntl(fd, libc::F_GETFL) })
            })
            .collect();
        out.sort_unstable_by_key(|(seg, _)| *seg);
        out
    }
    fn assert_dsync(shard: &Shard, when: &str) -> usize {
        let handles = flags(shard);
        assert!(!handles.is_empty(), "{when}: no write handle");
        for (seg, fl) in &handles {
            assert_ne!(fl & libc::O_DSYNC, 0, "{when}: segment {seg} lacks O_DSYNC");
            assert_ne!(
                fl & libc::O_DIRECT,
                0,
                "{when}: segment {seg} lacks O_DIRECT"
            );
        }
        handles.len()
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        assert_dsync(&shard, "fresh");
        let (id, c) = shard.create(new_stream("a", b"")).expect("create");
        c.durable().await.expect("create durable");
        let first = shard.write_segment();
        let big = vec![b'x'; 256 << 10];
        while shard.write_segment() == first {
            let (_, c) = shard.append(id, data_rec(&big)).expect("append");
            c.durable().await.expect("append durable");
        }
        assert_dsync(&shard, "after a roll");
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg).await.expect("reopen");
        assert_dsync(&shard, "recovered");
    });
}

#[test]
fn ids_start_at_the_first_id_and_continue_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = 5 << crate::placement::SHARD_ID_SHIFT;
    let mut cfg = config(dir.path());
    cfg.shard = 5;
    cfg.first_id = first;
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        assert_eq!(create_empty_streams(&shard, 2).await, [first, first + 1]);
        stop_without_checkpoint(&shard).await;
    });
    block_on(async {
        let (shard, report) = Shard::open(cfg).await.expect("reopen");
        assert_eq!(report.streams, 2);
        assert_eq!(shard.lookup("s1"), Some(first + 1));
        let (id, c) = shard.create(new_stream("s2", b"")).expect("create");
        c.durable().await.expect("durable");
        assert_eq!(id, first + 2);
        shard.shutdown().await.expect("shutdown");
    });
}
