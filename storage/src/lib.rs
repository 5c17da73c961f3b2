//! Ursula's storage engine.
//!
//! One [`Shard`] per core owns a disjoint set of streams and one append-only log of
//! preallocated, direct-I/O segment files. Appends from many streams share each durable
//! (`O_DSYNC`) log write (group commit); an append is acknowledged only once durable. On
//! start the log is replayed, CRC-checked, and a torn or corrupt tail is cut off. See
//! `docs/architecture.md`.

pub mod aligned;
mod cache;
mod checkpoint;
pub mod cold;
mod error;
mod fault;
mod index;
pub mod limits;
mod packed;
pub mod placement;
mod position;
mod readback;
pub mod record;
pub mod segment;
pub mod shard;
mod slices;
pub mod stream;
mod view;
pub mod waiters;
pub mod wal;

pub use checkpoint::{
    summary as checkpoint_summary, CheckpointSummary, FILE_NAME as CHECKPOINT_FILE,
};
pub use error::{
    ArchiveLag, Corruption, FormatError, LogFailure, ShardFailure, StorageError, Unrecoverable,
};
pub use index::DEFAULT_INDEX_CACHE_BYTES;
pub use position::{Lsn, Offset, RecordNo, SegmentNo};
pub use record::{AppendRec, Lifetime, ProducerStamp, SnapshotMeta, StreamMeta};
pub use shard::{
    write_cold_marker, Changed, Commit, DiskUsage, Durability, HeapUsage, NewStream,
    RecoveryReport, S3WalSettings, S3WalStats, Shard, ShardConfig, ShardStats, COLD_MARKER,
    S3_PUT_SECONDS_BUCKETS,
};
pub use stream::{Chunk, DiskLoc, Piece, Producer, ProducerState, Receipt, Stream, StreamId};
pub use view::{StreamHead, StreamView};
pub use waiters::{WaiterIds, WaiterSet};

/// Wall-clock Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod test_support {
    use std::future::Future;

    /// Run `f` to completion on a fresh io_uring (or fallback) runtime with timers.
    pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f)
    }
}
