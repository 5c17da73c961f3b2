//! The shard with a cold tier: eviction within the local budget, cold reads through the
//! read path (verified, cached, throttled), restarts, cleaning and a full disk.
//!
//! The cold tier here is [`DirStore`]: a directory the test copies sealed segment files
//! into, standing in for the S3 side so the engine can be tested on its own. A fixed delay
//! per request stands in for S3's latency where a test needs reads to overlap.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use std::path::Path;

use bytes::Bytes;

use crate::cold::{ColdRead, ColdStore};
use crate::position::{off, rec, Offset};
use crate::readback;
use crate::record::Lifetime;
use crate::test_support::block_on;

use super::*;

/// Counters shared by a [`DirStore`] and the reads it hands out.
#[derive(Debug, Default)]
pub(super) struct StoreCounters {
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
}

/// A cold tier in a local directory: a segment is archived once the test has copied it in.
#[derive(Debug)]
pub(super) struct DirStore {
    pub dir: PathBuf,
    pub latency: Duration,
    pub counters: Arc<StoreCounters>,
    /// Archiving stopped for good (as when another server fenced this one out).
    pub stopped: std::sync::atomic::AtomicBool,
}

impl DirStore {
    pub(super) fn new(dir: &Path, latency: Duration) -> Arc<DirStore> {
        std::fs::create_dir_all(dir).expect("store dir");
        Arc::new(DirStore {
            dir: dir.to_path_buf(),
            latency,
            counters: Arc::default(),
            stopped: Default::default(),
        })
    }

    /// Copy the shard's sealed segment files not archived yet into the store, as the
    /// archiver would (those before the segment being written; all durable by then).
    pub(super) fn archive_sealed(&self, shard: &Shard) -> usize {
        self.archive_where(shard, |_| true)
    }

    pub(super) fn archive_where(&self, shard: &Shard, pick: impl Fn(SegmentNo) -> bool) -> usize {
        let (dir, write_seg) = {
            let log = shard.inner.log.borrow();
            let log = log.as_ref().expect("disk shard");
            (log.dir().to_path_buf(), log.write_segment())
        };
        let mut copied = 0;
        for seg in segment::list_segments(&dir).expect("list") {
            let to = segment::segment_path(&self.dir, seg);
            if seg < write_seg && pick(seg) && !to.exists() {
                let tmp = to.with_extension("tmp");
                std::fs::copy(segment::segment_path(&dir, seg), &tmp).expect("copy");
                std::fs::rename(&tmp, &to).expect("rename");
                copied += 1;
            }
        }
        copied
    }
}

impl ColdStore for DirStore {
    fn is_archived(&self, _shard: u32, segment: SegmentNo) -> bool {
        segment::segment_path(&self.dir, segment).exists()
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    fn read(&self, _shard: u32, segment: SegmentNo, offset: u64, len: usize) -> ColdRead {
        let path = segment::segment_path(&self.dir, segment);
        let latency = self.latency;
        let counters = self.counters.clone();
        Box::pin(async move {
            let now = counters.in_flight.fetch_add(len, Ordering::SeqCst) + len;
            counters.max_in_flight.fetch_max(now, Ordering::SeqCst);
            if !latency.is_zero() {
                monoio::time::sleep(latency).await;
            }
            let result = segment::read_up_to(&path, offset, len).map(Bytes::from);
            counters.in_flight.fetch_sub(len, Ordering::SeqCst);
            counters.reads.fetch_add(1, Ordering::SeqCst);
            if let Ok(b) = &result {
                counters
                    .read_bytes
                    .fetch_add(b.len() as u64, Ordering::SeqCst);
            }
            result
        })
    }
}

pub(super) const SEGMENT: u64 = 16 << 10;

fn cold_config(dir: &Path, store: &Arc<DirStore>, local_segments: u64) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    cfg.tiny_segments = true;
    cfg.segment_bytes = SEGMENT;
    cfg.cache_bytes = 4096;
    cfg.checkpoint_bytes = u64::MAX; // the test takes them
    cfg.cold = Some(store.clone());
    cfg.local_bytes = Some(local_segments * SEGMENT);
    cfg.cold_cache_bytes = 4 * SEGMENT as usize;
    cfg
}

