//! One HTTP/1.1 connection: read a request, hand it to the owning core, write the answer,
//! repeat (keep-alive and pipelining). Limits are enforced before bodies are read.
//!
//! A plain-TCP keep-alive connection whose requests keep going to streams another core
//! owns moves to that core (after `MOVE_AFTER_REQUESTS` such requests in a row, between requests),
//! so its later requests skip the cross-core round trip. Clients that write one stream per
//! connection, the common telemetry shape, end up on the right core.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::buf::IoBufMut;
use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;
use ursula_protocol::content_type::is_active;
use ursula_protocol::headers::{parse_content_encoding, ContentCoding};
use ursula_protocol::http1::{
    parse_request_head, BodyKind, ChunkedDecoder, HeadError, Method, RequestHead,
};

use crate::admin::{self, Listener};
use crate::core::{ConnectionSlot, Core, Letter};
use crate::http::coding::{BodyDecoder, DecodeError};
use crate::http::transport::{write_response, Transport};
use crate::http::{ApiError, Cors, Request, Response};
use crate::limits::{
    BODY_BYTES_MAX, BODY_RESERVE_BYTES_MAX, MOVE_AFTER_REQUESTS, READ_CHUNK_BYTES, REFUSE_DRAIN,
    REFUSE_DRAIN_BYTES_MAX, SNAPSHOT_BODY_BYTES_MAX,
};
use crate::live::sse;
use crate::metrics::route_label;
use crate::router::{dispatch, Reply};
use crate::routes::is_snapshot_path;
use crate::tokens::BucketScope;

/// The two ends of a connection: the client's address, and the local one it connected to
/// (the base of a `Location` when no public URL is configured).
#[derive(Clone, Copy, Debug)]
pub struct Ends {
    pub peer: SocketAddr,
    pub local: Option<SocketAddr>,
}

pub async fn serve_connection<S: Transport>(
    core: Rc<Core>,
    stream: S,
    ends: Ends,
    listener: Listener,
) {
    let first_wait = core.config.header_timeout;
    serve_from(
        core,
        stream,
        ends,
        listener,
        Vec::with_capacity(READ_CHUNK_BYTES),
        // A new connection must start its first request within the head timeout.
        first_wait,
    )
    .await;
}

