//! `ursula append`: standard input into a stream, one message per line, in order.
//!
//! Lines go out in batches, each as few requests as the stream allows:
//!
//! * a JSON stream takes a batch as one `POST` of a JSON array of the lines: one record per
//!   line (a line that is itself an array stays one record), all of the batch or none;
//! * any other stream in a bucket takes it as one `append-batch` request, a frame per line
//!   with its line feed, so reading the stream back gives the input back;
//! * any other stream on the compat surface, which has no batch append, takes one `POST`
//!   per line.
//!
//! A batch is sent when it is full or when standard input has nothing more ready, so lines
//! piped in live (`tail -f app.log | ursula append …`) go out as they come.

use std::io::{BufRead, BufReader, Read};

use serde::{Deserialize, Serialize};
use ursula_protocol::json::canonicalize;
use ursula_protocol::offset::format_offset;

use crate::client::{Client, Request, Response};
use crate::error::Error;
use crate::output::Out;
use crate::stream::{Kind, StreamInfo};
use crate::target::StreamName;
use crate::AppendArgs;

/// Lines per batch at most: the server takes 512 frames per `append-batch`.
const BATCH_LINES_MAX: usize = 512;
/// Bytes per batch at most, well under the server's 32 MiB request body.
const BATCH_BYTES_MAX: usize = 8 << 20;
/// The longest line: the server's request body limit (32 MiB), which one line fills.
const LINE_BYTES_MAX: usize = 32 << 20;

pub fn run(args: AppendArgs) -> Result<(), Error> {
    let name = StreamName::parse(&args.stream)?;
    let mut client = Client::new(&args.connection)?;
    let info = StreamInfo::fetch(&mut client, &name)?;
    let json = matches!(info.kind(), Kind::Json { .. });
    let mut input = Input::new(std::io::stdin(), json);
    let mut appended = Appended {
        stream: name.to_string(),
        lines: 0,
        next_offset: format_offset(info.next_offset),
        next_record: info.records.map(|(_, next)| next),
    };
    let writer = Writer {
        name: &name,
        content_type: &info.content_type,
    };
    loop {
        let batch = input.next_batch()?;
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            break;
        };
        let (first, last) = (first.number, last.number);
        let resp = match (json, name.is_bucketed()) {
            (true, _) => writer.json_array(&mut client, &batch),
            (false, true) => writer.append_batch(&mut client, &batch),
            (false, false) => writer.one_by_one(&mut client, &batch),
        };
        let resp = resp.map_err(|e| match e {
            e @ (Error::LineRefused { .. } | Error::BatchRefused { .. }) => e,
            e => Error::BatchRefused {
                first,
                last,
                source: Box::new(e),
            },
        })?;
        appended.lines += batch.len() as u64;
        if let Some(next) = resp.header("stream-next-offset") {
            appended.next_offset = next.to_string();
        }
        if let Some(next) = resp.number("stream-record-next") {
            appended.next_record = Some(next);
        }
    }
    let mut out = Out::stdout();
    if args.connection.json {
        return out.json(&appended);
    }
    let mut text = format!(
        "appended {} line{} to {}; next offset {}",
        appended.lines,
        if appended.lines == 1 { "" } else { "s" },
        appended.stream,
        appended.next_offset
    );
    if let Some(next) = appended.next_record {
        text.push_str(&format!(", next record {next}"));
    }
    out.line(&text)
}

/// What `ursula append` reports.
#[derive(Serialize)]
struct Appended {
    stream: String,
    /// Lines appended (blank lines of a JSON stream are skipped, not counted).
    lines: u64,
    /// The stream's tail after the last batch.
    next_offset: String,
    /// The record tail after the last batch (JSON streams in a bucket).
    next_record: Option<u64>,
}

/// A line of input and where it was.
struct Line {
    /// 1-based line number in the input.
    number: u64,
    /// A JSON line without its line end; any other line with it.
    bytes: Vec<u8>,
}

