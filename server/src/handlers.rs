//! The base protocol on the core that owns the stream (protocol.md §5–§12, §15–§18).
//!
//! Every function here runs on the owner core, so a check followed by a shard mutation with
//! no `.await` in between is atomic with respect to every other request for the stream.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use ursula_protocol::content_type::{is_json, normalize, same_media_type};
use ursula_protocol::headers::{
    format_rfc3339_millis, is_closed_true, parse_expires_at, parse_producer, parse_stream_seq,
    parse_ttl, ProducerHeaders,
};
use ursula_protocol::http1::Method;
use ursula_protocol::offset::{format_offset, parse_offset, OffsetParam};
use ursula_protocol::query::{
    parse_live, parse_max_bytes, parse_query, parse_timeout_ms, Live, Query, MAX_READ_BYTES,
};
use ursula_storage::{
    AppendRec, Lifetime, NewStream, ProducerStamp, Receipt, StorageError, StreamId,
};

use crate::cores::Core;
use crate::ext::Ext;
use crate::http::{Request, Response};
use crate::records;
use crate::routes::{route, Route, Surface};

const JSON: &str = "application/json";

/// Entry point for every request, on the core that accepted the connection. Also returns
/// the core that owns the addressed stream when the request was handed to one owner (the
/// connection uses it to follow its stream, see `conn`).
pub async fn dispatch(core: &Rc<Core>, req: Request) -> (Response, Option<usize>) {
    if req.method == Method::Options {
        return (preflight(), None);
    }
    if req
        .header("content-encoding")
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"))
    {
        let resp = Response::error(
            415,
            "unsupported_encoding",
            "request bodies must not be compressed",
        );
        return (resp, None);
    }
    let resp = match route(&req.path) {
        Route::Stream { surface, key } => {
            let owner = core.owner_of(&key);
            let resp = core
                .on(owner, move |c| async move {
                    stream_request(&c, surface, key, req).await
                })
                .await
                .unwrap_or_else(|_| unavailable());
            return (resp, Some(owner));
        }
        Route::Bucket(b) | Route::BucketStreams(b) => crate::buckets::handle(core, b, req).await,
        Route::AppendBatch(key) => crate::batch::dispatch(core, key, req).await,
        Route::Attrs(key) => crate::attrs::dispatch(core, key, req).await,
        Route::Resource { key, resource } => {
            let owner = core.owner_of(&key);
            let resp = core
                .on(owner, move |c| async move {
                    crate::snapshots::handle(&c, &key, resource, req).await
                })
                .await
                .unwrap_or_else(|_| unavailable());
            return (resp, Some(owner));
        }
        Route::StreamResource => Response::error(404, "not_found", "no such resource"),
        Route::NotFound => Response::error(404, "not_found", "no such resource"),
        Route::Invalid(why) => Response::error(400, "invalid_stream_id", why),
        Route::InvalidBucket => Response::error(
            400,
            "invalid_bucket_id",
            "bucket IDs are 4-64 characters of a-z, 0-9, _ and -",
        ),
    };
    (resp, None)
}

fn preflight() -> Response {
    Response::new(204)
        .header("access-control-allow-methods", "GET, HEAD, POST, PUT, DELETE, OPTIONS")
        .header("access-control-allow-headers", "*, if-none-match, content-type, authorization, stream-seq, stream-ttl, stream-expires-at, stream-closed, stream-attrs, stream-record-match, stream-snapshot-match, stream-forked-from, stream-fork-offset, stream-fork-sub-offset, producer-id, producer-epoch, producer-seq, prefer")
        .header("access-control-max-age", "86400")
        .header("cache-control", "no-store")
}

pub fn unavailable() -> Response {
    Response::error(503, "unavailable", "owner core unavailable").header("retry-after", "1")
}

async fn stream_request(core: &Rc<Core>, surface: Surface, key: String, req: Request) -> Response {
    if surface == Surface::Bucketed {
        if let Some(resp) = crate::buckets::require_bucket(core, &key).await {
            return resp;
        }
    }
    // Reads (long-poll, SSE) and creates hold large futures; boxed, they no longer size
    // the future of every append, which is moved several times per request.
    match req.method {
        Method::Put => Box::pin(create(core, surface, &key, &req)).await,
        Method::Post => append(core, surface, &key, req).await,
        Method::Get => Box::pin(read(core, surface, &key, &req)).await,
        Method::Head => head(core, surface, &key),
        Method::Delete => Box::pin(delete(core, &key)).await,
        _ => Response::error(405, "method_not_allowed", "method not allowed")
            .header("allow", "GET, HEAD, POST, PUT, DELETE, OPTIONS"),
    }
}

/// What a key currently refers to, after applying expiry.
pub enum Found {
    Absent,
    SoftDeleted,
    Live(StreamId),
}

