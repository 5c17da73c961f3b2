//! The server's one error vocabulary: every refusal a client can get, each mapped once to
//! its status, its machine-readable code and a short plain-text reason.
//!
//! The body of an error response is `<code>: <reason>` and a line feed, as text. A refusal
//! changes nothing; the headers a handler adds to one (the stream's tail, the producer's
//! current epoch) only describe the state the request was checked against.

use std::borrow::Cow;

use bytes::Bytes;
use ursula_storage::StorageError;

use crate::http::coding::DecodeError;
use crate::http::Response;
use crate::lane_table::NotServed;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// Malformed query, header value or body that has no more specific code.
    InvalidRequest(&'static str),
    /// A header that is malformed, or not allowed on this request.
    InvalidHeader(&'static str),
    InvalidOffset(&'static str),
    InvalidStreamId(&'static str),
    InvalidBucketId,
    InvalidJson,
    /// An NDJSON append whose line (counted from 1) is not one JSON value.
    InvalidJsonLine(usize),
    /// A bucket's settings that are not valid; the reason says which and why.
    InvalidSettings(Cow<'static, str>),
    /// Over the bucket's rate limit: retry after this many seconds.
    TooManyRequests {
        limit: &'static str,
        retry_after_secs: u64,
    },
    /// A compressed body that does not decode; the reason says how (see `DecodeError`).
    CorruptBody(Cow<'static, str>),
    /// A text stream's body that is not UTF-8.
    InvalidText,
    /// A JSON append of `[]` (it would add nothing).
    EmptyJsonArray,
    EmptyBody(&'static str),
    MissingContentType,
    /// A read offset or record past the tail.
    OffsetBeyondTail(&'static str),
    /// An offset that is not a message boundary of a JSON stream.
    OffsetNotAligned(&'static str),
    /// A producer's new epoch must start at sequence 0.
    ProducerEpochSeq,
    Unauthorized,
    Forbidden,
    ProducerEpochStale,
    /// No such path (or operational endpoint).
    NotFound(&'static str),
    StreamNotFound,
    ForkSourceNotFound,
    BucketNotFound,
    SnapshotNotFound(&'static str),
    MethodNotAllowed {
        /// The `Allow` header.
        allow: &'static str,
        reason: &'static str,
    },
    RequestTimeout(&'static str),
    StreamExists(&'static str),
    StreamClosed,
    ContentTypeMismatch(&'static str),
    StreamSeqConflict,
    ProducerSeqGap,
    /// The source of a fork was deleted (it is kept only for its live forks).
    ForkSourceGone,
    BucketExists,
    BucketNotEmpty,
    /// A snapshot or retention point past the tail.
    SnapshotBeyondTail,
    SnapshotMismatch,
    SnapshotStale,
    SnapshotConflict,
    SnapshotInUse,
    RetentionBackwards,
    NoSnapshot,
    BeyondSnapshot,
    StreamGone,
    OffsetTrimmed(&'static str),
    RecordPreconditionFailed,
    PayloadTooLarge(Cow<'static, str>),
    /// An append's `Content-Encoding` names a coding the server does not decode.
    UnsupportedEncoding,
    /// A `Content-Encoding` on a request that is not an append.
    EncodingNotAccepted,
    /// A text content type with a charset other than UTF-8.
    UnsupportedCharset,
    HeaderTooLarge,
    NotImplemented(&'static str),
    /// Retry later: a queue is full, a core is gone, or a disk read or write failed in a
    /// way that may pass.
    Unavailable(Cow<'static, str>),
    /// Stored data failed its checksum, or the shard stopped taking writes after a failed
    /// durable write: retrying cannot help until an operator acts. The details are in the
    /// server's log, never in the answer.
    StorageFault(&'static str),
    /// Another host of the cluster answered a call this request needed in a way that
    /// cannot be acted on (it refused this host's token, or sent a malformed answer).
    BadGateway(Cow<'static, str>),
    /// The disk is full; the reason may name why nothing can leave it (the archive lag).
    InsufficientStorage(Cow<'static, str>),
    /// Another server took this server's shards over (through S3): it acknowledges nothing
    /// more until restarted, so retrying here cannot help; another server has the data.
    Fenced,
    /// The owner core does not run the stream's shard now: its lane is moving between
    /// hosts, which ends in moments, so a retry finds it (here or wherever it is routed).
    /// Shards move only with a log per lane, where the shard number is the lane's.
    NotServed {
        shard: u32,
    },
    /// Another host of the cluster owns the stream's lane: the request belongs there (the
    /// owner's advertised address when known), so this one neither serves it nor forwards
    /// it, and a stale route can never write beside the owner.
    Misdirected {
        lane: u32,
        owner: Option<String>,
    },
}

impl ApiError {
    /// The HTTP status of this refusal.
    pub fn status(&self) -> u16 {
        use ApiError::*;
        match self {
            InvalidRequest(_) | InvalidHeader(_) | InvalidOffset(_) | InvalidStreamId(_)
            | InvalidBucketId | InvalidJson | InvalidJsonLine(_) | InvalidSettings(_)
            | CorruptBody(_) | InvalidText | EmptyJsonArray | EmptyBody(_) | MissingContentType
            | OffsetBeyondTail(_) | OffsetNotAligned(_) | ProducerEpochSeq => 400,
            Unauthorized => 401,
            Forbidden | ProducerEpochStale => 403,
            NotFound(_) | StreamNotFound | ForkSourceNotFound | BucketNotFound
            | SnapshotNotFound(_) => 404,
            MethodNotAllowed { .. } => 405,
            RequestTimeout(_) => 408,
            StreamExists(_)
            | StreamClosed
            | ContentTypeMismatch(_)
            | StreamSeqConflict
            | ProducerSeqGap
            | ForkSourceGone
            | BucketExists
            | BucketNotEmpty
            | SnapshotBeyondTail
            | SnapshotMismatch
            | SnapshotStale
            | SnapshotConflict
            | SnapshotInUse
            | RetentionBackwards
            | NoSnapshot
            | BeyondSnapshot => 409,
            StreamGone | OffsetTrimmed(_) => 410,
            RecordPreconditionFailed => 412,
            PayloadTooLarge(_) => 413,
            TooManyRequests { .. } => 429,
            UnsupportedEncoding | EncodingNotAccepted | UnsupportedCharset => 415,
            HeaderTooLarge => 431,
            StorageFault(_) => 500,
            BadGateway(_) => 502,
            NotImplemented(_) => 501,
            Misdirected { .. } => 421,
            Unavailable(_) | Fenced | NotServed { .. } => 503,
            InsufficientStorage(_) => 507,
        }
    }

    /// The machine-readable code (first word of the body).
    pub fn code(&self) -> &'static str {
        use ApiError::*;
        match self {
            InvalidRequest(_) => "invalid_request",
            InvalidHeader(_) => "invalid_header",
            InvalidOffset(_) => "invalid_offset",
            InvalidStreamId(_) => "invalid_stream_id",
            InvalidBucketId => "invalid_bucket_id",
            InvalidJson | InvalidJsonLine(_) => "invalid_json",
            InvalidSettings(_) => "invalid_settings",
            TooManyRequests { .. } => "rate_limited",
            CorruptBody(_) => "corrupt_body",
            InvalidText => "invalid_text",
            EmptyJsonArray => "empty_json_array",
            EmptyBody(_) => "empty_body",
            MissingContentType => "missing_content_type",
            OffsetBeyondTail(_) | SnapshotBeyondTail => "offset_beyond_tail",
            OffsetNotAligned(_) => "offset_not_aligned",
            ProducerEpochSeq => "producer_epoch_seq",
            Unauthorized => "unauthorized",
            Forbidden => "forbidden",
            ProducerEpochStale => "producer_epoch_stale",
            NotFound(_) => "not_found",
            StreamNotFound | ForkSourceNotFound => "stream_not_found",
            BucketNotFound => "bucket_not_found",
            SnapshotNotFound(_) => "snapshot_not_found",
            MethodNotAllowed { .. } => "method_not_allowed",
            RequestTimeout(_) => "request_timeout",
            StreamExists(_) => "stream_exists",
            StreamClosed => "stream_closed",
            ContentTypeMismatch(_) => "content_type_mismatch",
            StreamSeqConflict => "stream_seq_conflict",
            ProducerSeqGap => "producer_seq_gap",
            StreamGone | ForkSourceGone => "stream_gone",
            BucketExists => "bucket_exists",
            BucketNotEmpty => "bucket_not_empty",
            SnapshotMismatch => "snapshot_mismatch",
            SnapshotStale => "snapshot_stale",
            SnapshotConflict => "snapshot_conflict",
            SnapshotInUse => "snapshot_in_use",
            RetentionBackwards => "retention_backwards",
            NoSnapshot => "no_snapshot",
            BeyondSnapshot => "beyond_snapshot",
            OffsetTrimmed(_) => "offset_trimmed",
            RecordPreconditionFailed => "record_precondition_failed",
            PayloadTooLarge(_) => "payload_too_large",
            UnsupportedEncoding | EncodingNotAccepted => "unsupported_encoding",
            UnsupportedCharset => "unsupported_charset",
            HeaderTooLarge => "header_too_large",
            NotImplemented(_) => "not_implemented",
            StorageFault(_) => "storage_fault",
            BadGateway(_) => "bad_gateway",
            Unavailable(_) => "unavailable",
            InsufficientStorage(_) => "insufficient_storage",
            Fenced => "fenced",
            NotServed { .. } => "not_served",
            Misdirected { .. } => "misdirected",
        }
    }

    /// The short plain-text reason after the code.
    pub fn reason(&self) -> Cow<'_, str> {
        use ApiError::*;
        Cow::Borrowed(match self {
            InvalidRequest(r)
            | InvalidHeader(r)
            | InvalidOffset(r)
            | InvalidStreamId(r)
            | EmptyBody(r)
            | OffsetBeyondTail(r)
            | OffsetNotAligned(r)
            | NotFound(r)
            | SnapshotNotFound(r)
            | RequestTimeout(r)
            | StreamExists(r)
            | ContentTypeMismatch(r)
            | OffsetTrimmed(r)
            | NotImplemented(r)
            | StorageFault(r) => r,
            MethodNotAllowed { reason, .. } => reason,
            PayloadTooLarge(r)
            | CorruptBody(r)
            | InvalidSettings(r)
            | Unavailable(r)
            | BadGateway(r)
            | InsufficientStorage(r) => r,
            TooManyRequests { limit, .. } => {
                return format!("the bucket's {limit} per second limit is reached; retry later")
                    .into()
            }
            InvalidJsonLine(line) => return format!("line {line} is not a JSON value").into(),
            NotServed { shard } => {
                return format!("lane {shard} is not served here right now; retry").into()
            }
            Misdirected {
                lane,
                owner: Some(owner),
            } => return format!("lane {lane} is served by {owner}").into(),
            Misdirected { lane, owner: None } => {
                return format!(
                    "lane {lane} is not served by this host; its owner is not known yet"
                )
                .into()
            }
            Fenced => "another server took this server's data over; it accepts no writes",
            InvalidBucketId => "bucket IDs are 4-64 characters of a-z, 0-9, _ and -",
            InvalidJson => "body is not a single JSON text",
            InvalidText => "text streams hold UTF-8 only and the body is not UTF-8",
            EmptyJsonArray => "an append of [] adds nothing",
            MissingContentType => "Content-Type is required",
            ProducerEpochSeq => "a new epoch must start at seq 0",
            Unauthorized => "authentication required",
            Forbidden => "not allowed",
            ProducerEpochStale => "stale producer epoch",
            StreamNotFound => "stream not found",
            ForkSourceNotFound => "fork source not found",
            BucketNotFound => "bucket not found",
            StreamClosed => "stream is closed",
            StreamSeqConflict => "Stream-Seq must increase",
            ProducerSeqGap => "producer sequence gap",
            ForkSourceGone => "fork source was deleted",
            BucketExists => "bucket already exists",
            BucketNotEmpty => "bucket still has streams",
            SnapshotBeyondTail => "offset is beyond the tail",
            SnapshotMismatch => "visible snapshot differs",
            SnapshotStale => "a newer snapshot is visible",
            SnapshotConflict => "a different snapshot is visible at this offset",
            SnapshotInUse => "the visible snapshot cannot be deleted",
            RetentionBackwards => "retention never moves back",
            NoSnapshot => "publish a snapshot before trimming",
            BeyondSnapshot => "retention cannot pass the snapshot",
            StreamGone => "stream was deleted",
            RecordPreconditionFailed => "record tail has moved",
            UnsupportedEncoding => "Content-Encoding must be gzip, deflate, zstd or identity",
            EncodingNotAccepted => "only appends take a compressed body",
            UnsupportedCharset => {
                "text streams hold UTF-8 only: use charset=utf-8, or application/octet-stream"
            }
            HeaderTooLarge => "request headers exceed 64 KiB",
        })
    }

    /// The error as a plain-text response; a handler may add headers describing the state.
    pub fn response(&self) -> Response {
        let text = format!("{}: {}\n", self.code(), self.reason());
        let mut resp = Response::new(self.status())
            .header("content-type", "text/plain; charset=utf-8")
            .header("cache-control", "no-store")
            .with_body(vec![Bytes::from(text)]);
        match self {
            ApiError::MethodNotAllowed { allow, .. } => resp.push("allow", *allow),
            ApiError::Unavailable(_) => resp.push("retry-after", "1"),
            ApiError::NotServed { shard } => {
                resp.push("retry-after", "1");
                resp.push("ursula-lane", shard.to_string());
            }
            ApiError::Misdirected { lane, owner } => {
                resp.push("ursula-lane", lane.to_string());
                if let Some(owner) = owner {
                    resp.push("ursula-lane-owner", owner.clone());
                }
            }
            ApiError::TooManyRequests {
                retry_after_secs, ..
            } => resp.push("retry-after", retry_after_secs.to_string()),
            ApiError::Unauthorized => resp.push("www-authenticate", "Bearer"),
            // The codings a request may use instead (RFC 7694 §3).
            ApiError::UnsupportedEncoding => resp.push("accept-encoding", "gzip, deflate, zstd"),
            ApiError::EncodingNotAccepted => resp.push("accept-encoding", "identity"),
            _ => {}
        }
        resp
    }

    /// The owner core of a stream could not run the request (shutdown, or its queue gone).
    pub fn owner_unavailable() -> ApiError {
        ApiError::Unavailable("owner core unavailable".into())
    }

    /// A lane the request needs is between hosts of a cluster: served by none right now.
    pub fn lanes_moving() -> ApiError {
        ApiError::Unavailable("lanes are moving between hosts; retry".into())
    }
}

/// What a handler returns: the response, or why the request was refused.
pub type Handled = Result<Response, Refusal>;

/// A refused request: why, and the headers that describe the state it was checked against
/// (the stream's tail, the producer's current epoch). `?` turns an [`ApiError`] or a
/// [`StorageError`] into one.
#[derive(Debug)]
pub struct Refusal {
    pub error: ApiError,
    state: Vec<(&'static str, String)>,
}

impl Refusal {
    /// Add a header describing the state the request was checked against.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Refusal {
        self.state.push((name, value.into()));
        self
    }

    /// The error response, with the state headers.
    pub fn response(self) -> Response {
        let mut resp = self.error.response();
        resp.headers.extend(self.state);
        resp
    }
}

impl crate::http::PushHeader for Refusal {
    fn push_header(&mut self, name: &'static str, value: String) {
        self.state.push((name, value));
    }
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Refusal {
        Refusal {
            error,
            state: Vec::new(),
        }
    }
}

impl From<StorageError> for Refusal {
    fn from(e: StorageError) -> Refusal {
        Refusal::from(ApiError::from(e))
    }
}

impl ApiError {
    /// This refusal, with a header describing the state it was checked against.
    pub fn header(self, name: &'static str, value: impl Into<String>) -> Refusal {
        Refusal::from(self).header(name, value)
    }
}

/// A compressed body that was refused: too large decoded, corrupt, or no room to decode it.
impl From<DecodeError> for ApiError {
    fn from(e: DecodeError) -> ApiError {
        match e {
            DecodeError::TooLarge { .. } => ApiError::PayloadTooLarge(e.to_string().into()),
            DecodeError::Corrupt { .. }
            | DecodeError::Truncated { .. }
            | DecodeError::TrailingBytes { .. } => ApiError::CorruptBody(e.to_string().into()),
            DecodeError::OverBudget | DecodeError::Start { .. } => {
                ApiError::Unavailable(e.to_string().into())
            }
        }
    }
}

/// A lane in the middle of moving: the client retries.
impl From<NotServed> for ApiError {
    fn from(e: NotServed) -> ApiError {
        ApiError::NotServed { shard: e.shard }
    }
}

impl From<NotServed> for Refusal {
    fn from(e: NotServed) -> Refusal {
        Refusal::from(ApiError::from(e))
    }
}

impl From<NotServed> for Response {
    fn from(e: NotServed) -> Response {
        ApiError::from(e).response()
    }
}

impl From<ApiError> for Response {
    fn from(e: ApiError) -> Response {
        e.response()
    }
}

/// The one mapping of engine errors: what the client may act on gets its own status; a
/// fault of the server's disk gets a fixed reason, and its details go to the log.
impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> ApiError {
        match e {
            StorageError::NoSpace => ApiError::InsufficientStorage("disk full".into()),
            StorageError::NoSpaceUnarchived(lag) => {
                ApiError::InsufficientStorage(format!("disk full; {lag}").into())
            }
            StorageError::TooLarge => ApiError::PayloadTooLarge("too large".into()),
            StorageError::Busy => ApiError::Unavailable("write queue full; retry shortly".into()),
            StorageError::Io(e) => {
                tracing::warn!("storage i/o error answered 503: {e}");
                ApiError::Unavailable("storage i/o error; retry shortly".into())
            }
            StorageError::Corrupt(what) => {
                tracing::error!("corrupt data on disk answered 500: {what}");
                ApiError::StorageFault("stored data failed its checksum")
            }
            StorageError::Failed(why) => {
                tracing::error!("write refused by a failed shard, answered 500: {why}");
                ApiError::StorageFault(
                    "storage failed; writes are refused until the server restarts",
                )
            }
            StorageError::NotInS3 { waited_ms } => ApiError::Unavailable(
                format!(
                    "not acknowledged: S3 did not take the write within {waited_ms} ms; retry \
                     (with producer headers a retry is not appended twice)"
                )
                .into(),
            ),
            StorageError::Fenced => ApiError::Fenced,
            StorageError::Stopped => {
                ApiError::Unavailable("the stream's lane is moving to another host; retry".into())
            }
            StorageError::Unrecoverable(why) => {
                tracing::error!("shard cannot be opened, answered 500: {why}");
                ApiError::StorageFault("storage cannot be opened")
            }
            StorageError::Internal(what) => {
                tracing::error!("internal storage error answered 500: {what}");
                ApiError::StorageFault("internal storage error")
            }
        }
    }
}

impl From<StorageError> for Response {
    fn from(e: StorageError) -> Response {
        ApiError::from(e).response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ursula_storage::{ArchiveLag, Corruption, LogFailure, SegmentNo};

    fn body(r: &Response) -> String {
        match &r.body {
            crate::http::Body::Parts(p) => p.iter().map(|b| String::from_utf8_lossy(b)).collect(),
            _ => String::new(),
        }
    }

    #[test]
    fn one_mapping_to_status_code_and_text() {
        let r = ApiError::StreamNotFound.response();
        assert_eq!(r.status, 404);
        assert_eq!(body(&r), "stream_not_found: stream not found\n");
        let r = ApiError::MethodNotAllowed {
            allow: "GET",
            reason: "method not allowed",
        }
        .response();
        assert_eq!(r.status, 405);
        assert!(r.headers.contains(&("allow", "GET".to_string())));
        let r = ApiError::from(StorageError::NoSpaceUnarchived(ArchiveLag {
            segments: 3,
            bytes: 384 << 20,
            oldest_sealed_secs: Some(12),
        }))
        .response();
        assert_eq!(r.status, 507);
        assert_eq!(
            body(&r),
            "insufficient_storage: disk full; archive lag: 3 sealed segments (384 MiB) are not \
             archived yet and cannot leave the local disk, the oldest sealed 12 s ago\n"
        );
        let r = ApiError::from(StorageError::Busy).response();
        assert_eq!(r.status, 503);
        assert!(r.headers.contains(&("retry-after", "1".to_string())));
        assert_eq!(body(&r), "unavailable: write queue full; retry shortly\n");
        // Faults retrying cannot fix are 500 without Retry-After, and keep the engine's
        // text (paths, offsets) out of the answer.
        let r = ApiError::from(StorageError::Corrupt(Corruption::RecordMoved {
            segment: SegmentNo::new(7),
            position: 4096,
        }))
        .response();
        assert_eq!(r.status, 500);
        assert!(!r.headers.iter().any(|(name, _)| *name == "retry-after"));
        assert_eq!(body(&r), "storage_fault: stored data failed its checksum\n");
        let r = ApiError::from(StorageError::Failed(LogFailure::os(5))).response();
        assert_eq!(r.status, 500);
        assert!(!body(&r).contains("Input/output"));
        let r = ApiError::from(StorageError::Internal("a bug")).response();
        assert_eq!(r.status, 500);
        assert!(!body(&r).contains("bug"));
        let r = ApiError::from(StorageError::Io(std::io::Error::other("/data/x"))).response();
        assert_eq!(r.status, 503);
        assert!(r.headers.contains(&("retry-after", "1".to_string())));
        assert!(!body(&r).contains("/data"));
        let r = ApiError::UnsupportedEncoding.response();
        assert_eq!(r.status, 415);
        assert!(r
            .headers
            .contains(&("accept-encoding", "gzip, deflate, zstd".to_string())));
        assert_eq!(
            body(&ApiError::InvalidJsonLine(2).response()),
            "invalid_json: line 2 is not a JSON value\n"
        );
        let r = ApiError::from(DecodeError::TooLarge { limit: 32 << 20 }).response();
        assert_eq!(r.status, 413);
        assert_eq!(
            body(&r),
            "payload_too_large: decompressed body exceeds 32 MiB\n"
        );
        let r = ApiError::from(DecodeError::Truncated {
            coding: ursula_protocol::headers::ContentCoding::Gzip,
        })
        .response();
        assert_eq!(r.status, 400);
        assert_eq!(
            body(&r),
            "corrupt_body: gzip body ends inside its compressed data\n"
        );
        // The same code can belong to two refusals with different statuses.
        assert_eq!(ApiError::SnapshotBeyondTail.status(), 409);
        assert_eq!(ApiError::OffsetBeyondTail("x").status(), 400);
        assert_eq!(ApiError::ForkSourceGone.code(), ApiError::StreamGone.code());
        // A lane in the middle of moving: retry shortly.
        let r = ApiError::from(NotServed { shard: 7 }).response();
        assert_eq!(r.status, 503);
        assert!(r.headers.contains(&("retry-after", "1".to_string())));
        assert_eq!(
            body(&r),
            "not_served: lane 7 is not served here right now; retry\n"
        );
    }
}
