//! Dormant streams: a stream unused for [`ShardConfig::idle_after`] is saved to an index
//! file and leaves memory, and comes back on first use.
//!
//! A resident stream costs a few KiB however idle it is: its tables' newest entries,
//! producers, cache and hash-table slots. A telemetry server keeps many streams nobody
//! touches any more (one per browser session, or per service and day), so the upkeep task
//! saves each idle stream's state, exactly what a checkpoint holds for it, into the next
//! index file, and the catalog keeps only a [`Dormant`] entry: where the state is, when the
//! stream expires and how much data it holds (about 60 bytes beside its key).
//!
//! Only a stream with nothing in flight sleeps: everything it accepted is durable and
//! visible, and no reader waits on it. Its state is saved while it stays resident and
//! serving; once the file is durable it goes dormant only if nothing changed it meanwhile.
//! The first use of a dormant stream reads its state back (one `pread` of a few hundred
//! bytes, checked against its CRC) before anything else happens to it. Checkpoints name a
//! dormant stream's saved state instead of repeating it, so a restart loads a dormant
//! stream as dormant, and an index file stays as long as a dormant stream's state (or a
//! page of its tables) is in it.
//!
//! ```text
//! saved state: CRC32C of the rest (4 bytes), a framed Image record, the chunk table and
//!              the record index (`Packed::encode_into`), the last access (signed varint)
//! ```

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::FormatError;
use crate::index::{IndexFile, IndexFileNo};
use crate::limits::{
    ENCODE_SLICE_BYTES, SLEEPERS_PER_ROUND_MAX, SLEEPS_PER_SLICE, STATE_MOVES_PER_ROUND,
    STATE_MOVES_PER_SLICE,
};
use crate::packed::{get_signed, put_signed, DiskPage, Packed};
use crate::position::Lsn;
use crate::record::{decode_at, ImageRec, Record};
use crate::stream::{Stream, StreamId};

use super::catalog::Dormant;
use super::parted_map::PARTS;
use super::Shard;
use crate::slices::Slices;

/// A stream's state, saved to go dormant, waiting for its index file.
pub(super) struct Sleeper {
    id: StreamId,
    /// The stream's change count and last use when it was saved (see `Catalog::sleep`).
    changes: u64,
    used_ms: i64,
    state: Bytes,
    pins: Box<[Rc<IndexFile>]>,
    deadline_ms: i64,
    data_bytes: u64,
}

impl Sleeper {
    pub(super) fn id(&self) -> StreamId {
        self.id
    }

    pub(super) fn state(&self) -> &Bytes {
        &self.state
    }
}

impl Shard {
    /// Make stream `id` resident if it is dormant, reading its saved state back. Returns
    /// whether the shard has the stream. A saved state that fails its CRC stops the process
    /// like any unreadable index page (see `IndexFile::fault`).
    pub(super) fn wake(&self, id: StreamId) -> bool {
        self.wake_used(id, None)
    }

    /// [`Self::wake`], counting the stream as last used at `used_ms` if given (else now).
    fn wake_used(&self, id: StreamId, used_ms: Option<i64>) -> bool {
        let (state, pins) = {
            let catalog = self.inner.catalog.borrow();
            match catalog.dormant(id) {
                Some(d) => (d.state.clone(), catalog.pins(id).to_vec()),
                None => return catalog.contains(id),
            }
        };
        let bytes = state.file.saved_state(state.off, state.len);
        let now = self.clock_ms();
        let stream = match decode_state(&bytes, &pins, now) {
            Ok(s) => s,
            Err(why) => state
                .file
                .fault(state.off, &format!("saved stream state: {why}")),
        };
        let used = used_ms.unwrap_or(now);
        stream.used_ms.set(used);
        match self.inner.catalog.try_borrow_mut() {
            Ok(mut catalog) => {
                catalog.wake(id, stream, used);
                true
            }
            Err(_) => {
                // A caller holds a stream while asking for another one that sleeps: an
                // engine bug, answered as if the stream were missing rather than by a panic.
                debug_assert!(false, "stream {id} woken while the catalog is borrowed");
                tracing::error!(
                    stream = id,
                    "dormant stream asked for while the catalog is in use"
                );
                false
            }
        }
    }

