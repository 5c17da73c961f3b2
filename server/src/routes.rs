//! URL shapes (P§1.1): which resource a request path names.

use ursula_protocol::query::percent_decode;

use crate::limits::{
    BUCKETED_NAME_BYTES_MAX, BUCKET_ID_BYTES_MAX, BUCKET_ID_BYTES_MIN, COMPAT_ID_BYTES_MAX,
};
use crate::surface::{bucketed_key, compat_key, Surface};

#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /`: the bucket listing.
    Buckets,
    Stream {
        surface: Surface,
        key: String,
    },
    Bucket(String),
    BucketStreams(String),
    /// `POST /{bucket}/{stream}/append-batch` (extensions §6); the stream's storage key.
    AppendBatch(String),
    /// `GET|PUT /{bucket}/{stream}/attrs` (extensions §7); the stream's storage key.
    Attrs(String),
    /// `GET /{bucket}/{stream}/producers`: the stream's idempotent producers (this server's
    /// own addition); the stream's storage key.
    Producers(String),
    /// Snapshot, retention or bootstrap of a bucketed stream (extensions §3–§5).
    Resource {
        key: String,
        resource: Resource,
    },
    /// Any other path below a bucketed stream.
    StreamResource,
    NotFound,
    Invalid(&'static str),
    InvalidBucket,
}

pub fn route(raw_path: &str) -> Route {
    if let Some(rest) = raw_path.strip_prefix("/v1/stream/") {
        return match compat_id(rest) {
            Ok(id) if id == "__ds" || id.starts_with("__ds/") => Route::NotFound,
            Ok(id) => Route::Stream {
                surface: Surface::Compat,
                key: compat_key(&id),
            },
            Err(why) => Route::Invalid(why),
        };
    }
    if raw_path == "/" {
        return Route::Buckets;
    }
    let segments: Vec<&str> = raw_path
        .strip_prefix('/')
        .unwrap_or(raw_path)
        .split('/')
        .collect();
    let decoded: Result<Vec<String>, _> = segments.iter().map(|s| percent_decode(s)).collect();
    let Ok(decoded) = decoded else {
        return Route::Invalid("invalid percent-encoding in path");
    };
    let bucket = decoded.first().map(String::as_str).unwrap_or("");
    if bucket.starts_with("__") || bucket.is_empty() {
        return Route::NotFound;
    }
    if !valid_bucket_id(bucket) {
        return Route::InvalidBucket;
    }
    // A stream ID may not contain '/', even percent-encoded: check the raw segments.
    match segments.len() {
        1 => Route::Bucket(bucket.to_string()),
        2 if decoded[1] == "streams" => Route::BucketStreams(bucket.to_string()),
        2 if valid_stream_name(bucket, &decoded[1]) => Route::Stream {
            surface: Surface::Bucketed,
            key: bucketed_key(bucket, &decoded[1]),
        },
        2 => Route::Invalid("invalid stream id"),
        3 if matches!(decoded[2].as_str(), "append-batch" | "attrs" | "producers") => {
            if !valid_stream_name(bucket, &decoded[1]) {
                return Route::Invalid("invalid stream id");
            }
            let key = bucketed_key(bucket, &decoded[1]);
            match decoded[2].as_str() {
                "attrs" => Route::Attrs(key),
                "producers" => Route::Producers(key),
                _ => Route::AppendBatch(key),
            }
        }
        3 | 4 => match resource(&decoded[2..]) {
            Some(resource) if valid_stream_name(bucket, &decoded[1]) => Route::Resource {
                key: bucketed_key(bucket, &decoded[1]),
                resource,
            },
            Some(_) => Route::Invalid("invalid stream id"),
            None => Route::StreamResource,
        },
        _ => Route::StreamResource,
    }
}

/// P§1.2: 1–1024 bytes of UTF-8, no NUL, no empty, `.` or `..` segment.
fn compat_id(raw: &str) -> Result<String, &'static str> {
    // Most IDs are one plain segment: nothing to decode or split, and the checks below
    // reduce to these.
    if !raw.bytes().any(|b| matches!(b, b'%' | b'/' | 0)) {
        if raw.is_empty() || raw == "." || raw == ".." {
            return Err("empty, dot or NUL segment");
        }
        if raw.len() > COMPAT_ID_BYTES_MAX {
            return Err("longer than 1024 bytes");
        }
        return Ok(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len());
    for (i, seg) in raw.split('/').enumerate() {
        let seg = percent_decode(seg).map_err(|_| "bad percent-encoding")?;
        if i > 0 {
            out.push('/');
        }
        out.push_str(&seg);
    }
    // Checked on the decoded ID: an encoded '/' (`x%2F..%2Fy`) must not carry an empty or
    // dot segment past the rule.
    if out
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        || out.contains('\0')
    {
        return Err("empty, dot or NUL segment");
    }
    if out.len() > COMPAT_ID_BYTES_MAX {
        return Err("longer than 1024 bytes");
    }
    Ok(out)
}

