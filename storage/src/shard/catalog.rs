//! The catalog: every stream of the shard by id and by key, the ids and creation tokens
//! handed out, and whether each stream is resident or dormant.
//!
//! A resident stream has its whole state in memory (a [`Stream`]: tables, producers, cache,
//! waiters). A stream nobody has used for a while is made dormant (see `dormancy`): its state
//! is saved in an index file and memory keeps only a [`Dormant`] entry (where the state is,
//! when the stream expires, how many bytes it holds) beside its key. So a shard's memory
//! grows with the streams in use, not with every stream it keeps. The catalog does no I/O:
//! the shard reads a dormant stream's state back and hands it to [`Catalog::wake`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;

use super::FastMap;
use crate::index::IndexFile;
use crate::packed::DiskPage;
use crate::stream::{Stream, StreamId};

/// A dormant stream's entry: what memory keeps of a stream whose state is in an index file.
pub(crate) struct Dormant {
    /// The saved state (see `dormancy::encode_state`).
    pub(crate) state: DiskPage,
    /// The index files its tables' pages are in, held open so they stay while it sleeps
    /// (a file is deleted once nothing holds it; see `checkpointing`).
    pub(crate) pins: Box<[Rc<IndexFile>]>,
    /// When the stream expires (Unix ms; `i64::MAX`: never), so that the expiry sweep
    /// does not have to wake it to find out.
    pub(crate) deadline_ms: i64,
    /// Bytes of data it holds (for the cleaner's space accounting after a restart).
    pub(crate) data_bytes: u64,
}

pub(super) struct Catalog {
    entries: FastMap<StreamId, Entry>,
    keys: FastMap<Box<str>, StreamId>,
    next_id: StreamId,
    last_incarnation: u64,
    /// Every resident stream exactly once (unless it is being put to sleep), with a time
    /// at or before its last use, oldest first: the sweep for idle streams reads the front.
    by_use: VecDeque<(StreamId, i64)>,
    /// Deadlines of dormant streams that expire, soonest first. An entry whose stream woke
    /// up (or went to sleep again with another deadline) is stale and skipped.
    deadlines: BinaryHeap<Reverse<(i64, StreamId)>>,
    dormant: usize,
    /// Bytes of all keys, and index files pinned by dormant streams (for `heap_bytes`).
    key_bytes: usize,
    pins: usize,
}

enum Entry {
    Resident(Box<Stream>),
    Dormant(Dormant),
}

impl Catalog {
    pub(super) fn new() -> Catalog {
        Catalog {
            entries: FastMap::default(),
            keys: FastMap::default(),
            next_id: 1,
            last_incarnation: 0,
            by_use: VecDeque::new(),
            deadlines: BinaryHeap::new(),
            dormant: 0,
            key_bytes: 0,
            pins: 0,
        }
    }

    pub(super) fn lookup(&self, key: &str) -> Option<StreamId> {
        self.keys.get(key).copied()
    }

    /// Stream `id` if it is resident.
    pub(super) fn get(&self, id: StreamId) -> Option<&Stream> {
        match self.entries.get(&id)? {
            Entry::Resident(s) => Some(s),
            Entry::Dormant(_) => None,
        }
    }

    /// Stream `id` if it is resident, to change it.
    pub(super) fn get_mut(&mut self, id: StreamId) -> Option<&mut Stream> {
        match self.entries.get_mut(&id)? {
            Entry::Resident(s) => {
                s.changes += 1;
                Some(s)
            }
            Entry::Dormant(_) => None,
        }
    }

    /// Stream `id`'s dormant entry, if it is dormant.
    pub(super) fn dormant(&self, id: StreamId) -> Option<&Dormant> {
        match self.entries.get(&id)? {
            Entry::Dormant(d) => Some(d),
            Entry::Resident(_) => None,
        }
    }

    pub(super) fn contains(&self, id: StreamId) -> bool {
        self.entries.contains_key(&id)
    }

