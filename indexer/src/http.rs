//! The HTTP API (indexer.md §1): routing, parameter parsing and response bodies.
//! Errors are `{"error": "<text>"}` with 400 (bad request), 404 (unknown index),
//! 409 (conflicts, cannot resume), 415, 422 (source preflight), 503 with `Retry-After`
//! (the object store or the source failed, or is contended: asking again can succeed) or
//! 500 (a corrupt index or a broken invariant: a short reason only, the details go to the
//! log). [`status_for`] is the one place that decides which error is which.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;

use crate::coordinator::{valid_id, Coordinator, Lookup, RegisterBody};
use crate::error::Error;
use crate::index::{decode_cursor, encode_cursor, Index, Query, View};
use crate::manifest::{Skipped, Status};
use crate::part::Entry;
use crate::source::offset_token;

type Resp = Response<Full<Bytes>>;

const MAX_BODY: usize = 1 << 20;
const DEFAULT_LIMIT: usize = 1000;
const MAX_LIMIT: usize = 10_000;

pub async fn handle(
    co: Arc<Coordinator>,
    req: http::Request<Incoming>,
) -> Result<Resp, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let ct = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let resp = match (&method, segs.as_slice()) {
        (&Method::GET, ["livez"]) => empty(StatusCode::NO_CONTENT),
        (&Method::GET, ["readyz"]) => {
            if !co.ready.load(Ordering::Relaxed) {
                retry_later("catalog is not readable")
            } else if !co.loaded.load(Ordering::Acquire) {
                // Listening already (so /livez answers), still opening the indexes.
                let (open, total) = co.open_counts();
                retry_later(&format!("opening indexes: {open} of {total} open"))
            } else {
                empty(StatusCode::NO_CONTENT)
            }
        }
        (&Method::GET, ["metrics"]) => match co.shared.metrics.render() {
            Ok(text) => Response::builder()
                .status(StatusCode::OK)
                .header(
                    http::header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .body(Full::new(Bytes::from(text)))
                .unwrap_or_else(|_| empty(StatusCode::INTERNAL_SERVER_ERROR)),
            Err(e) => failure(&e),
        },
        (&Method::GET, ["v1", "indexes"]) => match co.list().await {
            Ok(regs) => json(StatusCode::OK, &regs),
            Err(e) => failure(&e),
        },
        (m, ["v1", "indexes", id]) if m == Method::PUT => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large")),
            };
            register(&co, id, &ct, &body).await
        }
        (m, ["v1", "indexes", id]) if m == Method::DELETE => {
            if !valid_id(id) {
                error(StatusCode::BAD_REQUEST, "invalid index id")
            } else {
                match co.unregister(id).await {
                    Ok(true) => empty(StatusCode::NO_CONTENT),
                    Ok(false) => error(StatusCode::NOT_FOUND, "unknown index"),
                    Err(e) => failure(&e),
                }
            }
        }
        (&Method::GET, ["v1", "indexes", id, "events"]) => match lookup(&co, id).await {
            Ok(ix) => {
                let started = std::time::Instant::now();
                let r = events(&ix, &query).await;
                co.shared
                    .metrics
                    .query_seconds
                    .observe(started.elapsed().as_secs_f64());
                r
            }
            Err(r) => r,
        },
        (&Method::GET, ["v1", "indexes", id, "status"]) => match lookup(&co, id).await {
            Ok(ix) => status(&ix),
            Err(r) => r,
        },
        (&Method::POST, ["v1", "indexes", id, "status", "resume"]) => match lookup(&co, id).await {
            Ok(ix) => match ix.resume().await {
                Ok(()) => status(&ix),
                Err(e) => failure(&e),
            },
            Err(r) => r,
        },
        (_, ["livez"] | ["readyz"] | ["metrics"] | ["v1", "indexes", ..]) => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => error(StatusCode::NOT_FOUND, "not found"),
    };
    Ok(resp)
}

