//! Index files and checkpoints: writing the completed pages out whenever enough of them
//! wait (and at every roll), and, when a checkpoint is due, capturing the head state in
//! slices and installing the file once the log is durable up to it (formats in
//! `crate::checkpoint` and `crate::index`).

use std::path::Path;
use std::time::Instant;

use bytes::Bytes;

use crate::error::StorageError;
use crate::index::{self, IndexFileNo};
use crate::limits::{
    CAPTURES_PER_SLICE, ENCODE_SLICE_BYTES, INDEX_FLUSH_BYTES, UNUSED_INDEX_FILES_CHECKPOINT,
};
use crate::position::SegmentNo;
use crate::record::Record;
use crate::slices::Slices;
use crate::stream::StreamId;
use crate::{checkpoint, segment};

use super::parted_map::PARTS;
use super::{FastSet, Shard};

impl Shard {
    /// Whether a checkpoint is due: after a roll, or once enough log was written since the
    /// last (see [`CheckpointLedger::due`]). The ratio to the last checkpoint's size keeps
    /// checkpoint writes at most a quarter of the log's, and a restart replays at most
    /// that many times the checkpoint it loads. Also once
    /// [`UNUSED_INDEX_FILES_CHECKPOINT`] index files are unused: only a checkpoint that
    /// does not name them lets them go.
    pub(super) fn checkpoint_due(&self) -> bool {
        self.unindexed_segment().is_some()
            || self.inner.index_files.borrow().unused_count() >= UNUSED_INDEX_FILES_CHECKPOINT
            || self
                .inner
                .checkpoints
                .borrow()
                .due(self.inner.cfg.checkpoint_bytes)
    }

    /// Write a checkpoint of every stream at the current head of the log, so the next start
    /// replays only what follows it (waiting for a checkpoint or cleaning in progress).
    /// Returns false if nothing was written (memory mode).
    pub async fn checkpoint(&self) -> Result<bool, StorageError> {
        if self.memory() {
            return Ok(false);
        }
        self.wait_for_upkeep().await;
        let result = self.write_checkpoint().await;
        self.inner.upkeep_busy.set(false);
        result.map(|()| true)
    }

    /// Callers hold `upkeep_busy`.
    pub(super) async fn write_checkpoint(&self) -> Result<(), StorageError> {
        let Some(dir) = self.log_dir() else {
            return Ok(());
        };
        let result = self.write_checkpoint_in(&dir).await;
        if result.is_err() {
            let _ = std::fs::remove_file(dir.join(checkpoint::TMP_NAME));
        }
        result
    }

