//! What the server may see of a stream: two borrowed views, one per purpose.
//!
//! A stream has two ends. The head takes every accepted append at once, before it is
//! durable; the visible end moves only when its group commit's durable write returns. Anything a
//! reader is told (data, offsets, ordinals, closure) must come from the visible end, and
//! only the checks of a new write (offsets, producer sequences, closure) need the head.
//! [`StreamView`] shows the visible end and nothing past it; [`StreamHead`] shows the head
//! for admitting a write. Neither hands out the raw `Stream`, so a read path cannot reach
//! non-durable state by naming the wrong field.

use std::cell::Ref;

use bytes::Bytes;

use crate::position::{Offset, RecordNo};
use crate::record::{Lifetime, SnapshotMeta};
use crate::stream::{Chunk, Producer, ProducerState, Stream, StreamId};

/// A reader's view of a stream: its durable, visible state.
pub struct StreamView<'a>(Ref<'a, Stream>);

/// The head of a stream, for checking a new write against: it includes accepted appends
/// that are not durable yet, so it must never answer a read.
pub struct StreamHead<'a>(Ref<'a, Stream>);

/// Accessors of what does not depend on durability: identity and configuration.
macro_rules! configuration {
    () => {
        pub fn id(&self) -> StreamId {
            self.0.id
        }

        pub fn key(&self) -> &str {
            &self.0.meta.key
        }

        /// The creation token that tells a recreated stream from its predecessor.
        pub fn incarnation(&self) -> u64 {
            self.0.meta.incarnation
        }

        pub fn created_ms(&self) -> i64 {
            self.0.meta.created_ms
        }

        pub fn content_type(&self) -> &str {
            &self.0.meta.content_type
        }

        pub fn lifetime(&self) -> Lifetime {
            self.0.meta.lifetime
        }

        /// Server-owned configuration and state (attributes, fork linkage).
        pub fn ext(&self) -> &Bytes {
            &self.0.meta.ext
        }
    };
}

impl<'a> StreamView<'a> {
    pub(crate) fn new(s: Ref<'a, Stream>) -> Self {
        StreamView(s)
    }

    configuration!();

    /// Offset after the last durable append: a reader's `Stream-Next-Offset` at the end.
    pub fn next_offset(&self) -> Offset {
        self.0.visible_tail
    }

    /// Whether the stream's closure is durable.
    pub fn is_closed(&self) -> bool {
        self.0.visible_closed
    }

    /// First readable offset (the retention point).
    pub fn retained_start(&self) -> Offset {
        self.0.retained_start
    }

    pub fn snapshot(&self) -> Option<&SnapshotMeta> {
        self.0.snapshot.as_ref()
    }

    /// The idempotent producers that have written to the stream, each as of its newest
    /// durable append, sorted by id.
    pub fn producers(&self) -> Vec<ProducerState<'_>> {
        self.0.visible_producers()
    }

    /// Last access, for sliding TTLs.
    pub fn last_access_ms(&self) -> i64 {
        self.0.last_access_ms.get()
    }

    /// Bumped whenever readers could observe something new (data, closure, deletion).
    pub fn version(&self) -> u64 {
        self.0.version()
    }

    /// Ordinal of the first retained record.
    pub fn first_message(&self) -> RecordNo {
        self.0.first_message()
    }

    /// The next record ordinal as readers see it: durable records only.
    pub fn message_count(&self) -> RecordNo {
        self.0.visible_message_count()
    }

    /// Start offset of record `ordinal`, or the visible tail for the ordinal one past the
    /// last durable record; None for trimmed ordinals and ordinals readers cannot see yet.
    pub fn message_start(&self, ordinal: RecordNo) -> Option<Offset> {
        // Records are never empty, so their starts strictly increase: the first start at
        // or past the visible tail belongs to the ordinal one past the last durable record.
        let start = self.0.message_start(ordinal)?;
        let tail = self.0.visible_tail;
        match start.cmp(&tail) {
            std::cmp::Ordering::Less => Some(start),
            std::cmp::Ordering::Equal => Some(tail),
            std::cmp::Ordering::Greater => None,
        }
    }

    /// The largest ordinal `e` in `(start, limit]` with records `[start, e)` ending at or
    /// before `max_end`, but at least `start + 1` when `start < limit`; `limit` is clamped
    /// to the durable records.
    pub fn records_within(&self, start: RecordNo, limit: RecordNo, max_end: Offset) -> RecordNo {
        let limit = limit.min(self.message_count());
        self.0
            .records_within(start, limit, max_end.min(self.0.visible_tail))
    }

    /// Ordinal of the first record starting at or after `offset` (offsets past the visible
    /// tail count as the visible tail).
    pub fn message_at_or_after(&self, offset: Offset) -> RecordNo {
        self.0.message_at_or_after(offset.min(self.0.visible_tail))
    }

    /// Whether `offset` is a record boundary a reader can see: a durable record's start or
    /// the visible tail.
    pub fn is_message_boundary(&self, offset: Offset) -> bool {
        let tail = self.0.visible_tail;
        offset == tail || (offset < tail && self.0.is_message_boundary(offset))
    }

    /// Lengths of the durable records in `[from_msg, to_msg)`; the ordinal one past the
    /// last durable record, if in range, counts as an empty record.
    pub fn message_lens(&self, from_msg: RecordNo, to_msg: RecordNo) -> Vec<u32> {
        let count = self.message_count();
        let mut out = self.0.message_lens(from_msg, to_msg.min(count));
        if to_msg > count && from_msg.max(self.0.first_message()) <= count {
            out.push(0);
        }
        out
    }

    /// The durable write operation that starts at or contains `offset`.
    pub fn chunk_at(&self, offset: Offset) -> Option<Chunk> {
        self.0
            .chunk_at(offset)
            .filter(|c| c.start < self.0.visible_tail)
    }

    /// Every durable write operation, oldest first (for copying history into a fork).
    pub fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        let tail = self.0.visible_tail;
        self.0.chunks().take_while(move |c| c.start < tail)
    }

    /// Bytes of this stream cached in memory.
    pub fn resident_bytes(&self) -> usize {
        self.0.resident_bytes()
    }

    /// Heap bytes of the stream's chunk table and record index.
    pub fn index_heap_bytes(&self) -> usize {
        self.0.index_heap_bytes()
    }
}

impl<'a> StreamHead<'a> {
    pub(crate) fn new(s: Ref<'a, Stream>) -> Self {
        StreamHead(s)
    }

    configuration!();

    /// Offset after the last accepted append, durable or not: where the next append lands.
    pub fn tail(&self) -> Offset {
        self.0.tail
    }

    /// Whether a close was accepted (it may not be durable yet).
    pub fn closed(&self) -> bool {
        self.0.closed
    }

    /// The `Stream-Seq` of the last accepted append.
    pub fn last_stream_seq(&self) -> Option<&Bytes> {
        self.0.last_stream_seq.as_ref()
    }

    /// The state of producer `id`, including appends not durable yet.
    pub fn producer(&self, id: &str) -> Option<&Producer> {
        self.0.producers.get(id)
    }

    /// Every producer, in no particular order.
    pub fn producers(&self) -> impl Iterator<Item = (&str, &Producer)> + '_ {
        self.0.producers.iter().map(|(k, p)| (&**k, p))
    }

    /// The ordinal the next accepted record gets.
    pub fn message_count(&self) -> RecordNo {
        self.0.message_count()
    }
}
