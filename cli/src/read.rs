//! `ursula cat` and `ursula tail`: a stream's records from a starting point, up to its end
//! (`cat`) or on as they are appended (`tail`, with the server's long-poll).
//!
//! What is printed is a stream's unit of data: on a JSON stream one record (one JSON value)
//! per line; on a text stream its lines; on any other stream its bytes, as they come. With
//! `--json` each unit is an envelope that says where it is in the stream:
//! `{"record":R,"offset":"…","value":…}`, `{"offset":"…","line":"…"}` or
//! `{"offset":"…","base64":"…"}`. Offsets are byte positions in Ursula (protocol §3), so a
//! unit's offset is the response's start plus the bytes before it; `record` is there when
//! the stream numbers its records and the read went by record.

use std::time::{Duration, Instant};

use base64::Engine;
use ursula_protocol::json::canonicalize;
use ursula_protocol::offset::{format_offset, parse_offset, OffsetParam};

use crate::client::{Client, Request, Response, ANSWER_TIMEOUT};
use crate::error::Error;
use crate::output::Out;
use crate::stream::{Kind, StreamInfo};
use crate::target::StreamName;
use crate::{CatArgs, Connection, StartArgs, TailArgs};

/// How long one long-poll may wait before the client gives up on it: the server answers
/// within its `long_poll_timeout_ms` (1 s by default), far below this.
const LONG_POLL_WAIT_MAX: Duration = Duration::from_secs(300);

pub fn cat(args: CatArgs) -> Result<(), Error> {
    let plan = Plan {
        stream: &args.stream,
        start: &args.start,
        count: args.count,
        follow: false,
        deadline: None,
        connection: &args.connection,
    };
    Reader::open(plan)?.run()
}

pub fn tail(args: TailArgs) -> Result<(), Error> {
    let plan = Plan {
        stream: &args.stream,
        start: &args.start,
        count: args.count,
        follow: true,
        deadline: args.timeout.map(|t| Instant::now() + t),
        connection: &args.connection,
    };
    Reader::open(plan)?.run()
}

/// What a read command asked for.
struct Plan<'a> {
    stream: &'a str,
    start: &'a StartArgs,
    count: Option<u64>,
    /// Go on past the end (`tail`), until the deadline if there is one.
    follow: bool,
    deadline: Option<Instant>,
    connection: &'a Connection,
}

/// A read in progress.
struct Reader {
    client: Client,
    name: StreamName,
    kind: Kind,
    position: Position,
    follow: bool,
    deadline: Option<Instant>,
    /// Units still to print, when `--count` was given.
    left: Option<u64>,
    json: bool,
    /// `Stream-Cursor` of the last long-poll, sent back with the next (protocol §12).
    cursor: Option<String>,
    lines: Lines,
    out: Out,
}

/// Where the next request reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Position {
    /// `record=N`: whole records, numbered.
    Record(u64),
    /// `tail_records=K`: the last K records (only the first request).
    LastRecords(u64),
    /// `offset=…`: a 20-digit offset, `-1` or `now`.
    Offset(String),
}

/// Whether to go on reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    More,
    Done,
}

/// One unit of a stream: a record, a line, or a run of bytes.
struct Unit<'a> {
    record: Option<u64>,
    offset: u64,
    /// A record's JSON text or a line, each without its line feed; a binary stream's bytes.
    bytes: &'a [u8],
    /// Whether a line feed ended it in the stream.
    newline: bool,
}

impl Reader {
    fn open(plan: Plan<'_>) -> Result<Reader, Error> {
        let name = StreamName::parse(plan.stream)?;
        let mut client = Client::new(plan.connection)?;
        let info = StreamInfo::fetch(&mut client, &name)?;
        let kind = info.kind();
        if kind == Kind::Binary && plan.count.is_some() {
            return Err(Error::Usage(format!(
                "--count counts records or lines; {name} is {}, which has neither",
                info.content_type
            )));
        }
        let position = start_position(plan.start, &info, &name, plan.follow)?;
        Ok(Reader {
            client,
            name,
            kind,
            position,
            follow: plan.follow,
            deadline: plan.deadline,
            left: plan.count,
            json: plan.connection.json,
            cursor: None,
            lines: Lines::default(),
            out: Out::stdout(),
        })
    }