/// Bucket identifiers: `^[a-z0-9_-]{4,64}$` (extensions §1.1).
pub fn valid_bucket_id(id: &str) -> bool {
    (BUCKET_ID_BYTES_MIN..=BUCKET_ID_BYTES_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Bucketed stream IDs (extensions §1.1): 1–122 bytes, no `/` (encoded or not), no NUL,
/// no `..`, and `{bucket}/{stream}` at most 122 bytes.
fn valid_stream_name(bucket: &str, name: &str) -> bool {
    !name.is_empty()
        && bucket.len() + 1 + name.len() <= BUCKETED_NAME_BYTES_MAX
        && !name.contains('/')
        && !name.contains('\0')
        && !name.contains("..")
        && name != "."
}

/// Which sub-resource of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// `/snapshot` (latest, or publish by `?record=`).
    Snapshot,
    /// `/snapshot/{offset}` (raw, still percent-encoded).
    SnapshotAt(String),
    /// `/retention` (by `?record=`).
    Retention,
    /// `/retention/{offset}`.
    RetentionAt(String),
    Bootstrap,
}

/// Whether a request path is a snapshot publish, which may carry up to 128 MiB.
pub fn is_snapshot_path(path: &str) -> bool {
    let mut segments = path.trim_start_matches('/').split('/');
    matches!(
        (segments.next(), segments.next(), segments.next()),
        (Some(b), Some(_), Some("snapshot")) if b != "v1"
    )
}

/// Route a bucketed sub-resource path (`rest` after `/{bucket}/{stream}/`).
pub fn resource(rest: &[String]) -> Option<Resource> {
    match rest {
        [r] if r == "snapshot" => Some(Resource::Snapshot),
        [r, o] if r == "snapshot" => Some(Resource::SnapshotAt(o.clone())),
        [r] if r == "retention" => Some(Resource::Retention),
        [r, o] if r == "retention" => Some(Resource::RetentionAt(o.clone())),
        [r] if r == "bootstrap" => Some(Resource::Bootstrap),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compat_paths() {
        assert_eq!(
            route("/v1/stream/abc"),
            Route::Stream {
                surface: Surface::Compat,
                key: "c/abc".into()
            }
        );
        assert_eq!(
            route("/v1/stream/a/b%20c"),
            Route::Stream {
                surface: Surface::Compat,
                key: "c/a/b c".into()
            }
        );
        assert_eq!(route("/v1/stream/__ds/jwks.json"), Route::NotFound);
        assert!(matches!(route("/v1/stream/a/../b"), Route::Invalid(_)));
        assert!(matches!(route("/v1/stream/a//b"), Route::Invalid(_)));
        assert!(matches!(route("/v1/stream/%00"), Route::Invalid(_)));
        // One plain segment takes compat_id's fast path; it must refuse the same IDs.
        for plain in ["/v1/stream/.", "/v1/stream/..", "/v1/stream/"] {
            assert!(matches!(route(plain), Route::Invalid(_)), "{plain}");
        }
        let long = format!("/v1/stream/{}", "a".repeat(1025));
        assert!(matches!(route(&long), Route::Invalid(_)));
        let longest = format!("/v1/stream/{}", "a".repeat(1024));
        assert!(matches!(route(&longest), Route::Stream { .. }));
        for encoded in ["x%2f..%2fy", "x%2F.%2Fy", "x%2f%2fy", "%2fx", "x%2F"] {
            let path = format!("/v1/stream/{encoded}");
            assert!(matches!(route(&path), Route::Invalid(_)), "{path}");
        }
    }

    #[test]
    fn bucketed_paths() {
        assert_eq!(route("/"), Route::Buckets);
        assert_eq!(route("//"), Route::NotFound);
        assert_eq!(route("/logs/streams"), Route::BucketStreams("logs".into()));
        assert_eq!(route("/logs-1"), Route::Bucket("logs-1".into()));
        assert_eq!(
            route("/logs/app"),
            Route::Stream {
                surface: Surface::Bucketed,
                key: "b/logs/app".into()
            }
        );
        assert_eq!(route("/v1"), Route::InvalidBucket);
        assert_eq!(route("/logs/a..b"), Route::Invalid("invalid stream id"));
        assert_eq!(route("/logs/a%2Fb"), Route::Invalid("invalid stream id"));
        assert_eq!(route("/__metrics"), Route::NotFound);
        assert_eq!(
            route("/logs/app/snapshot"),
            Route::Resource {
                key: "b/logs/app".into(),
                resource: Resource::Snapshot
            }
        );
        assert_eq!(route("/logs/app/unknown"), Route::StreamResource);
        assert_eq!(
            route("/logs/app/append-batch"),
            Route::AppendBatch("b/logs/app".into())
        );
        assert_eq!(route("/logs/app/attrs"), Route::Attrs("b/logs/app".into()));
        assert_eq!(
            route("/logs/app/producers"),
            Route::Producers("b/logs/app".into())
        );
        assert_eq!(
            route("/logs/a..b/attrs"),
            Route::Invalid("invalid stream id")
        );
        assert_eq!(route("/logs/app/attrs/x"), Route::StreamResource);
    }

    #[test]
    fn resources_and_body_limits() {
        let r = |v: &[&str]| resource(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(r(&["snapshot"]), Some(Resource::Snapshot));
        assert_eq!(
            r(&["snapshot", "5"]),
            Some(Resource::SnapshotAt("5".into()))
        );
        assert_eq!(r(&["retention"]), Some(Resource::Retention));
        assert_eq!(r(&["bootstrap"]), Some(Resource::Bootstrap));
        assert_eq!(r(&["bootstrap", "x"]), None);
        assert!(is_snapshot_path("/logs/app/snapshot/00000000000000000001"));
        assert!(is_snapshot_path("/logs/app/snapshot"));
        assert!(!is_snapshot_path("/logs/app"));
        assert!(!is_snapshot_path("/v1/stream/snapshot"));
    }
}