/// Standard input, cut into batches of lines.
struct Input<R> {
    reader: BufReader<R>,
    json: bool,
    lines_read: u64,
    /// An invalid JSON line met while a batch was being filled: reported once the lines
    /// before it are appended.
    invalid: Option<u64>,
}

impl<R: Read> Input<R> {
    fn new(input: R, json: bool) -> Input<R> {
        Input {
            reader: BufReader::with_capacity(1 << 20, input),
            json,
            lines_read: 0,
            invalid: None,
        }
    }

    /// The next lines to send; empty at the end of the input.
    fn next_batch(&mut self) -> Result<Vec<Line>, Error> {
        if let Some(line) = self.invalid.take() {
            return Err(Error::NotJson { line });
        }
        let mut batch = Vec::new();
        let mut bytes = 0;
        loop {
            let mut line = Vec::new();
            let n = self
                .reader
                .read_until(b'\n', &mut line)
                .map_err(Error::Stdin)?;
            if n == 0 {
                return Ok(batch);
            }
            self.lines_read += 1;
            if line.len() > LINE_BYTES_MAX {
                return Err(Error::Usage(format!(
                    "line {} is {} bytes, over the 32 MiB one request may carry",
                    self.lines_read,
                    line.len()
                )));
            }
            if self.json {
                let text = line.trim_ascii();
                if !text.is_empty() {
                    if canonicalize(text, true).is_err() {
                        if batch.is_empty() {
                            return Err(Error::NotJson {
                                line: self.lines_read,
                            });
                        }
                        self.invalid = Some(self.lines_read);
                        return Ok(batch);
                    }
                    line = text.to_vec();
                } else {
                    line.clear();
                }
            }
            if !line.is_empty() {
                bytes += line.len();
                batch.push(Line {
                    number: self.lines_read,
                    bytes: line,
                });
            }
            let full = batch.len() >= BATCH_LINES_MAX || bytes >= BATCH_BYTES_MAX;
            // Nothing more already read: send what there is rather than wait for input
            // that may come much later.
            let drained = self.reader.buffer().is_empty();
            if !batch.is_empty() && (full || drained) {
                return Ok(batch);
            }
        }
    }
}

/// Sends batches of lines to one stream.
struct Writer<'a> {
    name: &'a StreamName,
    /// The stream's own type: an append must name it.
    content_type: &'a str,
}