/// Serve a connection whose first `rbuf` bytes were already read (by another core, before
/// the connection moved here). One loop over the connection's requests, in one function
/// (about 130 lines) because what carries from one request to the next (the buffers, the
/// idle timeout, the core its requests go to) is its local state; each step it takes is a
/// function of its own.
async fn serve_from<S: Transport>(
    core: Rc<Core>,
    mut stream: S,
    ends: Ends,
    listener: Listener,
    mut rbuf: Vec<u8>,
    first_wait: Duration,
) {
    let mut wbuf: Vec<u8> = Vec::with_capacity(1024);
    // Moving needs a plain socket, another core, and a client connection (the admin
    // listener lives on core 0 only).
    let may_move = core.cores() > 1 && listener == Listener::Main && core.config.tls.is_none();
    // The foreign core the last requests went to, and how many in a row.
    let mut affinity: (usize, u32) = (core.index, 0);
    // How long the connection may wait for its next request's first byte; between
    // keep-alive requests, the idle timeout.
    let mut idle = first_wait;
    loop {
        let head = match read_head(&core, &mut stream, &mut rbuf, idle).await {
            HeadOutcome::Head(h) => h,
            HeadOutcome::Closed => return,
            HeadOutcome::Reject(mut resp) => {
                resp.cors = cors(&core, None);
                let _ = write_response(&mut stream, &mut wbuf, resp, false, false).await;
                return;
            }
        };
        idle = core.config.idle_timeout;
        rbuf.drain(..head.head_len);
        let mut keep_alive = head.keep_alive && !core.shutting_down();
        let is_head = head.method == Method::Head;
        let route = route_label(&head.path);
        let seen = Seen {
            method: head.method.clone(),
            route,
            timed: (head.method == Method::Post
                && matches!(route, "stream" | "compat_stream" | "append_batch")
                && core.metrics.time_this_append())
            .then(Instant::now),
            // Clock reads show in the profile of small appends; only the access log needs one.
            access: core
                .config
                .access_log
                .then(|| (head.path.clone(), Instant::now())),
        };
        let origin = core
            .config
            .cors_origins
            .is_some()
            .then(|| head.header("origin").map(str::to_string))
            .flatten();
        let endpoint = admin::endpoint(listener, &head.path);
        // Decided on the head alone: a refused request never gets `100 Continue`, and none
        // of its body is read or held.
        let admitted = match authenticate(&core, listener, endpoint, &head) {
            Err(refusal) => Err(refusal.response()),
            Ok(buckets) => match body_coding(&head, route) {
                Ok(coding) => Ok((BodyPermit::new(&core), coding, buckets)),
                Err(refusal) => Err(refusal.response()),
            },
        };
        let mut req_len = 0;
        // A refused request's body is not read; unless it is already here and can be
        // skipped, the connection closes after the answer.
        let mut unread_body = false;
        let (mut reply, owner, permit) = match admitted {
            Err(resp) => {
                unread_body = !skip_buffered_body(&mut rbuf, head.body);
                keep_alive &= !unread_body;
                core.inflight.set(core.inflight.get() + 1);
                (resp.into(), None, None)
            }
            Ok((mut permit, coding, buckets)) => {
                let read = match coding {
                    None => read_body(&core, &mut stream, &mut rbuf, &head, &mut permit).await,
                    Some(coding) => {
                        read_coded_body(&core, &mut stream, &mut rbuf, &head, &mut permit, coding)
                            .await
                    }
                };
                let body = match read {
                    Ok(b) => b,
                    Err(BodyError::Reject(mut resp)) => {
                        resp.cors = cors(&core, None);
                        let _ = write_response(&mut stream, &mut wbuf, resp, false, false).await;
                        return;
                    }
                    Err(BodyError::Refuse(resp)) => {
                        let mut resp = close(resp);
                        resp.cors = cors(&core, None);
                        if write_response(&mut stream, &mut wbuf, resp, false, false)
                            .await
                            .is_ok()
                        {
                            linger_close(&core, &mut stream).await;
                        }
                        return;
                    }
                    Err(BodyError::Closed) => return,
                };
                req_len = body.len();
                core.inflight.set(core.inflight.get() + 1);
                let request = Request {
                    method: head.method,
                    path: head.path,
                    query: head.query,
                    headers: head.headers,
                    body,
                    buckets,
                };
                let (reply, owner) = match endpoint {
                    Some(endpoint) => (
                        admin::handle(&core, listener, endpoint, &request)
                            .await
                            .into(),
                        None,
                    ),
                    None => dispatch(&core, request).await,
                };
                (reply, owner, Some(permit))
            }
        };
        drop(permit);
        finish_reply::<S>(&core, ends, &mut reply, origin.as_deref(), seen, req_len);
        let result = match reply {
            Reply::Sse(head, session) => {
                core.metrics.sse_started();
                let r = sse::run(&core, &mut stream, &mut wbuf, head, *session).await;
                core.metrics.sse_ended();
                r
            }
            Reply::Plain(resp) => {
                write_response(&mut stream, &mut wbuf, resp, keep_alive, is_head).await
            }
        };
        core.inflight.set(core.inflight.get() - 1);
        match result {
            Ok(true) if keep_alive => {}
            Ok(_) if unread_body => return linger_close(&core, &mut stream).await,
            _ => return,
        }
        affinity = next_affinity(&core, owner.filter(|_| may_move), affinity);
        if affinity.1 >= MOVE_AFTER_REQUESTS && !core.shutting_down() {
            // Between requests: the response is written and no read is pending.
            let socket = match stream.into_socket() {
                Ok(socket) => socket,
                Err(s) => {
                    stream = s;
                    affinity = (core.index, 0);
                    continue;
                }
            };
            core.metrics.connection_moved();
            adopt_on(&core, affinity.0, socket, ends, rbuf);
            return;
        }
    }
}

