//! Request bodies sent with a content coding (`Content-Encoding: gzip`, `deflate` or
//! `zstd`), decoded while their bytes arrive.
//!
//! The body limit counts decoded bytes: a body of a few KiB that inflates past it is
//! refused as soon as its output would pass the limit, so the most a body ever holds is the
//! limit, plus the decoder's own state (a 32 KiB window for gzip and deflate, at most
//! `ZSTD_WINDOW_LOG_MAX` for zstd). The decoders write straight into the body's buffer.
//! It doubles while small; past `DECODED_BODY_DOUBLING_BYTES_MAX` it is reserved at the
//! limit in one piece, so it is never copied again and a growth never holds an old and a
//! new buffer of tens of MiB at once (the reserved pages cost memory only once decoded bytes
//! fill them). Each growth is admitted first by the caller (the core's body budget), so a
//! decoded body is held to the same budget as one sent plain.

use std::cell::RefCell;

use flate2::{Decompress, FlushDecompress, Status};
use ursula_protocol::headers::ContentCoding;
use zstd::stream::raw::{DParameter, Decoder as ZstdDecoder, InBuffer, Operation, OutBuffer};

use crate::limits::{
    DECODED_BODY_DOUBLING_BYTES_MAX, DECODED_BODY_FIRST_BYTES_MIN, DECODED_BODY_FIRST_RATIO,
    ZSTD_WINDOW_LOG_MAX,
};

/// Why a compressed body was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The decoded body would pass the limit (`413`).
    #[error("decompressed body exceeds {} MiB", .limit >> 20)]
    TooLarge { limit: usize },
    /// The compressed data is not valid in its coding; `detail` is the decoder's word.
    #[error("{coding} body is corrupt: {detail}")]
    Corrupt {
        coding: ContentCoding,
        detail: String,
    },
    /// The body ended inside the compressed data (a cut upload, a truncated file).
    #[error("{coding} body ends inside its compressed data")]
    Truncated { coding: ContentCoding },
    /// Bytes after the end of zlib or deflate data, which has no room for a second stream.
    #[error("bytes follow the end of the {coding} data")]
    TrailingBytes { coding: ContentCoding },
    /// The core's body budget has no room for the body's next growth (`503`, retry).
    #[error("too many request bodies in flight on this core")]
    OverBudget,
    /// The zstd decoder could not be set up (its allocation failed).
    #[error("{coding} decoder could not start")]
    Start { coding: ContentCoding },
}

/// Decodes one request body as its compressed bytes are fed in.
pub struct BodyDecoder {
    coding: ContentCoding,
    engine: Engine,
    out: Vec<u8>,
    limit: usize,
    /// The first capacity the output is given (from the compressed length, when known).
    first: usize,
    /// Whether any compressed byte arrived: an empty body decodes to an empty body.
    seen: bool,
}

enum Engine {
    /// `deflate` before its first two bytes are in: whether they are a zlib header decides
    /// between zlib data (what the name means) and raw deflate (what some clients send).
    Sniffing {
        first: Option<u8>,
    },
    Flate {
        inflate: Decompress,
        ended: bool,
    },
    Zstd {
        decoder: Box<ZstdDecoder<'static>>,
        /// The last step finished a frame and flushed all of it.
        ended: bool,
    },
}

