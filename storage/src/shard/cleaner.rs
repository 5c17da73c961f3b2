//! Reclaiming space: live-data accounting and the cleaner that rewrites the oldest
//! segment's live chunks at the head and deletes it.

use crate::error::StorageError;
use crate::position::{Lsn, SegmentNo};
use crate::record::{AppendRec, Record};
use crate::segment;
use crate::segment::segment_path;

use super::writer::LogWriter;
use super::Shard;

impl Shard {
    pub(super) fn add_live(&self, bytes: u64) {
        self.inner.segments.borrow_mut().add_live(bytes);
    }

    /// Segments and the bytes they occupy (preallocated size; local and cold), the local
    /// part of them, and live data bytes.
    pub fn disk_usage(&self) -> DiskUsage {
        let segments = self.inner.segments.borrow().len();
        let local = self.local_segments();
        DiskUsage {
            segments,
            segment_bytes: segments as u64 * self.segment_bytes(),
            local_segments: local,
            local_segment_bytes: local as u64 * self.segment_bytes(),
            live_bytes: self.inner.segments.borrow().live_bytes(),
        }
    }

    pub(super) fn segment_bytes(&self) -> u64 {
        self.inner
            .log
            .borrow()
            .as_ref()
            .map_or(self.inner.cfg.segment_bytes, LogWriter::segment_bytes)
    }

    /// Reclaim space: while the segment files take more than twice the live data (plus the
    /// segment being written), move the live content of the oldest segment to the head of
    /// the log and delete it. A segment is only deleted once a checkpoint covers it.
    ///
    /// The rule counts cold segments as well as local ones: the log is one log wherever its
    /// segments are, and dead data in the cold tier costs storage too. Cleaning a cold
    /// segment reads its live chunks through the cold tier (throttled like any cold read);
    /// its objects become unreferenced once the next checkpoint no longer names it. The
    /// local disk is bounded by eviction, not by cleaning.
    /// Returns the number of segments removed.
    pub async fn clean(&self) -> Result<usize, StorageError> {
        self.wait_for_upkeep().await;
        let result = self.clean_while_wasteful().await;
        self.inner.upkeep_busy.set(false);
        result
    }

    pub(super) async fn clean_while_wasteful(&self) -> Result<usize, StorageError> {
        let mut removed = 0;
        let round = self.inner.segments.borrow().len();
        loop {
            let write_seg = match self.inner.log.borrow().as_ref() {
                Some(l) => l.write_segment(),
                None => return Ok(removed),
            };
            let Some(oldest) = self.inner.segments.borrow().oldest() else {
                return Ok(removed);
            };
            let usage = self.disk_usage();
            let seg = self.segment_bytes();
            if oldest >= write_seg || usage.segment_bytes <= 2 * usage.live_bytes + seg {
                return Ok(removed);
            }
            if !self.archived_whole(oldest) {
                return Ok(removed);
            }
            if self
                .inner
                .checkpoints
                .borrow()
                .replay_from()
                .is_none_or(|c| oldest >= c)
            {
                self.write_checkpoint().await?;
            }
            self.clean_segment(oldest).await?;
            removed += 1;
            // Live data that fills most of a segment moves into a new one as fast as the
            // old one goes: clean each segment at most once a round rather than copy the
            // same data round forever.
            if removed >= round {
                return Ok(removed);
            }
        }
    }

    /// With a cold tier, a sealed segment leaves the local disk only once the archive has
    /// it whole. Otherwise the archiver, which finds sealed segments by listing the local
    /// files, would never upload it: the archive would keep it as the slices it had, which
    /// may stop short of its end, and until a newer checkpoint is archived the archived log
    /// would have a hole a restore replays across. Cleaning waits for the next archive
    /// round instead (a second, or the length of an S3 outage: the disk holds the log
    /// meanwhile, as for eviction). Once archiving has stopped for good (fenced), nothing
    /// will archive the segment and no archive of this log is kept: cleaning goes on as
    /// without a cold tier.
    fn archived_whole(&self, segment: SegmentNo) -> bool {
        match &self.inner.cfg.cold {
            Some(cold) => {
                self.is_cold(segment)
                    || cold.is_archived(self.inner.cfg.shard, segment)
                    || cold.stopped()
            }
            None => true,
        }
    }

    /// Rewrite what is still needed from `segment` (an image of every live stream with
    /// records there, and its chunks stored there) at the head, then delete the file.
    pub(super) async fn clean_segment(&self, segment: SegmentNo) -> Result<(), StorageError> {
        // Everything in older segments must be durable before we rely on rewriting it.
        self.commit(self.last_lsn()).durable().await?;
        let ids = self.inner.segments.borrow().streams_in(segment);
        let mut moves = Vec::new();
        let mut last_lsn = Lsn::NONE;
        for id in ids {
            let (image, chunks) = match self.state(id) {
                Some(s) => (s.image(), s.chunks_in_segment(segment)),
                None => continue,
            };
            last_lsn = self.log_record(&Record::Image(image), None)?.0;
            for (start, len, loc, msg_lens) in chunks {
                let cached = self.state(id).and_then(|s| s.cached_chunk(start, len));
                let data = match cached {
                    Some(d) => d,
                    None => self.load(loc, len).await?,
                };
                if self.state(id).is_none() {
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
        if !last_lsn.is_none() {
            self.commit(last_lsn).durable().await?;
        }
        for (id, start, loc) in moves {
            if let Some(mut s) = self.state_mut(id) {
                s.relocate(start, loc);
            }
        }
        self.inner.segments.borrow_mut().remove(segment);
        self.inner.readers.borrow_mut().remove(&segment);
        let cold = self.is_cold(segment);
        if let Some(tier) = self.cold_tier() {
            // Its objects in the cold tier go once no checkpoint names the segment.
            tier.forget(segment);
        }
        let dir = self.inner.log.borrow_mut().as_mut().map(|log| {
            log.forget_segment(segment);
            log.dir().to_path_buf()
        });
        if let Some(dir) = dir.filter(|_| !cold) {
            segment::remove_durable(&segment_path(&dir, segment), &dir).await?;
        }
        tracing::debug!(
            shard = self.inner.cfg.shard,
            segment = segment.get(),
            "segment reclaimed"
        );
        Ok(())
    }
}

/// Space taken by a shard's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    /// Segments of the log, local or only in the cold tier.
    pub segments: usize,
    /// Preallocated bytes of all segment files, local or cold.
    pub segment_bytes: u64,
    /// The segment files on the local disk, and their bytes.
    pub local_segments: usize,
    pub local_segment_bytes: u64,
    pub live_bytes: u64,
}
