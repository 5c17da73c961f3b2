//! The engine's half of the cold tier: which sealed segments have left the local disk, the
//! eviction that sends archived ones away while the local files exceed their budget, and
//! the reads of cold segments through the [`ColdStore`](crate::cold::ColdStore).
//!
//! ```text
//!  Shard::read ── span of a cold segment ──▶ blocks [start / B, (end-1) / B] of the segment
//!                                               │ cached?  ──yes──▶ copied out, verified
//!                                               ▼ no
//!                                           one fetch per block, shared by every waiter,
//!                                           admitted by the in-flight throttle,
//!                                           awaited like any other I/O, then cached (LRU)
//!  after a read that needed cold data ──▶ the blocks holding the stream's next
//!                                          COLD_READAHEAD_BYTES are fetched before it asks
//! ```
//!
//! Readahead follows the stream, not the log: in a log shared by many streams, a stream's
//! next chunks are rarely in the next block.
//!
//! Which segments are cold is not written down anywhere: a segment the checkpoint's segment
//! map names, below the position recovery replays from, whose file is gone, is cold (see
//! `recover`). Eviction only ever removes such segments, and with a cold tier configured
//! the cleaner's own deletions look the same to recovery (their chunks were relocated, so
//! nothing points into them and the next cleaning round drops them). What is written down
//! is *that* a shard has cold segments: [`COLD_MARKER`] in its directory, created before the
//! first eviction (and by a restore that leaves segments in S3), so a server started on it
//! without its cold tier refuses instead of serving streams with holes.

use std::collections::BTreeSet;
use std::sync::Arc;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::poll_fn;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::aligned::align_up;
use crate::cold::ColdStore;
use crate::error::{ArchiveLag, Corruption, StorageError};
use crate::limits::{
    COLD_BLOCK_BYTES, COLD_READAHEAD_BLOCKS_MAX, COLD_READAHEAD_BYTES, COLD_SEQUENTIAL_READ_BYTES,
    COLD_TRACKED_READERS_MAX,
};
use crate::position::{Offset, SegmentNo};
use crate::readback;
use crate::segment::{segment_path, DATA_START};
use crate::stream::{Piece, StreamId};

use super::{Shard, ShardConfig, MIN_SEGMENT_BYTES};

/// A file in a shard's directory saying some of its segments may be only in the cold tier.
pub const COLD_MARKER: &str = "cold-segments";
/// Default bound of the fetched blocks each shard keeps in memory.
pub const DEFAULT_COLD_CACHE_BYTES: usize = 64 << 20;
/// Default bound of the bytes of cold fetches in flight per shard.
pub const DEFAULT_COLD_IN_FLIGHT_BYTES: usize = 8 << 20;

/// The cold-tier state of one shard (present only when the shard has a cold tier).
pub(super) struct ColdTier {
    pub(super) store: Arc<dyn ColdStore>,
    shard: u32,
    /// Fetch unit: `COLD_BLOCK_BYTES`, or the whole segment if that is smaller.
    block: u64,
    segment_bytes: u64,
    /// Sealed segments whose local file is gone; always keys of `Inner::segments` too.
    pub(super) segments: RefCell<BTreeSet<SegmentNo>>,
    /// When each segment sealed (this run only): how long an unarchived one has waited.
    pub(super) sealed_at: RefCell<BTreeMap<SegmentNo, Instant>>,
    cache: RefCell<BlockCache>,
    fetches: RefCell<HashMap<(SegmentNo, u64), Rc<Fetch>>>,
    in_flight: Cell<usize>,
    in_flight_limit: usize,
    throttled: RefCell<Vec<Waker>>,
    /// Fetches started by readahead that no reader has joined yet.
    ahead_in_flight: Cell<usize>,
    /// Whether [`COLD_MARKER`] is known to exist (durably) in the shard's directory.
    pub(super) marked: Cell<bool>,
    /// Where each stream's last cold read ended (see [`COLD_SEQUENTIAL_READ_BYTES`]).
    last_read_end: RefCell<HashMap<StreamId, Offset>>,
}

