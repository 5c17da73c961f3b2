//! A shard: the streams one core owns, and the log that makes their changes durable.
//!
//! ```text
//!  request task ──create/append/delete──▶ head state (Stream)      (synchronous, in order)
//!        │                                 │
//!        │                                 └─ record encoded into the open batch buffer
//!        ▼                                                    │
//!  Commit::durable().await ◀── wake ── flusher task ◀─────────┘
//!                                       write_all_at (O_DIRECT | O_DSYNC, 4 KiB-aligned)
//!                                       visible watermarks advance, readers woken
//! ```
//!
//! While one flush is in flight every new record goes into the next batch, so a single
//! durable write covers everything that arrived during the previous one (group commit). All
//! of a shard lives on one thread: `Rc`/`RefCell`, no locks. Callers must not hold a `Ref`
//! from [`Shard::stream`] across a call that mutates the shard.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::{Corruption, ShardFailure, StorageError};
use crate::index;
use crate::position::{Lsn, SegmentNo};
use crate::record::{AppendRec, StreamMeta};
use crate::segment::{self, DATA_START};
use crate::stream::{Stream, StreamId};
use crate::waiters::WaiterIds;

mod blobs;
mod cache_budget;
mod catalog;
mod changes;
mod checkpoint_ledger;
mod checkpointing;
mod cleaner;
#[cfg(test)]
mod cold_tests;
mod cold_tier;
mod commit;
mod dormancy;
#[cfg(test)]
mod dormancy_tests;
mod group_commit;
mod index_files;
#[cfg(test)]
mod index_tests;
#[cfg(test)]
mod model_tests;
mod parted_map;
mod read;
mod recovery;
mod s3_wal;
#[cfg(test)]
mod s3_wal_tests;
mod segment_map;
#[cfg(test)]
mod tests;
mod upkeep;
mod writer;

pub use crate::limits::COLD_BLOCK_BYTES;
use blobs::Blobs;
use cache_budget::CacheBudget;
use catalog::Catalog;
pub(crate) use catalog::Dormant;
use checkpoint_ledger::CheckpointLedger;
pub use cleaner::DiskUsage;
pub use cold_tier::{
    write_cold_marker, COLD_MARKER, DEFAULT_COLD_CACHE_BYTES, DEFAULT_COLD_IN_FLIGHT_BYTES,
};
pub use commit::Commit;
use group_commit::GroupCommit;
use index_files::IndexFiles;
pub use s3_wal::{S3WalSettings, S3WalStats, PUT_SECONDS_BUCKETS as S3_PUT_SECONDS_BUCKETS};
use segment_map::SegmentMap;
use writer::LogWriter;

/// Maps looked up on every append (several times each): foldhash instead of std's SipHash,
/// which took ~7% of an append's user-space instructions. Seeds are random per map, so
/// stream keys chosen by clients still cannot be aimed at one bucket.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// Where a shard keeps its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Segment files under this directory; acknowledged once the log write is durable.
    Disk(PathBuf),
    /// Process memory only: acknowledged at once, lost on exit.
    Memory,
}

