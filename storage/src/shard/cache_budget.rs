//! The read cache's budget: which cached runs exist, in age order, and evicting the oldest
//! durable ones while the shard holds more than `cache_bytes`.

use super::*;

impl Shard {
    /// Bytes currently cached in memory.
    pub fn resident_bytes(&self) -> usize {
        self.inner.resident_bytes.get()
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
        self.inner
            .resident_bytes
            .set(self.inner.resident_bytes.get() + len);
        if let Some(s) = self.inner.catalog.borrow_mut().get_mut(id) {
            let mut queue = self.inner.evict_queue.borrow_mut();
            queue.extend(s.drain_fresh_cache_runs().map(|start| (id, start)));
        }
    }

    /// Drop the oldest durable cached runs until the cache fits its budget. A run still
    /// waiting for its flush goes to the back of the queue: a stream's open block can stay
    /// unflushed for as long as appends keep arriving, and must not hold up the rest.
    pub(super) fn evict_over_budget(&self) {
        let budget = self.inner.cfg.cache_bytes;
        let mut queue = self.inner.evict_queue.borrow_mut();
        let mut catalog = self.inner.catalog.borrow_mut();
        let mut pending_seen = 0;
        while self.inner.resident_bytes.get() > budget && pending_seen < queue.len() {
            let Some((id, start)) = queue.pop_front() else {
                break;
            };
            // A stream that went dormant (or was deleted) left its runs behind already.
            match catalog.get_mut(id) {
                Some(s) if s.cache_pending(start) => {
                    queue.push_back((id, start));
                    pending_seen += 1;
                }
                Some(s) => {
                    let freed = s.evict(start);
                    self.inner
                        .resident_bytes
                        .set(self.inner.resident_bytes.get().saturating_sub(freed));
                }
                None => {}
            }
        }
    }
}
