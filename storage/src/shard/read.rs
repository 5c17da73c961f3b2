//! The read path: planning a read from the cache and the log, and fetching evicted chunks
//! with verified direct-I/O reads (see `readback`), or from the cold tier for segments that
//! left the local disk (see `cold_tier`); every record's checksum is checked either way.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};

use crate::error::{Corruption, StorageError};
use crate::limits::{READS_IN_FLIGHT_MAX, READ_IN_FLIGHT_BYTES_MAX};
use crate::position::{Offset, SegmentNo};
use crate::readback::{self, Part, Span};
use crate::record::decode_at;
use crate::segment;
use crate::stream::{DiskLoc, Piece, StreamId};

use super::{Durability, Shard};

impl Shard {
    /// Bytes of `[from, to)` of a stream (clamped to what is durable), as zero-copy slices.
    /// Cached data comes from memory. The rest is read from the log with direct I/O
    /// (neighbouring records in one read, several reads at once; see `readback`), each
    /// record's checksum verified, and cached again.
    pub async fn read(
        &self,
        id: StreamId,
        from: Offset,
        to: Offset,
    ) -> Result<Vec<Bytes>, StorageError> {
        let plan = match self.state_mut(id) {
            Some(mut s) => s.read_plan(from, to),
            None => return Ok(Vec::new()),
        };
        let mut out = Vec::with_capacity(plan.len());
        let mut spans: Vec<Span> = Vec::new();
        let (mut hit, mut missed) = (0, 0);
        for piece in plan {
            match piece {
                Piece::Memory(b) => {
                    hit += b.len() as u64;
                    out.push(b);
                }
                Piece::Disk {
                    loc,
                    chunk_start,
                    chunk_len,
                    from,
                    to,
                } => {
                    missed += (to - from) as u64;
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
                        let segment = part.loc.segment;
                        let file = match self.is_cold(segment) {
                            true => None,
                            false => Some(self.reader(segment)?),
                        };
                        spans.push(Span::new(file, part));
                    }
                }
            }
        }
        let mut stats = self.inner.stats.get();
        stats.read_cache_hit_bytes += hit;
        stats.read_cache_miss_bytes += missed;
        self.inner.stats.set(stats);
        let cold = spans.iter().any(|s| s.file.is_none());
        let mut spans = spans.into_iter().peekable();
        while spans.peek().is_some() {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(span) = spans.next_if(|s| {
                batch.is_empty()
                    || (batch.len() < READS_IN_FLIGHT_MAX
                        && bytes + s.read_len() <= READ_IN_FLIGHT_BYTES_MAX)
            }) {
                bytes += span.read_len();
                batch.push(span);
            }
            let mut stats = self.inner.stats.get();
            for span in batch.iter().filter(|s| s.file.is_some()) {
                stats.disk_reads += 1;
                stats.disk_read_bytes += span.read_len();
            }
            self.inner.stats.set(stats);
            let loaded =
                readback::join_all(batch.iter().map(|s| self.read_span(s)).collect()).await;
            for (span, result) in batch.iter().zip(loaded) {
                let (buf, buf_pos) = result?;
                self.place_span(id, span, &buf, buf_pos, &mut out)?;
            }
        }
        if cold {
            let end = from.saturating_add(out.iter().map(|b| b.len() as u64).sum());
            if self.cold_read_is_sequential(id, from, end) {
                self.read_ahead(id, end);
            }
        }
        self.evict_over_budget();
        Ok(out)
    }

    /// Verify the records of a loaded span, fill the response pieces its parts stand for,
    /// and cache their chunks again: chunks that follow each other in the stream go into
    /// one run, copied out of the span buffer unless a chunk is most of it, so the cache
    /// never pins a large read buffer for a small chunk.
    pub(super) fn place_span(
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
            // Not if it went dormant (or was deleted) while the span loaded.
            let added = match self.inner.catalog.borrow_mut().get_mut(id) {
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

    /// Read a span's bytes: from its local file with direct I/O, or from the cold tier.
    /// Returns them and the segment position of their first byte.
    async fn read_span(&self, span: &Span) -> Result<(Bytes, u64), StorageError> {
        match &span.file {
            Some(file) => Ok(readback::read_aligned(file, span.start, span.end).await?),
            None => self.read_cold(span.segment, span.start, span.end).await,
        }
    }

    /// Read one chunk's bytes from its log record (local or cold).
    pub(super) async fn load(&self, loc: DiskLoc, len: u32) -> Result<Bytes, StorageError> {
        let record_end = loc.record_pos + u64::from(loc.record_len);
        let (bytes, start) = if self.is_cold(loc.segment) {
            self.read_cold(loc.segment, loc.record_pos, record_end)
                .await?
        } else {
            let file = self.reader(loc.segment)?;
            readback::read_aligned(&file, loc.record_pos, record_end).await?
        };
        let at = (loc.record_pos - start) as usize;
        verify_record(&bytes, at, loc)?;
        let data_start = at + loc.data_off as usize;
        Ok(bytes.slice(data_start..data_start + len as usize))
    }

    pub(super) fn reader(&self, segment: SegmentNo) -> Result<Rc<monoio::fs::File>, StorageError> {
        if let Some(f) = self.inner.readers.borrow().get(&segment) {
            return Ok(f.clone());
        }
        let Durability::Disk(root) = &self.inner.cfg.durability else {
            return Err(StorageError::Internal("disk read in memory mode"));
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
}

/// Check the record that `loc` names, found at `at` in `buf`: its checksum, and that it is
/// still the record the chunk table points at (same framed length).
pub(super) fn verify_record(buf: &Bytes, at: usize, loc: DiskLoc) -> Result<(), StorageError> {
    let framed = decode_at(buf, at).map_err(|problem| Corruption::Record {
        segment: loc.segment,
        position: loc.record_pos,
        problem,
    })?;
    if framed.len != loc.record_len as usize {
        return Err(Corruption::RecordMoved {
            segment: loc.segment,
            position: loc.record_pos,
        }
        .into());
    }
    Ok(())
}
