//! Sorted per-stream tables kept packed: a stream's chunk table and its record index.
//!
//! Both grow by one entry per append (or per record) and are read far more often at their
//! newest end than anywhere else. So the newest entries stay in a plain `Vec`, where appends
//! update them in place, and every full group of [`BLOCK`] older ones is frozen into a block:
//! its first entry as it is, the others as LEB128 varint deltas from their predecessor. A
//! chunk then costs about 12 bytes of memory instead of its 40-byte entry plus `Vec` growth
//! slack, and a record start 1-2 bytes instead of 8.
//!
//! A lookup binary-searches the blocks by their first entries and decodes one block; an
//! in-order walk decodes each block once. Entries are addressed by their position in the
//! table; dropping entries from the front (retention) moves a skip counter instead of
//! re-encoding, so every block keeps exactly `BLOCK` entries and position arithmetic stays
//! a division.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;

/// Entries per frozen block: a lookup decodes at most this many.
pub(crate) const BLOCK: usize = 64;

/// An entry that can be stored as a delta from the entry before it.
pub(crate) trait Delta: Copy + 'static {
    /// Append `self` as a delta from `prev`.
    fn put(&self, prev: &Self, out: &mut Vec<u8>);
    /// Read the entry after `prev` at `*at`, advancing `*at`.
    fn get(prev: &Self, buf: &[u8], at: &mut usize) -> Self;
    /// This thread's last decoded block of this entry type (see [`Memo`]).
    fn memo() -> &'static LocalKey<RefCell<Memo<Self>>>;
}

/// The last block a thread decoded for a lookup, so that lookups walking one block in
/// order (a read response counting its records, a read and the recache after it) decode
/// it once rather than once per entry. One per thread and entry type, not per table, so
/// it costs no memory per stream.
pub(crate) struct Memo<T> {
    /// `Packed::stamp` of the table the block belongs to (0: none yet).
    stamp: u64,
    block: usize,
    entries: Vec<T>,
}

impl<T> Default for Memo<T> {
    fn default() -> Self {
        Memo {
            stamp: 0,
            block: 0,
            entries: Vec::new(),
        }
    }
}

/// Stamps identify a table's frozen blocks as they are: every table starts with a fresh
/// one and takes another whenever its blocks change or move. A clone shares its stamp with
/// identical blocks, so a memo is never stale.
fn fresh_stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A sorted table of `T`, newest entries unpacked.
#[derive(Clone, Debug)]
pub(crate) struct Packed<T: Delta> {
    frozen: Vec<Block<T>>,
    /// Identifies the frozen blocks as they are now (see [`fresh_stamp`]).
    stamp: u64,
    /// Entries at the front of the first block that were dropped: below `BLOCK`, and 0
    /// while there are no blocks.
    skip: usize,
    tail: Vec<T>,
}

#[derive(Clone, Debug)]
struct Block<T> {
    first: T,
    /// The other `BLOCK - 1` entries, each a delta from the one before.
    rest: Box<[u8]>,
}

impl<T: Delta> Default for Packed<T> {
    fn default() -> Self {
        Packed {
            frozen: Vec::new(),
            stamp: fresh_stamp(),
            skip: 0,
            tail: Vec::new(),
        }
    }
}