fn json_stream(key: &str) -> NewStream {
    NewStream {
        meta: StreamMeta {
            key: key.into(),
            incarnation: 3,
            created_ms: 1,
            content_type: "application/json".into(),
            lifetime: Lifetime::Forever,
            ext: Bytes::new(),
        },
        initial: AppendRec::default(),
    }
}

/// One append of `n` JSON records of stream `s`, numbered from `first`.
fn records(s: usize, first: usize, n: usize) -> (AppendRec, Vec<Vec<u8>>) {
    let recs: Vec<Vec<u8>> = (first..first + n)
        .map(|i| {
            let pad = "x".repeat((i * 7 + s * 13) % 90);
            format!("{{\"s\":{s},\"i\":{i},\"p\":\"{pad}\"}}\n").into_bytes()
        })
        .collect();
    let rec = AppendRec {
        append_lens: vec![recs.iter().map(|r| r.len() as u32).sum()],
        msg_lens: recs.iter().map(|r| r.len() as u32).collect(),
        data: Bytes::from(recs.concat()),
        ..Default::default()
    };
    (rec, recs)
}

fn local_files(dir: &Path) -> usize {
    segment::list_segments(&dir.join("shard-0"))
        .expect("list")
        .len()
}

/// Stream `s0` with 400 durable appends of two records each (many tiny segments); returns
/// its id and records.
async fn one_stream_over_many_segments(shard: &Shard) -> (StreamId, Vec<Vec<u8>>) {
    let (id, c) = shard.create(json_stream("s0")).expect("create");
    c.durable().await.expect("durable");
    let mut all = Vec::new();
    for i in 0..400 {
        let (rec, recs) = records(0, i, 2);
        all.extend(recs);
        let c = shard.append(id, rec).expect("append").1;
        c.durable().await.expect("durable");
    }
    (id, all)
}

/// Archive what is sealed, checkpoint (which moves the position eviction stops at), evict.
async fn archive_and_evict(shard: &Shard, store: &DirStore) -> usize {
    shard.checkpoint().await.expect("checkpoint");
    store.archive_sealed(shard);
    shard.evict_archived().await.expect("evict")
}

/// Write `streams` JSON streams of `appends` appends each, in turn; returns every stream's
/// records. Archives and evicts every `every` rounds, checking the local bound each time.
async fn fill(
    shard: &Shard,
    store: &DirStore,
    dir: &Path,
    streams: usize,
    appends: usize,
    every: usize,
) -> Vec<Vec<Vec<u8>>> {
    let mut ids = Vec::new();
    for s in 0..streams {
        let (id, c) = shard.create(json_stream(&format!("s{s}"))).expect("create");
        c.durable().await.expect("durable");
        ids.push(id);
    }
    let mut model = vec![Vec::new(); streams];
    let budget = shard.config().local_bytes.expect("budget");
    for round in 0..appends {
        let mut commits = Vec::new();
        for (s, &id) in ids.iter().enumerate() {
            let n = model[s].len();
            let (rec, recs) = records(s, n, 1 + (round + s) % 3);
            model[s].extend(recs);
            commits.push(shard.append(id, rec).expect("append").1);
        }
        for c in commits {
            c.durable().await.expect("durable");
        }
        if round % every == every - 1 {
            archive_and_evict(shard, store).await;
            // Everything sealed is archived and behind the checkpoint, so only the open
            // segment may exceed the budget.
            let local = local_files(dir) as u64 * SEGMENT;
            assert!(local <= budget + SEGMENT, "{local} local bytes");
            assert_eq!(
                shard.stats().local_segment_bytes,
                local,
                "the shard counts the files there are"
            );
        }
    }
    model
}

/// Every record of every stream by ordinal, random ranges, and the whole stream.
async fn check_reads(shard: &Shard, model: &[Vec<Vec<u8>>], seed: u64) {
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    for (s, recs) in model.iter().enumerate() {
        let id = shard.lookup(&format!("s{s}")).expect("stream");
        let whole: Vec<u8> = recs.concat();
        let got = shard
            .read(id, Offset::ZERO, off(u64::MAX))
            .await
            .expect("read")
            .concat();
        assert_eq!(got, whole, "s{s} whole");
        let starts: Vec<u64> = {
            let st = shard.state(id).expect("stream");
            assert_eq!(st.message_count(), rec(recs.len() as u64), "s{s} records");
            (0..=recs.len() as u64)
                .map(|o| st.message_start(rec(o)).expect("ordinal").get())
                .collect()
        };
        for (o, rec) in recs.iter().enumerate() {
            let got = shard
                .read(id, off(starts[o]), off(starts[o + 1]))
                .await
                .expect("read")
                .concat();
            assert_eq!(&got, rec, "s{s} record {o}");
        }
        for _ in 0..8 {
            let from = next(whole.len() as u64);
            let to = from + 1 + next(whole.len() as u64 - from);
            let got = shard
                .read(id, off(from), off(to))
                .await
                .expect("read")
                .concat();
            assert_eq!(
                got,
                &whole[from as usize..to as usize],
                "s{s} [{from}, {to})"
            );
        }
    }
}

