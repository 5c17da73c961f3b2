//! Response headers several handlers describe a stream with.

use ursula_protocol::content_type::is_json;
use ursula_protocol::headers::format_rfc3339_millis;
use ursula_protocol::offset::format_offset;
use ursula_storage::{Lifetime, Offset, Shard, StreamId};

use crate::http::Response;
use crate::records;
use crate::surface::Surface;

const JSON: &str = "application/json";

/// The lifetime headers of a stream (`Stream-TTL` or `Stream-Expires-At`).
pub fn push_lifetime(resp: &mut Response, lifetime: Lifetime) {
    match lifetime {
        Lifetime::Forever => {}
        Lifetime::TtlSeconds(t) => resp.push("stream-ttl", t.to_string()),
        Lifetime::ExpiresAtMs(ms) => resp.push("stream-expires-at", format_rfc3339_millis(ms)),
    }
}

/// The answer for closed stream `id` of `shard`: closed, and where it ends.
pub fn closed_response(shard: &Shard, id: StreamId, status: u16) -> Response {
    let tail = shard.stream(id).map_or(Offset::ZERO, |s| s.next_offset());
    Response::new(status)
        .header("stream-closed", "true")
        .header("stream-next-offset", format_offset(tail.get()))
        .header("cache-control", "no-store")
}

pub fn read_content_type(surface: Surface, stored: &str) -> String {
    if surface == Surface::Bucketed && is_json(stored) {
        "application/x-ndjson".into()
    } else if is_json(stored) {
        JSON.into()
    } else {
        stored.to_string()
    }
}

/// Add the stream-level record headers to a response about a bucketed JSON stream.
pub fn with_stream_records(
    shard: &Shard,
    surface: Surface,
    id: StreamId,
    mut resp: Response,
) -> Response {
    if let Some(s) = shard.stream(id) {
        if records::active(surface, s.content_type()) {
            records::push_stream_headers(&mut resp, &s);
        }
    }
    resp
}
