//! Sorted per-stream tables kept packed: a stream's chunk table and its record index.
//!
//! Both grow by one entry per append (or per record) and are read far more often at their
//! newest end than anywhere else. So the newest entries stay in a plain `Vec`, where appends
//! update them in place, and every full group of [`PACKED_BLOCK_ENTRIES`] older ones is frozen into a block:
//! its first entry as it is, the others as LEB128 varint deltas from their predecessor.
//! Every full group of [`PACKED_PAGE_BLOCKS`] blocks then becomes a page: one byte string holding the
//! blocks and their first entries, with a CRC, the unit that is written to an index file
//! beside the segments (`crate::index`). Once written, memory keeps only the page's first
//! entry and where it lies in its file, so a stream's memory does not grow with its
//! history; a lookup that lands in the page reads it through the core's page cache.
//!
//! A lookup binary-searches the pages by their first entries, then the page's blocks by
//! theirs, and decodes one block; an in-order walk decodes each block once. Entries are
//! addressed by their position in the table; dropping entries from the front (retention)
//! moves a skip counter instead of re-encoding, so every page keeps exactly `PACKED_PAGE_BLOCKS` blocks
//! and every block `PACKED_BLOCK_ENTRIES` entries, and position arithmetic stays a division.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;

use bytes::Bytes;

use crate::error::FormatError;
use crate::index::{IndexFile, IndexFileNo};
use crate::limits::{PACKED_BLOCK_ENTRIES, PACKED_PAGE_BLOCKS, PACKED_TAIL_GROWTH_ENTRIES};
use crate::position::Offset;

const PAGE_ENTRIES: usize = PACKED_PAGE_BLOCKS * PACKED_BLOCK_ENTRIES;
/// A page starts with its CRC32C, then the start of each block's bytes and their end.
const PAGE_HEAD: usize = 4 + 4 * (PACKED_PAGE_BLOCKS + 1);

/// An entry that can be stored as a delta from the entry before it.
pub(crate) trait Delta: Copy + 'static {
    /// Append `self` as a delta from `prev`.
    fn put(&self, prev: &Self, out: &mut Vec<u8>);
    /// Read the entry after `prev` at `*at`, advancing `*at`.
    fn get(prev: &Self, buf: &[u8], at: &mut usize) -> Self;
    /// The entry a table's first entry is stored as a delta from (checkpoints).
    fn origin() -> Self;
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
    pages: Vec<Page<T>>,
    /// Blocks not gathered into a page yet: fewer than `PACKED_PAGE_BLOCKS`, after the pages.
    frozen: Vec<Block<T>>,
    /// Identifies the frozen blocks as they are now (see [`fresh_stamp`]).
    stamp: u64,
    /// Entries at the front of the first page or block that were dropped: below that
    /// unit's size, and 0 while there are neither.
    skip: usize,
    tail: Vec<T>,
}

#[derive(Clone, Debug)]
struct Block<T> {
    first: T,
    /// The other `PACKED_BLOCK_ENTRIES - 1` entries, each a delta from the one before. Shared, so that a
    /// checkpoint captures a table by cloning it without copying its blocks.
    rest: Rc<[u8]>,
}

#[derive(Clone, Debug)]
struct Page<T> {
    first: T,
    body: Body,
}

/// Where a page's bytes are.
#[derive(Clone, Debug)]
enum Body {
    /// Not written to an index file yet.
    Memory(Bytes),
    Disk(DiskPage),
}

/// A page in an index file.
#[derive(Clone, Debug)]
pub(crate) struct DiskPage {
    pub(crate) file: Rc<IndexFile>,
    pub(crate) off: u64,
    pub(crate) len: u32,
}

impl<T> Page<T> {
    fn bytes(&self) -> Bytes {
        match &self.body {
            Body::Memory(b) => b.clone(),
            Body::Disk(d) => d.file.page(d.off, d.len),
        }
    }
}

