//! The checkpoint ledger: how much log the shard has written, how much of it the last
//! checkpoint covers, how large that checkpoint was, and the segment a restart would
//! replay from. From these it decides when the next checkpoint is due.
//!
//! It does no I/O: the commit path counts logged bytes here, `checkpointing` records each
//! installed checkpoint, recovery the loaded one. Invariant (asserted): the log covered by
//! the last checkpoint never exceeds the log written, and neither goes back.

use super::CHECKPOINT_LOG_RATIO;
use crate::position::SegmentNo;

#[derive(Debug, Default)]
pub(super) struct CheckpointLedger {
    /// Framed bytes logged since the shard opened (a replayed tail counts as logged).
    logged_bytes: u64,
    /// `logged_bytes` when the installed checkpoint was captured.
    covered_bytes: u64,
    /// Size of the last checkpoint written or loaded.
    last_size: u64,
    /// Segment where replay from the durable checkpoint starts. Only segments before it
    /// may be deleted: a record in a later one (a deletion, say) is needed on top of the
    /// checkpoint, and the cleaner does not carry deletions forward.
    replay_from: Option<SegmentNo>,
}

impl CheckpointLedger {
    /// `bytes` more of log were written.
    pub(super) fn logged(&mut self, bytes: u64) {
        self.logged_bytes += bytes;
    }

    /// Log written so far: what a checkpoint captured now covers.
    pub(super) fn logged_bytes(&self) -> u64 {
        self.logged_bytes
    }

    /// Log written since the installed checkpoint was captured.
    pub(super) fn since_last(&self) -> u64 {
        self.logged_bytes - self.covered_bytes
    }

    /// Whether enough log was written since the last checkpoint for another, with
    /// `min_bytes` the configured interval (`checkpoint_bytes`): that much, or
    /// [`CHECKPOINT_LOG_RATIO`] times the last checkpoint's size if that is more. A
    /// checkpoint grows with streams (their newest entries and the pages not in an index
    /// file yet); with many streams a fixed interval would rewrite it more often than the
    /// log justifies.
    pub(super) fn due(&self, min_bytes: u64) -> bool {
        let interval = min_bytes.max(self.last_size.saturating_mul(CHECKPOINT_LOG_RATIO));
        self.since_last() >= interval
    }

    /// A checkpoint captured when `covered` bytes were logged, `size` bytes long, replaying
    /// from `segment`, is installed.
    pub(super) fn installed(&mut self, covered: u64, size: u64, segment: SegmentNo) {
        assert!(
            covered >= self.covered_bytes && covered <= self.logged_bytes,
            "a checkpoint covers log between the last one's and the head"
        );
        self.covered_bytes = covered;
        self.last_size = size;
        self.replay_from = Some(segment);
    }

    /// Recovery loaded a checkpoint of `size` bytes that replays from `segment`.
    pub(super) fn loaded(&mut self, size: u64, segment: SegmentNo) {
        self.last_size = size;
        self.replay_from = Some(segment);
    }

    /// Recovery replayed `bytes` of log after the checkpoint: they count as written since
    /// it, so a long replay makes a checkpoint due at once.
    pub(super) fn replayed(&mut self, bytes: u64) {
        self.logged_bytes = self.covered_bytes + bytes;
    }

    pub(super) fn replay_from(&self) -> Option<SegmentNo> {
        self.replay_from
    }

    /// Bytes of the installed checkpoint (0 before the first).
    pub(super) fn last_size(&self) -> u64 {
        self.last_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_after_the_larger_of_the_interval_and_a_multiple_of_the_last_size() {
        let mut ledger = CheckpointLedger::default();
        assert!(!ledger.due(100));
        ledger.logged(99);
        assert!(!ledger.due(100));
        ledger.logged(1);
        assert!(ledger.due(100));
        // A checkpoint of 50 bytes: the next is due after max(100, 4 * 50) bytes.
        ledger.installed(100, 50, SegmentNo::new(3));
        assert_eq!(ledger.replay_from(), Some(SegmentNo::new(3)));
        ledger.logged(199);
        assert!(!ledger.due(100));
        ledger.logged(1);
        assert!(ledger.due(100));
    }

    #[test]
    fn a_long_replay_makes_a_checkpoint_due_at_once() {
        let mut ledger = CheckpointLedger::default();
        ledger.loaded(10, SegmentNo::new(1));
        ledger.replayed(1000);
        assert!(ledger.due(100));
        assert_eq!(ledger.last_size(), 10);
    }

    #[test]
    #[should_panic(expected = "a checkpoint covers log")]
    fn a_checkpoint_cannot_cover_log_not_written() {
        let mut ledger = CheckpointLedger::default();
        ledger.logged(10);
        ledger.installed(11, 1, SegmentNo::new(0));
    }
}