/// Where one decoding step writes: the body's spare capacity, or a one-byte probe once the
/// body is at its limit (any byte written there is one too many).
enum Out<'a> {
    Body(&'a mut Vec<u8>),
    Probe(&'a mut [u8; 1]),
}

/// What one decoding step did: compressed bytes consumed, decoded bytes written.
struct Step {
    used: usize,
    written: usize,
}

impl BodyDecoder {
    /// A decoder for a body in `coding` whose decoded form may hold at most `limit` bytes.
    /// `compressed_len` is the body's announced length, if any: it sizes the first buffer.
    pub fn new(
        coding: ContentCoding,
        limit: usize,
        compressed_len: Option<u64>,
    ) -> Result<BodyDecoder, DecodeError> {
        let engine = match coding {
            ContentCoding::Gzip => Engine::Flate {
                inflate: Decompress::new_gzip(15),
                ended: false,
            },
            ContentCoding::Deflate => Engine::Sniffing { first: None },
            ContentCoding::Zstd => Engine::Zstd {
                decoder: take_zstd().map_err(|_| DecodeError::Start { coding })?,
                ended: false,
            },
        };
        // Telemetry JSON shrinks 5-15 times; starting at 4x the compressed length saves
        // most regrowth copies without holding much more than a small body needs.
        let first = compressed_len
            .map_or(0, |n| n.saturating_mul(DECODED_BODY_FIRST_RATIO))
            .clamp(
                DECODED_BODY_FIRST_BYTES_MIN as u64,
                DECODED_BODY_DOUBLING_BYTES_MAX as u64,
            )
            .min(limit as u64) as usize;
        Ok(BodyDecoder {
            coding,
            engine,
            out: Vec::new(),
            limit,
            first,
            seen: false,
        })
    }

    /// Decode the next compressed bytes of the body, all of them. `admit(total)` is asked
    /// before the body's buffer grows to `total` bytes; `false` refuses the body.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        admit: &mut impl FnMut(usize) -> bool,
    ) -> Result<(), DecodeError> {
        self.seen |= !input.is_empty();
        while !input.is_empty() {
            if let Engine::Sniffing { first } = &mut self.engine {
                let Some(b0) = *first else {
                    *first = Some(input[0]);
                    input = &input[1..];
                    continue;
                };
                let zlib = is_zlib_header(b0, input[0]);
                self.engine = Engine::Flate {
                    inflate: Decompress::new(zlib),
                    ended: false,
                };
                // The byte held back goes in first, alone.
                self.decode(&[b0], admit)?;
                continue;
            }
            let used = self.decode(input, admit)?;
            input = &input[used..];
        }
        Ok(())
    }

    /// The decoded body, once every compressed byte has been fed in.
    pub fn finish(mut self, admit: &mut impl FnMut(usize) -> bool) -> Result<Vec<u8>, DecodeError> {
        if !self.seen {
            return Ok(Vec::new());
        }
        // All input is consumed, but the decoder may still hold output it had no room for.
        while !self.ended() {
            if matches!(self.engine, Engine::Sniffing { .. }) {
                return Err(DecodeError::Truncated {
                    coding: self.coding,
                });
            }
            let before = self.out.len();
            self.decode(&[], admit)?;
            if self.out.len() == before && !self.ended() {
                return Err(DecodeError::Truncated {
                    coding: self.coding,
                });
            }
        }
        let mut out = std::mem::take(&mut self.out);
        // Stored appends keep their buffer (cached, logged); a body decoded into a buffer
        // that doubled should not pin up to twice its size for as long as it is cached.
        if out.capacity() - out.len() > out.len() / 8 {
            out.shrink_to_fit();
        }
        Ok(out)
    }

    fn ended(&self) -> bool {
        match &self.engine {
            Engine::Sniffing { .. } => false,
            Engine::Flate { ended, .. } | Engine::Zstd { ended, .. } => *ended,
        }
    }

    /// One step of decoding `input` (possibly empty: flush what the decoder holds) into the
    /// body; how much of `input` it consumed.
    fn decode(
        &mut self,
        input: &[u8],
        admit: &mut impl FnMut(usize) -> bool,
    ) -> Result<usize, DecodeError> {
        let coding = self.coding;
        if self.ended() && !input.is_empty() {
            match &mut self.engine {
                // gzip allows members one after another (`cat a.gz b.gz`, pigz).
                Engine::Flate { inflate, ended } if coding == ContentCoding::Gzip => {
                    *inflate = Decompress::new_gzip(15);
                    *ended = false;
                }
                // zstd frames follow one another; its decoder starts the next by itself.
                Engine::Zstd { .. } => {}
                _ => return Err(DecodeError::TrailingBytes { coding }),
            }
        }
        let len = self.out.len();
        if len == self.out.capacity() && len < self.limit {
            let total = match len {
                0 => self.first,
                _ if len * 2 <= DECODED_BODY_DOUBLING_BYTES_MAX => len * 2,
                _ => self.limit,
            }
            .min(self.limit);
            if !admit(total) {
                return Err(DecodeError::OverBudget);
            }
            self.out.reserve_exact(total - len);
        }
        let step = if len < self.limit {
            self.engine.step(coding, input, Out::Body(&mut self.out))?
        } else {
            let mut probe = [0u8; 1];
            let step = self.engine.step(coding, input, Out::Probe(&mut probe))?;
            if step.written > 0 {
                return Err(DecodeError::TooLarge { limit: self.limit });
            }
            step
        };
        if step.used == 0 && step.written == 0 && !input.is_empty() && !self.ended() {
            // Both decoders always move with input and room to write; standing still would
            // loop forever, so it is reported rather than retried.
            return Err(DecodeError::Corrupt {
                coding,
                detail: "decoder made no progress".into(),
            });
        }
        Ok(step.used)
    }
}

