//! The engine's view of a cold tier: sealed segments that also live in object storage.
//!
//! The engine never talks to S3 itself: its cores run io_uring event loops, and the S3
//! client runs on its own runtime. The server hands every shard one [`ColdStore`]; the
//! engine asks it which sealed segments are safely archived (so their local files may go
//! when the local disk budget is spent) and reads byte ranges of segments that are no
//! longer local through it, in place of `pread`, on the same read path.

use std::future::Future;
use std::io;
use std::pin::Pin;

use bytes::Bytes;

use crate::position::SegmentNo;

/// A pending ranged read of an archived segment.
pub type ColdRead = Pin<Box<dyn Future<Output = io::Result<Bytes>>>>;

/// How far a shard's log is durable: the position after the last record a durable log write
/// has covered, and that record's LSN. Everything before it in the log never changes again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct DurableEnd {
    pub segment: SegmentNo,
    pub position: u64,
    pub lsn: crate::Lsn,
}

/// Where a shard's archived segments can be found again.
pub trait ColdStore: Send + Sync + std::fmt::Debug {
    /// Told by the shard's upkeep (once a second, never on the request path) how far its
    /// log is durable: what an archiver may copy.
    fn durable(&self, shard: u32, end: DurableEnd) {
        let _ = (shard, end);
    }

    /// Whether sealed segment `segment` of `shard` is archived whole and named by a
    /// committed manifest, so that its local file may be deleted.
    fn is_archived(&self, shard: u32, segment: SegmentNo) -> bool;

    /// Whether archiving has stopped for good (another server took the archive over): the
    /// local log is on its own again: cleaning no longer waits for the archive, and no
    /// further segment is evicted, because the new owner decides from now on which archived
    /// objects live (its cleaner may delete what this server's streams still point to).
    fn stopped(&self) -> bool {
        false
    }

    /// `len` bytes at byte `offset` of archived segment `segment` of `shard` (offsets are
    /// positions in the segment file, header included).
    fn read(&self, shard: u32, segment: SegmentNo, offset: u64, len: usize) -> ColdRead;
}
