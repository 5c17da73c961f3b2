//! `POST` of a stream (P§6-§7): one append, with its producer, `Stream-Seq`, close and
//! record-precondition checks, acknowledged once durable.
//!
//! Runs on the owner core: the checks and the shard append have no `.await` between them,
//! so they are atomic with respect to every other request for the stream. That is also
//! what makes a bucket's `auto_create` safe: an append to a missing stream of such a bucket
//! is checked against the empty stream the settings describe and then creates the stream
//! with the append as its first write, one log record, so of several first appends racing
//! the first creates the stream and the others append to it.

use std::rc::Rc;

use bytes::Bytes;
use ursula_protocol::content_type::{is_json, normalize, same_media_type, ContentTypeError};
use ursula_protocol::headers::{
    is_closed_true, parse_producer, parse_stream_seq, ProducerHeaders, StreamSeqTooLong,
};
use ursula_protocol::offset::format_offset;
use ursula_storage::{
    AppendRec, Lifetime, NewStream, Offset, ProducerStamp, Receipt, RecordNo, Shard, StorageError,
    StreamId,
};

use crate::bucket_settings::AutoCreate;
use crate::core::Core;
use crate::handlers::buckets;
use crate::handlers::headers::closed_response;
use crate::http::{ApiError, Handled, Refusal, Request, Response};
use crate::lookup::{find, Found};
use crate::payload::{payload, Payload, PayloadKind};
use crate::records;
use crate::removal;
use crate::surface::{bucket_of, Surface};

