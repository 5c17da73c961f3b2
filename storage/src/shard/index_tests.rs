//! Sealed index pages: they leave memory for index files once enough of them wait and when
//! the log rolls, lookups and reads through them are exact, and a restart (after a crash, a
//! clean stop, or with an index file lost or torn) finds every offset and record again.

use std::path::Path;

use bytes::Bytes;

use crate::checkpoint;
use crate::index::IndexFileNo;
use crate::position::{off, rec, Offset};
use crate::record::Lifetime;
use crate::test_support::block_on;

use super::*;

/// A stream as the test keeps it: its bytes and where each record starts.
#[derive(Default)]
struct Model {
    bytes: Vec<u8>,
    starts: Vec<u64>,
    retained: u64,
}

fn config(dir: &Path) -> ShardConfig {
    let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
    // The log rolls every 64 KiB, so the history spans many sealed segments.
    cfg.tiny_segments = true;
    cfg.segment_bytes = 64 << 10;
    cfg.cache_bytes = 4096;
    cfg.index_cache_bytes = 4096;
    cfg.checkpoint_bytes = u64::MAX;
    cfg
}

fn new_stream(key: &str) -> NewStream {
    NewStream {
        meta: StreamMeta {
            key: key.into(),
            incarnation: 1,
            created_ms: 1,
            content_type: "application/json".into(),
            lifetime: Lifetime::Forever,
            ext: Bytes::new(),
        },
        initial: AppendRec::default(),
    }
}

/// Append `n` appends of one or two records to each stream, interleaved.
async fn fill(shard: &Shard, models: &mut [(StreamId, Model)], n: usize) {
    for i in 0..n {
        for (id, m) in models.iter_mut() {
            let recs: Vec<String> = (0..1 + i % 2)
                .map(|j| {
                    format!(
                        "{{\"i\":{i},\"j\":{j},\"pad\":\"{}\"}}\n",
                        "x".repeat(i % 13)
                    )
                })
                .collect();
            for r in &recs {
                m.starts.push(m.bytes.len() as u64);
                m.bytes.extend_from_slice(r.as_bytes());
            }
            let data = recs.concat();
            let a = AppendRec {
                append_lens: vec![data.len() as u32],
                msg_lens: recs.iter().map(|r| r.len() as u32).collect(),
                data: Bytes::from(data),
                ..Default::default()
            };
            let (_, c) = shard.append(*id, a).expect("append");
            c.durable().await.expect("durable");
        }
    }
}

async fn check(shard: &Shard, models: &[(StreamId, Model)]) {
    for (id, m) in models {
        let tail = m.bytes.len() as u64;
        let first = m.starts.partition_point(|&s| s < m.retained);
        {
            let s = shard.state(*id).expect("stream");
            assert_eq!(
                (s.visible_tail, s.first_message()),
                (off(tail), rec(first as u64))
            );
            assert_eq!(s.message_count(), rec(m.starts.len() as u64));
            for (ordinal, &start) in m.starts.iter().enumerate().skip(first) {
                let (ordinal, start) = (rec(ordinal as u64), off(start));
                assert_eq!(s.message_start(ordinal), Some(start), "#{ordinal}");
                assert_eq!(s.message_at_or_after(start), ordinal);
                assert!(s.is_message_boundary(start));
                assert!(!s.is_message_boundary(start + 1));
                let c = s.chunk_at(start).expect("chunk");
                assert!(c.start <= start && start < c.end());
            }
            assert_eq!(
                s.data_bytes(),
                tail - m.starts[first.min(m.starts.len() - 1)]
            );
        }
        let whole = shard
            .read(*id, off(m.retained), off(u64::MAX))
            .await
            .expect("read");
        assert_eq!(whole.concat(), &m.bytes[m.retained as usize..]);
        for k in 0..16u64 {
            let from = m.retained + (k * 7919) % (tail - m.retained);
            let to = (from + 1 + (k * 104_729) % 3000).min(tail);
            let got = shard.read(*id, off(from), off(to)).await.expect("read");
            assert_eq!(
                got.concat(),
                &m.bytes[from as usize..to as usize],
                "[{from}, {to})"
            );
        }
    }
}

fn index_files(dir: &Path) -> Vec<PathBuf> {
    let shard = dir.join("shard-0");
    let mut out: Vec<PathBuf> = index::list(&shard)
        .expect("list")
        .into_iter()
        .map(|seg| index::index_path(&shard, seg))
        .collect();
    out.sort();
    out
}

