//! A minimal HTTP/1.1 keep-alive client on monoio: one connection, one request at a time.
//!
//! Requests are written with `Content-Length` bodies; responses are framed by
//! `Content-Length`, `Transfer-Encoding: chunked` (decoded with `ursula-protocol`'s
//! decoder) or connection close. Any I/O error, timeout or malformed response drops the
//! connection; the next request reconnects. Nothing is retried here: the caller decides
//! what an error means for its numbers.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use ursula_protocol::http1::ChunkedDecoder;

/// Bodies at most this large are copied behind the request head (one write); larger
/// ones are written as a second buffer without copying.
const INLINE_BODY_MAX: usize = 16 * 1024;
/// Response header block limit.
const MAX_HEAD: usize = 64 * 1024;
const READ_CHUNK: usize = 64 * 1024;
/// Most bytes read while looking for a response head. A larger read would pull in the
/// start of a big body only for it to be copied out again into the body buffer (a third
/// of the client's copying on 200 KiB replays); the rest of a `Content-Length` body is
/// read straight into its buffer.
const HEAD_READ: usize = 4 * 1024;

/// Why a request produced no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReqError {
    Connect(String),
    Io(String),
    Timeout,
    Protocol(String),
}

impl ReqError {
    /// Key under which this error is counted in reports.
    pub fn key(&self) -> &'static str {
        match self {
            ReqError::Connect(_) => "connect",
            ReqError::Io(_) => "io",
            ReqError::Timeout => "timeout",
            ReqError::Protocol(_) => "protocol",
        }
    }
}

impl fmt::Display for ReqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReqError::Connect(e) => write!(f, "connect: {e}"),
            ReqError::Io(e) => write!(f, "i/o: {e}"),
            ReqError::Timeout => write!(f, "timeout"),
            ReqError::Protocol(e) => write!(f, "bad response: {e}"),
        }
    }
}

/// The parts of a response the scenarios look at.
#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    pub next_offset: Option<String>,
    /// `Stream-Record-Next` (JSON record coordinates), if sent.
    pub record_next: Option<u64>,
    pub up_to_date: bool,
    pub closed: bool,
    pub body: Vec<u8>,
}

/// Request body.
pub enum Body<'a> {
    None,
    /// Sent with `Content-Length: 0`.
    Empty,
    Slice(&'a [u8]),
    Shared(Bytes),
}

impl Body<'_> {
    fn len(&self) -> Option<usize> {
        match self {
            Body::None => None,
            Body::Empty => Some(0),
            Body::Slice(s) => Some(s.len()),
            Body::Shared(b) => Some(b.len()),
        }
    }
}

pub struct Conn {
    addr: SocketAddr,
    host: String,
    stream: Option<TcpStream>,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    spare_body: Vec<u8>,
    timeout: Duration,
}

impl Conn {
    pub fn new(addr: SocketAddr, timeout: Duration) -> Conn {
        Conn {
            addr,
            host: addr.to_string(),
            stream: None,
            rbuf: Vec::with_capacity(READ_CHUNK),
            wbuf: Vec::with_capacity(1024),
            spare_body: Vec::new(),
            timeout,
        }
    }

    /// Hands a response body back so its allocation is reused by the next response.
    pub fn recycle(&mut self, mut body: Vec<u8>) {
        if body.capacity() > self.spare_body.capacity() {
            body.clear();
            self.spare_body = body;
        }
    }

    /// Closes the connection (the next request reconnects).
    pub fn reset(&mut self) {
        self.stream = None;
        self.rbuf.clear();
    }

    pub async fn get(&mut self, path: &str) -> Result<Response, ReqError> {
        self.request("GET", path, &[], Body::None).await
    }

