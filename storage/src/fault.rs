//! Test-only switches that make the engine skip a sync it relies on, so the power-loss
//! test (`server/tests/power_loss`) can show that it notices the loss. Never set them in
//! production: with either one, a power cut loses acknowledged data.
//!
//! * `URSULA_FAULT_SKIP_FDATASYNC=1`: the log is written without `O_DSYNC`, so a group
//!   commit is acknowledged before its data is on stable storage.
//! * `URSULA_FAULT_SKIP_DIRSYNC=1`: directory syncs are skipped, so a new segment, a renamed
//!   checkpoint or snapshot blob, a new data dir or the server's `ursula.layout` may vanish
//!   with its directory entry.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug)]
pub(crate) struct SkipSyncs {
    pub fdatasync: bool,
    pub dirsync: bool,
}

/// The switches, read from the environment once, when the first shard opens.
pub(crate) fn skips() -> SkipSyncs {
    static SKIPS: OnceLock<SkipSyncs> = OnceLock::new();
    *SKIPS.get_or_init(|| {
        let on = |name: &str| std::env::var_os(name).is_some_and(|v| v == "1");
        let skips = SkipSyncs {
            fdatasync: on("URSULA_FAULT_SKIP_FDATASYNC"),
            dirsync: on("URSULA_FAULT_SKIP_DIRSYNC"),
        };
        if skips.fdatasync || skips.dirsync {
            tracing::warn!(
                ?skips,
                "fault injection: syncs skipped, a power cut loses data"
            );
        }
        skips
    })
}
