//! The storage engine's errors: one type a caller matches on, each variant saying who can
//! act on it. A client's request can be refused as it is (too large), retried (busy, a
//! transient I/O error), or not served until an operator acts (full disk, corrupt data, a
//! failed log, a data directory that cannot be opened as it is); a broken invariant is a
//! bug. The server maps each once (`server/src/http/error.rs`).

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::index::IndexFileNo;
use crate::position::SegmentNo;
use crate::record::FrameError;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The disk is full: nothing was changed.
    #[error("no space left on device")]
    NoSpace,
    /// The disk is full, and the sealed segments that would make room cannot leave it
    /// because they are not archived to the cold tier yet. Nothing was changed.
    #[error("no space left on device; {0}")]
    NoSpaceUnarchived(ArchiveLag),
    /// A record larger than a segment can hold.
    #[error("record larger than a segment")]
    TooLarge,
    /// Stored data failed its checksum, or is not what the index says is there.
    #[error("corrupt data on disk: {0}")]
    Corrupt(Corruption),
    /// The write queue holds its budget of unflushed bytes; nothing was changed and the
    /// caller may retry once the queue drains.
    #[error("write queue full")]
    Busy,
    /// An earlier log write failed; the shard accepts no more writes until restart
    /// because it can no longer tell what reached the disk.
    #[error("storage failed earlier: {0}")]
    Failed(LogFailure),
    /// Another server took this shard's S3 archive over (`--durability s3` or a cold
    /// tier): this server acknowledges no further change to it until restart.
    #[error("fenced: another server owns this shard's archive now")]
    Fenced,
    /// The shard stopped taking writes (its lane is moving, or the server stops); nothing
    /// was changed, and the change may be retried where the lane is served next.
    #[error("the shard has stopped")]
    Stopped,
    /// With `--durability s3`: the change is durable on the local disk but did not reach
    /// S3 within the acknowledgement bound. It is not acknowledged; it may still land
    /// (a retry with producer headers is deduplicated).
    #[error("not in S3 after {waited_ms} ms")]
    NotInS3 { waited_ms: u64 },
    /// The data directory cannot be opened as it is; the message says what to do.
    #[error("cannot open the shard: {0}")]
    Unrecoverable(Unrecoverable),
    /// A broken invariant of the engine: a bug, never the client's doing.
    #[error("internal error: {0}")]
    Internal(&'static str),
    #[error("i/o error: {0}")]
    Io(io::Error),
}

impl From<io::Error> for StorageError {
    fn from(e: io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            StorageError::NoSpace
        } else {
            StorageError::Io(e)
        }
    }
}

/// Sealed segments waiting for the cold tier while the disk is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveLag {
    pub segments: usize,
    pub bytes: u64,
    /// Seconds since the oldest of them was sealed, when known.
    pub oldest_sealed_secs: Option<u64>,
}

impl fmt::Display for ArchiveLag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "archive lag: {} sealed segments ({} MiB) are not archived yet and cannot leave \
             the local disk",
            self.segments,
            self.bytes >> 20
        )?;
        if let Some(secs) = self.oldest_sealed_secs {
            write!(f, ", the oldest sealed {secs} s ago")?;
        }
        Ok(())
    }
}

/// What was found corrupt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// A record a chunk table points at does not decode.
    #[error("segment {segment} position {position}: {problem:?}")]
    Record {
        segment: SegmentNo,
        position: u64,
        problem: FrameError,
    },
    /// The record there is not the one the chunk table points at.
    #[error("segment {segment} position {position}: record length changed")]
    RecordMoved { segment: SegmentNo, position: u64 },
    /// The cold tier returned less of a segment than its records need.
    #[error(
        "segment {segment}: the cold tier returned {got} bytes at position {position}, the \
         records need {needed}"
    )]
    ColdBlockShort {
        segment: SegmentNo,
        position: u64,
        got: u64,
        needed: u64,
    },
    /// A memory shard's snapshot blob is gone.
    #[error("snapshot blob {0} missing")]
    SnapshotBlobMissing(Box<str>),
}

/// Why a shard stopped taking writes for good (until restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardFailure {
    /// A durable log write failed.
    Log(LogFailure),
    /// Another server took the shard's S3 archive over.
    Fenced,
    /// The shard was stopped (its lane moves to another server, or the server stops):
    /// whatever it accepted is durable, and it takes nothing more.
    Stopped,
}

impl From<ShardFailure> for StorageError {
    fn from(f: ShardFailure) -> Self {
        match f {
            ShardFailure::Log(why) => StorageError::Failed(why),
            ShardFailure::Fenced => StorageError::Fenced,
            ShardFailure::Stopped => StorageError::Stopped,
        }
    }
}

impl fmt::Display for ShardFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardFailure::Log(why) => why.fmt(f),
            ShardFailure::Fenced => f.write_str("fenced: another server owns the shard's archive"),
            ShardFailure::Stopped => f.write_str("stopped"),
        }
    }
}

