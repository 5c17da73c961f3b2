//! The ingest task of one index: follow the published manifest until this worker holds
//! the index's ingest claim (a lease), then own: renew the claim, long-poll the source,
//! feed what it returns into the ingest state, ask the source for `HEAD` now and then
//! (retention, incarnation, a stream that is gone), and commit and tidy up when due.
//!
//! Ownership is one loop of turns ([`Index::own`]); each turn is a handful of steps, each
//! its own method, that either let the turn go on or end it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::ingest::Ingest;
use super::{Index, View};
use crate::error::{Error, Result};
use crate::extract::SkipKind;
use crate::manifest::{self, Status};
use crate::metrics::{IndexLabel, SkipLabel};
use crate::source::{self, HeadResult, ReadResult};
use crate::time::now_ms;

/// A source long-poll in flight: `(offset it reads from, result)`.
type PendingRead =
    std::pin::Pin<Box<dyn std::future::Future<Output = (u64, Result<ReadResult>)> + Send>>;

/// How often an owner asks the source for `HEAD` (retention floor, incarnation, tail for
/// the lag metric) while its long-polls come back empty. Idle indexes then cost the source
/// about one long-poll per the source's long-poll timeout and nothing else. A recreated,
/// deleted or trimmed stream is still noticed at once: the next read answers 404, 410,
/// 400 (offset beyond the tail) or a tail behind ours, and each of those asks for a HEAD.
const IDLE_HEAD_INTERVAL: Duration = Duration::from_secs(30);
/// While reads return data (and while the source is gone or failing): once a second.
const ACTIVE_HEAD_INTERVAL: Duration = Duration::from_secs(1);
/// How often an owner whose source refuses its token (401, 403) asks again, with a HEAD
/// and no reads: a refusal lasts until someone changes a token file, and the HEAD notices
/// that without a request per index every 200 ms in the meantime.
const REFUSED_HEAD_INTERVAL: Duration = Duration::from_secs(10);
/// Client-side bound on one long-poll. The source ends a long-poll itself after its own
/// timeout (ursula: `--long-poll-timeout-ms`, 1 s by default); this only guards against
/// one that never answers.
const LONG_POLL_CAP: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claim {
    worker_id: String,
    expires_at_ms: i64,
}

enum OwnerExit {
    /// Lost the claim, was stopped, or must re-read the manifest: back to following.
    Yield,
    /// The source was recreated and the registration moved to a new namespace.
    Restarted,
}

/// How a step of an owner's turn ends it.
enum Turn {
    /// This turn is over; start the next one.
    Next,
    /// Stop owning: publish what is indexed and hand the claim back.
    Leave(OwnerExit),
    /// The claim is lost: stop owning at once (another worker may own the index already).
    Abandon,
}

/// What an owner carries from one turn to the next.
struct Ownership {
    /// The ETag of our claim, and when to renew it.
    claim: String,
    renew_at: Instant,
    ing: Ingest,
    last_head: Option<Instant>,
    head_every: Duration,
    /// The long-poll in flight, kept across turns.
    poll: Option<PendingRead>,
    /// The newest tail offset the source reported, for the lag metrics.
    source_tail: u64,
    /// When the index was last caught up with the source.
    caught_up: Instant,
    label: IndexLabel,
    source_gone: bool,
    /// The source answered 401 or 403: no reads until a HEAD gets through again.
    refused: bool,
}

