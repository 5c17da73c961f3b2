//! `--durability s3`: the shard's S3 write-ahead log. A change is acknowledged only once
//! the log bytes holding it are durable on the local disk and in S3.
//!
//! Each group commit's batches, once durable locally, are copied into the **gather**: the
//! log ranges of the next WAL object. With no PUT in flight the gather is PUT at once, or
//! after [`S3WalSettings::hold`] (create-only, through the cold tier's thread, see
//! [`crate::wal`]); while one is in
//! flight it keeps gathering, so group commit stretches over the PUT latency, until the
//! PUT ends, or the gather holds [`S3WalSettings::object_bytes`], or its oldest change has
//! waited [`S3WalSettings::linger`]; then it is PUT beside the others (up to
//! [`S3WalSettings::max_in_flight`]). PUTs may complete in any order; changes are
//! acknowledged in log order, through the last object whose predecessors have all
//! completed, which is exactly what a restore finds: it applies the objects in order and
//! stops at the first missing one.
//!
//! **Visibility follows acknowledgement.** A stream's new tail becomes readable when its
//! change is acknowledged, not when it is durable locally: a reader must never see bytes
//! a host loss could take back and a new owner then fill differently.
//!
//! **What the local log holds beyond S3 at open.** After a crash, the local log may end
//! past the last WAL object (changes durable locally whose PUT never completed; none was
//! acknowledged). Recovery keeps them unreadable (each stream they changed is readable up
//! to S3's end only), and before anything newer is acknowledged the archive must cover
//! them: the shard publishes its durable end to the archiver at once and holds
//! acknowledgements until the committed manifest reaches it (the archive gate); when it
//! opens, they become readable. This epoch's WAL objects continue right after that end.
//!
//! An idle shard PUTs nothing. A fence (another server took the shard over) fails the
//! shard for good: it acknowledges nothing more.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::cold::{ColdStore, WalRefused};
use crate::error::{ShardFailure, StorageError, Unrecoverable};
use crate::position::{Lsn, Offset, SegmentNo};
use crate::segment::DATA_START;
use crate::stream::StreamId;
use crate::wal::{WalObject, WalPiece};

use super::writer::Batch;
use super::Shard;

/// How a shard ships its log to S3 with `--durability s3`.
#[derive(Clone, Debug)]
pub struct S3WalSettings {
    /// While a PUT is in flight, the gather is PUT beside it once it holds this many bytes
    /// (the size cap of the stretched group commit).
    pub object_bytes: usize,
    /// While a PUT is in flight, the gather is PUT beside it once its oldest change has
    /// waited this long (the time cap).
    pub linger: Duration,
    /// With no PUT in flight, the gather still waits this long for more changes (unless
    /// it reaches `object_bytes`): what bounds a trickle of appends to one PUT per `hold`
    /// per shard, trading latency for request cost. Zero: PUT at once.
    pub hold: Duration,
    /// PUTs in flight at once per shard.
    pub max_in_flight: usize,
    /// Longest a write waits for S3 before it is answered "not acknowledged, retry".
    pub ack_timeout: Duration,
    /// Fault injection for tests: acknowledge once durable locally, before S3 has the
    /// change (the WAL objects are still PUT). What a test of the guarantee must catch.
    pub ack_before_s3: bool,
}

impl Default for S3WalSettings {
    fn default() -> Self {
        S3WalSettings {
            object_bytes: 4 << 20,
            linger: Duration::from_millis(100),
            hold: Duration::ZERO,
            max_in_flight: 4,
            ack_timeout: Duration::from_secs(5),
            ack_before_s3: false,
        }
    }
}

/// What the S3 WAL counts, for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct S3WalStats {
    /// WAL objects PUT (completed), their log bytes, and the group commits they held.
    pub objects: u64,
    pub bytes: u64,
    pub commits: u64,
    /// WAL objects gathering or in flight now.
    pub pending_objects: u64,
    /// Log bytes gathered or in flight now: what a host loss would lose unacknowledged.
    pub pending_bytes: u64,
    /// Commit waiters whose change is durable locally and waits for S3 now.
    pub waiting_acks: u64,
    /// Completed PUTs by duration, per [`PUT_SECONDS_BUCKETS`] (not cumulative; the last
    /// slot counts the slower ones), and their summed duration.
    pub put_buckets: [u64; PUT_SECONDS_BUCKETS.len() + 1],
    pub put_nanos: u64,
    /// WAL objects by log bytes, per [`super::COMMIT_BYTES_BUCKETS`] (not cumulative).
    pub object_bytes_buckets: [u64; super::COMMIT_BYTES_BUCKETS.len() + 1],
}