/// What the connection noted of a request before handing it on, for its metrics and its
/// access-log line.
struct Seen {
    method: Method,
    route: &'static str,
    /// When an append that is timed for `ursula_append_duration_seconds` arrived.
    timed: Option<Instant>,
    /// The path and when the request arrived, when the access log is on.
    access: Option<(String, Instant)>,
}

/// Headers every reply gets on its way out (CORS, an absolute `Location`, sandboxing of
/// active content), then the request's metrics and access-log line.
fn finish_reply<S: Transport>(
    core: &Core,
    ends: Ends,
    reply: &mut Reply,
    origin: Option<&str>,
    seen: Seen,
    req_len: usize,
) {
    let head = reply.head_mut();
    head.cors = cors(core, origin);
    absolute_location::<S>(core, ends.local, head);
    sandbox_active_content(head);
    let (status, resp_len) = (head.status, head.body_len());
    core.metrics
        .request(seen.route, &seen.method, status, req_len, resp_len);
    if let Some(arrived) = seen.timed.filter(|_| (200..300).contains(&status)) {
        core.metrics.append_took(arrived.elapsed());
    }
    if let Some((path, started)) = seen.access {
        access_log(
            core,
            ends.peer,
            &seen.method,
            &path,
            status,
            resp_len,
            started,
        );
    }
}

/// The foreign core a connection's requests went to last, and how many in a row, after a
/// request whose stream `owner` has (`None`: a request that names no stream, or a
/// connection that may not move).
fn next_affinity(core: &Core, owner: Option<usize>, last: (usize, u32)) -> (usize, u32) {
    match owner {
        Some(o) if o != core.index && o == last.0 => (o, last.1 + 1),
        Some(o) if o != core.index => (o, 1),
        _ => (core.index, 0),
    }
}

/// Hand a client connection (between requests, with the bytes already read past the last
/// one) to core `target`, which counts and serves it from then on. If that core's queue is
/// gone (shutdown), the job and with it the socket are dropped, which closes the connection
/// as shutdown would have.
fn adopt_on(core: &Core, target: usize, socket: std::net::TcpStream, ends: Ends, rbuf: Vec<u8>) {
    let adopt: Letter = Box::new(move |core: &Rc<Core>| {
        let core = core.clone();
        monoio::spawn(async move {
            let slot = ConnectionSlot::take(&core);
            serve_moved(core, socket, ends, rbuf).await;
            drop(slot);
        });
    });
    let _ = core.post(target, adopt);
}

/// Serve a connection that another core moved here (see `adopt_on`).
async fn serve_moved(core: Rc<Core>, socket: std::net::TcpStream, ends: Ends, rbuf: Vec<u8>) {
    match TcpStream::from_std(socket) {
        Ok(stream) => {
            // Moved between requests: an idle keep-alive connection.
            let idle = core.config.idle_timeout;
            serve_from(core, stream, ends, Listener::Main, rbuf, idle).await
        }
        Err(e) => tracing::warn!(core = core.index, "adopting a moved connection failed: {e}"),
    }
}

/// The CORS headers for a request from `origin` (see `Cors`).
fn cors(core: &Core, origin: Option<&str>) -> Cors {
    Cors::decide(core.config.cors_origins.as_deref(), origin)
}

/// One access-log line, unless this core has already written its share this second; lines
/// left out are counted and reported on the next line written.
fn access_log(
    core: &Core,
    peer: SocketAddr,
    method: &Method,
    path: &str,
    status: u16,
    bytes: usize,
    started: Instant,
) {
    let Some(suppressed) = core.access_log_permit() else {
        return;
    };
    tracing::info!(
        target: "ursula::access",
        %peer,
        method = method.as_str(),
        path,
        status,
        bytes,
        us = started.elapsed().as_micros() as u64,
        suppressed,
        "request"
    );
}

