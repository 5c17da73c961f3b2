//! `PUT` of a stream (P§5, extensions §7.2): create it, or confirm an identical one.

use std::rc::Rc;

use ursula_protocol::content_type::{normalize, same_media_type};
use ursula_protocol::headers::{is_closed_true, parse_expires_at, parse_ttl};
use ursula_protocol::offset::format_offset;
use ursula_storage::{AppendRec, Lifetime, NewStream, RecordNo, Shard, StreamId};

use crate::attrs::Attrs;
use crate::core::Core;
use crate::ext::Ext;
use crate::handlers::fork;
use crate::handlers::headers::push_lifetime;
use crate::http::{ApiError, Handled, Request, Response};
use crate::lookup::{find, ttl_deadline_ms, Found};
use crate::payload::{payload, PayloadKind};
use crate::records;
use crate::removal;
use crate::surface::Surface;

/// The lifetime headers of a create request. A lifetime that is over before the stream
/// could be read, or whose end no clock can name, is refused: answering 201 for a stream
/// that is already gone would lose what the create wrote.
fn parse_lifetime(req: &Request) -> Result<Option<Lifetime>, ApiError> {
    let ttl = req.header("stream-ttl");
    let expires = req.header("stream-expires-at");
    let now = ursula_storage::now_ms();
    let refuse = |why: &'static str| Err(ApiError::InvalidRequest(why));
    match (ttl, expires) {
        (Some(_), Some(_)) => refuse("Stream-TTL and Stream-Expires-At are exclusive"),
        (Some(t), None) => match parse_ttl(t) {
            Err(_) => refuse("invalid Stream-TTL"),
            Ok(t) if ttl_deadline_ms(now, t).is_none() => refuse("Stream-TTL is too large"),
            Ok(t) => Ok(Some(Lifetime::TtlSeconds(t))),
        },
        (None, Some(e)) => match parse_expires_at(e) {
            Err(_) => refuse("invalid Stream-Expires-At"),
            Ok(at) if at <= now => refuse("Stream-Expires-At is not in the future"),
            Ok(at) => Ok(Some(Lifetime::ExpiresAtMs(at))),
        },
        (None, None) => Ok(None),
    }
}

/// Headers describing a stream after create (P§5.3).
fn created_headers(
    shard: &Shard,
    surface: Surface,
    id: StreamId,
    status: u16,
    location: Option<String>,
) -> Handled {
    let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
    let mut resp = Response::new(status)
        .header("content-type", s.content_type().to_string())
        .header("stream-next-offset", format_offset(s.next_offset().get()))
        .header("stream-incarnation", s.incarnation().to_string())
        .header("cache-control", "no-store");
    if s.is_closed() {
        resp.push("stream-closed", "true");
    }
    push_lifetime(&mut resp, s.lifetime());
    if records::active(surface, s.content_type()) {
        // A create reports the records of its initial body; an idempotent 200 creates none.
        let next = records::visible_next(&s);
        let start = if status == 201 { RecordNo::ZERO } else { next };
        records::push_ack_headers(&mut resp, start, next);
    }
    if let Some(loc) = location {
        resp.push("location", loc);
    }
    Ok(resp)
}

pub async fn create(core: &Rc<Core>, surface: Surface, key: &str, req: &Request) -> Handled {
    let content_type = match req.header("content-type") {
        Some(v) => {
            Some(normalize(v).map_err(|_| ApiError::InvalidRequest("invalid Content-Type"))?)
        }
        None => None,
    };
    let lifetime = parse_lifetime(req)?;
    let closed = is_closed_true(req.header("stream-closed"));
    let fork = fork::parse_request(req)?;
    let attrs = attrs_header(surface, req)?;
    if fork.is_some() && surface == Surface::Bucketed {
        return Err(ApiError::NotImplemented("forks are served on /v1/stream only").into());
    }
    // The shard `key` is placed on: it holds the stream if there is one, and creates it if
    // not.
    let shard = core.shard_for(key)?;
    match find(core, key)? {
        Found::SoftDeleted => {
            return Err(ApiError::StreamExists("stream is deleted but still forked").into())
        }
        Found::Live(id) => {
            let matches = {
                // Compared with the head: a create that repeats one still in its group
                // commit must match it, not the state before it.
                let s = shard.head(id).ok_or_else(ApiError::owner_unavailable)?;
                let ext = Ext::decode(s.ext());
                let type_ok = match (&content_type, &fork) {
                    (Some(ct), _) => same_media_type(ct, s.content_type()),
                    (None, Some(_)) => true,
                    (None, None) => same_media_type("application/octet-stream", s.content_type()),
                };
                let lifetime_ok = match (lifetime, &fork) {
                    (None, Some(_)) => true,
                    (l, _) => l.unwrap_or_default() == s.lifetime(),
                };
                type_ok
                    && lifetime_ok
                    && closed == s.closed()
                    && fork::same_link(fork.as_ref(), ext.fork.as_ref())
                    && ext.attrs == attrs
            };
            if !matches {
                return Err(
                    ApiError::StreamExists("stream exists with a different configuration").into(),
                );
            }
            shard.touch(id, ursula_storage::now_ms());
            return created_headers(&shard, surface, id, 200, None);
        }
        Found::Expired(id) => removal::remove_expired(core, id),
        Found::Absent => {}
    }
    if let Some(fork) = fork {
        return fork::create(core, key, req, fork, content_type, lifetime, closed).await;
    }
    let content_type = content_type.unwrap_or_else(|| "application/octet-stream".into());
    let body =
        PayloadKind::of(&content_type).and_then(|kind| payload(kind, req.body.clone(), true))?;
    let ext = Ext {
        attrs,
        ..Default::default()
    };
    let spec = NewStream {
        meta: core.new_stream_meta(
            &shard,
            key,
            &content_type,
            lifetime.unwrap_or_default(),
            ext.encode(),
        ),
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
    let (id, commit) = shard.create(spec)?;
    commit.durable().await?;
    created_headers(&shard, surface, id, 201, Some(req.path.clone()))
}

/// The `Stream-Attrs` header of a create (§7.2): bucketed surface only (ignored on compat).
fn attrs_header(surface: Surface, req: &Request) -> Result<Option<Attrs>, ApiError> {
    match (surface, req.header("stream-attrs")) {
        (Surface::Bucketed, Some(v)) => {
            crate::attrs::parse(v.as_bytes()).map_err(ApiError::InvalidHeader)
        }
        _ => Ok(None),
    }
}
