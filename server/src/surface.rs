//! The two URL surfaces (P§1.1) and the storage key of each stream, bucket and surface.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `/v1/stream/{id}`: upstream Durable Streams profile (JSON rendered as arrays, forks).
    Compat,
    /// `/{bucket}/{stream}`: Ursula profile (NDJSON reads, extensions).
    Bucketed,
}

// Keys are built on every request: `concat` is one sized allocation and a copy, where
// `format!` cost ~500 instructions (callgrind).

/// Storage key of a compat-surface stream.
pub fn compat_key(id: &str) -> String {
    ["c/", id].concat()
}

/// Storage key of a bucketed stream.
pub fn bucketed_key(bucket: &str, stream: &str) -> String {
    ["b/", bucket, "/", stream].concat()
}

/// Storage key of a bucket's own record (kept in every shard).
pub fn bucket_key(bucket: &str) -> String {
    ["k/", bucket].concat()
}

/// The bucket of a bucketed stream's key (`b/{bucket}/{stream}`); `None` for other keys.
pub fn bucket_of(key: &str) -> Option<&str> {
    key.strip_prefix("b/")?
        .split_once('/')
        .map(|(bucket, _)| bucket)
}
