//! The streaming merge behind compaction: sorted runs in, sorted output parts out, with a
//! bounded number of rows in memory whatever the size of the inputs.
//!
//! Each input is a *run*: one part, or several parts whose rows follow each other in key
//! order (the time-disjoint level-1 parts of a day). A run holds one decoded page slice
//! at a time and opens its next part only when the previous one is exhausted, so the
//! merge holds at most `runs` slices plus the output part being filled:
//! [`buffer_bound`] rows.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use crate::cache::PartCache;
use crate::error::Result;
use crate::part::{Entry, PartFile, ROW_GROUP_ROWS};

/// Most rows a merge of `runs` runs with output parts of `out_max` entries keeps decoded
/// at once: one slice per run (a page, or a whole row group for a part without a page
/// index) and the output part being filled.
pub fn buffer_bound(runs: usize, out_max: usize) -> usize {
    runs * ROW_GROUP_ROWS + out_max
}

/// One sorted input: parts read one after the other, one page slice at a time.
struct Run {
    keys: VecDeque<String>,
    file: Option<Arc<PartFile>>,
    rg: usize,
    slice: usize,
    buf: Vec<Entry>,
    pos: usize,
}

impl Run {
    /// The next entry, decoding the next slice (and opening the next part) when needed.
    async fn peek(&mut self, cache: &PartCache) -> Result<Option<Entry>> {
        loop {
            if let Some(e) = self.buf.get(self.pos) {
                return Ok(Some(*e));
            }
            self.buf = Vec::new();
            self.pos = 0;
            if let Some(f) = &self.file {
                if let Some(slices) = f.pages.get(self.rg) {
                    let g = f.decode_slice(self.rg, self.slice)?;
                    self.buf = (0..g.rows()).map(|r| g.entry(r)).collect();
                    self.slice += 1;
                    if self.slice >= slices.len() {
                        self.rg += 1;
                        self.slice = 0;
                    }
                    continue;
                }
            }
            // Done with this part (or none open yet): drop it before opening the next.
            self.file = None;
            let Some(key) = self.keys.pop_front() else {
                return Ok(None);
            };
            self.file = Some(cache.file(&key).await?);
            self.rg = 0;
            self.slice = 0;
        }
    }
}

/// A k-way merge of sorted runs into output chunks of at most `out_max` entries, sorted by
/// `(t_ms, offset)`, without duplicates and without entries below `floor`.
pub struct Merge {
    runs: Vec<Run>,
    heap: BinaryHeap<Reverse<((i64, u64), usize)>>,
    started: bool,
    floor: u64,
    out_max: usize,
    last: Option<(i64, u64)>,
    /// Most rows held at once (slices of all runs + the output chunk), for tests and logs.
    pub peak_rows: usize,
}

impl Merge {
    /// `runs`: each a list of part keys whose rows are in key order one after the other.
    pub fn new(runs: Vec<Vec<String>>, floor: u64, out_max: usize) -> Merge {
        Merge {
            runs: runs
                .into_iter()
                .map(|keys| Run {
                    keys: keys.into(),
                    file: None,
                    rg: 0,
                    slice: 0,
                    buf: Vec::new(),
                    pos: 0,
                })
                .collect(),
            heap: BinaryHeap::new(),
            started: false,
            floor,
            out_max: out_max.max(1),
            last: None,
            peak_rows: 0,
        }
    }

    fn note_peak(&mut self, out: usize) {
        let held: usize = self.runs.iter().map(|r| r.buf.len()).sum();
        self.peak_rows = self.peak_rows.max(held + out);
    }

