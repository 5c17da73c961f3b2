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
use crate::position::SegmentNo;

#[derive(Default)]
pub(super) struct IndexFiles {
    open: BTreeMap<IndexFileNo, Rc<IndexFile>>,
    /// The highest number an index file of this shard has (a new one must be above it).
    newest: IndexFileNo,
    /// Segments up to this one are sealed, and the pages completed before their roll are
    /// in index files (or, when no file could be numbered yet, inline in the checkpoint).
    indexed_through: SegmentNo,
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
