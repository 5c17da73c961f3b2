//! One stream's state as the owning shard keeps it in memory.
//!
//! Two watermarks matter: the *head* (`tail`, `closed`) includes appends that are queued for
//! the next group commit, and is what write-path checks (producers, `Stream-Seq`, closure)
//! judge against so that appends on one core are totally ordered; the *visible* watermark
//! (`visible_tail`, `visible_closed`) only moves once the log is durable, and is the only
//! thing readers ever see.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::task::Waker;

use bytes::Bytes;

use crate::cache::{Extent, StreamCache};
use crate::packed::{get_signed, get_varint, put_signed, put_varint, Delta, Memo, Packed};
use crate::position::{Offset, RecordNo, SegmentNo};
use crate::record::{AppendRec, CreateRec, ImageRec, ProducerImage, SnapshotMeta, StreamMeta};
use crate::waiters::WaiterSet;

/// Shard-local stream identifier; never reused while the process runs.
pub type StreamId = u64;

/// One append's bytes in a stream (a PUT body, a POST body, a batch frame): where they
/// start, their first message, and where they are in the log.
///
/// A stream keeps one of these for every retained append. The newest are held as they are,
/// in 40 bytes (a plain `Option<Bytes>` + `Option<DiskLoc>` layout took 88); older ones are
/// frozen into delta-encoded blocks of about 12 bytes per chunk (`crate::packed`). Cached
/// bytes live beside the table (`Stream::cache`), since most chunks are not cached.
#[derive(Clone, Copy, Debug)]
pub struct Chunk {
    /// Stream offset of the first byte.
    pub start: Offset,
    /// Ordinal (index into the message index) of the first message in this chunk.
    pub first_msg: RecordNo,
    pub len: u32,
    /// Where the bytes are in the log, as the fields of a `DiskLoc`; `segment` is
    /// `NOWHERE` in memory mode, where chunks only exist in the cache.
    segment: u32,
    record_pos: u64,
    record_len: u32,
    data_off: u32,
}

/// A chunk as a delta from the one before it in its stream: its start from the previous
/// end (0 while they tile), its location from the previous location (a stream's records sit
/// close together in a segment, but a relocated one may lie anywhere).
impl Delta for Chunk {
    fn put(&self, prev: &Chunk, out: &mut Vec<u8>) {
        put_signed(out, self.start.get().wrapping_sub(prev.end().get()) as i64);
        put_varint(out, u64::from(self.len));
        put_signed(
            out,
            self.first_msg.get().wrapping_sub(prev.first_msg.get()) as i64,
        );
        put_signed(
            out,
            i64::from(self.segment.wrapping_sub(prev.segment) as i32),
        );
        put_signed(out, self.record_pos.wrapping_sub(prev.record_pos) as i64);
        put_varint(out, u64::from(self.record_len));
        put_varint(out, u64::from(self.data_off));
    }

    fn get(prev: &Chunk, buf: &[u8], at: &mut usize) -> Chunk {
        let start = Offset::new(prev.end().get().wrapping_add(get_signed(buf, at) as u64));
        Chunk {
            start,
            len: get_varint(buf, at) as u32,
            first_msg: RecordNo::new(
                prev.first_msg
                    .get()
                    .wrapping_add(get_signed(buf, at) as u64),
            ),
            segment: prev.segment.wrapping_add(get_signed(buf, at) as i32 as u32),
            record_pos: prev.record_pos.wrapping_add(get_signed(buf, at) as u64),
            record_len: get_varint(buf, at) as u32,
            data_off: get_varint(buf, at) as u32,
        }
    }

    fn origin() -> Chunk {
        Chunk::new(Offset::ZERO, 0, None)
    }

    fn memo() -> &'static std::thread::LocalKey<RefCell<Memo<Chunk>>> {
        thread_local!(static MEMO: RefCell<Memo<Chunk>> = RefCell::new(Memo::default()));
        &MEMO
    }
}

/// `Chunk::segment` of a chunk that is not in the log.
const NOWHERE: u32 = u32::MAX;

/// Position of a chunk's bytes inside a log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskLoc {
    pub segment: SegmentNo,
    /// Segment position of the record's frame header.
    pub record_pos: u64,
    /// Framed length of the record.
    pub record_len: u32,
    /// Offset of the chunk's first byte from the record start.
    pub data_off: u32,
}

impl DiskLoc {
    /// The location of a record whose last `data_len` bytes are stream data.
    pub(crate) fn with_data(self, data_len: usize) -> DiskLoc {
        DiskLoc {
            data_off: self.record_len - data_len as u32,
            ..self
        }
    }
}

impl Chunk {
    /// A chunk whose first record ordinal is not known yet (recovery numbers it).
    pub(crate) fn unnumbered(start: Offset, len: u32, loc: DiskLoc) -> Chunk {
        Chunk::new(start, len, Some(loc))
    }

    fn new(start: Offset, len: u32, loc: Option<DiskLoc>) -> Chunk {
        let mut c = Chunk {
            start,
            first_msg: RecordNo::ZERO,
            len,
            segment: NOWHERE,
            record_pos: 0,
            record_len: 0,
            data_off: 0,
        };
        c.set_loc(loc);
        c
    }

    pub fn end(&self) -> Offset {
        self.start + u64::from(self.len)
    }

    /// Where the chunk's bytes are in the log (none in memory mode).
    pub(crate) fn loc(&self) -> Option<DiskLoc> {
        (self.segment != NOWHERE).then_some(DiskLoc {
            segment: SegmentNo::new(u64::from(self.segment)),
            record_pos: self.record_pos,
            record_len: self.record_len,
            data_off: self.data_off,
        })
    }

    fn set_loc(&mut self, loc: Option<DiskLoc>) {
        let Some(l) = loc else {
            self.segment = NOWHERE;
            return;
        };
        // Segment numbers count segment files, one per `segment_bytes` (>= 1 MiB) of log:
        // 2^32 - 1 of them is an exabyte written to one shard.
        self.segment = u32::try_from(l.segment.get())
            .ok()
            .filter(|&s| s != NOWHERE)
            .expect("segment number below 2^32 - 1");
        self.record_pos = l.record_pos;
        self.record_len = l.record_len;
        self.data_off = l.data_off;
    }
}

