//! A shard: the streams one core owns, and the log that makes their changes durable.
//!
//! ```text
//!  request task ──create/append/delete──▶ head state (Stream)      (synchronous, in order)
//!        │                                 │
//!        │                                 └─ record encoded into the open batch buffer
//!        ▼                                                    │
//!  Commit::durable().await ◀── wake ── flusher task ◀─────────┘
//!                                       write_all_at (O_DIRECT, 4 KiB-aligned)
//!                                       fdatasync
//!                                       visible watermarks advance, readers woken
//! ```
//!
//! While one flush is in flight every new record goes into the next batch, so a single
//! fdatasync covers everything that arrived during the previous one (group commit). All of a
//! shard lives on one thread: `Rc`/`RefCell`, no locks. Callers must not hold a `Ref` from
//! [`Shard::stream`] across a call that mutates the shard.

use std::cell::{Cell, Ref, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::{poll_fn, Future};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::aligned::{align_down, align_up, AlignedBuf, BufPool};
use crate::checkpoint;
use crate::readback::{self, Part, Span, MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES};
use crate::record::{decode_at, AppendRec, CreateRec, FrameError, Lifetime, Record, SnapshotMeta};
use crate::segment::segment_path;
use crate::segment::{self, SegmentHeader, DATA_START};
use crate::stream::{DiskLoc, Piece, Receipt, Stream, StreamId};

/// Maps looked up on every append (several times each): foldhash instead of std's SipHash,
/// which took ~7% of an append's user-space instructions. Seeds are random per map, so
/// stream keys chosen by clients still cannot be aimed at one bucket.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// Where a shard keeps its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Segment files under this directory; acknowledged after fdatasync.
    Disk(PathBuf),
    /// Process memory only: acknowledged at once, lost on exit.
    Memory,
}

#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub shard: u32,
    pub durability: Durability,
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
    /// fdatasync had returned EIO (its data was written, its durability is unknown).
    pub fail_fsync_after: Option<u64>,
    /// A segment that took at least this long to fill is followed by a zero-filled spare
    /// (see `segment::prepare_spare`). Zeroing writes every segment a second time, which a
    /// log filling near the disk's bandwidth cannot afford; the default, 2 s, means below
    /// 64 MB/s per shard at 128 MiB segments. `Duration::MAX` turns spares off.
    pub spare_fill_time: Duration,
    /// Zeros are written just ahead of the records (see `Log::zero_ahead`) while the log
    /// fills slower than this many bytes per second; 0 turns that off. Like spares, zeroing
    /// writes every block twice, so the default, 64 MB/s, is a small share of a disk.
    pub zero_ahead_below: u64,
}

impl ShardConfig {
    pub fn new(shard: u32, durability: Durability) -> ShardConfig {
        ShardConfig {
            shard,
            durability,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            receipt_window: 256,
            cache_bytes: DEFAULT_CACHE_BYTES,
            write_budget_bytes: DEFAULT_WRITE_BUDGET_BYTES,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            fail_fsync_after: None,
            spare_fill_time: Duration::from_secs(2),
            zero_ahead_below: 64_000_000,
        }
    }
}

pub const DEFAULT_SEGMENT_BYTES: u64 = 128 << 20;
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;
pub const DEFAULT_WRITE_BUDGET_BYTES: usize = 256 << 20;
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;
/// Least log bytes between checkpoints, as a multiple of the last checkpoint's size.
pub const CHECKPOINT_LOG_RATIO: u64 = 4;
/// A segment must hold the largest record.
pub const MIN_SEGMENT_BYTES: u64 =
    (crate::record::MAX_PAYLOAD + crate::record::FRAME_HEADER) as u64 + 2 * DATA_START;
/// Standard size of a write batch buffer; a batch that outgrows it takes a bigger one from
/// the pool (up to `POOLED_BUF_BYTES` of them are kept).
const BATCH_BUF_BYTES: usize = 1 << 20;
/// Most bytes of write buffers a shard keeps for reuse between group commits.
const POOLED_BUF_BYTES: usize = 32 << 20;
/// How many bytes ahead of the records a slowly filling segment is zeroed at a time (see
/// `Log::zero_ahead`).
const ZERO_AHEAD_BYTES: u64 = 1 << 20;

#[derive(Debug)]
pub enum StorageError {
    /// The disk is full: nothing was changed.
    NoSpace,
    /// A record larger than a segment can hold.
    TooLarge,
    /// A record read back from disk failed its checksum.
    Corrupt(String),
    /// The write queue holds its budget of unflushed bytes; nothing was changed and the
    /// caller may retry once the queue drains.
    Busy,
    /// An earlier write or fdatasync failed; the shard accepts no more writes until restart
    /// because it can no longer tell what reached the disk.
    Failed(String),
    Io(io::Error),
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::NoSpace => write!(f, "no space left on device"),
            StorageError::TooLarge => write!(f, "record larger than a segment"),
            StorageError::Busy => write!(f, "write queue full"),
            StorageError::Corrupt(what) => write!(f, "corrupt data on disk: {what}"),
            StorageError::Failed(why) => write!(f, "storage failed earlier: {why}"),
            StorageError::Io(e) => write!(f, "i/o error: {e}"),
        }
    }
}

impl std::error::Error for StorageError {}

impl From<io::Error> for StorageError {
    fn from(e: io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            StorageError::NoSpace
        } else {
            StorageError::Io(e)
        }
    }
}

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
    pub checkpoint_lsn: u64,
    pub elapsed: Duration,
}

/// Counters for benchmarks and metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShardStats {
    pub flushes: u64,
    pub records_flushed: u64,
    pub bytes_flushed: u64,
    /// fdatasync calls, their summed duration, and how many took at most each bound of
    /// [`FSYNC_BUCKETS_US`] (not cumulative; the last slot counts the slower ones).
    pub fsyncs: u64,
    pub fsync_nanos: u64,
    pub fsync_buckets: [u64; FSYNC_BUCKETS_US.len() + 1],
    /// Direct-I/O reads of evicted data for readers, and the bytes they transferred
    /// (neighbouring records share a read; see `readback`).
    pub disk_reads: u64,
    pub disk_read_bytes: u64,
    /// Segments that began as a zero-filled spare (see `segment::prepare_spare`).
    pub spare_segments: u64,
    /// Zeros written ahead of the records in slowly filling segments (see `Log::zero_ahead`).
    pub zeroed_ahead_bytes: u64,
}

/// Upper bounds, in microseconds, of the fdatasync latency buckets in [`ShardStats`].
pub const FSYNC_BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// A new stream and its initial content.
pub struct NewStream {
    pub key: Box<str>,
    pub incarnation: u64,
    pub created_ms: i64,
    pub content_type: Box<str>,
    pub lifetime: Lifetime,
    pub ext: Bytes,
    /// Initial data and closure; `id` and `start` are filled in by the shard.
    pub initial: AppendRec,
}

#[derive(Clone)]
pub struct Shard {
    inner: Rc<Inner>,
}

struct Inner {
    cfg: ShardConfig,
    streams: RefCell<FastMap<StreamId, Stream>>,
    keys: RefCell<FastMap<Box<str>, StreamId>>,
    next_id: Cell<StreamId>,
    last_incarnation: Cell<u64>,
    log: RefCell<Option<Log>>,
    next_lsn: Cell<u64>,
    durable_lsn: Cell<u64>,
    /// Framed bytes queued since the flusher last took the batches, and those it is
    /// writing now: what [`ShardConfig::write_budget_bytes`] bounds.
    queued_bytes: Cell<u64>,
    flushing_bytes: Cell<u64>,
    failed: RefCell<Option<String>>,
    commit_waiters: RefCell<Vec<Waker>>,
    flusher: RefCell<Option<Waker>>,
    stopping: Cell<bool>,
    stats: Cell<ShardStats>,
    /// Cached bytes, and the cached runs by age (stream, run start), oldest first: the
    /// order in which to evict them.
    resident_bytes: Cell<usize>,
    evict_queue: RefCell<VecDeque<(StreamId, u64)>>,
    /// Read handles of segment files, opened on first cold read.
    readers: RefCell<HashMap<u64, Rc<monoio::fs::File>>>,
    /// For every segment file, the streams with records in it (the cleaner's work list).
    segments: RefCell<BTreeMap<u64, FastSet<StreamId>>>,
    /// Bytes of data held by live streams.
    live_bytes: Cell<u64>,
    /// Set while the cleaner or a checkpoint runs; they must not interleave, because a
    /// checkpoint taken mid-clean would point at chunks about to be deleted.
    upkeep_busy: Cell<bool>,
    /// Framed bytes logged since start, and that count when the last checkpoint was taken.
    logged_bytes: Cell<u64>,
    checkpointed_at: Cell<u64>,
    /// Size of the last checkpoint written, in bytes.
    checkpoint_size: Cell<u64>,
    /// Segment where replay from the durable checkpoint starts. Only segments before it
    /// may be deleted: a record in a later one (a deletion, say) is needed on top of the
    /// checkpoint, and the cleaner does not carry deletions forward.
    checkpoint_segment: Cell<Option<u64>>,
    /// Snapshot blobs to delete once the record that dropped them is durable: (lsn, name).
    dead_blobs: RefCell<Vec<(u64, Box<str>)>>,
    /// Snapshot blobs of a memory shard.
    memory_blobs: RefCell<HashMap<Box<str>, Bytes>>,
    blob_counter: Cell<u64>,
    /// Ids for `Changed` futures, so each waiting task holds one waker slot.
    next_waiter: Cell<u64>,
}

