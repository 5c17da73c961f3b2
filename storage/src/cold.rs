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

/// A pending PUT of a WAL object: resolves once the object is in S3, or with why it never
/// will be. Transient S3 failures are retried inside, for as long as it takes.
pub type WalPut = Pin<Box<dyn Future<Output = Result<(), WalRefused>>>>;

/// Why a WAL object will never be in S3 under this server's epoch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalRefused {
    /// Another server took the shard over (its fence holds the key), or its archive.
    #[error("fenced: {0}")]
    Fenced(String),
    /// This cold tier has no S3 WAL (a test double, or the archiver thread is gone).
    #[error("no S3 write-ahead log: {0}")]
    Unsupported(&'static str),
}

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

    /// How far S3 held `shard`'s log when this server took it over: the archived end, or
    /// the end of the WAL objects past it. With S3 durability a shard whose local log ends
    /// before it must not open (acknowledged changes would be missing).
    fn s3_end(&self, shard: u32) -> Option<DurableEnd> {
        let _ = shard;
        None
    }

    /// The LSN through which the committed manifest's archived log reaches.
    fn archived_lsn(&self, shard: u32) -> crate::Lsn {
        let _ = shard;
        crate::Lsn::NONE
    }

    /// With S3 durability: put `object` in S3 as the next WAL object of `shard`.
    fn put_wal(&self, shard: u32, object: crate::wal::WalObject) -> WalPut {
        let _ = (shard, object);
        Box::pin(std::future::ready(Err(WalRefused::Unsupported(
            "this cold tier keeps no WAL",
        ))))
    }
}
