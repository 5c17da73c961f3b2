//! Recovery: loading the checkpoint, replaying the log after it, and cutting off a torn or
//! corrupt tail.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::rc::Rc;

use bytes::Bytes;

use crate::aligned::{align_down, align_up, AlignedBuf, BufPool};
use crate::checkpoint;
use crate::error::{StorageError, Unrecoverable};
use crate::index::{self, IndexFile, IndexFileNo};
use crate::limits::{BATCH_BUF_BYTES, POOLED_BUF_BYTES_MAX};
use crate::position::{Lsn, Offset, SegmentNo};
use crate::record::{decode_at, AppendRec, FrameError, Record};
use crate::segment::{self, SegmentHeader, DATA_START};
use crate::stream::{DiskLoc, Stream, StreamId};

use super::catalog::Dormant;
use super::writer::{LogWriter, WriterSettings};
use super::{cold_tier, dormancy, FastMap, FastSet, RecoveryReport, Shard};

/// With S3 durability: the streams that records past S3's end of the log changed, each
/// with its tail and closed flag as of that end. Those records were never acknowledged
/// (their WAL object never completed), so they stay unreadable until S3 has them again:
/// a host loss before then would take them back, and a new owner fill the same offsets
/// differently (see `s3_wal`).
pub(super) struct UnackedTails {
    /// S3's end of the log when this server took the shard.
    after: Lsn,
    /// Per stream changed past it: what a reader may see until the archive covers it.
    acked: FastMap<StreamId, (Offset, bool)>,
}

/// What recovery hands on: the log writer, and the streams whose recovered tails wait for
/// S3 (their state as of S3's end, and as recovered), for the S3 WAL to make readable.
pub(super) struct Recovered {
    pub(super) log: LogWriter,
    pub(super) unacked: Vec<(StreamId, Offset, bool)>,
}

/// Where replay ended: the last segment read (its number, the end of its valid records,
/// its contents), the LSN the next record gets, and the first segment that does not
/// continue the log (it and every later one are orphans).
struct ReplayEnd {
    tail: Option<(SegmentNo, u64, Bytes)>,
    next_lsn: Lsn,
    stop_at: Option<usize>,
}

impl Shard {
    /// Rebuild state from the segment files and position the writer after the last valid
    /// record.
    pub(super) fn recover(
        &self,
        dir: &Path,
        report: &mut RecoveryReport,
    ) -> Result<Recovered, StorageError> {
        self.check_cold_marker(dir)?;
        let indexes = segment::list_segments(dir)?;
        let mut rebuild = FastSet::default();
        let resume = self.load_checkpoint(dir, &mut rebuild)?;
        report.checkpoint_lsn = resume.map_or(Lsn::NONE, |p| p.lsn);
        if let Some(p) = resume.filter(|_| !rebuild.is_empty()) {
            let not_local = self
                .inner
                .segments
                .borrow()
                .segments()
                .filter(|s| indexes.binary_search(s).is_err())
                .count();
            if self.cold_tier().is_some() && not_local > 0 {
                return Err(Unrecoverable::RebuildNeedsColdSegments {
                    streams: rebuild.len(),
                    cold: not_local,
                }
                .into());
            }
            self.rebuild_tables(dir, &indexes, p.lsn, &rebuild)?;
        }
        let mut unacked = self.unacked_tails();
        let end = self.replay_segments(dir, &indexes, resume, &mut unacked, report)?;
        if let Some(first_orphan) = end.stop_at {
            self.remove_orphans(dir, &indexes[first_orphan..], report)?;
        }
        if let (Some(p), None) = (resume, &end.tail) {
            return Err(Unrecoverable::ResumeSegmentMissing(p.segment).into());
        }
        let log = self.open_log(dir, end.tail, end.next_lsn, report)?;
        let unacked = self.finish_streams(unacked);
        // A long replay is worth a checkpoint at the first upkeep round.
        self.inner
            .checkpoints
            .borrow_mut()
            .replayed(report.log_bytes);
        self.remove_unreferenced_blobs(dir);
        let kept = &indexes[..end.stop_at.unwrap_or(indexes.len())];
        self.settle_segment_map(dir, kept, resume)?;
        Ok(Recovered { log, unacked })
    }

