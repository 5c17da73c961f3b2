//! Changing the shard's streams: creating, appending to, changing and deleting them, and
//! looking them up (a dormant stream wakes on its first use).
//!
//! Each change is checked against the head state, applied to it, and logged in one step with
//! no await in between; the returned [`Commit`] resolves once its record is durable.

use std::cell::{Ref, RefMut};

use bytes::Bytes;

use crate::error::StorageError;
use crate::position::{Lsn, Offset};
use crate::record::{AppendRec, CreateRec, Record, SnapshotMeta};
use crate::stream::{Receipt, Stream, StreamId};
use crate::view::{StreamHead, StreamView};

use super::commit::Commit;
use super::{missing, NewStream, Shard};

impl Shard {
    pub fn lookup(&self, key: &str) -> Option<StreamId> {
        self.inner.catalog.borrow().lookup(key)
    }

    /// What readers may see of stream `id`: its durable state (see [`StreamView`]).
    pub fn stream(&self, id: StreamId) -> Option<StreamView<'_>> {
        self.state(id).map(StreamView::new)
    }

    pub fn stream_by_key(&self, key: &str) -> Option<StreamView<'_>> {
        self.stream(self.lookup(key)?)
    }

    /// Stream `id`'s head, for checking a new write against (see [`StreamHead`]).
    pub fn head(&self, id: StreamId) -> Option<StreamHead<'_>> {
        self.state(id).map(StreamHead::new)
    }

    /// The whole state of stream `id`, head and visible end, for the engine itself. Wakes
    /// it if it is dormant, and counts as a use.
    pub(crate) fn state(&self, id: StreamId) -> Option<Ref<'_, Stream>> {
        let s = Ref::filter_map(self.inner.catalog.borrow(), |c| c.get(id)).ok();
        let s = match s {
            Some(s) => s,
            None if self.wake(id) => {
                Ref::filter_map(self.inner.catalog.borrow(), |c| c.get(id)).ok()?
            }
            None => return None,
        };
        s.used_ms.set(self.clock_ms());
        Some(s)
    }

    /// Stream `id` to change, woken if it is dormant; None if there is no such stream.
    pub(super) fn state_mut(&self, id: StreamId) -> Option<RefMut<'_, Stream>> {
        // Resident is the usual case: one lookup, and the dormant table is not asked.
        let resident = self.inner.catalog.borrow().get(id).is_some();
        if !resident && !self.wake(id) {
            return None;
        }
        let s = RefMut::filter_map(self.inner.catalog.borrow_mut(), |c| c.get_mut(id)).ok()?;
        s.used_ms.set(self.clock_ms());
        Some(s)
    }

    #[cfg(test)]
    pub(crate) fn state_by_key(&self, key: &str) -> Option<Ref<'_, Stream>> {
        self.state(self.lookup(key)?)
    }

    /// Keys of all streams, in no particular order.
    pub fn keys(&self) -> Vec<Box<str>> {
        self.inner.catalog.borrow().keys().map(Box::from).collect()
    }

    /// The keys (resident and dormant) that start with `prefix`.
    pub fn keys_starting_with(&self, prefix: &str) -> Vec<Box<str>> {
        let catalog = self.inner.catalog.borrow();
        catalog
            .keys()
            .filter(|k| k.starts_with(prefix))
            .map(Box::from)
            .collect()
    }

    /// Streams that may have expired by `now_ms`: every resident stream with a lifetime,
    /// and the dormant ones whose deadline has passed (without waking the others).
    pub fn expiry_candidates(&self, now_ms: i64) -> Vec<StreamId> {
        let mut catalog = self.inner.catalog.borrow_mut();
        let mut out = catalog.resident_mortal();
        out.extend(catalog.dormant_expired(now_ms));
        out
    }

    /// A creation token that differs from every incarnation this shard handed out before.
    pub fn next_incarnation(&self, now_ms: i64) -> u64 {
        let mut catalog = self.inner.catalog.borrow_mut();
        let next = (now_ms.max(0) as u64).max(catalog.last_incarnation() + 1);
        catalog.incarnation_taken(next);
        next
    }

    pub fn create(&self, spec: NewStream) -> Result<(StreamId, Commit), StorageError> {
        self.admit(spec.initial.data.len())?;
        let id = self.inner.catalog.borrow().next_id();
        let mut initial = spec.initial;
        initial.id = id;
        initial.start = Offset::ZERO;
        let rec = CreateRec {
            id,
            meta: spec.meta,
            initial,
        };
        let record = Record::Create(rec);
        let (lsn, loc) = self.log_record(&record, Some((id, Offset::ZERO, false)))?;
        let Record::Create(rec) = record else {
            unreachable!("built above")
        };
        self.inner.catalog.borrow_mut().taken_below(id + 1);
        let now = crate::now_ms();
        let mut stream = Stream::from_create(&rec, now);
        let loc = loc.map(|l| l.with_data(rec.initial.data.len()));
        let receipt =
            stream.apply_append(&rec.initial, self.inner.cfg.receipt_window, now, loc, true);
        self.set_effect_tail(lsn, id, receipt.next, stream.closed);
        self.insert_stream(stream, lsn);
        self.add_live(rec.initial.data.len() as u64);
        self.cached(id, &rec.initial);
        Ok((id, self.commit(lsn)))
    }

    /// Append to (and/or close) a stream. `a.id` and `a.start` are filled in here.
    pub fn append(
        &self,
        id: StreamId,
        mut a: AppendRec,
    ) -> Result<(Receipt, Commit), StorageError> {
        let tail = self.state_mut(id).map(|s| s.tail).ok_or_else(missing)?;
        self.admit(a.data.len())?;
        a.id = id;
        a.start = tail;
        let record = Record::Append(a);
        let (lsn, loc) = self.log_record(&record, None)?;
        let Record::Append(a) = record else {
            unreachable!("built above")
        };
        let now = crate::now_ms();
        let loc = loc.map(|l| l.with_data(a.data.len()));
        let mut stream = self.state_mut(id).ok_or_else(missing)?;
        let receipt = stream.apply_append(&a, self.inner.cfg.receipt_window, now, loc, true);
        stream.last_access_ms.set(now);
        let closed = stream.closed;
        drop(stream);
        self.add_live(a.data.len() as u64);
        self.cached(id, &a);
        self.set_effect_tail(lsn, id, receipt.next, closed);
        if self.memory() {
            self.make_visible(id, receipt.next, closed);
        }
        Ok((receipt, self.commit(lsn)))
    }

    pub fn delete(&self, id: StreamId) -> Result<Commit, StorageError> {
        // Awake, so that what it holds (cached bytes, live data, a snapshot) is known.
        self.wake(id);
        let (lsn, _) = self.log_record(&Record::Delete { id }, None)?;
        let removed = self.inner.catalog.borrow_mut().remove(id);
        if let Some(stream) = removed {
            self.release_cached(stream.resident_bytes());
            self.inner
                .segments
                .borrow_mut()
                .release_live(stream.data_bytes());
            if let Some(snap) = &stream.snapshot {
                self.drop_blob(lsn, snap.blob.clone());
            }
            stream.notify();
        }
        Ok(self.commit(lsn))
    }

    /// Make `meta` (whose blob is durable) the stream's visible snapshot, replacing any other.
    pub fn set_snapshot(&self, id: StreamId, meta: SnapshotMeta) -> Result<Commit, StorageError> {
        let record = Record::Snapshot { id, meta };
        let (lsn, _) = self.log_record(&record, None)?;
        let Record::Snapshot { meta, .. } = record else {
            unreachable!("built above")
        };
        let old = match self.state_mut(id) {
            Some(mut s) => s.snapshot.replace(meta),
            None => None,
        };
        if let Some(old) = old {
            self.drop_blob(lsn, old.blob);
        }
        Ok(self.commit(lsn))
    }

    /// Advance a stream's retention point to `offset` (a message boundary the caller has
    /// validated): data before it stops being readable and its space is reclaimed.
    pub fn retain(&self, id: StreamId, offset: Offset) -> Result<Commit, StorageError> {
        let first_record = self
            .stream(id)
            .map(|s| s.message_at_or_after(offset))
            .ok_or_else(missing)?;
        let (lsn, _) = self.log_record(
            &Record::Retain {
                id,
                offset,
                first_record,
            },
            None,
        )?;
        let freed = match self.state_mut(id) {
            Some(mut s) => s.retain(offset, first_record),
            None => (0, 0),
        };
        self.inner.segments.borrow_mut().release_live(freed.0);
        self.release_cached(freed.1);
        Ok(self.commit(lsn))
    }

    /// Replace the server-owned state blob of a stream.
    pub fn set_ext(&self, id: StreamId, ext: Bytes) -> Result<Commit, StorageError> {
        let record = Record::SetExt { id, ext };
        let (lsn, _) = self.log_record(&record, None)?;
        let Record::SetExt { ext, .. } = record else {
            unreachable!("built above")
        };
        if let Some(mut s) = self.state_mut(id) {
            s.meta.ext = ext;
        }
        Ok(self.commit(lsn))
    }

    /// Record an access for sliding TTLs.
    pub fn touch(&self, id: StreamId, now_ms: i64) {
        if let Some(s) = self.state(id) {
            s.last_access_ms.set(now_ms);
        }
    }

    pub(super) fn insert_stream(&self, stream: Stream, lsn: Lsn) {
        let id = stream.id;
        let visible = self.memory() || lsn <= self.inner.group_commit.borrow().acknowledged_lsn();
        let (tail, closed) = (stream.tail, stream.closed);
        let replaced = self
            .inner
            .catalog
            .borrow_mut()
            .insert(stream, self.clock_ms());
        if let Some(old) = replaced {
            old.notify();
        }
        if visible {
            self.make_visible(id, tail, closed);
        }
    }
}