pub fn find(core: &Rc<Core>, key: &str) -> Found {
    let now = ursula_storage::now_ms();
    let Some(id) = core.shard.lookup(key) else {
        return Found::Absent;
    };
    let (expired, soft_deleted) = {
        let Some(s) = core.shard.stream(id) else {
            return Found::Absent;
        };
        let expired = match s.lifetime {
            Lifetime::Forever => false,
            Lifetime::TtlSeconds(t) => {
                now >= s
                    .last_access_ms
                    .get()
                    .saturating_add((t as i64).saturating_mul(1000))
            }
            Lifetime::ExpiresAtMs(at) => now >= at,
        };
        (expired, Ext::is_soft_deleted(&s.ext))
    };
    if expired {
        // Expired streams are gone (P§15); forks hold their own copy of inherited data.
        crate::fork::remove_stream(core, id);
        return Found::Absent;
    }
    if soft_deleted {
        return Found::SoftDeleted;
    }
    Found::Live(id)
}

fn bad(why: &str) -> Response {
    Response::error(400, "invalid_request", why)
}

pub fn storage_error(e: StorageError) -> Response {
    match e {
        StorageError::NoSpace => Response::error(507, "insufficient_storage", "disk full"),
        StorageError::TooLarge => Response::error(413, "payload_too_large", "too large"),
        StorageError::Busy => {
            Response::error(503, "unavailable", "write queue full; retry shortly")
                .header("retry-after", "1")
        }
        other => Response::error(503, "unavailable", &other.to_string()).header("retry-after", "1"),
    }
}

/// The lifetime headers of a create request.
fn parse_lifetime(req: &Request) -> Result<Option<Lifetime>, Response> {
    let ttl = req.header("stream-ttl");
    let expires = req.header("stream-expires-at");
    match (ttl, expires) {
        (Some(_), Some(_)) => Err(bad("Stream-TTL and Stream-Expires-At are exclusive")),
        (Some(t), None) => parse_ttl(t)
            .map(|t| Some(Lifetime::TtlSeconds(t)))
            .map_err(|()| bad("invalid Stream-TTL")),
        (None, Some(e)) => parse_expires_at(e)
            .map(|e| Some(Lifetime::ExpiresAtMs(e)))
            .map_err(|()| bad("invalid Stream-Expires-At")),
        (None, None) => Ok(None),
    }
}

fn push_lifetime(resp: &mut Response, lifetime: Lifetime) {
    match lifetime {
        Lifetime::Forever => {}
        Lifetime::TtlSeconds(t) => resp.push("stream-ttl", t.to_string()),
        Lifetime::ExpiresAtMs(ms) => resp.push("stream-expires-at", format_rfc3339_millis(ms)),
    }
}

/// Headers describing a stream after create (P§5.3).
fn created_headers(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    status: u16,
    location: Option<String>,
) -> Response {
    let Some(s) = core.shard.stream(id) else {
        return Response::error(404, "stream_not_found", "stream not found");
    };
    let mut resp = Response::new(status)
        .header("content-type", s.content_type.to_string())
        .header("stream-next-offset", format_offset(s.visible_tail))
        .header("stream-incarnation", s.incarnation.to_string())
        .header("cache-control", "no-store");
    if s.visible_closed {
        resp.push("stream-closed", "true");
    }
    push_lifetime(&mut resp, s.lifetime);
    if records::active(surface, &s.content_type) {
        // A create reports the records of its initial body; an idempotent 200 creates none.
        let next = records::visible_next(&s);
        let start = if status == 201 { 0 } else { next };
        records::push_ack_headers(&mut resp, start, next);
    }
    if let Some(loc) = location {
        resp.push("location", loc);
    }
    resp
}

/// Body of a write as stored: canonical NDJSON for JSON streams, raw bytes otherwise.
pub struct Payload {
    pub data: Bytes,
    pub msg_lens: Vec<u32>,
}

pub fn payload(json: bool, body: Bytes, allow_empty_array: bool) -> Result<Payload, Response> {
    if body.is_empty() {
        return Ok(Payload {
            data: Bytes::new(),
            msg_lens: Vec::new(),
        });
    }
    if !json {
        let len = body.len() as u32;
        return Ok(Payload {
            data: body,
            msg_lens: vec![len],
        });
    }
    // A body no one else holds (a request's own, not a frame of an append batch) that is
    // a compact array becomes its own canonical form, saving a copy of every byte: the
    // usual shape of a large telemetry batch.
    let body = match body.try_into_mut() {
        Ok(mut owned) => {
            match ursula_protocol::json::canonicalize_in_place(&mut owned, allow_empty_array) {
                Ok(Some(c)) => {
                    return Ok(Payload {
                        data: owned.freeze().slice(c.range),
                        msg_lens: c.message_lens,
                    })
                }
                Ok(None) => owned.freeze(),
                Err(e) => return Err(json_error(e)),
            }
        }
        Err(shared) => shared,
    };
    match ursula_protocol::json::canonicalize(&body, allow_empty_array) {
        Ok(c) => Ok(Payload {
            data: Bytes::from(c.bytes),
            msg_lens: c.message_lens,
        }),
        Err(e) => Err(json_error(e)),
    }
}

