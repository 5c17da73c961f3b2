//! Log record and segment header decoding. Two views of the input: raw log bytes (as
//! after a torn write or bit rot), and the input as a record payload wrapped in a frame
//! with a correct checksum, so the payload parser sees arbitrary bytes that passed the
//! CRC (which random bytes almost never do). Whatever decodes must re-encode to exactly
//! the bytes it came from.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ursula_storage::record::{decode_at, FRAME_HEADER};
use ursula_storage::segment::SegmentHeader;

fn check_round_trip(buf: &Bytes, pos: usize) {
    if let Ok(f) = decode_at(buf, pos) {
        assert!(f.len >= FRAME_HEADER && pos + f.len <= buf.len());
        assert_eq!(f.record.framed_len(), f.len);
        let mut re = Vec::new();
        f.record.encode(f.lsn, &mut re);
        assert_eq!(
            &re[..],
            &buf[pos..pos + f.len],
            "decode/encode is not a round trip"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    // Raw view, at a fuzzed start position.
    let raw = Bytes::copy_from_slice(&data[1..]);
    let pos = usize::from(data[0]).min(raw.len());
    check_round_trip(&raw, pos);

    // Payload view: kind from the first byte, LSN 1, checksum made to match.
    let kind = data[0] % 10;
    let payload = &data[1..];
    let mut framed = vec![0u8; FRAME_HEADER];
    framed[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    framed[8..16].copy_from_slice(&1u64.to_le_bytes());
    framed[16] = kind;
    framed.extend_from_slice(payload);
    let crc = crc32c(&framed[8..]);
    framed[4..8].copy_from_slice(&crc.to_le_bytes());
    check_round_trip(&Bytes::from(framed), 0);

    // Segment headers.
    if let Some(h) = SegmentHeader::decode(data) {
        let mut block = vec![0u8; 4096];
        h.encode(&mut block);
        assert_eq!(SegmentHeader::decode(&block), Some(h));
    }
});

/// CRC-32C (Castagnoli), bitwise: the fuzz crate does not need to share the engine's
/// implementation to agree with it.
fn crc32c(b: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in b {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
