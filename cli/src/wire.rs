//! HTTP/1.1 on the wire, the client's side: a request's bytes out, and a response read
//! whole, framed by `Content-Length`, chunked encoding (decoded by the protocol crate's
//! decoder, the one the server uses for requests) or the connection's close.
//!
//! Public because it is the workspace's one reader of HTTP responses: the server's
//! integration tests read the server's answers with it too.

use std::io::{self, BufRead, Read, Write};

use ursula_protocol::http1::ChunkedDecoder;

/// The largest response head read. The server's heads are a few hundred bytes.
const HEAD_BYTES_MAX: usize = 64 * 1024;
/// The largest response body read: above any answer of the server (8 MiB reads, 64 MiB
/// bootstraps), low enough that a wrong URL cannot fill the memory.
const BODY_BYTES_MAX: u64 = 256 << 20;

/// One response, whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names in lower case.
    headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// Every header, names in lower case, in the order they came.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first value of a header (`name` in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A header holding an unsigned integer (offsets, record numbers).
    pub fn number(&self, name: &str) -> Option<u64> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The server's plain-text reason of an error (`code: message`), on one line.
    pub fn reason(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        if text.is_empty() {
            return ursula_protocol::http1::reason_phrase(self.status).to_string();
        }
        text.lines().next().unwrap_or(text).to_string()
    }
}

/// Why no response was read.
#[derive(Debug)]
pub enum WireError {
    /// The connection closed before the first byte of an answer.
    Closed,
    Io(io::Error),
    /// What came back is not an HTTP/1.1 response.
    NotHttp(String),
}

impl From<WireError> for io::Error {
    fn from(e: WireError) -> io::Error {
        match e {
            WireError::Closed => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed before a response",
            ),
            WireError::Io(e) => e,
            WireError::NotHttp(why) => io::Error::new(io::ErrorKind::InvalidData, why),
        }
    }
}

/// Send a request's head and body.
pub fn write_request(out: &mut impl Write, head: &[u8], body: &[u8]) -> io::Result<()> {
    // One write for a small request: no segment with the head alone.
    if body.len() <= 16 * 1024 {
        let mut all = Vec::with_capacity(head.len() + body.len());
        all.extend_from_slice(head);
        all.extend_from_slice(body);
        out.write_all(&all)?;
    } else {
        out.write_all(head)?;
        out.write_all(body)?;
    }
    out.flush()
}

/// Read one response; also whether the connection can carry another request.
pub fn read_response<R: BufRead>(
    r: &mut R,
    head_request: bool,
) -> Result<(Response, bool), WireError> {
    loop {
        let (status, headers) = read_head(r)?;
        // An interim answer (100 Continue) is followed by the real one.
        if (100..200).contains(&status) {
            continue;
        }
        let value = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let mut reusable = !value("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let chunked = value("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let length = match value("content-length") {
            Some(v) => Some(
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| WireError::NotHttp(format!("bad Content-Length {v:?}")))?,
            ),
            None => None,
        };
        let has_body = !(head_request || status == 204 || status == 304);
        let mut body = Vec::new();
        match (has_body, chunked, length) {
            (false, _, _) => {}
            (true, true, _) => read_chunked(r, &mut body).map_err(|e| match e {
                BodyError::Io(e) => WireError::Io(e),
                BodyError::Bad(why) => WireError::NotHttp(why.into()),
            })?,
            (true, false, Some(n)) if n > BODY_BYTES_MAX => {
                return Err(WireError::NotHttp(format!("a body of {n} bytes")));
            }
            (true, false, Some(n)) => {
                body.resize(n as usize, 0);
                r.read_exact(&mut body).map_err(WireError::Io)?;
            }
            // Framed by the connection's close: it cannot carry another request.
            (true, false, None) => {
                r.by_ref()
                    .take(BODY_BYTES_MAX)
                    .read_to_end(&mut body)
                    .map_err(WireError::Io)?;
                reusable = false;
            }
        }
        return Ok((
            Response {
                status,
                headers,
                body,
            },
            reusable,
        ));
    }
}