fn json_error(e: ursula_protocol::json::JsonError) -> Response {
    match e {
        ursula_protocol::json::JsonError::EmptyArray => {
            Response::error(400, "empty_json_array", "an append of [] adds nothing")
        }
        ursula_protocol::json::JsonError::Invalid => {
            Response::error(400, "invalid_json", "body is not a single JSON text")
        }
    }
}

fn location(req: &Request) -> Option<String> {
    req.header("host")
        .map(|h| format!("http://{h}{}", req.path))
}

async fn create(core: &Rc<Core>, surface: Surface, key: &str, req: &Request) -> Response {
    let content_type = match req.header("content-type") {
        Some(v) => match normalize(v) {
            Ok(ct) => Some(ct),
            Err(()) => return bad("invalid Content-Type"),
        },
        None => None,
    };
    let lifetime = match parse_lifetime(req) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let closed = is_closed_true(req.header("stream-closed"));
    let fork = match crate::fork::parse_request(req) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let attrs = match crate::attrs::from_create(surface, req) {
        Ok(a) => a,
        Err(r) => return r,
    };
    if fork.is_some() && surface == Surface::Bucketed {
        return Response::error(
            501,
            "not_implemented",
            "forks are served on /v1/stream only",
        );
    }
    match find(core, key) {
        Found::SoftDeleted => {
            return Response::error(409, "stream_exists", "stream is deleted but still forked")
        }
        Found::Live(id) => {
            let matches = {
                let Some(s) = core.shard.stream(id) else {
                    return unavailable();
                };
                let ext = Ext::decode(&s.ext);
                let type_ok = match (&content_type, &fork) {
                    (Some(ct), _) => same_media_type(ct, &s.content_type),
                    (None, Some(_)) => true,
                    (None, None) => same_media_type("application/octet-stream", &s.content_type),
                };
                let lifetime_ok = match (lifetime, &fork) {
                    (None, Some(_)) => true,
                    (l, _) => l.unwrap_or_default() == s.lifetime,
                };
                type_ok
                    && lifetime_ok
                    && closed == s.closed
                    && crate::fork::same_link(fork.as_ref(), ext.fork.as_ref())
                    && ext.attrs == attrs
            };
            if !matches {
                return Response::error(
                    409,
                    "stream_exists",
                    "stream exists with a different configuration",
                );
            }
            core.shard.touch(id, ursula_storage::now_ms());
            return created_headers(core, surface, id, 200, None);
        }
        Found::Absent => {}
    }
    if let Some(fork) = fork {
        return crate::fork::create(core, key, req, fork, content_type, lifetime, closed).await;
    }
    let content_type = content_type.unwrap_or_else(|| "application/octet-stream".into());
    let body = match payload(is_json(&content_type), req.body.clone(), true) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let now = ursula_storage::now_ms();
    let spec = NewStream {
        key: key.into(),
        incarnation: core.shard.next_incarnation(now),
        created_ms: now,
        content_type: content_type.into(),
        lifetime: lifetime.unwrap_or_default(),
        ext: Ext {
            attrs,
            ..Default::default()
        }
        .encode(),
        initial: AppendRec {
            append_lens: if body.data.is_empty() {
                vec![]
            } else {
                vec![body.data.len() as u32]
            },
            msg_lens: body.msg_lens,
            data: body.data,
            close: closed,
            ..Default::default()
        },
    };
    let (id, commit) = match core.shard.create(spec) {
        Ok(x) => x,
        Err(e) => return storage_error(e),
    };
    if let Err(e) = commit.durable().await {
        return storage_error(e);
    }
    created_headers(core, surface, id, 201, location(req))
}

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
    let Some(s) = core.shard.stream(id) else {
        return ProducerVerdict::Accept;
    };
    let Some(state) = s.producers.get(p.id.as_str()) else {
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

async fn append(core: &Rc<Core>, surface: Surface, key: &str, mut req: Request) -> Response {
    // 2. header syntax
    let producer = match parse_producer(
        req.header("producer-id"),
        req.header("producer-epoch"),
        req.header("producer-seq"),
    ) {
        Ok(p) => p,
        Err(why) => return bad(why),
    };
    let stream_seq = match parse_stream_seq(req.header("stream-seq")) {
        Ok(s) => s.map(|s| Bytes::copy_from_slice(s.as_bytes())),
        Err(()) => return bad("Stream-Seq longer than 1024 bytes"),
    };
    let close = is_closed_true(req.header("stream-closed"));
    let record_match = match (surface, req.header("stream-record-match")) {
        (Surface::Bucketed, Some(v)) => match ursula_protocol::records::parse_record_match(v) {
            Some(n) => Some(n),
            None => return bad("Stream-Record-Match must be an unsigned integer"),
        },
        _ => None,
    };
    // 3. existence
    let id = match find(core, key) {
        Found::Absent => return Response::error(404, "stream_not_found", "stream not found"),
        Found::SoftDeleted => return Response::error(410, "stream_gone", "stream was deleted"),
        Found::Live(id) => id,
    };
    // 4. body
    let close_only = req.body.is_empty();
    if close_only && !close {
        return Response::error(
            400,
            "empty_body",
            "an append needs a body (or Stream-Closed: true)",
        );
    }
    let mut body = Payload {
        data: Bytes::new(),
        msg_lens: Vec::new(),
    };
    let mut request_type = None;
    if !close_only {
        let Some(ct) = req.header("content-type") else {
            return Response::error(400, "missing_content_type", "Content-Type is required");
        };
        let Ok(ct) = normalize(ct) else {
            return bad("invalid Content-Type");
        };
        body = match payload(is_json(&ct), std::mem::take(&mut req.body), false) {
            Ok(p) => p,
            Err(r) => return r,
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
                return Response::error(403, "producer_epoch_stale", "stale producer epoch")
                    .header("producer-epoch", current.to_string())
            }
            ProducerVerdict::NewEpochNonZero => {
                return Response::error(
                    400,
                    "producer_epoch_seq",
                    "a new epoch must start at seq 0",
                )
            }
            ProducerVerdict::Gap { expected, received } => {
                return Response::error(409, "producer_seq_gap", "producer sequence gap")
                    .header("producer-expected-seq", expected.to_string())
                    .header("producer-received-seq", received.to_string())
            }
        }
    }
    let (tail, closed, stored_type, last_seq, record_next) = {
        let Some(s) = core.shard.stream(id) else {
            return unavailable();
        };
        (
            s.tail,
            s.closed,
            s.content_type.clone(),
            s.last_stream_seq.clone(),
            s.message_count(),
        )
    };
    let coords = records::active(surface, &stored_type);
    if record_match.is_some() && !coords {
        return bad("Stream-Record-Match needs an application/json stream");
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
        return Response::error(409, "stream_closed", "stream is closed")
            .header("stream-closed", "true")
            .header("stream-next-offset", format_offset(tail));
    }
    // 7. content type
    if let Some(ct) = &request_type {
        if !same_media_type(ct, &stored_type) {
            return Response::error(
                409,
                "content_type_mismatch",
                "Content-Type differs from the stream's",
            )
            .header("stream-next-offset", format_offset(tail));
        }
    }
    // 8. record precondition (ignored on close-only requests)
    if let Some(expected) = record_match.filter(|_| !close_only) {
        if expected != record_next {
            return Response::error(412, "record_precondition_failed", "record tail has moved")
                .header("stream-extensions", records::TOKEN)
                .header("stream-record-next", record_next.to_string())
                .header("stream-next-offset", format_offset(tail));
        }
    }
    // 9. Stream-Seq
    if let (Some(seq), Some(last)) = (&stream_seq, &last_seq) {
        if seq[..] <= last[..] {
            return Response::error(409, "stream_seq_conflict", "Stream-Seq must increase")
                .header("stream-next-offset", format_offset(tail));
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
        Err(e) => return storage_error(e),
    };
    if let Err(e) = commit.durable().await {
        return storage_error(e);
    }
    let status = if producer.is_some() && !close_only {
        200
    } else {
        204
    };
    let mut resp = Response::new(status)
        .header("stream-next-offset", format_offset(receipt.next))
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

fn closed_response(core: &Rc<Core>, id: StreamId, status: u16) -> Response {
    let tail = core.shard.stream(id).map_or(0, |s| s.visible_tail);
    Response::new(status)
        .header("stream-closed", "true")
        .header("stream-next-offset", format_offset(tail))
        .header("cache-control", "no-store")
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
                Some(s) => (s.visible_tail >= r.next, s.version()),
                None => return Response::error(404, "stream_not_found", "stream not found"),
            };
            if visible {
                break;
            }
            core.shard.changed(id, version).await;
        }
    }
    let (closed, coords) = core.shard.stream(id).map_or((false, false), |s| {
        (s.closed, records::active(surface, &s.content_type))
    });
    let mut resp = Response::new(204)
        .header("producer-epoch", epoch.to_string())
        .header("producer-seq", highest.to_string())
        .header("cache-control", "no-store");
    if let Some(r) = receipt {
        resp.push("stream-next-offset", format_offset(r.next));
        if coords {
            records::push_ack_headers(&mut resp, r.record_start, r.record_next);
        }
    }
    if closed {
        resp.push("stream-closed", "true");
    }
    resp
}

