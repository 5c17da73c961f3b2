//! JSON record coordinates (`json-record-coordinates-v1`, extensions.md §8) on the bucketed
//! surface: the stream's messages numbered from 0 in commit order.
//!
//! The engine keeps every retained message's start offset, so ordinal → offset is an index
//! lookup and record-aware reads never scan data.

use bytes::Bytes;
use ursula_protocol::content_type::is_json;
use ursula_protocol::offset::format_offset;
use ursula_protocol::query::Query;
use ursula_storage::{RecordNo, StreamView};

use crate::http::{ApiError, PushHeader, Refusal, Response};
use crate::limits::ENVELOPE_SLICE_BYTES_MIN;
use crate::surface::Surface;

/// The `Stream-Extensions` value of a bucketed JSON stream (extensions.md §0): the two
/// extensions active on exactly those streams. `json-record-coordinates-v1` is this
/// module's; `ndjson-append-v1` says an `application/x-ndjson` append adds one record per
/// line (`payload::PayloadKind::JsonLines`).
pub const EXTENSIONS: &str = "json-record-coordinates-v1, ndjson-append-v1";
/// Catch-up/long-poll content type of the envelope view (§8.8).
pub const ENVELOPE_TYPE: &str = "application/vnd.durable-stream-records+ndjson";
/// SSE data content type of the envelope view: one record per event.
pub const ENVELOPE_EVENT_TYPE: &str = "application/vnd.durable-stream-record+json";

/// Whether record coordinates are active for a stream (§8.1).
pub fn active(surface: Surface, content_type: &str) -> bool {
    surface == Surface::Bucketed && is_json(content_type)
}

/// First retained record (`F`).
pub fn first(s: &StreamView<'_>) -> RecordNo {
    s.first_message()
}

/// Next record (record tail) as readers see it.
pub fn visible_next(s: &StreamView<'_>) -> RecordNo {
    s.message_count()
}

pub use ursula_protocol::records::{RecordParams, RecordStart};

/// The record-aware parameters of a read (§8.6), if any, or the `400` response. `json` says
/// whether the stream is a JSON stream (record parameters on other streams are a 400). The
/// parsing itself is [`ursula_protocol::records::parse_record_params`].
pub fn parse(query: &Query, json: bool) -> Result<Option<RecordParams>, Refusal> {
    ursula_protocol::records::parse_record_params(query, json)
        .map_err(|why| ApiError::InvalidRequest(why).header("stream-extensions", EXTENSIONS))
}

/// Resolve a record start against the readable records, or the error response (§8.6).
pub fn resolve(s: &StreamView<'_>, start: RecordStart) -> Result<RecordNo, Refusal> {
    let (first, next) = (first(s), visible_next(s));
    let r = match start {
        RecordStart::At(r) => RecordNo::new(r),
        RecordStart::Now => next,
        RecordStart::Tail(k) => next.saturating_sub(k).max(first),
    };
    if r < first {
        return Err(ApiError::OffsetTrimmed("record was removed by retention")
            .header("stream-extensions", EXTENSIONS)
            .header("stream-record-first", first.to_string())
            .header("stream-record-next", next.to_string())
            .header(
                "stream-next-offset",
                format_offset(s.retained_start().get()),
            ));
    }
    if r > next {
        return Err(
            ApiError::OffsetBeyondTail("record is beyond the record tail")
                .header("stream-extensions", EXTENSIONS)
                .header("stream-record-first", first.to_string())
                .header("stream-record-next", next.to_string()),
        );
    }
    Ok(r)
}

/// The end record of a record-aligned read from `start`: whole records only, at most
/// `max_records`, within `max_bytes` unless the first record alone is larger.
pub fn end_record(
    s: &StreamView<'_>,
    start: RecordNo,
    max_records: Option<u64>,
    max_bytes: usize,
) -> RecordNo {
    let next = visible_next(s);
    let limit = max_records.map_or(next, |m| start.saturating_add(m).min(next));
    let Some(start_off) = s.message_start(start) else {
        return start;
    };
    s.records_within(start, limit, start_off.saturating_add(max_bytes as u64))
}