/// Upper bounds of the WAL PUT duration histogram, in seconds.
pub const PUT_SECONDS_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How often a closed archive gate looks at the committed manifest again.
const GATE_POLL: Duration = Duration::from_millis(50);

/// The S3 WAL of one shard (see the module comment).
pub(super) struct S3Wal {
    store: Arc<dyn ColdStore>,
    settings: S3WalSettings,
    gather: Gather,
    in_flight: VecDeque<InFlight>,
    next_put: u64,
    /// Changes through this LSN are in S3: this epoch's objects, contiguous, on top of
    /// what the local log held at open.
    in_s3: Lsn,
    /// The local log's durable end at open, while the archive does not reach it yet.
    gate: Option<Lsn>,
    /// Streams made readable once the change (by LSN) is acknowledged, in LSN order.
    hidden: VecDeque<(Lsn, StreamId, Offset, bool)>,
    /// Streams whose recovered tails (past S3's end at open) are made readable once the
    /// archive gate opens.
    hidden_until_gate: Vec<(StreamId, Offset, bool)>,
    refused: Option<WalRefused>,
    /// The shipping task, while it waits.
    task: Option<Waker>,
    stats: S3WalStats,
}

#[derive(Default)]
struct Gather {
    pieces: Vec<WalPiece>,
    /// Bytes of the last piece not frozen into `pieces` yet (appended to by each commit).
    open: Vec<u8>,
    open_piece: Option<(SegmentNo, u64, u64, Option<Lsn>)>,
    first_lsn: Lsn,
    last_lsn: Lsn,
    end: (SegmentNo, u64),
    bytes: usize,
    commits: u64,
    since: Option<Instant>,
}

struct InFlight {
    id: u64,
    last_lsn: Lsn,
    bytes: u64,
    commits: u64,
    started: Instant,
    done: Option<Result<(), WalRefused>>,
}

impl S3Wal {
    /// The WAL of a shard whose recovered log is durable through `local`, with S3 holding
    /// it through `s3` when this server took it over.
    pub(super) fn open(
        store: Arc<dyn ColdStore>,
        settings: S3WalSettings,
        local: Lsn,
        s3: Lsn,
    ) -> Result<S3Wal, StorageError> {
        if s3 > local {
            return Err(Unrecoverable::BehindS3 {
                s3_lsn: s3.get(),
                local_lsn: local.get(),
            }
            .into());
        }
        Ok(S3Wal {
            store,
            settings,
            gather: Gather::default(),
            in_flight: VecDeque::new(),
            next_put: 0,
            in_s3: local,
            gate: (local > s3).then_some(local),
            hidden: VecDeque::new(),
            hidden_until_gate: Vec::new(),
            refused: None,
            task: None,
            stats: S3WalStats::default(),
        })
    }

    /// The LSN through which changes may be acknowledged.
    fn acknowledged(&self) -> Lsn {
        match self.gate {
            // Nothing newer than the recovered log until the archive covers it.
            Some(gate) => gate.min(self.in_s3),
            None => self.in_s3,
        }
    }

    /// Bytes not in S3 yet (gathered or in flight): what the write budget also bounds.
    pub(super) fn pending_bytes(&self) -> u64 {
        self.gather.bytes as u64 + self.in_flight.iter().map(|p| p.bytes).sum::<u64>()
    }

    pub(super) fn stats(&self) -> S3WalStats {
        let mut s = self.stats;
        s.pending_objects = self.in_flight.len() as u64 + u64::from(self.gather.bytes > 0);
        s.pending_bytes = self.pending_bytes();
        s
    }