    /// Take `upkeep_busy`, waiting for a checkpoint or a cleaning round in progress (the
    /// upkeep task's, when a caller asks for one) to finish first.
    pub(super) async fn wait_for_upkeep(&self) {
        while self.inner.upkeep_busy.replace(true) {
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// The newest sealed segment whose roll has not written an index file yet.
    pub(super) fn unindexed_segment(&self) -> Option<SegmentNo> {
        let write_seg = self.inner.log.borrow().as_ref()?.write_segment();
        let sealed = write_seg.prev()?;
        (sealed > self.inner.index_files.borrow().indexed_through()).then_some(sealed)
    }

    /// Bytes of completed pages that are not in an index file yet.
    pub(super) fn unwritten_page_bytes(&self) -> usize {
        self.inner
            .catalog
            .borrow()
            .resident()
            .map(|s| {
                let (chunks, msgs) = s.tables();
                chunks
                    .unwritten_pages()
                    .chain(msgs.unwritten_pages())
                    .map(Bytes::len)
                    .sum::<usize>()
            })
            .sum()
    }

    /// Whether enough completed pages wait in memory to write them out now
    /// ([`INDEX_FLUSH_BYTES`]), so that memory does not hold a whole segment's worth.
    pub(super) fn index_due(&self) -> bool {
        self.inner.log.borrow().is_some() && self.unwritten_page_bytes() >= INDEX_FLUSH_BYTES
    }

    /// Write the waiting pages out as an index file now (the upkeep task, when
    /// [`Self::index_due`]); the next checkpoint names the file.
    pub(super) async fn flush_index(&self) -> Result<(), StorageError> {
        let Some(dir) = self.log_dir() else {
            return Ok(());
        };
        self.wait_for_upkeep().await;
        let result = self.write_index(&dir).await;
        self.inner.upkeep_busy.set(false);
        result
    }

    /// Write every page not in an index file yet, and the saved state of every stream
    /// that is idle enough to go dormant, to a new index file; then let those pages leave
    /// memory and those streams sleep. Callers hold `upkeep_busy`.
    pub(super) async fn write_index(&self, dir: &Path) -> Result<(), StorageError> {
        // Every page completed so far is covered once this returns, so is every sealed
        // segment's roll.
        let sealed = self
            .inner
            .log
            .borrow()
            .as_ref()
            .and_then(|l| l.write_segment().prev());
        let mut slices = Slices::default();
        let sleepers = self.idle_streams(self.clock_ms(), &mut slices).await;
        let asleep: FastSet<StreamId> = sleepers.iter().map(|s| s.id()).collect();
        // Each page, and whose table it is in (stream, chunk table or record index). A
        // stream going to sleep carries its pages in its saved state.
        let (mut pages, mut owners) = (Vec::new(), Vec::new());
        for s in self.inner.catalog.borrow().resident() {
            if asleep.contains(&s.id) {
                continue;
            }
            let (chunks, msgs) = s.tables();
            for p in chunks.unwritten_pages() {
                pages.push(p.clone());
                owners.push((s.id, true));
            }
            for p in msgs.unwritten_pages() {
                pages.push(p.clone());
                owners.push((s.id, false));
            }
        }
        let mut number =
            IndexFileNo::after(self.last_lsn(), self.inner.index_files.borrow().newest());
        if number.is_none() && !sleepers.is_empty() {
            // No record since the newest file (a quiet shard): a file's number must be a
            // newer LSN, so log one, an image of a sleeper (its state as it is: replaying
            // it changes nothing).
            // Not through `state`, which would count as a use and keep the sleeper awake.
            let image = self
                .inner
                .catalog
                .borrow()
                .get(sleepers[0].id())
                .map(|s| s.image());
            if let Some(image) = image {
                self.log_record(&Record::Image(image), None)?;
            }
            number = IndexFileNo::after(self.last_lsn(), self.inner.index_files.borrow().newest());
        }
        // Without a number (no record since the newest file: only just after a restart),
        // the pages stay in memory and in the checkpoint until one arrives.
        let Some(number) = number.filter(|_| !pages.is_empty() || !sleepers.is_empty()) else {
            self.keep_awake(sleepers);
            self.indexed_through(sealed);
            return Ok(());
        };
        let started = Instant::now();
        let blobs: Vec<Bytes> = pages
            .iter()
            .cloned()
            .chain(sleepers.iter().map(|s| s.state().clone()))
            .collect();
        let written = index::write(dir, self.inner.cfg.shard, number, &blobs, &mut slices).await;
        let (file, offsets) = match written {
            Ok(w) => w,
            Err(e) => {
                self.keep_awake(sleepers);
                return Err(e.into());
            }
        };
        {
            let mut catalog = self.inner.catalog.borrow_mut();
            for (((id, chunk_table), page), &off) in owners.into_iter().zip(&pages).zip(&offsets) {
                let Some(s) = catalog.get_mut(id) else {
                    continue;
                };
                let at = crate::packed::DiskPage {
                    file: file.clone(),
                    off,
                    len: page.len() as u32,
                };
                // A page that changed meanwhile (the cleaner moved a chunk) stays in memory
                // for the next index file.
                let (chunks, msgs) = s.tables_mut();
                if chunk_table {
                    chunks.page_written(page, at);
                } else {
                    msgs.page_written(page, at);
                }
            }
        }
        let slept = sleepers.len();
        {
            let mut index_files = self.inner.index_files.borrow_mut();
            index_files.add(number, file.clone());
            index_files.wrote(self.clock_ms(), slept);
        }
        self.put_to_sleep(sleepers, &file, &offsets[pages.len()..], &mut slices)
            .await;
        let (slice_max, slice_cpu_max) = slices.longest();
        tracing::debug!(
            shard = self.inner.cfg.shard,
            file = number.get(),
            pages = pages.len(),
            sleepers = slept,
            bytes = blobs.iter().map(Bytes::len).sum::<usize>(),
            slice_max_us = slice_max.as_micros() as u64,
            slice_cpu_max_us = slice_cpu_max.as_micros() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "index file written"
        );
        self.indexed_through(sealed);
        Ok(())
    }

    /// Segments up to `sealed` have their completed pages in index files.
    fn indexed_through(&self, sealed: Option<SegmentNo>) {
        if let Some(sealed) = sealed {
            self.inner.index_files.borrow_mut().indexed(sealed);
        }
    }

    pub(super) async fn write_checkpoint_in(&self, dir: &Path) -> Result<(), StorageError> {
        let started = Instant::now();
        // Pages wait for the next file unless a roll or their size calls for one now: a few
        // pages are cheaper inline in the checkpoint than as a file of their own. Idle
        // streams go to sleep first too: under a heavy write load a checkpoint can be due
        // at every upkeep round, and a round that writes one writes no other index file,
        // so without this idle streams would wait for pages to fill 1 MiB (and each would
        // cost the checkpoint its whole state instead of a dormant entry).
        if self.unindexed_segment().is_some() || self.index_due() || self.sleep_due() {
            self.write_index(dir).await?;
        }
        let (segment, offset) = match self.inner.log.borrow().as_ref() {
            Some(l) => l.write_position(),
            None => return Ok(()),
        };
        let pos = checkpoint::Position {
            lsn: self.last_lsn(),
            segment,
            offset,
            next_id: self.inner.catalog.borrow().next_id(),
            last_incarnation: self.inner.catalog.borrow().last_incarnation(),
            blob_counter: self.inner.blobs.borrow().counter(),
        };
        let logged = self.inner.checkpoints.borrow().logged_bytes();
        // Index files no page points into: once this checkpoint (which does not name them)
        // is installed, nothing needs them. Counted before the capture, which holds pages
        // of the others.
        let unused = self.inner.index_files.borrow().unused();
        // The checkpoint is the head state after record `pos.lsn`: the streams are numbered
        // now, synchronously (a pass over the catalog's entries, and a copy of the segment
        // map: `capture_us` in the log below), and taken in slices with the core's
        // requests served in between. The catalog keeps each stream as it was until its
        // slice comes: a resident stream about to change is captured first, a dormant
        // entry that leaves is kept aside. A capture shares the tables' pages and frozen
        // blocks with the stream, and copies only their newest, unpacked entries.
        let capture_started = Instant::now();
        let listing = self.inner.catalog.borrow_mut().begin_checkpoint();
        let checkpoint_open = CheckpointOpen(self);
        let segments = self.inner.segments.borrow().snapshot();
        let capture_us = capture_started.elapsed().as_micros() as u64;
        // Encoding copies the pages not in an index file yet (up to a segment's worth) and
        // checksums everything. Wall time, so on a loaded host it includes preemption and
        // the io_uring completions that interrupts run on this thread: an upper bound on
        // the hold.
        let encode_started = Instant::now();
        let mut slices = Slices::default();
        // Room for the last checkpoint's size and an eighth more: growing the buffer would
        // copy it within one slice.
        let last_size = self.inner.checkpoints.borrow().last_size() as usize;
        let mut encoder = checkpoint::Encoder::with_capacity(last_size + last_size / 8);
        let mut since_yield = 0;
        for ids in listing.resident.chunks(CAPTURES_PER_SLICE) {
            slices.next().await;
            let captured: Vec<checkpoint::CapturedStream> = {
                let mut catalog = self.inner.catalog.borrow_mut();
                ids.iter()
                    .filter_map(|&id| catalog.capture_resident(id))
                    .collect()
            };
            for s in captured {
                encoder.push(s);
                if encoder.len() - since_yield >= ENCODE_SLICE_BYTES {
                    since_yield = encoder.len();
                    encoder.checksum();
                    slices.next().await;
                }
            }
            encoder.checksum();
        }
        // The dormant streams a part of the catalog's table per slice (a 256th of them).
        encoder.begin_dormant(listing.dormant as u64);
        let mut listed = 0;
        for part in 0..PARTS {
            slices.next().await;
            let catalog = self.inner.catalog.borrow();
            for id in catalog.listed_dormant_part(part) {
                let d = catalog.listed_dormant(id).ok_or(StorageError::Internal(
                    "a dormant stream left the catalog during its checkpoint",
                ))?;
                encoder.push_dormant(id, d.key, d.dormant, d.pins);
                listed += 1;
            }
            drop(catalog);
            encoder.checksum();
        }
        if listed != listing.dormant {
            return Err(StorageError::Internal(
                "a checkpoint listed other dormant streams than it began with",
            ));
        }
        drop(checkpoint_open);
        since_yield = encoder.len();
        encoder.begin_segments(segments.len() as u64);
        for (index, ids) in &segments {
            encoder.push_segment(*index, ids.iter().copied());
            if encoder.len() - since_yield >= ENCODE_SLICE_BYTES {
                since_yield = encoder.len();
                encoder.checksum();
                slices.next().await;
            }
        }
        let image = encoder.finish(self.inner.cfg.shard, pos);
        let (slice_max, slice_cpu_max) = slices.longest();
        let encode_us = encode_started.elapsed().as_micros() as u64;
        let bytes = image.len();
        let tmp = dir.join(checkpoint::TMP_NAME);
        segment::write_synced(&tmp, image).await?;
        // The checkpoint may only replace the log before it once that log is durable.
        self.commit(pos.lsn).durable().await?;
        segment::rename_durable(&tmp, &checkpoint::path(dir), dir).await?;
        self.inner
            .checkpoints
            .borrow_mut()
            .installed(logged, bytes as u64, pos.segment);
        for number in unused {
            let file = self.inner.index_files.borrow_mut().take(number);
            if let Some(f) = file {
                f.remove().await?;
            }
        }
        tracing::debug!(
            shard = self.inner.cfg.shard,
            lsn = pos.lsn.get(),
            bytes,
            capture_us,
            encode_us,
            slice_max_us = slice_max.as_micros() as u64,
            slice_cpu_max_us = slice_cpu_max.as_micros() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }
}

/// A checkpoint's capture in progress ([`super::catalog::Catalog::begin_checkpoint`]):
/// ended however the checkpoint ends, so the catalog stops keeping streams for it.
struct CheckpointOpen<'a>(&'a Shard);

impl Drop for CheckpointOpen<'_> {
    fn drop(&mut self) {
        self.0.inner.catalog.borrow_mut().end_checkpoint();
    }
}
