//! One index: its published manifest, its in-memory tail, the ingest loop that feeds both,
//! and the queries that read them.
//!
//! Readers never take a lock across I/O: they clone one `Arc<View>` (manifest + tail) and
//! work on that snapshot. The ingest task is the only writer of the view; it swaps in a new
//! `Arc` after every source read (tail grows: visible within milliseconds) and after every
//! successful manifest compare-and-swap (tail becomes durable).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::batch::{Packer, Sharded, ShardedStore};
use crate::cache::PartCache;
use crate::compact::Merge;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::extract::{Extractor, Outcome, SkipKind};
use crate::manifest::{
    self, Catalog, Manifest, PartMeta, Registration, RetiredNamespace, Skipped, Status, Versioned,
};
use crate::metrics::{Counting, IndexLabel, Metrics, SkipLabel};
use crate::part::{self, Entry, Group, PartFile};
use crate::source::{self, HeadResult, ReadResult, SourceClient};
use crate::store::{DynStore, PutMode, StoreError};
use crate::time::{day_start, now_ms};

/// Process-wide services every index uses.
pub struct Shared {
    /// The object store with manifests and claims kept in shards (see `batch`).
    pub store: DynStore,
    pub shards: Arc<ShardedStore>,
    pub packer: Arc<Packer>,
    pub cache: PartCache,
    pub cfg: Config,
    pub source: SourceClient,
    pub metrics: Arc<Metrics>,
}

impl Shared {
    /// `raw`: the object store itself; `disk_cache`: where to keep downloaded parts.
    pub fn new(
        raw: DynStore,
        cfg: Config,
        disk_cache: Option<std::path::PathBuf>,
        source: SourceClient,
    ) -> Arc<Shared> {
        let metrics = Metrics::new();
        let raw: DynStore = Arc::new(Counting {
            inner: raw,
            metrics: metrics.clone(),
        });
        let shards = ShardedStore::new(raw.clone(), cfg.poll_interval);
        let store: DynStore = Arc::new(Sharded(shards.clone()));
        Arc::new(Shared {
            cache: PartCache::new(store.clone(), disk_cache, cfg.cache_bytes),
            packer: Packer::new(raw),
            shards,
            store,
            cfg,
            source,
            metrics,
        })
    }
}

/// What queries see: the published manifest plus the not-yet-durable tail.
pub struct View {
    pub manifest: Arc<Manifest>,
    pub etag: String,
    pub tail: Arc<Tail>,
}

/// Entries read from the source but not yet published. `base` is the manifest's durable
/// offset the tail extends; a tail whose base is not the manifest's durable offset is
/// stale and ignored.
#[derive(Default, Debug)]
pub struct Tail {
    pub base: u64,
    pub end: u64,
    pub end_record: Option<u64>,
    pub floor: u64,
    pub runs: Vec<Arc<Vec<Entry>>>,
    pub skipped: Skipped,
    pub trimmed: u64,
    pub max_span_ms: i64,
}

impl View {
    fn tail(&self) -> Option<&Tail> {
        (self.tail.base == self.manifest.durable_offset && self.tail.end >= self.tail.base)
            .then_some(&*self.tail)
    }

    pub fn indexed(&self) -> u64 {
        self.tail().map_or(self.manifest.durable_offset, |t| t.end)
    }

    pub fn indexed_record(&self) -> Option<u64> {
        self.tail()
            .and_then(|t| t.end_record)
            .or(self.manifest.durable_record)
    }

    pub fn floor(&self) -> u64 {
        self.tail().map_or(self.manifest.floor_offset, |t| {
            t.floor.max(self.manifest.floor_offset)
        })
    }

    pub fn trimmed(&self) -> u64 {
        self.manifest.trimmed_bytes + self.tail().map_or(0, |t| t.trimmed)
    }

    pub fn skipped(&self) -> Skipped {
        let mut s = self.manifest.skipped;
        if let Some(t) = self.tail() {
            s.add(&t.skipped);
        }
        s
    }
}

pub struct Index {
    pub reg: Registration,
    pub ns: String,
    extractor: Extractor,
    shared: Arc<Shared>,
    view: RwLock<Arc<View>>,
    stop: AtomicBool,
    stop_signal: tokio::sync::Notify,
    /// `parts/` may hold uploads no manifest names (see `gc`): a compaction was tried
    /// since the last listing, or the last listing found some still inside the grace window.
    orphans_possible: AtomicBool,
}

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
/// Client-side bound on one long-poll. The source ends a long-poll itself after its own
/// timeout (ursula: `--long-poll-timeout-ms`, 1 s by default); this only guards against
/// one that never answers.
const LONG_POLL_CAP: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
pub struct Query {
    pub from: i64,
    pub until: i64,
    pub overlap: bool,
    pub limit: usize,
    pub after: Option<(i64, u64)>,
    pub through: Option<u64>,
    pub through_record: Option<u64>,
}

pub struct QueryResult {
    pub view: Arc<View>,
    pub through: u64,
    pub entries: Vec<Entry>,
    pub next: Option<(i64, u64)>,
}

/// Cursor token: 16 hex digits of `t_ms` with the sign bit flipped, then 16 of the offset,
/// so tokens sort as strings exactly like `(t_ms, offset)`.
pub fn encode_cursor(k: (i64, u64)) -> String {
    format!("{:016x}{:016x}", (k.0 as u64) ^ (1 << 63), k.1)
}

pub fn decode_cursor(s: &str) -> Option<(i64, u64)> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let t = u64::from_str_radix(&s[..16], 16).ok()? ^ (1 << 63);
    let o = u64::from_str_radix(&s[16..], 16).ok()?;
    Some((t as i64, o))
}

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