    /// Copy one locally durable batch into the gather. `segment_bytes` is the size its
    /// segment file was created with.
    pub(super) fn gather(&mut self, batch: &Batch, data: &[u8], segment_bytes: u64) {
        let (Some(first), Some(last)) = (batch.effects.first(), batch.effects.last()) else {
            return;
        };
        let g = &mut self.gather;
        if g.bytes == 0 && g.open.is_empty() {
            g.first_lsn = first.lsn;
            g.since = Some(Instant::now());
        }
        debug_assert!(
            g.last_lsn.is_none() || first.lsn == g.last_lsn.next(),
            "batches reach the WAL in log order"
        );
        g.last_lsn = last.lsn;
        let end = batch.base + data.len() as u64;
        g.end = (batch.seg, end);
        // A batch starts at the block holding the previous one's end and repeats its bytes
        // there: continue the open piece from its end.
        let have = match g.open_piece {
            Some((seg, start, _, _)) if seg == batch.seg => Some(start + g.open.len() as u64),
            _ => None,
        };
        let added = match have {
            Some(have) if have >= batch.base => {
                let fresh = data.get((have - batch.base) as usize..).unwrap_or_default();
                g.open.extend_from_slice(fresh);
                fresh.len()
            }
            _ => {
                g.freeze_open();
                let segment_first = (batch.base == DATA_START).then_some(batch.first_lsn);
                g.open_piece = Some((batch.seg, batch.base, segment_bytes, segment_first));
                g.open.extend_from_slice(data);
                data.len()
            }
        };
        g.bytes += added;
        g.commits += 1;
    }

    /// Whether a PUT should start now; otherwise when the linger runs out.
    fn put_due(&self, now: Instant) -> (bool, Option<Instant>) {
        if self.gather.bytes == 0
            || self.refused.is_some()
            || self.in_flight.len() >= self.settings.max_in_flight
        {
            return (false, None);
        }
        if self.gather.bytes >= self.settings.object_bytes {
            return (true, None);
        }
        let wait = if self.in_flight.is_empty() {
            self.settings.hold
        } else {
            self.settings.linger
        };
        let deadline = self.gather.since.map(|t| t + wait);
        (deadline.is_none_or(|d| d <= now), deadline)
    }

    /// Close the gather into the next WAL object and note it in flight.
    fn take_object(&mut self, shard: u32) -> (u64, WalObject) {
        let mut g = std::mem::take(&mut self.gather);
        g.freeze_open();
        let id = self.next_put;
        self.next_put += 1;
        self.in_flight.push_back(InFlight {
            id,
            last_lsn: g.last_lsn,
            bytes: g.bytes as u64,
            commits: g.commits,
            started: Instant::now(),
            done: None,
        });
        let object = WalObject {
            shard,
            first_lsn: g.first_lsn,
            last_lsn: g.last_lsn,
            end: g.end,
            pieces: g.pieces,
        };
        (id, object)
    }

    /// PUT `id` ended. Moves the S3 end over every completed PUT at the front.
    fn put_done(&mut self, id: u64, result: Result<(), WalRefused>) {
        if let Some(p) = self.in_flight.iter_mut().find(|p| p.id == id) {
            p.done = Some(result);
        }
        while let Some(front) = self.in_flight.front() {
            match &front.done {
                None => break,
                Some(Err(why)) => {
                    self.refused.get_or_insert_with(|| why.clone());
                    break;
                }
                Some(Ok(())) => {
                    let took = front.started.elapsed();
                    let s = &mut self.stats;
                    s.objects += 1;
                    s.bytes += front.bytes;
                    s.commits += front.commits;
                    s.put_nanos += took.as_nanos() as u64;
                    let secs = took.as_secs_f64();
                    let slot = super::bucket_slot(&PUT_SECONDS_BUCKETS, secs);
                    s.put_buckets[slot] += 1;
                    let slot = super::bucket_slot(&super::COMMIT_BYTES_BUCKETS, front.bytes);
                    s.object_bytes_buckets[slot] += 1;
                    self.in_s3 = self.in_s3.max(front.last_lsn);
                    self.in_flight.pop_front();
                }
            }
        }
    }

    /// The streams whose changes are acknowledged now, to make readable.
    fn newly_visible(&mut self) -> Vec<(StreamId, Offset, bool)> {
        let through = self.acknowledged();
        let mut out = Vec::new();
        if self.gate.is_none() {
            out.append(&mut self.hidden_until_gate);
        }
        while self.hidden.front().is_some_and(|h| h.0 <= through) {
            if let Some((_, id, tail, closed)) = self.hidden.pop_front() {
                out.push((id, tail, closed));
            }
        }
        out
    }

    pub(super) fn wake_task(&mut self) {
        if let Some(w) = self.task.take() {
            w.wake();
        }
    }
}

impl Gather {
    fn freeze_open(&mut self) {
        if let Some((segment, start, file_len, segment_first_lsn)) = self.open_piece.take() {
            self.pieces.push(WalPiece {
                segment,
                start,
                file_len,
                segment_first_lsn,
                bytes: bytes::Bytes::from(std::mem::take(&mut self.open)),
            });
        }
    }
}

impl Shard {
    pub(super) fn s3_wal(&self) -> Option<&std::cell::RefCell<S3Wal>> {
        self.inner.s3_wal.get()
    }