/// The envelope view as iovec parts: `{"record":n,"value":` framing around each record's
/// stored value bytes (large values as zero-copy slices), closed by `}` + LF. `parts` must
/// hold whole records (record-aware reads start and end on record boundaries).
pub fn envelope_parts(parts: &[Bytes], first_record: RecordNo) -> Vec<Bytes> {
    use std::io::Write;
    let mut out = Vec::new();
    let mut framing: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut record = first_record;
    for part in parts {
        let mut at = 0;
        while at < part.len() {
            let end = memchr::memchr(b'\n', &part[at..]).map_or(part.len(), |i| at + i);
            if record != first_record {
                framing.extend_from_slice(b"}\n");
            }
            let _ = write!(framing, "{{\"record\":{record},\"value\":");
            if end - at >= ENVELOPE_SLICE_BYTES_MIN {
                out.push(Bytes::from(std::mem::take(&mut framing)));
                out.push(part.slice(at..end));
            } else {
                framing.extend_from_slice(&part[at..end]);
            }
            record += 1;
            at = end + 1;
        }
    }
    if record > first_record {
        framing.extend_from_slice(b"}\n");
    }
    if !framing.is_empty() {
        out.push(Bytes::from(framing));
    }
    out
}

/// Stream-level record headers (HEAD, offset reads).
pub fn push_stream_headers(resp: &mut impl PushHeader, s: &StreamView<'_>) {
    resp.push_header("stream-extensions", EXTENSIONS.to_owned());
    resp.push_header("stream-record-first", first(s).to_string());
    resp.push_header("stream-record-next", visible_next(s).to_string());
}

/// Acknowledgement headers for a write that created records `[start, next)`.
pub fn push_ack_headers(resp: &mut Response, start: RecordNo, next: RecordNo) {
    resp.push("stream-extensions", EXTENSIONS);
    resp.push("stream-record-start", start.to_string());
    resp.push("stream-record-next", next.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use ursula_protocol::query::parse_query;

    fn p(q: &str) -> Result<Option<RecordParams>, u16> {
        parse(&parse_query(q).expect("query"), true).map_err(|r| r.error.status())
    }

    #[test]
    fn parameter_rules() {
        assert_eq!(p("offset=-1"), Ok(None));
        assert_eq!(
            p("record=42&max_records=100"),
            Ok(Some(RecordParams {
                start: RecordStart::At(42),
                max_records: Some(100),
                envelope: false
            }))
        );
        assert_eq!(
            p("record=now").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::Now))
        );
        assert_eq!(
            p("tail_records=0").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::Now))
        );
        assert_eq!(
            p("tail_records=5").map(|o| o.map(|r| r.start)),
            Ok(Some(RecordStart::Tail(5)))
        );
        assert_eq!(
            p("record=1&record_view=envelope").map(|o| o.map(|r| r.envelope)),
            Ok(Some(true))
        );
        for bad in [
            "record=0&offset=5",
            "record=1&tail_records=2",
            "max_records=3",
            "record_view=envelope",
            "record=1&max_records=0",
            "record=1&max_records=x",
            "record=1&record_view=raw",
            "record=1&max_bytes=10",
            "record=-1",
            "record=1.5",
            "tail_records=-2",
            "record=1&record=2",
        ] {
            assert_eq!(p(bad), Err(400), "{bad}");
        }
        let q = parse_query("record=1").expect("query");
        assert_eq!(
            parse(&q, false).map_err(|r| r.error.status()).err(),
            Some(400)
        );
    }

    #[test]
    fn envelope_matches_the_reference_vector_across_parts() {
        let stored = Bytes::from_static(b"{\"id\":1}\n{\"id\":2}\n");
        let parts = envelope_parts(&[stored.slice(0..9), stored.slice(9..)], RecordNo::new(1));
        assert_eq!(
            parts.concat(),
            b"{\"record\":1,\"value\":{\"id\":1}}\n{\"record\":2,\"value\":{\"id\":2}}\n".to_vec()
        );
    }

    #[test]
    fn envelope_slices_large_values_instead_of_copying() {
        let big = format!("{{\"v\":\"{}\"}}", "x".repeat(2000));
        let stored = Bytes::from(format!("1\n{big}\n2\n"));
        let parts = envelope_parts(std::slice::from_ref(&stored), RecordNo::new(7));
        let expected = format!(
            "{{\"record\":7,\"value\":1}}\n{{\"record\":8,\"value\":{big}}}\n{{\"record\":9,\"value\":2}}\n"
        );
        assert_eq!(parts.concat(), expected.into_bytes());
        let value = &parts[1];
        assert_eq!(
            value.as_ptr(),
            stored[2..].as_ptr(),
            "a large value is not copied"
        );
        assert_eq!(value.len(), big.len());
    }
}