async fn lookup(co: &Arc<Coordinator>, id: &str) -> Result<Arc<Index>, Resp> {
    if !valid_id(id) {
        return Err(error(StatusCode::BAD_REQUEST, "invalid index id"));
    }
    match co.lookup(id).await {
        Lookup::Open(ix) => return Ok(ix),
        Lookup::Opening => return Err(still_opening(id)),
        Lookup::Failed(e) => return Err(failure(&e)),
        Lookup::Unknown => {}
    }
    // Registered through another worker a moment ago?
    let _ = co.sync(true).await;
    match co.lookup(id).await {
        Lookup::Open(ix) => Ok(ix),
        Lookup::Opening => Err(still_opening(id)),
        Lookup::Failed(e) => Err(failure(&e)),
        Lookup::Unknown => Err(error(StatusCode::NOT_FOUND, "unknown index")),
    }
}

fn still_opening(id: &str) -> Resp {
    retry_later(&format!("index {id} is still opening"))
}

/// 503 with `Retry-After: 1`: the request is fine, this worker cannot answer it yet.
fn retry_later(why: &str) -> Resp {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, why);
    r.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    r
}

async fn register(co: &Arc<Coordinator>, id: &str, ct: &str, body: &[u8]) -> Resp {
    if !valid_id(id) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid index id: use 1-122 of a-z, 0-9, '-' and '_'",
        );
    }
    let base = ct.split(';').next().unwrap_or("").trim();
    if !base.is_empty() && !base.eq_ignore_ascii_case("application/json") {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "body must be application/json",
        );
    }
    let parsed: RegisterBody = match sonic_rs::from_slice(body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("invalid registration body: {e}"),
            )
        }
    };
    match co.register(id, parsed).await {
        Ok(reg) => json(StatusCode::CREATED, &reg),
        Err(e) => failure(&e),
    }
}

// ---------------------------------------------------------------------------------------
// Errors

/// The status an error is answered with: what the client can do about it. A client's
/// mistake is 4xx; a failure that asking again can get past (the object store or the
/// source failing, compare-and-swaps contended) is 503; a corrupt index, a broken
/// invariant or a bug is 500. No wildcard arm: a new variant must be placed here.
pub fn status_for(e: &Error) -> StatusCode {
    match e {
        Error::BadQuery(_)
        | Error::InvalidUrl(_)
        | Error::NoTimePointer
        | Error::InvalidPointer { .. }
        | Error::ExtractTwice => StatusCode::BAD_REQUEST,
        Error::RegisteredDifferently { .. }
        | Error::StreamIndexed { .. }
        | Error::NamespaceRetired
        | Error::SourceGone => StatusCode::CONFLICT,
        // Refused: asking again does not help until the token changes.
        Error::SourceMissing
        | Error::SourceUnreachable(_)
        | Error::NotIndexable { .. }
        | Error::SourceRefused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        Error::Request { .. }
        | Error::PackUpload { .. }
        | Error::Conflict { .. }
        | Error::Contended { .. }
        | Error::Vanished { .. }
        | Error::FlushDropped { .. }
        | Error::SourceRequest(_)
        | Error::SourceTimeout
        | Error::SourceStatus { .. }
        | Error::SourceBody(_)
        | Error::SourceBodyTimeout => StatusCode::SERVICE_UNAVAILABLE,
        Error::SourceUrl(_)
        | Error::ArrayNotUtf8(_)
        | Error::ArrayRead(_)
        | Error::CorruptJson { .. }
        | Error::BadManifest { .. }
        | Error::Missing { .. }
        | Error::MissingPart { .. }
        | Error::Parquet(_)
        | Error::BadPart(_)
        | Error::PartSchema(_)
        | Error::Encode(_)
        | Error::Metrics(_)
        | Error::Config(_)
        | Error::ConfigRead { .. }
        | Error::ConfigParse { .. }
        | Error::CaFile { .. }
        | Error::NoCertificates { .. }
        | Error::Tls(_)
        | Error::TokenFile { .. }
        | Error::BadTokenFile { .. }
        | Error::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The answer to a request that failed with `e`. A 4xx says what was wrong; a 5xx says
/// only what kind of failure it was, and its details (object keys, the store's own
/// message) go to the log.
fn failure(e: &Error) -> Resp {
    let status = status_for(e);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        tracing::warn!("request failed, retry later: {e}");
        let why = match e {
            Error::Conflict { .. } | Error::Contended { .. } | Error::Vanished { .. } => {
                "the index changed concurrently; try again"
            }
            Error::FlushDropped { .. } => "the worker is stopping; try again",
            Error::Request { .. } | Error::PackUpload { .. } => {
                "the object store is unavailable; try again"
            }
            _ => "the source is unavailable; try again",
        };
        retry_later(why)
    } else if status.is_server_error() {
        tracing::error!("request failed: {e}");
        error(status, "internal error")
    } else {
        error(status, &e.to_string())
    }
}

// ---------------------------------------------------------------------------------------
// Bodies

#[derive(Serialize)]
struct SourceBody<'a> {
    stream_url: &'a str,
    incarnation: Option<&'a str>,
}

