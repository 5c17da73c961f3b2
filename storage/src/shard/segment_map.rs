//! The segment map: for every segment file of the shard, the streams with records in it,
//! and the bytes of data the live streams hold. The cleaner reads it to find what a
//! segment still holds and whether the files take more room than the data; checkpoints
//! save it so that a restart need not read the segments before them.
//!
//! It does no I/O. The commit path notes each record's segment; recovery rebuilds it from
//! the checkpoint and the replayed tail; the cleaner removes a segment once it has
//! rewritten what was still needed from it.
//!
//! Each segment's set is shared, copy on write: a checkpoint takes the whole map at its LSN
//! by sharing every set (a pointer each), and only a set that changes before the
//! checkpoint is done (the segment being written) is copied, by the change.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::FastSet;
use crate::position::SegmentNo;
use crate::stream::StreamId;

#[derive(Default)]
pub(super) struct SegmentMap {
    streams_in: BTreeMap<SegmentNo, Rc<FastSet<StreamId>>>,
    /// Bytes of data held by live streams.
    live_bytes: u64,
}

impl SegmentMap {
    /// A record of stream `id` went into `segment`.
    pub(super) fn note(&mut self, segment: SegmentNo, id: StreamId) {
        Rc::make_mut(self.streams_in.entry(segment).or_default()).insert(id);
    }

    /// `segment` exists (it may hold no stream's records yet, or only deleted ones).
    pub(super) fn add_segment(&mut self, segment: SegmentNo) {
        self.streams_in.entry(segment).or_default();
    }

    /// Streams `ids` have records in `segment` (from a checkpoint's map).
    pub(super) fn extend(&mut self, segment: SegmentNo, ids: impl IntoIterator<Item = StreamId>) {
        Rc::make_mut(self.streams_in.entry(segment).or_default()).extend(ids);
    }

    /// The segment file is gone.
    pub(super) fn remove(&mut self, segment: SegmentNo) {
        self.streams_in.remove(&segment);
    }

    /// Keep only the segments `keep` says still exist.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(SegmentNo) -> bool) {
        self.streams_in.retain(|&seg, _| keep(seg));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.streams_in.is_empty()
    }

    /// Segment files, local and cold.
    pub(super) fn len(&self) -> usize {
        self.streams_in.len()
    }

    pub(super) fn oldest(&self) -> Option<SegmentNo> {
        self.streams_in.keys().next().copied()
    }

    /// Every segment, oldest first.
    pub(super) fn segments(&self) -> impl Iterator<Item = SegmentNo> + '_ {
        self.streams_in.keys().copied()
    }

    /// The streams with records in `segment`.
    pub(super) fn streams_in(&self, segment: SegmentNo) -> Vec<StreamId> {
        self.streams_in
            .get(&segment)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The whole map as it is now, for a checkpoint: every segment's set, shared.
    pub(super) fn snapshot(&self) -> Vec<(SegmentNo, Rc<FastSet<StreamId>>)> {
        self.streams_in
            .iter()
            .map(|(&seg, ids)| (seg, ids.clone()))
            .collect()
    }

    pub(super) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// A live stream gained `bytes` of data.
    pub(super) fn add_live(&mut self, bytes: u64) {
        self.live_bytes += bytes;
    }

    /// Data left the live streams (retention, deletion).
    pub(super) fn release_live(&mut self, bytes: u64) {
        self.live_bytes = self.live_bytes.saturating_sub(bytes);
    }

    /// After recovery: the live streams hold `bytes`.
    pub(super) fn set_live(&mut self, bytes: u64) {
        self.live_bytes = bytes;
    }

    /// Heap bytes the map holds (its sets at their capacity, a node's share per entry).
    pub(super) fn heap_bytes(&self) -> usize {
        self.streams_in
            .values()
            .map(|set| 16 + set.capacity() * (std::mem::size_of::<StreamId>() + 1))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_each_stream_once_per_segment_and_forgets_removed_segments() {
        let mut map = SegmentMap::default();
        let (s1, s2) = (SegmentNo::new(1), SegmentNo::new(2));
        map.note(s1, 7);
        map.note(s1, 7);
        map.note(s1, 8);
        map.add_segment(s2);
        assert_eq!(map.len(), 2);
        assert_eq!(map.oldest(), Some(s1));
        let mut ids = map.streams_in(s1);
        ids.sort();
        assert_eq!(ids, vec![7, 8]);
        assert!(map.streams_in(s2).is_empty());
        map.remove(s1);
        assert_eq!(map.oldest(), Some(s2));
        assert!(map.streams_in(s1).is_empty());
    }

    #[test]
    fn a_snapshot_keeps_the_map_as_it_was_while_the_map_changes() {
        let mut map = SegmentMap::default();
        let (s1, s2) = (SegmentNo::new(1), SegmentNo::new(2));
        map.note(s1, 7);
        let snapshot = map.snapshot();
        map.note(s1, 8);
        map.note(s2, 9);
        map.remove(s1);
        assert_eq!(snapshot.len(), 1);
        assert_eq!(snapshot[0].0, s1);
        assert_eq!(snapshot[0].1.iter().copied().collect::<Vec<_>>(), vec![7]);
        assert_eq!(map.streams_in(s2), vec![9]);
        assert!(map.streams_in(s1).is_empty());
    }

    #[test]
    fn live_bytes_never_go_below_zero() {
        let mut map = SegmentMap::default();
        map.add_live(10);
        map.release_live(4);
        assert_eq!(map.live_bytes(), 6);
        map.release_live(100);
        assert_eq!(map.live_bytes(), 0);
    }
}
