//! The shard against a simple model: random appends of JSON arrays and plain writes,
//! retention, deletes, recreates, checkpoints, cleaning and restarts, with every offset and
//! every record ordinal of every stream checked after each restart and at random points.
//!
//! Segments are small and the cache is tiny, so chunk tables and record indexes span many
//! packed blocks and most reads go to disk. With a cold tier, sealed segments are archived
//! and evicted at every checkpoint, so most reads go to the cold tier instead.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;

use crate::position::{off, rec};
use crate::record::Lifetime;
use crate::test_support::block_on;

use super::cold_tests::DirStore;
use super::*;

/// A stream as the model keeps it: its whole byte history and where each record starts.
#[derive(Clone, Default)]
struct Model {
    bytes: Vec<u8>,
    starts: Vec<u64>,
    retained: u64,
    incarnation: u64,
}

impl Model {
    fn first_record(&self) -> usize {
        self.starts.partition_point(|&s| s < self.retained)
    }
}

/// xorshift64*: the test needs reproducible randomness, not a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn config(dir: &Path, segment_bytes: u64) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    // 0: the minimum that holds the largest record. Anything else: tiny segments, so the
    // log rolls every few steps and the cleaner relocates chunks across many segments.
    cfg.tiny_segments = segment_bytes > 0;
    cfg.segment_bytes = segment_bytes;
    cfg.cache_bytes = 4096;
    cfg.checkpoint_bytes = u64::MAX; // checkpoints are taken by the test
    cfg
}

/// Records of one append: canonical NDJSON lines of random lengths.
fn records(rng: &mut Rng) -> Vec<String> {
    (0..1 + rng.below(4))
        .map(|_| {
            let len = rng.below(40) as usize;
            let body: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            format!("{{\"v\":\"{body}\"}}\n")
        })
        .collect()
}

fn append_rec(recs: &[String], writes: usize) -> AppendRec {
    let data: String = recs.concat();
    // Split the records over `writes` write operations (a batch), never inside one.
    let per = recs.len().div_ceil(writes.max(1));
    let append_lens = recs
        .chunks(per)
        .map(|g| g.iter().map(|r| r.len() as u32).sum())
        .collect();
    AppendRec {
        append_lens,
        msg_lens: recs.iter().map(|r| r.len() as u32).collect(),
        data: Bytes::from(data),
        ..Default::default()
    }
}

fn new_stream(key: &str, incarnation: u64) -> NewStream {
    NewStream {
        meta: StreamMeta {
            key: key.into(),
            incarnation,
            created_ms: 1,
            content_type: "application/json".into(),
            lifetime: Lifetime::Forever,
            ext: Bytes::new(),
        },
        initial: AppendRec::default(),
    }
}