    /// The next output chunk; `None` once every run is exhausted.
    pub async fn next_chunk(&mut self, cache: &PartCache) -> Result<Option<Vec<Entry>>> {
        if !self.started {
            self.started = true;
            for i in 0..self.runs.len() {
                if let Some(e) = self.runs[i].peek(cache).await? {
                    self.heap.push(Reverse((e.key(), i)));
                }
                self.note_peak(0);
            }
        }
        let mut out = Vec::new();
        while let Some(Reverse((_, i))) = self.heap.pop() {
            let run = &mut self.runs[i];
            let Some(e) = run.peek(cache).await? else {
                continue;
            };
            run.pos += 1;
            let refill = run.pos >= run.buf.len();
            if let Some(n) = run.peek(cache).await? {
                self.heap.push(Reverse((n.key(), i)));
            }
            if refill {
                self.note_peak(out.len());
            }
            if e.offset < self.floor || self.last == Some(e.key()) {
                continue;
            }
            self.last = Some(e.key());
            out.push(e);
            if out.len() >= self.out_max {
                self.note_peak(out.len());
                return Ok(Some(out));
            }
        }
        self.note_peak(out.len());
        Ok((!out.is_empty()).then_some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::part;
    use crate::store::{DynStore, LocalStore, PutMode};

    fn entries(n: u64, seed: u64) -> Vec<Entry> {
        let mut v: Vec<Entry> = (0..n)
            .map(|i| {
                let offset = (i * 7 + seed) * 100;
                Entry {
                    t_ms: ((offset.wrapping_mul(2_654_435_761)) % 5_000_000) as i64,
                    t_end_ms: 0,
                    offset,
                    len: 100,
                    record: None,
                }
            })
            .collect();
        v.sort_by_key(|e| e.key());
        v
    }

    async fn put(store: &DynStore, name: &str, es: &[Entry]) -> String {
        let bytes = part::encode(es, part::PartCompression::Zstd).expect("encode");
        store
            .put(name, bytes, PutMode::Overwrite)
            .await
            .expect("put");
        name.to_string()
    }

    /// Inputs far larger than the bound: the merge never holds more than `buffer_bound`
    /// rows, and its output is exactly the sorted, de-duplicated union above the floor.
    #[tokio::test]
    async fn merge_streams_inputs_larger_than_its_memory_bound() {
        let dir = tempfile::tempdir().expect("tmp");
        let store: DynStore = Arc::new(LocalStore::open(dir.path()).expect("store"));
        let cache = PartCache::new(store.clone(), None, 64 << 20);
        // Three level-0 parts (seeds 0..=2: disjoint offsets) and one duplicate of the
        // first, merged with a level-1 run of three time-disjoint parts.
        let l0: Vec<Vec<Entry>> = (0..3).map(|s| entries(40_000, s)).collect();
        let mut runs = Vec::new();
        for (i, es) in l0.iter().enumerate() {
            runs.push(vec![put(&store, &format!("l0-{i}"), es).await]);
        }
        runs.push(vec![put(&store, "l0-dup", &l0[0]).await]);
        let l1_all = entries(60_000, 3);
        let mut l1 = Vec::new();
        for (i, c) in l1_all.chunks(20_000).enumerate() {
            l1.push(put(&store, &format!("l1-{i}"), c).await);
        }
        runs.push(l1);
        let n_runs = runs.len();
        let floor = 50_000;
        let out_max = 4096;
        let mut merge = Merge::new(runs, floor, out_max);
        let mut got = Vec::new();
        let mut chunks = 0;
        while let Some(c) = merge.next_chunk(&cache).await.expect("merge") {
            assert!(c.len() <= out_max);
            got.extend(c);
            chunks += 1;
        }
        let mut want: Vec<Entry> = l0.iter().flatten().chain(&l1_all).copied().collect();
        want.retain(|e| e.offset >= floor);
        want.sort_by_key(|e| e.key());
        want.dedup();
        let total_in = 4 * 40_000 + 60_000;
        assert_eq!(got.len(), want.len());
        assert!(got == want, "merged output differs from the sorted union");
        assert_eq!(chunks, want.len().div_ceil(out_max));
        let bound = buffer_bound(n_runs, out_max);
        assert!(
            merge.peak_rows <= bound,
            "peak {} rows > bound {bound}",
            merge.peak_rows
        );
        assert!(
            bound * 4 < total_in,
            "the inputs ({total_in} rows) must dwarf the bound ({bound})"
        );
        // Page slices, not row groups: a run holds at most one 1024-row page.
        assert!(
            merge.peak_rows <= n_runs * part::PAGE_ROWS + out_max,
            "peak {} rows",
            merge.peak_rows
        );
    }
}
