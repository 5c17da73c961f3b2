//! Append-batch framing (extensions §6.1): a body of `[u32 BE len][len bytes]…` frames.

use std::ops::Range;

/// Most frames in one request.
pub const MAX_FRAMES: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// More than [`MAX_FRAMES`] frames, or a body over the size limit (`413`).
    TooLarge,
    /// No frames at all (`400`).
    NoFrames,
    /// A frame with `payload_len` 0 (`400`).
    ZeroLength,
    /// The body ends inside a length prefix or a payload (`400`).
    Truncated,
}

/// Where each frame's payload lies in `body`, so callers can slice without copying. A
/// body longer than `max_body` is refused before any frame is read.
pub fn frame_ranges(body: &[u8], max_body: u64) -> Result<Vec<Range<usize>>, FrameError> {
    if body.len() as u64 > max_body {
        return Err(FrameError::TooLarge);
    }
    let mut frames = Vec::new();
    let mut at = 0usize;
    while at < body.len() {
        if frames.len() == MAX_FRAMES {
            return Err(FrameError::TooLarge);
        }
        let Some(prefix) = body.get(at..at + 4) else {
            return Err(FrameError::Truncated);
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len == 0 {
            return Err(FrameError::ZeroLength);
        }
        at += 4;
        if body.len() - at < len {
            return Err(FrameError::Truncated);
        }
        frames.push(at..at + len);
        at += len;
    }
    if frames.is_empty() {
        return Err(FrameError::NoFrames);
    }
    Ok(frames)
}