    /// Whether a stream's new tail waits for S3 (S3 durability, not broken on purpose).
    pub(super) fn visible_after_s3(&self) -> bool {
        self.s3_wal().is_some() && !self.acks_before_s3()
    }

    fn acks_before_s3(&self) -> bool {
        self.inner
            .cfg
            .s3_wal
            .as_ref()
            .is_some_and(|s| s.ack_before_s3)
    }

    /// The S3 WAL's counters, with S3 durability.
    pub fn s3_wal_stats(&self) -> Option<S3WalStats> {
        let wal = self.s3_wal()?;
        let mut stats = wal.borrow().stats();
        stats.waiting_acks = self.inner.group_commit.borrow().waiting_for_s3() as u64;
        Some(stats)
    }

    /// After recovery: start the S3 WAL if the shard acknowledges after S3. `unacked`: the
    /// streams recovery left readable only up to S3's end, with their recovered ends.
    pub(super) fn open_s3_wal(
        &self,
        unacked: Vec<(StreamId, Offset, bool)>,
    ) -> Result<(), StorageError> {
        let (Some(settings), Some(store)) = (&self.inner.cfg.s3_wal, &self.inner.cfg.cold) else {
            return Ok(());
        };
        let shard = self.inner.cfg.shard;
        let local = self.durable_lsn();
        let s3 = store.s3_end(shard).map_or(Lsn::NONE, |e| e.lsn);
        let mut wal = S3Wal::open(store.clone(), settings.clone(), local, s3)?;
        // Readable once the gate opens, as a new change is once S3 has it.
        wal.hidden_until_gate = unacked;
        if let Some(gate) = wal.gate {
            tracing::info!(
                shard,
                local_lsn = gate.get(),
                s3_lsn = s3.get(),
                "the local log holds changes S3 does not; acknowledging nothing newer until \
                 the archive covers them"
            );
            // So the archiver's next round covers them, without waiting for upkeep.
            store.durable(shard, self.durable_end());
        }
        if !settings.ack_before_s3 {
            self.inner
                .group_commit
                .borrow_mut()
                .acknowledged_through(wal.acknowledged());
        }
        // `Inner` is built before recovery; the WAL needs what recovery found.
        if self.inner.s3_wal.set(std::cell::RefCell::new(wal)).is_err() {
            return Err(StorageError::Internal("the S3 WAL opened twice"));
        }
        let shipper = self.clone();
        monoio::spawn(async move { shipper.run_s3_wal().await });
        Ok(())
    }

    /// Group commit made `batches` durable locally: gather them for S3, and keep their
    /// streams' new tails hidden until S3 has them.
    pub(super) fn ship_to_s3(&self, batches: &[Batch]) {
        let Some(wal) = self.s3_wal() else { return };
        let segment_bytes = self.segment_bytes();
        let mut wal = wal.borrow_mut();
        for batch in batches {
            if let Some(buf) = &batch.buf {
                wal.gather(batch, buf.as_slice(), segment_bytes);
            }
            if self.visible_after_s3() {
                for e in &batch.effects {
                    if let Some((id, tail, closed)) = e.visible {
                        wal.hidden.push_back((e.lsn, id, tail, closed));
                    }
                }
            }
        }
        self.inner
            .group_commit
            .borrow_mut()
            .set_s3_pending(wal.pending_bytes());
        wal.wake_task();
    }

    /// The shipping task: start each PUT when it is due, until the shard stops or is
    /// fenced.
    async fn run_s3_wal(self) {
        let Some(wal) = self.s3_wal() else { return };
        loop {
            if self.inner.stopping.get() || wal.borrow().refused.is_some() {
                return;
            }
            if wal.borrow().gate.is_some() {
                self.check_gate();
            }
            let (due, deadline) = wal.borrow().put_due(Instant::now());
            if due {
                self.start_put();
                continue;
            }
            let gate_closed = wal.borrow().gate.is_some();
            // Ends at the next wake (a commit gathered, a PUT ended, the shard stops): the
            // loop then looks at everything again.
            let mut waited = false;
            let woken = poll_fn(|cx| {
                if waited || self.inner.stopping.get() {
                    return Poll::Ready(());
                }
                waited = true;
                wal.borrow_mut().task = Some(cx.waker().clone());
                Poll::Pending
            });
            let nap = match (deadline, gate_closed) {
                (_, true) => Some(GATE_POLL),
                (Some(d), false) => Some(d.saturating_duration_since(Instant::now())),
                (None, false) => None,
            };
            match nap {
                Some(nap) => {
                    monoio::select! {
                        () = monoio::time::sleep(nap) => {}
                        () = woken => {}
                    }
                }
                None => woken.await,
            }
            wal.borrow_mut().task = None;
        }
    }

