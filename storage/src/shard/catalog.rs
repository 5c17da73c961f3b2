//! The catalog: every stream of the shard by id and by key, the ids and creation tokens
//! handed out, and whether each stream is resident or dormant.
//!
//! A resident stream has its whole state in memory (a [`Stream`]: tables, producers, cache,
//! waiters). A stream nobody has used for a while is made dormant (see `dormancy`): its state
//! is saved in an index file and memory keeps only a [`Dormant`] entry (where the state is,
//! when the stream expires, how many bytes it holds; 40 bytes) beside its key, and the
//! index files its tables' pages are in, for the few streams whose tables have pages. So a shard's memory
//! grows with the streams in use, not with every stream it keeps. The catalog does no I/O:
//! the shard reads a dormant stream's state back and hands it to [`Catalog::wake`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;

use super::FastMap;
use crate::index::IndexFile;
use crate::packed::DiskPage;
use crate::stream::{Stream, StreamId};

/// A dormant stream's entry: what memory keeps of a stream whose state is in an index file.
pub(crate) struct Dormant {
    /// The saved state (see `dormancy::encode_state`).
    pub(crate) state: DiskPage,
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
    /// at or before its last use, earliest first: the sweep for idle streams takes from the
    /// top. A heap, not a queue: a stream found still in use goes back in at its own last
    /// use, which is earlier than streams queued since, so it is due on time, not one idle
    /// period late.
    by_use: BinaryHeap<Reverse<(i64, StreamId)>>,
    /// Deadlines of dormant streams that expire, soonest first. An entry whose stream woke
    /// up (or went to sleep again with another deadline) is stale and skipped.
    deadlines: BinaryHeap<Reverse<(i64, StreamId)>>,
    /// For dormant streams whose tables have pages in index files: those files, held open
    /// so they stay while the stream sleeps (a file is deleted once nothing holds it; see
    /// `checkpointing`). Beside the entries, not in them: most streams have no pages, and
    /// every dormant entry would pay for the slot.
    pins: FastMap<StreamId, Box<[Rc<IndexFile>]>>,
    dormant: usize,
    /// Bytes of all keys, and index files pinned by dormant streams (for `heap_bytes`).
    key_bytes: usize,
    pinned: usize,
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
            by_use: BinaryHeap::new(),
            deadlines: BinaryHeap::new(),
            pins: FastMap::default(),
            dormant: 0,
            key_bytes: 0,
            pinned: 0,
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

    /// The index files dormant stream `id`'s tables' pages are in.
    pub(super) fn pins(&self, id: StreamId) -> &[Rc<IndexFile>] {
        self.pins.get(&id).map_or(&[], |p| p)
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
        self.incarnation_taken(stream.meta.incarnation);
        self.taken_below(id + 1);
        let replaced = self.bind_key(stream.meta.key.clone(), id);
        self.put(id, Entry::Resident(Box::new(stream)));
        self.push_use(id, now_ms);
        replaced
    }

    /// Add a dormant stream (recovery).
    pub(super) fn insert_dormant(
        &mut self,
        id: StreamId,
        key: Box<str>,
        d: Dormant,
        pins: Box<[Rc<IndexFile>]>,
    ) {
        self.taken_below(id + 1);
        if d.deadline_ms != i64::MAX {
            self.deadlines.push(Reverse((d.deadline_ms, id)));
        }
        self.bind_key(key, id);
        self.put(id, Entry::Dormant(d));
        self.pin(id, pins);
    }

    fn pin(&mut self, id: StreamId, pins: Box<[Rc<IndexFile>]>) {
        if !pins.is_empty() {
            self.pinned += pins.len();
            self.pins.insert(id, pins);
        }
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
        let dormant = matches!(entry, Entry::Dormant(_));
        if let Some(old) = self.entries.insert(id, entry) {
            self.forget(id, &old);
        }
        if dormant {
            self.dormant += 1;
        }
    }

    /// Remove entry `id` (not its key); the stream if it was resident.
    fn take(&mut self, id: StreamId) -> Option<Stream> {
        let entry = self.entries.remove(&id)?;
        self.forget(id, &entry);
        match entry {
            Entry::Resident(s) => Some(*s),
            Entry::Dormant(_) => None,
        }
    }