/// Answer a connection over the core's cap without reading its request: a 503 the client
/// can act on, then close. The short drain lets the answer arrive before the close: closing
/// with unread request bytes would reset the connection and could discard it.
pub async fn refuse_connection<S: Transport>(core: Rc<Core>, mut stream: S) {
    let mut resp = close(ApiError::Unavailable("too many connections".into()).response());
    resp.cors = cors(&core, None);
    let mut wbuf = Vec::with_capacity(512);
    if write_response(&mut stream, &mut wbuf, resp, false, false)
        .await
        .is_err()
    {
        return;
    }
    linger_close(&core, &mut stream).await;
}

/// Close a connection whose client may still be sending (a request refused before its body
/// was read), so that the answer already written reaches it: closing with unread bytes
/// would reset the connection, and the reset can discard the answer before the client reads
/// it. Our side is shut down, then at most `REFUSE_DRAIN_BYTES_MAX` bytes are read and
/// dropped for at most `REFUSE_DRAIN`: a large body is never drained.
async fn linger_close<S: Transport>(core: &Core, stream: &mut S) {
    let _ = stream.shutdown().await;
    let deadline = Instant::now() + REFUSE_DRAIN;
    let mut rbuf = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut drained = 0usize;
    while drained < REFUSE_DRAIN_BYTES_MAX && !core.shutting_down() {
        rbuf.clear();
        let left = deadline.saturating_duration_since(Instant::now());
        match read_more(stream, &mut rbuf, left).await {
            ReadOutcome::Data => drained += rbuf.len(),
            _ => break,
        }
    }
}

/// The refusal of a request that needs a token it does not carry, else the buckets its
/// token is limited to (`None`: all). Health checks come from load balancers and service
/// managers without tokens; the admin listener is protected by where it is bound.
fn authenticate(
    core: &Core,
    listener: Listener,
    endpoint: Option<Option<admin::Endpoint>>,
    head: &RequestHead,
) -> Result<Option<Arc<BucketScope>>, ApiError> {
    match (&core.config.auth, listener, endpoint) {
        (None, _, _)
        | (_, Listener::Admin, _)
        | (_, _, Some(Some(admin::Endpoint::Health | admin::Endpoint::Ready))) => Ok(None),
        (Some(file), _, _) => {
            let buckets = core.with_tokens(file, |tokens| {
                crate::auth::check(tokens, &head.method, &head.path, &head.headers)
            })?;
            // The metrics name every bucket: not for a token limited to some.
            if buckets.is_some() && endpoint.is_some() {
                return Err(ApiError::NotFound("no such resource"));
            }
            Ok(buckets)
        }
    }
}

/// The content coding of a request's body, decided on its head. Only appends (a POST to a
/// stream, or to its append-batch) may arrive compressed: they are what shippers send, and
/// every other body is small or, like a snapshot, stored as sent.
fn body_coding(head: &RequestHead, route: &str) -> Result<Option<ContentCoding>, ApiError> {
    let values = head
        .headers
        .iter()
        .filter(|(name, _)| *name == "content-encoding")
        .map(|(_, value)| value);
    let append =
        head.method == Method::Post && matches!(route, "stream" | "compat_stream" | "append_batch");
    match parse_content_encoding(values) {
        Ok(None) => Ok(None),
        Ok(Some(_)) | Err(_) if !append => Err(ApiError::EncodingNotAccepted),
        Ok(Some(coding)) => Ok(Some(coding)),
        Err(_) => Err(ApiError::UnsupportedEncoding),
    }
}