    fn start_put(&self) {
        let Some(wal) = self.s3_wal() else { return };
        let shard = self.inner.cfg.shard;
        let (id, put) = {
            let mut wal = wal.borrow_mut();
            let (id, object) = wal.take_object(shard);
            (id, wal.store.put_wal(shard, object))
        };
        let this = self.clone();
        monoio::spawn(async move {
            let result = put.await;
            this.s3_put_done(id, result);
        });
    }

    fn s3_put_done(&self, id: u64, result: Result<(), WalRefused>) {
        let Some(wal) = self.s3_wal() else { return };
        wal.borrow_mut().put_done(id, result);
        self.acknowledge_from_s3();
        let refused = wal.borrow().refused.clone();
        if let Some(why) = refused {
            self.fence(&why);
        }
        wal.borrow_mut().wake_task();
    }

    /// Open the archive gate once the committed manifest covers the recovered log.
    fn check_gate(&self) {
        let Some(wal) = self.s3_wal() else { return };
        let opened = {
            let mut w = wal.borrow_mut();
            match w.gate {
                Some(gate) if w.store.archived_lsn(self.inner.cfg.shard) >= gate => {
                    w.gate = None;
                    true
                }
                _ => false,
            }
        };
        if opened {
            tracing::info!(
                shard = self.inner.cfg.shard,
                "the archive covers the recovered log; acknowledging after S3"
            );
            self.acknowledge_from_s3();
        }
    }

    /// Tell group commit how far S3 has the log, and make the streams it covers readable.
    fn acknowledge_from_s3(&self) {
        let Some(wal) = self.s3_wal() else { return };
        let (through, visible, pending) = {
            let mut w = wal.borrow_mut();
            let visible = w.newly_visible();
            (w.acknowledged(), visible, w.pending_bytes())
        };
        {
            let mut group_commit = self.inner.group_commit.borrow_mut();
            group_commit.set_s3_pending(pending);
            if !self.acks_before_s3() {
                group_commit.acknowledged_through(through);
            }
        }
        for (id, tail, closed) in visible {
            self.make_visible(id, tail, closed);
        }
    }