/// How to produce one piece of a read: from memory, or from a log record on disk.
#[derive(Clone, Debug)]
pub enum Piece {
    Memory(Bytes),
    Disk {
        loc: DiskLoc,
        /// Stream offset of the chunk (identifies it for re-caching).
        chunk_start: Offset,
        chunk_len: u32,
        /// Byte range wanted within the chunk.
        from: usize,
        to: usize,
    },
}

/// What an accepted producer append returned, kept so retries get the same answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub seq: u64,
    pub start: Offset,
    pub next: Offset,
    pub record_start: RecordNo,
    pub record_next: RecordNo,
}

#[derive(Clone, Debug)]
pub struct Producer {
    pub epoch: u64,
    pub last_seq: u64,
    pub last_used_ms: i64,
    /// Most recent receipts of the current epoch, oldest first, bounded by the window size.
    pub receipts: VecDeque<Receipt>,
}

impl Producer {
    pub fn receipt(&self, seq: u64) -> Option<&Receipt> {
        self.receipts.iter().rev().find(|r| r.seq == seq)
    }
}

/// A producer as a reader may see it: its newest durable append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerState<'a> {
    pub id: &'a str,
    pub epoch: u64,
    /// The sequence number of its newest durable append.
    pub seq: u64,
    /// Where that append starts and ends in the stream.
    pub start: Offset,
    pub next: Offset,
}

pub struct Stream {
    pub id: StreamId,
    /// Identity and configuration; `ext` (attributes, fork linkage) is durable state the
    /// server changes.
    pub meta: StreamMeta,
    /// Head: offset after the last accepted (possibly not yet durable) append.
    pub tail: Offset,
    pub closed: bool,
    /// Durable and readable.
    pub visible_tail: Offset,
    pub visible_closed: bool,
    pub last_stream_seq: Option<Bytes>,
    pub producers: HashMap<Box<str>, Producer>,
    chunks: Packed<Chunk>,
    /// Bytes of the chunks cached in memory (all of them in memory mode).
    cache: StreamCache,
    /// Start offset of every retained message; ordinal `msg_base + i` starts at
    /// `msg_starts[i]`. Retention drops entries from the front and raises `msg_base`, so
    /// surviving ordinals never change.
    msg_starts: Packed<Offset>,
    msg_base: RecordNo,
    /// Set when recovery inserted chunks out of order: their first messages are derived
    /// again once the tables are complete.
    renumber: bool,
    /// First readable offset (retention point); everything before it is gone.
    pub retained_start: Offset,
    /// The visible snapshot.
    pub snapshot: Option<SnapshotMeta>,
    /// Last access for sliding TTLs (not durable: a restart counts as an access).
    pub last_access_ms: Cell<i64>,
    /// Bumped whenever readers could observe something new (data, closure, deletion).
    version: Cell<u64>,
    /// Tasks waiting for a change, by waiter id (see `Shard::changed`).
    waiters: WaiterSet,
    /// Last time (Unix ms, to the second) the shard handed this stream out: a stream unused
    /// for a while goes dormant (see `shard::dormancy`).
    pub(crate) used_ms: Cell<i64>,
    /// Counts the changes made to it through the catalog, so that a stream whose state was
    /// saved to go dormant only does if nothing changed meanwhile.
    pub(crate) changes: u64,
    /// The newest checkpoint capture that holds this stream, or that it is not part of
    /// (created or woken during it): see `shard::catalog`.
    pub(crate) captured: u64,
}

impl Stream {
    pub(crate) fn from_create(c: &CreateRec, now_ms: i64) -> Stream {
        Stream {
            id: c.id,
            meta: c.meta.clone(),
            tail: Offset::ZERO,
            closed: false,
            visible_tail: Offset::ZERO,
            visible_closed: false,
            last_stream_seq: None,
            producers: HashMap::new(),
            chunks: Packed::default(),
            cache: StreamCache::default(),
            msg_starts: Packed::default(),
            msg_base: RecordNo::ZERO,
            renumber: false,
            retained_start: Offset::ZERO,
            snapshot: None,
            last_access_ms: Cell::new(now_ms),
            version: Cell::new(0),
            waiters: WaiterSet::default(),
            used_ms: Cell::new(now_ms),
            changes: 0,
            captured: 0,
        }
    }

    /// A stream rebuilt from an image; its chunks arrive separately.
    pub(crate) fn from_image(i: &ImageRec, now_ms: i64) -> Stream {
        let mut s = Stream::from_create(
            &CreateRec {
                id: i.id,
                meta: i.meta.clone(),
                initial: AppendRec::default(),
            },
            now_ms,
        );
        s.apply_image(i);
        s
    }

    /// A stream loaded from a checkpoint: its image plus its chunk table and message index
    /// (pages of both may be in index files).
    pub(crate) fn from_checkpoint(
        i: &ImageRec,
        chunks: Packed<Chunk>,
        msg_starts: Packed<Offset>,
        numbered: bool,
        now_ms: i64,
    ) -> Stream {
        let mut s = Stream::from_image(i, now_ms);
        s.chunks = chunks;
        s.msg_starts = msg_starts;
        s.renumber = !numbered;
        s
    }

    /// A stream from a checkpoint whose tables were in an index file that is missing or
    /// torn: recovery rebuilds them from the log's records.
    pub(crate) fn needing_rebuild(i: &ImageRec, now_ms: i64) -> Stream {
        let mut s = Stream::from_image(i, now_ms);
        s.renumber = true;
        s
    }

    /// The chunk table and record index, for checkpoints and index files.
    pub(crate) fn tables(&self) -> (&Packed<Chunk>, &Packed<Offset>) {
        (&self.chunks, &self.msg_starts)
    }

