//! The group-commit ledger of one shard: which LSNs are handed out, which are durable, how
//! many bytes wait for the flusher, whether the log has failed, and who waits for what.
//!
//! It does no I/O. The shard's flusher writes batches and reports each durable LSN here;
//! a writer's [`super::Commit`] polls here. Each waiter is kept with the LSN it waits for,
//! so a flush wakes exactly the waiters it made durable, not every waiter of the shard.
//! They sit in a flat list rather than an ordered map: a flush usually covers nearly all of
//! them, and a list costs no allocation per waiter (an ordered map measured about 5% more
//! CPU per append at 1,000 writers).
//!
//! With S3 durability a change is acknowledged once it is durable locally and in S3: the
//! shard's S3 WAL reports how far that is ([`GroupCommit::acknowledged_through`]), and
//! waiters wait for the acknowledged LSN rather than the durable one.
//!
//! Invariants (asserted):
//! - `durable_lsn < next_lsn`: nothing is durable that was not handed out;
//! - the durable and acknowledged LSNs only move forward, and nothing is acknowledged that
//!   is not durable;
//! - every waiter waits for an LSN above the acknowledged one while the log has not failed.

use std::task::{Poll, Waker};

use crate::position::{Lsn, SegmentNo};

/// Why the log refuses writes (kept until restart).
pub(super) type Failure = crate::error::ShardFailure;

#[derive(Debug)]
pub(super) struct GroupCommit {
    next_lsn: Lsn,
    durable_lsn: Lsn,
    /// Segment and position after the last durable record (what `durable_lsn` names).
    durable_end: (SegmentNo, u64),
    /// Framed bytes queued since the flusher last took the batches, and those it is
    /// writing now: what the shard's write budget bounds.
    queued_bytes: u64,
    flushing_bytes: u64,
    failure: Option<Failure>,
    /// With S3 durability: the LSN through which changes are also in S3 (`None`: local
    /// durability, where durable means acknowledged).
    in_s3: Option<Lsn>,
    /// With S3 durability: durable bytes not yet in S3, which the write budget bounds too.
    s3_pending_bytes: u64,
    /// Registered waits: (ticket, waker), each for an LSN above the acknowledged one.
    waiters: Vec<(Ticket, Waker)>,
    next_ticket: u64,
}

/// A handle for one wait on a commit: the LSN waited for and an id unique in the shard
/// (several commits may wait for one LSN). The same ticket keeps one waker slot however
/// often the wait is polled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ticket {
    lsn: Lsn,
    id: u64,
}

impl GroupCommit {
    /// An empty log: the first record gets [`Lsn::FIRST`].
    pub(super) fn new(log_start: (SegmentNo, u64)) -> GroupCommit {
        GroupCommit {
            next_lsn: Lsn::FIRST,
            durable_lsn: Lsn::NONE,
            durable_end: log_start,
            queued_bytes: 0,
            flushing_bytes: 0,
            failure: None,
            in_s3: None,
            s3_pending_bytes: 0,
            waiters: Vec::new(),
            next_ticket: 0,
        }
    }

    /// Continue a recovered log: everything before `next_lsn` is durable and ends at
    /// `durable_end`.
    pub(super) fn resume(&mut self, next_lsn: Lsn, durable_end: (SegmentNo, u64)) {
        assert!(
            self.waiters.is_empty() && self.unflushed_bytes() == 0,
            "a log resumes before anything is written"
        );
        self.next_lsn = next_lsn;
        self.durable_lsn = next_lsn.prev();
        self.durable_end = durable_end;
    }

    /// The last LSN handed out (`NONE` before the first record).
    pub(super) fn last_lsn(&self) -> Lsn {
        self.next_lsn.prev()
    }

    pub(super) fn durable_lsn(&self) -> Lsn {
        self.durable_lsn
    }

    /// The LSN through which changes are acknowledged: durable, and with S3 durability
    /// also in S3.
    pub(super) fn acknowledged_lsn(&self) -> Lsn {
        match self.in_s3 {
            Some(s3) => s3.min(self.durable_lsn),
            None => self.durable_lsn,
        }
    }

    /// With S3 durability: changes through `lsn` are in S3 (acknowledged once durable).
    /// Wakes the waiters this acknowledges.
    pub(super) fn acknowledged_through(&mut self, lsn: Lsn) {
        assert!(
            self.in_s3.is_none_or(|s3| lsn >= s3),
            "the S3 end went back from {:?} to {lsn}",
            self.in_s3
        );
        self.in_s3 = Some(lsn);
        self.wake_durable();
    }

