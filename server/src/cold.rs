//! The cold tier as the server sees it: the archive started at start-up (if a bucket is
//! configured), which the cores hand to their shards and the admin endpoints report on.

use std::sync::{Arc, OnceLock};

use ursula_cold::Archive;

static ARCHIVE: OnceLock<Arc<Archive>> = OnceLock::new();

/// Start the archiver for the shards of `data_dir` and keep it for the process: every
/// shard, or in a cluster the lanes this host still owns ([`Archive::held`]).
pub fn start(
    tier: &crate::config::ColdTier,
    data_dir: &std::path::Path,
    placement: ursula_storage::placement::Placement,
    cluster: bool,
) -> Result<(), ursula_cold::Error> {
    let which = if cluster {
        ursula_cold::Claim::Owned
    } else {
        ursula_cold::Claim::Every
    };
    let archive = ursula_cold::start(tier.settings.clone(), data_dir, placement, which)?;
    let _ = ARCHIVE.set(archive);
    Ok(())
}

/// The running archive, if there is a cold tier.
pub fn archive() -> Option<&'static Arc<Archive>> {
    ARCHIVE.get()
}

/// A clean stop's last archive round, once the cores have stopped taking writes and
/// reported their final durable ends: log how far each shard's archive got, or how much is
/// left only on the local disk when the round ran out of time.
pub fn finish() {
    use ursula_cold::FinalRound;
    let Some(archive) = archive() else { return };
    let started = std::time::Instant::now();
    let rounds = archive.finish(crate::limits::FINAL_ARCHIVE_ROUND);
    let took_ms = started.elapsed().as_millis() as u64;
    if let Some((_, FinalRound::Fenced(why))) = rounds.first() {
        tracing::info!("cold tier: no last archive round, archiving had stopped: {why}");
        return;
    }
    for (shard, round) in rounds {
        match round {
            FinalRound::Archived(end) => tracing::info!(
                shard,
                segment = end.segment,
                position = end.position,
                lsn = end.lsn,
                took_ms,
                "cold tier: archived up to the final durable end"
            ),
            FinalRound::Fenced(why) => {
                tracing::warn!(shard, "cold tier: no last archive round: {why}")
            }
            FinalRound::TimedOut { lag_bytes } => tracing::warn!(
                shard,
                lag_bytes,
                took_ms,
                "cold tier: the last archive round ran out of time; the archive lag is only \
                 on the local disk (a restore from S3 now would miss it)"
            ),
        }
    }
}

/// Why `ursula restore` failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Cold(#[from] ursula_cold::Error),
}

/// `ursula restore`: build `args.data_dir` from the archive.
pub fn restore(
    args: &crate::config::RestoreArgs,
) -> Result<ursula_cold::restore::Report, RestoreError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RestoreError::Runtime)?;
    runtime.block_on(async {
        let store: ursula_s3::DynStore = Arc::new(ursula_s3::S3Store::connect(&args.s3()).await);
        let report =
            ursula_cold::restore::restore(&store, &args.data_dir, args.cold_local_bytes).await?;
        Ok(report)
    })
}
