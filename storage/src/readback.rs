//! Reading evicted chunks back from the log: neighbouring records are fetched with one
//! direct-I/O read, and several reads are in flight at once.
//!
//! A stream written by small appends has one record per append. Fetching each with its own
//! queue-depth-1 read made a cold 8 MiB response of 1 KiB appends 8192 sequential reads
//! (about 0.5 s here). Records of one stream usually sit close together in a segment, so a
//! span covers many of them, and the spans of one response are read concurrently.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;

use bytes::Bytes;

use crate::aligned::{align_down, align_up, AlignedBuf};
use crate::limits::{READ_GAP_BYTES_MAX, READ_SPAN_BYTES_MAX};
use crate::position::{Offset, SegmentNo};
use crate::stream::DiskLoc;

/// One chunk wanted from a span: where its record is, and which bytes of it to return.
pub(crate) struct Part {
    /// Index of the response piece this fills.
    pub slot: usize,
    pub loc: DiskLoc,
    pub chunk_start: Offset,
    pub chunk_len: u32,
    /// Byte range wanted within the chunk.
    pub from: usize,
    pub to: usize,
}

/// A contiguous, block-aligned range of one segment file covering one or more records.
pub(crate) struct Span {
    /// The local segment file; `None` for a segment only in the cold tier.
    pub file: Option<Rc<monoio::fs::File>>,
    pub segment: SegmentNo,
    /// Segment positions of the first record and the end of the last (not aligned).
    pub start: u64,
    pub end: u64,
    pub parts: Vec<Part>,
}

impl Span {
    pub(crate) fn new(file: Option<Rc<monoio::fs::File>>, part: Part) -> Span {
        Span {
            file,
            segment: part.loc.segment,
            start: part.loc.record_pos,
            end: part.loc.record_pos + u64::from(part.loc.record_len),
            parts: vec![part],
        }
    }

    /// Add `part` if its record is in this span's segment, not before its start, and close
    /// enough to its end. Returns the part back if it does not fit.
    pub(crate) fn try_add(&mut self, part: Part) -> Result<(), Part> {
        let rec_start = part.loc.record_pos;
        let rec_end = rec_start + u64::from(part.loc.record_len);
        let fits = part.loc.segment == self.segment
            && rec_start >= self.start
            && rec_start <= self.end + READ_GAP_BYTES_MAX
            && rec_end.max(self.end) - self.start <= READ_SPAN_BYTES_MAX;
        if !fits {
            return Err(part);
        }
        self.end = self.end.max(rec_end);
        self.parts.push(part);
        Ok(())
    }

    /// Bytes the read of this span transfers.
    pub(crate) fn read_len(&self) -> u64 {
        (align_up(self.end as usize) - align_down(self.start as usize)) as u64
    }
}

/// Read segment bytes `[start, end)` widened to whole blocks, as direct I/O requires.
/// Returns the bytes and the segment position of their first byte.
pub(crate) async fn read_aligned(
    file: &monoio::fs::File,
    start: u64,
    end: u64,
) -> std::io::Result<(Bytes, u64)> {
    let from = align_down(start as usize);
    let buf = AlignedBuf::with_capacity(align_up(end as usize) - from);
    let (res, buf) = file.read_exact_at(buf, from as u64).await;
    res?;
    Ok((Bytes::from_owner(buf), from as u64))
}

/// Run `futures` concurrently on this core; their outputs in order.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::seg;
    use crate::test_support::block_on;

    fn part(segment: SegmentNo, record_pos: u64, record_len: u32) -> Part {
        Part {
            slot: 0,
            loc: DiskLoc {
                segment,
                record_pos,
                record_len,
                data_off: 32,
            },
            chunk_start: Offset::ZERO,
            chunk_len: record_len - 32,
            from: 0,
            to: 0,
        }
    }

    fn span(first: Part) -> Span {
        let file = std::fs::File::open("/dev/null").expect("open /dev/null");
        let file = Rc::new(monoio::fs::File::from_std(file).expect("wrap"));
        Span::new(Some(file), first)
    }

    #[test]
    fn neighbouring_records_share_a_span() {
        block_on(async { neighbours() });
    }

    fn neighbours() {
        let mut s = span(part(seg(1), 4096, 1000));
        assert!(s.try_add(part(seg(1), 5096, 1000)).is_ok(), "adjacent");
        assert!(
            s.try_add(part(seg(1), 5096, 1000)).is_ok(),
            "another chunk of the same record"
        );
        assert!(
            s.try_add(part(seg(1), 6096 + READ_GAP_BYTES_MAX, 1000))
                .is_ok(),
            "a gap of READ_GAP_BYTES_MAX"
        );
        assert_eq!(s.parts.len(), 4);
        assert_eq!(s.start, 4096);
        assert_eq!(s.end, 7096 + READ_GAP_BYTES_MAX);
        assert_eq!(
            s.read_len(),
            align_up(7096 + READ_GAP_BYTES_MAX as usize) as u64 - 4096
        );
    }

    #[test]
    fn far_earlier_larger_or_foreign_records_start_a_new_span() {
        block_on(async { strangers() });
    }

    fn strangers() {
        let mut s = span(part(seg(1), 1 << 20, 1000));
        let end = (1 << 20) + 1000;
        assert!(s.try_add(part(seg(2), end, 1000)).is_err(), "other segment");
        assert!(
            s.try_add(part(seg(1), 4096, 1000)).is_err(),
            "before the span"
        );
        assert!(
            s.try_add(part(seg(1), end + READ_GAP_BYTES_MAX + 1, 1000))
                .is_err(),
            "too far"
        );
        assert!(
            s.try_add(part(seg(1), end, READ_SPAN_BYTES_MAX as u32))
                .is_err(),
            "span too long"
        );
        assert_eq!(s.parts.len(), 1);
    }

    #[test]
    fn join_all_keeps_the_order() {
        let out = block_on(join_all(
            [30u64, 10, 20]
                .into_iter()
                .map(|ms| async move {
                    monoio::time::sleep(std::time::Duration::from_millis(ms)).await;
                    ms
                })
                .collect(),
        ));
        assert_eq!(out, vec![30, 10, 20]);
    }
}
