//! The worker: keeps one [`Index`] per registration in `CATALOG`, runs their ingest tasks,
//! and carries out the admin operations (register, unregister) as CATALOG compare-and-swaps.
//! Any number of workers may share one store prefix; each index is ingested by whichever
//! worker holds its claim, and every worker answers queries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::extract::{ExtractSpec, Extractor};
use crate::index::{Index, Shared};
use crate::manifest::{self, Catalog, Registration, RetiredNamespace, Start};
use crate::source::{self, HeadResult};
use crate::time::now_ms;

pub struct Coordinator {
    pub shared: Arc<Shared>,
    /// Every registration in the last CATALOG read, open or still opening.
    indexes: RwLock<HashMap<String, Arc<Slot>>>,
    catalog_etag: tokio::sync::Mutex<Option<String>>,
    /// Last CATALOG read succeeded (readiness).
    pub ready: AtomicBool,
    /// A catalog read and an attempt to open every one of its indexes (their manifests)
    /// have completed at least once: `/readyz` and systemd readiness.
    pub loaded: AtomicBool,
    /// A CATALOG read has succeeded at least once.
    catalog_read: AtomicBool,
    /// A background pass opening the slots that are not open yet is running.
    opening: AtomicBool,
    restarted: Arc<tokio::sync::Notify>,
    /// The ingest task of every index this worker opened; [`Coordinator::shutdown`] waits
    /// for them so that a stopping worker commits its tail and hands its claims back.
    ingest_tasks: std::sync::Mutex<tokio::task::JoinSet<()>>,
    /// Set by [`Coordinator::shutdown`]: an index opened after it stops at once.
    shutting_down: AtomicBool,
}

/// How many indexes a worker opens at once. Opening is a slot read from a shared shard
/// snapshot and, for a new index, a create-only slot write; writes issued together share
/// one shard PUT per linger window, so opening in parallel is what makes 10 000 indexes
/// cost ~32 PUTs instead of 10 000 sequential 30 ms linger windows.
pub const OPEN_CONCURRENCY: usize = 256;

/// How long a request for an index that is registered but not yet open waits for it
/// before it is answered 503 with `Retry-After`.
pub const OPEN_WAIT: Duration = Duration::from_secs(10);

/// One registration and, once opened, its index. The listener answers before every index
/// is open (a worker with 10 000 indexes would otherwise be deaf for minutes), so a slot
/// may be registered but not open yet; a request for it opens it at once rather than
/// waiting its turn in the background pass.
pub struct Slot {
    pub reg: Registration,
    index: tokio::sync::OnceCell<Arc<Index>>,
    /// Dropped from CATALOG (or replaced): an open still in flight stops what it opens.
    removed: AtomicBool,
}

pub enum Lookup {
    Open(Arc<Index>),
    /// Registered, but opening it is taking longer than [`OPEN_WAIT`].
    Opening,
    /// Registered, but opening it failed (the next request or background pass tries
    /// again).
    Failed(Error),
    Unknown,
}

/// The body of `PUT /v1/indexes/{id}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    pub stream_url: String,
    #[serde(default)]
    pub extract: Option<ExtractSpec>,
    #[serde(default)]
    pub timestamp_field: Option<String>,
    #[serde(default)]
    pub start: Option<Start>,
}

