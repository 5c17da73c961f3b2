//! Sharing object-store requests between many small indexes.
//!
//! With one manifest object and one claim object per index, every commit costs an index
//! its own part PUT plus a manifest PUT, every claim renewal a PUT, and every worker that
//! follows an index polls two objects for it: requests grow linearly with the number of
//! indexes. Two layers make them grow with the number of *shards* instead:
//!
//! * [`ShardedStore`] wraps the real store and keeps every index's manifest
//!   (`indexes/<ns>/CURRENT`) and claim (`indexes/<ns>/claims/current.json`) as a *slot*
//!   in one of [`SHARDS`] shard objects (`shards/<k>.json`, `k` = hash of the namespace).
//!   Each slot has its own ETag (a hash of its bytes), and a slot write keeps its
//!   `If-Match` / `If-None-Match: *` meaning exactly: writes queued for one shard within a
//!   short linger window are checked one by one against a freshly read shard, applied,
//!   and published with one `If-Match` PUT of the shard (a lost race re-reads and
//!   re-checks). Reads are served from a per-shard snapshot at most `max_age` old, renewed
//!   by one conditional GET that all readers of the shard share, so a worker following
//!   10 000 indexes polls 32 objects, not 20 000. A stale read can only make a later
//!   conditional write fail, and every failed write leaves a fresh snapshot behind.
//! * [`Packer`] gathers the level-0 parts that several indexes commit in the same linger
//!   window into one create-only *pack* object (`packs/<blake3>.pack`). A part inside a
//!   pack is named `packs/<pack hash>/<offset>-<len>-<part hash>.parquet` and read with a
//!   range GET. Packs are deleted by [`gc_packs`] once no manifest slot (live or retired
//!   parts of any index) names them and they are older than the grace window.
//!
//! Commits and claim renewals are aligned to wall-clock multiples of their period, so the
//! indexes of a worker write in the same linger window and share both kinds of PUT.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::store::StoreResult;
use crate::store::{DynStore, Fetched, Listed, Object, ObjectStore, PutMode, StoreError};

/// Manifest shards. A fixed property of the layout: every worker sharing a prefix must
/// agree on it.
pub const SHARDS: usize = 32;
/// How long writes to one shard (or parts for one pack) gather before they are flushed.
pub const LINGER: Duration = Duration::from_millis(30);

pub fn shard_key(k: usize) -> String {
    format!("shards/{k:02}.json")
}

/// `(namespace)` when `key` is a manifest or claim slot.
fn slot_namespace(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("indexes/")?;
    let (ns, tail) = rest.split_once('/')?;
    (tail == "CURRENT" || tail == "claims/current.json").then_some(ns)
}

fn shard_of(ns: &str) -> usize {
    let h = blake3::hash(ns.as_bytes());
    let b = h.as_bytes();
    (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize) % SHARDS
}

fn slot_etag(bytes: &[u8]) -> String {
    format!("\"s{}\"", &blake3::hash(bytes).to_hex()[..32])
}

#[derive(Serialize, Deserialize, Default)]
struct ShardDoc {
    version: u32,
    /// slot key -> the slot's JSON document, as text.
    slots: BTreeMap<String, String>,
}

#[derive(Default)]
struct Snapshot {
    etag: Option<String>,
    slots: Arc<BTreeMap<String, Bytes>>,
    fetched: Option<Instant>,
}

enum Change {
    Put(Bytes, PutMode),
    Delete,
}

struct Op {
    key: String,
    change: Change,
    done: oneshot::Sender<StoreResult<String>>,
}

struct Shard {
    snap: tokio::sync::Mutex<Snapshot>,
    /// The slots of `snap` as last renewed or written, for readers that find `snap` busy
    /// with a GET or PUT: they read this rather than queue behind the request.
    published: Mutex<Option<Arc<BTreeMap<String, Bytes>>>>,
    queue: Mutex<Vec<Op>>,
    flushing: AtomicBool,
}

