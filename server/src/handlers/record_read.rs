//! Record-aware reads (extensions.md §8.6-§8.9): whole records from a record ordinal, as
//! NDJSON or the envelope view, catch-up, long-poll or (started by the router) SSE.

use std::rc::Rc;

use ursula_protocol::offset::format_offset;
use ursula_protocol::query::{Live, MAX_READ_BYTES};
use ursula_storage::{Offset, RecordNo, Shard, StreamId};

use crate::core::Core;
use crate::handlers::catch_up::{cursor, finish_read, push_read_state};
use crate::handlers::read_params::{ReadParams, ReadReply, SseStart};
use crate::http::{ApiError, Handled, Refusal, Request, Response};
use crate::limits::LIVE_WAIT_SLICE;
use crate::records;
use crate::surface::Surface;

/// A record-aware read (extensions.md §8.6–§8.7) of stream `id` of `shard`: whole records
/// from a record ordinal.
pub async fn record_read(
    core: &Rc<Core>,
    shard: &Shard,
    id: StreamId,
    rp: records::RecordParams,
    params: &ReadParams,
    req: &Request,
) -> Result<ReadReply, Refusal> {
    let start = {
        let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
        records::resolve(&s, rp.start)?
    };
    shard.touch(id, ursula_storage::now_ms());
    match params.live {
        Some(Live::Sse) => {
            let offset = shard
                .stream(id)
                .and_then(|s| s.message_start(start))
                .unwrap_or(Offset::ZERO);
            Ok(ReadReply::Sse(SseStart {
                surface: Surface::Bucketed,
                id,
                start: offset,
                cursor: params.cursor.clone(),
                max_bytes: MAX_READ_BYTES as usize,
                records: Some((rp, start)),
            }))
        }
        Some(Live::LongPoll) => Ok(ReadReply::Done(
            record_long_poll(core, id, start, rp, params, req).await?,
        )),
        None if rp.start == records::RecordStart::Now => {
            Ok(ReadReply::Done(record_now(shard, id, start, rp)?))
        }
        None => Ok(ReadReply::Done(
            record_catch_up(shard, id, start, rp, req, None).await?,
        )),
    }
}

/// A record-aware long-poll: records past `start`, or `204` at the deadline or close.
async fn record_long_poll(
    core: &Rc<Core>,
    id: StreamId,
    start: RecordNo,
    rp: records::RecordParams,
    params: &ReadParams,
    req: &Request,
) -> Handled {
    let deadline =
        std::time::Instant::now() + params.timeout.unwrap_or(core.config.long_poll_timeout);
    loop {
        // Taken again after every wait: the lane may have moved away meanwhile.
        let shard = core.shard(id)?;
        let (has, closed, version) = match shard.stream(id) {
            Some(s) => (
                records::visible_next(&s) > start,
                s.is_closed(),
                s.version(),
            ),
            None => return Err(ApiError::StreamNotFound.into()),
        };
        if has {
            let c = cursor(core, params.cursor.as_deref());
            return record_catch_up(&shard, id, start, rp, req, Some(c)).await;
        }
        let now = std::time::Instant::now();
        if closed || now >= deadline || core.shutting_down() {
            let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
            let mut resp = Response::new(204)
                .header("stream-next-offset", format_offset(s.next_offset().get()))
                .header("stream-up-to-date", "true")
                .header("cache-control", "no-store");
            if closed {
                resp.push("stream-closed", "true");
            } else {
                resp.push("stream-cursor", cursor(core, params.cursor.as_deref()));
            }
            resp.push("stream-record-first", records::first(&s).to_string());
            records::push_ack_headers(&mut resp, start, start);
            return Ok(resp);
        }
        // A stopped shard (its lane moving away) ends a wait at once: answer the retry
        // rather than spin until it is removed.
        if shard.stopped() {
            return Err(ursula_storage::StorageError::Stopped.into());
        }
        let wait = (deadline - now).min(LIVE_WAIT_SLICE);
        core.wait_or_shutdown(shard.changed(id, version), wait)
            .await;
        shard.touch(id, ursula_storage::now_ms());
    }
}

/// `record=now`: like `offset=now`, empty and up to date, plus record headers.
fn record_now(shard: &Shard, id: StreamId, start: RecordNo, rp: records::RecordParams) -> Handled {
    let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
    let mut resp = Response::new(200)
        .header("content-type", record_content_type(rp))
        .header("stream-next-offset", format_offset(s.next_offset().get()))
        .header("stream-up-to-date", "true")
        .header("cache-control", "no-store")
        .header("stream-record-first", records::first(&s).to_string());
    if s.is_closed() {
        resp.push("stream-closed", "true");
    }
    records::push_ack_headers(&mut resp, start, start);
    Ok(resp)
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
    shard: &Shard,
    id: StreamId,
    start: RecordNo,
    rp: records::RecordParams,
    req: &Request,
    cursor: Option<String>,
) -> Handled {
    let (end, from, to) = {
        let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
        let end = records::end_record(&s, start, rp.max_records, MAX_READ_BYTES as usize);
        let from = s.message_start(start).unwrap_or(s.next_offset());
        let to = s.message_start(end).unwrap_or(s.next_offset());
        (end, from, to)
    };
    let parts = shard.read(id, from, to).await?;
    let s = shard.stream(id).ok_or(ApiError::StreamNotFound)?;
    let up_to_date = end == records::visible_next(&s);
    let closed = up_to_date && s.is_closed();
    let etag = format!(
        "\"{}:{}:{}{}{}\"",
        s.incarnation(),
        from,
        to,
        if closed { ":c" } else { "" },
        if rp.envelope { ":e" } else { "" }
    );
    let mut resp = Response::new(200)
        .header("content-type", record_content_type(rp))
        .header("stream-next-offset", format_offset(to.get()))
        .header("stream-record-first", records::first(&s).to_string())
        .header("cache-control", "no-store");
    records::push_ack_headers(&mut resp, start, end);
    push_read_state(&mut resp, up_to_date, closed, cursor);
    Ok(finish_read(resp, etag, req, || {
        if rp.envelope {
            records::envelope_parts(&parts, start)
        } else {
            parts
        }
    }))
}
