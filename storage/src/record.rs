//! The log record format.
//!
//! Every change to a shard's streams is one record in the shard's log. A record is a 20-byte
//! frame header followed by a payload:
//!
//! ```text
//! 0..4    payload length (u32 LE)
//! 4..8    CRC32C of bytes 8..20+len (lsn, kind, reserved, payload)
//! 8..16   LSN (u64 LE): 1, 2, 3, ... with no gaps within a run of adjacent segments
//! 16      kind (1 create, 2 append, 3 delete, 4 set-ext, 5 image, 6 relocate, 7 snapshot,
//!         8 retain)
//! 17..20  reserved, zero
//! 20..    payload (little-endian fields; stream data last, so it is one contiguous slice)
//! ```
//!
//! A zero length with a zero LSN marks the unwritten (preallocated, zero-filled) end of a
//! segment. Records are packed back to back; only whole flushes are block-aligned.

use crate::position::{Lsn, Offset, RecordNo};
use bytes::Bytes;

/// Bytes of frame header in front of every payload.
pub const FRAME_HEADER: usize = 20;

/// Largest payload accepted; bigger than the 32 MiB request limit plus metadata.
pub const MAX_PAYLOAD: usize = 48 << 20;

const KIND_CREATE: u8 = 1;
const KIND_APPEND: u8 = 2;
const KIND_DELETE: u8 = 3;
const KIND_SET_EXT: u8 = 4;
const KIND_IMAGE: u8 = 5;
const KIND_RELOCATE: u8 = 6;
const KIND_SNAPSHOT: u8 = 7;
const KIND_RETAIN: u8 = 8;

/// How long a stream lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Lifetime {
    #[default]
    Forever,
    /// Sliding window: expires after this many seconds without access.
    TtlSeconds(u64),
    /// Absolute expiry instant (Unix milliseconds).
    ExpiresAtMs(i64),
}

impl Lifetime {
    /// When a stream last accessed at `last_access_ms` expires (Unix ms), or None when
    /// it never does, or only past what a millisecond clock can hold.
    pub fn deadline_ms(self, last_access_ms: i64) -> Option<i64> {
        match self {
            Lifetime::Forever => None,
            Lifetime::TtlSeconds(t) => i64::try_from(t)
                .ok()?
                .checked_mul(1000)?
                .checked_add(last_access_ms),
            Lifetime::ExpiresAtMs(at) => Some(at),
        }
    }
}

/// A producer's identity and position, carried by the append it deduplicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerStamp {
    pub id: Box<str>,
    pub epoch: u64,
    pub seq: u64,
}

/// Data and state changes of one append operation.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AppendRec {
    pub id: u64,
    /// Stream offset of the first data byte.
    pub start: Offset,
    /// Close the stream after this append.
    pub close: bool,
    pub stream_seq: Option<Bytes>,
    pub producer: Option<ProducerStamp>,
    /// Byte lengths of the original write operations carried in `data` (one for an ordinary
    /// append; several when a fork copies its source's history). Sums to `data.len()`.
    pub append_lens: Vec<u32>,
    /// Byte lengths of the messages in `data` (JSON records, or one per write operation).
    pub msg_lens: Vec<u32>,
    pub data: Bytes,
}

/// A stream's identity and configuration: what it is, apart from what it holds. Set at
/// creation; only `ext` changes later (`Record::SetExt`). Created, imaged and held by a
/// resident stream alike, and encoded the same way wherever it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamMeta {
    /// `bucket/stream`: the name clients use.
    pub key: Box<str>,
    /// The creation token that tells a recreated stream from its predecessor.
    pub incarnation: u64,
    pub created_ms: i64,
    pub content_type: Box<str>,
    pub lifetime: Lifetime,
    /// Opaque server-owned configuration (attributes, fork linkage).
    pub ext: Bytes,
}

/// Everything that defines a stream at creation, plus its initial content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRec {
    pub id: u64,
    pub meta: StreamMeta,
    pub initial: AppendRec,
}

/// A producer's state as carried by an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerImage {
    pub id: Box<str>,
    pub epoch: u64,
    pub last_seq: u64,
    pub last_used_ms: i64,
    /// (seq, start, next, record_start, record_next), oldest first.
    pub receipts: Vec<[u64; 5]>,
}

