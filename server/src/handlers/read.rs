//! `GET` of a stream (P§10-§13): parameters, the start position, then a catch-up, a
//! long-poll, a record-aware read or (started by the router) server-sent events.

use std::rc::Rc;

use ursula_protocol::content_type::is_json;
use ursula_protocol::offset::{format_offset, OffsetParam};
use ursula_protocol::query::{parse_query, Live};
use ursula_storage::{Offset, Shard, StreamId};

use crate::core::Core;
use crate::handlers::catch_up::{catch_up, now_response};
use crate::handlers::long_poll::long_poll;
use crate::handlers::read_params::{read_params, ReadReply, SseStart};
use crate::handlers::record_read::record_read;
use crate::http::{ApiError, Refusal, Request};
use crate::lookup;
use crate::records;
use crate::surface::Surface;

/// A resolved start position, or why it cannot be read from (P§3.3).
fn resolve_start(
    shard: &Shard,
    id: StreamId,
    surface: Surface,
    offset: OffsetParam,
) -> Result<Offset, Refusal> {
    let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
    let start = match offset {
        OffsetParam::Start => Offset::ZERO,
        OffsetParam::Now => s.next_offset(),
        OffsetParam::At(p) => Offset::new(p),
    };
    // P§3.3: `-1` means byte 0, so after retention it is trimmed like any earlier offset.
    if start < s.retained_start() {
        let mut refusal = ApiError::OffsetTrimmed("offset was removed by retention").header(
            "stream-next-offset",
            format_offset(s.retained_start().get()),
        );
        if records::active(surface, s.content_type()) {
            records::push_stream_headers(&mut refusal, &s);
        }
        return Err(refusal);
    }
    if start > s.next_offset() {
        return Err(ApiError::OffsetBeyondTail("offset is beyond the tail")
            .header("stream-next-offset", format_offset(s.next_offset().get())));
    }
    if surface == Surface::Compat && is_json(s.content_type()) && !s.is_message_boundary(start) {
        return Err(ApiError::OffsetNotAligned("offset is inside a JSON message").into());
    }
    Ok(start)
}

pub async fn read(
    core: &Rc<Core>,
    surface: Surface,
    key: &str,
    req: &Request,
) -> Result<ReadReply, Refusal> {
    let query = parse_query(&req.query).map_err(ApiError::InvalidRequest)?;
    // Record-aware parameters exist only on the bucketed surface (compat ignores them).
    let record_params = match surface {
        Surface::Bucketed => records::parse(&query, true)?,
        Surface::Compat => None,
    };
    let params = read_params(
        &query,
        core.config.long_poll_timeout,
        record_params.is_some(),
    )?;
    let id = lookup::live(core, key)?;
    let shard = core.shard(id)?;
    if let Some(rp) = record_params {
        let json = shard.stream(id).is_some_and(|s| is_json(s.content_type()));
        if !json {
            return Err(ApiError::InvalidRequest(
                "record coordinates are only available on application/json streams",
            )
            .into());
        }
        return record_read(core, &shard, id, rp, &params, req).await;
    }
    let offset = params.offset.unwrap_or(OffsetParam::Start);
    let start = resolve_start(&shard, id, surface, offset)?;
    shard.touch(id, ursula_storage::now_ms());
    let done = match params.live {
        Some(Live::Sse) => {
            return Ok(ReadReply::Sse(SseStart {
                surface,
                id,
                start,
                cursor: params.cursor,
                max_bytes: params.max_bytes,
                records: None,
            }))
        }
        Some(Live::LongPoll) => long_poll(core, surface, id, start, &params, req).await?,
        None if offset == OffsetParam::Now => now_response(&shard, surface, id)?,
        None => catch_up(&shard, surface, id, start, params.max_bytes, req, None).await?,
    };
    Ok(ReadReply::Done(done))
}
