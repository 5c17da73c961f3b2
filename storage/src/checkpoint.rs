//! Checkpoints: every stream's state at one LSN, so recovery reads only the log after it.
//!
//! A checkpoint holds, for each resident stream, its image (the same payload as an Image log
//! record) and its chunk table and record index as `packed` tables: pages that are in index
//! files by reference (file number, position, length), the rest by value (the pages
//! completed since the last index file, fewer than a page of blocks, and the newest
//! entries). So its size grows with streams and segments, not with retained appends. A
//! dormant stream (see `shard::dormancy`) is named by where its saved state is, beside its
//! key, instead. After the streams comes the cleaner's map of which streams have data in
//! which segment. Recovery loads it
//! and replays only the records after its LSN, starting at the log position it names;
//! segments before that position are not read at all.
//!
//! ```text
//! 0..8     magic "URSCKPT1"
//! 8..12    CRC32C of bytes 12..88
//! 12..16   format version (1)
//! 16..20   shard
//! 20..28   LSN of the last record the checkpoint covers
//! 28..36   segment where the log continues
//! 36..44   position in that segment of the first record after the LSN
//! 44..52   next stream id
//! 52..60   last creation incarnation handed out
//! 60..68   snapshot blob counter
//! 68..76   number of resident streams
//! 76..84   body length
//! 84..88   CRC32C of the body
//! 88..     body: per resident stream, a framed Image record, then the chunk table and the
//!          record index (`Packed::encode_into`); then the dormant stream count and per
//!          dormant stream its id, key (length, bytes), saved state (index file, position,
//!          length), deadline (signed), data bytes and the index files its pages are in
//!          (count, numbers); then the segment count and, per segment, its index, its
//!          stream count and those stream ids (LEB128 varints)
//! ```
//!
//! The file is written as `checkpoint.tmp`, synced, and renamed over `checkpoint` only once
//! the log is durable up to its LSN. Once a checkpoint exists the log cleaner relies on it
//! (metadata records in older segments are no longer needed), so a checkpoint that fails its
//! checksum is a hard error, never a silent fallback to a full scan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::error::FormatError;
use crate::index::{IndexFile, IndexFileNo};
use crate::packed::{DiskPage, Packed};
use crate::position::{Lsn, Offset, SegmentNo};
use crate::record::{decode_at, ImageRec, Record};
use crate::shard::Dormant;
use crate::stream::{Chunk, DiskLoc, Stream, StreamId};

const MAGIC: &[u8; 8] = b"URSCKPT1";
const VERSION: u32 = 3;
/// The format before dormant streams: no dormant section. Still read.
const VERSION_ALL_RESIDENT: u32 = 2;
/// The format before index files: every table inline, no segment map. Still read, so a
/// data dir written by an older build opens; the first checkpoint after it is format 2.
const VERSION_INLINE_TABLES: u32 = 1;
const HEADER_LEN: usize = 88;

/// The file a shard's checkpoint lives in, inside its directory.
pub const FILE_NAME: &str = "checkpoint";
pub(crate) const TMP_NAME: &str = "checkpoint.tmp";

/// Shard-wide values a checkpoint records next to the streams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Position {
    /// Last LSN whose effects are in the checkpoint.
    pub lsn: Lsn,
    /// Where the record after `lsn` is (or will be) written.
    pub segment: SegmentNo,
    pub offset: u64,
    pub next_id: u64,
    pub last_incarnation: u64,
    pub blob_counter: u64,
}

/// One stream as loaded from a checkpoint; `tables` is None when a page of them is in an
/// index file that is missing or torn.
pub(crate) struct SavedStream {
    pub image: ImageRec,
    pub tables: Option<(Packed<Chunk>, Packed<Offset>)>,
    /// The chunks do not carry their first record ordinal yet (a format 1 checkpoint);
    /// recovery derives them once the tables are complete.
    pub unnumbered: bool,
}

/// Which streams have data in which segment (the cleaner's work list).
pub(crate) type SegmentMap = BTreeMap<SegmentNo, Vec<StreamId>>;

pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// One stream as a checkpoint captured it: its image and its two tables as of the
/// checkpoint's LSN. A capture shares the tables' pages and frozen blocks with the live
/// stream and copies only their newest, unpacked entries, so capturing every stream of a
/// shard holds its core for far less than encoding them would; the encoding then runs
/// from the captures while the core serves requests in between.
pub(crate) struct CapturedStream {
    image: ImageRec,
    chunks: Packed<Chunk>,
    msgs: Packed<Offset>,
}

