//! The log writer: batches bound for segment positions, segment rolls and spares, and zeros
//! written ahead of the records.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::aligned::{align_down, align_up, AlignedBuf, BufPool};
use crate::error::StorageError;
use crate::limits::{BATCH_BUF_BYTES, ZERO_AHEAD_BYTES};
use crate::position::{Lsn, Offset, SegmentNo};
use crate::record::Record;
use crate::segment;
use crate::segment::{SegmentHeader, DATA_START};
use crate::stream::{DiskLoc, StreamId};

/// The durable write path of one shard: where the next record goes, the batches waiting for
/// the flusher, the segments' write handles, spares, and zeros written ahead.
pub(super) struct LogWriter {
    dir: PathBuf,
    shard: u32,
    segment_bytes: u64,
    /// Segment receiving new records, and the position after the last one.
    write_seg: SegmentNo,
    write_end: u64,
    files: HashMap<SegmentNo, Rc<monoio::fs::File>>,
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
    /// `ShardConfig::disk_segments`.
    disk_segments: Option<usize>,
}

/// Zeros being written to `[from, ..)` of segment `seg`, ahead of the records.
pub(super) struct Zeroing {
    seg: SegmentNo,
    from: u64,
    write: monoio::task::JoinHandle<(io::Result<()>, AlignedBuf)>,
}

impl Zeroing {
    /// The write's result, and the zeros buffer back.
    pub(super) async fn finished(self) -> (io::Result<()>, AlignedBuf) {
        self.write.await
    }
}

/// Records bound for one contiguous, block-aligned range of one segment.
pub(super) struct Batch {
    pub(super) seg: SegmentNo,
    /// Block-aligned segment position where `buf` starts.
    pub(super) base: u64,
    /// `None` only while the flusher has lent it to the kernel.
    pub(super) buf: Option<AlignedBuf>,
    /// LSN of the first record in the batch (0 while it holds none).
    pub(super) first_lsn: Lsn,
    pub(super) effects: Vec<Effect>,
}

pub(super) struct Effect {
    pub(super) lsn: Lsn,
    /// Stream made readable up to (tail, closed) once this record is durable.
    pub(super) visible: Option<(StreamId, Offset, bool)>,
}

/// What the writer is told about the shard it writes for.
pub(super) struct WriterSettings {
    pub(super) dir: PathBuf,
    pub(super) shard: u32,
    pub(super) segment_bytes: u64,
    /// `ShardConfig::disk_segments`.
    pub(super) disk_segments: Option<usize>,
    /// `ShardConfig::spare_fill_time`.
    pub(super) spare_fill_time: Duration,
    /// `ShardConfig::zero_ahead_below`.
    pub(super) zero_ahead_below: u64,
}

/// What the writer counts, for the shard's stats.
pub(super) struct WriterCounts {
    /// Segments made from a spare.
    pub(super) spares_adopted: u64,
    /// Bytes of zeros written ahead of the records.
    pub(super) zeroed_bytes: u64,
}

impl LogWriter {
    /// A writer positioned nowhere yet: [`Self::resume`] or [`Self::start`] places it.
    pub(super) fn new(settings: WriterSettings, pool: BufPool) -> Self {
        LogWriter {
            dir: settings.dir,
            shard: settings.shard,
            segment_bytes: settings.segment_bytes,
            disk_segments: settings.disk_segments,
            write_seg: SegmentNo::default(),
            write_end: DATA_START,
            files: HashMap::new(),
            batches: VecDeque::new(),
            pool,
            scratch: Vec::new(),
            spare: None,
            rolled_at: Instant::now(),
            spare_fill_time: settings.spare_fill_time,
            spares_adopted: 0,
            zero_ahead_below: settings.zero_ahead_below,
            ahead_end: DATA_START,
            ahead_moved_at: Instant::now(),
            ahead_moved_end: DATA_START,
            zeros: None,
            zeroing: None,
            zeroed_bytes: 0,
        }
    }

    /// Continue the log in segment `seg` after its last valid record at `end`, through its
    /// write handle `file`; `contents` is the segment as read, so the open batch starts
    /// with the already-written bytes of its last block.
    pub(super) fn resume(
        &mut self,
        seg: SegmentNo,
        end: u64,
        file: monoio::fs::File,
        contents: &[u8],
    ) {
        self.files.insert(seg, Rc::new(file));
        self.write_seg = seg;
        self.write_end = end;
        self.ahead_end = end;
        self.ahead_moved_end = end;
        let base = align_down(end as usize);
        self.start_batch(seg, base as u64, &contents[base..end as usize]);
    }

    /// Begin the log in a new segment `seg` whose first record will be `first_lsn`.
    pub(super) fn start(&mut self, seg: SegmentNo, first_lsn: Lsn) -> Result<(), StorageError> {
        self.create(seg, first_lsn)?;
        self.write_seg = seg;
        self.write_end = DATA_START;
        self.start_batch(seg, DATA_START, &[]);
        Ok(())
    }

    /// The shard's data directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size of each segment file.
    pub(super) fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// The segment receiving new records.
    pub(super) fn write_segment(&self) -> SegmentNo {
        self.write_seg
    }

    /// Where the next record will go: its segment and position in it.
    pub(super) fn write_position(&self) -> (SegmentNo, u64) {
        (self.write_seg, self.write_end)
    }

    pub(super) fn counts(&self) -> WriterCounts {
        WriterCounts {
            spares_adopted: self.spares_adopted,
            zeroed_bytes: self.zeroed_bytes,
        }
    }