impl<T: Delta> Packed<T> {
    /// A table of `entries`, sorted, all unpacked (recovery builds tables this way and
    /// freezes them once they are complete).
    pub(crate) fn from_entries(entries: Vec<T>) -> Self {
        Packed {
            frozen: Vec::new(),
            stamp: fresh_stamp(),
            skip: 0,
            tail: entries,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.frozen.len() * BLOCK + self.tail.len() - self.skip
    }

    /// The entries not frozen yet: the newest ones, in order.
    pub(crate) fn unpacked(&self) -> &[T] {
        &self.tail
    }

    pub(crate) fn unpacked_mut(&mut self) -> &mut [T] {
        &mut self.tail
    }

    pub(crate) fn push(&mut self, entry: T) {
        self.tail.push(entry);
    }

    /// Freeze every full group of `BLOCK` unpacked entries but the newest `keep`, so the
    /// caller can still change those in place.
    pub(crate) fn freeze(&mut self, keep: usize) {
        let groups = self.tail.len().saturating_sub(keep) / BLOCK;
        if groups == 0 {
            return;
        }
        let mut scratch = Vec::with_capacity(BLOCK * 12);
        for g in self.tail[..groups * BLOCK].chunks_exact(BLOCK) {
            scratch.clear();
            for w in g.windows(2) {
                w[1].put(&w[0], &mut scratch);
            }
            self.frozen.push(Block {
                first: g[0],
                rest: scratch.as_slice().into(),
            });
        }
        // Blocks were only added: those a memo may hold are unchanged and keep their
        // positions, so the stamp stays.
        self.tail.drain(..groups * BLOCK);
        // A table loaded whole (recovery) would otherwise keep its unpacked capacity.
        if self.tail.capacity() > 4 * BLOCK {
            self.tail.shrink_to(2 * BLOCK);
        }
    }

    /// Entry `i`, or None past the end.
    pub(crate) fn get(&self, i: usize) -> Option<T> {
        let p = i + self.skip;
        let frozen = self.frozen.len() * BLOCK;
        if p >= frozen {
            return self.tail.get(p - frozen).copied();
        }
        Some(self.with_block(p / BLOCK, |entries| entries[p % BLOCK]))
    }

    /// Run `f` on the decoded entries of frozen block `b`, decoding it unless this thread's
    /// memo holds it already.
    fn with_block<R>(&self, b: usize, f: impl FnOnce(&[T]) -> R) -> R {
        T::memo().with(|memo| {
            let mut memo = memo.borrow_mut();
            if memo.stamp != self.stamp || memo.block != b || memo.entries.is_empty() {
                memo.entries.clear();
                memo.entries.extend(decode(&self.frozen[b]));
                memo.stamp = self.stamp;
                memo.block = b;
            }
            f(&memo.entries)
        })
    }

    /// The number of leading entries for which `pred` holds, which must be true for a
    /// prefix of the table and false after it (as for `slice::partition_point`).
    pub(crate) fn partition_point(&self, mut pred: impl FnMut(&T) -> bool) -> usize {
        // Most lookups are near the newest end: answer those from the unpacked entries
        // without decoding a block.
        if !self.frozen.is_empty() && self.tail.first().is_some_and(&mut pred) {
            return self.frozen.len() * BLOCK - self.skip + self.tail.partition_point(pred);
        }
        let b = self.frozen.partition_point(|blk| pred(&blk.first));
        let physical = if b == 0 {
            if self.frozen.is_empty() {
                self.tail.partition_point(pred)
            } else {
                0
            }
        } else {
            let inside = self.with_block(b - 1, |entries| entries.partition_point(&mut pred));
            if inside < BLOCK || b < self.frozen.len() {
                (b - 1) * BLOCK + inside
            } else {
                self.frozen.len() * BLOCK + self.tail.partition_point(pred)
            }
        };
        physical.max(self.skip) - self.skip
    }

    /// Entries from `i` on, in order; each block is decoded once.
    pub(crate) fn iter_from(&self, i: usize) -> Iter<'_, T> {
        let p = i + self.skip;
        let mut it = Iter {
            table: self,
            block: p / BLOCK,
            current: None,
            tail: 0,
        };
        if it.block < self.frozen.len() {
            let mut d = decode(&self.frozen[it.block]);
            for _ in 0..p % BLOCK {
                d.next();
            }
            it.current = Some(d);
        } else {
            it.block = self.frozen.len();
            it.tail = p - self.frozen.len() * BLOCK;
        }
        it
    }