    /// Sends one request and reads its response, bounded by the connection's timeout.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) -> Result<Response, ReqError> {
        let timeout = self.timeout;
        let res =
            match monoio::time::timeout(timeout, self.request_inner(method, path, headers, body))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(ReqError::Timeout),
            };
        match res {
            Ok((resp, keep)) => {
                if !keep {
                    self.reset();
                }
                Ok(resp)
            }
            Err(e) => {
                // Buffers moved into a cancelled operation are gone; start clean.
                self.reset();
                if self.rbuf.capacity() == 0 {
                    self.rbuf = Vec::with_capacity(READ_CHUNK);
                }
                Err(e)
            }
        }
    }

    async fn request_inner(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) -> Result<(Response, bool), ReqError> {
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr)
                .await
                .map_err(|e| ReqError::Connect(e.to_string()))?;
            let _ = s.set_nodelay(true);
            self.stream = Some(s);
            self.rbuf.clear();
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(ReqError::Connect("no connection".into()));
        };

        // Head (and small bodies) in one buffer.
        let mut w = std::mem::take(&mut self.wbuf);
        w.clear();
        w.extend_from_slice(method.as_bytes());
        w.push(b' ');
        w.extend_from_slice(path.as_bytes());
        w.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        w.extend_from_slice(self.host.as_bytes());
        w.extend_from_slice(b"\r\n");
        for (k, v) in headers {
            w.extend_from_slice(k.as_bytes());
            w.extend_from_slice(b": ");
            w.extend_from_slice(v.as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        if let Some(n) = body.len() {
            w.extend_from_slice(b"Content-Length: ");
            w.extend_from_slice(n.to_string().as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        w.extend_from_slice(b"\r\n");
        let mut big: Option<Bytes> = None;
        match body {
            Body::None | Body::Empty => {}
            Body::Slice(s) if s.len() <= INLINE_BODY_MAX => w.extend_from_slice(s),
            Body::Slice(s) => big = Some(Bytes::copy_from_slice(s)),
            Body::Shared(b) if b.len() <= INLINE_BODY_MAX => w.extend_from_slice(&b),
            Body::Shared(b) => big = Some(b),
        }
        let (r, w) = stream.write_all(w).await;
        self.wbuf = w;
        r.map_err(|e| ReqError::Io(e.to_string()))?;
        if let Some(b) = big {
            let (r, _) = stream.write_all(b).await;
            r.map_err(|e| ReqError::Io(e.to_string()))?;
        }

        let head_only = method == "HEAD";
        loop {
            let (head, consumed) = self.read_head().await?;
            if (100..200).contains(&head.status) {
                self.rbuf.drain(..consumed);
                continue;
            }
            self.rbuf.drain(..consumed);
            let mut resp = Response {
                status: head.status,
                next_offset: head.next_offset,
                record_next: head.record_next,
                up_to_date: head.up_to_date,
                closed: head.closed,
                body: Vec::new(),
            };
            let mut keep = !head.conn_close;
            let no_body = head_only || head.status == 204 || head.status == 304;
            if !no_body {
                let mut body = std::mem::take(&mut self.spare_body);
                body.clear();
                if head.chunked {
                    self.read_chunked(&mut body).await?;
                } else if let Some(n) = head.content_length {
                    self.read_exact_body(&mut body, n).await?;
                } else {
                    self.read_to_eof(&mut body).await?;
                    keep = false;
                }
                resp.body = body;
            }
            return Ok((resp, keep));
        }
    }

    /// Reads more bytes into `rbuf`, at most `max`; `Ok(0)` is EOF.
    async fn fill(&mut self, max: usize) -> Result<usize, ReqError> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(ReqError::Io("no connection".into()));
        };
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        let buf = std::mem::take(&mut self.rbuf);
        let (len, cap) = (buf.len(), buf.capacity());
        let end = cap.min(len.saturating_add(max));
        let (res, slice) = stream.read(buf.slice_mut(len..end)).await;
        self.rbuf = slice.into_inner();
        res.map_err(|e| ReqError::Io(e.to_string()))
    }

    async fn read_head(&mut self) -> Result<(Head, usize), ReqError> {
        loop {
            if !self.rbuf.is_empty() {
                if let Some(parsed) = parse_head(&self.rbuf)? {
                    return Ok(parsed);
                }
                if self.rbuf.len() > MAX_HEAD {
                    return Err(ReqError::Protocol("response head too large".into()));
                }
            }
            if self.fill(HEAD_READ).await? == 0 {
                return Err(ReqError::Io("connection closed before response".into()));
            }
        }
    }

    async fn read_exact_body(&mut self, body: &mut Vec<u8>, n: usize) -> Result<(), ReqError> {
        let have = self.rbuf.len().min(n);
        body.extend_from_slice(&self.rbuf[..have]);
        self.rbuf.drain(..have);
        if body.len() == n {
            return Ok(());
        }
        // Read the rest straight into the body buffer.
        body.reserve_exact(n - body.len());
        let Some(stream) = self.stream.as_mut() else {
            return Err(ReqError::Io("no connection".into()));
        };
        let mut buf = std::mem::take(body);
        while buf.len() < n {
            let len = buf.len();
            let (res, slice) = stream.read(buf.slice_mut(len..n)).await;
            buf = slice.into_inner();
            match res {
                Ok(0) => return Err(ReqError::Io("connection closed mid-body".into())),
                Ok(_) => {}
                Err(e) => return Err(ReqError::Io(e.to_string())),
            }
        }
        *body = buf;
        Ok(())
    }

    async fn read_chunked(&mut self, body: &mut Vec<u8>) -> Result<(), ReqError> {
        let mut dec = ChunkedDecoder::new();
        loop {
            let (used, done) = dec
                .feed(&self.rbuf, body)
                .map_err(|e| ReqError::Protocol(format!("chunked: {e}")))?;
            self.rbuf.drain(..used);
            if done {
                return Ok(());
            }
            if self.fill(READ_CHUNK).await? == 0 {
                return Err(ReqError::Io("connection closed mid-chunked-body".into()));
            }
        }
    }

    async fn read_to_eof(&mut self, body: &mut Vec<u8>) -> Result<(), ReqError> {
        loop {
            body.extend_from_slice(&self.rbuf);
            self.rbuf.clear();
            if self.fill(READ_CHUNK).await? == 0 {
                return Ok(());
            }
        }
    }
}