#[derive(Serialize)]
struct CoverageBody {
    from: String,
    floor: String,
    through: String,
    durable: String,
    /// Extension: everything before this offset is queryable (in memory or durable).
    indexed: String,
    complete: bool,
    trimmed_bytes: u64,
}

#[derive(Serialize)]
struct EntryBody {
    t_ms: i64,
    t_end_ms: i64,
    offset: String,
    len: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<u64>,
}

#[derive(Serialize)]
struct EventsBody<'a> {
    source: SourceBody<'a>,
    coverage: CoverageBody,
    skipped: Skipped,
    entries: Vec<EntryBody>,
    next: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    indexed_through_record: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    durable_through_record: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    through_record: Option<u64>,
}

#[derive(Serialize)]
struct StatusBody<'a> {
    status: &'a Status,
    source: SourceBody<'a>,
    coverage: CoverageBody,
    skipped: Skipped,
    parts: usize,
    generation: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    restarted_from_incarnation: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    indexed_through_record: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    durable_through_record: Option<u64>,
}

fn coverage(view: &View, through: u64) -> CoverageBody {
    let m = &view.manifest;
    let trimmed = view.trimmed();
    CoverageBody {
        from: offset_token(m.indexed_from_offset),
        floor: offset_token(view.floor()),
        through: offset_token(through),
        durable: offset_token(m.durable_offset),
        indexed: offset_token(view.indexed()),
        complete: trimmed == 0,
        trimmed_bytes: trimmed,
    }
}

fn status(ix: &Index) -> Resp {
    let view = ix.view();
    let records = ix.reg.record_coordinates;
    let body = StatusBody {
        status: &view.manifest.status,
        source: SourceBody {
            stream_url: &ix.reg.stream_url,
            incarnation: ix.reg.incarnation.as_deref(),
        },
        coverage: coverage(&view, view.indexed()),
        skipped: view.skipped(),
        parts: view.manifest.parts.len(),
        generation: view.manifest.generation,
        restarted_from_incarnation: ix.reg.restarted_from_incarnation.as_deref(),
        indexed_through_record: if records { view.indexed_record() } else { None },
        durable_through_record: if records {
            view.manifest.durable_record
        } else {
            None
        },
    };
    json(StatusCode::OK, &body)
}

