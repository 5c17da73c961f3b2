//! One index: its published manifest, its in-memory tail, the ingest loop that feeds both,
//! and the queries that read them.
//!
//! Readers never take a lock across I/O: they clone one `Arc<View>` (manifest + tail) and
//! work on that snapshot. The ingest task is the only writer of the view; it swaps in a new
//! `Arc` after every source read (tail grows: visible within milliseconds) and after every
//! successful manifest compare-and-swap (tail becomes durable).
//!
//! This module owns the index itself ([`Index`], its [`View`] and the services it shares
//! with every other index); the rest is split by concept:
//!
//! * `query`: the time-window query and its cursors' tokens, over
//! * `cursor`: the merge cursors over parts and tail runs;
//! * `status`: status changes from the API (resume) and from ingest (blocked, source gone,
//!   restarted);
//! * `owner`: the ingest task, following until it holds the claim, then owning;
//! * `ingest`: the owner's framing and classification of source bytes (no I/O);
//! * `commit`: publishing the tail as parts and a new manifest generation;
//! * `upkeep`: compaction and garbage collection.

mod commit;
mod cursor;
mod ingest;
mod owner;
mod query;
mod status;
mod upkeep;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::batch::{Packer, Sharded, ShardedStore};
use crate::cache::PartCache;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::extract::Extractor;
use crate::manifest::{self, Manifest, Registration, Skipped, Status, Versioned};
use crate::metrics::{Counting, IndexLabel, Metrics};
use crate::part::Entry;
use crate::source::SourceClient;
use crate::store::DynStore;

pub use query::{decode_cursor, encode_cursor, Query, QueryResult};
use upkeep::due_compaction;

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
        let index = Arc::new(Index {
            reg,
            ns,
            extractor,
            shared,
            view: RwLock::new(Arc::new(view)),
            stop: AtomicBool::new(false),
            stop_signal: tokio::sync::Notify::new(),
            orphans_possible: AtomicBool::new(orphans_possible),
        });
        index.report_status(&index.view().manifest);
        Ok(index)
    }

    pub fn view(&self) -> Arc<View> {
        lock_read(&self.view).clone()
    }

    fn set_view(&self, v: View) {
        self.report_status(&v.manifest);
        *lock_write(&self.view) = Arc::new(v);
    }

    /// `ursula_indexer_index_blocked`: every worker that has the index open follows its
    /// manifest, so an index blocked while no worker owns it still shows.
    fn report_status(&self, m: &Manifest) {
        let blocked = matches!(m.status, Status::Blocked { .. });
        self.shared
            .metrics
            .blocked
            .get_or_create(&IndexLabel::of(&self.reg.id))
            .set(i64::from(blocked));
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
}

/// The manifest or catalog `key` must exist (it is created before anything uses it).
fn missing(key: &str) -> Error {
    Error::Missing {
        key: key.to_string(),
    }
}
