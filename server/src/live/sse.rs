//! Server-sent events (P§13).
//!
//! The connection's core writes the event stream; each step that needs the stream's data
//! runs on the owner core and returns the bytes of the next events, so socket and stream
//! each stay on their own core. Steps inside a feed's window (`feed`) are cut locally.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::io::AsyncWriteRentExt;
use monoio::time::Sleep;
use ursula_protocol::content_type::{is_json, sse_is_text};
use ursula_protocol::sse::{
    push_base64_data_event, push_control_event, push_json_array_data_event, push_keepalive,
    push_text_data_event, utf8_safe_cut, Control,
};
use ursula_storage::{Offset, RecordNo, Shard, StreamId};

use crate::core::Core;
use crate::handlers::catch_up::{collect, cursor};
use crate::handlers::read_params::SseStart;
use crate::http::transport::{write_parts, Transport};
use crate::http::{write_head, ApiError, Body, Response};
use crate::live::feed::{self, Cut, Feed};
use crate::records;
use crate::surface::Surface;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `text/*`: UTF-8 text split into `data:` lines.
    Text,
    /// JSON on the compat surface: one JSON array per event.
    JsonArray,
    /// JSON on the bucketed surface: canonical NDJSON text.
    Ndjson,
    Base64,
}

pub struct SseSession {
    owner: usize,
    surface: Surface,
    id: StreamId,
    incarnation: u64,
    offset: Offset,
    cursor: Option<String>,
    max_bytes: usize,
    mode: Mode,
    started: Instant,
    first: bool,
    /// Record-aware session (extensions.md §8.9): the next record to deliver.
    records: Option<(records::RecordParams, RecordNo)>,
}

