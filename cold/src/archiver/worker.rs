//! One shard's archiving: a loop of rounds, retried with capped backoff, ending for good
//! when the shard is fenced and with one last round on a clean stop; a round's commit of
//! the manifest by compare-and-swap, and the archive lag it leaves.

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use ursula_s3::{PutMode, StoreError};
use ursula_storage::cold::DurableEnd;
use ursula_storage::segment;
use ursula_storage::SegmentNo;

use super::blobs::list_blobs;
use super::garbage::sweep_every;
use super::{Archive, FinalRound, Finish, Slot};
use crate::error::Error;
use crate::manifest::{self, End, Keys, Manifest, Object};
use crate::status::{Outcome, Request};

/// Longest one round may take (a sealed segment's upload included) before it is retried.
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a round stopped short.
pub(super) enum RoundError {
    /// Another owner has the manifest: stop archiving for good.
    Fenced(String),
    /// Try again (S3 unreachable, a file vanished under the round).
    Retry(Error),
}

impl From<Error> for RoundError {
    fn from(e: Error) -> Self {
        RoundError::Retry(e)
    }
}

/// One shard's archiving.
pub(super) struct Worker {
    pub(super) archive: Arc<Archive>,
    /// What the cores and readers see of this shard's archive.
    pub(super) slot: Arc<Slot>,
    pub(super) shard: u32,
    pub(super) dir: PathBuf,
    pub(super) keys: Keys,
    pub(super) manifest: Manifest,
    pub(super) etag: String,
    pub(super) interval: Duration,
    pub(super) grace_ms: i64,
    pub(super) last_slice: Option<Instant>,
    pub(super) last_commit: Instant,
    /// The local checkpoint file's (modification time, length) when last looked at.
    pub(super) checkpoint_seen: Option<(SystemTime, u64)>,
    /// Durable ends seen and when, oldest first, while not yet archived: the archive lag.
    pub(super) observed: VecDeque<(DurableEnd, i64)>,
    pub(super) segment_bytes: u64,
    /// When the orphan sweep last ran (never: it runs before the first round).
    pub(super) last_sweep: Option<Instant>,
    /// Leaves `Finish::Run` when the server stops cleanly or lets the lane go; the worker
    /// then runs its last round and reports it.
    pub(super) finish: tokio::sync::watch::Receiver<Finish>,
}

/// Inherited WAL objects the archived log now covers go to the garbage list.
fn drop_archived_wal(m: &mut Manifest, now: i64) {
    let archived = m.archived.lsn;
    let (keep, covered): (Vec<_>, Vec<_>) = std::mem::take(&mut m.wal)
        .into_iter()
        .partition(|w| w.last_lsn > archived);
    m.wal = keep;
    for w in covered {
        m.drop_object(w.object.key, now);
    }
}

impl Worker {
    pub(super) fn new(
        archive: Arc<Archive>,
        slot: Arc<Slot>,
        shard: u32,
        (manifest, etag): (Manifest, String),
        finish: tokio::sync::watch::Receiver<Finish>,
    ) -> Worker {
        let settings = &archive.settings;
        Worker {
            dir: archive.data_dir.join(format!("shard-{shard}")),
            slot,
            shard,
            keys: Keys::new(shard, manifest.epoch),
            manifest,
            etag,
            interval: settings.archive_interval,
            grace_ms: settings.grace.as_millis() as i64,
            last_slice: None,
            last_commit: Instant::now(),
            checkpoint_seen: None,
            observed: VecDeque::new(),
            segment_bytes: 0,
            last_sweep: None,
            finish,
            archive,
        }
    }