impl CapturedStream {
    #[cfg(test)]
    pub(crate) fn image(&self) -> &ImageRec {
        &self.image
    }

    pub(crate) fn of(s: &Stream) -> CapturedStream {
        let (chunks, msgs) = s.tables();
        CapturedStream {
            image: s.image(),
            chunks: chunks.clone(),
            msgs: msgs.clone(),
        }
    }
}

/// A dormant stream as loaded from a checkpoint. `state` is None when its index file is
/// missing or torn, and `pins` misses the files that are.
pub(crate) struct SavedDormant {
    pub id: StreamId,
    pub key: Box<str>,
    pub state: Option<DiskPage>,
    pub state_file: IndexFileNo,
    pub pins: Vec<Rc<IndexFile>>,
    pub pins_complete: bool,
    pub deadline_ms: i64,
    pub data_bytes: u64,
}

/// Builds a checkpoint file image a piece at a time, so a caller can yield between pieces:
/// the resident streams, then the dormant section (its count, then its entries), then the
/// segment map (its count, then each segment). The header's bytes are reserved at the
/// front and filled in last, so the finished image is the buffer itself, not a copy of it
/// (tens of MB with a million streams).
pub(crate) struct Encoder {
    /// The header's place, then the body.
    image: Vec<u8>,
    /// The body's checksum over the image up to `summed`.
    body_crc: u32,
    summed: usize,
    streams: u64,
    /// Entries the section being written still expects.
    expected: u64,
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::with_capacity(0)
    }
}

impl Encoder {
    /// An encoder whose buffer holds `bytes` before it grows. Growing copies what it holds
    /// (tens of MB with a million streams), all in one slice of the caller's work, so the
    /// shard sizes it from the last checkpoint.
    pub(crate) fn with_capacity(bytes: usize) -> Encoder {
        let mut image = Vec::with_capacity(bytes.max(HEADER_LEN));
        image.resize(HEADER_LEN, 0);
        Encoder {
            image,
            body_crc: 0,
            summed: HEADER_LEN,
            streams: 0,
            expected: 0,
        }
    }

    /// A resident stream, as captured.
    pub(crate) fn push(&mut self, s: CapturedStream) {
        Record::Image(s.image).encode(Lsn::NONE, &mut self.image);
        s.chunks.encode_into(&mut self.image);
        s.msgs.encode_into(&mut self.image);
        self.streams += 1;
    }

    /// Begin the dormant section: `count` entries follow.
    pub(crate) fn begin_dormant(&mut self, count: u64) {
        debug_assert_eq!(self.expected, 0, "the previous section is complete");
        put_varint(&mut self.image, count);
        self.expected = count;
    }

    /// Dormant stream `id`'s entry.
    pub(crate) fn push_dormant(
        &mut self,
        id: StreamId,
        key: &str,
        d: &Dormant,
        pins: &[Rc<IndexFile>],
    ) {
        let out = &mut self.image;
        put_varint(out, id);
        put_varint(out, key.len() as u64);
        out.extend_from_slice(key.as_bytes());
        put_varint(out, d.state.file.number.get());
        put_varint(out, d.state.off);
        put_varint(out, u64::from(d.state.len));
        put_varint(out, ((d.deadline_ms << 1) ^ (d.deadline_ms >> 63)) as u64);
        put_varint(out, d.data_bytes);
        put_varint(out, pins.len() as u64);
        for p in pins {
            put_varint(out, p.number.get());
        }
        self.expected -= 1;
    }

    /// Begin the segment map: `count` segments follow.
    pub(crate) fn begin_segments(&mut self, count: u64) {
        debug_assert_eq!(self.expected, 0, "the dormant section is complete");
        put_varint(&mut self.image, count);
        self.expected = count;
    }

    /// Segment `index` and the streams with data in it.
    pub(crate) fn push_segment(
        &mut self,
        index: SegmentNo,
        ids: impl ExactSizeIterator<Item = StreamId>,
    ) {
        put_varint(&mut self.image, index.get());
        put_varint(&mut self.image, ids.len() as u64);
        for id in ids {
            put_varint(&mut self.image, id);
        }
        self.expected -= 1;
    }

    /// Bytes of body encoded so far.
    pub(crate) fn len(&self) -> usize {
        self.image.len() - HEADER_LEN
    }