async fn events(ix: &Index, raw_query: &str) -> Resp {
    let q = match parse_query(raw_query) {
        Ok(q) => q,
        Err(e) => return failure(&e),
    };
    let r = match ix.query(&q).await {
        Ok(r) => r,
        Err(e) => return failure(&e),
    };
    let records = ix.reg.record_coordinates;
    let view = &r.view;
    let body = EventsBody {
        source: SourceBody {
            stream_url: &ix.reg.stream_url,
            incarnation: ix.reg.incarnation.as_deref(),
        },
        coverage: coverage(view, r.through),
        skipped: view.skipped(),
        entries: r.entries.iter().map(entry_body).collect(),
        next: r.next.map(encode_cursor),
        indexed_through_record: if records { view.indexed_record() } else { None },
        durable_through_record: if records {
            view.manifest.durable_record
        } else {
            None
        },
        through_record: if records {
            q.through_record.or(view.indexed_record())
        } else {
            None
        },
    };
    let mut resp = json(StatusCode::OK, &body);
    let h = resp.headers_mut();
    for (name, v) in [
        ("indexed-from-offset", view.manifest.indexed_from_offset),
        ("floor-offset", view.floor()),
        ("durable-offset", view.manifest.durable_offset),
        ("through-offset", r.through),
    ] {
        if let Ok(v) = http::HeaderValue::from_str(&offset_token(v)) {
            h.insert(name, v);
        }
    }
    resp
}

fn entry_body(e: &Entry) -> EntryBody {
    EntryBody {
        t_ms: e.t_ms,
        t_end_ms: e.t_end_ms,
        offset: offset_token(e.offset),
        len: e.len,
        record: e.record,
    }
}