/// Outcome of the producer check (P§7.2).
enum ProducerVerdict {
    Accept,
    Duplicate {
        id: StreamId,
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

fn check_producer(shard: &Shard, target: &Target, p: &ProducerHeaders) -> ProducerVerdict {
    let id = match target {
        Target::Live(id) => *id,
        // A stream this append creates knows no producer yet.
        Target::New { .. } => return first_of_producer(p),
    };
    let Some(s) = shard.head(id) else {
        return ProducerVerdict::Accept;
    };
    let Some(state) = s.producer(p.id.as_str()) else {
        return first_of_producer(p);
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
            id,
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

/// A producer the stream has not seen must start at sequence 0.
fn first_of_producer(p: &ProducerHeaders) -> ProducerVerdict {
    if p.seq == 0 {
        ProducerVerdict::Accept
    } else {
        ProducerVerdict::Gap {
            expected: 0,
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

/// The append's header values, checked for syntax (step 2 of the protocol's order).
struct AppendHeaders {
    producer: Option<ProducerHeaders>,
    stream_seq: Option<Bytes>,
    close: bool,
    record_match: Option<RecordNo>,
}

/// The stream's state the append is checked against, read once on the owner.
struct Head {
    tail: Offset,
    closed: bool,
    content_type: String,
    last_seq: Option<Bytes>,
    record_next: RecordNo,
    /// Whether acknowledgements carry record coordinates.
    coords: bool,
}

pub async fn append(core: &Rc<Core>, surface: Surface, key: &str, req: AppendRequest) -> Handled {
    // 2. header syntax
    let headers = AppendHeaders {
        producer: req.producer.map_err(ApiError::InvalidRequest)?,
        stream_seq: req.stream_seq.map_err(|StreamSeqTooLong| {
            ApiError::InvalidRequest("Stream-Seq longer than 1024 bytes")
        })?,
        close: req.close,
        record_match: req.record_match.map_err(|()| {
            ApiError::InvalidRequest("Stream-Record-Match must be an unsigned integer")
        })?,
    };
    // 3. existence, in the shard `key` is placed on: every step from here reads and writes
    // that one.
    let close_only = req.body.is_empty();
    let shard = core.shard_for(key)?;
    let target = target(core, &shard, surface, key, close_only)?;
    // 4. body
    if close_only && !headers.close {
        return Err(ApiError::EmptyBody("an append needs a body (or Stream-Closed: true)").into());
    }
    let (body, request_type) = if close_only {
        (Payload::default(), None)
    } else {
        let ct = match req.content_type {
            None => return Err(ApiError::MissingContentType.into()),
            Some(Err(_)) => return Err(ApiError::InvalidRequest("invalid Content-Type").into()),
            Some(Ok(ct)) => ct,
        };
        let (kind, lines) = PayloadKind::of_append(surface, &ct, || match &target {
            Target::Live(id) => shard.head(*id).map(|s| is_json(s.content_type())),
            Target::New { settings, .. } => Some(is_json(&settings.content_type)),
        })?;
        let body = payload(kind, req.body, false)?;
        // NDJSON lines appended to a JSON stream: its type was matched just now.
        (body, (!lines).then_some(ct))
    };
    // 5. producer
    if let Some(p) = &headers.producer {
        match check_producer(&shard, &target, p) {
            ProducerVerdict::Accept => {}
            ProducerVerdict::Duplicate {
                id,
                epoch,
                highest,
                receipt,
            } => return duplicate(&shard, surface, id, epoch, highest, receipt).await,
            ProducerVerdict::Stale { current } => {
                return Err(
                    ApiError::ProducerEpochStale.header("producer-epoch", current.to_string())
                )
            }
            ProducerVerdict::NewEpochNonZero => return Err(ApiError::ProducerEpochSeq.into()),
            ProducerVerdict::Gap { expected, received } => {
                return Err(ApiError::ProducerSeqGap
                    .header("producer-expected-seq", expected.to_string())
                    .header("producer-received-seq", received.to_string()))
            }
        }
    }
    let head = match &target {
        Target::Live(id) => {
            let s = shard.head(*id).ok_or_else(ApiError::owner_unavailable)?;
            Head {
                tail: s.tail(),
                closed: s.closed(),
                content_type: s.content_type().to_owned(),
                last_seq: s.last_stream_seq().cloned(),
                record_next: s.message_count(),
                coords: records::active(surface, s.content_type()),
            }
        }
        // The stream this append would create, as empty as a created stream starts.
        Target::New { settings, .. } => Head {
            tail: Offset::ZERO,
            closed: false,
            content_type: settings.content_type.clone(),
            last_seq: None,
            record_next: RecordNo::ZERO,
            coords: records::active(surface, &settings.content_type),
        },
    };
    if headers.record_match.is_some() && !head.coords {
        return Err(ApiError::InvalidRequest(
            "Stream-Record-Match needs an application/json stream",
        )
        .into());
    }
    // 6. closed: a close-only request without a producer is answered as if it closed it
    if let (Target::Live(id), true) = (
        &target,
        head.closed && close_only && headers.producer.is_none(),
    ) {
        let mut resp = closed_response(&shard, *id, 204);
        if head.coords {
            records::push_ack_headers(&mut resp, head.record_next, head.record_next);
        }
        return Ok(resp);
    }
    check_against_head(&head, &headers, request_type.as_deref(), close_only)?;
    // The bucket's rate limit comes last, so a refused append spends none of it.
    if surface == Surface::Bucketed {
        buckets::throttle(core, &shard, key, 1, body.data.len() as u64)?;
    }
    // 10. commit
    let append = Append {
        target,
        headers,
        body,
        close_only,
        coords: head.coords,
    };
    commit(core, &shard, key, append).await
}

/// The stream an append goes to.
pub(super) enum Target {
    Live(StreamId),
    /// None yet: the bucket's `auto_create` settings create it with this append, after
    /// removing the expired stream that still holds its key, if any.
    New {
        settings: AutoCreate,
        expired: Option<StreamId>,
    },
}

/// Step 3: the stream `key` names, or the one its bucket would create, or the 404. `shard`
/// is the one `key` is placed on.
pub(super) fn target(
    core: &Rc<Core>,
    shard: &Shard,
    surface: Surface,
    key: &str,
    close_only: bool,
) -> Result<Target, ApiError> {
    let expired = match find(core, key)? {
        Found::Live(id) => return Ok(Target::Live(id)),
        Found::SoftDeleted => return Err(ApiError::StreamGone),
        Found::Absent => None,
        Found::Expired(id) => Some(id),
    };
    // A close alone creates nothing: a stream closed before its first write holds nothing
    // a shipper would want.
    let bucket = bucket_of(key).filter(|_| surface == Surface::Bucketed && !close_only);
    match bucket.and_then(|b| buckets::settings(shard, b).auto_create) {
        Some(settings) => Ok(Target::New { settings, expired }),
        None => Err(ApiError::StreamNotFound),
    }
}

/// Steps 6-9 of the protocol's order: the stream is open, the content type is the
/// stream's, the record precondition holds, and `Stream-Seq` increases.
fn check_against_head(
    head: &Head,
    headers: &AppendHeaders,
    request_type: Option<&str>,
    close_only: bool,
) -> Result<(), Refusal> {
    // Formatted only for a refusal: an accepted append, the usual case, never needs it.
    let tail = || format_offset(head.tail.get());
    if head.closed {
        return Err(ApiError::StreamClosed
            .header("stream-closed", "true")
            .header("stream-next-offset", tail()));
    }
    if let Some(ct) = request_type {
        if !same_media_type(ct, &head.content_type) {
            return Err(
                ApiError::ContentTypeMismatch("Content-Type differs from the stream's")
                    .header("stream-next-offset", tail()),
            );
        }
    }
    // The record precondition is ignored on close-only requests.
    if let Some(expected) = headers.record_match.filter(|_| !close_only) {
        if expected != head.record_next {
            return Err(ApiError::RecordPreconditionFailed
                .header("stream-extensions", records::EXTENSIONS)
                .header("stream-record-next", head.record_next.to_string())
                .header("stream-next-offset", tail()));
        }
    }
    if let (Some(seq), Some(last)) = (&headers.stream_seq, &head.last_seq) {
        if seq[..] <= last[..] {
            return Err(ApiError::StreamSeqConflict.header("stream-next-offset", tail()));
        }
    }
    Ok(())
}

/// An append that passed every check, ready to commit.
struct Append {
    target: Target,
    headers: AppendHeaders,
    body: Payload,
    close_only: bool,
    /// Whether the acknowledgement carries record coordinates.
    coords: bool,
}

/// Append to `shard`, the one `key` is placed on (creating the stream first if the bucket
/// creates it), and answer once the append is durable.
async fn commit(core: &Rc<Core>, shard: &Shard, key: &str, append: Append) -> Handled {
    let Append {
        target,
        headers,
        body,
        close_only,
        coords,
    } = append;
    let AppendHeaders {
        producer,
        stream_seq,
        close,
        ..
    } = headers;
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
    let (receipt, commit) = match target {
        Target::Live(id) => shard.append(id, rec)?,
        Target::New { settings, expired } => {
            let (_, receipt, commit) = create(core, shard, key, &settings, expired, rec)?;
            (receipt, commit)
        }
    };
    commit.durable().await?;
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
    Ok(resp)
}

/// Create the stream `key` in `shard` (the one it is placed on) as `settings` say, with
/// `first` as its first write: one log record, so the stream never exists without it. Also
/// what an append-batch to a missing stream does with its first frame.
pub(super) fn create(
    core: &Rc<Core>,
    shard: &Shard,
    key: &str,
    settings: &AutoCreate,
    expired: Option<StreamId>,
    first: AppendRec,
) -> Result<(StreamId, Receipt, ursula_storage::Commit), StorageError> {
    if let Some(id) = expired {
        removal::remove_expired(core, id);
    }
    let lifetime = settings
        .ttl_seconds
        .map_or(Lifetime::Forever, Lifetime::TtlSeconds);
    let spec = NewStream {
        meta: core.new_stream_meta(shard, key, &settings.content_type, lifetime, Bytes::new()),
        initial: first,
    };
    let (id, commit) = shard.create(spec)?;
    let s = shard
        .head(id)
        .ok_or(StorageError::Internal("a stream just created has no head"))?;
    let receipt = Receipt {
        seq: 0,
        start: Offset::ZERO,
        next: s.tail(),
        record_start: RecordNo::ZERO,
        record_next: s.message_count(),
    };
    Ok((id, receipt, commit))
}

/// A retried producer append (P§7.3): the original outcome, once it is durable.
async fn duplicate(
    shard: &Shard,
    surface: Surface,
    id: StreamId,
    epoch: u64,
    highest: u64,
    receipt: Option<Receipt>,
) -> Handled {
    if let Some(r) = &receipt {
        // The original may still be in the group commit; never acknowledge before it is.
        loop {
            let (visible, version) = match shard.stream(id) {
                Some(s) => (s.next_offset() >= r.next, s.version()),
                None => return Err(ApiError::StreamNotFound.into()),
            };
            if visible {
                break;
            }
            // A stopped shard (its lane moved away) never shows it: a wait would end at
            // once, for ever.
            if shard.stopped() {
                return Err(StorageError::Stopped.into());
            }
            shard.changed(id, version).await;
        }
    }
    let (closed, coords) = shard.stream(id).map_or((false, false), |s| {
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
    Ok(resp)
}
