//! 4. Recovery.

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use ursula_storage::{Shard, StorageError};

use crate::{
    block_on, create_streams, data_rec, disk_config, mb_per_s, payload, size_label, BoxError,
    Scale, Table, Val, GIB, KIB, MIB,
};

struct RecoveryResult {
    write_secs: f64,
    written: u64,
    checkpoint_bytes: u64,
    report: ursula_storage::RecoveryReport,
}

/// How the shard stops before the measured reopen.
#[derive(Clone, Copy)]
enum Restart {
    /// No checkpoint at all: the whole log is replayed.
    FullReplay,
    /// A checkpoint `tail` bytes before the end, then a crash-like stop: the worst case a
    /// `checkpoint_bytes` setting of `tail` allows.
    CheckpointThenCrash { tail: u64 },
    /// A clean shutdown, which checkpoints at the head.
    Clean,
}

impl Restart {
    fn label(self) -> String {
        match self {
            Restart::FullReplay => "full replay".into(),
            Restart::CheckpointThenCrash { tail } => {
                format!("checkpoint + {} MiB", tail / MIB as u64)
            }
            Restart::Clean => "clean shutdown".into(),
        }
    }
}

async fn recovery_run(
    dir: &Path,
    total: u64,
    size: usize,
    (streams, writers): (usize, usize),
    restart: Restart,
) -> Result<RecoveryResult, BoxError> {
    let mut cfg = disk_config(dir, 64 << 20);
    cfg.checkpoint_bytes = u64::MAX; // checkpoints only where this benchmark takes them
    let checkpoint_at = match restart {
        Restart::CheckpointThenCrash { tail } => total.saturating_sub(tail),
        _ => u64::MAX,
    };
    let written = {
        let (shard, _) = Shard::open(cfg.clone()).await?;
        let ids = Rc::new(create_streams(&shard, "r", streams).await?);
        let data = payload(size, 3);
        let written = Rc::new(Cell::new(0u64));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (shard, ids, data, written) =
                (shard.clone(), ids.clone(), data.clone(), written.clone());
            tasks.push(monoio::spawn(async move {
                let mut i = w;
                while written.get() < checkpoint_at.min(total) {
                    written.set(written.get() + data.len() as u64);
                    let (_, c) = shard.append(ids[i % ids.len()], data_rec(data.clone()))?;
                    c.durable().await?;
                    i += writers;
                }
                Ok::<(), StorageError>(())
            }));
        }
        for t in tasks {
            t.await?;
        }
        if checkpoint_at < total {
            shard.checkpoint().await?;
            let data = payload(size, 4);
            let mut i = 0;
            while written.get() < total {
                let mut commits = Vec::new();
                for _ in 0..writers {
                    written.set(written.get() + data.len() as u64);
                    commits.push(shard.append(ids[i % ids.len()], data_rec(data.clone()))?.1);
                    i += 1;
                }
                for c in commits {
                    c.durable().await?;
                }
            }
        }
        match restart {
            Restart::Clean => shard.shutdown().await?,
            _ => shard.halt().await?,
        }
        (started.elapsed().as_secs_f64(), written.get())
    };
    let checkpoint_bytes = std::fs::metadata(dir.join("shard-0").join("checkpoint"))
        .map(|m| m.len())
        .unwrap_or(0);
    let (shard, report) = Shard::open(cfg).await?;
    shard.halt().await?;
    Ok(RecoveryResult {
        write_secs: written.0,
        written: written.1,
        checkpoint_bytes,
        report,
    })
}

pub(crate) fn section_recovery(scale: &Scale, root: &Path) -> Result<Table, BoxError> {
    let mut t = Table::new(
        "recovery",
        "4. Recovery: Shard::open after a crash-like stop or a clean shutdown",
        &[
            "record payload",
            "streams",
            "restart",
            "written MiB",
            "write MB/s",
            "checkpoint KiB",
            "records replayed",
            "log MiB replayed",
            "recovery s",
            "s per GiB written",
        ],
    );
    let restarts = [
        Restart::FullReplay,
        Restart::CheckpointThenCrash {
            tail: ursula_storage::shard::DEFAULT_CHECKPOINT_BYTES,
        },
        Restart::Clean,
    ];
    for &(size, streams, writers) in &[(4 * KIB, 1024, 256), (64 * KIB, 256, 64)] {
        for restart in restarts {
            let dir = tempfile::Builder::new()
                .prefix("ursula-bench-recovery-")
                .tempdir_in(root)?;
            let r = block_on(recovery_run(
                dir.path(),
                scale.recovery_bytes,
                size,
                (streams, writers),
                restart,
            ))??;
            let rep = &r.report;
            let secs = rep.elapsed.as_secs_f64();
            eprintln!(
                "  recovery {} {}: {} records in {secs:.2} s",
                size_label(size),
                restart.label(),
                rep.records
            );
            t.row(vec![
                Val::S(size_label(size)),
                Val::Int(streams as u64),
                Val::S(restart.label()),
                Val::F(r.written as f64 / MIB as f64, 0),
                Val::F(mb_per_s(r.written, r.write_secs), 1),
                Val::F(r.checkpoint_bytes as f64 / KIB as f64, 0),
                Val::Int(rep.records),
                Val::F(rep.log_bytes as f64 / MIB as f64, 0),
                Val::F(secs, 2),
                Val::F(secs / (r.written as f64 / GIB as f64), 2),
            ]);
            if rep.dropped_bytes != 0 || rep.orphan_segments != 0 {
                t.notes.push(format!(
                    "UNEXPECTED ({} {}): dropped_bytes={} orphan_segments={}",
                    size_label(size),
                    restart.label(),
                    rep.dropped_bytes,
                    rep.orphan_segments
                ));
            }
        }
    }
    t.notes.push(
        "Written by closed-loop writers (fsync'd acks) spread over the streams; the shard is \
         stopped, dropped and reopened with Shard::open in the same process. 'full replay' \
         has no checkpoint; 'checkpoint + N MiB' checkpoints N MiB before the end and stops \
         like a crash (the most a restart replays with checkpoint_bytes = N); 'clean \
         shutdown' checkpoints at the head. Segment reads use O_DIRECT, so the guest page \
         cache does not help; the host's may."
            .into(),
    );
    Ok(t)
}
