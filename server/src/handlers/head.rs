//! `HEAD` of a stream (P§9): its metadata, no body.

use std::rc::Rc;

use ursula_protocol::offset::format_offset;

use crate::core::Core;
use crate::handlers::headers::push_lifetime;
use crate::http::{ApiError, Handled, Response};
use crate::lookup;
use crate::records;
use crate::surface::Surface;

pub fn head(core: &Rc<Core>, surface: Surface, key: &str) -> Handled {
    let id = lookup::live(core, key)?;
    let shard = core.shard(id)?;
    let s = shard.stream(id).ok_or_else(ApiError::owner_unavailable)?;
    let mut resp = Response::new(200)
        .header("content-type", s.content_type().to_string())
        .header("stream-next-offset", format_offset(s.next_offset().get()))
        .header(
            "stream-retained-offset",
            format_offset(s.retained_start().get()),
        )
        .header("stream-incarnation", s.incarnation().to_string())
        .header("cache-control", "no-store");
    if s.is_closed() {
        resp.push("stream-closed", "true");
    }
    push_lifetime(&mut resp, s.lifetime());
    if let Some(snap) = s.snapshot() {
        resp.push("stream-snapshot-offset", format_offset(snap.offset.get()));
        resp.push("stream-snapshot-digest", snap.digest.to_string());
    }
    if records::active(surface, s.content_type()) {
        records::push_stream_headers(&mut resp, &s);
    }
    Ok(resp)
}
