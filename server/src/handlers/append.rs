//! `POST` of a stream (P§6-§7): one append, with its producer, `Stream-Seq`, close and
//! record-precondition checks, acknowledged once durable.
//!
//! Runs on the owner core: the checks and the shard append have no `.await` between them,
//! so they are atomic with respect to every other request for the stream.

use std::rc::Rc;

use bytes::Bytes;
use ursula_protocol::content_type::{normalize, same_media_type, ContentTypeError};
use ursula_protocol::headers::{
    is_closed_true, parse_producer, parse_stream_seq, ProducerHeaders, StreamSeqTooLong,
};
use ursula_protocol::offset::format_offset;
use ursula_storage::{AppendRec, ProducerStamp, Receipt, RecordNo, StreamId};

use crate::core::Core;
use crate::handlers::headers::closed_response;
use crate::http::{ApiError, Request, Response};
use crate::lookup;
use crate::payload::{payload, Payload, PayloadKind};
use crate::records;
use crate::surface::Surface;

/// Outcome of the producer check (P§7.2).
enum ProducerVerdict {
    Accept,
    Duplicate {
        epoch: u64,
        highest: u64,
        receipt: Option<Receipt>,
    },
    Stale {
        current: u64,
    },
    NewEpochNonZero,
    Gap {
        expected: u64,
        received: u64,
    },
}

fn check_producer(core: &Rc<Core>, id: StreamId, p: &ProducerHeaders) -> ProducerVerdict {
    let Some(s) = core.shard.head(id) else {
        return ProducerVerdict::Accept;
    };
    let Some(state) = s.producer(p.id.as_str()) else {
        return if p.seq == 0 {
            ProducerVerdict::Accept
        } else {
            ProducerVerdict::Gap {
                expected: 0,
                received: p.seq,
            }
        };
    };
    if p.epoch < state.epoch {
        return ProducerVerdict::Stale {
            current: state.epoch,
        };
    }
    if p.epoch > state.epoch {
        return if p.seq == 0 {
            ProducerVerdict::Accept
        } else {
            ProducerVerdict::NewEpochNonZero
        };
    }
    if p.seq <= state.last_seq {
        return ProducerVerdict::Duplicate {
            epoch: state.epoch,
            highest: state.last_seq,
            receipt: state.receipt(p.seq).copied(),
        };
    }
    if p.seq == state.last_seq + 1 {
        ProducerVerdict::Accept
    } else {
        ProducerVerdict::Gap {
            expected: state.last_seq + 1,
            received: p.seq,
        }
    }
}

/// What an append's headers say, read on the core that accepted the request: the owner
/// core gets parsed values and the body instead of the request's header strings, which it
/// would otherwise walk as cache lines another core wrote. Every refusal found here is
/// kept, not returned, so the owner reports it in the order the protocol checks them.
pub struct AppendRequest {
    producer: Result<Option<ProducerHeaders>, &'static str>,
    stream_seq: Result<Option<Bytes>, StreamSeqTooLong>,
    close: bool,
    record_match: Result<Option<RecordNo>, ()>,
    /// The normalised `Content-Type`, if one was sent.
    content_type: Option<Result<String, ContentTypeError>>,
    body: Bytes,
}

impl AppendRequest {
    /// Read the append's headers and take its body out of `req`.
    pub fn read(surface: Surface, req: &mut Request) -> AppendRequest {
        let producer = parse_producer(
            req.header("producer-id"),
            req.header("producer-epoch"),
            req.header("producer-seq"),
        );
        let stream_seq = parse_stream_seq(req.header("stream-seq"))
            .map(|s| s.map(|s| Bytes::copy_from_slice(s.as_bytes())));
        let record_match = match (surface, req.header("stream-record-match")) {
            (Surface::Bucketed, Some(v)) => ursula_protocol::records::parse_record_match(v)
                .map(|n| Some(RecordNo::new(n)))
                .ok_or(()),
            _ => Ok(None),
        };
        AppendRequest {
            producer,
            stream_seq,
            close: is_closed_true(req.header("stream-closed")),
            record_match,
            content_type: req.header("content-type").map(normalize),
            body: std::mem::take(&mut req.body),
        }
    }
}