pub struct ShardedStore {
    inner: DynStore,
    shards: Vec<Arc<Shard>>,
    max_age: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ShardedStore {
    /// `max_age`: how stale a slot read may be (the poll interval is the natural choice).
    pub fn new(inner: DynStore, max_age: Duration) -> Arc<ShardedStore> {
        Arc::new(ShardedStore {
            inner,
            shards: (0..SHARDS)
                .map(|_| {
                    Arc::new(Shard {
                        snap: tokio::sync::Mutex::new(Snapshot::default()),
                        published: Mutex::new(None),
                        queue: Mutex::new(Vec::new()),
                        flushing: AtomicBool::new(false),
                    })
                })
                .collect(),
            max_age,
        })
    }

    pub fn inner(&self) -> &DynStore {
        &self.inner
    }

    /// Bring `snap` up to date with one conditional GET if it is older than `max_age`.
    async fn renew(&self, k: usize, snap: &mut Snapshot, max_age: Duration) -> StoreResult<()> {
        if snap.fetched.is_some_and(|t| t.elapsed() < max_age) {
            return Ok(());
        }
        let key = shard_key(k);
        match self
            .inner
            .get_if_changed(&key, snap.etag.as_deref())
            .await?
        {
            Fetched::Unchanged => {}
            Fetched::Missing => {
                snap.etag = None;
                snap.slots = Arc::new(BTreeMap::new());
            }
            Fetched::Changed(o) => {
                let doc: ShardDoc = sonic_rs::from_slice(&o.bytes)
                    .map_err(|e| StoreError::Other(format!("{key}: corrupt: {e}")))?;
                snap.slots = Arc::new(
                    doc.slots
                        .into_iter()
                        .map(|(k, v)| (k, Bytes::from(v)))
                        .collect(),
                );
                snap.etag = Some(o.etag);
            }
        }
        snap.fetched = Some(Instant::now());
        *lock(&self.shards[k].published) = Some(snap.slots.clone());
        Ok(())
    }

    /// The slots of shard `k`, at most `max_age` old, or, while another task holds the
    /// shard for a GET or PUT, as of its last renewal. Waiting instead made every reader
    /// of a shard (10 000 following indexes poll theirs every poll interval, and a
    /// starting worker opens them all) queue behind each renewal's round trip; a stale
    /// read only makes a later conditional write fail, as the module doc says.
    async fn slots(&self, k: usize) -> StoreResult<Arc<BTreeMap<String, Bytes>>> {
        let shard = &self.shards[k];
        let mut snap = match shard.snap.try_lock() {
            Ok(s) => s,
            Err(_) => {
                if let Some(s) = lock(&shard.published).clone() {
                    return Ok(s);
                }
                shard.snap.lock().await
            }
        };
        self.renew(k, &mut snap, self.max_age).await?;
        Ok(snap.slots.clone())
    }

    /// Every slot of every shard, freshly read (for GC of packs).
    pub async fn all_slots(&self) -> StoreResult<Vec<(String, Bytes)>> {
        let mut out = Vec::new();
        for k in 0..SHARDS {
            let mut snap = self.shards[k].snap.lock().await;
            self.renew(k, &mut snap, Duration::ZERO).await?;
            out.extend(snap.slots.iter().map(|(a, b)| (a.clone(), b.clone())));
        }
        Ok(out)
    }

    async fn enqueue(self: &Arc<Self>, key: &str, change: Change) -> StoreResult<String> {
        let Some(ns) = slot_namespace(key) else {
            return Err(StoreError::Other(format!("{key} is not a slot")));
        };
        let k = shard_of(ns);
        let (tx, rx) = oneshot::channel();
        lock(&self.shards[k].queue).push(Op {
            key: key.to_string(),
            change,
            done: tx,
        });
        if !self.shards[k].flushing.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move { me.flush_loop(k).await });
        }
        rx.await
            .map_err(|_| StoreError::Other("shard flush was dropped".into()))?
    }

    async fn flush_loop(self: Arc<Self>, k: usize) {
        let shard = self.shards[k].clone();
        loop {
            tokio::time::sleep(LINGER).await;
            let ops = std::mem::take(&mut *lock(&shard.queue));
            if ops.is_empty() {
                shard.flushing.store(false, Ordering::Release);
                // A writer may have queued between the take and the store.
                if lock(&shard.queue).is_empty() || shard.flushing.swap(true, Ordering::AcqRel) {
                    return;
                }
                continue;
            }
            self.flush(k, ops).await;
        }
    }

    /// Apply `ops` in order against a fresh shard and publish them with one PUT.
    async fn flush(&self, k: usize, ops: Vec<Op>) {
        let key = shard_key(k);
        let mut snap = self.shards[k].snap.lock().await;
        let mut last_err = String::from("too many shard conflicts");
        for _ in 0..16 {
            if let Err(e) = self.renew(k, &mut snap, Duration::ZERO).await {
                last_err = e.to_string();
                break;
            }
            let mut slots: BTreeMap<String, Bytes> = (*snap.slots).clone();
            let mut results: Vec<StoreResult<String>> = Vec::with_capacity(ops.len());
            let mut changed = false;
            for op in &ops {
                let cur = slots.get(&op.key);
                let r = match &op.change {
                    Change::Delete => {
                        changed |= slots.remove(&op.key).is_some();
                        Ok(String::new())
                    }
                    Change::Put(bytes, mode) => {
                        let ok = match (mode, cur) {
                            (PutMode::Overwrite, _) => true,
                            (PutMode::CreateOnly, c) => c.is_none(),
                            (PutMode::IfMatch(want), Some(c)) => &slot_etag(c) == want,
                            (PutMode::IfMatch(_), None) => false,
                        };
                        if ok {
                            slots.insert(op.key.clone(), bytes.clone());
                            changed = true;
                            Ok(slot_etag(bytes))
                        } else {
                            Err(StoreError::PreconditionFailed)
                        }
                    }
                };
                results.push(r);
            }
            if !changed {
                deliver(ops, results);
                return;
            }
            let doc = ShardDoc {
                version: 1,
                slots: slots
                    .iter()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
            };
            let bytes = match sonic_rs::to_vec(&doc) {
                Ok(b) => b,
                Err(e) => {
                    last_err = e.to_string();
                    break;
                }
            };
            let mode = match &snap.etag {
                Some(e) => PutMode::IfMatch(e.clone()),
                None => PutMode::CreateOnly,
            };
            match self.inner.put(&key, bytes.into(), mode).await {
                Ok(etag) => {
                    snap.etag = Some(etag);
                    snap.slots = Arc::new(slots);
                    snap.fetched = Some(Instant::now());
                    // Before the writers hear of success: a read after a write sees it.
                    *lock(&self.shards[k].published) = Some(snap.slots.clone());
                    deliver(ops, results);
                    return;
                }
                // Another worker wrote the shard: re-read it and re-check every op.
                Err(StoreError::PreconditionFailed) => snap.fetched = None,
                Err(e) => {
                    snap.fetched = None;
                    last_err = e.to_string();
                    break;
                }
            }
        }
        for op in ops {
            let _ = op
                .done
                .send(Err(StoreError::Other(format!("{key}: {last_err}"))));
        }
    }
}