impl Drop for BodyDecoder {
    fn drop(&mut self) {
        if let Engine::Zstd { decoder, .. } =
            std::mem::replace(&mut self.engine, Engine::Sniffing { first: None })
        {
            SPARE_ZSTD.with(|spare| *spare.borrow_mut() = Some(decoder));
        }
    }
}

thread_local! {
    /// A zstd context kept for the next body decoded on this thread (each core decodes on
    /// its own): creating one took about 10 µs, a whole 1 KiB body's decode with a reused
    /// one under 2 µs. One is kept, not one per body in flight; it may hold on to the
    /// window of the last frame it decoded (at most `ZSTD_WINDOW_LOG_MAX`), and zstd frees
    /// a window it keeps finding far too large for the frames that follow.
    static SPARE_ZSTD: RefCell<Option<Box<ZstdDecoder<'static>>>> = const { RefCell::new(None) };
}

/// A zstd context for a new body: this thread's spare one, reset, or a new one.
fn take_zstd() -> std::io::Result<Box<ZstdDecoder<'static>>> {
    if let Some(mut decoder) = SPARE_ZSTD.with(|spare| spare.borrow_mut().take()) {
        // Forgets the last body (however it ended) and keeps the window cap.
        if decoder.reinit().is_ok() {
            return Ok(decoder);
        }
    }
    let mut decoder = ZstdDecoder::new()?;
    // A frame may ask for a window of up to 2 GiB (`zstd --long`); the decoder allocates it
    // up front, so a small body could otherwise cost far more than the body limit.
    decoder.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))?;
    Ok(Box::new(decoder))
}

