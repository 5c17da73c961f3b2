//! Checkpoints: when one is due, capturing the head state synchronously, and installing the
//! file once the log is durable up to it (format in `crate::checkpoint`).

use super::*;

impl Shard {
    /// Whether enough log was written since the last checkpoint to write the next one:
    /// `checkpoint_bytes`, or [`CHECKPOINT_LOG_RATIO`] times the last checkpoint's size if
    /// that is more. A checkpoint holds every stream's chunk table and message index, so
    /// it grows with the retained data; at a fixed interval, a shard ingesting millions
    /// of small events a second rewrote a ~100 MB checkpoint every second, and throughput
    /// fell by a third as it grew. The ratio keeps checkpoint writes at most a quarter of
    /// the log's, and a restart replays at most that many times the checkpoint it loads.
    pub(super) fn checkpoint_due(&self) -> bool {
        let since = self.inner.logged_bytes.get() - self.inner.checkpointed_at.get();
        let interval = self.inner.cfg.checkpoint_bytes.max(
            self.inner
                .checkpoint_size
                .get()
                .saturating_mul(CHECKPOINT_LOG_RATIO),
        );
        since >= interval
    }

    /// Write a checkpoint of every stream at the current head of the log, so the next start
    /// replays only what follows it. Returns false if nothing was written (memory mode, or
    /// the cleaner is running).
    pub async fn checkpoint(&self) -> Result<bool, StorageError> {
        if self.memory() || self.inner.upkeep_busy.replace(true) {
            return Ok(false);
        }
        let result = self.write_checkpoint().await;
        self.inner.upkeep_busy.set(false);
        result.map(|()| true)
    }

    /// Callers hold `upkeep_busy`.
    pub(super) async fn write_checkpoint(&self) -> Result<(), StorageError> {
        let Some(dir) = self.inner.log.borrow().as_ref().map(|l| l.dir.clone()) else {
            return Ok(());
        };
        let result = self.write_checkpoint_in(&dir).await;
        if result.is_err() {
            let _ = std::fs::remove_file(dir.join(checkpoint::TMP_NAME));
        }
        result
    }

    pub(super) async fn write_checkpoint_in(&self, dir: &Path) -> Result<(), StorageError> {
        let started = Instant::now();
        let (segment, offset) = match self.inner.log.borrow().as_ref() {
            Some(l) => (l.write_seg, l.write_end),
            None => return Ok(()),
        };
        let pos = checkpoint::Position {
            lsn: self.inner.next_lsn.get() - 1,
            segment,
            offset,
            next_id: self.inner.next_id.get(),
            last_incarnation: self.inner.last_incarnation.get(),
            blob_counter: self.inner.blob_counter.get(),
        };
        let logged = self.inner.logged_bytes.get();
        // Captured synchronously, so it is exactly the head state after record `pos.lsn`.
        let image = checkpoint::encode(
            self.inner.cfg.shard,
            pos,
            self.inner.streams.borrow().values(),
        );
        let bytes = image.len();
        let tmp = dir.join(checkpoint::TMP_NAME);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let file = monoio::fs::File::from_std(file)?;
        let (res, _) = file.write_all_at(image, 0).await;
        res?;
        file.sync_all().await?;
        drop(file);
        // The checkpoint may only replace the log before it once that log is durable.
        self.commit(pos.lsn).durable().await?;
        std::fs::rename(&tmp, checkpoint::path(dir))?;
        segment::sync_dir(dir)?;
        self.inner.checkpointed_at.set(logged);
        self.inner.checkpoint_size.set(bytes as u64);
        self.inner.checkpoint_segment.set(Some(pos.segment));
        tracing::debug!(
            shard = self.inner.cfg.shard,
            lsn = pos.lsn,
            bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }
}
