//! The cold tier: a data dir's shards moved to and from S3.
//!
//! * [`start`] runs the archiver: one thread beside the cores, continuously copying every
//!   shard's durable log, checkpoints, index files and snapshot blobs to S3 as immutable
//!   objects, and advancing each shard's manifest by compare-and-swap under an owner epoch
//!   (`archiver`). The returned [`Archive`] is the engine's [`ursula_storage::cold::ColdStore`].
//! * [`restore::restore`] builds a data dir from the archive alone.
//! * [`wal`] follows, fences and applies the S3 write-ahead log of `--durability s3`.
//! * [`members`] is a cluster's membership: node records, liveness by the store's clock,
//!   and which host should serve which lane.
//! * [`manifest`] is the object layout and the manifest format; [`status`] what the tier
//!   reports (metrics, fencing); [`Error`] why any of it failed.

mod archiver;
pub mod error;
pub mod manifest;
pub mod members;
pub mod restore;
pub mod status;
pub mod wal;

pub use archiver::{
    start, Adopted, Archive, Claim, FinalRound, Settings, ShardState, OWNER_FILE, RESTORED_FILE,
};
pub use error::{Error, Result};

/// What the unit tests share: an object store in a temporary directory, and a runtime.
#[cfg(test)]
mod test_support {
    use std::sync::Arc;

    use ursula_s3::DynStore;

    pub(crate) fn local() -> (tempfile::TempDir, DynStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: DynStore = Arc::new(ursula_s3::LocalStore::open(dir.path()).expect("store"));
        (dir, store)
    }

    pub(crate) fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }
}