impl ColdTier {
    pub(super) fn new(store: Arc<dyn ColdStore>, cfg: &ShardConfig) -> ColdTier {
        let segment_bytes = effective_segment_bytes(cfg);
        ColdTier {
            store,
            shard: cfg.shard,
            block: COLD_BLOCK_BYTES.min(segment_bytes),
            segment_bytes,
            segments: RefCell::new(BTreeSet::new()),
            sealed_at: RefCell::new(BTreeMap::new()),
            cache: RefCell::new(BlockCache::new(cfg.cold_cache_bytes)),
            fetches: RefCell::new(HashMap::new()),
            in_flight: Cell::new(0),
            in_flight_limit: cfg.cold_in_flight_bytes.max(1),
            throttled: RefCell::new(Vec::new()),
            ahead_in_flight: Cell::new(0),
            marked: Cell::new(false),
            last_read_end: RefCell::new(HashMap::new()),
        }
    }

    pub(super) fn is_cold(&self, segment: SegmentNo) -> bool {
        self.segments.borrow().contains(&segment)
    }

    /// Bytes of cold fetches in flight now.
    pub(super) fn bytes_in_flight(&self) -> usize {
        self.in_flight.get()
    }

    pub(super) fn cached_bytes(&self) -> usize {
        self.cache.borrow().bytes
    }

    /// Forget a segment that is gone from the cold tier's view (cleaned).
    pub(super) fn forget(&self, segment: SegmentNo) {
        self.segments.borrow_mut().remove(&segment);
        self.sealed_at.borrow_mut().remove(&segment);
        self.cache.borrow_mut().drop_segment(segment);
    }

    fn block_len(&self, k: u64) -> usize {
        let start = k * self.block;
        (self.block.min(self.segment_bytes.saturating_sub(start))) as usize
    }
}

/// The segment size a shard's log uses for `cfg` (raised to what the largest record needs,
/// block-aligned).
pub(super) fn effective_segment_bytes(cfg: &ShardConfig) -> u64 {
    align_up(cfg.segment_bytes.max(if cfg.tiny_segments {
        4 * DATA_START
    } else {
        MIN_SEGMENT_BYTES
    }) as usize) as u64
}

/// Create [`COLD_MARKER`] in `dir` durably (the file and its directory entry), before any
/// segment leaves: a crash in between leaves a marker and no cold segment, which is only
/// a conservative refusal to start without the cold tier.
pub fn write_cold_marker(dir: &Path) -> io::Result<()> {
    let path = dir.join(COLD_MARKER);
    std::fs::write(
        &path,
        b"some sealed segments of this shard are only in the S3 cold tier\n",
    )?;
    std::fs::File::open(&path)?.sync_all()?;
    crate::segment::sync_dir(dir)
}

impl Shard {
    pub(super) fn cold_tier(&self) -> Option<&ColdTier> {
        self.inner.cold.as_ref()
    }

    /// Whether `segment` is only in the cold tier.
    pub(super) fn is_cold(&self, segment: SegmentNo) -> bool {
        self.cold_tier().is_some_and(|t| t.is_cold(segment))
    }

    /// Segment files on the local disk, the open one included.
    pub(super) fn local_segments(&self) -> usize {
        let cold = self.cold_tier().map_or(0, |t| t.segments.borrow().len());
        self.inner.segments.borrow().len() - cold
    }