impl Engine {
    fn step(
        &mut self,
        coding: ContentCoding,
        input: &[u8],
        out: Out<'_>,
    ) -> Result<Step, DecodeError> {
        match self {
            Engine::Sniffing { .. } => Ok(Step {
                used: 0,
                written: 0,
            }),
            Engine::Flate { inflate, ended } => {
                let (before_in, before_out) = (inflate.total_in(), inflate.total_out());
                let status = match out {
                    Out::Body(v) => inflate.decompress_vec(input, v, FlushDecompress::None),
                    Out::Probe(p) => inflate.decompress(input, p, FlushDecompress::None),
                }
                .map_err(|e| DecodeError::Corrupt {
                    coding,
                    detail: e.message().unwrap_or("invalid data").to_owned(),
                })?;
                *ended = status == Status::StreamEnd;
                Ok(Step {
                    used: (inflate.total_in() - before_in) as usize,
                    written: (inflate.total_out() - before_out) as usize,
                })
            }
            Engine::Zstd { decoder, ended } => {
                let mut inb = InBuffer::around(input);
                let corrupt = |e: std::io::Error| DecodeError::Corrupt {
                    coding,
                    detail: e.to_string(),
                };
                let (hint, written) = match out {
                    Out::Body(v) => {
                        let start = v.len();
                        let mut outb = OutBuffer::around_pos(v, start);
                        let hint = decoder.run(&mut inb, &mut outb).map_err(corrupt)?;
                        (hint, outb.pos() - start)
                    }
                    Out::Probe(p) => {
                        let mut outb = OutBuffer::around(&mut p[..]);
                        let hint = decoder.run(&mut inb, &mut outb).map_err(corrupt)?;
                        (hint, outb.pos())
                    }
                };
                // 0: a frame is complete and all of it flushed.
                *ended = hint == 0;
                Ok(Step {
                    used: inb.pos(),
                    written,
                })
            }
        }
    }
}

