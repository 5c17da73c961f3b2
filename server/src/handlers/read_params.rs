//! The parameters of a read (P§4.6), and what a read answers with: a response, or a
//! server-sent event stream for the router to start.

use std::time::Duration;

use ursula_protocol::offset::{parse_offset, OffsetParam};
use ursula_protocol::query::{
    parse_live, parse_max_bytes, parse_timeout_ms, Live, Query, MAX_READ_BYTES,
};
use ursula_storage::{Offset, RecordNo, StreamId};

use crate::http::{ApiError, Response};
use crate::records::RecordParams;
use crate::surface::Surface;

/// Parsed read parameters (P§4.6).
pub struct ReadParams {
    pub offset: Option<OffsetParam>,
    pub live: Option<Live>,
    pub cursor: Option<String>,
    pub max_bytes: usize,
    pub timeout: Option<Duration>,
}

pub fn read_params(
    query: &Query,
    default_timeout: Duration,
    record_start: bool,
) -> Result<ReadParams, ApiError> {
    let one = |k: &str| query.get_unique(k).map_err(ApiError::InvalidRequest);
    let offset = match one("offset")? {
        Some(v) => Some(parse_offset(v).map_err(|e| ApiError::InvalidOffset(e.reason()))?),
        None => None,
    };
    let live = match one("live")? {
        Some(v) => Some(parse_live(v).map_err(ApiError::InvalidRequest)?),
        None => None,
    };
    let cursor = one("cursor")?.map(str::to_string);
    let max_bytes = match one("max_bytes")? {
        Some(v) => parse_max_bytes(v).map_err(ApiError::InvalidRequest)? as usize,
        None => MAX_READ_BYTES as usize,
    };
    let timeout = one("timeout_ms")?
        .and_then(parse_timeout_ms)
        .map(Duration::from_millis)
        .or(Some(default_timeout));
    if live.is_some() && offset.is_none() && !record_start {
        return Err(ApiError::InvalidOffset("live reads need an offset"));
    }
    Ok(ReadParams {
        offset,
        live,
        cursor,
        max_bytes,
        timeout,
    })
}

/// An SSE read, validated on the owner core; `live::sse` builds its session.
#[derive(Debug)]
pub struct SseStart {
    pub surface: Surface,
    pub id: StreamId,
    /// The byte offset the session starts at.
    pub start: Offset,
    pub cursor: Option<String>,
    pub max_bytes: usize,
    /// A record-aware session (extensions.md §8.9): its parameters and first record.
    pub records: Option<(RecordParams, RecordNo)>,
}

/// The answer to a read.
pub enum ReadReply {
    Done(Response),
    Sse(SseStart),
}

impl From<Response> for ReadReply {
    fn from(resp: Response) -> ReadReply {
        ReadReply::Done(resp)
    }
}
