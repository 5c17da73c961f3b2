//! HTTP/1.1 request framing on byte buffers (P§4.1). The connection loop owns the
//! socket; these functions only decide what the bytes mean.

/// Request head limit; larger heads are answered `431` (P§4.7).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers per request; more is treated like an oversized head (`431`).
pub const MAX_HEADERS: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Put,
    Post,
    Delete,
    Options,
    Other(String),
}

impl Method {
    fn from_token(m: &str) -> Method {
        // Methods are case-sensitive (RFC 9110 §9.1).
        match m {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            other => Method::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Other(s) => s,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// No complete head yet; read more.
    Incomplete,
    /// Head over [`MAX_HEAD_BYTES`] or too many headers: `431`, then close.
    TooLarge,
    /// Malformed or ambiguous framing: `400`, then close.
    Bad(&'static str),
    /// Framing we do not implement (e.g. `Transfer-Encoding: gzip`): `501`, then close.
    NotImplemented,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    /// Raw request path before `?` (still percent-encoded).
    pub path: String,
    /// Raw query after `?` (without it; empty if none).
    pub query: String,
    /// Header names lower-cased, values trimmed, in arrival order.
    pub headers: Headers,
    pub version_minor: u8,
    pub body: BodyKind,
    pub expect_continue: bool,
    pub keep_alive: bool,
    /// Bytes of `buf` taken by the head; the body (or next request) starts here.
    pub head_len: usize,
}

/// A request's headers, names lower-cased and values trimmed, in arrival order. They share
/// one buffer, so a request's headers cost two allocations rather than two per header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    text: String,
    /// Per header: where its name starts, where its value starts (the name ends there), and
    /// where the value ends, in `text`.
    spans: Vec<[u32; 3]>,
}

impl Headers {
    /// Room for `headers` headers of `bytes` bytes in all.
    pub fn with_capacity(headers: usize, bytes: usize) -> Headers {
        Headers {
            text: String::with_capacity(bytes),
            spans: Vec::with_capacity(headers),
        }
    }

    /// Add a header; its name is lower-cased and its value trimmed.
    pub fn push(&mut self, name: &str, value: &str) {
        let start = self.text.len();
        self.text.push_str(name);
        self.text[start..].make_ascii_lowercase();
        let value_start = self.text.len();
        self.text.push_str(value.trim());
        // A request head is at most MAX_HEAD_BYTES (64 KiB), far below u32::MAX.
        self.spans
            .push([start as u32, value_start as u32, self.text.len() as u32]);
    }

    /// First value of a header; `name_lowercase` must already be lower case.
    pub fn get(&self, name_lowercase: &str) -> Option<&str> {
        self.iter()
            .find(|(n, _)| *n == name_lowercase)
            .map(|(_, v)| v)
    }

    /// Every header as (lower-cased name, trimmed value), in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.spans.iter().map(|&[n, v, end]| {
            (
                &self.text[n as usize..v as usize],
                &self.text[v as usize..end as usize],
            )
        })
    }
}

impl RequestHead {
    /// First value of a header; `name_lowercase` must already be lower case.
    pub fn header(&self, name_lowercase: &str) -> Option<&str> {
        self.headers.get(name_lowercase)
    }

    /// How many times a header occurs (case-insensitive name).
    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }
}

/// The refusal for a second occurrence of `name` (lower case), for headers that must
/// appear at most once: a server that takes the first and a proxy that takes the last would
/// disagree about who sent the request, what it holds, or where it ends. `None` for headers
/// that may repeat.
pub fn single_valued(name: &str) -> Option<&'static str> {
    Some(match name {
        "content-length" => "duplicate Content-Length",
        "host" => "duplicate Host",
        "authorization" => "duplicate Authorization",
        "content-type" => "duplicate Content-Type",
        _ if name.starts_with("stream-") => "duplicate Stream-* header",
        _ if name.starts_with("producer-") => "duplicate Producer-* header",
        _ => return None,
    })
}