#[test]
fn far_more_than_the_local_budget_reads_back_hot_and_cold_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let cfg = cold_config(&dir.path().join("data"), &store, 4);
    let data = dir.path().join("data");
    let model = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let model = fill(&shard, &store, &data, 12, 700, 20).await;
        let stats = shard.stats();
        let written: u64 = model.iter().flatten().map(|r| r.len() as u64).sum();
        assert!(
            written > 15 * cfg.local_bytes.expect("budget"),
            "{written} bytes written"
        );
        assert!(stats.evicted_segments > 40, "{stats:?}");
        assert!(stats.cold_segments > 40, "{stats:?}");
        check_reads(&shard, &model, 1).await;
        let stats = shard.stats();
        assert!(
            stats.cold_reads > 0 && stats.cold_read_bytes > 0,
            "{stats:?}"
        );
        assert!(
            stats.cold_cache_hits > 0,
            "neighbouring records share blocks"
        );
        assert!(stats.cold_cache_bytes <= cfg.cold_cache_bytes as u64);
        // The same again, now partly from the caches: still exact.
        check_reads(&shard, &model, 2).await;
        shard.halt().await.expect("halt");
        model
    });
    // A crash: recovery replays only the local tail; the cold segments stay cold.
    let cold_files = local_files(&data);
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("reopen");
        assert!(
            report.segments <= 2,
            "replayed {} segments",
            report.segments
        );
        assert_eq!(local_files(&data), cold_files, "nothing came back");
        assert!(shard.stats().cold_segments > 40);
        assert_eq!(shard.stats().cold_reads, 0);
        check_reads(&shard, &model, 3).await;
        assert!(shard.stats().cold_reads > 0);
        shard.shutdown().await.expect("shutdown");
    });
    // A clean stop, and a start without the cold tier: refused, because its streams
    // would have holes where the cold segments were.
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        check_reads(&shard, &model, 4).await;
        shard.halt().await.expect("halt");
        let mut plain = cfg.clone();
        plain.cold = None;
        plain.local_bytes = None;
        let err = match Shard::open(plain).await {
            Ok(_) => panic!("a shard with cold segments opened without its cold tier"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("only in the S3 cold tier"), "{err}");
        // Nothing was changed by the refusal.
        let (shard, _) = Shard::open(cfg.clone())
            .await
            .expect("reopen with the cold tier");
        check_reads(&shard, &model, 5).await;
        shard.halt().await.expect("halt");
    });
}

#[test]
fn once_archiving_stopped_for_good_nothing_more_is_evicted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let cfg = cold_config(&dir.path().join("data"), &store, 1);
    let seg_dir = dir.path().join("data").join("shard-0");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        assert!(!seg_dir.join(COLD_MARKER).exists());
        one_stream_over_many_segments(&shard).await;
        shard.checkpoint().await.expect("checkpoint");
        store.archive_sealed(&shard);
        // Fenced: the new owner decides what stays in the archive, so nothing leaves.
        store.stopped.store(true, Ordering::SeqCst);
        assert_eq!(shard.evict_archived().await.expect("evict"), 0);
        assert!(!seg_dir.join(COLD_MARKER).exists());
        store.stopped.store(false, Ordering::SeqCst);
        assert!(shard.evict_archived().await.expect("evict") > 0);
        assert!(
            seg_dir.join(COLD_MARKER).exists(),
            "the marker is written before the first segment leaves"
        );
        shard.halt().await.expect("halt");
    });
}