/// The visible snapshot of a stream: an application blob covering `[0, offset)`, stored in
/// its own file next to the segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub offset: Offset,
    pub content_type: Box<str>,
    pub digest: Box<str>,
    /// File name of the blob in the shard's `snapshots/` directory.
    pub blob: Box<str>,
    pub len: u64,
}

/// A stream's complete metadata (everything but its data), written when the log cleaner
/// removes the segment that held its earlier records. Replay takes the image as the state
/// at its LSN and applies later records on top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRec {
    pub id: u64,
    pub meta: StreamMeta,
    pub tail: Offset,
    pub closed: bool,
    pub stream_seq: Option<Bytes>,
    pub producers: Vec<ProducerImage>,
    /// First readable offset and the ordinal of the first retained message.
    pub retained_start: Offset,
    pub first_record: RecordNo,
    pub snapshot: Option<SnapshotMeta>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Create(CreateRec),
    Append(AppendRec),
    Delete {
        id: u64,
    },
    SetExt {
        id: u64,
        ext: Bytes,
    },
    Image(ImageRec),
    /// Stream data moved out of a segment being cleaned: the chunk and message boundaries
    /// of an earlier append, without its state changes (those live on in the image).
    Relocate(AppendRec),
    /// A snapshot became the stream's visible one (its blob file is already durable).
    Snapshot {
        id: u64,
        meta: SnapshotMeta,
    },
    /// Retention advanced: bytes before `offset` and messages before `first_record` are gone.
    Retain {
        id: u64,
        offset: Offset,
        first_record: RecordNo,
    },
}

/// Why bytes at a log position are not a valid record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Zero header: the unwritten end of the segment.
    End,
    /// Not enough bytes for the header or the payload it announces.
    Truncated,
    Checksum,
    /// CRC matched but the payload does not parse: a bug or a foreign file.
    Malformed,
}

impl Record {
    /// The stream this record belongs to.
    pub fn stream_id(&self) -> u64 {
        match self {
            Record::Create(c) => c.id,
            Record::Append(a) | Record::Relocate(a) => a.id,
            Record::Delete { id } | Record::SetExt { id, .. } => *id,
            Record::Image(i) => i.id,
            Record::Snapshot { id, .. } | Record::Retain { id, .. } => *id,
        }
    }

    /// Total framed size of this record.
    pub fn framed_len(&self) -> usize {
        FRAME_HEADER + self.payload_len()
    }

    fn payload_len(&self) -> usize {
        match self {
            Record::Create(c) => 8 + meta_len(&c.meta) + append_len(&c.initial),
            Record::Append(a) | Record::Relocate(a) => append_len(a),
            Record::Delete { .. } => 8,
            Record::SetExt { ext, .. } => 8 + 4 + ext.len(),
            Record::Image(i) => {
                let mut scratch = Vec::new();
                put_image(&mut scratch, i);
                scratch.len()
            }
            Record::Snapshot { meta, .. } => 8 + snapshot_len(meta),
            Record::Retain { .. } => 24,
        }
    }

    /// Append the framed record to `out`.
    pub fn encode(&self, lsn: Lsn, out: &mut Vec<u8>) {
        let mut scratch = Vec::new();
        self.encode_with(lsn, &mut scratch, |piece| out.extend_from_slice(piece));
    }

