//! The shard's open index files (see `crate::index`): which exist, the newest number
//! handed out, and how far the segments' completed pages have been written into them.
//!
//! It does no I/O: `checkpointing` writes a file and records it here, recovery adopts the
//! files its checkpoint names. A file stays open while this table or a page holds it, and
//! leaves the table once no page points into it and a checkpoint that does not name it is
//! installed. Invariants (asserted): numbers only grow, and every file in the table is
//! numbered at or below the newest.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::index::{IndexFile, IndexFileNo};
use crate::limits::{
    EAGER_SLEEPERS, INDEX_FILES_SOFT_MAX, SLEEP_ONLY_FILE_INTERVAL_MS, SMALL_INDEX_FILE_BYTES,
};
use crate::position::SegmentNo;

#[derive(Default)]
pub(super) struct IndexFiles {
    open: BTreeMap<IndexFileNo, Rc<IndexFile>>,
    /// The highest number an index file of this shard has (a new one must be above it).
    newest: IndexFileNo,
    /// Segments up to this one are sealed, and the pages completed before their roll are
    /// in index files (or, when no file could be numbered yet, inline in the checkpoint).
    indexed_through: SegmentNo,
    /// When the last file was written (Unix ms, the shard's clock), and how many streams
    /// it put to sleep.
    last_write_ms: i64,
    last_sleepers: usize,
}

impl IndexFiles {
    /// The highest number a file has.
    pub(super) fn newest(&self) -> IndexFileNo {
        self.newest
    }

    /// A new file was written, or an existing one adopted at recovery (in number order).
    pub(super) fn add(&mut self, number: IndexFileNo, file: Rc<IndexFile>) {
        assert!(
            number > self.newest || self.open.is_empty() && number >= self.newest,
            "index file numbers only grow"
        );
        self.newest = number;
        self.open.insert(number, file);
    }

    /// Files nothing but this table holds: no page points into them.
    pub(super) fn unused(&self) -> Vec<IndexFileNo> {
        self.open
            .iter()
            .filter(|(_, f)| Rc::strong_count(f) == 1)
            .map(|(&number, _)| number)
            .collect()
    }

    /// How many files nothing but this table holds.
    pub(super) fn unused_count(&self) -> usize {
        self.open
            .values()
            .filter(|f| Rc::strong_count(f) == 1)
            .count()
    }

    /// Files whose dormant states compaction should move into the next file (`states_in`
    /// counts a file's dormant states): those mostly unused (a quarter or less of what
    /// they were written with is still pointed to), and once more than
    /// [`INDEX_FILES_SOFT_MAX`] are open, small ones, those least pointed to first, down to
    /// three quarters of that. Moving its states frees a file unless table pages are in
    /// it too; files without dormant states are left alone. Never the newest file.
    pub(super) fn compaction_candidates(
        &self,
        states_in: impl Fn(IndexFileNo) -> u32,
    ) -> Vec<IndexFileNo> {
        let mut sparse = Vec::new();
        let mut small = Vec::new();
        for (&number, f) in &self.open {
            if number == self.newest || states_in(number) == 0 {
                continue;
            }
            let refs = (Rc::strong_count(f) - 1) as u64;
            if refs * 4 <= f.entries() {
                sparse.push(number);
            } else if f.file_bytes() < SMALL_INDEX_FILE_BYTES {
                small.push((refs, number));
            }
        }
        if self.open.len() > INDEX_FILES_SOFT_MAX {
            small.sort_unstable();
            let over = self.open.len() - INDEX_FILES_SOFT_MAX * 3 / 4;
            sparse.extend(small.into_iter().take(over).map(|(_, number)| number));
        }
        sparse
    }

    /// A file was written now (`now_ms`), putting `sleepers` streams to sleep.
    pub(super) fn wrote(&mut self, now_ms: i64, sleepers: usize) {
        self.last_write_ms = now_ms;
        self.last_sleepers = sleepers;
    }

    /// Whether a file may be written now only to put streams to sleep: at once while
    /// streams go idle by the hundreds (the last file put [`EAGER_SLEEPERS`] or more to
    /// sleep), else [`SLEEP_ONLY_FILE_INTERVAL_MS`] after the last file, so a trickle of
    /// idle streams shares files instead of leaving one small file per round.
    pub(super) fn sleep_file_due(&self, now_ms: i64) -> bool {
        self.last_sleepers >= EAGER_SLEEPERS
            || now_ms.saturating_sub(self.last_write_ms) >= SLEEP_ONLY_FILE_INTERVAL_MS
    }

    /// Take a file out of the table (to delete it).
    pub(super) fn take(&mut self, number: IndexFileNo) -> Option<Rc<IndexFile>> {
        self.open.remove(&number)
    }

    pub(super) fn indexed_through(&self) -> SegmentNo {
        self.indexed_through
    }

    /// The pages completed before `sealed` rolled are written (or kept in a checkpoint).
    pub(super) fn indexed(&mut self, sealed: SegmentNo) {
        self.indexed_through = self.indexed_through.max(sealed);
    }
}
