//! Opening a shard with what its core gives it: the core's budgets split between the
//! shards placed on it, the cold tier, and the test suite's fault switches. A core opens
//! its shards at start (`runtime`), and a cluster host opens an adopted lane's (`lanes`).

use ursula_storage::placement::Placement;
use ursula_storage::{Durability, Shard, ShardConfig, StorageError};

use crate::config::{Config, StorageMode};

/// Open (recovering) shard `number` on core `index`: at start, or when its lane is adopted.
/// A core's budgets (read cache, write queue, cold cache and cold fetches) are split evenly
/// between the shards placed on it, and the local disk budget of the cold tier between all
/// shards.
pub async fn open_shard(
    index: usize,
    config: &Config,
    placement: &Placement,
    number: u32,
) -> Result<Shard, StorageError> {
    let durability = match config.storage {
        StorageMode::Disk => Durability::Disk(config.data_dir.clone()),
        StorageMode::Memory => Durability::Memory,
    };
    let here = (index as u32..placement.shards())
        .step_by(config.cores)
        .count()
        .max(1);
    let mut shard_cfg = ShardConfig::new(number, durability);
    shard_cfg.first_id = placement.first_id(number);
    shard_cfg.receipt_window = config.receipt_window;
    shard_cfg.segment_bytes = config.segment_bytes;
    shard_cfg.cache_bytes = config.cache_bytes / here;
    shard_cfg.index_cache_bytes = config.index_cache_bytes;
    shard_cfg.idle_after = config.idle_stream;
    // Listings hide these, and count dormant streams without waking them.
    shard_cfg.stays_resident = crate::ext::Ext::is_soft_deleted;
    shard_cfg.write_budget_bytes = config.write_budget_bytes / here;
    shard_cfg.fail_commit_after = fault_fail_commit_after();
    if let (Some(archive), Some(_)) = (crate::cold::archive(), &config.cold) {
        shard_cfg.cold = Some(archive.clone());
        shard_cfg.cold_cache_bytes /= here;
        shard_cfg.cold_in_flight_bytes /= here;
        shard_cfg.local_bytes = local_budget(config, placement);
        shard_cfg.s3_wal = config.s3_wal.clone().map(|mut s3| {
            s3.ack_before_s3 = fault_ack_before_s3();
            s3
        });
    }
    let (shard, report) = Shard::open(shard_cfg).await?;
    tracing::info!(
        core = index,
        shard = number,
        streams = report.streams,
        records = report.records,
        log_bytes = report.log_bytes,
        dropped_bytes = report.dropped_bytes,
        ms = report.elapsed.as_millis() as u64,
        "recovered"
    );
    Ok(shard)
}

/// Fault injection for the test suite (`server/tests/faults.rs`): with
/// `URSULA_FAULT_FAIL_COMMIT_AFTER=N` in the environment, each core's flush after N
/// successful ones fails as if its durable write had returned EIO. Never set in production.
fn fault_fail_commit_after() -> Option<u64> {
    let n = std::env::var("URSULA_FAULT_FAIL_COMMIT_AFTER")
        .ok()?
        .parse()
        .ok()?;
    tracing::warn!("fault injection: commit writes will fail after {n} flushes");
    Some(n)
}

/// A test switch that breaks `--durability s3` on purpose, so tests can show they notice:
/// appends are acknowledged once durable locally, before their WAL object is in S3.
fn fault_ack_before_s3() -> bool {
    let on = std::env::var("URSULA_FAULT_ACK_BEFORE_S3").is_ok_and(|v| v == "1");
    if on {
        tracing::warn!("fault injection: acknowledging appends before they are in S3");
    }
    on
}

/// A shard's share of the cold tier's local disk budget (all shards share it evenly), if
/// there is one: what it may keep locally, and what a restore of it downloads at most.
pub fn local_budget(config: &Config, placement: &Placement) -> Option<u64> {
    let tier = config.cold.as_ref()?;
    tier.local_bytes.map(|b| b / u64::from(placement.shards()))
}