/// Why a shard's log stopped taking writes: the error of the write that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogFailure {
    pub kind: io::ErrorKind,
    /// The OS error number, when the failure was one.
    pub os_error: Option<i32>,
}

impl LogFailure {
    pub fn of(e: &StorageError) -> LogFailure {
        match e {
            StorageError::NoSpace => LogFailure::os(libc::ENOSPC),
            StorageError::Io(io) => LogFailure {
                kind: io.kind(),
                os_error: io.raw_os_error(),
            },
            StorageError::Failed(earlier) => *earlier,
            _ => LogFailure {
                kind: io::ErrorKind::Other,
                os_error: None,
            },
        }
    }

    pub fn os(errno: i32) -> LogFailure {
        LogFailure {
            kind: io::Error::from_raw_os_error(errno).kind(),
            os_error: Some(errno),
        }
    }
}

impl fmt::Display for LogFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.os_error {
            Some(errno) => write!(
                f,
                "log write failed: {}",
                io::Error::from_raw_os_error(errno)
            ),
            None => write!(f, "log write failed: {}", self.kind),
        }
    }
}

/// A data directory that cannot be opened as it is, and what an operator can do.
#[derive(Debug, thiserror::Error)]
pub enum Unrecoverable {
    #[error(
        "some sealed segments of {dir} are only in the S3 cold tier ({marker} is there): \
         start with the cold tier it was archived to (the same bucket, prefix and endpoint)"
    )]
    ColdTierMissing { dir: PathBuf, marker: &'static str },
    #[error(
        "the index pages of {streams} streams must be rebuilt from the log, but {cold} of its \
         segments are only in the cold tier: restore this data directory"
    )]
    RebuildNeedsColdSegments { streams: usize, cold: usize },
    #[error("segment {0} has a corrupt header")]
    SegmentHeader(PathBuf),
    #[error("checkpoint resumes at position {offset} of segment {segment}, outside it")]
    ResumeOutsideSegment { segment: SegmentNo, offset: u64 },
    #[error(
        "the checkpoint continues the log in segment {0}, but no segment from there on exists"
    )]
    ResumeSegmentMissing(SegmentNo),
    #[error(
        "S3 holds this shard's log up to LSN {s3_lsn}, but the local log ends at LSN \
         {local_lsn}: acknowledged changes are missing here; rebuild this data directory \
         with `ursula restore`"
    )]
    BehindS3 { s3_lsn: u64, local_lsn: u64 },
    #[error(
        "checkpoint {path} is corrupt ({why}); the log before it may already be reclaimed, so \
         a full replay cannot stand in for it: restore this data directory from a backup"
    )]
    CheckpointCorrupt { path: PathBuf, why: FormatError },
    #[error(
        "index file {file} holding the saved state of dormant stream {key} is missing or torn; \
         restore this data directory (with a cold tier: `ursula restore`)"
    )]
    DormantStateMissing { file: IndexFileNo, key: Box<str> },
    #[error("dormant stream {key}: {why}")]
    DormantStateCorrupt { key: Box<str>, why: FormatError },
}

impl From<Unrecoverable> for StorageError {
    fn from(e: Unrecoverable) -> Self {
        StorageError::Unrecoverable(e)
    }
}

impl From<Corruption> for StorageError {
    fn from(e: Corruption) -> Self {
        StorageError::Corrupt(e)
    }
}

/// Why stored bytes (a checkpoint, an index file, a table, a dormant stream's saved state)
/// do not decode. Each names what is wrong; the caller adds where it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{len} bytes is shorter than the header")]
    ShortHeader { len: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error("unsupported format version {0}")]
    Version(u32),
    #[error("written by shard {0}")]
    OtherShard(u32),
    #[error("written for another shard or under another number")]
    OtherFile,
    #[error("{len} bytes long, its header says {header} (torn)")]
    Length { len: u64, header: u64 },
    #[error("body checksum mismatch")]
    BodyChecksum,
    #[error("page checksum mismatch")]
    PageChecksum,
    #[error("image record: {0:?}")]
    Frame(FrameError),
    #[error("expected an image record")]
    NotAnImage,
    /// A field that is missing, out of range or not one of its values.
    #[error("bad {0}")]
    Field(&'static str),
    #[error("{0} bytes after the end")]
    Trailing(usize),
    #[error("cannot read it: {0}")]
    Read(io::ErrorKind),
    #[error("stream #{n}: {source}")]
    Stream { n: u64, source: Box<FormatError> },
    #[error("dormant stream {id}: {source}")]
    Dormant { id: u64, source: Box<FormatError> },
}

impl FormatError {
    /// This error, found in the `n`th stream of a checkpoint.
    pub(crate) fn in_stream(self, n: u64) -> FormatError {
        FormatError::Stream {
            n,
            source: Box::new(self),
        }
    }
}