fn head(core: &Rc<Core>, surface: Surface, key: &str) -> Response {
    let id = match find(core, key) {
        Found::Absent => return Response::error(404, "stream_not_found", "stream not found"),
        Found::SoftDeleted => return Response::error(410, "stream_gone", "stream was deleted"),
        Found::Live(id) => id,
    };
    let Some(s) = core.shard.stream(id) else {
        return unavailable();
    };
    let mut resp = Response::new(200)
        .header("content-type", s.content_type.to_string())
        .header("stream-next-offset", format_offset(s.visible_tail))
        .header("stream-retained-offset", format_offset(s.retained_start))
        .header("stream-incarnation", s.incarnation.to_string())
        .header("cache-control", "no-store");
    if s.visible_closed {
        resp.push("stream-closed", "true");
    }
    push_lifetime(&mut resp, s.lifetime);
    if let Some(snap) = &s.snapshot {
        resp.push("stream-snapshot-offset", format_offset(snap.offset));
        resp.push("stream-snapshot-digest", snap.digest.to_string());
    }
    if records::active(surface, &s.content_type) {
        records::push_stream_headers(&mut resp, &s);
    }
    resp
}

async fn delete(core: &Rc<Core>, key: &str) -> Response {
    let id = match find(core, key) {
        Found::Absent => return Response::error(404, "stream_not_found", "stream not found"),
        Found::SoftDeleted => return Response::error(410, "stream_gone", "stream was deleted"),
        Found::Live(id) => id,
    };
    match crate::fork::delete(core, id).await {
        Ok(()) => Response::new(204).header("cache-control", "no-store"),
        Err(e) => storage_error(e),
    }
}

