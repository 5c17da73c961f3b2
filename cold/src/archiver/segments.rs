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
        now: i64,
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
            Some(e) => {
                e.pieces.push(piece);
                let pieces = std::mem::take(&mut e.pieces);
                let pieces = self.merge_pieces(&path, seg, pieces, m, now).await?;
                if let Some(e) = m.segments.iter_mut().find(|e| e.index == seg) {
                    e.pieces = pieces;
                }
            }
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

    /// Merge the tail of an open segment's `pieces` (the newest just added) so that they
    /// stay few (a lane's restore fetches each one, and the manifest lists each one): see
    /// [`merge_range`]. Below [`LARGE_CLASS`] sizes shrink toward the end with fewer than
    /// [`MERGE_FANOUT`] pieces of each class, so an open segment has a few dozen pieces
    /// however long it stays open, and a byte is uploaded again at most once per class it
    /// climbs. The merged piece is read back from the local
    /// file and checked against the pieces it replaces; those become garbage.
    async fn merge_pieces(
        &mut self,
        path: &Path,
        seg: u64,
        mut pieces: Vec<Piece>,
        m: &mut Manifest,
        now: i64,
    ) -> Result<Vec<Piece>, RoundError> {
        while let Some(range) = merge_range(&pieces) {
            let merged = &pieces[range.clone()];
            let start = merged[0].start;
            let end = merged.last().map_or(start, |p| p.start + p.object.len);
            let bytes = read_at(path, start, Some(end - start))?;
            let same = merged.iter().all(|p| {
                let at = (p.start - start) as usize;
                bytes
                    .get(at..at + p.object.len as usize)
                    .is_some_and(|b| crc32c::crc32c(b) == p.object.crc)
            });
            if !same {
                // Not what was archived: keep the pieces as they are and say so.
                tracing::error!(
                    shard = self.shard,
                    segment = seg,
                    "a segment's local bytes differ from its archived pieces; not merging them"
                );
                break;
            }
            let object = self
                .upload(&self.keys.slice(seg, start, end), Bytes::from(bytes))
                .await?;
            let replaced: Vec<Piece> = pieces.splice(range, [Piece { start, object }]).collect();
            for old in replaced {
                m.drop_object(old.object.key, now);
            }
        }
        Ok(pieces)
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

/// How many pieces of one size class an open segment keeps before merging them.
const MERGE_FANOUT: usize = 8;

/// Pieces of this size class (2 MiB) and up are never uploaded again: a segment holds few
/// of them, and merging them would multiply a busy lane's upload traffic.
const LARGE_CLASS: u32 = 3;

/// A piece's size class: 0 below 32 KiB, then one class per factor of eight.
fn size_class(p: &Piece) -> u32 {
    (p.object.len / 4096).max(1).ilog(8)
}

/// Which of `pieces` to merge into one, if any: the pieces before the last of a smaller
/// class than it (with it, unless it is large), or else [`MERGE_FANOUT`] trailing pieces
/// of one class below [`LARGE_CLASS`].
fn merge_range(pieces: &[Piece]) -> Option<std::ops::Range<usize>> {
    let n = pieces.len();
    let last = size_class(pieces.last()?);
    let smaller = pieces[..n - 1]
        .iter()
        .rev()
        .take_while(|p| size_class(p) < last.min(LARGE_CLASS))
        .count();
    if last >= LARGE_CLASS {
        return (smaller >= 2).then(|| n - 1 - smaller..n - 1);
    }
    if smaller > 0 {
        return Some(n - 1 - smaller..n);
    }
    let run = pieces
        .iter()
        .rev()
        .take_while(|p| size_class(p) == last)
        .count();
    (run >= MERGE_FANOUT).then(|| n - run..n)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Object;

    fn piece(start: u64, len: u64) -> Piece {
        Piece {
            start,
            object: Object {
                key: format!("k{start}"),
                len,
                crc: 0,
            },
        }
    }

    /// Append slices of `lens` one at a time, merging as the archiver does; returns the
    /// pieces and how many bytes the merges uploaded again.
    fn archive(lens: impl IntoIterator<Item = u64>) -> (Vec<Piece>, u64) {
        let mut pieces: Vec<Piece> = Vec::new();
        let mut again = 0;
        for len in lens {
            let start = pieces.last().map_or(0, |p| p.start + p.object.len);
            pieces.push(piece(start, len));
            while let Some(range) = merge_range(&pieces) {
                let start = pieces[range.start].start;
                let end = pieces[range.end - 1].start + pieces[range.end - 1].object.len;
                again += end - start;
                pieces.splice(range, [piece(start, end - start)]);
            }
        }
        (pieces, again)
    }

    fn total(pieces: &[Piece]) -> u64 {
        pieces.iter().map(|p| p.object.len).sum()
    }

    /// At most one piece per 2 MiB and fewer than eight of each smaller class, and each
    /// byte uploaded again a few times at most.
    fn assert_few(pieces: &[Piece], again: u64) {
        let total = total(pieces);
        let most = total / (2 << 20) + 22;
        assert!(pieces.len() as u64 <= most, "{} pieces", pieces.len());
        let most = 7 * total / 2;
        assert!(again <= most, "{again} bytes uploaded again for {total}");
    }

    #[test]
    fn an_open_segment_keeps_few_pieces_and_uploads_each_byte_a_few_times() {
        // 128 MiB in 5 KB slices: what a lane under light steady load archives.
        let (pieces, again) = archive(std::iter::repeat_n(5_000, 26_000));
        assert_eq!(total(&pieces), 26_000 * 5_000);
        assert_few(&pieces, again);
        // Contiguous from the segment's start.
        for w in pieces.windows(2) {
            assert_eq!(w[0].start + w[0].object.len, w[1].start);
        }
    }

    #[test]
    fn slices_of_mixed_sizes_stay_few() {
        // Bursts and quiet spells alternate: larger slices between tiny ones.
        let lens = (0..1_200u64).map(|i| if i % 3 == 0 { 300_000 } else { 700 });
        let (pieces, again) = archive(lens);
        assert_few(&pieces, again);
        for w in pieces.windows(2) {
            assert!(size_class(&w[0]) >= size_class(&w[1]));
        }
    }

    #[test]
    fn large_slices_are_uploaded_once() {
        // A busy lane: 3 MB slices, with a few small ones between.
        let lens = (0..120u64).map(|i| if i % 4 == 3 { 900 } else { 3_000_000 });
        let (pieces, again) = archive(lens);
        let small = 30 * 900;
        assert!(again <= small, "{again} bytes uploaded again");
        assert!(pieces.len() <= 120, "{} pieces", pieces.len());
        assert_eq!(total(&pieces), 90 * 3_000_000 + small);
    }
}
