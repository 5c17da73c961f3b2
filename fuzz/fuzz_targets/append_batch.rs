//! Append-batch framing, against a reference decoder written independently: both must
//! agree on every body, and accepted frames must re-encode to the body exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ursula_protocol::batch::{frame_ranges, FrameError, MAX_FRAMES};

fn reference(body: &[u8], max_body: u64) -> Result<Vec<(usize, usize)>, FrameError> {
    if body.len() as u64 > max_body {
        return Err(FrameError::TooLarge);
    }
    let mut out = Vec::new();
    let mut rest = body;
    let mut base = 0;
    while !rest.is_empty() {
        if out.len() == MAX_FRAMES {
            return Err(FrameError::TooLarge);
        }
        if rest.len() < 4 {
            return Err(FrameError::Truncated);
        }
        let (len, tail) = rest.split_at(4);
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return Err(FrameError::ZeroLength);
        }
        if tail.len() < len {
            return Err(FrameError::Truncated);
        }
        out.push((base + 4, base + 4 + len));
        base += 4 + len;
        rest = &tail[len..];
    }
    if out.is_empty() {
        return Err(FrameError::NoFrames);
    }
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&limit, body)) = data.split_first() else {
        return;
    };
    // Small limits exercise the size check; 255 stands for "no limit".
    let max_body = if limit == 255 {
        u64::MAX
    } else {
        u64::from(limit) * 8
    };
    let got = frame_ranges(body, max_body);
    let want = reference(body, max_body);
    match (&got, &want) {
        (Ok(g), Ok(w)) => {
            let g: Vec<(usize, usize)> = g.iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(&g, w);
            let mut re = Vec::with_capacity(body.len());
            for r in got.as_ref().expect("ok") {
                re.extend_from_slice(&((r.end - r.start) as u32).to_be_bytes());
                re.extend_from_slice(&body[r.clone()]);
            }
            assert_eq!(re, body);
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("frame_ranges {got:?} vs reference {want:?}"),
    }
});