    /// Checksum what was encoded since the last call (so that `finish` has only the rest).
    pub(crate) fn checksum(&mut self) {
        self.body_crc = crc32c::crc32c_append(self.body_crc, &self.image[self.summed..]);
        self.summed = self.image.len();
    }

    /// The complete file image with its header at `pos`. Every section is complete.
    pub(crate) fn finish(mut self, shard: u32, pos: Position) -> Vec<u8> {
        assert_eq!(self.expected, 0, "a section is short of entries");
        self.checksum();
        let body_len = (self.image.len() - HEADER_LEN) as u64;
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&[0; 4]);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&shard.to_le_bytes());
        for v in [
            pos.lsn.get(),
            pos.segment.get(),
            pos.offset,
            pos.next_id,
            pos.last_incarnation,
            pos.blob_counter,
            self.streams,
            body_len,
        ] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        header.extend_from_slice(&self.body_crc.to_le_bytes());
        debug_assert_eq!(header.len(), HEADER_LEN);
        let header_crc = crc32c::crc32c(&header[12..HEADER_LEN]);
        header[8..12].copy_from_slice(&header_crc.to_le_bytes());
        self.image[..HEADER_LEN].copy_from_slice(&header);
        self.image
    }
}

/// Serialize `streams` and the segment map at `pos` into a complete checkpoint file image
/// in one go (tests; the shard captures, then encodes with [`Encoder`]).
#[cfg(test)]
pub(crate) fn encode<'a>(
    shard: u32,
    pos: Position,
    streams: impl Iterator<Item = &'a Stream>,
    segments: impl Iterator<Item = (SegmentNo, Vec<StreamId>)>,
) -> Vec<u8> {
    let mut encoder = Encoder::default();
    for s in streams {
        encoder.push(CapturedStream::of(s));
    }
    encoder.begin_dormant(0);
    let segments: Vec<_> = segments.collect();
    encoder.begin_segments(segments.len() as u64);
    for (index, ids) in segments {
        encoder.push_segment(index, ids.into_iter());
    }
    encoder.finish(shard, pos)
}

/// What a checkpoint file needs around it, for a copy of the shard elsewhere (the cold
/// tier): where it continues the log, which index files it names, and which segments hold
/// data of its streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointSummary {
    pub lsn: Lsn,
    pub segment: SegmentNo,
    pub position: u64,
    /// The index files the checkpoint's pages are in, ascending.
    pub index_files: Vec<IndexFileNo>,
    /// Segments holding data of its streams (its segment map), ascending.
    pub segments: Vec<SegmentNo>,
}

/// Summarise a checkpoint file of `shard` (checked like a load, without opening anything).
pub fn summary(shard: u32, file: &Bytes) -> Result<CheckpointSummary, FormatError> {
    let mut named = std::collections::BTreeSet::new();
    let (pos, _, segments) = decode(
        shard,
        file,
        &mut |number| {
            named.insert(number);
            None
        },
        &mut |_| {},
    )?;
    Ok(CheckpointSummary {
        lsn: pos.lsn,
        segment: pos.segment,
        position: pos.offset,
        index_files: named.into_iter().collect(),
        segments: segments.into_keys().collect(),
    })
}

