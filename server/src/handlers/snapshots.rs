//! Snapshots, retention and bootstrap on the bucketed surface (extensions.md §3–§5).
//!
//! A snapshot is an application blob folding a stream's history over `[0, offset)`; the
//! engine stores it in its own file and records which one is visible. Retention may only
//! trim up to the visible snapshot, so `/bootstrap` (snapshot + every retained message
//! after it) can always rebuild what a `410` took away.

use std::rc::Rc;

use bytes::Bytes;
use ursula_protocol::content_type::{is_json, normalize};
use ursula_protocol::http1::Method;
use ursula_protocol::offset::{format_offset, parse_digits, OffsetError};
use ursula_protocol::query::{parse_query, percent_decode};
use ursula_storage::{Offset, RecordNo, SnapshotMeta, StreamId, StreamView};

use crate::core::Core;
use crate::handlers::buckets::require_bucket;
use crate::http::{ApiError, Request, Response};
use crate::limits::BOOTSTRAP_UPDATE_BYTES_MAX;
use crate::lookup::{find, Found};
use crate::records;
use crate::routes::Resource;

/// Handle a snapshot/retention/bootstrap request on the stream's owner core.
pub async fn handle(core: &Rc<Core>, key: &str, resource: Resource, req: Request) -> Response {
    if let Some(resp) = require_bucket(core, key).await {
        return resp;
    }
    match (&req.method, resource) {
        (Method::Put, Resource::Snapshot) => publish(core, key, None, &req).await,
        (Method::Put, Resource::SnapshotAt(o)) => publish(core, key, Some(o), &req).await,
        (Method::Get, Resource::Snapshot) => latest(core, key, &req),
        (Method::Get, Resource::SnapshotAt(o)) => read(core, key, &o).await,
        (Method::Delete, Resource::SnapshotAt(o)) => delete(core, key, &o),
        (Method::Put, Resource::Retention) => retention(core, key, None, &req).await,
        (Method::Put, Resource::RetentionAt(o)) => retention(core, key, Some(o), &req).await,
        (Method::Get, Resource::Bootstrap) => bootstrap(core, key, &req).await,
        (_, Resource::Snapshot) => not_allowed("GET, PUT"),
        (_, Resource::SnapshotAt(_)) => not_allowed("GET, PUT, DELETE"),
        (_, Resource::Retention | Resource::RetentionAt(_)) => not_allowed("PUT"),
        (_, Resource::Bootstrap) => not_allowed("GET"),
    }
}

fn not_allowed(allow: &'static str) -> Response {
    ApiError::MethodNotAllowed {
        allow,
        reason: "method not allowed",
    }
    .response()
}

fn not_found() -> Response {
    ApiError::StreamNotFound.response()
}

/// A path offset: 1–20 ASCII digits after percent-decoding (`-1`, `now` are not offsets).
fn path_offset(raw: &str) -> Result<Offset, Response> {
    let decoded =
        percent_decode(raw).map_err(|_| ApiError::InvalidRequest("invalid offset").response())?;
    match parse_digits(decoded.as_bytes()) {
        Ok(n) => Ok(Offset::new(n)),
        Err(OffsetError::Syntax) => {
            Err(ApiError::InvalidOffset("offset must be 1-20 digits").response())
        }
        Err(e) => Err(ApiError::InvalidOffset(e.reason()).response()),
    }
}

/// The `?record=n` form: a record ordinal on a JSON stream.
fn record_param(req: &Request) -> Result<RecordNo, ApiError> {
    let query = parse_query(&req.query).map_err(ApiError::InvalidRequest)?;
    let value = query
        .get_unique("record")
        .map_err(ApiError::InvalidRequest)?
        .ok_or(ApiError::InvalidRequest(
            "give an offset in the path or ?record=",
        ))?;
    ursula_protocol::records::parse_record_ordinal(value)
        .map(RecordNo::new)
        .map_err(ApiError::InvalidRequest)
}