#[test]
fn sealed_pages_leave_memory_and_every_lookup_survives_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let mut models: Vec<(StreamId, Model)> = Vec::new();
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        for k in 0..3 {
            let (id, c) = shard.create(new_stream(&format!("s{k}"))).expect("create");
            c.durable().await.expect("durable");
            models.push((id, Model::default()));
        }
        let index_bytes = |shard: &Shard, models: &[(StreamId, Model)]| -> usize {
            models
                .iter()
                .map(|(id, _)| shard.state(*id).expect("s").index_heap_bytes())
                .sum()
        };
        fill(&shard, &mut models, 1500).await;
        assert!(shard.checkpoint().await.expect("checkpoint"));
        assert!(
            !index_files(dir.path()).is_empty(),
            "a roll wrote an index file"
        );
        let first = index_bytes(&shard, &models);
        fill(&shard, &mut models, 1500).await;
        assert!(shard.checkpoint().await.expect("checkpoint"));
        let second = index_bytes(&shard, &models);
        // Twice the history, hardly more memory: only each page's first entry stays. (The
        // unpacked newest entries' capacity, a quarter block to a block of each table,
        // depends on where in its block each stream stopped.)
        let unpacked = models.len()
            * crate::limits::PACKED_BLOCK_ENTRIES
            * (std::mem::size_of::<crate::stream::Chunk>() + std::mem::size_of::<Offset>());
        assert!(
            second < first + first / 4 + unpacked,
            "{first} then {second} bytes"
        );
        // What stays is bounded per stream: fewer than a page of blocks and the newest
        // entries.
        assert!(
            second < models.len() * 10_000,
            "{second} bytes for 3 streams"
        );
        check(&shard, &models).await;
        // Retention through written pages keeps the surviving ordinals.
        let (id, m) = &mut models[1];
        let offset = m.starts[1000];
        shard
            .retain(*id, off(offset))
            .expect("retain")
            .durable()
            .await
            .expect("durable");
        m.retained = offset;
        fill(&shard, &mut models, 300).await;
        check(&shard, &models).await;
        shard.halt().await.expect("halt");
    });
    // After a crash: the checkpoint's pages plus a replay of what followed it.
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("open");
        assert!(!report.checkpoint_lsn.is_none());
        check(&shard, &models).await;
        fill(&shard, &mut models, 300).await;
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("open");
        assert_eq!(report.records, 0, "a clean stop leaves nothing to replay");
        check(&shard, &models).await;
        shard.shutdown().await.expect("shutdown");
    });
    // A lost index file and a torn one are rebuilt from the segments' records.
    let files = index_files(dir.path());
    assert!(files.len() >= 2, "{files:?}");
    std::fs::remove_file(&files[0]).expect("remove");
    let torn = std::fs::read(&files[1]).expect("read");
    std::fs::write(&files[1], &torn[..torn.len() - 3]).expect("write");
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        check(&shard, &models).await;
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        check(&shard, &models).await;
    });
}

/// Copy a directory tree (the fixture is read-only input).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).expect("copy");
        }
    }
}

/// `storage/tests/fixtures/format1` was written by the engine before index files: one
/// segment, trimmed after its last record, and a format 1 checkpoint (every table inline).
/// It holds streams s0..s2 of JSON appends made as [`fill`] makes them, 500 rounds, then
/// s1 retained from its record 300 and a checkpoint, then 500 more rounds, then a crash.
#[test]
fn a_data_dir_from_before_index_files_opens_and_moves_to_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format1");
    copy_tree(&fixture, dir.path());
    let cfg = config(dir.path());
    let mut models: Vec<(StreamId, Model)> = Vec::new();
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("open");
        assert!(
            !report.checkpoint_lsn.is_none(),
            "the format 1 checkpoint is loaded"
        );
        assert!(report.records > 0, "and the log after it replayed");
        for k in 0..3 {
            let id = shard.lookup(&format!("s{k}")).expect("stream");
            models.push((id, Model::default()));
        }
        // Rebuild the model the fixture's writer followed, without touching the shard.
        for i in 0..1000 {
            for (k, (_, m)) in models.iter_mut().enumerate() {
                for j in 0..1 + i % 2 {
                    let r = format!(
                        "{{\"i\":{i},\"j\":{j},\"pad\":\"{}\"}}\n",
                        "x".repeat(i % 13)
                    );
                    m.starts.push(m.bytes.len() as u64);
                    m.bytes.extend_from_slice(r.as_bytes());
                }
                if i == 499 && k == 1 {
                    m.retained = m.starts[300];
                }
            }
        }
        check(&shard, &models).await;
        // New appends roll the log: the inline pages move to an index file.
        fill(&shard, &mut models, 1500).await;
        assert!(shard.checkpoint().await.expect("checkpoint"));
        assert!(!index_files(dir.path()).is_empty());
        check(&shard, &models).await;
        shard.halt().await.expect("halt");
    });
    let written =
        std::fs::read(dir.path().join("shard-0").join(checkpoint::FILE_NAME)).expect("checkpoint");
    assert_eq!(
        &written[12..16],
        &3u32.to_le_bytes(),
        "now the current format"
    );
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        check(&shard, &models).await;
        shard.shutdown().await.expect("shutdown");
    });
}