impl<T: Delta> Default for Packed<T> {
    fn default() -> Self {
        Packed {
            pages: Vec::new(),
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
            tail: entries,
            ..Packed::default()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.packed_len() + self.tail.len() - self.skip
    }

    /// Positions (counting skipped ones) held by pages and blocks.
    fn packed_len(&self) -> usize {
        self.pages.len() * PAGE_ENTRIES + self.frozen.len() * PACKED_BLOCK_ENTRIES
    }

    fn blocks(&self) -> usize {
        self.pages.len() * PACKED_PAGE_BLOCKS + self.frozen.len()
    }

    /// The entries not frozen yet: the newest ones, in order.
    pub(crate) fn unpacked(&self) -> &[T] {
        &self.tail
    }

    pub(crate) fn unpacked_mut(&mut self) -> &mut [T] {
        &mut self.tail
    }

    pub(crate) fn push(&mut self, entry: T) {
        if self.tail.len() == self.tail.capacity() {
            // By a few entries, not by doubling: most streams stop somewhere inside a block
            // and stay resident until they go dormant, and doubling left up to half a
            // block unused in each of their two tables (about 1 KiB a stream).
            self.tail.reserve_exact(PACKED_TAIL_GROWTH_ENTRIES);
        }
        self.tail.push(entry);
    }

    /// Freeze every full group of `PACKED_BLOCK_ENTRIES` unpacked entries but the newest `keep`, so the
    /// caller can still change those in place, and gather full groups of blocks into pages.
    pub(crate) fn freeze(&mut self, keep: usize) {
        let groups = self.tail.len().saturating_sub(keep) / PACKED_BLOCK_ENTRIES;
        if groups == 0 {
            return;
        }
        let mut scratch = Vec::with_capacity(PACKED_BLOCK_ENTRIES * 12);
        for g in self.tail[..groups * PACKED_BLOCK_ENTRIES].chunks_exact(PACKED_BLOCK_ENTRIES) {
            scratch.clear();
            for w in g.windows(2) {
                w[1].put(&w[0], &mut scratch);
            }
            self.frozen.push(Block {
                first: g[0],
                rest: scratch.as_slice().into(),
            });
        }
        // Blocks were only added or regrouped: those a memo may hold are unchanged and keep
        // their positions, so the stamp stays.
        self.tail.drain(..groups * PACKED_BLOCK_ENTRIES);
        while self.frozen.len() >= PACKED_PAGE_BLOCKS {
            let blocks: Vec<Block<T>> = self.frozen.drain(..PACKED_PAGE_BLOCKS).collect();
            self.push_page(Page {
                first: blocks[0].first,
                body: Body::Memory(encode_page(&blocks)),
            });
        }
        // What stays unpacked is fewer than a block of entries, often none: a stream that
        // stops here (most do, sooner or later) keeps a quarter block of capacity rather
        // than the block it grew to, and one that goes on grows it again twice per block.
        // (A table loaded whole, at recovery, would otherwise keep all of it.)
        self.tail
            .shrink_to(self.tail.len().max(PACKED_BLOCK_ENTRIES / 4));
    }

    /// Add a page at the end. A table gains pages for as long as its stream lives, and
    /// their handles are most of what retained history costs in memory, so the list grows
    /// by an eighth at a time rather than doubling: at most 12.5% of it is slack, not up to
    /// half. (Growing costs a copy of the handles, amortised over the eight times as many
    /// pages added before the next growth.)
    fn push_page(&mut self, page: Page<T>) {
        if self.pages.len() == self.pages.capacity() {
            self.pages
                .reserve_exact(Self::page_growth(self.pages.len()));
        }
        self.pages.push(page);
    }

    fn page_growth(pages: usize) -> usize {
        (pages / 8).max(4)
    }

    /// Entry `i`, or None past the end.
    pub(crate) fn get(&self, i: usize) -> Option<T> {
        let p = i + self.skip;
        let packed = self.packed_len();
        if p >= packed {
            return self.tail.get(p - packed).copied();
        }
        Some(self.with_block(p / PACKED_BLOCK_ENTRIES, |entries| {
            entries[p % PACKED_BLOCK_ENTRIES]
        }))
    }

    /// Run `f` on the decoded entries of block `b` (pages first, then frozen blocks),
    /// decoding it unless this thread's memo holds it already.
    fn with_block<R>(&self, b: usize, f: impl FnOnce(&[T]) -> R) -> R {
        T::memo().with(|memo| {
            let mut memo = memo.borrow_mut();
            if memo.stamp != self.stamp || memo.block != b || memo.entries.is_empty() {
                memo.entries.clear();
                self.decode_block(b, &mut memo.entries);
                memo.stamp = self.stamp;
                memo.block = b;
            }
            f(&memo.entries)
        })
    }

    fn decode_block(&self, b: usize, out: &mut Vec<T>) {
        if b < self.pages.len() * PACKED_PAGE_BLOCKS {
            let page = &self.pages[b / PACKED_PAGE_BLOCKS];
            decode_page_block(&page.first, &page.bytes(), b % PACKED_PAGE_BLOCKS, out);
        } else {
            let blk = &self.frozen[b - self.pages.len() * PACKED_PAGE_BLOCKS];
            decode_rest(blk.first, &blk.rest, out);
        }
    }

    /// The number of leading entries for which `pred` holds, which must be true for a
    /// prefix of the table and false after it (as for `slice::partition_point`).
    pub(crate) fn partition_point(&self, mut pred: impl FnMut(&T) -> bool) -> usize {
        let paged = self.pages.len() * PAGE_ENTRIES;
        let packed = self.packed_len();
        // Most lookups are near the newest end: answer those from the unpacked entries
        // without decoding a block.
        let physical = if packed == 0 || self.tail.first().is_some_and(&mut pred) {
            packed + self.tail.partition_point(pred)
        } else if self.frozen.first().is_some_and(|b| pred(&b.first)) {
            let b = self.frozen.partition_point(|blk| pred(&blk.first));
            let block = self.pages.len() * PACKED_PAGE_BLOCKS + b - 1;
            paged
                + (b - 1) * PACKED_BLOCK_ENTRIES
                + self.with_block(block, |e| e.partition_point(&mut pred))
        } else {
            let p = self.pages.partition_point(|pg| pred(&pg.first));
            if p == 0 {
                0
            } else {
                // One page read: its block firsts, then one block.
                let page = &self.pages[p - 1];
                let k = page_firsts(&page.first, &page.bytes()).partition_point(&mut pred);
                let block = (p - 1) * PACKED_PAGE_BLOCKS + k - 1;
                block * PACKED_BLOCK_ENTRIES
                    + self.with_block(block, |e| e.partition_point(&mut pred))
            }
        };
        physical.max(self.skip) - self.skip
    }

    /// Entries from `i` on, in order; each block is decoded once.
    pub(crate) fn iter_from(&self, i: usize) -> Iter<'_, T> {
        let p = i + self.skip;
        let mut it = Iter {
            table: self,
            block: p / PACKED_BLOCK_ENTRIES,
            entries: Vec::new(),
            at: 0,
            tail: 0,
        };
        if it.block < self.blocks() {
            self.decode_block(it.block, &mut it.entries);
            it.at = p % PACKED_BLOCK_ENTRIES;
        } else {
            it.block = self.blocks();
            it.tail = p - self.packed_len();
        }
        it
    }