/// Parse a checkpoint file. Any inconsistency is an error naming what is wrong.
/// `index` opens an index file by number (None if it is missing or torn). Each dormant
/// stream goes to `dormant` as it is decoded, not into a list: with a million of them a
/// list would double what recovery holds at its peak. The whole body is checksummed first,
/// so an error after the first one is delivered means a file written wrong, not damaged.
pub(crate) fn decode(
    shard: u32,
    file: &Bytes,
    index: &mut impl FnMut(IndexFileNo) -> Option<Rc<IndexFile>>,
    dormant: &mut impl FnMut(SavedDormant),
) -> Result<Decoded, FormatError> {
    let header = file
        .get(..HEADER_LEN)
        .ok_or(FormatError::ShortHeader { len: file.len() })?;
    if &header[..8] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    if crc32c::crc32c(&header[12..]) != le_u32(&header[8..12]) {
        return Err(FormatError::HeaderChecksum);
    }
    let version = le_u32(&header[12..16]);
    if ![VERSION, VERSION_ALL_RESIDENT, VERSION_INLINE_TABLES].contains(&version) {
        return Err(FormatError::Version(version));
    }
    let owner = le_u32(&header[16..20]);
    if owner != shard {
        return Err(FormatError::OtherShard(owner));
    }
    let field = |i: usize| le_u64(&header[20 + 8 * i..28 + 8 * i]);
    let pos = Position {
        lsn: Lsn::new(field(0)),
        segment: SegmentNo::new(field(1)),
        offset: field(2),
        next_id: field(3),
        last_incarnation: field(4),
        blob_counter: field(5),
    };
    let count = field(6);
    let body_len = field(7) as usize;
    let body_end = HEADER_LEN
        .checked_add(body_len)
        .filter(|&e| e == file.len())
        .ok_or(FormatError::Length {
            len: file.len() as u64,
            header: (HEADER_LEN + body_len) as u64,
        })?;
    if crc32c::crc32c(&file[HEADER_LEN..body_end]) != le_u32(&header[84..88]) {
        return Err(FormatError::BodyChecksum);
    }
    if version == VERSION_INLINE_TABLES {
        let (streams, segments) = decode_inline_tables(file, count, body_end)?;
        return Ok((pos, streams, segments));
    }
    let mut at = HEADER_LEN;
    let mut streams = Vec::new();
    for n in 0..count {
        let framed = decode_at(file, at).map_err(|e| FormatError::Frame(e).in_stream(n))?;
        let Record::Image(image) = framed.record else {
            return Err(FormatError::NotAnImage.in_stream(n));
        };
        at += framed.len;
        let chunks = Packed::decode_from(file, &mut at, index).map_err(|e| e.in_stream(n))?;
        let msgs = Packed::decode_from(file, &mut at, index).map_err(|e| e.in_stream(n))?;
        streams.push(SavedStream {
            image,
            tables: chunks.zip(msgs),
            unnumbered: false,
        });
    }
    let mut r = Varints { buf: file, at };
    if version == VERSION {
        let n = r.next().ok_or(FormatError::Field("dormant count"))?;
        for _ in 0..n {
            dormant(decode_dormant(&mut r, index)?);
        }
    }
    let mut segments = SegmentMap::new();
    let n = r.next().ok_or(FormatError::Field("segment count"))?;
    for _ in 0..n {
        let index = r.next().ok_or(FormatError::Field("segment index"))?;
        let ids = r.next().ok_or(FormatError::Field("segment stream count"))?;
        let mut list = Vec::with_capacity(ids.min(1 << 20) as usize);
        for _ in 0..ids {
            list.push(r.next().ok_or(FormatError::Field("segment stream"))?);
        }
        segments.insert(SegmentNo::new(index), list);
    }
    at = r.at;
    if at != body_end {
        return Err(FormatError::Trailing(body_end - at));
    }
    Ok((pos, streams, segments))
}

/// What a checkpoint holds besides its dormant streams: where the log continues, its
/// resident streams, and its segment map.
pub(crate) type Decoded = (Position, Vec<SavedStream>, SegmentMap);

/// One entry of the dormant section.
fn decode_dormant(
    r: &mut Varints<'_>,
    index: &mut impl FnMut(IndexFileNo) -> Option<Rc<IndexFile>>,
) -> Result<SavedDormant, FormatError> {
    let id = r.next().ok_or(FormatError::Field("dormant stream id"))?;
    let bad = |what: &'static str| FormatError::Dormant {
        id,
        source: Box::new(FormatError::Field(what)),
    };
    let key_len = r.next().ok_or_else(|| bad("key length"))? as usize;
    let key =
        r.at.checked_add(key_len)
            .and_then(|end| r.buf.get(r.at..end))
            .and_then(|k| std::str::from_utf8(k).ok())
            .ok_or_else(|| bad("key"))?;
    let key: Box<str> = key.into();
    r.at += key_len;
    let mut next = |what: &'static str| r.next().ok_or_else(|| bad(what));
    let state_file = IndexFileNo::new(next("state file")?);
    let off = next("state position")?;
    let len = u32::try_from(next("state length")?).map_err(|_| bad("state length"))?;
    let zigzag = next("deadline")?;
    let deadline_ms = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
    let data_bytes = next("data bytes")?;
    let pin_count = next("pin count")?;
    let mut pins = Vec::new();
    let mut pins_complete = true;
    for _ in 0..pin_count {
        match index(IndexFileNo::new(next("pin")?)) {
            Some(f) => pins.push(f),
            None => pins_complete = false,
        }
    }
    let state = index(state_file)
        .filter(|f| f.holds(off, len))
        .map(|file| DiskPage { file, off, len });
    Ok(SavedDormant {
        id,
        key,
        state,
        state_file,
        pins,
        pins_complete,
        deadline_ms,
        data_bytes,
    })
}