/// Every offset and record lookup of `key` against the model.
async fn check(shard: &Shard, key: &str, m: &Model, rng: &mut Rng) {
    let id = shard.lookup(key).unwrap_or_else(|| panic!("{key} missing"));
    let tail = m.bytes.len() as u64;
    let first = m.first_record();
    {
        let s = shard.state(id).expect("stream");
        assert_eq!(s.meta.incarnation, m.incarnation, "{key}");
        assert_eq!((s.tail, s.visible_tail), (off(tail), off(tail)), "{key}");
        assert_eq!(s.retained_start, off(m.retained), "{key}");
        assert_eq!(s.first_message(), rec(first as u64), "{key}");
        let count = rec(m.starts.len() as u64);
        assert_eq!(s.message_count(), count, "{key}");
        assert_eq!(s.visible_message_count(), count, "{key}");
        for (ordinal, &start) in m.starts.iter().enumerate().skip(first) {
            let ordinal = rec(ordinal as u64);
            assert_eq!(
                s.message_start(ordinal),
                Some(off(start)),
                "{key} #{ordinal}"
            );
            assert!(s.is_message_boundary(off(start)), "{key} @{start}");
            assert_eq!(s.message_at_or_after(off(start)), ordinal, "{key} @{start}");
            if start > 0 && m.starts.binary_search(&(start - 1)).is_err() {
                let before = off(start - 1);
                assert!(!s.is_message_boundary(before), "{key} @{before}");
                assert_eq!(s.message_at_or_after(before), ordinal);
            }
        }
        assert_eq!(s.message_start(count), Some(off(tail)));
        assert_eq!(s.message_start(count.next()), None);
        if first > 0 {
            assert_eq!(
                s.message_start(rec(first as u64 - 1)),
                None,
                "{key}: retained away"
            );
        }
        let lens: Vec<u32> = (first..m.starts.len())
            .map(|i| {
                let end = m.starts.get(i + 1).copied().unwrap_or(tail);
                (end - m.starts[i]) as u32
            })
            .collect();
        assert_eq!(s.message_lens(rec(first as u64), count), lens, "{key}");
        // Record-aware limits: from a random record, at most some records or bytes.
        if first < m.starts.len() {
            let from = first + rng.below((m.starts.len() - first) as u64) as usize;
            let limit = from + 1 + rng.below(20) as usize;
            let max_end = m.starts[from] + rng.below(600);
            // Records [from, e) end where record e starts, or at the tail for the last.
            let count = m.starts.len();
            let end_of = |e: usize| m.starts.get(e).copied().unwrap_or(tail);
            let mut want = from + 1;
            for e in from + 1..=limit.min(count) {
                if end_of(e) > max_end {
                    break;
                }
                want = e;
            }
            assert_eq!(
                s.records_within(rec(from as u64), rec(limit as u64), off(max_end)),
                rec(want as u64),
                "{key} from {from} limit {limit} max_end {max_end}"
            );
        }
    }
    let whole = shard
        .read(id, off(m.retained), off(u64::MAX))
        .await
        .expect("read");
    assert_eq!(
        whole.concat(),
        &m.bytes[m.retained as usize..],
        "{key} whole"
    );
    for _ in 0..4 {
        if tail == m.retained {
            break;
        }
        let from = m.retained + rng.below(tail - m.retained);
        let to = from + 1 + rng.below(tail - from);
        let got = shard.read(id, off(from), off(to)).await.expect("read");
        assert_eq!(
            got.concat(),
            &m.bytes[from as usize..to as usize],
            "{key} [{from}, {to})"
        );
    }
}

async fn check_all(shard: &Shard, models: &BTreeMap<String, Model>, rng: &mut Rng) {
    shard.check_cache();
    let mut keys: Vec<String> = shard.keys().iter().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(keys, models.keys().cloned().collect::<Vec<_>>());
    for (key, m) in models {
        check(shard, key, m, rng).await;
    }
}