    /// When stream `id` expires (Unix ms; `i64::MAX`: never) if it is dormant; None if it
    /// is resident or missing. Lets a caller count dormant streams without waking them.
    pub fn dormant_deadline(&self, id: StreamId) -> Option<i64> {
        self.inner
            .catalog
            .borrow()
            .dormant(id)
            .map(|d| d.deadline_ms)
    }

    /// Streams in the shard now, and how many of them are dormant.
    pub fn stream_counts(&self) -> (usize, usize) {
        let catalog = self.inner.catalog.borrow();
        (catalog.len(), catalog.dormant_count())
    }

    /// Save the state of streams unused for `idle_after` (as of `now_ms`), up to a round's
    /// worth; they go dormant once the index file holding them is durable
    /// ([`Self::put_to_sleep`]). Streams with something in flight stay resident.
    pub(super) async fn idle_streams(&self, now_ms: i64, slices: &mut Slices) -> Vec<Sleeper> {
        let idle_after = self.inner.cfg.idle_after;
        if self.memory() || idle_after == Duration::MAX {
            return Vec::new();
        }
        let cutoff = now_ms.saturating_sub(idle_after.as_millis() as i64);
        let stays = self.inner.cfg.stays_resident;
        let mut out = Vec::new();
        // Streams that stay resident go back in the use order once the round has taken its
        // sleepers: put back now, one due at once (idle_after zero) would be taken again.
        let mut kept = Vec::new();
        let mut since_yield = 0;
        // Taken off the use order a slice at a time: after a restart every stream the
        // recovery loaded is due at once, and popping 100,000 of them held the core.
        while out.len() < SLEEPERS_PER_ROUND_MAX {
            let most = SLEEPS_PER_SLICE.min(SLEEPERS_PER_ROUND_MAX - out.len());
            let ids = self.inner.catalog.borrow_mut().idle(cutoff, most);
            if ids.is_empty() {
                break;
            }
            for id in ids {
                let sleeper = self
                    .inner
                    .catalog
                    .borrow()
                    .get(id)
                    .filter(|s| quiescent(s) && !stays(&s.meta.ext))
                    .map(encode_state);
                match sleeper {
                    Some(s) => {
                        since_yield += s.state.len();
                        out.push(s);
                    }
                    None => kept.push(id),
                }
                if since_yield >= ENCODE_SLICE_BYTES {
                    since_yield = 0;
                    slices.next().await;
                }
            }
            slices.next().await;
        }
        let mut catalog = self.inner.catalog.borrow_mut();
        for id in kept {
            catalog.keep(id, now_ms);
        }
        out
    }

    /// The saved states of `sleepers` are durable in `file` at `offsets`: make each stream
    /// dormant unless it changed since it was saved (then it stays resident). Dropping a
    /// stream's state is not free (after a restart one round may put tens of thousands to
    /// sleep), so the core's requests run between slices of [`SLEEPS_PER_SLICE`] streams;
    /// a stream used meanwhile is found changed or used, and stays.
    pub(super) async fn put_to_sleep(
        &self,
        sleepers: Vec<Sleeper>,
        file: &Rc<IndexFile>,
        offsets: &[u64],
        slices: &mut Slices,
    ) {
        let now = self.clock_ms();
        let mut freed = 0;
        let mut slept = 0;
        for (i, (s, &off)) in sleepers.into_iter().zip(offsets).enumerate() {
            if i > 0 && i % SLEEPS_PER_SLICE == 0 {
                self.release_cached(std::mem::take(&mut freed));
                slices.next().await;
            }
            let d = Dormant {
                state: DiskPage {
                    file: file.clone(),
                    off,
                    len: s.state.len() as u32,
                },
                deadline_ms: s.deadline_ms,
                data_bytes: s.data_bytes,
            };
            let mut catalog = self.inner.catalog.borrow_mut();
            match catalog.sleep(s.id, (s.changes, s.used_ms), d, s.pins) {
                Some(stream) => {
                    freed += stream.resident_bytes();
                    slept += 1;
                }
                None => catalog.keep(s.id, now),
            }
        }
        self.release_cached(freed);
        if slept > 0 {
            tracing::debug!(
                shard = self.inner.cfg.shard,
                streams = slept,
                "streams went dormant"
            );
        }
    }