    pub(crate) fn iter(&self) -> Iter<'_, T> {
        self.iter_from(0)
    }

    /// Drop the first `n` entries (without reading them: a page on disk stays unread).
    pub(crate) fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == 0 {
            return;
        }
        self.skip += n;
        let pages = (self.skip / PAGE_ENTRIES).min(self.pages.len());
        if pages > 0 {
            self.pages.drain(..pages);
            self.skip -= pages * PAGE_ENTRIES;
            self.stamp = fresh_stamp();
        }
        if self.pages.is_empty() {
            let whole = (self.skip / PACKED_BLOCK_ENTRIES).min(self.frozen.len());
            if whole > 0 {
                self.frozen.drain(..whole);
                self.skip -= whole * PACKED_BLOCK_ENTRIES;
                self.stamp = fresh_stamp();
            }
            if self.frozen.is_empty() {
                self.tail.drain(..self.skip);
                self.skip = 0;
            }
        }
    }

    /// Insert `entry` at position `i` (recovery, which may find entries out of order). A
    /// position inside the packed entries unpacks everything from there on first.
    pub(crate) fn insert(&mut self, i: usize, entry: T) {
        self.unpack_below(i);
        let at = i + self.skip - self.packed_len();
        self.tail.insert(at, entry);
    }

    /// Change entry `i` in place, which must keep the table sorted. A packed one is
    /// decoded, changed and re-encoded; a page that was on disk is back in memory until
    /// the next index file takes it.
    pub(crate) fn update(&mut self, i: usize, change: impl FnOnce(&mut T)) {
        let p = i + self.skip;
        let packed = self.packed_len();
        if p >= packed {
            if let Some(e) = self.tail.get_mut(p - packed) {
                change(e);
            }
            return;
        }
        self.stamp = fresh_stamp();
        let paged = self.pages.len() * PAGE_ENTRIES;
        if p < paged {
            let page = &mut self.pages[p / PAGE_ENTRIES];
            let bytes = page.bytes();
            let mut entries = Vec::with_capacity(PAGE_ENTRIES);
            for k in 0..PACKED_PAGE_BLOCKS {
                decode_page_block(&page.first, &bytes, k, &mut entries);
            }
            change(&mut entries[p % PAGE_ENTRIES]);
            let blocks: Vec<Block<T>> = entries
                .chunks_exact(PACKED_BLOCK_ENTRIES)
                .map(block_of)
                .collect();
            *page = Page {
                first: entries[0],
                body: Body::Memory(encode_page(&blocks)),
            };
            return;
        }
        let blk = &mut self.frozen[(p - paged) / PACKED_BLOCK_ENTRIES];
        let mut entries = Vec::with_capacity(PACKED_BLOCK_ENTRIES);
        decode_rest(blk.first, &blk.rest, &mut entries);
        change(&mut entries[p % PACKED_BLOCK_ENTRIES]);
        *blk = block_of(&entries);
    }

    /// Bytes of heap memory the table holds (index pages on disk count their handle only).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<Page<T>>()
            + self
                .pages
                .iter()
                .map(|p| match &p.body {
                    Body::Memory(b) => b.len(),
                    Body::Disk(_) => 0,
                })
                .sum::<usize>()
            + self.frozen.capacity() * std::mem::size_of::<Block<T>>()
            + self.frozen.iter().map(|b| b.rest.len()).sum::<usize>()
            + self.tail.capacity() * std::mem::size_of::<T>()
    }

    /// Pages not in an index file yet.
    pub(crate) fn unwritten_pages(&self) -> impl Iterator<Item = &Bytes> + '_ {
        self.pages.iter().filter_map(|p| match &p.body {
            Body::Memory(b) => Some(b),
            Body::Disk(_) => None,
        })
    }

    /// Index files this table's pages are in.
    pub(crate) fn page_files(&self) -> impl Iterator<Item = &Rc<IndexFile>> + '_ {
        self.pages.iter().filter_map(|p| match &p.body {
            Body::Disk(d) => Some(&d.file),
            Body::Memory(_) => None,
        })
    }

    /// The page whose bytes are `bytes` (the same buffer [`Self::unwritten_pages`] gave)
    /// now lies in an index file: let its bytes go. False if it changed meanwhile.
    pub(crate) fn page_written(&mut self, bytes: &Bytes, at: DiskPage) -> bool {
        for p in &mut self.pages {
            if let Body::Memory(b) = &p.body {
                if b.as_ptr() == bytes.as_ptr() && b.len() == bytes.len() {
                    p.body = Body::Disk(at);
                    return true;
                }
            }
        }
        false
    }

    /// Append the table to a checkpoint: its pages by reference (or their bytes, if not
    /// written to an index file yet), its blocks and its unpacked entries.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        put_varint(out, self.skip as u64);
        put_varint(out, self.pages.len() as u64);
        for p in &self.pages {
            p.first.put(&T::origin(), out);
            match &p.body {
                Body::Memory(b) => {
                    out.push(0);
                    put_varint(out, b.len() as u64);
                    out.extend_from_slice(b);
                }
                Body::Disk(d) => {
                    out.push(1);
                    put_varint(out, d.file.number.get());
                    put_varint(out, d.off);
                    put_varint(out, u64::from(d.len));
                }
            }
        }
        put_varint(out, self.frozen.len() as u64);
        for b in &self.frozen {
            b.first.put(&T::origin(), out);
            put_varint(out, b.rest.len() as u64);
            out.extend_from_slice(&b.rest);
        }
        put_varint(out, self.tail.len() as u64);
        let mut prev = T::origin();
        for e in &self.tail {
            e.put(&prev, out);
            prev = *e;
        }
    }

    /// Read a table written by [`Self::encode_into`] from a checksummed checkpoint body.
    /// `file` opens an index file by number; a page in a file that is missing or torn
    /// makes the answer `Ok(None)`: the table has to be rebuilt from the log.
    pub(crate) fn decode_from(
        buf: &[u8],
        at: &mut usize,
        file: &mut impl FnMut(IndexFileNo) -> Option<Rc<IndexFile>>,
    ) -> Result<Option<Self>, FormatError> {
        let mut t = Packed::default();
        let mut lost = false;
        let mut r = Reader { buf, at: *at };
        t.skip = r.varint()? as usize;
        let pages = r.varint()?;
        for _ in 0..pages {
            let first = r.entry::<T>(&T::origin())?;
            let body = match r.byte()? {
                0 => {
                    let len = r.varint()? as usize;
                    let b = Bytes::copy_from_slice(r.take(len)?);
                    if !page_intact(&b) {
                        return Err(FormatError::PageChecksum);
                    }
                    Body::Memory(b)
                }
                1 => {
                    let number = IndexFileNo::new(r.varint()?);
                    let off = r.varint()?;
                    let len = u32::try_from(r.varint()?)
                        .map_err(|_| FormatError::Field("page length"))?;
                    match file(number).filter(|f| f.holds(off, len)) {
                        Some(file) => Body::Disk(DiskPage { file, off, len }),
                        None => {
                            lost = true;
                            Body::Memory(Bytes::new())
                        }
                    }
                }
                _ => return Err(FormatError::Field("page kind")),
            };
            t.push_page(Page { first, body });
        }
        let blocks = r.varint()?;
        for _ in 0..blocks {
            let first = r.entry::<T>(&T::origin())?;
            let len = r.varint()? as usize;
            let rest = r.take(len)?.into();
            t.frozen.push(Block { first, rest });
        }
        let tail = r.varint()?;
        let mut prev = T::origin();
        for _ in 0..tail {
            prev = r.entry::<T>(&prev)?;
            t.tail.push(prev);
        }
        *at = r.at;
        if t.frozen.len() >= PACKED_PAGE_BLOCKS || t.skip >= PAGE_ENTRIES.max(1) {
            return Err(FormatError::Field("table layout"));
        }
        Ok((!lost).then_some(t))
    }

    /// Unpack the unit holding position `i` and every one after it.
    fn unpack_below(&mut self, i: usize) {
        let p = i + self.skip;
        if p >= self.packed_len() {
            return;
        }
        let mut unpacked = Vec::new();
        let paged = self.pages.len() * PAGE_ENTRIES;
        let (from_page, from_block) = if p < paged {
            (p / PAGE_ENTRIES, 0)
        } else {
            (self.pages.len(), (p - paged) / PACKED_BLOCK_ENTRIES)
        };
        for page in &self.pages[from_page..] {
            let bytes = page.bytes();
            for k in 0..PACKED_PAGE_BLOCKS {
                decode_page_block(&page.first, &bytes, k, &mut unpacked);
            }
        }
        for blk in &self.frozen[from_block..] {
            decode_rest(blk.first, &blk.rest, &mut unpacked);
        }
        unpacked.append(&mut self.tail);
        self.pages.truncate(from_page);
        self.frozen.truncate(from_block);
        self.stamp = fresh_stamp();
        if self.pages.is_empty() && self.frozen.is_empty() {
            // The dropped entries of the first unit were decoded too.
            unpacked.drain(..self.skip);
            self.skip = 0;
        }
        self.tail = unpacked;
    }
}

