//! Commit: publish the owner's tail as level-0 parts plus a new manifest generation, by
//! compare-and-swap. A manifest another worker advanced meanwhile is checked against what
//! this worker read from the same source bytes; a disagreement blocks the index.

use std::sync::Arc;

use super::ingest::Ingest;
use super::{missing, Index, View};
use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, PartMeta, Status};
use crate::metrics::IndexLabel;
use crate::part::{self, Entry};
use crate::store::{PutMode, StoreError};
use crate::time::day_start;

impl Index {
    /// Ok(true): committed (or nothing to do); Ok(false): must stop owning (blocked, or the
    /// manifest moved in a way that needs a fresh start).
    pub(super) async fn commit(&self, ing: &mut Ingest) -> Result<bool> {
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
    pub(super) async fn write_part(&self, entries: Vec<Entry>, level: u8) -> Result<PartMeta> {
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
