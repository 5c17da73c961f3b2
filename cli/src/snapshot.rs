//! `ursula snapshot put|get` and `ursula retain`: a bucketed stream's snapshot (extensions
//! §3) and its retention point (§4). A snapshot is the application's own state folded over
//! the stream up to an offset; retention then drops the history before a point at or
//! before it, and new readers bootstrap from the snapshot.

use std::io::Read;

use base64::Engine;
use serde::Serialize;
use ursula_protocol::offset::{format_offset, parse_offset, OffsetParam};

use crate::client::{Client, Request, Response};
use crate::error::Error;
use crate::manage::content_type;
use crate::output::Out;
use crate::target::StreamName;
use crate::{PointArgs, RetainArgs, SnapshotGetArgs, SnapshotPutArgs};

/// How often `get` asks again when the snapshot it was sent to is replaced before it reads
/// it.
const GET_ATTEMPTS: usize = 3;

/// `ursula snapshot put`: publish standard input as the stream's snapshot.
pub fn put(args: SnapshotPutArgs) -> Result<(), Error> {
    let name = StreamName::parse(&args.stream)?;
    let point = Point::parse(&args.at)?;
    let base = snapshot_path(&name)?;
    let mut blob = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut blob)
        .map_err(Error::Stdin)?;
    let mut client = Client::new(&args.connection)?;
    let mut request = Request::new("PUT", point.under(&base)).body(&blob);
    if let Some(t) = &args.content_type {
        request = request.header("Content-Type", content_type(t));
    }
    if let Some(digest) = &args.match_digest {
        request = request.header("Stream-Snapshot-Match", digest.clone());
    }
    let resp = client.send(&request)?;
    if resp.status != 204 {
        return Err(client.refusal(&resp, &format!("stream {name}")));
    }
    let published = Published {
        stream: name.to_string(),
        offset: offset_header(&client, &resp, "stream-snapshot-offset")?,
        digest: digest_header(&client, &resp)?,
        bytes: blob.len(),
    };
    let mut out = Out::stdout();
    if args.connection.json {
        return out.json(&published);
    }
    out.line(&format!(
        "published a snapshot of {} at offset {} ({} bytes, digest {})",
        published.stream, published.offset, published.bytes, published.digest
    ))
}

/// `ursula snapshot get`: the stream's snapshot, as it was published.
pub fn get(args: SnapshotGetArgs) -> Result<(), Error> {
    let name = StreamName::parse(&args.stream)?;
    let base = snapshot_path(&name)?;
    let mut client = Client::new(&args.connection)?;
    let what = format!("the snapshot of stream {name}");
    let mut attempt = 0;
    let (offset, resp) = loop {
        attempt += 1;
        // The latest answers with a redirect; its Location is on the server's public URL,
        // which need not be the address this client reaches it by, so the blob's path is
        // built from the offset instead.
        let latest = client.send(&Request::new("GET", base.clone()))?;
        if latest.status != 307 {
            return Err(client.refusal(&latest, &what));
        }
        let offset = offset_header(&client, &latest, "stream-snapshot-offset")?;
        let resp = client.send(&Request::new("GET", format!("{base}/{offset}")))?;
        // A 404 here is a snapshot replaced since the redirect: ask for the latest again.
        if resp.status == 404 && attempt < GET_ATTEMPTS {
            continue;
        }
        if resp.status != 200 {
            return Err(client.refusal(&resp, &what));
        }
        break (offset, resp);
    };
    let mut out = Out::stdout();
    if !args.connection.json {
        return out.bytes(&resp.body);
    }
    out.json(&Fetched {
        stream: name.to_string(),
        offset,
        digest: digest_header(&client, &resp)?,
        content_type: resp
            .header("content-type")
            .unwrap_or("application/octet-stream")
            .to_string(),
        base64: base64::engine::general_purpose::STANDARD.encode(&resp.body),
    })
}

/// `ursula retain`: drop the stream's history before a point.
pub fn retain(args: RetainArgs) -> Result<(), Error> {
    let name = StreamName::parse(&args.stream)?;
    let point = Point::parse(&args.at)?;
    let base = name
        .sub_path("retention")
        .ok_or_else(|| compat_refused(&name, "a retention point"))?;
    let mut client = Client::new(&args.connection)?;
    let resp = client.send(&Request::new("PUT", point.under(&base)))?;
    if resp.status != 204 {
        return Err(client.refusal(&resp, &format!("stream {name}")));
    }
    let retained = Retained {
        stream: name.to_string(),
        retained_offset: offset_header(&client, &resp, "stream-retained-offset")?,
        record_first: resp.number("stream-record-first"),
    };
    let mut out = Out::stdout();
    if args.connection.json {
        return out.json(&retained);
    }
    let mut text = format!(
        "{} now starts at offset {}",
        retained.stream, retained.retained_offset
    );
    if let Some(r) = retained.record_first {
        text.push_str(&format!(", record {r}"));
    }
    out.line(&text)
}

/// `ursula snapshot put --json`.
#[derive(Serialize)]
struct Published {
    stream: String,
    offset: String,
    digest: String,
    bytes: usize,
}

/// `ursula snapshot get --json`.
#[derive(Serialize)]
struct Fetched {
    stream: String,
    offset: String,
    digest: String,
    content_type: String,
    base64: String,
}

/// `ursula retain --json`.
#[derive(Serialize)]
struct Retained {
    stream: String,
    retained_offset: String,
    /// The first record kept (JSON streams in a bucket).
    record_first: Option<u64>,
}

/// A point in a stream that a snapshot or the retention point is put at.
enum Point {
    /// A 20-digit offset.
    Offset(String),
    Record(u64),
}

impl Point {
    fn parse(at: &PointArgs) -> Result<Point, Error> {
        match (&at.offset, at.record) {
            (Some(offset), _) => match parse_offset(offset) {
                Ok(OffsetParam::At(at)) => Ok(Point::Offset(format_offset(at))),
                // `-1` and `now` name no fixed point: the tail moves.
                Ok(OffsetParam::Start | OffsetParam::Now) => Err(Error::Usage(format!(
                    "--offset {offset}: give the offset itself (a Stream-Next-Offset value \
                     or its number)"
                ))),
                Err(e) => Err(Error::Usage(format!("--offset {offset:?}: {}", e.reason()))),
            },
            (None, Some(record)) => Ok(Point::Record(record)),
            (None, None) => Err(Error::Usage("give --offset or --record".into())),
        }
    }

    /// The request target for this point under `base` (`…/snapshot`, `…/retention`).
    fn under(&self, base: &str) -> String {
        match self {
            Point::Offset(offset) => format!("{base}/{offset}"),
            Point::Record(record) => format!("{base}?record={record}"),
        }
    }
}

fn snapshot_path(name: &StreamName) -> Result<String, Error> {
    name.sub_path("snapshot")
        .ok_or_else(|| compat_refused(name, "snapshots"))
}

fn compat_refused(name: &StreamName, what: &str) -> Error {
    Error::Usage(format!(
        "{name}: only streams in a bucket (BUCKET/STREAM) have {what}"
    ))
}

/// A header holding an offset, as its 20-digit token.
fn offset_header(client: &Client, resp: &Response, name: &str) -> Result<String, Error> {
    resp.number(name)
        .map(format_offset)
        .ok_or_else(|| client.unexpected(format!("an answer without {name}")))
}

fn digest_header(client: &Client, resp: &Response) -> Result<String, Error> {
    resp.header("stream-snapshot-digest")
        .map(str::to_string)
        .ok_or_else(|| client.unexpected("an answer without Stream-Snapshot-Digest"))
}