    /// Frame the record, handing `sink` the header and metadata (built in `scratch`) and then
    /// the stream data as a second piece, so the data is copied only once, by the sink.
    pub fn encode_with(&self, lsn: Lsn, scratch: &mut Vec<u8>, mut sink: impl FnMut(&[u8])) {
        scratch.clear();
        scratch.extend_from_slice(&[0; FRAME_HEADER]);
        let out = &mut *scratch;
        let tail: &[u8] = match self {
            Record::Create(c) => {
                put_u64(out, c.id);
                put_meta(out, &c.meta);
                put_append_meta(out, &c.initial);
                &c.initial.data
            }
            Record::Append(a) | Record::Relocate(a) => {
                put_append_meta(out, a);
                &a.data
            }
            Record::Image(i) => {
                put_image(out, i);
                &[]
            }
            Record::Snapshot { id, meta } => {
                put_u64(out, *id);
                put_snapshot(out, meta);
                &[]
            }
            Record::Retain {
                id,
                offset,
                first_record,
            } => {
                put_u64(out, *id);
                put_u64(out, offset.get());
                put_u64(out, first_record.get());
                &[]
            }
            Record::Delete { id } => {
                put_u64(out, *id);
                &[]
            }
            Record::SetExt { id, ext } => {
                put_u64(out, *id);
                out.extend_from_slice(&(ext.len() as u32).to_le_bytes());
                ext
            }
        };
        let kind = match self {
            Record::Create(_) => KIND_CREATE,
            Record::Append(_) => KIND_APPEND,
            Record::Delete { .. } => KIND_DELETE,
            Record::SetExt { .. } => KIND_SET_EXT,
            Record::Image(_) => KIND_IMAGE,
            Record::Relocate(_) => KIND_RELOCATE,
            Record::Snapshot { .. } => KIND_SNAPSHOT,
            Record::Retain { .. } => KIND_RETAIN,
        };
        let payload_len = scratch.len() - FRAME_HEADER + tail.len();
        debug_assert_eq!(payload_len, self.payload_len());
        scratch[0..4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        scratch[8..16].copy_from_slice(&lsn.get().to_le_bytes());
        scratch[16] = kind;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&scratch[8..]), tail);
        scratch[4..8].copy_from_slice(&crc.to_le_bytes());
        sink(scratch);
        if !tail.is_empty() {
            sink(tail);
        }
    }
}

/// A record decoded from a log buffer, with its position.
pub struct Framed {
    pub lsn: Lsn,
    pub record: Record,
    /// Framed length in bytes (header + payload).
    pub len: usize,
}

/// Decode the record starting at `pos` of `buf`. Stream data in the result are zero-copy
/// slices of `buf`.
pub fn decode_at(buf: &Bytes, pos: usize) -> Result<Framed, FrameError> {
    let Some(header) = buf.get(pos..pos + FRAME_HEADER) else {
        return Err(FrameError::Truncated);
    };
    let payload_len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let lsn = Lsn::new(u64::from_le_bytes(
        header[8..16].try_into().expect("8 bytes"),
    ));
    if payload_len == 0 && lsn.is_none() {
        return Err(FrameError::End);
    }
    if payload_len > MAX_PAYLOAD {
        return Err(FrameError::Checksum);
    }
    let end = pos + FRAME_HEADER + payload_len;
    if end > buf.len() {
        return Err(FrameError::Truncated);
    }
    let stored_crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    if crc32c::crc32c(&buf[pos + 8..end]) != stored_crc {
        return Err(FrameError::Checksum);
    }
    let kind = header[16];
    let mut r = Reader {
        buf,
        pos: pos + FRAME_HEADER,
        end,
    };
    let record = decode_payload(kind, &mut r).ok_or(FrameError::Malformed)?;
    if r.pos != end {
        return Err(FrameError::Malformed);
    }
    Ok(Framed {
        lsn,
        record,
        len: FRAME_HEADER + payload_len,
    })
}

fn decode_payload(kind: u8, r: &mut Reader) -> Option<Record> {
    Some(match kind {
        KIND_CREATE => {
            let id = r.u64()?;
            let meta = get_meta(r)?;
            let initial = get_append(r, Lens::Exact)?;
            Record::Create(CreateRec { id, meta, initial })
        }
        KIND_APPEND => Record::Append(get_append(r, Lens::Exact)?),
        KIND_DELETE => Record::Delete { id: r.u64()? },
        KIND_SET_EXT => Record::SetExt {
            id: r.u64()?,
            ext: r.owned_bytes()?,
        },
        KIND_IMAGE => Record::Image(get_image(r)?),
        KIND_RELOCATE => Record::Relocate(get_append(r, Lens::Trailing)?),
        KIND_SNAPSHOT => Record::Snapshot {
            id: r.u64()?,
            meta: get_snapshot(r)?,
        },
        KIND_RETAIN => Record::Retain {
            id: r.u64()?,
            offset: Offset::new(r.u64()?),
            first_record: RecordNo::new(r.u64()?),
        },
        _ => return None,
    })
}

fn meta_len(m: &StreamMeta) -> usize {
    str_len(&m.key) + 8 + 8 + str_len(&m.content_type) + 9 + 4 + m.ext.len()
}

fn put_meta(out: &mut Vec<u8>, m: &StreamMeta) {
    put_str(out, &m.key);
    put_u64(out, m.incarnation);
    put_u64(out, m.created_ms as u64);
    put_str(out, &m.content_type);
    put_lifetime(out, m.lifetime);
    put_bytes(out, &m.ext);
}