/// Pages do not wait for a roll: once `index::INDEX_FLUSH_BYTES` of them are completed, the
/// upkeep writes them to a new index file, numbered above every file before it, and a
/// restart (after a crash, or from a checkpoint that names them) still finds every record.
/// (The upkeep task runs meanwhile and may write some of the files itself.)
#[test]
fn pages_leave_memory_before_the_roll_in_files_whose_numbers_only_rise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    // Large enough that the log never rolls in this test.
    cfg.segment_bytes = 64 << 20;
    let mut models: Vec<(StreamId, Model)> = Vec::new();
    let numbers = |dir: &Path| index::list(&dir.join("shard-0")).expect("list");
    // Every file is numbered above those before it and at most the newest LSN.
    let written_after = |shard: &Shard, before: &[IndexFileNo]| -> Vec<IndexFileNo> {
        assert_eq!(shard.unwritten_page_bytes(), 0, "every page is in a file");
        assert!(!shard.index_due());
        let now = numbers(dir.path());
        let newest = before.last().copied().unwrap_or_default();
        let new: Vec<IndexFileNo> = now.iter().copied().filter(|&n| n > newest).collect();
        assert!(!new.is_empty(), "{now:?} after {before:?}");
        assert!(new.iter().all(|n| n.get() <= shard.last_lsn().get()));
        assert_eq!(
            shard.inner.index_files.borrow().newest(),
            *now.last().expect("a file")
        );
        now
    };
    let old = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        let first_segment = shard.write_segment();
        for k in 0..3 {
            let (id, c) = shard.create(new_stream(&format!("s{k}"))).expect("create");
            c.durable().await.expect("durable");
            models.push((id, Model::default()));
        }
        fill(&shard, &mut models, 1500).await;
        shard.flush_index().await.expect("flush");
        let first = written_after(&shard, &[]);
        check(&shard, &models).await;
        fill(&shard, &mut models, 1500).await;
        shard.flush_index().await.expect("flush");
        let second = written_after(&shard, &first);
        assert_eq!(shard.write_segment(), first_segment, "no roll");
        check(&shard, &models).await;
        shard.halt().await.expect("halt");
        second
    });
    // A crash before any checkpoint named them: the files are dropped and the replay
    // completes the pages again; new files are numbered above the old ones.
    let named = block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        assert!(numbers(dir.path()).is_empty(), "unnamed files are removed");
        check(&shard, &models).await;
        fill(&shard, &mut models, 300).await;
        shard.flush_index().await.expect("flush");
        written_after(&shard, &old);
        assert!(shard.checkpoint().await.expect("checkpoint"));
        check(&shard, &models).await;
        shard.halt().await.expect("halt");
        numbers(dir.path())
    });
    // The checkpoint names the files: they are kept and read, and the next one is above.
    block_on(async {
        let (shard, report) = Shard::open(cfg.clone()).await.expect("open");
        assert!(!report.checkpoint_lsn.is_none());
        assert_eq!(numbers(dir.path()), named);
        assert_eq!(
            shard.inner.index_files.borrow().newest(),
            *named.last().expect("a file")
        );
        check(&shard, &models).await;
        fill(&shard, &mut models, 1500).await;
        shard.flush_index().await.expect("flush");
        written_after(&shard, &named);
        check(&shard, &models).await;
        shard.shutdown().await.expect("shutdown");
    });
    block_on(async {
        let (shard, _) = Shard::open(cfg.clone()).await.expect("open");
        check(&shard, &models).await;
    });
}
