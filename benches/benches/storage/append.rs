//! 1. Engine appends with durable acks.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use ursula_storage::{Shard, StorageError, StreamId};

use crate::{
    block_on, create_streams, data_rec, disk_config, histogram, mb_per_s, ms, payload, size_label,
    BoxError, Scale, Table, Val, KIB, MIB,
};

pub(crate) struct AppendResult {
    pub(crate) ops: u64,
    pub(crate) bytes: u64,
    pub(crate) secs: f64,
    pub(crate) hist: Histogram<u64>,
    pub(crate) flushes: u64,
    pub(crate) records: u64,
    /// Appends refused with `Busy` (the write budget was full) and tried again.
    pub(crate) busy: u64,
}

impl AppendResult {
    pub(crate) fn per_sec(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// `writers` closed-loop writers, one stream each, on one shard.
pub(crate) async fn engine_appends(
    dir: &Path,
    writers: usize,
    size: usize,
    secs: f64,
) -> Result<AppendResult, BoxError> {
    let (shard, _) = Shard::open(disk_config(dir, 64 << 20)).await?;
    let ids = create_streams(&shard, "w", writers).await?;
    let before = shard.stats();
    let started = Instant::now();
    let writers = ids.into_iter().map(|id| (shard.clone(), id)).collect();
    let tally = closed_loop(
        writers,
        payload(size, 7),
        started + Duration::from_secs_f64(secs),
    )
    .await?;
    let elapsed = started.elapsed().as_secs_f64();
    let after = shard.stats();
    shard.shutdown().await?;
    Ok(AppendResult {
        ops: tally.ops,
        bytes: tally.ops * size as u64,
        secs: elapsed,
        hist: tally.hist,
        flushes: after.flushes - before.flushes,
        records: after.records_flushed - before.records_flushed,
        busy: tally.busy,
    })
}

/// What a run of closed-loop writers did together.
pub(crate) struct Tally {
    /// Acknowledgement latency of every durable append, in microseconds.
    pub(crate) hist: Histogram<u64>,
    /// Appends acknowledged durable.
    pub(crate) ops: u64,
    /// Appends refused with `Busy` (the write budget was full) and tried again.
    pub(crate) busy: u64,
}

/// One closed-loop writer per (shard, stream) until `deadline`, each append of `data`
/// waiting for `durable()`. An append refused because the write budget is full is tried
/// again after 1 ms, as a client does after a 503.
pub(crate) async fn closed_loop(
    writers: Vec<(Shard, StreamId)>,
    data: Bytes,
    deadline: Instant,
) -> Result<Tally, StorageError> {
    let hist = Rc::new(RefCell::new(histogram()));
    let ops = Rc::new(Cell::new(0u64));
    let busy = Rc::new(Cell::new(0u64));
    let mut tasks = Vec::with_capacity(writers.len());
    for (shard, id) in writers {
        let (data, hist, ops, busy) = (data.clone(), hist.clone(), ops.clone(), busy.clone());
        tasks.push(monoio::spawn(async move {
            while Instant::now() < deadline {
                let t = Instant::now();
                let commit = match shard.append(id, data_rec(data.clone())) {
                    Ok((_, commit)) => commit,
                    Err(StorageError::Busy) => {
                        busy.set(busy.get() + 1);
                        monoio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                commit.durable().await?;
                let _ = hist
                    .borrow_mut()
                    .record(t.elapsed().as_micros().max(1) as u64);
                ops.set(ops.get() + 1);
            }
            Ok::<(), StorageError>(())
        }));
    }
    for t in tasks {
        t.await?;
    }
    let hist = hist.borrow().clone();
    Ok(Tally {
        hist,
        ops: ops.get(),
        busy: busy.get(),
    })
}

pub(crate) fn section_append(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "append",
        format!(
            "1. Engine append throughput, one shard, durable acks ({} s closed loop per case)",
            scale.append_secs
        ),
        &[
            "payload",
            "writers",
            "appends/s",
            "MB/s",
            "ack p50 ms",
            "ack p99 ms",
            "ack max ms",
            "commits/s",
            "appends/commit",
            "busy retries",
        ],
    );
    for &size in &[256, 4 * KIB, MIB] {
        for &writers in &[1, 16, 256] {
            let dir = tempfile::Builder::new()
                .prefix("ursula-bench-append-")
                .tempdir_in(root)?;
            let r = block_on(engine_appends(dir.path(), writers, size, scale.append_secs))??;
            eprintln!(
                "  append {} x{writers}: {:.0}/s",
                size_label(size),
                r.per_sec()
            );
            t.row(vec![
                Val::S(size_label(size)),
                Val::Int(writers as u64),
                Val::F(r.per_sec(), 0),
                Val::F(mb_per_s(r.bytes, r.secs), 1),
                Val::F(ms(r.hist.value_at_quantile(0.5)), 2),
                Val::F(ms(r.hist.value_at_quantile(0.99)), 2),
                Val::F(ms(r.hist.max()), 1),
                Val::F(r.flushes as f64 / r.secs, 0),
                Val::F(r.records as f64 / r.flushes.max(1) as f64, 1),
                Val::Int(r.busy),
            ]);
        }
    }
    t.notes.push(
        "MB/s counts payload bytes (10^6 B). appends/commit = records_flushed / flushes from \
         Shard::stats() (a commit is one O_DSYNC write per segment touched). Busy retries: \
         appends refused while the write budget was full, tried again 1 ms later."
            .into(),
    );
    Ok(t)
}