    pub(crate) fn iter(&self) -> Iter<'_, T> {
        self.iter_from(0)
    }

    /// Drop the first `n` entries, handing each to `dropped` first.
    pub(crate) fn drop_front(&mut self, n: usize, mut dropped: impl FnMut(&T)) {
        let n = n.min(self.len());
        for e in self.iter().take(n) {
            dropped(&e);
        }
        self.skip += n;
        let whole = (self.skip / BLOCK).min(self.frozen.len());
        if whole > 0 {
            self.frozen.drain(..whole);
            self.stamp = fresh_stamp();
        }
        self.skip -= whole * BLOCK;
        if self.frozen.is_empty() {
            self.tail.drain(..self.skip);
            self.skip = 0;
        }
    }

    /// Insert `entry` at position `i` (recovery, which may find entries out of order). A
    /// position inside the frozen blocks unpacks the whole table first.
    pub(crate) fn insert(&mut self, i: usize, entry: T) {
        self.unpack_below(i);
        let at = i + self.skip - self.frozen.len() * BLOCK;
        self.tail.insert(at, entry);
    }

    /// Change entry `i` in place; a frozen one is decoded, changed and re-encoded, which
    /// must keep the table sorted.
    pub(crate) fn update(&mut self, i: usize, change: impl FnOnce(&mut T)) {
        let p = i + self.skip;
        let frozen = self.frozen.len() * BLOCK;
        if p >= frozen {
            if let Some(e) = self.tail.get_mut(p - frozen) {
                change(e);
            }
            return;
        }
        self.stamp = fresh_stamp();
        let blk = &mut self.frozen[p / BLOCK];
        let mut entries: Vec<T> = decode(blk).collect();
        change(&mut entries[p % BLOCK]);
        let mut rest = Vec::with_capacity(blk.rest.len() + 8);
        for w in entries.windows(2) {
            w[1].put(&w[0], &mut rest);
        }
        *blk = Block {
            first: entries[0],
            rest: rest.into(),
        };
    }

    /// Bytes of heap memory the table holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.frozen.capacity() * std::mem::size_of::<Block<T>>()
            + self.frozen.iter().map(|b| b.rest.len()).sum::<usize>()
            + self.tail.capacity() * std::mem::size_of::<T>()
    }

    /// Unpack the block holding position `i` and every block after it.
    fn unpack_below(&mut self, i: usize) {
        let p = i + self.skip;
        if p >= self.frozen.len() * BLOCK {
            return;
        }
        let from = p / BLOCK;
        let mut unpacked = Vec::with_capacity((self.frozen.len() - from) * BLOCK + self.tail.len());
        for blk in &self.frozen[from..] {
            unpacked.extend(decode(blk));
        }
        unpacked.append(&mut self.tail);
        self.frozen.truncate(from);
        self.stamp = fresh_stamp();
        if from == 0 {
            // The dropped entries of the first block were decoded too.
            unpacked.drain(..self.skip);
            self.skip = 0;
        }
        self.tail = unpacked;
    }
}

/// The entries of a block, in order.
fn decode<T: Delta>(blk: &Block<T>) -> Cursor<'_, T> {
    Cursor {
        blk,
        prev: None,
        at: 0,
    }
}

struct Cursor<'a, T> {
    blk: &'a Block<T>,
    prev: Option<T>,
    at: usize,
}

impl<T: Delta> Iterator for Cursor<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        let e = match self.prev {
            None => self.blk.first,
            Some(p) if self.at < self.blk.rest.len() => T::get(&p, &self.blk.rest, &mut self.at),
            Some(_) => return None,
        };
        self.prev = Some(e);
        Some(e)
    }
}

/// In-order walk from some position (see [`Packed::iter_from`]).
pub(crate) struct Iter<'a, T: Delta> {
    table: &'a Packed<T>,
    block: usize,
    current: Option<Cursor<'a, T>>,
    tail: usize,
}

