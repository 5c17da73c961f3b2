//! A catch-up read (P§11): the data from an offset, whole messages on compat JSON streams,
//! with its ETag and `304`. Long-polls and SSE steps cut their data the same way.

use bytes::Bytes;
use ursula_protocol::content_type::is_json;
use ursula_protocol::offset::format_offset;
use ursula_storage::{Offset, Shard, StreamId};

use crate::core::Core;
use crate::handlers::headers::read_content_type;
use crate::http::{ApiError, Handled, Request, Response};
use crate::records;
use crate::surface::Surface;

/// The next `Stream-Cursor` for a client that sent `client` (P§12).
pub fn cursor(core: &Core, client: Option<&str>) -> String {
    let r = 1 + core.random() % 3600;
    ursula_protocol::cursor::next_cursor(ursula_storage::now_ms(), client, r).to_string()
}

/// `offset=now` catch-up (P§11.5) of stream `id` of `shard`.
pub fn now_response(shard: &Shard, surface: Surface, id: StreamId) -> Handled {
    let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
    let json = is_json(s.content_type());
    let mut resp = Response::new(200)
        .header("content-type", read_content_type(surface, s.content_type()))
        .header("stream-next-offset", format_offset(s.next_offset().get()))
        .header("stream-up-to-date", "true")
        .header("cache-control", "no-store");
    if s.is_closed() {
        resp.push("stream-closed", "true");
    }
    if json && surface == Surface::Compat {
        resp = resp.with_body(vec![Bytes::from_static(b"[]")]);
    }
    if records::active(surface, s.content_type()) {
        records::push_stream_headers(&mut resp, &s);
    }
    Ok(resp)
}

/// The data of a read of stream `id` of `shard` starting at `start`: (body parts, next
/// offset).
pub async fn collect(
    shard: &Shard,
    surface: Surface,
    id: StreamId,
    start: Offset,
    max: usize,
) -> Result<(Vec<Bytes>, Offset), ApiError> {
    let (end, json_array) = {
        let Some(s) = shard.stream(id) else {
            return Ok((Vec::new(), start));
        };
        if surface == Surface::Compat && is_json(s.content_type()) {
            // Whole messages only; at least one even if it alone exceeds the limit.
            let first = s.message_at_or_after(start);
            let visible = s.message_count();
            let mut end_msg = first;
            while end_msg < visible {
                let next_end = s.message_start(end_msg + 1).unwrap_or(s.next_offset());
                if end_msg > first && (next_end - start) as usize > max {
                    break;
                }
                end_msg += 1;
                if (next_end - start) as usize >= max {
                    break;
                }
            }
            let end = s.message_start(end_msg).unwrap_or(s.next_offset());
            (end, true)
        } else {
            (s.next_offset().min(start.saturating_add(max as u64)), false)
        }
    };
    let parts = shard.read(id, start, end).await.map_err(ApiError::from)?;
    if json_array {
        let slices: Vec<&[u8]> = parts.iter().map(|b| &b[..]).collect();
        let body = ursula_protocol::json::render_array(&slices);
        return Ok((vec![Bytes::from(body)], end));
    }
    let end = start + parts.iter().map(|b| b.len() as u64).sum::<u64>();
    Ok((parts, end))
}

/// A catch-up read of stream `id` of `shard` from `start`.
pub async fn catch_up(
    shard: &Shard,
    surface: Surface,
    id: StreamId,
    start: Offset,
    max: usize,
    req: &Request,
    cursor: Option<String>,
) -> Handled {
    let (parts, end) = collect(shard, surface, id, start, max).await?;
    let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
    let up_to_date = end == s.next_offset();
    let closed = up_to_date && s.is_closed();
    let etag = format!(
        "\"{}:{}:{}{}\"",
        s.incarnation(),
        start,
        end,
        if closed { ":c" } else { "" }
    );
    let mut resp = Response::new(200)
        .header("content-type", read_content_type(surface, s.content_type()))
        .header("stream-next-offset", format_offset(end.get()))
        .header("cache-control", "no-store");
    push_read_state(&mut resp, up_to_date, closed, cursor);
    if records::active(surface, s.content_type()) {
        records::push_stream_headers(&mut resp, &s);
    }
    Ok(finish_read(resp, etag, req, || parts))
}

/// The read-state headers every 200 of a read carries: whether it reached the tail, whether
/// the stream is closed there, and the cursor a CDN-friendly client sends back.
pub fn push_read_state(
    resp: &mut Response,
    up_to_date: bool,
    closed: bool,
    cursor: Option<String>,
) {
    if up_to_date {
        resp.push("stream-up-to-date", "true");
    }
    if closed {
        resp.push("stream-closed", "true");
    }
    if let Some(c) = cursor {
        resp.push("stream-cursor", c);
    }
}

/// The end of every catch-up/long-poll 200: the ETag, and `304` instead of the body when
/// `If-None-Match` matches it (P§16.2). `body` is only built when it is sent.
pub fn finish_read(
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