fn block_of<T: Delta>(entries: &[T]) -> Block<T> {
    let mut rest = Vec::with_capacity(entries.len() * 4);
    for w in entries.windows(2) {
        w[1].put(&w[0], &mut rest);
    }
    Block {
        first: entries[0],
        rest: rest.into(),
    }
}

/// A page's bytes: CRC32C of what follows | start of each block's bytes (PACKED_PAGE_BLOCKS + 1 u32s,
/// the last is the end) | per block, its first entry as a delta from the page's first
/// (none for block 0), then its other entries as deltas. The page's own first entry is
/// kept by its owner, in memory and in checkpoints.
fn encode_page<T: Delta>(blocks: &[Block<T>]) -> Bytes {
    debug_assert_eq!(blocks.len(), PACKED_PAGE_BLOCKS);
    let first = blocks[0].first;
    let mut out = vec![0u8; PAGE_HEAD];
    for (k, b) in blocks.iter().enumerate() {
        let start = out.len() as u32;
        out[4 + 4 * k..8 + 4 * k].copy_from_slice(&start.to_le_bytes());
        if k > 0 {
            b.first.put(&first, &mut out);
        }
        out.extend_from_slice(&b.rest);
    }
    let end = out.len() as u32;
    out[4 + 4 * PACKED_PAGE_BLOCKS..8 + 4 * PACKED_PAGE_BLOCKS].copy_from_slice(&end.to_le_bytes());
    let crc = crc32c::crc32c(&out[4..]);
    out[..4].copy_from_slice(&crc.to_le_bytes());
    Bytes::from(out)
}

