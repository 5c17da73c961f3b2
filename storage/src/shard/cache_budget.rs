//! The read cache's budget: how many bytes the shard's streams hold cached, which cached
//! runs exist in age order, and evicting the oldest durable ones while the shard holds more
//! than `cache_bytes`.
//!
//! [`CacheBudget`] owns the count and the queue; the runs themselves live in their streams
//! (see `Stream::recache`), reached through the catalog the caller lends it. The `Shard`
//! methods below only borrow the two and pass one to the other.
//!
//! Invariant (disk shards): `resident` is the sum of the resident streams'
//! `resident_bytes()`. Every change to a stream's cache goes through [`CacheBudget::added`]
//! or [`CacheBudget::released`]; `Shard::check_cache` asserts it in tests. A memory shard
//! counts nothing: its cache is the only copy of the data and is never evicted.

use std::collections::VecDeque;

use super::catalog::Catalog;
use super::Shard;
use crate::position::Offset;
use crate::record::AppendRec;
use crate::stream::StreamId;

pub(super) struct CacheBudget {
    /// Bytes the cache may hold before the oldest durable runs are dropped.
    budget: usize,
    /// Bytes cached now, across every resident stream.
    resident: usize,
    /// Cached runs (stream, run start), oldest first: the order in which to evict them. A
    /// run whose stream went dormant, was deleted or already dropped it is skipped.
    queue: VecDeque<(StreamId, Offset)>,
}

impl CacheBudget {
    pub(super) fn new(budget: usize) -> CacheBudget {
        CacheBudget {
            budget,
            resident: 0,
            queue: VecDeque::new(),
        }
    }

    /// Bytes cached now.
    pub(super) fn resident_bytes(&self) -> usize {
        self.resident
    }

    /// Heap bytes the queue holds.
    pub(super) fn heap_bytes(&self) -> usize {
        self.queue.capacity() * std::mem::size_of::<(StreamId, Offset)>()
    }

    /// Count `len` newly cached bytes of stream `id`, in the runs starting at `runs`.
    pub(super) fn added(&mut self, id: StreamId, len: usize, runs: impl Iterator<Item = Offset>) {
        self.resident += len;
        self.queue.extend(runs.map(|start| (id, start)));
    }

    /// Forget `len` cached bytes a stream let go of (retention, deletion, going dormant).
    /// Their queue entries stay, and are skipped when they reach the front.
    pub(super) fn released(&mut self, len: usize) {
        self.resident = self.resident.saturating_sub(len);
    }

    /// Drop the oldest durable cached runs until the cache fits its budget. A run still
    /// waiting for its flush goes to the back of the queue: a stream's open block can stay
    /// unflushed for as long as appends keep arriving, and must not hold up the rest.
    pub(super) fn evict_over_budget(&mut self, catalog: &mut Catalog) {
        let mut pending_seen = 0;
        while self.resident > self.budget && pending_seen < self.queue.len() {
            let Some((id, start)) = self.queue.pop_front() else {
                break;
            };
            // A stream that went dormant (or was deleted) left its runs behind already.
            match catalog.get_mut(id) {
                Some(s) if s.cache_pending(start) => {
                    self.queue.push_back((id, start));
                    pending_seen += 1;
                }
                Some(s) => {
                    let freed = s.evict(start);
                    self.released(freed);
                }
                None => {}
            }
        }
    }
}

impl Shard {
    /// Bytes currently cached in memory.
    pub fn resident_bytes(&self) -> usize {
        self.inner.cache.borrow().resident_bytes()
    }

    /// Account for the bytes an append just cached, then trim the cache.
    pub(super) fn cached(&self, id: StreamId, a: &AppendRec) {
        if self.memory() {
            // Nothing is evicted in memory mode: the cache is the only copy.
            if let Some(s) = self.inner.catalog.borrow_mut().get_mut(id) {
                s.drain_fresh_cache_runs();
            }
            return;
        }
        self.track_resident(id, a.data.len());
        self.evict_over_budget();
    }

    /// Count `len` newly cached bytes of stream `id`, and queue its new runs for eviction.
    pub(super) fn track_resident(&self, id: StreamId, len: usize) {
        let mut catalog = self.inner.catalog.borrow_mut();
        let mut cache = self.inner.cache.borrow_mut();
        match catalog.get_mut(id) {
            Some(s) => cache.added(id, len, s.drain_fresh_cache_runs()),
            None => cache.added(id, len, std::iter::empty()),
        }
    }

    /// Forget `len` cached bytes a stream let go of.
    pub(super) fn release_cached(&self, len: usize) {
        self.inner.cache.borrow_mut().released(len);
    }

    /// Drop the oldest durable cached runs until the cache fits its budget.
    pub(super) fn evict_over_budget(&self) {
        let mut catalog = self.inner.catalog.borrow_mut();
        self.inner
            .cache
            .borrow_mut()
            .evict_over_budget(&mut catalog);
    }

    /// Assert the cache invariant: the count is the sum of what the streams hold.
    #[cfg(test)]
    pub(super) fn check_cache(&self) {
        if self.memory() {
            return;
        }
        let held: usize = self
            .inner
            .catalog
            .borrow()
            .resident()
            .map(crate::stream::Stream::resident_bytes)
            .sum();
        assert_eq!(self.inner.cache.borrow().resident_bytes(), held);
    }
}
