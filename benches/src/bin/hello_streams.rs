//! `hello-streams`: the smallest in-memory server the loadgen's `read`, `replay` and
//! `fanout` scenarios run against, used by `scripts/bench-compare.sh` as their "physical
//! limit" row, the way `hello-monoio` is the row for small writes.
//!
//! It keeps every stream in one locked map, in memory, with no durability, no protocol
//! checks and no caps beyond the 8 MiB read. A catch-up read is one `writev` of the head and
//! a slice of the stream. A live SSE reader (`live=sse`) gets each append as one `data`
//! event: the append's core builds the frame once and hands it to every core with
//! subscribers, and each core writes it to its own sockets. What is left is the cost of the
//! loopback sockets themselves, so a scenario's latency here is the floor for any server on
//! this machine and client.
//!
//! Usage: hello-streams [ADDR] [CORES]   (default 127.0.0.1:0 and all cores); prints
//! `hello-streams listening on http://ADDR` once every core is accepting.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use bytes::Bytes;
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// The most one catch-up read returns, as in the protocol.
const MAX_READ: usize = 8 << 20;

fn main() {
    let args = ursula_benches::CeilingArgs::parse("hello-streams");
    let (inboxes, receivers): (Vec<_>, Vec<_>) =
        (0..args.cores).map(|_| async_channel::unbounded()).unzip();
    let shared = Arc::new(Shared {
        streams: Mutex::new(HashMap::new()),
        inboxes,
        subscribers: AtomicUsize::new(0),
    });
    let receivers = Arc::new(receivers);
    args.serve_on_every_core(move |index, listener| {
        let (shared, inbox) = (shared.clone(), receivers[index].clone());
        async move {
            let core = Rc::new(Core {
                index,
                shared,
                live: RefCell::new(HashMap::new()),
            });
            monoio::spawn(deliver_from_other_cores(core.clone(), inbox));
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    monoio::spawn(serve(core.clone(), stream));
                }
            }
        }
    });
}

/// State every core sees.
struct Shared {
    streams: Mutex<HashMap<String, Stream>>,
    /// One per core: SSE frames appended on another core, to write to this core's readers.
    inboxes: Vec<async_channel::Sender<(String, Bytes)>>,
    /// Live readers on all cores; appends skip the hand-out while there are none.
    subscribers: AtomicUsize,
}

struct Stream {
    content_type: String,
    data: Vec<u8>,
    /// A shared copy of `data` for reads, made on the first read after an append.
    frozen: Option<Bytes>,
}

/// One core's state.
struct Core {
    index: usize,
    shared: Arc<Shared>,
    /// Live readers on this core, by stream path.
    live: RefCell<HashMap<String, Vec<Weak<Mailbox>>>>,
}

/// Frames waiting to be written to one live reader.
#[derive(Default)]
struct Mailbox {
    frames: RefCell<VecDeque<Bytes>>,
    waker: RefCell<Option<Waker>>,
}

impl Core {
    /// Queue `frame` for this core's live readers of `path`, dropping readers that left.
    fn deliver(&self, path: &str, frame: &Bytes) {
        let mut live = self.live.borrow_mut();
        let Some(readers) = live.get_mut(path) else {
            return;
        };
        readers.retain(|r| match r.upgrade() {
            Some(mailbox) => {
                mailbox.frames.borrow_mut().push_back(frame.clone());
                if let Some(w) = mailbox.waker.borrow_mut().take() {
                    w.wake();
                }
                true
            }
            None => false,
        });
    }
}

async fn deliver_from_other_cores(core: Rc<Core>, inbox: async_channel::Receiver<(String, Bytes)>) {
    while let Ok((path, frame)) = inbox.recv().await {
        core.deliver(&path, &frame);
    }
}

/// One parsed request, borrowed from the read buffer; the body is the bytes after the head.
struct Request<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    content_type: &'a str,
    head_len: usize,
    body_len: usize,
}