/// Whether a page's bytes are whole: long enough for its head, its CRC matching, its block
/// offsets in order and inside it.
pub(crate) fn page_intact(page: &[u8]) -> bool {
    if page.len() < PAGE_HEAD || crc32c::crc32c(&page[4..]) != u32_at(page, 0) as u32 {
        return false;
    }
    let mut prev = PAGE_HEAD;
    for k in 0..=PACKED_PAGE_BLOCKS {
        let o = u32_at(page, 4 + 4 * k);
        if o < prev || o > page.len() {
            return false;
        }
        prev = o;
    }
    prev == page.len()
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

/// The first entry of each block of a page.
fn page_firsts<T: Delta>(first: &T, page: &[u8]) -> [T; PACKED_PAGE_BLOCKS] {
    let mut out = [*first; PACKED_PAGE_BLOCKS];
    for (k, slot) in out.iter_mut().enumerate().skip(1) {
        let mut at = u32_at(page, 4 + 4 * k);
        *slot = T::get(first, page, &mut at);
    }
    out
}

/// Append the entries of block `k` of a page to `out`.
fn decode_page_block<T: Delta>(first: &T, page: &[u8], k: usize, out: &mut Vec<T>) {
    let mut at = u32_at(page, 4 + 4 * k);
    let end = u32_at(page, 8 + 4 * k);
    let block_first = if k == 0 {
        *first
    } else {
        T::get(first, page, &mut at)
    };
    decode_rest(block_first, &page[at..end], out);
}

/// Append `first` and the entries delta-encoded after it in `rest` to `out`.
fn decode_rest<T: Delta>(first: T, rest: &[u8], out: &mut Vec<T>) {
    out.push(first);
    let mut prev = first;
    let mut at = 0;
    while at < rest.len() {
        prev = T::get(&prev, rest, &mut at);
        out.push(prev);
    }
}

/// Bounds-checked reads of a checkpoint body.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, FormatError> {
        let b = *self
            .buf
            .get(self.at)
            .ok_or(FormatError::Field("table (truncated)"))?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, FormatError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FormatError::Field("varint (overlong)"))
    }

    fn take(&mut self, len: usize) -> Result<&[u8], FormatError> {
        let end = self.at.checked_add(len).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(FormatError::Field("table (truncated)"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// One entry; the body is checksummed, so only its end needs guarding: an entry is at
    /// most seven varints of ten bytes.
    fn entry<T: Delta>(&mut self, prev: &T) -> Result<T, FormatError> {
        let mut scratch = self.buf[self.at..(self.at + 70).min(self.buf.len())].to_vec();
        scratch.resize(scratch.len() + 70, 0);
        let mut at = 0;
        let e = T::get(prev, &scratch, &mut at);
        if self.at + at > self.buf.len() {
            return Err(FormatError::Field("table entry (truncated)"));
        }
        self.at += at;
        Ok(e)
    }
}

/// In-order walk from some position (see [`Packed::iter_from`]).
pub(crate) struct Iter<'a, T: Delta> {
    table: &'a Packed<T>,
    block: usize,
    /// The decoded block `block`, and the next entry of it to return.
    entries: Vec<T>,
    at: usize,
    tail: usize,
}

impl<T: Delta> Iterator for Iter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        loop {
            if self.block < self.table.blocks() {
                if let Some(&e) = self.entries.get(self.at) {
                    self.at += 1;
                    return Some(e);
                }
                self.block += 1;
                self.entries.clear();
                self.at = 0;
                if self.block < self.table.blocks() {
                    self.table.decode_block(self.block, &mut self.entries);
                }
                continue;
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
impl Delta for Offset {
    fn put(&self, prev: &Offset, out: &mut Vec<u8>) {
        put_varint(out, self.get().wrapping_sub(prev.get()));
    }

    fn get(prev: &Offset, buf: &[u8], at: &mut usize) -> Offset {
        Offset::new(prev.get().wrapping_add(get_varint(buf, at)))
    }

    fn origin() -> Offset {
        Offset::ZERO
    }

    fn memo() -> &'static LocalKey<RefCell<Memo<Offset>>> {
        thread_local!(static MEMO: RefCell<Memo<Offset>> = RefCell::new(Memo::default()));
        &MEMO
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::off;

    fn model(n: u64) -> Vec<Offset> {
        (0..n).map(|i| off(i * 3 + (i % 7) * 1000)).collect()
    }

    /// Offsets `0, step, 2 * step, ...`: `n` of them.
    fn spaced(n: usize, step: u64) -> Vec<Offset> {
        (0..n as u64).map(|i| off(i * step)).collect()
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
        let n = 10 * PACKED_BLOCK_ENTRIES as u64 + 5;
        let mut want: Vec<Offset> = Vec::new();
        let mut t = Packed::default();
        let mut v = Offset::ZERO;
        for i in 0..n {
            v += 1 + (i % 5) * (1 << (7 * (i % 4)));
            want.push(v);
            t.push(v);
        }
        t.freeze(3);
        assert_eq!(t.len(), want.len());
        assert!(t.unpacked().len() < PACKED_BLOCK_ENTRIES + 3 && t.unpacked().len() >= 3);
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(t.get(i), Some(w), "entry {i}");
        }
        assert_eq!(t.get(want.len()), None);
        for from in [
            0,
            1,
            PACKED_BLOCK_ENTRIES - 1,
            PACKED_BLOCK_ENTRIES,
            PACKED_BLOCK_ENTRIES + 1,
            want.len() - 2,
            want.len(),
        ] {
            assert_eq!(t.iter_from(from).collect::<Vec<_>>(), want[from..].to_vec());
        }
        for probe in [
            off(0),
            off(1),
            want[0],
            want[63],
            want[64],
            want[65],
            v,
            v + 1,
        ] {
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
        let mut t = Packed::from_entries(spaced(n, 100));
        t.freeze(0);
        assert!(
            t.heap_bytes() < 2 * n,
            "{} bytes for {n} entries",
            t.heap_bytes()
        );
        assert_eq!(t.get(n - 1), Some(off((n as u64 - 1) * 100)));
    }

    #[test]
    fn the_list_of_pages_grows_with_at_most_an_eighth_of_slack() {
        let mut t: Packed<Offset> = Packed::default();
        let mut next = 0u64;
        let mut most_slack = 0.0f64;
        for _ in 0..400 {
            for _ in 0..PAGE_ENTRIES {
                t.push(off(next));
                next += 100;
            }
            t.freeze(0);
            let (len, cap) = (t.pages.len(), t.pages.capacity());
            assert!(
                cap <= len + Packed::<Offset>::page_growth(len),
                "{cap} slots for {len} pages"
            );
            if len >= 32 {
                most_slack = most_slack.max((cap - len) as f64 / len as f64);
            }
        }
        assert_eq!(t.pages.len(), 400);
        assert!(most_slack <= 0.125, "slack reached {most_slack}");
        assert_eq!(t.get(400 * PAGE_ENTRIES - 1), Some(off(next - 100)));
    }

    #[test]
    fn block_boundaries_hold_at_every_size() {
        for n in [
            0,
            1,
            PACKED_BLOCK_ENTRIES - 1,
            PACKED_BLOCK_ENTRIES,
            PACKED_BLOCK_ENTRIES + 1,
            2 * PACKED_BLOCK_ENTRIES,
            2 * PACKED_BLOCK_ENTRIES + 1,
        ] {
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
            assert_eq!(t.unpacked().len(), n % PACKED_BLOCK_ENTRIES);
        }
    }

    #[test]
    fn dropping_the_front_keeps_positions_and_frees_whole_blocks() {
        // Fewer blocks than a page, so they stay blocks.
        let want = spaced((PACKED_PAGE_BLOCKS - 1) * PACKED_BLOCK_ENTRIES, 10);
        let mut t = Packed::default();
        for &w in &want {
            t.push(w);
        }
        t.freeze(0);
        t.drop_front(PACKED_BLOCK_ENTRIES + 3);
        assert_eq!(t.len(), want.len() - PACKED_BLOCK_ENTRIES - 3);
        assert_eq!(
            t.frozen.len(),
            PACKED_PAGE_BLOCKS - 2,
            "the whole first block is gone"
        );
        assert_eq!(t.get(0), Some(want[PACKED_BLOCK_ENTRIES + 3]));
        assert_eq!(t.get(0), Some(want[PACKED_BLOCK_ENTRIES + 3]));
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            want[PACKED_BLOCK_ENTRIES + 3..].to_vec()
        );
        assert_eq!(
            t.partition_point(|&m| m < off(5)),
            0,
            "dropped entries do not count"
        );
        assert_eq!(
            t.partition_point(|&m| m < want[2 * PACKED_BLOCK_ENTRIES]),
            2 * PACKED_BLOCK_ENTRIES - (PACKED_BLOCK_ENTRIES + 3)
        );
        t.drop_front(usize::MAX);
        assert_eq!(t.len(), 0);
        t.push(off(7));
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![off(7)]);
    }

    #[test]
    fn dropping_unpacked_entries_then_freezing_starts_at_the_first_live_one() {
        let mut t = Packed::default();
        for i in 0..(PACKED_BLOCK_ENTRIES as u64 + 10) {
            t.push(off(i));
        }
        t.drop_front(4);
        t.freeze(0);
        assert_eq!(t.len(), PACKED_BLOCK_ENTRIES + 6);
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            spaced(PACKED_BLOCK_ENTRIES + 10, 1)[4..]
        );
        assert_eq!(t.unpacked().len(), 6);
        assert_eq!(t.get(0), Some(off(4)));
    }

    #[test]
    fn lookups_never_see_a_stale_block() {
        let block = off(PACKED_BLOCK_ENTRIES as u64);
        let mut a = Packed::from_entries(spaced(3 * PACKED_BLOCK_ENTRIES, 1));
        a.freeze(0);
        let b = a.clone();
        assert_eq!(a.get(5), Some(off(5)), "decodes block 0 of a (and b)");
        a.update(6, |e| *e += 1000 - 6);
        a.update(7, |e| *e += 1000 - 6);
        assert_eq!(a.get(6), Some(off(1000)));
        assert_eq!(b.get(6), Some(off(6)), "the clone keeps its own blocks");
        assert_eq!(a.get(7), Some(off(1001)));
        let mut c = b.clone();
        c.drop_front(PACKED_BLOCK_ENTRIES);
        assert_eq!(c.get(0), Some(block), "blocks moved");
        assert_eq!(b.get(0), Some(off(0)));
        assert_eq!(c.partition_point(|&m| m < block + 3), 3);
        c.insert(1, block);
        assert_eq!(c.get(1), Some(block));
        assert_eq!(c.get(2), Some(block + 1));
    }

    #[test]
    fn inserts_and_updates_reach_frozen_entries() {
        let mut want = spaced(3 * PACKED_BLOCK_ENTRIES, 10);
        let mut t = Packed::default();
        for &w in &want {
            t.push(w);
        }
        t.freeze(0);
        t.update(PACKED_BLOCK_ENTRIES + 1, |e| *e += 1);
        want[PACKED_BLOCK_ENTRIES + 1] += 1;
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        t.insert(5, off(45));
        want.insert(5, off(45));
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        t.insert(t.len(), off(100_000));
        want.push(off(100_000));
        t.freeze(0);
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(t.get(i), Some(w));
        }
    }

    /// Write the unwritten pages of `t` to index file `number` in `dir` and point the table
    /// at them, as the shard does.
    fn write_pages(
        t: &mut Packed<Offset>,
        dir: &std::path::Path,
        number: IndexFileNo,
    ) -> Rc<IndexFile> {
        let pages: Vec<Bytes> = t.unwritten_pages().cloned().collect();
        let body: usize = pages.iter().map(Bytes::len).sum();
        let mut file = crate::index::header(0, number, pages.len() as u64, body as u64).to_vec();
        let mut offs = Vec::new();
        for p in &pages {
            offs.push(file.len() as u64);
            file.extend_from_slice(p);
        }
        std::fs::write(crate::index::index_path(dir, number), file).expect("write");
        let f = Rc::new(IndexFile::open(dir, 0, number).expect("open"));
        for (p, off) in pages.iter().zip(offs) {
            let at = DiskPage {
                file: f.clone(),
                off,
                len: p.len() as u32,
            };
            assert!(t.page_written(p, at));
        }
        f
    }

    fn check_same(t: &Packed<Offset>, want: &[Offset]) {
        assert_eq!(t.len(), want.len());
        assert_eq!(t.iter().collect::<Vec<_>>(), want);
        for i in (0..want.len())
            .step_by(37)
            .chain([0, want.len().saturating_sub(1)])
        {
            assert_eq!(t.get(i), want.get(i).copied(), "entry {i}");
            assert_eq!(t.iter_from(i).next(), want.get(i).copied());
            let probe = want[i];
            assert_eq!(t.partition_point(|&m| m < probe), i, "probe {probe}");
            assert_eq!(t.partition_point(|&m| m <= probe), i + 1);
        }
        assert_eq!(t.partition_point(|_| true), want.len());
        assert_eq!(t.partition_point(|_| false), 0);
    }

    #[test]
    fn pages_read_the_same_from_memory_and_from_an_index_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 3 * PAGE_ENTRIES + (PACKED_PAGE_BLOCKS - 1) * PACKED_BLOCK_ENTRIES + 7;
        let mut want: Vec<Offset> = (0..n as u64).map(|i| off(i * 7 + (i % 3))).collect();
        let mut t = Packed::default();
        for &w in &want {
            t.push(w);
        }
        t.freeze(0);
        assert_eq!(
            (t.pages.len(), t.frozen.len(), t.tail.len()),
            (3, PACKED_PAGE_BLOCKS - 1, 7)
        );
        check_same(&t, &want);
        let in_memory = t.heap_bytes();
        let paged: usize = t.unwritten_pages().map(Bytes::len).sum();
        let f = write_pages(&mut t, dir.path(), IndexFileNo::new(4));
        assert_eq!(t.unwritten_pages().count(), 0);
        assert_eq!(t.page_files().count(), 3);
        assert_eq!(in_memory - t.heap_bytes(), paged, "pages left memory");
        check_same(&t, &want);
        // A change inside a written page brings that page back into memory.
        t.update(PAGE_ENTRIES + 3, |e| *e += 1);
        want[PAGE_ENTRIES + 3] += 1;
        assert_eq!(t.unwritten_pages().count(), 1);
        check_same(&t, &want);
        // Checkpoint round trip: pages by reference, the changed one by value.
        let mut out = Vec::new();
        t.encode_into(&mut out);
        let mut at = 0;
        let back = Packed::<Offset>::decode_from(&out, &mut at, &mut |s| {
            (s == IndexFileNo::new(4)).then(|| f.clone())
        })
        .expect("decodes")
        .expect("all files present");
        assert_eq!(at, out.len());
        check_same(&back, &want);
        let mut at = 0;
        let lost = Packed::<Offset>::decode_from(&out, &mut at, &mut |_| None).expect("decodes");
        assert!(lost.is_none(), "a missing index file is reported");
        // Retention across pages, blocks and the tail keeps positions exact.
        for drop in [
            5,
            PAGE_ENTRIES,
            2 * PACKED_BLOCK_ENTRIES + 1,
            PAGE_ENTRIES + 3,
        ] {
            t.drop_front(drop);
            want.drain(..drop);
            check_same(&t, &want);
        }
        t.insert(0, Offset::ZERO);
        want.insert(0, Offset::ZERO);
        check_same(&t, &want);
    }

    #[test]
    fn a_damaged_page_is_detected() {
        let mut t = Packed::default();
        for o in spaced(PAGE_ENTRIES, 300) {
            t.push(o);
        }
        t.freeze(0);
        let page = t.unwritten_pages().next().expect("a page").clone();
        assert!(page_intact(&page));
        for i in 0..page.len() {
            let mut bad = page.to_vec();
            bad[i] ^= 0x10;
            assert!(!page_intact(&bad), "flip at {i}");
        }
        assert!(!page_intact(&page[..page.len() - 1]), "torn tail");
        assert!(!page_intact(&[]));
    }
}