/// Parsed read parameters (P§4.6).
struct ReadParams {
    offset: Option<OffsetParam>,
    live: Option<Live>,
    cursor: Option<String>,
    max_bytes: usize,
    timeout: Option<Duration>,
}

fn read_params(
    query: &Query,
    default_timeout: Duration,
    record_start: bool,
) -> Result<ReadParams, Response> {
    let one = |k: &str| query.get_unique(k).map_err(bad);
    let offset = match one("offset")? {
        Some(v) => Some(parse_offset(v).map_err(|()| {
            Response::error(
                400,
                "invalid_offset",
                "offset must be -1, now or 1-20 digits",
            )
        })?),
        None => None,
    };
    let live = match one("live")? {
        Some(v) => Some(parse_live(v).map_err(bad)?),
        None => None,
    };
    let cursor = one("cursor")?.map(str::to_string);
    let max_bytes = match one("max_bytes")? {
        Some(v) => parse_max_bytes(v).map_err(bad)? as usize,
        None => MAX_READ_BYTES as usize,
    };
    let timeout = one("timeout_ms")?
        .and_then(parse_timeout_ms)
        .map(Duration::from_millis)
        .or(Some(default_timeout));
    if live.is_some() && offset.is_none() && !record_start {
        return Err(Response::error(
            400,
            "invalid_offset",
            "live reads need an offset",
        ));
    }
    Ok(ReadParams {
        offset,
        live,
        cursor,
        max_bytes,
        timeout,
    })
}

/// A resolved start position, or the error response for it (P§3.3).
fn resolve_start(
    core: &Rc<Core>,
    id: StreamId,
    surface: Surface,
    offset: OffsetParam,
) -> Result<u64, Response> {
    let Some(s) = core.shard.stream(id) else {
        return Err(Response::error(404, "stream_not_found", "stream not found"));
    };
    let start = match offset {
        OffsetParam::Start => 0,
        OffsetParam::Now => s.visible_tail,
        OffsetParam::At(p) => p,
    };
    // P§3.3: `-1` means byte 0, so after retention it is trimmed like any earlier offset.
    if start < s.retained_start {
        let mut resp = Response::error(410, "offset_trimmed", "offset was removed by retention")
            .header("stream-next-offset", format_offset(s.retained_start));
        if records::active(surface, &s.content_type) {
            records::push_stream_headers(&mut resp, &s);
        }
        return Err(resp);
    }
    if start > s.visible_tail {
        return Err(
            Response::error(400, "offset_beyond_tail", "offset is beyond the tail")
                .header("stream-next-offset", format_offset(s.visible_tail)),
        );
    }
    if surface == Surface::Compat && is_json(&s.content_type) && !s.is_message_boundary(start) {
        return Err(Response::error(
            400,
            "offset_not_aligned",
            "offset is inside a JSON message",
        ));
    }
    Ok(start)
}

pub fn cursor(core: &Core, client: Option<&str>) -> String {
    let r = 1 + core.random() % 3600;
    ursula_protocol::cursor::next_cursor(ursula_storage::now_ms(), client, r).to_string()
}