/// Parses one request head from the start of `buf`.
///
/// Framing is strict on purpose: anything two HTTP parsers could read differently
/// (two `Content-Length`s, `Content-Length` with `Transfer-Encoding`, codings other
/// than plain `chunked`) is refused, since a proxy in front of us might frame it the
/// other way (request smuggling).
pub fn parse_request_head(buf: &[u8]) -> Result<RequestHead, HeadError> {
    let mut raw_headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw_headers);
    let head_len = head_length(req.parse(buf), buf.len())?;
    let method = Method::from_token(req.method.ok_or(HeadError::Bad("missing method"))?);
    let target = req.path.ok_or(HeadError::Bad("missing request target"))?;
    let version_minor = req.version.ok_or(HeadError::Bad("missing version"))?;

    let (path, query) = split_target(target, &method)?;

    let mut headers = Headers::with_capacity(req.headers.len(), head_len);
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| HeadError::Bad("header value is not valid UTF-8"))?;
        headers.push(h.name, value);
    }
    let framing = Framing::of(&headers, version_minor)?;
    let body = framing.body(version_minor)?;
    let expect_continue = framing.expect_continue && body != BodyKind::None;
    let keep_alive = framing.keep_alive;
    Ok(RequestHead {
        method,
        path,
        query,
        headers,
        version_minor,
        body,
        expect_continue,
        keep_alive,
        head_len,
    })
}

/// The length of a complete head from httparse's verdict on a buffer of `buffered`
/// bytes, or why there is none yet (or never will be).
fn head_length(
    parsed: Result<httparse::Status<usize>, httparse::Error>,
    buffered: usize,
) -> Result<usize, HeadError> {
    let head_len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(if buffered > MAX_HEAD_BYTES {
                HeadError::TooLarge
            } else {
                HeadError::Incomplete
            });
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Version) => return Err(HeadError::Bad("unsupported HTTP version")),
        Err(_) => {
            // A head that is merely cut short can still look malformed to httparse
            // only if it is also over the limit; report the size first.
            if buffered > MAX_HEAD_BYTES {
                return Err(HeadError::TooLarge);
            }
            return Err(HeadError::Bad("malformed request head"));
        }
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(HeadError::TooLarge);
    }
    Ok(head_len)
}

/// What the headers say about the message's framing and the connection.
struct Framing<'h> {
    content_length: Option<u64>,
    /// Every `Transfer-Encoding` value, in order.
    transfer_encodings: Vec<&'h str>,
    keep_alive: bool,
    expect_continue: bool,
}