    pub(crate) fn tables_mut(&mut self) -> (&mut Packed<Chunk>, &mut Packed<Offset>) {
        (&mut self.chunks, &mut self.msg_starts)
    }

    /// Take the metadata of an image (replay: it is the state as of the image's LSN).
    pub(crate) fn apply_image(&mut self, i: &ImageRec) {
        self.meta.ext = i.meta.ext.clone();
        self.retained_start = i.retained_start;
        self.msg_base = i.first_record;
        self.snapshot = i.snapshot.clone();
        self.tail = i.tail;
        self.closed = i.closed;
        self.last_stream_seq = i.stream_seq.clone();
        self.producers = i
            .producers
            .iter()
            .map(|p| {
                let receipts = p
                    .receipts
                    .iter()
                    .map(|r| Receipt {
                        seq: r[0],
                        start: Offset::new(r[1]),
                        next: Offset::new(r[2]),
                        record_start: RecordNo::new(r[3]),
                        record_next: RecordNo::new(r[4]),
                    })
                    .collect();
                (
                    p.id.clone(),
                    Producer {
                        epoch: p.epoch,
                        last_seq: p.last_seq,
                        last_used_ms: p.last_used_ms,
                        receipts,
                    },
                )
            })
            .collect();
    }

    /// Everything but the data, for the log cleaner.
    pub(crate) fn image(&self) -> ImageRec {
        ImageRec {
            id: self.id,
            meta: self.meta.clone(),
            tail: self.tail,
            closed: self.closed,
            stream_seq: self.last_stream_seq.clone(),
            retained_start: self.retained_start,
            first_record: self.msg_base,
            snapshot: self.snapshot.clone(),
            producers: self
                .producers
                .iter()
                .map(|(id, p)| ProducerImage {
                    id: id.clone(),
                    epoch: p.epoch,
                    last_seq: p.last_seq,
                    last_used_ms: p.last_used_ms,
                    receipts: p
                        .receipts
                        .iter()
                        .map(|r| {
                            [
                                r.seq,
                                r.start.get(),
                                r.next.get(),
                                r.record_start.get(),
                                r.record_next.get(),
                            ]
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Add a chunk found during recovery that may precede chunks already known (relocated or
    /// stashed data). Keeps chunks and message starts sorted; a chunk seen twice keeps the
    /// later (newer) location.
    pub(crate) fn add_recovered_chunk(
        &mut self,
        start: Offset,
        len: u32,
        msg_lens: &[u32],
        loc: DiskLoc,
    ) {
        let i = self.chunks.partition_point(|c| c.start < start);
        if self.chunks.get(i).is_some_and(|c| c.start == start) {
            self.chunks.update(i, |c| c.set_loc(Some(loc)));
            return;
        }
        self.chunks.insert(i, Chunk::new(start, len, Some(loc)));
        self.renumber = true;
        // A relocated chunk that retention cut into lists only the records after the cut
        // (see `record::Lens::Trailing`): they are the chunk's last bytes.
        let listed: u64 = msg_lens.iter().map(|&l| u64::from(l)).sum();
        let mut off = start + u64::from(len).saturating_sub(listed);
        for &l in msg_lens.iter().filter(|&&l| l > 0) {
            let j = self.msg_starts.partition_point(|&m| m < off);
            if self.msg_starts.get(j) != Some(off) {
                self.msg_starts.insert(j, off);
            }
            off += u64::from(l);
        }
    }

    /// After recovery: recompute each chunk's first message and check the chunks tile
    /// `[0, tail)`. Returns false (and logs) if they do not.
    pub(crate) fn finish_recovery(&mut self) -> bool {
        // Chunks and messages before the retention point may linger in segments the cleaner
        // has not reached yet; they are not part of the stream any more.
        let base = self.msg_base;
        self.trim_index(self.retained_start);
        self.msg_base = base;
        if !self.renumber {
            // Tables from a checkpoint and appends replayed in order are complete and
            // numbered already: check their ends only, without reading their pages.
            self.chunks.freeze(0);
            self.msg_starts.freeze(0);
            let first = self.chunks.get(0);
            // The last chunk is unpacked, in a frozen block, or (when the table is a whole
            // number of pages) in the last page, which this reads once.
            let end = self
                .chunks
                .len()
                .checked_sub(1)
                .and_then(|i| self.chunks.get(i))
                .map(|c| c.end());
            let ok = match (first, end) {
                (Some(f), Some(e)) => f.start <= self.retained_start && e == self.tail,
                _ => self.tail <= self.retained_start,
            };
            if !ok {
                tracing::error!(stream = %self.meta.key, tail = self.tail.get(), "recovered chunks do not cover the stream");
            }
            return ok;
        }
        self.renumber = false;
        let mut chunks: Vec<Chunk> = self.chunks.iter().collect();
        let mut ok = chunks
            .first()
            .map_or(self.tail <= self.retained_start, |c| {
                c.start <= self.retained_start
            });
        let mut expected = chunks.first().map_or(self.tail, |c| c.start);
        for c in &mut chunks {
            if c.start != expected {
                ok = false;
            }
            expected = c.end();
            c.first_msg = self.msg_base + self.msg_starts.partition_point(|&m| m < c.start) as u64;
        }
        self.chunks = Packed::from_entries(chunks);
        self.chunks.freeze(0);
        self.msg_starts.freeze(0);
        if expected != self.tail {
            ok = false;
        }
        if !ok {
            tracing::error!(
                stream = %self.meta.key,
                tail = self.tail.get(),
                chunks_end = expected.get(),
                "recovered chunks do not cover the stream"
            );
        }
        ok
    }

    /// Chunks whose bytes live in `segment`, with their message lengths, for relocation. A
    /// chunk that retention cut into lists only the records from the retention point on;
    /// they are its last bytes (a Relocate record allows that, `record::Lens::Trailing`).
    pub(crate) fn chunks_in_segment(
        &self,
        segment: SegmentNo,
    ) -> Vec<(Offset, u32, DiskLoc, Vec<u32>)> {
        self.chunks
            .iter()
            .filter_map(|c| {
                let loc = c.loc().filter(|l| l.segment == segment)?;
                let first = c.first_msg;
                let next = self.message_at_or_after(c.end());
                Some((c.start, c.len, loc, self.message_lens(first, next)))
            })
            .collect()
    }

    /// Point a chunk at its relocated copy.
    pub(crate) fn relocate(&mut self, chunk_start: Offset, loc: DiskLoc) {
        let i = self.chunks.partition_point(|c| c.start < chunk_start);
        if self.chunks.get(i).is_some_and(|c| c.start == chunk_start) {
            self.chunks.update(i, |c| c.set_loc(Some(loc)));
        }
    }

    /// Cached bytes of a chunk, if any.
    pub(crate) fn cached_chunk(&self, chunk_start: Offset, chunk_len: u32) -> Option<Bytes> {
        self.cache.get(chunk_start, chunk_len as usize)
    }

    /// Apply an append to the head state. Returns the receipt it produced, if any.
    /// `loc` locates the record (segment, position, framed length, data offset) when it is
    /// in the log; `keep_data` caches the bytes in memory.
    pub(crate) fn apply_append(
        &mut self,
        a: &AppendRec,
        receipt_window: usize,
        now_ms: i64,
        loc: Option<DiskLoc>,
        keep_data: bool,
    ) -> Receipt {
        debug_assert_eq!(a.start, self.tail, "appends must be contiguous");
        let record_start = self.message_count();
        // Older entries are settled: pack them, so the new ones below stay unpacked.
        self.chunks.freeze(0);
        self.msg_starts.freeze(0);
        let mut pos = 0usize;
        for &len in &a.append_lens {
            let len = len as usize;
            if len == 0 {
                continue;
            }
            let start = a.start + pos as u64;
            // first_msg is set below, once the messages are indexed.
            let loc = loc.map(|l| DiskLoc {
                data_off: l.data_off + pos as u32,
                ..l
            });
            self.chunks.push(Chunk::new(start, len as u32, loc));
            if keep_data {
                self.cache
                    .insert_append(start, &a.data.slice(pos..pos + len));
            }
            pos += len;
        }
        let new_chunks = a.append_lens.iter().filter(|&&l| l > 0).count();
        let first_new_msg = self.msg_starts.len();
        let mut off = a.start;
        let mut new_msg_count = 0;
        // A message is never empty; a zero length would index a phantom record.
        for &len in a.msg_lens.iter().filter(|&&l| l > 0) {
            self.msg_starts.push(off);
            off += u64::from(len);
            new_msg_count += 1;
        }
        // Every older message starts before `a.start`, so only the new ones are searched:
        // a search of the whole (long, cold) index cost ~2% of an append's server CPU.
        let unpacked = self.msg_starts.unpacked();
        let new_msgs = &unpacked[unpacked.len() - new_msg_count..];
        let unpacked = self.chunks.unpacked_mut();
        let first_new_chunk = unpacked.len() - new_chunks;
        for chunk in &mut unpacked[first_new_chunk..] {
            let i = first_new_msg + new_msgs.partition_point(|&s| s < chunk.start);
            chunk.first_msg = self.msg_base + i as u64;
        }
        self.tail = a.start + a.data.len() as u64;
        if a.close {
            self.closed = true;
        }
        if let Some(seq) = &a.stream_seq {
            self.last_stream_seq = Some(seq.clone());
        }
        let receipt = Receipt {
            seq: a.producer.as_ref().map_or(0, |p| p.seq),
            start: a.start,
            next: self.tail,
            record_start,
            record_next: self.message_count(),
        };
        if let Some(p) = &a.producer {
            let entry = self
                .producers
                .entry(p.id.clone())
                .or_insert_with(|| Producer {
                    epoch: p.epoch,
                    last_seq: p.seq,
                    last_used_ms: now_ms,
                    receipts: VecDeque::new(),
                });
            if entry.epoch != p.epoch {
                entry.receipts.clear();
            }
            entry.epoch = p.epoch;
            entry.last_seq = p.seq;
            entry.last_used_ms = now_ms;
            entry.receipts.push_back(receipt);
            while entry.receipts.len() > receipt_window.max(1) {
                entry.receipts.pop_front();
            }
        }
        receipt
    }

    /// Every producer as of the visible end, sorted by id: each one's newest receipt that
    /// is durable. A producer whose receipts are all still queued (its first append, or the
    /// first of a new epoch, which cleared the older ones) is left out until one is durable.
    pub(crate) fn visible_producers(&self) -> Vec<ProducerState<'_>> {
        let mut out: Vec<ProducerState<'_>> = self
            .producers
            .iter()
            .filter_map(|(id, p)| {
                let r = p.receipts.iter().rev().find(|r| self.is_visible(r))?;
                Some(ProducerState {
                    id,
                    epoch: p.epoch,
                    seq: r.seq,
                    start: r.start,
                    next: r.next,
                })
            })
            .collect();
        out.sort_unstable_by(|a, b| a.id.cmp(b.id));
        out
    }

    /// Whether an accepted append is durable. Appends are visible in order, so one that ends
    /// at or before the visible tail is; the exception is an empty append at the tail, which
    /// only a close can be: it is durable once the closure is.
    fn is_visible(&self, r: &Receipt) -> bool {
        r.next < self.visible_tail
            || (r.next == self.visible_tail && (r.start < r.next || self.visible_closed))
    }

    /// Make everything up to `tail` (and the closure, if set) readable and wake readers.
    pub(crate) fn make_visible(&mut self, tail: Offset, closed: bool) {
        if tail > self.visible_tail || (closed && !self.visible_closed) {
            self.visible_tail = self.visible_tail.max(tail);
            self.visible_closed |= closed;
            self.notify();
        }
    }

    pub(crate) fn notify(&self) {
        self.version.set(self.version.get() + 1);
        self.waiters.wake_all();
    }

    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// Wake every reader waiting on this stream without changing it: the shard stops.
    pub(crate) fn wake_waiters(&self) {
        self.waiters.wake_all();
    }

    /// Register (or refresh) waiter `id`; O(1), one entry per waiting task.
    pub(crate) fn register_waiter(&self, id: u64, waker: &Waker) {
        self.waiters.register(id, waker);
    }

    /// Whether a task waits for this stream to change.
    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// Forget waiter `id` (its wait ended without a change).
    pub(crate) fn unregister_waiter(&self, id: u64) {
        self.waiters.unregister(id);
    }

    /// Number of messages (records) ever appended (the next record ordinal, `N`).
    pub fn message_count(&self) -> RecordNo {
        self.msg_base + self.msg_starts.len() as u64
    }

    /// Ordinal of the first retained message (`F`).
    pub fn first_message(&self) -> RecordNo {
        self.msg_base
    }

    /// Next record ordinal as readers see it (durable messages only).
    pub fn visible_message_count(&self) -> RecordNo {
        self.msg_base + self.msg_starts.partition_point(|&s| s < self.visible_tail) as u64
    }

    /// Start offset of message `ordinal`, or the tail for `ordinal == count`; None for
    /// trimmed or future ordinals.
    pub fn message_start(&self, ordinal: RecordNo) -> Option<Offset> {
        let i = ordinal.checked_since(self.msg_base)?;
        match self.msg_starts.get(usize::try_from(i).ok()?) {
            Some(s) => Some(s),
            None if i == self.msg_starts.len() as u64 => Some(self.tail),
            None => None,
        }
    }

    /// Bytes of data the stream holds (live data, for space accounting): its chunks tile
    /// it from the first retained one to the last.
    pub fn data_bytes(&self) -> u64 {
        let Some(first) = self.chunks.get(0) else {
            return 0;
        };
        let last = self.chunks.get(self.chunks.len() - 1).unwrap_or(first);
        last.end().saturating_since(first.start)
    }

    /// The largest ordinal `e` in `(start, limit]` with records `[start, e)` ending at or
    /// before offset `max_end`, but at least `start + 1` when `start < limit` (a response
    /// always carries one whole record). A binary search over the message index.
    pub fn records_within(&self, start: RecordNo, limit: RecordNo, max_end: Offset) -> RecordNo {
        let limit = limit.min(self.message_count());
        if start >= limit || start < self.msg_base {
            return start.min(limit);
        }
        // Records [start, e) end where record e starts (the tail for e == count); those
        // ends grow with e, so count the candidates e in (start, limit) that fit.
        let lo = (start - self.msg_base + 1) as usize;
        let hi = (limit - self.msg_base) as usize;
        // The starts are sorted, so those in [lo, hi) that fit are the overlap of that
        // range with the prefix of all starts that fit.
        let all_fit = self.msg_starts.partition_point(|&m| m <= max_end);
        let fit = (all_fit.clamp(lo, hi) - lo) as u64;
        let mut end = start + fit;
        if fit == (hi - lo) as u64 && self.message_start(limit).is_some_and(|o| o <= max_end) {
            end = limit;
        }
        end.max(start.next())
    }

    /// Ordinal of the first message starting at or after `offset`.
    pub fn message_at_or_after(&self, offset: Offset) -> RecordNo {
        self.msg_base + self.msg_starts.partition_point(|&s| s < offset) as u64
    }

    /// Whether `offset` is a message boundary (a message start or the tail).
    pub fn is_message_boundary(&self, offset: Offset) -> bool {
        offset == self.tail
            || self
                .msg_starts
                .get(self.msg_starts.partition_point(|&m| m < offset))
                == Some(offset)
    }

    /// Drop chunks that end at or before `offset` and messages that start before it.
    /// Returns the data bytes and cached bytes freed.
    fn trim_index(&mut self, offset: Offset) -> (u64, usize) {
        let drop_chunks = self.chunks.partition_point(|c| c.end() <= offset);
        // Chunks tile the stream, so the bytes dropped are the distance between the old
        // first chunk and the new one, found without reading the pages in between.
        let before = self.data_bytes();
        self.chunks.drop_front(drop_chunks);
        let freed = before.saturating_sub(self.data_bytes());
        let cached = self.cache.trim(offset);
        let drop_msgs = self.msg_starts.partition_point(|&m| m < offset);
        self.msg_starts.drop_front(drop_msgs);
        self.msg_base += drop_msgs as u64;
        (freed, cached)
    }

    /// Advance retention to `offset` (a message boundary at or below the tail): reads before
    /// it are gone, surviving ordinals are unchanged. Returns (data bytes, cached bytes)
    /// freed.
    pub(crate) fn retain(&mut self, offset: Offset, first_record: RecordNo) -> (u64, usize) {
        if offset <= self.retained_start {
            return (0, 0);
        }
        self.retained_start = offset;
        let freed = self.trim_index(offset);
        self.msg_base = first_record.max(self.msg_base);
        self.notify();
        freed
    }

    /// The write operation that starts at or contains `offset` (None at or past the tail).
    pub fn chunk_at(&self, offset: Offset) -> Option<Chunk> {
        let i = self.chunks.partition_point(|c| c.end() <= offset);
        self.chunks.get(i).filter(|c| c.start <= offset)
    }

    /// How to read `[from, to)` (clamped to the visible tail): memory slices of cached
    /// runs, disk locations for the rest. Use [`crate::Shard::read`] to execute it. Takes
    /// `&mut self` because a read that reaches into the block small appends are being
    /// packed into seals it.
    pub fn read_plan(&mut self, from: Offset, to: Offset) -> Vec<Piece> {
        let to = to.min(self.visible_tail);
        let mut out = Vec::new();
        let chunks = &self.chunks;
        self.cache.walk(from, to, |span| match span {
            Extent::Cached(b) => out.push(Piece::Memory(b)),
            Extent::Missing { start, end } => {
                // Runs cover whole chunks, so an uncached range is whole chunks, except at
                // its ends where the read starts or stops inside one.
                let first = chunks.partition_point(|c| c.end() <= start);
                for c in chunks.iter_from(first).take_while(|c| c.start < end) {
                    let loc = c.loc().expect("a chunk is either cached or on disk");
                    out.push(Piece::Disk {
                        loc,
                        chunk_start: c.start,
                        chunk_len: c.len,
                        from: (start.max(c.start) - c.start) as usize,
                        to: (end.min(c.end()) - c.start) as usize,
                    });
                }
            }
        });
        out
    }

    /// Cache the bytes of whole chunks again after a disk read: `data` holds the chunks
    /// from `start` on, back to back. Returns the bytes newly cached (none if the range does
    /// not begin and end at chunk boundaries, or some of it is cached already).
    pub(crate) fn recache(&mut self, start: Offset, data: &Bytes) -> usize {
        let end = start + data.len() as u64;
        let first = self.chunks.partition_point(|c| c.start < start);
        let last = self.chunks.partition_point(|c| c.end() < end);
        let whole = self.chunks.get(first).is_some_and(|c| c.start == start)
            && self.chunks.get(last).is_some_and(|c| c.end() == end);
        if whole && self.cache.insert_loaded(start, data) {
            data.len()
        } else {
            0
        }
    }

    /// Drop the cached run that starts at `start` if it is durable, visible and in the log
    /// (it stays readable from disk). Returns the bytes freed.
    pub(crate) fn evict(&mut self, start: Offset) -> usize {
        let visible = self.visible_tail;
        let chunks = &self.chunks;
        self.cache.evict(start, |from, to| {
            let i = chunks.partition_point(|c| c.start < from);
            to <= visible && chunks.get(i).is_some_and(|c| c.loc().is_some())
        })
    }

    /// Whether the cached run starting at `start` still holds bytes waiting for their flush
    /// (such a run cannot be evicted yet).
    pub(crate) fn cache_pending(&self, start: Offset) -> bool {
        self.cache
            .end_of(start)
            .is_some_and(|end| end > self.visible_tail)
    }

    /// Starts of the cached runs created since the last call, for the shard's eviction order.
    pub(crate) fn drain_fresh_cache_runs(&mut self) -> std::vec::Drain<'_, Offset> {
        self.cache.drain_fresh()
    }

    /// Bytes of this stream currently cached in memory.
    pub fn resident_bytes(&self) -> usize {
        self.cache.len()
    }

    /// All write operations (for copying history into a fork).
    pub fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        self.chunks.iter()
    }

    /// Number of retained write operations.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Message lengths of the messages in `[from_msg, to_msg)` (retained ordinals); the
    /// ordinal one past the last message, if in range, counts as an empty message.
    pub fn message_lens(&self, from_msg: RecordNo, to_msg: RecordNo) -> Vec<u32> {
        let count = self.message_count();
        let from = from_msg.max(self.msg_base);
        let mut out = Vec::new();
        if from >= to_msg || from > count {
            return out;
        }
        let mut starts = self.msg_starts.iter_from((from - self.msg_base) as usize);
        let mut start = starts.next().unwrap_or(self.tail);
        for _ in 0..to_msg.min(count) - from {
            let next = starts.next().unwrap_or(self.tail);
            out.push((next - start) as u32);
            start = next;
        }
        if to_msg > count {
            out.push(0);
        }
        out
    }

    /// Heap bytes this stream's state holds (the struct itself included; its cached data
    /// is counted by the read cache).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let producers: usize = self
            .producers
            .iter()
            .map(|(id, p)| id.len() + p.receipts.capacity() * size_of::<Receipt>())
            .sum::<usize>()
            + self.producers.capacity() * (size_of::<(Box<str>, Producer)>() + 1);
        size_of::<Stream>()
            + self.meta.key.len()
            + self.meta.content_type.len()
            + self.meta.ext.len()
            + self.last_stream_seq.as_ref().map_or(0, Bytes::len)
            + producers
            + self.index_heap_bytes()
            + self.cache.heap_bytes()
            + self.waiters.heap_bytes()
    }

    /// Heap bytes of the chunk table and message index.
    pub fn index_heap_bytes(&self) -> usize {
        self.chunks.heap_bytes() + self.msg_starts.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::{off, rec, seg};
    use crate::record::{Lifetime, ProducerStamp};

    fn stream() -> Stream {
        Stream::from_create(
            &CreateRec {
                id: 1,
                meta: StreamMeta {
                    key: "k".into(),
                    incarnation: 1,
                    created_ms: 0,
                    content_type: "application/json".into(),
                    lifetime: Lifetime::Forever,
                    ext: Bytes::new(),
                },
                initial: AppendRec::default(),
            },
            0,
        )
    }

    fn append(s: &mut Stream, msgs: &[&str], producer: Option<(u64, u64)>) -> Receipt {
        let data: Vec<u8> = msgs.concat().into_bytes();
        let a = AppendRec {
            id: 1,
            start: s.tail,
            append_lens: vec![data.len() as u32],
            msg_lens: msgs.iter().map(|m| m.len() as u32).collect(),
            data: Bytes::from(data),
            producer: producer.map(|(epoch, seq)| ProducerStamp {
                id: "p".into(),
                epoch,
                seq,
            }),
            ..Default::default()
        };
        s.apply_append(&a, 2, 0, None, true)
    }

    #[test]
    fn recovery_checks_the_last_chunk_also_when_every_chunk_is_packed() {
        // A whole number of blocks: freezing leaves no unpacked entry to take the end from.
        for appends in [
            1,
            crate::limits::PACKED_BLOCK_ENTRIES,
            2 * crate::limits::PACKED_BLOCK_ENTRIES,
            300,
        ] {
            let mut s = stream();
            for _ in 0..appends {
                append(&mut s, &["{}\n"], None);
            }
            assert!(s.finish_recovery(), "{appends} appends");
            assert_eq!(s.chunks.len(), appends);
        }
    }

    #[test]
    fn message_index_answers_ordinals_and_boundaries() {
        let mut s = stream();
        append(&mut s, &["{\"a\":1}\n", "2\n"], None);
        append(&mut s, &["3\n"], None);
        assert_eq!(s.message_count(), rec(3));
        assert_eq!(s.message_start(rec(0)), Some(off(0)));
        assert_eq!(s.message_start(rec(1)), Some(off(8)));
        assert_eq!(s.message_start(rec(2)), Some(off(10)));
        assert_eq!(s.message_start(rec(3)), Some(off(12)));
        assert_eq!(s.message_start(rec(4)), None);
        assert!(s.is_message_boundary(off(8)));
        assert!(!s.is_message_boundary(off(9)));
        assert_eq!(s.message_at_or_after(off(9)), rec(2));
        assert_eq!(s.chunk_at(off(9)).map(|c| c.start), Some(off(0)));
        assert_eq!(s.chunk_at(off(10)).map(|c| c.first_msg), Some(rec(2)));
        assert!(s.chunk_at(off(12)).is_none());
        assert_eq!(s.message_lens(rec(0), rec(3)), vec![8, 2, 2]);
    }

    #[test]
    fn records_within_is_a_bounded_binary_search() {
        let mut s = stream();
        // Records of 4, 4, 10, 4 bytes at offsets 0, 4, 8, 18; tail 22.
        append(&mut s, &["aaa\n", "bbb\n", "ccccccccc\n", "ddd\n"], None);
        assert_eq!(s.records_within(rec(0), rec(4), off(22)), rec(4));
        assert_eq!(s.records_within(rec(0), rec(4), off(8)), rec(2));
        assert_eq!(
            s.records_within(rec(0), rec(4), off(7)),
            rec(1),
            "at least one record"
        );
        assert_eq!(s.records_within(rec(2), rec(4), off(18)), rec(3));
        assert_eq!(
            s.records_within(rec(2), rec(4), off(9)),
            rec(3),
            "a record larger than the limit alone"
        );
        assert_eq!(
            s.records_within(rec(1), rec(3), off(100)),
            rec(3),
            "capped by limit"
        );
        assert_eq!(
            s.records_within(rec(4), rec(4), off(100)),
            rec(4),
            "nothing at the tail"
        );
    }

    #[test]
    fn reads_stop_at_the_visible_tail() {
        let mut s = stream();
        append(&mut s, &["ab\n"], None);
        append(&mut s, &["cd\n"], None);
        assert!(
            s.read_plan(off(0), off(100)).is_empty(),
            "nothing durable yet"
        );
        s.make_visible(off(3), false);
        assert_eq!(memory(&s.read_plan(off(0), off(100))), b"ab\n");
        s.make_visible(off(6), false);
        assert_eq!(memory(&s.read_plan(off(1), off(5))), b"b\ncd");
        assert_eq!(s.visible_message_count(), rec(2));
    }

    fn memory(plan: &[Piece]) -> Vec<u8> {
        plan.iter()
            .flat_map(|p| match p {
                Piece::Memory(b) => b.to_vec(),
                Piece::Disk { .. } => panic!("expected cached data"),
            })
            .collect()
    }

    #[test]
    fn evicted_chunks_are_planned_as_disk_reads() {
        let mut s = stream();
        let a = AppendRec {
            id: 1,
            start: off(0),
            append_lens: vec![3, 3],
            msg_lens: vec![3, 3],
            data: Bytes::from_static(b"ab\ncd\n"),
            ..Default::default()
        };
        let loc = DiskLoc {
            segment: seg(4),
            record_pos: 4096,
            record_len: 100,
            data_off: 94,
        };
        s.apply_append(&a, 1, 0, Some(loc), true);
        assert_eq!(s.evict(off(0)), 0, "not durable yet");
        s.make_visible(off(6), false);
        // Both small appends were packed into one cached run, which goes as a whole.
        assert_eq!(s.evict(off(0)), 6);
        assert_eq!(s.evict(off(0)), 0, "already evicted");
        assert_eq!(s.recache(off(3), &Bytes::from_static(b"cd\n")), 3);
        let plan = s.read_plan(off(1), off(6));
        assert!(matches!(
            plan[0],
            Piece::Disk {
                loc: DiskLoc { data_off: 94, .. },
                chunk_start: Offset::ZERO,
                from: 1,
                to: 3,
                ..
            }
        ));
        assert!(matches!(&plan[1], Piece::Memory(b) if &b[..] == b"cd\n"));
        assert_eq!(plan.len(), 2);
        assert_eq!(
            s.chunks().nth(1).and_then(|c| c.loc()).map(|l| l.data_off),
            Some(97)
        );
        assert_eq!(s.recache(off(0), &Bytes::from_static(b"ab\n")), 3);
        assert_eq!(
            s.recache(off(0), &Bytes::from_static(b"ab\n")),
            0,
            "already cached"
        );
        assert_eq!(memory(&s.read_plan(off(0), off(6))), b"ab\ncd\n");
        assert_eq!(s.resident_bytes(), 6);
        // Retention drops the cached bytes with the chunk.
        assert_eq!(s.retain(off(3), rec(1)), (3, 3));
        assert_eq!(s.resident_bytes(), 3);
    }

    #[test]
    fn chunk_entries_stay_packed() {
        // The newest entries of every stream stay unpacked: keep them at 40 bytes.
        assert_eq!(std::mem::size_of::<Chunk>(), 40);
        let loc = DiskLoc {
            segment: seg(7),
            record_pos: 1 << 40,
            record_len: 300,
            data_off: 12,
        };
        assert_eq!(Chunk::new(off(0), 1, Some(loc)).loc(), Some(loc));
        assert_eq!(Chunk::new(off(0), 1, None).loc(), None);
    }

    #[test]
    fn packed_history_costs_a_few_bytes_per_append_and_reads_the_same() {
        let mut s = stream();
        let n = 10_000u64;
        for i in 0..n {
            let a = AppendRec {
                id: 1,
                start: s.tail,
                append_lens: vec![100],
                msg_lens: vec![60, 40],
                data: Bytes::from(vec![b'x'; 100]),
                ..Default::default()
            };
            // Records of 1,000 interleaved streams: each 300 KB after the last.
            let loc = DiskLoc {
                segment: seg(3 + i / 400),
                record_pos: 4096 + (i % 400) * 300_000,
                record_len: 160,
                data_off: 60,
            };
            s.apply_append(&a, 1, 0, Some(loc), false);
        }
        s.make_visible(s.tail, false);
        let per_append = s.index_heap_bytes() as u64 / n;
        assert!(per_append <= 20, "{per_append} bytes per append");
        for i in [0, 1, 63, 64, 65, 4_999, n - 65, n - 64, n - 1] {
            let c = s.chunk_at(off(i * 100 + 7)).expect("chunk");
            assert_eq!(
                (c.start, c.len, c.first_msg),
                (off(i * 100), 100, rec(2 * i))
            );
            let loc = c.loc().expect("on disk");
            assert_eq!(loc.segment, seg(3 + i / 400));
            assert_eq!(loc.record_pos, 4096 + (i % 400) * 300_000);
            assert_eq!(s.message_start(rec(2 * i + 1)), Some(off(i * 100 + 60)));
            assert_eq!(s.message_at_or_after(off(i * 100 + 1)), rec(2 * i + 1));
        }
        let plan = s.read_plan(off(64 * 100 - 10), off(66 * 100));
        let starts: Vec<u64> = plan
            .iter()
            .map(|p| match p {
                Piece::Disk { chunk_start, .. } => chunk_start.get(),
                Piece::Memory(_) => panic!("nothing is cached"),
            })
            .collect();
        assert_eq!(starts, vec![6300, 6400, 6500]);
        // Retention into the middle of a block keeps every surviving position.
        assert_eq!(s.retain(off(100 * 100), rec(200)), (100 * 100, 0));
        assert_eq!(s.chunk_count(), (n - 100) as usize);
        assert_eq!(s.chunks().next().map(|c| c.start), Some(off(100 * 100)));
        assert_eq!(s.message_start(rec(199)), None);
        assert_eq!(s.message_start(rec(200)), Some(off(100 * 100)));
        assert_eq!(s.message_start(rec(2 * n)), Some(s.tail));
        assert_eq!(s.data_bytes(), (n - 100) * 100);
    }

    #[test]
    fn receipts_are_bounded_and_reset_by_new_epoch() {
        let mut s = stream();
        for seq in 0..4 {
            append(&mut s, &["x\n"], Some((0, seq)));
        }
        let p = &s.producers["p"];
        assert_eq!(p.last_seq, 3);
        assert_eq!(p.receipts.len(), 2);
        assert!(p.receipt(1).is_none());
        assert_eq!(
            p.receipt(3).map(|r| (r.start, r.next)),
            Some((off(6), off(8)))
        );
        assert_eq!(
            p.receipt(3).map(|r| (r.record_start, r.record_next)),
            Some((rec(3), rec(4)))
        );
        append(&mut s, &["y\n"], Some((1, 0)));
        let p = &s.producers["p"];
        assert_eq!((p.epoch, p.receipts.len()), (1, 1));
    }

    #[test]
    fn readers_see_a_producer_as_of_its_newest_durable_append() {
        let mut s = stream();
        append(&mut s, &["x\n"], Some((0, 0)));
        assert_eq!(s.visible_producers(), [], "nothing durable yet");
        s.make_visible(s.tail, false);
        append(&mut s, &["x\n"], Some((0, 1)));
        let seen = s.visible_producers();
        assert_eq!(
            seen.iter()
                .map(|p| (p.id, p.epoch, p.seq, p.start, p.next))
                .collect::<Vec<_>>(),
            [("p", 0, 0, off(0), off(2))]
        );
        s.make_visible(s.tail, false);
        assert_eq!(s.visible_producers()[0].seq, 1);
        // A new epoch clears the old receipts: until its first append is durable, the
        // producer is not shown rather than shown with state it no longer has.
        append(&mut s, &["y\n"], Some((1, 0)));
        assert_eq!(s.visible_producers(), []);
        s.make_visible(s.tail, false);
        assert_eq!(
            s.visible_producers().first().map(|p| (p.epoch, p.seq)),
            Some((1, 0))
        );
    }
}

#[cfg(test)]
mod resident_cost {
    use super::*;
    use crate::record::Lifetime;

    /// What the many-streams benchmark keeps resident for a minute per stream: 40 appends
    /// of 256 B. Its tables must not hold capacity for more entries than it has (growing
    /// them by doubling kept up to 64 of each, about 1 KiB more).
    #[test]
    fn a_stream_of_forty_small_appends_holds_its_entries_and_little_more() {
        let mut s = Stream::from_create(
            &CreateRec {
                id: 1,
                meta: StreamMeta {
                    key: "b/loadgen-run/stream-000123".into(),
                    incarnation: 1,
                    created_ms: 0,
                    content_type: "application/octet-stream".into(),
                    lifetime: Lifetime::Forever,
                    ext: Bytes::new(),
                },
                initial: AppendRec::default(),
            },
            0,
        );
        for i in 0..40u64 {
            let a = AppendRec {
                id: 1,
                start: s.tail,
                append_lens: vec![256],
                msg_lens: vec![256],
                data: Bytes::from(vec![b'x'; 256]),
                ..Default::default()
            };
            let loc = DiskLoc {
                segment: SegmentNo::new(1),
                record_pos: 4096 + i * 300,
                record_len: 300,
                data_off: 40,
            };
            s.apply_append(&a, 1, 0, Some(loc), false);
        }
        s.make_visible(s.tail, false);
        let entries = 40 * (std::mem::size_of::<Chunk>() + std::mem::size_of::<Offset>());
        assert_eq!(s.index_heap_bytes(), entries);
        assert!(s.heap_bytes() < entries + 1024, "{} bytes", s.heap_bytes());
    }
}