    /// Whether a resident stream has gone unused for `idle_after`: the upkeep round then
    /// writes an index file to put it to sleep (when `IndexFiles::sleep_file_due`, so a
    /// trickle of idle streams shares files).
    pub(super) fn sleep_due(&self) -> bool {
        let idle_after = self.inner.cfg.idle_after;
        if self.memory() || idle_after == Duration::MAX {
            return false;
        }
        let now = self.clock_ms();
        if !self.inner.index_files.borrow().sleep_file_due(now) {
            return false;
        }
        let cutoff = now.saturating_sub(idle_after.as_millis() as i64);
        self.inner
            .catalog
            .borrow()
            .oldest_use()
            .is_some_and(|used| used <= cutoff)
    }

    /// After recovery: the streams it loaded resident (those written after the checkpoint,
    /// and those it named resident) count as last used an idle period ago, not now: nobody
    /// has asked for them since the restart, and a crash after a burst of new streams
    /// would otherwise hold all of them in memory for another idle period. Those a client
    /// uses first stay; the next upkeep rounds put the rest back to sleep.
    pub(super) fn restarted(&self) {
        let idle_after = self.inner.cfg.idle_after;
        if self.memory() || idle_after == Duration::MAX {
            return;
        }
        let long_ago = self
            .clock_ms()
            .saturating_sub(idle_after.as_millis() as i64);
        self.inner.catalog.borrow_mut().used_before(long_ago);
    }

    /// Index file compaction: wake the dormant streams whose saved states are in the files
    /// [`IndexFiles::compaction_candidates`] picks (up to [`STATE_MOVES_PER_ROUND`], in
    /// slices of [`STATE_MOVES_PER_SLICE`]),
    /// counted as unused for an idle period, so the next round that puts streams to sleep
    /// saves them again, in its new file. A file nothing points into any more is deleted
    /// with the next checkpoint. Without this, a file stays as long as one stream sleeps in
    /// it: files (and their open descriptors) would grow with every round for as long as
    /// the server runs, and the disk with states nobody reads.
    ///
    /// [`IndexFiles::compaction_candidates`]: super::index_files::IndexFiles::compaction_candidates
    pub(super) async fn move_sparse_states(&self, slices: &mut Slices) {
        let idle_after = self.inner.cfg.idle_after;
        if self.memory() || idle_after == Duration::MAX {
            return;
        }
        let files = {
            let catalog = self.inner.catalog.borrow();
            self.inner
                .index_files
                .borrow()
                .compaction_candidates(|n| catalog.states_in(n))
        };
        if files.is_empty() {
            return;
        }
        let long_ago = self
            .clock_ms()
            .saturating_sub(idle_after.as_millis() as i64);
        let mut moved = 0;
        for part in 0..PARTS {
            if moved >= STATE_MOVES_PER_ROUND {
                break;
            }
            let ids = self.inner.catalog.borrow().dormant_in(&files, part);
            for id in ids.into_iter().take(STATE_MOVES_PER_ROUND - moved) {
                if self.wake_used(id, Some(long_ago)) {
                    moved += 1;
                    if moved % STATE_MOVES_PER_SLICE == 0 {
                        slices.next().await;
                    }
                }
            }
            slices.next().await;
        }
        tracing::debug!(
            shard = self.inner.cfg.shard,
            files = files.len(),
            moved,
            "dormant states moving out of sparse or small index files"
        );
    }

    /// Streams saved to sleep whose index file could not be written stay resident.
    pub(super) fn keep_awake(&self, sleepers: Vec<Sleeper>) {
        let now = self.clock_ms();
        let mut catalog = self.inner.catalog.borrow_mut();
        for s in sleepers {
            catalog.keep(s.id, now);
        }
    }