    fn run(mut self) -> Result<(), Error> {
        if self.left == Some(0) {
            return Ok(());
        }
        loop {
            let Some(wait) = self.wait() else {
                return self.out.flush();
            };
            let request = Request::new("GET", self.request_target()).wait(wait);
            let resp = match self.client.send(&request) {
                Ok(resp) => resp,
                // The deadline fell while the server had nothing to say.
                Err(Error::TimedOut { .. }) if self.past_deadline() => return self.out.flush(),
                Err(e) => return Err(e),
            };
            let flow = match resp.status {
                200 => self.take(&resp)?,
                // A long-poll that saw nothing new.
                204 => self.advance(&resp)?,
                _ => {
                    let what = format!("stream {} from {}", self.name, self.position);
                    return Err(self.client.refusal(&resp, &what));
                }
            };
            self.out.flush()?;
            if flow == Flow::Done {
                return Ok(());
            }
        }
    }

    /// How long the next request may wait for its answer; `None` once the deadline passed.
    fn wait(&self) -> Option<Duration> {
        if !self.follow {
            return Some(ANSWER_TIMEOUT);
        }
        match self.deadline {
            None => Some(LONG_POLL_WAIT_MAX),
            Some(deadline) => {
                let left = deadline.checked_duration_since(Instant::now())?;
                (!left.is_zero()).then(|| left.min(LONG_POLL_WAIT_MAX))
            }
        }
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn request_target(&self) -> String {
        let mut query = match &self.position {
            Position::Record(r) => format!("record={r}"),
            Position::LastRecords(k) => format!("tail_records={k}"),
            Position::Offset(o) => format!("offset={o}"),
        };
        if let (Some(left), Position::Record(_) | Position::LastRecords(_)) =
            (self.left, &self.position)
        {
            // The server stops at whole records; no need to read past what is printed.
            query.push_str(&format!("&max_records={left}"));
        }
        if self.follow {
            query.push_str("&live=long-poll");
            if let Some(cursor) = &self.cursor {
                query.push_str(&format!("&cursor={}", crate::target::encode(cursor)));
            }
        }
        format!("{}?{query}", self.name.path())
    }

    /// Print what a `200` carries, then move on from it.
    fn take(&mut self, resp: &Response) -> Result<Flow, Error> {
        let next_offset = self.next_offset(resp)?;
        let by_record = !matches!(self.position, Position::Offset(_));
        // Where the body starts, when it holds the stored bytes as they are.
        let at = next_offset.saturating_sub(resp.body.len() as u64);
        let flow = match self.kind {
            Kind::Json { .. } if by_record => {
                let first = resp.number("stream-record-start").ok_or_else(|| {
                    self.client
                        .unexpected("a record read without Stream-Record-Start")
                })?;
                self.take_lines(at, &resp.body, Some(first))?
            }
            // The compat surface reads JSON as an array of whole messages.
            Kind::Json { records: false } => self.take_array(next_offset, &resp.body)?,
            // The bucketed surface reads JSON by offset as NDJSON bytes, which may end
            // inside a record.
            Kind::Json { records: true } | Kind::Text => self.take_lines(at, &resp.body, None)?,
            Kind::Binary => self.emit(Unit {
                record: None,
                offset: at,
                bytes: &resp.body,
                newline: false,
            })?,
        };
        if flow == Flow::Done {
            return Ok(Flow::Done);
        }
        self.advance(resp)
    }

    /// Lines of `body`, which starts at offset `at`; numbered from `first` when whole
    /// records.
    fn take_lines(&mut self, at: u64, body: &[u8], first: Option<u64>) -> Result<Flow, Error> {
        let mut lines = std::mem::take(&mut self.lines);
        let mut record = first;
        let flow = lines.feed(at, body, |offset, line| {
            let unit = Unit {
                record,
                offset,
                bytes: line,
                newline: true,
            };
            record = record.map(|r| r + 1);
            self.emit(unit)
        });
        self.lines = lines;
        flow
    }

    /// The messages of a compat JSON read (`[m1,m2,…]`, which ends at `next_offset`).
    fn take_array(&mut self, next_offset: u64, body: &[u8]) -> Result<Flow, Error> {
        let messages = canonicalize(body, true).map_err(|_| {
            self.client
                .unexpected("a JSON read that is not a JSON array")
        })?;
        // The array holds the stored messages; each is stored with a line feed after it.
        let mut offset = next_offset.saturating_sub(messages.bytes.len() as u64);
        for message in messages.messages() {
            let unit = Unit {
                record: None,
                offset,
                bytes: message.strip_suffix(b"\n").unwrap_or(message),
                newline: true,
            };
            offset += message.len() as u64;
            if self.emit(unit)? == Flow::Done {
                return Ok(Flow::Done);
            }
        }
        Ok(Flow::More)
    }

    /// Move past a response: its position, its cursor, and whether the read is over.
    fn advance(&mut self, resp: &Response) -> Result<Flow, Error> {
        self.position = match self.position {
            Position::Record(_) | Position::LastRecords(_) => {
                let next = resp.number("stream-record-next").ok_or_else(|| {
                    self.client
                        .unexpected("a record read without Stream-Record-Next")
                })?;
                Position::Record(next)
            }
            Position::Offset(_) => Position::Offset(format_offset(self.next_offset(resp)?)),
        };
        if let Some(cursor) = resp.header("stream-cursor") {
            self.cursor = Some(cursor.to_string());
        }
        let at_end = resp.header("stream-up-to-date") == Some("true") || resp.status == 204;
        let closed = resp.header("stream-closed") == Some("true");
        if at_end && (!self.follow || closed) {
            // The end of what there is: a last line without its line feed is whole now.
            let mut lines = std::mem::take(&mut self.lines);
            lines.finish(|offset, line| {
                self.emit(Unit {
                    record: None,
                    offset,
                    bytes: line,
                    newline: false,
                })
            })?;
            return Ok(Flow::Done);
        }
        Ok(Flow::More)
    }

    fn next_offset(&self, resp: &Response) -> Result<u64, Error> {
        resp.number("stream-next-offset")
            .ok_or_else(|| self.client.unexpected("a read without Stream-Next-Offset"))
    }

    /// Print one unit; `Done` once `--count` units are out.
    fn emit(&mut self, unit: Unit<'_>) -> Result<Flow, Error> {
        if self.json {
            let envelope = envelope(self.kind, &unit);
            self.out.line(&envelope)?;
        } else {
            self.out.bytes(unit.bytes)?;
            if unit.newline {
                self.out.bytes(b"\n")?;
            }
        }
        match &mut self.left {
            Some(left) => {
                *left = left.saturating_sub(1);
                Ok(if *left == 0 { Flow::Done } else { Flow::More })
            }
            None => Ok(Flow::More),
        }
    }
}

/// Where a read starts, from the command's options and the stream's `HEAD`.
fn start_position(
    start: &StartArgs,
    info: &StreamInfo,
    name: &StreamName,
    follow: bool,
) -> Result<Position, Error> {
    let records = info.records;
    let need_records = |option: &str| {
        Error::Usage(format!(
            "{option} needs a stream that numbers its records (a JSON stream in a bucket); \
             {name} is {}{}",
            info.content_type,
            if name.is_bucketed() {
                ""
            } else {
                " on the compat surface"
            }
        ))
    };
    match (&start.offset, start.record, start.last) {
        (Some(offset), _, _) => match parse_offset(offset) {
            Ok(OffsetParam::Start) => Ok(Position::Offset("-1".into())),
            Ok(OffsetParam::Now) => Ok(Position::Offset("now".into())),
            Ok(OffsetParam::At(at)) => Ok(Position::Offset(format_offset(at))),
            Err(e) => Err(Error::Usage(format!("--offset {offset:?}: {}", e.reason()))),
        },
        (None, Some(record), _) => match records {
            Some(_) => Ok(Position::Record(record)),
            None => Err(need_records("--record")),
        },
        (None, None, Some(last)) => match records {
            Some(_) => Ok(Position::LastRecords(last)),
            None => Err(need_records("--last")),
        },
        (None, None, None) => Ok(match (records, follow) {
            (Some((_, next)), true) => Position::Record(next),
            (Some((first, _)), false) => Position::Record(first),
            (None, true) => Position::Offset(format_offset(info.next_offset)),
            (None, false) => Position::Offset("-1".into()),
        }),
    }
}

/// The `--json` line of a unit.
fn envelope(kind: Kind, unit: &Unit<'_>) -> String {
    let offset = format_offset(unit.offset);
    match kind {
        Kind::Json { .. } => {
            // The value is the stored JSON text, put in as it is.
            let value = String::from_utf8_lossy(unit.bytes);
            match unit.record {
                Some(r) => format!(r#"{{"record":{r},"offset":"{offset}","value":{value}}}"#),
                None => format!(r#"{{"offset":"{offset}","value":{value}}}"#),
            }
        }
        Kind::Text => {
            let line = String::from_utf8_lossy(unit.bytes);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            let quoted = sonic_rs::to_string(line).unwrap_or_else(|_| "\"\"".into());
            format!(r#"{{"offset":"{offset}","line":{quoted}}}"#)
        }
        Kind::Binary => {
            let data = base64::engine::general_purpose::STANDARD.encode(unit.bytes);
            format!(r#"{{"offset":"{offset}","base64":"{data}"}}"#)
        }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Position::Record(r) => write!(f, "record {r}"),
            Position::LastRecords(k) => write!(f, "its last {k} records"),
            Position::Offset(o) => write!(f, "offset {o}"),
        }
    }
}

/// Cuts bytes that arrive in pieces into lines, each with the offset of its first byte. A
/// piece that ends inside a line keeps that part until the rest arrives.
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
    /// The offset of `pending`'s first byte.
    pending_at: u64,
}

impl Lines {
    /// Hand each whole line of `bytes` (which start at offset `at`), without its line
    /// feed, to `each`, until it says `Done`.
    fn feed(
        &mut self,
        at: u64,
        bytes: &[u8],
        mut each: impl FnMut(u64, &[u8]) -> Result<Flow, Error>,
    ) -> Result<Flow, Error> {
        if self.pending.is_empty() {
            self.pending_at = at;
        }
        self.pending.extend_from_slice(bytes);
        let mut used = 0;
        let mut flow = Flow::More;
        while let Some(end) = self.pending[used..].iter().position(|&b| b == b'\n') {
            let line = &self.pending[used..used + end];
            flow = each(self.pending_at + used as u64, line)?;
            used += end + 1;
            if flow == Flow::Done {
                break;
            }
        }
        self.pending.drain(..used);
        self.pending_at += used as u64;
        Ok(flow)
    }

    /// Hand over what is left: a last line without a line feed.
    fn finish(
        &mut self,
        each: impl FnOnce(u64, &[u8]) -> Result<Flow, Error>,
    ) -> Result<Flow, Error> {
        if self.pending.is_empty() {
            return Ok(Flow::More);
        }
        let line = std::mem::take(&mut self.pending);
        each(self.pending_at, &line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(lines: &mut Lines, at: u64, bytes: &[u8], most: usize) -> Vec<(u64, String)> {
        let mut got = Vec::new();
        let flow = lines.feed(at, bytes, |offset, line| {
            got.push((offset, String::from_utf8_lossy(line).into_owned()));
            Ok(if got.len() == most {
                Flow::Done
            } else {
                Flow::More
            })
        });
        assert!(flow.is_ok());
        got
    }

    #[test]
    fn lines_carry_their_offsets_across_pieces() {
        let mut lines = Lines::default();
        assert_eq!(
            collect(&mut lines, 100, b"ab\ncd", 9),
            [(100, "ab".to_string())]
        );
        assert_eq!(
            collect(&mut lines, 105, b"e\n\nfg\n", 9),
            [
                (103, "cde".to_string()),
                (107, String::new()),
                (108, "fg".to_string())
            ]
        );
        assert_eq!(collect(&mut lines, 111, b"tail", 9), []);
        let mut last = None;
        let flow = lines.finish(|offset, line| {
            last = Some((offset, line.to_vec()));
            Ok(Flow::More)
        });
        assert!(flow.is_ok());
        assert_eq!(last, Some((111, b"tail".to_vec())));
    }

    #[test]
    fn lines_stop_where_they_are_told() {
        let mut lines = Lines::default();
        assert_eq!(collect(&mut lines, 0, b"a\nb\nc\n", 2).len(), 2);
        // What was not handed over is still there.
        assert_eq!(collect(&mut lines, 6, b"", 9), [(4, "c".to_string())]);
    }

    #[test]
    fn envelopes_say_where_a_unit_is() {
        let unit = |record, bytes: &'static [u8]| Unit {
            record,
            offset: 45,
            bytes,
            newline: true,
        };
        assert_eq!(
            envelope(Kind::Json { records: true }, &unit(Some(1), br#"{"a":1}"#)),
            r#"{"record":1,"offset":"00000000000000000045","value":{"a":1}}"#
        );
        assert_eq!(
            envelope(Kind::Json { records: false }, &unit(None, b"[1,2]")),
            r#"{"offset":"00000000000000000045","value":[1,2]}"#
        );
        assert_eq!(
            envelope(Kind::Text, &unit(None, b"say \"hi\"\r")),
            r#"{"offset":"00000000000000000045","line":"say \"hi\""}"#
        );
        assert_eq!(
            envelope(Kind::Binary, &unit(None, b"\x00\xff")),
            r#"{"offset":"00000000000000000045","base64":"AP8="}"#
        );
    }
}