/// Skip the body of a request that will not be served, if all of it is already buffered
/// (the usual small request). `false`: some of it is still to come.
fn skip_buffered_body(rbuf: &mut Vec<u8>, body: BodyKind) -> bool {
    match body {
        BodyKind::None => true,
        BodyKind::Length(n) if (rbuf.len() as u64) >= n => {
            // n is at most the buffered length, so it fits in usize.
            rbuf.drain(..n as usize);
            true
        }
        BodyKind::Length(_) | BodyKind::Chunked => false,
    }
}

/// Sandbox content a browser could run. Streams and snapshots are served with the type
/// their writer chose, at this server's origin: an HTML or SVG stream opened in a browser
/// must not run scripts as that origin (stored cross-site scripting).
fn sandbox_active_content(resp: &mut Response) {
    let active = resp
        .headers
        .iter()
        .any(|(name, value)| *name == "content-type" && is_active(value));
    if active {
        resp.push("content-security-policy", "sandbox");
    }
}

/// Make a relative `Location` (handlers name only the path) absolute: on the configured
/// public URL, else on the scheme and local address this connection arrived on. The
/// request's `Host` header is never used: it is whatever the client chose to send.
fn absolute_location<S: Transport>(core: &Core, local: Option<SocketAddr>, resp: &mut Response) {
    let Some((_, location)) = resp
        .headers
        .iter_mut()
        .find(|(name, _)| *name == "location")
    else {
        return;
    };
    if !location.starts_with('/') {
        return;
    }
    let base = match &core.config.public_url {
        Some(url) => url.clone(),
        None => {
            let scheme = if S::TLS { "https" } else { "http" };
            match local {
                Some(addr) => format!("{scheme}://{addr}"),
                // No address to name: a relative reference is still a valid Location.
                None => return,
            }
        }
    };
    location.insert_str(0, &base);
}

enum HeadOutcome {
    Head(RequestHead),
    Closed,
    Reject(Response),
}

/// Read one request head. `idle` is how long the connection may wait for the head's first
/// byte: the head timeout on a new connection, the idle timeout between keep-alive requests.
async fn read_head<S: Transport>(
    core: &Core,
    stream: &mut S,
    rbuf: &mut Vec<u8>,
    idle: Duration,
) -> HeadOutcome {
    // The whole head must arrive within header_timeout of its first byte, so a client that
    // trickles header bytes cannot hold the connection. The deadline is set when the head is
    // first found incomplete, right after its first bytes arrived, so a head that arrives
    // whole needs no clock read.
    let mut deadline = None;
    loop {
        if !rbuf.is_empty() {
            match parse_request_head(rbuf) {
                Ok(h) => return HeadOutcome::Head(h),
                Err(HeadError::Incomplete) => {
                    deadline.get_or_insert_with(|| Instant::now() + core.config.header_timeout);
                }
                Err(HeadError::TooLarge) => {
                    return HeadOutcome::Reject(close(ApiError::HeaderTooLarge.response()))
                }
                Err(HeadError::Bad(why)) => {
                    return HeadOutcome::Reject(close(ApiError::InvalidRequest(why).response()))
                }
                Err(HeadError::NotImplemented) => {
                    return HeadOutcome::Reject(close(
                        ApiError::NotImplemented("unsupported transfer-encoding").response(),
                    ))
                }
            }
        }
        // Idle connections may wait long; a started request head must arrive promptly.
        let timeout = match deadline {
            None => idle,
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        match read_more(stream, rbuf, timeout).await {
            ReadOutcome::Data => {}
            ReadOutcome::Eof | ReadOutcome::Error => return HeadOutcome::Closed,
            ReadOutcome::Timeout if rbuf.is_empty() => return HeadOutcome::Closed,
            ReadOutcome::Timeout => {
                return HeadOutcome::Reject(close(
                    ApiError::RequestTimeout("request head not received in time").response(),
                ))
            }
        }
    }
}

enum BodyError {
    /// Answer, then close.
    Reject(Response),
    /// Answer a request whose body was left unread, then close after a short drain, so
    /// the answer is not lost to a reset (see `linger_close`).
    Refuse(Response),
    Closed,
}

fn close(mut r: Response) -> Response {
    r.close = true;
    r
}

fn too_large(limit: u64) -> BodyError {
    BodyError::Reject(close(too_large_response(limit)))
}

fn too_large_response(limit: u64) -> Response {
    ApiError::PayloadTooLarge(format!("request body exceeds {} MiB", limit >> 20).into()).response()
}

/// When a request body must be complete: `body_timeout` after the head, plus a second for
/// every `body_min_rate` bytes received, counting at most what the head announced (a
/// chunked body: the most it may hold). A client must keep up the minimum rate on average
/// from the start: one that trickles its body runs out of time instead of holding its
/// connection and buffer, and none earns time past its own length. No single read may wait
/// longer than `header_timeout`.
struct BodyClock {
    start: Instant,
    base: Duration,
    min_rate: u64,
    announced: u64,
    gap: Duration,
}

impl BodyClock {
    fn new(core: &Core, announced: u64) -> BodyClock {
        BodyClock {
            start: Instant::now(),
            base: core.config.body_timeout,
            min_rate: core.config.body_min_rate,
            announced,
            gap: core.config.header_timeout,
        }
    }

    /// How long the next read may wait, given `received` body bytes so far; `None` once the
    /// body is late.
    fn next_wait(&self, received: usize) -> Option<Duration> {
        let earned = match self.min_rate {
            0 => Duration::ZERO,
            rate => {
                let counted = (received as u64).min(self.announced);
                Duration::from_millis(counted.saturating_mul(1000) / rate)
            }
        };
        let deadline = self.start + self.base.saturating_add(earned);
        let left = deadline.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then(|| left.min(self.gap))
    }
}

/// Request-body bytes a request holds against its core's `body_budget_bytes`, admitted
/// before any of the body is read and given back when the request is done.
struct BodyPermit<'a> {
    core: &'a Core,
    bytes: usize,
}