fn deliver(ops: Vec<Op>, results: Vec<StoreResult<String>>) {
    for (op, r) in ops.into_iter().zip(results) {
        let _ = op.done.send(r);
    }
}

/// The store the rest of the crate sees: slots go to shards, everything else through.
#[derive(Clone)]
pub struct Sharded(pub Arc<ShardedStore>);

#[async_trait]
impl ObjectStore for Sharded {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        let Some(ns) = slot_namespace(key) else {
            return self.0.inner.get(key).await;
        };
        let slots = self.0.slots(shard_of(ns)).await?;
        Ok(slots.get(key).map(|b| Object {
            etag: slot_etag(b),
            bytes: b.clone(),
        }))
    }

    async fn get_if_changed(&self, key: &str, etag: Option<&str>) -> StoreResult<Fetched> {
        if slot_namespace(key).is_none() {
            return self.0.inner.get_if_changed(key, etag).await;
        }
        Ok(match self.get(key).await? {
            None => Fetched::Missing,
            Some(o) if Some(o.etag.as_str()) == etag => Fetched::Unchanged,
            Some(o) => Fetched::Changed(o),
        })
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> StoreResult<Option<Bytes>> {
        self.0.inner.get_range(key, start, len).await
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> StoreResult<String> {
        if slot_namespace(key).is_none() {
            return self.0.inner.put(key, bytes, mode).await;
        }
        self.0.enqueue(key, Change::Put(bytes, mode)).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        if slot_namespace(key).is_none() {
            return self.0.inner.delete(key).await;
        }
        self.0.enqueue(key, Change::Delete).await.map(|_| ())
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        self.0.inner.list(prefix).await
    }

    fn describe(&self) -> String {
        format!("{} ({SHARDS} manifest shards)", self.0.inner.describe())
    }
}

// ---------------------------------------------------------------------------------------
// Packs

/// A part stored inside a pack: `(pack object key, byte offset, length)`.
pub fn pack_member(key: &str) -> Option<(String, u64, u64)> {
    let rest = key.strip_prefix("packs/")?;
    let (pack, member) = rest.split_once('/')?;
    let member = member.strip_suffix(".parquet")?;
    let mut it = member.splitn(3, '-');
    let off = it.next()?.parse().ok()?;
    let len = it.next()?.parse().ok()?;
    it.next()?;
    Some((format!("packs/{pack}.pack"), off, len))
}

struct Pending {
    bytes: Bytes,
    done: oneshot::Sender<Result<String>>,
}

pub struct Packer {
    store: DynStore,
    queue: Mutex<Vec<Pending>>,
    flushing: AtomicBool,
}

impl Packer {
    pub fn new(store: DynStore) -> Arc<Packer> {
        Arc::new(Packer {
            store,
            queue: Mutex::new(Vec::new()),
            flushing: AtomicBool::new(false),
        })
    }

    /// Upload `part` inside the next pack; returns its member key.
    pub async fn write(self: &Arc<Self>, part: Bytes) -> Result<String> {
        let (tx, rx) = oneshot::channel();
        lock(&self.queue).push(Pending {
            bytes: part,
            done: tx,
        });
        if !self.flushing.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move { me.flush_loop().await });
        }
        rx.await.map_err(|_| Error::FlushDropped { what: "pack" })?
    }

    async fn flush_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(LINGER).await;
            let batch = std::mem::take(&mut *lock(&self.queue));
            if batch.is_empty() {
                self.flushing.store(false, Ordering::Release);
                if lock(&self.queue).is_empty() || self.flushing.swap(true, Ordering::AcqRel) {
                    return;
                }
                continue;
            }
            let mut pack = Vec::with_capacity(batch.iter().map(|p| p.bytes.len()).sum());
            let mut names = Vec::with_capacity(batch.len());
            for p in &batch {
                let off = pack.len();
                pack.extend_from_slice(&p.bytes);
                let h = blake3::hash(&p.bytes).to_hex();
                names.push((off, p.bytes.len(), h[..32].to_string()));
            }
            let hash = blake3::hash(&pack).to_hex()[..32].to_string();
            let key = format!("packs/{hash}.pack");
            // Content-addressed: "already exists" is as good as written.
            let r = match self.store.put(&key, pack.into(), PutMode::CreateOnly).await {
                Ok(_) | Err(StoreError::PreconditionFailed) => Ok(()),
                Err(e) => Err(Arc::new(e)),
            };
            for (p, (off, len, h)) in batch.into_iter().zip(names) {
                let _ = p.done.send(match &r {
                    Ok(()) => Ok(format!("packs/{hash}/{off}-{len}-{h}.parquet")),
                    Err(source) => Err(Error::PackUpload {
                        key: key.clone(),
                        source: source.clone(),
                    }),
                });
            }
        }
    }
}