struct Head {
    status: u16,
    content_length: Option<usize>,
    chunked: bool,
    conn_close: bool,
    next_offset: Option<String>,
    record_next: Option<u64>,
    up_to_date: bool,
    closed: bool,
}

/// Parses a response head; `Ok(None)` when incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, ReqError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let consumed = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ReqError::Protocol(e.to_string())),
    };
    let status = resp
        .code
        .ok_or_else(|| ReqError::Protocol("no status code".into()))?;
    let mut head = Head {
        status,
        content_length: None,
        chunked: false,
        conn_close: resp.version == Some(0),
        next_offset: None,
        record_next: None,
        up_to_date: false,
        closed: false,
    };
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| ReqError::Protocol(format!("non-UTF-8 value for {}", h.name)))?
            .trim();
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<usize>()
                .map_err(|_| ReqError::Protocol(format!("bad Content-Length {value:?}")))?;
            head.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                head.conn_close = true;
            } else if v.contains("keep-alive") {
                head.conn_close = false;
            }
        } else if name.eq_ignore_ascii_case("stream-next-offset") {
            head.next_offset = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("stream-record-next") {
            head.record_next = value.parse().ok();
        } else if name.eq_ignore_ascii_case("stream-up-to-date") {
            head.up_to_date = value.eq_ignore_ascii_case("true");
        } else if name.eq_ignore_ascii_case("stream-closed") {
            head.closed = value.eq_ignore_ascii_case("true");
        }
    }
    Ok(Some((head, consumed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_head_fields() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nStream-Next-Offset: 00000000000000000003\r\nstream-up-to-date: TRUE\r\n\r\nabc";
        let (h, n) = parse_head(raw).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.content_length, Some(3));
        assert_eq!(h.next_offset.as_deref(), Some("00000000000000000003"));
        assert!(h.up_to_date);
        assert!(!h.closed);
        assert!(!h.conn_close);
        assert_eq!(&raw[n..], b"abc");
    }

    #[test]
    fn partial_and_bad_heads() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        let (h, _) = parse_head(b"HTTP/1.0 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.conn_close);
    }
}
