//! The HTTP codec: request and response values that travel between cores, their
//! serialisation, the error vocabulary, and writing to a connection's transport. It knows
//! no feature of the protocol.

// Compressed request bodies, below the error vocabulary that maps their refusals.
pub mod coding;

pub mod error;
pub mod transport;

pub use error::{ApiError, Handled, Refusal};

use crate::tokens::BucketScope;

use std::sync::Arc;

use bytes::Bytes;
use ursula_protocol::http1::{
    write_header, write_known_header, write_status_line, Headers, Method,
};

/// A fully received request, ready to be handed to the core that owns its stream.
pub struct Request {
    pub method: Method,
    /// Raw path (still percent-encoded), without the query.
    pub path: String,
    pub query: String,
    /// Lower-cased names, trimmed values.
    pub headers: Headers,
    pub body: Bytes,
    /// The buckets the request's token is limited to (`None`: not limited, or no
    /// authentication); only the bucket listing needs it, everything else was refused on
    /// the head when outside them.
    pub buckets: Option<Arc<BucketScope>>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

pub enum Body {
    Empty,
    /// Stream data and framing, written with one vectored write.
    Parts(Vec<Bytes>),
    /// A chunked body the connection continues after the head (server-sent events).
    Chunked,
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
    /// Close the connection after this response.
    pub close: bool,
    /// Which CORS headers the response carries; set by the connection from the request's
    /// `Origin` and the configured origins.
    pub cors: Cors,
}

/// The CORS answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cors {
    /// No origin list configured: `Access-Control-Allow-Origin: *`, as the conformance
    /// suite expects.
    Any,
    /// The request's origin is in the configured list: reflected, with `Vary: Origin`.
    Allow(String),
    /// An origin list is configured and the request's origin is missing or not in it: no
    /// `Access-Control-*` headers at all (preflights included), but `Vary: Origin`.
    Deny,
}

impl Cors {
    /// The answer for a request with `origin` under the configured `allowed` list (`None`:
    /// any origin).
    pub fn decide(allowed: Option<&[String]>, origin: Option<&str>) -> Cors {
        let Some(allowed) = allowed else {
            return Cors::Any;
        };
        match origin {
            Some(o) if allowed.iter().any(|a| a.eq_ignore_ascii_case(o)) => {
                Cors::Allow(o.to_string())
            }
            _ => Cors::Deny,
        }
    }
}

impl Response {
    pub fn new(status: u16) -> Response {
        Response {
            status,
            // An append's answer carries 5-6 headers; growing from empty reallocated 3 times.
            headers: Vec::with_capacity(8),
            body: Body::Empty,
            close: false,
            cors: Cors::Any,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    pub fn push(&mut self, name: &'static str, value: impl Into<String>) {
        self.headers.push((name, value.into()));
    }

    pub fn with_body(mut self, parts: Vec<Bytes>) -> Response {
        self.body = Body::Parts(parts);
        self
    }

    pub fn body_len(&self) -> usize {
        match &self.body {
            Body::Parts(p) => p.iter().map(|b| b.len()).sum(),
            _ => 0,
        }
    }
}

/// Headers every response carries (P§4.2).
const COMMON: &[(&str, &str)] = &[
    ("x-content-type-options", "nosniff"),
    ("cross-origin-resource-policy", "cross-origin"),
];

/// Serialise the status line and headers. `head_request` suppresses the body but keeps the
/// length the body would have had only when a handler set it explicitly.
pub fn write_head(out: &mut Vec<u8>, resp: &Response, keep_alive: bool, head_request: bool) {
    write_status_line(out, resp.status);
    for (n, v) in COMMON {
        write_known_header(out, n, v);
    }
    let origin = match &resp.cors {
        Cors::Any => Some("*"),
        Cors::Allow(o) => Some(o.as_str()),
        Cors::Deny => None,
    };
    if let Some(origin) = origin {
        write_header(out, "access-control-allow-origin", origin);
        write_known_header(out, "access-control-expose-headers", "*");
    }
    if resp.cors != Cors::Any {
        write_known_header(out, "vary", "origin");
    }
    for (n, v) in &resp.headers {
        // A refused origin gets no CORS headers, the preflight's included.
        if origin.is_none() && n.starts_with("access-control-") {
            continue;
        }
        write_header(out, n, v);
    }
    match &resp.body {
        Body::Chunked => write_known_header(out, "transfer-encoding", "chunked"),
        _ if resp.status == 204 || resp.status == 304 || resp.status < 200 => {}
        _ if head_request => {}
        _ => {
            let mut len = itoa::Buffer::new();
            write_known_header(out, "content-length", len.format(resp.body_len()));
        }
    }
    if !keep_alive || resp.close {
        write_known_header(out, "connection", "close");
    }
    out.extend_from_slice(b"\r\n");
}

/// Something headers can be added to: a response, or a refusal that describes the state it
/// was checked against.
pub trait PushHeader {
    fn push_header(&mut self, name: &'static str, value: String);
}

impl PushHeader for Response {
    fn push_header(&mut self, name: &'static str, value: String) {
        self.headers.push((name, value));
    }
}
