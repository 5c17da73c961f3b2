//! Index files: the sealed pages of the shard's chunk tables and record indexes, on disk.
//!
//! A stream's tables are kept as pages of [`crate::packed::PAGE`] delta-encoded blocks (see
//! `packed`). Completed pages are gathered in memory and written out together as one index
//! file whenever [`INDEX_FLUSH_BYTES`] of them are waiting, and at every roll of the log; from then
//! on memory keeps only each page's first entry and where it is in that file. So the pages
//! a shard holds in memory stay below about a second's worth of `INDEX_FLUSH_BYTES`, however much
//! history it keeps. A lookup that lands in a written page reads it (one `pread` of a few
//! KiB) into a byte-bounded cache of pages shared by the core's streams.
//!
//! Files are numbered ([`IndexFileNo`]) and never rewritten: `NNNNNNNNNN.idx` beside the
//! segments. A file takes the LSN of the shard's newest record when it is written as its
//! number, and only a number above every file the shard already has. A checkpoint names a
//! file only once the log up to its own LSN (at least the file's number) is durable, so
//! every file a checkpoint ever named (and the cold tier may have archived under its number)
//! has a number at or below a durable LSN, and a number is never given to two different
//! files, across restarts too. (Files written before this numbering carry the number of the
//! segment whose roll wrote them; the rule keeps new numbers above those as well.)
//!
//! ```text
//! 0..8     magic "URSLIDX1"
//! 8..12    format version (1)
//! 12..16   shard
//! 16..24   the file's number
//! 24..32   number of pages
//! 32..40   length of everything after the header
//! 40..44   CRC32C of bytes 0..40
//! 44..48   zero
//! 48..     pages back to back; each carries its own CRC32C (see `packed::encode_page`)
//! ```
//!
//! The file is written as `.idx.tmp`, synced, renamed and its directory synced before any
//! page in it leaves memory, and before a checkpoint names it. A page is checked against
//! its CRC when it is read; one that fails stops the process (see [`IndexFile::page`]).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::error::FormatError;
use crate::limits::ENCODE_SLICE_BYTES;
use crate::position::{stored_as_u64, Lsn};
use crate::slices::Slices;

const MAGIC: &[u8; 8] = b"URSLIDX1";
const VERSION: u32 = 1;
pub(crate) const HEADER_LEN: usize = 48;

/// Bytes of index pages a core caches when its shard does not say otherwise.
pub const DEFAULT_INDEX_CACHE_BYTES: usize = 8 << 20;

/// The number of an index file: its name, and how checkpoints and the cold tier's manifest
/// refer to it. See the module comment for why a number is never reused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexFileNo(u64);

stored_as_u64!(IndexFileNo);

impl IndexFileNo {
    /// The number a file written after record `lsn` takes, if it is above `newest`, the
    /// shard's newest file; None means the file has to wait for a newer record.
    pub(crate) fn after(lsn: Lsn, newest: IndexFileNo) -> Option<IndexFileNo> {
        (lsn.get() > newest.0).then_some(IndexFileNo(lsn.get()))
    }
}

pub(crate) fn index_path(dir: &Path, number: IndexFileNo) -> PathBuf {
    dir.join(format!("{number:010}.idx"))
}

pub(crate) fn tmp_path(dir: &Path, number: IndexFileNo) -> PathBuf {
    dir.join(format!("{number:010}.idx.tmp"))
}