impl<'h> Framing<'h> {
    /// Reads the framing headers, refusing duplicates of single-valued ones and an
    /// HTTP/1.1 request without `Host`.
    fn of(headers: &'h Headers, version_minor: u8) -> Result<Framing<'h>, HeadError> {
        let mut framing = Framing {
            content_length: None,
            transfer_encodings: Vec::new(),
            keep_alive: version_minor >= 1,
            expect_continue: false,
        };
        let mut host_count = 0usize;
        for (at, (name, value)) in headers.iter().enumerate() {
            if let Some(why) = single_valued(name) {
                if headers.iter().skip(at + 1).any(|(other, _)| other == name) {
                    return Err(HeadError::Bad(why));
                }
            }
            match name {
                "content-length" => framing.content_length = Some(parse_content_length(value)?),
                "transfer-encoding" => framing.transfer_encodings.push(value),
                "connection" => {
                    for token in value.split(',').map(str::trim) {
                        if token.eq_ignore_ascii_case("close") {
                            framing.keep_alive = false;
                        } else if token.eq_ignore_ascii_case("keep-alive") && version_minor == 0 {
                            framing.keep_alive = true;
                        }
                    }
                }
                // Only 100-continue is in use; RFC 9110 allows ignoring other
                // expectations instead of answering 417.
                "expect" if value.eq_ignore_ascii_case("100-continue") => {
                    framing.expect_continue = version_minor >= 1;
                }
                "host" => host_count += 1,
                _ => {}
            }
        }
        // "close" wins over "keep-alive" whatever their order.
        if headers.iter().any(|(n, v)| {
            n == "connection" && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
        }) {
            framing.keep_alive = false;
        }
        if version_minor >= 1 && host_count == 0 {
            return Err(HeadError::Bad("HTTP/1.1 requires a Host header"));
        }
        Ok(framing)
    }

    /// How the body is delimited: by `Content-Length`, or by plain `chunked` alone.
    fn body(&self, version_minor: u8) -> Result<BodyKind, HeadError> {
        if self.transfer_encodings.is_empty() {
            return Ok(match self.content_length {
                None | Some(0) => BodyKind::None,
                Some(n) => BodyKind::Length(n),
            });
        }
        if self.content_length.is_some() {
            return Err(HeadError::Bad(
                "Content-Length and Transfer-Encoding together",
            ));
        }
        if version_minor == 0 {
            return Err(HeadError::Bad("Transfer-Encoding in an HTTP/1.0 request"));
        }
        let codings: Vec<&str> = self
            .transfer_encodings
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        match codings.last() {
            Some(last) if last.eq_ignore_ascii_case("chunked") => {}
            // Without chunked last the body length is unknowable (RFC 9112 §6.3).
            _ => return Err(HeadError::Bad("chunked must be the final transfer coding")),
        }
        if codings.len() != 1 {
            return Err(HeadError::NotImplemented);
        }
        Ok(BodyKind::Chunked)
    }
}

fn parse_content_length(v: &str) -> Result<u64, HeadError> {
    const BAD: HeadError = HeadError::Bad("invalid Content-Length");
    if v.is_empty() || v.len() > 19 || !v.bytes().all(|c| c.is_ascii_digit()) {
        return Err(BAD);
    }
    v.parse().map_err(|_| BAD)
}

/// Splits the request target into raw path and query. Origin-form is the norm;
/// absolute-form is accepted (RFC 9112 §3.2.2 says servers MUST) by dropping the
/// authority; `*` only for OPTIONS.
fn split_target(target: &str, method: &Method) -> Result<(String, String), HeadError> {
    let rest = if target.starts_with('/') {
        target
    } else if target == "*" && *method == Method::Options {
        return Ok(("*".to_owned(), String::new()));
    } else if let Some(after_scheme) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        match after_scheme.find(['/', '?']) {
            Some(i) if after_scheme.as_bytes()[i] == b'/' => &after_scheme[i..],
            Some(i) => return Ok(("/".to_owned(), after_scheme[i + 1..].to_owned())),
            None => "/",
        }
    } else {
        return Err(HeadError::Bad("invalid request target"));
    };
    // Fragments are never sent by clients; if present they are not part of the query.
    // '#' and '?' are ASCII: the cuts are char boundaries.
    let rest = &rest[..memchr::memchr(b'#', rest.as_bytes()).unwrap_or(rest.len())];
    Ok(match memchr::memchr(b'?', rest.as_bytes()) {
        Some(i) => (rest[..i].to_owned(), rest[i + 1..].to_owned()),
        None => (rest.to_owned(), String::new()),
    })
}

/// Longest chunk-size line we accept (size + extensions), and total trailer bytes.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = MAX_HEAD_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading hex digits of the chunk size.
    Size {
        digits: u8,
    },
    /// After the size: optional whitespace and `;ext`, until CR.
    Ext,
    /// Expecting LF after the chunk-size line's CR.
    SizeLf,
    /// Inside chunk data.
    Data,
    /// Expecting CR then LF after chunk data.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a non-empty trailer line, until CR.
    TrailerLine,
    TrailerLf {
        last: bool,
    },
    Done,
}