/// The body of a format 1 checkpoint: per stream its image, then its chunk table and record
/// index inline as LEB128 varints (chunk starts and record starts delta-encoded). The
/// segment map is derived from where the chunks are, as the format 1 engine did.
fn decode_inline_tables(
    file: &Bytes,
    count: u64,
    body_end: usize,
) -> Result<(Vec<SavedStream>, SegmentMap), FormatError> {
    let mut at = HEADER_LEN;
    let mut streams = Vec::new();
    let mut segments = SegmentMap::new();
    for n in 0..count {
        let bad = |what: &'static str| FormatError::Field(what).in_stream(n);
        let framed = decode_at(file, at).map_err(|e| FormatError::Frame(e).in_stream(n))?;
        let Record::Image(image) = framed.record else {
            return Err(FormatError::NotAnImage.in_stream(n));
        };
        at += framed.len;
        let mut r = Varints { buf: file, at };
        let mut next = |what: &'static str| r.next().ok_or_else(|| bad(what));
        let chunk_count = next("chunk count")?;
        let mut chunks = Vec::with_capacity(chunk_count.min(1 << 20) as usize);
        let mut expected = Offset::ZERO;
        let mut in_segments = Vec::new();
        for _ in 0..chunk_count {
            let start = Offset::new(expected.get().wrapping_add(next("chunk start")?));
            let len = u32::try_from(next("chunk length")?).map_err(|_| bad("chunk length"))?;
            let loc = DiskLoc {
                segment: SegmentNo::new(next("chunk segment")?),
                record_pos: next("chunk position")?,
                record_len: u32::try_from(next("record length")?)
                    .map_err(|_| bad("record length"))?,
                data_off: u32::try_from(next("data offset")?).map_err(|_| bad("data offset"))?,
            };
            if in_segments.last() != Some(&loc.segment) {
                in_segments.push(loc.segment);
            }
            chunks.push(Chunk::unnumbered(start, len, loc));
            expected = Offset::new(start.get().wrapping_add(u64::from(len)));
        }
        let msg_count = next("record count")?;
        let mut msgs = Vec::with_capacity(msg_count.min(1 << 24) as usize);
        let mut prev = 0u64;
        for _ in 0..msg_count {
            prev = prev.wrapping_add(next("record index")?);
            msgs.push(Offset::new(prev));
        }
        at = r.at;
        in_segments.sort_unstable();
        in_segments.dedup();
        for seg in in_segments {
            segments.entry(seg).or_default().push(image.id);
        }
        streams.push(SavedStream {
            image,
            tables: Some((Packed::from_entries(chunks), Packed::from_entries(msgs))),
            unnumbered: true,
        });
    }
    if at != body_end {
        return Err(FormatError::Trailing(body_end - at));
    }
    Ok((streams, segments))
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Varints<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Varints<'_> {
    fn next(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.at)?;
            self.at += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::{off, seg};
    use crate::record::{AppendRec, CreateRec, Lifetime, StreamMeta};

    fn stream_with_data() -> Stream {
        let create = CreateRec {
            id: 9,
            meta: StreamMeta {
                key: "k/a".into(),
                incarnation: 77,
                created_ms: 1234,
                content_type: "application/json".into(),
                lifetime: Lifetime::TtlSeconds(60),
                ext: Bytes::from_static(b"{\"x\":1}"),
            },
            initial: AppendRec::default(),
        };
        let mut s = Stream::from_create(&create, 0);
        let mut start = Offset::ZERO;
        for (i, lens) in [vec![3u32, 4], vec![300], vec![1, 1, 1]]
            .into_iter()
            .enumerate()
        {
            let total: u32 = lens.iter().sum();
            let a = AppendRec {
                id: 9,
                start,
                append_lens: vec![total],
                msg_lens: lens,
                data: Bytes::from(vec![b'x'; total as usize]),
                ..Default::default()
            };
            let loc = DiskLoc {
                segment: seg(3 + i as u64),
                record_pos: 4096 + 1000 * i as u64,
                record_len: 100 + total,
                data_off: 100,
            };
            s.apply_append(&a, 8, 0, Some(loc), false);
            start += u64::from(total);
        }
        s
    }

    #[test]
    fn round_trips_streams_and_position() {
        let s = stream_with_data();
        let pos = Position {
            lsn: Lsn::new(42),
            segment: seg(5),
            offset: 8192,
            next_id: 10,
            last_incarnation: 77,
            blob_counter: 3,
        };
        let map = vec![(seg(3), vec![9]), (seg(4), vec![9, 11])];
        let file = Bytes::from(encode(2, pos, std::iter::once(&s), map.clone().into_iter()));
        let (got, streams, segments) =
            decode(2, &file, &mut |_| None, &mut |_| {}).expect("decodes");
        assert_eq!(got, pos);
        assert_eq!(segments.into_iter().collect::<Vec<_>>(), map);
        let summary = summary(2, &file).expect("summarises");
        assert_eq!(
            (summary.lsn, summary.segment, summary.position),
            (Lsn::new(42), seg(5), 8192)
        );
        assert_eq!(summary.segments, vec![seg(3), seg(4)]);
        assert!(summary.index_files.is_empty(), "every page is inline");
        assert!(
            super::summary(1, &file).is_err(),
            "another shard's checkpoint"
        );
        assert_eq!(streams.len(), 1);
        let saved = &streams[0];
        assert_eq!(saved.image, s.image());
        let (chunks, msgs) = saved.tables.as_ref().expect("no index files needed");
        let key = |c: Chunk| (c.start, c.len, c.first_msg, c.loc());
        let want: Vec<_> = s.chunks().map(key).collect();
        assert_eq!(chunks.iter().map(key).collect::<Vec<_>>(), want);
        assert_eq!(
            msgs.iter().map(Offset::get).collect::<Vec<_>>(),
            vec![0, 3, 7, 307, 308, 309]
        );
    }

    /// Appends `count` one-record appends of `len` bytes to `s`, each in its own record at
    /// a new log position.
    fn append_more(s: &mut Stream, count: u64, len: u32) {
        for i in 0..count {
            let start = s.tail;
            let a = AppendRec {
                id: s.id,
                start,
                append_lens: vec![len],
                msg_lens: vec![len],
                data: Bytes::from(vec![b'y'; len as usize]),
                ..Default::default()
            };
            let loc = DiskLoc {
                segment: seg(7),
                record_pos: 4096 + 512 * i,
                record_len: 100 + len,
                data_off: 100,
            };
            s.apply_append(&a, 8, 0, Some(loc), false);
        }
    }

    #[test]
    fn a_capture_encodes_the_stream_as_it_was_whatever_happens_after() {
        let mut s = stream_with_data();
        // Enough history for pages and frozen blocks (pages are 4 blocks in tests).
        append_more(&mut s, 700, 5);
        let pos = Position {
            lsn: Lsn::new(900),
            ..Position::default()
        };
        let map = vec![(seg(3), vec![9])];
        let at_capture = encode(2, pos, std::iter::once(&s), map.clone().into_iter());
        let captured = CapturedStream::of(&s);
        // The stream moves on: more blocks freeze, a page completes, retention drops the
        // front.
        append_more(&mut s, 1300, 3);
        let (cut, first_kept) = (off(s.tail.get() - 99), s.message_count().saturating_sub(33));
        s.retain(cut, first_kept);
        let mut encoder = Encoder::default();
        encoder.push(captured);
        encoder.begin_dormant(0);
        encoder.begin_segments(1);
        encoder.push_segment(seg(3), [9].into_iter());
        assert_eq!(encoder.finish(2, pos), at_capture);
        assert_ne!(
            encode(2, pos, std::iter::once(&s), std::iter::empty()),
            at_capture
        );
    }

    #[test]
    fn every_corruption_is_detected() {
        let s = stream_with_data();
        let file = encode(
            0,
            Position::default(),
            std::iter::once(&s),
            std::iter::once((seg(1), vec![9])),
        );
        let check = |shard, file: Vec<u8>| {
            decode(shard, &Bytes::from(file), &mut |_| None, &mut |_| {}).is_err()
        };
        assert!(check(1, file.clone()), "wrong shard");
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x01;
            assert!(check(0, bad), "flip at {i}");
        }
        for cut in [0, 10, HEADER_LEN, file.len() - 1] {
            assert!(check(0, file[..cut].to_vec()));
        }
    }

    #[test]
    fn varints_cover_the_whole_range() {
        let mut out = Vec::new();
        let values = [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX];
        for v in values {
            put_varint(&mut out, v);
        }
        let mut r = Varints { buf: &out, at: 0 };
        for v in values {
            assert_eq!(r.next(), Some(v));
        }
        assert_eq!(r.next(), None);
    }
}
