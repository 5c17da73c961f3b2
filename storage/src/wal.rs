//! The S3 write-ahead log's object format (`--durability s3`).
//!
//! With S3 durability a shard acknowledges a change only once the log bytes holding it are
//! in an object of its own in S3: a **WAL object**, written create-only under a key named
//! by the owner epoch and a sequence number counting that epoch's objects from 0. Their
//! changes follow each other without a gap (the next object starts at the LSN after the
//! last one's end), so a restore applies them in order past the archived end of the log
//! and stops at the first missing one.
//!
//! A WAL object is a list of **pieces**, byte ranges of segment files exactly as the log
//! holds them, so applying one writes those bytes at their positions; recovery then reads
//! the restored segments like any others. A piece starting at a segment's first record
//! position names the segment's first LSN, from which its header can be rebuilt.
//!
//! A **fence** takes the place of the next WAL object when another server takes a shard
//! over: the previous owner's next create-only PUT finds the key taken, and that owner
//! acknowledges nothing more.
//!
//! ```text
//! WAL object                              fence
//! "UWALOBJ1"                              "UWALFNC1"
//! shard u32, pieces u32                   epoch u64 (the fencer's), reserved u64
//! first_lsn u64, last_lsn u64             owner length u32, owner bytes
//! end segment u64, end position u64       crc32c u32 of all above
//! per piece: segment u64, start u64,
//!   len u64, file_len u64,
//!   segment_first_lsn u64 (0: not its start)
//! crc32c u32 of the header
//! the pieces' bytes, in order
//! crc32c u32 of the bytes
//! ```
//! Integers are little-endian.

use bytes::{BufMut, Bytes, BytesMut};

use crate::position::{Lsn, SegmentNo};

const OBJECT_MAGIC: &[u8; 8] = b"UWALOBJ1";
const FENCE_MAGIC: &[u8; 8] = b"UWALFNC1";
const HEADER_FIXED: usize = 8 + 4 + 4 + 8 * 4;
const PIECE_BYTES: usize = 8 * 5;

/// A range of one segment file, as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalPiece {
    pub segment: SegmentNo,
    /// Byte position in the segment file.
    pub start: u64,
    /// The segment file's preallocated size (a restore creates it so).
    pub file_len: u64,
    /// The segment's first LSN when this piece starts at its first record, so that a
    /// restore which lacks the segment can write its header.
    pub segment_first_lsn: Option<Lsn>,
    pub bytes: Bytes,
}

/// The records with LSNs `first_lsn..=last_lsn`, ending at `end` in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalObject {
    pub shard: u32,
    pub first_lsn: Lsn,
    pub last_lsn: Lsn,
    pub end: (SegmentNo, u64),
    pub pieces: Vec<WalPiece>,
}

/// What a key of the WAL holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalEntry {
    Object(WalObject),
    /// Written by the server that took the shard over at `epoch`.
    Fence {
        epoch: u64,
        owner: String,
    },
}

/// Why stored bytes are not a WAL entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WalFormatError {
    #[error("not a WAL object or fence")]
    UnknownMagic,
    #[error("truncated")]
    Truncated,
    #[error("checksum mismatch")]
    Checksum,
    #[error("inconsistent header")]
    Inconsistent,
}

impl WalObject {
    /// Bytes of log the pieces hold.
    pub fn data_len(&self) -> usize {
        self.pieces.iter().map(|p| p.bytes.len()).sum()
    }

    pub fn encode(&self) -> Bytes {
        let header = HEADER_FIXED + PIECE_BYTES * self.pieces.len() + 4;
        let mut out = BytesMut::with_capacity(header + self.data_len() + 4);
        out.put_slice(OBJECT_MAGIC);
        out.put_u32_le(self.shard);
        out.put_u32_le(self.pieces.len() as u32);
        out.put_u64_le(self.first_lsn.get());
        out.put_u64_le(self.last_lsn.get());
        out.put_u64_le(self.end.0.get());
        out.put_u64_le(self.end.1);
        for p in &self.pieces {
            out.put_u64_le(p.segment.get());
            out.put_u64_le(p.start);
            out.put_u64_le(p.bytes.len() as u64);
            out.put_u64_le(p.file_len);
            out.put_u64_le(p.segment_first_lsn.map_or(0, Lsn::get));
        }
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        let mut data_crc = 0;
        for p in &self.pieces {
            data_crc = crc32c::crc32c_append(data_crc, &p.bytes);
            out.put_slice(&p.bytes);
        }
        out.put_u32_le(data_crc);
        out.freeze()
    }
}

