//! The owner's ingest state: the source bytes read since the manifest's durable offset,
//! framed into LF-terminated messages, classified by the extractor, and kept as sorted
//! runs of entries until a commit publishes them. No I/O: the owner loop feeds it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Tail;
use crate::config::Config;
use crate::extract::{Extractor, Outcome, SkipKind};
use crate::manifest::{Manifest, Registration, Skipped};
use crate::part::Entry;

pub(super) struct Ingest {
    /// Offset of the manifest's durable end when this segment began.
    pub(super) seg_start: u64,
    /// Offset just past the last complete message read.
    pub(super) done: u64,
    pub(super) done_record: Option<u64>,
    /// Next offset to read (`done` plus the unterminated bytes in `carry`).
    pub(super) pos: u64,
    carry: Vec<u8>,
    /// The line in `carry` is longer than a message may be: discard it up to its LF.
    oversize: bool,
    /// Reading resumed at a retained offset that may lie inside a message.
    resync: bool,
    record_coordinates: bool,
    pub(super) floor: u64,
    /// Sorted runs of entries of this segment, newest last.
    runs: Vec<Arc<Vec<Entry>>>,
    /// Start offset of every message of this segment, with its skip kind if skipped.
    pub(super) msgs: Vec<(u64, Option<SkipKind>)>,
    /// (offset, bytes) of each retention trim in this segment.
    trims: Vec<(u64, u64)>,
    max_span_ms: i64,
    /// When the pending entries are due: the next wall-clock multiple of the commit
    /// interval after they began, so every index of a worker commits in the same round
    /// and their parts and manifests share PUTs.
    commit_at: Option<Instant>,
    interval: Duration,
    pub(super) entries: usize,
}

impl Ingest {
    pub(super) fn start(
        m: &Manifest,
        reg: &Registration,
        reingest: bool,
        interval: Duration,
    ) -> Ingest {
        let (start, record) = if reingest {
            (m.indexed_from_offset, reg.indexed_from_record)
        } else {
            (m.durable_offset, m.durable_record)
        };
        Ingest {
            seg_start: start,
            done: start,
            done_record: if reg.record_coordinates { record } else { None },
            pos: start,
            carry: Vec::new(),
            oversize: false,
            resync: false,
            record_coordinates: reg.record_coordinates,
            floor: m.floor_offset,
            runs: Vec::new(),
            msgs: Vec::new(),
            trims: Vec::new(),
            max_span_ms: 0,
            commit_at: None,
            interval,
            entries: 0,
        }
    }

    pub(super) fn pending(&self) -> bool {
        self.done > self.seg_start || !self.trims.is_empty()
    }

    pub(super) fn commit_due(&self, cfg: &Config) -> bool {
        self.pending()
            && (self.entries >= cfg.commit_entries
                || self.commit_at.is_some_and(|t| t <= Instant::now()))
    }

    pub(super) fn commit_deadline(&self) -> Option<Instant> {
        self.commit_at
    }

    fn mark_pending(&mut self) {
        if self.commit_at.is_none() {
            self.commit_at = Some(crate::batch::aligned(self.interval, Duration::ZERO));
        }
    }

    /// The stream's retained offset moved: raise the floor; bytes trimmed before they
    /// were read are counted and skipped.
    pub(super) fn follow_retention(&mut self, retained: u64, record_first: Option<u64>) {
        if retained > self.floor {
            self.floor = retained;
            self.mark_pending();
        }
        if retained > self.done {
            self.trims.push((self.done, retained - self.done));
            self.done = retained;
            self.pos = retained;
            self.carry.clear();
            self.oversize = false;
            self.resync = true;
            if self.record_coordinates {
                self.done_record = record_first;
            }
            self.mark_pending();
        }
    }

