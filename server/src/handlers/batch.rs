//! Append-batch (extensions.md §6, §8.11): many small independent appends in one request,
//! `POST /{bucket}/{stream}/append-batch`.
//!
//! Every frame is its own append record with its own acknowledgement, exactly as a
//! standalone POST would be. All frames of a request are validated first, then appended
//! with no `.await` in between (so they share one group commit and no other request for the
//! stream interleaves), and only the last commit's durability is awaited: commits are
//! durable in LSN order, so that covers every frame of the request.

use std::cell::Cell;
use std::fmt::Write as _;
use std::rc::Rc;

use bytes::Bytes;
use ursula_protocol::content_type::{is_json, normalize, same_media_type};
use ursula_protocol::headers::is_closed_true;
use ursula_protocol::http1::Method;
use ursula_protocol::offset::format_offset;
use ursula_storage::{AppendRec, Offset, Receipt, RecordNo, StorageError};

use crate::core::Core;
use crate::handlers::append::{self, Target};
use crate::handlers::buckets::{self, require_bucket};
use crate::http::{ApiError, Handled, Request, Response};
use crate::limits::BODY_BYTES_MAX;
use crate::payload::{payload, Payload, PayloadKind};
use crate::records;
use crate::surface::Surface;

use ursula_protocol::batch::FrameError;

fn frame_error(e: FrameError) -> ApiError {
    match e {
        FrameError::TooLarge => {
            ApiError::PayloadTooLarge("append-batch takes at most 512 frames and 32 MiB".into())
        }
        FrameError::NoFrames => ApiError::EmptyBody("append-batch needs at least one frame"),
        FrameError::ZeroLength => ApiError::InvalidRequest("append-batch frames must not be empty"),
        FrameError::Truncated => ApiError::InvalidRequest("truncated append-batch frame"),
    }
}

/// Split a body into frames: `[u32 BE len][len bytes]…` (§6.1). Frames are zero-copy
/// slices of `body`.
pub fn decode_frames(body: &Bytes) -> Result<Vec<Bytes>, FrameError> {
    let ranges = ursula_protocol::batch::frame_ranges(body, BODY_BYTES_MAX)?;
    Ok(ranges.into_iter().map(|r| body.slice(r)).collect())
}

/// The acknowledgement of one frame (§6.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    Committed {
        next: Offset,
        /// Record range on JSON streams.
        records: Option<(RecordNo, RecordNo)>,
    },
    Failed {
        error: ApiError,
        closed: bool,
        /// Stream tail, when the failure knows it.
        next: Option<Offset>,
    },
}

impl Ack {
    fn storage(e: StorageError, tail: Offset) -> Ack {
        Ack::Failed {
            error: e.into(),
            closed: false,
            next: Some(tail),
        }
    }
}

/// The JSON array of acknowledgements (§6.3), field order as in the spec's example.
pub fn render_acks(acks: &[Ack]) -> String {
    let mut out = String::with_capacity(16 + acks.len() * 112);
    out.push('[');
    for (i, ack) in acks.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match ack {
            Ack::Committed { next, records } => {
                let _ = write!(
                    out,
                    "{{\"status\":204,\"stream_next_offset\":\"{}\"",
                    format_offset(next.get())
                );
                if let Some((start, next)) = records {
                    let _ = write!(
                        out,
                        ",\"stream_record_start\":{start},\"stream_record_next\":{next}"
                    );
                }
            }
            Ack::Failed {
                error,
                closed,
                next,
            } => {
                // Codes are fixed ASCII; a reason is written as a JSON string.
                let reason = sonic_rs::to_string(&error.reason()).unwrap_or_default();
                let _ = write!(
                    out,
                    "{{\"status\":{},\"error_code\":\"{}\",\"error\":{reason}",
                    error.status(),
                    error.code(),
                );
                if *closed {
                    out.push_str(",\"stream_closed\":true");
                }
                if let Some(n) = next {
                    let _ = write!(
                        out,
                        ",\"stream_next_offset\":\"{}\"",
                        format_offset(n.get())
                    );
                }
            }
        }
        out.push('}');
    }
    out.push(']');
    out
}

/// The head state a frame is checked against: (tail, closed).
type Head = (Offset, bool);

