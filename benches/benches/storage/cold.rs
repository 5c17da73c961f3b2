//! 6. The cold tier: eviction beside appends, and reads of evicted segments.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use ursula_storage::cold::{ColdRead, ColdStore};
use ursula_storage::{segment, Offset, Shard, ShardConfig, StorageError};

use crate::{
    block_on, cpu_secs, create_streams, data_rec, disk_config, histogram, mb_per_s, ms, payload,
    BoxError, Scale, Table, Val, KIB, MIB,
};

/// A cold tier in a local directory, standing in for S3: each request waits a fixed delay
/// (S3's time to first byte), then reads its range of the copied segment (in the page
/// cache: the copy was just written, so this measures the engine, not a disk).
#[derive(Debug)]
struct DirColdStore {
    dir: PathBuf,
    /// Delay per request, in microseconds.
    latency_us: AtomicU64,
}

impl ColdStore for DirColdStore {
    fn is_archived(&self, _shard: u32, segment: ursula_storage::SegmentNo) -> bool {
        segment::segment_path(&self.dir, segment).exists()
    }

    fn read(
        &self,
        _shard: u32,
        segment: ursula_storage::SegmentNo,
        offset: u64,
        len: usize,
    ) -> ColdRead {
        let path = segment::segment_path(&self.dir, segment);
        let latency = Duration::from_micros(self.latency_us.load(Ordering::Relaxed));
        Box::pin(async move {
            if !latency.is_zero() {
                monoio::time::sleep(latency).await;
            }
            segment::read_up_to(&path, offset, len).map(Bytes::from)
        })
    }
}

