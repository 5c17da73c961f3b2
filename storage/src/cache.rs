//! A stream's cached bytes: contiguous runs of stream data held in memory.
//!
//! Small appends are packed into shared blocks as they arrive, so reading recent history
//! (a replay of 200 one-kilobyte events, a catch-up read) sends a few large slices instead
//! of one refcounted piece per append. Per-piece bookkeeping (a `Bytes` clone and drop, an
//! iovec) and short kernel copies were the largest costs of such reads after the copy itself.
//!
//! Every run covers whole chunks (appends), which keeps "is this chunk cached" a question
//! about one run. The block being filled (`open`) is sealed into a run when it is full, when
//! a large append arrives, or when a read reaches into it.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};

use crate::limits::{CACHE_BLOCK_BYTES_MAX, CACHE_BLOCK_BYTES_MIN, CACHE_PACK_BYTES_MAX};
use crate::position::Offset;

#[derive(Default)]
pub(crate) struct StreamCache {
    /// Sealed runs by start offset; they never overlap.
    runs: BTreeMap<Offset, Bytes>,
    /// The block small appends are being packed into: stream bytes
    /// `[open_start, open_start + open.len())`.
    open: BytesMut,
    open_start: Offset,
    /// The last block filled up to `CACHE_BLOCK_BYTES_MAX`: the stream is busy, so the next block
    /// starts at full size instead of growing by doubling (each step a realloc and a copy).
    busy: bool,
    /// Bytes cached, sealed and open.
    len: usize,
    /// Starts of runs (and open blocks) created since the shard last took them, for its
    /// eviction order.
    fresh: Vec<Offset>,
}

/// One step of a read over cached and uncached ranges (see [`StreamCache::walk`]).
pub(crate) enum Extent {
    Cached(Bytes),
    /// `[start, end)` is not cached.
    Missing {
        start: Offset,
        end: Offset,
    },
}