async fn read(core: &Rc<Core>, surface: Surface, key: &str, req: &Request) -> Response {
    let query = match parse_query(&req.query) {
        Ok(q) => q,
        Err(why) => return bad(why),
    };
    // Record-aware parameters exist only on the bucketed surface (compat ignores them).
    let record_params = match surface {
        Surface::Bucketed => match records::parse(&query, true) {
            Ok(r) => r,
            Err(resp) => return resp,
        },
        Surface::Compat => None,
    };
    let params = match read_params(
        &query,
        core.config.long_poll_timeout,
        record_params.is_some(),
    ) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let id = match find(core, key) {
        Found::Absent => return Response::error(404, "stream_not_found", "stream not found"),
        Found::SoftDeleted => return Response::error(410, "stream_gone", "stream was deleted"),
        Found::Live(id) => id,
    };
    if let Some(rp) = record_params {
        let json = core
            .shard
            .stream(id)
            .is_some_and(|s| is_json(&s.content_type));
        if !json {
            return Response::error(
                400,
                "invalid_request",
                "record coordinates are only available on application/json streams",
            );
        }
        return record_read(core, id, rp, &params, req).await;
    }
    let offset = params.offset.unwrap_or(OffsetParam::Start);
    let start = match resolve_start(core, id, surface, offset) {
        Ok(s) => s,
        Err(r) => return r,
    };
    core.shard.touch(id, ursula_storage::now_ms());
    match params.live {
        Some(Live::Sse) => {
            crate::sse::start(core, surface, id, start, params.cursor, params.max_bytes)
        }
        Some(Live::LongPoll) => long_poll(core, surface, id, start, &params, req).await,
        None if offset == OffsetParam::Now => now_response(core, surface, id),
        None => catch_up(core, surface, id, start, params.max_bytes, req, None).await,
    }
}

/// `offset=now` catch-up (P§11.5).
fn now_response(core: &Rc<Core>, surface: Surface, id: StreamId) -> Response {
    let Some(s) = core.shard.stream(id) else {
        return Response::error(404, "stream_not_found", "stream not found");
    };
    let json = is_json(&s.content_type);
    let mut resp = Response::new(200)
        .header("content-type", read_content_type(surface, &s.content_type))
        .header("stream-next-offset", format_offset(s.visible_tail))
        .header("stream-up-to-date", "true")
        .header("cache-control", "no-store");
    if s.visible_closed {
        resp.push("stream-closed", "true");
    }
    if json && surface == Surface::Compat {
        resp = resp.with_body(vec![Bytes::from_static(b"[]")]);
    }
    if records::active(surface, &s.content_type) {
        records::push_stream_headers(&mut resp, &s);
    }
    resp
}

pub fn read_content_type(surface: Surface, stored: &str) -> String {
    if surface == Surface::Bucketed && is_json(stored) {
        "application/x-ndjson".into()
    } else if is_json(stored) {
        JSON.into()
    } else {
        stored.to_string()
    }
}

/// The data of a read starting at `start`: (body parts, next offset).
pub async fn collect(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    start: u64,
    max: usize,
) -> Result<(Vec<Bytes>, u64), Response> {
    let (end, json_array) = {
        let Some(s) = core.shard.stream(id) else {
            return Ok((Vec::new(), start));
        };
        if surface == Surface::Compat && is_json(&s.content_type) {
            // Whole messages only; at least one even if it alone exceeds the limit.
            let first = s.message_at_or_after(start);
            let visible = s.visible_message_count();
            let mut end_msg = first;
            while end_msg < visible {
                let next_end = s.message_start(end_msg + 1).unwrap_or(s.visible_tail);
                if end_msg > first && (next_end - start) as usize > max {
                    break;
                }
                end_msg += 1;
                if (next_end - start) as usize >= max {
                    break;
                }
            }
            let end = s.message_start(end_msg).unwrap_or(s.visible_tail);
            (end.min(s.visible_tail), true)
        } else {
            (s.visible_tail.min(start.saturating_add(max as u64)), false)
        }
    };
    let parts = core
        .shard
        .read(id, start, end)
        .await
        .map_err(storage_error)?;
    if json_array {
        let slices: Vec<&[u8]> = parts.iter().map(|b| &b[..]).collect();
        let body = ursula_protocol::json::render_array(&slices);
        return Ok((vec![Bytes::from(body)], end));
    }
    let end = start + parts.iter().map(|b| b.len() as u64).sum::<u64>();
    Ok((parts, end))
}

async fn catch_up(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    start: u64,
    max: usize,
    req: &Request,
    cursor: Option<String>,
) -> Response {
    let (parts, end) = match collect(core, surface, id, start, max).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(s) = core.shard.stream(id) else {
        return Response::error(404, "stream_not_found", "stream not found");
    };
    let up_to_date = end == s.visible_tail;
    let closed = up_to_date && s.visible_closed;
    let etag = format!(
        "\"{}:{}:{}{}\"",
        s.incarnation,
        start,
        end,
        if closed { ":c" } else { "" }
    );
    let mut resp = Response::new(200)
        .header("content-type", read_content_type(surface, &s.content_type))
        .header("stream-next-offset", format_offset(end))
        .header("cache-control", "no-store");
    if up_to_date {
        resp.push("stream-up-to-date", "true");
    }
    if closed {
        resp.push("stream-closed", "true");
    }
    if let Some(c) = cursor {
        resp.push("stream-cursor", c);
    }
    if records::active(surface, &s.content_type) {
        records::push_stream_headers(&mut resp, &s);
    }
    finish_read(resp, etag, req, || parts)
}