/// Delete packs that no manifest slot names any more and that are older than `grace_ms`.
/// Packs are listed before the manifests are read, so a pack whose commit lands between
/// the two is young and protected by the grace window.
pub async fn gc_packs(store: &ShardedStore, now_ms: i64, grace_ms: i64) -> Result<usize> {
    let listed = store
        .inner
        .list("packs/")
        .await
        .map_err(Error::request("packs/"))?;
    let old: Vec<Listed> = listed
        .into_iter()
        .filter(|l| l.modified_ms.is_some_and(|t| now_ms - t >= grace_ms))
        .collect();
    if old.is_empty() {
        return Ok(0);
    }
    let mut referenced: HashSet<String> = HashSet::new();
    let slots = store.all_slots().await.map_err(Error::request("shards/"))?;
    for (key, bytes) in slots {
        if !key.ends_with("/CURRENT") {
            continue;
        }
        // A manifest that does not parse stops the collection: it may name any pack.
        let m: crate::manifest::Manifest = crate::manifest::parse(&key, &bytes)?;
        for k in m
            .parts
            .iter()
            .map(|p| &p.key)
            .chain(m.retired_parts.iter().map(|r| &r.key))
        {
            if let Some((pack, _, _)) = pack_member(k) {
                referenced.insert(pack);
            }
        }
    }
    let mut deleted = 0;
    for l in old {
        if !referenced.contains(&l.key) {
            store
                .inner
                .delete(&l.key)
                .await
                .map_err(Error::request(&l.key))?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// The next wall-clock multiple of `period` (at least `min_ahead` from now), so that
/// periodic writes of different indexes fall into the same linger window.
pub fn aligned(period: Duration, min_ahead: Duration) -> Instant {
    let p = period.as_millis().max(1) as i64;
    let now = crate::time::now_ms();
    let target = now + min_ahead.as_millis() as i64;
    let next = (target.div_euclid(p) + 1) * p;
    Instant::now() + Duration::from_millis((next - now).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(slot_namespace("indexes/a-b/CURRENT"), Some("a-b"));
        assert_eq!(
            slot_namespace("indexes/a-b/claims/current.json"),
            Some("a-b")
        );
        assert_eq!(slot_namespace("indexes/a-b/parts/x.parquet"), None);
        assert_eq!(slot_namespace("CATALOG"), None);
        assert_eq!(
            pack_member("packs/abc/10-20-def.parquet"),
            Some(("packs/abc.pack".to_string(), 10, 20))
        );
        assert_eq!(pack_member("indexes/x/parts/abc.parquet"), None);
    }

    #[tokio::test]
    async fn slot_cas_has_one_winner_per_etag() {
        let dir = tempfile::tempdir().expect("tmp");
        let inner: DynStore =
            Arc::new(crate::store::LocalStore::open(dir.path()).expect("local store"));
        let s = Sharded(ShardedStore::new(inner.clone(), Duration::from_millis(50)));
        let key = "indexes/n1/CURRENT";
        let e0 = s
            .put(key, Bytes::from_static(b"{\"a\":0}"), PutMode::CreateOnly)
            .await
            .expect("create");
        assert!(matches!(
            s.put(key, Bytes::from_static(b"{}"), PutMode::CreateOnly)
                .await,
            Err(StoreError::PreconditionFailed)
        ));
        // Eight writers race on the same ETag in one linger window: exactly one wins.
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = s.clone();
            let e0 = e0.clone();
            tasks.push(tokio::spawn(async move {
                s.put(
                    key,
                    Bytes::from(format!("{{\"a\":{}}}", i + 1)),
                    PutMode::IfMatch(e0),
                )
                .await
                .is_ok()
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.expect("join"));
        }
        assert_eq!(wins, 1);
        // A second process sees the winner through its own snapshot.
        let other = Sharded(ShardedStore::new(inner, Duration::from_millis(50)));
        let got = other.get(key).await.expect("get").expect("slot");
        assert_ne!(got.etag, e0);
        assert!(matches!(
            other.get_if_changed(key, Some(&got.etag)).await,
            Ok(Fetched::Unchanged)
        ));
        other.delete(key).await.expect("delete");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(s.get(key).await.expect("get").is_none());
    }
}