impl Shard {
    /// Open (recovering if needed) the shard and start its flusher on the current runtime.
    pub async fn open(cfg: ShardConfig) -> Result<(Shard, RecoveryReport), StorageError> {
        let started = Instant::now();
        crate::fault::skips();
        let inner = Rc::new(Inner {
            cfg: cfg.clone(),
            streams: RefCell::new(FastMap::default()),
            keys: RefCell::new(FastMap::default()),
            next_id: Cell::new(1),
            last_incarnation: Cell::new(0),
            log: RefCell::new(None),
            next_lsn: Cell::new(1),
            durable_lsn: Cell::new(0),
            queued_bytes: Cell::new(0),
            flushing_bytes: Cell::new(0),
            failed: RefCell::new(None),
            commit_waiters: RefCell::new(Vec::new()),
            flusher: RefCell::new(None),
            stopping: Cell::new(false),
            stats: Cell::new(ShardStats::default()),
            resident_bytes: Cell::new(0),
            evict_queue: RefCell::new(VecDeque::new()),
            readers: RefCell::new(HashMap::new()),
            segments: RefCell::new(BTreeMap::new()),
            live_bytes: Cell::new(0),
            upkeep_busy: Cell::new(false),
            logged_bytes: Cell::new(0),
            checkpointed_at: Cell::new(0),
            checkpoint_size: Cell::new(0),
            checkpoint_segment: Cell::new(None),
            dead_blobs: RefCell::new(Vec::new()),
            memory_blobs: RefCell::new(HashMap::new()),
            blob_counter: Cell::new(0),
            next_waiter: Cell::new(0),
        });
        let shard = Shard { inner };
        let mut report = RecoveryReport::default();
        if let Durability::Disk(root) = &cfg.durability {
            let dir = root.join(format!("shard-{}", cfg.shard));
            segment::create_dir_durable(&dir)?;
            let log = shard.recover(&dir, &mut report)?;
            *shard.inner.log.borrow_mut() = Some(log);
            let flusher = shard.clone();
            monoio::spawn(async move { flusher.run_flusher().await });
            let upkeep = shard.clone();
            monoio::spawn(async move { upkeep.run_upkeep().await });
        }
        report.streams = shard.inner.streams.borrow().len();
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
                stats.spare_segments = log.spares_adopted;
                stats.zeroed_ahead_bytes = log.zeroed_bytes;
            }
        }
        stats
    }

    pub fn lookup(&self, key: &str) -> Option<StreamId> {
        self.inner.keys.borrow().get(key).copied()
    }

    pub fn stream(&self, id: StreamId) -> Option<Ref<'_, Stream>> {
        Ref::filter_map(self.inner.streams.borrow(), |m| m.get(&id)).ok()
    }

    pub fn stream_by_key(&self, key: &str) -> Option<Ref<'_, Stream>> {
        let id = self.lookup(key)?;
        self.stream(id)
    }

    /// Keys of all streams, in no particular order.
    pub fn keys(&self) -> Vec<Box<str>> {
        self.inner.keys.borrow().keys().cloned().collect()
    }

    /// A creation token that differs from every incarnation this shard handed out before.
    pub fn next_incarnation(&self, now_ms: i64) -> u64 {
        let next = (now_ms.max(0) as u64).max(self.inner.last_incarnation.get() + 1);
        self.inner.last_incarnation.set(next);
        next
    }

    /// Whether writes are refused after an earlier storage failure.
    pub fn failure(&self) -> Option<String> {
        self.inner.failed.borrow().clone()
    }

    /// Framed bytes written to the log but not yet durable.
    pub fn unflushed_bytes(&self) -> u64 {
        self.inner.queued_bytes.get() + self.inner.flushing_bytes.get()
    }

    /// Refuse a client write while the unflushed bytes are at the budget. An empty queue
    /// admits any size, so a record larger than the budget still makes progress.
    fn admit(&self, data_len: usize) -> Result<(), StorageError> {
        let unflushed = self.unflushed_bytes();
        if unflushed > 0 && unflushed + data_len as u64 > self.inner.cfg.write_budget_bytes as u64 {
            return Err(StorageError::Busy);
        }
        Ok(())
    }

    pub fn create(&self, spec: NewStream) -> Result<(StreamId, Commit), StorageError> {
        self.admit(spec.initial.data.len())?;
        let id = self.inner.next_id.get();
        let mut initial = spec.initial;
        initial.id = id;
        initial.start = 0;
        let rec = CreateRec {
            id,
            key: spec.key,
            incarnation: spec.incarnation,
            created_ms: spec.created_ms,
            content_type: spec.content_type,
            lifetime: spec.lifetime,
            ext: spec.ext,
            initial,
        };
        let record = Record::Create(rec);
        let (lsn, loc) = self.log_record(&record, Some((id, 0, false)))?;
        let Record::Create(rec) = record else {
            unreachable!("built above")
        };
        self.inner.next_id.set(id + 1);
        let now = crate::now_ms();
        let mut stream = Stream::from_create(&rec, now);
        let loc = loc.map(|l| l.with_data(rec.initial.data.len()));
        let receipt =
            stream.apply_append(&rec.initial, self.inner.cfg.receipt_window, now, loc, true);
        self.set_effect_tail(lsn, id, receipt.next, stream.closed);
        self.insert_stream(stream, lsn);
        self.add_live(rec.initial.data.len() as u64);
        self.cached(id, &rec.initial);
        Ok((id, self.commit(lsn)))
    }

    /// Append to (and/or close) a stream. `a.id` and `a.start` are filled in here.
    pub fn append(
        &self,
        id: StreamId,
        mut a: AppendRec,
    ) -> Result<(Receipt, Commit), StorageError> {
        let tail = self.stream(id).map(|s| s.tail).ok_or_else(missing)?;
        self.admit(a.data.len())?;
        a.id = id;
        a.start = tail;
        let record = Record::Append(a);
        let (lsn, loc) = self.log_record(&record, None)?;
        let Record::Append(a) = record else {
            unreachable!("built above")
        };
        let now = crate::now_ms();
        let loc = loc.map(|l| l.with_data(a.data.len()));
        let mut streams = self.inner.streams.borrow_mut();
        let stream = streams.get_mut(&id).ok_or_else(missing)?;
        let receipt = stream.apply_append(&a, self.inner.cfg.receipt_window, now, loc, true);
        stream.last_access_ms.set(now);
        let closed = stream.closed;
        drop(streams);
        self.add_live(a.data.len() as u64);
        self.cached(id, &a);
        self.set_effect_tail(lsn, id, receipt.next, closed);
        if self.memory() {
            self.make_visible(id, receipt.next, closed);
        }
        Ok((receipt, self.commit(lsn)))
    }

    pub fn delete(&self, id: StreamId) -> Result<Commit, StorageError> {
        let (lsn, _) = self.log_record(&Record::Delete { id }, None)?;
        let removed = self.inner.streams.borrow_mut().remove(&id);
        if let Some(stream) = removed {
            self.inner.keys.borrow_mut().remove(&stream.key);
            let freed = stream.resident_bytes();
            self.inner
                .resident_bytes
                .set(self.inner.resident_bytes.get().saturating_sub(freed));
            self.inner.live_bytes.set(
                self.inner
                    .live_bytes
                    .get()
                    .saturating_sub(stream.data_bytes()),
            );
            if let Some(snap) = &stream.snapshot {
                self.drop_blob(lsn, snap.blob.clone());
            }
            stream.notify();
        }
        Ok(self.commit(lsn))
    }

    /// Bytes of `[from, to)` of a stream (clamped to what is durable), as zero-copy slices.
    /// Cached data comes from memory. The rest is read from the log with direct I/O
    /// (neighbouring records in one read, several reads at once; see `readback`), each
    /// record's checksum verified, and cached again.
    pub async fn read(&self, id: StreamId, from: u64, to: u64) -> Result<Vec<Bytes>, StorageError> {
        let plan = match self.inner.streams.borrow_mut().get_mut(&id) {
            Some(s) => s.read_plan(from, to),
            None => return Ok(Vec::new()),
        };
        let mut out = Vec::with_capacity(plan.len());
        let mut spans: Vec<Span> = Vec::new();
        for piece in plan {
            match piece {
                Piece::Memory(b) => out.push(b),
                Piece::Disk {
                    loc,
                    chunk_start,
                    chunk_len,
                    from,
                    to,
                } => {
                    let part = Part {
                        slot: out.len(),
                        loc,
                        chunk_start,
                        chunk_len,
                        from,
                        to,
                    };
                    out.push(Bytes::new());
                    let part = match spans.last_mut() {
                        Some(span) => span.try_add(part),
                        None => Err(part),
                    };
                    if let Err(part) = part {
                        // Every file is opened here, before the first await: the cleaner may
                        // move these chunks and delete their segment while earlier spans
                        // load, but an open file stays readable.
                        spans.push(Span::new(self.reader(part.loc.segment)?, part));
                    }
                }
            }
        }
        let mut spans = spans.into_iter().peekable();
        while spans.peek().is_some() {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(span) = spans.next_if(|s| {
                batch.is_empty()
                    || (batch.len() < MAX_IN_FLIGHT && bytes + s.read_len() <= MAX_IN_FLIGHT_BYTES)
            }) {
                bytes += span.read_len();
                batch.push(span);
            }
            let mut stats = self.inner.stats.get();
            stats.disk_reads += batch.len() as u64;
            stats.disk_read_bytes += bytes;
            self.inner.stats.set(stats);
            let loaded = readback::join_all(batch.iter().map(Span::read).collect()).await;
            for (span, result) in batch.iter().zip(loaded) {
                let (buf, buf_pos) = result?;
                self.place_span(id, span, &buf, buf_pos, &mut out)?;
            }
        }
        self.evict_over_budget();
        Ok(out)
    }

    /// Verify the records of a loaded span, fill the response pieces its parts stand for,
    /// and cache their chunks again: chunks that follow each other in the stream go into
    /// one run, copied out of the span buffer unless a chunk is most of it, so the cache
    /// never pins a large read buffer for a small chunk.
    fn place_span(
        &self,
        id: StreamId,
        span: &Span,
        buf: &Bytes,
        buf_pos: u64,
        out: &mut [Bytes],
    ) -> Result<(), StorageError> {
        let mut verified = None;
        let mut chunks: Vec<Bytes> = Vec::with_capacity(span.parts.len());
        for part in &span.parts {
            let loc = part.loc;
            let at = (loc.record_pos - buf_pos) as usize;
            if verified != Some(loc.record_pos) {
                verify_record(buf, at, loc)?;
                verified = Some(loc.record_pos);
            }
            let data = at + loc.data_off as usize;
            chunks.push(buf.slice(data..data + part.chunk_len as usize));
        }
        let mut i = 0;
        while i < span.parts.len() {
            // The parts [i, j) are chunks that follow each other in the stream.
            let mut j = i + 1;
            while j < span.parts.len()
                && span.parts[j].chunk_start
                    == span.parts[j - 1].chunk_start + u64::from(span.parts[j - 1].chunk_len)
            {
                j += 1;
            }
            let run = if j == i + 1 && chunks[i].len() * 2 >= buf.len() {
                chunks[i].clone()
            } else {
                let mut run = BytesMut::with_capacity(chunks[i..j].iter().map(Bytes::len).sum());
                for c in &chunks[i..j] {
                    run.extend_from_slice(c);
                }
                run.freeze()
            };
            let run_start = span.parts[i].chunk_start;
            for part in &span.parts[i..j] {
                let off = (part.chunk_start - run_start) as usize;
                out[part.slot] = run.slice(off + part.from..off + part.to);
            }
            let added = match self.inner.streams.borrow_mut().get_mut(&id) {
                Some(s) => s.recache(run_start, &run),
                None => 0,
            };
            if added > 0 {
                self.track_resident(id, added);
            }
            i = j;
        }
        Ok(())
    }

    /// Bytes currently cached in memory.
    pub fn resident_bytes(&self) -> usize {
        self.inner.resident_bytes.get()
    }

    /// Store a snapshot blob durably in its own file (memory mode: in memory) and return
    /// its name. It becomes a stream's snapshot only through [`Shard::set_snapshot`]; a blob
    /// never referenced is removed at the next start.
    pub async fn write_blob(&self, body: Bytes) -> Result<Box<str>, StorageError> {
        let n = self.inner.blob_counter.get() + 1;
        self.inner.blob_counter.set(n);
        let name: Box<str> = format!("{:x}-{n:x}.blob", crate::now_ms()).into();
        let Some(dir) = self.blob_dir() else {
            self.inner
                .memory_blobs
                .borrow_mut()
                .insert(name.clone(), body);
            return Ok(name);
        };
        segment::create_dir_durable(&dir)?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(&*name))?;
        let file = monoio::fs::File::from_std(file)?;
        if !body.is_empty() {
            let (res, _) = file.write_all_at(body, 0).await;
            res?;
        }
        file.sync_all().await?;
        segment::sync_dir(&dir)?;
        Ok(name)
    }

    /// Read a snapshot blob back.
    pub async fn read_blob(&self, meta: &SnapshotMeta) -> Result<Bytes, StorageError> {
        let Some(dir) = self.blob_dir() else {
            return self
                .inner
                .memory_blobs
                .borrow()
                .get(&meta.blob)
                .cloned()
                .ok_or_else(|| {
                    StorageError::Corrupt(format!("snapshot blob {} missing", meta.blob))
                });
        };
        let file = monoio::fs::File::open(dir.join(&*meta.blob)).await?;
        let buf = Vec::with_capacity(meta.len as usize);
        let (res, buf) = file.read_exact_at(buf, 0).await;
        res?;
        Ok(Bytes::from(buf))
    }

    /// Forget a blob written by [`Shard::write_blob`] that will not be used.
    pub fn discard_blob(&self, name: Box<str>) {
        let lsn = self.inner.durable_lsn.get();
        self.drop_blob(lsn, name);
    }

    /// Make `meta` (whose blob is durable) the stream's visible snapshot, replacing any other.
    pub fn set_snapshot(&self, id: StreamId, meta: SnapshotMeta) -> Result<Commit, StorageError> {
        let record = Record::Snapshot { id, meta };
        let (lsn, _) = self.log_record(&record, None)?;
        let Record::Snapshot { meta, .. } = record else {
            unreachable!("built above")
        };
        let old = match self.inner.streams.borrow_mut().get_mut(&id) {
            Some(s) => s.snapshot.replace(meta),
            None => None,
        };
        if let Some(old) = old {
            self.drop_blob(lsn, old.blob);
        }
        Ok(self.commit(lsn))
    }

    /// Advance a stream's retention point to `offset` (a message boundary the caller has
    /// validated): data before it stops being readable and its space is reclaimed.
    pub fn retain(&self, id: StreamId, offset: u64) -> Result<Commit, StorageError> {
        let first_record = self
            .stream(id)
            .map(|s| s.message_at_or_after(offset))
            .ok_or_else(missing)?;
        let (lsn, _) = self.log_record(
            &Record::Retain {
                id,
                offset,
                first_record,
            },
            None,
        )?;
        let freed = match self.inner.streams.borrow_mut().get_mut(&id) {
            Some(s) => s.retain(offset, first_record),
            None => (0, 0),
        };
        self.inner
            .live_bytes
            .set(self.inner.live_bytes.get().saturating_sub(freed.0));
        self.inner
            .resident_bytes
            .set(self.inner.resident_bytes.get().saturating_sub(freed.1));
        Ok(self.commit(lsn))
    }

    fn blob_dir(&self) -> Option<PathBuf> {
        match &self.inner.cfg.durability {
            Durability::Disk(root) => Some(
                root.join(format!("shard-{}", self.inner.cfg.shard))
                    .join("snapshots"),
            ),
            Durability::Memory => None,
        }
    }

    /// Delete a blob once everything up to `lsn` is durable (memory mode: now).
    fn drop_blob(&self, lsn: u64, name: Box<str>) {
        if self.memory() {
            self.inner.memory_blobs.borrow_mut().remove(&name);
        } else {
            self.inner.dead_blobs.borrow_mut().push((lsn, name));
        }
    }

    /// Remove dropped blobs whose dropping record is durable.
    fn collect_dead_blobs(&self) {
        let durable = self.inner.durable_lsn.get();
        let Some(dir) = self.blob_dir() else { return };
        self.inner.dead_blobs.borrow_mut().retain(|(lsn, name)| {
            if *lsn > durable {
                return true;
            }
            if let Err(e) = std::fs::remove_file(dir.join(&**name)) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("could not remove snapshot blob {name}: {e}");
                }
            }
            false
        });
    }

    /// Read one chunk's bytes from its log record.
    async fn load(&self, loc: DiskLoc, len: u32) -> Result<Bytes, StorageError> {
        let file = self.reader(loc.segment)?;
        let record_end = loc.record_pos + u64::from(loc.record_len);
        let (bytes, start) = readback::read_aligned(&file, loc.record_pos, record_end).await?;
        let at = (loc.record_pos - start) as usize;
        verify_record(&bytes, at, loc)?;
        let data_start = at + loc.data_off as usize;
        Ok(bytes.slice(data_start..data_start + len as usize))
    }

    fn reader(&self, segment: u64) -> Result<Rc<monoio::fs::File>, StorageError> {
        if let Some(f) = self.inner.readers.borrow().get(&segment) {
            return Ok(f.clone());
        }
        let Durability::Disk(root) = &self.inner.cfg.durability else {
            return Err(StorageError::Failed("disk read in memory mode".into()));
        };
        let dir = root.join(format!("shard-{}", self.inner.cfg.shard));
        let file = segment::open_direct(&segment::segment_path(&dir, segment), false)?;
        let file = Rc::new(monoio::fs::File::from_std(file)?);
        self.inner
            .readers
            .borrow_mut()
            .insert(segment, file.clone());
        Ok(file)
    }

    /// Account for the bytes an append just cached, then trim the cache.
    fn cached(&self, id: StreamId, a: &AppendRec) {
        if self.memory() {
            // Nothing is evicted in memory mode: the cache is the only copy.
            if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
                s.drain_fresh_cache_runs();
            }
            return;
        }
        self.track_resident(id, a.data.len());
        self.evict_over_budget();
    }

    /// Count `len` newly cached bytes of stream `id`, and queue its new runs for eviction.
    fn track_resident(&self, id: StreamId, len: usize) {
        self.inner
            .resident_bytes
            .set(self.inner.resident_bytes.get() + len);
        if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
            let mut queue = self.inner.evict_queue.borrow_mut();
            queue.extend(s.drain_fresh_cache_runs().map(|start| (id, start)));
        }
    }

    /// Drop the oldest durable cached runs until the cache fits its budget. A run still
    /// waiting for its flush goes to the back of the queue: a stream's open block can stay
    /// unflushed for as long as appends keep arriving, and must not hold up the rest.
    fn evict_over_budget(&self) {
        let budget = self.inner.cfg.cache_bytes;
        let mut queue = self.inner.evict_queue.borrow_mut();
        let mut streams = self.inner.streams.borrow_mut();
        let mut pending_seen = 0;
        while self.inner.resident_bytes.get() > budget && pending_seen < queue.len() {
            let Some((id, start)) = queue.pop_front() else {
                break;
            };
            match streams.get_mut(&id) {
                Some(s) if s.cache_pending(start) => {
                    queue.push_back((id, start));
                    pending_seen += 1;
                }
                Some(s) => {
                    let freed = s.evict(start);
                    self.inner
                        .resident_bytes
                        .set(self.inner.resident_bytes.get().saturating_sub(freed));
                }
                None => {}
            }
        }
    }

    /// Replace the server-owned state blob of a stream.
    pub fn set_ext(&self, id: StreamId, ext: Bytes) -> Result<Commit, StorageError> {
        let record = Record::SetExt { id, ext };
        let (lsn, _) = self.log_record(&record, None)?;
        let Record::SetExt { ext, .. } = record else {
            unreachable!("built above")
        };
        if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
            s.ext = ext;
        }
        Ok(self.commit(lsn))
    }

    /// Record an access for sliding TTLs.
    pub fn touch(&self, id: StreamId, now_ms: i64) {
        if let Some(s) = self.inner.streams.borrow().get(&id) {
            s.last_access_ms.set(now_ms);
        }
    }

    /// Resolves once stream `id` changes after `seen_version` (see [`Stream::version`]) or is
    /// deleted.
    pub fn changed(&self, id: StreamId, seen_version: u64) -> Changed<'_> {
        let waiter = self.inner.next_waiter.get();
        self.inner.next_waiter.set(waiter + 1);
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
        let last = self.inner.next_lsn.get() - 1;
        let result = self.commit(last).durable().await;
        self.inner.readers.borrow_mut().clear();
        self.inner.stopping.set(true);
        self.wake_flusher();
        result
    }

    /// Wait until everything accepted so far is durable, write a checkpoint, then stop the
    /// flusher.
    pub async fn shutdown(&self) -> Result<(), StorageError> {
        let last = self.inner.next_lsn.get() - 1;
        let mut result = self.commit(last).durable().await;
        // A clean stop leaves a checkpoint at the head, so the next start replays nothing.
        if result.is_ok() && self.inner.logged_bytes.get() > self.inner.checkpointed_at.get() {
            result = self.checkpoint().await.map(|_| ());
        }
        self.inner.readers.borrow_mut().clear();
        self.inner.stopping.set(true);
        self.wake_flusher();
        result
    }

    fn memory(&self) -> bool {
        self.inner.cfg.durability == Durability::Memory
    }

    fn commit(&self, lsn: u64) -> Commit {
        Commit {
            inner: self.inner.clone(),
            lsn,
        }
    }

    fn insert_stream(&self, stream: Stream, lsn: u64) {
        let id = stream.id;
        if stream.incarnation > self.inner.last_incarnation.get() {
            self.inner.last_incarnation.set(stream.incarnation);
        }
        let visible = self.memory() || lsn <= self.inner.durable_lsn.get();
        let (tail, closed) = (stream.tail, stream.closed);
        if let Some(old) = self.inner.keys.borrow_mut().insert(stream.key.clone(), id) {
            if let Some(s) = self.inner.streams.borrow_mut().remove(&old) {
                s.notify();
            }
        }
        self.inner.streams.borrow_mut().insert(id, stream);
        if visible {
            self.make_visible(id, tail, closed);
        }
    }

    fn make_visible(&self, id: StreamId, tail: u64, closed: bool) {
        if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
            s.make_visible(tail, closed);
        }
    }

    /// Assign an LSN and queue the record for the next flush (memory: durable at once).
    /// Returns the LSN and, on disk, where the record will be.
    fn log_record(
        &self,
        record: &Record,
        create_effect: Option<(StreamId, u64, bool)>,
    ) -> Result<(u64, Option<DiskLoc>), StorageError> {
        if let Some(why) = self.inner.failed.borrow().as_ref() {
            return Err(StorageError::Failed(why.clone()));
        }
        let lsn = self.inner.next_lsn.get();
        let mut loc = None;
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            let at = log.enqueue(record, lsn, create_effect)?;
            self.inner
                .queued_bytes
                .set(self.inner.queued_bytes.get() + at.record_len as u64);
            self.inner
                .logged_bytes
                .set(self.inner.logged_bytes.get() + at.record_len as u64);
            self.inner
                .segments
                .borrow_mut()
                .entry(at.segment)
                .or_default()
                .insert(record.stream_id());
            loc = Some(at);
            self.wake_flusher();
        }
        self.inner.next_lsn.set(lsn + 1);
        if self.memory() {
            self.inner.durable_lsn.set(lsn);
        }
        Ok((lsn, loc))
    }

    fn set_effect_tail(&self, lsn: u64, id: StreamId, tail: u64, closed: bool) {
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            log.set_effect(lsn, id, tail, closed);
        }
    }

    fn wake_flusher(&self) {
        if let Some(w) = self.inner.flusher.borrow_mut().take() {
            w.wake();
        }
    }

    async fn run_flusher(self) {
        loop {
            poll_fn(|cx| {
                let ready = self.inner.stopping.get()
                    || self
                        .inner
                        .log
                        .borrow()
                        .as_ref()
                        .is_some_and(|l| l.has_pending());
                if ready {
                    Poll::Ready(())
                } else {
                    *self.inner.flusher.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            let batches = match self.inner.log.borrow_mut().as_mut() {
                Some(log) => log.take_batches(),
                None => return,
            };
            if batches.is_empty() {
                if self.inner.stopping.get() {
                    return;
                }
                continue;
            }
            // take_batches() took every queued record.
            self.inner
                .flushing_bytes
                .set(self.inner.queued_bytes.replace(0));
            let mut batches = batches;
            let flushed = self.flush(&mut batches).await;
            self.inner.flushing_bytes.set(0);
            match flushed {
                Ok(()) => self.complete(batches),
                Err(e) => self.fail(format!("log write failed: {e}")),
            }
        }
    }

    async fn flush(&self, batches: &mut [Batch]) -> Result<(), StorageError> {
        self.finish_zeroing_under(batches).await;
        let mut synced: Vec<Rc<monoio::fs::File>> = Vec::new();
        for batch in batches.iter_mut() {
            let file = {
                let mut log = self.inner.log.borrow_mut();
                let log = log.as_mut().ok_or_else(missing)?;
                log.file_for(batch.seg)?
            };
            let mut buf = batch.buf.take().ok_or_else(missing)?;
            let len = buf.len();
            // Pad to the block boundary with zeros (a recycled buffer holds old bytes there);
            // the next batch rewrites this partial block with more records.
            buf.set_len(align_up(len));
            buf.as_mut_full()[len..align_up(len)].fill(0);
            let (res, mut buf) = file.write_all_at(buf, batch.base).await;
            buf.set_len(len);
            batch.buf = Some(buf);
            res?;
            if !synced.iter().any(|f| Rc::ptr_eq(f, &file)) {
                synced.push(file);
            }
        }
        if let Some(last) = batches.last() {
            let end = last.base + last.buf.as_ref().map_or(0, |b| b.len()) as u64;
            let mut log = self.inner.log.borrow_mut();
            if let Some(log) = log.as_mut() {
                log.zero_ahead(last.seg, end);
            }
        }
        if self.inner.cfg.fail_fsync_after == Some(self.inner.stats.get().flushes) {
            return Err(io::Error::from_raw_os_error(libc::EIO).into());
        }
        for file in &synced {
            let started = Instant::now();
            if crate::fault::skips().fdatasync {
                continue;
            }
            file.sync_data().await?;
            self.count_fsync(started.elapsed());
        }
        Ok(())
    }

    /// Wait for the zeros being written ahead of the records if `batches` reach them (or
    /// belong to a later segment), so no data write races a zero write to the same blocks.
    /// Usually they were written long ago, and this only takes the buffer back.
    async fn finish_zeroing_under(&self, batches: &[Batch]) {
        let reached = |z: &Zeroing| {
            batches.iter().any(|b| {
                let end = b.base + align_up(b.buf.as_ref().map_or(0, |b| b.len())) as u64;
                b.seg != z.seg || end > z.from
            })
        };
        let zeroing = {
            let mut log = self.inner.log.borrow_mut();
            let Some(log) = log.as_mut() else { return };
            match log.zeroing.take() {
                Some(z) if reached(&z) => z,
                other => {
                    log.zeroing = other;
                    return;
                }
            }
        };
        let (res, zeros) = zeroing.write.await;
        if let Err(e) = res {
            // Only an optimisation failed: the data writes convert the blocks themselves,
            // and report any disk error on their own.
            tracing::warn!(
                shard = self.inner.cfg.shard,
                "writing zeros ahead failed: {e}"
            );
        }
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            log.zeros = Some(zeros);
        }
    }

    fn count_fsync(&self, took: Duration) {
        let mut stats = self.inner.stats.get();
        let us = took.as_micros() as u64;
        let slot = FSYNC_BUCKETS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(FSYNC_BUCKETS_US.len());
        stats.fsync_buckets[slot] += 1;
        stats.fsyncs += 1;
        stats.fsync_nanos += took.as_nanos() as u64;
        self.inner.stats.set(stats);
    }

    fn complete(&self, batches: Vec<Batch>) {
        let mut stats = self.inner.stats.get();
        stats.flushes += 1;
        for batch in batches {
            stats.records_flushed += batch.effects.len() as u64;
            stats.bytes_flushed += batch.buf.as_ref().map_or(0, |b| b.len()) as u64;
            for e in &batch.effects {
                if let Some((id, tail, closed)) = e.visible {
                    self.make_visible(id, tail, closed);
                }
                self.inner.durable_lsn.set(e.lsn);
            }
            if let Some(log) = self.inner.log.borrow_mut().as_mut() {
                if let Some(buf) = batch.buf {
                    log.pool.give(buf);
                }
            }
        }
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            // Sealed segments with nothing left to write no longer need a write handle.
            let oldest_queued = log.batches.front().map_or(log.write_seg, |b| b.seg);
            log.files.retain(|&k, _| k >= oldest_queued);
        }
        self.inner.stats.set(stats);
        for w in self.inner.commit_waiters.borrow_mut().drain(..) {
            w.wake();
        }
        self.evict_over_budget();
    }

    fn fail(&self, why: String) {
        tracing::error!(
            shard = self.inner.cfg.shard,
            "{why}; refusing further writes"
        );
        *self.inner.failed.borrow_mut() = Some(why);
        for w in self.inner.commit_waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Rebuild state from the segment files and position the writer after the last valid
    /// record.
    fn recover(&self, dir: &Path, report: &mut RecoveryReport) -> Result<Log, StorageError> {
        let cfg = &self.inner.cfg;
        let indexes = segment::list_segments(dir)?;
        let resume = self.load_checkpoint(dir)?;
        report.checkpoint_lsn = resume.map_or(0, |p| p.lsn);
        // With a checkpoint, replay starts right after its LSN at the position it names;
        // segments before that position are not read at all.
        let mut expected: Option<u64> = resume.map(|p| p.lsn + 1);
        let mut prev_index: Option<u64> = None;
        let mut tail: Option<(u64, u64, Bytes)> = None; // (segment, end of valid records, contents)
        let mut stop_at: Option<usize> = None;
        let mut stash = Stash::new();
        for (i, &index) in indexes.iter().enumerate() {
            if resume.is_some_and(|p| index < p.segment) {
                continue;
            }
            let path = segment::segment_path(dir, index);
            let buf = Bytes::from_owner(segment::read_whole(&path)?);
            let Some(header) = SegmentHeader::decode(&buf) else {
                // A crash while the last segment was being created leaves it without records:
                // it can go. Records behind a bad header are acknowledged data, and deleting
                // them would lose it; an operator has to look.
                let blank = buf
                    .get(DATA_START as usize..)
                    .is_none_or(|d| d.iter().all(|&b| b == 0));
                if i + 1 == indexes.len() && blank {
                    stop_at = Some(i);
                    break;
                }
                return Err(StorageError::Failed(format!(
                    "segment {} has a corrupt header",
                    path.display()
                )));
            };
            let resume_here = resume.filter(|p| p.segment == index);
            let adjacent = prev_index.is_some_and(|p| p + 1 == index);
            if let (Some(exp), None) = (expected, resume_here) {
                let chains = if adjacent {
                    header.first_lsn == exp
                } else {
                    header.first_lsn >= exp
                };
                if !chains {
                    stop_at = Some(i);
                    break;
                }
            }
            let (mut lsn, mut pos) = match resume_here {
                Some(p) => {
                    if p.offset < DATA_START || p.offset > buf.len() as u64 {
                        return Err(StorageError::Failed(format!(
                            "checkpoint resumes at position {} of segment {index}, outside it",
                            p.offset
                        )));
                    }
                    (p.lsn + 1, p.offset as usize)
                }
                None => (header.first_lsn, DATA_START as usize),
            };
            let scan_start = pos;
            let why = loop {
                match decode_at(&buf, pos) {
                    Ok(f) if f.lsn == lsn => {
                        let loc = DiskLoc {
                            segment: index,
                            record_pos: pos as u64,
                            record_len: f.len as u32,
                            data_off: 0,
                        };
                        self.replay(f.record, loc, &mut stash);
                        report.records += 1;
                        pos += f.len;
                        lsn += 1;
                    }
                    Ok(_) => break FrameError::Malformed,
                    Err(e) => break e,
                }
            };
            if why != FrameError::End {
                tracing::warn!(
                    shard = cfg.shard,
                    segment = index,
                    position = pos,
                    reason = ?why,
                    "log ends in a torn or corrupt record; truncating there"
                );
            }
            report.segments += 1;
            report.log_bytes += (pos - scan_start) as u64;
            expected = Some(lsn);
            prev_index = Some(index);
            tail = Some((index, pos as u64, buf));
        }
        if let Some(first_orphan) = stop_at {
            for &index in &indexes[first_orphan..] {
                tracing::warn!(
                    shard = cfg.shard,
                    segment = index,
                    "removing segment written after the end of the valid log"
                );
                std::fs::remove_file(segment::segment_path(dir, index))?;
                report.orphan_segments += 1;
            }
            segment::sync_dir(dir)?;
        }
        if let (Some(p), None) = (resume, &tail) {
            return Err(StorageError::Failed(format!(
                "the checkpoint continues the log in segment {}, but no segment from there on \
                 exists",
                p.segment
            )));
        }
        let next_lsn = expected.unwrap_or(1);
        self.inner.next_lsn.set(next_lsn);
        self.inner.durable_lsn.set(next_lsn - 1);
        let pool = BufPool::new(BATCH_BUF_BYTES, 4, POOLED_BUF_BYTES);
        let mut log = Log {
            dir: dir.to_path_buf(),
            shard: cfg.shard,
            segment_bytes: align_up(cfg.segment_bytes.max(MIN_SEGMENT_BYTES) as usize) as u64,
            write_seg: 0,
            write_end: DATA_START,
            files: HashMap::new(),
            batches: VecDeque::new(),
            pool,
            scratch: Vec::new(),
            spare: None,
            rolled_at: Instant::now(),
            spare_fill_time: cfg.spare_fill_time,
            spares_adopted: 0,
            zero_ahead_below: cfg.zero_ahead_below,
            ahead_end: DATA_START,
            ahead_moved_at: Instant::now(),
            ahead_moved_end: DATA_START,
            zeros: None,
            zeroing: None,
            zeroed_bytes: 0,
        };
        // A spare left by an earlier run may be half written; the next slow roll makes a
        // new one.
        segment::remove_spare(dir)?;
        match tail {
            Some((index, end, contents)) => {
                report.dropped_bytes = zero_stale_tail(dir, index, end, &contents)?;
                let file = segment::open_direct(&segment::segment_path(dir, index), false)?;
                log.files
                    .insert(index, Rc::new(monoio::fs::File::from_std(file)?));
                log.write_seg = index;
                log.write_end = end;
                log.ahead_end = end;
                log.ahead_moved_end = end;
                let base = align_down(end as usize);
                log.start_batch(index, base as u64, &contents[base..end as usize]);
            }
            None => {
                log.create(1, next_lsn)?;
                log.write_seg = 1;
                log.write_end = DATA_START;
                log.start_batch(1, DATA_START, &[]);
            }
        }
        if !stash.is_empty() {
            tracing::debug!(
                streams = stash.len(),
                "dropping data of streams deleted before cleaning"
            );
        }
        let mut live = 0;
        for s in self.inner.streams.borrow_mut().values_mut() {
            s.finish_recovery();
            let (tail, closed) = (s.tail, s.closed);
            s.make_visible(tail, closed);
            live += s.data_bytes();
        }
        self.inner.live_bytes.set(live);
        // A long replay is worth a checkpoint at the first upkeep round.
        self.inner.logged_bytes.set(report.log_bytes);
        self.remove_unreferenced_blobs(dir);
        let kept = &indexes[..stop_at.unwrap_or(indexes.len())];
        let mut segments = self.inner.segments.borrow_mut();
        for &index in kept {
            segments.entry(index).or_default();
        }
        // Segments before a checkpoint were not read; what the cleaner must preserve from
        // them is the stream data, found through the chunk tables.
        for s in self.inner.streams.borrow().values() {
            for loc in s.chunks().iter().filter_map(|c| c.loc()) {
                if kept.binary_search(&loc.segment).is_err() {
                    return Err(StorageError::Failed(format!(
                        "stream {} has data in segment {}, which is missing",
                        s.key, loc.segment
                    )));
                }
                segments.entry(loc.segment).or_default().insert(s.id);
            }
        }
        if segments.is_empty() {
            segments.insert(1, FastSet::default());
        }
        drop(segments);
        Ok(log)
    }

    /// Load the checkpoint, if there is one, into the shard. A checkpoint that cannot be
    /// read is fatal: the cleaner may already have dropped the log records it replaced.
    fn load_checkpoint(&self, dir: &Path) -> Result<Option<checkpoint::Position>, StorageError> {
        let _ = std::fs::remove_file(dir.join(checkpoint::TMP_NAME));
        let path = checkpoint::path(dir);
        let file = match std::fs::read(&path) {
            Ok(f) => Bytes::from(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (pos, saved) = checkpoint::decode(self.inner.cfg.shard, &file).map_err(|why| {
            StorageError::Failed(format!(
                "checkpoint {} is corrupt ({why}); the log before it may already be \
                 reclaimed, so a full replay cannot stand in for it: restore this data \
                 directory from a backup",
                path.display()
            ))
        })?;
        let now = crate::now_ms();
        for st in saved {
            let stream = Stream::from_checkpoint(&st.image, st.chunks, st.msg_starts, now);
            self.insert_stream(stream, 0);
        }
        self.inner
            .next_id
            .set(pos.next_id.max(self.inner.next_id.get()));
        let inc = self.inner.last_incarnation.get().max(pos.last_incarnation);
        self.inner.last_incarnation.set(inc);
        self.inner.blob_counter.set(pos.blob_counter);
        self.inner.checkpoint_segment.set(Some(pos.segment));
        self.inner.checkpoint_size.set(file.len() as u64);
        tracing::info!(
            shard = self.inner.cfg.shard,
            lsn = pos.lsn,
            streams = self.inner.streams.borrow().len(),
            "loaded checkpoint"
        );
        Ok(Some(pos))
    }

    /// Apply a recovered record. Stream data stays on disk until first read. Records of a
    /// stream whose creation was cleaned away are stashed until its image arrives.
    fn replay(&self, record: Record, loc: DiskLoc, stash: &mut Stash) {
        let now = crate::now_ms();
        let window = self.inner.cfg.receipt_window;
        let id = record.stream_id();
        self.inner
            .segments
            .borrow_mut()
            .entry(loc.segment)
            .or_default()
            .insert(id);
        self.inner.next_id.set(self.inner.next_id.get().max(id + 1));
        match record {
            Record::Create(c) => {
                let mut stream = Stream::from_create(&c, now);
                let loc = loc.with_data(c.initial.data.len());
                stream.apply_append(&c.initial, window, now, Some(loc), false);
                self.insert_stream(stream, 0);
            }
            Record::Append(a) => {
                let loc = loc.with_data(a.data.len());
                let mut streams = self.inner.streams.borrow_mut();
                match streams.get_mut(&a.id) {
                    Some(s) if a.start == s.tail => {
                        s.apply_append(&a, window, now, Some(loc), false);
                    }
                    Some(s) => add_chunks(s, &a, loc),
                    None => stash.entry(a.id).or_default().push((strip(a), loc)),
                }
            }
            Record::Relocate(a) => {
                let loc = loc.with_data(a.data.len());
                match self.inner.streams.borrow_mut().get_mut(&a.id) {
                    Some(s) => add_chunks(s, &a, loc),
                    None => stash.entry(a.id).or_default().push((strip(a), loc)),
                }
            }
            Record::Image(i) => {
                let known = self.inner.streams.borrow().contains_key(&i.id);
                if known {
                    if let Some(s) = self.inner.streams.borrow_mut().get_mut(&i.id) {
                        s.apply_image(&i);
                    }
                } else {
                    self.insert_stream(Stream::from_image(&i, now), 0);
                }
                if let Some(pending) = stash.remove(&i.id) {
                    if let Some(s) = self.inner.streams.borrow_mut().get_mut(&i.id) {
                        for (a, loc) in &pending {
                            add_chunks(s, a, *loc);
                        }
                    }
                }
            }
            Record::Delete { id } => {
                stash.remove(&id);
                if let Some(s) = self.inner.streams.borrow_mut().remove(&id) {
                    self.inner.keys.borrow_mut().remove(&s.key);
                }
            }
            Record::SetExt { id, ext } => {
                if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
                    s.ext = ext;
                }
            }
            // For a stream not known yet, its image (later in the log) carries both.
            Record::Snapshot { id, meta } => {
                if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
                    s.snapshot = Some(meta);
                }
            }
            Record::Retain {
                id,
                offset,
                first_record,
            } => {
                if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
                    s.retain(offset, first_record);
                }
            }
        }
    }

    /// Blob files no stream refers to (written for a publish that never committed, or
    /// dropped before a crash) are deleted at start.
    fn remove_unreferenced_blobs(&self, dir: &Path) {
        let blobs = dir.join("snapshots");
        let Ok(entries) = std::fs::read_dir(&blobs) else {
            return;
        };
        let referenced: HashSet<Box<str>> = self
            .inner
            .streams
            .borrow()
            .values()
            .filter_map(|s| s.snapshot.as_ref().map(|m| m.blob.clone()))
            .collect();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !referenced.contains(name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    fn add_live(&self, bytes: u64) {
        self.inner
            .live_bytes
            .set(self.inner.live_bytes.get() + bytes);
    }

    /// Segment files and the bytes they occupy (preallocated size), and live data bytes.
    pub fn disk_usage(&self) -> DiskUsage {
        let segments = self.inner.segments.borrow().len();
        DiskUsage {
            segments,
            segment_bytes: segments as u64 * self.segment_bytes(),
            live_bytes: self.inner.live_bytes.get(),
        }
    }

    fn segment_bytes(&self) -> u64 {
        self.inner
            .log
            .borrow()
            .as_ref()
            .map_or(self.inner.cfg.segment_bytes, |l| l.segment_bytes)
    }

    /// Background upkeep: reclaim log space once a second.
    async fn run_upkeep(self) {
        while !self.inner.stopping.get() {
            monoio::time::sleep(Duration::from_secs(1)).await;
            if self.inner.stopping.get() || self.failure().is_some() {
                continue;
            }
            self.collect_dead_blobs();
            if let Err(e) = self.clean().await {
                tracing::warn!(shard = self.inner.cfg.shard, "log cleaning failed: {e}");
            }
            if self.checkpoint_due() {
                if let Err(e) = self.checkpoint().await {
                    tracing::warn!(shard = self.inner.cfg.shard, "checkpoint failed: {e}");
                }
            }
        }
    }

    /// Whether enough log was written since the last checkpoint to write the next one:
    /// `checkpoint_bytes`, or [`CHECKPOINT_LOG_RATIO`] times the last checkpoint's size if
    /// that is more. A checkpoint holds every stream's chunk table and message index, so
    /// it grows with the retained data; at a fixed interval, a shard ingesting millions
    /// of small events a second rewrote a ~100 MB checkpoint every second, and throughput
    /// fell by a third as it grew. The ratio keeps checkpoint writes at most a quarter of
    /// the log's, and a restart replays at most that many times the checkpoint it loads.
    fn checkpoint_due(&self) -> bool {
        let since = self.inner.logged_bytes.get() - self.inner.checkpointed_at.get();
        let interval = self.inner.cfg.checkpoint_bytes.max(
            self.inner
                .checkpoint_size
                .get()
                .saturating_mul(CHECKPOINT_LOG_RATIO),
        );
        since >= interval
    }

    /// Write a checkpoint of every stream at the current head of the log, so the next start
    /// replays only what follows it. Returns false if nothing was written (memory mode, or
    /// the cleaner is running).
    pub async fn checkpoint(&self) -> Result<bool, StorageError> {
        if self.memory() || self.inner.upkeep_busy.replace(true) {
            return Ok(false);
        }
        let result = self.write_checkpoint().await;
        self.inner.upkeep_busy.set(false);
        result.map(|()| true)
    }

    /// Callers hold `upkeep_busy`.
    async fn write_checkpoint(&self) -> Result<(), StorageError> {
        let Some(dir) = self.inner.log.borrow().as_ref().map(|l| l.dir.clone()) else {
            return Ok(());
        };
        let result = self.write_checkpoint_in(&dir).await;
        if result.is_err() {
            let _ = std::fs::remove_file(dir.join(checkpoint::TMP_NAME));
        }
        result
    }

    async fn write_checkpoint_in(&self, dir: &Path) -> Result<(), StorageError> {
        let started = Instant::now();
        let (segment, offset) = match self.inner.log.borrow().as_ref() {
            Some(l) => (l.write_seg, l.write_end),
            None => return Ok(()),
        };
        let pos = checkpoint::Position {
            lsn: self.inner.next_lsn.get() - 1,
            segment,
            offset,
            next_id: self.inner.next_id.get(),
            last_incarnation: self.inner.last_incarnation.get(),
            blob_counter: self.inner.blob_counter.get(),
        };
        let logged = self.inner.logged_bytes.get();
        // Captured synchronously, so it is exactly the head state after record `pos.lsn`.
        let image = checkpoint::encode(
            self.inner.cfg.shard,
            pos,
            self.inner.streams.borrow().values(),
        );
        let bytes = image.len();
        let tmp = dir.join(checkpoint::TMP_NAME);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let file = monoio::fs::File::from_std(file)?;
        let (res, _) = file.write_all_at(image, 0).await;
        res?;
        file.sync_all().await?;
        drop(file);
        // The checkpoint may only replace the log before it once that log is durable.
        self.commit(pos.lsn).durable().await?;
        std::fs::rename(&tmp, checkpoint::path(dir))?;
        segment::sync_dir(dir)?;
        self.inner.checkpointed_at.set(logged);
        self.inner.checkpoint_size.set(bytes as u64);
        self.inner.checkpoint_segment.set(Some(pos.segment));
        tracing::debug!(
            shard = self.inner.cfg.shard,
            lsn = pos.lsn,
            bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }

    /// Reclaim space: while the segment files take more than twice the live data (plus the
    /// segment being written), move the live content of the oldest segment to the head of
    /// the log and delete it. A segment is only deleted once a checkpoint covers it.
    /// Returns the number of segments removed.
    pub async fn clean(&self) -> Result<usize, StorageError> {
        if self.inner.upkeep_busy.replace(true) {
            return Ok(0);
        }
        let result = self.clean_while_wasteful().await;
        self.inner.upkeep_busy.set(false);
        result
    }

    async fn clean_while_wasteful(&self) -> Result<usize, StorageError> {
        let mut removed = 0;
        loop {
            let write_seg = match self.inner.log.borrow().as_ref() {
                Some(l) => l.write_seg,
                None => return Ok(removed),
            };
            let Some(oldest) = self.inner.segments.borrow().keys().next().copied() else {
                return Ok(removed);
            };
            let usage = self.disk_usage();
            let seg = self.segment_bytes();
            if oldest >= write_seg || usage.segment_bytes <= 2 * usage.live_bytes + seg {
                return Ok(removed);
            }
            if self
                .inner
                .checkpoint_segment
                .get()
                .is_none_or(|c| oldest >= c)
            {
                self.write_checkpoint().await?;
            }
            self.clean_segment(oldest).await?;
            removed += 1;
        }
    }

    /// Rewrite what is still needed from `segment` (an image of every live stream with
    /// records there, and its chunks stored there) at the head, then delete the file.
    async fn clean_segment(&self, segment: u64) -> Result<(), StorageError> {
        // Everything in older segments must be durable before we rely on rewriting it.
        self.commit(self.inner.next_lsn.get() - 1).durable().await?;
        let ids: Vec<StreamId> = self
            .inner
            .segments
            .borrow()
            .get(&segment)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default();
        let mut moves = Vec::new();
        let mut last_lsn = 0;
        for id in ids {
            let (image, chunks) = match self.stream(id) {
                Some(s) => (s.image(), s.chunks_in_segment(segment)),
                None => continue,
            };
            last_lsn = self.log_record(&Record::Image(image), None)?.0;
            for (start, len, loc, msg_lens) in chunks {
                let cached = self.stream(id).and_then(|s| s.cached_chunk(start, len));
                let data = match cached {
                    Some(d) => d,
                    None => self.load(loc, len).await?,
                };
                if self.stream(id).is_none() {
                    break;
                }
                let rec = Record::Relocate(AppendRec {
                    id,
                    start,
                    append_lens: vec![len],
                    msg_lens,
                    data,
                    ..Default::default()
                });
                let (lsn, at) = self.log_record(&rec, None)?;
                if let Some(at) = at {
                    moves.push((id, start, at.with_data(len as usize)));
                }
                last_lsn = lsn;
            }
        }
        if last_lsn > 0 {
            self.commit(last_lsn).durable().await?;
        }
        for (id, start, loc) in moves {
            if let Some(s) = self.inner.streams.borrow_mut().get_mut(&id) {
                s.relocate(start, loc);
            }
        }
        self.inner.segments.borrow_mut().remove(&segment);
        self.inner.readers.borrow_mut().remove(&segment);
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            log.files.remove(&segment);
            std::fs::remove_file(segment_path(&log.dir, segment))?;
            segment::sync_dir(&log.dir)?;
        }
        tracing::debug!(shard = self.inner.cfg.shard, segment, "segment reclaimed");
        Ok(())
    }
}

/// Recovered chunks waiting for the image of their stream.
type Stash = HashMap<StreamId, Vec<(AppendRec, DiskLoc)>>;

/// An append without its data (recovery only needs the boundaries and the location).
fn strip(a: AppendRec) -> AppendRec {
    AppendRec {
        data: Bytes::new(),
        producer: None,
        stream_seq: None,
        ..a
    }
}

/// Add the chunks of a (possibly stripped) append at `loc` to a recovering stream.
fn add_chunks(s: &mut Stream, a: &AppendRec, loc: DiskLoc) {
    let mut pos = 0u64;
    let mut msgs = a.msg_lens.iter().copied().peekable();
    for &len in a.append_lens.iter().filter(|&&l| l > 0) {
        // Messages never straddle write operations: take those inside this one.
        let mut lens = Vec::new();
        let mut inside = 0u64;
        while inside < len as u64 {
            let Some(m) = msgs.next() else { break };
            lens.push(m);
            inside += m as u64;
        }
        let chunk_loc = DiskLoc {
            data_off: loc.data_off + pos as u32,
            ..loc
        };
        s.add_recovered_chunk(a.start + pos, len, &lens, chunk_loc);
        pos += len as u64;
    }
}

/// Space taken by a shard's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    pub segments: usize,
    /// Preallocated bytes of all segment files.
    pub segment_bytes: u64,
    pub live_bytes: u64,
}

fn missing() -> StorageError {
    StorageError::Failed("internal: stream vanished during a write".into())
}

/// Zero whatever follows the last valid record in the segment we continue writing, so a
/// half-written record from before the crash can never line up with new records and be
/// read back as valid. Returns the number of non-zero bytes dropped.
fn zero_stale_tail(dir: &Path, index: u64, end: u64, contents: &[u8]) -> Result<u64, StorageError> {
    let end = end as usize;
    let Some(last_nonzero) = contents[end.min(contents.len())..]
        .iter()
        .rposition(|&b| b != 0)
        .map(|p| end + p)
    else {
        return Ok(0);
    };
    let dropped = (last_nonzero + 1 - end) as u64;
    tracing::warn!(
        segment = index,
        bytes = dropped,
        "zeroing the discarded log tail"
    );
    let start = align_down(end);
    let stop = align_up(last_nonzero + 1);
    let mut buf = AlignedBuf::with_capacity(stop - start);
    buf.extend_from_slice(&contents[start..end]);
    buf.set_len(stop - start);
    let file = segment::open_direct(&segment::segment_path(dir, index), false)?;
    segment::write_all_at_blocking(&file, buf.as_slice(), start as u64)?;
    file.sync_data()?;
    Ok(dropped)
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
        match self.shard.inner.streams.borrow().get(&self.stream) {
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
        if let Ok(streams) = self.shard.inner.streams.try_borrow() {
            if let Some(s) = streams.get(&self.stream) {
                s.unregister_waiter(self.waiter);
            }
        }
    }
}

/// Resolves when an accepted change is durable (or the shard has failed).
pub struct Commit {
    inner: Rc<Inner>,
    lsn: u64,
}

impl Commit {
    pub async fn durable(self) -> Result<(), StorageError> {
        poll_fn(|cx| {
            if self.inner.durable_lsn.get() >= self.lsn {
                return Poll::Ready(Ok(()));
            }
            if let Some(why) = self.inner.failed.borrow().as_ref() {
                return Poll::Ready(Err(StorageError::Failed(why.clone())));
            }
            self.inner
                .commit_waiters
                .borrow_mut()
                .push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// The durable write path of one shard.
struct Log {
    dir: PathBuf,
    shard: u32,
    segment_bytes: u64,
    /// Segment receiving new records, and the position after the last one.
    write_seg: u64,
    write_end: u64,
    files: HashMap<u64, Rc<monoio::fs::File>>,
    /// Batches waiting for the flusher, oldest first; the last one is open for appends.
    batches: VecDeque<Batch>,
    pool: BufPool,
    scratch: Vec<u8>,
    /// A zero-filled segment being prepared on a helper thread for the next roll.
    spare: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// When the log last rolled (or opened): how fast the current segment fills.
    rolled_at: Instant,
    /// `ShardConfig::spare_fill_time`.
    spare_fill_time: Duration,
    /// Segments made from a spare.
    spares_adopted: u64,
    /// The active segment's blocks below this position hold records or zeros, or were
    /// left to the data writes because the log filled fast (see `zero_ahead`).
    ahead_end: u64,
    /// When `ahead_end` last moved, and where the records ended then: how fast the log fills.
    ahead_moved_at: Instant,
    ahead_moved_end: u64,
    /// `ShardConfig::zero_ahead_below`.
    zero_ahead_below: u64,
    /// `ZERO_AHEAD_BYTES` of zeros; `None` while lent to the kernel.
    zeros: Option<AlignedBuf>,
    /// The zero write in flight, if any.
    zeroing: Option<Zeroing>,
    /// Bytes of zeros written ahead of the records.
    zeroed_bytes: u64,
}

/// Zeros being written to `[from, ..)` of segment `seg`, ahead of the records.
struct Zeroing {
    seg: u64,
    from: u64,
    write: monoio::task::JoinHandle<(io::Result<()>, AlignedBuf)>,
}

/// Records bound for one contiguous, block-aligned range of one segment.
struct Batch {
    seg: u64,
    /// Block-aligned segment position where `buf` starts.
    base: u64,
    /// `None` only while the flusher has lent it to the kernel.
    buf: Option<AlignedBuf>,
    /// LSN of the first record in the batch (0 while it holds none).
    first_lsn: u64,
    effects: Vec<Effect>,
}

struct Effect {
    lsn: u64,
    /// Stream made readable up to (tail, closed) once this record is durable.
    visible: Option<(StreamId, u64, bool)>,
}

impl Log {
    fn has_pending(&self) -> bool {
        self.batches.iter().any(|b| !b.effects.is_empty())
    }

    /// Open a new batch at `base`, starting with the already-written bytes of its first block.
    fn start_batch(&mut self, seg: u64, base: u64, carried: &[u8]) {
        let mut buf = self.pool.take(BATCH_BUF_BYTES);
        buf.extend_from_slice(carried);
        self.batches.push_back(Batch {
            seg,
            base,
            buf: Some(buf),
            first_lsn: 0,
            effects: Vec::new(),
        });
    }

    fn enqueue(
        &mut self,
        record: &Record,
        lsn: u64,
        visible: Option<(StreamId, u64, bool)>,
    ) -> Result<DiskLoc, StorageError> {
        let len = record.framed_len();
        if len as u64 > self.segment_bytes - DATA_START {
            return Err(StorageError::TooLarge);
        }
        if self.write_end + len as u64 > self.segment_bytes {
            self.roll(lsn)?;
        }
        let batch = self
            .batches
            .back_mut()
            .expect("an open batch always exists");
        let buf = batch.buf.as_mut().expect("open batch owns its buffer");
        if buf.len() + len > buf.capacity() {
            let mut bigger = self.pool.take((buf.len() + len).max(buf.capacity() * 2));
            bigger.extend_from_slice(buf.as_slice());
            let old = std::mem::replace(buf, bigger);
            self.pool.give(old);
        }
        let buf = batch.buf.as_mut().expect("open batch owns its buffer");
        let loc = DiskLoc {
            segment: self.write_seg,
            record_pos: self.write_end,
            record_len: len as u32,
            data_off: 0,
        };
        record.encode_with(lsn, &mut self.scratch, |piece| buf.extend_from_slice(piece));
        if batch.first_lsn == 0 {
            batch.first_lsn = lsn;
        }
        batch.effects.push(Effect { lsn, visible });
        self.write_end += len as u64;
        debug_assert_eq!(batch.base + buf.len() as u64, self.write_end);
        Ok(loc)
    }

    fn set_effect(&mut self, lsn: u64, id: StreamId, tail: u64, closed: bool) {
        for batch in self.batches.iter_mut().rev() {
            if let Some(e) = batch.effects.iter_mut().rev().find(|e| e.lsn == lsn) {
                e.visible = Some((id, tail, closed));
                return;
            }
        }
    }

    /// Continue in a fresh segment whose first record will be `first_lsn`; the current one
    /// is sealed once its last batch is durable. The file is created (and its space
    /// reserved) here, before the caller changes any state, so a full disk is reported as
    /// `NoSpace` with nothing changed. This blocks the core for one fallocate and two
    /// fsyncs, once per segment.
    fn roll(&mut self, first_lsn: u64) -> Result<(), StorageError> {
        let next = self.write_seg + 1;
        self.create(next, first_lsn)?;
        self.write_seg = next;
        self.write_end = DATA_START;
        self.start_batch(next, DATA_START, &[]);
        let filled_in = self.rolled_at.elapsed();
        self.rolled_at = Instant::now();
        if self.spare.is_none() && filled_in >= self.spare_fill_time {
            let (dir, size) = (self.dir.clone(), self.segment_bytes);
            let spawned = std::thread::Builder::new()
                .name(format!("ursula-spare-{}", self.shard))
                .spawn(move || segment::prepare_spare(&dir, size));
            match spawned {
                Ok(handle) => self.spare = Some(handle),
                Err(e) => tracing::warn!(shard = self.shard, "no spare segment: {e}"),
            }
        }
        Ok(())
    }

    fn create(&mut self, seg: u64, first_lsn: u64) -> Result<(), StorageError> {
        let header = SegmentHeader {
            shard: self.shard,
            index: seg,
            first_lsn,
        };
        let adopted = if self.spare_ready() {
            segment::adopt_spare(&self.dir, header, self.segment_bytes)
                .inspect_err(|e| {
                    tracing::warn!(shard = self.shard, "spare segment not used: {e}");
                    let _ = segment::remove_spare(&self.dir);
                })
                .ok()
        } else {
            None
        };
        let (file, ahead_end) = match adopted {
            Some(file) => {
                self.spares_adopted += 1;
                (file, self.segment_bytes)
            }
            None => (
                segment::create_segment(&self.dir, header, self.segment_bytes)?,
                DATA_START,
            ),
        };
        self.ahead_end = ahead_end;
        self.ahead_moved_end = DATA_START;
        let file = Rc::new(monoio::fs::File::from_std(file)?);
        // Older handles are dropped after their last batch is flushed (see complete()).
        self.files.insert(seg, file);
        Ok(())
    }

    /// Whether a spare segment is ready to adopt: its helper thread has finished, and
    /// succeeded. One still being prepared stays for a later roll; the core never waits.
    fn spare_ready(&mut self) -> bool {
        let Some(handle) = self.spare.take() else {
            return false;
        };
        if !handle.is_finished() {
            self.spare = Some(handle);
            return false;
        }
        match handle.join() {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(shard = self.shard, "preparing a spare segment failed: {e}");
                false
            }
            Err(_) => false,
        }
    }

    /// Hand every batch that holds records to the flusher, leaving an open batch that starts
    /// with the partially filled last block.
    fn take_batches(&mut self) -> Vec<Batch> {
        if !self.has_pending() {
            return Vec::new();
        }
        let taken: Vec<Batch> = self.batches.drain(..).collect();
        let last = taken.last().expect("non-empty");
        let buf = last.buf.as_ref().expect("owned");
        let end = last.base + buf.len() as u64;
        let base = align_down(end as usize) as u64;
        let carried = &buf.as_slice()[(base - last.base) as usize..];
        let (seg, carried) = (last.seg, carried.to_vec());
        self.start_batch(seg, base, &carried);
        taken
            .into_iter()
            .filter(|b| !b.effects.is_empty())
            .collect()
    }

    /// After a flush that ended at `end` of segment `seg`: start writing zeros over the
    /// blocks the next records will land on, if the log fills slowly.
    ///
    /// Segments are reserved with `fallocate`, so ext4 marks their extents unwritten. An
    /// O_DIRECT write to unwritten blocks cannot be issued without blocking (io_uring hands it
    /// to a kernel worker thread), and it changes extent metadata that the next fdatasync
    /// must write out. At a slow fill every small group commit would pay both; zeroing the
    /// next `ZERO_AHEAD_BYTES` in one write pays once for all the commits that land there.
    /// The zero write runs beside the commits; `Shard::finish_zeroing_under` makes a flush
    /// wait for it only if the records catch up with it. At a fast fill the commits are
    /// large, the conversions already few, and writing every block twice would cost
    /// bandwidth, so the blocks are left to the data writes.
    fn zero_ahead(&mut self, seg: u64, end: u64) {
        // Move on when the records reach the middle of the zeroed range, so the next commits
        // keep landing on zeros.
        if seg != self.write_seg
            || end + ZERO_AHEAD_BYTES / 2 <= self.ahead_end
            || self.zeroing.is_some()
        {
            return;
        }
        let from = self.ahead_end.max(align_up(end as usize) as u64);
        let to = (from + ZERO_AHEAD_BYTES).min(self.segment_bytes);
        // How fast the records came since the last decision (a large flush can jump far).
        let filled = (end - self.ahead_moved_end.min(end)) as f64;
        let slow = self.zero_ahead_below > 0
            && filled <= self.ahead_moved_at.elapsed().as_secs_f64() * self.zero_ahead_below as f64;
        self.ahead_end = to;
        self.ahead_moved_at = Instant::now();
        self.ahead_moved_end = end;
        let Some(file) = self.files.get(&seg).cloned() else {
            return;
        };
        if !slow || from >= to {
            return;
        }
        let mut zeros = self
            .zeros
            .take()
            .unwrap_or_else(|| AlignedBuf::with_capacity(ZERO_AHEAD_BYTES as usize));
        zeros.set_len((to - from) as usize);
        self.zeroed_bytes += to - from;
        let write = monoio::spawn(async move {
            let (res, zeros) = file.write_all_at(zeros, from).await;
            (res.map(|_| ()), zeros)
        });
        self.zeroing = Some(Zeroing { seg, from, write });
    }

    /// The write handle of segment `seg` (created when the log rolled into it).
    fn file_for(&self, seg: u64) -> Result<Rc<monoio::fs::File>, StorageError> {
        self.files
            .get(&seg)
            .cloned()
            .ok_or_else(|| StorageError::Failed(format!("segment {seg} has no write handle")))
    }
}

/// Check the record that `loc` names, found at `at` in `buf`: its checksum, and that it is
/// still the record the chunk table points at (same framed length).
fn verify_record(buf: &Bytes, at: usize, loc: DiskLoc) -> Result<(), StorageError> {
    let framed = decode_at(buf, at).map_err(|e| {
        StorageError::Corrupt(format!(
            "segment {} position {}: {e:?}",
            loc.segment, loc.record_pos
        ))
    })?;
    if framed.len != loc.record_len as usize {
        return Err(StorageError::Corrupt(format!(
            "segment {} position {}: record length changed",
            loc.segment, loc.record_pos
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ProducerStamp;
    use crate::test_support::block_on;

    fn config(dir: &Path) -> ShardConfig {
        let mut cfg = ShardConfig::new(0, Durability::Disk(dir.to_path_buf()));
        cfg.segment_bytes = 0; // raised to the minimum that fits the largest record
        cfg
    }

    fn new_stream(key: &str, data: &[u8]) -> NewStream {
        NewStream {
            key: key.into(),
            incarnation: 7,
            created_ms: 1,
            content_type: "text/plain".into(),
            lifetime: Lifetime::TtlSeconds(60),
            ext: Bytes::from_static(b"ext"),
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

    async fn read_all(shard: &Shard, key: &str) -> Vec<u8> {
        let id = shard.lookup(key).expect("stream exists");
        shard.read(id, 0, u64::MAX).await.expect("read").concat()
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
            assert_eq!((receipt.start, receipt.next), (6, 11));
            assert_eq!(
                shard.read(id, 0, 100).await.expect("read").concat(),
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
            assert_eq!((report.checkpoint_lsn, report.records), (5, 0));
            assert_eq!(report.dropped_bytes, 0);
            assert_eq!(read_all(&shard, "a").await, b"hello world");
            assert!(shard.lookup("gone").is_none());
            {
                let s = shard.stream_by_key("a").expect("a");
                assert!(s.visible_closed && s.closed);
                assert_eq!(s.incarnation, 7);
                assert_eq!(s.lifetime, Lifetime::TtlSeconds(60));
                assert_eq!(&s.ext[..], b"ext");
                assert_eq!(s.last_stream_seq.as_deref(), Some(&b"s1"[..]));
                let p = &s.producers["p"];
                assert_eq!((p.epoch, p.last_seq), (2, 0));
                assert_eq!(p.receipt(0).map(|r| r.next), Some(11));
            }
            // Writing continues after the recovered records.
            let id = shard.lookup("a").expect("a");
            assert!(shard.next_incarnation(0) > 7);
            let (_, c) = shard.create(new_stream("b", b"more")).expect("create");
            c.durable().await.expect("durable");
            assert_eq!(shard.stream(id).map(|s| s.tail), Some(11));
            shard.shutdown().await.expect("shutdown");
        });
        block_on(async {
            let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
            assert_eq!((report.checkpoint_lsn, report.records), (6, 0));
            assert_eq!(read_all(&shard, "b").await, b"more");
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
                assert_eq!(shard.stream(id).map(|s| s.visible_tail), Some(2000));
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
        let seg = segment::segment_path(&seg_dir, 1);
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
            let header = SegmentHeader::decode(&h[..crate::aligned::BLOCK]).expect("valid header");
            assert_eq!(header.index, i);
        }
        // A spare left half-made by a crash is removed at open; the data is intact.
        std::fs::write(&spare, b"torn").expect("write spare");
        block_on(async {
            let (shard, report) = Shard::open(cfg.clone()).await.expect("reopen");
            assert_eq!(report.dropped_bytes, 0);
            assert!(!spare.exists(), "leftover spare removed");
            let tail = shard.stream_by_key("a").expect("a").visible_tail;
            assert_eq!(tail, appends * big.len() as u64);
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
                        let data: Vec<u8> =
                            (0..len).map(|b| (b as u32 ^ round ^ i) as u8).collect();
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
                    (log.write_seg, align_up(log.write_end as usize) as u64 + gap)
                };
                // Stands in for a zero write that the disk is slow to finish.
                let done = Rc::new(Cell::new(false));
                let finished = done.clone();
                let write = monoio::spawn(async move {
                    monoio::time::sleep(Duration::from_millis(300)).await;
                    finished.set(true);
                    (Ok(()), AlignedBuf::with_capacity(crate::aligned::BLOCK))
                });
                let zeroing = Zeroing { seg, from, write };
                shard.inner.log.borrow_mut().as_mut().expect("log").zeroing = Some(zeroing);
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
            .and_then(|l| l.spare.as_ref())
            .is_some_and(|h| !h.is_finished())
    }

    #[test]
    fn segments_roll_and_orphans_after_a_break_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seg_dir = dir.path().join("shard-0");
        let big = vec![7u8; 20 << 20];
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
        let segs = segment::list_segments(&seg_dir).expect("list");
        assert!(segs.len() >= 2, "expected a roll, got {segs:?}");
        block_on(async {
            let (shard, report) = Shard::open(config(dir.path())).await.expect("reopen");
            assert_eq!(report.segments, segs.len());
            let s = shard.stream_by_key("a").expect("a");
            assert_eq!(s.visible_tail, 6 * big.len() as u64);
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
            let tail = shard.stream_by_key("a").expect("a").visible_tail;
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
                let got = shard.read(id, 0, u64::MAX).await.expect("read");
                assert_eq!(got.concat(), *want, "stream s{s}");
                let reads = shard.stats().disk_reads - before;
                assert!(
                    reads * 20 < chunks,
                    "{reads} disk reads for {chunks} chunks"
                );
                // A mid-chunk range, now served from the cache.
                let part = shard.read(id, 1_001, 50_003).await.expect("read").concat();
                assert_eq!(part, &want[1_001..50_003]);
                assert_eq!(shard.stats().disk_reads - before, reads, "cached again");
                let pieces = shard.read(id, 0, u64::MAX).await.expect("read").len() as u64;
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
            let expected: Vec<u8> = (0..40).flat_map(chunk).collect();
            assert_eq!(
                shard.read(id, 0, u64::MAX).await.expect("read").concat(),
                expected
            );
            // A read spanning cold chunks, starting and ending mid-chunk.
            let part = shard
                .read(id, 15_000, 123_456)
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
            let id = shard.lookup("a").expect("a");
            let expected: Vec<u8> = (0..40).flat_map(chunk).collect();
            assert_eq!(
                shard.read(id, 0, u64::MAX).await.expect("read").concat(),
                expected
            );
        });
        // Corrupt one record in place: reading it fails instead of serving bad bytes.
        let seg = segment::segment_path(&dir.path().join("shard-0"), 1);
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
            let tail = shard.stream(id).expect("a").visible_tail;
            assert_eq!(tail, 3 * 10_000);
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
                let st = shard.stream_by_key(&format!("s{s}")).expect("stream");
                assert_eq!(st.tail, expected_tail);
                assert_eq!(st.message_count(), per_stream as u64);
            }
            let st = shard.stream_by_key("s0").expect("s0");
            let p = &st.producers["p"];
            assert_eq!(p.last_seq, per_stream as u64 - 1);
            assert_eq!(p.receipt(p.last_seq).map(|r| r.next), Some(expected_tail));
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
                shard.stream(id).map(|s| s.visible_tail),
                Some(5 * big.len() as u64)
            );
            stop_without_checkpoint(&shard).await;
        });
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
            let mut total = 0u64;
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
                let s = shard.stream(id).expect("s");
                assert_eq!(s.retained_start, at);
                assert_eq!(s.first_message(), 10);
                assert_eq!(s.message_count(), 20);
                assert_eq!(s.message_start(10), Some(at));
                assert_eq!(s.message_start(9), None, "trimmed ordinals are gone");
            }
            let read = shard.read(id, at, u64::MAX).await.expect("read").concat();
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
                let s = shard.stream(id).expect("s");
                assert_eq!(s.retained_start, retain_at);
                assert_eq!(s.first_message(), 10);
                assert_eq!(s.message_count(), 20);
                assert_eq!(s.message_start(10), Some(retain_at));
                assert_eq!(s.visible_tail, total);
                s.snapshot.clone().expect("snapshot survives")
            };
            assert_eq!(meta.offset, retain_at);
            assert_eq!(
                shard.read_blob(&meta).await.expect("blob"),
                &b"folded state"[..]
            );
            let read = shard
                .read(id, retain_at, u64::MAX)
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
                let s = shard.stream(id).expect("listed");
                let mut producers: Vec<_> = s
                    .producers
                    .iter()
                    .map(|(k, p)| format!("{k}:{}:{}:{:?}", p.epoch, p.last_seq, p.receipts))
                    .collect();
                producers.sort();
                let starts: Vec<_> = (s.first_message()..s.message_count())
                    .map(|o| s.message_start(o))
                    .collect();
                format!(
                    "{key} inc={} tail={}/{} closed={}/{} ext={:?} seq={:?} retained={} \
                     msgs={}..{} starts={starts:?} producers={producers:?}",
                    s.incarnation,
                    s.tail,
                    s.visible_tail,
                    s.closed,
                    s.visible_closed,
                    s.ext,
                    s.last_stream_seq,
                    s.retained_start,
                    s.first_message(),
                    s.message_count(),
                )
            };
            let from = shard.stream(id).map_or(0, |s| s.retained_start);
            let data = shard.read(id, from, u64::MAX).await.expect("read").concat();
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
            let size = shard.inner.checkpoint_size.get();
            assert!(size > 2000, "the index of 2000 messages is in it: {size}");

            // Less than four checkpoints' worth of log since: not yet, though well over
            // checkpoint_bytes.
            let since =
                |shard: &Shard| shard.inner.logged_bytes.get() - shard.inner.checkpointed_at.get();
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
            assert!(shard.inner.checkpoint_size.get() > 2000);
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
                .retain(a, 8)
                .expect("retain")
                .durable()
                .await
                .expect("ok");
            assert!(shard.checkpoint().await.expect("checkpoint"));
            let lsn = shard.inner.next_lsn.get() - 1;
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
            assert_eq!((r.record_start, r.record_next), (4, 5));
            c.durable().await.expect("durable");
            shard.shutdown().await.expect("shutdown");
        });
        block_on(async {
            let (shard, report) = Shard::open(cfg).await.expect("reopen");
            assert_eq!(report.records, 0);
            let s = shard.stream_by_key("a").expect("a");
            assert_eq!((s.first_message(), s.message_count()), (1, 5));
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
        let err = block_on(async { Shard::open(config(dir.path())).await.err() })
            .expect("refuses to start");
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
            let mut lsn = 0;
            for i in 0..per_stream {
                if i == 100 {
                    assert!(shard.checkpoint().await.expect("checkpoint"));
                    lsn = shard.inner.next_lsn.get() - 1;
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
    fn a_failed_fsync_acknowledges_nothing_and_stops_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = config(dir.path());
        cfg.fail_fsync_after = Some(2);
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
        cfg.fail_fsync_after = None;
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
            shard.clean_segment(1).await.expect("clean segment 1");
            let reader = shard.clone();
            let read = monoio::spawn(async move { reader.read(id, 0, u64::MAX).await });
            shard.clean_segment(2).await.expect("clean segment 2");
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
}