fn get_meta(r: &mut Reader) -> Option<StreamMeta> {
    Some(StreamMeta {
        key: r.str()?,
        incarnation: r.u64()?,
        created_ms: r.u64()? as i64,
        content_type: r.str()?,
        lifetime: get_lifetime(r)?,
        ext: r.owned_bytes()?,
    })
}

fn put_lifetime(out: &mut Vec<u8>, l: Lifetime) {
    let (tag, v) = match l {
        Lifetime::Forever => (0u8, 0u64),
        Lifetime::TtlSeconds(s) => (1, s),
        Lifetime::ExpiresAtMs(ms) => (2, ms as u64),
    };
    out.push(tag);
    put_u64(out, v);
}

fn get_lifetime(r: &mut Reader) -> Option<Lifetime> {
    let tag = r.u8()?;
    let v = r.u64()?;
    Some(match tag {
        // Exactly the encoder's spelling: a record decodes to one value, and re-encodes to
        // the same bytes.
        0 if v == 0 => Lifetime::Forever,
        1 => Lifetime::TtlSeconds(v),
        2 => Lifetime::ExpiresAtMs(v as i64),
        _ => return None,
    })
}

fn snapshot_len(m: &SnapshotMeta) -> usize {
    8 + str_len(&m.content_type) + str_len(&m.digest) + str_len(&m.blob) + 8
}

fn put_snapshot(out: &mut Vec<u8>, m: &SnapshotMeta) {
    put_u64(out, m.offset.get());
    put_str(out, &m.content_type);
    put_str(out, &m.digest);
    put_str(out, &m.blob);
    put_u64(out, m.len);
}

fn get_snapshot(r: &mut Reader) -> Option<SnapshotMeta> {
    Some(SnapshotMeta {
        offset: Offset::new(r.u64()?),
        content_type: r.str()?,
        digest: r.str()?,
        blob: r.str()?,
        len: r.u64()?,
    })
}

fn put_image(out: &mut Vec<u8>, i: &ImageRec) {
    put_u64(out, i.id);
    put_meta(out, &i.meta);
    put_u64(out, i.tail.get());
    out.push(i.closed as u8);
    match &i.stream_seq {
        Some(s) => put_bytes(out, s),
        None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
    }
    out.extend_from_slice(&(i.producers.len() as u32).to_le_bytes());
    for p in &i.producers {
        put_str(out, &p.id);
        put_u64(out, p.epoch);
        put_u64(out, p.last_seq);
        put_u64(out, p.last_used_ms as u64);
        out.extend_from_slice(&(p.receipts.len() as u32).to_le_bytes());
        for r in &p.receipts {
            for v in r {
                put_u64(out, *v);
            }
        }
    }
    put_u64(out, i.retained_start.get());
    put_u64(out, i.first_record.get());
    match &i.snapshot {
        Some(m) => {
            out.push(1);
            put_snapshot(out, m);
        }
        None => out.push(0),
    }
}

fn get_image(r: &mut Reader) -> Option<ImageRec> {
    let id = r.u64()?;
    let meta = get_meta(r)?;
    let tail = Offset::new(r.u64()?);
    let closed = r.flag()?;
    let seq_len = r.u32()?;
    let stream_seq = if seq_len == u32::MAX {
        None
    } else {
        Some(r.owned(seq_len as usize)?)
    };
    let n = r.u32()? as usize;
    let mut producers = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        let id = r.str()?;
        let epoch = r.u64()?;
        let last_seq = r.u64()?;
        let last_used_ms = r.u64()? as i64;
        let m = r.u32()? as usize;
        let mut receipts = Vec::with_capacity(m.min(1024));
        for _ in 0..m {
            receipts.push([r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?]);
        }
        producers.push(ProducerImage {
            id,
            epoch,
            last_seq,
            last_used_ms,
            receipts,
        });
    }
    let retained_start = Offset::new(r.u64()?);
    let first_record = RecordNo::new(r.u64()?);
    let snapshot = match r.u8()? {
        0 => None,
        1 => Some(get_snapshot(r)?),
        _ => return None,
    };
    Some(ImageRec {
        id,
        meta,
        tail,
        closed,
        stream_seq,
        producers,
        retained_start,
        first_record,
        snapshot,
    })
}