pub fn valid_id(id: &str) -> bool {
    (1..=122).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Coordinator {
    pub fn new(shared: Arc<Shared>) -> Arc<Coordinator> {
        Arc::new(Coordinator {
            shared,
            indexes: RwLock::new(HashMap::new()),
            catalog_etag: tokio::sync::Mutex::new(None),
            ready: AtomicBool::new(false),
            loaded: AtomicBool::new(false),
            opening: AtomicBool::new(false),
            catalog_read: AtomicBool::new(false),
            restarted: Arc::new(tokio::sync::Notify::new()),
            ingest_tasks: std::sync::Mutex::new(tokio::task::JoinSet::new()),
            shutting_down: AtomicBool::new(false),
        })
    }

    /// Stop every index's ingest task and wait (at most `timeout`) until each has
    /// committed what it indexed in memory and released its ingest claim, so that a worker
    /// started next on the same store claims at once instead of waiting out the lease.
    /// Returns how many tasks ended within the time (and how many were running).
    pub async fn shutdown(&self, timeout: Duration) -> (usize, usize) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let slots: Vec<Arc<Slot>> = self
            .indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for ix in slots.iter().filter_map(|s| s.index.get()) {
            ix.stop();
        }
        let mut tasks = std::mem::take(&mut *self.lock_tasks());
        let running = tasks.len();
        let mut ended = 0;
        let deadline = tokio::time::Instant::now() + timeout;
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
            ended += 1;
        }
        (ended, running)
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, tokio::task::JoinSet<()>> {
        self.ingest_tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Background loop: re-read CATALOG every poll interval (or at once after a restart)
    /// and purge retired namespaces past the grace window.
    pub async fn run(self: Arc<Self>) {
        let mut next_purge = std::time::Instant::now();
        loop {
            if let Err(e) = self.sync(false).await {
                tracing::warn!("catalog: {e}");
            }
            // Retries indexes whose open failed, and opens what the sync added.
            self.open_in_background();
            if std::time::Instant::now() >= next_purge {
                next_purge = std::time::Instant::now() + self.shared.cfg.gc_interval;
                if let Err(e) = self.purge_retired().await {
                    tracing::warn!("purge: {e}");
                }
                let grace = self.shared.cfg.gc_grace.as_millis() as i64;
                match crate::batch::gc_packs(&self.shared.shards, now_ms(), grace).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("gc: deleted {n} unreferenced packs"),
                    Err(e) => tracing::warn!("gc packs: {e}"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.shared.cfg.poll_interval) => {}
                _ = self.restarted.notified() => {}
            }
        }
    }

    /// The index `id` if it is open now.
    pub fn get(&self, id: &str) -> Option<Arc<Index>> {
        self.slot(id).and_then(|s| s.index.get().cloned())
    }

    fn slot(&self, id: &str) -> Option<Arc<Slot>> {
        self.indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// `(open, registered)`.
    pub fn open_counts(&self) -> (usize, usize) {
        let map = self.indexes.read().unwrap_or_else(|p| p.into_inner());
        let open = map.values().filter(|s| s.index.initialized()).count();
        (open, map.len())
    }

    /// The index `id`, opening it now (ahead of the background pass) if it is registered
    /// but not open yet, waiting at most [`OPEN_WAIT`].
    pub async fn lookup(&self, id: &str) -> Lookup {
        let Some(slot) = self.slot(id) else {
            return Lookup::Unknown;
        };
        if let Some(ix) = slot.index.get() {
            return Lookup::Open(ix.clone());
        }
        match tokio::time::timeout(OPEN_WAIT, self.open_slot(&slot)).await {
            Ok(Ok(ix)) => Lookup::Open(ix),
            Ok(Err(e)) => Lookup::Failed(e),
            Err(_) => Lookup::Opening,
        }
    }

    /// Open `slot` (once: concurrent callers wait for the same open) and start its ingest
    /// task. A failed open leaves the slot unopened for the next attempt.
    async fn open_slot(&self, slot: &Arc<Slot>) -> Result<Arc<Index>> {
        slot.index
            .get_or_try_init(|| async {
                let delay = self.shared.cfg.debug_open_delay;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let ix = Index::open(self.shared.clone(), slot.reg.clone()).await?;
                let mut tasks = self.lock_tasks();
                // Reap the tasks of indexes that ended (restarted or unregistered).
                while tasks.try_join_next().is_some() {}
                tasks.spawn(ix.clone().run(self.restarted.clone()));
                Ok::<_, Error>(ix)
            })
            .await
            .cloned()
            .inspect(|ix| {
                // `sync` sets `removed` before it looks at the cell, and we set the cell
                // before we look at `removed`: whichever comes second stops the index.
                if slot.removed.load(Ordering::SeqCst) || self.shutting_down.load(Ordering::SeqCst)
                {
                    ix.stop();
                }
            })
    }

    /// Open every slot that is not open yet, [`OPEN_CONCURRENCY`] at a time, in a task of
    /// its own (one at a time). When it has tried them all, the worker is `loaded`.
    pub fn open_in_background(self: &Arc<Self>) {
        if self.opening.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            me.open_pending().await;
            me.opening.store(false, Ordering::Release);
        });
    }

    async fn open_pending(self: &Arc<Self>) {
        let pending: Vec<Arc<Slot>> = self
            .indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| !s.index.initialized())
            .cloned()
            .collect();
        if !pending.is_empty() {
            let started = std::time::Instant::now();
            let total = pending.len();
            let next = Arc::new(AtomicUsize::new(0));
            let failed = Arc::new(AtomicUsize::new(0));
            let pending = Arc::new(pending);
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..OPEN_CONCURRENCY.min(total) {
                let (me, next, failed, pending) =
                    (self.clone(), next.clone(), failed.clone(), pending.clone());
                workers.spawn(async move {
                    while let Some(slot) = pending.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if slot.removed.load(Ordering::SeqCst) {
                            continue;
                        }
                        if let Err(e) = me.open_slot(slot).await {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(index = %slot.reg.id, "open: {e}");
                        }
                    }
                });
            }
            while workers.join_next().await.is_some() {}
            tracing::info!(
                "opened {} of {total} indexes in {:?}",
                total - failed.load(Ordering::Relaxed),
                started.elapsed()
            );
        }
        // Only after a catalog read: an empty map before one means "not read yet".
        if self.catalog_read.load(Ordering::Acquire) {
            self.loaded.store(true, Ordering::Release);
        }
    }

    /// Bring the set of open indexes in line with CATALOG (`force`: even if unchanged).
    pub async fn sync(&self, force: bool) -> Result<()> {
        let mut etag = self.catalog_etag.lock().await;
        let store = &self.shared.store;
        let catalog = if force || etag.is_none() {
            manifest::load::<Catalog>(store, manifest::CATALOG_KEY).await
        } else {
            match manifest::reload::<Catalog>(
                store,
                manifest::CATALOG_KEY,
                etag.as_deref().unwrap_or(""),
            )
            .await
            {
                Ok(None) => {
                    self.ready.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                other => other,
            }
        };
        let catalog = match catalog {
            Ok(c) => c,
            Err(e) => {
                // An unreadable catalog is never treated as empty: keep what is open.
                self.ready.store(false, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.ready.store(true, Ordering::Relaxed);
        let (regs, new_etag) = match catalog {
            Some(v) => (v.value.registrations, Some(v.etag)),
            None => (Vec::new(), None),
        };
        let current: HashMap<String, Arc<Slot>> = self
            .indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Only bookkeeping here: opening is left to `open_in_background` and to the
        // requests that need an index first.
        let mut next = HashMap::new();
        for reg in regs {
            let slot = match current.get(&reg.id) {
                Some(s) if s.reg == reg => s.clone(),
                _ => Arc::new(Slot {
                    reg: reg.clone(),
                    index: tokio::sync::OnceCell::new(),
                    removed: AtomicBool::new(false),
                }),
            };
            next.insert(reg.id.clone(), slot);
        }
        for (id, slot) in &current {
            if next.get(id).is_none_or(|n| !Arc::ptr_eq(n, slot)) {
                slot.removed.store(true, Ordering::SeqCst);
                if let Some(ix) = slot.index.get() {
                    ix.stop();
                }
                self.shared.metrics.forget(id);
            }
        }
        *self.indexes.write().unwrap_or_else(|p| p.into_inner()) = next;
        *etag = new_etag;
        self.catalog_read.store(true, Ordering::Release);
        Ok(())
    }

    pub async fn list(&self) -> Result<Vec<Registration>> {
        Ok(
            manifest::load::<Catalog>(&self.shared.store, manifest::CATALOG_KEY)
                .await?
                .map(|v| v.value.registrations)
                .unwrap_or_default(),
        )
    }

    pub async fn register(&self, id: &str, body: RegisterBody) -> Result<Registration> {
        let extract = match (body.extract, body.timestamp_field) {
            (Some(_), Some(_)) => return Err(Error::ExtractTwice),
            (Some(e), None) => e,
            (None, Some(f)) => ExtractSpec::legacy(&f),
            (None, None) => ExtractSpec::captured_at(),
        };
        Extractor::compile(&extract)?;
        let stream_url = source::canonical_url(&body.stream_url)?;
        let start = body.start.unwrap_or_default();
        let head = match self.shared.source.head(&stream_url).await {
            Ok(HeadResult::Ok(h)) => h,
            Ok(HeadResult::NotFound) => return Err(Error::SourceMissing),
            // The source answered, and said why: not "did not answer".
            Err(e @ Error::SourceRefused { .. }) => return Err(e),
            Err(e) => return Err(Error::SourceUnreachable(Box::new(e))),
        };
        if !source::is_indexable_type(&head.content_type) {
            return Err(Error::NotIndexable {
                content_type: head.content_type,
            });
        }
        let (from, from_record) = match start {
            Start::Retained => (head.retained_offset, head.record_first),
            Start::Tail => (head.next_offset, head.record_next),
        };
        let reg = Registration {
            id: id.to_string(),
            stream_url,
            extract,
            start,
            indexed_from_offset: source::offset_token(from),
            indexed_from_record: if head.record_coordinates {
                from_record
            } else {
                None
            },
            incarnation: head.incarnation.clone(),
            restarted_from_incarnation: None,
            record_coordinates: head.record_coordinates,
        };
        let candidate = reg.clone();
        let result = manifest::update::<Catalog, Result<Registration>>(
            &self.shared.store,
            manifest::CATALOG_KEY,
            32,
            |cur| {
                let mut next = cur.cloned().unwrap_or(Catalog {
                    version: 1,
                    ..Catalog::default()
                });
                if let Some(existing) = next.registrations.iter().find(|r| r.id == candidate.id) {
                    let same = existing.stream_url == candidate.stream_url
                        && existing.extract.digest() == candidate.extract.digest()
                        && existing.start == candidate.start;
                    return Ok((
                        None,
                        if same {
                            Ok(existing.clone())
                        } else {
                            Err(Error::RegisteredDifferently {
                                id: candidate.id.clone(),
                            })
                        },
                    ));
                }
                if let Some(other) = next
                    .registrations
                    .iter()
                    .find(|r| r.stream_url == candidate.stream_url)
                {
                    return Ok((
                        None,
                        Err(Error::StreamIndexed {
                            other: other.id.clone(),
                        }),
                    ));
                }
                if next
                    .retired
                    .iter()
                    .any(|t| t.namespace == candidate.namespace())
                {
                    return Ok((None, Err(Error::NamespaceRetired)));
                }
                next.registrations.push(candidate.clone());
                Ok((Some(next), Ok(candidate.clone())))
            },
        )
        .await?;
        let reg = result.0?;
        self.sync(true).await?;
        // Open it before answering, so the index is queryable when the client hears 201.
        if let Some(slot) = self.slot(id) {
            self.open_slot(&slot).await?;
        }
        Ok(reg)
    }

    /// Unregister: drop the registration and tombstone its namespace in one CAS.
    pub async fn unregister(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        let (found, _) = manifest::update::<Catalog, bool>(
            &self.shared.store,
            manifest::CATALOG_KEY,
            32,
            |cur| {
                let Some(cur) = cur else {
                    return Ok((None, false));
                };
                let Some(reg) = cur.registrations.iter().find(|r| r.id == id) else {
                    return Ok((None, false));
                };
                let mut next = cur.clone();
                next.retired.push(RetiredNamespace {
                    id: id.clone(),
                    namespace: reg.namespace(),
                    retired_at_ms: now_ms(),
                });
                next.registrations.retain(|r| r.id != id);
                Ok((Some(next), true))
            },
        )
        .await?;
        self.sync(true).await?;
        Ok(found)
    }

    /// Delete retired namespaces whose tombstone is older than the grace window.
    async fn purge_retired(&self) -> Result<()> {
        let Some(cat) =
            manifest::load::<Catalog>(&self.shared.store, manifest::CATALOG_KEY).await?
        else {
            return Ok(());
        };
        let grace = self.shared.cfg.gc_grace.as_millis() as i64;
        let now = now_ms();
        let due: Vec<RetiredNamespace> = cat
            .value
            .retired
            .iter()
            .filter(|t| now - t.retired_at_ms >= grace)
            .cloned()
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        for t in &due {
            // The manifest and claim live in shard slots, not under the prefix.
            for key in [
                manifest::current_key(&t.namespace),
                manifest::claim_key(&t.namespace),
            ] {
                self.shared
                    .store
                    .delete(&key)
                    .await
                    .map_err(Error::request(&key))?;
            }
            let prefix = manifest::ns_prefix(&t.namespace);
            let listed = self
                .shared
                .store
                .list(&prefix)
                .await
                .map_err(Error::request(&prefix))?;
            for l in listed {
                self.shared
                    .store
                    .delete(&l.key)
                    .await
                    .map_err(Error::request(&l.key))?;
            }
        }
        manifest::update::<Catalog, ()>(&self.shared.store, manifest::CATALOG_KEY, 32, |cur| {
            let Some(cur) = cur else {
                return Ok((None, ()));
            };
            let mut next = cur.clone();
            next.retired.retain(|t| !due.contains(t));
            Ok((Some(next), ()))
        })
        .await?;
        Ok(())
    }
}