/// Index files present in `dir` (by number), ascending; stale `.idx.tmp` files are removed.
pub(crate) fn list(dir: &Path) -> io::Result<Vec<IndexFileNo>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".idx.tmp") {
            std::fs::remove_file(dir.join(name))?;
        } else if let Some(stem) = name.strip_suffix(".idx") {
            if let Ok(i) = stem.parse::<u64>() {
                out.push(IndexFileNo(i));
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The header of index file `number` holding `pages` pages in `body_len` bytes.
pub(crate) fn header(
    shard: u32,
    number: IndexFileNo,
    pages: u64,
    body_len: u64,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&shard.to_le_bytes());
    h[16..24].copy_from_slice(&number.get().to_le_bytes());
    h[24..32].copy_from_slice(&pages.to_le_bytes());
    h[32..40].copy_from_slice(&body_len.to_le_bytes());
    let crc = crc32c::crc32c(&h[..40]);
    h[40..44].copy_from_slice(&crc.to_le_bytes());
    h
}

/// An open index file. Pages hold it by `Rc`: the shard deletes a file once no page points
/// into it any more and a checkpoint that no longer names it is durable.
pub(crate) struct IndexFile {
    /// Identifies the file in the page cache (never reused while the process runs).
    id: u64,
    pub(crate) number: IndexFileNo,
    path: PathBuf,
    file: File,
    len: u64,
    /// Pages and saved states it was written with (what compaction measures what is still
    /// in use against).
    entries: u64,
}

impl std::fmt::Debug for IndexFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IndexFile({})", self.path.display())
    }
}

thread_local! {
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
    static CACHE: RefCell<PageCache> = RefCell::new(PageCache::new(DEFAULT_INDEX_CACHE_BYTES));
}

impl IndexFile {
    /// Open index file `number` and check its header: written by `shard`, complete (its
    /// length is what the header says). A torn or foreign file is an error.
    pub(crate) fn open(
        dir: &Path,
        shard: u32,
        number: IndexFileNo,
    ) -> Result<IndexFile, FormatError> {
        let path = index_path(dir, number);
        let unreadable = |e: io::Error| FormatError::Read(e.kind());
        let file = File::open(&path).map_err(unreadable)?;
        let len = file.metadata().map_err(unreadable)?.len();
        let mut h = [0u8; HEADER_LEN];
        file.read_exact_at(&mut h, 0).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => FormatError::ShortHeader { len: len as usize },
            _ => unreadable(e),
        })?;
        let field = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a[..r.len()].copy_from_slice(&h[r]);
            u64::from_le_bytes(a)
        };
        if &h[..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        if crc32c::crc32c(&h[..40]) as u64 != field(40..44) {
            return Err(FormatError::HeaderChecksum);
        }
        if field(8..12) != u64::from(VERSION) {
            return Err(FormatError::Version(field(8..12) as u32));
        }
        if field(12..16) != u64::from(shard) || field(16..24) != number.get() {
            return Err(FormatError::OtherFile);
        }
        if HEADER_LEN as u64 + field(32..40) != len {
            return Err(FormatError::Length {
                len,
                header: HEADER_LEN as u64 + field(32..40),
            });
        }
        Ok(IndexFile {
            id: NEXT_ID.with(|n| n.replace(n.get() + 1)),
            number,
            path,
            file,
            len,
            entries: field(24..32),
        })
    }

    /// The file's size in bytes, header included.
    pub(crate) fn file_bytes(&self) -> u64 {
        self.len
    }

    /// Pages and saved states it was written with.
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    /// Whether `[off, off + len)` lies inside the file's pages.
    pub(crate) fn holds(&self, off: u64, len: u32) -> bool {
        off >= HEADER_LEN as u64 && off + u64::from(len) <= self.len
    }

    /// The page at `[off, off + len)`, from this core's cache or read from the file and
    /// checked against its CRC.
    pub(crate) fn page(&self, off: u64, len: u32) -> Bytes {
        let key = (self.id, off);
        if let Some(b) = CACHE.with(|c| c.borrow_mut().get(key)) {
            return b;
        }
        let mut buf = vec![0u8; len as usize];
        let read = self.file.read_exact_at(&mut buf, off);
        let page = Bytes::from(buf);
        match read {
            Err(e) => self.fault(off, &e.to_string()),
            Ok(()) if !crate::packed::page_intact(&page) => self.fault(off, "checksum mismatch"),
            Ok(()) => {}
        }
        CACHE.with(|c| c.borrow_mut().insert(key, page.clone()));
        page
    }

    /// A dormant stream's saved state at `[off, off + len)`, read from the file (not
    /// cached: it is read once, as the stream wakes) and checked against its CRC (the
    /// first four bytes, over the rest).
    pub(crate) fn saved_state(&self, off: u64, len: u32) -> Bytes {
        let mut buf = vec![0u8; len as usize];
        match self.file.read_exact_at(&mut buf, off) {
            Err(e) => self.fault(off, &e.to_string()),
            Ok(())
                if len < 4
                    || crc32c::crc32c(&buf[4..])
                        != u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) =>
            {
                self.fault(off, "checksum mismatch")
            }
            Ok(()) => Bytes::from(buf),
        }
    }

    /// A page that cannot be read back is a disk fault under metadata the engine relies
    /// on, and a lookup has no other answer to give. The file is set aside as
    /// `.idx.corrupt` (for an operator to look at) and the process stops: the next start
    /// finds the index file missing and rebuilds those tables from the segments' records,
    /// which carry their own CRCs. Nothing acknowledged depends on the index file alone.
    pub(crate) fn fault(&self, off: u64, why: &str) -> ! {
        let aside = self.path.with_extension("idx.corrupt");
        let renamed = std::fs::rename(&self.path, &aside);
        tracing::error!(
            file = %self.path.display(),
            offset = off,
            reason = why,
            set_aside = renamed.is_ok(),
            "index page unreadable; stopping so that the next start rebuilds it from the log"
        );
        eprintln!(
            "ursula: index page {} @{off} unreadable ({why}); stopping, the next start \
             rebuilds it from the log",
            self.path.display()
        );
        std::process::abort()
    }

    /// Delete the file (through the core's io_uring), once no checkpoint names it.
    pub(crate) async fn remove(&self) -> io::Result<()> {
        CACHE.with(|c| c.borrow_mut().forget(self.id));
        monoio::fs::remove_file(&self.path).await
    }
}