impl StreamCache {
    /// Heap bytes of the cache's bookkeeping (the runs' map and the fresh list; the cached
    /// bytes themselves are counted by the shard's read cache).
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.runs.len() * (size_of::<(Offset, Bytes)>() + 16)
            + self.fresh.capacity() * size_of::<Offset>()
    }

    /// Cache one appended chunk's bytes; it starts at stream offset `start`.
    pub(crate) fn insert_append(&mut self, start: Offset, data: &Bytes) {
        if data.is_empty() {
            return;
        }
        self.len += data.len();
        if data.len() > CACHE_PACK_BYTES_MAX {
            self.seal();
            self.runs.insert(start, data.clone());
            self.fresh.push(start);
            return;
        }
        let open_end = self.open_start + self.open.len() as u64;
        if !self.open.is_empty()
            && (open_end != start || self.open.len() + data.len() > CACHE_BLOCK_BYTES_MAX)
        {
            self.busy = self.open.len() + data.len() > CACHE_BLOCK_BYTES_MAX;
            self.seal();
        }
        if self.open.is_empty() {
            self.open_start = start;
            self.fresh.push(start);
            let first = if self.busy {
                CACHE_BLOCK_BYTES_MAX
            } else {
                CACHE_BLOCK_BYTES_MIN
            };
            if self.open.capacity() < data.len().max(first) {
                self.open = BytesMut::with_capacity(data.len().max(first).next_power_of_two());
            }
        } else if self.open.capacity() - self.open.len() < data.len() {
            // Capacities stay powers of two up to CACHE_BLOCK_BYTES_MAX, which the block's new length
            // does not exceed (checked above).
            let need = (self.open.len() + data.len()).next_power_of_two();
            let cap = (self.open.capacity() * 2)
                .max(need)
                .min(CACHE_BLOCK_BYTES_MAX);
            self.open.reserve(cap - self.open.len());
        }
        self.open.extend_from_slice(data);
    }

    /// Cache bytes read back from the log for the chunk `[start, start + data.len())`,
    /// unless some of it is cached already. Returns whether they were added.
    pub(crate) fn insert_loaded(&mut self, start: Offset, data: &Bytes) -> bool {
        let end = start + data.len() as u64;
        if data.is_empty() || self.overlaps(start, end) {
            return false;
        }
        self.runs.insert(start, data.clone());
        self.fresh.push(start);
        self.len += data.len();
        true
    }

    /// The cached bytes `[start, start + len)`, if one run holds them all.
    pub(crate) fn get(&self, start: Offset, len: usize) -> Option<Bytes> {
        let end = start + len as u64;
        if let Some((&s, b)) = self.runs.range(..=start).next_back() {
            if s + b.len() as u64 >= end {
                return Some(b.slice((start - s) as usize..(end - s) as usize));
            }
        }
        let open_end = self.open_start + self.open.len() as u64;
        (start >= self.open_start && end <= open_end && !self.open.is_empty()).then(|| {
            let a = (start - self.open_start) as usize;
            Bytes::copy_from_slice(&self.open[a..a + len])
        })
    }

    /// Walk `[from, to)` in order, as slices of cached runs and the ranges between them
    /// that are not cached. Seals the open block first if the range reaches into it.
    pub(crate) fn walk(&mut self, from: Offset, to: Offset, mut visit: impl FnMut(Extent)) {
        if from >= to {
            return;
        }
        if !self.open.is_empty() && self.open_start < to {
            self.seal();
        }
        let first = match self.runs.range(..=from).next_back() {
            Some((&s, b)) if s + b.len() as u64 > from => s,
            _ => from,
        };
        let mut pos = from;
        for (&s, b) in self.runs.range(first..to) {
            if s > pos {
                visit(Extent::Missing { start: pos, end: s });
                pos = s;
            }
            let end = (s + b.len() as u64).min(to);
            visit(Extent::Cached(
                b.slice((pos - s) as usize..(end - s) as usize),
            ));
            pos = end;
        }
        if pos < to {
            visit(Extent::Missing {
                start: pos,
                end: to,
            });
        }
    }

    /// Drop the run (or open block) that starts at `start` if `evictable(start, end)`
    /// says it may go. Returns the bytes freed.
    pub(crate) fn evict(
        &mut self,
        start: Offset,
        evictable: impl Fn(Offset, Offset) -> bool,
    ) -> usize {
        if let Some(b) = self.runs.get(&start) {
            if !evictable(start, start + b.len() as u64) {
                return 0;
            }
            let n = b.len();
            self.runs.remove(&start);
            self.len -= n;
            return n;
        }
        let n = self.open.len();
        if n > 0 && self.open_start == start && evictable(start, start + n as u64) {
            self.open = BytesMut::new();
            self.len -= n;
            return n;
        }
        0
    }

    /// End offset of the run (or open block) that starts at `start`, if there is one.
    pub(crate) fn end_of(&self, start: Offset) -> Option<Offset> {
        match self.runs.get(&start) {
            Some(b) => Some(start + b.len() as u64),
            None => (!self.open.is_empty() && self.open_start == start)
                .then(|| start + self.open.len() as u64),
        }
    }

    /// Drop everything that ends at or before `offset`. Returns the bytes freed.
    pub(crate) fn trim(&mut self, offset: Offset) -> usize {
        let mut freed = 0;
        while let Some(entry) = self.runs.first_entry() {
            if *entry.key() + entry.get().len() as u64 > offset {
                break;
            }
            freed += entry.remove().len();
        }
        if !self.open.is_empty() && self.open_start + self.open.len() as u64 <= offset {
            freed += self.open.len();
            self.open = BytesMut::new();
        }
        self.len -= freed;
        freed
    }

    /// Bytes cached.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Starts of the runs created since the last call, oldest first. Drained rather than
    /// taken, so the list keeps its allocation across appends.
    pub(crate) fn drain_fresh(&mut self) -> std::vec::Drain<'_, Offset> {
        self.fresh.drain(..)
    }

    /// Turn the open block into a run. A block with much unused capacity is copied into an
    /// exact-size buffer, so sealed runs never hold more than a quarter of slack.
    fn seal(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let used = self.open.len();
        let run = if self.open.capacity() - used > used / 4 {
            let copy = Bytes::copy_from_slice(&self.open);
            self.open = BytesMut::new();
            copy
        } else {
            std::mem::take(&mut self.open).freeze()
        };
        self.runs.insert(self.open_start, run);
    }

    fn overlaps(&self, start: Offset, end: Offset) -> bool {
        let run_overlaps = self
            .runs
            .range(..end)
            .next_back()
            .is_some_and(|(&s, b)| s + b.len() as u64 > start);
        let open_end = self.open_start + self.open.len() as u64;
        run_overlaps || (!self.open.is_empty() && self.open_start < end && start < open_end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::off;

    /// The walk over `[from, to)`, missing ranges as numbers.
    fn collect(c: &mut StreamCache, from: u64, to: u64) -> Vec<(bool, Vec<u8>, u64, u64)> {
        let mut out = Vec::new();
        c.walk(off(from), off(to), |s| match s {
            Extent::Cached(b) => out.push((true, b.to_vec(), 0, 0)),
            Extent::Missing { start, end } => out.push((false, Vec::new(), start.get(), end.get())),
        });
        out
    }

    fn filled(pattern: u8, n: usize) -> Bytes {
        Bytes::from(vec![pattern; n])
    }

    #[test]
    fn small_appends_read_back_as_one_piece() {
        let mut c = StreamCache::default();
        let mut want = Vec::new();
        let mut pos = Offset::ZERO;
        for i in 0..50u8 {
            let d = filled(i, 1000);
            c.insert_append(pos, &d);
            want.extend_from_slice(&d);
            pos += 1000;
        }
        assert_eq!(c.len(), 50_000);
        assert_eq!(
            c.drain_fresh().collect::<Vec<_>>(),
            vec![off(0)],
            "one block"
        );
        let pieces = collect(&mut c, 0, pos.get());
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].1, want);
        // A sub-range is a slice of the same run.
        let pieces = collect(&mut c, 1500, 2500);
        assert_eq!(pieces, vec![(true, want[1500..2500].to_vec(), 0, 0)]);
    }

    #[test]
    fn blocks_are_sealed_at_the_size_limit_and_large_appends_stand_alone() {
        let mut c = StreamCache::default();
        let mut pos = Offset::ZERO;
        let mut want = Vec::new();
        for i in 0..100u8 {
            let d = filled(i, 1 << 10);
            c.insert_append(pos, &d);
            want.extend_from_slice(&d);
            pos += d.len() as u64;
        }
        let big = filled(0xee, CACHE_PACK_BYTES_MAX + 1);
        c.insert_append(pos, &big);
        want.extend_from_slice(&big);
        pos += big.len() as u64;
        let tail = filled(0xaa, 10);
        c.insert_append(pos, &tail);
        want.extend_from_slice(&tail);
        pos += 10;
        let blocks = (100 << 10) / CACHE_BLOCK_BYTES_MAX as u64;
        let fresh = c.drain_fresh().collect::<Vec<_>>();
        assert_eq!(fresh[..2], [off(0), off(CACHE_BLOCK_BYTES_MAX as u64)]);
        assert_eq!(
            fresh.len() as u64,
            blocks + 1 + 1 + 1,
            "blocks, the big append, the tail"
        );
        let pieces = collect(&mut c, 0, pos.get());
        assert_eq!(pieces.len(), 4);
        assert!(pieces.iter().all(|p| p.0));
        assert_eq!(pieces.concat_bytes(), want);
        assert_eq!(c.len(), want.len());
    }

    trait Concat {
        fn concat_bytes(&self) -> Vec<u8>;
    }
    impl Concat for Vec<(bool, Vec<u8>, u64, u64)> {
        fn concat_bytes(&self) -> Vec<u8> {
            self.iter().flat_map(|p| p.1.iter().copied()).collect()
        }
    }

    #[test]
    fn a_read_seals_the_open_block_and_packing_starts_a_new_one() {
        let mut c = StreamCache::default();
        c.insert_append(off(0), &filled(1, 100));
        assert_eq!(collect(&mut c, 0, 100).len(), 1);
        c.insert_append(off(100), &filled(2, 100));
        assert_eq!(c.drain_fresh().collect::<Vec<_>>(), vec![off(0), off(100)]);
        let pieces = collect(&mut c, 50, 200);
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces.concat_bytes(), [vec![1; 50], vec![2; 100]].concat());
        // A read that stops before the open block leaves it open.
        c.insert_append(off(200), &filled(3, 100));
        collect(&mut c, 0, 200);
        c.insert_append(off(300), &filled(4, 100));
        assert_eq!(c.drain_fresh().collect::<Vec<_>>(), vec![off(200)]);
        assert_eq!(collect(&mut c, 200, 400).len(), 1);
    }

    #[test]
    fn gaps_are_reported_as_missing_ranges() {
        let mut c = StreamCache::default();
        c.insert_append(off(0), &filled(1, 100));
        c.insert_append(off(100), &filled(2, 100));
        c.insert_append(off(200), &filled(3, 100));
        collect(&mut c, 0, 300);
        assert_eq!(c.evict(off(0), |_, _| true), 300);
        assert_eq!(c.len(), 0);
        assert!(c.insert_loaded(off(100), &filled(2, 100)));
        assert!(!c.insert_loaded(off(150), &filled(2, 10)), "overlaps");
        let pieces = collect(&mut c, 10, 290);
        assert_eq!(
            pieces,
            vec![
                (false, vec![], 10, 100),
                (true, vec![2; 100], 0, 0),
                (false, vec![], 200, 290),
            ]
        );
        assert_eq!(c.get(off(120), 10), Some(filled(2, 10)));
        assert_eq!(c.get(off(190), 20), None, "not all cached");
    }

    #[test]
    fn eviction_asks_and_trim_drops_what_ends_before_the_offset() {
        let mut c = StreamCache::default();
        c.insert_append(off(0), &filled(1, 100));
        collect(&mut c, 0, 100);
        c.insert_append(off(100), &filled(2, 100));
        assert_eq!(c.end_of(off(0)), Some(off(100)));
        assert_eq!(c.end_of(off(100)), Some(off(200)), "the open block");
        assert_eq!(c.evict(off(100), |_, end| end <= off(150)), 0, "refused");
        assert_eq!(
            c.get(off(100), 100),
            Some(filled(2, 100)),
            "read from the open block"
        );
        assert_eq!(c.evict(off(100), |_, _| true), 100);
        assert_eq!(c.end_of(off(100)), None);
        c.insert_append(off(200), &filled(3, 100));
        assert_eq!(c.trim(off(150)), 100, "the first run");
        assert_eq!(c.trim(off(250)), 0, "the open block ends after 250");
        assert_eq!(c.trim(off(300)), 100);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn open_blocks_grow_in_powers_of_two_and_stay_at_least_half_full() {
        let mut c = StreamCache::default();
        let mut pos = Offset::ZERO;
        for len in [100, 300, 8000, 20, 5000, 8192, 8192, 8192, 8192, 8192, 8192] {
            c.insert_append(pos, &filled(1, len));
            pos += len as u64;
            let cap = c.open.capacity();
            assert!(
                cap.is_power_of_two() && cap <= CACHE_BLOCK_BYTES_MAX,
                "capacity {cap}"
            );
            assert!(
                c.open.len() * 2 > cap || cap == CACHE_BLOCK_BYTES_MIN,
                "{} bytes in {cap}",
                c.open.len()
            );
        }
    }

    #[test]
    fn a_sparse_block_is_copied_on_seal_and_a_full_one_is_frozen_in_place() {
        let mut c = StreamCache::default();
        c.insert_append(off(0), &filled(1, 10));
        let block = c.open.as_ptr();
        collect(&mut c, 0, 10);
        let run = c.runs.get(&off(0)).expect("sealed");
        assert_ne!(
            run.as_ptr(),
            block,
            "10 bytes of a 256-byte block are copied out"
        );
        assert_eq!(run.len(), 10);
        assert_eq!(c.open.capacity(), 0, "the block itself is released");

        c.insert_append(off(10), &filled(2, 4000));
        let block = c.open.as_ptr();
        collect(&mut c, 0, 4010);
        let run = c.runs.get(&off(10)).expect("sealed");
        assert_eq!(
            run.as_ptr(),
            block,
            "a nearly full block becomes the run as it is"
        );
        assert_eq!(&run[..], &[2; 4000][..]);
    }
}
