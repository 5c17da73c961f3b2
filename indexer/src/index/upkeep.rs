//! The owner's upkeep: time-disjoint compaction of a day's level-0 parts into level-1
//! parts, and garbage collection of parts no reader can need any more.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{missing, Index, View};
use crate::compact::Merge;
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, PartMeta};
use crate::time::now_ms;

impl Index {
    /// Time-disjoint compaction: when a day has `--compact-parts` level-0 parts, merge the
    /// oldest of them (bounded fan-in) with the level-1 parts whose time range they overlap
    /// into a new sorted run of level-1 parts split at `--compaction-max-entries`. Level-1
    /// parts of a day therefore never overlap in time, so manifest pruning keeps working.
    pub(super) async fn maybe_compact(&self) {
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
pub(super) fn due_compaction(m: &Manifest, compact_parts: usize) -> Option<(i64, Vec<PartMeta>)> {
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