fn str_len(s: &str) -> usize {
    4 + s.len()
}

fn append_len(a: &AppendRec) -> usize {
    8 + 8
        + 1
        + 4
        + a.stream_seq.as_ref().map_or(0, |s| s.len())
        + 1
        + a.producer.as_ref().map_or(0, |p| str_len(&p.id) + 16)
        + 4
        + 4 * a.append_lens.len()
        + 4
        + 4 * a.msg_lens.len()
        + 4
        + a.data.len()
}

/// Everything of an append except the data bytes themselves (their length prefix included).
fn put_append_meta(out: &mut Vec<u8>, a: &AppendRec) {
    put_u64(out, a.id);
    put_u64(out, a.start.get());
    out.push(a.close as u8);
    // u32::MAX length marks "no Stream-Seq" (an empty one is impossible on the wire).
    match &a.stream_seq {
        Some(s) => put_bytes(out, s),
        None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
    }
    match &a.producer {
        Some(p) => {
            out.push(1);
            put_str(out, &p.id);
            put_u64(out, p.epoch);
            put_u64(out, p.seq);
        }
        None => out.push(0),
    }
    put_u32s(out, &a.append_lens);
    put_u32s(out, &a.msg_lens);
    out.extend_from_slice(&(a.data.len() as u32).to_le_bytes());
}

/// What the record lengths of an append-shaped record cover.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lens {
    /// All of its data.
    Exact,
    /// The last bytes of its data. The cleaner moves a write operation whole, also when
    /// retention has cut into it: the records before the retention point are no longer
    /// indexed, so a Relocate record lists only the records after it, and its data starts
    /// with bytes no reader can reach.
    Trailing,
}

