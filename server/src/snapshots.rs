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
use ursula_protocol::offset::format_offset;
use ursula_protocol::query::{parse_query, percent_decode};
use ursula_storage::{SnapshotMeta, Stream, StreamId};

use crate::cores::Core;
use crate::handlers::{find, storage_error, unavailable, Found};
use crate::http::{Request, Response};
use crate::records;

/// Largest snapshot body (protocol.md §4.7).
pub const MAX_SNAPSHOT_BYTES: u64 = 128 << 20;
/// Update bytes one bootstrap response carries at most (whole messages, at least one).
const MAX_BOOTSTRAP_UPDATE_BYTES: u64 = 64 << 20;

/// Which sub-resource of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// `/snapshot` (latest, or publish by `?record=`).
    Snapshot,
    /// `/snapshot/{offset}` (raw, still percent-encoded).
    SnapshotAt(String),
    /// `/retention` (by `?record=`).
    Retention,
    /// `/retention/{offset}`.
    RetentionAt(String),
    Bootstrap,
}

/// Handle a snapshot/retention/bootstrap request on the stream's owner core.
pub async fn handle(core: &Rc<Core>, key: &str, resource: Resource, req: Request) -> Response {
    if let Some(resp) = crate::buckets::require_bucket(core, key).await {
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
    Response::error(405, "method_not_allowed", "method not allowed").header("allow", allow)
}

fn bad(why: &str) -> Response {
    Response::error(400, "invalid_request", why)
}

fn not_found() -> Response {
    Response::error(404, "stream_not_found", "stream not found")
}

/// A path offset: 1–20 ASCII digits after percent-decoding (`-1`, `now` are not offsets).
fn path_offset(raw: &str) -> Result<u64, Response> {
    let decoded = percent_decode(raw).map_err(|()| bad("invalid offset"))?;
    if decoded.is_empty() || decoded.len() > 20 || !decoded.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Response::error(
            400,
            "invalid_offset",
            "offset must be 1-20 digits",
        ));
    }
    decoded
        .parse()
        .map_err(|_| Response::error(400, "invalid_offset", "offset out of range"))
}

/// The `?record=n` form: a record ordinal on a JSON stream.
fn record_param(req: &Request) -> Result<u64, Response> {
    let query = parse_query(&req.query).map_err(bad)?;
    let value = query
        .get_unique("record")
        .map_err(bad)?
        .ok_or_else(|| bad("give an offset in the path or ?record="))?;
    ursula_protocol::records::parse_record_ordinal(value).map_err(bad)
}

/// The target of a publish or retention request (§3.1 / §4.1): a path offset, or else the
/// `?record=n` query parameter.
fn parse_target(path: Option<&str>, req: &Request) -> Result<(Option<u64>, Option<u64>), Response> {
    match path {
        Some(raw) => Ok((Some(path_offset(raw)?), None)),
        None => Ok((None, Some(record_param(req)?))),
    }
}

/// Resolve a target given as a path offset or `?record=n` (§3.1 / §4.1) against the
/// stream: Ok(offset), or the error response.
fn target_offset(s: &Stream, path: &Option<u64>, record: Option<u64>) -> Result<u64, Response> {
    if let Some(o) = path {
        return Ok(*o);
    }
    let Some(n) = record else {
        return Err(bad("give an offset in the path or ?record="));
    };
    if !is_json(&s.content_type) {
        return Err(bad("?record= needs an application/json stream"));
    }
    let (first, next) = (records::first(s), records::visible_next(s));
    if n < first {
        let mut resp = Response::error(410, "offset_trimmed", "record was removed by retention")
            .header("stream-next-offset", format_offset(s.retained_start));
        records::push_stream_headers(&mut resp, s);
        return Err(resp);
    }
    if n > next {
        let mut resp = bad("record is beyond the record tail");
        records::push_stream_headers(&mut resp, s);
        return Err(resp);
    }
    Ok(s.message_start(n)
        .unwrap_or(s.visible_tail)
        .min(s.visible_tail))
}

/// `Stream-Snapshot-Digest`: BLAKE3 over `u64_le(len(content_type)) ‖ content_type ‖ body`.
pub fn digest(content_type: &str, body: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(content_type.len() as u64).to_le_bytes());
    h.update(content_type.as_bytes());
    h.update(body);
    h.finalize().to_hex().to_string()
}

fn live(core: &Rc<Core>, key: &str) -> Result<StreamId, Response> {
    match find(core, key) {
        Found::Live(id) => Ok(id),
        _ => Err(not_found()),
    }
}