    /// Commit waiters whose change is durable and waits only for S3.
    pub(super) fn waiting_for_s3(&self) -> usize {
        if self.in_s3.is_none() {
            return 0;
        }
        let durable = self.durable_lsn;
        self.waiters
            .iter()
            .filter(|(t, _)| t.lsn <= durable)
            .count()
    }

    pub(super) fn durable_end(&self) -> (SegmentNo, u64) {
        self.durable_end
    }

    pub(super) fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// Heap bytes of the commit waiters.
    pub(super) fn heap_bytes(&self) -> usize {
        self.waiters.capacity() * std::mem::size_of::<(Ticket, Waker)>()
    }

    /// Framed bytes accepted but not yet durable.
    pub(super) fn unflushed_bytes(&self) -> u64 {
        self.queued_bytes + self.flushing_bytes
    }

    /// With S3 durability: `bytes` are durable locally and not in S3 yet.
    pub(super) fn set_s3_pending(&mut self, bytes: u64) {
        self.s3_pending_bytes = bytes;
    }

    /// Whether `len` more bytes fit under `budget`, counting those not in S3 yet with S3
    /// durability. An empty queue admits any size, so a record larger than the budget
    /// still makes progress.
    pub(super) fn admits(&self, len: u64, budget: u64) -> bool {
        let unflushed = self.unflushed_bytes() + self.s3_pending_bytes;
        unflushed == 0 || unflushed + len <= budget
    }

    /// The LSN the next record gets, or the failure once the log has failed.
    pub(super) fn next_lsn(&self) -> Result<Lsn, &Failure> {
        match &self.failure {
            Some(why) => Err(why),
            None => Ok(self.next_lsn),
        }
    }

    /// The record given [`Self::next_lsn`] was queued: that LSN is handed out.
    pub(super) fn assigned(&mut self, lsn: Lsn) {
        assert_eq!(lsn, self.next_lsn, "LSNs are handed out in order");
        self.next_lsn = lsn.next();
    }

    /// Count `bytes` queued for the next flush.
    pub(super) fn queued(&mut self, bytes: u64) {
        self.queued_bytes += bytes;
    }

    /// The flusher took every queued batch and is writing it.
    pub(super) fn flush_started(&mut self) {
        self.flushing_bytes = std::mem::take(&mut self.queued_bytes);
    }

    /// The flusher's write ended (successfully or not).
    pub(super) fn flush_ended(&mut self) {
        self.flushing_bytes = 0;
    }

    /// Record `lsn` as durable. Batches complete in log order, so it must be above the
    /// durable LSN and at most the last one handed out.
    pub(super) fn made_durable(&mut self, lsn: Lsn) {
        assert!(
            lsn > self.durable_lsn && lsn < self.next_lsn,
            "durable LSN went from {} to {} (last handed out {})",
            self.durable_lsn,
            lsn,
            self.last_lsn()
        );
        self.durable_lsn = lsn;
    }

    pub(super) fn set_durable_end(&mut self, end: (SegmentNo, u64)) {
        self.durable_end = end;
    }

    /// Refuse every later write and release every waiter with the failure.
    pub(super) fn fail(&mut self, why: Failure) {
        self.failure = Some(why);
        for (_, waker) in self.waiters.drain(..) {
            waker.wake();
        }
    }

    /// Wake the waiters whose LSN is acknowledged now, and only them.
    pub(super) fn wake_durable(&mut self) {
        let durable = self.acknowledged_lsn();
        self.waiters.retain(|(ticket, waker)| {
            let covered = ticket.lsn <= durable;
            if covered {
                waker.wake_by_ref();
            }
            !covered
        });
    }

    /// A new wait for `lsn` to become durable.
    pub(super) fn ticket(&mut self, lsn: Lsn) -> Ticket {
        let id = self.next_ticket;
        self.next_ticket += 1;
        Ticket { lsn, id }
    }

