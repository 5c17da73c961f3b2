//! A long-poll read (P§11.6): wait on the owner for data past the offset, or answer `204`
//! at the deadline. Shutdown ends the wait at once.

use std::rc::Rc;

use ursula_protocol::offset::format_offset;
use ursula_storage::{Offset, StreamId};

use crate::core::Core;
use crate::handlers::catch_up::{catch_up, cursor};
use crate::handlers::headers::{closed_response, with_stream_records};
use crate::handlers::read_params::ReadParams;
use crate::http::{ApiError, Handled, Request, Response};
use crate::limits::LIVE_WAIT_SLICE;
use crate::surface::Surface;

pub async fn long_poll(
    core: &Rc<Core>,
    surface: Surface,
    id: StreamId,
    start: Offset,
    params: &ReadParams,
    req: &Request,
) -> Handled {
    let deadline =
        std::time::Instant::now() + params.timeout.unwrap_or(core.config.long_poll_timeout);
    loop {
        // Taken again after every wait: the lane may have moved away meanwhile.
        let shard = core.shard(id)?;
        let (has_data, closed, version) = match shard.stream(id) {
            Some(s) => (s.next_offset() > start, s.is_closed(), s.version()),
            None => return Err(ApiError::StreamNotFound.into()),
        };
        if has_data {
            let c = cursor(core, params.cursor.as_deref());
            return catch_up(&shard, surface, id, start, params.max_bytes, req, Some(c)).await;
        }
        if closed {
            let resp = closed_response(&shard, id, 204).header("stream-up-to-date", "true");
            return Ok(with_stream_records(&shard, surface, id, resp));
        }
        let now = std::time::Instant::now();
        if now >= deadline || core.shutting_down() {
            let tail = shard.stream(id).map_or(start, |s| s.next_offset());
            let resp = Response::new(204)
                .header("stream-next-offset", format_offset(tail.get()))
                .header("stream-up-to-date", "true")
                .header("stream-cursor", cursor(core, params.cursor.as_deref()))
                .header("cache-control", "no-store");
            return Ok(with_stream_records(&shard, surface, id, resp));
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