/// Bytes of index pages this core's page cache holds now.
pub(crate) fn cached_page_bytes() -> usize {
    CACHE.with(|c| c.borrow().used)
}

/// Set the byte budget of this core's page cache (the last shard opened on a thread wins;
/// a server runs one shard per core thread).
pub(crate) fn set_cache_bytes(bytes: usize) {
    CACHE.with(|c| c.borrow_mut().set_capacity(bytes));
}

/// Index pages by (file, offset), least recently used evicted first, bounded in bytes.
struct PageCache {
    capacity: usize,
    used: usize,
    tick: u64,
    pages: HashMap<(u64, u64), (Bytes, u64)>,
    by_age: BTreeMap<u64, (u64, u64)>,
}

impl PageCache {
    fn new(capacity: usize) -> PageCache {
        PageCache {
            capacity,
            used: 0,
            tick: 0,
            pages: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        self.shrink();
    }

    fn get(&mut self, key: (u64, u64)) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        let (bytes, age) = self.pages.get_mut(&key)?;
        self.by_age.remove(age);
        *age = tick;
        self.by_age.insert(tick, key);
        Some(bytes.clone())
    }

    fn insert(&mut self, key: (u64, u64), page: Bytes) {
        self.tick += 1;
        self.used += page.len();
        if let Some((old, age)) = self.pages.insert(key, (page, self.tick)) {
            self.used -= old.len();
            self.by_age.remove(&age);
        }
        self.by_age.insert(self.tick, key);
        self.shrink();
    }

    fn forget(&mut self, file: u64) {
        let keys: Vec<_> = self.pages.keys().filter(|k| k.0 == file).copied().collect();
        for k in keys {
            if let Some((b, age)) = self.pages.remove(&k) {
                self.used -= b.len();
                self.by_age.remove(&age);
            }
        }
    }

    /// Evict the oldest pages until the budget holds; the newest page always stays, so a
    /// lookup can finish with the page it just read even under a tiny budget.
    fn shrink(&mut self) {
        while self.used > self.capacity && self.pages.len() > 1 {
            let Some((_, key)) = self.by_age.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.pages.remove(&key) {
                self.used -= b.len();
            }
        }
    }
}

