//! The once-a-second upkeep task: checkpoints, index files, cleaning, and evicting archived
//! segments.

use std::time::Duration;

use super::Shard;

impl Shard {
    /// Background upkeep, once a second.
    pub(super) async fn run_upkeep(self) {
        while !self.inner.stopping.get() {
            monoio::time::sleep(Duration::from_secs(1)).await;
            self.inner.clock_ms.set(crate::now_ms());
            if self.inner.stopping.get() || self.failure().is_some() {
                continue;
            }
            if let Some(cold) = &self.inner.cfg.cold {
                cold.durable(self.inner.cfg.shard, self.durable_end());
            }
            self.collect_dead_blobs();
            if let Err(e) = self.clean().await {
                tracing::warn!(shard = self.inner.cfg.shard, "log cleaning failed: {e}");
            }
            if self.checkpoint_due() {
                if let Err(e) = self.checkpoint().await {
                    tracing::warn!(shard = self.inner.cfg.shard, "checkpoint failed: {e}");
                }
            } else if self.index_due() || self.sleep_due() {
                if let Err(e) = self.flush_index().await {
                    tracing::warn!(shard = self.inner.cfg.shard, "index file failed: {e}");
                }
            }
            // After the checkpoint, which moves the position below which segments may go.
            if let Err(e) = self.evict_archived().await {
                tracing::warn!(shard = self.inner.cfg.shard, "eviction failed: {e}");
            }
        }
    }
}