fn parse(buf: &[u8]) -> Result<Option<Request<'_>>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let body_len = header("content-length").map_or(Ok(0), |v| v.parse().map_err(|_| ()))?;
    let content_type = header("content-type").unwrap_or_default();
    let target = req.path.ok_or(())?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Some(Request {
        method: req.method.ok_or(())?,
        path,
        query,
        content_type,
        head_len,
        body_len,
    }))
}

fn param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

async fn serve(core: Rc<Core>, mut stream: TcpStream) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut spare: Vec<u8> = Vec::with_capacity(64 << 10);
    loop {
        loop {
            let req = match parse(&buf) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(()) => return,
            };
            let end = req.head_len + req.body_len;
            if buf.len() < end {
                break;
            }
            if req.method == "GET" && param(req.query, "live") == Some("sse") {
                return live(core, stream, req.path.to_string()).await;
            }
            let mut response = answer(&core, &req, &buf[req.head_len..end]);
            buf.drain(..end);
            loop {
                let (res, back) = stream.writev(response).await;
                response = back;
                match res {
                    Ok(n) if n > 0 => {
                        if response.advance(n) {
                            break;
                        }
                    }
                    _ => return,
                }
            }
        }
        if !ursula_benches::read_more(&mut stream, &mut buf, &mut spare).await {
            return;
        }
    }
}

/// The response to one non-live request.
fn answer(core: &Core, req: &Request, body: &[u8]) -> Response {
    let shared = &core.shared;
    let mut streams = shared.streams.lock().unwrap_or_else(|e| e.into_inner());
    match req.method {
        "PUT" => {
            let created = !streams.contains_key(req.path);
            let s = streams
                .entry(req.path.to_string())
                .or_insert_with(|| Stream {
                    content_type: req.content_type.to_string(),
                    data: Vec::new(),
                    frozen: None,
                });
            s.data.extend_from_slice(body);
            s.frozen = None;
            let status = if created { "201 Created" } else { "200 OK" };
            Response::head(status, s.data.len(), "")
        }
        "POST" => {
            let Some(s) = streams.get_mut(req.path) else {
                return Response::head("404 Not Found", 0, "");
            };
            s.data.extend_from_slice(body);
            s.frozen = None;
            let len = s.data.len();
            drop(streams);
            if shared.subscribers.load(Ordering::Relaxed) > 0 {
                let frame = sse_frame(body);
                for (i, inbox) in shared.inboxes.iter().enumerate() {
                    if i == core.index {
                        core.deliver(req.path, &frame);
                    } else {
                        let _ = inbox.try_send((req.path.to_string(), frame.clone()));
                    }
                }
            }
            Response::head("204 No Content", len, "")
        }
        "HEAD" => match streams.get(req.path) {
            Some(s) => Response::head("200 OK", s.data.len(), ""),
            None => Response::head("404 Not Found", 0, ""),
        },
        "DELETE" => match streams.remove(req.path) {
            Some(_) => Response::head("204 No Content", 0, ""),
            None => Response::head("404 Not Found", 0, ""),
        },
        "GET" => {
            let Some(s) = streams.get_mut(req.path) else {
                return Response::head("404 Not Found", 0, "");
            };
            let len = s.data.len();
            let from = match param(req.query, "offset") {
                None | Some("-1") => 0,
                Some("now") => len,
                Some(o) => match o.parse::<usize>() {
                    Ok(o) if o <= len => o,
                    _ => return Response::head("400 Bad Request", 0, ""),
                },
            };
            let to = len.min(from + MAX_READ);
            let data = s
                .frozen
                .get_or_insert_with(|| Bytes::copy_from_slice(&s.data))
                .slice(from..to);
            let mut extra = format!("Content-Type: {}\r\n", s.content_type);
            if to == len {
                extra.push_str("Stream-Up-To-Date: true\r\n");
            }
            let mut r = Response::head("200 OK", to, &extra);
            r.set_body(data);
            r
        }
        _ => Response::head("405 Method Not Allowed", 0, ""),
    }
}