    /// Count an entry out of the totals, and drop what it pinned.
    fn forget(&mut self, id: StreamId, entry: &Entry) {
        if let Entry::Dormant(_) = entry {
            self.dormant -= 1;
            if let Some(pins) = self.pins.remove(&id) {
                self.pinned -= pins.len();
            }
        }
    }

    /// Remove stream `id` and its key; returns it if it was resident. Callers that need a
    /// stream's state to remove it (deletion) wake it first: finding a dormant stream's key
    /// takes a scan of every key.
    pub(super) fn remove(&mut self, id: StreamId) -> Option<Stream> {
        let stream = self.take(id);
        let key = match &stream {
            Some(s) => Some(s.meta.key.clone()),
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
        self.push_use(id, now_ms);
    }

    /// Resident streams unused since `cutoff_ms`, at most `most` of them, taken off the use
    /// order: each goes to sleep with [`Catalog::sleep`] or back with [`Catalog::keep`].
    pub(super) fn idle(&mut self, cutoff_ms: i64, most: usize) -> Vec<StreamId> {
        let mut out = Vec::new();
        while out.len() < most {
            match self.by_use.peek() {
                Some(&Reverse((seen, _))) if seen <= cutoff_ms => {}
                _ => break,
            }
            let Some(Reverse((_, id))) = self.by_use.pop() else {
                break;
            };
            // Gone, or asleep already (a stale place from before it slept): dropped.
            if let Some(Entry::Resident(s)) = self.entries.get(&id) {
                let used = s.used_ms.get();
                if used <= cutoff_ms {
                    out.push(id);
                } else {
                    self.push_use(id, used);
                }
            }
        }
        out
    }

    /// Count every resident stream as last used at `used_ms` (after a restart, when none has
    /// been used since).
    pub(super) fn used_before(&mut self, used_ms: i64) {
        self.by_use.clear();
        for (&id, entry) in &self.entries {
            if let Entry::Resident(s) = entry {
                s.used_ms.set(used_ms);
                self.by_use.push(Reverse((used_ms, id)));
            }
        }
    }

    /// The earliest time the use order has for a resident stream (its last use is at or
    /// after it).
    pub(super) fn oldest_use(&self) -> Option<i64> {
        self.by_use.peek().map(|&Reverse((t, _))| t)
    }

    /// Put an idle stream back in the use order: it stays resident.
    pub(super) fn keep(&mut self, id: StreamId, now_ms: i64) {
        if let Some(Entry::Resident(_)) = self.entries.get(&id) {
            self.push_use(id, now_ms);
        }
    }

    /// Queue `id` for an idleness check once `used_ms` is an idle period ago.
    fn push_use(&mut self, id: StreamId, used_ms: i64) {
        self.by_use.push(Reverse((used_ms, id)));
    }

    /// Make resident stream `id` dormant, its state saved as `d` (its pages in `pins`), if
    /// it has been neither changed nor used since the state was saved (`changes` and `used`
    /// were its counts then). Returns the stream it was, to release what it held, or None if
    /// it stays as it is (or is gone).
    pub(super) fn sleep(
        &mut self,
        id: StreamId,
        (changes, used): (u64, i64),
        d: Dormant,
        pins: Box<[Rc<IndexFile>]>,
    ) -> Option<Stream> {
        match self.entries.get(&id) {
            Some(Entry::Resident(s)) if s.changes == changes && s.used_ms.get() == used => {}
            _ => return None,
        }
        if d.deadline_ms != i64::MAX {
            self.deadlines.push(Reverse((d.deadline_ms, id)));
        }
        let stream = self.take(id);
        self.put(id, Entry::Dormant(d));
        self.pin(id, pins);
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
            .filter(|s| s.meta.lifetime != crate::record::Lifetime::Forever)
            .map(|s| s.id)
            .collect()
    }

    /// Heap bytes the catalog holds for its entries, keys and orders (hash tables at their
    /// capacity, keys at their length), not counting resident streams' own state.
    pub(super) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let entries = self.entries.capacity() * (size_of::<(StreamId, Entry)>() + 1);
        let keys = self.keys.capacity() * (size_of::<(Box<str>, StreamId)>() + 1);
        let orders = self.by_use.capacity() * size_of::<Reverse<(i64, StreamId)>>()
            + self.deadlines.capacity() * size_of::<Reverse<(i64, StreamId)>>();
        let pins = self.pins.capacity() * (size_of::<(StreamId, Box<[Rc<IndexFile>]>)>() + 1)
            + self.pinned * size_of::<Rc<IndexFile>>();
        entries + keys + self.key_bytes + pins + orders
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{AppendRec, CreateRec, Lifetime, StreamMeta};

    fn stream(id: StreamId, key: &str, now_ms: i64) -> Stream {
        Stream::from_create(
            &CreateRec {
                id,
                meta: StreamMeta {
                    key: key.into(),
                    incarnation: 1,
                    created_ms: 0,
                    content_type: "text/plain".into(),
                    lifetime: Lifetime::Forever,
                    ext: bytes::Bytes::new(),
                },
                initial: AppendRec::default(),
            },
            now_ms,
        )
    }

    fn dormant(file: &Rc<IndexFile>) -> Dormant {
        Dormant {
            state: DiskPage {
                file: file.clone(),
                off: 48,
                len: 10,
            },
            deadline_ms: i64::MAX,
            data_bytes: 7,
        }
    }

    fn index_file(dir: &std::path::Path) -> Rc<IndexFile> {
        let no = crate::index::IndexFileNo::new(9);
        let mut bytes = crate::index::header(0, no, 1, 10).to_vec();
        bytes.extend_from_slice(&[0; 10]);
        std::fs::write(crate::index::index_path(dir, no), bytes).expect("write");
        Rc::new(IndexFile::open(dir, 0, no).expect("open"))
    }

    #[test]
    fn a_dormant_entry_stays_small() {
        // What every dormant stream costs beside its key: the table slot is this plus the id.
        assert!(
            std::mem::size_of::<Entry>() <= 40,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }

    #[test]
    fn only_streams_unused_since_the_cutoff_are_idle_and_each_once() {
        let mut c = Catalog::new();
        c.insert(stream(1, "a", 100), 100);
        c.insert(stream(2, "b", 100), 100);
        c.insert(stream(3, "c", 500), 500);
        c.get(2).expect("b").used_ms.set(400);
        assert_eq!(c.idle(200, 10), vec![1]);
        assert!(c.idle(200, 10).is_empty(), "taken off the order");
        c.keep(1, 450);
        // b, found in use at 200, is due at its own last use (400), not behind the streams
        // queued since.
        assert_eq!(c.idle(449, 10), vec![2]);
        c.get(3).expect("c").used_ms.set(600);
        assert_eq!(c.idle(500, 10), vec![1]);
        assert_eq!(c.oldest_use(), Some(600));
    }

    #[test]
    fn a_stream_changed_or_used_after_it_was_saved_stays_resident() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let mut c = Catalog::new();
        c.insert(stream(1, "a", 100), 100);
        let saved = (c.get(1).expect("a").changes, 100);
        c.get_mut(1).expect("a");
        assert!(c.sleep(1, saved, dormant(&file), Box::new([])).is_none());
        let saved = (c.get(1).expect("a").changes, 100);
        c.get(1).expect("a").used_ms.set(150);
        assert!(c.sleep(1, saved, dormant(&file), Box::new([])).is_none());
        let saved = (c.get(1).expect("a").changes, 150);
        let pins: Box<[Rc<IndexFile>]> = Box::new([file.clone()]);
        assert!(c.sleep(1, saved, dormant(&file), pins).is_some());
        assert_eq!((c.len(), c.dormant_count(), c.pins(1).len()), (1, 1, 1));
        assert!(c.get(1).is_none() && c.dormant(1).is_some());
        assert_eq!(c.lookup("a"), Some(1));
        // Woken, it is resident again and its files are no longer held for it.
        c.wake(1, stream(1, "a", 200), 200);
        assert_eq!((c.dormant_count(), c.pins(1).len()), (0, 0));
        assert_eq!(Rc::strong_count(&file), 1);
    }

    #[test]
    fn removing_a_dormant_stream_frees_its_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let mut c = Catalog::new();
        c.insert_dormant(4, "k".into(), dormant(&file), Box::new([]));
        assert_eq!((c.next_id(), c.dormant_count()), (5, 1));
        assert!(c.remove(4).is_none(), "no state in memory to hand back");
        assert_eq!((c.len(), c.dormant_count(), c.lookup("k")), (0, 0, None));
        // A new stream under a key a dormant one held replaces it.
        c.insert_dormant(6, "k".into(), dormant(&file), Box::new([]));
        c.insert(stream(7, "k", 0), 0);
        assert_eq!((c.len(), c.dormant_count(), c.lookup("k")), (1, 0, Some(7)));
    }
}