impl Index {
    /// Follow (refresh) until this worker holds the claim, then own.
    pub async fn run(self: Arc<Self>, on_restart: Arc<tokio::sync::Notify>) {
        let cfg = &self.shared.cfg;
        let mut next_claim_try = Instant::now();
        let mut next_gc = Instant::now() + cfg.gc_interval;
        while !self.stopped() {
            if let Err(e) = self.refresh().await {
                tracing::warn!(index = %self.reg.id, "refresh: {e}");
            }
            if Instant::now() >= next_claim_try {
                next_claim_try = Instant::now() + cfg.poll_interval;
                match self.acquire_claim().await {
                    Ok(Some(etag)) => {
                        tracing::info!(index = %self.reg.id, worker = %cfg.worker_id, "claimed ingest");
                        match self.own(etag, &mut next_gc).await {
                            OwnerExit::Restarted => {
                                on_restart.notify_one();
                                return;
                            }
                            OwnerExit::Yield => {}
                        }
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(index = %self.reg.id, "claim: {e}"),
                }
            }
            tokio::time::sleep(cfg.poll_interval).await;
        }
    }

    async fn acquire_claim(&self) -> Result<Option<String>> {
        let key = manifest::claim_key(&self.ns);
        let me = &self.shared.cfg.worker_id;
        let now = now_ms();
        let cur = manifest::load::<Claim>(&self.shared.store, &key).await?;
        let claim = Claim {
            worker_id: me.clone(),
            expires_at_ms: now + self.shared.cfg.lease.as_millis() as i64,
        };
        let etag = match &cur {
            None => None,
            Some(c) if &c.value.worker_id == me || c.value.expires_at_ms < now => {
                Some(c.etag.as_str())
            }
            Some(_) => return Ok(None),
        };
        match manifest::cas(&self.shared.store, &key, &claim, etag).await {
            Ok(etag) => Ok(Some(etag)),
            // Another worker claimed it first.
            Err(Error::Conflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn renew_claim(&self, etag: &str, release: bool) -> Option<String> {
        let key = manifest::claim_key(&self.ns);
        let claim = Claim {
            worker_id: self.shared.cfg.worker_id.clone(),
            expires_at_ms: if release {
                0
            } else {
                now_ms() + self.shared.cfg.lease.as_millis() as i64
            },
        };
        manifest::cas(&self.shared.store, &key, &claim, Some(etag))
            .await
            .ok()
    }

    /// Own the index until the claim is lost, the worker stops, or the manifest moves in a
    /// way that needs a fresh start.
    async fn own(self: &Arc<Self>, claim: String, next_gc: &mut Instant) -> OwnerExit {
        let Some(mut st) = self.take_over(claim).await else {
            return OwnerExit::Yield;
        };
        let exit = loop {
            match self.turn(&mut st, next_gc).await {
                Turn::Next => {}
                Turn::Leave(exit) => break exit,
                Turn::Abandon => {
                    self.set_refused(&mut st, None);
                    return OwnerExit::Yield;
                }
            }
        };
        // Leaving: publish what we have (best effort) and hand the claim back.
        if matches!(exit, OwnerExit::Yield) && st.ing.pending() {
            let _ = self.commit(&mut st.ing).await;
        }
        let _ = self.renew_claim(&st.claim, true).await;
        // The refusal was this owner's; whoever owns the index next reports its own.
        self.set_refused(&mut st, None);
        exit
    }

    /// The state an owner starts from, or `None` when there is nothing to own: the
    /// manifest cannot be read, or the index is blocked until someone resumes it (the
    /// claim is then handed back and the worker keeps following).
    async fn take_over(&self, claim: String) -> Option<Ownership> {
        let cfg = &self.shared.cfg;
        let renew_at = crate::batch::aligned(cfg.lease / 3, Duration::ZERO);
        if let Err(e) = self.refresh().await {
            tracing::warn!(index = %self.reg.id, "refresh: {e}");
            return None;
        }
        let view = self.view();
        if matches!(view.manifest.status, Status::Blocked { .. }) {
            let _ = self.renew_claim(&claim, true).await;
            return None;
        }
        // A series for every owned index, so "not refused" is a 0 rather than no data.
        let label = IndexLabel::of(&self.reg.id);
        self.shared
            .metrics
            .source_refused
            .get_or_create(&label)
            .set(0);
        let ing = Ingest::start(
            &view.manifest,
            &self.reg,
            cfg.debug_reingest,
            cfg.commit_interval,
        );
        Some(Ownership {
            claim,
            renew_at,
            ing,
            last_head: None,
            head_every: ACTIVE_HEAD_INTERVAL,
            poll: None,
            source_tail: 0,
            caught_up: Instant::now(),
            label,
            source_gone: matches!(view.manifest.status, Status::SourceGone),
            refused: false,
        })
    }

    /// One turn of the owner loop: renew the claim, HEAD, commit or tidy up when due, then
    /// wait for the long-poll (or the next of those deadlines) and take what it read.
    async fn turn(&self, st: &mut Ownership, next_gc: &mut Instant) -> Turn {
        let cfg = &self.shared.cfg;
        if self.stopped() {
            return Turn::Leave(OwnerExit::Yield);
        }
        let now = Instant::now();
        if now >= st.renew_at {
            match self.renew_claim(&st.claim, false).await {
                Some(e) => {
                    st.claim = e;
                    st.renew_at = crate::batch::aligned(cfg.lease / 3, Duration::ZERO);
                }
                None => {
                    tracing::warn!(index = %self.reg.id, "lost the ingest claim");
                    return Turn::Abandon;
                }
            }
        }
        if st
            .last_head
            .is_none_or(|t| now.duration_since(t) >= st.head_every)
        {
            st.last_head = Some(now);
            if let Some(end) = self.check_head(st).await {
                return end;
            }
        }
        if st.ing.commit_due(cfg) {
            return match self.commit(&mut st.ing).await {
                Ok(true) => Turn::Next,
                Ok(false) => Turn::Leave(OwnerExit::Yield),
                Err(e) => {
                    tracing::warn!(index = %self.reg.id, "commit: {e}");
                    self.nap(Duration::from_millis(200)).await;
                    Turn::Next
                }
            };
        }
        if Instant::now() >= *next_gc {
            // On a timer rather than after commits, so an index that went idle still
            // finishes a compaction a previous owner left due and collects its garbage.
            *next_gc = Instant::now() + cfg.gc_interval;
            self.maybe_compact().await;
            if let Err(e) = self.gc().await {
                tracing::warn!(index = %self.reg.id, "gc: {e}");
            }
        }
        match self.wait_for_read(st, now, *next_gc).await {
            Some(result) => self.take_read(st, result).await,
            None => Turn::Next,
        }
    }

    /// Ask the source for `HEAD`: a stream that is gone (or back), recreated (a new
    /// incarnation: restart in a new namespace), or trimmed (follow its retention).
    /// `Some` ends the turn.
    async fn check_head(&self, st: &mut Ownership) -> Option<Turn> {
        let cfg = &self.shared.cfg;
        let head = match self.shared.source.head(&self.reg.stream_url).await {
            Ok(HeadResult::Ok(head)) => head,
            Ok(HeadResult::NotFound) => {
                if !st.source_gone {
                    st.source_gone = true;
                    if let Err(e) = self.set_status(Status::SourceGone, None).await {
                        tracing::warn!(index = %self.reg.id, "publish source_gone: {e}");
                    }
                }
                // Nothing to read until it answers again; ask about once a second.
                st.head_every = ACTIVE_HEAD_INTERVAL;
                st.poll = None;
                self.nap(cfg.poll_interval).await;
                return Some(Turn::Next);
            }
            Err(e @ Error::SourceRefused { .. }) => {
                self.set_refused(st, Some(&e));
                return None;
            }
            Err(e) => {
                tracing::debug!(index = %self.reg.id, "HEAD: {e}");
                return None;
            }
        };
        self.set_refused(st, None);
        if let (Some(a), Some(b)) = (&head.incarnation, &self.reg.incarnation) {
            if a != b {
                return Some(match self.restart(&head).await {
                    Ok(()) => Turn::Leave(OwnerExit::Restarted),
                    Err(e) => {
                        tracing::warn!(index = %self.reg.id, "restart: {e}");
                        self.nap(cfg.poll_interval).await;
                        Turn::Next
                    }
                });
            }
        }
        if st.source_gone {
            st.source_gone = false;
            if let Err(e) = self
                .set_status(Status::Ready, Some(Status::SourceGone))
                .await
            {
                tracing::warn!(index = %self.reg.id, "clear source_gone: {e}");
            }
        }
        let pos = st.ing.pos;
        st.ing
            .follow_retention(head.retained_offset, head.record_first);
        if st.ing.pos != pos {
            // Retention jumped us forward: a poll at the old offset is moot.
            st.poll = None;
        }
        st.source_tail = st.source_tail.max(head.next_offset);
        self.record_lag(st);
        None
    }

    /// Wait for the long-poll in flight (starting one if none is), but only until the
    /// next commit, claim renewal, HEAD or upkeep is due (`now` is the turn's start), or
    /// the index is stopped: then `None`, and the long-poll stays in flight for the next
    /// turn. Abandoning it at each wake-up (as before) cost the source a new request,
    /// often a new connection, about every second per index, however long the source
    /// holds a long-poll. Also `None` for a read that started before a retention jump
    /// moved the read position.
    async fn wait_for_read(
        &self,
        st: &mut Ownership,
        now: Instant,
        next_gc: Instant,
    ) -> Option<Result<ReadResult>> {
        let deadline = st
            .ing
            .commit_deadline()
            .unwrap_or(now + IDLE_HEAD_INTERVAL)
            .min(st.renew_at)
            .min(next_gc)
            .min(st.last_head.map_or(now, |t| t + st.head_every))
            // A deadline already past must not spin the loop.
            .max(now + Duration::from_millis(20));
        if st.refused {
            // No reads while refused: only the next HEAD asks again.
            tokio::select! {
                _ = tokio::time::sleep_until(deadline.into()) => {}
                _ = self.stop_signal.notified() => {}
            }
            return None;
        }
        let pos = st.ing.pos;
        let read = st.poll.get_or_insert_with(|| {
            let (source, url) = (self.shared.source.clone(), self.reg.stream_url.clone());
            Box::pin(async move { (pos, source.read(&url, pos, true, LONG_POLL_CAP).await) })
        });
        let (at, result) = tokio::select! {
            r = read => r,
            _ = tokio::time::sleep_until(deadline.into()) => return None,
            _ = self.stop_signal.notified() => return None,
        };
        st.poll = None;
        (at == st.ing.pos).then_some(result)
    }

    /// Take what a long-poll read: feed data to the ingest state and publish the grown
    /// tail; an empty answer means the source is idle; anything else asks for a HEAD.
    async fn take_read(&self, st: &mut Ownership, result: Result<ReadResult>) -> Turn {
        match result {
            Ok(ReadResult::Data {
                body,
                next_offset,
                json_array,
            }) => {
                st.head_every = ACTIVE_HEAD_INTERVAL;
                let body = if json_array {
                    match source::array_to_lines(&body) {
                        Ok(b) => bytes::Bytes::from(b),
                        Err(e) => {
                            tracing::warn!(index = %self.reg.id, "{e}");
                            self.nap(Duration::from_millis(200)).await;
                            return Turn::Next;
                        }
                    }
                } else {
                    body
                };
                let (entries0, msgs0) = (st.ing.entries, st.ing.msgs.len());
                st.ing.feed(&body, &self.extractor);
                self.record_ingest(&st.ing, entries0, msgs0);
                st.source_tail = st.source_tail.max(next_offset.unwrap_or(st.ing.pos));
                self.record_lag(st);
                if let Some(n) = next_offset {
                    if n != st.ing.pos {
                        tracing::debug!(index = %self.reg.id, "source next offset {n} != {}", st.ing.pos);
                    }
                }
                self.publish_tail(&st.ing);
            }
            Ok(ReadResult::NoData { next_offset }) => {
                // A long poll that ends empty: we are at the tail, and the source is
                // idle, so HEAD (retention, incarnation) only now and then.
                st.head_every = IDLE_HEAD_INTERVAL;
                st.source_tail = st.ing.pos;
                self.record_lag(st);
                if next_offset.is_some_and(|n| n < st.ing.pos) {
                    // The tail is behind what we read: recreated or rewound. HEAD now.
                    st.last_head = None;
                }
            }
            Ok(ReadResult::Gone) | Ok(ReadResult::NotFound) => st.last_head = None,
            Err(e @ Error::SourceRefused { .. }) => self.set_refused(st, Some(&e)),
            Err(e) => {
                // E.g. 400 offset beyond the tail of a recreated stream, or a source
                // that is down: HEAD within a second, retry the read after a pause.
                tracing::debug!(index = %self.reg.id, "read: {e}");
                st.head_every = ACTIVE_HEAD_INTERVAL;
                self.nap(Duration::from_millis(200)).await;
            }
        }
        Turn::Next
    }

    /// Enter (`Some`: the source refused a request) or leave (`None`) the refused state:
    /// an error in the log and `ursula_indexer_source_refused` 1 on entering, once, and
    /// HEADs every [`REFUSED_HEAD_INTERVAL`] with no reads until one gets through.
    fn set_refused(&self, st: &mut Ownership, refusal: Option<&Error>) {
        match refusal {
            Some(e) => {
                st.head_every = REFUSED_HEAD_INTERVAL;
                st.poll = None;
                if !st.refused {
                    tracing::error!(
                        index = %self.reg.id,
                        "{e}; not indexing until the source accepts the token (asking again every {}s)",
                        REFUSED_HEAD_INTERVAL.as_secs()
                    );
                }
            }
            None if st.refused => {
                st.head_every = ACTIVE_HEAD_INTERVAL;
                tracing::info!(index = %self.reg.id, "the source accepts the token again");
            }
            None => return,
        }
        st.refused = refusal.is_some();
        self.shared
            .metrics
            .source_refused
            .get_or_create(&st.label)
            .set(i64::from(st.refused));
    }

    fn record_ingest(&self, ing: &Ingest, entries0: usize, msgs0: usize) {
        let m = &self.shared.metrics;
        let added = ing.entries.saturating_sub(entries0);
        if added > 0 {
            m.events
                .get_or_create(&IndexLabel::of(&self.reg.id))
                .inc_by(added as u64);
        }
        for (_, k) in ing.msgs.get(msgs0..).unwrap_or(&[]) {
            if let Some(k) = k {
                let reason = match k {
                    SkipKind::Missing => "missing",
                    SkipKind::Invalid => "invalid",
                    SkipKind::Unparseable => "unparseable",
                    SkipKind::Oversize => "oversize",
                };
                m.skipped
                    .get_or_create(&SkipLabel {
                        index: self.reg.id.clone(),
                        reason,
                    })
                    .inc();
            }
        }
    }

    /// Publish how far ingest is behind the source's tail, in bytes and in seconds since
    /// it was last caught up.
    fn record_lag(&self, st: &mut Ownership) {
        let behind = st.source_tail.saturating_sub(st.ing.done);
        if behind == 0 {
            st.caught_up = Instant::now();
        }
        let m = &self.shared.metrics;
        m.lag_bytes.get_or_create(&st.label).set(behind as i64);
        m.lag_seconds.get_or_create(&st.label).set(if behind == 0 {
            0.0
        } else {
            st.caught_up.elapsed().as_secs_f64()
        });
    }

    fn publish_tail(&self, ing: &Ingest) {
        let cur = self.view();
        if cur.manifest.durable_offset != ing.seg_start {
            return;
        }
        self.set_view(View {
            manifest: cur.manifest.clone(),
            etag: cur.etag.clone(),
            tail: Arc::new(ing.tail()),
        });
    }
}
