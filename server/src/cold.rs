//! The cold tier as the server sees it: the archive started at start-up (if a bucket is
//! configured), which the cores hand to their shards and the admin endpoints report on.

use std::sync::{Arc, OnceLock};

use ursula_cold::Archive;

static ARCHIVE: OnceLock<Arc<Archive>> = OnceLock::new();

/// Start the archiver for `shards` shards of `data_dir` and keep it for the process.
pub fn start(
    tier: &crate::config::ColdTier,
    data_dir: &std::path::Path,
    shards: usize,
) -> Result<(), String> {
    let archive = ursula_cold::start(tier.settings.clone(), data_dir, shards as u32)?;
    let _ = ARCHIVE.set(archive);
    Ok(())
}

/// The running archive, if there is a cold tier.
pub fn archive() -> Option<&'static Arc<Archive>> {
    ARCHIVE.get()
}

/// `ursula restore`: build `args.data_dir` from the archive.
pub fn restore(args: &crate::config::RestoreArgs) -> Result<ursula_cold::restore::Report, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async {
        let store: ursula_s3::DynStore = Arc::new(ursula_s3::S3Store::connect(&args.s3()).await);
        ursula_cold::restore::restore(&store, &args.data_dir).await
    })
}