fn parse_query(raw: &str) -> Result<Query, Error> {
    let bad = |why: &str| Error::BadQuery(why.to_string());
    let mut from = None;
    let mut until = None;
    let mut overlap = false;
    let mut limit = DEFAULT_LIMIT;
    let mut after = None;
    let mut through = None;
    let mut through_record = None;
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or_else(|| bad(&format!("{k}: bad percent-encoding")))?;
        match k {
            "from" => {
                from = Some(
                    crate::time::parse_query_time(&v)
                        .ok_or_else(|| bad("from: expected ms since the epoch or RFC 3339"))?,
                )
            }
            "until" => {
                until = Some(
                    crate::time::parse_query_time(&v)
                        .ok_or_else(|| bad("until: expected ms since the epoch or RFC 3339"))?,
                )
            }
            "match" => {
                overlap = match v.as_str() {
                    "start" => false,
                    "overlap" => true,
                    _ => return Err(bad("match must be start or overlap")),
                }
            }
            "limit" => {
                limit = v.parse().map_err(|_| bad("limit must be an integer"))?;
                if limit == 0 || limit > MAX_LIMIT {
                    return Err(bad(&format!("limit must be between 1 and {MAX_LIMIT}")));
                }
            }
            "after" => {
                after = Some(
                    decode_cursor(&v)
                        .ok_or_else(|| bad("after: expected a 32-hex-digit cursor"))?,
                )
            }
            "through" => {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("through must be an offset (digit string)"));
                }
                through = Some(v.parse().map_err(|_| bad("through is out of range"))?)
            }
            "through_record" => {
                through_record = Some(
                    v.parse()
                        .map_err(|_| bad("through_record must be an integer"))?,
                )
            }
            other => return Err(bad(&format!("unknown query parameter {other:?}"))),
        }
    }
    let from = from.ok_or_else(|| bad("from is required"))?;
    let until = until.ok_or_else(|| bad("until is required"))?;
    if from >= until {
        return Err(bad("from must be before until"));
    }
    Ok(Query {
        from,
        until,
        overlap,
        limit,
        after,
        through,
        through_record,
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Resp {
    match sonic_rs::to_vec(body) {
        Ok(b) => Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(b)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        Err(e) => failure(&Error::Encode(e)),
    }
}

fn error(status: StatusCode, msg: &str) -> Resp {
    #[derive(Serialize)]
    struct E<'a> {
        error: &'a str,
    }
    let body = sonic_rs::to_vec(&E { error: msg }).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params() {
        let q = parse_query(
            "from=2026-07-18T10:00:00Z&until=2026-07-18T11:00:00Z&limit=100&match=overlap",
        )
        .expect("ok");
        assert!(q.overlap);
        assert_eq!(q.limit, 100);
        assert!(parse_query("from=1&until=1").is_err());
        assert!(parse_query("from=1&until=2&limit=0").is_err());
        assert!(parse_query("from=1&until=2&limit=10001").is_err());
        assert!(parse_query("from=1&until=2&bogus=1").is_err());
        assert!(parse_query("until=2").is_err());
        assert!(parse_query("from=1&until=2&after=zz").is_err());
        let c = encode_cursor((1784370600100, 6630));
        assert_eq!(c, "8000019f74c698a400000000000019e6");
        assert_eq!(decode_cursor(&c), Some((1784370600100, 6630)));
        assert!(encode_cursor((-1, 0)) < encode_cursor((0, 0)));
    }

    #[test]
    fn a_bad_query_is_400_and_says_why() {
        let e = parse_query("from=1&until=2&limit=0").expect_err("limit 0");
        assert_eq!(status_for(&e), StatusCode::BAD_REQUEST);
        assert_eq!(e.to_string(), "limit must be between 1 and 10000");
    }

    /// The body of `r` (a `Full` body is ready at once).
    fn body(r: Resp) -> String {
        let collected = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(r.into_body().collect())
            .expect("body");
        String::from_utf8(collected.to_bytes().to_vec()).expect("utf-8")
    }

    #[test]
    fn client_errors_are_4xx_with_their_reason() {
        for (e, status) in [
            (Error::InvalidUrl("stream_url must have a host"), 400),
            (Error::ExtractTwice, 400),
            (Error::NoTimePointer, 400),
            (Error::NamespaceRetired, 409),
            (Error::SourceGone, 409),
            (Error::RegisteredDifferently { id: "a".into() }, 409),
            (Error::SourceMissing, 422),
            (
                Error::SourceUnreachable(Box::new(Error::SourceTimeout)),
                422,
            ),
        ] {
            let r = failure(&e);
            assert_eq!(r.status().as_u16(), status, "{e}");
            assert!(r.headers().get(http::header::RETRY_AFTER).is_none());
            assert!(body(r).contains(&e.to_string()), "{e}");
        }
    }

    #[test]
    fn transient_failures_are_503_with_retry_after_and_no_details() {
        let store = || crate::store::StoreError::Other("s3 get: secret-bucket is down".into());
        for e in [
            Error::Request {
                key: "indexes/x/CURRENT".into(),
                source: store(),
            },
            Error::PackUpload {
                key: "packs/p.pack".into(),
                source: Arc::new(store()),
            },
            Error::Conflict {
                key: "CATALOG".into(),
            },
            Error::Contended {
                key: "CATALOG".into(),
            },
            Error::Vanished {
                key: "CATALOG".into(),
            },
            Error::FlushDropped { what: "pack" },
            Error::SourceTimeout,
        ] {
            let r = failure(&e);
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{e}");
            assert_eq!(
                r.headers()
                    .get(http::header::RETRY_AFTER)
                    .map(|v| v.as_bytes()),
                Some(&b"1"[..])
            );
            let text = body(r);
            assert!(text.contains("try again"), "{text}");
            assert!(
                !text.contains("secret-bucket") && !text.contains("CATALOG"),
                "{text}"
            );
        }
    }

    #[test]
    fn corruption_is_500_with_a_generic_reason() {
        let corrupt = sonic_rs::from_str::<u32>("{").expect_err("not a number");
        for e in [
            Error::CorruptJson {
                key: "indexes/x/CURRENT".into(),
                source: corrupt,
            },
            Error::Missing {
                key: "indexes/x/CURRENT".into(),
            },
            Error::MissingPart {
                key: "indexes/x/parts/p.parquet".into(),
            },
            Error::BadPart("row group columns disagree in length"),
            Error::bad_manifest("indexes/x/CURRENT", "manifest watermarks out of order"),
        ] {
            let r = failure(&e);
            assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{e}");
            assert!(r.headers().get(http::header::RETRY_AFTER).is_none());
            assert_eq!(body(r), r#"{"error":"internal error"}"#);
        }
    }
}