    /// Frame `body` (bytes at `pos`) into LF-terminated messages and classify each.
    pub(super) fn feed(&mut self, body: &[u8], ex: &Extractor) {
        let mut batch = Vec::new();
        let mut rest = body;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let (line_part, after) = rest.split_at(i);
            rest = &after[1..];
            let start = self.done;
            let len = (self.carry.len() + line_part.len() + 1) as u64;
            let len = if self.oversize {
                self.pos + i as u64 + 1 - start
            } else {
                len
            };
            let outcome = if self.oversize {
                Some(Outcome::Skip(SkipKind::Oversize))
            } else if self.carry.is_empty() {
                classify(line_part, ex)
            } else {
                self.carry.extend_from_slice(line_part);
                let o = classify(&self.carry, ex);
                self.carry.clear();
                o
            };
            self.pos += i as u64 + 1;
            self.done = start + len;
            self.oversize = false;
            // The first line after a retention jump may be the tail of a message the trim
            // cut through (a source that trims mid-line): if it does not parse, it belongs
            // to the trimmed bytes, and reading is in step again after its LF.
            if std::mem::take(&mut self.resync)
                && matches!(outcome, Some(Outcome::Skip(SkipKind::Unparseable)))
            {
                self.trims.push((start, len));
                continue;
            }
            let Some(outcome) = outcome else { continue }; // blank line: not a message
            let record = self.done_record;
            if let Some(r) = &mut self.done_record {
                *r += 1;
            }
            match outcome {
                Outcome::Entry { t_ms, t_end_ms } => {
                    batch.push(Entry {
                        t_ms,
                        t_end_ms,
                        offset: start,
                        len,
                        record,
                    });
                    self.max_span_ms = self.max_span_ms.max(t_end_ms - t_ms);
                    self.msgs.push((start, None));
                }
                Outcome::Skip(k) => self.msgs.push((start, Some(k))),
            }
        }
        // Unterminated remainder: keep it until its LF arrives.
        if !rest.is_empty() {
            if !self.oversize && self.carry.len() + rest.len() > crate::extract::MAX_MESSAGE_BYTES {
                self.oversize = true;
                self.carry = Vec::new();
            }
            if !self.oversize {
                self.carry.extend_from_slice(rest);
            }
            self.pos += rest.len() as u64;
        }
        if !batch.is_empty() {
            self.entries += batch.len();
            batch.sort_by_key(|e| e.key());
            self.runs.push(Arc::new(batch));
            if self.runs.len() > 8 {
                let merged = self.sorted_entries();
                self.runs = vec![Arc::new(merged)];
            }
        }
        if self.done > self.seg_start {
            self.mark_pending();
        }
    }

    pub(super) fn sorted_entries(&self) -> Vec<Entry> {
        let mut all: Vec<Entry> = self.runs.iter().flat_map(|r| r.iter().copied()).collect();
        all.sort_by_key(|e| e.key());
        all
    }

    pub(super) fn is_boundary(&self, off: u64) -> bool {
        off == self.done || self.msgs.binary_search_by_key(&off, |m| m.0).is_ok()
    }

    pub(super) fn skipped_from(&self, cut: u64) -> Skipped {
        let mut s = Skipped::default();
        for (off, k) in &self.msgs {
            if let (true, Some(k)) = (*off >= cut, k) {
                s.count(*k);
            }
        }
        s
    }

    pub(super) fn trimmed_from(&self, cut: u64) -> u64 {
        self.trims.iter().filter(|t| t.0 >= cut).map(|t| t.1).sum()
    }

    pub(super) fn tail(&self) -> Tail {
        let mut skipped = Skipped::default();
        for (_, k) in &self.msgs {
            if let Some(k) = k {
                skipped.count(*k);
            }
        }
        Tail {
            base: self.seg_start,
            end: self.done,
            end_record: self.done_record,
            floor: self.floor,
            runs: self.runs.clone(),
            skipped,
            trimmed: self.trimmed_from(0),
            max_span_ms: self.max_span_ms,
        }
    }

    pub(super) fn committed(&mut self) {
        self.seg_start = self.done;
        self.runs.clear();
        self.msgs.clear();
        self.trims.clear();
        self.max_span_ms = 0;
        self.commit_at = None;
        self.entries = 0;
    }
}

/// `None` for a blank line (not a message).
fn classify(line: &[u8], ex: &Extractor) -> Option<Outcome> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    Some(ex.extract(line))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::ExtractSpec;
    use crate::manifest;
    use crate::source;

    fn reg() -> Registration {
        Registration {
            id: "t".into(),
            stream_url: "http://127.0.0.1:1/s".into(),
            extract: ExtractSpec::captured_at(),
            start: manifest::Start::Retained,
            indexed_from_offset: source::offset_token(0),
            indexed_from_record: None,
            incarnation: None,
            restarted_from_incarnation: None,
            record_coordinates: false,
        }
    }

    #[test]
    fn retention_mid_line_resyncs_at_the_next_lf() {
        let reg = reg();
        let m = Manifest::initial(&reg);
        let ex = Extractor::compile(&reg.extract).expect("extractor");
        let mut ing = Ingest::start(&m, &reg, false, Duration::from_secs(5));
        let l1 = b"{\"captured_at\":1000}\n";
        let l2 = b"{\"nested\":{\"a\":1},\"captured_at\":2000}\n";
        let l3 = b"{\"captured_at\":3000}\n";
        ing.feed(l1, &ex);
        // The source trims into the middle of l2 before it is read.
        let cut = l1.len() + 12;
        ing.follow_retention(cut as u64, None);
        let mut rest = l2[12..].to_vec();
        rest.extend_from_slice(l3);
        ing.feed(&rest, &ex);
        let all = ing.sorted_entries();
        let times: Vec<i64> = all.iter().map(|e| e.t_ms).collect();
        assert_eq!(times, vec![1000, 3000]);
        assert_eq!(all[1].offset, (l1.len() + l2.len()) as u64);
        let t = ing.tail();
        assert_eq!(
            t.skipped,
            Skipped::default(),
            "the fragment is not 'unparseable'"
        );
        assert_eq!(
            t.trimmed,
            l2.len() as u64,
            "the whole cut message counts as trimmed"
        );
        assert_eq!(t.end, (l1.len() + l2.len() + l3.len()) as u64);
        // A trim on a message boundary keeps the next message, and a bad line after the
        // first one is counted as usual.
        let mut ing = Ingest::start(&m, &reg, false, Duration::from_secs(5));
        ing.follow_retention(l1.len() as u64, None);
        let mut rest = l2.to_vec();
        rest.extend_from_slice(b"not json\n");
        ing.feed(&rest, &ex);
        assert_eq!(ing.sorted_entries().len(), 1);
        assert_eq!(ing.tail().skipped.unparseable, 1);
        assert_eq!(ing.tail().trimmed, l1.len() as u64);
    }
}