/// Copy the sealed segments of `shard_dir` (every file but the newest) not yet in `store`,
/// as the archiver would; returns how many.
fn archive_sealed(shard_dir: &Path, store: &Path) -> std::io::Result<usize> {
    let mut segs = segment::list_segments(shard_dir)?;
    segs.pop();
    let mut copied = 0;
    for seg in segs {
        let to = segment::segment_path(store, seg);
        if to.exists() {
            continue;
        }
        let tmp = to.with_extension("tmp");
        match std::fs::copy(segment::segment_path(shard_dir, seg), &tmp) {
            Ok(_) => std::fs::rename(&tmp, &to)?,
            // Evicted meanwhile (only archived ones are), or cleaned.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        copied += 1;
    }
    Ok(copied)
}

/// The archiver's disk traffic without S3: a thread copying sealed segments every 50 ms.
fn spawn_archiver(
    shard_dir: PathBuf,
    store: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<std::io::Result<usize>> {
    std::thread::spawn(move || {
        let mut copied = 0;
        while !stop.load(Ordering::Relaxed) {
            copied += archive_sealed(&shard_dir, &store)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(copied)
    })
}

const COLD_STREAMS: usize = 16;
const COLD_APPEND: usize = 64 * KIB;
const COLD_WRITERS: usize = 64;

fn cold_config(dir: &Path, store: &Arc<DirColdStore>, local_bytes: Option<u64>) -> ShardConfig {
    let mut cfg = disk_config(dir, 0);
    cfg.segment_bytes = 0; // the minimum, so a run rolls and evicts many times
    cfg.cold = Some(store.clone());
    cfg.local_bytes = local_bytes;
    cfg
}

struct ColdWrite {
    bytes: u64,
    secs: f64,
    hist: Histogram<u64>,
    cpu_secs: f64,
    evicted: u64,
    unarchived: usize,
    max_local: u64,
    segment_bytes: u64,
}

/// Closed-loop 64 KiB appends over 16 streams until `bytes` are written, with the archiver
/// copying sealed segments; the shard evicts them if it has a local budget.
async fn cold_write(
    dir: &Path,
    store: &Arc<DirColdStore>,
    local_bytes: Option<u64>,
    bytes: u64,
) -> Result<ColdWrite, BoxError> {
    let (shard, _) = Shard::open(cold_config(dir, store, local_bytes)).await?;
    let ids = create_streams(&shard, "cold", COLD_STREAMS).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let archiver = spawn_archiver(dir.join("shard-0"), store.dir.clone(), stop.clone());
    let data = payload(COLD_APPEND, 9);
    let hist = Rc::new(RefCell::new(histogram()));
    let written = Rc::new(Cell::new(0u64));
    let max_local = Rc::new(Cell::new(0u64));
    let (t0, c0) = (Instant::now(), cpu_secs());
    let mut tasks = Vec::new();
    for w in 0..COLD_WRITERS {
        let (shard, data, hist, written, max_local) = (
            shard.clone(),
            data.clone(),
            hist.clone(),
            written.clone(),
            max_local.clone(),
        );
        let id = ids[w % ids.len()];
        tasks.push(monoio::spawn(async move {
            while written.get() < bytes {
                let t = Instant::now();
                let (_, c) = shard.append(id, data_rec(data.clone()))?;
                c.durable().await?;
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                written.set(written.get() + data.len() as u64);
                max_local.set(max_local.get().max(shard.stats().local_segment_bytes));
            }
            Ok::<(), StorageError>(())
        }));
    }
    for t in tasks {
        t.await?;
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
    let stats = shard.stats();
    let segment_bytes = shard.disk_usage().segment_bytes / shard.disk_usage().segments as u64;
    // Sealed segments the stand-in archiver had not copied yet when the writers finished:
    // they cannot leave, so they are what keeps the local files over the budget.
    let mut sealed = segment::list_segments(&dir.join("shard-0"))?;
    sealed.pop();
    let unarchived = sealed
        .iter()
        .filter(|&&s| !segment::segment_path(&store.dir, s).exists())
        .count();
    shard.shutdown().await?;
    stop.store(true, Ordering::Relaxed);
    archiver.join().map_err(|_| "archiver panicked")??;
    let hist = hist.borrow().clone();
    Ok(ColdWrite {
        bytes: written.get(),
        secs,
        hist,
        cpu_secs: cpu,
        evicted: stats.evicted_segments,
        unarchived,
        max_local: max_local.get(),
        segment_bytes,
    })
}

struct ColdReadRow {
    source: String,
    readers: usize,
    bytes: u64,
    secs: f64,
    hist: Histogram<u64>,
    cpu_secs: f64,
    fetched: u64,
    fetches: u64,
}

/// `readers` streams read at once, each from offset 0 in 1 MiB ranges to its tail (or its
/// first `limit` bytes); every range read's latency is recorded.
async fn cold_reads(
    shard: &Shard,
    readers: usize,
    limit: u64,
    source: String,
) -> Result<ColdReadRow, BoxError> {
    let before = shard.stats();
    let hist = Rc::new(RefCell::new(histogram()));
    let (t0, c0) = (Instant::now(), cpu_secs());
    let mut tasks = Vec::new();
    for r in 0..readers {
        let (shard, hist) = (shard.clone(), hist.clone());
        let key = format!("bench/cold-{r:06}");
        tasks.push(monoio::spawn(async move {
            let id = shard.lookup(&key).ok_or("stream missing")?;
            let tail = shard
                .stream(id)
                .map_or(Offset::ZERO, |s| s.next_offset())
                .min(Offset::ZERO + limit);
            let (mut from, mut bytes) = (Offset::ZERO, 0u64);
            let mut out = Vec::with_capacity(MIB);
            while from < tail {
                let t = Instant::now();
                let pieces = shard.read(id, from, (from + MIB as u64).min(tail)).await?;
                out.clear();
                for p in &pieces {
                    out.extend_from_slice(p);
                }
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                if out.is_empty() {
                    return Err(format!("read of {key} at {from} returned nothing").into());
                }
                from += out.len() as u64;
                bytes += out.len() as u64;
            }
            Ok::<u64, BoxError>(bytes)
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await?;
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
    let after = shard.stats();
    let hist = hist.borrow().clone();
    Ok(ColdReadRow {
        source,
        readers,
        bytes,
        secs,
        hist,
        cpu_secs: cpu,
        fetched: after.cold_read_bytes - before.cold_read_bytes,
        fetches: after.cold_reads - before.cold_reads,
    })
}

pub(crate) fn section_cold(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "cold",
        format!(
            "6. Cold tier: {} MiB of 64 KiB appends over {COLD_STREAMS} streams per run, then \
             reads in 1 MiB ranges",
            scale.cold_bytes >> 20
        ),
        &[
            "case",
            "readers",
            "MiB",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "CPU us/MiB",
            "evicted / fetched MiB",
        ],
    );
    let kept = cold_appends(scale, root, &mut t)?;
    let mut rows = Vec::new();
    for (evict, dir, store) in &kept {
        let data = dir.path().join("data");
        if *evict {
            rows.extend(reads_of_cold_segments(&data, store)?);
        } else {
            rows.extend(reads_of_local_data(&data, store)?);
        }
    }
    for r in rows {
        eprintln!(
            "  read {} x{}: {:.0} MB/s",
            r.source,
            r.readers,
            mb_per_s(r.bytes, r.secs)
        );
        t.row(r.row());
    }
    t.notes.push(
        "Appends: 64 closed-loop writers (fsync'd acks), the same sizes with and without a \
         local budget, alternating, while a thread copies sealed segments into the stand-in \
         cold tier every 50 ms (the archiver's disk reads, without S3). Reads: each reader \
         reads its stream from offset 0 to the tail in 1 MiB ranges; latency is per range \
         read. The streams are interleaved in the log (64 KiB appends in turn), so a cold \
         read of one stream fetches whole 1 MiB blocks that mostly hold the other streams: \
         'fetched MiB' against 'MiB' is that amplification; readers of all streams at once \
         share the blocks. The cold tier stand-in waits the stated time per request, then \
         reads the page-cached copy on the core's thread. CPU is the whole process's."
            .into(),
    );
    Ok(t)
}

/// A cold-tier append run kept for the reads: whether it evicted, its data dir, its store.
type KeptRun = (bool, tempfile::TempDir, Arc<DirColdStore>);

/// Appends with and without eviction, alternating, each in a fresh data dir, one table row
/// each; returns the last data dir of each kind, kept for the reads.
fn cold_appends(scale: &Scale, root: &Path, t: &mut Table) -> Result<Vec<KeptRun>, BoxError> {
    let mut kept: Vec<KeptRun> = Vec::new();
    let mut segment_bytes = 0;
    for round in 0..2 {
        for evict in [false, true] {
            let dir = tempfile::Builder::new()
                .prefix("ursula-bench-cold-")
                .tempdir_in(root)?;
            let store = Arc::new(DirColdStore {
                dir: dir.path().join("cold"),
                latency_us: AtomicU64::new(0),
            });
            std::fs::create_dir_all(&store.dir)?;
            let data = dir.path().join("data");
            // Two segments' worth once the first run has shown the segment size.
            let budget = evict.then_some(2 * segment_bytes.max(64 << 20));
            let w = block_on(cold_write(&data, &store, budget, scale.cold_bytes))??;
            segment_bytes = w.segment_bytes;
            let label = match budget {
                Some(b) => format!("append, local_bytes {} MiB (evicting)", b >> 20),
                None => "append, no local budget".to_string(),
            };
            eprintln!(
                "  cold {label} round {round}: {:.0} MB/s",
                mb_per_s(w.bytes, w.secs)
            );
            t.row(vec![
                Val::S(format!("{label}, round {}", round + 1)),
                Val::Int(COLD_WRITERS as u64),
                Val::F(w.bytes as f64 / MIB as f64, 0),
                Val::F(mb_per_s(w.bytes, w.secs), 0),
                Val::F(ms(w.hist.value_at_quantile(0.5)), 2),
                Val::F(ms(w.hist.value_at_quantile(0.99)), 2),
                Val::F(w.cpu_secs * 1e6 / (w.bytes as f64 / MIB as f64), 0),
                Val::S(if evict {
                    format!(
                        "{} segments; local files peaked at {} MiB; {} unarchived at the end",
                        w.evicted,
                        w.max_local >> 20,
                        w.unarchived
                    )
                } else {
                    "-".into()
                }),
            ]);
            if round == 1 {
                kept.push((evict, dir, store));
            }
        }
    }
    Ok(kept)
}

/// Reads of data on the local disk: from memory (the second of two passes with a large
/// cache), and from the disk (cache_bytes 0, so every range is read with O_DIRECT).
fn reads_of_local_data(
    data: &Path,
    store: &Arc<DirColdStore>,
) -> Result<Vec<ColdReadRow>, BoxError> {
    let mut rows = Vec::new();
    block_on(async {
        let mut cfg = cold_config(data, store, None);
        cfg.cache_bytes = 4 << 30;
        let (shard, _) = Shard::open(cfg).await?;
        cold_reads(&shard, COLD_STREAMS, u64::MAX, "warm-up".into()).await?;
        rows.push(cold_reads(&shard, 1, u64::MAX, "memory (stream cache)".into()).await?);
        rows.push(
            cold_reads(
                &shard,
                COLD_STREAMS,
                u64::MAX,
                "memory (stream cache)".into(),
            )
            .await?,
        );
        shard.shutdown().await?;
        let (shard, _) = Shard::open(cold_config(data, store, None)).await?;
        rows.push(cold_reads(&shard, 1, u64::MAX, "local disk".into()).await?);
        rows.push(cold_reads(&shard, COLD_STREAMS, u64::MAX, "local disk".into()).await?);
        shard.shutdown().await?;
        Ok::<(), BoxError>(())
    })??;
    Ok(rows)
}

/// Reads once everything sealed has gone cold (archived, then a local budget of nothing),
/// at two latencies of the cold tier stand-in.
fn reads_of_cold_segments(
    data: &Path,
    store: &Arc<DirColdStore>,
) -> Result<Vec<ColdReadRow>, BoxError> {
    let mut rows = Vec::new();
    archive_sealed(&data.join("shard-0"), &store.dir)?;
    for latency_ms in [0u64, 20] {
        store.latency_us.store(latency_ms * 1000, Ordering::Relaxed);
        block_on(async {
            let (shard, _) = Shard::open(cold_config(data, store, Some(0))).await?;
            shard.evict_archived().await?;
            let cold = shard.stats().cold_segments;
            let label = |what: &str| format!("cold, {latency_ms} ms/request{what}");
            rows.push(cold_reads(&shard, 1, u64::MAX, label("")).await?);
            rows.push(cold_reads(&shard, COLD_STREAMS, u64::MAX, label("")).await?);
            // The first 512 KiB of each stream twice: the second pass hits the cold
            // cache (their blocks, and those read ahead, fit in its 64 MiB).
            let hot = 512 * KIB as u64;
            cold_reads(&shard, COLD_STREAMS, hot, "fill".into()).await?;
            rows.push(
                cold_reads(
                    &shard,
                    COLD_STREAMS,
                    hot,
                    label(", again from the cold cache"),
                )
                .await?,
            );
            eprintln!("  cold reads at {latency_ms} ms: {cold} cold segments");
            shard.shutdown().await?;
            Ok::<(), BoxError>(())
        })??;
    }
    Ok(rows)
}

impl ColdReadRow {
    /// The row of the cold-tier table.
    fn row(&self) -> Vec<Val> {
        vec![
            Val::S(self.source.clone()),
            Val::Int(self.readers as u64),
            Val::F(self.bytes as f64 / MIB as f64, 0),
            Val::F(mb_per_s(self.bytes, self.secs), 0),
            Val::F(ms(self.hist.value_at_quantile(0.5)), 2),
            Val::F(ms(self.hist.value_at_quantile(0.99)), 2),
            Val::F(self.cpu_secs * 1e6 / (self.bytes as f64 / MIB as f64), 0),
            Val::S(if self.fetches > 0 {
                format!("{} MiB in {} fetches", self.fetched >> 20, self.fetches)
            } else {
                "-".into()
            }),
        ]
    }
}
