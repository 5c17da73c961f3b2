//! Calls from one cluster host to another, for the few requests that need what another
//! host owns: a fork whose source is on its lane (and giving that source its reference
//! back), a bucket whose record is on its lane, and the parts of a bucket listing it holds.
//!
//! A call is one request on a fresh connection to the owner's advertised address, closed
//! after the answer: these calls are rare (a fork is created once), so a pool would only
//! hold sockets open. Hosts call each other over plain HTTP (a cluster with TLS on its
//! listeners is refused at start), presenting `cluster_token_file`'s token when the hosts
//! check tokens.

use std::time::Duration;

use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::core::Core;
use crate::http::ApiError;

/// The header that marks a request as one host's call to another.
pub const CALL_HEADER: &str = "ursula-peer";

/// How long a call may take from connecting to the answer's last byte.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer taken: a fork's inherited history travels in one.
const ANSWER_MAX: usize = 1 << 30;

/// An answer from another host.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The headers a relayed answer keeps: `content-type` and `location`.
    pub content_type: Option<String>,
    pub location: Option<String>,
    pub body: Bytes,
}

impl Answer {
    /// The refusal of the request that needed this call (to `path`) and got this answer
    /// instead of the one it wanted: a retry while lanes move (`421`, `503`), a `502` with
    /// the other host's reason otherwise.
    pub fn refusal(&self, path: &str) -> ApiError {
        match self.status {
            421 | 503 => ApiError::lanes_moving(),
            status => ApiError::BadGateway(
                format!(
                    "a host of the cluster refused {path} with {status}: {}",
                    String::from_utf8_lossy(&self.body).trim()
                )
                .into(),
            ),
        }
    }
}

/// Why a call to another host got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("{address} did not answer within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { address: String },
    #[error("the connection to {address} failed: {source}")]
    Io {
        address: String,
        source: std::io::Error,
    },
    #[error("{address} sent an answer that is not HTTP/1.1, or cut short")]
    Malformed { address: String },
}

impl CallError {
    /// The refusal of the request that needed the call: a retry, since the other host may
    /// be failing over. Logged here, as the client's answer does not say which host.
    pub fn refusal(&self) -> ApiError {
        tracing::warn!("a call to another host failed: {self}");
        ApiError::Unavailable("a host of the cluster cannot be reached; retry".into())
    }
}

/// `POST` `body` (JSON) to `path` on the host at `address`, and take its whole answer.
pub async fn post(
    core: &Core,
    address: &str,
    path: &str,
    body: Bytes,
) -> Result<Answer, CallError> {
    call(core, address, "POST", path, body).await
}

/// `method` `path` (with its query) with `body` on the host at `address`, and take its
/// whole answer.
pub async fn call(
    core: &Core,
    address: &str,
    method: &str,
    path: &str,
    body: Bytes,
) -> Result<Answer, CallError> {
    let exchange = exchange(core, address, method, path, body);
    let timeout = monoio::time::timeout(CALL_TIMEOUT, exchange);
    match timeout.await {
        Ok(answer) => answer,
        Err(_) => Err(CallError::Timeout {
            address: address.to_string(),
        }),
    }
}

async fn exchange(
    core: &Core,
    address: &str,
    method: &str,
    path: &str,
    body: Bytes,
) -> Result<Answer, CallError> {
    let io = |source| CallError::Io {
        address: address.to_string(),
        source,
    };
    let mut conn = TcpStream::connect(address)
        .await
        .map_err(|source| CallError::Connect {
            address: address.to_string(),
            source,
        })?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n{CALL_HEADER}: 1\r\n",
        body.len()
    );
    if let Some(token) = &core.config.cluster_token {
        head.push_str(&format!("authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    let (written, _) = conn.write_all(head.into_bytes()).await;
    written.map_err(io)?;
    let (written, _) = conn.write_all(body).await;
    written.map_err(io)?;
    let mut got: Vec<u8> = Vec::new();
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let (read, filled) = conn.read(buf).await;
        let n = read.map_err(io)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&filled[..n]);
        if got.len() > ANSWER_MAX {
            return Err(CallError::Malformed {
                address: address.to_string(),
            });
        }
        buf = filled;
        buf.clear();
    }
    parse_answer(&got).ok_or_else(|| CallError::Malformed {
        address: address.to_string(),
    })
}

/// The status and body of a whole answer read to the connection's end.
fn parse_answer(raw: &[u8]) -> Option<Answer> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = resp.parse(raw).ok()? else {
        return None;
    };
    let status = resp.code?;
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(|v| v.trim().to_string())
    };
    // Without a length (a 204), the answer ends with the connection.
    let body = match header("content-length") {
        Some(length) => raw.get(head_len..head_len.checked_add(length.parse().ok()?)?)?,
        None => raw.get(head_len..)?,
    };
    Some(Answer {
        status,
        content_type: header("content-type"),
        location: header("location"),
        body: Bytes::copy_from_slice(body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_its_status_and_exactly_its_body() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";
        let a = parse_answer(raw).expect("parsed");
        assert_eq!((a.status, &a.body[..]), (200, &b"hello"[..]));
    }

    #[test]
    fn a_cut_answer_is_refused() {
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhello").is_none());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\ncontent-le").is_none());
    }

    #[test]
    fn an_answer_without_a_length_ends_with_the_connection() {
        let a = parse_answer(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n");
        assert_eq!(a.map(|a| (a.status, a.body.len())), Some((204, 0)));
    }
}
