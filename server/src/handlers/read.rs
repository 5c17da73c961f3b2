//! `GET` of a stream (P§10-§13): parameters, the start position, then a catch-up, a
//! long-poll, a record-aware read or (started by the router) server-sent events.

use std::rc::Rc;

use ursula_protocol::content_type::is_json;
use ursula_protocol::offset::{format_offset, OffsetParam};
use ursula_protocol::query::{parse_query, Live};
use ursula_storage::{Offset, StreamId};

use crate::core::Core;
use crate::handlers::catch_up::{catch_up, now_response};
use crate::handlers::long_poll::long_poll;
use crate::handlers::read_params::{read_params, ReadReply, SseStart};
use crate::handlers::record_read::record_read;
use crate::http::{ApiError, Request, Response};
use crate::lookup;
use crate::records;
use crate::surface::Surface;

/// A resolved start position, or the error response for it (P§3.3).
fn resolve_start(
    core: &Rc<Core>,
    id: StreamId,
    surface: Surface,
    offset: OffsetParam,
) -> Result<Offset, Response> {
    let Some(s) = core.shard.stream(id) else {
        return Err(ApiError::StreamNotFound.response());
    };
    let start = match offset {
        OffsetParam::Start => Offset::ZERO,
        OffsetParam::Now => s.next_offset(),
        OffsetParam::At(p) => Offset::new(p),
    };
    // P§3.3: `-1` means byte 0, so after retention it is trimmed like any earlier offset.
    if start < s.retained_start() {
        let mut resp = ApiError::OffsetTrimmed("offset was removed by retention")
            .response()
            .header(
                "stream-next-offset",
                format_offset(s.retained_start().get()),
            );
        if records::active(surface, s.content_type()) {
            records::push_stream_headers(&mut resp, &s);
        }
        return Err(resp);
    }
    if start > s.next_offset() {
        return Err(ApiError::OffsetBeyondTail("offset is beyond the tail")
            .response()
            .header("stream-next-offset", format_offset(s.next_offset().get())));
    }
    if surface == Surface::Compat && is_json(s.content_type()) && !s.is_message_boundary(start) {
        return Err(ApiError::OffsetNotAligned("offset is inside a JSON message").response());
    }
    Ok(start)
}

pub async fn read(core: &Rc<Core>, surface: Surface, key: &str, req: &Request) -> ReadReply {
    let query = match parse_query(&req.query) {
        Ok(q) => q,
        Err(why) => return ApiError::InvalidRequest(why).response().into(),
    };
    // Record-aware parameters exist only on the bucketed surface (compat ignores them).
    let record_params = match surface {
        Surface::Bucketed => match records::parse(&query, true) {
            Ok(r) => r,
            Err(resp) => return resp.into(),
        },
        Surface::Compat => None,
    };
    let params = match read_params(
        &query,
        core.config.long_poll_timeout,
        record_params.is_some(),
    ) {
        Ok(p) => p,
        Err(e) => return e.response().into(),
    };
    let id = match lookup::live(core, key) {
        Ok(id) => id,
        Err(e) => return e.response().into(),
    };
    if let Some(rp) = record_params {
        let json = core
            .shard
            .stream(id)
            .is_some_and(|s| is_json(s.content_type()));
        if !json {
            return ApiError::InvalidRequest(
                "record coordinates are only available on application/json streams",
            )
            .response()
            .into();
        }
        return record_read(core, id, rp, &params, req).await;
    }
    let offset = params.offset.unwrap_or(OffsetParam::Start);
    let start = match resolve_start(core, id, surface, offset) {
        Ok(s) => s,
        Err(r) => return r.into(),
    };
    core.shard.touch(id, ursula_storage::now_ms());
    match params.live {
        Some(Live::Sse) => ReadReply::Sse(SseStart {
            surface,
            id,
            start,
            cursor: params.cursor,
            max_bytes: params.max_bytes,
            records: None,
        }),
        Some(Live::LongPoll) => long_poll(core, surface, id, start, &params, req)
            .await
            .into(),
        None if offset == OffsetParam::Now => now_response(core, surface, id).into(),
        None => catch_up(core, surface, id, start, params.max_bytes, req, None)
            .await
            .into(),
    }
}