impl BodyPermit<'_> {
    /// A permit holding nothing yet: a body's buffer is admitted as it grows (see
    /// [`BodyPermit::grow_to`]), so what a client holds is what it has sent, not what it
    /// announced, and a slow client announcing a large body takes no room from others.
    fn new(core: &Core) -> BodyPermit<'_> {
        BodyPermit { core, bytes: 0 }
    }

    /// Hold `total` bytes in all; `false` (holding what it held) when that would take the
    /// core's body bytes over the budget. One body alone is always admitted, so no body
    /// within the size limits is refused for good.
    fn grow_to(&mut self, total: usize) -> bool {
        let Some(more) = total.checked_sub(self.bytes).filter(|&m| m > 0) else {
            return true;
        };
        let held = self.core.body_bytes.get();
        let others = held - self.bytes;
        if others > 0 && held.saturating_add(more) > self.core.config.body_budget_bytes {
            return false;
        }
        self.core.body_bytes.set(held + more);
        self.bytes = total;
        true
    }
}

impl Drop for BodyPermit<'_> {
    fn drop(&mut self) {
        let held = self.core.body_bytes.get();
        self.core.body_bytes.set(held - self.bytes);
    }
}

fn over_body_budget() -> Response {
    ApiError::Unavailable("too many request bodies in flight on this core".into()).response()
}

fn body_late() -> BodyError {
    BodyError::Reject(close(
        ApiError::RequestTimeout("request body not received in time").response(),
    ))
}