impl<T: Delta> Iterator for Iter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        loop {
            if let Some(cur) = &mut self.current {
                if let Some(e) = cur.next() {
                    return Some(e);
                }
                self.current = None;
                self.block += 1;
                if self.block < self.table.frozen.len() {
                    self.current = Some(decode(&self.table.frozen[self.block]));
                    continue;
                }
            }
            let e = self.table.tail.get(self.tail).copied();
            self.tail += 1;
            return e;
        }
    }
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Read a varint written by [`put_varint`] from a buffer this module wrote.
pub(crate) fn get_varint(buf: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return v;
        }
        shift += 7;
    }
}

/// Signed deltas (a relocated chunk's record may sit before its predecessor's) as small
/// varints.
pub(crate) fn put_signed(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

pub(crate) fn get_signed(buf: &[u8], at: &mut usize) -> i64 {
    let v = get_varint(buf, at);
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Record starts: strictly increasing offsets.
impl Delta for u64 {
    fn put(&self, prev: &u64, out: &mut Vec<u8>) {
        put_varint(out, self.wrapping_sub(*prev));
    }

    fn get(prev: &u64, buf: &[u8], at: &mut usize) -> u64 {
        prev.wrapping_add(get_varint(buf, at))
    }

    fn memo() -> &'static LocalKey<RefCell<Memo<u64>>> {
        thread_local!(static MEMO: RefCell<Memo<u64>> = RefCell::new(Memo::default()));
        &MEMO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(n: u64) -> Vec<u64> {
        (0..n).map(|i| i * 3 + (i % 7) * 1000).collect()
    }

    #[test]
    fn varints_and_signed_deltas_round_trip() {
        let mut out = Vec::new();
        let values = [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX];
        let signed = [0, -1, 1, -64, 64, i64::MIN, i64::MAX];
        for v in values {
            put_varint(&mut out, v);
        }
        for v in signed {
            put_signed(&mut out, v);
        }
        let mut at = 0;
        for v in values {
            assert_eq!(get_varint(&out, &mut at), v);
        }
        for v in signed {
            assert_eq!(get_signed(&out, &mut at), v);
        }
        assert_eq!(at, out.len());
    }

    #[test]
    fn frozen_and_unpacked_entries_read_the_same() {
        // Sorted, with deltas of every size class.
        let n = 10 * BLOCK as u64 + 5;
        let mut want: Vec<u64> = Vec::new();
        let mut t = Packed::default();
        let mut v = 0u64;
        for i in 0..n {
            v += 1 + (i % 5) * (1 << (7 * (i % 4)));
            want.push(v);
            t.push(v);
        }
        t.freeze(3);
        assert_eq!(t.len(), want.len());
        assert!(t.unpacked().len() < BLOCK + 3 && t.unpacked().len() >= 3);
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(t.get(i), Some(w), "entry {i}");
        }
        assert_eq!(t.get(want.len()), None);
        for from in [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            want.len() - 2,
            want.len(),
        ] {
            assert_eq!(t.iter_from(from).collect::<Vec<_>>(), want[from..].to_vec());
        }
        for probe in [0, 1, want[0], want[63], want[64], want[65], v, v + 1] {
            assert_eq!(
                t.partition_point(|&m| m < probe),
                want.partition_point(|&m| m < probe),
                "probe {probe}"
            );
            assert_eq!(
                t.partition_point(|&m| m <= probe),
                want.partition_point(|&m| m <= probe)
            );
        }
    }

    #[test]
    fn packed_entries_take_a_fraction_of_their_unpacked_size() {
        // Starts of 100-byte records: a one-byte delta each.
        let n = 100_000;
        let mut t = Packed::from_entries((0..n as u64).map(|i| i * 100).collect());
        t.freeze(0);
        assert!(
            t.heap_bytes() < 2 * n,
            "{} bytes for {n} entries",
            t.heap_bytes()
        );
        assert_eq!(t.get(n - 1), Some((n as u64 - 1) * 100));
    }

    #[test]
    fn block_boundaries_hold_at_every_size() {
        for n in [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 2 * BLOCK + 1] {
            let mut want = model(n as u64);
            want.sort_unstable();
            let mut t = Packed::default();
            for &w in &want {
                t.push(w);
            }
            t.freeze(0);
            assert_eq!(t.len(), n);
            assert_eq!(t.iter().collect::<Vec<_>>(), want, "n {n}");
            assert_eq!(t.get(0), want.first().copied());
            assert_eq!(t.get(n.wrapping_sub(1)), want.last().copied());
            assert_eq!(t.unpacked().len(), n % BLOCK);
        }
    }

    #[test]
    fn dropping_the_front_keeps_positions_and_frees_whole_blocks() {
        let want: Vec<u64> = (0..(5 * BLOCK as u64)).map(|i| i * 10).collect();
        let mut t = Packed::default();
        for &w in &want {
            t.push(w);
        }
        t.freeze(0);
        let mut seen = Vec::new();
        t.drop_front(BLOCK + 3, |&e| seen.push(e));
        assert_eq!(seen, want[..BLOCK + 3].to_vec());
        assert_eq!(t.len(), want.len() - BLOCK - 3);
        assert_eq!(t.frozen.len(), 4, "the whole first block is gone");
        assert_eq!(t.get(0), Some(want[BLOCK + 3]));
        assert_eq!(t.get(0), Some(want[BLOCK + 3]));
        assert_eq!(t.iter().collect::<Vec<_>>(), want[BLOCK + 3..].to_vec());
        assert_eq!(
            t.partition_point(|&m| m < 5),
            0,
            "dropped entries do not count"
        );
        assert_eq!(
            t.partition_point(|&m| m < want[2 * BLOCK]),
            2 * BLOCK - (BLOCK + 3)
        );
        t.drop_front(usize::MAX, |_| {});
        assert_eq!(t.len(), 0);
        t.push(7);
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![7]);
    }

    #[test]
    fn dropping_unpacked_entries_then_freezing_starts_at_the_first_live_one() {
        let mut t = Packed::default();
        for i in 0..(BLOCK as u64 + 10) {
            t.push(i);
        }
        t.drop_front(4, |_| {});
        t.freeze(0);
        assert_eq!(t.len(), BLOCK + 6);
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            (4..(BLOCK as u64 + 10)).collect::<Vec<_>>()
        );
        assert_eq!(t.unpacked().len(), 6);
        assert_eq!(t.get(0), Some(4));
    }

    #[test]
    fn lookups_never_see_a_stale_block() {
        let mut a: Packed<u64> = Packed::from_entries((0..(3 * BLOCK as u64)).collect());
        a.freeze(0);
        let b = a.clone();
        assert_eq!(a.get(5), Some(5), "decodes block 0 of a (and b)");
        a.update(6, |e| *e += 1000 - 6);
        a.update(7, |e| *e += 1000 - 6);
        assert_eq!(a.get(6), Some(1000));
        assert_eq!(b.get(6), Some(6), "the clone keeps its own blocks");
        assert_eq!(a.get(7), Some(1001));
        let mut c = b.clone();
        c.drop_front(BLOCK, |_| {});
        assert_eq!(c.get(0), Some(BLOCK as u64), "blocks moved");
        assert_eq!(b.get(0), Some(0));
        assert_eq!(c.partition_point(|&m| m < BLOCK as u64 + 3), 3);
        c.insert(1, BLOCK as u64);
        assert_eq!(c.get(1), Some(BLOCK as u64));
        assert_eq!(c.get(2), Some(BLOCK as u64 + 1));
    }

    #[test]
    fn inserts_and_updates_reach_frozen_entries() {
        let mut want: Vec<u64> = (0..(3 * BLOCK as u64)).map(|i| i * 10).collect();
        let mut t = Packed::default();
        for &w in &want {
            t.push(w);
        }
        t.freeze(0);
        t.update(BLOCK + 1, |e| *e += 1);
        want[BLOCK + 1] += 1;
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        t.insert(5, 45);
        want.insert(5, 45);
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        t.insert(t.len(), 100_000);
        want.push(100_000);
        t.freeze(0);
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(t.get(i), Some(w));
        }
    }
}