    pub(super) async fn run(mut self) {
        let tick = self
            .interval
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut backoff = Duration::ZERO;
        let mut failing_since: Option<Instant> = None;
        loop {
            let grace = Duration::from_millis(self.grace_ms.max(0) as u64);
            if self
                .last_sweep
                .is_none_or(|t| t.elapsed() >= sweep_every(grace))
                && *self.finish.borrow() == Finish::Run
            {
                self.last_sweep = Some(Instant::now());
                self.sweep_orphans().await;
            }
            let finishing = tokio::select! {
                () = tokio::time::sleep(tick.max(backoff)) => None,
                r = self.finish.wait_for(|f| *f != Finish::Run) => r.ok().map(|f| *f),
            };
            match finishing {
                Some(Finish::Release) => return self.release().await,
                Some(Finish::Lost) => {
                    tracing::error!(
                        shard = self.shard,
                        "cold tier archiving stopped: another server fenced this epoch's WAL"
                    );
                    self.archive.end_shard(self.shard, false);
                    return;
                }
                Some(_) => {
                    let last = self.final_round().await;
                    let _ = self.archive.done.send((self.shard, last));
                    return;
                }
                None => {}
            }
            let result = self.bounded_round().await;
            self.report_lag();
            match result {
                Ok(()) => {
                    if let Some(t) = failing_since.take() {
                        tracing::info!(
                            shard = self.shard,
                            after_ms = t.elapsed().as_millis() as u64,
                            "cold tier archiving caught up again"
                        );
                    }
                    backoff = Duration::ZERO;
                }
                Err(RoundError::Fenced(why)) => {
                    tracing::error!(shard = self.shard, "cold tier archiving stopped: {why}");
                    self.fenced(why);
                    return;
                }
                Err(RoundError::Retry(why)) => {
                    // What this round uploaded is not committed: look at it all again.
                    self.checkpoint_seen = None;
                    self.last_slice = None;
                    if failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        tracing::warn!(
                            shard = self.shard,
                            "cold tier archiving failed, retrying: {why}"
                        );
                    } else {
                        tracing::debug!(
                            shard = self.shard,
                            "cold tier archiving failed again: {why}"
                        );
                    }
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(200), Duration::from_secs(5));
                }
            }
            if self.archive.status.fenced().is_some() {
                return;
            }
        }
    }

    /// Another server took the shard over. When lanes move between servers only this
    /// shard is lost (the server stops serving it); otherwise the whole archive stops.
    fn fenced(&self, why: String) {
        if self.archive.settings.lanes_move {
            self.archive.end_shard(self.shard, true);
        } else {
            self.archive.status.fence(why);
        }
    }

    /// The lane is let go: archive up to the final durable end, commit the manifest as
    /// released, stop, and report how that went to whoever asked for the release.
    async fn release(mut self) {
        let mut last = self.final_round().await;
        if let FinalRound::Archived(_) = last {
            let mut backoff = Duration::from_millis(100);
            loop {
                let mut m = self.manifest.clone();
                m.released = true;
                m.heartbeat_ms = ursula_storage::now_ms();
                match self.commit(m).await {
                    Ok(()) => break,
                    Err(RoundError::Fenced(why)) => {
                        self.fenced(why.clone());
                        last = FinalRound::Fenced(why);
                        break;
                    }
                    Err(RoundError::Retry(why)) => {
                        tracing::warn!(shard = self.shard, "cold tier: release commit: {why}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
            tracing::info!(
                shard = self.shard,
                epoch = self.manifest.epoch,
                "lane released"
            );
        }
        // A fenced shard's end was reported by `fenced`.
        if !matches!(last, FinalRound::Fenced(_)) {
            self.archive.end_shard(self.shard, false);
        }
        let reply = self.slot.released.lock().ok().and_then(|mut r| r.take());
        if let Some(reply) = reply {
            let _ = reply.send(last);
        }
    }

    /// One round, given up after `ROUND_TIMEOUT`: aws-sdk-s3 sets no operation timeout,
    /// and a request that hangs must not stop this shard's archiving for good.
    async fn bounded_round(&mut self) -> Result<(), RoundError> {
        match tokio::time::timeout(ROUND_TIMEOUT, self.round()).await {
            Ok(r) => r,
            Err(_) => Err(RoundError::Retry(Error::Stalled {
                after: ROUND_TIMEOUT,
            })),
        }
    }

    /// The last round before a clean stop: everything up to the final durable end, the
    /// open segment's slice without waiting for the interval, retried until it commits
    /// (the server stops waiting at its deadline).
    async fn final_round(&mut self) -> FinalRound {
        let mut backoff = Duration::from_millis(100);
        loop {
            self.last_slice = None;
            self.checkpoint_seen = None;
            let result = self.bounded_round().await;
            self.report_lag();
            match result {
                Ok(()) => return FinalRound::Archived(self.manifest.archived),
                Err(RoundError::Fenced(why)) => {
                    self.fenced(why.clone());
                    return FinalRound::Fenced(why);
                }
                Err(RoundError::Retry(why)) => {
                    tracing::warn!(
                        shard = self.shard,
                        "cold tier: the last archive round failed, retrying: {why}"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    async fn round(&mut self) -> Result<(), RoundError> {
        let now = ursula_storage::now_ms();
        // Listed before the durable end is read (see the `archiver` module comment).
        let local: BTreeSet<u64> = segment::list_segments(&self.dir)
            .map_err(Error::io(&self.dir))?
            .into_iter()
            .map(SegmentNo::get)
            .collect();
        let blobs_before = list_blobs(&self.dir)?;
        let Some(point) = self.slot.durable.lock().ok().and_then(|d| *d) else {
            return Ok(());
        };
        if self.observed.back().is_none_or(|(p, _)| *p != point) {
            self.observed.push_back((point, now));
        }
        let mut m = self.manifest.clone();
        let archived = (m.archived.segment, m.archived.position);
        let durable = (point.segment.get(), point.position);
        if durable < archived || point.lsn.get() < m.archived.lsn {
            return Err(RoundError::Fenced(format!(
                "shard {}: the local log ends at segment {} position {} (LSN {}), before its \
                 archive (segment {} position {}); restore the data dir from the archive or \
                 archive to a new prefix",
                self.shard,
                point.segment.get(),
                point.position,
                point.lsn,
                archived.0,
                archived.1,
            )));
        }
        let sealed_new: Vec<u64> = local
            .iter()
            .copied()
            .filter(|&s| s < point.segment.get() && s >= m.archived.segment && !m.sealed(s))
            .collect();
        let interval_over = self.last_slice.is_none_or(|t| t.elapsed() >= self.interval);
        if durable > archived && (!sealed_new.is_empty() || interval_over) {
            for s in sealed_new {
                self.archive_sealed(&mut m, s, now).await?;
            }
            self.archive_slice(&mut m, point, now).await?;
            m.archived = End {
                segment: point.segment.get(),
                position: point.position,
                lsn: point.lsn.get(),
            };
            self.last_slice = Some(Instant::now());
        }
        self.archive_checkpoint(&mut m, now).await?;
        self.keep_needed_segments(&mut m, now);
        drop_archived_wal(&mut m, now);
        let blobs_after = list_blobs(&self.dir)?;
        self.archive_blobs(&mut m, &blobs_before, &blobs_after, now)
            .await?;
        self.collect_garbage(&mut m, now).await;
        if m != self.manifest || self.last_commit.elapsed() >= self.interval {
            m.heartbeat_ms = now;
            self.commit(m).await?;
        }
        Ok(())
    }

    async fn commit(&mut self, m: Manifest) -> Result<(), RoundError> {
        let status = &self.archive.status;
        match manifest::commit(&self.archive.store, &m, Some(&self.etag)).await {
            Ok(etag) => {
                tracing::debug!(
                    shard = self.shard,
                    segment = m.archived.segment,
                    position = m.archived.position,
                    lsn = m.archived.lsn,
                    "manifest committed"
                );
                status.count(Request::Manifest, Outcome::Ok);
                self.etag = etag;
                self.last_commit = Instant::now();
                self.publish(m);
                Ok(())
            }
            Err(Error::Conflict { .. }) => {
                status.count(Request::Manifest, Outcome::Precondition);
                let current = manifest::load(&self.archive.store, self.shard).await?;
                match current {
                    Some((cur, _)) if cur.epoch != m.epoch || cur.owner != m.owner => {
                        Err(RoundError::Fenced(format!(
                            "shard {}: server {} took the archive over (epoch {}, ours {})",
                            self.shard, cur.owner, cur.epoch, m.epoch
                        )))
                    }
                    // Our own earlier write, whose answer was lost: continue from it.
                    Some((cur, etag)) => {
                        self.etag = etag;
                        self.publish(cur);
                        Err(RoundError::Retry(Error::OwnWriteRetried))
                    }
                    None => Err(RoundError::Fenced(format!(
                        "shard {}: the manifest was deleted",
                        self.shard
                    ))),
                }
            }
            Err(e) => {
                status.count(Request::Manifest, Outcome::Error);
                Err(RoundError::Retry(e))
            }
        }
    }

    fn publish(&mut self, m: Manifest) {
        let archived = m.archived;
        self.manifest = m.clone();
        if let Ok(mut c) = self.slot.committed.lock() {
            *c = Arc::new(m);
        }
        if let Ok(mut w) = self.slot.wal.lock() {
            w.archived_through(archived.lsn);
        }
        while self.observed.front().is_some_and(|(p, _)| {
            (p.segment.get(), p.position) <= (archived.segment, archived.position)
        }) {
            self.observed.pop_front();
        }
    }

    /// Publish how far the committed archive is behind the newest durable end seen.
    fn report_lag(&self) {
        let Some(&(point, _)) = self.observed.back() else {
            self.archive.status.set_lag(self.shard, 0, 0);
            return;
        };
        let a = self.manifest.archived;
        let bytes = if (point.segment.get(), point.position) <= (a.segment, a.position) {
            0
        } else if point.segment.get() == a.segment {
            point.position - a.position
        } else {
            let seg = self.segment_bytes.max(point.position);
            (point.segment.get() - a.segment.max(1)) * seg + point.position - a.position.min(seg)
        };
        let since = self.observed.front().map_or(0, |(_, t)| *t);
        self.archive.status.set_lag(self.shard, bytes, since);
    }

    /// Write an immutable object. A create that finds the key taken is fine when the object
    /// there is this one (a retry whose first attempt landed), an error otherwise.
    pub(super) async fn upload(&self, key: &str, bytes: Bytes) -> Result<Object, RoundError> {
        let status = &self.archive.status;
        let object = Object {
            key: key.to_string(),
            len: bytes.len() as u64,
            crc: crc32c::crc32c(&bytes),
        };
        match self
            .archive
            .store
            .put(key, bytes, PutMode::CreateOnly)
            .await
        {
            Ok(_) => {
                status.count(Request::Put, Outcome::Ok);
                status
                    .objects_uploaded
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                status
                    .bytes_uploaded
                    .fetch_add(object.len, std::sync::atomic::Ordering::Relaxed);
                Ok(object)
            }
            Err(StoreError::PreconditionFailed) => {
                status.count(Request::Put, Outcome::Precondition);
                let there = self
                    .archive
                    .store
                    .get(key)
                    .await
                    .map_err(Error::request(key))?;
                status.count(Request::Get, Outcome::Ok);
                match there {
                    Some(o)
                        if o.bytes.len() as u64 == object.len
                            && crc32c::crc32c(&o.bytes) == object.crc =>
                    {
                        Ok(object)
                    }
                    _ => Err(RoundError::Fenced(format!(
                        "{key} already exists in {} with other content; another server writes \
                         under this owner epoch",
                        self.archive.store.describe()
                    ))),
                }
            }
            Err(e) => {
                status.count(Request::Put, Outcome::Error);
                Err(RoundError::Retry(Error::request(key)(e)))
            }
        }
    }
}
