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
use ursula_storage::{Offset, RecordNo, Shard, SnapshotMeta, StreamId, StreamView};

use crate::core::Core;
use crate::handlers::buckets::require_bucket;
use crate::http::{ApiError, Handled, Refusal, Request, Response};
use crate::limits::BOOTSTRAP_UPDATE_BYTES_MAX;
use crate::lookup::{find, Found};
use crate::records;
use crate::routes::Resource;

/// Handle a snapshot/retention/bootstrap request on the stream's owner core.
pub async fn handle(core: &Rc<Core>, key: &str, resource: Resource, req: Request) -> Handled {
    require_bucket(core, key).await?;
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

fn not_allowed(allow: &'static str) -> Handled {
    Err(ApiError::MethodNotAllowed {
        allow,
        reason: "method not allowed",
    }
    .into())
}

fn not_found() -> Refusal {
    ApiError::StreamNotFound.into()
}

/// A path offset: 1–20 ASCII digits after percent-decoding (`-1`, `now` are not offsets).
fn path_offset(raw: &str) -> Result<Offset, ApiError> {
    let decoded = percent_decode(raw).map_err(|_| ApiError::InvalidRequest("invalid offset"))?;
    match parse_digits(decoded.as_bytes()) {
        Ok(n) => Ok(Offset::new(n)),
        Err(OffsetError::Syntax) => Err(ApiError::InvalidOffset("offset must be 1-20 digits")),
        Err(e) => Err(ApiError::InvalidOffset(e.reason())),
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
) -> Result<(Option<Offset>, Option<RecordNo>), ApiError> {
    match path {
        Some(raw) => Ok((Some(path_offset(raw)?), None)),
        None => Ok((None, Some(record_param(req)?))),
    }
}

/// Resolve a target given as a path offset or `?record=n` (§3.1 / §4.1) against the
/// stream.
fn target_offset(
    s: &StreamView<'_>,
    path: &Option<Offset>,
    record: Option<RecordNo>,
) -> Result<Offset, Refusal> {
    if let Some(o) = path {
        return Ok(*o);
    }
    let Some(n) = record else {
        return Err(ApiError::InvalidRequest("give an offset in the path or ?record=").into());
    };
    if !is_json(s.content_type()) {
        return Err(ApiError::InvalidRequest("?record= needs an application/json stream").into());
    }
    let (first, next) = (records::first(s), records::visible_next(s));
    if n < first {
        let mut refusal = ApiError::OffsetTrimmed("record was removed by retention").header(
            "stream-next-offset",
            format_offset(s.retained_start().get()),
        );
        records::push_stream_headers(&mut refusal, s);
        return Err(refusal);
    }
    if n > next {
        let mut refusal =
            Refusal::from(ApiError::InvalidRequest("record is beyond the record tail"));
        records::push_stream_headers(&mut refusal, s);
        return Err(refusal);
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
fn live(core: &Rc<Core>, key: &str) -> Result<StreamId, Refusal> {
    match find(core, key)? {
        Found::Live(id) => Ok(id),
        Found::Absent | Found::Expired(_) | Found::SoftDeleted => Err(not_found()),
    }
}

fn json_headers(resp: &mut Response, s: &StreamView<'_>) {
    if is_json(s.content_type()) {
        records::push_stream_headers(resp, s);
    }
}

async fn publish(core: &Rc<Core>, key: &str, path: Option<String>, req: &Request) -> Handled {
    // 1. syntax
    let (path, record) = parse_target(path.as_deref(), req)?;
    let snapshot_match = req.header("stream-snapshot-match");
    if snapshot_match == Some("") {
        return Err(ApiError::InvalidRequest("Stream-Snapshot-Match must not be empty").into());
    }
    let content_type = match req.header("content-type") {
        Some(v) => normalize(v).map_err(|_| ApiError::InvalidRequest("invalid Content-Type"))?,
        None => "application/octet-stream".to_string(),
    };
    let body = req.body.clone();
    let digest = digest(&content_type, &body);
    // 2.–8. against the stream
    let id = live(core, key)?;
    let shard = core.shard(id)?;
    let Some(offset) = check_publish(&shard, id, path, record, snapshot_match, &digest)? else {
        return published(&shard, id);
    };
    // 9. publish: the blob first (durable in its own file), then the record that makes it
    // visible. The write awaited, so check again that nothing moved meanwhile.
    let incarnation = shard.stream(id).map(|s| s.incarnation());
    let blob = shard.write_blob(body.clone()).await?;
    let recheck = match find(core, key) {
        Ok(Found::Live(now))
            if now == id && shard.stream(id).map(|s| s.incarnation()) == incarnation =>
        {
            check_publish(&shard, id, Some(offset), None, snapshot_match, &digest)
        }
        Ok(_) => Err(not_found()),
        // The lane started moving meanwhile.
        Err(e) => Err(e.into()),
    };
    match recheck {
        Ok(Some(_)) => {}
        other => {
            shard.discard_blob(blob);
            return match other {
                Ok(None) => published(&shard, id),
                Err(r) => Err(r),
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
    let commit = shard.set_snapshot(id, meta)?;
    commit.durable().await?;
    published(&shard, id)
}

/// Checks 3–8 of §3.1. Ok(Some(offset)) to publish, Ok(None) for an idempotent republish.
fn check_publish(
    shard: &Shard,
    id: StreamId,
    path: Option<Offset>,
    record: Option<RecordNo>,
    snapshot_match: Option<&str>,
    digest: &str,
) -> Result<Option<Offset>, Refusal> {
    let s = shard.stream(id).ok_or_else(not_found)?;
    let offset = target_offset(&s, &path, record)?;
    if offset < s.retained_start() {
        return Err(
            ApiError::OffsetTrimmed("offset was removed by retention").header(
                "stream-next-offset",
                format_offset(s.retained_start().get()),
            ),
        );
    }
    if offset > s.next_offset() {
        return Err(ApiError::SnapshotBeyondTail
            .header("stream-next-offset", format_offset(s.next_offset().get())));
    }
    let visible = s.snapshot();
    if let Some(expected) = snapshot_match {
        if visible.is_none_or(|v| &*v.digest != expected) {
            return Err(ApiError::SnapshotMismatch.into());
        }
    }
    if let Some(v) = visible {
        if v.offset > offset {
            return Err(ApiError::SnapshotStale.into());
        }
        if v.offset == offset {
            return if &*v.digest == digest {
                Ok(None)
            } else {
                Err(ApiError::SnapshotConflict.into())
            };
        }
    }
    if !s.is_message_boundary(offset) && offset != Offset::ZERO {
        return Err(ApiError::OffsetNotAligned("offset is not a message boundary").into());
    }
    Ok(Some(offset))
}

fn published(shard: &Shard, id: StreamId) -> Handled {
    let s = shard.stream(id).ok_or_else(not_found)?;
    let mut resp = Response::new(204)
        .header("stream-next-offset", format_offset(s.next_offset().get()))
        .header("cache-control", "no-store");
    if let Some(v) = s.snapshot() {
        resp.push("stream-snapshot-offset", format_offset(v.offset.get()));
        resp.push("stream-snapshot-digest", v.digest.to_string());
    }
    json_headers(&mut resp, &s);
    Ok(resp)
}

/// `GET /snapshot`: redirect to the visible snapshot (§3.3).
fn latest(core: &Rc<Core>, key: &str, req: &Request) -> Handled {
    let id = live(core, key)?;
    let shard = core.shard(id)?;
    let s = shard.stream(id).ok_or_else(not_found)?;
    let v = s
        .snapshot()
        .ok_or(ApiError::SnapshotNotFound("no snapshot"))?;
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
    Ok(resp)
}

/// `GET /snapshot/{offset}`: the visible snapshot's blob (§3.4).
async fn read(core: &Rc<Core>, key: &str, raw: &str) -> Handled {
    let offset = path_offset(raw)?;
    let id = live(core, key)?;
    let shard = core.shard(id)?;
    let meta = match shard.stream(id).and_then(|s| s.snapshot().cloned()) {
        Some(m) if m.offset == offset => m,
        _ => return Err(ApiError::SnapshotNotFound("no snapshot at this offset").into()),
    };
    let blob = shard.read_blob(&meta).await?;
    let s = shard.stream(id).ok_or_else(not_found)?;
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
    Ok(resp.with_body(vec![blob]))
}

/// `DELETE /snapshot/{offset}`: the visible snapshot is needed by bootstrap (§3.6).
fn delete(core: &Rc<Core>, key: &str, raw: &str) -> Handled {
    let offset = path_offset(raw)?;
    let id = live(core, key)?;
    let shard = core.shard(id)?;
    let refused = match shard
        .stream(id)
        .and_then(|s| s.snapshot().map(|m| m.offset))
    {
        Some(v) if v == offset => ApiError::SnapshotInUse,
        _ => ApiError::SnapshotNotFound("no snapshot at this offset"),
    };
    Err(refused.into())
}

/// `PUT /retention/{offset}` or `?record=n` (§4.1).
async fn retention(core: &Rc<Core>, key: &str, path: Option<String>, req: &Request) -> Handled {
    let (path, record) = parse_target(path.as_deref(), req)?;
    let id = live(core, key)?;
    let shard = core.shard(id)?;
    let offset = {
        let s = shard.stream(id).ok_or_else(not_found)?;
        let offset = target_offset(&s, &path, record)?;
        if offset < s.retained_start() {
            return Err(ApiError::RetentionBackwards.header(
                "stream-retained-offset",
                format_offset(s.retained_start().get()),
            ));
        }
        if offset == s.retained_start() {
            return retained(&shard, id);
        }
        match s.snapshot() {
            None => return Err(ApiError::NoSnapshot.into()),
            Some(v) if offset > v.offset => return Err(ApiError::BeyondSnapshot.into()),
            Some(_) => {}
        }
        if !s.is_message_boundary(offset) {
            return Err(ApiError::OffsetNotAligned("offset is not a message boundary").into());
        }
        offset
    };
    let commit = shard.retain(id, offset)?;
    commit.durable().await?;
    retained(&shard, id)
}

fn retained(shard: &Shard, id: StreamId) -> Handled {
    let s = shard.stream(id).ok_or_else(not_found)?;
    let mut resp = Response::new(204)
        .header(
            "stream-retained-offset",
            format_offset(s.retained_start().get()),
        )
        .header("cache-control", "no-store");
    json_headers(&mut resp, &s);
    Ok(resp)
}

/// `GET /bootstrap`: the snapshot and every retained message after it, as one
/// `multipart/mixed` response (§5).
async fn bootstrap(core: &Rc<Core>, key: &str, req: &Request) -> Handled {
    let query = parse_query(&req.query).map_err(ApiError::InvalidRequest)?;
    if query.contains("live") {
        return Err(ApiError::InvalidRequest("bootstrap is not a live read").into());
    }
    let id = live(core, key)?;
    let shard = core.shard(id)?;
    let (snapshot, from, messages, content_type) = {
        let s = shard.stream(id).ok_or_else(not_found)?;
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
        Some(meta) => shard.read_blob(meta).await?,
        None => Bytes::new(),
    };
    let end = messages.last().map_or(from, |m| m.1);
    let data = shard.read(id, from, end).await?.concat();
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
    let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
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
    Ok(resp.with_body(vec![Bytes::from(body)]))
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