pub async fn append(core: &Rc<Core>, surface: Surface, key: &str, req: AppendRequest) -> Response {
    // 2. header syntax
    let producer = match req.producer {
        Ok(p) => p,
        Err(why) => return ApiError::InvalidRequest(why).response(),
    };
    let stream_seq = match req.stream_seq {
        Ok(s) => s,
        Err(StreamSeqTooLong) => {
            return ApiError::InvalidRequest("Stream-Seq longer than 1024 bytes").response()
        }
    };
    let close = req.close;
    let record_match = match req.record_match {
        Ok(n) => n,
        Err(()) => {
            return ApiError::InvalidRequest("Stream-Record-Match must be an unsigned integer")
                .response()
        }
    };
    // 3. existence
    let id = match lookup::live(core, key) {
        Ok(id) => id,
        Err(e) => return e.response(),
    };
    // 4. body
    let close_only = req.body.is_empty();
    if close_only && !close {
        return ApiError::EmptyBody("an append needs a body (or Stream-Closed: true)").response();
    }
    let mut body = Payload {
        data: Bytes::new(),
        msg_lens: Vec::new(),
    };
    let mut request_type = None;
    if !close_only {
        let ct = match req.content_type {
            None => return ApiError::MissingContentType.response(),
            Some(Err(_)) => return ApiError::InvalidRequest("invalid Content-Type").response(),
            Some(Ok(ct)) => ct,
        };
        body = match PayloadKind::of(&ct).and_then(|kind| payload(kind, req.body, false)) {
            Ok(p) => p,
            Err(e) => return e.response(),
        };
        request_type = Some(ct);
    }
    // 5. producer
    if let Some(p) = &producer {
        match check_producer(core, id, p) {
            ProducerVerdict::Accept => {}
            ProducerVerdict::Duplicate {
                epoch,
                highest,
                receipt,
            } => {
                return duplicate(core, surface, id, epoch, highest, receipt).await;
            }
            ProducerVerdict::Stale { current } => {
                return ApiError::ProducerEpochStale
                    .response()
                    .header("producer-epoch", current.to_string())
            }
            ProducerVerdict::NewEpochNonZero => return ApiError::ProducerEpochSeq.response(),
            ProducerVerdict::Gap { expected, received } => {
                return ApiError::ProducerSeqGap
                    .response()
                    .header("producer-expected-seq", expected.to_string())
                    .header("producer-received-seq", received.to_string())
            }
        }
    }
    let (tail, closed, stored_type, last_seq, record_next) = {
        let Some(s) = core.shard.head(id) else {
            return ApiError::owner_unavailable().response();
        };
        (
            s.tail(),
            s.closed(),
            s.content_type().to_owned(),
            s.last_stream_seq().cloned(),
            s.message_count(),
        )
    };
    let coords = records::active(surface, &stored_type);
    if record_match.is_some() && !coords {
        return ApiError::InvalidRequest("Stream-Record-Match needs an application/json stream")
            .response();
    }
    // 6. closed
    if closed {
        if close_only && producer.is_none() {
            let mut resp = closed_response(core, id, 204);
            if coords {
                records::push_ack_headers(&mut resp, record_next, record_next);
            }
            return resp;
        }
        return ApiError::StreamClosed
            .response()
            .header("stream-closed", "true")
            .header("stream-next-offset", format_offset(tail.get()));
    }
    // 7. content type
    if let Some(ct) = &request_type {
        if !same_media_type(ct, &stored_type) {
            return ApiError::ContentTypeMismatch("Content-Type differs from the stream's")
                .response()
                .header("stream-next-offset", format_offset(tail.get()));
        }
    }
    // 8. record precondition (ignored on close-only requests)
    if let Some(expected) = record_match.filter(|_| !close_only) {
        if expected != record_next {
            return ApiError::RecordPreconditionFailed
                .response()
                .header("stream-extensions", records::TOKEN)
                .header("stream-record-next", record_next.to_string())
                .header("stream-next-offset", format_offset(tail.get()));
        }
    }
    // 9. Stream-Seq
    if let (Some(seq), Some(last)) = (&stream_seq, &last_seq) {
        if seq[..] <= last[..] {
            return ApiError::StreamSeqConflict
                .response()
                .header("stream-next-offset", format_offset(tail.get()));
        }
    }
    // 10. commit
    let len = body.data.len() as u32;
    let rec = AppendRec {
        close,
        stream_seq,
        producer: producer.as_ref().map(|p| ProducerStamp {
            id: p.id.as_str().into(),
            epoch: p.epoch,
            seq: p.seq,
        }),
        append_lens: if len > 0 { vec![len] } else { vec![] },
        msg_lens: body.msg_lens,
        data: body.data,
        ..Default::default()
    };
    let (receipt, commit) = match core.shard.append(id, rec) {
        Ok(x) => x,
        Err(e) => return Response::from(e),
    };
    if let Err(e) = commit.durable().await {
        return Response::from(e);
    }
    let status = if producer.is_some() && !close_only {
        200
    } else {
        204
    };
    let mut resp = Response::new(status)
        .header("stream-next-offset", format_offset(receipt.next.get()))
        .header("cache-control", "no-store");
    if close {
        resp.push("stream-closed", "true");
    }
    if let Some(p) = &producer {
        resp.push("producer-epoch", p.epoch.to_string());
        resp.push("producer-seq", p.seq.to_string());
    }
    if coords {
        records::push_ack_headers(&mut resp, receipt.record_start, receipt.record_next);
    }
    resp
}

/// A retried producer append (P§7.3): the original outcome, once it is durable.
async fn duplicate(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    epoch: u64,
    highest: u64,
    receipt: Option<Receipt>,
) -> Response {
    if let Some(r) = &receipt {
        // The original may still be in the group commit; never acknowledge before it is.
        loop {
            let (visible, version) = match core.shard.stream(id) {
                Some(s) => (s.next_offset() >= r.next, s.version()),
                None => return ApiError::StreamNotFound.response(),
            };
            if visible {
                break;
            }
            core.shard.changed(id, version).await;
        }
    }
    let (closed, coords) = core.shard.stream(id).map_or((false, false), |s| {
        (s.is_closed(), records::active(surface, s.content_type()))
    });
    let mut resp = Response::new(204)
        .header("producer-epoch", epoch.to_string())
        .header("producer-seq", highest.to_string())
        .header("cache-control", "no-store");
    if let Some(r) = receipt {
        resp.push("stream-next-offset", format_offset(r.next.get()));
        if coords {
            records::push_ack_headers(&mut resp, r.record_start, r.record_next);
        }
    }
    if closed {
        resp.push("stream-closed", "true");
    }
    resp
}