/// Check and append every frame in order, synchronously. `head` reads the stream's current
/// head state and `append` queues one record; a failed frame changes nothing and later frames
/// continue from the committed tail. Returns the acknowledgements and the last commit.
pub fn append_frames<C>(
    payloads: Vec<Payload>,
    type_ok: bool,
    coords: bool,
    mut head: impl FnMut() -> Option<Head>,
    mut append: impl FnMut(AppendRec) -> Result<(Receipt, C), StorageError>,
) -> (Vec<Ack>, Option<C>) {
    let mut acks = Vec::with_capacity(payloads.len());
    let mut last = None;
    for p in payloads {
        let Some((tail, closed)) = head() else {
            acks.push(Ack::Failed {
                error: ApiError::StreamNotFound,
                closed: false,
                next: None,
            });
            continue;
        };
        if closed {
            acks.push(Ack::Failed {
                error: ApiError::StreamClosed,
                closed: true,
                next: Some(tail),
            });
            continue;
        }
        if !type_ok {
            acks.push(Ack::Failed {
                error: ApiError::ContentTypeMismatch("Content-Type differs from the stream's"),
                closed: false,
                next: Some(tail),
            });
            continue;
        }
        let rec = AppendRec {
            append_lens: vec![p.data.len() as u32],
            msg_lens: p.msg_lens,
            data: p.data,
            ..Default::default()
        };
        match append(rec) {
            Ok((r, commit)) => {
                acks.push(Ack::Committed {
                    next: r.next,
                    records: coords.then_some((r.record_start, r.record_next)),
                });
                last = Some(commit);
            }
            Err(e) => acks.push(Ack::storage(e, tail)),
        }
    }
    (acks, last)
}

/// Request headers that only make sense on an ordinary POST (§6.1, D9).
fn rejected_header(req: &Request) -> Option<&'static str> {
    for name in ["producer-id", "producer-epoch", "producer-seq"] {
        if req.header(name).is_some() {
            return Some("append-batch does not take Producer-* headers");
        }
    }
    if req.header("stream-seq").is_some_and(|v| !v.is_empty()) {
        return Some("append-batch does not take Stream-Seq");
    }
    if req.header("stream-record-match").is_some() {
        return Some("append-batch does not take Stream-Record-Match");
    }
    if is_closed_true(req.header("stream-closed")) {
        return Some("append-batch cannot close a stream");
    }
    None
}

fn prefers_minimal(req: &Request) -> bool {
    req.header("prefer").is_some_and(|v| {
        v.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("return=minimal"))
    })
}