/// Write `pages` (encoded, each with its CRC) as index file `number`, durably: a `.idx.tmp`
/// written and synced, renamed and its directory synced, all on the core's io_uring.
/// Returns the open file and each page's offset in it.
pub(crate) async fn write(
    dir: &Path,
    shard: u32,
    number: IndexFileNo,
    pages: &[Bytes],
    slices: &mut Slices,
) -> Result<(Rc<IndexFile>, Vec<u64>), io::Error> {
    let body_len: usize = pages.iter().map(Bytes::len).sum();
    let mut image = Vec::with_capacity(HEADER_LEN + body_len);
    image.extend_from_slice(&header(shard, number, pages.len() as u64, body_len as u64));
    let mut offsets = Vec::with_capacity(pages.len());
    // After a restart one file can carry tens of megabytes of sleeping streams' states;
    // copied in one go, that held the core for tens of milliseconds.
    let mut since_yield = 0;
    for p in pages {
        offsets.push(image.len() as u64);
        image.extend_from_slice(p);
        since_yield += p.len();
        if since_yield >= ENCODE_SLICE_BYTES {
            since_yield = 0;
            slices.next().await;
        }
    }
    let tmp = tmp_path(dir, number);
    crate::segment::write_synced(&tmp, image).await?;
    crate::segment::rename_durable(&tmp, &index_path(dir, number), dir).await?;
    let opened = IndexFile::open(dir, shard, number)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((Rc::new(opened), offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_recent_pages() {
        let mut c = PageCache::new(100);
        for i in 0..10u64 {
            c.insert((1, i), Bytes::from(vec![0u8; 30]));
        }
        assert!(c.used <= 100, "{}", c.used);
        assert!(c.get((1, 9)).is_some());
        assert!(c.get((1, 0)).is_none(), "oldest evicted");
        c.forget(1);
        assert_eq!((c.used, c.pages.len()), (0, 0));
        c.insert((2, 0), Bytes::from(vec![0u8; 500]));
        assert_eq!(c.pages.len(), 1, "an oversized page still stays alone");
    }

    #[test]
    fn a_file_number_is_the_newest_lsn_and_only_ever_rises() {
        let none = IndexFileNo::default();
        assert_eq!(IndexFileNo::after(Lsn::NONE, none), None, "no record yet");
        assert_eq!(
            IndexFileNo::after(Lsn::new(40), none),
            Some(IndexFileNo(40))
        );
        assert_eq!(IndexFileNo::after(Lsn::new(40), IndexFileNo(40)), None);
        assert_eq!(IndexFileNo::after(Lsn::new(39), IndexFileNo(40)), None);
        assert_eq!(
            IndexFileNo::after(Lsn::new(41), IndexFileNo(40)),
            Some(IndexFileNo(41))
        );
    }

    #[test]
    fn a_header_is_checked_and_a_torn_file_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let body = vec![7u8; 100];
        let mut file = header(3, IndexFileNo(9), 1, body.len() as u64).to_vec();
        file.extend_from_slice(&body);
        std::fs::write(index_path(dir.path(), IndexFileNo(9)), &file).expect("write");
        let f = IndexFile::open(dir.path(), 3, IndexFileNo(9)).expect("opens");
        assert!(f.holds(HEADER_LEN as u64, 100));
        assert!(!f.holds(HEADER_LEN as u64, 101));
        assert!(
            IndexFile::open(dir.path(), 4, IndexFileNo(9)).is_err(),
            "other shard"
        );
        std::fs::write(
            index_path(dir.path(), IndexFileNo(9)),
            &file[..file.len() - 1],
        )
        .expect("write");
        assert!(
            IndexFile::open(dir.path(), 3, IndexFileNo(9)).is_err(),
            "torn tail"
        );
        let mut bad = file.clone();
        bad[20] ^= 1;
        std::fs::write(index_path(dir.path(), IndexFileNo(9)), &bad).expect("write");
        assert!(
            IndexFile::open(dir.path(), 3, IndexFileNo(9)).is_err(),
            "header flip"
        );
        std::fs::write(tmp_path(dir.path(), IndexFileNo(10)), b"x").expect("write");
        assert_eq!(list(dir.path()).expect("list"), vec![IndexFileNo(9)]);
        assert!(!tmp_path(dir.path(), IndexFileNo(10)).exists());
    }
}