/// Build the SSE response head and its session, on the owner core (parameters and start
/// already validated by the read handler).
pub fn start(core: &Rc<Core>, start: SseStart) -> Result<(Response, SseSession), Response> {
    let shard = core.shard(start.id)?;
    let Some(s) = shard.stream(start.id) else {
        return Err(ApiError::StreamNotFound.response());
    };
    let ct = s.content_type().to_string();
    let mode = if is_json(&ct) {
        if start.surface == Surface::Compat {
            Mode::JsonArray
        } else {
            Mode::Ndjson
        }
    } else if sse_is_text(&ct) {
        Mode::Text
    } else {
        Mode::Base64
    };
    let data_type = match (mode, start.records) {
        (_, Some((rp, _))) if rp.envelope => records::ENVELOPE_EVENT_TYPE.to_string(),
        (Mode::JsonArray, _) => "application/json".to_string(),
        (Mode::Ndjson, _) => "application/x-ndjson".to_string(),
        _ => ct,
    };
    let mut resp = Response::new(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .header("stream-data-content-type", data_type);
    if mode == Mode::Base64 {
        resp.push("stream-sse-data-encoding", "base64");
    }
    if mode == Mode::Ndjson {
        resp.push("stream-extensions", records::EXTENSIONS);
    }
    resp.body = Body::Chunked;
    let session = SseSession {
        owner: core.index,
        surface: start.surface,
        id: start.id,
        incarnation: s.incarnation(),
        offset: start.start,
        cursor: start.cursor,
        max_bytes: start.max_bytes,
        mode,
        started: Instant::now(),
        first: true,
        records: start.records,
    };
    Ok((resp, session))
}

/// Drive an SSE response on the connection's core until it ends. Never reuses the
/// connection afterwards.
pub async fn run<S: Transport>(
    core: &Rc<Core>,
    stream: &mut S,
    wbuf: &mut Vec<u8>,
    resp: Response,
    mut session: SseSession,
) -> std::io::Result<bool> {
    // The head's body is `Chunked`, so it gets chunked framing.
    wbuf.clear();
    write_head(wbuf, &resp, false, false);
    let head = std::mem::take(wbuf);
    let (res, head) = stream.write_all(head).await;
    *wbuf = head;
    res?;
    // Byte-range sessions follow the stream through this core's feed; record-aware ones
    // (rare, and cut by record) step on the owner every time.
    let subscription = session
        .records
        .is_none()
        .then(|| feed::subscribe(core, session.owner, session.id, session.incarnation));
    // One keep-alive timer for the session, re-armed only when it fires: a timer per wait
    // would be a timer-wheel insert and removal for every event delivered.
    let mut tick = Box::pin(monoio::time::sleep_until(next_tick(core, &session)));
    loop {
        let local = match &subscription {
            Some(sub) => step_local(core, sub.feed(), &mut session, &mut tick).await,
            None => None,
        };
        let (bytes, done) = match local {
            Some(stepped) => stepped,
            None => {
                let owner = session.owner;
                let stepped = core
                    .on(owner, move |c| async move {
                        let mut s = session;
                        let (bytes, done) = step(&c, &mut s).await;
                        (s, bytes, done)
                    })
                    .await;
                let Ok((next, bytes, done)) = stepped else {
                    break;
                };
                session = next;
                (bytes, done)
            }
        };
        if !bytes.is_empty() {
            let n = bytes.len();
            write_chunk(stream, wbuf, Bytes::from(bytes)).await?;
            core.metrics.read_bytes(n);
        }
        if done {
            break;
        }
    }
    let (res, _) = stream.write_all(b"0\r\n\r\n".to_vec()).await;
    res?;
    Ok(false)
}

/// One chunk of the chunked response: size line, the events, CRLF; one write.
async fn write_chunk<S: Transport>(
    stream: &mut S,
    wbuf: &mut Vec<u8>,
    events: Bytes,
) -> std::io::Result<()> {
    wbuf.clear();
    wbuf.extend_from_slice(format!("{:x}\r\n", events.len()).as_bytes());
    write_parts(stream, wbuf, vec![events, Bytes::from_static(b"\r\n")]).await
}

/// When the session's keep-alive timer fires next: one keep-alive interval from now, or the
/// end of its maximum age if that is sooner.
fn next_tick(core: &Core, sess: &SseSession) -> monoio::time::Instant {
    let left = core
        .config
        .sse_max_connection
        .saturating_sub(sess.started.elapsed());
    monoio::time::Instant::now()
        + core
            .config
            .sse_keepalive
            .min(left)
            .max(Duration::from_millis(1))
}

/// One step served from this core's feed, or `None` when the session has to step on the
/// owner instead: its first step, outside the feed's window, closed at the tail, or the feed
/// ended. Waits for the feed to move when at the tail; a keep-alive comment goes out when
/// `tick` fires during such a wait, so a busy stream also carries one per interval.
/// Shutdown wakes the wait through the feed (`feed::notify_all`).
async fn step_local(
    core: &Rc<Core>,
    feed: &Feed,
    sess: &mut SseSession,
    tick: &mut Pin<Box<Sleep>>,
) -> Option<(Vec<u8>, bool)> {
    if sess.first {
        return None;
    }
    let max_age = core.config.sse_max_connection;
    loop {
        let seen = feed.version();
        match feed.cut(sess.offset, sess.max_bytes) {
            Cut::Outside | Cut::AtTail { closed: true } => return None,
            Cut::Data {
                parts,
                end,
                tail,
                closed,
            } => {
                let parts = if sess.mode == Mode::JsonArray {
                    let slices: Vec<&[u8]> = parts.iter().map(|b| &b[..]).collect();
                    vec![Bytes::from(ursula_protocol::json::render_array(&slices))]
                } else {
                    parts
                };
                let mut out = Vec::new();
                let closed_now = render_data(core, sess, parts, end, tail, closed, &mut out);
                return Some((out, closed_now));
            }
            Cut::AtTail { closed: false } => {}
        }
        if core.shutting_down() || sess.started.elapsed() >= max_age {
            return Some((Vec::new(), true));
        }
        let mut changed = std::pin::pin!(feed.changed(seen));
        let ticked = std::future::poll_fn(|cx| {
            if changed.as_mut().poll(cx).is_ready() {
                Poll::Ready(false)
            } else {
                tick.as_mut().poll(cx).map(|()| true)
            }
        })
        .await;
        if ticked {
            tick.as_mut().reset(next_tick(core, sess));
            if feed.version() == seen && !core.shutting_down() {
                let mut out = Vec::new();
                push_keepalive(&mut out);
                return Some((out, false));
            }
        }
    }
}

/// Produce the next events on the owner: data + control if data is available, otherwise
/// wait for a commit (keep-alive comment on idle). Returns the bytes and whether the
/// response ends.
async fn step(core: &Rc<Core>, sess: &mut SseSession) -> (Vec<u8>, bool) {
    let keepalive = core.config.sse_keepalive;
    let max_age = core.config.sse_max_connection;
    loop {
        // Taken again after every wait. A lane that moved away ends the response: the
        // client reconnects from its last offset and is told to retry, or sent elsewhere.
        let Ok(shard) = core.shard(sess.id) else {
            return (Vec::new(), true);
        };
        // A stopped shard (its lane moving away) would end every wait at once.
        if shard.stopped() {
            return (Vec::new(), true);
        }
        let (tail, closed, version) = match shard.stream(sess.id) {
            Some(s) if s.incarnation() == sess.incarnation => {
                (s.next_offset(), s.is_closed(), s.version())
            }
            _ => return (Vec::new(), true),
        };
        let mut out = Vec::new();
        if tail > sess.offset {
            sess.first = false;
            let closed_now = emit_data(core, &shard, sess, &mut out).await;
            return (out, closed_now);
        }
        if sess.first || closed {
            sess.first = false;
            let c = cursor(core, sess.cursor.as_deref());
            push_control_event(
                &mut out,
                &Control {
                    next_offset: sess.offset.get(),
                    cursor: (!closed).then_some(c.as_str()),
                    up_to_date: true,
                    closed,
                    first_record: sess.records.map(|_| 0),
                    next_record: sess.records.map(|(_, r)| r.get()),
                },
            );
            sess.cursor = Some(c);
            return (out, closed);
        }
        if core.shutting_down() || sess.started.elapsed() >= max_age {
            return (Vec::new(), true);
        }
        let wait = keepalive
            .min(max_age.saturating_sub(sess.started.elapsed()))
            .max(Duration::from_millis(1));
        let waited = Instant::now();
        core.wait_or_shutdown(shard.changed(sess.id, version), wait)
            .await;
        let changed = shard.stream(sess.id).is_none_or(|s| s.version() != version);
        if !changed && !core.shutting_down() && waited.elapsed() >= wait {
            shard.touch(sess.id, ursula_storage::now_ms());
            push_keepalive(&mut out);
            return (out, false);
        }
    }
}

/// Append one data event and its control event for the next batch after `sess.offset`, read
/// from `shard`, the stream's. Returns true when that control closed the stream (the
/// response then ends).
async fn emit_data(
    core: &Rc<Core>,
    shard: &Shard,
    sess: &mut SseSession,
    out: &mut Vec<u8>,
) -> bool {
    if let Some((rp, record)) = sess.records {
        return emit_records(core, shard, sess, rp, record, out).await;
    }
    let Ok((parts, end)) = collect(shard, sess.surface, sess.id, sess.offset, sess.max_bytes).await
    else {
        // Unreadable data: end the response; the client reconnects from its last offset.
        return true;
    };
    let (tail, closed) = shard
        .stream(sess.id)
        .map_or((end, false), |s| (s.next_offset(), s.is_closed()));
    render_data(core, sess, parts, end, tail, closed, out)
}

/// The data event for `parts` (`[sess.offset, end)`, shaped as `collect` returns them) and
/// the control event after it, given the stream's `tail` and `closed` as of that data.
/// Returns true when that control closed the stream (the response then ends).
fn render_data(
    core: &Rc<Core>,
    sess: &mut SseSession,
    parts: Vec<Bytes>,
    mut end: Offset,
    tail: Offset,
    closed: bool,
    out: &mut Vec<u8>,
) -> bool {
    match sess.mode {
        Mode::JsonArray => {
            for p in &parts {
                push_json_array_data_event(out, p);
            }
        }
        Mode::Text => {
            let bytes = parts.concat();
            let cut = utf8_safe_cut(&bytes, bytes.len());
            end = sess.offset + cut as u64;
            push_text_data_event(out, &bytes[..cut]);
        }
        Mode::Ndjson => {
            let bytes = parts.concat();
            // Prefer whole records: stop after the last LF when the batch has one.
            let cut = memchr::memrchr(b'\n', &bytes).map_or(bytes.len(), |i| i + 1);
            end = sess.offset + cut as u64;
            push_text_data_event(out, &bytes[..cut]);
        }
        Mode::Base64 => {
            let bytes = parts.concat();
            push_base64_data_event(out, &bytes);
        }
    }
    sess.offset = end;
    let at_tail = end >= tail;
    let closed_now = at_tail && closed;
    let c = cursor(core, sess.cursor.as_deref());
    push_control_event(
        out,
        &Control {
            next_offset: end.get(),
            cursor: (!closed_now).then_some(c.as_str()),
            up_to_date: at_tail,
            closed: closed_now,
            ..Default::default()
        },
    );
    sess.cursor = Some(c);
    closed_now
}

/// Record-aware batch: whole records only (exactly one in the envelope view), then a control
/// event with the record coordinates.
async fn emit_records(
    core: &Rc<Core>,
    shard: &Shard,
    sess: &mut SseSession,
    rp: records::RecordParams,
    record: RecordNo,
    out: &mut Vec<u8>,
) -> bool {
    let (end, from, to) = {
        let Some(s) = shard.stream(sess.id) else {
            return true;
        };
        let max = if rp.envelope { Some(1) } else { rp.max_records };
        let end = records::end_record(&s, record, max, sess.max_bytes);
        let from = s.message_start(record).unwrap_or(s.next_offset());
        let to = s
            .message_start(end)
            .unwrap_or(s.next_offset())
            .min(s.next_offset());
        (end, from, to)
    };
    let Ok(parts) = shard.read(sess.id, from, to).await else {
        return true;
    };
    if rp.envelope {
        let mut line = records::envelope_parts(&parts, record).concat();
        line.pop(); // the envelope object without its LF: one data line
        push_json_array_data_event(out, &line);
    } else {
        push_text_data_event(out, &parts.concat());
    }
    sess.records = Some((rp, end));
    sess.offset = to;
    let (next, closed) = shard
        .stream(sess.id)
        .map_or((end, false), |s| (records::visible_next(&s), s.is_closed()));
    let at_tail = end >= next;
    let closed_now = at_tail && closed;
    let c = cursor(core, sess.cursor.as_deref());
    push_control_event(
        out,
        &Control {
            next_offset: to.get(),
            cursor: (!closed_now).then_some(c.as_str()),
            up_to_date: at_tail,
            closed: closed_now,
            first_record: Some(0),
            next_record: Some(end.get()),
        },
    );
    sess.cursor = Some(c);
    closed_now
}