    /// With S3 durability (acknowledging after S3), what tracks the streams changed past
    /// S3's end of the log during replay.
    fn unacked_tails(&self) -> Option<UnackedTails> {
        let cfg = &self.inner.cfg;
        cfg.s3_wal.as_ref().filter(|s| !s.ack_before_s3)?;
        let store = cfg.cold.as_ref()?;
        Some(UnackedTails {
            after: store.s3_end(cfg.shard).map_or(Lsn::NONE, |e| e.lsn),
            acked: FastMap::default(),
        })
    }

    /// Record `lsn` (of stream `id`) is about to be replayed: past S3's end, note the
    /// stream's state before its first such record.
    fn note_unacked(&self, unacked: &mut Option<UnackedTails>, lsn: Lsn, id: StreamId) {
        let Some(u) = unacked.as_mut().filter(|u| lsn > u.after) else {
            return;
        };
        if u.acked.contains_key(&id) {
            return;
        }
        // A dormant stream's state is read back first, as replaying it would.
        self.wake(id);
        let before = self
            .inner
            .catalog
            .borrow()
            .get(id)
            .map_or((Offset::ZERO, false), |s| (s.tail, s.closed));
        u.acked.insert(id, before);
    }

    /// A shard whose directory says some segments are only in the cold tier cannot start
    /// without that tier.
    fn check_cold_marker(&self, dir: &Path) -> Result<(), StorageError> {
        let marked = dir.join(cold_tier::COLD_MARKER).exists();
        match self.cold_tier() {
            None if marked => Err(Unrecoverable::ColdTierMissing {
                dir: dir.to_owned(),
                marker: cold_tier::COLD_MARKER,
            }
            .into()),
            Some(tier) => {
                tier.marked.set(marked);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Replay every record after the checkpoint (all of them without one), segment by
    /// segment, until the log ends: in a zero header, a torn or corrupt record, or a segment
    /// that does not continue the one before.
    fn replay_segments(
        &self,
        dir: &Path,
        indexes: &[SegmentNo],
        resume: Option<checkpoint::Position>,
        unacked: &mut Option<UnackedTails>,
        report: &mut RecoveryReport,
    ) -> Result<ReplayEnd, StorageError> {
        // With a checkpoint, replay starts right after its LSN at the position it names;
        // segments before that position are not read at all.
        let mut expected: Option<Lsn> = resume.map(|p| p.lsn.next());
        let mut prev_index: Option<SegmentNo> = None;
        let mut tail = None;
        let mut stash = Stash::new();
        let mut stop_at = None;
        for (i, &index) in indexes.iter().enumerate() {
            if resume.is_some_and(|p| index < p.segment) {
                continue;
            }
            let path = segment::segment_path(dir, index);
            let resume_at = resume
                .filter(|p| p.segment == index)
                .map_or(0, |p| p.offset);
            let buf = Bytes::from_owner(segment::read_written(&path, resume_at)?);
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
                return Err(Unrecoverable::SegmentHeader(path).into());
            };
            let resume_here = resume.filter(|p| p.segment == index);
            let adjacent = prev_index.is_some_and(|p| p.next() == index);
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
            let (lsn, pos) = match resume_here {
                Some(p) => {
                    if p.offset < DATA_START || p.offset > buf.len() as u64 {
                        return Err(Unrecoverable::ResumeOutsideSegment {
                            segment: index,
                            offset: p.offset,
                        }
                        .into());
                    }
                    (p.lsn.next(), p.offset as usize)
                }
                None => (header.first_lsn, DATA_START as usize),
            };
            let at = (lsn, pos);
            let (lsn, end) = self.replay_segment(index, &buf, at, &mut stash, unacked, report);
            report.segments += 1;
            expected = Some(lsn);
            prev_index = Some(index);
            tail = Some((index, end as u64, buf));
        }
        if !stash.is_empty() {
            tracing::debug!(
                streams = stash.len(),
                "dropping data of streams deleted before cleaning"
            );
        }
        Ok(ReplayEnd {
            tail,
            next_lsn: expected.unwrap_or(Lsn::FIRST),
            stop_at,
        })
    }

    /// Replay the records of segment `index` (contents `buf`) from position `pos`, the first
    /// with LSN `lsn`, until one does not decode or breaks the LSN sequence. Returns the
    /// next LSN and the end of the last valid record.
    fn replay_segment(
        &self,
        index: SegmentNo,
        buf: &Bytes,
        (mut lsn, mut pos): (Lsn, usize),
        stash: &mut Stash,
        unacked: &mut Option<UnackedTails>,
        report: &mut RecoveryReport,
    ) -> (Lsn, usize) {
        let scan_start = pos;
        let why = loop {
            match decode_at(buf, pos) {
                Ok(f) if f.lsn == lsn => {
                    let loc = DiskLoc {
                        segment: index,
                        record_pos: pos as u64,
                        record_len: f.len as u32,
                        data_off: 0,
                    };
                    self.note_unacked(unacked, lsn, f.record.stream_id());
                    self.replay(f.record, loc, stash);
                    report.records += 1;
                    pos += f.len;
                    lsn = lsn.next();
                }
                Ok(_) => break FrameError::Malformed,
                Err(e) => break e,
            }
        };
        if why != FrameError::End {
            tracing::warn!(
                shard = self.inner.cfg.shard,
                segment = index.get(),
                position = pos,
                reason = ?why,
                "log ends in a torn or corrupt record; truncating there"
            );
        }
        report.log_bytes += (pos - scan_start) as u64;
        (lsn, pos)
    }

    /// Delete the segments written after the end of the valid log.
    fn remove_orphans(
        &self,
        dir: &Path,
        orphans: &[SegmentNo],
        report: &mut RecoveryReport,
    ) -> Result<(), StorageError> {
        for &index in orphans {
            tracing::warn!(
                shard = self.inner.cfg.shard,
                segment = index.get(),
                "removing segment written after the end of the valid log"
            );
            std::fs::remove_file(segment::segment_path(dir, index))?;
            report.orphan_segments += 1;
        }
        segment::sync_dir(dir)?;
        Ok(())
    }

    /// The log writer, positioned after the last valid record of `tail` (zeroing what lies
    /// beyond it), or at the start of a new first segment when there is no log yet.
    fn open_log(
        &self,
        dir: &Path,
        tail: Option<(SegmentNo, u64, Bytes)>,
        next_lsn: Lsn,
        report: &mut RecoveryReport,
    ) -> Result<LogWriter, StorageError> {
        let cfg = &self.inner.cfg;
        // The segment replay continues in is not sealed; the ones before it were indexed by
        // the checkpoint's roll, or their pages are in the checkpoint itself.
        if let Some((index, ..)) = &tail {
            self.inner
                .index_files
                .borrow_mut()
                .indexed(index.prev().unwrap_or_default());
        }
        let pool = BufPool::new(BATCH_BUF_BYTES, 4, POOLED_BUF_BYTES_MAX);
        let mut log = LogWriter::new(
            WriterSettings {
                dir: dir.to_path_buf(),
                shard: cfg.shard,
                segment_bytes: cold_tier::effective_segment_bytes(cfg),
                disk_segments: cfg.disk_segments,
                spare_fill_time: cfg.spare_fill_time,
                zero_ahead_below: cfg.zero_ahead_below,
            },
            pool,
        );
        // A spare left by an earlier run may be half written; the next slow roll makes a
        // new one.
        segment::remove_spare(dir)?;
        match tail {
            Some((index, end, contents)) => {
                report.dropped_bytes = zero_stale_tail(dir, index, end, &contents)?;
                let file = segment::open_log_writer(dir, index)?;
                log.resume(index, end, monoio::fs::File::from_std(file)?, &contents);
                self.inner
                    .group_commit
                    .borrow_mut()
                    .resume(next_lsn, (index, end));
            }
            None => {
                let first = SegmentNo::new(1);
                log.start(first, next_lsn)?;
                self.inner
                    .group_commit
                    .borrow_mut()
                    .resume(next_lsn, (first, DATA_START));
            }
        }
        Ok(log)
    }

    /// Make every replayed stream's data visible (up to S3's end of the log for those
    /// changed past it: returned with their recovered ends), and count the live bytes.
    fn finish_streams(&self, unacked: Option<UnackedTails>) -> Vec<(StreamId, Offset, bool)> {
        let mut live = 0;
        let mut hidden = Vec::new();
        let acked = unacked.map(|u| u.acked).unwrap_or_default();
        let mut catalog = self.inner.catalog.borrow_mut();
        for s in catalog.resident_mut() {
            s.finish_recovery();
            let (tail, closed) = (s.tail, s.closed);
            match acked.get(&s.id) {
                Some(&(acked_tail, acked_closed)) => {
                    s.make_visible(acked_tail, acked_closed);
                    hidden.push((s.id, tail, closed));
                }
                None => s.make_visible(tail, closed),
            }
            live += s.data_bytes();
        }
        live += catalog.dormant_data_bytes();
        drop(catalog);
        self.inner.segments.borrow_mut().set_live(live);
        hidden
    }

    /// The segment map after replay: the segments `kept` on the local disk, those the
    /// checkpoint names that are in the cold tier only, and nothing else.
    fn settle_segment_map(
        &self,
        dir: &Path,
        kept: &[SegmentNo],
        resume: Option<checkpoint::Position>,
    ) -> Result<(), StorageError> {
        let mut segments = self.inner.segments.borrow_mut();
        for &index in kept {
            segments.add_segment(index);
        }
        // Segments before a checkpoint were not read; the checkpoint's map says which
        // streams have data in them. It may still name a segment the cleaner deleted
        // after that checkpoint, once its chunks were relocated (replayed above). With a
        // cold tier, such a segment before the checkpoint's position is cold: eviction
        // deleted it (or the cleaner did, and then nothing points into it any more).
        if let (Some(tier), Some(p)) = (self.cold_tier(), resume) {
            let mut cold = tier.segments.borrow_mut();
            for seg in segments.segments() {
                if seg < p.segment && kept.binary_search(&seg).is_err() {
                    cold.insert(seg);
                }
            }
        }
        segments.retain(|seg| kept.binary_search(&seg).is_ok() || self.is_cold(seg));
        // Every cold segment has been cleaned away: the shard no longer needs S3 to start.
        // Only known with a checkpoint: without one, no segment is taken for cold.
        if let Some(tier) = self
            .cold_tier()
            .filter(|t| t.marked.get() && resume.is_some())
        {
            if tier.segments.borrow().is_empty() {
                std::fs::remove_file(dir.join(cold_tier::COLD_MARKER))?;
                tier.marked.set(false);
            }
        }
        if segments.is_empty() {
            segments.add_segment(SegmentNo::new(1));
        }
        Ok(())
    }

    /// Load the checkpoint, if there is one, into the shard. A checkpoint that cannot be
    /// read is fatal: the cleaner may already have dropped the log records it replaced.
    pub(super) fn load_checkpoint(
        &self,
        dir: &Path,
        rebuild: &mut FastSet<StreamId>,
    ) -> Result<Option<checkpoint::Position>, StorageError> {
        let _ = std::fs::remove_file(dir.join(checkpoint::TMP_NAME));
        let path = checkpoint::path(dir);
        // Read into a buffer mapped from the kernel (for a large checkpoint), which goes
        // back to it as soon as decoding is done: from the allocator, tens of megabytes
        // freed during start-up stayed resident until it purged them.
        let file = match segment::read_whole(&path) {
            Ok(f) => Bytes::from_owner(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.adopt_index_files(dir, &BTreeMap::new())?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let shard = self.inner.cfg.shard;
        let mut opened: BTreeMap<IndexFileNo, Option<Rc<IndexFile>>> = BTreeMap::new();
        let mut open_index = |number: IndexFileNo| {
            opened
                .entry(number)
                .or_insert_with(|| match IndexFile::open(dir, shard, number) {
                    Ok(f) => Some(Rc::new(f)),
                    Err(why) => {
                        tracing::warn!(
                            shard,
                            file = number.get(),
                            "index file unusable ({why}); rebuilding from the log"
                        );
                        None
                    }
                })
                .clone()
        };
        let mut dormant_failed = None;
        let decoded = checkpoint::decode(shard, &file, &mut open_index, &mut |d| {
            if dormant_failed.is_none() {
                dormant_failed = self.load_dormant(d, rebuild).err();
            }
        });
        let (pos, saved, segments) = decoded.map_err(|why| {
            StorageError::from(Unrecoverable::CheckpointCorrupt {
                path: path.clone(),
                why,
            })
        })?;
        if let Some(e) = dormant_failed {
            return Err(e);
        }
        let now = crate::now_ms();
        for st in saved {
            let stream = match st.tables {
                Some((chunks, msgs)) => {
                    Stream::from_checkpoint(&st.image, chunks, msgs, !st.unnumbered, now)
                }
                None => {
                    rebuild.insert(st.image.id);
                    Stream::needing_rebuild(&st.image, now)
                }
            };
            self.insert_stream(stream, Lsn::NONE);
        }
        {
            let mut map = self.inner.segments.borrow_mut();
            for (seg, ids) in segments {
                map.extend(seg, ids);
            }
        }
        self.adopt_index_files(dir, &opened)?;
        {
            let mut catalog = self.inner.catalog.borrow_mut();
            catalog.taken_below(pos.next_id);
            catalog.incarnation_taken(pos.last_incarnation);
        }
        self.inner.blobs.borrow_mut().counted(pos.blob_counter);
        self.inner
            .checkpoints
            .borrow_mut()
            .loaded(file.len() as u64, pos.segment);
        tracing::info!(
            shard = self.inner.cfg.shard,
            lsn = pos.lsn.get(),
            streams = self.inner.catalog.borrow().len(),
            dormant = self.inner.catalog.borrow().dormant_count(),
            "loaded checkpoint"
        );
        Ok(Some(pos))
    }

    /// Enter one of the checkpoint's dormant streams into the catalog. One whose saved state
    /// is in a missing or torn index file cannot be recovered (the log before the
    /// checkpoint may be gone): that is an error, as a corrupt checkpoint is. One whose
    /// tables' pages are in such a file is woken now and its tables rebuilt from the log
    /// (`rebuild`).
    fn load_dormant(
        &self,
        d: checkpoint::SavedDormant,
        rebuild: &mut FastSet<StreamId>,
    ) -> Result<(), StorageError> {
        let Some(state) = d.state else {
            return Err(Unrecoverable::DormantStateMissing {
                file: d.state_file,
                key: d.key,
            }
            .into());
        };
        if d.pins_complete {
            self.inner.catalog.borrow_mut().insert_dormant(
                d.id,
                d.key,
                Dormant {
                    state,
                    deadline_ms: d.deadline_ms,
                    data_bytes: d.data_bytes,
                },
                d.pins.into_boxed_slice(),
            );
            return Ok(());
        }
        let bytes = state.file.saved_state(state.off, state.len);
        let stream = dormancy::decode_needing_rebuild(&bytes, self.clock_ms()).map_err(|why| {
            Unrecoverable::DormantStateCorrupt {
                key: d.key.clone(),
                why,
            }
        })?;
        rebuild.insert(d.id);
        self.insert_stream(stream, Lsn::NONE);
        Ok(())
    }

    /// Keep the index files the checkpoint named and opened (`named`), and delete the
    /// others: written after it was installed, for one that never was, or before the first
    /// one. Nothing refers to those, and the replay completes their pages again.
    fn adopt_index_files(
        &self,
        dir: &Path,
        named: &BTreeMap<IndexFileNo, Option<Rc<IndexFile>>>,
    ) -> Result<(), StorageError> {
        for number in index::list(dir)? {
            match named.get(&number) {
                Some(Some(f)) => {
                    self.inner.index_files.borrow_mut().add(number, f.clone());
                }
                _ => std::fs::remove_file(index::index_path(dir, number))?,
            }
        }
        Ok(())
    }

    /// Apply a recovered record. Stream data stays on disk until first read. Records of a
    /// stream whose creation was cleaned away are stashed until its image arrives.
    pub(super) fn replay(&self, record: Record, loc: DiskLoc, stash: &mut Stash) {
        let now = crate::now_ms();
        let window = self.inner.cfg.receipt_window;
        let id = record.stream_id();
        self.inner.segments.borrow_mut().note(loc.segment, id);
        self.inner.catalog.borrow_mut().taken_below(id + 1);
        // A record for a stream that sleeps applies to its state, read back first.
        self.wake(id);
        match record {
            Record::Create(c) => {
                let mut stream = Stream::from_create(&c, now);
                let loc = loc.with_data(c.initial.data.len());
                stream.apply_append(&c.initial, window, now, Some(loc), false);
                self.insert_stream(stream, Lsn::NONE);
            }
            Record::Append(a) => {
                let loc = loc.with_data(a.data.len());
                let mut catalog = self.inner.catalog.borrow_mut();
                match catalog.get_mut(a.id) {
                    Some(s) if a.start == s.tail => {
                        s.apply_append(&a, window, now, Some(loc), false);
                    }
                    Some(s) => add_chunks(s, &a, loc),
                    None => stash.entry(a.id).or_default().push((strip(a), loc)),
                }
            }
            Record::Relocate(a) => {
                let loc = loc.with_data(a.data.len());
                match self.inner.catalog.borrow_mut().get_mut(a.id) {
                    Some(s) => add_chunks(s, &a, loc),
                    None => stash.entry(a.id).or_default().push((strip(a), loc)),
                }
            }
            Record::Image(i) => {
                let known = self.inner.catalog.borrow().contains(i.id);
                if known {
                    if let Some(s) = self.inner.catalog.borrow_mut().get_mut(i.id) {
                        s.apply_image(&i);
                    }
                } else {
                    self.insert_stream(Stream::from_image(&i, now), Lsn::NONE);
                }
                if let Some(pending) = stash.remove(&i.id) {
                    if let Some(s) = self.inner.catalog.borrow_mut().get_mut(i.id) {
                        for (a, loc) in &pending {
                            add_chunks(s, a, *loc);
                        }
                    }
                }
            }
            Record::Delete { id } => {
                stash.remove(&id);
                self.inner.catalog.borrow_mut().remove(id);
            }
            Record::SetExt { id, ext } => {
                if let Some(s) = self.inner.catalog.borrow_mut().get_mut(id) {
                    s.meta.ext = ext;
                }
            }
            // For a stream not known yet, its image (later in the log) carries both.
            Record::Snapshot { id, meta } => {
                if let Some(s) = self.inner.catalog.borrow_mut().get_mut(id) {
                    s.snapshot = Some(meta);
                }
            }
            Record::Retain {
                id,
                offset,
                first_record,
            } => {
                if let Some(s) = self.inner.catalog.borrow_mut().get_mut(id) {
                    s.retain(offset, first_record);
                }
            }
        }
    }
}

impl Shard {
    /// Rebuild the chunk tables and record indexes of `ids` (whose pages were in an index
    /// file that is missing or torn) from the records up to the checkpoint's `lsn`: every
    /// Create, Append and Relocate of theirs still in the log. The cleaner relocates a
    /// stream's live chunks before it deletes a segment, so they are all still there.
    fn rebuild_tables(
        &self,
        dir: &Path,
        indexes: &[SegmentNo],
        lsn: Lsn,
        ids: &FastSet<StreamId>,
    ) -> Result<(), StorageError> {
        tracing::warn!(
            shard = self.inner.cfg.shard,
            streams = ids.len(),
            "rebuilding index pages from the log"
        );
        let mut catalog = self.inner.catalog.borrow_mut();
        for &index in indexes {
            let path = segment::segment_path(dir, index);
            let buf = Bytes::from_owner(segment::read_whole(&path)?);
            if SegmentHeader::decode(&buf).is_none() {
                continue;
            }
            let mut pos = DATA_START as usize;
            while let Ok(f) = decode_at(&buf, pos) {
                if f.lsn > lsn {
                    break;
                }
                let loc = DiskLoc {
                    segment: index,
                    record_pos: pos as u64,
                    record_len: f.len as u32,
                    data_off: 0,
                };
                pos += f.len;
                let a = match f.record {
                    Record::Create(c) if ids.contains(&c.id) => AppendRec {
                        id: c.id,
                        ..c.initial
                    },
                    Record::Append(a) | Record::Relocate(a) if ids.contains(&a.id) => a,
                    _ => continue,
                };
                if let Some(s) = catalog.get_mut(a.id) {
                    if a.start < s.tail {
                        add_chunks(s, &a, loc.with_data(a.data.len()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Recovered chunks waiting for the image of their stream.
pub(super) type Stash = HashMap<StreamId, Vec<(AppendRec, DiskLoc)>>;

/// An append without its data (recovery only needs the boundaries and the location).
pub(super) fn strip(a: AppendRec) -> AppendRec {
    AppendRec {
        data: Bytes::new(),
        producer: None,
        stream_seq: None,
        ..a
    }
}

/// Add the chunks of a (possibly stripped) append at `loc` to a recovering stream.
pub(super) fn add_chunks(s: &mut Stream, a: &AppendRec, loc: DiskLoc) {
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

/// Zero whatever follows the last valid record in the segment we continue writing, so a
/// half-written record from before the crash can never line up with new records and be
/// read back as valid. Returns the number of non-zero bytes dropped.
pub(super) fn zero_stale_tail(
    dir: &Path,
    index: SegmentNo,
    end: u64,
    contents: &[u8],
) -> Result<u64, StorageError> {
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
        segment = index.get(),
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