/// Incremental decoder for `Transfer-Encoding: chunked` request bodies. Feed it any
/// slicing of the input; it consumes exactly the body (trailers included, ignored) and
/// leaves pipelined bytes after it untouched. The caller enforces the body-size limit
/// on `out.len()` between feeds.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    remaining: u64,
    line_len: usize,
    trailer_len: usize,
    /// Whether the current trailer line has had its `:` separator yet.
    trailer_colon: bool,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size { digits: 0 },
            remaining: 0,
            line_len: 0,
            trailer_len: 0,
            trailer_colon: false,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes from `input`, appending body bytes to `out`. Returns bytes consumed and
    /// whether the terminating chunk and trailers have been fully read.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, bool), &'static str> {
        let mut i = 0;
        while i < input.len() {
            let c = input[i];
            match self.state {
                ChunkState::Done => break,
                ChunkState::Size { digits } => {
                    if let Some(v) = hex_digit(c) {
                        if digits >= 16 {
                            return Err("chunk size too large");
                        }
                        // 16 hex digits fit u64 exactly; checked anyway for clarity.
                        self.remaining = self
                            .remaining
                            .checked_mul(16)
                            .and_then(|r| r.checked_add(u64::from(v)))
                            .ok_or("chunk size too large")?;
                        self.state = ChunkState::Size { digits: digits + 1 };
                        self.line_len += 1;
                        i += 1;
                    } else if digits == 0 {
                        return Err("invalid chunk size");
                    } else {
                        self.state = ChunkState::Ext;
                    }
                }
                ChunkState::Ext => {
                    i += 1;
                    self.line_len += 1;
                    if self.line_len > MAX_CHUNK_LINE {
                        return Err("chunk extension too long");
                    }
                    match c {
                        b'\r' => self.state = ChunkState::SizeLf,
                        b'\n' => return Err("bare LF in chunked body"),
                        0..=8 | 0x0a..=0x1f | 0x7f => return Err("invalid chunk extension"),
                        _ => {}
                    }
                }
                ChunkState::SizeLf => {
                    if c != b'\n' {
                        return Err("expected LF after chunk size");
                    }
                    i += 1;
                    self.line_len = 0;
                    self.state = if self.remaining == 0 {
                        ChunkState::TrailerStart
                    } else {
                        ChunkState::Data
                    };
                }
                ChunkState::Data => {
                    let avail = input.len() - i;
                    let take = usize::try_from(self.remaining).map_or(avail, |r| r.min(avail));
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    self.remaining -= take as u64;
                    if self.remaining == 0 {
                        self.state = ChunkState::DataCr;
                    }
                }
                ChunkState::DataCr => {
                    if c != b'\r' {
                        return Err("chunk data longer than its size");
                    }
                    i += 1;
                    self.state = ChunkState::DataLf;
                }
                ChunkState::DataLf => {
                    if c != b'\n' {
                        return Err("expected LF after chunk data");
                    }
                    i += 1;
                    self.state = ChunkState::Size { digits: 0 };
                }
                ChunkState::TrailerStart => {
                    i += 1;
                    self.count_trailer()?;
                    self.state = match c {
                        b'\r' => ChunkState::TrailerLf { last: true },
                        b'\n' => return Err("bare LF in chunked body"),
                        b':' => return Err("trailer field without a name"),
                        _ => {
                            self.trailer_colon = false;
                            ChunkState::TrailerLine
                        }
                    };
                }
                ChunkState::TrailerLine => {
                    i += 1;
                    self.count_trailer()?;
                    match c {
                        b'\r' if !self.trailer_colon => {
                            return Err("malformed trailer field (no ':')")
                        }
                        b'\r' => self.state = ChunkState::TrailerLf { last: false },
                        b'\n' => return Err("bare LF in chunked body"),
                        b':' => self.trailer_colon = true,
                        _ => {}
                    }
                }
                ChunkState::TrailerLf { last } => {
                    if c != b'\n' {
                        return Err("expected LF in trailer section");
                    }
                    i += 1;
                    self.state = if last {
                        ChunkState::Done
                    } else {
                        ChunkState::TrailerStart
                    };
                }
            }
        }
        Ok((i, self.state == ChunkState::Done))
    }

    fn count_trailer(&mut self) -> Result<(), &'static str> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILERS {
            return Err("trailer section too large");
        }
        Ok(())
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Standard reason phrase (RFC 9110); unknown codes get a generic class phrase.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => match status / 100 {
            1 => "Informational",
            2 => "Success",
            3 => "Redirection",
            4 => "Client Error",
            _ => "Server Error",
        },
    }
}

