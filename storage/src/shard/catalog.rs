//! The catalog: every stream of the shard by id and by key, the ids and creation tokens
//! handed out, and whether each stream is resident or dormant.
//!
//! A resident stream has its whole state in memory (a [`Stream`]: tables, producers, cache,
//! waiters). A stream nobody has used for a while is made dormant (see `dormancy`): its state
//! is saved in an index file and memory keeps only a [`Dormant`] entry (where the state is,
//! when the stream expires, how many bytes it holds; 40 bytes) and its key, and the index
//! files its tables' pages are in, for the few streams whose tables have pages. So a shard's
//! memory grows with the streams in use, not with every stream it keeps. The catalog does no
//! I/O: the shard reads a dormant stream's state back and hands it to [`Catalog::wake`].
//!
//! A checkpoint captures the streams in slices, with requests served in between
//! ([`Catalog::begin_checkpoint`]), and still gets every stream exactly as it was when it
//! began: a resident stream about to change (or leave) before its slice comes is captured
//! first, and a dormant entry that leaves dormancy (its stream woke or went away) is kept
//! aside as it was.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::rc::Rc;

use hashbrown::hash_table::Entry as KeySlot;
use hashbrown::HashTable;

use super::parted_map::PartedMap;
use super::FastMap;
use crate::checkpoint::CapturedStream;
use crate::index::{IndexFile, IndexFileNo};
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

/// A dormant stream as a checkpoint lists it.
pub(crate) struct DormantView<'a> {
    pub(crate) key: &'a str,
    pub(crate) dormant: &'a Dormant,
    pub(crate) pins: &'a [Rc<IndexFile>],
}

pub(super) struct Catalog {
    /// Resident streams and dormant ones, apart: what walks the resident streams (the
    /// upkeep round's look for pages to write, a metrics scrape) costs what they number,
    /// not what every stream kept numbers. A stream is in one of the two.
    resident: FastMap<StreamId, Box<Stream>>,
    /// In parts, so a checkpoint lists them a part per slice (see `parted_map`).
    dormant: PartedMap<Sleeping>,
    /// Dormant streams by the index file their saved state is in (files without any are
    /// left out): what index file compaction looks at.
    states_in: FastMap<IndexFileNo, u32>,
    /// Every stream's id, found by its key. The key itself is in the stream's entry (the
    /// resident stream's identity, or beside the dormant entry), so it is stored once, and
    /// a dormant stream's key is at hand from its id. Every id here has an entry.
    keys: HashTable<StreamId>,
    key_hasher: foldhash::fast::RandomState,
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
    /// While a checkpoint captures the streams: its number, the captures of resident
    /// streams taken early, and the dormant entries that left since it began.
    checkpoint: Option<CheckpointCapture>,
    /// Checkpoint captures begun (a stream's `captured` is one of these numbers).
    captures_begun: u64,
    /// Bytes of all keys, and index files pinned by dormant streams (for `heap_bytes`).
    key_bytes: usize,
    pinned: usize,
}

/// A dormant stream's entry and its key.
struct Sleeping {
    key: Box<str>,
    dormant: Dormant,
}

/// A stream's entry on its way into or out of the catalog.
enum Entry {
    Resident(Box<Stream>),
    Dormant(Sleeping),
}

/// Stream `id`'s key, wherever its entry is.
fn key_of<'a>(
    resident: &'a FastMap<StreamId, Box<Stream>>,
    dormant: &'a PartedMap<Sleeping>,
    id: StreamId,
) -> Option<&'a str> {
    match resident.get(&id) {
        Some(s) => Some(&s.meta.key),
        None => dormant.get(&id).map(|d| &*d.key),
    }
}

/// A dormant entry a checkpoint in progress still needs, with what it pinned.
struct Departed {
    key: Box<str>,
    dormant: Dormant,
    pins: Box<[Rc<IndexFile>]>,
}

/// The streams a checkpoint holds, numbered when it began: the resident ones' ids, and how
/// many were dormant (listed a part at a time, [`Catalog::listed_dormant_part`]).
pub(crate) struct CheckpointListing {
    pub(crate) resident: Vec<StreamId>,
    pub(crate) dormant: usize,
}

/// A checkpoint's capture in progress.
struct CheckpointCapture {
    number: u64,
    /// Resident streams captured before their slice came, because they were about to
    /// change or leave.
    early: FastMap<StreamId, CapturedStream>,
    /// Dormant entries that left dormancy, as they were (the first departure of each).
    departed: FastMap<StreamId, Departed>,
}