/// Read one response head, an interim one (`100 Continue`) too, and none of a body: the
/// status and the headers, names in lower case.
pub fn read_head<R: BufRead>(r: &mut R) -> Result<(u16, Vec<(String, String)>), WireError> {
    let head = head_bytes(r).map_err(|e| match e {
        HeadError::Closed => WireError::Closed,
        HeadError::Io(e) => WireError::Io(e),
        HeadError::TooLarge => WireError::NotHttp("response head over 64 KiB".into()),
    })?;
    parse_head(&head).map_err(WireError::NotHttp)
}

enum HeadError {
    /// Closed before the first byte.
    Closed,
    Io(io::Error),
    TooLarge,
}

/// The bytes of a response head, through its blank line.
fn head_bytes<R: BufRead>(r: &mut R) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    loop {
        let start = head.len();
        let n = r
            .by_ref()
            .take((HEAD_BYTES_MAX - start) as u64 + 1)
            .read_until(b'\n', &mut head)
            .map_err(HeadError::Io)?;
        if n == 0 {
            return Err(if head.is_empty() {
                HeadError::Closed
            } else {
                HeadError::Io(io::ErrorKind::UnexpectedEof.into())
            });
        }
        if head.len() > HEAD_BYTES_MAX {
            return Err(HeadError::TooLarge);
        }
        if matches!(&head[start..], b"\r\n" | b"\n") {
            return Ok(head);
        }
    }
}

fn parse_head(head: &[u8]) -> Result<(u16, Vec<(String, String)>), String> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut slots);
    match parsed.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete response head".into()),
        Err(e) => return Err(format!("bad response head: {e}")),
    }
    let status = parsed.code.ok_or("no status code")?;
    let headers = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).trim().to_string(),
            )
        })
        .collect();
    Ok((status, headers))
}

enum BodyError {
    Io(io::Error),
    Bad(&'static str),
}

fn read_chunked<R: BufRead>(r: &mut R, body: &mut Vec<u8>) -> Result<(), BodyError> {
    let mut decoder = ChunkedDecoder::new();
    loop {
        let input = r.fill_buf().map_err(BodyError::Io)?;
        if input.is_empty() {
            return Err(BodyError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        let (used, done) = decoder.feed(input, body).map_err(BodyError::Bad)?;
        r.consume(used);
        if body.len() as u64 > BODY_BYTES_MAX {
            return Err(BodyError::Bad("a chunked body over 256 MiB"));
        }
        if done {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(raw: &[u8], head_request: bool) -> Result<(Response, bool), String> {
        let mut r = io::BufReader::new(raw);
        read_response(&mut r, head_request).map_err(|e| match e {
            WireError::NotHttp(why) => why,
            WireError::Closed => "closed".into(),
            WireError::Io(e) => e.to_string(),
        })
    }

    #[test]
    fn responses_are_framed_by_length_chunks_or_close() {
        let (r, reusable) = response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nStream-Next-Offset: 00000000000000000005\r\n\r\nhello",
            false,
        )
        .expect("length");
        assert_eq!(
            (r.status, r.body.as_slice(), reusable),
            (200, &b"hello"[..], true)
        );
        assert_eq!(r.number("stream-next-offset"), Some(5));
        let (r, reusable) = response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            false,
        )
        .expect("chunked");
        assert_eq!((r.body.as_slice(), reusable), (&b"abcde"[..], true));
        let (r, reusable) = response(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close",
            false,
        )
        .expect("close");
        assert_eq!((r.body.as_slice(), reusable), (&b"until close"[..], false));
        // A HEAD answer announces a length it does not send.
        let (r, _) = response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).expect("head");
        assert!(r.body.is_empty());
        let (r, _) = response(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 35\r\n\r\nstream_not_found: stream not found\n",
            false,
        )
        .expect("404");
        assert_eq!(r.reason(), "stream_not_found: stream not found");
        assert_eq!(response(b"", false).err().as_deref(), Some("closed"));
        assert!(response(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
    }
}