    /// Ready once the ticket's LSN is durable, or with the failure once the log failed;
    /// otherwise `waker` is registered in the ticket's slot. `registered` says whether an
    /// earlier poll of this ticket returned pending (its slot may still be there); the
    /// caller keeps it, so the common first poll needs no search.
    pub(super) fn poll(
        &mut self,
        ticket: Ticket,
        registered: bool,
        waker: &Waker,
    ) -> Poll<Result<(), Failure>> {
        if self.acknowledged_lsn() >= ticket.lsn {
            if registered {
                self.forget(ticket);
            }
            return Poll::Ready(Ok(()));
        }
        if let Some(why) = &self.failure {
            return Poll::Ready(Err(*why));
        }
        let slot = if registered {
            self.waiters.iter_mut().find(|(t, _)| *t == ticket)
        } else {
            None
        };
        match slot {
            Some((_, w)) if w.will_wake(waker) => {}
            Some((_, w)) => w.clone_from(waker),
            None => self.waiters.push((ticket, waker.clone())),
        }
        Poll::Pending
    }

    /// Give back a ticket's slot (a wait dropped before it resolved).
    pub(super) fn forget(&mut self, ticket: Ticket) {
        self.waiters.retain(|(t, _)| *t != ticket);
    }

    /// Waiters registered now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.waiters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn wakes(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    fn start() -> (SegmentNo, u64) {
        (SegmentNo::new(1), 4096)
    }

    fn assign_n(g: &mut GroupCommit, n: usize) -> Vec<Lsn> {
        (0..n)
            .map(|_| {
                let lsn = g.next_lsn().expect("open log");
                g.assigned(lsn);
                lsn
            })
            .collect()
    }

    #[test]
    fn lsns_are_handed_out_in_order_from_first() {
        let mut g = GroupCommit::new(start());
        assert_eq!(g.last_lsn(), Lsn::NONE);
        let lsns = assign_n(&mut g, 3);
        assert_eq!(lsns[0], Lsn::FIRST);
        assert!(lsns.windows(2).all(|w| w[1] == w[0].next()));
        assert_eq!(g.last_lsn(), lsns[2]);
        assert_eq!(g.durable_lsn(), Lsn::NONE);
    }

    #[test]
    fn a_flush_wakes_exactly_the_waiters_it_covers() {
        let mut g = GroupCommit::new(start());
        let lsns = assign_n(&mut g, 3);
        let counts: Vec<_> = lsns
            .iter()
            .map(|&lsn| {
                let (count, waker) = counter();
                let t = g.ticket(lsn);
                assert!(g.poll(t, false, &waker).is_pending());
                (count, t)
            })
            .collect();
        g.made_durable(lsns[0]);
        g.made_durable(lsns[1]);
        g.wake_durable();
        assert_eq!(wakes(&counts[0].0), 1);
        assert_eq!(wakes(&counts[1].0), 1);
        assert_eq!(
            wakes(&counts[2].0),
            0,
            "a waiter past the flush stays asleep"
        );
        assert_eq!(g.waiting(), 1);
        let (_, w) = counter();
        assert!(g.poll(counts[0].1, false, &w).is_ready());
        assert!(g.poll(counts[2].1, true, &w).is_pending());
        assert_eq!(g.waiting(), 1, "a repoll keeps its one slot");
        g.made_durable(lsns[2]);
        g.wake_durable();
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn repolling_keeps_one_slot_per_ticket() {
        let mut g = GroupCommit::new(start());
        let lsn = assign_n(&mut g, 1)[0];
        let t = g.ticket(lsn);
        let (first, w1) = counter();
        let (second, w2) = counter();
        assert!(g.poll(t, false, &w1).is_pending());
        for _ in 0..5 {
            assert!(g.poll(t, true, &w1).is_pending());
        }
        assert!(
            g.poll(t, true, &w2).is_pending(),
            "a new waker replaces the old one"
        );
        assert_eq!(g.waiting(), 1);
        g.made_durable(lsn);
        g.wake_durable();
        assert_eq!((wakes(&first), wakes(&second)), (0, 1));
    }

    #[test]
    fn several_waits_on_one_lsn_all_wake() {
        let mut g = GroupCommit::new(start());
        let lsn = assign_n(&mut g, 1)[0];
        let (count, waker) = counter();
        for _ in 0..3 {
            let t = g.ticket(lsn);
            assert!(g.poll(t, false, &waker).is_pending());
        }
        g.made_durable(lsn);
        g.wake_durable();
        assert_eq!(wakes(&count), 3);
    }

    #[test]
    fn a_dropped_wait_leaves_nothing_behind() {
        let mut g = GroupCommit::new(start());
        let lsn = assign_n(&mut g, 1)[0];
        let t = g.ticket(lsn);
        let (_, w) = counter();
        assert!(g.poll(t, false, &w).is_pending());
        g.forget(t);
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn a_failed_write_releases_every_waiter_and_refuses_later_writes() {
        let mut g = GroupCommit::new(start());
        let lsns = assign_n(&mut g, 2);
        g.made_durable(lsns[0]);
        let (count, waker) = counter();
        let pending = g.ticket(lsns[1]);
        assert!(g.poll(pending, false, &waker).is_pending());
        g.fail(Failure::Log(crate::error::LogFailure::os(libc::EIO)));
        assert_eq!(wakes(&count), 1);
        assert_eq!(g.waiting(), 0);
        match g.poll(pending, true, &waker) {
            Poll::Ready(Err(why)) => {
                assert_eq!(why, Failure::Log(crate::error::LogFailure::os(libc::EIO)))
            }
            other => panic!("expected the failure, got {other:?}"),
        }
        // What was durable before the failure stays acknowledged.
        let done = g.ticket(lsns[0]);
        assert!(matches!(g.poll(done, false, &waker), Poll::Ready(Ok(()))));
        assert!(g.next_lsn().is_err());
    }

    #[test]
    fn with_s3_durability_a_wait_ends_once_durable_and_in_s3() {
        let mut g = GroupCommit::new(start());
        g.acknowledged_through(Lsn::NONE);
        let lsns = assign_n(&mut g, 3);
        let (count, waker) = counter();
        let tickets: Vec<Ticket> = lsns.iter().map(|&l| g.ticket(l)).collect();
        for &t in &tickets {
            assert!(g.poll(t, false, &waker).is_pending());
        }
        g.made_durable(lsns[2]);
        g.wake_durable();
        assert_eq!(wakes(&count), 0, "durable locally only");
        assert_eq!(g.waiting_for_s3(), 3);
        g.acknowledged_through(lsns[0]);
        assert_eq!(wakes(&count), 1, "only the waiter S3 covers is woken");
        assert!(matches!(
            g.poll(tickets[0], true, &waker),
            Poll::Ready(Ok(()))
        ));
        assert!(g.poll(tickets[1], true, &waker).is_pending());
        assert_eq!(g.acknowledged_lsn(), lsns[0]);
        assert_eq!(g.waiting_for_s3(), 2);
        g.acknowledged_through(lsns[2]);
        assert_eq!(g.waiting(), 0);
        assert_eq!(g.acknowledged_lsn(), lsns[2]);
    }

    #[test]
    fn s3_never_acknowledges_past_the_local_disk() {
        let mut g = GroupCommit::new(start());
        let lsns = assign_n(&mut g, 2);
        g.made_durable(lsns[0]);
        g.acknowledged_through(lsns[1]);
        assert_eq!(g.acknowledged_lsn(), lsns[0]);
    }

    #[test]
    #[should_panic(expected = "durable LSN went from")]
    fn completions_out_of_order_are_refused() {
        let mut g = GroupCommit::new(start());
        let lsns = assign_n(&mut g, 2);
        g.made_durable(lsns[1]);
        g.made_durable(lsns[0]);
    }

    #[test]
    #[should_panic(expected = "durable LSN went from")]
    fn an_lsn_never_handed_out_cannot_be_durable() {
        let mut g = GroupCommit::new(start());
        g.made_durable(Lsn::FIRST);
    }

    #[test]
    fn the_budget_admits_one_record_of_any_size_into_an_empty_queue() {
        let mut g = GroupCommit::new(start());
        assert!(g.admits(10 << 20, 1 << 20));
        g.queued(600);
        assert!(g.admits(400, 1000));
        assert!(!g.admits(401, 1000));
        g.flush_started();
        assert_eq!(g.unflushed_bytes(), 600, "bytes being written still count");
        g.queued(100);
        assert_eq!(g.unflushed_bytes(), 700);
        g.flush_ended();
        assert_eq!(g.unflushed_bytes(), 100);
    }

    #[test]
    fn a_resumed_log_continues_after_the_recovered_records() {
        let mut g = GroupCommit::new(start());
        let end = (SegmentNo::new(3), 8192);
        g.resume(Lsn::FIRST.next().next(), end);
        assert_eq!(g.durable_lsn(), Lsn::FIRST.next());
        assert_eq!(g.durable_end(), end);
        assert_eq!(g.next_lsn().ok(), Some(Lsn::FIRST.next().next()));
    }
}
