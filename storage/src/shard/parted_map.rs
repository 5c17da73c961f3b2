//! A map by stream id split over [`PARTS`] hash tables (by id), for the catalog's dormant
//! entries, which can number millions per shard:
//!
//! * a checkpoint lists the entries one part per slice, with the core's requests served in
//!   between (one walk over a single table of half a million entries held the core for
//!   about 17 ms, mostly cache misses over its 75 MB);
//! * growth rehashes one part at a time, a 256th of the entries, instead of copying the
//!   whole table within one insert.
//!
//! A part is picked by the id's low bits: ids are handed out in sequence, so the parts fill
//! evenly.

use std::collections::HashMap;

use crate::stream::StreamId;

/// Tables a [`PartedMap`] is split over.
pub(super) const PARTS: usize = 256;

pub(super) struct PartedMap<V> {
    parts: Box<[HashMap<StreamId, V, foldhash::fast::RandomState>]>,
    len: usize,
}

impl<V> PartedMap<V> {
    pub(super) fn new() -> PartedMap<V> {
        PartedMap {
            parts: (0..PARTS).map(|_| HashMap::default()).collect(),
            len: 0,
        }
    }

    /// The part stream `id` is in.
    pub(super) fn part_of(id: StreamId) -> usize {
        (id % PARTS as u64) as usize
    }

    pub(super) fn get(&self, id: &StreamId) -> Option<&V> {
        self.parts[Self::part_of(*id)].get(id)
    }

    pub(super) fn contains_key(&self, id: &StreamId) -> bool {
        self.parts[Self::part_of(*id)].contains_key(id)
    }

    /// Enter `value` for `id`; the value it replaces, if any.
    pub(super) fn insert(&mut self, id: StreamId, value: V) -> Option<V> {
        let old = self.parts[Self::part_of(id)].insert(id, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(super) fn remove(&mut self, id: &StreamId) -> Option<V> {
        let old = self.parts[Self::part_of(*id)].remove(id);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&StreamId, &V)> + '_ {
        self.parts.iter().flat_map(|p| p.iter())
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.parts.iter().flat_map(|p| p.values())
    }

    /// The entries of part `part` (`0..PARTS`).
    pub(super) fn part(&self, part: usize) -> impl Iterator<Item = (&StreamId, &V)> + '_ {
        self.parts.get(part).into_iter().flat_map(|p| p.iter())
    }

    /// Entries the tables have room for, summed.
    pub(super) fn capacity(&self) -> usize {
        self.parts.iter().map(HashMap::capacity).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_in_exactly_one_part_and_the_count_follows() {
        let mut m = PartedMap::new();
        for id in 0..2000u64 {
            assert!(m.insert(id, id * 10).is_none());
        }
        assert_eq!(m.insert(7, 1), Some(70), "a replacement adds nothing");
        assert_eq!(m.len(), 2000);
        for id in (0..2000u64).step_by(3) {
            assert!(m.remove(&id).is_some());
        }
        assert!(m.remove(&0).is_none());
        assert_eq!(m.len(), 2000 - 667);
        let mut seen: Vec<StreamId> = (0..PARTS)
            .flat_map(|k| m.part(k).map(|(&id, _)| id))
            .collect();
        seen.sort_unstable();
        let mut all: Vec<StreamId> = m.iter().map(|(&id, _)| id).collect();
        all.sort_unstable();
        assert_eq!(seen, all);
        assert_eq!(seen.len(), m.len());
        assert!((0..PARTS).all(|k| m.part(k).all(|(&id, _)| PartedMap::<u64>::part_of(id) == k)));
        assert_eq!(m.get(&8), Some(&80));
        assert!(m.contains_key(&1999) && !m.contains_key(&3));
        assert!(m.part(PARTS).next().is_none(), "no part past the last");
    }
}
