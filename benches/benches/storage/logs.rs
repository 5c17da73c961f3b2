//! Section 7, several logs on one core: what a core pays for splitting its streams over
//! more shards (one log each), as it would if each lane of a cluster were a log of its own.

use std::path::Path;
use std::time::{Duration, Instant};

use ursula_storage::{Durability, Shard, ShardConfig};

use crate::append::closed_loop;
use crate::{block_on, create_streams, ms, payload, BoxError, Scale, Table, Val, MIB};

/// Writers (one stream each), spread round-robin over the logs.
const WRITERS: usize = 256;
const PAYLOAD: usize = 256;
/// The core's read cache, split evenly over its logs (the server's default per core), as
/// is its index cache.
const CACHE_BYTES: usize = 256 * MIB;
/// Small segments, so that 64 logs preallocate 2 GiB rather than 16 (each log keeps its
/// segment and a zero-filled spare); the same for every case.
const SEGMENT_BYTES: u64 = 16 * MIB as u64;

pub(crate) fn section_logs(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "logs",
        format!(
            "7. Logs per core: {WRITERS} writers of {PAYLOAD} B over 1 to 64 shards on one \
             thread, durable acks ({} s closed loop per case)",
            scale.append_secs
        ),
        &[
            "logs",
            "appends/s",
            "vs 1 log",
            "ack p50 ms",
            "ack p99 ms",
            "commits/s",
            "appends/commit",
            "write buffers MiB",
            "index cache MiB",
            "other heap MiB",
        ],
    );
    let mut one_log = None;
    // 1 again last: how far the host drifted during the section.
    for logs in [1, 4, 16, 64, 1] {
        let dir = tempfile::Builder::new()
            .prefix("ursula-bench-logs-")
            .tempdir_in(root)?;
        let r = block_on(many_logs(dir.path(), logs, scale.append_secs))??;
        let rate = r.ops as f64 / r.secs;
        let base = *one_log.get_or_insert(rate);
        eprintln!("  logs x{logs}: {rate:.0}/s");
        t.row(vec![
            Val::Int(logs as u64),
            Val::F(rate, 0),
            Val::F(rate / base, 2),
            Val::F(ms(r.hist.value_at_quantile(0.5)), 2),
            Val::F(ms(r.hist.value_at_quantile(0.99)), 2),
            Val::F(r.commits as f64 / r.secs, 0),
            Val::F(r.records as f64 / r.commits.max(1) as f64, 1),
            Val::F(r.write_buffers as f64 / MIB as f64, 1),
            Val::F(r.index_cache as f64 / MIB as f64, 1),
            Val::F(r.other_heap as f64 / MIB as f64, 1),
        ]);
    }
    t.notes.push(format!(
        "Each case opens its logs on one monoio thread (as a core would), {} MiB segments, \
         the core's {} MiB read cache and 8 MiB index cache split evenly. Heap at the end of the run, all logs together \
         (`Shard::heap_usage`): the write buffers (batches being filled or flushed and the \
         pool kept for reuse), the index page cache, and everything else but the read cache. commits/s counts \
         every log's commits (one O_DSYNC write per segment touched).",
        SEGMENT_BYTES >> 20,
        CACHE_BYTES >> 20
    ));
    Ok(t)
}

struct LogsResult {
    ops: u64,
    secs: f64,
    hist: hdrhistogram::Histogram<u64>,
    commits: u64,
    records: u64,
    write_buffers: usize,
    index_cache: usize,
    other_heap: usize,
}

async fn many_logs(dir: &Path, logs: usize, secs: f64) -> Result<LogsResult, BoxError> {
    let mut shards = Vec::with_capacity(logs);
    for index in 0..logs {
        let mut cfg = ShardConfig::new(index as u32, Durability::Disk(dir.to_path_buf()));
        cfg.cache_bytes = CACHE_BYTES / logs;
        cfg.index_cache_bytes = ursula_storage::DEFAULT_INDEX_CACHE_BYTES / logs;
        cfg.segment_bytes = SEGMENT_BYTES;
        shards.push(Shard::open(cfg).await?.0);
    }
    let mut writers = Vec::with_capacity(WRITERS);
    for (index, shard) in shards.iter().enumerate() {
        let mine = WRITERS / logs + usize::from(index < WRITERS % logs);
        for id in create_streams(shard, &format!("l{index}"), mine).await? {
            writers.push((shard.clone(), id));
        }
    }
    let before: Vec<_> = shards.iter().map(Shard::stats).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let tally = closed_loop(writers, payload(PAYLOAD, 7), deadline).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let (mut commits, mut records) = (0, 0);
    let (mut write_buffers, mut index_cache, mut other_heap) = (0, 0, 0);
    for (shard, b) in shards.iter().zip(before) {
        let a = shard.stats();
        commits += a.flushes - b.flushes;
        records += a.records_flushed - b.records_flushed;
        let heap = shard.heap_usage();
        write_buffers += heap.write_buffers;
        index_cache += heap.index_cache;
        other_heap += heap
            .components()
            .iter()
            .filter(|(name, _)| !matches!(*name, "write_buffers" | "index_cache" | "read_cache"))
            .map(|(_, bytes)| bytes)
            .sum::<usize>();
    }
    for shard in shards {
        shard.shutdown().await?;
    }
    Ok(LogsResult {
        ops: tally.ops,
        secs: elapsed,
        hist: tally.hist,
        commits,
        records,
        write_buffers,
        index_cache,
        other_heap,
    })
}