#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub shard: u32,
    pub durability: Durability,
    /// The first stream id this shard hands out (see `Placement::first_id`).
    pub first_id: StreamId,
    /// Size of each preallocated segment file.
    pub segment_bytes: u64,
    /// Producer receipts kept per (stream, producer).
    pub receipt_window: usize,
    /// Stream bytes kept in memory for reads; older durable data is read from disk.
    pub cache_bytes: usize,
    /// Framed bytes of appends and creates that may wait for their flush; more are refused
    /// with [`StorageError::Busy`] instead of growing the write queue without bound.
    pub write_budget_bytes: usize,
    /// Log bytes written after which the next upkeep round writes a checkpoint; bounds
    /// how much log a restart replays. The interval also grows to
    /// [`CHECKPOINT_LOG_RATIO`] times the last checkpoint's size, so a large index does not
    /// spend the disk and the core rewriting itself.
    pub checkpoint_bytes: u64,
    /// Fault injection for tests: the flush after this many successful ones fails as if
    /// its durable write had returned EIO (its data was written, its durability is unknown).
    pub fail_commit_after: Option<u64>,
    /// A segment that took at least this long to fill is followed by a zero-filled spare
    /// (see `segment::prepare_spare`). Zeroing writes every segment a second time, which a
    /// log filling near the disk's bandwidth cannot afford; the default, 2 s, means below
    /// 64 MB/s per shard at 128 MiB segments. `Duration::MAX` turns spares off.
    pub spare_fill_time: Duration,
    /// Zeros are written just ahead of the records (see `LogWriter::zero_ahead`) while the log
    /// fills slower than this many bytes per second; 0 turns that off. Like spares, zeroing
    /// writes every block twice, so the default, 64 MB/s, is a small share of a disk.
    pub zero_ahead_below: u64,
    /// Bytes of index pages (sealed parts of chunk tables and record indexes, read from
    /// their index files) each core keeps cached.
    pub index_cache_bytes: usize,
    /// The cold tier this shard's sealed segments are archived to, if any.
    pub cold: Option<std::sync::Arc<dyn crate::cold::ColdStore>>,
    /// Bytes of segment files this shard keeps on the local disk when it has a cold tier;
    /// archived sealed segments beyond it are read from the cold tier instead.
    pub local_bytes: Option<u64>,
    /// Bytes of blocks fetched from the cold tier each shard keeps in memory.
    pub cold_cache_bytes: usize,
    /// Bytes of cold-tier fetches a shard has in flight at once: what keeps catch-up
    /// readers of cold data from taking the network and the core from appends.
    pub cold_in_flight_bytes: usize,
    /// A stream unused this long goes dormant: its state is saved to an index file and
    /// leaves memory until it is used again (see `dormancy`). `Duration::MAX` keeps every
    /// stream resident.
    pub idle_after: Duration,
    /// Streams whose server-owned state (`ext`) this says yes to never go dormant: what
    /// the server must see of them without waking them (a stream deleted while forks still
    /// read it is hidden from listings, which count dormant streams without waking them).
    pub stays_resident: fn(&[u8]) -> bool,
    /// Acknowledge a change only once it is also in S3, through the cold tier's WAL
    /// objects (`--durability s3`; needs `cold`). `None`: once durable on the local disk.
    pub s3_wal: Option<S3WalSettings>,
    /// Lets tests stand in for a small disk: creating a segment file while this many exist
    /// fails as a full disk does.
    pub(crate) disk_segments: Option<usize>,
    /// Lets tests roll the log every few KiB (below [`MIN_SEGMENT_BYTES`]); records that do
    /// not fit are refused as too large.
    pub(crate) tiny_segments: bool,
}

impl ShardConfig {
    pub fn new(shard: u32, durability: Durability) -> ShardConfig {
        ShardConfig {
            shard,
            durability,
            first_id: 1,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            receipt_window: 256,
            cache_bytes: DEFAULT_CACHE_BYTES,
            write_budget_bytes: DEFAULT_WRITE_BUDGET_BYTES,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            fail_commit_after: None,
            spare_fill_time: Duration::from_secs(2),
            zero_ahead_below: 64_000_000,
            index_cache_bytes: crate::index::DEFAULT_INDEX_CACHE_BYTES,
            cold: None,
            local_bytes: None,
            cold_cache_bytes: DEFAULT_COLD_CACHE_BYTES,
            cold_in_flight_bytes: DEFAULT_COLD_IN_FLIGHT_BYTES,
            idle_after: DEFAULT_IDLE_AFTER,
            stays_resident: |_| false,
            s3_wal: None,
            disk_segments: None,
            tiny_segments: false,
        }
    }
}

pub const DEFAULT_SEGMENT_BYTES: u64 = 128 << 20;
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;
pub const DEFAULT_WRITE_BUDGET_BYTES: usize = 256 << 20;
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(60);
/// Least log bytes between checkpoints, as a multiple of the last checkpoint's size.
pub const CHECKPOINT_LOG_RATIO: u64 = 4;
/// A segment must hold the largest record.
pub const MIN_SEGMENT_BYTES: u64 =
    (crate::record::MAX_PAYLOAD + crate::record::FRAME_HEADER) as u64 + 2 * DATA_START;

/// What recovery found.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    pub records: u64,
    pub log_bytes: u64,
    pub streams: usize,
    /// Bytes after the last valid record that were discarded (torn or corrupt tail).
    pub dropped_bytes: u64,
    /// Segments deleted because they only held records after a break in the log.
    pub orphan_segments: usize,
    /// LSN of the checkpoint recovery started from (0: none, the whole log was replayed).
    pub checkpoint_lsn: Lsn,
    pub elapsed: Duration,
}