impl CheckpointCapture {
    /// Resident stream `id` is about to change or leave: capture it first, unless this
    /// checkpoint holds it already or it is not part of it.
    fn before_change(&mut self, id: StreamId, s: &mut Stream) {
        if s.captured < self.number {
            s.captured = self.number;
            self.early.insert(id, CapturedStream::of(s));
        }
    }
}

impl Catalog {
    /// An empty catalog whose first stream gets id `first_id` (at least 1).
    pub(super) fn new(first_id: StreamId) -> Catalog {
        Catalog {
            resident: FastMap::default(),
            dormant: PartedMap::new(),
            states_in: FastMap::default(),
            keys: HashTable::new(),
            key_hasher: foldhash::fast::RandomState::default(),
            next_id: first_id.max(1),
            last_incarnation: 0,
            by_use: BinaryHeap::new(),
            deadlines: BinaryHeap::new(),
            pins: FastMap::default(),
            checkpoint: None,
            captures_begun: 0,
            key_bytes: 0,
            pinned: 0,
        }
    }

    pub(super) fn lookup(&self, key: &str) -> Option<StreamId> {
        let (resident, dormant) = (&self.resident, &self.dormant);
        self.keys
            .find(self.key_hasher.hash_one(key), |&id| {
                key_of(resident, dormant, id) == Some(key)
            })
            .copied()
    }

    /// Stream `id` if it is resident.
    pub(super) fn get(&self, id: StreamId) -> Option<&Stream> {
        self.resident.get(&id).map(|s| &**s)
    }

    /// Stream `id` if it is resident, to change it.
    pub(super) fn get_mut(&mut self, id: StreamId) -> Option<&mut Stream> {
        let s = self.resident.get_mut(&id)?;
        if let Some(c) = &mut self.checkpoint {
            c.before_change(id, s);
        }
        s.changes += 1;
        Some(s)
    }

    /// Stream `id`'s dormant entry, if it is dormant.
    pub(super) fn dormant(&self, id: StreamId) -> Option<&Dormant> {
        self.dormant.get(&id).map(|d| &d.dormant)
    }

    /// The index files dormant stream `id`'s tables' pages are in.
    pub(super) fn pins(&self, id: StreamId) -> &[Rc<IndexFile>] {
        self.pins.get(&id).map_or(&[], |p| p)
    }

    pub(super) fn contains(&self, id: StreamId) -> bool {
        self.resident.contains_key(&id) || self.dormant.contains_key(&id)
    }

    /// Streams, resident and dormant.
    pub(super) fn len(&self) -> usize {
        self.resident.len() + self.dormant.len()
    }

    pub(super) fn dormant_count(&self) -> usize {
        self.dormant.len()
    }

