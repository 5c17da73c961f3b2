//! Group commit's I/O side: the flusher task that writes whole batches durably (`O_DSYNC`)
//! and reports them to the shard's [`GroupCommit`] ledger, and the [`Commit`] a writer
//! waits on.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::aligned::align_up;
use crate::error::{LogFailure, ShardFailure, StorageError};
use crate::position::{Lsn, Offset};
use crate::record::Record;
use crate::stream::{DiskLoc, StreamId};

use super::group_commit::Ticket;
use super::writer::Batch;
use super::{missing, Inner, Shard, COMMIT_BYTES_BUCKETS, COMMIT_WRITE_BUCKETS_US};

impl Shard {
    /// Framed bytes written to the log but not yet durable.
    pub fn unflushed_bytes(&self) -> u64 {
        self.inner.group_commit.borrow().unflushed_bytes()
    }

    /// Refuse a client write while the unflushed bytes are at the budget. An empty queue
    /// admits any size, so a record larger than the budget still makes progress.
    pub(super) fn admit(&self, data_len: usize) -> Result<(), StorageError> {
        let budget = self.inner.cfg.write_budget_bytes as u64;
        if self
            .inner
            .group_commit
            .borrow()
            .admits(data_len as u64, budget)
        {
            Ok(())
        } else {
            Err(StorageError::Busy)
        }
    }

    pub(super) fn commit(&self, lsn: Lsn) -> Commit {
        Commit {
            ticket: self.inner.group_commit.borrow_mut().ticket(lsn),
            inner: self.inner.clone(),
            registered: Cell::new(false),
        }
    }

    pub(super) fn make_visible(&self, id: StreamId, tail: Offset, closed: bool) {
        // A stream with something in flight never sleeps (see `dormancy`).
        if let Some(s) = self.inner.catalog.borrow_mut().get_mut(id) {
            s.make_visible(tail, closed);
        }
    }

    /// Assign an LSN and queue the record for the next flush (memory: durable at once).
    /// Returns the LSN and, on disk, where the record will be.
    pub(super) fn log_record(
        &self,
        record: &Record,
        create_effect: Option<(StreamId, Offset, bool)>,
    ) -> Result<(Lsn, Option<DiskLoc>), StorageError> {
        let lsn = match self.inner.group_commit.borrow().next_lsn() {
            Ok(lsn) => lsn,
            Err(why) => return Err((*why).into()),
        };
        let mut loc = None;
        let mut guard = self.inner.log.borrow_mut();
        if let Some(log) = guard.as_mut() {
            let sealing = log.write_segment();
            let at = match log.enqueue(record, lsn, create_effect) {
                Ok(at) => at,
                Err(StorageError::NoSpace) => {
                    drop(guard);
                    return Err(self.no_space());
                }
                Err(e) => return Err(e),
            };
            if at.segment != sealing {
                if let Some(tier) = self.cold_tier() {
                    tier.sealed_at.borrow_mut().insert(sealing, Instant::now());
                }
            }
            self.inner
                .group_commit
                .borrow_mut()
                .queued(at.record_len as u64);
            self.inner
                .checkpoints
                .borrow_mut()
                .logged(at.record_len as u64);
            self.inner
                .segments
                .borrow_mut()
                .note(at.segment, record.stream_id());
            loc = Some(at);
            self.wake_flusher();
        }
        let mut group_commit = self.inner.group_commit.borrow_mut();
        group_commit.assigned(lsn);
        if self.memory() {
            group_commit.made_durable(lsn);
        }
        Ok((lsn, loc))
    }