    /// Segment `seg` is leaving the disk (cleaned or evicted): drop its write handle, which
    /// would keep its blocks allocated.
    pub(super) fn forget_segment(&mut self, seg: SegmentNo) {
        self.files.remove(&seg);
    }

    /// A flushed batch's buffer, back for the next batches.
    pub(super) fn recycle(&mut self, buf: AlignedBuf) {
        self.pool.give(buf);
    }

    /// After a flush: sealed segments with nothing left to write no longer need a handle.
    pub(super) fn drop_sealed_handles(&mut self) {
        let oldest_queued = self.batches.front().map_or(self.write_seg, |b| b.seg);
        self.files.retain(|&k, _| k >= oldest_queued);
    }

    /// The zero write in flight, if `batches` reach its blocks (or belong to a later
    /// segment): the flush must wait for it, so no data write races a zero write.
    pub(super) fn zeroing_reached_by(&mut self, batches: &[Batch]) -> Option<Zeroing> {
        let z = self.zeroing.take()?;
        let reached = batches.iter().any(|b| {
            let end = b.base + align_up(b.buf.as_ref().map_or(0, |b| b.len())) as u64;
            b.seg != z.seg || end > z.from
        });
        if reached {
            Some(z)
        } else {
            self.zeroing = Some(z);
            None
        }
    }

    /// Stand in a zero write of the caller's for the writer's own (tests of the flush's wait).
    #[cfg(test)]
    pub(super) fn pretend_zeroing(
        &mut self,
        seg: SegmentNo,
        from: u64,
        write: monoio::task::JoinHandle<(io::Result<()>, AlignedBuf)>,
    ) {
        self.zeroing = Some(Zeroing { seg, from, write });
    }

    /// The write handles held, by segment (tests of their open flags).
    #[cfg(test)]
    pub(super) fn write_handles(&self) -> impl Iterator<Item = (SegmentNo, &monoio::fs::File)> {
        self.files.iter().map(|(seg, f)| (*seg, f.as_ref()))
    }

    /// Whether a spare segment is still being prepared (tests).
    #[cfg(test)]
    pub(super) fn spare_in_progress(&self) -> bool {
        self.spare.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// The zeros buffer, back from a finished zero write.
    pub(super) fn zeros_returned(&mut self, zeros: AlignedBuf) {
        self.zeros = Some(zeros);
    }

    /// Bytes of write buffers held: the batches' and the pool's.
    pub(super) fn buffer_bytes(&self) -> usize {
        let batches: usize = self
            .batches
            .iter()
            .filter_map(|b| b.buf.as_ref())
            .map(AlignedBuf::capacity)
            .sum();
        batches + self.pool.free_bytes()
    }

    pub(super) fn has_pending(&self) -> bool {
        self.batches.iter().any(|b| !b.effects.is_empty())
    }

    /// Open a new batch at `base`, starting with the already-written bytes of its first block.
    fn start_batch(&mut self, seg: SegmentNo, base: u64, carried: &[u8]) {
        let mut buf = self.pool.take(BATCH_BUF_BYTES);
        buf.extend_from_slice(carried);
        self.batches.push_back(Batch {
            seg,
            base,
            buf: Some(buf),
            first_lsn: Lsn::NONE,
            effects: Vec::new(),
        });
    }

    pub(super) fn enqueue(
        &mut self,
        record: &Record,
        lsn: Lsn,
        visible: Option<(StreamId, Offset, bool)>,
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
        if batch.first_lsn.is_none() {
            batch.first_lsn = lsn;
        }
        batch.effects.push(Effect { lsn, visible });
        self.write_end += len as u64;
        debug_assert_eq!(batch.base + buf.len() as u64, self.write_end);
        Ok(loc)
    }

    pub(super) fn set_effect(&mut self, lsn: Lsn, id: StreamId, tail: Offset, closed: bool) {
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
    fn roll(&mut self, first_lsn: Lsn) -> Result<(), StorageError> {
        let next = self.write_seg.next();
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

    fn create(&mut self, seg: SegmentNo, first_lsn: Lsn) -> Result<(), StorageError> {
        if let Some(most) = self.disk_segments {
            if segment::list_segments(&self.dir)?.len() >= most {
                return Err(StorageError::NoSpace);
            }
        }
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
        // The handle that made the segment synced its header itself; records go through an
        // O_DSYNC handle, where each write is durable on completion.
        drop(file);
        let file = segment::open_log_writer(&self.dir, seg)?;
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
    pub(super) fn take_batches(&mut self) -> Vec<Batch> {
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
    /// to a kernel worker thread), and it changes extent metadata that its `O_DSYNC` completion
    /// must write out. At a slow fill every small group commit would pay both; zeroing the
    /// next `ZERO_AHEAD_BYTES` in one write pays once for all the commits that land there.
    /// The zeros go through the log's `O_DSYNC` handle, so the conversion is durable when
    /// the write completes and the commits that follow are plain overwrites. The zero
    /// write runs beside the commits; `Shard::finish_zeroing_under` makes a flush
    /// wait for it only if the records catch up with it. At a fast fill the commits are
    /// large, the conversions already few, and writing every block twice would cost
    /// bandwidth, so the blocks are left to the data writes.
    pub(super) fn zero_ahead(&mut self, seg: SegmentNo, end: u64) {
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
    pub(super) fn file_for(&self, seg: SegmentNo) -> Result<Rc<monoio::fs::File>, StorageError> {
        self.files.get(&seg).cloned().ok_or(StorageError::Internal(
            "a segment being written has no write handle",
        ))
    }
}