    /// Streams, resident and dormant.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn dormant_count(&self) -> usize {
        self.dormant
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &Box<str>> + '_ {
        self.keys.keys()
    }

    pub(super) fn resident(&self) -> impl Iterator<Item = &Stream> + '_ {
        self.entries.values().filter_map(|e| match e {
            Entry::Resident(s) => Some(&**s),
            Entry::Dormant(_) => None,
        })
    }

    pub(super) fn resident_mut(&mut self) -> impl Iterator<Item = &mut Stream> + '_ {
        self.entries.values_mut().filter_map(|e| match e {
            Entry::Resident(s) => Some(&mut **s),
            Entry::Dormant(_) => None,
        })
    }

    /// Dormant streams with their keys.
    pub(super) fn dormant_by_key(&self) -> impl Iterator<Item = (&str, StreamId, &Dormant)> + '_ {
        self.keys
            .iter()
            .filter_map(|(key, &id)| match self.entries.get(&id)? {
                Entry::Dormant(d) => Some((&**key, id, d)),
                Entry::Resident(_) => None,
            })
    }

    pub(super) fn next_id(&self) -> StreamId {
        self.next_id
    }

    /// Ids below `id` are taken (recovery, and a create).
    pub(super) fn taken_below(&mut self, id: StreamId) {
        self.next_id = self.next_id.max(id);
    }

    pub(super) fn last_incarnation(&self) -> u64 {
        self.last_incarnation
    }

    /// Creation tokens up to `incarnation` are taken.
    pub(super) fn incarnation_taken(&mut self, incarnation: u64) {
        self.last_incarnation = self.last_incarnation.max(incarnation);
    }

    /// Add a resident stream used at `now_ms`. Returns the stream its key named before, if
    /// it was resident (it is removed either way), so that its readers can be told.
    pub(super) fn insert(&mut self, stream: Stream, now_ms: i64) -> Option<Stream> {
        let id = stream.id;
        self.incarnation_taken(stream.incarnation);
        self.taken_below(id + 1);
        let replaced = self.bind_key(stream.key.clone(), id);
        self.put(id, Entry::Resident(Box::new(stream)));
        self.by_use.push_back((id, now_ms));
        replaced
    }

    /// Add a dormant stream (recovery).
    pub(super) fn insert_dormant(&mut self, id: StreamId, key: Box<str>, d: Dormant) {
        self.taken_below(id + 1);
        if d.deadline_ms != i64::MAX {
            self.deadlines.push(Reverse((d.deadline_ms, id)));
        }
        self.bind_key(key, id);
        self.put(id, Entry::Dormant(d));
    }

    /// Point `key` at `id`; the stream it named before is removed and returned if it was
    /// resident.
    fn bind_key(&mut self, key: Box<str>, id: StreamId) -> Option<Stream> {
        let len = key.len();
        match self.keys.insert(key, id) {
            None => {
                self.key_bytes += len;
                None
            }
            Some(old) if old != id => self.take(old),
            Some(_) => None,
        }
    }

    fn put(&mut self, id: StreamId, entry: Entry) {
        if let Entry::Dormant(d) = &entry {
            self.dormant += 1;
            self.pins += d.pins.len();
        }
        if let Some(old) = self.entries.insert(id, entry) {
            self.forget(&old);
        }
    }

    /// Remove entry `id` (not its key); the stream if it was resident.
    fn take(&mut self, id: StreamId) -> Option<Stream> {
        let entry = self.entries.remove(&id)?;
        self.forget(&entry);
        match entry {
            Entry::Resident(s) => Some(*s),
            Entry::Dormant(_) => None,
        }
    }

    /// Count an entry out of the totals.
    fn forget(&mut self, entry: &Entry) {
        if let Entry::Dormant(d) = entry {
            self.dormant -= 1;
            self.pins -= d.pins.len();
        }
    }

    /// Remove stream `id` and its key; returns it if it was resident. Callers that need a
    /// stream's state to remove it (deletion) wake it first: finding a dormant stream's key
    /// takes a scan of every key.
    pub(super) fn remove(&mut self, id: StreamId) -> Option<Stream> {
        let stream = self.take(id);
        let key = match &stream {
            Some(s) => Some(s.key.clone()),
            None => self
                .keys
                .iter()
                .find(|(_, &v)| v == id)
                .map(|(k, _)| k.clone()),
        };
        if let Some(key) = key.filter(|k| self.keys.get(k) == Some(&id)) {
            self.keys.remove(&key);
            self.key_bytes -= key.len();
        }
        stream
    }

    /// Replace dormant stream `id`'s entry with its state, read back from disk; used now.
    pub(super) fn wake(&mut self, id: StreamId, stream: Stream, now_ms: i64) {
        assert!(
            stream.id == id && self.dormant(id).is_some(),
            "only a dormant stream wakes, with its own state"
        );
        self.put(id, Entry::Resident(Box::new(stream)));
        self.by_use.push_back((id, now_ms));
    }

    /// Resident streams unused since `cutoff_ms`, at most `most` of them, taken off the use
    /// order: each goes to sleep with [`Catalog::sleep`] or back with [`Catalog::keep`].
    pub(super) fn idle(&mut self, cutoff_ms: i64, most: usize) -> Vec<StreamId> {
        let mut out = Vec::new();
        while out.len() < most {
            match self.by_use.front() {
                Some(&(_, seen)) if seen <= cutoff_ms => {}
                _ => break,
            }
            let Some((id, _)) = self.by_use.pop_front() else {
                break;
            };
            // Gone, or asleep already (a stale place from before it slept): dropped.
            if let Some(Entry::Resident(s)) = self.entries.get(&id) {
                let used = s.used_ms.get();
                if used <= cutoff_ms {
                    out.push(id);
                } else {
                    self.by_use.push_back((id, used));
                }
            }
        }
        out
    }

    /// The earliest time the use order has for a resident stream (its last use is at or
    /// after it).
    pub(super) fn oldest_use(&self) -> Option<i64> {
        self.by_use.front().map(|&(_, t)| t)
    }

    /// Put an idle stream back in the use order: it stays resident.
    pub(super) fn keep(&mut self, id: StreamId, now_ms: i64) {
        if let Some(Entry::Resident(_)) = self.entries.get(&id) {
            self.by_use.push_back((id, now_ms));
        }
    }

    /// Make resident stream `id` dormant, its state saved as `d`, if it has not changed
    /// since `changes` (its count when the state was saved). Returns the stream it was, to
    /// release what it held, or None if it changed (or is gone) and stays as it is.
    pub(super) fn sleep(&mut self, id: StreamId, changes: u64, d: Dormant) -> Option<Stream> {
        match self.entries.get(&id) {
            Some(Entry::Resident(s)) if s.changes == changes => {}
            _ => return None,
        }
        if d.deadline_ms != i64::MAX {
            self.deadlines.push(Reverse((d.deadline_ms, id)));
        }
        let stream = self.take(id);
        self.put(id, Entry::Dormant(d));
        stream
    }

    /// Dormant streams whose deadline is at or before `now_ms`.
    pub(super) fn dormant_expired(&mut self, now_ms: i64) -> Vec<StreamId> {
        let mut out = Vec::new();
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            if deadline > now_ms {
                break;
            }
            self.deadlines.pop();
            if self.dormant(id).is_some_and(|d| d.deadline_ms == deadline) {
                out.push(id);
            }
        }
        // Stale deadlines (streams that woke up) leave when they pass; a heap mostly stale
        // is rebuilt from the dormant entries, so it stays within twice their number.
        if self.deadlines.len() > 2 * self.dormant + 1024 {
            self.deadlines = self
                .entries
                .iter()
                .filter_map(|(&id, e)| match e {
                    Entry::Dormant(d) if d.deadline_ms != i64::MAX => {
                        Some(Reverse((d.deadline_ms, id)))
                    }
                    _ => None,
                })
                .collect();
        }
        out
    }

    /// Resident streams that may expire (their lifetime is not forever).
    pub(super) fn resident_mortal(&self) -> Vec<StreamId> {
        self.resident()
            .filter(|s| s.lifetime != crate::record::Lifetime::Forever)
            .map(|s| s.id)
            .collect()
    }

    /// Heap bytes the catalog holds for its entries, keys and orders (hash tables at their
    /// capacity, keys at their length), not counting resident streams' own state.
    pub(super) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let entries = self.entries.capacity() * (size_of::<(StreamId, Entry)>() + 1);
        let keys = self.keys.capacity() * (size_of::<(Box<str>, StreamId)>() + 1);
        let orders = self.by_use.capacity() * size_of::<(StreamId, i64)>()
            + self.deadlines.capacity() * size_of::<Reverse<(i64, StreamId)>>();
        entries + keys + self.key_bytes + self.pins * size_of::<Rc<IndexFile>>() + orders
    }
}