async fn read_body<S: Transport>(
    core: &Core,
    stream: &mut S,
    rbuf: &mut Vec<u8>,
    head: &RequestHead,
    permit: &mut BodyPermit<'_>,
) -> Result<Bytes, BodyError> {
    // Snapshot publishes may carry up to 128 MiB; every other body up to 32 MiB. The path
    // is only looked at for bodies that could be over 32 MiB.
    let limit = || {
        if is_snapshot_path(&head.path) {
            SNAPSHOT_BODY_BYTES_MAX
        } else {
            BODY_BYTES_MAX
        }
    };
    match head.body {
        BodyKind::None => Ok(Bytes::new()),
        BodyKind::Length(n) if n > BODY_BYTES_MAX && n > limit() => Err(too_large(limit())),
        BodyKind::Length(0) => Ok(Bytes::new()),
        BodyKind::Length(n) => {
            let n = n as usize;
            if head.expect_continue && rbuf.is_empty() {
                send_continue(stream).await?;
            }
            if rbuf.len() >= n {
                // Copy the body out rather than taking the read buffer: cached stream data
                // must not pin a connection-sized allocation per small append.
                let body = Bytes::copy_from_slice(&rbuf[..n]);
                rbuf.drain(..n);
                return Ok(body);
            }
            let clock = BodyClock::new(core, n as u64);
            let first = n.min(BODY_RESERVE_BYTES_MAX).max(rbuf.len());
            if !permit.grow_to(first) {
                return Err(BodyError::Reject(close(over_body_budget())));
            }
            let mut body = Vec::with_capacity(first);
            body.extend_from_slice(rbuf);
            rbuf.clear();
            while body.len() < n {
                let wait = clock.next_wait(body.len()).ok_or_else(body_late)?;
                let len = body.len();
                if body.capacity() == len {
                    // Double, up to the announced length, once the budget has room.
                    let more = len.max(READ_CHUNK_BYTES).min(n - len);
                    if !permit.grow_to(len + more) {
                        return Err(BodyError::Reject(close(over_body_budget())));
                    }
                    body.reserve_exact(more);
                }
                let want = (body.capacity() - len).min(n - len);
                let slice = body.slice_mut(len..len + want);
                let read = monoio::time::timeout(wait, stream.read(slice)).await;
                let (res, slice) = match read {
                    Ok(r) => r,
                    Err(_) => return Err(body_late()),
                };
                body = slice.into_inner();
                match res {
                    Ok(0) | Err(_) => return Err(BodyError::Closed),
                    Ok(_) => {}
                }
            }
            Ok(Bytes::from(body))
        }
        BodyKind::Chunked => {
            if head.expect_continue && rbuf.is_empty() {
                send_continue(stream).await?;
            }
            let limit = limit();
            let clock = BodyClock::new(core, limit);
            let mut decoder = ChunkedDecoder::new();
            let mut body = Vec::new();
            loop {
                let (used, done) = decoder.feed(rbuf, &mut body).map_err(|why| {
                    BodyError::Reject(close(ApiError::InvalidRequest(why).response()))
                })?;
                rbuf.drain(..used);
                if body.len() as u64 > limit {
                    return Err(too_large(limit));
                }
                if !permit.grow_to(body.capacity()) {
                    return Err(BodyError::Reject(close(over_body_budget())));
                }
                if done {
                    return Ok(Bytes::from(body));
                }
                let wait = clock
                    .next_wait(body.len() + rbuf.len())
                    .ok_or_else(body_late)?;
                match read_more(stream, rbuf, wait).await {
                    ReadOutcome::Data => {}
                    ReadOutcome::Timeout => return Err(body_late()),
                    ReadOutcome::Eof | ReadOutcome::Error => return Err(BodyError::Closed),
                }
            }
        }
    }
}