    /// Delete the local files of archived sealed segments, oldest first, while the shard's
    /// local segment files exceed `local_bytes`. Never the open segment, never one at or
    /// after the checkpoint's position (recovery replays from there and needs it locally),
    /// never one the cleaner is working on (both hold `upkeep_busy`). Returns how many left.
    ///
    /// The files are unlinked on a helper thread, awaited without holding the core: on the
    /// core's thread, unlinking preallocated segments took appends' p99 to 150-200 ms
    /// (47-58 ms without eviction); off it, the p99 of evicting runs is within the spread
    /// of runs without eviction (storage bench, `cold` section). No
    /// directory sync is needed: a file that comes back after a crash is simply a local
    /// segment again.
    pub async fn evict_archived(&self) -> Result<usize, StorageError> {
        if self.cold_tier().is_none() || self.inner.cfg.local_bytes.is_none() {
            return Ok(0);
        }
        self.wait_for_upkeep().await;
        let doomed = self.evict_over_local_budget();
        self.inner.upkeep_busy.set(false);
        let doomed = doomed?;
        if doomed.is_empty() {
            return Ok(0);
        }
        let evicted = doomed.len();
        let marker = self
            .cold_tier()
            .filter(|t| !t.marked.get())
            .and_then(|_| doomed.first())
            .and_then(|p| p.parent())
            .map(Path::to_path_buf);
        let unlink = std::thread::Builder::new()
            .name(format!("ursula-evict-{}", self.inner.cfg.shard))
            .spawn(move || -> io::Result<()> {
                if let Some(dir) = marker {
                    write_cold_marker(&dir)?;
                }
                for path in doomed {
                    match std::fs::remove_file(&path) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
                Ok(())
            })?;
        while !unlink.is_finished() {
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
        match unlink.join() {
            Ok(result) => {
                result?;
                if let Some(t) = self.cold_tier() {
                    t.marked.set(true);
                }
            }
            Err(_) => return Err(StorageError::Internal("segment unlink thread panicked")),
        }
        Ok(evicted)
    }

    /// Mark the segments to evict cold and let go of their handles; returns the files to
    /// delete. Callers hold `upkeep_busy`.
    pub(super) fn evict_over_local_budget(&self) -> Result<Vec<PathBuf>, StorageError> {
        let (Some(tier), Some(budget)) = (self.cold_tier(), self.inner.cfg.local_bytes) else {
            return Ok(Vec::new());
        };
        if tier.store.stopped() {
            return Ok(Vec::new());
        }
        let Some(checkpoint_segment) = self.inner.checkpoints.borrow().replay_from() else {
            return Ok(Vec::new());
        };
        let Some((write_seg, dir)) = self
            .inner
            .log
            .borrow()
            .as_ref()
            .map(|l| (l.write_segment(), l.dir().to_path_buf()))
        else {
            return Ok(Vec::new());
        };
        let seg_bytes = self.segment_bytes();
        let mut local = self.local_segments() as u64 * seg_bytes;
        if local <= budget {
            return Ok(Vec::new());
        }
        let candidates: Vec<SegmentNo> = self
            .inner
            .segments
            .borrow()
            .segments()
            .filter(|&s| s < write_seg && s < checkpoint_segment && !tier.is_cold(s))
            .collect();
        let mut doomed = Vec::new();
        for segment in candidates {
            if local <= budget {
                break;
            }
            if !tier.store.is_archived(self.inner.cfg.shard, segment) {
                continue;
            }
            tier.segments.borrow_mut().insert(segment);
            // An open handle would keep the file's blocks allocated; reads already holding
            // one finish on it.
            self.inner.readers.borrow_mut().remove(&segment);
            if let Some(log) = self.inner.log.borrow_mut().as_mut() {
                log.forget_segment(segment);
            }
            doomed.push(segment_path(&dir, segment));
            local -= seg_bytes;
            tracing::debug!(
                shard = self.inner.cfg.shard,
                segment = segment.get(),
                "segment evicted"
            );
        }
        let mut stats = self.inner.stats.get();
        stats.evicted_segments += doomed.len() as u64;
        self.inner.stats.set(stats);
        Ok(doomed)
    }

    /// The error for a full disk: with a cold tier, it names the sealed segments that
    /// cannot leave because they are not archived yet (the archive lag), if there are any.
    pub(super) fn no_space(&self) -> StorageError {
        let Some(tier) = self.cold_tier() else {
            return StorageError::NoSpace;
        };
        let write_seg = self
            .inner
            .log
            .try_borrow()
            .ok()
            .and_then(|l| l.as_ref().map(|l| l.write_segment()))
            .unwrap_or_default();
        let waiting: Vec<SegmentNo> = self
            .inner
            .segments
            .borrow()
            .segments()
            .filter(|&s| s < write_seg && !tier.is_cold(s))
            .filter(|&s| !tier.store.is_archived(self.inner.cfg.shard, s))
            .collect();
        let Some(&oldest) = waiting.first() else {
            return StorageError::NoSpace;
        };
        let oldest_sealed_secs = tier
            .sealed_at
            .borrow()
            .get(&oldest)
            .map(|t| t.elapsed().as_secs());
        StorageError::NoSpaceUnarchived(ArchiveLag {
            segments: waiting.len(),
            bytes: waiting.len() as u64 * self.segment_bytes(),
            oldest_sealed_secs,
        })
    }

    /// Segment bytes `[start, end)` of cold `segment`, copied out of its fetched blocks (so
    /// the caches never pin a whole block for one record). Returns them and `start`.
    pub(super) async fn read_cold(
        &self,
        segment: SegmentNo,
        start: u64,
        end: u64,
    ) -> Result<(Bytes, u64), StorageError> {
        let Some(tier) = self.cold_tier() else {
            return Err(StorageError::Internal("cold read without a cold tier"));
        };
        let first = start / tier.block;
        let last = (end.max(start + 1) - 1) / tier.block;
        let blocks = readback::join_all(
            (first..=last)
                .map(|k| self.cold_block(segment, k))
                .collect(),
        )
        .await;
        let mut out = BytesMut::with_capacity((end - start) as usize);
        for (k, block) in (first..=last).zip(blocks) {
            let block = block?;
            let block_start = k * tier.block;
            let from = start.max(block_start) - block_start;
            let to = end.min(block_start + tier.block) - block_start;
            if (block.len() as u64) < to {
                return Err(Corruption::ColdBlockShort {
                    segment,
                    position: block_start,
                    got: block.len() as u64,
                    needed: to,
                }
                .into());
            }
            out.extend_from_slice(&block[from as usize..to as usize]);
        }
        Ok((out.freeze(), start))
    }

    /// Block `k` of cold `segment`, from the cache or fetched.
    async fn cold_block(&self, segment: SegmentNo, k: u64) -> Result<Bytes, StorageError> {
        let Some(tier) = self.cold_tier() else {
            return Err(StorageError::Internal("cold read without a cold tier"));
        };
        let cached = tier.cache.borrow_mut().get((segment, k));
        let mut stats = self.inner.stats.get();
        if cached.is_some() {
            stats.cold_cache_hits += 1;
        } else {
            stats.cold_cache_misses += 1;
        }
        self.inner.stats.set(stats);
        if let Some(block) = cached {
            return Ok(block);
        }
        let fetch = self.fetch_block(segment, k);
        if fetch.ahead.replace(false) {
            tier.ahead_in_flight.set(tier.ahead_in_flight.get() - 1);
        }
        fetch.wait().await.map_err(|why| {
            StorageError::Io(io::Error::new(
                why.kind(),
                format!(
                    "cold read of segment {segment} at {}: {why}",
                    k * tier.block
                ),
            ))
        })
    }

    /// After a read of stream `id` from `from` to `to` that needed cold data: whether it
    /// looks like catch-up reading, which readahead serves (long, or continuing the
    /// stream's previous cold read), rather than a random small read.
    pub(super) fn cold_read_is_sequential(&self, id: StreamId, from: Offset, to: Offset) -> bool {
        let Some(tier) = self.cold_tier() else {
            return false;
        };
        let mut last = tier.last_read_end.borrow_mut();
        let continues = last.get(&id) == Some(&from);
        if last.len() >= COLD_TRACKED_READERS_MAX && !last.contains_key(&id) {
            last.clear();
        }
        last.insert(id, to);
        continues || to.saturating_since(from) >= COLD_SEQUENTIAL_READ_BYTES
    }

    /// After a catch-up read of stream `id` up to `to` that needed cold data: start fetching the
    /// cold blocks that hold the stream's next [`COLD_READAHEAD_BYTES`], unless cached or being
    /// fetched, while the throttle has room for them at once (readahead never waits for
    /// room, so it cannot delay a reader's own fetches).
    pub(super) fn read_ahead(&self, id: StreamId, to: Offset) {
        let Some(tier) = self.cold_tier() else { return };
        let plan = match self.inner.catalog.borrow_mut().get_mut(id) {
            Some(s) => s.read_plan(to, to.saturating_add(COLD_READAHEAD_BYTES)),
            None => return,
        };
        // Blocks fetched ahead for all readers together, not read yet, may fill half the
        // cache: more would push each other (and blocks in use) out before they are read.
        let unread_most = tier.cache.borrow().limit / tier.block as usize / 2;
        let mut started = 0;
        for piece in plan {
            let Piece::Disk { loc, .. } = piece else {
                continue;
            };
            if !tier.is_cold(loc.segment) {
                continue;
            }
            let first = loc.record_pos / tier.block;
            let last = (loc.record_pos + u64::from(loc.record_len) - 1) / tier.block;
            for k in first..=last {
                let key = (loc.segment, k);
                if tier.cache.borrow().contains(key) || tier.fetches.borrow().contains_key(&key) {
                    continue;
                }
                let unread = tier.cache.borrow().unread + tier.ahead_in_flight.get();
                if started == COLD_READAHEAD_BLOCKS_MAX
                    || unread >= unread_most
                    || tier.in_flight.get() + tier.block_len(k) > tier.in_flight_limit
                {
                    return;
                }
                self.fetch_block(loc.segment, k).ahead.set(true);
                tier.ahead_in_flight.set(tier.ahead_in_flight.get() + 1);
                started += 1;
                let mut stats = self.inner.stats.get();
                stats.cold_prefetches += 1;
                self.inner.stats.set(stats);
            }
        }
    }

    /// The fetch of block `k` of `segment`: the one in flight, or a new one. Each runs as
    /// its own task, so a reader that goes away does not waste it: the block is cached.
    fn fetch_block(&self, segment: SegmentNo, k: u64) -> Rc<Fetch> {
        let tier = self
            .cold_tier()
            .expect("fetches only happen with a cold tier");
        if let Some(f) = tier.fetches.borrow().get(&(segment, k)) {
            return f.clone();
        }
        let fetch = Rc::new(Fetch::default());
        tier.fetches
            .borrow_mut()
            .insert((segment, k), fetch.clone());
        let shard = self.clone();
        let done = fetch.clone();
        let (offset, len) = (k * tier.block, tier.block_len(k));
        monoio::spawn(async move {
            let Some(tier) = shard.cold_tier() else {
                return;
            };
            admit(tier, len).await;
            let result = tier.store.read(tier.shard, segment, offset, len).await;
            tier.in_flight.set(tier.in_flight.get() - len);
            for w in tier.throttled.borrow_mut().drain(..) {
                w.wake();
            }
            tier.fetches.borrow_mut().remove(&(segment, k));
            let unread = done.ahead.replace(false);
            if unread {
                tier.ahead_in_flight.set(tier.ahead_in_flight.get() - 1);
            }
            let result = match result {
                Ok(block) => {
                    let mut stats = shard.inner.stats.get();
                    stats.cold_reads += 1;
                    stats.cold_read_bytes += block.len() as u64;
                    shard.inner.stats.set(stats);
                    // A segment cleaned meanwhile is not cached again.
                    if tier.is_cold(segment) {
                        tier.cache
                            .borrow_mut()
                            .insert((segment, k), block.clone(), unread);
                    }
                    Ok(block)
                }
                Err(e) => Err(Rc::new(e)),
            };
            done.complete(result);
        });
        fetch
    }
}

/// Wait until `len` more bytes of cold fetches fit in the shard's in-flight budget (one
/// fetch is always admitted, however large).
async fn admit(tier: &ColdTier, len: usize) {
    poll_fn(|cx| {
        let used = tier.in_flight.get();
        if used == 0 || used + len <= tier.in_flight_limit {
            tier.in_flight.set(used + len);
            Poll::Ready(())
        } else {
            tier.throttled.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        }
    })
    .await
}

/// One block fetch, awaited by every reader that wants the block meanwhile.
#[derive(Default)]
struct Fetch {
    /// The block, or the store's error (shared by every reader of the fetch).
    result: RefCell<Option<Result<Bytes, Rc<io::Error>>>>,
    waiters: RefCell<Vec<Waker>>,
    /// Started by readahead, and no reader has joined it yet.
    ahead: Cell<bool>,
}

impl Fetch {
    fn complete(&self, result: Result<Bytes, Rc<io::Error>>) {
        *self.result.borrow_mut() = Some(result);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    async fn wait(&self) -> Result<Bytes, Rc<io::Error>> {
        poll_fn(|cx| match self.result.borrow().as_ref() {
            Some(r) => Poll::Ready(r.clone()),
            None => {
                self.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// Fetched blocks, least recently used out once they exceed their byte budget.
struct BlockCache {
    blocks: HashMap<(SegmentNo, u64), Cached>,
    /// Use stamp → block, oldest first.
    order: BTreeMap<u64, (SegmentNo, u64)>,
    clock: u64,
    bytes: usize,
    limit: usize,
    /// Blocks read ahead that nobody has read yet.
    unread: usize,
}

struct Cached {
    block: Bytes,
    stamp: u64,
    unread: bool,
}

impl BlockCache {
    fn new(limit: usize) -> BlockCache {
        BlockCache {
            blocks: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            bytes: 0,
            limit,
            unread: 0,
        }
    }

    fn contains(&self, key: (SegmentNo, u64)) -> bool {
        self.blocks.contains_key(&key)
    }

    fn get(&mut self, key: (SegmentNo, u64)) -> Option<Bytes> {
        let c = self.blocks.get_mut(&key)?;
        self.order.remove(&c.stamp);
        self.clock += 1;
        c.stamp = self.clock;
        self.order.insert(self.clock, key);
        if std::mem::take(&mut c.unread) {
            self.unread -= 1;
        }
        Some(c.block.clone())
    }

    /// Cache `block`; `unread` if it was read ahead and nobody has read it yet.
    fn insert(&mut self, key: (SegmentNo, u64), block: Bytes, unread: bool) {
        if block.len() > self.limit {
            return;
        }
        self.remove(key);
        self.clock += 1;
        self.bytes += block.len();
        self.unread += usize::from(unread);
        let stamp = self.clock;
        self.blocks.insert(
            key,
            Cached {
                block,
                stamp,
                unread,
            },
        );
        self.order.insert(stamp, key);
        while self.bytes > self.limit {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.forget(oldest);
        }
    }

    fn remove(&mut self, key: (SegmentNo, u64)) {
        if let Some(c) = self.blocks.get(&key) {
            self.order.remove(&c.stamp);
            self.forget(key);
        }
    }

    /// Drop a block whose stamp is already out of `order`.
    fn forget(&mut self, key: (SegmentNo, u64)) {
        if let Some(c) = self.blocks.remove(&key) {
            self.bytes -= c.block.len();
            self.unread -= usize::from(c.unread);
        }
    }

    fn drop_segment(&mut self, segment: SegmentNo) {
        let keys: Vec<(SegmentNo, u64)> = self
            .blocks
            .keys()
            .filter(|k| k.0 == segment)
            .copied()
            .collect();
        for k in keys {
            self.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::seg;

    #[test]
    fn the_block_cache_drops_the_least_recently_used_first() {
        let mut c = BlockCache::new(3);
        let b = || Bytes::from_static(b"x");
        c.insert((seg(1), 0), b(), false);
        c.insert((seg(1), 1), b(), true);
        c.insert((seg(1), 2), b(), true);
        assert_eq!(c.unread, 2);
        assert!(c.get((seg(1), 0)).is_some(), "touched: now the newest");
        assert!(c.get((seg(1), 2)).is_some(), "read: no longer unread");
        assert_eq!(c.unread, 1);
        c.insert((seg(2), 0), b(), false);
        assert_eq!(c.unread, 0, "the unread block went unread");
        assert!(!c.contains((seg(1), 1)), "the least recently used went");
        assert!(c.contains((seg(1), 0)) && c.contains((seg(1), 2)) && c.contains((seg(2), 0)));
        assert_eq!(c.order.len(), 3);
        assert_eq!(c.bytes, 3);
        c.drop_segment(seg(1));
        assert_eq!((c.bytes, c.blocks.len(), c.order.len()), (1, 1, 1));
        c.insert((seg(3), 0), Bytes::from_static(b"toolarge"), false);
        assert!(
            !c.contains((seg(3), 0)),
            "a block larger than the cache is not kept"
        );
    }
}