/// Counters for benchmarks and metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShardStats {
    pub flushes: u64,
    pub records_flushed: u64,
    pub bytes_flushed: u64,
    /// Group commits' durable writes (data and disk flush, `O_DSYNC`), their summed
    /// duration, and how many took at most each bound of [`COMMIT_WRITE_BUCKETS_US`] (not
    /// cumulative; the last slot counts the slower ones).
    pub commit_writes: u64,
    pub commit_write_nanos: u64,
    pub commit_write_buckets: [u64; COMMIT_WRITE_BUCKETS_US.len() + 1],
    /// Group commits by the bytes each wrote: how many wrote at most each bound of
    /// [`COMMIT_BYTES_BUCKETS`] (not cumulative; the last slot counts the larger ones).
    /// Their count is `flushes`, their sum `bytes_flushed`.
    pub commit_bytes_buckets: [u64; COMMIT_BYTES_BUCKETS.len() + 1],
    /// Bytes reads returned from the read cache, and those they had to fetch (from the
    /// local log or the cold tier).
    pub read_cache_hit_bytes: u64,
    pub read_cache_miss_bytes: u64,
    /// Direct-I/O reads of evicted data for readers, and the bytes they transferred
    /// (neighbouring records share a read; see `readback`).
    pub disk_reads: u64,
    pub disk_read_bytes: u64,
    /// Segments that began as a zero-filled spare (see `segment::prepare_spare`).
    pub spare_segments: u64,
    /// Zeros written ahead of the records in slowly filling segments (see `LogWriter::zero_ahead`).
    pub zeroed_ahead_bytes: u64,
    /// Fetches from the cold tier and the bytes they returned (see `cold_tier`).
    pub cold_reads: u64,
    pub cold_read_bytes: u64,
    /// Block lookups of cold reads answered by the cold cache, and those that fetched.
    pub cold_cache_hits: u64,
    pub cold_cache_misses: u64,
    /// Fetches started ahead of a reader moving forward through cold segments.
    pub cold_prefetches: u64,
    /// Bytes held by the cold cache, and of cold fetches in flight, now.
    pub cold_cache_bytes: u64,
    pub cold_bytes_in_flight: u64,
    /// Sealed segments whose local files were deleted because they are archived.
    pub evicted_segments: u64,
    /// Segments only in the cold tier now, and the bytes of the segment files still local.
    pub cold_segments: u64,
    pub local_segment_bytes: u64,
}

/// Heap bytes a shard holds, by component: what `ursula_memory_bytes` reports. Each is the
/// component's own count of what it holds (tables at their capacity), not a reading of
/// the allocator, so RSS above their sum is the allocator's and the connections'.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HeapUsage {
    /// The catalog: its tables of streams and keys, the keys, dormant entries, the orders
    /// by last use and by deadline.
    pub catalog: usize,
    /// Resident streams' own state: metadata, producers and receipts, the unpacked ends
    /// and page handles of their tables, pages not written to an index file yet.
    pub streams: usize,
    /// Stream data cached for reads (`cache_bytes` bounds it).
    pub read_cache: usize,
    /// Index pages read back from index files (`index_cache_bytes` bounds it; per core).
    pub index_cache: usize,
    /// Blocks fetched from the cold tier, cached and in flight.
    pub cold_cache: usize,
    /// Write batches being filled or flushed, and the pool kept for reuse.
    pub write_buffers: usize,
    /// The cleaner's map of which streams have records in which segment.
    pub segment_map: usize,
    /// Commit waiters.
    pub group_commit: usize,
}

impl HeapUsage {
    /// Each component by name (the `component` label of `ursula_memory_bytes`).
    pub fn components(&self) -> [(&'static str, usize); 8] {
        [
            ("catalog", self.catalog),
            ("streams", self.streams),
            ("read_cache", self.read_cache),
            ("index_cache", self.index_cache),
            ("cold_cache", self.cold_cache),
            ("write_buffers", self.write_buffers),
            ("segment_map", self.segment_map),
            ("group_commit", self.group_commit),
        ]
    }
}

/// Upper bounds, in microseconds, of the commit write latency buckets in [`ShardStats`].
pub const COMMIT_WRITE_BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// Upper bounds, in bytes, of the commit size buckets in [`ShardStats`].
pub const COMMIT_BYTES_BUCKETS: [u64; 10] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
    1 << 30,
];

