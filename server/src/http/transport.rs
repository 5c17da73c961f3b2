//! Writing to a connection: the transport a connection's bytes travel over (plain TCP or
//! TLS), and responses written with vectored writes so stream data is never copied.

use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::http::{write_head, Body, Response};

/// A connection's byte stream: plain TCP, or TLS over TCP. Connection serving is generic
/// over it, so the plain path compiles to exactly what it would be without TLS.
pub trait Transport: AsyncReadRent + AsyncWriteRent {
    /// Whether one `writev` sends all of its buffers. Plain TCP does, so stream data goes
    /// out without a copy. The TLS adapter sends only the first buffer per call, each as
    /// its own record, so for it the response is joined into one buffer first.
    const VECTORED: bool;
    /// Whether the bytes travel encrypted (the scheme a `Location` names).
    const TLS: bool;

    /// Give up the socket so another core can serve the connection, or get the transport
    /// back when it can't move (TLS keeps session state on this core).
    fn into_socket(self) -> Result<std::net::TcpStream, Self>
    where
        Self: Sized;
}

impl Transport for TcpStream {
    const VECTORED: bool = true;
    const TLS: bool = false;

    fn into_socket(self) -> Result<std::net::TcpStream, Self> {
        use std::os::fd::{FromRawFd, IntoRawFd};
        // monoio's `into_raw_fd` panics if an operation still holds the descriptor. Callers
        // move a connection only between requests, after the response was written and
        // before the next read was submitted, so no operation is in flight.
        let fd = self.into_raw_fd();
        // SAFETY: `fd` is an open TCP socket we own: `into_raw_fd` released monoio's
        // ownership without closing it, and nothing else refers to it.
        Ok(unsafe { std::net::TcpStream::from_raw_fd(fd) })
    }
}

impl Transport for monoio_rustls::ServerTlsStream<TcpStream> {
    const VECTORED: bool = false;
    const TLS: bool = true;

    fn into_socket(self) -> Result<std::net::TcpStream, Self> {
        Err(self)
    }
}

/// Write a complete (non-SSE) response. Returns whether the connection may be reused.
pub async fn write_response<S: Transport>(
    stream: &mut S,
    wbuf: &mut Vec<u8>,
    resp: Response,
    keep_alive: bool,
    head_request: bool,
) -> std::io::Result<bool> {
    wbuf.clear();
    write_head(wbuf, &resp, keep_alive, head_request);
    let reuse = keep_alive && !resp.close;
    let parts = match resp.body {
        Body::Parts(parts) if !head_request && resp.status != 204 && resp.status != 304 => parts,
        _ => Vec::new(),
    };
    write_parts(stream, wbuf, parts).await?;
    Ok(reuse)
}

/// Write `head` followed by `parts` with vectored writes; stream data is never copied.
pub async fn write_parts<S: Transport>(
    stream: &mut S,
    head: &mut Vec<u8>,
    parts: Vec<Bytes>,
) -> std::io::Result<()> {
    let small: usize = parts.iter().map(|p| p.len()).sum();
    if small <= 512 || !S::VECTORED {
        // Tiny bodies (error text, JSON brackets): one contiguous write is cheaper. Over
        // TLS the bytes are copied into records anyway, and one write fills whole records.
        for p in &parts {
            head.extend_from_slice(p);
        }
        let buf = std::mem::take(head);
        let (res, buf) = stream.write_all(buf).await;
        *head = buf;
        return res.map(|_| ());
    }
    let mut vecs = IoVecs::new(Bytes::from(std::mem::take(head)), parts);
    loop {
        let (res, v) = stream.writev(vecs).await;
        vecs = v;
        let n = res?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if vecs.advance(n) {
            return Ok(());
        }
    }
}

/// Owned buffers plus the iovec array pointing into them, for `writev`.
struct IoVecs {
    parts: Vec<Bytes>,
    /// First part not yet completely written.
    next: usize,
    iov: Vec<libc::iovec>,
}

impl IoVecs {
    fn new(head: Bytes, body: Vec<Bytes>) -> IoVecs {
        let mut parts = Vec::with_capacity(body.len() + 1);
        parts.push(head);
        parts.extend(body.into_iter().filter(|b| !b.is_empty()));
        let mut v = IoVecs {
            parts,
            next: 0,
            iov: Vec::new(),
        };
        v.rebuild();
        v
    }

    fn rebuild(&mut self) {
        // Linux caps one writev at IOV_MAX (1024) entries; the loop writes the rest later.
        self.iov.clear();
        self.iov.extend(
            self.parts[self.next..]
                .iter()
                .take(1024)
                .map(|b| libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                }),
        );
    }

    /// Consume `n` written bytes; true when everything has been written. Moves a cursor, so
    /// a response of many small pieces (envelope view) stays linear.
    fn advance(&mut self, mut n: usize) -> bool {
        while n > 0 && self.next < self.parts.len() {
            let first = &mut self.parts[self.next];
            if n >= first.len() {
                n -= first.len();
                self.next += 1;
            } else {
                let rest = first.slice(n..);
                *first = rest;
                n = 0;
            }
        }
        if self.next >= self.parts.len() {
            return true;
        }
        self.rebuild();
        false
    }
}

// SAFETY: the iovecs point into `parts`, whose Bytes are heap buffers that do not move while
// this value is owned by the runtime for the duration of the writev; `iov` is rebuilt
// whenever `parts` changes.
unsafe impl monoio::buf::IoVecBuf for IoVecs {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }
    fn read_iovec_len(&self) -> usize {
        self.iov.len()
    }
}