fn lock_read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn lock_write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl Index {
    /// Open (creating if needed) the namespace of `reg`.
    pub async fn open(shared: Arc<Shared>, reg: Registration) -> Result<Arc<Index>> {
        let ns = reg.namespace();
        let key = manifest::current_key(&ns);
        let current = match manifest::load::<Manifest>(&shared.store, &key).await? {
            Some(v) => v,
            None => {
                let m = Manifest::initial(&reg);
                match manifest::cas(&shared.store, &key, &m, None).await {
                    Ok(etag) => Versioned { value: m, etag },
                    // Another worker created it first: take theirs.
                    Err(Error::Conflict { .. }) => manifest::load::<Manifest>(&shared.store, &key)
                        .await?
                        .ok_or_else(|| Error::Vanished { key: key.clone() })?,
                    Err(e) => return Err(e),
                }
            }
        };
        current.value.validate(&key, &reg)?;
        // A compaction that is due now may have been under way when the previous owner
        // died, leaving its outputs unpublished under `parts/`: list once to find them.
        let orphans_possible = due_compaction(&current.value, shared.cfg.compact_parts).is_some();
        let spec = reg.extract.clone();
        let extractor = Extractor::compile(&spec)?.with_skew(shared.cfg.debug_time_offset_ms);
        let durable = current.value.durable_offset;
        let view = View {
            manifest: Arc::new(current.value),
            etag: current.etag,
            tail: Arc::new(Tail {
                base: durable,
                end: durable,
                ..Tail::default()
            }),
        };
        Ok(Arc::new(Index {
            reg,
            ns,
            extractor,
            shared,
            view: RwLock::new(Arc::new(view)),
            stop: AtomicBool::new(false),
            stop_signal: tokio::sync::Notify::new(),
            orphans_possible: AtomicBool::new(orphans_possible),
        }))
    }

    pub fn view(&self) -> Arc<View> {
        lock_read(&self.view).clone()
    }

    fn set_view(&self, v: View) {
        *lock_write(&self.view) = Arc::new(v);
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the owner loop out of a long-poll (a permit is kept if it is not waiting).
        self.stop_signal.notify_one();
    }

    /// Sleep, but wake when stopped.
    async fn nap(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop_signal.notified() => {}
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Re-read `CURRENT` if it changed; keeps the tail when it still extends the manifest.
    pub async fn refresh(&self) -> Result<()> {
        let cur = self.view();
        let key = manifest::current_key(&self.ns);
        if let Some(v) = manifest::reload::<Manifest>(&self.shared.store, &key, &cur.etag).await? {
            let tail = if cur.tail.base == v.value.durable_offset {
                cur.tail.clone()
            } else {
                Arc::new(Tail {
                    base: v.value.durable_offset,
                    end: v.value.durable_offset,
                    ..Tail::default()
                })
            };
            self.set_view(View {
                manifest: Arc::new(v.value),
                etag: v.etag,
                tail,
            });
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Query

    pub async fn query(&self, q: &Query) -> Result<QueryResult> {
        let view = self.view();
        let m = &view.manifest;
        let indexed = view.indexed();
        let through = q.through.unwrap_or(indexed);
        if through < m.indexed_from_offset || through > indexed {
            return Err(Error::BadQuery(format!(
                "through must lie between coverage.from ({}) and the indexed offset ({})",
                source::offset_token(m.indexed_from_offset),
                source::offset_token(indexed)
            )));
        }
        let floor = view.floor();
        let mut cursors: Vec<Cursor> = Vec::new();
        for p in &m.parts {
            let t_hit = if q.overlap {
                p.max_t_end_ms >= q.from && p.min_t_ms < q.until
            } else {
                p.max_t_ms >= q.from && p.min_t_ms < q.until
            };
            if !t_hit || p.max_offset < floor || p.min_offset >= through {
                continue;
            }
            let lb = lower_bound(q, p.max_span_ms);
            let file = self.shared.cache.file(&p.key).await?;
            cursors.push(Cursor::Part(PartCursor {
                key: p.key.clone(),
                file,
                rg: 0,
                slice: 0,
                group: None,
                row: 0,
                lb,
                until: q.until,
            }));
        }
        if let Some(t) = view.tail() {
            let lb = lower_bound(q, t.max_span_ms);
            for run in &t.runs {
                let start = run.partition_point(|e| e.key() < lb);
                cursors.push(Cursor::Run(run.clone(), start));
            }
        }
        let cache = &self.shared.cache;
        let mut heap = BinaryHeap::new();
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some(e) = c.peek(cache).await? {
                if e.t_ms < q.until {
                    heap.push(Reverse((e.key(), i)));
                }
            }
        }
        let mut out: Vec<Entry> = Vec::with_capacity(q.limit.min(1024) + 1);
        let mut last: Option<(i64, u64)> = None;
        while let Some(Reverse((_, i))) = heap.pop() {
            let c = &mut cursors[i];
            let Some(e) = c.peek(cache).await? else {
                continue;
            };
            c.advance();
            if let Some(n) = c.peek(cache).await? {
                if n.t_ms < q.until {
                    heap.push(Reverse((n.key(), i)));
                }
            }
            let keep = e.offset >= floor
                && e.offset < through
                && (!q.overlap || e.t_end_ms >= q.from)
                && q.through_record
                    .is_none_or(|tr| e.record.is_none_or(|r| r < tr))
                && last != Some(e.key());
            if !keep {
                continue;
            }
            last = Some(e.key());
            out.push(e);
            if out.len() > q.limit {
                break;
            }
        }
        let next = if out.len() > q.limit {
            out.truncate(q.limit);
            out.last().map(|e| e.key())
        } else {
            None
        };
        Ok(QueryResult {
            view,
            through,
            entries: out,
            next,
        })
    }

    // -----------------------------------------------------------------------------------
    // Status changes from the API

    /// `POST …/status/resume`: `blocked` → `ready`; `ready` stays; `source_gone` →
    /// [`Error::SourceGone`].
    pub async fn resume(&self) -> Result<()> {
        let key = manifest::current_key(&self.ns);
        let (r, _) =
            manifest::update::<Manifest, Result<()>>(&self.shared.store, &key, 16, |cur| {
                let Some(cur) = cur else {
                    return Err(missing(&key));
                };
                match cur.status {
                    Status::Ready => Ok((None, Ok(()))),
                    Status::SourceGone => Ok((None, Err(Error::SourceGone))),
                    Status::Blocked { .. } => {
                        let mut next = cur.clone();
                        next.generation += 1;
                        next.status = Status::Ready;
                        Ok((Some(next), Ok(())))
                    }
                }
            })
            .await?;
        self.refresh().await?;
        r
    }

    // -----------------------------------------------------------------------------------
    // The ingest task: follow (refresh) until this worker holds the claim, then own.

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

    async fn own(self: &Arc<Self>, claim_etag: String, next_gc: &mut Instant) -> OwnerExit {
        let cfg = &self.shared.cfg;
        let mut claim = claim_etag;
        let mut renew_at = crate::batch::aligned(cfg.lease / 3, Duration::ZERO);
        if let Err(e) = self.refresh().await {
            tracing::warn!(index = %self.reg.id, "refresh: {e}");
            return OwnerExit::Yield;
        }
        let view = self.view();
        if matches!(view.manifest.status, Status::Blocked { .. }) {
            // Blocked: nothing to ingest until someone resumes; keep following.
            let _ = self.renew_claim(&claim, true).await;
            return OwnerExit::Yield;
        }
        let mut ing = Ingest::start(
            &view.manifest,
            &self.reg,
            cfg.debug_reingest,
            cfg.commit_interval,
        );
        let mut last_head: Option<Instant> = None;
        let mut head_every = ACTIVE_HEAD_INTERVAL;
        let mut poll: Option<PendingRead> = None;
        let mut source_tail = 0u64;
        let mut caught_up = Instant::now();
        let label = IndexLabel::of(&self.reg.id);
        let mut source_gone = matches!(view.manifest.status, Status::SourceGone);
        let exit = loop {
            if self.stopped() {
                break OwnerExit::Yield;
            }
            let now = Instant::now();
            if now >= renew_at {
                match self.renew_claim(&claim, false).await {
                    Some(e) => {
                        claim = e;
                        renew_at = crate::batch::aligned(cfg.lease / 3, Duration::ZERO);
                    }
                    None => {
                        tracing::warn!(index = %self.reg.id, "lost the ingest claim");
                        return OwnerExit::Yield;
                    }
                }
            }
            if last_head.is_none_or(|t| now.duration_since(t) >= head_every) {
                last_head = Some(now);
                match self.shared.source.head(&self.reg.stream_url).await {
                    Ok(HeadResult::NotFound) => {
                        if !source_gone {
                            source_gone = true;
                            if let Err(e) = self.set_status(Status::SourceGone, None).await {
                                tracing::warn!(index = %self.reg.id, "publish source_gone: {e}");
                            }
                        }
                        // Nothing to read until it answers again; ask about once a second.
                        head_every = ACTIVE_HEAD_INTERVAL;
                        poll = None;
                        self.nap(cfg.poll_interval).await;
                        continue;
                    }
                    Ok(HeadResult::Ok(head)) => {
                        if let (Some(a), Some(b)) = (&head.incarnation, &self.reg.incarnation) {
                            if a != b {
                                match self.restart(&head).await {
                                    Ok(()) => break OwnerExit::Restarted,
                                    Err(e) => {
                                        tracing::warn!(index = %self.reg.id, "restart: {e}");
                                        self.nap(cfg.poll_interval).await;
                                        continue;
                                    }
                                }
                            }
                        }
                        if source_gone {
                            source_gone = false;
                            if let Err(e) = self
                                .set_status(Status::Ready, Some(Status::SourceGone))
                                .await
                            {
                                tracing::warn!(index = %self.reg.id, "clear source_gone: {e}");
                            }
                        }
                        let pos = ing.pos;
                        ing.follow_retention(head.retained_offset, head.record_first);
                        if ing.pos != pos {
                            // Retention jumped us forward: a poll at the old offset is moot.
                            poll = None;
                        }
                        source_tail = source_tail.max(head.next_offset);
                        self.record_lag(&label, &ing, source_tail, &mut caught_up);
                    }
                    Err(e) => {
                        tracing::debug!(index = %self.reg.id, "HEAD: {e}");
                    }
                }
            }
            if ing.commit_due(cfg) {
                match self.commit(&mut ing).await {
                    Ok(true) => {}
                    Ok(false) => break OwnerExit::Yield,
                    Err(e) => {
                        tracing::warn!(index = %self.reg.id, "commit: {e}");
                        self.nap(Duration::from_millis(200)).await;
                    }
                }
                continue;
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
            // Wake for the next commit, claim renewal, HEAD or upkeep, whichever is first; the
            // long-poll stays in flight across those wake-ups. Abandoning it at each one
            // (as before) cost the source a new request, often a new connection, about
            // every second per index, however long the source holds a long-poll.
            let deadline = ing
                .commit_deadline()
                .unwrap_or(now + IDLE_HEAD_INTERVAL)
                .min(renew_at)
                .min(*next_gc)
                .min(last_head.map_or(now, |t| t + head_every))
                // A deadline already past must not spin the loop.
                .max(now + Duration::from_millis(20));
            let read = poll.get_or_insert_with(|| {
                let (source, url, at) = (
                    self.shared.source.clone(),
                    self.reg.stream_url.clone(),
                    ing.pos,
                );
                Box::pin(async move { (at, source.read(&url, at, true, LONG_POLL_CAP).await) })
            });
            let (at, result) = tokio::select! {
                r = read => r,
                _ = tokio::time::sleep_until(deadline.into()) => continue,
                _ = self.stop_signal.notified() => continue,
            };
            poll = None;
            if at != ing.pos {
                // Started before a retention jump moved the read position.
                continue;
            }
            match result {
                Ok(ReadResult::Data {
                    body,
                    next_offset,
                    json_array,
                }) => {
                    head_every = ACTIVE_HEAD_INTERVAL;
                    let body = if json_array {
                        match source::array_to_lines(&body) {
                            Ok(b) => bytes::Bytes::from(b),
                            Err(e) => {
                                tracing::warn!(index = %self.reg.id, "{e}");
                                self.nap(Duration::from_millis(200)).await;
                                continue;
                            }
                        }
                    } else {
                        body
                    };
                    let (entries0, msgs0) = (ing.entries, ing.msgs.len());
                    ing.feed(&body, &self.extractor);
                    self.record_ingest(&ing, entries0, msgs0);
                    source_tail = source_tail.max(next_offset.unwrap_or(ing.pos));
                    self.record_lag(&label, &ing, source_tail, &mut caught_up);
                    if let Some(n) = next_offset {
                        if n != ing.pos {
                            tracing::debug!(index = %self.reg.id, "source next offset {n} != {}", ing.pos);
                        }
                    }
                    self.publish_tail(&ing);
                }
                Ok(ReadResult::NoData { next_offset }) => {
                    // A long poll that ends empty: we are at the tail, and the source is
                    // idle, so HEAD (retention, incarnation) only now and then.
                    head_every = IDLE_HEAD_INTERVAL;
                    source_tail = ing.pos;
                    self.record_lag(&label, &ing, source_tail, &mut caught_up);
                    if next_offset.is_some_and(|n| n < ing.pos) {
                        // The tail is behind what we read: recreated or rewound. HEAD now.
                        last_head = None;
                    }
                }
                Ok(ReadResult::Gone) | Ok(ReadResult::NotFound) => last_head = None,
                Err(e) => {
                    // E.g. 400 offset beyond the tail of a recreated stream, or a source
                    // that is down: HEAD within a second, retry the read after a pause.
                    tracing::debug!(index = %self.reg.id, "read: {e}");
                    head_every = ACTIVE_HEAD_INTERVAL;
                    self.nap(Duration::from_millis(200)).await;
                }
            }
        };
        // Leaving: publish what we have (best effort) and hand the claim back.
        if matches!(exit, OwnerExit::Yield) && ing.pending() {
            let _ = self.commit(&mut ing).await;
        }
        let _ = self.renew_claim(&claim, true).await;
        exit
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

    fn record_lag(&self, label: &IndexLabel, ing: &Ingest, tail: u64, caught_up: &mut Instant) {
        let behind = tail.saturating_sub(ing.done);
        if behind == 0 {
            *caught_up = Instant::now();
        }
        let m = &self.shared.metrics;
        m.lag_bytes.get_or_create(label).set(behind as i64);
        m.lag_seconds.get_or_create(label).set(if behind == 0 {
            0.0
        } else {
            caught_up.elapsed().as_secs_f64()
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

    async fn set_status(&self, status: Status, only_from: Option<Status>) -> Result<()> {
        let key = manifest::current_key(&self.ns);
        manifest::update::<Manifest, ()>(&self.shared.store, &key, 16, |cur| {
            let Some(cur) = cur else {
                return Err(missing(&key));
            };
            if cur.status == status || only_from.as_ref().is_some_and(|f| &cur.status != f) {
                return Ok((None, ()));
            }
            let mut next = cur.clone();
            next.generation += 1;
            next.status = status.clone();
            Ok((Some(next), ()))
        })
        .await?;
        self.refresh().await
    }

    /// A new `Stream-Incarnation`: rebind the registration to the recreated stream (a new
    /// namespace) and retire the old namespace.
    async fn restart(&self, head: &source::Head) -> Result<()> {
        let old_ns = self.ns.clone();
        let id = self.reg.id.clone();
        let old_inc = self.reg.incarnation.clone();
        manifest::update::<Catalog, ()>(&self.shared.store, manifest::CATALOG_KEY, 32, |cur| {
            let Some(cur) = cur else {
                return Err(missing(manifest::CATALOG_KEY));
            };
            let mut next = cur.clone();
            let Some(r) = next
                .registrations
                .iter_mut()
                .find(|r| r.id == id && r.namespace() == old_ns)
            else {
                return Ok((None, ())); // someone else already restarted (or deleted) it
            };
            r.incarnation = head.incarnation.clone();
            r.indexed_from_offset = source::offset_token(head.retained_offset);
            r.indexed_from_record = if head.record_coordinates {
                head.record_first
            } else {
                None
            };
            r.record_coordinates = head.record_coordinates;
            r.restarted_from_incarnation = old_inc.clone();
            if next.retired.iter().any(|t| t.namespace == r.namespace()) {
                return Ok((None, ())); // a stale HEAD pointing at a retired namespace
            }
            next.retired.push(RetiredNamespace {
                id: id.clone(),
                namespace: old_ns.clone(),
                retired_at_ms: now_ms(),
            });
            Ok((Some(next), ()))
        })
        .await?;
        tracing::info!(index = %id, "source recreated: restarted from incarnation {old_inc:?}");
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Commit: publish the tail as parts + a new manifest generation (CAS).

    /// Ok(true): committed (or nothing to do); Ok(false): must stop owning (blocked, or the
    /// manifest moved in a way that needs a fresh start).
    async fn commit(&self, ing: &mut Ingest) -> Result<bool> {
        let key = manifest::current_key(&self.ns);
        let ours = ing.sorted_entries();
        for _attempt in 0..8 {
            let Some(cur) = manifest::load::<Manifest>(&self.shared.store, &key).await? else {
                return Err(missing(&key));
            };
            let m = &cur.value;
            if matches!(m.status, Status::Blocked { .. }) {
                return Ok(false);
            }
            if m.durable_offset < ing.seg_start {
                return Err(Error::bad_manifest(
                    &key,
                    format!(
                        "manifest durable {} is behind segment start {}",
                        m.durable_offset, ing.seg_start
                    ),
                ));
            }
            let cut = m.durable_offset;
            if cut > ing.seg_start {
                // Someone else committed part of these bytes: they must agree with us.
                if cut > ing.done || !ing.is_boundary(cut) {
                    if cut > ing.done {
                        return Ok(false); // they are ahead of us: restart from their state
                    }
                    let reason = format!(
                        "committed bytes end at {cut}, which is not a message boundary here"
                    );
                    self.block(ing.seg_start, reason).await?;
                    return Ok(false);
                }
                let theirs = self.committed_between(m, ing.seg_start, cut).await?;
                let mut mine: Vec<Entry> = ours
                    .iter()
                    .filter(|e| e.offset < cut && e.offset >= m.floor_offset)
                    .copied()
                    .collect();
                mine.sort_by_key(|e| e.offset);
                let theirs: Vec<Entry> = theirs
                    .into_iter()
                    .filter(|e| e.offset >= m.floor_offset)
                    .collect();
                if mine != theirs {
                    let first = mine
                        .iter()
                        .zip(theirs.iter())
                        .find(|(a, b)| a != b)
                        .map(|(a, _)| a.offset)
                        .unwrap_or(ing.seg_start);
                    let reason = format!(
                        "two workers extracted different entries for the same source bytes (first difference at offset {first})"
                    );
                    self.block(first, reason).await?;
                    return Ok(false);
                }
            }
            let fresh: Vec<Entry> = ours.iter().filter(|e| e.offset >= cut).copied().collect();
            let mut new_parts = Vec::new();
            for day in split_days(&fresh) {
                new_parts.push(self.write_part(day, 0).await?);
            }
            let mut next = m.clone();
            next.generation += 1;
            next.durable_offset = ing.done.max(cut);
            next.durable_record = ing.done_record.or(m.durable_record);
            next.floor_offset = m.floor_offset.max(ing.floor);
            next.trimmed_bytes += ing.trimmed_from(cut);
            next.skipped.add(&ing.skipped_from(cut));
            if next.status == Status::SourceGone {
                next.status = Status::Ready;
            }
            next.parts.extend(new_parts);
            match manifest::cas(&self.shared.store, &key, &next, Some(&cur.etag)).await {
                Ok(etag) => {
                    self.shared
                        .metrics
                        .commits
                        .get_or_create(&IndexLabel::of(&self.reg.id))
                        .inc();
                    ing.committed();
                    let durable = next.durable_offset;
                    let mut tail = ing.tail();
                    tail.base = durable;
                    self.set_view(View {
                        manifest: Arc::new(next),
                        etag,
                        tail: Arc::new(tail),
                    });
                    self.maybe_compact().await;
                    return Ok(true);
                }
                Err(Error::Conflict { .. }) => {
                    self.shared
                        .metrics
                        .cas_conflicts
                        .get_or_create(&IndexLabel::of(&self.reg.id))
                        .inc();
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Contended { key })
    }

    async fn block(&self, offset: u64, reason: String) -> Result<()> {
        tracing::error!(index = %self.reg.id, "blocking index: {reason}");
        self.set_status(
            Status::Blocked {
                offset: source::offset_token(offset),
                reason,
            },
            None,
        )
        .await
    }

    /// Committed entries with `start <= offset < end`, sorted by offset.
    async fn committed_between(&self, m: &Manifest, start: u64, end: u64) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for p in &m.parts {
            if p.max_offset < start || p.min_offset >= end {
                continue;
            }
            let f = self.shared.cache.file(&p.key).await?;
            out.extend(
                f.all()?
                    .into_iter()
                    .filter(|e| e.offset >= start && e.offset < end),
            );
        }
        out.sort_by_key(|e| e.offset);
        out.dedup_by_key(|e| e.offset);
        Ok(out)
    }

    /// Encode, upload (create-only: content-addressed, so a 412 means already there).
    async fn write_part(&self, entries: Vec<Entry>, level: u8) -> Result<PartMeta> {
        let bytes = part::encode(&entries, self.shared.cfg.part_compression)?;
        // Small level-0 parts of all indexes committing together share one pack PUT;
        // compaction outputs are large and get objects of their own.
        let key = if level == 0 {
            self.shared.packer.write(bytes.clone()).await?
        } else {
            let key = manifest::part_key(&self.ns, &bytes);
            match self
                .shared
                .store
                .put(&key, bytes.clone(), PutMode::CreateOnly)
                .await
            {
                Ok(_) | Err(StoreError::PreconditionFailed) => {}
                Err(e) => return Err(Error::request(key)(e)),
            }
            key
        };
        let meta = part_meta(&key, level, &entries, bytes.len() as u64);
        self.shared.cache.prime(&key, bytes);
        Ok(meta)
    }

    // -----------------------------------------------------------------------------------
    // Compaction and GC (owner only)

    /// Time-disjoint compaction: when a day has `--compact-parts` level-0 parts, merge the
    /// oldest of them (bounded fan-in) with the level-1 parts whose time range they overlap
    /// into a new sorted run of level-1 parts split at `--compaction-max-entries`. Level-1
    /// parts of a day therefore never overlap in time, so manifest pruning keeps working.
    async fn maybe_compact(&self) {
        let view = self.view();
        // At most one merge per call keeps commits cheap.
        if let Some((day, inputs)) = due_compaction(&view.manifest, self.shared.cfg.compact_parts) {
            if let Err(e) = self.compact(day, inputs).await {
                tracing::warn!(index = %self.reg.id, "compaction: {e}");
            }
        }
    }

    async fn compact(&self, day: i64, l0: Vec<PartMeta>) -> Result<()> {
        // Its outputs go under `parts/`; if its publish fails they are orphans for GC.
        self.orphans_possible.store(true, Ordering::Relaxed);
        let cfg = &self.shared.cfg;
        let view = self.view();
        let m = &view.manifest;
        let lo = l0.iter().map(|p| p.min_t_ms).min().unwrap_or(i64::MIN);
        let hi = l0.iter().map(|p| p.max_t_ms).max().unwrap_or(i64::MAX);
        // Level-1 parts of a day are time-disjoint: together they are one sorted run, read
        // one part after the other. So the merge has `l0.len() + 1` inputs however many
        // level-1 parts it rewrites, and holds one page slice per input plus one output
        // part (`compact::buffer_bound`), not its inputs.
        let mut l1: Vec<PartMeta> = m
            .parts
            .iter()
            .filter(|p| p.level == 1 && p.day_ms == day && p.max_t_ms >= lo && p.min_t_ms <= hi)
            .cloned()
            .collect();
        l1.sort_by_key(|p| (p.min_t_ms, p.max_t_ms));
        let mut runs: Vec<Vec<String>> = l0.iter().map(|p| vec![p.key.clone()]).collect();
        runs.push(l1.iter().map(|p| p.key.clone()).collect());
        let mut merge = Merge::new(runs, m.floor_offset, cfg.compaction_max_entries);
        let mut outputs = Vec::new();
        while let Some(chunk) = merge.next_chunk(&self.shared.cache).await? {
            outputs.push(self.write_part(chunk, 1).await?);
        }
        tracing::debug!(index = %self.reg.id, inputs = l0.len() + l1.len(), peak_rows = merge.peak_rows, "compaction merged");
        let inputs: Vec<PartMeta> = l0.into_iter().chain(l1).collect();
        let gone: HashSet<String> = inputs.iter().map(|p| p.key.clone()).collect();
        let key = manifest::current_key(&self.ns);
        let (_, published) = manifest::update::<Manifest, ()>(&self.shared.store, &key, 8, |cur| {
            let Some(cur) = cur else {
                return Err(missing(&key));
            };
            if gone.iter().any(|k| !cur.parts.iter().any(|p| &p.key == k)) {
                return Ok((None, ())); // inputs changed under us; try again later
            }
            let mut next = cur.clone();
            next.generation += 1;
            next.parts.retain(|p| !gone.contains(&p.key));
            next.parts.extend(outputs.iter().cloned());
            let keep: HashSet<&str> = next.parts.iter().map(|p| p.key.as_str()).collect();
            for k in &gone {
                if !keep.contains(k.as_str()) {
                    next.retired_parts.push(manifest::RetiredPart {
                        key: k.clone(),
                        generation: next.generation,
                        at_ms: now_ms(),
                    });
                }
            }
            Ok((Some(next), ()))
        })
        .await?;
        if let Some(p) = published {
            let cur = self.view();
            if p.value.durable_offset == cur.manifest.durable_offset {
                self.set_view(View {
                    manifest: Arc::new(p.value),
                    etag: p.etag,
                    tail: cur.tail.clone(),
                });
            }
        }
        Ok(())
    }

    /// Delete parts that no reader can need: retired for `--gc-retain-generations`
    /// generations and older than the grace window, plus unreferenced uploads (lost CAS
    /// races) older than the grace window.
    pub async fn gc(&self) -> Result<usize> {
        let cfg = &self.shared.cfg;
        let view = self.view();
        let m = &view.manifest;
        let now = now_ms();
        let grace = cfg.gc_grace.as_millis() as i64;
        let expired: Vec<String> = m
            .retired_parts
            .iter()
            .filter(|r| {
                m.generation.saturating_sub(r.generation) >= cfg.gc_retain_generations
                    && now - r.at_ms >= grace
            })
            .map(|r| r.key.clone())
            .collect();
        let live: HashSet<&str> = m
            .parts
            .iter()
            .map(|p| p.key.as_str())
            .chain(m.retired_parts.iter().map(|r| r.key.as_str()))
            .collect();
        let mut deleted = 0;
        // Only compaction writes objects under `parts/` (level-0 parts live in packs), so
        // only an index that has compacted can have orphans there. Listing every index's
        // prefix was one LIST per index per GC interval: ~170/s at 10 000 indexes.
        let may_have_orphans = self.orphans_possible.swap(false, Ordering::Relaxed)
            || m.parts.iter().any(|p| p.level > 0)
            || m.retired_parts
                .iter()
                .any(|r| crate::batch::pack_member(&r.key).is_none());
        let listed = if may_have_orphans {
            let prefix = manifest::parts_prefix(&self.ns);
            self.shared
                .store
                .list(&prefix)
                .await
                .map_err(Error::request(prefix))?
        } else {
            Vec::new()
        };
        for l in listed {
            if live.contains(l.key.as_str()) {
                continue;
            }
            if l.modified_ms.is_none_or(|t| now - t < grace) {
                // Perhaps an upload whose publish is still in flight: look again next time.
                self.orphans_possible.store(true, Ordering::Relaxed);
                continue;
            }
            self.shared
                .store
                .delete(&l.key)
                .await
                .map_err(Error::request(&l.key))?;
            deleted += 1;
        }
        if expired.is_empty() {
            return Ok(deleted);
        }
        for k in &expired {
            // A part inside a pack goes with its pack, once no manifest names the pack.
            if crate::batch::pack_member(k).is_some() {
                continue;
            }
            self.shared
                .store
                .delete(k)
                .await
                .map_err(Error::request(k))?;
            deleted += 1;
        }
        let key = manifest::current_key(&self.ns);
        let gone: HashSet<String> = expired.into_iter().collect();
        manifest::update::<Manifest, ()>(&self.shared.store, &key, 8, |cur| {
            let Some(cur) = cur else {
                return Err(missing(&key));
            };
            let mut next = cur.clone();
            next.generation += 1;
            next.retired_parts.retain(|r| !gone.contains(&r.key));
            Ok((Some(next), ()))
        })
        .await?;
        self.refresh().await?;
        Ok(deleted)
    }
}

/// The merge that is due in `m`, if any: the earliest day with at least `compact_parts`
/// level-0 parts, and the first `compact_parts` of them.
fn due_compaction(m: &Manifest, compact_parts: usize) -> Option<(i64, Vec<PartMeta>)> {
    let mut days: Vec<i64> = m
        .parts
        .iter()
        .filter(|p| p.level == 0)
        .map(|p| p.day_ms)
        .collect();
    days.sort_unstable();
    days.dedup();
    days.into_iter().find_map(|day| {
        let l0 = m.parts.iter().filter(|p| p.level == 0 && p.day_ms == day);
        (l0.clone().count() >= compact_parts)
            .then(|| (day, l0.take(compact_parts).cloned().collect()))
    })
}

/// The manifest or catalog `key` must exist (it is created before anything uses it).
fn missing(key: &str) -> Error {
    Error::Missing {
        key: key.to_string(),
    }
}

fn lower_bound(q: &Query, max_span_ms: i64) -> (i64, u64) {
    let t = if q.overlap {
        q.from.saturating_sub(max_span_ms.max(0))
    } else {
        q.from
    };
    let lb = (t, 0);
    match q.after {
        Some((t, o)) => lb.max((t, o.saturating_add(1))),
        None => lb,
    }
}

fn split_days(sorted: &[Entry]) -> Vec<Vec<Entry>> {
    let mut out: Vec<Vec<Entry>> = Vec::new();
    let mut cur_day = None;
    for e in sorted {
        let d = day_start(e.t_ms);
        if cur_day != Some(d) {
            out.push(Vec::new());
            cur_day = Some(d);
        }
        if let Some(v) = out.last_mut() {
            v.push(*e);
        }
    }
    out
}

fn part_meta(key: &str, level: u8, entries: &[Entry], bytes: u64) -> PartMeta {
    PartMeta {
        key: key.to_string(),
        level,
        day_ms: entries.first().map_or(0, |e| day_start(e.t_ms)),
        entries: entries.len() as u64,
        min_t_ms: entries.first().map_or(0, |e| e.t_ms),
        max_t_ms: entries.last().map_or(0, |e| e.t_ms),
        max_t_end_ms: entries.iter().map(|e| e.t_end_ms).max().unwrap_or(0),
        max_span_ms: entries
            .iter()
            .map(|e| e.t_end_ms - e.t_ms)
            .max()
            .unwrap_or(0),
        min_offset: entries.iter().map(|e| e.offset).min().unwrap_or(0),
        max_offset: entries.iter().map(|e| e.offset).max().unwrap_or(0),
        bytes,
    }
}

// ---------------------------------------------------------------------------------------
// Merge cursors

enum Cursor {
    Part(PartCursor),
    Run(Arc<Vec<Entry>>, usize),
}

struct PartCursor {
    key: String,
    file: Arc<PartFile>,
    rg: usize,
    /// Page slice within row group `rg`.
    slice: usize,
    group: Option<Arc<Group>>,
    row: usize,
    lb: (i64, u64),
    until: i64,
}

impl PartCursor {
    fn next_slice(&mut self) {
        self.slice += 1;
        if self.slice >= self.file.pages.get(self.rg).map_or(0, |v| v.len()) {
            self.rg += 1;
            self.slice = 0;
        }
    }
}

impl Cursor {
    async fn peek(&mut self, cache: &PartCache) -> Result<Option<Entry>> {
        match self {
            Cursor::Run(run, i) => Ok(run.get(*i).copied()),
            Cursor::Part(p) => loop {
                if p.group.is_none() {
                    // Row-group pruning by statistics, then page pruning inside the group
                    // by the page index: skip whatever lies entirely below the lower
                    // bound; stop at the first group or page starting at or after `until`.
                    while p.rg < p.file.groups.len() && p.file.groups[p.rg].2 < p.lb.0 {
                        p.rg += 1;
                        p.slice = 0;
                    }
                    let Some(&(_, min_t, _)) = p.file.groups.get(p.rg) else {
                        return Ok(None);
                    };
                    if min_t >= p.until {
                        return Ok(None);
                    }
                    let slices = &p.file.pages[p.rg];
                    while p.slice < slices.len() && slices[p.slice].max_t < p.lb.0 {
                        p.slice += 1;
                    }
                    let Some(sl) = slices.get(p.slice) else {
                        p.rg += 1;
                        p.slice = 0;
                        continue;
                    };
                    if sl.min_t >= p.until {
                        return Ok(None);
                    }
                    // The page's times alone say where the window starts in it, or that
                    // it starts past `until` (the common case of a narrow window over a
                    // part that spans the day): then no other column is decoded.
                    let times = cache.times(&p.key, p.rg, p.slice).await?;
                    match times.get(times.partition_point(|t| *t < p.lb.0)) {
                        Some(t) if *t >= p.until => return Ok(None),
                        Some(_) => {}
                        None => {
                            p.next_slice();
                            continue;
                        }
                    }
                    let g = cache.slice(&p.key, p.rg, p.slice).await?;
                    p.row = g.lower_bound(p.lb);
                    p.group = Some(g);
                }
                let Some(g) = &p.group else { return Ok(None) };
                if p.row < g.rows() {
                    return Ok(Some(g.entry(p.row)));
                }
                p.next_slice();
                p.group = None;
            },
        }
    }

    fn advance(&mut self) {
        match self {
            Cursor::Run(_, i) => *i += 1,
            Cursor::Part(p) => p.row += 1,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Ingest state of the owner

struct Ingest {
    /// Offset of the manifest's durable end when this segment began.
    seg_start: u64,
    /// Offset just past the last complete message read.
    done: u64,
    done_record: Option<u64>,
    /// Next offset to read (`done` plus the unterminated bytes in `carry`).
    pos: u64,
    carry: Vec<u8>,
    /// The line in `carry` is longer than a message may be: discard it up to its LF.
    oversize: bool,
    /// Reading resumed at a retained offset that may lie inside a message.
    resync: bool,
    record_coordinates: bool,
    floor: u64,
    /// Sorted runs of entries of this segment, newest last.
    runs: Vec<Arc<Vec<Entry>>>,
    /// Start offset of every message of this segment, with its skip kind if skipped.
    msgs: Vec<(u64, Option<SkipKind>)>,
    /// (offset, bytes) of each retention trim in this segment.
    trims: Vec<(u64, u64)>,
    max_span_ms: i64,
    /// When the pending entries are due: the next wall-clock multiple of the commit
    /// interval after they began, so every index of a worker commits in the same round
    /// and their parts and manifests share PUTs.
    commit_at: Option<Instant>,
    interval: Duration,
    entries: usize,
}

impl Ingest {
    fn start(m: &Manifest, reg: &Registration, reingest: bool, interval: Duration) -> Ingest {
        let (start, record) = if reingest {
            (m.indexed_from_offset, reg.indexed_from_record)
        } else {
            (m.durable_offset, m.durable_record)
        };
        Ingest {
            seg_start: start,
            done: start,
            done_record: if reg.record_coordinates { record } else { None },
            pos: start,
            carry: Vec::new(),
            oversize: false,
            resync: false,
            record_coordinates: reg.record_coordinates,
            floor: m.floor_offset,
            runs: Vec::new(),
            msgs: Vec::new(),
            trims: Vec::new(),
            max_span_ms: 0,
            commit_at: None,
            interval,
            entries: 0,
        }
    }

    fn pending(&self) -> bool {
        self.done > self.seg_start || !self.trims.is_empty()
    }

    fn commit_due(&self, cfg: &Config) -> bool {
        self.pending()
            && (self.entries >= cfg.commit_entries
                || self.commit_at.is_some_and(|t| t <= Instant::now()))
    }

    fn commit_deadline(&self) -> Option<Instant> {
        self.commit_at
    }

    fn mark_pending(&mut self) {
        if self.commit_at.is_none() {
            self.commit_at = Some(crate::batch::aligned(self.interval, Duration::ZERO));
        }
    }

    /// The stream's retained offset moved: raise the floor; bytes trimmed before they
    /// were read are counted and skipped.
    fn follow_retention(&mut self, retained: u64, record_first: Option<u64>) {
        if retained > self.floor {
            self.floor = retained;
            self.mark_pending();
        }
        if retained > self.done {
            self.trims.push((self.done, retained - self.done));
            self.done = retained;
            self.pos = retained;
            self.carry.clear();
            self.oversize = false;
            self.resync = true;
            if self.record_coordinates {
                self.done_record = record_first;
            }
            self.mark_pending();
        }
    }

    /// Frame `body` (bytes at `pos`) into LF-terminated messages and classify each.
    fn feed(&mut self, body: &[u8], ex: &Extractor) {
        let mut batch = Vec::new();
        let mut rest = body;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let (line_part, after) = rest.split_at(i);
            rest = &after[1..];
            let start = self.done;
            let len = (self.carry.len() + line_part.len() + 1) as u64;
            let len = if self.oversize {
                self.pos + i as u64 + 1 - start
            } else {
                len
            };
            let outcome = if self.oversize {
                Some(Outcome::Skip(SkipKind::Oversize))
            } else if self.carry.is_empty() {
                classify(line_part, ex)
            } else {
                self.carry.extend_from_slice(line_part);
                let o = classify(&self.carry, ex);
                self.carry.clear();
                o
            };
            self.pos += i as u64 + 1;
            self.done = start + len;
            self.oversize = false;
            // The first line after a retention jump may be the tail of a message the trim
            // cut through (a source that trims mid-line): if it does not parse, it belongs
            // to the trimmed bytes, and reading is in step again after its LF.
            if std::mem::take(&mut self.resync)
                && matches!(outcome, Some(Outcome::Skip(SkipKind::Unparseable)))
            {
                self.trims.push((start, len));
                continue;
            }
            let Some(outcome) = outcome else { continue }; // blank line: not a message
            let record = self.done_record;
            if let Some(r) = &mut self.done_record {
                *r += 1;
            }
            match outcome {
                Outcome::Entry { t_ms, t_end_ms } => {
                    batch.push(Entry {
                        t_ms,
                        t_end_ms,
                        offset: start,
                        len,
                        record,
                    });
                    self.max_span_ms = self.max_span_ms.max(t_end_ms - t_ms);
                    self.msgs.push((start, None));
                }
                Outcome::Skip(k) => self.msgs.push((start, Some(k))),
            }
        }
        // Unterminated remainder: keep it until its LF arrives.
        if !rest.is_empty() {
            if !self.oversize && self.carry.len() + rest.len() > crate::extract::MAX_MESSAGE_BYTES {
                self.oversize = true;
                self.carry = Vec::new();
            }
            if !self.oversize {
                self.carry.extend_from_slice(rest);
            }
            self.pos += rest.len() as u64;
        }
        if !batch.is_empty() {
            self.entries += batch.len();
            batch.sort_by_key(|e| e.key());
            self.runs.push(Arc::new(batch));
            if self.runs.len() > 8 {
                let merged = self.sorted_entries();
                self.runs = vec![Arc::new(merged)];
            }
        }
        if self.done > self.seg_start {
            self.mark_pending();
        }
    }

    fn sorted_entries(&self) -> Vec<Entry> {
        let mut all: Vec<Entry> = self.runs.iter().flat_map(|r| r.iter().copied()).collect();
        all.sort_by_key(|e| e.key());
        all
    }

    fn is_boundary(&self, off: u64) -> bool {
        off == self.done || self.msgs.binary_search_by_key(&off, |m| m.0).is_ok()
    }

    fn skipped_from(&self, cut: u64) -> Skipped {
        let mut s = Skipped::default();
        for (off, k) in &self.msgs {
            if let (true, Some(k)) = (*off >= cut, k) {
                s.count(*k);
            }
        }
        s
    }

    fn trimmed_from(&self, cut: u64) -> u64 {
        self.trims.iter().filter(|t| t.0 >= cut).map(|t| t.1).sum()
    }

    fn tail(&self) -> Tail {
        let mut skipped = Skipped::default();
        for (_, k) in &self.msgs {
            if let Some(k) = k {
                skipped.count(*k);
            }
        }
        Tail {
            base: self.seg_start,
            end: self.done,
            end_record: self.done_record,
            floor: self.floor,
            runs: self.runs.clone(),
            skipped,
            trimmed: self.trimmed_from(0),
            max_span_ms: self.max_span_ms,
        }
    }

    fn committed(&mut self) {
        self.seg_start = self.done;
        self.runs.clear();
        self.msgs.clear();
        self.trims.clear();
        self.max_span_ms = 0;
        self.commit_at = None;
        self.entries = 0;
    }
}

/// `None` for a blank line (not a message).
fn classify(line: &[u8], ex: &Extractor) -> Option<Outcome> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    Some(ex.extract(line))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::ExtractSpec;

    fn reg() -> Registration {
        Registration {
            id: "t".into(),
            stream_url: "http://127.0.0.1:1/s".into(),
            extract: ExtractSpec::captured_at(),
            start: manifest::Start::Retained,
            indexed_from_offset: source::offset_token(0),
            indexed_from_record: None,
            incarnation: None,
            restarted_from_incarnation: None,
            record_coordinates: false,
        }
    }

    #[test]
    fn retention_mid_line_resyncs_at_the_next_lf() {
        let reg = reg();
        let m = Manifest::initial(&reg);
        let ex = Extractor::compile(&reg.extract).expect("extractor");
        let mut ing = Ingest::start(&m, &reg, false, Duration::from_secs(5));
        let l1 = b"{\"captured_at\":1000}\n";
        let l2 = b"{\"nested\":{\"a\":1},\"captured_at\":2000}\n";
        let l3 = b"{\"captured_at\":3000}\n";
        ing.feed(l1, &ex);
        // The source trims into the middle of l2 before it is read.
        let cut = l1.len() + 12;
        ing.follow_retention(cut as u64, None);
        let mut rest = l2[12..].to_vec();
        rest.extend_from_slice(l3);
        ing.feed(&rest, &ex);
        let all = ing.sorted_entries();
        let times: Vec<i64> = all.iter().map(|e| e.t_ms).collect();
        assert_eq!(times, vec![1000, 3000]);
        assert_eq!(all[1].offset, (l1.len() + l2.len()) as u64);
        let t = ing.tail();
        assert_eq!(
            t.skipped,
            Skipped::default(),
            "the fragment is not 'unparseable'"
        );
        assert_eq!(
            t.trimmed,
            l2.len() as u64,
            "the whole cut message counts as trimmed"
        );
        assert_eq!(t.end, (l1.len() + l2.len() + l3.len()) as u64);
        // A trim on a message boundary keeps the next message, and a bad line after the
        // first one is counted as usual.
        let mut ing = Ingest::start(&m, &reg, false, Duration::from_secs(5));
        ing.follow_retention(l1.len() as u64, None);
        let mut rest = l2.to_vec();
        rest.extend_from_slice(b"not json\n");
        ing.feed(&rest, &ex);
        assert_eq!(ing.sorted_entries().len(), 1);
        assert_eq!(ing.tail().skipped.unparseable, 1);
        assert_eq!(ing.tail().trimmed, l1.len() as u64);
    }
}