impl Writer<'_> {
    /// `[line1,line2,…]` in one `POST`: one record per line, atomically.
    fn json_array(&self, client: &mut Client, batch: &[Line]) -> Result<Response, Error> {
        let mut body =
            Vec::with_capacity(batch.iter().map(|l| l.bytes.len() + 1).sum::<usize>() + 1);
        body.push(b'[');
        for (i, line) in batch.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&line.bytes);
        }
        body.push(b']');
        self.post(client, &self.name.path(), &body)
    }

    /// One `append-batch` request, a frame per line. Frames are committed one by one, so
    /// the first refused frame is reported with what became of the lines after it.
    fn append_batch(&self, client: &mut Client, batch: &[Line]) -> Result<Response, Error> {
        let Some(path) = self.name.sub_path("append-batch") else {
            return self.one_by_one(client, batch);
        };
        let mut body = Vec::with_capacity(batch.iter().map(|l| l.bytes.len() + 4).sum());
        for line in batch {
            // At most LINE_BYTES_MAX (Input refuses longer lines), so it fits.
            let len = line.bytes.len() as u32;
            body.extend_from_slice(&len.to_be_bytes());
            body.extend_from_slice(&line.bytes);
        }
        let resp = self.post(client, &path, &body)?;
        let acks: Vec<Ack> = sonic_rs::from_slice(&resp.body).map_err(|e| {
            client.unexpected(format!("an append-batch answer that is not its JSON: {e}"))
        })?;
        if acks.len() != batch.len() {
            return Err(client.unexpected(format!(
                "{} acknowledgements for {} frames",
                acks.len(),
                batch.len()
            )));
        }
        if let Some(refused) = acks.iter().position(|a| a.status != 204) {
            let ack = &acks[refused];
            let later = &acks[refused + 1..];
            return Err(Error::LineRefused {
                line: batch[refused].number,
                status: ack.status,
                reason: format!(
                    "{}: {}",
                    ack.error_code.as_deref().unwrap_or("refused"),
                    ack.error.as_deref().unwrap_or("")
                ),
                later: later.len(),
                appended: later.iter().filter(|a| a.status == 204).count(),
            });
        }
        Ok(resp)
    }

    /// One `POST` per line, in order; stops at the first refused.
    fn one_by_one(&self, client: &mut Client, batch: &[Line]) -> Result<Response, Error> {
        let mut last = None;
        for line in batch {
            let sent = self.post(client, &self.name.path(), &line.bytes);
            last = Some(sent.map_err(|e| Error::BatchRefused {
                first: line.number,
                last: line.number,
                source: Box::new(e),
            })?);
        }
        last.ok_or_else(|| client.unexpected("no line to send"))
    }

    fn post(&self, client: &mut Client, path: &str, body: &[u8]) -> Result<Response, Error> {
        let request = Request::new("POST", path)
            .header("Content-Type", self.content_type)
            .body(body);
        let resp = client.send(&request)?;
        if !resp.is_success() {
            return Err(client.refusal(&resp, &format!("stream {}", self.name)));
        }
        Ok(resp)
    }
}

/// One frame's acknowledgement in an `append-batch` answer (extensions.md §6.3).
#[derive(Deserialize)]
struct Ack {
    status: u16,
    error_code: Option<String>,
    error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(input: &[u8], json: bool) -> Vec<Result<Vec<(u64, String)>, String>> {
        let mut input = Input::new(input, json);
        let mut out = Vec::new();
        loop {
            match input.next_batch() {
                Ok(b) if b.is_empty() => return out,
                Ok(b) => out.push(Ok(b
                    .into_iter()
                    .map(|l| (l.number, String::from_utf8_lossy(&l.bytes).into_owned()))
                    .collect())),
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    #[test]
    fn json_lines_are_trimmed_and_blank_ones_skipped() {
        let got = batches(b"{\"a\":1}\r\n\n  [1, 2] \n\"last\"", true);
        let want = vec![
            (1, "{\"a\":1}".to_string()),
            (3, "[1, 2]".to_string()),
            (4, "\"last\"".to_string()),
        ];
        assert_eq!(got, vec![Ok(want)]);
    }

    #[test]
    fn an_invalid_json_line_ends_the_input_after_the_lines_before_it() {
        let got = batches(b"1\n{oops\n3\n", true);
        assert_eq!(
            got,
            vec![
                Ok(vec![(1, "1".to_string())]),
                Err("line 2: not one JSON value, so nothing from it on was appended".into())
            ]
        );
        assert!(matches!(
            Input::new(&b"nope\n"[..], true).next_batch(),
            Err(Error::NotJson { line: 1 })
        ));
    }

    #[test]
    fn other_lines_keep_their_line_ends() {
        let got = batches(b"one\n\ntwo", false);
        let want = vec![
            (1, "one\n".to_string()),
            (2, "\n".to_string()),
            (3, "two".to_string()),
        ];
        assert_eq!(got, vec![Ok(want)]);
    }

    #[test]
    fn batches_stop_at_the_line_cap() {
        let input: Vec<u8> = (0..BATCH_LINES_MAX + 3)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        let got = batches(&input, true);
        let sizes: Vec<usize> = got.iter().map(|b| b.as_ref().map_or(0, Vec::len)).collect();
        assert_eq!(sizes, [BATCH_LINES_MAX, 3]);
    }
}
