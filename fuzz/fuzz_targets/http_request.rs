//! Request framing: a buffer of pipelined requests is parsed head by head, and every
//! chunked body is decoded twice, in one piece and in pieces of a fuzzed size. Both
//! decodings must agree, since the connection loop feeds the decoder whatever each read
//! returned.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ursula_protocol::http1::{
    parse_request_head, BodyKind, ChunkedDecoder, HeadError, MAX_HEAD_BYTES,
};

/// (consumed, done, body) or the error.
type Decoded = Result<(usize, bool, Vec<u8>), &'static str>;

fn decode_whole(input: &[u8]) -> Decoded {
    let mut d = ChunkedDecoder::new();
    let mut out = Vec::new();
    let (used, done) = d.feed(input, &mut out)?;
    assert!(used <= input.len());
    assert!(
        done || used == input.len(),
        "stopped early without finishing"
    );
    assert_eq!(done, d.is_done());
    Ok((used, done, out))
}

fn decode_pieces(input: &[u8], stride: usize) -> Decoded {
    let mut d = ChunkedDecoder::new();
    let mut out = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let end = (at + stride).min(input.len());
        let (used, done) = d.feed(&input[at..end], &mut out)?;
        at += used;
        if done {
            return Ok((at, true, out));
        }
        assert_eq!(
            at, end,
            "a piece was not consumed although the body is unfinished"
        );
    }
    Ok((at, false, out))
}

fuzz_target!(|data: &[u8]| {
    let Some((&stride, buf)) = data.split_first() else {
        return;
    };
    let stride = usize::from(stride % 17) + 1;
    let mut at = 0;
    for _ in 0..32 {
        if at >= buf.len() {
            break;
        }
        let rest = &buf[at..];
        let head = match parse_request_head(rest) {
            Ok(h) => h,
            Err(HeadError::Incomplete) => {
                assert!(
                    rest.len() <= MAX_HEAD_BYTES,
                    "incomplete past the head limit"
                );
                break;
            }
            Err(_) => break,
        };
        assert!(head.head_len > 0 && head.head_len <= rest.len());
        assert!(head.head_len <= MAX_HEAD_BYTES);
        // The head alone must parse the same: nothing after it may influence it.
        assert_eq!(
            parse_request_head(&rest[..head.head_len]).as_ref(),
            Ok(&head)
        );
        assert!(!head.path.contains('?'));
        at += head.head_len;
        match head.body {
            BodyKind::None => {}
            BodyKind::Length(n) => {
                assert!(n > 0);
                let Ok(n) = usize::try_from(n) else { break };
                if buf.len() - at < n {
                    break;
                }
                at += n;
            }
            BodyKind::Chunked => {
                let whole = decode_whole(&buf[at..]);
                let pieces = decode_pieces(&buf[at..], stride);
                match (&whole, &pieces) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b),
                    (Err(_), Err(_)) => {}
                    _ => panic!("whole {whole:?} vs pieces of {stride}: {pieces:?}"),
                }
                match whole {
                    Ok((used, true, _)) => at += used,
                    _ => break,
                }
            }
        }
    }
});