    /// Put every stream idle by now to sleep at once (tests).
    #[cfg(test)]
    pub(crate) async fn sleep_idle(&self) -> Result<(), crate::StorageError> {
        let Some(dir) = self.log_dir() else {
            return Ok(());
        };
        self.wait_for_upkeep().await;
        self.inner.clock_ms.set(crate::now_ms());
        let result = self.write_index(&dir).await;
        self.inner.upkeep_busy.set(false);
        result
    }

    /// Now, as the shard's coarse clock has it (Unix ms, updated every upkeep round): what
    /// a stream's last use is measured in, without reading the clock on every access.
    pub(super) fn clock_ms(&self) -> i64 {
        self.inner.clock_ms.get()
    }
}

/// Whether a stream can go dormant: all it accepted is durable and visible, nobody waits
/// for it to change, and it has no snapshot (a restart finds the snapshot blobs in use
/// from the resident streams, and deletes the others).
fn quiescent(s: &Stream) -> bool {
    s.tail == s.visible_tail
        && s.closed == s.visible_closed
        && !s.has_waiters()
        && s.snapshot.is_none()
}

/// Save a stream's state (format in the module comment).
fn encode_state(s: &Stream) -> Sleeper {
    let mut out = vec![0u8; 4];
    Record::Image(s.image()).encode(Lsn::NONE, &mut out);
    let (chunks, msgs) = s.tables();
    chunks.encode_into(&mut out);
    msgs.encode_into(&mut out);
    put_signed(&mut out, s.last_access_ms.get());
    let crc = crc32c::crc32c(&out[4..]);
    out[..4].copy_from_slice(&crc.to_le_bytes());
    let mut pins: Vec<Rc<IndexFile>> = Vec::new();
    for f in chunks.page_files().chain(msgs.page_files()) {
        if !pins.iter().any(|p| Rc::ptr_eq(p, f)) {
            pins.push(f.clone());
        }
    }
    Sleeper {
        id: s.id,
        changes: s.changes,
        used_ms: s.used_ms.get(),
        state: Bytes::from(out),
        pins: pins.into_boxed_slice(),
        deadline_ms: s
            .meta
            .lifetime
            .deadline_ms(s.last_access_ms.get())
            .unwrap_or(i64::MAX),
        data_bytes: s.data_bytes(),
    }
}

/// A saved state's image and where its tables start.
fn decode_image(buf: &Bytes) -> Result<(ImageRec, usize), FormatError> {
    let framed = decode_at(buf, 4).map_err(FormatError::Frame)?;
    let Record::Image(image) = framed.record else {
        return Err(FormatError::NotAnImage);
    };
    Ok((image, 4 + framed.len))
}

/// A saved state whose tables' pages are in an index file that is lost: the stream without
/// its tables, which recovery rebuilds from the log.
pub(super) fn decode_needing_rebuild(buf: &Bytes, now_ms: i64) -> Result<Stream, FormatError> {
    let (image, _) = decode_image(buf)?;
    Ok(Stream::needing_rebuild(&image, now_ms))
}

/// Read a saved state back (its CRC already checked) into a resident stream; `pins` are
/// the index files its tables' pages are in.
pub(super) fn decode_state(
    buf: &Bytes,
    pins: &[Rc<IndexFile>],
    now_ms: i64,
) -> Result<Stream, FormatError> {
    let (image, mut at) = decode_image(buf)?;
    let mut file = |number: IndexFileNo| pins.iter().find(|f| f.number == number).cloned();
    let chunks = Packed::decode_from(buf, &mut at, &mut file)?;
    let msgs = Packed::decode_from(buf, &mut at, &mut file)?;
    let (Some(chunks), Some(msgs)) = (chunks, msgs) else {
        return Err(FormatError::Field(
            "table page (in a file the stream does not pin)",
        ));
    };
    if at >= buf.len() {
        return Err(FormatError::Field("last access (missing)"));
    }
    let last_access = get_signed(buf, &mut at);
    if at != buf.len() {
        return Err(FormatError::Trailing(buf.len() - at));
    }
    let mut stream = Stream::from_checkpoint(&image, chunks, msgs, true, now_ms);
    stream.last_access_ms.set(last_access);
    let (tail, closed) = (stream.tail, stream.closed);
    stream.make_visible(tail, closed);
    Ok(stream)
}