/// With `dormant`, every stream is idle at once (`idle_after` zero), and the steps include
/// putting them to sleep, so that the history runs through dormant streams woken by every
/// kind of change, by the cleaner, by checkpoints and by restarts.
fn run(seed: u64, steps: usize, segment_bytes: u64, cold: bool, dormant: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path(), segment_bytes);
    if dormant {
        cfg.idle_after = Duration::ZERO;
    }
    // The local budget holds one segment: everything older is read from the cold tier.
    let store = cold.then(|| DirStore::new(&dir.path().join("cold"), Duration::ZERO));
    if let Some(store) = &store {
        cfg.cold = Some(store.clone());
        cfg.local_bytes = Some(segment_bytes);
        cfg.cold_cache_bytes = 2 * segment_bytes as usize;
    }
    let mut rng = Rng(seed);
    let mut models: BTreeMap<String, Model> = BTreeMap::new();
    let mut incarnation = 1;
    let mut step = 0;
    let mut cold_reads = 0;
    while step < steps {
        block_on(async {
            let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
            check_all(&shard, &models, &mut rng).await;
            while step < steps {
                step += 1;
                let key = format!("s{}", rng.below(4));
                let roll = rng.below(1000);
                let exists = models.contains_key(&key);
                if !exists {
                    incarnation += 1;
                    let (_, c) = shard.create(new_stream(&key, incarnation)).expect("create");
                    c.durable().await.expect("durable");
                    models.insert(
                        key,
                        Model {
                            incarnation,
                            ..Model::default()
                        },
                    );
                } else if roll < 850 {
                    // A burst of appends sharing group commits.
                    let id = shard.lookup(&key).expect("id");
                    let mut commits = Vec::new();
                    let m = models.get_mut(&key).expect("model");
                    for _ in 0..1 + rng.below(8) {
                        let recs = records(&mut rng);
                        let writes = 1 + rng.below(recs.len() as u64) as usize;
                        for r in &recs {
                            m.starts.push(m.bytes.len() as u64);
                            m.bytes.extend_from_slice(r.as_bytes());
                        }
                        let (_, c) = shard.append(id, append_rec(&recs, writes)).expect("append");
                        commits.push(c);
                    }
                    for c in commits {
                        c.durable().await.expect("durable");
                    }
                } else if roll < 900 {
                    // Retention to a random record boundary.
                    let m = models.get_mut(&key).expect("model");
                    let first = m.first_record();
                    if first < m.starts.len() {
                        let to = first + rng.below((m.starts.len() - first) as u64 + 1) as usize;
                        let offset = m.starts.get(to).copied().unwrap_or(m.bytes.len() as u64);
                        let id = shard.lookup(&key).expect("id");
                        shard
                            .retain(id, off(offset))
                            .expect("retain")
                            .durable()
                            .await
                            .expect("durable");
                        m.retained = m.retained.max(offset);
                    }
                } else if roll < 930 {
                    let id = shard.lookup(&key).expect("id");
                    shard
                        .delete(id)
                        .expect("delete")
                        .durable()
                        .await
                        .expect("durable");
                    models.remove(&key);
                } else if roll < 950 {
                    shard.checkpoint().await.expect("checkpoint");
                    if let Some(store) = &store {
                        store.archive_sealed(&shard);
                        shard.evict_archived().await.expect("evict");
                    }
                } else if roll < 970 {
                    shard.clean().await.expect("clean");
                    if let Some(store) = &store {
                        store.archive_sealed(&shard);
                        shard.evict_archived().await.expect("evict");
                    }
                } else if dormant && roll < 975 {
                    shard.sleep_idle().await.expect("sleep");
                    assert!(shard.stream_counts().1 > 0 || models.is_empty());
                } else if roll < 980 {
                    check_all(&shard, &models, &mut rng).await;
                } else {
                    // Restart: a crash (nothing flushed beyond what was acknowledged) or
                    // a clean stop that writes a checkpoint.
                    cold_reads += shard.stats().cold_reads;
                    if rng.below(2) == 0 {
                        shard.halt().await.expect("halt");
                    } else {
                        shard.shutdown().await.expect("shutdown");
                    }
                    return;
                }
            }
            check_all(&shard, &models, &mut rng).await;
            cold_reads += shard.stats().cold_reads;
            shard.halt().await.expect("halt");
        });
    }
    // One more start after the last step.
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        check_all(&shard, &models, &mut rng).await;
        if cold {
            let stats = shard.stats();
            cold_reads += stats.cold_reads;
            assert!(stats.cold_segments > 0, "{stats:?}");
            assert!(cold_reads > 100, "{cold_reads} cold reads");
        }
    });
}

#[test]
fn random_histories_read_back_exactly_across_restarts() {
    for seed in [0x5eed_0001, 0x5eed_0002] {
        run(seed, 1200, 0, false, false);
    }
}

#[test]
fn random_histories_over_many_small_segments_survive_cleaning_and_restarts() {
    for seed in [0x5eed_0003, 0x5eed_0004] {
        run(seed, 1200, 16 << 10, false, false);
    }
}

#[test]
fn random_histories_through_dormant_streams_read_back_exactly() {
    for seed in [0x5eed_0011, 0x5eed_0012] {
        run(seed, 1200, 16 << 10, false, true);
    }
}

#[test]
fn random_histories_through_dormant_streams_with_a_cold_tier() {
    run(0x5eed_0013, 1500, 16 << 10, true, true);
}

#[test]
fn random_histories_with_a_cold_tier_survive_eviction_cleaning_and_restarts() {
    for seed in [0x5eed_0005, 0x5eed_0006, 0x5eed_0007] {
        run(seed, 1500, 16 << 10, true, false);
    }
}