/// The end of every catch-up/long-poll 200: the ETag, and `304` instead of the body when
/// `If-None-Match` matches it (P§16.2). `body` is only built when it is sent.
fn finish_read(
    mut resp: Response,
    etag: String,
    req: &Request,
    body: impl FnOnce() -> Vec<Bytes>,
) -> Response {
    let not_modified = req
        .header("if-none-match")
        .is_some_and(|inm| ursula_protocol::etag::if_none_match_matches(inm, &etag));
    resp.push("etag", etag);
    if not_modified {
        resp.status = 304;
        return resp;
    }
    resp.with_body(body())
}

async fn long_poll(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    start: u64,
    params: &ReadParams,
    req: &Request,
) -> Response {
    let deadline =
        std::time::Instant::now() + params.timeout.unwrap_or(core.config.long_poll_timeout);
    loop {
        let (has_data, closed, version) = match core.shard.stream(id) {
            Some(s) => (s.visible_tail > start, s.visible_closed, s.version()),
            None => return Response::error(404, "stream_not_found", "stream not found"),
        };
        if has_data {
            let c = cursor(core, params.cursor.as_deref());
            return catch_up(core, surface, id, start, params.max_bytes, req, Some(c)).await;
        }
        if closed {
            let resp = closed_response(core, id, 204).header("stream-up-to-date", "true");
            return with_stream_records(core, surface, id, resp);
        }
        let now = std::time::Instant::now();
        if now >= deadline || core.shutting_down() {
            let tail = core.shard.stream(id).map_or(start, |s| s.visible_tail);
            let resp = Response::new(204)
                .header("stream-next-offset", format_offset(tail))
                .header("stream-up-to-date", "true")
                .header("stream-cursor", cursor(core, params.cursor.as_deref()))
                .header("cache-control", "no-store");
            return with_stream_records(core, surface, id, resp);
        }
        let wait = (deadline - now).min(Duration::from_millis(500));
        core.wait_or_shutdown(core.shard.changed(id, version), wait)
            .await;
        core.shard.touch(id, ursula_storage::now_ms());
    }
}

/// Add the stream-level record headers to a response about a bucketed JSON stream.
fn with_stream_records(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    mut resp: Response,
) -> Response {
    if let Some(s) = core.shard.stream(id) {
        if records::active(surface, &s.content_type) {
            records::push_stream_headers(&mut resp, &s);
        }
    }
    resp
}

/// A record-aware read (extensions.md §8.6–§8.7): whole records from a record ordinal.
async fn record_read(
    core: &Rc<Core>,
    id: StreamId,
    rp: records::RecordParams,
    params: &ReadParams,
    req: &Request,
) -> Response {
    let start = {
        let Some(s) = core.shard.stream(id) else {
            return Response::error(404, "stream_not_found", "stream not found");
        };
        match records::resolve(&s, rp.start) {
            Ok(r) => r,
            Err(resp) => return resp,
        }
    };
    core.shard.touch(id, ursula_storage::now_ms());
    match params.live {
        Some(Live::Sse) => crate::sse::start_records(core, id, start, params.cursor.clone(), rp),
        Some(Live::LongPoll) => {
            let deadline =
                std::time::Instant::now() + params.timeout.unwrap_or(core.config.long_poll_timeout);
            loop {
                let (has, closed, version) = match core.shard.stream(id) {
                    Some(s) => (
                        records::visible_next(&s) > start,
                        s.visible_closed,
                        s.version(),
                    ),
                    None => return Response::error(404, "stream_not_found", "stream not found"),
                };
                if has {
                    let c = cursor(core, params.cursor.as_deref());
                    return record_catch_up(core, id, start, rp, req, Some(c)).await;
                }
                let now = std::time::Instant::now();
                if closed || now >= deadline || core.shutting_down() {
                    let Some(s) = core.shard.stream(id) else {
                        return Response::error(404, "stream_not_found", "stream not found");
                    };
                    let mut resp = Response::new(204)
                        .header("stream-next-offset", format_offset(s.visible_tail))
                        .header("stream-up-to-date", "true")
                        .header("cache-control", "no-store");
                    if closed {
                        resp.push("stream-closed", "true");
                    } else {
                        resp.push("stream-cursor", cursor(core, params.cursor.as_deref()));
                    }
                    resp.push("stream-record-first", records::first(&s).to_string());
                    records::push_ack_headers(&mut resp, start, start);
                    return resp;
                }
                let wait = (deadline - now).min(Duration::from_millis(500));
                core.wait_or_shutdown(core.shard.changed(id, version), wait)
                    .await;
                core.shard.touch(id, ursula_storage::now_ms());
            }
        }
        None if rp.start == records::RecordStart::Now => {
            // Like offset=now: empty, up to date, not cacheable, plus record headers.
            let Some(s) = core.shard.stream(id) else {
                return Response::error(404, "stream_not_found", "stream not found");
            };
            let mut resp = Response::new(200)
                .header("content-type", record_content_type(rp))
                .header("stream-next-offset", format_offset(s.visible_tail))
                .header("stream-up-to-date", "true")
                .header("cache-control", "no-store")
                .header("stream-record-first", records::first(&s).to_string());
            if s.visible_closed {
                resp.push("stream-closed", "true");
            }
            records::push_ack_headers(&mut resp, start, start);
            resp
        }
        None => record_catch_up(core, id, start, rp, req, None).await,
    }
}