fn get_append(r: &mut Reader, lens: Lens) -> Option<AppendRec> {
    let id = r.u64()?;
    let start = Offset::new(r.u64()?);
    let close = r.flag()?;
    let seq_len = r.u32()?;
    let stream_seq = if seq_len == u32::MAX {
        None
    } else {
        Some(r.owned(seq_len as usize)?)
    };
    let producer = match r.u8()? {
        0 => None,
        1 => Some(ProducerStamp {
            id: r.str()?,
            epoch: r.u64()?,
            seq: r.u64()?,
        }),
        _ => return None,
    };
    let append_lens = r.u32s()?;
    let msg_lens = r.u32s()?;
    let data = r.bytes()?;
    let sum = |v: &[u32]| v.iter().map(|&l| l as u64).sum::<u64>();
    let records_fit = match lens {
        Lens::Exact => sum(&msg_lens) == data.len() as u64,
        Lens::Trailing => sum(&msg_lens) <= data.len() as u64,
    };
    if sum(&append_lens) != data.len() as u64 || !records_fit {
        return None;
    }
    Some(AppendRec {
        id,
        start,
        close,
        stream_seq,
        producer,
        append_lens,
        msg_lens,
        data,
    })
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    end: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<Bytes> {
        let end = self.pos.checked_add(n)?;
        if end > self.end {
            return None;
        }
        let b = self.buf.slice(self.pos..end);
        self.pos = end;
        Some(b)
    }
    fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        let end = self.pos + N;
        if end > self.end {
            return None;
        }
        let a = self.buf[self.pos..end].try_into().ok()?;
        self.pos = end;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.fixed::<1>()?[0])
    }
    /// A bool is 0 or 1; anything else is malformed.
    fn flag(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.fixed()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.fixed()?))
    }
    fn bytes(&mut self) -> Option<Bytes> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// A copy of the next `n` bytes, for metadata a stream keeps: a slice would pin the
    /// whole buffer it came from (during recovery, a segment read whole) for as long as
    /// the stream lives.
    fn owned(&mut self, n: usize) -> Option<Bytes> {
        self.take(n).map(|b| Bytes::copy_from_slice(&b))
    }
    fn owned_bytes(&mut self) -> Option<Bytes> {
        let n = self.u32()? as usize;
        self.owned(n)
    }
    fn str(&mut self) -> Option<Box<str>> {
        let b = self.bytes()?;
        std::str::from_utf8(&b).ok().map(Into::into)
    }
    fn u32s(&mut self) -> Option<Vec<u32>> {
        let n = self.u32()? as usize;
        if n > (self.end - self.pos) / 4 {
            return None;
        }
        (0..n).map(|_| self.u32()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::{off, rec};

    fn sample_append() -> AppendRec {
        AppendRec {
            id: 7,
            start: off(42),
            close: true,
            stream_seq: Some(Bytes::from_static(b"seq-9")),
            producer: Some(ProducerStamp {
                id: "p1".into(),
                epoch: 3,
                seq: 11,
            }),
            append_lens: vec![6],
            msg_lens: vec![4, 2],
            data: Bytes::from_static(b"{}\n\n{}"),
        }
    }

    fn roundtrip(rec: Record) {
        let mut out = vec![0xAA; 3];
        rec.encode(Lsn::new(99), &mut out);
        assert_eq!(out.len() - 3, rec.framed_len());
        let buf = Bytes::from(out);
        let framed = decode_at(&buf, 3).expect("decodes");
        assert_eq!(framed.lsn, Lsn::new(99));
        assert_eq!(framed.len, rec.framed_len());
        assert_eq!(framed.record, rec);
    }

    #[test]
    fn every_kind_roundtrips() {
        roundtrip(Record::Append(sample_append()));
        roundtrip(Record::Append(AppendRec::default()));
        roundtrip(Record::Delete { id: 5 });
        roundtrip(Record::Relocate(sample_append()));
        roundtrip(Record::Image(ImageRec {
            id: 3,
            meta: StreamMeta {
                key: "b/x/y".into(),
                incarnation: 9,
                created_ms: 8,
                content_type: "text/plain".into(),
                lifetime: Lifetime::TtlSeconds(5),
                ext: Bytes::from_static(b"{}"),
            },
            tail: off(77),
            closed: true,
            stream_seq: None,
            producers: vec![ProducerImage {
                id: "p".into(),
                epoch: 1,
                last_seq: 4,
                last_used_ms: 3,
                receipts: vec![[4, 10, 20, 1, 2]],
            }],
            retained_start: off(10),
            first_record: rec(1),
            snapshot: Some(SnapshotMeta {
                offset: off(12),
                content_type: "application/json".into(),
                digest: "ab".into(),
                blob: "1-2-3.blob".into(),
                len: 99,
            }),
        }));
        roundtrip(Record::Retain {
            id: 4,
            offset: off(100),
            first_record: rec(7),
        });
        roundtrip(Record::Snapshot {
            id: 4,
            meta: SnapshotMeta {
                offset: off(1),
                content_type: "text/plain".into(),
                digest: "00".into(),
                blob: "b".into(),
                len: 0,
            },
        });
        roundtrip(Record::SetExt {
            id: 5,
            ext: Bytes::from_static(b"xyz"),
        });
        roundtrip(Record::Create(CreateRec {
            id: 1,
            meta: StreamMeta {
                key: "c/stream".into(),
                incarnation: 1_784_370_000_000,
                created_ms: 1_784_370_000_000,
                content_type: "application/json".into(),
                lifetime: Lifetime::ExpiresAtMs(-5),
                ext: Bytes::new(),
            },
            initial: sample_append(),
        }));
    }

    #[test]
    fn corruption_is_detected_anywhere() {
        let mut out = Vec::new();
        Record::Append(sample_append()).encode(Lsn::FIRST, &mut out);
        for i in 4..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x40;
            let r = decode_at(&Bytes::from(bad), 0);
            assert!(r.is_err(), "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn torn_record_is_truncated_and_zeroes_are_end() {
        let mut out = Vec::new();
        Record::Delete { id: 1 }.encode(Lsn::FIRST, &mut out);
        let torn = Bytes::from(out[..out.len() - 1].to_vec());
        assert_eq!(decode_at(&torn, 0).err(), Some(FrameError::Truncated));
        let zeros = Bytes::from(vec![0u8; 64]);
        assert_eq!(decode_at(&zeros, 0).err(), Some(FrameError::End));
        assert_eq!(decode_at(&zeros, 60).err(), Some(FrameError::Truncated));
    }

    /// Found by the `record_decode` fuzz target: a Forever lifetime with a non-zero value
    /// and a close flag of 2 passed the CRC and decoded, but re-encoded to other bytes.
    #[test]
    fn non_canonical_fields_are_malformed_even_with_a_valid_crc() {
        fn patched(rec: &Record, at: usize, byte: u8) -> Bytes {
            let mut out = Vec::new();
            rec.encode(Lsn::FIRST, &mut out);
            out[at] = byte;
            let crc = crc32c::crc32c(&out[8..]);
            out[4..8].copy_from_slice(&crc.to_le_bytes());
            Bytes::from(out)
        }
        let create = Record::Create(CreateRec {
            id: 1,
            meta: StreamMeta {
                key: "k".into(),
                incarnation: 1,
                created_ms: 1,
                content_type: "t".into(),
                lifetime: Lifetime::Forever,
                ext: Bytes::new(),
            },
            initial: AppendRec::default(),
        });
        // Lifetime: tag at 20 + 8 + 5 + 8 + 8 + 5, its value right after.
        let tag = FRAME_HEADER + 8 + 5 + 8 + 8 + 5;
        assert!(decode_at(&patched(&create, tag + 8, 0), 0).is_ok());
        assert_eq!(
            decode_at(&patched(&create, tag + 8, 4), 0).err(),
            Some(FrameError::Malformed)
        );
        // The close flag follows the append's id and start.
        let append = Record::Append(AppendRec::default());
        let close = FRAME_HEADER + 16;
        assert!(decode_at(&patched(&append, close, 1), 0).is_ok());
        assert_eq!(
            decode_at(&patched(&append, close, 2), 0).err(),
            Some(FrameError::Malformed)
        );
    }

    #[test]
    fn a_relocated_chunk_may_list_only_its_trailing_records() {
        // A write of three records that retention cut after the first: the cleaner moves
        // the whole write and lists the two records it still indexes.
        let cut = AppendRec {
            id: 7,
            start: off(100),
            append_lens: vec![9],
            msg_lens: vec![3, 3],
            data: Bytes::from_static(b"{}\n{}\n{}\n"),
            ..Default::default()
        };
        roundtrip(Record::Relocate(cut.clone()));
        // The same shape as an append (or a creation's initial data) is malformed: there,
        // the records cover the data exactly.
        let mut out = Vec::new();
        Record::Append(cut.clone()).encode(Lsn::FIRST, &mut out);
        assert_eq!(
            decode_at(&Bytes::from(out), 0).err(),
            Some(FrameError::Malformed)
        );
        // More records than data is malformed for a relocation too.
        let over = AppendRec {
            msg_lens: vec![3, 3, 3, 3],
            ..cut
        };
        let mut out = Vec::new();
        Record::Relocate(over).encode(Lsn::FIRST, &mut out);
        assert_eq!(
            decode_at(&Bytes::from(out), 0).err(),
            Some(FrameError::Malformed)
        );
    }

    #[test]
    fn metadata_does_not_pin_the_buffer_it_was_decoded_from() {
        let rec = Record::Create(CreateRec {
            id: 1,
            meta: StreamMeta {
                key: "k".into(),
                incarnation: 1,
                created_ms: 0,
                content_type: "text/plain".into(),
                lifetime: Lifetime::Forever,
                ext: Bytes::from_static(b"{\"a\":1}"),
            },
            initial: sample_append(),
        });
        let mut out = Vec::new();
        rec.encode(Lsn::FIRST, &mut out);
        let buf = Bytes::from(out);
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let Record::Create(c) = decode_at(&buf, 0).expect("decodes").record else {
            panic!("a create");
        };
        // A stream keeps its ext and Stream-Seq for as long as it lives; a slice would keep
        // a whole segment read at recovery alive with them.
        assert!(!range.contains(&(c.meta.ext.as_ptr() as usize)));
        let seq = c.initial.stream_seq.expect("seq");
        assert!(!range.contains(&(seq.as_ptr() as usize)));
        // Stream data stays zero-copy.
        assert!(range.contains(&(c.initial.data.as_ptr() as usize)));
    }

    #[test]
    fn data_is_a_zero_copy_slice() {
        let mut out = Vec::new();
        Record::Append(sample_append()).encode(Lsn::FIRST, &mut out);
        let buf = Bytes::from(out);
        let Record::Append(a) = decode_at(&buf, 0).expect("ok").record else {
            panic!("kind");
        };
        let base = buf.as_ptr() as usize;
        let p = a.data.as_ptr() as usize;
        assert!(p >= base && p < base + buf.len());
        assert_eq!(
            p + a.data.len(),
            base + buf.len(),
            "data is the payload's tail"
        );
    }
}