/// Read an append's body sent with a content coding, decoding it as it arrives (see
/// `http::coding`). The body limit counts the decoded bytes, and the compressed ones may
/// not pass it either; the buffer the body is decoded into grows through the body budget.
/// Bytes past the body (a pipelined request) stay in `rbuf`.
async fn read_coded_body<S: Transport>(
    core: &Core,
    stream: &mut S,
    rbuf: &mut Vec<u8>,
    head: &RequestHead,
    permit: &mut BodyPermit<'_>,
    coding: ContentCoding,
) -> Result<Bytes, BodyError> {
    let announced = match head.body {
        BodyKind::None | BodyKind::Length(0) => return Ok(Bytes::new()),
        BodyKind::Length(n) if n > BODY_BYTES_MAX => return Err(too_large(BODY_BYTES_MAX)),
        BodyKind::Length(n) => Some(n),
        BodyKind::Chunked => None,
    };
    if head.expect_continue && rbuf.is_empty() {
        send_continue(stream).await?;
    }
    let refuse = |e: DecodeError| BodyError::Refuse(ApiError::from(e).response());
    let mut decoder =
        BodyDecoder::new(coding, BODY_BYTES_MAX as usize, announced).map_err(refuse)?;
    let clock = BodyClock::new(core, announced.unwrap_or(BODY_BYTES_MAX));
    // Compressed bytes received so far.
    let mut received = 0usize;
    match announced {
        Some(n) => {
            let n = n as usize;
            loop {
                let take = (n - received).min(rbuf.len());
                decoder
                    .feed(&rbuf[..take], &mut |total| permit.grow_to(total))
                    .map_err(refuse)?;
                rbuf.drain(..take);
                received += take;
                if received == n {
                    break;
                }
                let wait = clock.next_wait(received).ok_or_else(body_late)?;
                match read_more(stream, rbuf, wait).await {
                    ReadOutcome::Data => {}
                    ReadOutcome::Timeout => return Err(body_late()),
                    ReadOutcome::Eof | ReadOutcome::Error => return Err(BodyError::Closed),
                }
            }
        }
        None => {
            let mut chunked = ChunkedDecoder::new();
            let mut data = Vec::new();
            loop {
                let (used, done) = chunked.feed(rbuf, &mut data).map_err(|why| {
                    BodyError::Reject(close(ApiError::InvalidRequest(why).response()))
                })?;
                rbuf.drain(..used);
                received += data.len();
                if received as u64 > BODY_BYTES_MAX {
                    return Err(BodyError::Refuse(too_large_response(BODY_BYTES_MAX)));
                }
                decoder
                    .feed(&data, &mut |total| permit.grow_to(total))
                    .map_err(refuse)?;
                data.clear();
                if done {
                    break;
                }
                let wait = clock
                    .next_wait(received + rbuf.len())
                    .ok_or_else(body_late)?;
                match read_more(stream, rbuf, wait).await {
                    ReadOutcome::Data => {}
                    ReadOutcome::Timeout => return Err(body_late()),
                    ReadOutcome::Eof | ReadOutcome::Error => return Err(BodyError::Closed),
                }
            }
        }
    }
    let body = decoder
        .finish(&mut |total| permit.grow_to(total))
        .map_err(refuse)?;
    Ok(Bytes::from(body))
}

async fn send_continue<S: Transport>(stream: &mut S) -> Result<(), BodyError> {
    let (res, _) = stream
        .write_all(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec())
        .await;
    res.map(|_| ()).map_err(|_| BodyError::Closed)
}

enum ReadOutcome {
    Data,
    Eof,
    Timeout,
    Error,
}

async fn read_more<S: Transport>(
    stream: &mut S,
    rbuf: &mut Vec<u8>,
    timeout: Duration,
) -> ReadOutcome {
    if rbuf.capacity() - rbuf.len() < READ_CHUNK_BYTES / 2 {
        rbuf.reserve(READ_CHUNK_BYTES);
    }
    let buf = std::mem::take(rbuf);
    let len = buf.len();
    let cap = buf.capacity();
    let read = monoio::time::timeout(timeout, stream.read(buf.slice_mut(len..cap))).await;
    match read {
        Ok((res, slice)) => {
            *rbuf = slice.into_inner();
            match res {
                Ok(0) => ReadOutcome::Eof,
                Ok(_) => ReadOutcome::Data,
                Err(_) => ReadOutcome::Error,
            }
        }
        Err(_) => ReadOutcome::Timeout,
    }
}
