//! Typed positions in a shard's log.
//!
//! An LSN, a segment number and a byte offset are all `u64`s, and mixing them up
//! type-checks silently. The log's own positions are typed so that it cannot.

use std::fmt;

/// A log sequence number: the place of a record in its shard's log. The first record is
/// `Lsn::FIRST`; `Lsn::NONE` (0) stands for "no record yet" and is never written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(u64);

impl Lsn {
    pub const NONE: Lsn = Lsn(0);
    pub const FIRST: Lsn = Lsn(1);

    pub const fn new(raw: u64) -> Lsn {
        Lsn(raw)
    }

    /// The number as it is stored on disk and in manifests.
    pub const fn get(self) -> u64 {
        self.0
    }

    pub fn is_none(self) -> bool {
        self == Lsn::NONE
    }

    /// The LSN of the record after this one.
    pub fn next(self) -> Lsn {
        Lsn(self.0.checked_add(1).expect("LSN space is not exhausted"))
    }

    /// The LSN of the record before this one (`NONE` before the first).
    pub fn prev(self) -> Lsn {
        Lsn(self.0.saturating_sub(1))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The number of a segment in its shard's log: its file is `NNNNNNNNNN.seg`, and the log
/// rolls from one number to the next. Stored as a `u64` in segment headers, checkpoints,
/// index files and cold-tier manifests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentNo(u64);

impl SegmentNo {
    pub const fn new(raw: u64) -> SegmentNo {
        SegmentNo(raw)
    }

    /// The number as it is stored on disk and in manifests.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The segment the log rolls to after this one.
    pub fn next(self) -> SegmentNo {
        SegmentNo(
            self.0
                .checked_add(1)
                .expect("segment numbers are not exhausted"),
        )
    }

    /// The segment before this one, if any.
    pub fn prev(self) -> Option<SegmentNo> {
        self.0.checked_sub(1).map(SegmentNo)
    }
}

/// Segment `n`, for tests that name segments by number.
#[cfg(test)]
pub(crate) const fn seg(n: u64) -> SegmentNo {
    SegmentNo(n)
}

impl fmt::Display for SegmentNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_step_and_order_like_their_numbers() {
        assert!(Lsn::NONE.is_none() && !Lsn::FIRST.is_none());
        assert_eq!(Lsn::NONE.next(), Lsn::FIRST);
        assert_eq!(Lsn::FIRST.prev(), Lsn::NONE);
        assert_eq!(Lsn::NONE.prev(), Lsn::NONE);
        assert!(Lsn::new(7) < Lsn::new(8));
        assert_eq!(Lsn::new(41).next().get(), 42);
        assert_eq!(Lsn::new(42).to_string(), "42");
    }

    #[test]
    fn segment_numbers_step_and_order_like_their_numbers() {
        assert_eq!(SegmentNo::new(0).prev(), None);
        assert_eq!(SegmentNo::new(7).next(), SegmentNo::new(8));
        assert_eq!(SegmentNo::new(8).prev(), Some(SegmentNo::new(7)));
        assert!(SegmentNo::new(2) < SegmentNo::new(10));
        assert_eq!(SegmentNo::new(12).to_string(), "12");
    }
}
