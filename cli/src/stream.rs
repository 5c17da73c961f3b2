//! What a command learns of a stream before it reads or writes one: its `HEAD`.

use ursula_protocol::content_type::{is_json, is_text};

use crate::client::{Client, Request};
use crate::error::Error;
use crate::target::StreamName;

/// A stream's metadata, as its `HEAD` reports it.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub content_type: String,
    /// `Stream-Next-Offset`: where the next append lands.
    pub next_offset: u64,
    /// `Stream-Retained-Offset`: the first offset retention kept.
    pub retained_offset: u64,
    /// `Stream-Incarnation`: changes when the stream is created again at the same name.
    pub incarnation: Option<String>,
    pub closed: bool,
    pub lifetime: Lifetime,
    /// The visible snapshot's offset and digest.
    pub snapshot: Option<(u64, String)>,
    /// The retained records `[first, next)` (JSON streams in a bucket).
    pub records: Option<(u64, u64)>,
}

/// When a stream expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifetime {
    Forever,
    /// Seconds after its last write.
    TtlSeconds(u64),
    /// At this RFC 3339 time.
    ExpiresAt(String),
}

/// How a stream's bytes are read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `application/json`: values, one record each; `records` when the stream numbers them
    /// (record coordinates, on the bucketed surface).
    Json { records: bool },
    /// `text/*`: UTF-8, read as lines.
    Text,
    /// Anything else: bytes.
    Binary,
}

impl StreamInfo {
    /// `HEAD` the stream.
    pub fn fetch(client: &mut Client, name: &StreamName) -> Result<StreamInfo, Error> {
        let resp = client.send(&Request::new("HEAD", name.path()))?;
        if resp.status != 200 {
            // A HEAD answer has no body, so no reason: a GET that reads nothing gives it.
            let read = Request::new("GET", format!("{}?offset=now", name.path()));
            let explained = match client.send(&read) {
                Ok(r) if r.status == resp.status => r,
                _ => resp,
            };
            return Err(client.refusal(&explained, &format!("stream {name}")));
        }
        let next_offset = resp
            .number("stream-next-offset")
            .ok_or_else(|| client.unexpected("a HEAD without Stream-Next-Offset"))?;
        let lifetime = match (resp.number("stream-ttl"), resp.header("stream-expires-at")) {
            (Some(ttl), _) => Lifetime::TtlSeconds(ttl),
            (None, Some(at)) => Lifetime::ExpiresAt(at.to_string()),
            (None, None) => Lifetime::Forever,
        };
        let snapshot = resp.number("stream-snapshot-offset").map(|at| {
            let digest = resp.header("stream-snapshot-digest").unwrap_or_default();
            (at, digest.to_string())
        });
        let records = resp
            .number("stream-record-first")
            .zip(resp.number("stream-record-next"));
        Ok(StreamInfo {
            content_type: resp
                .header("content-type")
                .unwrap_or("application/octet-stream")
                .to_string(),
            next_offset,
            retained_offset: resp.number("stream-retained-offset").unwrap_or(0),
            incarnation: resp.header("stream-incarnation").map(str::to_string),
            closed: resp.header("stream-closed") == Some("true"),
            lifetime,
            snapshot,
            records,
        })
    }

    pub fn kind(&self) -> Kind {
        if is_json(&self.content_type) {
            Kind::Json {
                records: self.records.is_some(),
            }
        } else if is_text(&self.content_type) {
            Kind::Text
        } else {
            Kind::Binary
        }
    }
}