/// A new stream and its initial content.
pub struct NewStream {
    pub meta: StreamMeta,
    /// Initial data and closure; `id` and `start` are filled in by the shard.
    pub initial: AppendRec,
}

#[derive(Clone)]
pub struct Shard {
    inner: Rc<Inner>,
}

struct Inner {
    cfg: ShardConfig,
    /// Streams by id and key, resident or dormant; ids and creation tokens handed out.
    catalog: RefCell<Catalog>,
    /// Now, to the second: what streams' last use is stamped with (see `dormancy`).
    clock_ms: Cell<i64>,
    log: RefCell<Option<LogWriter>>,
    /// LSNs, durability, bytes awaiting the flusher, the failure and commit waiters.
    group_commit: RefCell<GroupCommit>,
    flusher: RefCell<Option<Waker>>,
    /// The upkeep task, while it waits for its next round.
    upkeep: RefCell<Option<Waker>>,
    stopping: Cell<bool>,
    stats: Cell<ShardStats>,
    /// The read cache's byte count and eviction order.
    cache: RefCell<CacheBudget>,
    /// Read handles of segment files, opened on first cold read.
    readers: RefCell<HashMap<SegmentNo, Rc<monoio::fs::File>>>,
    /// For every segment file, the streams with records in it; live data bytes.
    segments: RefCell<SegmentMap>,
    /// Set while the cleaner or a checkpoint runs; they must not interleave, because a
    /// checkpoint taken mid-clean would point at chunks about to be deleted.
    upkeep_busy: Cell<bool>,
    /// Log written, log the last checkpoint covers, its size and where replay starts.
    checkpoints: RefCell<CheckpointLedger>,
    /// Snapshot blob names, dropped blobs awaiting durability, a memory shard's blobs.
    blobs: RefCell<Blobs>,
    /// Ids for `Changed` futures, so each waiting task holds one waker slot.
    next_waiter: WaiterIds,
    /// Open index files by number, the newest number, the segments indexed so far.
    index_files: RefCell<IndexFiles>,
    /// Segments that left the local disk, and how they are read (with a cold tier only).
    cold: Option<cold_tier::ColdTier>,
    /// With S3 durability: what is gathered for and in flight to S3, and how far S3 has
    /// the log. Set once recovery has found the log's end.
    s3_wal: std::cell::OnceCell<RefCell<s3_wal::S3Wal>>,
}

impl Shard {
    /// Open (recovering if needed) the shard and start its flusher on the current runtime.
    pub async fn open(cfg: ShardConfig) -> Result<(Shard, RecoveryReport), StorageError> {
        let started = Instant::now();
        crate::fault::skips();
        let inner = Rc::new(Inner {
            cfg: cfg.clone(),
            catalog: RefCell::new(Catalog::new(cfg.first_id)),
            clock_ms: Cell::new(crate::now_ms()),
            log: RefCell::new(None),
            group_commit: RefCell::new(GroupCommit::new((SegmentNo::default(), DATA_START))),
            flusher: RefCell::new(None),
            upkeep: RefCell::new(None),
            stopping: Cell::new(false),
            stats: Cell::new(ShardStats::default()),
            cache: RefCell::new(CacheBudget::new(cfg.cache_bytes)),
            readers: RefCell::new(HashMap::new()),
            segments: RefCell::new(SegmentMap::default()),
            upkeep_busy: Cell::new(false),
            checkpoints: RefCell::new(CheckpointLedger::default()),
            blobs: RefCell::new(Blobs::default()),
            next_waiter: WaiterIds::default(),
            index_files: RefCell::new(IndexFiles::default()),
            cold: match (&cfg.cold, &cfg.durability) {
                (Some(store), Durability::Disk(_)) => {
                    Some(cold_tier::ColdTier::new(store.clone(), &cfg))
                }
                _ => None,
            },
            s3_wal: std::cell::OnceCell::new(),
        });
        index::set_cache_bytes(cfg.index_cache_bytes);
        let shard = Shard { inner };
        let mut report = RecoveryReport::default();
        if let Durability::Disk(root) = &cfg.durability {
            let dir = root.join(format!("shard-{}", cfg.shard));
            segment::create_dir_durable(&dir)?;
            let recovered = shard.recover(&dir, &mut report)?;
            *shard.inner.log.borrow_mut() = Some(recovered.log);
            shard.open_s3_wal(recovered.unacked)?;
            shard.restarted();
            let flusher = shard.clone();
            monoio::spawn(async move { flusher.run_flusher().await });
            let upkeep = shard.clone();
            monoio::spawn(async move { upkeep.run_upkeep().await });
        }
        report.streams = shard.inner.catalog.borrow().len();
        report.elapsed = started.elapsed();
        Ok((shard, report))
    }