#[test]
fn a_corrupt_byte_in_the_cold_tier_is_an_error_not_wrong_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let cfg = cold_config(&dir.path().join("data"), &store, 2);
    let data = dir.path().join("data");
    let model = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let model = fill(&shard, &store, &data, 2, 200, 50).await;
        shard.shutdown().await.expect("shutdown");
        model
    });
    // Flip a byte inside the first record of s0, in its archived copy (segment 1 is cold).
    let path = segment::segment_path(&store.dir, SegmentNo::new(1));
    assert!(!segment::segment_path(&data.join("shard-0"), SegmentNo::new(1)).exists());
    let mut bytes = std::fs::read(&path).expect("read");
    let needle = b"{\"s\":0,\"i\":0,";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("record in segment 1");
    bytes[at + 6] ^= 0x01;
    std::fs::write(&path, &bytes).expect("write");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        let id = shard.lookup("s0").expect("s0");
        let first = model[0][0].len() as u64;
        match shard.read(id, Offset::ZERO, off(first)).await {
            Err(StorageError::Corrupt(why)) => {
                assert!(why.to_string().contains("segment 1"), "{why}")
            }
            other => panic!("expected a checksum failure, got {other:?}"),
        }
        // Records elsewhere still read.
        let s1 = shard.lookup("s1").expect("s1");
        let tail: Vec<u8> = model[1].concat();
        let from = tail.len() as u64 - 100;
        let got = shard
            .read(s1, off(from), off(u64::MAX))
            .await
            .expect("read")
            .concat();
        assert_eq!(got, &tail[from as usize..]);
    });
}

#[test]
fn cold_reads_stay_within_the_in_flight_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::from_millis(3));
    let mut cfg = cold_config(&dir.path().join("data"), &store, 2);
    cfg.cold_in_flight_bytes = 2 * SEGMENT as usize;
    cfg.cold_cache_bytes = SEGMENT as usize;
    let data = dir.path().join("data");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let model = fill(&shard, &store, &data, 6, 300, 100).await;
        assert!(shard.stats().cold_segments > 10);
        // Every stream read whole at once: each wants many cold blocks.
        let reads: Vec<_> = (0..model.len())
            .map(|s| {
                let shard = shard.clone();
                let want = model[s].concat();
                async move {
                    let id = shard.lookup(&format!("s{s}")).expect("stream");
                    let got = shard
                        .read(id, Offset::ZERO, off(u64::MAX))
                        .await
                        .expect("read")
                        .concat();
                    assert_eq!(got, want, "s{s}");
                }
            })
            .collect();
        readback::join_all(reads).await;
        let most = store.counters.max_in_flight.load(Ordering::SeqCst);
        assert!(most > 0);
        assert!(
            most <= cfg.cold_in_flight_bytes,
            "{most} bytes in flight, budget {}",
            cfg.cold_in_flight_bytes
        );
        let stats = shard.stats();
        assert_eq!(stats.cold_bytes_in_flight, 0);
        assert!(
            stats.cold_reads < stats.cold_cache_misses,
            "readers of one block share its fetch: {stats:?}"
        );
        shard.halt().await.expect("halt");
        // One reader catching up in small reads: the blocks of its next chunks are
        // fetched ahead of it, each block once.
        let mut cfg = cfg.clone();
        cfg.cold_cache_bytes = 8 * SEGMENT as usize;
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        let id = shard.lookup("s0").expect("s0");
        let want = model[0].concat();
        let mut got = Vec::new();
        while got.len() < want.len() {
            let at = off(got.len() as u64);
            for piece in shard.read(id, at, at + 2000).await.expect("read") {
                got.extend_from_slice(&piece);
            }
        }
        assert_eq!(got, want);
        let stats = shard.stats();
        assert!(stats.cold_reads <= stats.cold_segments, "{stats:?}");
        assert!(
            stats.cold_prefetches * 2 > stats.cold_reads,
            "most blocks were fetched before the reader asked: {stats:?}"
        );
        shard.halt().await.expect("halt");
        // Small reads at scattered offsets are not catch-up reading: nothing is fetched
        // ahead of them, and they still read back exactly.
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        let id = shard.lookup("s0").expect("s0");
        let step = want.len() / 13;
        for k in (0..12).rev() {
            let at = k * step + k * 7;
            let got = shard
                .read(id, off(at as u64), off(at as u64 + 100))
                .await
                .expect("read");
            assert_eq!(got.concat(), want[at..at + 100], "100 bytes at {at}");
        }
        let stats = shard.stats();
        assert!(stats.cold_reads > 0, "{stats:?}");
        assert_eq!(stats.cold_prefetches, 0, "{stats:?}");
    });
}