/// The target of a publish or retention request (§3.1 / §4.1): a path offset, or else the
/// `?record=n` query parameter.
fn parse_target(
    path: Option<&str>,
    req: &Request,
) -> Result<(Option<Offset>, Option<RecordNo>), Response> {
    match path {
        Some(raw) => Ok((Some(path_offset(raw)?), None)),
        None => Ok((None, Some(record_param(req)?))),
    }
}

/// Resolve a target given as a path offset or `?record=n` (§3.1 / §4.1) against the
/// stream: Ok(offset), or the error response.
fn target_offset(
    s: &StreamView<'_>,
    path: &Option<Offset>,
    record: Option<RecordNo>,
) -> Result<Offset, Response> {
    if let Some(o) = path {
        return Ok(*o);
    }
    let Some(n) = record else {
        return Err(ApiError::InvalidRequest("give an offset in the path or ?record=").response());
    };
    if !is_json(s.content_type()) {
        return Err(
            ApiError::InvalidRequest("?record= needs an application/json stream").response(),
        );
    }
    let (first, next) = (records::first(s), records::visible_next(s));
    if n < first {
        let mut resp = ApiError::OffsetTrimmed("record was removed by retention")
            .response()
            .header(
                "stream-next-offset",
                format_offset(s.retained_start().get()),
            );
        records::push_stream_headers(&mut resp, s);
        return Err(resp);
    }
    if n > next {
        let mut resp = ApiError::InvalidRequest("record is beyond the record tail").response();
        records::push_stream_headers(&mut resp, s);
        return Err(resp);
    }
    Ok(s.message_start(n)
        .unwrap_or(s.next_offset())
        .min(s.next_offset()))
}

/// `Stream-Snapshot-Digest`: BLAKE3 over `u64_le(len(content_type)) ‖ content_type ‖ body`.
pub fn digest(content_type: &str, body: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(content_type.len() as u64).to_le_bytes());
    h.update(content_type.as_bytes());
    h.update(body);
    h.finalize().to_hex().to_string()
}

/// A live stream; a soft-deleted one is not found here (it only serves its forks).
fn live(core: &Rc<Core>, key: &str) -> Result<StreamId, Response> {
    match find(core, key) {
        Found::Live(id) => Ok(id),
        Found::Absent | Found::Expired(_) | Found::SoftDeleted => Err(not_found()),
    }
}

fn json_headers(resp: &mut Response, s: &StreamView<'_>) {
    if is_json(s.content_type()) {
        records::push_stream_headers(resp, s);
    }
}

async fn publish(core: &Rc<Core>, key: &str, path: Option<String>, req: &Request) -> Response {
    // 1. syntax
    let (path, record) = match parse_target(path.as_deref(), req) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let snapshot_match = req.header("stream-snapshot-match");
    if snapshot_match == Some("") {
        return ApiError::InvalidRequest("Stream-Snapshot-Match must not be empty").response();
    }
    let content_type = match req.header("content-type") {
        Some(v) => match normalize(v) {
            Ok(ct) => ct,
            Err(_) => return ApiError::InvalidRequest("invalid Content-Type").response(),
        },
        None => "application/octet-stream".to_string(),
    };
    let body = req.body.clone();
    let digest = digest(&content_type, &body);
    // 2.–8. against the stream
    let id = match live(core, key) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let offset = match check_publish(core, id, path, record, snapshot_match, &digest) {
        Ok(Some(offset)) => offset,
        Ok(None) => return published(core, id),
        Err(r) => return r,
    };
    // 9. publish: the blob first (durable in its own file), then the record that makes it
    // visible. The write awaited, so check again that nothing moved meanwhile.
    let incarnation = core.shard.stream(id).map(|s| s.incarnation());
    let blob = match core.shard.write_blob(body.clone()).await {
        Ok(b) => b,
        Err(e) => return Response::from(e),
    };
    let still = core.shard.stream(id).map(|s| s.incarnation()) == incarnation
        && matches!(find(core, key), Found::Live(now) if now == id);
    let recheck = if still {
        check_publish(core, id, Some(offset), None, snapshot_match, &digest)
    } else {
        Err(not_found())
    };
    match recheck {
        Ok(Some(_)) => {}
        other => {
            core.shard.discard_blob(blob);
            return match other {
                Ok(None) => published(core, id),
                Err(r) => r,
                Ok(Some(_)) => unreachable!("matched above"),
            };
        }
    }
    let meta = SnapshotMeta {
        offset,
        content_type: content_type.into(),
        digest: digest.into(),
        blob,
        len: body.len() as u64,
    };
    let commit = match core.shard.set_snapshot(id, meta) {
        Ok(c) => c,
        Err(e) => return Response::from(e),
    };
    if let Err(e) = commit.durable().await {
        return Response::from(e);
    }
    published(core, id)
}