fn record_content_type(rp: records::RecordParams) -> &'static str {
    if rp.envelope {
        records::ENVELOPE_TYPE
    } else {
        "application/x-ndjson"
    }
}

/// Whole records from `start` (at most `max_records`, within 8 MiB unless one record is
/// larger), NDJSON or envelope view, with record continuation headers.
async fn record_catch_up(
    core: &Rc<Core>,
    id: StreamId,
    start: u64,
    rp: records::RecordParams,
    req: &Request,
    cursor: Option<String>,
) -> Response {
    let (end, from, to) = {
        let Some(s) = core.shard.stream(id) else {
            return Response::error(404, "stream_not_found", "stream not found");
        };
        let end = records::end_record(&s, start, rp.max_records, MAX_READ_BYTES as usize);
        let from = s.message_start(start).unwrap_or(s.visible_tail);
        let to = s
            .message_start(end)
            .unwrap_or(s.visible_tail)
            .min(s.visible_tail);
        (end, from, to)
    };
    let parts = match core.shard.read(id, from, to).await {
        Ok(p) => p,
        Err(e) => return storage_error(e),
    };
    let Some(s) = core.shard.stream(id) else {
        return Response::error(404, "stream_not_found", "stream not found");
    };
    let up_to_date = end == records::visible_next(&s);
    let closed = up_to_date && s.visible_closed;
    let etag = format!(
        "\"{}:{}:{}{}{}\"",
        s.incarnation,
        from,
        to,
        if closed { ":c" } else { "" },
        if rp.envelope { ":e" } else { "" }
    );
    let mut resp = Response::new(200)
        .header("content-type", record_content_type(rp))
        .header("stream-next-offset", format_offset(to))
        .header("stream-record-first", records::first(&s).to_string())
        .header("cache-control", "no-store");
    records::push_ack_headers(&mut resp, start, end);
    if up_to_date {
        resp.push("stream-up-to-date", "true");
    }
    if closed {
        resp.push("stream-closed", "true");
    }
    if let Some(c) = cursor {
        resp.push("stream-cursor", c);
    }
    finish_read(resp, etag, req, || {
        if rp.envelope {
            records::envelope_parts(&parts, start)
        } else {
            parts
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(p: Result<Payload, Response>) -> Payload {
        match p {
            Ok(p) => p,
            Err(r) => panic!("refused with {}", r.status),
        }
    }

    #[test]
    fn a_compact_array_body_becomes_its_own_payload() {
        let body = Bytes::from(br#"[{"a":1},"b",[2]]"#.to_vec());
        let start = body.as_ptr() as usize;
        let p = ok(payload(true, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(p.msg_lens, vec![8, 4, 4]);
        // Rewritten where it arrived: the payload starts just after the `[`.
        assert_eq!(p.data.as_ptr() as usize, start + 1);
    }

    #[test]
    fn shared_or_spaced_bodies_take_the_copying_path_to_the_same_payload() {
        let body = Bytes::from(br#"[{"a":1},"b",[2]]"#.to_vec());
        let held = body.clone();
        let p = ok(payload(true, body, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(
            &held[..],
            br#"[{"a":1},"b",[2]]"#,
            "a shared body is not touched"
        );

        let spaced = Bytes::from(br#"[ {"a": 1}, "b", [2] ]"#.to_vec());
        let p = ok(payload(true, spaced, false));
        assert_eq!(&p.data[..], b"{\"a\":1}\n\"b\"\n[2]\n");
        assert_eq!(p.msg_lens, vec![8, 4, 4]);
    }

    #[test]
    fn invalid_and_empty_json_bodies_are_refused() {
        for (body, status) in [(&b"[1,]"[..], 400), (b"[]", 400), (b"[1", 400)] {
            let r = payload(true, Bytes::from(body.to_vec()), false).err();
            assert_eq!(r.map(|r| r.status), Some(status), "{body:?}");
        }
        let empty_put = ok(payload(true, Bytes::from_static(b"[]"), true));
        assert!(empty_put.data.is_empty() && empty_put.msg_lens.is_empty());
    }
}