    /// Another server owns the shard now: refuse every write and release every waiter.
    fn fence(&self, why: &WalRefused) {
        let mut group_commit = self.inner.group_commit.borrow_mut();
        if group_commit.failure().is_some() {
            return;
        }
        tracing::error!(
            shard = self.inner.cfg.shard,
            "S3 write-ahead log refused: {why}; acknowledging nothing more"
        );
        group_commit.fail(ShardFailure::Fenced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cold::ColdRead;
    use crate::shard::writer::Effect;

    /// Never asked anything: the policy below does no I/O.
    #[derive(Debug)]
    struct NoStore;

    impl ColdStore for NoStore {
        fn is_archived(&self, _: u32, _: SegmentNo) -> bool {
            false
        }

        fn read(&self, _: u32, _: SegmentNo, _: u64, _: usize) -> ColdRead {
            Box::pin(async { Err(std::io::Error::other("no store")) })
        }
    }

    fn settings() -> S3WalSettings {
        S3WalSettings {
            object_bytes: 1000,
            linger: Duration::from_millis(100),
            hold: Duration::ZERO,
            max_in_flight: 2,
            ack_timeout: Duration::from_secs(1),
            ack_before_s3: false,
        }
    }

    fn wal(local: u64, s3: u64) -> S3Wal {
        S3Wal::open(Arc::new(NoStore), settings(), Lsn::new(local), Lsn::new(s3)).expect("opens")
    }

    fn batch(seg: u64, base: u64, lsns: std::ops::RangeInclusive<u64>) -> Batch {
        Batch {
            seg: SegmentNo::new(seg),
            base,
            buf: None,
            first_lsn: Lsn::new(*lsns.start()),
            effects: lsns
                .map(|l| Effect {
                    lsn: Lsn::new(l),
                    visible: None,
                })
                .collect(),
        }
    }

    #[test]
    fn commits_that_share_a_block_make_one_piece_and_a_roll_starts_another() {
        let mut w = wal(0, 0);
        let first: Vec<u8> = (0..100u8).collect();
        w.gather(&batch(1, 8192, 1..=2), &first, 1 << 20);
        // The next commit rewrites the partial block it shares with the first.
        let mut second = first.clone();
        second.extend(100..250u8);
        w.gather(&batch(1, 8192, 3..=3), &second, 1 << 20);
        w.gather(&batch(2, DATA_START, 4..=5), &[9; 50], 1 << 20);
        assert_eq!(w.pending_bytes(), 300);
        let (_, o) = w.take_object(0);
        assert_eq!((o.first_lsn, o.last_lsn), (Lsn::new(1), Lsn::new(5)));
        assert_eq!(o.end, (SegmentNo::new(2), DATA_START + 50));
        assert_eq!(o.pieces.len(), 2);
        assert_eq!(o.pieces[0].start, 8192);
        assert_eq!(o.pieces[0].bytes.as_ref(), &second[..]);
        assert_eq!(o.pieces[0].segment_first_lsn, None);
        assert_eq!(o.pieces[1].segment_first_lsn, Some(Lsn::new(4)));
        assert_eq!(o.pieces[1].file_len, 1 << 20);
    }

    #[test]
    fn a_put_starts_at_once_when_none_is_in_flight_else_at_a_cap() {
        let mut w = wal(0, 0);
        let now = Instant::now();
        assert_eq!(w.put_due(now), (false, None), "nothing gathered");
        w.gather(&batch(1, DATA_START, 1..=1), &[1; 10], 1 << 20);
        assert!(w.put_due(Instant::now()).0, "no PUT in flight: at once");
        w.take_object(0);
        w.gather(&batch(1, DATA_START, 2..=2), &[1; 20], 1 << 20);
        let (due, deadline) = w.put_due(Instant::now());
        assert!(!due, "one in flight: gather more");
        let deadline = deadline.expect("the time cap");
        assert!(w.put_due(deadline).0, "the time cap reached");
        w.gather(&batch(1, DATA_START, 3..=3), &[1; 2000], 1 << 20);
        assert!(w.put_due(Instant::now()).0, "the size cap reached");
        w.take_object(0);
        w.gather(&batch(1, 8192, 4..=4), &[1; 2000], 1 << 20);
        assert!(!w.put_due(Instant::now()).0, "at most two in flight");
    }

    #[test]
    fn s3_acknowledges_in_log_order_whatever_order_puts_end_in() {
        let mut w = wal(0, 0);
        w.gather(&batch(1, DATA_START, 1..=3), &[1; 10], 1 << 20);
        let (a, _) = w.take_object(0);
        w.gather(&batch(1, DATA_START, 4..=6), &[1; 20], 1 << 20);
        let (b, _) = w.take_object(0);
        w.put_done(b, Ok(()));
        assert_eq!(w.acknowledged(), Lsn::NONE, "the earlier PUT is still out");
        w.put_done(a, Ok(()));
        assert_eq!(w.acknowledged(), Lsn::new(6));
        assert_eq!(w.stats().objects, 2);
        assert_eq!(w.pending_bytes(), 0);
    }

    #[test]
    fn a_fenced_put_acknowledges_nothing_after_it() {
        let mut w = wal(0, 0);
        w.gather(&batch(1, DATA_START, 1..=3), &[1; 10], 1 << 20);
        let (a, _) = w.take_object(0);
        w.gather(&batch(1, DATA_START, 4..=6), &[1; 20], 1 << 20);
        let (b, _) = w.take_object(0);
        w.put_done(b, Ok(()));
        w.put_done(a, Err(WalRefused::Fenced("taken over".into())));
        assert_eq!(w.acknowledged(), Lsn::NONE);
        assert!(w.refused.is_some());
        assert!(!w.put_due(Instant::now()).0, "a fenced WAL starts no PUT");
    }

    #[test]
    fn what_the_local_log_holds_beyond_s3_waits_for_the_archive() {
        let mut w = wal(10, 7);
        assert_eq!(w.gate, Some(Lsn::new(10)));
        w.gather(&batch(1, DATA_START, 11..=12), &[1; 10], 1 << 20);
        let (a, _) = w.take_object(0);
        w.put_done(a, Ok(()));
        assert_eq!(
            w.acknowledged(),
            Lsn::new(10),
            "held until the archive covers 10"
        );
        w.gate = None;
        assert_eq!(w.acknowledged(), Lsn::new(12));
        assert!(S3Wal::open(Arc::new(NoStore), settings(), Lsn::new(5), Lsn::new(6)).is_err());
    }
}