/// Serve `path` live: every later append, as an SSE `data` event, until the reader leaves.
async fn live(core: Rc<Core>, mut stream: TcpStream, path: String) {
    // Registered before the head goes out, so every append the reader could see after
    // the head reaches it.
    let mailbox = Rc::new(Mailbox::default());
    core.live
        .borrow_mut()
        .entry(path)
        .or_default()
        .push(Rc::downgrade(&mailbox));
    core.shared.subscribers.fetch_add(1, Ordering::Relaxed);
    let _leave = Leave(&core.shared.subscribers);
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n";
    if stream.write_all(head.as_bytes().to_vec()).await.0.is_err() {
        return;
    }
    let mut out = Vec::with_capacity(4 << 10);
    loop {
        std::future::poll_fn(|cx| {
            if mailbox.frames.borrow().is_empty() {
                *mailbox.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        out.clear();
        for frame in mailbox.frames.borrow_mut().drain(..) {
            out.extend_from_slice(&frame);
        }
        let (res, back) = stream.write_all(std::mem::take(&mut out)).await;
        out = back;
        if res.is_err() {
            return;
        }
    }
}

/// Counts a live reader out however its task ends.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An append as one SSE `data` event, one `data:` line per line of the payload.
fn sse_frame(payload: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(payload.len() + 32);
    frame.extend_from_slice(b"event: data\n");
    for line in payload.split(|&b| b == b'\n') {
        frame.extend_from_slice(b"data: ");
        frame.extend_from_slice(line);
        frame.push(b'\n');
    }
    frame.push(b'\n');
    Bytes::from(frame)
}

/// A response head and an optional body, written with one `writev` (and more only when the
/// socket takes part of it).
struct Response {
    head: Vec<u8>,
    /// How much of `head` is written.
    head_sent: usize,
    body: Bytes,
    /// On the heap, so the pointer handed to the kernel survives moves of the value.
    iov: Vec<libc::iovec>,
}

impl Response {
    fn head(status: &str, next_offset: usize, extra: &str) -> Response {
        let head = format!(
            "HTTP/1.1 {status}\r\nStream-Next-Offset: {next_offset}\r\n{extra}Content-Length: 0\r\n\r\n"
        )
        .into_bytes();
        let mut r = Response {
            head,
            head_sent: 0,
            body: Bytes::new(),
            iov: Vec::with_capacity(2),
        };
        r.point();
        r
    }

    fn set_body(&mut self, body: Bytes) {
        let zero = b"Content-Length: 0\r\n\r\n";
        self.head.truncate(self.head.len() - zero.len());
        self.head
            .extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        self.body = body;
        self.point();
    }

    /// Consume `n` written bytes; true once everything is written.
    fn advance(&mut self, n: usize) -> bool {
        let head_left = self.head.len() - self.head_sent;
        if n < head_left {
            self.head_sent += n;
        } else {
            self.head_sent = self.head.len();
            self.body = self.body.slice((n - head_left).min(self.body.len())..);
        }
        self.point();
        self.iov.is_empty()
    }

    fn point(&mut self) {
        self.iov.clear();
        if self.head_sent < self.head.len() {
            self.iov.push(libc::iovec {
                iov_base: self.head[self.head_sent..].as_ptr() as *mut libc::c_void,
                iov_len: self.head.len() - self.head_sent,
            });
        }
        if !self.body.is_empty() {
            self.iov.push(libc::iovec {
                iov_base: self.body.as_ptr() as *mut libc::c_void,
                iov_len: self.body.len(),
            });
        }
    }
}

// SAFETY: the iovec array and the buffers it points into (`head`'s allocation and `body`'s)
// are heap allocations this value owns: they stay where they are when the value moves, and
// nothing changes them while the runtime holds the value. `point` re-aims the entries after
// every change, and `iov.len()` entries exist.
unsafe impl monoio::buf::IoVecBuf for Response {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }
    fn read_iovec_len(&self) -> usize {
        self.iov.len()
    }
}