fn json_headers(resp: &mut Response, s: &Stream) {
    if is_json(&s.content_type) {
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
        return bad("Stream-Snapshot-Match must not be empty");
    }
    let content_type = match req.header("content-type") {
        Some(v) => match normalize(v) {
            Ok(ct) => ct,
            Err(()) => return bad("invalid Content-Type"),
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
    let incarnation = core.shard.stream(id).map(|s| s.incarnation);
    let blob = match core.shard.write_blob(body.clone()).await {
        Ok(b) => b,
        Err(e) => return storage_error(e),
    };
    let still = core.shard.stream(id).map(|s| s.incarnation) == incarnation
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
        Err(e) => return storage_error(e),
    };
    if let Err(e) = commit.durable().await {
        return storage_error(e);
    }
    published(core, id)
}

/// Checks 3–8 of §3.1. Ok(Some(offset)) to publish, Ok(None) for an idempotent republish.
fn check_publish(
    core: &Rc<Core>,
    id: StreamId,
    path: Option<u64>,
    record: Option<u64>,
    snapshot_match: Option<&str>,
    digest: &str,
) -> Result<Option<u64>, Response> {
    let s = core.shard.stream(id).ok_or_else(not_found)?;
    let offset = target_offset(&s, &path, record)?;
    if offset < s.retained_start {
        return Err(
            Response::error(410, "offset_trimmed", "offset was removed by retention")
                .header("stream-next-offset", format_offset(s.retained_start)),
        );
    }
    if offset > s.visible_tail {
        return Err(
            Response::error(409, "offset_beyond_tail", "offset is beyond the tail")
                .header("stream-next-offset", format_offset(s.visible_tail)),
        );
    }
    let visible = s.snapshot.as_ref();
    if let Some(expected) = snapshot_match {
        if visible.is_none_or(|v| &*v.digest != expected) {
            return Err(Response::error(
                409,
                "snapshot_mismatch",
                "visible snapshot differs",
            ));
        }
    }
    if let Some(v) = visible {
        if v.offset > offset {
            return Err(Response::error(
                409,
                "snapshot_stale",
                "a newer snapshot is visible",
            ));
        }
        if v.offset == offset {
            return if &*v.digest == digest {
                Ok(None)
            } else {
                Err(Response::error(
                    409,
                    "snapshot_conflict",
                    "a different snapshot is visible at this offset",
                ))
            };
        }
    }
    if !s.is_message_boundary(offset) && offset != 0 {
        return Err(Response::error(
            400,
            "offset_not_aligned",
            "offset is not a message boundary",
        ));
    }
    Ok(Some(offset))
}

fn published(core: &Rc<Core>, id: StreamId) -> Response {
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let mut resp = Response::new(204)
        .header("stream-next-offset", format_offset(s.visible_tail))
        .header("cache-control", "no-store");
    if let Some(v) = &s.snapshot {
        resp.push("stream-snapshot-offset", format_offset(v.offset));
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
    let Some(v) = &s.snapshot else {
        return Response::error(404, "snapshot_not_found", "no snapshot");
    };
    let base = req.path.trim_end_matches('/');
    let mut resp = Response::new(307)
        .header("stream-snapshot-offset", format_offset(v.offset))
        .header("stream-snapshot-digest", v.digest.to_string())
        .header("stream-next-offset", format_offset(v.offset))
        .header("cache-control", "no-store");
    if let Some(host) = req.header("host") {
        resp.push(
            "location",
            format!("http://{host}{base}/{}", format_offset(v.offset)),
        );
    }
    if v.offset == s.visible_tail {
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
    let meta = match core.shard.stream(id).and_then(|s| s.snapshot.clone()) {
        Some(m) if m.offset == offset => m,
        _ => return Response::error(404, "snapshot_not_found", "no snapshot at this offset"),
    };
    let blob = match core.shard.read_blob(&meta).await {
        Ok(b) => b,
        Err(e) => return storage_error(e),
    };
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let mut resp = Response::new(200)
        .header("content-type", meta.content_type.to_string())
        .header("stream-snapshot-offset", format_offset(meta.offset))
        .header("stream-snapshot-digest", meta.digest.to_string())
        .header("stream-next-offset", format_offset(meta.offset))
        .header("cache-control", "no-store");
    if meta.offset == s.visible_tail {
        resp.push("stream-up-to-date", "true");
    }
    if s.visible_closed {
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
        .and_then(|s| s.snapshot.as_ref().map(|m| m.offset))
    {
        Some(v) if v == offset => Response::error(
            409,
            "snapshot_in_use",
            "the visible snapshot cannot be deleted",
        ),
        _ => Response::error(404, "snapshot_not_found", "no snapshot at this offset"),
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
        if offset < s.retained_start {
            return Response::error(409, "retention_backwards", "retention never moves back")
                .header("stream-retained-offset", format_offset(s.retained_start));
        }
        if offset == s.retained_start {
            return retained(core, id);
        }
        match &s.snapshot {
            None => {
                return Response::error(409, "no_snapshot", "publish a snapshot before trimming")
            }
            Some(v) if offset > v.offset => {
                return Response::error(
                    409,
                    "beyond_snapshot",
                    "retention cannot pass the snapshot",
                )
            }
            Some(_) => {}
        }
        if !s.is_message_boundary(offset) {
            return Response::error(
                400,
                "offset_not_aligned",
                "offset is not a message boundary",
            );
        }
        offset
    };
    let commit = match core.shard.retain(id, offset) {
        Ok(c) => c,
        Err(e) => return storage_error(e),
    };
    if let Err(e) = commit.durable().await {
        return storage_error(e);
    }
    retained(core, id)
}

fn retained(core: &Rc<Core>, id: StreamId) -> Response {
    let Some(s) = core.shard.stream(id) else {
        return not_found();
    };
    let mut resp = Response::new(204)
        .header("stream-retained-offset", format_offset(s.retained_start))
        .header("cache-control", "no-store");
    json_headers(&mut resp, &s);
    resp
}

/// `GET /bootstrap`: the snapshot and every retained message after it, as one
/// `multipart/mixed` response (§5).
async fn bootstrap(core: &Rc<Core>, key: &str, req: &Request) -> Response {
    let query = match parse_query(&req.query) {
        Ok(q) => q,
        Err(why) => return bad(why),
    };
    if query.contains("live") {
        return bad("bootstrap is not a live read");
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
            .snapshot
            .as_ref()
            .map_or(s.retained_start, |m| m.offset.max(s.retained_start));
        // One part per retained message after the snapshot: whole messages, capped.
        let mut bounds = Vec::new();
        let mut ordinal = s.message_at_or_after(from);
        let mut total = 0u64;
        while let Some(start) = s.message_start(ordinal).filter(|&o| o < s.visible_tail) {
            let end = s
                .message_start(ordinal + 1)
                .unwrap_or(s.visible_tail)
                .min(s.visible_tail);
            if !bounds.is_empty() && total + (end - start) > MAX_BOOTSTRAP_UPDATE_BYTES {
                break;
            }
            total += end - start;
            bounds.push((start, end));
            ordinal += 1;
        }
        (s.snapshot.clone(), from, bounds, s.content_type.to_string())
    };
    let snapshot_body = match &snapshot {
        Some(meta) => match core.shard.read_blob(meta).await {
            Ok(b) => b,
            Err(e) => return storage_error(e),
        },
        None => Bytes::new(),
    };
    let end = messages.last().map_or(from, |m| m.1);
    let data = match core.shard.read(id, from, end).await {
        Ok(parts) => parts.concat(),
        Err(e) => return storage_error(e),
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
        return unavailable();
    };
    let complete = end >= s.visible_tail;
    let mut resp = Response::new(200)
        .header(
            "content-type",
            format!("multipart/mixed; boundary={boundary}"),
        )
        .header(
            "stream-snapshot-offset",
            snapshot
                .as_ref()
                .map_or("-1".to_string(), |m| format_offset(m.offset)),
        )
        .header("stream-next-offset", format_offset(end))
        .header("cache-control", "no-store");
    if complete {
        resp.push("stream-up-to-date", "true");
        if s.visible_closed {
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

/// Whether a request path is a snapshot publish, which may carry up to 128 MiB.
pub fn is_snapshot_path(path: &str) -> bool {
    let mut segments = path.trim_start_matches('/').split('/');
    matches!(
        (segments.next(), segments.next(), segments.next()),
        (Some(b), Some(_), Some("snapshot")) if b != "v1"
    )
}

/// Route a bucketed sub-resource path (`rest` after `/{bucket}/{stream}/`).
pub fn resource(rest: &[String]) -> Option<Resource> {
    match rest {
        [r] if r == "snapshot" => Some(Resource::Snapshot),
        [r, o] if r == "snapshot" => Some(Resource::SnapshotAt(o.clone())),
        [r] if r == "retention" => Some(Resource::Retention),
        [r, o] if r == "retention" => Some(Resource::RetentionAt(o.clone())),
        [r] if r == "bootstrap" => Some(Resource::Bootstrap),
        _ => None,
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
        assert_eq!(path_offset("00000000000000000042").ok(), Some(42));
        assert_eq!(path_offset("7").ok(), Some(7));
        for bad in ["-1", "now", "", "1a", "000000000000000000001"] {
            assert!(path_offset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resources_and_body_limits() {
        let r = |v: &[&str]| resource(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(r(&["snapshot"]), Some(Resource::Snapshot));
        assert_eq!(
            r(&["snapshot", "5"]),
            Some(Resource::SnapshotAt("5".into()))
        );
        assert_eq!(r(&["retention"]), Some(Resource::Retention));
        assert_eq!(r(&["bootstrap"]), Some(Resource::Bootstrap));
        assert_eq!(r(&["bootstrap", "x"]), None);
        assert!(is_snapshot_path("/logs/app/snapshot/00000000000000000001"));
        assert!(is_snapshot_path("/logs/app/snapshot"));
        assert!(!is_snapshot_path("/logs/app"));
        assert!(!is_snapshot_path("/v1/stream/snapshot"));
    }
}
