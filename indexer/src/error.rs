//! The one error type of the indexer: every way a registration, a query, ingest, a commit
//! or the process's start-up can fail.
//!
//! Variants say what failed, not where it is answered: the HTTP layer (`http`) picks the
//! status from the variant, and everything else logs it. Messages name what they concern
//! (an object key, a file, a JSON pointer) and end with their source's text, because the
//! logs print errors with `{}` alone; the source is kept as well for code that decides by
//! what failed underneath.

use std::path::PathBuf;
use std::sync::Arc;

use crate::store::StoreError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- What a client asked for is wrong (answered 4xx) --------------------------------
    /// A query parameter that does not parse or lies out of range.
    #[error("{0}")]
    BadQuery(String),
    /// A registration's `stream_url` that is not an absolute http(s) URL.
    #[error("{0}")]
    InvalidUrl(&'static str),
    /// An extractor without a time pointer.
    #[error("extract.time needs at least one pointer")]
    NoTimePointer,
    /// A JSON pointer of an extractor that does not parse.
    #[error("invalid JSON pointer {pointer:?}: {reason}")]
    InvalidPointer {
        pointer: String,
        reason: &'static str,
    },
    #[error("give either extract or timestamp_field, not both")]
    ExtractTwice,
    /// A registration of an id that exists with other settings.
    #[error("index {id} is already registered with different settings")]
    RegisteredDifferently { id: String },
    /// A registration of a stream another index follows.
    #[error("stream is already indexed as {other}")]
    StreamIndexed { other: String },
    /// A registration whose namespace was unregistered and is not purged yet.
    #[error("namespace is retired; try again later")]
    NamespaceRetired,
    /// Resuming an index whose source stream is gone.
    #[error("the source stream is gone; the index resumes by itself when it answers again")]
    SourceGone,

    // --- The source refused a registration's preflight (answered 422) -------------------
    #[error("source stream does not exist")]
    SourceMissing,
    #[error("source did not answer: {0}")]
    SourceUnreachable(#[source] Box<Error>),
    #[error(
        "source content type {content_type:?} is not application/json or application/x-ndjson"
    )]
    NotIndexable { content_type: String },

    // --- Talking to the source ----------------------------------------------------------
    #[error("bad request: {0}")]
    SourceUrl(#[source] http::Error),
    #[error("source request failed: {0}")]
    SourceRequest(#[source] hyper_util::client::legacy::Error),
    #[error("source request timed out")]
    SourceTimeout,
    #[error("source {request} answered {status}")]
    SourceStatus { request: &'static str, status: u16 },
    /// The source answered 401 or 403: no retry gets past it until the token changes
    /// (`server_token_file`, reloaded on SIGHUP) or the server's token file does.
    #[error("source {request} answered {status}: {why}")]
    SourceRefused {
        request: &'static str,
        status: u16,
        why: Refusal,
    },
    #[error("source body: {0}")]
    SourceBody(#[source] hyper::Error),
    #[error("source body timed out")]
    SourceBodyTimeout,
    #[error("array read is not UTF-8")]
    ArrayNotUtf8(#[source] std::str::Utf8Error),
    #[error("array read: {0}")]
    ArrayRead(#[source] sonic_rs::Error),

    // --- The object store (transient: answered 503) --------------------------------------
    /// A request to the object store failed.
    #[error("{key}: {source}")]
    Request {
        key: String,
        #[source]
        source: StoreError,
    },
    /// A pack upload several parts waited for failed (one error, shared by all of them).
    #[error("{key}: {source}")]
    PackUpload {
        key: String,
        #[source]
        source: Arc<StoreError>,
    },
    /// A compare-and-swap lost: someone else wrote `key` since it was read.
    #[error("{key}: changed under us")]
    Conflict { key: String },
    /// Compare-and-swaps on `key` lost again and again.
    #[error("{key}: too many compare-and-swap conflicts")]
    Contended { key: String },
    /// A document that was there a moment ago is gone (a concurrent delete).
    #[error("{key} disappeared")]
    Vanished { key: String },
    /// A batched write's flush task ended without an answer (the runtime is stopping).
    #[error("{what} flush was dropped")]
    FlushDropped { what: &'static str },

    // --- Corruption and broken invariants (answered 500, details only in the log) -------
    /// A JSON document in the store that does not parse.
    #[error("{key}: corrupt JSON: {source}")]
    CorruptJson {
        key: String,
        #[source]
        source: sonic_rs::Error,
    },
    /// A manifest that parses but breaks its rules, or is missing where it must exist.
    #[error("{key}: {reason}")]
    BadManifest { key: String, reason: String },
    /// A manifest or the catalog is gone where it must exist (it is created before anything
    /// uses it, and deleted only after it is retired).
    #[error("{key} is missing")]
    Missing { key: String },
    /// A part a manifest names that is not in the store.
    #[error("part {key} is missing from the store")]
    MissingPart { key: String },
    /// A part the parquet reader or writer failed on.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A part that parses but is not laid out as parts are.
    #[error("part: {0}")]
    BadPart(&'static str),
    /// A part's schema is not the part schema.
    #[error("unexpected part schema {0:?}")]
    PartSchema(Vec<String>),
    /// A JSON document that could not be written out.
    #[error("encode JSON: {0}")]
    Encode(#[source] sonic_rs::Error),
    /// The metrics registry could not be rendered.
    #[error("render metrics: {0}")]
    Metrics(#[from] std::fmt::Error),

    // --- Start-up and configuration (the process exits) ---------------------------------
    #[error("{0}")]
    Config(&'static str),
    #[error("read {}: {source}", path.display())]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// The extra CA certificates for https sources (`--source-ca-file`).
    #[error("{}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{}: no certificates", path.display())]
    NoCertificates { path: PathBuf },
    #[error("tls: {0}")]
    Tls(#[source] rustls::Error),
    /// The token for the source server (`server_token_file`) cannot be read.
    #[error("server token file {}: {source}", path.display())]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The token file holds no usable token; `reason` never quotes the file.
    #[error("server token file {}: {reason}", path.display())]
    BadTokenFile { path: PathBuf, reason: &'static str },
    /// A socket or signal the process needs.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why the source refused a request (401 or 403), as far as the indexer can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the server requires a token; give the indexer one with server_token_file")]
    NoToken,
    #[error("the server does not accept the token of server_token_file")]
    TokenRejected,
    #[error("the token of server_token_file may not read this stream")]
    Forbidden,
}

impl Error {
    /// A failed request for `key`.
    pub(crate) fn request(key: impl Into<String>) -> impl FnOnce(StoreError) -> Error {
        let key = key.into();
        move |source| Error::Request { key, source }
    }

    /// A failed request for `key`, or [`Error::Conflict`] when it was a conditional write
    /// that lost.
    pub(crate) fn write(key: impl Into<String>) -> impl FnOnce(StoreError) -> Error {
        let key = key.into();
        move |source| match source {
            StoreError::PreconditionFailed => Error::Conflict { key },
            source => Error::Request { key, source },
        }
    }

    /// `key`'s manifest is not what it must be.
    pub(crate) fn bad_manifest(key: &str, reason: impl Into<String>) -> Error {
        Error::BadManifest {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}