/// Checks 3–8 of §3.1. Ok(Some(offset)) to publish, Ok(None) for an idempotent republish.
fn check_publish(
    core: &Rc<Core>,
    id: StreamId,
    path: Option<Offset>,
    record: Option<RecordNo>,
    snapshot_match: Option<&str>,
    digest: &str,
) -> Result<Option<Offset>, Response> {
    let s = core.shard.stream(id).ok_or_else(not_found)?;
    let offset = target_offset(&s, &path, record)?;
    if offset < s.retained_start() {
        return Err(ApiError::OffsetTrimmed("offset was removed by retention")
            .response()
            .header(
                "stream-next-offset",
                format_offset(s.retained_start().get()),
            ));
    }
    if offset > s.next_offset() {
        return Err(ApiError::SnapshotBeyondTail
            .response()
            .header("stream-next-offset", format_offset(s.next_offset().get())));
    }
    let visible = s.snapshot();
    if let Some(expected) = snapshot_match {
        if visible.is_none_or(|v| &*v.digest != expected) {
            return Err(ApiError::SnapshotMismatch.response());
        }
    }
    if let Some(v) = visible {
        if v.offset > offset {
            return Err(ApiError::SnapshotStale.response());
        }
        if v.offset == offset {
            return if &*v.digest == digest {
                Ok(None)
            } else {
                Err(ApiError::SnapshotConflict.response())
            };
        }
    }
    if !s.is_message_boundary(offset) && offset != Offset::ZERO {
        return Err(ApiError::OffsetNotAligned("offset is not a message boundary").response());
    }
    Ok(Some(offset))
}

fn published(core: &Rc<Core>, id: StreamId) -> Response {
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let mut resp = Response::new(204)
        .header("stream-next-offset", format_offset(s.next_offset().get()))
        .header("cache-control", "no-store");
    if let Some(v) = s.snapshot() {
        resp.push("stream-snapshot-offset", format_offset(v.offset.get()));
        resp.push("stream-snapshot-digest", v.digest.to_string());
    }
    json_headers(&mut resp, &s);
    resp
}

/// `GET /snapshot`: redirect to the visible snapshot (§3.3).
fn latest(core: &Rc<Core>, key: &str, req: &Request) -> Response {
    let id = match live(core, key) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let Some(v) = s.snapshot() else {
        return ApiError::SnapshotNotFound("no snapshot").response();
    };
    let base = req.path.trim_end_matches('/');
    let mut resp = Response::new(307)
        .header("stream-snapshot-offset", format_offset(v.offset.get()))
        .header("stream-snapshot-digest", v.digest.to_string())
        .header("stream-next-offset", format_offset(v.offset.get()))
        .header("cache-control", "no-store");
    resp.push(
        "location",
        format!("{base}/{}", format_offset(v.offset.get())),
    );
    if v.offset == s.next_offset() {
        resp.push("stream-up-to-date", "true");
    }
    json_headers(&mut resp, &s);
    resp
}

