//! Why the server could not start: one type for every start-up failure after the
//! configuration was read, printed once on stderr before the process exits with status 1.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data dir could not be created or made durable.
    #[error("data dir {}: {source}", dir.display())]
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("data dir {} is in use by another ursula process", .0.display())]
    DataDirInUse(PathBuf),
    /// A file of the data dir (its lock, its layout) could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is malformed", .0.display())]
    LayoutMalformed(PathBuf),
    #[error("data dir {} was created with {created} cores; start with --cores {created}", dir.display())]
    CoresChanged { dir: PathBuf, created: usize },
    #[error("data dir {} was created {}; a data dir's lane count cannot change", dir.display(), match created {
        Some(l) => format!("with {l} lanes; start with --lanes {l} or without --lanes"),
        None => "before lanes (its streams are placed by the older hash); start without --lanes".to_string(),
    })]
    LanesChanged { dir: PathBuf, created: Option<u32> },
    #[error("data dir {} keeps {}; start with --logs {} or without --logs", dir.display(),
        if *log_per_lane { "a log per lane" } else { "a log per core" },
        if *log_per_lane { "lane" } else { "core" })]
    LogsChanged { dir: PathBuf, log_per_lane: bool },
    #[error("data dir {} has a log for each of its {lanes} lanes; start with at most --cores {lanes}", dir.display())]
    CoresBeyondLanes { dir: PathBuf, lanes: u32 },
    #[error("{0}")]
    Lanes(ursula_storage::placement::PlacementError),
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A call to the operating system outside the data dir (sockets, threads, signals).
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cold tier: {0}")]
    Cold(#[from] ursula_cold::Error),
    #[error("core {core}: {what}: {source}")]
    Core {
        core: usize,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("core {core}: open shard {shard}: {source}")]
    Storage {
        core: usize,
        shard: u32,
        source: ursula_storage::StorageError,
    },
    #[error("a core exited during start-up")]
    CoreExited,
}

impl StartError {
    /// An operating-system call `what` failed.
    pub fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> StartError {
        move |source| StartError::Os { what, source }
    }
}