/// The bytes [`peek`] needs from the start of a stored entry.
pub const PEEK_BYTES: usize = 8 + 4 + 4 + 8 + 8;

/// What the first [`PEEK_BYTES`] of a stored entry say: a fence, or the shard and the
/// changes (first and last LSN) of a WAL object. Unchecked: the CRCs cover the whole.
pub fn peek(head: &[u8]) -> Option<Peeked> {
    let magic = head.get(..8)?;
    if magic == FENCE_MAGIC {
        return Some(Peeked::Fence);
    }
    if magic != OBJECT_MAGIC {
        return None;
    }
    let mut r = Reader { bytes: head, at: 8 };
    let shard = r.u32().ok()?;
    let _pieces = r.u32().ok()?;
    let first = Lsn::new(r.u64().ok()?);
    let last = Lsn::new(r.u64().ok()?);
    Some(Peeked::Object { shard, first, last })
}

/// See [`peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peeked {
    Object { shard: u32, first: Lsn, last: Lsn },
    Fence,
}

/// A fence written by the owner `owner` of epoch `epoch`.
pub fn encode_fence(epoch: u64, owner: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(8 + 8 + 8 + 4 + owner.len() + 4);
    out.put_slice(FENCE_MAGIC);
    out.put_u64_le(epoch);
    // Makes a fence at least `PEEK_BYTES` long, so the same ranged read peeks at either.
    out.put_u64_le(0);
    out.put_u32_le(owner.len() as u32);
    out.put_slice(owner.as_bytes());
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// Decode what a WAL key holds; the pieces' bytes share `bytes`.
pub fn decode(bytes: &Bytes) -> Result<WalEntry, WalFormatError> {
    let magic = bytes.get(..8).ok_or(WalFormatError::Truncated)?;
    if magic == FENCE_MAGIC {
        return decode_fence(bytes);
    }
    if magic != OBJECT_MAGIC {
        return Err(WalFormatError::UnknownMagic);
    }
    let mut r = Reader { bytes, at: 8 };
    let shard = r.u32()?;
    let count = r.u32()? as usize;
    let first_lsn = Lsn::new(r.u64()?);
    let last_lsn = Lsn::new(r.u64()?);
    let end = (SegmentNo::new(r.u64()?), r.u64()?);
    let header_end = count
        .checked_mul(PIECE_BYTES)
        .and_then(|n| n.checked_add(HEADER_FIXED))
        .ok_or(WalFormatError::Inconsistent)?;
    if bytes.len() < header_end + 4 {
        return Err(WalFormatError::Truncated);
    }
    let mut ranges = Vec::with_capacity(count);
    for _ in 0..count {
        let segment = SegmentNo::new(r.u64()?);
        let start = r.u64()?;
        let len = r.u64()?;
        let file_len = r.u64()?;
        let first = r.u64()?;
        ranges.push((segment, start, len, file_len, first));
    }
    let crc = r.u32()?;
    if crc32c::crc32c(&bytes[..header_end]) != crc {
        return Err(WalFormatError::Checksum);
    }
    let data_len = ranges
        .iter()
        .try_fold(0u64, |sum, r| sum.checked_add(r.2))
        .ok_or(WalFormatError::Inconsistent)?;
    let data_start = header_end + 4;
    if (bytes.len() - data_start) as u64 != data_len + 4 {
        return Err(WalFormatError::Truncated);
    }
    let data_end = data_start + data_len as usize;
    let data_crc = u32::from_le_bytes(
        bytes[data_end..data_end + 4]
            .try_into()
            .map_err(|_| WalFormatError::Truncated)?,
    );
    if crc32c::crc32c(&bytes[data_start..data_end]) != data_crc {
        return Err(WalFormatError::Checksum);
    }
    if last_lsn < first_lsn || count == 0 {
        return Err(WalFormatError::Inconsistent);
    }
    let mut at = data_start;
    let pieces = ranges
        .into_iter()
        .map(|(segment, start, len, file_len, first)| {
            let piece = WalPiece {
                segment,
                start,
                file_len,
                segment_first_lsn: (first != 0).then(|| Lsn::new(first)),
                bytes: bytes.slice(at..at + len as usize),
            };
            at += len as usize;
            piece
        })
        .collect();
    Ok(WalEntry::Object(WalObject {
        shard,
        first_lsn,
        last_lsn,
        end,
        pieces,
    }))
}

fn decode_fence(bytes: &Bytes) -> Result<WalEntry, WalFormatError> {
    let mut r = Reader { bytes, at: 8 };
    let epoch = r.u64()?;
    let _reserved = r.u64()?;
    let len = r.u32()? as usize;
    let owner = bytes
        .get(r.at..r.at + len)
        .ok_or(WalFormatError::Truncated)?;
    let owner = String::from_utf8_lossy(owner).into_owned();
    r.at += len;
    let body = r.at;
    let crc = r.u32()?;
    if crc32c::crc32c(&bytes[..body]) != crc {
        return Err(WalFormatError::Checksum);
    }
    Ok(WalEntry::Fence { epoch, owner })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WalFormatError> {
        let b = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or(WalFormatError::Truncated)?;
        self.at += N;
        b.try_into().map_err(|_| WalFormatError::Truncated)
    }

    fn u32(&mut self) -> Result<u32, WalFormatError> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, WalFormatError> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> WalObject {
        WalObject {
            shard: 3,
            first_lsn: Lsn::new(10),
            last_lsn: Lsn::new(14),
            end: (SegmentNo::new(8), 4096 + 300),
            pieces: vec![
                WalPiece {
                    segment: SegmentNo::new(7),
                    start: 8192,
                    file_len: 1 << 20,
                    segment_first_lsn: None,
                    bytes: Bytes::from(vec![7u8; 1000]),
                },
                WalPiece {
                    segment: SegmentNo::new(8),
                    start: 4096,
                    file_len: 1 << 20,
                    segment_first_lsn: Some(Lsn::new(13)),
                    bytes: Bytes::from(vec![8u8; 300]),
                },
            ],
        }
    }

    #[test]
    fn an_object_round_trips() {
        let o = object();
        let encoded = o.encode();
        assert_eq!(decode(&encoded), Ok(WalEntry::Object(o)));
    }

    #[test]
    fn the_head_names_the_changes() {
        let encoded = object().encode();
        assert_eq!(
            peek(&encoded[..PEEK_BYTES]),
            Some(Peeked::Object {
                shard: 3,
                first: Lsn::new(10),
                last: Lsn::new(14)
            })
        );
        let fence = encode_fence(1, "");
        assert!(fence.len() >= PEEK_BYTES);
        assert_eq!(peek(&fence[..PEEK_BYTES]), Some(Peeked::Fence));
        assert_eq!(peek(b"short"), None);
    }

    #[test]
    fn a_fence_round_trips() {
        let f = encode_fence(9, "host-b-0a1b");
        assert_eq!(
            decode(&f),
            Ok(WalEntry::Fence {
                epoch: 9,
                owner: "host-b-0a1b".into()
            })
        );
    }

    #[test]
    fn damage_is_detected_never_decoded() {
        let encoded = object().encode();
        for at in [0, 9, 20, 60, encoded.len() / 2, encoded.len() - 1] {
            let mut bad = encoded.to_vec();
            bad[at] ^= 0x40;
            assert!(decode(&Bytes::from(bad)).is_err(), "flip at {at}");
        }
        for len in [0, 7, 30, encoded.len() - 1] {
            assert!(decode(&encoded.slice(..len)).is_err(), "cut at {len}");
        }
        let mut fence = encode_fence(2, "a").to_vec();
        fence[10] ^= 1;
        assert_eq!(decode(&Bytes::from(fence)), Err(WalFormatError::Checksum));
    }
}