/// `GET /snapshot/{offset}`: the visible snapshot's blob (§3.4).
async fn read(core: &Rc<Core>, key: &str, raw: &str) -> Response {
    let offset = match path_offset(raw) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let id = match live(core, key) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let meta = match core.shard.stream(id).and_then(|s| s.snapshot().cloned()) {
        Some(m) if m.offset == offset => m,
        _ => return ApiError::SnapshotNotFound("no snapshot at this offset").response(),
    };
    let blob = match core.shard.read_blob(&meta).await {
        Ok(b) => b,
        Err(e) => return Response::from(e),
    };
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let mut resp = Response::new(200)
        .header("content-type", meta.content_type.to_string())
        .header("stream-snapshot-offset", format_offset(meta.offset.get()))
        .header("stream-snapshot-digest", meta.digest.to_string())
        .header("stream-next-offset", format_offset(meta.offset.get()))
        .header("cache-control", "no-store");
    if meta.offset == s.next_offset() {
        resp.push("stream-up-to-date", "true");
    }
    if s.is_closed() {
        resp.push("stream-closed", "true");
    }
    json_headers(&mut resp, &s);
    resp.with_body(vec![blob])
}

/// `DELETE /snapshot/{offset}`: the visible snapshot is needed by bootstrap (§3.6).
fn delete(core: &Rc<Core>, key: &str, raw: &str) -> Response {
    let offset = match path_offset(raw) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let id = match live(core, key) {
        Ok(id) => id,
        Err(r) => return r,
    };
    match core
        .shard
        .stream(id)
        .and_then(|s| s.snapshot().map(|m| m.offset))
    {
        Some(v) if v == offset => ApiError::SnapshotInUse.response(),
        _ => ApiError::SnapshotNotFound("no snapshot at this offset").response(),
    }
}

/// `PUT /retention/{offset}` or `?record=n` (§4.1).
async fn retention(core: &Rc<Core>, key: &str, path: Option<String>, req: &Request) -> Response {
    let (path, record) = match parse_target(path.as_deref(), req) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let id = match live(core, key) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let offset = {
        let Some(s) = core.shard.stream(id) else {
            return not_found();
        };
        let offset = match target_offset(&s, &path, record) {
            Ok(o) => o,
            Err(r) => return r,
        };
        if offset < s.retained_start() {
            return ApiError::RetentionBackwards.response().header(
                "stream-retained-offset",
                format_offset(s.retained_start().get()),
            );
        }
        if offset == s.retained_start() {
            return retained(core, id);
        }
        match s.snapshot() {
            None => return ApiError::NoSnapshot.response(),
            Some(v) if offset > v.offset => return ApiError::BeyondSnapshot.response(),
            Some(_) => {}
        }
        if !s.is_message_boundary(offset) {
            return ApiError::OffsetNotAligned("offset is not a message boundary").response();
        }
        offset
    };
    let commit = match core.shard.retain(id, offset) {
        Ok(c) => c,
        Err(e) => return Response::from(e),
    };
    if let Err(e) = commit.durable().await {
        return Response::from(e);
    }
    retained(core, id)
}

fn retained(core: &Rc<Core>, id: StreamId) -> Response {
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let mut resp = Response::new(204)
        .header(
            "stream-retained-offset",
            format_offset(s.retained_start().get()),
        )
        .header("cache-control", "no-store");
    json_headers(&mut resp, &s);
    resp
}