    pub(super) fn set_effect_tail(&self, lsn: Lsn, id: StreamId, tail: Offset, closed: bool) {
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            log.set_effect(lsn, id, tail, closed);
        }
    }

    pub(super) fn wake_flusher(&self) {
        if let Some(w) = self.inner.flusher.borrow_mut().take() {
            w.wake();
        }
    }

    pub(super) async fn run_flusher(self) {
        loop {
            poll_fn(|cx| {
                let ready = self.inner.stopping.get()
                    || self
                        .inner
                        .log
                        .borrow()
                        .as_ref()
                        .is_some_and(|l| l.has_pending());
                if ready {
                    Poll::Ready(())
                } else {
                    *self.inner.flusher.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            let batches = match self.inner.log.borrow_mut().as_mut() {
                Some(log) => log.take_batches(),
                None => return,
            };
            if batches.is_empty() {
                if self.inner.stopping.get() {
                    // Nothing flushes a write queued from now on: refuse it instead.
                    let mut commit = self.inner.group_commit.borrow_mut();
                    if commit.failure().is_none() {
                        commit.fail(crate::error::ShardFailure::Stopped);
                    }
                    return;
                }
                continue;
            }
            // take_batches() took every queued record.
            self.inner.group_commit.borrow_mut().flush_started();
            let mut batches = batches;
            let flushed = self.flush(&mut batches).await;
            self.inner.group_commit.borrow_mut().flush_ended();
            match flushed {
                Ok(()) => self.complete(batches),
                Err(e) => self.fail(&e),
            }
        }
    }

    /// Write every batch; each write is durable when it completes, because the log's write
    /// handles are `O_DSYNC` (see `segment::open_log_writer`).
    ///
    /// One durable write per commit rather than a write and then an fdatasync: the kernel
    /// flushes the disk from the write's completion, so the core submits and is woken once
    /// per commit instead of twice, and no io_uring worker thread is woken for an fsync.
    pub(super) async fn flush(&self, batches: &mut [Batch]) -> Result<(), StorageError> {
        self.finish_zeroing_under(batches).await;
        let started = Instant::now();
        for batch in batches.iter_mut() {
            let file = {
                let mut log = self.inner.log.borrow_mut();
                let log = log.as_mut().ok_or_else(missing)?;
                log.file_for(batch.seg)?
            };
            let mut buf = batch.buf.take().ok_or_else(missing)?;
            let len = buf.len();
            // Pad to the block boundary with zeros (a recycled buffer holds old bytes there);
            // the next batch rewrites this partial block with more records.
            buf.set_len(align_up(len));
            buf.as_mut_full()[len..align_up(len)].fill(0);
            let (res, mut buf) = file.write_all_at(buf, batch.base).await;
            buf.set_len(len);
            batch.buf = Some(buf);
            res?;
        }
        if let Some(last) = batches.last() {
            let end = last.base + last.buf.as_ref().map_or(0, |b| b.len()) as u64;
            let mut log = self.inner.log.borrow_mut();
            if let Some(log) = log.as_mut() {
                log.zero_ahead(last.seg, end);
            }
        }
        if self.inner.cfg.fail_commit_after == Some(self.inner.stats.get().flushes) {
            return Err(io::Error::from_raw_os_error(libc::EIO).into());
        }
        self.count_commit_write(started.elapsed());
        Ok(())
    }

    /// Wait for the zeros being written ahead of the records if `batches` reach them (or
    /// belong to a later segment), so no data write races a zero write to the same blocks.
    /// Usually they were written long ago, and this only takes the buffer back.
    pub(super) async fn finish_zeroing_under(&self, batches: &[Batch]) {
        let zeroing = match self.inner.log.borrow_mut().as_mut() {
            Some(log) => log.zeroing_reached_by(batches),
            None => None,
        };
        let Some(zeroing) = zeroing else { return };
        let (res, zeros) = zeroing.finished().await;
        if let Err(e) = res {
            // Only an optimisation failed: the data writes convert the blocks themselves,
            // and report any disk error on their own.
            tracing::warn!(
                shard = self.inner.cfg.shard,
                "writing zeros ahead failed: {e}"
            );
        }
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            log.zeros_returned(zeros);
        }
    }

    pub(super) fn count_commit_write(&self, took: Duration) {
        let mut stats = self.inner.stats.get();
        let us = took.as_micros() as u64;
        let slot = super::bucket_slot(&COMMIT_WRITE_BUCKETS_US, us);
        stats.commit_write_buckets[slot] += 1;
        stats.commit_writes += 1;
        stats.commit_write_nanos += took.as_nanos() as u64;
        self.inner.stats.set(stats);
    }

    pub(super) fn complete(&self, batches: Vec<Batch>) {
        let mut stats = self.inner.stats.get();
        stats.flushes += 1;
        let written: u64 = batches
            .iter()
            .map(|b| b.buf.as_ref().map_or(0, |b| b.len()) as u64)
            .sum();
        let slot = super::bucket_slot(&COMMIT_BYTES_BUCKETS, written);
        stats.commit_bytes_buckets[slot] += 1;
        stats.bytes_flushed += written;
        // With S3 durability the streams become readable once S3 has their changes.
        self.ship_to_s3(&batches);
        let after_s3 = self.visible_after_s3();
        let mut group_commit = self.inner.group_commit.borrow_mut();
        for batch in batches {
            stats.records_flushed += batch.effects.len() as u64;
            for e in &batch.effects {
                if let (Some((id, tail, closed)), false) = (e.visible, after_s3) {
                    self.make_visible(id, tail, closed);
                }
                // Batches complete in log order (the ledger asserts it).
                group_commit.made_durable(e.lsn);
            }
            if let Some(buf) = &batch.buf {
                if !batch.effects.is_empty() {
                    let end = batch.base + buf.len() as u64;
                    group_commit.set_durable_end((batch.seg, end));
                }
            }
            if let Some(log) = self.inner.log.borrow_mut().as_mut() {
                if let Some(buf) = batch.buf {
                    log.recycle(buf);
                }
            }
        }
        if let Some(log) = self.inner.log.borrow_mut().as_mut() {
            log.drop_sealed_handles();
        }
        self.inner.stats.set(stats);
        group_commit.wake_durable();
        drop(group_commit);
        self.evict_over_budget();
    }

    pub(super) fn fail(&self, e: &StorageError) {
        tracing::error!(
            shard = self.inner.cfg.shard,
            "log write failed: {e}; refusing further writes"
        );
        self.inner
            .group_commit
            .borrow_mut()
            .fail(ShardFailure::Log(LogFailure::of(e)));
    }
}

/// Resolves when an accepted change is durable (or the shard has failed). Dropping one
/// unawaited acknowledges nothing, so it is a bug wherever a reply depends on it.
#[must_use = "a change is durable only once its Commit resolves"]
pub struct Commit {
    inner: Rc<Inner>,
    ticket: Ticket,
    /// Whether the ticket holds a waker slot in the ledger (an earlier poll was pending).
    registered: Cell<bool>,
}

impl Commit {
    /// Resolves once the change is acknowledged: durable, and with S3 durability also in
    /// S3, which it waits for at most the configured bound ([`StorageError::NotInS3`]).
    pub async fn durable(self) -> Result<(), StorageError> {
        let bound = match &self.inner.cfg.s3_wal {
            Some(s3) if !s3.ack_before_s3 => s3.ack_timeout,
            _ => return self.acknowledged().await,
        };
        match monoio::time::timeout(bound, self.acknowledged()).await {
            Ok(result) => result,
            Err(_) => Err(StorageError::NotInS3 {
                waited_ms: bound.as_millis() as u64,
            }),
        }
    }

    async fn acknowledged(&self) -> Result<(), StorageError> {
        poll_fn(|cx| {
            let polled = self.inner.group_commit.borrow_mut().poll(
                self.ticket,
                self.registered.get(),
                cx.waker(),
            );
            self.registered.set(polled.is_pending());
            polled.map_err(StorageError::from)
        })
        .await
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        // A wait abandoned before its LSN was durable gives its waker slot back.
        if self.registered.get() {
            if let Ok(mut group_commit) = self.inner.group_commit.try_borrow_mut() {
                group_commit.forget(self.ticket);
            }
        }
    }
}