/// `POST /{bucket}/{stream}/append-batch`, on the stream's owner core.
pub async fn handle(core: &Rc<Core>, key: &str, req: Request) -> Handled {
    if req.method != Method::Post {
        return Err(ApiError::MethodNotAllowed {
            allow: "POST, OPTIONS",
            reason: "append-batch takes POST",
        }
        .into());
    }
    // 1. size limits, 2. header syntax and rejected headers
    let frames = decode_frames(&req.body);
    if frames == Err(FrameError::TooLarge) {
        return Err(frame_error(FrameError::TooLarge).into());
    }
    if let Some(why) = rejected_header(&req) {
        return Err(ApiError::InvalidHeader(why).into());
    }
    let request_type = match req.header("content-type").map(normalize) {
        Some(Ok(ct)) => Some(ct),
        Some(Err(_)) => return Err(ApiError::InvalidHeader("invalid Content-Type").into()),
        None => None,
    };
    // 3. existence: the stream, or the one the bucket's `auto_create` makes of the first
    // frame. No `.await` from here to the commit, so concurrent first writes create it once.
    require_bucket(core, key).await?;
    let shard = core.shard_for(key)?;
    let target = append::target(core, &shard, Surface::Bucketed, key, false)?;
    // 4. body: framing, Content-Type, then every frame's JSON before anything commits
    let request_type = request_type.ok_or(ApiError::MissingContentType)?;
    let frames = frames.map_err(frame_error)?;
    let of_type = |stream_type: &str| {
        (
            same_media_type(&request_type, stream_type),
            records::active(Surface::Bucketed, stream_type),
            is_json(stream_type),
        )
    };
    let (type_ok, coords, json) = match &target {
        Target::Live(id) => match shard.stream(*id) {
            Some(s) => of_type(s.content_type()),
            None => return Err(ApiError::owner_unavailable().into()),
        },
        Target::New { settings, .. } => of_type(&settings.content_type),
    };
    // NDJSON frames to a JSON stream: each frame's lines are its messages.
    let (kind, lines) = PayloadKind::of_append(Surface::Bucketed, &request_type, || Some(json))?;
    let payloads = frames
        .iter()
        .map(|f| payload(kind, f.clone(), false))
        .collect::<Result<Vec<_>, _>>()?;
    drop(frames);
    // Each frame is an append to the bucket's rate limit, refused or not further on.
    let bytes = payloads.iter().map(|p| p.data.len() as u64).sum();
    buckets::throttle(core, &shard, key, payloads.len() as u64, bytes)?;
    let type_ok = type_ok || lines;
    // 5. commit: one group commit for the whole request (no `.await` until `durable`). A
    // stream still to be created is the empty open stream its settings describe until the
    // first frame that commits creates it.
    let (live, mut create) = match target {
        Target::Live(id) => (Some(id), None),
        Target::New { settings, expired } => (None, Some((settings, expired))),
    };
    let id = Cell::new(live);
    let (acks, last) = append_frames(
        payloads,
        type_ok,
        coords,
        || match id.get() {
            Some(id) => shard.head(id).map(|s| (s.tail(), s.closed())),
            None => Some((Offset::ZERO, false)),
        },
        |rec| match (id.get(), &mut create) {
            (Some(id), _) => shard.append(id, rec),
            (None, Some((settings, expired))) => {
                let (new, receipt, commit) =
                    append::create(core, &shard, key, settings, expired.take(), rec)?;
                id.set(Some(new));
                Ok((receipt, commit))
            }
            (None, None) => Err(StorageError::Internal("append-batch without a stream")),
        },
    );
    let live = id.get();
    if let Some(commit) = last {
        commit.durable().await?;
    }
    let tail = acks
        .iter()
        .rev()
        .find_map(|a| match a {
            Ack::Committed { next, .. } => Some(*next),
            _ => None,
        })
        .or_else(|| live.and_then(|id| shard.stream(id).map(|s| s.next_offset())))
        .unwrap_or(Offset::ZERO);
    let all_ok = acks.iter().all(|a| matches!(a, Ack::Committed { .. }));
    let mut resp = Response::new(200)
        .header("stream-next-offset", format_offset(tail.get()))
        .header("cache-control", "no-store");
    if coords {
        resp.push("stream-extensions", records::EXTENSIONS);
    }
    if all_ok && !coords && prefers_minimal(&req) {
        resp.status = 204;
        return Ok(resp);
    }
    resp.push("content-type", "application/json");
    Ok(resp.with_body(vec![Bytes::from(render_acks(&acks))]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use ursula_protocol::batch::MAX_FRAMES;

    /// The wire format: one `[u32 BE len][payload]` per frame.
    fn encode_frames<'a>(frames: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            out.extend_from_slice(&(f.len() as u32).to_be_bytes());
            out.extend_from_slice(f);
        }
        out
    }

    fn frames(parts: &[&[u8]]) -> Bytes {
        Bytes::from(encode_frames(parts.iter().copied()))
    }

    #[test]
    fn decodes_frames_zero_copy() {
        let body = frames(&[b"a", b"bc", &[0u8; 300]]);
        let f = decode_frames(&body).unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(&f[0][..], b"a");
        assert_eq!(&f[1][..], b"bc");
        assert_eq!(f[2].len(), 300);
        assert_eq!(f[1].as_ptr(), body[9..].as_ptr());
    }

    #[test]
    fn rejects_bad_framing() {
        assert_eq!(decode_frames(&Bytes::new()), Err(FrameError::NoFrames));
        // Zero-length frame, alone or after a good one.
        assert_eq!(
            decode_frames(&Bytes::from_static(&[0, 0, 0, 0])),
            Err(FrameError::ZeroLength)
        );
        let mut b = encode_frames([&b"ok"[..]]);
        b.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(decode_frames(&b.into()), Err(FrameError::ZeroLength));
        // Truncated length prefix.
        for cut in 1..4 {
            let b = Bytes::from(vec![0u8; cut]);
            assert_eq!(decode_frames(&b), Err(FrameError::Truncated), "{cut}");
        }
        let mut b = encode_frames([&b"ok"[..]]);
        b.extend_from_slice(&[0, 0]);
        assert_eq!(decode_frames(&b.into()), Err(FrameError::Truncated));
        // Truncated payload, and a length far beyond the body.
        let mut b = encode_frames([&b"hello"[..]]);
        b.pop();
        assert_eq!(decode_frames(&b.into()), Err(FrameError::Truncated));
        let b = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, b'x']);
        assert_eq!(decode_frames(&b), Err(FrameError::Truncated));
    }

    #[test]
    fn frame_count_limit() {
        let one: &[u8] = b"x";
        let ok = Bytes::from(encode_frames(std::iter::repeat_n(one, MAX_FRAMES)));
        assert_eq!(decode_frames(&ok).unwrap().len(), MAX_FRAMES);
        let over = Bytes::from(encode_frames(std::iter::repeat_n(one, MAX_FRAMES + 1)));
        assert_eq!(decode_frames(&over), Err(FrameError::TooLarge));
        // Counted before later framing errors are seen.
        let mut b = encode_frames(std::iter::repeat_n(one, MAX_FRAMES + 1));
        b.extend_from_slice(&[0, 0]);
        assert_eq!(decode_frames(&b.into()), Err(FrameError::TooLarge));
    }

    fn p(data: &'static [u8], msgs: &[u32]) -> Payload {
        Payload {
            data: Bytes::from_static(data),
            msg_lens: msgs.to_vec(),
        }
    }

    /// A fake stream: frame 1 hits a full disk, the others commit from the committed tail.
    #[test]
    fn failed_frame_assigns_nothing_and_later_frames_continue() {
        let tail = Cell::new(Offset::new(10));
        let records = Cell::new(RecordNo::new(3));
        let calls = Cell::new(0);
        let (acks, last) = append_frames(
            vec![
                p(b"{\"a\":1}\n", &[8]),
                p(b"{\"b\":2}\n", &[8]),
                p(b"1\n2\n", &[2, 2]),
            ],
            true,
            true,
            || Some((tail.get(), false)),
            |rec| {
                calls.set(calls.get() + 1);
                if calls.get() == 2 {
                    return Err(StorageError::NoSpace);
                }
                let r = Receipt {
                    seq: 0,
                    start: tail.get(),
                    next: tail.get() + rec.data.len() as u64,
                    record_start: records.get(),
                    record_next: records.get() + rec.msg_lens.len() as u64,
                };
                assert_eq!(rec.append_lens, vec![rec.data.len() as u32]);
                tail.set(r.next);
                records.set(r.record_next);
                Ok((r, calls.get()))
            },
        );
        assert_eq!(last, Some(3));
        assert_eq!(
            render_acks(&acks),
            concat!(
                r#"[{"status":204,"stream_next_offset":"00000000000000000018","stream_record_start":3,"stream_record_next":4},"#,
                r#"{"status":507,"error_code":"insufficient_storage","error":"disk full","stream_next_offset":"00000000000000000018"},"#,
                r#"{"status":204,"stream_next_offset":"00000000000000000022","stream_record_start":4,"stream_record_next":6}]"#
            )
        );
    }

    #[test]
    fn closed_and_mismatched_frames() {
        let never = |_: AppendRec| -> Result<(Receipt, ()), StorageError> {
            panic!("nothing may be appended")
        };
        // One frame against a stream at offset 5: nothing is appended, whatever the cause.
        let refused = |type_ok: bool, closed: bool| {
            let (acks, last) = append_frames(
                vec![p(b"x", &[1])],
                type_ok,
                false,
                || Some((Offset::new(5), closed)),
                never,
            );
            assert!(last.is_none());
            render_acks(&acks)
        };
        assert_eq!(
            refused(true, true),
            r#"[{"status":409,"error_code":"stream_closed","error":"stream is closed","stream_closed":true,"stream_next_offset":"00000000000000000005"}]"#
        );
        assert_eq!(
            refused(false, false),
            r#"[{"status":409,"error_code":"content_type_mismatch","error":"Content-Type differs from the stream's","stream_next_offset":"00000000000000000005"}]"#
        );
    }
}