#[test]
fn eviction_never_removes_an_unarchived_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let cfg = cold_config(&dir.path().join("data"), &store, 1);
    let seg_dir = dir.path().join("data").join("shard-0");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, all) = one_stream_over_many_segments(&shard).await;
        shard.checkpoint().await.expect("checkpoint");
        // Nothing archived: nothing leaves, however far over the budget.
        assert_eq!(shard.evict_archived().await.expect("evict"), 0);
        let before = segment::list_segments(&seg_dir).expect("list");
        assert!(before.len() > 5);
        // Only odd segments archived: only they may go.
        store.archive_where(&shard, |s| s.get() % 2 == 1);
        let evicted = shard.evict_archived().await.expect("evict");
        assert!(evicted > 0);
        let after = segment::list_segments(&seg_dir).expect("list");
        for s in &before {
            let archived = segment::segment_path(&store.dir, *s).exists();
            assert!(
                after.contains(s) || archived,
                "segment {s} left without being archived"
            );
            assert_eq!(shard.is_cold(*s), !after.contains(s));
        }
        assert_eq!(
            shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .concat(),
            all.concat()
        );
    });
}

#[test]
fn the_cleaner_reclaims_cold_segments_after_deletes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let cfg = cold_config(&dir.path().join("data"), &store, 3);
    let data = dir.path().join("data");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let model = fill(&shard, &store, &data, 8, 200, 20).await;
        let usage = shard.disk_usage();
        assert!(usage.segments > 3 * usage.local_segments, "{usage:?}");
        // Delete all but s0 and s4; the oldest segments are cold.
        for s in (0..8).filter(|s| s % 4 != 0) {
            let id = shard.lookup(&format!("s{s}")).expect("stream");
            shard
                .delete(id)
                .expect("delete")
                .durable()
                .await
                .expect("durable");
        }
        let cold_before = shard.stats().cold_segments;
        let removed = shard.clean().await.expect("clean");
        assert!(removed > 0);
        let after = shard.disk_usage();
        assert!(after.segments < usage.segments, "{after:?} after {usage:?}");
        assert!(shard.stats().cold_segments < cold_before);
        assert!(
            shard.stats().cold_reads > 0,
            "live chunks came back from cold"
        );
        // Keep cleaning and evicting: the log shrinks toward twice the live data.
        for _ in 0..6 {
            shard.clean().await.expect("clean");
            archive_and_evict(&shard, &store).await;
        }
        let last = shard.disk_usage();
        assert!(
            last.segment_bytes <= 2 * last.live_bytes + 2 * SEGMENT,
            "{last:?}"
        );
        for s in [0, 4] {
            let id = shard.lookup(&format!("s{s}")).expect("stream");
            let got = shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .concat();
            assert_eq!(got, model[s].concat(), "s{s}");
        }
        shard.halt().await.expect("halt");
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("reopen");
        assert_eq!(shard.keys().len(), 2);
        for s in [0, 4] {
            let id = shard.lookup(&format!("s{s}")).expect("stream");
            assert!(!shard
                .read(id, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .is_empty());
        }
    });
}