    pub fn config(&self) -> &ShardConfig {
        &self.inner.cfg
    }

    pub fn stats(&self) -> ShardStats {
        let mut stats = self.inner.stats.get();
        // The log counts these itself; it is never borrowed across an await, so a caller on
        // this thread always gets it.
        if let Ok(log) = self.inner.log.try_borrow() {
            if let Some(log) = log.as_ref() {
                let counts = log.counts();
                stats.spare_segments = counts.spares_adopted;
                stats.zeroed_ahead_bytes = counts.zeroed_bytes;
            }
        }
        if let Ok(segments) = self.inner.segments.try_borrow() {
            let cold = self.cold_tier().map_or(0, |t| t.segments.borrow().len());
            stats.cold_segments = cold as u64;
            stats.local_segment_bytes = (segments.len() - cold) as u64 * self.segment_bytes();
        }
        if let Some(t) = self.cold_tier() {
            stats.cold_cache_bytes = t.cached_bytes() as u64;
            stats.cold_bytes_in_flight = t.bytes_in_flight() as u64;
        }
        stats
    }

    /// Heap bytes held by each of the shard's components (see [`HeapUsage`]). Walks the
    /// resident streams and the segment map: for a metrics scrape, not a hot path.
    pub fn heap_usage(&self) -> HeapUsage {
        let catalog = self.inner.catalog.borrow();
        let streams = catalog.resident().map(Stream::heap_bytes).sum();
        let segment_map = self.inner.segments.borrow().heap_bytes();
        let stats = self.stats();
        HeapUsage {
            catalog: catalog.heap_bytes(),
            streams,
            read_cache: {
                let cache = self.inner.cache.borrow();
                cache.resident_bytes() + cache.heap_bytes()
            },
            index_cache: index::cached_page_bytes(),
            cold_cache: (stats.cold_cache_bytes + stats.cold_bytes_in_flight) as usize,
            write_buffers: self
                .inner
                .log
                .try_borrow()
                .ok()
                .and_then(|l| l.as_ref().map(LogWriter::buffer_bytes))
                .unwrap_or(0),
            segment_map,
            group_commit: self.inner.group_commit.borrow().heap_bytes(),
        }
    }

    /// How far the log is durable (see [`crate::cold::DurableEnd`]).
    pub fn durable_end(&self) -> crate::cold::DurableEnd {
        let group_commit = self.inner.group_commit.borrow();
        let (segment, position) = group_commit.durable_end();
        crate::cold::DurableEnd {
            segment,
            position,
            lsn: group_commit.durable_lsn(),
        }
    }

    /// Whether writes are refused after an earlier storage failure.
    pub fn failure(&self) -> Option<ShardFailure> {
        self.inner.group_commit.borrow().failure().copied()
    }

    /// Whether the shard has stopped (shut down or halted): nothing more is written to it,
    /// and a wait on it ([`Shard::changed`]) ends at once.
    pub fn stopped(&self) -> bool {
        self.inner.stopping.get()
    }