/// `GET /bootstrap`: the snapshot and every retained message after it, as one
/// `multipart/mixed` response (§5).
async fn bootstrap(core: &Rc<Core>, key: &str, req: &Request) -> Response {
    let query = match parse_query(&req.query) {
        Ok(q) => q,
        Err(why) => return ApiError::InvalidRequest(why).response(),
    };
    if query.contains("live") {
        return ApiError::InvalidRequest("bootstrap is not a live read").response();
    }
    let id = match live(core, key) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let (snapshot, from, messages, content_type) = {
        let Some(s) = core.shard.stream(id) else {
            return not_found();
        };
        let from = s
            .snapshot()
            .map_or(s.retained_start(), |m| m.offset.max(s.retained_start()));
        // One part per retained message after the snapshot: whole messages, capped.
        let mut bounds = Vec::new();
        let mut ordinal = s.message_at_or_after(from);
        let mut total = 0u64;
        while let Some(start) = s.message_start(ordinal).filter(|&o| o < s.next_offset()) {
            let end = s
                .message_start(ordinal + 1)
                .unwrap_or(s.next_offset())
                .min(s.next_offset());
            if !bounds.is_empty() && total + (end - start) > BOOTSTRAP_UPDATE_BYTES_MAX {
                break;
            }
            total += end - start;
            bounds.push((start, end));
            ordinal += 1;
        }
        (
            s.snapshot().cloned(),
            from,
            bounds,
            s.content_type().to_string(),
        )
    };
    let snapshot_body = match &snapshot {
        Some(meta) => match core.shard.read_blob(meta).await {
            Ok(b) => b,
            Err(e) => return Response::from(e),
        },
        None => Bytes::new(),
    };
    let end = messages.last().map_or(from, |m| m.1);
    let data = match core.shard.read(id, from, end).await {
        Ok(parts) => parts.concat(),
        Err(e) => return Response::from(e),
    };
    let updates: Vec<&[u8]> = messages
        .iter()
        .map(|&(a, b)| &data[(a - from) as usize..(b - from) as usize])
        .collect();
    let boundary = boundary_for(core, &snapshot_body, &updates);
    let snapshot_type = snapshot
        .as_ref()
        .map_or("application/octet-stream".to_string(), |m| {
            m.content_type.to_string()
        });
    let mut body = Vec::with_capacity(data.len() + snapshot_body.len() + 128 * (updates.len() + 1));
    push_part(&mut body, &boundary, &snapshot_type, &snapshot_body);
    for u in &updates {
        push_part(&mut body, &boundary, &content_type, u);
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let Some(s) = core.shard.stream(id) else {
        return ApiError::owner_unavailable().response();
    };
    let complete = end >= s.next_offset();
    let mut resp = Response::new(200)
        .header(
            "content-type",
            format!("multipart/mixed; boundary={boundary}"),
        )
        .header(
            "stream-snapshot-offset",
            snapshot
                .as_ref()
                .map_or("-1".to_string(), |m| format_offset(m.offset.get())),
        )
        .header("stream-next-offset", format_offset(end.get()))
        .header("cache-control", "no-store");
    if complete {
        resp.push("stream-up-to-date", "true");
        if s.is_closed() {
            resp.push("stream-closed", "true");
        }
    }
    json_headers(&mut resp, &s);
    resp.with_body(vec![Bytes::from(body)])
}

fn push_part(out: &mut Vec<u8>, boundary: &str, content_type: &str, body: &[u8]) {
    out.extend_from_slice(
        format!("--{boundary}\r\nContent-Type: {content_type}\r\n\r\n").as_bytes(),
    );
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

/// A boundary that occurs in no part body (RFC 2046).
fn boundary_for(core: &Core, snapshot: &[u8], updates: &[&[u8]]) -> String {
    loop {
        let b = format!(
            "ursula-bootstrap-{:016x}{:016x}",
            core.random(),
            core.random()
        );
        let finder = memchr::memmem::Finder::new(b.as_bytes());
        let clash =
            finder.find(snapshot).is_some() || updates.iter().any(|u| finder.find(u).is_some());
        if !clash {
            return b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_deterministic_and_type_sensitive() {
        let a = digest("application/json", b"{}");
        assert_eq!(a, digest("application/json", b"{}"));
        assert_ne!(a, digest("text/plain", b"{}"));
        assert_ne!(a, digest("application/json", b"[]"));
        assert_eq!(a.len(), 64);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn path_offsets() {
        assert_eq!(
            path_offset("00000000000000000042").ok(),
            Some(Offset::new(42))
        );
        assert_eq!(path_offset("7").ok(), Some(Offset::new(7)));
        for bad in ["-1", "now", "", "1a", "000000000000000000001"] {
            assert!(path_offset(bad).is_err(), "{bad}");
        }
    }
}
