//! What a command names: a bucket, or a stream on one of the server's two surfaces, and the
//! request path of each.

use std::fmt;

use crate::error::Error;

/// A bucket or a stream, as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Bucket(String),
    Stream(StreamName),
}

/// A stream: `BUCKET/STREAM` on the bucketed surface, or `/v1/stream/ID` on the compat
/// surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamName {
    Bucketed { bucket: String, stream: String },
    Compat(String),
}

const COMPAT_PREFIXES: [&str; 2] = ["/v1/stream/", "v1/stream/"];

impl Target {
    /// `BUCKET`, `BUCKET/STREAM` or `/v1/stream/ID`. Only the shape is checked here; the
    /// server judges the names (and says why it refuses one).
    pub fn parse(text: &str) -> Result<Target, Error> {
        if let Some(id) = COMPAT_PREFIXES.iter().find_map(|p| text.strip_prefix(p)) {
            if id.is_empty() {
                return Err(bad(text, "the stream ID after /v1/stream/ is empty"));
            }
            return Ok(Target::Stream(StreamName::Compat(id.to_string())));
        }
        match text.split_once('/') {
            None if text.is_empty() => Err(bad(text, "empty name")),
            None => Ok(Target::Bucket(text.to_string())),
            Some((bucket, stream)) if bucket.is_empty() || stream.is_empty() => {
                Err(bad(text, "expected BUCKET/STREAM"))
            }
            Some((_, stream)) if stream.contains('/') => Err(bad(
                text,
                "a stream in a bucket has no '/' in its name (compat streams are /v1/stream/ID)",
            )),
            Some((bucket, stream)) => Ok(Target::Stream(StreamName::Bucketed {
                bucket: bucket.to_string(),
                stream: stream.to_string(),
            })),
        }
    }

    /// The request path (percent-encoded).
    pub fn path(&self) -> String {
        match self {
            Target::Bucket(bucket) => format!("/{}", encode(bucket)),
            Target::Stream(s) => s.path(),
        }
    }
}

impl StreamName {
    /// A command that works on streams only refuses a bucket name.
    pub fn parse(text: &str) -> Result<StreamName, Error> {
        match Target::parse(text)? {
            Target::Stream(s) => Ok(s),
            Target::Bucket(_) => Err(bad(
                text,
                "expected a stream: BUCKET/STREAM or /v1/stream/ID",
            )),
        }
    }

    /// The stream's request path (percent-encoded; a compat ID keeps its `/`s).
    pub fn path(&self) -> String {
        match self {
            StreamName::Bucketed { bucket, stream } => {
                format!("/{}/{}", encode(bucket), encode(stream))
            }
            StreamName::Compat(id) => {
                let segments: Vec<String> = id.split('/').map(encode).collect();
                format!("/v1/stream/{}", segments.join("/"))
            }
        }
    }

    /// The path of a sub-resource of a bucketed stream (`attrs`, `append-batch`).
    pub fn sub_path(&self, resource: &str) -> Option<String> {
        match self {
            StreamName::Bucketed { .. } => Some(format!("{}/{resource}", self.path())),
            StreamName::Compat(_) => None,
        }
    }

    pub fn is_bucketed(&self) -> bool {
        matches!(self, StreamName::Bucketed { .. })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Bucket(b) => write!(f, "bucket {b}"),
            Target::Stream(s) => write!(f, "stream {s}"),
        }
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamName::Bucketed { bucket, stream } => write!(f, "{bucket}/{stream}"),
            StreamName::Compat(id) => write!(f, "/v1/stream/{id}"),
        }
    }
}

fn bad(name: &str, why: &'static str) -> Error {
    Error::BadName {
        name: name.to_string(),
        why,
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters: safe in a path segment
/// and in a query value.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucketed(bucket: &str, stream: &str) -> Target {
        Target::Stream(StreamName::Bucketed {
            bucket: bucket.into(),
            stream: stream.into(),
        })
    }

    #[test]
    fn names_map_to_the_surfaces() {
        assert_eq!(
            Target::parse("logs").ok(),
            Some(Target::Bucket("logs".into()))
        );
        assert_eq!(
            Target::parse("logs/app").ok(),
            Some(bucketed("logs", "app"))
        );
        let compat = Target::Stream(StreamName::Compat("a/b".into()));
        assert_eq!(Target::parse("/v1/stream/a/b").ok(), Some(compat.clone()));
        assert_eq!(Target::parse("v1/stream/a/b").ok(), Some(compat));
        for bad in ["", "/app", "logs/", "logs/a/b", "/v1/stream/"] {
            assert!(
                matches!(Target::parse(bad), Err(Error::BadName { .. })),
                "{bad}"
            );
        }
        assert!(StreamName::parse("logs").is_err());
    }

    #[test]
    fn paths_are_percent_encoded() {
        let t = bucketed("logs", "a b?c#d%");
        assert_eq!(t.path(), "/logs/a%20b%3Fc%23d%25");
        let compat = StreamName::Compat("team/ü x".into());
        assert_eq!(compat.path(), "/v1/stream/team/%C3%BC%20x");
        assert_eq!(compat.sub_path("attrs"), None);
        assert_eq!(
            StreamName::parse("logs/app")
                .ok()
                .and_then(|s| s.sub_path("attrs")),
            Some("/logs/app/attrs".to_string())
        );
        assert_eq!(Target::Bucket("logs".into()).to_string(), "bucket logs");
        assert_eq!(bucketed("logs", "app").to_string(), "stream logs/app");
    }
}
