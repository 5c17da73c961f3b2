//! The log's segments in the archive: sealed segments uploaded whole (replacing their
//! slices), the segment being written uploaded as slices up to the durable end, and
//! segments the archived checkpoint no longer needs dropped.

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use ursula_storage::cold::DurableEnd;
use ursula_storage::segment::{self, DATA_START};
use ursula_storage::SegmentNo;

use super::worker::{RoundError, Worker};
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, Piece};

impl Worker {
    /// Upload sealed segment `s` whole, in place of any slices of it.
    pub(super) async fn archive_sealed(
        &mut self,
        m: &mut Manifest,
        s: u64,
        now: i64,
    ) -> Result<(), RoundError> {
        let path = segment::segment_path(&self.dir, SegmentNo::new(s));
        let mut bytes = read_at(&path, 0, None)?;
        let file_len = bytes.len() as u64;
        // Only up to the end of the records: the rest is the zeroed preallocation.
        let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let keep =
            (used.div_ceil(DATA_START as usize) * DATA_START as usize).max(DATA_START as usize);
        bytes.truncate(keep.min(bytes.len()));
        let object = self
            .upload(&self.keys.sealed(s), Bytes::from(bytes))
            .await?;
        let entry = manifest::Segment {
            index: s,
            file_len,
            sealed: true,
            pieces: vec![Piece { start: 0, object }],
        };
        match m.segments.iter_mut().find(|e| e.index == s) {
            Some(e) => {
                let old = std::mem::replace(e, entry);
                for p in old.pieces {
                    m.garbage.push(manifest::Garbage {
                        key: p.object.key,
                        since_ms: now,
                    });
                }
            }
            None => {
                m.segments.push(entry);
                m.segments.sort_by_key(|e| e.index);
            }
        }
        Ok(())
    }

    /// Upload the segment being written from where its archive ends up to `point`.
    pub(super) async fn archive_slice(
        &mut self,
        m: &mut Manifest,
        point: DurableEnd,
        _now: i64,
    ) -> Result<(), RoundError> {
        let seg = point.segment.get();
        let start = match m.segments.iter().find(|e| e.index == seg) {
            Some(e) if e.sealed => return Ok(()),
            Some(e) => e.pieces.last().map_or(0, |p| p.start + p.object.len),
            None => 0,
        };
        if point.position <= start {
            return Ok(());
        }
        let path = segment::segment_path(&self.dir, point.segment);
        let file_len = std::fs::metadata(&path).map_err(Error::io(&path))?.len();
        self.segment_bytes = file_len;
        let bytes = read_at(&path, start, Some(point.position - start))?;
        let object = self
            .upload(
                &self.keys.slice(seg, start, point.position),
                Bytes::from(bytes),
            )
            .await?;
        let piece = Piece { start, object };
        match m.segments.iter_mut().find(|e| e.index == seg) {
            Some(e) => e.pieces.push(piece),
            None => {
                m.segments.push(manifest::Segment {
                    index: seg,
                    file_len,
                    sealed: false,
                    pieces: vec![piece],
                });
                m.segments.sort_by_key(|e| e.index);
            }
        }
        Ok(())
    }

    /// Drop segments the manifest's checkpoint no longer needs: it needs those its segment
    /// map names and every one from its log position on.
    pub(super) fn keep_needed_segments(&self, m: &mut Manifest, now: i64) {
        let Some(c) = &m.checkpoint else { return };
        let (from, map): (u64, BTreeSet<u64>) = (c.segment, c.segments.iter().copied().collect());
        let (keep, drop): (Vec<_>, Vec<_>) = std::mem::take(&mut m.segments)
            .into_iter()
            .partition(|s| s.index >= from || map.contains(&s.index));
        m.segments = keep;
        for s in drop {
            for p in s.pieces {
                m.drop_object(p.object.key, now);
            }
        }
    }
}

/// `len` bytes of the file at `path` from `offset` on (`None`: to its end).
fn read_at(path: &Path, offset: u64, len: Option<u64>) -> Result<Vec<u8>> {
    let read = || {
        let file = std::fs::File::open(path)?;
        let len = match len {
            Some(n) => n,
            None => file.metadata()?.len().saturating_sub(offset),
        };
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, offset)?;
        Ok(bytes)
    };
    read().map_err(Error::io(path))
}