    /// Every stream's key, in no particular order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        let resident = self.resident.values().map(|s| &*s.meta.key);
        resident.chain(self.dormant.values().map(|d| &*d.key))
    }

    pub(super) fn resident(&self) -> impl Iterator<Item = &Stream> + '_ {
        self.resident.values().map(|s| &**s)
    }

    pub(super) fn resident_mut(&mut self) -> impl Iterator<Item = &mut Stream> + '_ {
        self.resident.values_mut().map(|s| &mut **s)
    }

    /// Dormant streams whose saved state is in index file `number`.
    pub(super) fn states_in(&self, number: IndexFileNo) -> u32 {
        self.states_in.get(&number).copied().unwrap_or(0)
    }

    /// Dormant streams of part `part` (`0..PARTS`, see `parted_map`) whose saved state is
    /// in one of `files`.
    pub(super) fn dormant_in(&self, files: &[IndexFileNo], part: usize) -> Vec<StreamId> {
        self.dormant
            .part(part)
            .filter(|(_, d)| files.contains(&d.dormant.state.file.number))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Bytes of data the dormant streams hold.
    pub(super) fn dormant_data_bytes(&self) -> u64 {
        self.dormant.values().map(|d| d.dormant.data_bytes).sum()
    }

    /// Begin a checkpoint of the streams as they are now: returns the resident ones' ids
    /// and the number of dormant ones, which [`Catalog::listed_dormant_part`] lists a part
    /// at a time. Until [`Catalog::end_checkpoint`], [`Catalog::capture_resident`] and
    /// [`Catalog::listed_dormant`] give each of them as it is now, whatever happens to it
    /// meanwhile, so the caller can take them in slices and serve requests in between.
    ///
    /// No entry becomes dormant while a checkpoint is open (streams go to sleep only in the
    /// upkeep task's own rounds, which a checkpoint is one of, and at recovery): the dormant
    /// table only loses entries, and those are kept aside, so a part listed later still
    /// gives exactly the entries it had when the checkpoint began.
    pub(super) fn begin_checkpoint(&mut self) -> CheckpointListing {
        self.captures_begun += 1;
        self.checkpoint = Some(CheckpointCapture {
            number: self.captures_begun,
            early: FastMap::default(),
            departed: FastMap::default(),
        });
        CheckpointListing {
            resident: self.resident.keys().copied().collect(),
            dormant: self.dormant.len(),
        }
    }

    /// Resident stream `id` as it was when the checkpoint began (once: None after that, and
    /// for a stream that was not resident then).
    pub(super) fn capture_resident(&mut self, id: StreamId) -> Option<CapturedStream> {
        let c = self.checkpoint.as_mut()?;
        if let Some(early) = c.early.remove(&id) {
            return Some(early);
        }
        let s = self.resident.get_mut(&id)?;
        if s.captured >= c.number {
            return None;
        }
        s.captured = c.number;
        Some(CapturedStream::of(s))
    }

    /// The ids of the streams of part `part` (`0..PARTS`) that were dormant when the
    /// checkpoint began: those still dormant and those that left since.
    pub(super) fn listed_dormant_part(&self, part: usize) -> Vec<StreamId> {
        let mut ids: Vec<StreamId> = self.dormant.part(part).map(|(&id, _)| id).collect();
        if let Some(c) = &self.checkpoint {
            ids.extend(
                c.departed
                    .keys()
                    .copied()
                    .filter(|&id| PartedMap::<Sleeping>::part_of(id) == part),
            );
        }
        ids
    }

    /// Dormant stream `id` as it was when the checkpoint began (None if it was not dormant
    /// then and is not now).
    pub(super) fn listed_dormant(&self, id: StreamId) -> Option<DormantView<'_>> {
        if let Some(d) = self.checkpoint.as_ref().and_then(|c| c.departed.get(&id)) {
            return Some(DormantView {
                key: &d.key,
                dormant: &d.dormant,
                pins: &d.pins,
            });
        }
        let d = self.dormant.get(&id)?;
        Some(DormantView {
            key: &d.key,
            dormant: &d.dormant,
            pins: self.pins(id),
        })
    }

    /// The checkpoint has what it needs: what was kept for it is dropped.
    pub(super) fn end_checkpoint(&mut self) {
        self.checkpoint = None;
    }

    #[cfg(test)]
    pub(super) fn checkpoint_open(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// Mark a stream that joins the catalog during a checkpoint as not part of it.
    fn not_in_checkpoint(&self, s: &mut Stream) {
        if let Some(c) = &self.checkpoint {
            s.captured = c.number;
        }
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
    pub(super) fn insert(&mut self, mut stream: Stream, now_ms: i64) -> Option<Stream> {
        let id = stream.id;
        self.not_in_checkpoint(&mut stream);
        self.incarnation_taken(stream.meta.incarnation);
        self.taken_below(id + 1);
        self.put(id, Entry::Resident(Box::new(stream)));
        let replaced = self.bind_key(id);
        self.push_use(id, now_ms);
        replaced
    }

    /// Add a dormant stream (recovery).
    pub(super) fn insert_dormant(
        &mut self,
        id: StreamId,
        key: Box<str>,
        dormant: Dormant,
        pins: Box<[Rc<IndexFile>]>,
    ) {
        self.taken_below(id + 1);
        if dormant.deadline_ms != i64::MAX {
            self.deadlines.push(Reverse((dormant.deadline_ms, id)));
        }
        self.put(id, Entry::Dormant(Sleeping { key, dormant }));
        self.bind_key(id);
        self.pin(id, pins);
    }

    fn pin(&mut self, id: StreamId, pins: Box<[Rc<IndexFile>]>) {
        if !pins.is_empty() {
            self.pinned += pins.len();
            self.pins.insert(id, pins);
        }
    }

    /// Point the key of entry `id` (in the entries already) at `id`; the stream it named
    /// before is removed and returned if it was resident.
    fn bind_key(&mut self, id: StreamId) -> Option<Stream> {
        let Catalog {
            resident,
            dormant,
            keys,
            key_hasher,
            ..
        } = self;
        let key = key_of(resident, dormant, id)?;
        let slot = keys.entry(
            key_hasher.hash_one(key),
            |&other| key_of(resident, dormant, other) == Some(key),
            |&other| key_hasher.hash_one(key_of(resident, dormant, other).unwrap_or("")),
        );
        let old = match slot {
            KeySlot::Occupied(mut o) => std::mem::replace(o.get_mut(), id),
            KeySlot::Vacant(v) => {
                self.key_bytes += key.len();
                v.insert(id);
                return None;
            }
        };
        if old == id {
            return None;
        }
        self.take(old)
    }

    /// Enter `entry` for `id`; the entry `id` had (a stream replaced, or the same stream
    /// going to sleep or waking) leaves first.
    fn put(&mut self, id: StreamId, entry: Entry) {
        self.take(id);
        match entry {
            Entry::Resident(s) => {
                self.resident.insert(id, s);
            }
            Entry::Dormant(d) => {
                assert!(
                    self.checkpoint.is_none(),
                    "no stream goes to sleep while a checkpoint lists them"
                );
                *self
                    .states_in
                    .entry(d.dormant.state.file.number)
                    .or_default() += 1;
                self.dormant.insert(id, d);
            }
        }
    }

    /// Remove entry `id` (its key stays bound); the stream if it was resident.
    fn take(&mut self, id: StreamId) -> Option<Stream> {
        let entry = match self.resident.remove(&id) {
            Some(s) => Entry::Resident(s),
            None => {
                let d = self.dormant.remove(&id)?;
                let number = d.dormant.state.file.number;
                if let Some(n) = self.states_in.get_mut(&number) {
                    *n -= 1;
                    if *n == 0 {
                        self.states_in.remove(&number);
                    }
                }
                Entry::Dormant(d)
            }
        };
        self.retire(id, entry)
    }

    /// An entry left the table: count it out of the totals and release what it pinned; a
    /// checkpoint in progress keeps it as it was. Returns the stream if it was resident.
    fn retire(&mut self, id: StreamId, entry: Entry) -> Option<Stream> {
        match entry {
            Entry::Resident(mut s) => {
                if let Some(c) = &mut self.checkpoint {
                    c.before_change(id, &mut s);
                }
                Some(*s)
            }
            Entry::Dormant(Sleeping { key, dormant }) => {
                let pins = self.pins.remove(&id).unwrap_or_default();
                self.pinned -= pins.len();
                if let Some(c) = &mut self.checkpoint {
                    c.departed
                        .entry(id)
                        .or_insert(Departed { key, dormant, pins });
                }
                None
            }
        }
    }

    /// Remove stream `id` and its key; returns it if it was resident.
    pub(super) fn remove(&mut self, id: StreamId) -> Option<Stream> {
        let key = key_of(&self.resident, &self.dormant, id)?;
        let hash = self.key_hasher.hash_one(key);
        let len = key.len();
        if let Ok(slot) = self.keys.find_entry(hash, |&other| other == id) {
            slot.remove();
            self.key_bytes -= len;
        }
        self.take(id)
    }

    /// Replace dormant stream `id`'s entry with its state, read back from disk; used now.
    pub(super) fn wake(&mut self, id: StreamId, mut stream: Stream, now_ms: i64) {
        assert!(
            stream.id == id
                && self
                    .dormant
                    .get(&id)
                    .is_some_and(|d| *d.key == *stream.meta.key),
            "only a dormant stream wakes, with its own state"
        );
        // A checkpoint in progress has it as it slept.
        self.not_in_checkpoint(&mut stream);
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
            if let Some(s) = self.resident.get(&id) {
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
        for (&id, s) in &self.resident {
            s.used_ms.set(used_ms);
            self.by_use.push(Reverse((used_ms, id)));
        }
    }

    /// The earliest time the use order has for a resident stream (its last use is at or
    /// after it).
    pub(super) fn oldest_use(&self) -> Option<i64> {
        self.by_use.peek().map(|&Reverse((t, _))| t)
    }

    /// Put an idle stream back in the use order: it stays resident.
    pub(super) fn keep(&mut self, id: StreamId, now_ms: i64) {
        if self.resident.contains_key(&id) {
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
        let key = match self.resident.get(&id) {
            Some(s) if s.changes == changes && s.used_ms.get() == used => s.meta.key.clone(),
            _ => return None,
        };
        if d.deadline_ms != i64::MAX {
            self.deadlines.push(Reverse((d.deadline_ms, id)));
        }
        // The key's slot holds only the id, so swapping the entry leaves it valid.
        let stream = self.take(id);
        self.put(id, Entry::Dormant(Sleeping { key, dormant: d }));
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
        if self.deadlines.len() > 2 * self.dormant.len() + 1024 {
            self.deadlines = self
                .dormant
                .iter()
                .filter(|(_, d)| d.dormant.deadline_ms != i64::MAX)
                .map(|(&id, d)| Reverse((d.dormant.deadline_ms, id)))
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
        let entries = self.resident.capacity() * (size_of::<(StreamId, Box<Stream>)>() + 1)
            + self.dormant.capacity() * (size_of::<(StreamId, Sleeping)>() + 1)
            + self.states_in.capacity() * (size_of::<(IndexFileNo, u32)>() + 1);
        let keys = self.keys.capacity() * (size_of::<StreamId>() + 1);
        let orders = self.by_use.capacity() * size_of::<Reverse<(i64, StreamId)>>()
            + self.deadlines.capacity() * size_of::<Reverse<(i64, StreamId)>>();
        let pins = self.pins.capacity() * (size_of::<(StreamId, Box<[Rc<IndexFile>]>)>() + 1)
            + self.pinned * size_of::<Rc<IndexFile>>();
        let checkpoint = self.checkpoint.as_ref().map_or(0, |c| {
            c.departed.capacity() * (size_of::<(StreamId, Departed)>() + 1)
                + c.early.capacity() * (size_of::<(StreamId, CapturedStream)>() + 1)
        });
        entries + keys + self.key_bytes + pins + orders + checkpoint
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
        // What every dormant stream costs beside its key's bytes: the table slot is this
        // plus the id, and the key index's slot another id.
        assert!(
            std::mem::size_of::<Sleeping>() <= 56,
            "{}",
            std::mem::size_of::<Sleeping>()
        );
    }

    #[test]
    fn only_streams_unused_since_the_cutoff_are_idle_and_each_once() {
        let mut c = Catalog::new(1);
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
        let mut c = Catalog::new(1);
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
    fn a_checkpoint_gets_the_dormant_streams_as_they_were_when_it_began() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let mut c = Catalog::new(1);
        for (id, key) in [(1, "a"), (2, "b"), (3, "c")] {
            c.insert_dormant(id, key.into(), dormant(&file), Box::new([file.clone()]));
        }
        c.insert(stream(4, "d", 0), 0);
        assert_eq!(c.begin_checkpoint().dormant, 3);
        assert_eq!(listed_dormant(&c), vec![1, 2, 3], "the dormant ones");
        // Meanwhile one wakes, one goes away, and a new stream takes a listed one's key.
        c.wake(1, stream(1, "a", 5), 5);
        assert!(c.remove(2).is_none());
        c.insert(stream(5, "c", 6), 6);
        assert_eq!(listed_dormant(&c), vec![1, 2, 3], "as when it began");
        for (id, key) in [(1, "a"), (2, "b"), (3, "c")] {
            let d = c.listed_dormant(id).expect("still listed");
            assert_eq!((d.key, d.dormant.data_bytes, d.pins.len()), (key, 7, 1));
        }
        assert!(
            c.listed_dormant(4).is_none(),
            "resident when the checkpoint began"
        );
        assert_eq!(
            Rc::strong_count(&file),
            1 + 3 * 2,
            "a departed entry still holds its files"
        );
        c.end_checkpoint();
        assert!(c.listed_dormant(2).is_none() && c.listed_dormant(3).is_none());
        assert_eq!(Rc::strong_count(&file), 1);
        assert_eq!(
            (c.lookup("a"), c.lookup("b"), c.lookup("c")),
            (Some(1), None, Some(5))
        );
        let mut keys: Vec<&str> = c.keys().collect();
        keys.sort_unstable();
        assert_eq!(keys, ["a", "c", "d"]);
    }

    /// The count of dormant states per index file matches the dormant entries.
    fn assert_states_counted(c: &Catalog) {
        let counted: u32 = c.states_in.values().sum();
        assert_eq!(counted as usize, c.dormant.len());
    }

    /// Every dormant id of a checkpoint begun on `c`, part by part.
    fn listed_dormant(c: &Catalog) -> Vec<StreamId> {
        let mut ids: Vec<StreamId> = (0..super::super::parted_map::PARTS)
            .flat_map(|k| c.listed_dormant_part(k))
            .collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn states_per_file_follow_every_sleep_wake_and_removal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let mut c = Catalog::new(1);
        for id in 1..=50 {
            c.insert_dormant(id, format!("s{id}").into(), dormant(&file), Box::new([]));
        }
        assert_states_counted(&c);
        assert_eq!(c.states_in(file.number), 50);
        // Wake every third, remove every fifth, and put some of the woken back to sleep.
        for id in (1..=50).step_by(3) {
            c.wake(id, stream(id, &format!("s{id}"), 1), 1);
            assert_states_counted(&c);
        }
        for id in (1..=50).step_by(5) {
            c.remove(id);
            assert_states_counted(&c);
        }
        for id in (1..=50).step_by(6) {
            if let Some(s) = c.get(id) {
                let saved = (s.changes, s.used_ms.get());
                assert!(c.sleep(id, saved, dormant(&file), Box::new([])).is_some());
                assert_states_counted(&c);
            }
        }
        let listing = c.begin_checkpoint();
        let listed = listed_dormant(&c);
        let mut dormant: Vec<StreamId> = c.dormant.iter().map(|(&id, _)| id).collect();
        dormant.sort_unstable();
        assert_eq!((listed.len(), &listed), (listing.dormant, &dormant));
        c.end_checkpoint();
        let in_file = (0..super::super::parted_map::PARTS)
            .map(|k| c.dormant_in(&[file.number], k).len())
            .sum::<usize>();
        assert_eq!(in_file, c.states_in(file.number) as usize);
    }

    #[test]
    fn a_checkpoint_gets_the_resident_streams_as_they_were_when_it_began() {
        let mut c = Catalog::new(1);
        for (id, key) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            c.insert(stream(id, key, 0), 0);
        }
        let listing = c.begin_checkpoint();
        let mut ids = listing.resident.clone();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2, 3, 4]);
        // Before their slices come: one changes, one is removed, a new one takes the key
        // of another, and a stream is created.
        c.get_mut(1).expect("a").closed = true;
        c.remove(2);
        c.insert(stream(5, "c", 1), 1);
        c.insert(stream(6, "f", 1), 1);
        c.get_mut(6).expect("f");
        let captured: Vec<_> = (1..=6).map(|id| c.capture_resident(id)).collect();
        let closed = |i: usize| captured[i].as_ref().map(|s| s.image().closed);
        assert_eq!(closed(0), Some(false), "a as it was, not as it became");
        assert!(
            captured[1].is_some() && captured[2].is_some(),
            "removed ones as they were"
        );
        assert!(captured[3].is_some(), "an unchanged one, in its slice");
        assert!(
            captured[4].is_none() && captured[5].is_none(),
            "not part of it"
        );
        assert!(c.capture_resident(4).is_none(), "each once");
        c.end_checkpoint();
        // The next checkpoint gets every stream again.
        let mut ids = c.begin_checkpoint().resident;
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 4, 5, 6]);
        assert!(ids.iter().all(|&id| c.capture_resident(id).is_some()));
    }

    #[test]
    fn a_key_is_found_whether_its_stream_is_resident_or_dormant() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let mut c = Catalog::new(1);
        // Enough streams that the key index grows (rehashing from the entries' keys).
        for id in 1..=2000 {
            c.insert(stream(id, &format!("k{id}"), 0), 0);
        }
        for id in (1..=2000).step_by(2) {
            let saved = (c.get(id).expect("resident").changes, 0);
            assert!(c.sleep(id, saved, dormant(&file), Box::new([])).is_some());
        }
        for id in 1..=2000 {
            assert_eq!(c.lookup(&format!("k{id}")), Some(id));
        }
        assert_eq!(c.lookup("k0"), None);
        assert_eq!((c.len(), c.dormant_count()), (2000, 1000));
        for id in 1..=1000 {
            c.remove(id);
        }
        assert_eq!(c.lookup("k1000"), None);
        assert_eq!(c.lookup("k1001"), Some(1001));
        assert_eq!(
            c.key_bytes,
            (1001..=2000).map(|id| format!("k{id}").len()).sum()
        );
    }

    #[test]
    fn removing_a_dormant_stream_frees_its_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let mut c = Catalog::new(1);
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