/// Whether two bytes open zlib data (RFC 1950 §2.2): method 8 (deflate) with a window of at
/// most 32 KiB, and a check value making the pair a multiple of 31.
fn is_zlib_header(cmf: u8, flg: u8) -> bool {
    cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const LIMIT: usize = 1 << 20;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    fn zstd(data: &[u8], level: i32) -> Vec<u8> {
        zstd::bulk::compress(data, level).expect("in memory")
    }

    /// Decode `body` fed in pieces of `piece` bytes, admitting every growth.
    fn decode_in(coding: ContentCoding, body: &[u8], piece: usize) -> Result<Vec<u8>, DecodeError> {
        let mut d = BodyDecoder::new(coding, LIMIT, Some(body.len() as u64))?;
        let mut admit = |total: usize| {
            assert!(total <= LIMIT, "buffer grown past the limit");
            true
        };
        for chunk in body.chunks(piece.max(1)) {
            d.feed(chunk, &mut admit)?;
        }
        d.finish(&mut admit)
    }

    fn decode(coding: ContentCoding, body: &[u8]) -> Result<Vec<u8>, DecodeError> {
        decode_in(coding, body, body.len())
    }

    fn telemetry(lines: usize) -> Vec<u8> {
        (0..lines)
            .map(|i| {
                format!(
                    "{{\"seq\":{i},\"type\":\"click\",\"target\":\"#buy-{}\"}}\n",
                    i % 7
                )
            })
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn every_coding_round_trips_in_any_pieces() {
        let data = telemetry(2000);
        let cases = [
            (ContentCoding::Gzip, gzip(&data)),
            (ContentCoding::Deflate, zlib(&data)),
            (ContentCoding::Deflate, raw_deflate(&data)),
            (ContentCoding::Zstd, zstd(&data, 3)),
        ];
        for (coding, body) in cases {
            for piece in [1, 2, 7, 4096, body.len()] {
                assert_eq!(
                    decode_in(coding, &body, piece).as_deref(),
                    Ok(&data[..]),
                    "{coding} in pieces of {piece}"
                );
            }
        }
    }

    #[test]
    fn concatenated_gzip_members_and_zstd_frames_are_one_body() {
        let mut body = gzip(b"hello ");
        body.extend(gzip(b"world"));
        assert_eq!(
            decode(ContentCoding::Gzip, &body).as_deref(),
            Ok(&b"hello world"[..])
        );
        let mut body = zstd(b"hello ", 1);
        body.extend(zstd(b"world", 19));
        assert_eq!(
            decode(ContentCoding::Zstd, &body).as_deref(),
            Ok(&b"hello world"[..])
        );
    }

    #[test]
    fn an_empty_body_is_empty_in_every_coding() {
        for coding in [
            ContentCoding::Gzip,
            ContentCoding::Deflate,
            ContentCoding::Zstd,
        ] {
            assert_eq!(decode(coding, b""), Ok(Vec::new()));
        }
    }

    #[test]
    fn a_bomb_stops_at_the_limit_and_never_holds_more() {
        let zeros = vec![0u8; 8 * LIMIT];
        for (coding, body) in [
            (ContentCoding::Gzip, gzip(&zeros)),
            (ContentCoding::Deflate, zlib(&zeros)),
            (ContentCoding::Zstd, zstd(&zeros, 3)),
        ] {
            assert!(body.len() < LIMIT / 4, "{coding}: {} bytes", body.len());
            let mut d = BodyDecoder::new(coding, LIMIT, Some(body.len() as u64)).expect("new");
            let mut most = 0;
            let mut admit = |total: usize| {
                most = most.max(total);
                true
            };
            let r = body
                .chunks(16 * 1024)
                .try_for_each(|c| d.feed(c, &mut admit))
                .and_then(|()| d.finish(&mut admit).map(drop));
            assert_eq!(r, Err(DecodeError::TooLarge { limit: LIMIT }), "{coding}");
            assert_eq!(most, LIMIT, "{coding}: the buffer stops at the limit");
        }
    }

    #[test]
    fn the_buffer_doubles_while_small_then_takes_the_limit_at_once() {
        let limit = 8 * DECODED_BODY_DOUBLING_BYTES_MAX;
        let body = gzip(&vec![7u8; 3 * DECODED_BODY_DOUBLING_BYTES_MAX]);
        let mut d = BodyDecoder::new(ContentCoding::Gzip, limit, Some(100)).expect("new");
        let mut grown = Vec::new();
        let mut admit = |total: usize| {
            grown.push(total);
            true
        };
        d.feed(&body, &mut admit).expect("feed");
        let out = d.finish(&mut admit).expect("finish");
        assert_eq!(out.len(), 3 * DECODED_BODY_DOUBLING_BYTES_MAX);
        let mut want = vec![];
        let mut size = DECODED_BODY_FIRST_BYTES_MIN;
        while size <= DECODED_BODY_DOUBLING_BYTES_MAX {
            want.push(size);
            size *= 2;
        }
        want.push(limit);
        assert_eq!(grown, want);
    }

    #[test]
    fn exactly_the_limit_is_accepted() {
        let data = vec![b'x'; LIMIT];
        for (coding, body) in [
            (ContentCoding::Gzip, gzip(&data)),
            (ContentCoding::Deflate, raw_deflate(&data)),
            (ContentCoding::Zstd, zstd(&data, 1)),
        ] {
            assert_eq!(
                decode_in(coding, &body, 100).map(|b| b.len()),
                Ok(LIMIT),
                "{coding}"
            );
        }
        let over = vec![b'x'; LIMIT + 1];
        assert_eq!(
            decode(ContentCoding::Gzip, &gzip(&over)),
            Err(DecodeError::TooLarge { limit: LIMIT })
        );
    }

    #[test]
    fn a_refused_growth_refuses_the_body() {
        let body = gzip(&telemetry(100));
        let mut d = BodyDecoder::new(ContentCoding::Gzip, LIMIT, None).expect("new");
        assert_eq!(d.feed(&body, &mut |_| false), Err(DecodeError::OverBudget));
    }

    #[test]
    fn corrupt_truncated_and_trailing_bodies_are_named() {
        let data = telemetry(50);
        let good = gzip(&data);
        // A flipped byte in the compressed data, or in the CRC of the trailer.
        let mut bad = good.clone();
        bad[20] ^= 0xff;
        assert!(matches!(
            decode(ContentCoding::Gzip, &bad),
            Err(DecodeError::Corrupt { .. })
        ));
        let mut bad_crc = good.clone();
        let at = bad_crc.len() - 6;
        bad_crc[at] ^= 1;
        assert!(matches!(
            decode(ContentCoding::Gzip, &bad_crc),
            Err(DecodeError::Corrupt { .. })
        ));
        // Not gzip at all.
        let r = decode(ContentCoding::Gzip, b"{\"plain\":true}");
        assert!(matches!(r, Err(DecodeError::Corrupt { .. })), "{r:?}");
        if let Err(e) = r {
            assert!(e.to_string().starts_with("gzip body is corrupt: "), "{e}");
        }
        // Cut anywhere before the end.
        for cut in [1, 10, good.len() / 2, good.len() - 1] {
            assert_eq!(
                decode(ContentCoding::Gzip, &good[..cut]),
                Err(DecodeError::Truncated {
                    coding: ContentCoding::Gzip
                }),
                "cut at {cut}"
            );
        }
        let z = zstd(&data, 3);
        assert_eq!(
            decode(ContentCoding::Zstd, &z[..z.len() - 3]),
            Err(DecodeError::Truncated {
                coding: ContentCoding::Zstd
            })
        );
        assert_eq!(
            decode(ContentCoding::Deflate, &[0x78]),
            Err(DecodeError::Truncated {
                coding: ContentCoding::Deflate
            })
        );
        let mut trailing = zlib(&data);
        trailing.push(0);
        assert_eq!(
            decode(ContentCoding::Deflate, &trailing),
            Err(DecodeError::TrailingBytes {
                coding: ContentCoding::Deflate
            })
        );
        // Garbage after a gzip member is read as a second member, and is not one.
        let mut junk = good.clone();
        junk.extend_from_slice(b"junk");
        assert!(matches!(
            decode(ContentCoding::Gzip, &junk),
            Err(DecodeError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_zstd_window_over_the_cap_is_refused_before_it_is_allocated() {
        let data = telemetry(100);
        // A streaming encoder does not know the size, so its frame keeps the window asked
        // for (a one-shot encoder shrinks the window to the input).
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder");
        e.set_parameter(zstd::stream::raw::CParameter::WindowLog(
            ZSTD_WINDOW_LOG_MAX + 4,
        ))
        .expect("window");
        e.write_all(&data).expect("in memory");
        let body = e.finish().expect("in memory");
        let r = decode(ContentCoding::Zstd, &body);
        assert!(matches!(r, Err(DecodeError::Corrupt { .. })), "{r:?}");
    }

    #[test]
    fn a_reused_zstd_context_forgets_the_last_body_and_keeps_the_window_cap() {
        let data = telemetry(200);
        let z = zstd(&data, 3);
        // A body cut in the middle of its frame leaves the context mid-frame.
        let mut d = BodyDecoder::new(ContentCoding::Zstd, LIMIT, None).expect("new");
        d.feed(&z[..z.len() / 2], &mut |_| true).expect("half");
        drop(d);
        assert_eq!(decode(ContentCoding::Zstd, &z).as_deref(), Ok(&data[..]));
        assert!(
            SPARE_ZSTD.with(|s| s.borrow().is_some()),
            "kept for the next body"
        );
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder");
        e.set_parameter(zstd::stream::raw::CParameter::WindowLog(
            ZSTD_WINDOW_LOG_MAX + 1,
        ))
        .expect("window");
        e.write_all(&data).expect("in memory");
        let wide = e.finish().expect("in memory");
        assert!(matches!(
            decode(ContentCoding::Zstd, &wide),
            Err(DecodeError::Corrupt { .. })
        ));
    }

    #[test]
    fn zlib_headers_are_told_from_raw_deflate() {
        assert!(is_zlib_header(0x78, 0x9c));
        assert!(is_zlib_header(0x78, 0x01));
        assert!(is_zlib_header(0x78, 0xda));
        assert!(!is_zlib_header(0x78, 0x9d));
        assert!(!is_zlib_header(0x1f, 0x8b));
        let raw = raw_deflate(b"abc");
        assert!(!is_zlib_header(raw[0], raw[1]));
    }
}
