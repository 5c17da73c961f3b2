//! The one error type of the cold tier: why claiming, archiving or restoring an archive
//! failed.
//!
//! Every message names what it concerns (an object key, a file, a shard) and ends with
//! its source's text: the server logs these errors and prints them at start-up with `{}`
//! alone, so that text has to say everything an operator needs. The source is kept as
//! well, for code that decides by what failed underneath.

use std::io;
use std::path::PathBuf;

use ursula_s3::StoreError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object-store request failed (S3 unreachable, refused, a 5xx): retrying may help.
    #[error("{key}: {source}")]
    Request {
        key: String,
        #[source]
        source: StoreError,
    },
    /// An object a manifest names is not in the store.
    #[error("{key} is missing from {store}")]
    Missing { key: String, store: String },
    /// A manifest that does not parse, or describes another shard.
    #[error("{key}: corrupt manifest: {source}")]
    CorruptManifest {
        key: String,
        #[source]
        source: sonic_rs::Error,
    },
    #[error("{key} describes shard {found}")]
    WrongShard { key: String, found: u32 },
    /// The prefix's layout object does not parse.
    #[error("{key}: corrupt: {source}")]
    CorruptLayout {
        key: String,
        #[source]
        source: sonic_rs::Error,
    },
    /// An object whose length or CRC is not what its manifest entry says.
    #[error("{key}: content differs from its manifest entry")]
    CorruptObject { key: String },
    /// A stored WAL entry that does not decode.
    #[error("{key}: corrupt WAL object: {source}")]
    CorruptWalObject {
        key: String,
        #[source]
        source: ursula_storage::wal::WalFormatError,
    },
    /// A WAL object that decodes but does not belong where it is.
    #[error("{key}: {why}")]
    CorruptWal { key: String, why: &'static str },
    /// A WAL object continues a segment that neither the archive nor an earlier WAL object
    /// holds.
    #[error("shard {shard}: the WAL continues segment {segment}, which the archive lacks")]
    WalGap { shard: u32, segment: u64 },
    /// A restored segment whose first piece is not a header of that segment and shard.
    #[error("segment {segment} of shard {shard}: no valid header")]
    BadSegmentHeader { segment: u64, shard: u32 },
    /// A local file of the cold tier (`cold-restored`) that does not parse.
    #[error("{}: {source}", path.display())]
    CorruptFile {
        path: PathBuf,
        #[source]
        source: sonic_rs::Error,
    },
    /// A JSON document that could not be written out.
    #[error("encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: sonic_rs::Error,
    },
    /// The archive holds a data dir placed otherwise: a configuration error.
    #[error(
        "{store} holds a data dir of {}; this server's has {} (start it with {})",
        describe(archived),
        describe(ours),
        start_flags(archived)
    )]
    LayoutMismatch {
        store: String,
        archived: crate::manifest::Layout,
        ours: crate::manifest::Layout,
    },
    /// The layout object names no placement a data dir can have.
    #[error("{key} names {shards} shards and {lanes:?} lanes, which no data dir can have")]
    UnusableLayout {
        key: String,
        shards: u32,
        lanes: Option<u32>,
    },
    /// The layout object was created by someone and gone again before it could be read.
    #[error("{key} vanished while being created")]
    LayoutVanished { key: String },
    /// Another server owns the shard's manifest and its heartbeat is fresh.
    #[error(
        "cold tier {store} shard {shard} is owned by server {owner} (epoch {epoch}, last \
         heartbeat {heartbeat_age_ms} ms ago); refusing to start. Stop that server, or start \
         this one with --cold-takeover to fence it out"
    )]
    Owned {
        store: String,
        shard: u32,
        owner: String,
        epoch: u64,
        heartbeat_age_ms: i64,
    },
    /// A compare-and-swap of a manifest lost: another writer changed it since it was read.
    #[error("{key}: the manifest changed under us")]
    Conflict { key: String },
    /// Two servers claimed a shard's next epoch at once and this one lost.
    #[error(
        "cold tier {store} shard {shard}: another server claimed the manifest at the same \
         time; refusing to start"
    )]
    ClaimRace { store: String, shard: u32 },
    /// Claiming the archive failed for a reason below; says which archive.
    #[error("cold tier {store}: {source}")]
    Claim {
        store: String,
        #[source]
        source: Box<Error>,
    },
    /// `ursula restore` builds a new data dir only.
    #[error("{} is not empty; restore builds a new data dir", dir.display())]
    NotEmpty { dir: PathBuf },
    #[error("{store} holds no archive ({key} is missing)")]
    NoArchive { store: String, key: &'static str },
    #[error("{store}: shard {shard} has no manifest")]
    NoManifest { store: String, shard: u32 },
    /// A local file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The archiver thread or its runtime could not be started.
    #[error("{what}: {source}")]
    Start {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the archiver thread exited")]
    ThreadExited,
    /// A lane to adopt that the archive's layout does not have.
    #[error("shard {shard} is not in this archive's layout")]
    NoSuchShard { shard: u32 },
    /// A lane to adopt that this server already archives.
    #[error("shard {shard} is already this server's")]
    AlreadyHeld { shard: u32 },
    /// A local checkpoint the storage engine does not accept (read while being replaced).
    #[error("{}: {reason}", path.display())]
    CorruptCheckpoint {
        path: PathBuf,
        reason: ursula_storage::FormatError,
    },
    /// A round of the archiver that made no progress in its time (a request that hangs).
    #[error("no progress in {after:?}")]
    Stalled { after: std::time::Duration },
    /// The manifest changed under a commit, and what is there is this owner's own earlier
    /// write whose answer was lost: the round is retried from it.
    #[error("the manifest changed under us (our own retried write)")]
    OwnWriteRetried,
}

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    /// A failed request for `key`.
    pub(crate) fn request(key: impl Into<String>) -> impl FnOnce(StoreError) -> Error {
        let key = key.into();
        move |source| Error::Request { key, source }
    }
}

/// A layout in words, for the mismatch message.
/// The `ursula` flags that create a data dir of `layout`.
fn start_flags(layout: &crate::manifest::Layout) -> String {
    match (layout.logs.as_deref(), layout.lanes) {
        (Some(_), Some(lanes)) => format!("--logs lane --lanes {lanes}"),
        (_, Some(lanes)) => format!("--cores {} --lanes {lanes}", layout.shards),
        (_, None) => format!("--cores {}", layout.shards),
    }
}

fn describe(layout: &crate::manifest::Layout) -> String {
    match layout.placement() {
        Some(p) => p.to_string(),
        None => format!(
            "{} shards and {:?} lanes (unusable)",
            layout.shards, layout.lanes
        ),
    }
}