/// Appends `HTTP/1.1 <status> <reason>\r\n`.
pub fn write_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    // Three digits for every real status; clamp so the line stays well-formed.
    let s = status.clamp(100, 999);
    out.push(b'0' + (s / 100) as u8);
    out.push(b'0' + (s / 10 % 10) as u8);
    out.push(b'0' + (s % 10) as u8);
    out.push(b' ');
    out.extend_from_slice(reason_phrase(s).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `name: value\r\n`. CR, LF and NUL in either part are replaced by spaces so
/// that a value echoed from client input can never inject headers or split responses.
pub fn write_header(out: &mut Vec<u8>, name: &str, value: &str) {
    out.reserve(name.len() + value.len() + 4);
    push_field(out, name.as_bytes());
    out.extend_from_slice(b": ");
    push_field(out, value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `name: value\r\n` for a header that is all our own constants and numbers,
/// which never hold CR, LF or NUL: no check needed.
pub fn write_known_header(out: &mut Vec<u8>, name: &str, value: &str) {
    debug_assert!(!(name.bytes().chain(value.bytes())).any(|c| matches!(c, b'\r' | b'\n' | 0)));
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn push_field(out: &mut Vec<u8>, b: &[u8]) {
    // Every response writes several headers. CR, LF and NUL are all <= b'\r'; a fold
    // without an early exit is vectorised, where a byte loop that stops at the first
    // match is not (~100 instructions per field, callgrind).
    let suspect = b.iter().fold(false, |seen, &c| seen | (c <= b'\r'));
    if suspect && b.iter().any(|&c| matches!(c, b'\r' | b'\n' | 0)) {
        out.extend(b.iter().map(|&c| {
            if matches!(c, b'\r' | b'\n' | 0) {
                b' '
            } else {
                c
            }
        }));
    } else {
        out.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<RequestHead, HeadError> {
        parse_request_head(s.as_bytes())
    }

    #[test]
    fn simple_get() {
        let raw =
            "GET /v1/stream/a?offset=-1&live=sse HTTP/1.1\r\nHost: x\r\nX-Thing:  v  \r\n\r\nrest";
        let h = parse(raw).expect("ok");
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.path, "/v1/stream/a");
        assert_eq!(h.query, "offset=-1&live=sse");
        assert_eq!(h.version_minor, 1);
        assert_eq!(h.body, BodyKind::None);
        assert!(h.keep_alive);
        assert!(!h.expect_continue);
        assert_eq!(h.header("x-thing"), Some("v"));
        assert_eq!(h.header("host"), Some("x"));
        assert_eq!(h.header_count("HOST"), 1);
        assert_eq!(&raw.as_bytes()[h.head_len..], b"rest");
    }

    #[test]
    fn headers_keep_order_and_repeats_in_one_buffer() {
        let raw = "POST /s HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n";
        let h = parse(raw).expect("ok");
        let all: Vec<(&str, &str)> = h.headers.iter().collect();
        assert_eq!(
            all,
            [
                ("host", "x"),
                ("x-a", "1"),
                ("x-a", "2"),
                ("content-length", "0")
            ]
        );
        assert_eq!(h.header("x-a"), Some("1"), "the first of repeated headers");
        let mut built = Headers::default();
        built.push("Stream-Seq", " 7 ");
        assert_eq!(built.get("stream-seq"), Some("7"));
        assert_eq!(Headers::default().iter().count(), 0);
    }

    #[test]
    fn single_valued_headers_may_not_repeat_in_any_case() {
        for (name, why) in [
            ("Authorization", "duplicate Authorization"),
            ("Content-Type", "duplicate Content-Type"),
            ("Content-Length", "duplicate Content-Length"),
            ("Host", "duplicate Host"),
            ("Stream-TTL", "duplicate Stream-* header"),
            ("Stream-Seq", "duplicate Stream-* header"),
            ("Producer-Id", "duplicate Producer-* header"),
        ] {
            let second = name.to_ascii_uppercase();
            let raw = format!(
                "POST /s HTTP/1.1\r\nHost: x\r\n{name}: 1\r\nX-Between: y\r\n{second}: 1\r\n\r\n"
            );
            let raw = raw.replacen("Host: x\r\nHost: 1", "Host: x", 1);
            assert_eq!(parse(&raw), Err(HeadError::Bad(why)), "{raw:?}");
        }
        // HTTP/1.0 may leave Host out, but not send two.
        assert!(parse("GET / HTTP/1.0\r\n\r\n").is_ok());
        assert_eq!(
            parse("GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n"),
            Err(HeadError::Bad("duplicate Host"))
        );
        // Headers that are lists or informational may repeat.
        assert!(parse("GET / HTTP/1.1\r\nHost: x\r\nAccept: a\r\nAccept: b\r\n\r\n").is_ok());
    }

    #[test]
    fn methods() {
        for (m, want) in [
            ("GET", Method::Get),
            ("HEAD", Method::Head),
            ("PUT", Method::Put),
            ("POST", Method::Post),
            ("DELETE", Method::Delete),
            ("OPTIONS", Method::Options),
            ("PATCH", Method::Other("PATCH".into())),
            ("get", Method::Other("get".into())),
        ] {
            let h = parse(&format!("{m} / HTTP/1.1\r\nHost: x\r\n\r\n")).expect("ok");
            assert_eq!(h.method, want);
            assert_eq!(h.method.as_str(), m);
        }
    }

    #[test]
    fn incomplete_and_too_large() {
        assert_eq!(
            parse("GET / HTTP/1.1\r\nHost: x\r\n"),
            Err(HeadError::Incomplete)
        );
        assert_eq!(parse(""), Err(HeadError::Incomplete));
        let mut big = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES));
        assert_eq!(parse_request_head(&big), Err(HeadError::TooLarge));
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(parse_request_head(&big), Err(HeadError::TooLarge));
        let mut many = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..MAX_HEADERS + 1 {
            many.push_str(&format!("X-{i}: y\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(parse(&many), Err(HeadError::TooLarge));
    }

    #[test]
    fn malformed() {
        assert!(matches!(parse("GARBAGE\r\n\r\n"), Err(HeadError::Bad(_))));
        assert!(matches!(
            parse("GET / HTTP/2.0\r\nHost: x\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            parse("GET foo HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            parse_request_head(b"GET / HTTP/1.1\r\nHost: x\r\nX: \xff\xfe\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        // HTTP/1.1 without Host, or with two.
        assert!(matches!(
            parse("GET / HTTP/1.1\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
    }

    #[test]
    fn content_length_rules() {
        let h = parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello").expect("ok");
        assert_eq!(h.body, BodyKind::Length(5));
        let h = parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").expect("ok");
        assert_eq!(h.body, BodyKind::None);
        for bad in [
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        ] {
            assert!(matches!(parse(bad), Err(HeadError::Bad(_))), "{bad:?}");
        }
    }

    #[test]
    fn transfer_encoding_rules() {
        let h =
            parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").expect("ok");
        assert_eq!(h.body, BodyKind::Chunked);
        let h =
            parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked \r\n\r\n").expect("ok");
        assert_eq!(h.body, BodyKind::Chunked);
        // Smuggling vectors.
        assert!(matches!(
            parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            parse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert_eq!(
            parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Err(HeadError::NotImplemented)
        );
        assert_eq!(
            parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(HeadError::NotImplemented)
        );
    }

    #[test]
    fn keep_alive_and_expect() {
        assert!(
            !parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .expect("ok")
                .keep_alive
        );
        assert!(
            !parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: Keep-Alive, Close\r\n\r\n")
                .expect("ok")
                .keep_alive
        );
        assert!(!parse("GET / HTTP/1.0\r\n\r\n").expect("ok").keep_alive);
        assert!(
            parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .expect("ok")
                .keep_alive
        );
        assert!(
            parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n")
                .expect("ok")
                .keep_alive
        );
        let h = parse(
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-Continue\r\n\r\n",
        )
        .expect("ok");
        assert!(h.expect_continue);
        // Nothing to continue to without a body.
        let h = parse("PUT / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n").expect("ok");
        assert!(!h.expect_continue);
        let h = parse("PUT / HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n")
            .expect("ok");
        assert!(!h.expect_continue);
    }

    #[test]
    fn request_targets() {
        let h = parse("GET http://host:80/a/b?x=1 HTTP/1.1\r\nHost: host\r\n\r\n").expect("ok");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/a/b", "x=1"));
        let h = parse("GET http://host HTTP/1.1\r\nHost: host\r\n\r\n").expect("ok");
        assert_eq!(h.path, "/");
        let h = parse("OPTIONS * HTTP/1.1\r\nHost: host\r\n\r\n").expect("ok");
        assert_eq!(h.path, "*");
        assert!(matches!(
            parse("GET * HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        let h = parse("GET /a%2Fb?q=%20 HTTP/1.1\r\nHost: x\r\n\r\n").expect("ok");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/a%2Fb", "q=%20"));
        let h = parse("GET /p? HTTP/1.1\r\nHost: x\r\n\r\n").expect("ok");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/p", ""));
    }

    #[test]
    fn pipelined_requests() {
        let raw = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n";
        let a = parse_request_head(raw).expect("ok");
        assert_eq!(a.path, "/a");
        let b = parse_request_head(&raw[a.head_len..]).expect("ok");
        assert_eq!(b.path, "/b");
    }

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize), &'static str> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let (n, done) = d.feed(input, &mut out)?;
        assert!(done, "not done");
        Ok((out, n))
    }

    #[test]
    fn chunked_basic() {
        let (out, n) = decode_all(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT").expect("ok");
        assert_eq!(out, b"hello world");
        assert_eq!(n, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".len());
        let (out, _) = decode_all(b"0\r\n\r\n").expect("ok");
        assert!(out.is_empty());
        let (out, _) = decode_all(b"A\r\n0123456789\r\n0\r\n\r\n").expect("ok");
        assert_eq!(out, b"0123456789");
        let (out, _) = decode_all(b"00000a\r\n0123456789\r\n0000\r\n\r\n").expect("ok");
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn malformed_trailer_lines_are_rejected() {
        for body in [
            &b"3\r\nabc\r\n0\r\nnot a field line\r\n\r\n"[..],
            b"3\r\nabc\r\n0\r\n: no name\r\n\r\n",
        ] {
            let mut out = Vec::new();
            assert!(
                ChunkedDecoder::new().feed(body, &mut out).is_err(),
                "{body:?}"
            );
        }
    }

    #[test]
    fn chunked_extensions_and_trailers() {
        let (out, _) = decode_all(
            b"3;name=value\r\nabc\r\n3 ; x\r\ndef\r\n0;end\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
        )
        .expect("ok");
        assert_eq!(out, b"abcdef");
    }

    #[test]
    fn chunked_byte_by_byte() {
        let input = b"4\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nT: v\r\n\r\n";
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut done = false;
        for (k, b) in input.iter().enumerate() {
            let (n, dn) = d.feed(std::slice::from_ref(b), &mut out).expect("ok");
            assert_eq!(n, 1, "byte {k}");
            done = dn;
        }
        assert!(done && d.is_done());
        assert_eq!(out, b"Wikipedia in\r\n\r\nchunks.");
        // Once done, further input is not consumed.
        assert_eq!(d.feed(b"GET", &mut out), Ok((0, true)));
    }

    #[test]
    fn chunked_partial_returns_not_done() {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        assert_eq!(d.feed(b"5\r\nhel", &mut out), Ok((6, false)));
        assert_eq!(d.feed(b"lo\r\n0\r\n", &mut out), Ok((7, false)));
        assert_eq!(d.feed(b"\r\n", &mut out), Ok((2, true)));
        assert_eq!(out, b"hello");
    }

    #[test]
    fn chunked_errors() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b";ext\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloX\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\n",
            b"5\r\nhello\r\n0\r\nT: v\n\r\n",
            b"5\rX",
            b"11111111111111111\r\n",
            b"-1\r\n",
            b"+1\r\n",
            b"1\0\r\n",
        ] {
            let mut d = ChunkedDecoder::new();
            let mut out = Vec::new();
            assert!(d.feed(bad, &mut out).is_err(), "{bad:?}");
        }
        let mut long_ext = b"1;".to_vec();
        long_ext.extend(std::iter::repeat_n(b'a', MAX_CHUNK_LINE + 1));
        assert!(ChunkedDecoder::new()
            .feed(&long_ext, &mut Vec::new())
            .is_err());
    }

    #[test]
    fn chunked_max_size_ok() {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        // 16 hex digits is the largest accepted size; the data simply never arrives.
        assert_eq!(d.feed(b"ffffffffffffffff\r\nab", &mut out), Ok((20, false)));
        assert_eq!(out, b"ab");
    }

    #[test]
    fn status_lines() {
        for (code, line) in [
            (100, "HTTP/1.1 100 Continue\r\n"),
            (200, "HTTP/1.1 200 OK\r\n"),
            (201, "HTTP/1.1 201 Created\r\n"),
            (204, "HTTP/1.1 204 No Content\r\n"),
            (206, "HTTP/1.1 206 Partial Content\r\n"),
            (304, "HTTP/1.1 304 Not Modified\r\n"),
            (400, "HTTP/1.1 400 Bad Request\r\n"),
            (403, "HTTP/1.1 403 Forbidden\r\n"),
            (404, "HTTP/1.1 404 Not Found\r\n"),
            (405, "HTTP/1.1 405 Method Not Allowed\r\n"),
            (409, "HTTP/1.1 409 Conflict\r\n"),
            (410, "HTTP/1.1 410 Gone\r\n"),
            (412, "HTTP/1.1 412 Precondition Failed\r\n"),
            (413, "HTTP/1.1 413 Content Too Large\r\n"),
            (415, "HTTP/1.1 415 Unsupported Media Type\r\n"),
            (416, "HTTP/1.1 416 Range Not Satisfiable\r\n"),
            (431, "HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            (500, "HTTP/1.1 500 Internal Server Error\r\n"),
            (501, "HTTP/1.1 501 Not Implemented\r\n"),
            (503, "HTTP/1.1 503 Service Unavailable\r\n"),
            (507, "HTTP/1.1 507 Insufficient Storage\r\n"),
            (499, "HTTP/1.1 499 Client Error\r\n"),
        ] {
            let mut out = Vec::new();
            write_status_line(&mut out, code);
            assert_eq!(String::from_utf8(out).expect("ascii"), line);
        }
    }

    #[test]
    fn headers_written_safely() {
        let mut out = Vec::new();
        write_header(&mut out, "Stream-Next-Offset", "00000000000000000042");
        assert_eq!(out, b"Stream-Next-Offset: 00000000000000000042\r\n");
        let mut out = Vec::new();
        write_header(&mut out, "Location", "http://h/a\r\nSet-Cookie: x");
        assert_eq!(out, b"Location: http://h/a  Set-Cookie: x\r\n");
    }
}
