//! The once-a-second upkeep task: checkpoints, index files, cleaning, and evicting archived
//! segments.

use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use super::Shard;
use crate::slices::Slices;

/// How long the upkeep task waits between rounds.
const UPKEEP_PERIOD: Duration = Duration::from_secs(1);

impl Shard {
    /// Background upkeep, once a second.
    pub(super) async fn run_upkeep(self) {
        while !self.inner.stopping.get() {
            self.wait_for_next_round().await;
            self.inner.clock_ms.set(crate::now_ms());
            if self.inner.stopping.get() || self.failure().is_some() {
                continue;
            }
            self.publish_durable_end();
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
            self.move_sparse_states(&mut Slices::default()).await;
            // After the checkpoint, which moves the position below which segments may go.
            if let Err(e) = self.evict_archived().await {
                tracing::warn!(shard = self.inner.cfg.shard, "eviction failed: {e}");
            }
            // Again after the jobs: a checkpoint of a large log can take seconds, and the
            // archive only copies up to the end it was last told.
            self.publish_durable_end();
        }
    }

    /// Tell the cold tier, if any, how far the log is durable.
    fn publish_durable_end(&self) {
        if let Some(cold) = &self.inner.cfg.cold {
            cold.durable(self.inner.cfg.shard, self.durable_end());
        }
    }

    /// Wait one upkeep period, or less if the shard stops meanwhile.
    async fn wait_for_next_round(&self) {
        let stopped = poll_fn(|cx| {
            if self.inner.stopping.get() {
                return Poll::Ready(());
            }
            *self.inner.upkeep.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        });
        monoio::select! {
            () = monoio::time::sleep(UPKEEP_PERIOD) => {}
            () = stopped => {}
        }
        self.inner.upkeep.borrow_mut().take();
    }
}