    /// Resolves once stream `id` changes after `seen_version` (see [`Stream::version`]) or is
    /// deleted, or the shard stops.
    pub fn changed(&self, id: StreamId, seen_version: u64) -> Changed<'_> {
        let waiter = self.inner.next_waiter.next();
        Changed {
            shard: self,
            stream: id,
            seen_version,
            waiter,
        }
    }

    /// Stop once everything accepted so far is durable, without the final checkpoint: the
    /// state a crash right after the last fdatasync leaves. For crash and recovery tests.
    pub async fn halt(&self) -> Result<(), StorageError> {
        let last = self.last_lsn();
        let result = self.settled(last).await;
        self.inner.readers.borrow_mut().clear();
        self.stop_tasks();
        result
    }

    /// Wait until everything accepted so far is durable, write a checkpoint, tell the cold
    /// tier how far the log now is durable (for its last archive round), then stop the
    /// flusher.
    pub async fn shutdown(&self) -> Result<(), StorageError> {
        let last = self.last_lsn();
        let mut result = self.settled(last).await;
        // A clean stop leaves a checkpoint at the head, so the next start replays nothing.
        if result.is_ok() && self.inner.checkpoints.borrow().since_last() > 0 {
            result = self.checkpoint().await.map(|_| ());
        }
        self.inner.readers.borrow_mut().clear();
        if result.is_ok() {
            if let Some(cold) = &self.inner.cfg.cold {
                cold.durable(self.inner.cfg.shard, self.durable_end());
            }
        }
        self.stop_tasks();
        result
    }

    /// Wait for `lsn` to be acknowledged, or with S3 durability at least durable locally
    /// when S3 does not take it within the bound: a stop must not wait on S3 for ever, and
    /// the local log (and the last archive round) has the change.
    async fn settled(&self, lsn: Lsn) -> Result<(), StorageError> {
        match self.commit(lsn).durable().await {
            Err(StorageError::NotInS3 { .. }) => loop {
                if let Some(why) = self.failure() {
                    return Err(why.into());
                }
                if self.durable_lsn() >= lsn {
                    return Ok(());
                }
                monoio::time::sleep(Duration::from_millis(10)).await;
            },
            other => other,
        }
    }

    /// End the flusher and the upkeep task at their next turn, so neither outlives the
    /// shard's owner waiting on a timer or on work that will not come.
    fn stop_tasks(&self) {
        self.inner.stopping.set(true);
        // Live readers end their wait (see `Changed`) and find the shard stopped.
        for s in self.inner.catalog.borrow().resident() {
            s.wake_waiters();
        }
        self.wake_flusher();
        if let Some(w) = self.inner.upkeep.borrow_mut().take() {
            w.wake();
        }
        if let Some(wal) = self.s3_wal() {
            wal.borrow_mut().wake_task();
        }
    }

    /// The LSN of the last record accepted (`NONE` before the first).
    fn last_lsn(&self) -> Lsn {
        self.inner.group_commit.borrow().last_lsn()
    }

    /// The LSN up to which every record is durable.
    fn durable_lsn(&self) -> Lsn {
        self.inner.group_commit.borrow().durable_lsn()
    }

    /// The segment the log writes to now (tests).
    #[cfg(test)]
    fn write_segment(&self) -> SegmentNo {
        self.inner
            .log
            .borrow()
            .as_ref()
            .expect("a disk shard has a log")
            .write_segment()
    }

    /// The directory of the shard's log (None in memory mode).
    fn log_dir(&self) -> Option<std::path::PathBuf> {
        self.inner
            .log
            .borrow()
            .as_ref()
            .map(|l| l.dir().to_path_buf())
    }

    fn memory(&self) -> bool {
        self.inner.cfg.durability == Durability::Memory
    }
}

/// The slot of a histogram with upper bounds `bounds` that counts `value`: the first bound
/// at or above it, or the overflow slot after the last.
pub(super) fn bucket_slot<T: PartialOrd>(bounds: &[T], value: T) -> usize {
    bounds
        .iter()
        .position(|b| value <= *b)
        .unwrap_or(bounds.len())
}

fn missing() -> StorageError {
    StorageError::Internal("stream vanished during a write")
}

/// Resolves once a stream changes after a seen version or is deleted. Holds one waker slot
/// in the stream while pending and gives it back when dropped (a timed-out wait leaves
/// nothing behind).
pub struct Changed<'a> {
    shard: &'a Shard,
    stream: StreamId,
    seen_version: u64,
    waiter: u64,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.shard.inner.stopping.get() {
            return Poll::Ready(());
        }
        // A stream that went dormant has nobody waiting on it, so this wait has not started
        // yet; it ends at once and its reader looks again (waking the stream).
        match self.shard.inner.catalog.borrow().get(self.stream) {
            Some(s) if s.version() == self.seen_version => {
                s.register_waiter(self.waiter, cx.waker());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        if let Ok(catalog) = self.shard.inner.catalog.try_borrow() {
            if let Some(s) = catalog.get(self.stream) {
                s.unregister_waiter(self.waiter);
            }
        }
    }
}