#[test]
fn the_cleaner_keeps_a_sealed_segment_until_the_archive_has_it_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    // A budget far beyond the log: nothing is evicted, only cleaning removes files.
    let cfg = cold_config(&dir.path().join("data"), &store, 1_000);
    let seg_dir = dir.path().join("data").join("shard-0");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (keep, c) = shard.create(json_stream("keep")).expect("create");
        c.durable().await.expect("durable");
        let (doomed, c) = shard.create(json_stream("doomed")).expect("create");
        c.durable().await.expect("durable");
        let mut kept = Vec::new();
        for i in 0..300 {
            let (rec, recs) = records(0, i, 2);
            let (_, c) = shard.append(doomed, rec).expect("append");
            c.durable().await.expect("durable");
            if i % 50 == 0 {
                let (rec, recs) = records(1, kept.len(), 1);
                kept.extend(recs);
                let (_, c) = shard.append(keep, rec).expect("append");
                c.durable().await.expect("durable");
            }
            drop(recs);
        }
        shard
            .delete(doomed)
            .expect("delete")
            .durable()
            .await
            .expect("durable");
        shard.checkpoint().await.expect("checkpoint");
        let before = segment::list_segments(&seg_dir).expect("list");
        assert!(before.len() > 4, "{before:?}");
        // Mostly dead, but nothing archived: every sealed segment stays.
        assert_eq!(shard.clean().await.expect("clean"), 0);
        assert_eq!(segment::list_segments(&seg_dir).expect("list"), before);
        // Only the oldest archived: only it may go, the next one stops the cleaner.
        let oldest = before[0];
        store.archive_where(&shard, |s| s == oldest);
        assert_eq!(shard.clean().await.expect("clean"), 1);
        let after = segment::list_segments(&seg_dir).expect("list");
        assert!(!after.contains(&oldest));
        for s in &before[1..] {
            assert!(after.contains(s), "segment {s} went before it was archived");
        }
        // Once everything sealed is archived the log shrinks toward the live data.
        store.archive_sealed(&shard);
        assert!(shard.clean().await.expect("clean") > 0);
        for s in before
            .iter()
            .filter(|s| !segment::list_segments(&seg_dir).expect("list").contains(s))
        {
            assert!(
                segment::segment_path(&store.dir, *s).exists(),
                "segment {s} left the disk without being archived"
            );
        }
        let got = shard
            .read(keep, Offset::ZERO, off(u64::MAX))
            .await
            .expect("read")
            .concat();
        assert_eq!(got, kept.concat());
    });
}

#[test]
fn once_archiving_stopped_for_good_the_cleaner_no_longer_waits_for_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let cfg = cold_config(&dir.path().join("data"), &store, 1_000);
    let seg_dir = dir.path().join("data").join("shard-0");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (keep, c) = shard.create(json_stream("keep")).expect("create");
        c.durable().await.expect("durable");
        let (kept, _) = records(1, 0, 3);
        let want = kept.data.clone();
        shard
            .append(keep, kept)
            .expect("append")
            .1
            .durable()
            .await
            .expect("durable");
        let (doomed, c) = shard.create(json_stream("doomed")).expect("create");
        c.durable().await.expect("durable");
        for i in 0..300 {
            let (rec, _) = records(0, i, 2);
            let (_, c) = shard.append(doomed, rec).expect("append");
            c.durable().await.expect("durable");
        }
        shard
            .delete(doomed)
            .expect("delete")
            .durable()
            .await
            .expect("durable");
        shard.checkpoint().await.expect("checkpoint");
        let before = segment::list_segments(&seg_dir).expect("list").len();
        assert_eq!(
            shard.clean().await.expect("clean"),
            0,
            "waits for the archive"
        );
        store.stopped.store(true, Ordering::SeqCst);
        assert!(shard.clean().await.expect("clean") > 0);
        assert!(segment::list_segments(&seg_dir).expect("list").len() < before);
        assert_eq!(
            shard
                .read(keep, Offset::ZERO, off(u64::MAX))
                .await
                .expect("read")
                .concat(),
            want.to_vec()
        );
        // Eviction still needs the archive: nothing was archived, nothing is cold.
        assert_eq!(shard.stats().cold_segments, 0);
    });
}

#[test]
fn a_full_disk_with_nothing_archived_names_the_archive_lag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DirStore::new(&dir.path().join("cold"), Duration::ZERO);
    let mut cfg = cold_config(&dir.path().join("data"), &store, 2);
    cfg.disk_segments = Some(6);
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let (id, c) = shard.create(json_stream("s0")).expect("create");
        c.durable().await.expect("durable");
        let mut written = 0;
        let why = loop {
            let (rec, _) = records(0, written, 3);
            match shard.append(id, rec) {
                Ok((_, c)) => c.durable().await.expect("durable"),
                Err(e) => break e,
            }
            written += 3;
            assert!(written < 100_000, "the disk never filled");
        };
        match &why {
            StorageError::NoSpaceUnarchived(lag) => {
                assert_eq!(lag.segments, 5, "{lag}");
            }
            other => panic!("expected a full disk naming the archive lag, got {other:?}"),
        }
        let tail = shard.state(id).expect("s0").tail;
        // Once the archive catches up, segments leave and appends go on.
        archive_and_evict(&shard, &store).await;
        let (rec, _) = records(0, written, 3);
        let (_, c) = shard.append(id, rec).expect("append after eviction");
        c.durable().await.expect("durable");
        assert!(shard.state(id).expect("s0").tail > tail);
    });
}
