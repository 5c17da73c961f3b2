//! Typed positions in a shard's log and in its streams.
//!
//! An LSN, a segment number, a stream offset and a record ordinal are all `u64`s, and
//! mixing them up type-checks silently. They are typed so that it cannot: each converts to
//! and from its number only where it is stored or sent (`new`, `get`).

use std::ops::{Add, AddAssign, Sub};

/// What every typed number has: conversion to and from the `u64` it is stored and sent as
/// (only where it is stored or sent), and printing as that number.
macro_rules! stored_as_u64 {
    ($number:ident) => {
        impl $number {
            pub const fn new(raw: u64) -> $number {
                $number(raw)
            }

            /// The number as it is stored on disk and in manifests, and sent to clients.
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl std::fmt::Display for $number {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}
pub(crate) use stored_as_u64;

/// A log sequence number: the place of a record in its shard's log. The first record is
/// `Lsn::FIRST`; `Lsn::NONE` (0) stands for "no record yet" and is never written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(u64);

stored_as_u64!(Lsn);

impl Lsn {
    pub const NONE: Lsn = Lsn(0);
    pub const FIRST: Lsn = Lsn(1);

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

/// The number of a segment in its shard's log: its file is `NNNNNNNNNN.seg`, and the log
/// rolls from one number to the next. Stored as a `u64` in segment headers, checkpoints,
/// index files and cold-tier manifests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentNo(u64);

stored_as_u64!(SegmentNo);

impl SegmentNo {
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

/// The arithmetic of a position whose distances are plain counts (bytes, records): `p + n`
/// is the position `n` further on, `q - p` the distance from `p` to `q`. Overflow and
/// underflow are checked as for the integers, in debug builds, so the types cost nothing
/// over the numbers they replace.
macro_rules! moves_by_distance {
    ($position:ident) => {
        impl Add<u64> for $position {
            type Output = $position;

            fn add(self, distance: u64) -> $position {
                $position(self.0 + distance)
            }
        }

        impl AddAssign<u64> for $position {
            fn add_assign(&mut self, distance: u64) {
                self.0 += distance;
            }
        }

        impl Sub for $position {
            type Output = u64;

            fn sub(self, earlier: $position) -> u64 {
                self.0 - earlier.0
            }
        }
    };
}

/// A byte position in a stream's data: where a chunk or record starts, a tail, a retention
/// point, a reader's `Stream-Next-Offset`. Positions are compared and advanced by byte
/// lengths; the distance between two is a length again, a plain `u64`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset(u64);

stored_as_u64!(Offset);

impl Offset {
    /// The start of every stream.
    pub const ZERO: Offset = Offset(0);

    /// Bytes from `earlier` to `self`, 0 if `earlier` lies past `self`.
    pub fn saturating_since(self, earlier: Offset) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The position `len` bytes further on, or the last one there is: for the ends of
    /// ranges whose lengths come from clients.
    pub fn saturating_add(self, len: u64) -> Offset {
        Offset(self.0.saturating_add(len))
    }
}

// A stream never holds 2^64 bytes, and `q - p` with `p` past `q` is a bug in the caller;
// callers that cannot rule it out use `saturating_since`.
moves_by_distance!(Offset);

/// The ordinal of a record (message) in its stream: the first record ever appended is
/// `RecordNo::ZERO`, and retention never renumbers the survivors. Ordinals move by counts
/// of records, and the difference of two is a count, a plain `u64`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordNo(u64);

stored_as_u64!(RecordNo);

impl RecordNo {
    /// The first record of every stream.
    pub const ZERO: RecordNo = RecordNo(0);

    /// The record after this one.
    pub fn next(self) -> RecordNo {
        self + 1
    }

    /// Records from `earlier` to `self`, or None if `earlier` comes after `self`.
    pub fn checked_since(self, earlier: RecordNo) -> Option<u64> {
        self.0.checked_sub(earlier.0)
    }

    /// The record `count` records further on, or the last one there is: for counts that
    /// come from clients.
    pub fn saturating_add(self, count: u64) -> RecordNo {
        RecordNo(self.0.saturating_add(count))
    }

    /// The record `count` records back, or the first one.
    pub fn saturating_sub(self, count: u64) -> RecordNo {
        RecordNo(self.0.saturating_sub(count))
    }
}

// No stream holds 2^64 records, and `q - p` with `p` after `q` is a bug in the caller;
// callers that cannot rule it out use `checked_since`.
moves_by_distance!(RecordNo);

/// Stream offset `n`, for tests that name offsets by number.
#[cfg(test)]
pub(crate) const fn off(n: u64) -> Offset {
    Offset(n)
}

/// Record ordinal `n`, for tests that name records by number.
#[cfg(test)]
pub(crate) const fn rec(n: u64) -> RecordNo {
    RecordNo(n)
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

    #[test]
    fn offsets_advance_by_lengths_and_differ_by_lengths() {
        let start = Offset::new(100);
        let end = start + 28;
        assert_eq!(end, Offset::new(128));
        assert_eq!(end - start, 28);
        assert_eq!(end.saturating_since(start), 28);
        assert_eq!(start.saturating_since(end), 0);
        assert_eq!(
            Offset::new(u64::MAX - 1).saturating_add(5),
            Offset::new(u64::MAX)
        );
        let mut at = Offset::ZERO;
        at += 7;
        assert_eq!(at.get(), 7);
        assert!(Offset::ZERO < at && at.max(end) == end);
        assert_eq!(end.to_string(), "128");
    }

    #[test]
    fn record_numbers_step_and_count_like_their_numbers() {
        assert_eq!(RecordNo::ZERO.next(), RecordNo::new(1));
        assert_eq!(RecordNo::new(5) + 3, RecordNo::new(8));
        assert_eq!(RecordNo::new(8) - RecordNo::new(5), 3);
        assert_eq!(RecordNo::new(8).checked_since(RecordNo::new(5)), Some(3));
        assert_eq!(RecordNo::new(5).checked_since(RecordNo::new(8)), None);
        assert_eq!(RecordNo::new(5).saturating_sub(8), RecordNo::ZERO);
        assert_eq!(RecordNo::new(5).saturating_sub(2), RecordNo::new(3));
        assert_eq!(
            RecordNo::new(u64::MAX).saturating_add(1),
            RecordNo::new(u64::MAX)
        );
        let mut n = RecordNo::new(41);
        n += 1;
        assert_eq!(n.get(), 42);
        assert!(RecordNo::new(2) < RecordNo::new(10));
        assert_eq!(RecordNo::new(12).to_string(), "12");
    }
}
